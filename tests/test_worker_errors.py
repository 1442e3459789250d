"""Errors in user code, dying workers and hanging workers: what the caller sees, how fast, and
that the loader stays usable afterwards."""

from __future__ import annotations

import multiprocessing as mp
import re
import signal
import time

import pytest

import fastload

from helpers import MP_TIMEOUT, read_flag
from helpers.datasets import CustomError, Raises, TwoArgError, UnpicklableError
from helpers.faults import ExitAt, HangAt, KillAt, SegfaultAt

pytestmark = pytest.mark.timeout(MP_TIMEOUT)

#: How soon after a worker dies the caller must get WorkerDied ("within ~1-2 s").
DEATH_DEADLINE_S = 2.0
#: timeout=2 must raise "within ~3 s" of starting to wait for the hanging batch.
HANG_TIMEOUT_S = 2.0
HANG_DEADLINE_S = 3.5
#: close() after a hang must be prompt.
CLOSE_DEADLINE_S = 5.0


def error_text(exc: BaseException) -> str:
    """What the user sees: the message plus any notes (PEP 678)."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


def full_epoch(loader) -> tuple[list[int], set[int]]:
    """(indices in order, pids that loaded them) for datasets returning (i, pid)."""
    idx, pids = [], set()
    for b in loader:
        idx += b[0].tolist()
        pids.update(b[1].tolist())
    return idx, pids


def run_until_error(loader):
    """Iterate until an exception; returns (exception, delivered indices, seconds that the
    failing next() call took, monotonic time when it raised)."""
    delivered = []
    it = iter(loader)
    while True:
        t = time.monotonic()
        try:
            b = next(it)
        except StopIteration:
            pytest.fail(f"no error raised; delivered {delivered}")
        except Exception as e:  # noqa: BLE001 - the exception is the result
            now = time.monotonic()
            return e, delivered, now - t, now
        delivered += b[0].tolist()
        del b


# -- exceptions in __getitem__ ------------------------------------------------------------------
EXCEPTIONS = [
    (KeyError, ("missing-key",)),
    (ValueError, ("bad value",)),
    (CustomError, ("custom failure",)),
    (ZeroDivisionError, ("divided",)),
]


@pytest.mark.parametrize("exc_type, args", EXCEPTIONS, ids=[e[0].__name__ for e in EXCEPTIONS])
@pytest.mark.parametrize("nw", [0, 2])
def test_exception_is_reraised_with_its_type_index_and_traceback(nw, exc_type, args, tmp_path):
    bad = 9
    ds = Raises(20, bad, exc_type, args, flag_path=str(tmp_path / "flag"))
    with fastload.Loader(ds, 4, num_workers=nw) as loader:
        e, delivered, _, _ = run_until_error(loader)
        assert type(e) is exc_type, f"{type(e).__name__}: {e}"
        text = error_text(e)
        assert f"index {bad}" in text, text
        assert args[0] in text, text
        assert "_raise_from_user_code" in text, text  # the worker's traceback
        assert delivered == list(range(8))
        # The loader stays usable: the next epoch completes, every index exactly once.
        assert [i for b in loader for i in b[0].tolist()] == list(range(20))


@pytest.mark.parametrize("nw", [0, 2])
def test_epoch_after_an_error_keeps_the_seeded_order(nw, tmp_path):
    """Order depends only on (seed, epoch): an epoch that ended in an error does not shift it."""
    with fastload.Loader(Raises(24, -1, ValueError), 4, shuffle=True, seed=21, num_workers=0) as ref:
        orders = [[i for b in ref for i in b[0].tolist()] for _ in range(3)]
    bad = orders[0][9]  # in the third batch of epoch 0
    ds = Raises(24, bad, ValueError, ("once",), flag_path=str(tmp_path / "flag"))
    with fastload.Loader(ds, 4, shuffle=True, seed=21, num_workers=nw) as loader:
        e, delivered, _, _ = run_until_error(loader)
        assert type(e) is ValueError and f"index {bad}" in str(e)
        assert delivered == orders[0][:8]
        assert [i for b in loader for i in b[0].tolist()] == orders[1]
        assert [i for b in loader for i in b[0].tolist()] == orders[2]


@pytest.mark.parametrize("nw", [0, 2])
def test_exception_in_the_first_sample(nw, tmp_path):
    """The first sample of an epoch is also the one the layout is computed from."""
    ds = Raises(10, 0, CustomError, ("first!",), flag_path=str(tmp_path / "flag"))
    with fastload.Loader(ds, 3, num_workers=nw) as loader:
        e, delivered, _, _ = run_until_error(loader)
        assert type(e) is CustomError
        assert "index 0" in error_text(e) and "first!" in error_text(e)
        assert "_raise_from_user_code" in error_text(e)
        assert delivered == []
        assert [i for b in loader for i in b[0].tolist()] == list(range(10))


@pytest.mark.parametrize("nw", [0, 2])
def test_exception_with_unusual_constructor_keeps_type_and_context(nw, tmp_path):
    # 40 samples, not 12: the queue runs ahead into the next epoch, and with only 3 batches per
    # epoch a worker could load epoch 1's index 5 (claiming the one-shot flag) before epoch 0's.
    ds = Raises(40, 5, TwoArgError, (42, "detail text"), flag_path=str(tmp_path / "flag"))
    with fastload.Loader(ds, 4, num_workers=nw) as loader:
        e, _, _, _ = run_until_error(loader)
        assert type(e) is TwoArgError
        assert e.code == 42 and e.detail == "detail text"
        text = error_text(e)
        assert "index 5" in text and "_raise_from_user_code" in text, text
        assert [i for b in loader for i in b[0].tolist()] == list(range(40))


@pytest.mark.parametrize("nw", [0, 2])
def test_exception_that_cannot_be_rebuilt_is_a_worker_error(nw, tmp_path):
    # 40 samples: with only 3 batches per epoch the queue, running ahead into epoch 1, could load
    # epoch 1's index 6 (claiming the one-shot flag) before epoch 0's.
    ds = Raises(40, 6, UnpicklableError, ("holds a lock",), flag_path=str(tmp_path / "flag"))
    with fastload.Loader(ds, 4, num_workers=nw) as loader:
        e, _, _, _ = run_until_error(loader)
        assert type(e) is fastload.WorkerError
        text = error_text(e)
        assert "UnpicklableError" in text and "holds a lock" in text, text
        assert "index 6" in text and "_raise_from_user_code" in text, text
        assert [i for b in loader for i in b[0].tolist()] == list(range(40))


@pytest.mark.parametrize("nw", [0, 2])
def test_worker_error_cause_is_the_remote_traceback(nw):
    """fastload.errors.WorkerError: "``__cause__`` is the original exception when it could be
    unpickled, else a RemoteTraceback" (the traceback text, kept for the user)."""
    ds = Raises(6, 2, UnpicklableError, ("holds a lock",))
    with fastload.Loader(ds, 2, num_workers=nw) as loader:
        e, _, _, _ = run_until_error(loader)
    assert type(e) is fastload.WorkerError
    assert isinstance(e.__cause__, fastload.errors.RemoteTraceback), repr(e.__cause__)
    assert "_raise_from_user_code" in str(e.__cause__)


