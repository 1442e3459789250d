"""Inputs that used to give wrong data without an error: each now gives the right data or a
clear error (a defaultdict's missing keys, a tuple from __getitems__, a list of shards for
ArrayDataset, a copy-on-write memory map in spawned workers)."""

from __future__ import annotations

import numpy as np
import pytest

import fastload
from helpers import MP_TIMEOUT
from helpers.datasets import DefaultDicts, TupleGetitems


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_defaultdict_with_other_keys_is_an_error_not_a_made_up_value(num_workers):
    ds = DefaultDicts()
    with fastload.Loader(ds, 2, num_workers=num_workers) as loader:
        with pytest.raises(fastload.LayoutMismatchError,
                           match=r"missing \['b'\], unexpected \['c'\]") as info:
            list(loader)
    assert "sample index 1" in str(info.value)
    if num_workers == 0:  # the user's own dicts: not given the missing key
        assert all("b" not in d for d in ds.made[1:])


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stacked", [False, True], ids=["tuple-of-samples", "stacked-tuple"])
def test_a_tuple_from_getitems_is_read_as_what_it_is(stacked, num_workers):
    # batch 2, samples that are pairs: the tuple has the length of a sample and of a batch
    with fastload.Loader(TupleGetitems(stacked), 2, num_workers=num_workers) as loader:
        got = [(x.tolist(), y.tolist()) for x, y in loader]
    assert got == [([[2 * b, 2 * b], [2 * b + 1, 2 * b + 1]],
                    [[10 + 2 * b] * 2, [11 + 2 * b] * 2]) for b in range(3)]


def test_array_dataset_refuses_a_list_of_shards():
    shards = [np.zeros((5, 2)) for _ in range(3)]
    with pytest.raises(TypeError, match="array 0 is a list of 3 arrays.*np.concatenate"):
        fastload.ArrayDataset(shards, [np.zeros(5)] * 3)
    with pytest.raises(TypeError, match="array 1 is a tuple of 2 arrays"):
        fastload.ArrayDataset(np.zeros(4), (np.zeros(2), np.zeros(2)))
    assert len(fastload.ArrayDataset(np.zeros((3, 2)), [0, 1, 2])) == 3  # a list of labels


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_copy_on_write_memmap_delivers_its_changed_values(tmp_path, start_method):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(12.0))
    mm = np.load(path, mmap_mode="c")
    mm[3] = 99.0  # in memory only: the file still says 3.0
    with fastload.Loader(fastload.ArrayDataset(mm), 6, num_workers=2,
                         start_method=start_method) as loader:
        assert [b.tolist() for b in loader][0][3] == 99.0
    with fastload.Pool(1, start_method=start_method) as pool:
        with fastload.Loader(fastload.ArrayDataset(mm), 6, pool=pool) as loader:
            assert next(iter(loader)).tolist()[3] == 99.0
    assert np.load(path)[3] == 3.0


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_getitems_names_the_batch_and_the_sample(num_workers):
    from helpers.datasets import FailingGetitems

    with fastload.Loader(FailingGetitems(5), 4, num_workers=num_workers) as loader:
        with pytest.raises(KeyError, match=r"while loading __getitems__\(\[4, 5, 6, 7\]\)") as e:
            list(loader)
    assert e.value.fastload_index is None and e.value.fastload_batch == [4, 5, 6, 7]
    with fastload.Loader(FailingGetitems(6, mismatch=True), 4, num_workers=num_workers) as loader:
        with pytest.raises(fastload.LayoutMismatchError,
                           match=r"sample index 6 in __getitems__\(\[4, 5, 6, 7\]\)") as e:
            list(loader)
    assert e.value.fastload_index == 6


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_numpy_string_leaves(num_workers):
    from helpers.datasets import NumpyStrings

    with fastload.Loader(NumpyStrings(), 5, num_workers=num_workers) as loader:
        ((s, b, i),) = list(loader)
    assert s == ["x" * (k + 1) for k in range(5)] and all(type(v) is np.str_ for v in s)
    assert b == [b"y" * k for k in range(5)] and i.tolist() == list(range(5))
    # an ArrayDataset string column: the column's width, whatever the first row holds
    ds = fastload.ArrayDataset(np.array(["a", "bbbbbbbb", "cc"]), np.arange(3))
    with fastload.Loader(ds, 3, num_workers=num_workers) as loader:
        ((text, n),) = list(loader)
    assert text.dtype == np.dtype("<U8") and text.tolist() == ["a", "bbbbbbbb", "cc"]


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_strided_memmap_view_is_reopened_not_pickled(tmp_path, start_method):
    import pickle

    path = tmp_path / "x.npy"
    np.save(path, np.arange(40_000.0).reshape(1000, 40))
    view = np.load(path, mmap_mode="r")[:, 8:24]  # not contiguous
    ds = fastload.ArrayDataset(view)
    assert len(pickle.dumps(ds)) < 4096  # a file name and strides, not 128 kB of rows
    with fastload.Loader(ds, 100, num_workers=2, start_method=start_method) as loader:
        got = np.concatenate(list(loader))
    assert np.array_equal(got, np.asarray(view))


class _HFDataset:
    """Looks like a Hugging Face ``datasets.Dataset`` in its default (Python) format: images as
    nested lists, 32 x 32 x 3 = 3,072 leaves and a label (``datasets`` not needed)."""

    def __init__(self, format_type=None):
        self.format = {"type": format_type, "format_kwargs": {}, "columns": ["img", "label"]}

    def __len__(self):
        return 4

    def __getitem__(self, i):
        w = 32 if i < 2 else 31  # the third image is narrower: a list of another length
        return {"img": [[[(i + x + c) % 256 for c in range(3)] for x in range(w)]
                        for _ in range(32)], "label": i}


_HFDataset.__module__, _HFDataset.__name__ = "datasets.arrow_dataset", "Dataset"
_HFDataset.__qualname__ = "Dataset"


@pytest.mark.parametrize("kw", [{"ragged": {"img": "pad"}}, {}], ids=["ragged", "stacked"])
def test_a_python_format_hf_dataset_gives_a_short_error_that_says_set_format(kw):
    with fastload.Loader(_HFDataset(), 2, num_workers=0, **kw) as loader:
        with pytest.raises(fastload.LayoutMismatchError) as info:
            list(loader)
    text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert len(text) < 4000, len(text)  # was 169,237 characters with ragged=
    assert 'dataset.set_format("numpy")' in text
    if kw:
        assert "... and 3,065 more leaves" in text
        assert "sample['img'] is a list or tuple of 3,072 leaves" in text


def test_a_numpy_format_hf_dataset_is_not_told_to_set_it():
    with fastload.Loader(_HFDataset("numpy"), 2, num_workers=0) as loader:
        with pytest.raises(fastload.LayoutMismatchError) as info:
            list(loader)
    assert not getattr(info.value, "__notes__", [])
