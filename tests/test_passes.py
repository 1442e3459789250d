"""Passes (fastload/_passes.py): the pure logic of live passes and the resume state, and the
engine failures that came from several owners of that state (each fails on the code before
the split: an interrupt inside next() skipped the rest of the epoch in the checkpoint, a death
between epochs ended the next one, a resumed loader raised the constructor's probe error, an
object leaf that does not unpickle here ended the epoch, max_skips counted across passes)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import uuid

import numpy as np
import pytest

import fastload
from fastload._passes import Passes
from helpers.passes import FailsAt, GatedAt, Marked, OnlyWorkersImport
from fastload.errors import LoaderTimeoutError, SkipLimitError

# -- the pure logic ------------------------------------------------------------------------------


def test_a_pass_starts_at_the_loaded_position_and_state_follows_the_oldest_live_pass():
    ps = Passes()
    assert ps.state() == (0, 0)
    ps.restore(3, 2)
    assert ps.state() == (3, 2)  # loaded, not yet iterated
    a = ps.start()
    assert (a.epoch, a.position) == (3, 2)
    a.position = 4
    b = ps.start()
    assert (b.epoch, b.position) == (4, 0)  # only the resumed epoch starts mid-way
    b.position = 1
    assert ps.state() == (3, 4)  # the oldest live pass
    ps.finish(a)
    assert ps.state() == (4, 1)
    ps.finish(b)
    assert ps.state() == (5, 0)


def test_a_pass_stopped_unfinished_is_where_state_resumes_until_a_newer_pass_starts():
    ps = Passes()
    a = ps.start()
    a.position = 3
    assert ps.stop(a) and not ps.stop(a)  # stopped once
    assert ps.state() == (0, 3)  # break, or an interrupt inside next()
    with pytest.raises(StopIteration):
        ps.get(0, a.token)
    b = ps.start()
    assert ps.state() == (1, 0)
    ps.finish(b)
    assert ps.state() == (2, 0)  # the stopped pass is no longer the newest


def test_dropped_iterators_are_only_noted_until_taken():
    ps = Passes()
    a, b = ps.start(), ps.start()
    ps.dropped(a.epoch, a.token)
    ps.dropped(b.epoch, b.token + 100)  # another pass's id: not b
    assert ps.is_live(0)
    assert ps.take_dropped() == [a]
    assert not ps.is_live(0) and ps.is_live(1)


def test_superseded_passes_say_why():
    ps = Passes()
    a = ps.start()
    assert ps.restore(0, 5) == [a]
    with pytest.raises(RuntimeError, match="superseded: load_state_dict"):
        ps.get(a.epoch, a.token)
    assert ps.start().position == 5


# -- the failures, end to end ---------------------------------------------------------------------


class Interrupted(Exception):
    """What a preemption handler raises."""


class InterruptedBase(KeyboardInterrupt):
    """Ctrl+C: with num_workers=0 the signal lands inside the sample's own code,
    where an Exception is that sample's error (the batch is consumed, as any sample error)."""


def _raiser(exc: type[BaseException]) -> object:
    def handler(*_: object) -> None:
        raise exc

    return handler


