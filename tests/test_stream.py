"""Sharded streams (fastload.ShardedStream, NpyShards): order, ranks, resume, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.streams import BASE, Counted, FailsAt, Lies, Sized, Tokens, calls, expected
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload

UNEVEN = [1, 7, 100, 33, 0]


def _run(loader, k=None):
    out = []
    for b in loader:
        out.append(b.tolist())
        if k is not None and len(out) == k:
            break
    return out


def _flat(batches):
    return [x for b in batches for x in b]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", [Sized, Counted])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_once_and_the_order_does_not_depend_on_num_workers(cls, shuffle):
    orders = []
    for nw in (0, 1, 2):
        with fastload.Loader(cls(UNEVEN), 8, shuffle=shuffle, seed=3, num_workers=nw,
                             shuffle_buffer=16) as ld:
            epochs = [_run(ld) for _ in range(2)]
        for e in epochs:
            assert sorted(_flat(e)) == expected(UNEVEN)
            assert [len(b) for b in e] == [8] * 17 + [5]
        orders.append(epochs)
    assert orders[0] == orders[1] == orders[2]
    if shuffle:
        assert orders[0][0] != orders[0][1]  # reshuffled every epoch
        assert _flat(orders[0][0]) != expected(UNEVEN)
    else:
        assert _flat(orders[0][0]) == expected(UNEVEN)  # shards in order, samples in order


@pytest.mark.timeout(120)
def test_the_order_is_the_same_under_every_start_method(start_method):
    with fastload.Loader(Sized(UNEVEN), 8, shuffle=True, seed=9, num_workers=0) as ld:
        want = _run(ld)
    with fastload.Loader(Sized(UNEVEN), 8, shuffle=True, seed=9, num_workers=2,
                         start_method=start_method) as ld:
        assert _run(ld) == want


def test_shuffle_permutes_within_windows_of_shuffle_buffer():
    sizes = [64]
    with fastload.Loader(Sized(sizes), 64, shuffle=True, seed=1, num_workers=0,
                         shuffle_buffer=16) as ld:
        got = _run(ld)[0]
    for w in range(4):  # each window of 16 raw positions is a permutation of itself
        assert sorted(got[16 * w: 16 * w + 16]) == list(range(16 * w, 16 * w + 16))
    assert got != list(range(64))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_equal_batch_counts_and_together_every_sample_once(world, drop_last):
    counts, real, padded = [], [], 0
    for rank in range(world):
        with fastload.Loader(Counted(UNEVEN), 8, shuffle=True, seed=2, num_workers=1,
                             shard=(rank, world), return_mask=True, drop_last=drop_last) as ld:
            batches = list(ld)
            assert len(ld) == len(batches)
        counts.append(len(batches))
        for b, m in batches:
            real += b[m].tolist()
            padded += int((~m).sum())
            if drop_last:
                assert len(b) == 8
    assert len(set(counts)) == 1, counts
    assert len(real) == len(set(real))  # no sample twice
    if drop_last:
        assert padded == 0 and len(real) == world * (141 // world // 8) * 8
    else:
        assert sorted(real) == expected(UNEVEN)
        assert padded == world * -(-141 // world) - 141


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nw_before, nw_after", [(0, 2), (2, 1), (1, 0)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_mid_epoch_continues_exactly_and_never_rereads_what_was_consumed(
        tmp_path, nw_before, nw_after, shuffle):
    with fastload.Loader(Sized(UNEVEN), 8, shuffle=shuffle, seed=4, num_workers=0) as ld:
        full = [_run(ld) for _ in range(2)]
    with fastload.Loader(Sized(UNEVEN), 8, shuffle=shuffle, seed=4,
                         num_workers=nw_before) as ld:
        assert _run(ld) == full[0]
        before = _run(ld, 7)
        state = json.loads(json.dumps(ld.state_dict()))
    assert before == full[1][:7]
    cursors = {int(k): v for k, v in state["stream"]["cursors"].items()}
    assert sum(cursors.values()) == 56 and cursors  # 7 batches of 8, per shard
    log = tmp_path / "log"
    log.mkdir()
    with fastload.Loader(Sized(UNEVEN, log=str(log)), 8, shuffle=shuffle,
                         num_workers=nw_after) as ld:
        ld.load_state_dict(state)
        assert _run(ld) == full[1][7:]
        assert _run(ld)[:3] == _run_ref(shuffle, 2)[:3]  # the epoch after, as usual
    window = 1024 if shuffle else 1  # with shuffle, reads start at the window holding it
    reads = [(shard, start) for e, shard, start in calls(str(log)) if e == 1]
    assert reads
    for shard, start in reads:
        if shard in cursors and start < cursors[shard]:  # a read of the consumed part ...
            assert start == cursors[shard] // window * window  # ... only of its last window
            assert shuffle


def _run_ref(shuffle, epoch):
    with fastload.Loader(Sized(UNEVEN), 8, shuffle=shuffle, seed=4, num_workers=0) as ld:
        for _ in range(epoch):
            _run(ld)
        return _run(ld)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("old_world, new_world", [(2, 1), (2, 3), (3, 2)])
def test_resume_with_another_world_size_loses_and_repeats_nothing(old_world, new_world):
    kw = dict(shuffle=True, seed=6, num_workers=0, return_mask=True, shuffle_buffer=8)
    seen, states = [], []
    for r in range(old_world):  # every old rank consumed 4 batches (lock step)
        with fastload.Loader(Counted(UNEVEN), 8, shard=(r, old_world), **kw) as ld:
            it = iter(ld)
            for _ in range(4):
                b, m = next(it)
                seen += b[m].tolist()
            states.append(json.loads(json.dumps(ld.state_dict())))
    counts = []
    for r in range(new_world):
        with fastload.Loader(Counted(UNEVEN), 8, shard=(r, new_world), **kw) as ld:
            ld.load_state_dict(states[min(r, old_world - 1)])  # any rank's state serves
            it = iter(ld)
            rest = list(it)
            assert len(it) == 4 + len(rest)  # batches keep their numbers (NOTE [resume
            counts.append(len(rest))  # across ranks] in fastload/_plan.py)
            seen += [x for b, m in rest for x in b[m].tolist()]
            nxt = list(ld)  # the next epoch is a whole, normal one
            assert sorted(x for b, m in nxt for x in b[m].tolist()) != []
    assert len(set(counts)) == 1, counts
    assert sorted(seen) == expected(UNEVEN)


@pytest.mark.timeout(60)
def test_a_state_taken_after_a_world_size_change_resumes_exactly():
    kw = dict(shuffle=True, seed=6, num_workers=0, shuffle_buffer=8)
    with fastload.Loader(Counted(UNEVEN), 8, shard=(0, 2), **kw) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
    with fastload.Loader(Counted(UNEVEN), 8, **kw) as ld:  # 2 ranks -> 1
        ld.load_state_dict(state)
        it = iter(ld)
        head = [next(it).tolist() for _ in range(2)]
        state2 = json.loads(json.dumps(ld.state_dict()))
        tail = [b.tolist() for b in it]
    assert state2["history"] == [[2, 3]] and state2["position"] == 5  # batches keep numbers
    with fastload.Loader(Counted(UNEVEN), 8, **kw) as ld:
        ld.load_state_dict(state2)
        assert _run(ld) == tail
    # a state saved before the history moved to the top level counted from the world change
    legacy = {k: v for k, v in state2.items() if k != "history"}
    legacy = dict(legacy, position=2, stream=dict(state2["stream"], history=[[2, 3]]))
    with fastload.Loader(Counted(UNEVEN), 8, **kw) as ld:
        ld.load_state_dict(legacy)
        assert _run(ld) == tail
    assert len(set(_flat(head + tail))) == len(_flat(head + tail))


def test_a_state_of_other_shards_is_refused():
    with fastload.Loader(Sized(UNEVEN), 8, num_workers=0) as ld:
        _run(ld, 2)
        state = ld.state_dict()
    with fastload.Loader(Sized([1, 7, 100, 33, 1]), 8, num_workers=0) as ld:
        with pytest.raises(ValueError, match="other shards or shard lengths"):
            ld.load_state_dict(state)
    with fastload.Loader(np.arange(141), 8, num_workers=0) as ld:
        with pytest.raises(ValueError, match="the state was saved"):
            ld.load_state_dict(state)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 30), min_size=1, max_size=6),
       batch=st.integers(1, 9), cut=st.integers(0, 40), shuffle=st.booleans(),
       world=st.integers(1, 3), drop_last=st.booleans())
def test_property_before_and_resumed_are_the_uninterrupted_run(sizes, batch, cut, shuffle,
                                                               world, drop_last):
    kw = dict(shuffle=shuffle, seed=5, num_workers=0, shuffle_buffer=4, drop_last=drop_last)
    for rank in range(world):
        with fastload.Loader(Sized(sizes), batch, shard=(rank, world), **kw) as ld:
            full = _run(ld)
        k = min(cut, len(full))
        with fastload.Loader(Sized(sizes), batch, shard=(rank, world), **kw) as ld:
            before = _run(ld, k) if k else []
            state = json.loads(json.dumps(ld.state_dict()))
        with fastload.Loader(Sized(sizes), batch, shard=(rank, world), **kw) as ld:
            ld.load_state_dict(state)
            after = _run(ld) if k < len(full) else []
        assert before + after == full


def test_errors_in_iter_shard_name_the_shard_and_the_position():
    with fastload.Loader(FailsAt(UNEVEN, 2, 40), 8, num_workers=0) as ld:
        with pytest.raises(OSError, match="corrupt record 40") as info:
            _run(ld)
    msg = str(info.value)
    assert "'part-002'" in msg and "position 40 of the shard" in msg
    assert f"sample index {1 + 7 + 40}" in msg


@pytest.mark.timeout(60)
def test_an_error_in_a_worker_names_the_shard_and_the_epoch_goes_on():
    with fastload.Loader(FailsAt(UNEVEN, 2, 40), 8, num_workers=2) as ld:
        it = iter(ld)
        got, errors = [], []
        while True:
            try:
                got += next(it).tolist()
            except StopIteration:
                break
            except OSError as e:
                errors.append(str(e))
    assert len(errors) == 1 and "'part-002'" in errors[0] and "position 40" in errors[0]
    assert len(got) == 141 - 8  # the failed batch is consumed, the rest is delivered


def test_a_shard_shorter_than_its_length_is_a_clear_error():
    with fastload.Loader(Lies(UNEVEN), 8, num_workers=0) as ld:
        with pytest.raises(ValueError, match=r"'part-001' \(shard 1\) ended at position 7"):
            _run(ld)


def test_the_contiguous_fast_path_cuts_batches_into_shards_as_the_general_one_does():
    from fastload._stream import stream_view

    view = stream_view(Sized([3, 0, 0, 5, 1, 0, 8]), False, None, 0, None)
    for g0 in range(17):
        for n in range(1, 18 - g0):
            g = np.arange(g0, g0 + n, dtype=np.int64)
            fast = view._contiguous_runs(0, 0, g, g0, g0 + n - 1)
            slow = view._general_runs(0, 0, g)
            assert [(s, r.tolist(), x.tolist()) for s, r, x in fast] == \
                [(s, r.tolist(), x.tolist()) for s, r, x in slow], (g0, n)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="shuffle_buffer applies to a fastload.ShardedStream"):
        fastload.Loader(np.arange(4), 2, shuffle_buffer=8, num_workers=0)
    with pytest.raises(ValueError, match="shuffle_buffer must be an int >= 1"):
        fastload.Loader(Sized([3]), 2, shuffle_buffer=0, num_workers=0)
    with pytest.raises(ValueError, match="batch_plan cannot drive a ShardedStream"):
        fastload.Loader(Sized([3]), 2, batch_plan=lambda e: [[0]], num_workers=0)

    class Bad(Sized):
        def shard_len(self, shard):
            return -1

    with pytest.raises(ValueError, match=r"shard_len\('part-000'\) returned -1"):
        fastload.Loader(Bad([3]), 2, num_workers=0)
    with pytest.raises(NotImplementedError, match="must define shards"):
        fastload.Loader(fastload.ShardedStream(), 2, num_workers=0)


def test_an_empty_stream_has_no_batches():
    with fastload.Loader(Sized([0, 0]), 4, num_workers=0) as ld:
        assert len(ld) == 0 and _run(ld) == []


@pytest.mark.timeout(60)
def test_stream_samples_go_through_ragged_layouts():
    with fastload.Loader(Tokens(UNEVEN), 8, num_workers=2, ragged={"tokens": "packed"}) as ld:
        for batch in ld:
            ids = batch["id"].tolist()
            off = batch["tokens"].offsets
            for j, v in enumerate(ids):
                seg = batch["tokens"].values[off[j]:off[j + 1]]
                assert seg.tolist() == [v] * (v % 5 + 1)


# -- NpyShards -------------------------------------------------------------------------------
@pytest.fixture
def npy_shards(tmp_path):
    paths, labels = [], []
    for k, n in enumerate(UNEVEN):
        x = (np.arange(n * 4, dtype=np.float32).reshape(n, 4) + k * BASE)
        paths.append(str(tmp_path / f"x{k}.npy"))
        np.save(paths[-1], x)
        labels.append(str(tmp_path / f"y{k}.npy"))
        np.save(labels[-1], np.arange(n, dtype=np.int64) + k * BASE)
    return paths, labels


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 2])
def test_npy_shards_with_labels(npy_shards, nw):
    paths, labels = npy_shards
    with fastload.Loader(fastload.NpyShards(paths, labels), 16, shuffle=True, seed=1,
                         num_workers=nw) as ld:
        ys = []
        for x, y in ld:
            assert x.shape[1:] == (4,) and x.dtype == np.float32
            k, i = y // BASE, y % BASE  # row i of shard k is arange(4) + 4 * i + k * BASE
            np.testing.assert_array_equal(x, (np.arange(4) + 4 * i[:, None] + k[:, None] * BASE)
                                          .astype(np.float32))
            ys += y.tolist()
    assert sorted(ys) == expected(UNEVEN)


class _OnlyGathered(fastload.NpyShards):
    """Batches of more than one row must come through the C gather into the slot."""

    def _fastload_take(self, shard, rows):
        assert len(rows) == 1, "a batch was stacked by take, not gathered into the slot"
        return super()._fastload_take(shard, rows)

    def iter_shard(self, shard, start):
        raise AssertionError("NpyShards reads through its columns, not iter_shard")


def test_npy_shards_batches_are_gathered_in_c_across_shards(npy_shards):
    paths, labels = npy_shards
    with fastload.Loader(_OnlyGathered(paths, labels), 16, num_workers=0) as ld:
        ys = [y for _, y in ld]
    assert len(ys[0]) == 16 and 0 in ys[0] and BASE + 6 in ys[0]  # shards 0, 1, 2 in one
    assert np.concatenate(ys).tolist() == expected(UNEVEN)


def test_npy_shards_refuses_what_it_cannot_read(tmp_path, npy_shards):
    paths, labels = npy_shards
    with pytest.raises(TypeError, match="give a list of .npy files"):
        fastload.NpyShards(paths[0])
    with pytest.raises(ValueError, match="2 label arrays for 5 shards"):
        fastload.NpyShards(paths, labels[:2])
    with pytest.raises(ValueError, match="has 7 rows but its labels have 1"):
        fastload.NpyShards(paths[1:3], [labels[0], labels[1]])
    np.save(tmp_path / "s.npy", np.float32(1))
    with pytest.raises(ValueError, match="holds a scalar"):
        fastload.NpyShards([str(tmp_path / "s.npy")])


def test_npy_shards_without_labels_match_iter_shard(npy_shards):
    paths, _ = npy_shards
    ds = fastload.NpyShards(paths)
    want = np.concatenate([np.stack(list(ds.iter_shard(k, 0))) for k in ds.shards() if
                           ds.shard_len(k)])
    with fastload.Loader(ds, 10, num_workers=0) as ld:
        np.testing.assert_array_equal(np.concatenate(list(ld)), want)


# -- a real launch ---------------------------------------------------------------------------
def _torchrun(nproc, mode, folder):
    script = Path(__file__).parent / "helpers" / "stream_rank.py"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
         "--master_port=0", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0", str(script),
         mode, str(folder)], capture_output=True, text=True, timeout=150, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(line[0][len("RESULT "):])


def _real(ranks):
    return [v for x in ranks for v, m in zip(x["got"], x["mask"]) if m]


@pytest.mark.timeout(400)
def test_real_torchrun_uneven_shards_equal_batches_and_resume_on_2_and_1_ranks(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (pip install torch==2.13.0)")
    full = _torchrun(2, "full", tmp_path)
    assert full[0]["batches"] == full[1]["batches"] == 9  # ceil(ceil(141 / 2) / 8)
    assert sorted(_real(full)) == expected(UNEVEN)
    before = _torchrun(2, "stop", tmp_path)
    assert [x["got"] for x in before] == [x["got"][:24] for x in full]
    again = _torchrun(2, "resume", tmp_path)  # same world: exactly the uninterrupted rest
    assert [x["got"] for x in again] == [x["got"][24:] for x in full]
    one = _torchrun(1, "resume", tmp_path)  # 2 -> 1 ranks: nothing lost or repeated
    assert sorted(_real(before) + _real(one)) == expected(UNEVEN)
