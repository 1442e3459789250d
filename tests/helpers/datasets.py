"""Datasets and callables shared by the loader, error, layout and typing tests."""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

import numpy as np

import fastload

from . import claim

# -- plain datasets --------------------------------------------------------------------------------
class Range:
    """Sample i: the Python int i (shape ()), or an array of ``shape`` filled with i."""

    def __init__(self, n: int, shape: tuple[int, ...] | None = None, dtype: Any = np.int64):
        self.n = n
        self.shape = shape
        self.dtype = dtype

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.shape is None:
            return i
        return np.full(self.shape, i, dtype=self.dtype)


def range_batch_ok(batch: np.ndarray, shape: tuple[int, ...] | None = None) -> list[int]:
    """The indices of a Range batch, after checking each row is ``shape``, uniform, and native."""
    assert isinstance(batch, np.ndarray), type(batch)
    assert batch.dtype.isnative
    if shape is None:
        assert batch.ndim == 1, batch.shape
        return [int(v) for v in batch.tolist()]
    assert batch.shape[1:] == tuple(shape), batch.shape
    flat = batch.reshape(len(batch), -1)
    idx = [int(v) for v in flat[:, 0]]
    for r, i in enumerate(idx):
        assert (flat[r] == i).all(), f"row {r} is not uniform: {batch[r]!r}"
    return idx


Point = collections.namedtuple("Point", ["x", "y"])


class Thing:
    """An arbitrary picklable object (an object leaf)."""

    def __init__(self, v: int):
        self.v = v

    def __eq__(self, other: object) -> bool:
        return type(other) is Thing and other.v == self.v

    def __hash__(self) -> int:
        return hash(self.v)

    def __repr__(self) -> str:
        return f"Thing({self.v})"


def nested_sample(i: int) -> dict[str, Any]:
    """A sample that uses every container kind, nested three deep, and every leaf kind."""
    return {
        "a": (
            i,  # Python int -> int64
            float(i) / 2,  # Python float -> float64
            i % 2 == 0,  # Python bool -> bool
            np.float32(i),  # NumPy scalar keeps its dtype
            np.arange(3, dtype=np.int16) + i,
        ),
        "b": [{"c": np.full((2, 2), i, np.uint8), "d": np.array(i * 10, np.int32)}, f"s{i}"],
        "p": Point(x=np.array([i, -i], np.float64), y=None),
        "o": Thing(i),
    }


class Nested:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return nested_sample(i)


class Layouts:
    """Sample i: the same values as arange(...)+i, delivered in awkward memory layouts."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return layouts_sample(i)


def layouts_sample(i: int) -> dict[str, Any]:
    base = (np.arange(24, dtype=np.float64) + 100 * i).reshape(4, 6)
    return {
        "fortran": np.asfortranarray(base),
        "neg": (np.arange(10, dtype=np.int32) + i)[::-1],
        "strided": base[:, ::2],
        "swapped": (np.arange(5, dtype=np.int32) + i).astype(">i4"),
        "swapped_f": np.asfortranarray(base.astype(">f8")),
        "zero_d": np.array(i, dtype=">i8"),
        "empty": np.zeros((0, 3), np.float32),
    }


class Objects:
    """Sample i: (i, "str<i>", None, Thing(i)); sample ``big_at`` carries a ``big``-char string."""

    def __init__(self, n: int, big_at: int | None = None, big: int = 0):
        self.n = n
        self.big_at = big_at
        self.big = big

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        s = f"str{i}"
        if i == self.big_at:
            s = s + "x" * self.big
        return (i, s, None, Thing(i))


class TypeCheck:
    """Sample i: (i, type(i) is int)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        return (int(i), type(i) is int)


class PidDataset:
    """Sample i: (i, os.getpid())."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return (i, os.getpid())


class WorkerInfoDataset:
    """Sample i: (i, id, num_workers, seed, info.dataset is self, pid); -1s outside workers."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        info = fastload.get_worker_info()
        if info is None:
            return (i, -1, -1, -1, False, os.getpid())
        return (i, info.id, info.num_workers, int(info.seed), info.dataset is self, os.getpid())


class BigSample:
    """Sample i: an int64 array of ``nbytes`` bytes equal to arange(n) + i * 1000."""

    def __init__(self, n: int, nbytes: int):
        self.n = n
        self.count = nbytes // 8

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        a = np.arange(self.count, dtype=np.int64)
        a += i * 1000
        return a


class InitRecorder:
    """worker_init that records "<worker_id> <pid>" as one file per call in ``directory``."""

    def __init__(self, directory: str):
        self.directory = directory

    def __call__(self, worker_id: int) -> None:
        path = os.path.join(self.directory, f"init-{worker_id}-{os.getpid()}-{time.monotonic_ns()}")
        with open(path, "w") as f:
            f.write(f"{worker_id} {os.getpid()}")


class NoLen:
    def __getitem__(self, i: int) -> int:
        return i


class LambdaHolder(Range):
    """Unpicklable (holds a lambda)."""

    def __init__(self, n: int):
        super().__init__(n)
        self.fn = lambda x: x


class LockHolder(Range):
    """Unpicklable (holds a threading.Lock)."""

    def __init__(self, n: int):
        super().__init__(n)
        self.lock = threading.Lock()


