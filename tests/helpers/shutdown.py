"""Module-level dataset for tests/test_shutdown.py (importable by spawn/forkserver workers)."""

import os
import time

import numpy as np


class Slow:
    def __init__(self) -> None:
        # Long enough for share_dataset: every exit scenario also has shared containers.
        self.tags = list(range(10_000))
        self.names = {f"s{i}": i for i in range(10_000)}

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        time.sleep(0.002)
        return np.full(4, self.names[f"s{self.tags[i]}"], np.int64), os.getpid()
