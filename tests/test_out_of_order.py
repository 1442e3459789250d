"""in_order=False (NOTE [out of order] in fastload/_scheduler.py): batches come as they load, a
slow sample holds back only its own batch, every batch of the epoch still comes exactly once,
and what depends on the order (the mask, errors, resume) follows the batch delivered."""

from __future__ import annotations

import time

import numpy as np
import pytest

import fastload
from fastload import get_worker_info

SLOW_S = 0.8


class Slow:
    """Sample ``slow`` sleeps; each sample says which worker loaded it."""

    def __init__(self, n: int, slow: int = 0, fail: int = -1) -> None:
        self.n, self.slow, self.fail = n, slow, fail

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.slow:
            time.sleep(SLOW_S)
        if i == self.fail:
            raise KeyError(i)
        info = get_worker_info()
        return np.array([i, info.id if info is not None else -1])


def _epoch(loader: fastload.Loader) -> list[np.ndarray]:
    return [np.array(b, copy=True) for b in loader]


@pytest.mark.parametrize("assign", ["any", "round_robin"])
def test_a_slow_sample_holds_back_only_its_batch(assign: str) -> None:
    with fastload.Loader(Slow(20), batch_size=2, num_workers=2, in_order=False, assign=assign,
                         timeout=30) as loader:
        for epoch in range(2):  # (the second's first batches were loaded ahead)
            batches = _epoch(loader)
            firsts = [int(b[0, 0]) for b in batches]
            assert sorted(firsts) == list(range(0, 20, 2))  # every batch, once
            if epoch == 0:
                assert firsts[0] != 0 and firsts.index(0) >= 5  # the slow one came late
            for b in batches:
                k = int(b[0, 0])
                assert b[:, 0].tolist() == [k, k + 1]  # rows stay in order within a batch


def test_round_robin_skips_the_stuck_worker_as_torch() -> None:
    # torch's in_order=False: batches 0 and 2 go to worker 0 (prefetch 2); it is stuck on
    # sample 0, so every later batch goes to worker 1, and 0 and 2 come last
    with fastload.Loader(Slow(10), batch_size=1, num_workers=2, prefetch=2, in_order=False,
                         assign="round_robin", timeout=30) as loader:
        got = [(int(b[0, 0]), int(b[0, 1])) for b in loader]
    assert [i for i, _ in got] == [1, 3, 4, 5, 6, 7, 8, 9, 0, 2]
    assert [w for _, w in got] == [1] * 8 + [0, 0]


def test_in_order_true_keeps_the_plans_order() -> None:
    with fastload.Loader(Slow(10), batch_size=2, num_workers=2, timeout=30) as loader:
        assert [int(b[0, 0]) for b in loader] == [0, 2, 4, 6, 8]


def test_the_mask_is_the_delivered_batchs() -> None:
    # rank 1 of 2 over 7 samples holds a padded duplicate in its last batch; its first batch
    # is slow, so the padded batch comes first: its mask must come with it
    def batches(in_order: bool, slow: int) -> list[tuple[list[int], list[bool]]]:
        with fastload.Loader(Slow(7, slow=slow), batch_size=2, num_workers=2, shard=(1, 2),
                             in_order=in_order, return_mask=True, timeout=30) as loader:
            return [(b[:, 0].tolist(), mask.tolist()) for b, mask in loader]

    expected = batches(True, -1)
    assert [False] in [[m for m in mask if not m] for _, mask in expected]  # one is padded
    first = expected[0][0][0]
    got = batches(False, first)
    assert got[0] != expected[0]  # the slow batch came later
    assert sorted(got) == sorted(expected)


def test_a_failing_batch_raises_in_its_turn_and_the_epoch_goes_on() -> None:
    with fastload.Loader(Slow(12, fail=7), batch_size=2, num_workers=2, in_order=False,
                         timeout=30) as loader:
        it = iter(loader)
        firsts, errors = [], 0
        while True:
            try:
                firsts.append(int(next(it)[0, 0]))
            except KeyError:
                errors += 1
            except StopIteration:
                break
    assert errors == 1
    assert sorted(firsts) == [0, 2, 4, 8, 10]


def test_state_dict_mid_epoch_says_to_save_between_epochs() -> None:
    with fastload.Loader(Slow(8, slow=-1), batch_size=2, num_workers=2, in_order=False,
                         timeout=30) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(ValueError, match="in_order=True"):
            loader.state_dict()
        rest = list(it)
        assert len(rest) == 3
        state = loader.state_dict()  # between epochs: exact
    with fastload.Loader(Slow(8, slow=-1), batch_size=2, num_workers=2, in_order=False,
                         timeout=30) as again:
        again.load_state_dict(state)
        assert sorted(int(b[0, 0]) for b in again) == [0, 2, 4, 6]


