"""Packer (samples -> slot rows) and SlotLease (the owner of zero-copy batch arrays)."""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

try:  # Hypothesis imports this lazily to print a patch when a test fails; under
    # filterwarnings=error an unrelated DeprecationWarning from that import (libcst ->
    # mypy_extensions) would turn a plain test failure into an INTERNALERROR.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import hypothesis.extra._patching  # noqa: F401
except Exception:  # pragma: no cover - optional dependency of Hypothesis
    pass

import fastload
from fastload._pack import Packer, SlotLease
from fastload.layout import BatchLayout

from helpers.datasets import layouts_sample, nested_sample

GUARD = 0xA5


def make_packer(sample, batch_size, nslots=1, guard=0):
    """A packer over a fresh uint8 buffer with ``guard`` sentinel bytes before and after."""
    lay = BatchLayout(sample, batch_size)
    buf = np.full(guard + nslots * lay.slot_bytes + guard, GUARD, np.uint8)
    p = Packer(buf, guard, lay.slot_bytes, nslots, batch_size, lay.tree, lay.packer_fields)
    return lay, buf, p


def leaves(x):
    """Flatten a sample in tree order (tuples/lists/dicts), like the layout does."""
    if isinstance(x, (tuple, list)):
        return [v for c in x for v in leaves(c)]
    if isinstance(x, dict):
        return [v for k in x for v in leaves(x[k])]
    return [x]


def native(a):
    a = np.asarray(a)
    return a.astype(a.dtype.newbyteorder("=")) if not a.dtype.isnative else a


def assert_batch_equals(out, samples):
    """Every array leaf of ``out`` is bit-for-bit np.stack of the samples' leaves, native dtype."""
    got = leaves(out)
    want = [native(np.stack([np.asarray(l) for l in col])) for col in zip(*map(leaves, samples))]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray)
        assert g.dtype.isnative
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes()


# -- property test --------------------------------------------------------------------------------
DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64, np.complex64]
LAYOUTS = ["c", "fortran", "reversed", "strided", "swapped", "scalar"]

leaf_spec = st.tuples(
    st.sampled_from(DTYPES),
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
)


def _schema(depth):
    if depth == 0:
        return leaf_spec
    kids = _schema(depth - 1)
    return st.one_of(
        leaf_spec,
        st.tuples(st.just("tuple"), st.lists(kids, min_size=0, max_size=3)),
        st.tuples(st.just("list"), st.lists(kids, min_size=1, max_size=3)),
        st.tuples(st.just("dict"), st.dictionaries(st.sampled_from("abcdef"), kids, min_size=1, max_size=3)),
    )


@st.composite
def leaf_value(draw, spec):
    dtype, shape = spec
    dtype = np.dtype(dtype)
    a = draw(hnp.arrays(dtype, shape))
    how = draw(st.sampled_from(LAYOUTS))
    if how == "fortran" and a.ndim:  # (asfortranarray would make a 0-d array 1-d)
        return np.asfortranarray(a)
    if how == "reversed" and a.ndim:  # a negative-stride view holding the same values
        return a[::-1].copy()[::-1]
    if how == "strided" and a.ndim:  # every other element of a larger buffer
        big = np.empty((a.shape[0] * 2, *a.shape[1:]), dtype)
        big[::2] = a
        return big[::2]
    if how == "swapped" and dtype.itemsize > 1:
        return a.astype(dtype.newbyteorder())
    if how == "scalar" and a.ndim == 0:
        return a[()]  # a NumPy scalar (np.generic)
    return a


@st.composite
def sample_from(draw, schema):
    if isinstance(schema[0], str):
        kind, kids = schema
        if kind == "dict":
            return {k: draw(sample_from(v)) for k, v in kids.items()}
        vals = [draw(sample_from(k)) for k in kids]
        return tuple(vals) if kind == "tuple" else vals
    return draw(leaf_value(schema))


@st.composite
def batches(draw):
    schema = draw(_schema(3))
    batch_size = draw(st.integers(1, 5))
    count = draw(st.integers(1, batch_size))
    return [draw(sample_from(schema)) for _ in range(count)], batch_size


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches(), st.integers(0, 2))
def test_pack_unpack_equals_np_stack(batch, slot):
    samples, batch_size = batch
    nslots = 3
    lay, buf, p = make_packer(samples[0], batch_size, nslots=nslots, guard=64)
    objs: list = []
    for row, s in enumerate(samples):
        p.pack(slot, row, s, objs)
    p.close()
    assert objs == []
    start = 64 + slot * lay.slot_bytes
    out = lay.unpack(buf[start:start + lay.slot_bytes], len(samples), objs)
    assert_batch_equals(out, samples)
    # Nothing outside the slot was touched (other slots and the guard bytes).
    assert (buf[:start] == GUARD).all()
    assert (buf[start + lay.slot_bytes:] == GUARD).all()


