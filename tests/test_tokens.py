"""Token-budget batches (fastload/tokens.py, NOTE [token budgets]): the plan alone, then through
a Loader with ragged="pad" and "packed", ranks and resume."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import fastload
from helpers import MP_TIMEOUT


def lognormal(n: int, seed: int = 0, mean: float = 30, top: int = 200) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(mean) - 0.32, 0.8, n).astype(np.int64), 1, top)


class Texts:
    """Sample i: ``tokens``, int32 of length lengths[i], every value i; ``index``: i."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = [int(x) for x in lengths]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"tokens": np.full(self.lengths[i], i, np.int32), "index": i}


def check_epoch(tb: fastload.TokenBudget, batches: list[np.ndarray], rows: int | None = None
                ) -> None:
    """Every batch within budget and row cap; every sample once (one rank, no padding)."""
    for b in batches:
        assert 0 < len(b) <= (rows or len(tb.lengths))
        assert tb.cost(b) <= tb.max_tokens
    flat = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    assert sorted(flat.tolist()) == list(range(len(tb.lengths)))


# -- the plan alone ---------------------------------------------------------------------------
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("shuffle,sort", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("buckets", [1, 4, 32, [10, 20, 40, 80]])
def test_every_batch_within_budget_and_every_sample_once(padded, shuffle, sort, buckets):
    lengths = lognormal(3000)
    tb = fastload.TokenBudget(lengths, 1024, shuffle=shuffle, seed=1, buckets=buckets,
                              padded=padded, sort=sort)
    tb.bind(batch_size=64, seed=0, n=len(lengths))
    for epoch in range(3):
        check_epoch(tb, tb(epoch), rows=64)


def test_padded_batches_waste_little_and_packed_batches_are_full():
    lengths = lognormal(5000)
    padded = fastload.TokenBudget(lengths, 2048, shuffle=True, seed=0)
    waste = sum(padded.cost(b) for b in padded(0)) / lengths.sum()
    assert waste < 1.15  # a random fixed-size batching pads about 2x here
    packed = fastload.TokenBudget(lengths, 2048, shuffle=True, seed=0, padded=False)
    fill = lengths.sum() / (len(packed(0)) * 2048)
    assert fill > 0.9


def test_order_depends_on_seed_and_epoch_only():
    lengths = lognormal(2000)

    def batches(seed, epoch):
        tb = fastload.TokenBudget(lengths, 512, shuffle=True, seed=seed)
        return [b.tolist() for b in tb(epoch)]

    assert batches(3, 0) == batches(3, 0)
    assert batches(3, 0) != batches(3, 1)
    assert batches(3, 0) != batches(4, 0)


def test_without_shuffle_batches_run_shortest_first_sorted_within_buckets():
    lengths = lognormal(2000)
    tb = fastload.TokenBudget(lengths, 512, buckets=8)
    flat = np.concatenate(tb(0))
    assert np.all(np.diff(lengths[flat]) >= 0)  # buckets in order, sorted within
    assert [b.tolist() for b in tb(0)] == [b.tolist() for b in tb(5)]


def test_sort_gives_fairseqs_batches_in_a_new_order_each_epoch():
    lengths = lognormal(3000)
    tb = fastload.TokenBudget(lengths, 1024, shuffle=True, seed=0, sort=True)
    shapes = [sorted(lengths[b].tolist() for b in tb(e)) for e in range(3)]
    assert shapes[0] == shapes[1] == shapes[2]  # the same lengths batched together
    assert [b.tolist() for b in tb(0)] != [b.tolist() for b in tb(1)]
    assert len({tb.num_batches(e) for e in range(5)}) == 1
    check_epoch(tb, tb(1))
    waste = sum(tb.cost(b) for b in tb(0)) / lengths.sum()
    mixed = fastload.TokenBudget(lengths, 1024, shuffle=True, seed=0)
    assert waste < sum(mixed.cost(b) for b in mixed(0)) / lengths.sum()


def test_bucket_bounds_hold_about_equal_tokens():
    lengths = lognormal(20000)
    tb = fastload.TokenBudget(lengths, 4096, buckets=8)
    assert len(tb.boundaries) == 7
    which = np.searchsorted(tb.boundaries, lengths, side="right")
    tokens = np.bincount(which, weights=lengths)
    assert tokens.max() < 1.5 * lengths.sum() / 8
    for b in tb(0):  # no batch spans two buckets
        assert len(set(which[b].tolist())) == 1


def test_the_row_cap_is_the_loaders_batch_size():
    tb = fastload.TokenBudget([1] * 100, 1000)
    assert [len(b) for b in tb(0)] == [100]  # alone: no cap but the budget
    tb.bind(batch_size=16, seed=0, n=100)
    assert [len(b) for b in tb(0)] == [16] * 6 + [4]


def test_pad_to_multiple_counts_the_rounded_length():
    tb = fastload.TokenBudget([9, 9, 9, 9], 64, pad_to_multiple=16)
    assert [len(b) for b in tb(0)] == [4]  # 4 rows x 16 = 64
    tb = fastload.TokenBudget([9, 9, 9, 9, 9], 64, pad_to_multiple=16)
    assert [len(b) for b in tb(0)] == [4, 1]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [2, 3, 8])
def test_every_rank_gets_the_same_number_of_batches(world, drop_last):
    lengths = lognormal(1001)
    alone = fastload.TokenBudget(lengths, 700, shuffle=True, seed=9)
    everything = alone(2)
    ranks = [fastload.TokenBudget(lengths, 700, shuffle=True, seed=9, shard=(r, world),
                                  drop_last=drop_last)(2) for r in range(world)]
    counts = {len(r) for r in ranks}
    assert len(counts) == 1
    (count,) = counts
    assert count == (len(everything) // world if drop_last else -(-len(everything) // world))
    got = [b.tolist() for r in ranks for b in r]
    want = [b.tolist() for b in everything]
    if drop_last:  # the last count % world batches of the global list are left out
        assert sorted(got) == sorted(want[: count * world])
    else:  # the short ranks repeat the list's first batches
        assert sorted(got) == sorted(want + want[: count * world - len(want)])
    flat = [i for b in got for i in b]
    if not drop_last:
        assert set(flat) == set(range(len(lengths)))


def test_num_batches_is_the_epochs_count():
    tb = fastload.TokenBudget(lognormal(500), 300, shuffle=True, seed=0, shard=(1, 3))
    assert [tb.num_batches(e) for e in range(3)] == [len(tb(e)) for e in range(3)]


@pytest.mark.parametrize("args,kw,exc,match", [
    (([3, 500, 2], 100), {}, ValueError, r"sample 1 has 500 tokens, more than max_tokens=100"),
    (([3, 500, 200], 100), {}, ValueError, r"\(2 samples do\)"),
    (([9], 10), {"pad_to_multiple": 16}, ValueError, r"sample 0 has 9 tokens padded to 16"),
    (([3, -1], 100), {}, ValueError, r"sample 1 has -1"),
    (([3], 0), {}, ValueError, r"max_tokens must be a positive int"),
    (([3], True), {}, ValueError, r"max_tokens must be a positive int"),
    (([1.5, 2.0], 10), {}, TypeError, r"1-d sequence of ints"),
    (([[1, 2]], 10), {}, TypeError, r"1-d sequence of ints"),
    (([1, 2], 10), {"buckets": 0}, ValueError, r"buckets must be"),
    (([1, 2], 10), {"buckets": [5, 3]}, ValueError, r"increasing int bounds"),
    (([1, 2], 10), {"shuffle": True, "shard": (0, 2)}, ValueError, r"needs seed="),
    (([1, 2], 10), {"shard": (2, 2)}, ValueError, r"0 <= rank < world_size"),
    (([1, 2], 10), {"pad_to_multiple": 0}, ValueError, r"pad_to_multiple"),
])
def test_bad_arguments_are_refused_up_front(args, kw, exc, match):
    with pytest.raises(exc, match=match):
        fastload.TokenBudget(*args, **kw)


def test_zero_lengths_and_unpadded_budgets():
    tb = fastload.TokenBudget([0, 0, 5, 5], 10, padded=False, buckets=1)
    check_epoch(tb, tb(0))
    assert [b.tolist() for b in tb(0)] == [[0, 1, 2, 3]]


# -- through a Loader -------------------------------------------------------------------------
def _epoch(batches: Any, mode: str, tb: fastload.TokenBudget) -> list[list[int]]:
    """An epoch's batches (an iterable of them: a loader, or ``iter(loader)``) as lists of
    sample indices, checking each batch's real arrays against the budget."""
    out = []
    for batch in batches:
        idx = batch["index"].tolist()
        t = batch["tokens"]
        if mode == "pad":
            rows, width = t.values.shape
            assert rows * width <= tb.max_tokens and rows == len(idx)
            assert t.lengths.tolist() == tb.lengths[idx].tolist()
        else:
            assert len(t.values) <= tb.max_tokens and len(t.offsets) == len(idx) + 1
            assert np.diff(t.offsets).tolist() == tb.lengths[idx].tolist()
            assert t.values.tolist() == np.repeat(idx, tb.lengths[idx]).tolist()
        out.append(idx)
    return out


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["pad", "packed"])
def test_loader_batches_fit_the_budget_and_cover_the_dataset(mode, num_workers):
    lengths = lognormal(400)
    tb = fastload.TokenBudget(lengths, 600, shuffle=True, seed=2, padded=mode == "pad")
    kw: dict[str, Any] = {"start_method": "fork"} if num_workers else {}
    with fastload.Loader(Texts(lengths), 64, num_workers=num_workers, batch_plan=tb,
                         ragged={"tokens": mode}, **kw) as loader:
        for epoch in range(2):
            assert len(loader) == tb.num_batches(epoch)  # before the epoch starts
            it = iter(loader)
            assert len(it) == tb.num_batches(epoch)
            got = _epoch(it, mode, tb)
            assert got == [b.tolist() for b in tb(epoch)]
            assert sorted(i for b in got for i in b) == list(range(len(lengths)))


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("mode", ["pad", "packed"])
def test_ranks_deliver_equal_counts_and_together_every_sample(mode):
    lengths = lognormal(300, seed=4)
    world, seen, counts = 3, [], set()
    for rank in range(world):
        tb = fastload.TokenBudget(lengths, 500, shuffle=True, seed=7, shard=(rank, world),
                                  padded=mode == "pad")
        with fastload.Loader(Texts(lengths), 32, num_workers=2, start_method="fork",
                             batch_plan=tb, ragged={"tokens": mode}) as loader:
            got = _epoch(loader, mode, tb)
        counts.add(len(got))
        seen += [i for b in got for i in b]
    assert len(counts) == 1
    assert set(seen) == set(range(len(lengths)))


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_with_a_fresh_loader_and_plan(num_workers):
    lengths = lognormal(500, seed=1)
    kw: dict[str, Any] = {"start_method": "fork"} if num_workers else {}

    def loader() -> fastload.Loader:
        tb = fastload.TokenBudget(lengths, 800, shuffle=True, seed=None, padded=False)
        return fastload.Loader(Texts(lengths), 64, num_workers=num_workers, batch_plan=tb,
                               seed=11, ragged={"tokens": "packed"}, **kw)

    with loader() as a:
        first = [b["index"].tolist() for b in a]
        full = [b["index"].tolist() for b in a]  # epoch 1
    with loader() as b:
        list(b)
        it = iter(b)
        head = [next(it)["index"].tolist() for _ in range(4)]
        state = json.loads(json.dumps(b.state_dict()))
    assert state["batch_plan"]["seed"] == 11  # seed=None: the Loader's
    with loader() as c:
        c.load_state_dict(state)
        assert len(c) == len(full)
        rest = [x["index"].tolist() for x in c]
        again = [x["index"].tolist() for x in c]  # and the next epoch as uninterrupted
    assert head + rest == full
    epoch2 = fastload.TokenBudget(lengths, 800, shuffle=True, seed=11, padded=False)(2)
    assert again == [x.tolist() for x in epoch2]
    assert first != full


def test_one_ranks_state_resumes_another_rank():
    lengths = lognormal(300, seed=2)

    def loader(rank: int) -> fastload.Loader:
        tb = fastload.TokenBudget(lengths, 400, shuffle=True, seed=3, shard=(rank, 2))
        return fastload.Loader(Texts(lengths), 32, num_workers=0, batch_plan=tb, ragged="pad")

    with loader(0) as zero:
        it = iter(zero)
        for _ in range(3):
            next(it)
        state = zero.state_dict()
    with loader(1) as one:
        one.load_state_dict(state)
        rest = [b["index"].tolist() for b in one]
    mine = fastload.TokenBudget(lengths, 400, shuffle=True, seed=3, shard=(1, 2))
    mine.bind(batch_size=32, seed=0, n=len(lengths))
    assert rest == [b.tolist() for b in mine(0)][3:]
    tb4 = fastload.TokenBudget(lengths, 400, shuffle=True, seed=3, shard=(1, 4))
    with fastload.Loader(Texts(lengths), 32, num_workers=0, batch_plan=tb4, ragged="pad") as four:
        with pytest.raises(ValueError, match="world=2 but this one has world=4"):
            four.load_state_dict(state)


def test_seed_none_takes_the_loaders_seed():
    lengths = lognormal(200)
    with fastload.Loader(Texts(lengths), 32, num_workers=0, seed=5, ragged="pad",
                         batch_plan=fastload.TokenBudget(lengths, 300, shuffle=True)) as loader:
        got = [b["index"].tolist() for b in loader]
    want = fastload.TokenBudget(lengths, 300, shuffle=True, seed=5)
    want.bind(batch_size=32, seed=0, n=len(lengths))
    assert got == [b.tolist() for b in want(0)]


def test_resume_refuses_another_plan():
    lengths = lognormal(200)
    with fastload.Loader(Texts(lengths), 32, num_workers=0, ragged="pad",
                         batch_plan=fastload.TokenBudget(lengths, 300)) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    with fastload.Loader(Texts(lengths), 32, num_workers=0, ragged="pad",
                         batch_plan=fastload.TokenBudget(lengths, 400)) as other:
        with pytest.raises(ValueError, match=r"max_tokens=300 but this one has max_tokens=400"):
            other.load_state_dict(state)
    with fastload.Loader(Texts(lengths), 32, num_workers=0, ragged="pad",
                         batch_plan=lambda e: [[0]]) as plain:
        with pytest.raises(NotImplementedError, match="custom sampler"):
            plain.load_state_dict(state)


def test_the_loader_checks_lengths_against_the_dataset_and_warns_of_one_row_batches():
    lengths = lognormal(50)
    with pytest.raises(ValueError, match="50 lengths but the dataset has 49 samples"):
        fastload.Loader(Texts(lengths[:49]), 8, num_workers=0,
                        batch_plan=fastload.TokenBudget(lengths, 300))
    with pytest.warns(RuntimeWarning, match="one row"):
        loader = fastload.Loader(Texts(lengths), num_workers=0,
                                 batch_plan=fastload.TokenBudget(lengths, 300))
    loader.close()