def test_the_first_layout_comes_from_any_worker() -> None:
    # NOTE [first samples]: with in_order=False a slow first sample does not hold back the
    # first batch delivered (worker 1 says the layout while worker 0 loads sample 0)
    with fastload.Loader(Slow(8), batch_size=1, num_workers=2, in_order=False,
                         assign="round_robin", timeout=30) as loader:
        t0 = time.monotonic()
        first = next(iter(loader))
        assert time.monotonic() - t0 < SLOW_S / 2
        assert int(first[0, 0]) != 0


def test_num_workers_0_is_in_order() -> None:
    loader = fastload.Loader(Slow(6, slow=-1), batch_size=2, num_workers=0, in_order=False)
    assert [int(b[0, 0]) for b in loader] == [0, 2, 4]


def test_in_order_must_be_a_bool() -> None:
    with pytest.raises((TypeError, ValueError), match="in_order"):
        fastload.Loader(Slow(6), batch_size=2, num_workers=0, in_order="no")


class Halves:
    """A plain iterable: worker k of n yields its half of 0..9 (rows ``(worker, value)``); the
    first value of worker 1's half is slow."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        per = -(-10 // n)
        for v in range(k * per, min(10, (k + 1) * per)):
            if v == 5:
                time.sleep(SLOW_S)
            yield np.array([k, v])


def test_a_plain_iterable_delivers_each_workers_batches_as_they_load() -> None:
    with fastload.Loader(Halves(), batch_size=1, num_workers=2, in_order=False,
                         assign="round_robin", timeout=30) as loader:
        got = [b[0].tolist() for b in loader]
    assert got == [[0, v] for v in range(5)] + [[1, v] for v in range(5, 10)]


def test_the_drop_in_takes_in_order_false_as_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    from fastload.compat.torch import DataLoader

    loader = DataLoader(Slow(10), num_workers=2, prefetch_factor=2, in_order=False, timeout=30)
    try:
        got = [tuple(int(v) for v in b[0]) for b in loader]
    finally:
        loader.close()
    assert [i for i, _ in got] == [1, 3, 4, 5, 6, 7, 8, 9, 0, 2]
    theirs = torch.utils.data.DataLoader(Slow(10), num_workers=2, prefetch_factor=2,
                                         in_order=False, timeout=30)
    assert [int(b[0][0]) for b in theirs] == [i for i, _ in got]


@pytest.mark.parametrize("assign", ["any", "round_robin"])
def test_a_worker_death_loses_and_repeats_nothing(tmp_path, assign: str) -> None:
    # restart mode, a worker SIGKILLed mid-epoch while another batch is slow: each batch still
    # comes once (its lost batch is loaded again), whatever order they come in
    from tests.helpers.faults import KillFirstTimes

    class SlowAndKilled(KillFirstTimes):
        def __getitem__(self, i: int) -> tuple[int, int]:
            if i == 0:
                time.sleep(SLOW_S / 2)
            return super().__getitem__(i)

    with fastload.Loader(SlowAndKilled(40, 13, 1, str(tmp_path)), batch_size=2, num_workers=2,
                         in_order=False, assign=assign, on_worker_death="restart",
                         timeout=60) as loader:
        for _ in range(2):
            firsts = sorted(int(b[0][0]) for b in loader)
            assert firsts == list(range(0, 40, 2))
        assert loader.stats()["worker_restarts"] == 1


def test_two_passes_at_once_each_get_their_epoch() -> None:
    # NOTE [several passes]: each pass takes only its own epoch's batches, in any order
    with fastload.Loader(Slow(16, slow=4), batch_size=2, num_workers=2, in_order=False,
                         shuffle=True, seed=3, timeout=30) as loader:
        a, b = iter(loader), iter(loader)
        got_a, got_b = [], []
        for x, y in zip(a, b):
            got_a.append(x[:, 0].tolist())
            got_b.append(y[:, 0].tolist())
        plain = fastload.Loader(Slow(16, slow=-1), batch_size=2, num_workers=0, shuffle=True,
                                seed=3)
        epochs = [[b[:, 0].tolist() for b in plain] for _ in range(2)]
    assert sorted(got_a) == sorted(epochs[0]) and sorted(got_b) == sorted(epochs[1])