# -- explicit layouts ------------------------------------------------------------------------------
def test_awkward_memory_layouts_pack_correctly():
    samples = [layouts_sample(i) for i in range(4)]
    for s in samples:
        assert not s["fortran"].flags.c_contiguous
        assert s["neg"].strides[0] < 0
        assert not s["strided"].flags.c_contiguous
        assert not s["swapped"].dtype.isnative
    lay, buf, p = make_packer(samples[0], 4)
    for row, s in enumerate(samples):
        p.pack(0, row, s, [])
    out = lay.unpack(buf, 4, [])
    assert_batch_equals(out, samples)
    np.testing.assert_array_equal(out["neg"][1], np.arange(10)[::-1] + 1)
    assert out["swapped"].dtype == np.dtype("=i4")
    assert out["zero_d"].dtype == np.dtype("=i8") and out["zero_d"].tolist() == [0, 1, 2, 3]
    assert out["empty"].shape == (4, 0, 3)


@pytest.mark.parametrize(
    "value",
    [
        np.arange(12, dtype=np.int64).reshape(3, 4).T,  # Fortran-order view
        np.arange(12, dtype=np.int64)[::-1].reshape(4, 3),  # negative strides
        np.arange(24, dtype=np.int64).reshape(4, 6)[:, ::2],  # non-contiguous
        np.arange(12, dtype=np.int64).reshape(4, 3).astype(">i8"),  # byte-swapped
        np.asfortranarray(np.arange(12, dtype=np.int64).reshape(4, 3).astype(">i8")),
        np.lib.stride_tricks.as_strided(np.arange(3, dtype=np.int64), (4, 3), (0, 8)),  # broadcast
    ],
    ids=["fortran", "negative-stride", "strided", "swapped", "swapped-fortran", "zero-stride"],
)
def test_non_contiguous_leaf_matches_stack(value):
    first = np.zeros((4, 3), np.int64)
    lay, buf, p = make_packer(first, 2, guard=64)
    p.pack(0, 0, first, [])
    p.pack(0, 1, value, [])
    out = lay.unpack(buf[64:64 + lay.slot_bytes], 2, [])
    np.testing.assert_array_equal(out[1], value)
    assert out.dtype == np.dtype(np.int64)
    assert (buf[:64] == GUARD).all() and (buf[64 + lay.slot_bytes:] == GUARD).all()


def test_objects_are_collected_in_tree_order():
    lay, buf, p = make_packer(nested_sample(0), 2)
    objs: list = []
    p.pack(0, 0, nested_sample(0), objs)
    p.pack(0, 1, nested_sample(1), objs)
    out = lay.unpack(buf, 2, objs)
    assert out["b"][1] == ["s0", "s1"]
    assert out["p"].y == [None, None]
    assert [o.v for o in out["o"]] == [0, 1]
    np.testing.assert_array_equal(out["a"][4], [[0, 1, 2], [1, 2, 3]])
    np.testing.assert_array_equal(out["p"].x, [[0, 0], [1, -1]])


# -- hostile inputs: the sample ---------------------------------------------------------------------
BASE = {"img": np.zeros((2, 3), np.float32), "pair": (1, np.float32(2)), "lst": [1.5, True]}


def _mutated(**changes):
    s = {"img": np.zeros((2, 3), np.float32), "pair": (1, np.float32(2)), "lst": [1.5, True]}
    s.update(changes)
    return s