@pytest.mark.parametrize("nw", [0, 2])
def test_every_epoch_raises_while_the_error_persists(nw):
    with fastload.Loader(Raises(8, 3, ValueError, ("always",)), 2, num_workers=nw) as loader:
        for _ in range(3):
            with pytest.raises(ValueError, match="index 3"):
                for _b in loader:
                    pass


def test_exception_type_survives_every_start_method(start_method, tmp_path):
    ds = Raises(10, 7, KeyError, ("k",), flag_path=str(tmp_path / "flag"))
    with fastload.Loader(ds, 2, num_workers=2, start_method=start_method) as loader:
        e, delivered, _, _ = run_until_error(loader)
        assert type(e) is KeyError
        assert "index 7" in str(e) and "_raise_from_user_code" in str(e)
        assert delivered == list(range(6))
        assert [i for b in loader for i in b[0].tolist()] == list(range(10))


# -- dying workers ---------------------------------------------------------------------------------
def _check_death(loader, flag, name, bad, n):
    e, delivered, _, raised_at = run_until_error(loader)
    assert type(e) is fastload.WorkerDied, f"{type(e).__name__}: {e}"
    assert isinstance(e, RuntimeError)
    dead_pid, died_at = read_flag(flag)
    late = raised_at - died_at
    assert late < DEATH_DEADLINE_S, f"WorkerDied came {late:.2f}s after the worker died"
    msg = str(e)
    assert f"pid {dead_pid}" in msg, msg
    assert name in msg, msg
    assert bad not in delivered
    assert loader.stats()["worker_restarts"] >= 1
    # The next epoch completes on a restarted worker.
    idx, pids = full_epoch(loader)
    assert idx == list(range(n))
    assert dead_pid not in pids
    assert len(mp.active_children()) == loader.num_workers
    return e