# -- mismatching samples ---------------------------------------------------------------------------
def mismatch_base(i: int) -> dict[str, Any]:
    return {
        "img": np.full((2, 3), i, np.float32),
        "pair": (i, np.float32(i)),
        "name": f"n{i}",
    }


class ShapeChangeAt:
    """Consistent samples, except sample ``index`` which differs in the way ``kind`` says."""

    def __init__(self, n: int, index: int, kind: str):
        self.n = n
        self.index = index
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        s = mismatch_base(i)
        if i != self.index:
            return s
        if self.kind == "shape":
            s["img"] = np.full((3, 2), i, np.float32)
        elif self.kind == "dtype":
            s["img"] = np.full((2, 3), i, np.float64)
        elif self.kind == "dictkey":
            del s["pair"]
        elif self.kind == "tuplelen":
            s["pair"] = (i, np.float32(i), 0)
        elif self.kind == "tostring":
            s["img"] = "not an array"
        elif self.kind == "ndim":
            s["img"] = np.full((2, 3, 1), i, np.float32)
        else:  # pragma: no cover
            raise AssertionError(self.kind)
        return s


#: kind -> (field path that the error must name, another word it must contain)
MISMATCH_PATHS = {
    "shape": ("sample['img']", "shape"),
    "dtype": ("sample['img']", "float64"),
    "dictkey": ("sample", "pair"),
    "tuplelen": ("sample['pair']", "length"),
    "tostring": ("sample['img']", "str"),
    "ndim": ("sample['img']", "shape"),
}


# -- user code that raises --------------------------------------------------------------------------
class CustomError(Exception):
    """A module-level exception: must come back with its own type."""


class TwoArgError(Exception):
    """Needs two constructor arguments (cannot be rebuilt as cls(message))."""

    def __init__(self, code: int, detail: str):
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


class UnpicklableError(Exception):
    """Cannot be pickled (holds a lock): must come back as fastload.WorkerError."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.lock = threading.Lock()


def _raise_from_user_code(exc: BaseException) -> None:
    """A distinctive function name that must appear in the re-raised error's traceback text."""
    raise exc


class Raises:
    """Sample ``index`` raises ``make_exc()``; with ``flag_path`` only the first time."""

    def __init__(self, n: int, index: int, exc_type: type, args: tuple = (), flag_path: str | None = None):
        self.n = n
        self.index = index
        self.exc_type = exc_type
        self.args = args
        self.flag_path = flag_path

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.index and claim(self.flag_path):
            _raise_from_user_code(self.exc_type(*self.args))
        return (i, np.full((3,), i, np.float32))


class SlowAt:
    """Sample i: i; loading the indices in ``slow`` takes ``seconds``."""

    def __init__(self, n: int, slow: tuple[int, ...], seconds: float) -> None:
        self.n, self.slow, self.seconds = n, slow, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.slow:
            time.sleep(self.seconds)
        return i


class DefaultDicts:
    """defaultdict samples: sample 0 has keys a, b; later samples a, c (same count)."""

    def __init__(self) -> None:
        import collections

        self.made: list[Any] = []
        self._dd = collections.defaultdict

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        d = self._dd(lambda: np.zeros(2))
        d["a"] = np.full(2, i)
        d["b" if i == 0 else "c"] = np.full(2, -i)
        self.made.append(d)
        return d

    def __getstate__(self) -> dict[str, Any]:
        return {"made": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        import collections

        self.made, self._dd = [], collections.defaultdict


class TupleGetitems:
    """__getitems__ returns a tuple: of samples (`stacked=False`) or the stacked batch."""

    def __init__(self, stacked: bool) -> None:
        self.stacked = stacked

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        return (np.full(2, i), np.full(2, 10 + i))

    def __getitems__(self, indices: list[int]) -> Any:
        if self.stacked:
            return (np.stack([np.full(2, i) for i in indices]),
                    np.stack([np.full(2, 10 + i) for i in indices]))
        return tuple(self[i] for i in indices)


class FailingGetitems:
    """__getitems__ raises for the batch with index `bad`, or (`mismatch`) returns a list of
    samples whose sample `bad` has another shape."""

    def __init__(self, bad: int, mismatch: bool = False) -> None:
        self.bad, self.mismatch = bad, mismatch

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> Any:
        return np.zeros(3 + (self.mismatch and i == self.bad))

    def __getitems__(self, indices: list[int]) -> Any:
        if not self.mismatch and self.bad in indices:
            raise KeyError(f"no batch with {self.bad}")
        return [self[i] for i in indices]


class NumpyStrings:
    """(np.str_ of i + 1 characters, np.bytes_, i)."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> Any:
        return np.str_("x" * (i + 1)), np.bytes_(b"y" * i), i


class RaisesAt:
    """Every sample in ``bad`` raises ValueError naming it, every time it is loaded."""

    def __init__(self, n: int, bad: tuple[int, ...]) -> None:
        self.n, self.bad = n, set(bad)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i in self.bad:
            raise ValueError(f"sample {i} is bad")
        return np.int64(i)


class OddBig:
    """Sample i: (i, a string of ``big`` chars if i is odd, else a short one): with batches of
    2 and no shuffle, every batch's objects outgrow the slot (sized from sample 0) and travel
    by the pipe (a Spill message)."""

    def __init__(self, n: int, big: int = 300_000):
        self.n = n
        self.big = big

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return (i, "x" * self.big if i % 2 else "s")
