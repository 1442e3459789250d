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
    "SkipLimitError",
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
    or a shared region has the wrong magic or layout version. When only a leaf's shape
    differed, ``shape_mismatch`` is ``(path, expected shape, shape)``."""


class LoaderClosedError(FastloadError, RuntimeError):
    """The loader was used after ``close()``."""


class WorkerError(FastloadError):
    """User code raised inside a worker and the exception could not be rebuilt with its own type.

    The message holds the worker id, the sample index and the worker's traceback. Whether the
    exception was rebuilt with its own type or became a ``WorkerError``, its ``__cause__`` is a
    :class:`RemoteTraceback` carrying the worker's formatted traceback.
    """


class WorkerDied(FastloadError, RuntimeError):
    """A worker process died (signal, ``os._exit``, out-of-memory kill). ``fastload_deaths``:
    the ``(pid, exit code)`` of each worker that died (a negative code is the signal)."""

    fastload_deaths: tuple[tuple[int | None, int | None], ...] = ()


class SkipLimitError(FastloadError, RuntimeError):
    """With ``on_error="skip"``, more than ``max_skips`` samples of one epoch raised.
    ``skipped`` lists them: ``(index, "Type: message")`` pairs."""

    def __init__(self, message: str, skipped: list[tuple[int | None, str]] | None = None):
        super().__init__(message)
        self.skipped = skipped or []


def __getattr__(name: str) -> type[WorkerDied]:
    # WorkerCrashedError: the 0.1 name of WorkerDied, kept so code written against it still
    # runs; one class, one name in messages and docs.
    if name == "WorkerCrashedError":
        import warnings

        warnings.warn(
            "fastload.WorkerCrashedError is deprecated: use fastload.WorkerDied (the same class)",
            DeprecationWarning,
            stacklevel=2,
        )
        return WorkerDied
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a re-raised error."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb
