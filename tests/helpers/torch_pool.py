"""Datasets of tests/test_compat_torch_pool.py (torch imported by the test that uses them)."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch


class Drawn(torch.utils.data.Dataset):  # type: ignore[misc]
    """Sample i: [i, random, np.random, torch draws, torch's worker id]."""

    def __init__(self, n: int = 37) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        info = torch.utils.data.get_worker_info()
        return torch.tensor([i, random.random(), np.random.rand(), torch.rand(()).item(),
                             -1 if info is None else info.id], dtype=torch.float64)


class Split(torch.utils.data.IterableDataset):  # type: ignore[misc]
    """0..n-1, split between torch's workers by get_worker_info(), as torch's docs show."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        k, w = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(k, self.n, w))


class MarkInit:
    """A worker_init_fn that writes a file named after the worker and its process."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, worker_id: int) -> None:
        open(os.path.join(self.where, f"{worker_id}-{os.getpid()}"), "w").close()


class Mappings(torch.utils.data.Dataset):  # type: ignore[misc]
    """Samples that are dict subclasses: an OrderedDict holding a defaultdict."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        import collections

        inner = collections.defaultdict(list)
        inner["x"] = np.full(3, i)
        inner["y"] = i
        return collections.OrderedDict(a=torch.tensor(i), b=inner)


class Keyed:
    """A dict-like dataset: keys "k0".."k{n-1}", no __len__ (torch needs none with a sampler);
    a (key, scale) tuple gives the sample at that scale; key "bad" raises KeyError."""

    def __init__(self, n: int = 10) -> None:
        self.n = n

    def __getitem__(self, key: Any) -> Any:
        scale = 1
        if isinstance(key, tuple):
            key, scale = key
        if not isinstance(key, str) or not key.startswith("k"):
            raise KeyError(key)
        i = int(key[1:])
        return np.full((scale, scale), i, np.int64)


class KeySampler:
    """Yields keys, shuffled by a seeded generator each epoch."""

    def __init__(self, keys: list[Any], seed: int = 0) -> None:
        self.keys, self.epoch, self.seed = keys, 0, seed

    def __iter__(self) -> Any:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.keys))
        self.epoch += 1
        return iter([self.keys[k] for k in order])

    def __len__(self) -> int:
        return len(self.keys)


class MultiScale:
    """A batch sampler whose batches are [(key, scale), ...], one scale per batch."""

    def __init__(self, n: int, batch_size: int, scales: tuple[int, ...] = (2, 3)) -> None:
        self.n, self.bs, self.scales = n, batch_size, scales

    def __iter__(self) -> Any:
        for b, start in enumerate(range(0, self.n, self.bs)):
            s = self.scales[b % len(self.scales)]
            yield [(f"k{i}", s) for i in range(start, min(start + self.bs, self.n))]

    def __len__(self) -> int:
        return -(-self.n // self.bs)
