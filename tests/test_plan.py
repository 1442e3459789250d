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
                       ("drop_last", True), ("shard", [0, 2])):
        with pytest.raises(ValueError, match=f"saved with {key}="):
            make(10, 3).restore({**state, key: value})
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
