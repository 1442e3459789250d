"""The one table that turns C status codes into exceptions (mirrors csrc/fl_status.h)."""

from __future__ import annotations

from enum import IntEnum
from typing import NoReturn

from .errors import FastloadError, LayoutMismatchError, LoaderTimeoutError, SampleTooLargeError


class Status(IntEnum):
    OK = 0
    ETIMEOUT = -1
    ESTOPPED = -2
    ELAYOUT = -3
    EINVAL = -4
    ESTATE = -5
    ERANGE = -6
    ENOSPACE = -7


_TABLE: dict[int, type[Exception]] = {
    Status.ETIMEOUT: LoaderTimeoutError,
    Status.ESTOPPED: FastloadError,
    Status.ELAYOUT: LayoutMismatchError,
    Status.EINVAL: ValueError,
    Status.ESTATE: FastloadError,
    Status.ERANGE: SampleTooLargeError,
    Status.ENOSPACE: SampleTooLargeError,
}


def raise_for_status(rc: int, message: str, context: str) -> NoReturn:
    """Raise the exception for C status ``rc``; ``message`` is fl_strerror(rc)."""
    cls = _TABLE.get(rc, FastloadError)
    raise cls(f"{context}: {message} (code {rc})")
