"""io_concurrency=k: each worker keeps k samples of its batch loading at once (NOTE [reads in
flight] in fastload/_io.py), here against a loopback HTTP server with 50 ms per read; rows,
batches, errors, skips, resume and timeouts as with one read at a time. Speed is measured in
benchmarks/bench_remote.py, not here."""

from __future__ import annotations

import time

import numpy as np
import pytest

import fastload
from fastload.errors import LoaderTimeoutError
from tests.helpers.remote import AsyncRemote, Remote, SampleServer, Stuck, write_samples

N = 48


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("samples")
    write_samples(str(root), N)
    s = SampleServer(str(root), latency=0.05)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _idle_after(request):
    """Reads a closed loader left in flight (read ahead) finish on the server before the leak
    check counts its sockets."""
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").wait_idle()


def _epoch(dataset, **kw):
    kw.setdefault("batch_size", 8)
    with fastload.Loader(dataset, shuffle=True, seed=4, **kw) as loader:
        return [b for b in loader]


def _same(a, b):
    assert len(a) == len(b)
    for (x1, r1, _), (x2, r2, _) in zip(a, b):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(r1, r2)  # sample_rng() in a read thread: the same draw


def test_the_same_batches_as_one_read_at_a_time(server, start_method):
    ref = _epoch(Remote(server.url, N), num_workers=0)
    assert sorted(np.concatenate([x[:, 0] for x, _, _ in ref]).tolist()) == list(range(N))
    _same(_epoch(Remote(server.url, N), num_workers=0, io_concurrency=8), ref)
    got = _epoch(Remote(server.url, N), num_workers=2, io_concurrency=8,
                 start_method=start_method)
    _same(got, ref)
    # get_worker_info() in a read thread is its worker's
    assert set(np.concatenate([w for _, _, w in got]).tolist()) <= {0, 1}


def test_an_async_getitem_is_awaited(server):
    ref = _epoch(Remote(server.url, N), num_workers=0)
    for workers, k in ((0, 1), (0, 8), (2, 8)):
        got = _epoch(AsyncRemote(server.url, N), num_workers=workers, io_concurrency=k,
                     start_method="fork")
        _same(got, ref)


def test_an_error_keeps_its_type_and_index_and_the_epoch_goes_on(server):
    with fastload.Loader(Remote(server.url, 24, bad=(13,)), 8, num_workers=2,
                         io_concurrency=8, start_method="fork") as loader:
        it = iter(loader)
        assert next(it)[0][:, 0].tolist() == list(range(8))
        with pytest.raises(KeyError) as info:
            next(it)
        assert "sample index 13" in str(info.value)
        assert next(it)[0][:, 0].tolist() == list(range(16, 24))


def test_skips_replace_as_with_one_read(server):
    kw = dict(on_error="skip", num_workers=0)
    ref = _epoch(Remote(server.url, N, bad=(3, 4, 30)), **kw)
    _same(_epoch(Remote(server.url, N, bad=(3, 4, 30)), io_concurrency=8, **kw), ref)


def test_a_resume_reads_only_what_it_delivers(server):
    ref = _epoch(Remote(server.url, N), num_workers=0)
    with fastload.Loader(Remote(server.url, N), 8, shuffle=True, seed=4, num_workers=2,
                         io_concurrency=8, start_method="fork") as loader:
        it = iter(loader)
        head = [next(it) for _ in range(2)]
        state = loader.state_dict()
    with fastload.Loader(Remote(server.url, N), 8, shuffle=True, seed=4, num_workers=1,
                         io_concurrency=4, start_method="fork") as loader:
        loader.load_state_dict(state)
        tail = list(loader)
    _same(head + tail, ref)


def test_a_stuck_read_times_out_naming_its_sample_and_close_does_not_wait():
    ds = Stuck(16, stuck=5, stuck_s=20)
    loader = fastload.Loader(ds, 8, num_workers=1, io_concurrency=4, timeout=1.5,
                             start_method="fork")
    it = iter(loader)
    with pytest.raises(LoaderTimeoutError, match="sample index 5"):
        next(it)
    t = time.monotonic()
    loader.close()
    assert time.monotonic() - t < 10
    # in this process: close() leaves the stuck daemon thread behind, never waits for it
    loader = fastload.Loader(Stuck(16, stuck=9, stuck_s=3), 8, num_workers=0, io_concurrency=4)
    it = iter(loader)
    assert next(it)[:, 0].tolist() == list(range(8))
    loader.close()


@pytest.mark.parametrize("value", [0, -1, 1.5, "4", True])
def test_bad_values_are_refused(value):
    with pytest.raises((TypeError, ValueError), match="io_concurrency"):
        fastload.Loader(Stuck(4, -1, 0), 2, num_workers=0, io_concurrency=value)


def test_a_worker_killed_with_two_batches_in_flight_loses_nothing(tmp_path):
    # the worker holds the batch it fills and the one it took ahead (NOTE [reads in flight]);
    # both go back to the ring when it dies, and the restarted worker loads them again
    from tests.helpers.faults import KillFirstTimes

    with fastload.Loader(KillFirstTimes(64, bad=21, times=1, flag_dir=str(tmp_path)), 8,
                         num_workers=2, io_concurrency=4, on_worker_death="restart",
                         start_method="fork") as loader:
        out = np.concatenate([idx for idx, _ in loader])
        assert loader.stats()["worker_restarts"] == 1
    assert out.tolist() == list(range(64))


@pytest.mark.parametrize("how", ["thread", "pool", "unstacked", "ragged"])
def test_reads_in_flight_meet_the_other_features(server, how):
    # thread workers, a shared pool, stack=False and ragged leaves: the same samples and draws
    # as one read at a time in this process
    ref = _epoch(Remote(server.url, N), num_workers=0)
    kw: dict = {"num_workers": 2, "io_concurrency": 6}
    if how == "thread":
        kw["worker_method"] = "thread"
    elif how == "unstacked":
        kw.update(stack=False, start_method="fork")
    elif how == "ragged":
        kw.update(ragged={"sample[0]": "list"}, start_method="fork")
    else:
        kw["start_method"] = "fork"
    if how == "pool":
        with fastload.Pool(2, start_method="fork") as pool:
            kw.pop("num_workers")
            kw.pop("start_method")
            got = _epoch(Remote(server.url, N), pool=pool, **kw)
    else:
        got = _epoch(Remote(server.url, N), **kw)
    if how == "unstacked":  # each batch: a list of (array, draw, worker) samples
        got = [(np.stack([s[0] for s in b]), np.array([s[1] for s in b]), None) for b in got]
    elif how == "ragged":
        got = [(np.stack(x), r, w) for x, r, w in got]
    _same(got, ref)
