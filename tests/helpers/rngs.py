"""Datasets of tests/test_global_rng.py (NOTE [global RNGs] in fastload/_rngs.py): importable
by spawn and forkserver workers."""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np

import fastload


class Augmented:
    """Sample i: [i, random.random(), np.random.rand(), np.random.randint(10**6)], after
    ``delay`` seconds (shared batches need slow rows), as torch-habit augmentation draws."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if self.delay:
            time.sleep(self.delay)
        return np.array([i, random.random(), np.random.rand(), np.random.randint(10**6)])


class LateDraws(Augmented):
    """Draws from the global RNGs from sample 1 on only: sample 0 (the probe) does not."""

    def __getitem__(self, i: int) -> np.ndarray:
        if i == 0:
            return np.array([0.0, 0.0, 0.0, 0.0])
        return super().__getitem__(i)


class AugmentedBatches(Augmented):
    """``__getitems__``: one call per batch, which draws once per sample."""

    def __getitems__(self, indices: list[int]) -> list[np.ndarray]:
        return [super(AugmentedBatches, self).__getitem__(i) for i in indices]


class FailingAugmented(Augmented):
    """Augmented, whose samples in ``bad`` raise (on_error="skip")."""

    def __init__(self, n: int, bad: set[int]) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.bad:
            raise KeyError(i)
        return super().__getitem__(i)


class Which:
    """Sample i: [i, the loading worker's id, its first draw from random]."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> Any:
        info = fastload.get_worker_info()
        return np.array([i, -1 if info is None else info.id, random.random()])


class TorchAugmented:
    """A torch-style dataset whose samples draw from random, np.random and torch's generator
    (torch is imported by the test that uses it)."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.tensor([i, random.random(), np.random.rand(), torch.rand(()).item()],
                            dtype=torch.float64)


class Synchronized:
    """torch's SynchronizedSeedDataset, in spirit: every one of ``n`` workers must load one
    sample at the same time (a barrier of files in ``where``: no multiprocessing arena), then
    returns ``torch.initial_seed()``. It fails (the barrier times out) unless each of the n
    workers loads one of the n batches, as torch's batch i to worker i % n does."""

    def __init__(self, n: int, where: str) -> None:
        self.n, self.where = n, where

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import os

        import torch

        open(os.path.join(self.where, str(i)), "w").close()
        deadline = time.monotonic() + 20
        while len(os.listdir(self.where)) < self.n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"sample {i}: the other workers never came")
            time.sleep(0.002)
        return torch.initial_seed()
