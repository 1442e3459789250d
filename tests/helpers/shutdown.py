"""Module-level dataset for tests/test_shutdown.py (importable by spawn/forkserver workers)."""

import os
import time

import numpy as np


class Slow:
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        time.sleep(0.002)
        return np.full(4, i, np.int64), os.getpid()
