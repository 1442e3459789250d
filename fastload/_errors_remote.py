"""Rebuilding a worker's exception in the main process (torch ExceptionWrapper, loky
_RemoteTraceback): same type where it can be rebuilt, else WorkerError; always with the sample
index, the worker and its traceback in the message, and a RemoteTraceback as ``__cause__``."""

from __future__ import annotations

import pickle
from typing import Any

from .errors import RemoteTraceback, WorkerError


class _KeyErrorMessage(str):
    """KeyError's str() is the repr of its argument; keep a multi-line message readable."""

    def __repr__(self) -> str:
        return str(self)


def rebuild_exception(payload: bytes) -> BaseException:
    info: dict[str, Any] = pickle.loads(payload)
    wid = info["worker_id"]
    who = "the main process (num_workers=0)" if wid is None else f"worker {wid} (pid {info['pid']})"
    where = f"sample index {info['index']}" if info["index"] is not None else "worker start-up"
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
    exc.fastload_worker = wid  # type: ignore[attr-defined]
    return exc
