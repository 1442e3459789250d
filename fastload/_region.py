"""SharedRegion: the one shared-memory mapping of a loader (control block + slots).

Linux: an anonymous ``memfd_create`` file. It has no name in /dev/shm, so nothing can leak
after a crash or SIGKILL, it is not bound by a small /dev/shm (Docker's 64 MB default), and it is
mode 0600 by construction. Workers receive the file descriptor over their pipe
(``multiprocessing.reduction.send_handle``) and map it themselves.
Elsewhere: an unlinked temporary file (unlinked at creation, so equally nothing to clean up).

The pages are reserved up front with ``posix_fallocate`` where available, so running out of
memory is a ``MemoryError`` at creation rather than a SIGBUS in a worker later.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
import threading
import weakref

__all__ = ["SharedRegion", "BorrowedRegion", "available_bytes", "drop_inherited", "new_fd"]

#: Every region of this process that is mapped: what a forked worker drops (drop_inherited).
_live: weakref.WeakSet[SharedRegion] = weakref.WeakSet()
#: The regions this process created or mapped, by their file's (st_dev, st_ino): what a thread
#: worker borrows instead of mapping the file again (NOTE [one mapping per process]).
_owned: weakref.WeakValueDictionary[tuple[int, int], SharedRegion] = (
    weakref.WeakValueDictionary())
#: Makes a thread's borrow-or-map one step (BorrowedRegion.map): two threads of a host that
#: attach at once would otherwise both map the region.
_mapping = threading.Lock()


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def available_bytes() -> int | None:
    """What a new region may take: the machine's MemAvailable, and no more than the room left
    under this process's cgroup memory limit (v2 or v1); None where neither can be read."""
    room: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    room.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        lim, used = _read_int(limit), _read_int(usage)
        if lim is not None and used is not None and lim < 1 << 60:
            room.append(max(0, lim - used))
            break
    return min(room) if room else None


#: Errors of ftruncate, posix_fallocate and mmap that mean "no room for this many bytes": the
#: memory, tmpfs or file size left (ENOMEM, ENOSPC, EFBIG), or the address space a ``ulimit -v``
#: (RLIMIT_AS) leaves, which mmap reports as ENOMEM however much memory is free.
_NO_ROOM = frozenset({errno.ENOMEM, errno.ENOSPC, errno.EFBIG})


def _address_space_limit() -> int | None:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError, AttributeError):  # pragma: no cover - no rlimits
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def no_room(e: OSError, nbytes: int, what: str, step: str) -> MemoryError:
    """The MemoryError for an OSError of ``_NO_ROOM`` while making or mapping ``nbytes`` for
    ``what``: the sizes, the limit that refused them where one is set, and what to do (the
    bare ``OSError: [Errno 12]`` of mmap says none of it)."""
    limit = _address_space_limit()
    why = (f"this process's address space is limited to {limit / 2**20:,.1f} MiB "
           "(ulimit -v, RLIMIT_AS): raise the limit, or "
           if limit is not None and e.errno == errno.ENOMEM else "free memory, or ")
    return MemoryError(
        f"fastload could not {step} {nbytes / 2**20:,.1f} MiB of shared memory for {what} "
        f"({e.strerror or e}); {why}reduce batch_size, prefetch, max_held or num_workers")


def new_fd(nbytes: int, what: str) -> int:
    """An anonymous file of ``nbytes``, its pages reserved (memfd on Linux): the one way
    fastload makes shared memory, for a loader's region, an oversized batch (_worker.py) and a
    large message to a worker (_pool.py). Refused, naming ``what``, if larger than the memory
    available."""
    avail = available_bytes()
    if avail is not None and nbytes > avail:
        # posix_fallocate of a memfd under overcommit grows until the OOM killer picks a
        # process (any, on the machine): refuse it here, saying what asked for how much.
        raise MemoryError(
            f"fastload would need {nbytes / 2**20:,.1f} MiB of shared memory for {what}, and "
            f"only {avail / 2**20:,.1f} MiB are available (MemAvailable, or the cgroup's memory "
            "limit); reduce batch_size, prefetch, max_held or num_workers"
        )
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("fastload", os.MFD_CLOEXEC)
    else:  # pragma: no cover - macOS
        f = tempfile.TemporaryFile(prefix="fastload-")
        fd = os.dup(f.fileno())
        f.close()
    try:
        try:
            os.ftruncate(fd, nbytes)
        except OSError as e:
            raise (no_room(e, nbytes, what, "size") if e.errno in _NO_ROOM else e) from e
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                if e.errno in _NO_ROOM:
                    raise no_room(e, nbytes, what, "reserve") from e
                # EOPNOTSUPP etc.: the file system cannot reserve; pages come on first touch.
    except BaseException:
        os.close(fd)
        raise
    return fd


