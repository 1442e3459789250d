"""Module-level datasets for tests/test_leaks.py."""

import numpy as np


class Small:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((8,), i, np.float32), i


class Big:
    """Samples of 1 MiB: with batch 25 and 7 slots the region is about 175 MiB."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(2**18, i, np.float32)
