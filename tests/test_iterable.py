"""Plain iterable datasets (NOTE [iterable datasets] in fastload/_iterable.py): worker replicas,
torch's round-robin order, short last batches, ends, errors, deaths, resume."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers.iterables import (
    Barrier, DiesOnce, PerWorker, RaisesAt, Ragged, Replica, Split, Whole, round_robin,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload


def _rows(loader):
    return [b.tolist() for b in loader]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lengths,bs,drop_last", [
    ([5, 5], 2, False),
    ([1, 7, 0], 3, False),
    ([1, 7, 0], 3, True),
    ([0, 0, 4], 4, False),
    ([9, 2, 4], 2, True),
])
def test_batches_come_round_robin_from_the_workers_as_torch_orders_them(lengths, bs, drop_last):
    want = round_robin(lengths, bs, drop_last)
    with fastload.Loader(PerWorker(lengths), bs, num_workers=len(lengths), drop_last=drop_last,
                         timeout=30) as ld:
        assert _rows(ld) == want
        assert _rows(ld) == want  # the next epoch iterates every replica again


@pytest.mark.timeout(120)
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=3),
       bs=st.integers(1, 4), drop_last=st.booleans(), prefetch=st.integers(1, 3))
def test_the_order_is_torch_order_for_any_lengths_and_prefetch(lengths, bs, drop_last,
                                                               prefetch):
    with fastload.Loader(PerWorker(lengths), bs, num_workers=len(lengths), prefetch=prefetch,
                         drop_last=drop_last, timeout=30) as ld:
        assert _rows(ld) == round_robin(lengths, bs, drop_last)


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers, 2 CPUs
def test_the_order_equals_torch_dataloader_over_the_same_iterable():
    torch = pytest.importorskip("torch")

    class T(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            k = info.id if info is not None else 0
            for j in range([3, 8, 1][k]):
                yield np.array([k, j], np.int64)

    theirs = [b.tolist() for b in torch.utils.data.DataLoader(T(), batch_size=3, num_workers=3)]
    with fastload.Loader(PerWorker([3, 8, 1]), 3, num_workers=3, timeout=30) as ld:
        assert _rows(ld) == theirs


@pytest.mark.timeout(60)
def test_num_workers_0_iterates_the_dataset_in_the_calling_process():
    with fastload.Loader(Split(7), 3, num_workers=0) as ld:
        assert _rows(ld) == [[0, 1, 2], [3, 4, 5], [6]]
        assert _rows(ld) == [[0, 1, 2], [3, 4, 5], [6]]
    with fastload.Loader(Split(7), 3, num_workers=0, drop_last=True) as ld:
        assert _rows(ld) == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 2])
def test_a_split_iterable_gives_every_sample_once(start_method, nw):
    with fastload.Loader(Split(23), 4, num_workers=nw, start_method=start_method,
                         timeout=30) as ld:
        got = [x for b in ld for x in b.tolist()]
    assert sorted(got) == list(range(23))


@pytest.mark.timeout(60)
def test_every_worker_iterates_its_own_replica_of_an_unsplit_iterable():
    with fastload.Loader(Whole(5), 5, num_workers=3, timeout=30) as ld:
        assert _rows(ld) == [[0, 1, 2, 3, 4]] * 3  # as torch: each worker yields all of it
        assert len(ld) == 1  # torch's len(): from len(dataset), not multiplied by the workers


@pytest.mark.timeout(60)
def test_get_worker_info_names_the_worker_and_its_replica(start_method):
    with fastload.Loader(Replica(), 1, num_workers=2, start_method=start_method,
                         timeout=30) as ld:
        first = list(ld)
        second = list(ld)
    for k, batch in enumerate(first):
        assert batch["id"].tolist() == [k] and batch["num_workers"].tolist() == [2]
        assert batch["same"].tolist() == [True]
        assert batch["passes"].tolist() == [1]
    assert [b["passes"].tolist() for b in second] == [[2], [2]]  # the replica persists
    with fastload.Loader(Replica(), 1, num_workers=0) as ld:
        assert [b["id"].tolist() for b in ld] == [[-1]]  # no worker info in the main process


def test_len_needs_the_datasets_len():
    ld = fastload.Loader(Split(10), 3, num_workers=0)
    with pytest.raises(TypeError, match="without __len__"):
        len(ld)
    assert "batches=?" in repr(ld)
    assert len(fastload.Loader(Whole(10), 3, num_workers=0)) == 4
    assert len(fastload.Loader(Whole(10), 3, num_workers=0, drop_last=True)) == 3


def test_an_iterator_is_refused_with_what_to_do():
    with pytest.raises(TypeError, match="iterator.*can be read once.*new iterator every time"):
        fastload.Loader((i for i in range(3)), 2, num_workers=0)


@pytest.mark.parametrize("kwargs", [{"shuffle": True}, {"shard": (0, 2)},
                                    {"batch_plan": lambda e: [[0]]}])
def test_what_needs_positions_is_refused_with_what_to_do(kwargs):
    with pytest.raises(ValueError, match="plain iterable.*ShardedStream"):
        fastload.Loader(Split(4), 2, num_workers=0, **kwargs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 2])
def test_a_workers_empty_iterator_or_all_of_them_is_no_batch(nw):
    with fastload.Loader(PerWorker([0, 0]), 2, num_workers=nw, timeout=30) as ld:
        assert _rows(ld) == [] and _rows(ld) == []
    if nw:
        with fastload.Loader(PerWorker([0, 3]), 2, num_workers=nw, timeout=30) as ld:
            assert _rows(ld) == [[[1, 0], [1, 1]], [[1, 2]]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 1])
def test_a_sample_that_raises_names_its_position_and_the_next_batch_follows(nw):
    with fastload.Loader(RaisesAt(8, 4), 3, num_workers=nw, timeout=30) as ld:
        it = iter(ld)
        assert next(it).tolist() == [0, 1, 2]
        with pytest.raises(ValueError, match="bad sample 4") as e:
            next(it)
        assert "sample 4 of the dataset's iterator" in str(e.value)
        # the failed batch's other positions (3, 5) are lost, as a map-style batch's samples
        assert [b.tolist() for b in it] == [[6, 7]]


@pytest.mark.timeout(60)
def test_the_first_samples_of_all_workers_load_at_once(tmp_path):
    # each worker's first sample waits until 4 workers have begun theirs
    with fastload.Loader(Barrier(8, 4, str(tmp_path)), 2, num_workers=4, timeout=30) as ld:
        assert sorted(x for b in ld for x in b.tolist()) == list(range(8))


@pytest.mark.timeout(60)
def test_ragged_and_object_leaves_travel_as_for_map_style_datasets():
    with fastload.Loader(Ragged(6), 3, num_workers=2, ragged={"tokens": "list"},
                         timeout=30) as ld:
        got = [(t.tolist(), n) for b in ld for t, n in zip(b["tokens"], b["name"])]
    assert sorted(got, key=lambda x: x[1]) == [
        (list(range(i % 5 + 1)), f"s{i}") for i in range(6)]
    with fastload.Loader(Ragged(4), 2, num_workers=0, stack=False) as ld:
        assert [s["name"] for b in ld for s in b] == ["s0", "s1", "s2", "s3"]


@pytest.mark.timeout(60)
def test_return_mask_is_true_for_every_row_of_a_short_batch():
    with fastload.Loader(Split(5), 2, num_workers=1, return_mask=True, timeout=30) as ld:
        assert [m.tolist() for _, m in ld] == [[True, True], [True, True], [True]]


@pytest.mark.timeout(90)
def test_a_worker_that_dies_is_restarted_and_its_stream_goes_on_where_it_was(tmp_path):
    flag = str(tmp_path / "died")
    with fastload.Loader(Split(30), 2, num_workers=2, timeout=30) as ld:
        want = _rows(ld)
    with fastload.Loader(DiesOnce(30, 13, flag), 2, num_workers=2, timeout=30,
                         on_worker_death="restart") as ld:
        assert _rows(ld) == want  # the new worker skipped what its predecessor had read
        assert ld.stats()["worker_restarts"] == 1
    assert os.path.exists(flag)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("stop", [1, 3, 5])
def test_resume_mid_epoch_continues_with_the_same_batches(nw, stop):
    lengths = [7, 3] if nw else [9]
    with fastload.Loader(PerWorker(lengths), 2, num_workers=nw, timeout=30) as ld:
        full = _rows(ld)
    with fastload.Loader(PerWorker(lengths), 2, num_workers=nw, timeout=30) as ld:
        it = iter(ld)
        before = [next(it).tolist() for _ in range(stop)]
        state = json.loads(json.dumps(ld.state_dict()))
    with fastload.Loader(PerWorker(lengths), 2, num_workers=nw, timeout=30) as ld:
        ld.load_state_dict(state)
        after = _rows(ld)
        assert _rows(ld) == full  # then the next epoch, whole
    assert before + after == full


def test_resume_with_another_num_workers_is_refused():
    with fastload.Loader(Split(6), 2, num_workers=0) as ld:
        next(iter(ld))
        state = ld.state_dict()
    ld = fastload.Loader(Split(6), 2, num_workers=0)
    ld.load_state_dict(state)  # the same count: fine
    with pytest.raises(ValueError, match="num_workers=0 but this loader has num_workers=2"):
        fastload.Loader(Split(6), 2, num_workers=2).load_state_dict(state)
    with pytest.raises(ValueError, match="plain iterable"):
        fastload.Loader(Split(6), 2, num_workers=0).load_state_dict(
            fastload.Loader(np.arange(6), 2, num_workers=0).state_dict())


@pytest.mark.timeout(60)
def test_a_torch_iterable_dataset_is_a_plain_iterable():
    torch = pytest.importorskip("torch")

    class T(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([np.float32(i) for i in range(5)])

    with fastload.Loader(T(), 2, num_workers=0) as ld:
        assert _rows(ld) == [[0.0, 1.0], [2.0, 3.0], [4.0]]


@pytest.mark.timeout(60)
def test_an_iterable_on_a_shared_pool_uses_the_pools_workers():
    with fastload.Pool(2) as pool:
        with fastload.Loader(PerWorker([1, 4]), 2, pool=pool, timeout=30) as ld:
            assert _rows(ld) == round_robin([1, 4], 2, False)
        with fastload.Loader(np.arange(6), 3, pool=pool, timeout=30) as ld:  # map-style next
            assert _rows(ld) == [[0, 1, 2], [3, 4, 5]]
