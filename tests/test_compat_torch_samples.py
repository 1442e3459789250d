"""Samples and indices torch accepts, through fastload.compat.torch.DataLoader as through
torch's: dict subclasses keep their type (torch's collate copies the first sample's mapping and
updates it)."""

from __future__ import annotations

import collections

import numpy as np

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from fastload.compat.torch import DataLoader  # noqa: E402
from tests.helpers.torch_pool import Keyed, KeySampler, Mappings, MultiScale  # noqa: E402


@pytest.mark.parametrize("workers", [0, 2])
def test_dict_subclasses_keep_their_type(workers):
    kw = {"multiprocessing_context": "fork"} if workers else {}
    theirs = next(iter(torch.utils.data.DataLoader(Mappings(), batch_size=4,
                                                   num_workers=workers, **kw)))
    loader = DataLoader(Mappings(), batch_size=4, num_workers=workers, **kw)
    try:
        ours = next(iter(loader))
    finally:
        loader.close()
    assert type(ours) is type(theirs) is collections.OrderedDict
    assert type(ours["b"]) is collections.defaultdict
    assert ours["b"].default_factory is list
    assert list(ours) == ["a", "b"] and list(ours["b"]) == ["x", "y"]
    assert torch.equal(ours["a"], theirs["a"])
    assert torch.equal(ours["b"]["x"], theirs["b"]["x"])
    assert torch.equal(ours["b"]["y"], theirs["b"]["y"])


def _both(make):
    out = []
    for cls in (torch.utils.data.DataLoader, DataLoader):
        loader = make(cls)
        try:
            out.append([list(loader) for _ in range(2)])
        finally:
            if hasattr(loader, "close"):
                loader.close()
    return out


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert len(x) == len(y)
        for s, t in zip(x, y):
            assert torch.equal(s, t)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_of_keys(workers):
    # a dict-like dataset without __len__ and a sampler of string keys, as torch takes them
    kw = {"multiprocessing_context": "fork"} if workers else {}
    keys = [f"k{i}" for i in range(10)]
    theirs, ours = _both(lambda cls: cls(Keyed(), batch_size=3, num_workers=workers,
                                         sampler=KeySampler(keys), **kw))
    _equal(ours, theirs)
    assert sorted(int(v) for b in ours[0] for v in b[:, 0, 0]) == list(range(10))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_multi_scale_batch_sampler_of_tuples(workers):
    kw = {"multiprocessing_context": "fork"} if workers else {}
    # shapes vary between batches: torch's default_collate in the main process (fastload's
    # own stacking has one layout per loader, and says so)
    collate = torch.utils.data.default_collate
    theirs, ours = _both(lambda cls: cls(Keyed(), num_workers=workers, collate_fn=collate,
                                         batch_sampler=MultiScale(10, 4), **kw))
    _equal(ours, theirs)
    assert [tuple(b.shape) for b in ours[0]] == [(4, 2, 2), (4, 3, 3), (2, 2, 2)]
    loader = DataLoader(Keyed(), num_workers=workers, batch_sampler=MultiScale(10, 4), **kw)
    try:
        with pytest.raises(RuntimeError, match=r"sample index \('k4', 3\).*default_collate"):
            list(loader)
    finally:
        loader.close()


def test_a_keys_error_names_the_key():
    loader = DataLoader(Keyed(), batch_size=2, num_workers=2, multiprocessing_context="fork",
                        sampler=KeySampler(["k1", "bad"]))
    try:
        with pytest.raises(KeyError) as info:
            list(loader)
    finally:
        loader.close()
    assert "'bad'" in "".join(getattr(info.value, "__notes__", [])) + str(info.value)


def test_ints_past_the_length_go_to_the_dataset_as_torch_passes_them():
    sparse = {5: np.array([5]), 1000: np.array([1000])}
    theirs, ours = _both(lambda cls: cls(sparse, batch_size=2, sampler=[1000, 5]))
    _equal(ours, theirs)
