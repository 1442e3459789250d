"""Module-level datasets of tests/test_shared.py (shared containers, share_dataset)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

import fastload


def meta_item(i: int) -> dict[str, Any]:
    return {"path": f"img/{i:07d}.jpg", "h": 100 + i % 50, "w": 200 - i % 30,
            "boxes": [[float(i % 7), 1.5, 2.0, 3.0 + j] for j in range(i % 4)], "label": i % 80}


class Meta:
    """COCO-like metadata in Python containers: what share_dataset is for."""

    def __init__(self, n: int) -> None:
        self.items = [meta_item(i) for i in range(n)]
        self.names = [it["path"] for it in self.items]
        self.index_of = {name: i for i, name in enumerate(self.names)}
        self.small = [1, 2, 3]  # under the threshold: stays a list

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        it = self.items[i]
        j = self.index_of[self.names[i]]
        return {"i": np.int64(j), "h": np.int64(it["h"]), "nboxes": np.int64(len(it["boxes"])),
                "area": np.float64(sum(b[2] * b[3] for b in it["boxes"])), "pid": os.getpid(),
                "kind": type(self.items).__name__}


def meta_expected(i: int) -> dict[str, Any]:
    it = meta_item(i)
    return {"i": i, "h": it["h"], "nboxes": len(it["boxes"]),
            "area": sum(b[2] * b[3] for b in it["boxes"])}


class Wrapper:
    """A dataset that wraps another (as torch's Subset does): the inner one is walked too."""

    def __init__(self, inner: Any, indices: list[int]) -> None:
        self.inner = inner
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Any:
        return self.inner[self.indices[i]]


class MyList(list):  # type: ignore[type-arg]
    """A list subclass: may carry behaviour, so it is never converted."""

    def second(self, i: int) -> Any:
        return self[i][1]


class Special:
    """Attributes share_dataset must leave alone, and code that must keep working."""

    def __init__(self, n: int) -> None:
        self.pairs = MyList((i, -i) for i in range(n))
        self.grown = list(range(n))  # changed in worker_init in every worker
        self.odd = {frozenset([i]): i for i in range(n)}  # keys without a stable hash: left whole

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> Any:
        return {"neg": np.int64(self.pairs.second(i)), "tail": np.int64(self.grown[-1]),
                "n": np.int64(len(self.grown)), "odd": np.int64(self.odd[frozenset([i])]),
                "grown": type(self.grown).__name__}


def grow_in_worker(worker_id: int) -> None:
    """A worker_init that changes a list of the dataset, as users do to split work."""
    ds = fastload.get_worker_info().dataset
    ds.grown.append(1000 + worker_id)


def uss_of(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        kb = {ln.split()[0].rstrip(":"): int(ln.split()[1]) for ln in f.read().splitlines()[1:]
              if len(ln.split()) >= 2 and ln.split()[1].isdigit()}
    return (kb["Private_Clean"] + kb["Private_Dirty"]) * 1024


def read_all(shared: Any) -> Any:
    """In a child process: what a container pickled to it reads back."""
    if isinstance(shared, fastload.SharedDict):
        return list(shared.items()), shared.get("missing", "default"), len(shared)
    return list(shared), len(shared), shared[-1] if len(shared) else None


class MemmapShards:
    """Samples from memory-mapped ``.npy`` shards kept open in lists, dropped in
    ``__getstate__`` and reopened lazily in each worker (the usual pattern): share_dataset must
    leave it as it is."""

    def __init__(self, xs: list[str], ys: list[str]) -> None:
        self.xs, self.ys = xs, ys
        self._x: list[Any] | None = None
        self._y: list[Any] | None = None
        self._open()
        assert self._x is not None
        self.starts = np.cumsum([0] + [len(a) for a in self._x]).tolist()

    def _open(self) -> None:
        if self._x is None or self._y is None:
            self._x = [np.load(p, mmap_mode="r") for p in self.xs]
            self._y = [np.load(p, mmap_mode="r") for p in self.ys]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_x"] = state["_y"] = None  # reopened in the worker
        return state

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> Any:
        self._open()
        assert self._x is not None and self._y is not None
        s = int(np.searchsorted(self.starts, i, side="right")) - 1
        r = i - self.starts[s]
        return {"x": np.array(self._x[s][r]), "y": np.int64(self._y[s][r]),
                "kind": type(self._x).__name__}


class OpenShards:
    """Memory-mapped shards in a list (no pickling of its own) and a large plain list of
    names: the names are shared, the memmaps are not."""

    def __init__(self, xs: list[str], n_names: int) -> None:
        self.shards = [np.load(p, mmap_mode="r") for p in xs]
        self.names = [f"name-{i}" for i in range(n_names)]

    def __len__(self) -> int:
        return sum(len(a) for a in self.shards)

    def __getitem__(self, i: int) -> Any:
        n = len(self.shards[0])
        return {"x": np.array(self.shards[i // n][i % n]), "name": self.names[i % len(self.names)],
                "kind": type(self.shards).__name__, "names": type(self.names).__name__}


#: How many times a Pickled object has been pickled in this process.
PICKLED = [0]


class Pickled:
    """Counts its pickling (share_dataset must not pickle items to estimate a size)."""

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> Any:
        PICKLED[0] += 1
        return (Pickled, (self.i,))


class ManyPickled:
    def __init__(self, n: int) -> None:
        self.items = [Pickled(i) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return np.int64(self.items[i].i)


class Introspective:
    """A dataset whose own code treats its attributes as the list and dict they were:
    ``isinstance``, ``copy()`` and ``json.dumps`` of each, once per process (a digest of them
    goes into every sample), plus lookups per sample. share_dataset shares both (10,000 items
    or more)."""

    def __init__(self, n: int) -> None:
        self.index = [f"item-{i}" for i in range(n)]
        self.meta = {f"item-{i}": {"label": i % 7, "tags": ["x", str(i)]} for i in range(n)}
        self._digest: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.index)

    def digest(self) -> int:
        pid = os.getpid()
        if pid not in self._digest:
            assert isinstance(self.index, list) and isinstance(self.meta, dict)
            copied = self.index.copy() + list(self.meta.copy())
            self._digest[pid] = (len(json.dumps(self.index)) + len(json.dumps(self.meta))
                                 + len(copied))
        return self._digest[pid]

    def __getitem__(self, i: int) -> np.ndarray:
        key = self.index[i]
        return np.array([self.digest() + self.meta[key]["label"] + i], dtype=np.int64)
