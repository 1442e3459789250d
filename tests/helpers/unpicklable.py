"""Datasets whose samples hold a part that pickle refuses (tests/test_unpicklable.py)."""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

import numpy as np


class Box:
    """An object leaf holding ``part``."""

    def __init__(self, part: Any) -> None:
        self.part = part

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Box) and type(other.part) is type(self.part)

    __hash__ = None  # type: ignore[assignment]


def local_namedtuple(i: int) -> Any:
    """An instance of a namedtuple class defined in this function (pickle cannot find it)."""
    Local = collections.namedtuple("Local", ["a", "b"])
    return Local(i, -i)


def bad_part(kind: str, i: int) -> Any:
    """The part of sample ``i`` that pickle refuses, and the leaf that holds it."""
    if kind == "lock":
        return Box(threading.Lock())
    if kind == "local_namedtuple":
        return Box(local_namedtuple(i))
    if kind == "memoryview":
        return memoryview(b"raw bytes")
    raise ValueError(kind)


#: kind -> (the path the error names, the type it names)
BAD_PATHS = {
    "lock": ("sample['meta'].part", "_thread.lock"),
    "local_namedtuple": ("sample['meta'].part", "Local"),
    "memoryview": ("sample['meta']", "memoryview"),
}


class BadPartAt:
    """``{"x", "pid", "meta"}`` samples; sample ``bad``'s ``meta`` holds ``bad_part(kind)``."""

    def __init__(self, n: int, bad: int, kind: str) -> None:
        self.n, self.bad, self.kind = n, bad, kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        meta = bad_part(self.kind, i) if i == self.bad else Box(i)
        return {"x": np.float32(i), "pid": os.getpid(), "meta": meta}


class LocalNamedtupleSamples:
    """Every sample is a namedtuple of a class defined in a function: the layout holds it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return local_namedtuple(i)


def _cannot_rebuild() -> None:
    raise ValueError("cannot rebuild")


class PicklesButCannotBeRebuilt:
    """Pickles in the worker; unpickling it (in the main process) raises."""

    def __reduce__(self) -> Any:
        return (_cannot_rebuild, ())


class RebuildFailsAt:
    """String object leaves, except sample ``bad``'s, which cannot be unpickled."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        meta = PicklesButCannotBeRebuilt() if i == self.bad else f"s{i}"
        return {"x": np.float32(i), "pid": os.getpid(), "meta": meta}
