"""Thread workers, ``worker_method="thread"`` (NOTE [thread workers] in fastload/_threads.py):
the same batches as worker processes and as ``num_workers=0``, through the same ring and fill;
errors, timeouts, a stuck sample and shared pools."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest

import fastload
from helpers import MP_TIMEOUT
from helpers.datasets import Nested, RaisesAt, Range
from helpers.iterables import Split
from helpers.ragged import Tokens, assert_same
from helpers.shared_rows import FailLate, Who

pytestmark = pytest.mark.timeout(MP_TIMEOUT)


@pytest.fixture(autouse=True)
def no_thread_left():
    """Every worker thread ends with its loader or pool (none stuck in these tests)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while (left := [t for t in threading.enumerate() if t not in before and t.is_alive()]):
        assert time.monotonic() < deadline, f"threads left running: {left}"
        time.sleep(0.01)


class Augmented:
    """Random augmentation through sample_rng(): the same numbers whoever loads the sample."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> np.ndarray:
        return np.float64(i) + fastload.sample_rng().normal(size=3)


class GilFree:
    """A large NumPy operation per sample (releases the GIL): a sum over 1 MB."""

    def __init__(self, n: int) -> None:
        self.n, self.data = n, np.arange(1 << 17, dtype=np.float64)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([i, float(np.sum(self.data * i))])


def _batches(ds: Any, **kw: Any) -> list[Any]:
    with fastload.Loader(ds, **{"batch_size": 4, "timeout": 30, **kw}) as loader:
        return [b.copy() if isinstance(b, np.ndarray) else b for e in range(2) for b in loader]


CASES = {
    "shuffled": (lambda: Range(30, (3,)), dict(shuffle=True, seed=5)),
    "nested": (lambda: Nested(18), dict(seed=1)),
    "ragged": (lambda: Tokens(21), dict(ragged="pad", shuffle=True, seed=2)),
    "unstacked": (lambda: Tokens(13), dict(stack=False)),
    "augmented": (Augmented, dict(shuffle=True, seed=9)),
    "skip": (lambda: RaisesAt(20, (3, 11)), dict(on_error="skip", seed=4)),
    "shared_rows": (lambda: Who(16, 0.004), dict(batch_size=8)),
    "gil_free": (lambda: GilFree(12), dict(shuffle=True, seed=3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("nw", [1, 3])
def test_threads_give_the_batches_of_one_process(case, nw):
    make, kw = CASES[case]
    want = _batches(make(), num_workers=0, **kw)
    got = _batches(make(), num_workers=nw, worker_method="thread", **kw)
    if case == "shared_rows":  # column 1 says which worker loaded it: only the indices agree
        got, want = [b[:, 0] for b in got], [b[:, 0] for b in want]
    assert_same(got, want)


def test_threads_give_the_batches_of_worker_processes():
    kw = dict(shuffle=True, seed=8, num_workers=2)
    assert_same(_batches(Tokens(25), worker_method="thread", ragged="pad", **kw),
                _batches(Tokens(25), start_method="fork", ragged="pad", **kw))


def test_a_plain_iterable_split_by_worker_info():
    got = sorted(i for b in _batches(Split(23), num_workers=3, worker_method="thread")
                 for i in b.tolist())
    assert got == sorted(list(range(23)) * 2)


def test_worker_info_is_per_thread():
    seen: set[tuple[int, int]] = set()

    class Who2:
        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int) -> np.ndarray:
            info = fastload.get_worker_info()
            assert info is not None and info.dataset is self
            seen.add((info.id, threading.get_ident()))
            time.sleep(0.002)
            return np.int64(info.id)

    with fastload.Loader(Who2(), 2, num_workers=3, worker_method="thread",
                         share_rows=False) as loader:
        ids = {int(i) for b in loader for i in b.tolist()}
        assert loader.worker_method == "thread" and loader.start_method == "thread"
    assert ids <= {0, 1, 2} and len({t for _, t in seen}) == len({w for w, _ in seen})
    assert fastload.get_worker_info() is None  # the main thread is no worker


def test_the_dataset_is_the_users_object_never_pickled():
    class Unpicklable:
        def __init__(self) -> None:
            self.lock = threading.Lock()  # would fail to pickle
            self.calls = 0

        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> np.int64:
            with self.lock:
                self.calls += 1
            return np.int64(i)

    ds = Unpicklable()
    with fastload.Loader(ds, 4, num_workers=2, worker_method="thread") as loader:
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ds.calls >= 8  # its own counter: the workers used this very object


def test_an_error_keeps_its_type_and_index():
    with fastload.Loader(RaisesAt(12, (6,)), 4, num_workers=2, worker_method="thread",
                         timeout=30) as loader:
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        with pytest.raises(ValueError, match="sample 6 is bad") as info:
            next(it)
        assert info.value.fastload_index == 6
        assert next(it).tolist() == [8, 9, 10, 11]


def test_a_shared_batch_raises_its_lowest_failing_row():
    with fastload.Loader(FailLate(16, {5: 0.0, 2: 0.3}), 8, num_workers=4,
                         worker_method="thread", timeout=30) as loader:
        with pytest.raises(KeyError, match="sample 2 is broken"):
            next(iter(loader))


def test_a_pool_of_threads_serves_two_loaders():
    with fastload.Pool(2, worker_method="thread") as pool:
        a = fastload.Loader(Range(10), 5, pool=pool, shuffle=True, seed=1)
        b = fastload.Loader(Range(6, (2,)), 3, pool=pool)
        assert a.worker_method == "thread"
        got_a = [x.tolist() for x in a]
        got_b = [x[:, 0].tolist() for x in b]
        a.close()
        b.close()
    with fastload.Loader(Range(10), 5, shuffle=True, seed=1, num_workers=0) as ref:
        assert got_a == [x.tolist() for x in ref]
    assert got_b == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("kw, match", [
    (dict(worker_method="threads"), "worker_method must be 'process', 'thread' or"),
    (dict(worker_method="thread", start_method="fork"), "leave start_method unset"),
])
def test_bad_arguments_say_what_to_do(kw, match):
    with pytest.raises(ValueError, match=match):
        fastload.Loader(Range(4), 2, num_workers=1, **kw)


def test_a_timeout_names_the_sample_and_close_does_not_wait_for_a_stuck_thread(tmp_path):
    # A thread cannot be killed: the sample stays stuck, but the loader says which one, and
    # close() and the interpreter's exit come back in bounded time (a fresh interpreter, so
    # that the stuck thread cannot outlive this test in this process).
    script = textwrap.dedent("""
        import time, numpy as np, fastload
        class Stuck:
            def __len__(self): return 8
            def __getitem__(self, i):
                if i == 5:
                    time.sleep(600)
                return np.int64(i)
        loader = fastload.Loader(Stuck(), 4, num_workers=2, worker_method="thread",
                                 timeout=1.5, share_rows=False)
        it = iter(loader)
        print(next(it).tolist(), flush=True)
        try:
            next(it)
        except fastload.LoaderTimeoutError as e:
            print("TIMEOUT", e, flush=True)
        t = time.monotonic()
        loader.close()
        print("CLOSED %.1f" % (time.monotonic() - t), flush=True)
    """)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=40, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[0, 1, 2, 3]"
    assert lines[1].startswith("TIMEOUT") and "sample index 5" in lines[1], lines
    assert "worker thread" in lines[1] and "fastload-worker-" in lines[1], lines
    closed = float(lines[2].split()[1])
    assert closed < 6, lines  # bounded (2 s per join step), not the sample's 600 s
    assert time.monotonic() - t0 < 30  # and the interpreter exited with the thread stuck


def test_eight_threads_hammer_one_ring():
    # Many threads taking pieces of the same shared batches and whole batches of one ring at
    # once (csrc/tests/test_ring.c runs the same protocol under TSan with C threads): every
    # batch is the single process's, three epochs running.
    kw = dict(batch_size=16, shuffle=True, seed=11)
    want = _batches(Who(200, 0.0005), num_workers=0, **kw)
    got = _batches(Who(200, 0.0005), num_workers=8, worker_method="thread", prefetch=3, **kw)
    assert_same([b[:, 0] for b in got], [b[:, 0] for b in want])
    assert len({int(w) for b in got for w in b[:, 1]}) > 1  # several threads loaded them


def _memfd_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("/memfd:fastload" in line for line in f)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd and /proc: Linux")
def test_threads_write_through_the_loaders_own_mapping():
    # NOTE [one mapping per process] (_region.py): a thread borrows the region's mapping and
    # the pool's bell, so four threads add no mapping (mapped per thread: 2 + 2 x 4)
    before = _memfd_mappings()
    with fastload.Loader(Range(64), 8, num_workers=4, worker_method="thread") as ld:
        assert [int(b[0]) for b in ld] == list(range(0, 64, 8))
        assert _memfd_mappings() - before == 2  # the region and the pool's bell, once each


def test_threads_keep_one_batch_each_plus_prefetch_in_flight():
    # NOTE [thread depth] (_config.py): one slot per thread plus prefetch, not prefetch each
    with fastload.Loader(Range(64), 8, num_workers=4, prefetch=2,
                         worker_method="thread") as ld:
        assert ld.stats()["nslots"] == 4 + 2 + 3  # + max_held
        assert [int(b[0]) for b in ld] == list(range(0, 64, 8))
    with fastload.Loader(Range(64), 8, num_workers=2, prefetch=2,
                         worker_method="thread") as ld:
        assert ld.stats()["nslots"] == 2 * 2 + 3  # as many as two worker processes
