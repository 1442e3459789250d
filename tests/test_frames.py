"""The parent reads a worker's pipe without waiting in the middle of a message (NOTE [resumable
reads] in fastload/_frames.py): a worker stopped between two writes of one message, or between a
SpillFd and its fd, must not hold the pool lock for good."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import struct
import time
from multiprocessing.reduction import send_handle as _real_send_handle

import numpy as np
import pytest

import fastload
import fastload._messages as m
from fastload._frames import FrameReader
from helpers import MP_TIMEOUT
from helpers.ragged import Big


def _frame(obj) -> bytes:
    data = pickle.dumps(obj)
    return struct.pack("!i", len(data)) + data


@pytest.fixture
def pipe():
    parent, child = mp.Pipe()
    reader = FrameReader(parent)
    yield parent, child, reader
    reader.close()
    parent.close()
    child.close()


def _timed_read(reader):
    t0 = time.monotonic()
    out = reader.read()
    assert time.monotonic() - t0 < 1.0  # never waits for what has not come
    return out


def test_a_message_cut_anywhere_is_returned_once_whole(pipe):
    _, child, reader = pipe
    msgs = [m.Started(3), m.BatchFailed(1, 2, 3, b"x" * 40_000), m.Spill(1, 0, 7, b"y" * 9)]
    frames = [_frame(x) for x in msgs]
    stream = b"".join(frames)
    ends = np.cumsum([len(f) for f in frames]).tolist()
    got, sent = [], 0
    for cut in (1, 3, 4, 5, ends[0] - 1, ends[0], ends[0] + 2, 20_000, ends[1] - 1, ends[1] + 4,
                len(stream)):
        os.write(child.fileno(), stream[sent:cut])
        sent = cut
        got += _timed_read(reader)
        assert got == msgs[:sum(e <= cut for e in ends)]  # each whole message, once, in order
    assert got == msgs


def test_a_spill_fd_that_has_not_come_yet_does_not_wait(pipe):
    from multiprocessing.reduction import send_handle

    _, child, reader = pipe
    fd = os.memfd_create("spill") if hasattr(os, "memfd_create") else None
    if fd is None:
        pytest.skip("needs os.memfd_create (Linux)")
    os.write(fd, b"abcdefgh")
    child.send(m.SpillFd(5, 1, 9, 8))  # the worker stops here, before its fd
    assert _timed_read(reader) == []
    assert _timed_read(reader) == []
    send_handle(child, fd, os.getpid())  # and goes on
    os.close(fd)
    child.send(m.Started(0))
    spill, started = _timed_read(reader)
    assert (spill.cid, spill.slot, spill.seq) == (5, 1, 9)
    assert bytes(spill.image[:8]) == b"abcdefgh"
    assert started == m.Started(0)


def test_eof_after_the_last_message(pipe):
    _, child, reader = pipe
    child.send(m.Started(1))
    child.close()
    assert _timed_read(reader) == [m.Started(1)]
    with pytest.raises(EOFError):
        reader.read()


def test_an_fd_not_yet_claimed_by_its_message_is_closed_with_the_reader(pipe):
    from multiprocessing.reduction import send_handle

    _, child, reader = pipe
    r, w = os.pipe()
    send_handle(child, r, os.getpid())  # an fd with no SpillFd before it (a worker cut short)
    os.close(r)
    assert _timed_read(reader) == []
    (received,) = reader.fds
    os.fstat(received)  # open, and the reader's
    reader.close()
    with pytest.raises(OSError):
        os.fstat(received)
    os.close(w)


def _stop_before_the_fd(conn, fd, pid):
    os.kill(os.getpid(), signal.SIGSTOP)
    _real_send_handle(conn, fd, pid)


def _stopping_loader(monkeypatch, **kw):
    """A loader whose first big batch's worker stops (SIGSTOP) between its SpillFd and its fd."""
    if not hasattr(os, "memfd_create"):
        pytest.skip("needs os.memfd_create (Linux): without it a spill has no fd")
    import fastload._worker as worker

    monkeypatch.setattr(worker, "send_handle", _stop_before_the_fd)  # inherited under fork
    return fastload.Loader(Big(mib=4), 2, start_method="fork", ragged="list", **kw)


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_worker_stopped_between_a_spill_and_its_fd_is_a_timeout_not_a_hang(monkeypatch):
    loader = _stopping_loader(monkeypatch, num_workers=1, timeout=2.0)
    pid = loader._engine.pool.procs[0].pid
    t0 = time.monotonic()
    with pytest.raises(fastload.LoaderTimeoutError, match="stopped"):
        list(loader)
    assert time.monotonic() - t0 < 15
    os.kill(pid, signal.SIGCONT)
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 10
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_spilled_batch_still_arrives_after_the_worker_goes_on():
    if not hasattr(os, "memfd_create"):
        pytest.skip("needs os.memfd_create (Linux)")
    ds = Big(mib=4)
    with fastload.Loader(ds, 2, num_workers=1, start_method="fork", ragged="list") as loader:
        first = next(iter(loader))
        assert [a.shape for a in first] == [ds[0].shape, ds[1].shape]
        assert np.array_equal(first[1][-10:], ds[1][-10:])


@pytest.mark.timeout(MP_TIMEOUT)
def test_workers_that_die_while_a_message_is_awaited_are_restarted(monkeypatch):
    import threading

    loader = _stopping_loader(monkeypatch, num_workers=2, timeout=4.0,
                              on_worker_death="restart")
    procs = loader._engine.pool.procs
    first = [p.pid for p in procs]
    # Worker 0 or 1 stops before sending the big batch's fd; while the loader waits for it, the
    # other one is killed: it must be restarted during that wait, not after it.
    def kill_the_other():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for k, pid in enumerate(first):
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "T":
                        os.kill(first[1 - k], signal.SIGKILL)
                        return
            time.sleep(0.02)

    t = threading.Thread(target=kill_the_other)
    t.start()
    with pytest.raises(fastload.LoaderTimeoutError, match="stopped"):
        list(loader)
    t.join()
    now = [p.pid if p is not None else None for p in procs]
    stopped = [pid for pid in first if pid in now]
    assert len(stopped) == 1 and None not in now and len(set(now) - set(first)) == 1, (first, now)
    os.kill(stopped[0], signal.SIGCONT)
    loader.close()
