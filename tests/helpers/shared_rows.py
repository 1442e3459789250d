"""Datasets of tests/test_shared_rows.py (NOTE [pieces] in csrc/fl_ring.c)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import fastload


class Who:
    """Sample i: [i, the id of the worker that loaded it] after ``delay`` seconds."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if self.delay:
            time.sleep(self.delay)
        info = fastload.get_worker_info()
        return np.array([i, -1 if info is None else info.id], np.int64)


class Counted:
    """Sample i: an (2,) float32 array of i; counts the calls per (epoch, index) of the first
    ``len(calls) // n`` epochs in ``calls`` (a multiprocessing Array shared with forked
    workers) at ``epoch * n + i``."""

    def __init__(self, n: int, calls: Any, delay: float = 0.0) -> None:
        self.n, self.calls, self.delay = n, calls, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        from fastload._fill import sample_ctx  # (seed, epoch, index) being loaded

        at = sample_ctx()[1] * self.n + i
        if at < len(self.calls):
            with self.calls.get_lock():
                self.calls[at] += 1
        if self.delay:
            time.sleep(self.delay)
        return np.full(2, i, np.float32)


class FailLate:
    """Sample i raises KeyError after ``fails[i]`` seconds if i is in ``fails``, else sleeps
    ``delay`` and gives i: a batch whose later row fails first."""

    def __init__(self, n: int, fails: dict[int, float], delay: float = 0.05) -> None:
        self.n, self.fails, self.delay = n, fails, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.int64:
        if i in self.fails:
            time.sleep(self.fails[i])
            raise KeyError(f"sample {i} is broken")
        time.sleep(self.delay)
        return np.int64(i)


class HangThenFail:
    """Sample i: i after ``delay`` seconds; sample ``hang`` first hangs ``seconds`` (once per
    ``flag_path``), sample ``fail`` raises KeyError: a shared batch whose row fails while a row
    below it is still being loaded (issue 30's hang)."""

    def __init__(self, n: int, hang: int, fail: int, flag_path: str, delay: float = 0.01,
                 seconds: float = 30.0) -> None:
        self.n, self.hang, self.fail, self.flag_path = n, hang, fail, flag_path
        self.delay, self.seconds = delay, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.int64:
        from helpers import claim

        if i == self.fail:
            raise KeyError(f"sample {i} is broken")
        time.sleep(self.delay)
        if i == self.hang and claim(self.flag_path):
            time.sleep(self.seconds)
        return np.int64(i)
