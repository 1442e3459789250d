"""Module-level datasets for tests/test_resume.py."""

from __future__ import annotations

import numpy as np

import fastload


class Augmented:
    """Sample i: (i, a random draw from fastload.sample_rng())."""

    def __len__(self) -> int:
        return 50

    def __getitem__(self, i: int) -> tuple[int, np.ndarray]:
        return i, fastload.sample_rng().random(3)


class AugmentedBatch(Augmented):
    def __getitems__(self, idx: list[int]) -> list[tuple[int, np.ndarray]]:
        return [(i, fastload.sample_rng(i).random(3)) for i in idx]
