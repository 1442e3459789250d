"""Reading a worker's pipe without ever waiting in the middle of a message.

NOTE [resumable reads]
``Connection.recv()`` reads a message's length, then blocks until the whole message is there, and
``recv_handle()`` blocks until the fd that follows a ``SpillFd`` arrives. A worker that is
stopped (SIGSTOP, a debugger, a frozen cgroup) or slow between two writes of one message would
hold the reading thread, and the pool lock it reads under, for good: every loader of the pool
stops and no ``timeout=`` can fire (the soak test found it: a worker stopped between its
``SpillFd`` and its fd). So the parent reads each worker's socket itself, with
``recvmsg(MSG_DONTWAIT)``: whatever bytes and fds are there are appended to this reader's
buffer, complete frames are decoded, and a partial frame (or a ``SpillFd`` whose fd has not come)
waits in the buffer for the next read. A read never blocks; waiting is the caller's poll, which
is bounded. The frames are multiprocessing's (a 4-byte big-endian length, or -1 and an 8-byte
length) holding a pickle, and an fd rides on the one byte ``send_handle`` writes, so workers
keep writing with ``conn.send`` and ``send_handle``. ``MSG_DONTWAIT`` is per call: the socket's
own flags, shared with the parent's ``conn.send``, stay blocking.
"""

from __future__ import annotations

import array
import mmap
import os
import pickle
import socket
import struct
import sys
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from . import _messages as m

__all__ = ["FrameReader"]

#: Bytes asked of one recvmsg, and the most read in one call to ``read()`` (a worker that keeps
#: writing cannot keep the reader, and the pool lock, for ever).
_CHUNK = 256 * 1024
_MAX_PER_READ = 64 * 1024 * 1024
_FD_SPACE = socket.CMSG_SPACE(16 * array.array("i").itemsize)
_ACK = sys.platform == "darwin"  # multiprocessing.reduction: macOS acknowledges each fd


class FrameReader:
    """The parent's reading end of one worker's pipe (NOTE [resumable reads])."""

    def __init__(self, conn: Connection):
        # A socket of our own on a dup of the fd, for recvmsg; conn keeps sending on the original.
        self.sock = socket.socket(fileno=os.dup(conn.fileno()))
        self.sock.settimeout(None)  # blocking file flags whatever socket.setdefaulttimeout says
        self.buf = bytearray()
        self.fds: deque[int] = deque()
        self.fd_wanted: m.SpillFd | None = None  # decoded; its fd byte has not been read yet
        self.eof = False

    def read(self) -> list[Any]:
        """Every message complete now (``Spill`` for a ``SpillFd`` and its fd), without waiting.
        Raises EOFError once the worker's end is closed and nothing complete is left."""
        got = 0
        while got < _MAX_PER_READ and not self.eof:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(_CHUNK, _FD_SPACE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.eof = True  # ECONNRESET: it died
                break
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                    self.fds.extend(fds)
                    if _ACK:
                        self.sock.send(b"A")
            if not data:
                self.eof = True
                break
            self.buf += data
            got += len(data)
        out = self._decode()
        if self.eof and not out:
            raise EOFError("the worker closed its pipe")
        return out

    def _decode(self) -> list[Any]:
        out: list[Any] = []
        buf, pos = self.buf, 0
        while True:
            if self.fd_wanted is not None:
                if pos >= len(buf) or not self.fds:
                    break
                pos += 1  # the byte send_handle wrote; the fd came with it
                out.append(_map_spill(self.fd_wanted, self.fds.popleft()))
                self.fd_wanted = None
                continue
            if len(buf) - pos < 4:
                break
            (n,) = struct.unpack_from("!i", buf, pos)
            head = 4
            if n == -1:
                if len(buf) - pos < 12:
                    break
                (n,) = struct.unpack_from("!Q", buf, pos + 4)
                head = 12
            if len(buf) - pos < head + n:
                break
            msg = pickle.loads(buf[pos + head: pos + head + n])  # a copy: buf is cut below
            pos += head + n
            if isinstance(msg, m.SpillFd):
                self.fd_wanted = msg
            else:
                out.append(msg)
        del buf[:pos]
        return out

    def close(self) -> None:
        """Close our socket and any fd received but not yet claimed by its message."""
        while self.fds:
            os.close(self.fds.popleft())
        self.sock.close()


def _map_spill(msg: m.SpillFd, fd: int) -> m.Spill:
    """A SpillFd's memfd, mapped (the fd is closed at once: the mapping keeps the memory, and the
    batch's views keep the mapping, until the last of them is freed)."""
    try:
        mm = mmap.mmap(fd, msg.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return m.Spill(msg.cid, msg.slot, msg.seq, mm)
