"""Module-level datasets for tests/test_pool.py (picklable for every start method)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: How many times a CountsPickles dataset was pickled in this process.
PICKLED = [0]


class CountsPickles:
    """Sample i: (i, tag); counts its own pickling in the process that pickles it."""

    def __init__(self, n: int, tag: int = 0) -> None:
        self.n, self.tag = n, tag

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return (np.full((3,), i, np.int64), self.tag)

    def __getstate__(self) -> dict[str, Any]:
        PICKLED[0] += 1
        return dict(self.__dict__)


class Tagged:
    """Sample i: i * 1000 + tag (tells the loaders of a pool apart)."""

    def __init__(self, n: int, tag: int) -> None:
        self.n, self.tag = n, tag

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return np.int64(i * 1000 + self.tag)


class Unpicklable:
    def __init__(self, n: int) -> None:
        self.n = n
        self.fn = lambda: None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def worker_memfds(pid: int) -> int:
    """How many fastload memfd mappings process ``pid`` has (the bell plus one per loader)."""
    regions = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "memfd:fastload" in line:
                regions.add(line.split()[4])  # inode
    return len(regions)


def pid_of_worker(_: int) -> int:
    return os.getpid()


def failing_init(worker_id: int) -> None:
    raise OSError(f"worker {worker_id}: no accelerator here")
