"""Module-level datasets for tests/test_faults.py (picklable for every start method)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np


def _quiet() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)


class KillFirstTimes:
    """Index ``bad`` SIGKILLs its worker the first ``times`` times it is loaded (counted with
    marker files in ``flag_dir``, shared by every worker)."""

    def __init__(self, n: int, bad: int, times: int, flag_dir: str) -> None:
        self.n, self.bad, self.times, self.flag_dir = n, bad, times, flag_dir

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        if i == self.bad:
            for k in range(self.times):
                try:
                    fd = os.open(f"{self.flag_dir}/kill{k}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    continue
                os.close(fd)
                _quiet()
                os.kill(os.getpid(), signal.SIGKILL)
        return i, os.getpid()


class Steady:
    """Every sample takes ``delay`` seconds: each batch is quick, the epoch is long."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i


class LiesAboutLen:
    """Claims ``claimed`` samples but only has ``real``."""

    def __init__(self, claimed: int, real: int) -> None:
        self.claimed, self.real = claimed, real

    def __len__(self) -> int:
        return self.claimed

    def __getitem__(self, i: int) -> np.ndarray:
        if i >= self.real:
            raise IndexError(f"index {i} out of range for {self.real} samples")
        return np.full(3, i)


class ObjectArrays:
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([i, "x", None], dtype=object)
