"""NOTE [pieces] (csrc/fl_ring.c): idle workers take pieces of the oldest shared batch, so a
batch does not wait for one worker while the others idle, with the same batches."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import numpy as np
import pytest

import fastload
from fastload import _ring
from helpers import MP_TIMEOUT
from helpers.datasets import Range
from helpers.faults import HangAt, KillAt
from helpers.shared_rows import Counted, FailLate, HangThenFail, Who

pytestmark = pytest.mark.timeout(MP_TIMEOUT)


@pytest.fixture(scope="module", autouse=True)
def _multiprocessing_heap():
    """Counted's counters come from multiprocessing's heap, whose first arena lives until the
    interpreter exits: create it before the leak check's snapshots (as test_first_samples)."""
    from multiprocessing import sharedctypes

    arena = sharedctypes.RawArray("b", 1 << 20)
    del arena
    yield


def _workers_of(batch: np.ndarray) -> set[int]:
    return {int(w) for w in batch[:, 1]}


@pytest.mark.parametrize("share", [True, False])
def test_idle_workers_load_rows_of_the_oldest_batch(share):
    # 2 batches of 8 slow samples for 4 workers: shared, each batch is loaded by several
    # workers; not shared, each by one (torch's way: pytorch/pytorch#19836).
    with fastload.Loader(Who(16, 0.1), 8, num_workers=4, start_method="fork",
                         share_rows=share, timeout=30) as loader:
        batches = [b.copy() for b in loader]
    assert [b[:, 0].tolist() for b in batches] == [list(range(8)), list(range(8, 16))]
    if share:
        assert all(len(_workers_of(b)) >= 2 for b in batches), batches
    else:
        assert all(len(_workers_of(b)) == 1 for b in batches), batches


def test_every_worker_goes_on_with_the_first_batch_after_its_given_row():
    # NOTE [first samples]: each worker packs the first-batch row it loaded at start, then takes
    # more rows of that batch (a bug had it leave for the next batch after its given row)
    with fastload.Loader(Who(32, 0.05), 8, num_workers=2, start_method="fork",
                         timeout=30) as loader:
        first = next(iter(loader)).copy()
    per_worker = [int((first[:, 1] == w).sum()) for w in (0, 1)]
    assert first[:, 0].tolist() == list(range(8)) and min(per_worker) >= 2, per_worker


def test_shared_batches_equal_the_single_process_ones(start_method):
    ds = Range(103, (3,))
    kw = dict(batch_size=8, shuffle=True, seed=7)
    with fastload.Loader(ds, num_workers=0, **kw) as ref:
        expected = [[b.copy() for b in ref] for _ in range(3)]
    with fastload.Loader(ds, num_workers=3, start_method=start_method, timeout=30,
                         **kw) as loader:
        got = [[b.copy() for b in loader] for _ in range(3)]
        assert loader.stats()["shared_rows"] is True
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert len(g) == len(e)
        for a, b in zip(g, e):
            np.testing.assert_array_equal(a, b)


def test_the_first_batch_loads_each_sample_once():
    # NOTE [first samples]: the rows each worker loaded first are given to it, so no sample of
    # the first batch is loaded twice (before: up to num_workers - 1 were).
    calls = mp.get_context("fork").Array("i", 16)  # epoch 0's calls per index
    with fastload.Loader(Counted(16, calls, 0.05), 8, num_workers=4, start_method="fork",
                         timeout=30) as loader:
        assert [b[:, 0].tolist() for b in loader] == [list(range(8)), list(range(8, 16))]
    assert list(calls[:]) == [1] * 16


def test_the_error_of_a_shared_batch_is_that_of_its_first_failing_row():
    # Row 5 raises at once, row 2 after 0.5 s: one worker loading in order would have raised
    # sample 2's error, and so does the shared batch, whichever worker failed first.
    ds = FailLate(16, {5: 0.0, 2: 0.5})
    with fastload.Loader(ds, 8, num_workers=4, start_method="fork", timeout=30) as loader:
        it = iter(loader)
        with pytest.raises(KeyError) as info:
            next(it)
        assert "sample 2 is broken" in str(info.value), str(info.value)
        assert info.value.fastload_index == 2
        assert next(it).tolist() == list(range(8, 16))  # the next next() goes on
        with pytest.raises(StopIteration):
            next(it)


