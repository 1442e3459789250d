"""SharedRegion: the one shared-memory mapping of a loader (control block + slots).

Linux: an anonymous ``memfd_create`` file. It has no name in /dev/shm, so nothing can leak
after a crash or SIGKILL, it is not bound by a small /dev/shm (Docker's 64 MB default), and it is
mode 0600 by construction. Workers receive the file descriptor over their pipe
(``multiprocessing.reduction.send_handle``) and map it themselves.
Elsewhere: an unlinked temporary file (unlinked at creation, so equally nothing to clean up).

The pages are reserved up front with ``posix_fallocate`` where available, so running out of
memory is an ``OSError`` at creation rather than a SIGBUS in a worker later.
"""

from __future__ import annotations

import mmap
import os
import tempfile

__all__ = ["SharedRegion"]


def _new_fd(nbytes: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("fastload", os.MFD_CLOEXEC)
    else:  # pragma: no cover - macOS
        f = tempfile.TemporaryFile(prefix="fastload-")
        fd = os.dup(f.fileno())
        f.close()
    try:
        os.ftruncate(fd, nbytes)
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                if e.errno in (28, 12):  # ENOSPC, ENOMEM
                    raise OSError(
                        e.errno,
                        f"fastload could not reserve {nbytes / 2**20:.1f} MiB of shared memory "
                        f"({e.strerror}); free memory, or reduce batch_size, prefetch or "
                        "num_workers",
                    ) from None
                # EOPNOTSUPP etc.: the file system cannot reserve; pages come on first touch.
    except BaseException:
        os.close(fd)
        raise
    return fd


class SharedRegion:
    """A shared mapping of ``nbytes``; ``fd`` is passed to workers, who call :meth:`attach`."""

    def __init__(self, nbytes: int, fd: int | None = None) -> None:
        self.nbytes = nbytes
        self.owner = fd is None
        self.fd = _new_fd(nbytes) if fd is None else fd
        try:
            self.mm = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        # The mapping keeps the memory alive; the fd is needed only to send it to new workers.
        self.closed = False

    @classmethod
    def attach(cls, fd: int, nbytes: int) -> SharedRegion:
        r = cls(nbytes, fd=fd)
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