@pytest.mark.crash
@pytest.mark.parametrize(
    "make, name",
    [
        (lambda flag: KillAt(30, 13, signal.SIGKILL, flag_path=flag), "SIGKILL(-9)"),
        (lambda flag: KillAt(30, 13, signal.SIGTERM, flag_path=flag), "SIGTERM(-15)"),
        (lambda flag: ExitAt(30, 13, 3, flag_path=flag), "EXIT(3)"),
        (lambda flag: SegfaultAt(30, 13, flag_path=flag), "SIGSEGV(-11)"),
    ],
    ids=["sigkill", "sigterm", "exit3", "segfault"],
)
def test_dead_worker_raises_worker_died_quickly(make, name, tmp_path):
    flag = str(tmp_path / "flag")
    with fastload.Loader(make(flag), 2, num_workers=2) as loader:
        _check_death(loader, flag, name, 13, 30)


@pytest.mark.crash
def test_sigkill_with_every_start_method(start_method, tmp_path):
    flag = str(tmp_path / "flag")
    with fastload.Loader(KillAt(20, 9, flag_path=flag), 2, num_workers=2,
                         start_method=start_method) as loader:
        _check_death(loader, flag, "SIGKILL(-9)", 9, 20)


@pytest.mark.crash
def test_epoch_after_a_crash_keeps_the_seeded_order(tmp_path):
    with fastload.Loader(KillAt(24, -1), 4, shuffle=True, seed=5, num_workers=0) as ref:
        orders = [[i for b in ref for i in b[0].tolist()] for _ in range(3)]
    bad = orders[0][13]
    flag = str(tmp_path / "flag")
    with fastload.Loader(KillAt(24, bad, flag_path=flag), 4, shuffle=True, seed=5,
                         num_workers=2) as loader:
        e, delivered, _, _ = run_until_error(loader)
        assert type(e) is fastload.WorkerDied
        assert delivered == orders[0][: len(delivered)] and bad not in delivered
        assert [i for b in loader for i in b[0].tolist()] == orders[1]
        assert [i for b in loader for i in b[0].tolist()] == orders[2]


@pytest.mark.crash
def test_worker_dies_on_the_first_sample(tmp_path):
    flag = str(tmp_path / "flag")
    with fastload.Loader(KillAt(10, 0, flag_path=flag), 2, num_workers=2) as loader:
        _check_death(loader, flag, "SIGKILL(-9)", 0, 10)


@pytest.mark.crash
def test_worker_died_names_the_sample_index(tmp_path):
    flag = str(tmp_path / "flag")
    with fastload.Loader(ExitAt(16, 11, 3, flag_path=flag), 4, num_workers=1) as loader:
        e, _, _, _ = run_until_error(loader)
        assert type(e) is fastload.WorkerDied
        assert "index 11" in str(e), str(e)


@pytest.mark.crash
def test_dying_every_epoch_keeps_raising_and_restarting():
    with fastload.Loader(ExitAt(12, 5, 4), 2, num_workers=2) as loader:
        for k in range(3):
            with pytest.raises(fastload.WorkerDied, match=r"EXIT\(4\)"):
                for _b in loader:
                    pass
        assert loader.stats()["worker_restarts"] >= 3