def _rows(b: np.ndarray) -> list[int]:
    return [int(v) for v in b[:, 0]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw, how", [(0, "signal"), (2, "signal"), (2, "timeout")])
def test_a_checkpoint_after_an_interrupt_inside_next_resumes_at_the_lost_batch(nw, how,
                                                                              tmp_path):
    # batch 3 holds a sample that cannot load while the gate is closed: the interrupt lands
    # while next() waits for (or, with num_workers=0, loads) it; the state saved then must
    # resume at batch 3, not at epoch 1
    kw = dict(batch_size=2, num_workers=nw, prefetch=1, shuffle=True, seed=5)
    order = [_rows(b) for b in fastload.Loader(GatedAt(20), **kw)]
    gate = tmp_path / "gate"
    gate.touch()
    loader = fastload.Loader(GatedAt(20, slow=order[3][0], gate=str(gate)),
                             **kw, **({"timeout": 1.0} if how == "timeout" else {}))
    interrupted = InterruptedBase if nw == 0 else Interrupted
    old = signal.signal(signal.SIGALRM, _raiser(interrupted))
    try:
        it = iter(loader)
        assert [_rows(next(it)) for _ in range(3)] == order[:3]
        expected = interrupted if how == "signal" else LoaderTimeoutError
        if how == "signal":
            signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(expected):
            next(it)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        gate.unlink()
    state = loader.state_dict()
    loader.close()
    assert (state["epoch"], state["position"]) == (0, 3)
    with fastload.Loader(GatedAt(20), **kw) as resumed:
        resumed.load_state_dict(state)
        assert [_rows(b) for b in resumed] == order[3:]


def _alive(pid: int) -> bool:
    """Whether a thread of process ``pid`` still runs (a SIGKILLed worker's main thread is a
    zombie while its other threads exit; its pipes close only after the last one)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in "ZX":
                    return True
        except FileNotFoundError:
            continue
    return False


@pytest.mark.timeout(60)
def test_a_worker_killed_between_epochs_costs_the_next_epoch_nothing(caplog, tmp_path):
    # the queue runs ahead into epoch 1 while the user is between epochs; a worker killed then
    # (the OOM killer during validation), in the middle of a sample of epoch 1, is judged at
    # iter(): its batch is re-queued
    loader = fastload.Loader(Marked(8, 0.3, str(tmp_path)), batch_size=2, num_workers=2,
                             prefetch=2, on_worker_death="raise")
    with loader, caplog.at_level(logging.WARNING, logger="fastload"):
        assert [i for b in loader for i in _rows(b)] == list(range(8))
        seen = set(os.listdir(tmp_path))
        end = time.monotonic() + 10
        while not (new := set(os.listdir(tmp_path)) - seen) and time.monotonic() < end:
            time.sleep(0.005)  # until a worker begins a sample of epoch 1
        assert new, "no worker began a sample of epoch 1"
        victim = int(sorted(new)[0].split("-")[0])
        os.kill(victim, signal.SIGKILL)  # in the middle of that sample (0.3 s)
        while _alive(victim) and time.monotonic() < end:
            time.sleep(0.005)  # dead (a zombie) before iter(), as in validation
        assert [i for b in loader for i in _rows(b)] == list(range(8))
    assert "re-queued its batch of the next epoch" in caplog.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 2])
def test_resume_with_a_failing_first_sample_delivers_the_resumed_batches(nw):
    # the constructor probes sample 0 (epoch 0, batch 0); resumed at batch 2, its failure is
    # not the resumed batch's, and no batch is lost
    with fastload.Loader(FailsAt(10, (0,)), batch_size=2, num_workers=nw) as loader:
        state = loader.state_dict()
        state["position"] = 2
        loader.load_state_dict(state)
        assert [_rows(b) for b in loader] == [[4, 5], [6, 7], [8, 9]]
        with pytest.raises(ValueError, match="sample 0 is bad"):  # its own epoch still raises
            list(loader)


@pytest.mark.timeout(60)
def test_an_object_leaf_that_does_not_unpickle_here_names_its_batch_and_the_epoch_goes_on(
        tmp_path):
    module = f"fl_only_in_workers_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text("class Obj:\n    pass\n")
    ds = OnlyWorkersImport(8, str(tmp_path), module)
    with fastload.Loader(ds, batch_size=2, num_workers=2, start_method="fork") as loader:
        it = iter(loader)
        assert _rows(next(it)["x"]) == [0, 1]
        with pytest.raises(ModuleNotFoundError) as info:
            next(it)
        text = "\n".join(getattr(info.value, "__notes__", []))
        assert "batch 1 of epoch 0" in text and "[2, 3]" in text and "worker" in text
        assert [_rows(b["x"]) for b in it] == [[4, 5], [6, 7]]
    assert module not in sys.modules


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 2])
def test_max_skips_counts_each_pass_on_its_own(nw, caplog):
    ds = FailsAt(20, (1, 5, 9, 13, 17))  # five a pass
    kw = dict(batch_size=2, num_workers=nw, on_error="skip", max_skips=4)
    with fastload.Loader(FailsAt(20, (1, 5, 9)), **kw) as loader:
        assert sum(1 for _ in zip(loader, loader)) == 10  # 3 + 3 skips: each pass within 4
    with fastload.Loader(ds, **kw) as loader:
        train = iter(loader)
        for _ in range(5):  # samples 0..9: skips 1, 5, 9
            next(train)
        val = iter(loader)  # a validation pass on the same loader: its own count
        next(val)
        del val
        with pytest.raises(SkipLimitError) as info:
            for _ in train:
                pass
        assert [i for i, _ in info.value.skipped] == [1, 5, 9, 13, 17]
