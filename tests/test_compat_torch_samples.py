"""Samples and indices torch accepts, through fastload.compat.torch.DataLoader as through
torch's: dict subclasses keep their type (torch's collate copies the first sample's mapping and
updates it)."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from fastload.compat.torch import DataLoader  # noqa: E402
from tests.helpers.torch_pool import Mappings  # noqa: E402


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
