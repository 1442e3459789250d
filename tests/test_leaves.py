"""fastload/compat/_leaves.py: the front ends' leaf tags, through a real Loader (NumPy only)."""

from __future__ import annotations

import collections
import enum

import numpy as np
import pytest

import fastload
from fastload.compat._leaves import columns, encode

Pair = collections.namedtuple("Pair", ["a", "b"])


class Kind(enum.IntEnum):
    A = 1
    B = 2


class MyDict(dict):
    pass


class Encoded:
    """Every sample `encode`d as a front end's worker does."""

    def __init__(self, ragged_at: int | None = None) -> None:
        self.ragged_at = ragged_at

    def __len__(self) -> int:
        return 6

    def sample(self, i: int):
        return {
            "x": np.arange(2 + (i == self.ragged_at), dtype=np.int32) + i,
            "zero_d": np.array(i * 1.5),
            "scalar": np.float32(i),
            "n": i, "f": i / 4, "b": i % 2 == 0, "c": complex(i, 1),
            "kind": Kind.A if i % 2 else Kind.B,
            "s": f"s{i}", "none": None,
            "obj": np.array([i, "x"], dtype=object),
            "pair": Pair(np.int64(i), [f"w{i}", (i,)]),
            "empty": (), "empty_d": {},
        }

    def __getitem__(self, i: int):
        return encode(self.sample(i))


def _equal(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tolist() == b.tolist()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _equal(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("num_workers", [0, 2])
def test_samples_come_back_as_the_dataset_returned_them(num_workers):
    ds = Encoded()
    with fastload.Loader(ds, 4, num_workers=num_workers) as loader:
        got = [s for batch in loader for s in columns(batch, len(batch["x"]))]
    assert len(got) == 6
    for i, s in enumerate(got):
        _equal(s, ds.sample(i))


def test_subclasses_of_containers_are_walked_as_builtins_numbers_kept_whole():
    class Sub(Encoded):
        def __getitem__(self, i):
            return encode({"sub": MyDict(k=i), "kind": Kind.A if i % 2 else Kind.B})

    with fastload.Loader(Sub(), 3, num_workers=0) as loader:
        batch = next(iter(loader))
    sample = columns(batch, 3)[1]
    assert type(sample["sub"]) is dict and sample["sub"] == {"k": 1}  # torch's collation: dict
    assert sample["kind"] is Kind.A  # a number subclass stays opaque: itself


def test_errors_name_the_leaf_not_the_tag():
    with fastload.Loader(Encoded(ragged_at=4), 3) as loader:
        with pytest.raises(fastload.LayoutMismatchError) as info:
            list(loader)
    assert str(info.value).startswith("sample['x']: expected shape (2,)")
    with fastload.Loader(Encoded(), 3) as loader:
        next(iter(loader))
        paths = [f.path for f in loader.layout.fields] + loader.layout.object_paths
    assert "sample['zero_d']" in paths and "sample['s']" in paths
    assert not any("\x00" in p for p in paths)
