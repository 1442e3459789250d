"""Fault handling beyond plain errors: recovery after worker death, steady-but-slow loading,
lying datasets, object arrays, and where the shared region lives."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest
from helpers import read_flag, shm
from helpers.faults import ExitAt, KillFirstTimes, LiesAboutLen, ObjectArrays, Steady

import fastload


@pytest.mark.crash
@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_restart_policy_recomputes_the_lost_batch(tmp_path, start_method):
    ds = KillFirstTimes(40, bad=13, times=2, flag_dir=str(tmp_path))
    with fastload.Loader(ds, 4, num_workers=2, on_worker_death="restart",
                         start_method=start_method) as loader:
        got = [i for b in loader for i in b[0].tolist()]
        assert got == list(range(40)), "every sample exactly once, in order"
        assert loader.stats()["worker_restarts"] == 2
        dead = {read_flag(str(tmp_path / name))[0] for name in ("kill", "kill.1")}
        again = list(loader)
        assert [i for b in again for i in b[0].tolist()] == list(range(40))
        assert not dead & {p for b in again for p in b[1].tolist()}  # served by fresh workers


@pytest.mark.crash
@pytest.mark.timeout(60)
@pytest.mark.parametrize("make, index, code", [
    (lambda d: KillFirstTimes(40, bad=13, times=10, flag_dir=d), 13, "SIGKILL(-9)"),
    (lambda d: ExitAt(12, 5, 4), 5, "EXIT(4)"),
], ids=["sigkill", "exit"])
def test_restart_policy_gives_up_on_a_sample_that_kills_three_workers(tmp_path, make, index, code):
    with fastload.Loader(make(str(tmp_path)), 4, num_workers=2,
                         on_worker_death="restart") as loader:
        t0 = time.monotonic()
        with pytest.raises(fastload.WorkerDied, match=re.escape(code)) as info:
            for _ in loader:
                pass
        # 3 is the limit; a worker that prefetches the next epoch's copy of the batch can die on
        # the same sample in the same check (one count more).
        kills = re.search(rf"Sample index {index} killed a worker (\d+) times", str(info.value))
        assert kills is not None and int(kills.group(1)) in (3, 4), str(info.value)
        assert time.monotonic() - t0 < 10
        assert loader.stats()["worker_restarts"] >= 3


def test_bad_on_worker_death_value():
    with pytest.raises(ValueError, match="on_worker_death must be 'raise' or 'restart'"):
        fastload.Loader(Steady(4, 0), 2, num_workers=0, on_worker_death="ignore")


@pytest.mark.timeout(60)
def test_steady_slow_loader_never_times_out():
    # Each batch takes ~0.2 s (4 samples x 0.05 s) against a 1 s timeout; the epoch takes ~2 s.
    with fastload.Loader(Steady(40, 0.05), 4, num_workers=1, timeout=1.0) as loader:
        t0 = time.monotonic()
        assert [i for b in loader for i in b.tolist()] == list(range(40))
        assert time.monotonic() - t0 > 1.5  # the epoch outlasted the timeout


@pytest.mark.parametrize("nw", [0, 2])
def test_len_that_lies_names_the_index(nw):
    with fastload.Loader(LiesAboutLen(12, 9), 4, num_workers=nw) as loader:
        with pytest.raises(IndexError, match=r"sample index 9"):
            for _ in loader:
                pass


@pytest.mark.parametrize("nw", [0, 2])
def test_object_arrays_are_pickled_not_copied_as_pointers(nw):
    with fastload.Loader(ObjectArrays(), 3, num_workers=nw) as loader:
        batches = list(loader)
    assert isinstance(batches[0], list) and len(batches[0]) == 3
    for b, start in zip(batches, (0, 3)):
        for k, arr in enumerate(b):
            assert arr.dtype == object and arr.tolist() == [start + k, "x", None]


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create is Linux-only")
def test_region_is_an_anonymous_memfd_not_in_dev_shm():
    before = shm.snapshot()
    with fastload.Loader(Steady(8, 0), 4, num_workers=1) as loader:
        next(iter(loader))
        fd = loader._engine.slots.region.fd
        target = os.readlink(f"/proc/self/fd/{fd}")
        assert target.startswith("/memfd:fastload"), target
        assert shm.own_new_entries(before, shm.mark_process_tree()) == []  # this run's
        # Nobody else can open it by name: it has none. Only processes allowed to ptrace us
        # (same user) could reach it through /proc/<pid>/fd.
        assert not os.path.exists("/dev/shm/fastload")


@pytest.mark.crash
@pytest.mark.timeout(60)
def test_worker_killed_while_idle_is_restarted_quietly():
    import signal

    from fastload import _ring

    # One batch per epoch, and at most one prefetched: wait until that batch is published, so
    # that no worker holds anything when one is killed (a batch is loaded while QUEUED: NOTE
    # [pieces] in csrc/fl_ring.c).
    with fastload.Loader(Steady(4, 0), 4, num_workers=2, prefetch=1) as loader:
        assert [i for b in loader for i in b.tolist()] == list(range(4))
        eng = loader._engine
        deadline = time.monotonic() + 10
        ring = eng.slots.ring
        loading = (_ring.QUEUED, _ring.CLOSING)
        while any(ring.slot_info(s)["state"] in loading for s in range(ring.nslots)):
            assert time.monotonic() < deadline, "the prefetched batch was never published"
            time.sleep(0.01)
        victim = eng.pool.procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(5)
        # Epochs go on, complete and without an error; the dead idle worker is noticed by the
        # parent's periodic liveness check and restarted.
        while loader.stats()["worker_restarts"] == 0:
            assert time.monotonic() < deadline, "the idle worker's death went unnoticed"
            assert [i for b in loader for i in b.tolist()] == list(range(4))
            time.sleep(0.02)
        assert [i for b in loader for i in b.tolist()] == list(range(4))
        assert all(p.is_alive() for p in eng.pool.procs)


@pytest.mark.crash
@pytest.mark.timeout(60)
def test_a_failed_restart_raises_then_the_worker_is_started_again(tmp_path, monkeypatch):
    from fastload._pool import WorkerPool

    real = WorkerPool.start_worker
    calls = []

    def flaky(self, i):
        calls.append(i)
        if len(calls) == 3:  # the 2 workers started; the first restart hits EAGAIN
            raise BlockingIOError(11, "Resource temporarily unavailable (fork)")
        return real(self, i)

    monkeypatch.setattr(WorkerPool, "start_worker", flaky)
    ds = KillFirstTimes(40, bad=13, times=1, flag_dir=str(tmp_path))
    with fastload.Loader(ds, 4, num_workers=2, on_worker_death="restart", timeout=30) as loader:
        with pytest.raises(fastload.WorkerDied, match=r"could not start a worker again.*"
                           r"BlockingIOError.*tried again at the next batch"):
            list(loader)
        # the next epoch's first check (the loader checks the pool every 0.1 s) starts the
        # missing worker, and the epoch runs whole
        time.sleep(0.2)
        assert [i for b in loader for i in b[0].tolist()] == list(range(40))
        assert all(p is not None and p.is_alive() for p in loader._engine.pool.procs)
    assert len(calls) >= 4
