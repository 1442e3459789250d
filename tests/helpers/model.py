"""The dataset of tests/test_engine_model.py (module level, light imports: spawn and forkserver
workers import it while the loader's timeout runs)."""

from __future__ import annotations

import os
import time

import numpy as np

_GATE_MAX_S = 20.0  # a sample never waits longer than this for the gate (never a hang)


class Gated:
    """Sample i: [i], after ``delay`` seconds; raises for ``bad`` indices; while the file
    ``gate`` exists, a sample waits (bounded) for it to go: a batch not loaded yet cannot be."""

    def __init__(self, n: int, bad: frozenset[int], gate: str, delay: float) -> None:
        self.n, self.bad, self.gate, self.delay = n, bad, gate, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        end = time.monotonic() + _GATE_MAX_S
        while os.path.exists(self.gate) and time.monotonic() < end:
            time.sleep(0.002)
        if self.delay:
            time.sleep(self.delay)
        if i in self.bad:
            raise ValueError(f"sample {i} is bad")
        return np.array([i], np.int64)