@pytest.mark.parametrize(
    "sample, path, word",
    [
        (_mutated(img=np.zeros((3, 2), np.float32)), "sample['img']", "shape"),
        (_mutated(img=np.zeros((2, 3, 1), np.float32)), "sample['img']", "shape"),
        (_mutated(img=np.zeros(6, np.float32)), "sample['img']", "shape"),
        (_mutated(img=np.zeros((2, 3), np.float64)), "sample['img']", "float64"),
        (_mutated(img=np.zeros((2, 3), np.int32)), "sample['img']", "int32"),
        (_mutated(img=np.zeros((2, 3), object)), "sample['img']", "dtype"),
        (_mutated(img="a string"), "sample['img']", "str"),
        (_mutated(img=None), "sample['img']", "NoneType"),
        (_mutated(img=b"bytes"), "sample['img']", "bytes"),
        (_mutated(pair=(1, np.float32(2), 3)), "sample['pair']", "length 3"),
        (_mutated(pair=(1,)), "sample['pair']", "length 1"),
        (_mutated(pair=[1, np.float32(2)]), "sample['pair']", "tuple"),
        (_mutated(lst=(1.5, True)), "sample['lst']", "list"),
        (_mutated(pair=(2.5, np.float32(2))), "sample['pair'][0]", "float"),
        (_mutated(pair=(2**64, np.float32(2))), "sample['pair'][0]", "int64"),
        (_mutated(pair=(1, np.float64(2))), "sample['pair'][1]", "float64"),
        (_mutated(lst=[1, True]), "sample['lst'][0]", "int"),
        (_mutated(lst=[1.5, 1]), "sample['lst'][1]", "int"),
        ({"img": np.zeros((2, 3), np.float32), "lst": [1.5, True]}, "sample", "pair"),
        ({"img": np.zeros((2, 3), np.float32), "pair": (1, np.float32(2)), "lst": [1.5, True],
          "extra": 1}, "sample", "extra"),
        ({"img": np.zeros((2, 3), np.float32), "pair": (1, np.float32(2)), "LST": [1.5, True]},
         "sample", "lst"),
        ([np.zeros((2, 3), np.float32)], "sample", "dict"),
    ],
)
def test_mismatched_sample_raises_naming_the_path(sample, path, word):
    lay, buf, p = make_packer(BASE, 2, guard=64)
    before = buf.copy()
    with pytest.raises(fastload.LayoutMismatchError) as info:
        p.pack(0, 1, sample, [])
    msg = str(info.value)
    assert msg.startswith(path + ":") or f"{path}:" in msg, msg
    assert word in msg, msg
    # Row 1 may be partly written (the error is raised mid-sample) but nothing outside the slot.
    assert (buf[:64] == before[:64]).all() and (buf[64 + lay.slot_bytes:] == GUARD).all()


def test_dict_with_other_key_order_is_packed_by_key():
    lay, buf, p = make_packer({"a": 1, "b": np.float32(2)}, 2)
    p.pack(0, 0, {"a": 1, "b": np.float32(2)}, [])
    p.pack(0, 1, {"b": np.float32(20), "a": 10}, [])
    out = lay.unpack(buf, 2, [])
    assert list(out) == ["a", "b"]
    assert out["a"].tolist() == [1, 10] and out["b"].tolist() == [2.0, 20.0]


def test_huge_claimed_shape_is_rejected_without_reading():
    """An array whose shape claims terabytes (zero strides) is rejected by shape, not copied."""
    lay, buf, p = make_packer(np.zeros(4, np.int64), 1, guard=64)
    huge = np.lib.stride_tricks.as_strided(np.zeros(1, np.int64), shape=(2**40,), strides=(0,))
    with pytest.raises(fastload.LayoutMismatchError, match="shape"):
        p.pack(0, 0, huge, [])
    assert (buf[:64] == GUARD).all() and (buf[64 + lay.slot_bytes:] == GUARD).all()


# -- hostile inputs: the packer's own parameters ---------------------------------------------------
def _tree_one_leaf():
    return BatchLayout(np.zeros(4, np.int64), 1).tree


@pytest.mark.parametrize(
    "data_offset, slot_bytes, nslots, batch_size, fields",
    [
        (0, 64, 3, 1, []),  # 3 slots of 64 bytes do not fit a 128-byte region
        (129, 0, 1, 1, []),  # data offset past the end
        (-1, 64, 1, 1, []),
        (0, -64, 1, 1, []),
        (0, 64, -1, 1, []),
        (0, 64, 1, 0, []),  # batch_size 0
        (0, 64, 2, 1, [(32, 64, np.dtype(np.int64), (8,))]),  # field overflows its slot
        (0, 64, 2, 2, [(0, 40, np.dtype(np.int64), (5,))]),  # two rows overflow the slot
        (0, 64, 2, 1, [(-8, 8, np.dtype(np.int64), ())]),
        (0, 64, 2, 1, [(0, 8, np.dtype(object), ())]),
        (0, 2**62, 2**10, 1, []),  # claims far more than the buffer holds
    ],
)
def test_packer_rejects_impossible_geometry(data_offset, slot_bytes, nslots, batch_size, fields):
    buf = np.zeros(128, np.uint8)
    with pytest.raises(ValueError):
        Packer(buf, data_offset, slot_bytes, nslots, batch_size, _tree_one_leaf(), fields)


