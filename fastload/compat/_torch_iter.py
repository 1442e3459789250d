"""torch's view of a DataLoader iterator's workers, for fastload.compat.torch: the entries of
``_workers``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from fastload._procs import NotPicklable

__all__ = ["PICKLE_WARNING", "WorkerProcess", "warn_on_pickle_error", "worker_processes"]

T = TypeVar("T")


class WorkerProcess:
    """One entry of an iterator's ``_workers``: a worker process of the DataLoader, with the
    part of ``multiprocessing.Process`` that torch's own iterator gives and code inspects
    (``pid``, ``name``, ``is_alive()``, ``join()``, ``exitcode``, ``terminate()``, ``kill()``).

    It is the running process itself, read through its ``Popen`` handle: fastload's pool closes
    its ``Process`` objects once the workers have exited (a closed ``Process`` raises on
    ``join()`` and ``is_alive()``), while the handle keeps the exit status it reaped. A thread
    worker's stand-in (``worker_method="thread"``, NOTE [thread workers] in fastload/_threads.py)
    is used as it is: its ``pid`` is this process's."""

    def __init__(self, proc: Any) -> None:
        self._proc = proc
        self._popen = getattr(proc, "_popen", None)  # None: a thread worker
        self.pid: int = proc.pid
        self.name: str = proc.name

    @property
    def exitcode(self) -> int | None:
        if self._popen is None:
            return self._proc.exitcode  # type: ignore[no-any-return]
        return self._popen.poll()  # type: ignore[no-any-return]

    def is_alive(self) -> bool:
        if self._popen is None:
            return bool(self._proc.is_alive())
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        if self._popen is None:
            self._proc.join(timeout)
        else:
            self._popen.wait(timeout)

    def terminate(self) -> None:
        if self._popen is not None:  # (a thread cannot be stopped from outside)
            self._popen.terminate()

    def kill(self) -> None:
        if self._popen is not None:
            self._popen.kill()

    def __repr__(self) -> str:
        code = self.exitcode
        state = "started" if code is None else f"stopped exitcode={code}"
        return f"<fastload worker {self.name!r} pid={self.pid} {state}>"


def worker_processes(loader: Any) -> list[WorkerProcess]:
    """The workers serving ``loader`` (a fastload.Loader, or None) now, by worker id."""
    if loader is None:
        return []
    return [WorkerProcess(p) for p in loader._worker_processes()]


#: torch's warning when a worker process cannot start for a pickle error (its
#: _MultiProcessingDataLoaderIter), which its tests and users' logs look for.
PICKLE_WARNING = (
    "Got pickle error when attempting to start a worker Process. This might be because the "
    "worker Process arguments are not picklable. Python 3.14+ changed the multiprocessing start "
    "method in non-Mac POSIX platforms to 'forkserver', which requires the worker Process "
    "arguments to be picklable. You can also try multiprocessing.set_start_method('fork').")


def warn_on_pickle_error(make: Callable[..., T]) -> Callable[..., T]:
    """``make`` (fastload.Loader) that gives torch's UserWarning before a NotPicklable (the
    dataset or worker_init_fn cannot be pickled for spawn/forkserver workers), as torch's
    DataLoader warns before re-raising the error of ``Process.start()``."""

    def call(*args: Any, **kw: Any) -> T:
        try:
            return make(*args, **kw)
        except NotPicklable:
            warnings.warn(PICKLE_WARNING, UserWarning, stacklevel=3)
            raise

    return call
