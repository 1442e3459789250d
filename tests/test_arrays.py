"""fastload.ArrayDataset (rows gathered in C) and already-stacked __getitems__ batches."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from helpers.arrays import BadStack, StackedGetitems

import fastload
from fastload.arrays import ArrayDataset


@pytest.fixture
def mm_path(tmp_path):
    path = tmp_path / "rows.f32"
    mm = np.memmap(path, np.float32, "w+", shape=(1000, 16))
    mm[:] = np.arange(1000, dtype=np.float32)[:, None] + np.arange(16, dtype=np.float32) / 100
    mm.flush()
    del mm
    return str(path)


def _epoch(loader):
    return [tuple(np.array(leaf) for leaf in b) for b in loader]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_memmap_rows_match_getitem(mm_path, start_method):
    rows = np.memmap(mm_path, np.float32, "r", shape=(1000, 16))
    labels = np.arange(1000) * 3
    ds = ArrayDataset(rows, labels)
    ref = fastload.Loader(ds, 64, shuffle=True, seed=5, num_workers=0)
    with fastload.Loader(ds, 64, shuffle=True, seed=5, num_workers=2,
                         start_method=start_method) as loader, ref:
        for _ in range(2):
            got, want = _epoch(loader), _epoch(ref)
            assert len(got) == len(want) == 16
            for (gx, gy), (wx, wy) in zip(got, want):
                np.testing.assert_array_equal(gx, wx)
                np.testing.assert_array_equal(gy, wy)
                np.testing.assert_array_equal(gx, np.stack([rows[i] for i in gy // 3]))


def test_memmap_is_pickled_by_reference(mm_path):
    rows = np.memmap(mm_path, np.float32, "r", shape=(1000, 16))
    blob = pickle.dumps(ArrayDataset(rows[100:200]))
    assert len(blob) < 1000, "the memory map's data was pickled"
    back = pickle.loads(blob)
    assert isinstance(back._fastload_columns()[0], np.memmap)
    np.testing.assert_array_equal(back[0], rows[100])


@pytest.mark.parametrize("nw", [0, 2])
def test_dict_and_single_array_forms(nw):
    ds = ArrayDataset({"a": np.arange(10.0), "b": np.arange(10)[::-1].copy()})
    with fastload.Loader(ds, 4, num_workers=nw) as loader:
        out = list(loader)
    assert [b["a"].tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert out[0]["b"].tolist() == [9, 8, 7, 6]
    with fastload.Loader(ArrayDataset(np.arange(6)), 4, num_workers=nw) as loader:
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5]]


def test_non_contiguous_column_falls_back_correctly():
    base = np.arange(40, dtype=np.int64).reshape(20, 2)
    ds = ArrayDataset(base)
    ds._cols = [base[:, ::2]]  # force a strided column past the constructor's copy
    with fastload.Loader(ds, 8, num_workers=1) as loader:
        assert [b[:, 0].tolist() for b in loader] == [
            list(range(0, 16, 2)), list(range(16, 32, 2)), list(range(32, 40, 2))]


def test_constructor_validation():
    with pytest.raises(ValueError, match="share their first axis"):
        ArrayDataset(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="0-d"):
        ArrayDataset(np.float32(1))
    with pytest.raises(TypeError, match="object"):
        ArrayDataset(np.array([None, 1], dtype=object))
    with pytest.raises(ValueError, match="at least one"):
        ArrayDataset()


def test_gather_rejects_out_of_range_indices():
    from fastload import _pack

    lay = fastload.BatchLayout(np.zeros(4, np.float32), 8)
    buf = np.zeros(lay.slot_bytes, np.uint8)
    p = _pack.Packer(buf, 0, lay.slot_bytes, 1, 8, lay.tree, lay.packer_fields)
    src = np.ones((5, 4), np.float32)
    with pytest.raises(IndexError, match="index 5 is out of range for 5 rows"):
        p.gather(0, 0, src, np.array([0, 5], np.int64))
    with pytest.raises(IndexError, match="index -1"):
        p.gather(0, 0, src, np.array([-1], np.int64))
    with pytest.raises(IndexError):
        p.gather(0, 0, src, np.zeros(9, np.int64))  # more rows than the batch
    with pytest.raises(fastload.LayoutMismatchError):
        p.gather(0, 0, np.ones((5, 3), np.float32), np.array([0], np.int64))
    p.gather(0, 0, src * 2, np.array([4, 0], np.int64))
    out = lay.unpack(buf, 2, None)
    np.testing.assert_array_equal(out, np.full((2, 4), 2, np.float32))
    assert not buf[lay.fields[0].offset + 2 * 16:].any(), "wrote past the gathered rows"
    # from a row on (NpyShards: a batch's pieces of several shards, one after the other)
    p.gather(0, 0, src * 3, np.array([1, 2, 3], np.int64), 2)
    np.testing.assert_array_equal(lay.unpack(buf, 5, None)[2:], np.full((3, 4), 3, np.float32))
    with pytest.raises(IndexError, match="3 indices from row 6 for a batch of 8"):
        p.gather(0, 0, src, np.array([0, 1, 2], np.int64), 6)
    with pytest.raises(IndexError, match="from row -1"):
        p.gather(0, 0, src, np.array([0], np.int64), -1)
    assert not buf[lay.fields[0].offset + 5 * 16:].any(), "wrote past the gathered rows"


@pytest.mark.parametrize("nw", [0, 2])
def test_already_stacked_getitems(nw):
    with fastload.Loader(StackedGetitems(10), 4, num_workers=nw) as loader:
        out = list(loader)
    ref = [[{"x": np.full((2, 3), i, np.float32), "y": i} for i in range(s, min(s + 4, 10))]
           for s in (0, 4, 8)]
    for b, samples in zip(out, ref):
        np.testing.assert_array_equal(b["x"], np.stack([s["x"] for s in samples]))
        assert b["y"].tolist() == [s["y"] for s in samples]


@pytest.mark.parametrize("nw", [0, 2])
def test_badly_stacked_getitems_is_a_layout_error(nw):
    with fastload.Loader(BadStack(10), 4, num_workers=nw) as loader:
        with pytest.raises(fastload.LayoutMismatchError, match=r"stacked batch of shape"):
            list(loader)
