"""NOTE [first samples] (fastload/_engine.py): every worker starts on a sample at once."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import fastload
from helpers import MP_TIMEOUT

_fork = mp.get_context("fork")


@pytest.fixture(scope="module", autouse=True)
def _multiprocessing_heap():
    """The datasets' shared counters come from multiprocessing's heap, whose first arena (two
    fds on a deleted /dev/shm file) lives until the interpreter exits: create it before the
    leak check's snapshots (as tests/test_compat_chainer.py does)."""
    from multiprocessing import sharedctypes

    arena = sharedctypes.RawArray("b", 1 << 20)
    del arena
    yield


class Barrier:
    """Each __getitem__ waits until `workers` calls have begun (torch's DataLoader tests use
    such a dataset): it hangs any loader that starts one worker alone. Counts calls per index."""

    def __init__(self, n: int, workers: int, fail_at: int | None = None) -> None:
        self.n, self.workers, self.fail_at = n, workers, fail_at
        self.started = _fork.Value("i", 0)
        self.gate = _fork.Semaphore(0)
        self.calls = _fork.Array("i", n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.int64:
        with self.started.get_lock():
            self.started.value += 1
            if self.started.value == self.workers:
                self.gate.release()
        if not self.gate.acquire(timeout=MP_TIMEOUT):
            raise TimeoutError(f"sample {i}: the other workers never began a sample")
        self.gate.release()
        with self.calls.get_lock():
            self.calls[i] += 1
        if i == self.fail_at:
            raise KeyError(f"no sample {i}")
        return np.int64(i)


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("workers", [2, 4, 8])
def test_a_barrier_of_n_workers_passes(workers):
    ds = Barrier(64, workers)
    with fastload.Loader(ds, 4, num_workers=workers, start_method="fork", timeout=30) as loader:
        assert [int(x) for b in loader for x in b] == list(range(64))
        assert [int(x) for b in loader for x in b] == list(range(64))  # and the next epoch


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_the_first_sample_is_loaded_once(num_workers):
    ds = Barrier(12, 1)
    with fastload.Loader(ds, 4, num_workers=num_workers, prefetch=1,
                         start_method="fork" if num_workers else None) as loader:
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        # the probe's sample was packed into batch 0, not loaded again (the next epoch's
        # batch 0 cannot be queued yet: at most one batch is in flight)
        assert ds.calls[0] == 1 and list(ds.calls[:4]) == [1, 1, 1, 1]


@pytest.mark.timeout(MP_TIMEOUT)
def test_an_error_in_a_warm_up_sample_names_it_when_its_batch_comes():
    ds = Barrier(16, 2, fail_at=4)  # the first sample of batch 1: worker 1 loads it at start
    with fastload.Loader(ds, 4, num_workers=2, start_method="fork", timeout=30) as loader:
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        with pytest.raises(KeyError, match="no sample 4") as info:
            next(it)
    assert info.value.fastload_index == 4
