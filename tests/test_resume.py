"""Exact resume (state_dict / load_state_dict) and per-sample random numbers (sample_rng)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.resume import Augmented, AugmentedBatch

import fastload


def _batches(loader, k=None):
    out = []
    for b in loader:
        out.append((b[0].tolist(), b[1].copy()))
        if k is not None and len(out) == k:
            break
    return out


def _same(a, b):
    assert [x[0] for x in a] == [x[0] for x in b]
    for (_, ra), (_, rb) in zip(a, b):
        np.testing.assert_array_equal(ra, rb)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw_before, nw_after", [(0, 2), (2, 0), (2, 1)])
def test_resume_mid_epoch_reproduces_the_uninterrupted_run(nw_before, nw_after):
    with fastload.Loader(Augmented(), 4, shuffle=True, seed=7, num_workers=1) as ref:
        full = [_batches(ref) for _ in range(3)]
    with fastload.Loader(Augmented(), 4, shuffle=True, seed=7, num_workers=nw_before) as a:
        epoch0 = _batches(a)
        first = _batches(a, k=5)  # epoch 1, batches 0..4
        state = json.loads(json.dumps(a.state_dict()))  # JSON-serialisable
    assert state["epoch"] == 1 and state["position"] == 5
    _same(epoch0, full[0])
    _same(first, full[1][:5])
    # a new loader, other worker count, no seed given: the state carries everything
    with fastload.Loader(Augmented(), 4, shuffle=True, num_workers=nw_after) as b:
        b.load_state_dict(state)
        assert b.state_dict() == state
        _same(_batches(b), full[1][5:])
        _same(_batches(b), full[2])


@pytest.mark.timeout(60)
def test_resume_between_epochs_and_on_a_running_loader():
    with fastload.Loader(Augmented(), 5, shuffle=True, seed=3, num_workers=2) as ref:
        full = [_batches(ref) for _ in range(3)]
        state = ref.state_dict()
        assert (state["epoch"], state["position"]) == (3, 0)
    with fastload.Loader(Augmented(), 5, shuffle=True, seed=3, num_workers=2) as a:
        _batches(a)
        s1 = a.state_dict()
        _batches(a, k=2)  # runs ahead, then rewinds to the end of epoch 0
        a.load_state_dict(s1)
        _same(_batches(a), full[1])
        _same(_batches(a), full[2])


def test_load_state_dict_rejects_a_different_loader():
    with fastload.Loader(Augmented(), 4, num_workers=0) as a:
        state = a.state_dict()
    with fastload.Loader(Augmented(), 5, num_workers=0) as b:
        with pytest.raises(ValueError, match="batch_size=4"):
            b.load_state_dict(state)
        with pytest.raises(ValueError, match="format"):
            b.load_state_dict({"epoch": 0})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ds", [Augmented(), AugmentedBatch()], ids=["getitem", "getitems"])
def test_sample_rng_is_independent_of_workers_and_start_method(ds):
    runs = []
    for nw, method in [(0, None), (1, "fork"), (2, "spawn")]:
        with fastload.Loader(ds, 4, shuffle=True, seed=11, num_workers=nw,
                             start_method=method) as loader:
            runs.append([_batches(loader) for _ in range(2)])
    for other in runs[1:]:
        for e in range(2):
            _same(runs[0][e], other[e])
    # different epochs draw different numbers for the same index
    by_index = [{i: r for idx, rr in runs[0][e] for i, r in zip(idx, rr)} for e in range(2)]
    assert not np.array_equal(by_index[0][0], by_index[1][0])


def test_sample_rng_outside_a_loader_is_an_error():
    with pytest.raises(RuntimeError, match="sample_rng"):
        fastload.sample_rng()


def _real(batches):
    return [i for b, m in batches for i in b[m].tolist()]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("old_world, new_world, drop_last", [(3, 2, False), (2, 5, True)])
def test_one_ranks_state_resumes_every_rank_on_another_world_size(nw, old_world, new_world,
                                                                  drop_last):
    # NOTE [resume across ranks] (fastload/_plan.py): as Lightning does, rank 0 saves; every
    # rank of the new run (another world size) loads that one state
    n, bs = 53, 4
    kw = dict(shuffle=True, return_mask=True, drop_last=drop_last, num_workers=nw)
    seen, states = [], []
    for r in range(old_world):
        with fastload.Loader(np.arange(n), bs, seed=5, shard=(r, old_world), **kw) as ld:
            list(ld)  # epoch 0
            got = []
            for b, m in ld:  # epoch 1: 3 batches, then the job stops
                got.append((b.copy(), m.copy()))
                if len(got) == 3:
                    break
            seen += _real(got)
            states.append(json.loads(json.dumps(ld.state_dict())))
    assert {(s["epoch"], s["position"]) for s in states} == {(1, 3)}  # lock step
    counts = []
    for r in range(new_world):
        with fastload.Loader(np.arange(n), bs, shard=(r, new_world), **kw) as ld:
            ld.load_state_dict(states[0])
            announced = len(ld)  # the resumed epoch's batches on this rank, those before too
            rest = [(b.copy(), m.copy()) for b, m in ld]
            assert announced == 3 + len(rest)
            counts.append(len(rest))
            seen += _real(rest)
            after = [b.tolist() for b, _ in ld]  # epoch 2: the new world's usual plan
        with fastload.Loader(np.arange(n), bs, seed=5, shard=(r, new_world), **kw) as fresh:
            list(fresh)
            list(fresh)
            assert after == [b.tolist() for b, _ in fresh]
    assert len(set(counts)) == 1, f"the new ranks got different batch counts: {counts}"
    assert len(seen) == len(set(seen)), "a sample was delivered twice"
    if drop_last:
        left = n - old_world * 3 * bs
        assert counts[0] == left // new_world // bs
    else:
        assert sorted(seen) == list(range(n)), "a sample was lost"


@pytest.mark.timeout(480)
def test_lightning_ddp_resumes_every_rank_from_rank_0s_state(tmp_path):
    # Lightning's DDP launcher sets WORLD_SIZE and LOCAL_RANK but no RANK (shard="auto" must
    # still shard), saves rank 0's loader state in the checkpoint and every rank loads it
    # (NOTE [resume across ranks]); resumed on 2 ranks and on 1
    pytest.importorskip("lightning", reason="lightning is not installed on this machine")
    import os
    import socket
    import subprocess
    import sys

    from helpers.lightning_ranks import BATCH, CRASH_AT, N

    script = os.path.join(os.path.dirname(__file__), "helpers", "lightning_ranks.py")
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "MASTER_PORT")}

    def run(mode, devices):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["MASTER_PORT"] = str(s.getsockname()[1])
        r = subprocess.run([sys.executable, script, str(tmp_path), mode, str(devices)],
                           capture_output=True, text=True, timeout=150, env=env,
                           cwd=str(tmp_path))
        got = [json.loads((tmp_path / f"{mode}{devices}-rank{k}.json").read_text())
               for k in range(devices)]
        return r, got

    r, crashed = run("crash", 2)
    assert (tmp_path / "epoch=0-step=3.ckpt").exists(), r.stderr[-3000:]
    per_rank = -(-N // 2 // BATCH)  # 7 batches a rank, not 14 (the whole dataset)
    assert [len(c["seen"]) for c in crashed] == [CRASH_AT, CRASH_AT]
    before = [i for c in crashed for b in c["seen"][:3] for i in b]  # in the checkpoint
    assert len(before) == len(set(before)) == 2 * 3 * BATCH  # the ranks' shares are disjoint
    for devices in (2, 1):
        r, resumed = run("resume", devices)
        assert r.returncode == 0, r.stderr[-3000:]
        counts = {len(g["seen"]) for g in resumed}
        assert counts == {per_rank - 3 if devices == 2 else -(-(N - 24) // BATCH)}, counts
        after = [i for g in resumed for b in g["seen"] for i in b]
        assert sorted(before + after) == list(range(N)), f"resumed on {devices} rank(s)"
