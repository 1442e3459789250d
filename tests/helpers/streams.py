"""ShardedStream datasets for tests/test_stream.py (importable by spawned workers)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

import fastload

BASE = 10**6  # sample value = shard * BASE + position in the shard


def expected(sizes: list[int]) -> list[int]:
    return [k * BASE + i for k, n in enumerate(sizes) for i in range(n)]


class Counted(fastload.ShardedStream):
    """Shards of ``sizes`` samples, no shard_len (fastload counts them). ``log``: a folder
    where every iter_shard call appends "shard start" to a file of its process."""

    def __init__(self, sizes: list[int], log: str | None = None) -> None:
        self.sizes = list(sizes)
        self.log = log

    def shards(self) -> list[str]:
        return [f"part-{k:03d}" for k in range(len(self.sizes))]

    def iter_shard(self, shard: str, start: int) -> Iterator[Any]:
        k = int(shard.split("-")[1])
        if self.log is not None:
            from fastload._fill import sample_ctx  # the epoch of the batch being loaded

            with open(os.path.join(self.log, f"{os.getpid()}.log"), "a") as f:
                f.write(f"{sample_ctx()[1]} {k} {start}\n")
        for i in range(start, self.sizes[k]):
            yield np.int64(k * BASE + i)


class Sized(Counted):
    def shard_len(self, shard: str) -> int:
        return self.sizes[int(shard.split("-")[1])]


def calls(log: str) -> list[tuple[int, int, int]]:
    """Every (epoch, shard, start) iter_shard was called with, in any process."""
    out = []
    for name in os.listdir(log):
        with open(os.path.join(log, name)) as f:
            out += [tuple(map(int, line.split())) for line in f if line.strip()]
    return out  # type: ignore[return-value]


class FailsAt(Sized):
    """Raises OSError at position ``at`` of shard ``shard``."""

    def __init__(self, sizes: list[int], shard: int, at: int) -> None:
        super().__init__(sizes)
        self.bad = (shard, at)

    def iter_shard(self, shard: str, start: int) -> Iterator[Any]:
        for i, x in enumerate(super().iter_shard(shard, start), start):
            if (int(shard.split("-")[1]), i) == self.bad:
                raise OSError(f"corrupt record {i}")
            yield x


class Lies(Sized):
    """shard_len says one more sample than iter_shard yields for shard 1."""

    def shard_len(self, shard: str) -> int:
        return super().shard_len(shard) + (shard == "part-001")


class Tokens(Sized):
    """Dict samples with a ragged "tokens" leaf (length = position % 5 + 1)."""

    def iter_shard(self, shard: str, start: int) -> Iterator[Any]:
        for x in super().iter_shard(shard, start):
            v = int(x)
            yield {"tokens": np.full(v % 5 + 1, v, np.int64), "id": np.int64(v)}
