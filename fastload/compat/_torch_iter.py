"""torch's view of a DataLoader iterator's workers, for fastload.compat.torch: the entries of
``_workers``."""

from __future__ import annotations

from typing import Any

__all__ = ["WorkerProcess", "worker_processes"]


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