def test_a_worker_killed_in_a_shared_batch_is_replaced_and_its_rows_loaded_again(
        tmp_path, start_method):
    ds = KillAt(40, 13, flag_path=str(tmp_path / "killed"))
    with fastload.Loader(ds, 8, num_workers=3, start_method=start_method,
                         on_worker_death="restart", timeout=30) as loader:
        got = [b[0].tolist() for b in loader]
        assert loader.stats()["worker_restarts"] == 1
    assert got == [list(range(k, k + 8)) for k in range(0, 40, 8)]


def test_a_worker_killed_in_a_shared_batch_raises_naming_its_sample(tmp_path):
    ds = KillAt(40, 13, flag_path=str(tmp_path / "killed"))
    with fastload.Loader(ds, 8, num_workers=3, start_method="fork", timeout=30) as loader:
        with pytest.raises(fastload.WorkerDied, match="13"):
            for _ in loader:
                pass
        # the next epoch works (the sample kills only once)
        assert [b[0].tolist() for b in loader] == [list(range(k, k + 8))
                                                   for k in range(0, 40, 8)]


def test_leaving_and_starting_again_with_shared_batches_in_flight():
    with fastload.Loader(Who(48, 0.01), 4, num_workers=3, start_method="fork",
                         timeout=30) as loader:
        for _ in range(3):
            it = iter(loader)
            assert next(it)[:, 0].tolist() == [0, 1, 2, 3]
            del it  # abandoned with shared batches being loaded
        assert [b[:, 0].tolist() for b in loader] == [list(range(k, k + 4))
                                                     for k in range(0, 48, 4)]


def test_a_stalled_shared_batch_says_which_rows_are_being_loaded():
    with fastload.Loader(HangAt(16, 3, seconds=20), 8, num_workers=2, start_method="fork",
                         timeout=2) as loader:
        with pytest.raises(fastload.LoaderTimeoutError) as info:
            next(iter(loader))
    text = str(info.value)
    assert "has been loading sample index 3 (row 3 of 8 in this batch)" in text, text


