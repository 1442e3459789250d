"""fastload/compat/_leaves.py: compat.torch's tagged leaves, through a real Loader (NumPy only)."""

from __future__ import annotations

import collections
import enum

import numpy as np
import pytest

import fastload
from fastload.compat._leaves import T_OBJ, encode, tag_of

Pair = collections.namedtuple("Pair", ["a", "b"])


class Kind(enum.IntEnum):
    A = 1
    B = 2


class MyDict(dict):
    pass


class Encoded:
    """Every sample `encode`d as compat.torch's worker does for its default collation."""

    def __init__(self, ragged_at: int | None = None) -> None:
        self.ragged_at = ragged_at

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return encode({
            "x": np.arange(2 + (i == self.ragged_at), dtype=np.int32) + i,
            "n": i, "f": i / 4, "scalar": np.float32(i),
            "kind": Kind.A if i % 2 else Kind.B, "s": f"s{i}", "none": None,
            "obj": np.array([i, "x"], dtype=object),
            "pair": Pair(np.int64(i), [f"w{i}", (i,)]),
            "sub": MyDict(k=i),
        })


@pytest.mark.parametrize("num_workers", [0, 2])
def test_numbers_and_arrays_stack_other_leaves_come_back_whole(num_workers):
    with fastload.Loader(Encoded(), 3, num_workers=num_workers) as loader:
        batch = next(iter(loader))
    assert batch["x"].tolist() == [[0, 1], [1, 2], [2, 3]] and batch["n"].tolist() == [0, 1, 2]
    assert batch["scalar"].dtype == np.float32
    assert type(batch["sub"]) is dict and batch["sub"]["k"].tolist() == [0, 1, 2]  # walked
    for key, want in (("kind", [Kind.B, Kind.A, Kind.B]), ("s", ["s0", "s1", "s2"]),
                      ("none", [None] * 3)):
        assert tag_of(batch[key]) == T_OBJ
        values = [o.value for o in batch[key][T_OBJ]]
        assert values == want and all(type(v) is type(w) for v, w in zip(values, want))
    assert [o.value.tolist() for o in batch["obj"][T_OBJ]] == [[0, "x"], [1, "x"], [2, "x"]]
    assert type(batch["pair"]) is Pair and batch["pair"].a.tolist() == [0, 1, 2]
    assert [o.value for o in batch["pair"].b[0][T_OBJ]] == ["w0", "w1", "w2"]


def test_errors_name_the_leaf_not_the_tag():
    with fastload.Loader(Encoded(ragged_at=4), 3, num_workers=0) as loader:
        with pytest.raises(fastload.LayoutMismatchError) as info:
            list(loader)
    assert str(info.value).startswith("sample['x']: expected shape (2,)")
    with fastload.Loader(Encoded(), 3, num_workers=0) as loader:
        next(iter(loader))
        paths = [f.path for f in loader.layout.fields] + loader.layout.object_paths
    assert "sample['s']" in paths and "sample['pair'].b[0]" in paths
    assert not any("\x00" in p for p in paths)


def test_a_dict_that_only_looks_like_a_tag_is_a_dict():
    assert tag_of({"\x00fastload.other": 1}) is None and tag_of({T_OBJ: 1, "b": 2}) is None