class SharedRegion:
    """A shared mapping of ``nbytes``; ``fd`` is passed to workers, who call :meth:`attach`."""

    def __init__(self, nbytes: int, fd: int | None = None, what: str = "a region") -> None:
        self.nbytes = nbytes
        self.owner = fd is None
        self.fd = new_fd(nbytes, what) if fd is None else fd
        try:
            self.mm = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException as e:
            os.close(self.fd)
            if isinstance(e, OSError) and e.errno in _NO_ROOM:
                raise no_room(e, nbytes, what, "map") from e
            raise
        # The mapping keeps the memory alive; the fd is needed only to send it to new workers.
        self.closed = False
        _live.add(self)
        _owned[_file_key(self.fd)] = self  # a thread of this process borrows it

    @classmethod
    def attach(cls, fd: int, nbytes: int) -> SharedRegion:
        r = cls(nbytes, fd=fd, what="a loader's region, mapped in a worker")
        r.close_fd()
        return r

    def close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Close the fd and unmap if nothing still exports the mapping (idempotent).

        If zero-copy batches are still alive the unmap is left to the garbage collector: the
        mapping lives exactly as long as the last array that points into it.
        """
        self.close_fd()
        if not self.closed:
            try:
                self.mm.close()
                self.closed = True
            except BufferError:
                pass  # exported to live leases; freed with the last one


def _file_key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


# NOTE [one mapping per process]
# A worker process maps the region from the fd it is sent. A thread worker is sent the fd too
# (the same messages as a process, NOTE [thread workers] in _threads.py), but mapping it again
# would give this process one more mapping of the whole region per thread: each thread then
# page-faults every page of every slot into its own mapping the first time it writes there
# (measured: ~2,600 minor faults per batch with 8 threads on the image workload, still ~250-550
# per thread per batch in the third epoch, as the slots rotate), and its page tables cost
# memory. So a thread borrows the creator's mapping: same pages, same addresses, no faults
# beyond the first touch of each page. The borrow holds an export of the mapping, so the
# creator's close() cannot unmap it under a thread still writing (it is left to the last
# user, as with live leases).
# The threads of a host process (NOTE [hosted threads] in _host.py) did not create the
# region: the first to attach maps it (``BorrowedRegion.map``, one step under a lock:
# ``SharedRegion.attach`` registers that mapping as the process's), and the others borrow
# it. A forked process forgets its parent's registry (``drop_inherited``): those mappings
# are no longer there.


class BorrowedRegion:
    """A thread worker's use of a region this process created (NOTE [one mapping per
    process]); ``close`` lets go of it and never unmaps the creator's mapping."""

    def __init__(self, owner: SharedRegion, nbytes: int) -> None:
        self.nbytes = nbytes
        self.mm = owner.mm
        self._hold: memoryview | None = memoryview(owner.mm)  # ValueError if already closed
        self.closed = False

    @classmethod
    def borrow(cls, fd: int, nbytes: int) -> BorrowedRegion | None:
        """The mapping this process created for the file ``fd`` refers to (``fd`` is then
        closed), or None: not one of ours, or closed already (map ``fd`` instead)."""
        try:
            owner = _owned.get(_file_key(fd))
        except OSError:
            return None
        if owner is None or owner.closed or owner.nbytes < nbytes:
            return None
        try:
            region = cls(owner, nbytes)
        except ValueError:  # closed meanwhile
            return None
        os.close(fd)
        return region

    @classmethod
    def map(cls, fd: int, nbytes: int) -> BorrowedRegion | SharedRegion:
        """A worker thread's view of the region of ``fd``: this process's mapping, borrowed,
        or, if it has none, a new one, which the next thread borrows."""
        with _mapping:
            return cls.borrow(fd, nbytes) or SharedRegion.attach(fd, nbytes)

    def close(self) -> None:
        if self._hold is not None:
            self._hold.release()
            self._hold = None
        self.closed = True


