"""fastload.Pool: one set of worker processes serving several loaders."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import time

import pytest

import fastload
from helpers import MP_TIMEOUT
from helpers.datasets import InitRecorder, Raises, Range, WorkerInfoDataset
from helpers.faults import KillAt
from helpers.pool import PICKLED, CountsPickles, Tagged, Unpicklable, failing_init, worker_memfds

pytestmark = pytest.mark.timeout(MP_TIMEOUT)


def _pids(pool: fastload.Pool) -> list[int]:
    return [p.pid for p in pool._workers.procs]


def _memfds_become(pids: list[int], n: int, timeout: float = 5.0) -> bool:
    """Whether every worker maps ``n`` fastload regions within ``timeout`` (workers handle
    messages between waits of at most 0.1 s)."""
    deadline = time.monotonic() + timeout
    while any(worker_memfds(pid) != n for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _expected(dataset, batch_size, epochs, **kw):
    with fastload.Loader(dataset, batch_size, num_workers=0, **kw) as ref:
        return [[b.tolist() for b in ref] for _ in range(epochs)]


def _tolist(batch):
    return batch.tolist() if hasattr(batch, "tolist") else [x.tolist() for x in batch]


def test_two_loaders_interleaved(start_method):
    train_ds, val_ds = Tagged(37, 1), Tagged(23, 2)
    want_train = _expected(train_ds, 4, 2, shuffle=True, seed=5)
    want_val = _expected(val_ds, 5, 2)
    with fastload.Pool(2, start_method=start_method) as pool:
        train = fastload.Loader(train_ds, 4, shuffle=True, seed=5, pool=pool)
        val = fastload.Loader(val_ds, 5, pool=pool)
        assert train.start_method == val.start_method == pool.start_method == start_method
        for epoch in range(2):
            got_t, got_v = [], []
            it_t, it_v = iter(train), iter(val)
            done_t = done_v = False
            while not (done_t and done_v):  # strictly alternating next() calls
                if not done_t:
                    b = next(it_t, None)
                    done_t = b is None
                    if b is not None:
                        got_t.append(b.tolist())
                if not done_v:
                    b = next(it_v, None)
                    done_v = b is None
                    if b is not None:
                        got_v.append(b.tolist())
            assert got_t == want_train[epoch]
            assert got_v == want_val[epoch]
        train.close()
        val.close()


def test_dataset_is_sent_once_and_workers_persist():
    PICKLED[0] = 0
    with fastload.Pool(2) as pool:
        pids = _pids(pool)
        loader = fastload.Loader(CountsPickles(40), 8, shuffle=True, seed=0, pool=pool)
        assert PICKLED[0] == 1  # once for every worker, not once per worker or per epoch
        for _ in range(3):
            assert sum(len(b[0]) for b in loader) == 40
        assert PICKLED[0] == 1
        assert _pids(pool) == pids
        loader.close()


def test_first_batch_on_a_warm_pool_starts_no_process():
    with fastload.Pool(2) as pool:
        with fastload.Loader(Range(10), 2, pool=pool) as warm:
            list(warm)
        before = {p.pid for p in mp.active_children()}
        with fastload.Loader(Range(10, (4,)), 2, pool=pool) as loader:
            first = next(iter(loader))
            assert first.tolist() == [[0] * 4, [1] * 4]
            assert {p.pid for p in mp.active_children()} == before


def test_closing_a_loader_leaves_the_pool_running_and_detaches_it():
    with fastload.Pool(2) as pool:
        pids = _pids(pool)
        assert _memfds_become(pids, 1)  # the bell
        loader = fastload.Loader(Range(20, (1000,)), 4, pool=pool)
        list(loader)
        assert _memfds_become(pids, 2)  # the bell and the loader's region
        loader.close()
        assert _memfds_become(pids, 1)  # the region was unmapped
        assert _pids(pool) == pids and all(p.is_alive() for p in pool._workers.procs)
        with pytest.raises(fastload.LoaderClosedError, match="close"):
            next(iter(loader))
        with fastload.Loader(Range(6), 3, pool=pool) as again:
            assert [b.tolist() for b in again] == [[0, 1, 2], [3, 4, 5]]
        assert _pids(pool) == pids


def _settled_fd_counts(pids, quiet_s=0.2, limit_s=5.0):
    """The workers' open-fd counts once they have stopped changing for `quiet_s`.

    A worker handles a loader's detach message after the loader's close() returns, and holds an
    fd or two for a moment while it does; a count read then (CI saw [9, 11] and later [9, 9])
    is not the worker's resting state.
    """
    deadline = time.monotonic() + limit_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = [len(os.listdir(f"/proc/{pid}/fd")) for pid in pids]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
        time.sleep(0.02)
    raise AssertionError(f"the workers' fd counts kept changing for {limit_s} s (last {last})")


def test_many_loaders_on_one_pool_do_not_accumulate():
    with fastload.Pool(2) as pool:
        pids = _pids(pool)
        with fastload.Loader(Tagged(9, 0), 4, pool=pool) as loader:
            list(loader)  # the workers have mapped the bell and handled one loader
        assert _memfds_become(pids, 1)
        fds = _settled_fd_counts(pids)
        for k in range(30):
            with fastload.Loader(Tagged(9, k), 4, pool=pool) as loader:
                assert [b.tolist() for b in loader][-1] == [8000 + k]
        assert _memfds_become(pids, 1)
        assert _settled_fd_counts(pids) == fds
        assert len(pool._workers.payloads) == 0 and len(pool._workers.inbox) == 0


def test_closing_the_pool_closes_its_loaders():
    pool = fastload.Pool(2)
    loader = fastload.Loader(Range(20), 4, pool=pool)
    it = iter(loader)
    next(it)
    pids = _pids(pool)
    pool.close()
    assert pool.closed and all(p is None for p in pool._workers.procs)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)  # exited and reaped
    with pytest.raises(fastload.LoaderClosedError, match="Pool was closed"):
        next(it)
    with pytest.raises(fastload.LoaderClosedError, match="Pool is closed"):
        fastload.Loader(Range(4), 2, pool=pool)
    pool.close()  # idempotent
    loader.close()


def test_dropping_the_pool_object_keeps_its_loaders_working():
    pool = fastload.Pool(2)
    loader = fastload.Loader(Range(12), 4, pool=pool)
    del pool
    gc.collect()
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    loader.close()
    gc.collect()  # the last reference to the pool is gone with the loader's engine
    del loader
    gc.collect()


def test_worker_death_restarts_the_worker_for_every_loader(tmp_path):
    flag = str(tmp_path / "killed")
    other_ds = Tagged(40, 7)
    want_other = _expected(other_ds, 4, 1)[0]
    with fastload.Pool(2) as pool:
        victim = fastload.Loader(KillAt(40, 13, flag_path=flag), 4, pool=pool,
                                 on_worker_death="restart")
        other = fastload.Loader(other_ds, 4, pool=pool)
        got_v, got_o = [], []
        for bv, bo in zip(victim, other):
            got_v.append(bv[0].tolist())
            got_o.append(bo.tolist())
        assert sum(got_v, []) == list(range(40))
        assert got_o == want_other
        assert pool._workers.restarts == 1
        assert victim.stats()["worker_restarts"] == other.stats()["worker_restarts"] == 1
        # the restarted worker serves both loaders again
        assert sum(len(b[0]) for b in victim) == 40
        assert [b.tolist() for b in other] == want_other
        victim.close()
        other.close()


def test_worker_death_raises_only_in_the_loader_it_hit(tmp_path):
    flag = str(tmp_path / "killed")
    with fastload.Pool(2) as pool:
        victim = fastload.Loader(KillAt(40, 13, flag_path=flag), 4, pool=pool)
        other = fastload.Loader(Tagged(40, 7), 4, pool=pool)
        with pytest.raises(fastload.WorkerDied, match="sample index 13"):
            for _ in victim:
                pass
        assert [b.tolist() for b in other] == _expected(Tagged(40, 7), 4, 1)[0]
        assert sum(len(b[0]) for b in victim) == 40  # the next epoch runs normally
        victim.close()
        other.close()


def test_errors_stay_with_their_loader():
    with fastload.Pool(2) as pool:
        bad = fastload.Loader(Raises(20, 6, KeyError), 4, pool=pool)
        good = fastload.Loader(Range(20), 4, pool=pool)
        with pytest.raises(KeyError, match="6"):
            list(bad)
        assert [b.tolist() for b in good][0] == [0, 1, 2, 3]
        bad.close()
        good.close()


def test_worker_info_names_the_loaders_dataset():
    with fastload.Pool(2, seed=3) as pool:
        for n in (8, 12):
            with fastload.Loader(WorkerInfoDataset(n), 4, pool=pool) as loader:
                rows = [r for b in loader for r in zip(*(x.tolist() for x in b))]
                assert [r[0] for r in rows] == list(range(n))
                assert {r[1] for r in rows} <= {0, 1}
                assert all(r[2] == 2 and r[3] == 3 and r[4] for r in rows)


def test_worker_init_runs_once_per_worker(tmp_path):
    with fastload.Pool(2, worker_init=InitRecorder(str(tmp_path))) as pool:
        for _ in range(3):
            with fastload.Loader(Range(8), 4, pool=pool) as loader:
                list(loader)
    assert sorted(n.split("-")[1] for n in os.listdir(tmp_path)) == ["0", "1"]


def test_sample_rng_and_shuffle_follow_the_loaders_seed():
    from helpers.datasets import Range as R

    ds = R(16)
    with fastload.Pool(2) as pool:
        a = [b.tolist() for b in fastload.Loader(ds, 4, shuffle=True, seed=9, pool=pool)]
    b = [b.tolist() for b in fastload.Loader(ds, 4, shuffle=True, seed=9, num_workers=0)]
    assert a == b


def test_resume_across_pool_and_private_workers():
    ds = Tagged(30, 0)
    with fastload.Pool(2) as pool:
        first = fastload.Loader(ds, 4, shuffle=True, seed=2, pool=pool)
        it = iter(first)
        head = [next(it).tolist() for _ in range(3)]
        state = first.state_dict()
        first.close()
    with fastload.Loader(ds, 4, shuffle=True, seed=0, num_workers=1) as second:
        second.load_state_dict(state)
        tail = [b.tolist() for b in second]
    assert head + tail == _expected(ds, 4, 1, shuffle=True, seed=2)[0]


def test_argument_errors():
    with fastload.Pool(1) as pool:
        with pytest.raises(ValueError, match="num_workers=3 conflicts with the pool's num_workers=1"):
            fastload.Loader(Range(4), 2, pool=pool, num_workers=3)
        other = "spawn" if pool.start_method != "spawn" else "fork"
        with pytest.raises(ValueError, match="start_method"):
            fastload.Loader(Range(4), 2, pool=pool, start_method=other)
        with pytest.raises(ValueError, match="worker_init"):
            fastload.Loader(Range(4), 2, pool=pool, worker_init=print)
        with pytest.raises(TypeError, match="cannot be pickled.*shared fastload.Pool"):
            fastload.Loader(Unpicklable(4), 2, pool=pool)
        # the same num_workers is fine, and the pool still works after the refusals
        with fastload.Loader(Range(4), 2, pool=pool, num_workers=1) as ok:
            assert [b.tolist() for b in ok] == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match="fastload.Pool"):
        fastload.Loader(Range(4), 2, pool=object())
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="num_workers"):
            fastload.Pool(bad)
    with pytest.raises(ValueError, match="start_method"):
        fastload.Pool(1, start_method="thread")
    with pytest.raises(TypeError, match="worker_init"):
        fastload.Pool(1, worker_init=3)


def test_empty_dataset_on_a_pool():
    with fastload.Pool(1) as pool:
        with fastload.Loader(Range(0), 2, pool=pool) as loader:
            assert list(loader) == []


def test_pool_refuses_another_process():
    with fastload.Pool(1) as pool:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                fastload.Loader(Range(4), 2, pool=pool)
                os.write(w, b"no error")
            except RuntimeError as e:
                os.write(w, str(e).encode()[:200])
            os._exit(0)
        os.close(w)
        msg = os.read(r, 300).decode()
        os.close(r)
        os.waitpid(pid, 0)
        assert "only be used in the process that created it" in msg


def test_pool_repr_and_interrupt_free_close():
    pool = fastload.Pool(2)
    assert "num_workers=2" in repr(pool) and "0 loaders" in repr(pool)
    loader = fastload.Loader(Range(8), 2, pool=pool)
    assert "1 loaders" in repr(pool)
    pool.close()
    assert "closed" in repr(pool)
    del loader


def test_sigkill_between_epochs_is_restarted_quietly():
    # Between epochs the workers may be prefetching the next one: "restart" re-queues that.
    with fastload.Pool(2) as pool:
        loader = fastload.Loader(Range(20), 4, pool=pool, on_worker_death="restart")
        list(loader)
        os.kill(pool._workers.procs[1].pid, signal.SIGKILL)
        pool._workers.procs[1].join(5)
        time.sleep(0.2)  # the loader checks its workers at least every 0.1 s
        assert [b.tolist() for b in loader][-1] == [16, 17, 18, 19]
        assert pool._workers.restarts == 1
        loader.close()


@pytest.mark.parametrize("shared", [True, False])
def test_failing_worker_init_raises_every_time(shared):
    # Workers whose worker_init fails exit after reporting it; they must not wait on the fd
    # the parent sent at start (a regression: the second attempt hung).
    pool = fastload.Pool(2, worker_init=failing_init) if shared else None
    kw = {"pool": pool} if shared else {"num_workers": 2, "worker_init": failing_init}
    loader = fastload.Loader(Range(10), 2, **kw)
    for _ in range(3):
        with pytest.raises(OSError, match=r"worker [01]: no accelerator here"):
            next(iter(loader))
    loader.close()
    if pool is not None:
        pool.close()


def test_dataset_class_unknown_to_the_workers_is_a_clear_error(tmp_path):
    # The class is defined after the pool's workers were forked: they cannot unpickle it.
    script = tmp_path / "late.py"
    script.write_text(
        "import fastload, numpy as np\n"
        "pool = fastload.Pool(1, start_method='fork')\n"
        "class DS:\n"
        "    def __len__(self): return 4\n"
        "    def __getitem__(self, i): return np.float32(i)\n"
        "loader = fastload.Loader(DS(), 2, pool=pool)\n"
        "try:\n"
        "    list(loader)\n"
        "except fastload.WorkerError as e:\n"
        "    print('ERROR', e)\n"
        "pool.close()\n"
    )
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("ERROR")][0]
    assert "could not unpickle the dataset" in line and "Can't get attribute 'DS'" in line
    assert "before the Pool is created" in line


def test_two_loaders_in_two_threads(tmp_path):
    # A shared pool's loaders may live in different threads (e.g. validation in the background),
    # including when a worker dies and is restarted under both of them.
    import threading

    flag = str(tmp_path / "killed")
    ds_a, ds_b = KillAt(300, 123, flag_path=flag), Tagged(200, 9)
    want_b = _expected(ds_b, 8, 3, shuffle=True, seed=4)
    results: dict[str, object] = {}
    with fastload.Pool(2) as pool:
        a = fastload.Loader(ds_a, 8, pool=pool, on_worker_death="restart")
        b = fastload.Loader(ds_b, 8, shuffle=True, seed=4, pool=pool)

        def run(name, loader, fn):
            try:
                results[name] = [[fn(x) for x in loader] for _ in range(3)]
            except BaseException as e:  # reported below
                results[name] = e

        threads = [
            threading.Thread(target=run, args=("a", a, lambda x: x[0].tolist())),
            threading.Thread(target=run, args=("b", b, lambda x: x.tolist())),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(MP_TIMEOUT)
        assert not any(t.is_alive() for t in threads)
        assert not isinstance(results["a"], BaseException), results["a"]
        assert not isinstance(results["b"], BaseException), results["b"]
        assert [sum(ep, []) for ep in results["a"]] == [list(range(300))] * 3
        assert results["b"] == want_b
        assert pool._workers.restarts == 1
        a.close()
        b.close()


@pytest.mark.crash
@pytest.mark.timeout(60)
def test_a_death_noticed_in_another_thread_is_raised_by_the_loader_that_lost_it():
    """The pool's check() in another thread (another loader's, here the test's) sees the death
    first: the waiting loader's slot is abandoned under it, and it must raise WorkerDied, not
    deliver that slot or fail inside."""
    import threading

    from helpers.faults import SlowThenExit

    with fastload.Pool(2) as pool:
        loader = fastload.Loader(SlowThenExit(16, 5, 0.5), 4, pool=pool)
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(_outcome(loader)))
        t.start()
        while t.is_alive():  # "another loader's thread": checks the pool as fast as it can
            pool._workers.check()
        t.join()
        assert len(got) == 1 and isinstance(got[0], fastload.WorkerDied), got
        assert "EXIT(7)" in str(got[0]) and "sample index 5" in str(got[0])
        loader.close()


def _outcome(loader):
    try:
        return [b.tolist() for b in loader]
    except BaseException as e:  # what the loader's own thread raised
        return e


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["_refill", "_wait_slot", "_worker_batch"])
def test_a_pool_closed_at_any_step_of_a_batch_gives_loader_closed_error(where):
    """Pool.close() from another thread may land between any two steps of the loader's thread
    (CI saw it between delivery and the refill's bell ring: "ValueError: the bell is closed").
    Here the close is made to land just before each step, deterministically: always
    LoaderClosedError, never what the closed bell, ring or slots raised on the way."""
    pool = fastload.Pool(2)
    loader = fastload.Loader(Range(64), 4, pool=pool)
    eng = loader._engine
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    owner = eng.sched if where == "_refill" else eng  # the refill step is the scheduler's
    step = getattr(owner, where.lstrip("_") if owner is eng.sched else where)

    def closed_first(*args):
        pool.close()
        return step(*args)

    setattr(owner, step.__name__, closed_first)
    with pytest.raises(fastload.LoaderClosedError, match="closed"):
        for _ in range(16):
            next(it)
    assert pool.closed


@pytest.mark.timeout(90)
def test_closing_the_pool_while_another_thread_waits_for_a_batch():
    """The waiting thread is inside the C wait on the loader's region: closing must not unmap
    it there (the process died with SIGSEGV) but wake it with LoaderClosedError."""
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).parent)
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from helpers.pool import close_pool_under_a_waiting_thread as run\n"
            "run()\n" % tests)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=80)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stdout,
                                                                   proc.stderr[-2000:])


@pytest.mark.timeout(60)
def test_a_large_dataset_reaches_pool_workers_in_a_memfd(start_method, monkeypatch):
    """16 MiB of pickled dataset to every worker of a running pool: no large pipe write (the
    parent would wait in send() under the pool's lock while a worker waits to send to it)."""
    from fastload import _pool
    from helpers.pool import Heavy

    made = []
    real = _pool._memfd_of
    monkeypatch.setattr(_pool, "_memfd_of", lambda data: made.append(len(data)) or real(data))
    with fastload.Pool(2, start_method=start_method) as pool:
        with fastload.Loader(Heavy(16), 8, pool=pool) as loader:
            got = [b[:, 0].tolist() for b in loader]
        with fastload.Loader(Range(6), 3, pool=pool) as small:  # small ones stay on the pipe
            assert [b.tolist() for b in small] == [[0, 1, 2], [3, 4, 5]]
    assert got == [[i * 1000 for i in range(k, k + 8)] for k in range(0, 32, 8)]
    assert len(made) == 2 and min(made) > 16 << 20  # one memfd per worker, the whole dataset


@pytest.mark.timeout(60)
def test_sigusr1_makes_a_worker_print_where_it_is_and_go_on(capfd):
    import signal as _signal

    with fastload.Loader(Range(40), 4, num_workers=1, start_method="fork") as loader:
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        pid = loader._engine.pool.procs[0].pid
        os.kill(pid, _signal.SIGUSR1)
        deadline = time.monotonic() + 10
        err = ""
        while "Thread" not in err and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capfd.readouterr().err
        assert "Thread" in err and "_worker.py" in err  # faulthandler's dump of its stacks
        assert [b.tolist() for b in it][-1] == [36, 37, 38, 39]  # and it goes on
