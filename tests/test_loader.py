"""The public Loader contract (everything but worker errors, crashes and timeouts)."""

from __future__ import annotations

import gc
import math
import multiprocessing as mp
import os

import numpy as np
import pytest

import fastload
from fastload._pack import SlotLease

from helpers import MP_TIMEOUT
from helpers import shm as shm_entries
from helpers.datasets import (
    BigSample,
    InitRecorder,
    LambdaHolder,
    Layouts,
    LockHolder,
    MISMATCH_PATHS,
    Nested,
    NoLen,
    Objects,
    OddBig,
    PidDataset,
    Point,
    Range,
    ShapeChangeAt,
    Thing,
    TypeCheck,
    WorkerInfoDataset,
    layouts_sample,
    nested_sample,
    range_batch_ok,
)

mp_test = pytest.mark.timeout(MP_TIMEOUT)


# -- helpers ---------------------------------------------------------------------------------------
def indices_of(batch) -> list[int]:
    """The sample indices of a batch whose first leaf is the index (or that is the index)."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    assert isinstance(first, np.ndarray) and first.dtype == np.int64 and first.ndim == 1
    return first.tolist()


def epoch(loader) -> list[int]:
    out: list[int] = []
    for b in loader:
        out += indices_of(b)
    return out


def assert_tree_equal(got, want, path="batch"):
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            assert_tree_equal(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_tree_equal(g, w, f"{path}[{i}]")
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {got.shape} != {want.shape}"
        assert got.dtype.isnative, path
        np.testing.assert_array_equal(got, want, err_msg=path)
    else:
        assert got == want, path


def stack_samples(samples):
    """The batch the contract promises: np.stack per array leaf, a list per object leaf."""
    s0 = samples[0]
    if isinstance(s0, dict):
        return {k: stack_samples([s[k] for s in samples]) for k in s0}
    if isinstance(s0, tuple) and hasattr(type(s0), "_fields"):
        return type(s0)(*(stack_samples(list(col)) for col in zip(*samples)))
    if isinstance(s0, (tuple, list)):
        return type(s0)(stack_samples(list(col)) for col in zip(*samples))
    if isinstance(s0, (np.ndarray, np.generic, bool, int, float)):
        a = np.stack([np.asarray(s) for s in samples])
        return a.astype(a.dtype.newbyteorder("=")) if not a.dtype.isnative else a
    return list(samples)


def expected_batches(sample_fn, n, batch_size, drop_last=False):
    nb = n // batch_size if drop_last else math.ceil(n / batch_size)
    return [stack_samples([sample_fn(i) for i in range(b * batch_size, min(n, (b + 1) * batch_size))])
            for b in range(nb)]


def reference_orders(n, batch_size, seed, epochs, **kw):
    """Epoch orders from the in-process loader (the reference every configuration must match)."""
    with fastload.Loader(Range(n), batch_size, shuffle=True, seed=seed, num_workers=0, **kw) as ref:
        return [epoch(ref) for _ in range(epochs)]


# -- construction ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bs", [0, -1, 1.5, 2.0, "2", None, True])
def test_bad_batch_size(bs):
    with pytest.raises(ValueError):
        fastload.Loader(Range(4), bs, num_workers=0)


@pytest.mark.parametrize("nw", [-1, -8])
def test_negative_num_workers(nw):
    with pytest.raises(ValueError):
        fastload.Loader(Range(4), 2, num_workers=nw)


@pytest.mark.parametrize("ds", [NoLen(), object(), (i for i in range(3)), 5],
                         ids=["getitem-no-len", "object", "generator", "int"])
def test_dataset_without_len_is_type_error(ds):
    with pytest.raises(TypeError):
        fastload.Loader(ds, 2, num_workers=0)


@pytest.mark.parametrize(("kw", "says"), [
    ({"worker_init_fn": print}, "'worker_init_fn': use worker_init="),
    ({"prefetch_factor": 4}, "'prefetch_factor': use prefetch="),
    ({"persistent_workers": True}, "always persist"),
    ({"collate_fn": list}, "fastload.compat.torch.DataLoader"),
    ({"n_processes": 2}, "'n_processes': use num_workers="),
    ({"num_worker": 2}, "did you mean num_workers=?"),
    ({"shufle": True}, "did you mean shuffle=?"),
])
def test_foreign_keyword_arguments_name_what_to_use(kw, says):
    # torch's and Chainer's argument names are the first thing a migrating user types
    with pytest.raises(TypeError, match="unexpected keyword argument") as info:
        fastload.Loader(Range(8), 2, num_workers=0, **kw)
    assert says in str(info.value)


@pytest.mark.parametrize("nw", [0, 2])
def test_a_structure_mismatch_says_how_to_load_varying_samples(nw):
    with pytest.raises(fastload.LayoutMismatchError, match="dict keys differ") as info:
        list(fastload.Loader([{"a": 1}, {"b": 2}], 2, num_workers=nw))
    assert "stack=False" in str(info.value) and "sample index 1" in str(info.value)


def test_one_rank_of_several_without_shard_is_warned_once(monkeypatch):
    # NOTE [one rank of many] in fastload/loader.py
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "1")
    loader = fastload.Loader(Range(10), 4, num_workers=0)
    with pytest.warns(RuntimeWarning, match=r"one of 4 ranks \(SLURM_NTASKS=4\).*Pass shard='auto'"):
        assert len(list(loader)) == 3
    assert len(list(loader)) == 3  # once per loader (a second warning would be an error here)
    assert len(list(fastload.Loader(Range(10), 4, num_workers=0, shard=(0, 1)))) == 3
    assert len(list(fastload.Loader(Range(10), 4, num_workers=0, shard="auto"))) == 1
    planned = fastload.Loader(Range(10), 4, num_workers=0, batch_plan=lambda e: [[0, 1]])
    assert len(list(planned)) == 1  # the plan's owner samples: not warned


def test_the_warning_advises_only_what_works(monkeypatch):
    # Lightning's variables on node 1 without a per-node count: shard="auto" cannot tell the
    # rank, so the warning says why and advises shard=(rank, world_size) instead
    for k in ("RANK", "SLURM_NTASKS", "SLURM_PROCID", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("NODE_RANK", "1")
    loader = fastload.Loader(Range(10), 4, num_workers=0)
    with pytest.warns(RuntimeWarning, match=r"cannot tell this rank here .*NODE_RANK=1.*\. "
                                            r"Pass shard=\(rank, world_size\)"):
        list(loader)
    with pytest.raises(ValueError, match="not which one this is"):
        fastload.Loader(Range(10), 4, num_workers=0, shard="auto")


def test_several_foreign_keyword_arguments_are_all_named():
    with pytest.raises(TypeError) as info:
        fastload.Loader(Range(8), 2, worker_init_fn=print, prefetch_factor=2, zzz=1)
    text = str(info.value)
    assert "'worker_init_fn'" in text and "'prefetch_factor'" in text and "'zzz'" in text


@pytest.mark.parametrize("method", ["thread", "FORK", "", "posix_spawn", 1])
def test_bad_start_method(method):
    with pytest.raises(ValueError):
        fastload.Loader(Range(4), 2, num_workers=1, start_method=method)


@mp_test
def test_num_workers_none_means_cpu_count():
    with fastload.Loader(PidDataset(8), 2, num_workers=None) as loader:
        assert loader.num_workers == os.cpu_count()
        assert epoch(loader) == list(range(8))
        assert len(mp.active_children()) == os.cpu_count()


def test_len_and_stats_before_iterating():
    with fastload.Loader(Range(10), 3, num_workers=0) as loader:
        assert len(loader) == 4
        s = loader.stats()
        assert isinstance(s, dict)
        assert s["copied_batches"] == 0 and s["worker_restarts"] == 0


# -- batches mirror samples --------------------------------------------------------------------------
@mp_test
@pytest.mark.parametrize("nw", [0, 1, 2])
def test_nested_structure_is_mirrored_and_stacked(nw):
    want = expected_batches(nested_sample, 11, 4)
    with fastload.Loader(Nested(11), 4, num_workers=nw) as loader:
        got = list(loader)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert_tree_equal(g, w)
    b = got[0]
    assert type(b["p"]) is Point
    assert b["a"][0].dtype == np.int64 and b["a"][1].dtype == np.float64
    assert b["a"][2].dtype == np.bool_ and b["a"][3].dtype == np.float32
    assert b["b"][1] == ["s0", "s1", "s2", "s3"]
    assert b["p"].y == [None] * 4
    assert b["o"] == [Thing(0), Thing(1), Thing(2), Thing(3)]


@mp_test
def test_every_start_method_works(start_method):
    want = expected_batches(nested_sample, 9, 4)
    with fastload.Loader(Nested(9), 4, num_workers=2, start_method=start_method) as loader:
        assert loader.start_method == start_method
        for _ in range(2):  # two epochs on the same workers
            got = list(loader)
            assert len(got) == 3
            for g, w in zip(got, want):
                assert_tree_equal(g, w)
            del got


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_awkward_memory_layouts(nw):
    """Fortran-order, negative-stride, strided, byte-swapped and 0-d leaves: values equal,
    output native."""
    want = expected_batches(layouts_sample, 6, 4)
    with fastload.Loader(Layouts(6), 4, num_workers=nw) as loader:
        got = list(loader)
    assert len(got) == 2
    for g, w in zip(got, want):
        assert_tree_equal(g, w)
        assert g["swapped"].dtype == np.dtype("=i4")
        assert g["swapped_f"].dtype == np.dtype("=f8")
        assert g["zero_d"].dtype == np.dtype("=i8")


@pytest.mark.parametrize(
    "leaf, dtype",
    [
        (lambda i: i, np.int64),
        (lambda i: i * 0.5, np.float64),
        (lambda i: i % 3 == 0, np.bool_),
        (lambda i: complex(i, -1), np.complex128),
        (lambda i: np.int8(i), np.int8),
        (lambda i: np.uint16(i), np.uint16),
        (lambda i: np.float16(i), np.float16),
        (lambda i: np.complex64(i), np.complex64),
        (lambda i: np.bool_(i % 2), np.bool_),
        (lambda i: np.array(i, np.float32), np.float32),
        (lambda i: np.array(i, ">u4"), np.uint32),
    ],
    ids=["int", "float", "bool", "complex", "int8", "uint16", "float16", "complex64", "np.bool_", "0d-f32",
         "0d-swapped"],
)
def test_scalar_leaves_in_process(leaf, dtype):
    class DS:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return (i, leaf(i))

    with fastload.Loader(DS(), 2, num_workers=0) as loader:
        got = list(loader)
    assert [g[0].tolist() for g in got] == [[0, 1], [2, 3], [4]]
    for b, g in enumerate(got):
        assert g[1].dtype == np.dtype(dtype)
        assert g[1].shape == (len(g[0]),)
        np.testing.assert_array_equal(g[1], [leaf(i) for i in g[0].tolist()])


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_object_leaves_come_back_as_lists(nw):
    with fastload.Loader(Objects(7), 3, num_workers=nw) as loader:
        got = list(loader)
    assert [g[0].tolist() for g in got] == [[0, 1, 2], [3, 4, 5], [6]]
    for g in got:
        idx = g[0].tolist()
        assert g[1] == [f"str{i}" for i in idx]
        assert g[2] == [None] * len(idx)
        assert g[3] == [Thing(i) for i in idx]
        assert all(type(x) is list for x in g[1:])


@mp_test
def test_objects_too_large_for_the_slot_are_sent_another_way():
    big = 1 << 20  # far more than the variable area sized from the first sample
    with fastload.Loader(Objects(8, big_at=5, big=big), 2, num_workers=2) as loader:
        got = list(loader)
        assert loader.stats()["spilled_batches"] >= 1
    strs = [s for g in got for s in g[1]]
    assert strs[5] == "str5" + "x" * big
    assert strs[:5] == [f"str{i}" for i in range(5)]
    assert strs[6:] == ["str6", "str7"]


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_getitem_receives_python_int(nw):
    with fastload.Loader(TypeCheck(20), 3, shuffle=True, seed=1, num_workers=nw) as loader:
        got = list(loader)
    assert sorted(i for g in got for i in g[0].tolist()) == list(range(20))
    assert all(g[1].all() for g in got), "__getitem__ got something other than a Python int"


@mp_test
@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.parametrize("nw", [0, 1])
def test_single_64mib_sample(batch_size, nw):
    nbytes = 64 * 2**20
    ds = BigSample(3, nbytes)
    with fastload.Loader(ds, batch_size, num_workers=nw, prefetch=1, max_held=1) as loader:
        seen = []
        for b in loader:
            assert b.shape[1:] == (nbytes // 8,) and b.dtype == np.int64
            for row in b:
                i = int(row[0]) // 1000
                assert row[-1] == nbytes // 8 - 1 + i * 1000
                assert np.array_equal(row, ds[i])
                seen.append(i)
            del b, row
    assert seen == [0, 1, 2]


# -- zero-copy and held batches ----------------------------------------------------------------------
@mp_test
def test_batches_are_zero_copy_views_of_a_slot_lease():
    with fastload.Loader(Nested(8), 4, num_workers=2) as loader:
        for b in loader:
            arrays = [b["a"][0], b["a"][4], b["b"][0]["c"], b["p"].x]
            for a in arrays:
                assert isinstance(a.base, SlotLease), type(a.base)
            assert len({id(a.base) for a in arrays}) == 1  # one lease per batch
        del b, arrays
        assert loader.stats()["copied_batches"] == 0


@mp_test
def test_holding_50_batches_never_deadlocks_nor_changes_them():
    n, bs = 100, 2
    with fastload.Loader(Range(n, (4,), np.int32), bs, num_workers=2, max_held=3) as loader:
        held = list(loader)  # every batch kept alive
        assert len(held) == 50
        snapshot = [b.copy() for b in held]
        assert [range_batch_ok(b, (4,)) for b in held] == [[2 * k, 2 * k + 1] for k in range(50)]
        assert loader.stats()["copied_batches"] == 50 - 3
        assert sum(isinstance(b.base, SlotLease) for b in held) == 3
        # Two more epochs through the same slots must not touch any held batch.
        for _ in range(2):
            assert [i for b in loader for i in range_batch_ok(b, (4,))] == list(range(n))
        for b, s in zip(held, snapshot):
            np.testing.assert_array_equal(b, s)
    for b, s in zip(held, snapshot):  # still valid after close
        np.testing.assert_array_equal(b, s)


@mp_test
def test_held_batches_with_object_leaves_stay_intact():
    want = expected_batches(nested_sample, 40, 2)
    with fastload.Loader(Nested(40), 2, num_workers=2, max_held=2) as loader:
        held = list(loader)
        assert loader.stats()["copied_batches"] == 20 - 2
        list(loader)  # another epoch through the same slots
        for g, w in zip(held, want):
            assert_tree_equal(g, w)


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_max_held_zero_copies_every_batch(nw):
    with fastload.Loader(Range(10, (3,)), 2, num_workers=nw, max_held=0) as loader:
        held = list(loader)
        assert [i for b in held for i in range_batch_ok(b, (3,))] == list(range(10))
        assert not any(isinstance(b.base, SlotLease) for b in held)
        if nw:
            assert loader.stats()["copied_batches"] == 5


@mp_test
def test_dropping_batches_makes_no_copies():
    with fastload.Loader(Range(60, (3,)), 2, num_workers=2) as loader:
        for _ in range(2):
            assert [i for b in loader for i in range_batch_ok(b, (3,))] == list(range(60))
        assert loader.stats()["copied_batches"] == 0


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_copy_true_returns_owned_arrays(nw):
    with fastload.Loader(Range(12, (5,), np.float32), 4, num_workers=nw, copy=True) as loader:
        first = list(loader)
        for b in first:
            assert not isinstance(b.base, SlotLease)
            assert b.flags.writeable
        second = list(loader)
        assert loader.stats()["copied_batches"] == 0
    for b in first:
        b[:] = -1  # writing to a copy never affects what the loader delivers
    assert [i for b in second for i in range_batch_ok(b, (5,))] == list(range(12))


@mp_test
def test_held_zero_copy_batch_survives_close():
    loader = fastload.Loader(Range(10, (1000,), np.float64), 5, num_workers=2)
    held = list(loader)
    loader.close()
    gc.collect()
    assert [range_batch_ok(b, (1000,)) for b in held] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


# -- order -------------------------------------------------------------------------------------------
@mp_test
@pytest.mark.parametrize("nw", [0, 1, 2])
def test_without_shuffle_order_is_sequential(nw):
    with fastload.Loader(Range(17), 5, num_workers=nw) as loader:
        for _ in range(2):
            assert epoch(loader) == list(range(17))


@mp_test
@pytest.mark.parametrize("nw", [0, 1, 2])
def test_shuffle_depends_only_on_seed_and_epoch(nw):
    ref = reference_orders(40, 3, seed=7, epochs=3)
    for order in ref:
        assert sorted(order) == list(range(40))
    assert ref[0] != ref[1] != ref[2] != ref[0], "every epoch must be reshuffled"
    assert ref[0] != list(range(40))
    with fastload.Loader(Range(40), 3, shuffle=True, seed=7, num_workers=nw) as loader:
        assert [epoch(loader) for _ in range(3)] == ref
    with fastload.Loader(Range(40), 3, shuffle=True, seed=8, num_workers=nw) as loader:
        assert epoch(loader) != ref[0]


@mp_test
def test_shuffle_order_same_for_every_start_method(start_method):
    ref = reference_orders(30, 4, seed=3, epochs=2)
    with fastload.Loader(Range(30), 4, shuffle=True, seed=3, num_workers=2,
                         start_method=start_method) as loader:
        assert [epoch(loader) for _ in range(2)] == ref


@pytest.mark.parametrize("n, bs", [(10, 3), (9, 3), (1, 1), (5, 8), (64, 8), (7, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last_like_torch(n, bs, drop_last):
    nb = n // bs if drop_last else math.ceil(n / bs)
    with fastload.Loader(Range(n), bs, num_workers=0, drop_last=drop_last, shuffle=True,
                         seed=1) as loader:
        assert len(loader) == nb
        for _ in range(2):
            batches = [b.tolist() for b in loader]
            assert len(batches) == nb
            assert all(len(b) == bs for b in batches[: n // bs])
            flat = [i for b in batches for i in b]
            assert len(flat) == len(set(flat)) == (n // bs * bs if drop_last else n)
            if not drop_last:
                assert sorted(flat) == list(range(n))


@mp_test
@pytest.mark.parametrize("drop_last", [False, True])
def test_drop_last_with_workers(drop_last):
    with fastload.Loader(Range(23), 5, num_workers=2, drop_last=drop_last) as loader:
        assert len(loader) == (4 if drop_last else 5)
        batches = [b.tolist() for b in loader]
    want = [list(range(k, min(k + 5, 23))) for k in range(0, 23, 5)]
    assert batches == (want[:4] if drop_last else want)


@pytest.mark.parametrize("nw", [None, 0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_empty_dataset(nw, drop_last):
    with fastload.Loader(Range(0), 4, num_workers=nw, drop_last=drop_last, shuffle=True) as loader:
        assert len(loader) == 0
        assert list(loader) == []
        assert list(loader) == []


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_batch_size_larger_than_dataset(nw):
    with fastload.Loader(Range(5), 8, num_workers=nw, shuffle=True, seed=4) as loader:
        assert len(loader) == 1
        (b,) = list(loader)
        assert sorted(b.tolist()) == [0, 1, 2, 3, 4]
    with fastload.Loader(Range(5), 8, num_workers=nw, drop_last=True) as loader:
        assert len(loader) == 0
        assert list(loader) == []


# -- epochs and iterators ----------------------------------------------------------------------------
@mp_test
def test_workers_start_once_and_serve_every_epoch():
    with fastload.Loader(PidDataset(24), 2, num_workers=2) as loader:
        kids = {p.pid for p in mp.active_children()}
        assert len(kids) == 2
        pids = set()
        for _ in range(3):
            seen = []
            for b in loader:
                seen += b[0].tolist()
                pids.update(b[1].tolist())
            assert seen == list(range(24))
        assert os.getpid() not in pids
        assert pids <= kids, (pids, kids)
        assert {p.pid for p in mp.active_children()} == kids
        assert loader.stats()["worker_restarts"] == 0


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_break_then_next_epoch_is_complete(nw):
    ref = reference_orders(30, 4, seed=5, epochs=3)
    with fastload.Loader(Range(30), 4, shuffle=True, seed=5, num_workers=nw) as loader:
        for k, b in enumerate(loader):
            if k == 2:
                break
        del b
        assert epoch(loader) == ref[1]
        assert epoch(loader) == ref[2]


@mp_test
@pytest.mark.parametrize("nw", [0, 1])
def test_two_loaders_interleaved_with_zip(nw):
    ref = reference_orders(20, 3, seed=2, epochs=2)
    a = fastload.Loader(Range(20, (2,), np.int16), 3, num_workers=nw)
    b = fastload.Loader(Nested(20), 3, num_workers=nw, shuffle=True, seed=2)
    with a, b:
        for e in range(2):
            got_a, got_b = [], []
            for x, y in zip(a, b):
                got_a += range_batch_ok(x, (2,))
                got_b += y["a"][0].tolist()
                np.testing.assert_array_equal(y["b"][0]["c"][:, 0, 0], y["a"][0].astype(np.uint8))
                assert y["b"][1] == [f"s{i}" for i in y["a"][0].tolist()]
            assert got_a == list(range(20))
            assert got_b == ref[e]


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_a_new_iteration_is_a_pass_of_its_own_and_the_old_one_goes_on(nw):
    """NOTE [several passes]: as with torch's DataLoader, every iter() is an independent pass
    (its own epoch, in the order the passes started), and the old iterator goes on."""
    ref = reference_orders(20, 2, seed=9, epochs=2)
    with fastload.Loader(Range(20), 2, shuffle=True, seed=9, num_workers=nw) as loader:
        it1 = iter(loader)
        assert next(it1).tolist() == ref[0][:2]
        it2 = iter(loader)
        assert (it1.epoch, it2.epoch) == (0, 1)
        assert next(it1).tolist() == ref[0][2:4]
        got2 = [i for b in it2 for i in b.tolist()]
        got1 = ref[0][:4] + [i for b in it1 for i in b.tolist()]
        assert (got1, got2) == (ref[0], ref[1])


@mp_test
def test_passes_whose_batches_travel_by_the_pipe_keep_each_others_messages():
    # A batch too big for its slot is sent by the pipe, filed by (slot, seq). The second pass
    # takes batches whose seqs are newer than the first pass's still in flight: taking them
    # must not drop the first pass's messages as stale (each then waits for a message that
    # never comes again).
    with fastload.Loader(OddBig(16), 2, num_workers=2, prefetch=2, timeout=20) as loader:
        it1 = iter(loader)
        first = [next(it1)]
        second = list(iter(loader))
        first += list(it1)
        for got in (first, second):
            assert [b[0].tolist() for b in got] == [[i, i + 1] for i in range(0, 16, 2)]
            assert all(b[1][1] == "x" * 300_000 for b in got)
        assert loader.stats()["spilled_batches"] >= 8


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_zip_of_three_passes_interleaves_without_starving_any(nw):
    ref = reference_orders(30, 3, seed=4, epochs=3)
    with fastload.Loader(Range(30), 3, shuffle=True, seed=4, num_workers=nw, prefetch=1,
                         max_held=1) as loader:
        got: list[list[int]] = [[], [], []]
        for a, b, c in zip(loader, loader, loader):
            for k, x in enumerate((a, b, c)):
                got[k] += x.tolist()
            del a, b, c
        assert got == ref
        if nw:
            ring = loader.stats()["ring"]
            assert ring["published"] >= 30  # every batch was loaded by a worker


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_a_validation_pass_inside_a_training_pass(nw):
    """One loader for training and validation (Lightning's val_check_interval): a whole pass
    inside another leaves the outer one where it was; state_dict() is the outer pass's."""
    ref = reference_orders(24, 4, seed=2, epochs=3)
    with fastload.Loader(Range(24), 4, shuffle=True, seed=2, num_workers=nw) as loader:
        train, vals = [], []
        for k, b in enumerate(loader):
            train += b.tolist()
            if k == 2:
                vals.append([i for v in loader for i in v.tolist()])
                state = loader.state_dict()
        assert train == ref[0] and vals == [ref[1]]
        assert (state["epoch"], state["position"]) == (0, 3)
        assert [i for b in loader for i in b.tolist()] == ref[2]


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_an_iterator_dropped_unfinished_frees_its_slots(nw):
    with fastload.Loader(Range(40), 2, num_workers=nw, prefetch=2) as loader:
        for _ in range(30):  # far more abandoned passes than the loader has slots
            it = iter(loader)
            next(it)
            del it
        assert [i for b in loader for i in b.tolist()] == list(range(40))
        assert len(loader._engine.passes.live) == 0
        if nw:
            slots = loader._engine.slots
            assert not slots.inflight or {t.epoch for t in slots.inflight} == {31}


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_load_state_dict_supersedes_every_live_pass(nw):
    with fastload.Loader(Range(20), 2, num_workers=nw) as loader:
        it1 = iter(loader)
        next(it1)
        it2 = iter(loader)
        next(it2)
        state = loader.state_dict()  # the oldest live pass: epoch 0 after one batch
        assert (state["epoch"], state["position"]) == (0, 1)
        loader.load_state_dict(state)
        for it in (it1, it2):
            with pytest.raises(RuntimeError, match="superseded: load_state_dict"):
                next(it)
        assert [i for b in loader for i in b.tolist()] == list(range(2, 20))


@pytest.mark.parametrize("nw", [0])
def test_exhausted_iterator_stays_exhausted(nw):
    with fastload.Loader(Range(4), 2, num_workers=nw) as loader:
        it = iter(loader)
        assert len(it) == 2
        assert [b.tolist() for b in it] == [[0, 1], [2, 3]]
        with pytest.raises(StopIteration):
            next(it)
        assert epoch(loader) == [0, 1, 2, 3]
        with pytest.raises(StopIteration):
            next(it)


# -- worker info and init ------------------------------------------------------------------------------
def test_get_worker_info_is_none_in_the_parent():
    assert fastload.get_worker_info() is None
    with fastload.Loader(WorkerInfoDataset(4), 2, num_workers=0) as loader:
        for b in loader:
            assert b[1].tolist() == [-1] * len(b[1])  # num_workers=0: no worker info either
    assert fastload.get_worker_info() is None


@mp_test
def test_get_worker_info_in_workers(start_method):
    with fastload.Loader(WorkerInfoDataset(16), 2, num_workers=2, start_method=start_method,
                         seed=11) as loader:
        rows = []
        for b in loader:
            rows += list(zip(*(x.tolist() for x in b)))
    assert [r[0] for r in rows] == list(range(16))
    by_pid: dict[int, set[int]] = {}
    for i, wid, nw, seed, same, pid in rows:
        assert wid in (0, 1) and nw == 2 and same is True
        assert isinstance(seed, int)
        by_pid.setdefault(pid, set()).add(wid)
    assert all(len(ids) == 1 for ids in by_pid.values()), "one worker id per process"
    assert len({next(iter(v)) for v in by_pid.values()}) == len(by_pid), "ids are distinct"


@mp_test
def test_worker_init_runs_once_in_each_worker(tmp_path):
    with fastload.Loader(PidDataset(12), 2, num_workers=2, worker_init=InitRecorder(str(tmp_path))) as loader:
        pids = set()
        for _ in range(3):
            for b in loader:
                pids.update(b[1].tolist())
    # Read after close(): a worker that got no work may not have been scheduled yet before.
    calls = sorted(p.read_text() for p in tmp_path.iterdir())
    assert len(calls) == 2, calls
    ids = sorted(int(c.split()[0]) for c in calls)
    init_pids = {int(c.split()[1]) for c in calls}
    assert ids == [0, 1]
    assert pids <= init_pids


@mp_test
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("cls", [LambdaHolder, LockHolder])
def test_unpicklable_dataset_is_a_type_error_naming_it(method, cls):
    with pytest.raises(TypeError) as info:
        fastload.Loader(cls(4), 2, num_workers=2, start_method=method)
    assert cls.__name__ in str(info.value)
    assert mp.active_children() == []


@mp_test
def test_unpicklable_dataset_works_with_fork():
    with fastload.Loader(LambdaHolder(6), 2, num_workers=2, start_method="fork") as loader:
        assert epoch(loader) == list(range(6))


# -- mismatched samples ---------------------------------------------------------------------------------
@mp_test
@pytest.mark.parametrize("kind", sorted(MISMATCH_PATHS))
@pytest.mark.parametrize("nw", [0, 2])
def test_mismatched_sample_raises_layout_error(nw, kind):
    path, word = MISMATCH_PATHS[kind]
    bad = 6
    with fastload.Loader(ShapeChangeAt(12, bad, kind), 4, num_workers=nw) as loader:
        delivered = []
        with pytest.raises(fastload.LayoutMismatchError) as info:
            for b in loader:
                delivered.append(b["pair"][0].tolist())
    msg = str(info.value)
    assert f"{path}:" in msg, msg
    assert word in msg, msg
    assert f"index {bad}" in msg, msg
    assert delivered == [[0, 1, 2, 3]]  # the batch holding the bad sample is never delivered


# -- close --------------------------------------------------------------------------------------------
def _fd_targets():
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


@mp_test
@pytest.mark.parametrize("nw", [0, 2])
def test_close_is_idempotent_and_using_it_afterwards_raises(nw):
    loader = fastload.Loader(Range(10), 2, num_workers=nw)
    it = iter(loader)
    next(it)
    loader.close()
    loader.close()
    with pytest.raises(fastload.LoaderClosedError):
        next(it)
    with pytest.raises(fastload.LoaderClosedError):
        iter(loader)
    with pytest.raises(fastload.LoaderClosedError):
        for _ in loader:
            pass
    assert isinstance(fastload.LoaderClosedError("x"), RuntimeError)


@mp_test
def test_context_manager_closes():
    with fastload.Loader(Range(6), 2, num_workers=2) as loader:
        assert epoch(loader) == list(range(6))
    with pytest.raises(fastload.LoaderClosedError):
        iter(loader)
    assert mp.active_children() == []


@mp_test
def test_close_releases_processes_fds_and_shm(start_method):
    gc.collect()
    fds, shm = _fd_targets(), shm_entries.snapshot()
    loader = fastload.Loader(Nested(20), 4, num_workers=2, start_method=start_method)
    for _ in range(2):
        for b in loader:
            pass
        del b
    assert len(mp.active_children()) == 2
    loader.close()
    # Checked while the Loader object is still alive: close() itself must release everything.
    assert mp.active_children() == []
    now = _fd_targets()
    assert len(now) <= len(fds), {k: v for k, v in now.items() if fds.get(k) != v}
    # this run's entries (NOTE [own /dev/shm entries] in helpers/shm.py)
    assert shm_entries.own_new_entries(shm, shm_entries.mark_process_tree()) == []


@mp_test
def test_close_with_a_live_batch_frees_the_region_when_the_batch_dies():
    gc.collect()
    fds = _fd_targets()
    loader = fastload.Loader(Range(8, (16,)), 4, num_workers=2)
    for b in loader:
        pass
    loader.close()
    assert mp.active_children() == []
    assert range_batch_ok(b, (16,)) == [4, 5, 6, 7]  # still valid after close
    del b
    gc.collect()
    # The batch was the last user of the shared mapping: it must be gone with it, even though
    # the (closed) Loader object is still referenced.
    now = _fd_targets()
    assert len(now) <= len(fds), {k: v for k, v in now.items() if fds.get(k) != v}
    del loader


@mp_test
@pytest.mark.parametrize("big", [0, 1 << 20], ids=["small-objects", "spilled-objects"])
def test_close_is_prompt(big):
    """docs/design.md, NOTE shutdown: workers see the stop flag within 100 ms and exit 0;
    terminate() after join(2 s) is the fallback for stuck user code, not the normal path. Here the
    prefetched next epoch holds a spilled batch that nobody will read."""
    import time

    loader = fastload.Loader(Objects(8, big_at=5, big=big), 2, num_workers=2)
    assert [i for b in loader for i in b[0].tolist()] == list(range(8))
    t = time.monotonic()
    loader.close()
    took = time.monotonic() - t
    assert took < 1.0, f"close() took {took:.2f}s"
    assert mp.active_children() == []


@mp_test
def test_garbage_collected_loader_stops_its_workers():
    loader = fastload.Loader(Range(10), 2, num_workers=2)
    assert epoch(loader) == list(range(10))
    assert len(mp.active_children()) == 2
    del loader
    gc.collect()
    assert mp.active_children() == []


def test_stats_has_the_documented_counters():
    with fastload.Loader(Range(4), 2, num_workers=0) as loader:
        list(loader)
        s = loader.stats()
    for key in ("copied_batches", "spilled_batches", "worker_restarts"):
        assert s[key] == 0


@pytest.mark.parametrize("nw", [0, 2])
def test_iterating_a_temporary_loader(nw):
    # ``for b in Loader(...)``: the loader object is dropped right after iter(); the epoch's
    # iterator must keep it (and its workers) alive until the epoch ends.
    got = [b.tolist() for b in fastload.Loader(Range(7), 3, num_workers=nw)]
    assert got == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.timeout(MP_TIMEOUT)
def test_stall_hook_reports_late_batches_and_keeps_waiting():
    # The private hook behind compat.chainer's dataset_timeout warning: called once per batch
    # that takes longer than the limit (the first sample's layout probe included), while the
    # wait goes on and the batches stay right.
    from helpers.datasets import SlowAt

    late: list[str] = []
    ds = SlowAt(12, (0, 8), 0.6)
    with fastload.Loader(ds, 2, num_workers=1, on_stall=(0.15, late.append)) as loader:
        assert [b.tolist() for b in loader] == [[2 * k, 2 * k + 1] for k in range(6)]
    # the probe loads sample 0 for the layout (batch 0 packs that very sample: NOTE [first
    # samples]), then batch 4 loads sample 8
    assert len(late) == 2, late
    assert "sample index 0" in late[0] and "first sample" in late[0]
    assert "sample index 8 (row 0 of 2 in this batch)" in late[1] and "worker 0" in late[1]


def test_public_hooks_batch_plan_layout_and_epoch():
    plans = {0: [[3, 1], [0]], 1: [[2]]}
    asked = []

    def plan(epoch):
        asked.append(epoch)
        return plans[epoch]

    data = np.arange(4.0)
    with fastload.Loader(data, 2, num_workers=0, batch_plan=plan) as loader:
        assert loader.layout is None
        it = iter(loader)
        assert it.epoch == 0 and asked == []  # asked at the first next(), not at iter()
        assert [b.tolist() for b in it] == [[3.0, 1.0], [0.0]]
        assert loader.layout is not None and loader.layout.batch_size == 2
        it = iter(loader)
        assert it.epoch == 1
        assert [b.tolist() for b in it] == [[2.0]]
    assert asked == [0, 1]
    with pytest.raises(TypeError, match="batch_plan must be callable"):
        fastload.Loader(data, 2, num_workers=0, batch_plan=[[0]])
    with pytest.raises(ValueError, match="on_stall must be"):
        fastload.Loader(data, 2, num_workers=0, on_stall=(0, print))
