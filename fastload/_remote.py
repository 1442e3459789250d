"""Exceptions of user code across the process boundary, both halves of the wire format.

``pack_exception`` (where user code raised: a worker, or the main process with num_workers=0)
serialises the exception with its traceback text; ``rebuild_exception`` (in the main process)
gives it back with its own type where it can be rebuilt, else as WorkerError, always with the
sample index, the worker and its traceback in the message and a RemoteTraceback as
``__cause__`` (torch's ExceptionWrapper, loky's _RemoteTraceback).
"""

from __future__ import annotations

import os
import pickle
import traceback
from typing import Any, NoReturn

from .errors import RemoteTraceback, WorkerError

__all__ = ["pack_exception", "rebuild_exception", "raise_rebuilt"]


def pack_exception(exc: BaseException, index: int | None, worker_id: int | None,
                   batch: list[int] | None = None, where: str | None = None) -> bytes:
    """Serialise an exception from user code with its traceback text (never raises).
    ``worker_id`` None: raised in the main process (num_workers=0); ``batch``: the sample
    indices of the ``__getitems__`` call it came from; ``where``: what the sample is, if not
    "sample index {index}" (a plain iterable's)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        data = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # an exception that pickles but cannot be rebuilt
        exc_bytes: bytes | None = data
    except Exception:
        exc_bytes = None
    info = {
        "type_name": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": _safe_str(exc),
        "exc": exc_bytes,
        "tb": tb,
        "index": index,
        "batch": batch,
        "context": _safe_context(exc),
        "where": where if where is not None else _safe_attr(exc, "_fastload_where"),
        "worker_id": worker_id,
        "pid": os.getpid(),
    }
    return pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL)


def _safe_context(exc: BaseException) -> str | None:
    """Where in a stream the error happened (set by fastload/_stream.py), if it says."""
    return _safe_attr(exc, "_fastload_context")


def _safe_attr(exc: BaseException, name: str) -> str | None:
    """``exc``'s string attribute ``name``: set by fastload/_stream.py (``_fastload_where``
    names what was read instead of "sample index N", as a shard being counted)."""
    try:
        got = getattr(exc, name, None)
    except Exception:
        return None
    return got if isinstance(got, str) else None


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"


def message_of(payload: bytes) -> str:
    """The exception's own message, without the traceback."""
    return str(pickle.loads(payload)["message"])


def raise_rebuilt(payload: bytes) -> NoReturn:
    """Raise the rebuilt exception, chained to its RemoteTraceback."""
    exc = rebuild_exception(payload)
    raise exc from exc.__cause__


class _KeyErrorMessage(str):
    """KeyError's str() is the repr of its argument; keep a multi-line message readable."""

    def __repr__(self) -> str:
        return str(self)


def rebuild_exception(payload: bytes) -> BaseException:
    info: dict[str, Any] = pickle.loads(payload)
    wid = info["worker_id"]
    who = "the main process (num_workers=0)" if wid is None else f"worker {wid} (pid {info['pid']})"
    where = f"sample index {info['index']}" if info["index"] is not None else "worker start-up"
    if info.get("where"):
        where = info["where"]
    batch = info.get("batch")
    if batch is not None:
        shown = ", ".join(map(str, batch[:8])) + (", ..." if len(batch) > 8 else "")
        where = (f"{where} in __getitems__([{shown}])" if info["index"] is not None
                 else f"__getitems__([{shown}])")
    if info.get("context"):
        where = f"{where}: {info['context']}"
    msg = (
        f"{info['message']}\n\n{info['type_name']} raised in {who} while loading {where}.\n"
        f"Original traceback:\n{info['tb']}"
    )
    exc: BaseException | None = None
    orig: BaseException | None = None
    if info["exc"] is not None:
        try:
            orig = pickle.loads(info["exc"])
        except Exception:
            orig = None
    if orig is not None and not isinstance(orig, Exception):
        orig = None  # SystemExit, KeyboardInterrupt, ... from a worker: never re-raised as such
    if orig is not None:
        cls = type(orig)
        try:
            new = cls(_KeyErrorMessage(msg)) if issubclass(cls, KeyError) else cls(msg)
            if type(new) is cls:
                try:
                    new.__dict__.update(getattr(orig, "__dict__", {}))
                except Exception:
                    pass
                exc = new
        except Exception:
            exc = None
        if exc is None:  # constructor takes other arguments: keep the original object
            exc = orig
            if hasattr(exc, "add_note"):
                exc.add_note(msg)
    if exc is None:
        exc = WorkerError(msg)
    exc.__cause__ = RemoteTraceback(info["tb"])
    exc.fastload_index = info["index"]  # type: ignore[attr-defined]
    exc.fastload_batch = batch  # type: ignore[attr-defined]
    exc.fastload_worker = wid  # type: ignore[attr-defined]
    return exc