def drop_inherited(keep: int | None = None) -> int:
    """In a forked worker, before it does anything: let go of every region inherited from the
    parent (other loaders' slots, the pool's bell; a worker maps what it uses from the fds it
    is sent). Otherwise a child keeps a closed loader's memory alive for as long as it lives
    (its mapping and its copy of the fd hold the memfd).

    Python objects of the parent's heap still refer to these mappings and fd numbers, and may
    close them when collected, so neither is simply closed: the mapping is replaced in place by
    an inaccessible anonymous one of the same size (MAP_FIXED, PROT_NONE: no memory, and the
    range cannot be reused, so a later munmap of it is harmless), and every inherited memfd fd
    number is pointed at /dev/null (dup2), so a later close of it closes nothing of ours.
    Shared containers (shared.py) that share_dataset made for another loader than ``keep`` (the
    client id whose dataset this worker inherited) are dropped the same way; those of ``keep``
    and those the user built stay mapped: the worker's own dataset reads them.
    Returns how many regions were dropped. Linux and macOS (ctypes mmap); a no-op where libc
    cannot be loaded."""
    import sys

    regions = [r for r in list(_live) if not r.closed]
    _owned.clear()  # nothing of the parent's is borrowed here (NOTE [one mapping per process])
    shared = sys.modules.get("fastload.shared")  # no containers unless it was imported
    containers = shared.regions_of_other_loaders(keep) if shared is not None else []
    try:
        import ctypes

        # The process's own symbols (libc's mmap among them): no find_library, which runs
        # ldconfig or a compiler and cost ~9 ms of every forked worker's start.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
    except (OSError, AttributeError):  # pragma: no cover - no libc to call
        return 0
    fixed, anon = 0x10, getattr(mmap, "MAP_ANONYMOUS", 0x20)  # MAP_FIXED: 0x10 on Linux, macOS
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    dropped = 0
    try:
        for r in regions:
            try:
                view = (ctypes.c_char * 1).from_buffer(r.mm)
            except (TypeError, ValueError, BufferError):
                continue  # a read-only or closed mapping: not one of ours to drop
            addr = ctypes.addressof(view)
            del view
            size = -(-r.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
            got = libc.mmap(addr, size, 0, mmap.MAP_PRIVATE | anon | fixed, -1, 0)  # PROT_NONE
            if got != addr:
                continue  # left as it was (mapped): costs memory, never correctness
            dropped += 1
        for c in containers:  # read-only mappings: their address through NumPy
            try:
                import numpy as np

                addr = int(np.frombuffer(c.mm, dtype=np.uint8, count=1).ctypes.data)
            except (TypeError, ValueError, BufferError):
                continue  # closed
            size = -(-c.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
            if libc.mmap(addr, size, 0, mmap.MAP_PRIVATE | anon | fixed, -1, 0) == addr:
                dropped += 1
        # Every inherited fd of a fastload memfd (a region's, the one Python's mmap keeps with
        # each mapping, a shared container's): the worker is sent the fds it needs later.
        for name in _listdir("/proc/self/fd"):
            try:
                fd = int(name)
                if fd != devnull and os.readlink(f"/proc/self/fd/{fd}").startswith(
                        "/memfd:fastload"):
                    os.dup2(devnull, fd, inheritable=False)
            except (OSError, ValueError):
                continue
    finally:
        os.close(devnull)
    return dropped


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:  # no /proc (macOS): the fds stay
        return []