def test_loaders_of_one_pool_in_threads_share_their_batches():
    results: dict[int, list[list[int]]] = {}
    errors: list[BaseException] = []

    def run(k: int, pool: fastload.Pool) -> None:
        try:
            with fastload.Loader(Range(60 + k, (2,)), 5, pool=pool, shuffle=True, seed=k,
                                 timeout=30) as loader:
                results[k] = [b[:, 0].tolist() for e in range(2) for b in loader]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    with fastload.Pool(3, start_method="fork") as pool:
        threads = [threading.Thread(target=run, args=(k, pool)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(MP_TIMEOUT)
    assert not errors, errors
    for k in range(2):
        with fastload.Loader(Range(60 + k, (2,)), 5, shuffle=True, seed=k,
                             num_workers=0) as ref:
            assert results[k] == [b[:, 0].tolist() for e in range(2) for b in ref]


@pytest.mark.parametrize("kw", [dict(share_rows=False), dict(on_error="skip"),
                                dict(num_workers=1), dict(stack=False)])
def test_batches_that_cannot_be_shared_are_not(kw):
    kw = {"num_workers": 2, **kw}
    with fastload.Loader(Range(20, (2,)), 4, start_method="fork", timeout=30,
                         **kw) as loader:
        assert [b[:, 0].tolist() if isinstance(b, np.ndarray) else [int(s[0]) for s in b]
                for b in loader] == [list(range(k, k + 4)) for k in range(0, 20, 4)]
        assert loader.stats()["shared_rows"] is False


def test_a_failing_row_never_waits_for_the_rows_after_it(tmp_path):
    # Row 2 raises, row 5 hangs 20 s (once): one worker loading in order would have raised
    # sample 2's error without loading row 5, and so does the shared batch (its rows above the
    # error are not needed); the worker on row 5 finishes later, into a retired slot.
    ds = HangThenFail(16, 5, 2, str(tmp_path / "hung"), seconds=20)
    with fastload.Loader(ds, 8, num_workers=3, start_method="fork", timeout=30) as loader:
        t0 = time.monotonic()
        it = iter(loader)
        with pytest.raises(KeyError, match="sample 2 is broken"):
            next(it)
        assert time.monotonic() - t0 < 10
        assert next(it).tolist() == list(range(8, 16))


def test_a_failing_shared_batch_with_a_slow_row_never_wedges_its_workers(tmp_path):
    """Issue 30: the last batch (shared) holds a row that hangs (sample 9, 30 s, once) below
    a row that fails (sample 10). next() times out naming the sample being loaded, and the
    next epoch goes on with the other worker: the one whose row failed waited for nobody (it
    used to wait for the hanging row without bound, and the next epoch timed out with "still
    QUEUED (no worker picked it up)")."""
    ds = HangThenFail(16, 9, 10, str(tmp_path / "hung"))
    with fastload.Loader(ds, 8, num_workers=2, start_method="fork", timeout=4) as loader:
        it = iter(loader)
        assert next(it).tolist() == list(range(8))
        with pytest.raises(fastload.LoaderTimeoutError) as info:
            next(it)
        assert "loading sample index 9 (row 1 of 8" in str(info.value), str(info.value)
        t0 = time.monotonic()
        it = iter(loader)  # the hanging worker is still in sample 9 of the last epoch
        assert next(it).tolist() == list(range(8))
        with pytest.raises(KeyError, match="sample 10 is broken"):
            next(it)
        assert time.monotonic() - t0 < 4


def test_the_ring_wrappers_of_shared_batches():
    nslots, pieces = 2, 6
    ctl = _ring.control_nbytes(nslots, pieces)
    buf = bytearray(-(-ctl // 128) * 128 + 128 + nslots * 64)
    mem = memoryview(buf)
    off = (-np.frombuffer(buf, np.uint8).ctypes.data) % 128  # the ring wants 128-byte alignment
    ring = _ring.RingIndex.create(mem[off:], nslots, 64, -(-ctl // 128) * 128, 1, pieces)
    try:
        assert ring.max_pieces == pieces
        ring.queue(0, 5, 0, 6, None, True, [1, None])  # row 0 given to worker 1, row 1 to none
        t = ring.take(0, 4, 1)  # nothing given to worker 0: the FREE row 1 first
        assert (t.slot, t.first, t.n, t.seq, t.count, t.shared) == (0, 1, 1, 5, 6, True)
        g = ring.take(1, 4, 1)  # worker 1: its given row
        assert (g.first, g.n) == (0, 1)
        c = ring.take(2, 4, 1)  # a cut: (6 - 2) // 4 rows from row 2
        assert (c.first, c.n) == (2, 1)
        assert [p[:4] for p in ring.pieces(0)] == [
            (_ring.PIECE_TAKEN, 1, 0, 1), (_ring.PIECE_TAKEN, 0, 1, 1),
            (_ring.PIECE_TAKEN, 2, 2, 1)]
        assert ring.give_back(0, 2, True) == 1  # worker 2 died: its row goes back FREE
        assert ring.done(c, 2) is None  # no longer its piece
        assert ring.done(t, 0) is False
        rest = ring.take(0, 1, 1)  # the FREE row 2 again, then the rest in one piece
        assert (rest.first, rest.n) == (2, 1) and ring.done(rest, 0) is False
        last = ring.take(0, 1, 1)
        assert (last.first, last.n) == (3, 3) and ring.done(last, 0) is False
        assert ring.done(g, 1) is True  # the last piece: published READY
        assert _ring.state_bits(ring.state(0))[0] == _ring.READY
        assert ring.take(0) is None
        assert ring.retire(0) is True
    finally:
        ring.close()