# -- hanging workers -------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [5, 0], ids=["later-sample", "first-sample"])
def test_hang_raises_loader_timeout_naming_index_and_worker(bad, tmp_path):
    flag = str(tmp_path / "flag")
    loader = fastload.Loader(HangAt(20, bad, flag_path=flag), 2, num_workers=2,
                             timeout=HANG_TIMEOUT_S)
    try:
        e, delivered, took, _ = run_until_error(loader)
        assert isinstance(e, fastload.LoaderTimeoutError), f"{type(e).__name__}: {e}"
        assert isinstance(e, TimeoutError)
        assert HANG_TIMEOUT_S * 0.95 <= took < HANG_DEADLINE_S, took
        hung_pid, _ = read_flag(flag)
        msg = str(e)
        assert f"index {bad}" in msg, msg
        assert re.search(r"worker \d+", msg) or f"pid {hung_pid}" in msg, msg
        assert bad not in delivered
    finally:
        t = time.monotonic()
        loader.close()
        closing = time.monotonic() - t
    assert closing < CLOSE_DEADLINE_S, closing
    assert mp.active_children() == []


def test_slow_but_not_hanging_sample_is_fine(tmp_path):
    """A sample slower than the poll interval but well within timeout= is not an error."""
    with fastload.Loader(HangAt(8, 3, seconds=0.5), 2, num_workers=2, timeout=5) as loader:
        assert full_epoch(loader)[0] == list(range(8))


def test_close_during_a_hang_is_prompt():
    loader = fastload.Loader(HangAt(8, 2), 2, num_workers=2)
    it = iter(loader)
    assert next(it)[0].tolist() == [0, 1]
    t = time.monotonic()
    loader.close()
    assert time.monotonic() - t < CLOSE_DEADLINE_S
    assert mp.active_children() == []
    with pytest.raises(fastload.LoaderClosedError):
        next(it)


# on_worker_death="restart": tests/test_faults.py


# -- NOTE [errors do not end the epoch] --------------------------------------------------------
def _catching(it) -> tuple[list[int], list[str]]:
    """Iterate as a user who catches per batch and goes on."""
    got, errors = [], []
    while True:
        try:
            b = next(it)
        except StopIteration:
            return got, errors
        except ValueError as e:
            errors.append(re.search(r"sample \d+ is bad", str(e)).group(0))
            continue
        got += b.tolist()


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("bad", [(0,), (9,), (19,), (0, 5, 13, 19)],
                         ids=["first sample", "middle", "last", "several"])
def test_the_next_next_goes_on_after_a_batch_raised(nw, bad):
    from helpers.datasets import RaisesAt

    with fastload.Loader(RaisesAt(20, bad), 4, num_workers=nw) as loader:
        got, errors = _catching(iter(loader))
        lost = {i for i in range(20) if i // 4 in {b // 4 for b in bad}}
        assert got == [i for i in range(20) if i not in lost]  # every other batch, in order
        assert errors == [f"sample {b} is bad" for b in sorted(set(bad))]
        # The loader and its workers are still fine: the next epoch raises the same way.
        assert _catching(iter(loader)) == (got, errors)


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("nw", [0, 2])
def test_a_state_taken_after_an_error_resumes_after_the_failed_batch(nw):
    from helpers.datasets import RaisesAt

    ds = RaisesAt(24, (9,))
    with fastload.Loader(ds, 4, shuffle=True, seed=5, num_workers=nw) as loader:
        it = iter(loader)
        seen = []
        while True:
            try:
                seen.append(next(it).tolist())
            except ValueError:
                state = loader.state_dict()
                break
        rest = _catching(it)[0]
    with fastload.Loader(ds, 4, shuffle=True, num_workers=0) as again:
        again.load_state_dict(state)
        assert _catching(iter(again))[0] == rest
    assert 9 not in rest and len(seen) * 4 + 4 + len(rest) == 24
