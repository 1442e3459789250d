"""Datasets of the hosted-thread tests (worker_method="process_threads"): module-level, so
spawn and forkserver hosts can unpickle them."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from .shared_rows import Who


class WhoHolds(Who):
    """Sample i: (i, the loading process's pid, the id of the dataset object that loaded it):
    tells whether a host's threads share one dataset."""

    def __getitem__(self, i: int) -> np.ndarray:
        if self.delay:
            time.sleep(self.delay)
        return np.array([i, os.getpid(), id(self) % (1 << 62)], dtype=np.int64)


def memfd_mappings(pid: int) -> int:
    """How many mappings of fastload memfds process ``pid`` has (one line per mapping)."""
    with open(f"/proc/{pid}/maps") as f:
        return sum("memfd:fastload" in line for line in f)


def _cannot_rebuild() -> None:
    raise ValueError("cannot rebuild this dataset")


class RebuildFails:
    """Pickles; unpickling it (in a spawn worker or host) raises."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i

    def __reduce__(self) -> Any:
        return (_cannot_rebuild, ())
