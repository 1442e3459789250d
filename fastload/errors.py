"""fastload's exception hierarchy (pure Python: importable without the compiled core).

Each class also inherits the builtin that existing ``except`` clauses expect, so code written
for other loaders keeps working (``except TimeoutError`` catches :class:`LoaderTimeoutError`).
"""

from __future__ import annotations

__all__ = [
    "FastloadError",
    "LoaderTimeoutError",
    "SampleTooLargeError",
    "LayoutMismatchError",
    "LoaderClosedError",
    "WorkerError",
    "WorkerDied",
    "WorkerCrashedError",
    "RemoteTraceback",
]


class FastloadError(Exception):
    """Base class of every error fastload raises itself."""


class LoaderTimeoutError(FastloadError, TimeoutError):
    """The loader's ``timeout=`` expired while waiting for a batch."""


class SampleTooLargeError(FastloadError, ValueError):
    """A sample does not fit the slot computed for it."""


class LayoutMismatchError(FastloadError, ValueError):
    """A sample's structure, dtype or shape differs from the layout of the first sample,
    or a shared region has the wrong magic or layout version."""


class LoaderClosedError(FastloadError, RuntimeError):
    """The loader was used after ``close()``."""


class WorkerError(FastloadError):
    """User code raised inside a worker and the exception could not be rebuilt with its own type.

    The message holds the worker id, the sample index and the worker's traceback; ``__cause__``
    is the original exception when it could be unpickled, else a :class:`RemoteTraceback`.
    """


class WorkerDied(FastloadError, RuntimeError):
    """A worker process died (signal, ``os._exit``, out-of-memory kill)."""


#: STYLE.md's name for :class:`WorkerDied`; both names refer to the same class.
WorkerCrashedError = WorkerDied


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a re-raised error."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb
