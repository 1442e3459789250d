"""The worker side of fastload.compat.chainer, without Chainer.

Workers import this module to unpickle the dataset wrapper; keeping Chainer out of it spares
each spawn/forkserver worker Chainer's import (about a second).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class _ChainerDataset:
    """Picklable wrapper run in the workers: Chainer's index type."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        # Chainer indexes with the elements of its index arrays (numpy.intp), not Python ints.
        return self.dataset[np.intp(index)]


