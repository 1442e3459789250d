"""Ragged datasets and the NumPy reference of what each ragged mode must deliver."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import fastload


class Tokens:
    """Sample i: int32 tokens of a length drawn from (seed, i) in [0, max_len), a label, a
    name (an object leaf beside the ragged one) and (k, 4) float32 boxes, k in [0, 6)."""

    def __init__(self, n: int = 37, max_len: int = 40, seed: int = 0) -> None:
        self.n, self.max_len, self.seed = n, max_len, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, i])
        length = int(rng.integers(0, self.max_len))
        k = int(rng.integers(0, 6))
        return {
            "tokens": (np.arange(length, dtype=np.int32) + 1000 * i),
            "label": i,
            "name": f"s{i}",
            "boxes": rng.random((k, 4)).astype(np.float32),
        }


class Listed:
    """A dataset of the given samples (picklable when they are)."""

    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        return self.samples[i]


class Big:
    """One ragged int8 sample of `mib` MiB (value i + position mod 128), then small ones."""

    def __init__(self, n: int = 3, mib: int = 64) -> None:
        self.n, self.mib = n, mib

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        size = (self.mib << 20) if i == 1 else 10 + i
        return ((np.arange(size) + i) % 128).astype(np.int8)


def reference(mode: str, arrays: list[np.ndarray], pad_value: Any = 0,
              pad_to_multiple: int = 1) -> Any:
    """What a ragged leaf of these samples must come back as, built with NumPy alone."""
    if mode == "list":
        return [np.array(a) for a in arrays]
    if mode == "packed":
        offsets = np.cumsum([0] + [len(a) for a in arrays]).astype(np.int64)
        return fastload.Packed(np.concatenate([np.array(a) for a in arrays]), offsets)
    ndim = arrays[0].ndim
    shapes = np.array([a.shape for a in arrays], np.int64).reshape(len(arrays), ndim)
    hi, lo = shapes.max(0), shapes.min(0)
    extent = tuple(int(math.ceil(h / pad_to_multiple) * pad_to_multiple)
                   if h != low or ndim == 1 else int(h) for h, low in zip(hi, lo))
    values = np.full((len(arrays), *extent), pad_value, dtype=arrays[0].dtype)
    for r, a in enumerate(arrays):
        values[(r,) + tuple(slice(0, s) for s in a.shape)] = a
    return fastload.Padded(values, shapes[:, 0].copy() if ndim == 1 else shapes)


def assert_same(got: Any, want: Any) -> None:
    """Same type, dtypes, shapes and values, recursively (Padded/Packed, lists of arrays, any
    sample of stack=False); a memmap comes back as an ndarray; NaN equals NaN."""
    assert type(got) is type(want) or (type(want) is np.memmap and type(got) is np.ndarray), \
        (type(got), type(want))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), (got, want)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    else:
        assert got == want or (got != got and want != want), (got, want)  # NaN


class Boxed:
    """A user object holding an array (pickled by its own rules, its array through the slot)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __eq__(self, other: object) -> bool:
        return type(other) is Boxed and np.array_equal(self.a, other.a)
