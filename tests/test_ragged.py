"""Ragged leaves (NOTE [ragged leaves] in fastload/_ragged.py): list, pad and packed modes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from helpers import MP_TIMEOUT, region_range
from helpers.ragged import Big, Listed, Tokens, assert_same, reference

MODES = ["list", "pad", "packed"]


def _tokens(batch):
    return batch["tokens"]


def _expected(ds, indices, mode, key="tokens", **kw):
    return reference(mode, [ds[i][key] for i in indices], **kw)


# -- every mode against the NumPy reference ------------------------------------------------------
_DTYPES = ["int8", "uint16", "int32", "int64", "float32", "float64", "complex64", "bool", ">i4"]


@st.composite
def _ragged_samples(draw):
    dtype = np.dtype(draw(st.sampled_from(_DTYPES)))
    ndim = draw(st.integers(1, 3))
    mode = draw(st.sampled_from(MODES))
    trailing = tuple(draw(st.lists(st.integers(0, 3), min_size=ndim - 1, max_size=ndim - 1)))
    n = draw(st.integers(1, 9))
    samples = []
    for i in range(n):
        if mode == "packed":
            shape = (draw(st.integers(0, 5)), *trailing)  # packed: only axis 0 may vary
        else:
            shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
        a = (np.arange(int(np.prod(shape)) * 2) % 97 + i).astype(dtype)
        strided = draw(st.booleans())
        a = a[::2].reshape(shape) if strided else a[: int(np.prod(shape))].reshape(shape)
        if draw(st.booleans()) and ndim >= 2 and mode != "packed":
            a = a.T  # non-contiguous; its shape is the transposed one
        samples.append(a)
    return mode, samples, draw(st.integers(1, 4)), draw(st.sampled_from([0, 1, 7])), \
        draw(st.sampled_from([None, 1, 4]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ragged_samples())
def test_every_mode_matches_the_numpy_reference(case):
    mode, samples, batch_size, pad_value, mult = case
    ds = Listed([(a, i) for i, a in enumerate(samples)])
    with fastload.Loader(ds, batch_size, num_workers=0, ragged={"sample[0]": mode},
                         pad_value=pad_value, pad_to_multiple=mult) as loader:
        got = list(loader)
    for b, batch in enumerate(got):
        rows = samples[b * batch_size:(b + 1) * batch_size]
        want = reference(mode, [a.astype(a.dtype.newbyteorder("=")) for a in rows], pad_value,
                         mult or 1)
        assert_same(batch[0], want)
        assert batch[1].tolist() == list(range(b * batch_size, b * batch_size + len(rows)))


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("mode", MODES)
def test_workers_deliver_what_the_reference_says(mode, start_method):
    ds = Tokens()
    with fastload.Loader(ds, 5, num_workers=2, start_method=start_method,
                         ragged={"tokens": mode, "sample['boxes']": "list"}) as loader:
        for b, batch in enumerate(loader):
            idx = list(range(5 * b, min(5 * b + 5, len(ds))))
            assert_same(batch["tokens"], _expected(ds, idx, mode))
            assert_same(batch["boxes"], _expected(ds, idx, "list", key="boxes"))
            assert batch["label"].tolist() == idx
            assert batch["name"] == [f"s{i}" for i in idx]


def test_a_declared_leaf_keeps_its_form_when_shapes_agree():
    same = Listed([{"x": np.arange(3) + i} for i in range(4)])
    for mode, kind in (("pad", fastload.Padded), ("packed", fastload.Packed), ("list", list)):
        with fastload.Loader(same, 4, num_workers=0, ragged=mode) as loader:
            (batch,) = list(loader)
        assert type(batch["x"]) is kind


def test_global_mode_and_lengths_shapes():
    ds = Listed([{"seq": np.zeros(i + 1, np.float32), "img": np.zeros((3, i + 1, 2), np.uint8),
                  "scalar": np.float32(i), "n": i} for i in range(4)])
    with fastload.Loader(ds, 4, num_workers=0, ragged="pad", pad_to_multiple=8) as loader:
        (batch,) = list(loader)
    assert batch["seq"].values.shape == (4, 8) and batch["seq"].lengths.tolist() == [1, 2, 3, 4]
    img = batch["img"]
    assert img.values.shape == (4, 3, 8, 2)  # only the varying extent is rounded up
    assert img.lengths.shape == (4, 3) and img.lengths[:, 1].tolist() == [1, 2, 3, 4]
    assert batch["scalar"].tolist() == [0, 1, 2, 3] and batch["n"].tolist() == [0, 1, 2, 3]


def test_pad_to_multiple_rounds_a_1d_leaf_whose_rows_agree():
    ds = Listed([np.arange(25), np.arange(25), np.arange(7)])
    with fastload.Loader(ds, 2, num_workers=0, ragged="pad", pad_to_multiple=16) as loader:
        first, last = list(loader)  # rows of equal length, then a 1-row batch
    assert first.values.shape == (2, 32) and first.lengths.tolist() == [25, 25]
    assert last.values.shape == (1, 16) and last.lengths.tolist() == [7]
    assert (last.values[0, 7:] == 0).all()


@pytest.mark.timeout(MP_TIMEOUT)
def test_views_are_zero_copy_into_the_slot():
    ds = Tokens(n=12)
    with fastload.Loader(ds, 4, num_workers=2,
                         ragged={"tokens": "packed", "boxes": "list"}) as loader:
        batch = next(iter(loader))
        lo, hi = region_range(loader)
        inside = [batch["tokens"].values] + [b for b in batch["boxes"] if b.size]
        assert inside and all(lo <= a.ctypes.data < hi for a in inside)
        assert loader.stats()["spilled_batches"] == 0
        del batch, inside


# -- the slot's budget ----------------------------------------------------------------------------
@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_64_mib_ragged_sample_is_delivered_whole(num_workers):
    ds = Big(mib=64)
    with fastload.Loader(ds, 2, num_workers=num_workers, ragged="list") as loader:
        batches = list(loader)
        big = batches[0][1]
        assert big.shape == (64 << 20,) and big.dtype == np.int8
        assert np.array_equal(big[:1000], ((np.arange(1000) + 1) % 128).astype(np.int8))
        assert int(big[-1]) == ((64 << 20) - 1 + 1) % 128
        assert [a.tolist() for a in batches[1]] == [ds[2].tolist()]
        if num_workers:
            assert loader.stats()["spilled_batches"] == 1  # the big batch came over the pipe


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("how", ["copy", "held"])
def test_copied_batches_keep_their_ragged_values(how):
    ds = Tokens(n=20)
    kw = {"copy": True} if how == "copy" else {"max_held": 0}
    with fastload.Loader(ds, 4, num_workers=2, ragged={"tokens": "pad", "boxes": "pad"},
                         **kw) as loader:
        got = list(loader)  # all held at once: copies
    for b, batch in enumerate(got):
        assert_same(batch["tokens"], _expected(ds, range(4 * b, 4 * b + 4), "pad"))
        assert_same(batch["boxes"], _expected(ds, range(4 * b, 4 * b + 4), "pad", key="boxes"))


@pytest.mark.timeout(MP_TIMEOUT)
def test_resume_mid_epoch_gives_the_uninterrupted_batches():
    ds = Tokens(n=30)
    kw = dict(batch_size=4, shuffle=True, seed=5, ragged={"tokens": "packed", "boxes": "list"})
    with fastload.Loader(ds, num_workers=2, **kw) as loader:
        full = [b["label"].tolist() for b in loader]
    with fastload.Loader(ds, num_workers=2, **kw) as loader:
        it = iter(loader)
        head = [next(it)["label"].tolist() for _ in range(3)]
        state = json.loads(json.dumps(loader.state_dict()))
    with fastload.Loader(ds, num_workers=1, **kw) as again:
        again.load_state_dict(state)
        rest = [(b["label"].tolist(), b["tokens"]) for b in again]
    assert head + [r[0] for r in rest] == full
    for labels, tokens in rest:
        assert_same(tokens, _expected(ds, labels, "packed"))


# -- clear errors ---------------------------------------------------------------------------------
@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_undeclared_varying_leaf_says_how_to_declare_it(num_workers):
    with fastload.Loader(Tokens(n=12), 4, num_workers=num_workers) as loader:
        with pytest.raises(fastload.LayoutMismatchError) as info:
            list(loader)
    msg = str(info.value)
    assert msg.startswith("sample['tokens']: expected shape (")
    assert "got (" in msg and "sample index" in msg
    assert "ragged={\"sample['tokens']\": 'pad'}" in msg


@pytest.mark.parametrize("sample, ragged, match", [
    (lambda i: {"x": np.zeros(i + 1, np.float32 if i < 2 else np.float64)}, "list",
     r"sample\['x'\]: declared ragged \('list'\).*the shape may vary, not the dtype.*float64"),
    (lambda i: {"x": np.zeros((i + 1,) * (1 if i < 2 else 2))}, "pad",
     r"expected float64 with 1 dimensions.*shape \(3, 3\)"),
    (lambda i: {"x": np.zeros((2, i + 1))}, "packed",
     r"declared 'packed'.*other axes must agree.*declare it 'pad' or 'list'"),
    (lambda i: {"x": "text" if i == 2 else np.zeros(i + 1)}, "list",
     r"expected an array of float64, got str"),
])
def test_a_leaf_that_breaks_its_declaration_names_itself(sample, ragged, match):
    ds = Listed([sample(i) for i in range(4)])
    with fastload.Loader(ds, 4, num_workers=0, ragged=ragged) as loader:
        with pytest.raises(fastload.LayoutMismatchError, match=match) as info:
            list(loader)
    assert "sample index" in str(info.value)


@pytest.mark.parametrize("kw, exc, match", [
    ({"ragged": "padded"}, ValueError, r"ragged must be one of \('list', 'pad', 'packed'\)"),
    ({"ragged": {"x": "stack"}}, ValueError, r"ragged\['x'\] must be one of"),
    ({"ragged": {0: "pad"}}, TypeError, r"leaf names are strings"),
    ({"ragged": ["x"]}, TypeError, r"ragged must be None, one of"),
    ({"ragged": "pad", "pad_to_multiple": 0}, ValueError, r"pad_to_multiple must be None or"),
    ({"ragged": "pad", "pad_value": "zero"}, TypeError, r"pad_value must be a number"),
])
def test_bad_arguments_are_refused_up_front(kw, exc, match):
    with pytest.raises(exc, match=match):
        fastload.Loader(Listed([{"x": np.zeros(2)}]), 1, num_workers=0, **kw)


def test_a_misspelt_or_scalar_leaf_name_is_refused_at_the_first_sample():
    ds = Listed([{"tokens": np.zeros(3), "n": 1}])
    with fastload.Loader(ds, 1, num_workers=0, ragged={"tokns": "pad"}) as loader:
        with pytest.raises(fastload.LayoutMismatchError,
                           match=r"ragged names \[\"sample\['tokns'\]\"\].*sample\['tokens'\]"):
            list(loader)
    with fastload.Loader(ds, 1, num_workers=0, ragged={"n": "pad"}) as loader:
        with pytest.raises(fastload.LayoutMismatchError, match=r"sample\['n'\] is a 0-d value"):
            list(loader)


def test_naming_a_leaf_of_nested_lists_lists_a_few_leaves_and_counts_the_rest():
    img = [[[x + c for c in range(3)] for x in range(32)] for _ in range(32)]  # 3,072 leaves
    ds = Listed([{"img": img, "label": 0}])
    with fastload.Loader(ds, 1, num_workers=0, ragged={"img": "pad"}) as loader:
        with pytest.raises(fastload.LayoutMismatchError) as info:
            list(loader)
    text = str(info.value)
    assert len(text) < 4000, len(text)  # listed all 3,073 leaves: 169,237 characters
    assert "\"sample['img'][0][2][1]\", ...] (... and 3,065 more leaves)" in text
    assert "sample['img'] is a list or tuple of 3,072 leaves, not an array" in text


def test_a_key_that_starts_with_sample_is_a_key_not_a_path():
    ds = Listed([{"samples": np.arange(i + 1), "sample_rate": i} for i in range(3)])
    with fastload.Loader(ds, 3, num_workers=0, ragged={"samples": "packed"}) as loader:
        (batch,) = list(loader)
    assert batch["samples"].offsets.tolist() == [0, 1, 3, 6]
    assert batch["sample_rate"].tolist() == [0, 1, 2]


@pytest.mark.timeout(MP_TIMEOUT)
def test_without_memfd_an_oversized_batch_comes_in_a_temporary_file(monkeypatch, tmp_path):
    # macOS has no memfd_create: the batch goes in an unlinked temporary file, whose fd is sent
    # (never the pipe, which a worker would block on when the parent stops reading that batch)
    import tempfile

    monkeypatch.delattr(os, "memfd_create")  # inherited by the forked workers
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ds = Big(mib=4)
    with fastload.Loader(ds, 2, num_workers=2, start_method="fork", ragged="packed") as loader:
        batches = list(loader)
        assert loader.stats()["spilled_batches"] == 1
    assert list(tmp_path.iterdir()) == []  # unlinked at once: nothing to leak
    big = batches[0]
    assert big.offsets.tolist() == [0, 10, 10 + (4 << 20)]
    assert np.array_equal(big.values[10:20], ((np.arange(10) + 1) % 128).astype(np.int8))
    assert big.values.flags.writeable


def test_pad_value_must_be_a_value_of_the_leaf_dtype():
    ds = Listed([np.zeros(i + 1, np.uint8) for i in range(3)])
    with fastload.Loader(ds, 3, num_workers=0, ragged="pad", pad_value=-1) as loader:
        with pytest.raises(fastload.LayoutMismatchError,
                           match=r"pad_value=-1 is not a value of its dtype uint8"):
            list(loader)
    with fastload.Loader(ds, 3, num_workers=0, ragged="pad", pad_value=255) as loader:
        (batch,) = list(loader)
    assert batch.values.tolist() == [[0, 255, 255], [0, 0, 255], [0, 0, 0]]


def test_write_rows_checks_every_bound_before_writing():
    from fastload._pack import write_rows

    dest = np.zeros(16, np.uint8)
    a, b = np.arange(3, dtype=np.int16), np.arange(2, dtype=np.int16)
    assert write_rows(dest, 2, [a, b], 0, b"") == 10
    assert dest[2:12].view(np.int16).tolist() == [0, 1, 2, 0, 1]
    dest[:] = 0
    assert write_rows(dest, 0, [a, b], 8, np.array(-1, np.int16).tobytes()) == 16
    assert dest.view(np.int16).tolist() == [0, 1, 2, -1, 0, 1, -1, -1]
    dest[:] = 7
    with pytest.raises(ValueError, match="overflow a buffer of 16"):
        write_rows(dest, 8, [a, b], 0, b"")
    with pytest.raises(ValueError, match="do not fit a row of 4"):
        write_rows(dest, 0, [a], 4, b"\0\0")
    with pytest.raises(ValueError, match="not a multiple"):
        write_rows(dest, 0, [b], 5, b"\0\0")
    with pytest.raises((BufferError, ValueError)):
        write_rows(dest, 0, [np.arange(6, dtype=np.int16)[::2]], 0, b"")  # not contiguous
    with pytest.raises(ValueError, match="must be >= 0"):
        write_rows(dest, -1, [a], 0, b"")
    assert (dest == 7).all()  # nothing was written by a refused call
    with pytest.raises((BufferError, TypeError)):
        write_rows(b"read-only", 0, [a], 0, b"")


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_shape_mismatch_says_which_shapes_as_data(num_workers):
    ds = Listed([{"x": np.zeros(2)}, {"x": np.zeros(3)}])
    with fastload.Loader(ds, 2, num_workers=num_workers) as loader:
        with pytest.raises(fastload.LayoutMismatchError) as info:
            list(loader)
    assert info.value.shape_mismatch == ("sample['x']", (2,), (3,))  # what compat.torch reads
