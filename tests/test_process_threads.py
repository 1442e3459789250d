"""Hosted thread workers, ``worker_method="process_threads"`` (NOTE [hosted threads] in
fastload/_host.py): the workers are threads of one helper process, with the batches of worker
processes and of ``num_workers=0``; a death is the host's, and a restart starts a new one."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import numpy as np
import pytest

import fastload
from helpers import MP_TIMEOUT
from helpers.datasets import RaisesAt, Range
from helpers.faults import KillAt
from helpers.hosted import RebuildFails, WhoHolds, memfd_mappings
from helpers.iterables import Split
from helpers.pool import failing_init
from helpers.ragged import Tokens, assert_same

pytestmark = pytest.mark.timeout(MP_TIMEOUT)

HOSTED = dict(worker_method="process_threads")


def _batches(ds: Any, epochs: int = 2, **kw: Any) -> list[Any]:
    with fastload.Loader(ds, **{"batch_size": 4, "timeout": 30, **kw}) as loader:
        return [b.copy() if isinstance(b, np.ndarray) else b
                for e in range(epochs) for b in loader]


CASES = {
    "shuffled": (lambda: Range(30, (3,)), dict(shuffle=True, seed=5)),
    "ragged": (lambda: Tokens(21), dict(ragged="pad", shuffle=True, seed=2)),
    "skip": (lambda: RaisesAt(20, (3, 11)), dict(on_error="skip", seed=4)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_batches_of_one_process_and_of_worker_processes(case):
    make, kw = CASES[case]
    want = _batches(make(), num_workers=0, **kw)
    assert_same(_batches(make(), num_workers=3, **HOSTED, **kw), want)
    assert_same(_batches(make(), num_workers=2, **kw), want)  # worker processes


def test_a_plain_iterable_split_by_worker_info():
    got = sorted(i for b in _batches(Split(23), num_workers=3, **HOSTED) for i in b.tolist())
    assert got == sorted(list(range(23)) * 2)


def test_the_threads_share_one_process_one_dataset_and_one_mapping():
    # NOTE [one mapping per process] (_region.py): the host's threads borrow the first thread's
    # mapping of the region and of the pool's bell
    with fastload.Loader(WhoHolds(48, 0.002), 4, num_workers=3, share_rows=False,
                         **HOSTED) as ld:
        rows = np.concatenate([b for b in ld])
        pids = set(ld._worker_pids())
        assert len(pids) == 1 and pids != {os.getpid()}
        (host,) = pids
        assert memfd_mappings(host) == 2  # the region and the bell, once each
        stats = ld.stats()
        assert ld.worker_method == "process_threads"
        assert stats["start_method"] == "fork"
        assert "process_threads" in stats["start_method_reason"]
    assert sorted(rows[:, 0].tolist()) == list(range(48))
    assert set(rows[:, 1].tolist()) == {host} and len(set(rows[:, 2].tolist())) == 1
    assert not os.path.exists(f"/proc/{host}")  # close() left no host behind


def test_an_error_keeps_its_type_and_index():
    with fastload.Loader(RaisesAt(12, (6,)), 4, num_workers=2, timeout=30, **HOSTED) as ld:
        it = iter(ld)
        assert next(it).tolist() == [0, 1, 2, 3]
        with pytest.raises(ValueError, match="sample 6 is bad") as info:
            next(it)
        assert info.value.fastload_index == 6
        assert next(it).tolist() == [8, 9, 10, 11]


def test_a_killed_host_raises_worker_died(tmp_path):
    ds = KillAt(40, 13, flag_path=str(tmp_path / "killed"))
    with fastload.Loader(ds, 4, num_workers=2, timeout=30, **HOSTED) as ld:
        with pytest.raises(fastload.WorkerDied, match="SIGKILL"):
            for _ in ld:
                pass
        assert sum(len(b[0]) for b in ld) == 40  # a new host serves the next epoch


def test_a_killed_host_restarts_with_exact_batches(tmp_path):
    ds = KillAt(40, 13, flag_path=str(tmp_path / "killed"))
    kw = dict(shuffle=True, seed=3)
    want = [b.tolist() for b in _batches(Range(40), epochs=1, num_workers=0, **kw)]
    with fastload.Loader(ds, 4, num_workers=3, timeout=30, on_worker_death="restart",
                         **HOSTED, **kw) as ld:
        first = set(ld._worker_pids())
        got = [b[0].tolist() for b in ld]
        after = set(ld._worker_pids())
        assert ld.stats()["worker_restarts"] == 3  # every thread of the host, one new host
    assert got == want
    assert len(first) == len(after) == 1 and first != after


def test_a_host_killed_from_outside_mid_epoch(tmp_path):
    with fastload.Loader(WhoHolds(64, 0.003), 4, num_workers=2, timeout=30,
                         on_worker_death="restart", **HOSTED) as ld:
        it = iter(ld)
        got = [next(it)[:, 0].tolist() for _ in range(3)]
        (host,) = set(ld._worker_pids())
        os.kill(host, signal.SIGKILL)
        got += [b[:, 0].tolist() for b in it]
        assert set(ld._worker_pids()) != {host}
    assert sum(got, []) == list(range(64))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawn_and_forkserver_hosts(method):
    kw = dict(shuffle=True, seed=7)
    want = _batches(Range(18, (2,)), num_workers=0, **kw)
    with fastload.Loader(Range(18, (2,)), 4, num_workers=2, start_method=method, timeout=30,
                         **HOSTED, **kw) as ld:
        got = [b.copy() for e in range(2) for b in ld]
        assert ld.stats()["start_method"] == method
    assert_same(got, want)


def test_a_pool_unpickles_a_loaders_dataset_once_per_host():
    with fastload.Pool(3, start_method="spawn", **HOSTED) as pool:
        assert pool.worker_method == "process_threads"
        a = fastload.Loader(WhoHolds(24, 0.002), 4, pool=pool, share_rows=False)
        b = fastload.Loader(Range(10), 5, pool=pool, shuffle=True, seed=1)
        rows = np.concatenate([x for x in a])
        got_b = [x.tolist() for x in b]
        assert a.worker_method == "process_threads"
        a.close()
        b.close()
    assert len(set(rows[:, 1].tolist())) == 1 and len(set(rows[:, 2].tolist())) == 1
    assert got_b == [x.tolist() for x in fastload.Loader(Range(10), 5, shuffle=True, seed=1,
                                                         num_workers=0)]


@pytest.mark.parametrize("kw, match", [
    (dict(worker_method="threads"), "'process', 'thread' or 'process_threads'"),
    (dict(worker_method="process_threads", start_method="thread"), "start_method must be"),
])
def test_bad_arguments_say_what_to_do(kw, match):
    with pytest.raises(ValueError, match=match):
        fastload.Loader(Range(4), 2, num_workers=1, **kw)


def test_a_loader_on_another_kind_of_pool_is_refused():
    with fastload.Pool(1, worker_method="thread") as pool:
        with pytest.raises(ValueError, match="conflicts with the pool's worker_method='thread'"):
            fastload.Loader(Range(4), 2, pool=pool, **HOSTED)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
def test_close_leaves_no_host_after_a_partial_epoch():
    ld = fastload.Loader(WhoHolds(400, 0.001), 4, num_workers=2, **HOSTED)
    it = iter(ld)
    next(it)
    (host,) = set(ld._worker_pids())
    ld.close()
    assert not os.path.exists(f"/proc/{host}")


def test_a_failing_worker_init_raises_every_time():
    # a thread's failed start ends its host (a death is the host's), and its error still
    # reaches the loader, at every attempt
    with fastload.Loader(Range(10), 2, num_workers=2, worker_init=failing_init,
                         timeout=30, **HOSTED) as ld:
        for _ in range(3):
            with pytest.raises(OSError, match=r"worker [01]: no accelerator here"):
                next(iter(ld))


@pytest.mark.parametrize("method", ["process", "process_threads"])
def test_a_dataset_the_host_cannot_unpickle_raises_its_error(method):
    with fastload.Loader(RebuildFails(), 4, num_workers=2, start_method="spawn", timeout=30,
                         worker_method=method) as ld:
        with pytest.raises(ValueError, match="cannot rebuild this dataset"):
            next(iter(ld))
