"""Module-level datasets and order samplers for tests/test_compat_chainer.py.

Picklable (spawn/forkserver workers, Chainer's pool) and free of Chainer imports, so workers do
not import it. Every dataset derives its samples from the index only.
"""

from __future__ import annotations

import collections
import os
import time

import numpy as np

from . import claim, silence_stderr

Point = collections.namedtuple("Point", ["x", "y"])


class Tuples:
    """(float32 (2, 3) array, NumPy int64 label): what chainer.datasets.TupleDataset returns."""

    def __init__(self, n: int) -> None:
        self.x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
        self.t = np.arange(n, dtype=np.int64) % 3

    def __len__(self) -> int:
        return len(self.t)

    def __getitem__(self, i):
        return self.x[i], self.t[i]


class Dicts:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return {"x": np.full((3,), i, np.float64), "y": np.int32(i), "w": float(i) / 4}


class Arrays:
    """A bare array per sample."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return np.arange(4, dtype=np.uint8) + np.uint8(i)


class Ints:
    """A Python int per sample (a list of ints is a valid Chainer dataset too)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return int(i) * 10


class Mixed:
    """Every kind of leaf and container: the types must come back as Chainer returns them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        i = int(i)
        return (
            np.full((2,), i, np.int16),  # array
            i,  # Python int
            i / 3,  # Python float
            i % 2 == 0,  # Python bool
            complex(i, 1),  # Python complex
            np.float32(i) / 2,  # NumPy scalar
            np.array(i * 1.5),  # 0-d array
            f"s{i}",  # str
            None,
            {"a": [np.int64(i), (i, "t")], "b": Point(np.arange(2) + i, float(i)),
             "o": np.array([i, "o"], dtype=object)},  # an object array: pickled whole
            collections.OrderedDict(k=i),  # a dict subclass: pickled whole
            2**70 + i,  # beyond int64
            (),
            [],
        )


class Varying:
    """What Chainer's iterators take and a stacking loader cannot: keys that change with the
    index (``{i: array}``), arrays of varying length and dtype, samples of different types."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        i = int(i)
        kind = i % 4
        if kind == 0:
            return {i: np.zeros(10) + i}
        if kind == 1:
            return (np.arange(i, dtype=np.int32), np.ones((i % 3, 2), np.float32))
        if kind == 2:
            return [f"s{i}", np.full((2, 2), i, np.uint8), {"deep": {"x": np.array(i)}}]
        return np.arange(i * 2, dtype=np.float64) / 3


class IndexType:
    """Returns the type name of the index it was given (Chainer passes NumPy integers)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        return type(i).__name__


class Slow:
    """Sample ``slow`` sleeps ``delay`` seconds."""

    def __init__(self, n: int, slow: int, delay: float) -> None:
        self.n, self.slow, self.delay = n, slow, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.slow:
            time.sleep(self.delay)
        return np.float32(i)


class Fails:
    """Sample ``bad`` raises KeyError."""

    def __init__(self, n: int, bad: int) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"no sample {int(i)}")
        return np.float32(i)


class Pid:
    """The pid of the process that loaded the sample."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        return os.getpid()


class RollSampler:
    """A stateless order sampler: the next order is the current one rolled by the position + 1.

    Chainer calls an order sampler as ``sampler(current_order, current_position)``; ``calls``
    records those arguments (in the process that calls it: the main one for both iterators).
    """

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int]] = []

    def __call__(self, current_order, current_position):
        self.calls.append((list(map(int, current_order)), int(current_position)))
        return np.roll(np.asarray(current_order), int(current_position) + 1)


class CountingShuffle:
    """Chainer's ShuffleOrderSampler over a seeded RandomState, counting its calls."""

    def __init__(self, seed: int) -> None:
        self.random = np.random.RandomState(seed)
        self.calls: list[tuple[int, int]] = []

    def __call__(self, current_order, current_position):
        self.calls.append((len(current_order), int(current_position)))
        return self.random.permutation(len(current_order))


class ExitsOnce:
    """Sample ``bad`` kills its worker (exit code 3) the first time, while ``flag`` is absent."""

    def __init__(self, n: int, bad: int, flag: str) -> None:
        self.n, self.bad, self.flag = n, bad, flag

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.bad and claim(self.flag):
            silence_stderr()
            os._exit(3)
        return np.float32(i)
