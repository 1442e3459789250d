"""Module-level datasets for tests/test_arrays.py."""

from __future__ import annotations

import numpy as np


class StackedGetitems:
    """__getitems__ returns one already-stacked batch (a dict of arrays)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"x": np.full((2, 3), i, np.float32), "y": np.int64(i)}

    def __getitems__(self, idx: list[int]) -> dict[str, np.ndarray]:
        a = np.asarray(idx)
        return {"x": np.repeat(a.astype(np.float32)[:, None, None], 6, 1).reshape(-1, 2, 3),
                "y": a.astype(np.int64)}


class BadStack(StackedGetitems):
    """A stacked batch whose leaf has the wrong trailing shape."""

    def __getitems__(self, idx: list[int]) -> dict[str, np.ndarray]:
        return {"x": np.zeros((len(idx), 3, 2), np.float32), "y": np.asarray(idx)}
