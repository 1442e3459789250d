"""Datasets and batch fingerprints of tests/test_soak.py (module-level: spawn workers import it)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

KINDS = ("fixed", "spill", "ragged", "unstacked", "shared")


class SoakData:
    """Samples derived from the index only, of one kind:

    * fixed: (float32 (8,), int, str) - stacked, an object leaf;
    * spill: (int64 (4,), bytes) where every 5th sample's bytes are 200 kB - its batch does not
      fit the slot's variable area (sized from sample 0) and travels in a memfd;
    * ragged: {"tokens": int32 of length i % 23, "label": i} - ragged="packed";
    * unstacked: a structure that changes with the index - stack=False;
    * shared: (float32 (8,), int64), 6 ms each - fixed-shape leaves only: with 2 workers or
      more its first and last batches are shared, loaded in pieces by any worker (NOTE
      [pieces] in csrc/fl_ring.c; a batch quicker than 20 ms to load is taken whole).
    """

    def __init__(self, n: int, kind: str) -> None:
        self.n, self.kind = n, kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        kind = self.kind
        if kind == "fixed":
            return np.arange(8, dtype=np.float32) + i, i, "s" * (i % 13)
        if kind == "shared":  # slow enough that workers share its batches in pieces
            time.sleep(0.006)
            return np.arange(8, dtype=np.float32) + i, np.int64(i)
        if kind == "spill":
            return np.full(4, i, np.int64), bytes([i % 256]) * (200_000 if i % 5 == 0 and i else 8)
        if kind == "ragged":
            return {"tokens": np.arange(i % 23, dtype=np.int32) + i, "label": i}
        if i % 3 == 0:
            return {i: np.zeros(i % 7) + i}
        if i % 3 == 1:
            return (f"t{i}", np.full((2, i % 4), i, np.int16))
        return [np.float64(i), {"deep": np.array(i)}]


def loader_kwargs(kind: str) -> dict[str, Any]:
    if kind == "ragged":
        return {"ragged": {"tokens": "packed"}}
    if kind == "unstacked":
        return {"stack": False}
    return {}


def fingerprint(kind: str, batch: Any) -> Any:
    """A batch as plain Python values, to compare with the num_workers=0 reference."""
    if kind == "fixed":
        x, n, s = batch
        return x.tolist(), n.tolist(), list(s)
    if kind == "shared":
        x, n = batch
        return x.tolist(), n.tolist()
    if kind == "spill":
        x, b = batch
        return x.tolist(), [(len(v), v[:1]) for v in b]
    if kind == "ragged":
        t = batch["tokens"]
        return t.values.tolist(), t.offsets.tolist(), batch["label"].tolist()
    return [_plain(s) for s in batch]


def _plain(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return ("a", x.dtype.str, x.shape, x.tolist())
    if isinstance(x, np.generic):
        return ("g", x.dtype.str, x.item())
    if isinstance(x, dict):
        return ("d", [(k, _plain(v)) for k, v in x.items()])
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_plain(v) for v in x])
    return x
