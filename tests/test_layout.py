"""BatchLayout: from the first sample to the byte layout of one slot (pure Python)."""

from __future__ import annotations

import collections
import pickle

import numpy as np
import pytest

import fastload
from fastload.layout import ALIGN, PAGE, BatchLayout

from helpers.datasets import Point, Thing, nested_sample


def _regions_disjoint(lay: BatchLayout) -> None:
    """Index area, each field's rows and the variable area are aligned, disjoint and in order."""
    regions = [(lay.index_offset, 8 * lay.batch_size + 8, "indices and seed")]
    regions += [(f.offset, f.row_bytes * lay.batch_size, f.path) for f in lay.fields]
    end = 0
    for off, size, name in regions:
        assert off % ALIGN == 0, (name, off)
        assert off >= end, f"{name} at {off} overlaps the previous region ending at {end}"
        end = off + size
    assert lay.var_offset >= end
    assert lay.var_offset % ALIGN == 0
    assert lay.var_offset + lay.var_bytes <= lay.slot_bytes
    assert lay.slot_bytes % PAGE == 0


def test_docstring_example():
    lay = BatchLayout((np.zeros((2, 3), np.float32), 7), batch_size=4)
    assert [(f.path, str(f.dtype), f.shape) for f in lay.fields] == [
        ("sample[0]", "float32", (2, 3)),
        ("sample[1]", "int64", ()),
    ]


@pytest.mark.parametrize(
    "leaf, dtype",
    [
        (3, np.int64),
        (-(2**63), np.int64),
        (2.5, np.float64),
        (True, np.bool_),
        (1 + 2j, np.complex128),
        (np.float32(1.5), np.float32),
        (np.int8(-3), np.int8),
        (np.uint64(2**64 - 1), np.uint64),
        (np.bool_(False), np.bool_),
        (np.float16(1), np.float16),
        (np.array(4, np.uint16), np.uint16),
    ],
)
def test_scalar_leaves_map_to_dtypes(leaf, dtype):
    lay = BatchLayout(leaf, batch_size=3)
    (f,) = lay.fields
    assert f.dtype == np.dtype(dtype)
    assert f.shape == ()
    assert f.row_bytes == np.dtype(dtype).itemsize
    assert f.path == "sample"
    assert not lay.object_paths


@pytest.mark.parametrize("dt", [">i4", ">f8", "<i4" if np.little_endian else ">i4", ">c8", ">u2"])
def test_byte_swapped_first_sample_gives_native_dtype(dt):
    lay = BatchLayout(np.zeros((2, 3), dtype=dt), batch_size=2)
    (f,) = lay.fields
    assert f.dtype.isnative
    assert f.dtype == np.dtype(dt).newbyteorder("=")


def test_paths_of_nested_structure():
    lay = BatchLayout(nested_sample(0), batch_size=5)
    assert [f.path for f in lay.fields] == [
        "sample['a'][0]",
        "sample['a'][1]",
        "sample['a'][2]",
        "sample['a'][3]",
        "sample['a'][4]",
        "sample['b'][0]['c']",
        "sample['b'][0]['d']",
        "sample['p'].x",
    ]
    assert lay.object_paths == ["sample['b'][1]", "sample['p'].y", "sample['o']"]
    assert lay.n_objects == 3
    assert [str(f.dtype) for f in lay.fields] == [
        "int64", "float64", "bool", "float32", "int16", "uint8", "int32", "float64"]
    assert [f.shape for f in lay.fields] == [(), (), (), (), (3,), (2, 2), (), (2,)]
    _regions_disjoint(lay)
    assert lay.var_bytes > 0
    assert all(p in lay.describe() for p in lay.object_paths)
    assert "sample['a'][4]" in repr(lay)


@pytest.mark.parametrize("batch_size", [1, 2, 3, 7, 64, 1000])
def test_regions_are_aligned_and_disjoint(batch_size):
    sample = (np.zeros((3, 5), np.float32), np.zeros(7, np.int8), 1, np.zeros((0, 4)), "s")
    lay = BatchLayout(sample, batch_size)
    assert lay.index_offset == 0 and lay.seed_offset == 8 * batch_size
    _regions_disjoint(lay)
    assert [f.row_bytes for f in lay.fields] == [60, 7, 8, 0]


def test_no_objects_means_no_variable_area():
    lay = BatchLayout({"x": np.zeros(3), "y": [1, 2.0]}, batch_size=4)
    assert lay.var_bytes == 0
    assert lay.n_objects == 0
    _regions_disjoint(lay)


@pytest.mark.parametrize("leaf", ["text", b"bytes", None, Thing(1), {1, 2}, np.array(["a"], dtype=object),
                                  2**70])
def test_non_array_leaves_are_objects(leaf):
    lay = BatchLayout((1, leaf), batch_size=2)
    assert lay.object_paths == ["sample[1]"]
    assert len(lay.fields) == 1


def test_bad_batch_size():
    with pytest.raises(ValueError):
        BatchLayout(1, batch_size=0)


def test_too_deep_is_a_layout_error():
    x: object = 1
    for _ in range(80):
        x = [x]
    with pytest.raises(fastload.LayoutMismatchError, match="deeper"):
        BatchLayout(x, batch_size=1)


def test_unpack_rebuilds_structure_and_stacks():
    samples = [nested_sample(i) for i in range(3)]
    lay = BatchLayout(samples[0], batch_size=4)
    buf = np.zeros(lay.slot_bytes, np.uint8)
    # Write the rows by hand through the field table (independent of the compiled packer).
    objs: list = []
    for r, s in enumerate(samples):
        leaves = [s["a"][0], s["a"][1], s["a"][2], s["a"][3], s["a"][4],
                  s["b"][0]["c"], s["b"][0]["d"], s["p"].x]
        for f, leaf in zip(lay.fields, leaves):
            a = np.ascontiguousarray(np.asarray(leaf, dtype=f.dtype))
            buf[f.offset + r * f.row_bytes: f.offset + (r + 1) * f.row_bytes] = a.view(np.uint8).ravel()
        objs += [s["b"][1], s["p"].y, s["o"]]
    out = lay.unpack(buf, 3, objs)
    assert set(out) == {"a", "b", "p", "o"}
    assert isinstance(out["a"], tuple) and isinstance(out["b"], list)
    assert type(out["p"]) is Point
    np.testing.assert_array_equal(out["a"][0], [0, 1, 2])
    assert out["a"][0].dtype == np.int64
    np.testing.assert_array_equal(out["a"][4], np.stack([s["a"][4] for s in samples]))
    np.testing.assert_array_equal(out["b"][0]["c"], np.stack([s["b"][0]["c"] for s in samples]))
    assert out["b"][1] == ["s0", "s1", "s2"]
    assert out["p"].y == [None, None, None]
    assert out["o"] == [Thing(0), Thing(1), Thing(2)]
    # Views into the buffer, not copies.
    assert out["a"][4].base is buf or np.shares_memory(out["a"][4], buf)


def test_layout_pickles():
    lay = BatchLayout(nested_sample(1), batch_size=3)
    lay2 = pickle.loads(pickle.dumps(lay))
    assert lay2.fields == lay.fields
    assert lay2.slot_bytes == lay.slot_bytes
    assert lay2.tree == lay.tree


def test_namedtuple_type_is_kept():
    NT = collections.namedtuple("NT", "u v")
    lay = BatchLayout(NT(np.zeros(2), 1), batch_size=2)
    buf = np.zeros(lay.slot_bytes, np.uint8)
    out = lay.unpack(buf, 2, None)
    assert type(out) is NT and out.u.shape == (2, 2) and out.v.shape == (2,)
