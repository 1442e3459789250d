"""Module-level datasets and hooks for tests/test_compat_torch.py (picklable for spawn)."""

from __future__ import annotations

import collections
import enum
import os

import numpy as np
import torch

Point = collections.namedtuple("Point", ["x", "y"])


class ArrayDS:
    """Sample i: a float32 vector [i, i+0.5, i+0.25]."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.array([i, i + 0.5, i + 0.25], np.float32)


class MixedDS:
    """dict / tuple / namedtuple / str / Python and NumPy scalars / tensors, all in one."""

    def __init__(self, n: int = 11) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {
            "img": torch.full((2, 3), float(i)),
            "pair": (i, float(i) / 2),
            "pt": Point(np.int32(i), np.float32(i) * 2),
            "name": f"s{i}",
            "flag": i % 2 == 0,
            "lst": [np.arange(2) + i, torch.tensor(i)],
        }


class TensorPairDS:
    def __len__(self) -> int:
        return 9

    def __getitem__(self, i: int):
        return torch.arange(4, dtype=torch.float32) + i, torch.tensor(i)


class WorkerInfoDS:
    """Reports, per sample, what the worker sees: torch's worker info and seed."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        info = torch.utils.data.get_worker_info()
        assert info is not None and isinstance(info.dataset, WorkerInfoDS)
        return np.array(
            [i, info.id, info.num_workers, info.seed, torch.initial_seed(),
             int(os.environ.get("FL_COMPAT_INIT", "-1"))],
            np.int64,
        )


def record_init(worker_id: int) -> None:
    os.environ["FL_COMPAT_INIT"] = str(100 + worker_id)


class FailingDS:
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        if i == 4:
            raise KeyError(f"bad sample {i}")
        return np.float64(i)


def pad_collate(samples):
    """A typical custom collate: sees the samples as the dataset returned them."""
    assert all(isinstance(s["img"], torch.Tensor) for s in samples)
    assert all(isinstance(s["name"], str) and isinstance(s["flag"], bool) for s in samples)
    assert all(type(s["pair"]) is tuple and type(s["pair"][0]) is int for s in samples)
    return {
        "img": torch.stack([s["img"] for s in samples]),
        "names": "|".join(s["name"] for s in samples),
        "n": len(samples),
    }


class SlowDS:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        if i >= 2:
            import time

            time.sleep(3)
        return np.float32(i)


class StrDS:
    """Only an object leaf per sample (no array to count the batch by)."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int):
        return f"s{i}"


class ObjArrayDS:
    """An object-dtype array leaf (pickled whole), which is not a structure list."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int):
        return {"o": np.array([i, "x"], dtype=object), "y": i}


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


class EveryLeafDS:
    """One of each leaf type the torch front end tags (fastload/compat/_leaves.py): a tensor, a
    0-d array, an IntEnum, a str, a NumPy scalar, a bool, strings in a list; with `ragged_at`,
    the tensor of that sample is one longer (an undeclared ragged leaf)."""

    def __init__(self, n: int = 6, ragged_at: int | None = None) -> None:
        self.n = n
        self.ragged_at = ragged_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        t = torch.arange(3 + (i == self.ragged_at), dtype=torch.float64) * i
        return {
            "t": t,
            "zero_d": np.array(i * 0.5),
            "color": Color.RED if i % 2 else Color.BLUE,
            "scalar": np.float32(i),
            "flag": i % 3 == 0,
            "name": f"s{i}",
            "extra": dict(a=i, b=(np.int16(i), [f"w{i}"])),
        }


class RaggedDS:
    """Token tensors of varying length, a str, and a structure that changes with the index."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        sample = {"tokens": torch.arange(i % 5, dtype=torch.int64) + i, "name": f"s{i}"}
        if i % 2:
            sample["extra"] = (np.full((i, 2), i, np.float32), [i, None])
        return sample


class PathsDS:
    """A torch-style dataset whose metadata is a long Python list: share_dataset's case."""

    def __init__(self, n: int = 12_000) -> None:
        self.paths = [f"images/{i:06d}.jpg" for i in range(n)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return np.array([i, len(self.paths[i])], np.int64), type(self.paths).__name__


class TorchStream(torch.utils.data.IterableDataset):
    """Worker k (torch's get_worker_info) yields lengths[k] samples tensor([k, j]); with
    ``length``, a __len__ that says so."""

    def __init__(self, lengths: list[int], length: int | None = None) -> None:
        self.lengths, self.length = lengths, length

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k = info.id if info is not None else 0
        return iter([torch.tensor([k, j]) for j in range(self.lengths[k])])

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("no len")
        return self.length


class TouchInit:
    """A worker_init_fn that leaves a file named by the worker id in ``where``."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __call__(self, worker_id: int) -> None:
        open(os.path.join(self.where, str(worker_id)), "w").close()
