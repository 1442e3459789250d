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


class Lines(fastload.ShardedStream):
    """One text file per shard, one int per line, no shard_len: fastload counts the files and
    remembers the counts. ``log``: as Counted's, with the shard's index in ``files``."""

    def __init__(self, files: list[str], log: str | None = None) -> None:
        self.files = list(files)
        self.log = log

    def shards(self) -> list[str]:
        return list(self.files)

    def iter_shard(self, shard: str, start: int) -> Iterator[Any]:
        if self.log is not None:
            from fastload._fill import sample_ctx

            with open(os.path.join(self.log, f"{os.getpid()}.log"), "a") as f:
                f.write(f"{sample_ctx()[1]} {self.files.index(shard)} {start}\n")
        with open(shard) as f:
            for i, line in enumerate(f):
                if i >= start:
                    yield np.int64(int(line))


class Pairs(Lines):
    """The same files cut into other samples: one per two lines (the sum of the two)."""

    def iter_shard(self, shard: str, start: int) -> Iterator[Any]:
        with open(shard) as f:
            values = [int(line) for line in f]
        for i in range(start, len(values) // 2):
            yield np.int64(values[2 * i] + values[2 * i + 1])


class HangsCounting(Counted):
    """Shard 1 stalls before its first sample (a read that never returns)."""

    def iter_shard(self, shard: str, start: int) -> Iterator[Any]:
        if shard == "part-001":
            import time

            time.sleep(600)
        yield from super().iter_shard(shard, start)


class CountFailsAt(Counted):
    """No shard_len; raises OSError at position ``at`` of shard ``shard`` (while counting)."""

    def __init__(self, sizes: list[int], shard: int, at: int) -> None:
        super().__init__(sizes)
        self.bad = (shard, at)

    def iter_shard(self, shard: str, start: int) -> Iterator[Any]:
        for i, x in enumerate(super().iter_shard(shard, start), start):
            if (int(shard.split("-")[1]), i) == self.bad:
                raise OSError(f"corrupt record {i}")
            yield x


class SizedLines(Lines):
    """Lines with shard_len (what a stream that never counts reads)."""

    def __init__(self, files: list[str], log: str | None = None) -> None:
        super().__init__(files, log)
        self.sizes = []
        for path in files:
            with open(path) as f:
                self.sizes.append(sum(1 for _ in f))

    def shard_len(self, shard: str) -> int:
        return self.sizes[self.files.index(shard)]