def _inconsistent_packer(buf):
    """A field whose row_bytes (8) disagrees with dtype*shape (int64 x 4 = 32 bytes), placed at
    the very end of slot 0 so that writing 32 bytes would spill into slot 1.

    Either the packer refuses such a field table, or it must refuse the copy: "Nothing is ever
    written outside the slot" (fastload/_pack.pyx module docstring)."""
    return Packer(buf, 0, 64, 2, 1, _tree_one_leaf(), [(56, 8, np.dtype(np.int64), (4,))])


@pytest.mark.parametrize(
    "value",
    [np.arange(4, dtype=np.int64), np.arange(8, dtype=np.int64)[::2],
     np.arange(4, dtype=np.int64).astype(">i8")],
    ids=["contiguous", "strided", "swapped"],
)
def test_inconsistent_field_never_writes_outside_its_slot(value):
    buf = np.full(128, GUARD, np.uint8)
    try:
        p = _inconsistent_packer(buf)
    except ValueError:
        return  # refusing the field table is a correct answer
    with pytest.raises((ValueError, fastload.SampleTooLargeError)):
        p.pack(0, 0, value, [])
    assert (buf[64:] == GUARD).all(), f"slot 1 was overwritten: {buf[64:96].tolist()}"


def test_pack_bounds_and_close():
    lay, buf, p = make_packer(1, 2, nslots=2)
    with pytest.raises(IndexError):
        p.pack(2, 0, 1, [])
    with pytest.raises(IndexError):
        p.pack(-1, 0, 1, [])
    with pytest.raises(IndexError):
        p.pack(0, 2, 1, [])
    with pytest.raises(IndexError):
        p.pack(0, -1, 1, [])
    p.pack(1, 1, 7, [])
    p.close()
    p.close()  # idempotent
    with pytest.raises(ValueError):
        p.pack(0, 0, 1, [])
    assert lay.unpack(buf[lay.slot_bytes:], 2, [])[1] == 7


def test_packer_needs_a_writable_buffer():
    lay = BatchLayout(1, 1)
    with pytest.raises((BufferError, TypeError)):
        Packer(bytes(lay.slot_bytes), 0, lay.slot_bytes, 1, 1, lay.tree, lay.packer_fields)


def test_packer_keeps_region_exported_until_closed():
    lay = BatchLayout(1, 1)
    mm = mmap.mmap(-1, lay.slot_bytes)
    p = Packer(mm, 0, lay.slot_bytes, 1, 1, lay.tree, lay.packer_fields)
    with pytest.raises(BufferError):
        mm.close()
    p.close()
    mm.close()


# -- SlotLease ------------------------------------------------------------------------------------
class Recorder:
    def __init__(self):
        self.released: list[int] = []

    def release(self, slot):
        self.released.append(slot)


def test_lease_exports_its_range_and_returns_the_slot_when_last_array_dies():
    region = np.arange(256, dtype=np.uint8)
    rec = Recorder()
    lease = SlotLease(region, 64, 32, 5, rec)
    assert lease.slot == 5 and len(lease) == 32
    a = np.frombuffer(lease, np.uint8)
    b = np.ndarray((4, 4), np.uint8, buffer=lease, offset=16)
    assert a.tolist() == list(range(64, 96))
    assert b.base is lease
    assert b.ravel().tolist() == list(range(80, 96))
    del lease
    gc.collect()
    assert rec.released == []  # arrays still alive
    del a
    gc.collect()
    assert rec.released == []
    c = b[1:]
    del b
    gc.collect()
    assert rec.released == []
    del c
    gc.collect()
    assert rec.released == [5]


def test_lease_is_a_writable_view_of_the_region():
    region = np.zeros(128, np.uint8)
    lease = SlotLease(region, 64, 64, 0, None)
    a = np.frombuffer(lease, np.uint8)
    assert a.flags.writeable
    a[:] = 7
    assert (region[64:] == 7).all() and (region[:64] == 0).all()


@pytest.mark.parametrize("offset, length", [(-1, 8), (0, -1), (129, 0), (100, 29), (0, 129)])
def test_lease_rejects_ranges_outside_the_region(offset, length):
    with pytest.raises(ValueError):
        SlotLease(np.zeros(128, np.uint8), offset, length, 0, None)


def test_lease_keeps_region_mapped():
    mm = mmap.mmap(-1, 4096)
    lease = SlotLease(mm, 0, 4096, 0, None)
    with pytest.raises(BufferError):
        mm.close()
    del lease
    gc.collect()
    mm.close()


def test_lease_release_errors_are_swallowed():
    class Boom:
        def release(self, slot):
            raise RuntimeError("boom")

    lease = SlotLease(np.zeros(64, np.uint8), 0, 64, 1, Boom())
    del lease  # must not raise (nor print an unraisable-exception warning: filterwarnings=error)
    gc.collect()
