"""stack=False (NOTE [unstacked batches] in fastload/_ragged.py): batches as lists of samples of
any structure, their arrays still carried through the slot."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from helpers import MP_TIMEOUT, region_range
from helpers.ragged import Big, Listed
from helpers.ragged import assert_same as same

Point = collections.namedtuple("Point", ["x", "y"])


_leaves = st.one_of(
    st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.booleans(), st.none(),
    st.text(max_size=5), st.binary(max_size=5),
    st.builds(lambda n, d, t: (np.arange(n * 3) % 7).astype(d).reshape(n, 3)[:, ::2] if t
              else (np.arange(n) % 5).astype(d),
              st.integers(0, 4), st.sampled_from(["int8", "float32", "complex128", ">u2", "?"]),
              st.booleans()),
    st.builds(lambda v: np.array(v), st.integers(-5, 5)),  # 0-d arrays
    st.builds(np.float32, st.floats(width=32, allow_nan=False)),  # NumPy scalars
)
_samples = st.recursive(
    _leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.tuples(kids, kids),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 9)), kids, max_size=3),
        st.builds(Point, kids, kids),
    ),
    max_leaves=8,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_samples, min_size=1, max_size=7), st.integers(1, 4))
def test_any_samples_come_back_as_they_were(samples, batch_size):
    with fastload.Loader(Listed(samples), batch_size, num_workers=0, stack=False) as loader:
        got = [s for batch in loader for s in batch]
    same(got, samples)


@pytest.mark.timeout(MP_TIMEOUT)
def test_workers_carry_the_arrays_in_the_slot(start_method):
    samples = [{i: np.zeros(10) + i} if i % 3 == 0 else
               (np.arange(i, dtype=np.int16), f"t{i}", [i, {"k": np.ones((2, i))}]) if i % 3 == 1
               else collections.OrderedDict(a=np.array(i)) for i in range(11)]
    with fastload.Loader(Listed(samples), 4, num_workers=2, start_method=start_method,
                         stack=False) as loader:
        batches = list(loader)
        assert [len(b) for b in batches] == [4, 4, 3]
        same([s for b in batches for s in b], samples)
        first = batches[1][0]  # sample 4: its arrays are views of the shared slot
        lo, hi = region_range(loader)
        assert lo <= first[0].ctypes.data < hi and lo <= first[2][1]["k"].ctypes.data < hi
        assert loader.stats()["spilled_batches"] == 0
        del batches, first


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sample_larger_than_its_slot_is_delivered(num_workers):
    ds = Big(mib=32)
    with fastload.Loader(ds, 2, num_workers=num_workers, stack=False) as loader:
        batches = list(loader)
        if num_workers:
            assert loader.stats()["spilled_batches"] == 1
    assert [len(a) for b in batches for a in b] == [10, 32 << 20, 12]
    assert np.array_equal(batches[0][1][-5:], ds[1][-5:])


def test_arrays_are_copies_not_the_datasets_own():
    data = [np.zeros(3), np.ones(2)]
    with fastload.Loader(Listed(data), 2, num_workers=0, stack=False) as loader:
        (batch,) = list(loader)
    batch[0][:] = 7
    assert data[0].tolist() == [0, 0, 0]  # in-process too: the user's arrays are not lent out


def test_stack_false_refuses_ragged_and_a_stacked_getitems():
    with pytest.raises(ValueError, match="ragged= does not apply with stack=False"):
        fastload.Loader(Listed([np.zeros(2)]), 1, num_workers=0, stack=False, ragged="pad")
    with pytest.raises(TypeError, match="stack must be True or False"):
        fastload.Loader(Listed([np.zeros(2)]), 1, num_workers=0, stack="no")


class _GetItems(Listed):
    def __getitems__(self, indices):
        return [self.samples[i] for i in indices]


@pytest.mark.timeout(MP_TIMEOUT)
def test_getitems_and_resume_with_stack_false():
    samples = [{"i": i, "x": np.arange(i)} for i in range(20)]
    kw = dict(batch_size=3, shuffle=True, seed=11, stack=False)
    with fastload.Loader(_GetItems(samples), num_workers=2, **kw) as loader:
        full = [[s["i"] for s in b] for b in loader]
    with fastload.Loader(_GetItems(samples), num_workers=2, **kw) as loader:
        it = iter(loader)
        head = [[s["i"] for s in next(it)] for _ in range(2)]
        state = loader.state_dict()
    with fastload.Loader(_GetItems(samples), num_workers=0, **kw) as again:
        again.load_state_dict(state)
        rest = [b for b in again]
    assert head + [[s["i"] for s in b] for b in rest] == full
    for b in rest:
        for s in b:
            assert s["x"].tolist() == list(range(s["i"]))


@pytest.mark.timeout(MP_TIMEOUT)
def test_arrays_anywhere_in_a_sample_travel_in_the_slot():
    from helpers.ragged import Boxed

    shared = np.arange(5.0)
    samples = [collections.defaultdict(list, {"a": np.full(3, i)}) for i in range(2)]
    samples += [Boxed(np.arange(4) * 3), [shared, shared]]
    with fastload.Loader(Listed(samples), 4, num_workers=2, stack=False) as loader:
        (batch,) = list(loader)
        lo, hi = region_range(loader)
        assert type(batch[0]) is collections.defaultdict and batch[0].default_factory is list
        assert batch[0]["a"].tolist() == [0, 0, 0] and batch[2] == samples[2]
        assert lo <= batch[0]["a"].ctypes.data < hi and lo <= batch[2].a.ctypes.data < hi
        assert batch[3][0] is batch[3][1]  # one array twice: one copy, two references
        assert batch[3][0].tolist() == shared.tolist()
        del batch


def test_in_process_samples_need_not_be_picklable():
    # num_workers=0, stack=False: a sample nothing could pickle (a class defined here) comes
    # back as a copy, arrays included, as it would be through a worker
    class Local:
        def __init__(self, i):
            self.i = i
            self.a = np.full(3, i)

    class DS:
        def __init__(self):
            self.items = [Local(i) for i in range(5)]

        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"obj": self.items[i], "n": i}

    ds = DS()
    with fastload.Loader(ds, 2, stack=False, num_workers=0) as loader:
        batches = list(loader)
    samples = [s for b in batches for s in b]
    assert [(type(s["obj"]).__name__, s["obj"].i, s["obj"].a.tolist(), s["n"])
            for s in samples] == [("Local", i, [i] * 3, i) for i in range(5)]
    samples[0]["obj"].a[:] = 99  # a copy: the dataset's own object is not touched
    assert ds.items[0].a.tolist() == [0, 0, 0] and samples[0]["obj"] is not ds.items[0]
