"""Datasets of tests/test_passes.py (module level: spawn and forkserver workers import them)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

_GATE_MAX_S = 30.0  # a gated sample never waits longer than this (never a hang)


class GatedAt:
    """Sample i: [i]; sample ``slow`` waits (bounded) while the file ``gate`` exists."""

    def __init__(self, n: int, slow: int = -1, gate: str = "") -> None:
        self.n, self.slow, self.gate = n, slow, gate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.slow:
            end = time.monotonic() + _GATE_MAX_S
            while os.path.exists(self.gate) and time.monotonic() < end:
                time.sleep(0.005)
        return np.array([i])


class Marked:
    """Sample i: [i] after ``delay`` s; each sample first writes ``<pid>-<i>-<k>`` into the
    directory ``marks`` (k counts the samples this process began), so a test sees who loads
    what now."""

    def __init__(self, n: int, delay: float, marks: str) -> None:
        self.n, self.delay, self.marks = n, delay, marks
        self.begun = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        self.begun += 1
        open(os.path.join(self.marks, f"{os.getpid()}-{i}-{self.begun}"), "w").close()
        time.sleep(self.delay)
        return np.array([i])


class FailsAt:
    def __init__(self, n: int, bad: tuple[int, ...]) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.bad:
            raise ValueError(f"sample {i} is bad")
        return np.array([i])


class OnlyWorkersImport:
    """Sample 2 holds an object whose class only the workers can import."""

    def __init__(self, n: int, path: str, module: str) -> None:
        self.n, self.path, self.module = n, path, module

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        obj = None
        if i == 2:
            if self.path not in sys.path:
                sys.path.insert(0, self.path)
            obj = __import__(self.module).Obj()
        return {"x": np.array([i]), "o": obj}
