"""Plain iterable datasets for tests/test_iterable.py (module level: spawn can unpickle them)."""

from __future__ import annotations

import os
import time

import numpy as np

import fastload


def worker_id() -> tuple[int, int]:
    info = fastload.get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


class PerWorker:
    """Worker k yields ``lengths[k]`` samples [k, j] (the main process is worker 0)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __iter__(self):
        k, _ = worker_id()
        for j in range(self.lengths[k]):
            yield np.array([k, j], np.int64)


class Split:
    """range(n) split across workers as torch's docs show (worker k takes k, k + W, ...)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        k, w = worker_id()
        return (np.int64(i) for i in range(k, self.n, w))


class Whole(Split):
    """range(n) in every worker (no splitting: every worker yields all of it, as with torch)."""

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return (np.int64(i) for i in range(self.n))


class RaisesAt:
    """A class-based iterator over range(n) whose sample ``bad`` raises, and goes on after."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __iter__(self):
        return _Raising(self.n, self.bad)


class _Raising:
    def __init__(self, n: int, bad: int) -> None:
        self.i, self.n, self.bad = 0, n, bad

    def __next__(self):
        i = self.i
        if i >= self.n:
            raise StopIteration
        self.i += 1
        if i == self.bad:
            raise ValueError(f"bad sample {i}")
        return np.int64(i)


class DiesOnce(Split):
    """Split(n), but the worker reading sample ``at`` dies (os._exit) the first time."""

    def __init__(self, n: int, at: int, flag: str) -> None:
        super().__init__(n)
        self.at, self.flag = at, flag

    def __iter__(self):
        for x in super().__iter__():
            if int(x) == self.at and not os.path.exists(self.flag):
                open(self.flag, "w").close()
                os._exit(3)
            yield x


class Barrier(Split):
    """Split(n) whose first sample in each worker waits until ``parties`` workers have begun
    one (files in ``where``): hangs unless every worker starts at once."""

    def __init__(self, n: int, parties: int, where: str) -> None:
        super().__init__(n)
        self.parties, self.where = parties, where

    def __iter__(self):
        k, _ = worker_id()
        open(os.path.join(self.where, f"started-{k}"), "w").close()
        deadline = time.monotonic() + 30
        while len(os.listdir(self.where)) < self.parties:
            if time.monotonic() > deadline:
                raise TimeoutError("not every worker started its first sample")
            time.sleep(0.01)
        return super().__iter__()


class Replica:
    """Yields what get_worker_info() says, and counts its own iterations (in the replica)."""

    def __init__(self) -> None:
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        info = fastload.get_worker_info()
        same = info is not None and info.dataset is self
        yield {"id": np.int64(info.id if info else -1),
               "num_workers": np.int64(info.num_workers if info else 0),
               "same": np.bool_(same), "passes": np.int64(self.passes)}


class Ragged(Split):
    """Split(n) of token sequences of length i % 5 + 1, and a string label."""

    def __iter__(self):
        for i in super().__iter__():
            yield {"tokens": np.arange(int(i) % 5 + 1, dtype=np.int32), "name": f"s{int(i)}"}


def round_robin(lengths: list[int], batch_size: int, drop_last: bool) -> list[list[list[int]]]:
    """torch's order for PerWorker(lengths): round r of worker 0, 1, ..., skipping ended ones
    (each batch as its [k, j] rows)."""
    per = []
    for k, n in enumerate(lengths):
        rows = [[k, j] for j in range(n)]
        bs = [rows[i:i + batch_size] for i in range(0, n, batch_size)]
        if drop_last and bs and len(bs[-1]) < batch_size:
            bs.pop()
        per.append(bs)
    out = []
    for r in range(max((len(b) for b in per), default=0)):
        out.extend(b[r] for b in per if r < len(b))
    return out
