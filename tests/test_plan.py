"""The epoch plan (fastload/_plan.py): pure logic, no processes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload._plan import EpochPlan

sizes = st.integers(0, 200)
batch_sizes = st.integers(1, 17)
seeds = st.integers(0, 2**63 - 1)


def make(n, bs, *, shuffle=True, seed=0, drop_last=False, shard=(0, 1), batch_plan=None):
    return EpochPlan(n, bs, shuffle=shuffle, seed=seed, drop_last=drop_last, shard=shard,
                     batch_plan=batch_plan)


def epoch_batches(plan, epoch):
    return [plan.batch(epoch, b).tolist() for b in range(plan.nbatches_of(epoch))]


@settings(max_examples=200, deadline=None)
@given(n=sizes, bs=batch_sizes, shuffle=st.booleans(), seed=seeds, epoch=st.integers(0, 5))
def test_every_index_once_per_epoch(n, bs, shuffle, seed, epoch):
    plan = make(n, bs, shuffle=shuffle, seed=seed)
    batches = epoch_batches(plan, epoch)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(n))
    assert all(len(b) == bs for b in batches[:-1]) and all(0 < len(b) <= bs for b in batches)
    assert flat == (sorted(flat) if not shuffle else flat)
    # The order depends only on (seed, epoch): a fresh plan gives the same batches.
    assert epoch_batches(make(n, bs, shuffle=shuffle, seed=seed), epoch) == batches


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 200), bs=batch_sizes, world=st.integers(1, 5), seed=seeds,
       drop_last=st.booleans())
def test_ranks_get_equal_batches_and_cover_the_dataset(n, bs, world, seed, drop_last):
    plans = [make(n, bs, seed=seed, drop_last=drop_last, shard=(r, world)) for r in range(world)]
    counts = {p.nbatches_of(0) for p in plans}
    assert len(counts) == 1, counts  # every rank the same number of batches
    sizes = {tuple(len(b) for b in epoch_batches(p, 0)) for p in plans}
    assert len(sizes) == 1, sizes  # ... of the same sizes
    real = []
    for p in plans:
        for b in range(p.nbatches_of(0)):
            idx, mask = p.batch(0, b), p.mask(0, b)
            assert len(idx) == len(mask)
            real += idx[mask].tolist()
    assert len(real) == len(set(real))  # no real sample twice
    if drop_last:
        assert set(real) <= set(range(n))
        assert len(real) == world * ((n // world) // bs) * bs  # only whole batches, none padded
    else:
        assert sorted(real) == list(range(n))  # padding is masked, every sample once


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 120), bs=batch_sizes, seed=seeds, world=st.integers(1, 3),
       drop_last=st.booleans(), epoch=st.integers(0, 3), data=st.data())
def test_resume_at_any_point_equals_uninterrupted(n, bs, seed, world, drop_last, epoch, data):
    kw = dict(drop_last=drop_last, shard=(world - 1, world))
    plan = make(n, bs, seed=seed, **kw)
    k = data.draw(st.integers(0, plan.nbatches_of(epoch)))
    state = json.loads(json.dumps(plan.state(epoch, k)))  # it must survive JSON
    resumed = make(n, bs, seed=seed ^ 12345, **kw)  # a different seed: the state's wins
    assert resumed.restore(state) == (epoch, k)
    assert resumed.seed == seed
    rest = [resumed.batch(epoch, b).tolist() for b in range(k, resumed.nbatches_of(epoch))]
    assert rest == epoch_batches(plan, epoch)[k:]
    assert epoch_batches(resumed, epoch + 1) == epoch_batches(plan, epoch + 1)


def test_restore_refuses_other_settings_and_bad_states():
    plan = make(10, 3)
    state = plan.state(1, 2)
    for key, value in (("len", 11), ("batch_size", 4), ("shuffle", False),
                       ("drop_last", True)):
        with pytest.raises(ValueError, match=f"saved with {key}="):
            make(10, 3).restore({**state, key: value})
    for shard in ([2, 2], [0], "0/2", [0.0, 2]):  # another rank's is fine: a broken one is not
        with pytest.raises(ValueError, match=r"invalid state: shard .*\[rank, world_size\]"):
            make(10, 3).restore({**state, "shard": shard})
    with pytest.raises(ValueError, match="invalid state: history"):
        make(10, 3).restore({**state, "history": [[0, 1]]})
    with pytest.raises(ValueError, match="invalid state: epoch 1, position 3"):
        make(10, 3).restore({**state, "shard": [1, 2], "position": 3})  # 2 batches a rank
    with pytest.raises(ValueError, match="not a fastload Loader state"):
        make(10, 3).restore({**state, "format": "other"})
    with pytest.raises(ValueError, match="invalid state"):
        make(10, 3).restore({**state, "position": 99})
    with pytest.raises(NotImplementedError, match="custom sampler"):
        make(10, 3, batch_plan=lambda e: [[0]]).restore(state)


def test_batch_plan_is_checked():
    with pytest.raises(ValueError, match="batch 1 of epoch 0 has 3 indices; expected 1 to 2"):
        make(5, 2, batch_plan=lambda e: [[0], [1, 2, 3]]).plan(0)
    with pytest.raises(IndexError, match="sampler index 7 out of range for 5 samples"):
        make(5, 2, batch_plan=lambda e: [[7]]).plan(0)


def test_prepare_computes_the_next_order_ahead():
    plan = make(1000, 10, seed=3)
    plan.prepare(1)
    assert 1 in plan._orders
    assert np.array_equal(plan.order(1), make(1000, 10, seed=3).order(1))


# -- resume across ranks (NOTE [resume across ranks]) ------------------------------------------
def _real(plan, epoch, batches):
    """The real (unmasked) samples of ``batches`` of ``epoch``, and their batch sizes."""
    got = []
    for b in batches:
        idx, mask = plan.batch(epoch, b), plan.mask(epoch, b)
        assert len(idx) == len(mask)
        got += idx[mask].tolist()
    return got


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 150), bs=st.integers(1, 9), seed=seeds, shuffle=st.booleans(),
       drop_last=st.booleans(), epoch=st.integers(0, 2),
       worlds=st.lists(st.integers(1, 8), min_size=2, max_size=3), data=st.data())
def test_one_ranks_state_resumes_every_rank_on_any_world_size(n, bs, seed, shuffle, drop_last,
                                                              epoch, worlds, data):
    """World sizes worlds[0] -> worlds[1] (-> worlds[2]): each world's ranks consume some
    batches in lock step, one rank (any) saves, the next world's ranks all load that state.
    Together they deliver every sample of the epoch once (drop_last: at most once, and only
    whole batches), each world's ranks the same number of batches of the same sizes."""
    kw = dict(shuffle=shuffle, drop_last=drop_last)
    seen, state = [], None
    for k, w in enumerate(worlds):
        plans = [make(n, bs, seed=seed if state is None else seed + 1, shard=(r, w), **kw)
                 for r in range(w)]
        starts = {p.restore(json.loads(json.dumps(state)))[1] if state else 0 for p in plans}
        assert len(starts) == 1  # every rank resumes at the same batch
        start = starts.pop()
        counts = {p.nbatches_of(epoch) for p in plans}
        assert len(counts) == 1, f"world {w}: ranks got different batch counts {counts}"
        total = counts.pop()
        shapes = {tuple(len(p.batch(epoch, b)) for b in range(start, total)) for p in plans}
        assert len(shapes) == 1, shapes
        last = k == len(worlds) - 1
        stop = total if last else data.draw(st.integers(start, total), label=f"stop{k}")
        for p in plans:
            seen += _real(p, epoch, range(start, stop))
        if drop_last:  # whole batches only, nothing padded
            assert all(p.mask(epoch, b).all() for p in plans for b in range(start, total))
            assert all(x == bs for x in shapes.pop())
        if not last:
            saver = plans[data.draw(st.integers(0, w - 1), label=f"saver{k}")]
            state = saver.state(epoch, stop)
        else:
            # the next epoch is the last world size's usual plan
            for r, p in enumerate(plans):
                fresh = make(n, bs, seed=seed, shard=(r, w), **kw)
                assert epoch_batches(p, epoch + 1) == epoch_batches(fresh, epoch + 1)
                assert p.nbatches_of(epoch + 1) == fresh.nbatches
    assert len(seen) == len(set(seen)), "a sample was delivered twice"
    assert set(seen) <= set(range(n))
    if not drop_last:
        assert sorted(seen) == list(range(n)), "a sample was lost"


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 120), bs=st.integers(1, 9), seed=seeds, shuffle=st.booleans(),
       drop_last=st.booleans(), world=st.integers(1, 8), data=st.data())
