"""Datasets for tests/test_skip.py (importable by spawn/forkserver workers)."""

from __future__ import annotations

import numpy as np


class Flaky:
    """Samples ``{"x": [i, i, i], "name": "s<i>"}``; ``__getitem__`` raises for ``bad``; from
    sample ``big_from`` on, names of 1 MiB (more than the slot sized from the first sample)."""

    def __init__(self, n: int, bad: set[int] | frozenset[int],
                 big_from: int | None = None) -> None:
        self.n, self.bad, self.big_from = n, frozenset(bad), big_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if i in self.bad:
            raise ValueError(f"corrupt record {i}")
        name = f"s{i}"
        if self.big_from is not None and i >= self.big_from:
            name += "x" * (1 << 20)
        return {"x": np.full(3, i, np.int64), "name": name}


class FlakyGetitems(Flaky):
    """The same samples, a batch at a time: ``__getitems__`` raises if any index is bad."""

    def __getitems__(self, idx: list[int]) -> list[dict]:
        return [self[i] for i in idx]


class Mismatch:
    """Sample 5 has another shape: a layout to declare, not a sample to skip."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> np.ndarray:
        return np.zeros(4 if i == 5 else 3)


def expected(indices: list[list[int]], bad: set[int] | frozenset[int]) -> list[list[int]]:
    """What on_error="skip" gives for batches of ``indices``: each bad index replaced by the
    next index of its batch that loads, wrapping to the batch's start (NOTE [skipped samples])."""
    out = []
    for batch in indices:
        n, row_out = len(batch), []
        for r in range(n):
            for k in range(n):
                j = batch[(r + k) % n]
                if j not in bad:
                    row_out.append(j)
                    break
        out.append(row_out)
    return out