def test_any_ranks_state_on_the_same_world_size_is_the_uninterrupted_run(n, bs, seed, shuffle,
                                                                         drop_last, world, data):
    kw = dict(shuffle=shuffle, drop_last=drop_last)
    plans = [make(n, bs, seed=seed, shard=(r, world), **kw) for r in range(world)]
    k = data.draw(st.integers(0, plans[0].nbatches))
    state = json.loads(json.dumps(plans[data.draw(st.integers(0, world - 1))].state(1, k)))
    for r, p in enumerate(plans):
        resumed = make(n, bs, seed=seed + 1, shard=(r, world), **kw)
        assert resumed.restore(state) == (1, k)
        assert [resumed.batch(1, b).tolist() for b in range(k, resumed.nbatches_of(1))] == \
            epoch_batches(p, 1)[k:]
        assert resumed.state(1, k) == {**state, "shard": [r, world]}


def test_resume_on_another_world_size_by_hand():
    # 10 samples, no shuffle, batches of 2: 2 ranks take 0 2 4 6 8 / 1 3 5 7 9; after one
    # batch each (0 2 / 1 3) rank 0's state resumes 3 ranks on 4..9: 4 7 / 5 8 / 6 9
    old = make(10, 2, shuffle=False, shard=(0, 2))
    state = old.state(0, 1)
    assert (state["shard"], state["history"]) == ([0, 2], [])
    got = []
    for r in range(3):
        p = make(10, 2, shuffle=False, shard=(r, 3))
        # batches keep their numbers: batch 1 is next, of 2 (len(loader) for Lightning)
        assert p.restore(state) == (0, 1) and p.nbatches_of(0) == 2
        got.append([p.batch(0, 1).tolist()])
        assert p.state(0, 2)["history"] == [[2, 1]]
        with pytest.raises(IndexError, match="consumed before the world size changed"):
            p.batch(0, 0)
    assert got == [[[4, 7]], [[5, 8]], [[6, 9]]]
    assert make(10, 2, shuffle=False, shard=(0, 3)).nbatches_of(1) == 2  # the next epoch: usual
    # 4 ranks share the 6 left: 2 each (one batch), rank 3's second a padded duplicate
    p = make(10, 2, shuffle=False, shard=(3, 4))
    p.restore(state)
    assert p.batch(0, 1).tolist() == [7, 5] and p.mask(0, 1).tolist() == [True, False]
    # a state saved there, on 4 ranks, after their batch: 1 rank has nothing left
    p1 = make(10, 2, shuffle=False)
    assert p1.restore(p.state(0, 2)) == (0, 2) and p1.nbatches_of(0) == 2
    # a state saved before "history" existed (same shard) loads as before
    legacy = {k: v for k, v in state.items() if k != "history"}
    p = make(10, 2, shuffle=False, shard=(0, 2))
    assert p.restore(legacy) == (0, 1) and epoch_batches(p, 0)[1:] == [[4, 6], [8]]
