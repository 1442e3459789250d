"""The engine's parts that need no worker process: config, deadline, death policy, messages,
the slot map, and the one fill path run in the main process."""

from __future__ import annotations

import math
import pickle
import time

import numpy as np
import pytest

import fastload
from fastload import _messages as m
from fastload import _ring
from fastload._config import LoaderConfig, PoolConfig, resolve_shard
from fastload._deaths import MAX_KILLS_PER_SAMPLE, DeathPolicy
from fastload._fill import BatchFiller
from fastload._ragged import VarImage, read_image
from fastload._remote import pack_exception, rebuild_exception
from fastload._slots import SlotTable
from fastload._wait import POLL_INTERVAL_S, Deadline


def loader_config(n=10, **kw):
    args = dict(batch_size=2, shuffle=False, seed=1, drop_last=False, num_workers=0, prefetch=2,
                start_method=None, worker_init=None, timeout=None, max_held=3, copy=False,
                on_worker_death="raise", shard=None, return_mask=False, batch_plan=None,
                on_stall=None, pool=None)
    args.update(kw)
    return LoaderConfig.build(n, **args)


def test_config_is_frozen_and_derives_the_slot_count():
    cfg = loader_config(num_workers=2, prefetch=3, max_held=4)
    assert (cfg.depth, cfg.nslots) == (6, 10)
    with pytest.raises(AttributeError):
        cfg.batch_size = 3  # type: ignore[misc]
    assert cfg.pool_config() == PoolConfig(2, None, None, 1)
    assert loader_config(n=0, num_workers=2).num_workers == 0  # nothing to load: no process
    assert loader_config(num_workers=0).depth == 1


@pytest.mark.parametrize("kw, match", [
    (dict(batch_size=0), "batch_size must be an int >= 1"),
    (dict(prefetch=True), "prefetch must be an int >= 1"),
    (dict(max_held=-1), "max_held must be an int >= 0"),
    (dict(timeout=0), "timeout must be None or > 0"),
    (dict(on_worker_death="ignore"), "on_worker_death must be"),
    (dict(num_workers=-1), "num_workers must be an int >= 0"),
    (dict(seed=-3), r"seed must be None or an int in \[0, 2\*\*63\)"),
    (dict(start_method="thread"), "start_method must be"),
    (dict(shard=(2, 2)), "0 <= rank < world_size"),
    (dict(on_stall=(1.0, None)), "on_stall must be"),
])
def test_config_rejects_bad_values_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        loader_config(**kw)


@pytest.mark.parametrize("kw, match", [
    (dict(share_dataset="False"), r"share_dataset must be True or False, got 'False' \(a str\)"),
    (dict(shuffle=2), r"shuffle must be True or False, got 2 \(an int\)"),
    (dict(stack=None), r"stack must be True or False, got None"),
])
def test_config_refuses_bools_that_are_not(kw, match):
    with pytest.raises(TypeError, match=match):
        loader_config(**kw)


def test_config_takes_numpy_bools_and_0_1_as_bools():
    cfg = loader_config(shuffle=np.bool_(True), drop_last=1, copy=0, share_rows=np.int8(0))
    assert (cfg.shuffle, cfg.drop_last, cfg.copy, cfg.share_rows) == (True, True, False, False)
    assert all(type(v) is bool for v in (cfg.shuffle, cfg.drop_last, cfg.copy, cfg.share_rows))


@pytest.mark.parametrize("kw", [dict(shuffle=True), dict(shard=(1, 2)), dict(shard="auto")])
def test_config_refuses_batch_plan_with_shuffle_or_shard(kw):
    with pytest.raises(ValueError, match="does not apply with batch_plan"):
        loader_config(batch_plan=lambda epoch: [[0]], **kw)


def test_pool_config_defaults_and_seed():
    cfg = PoolConfig.build(None, None, None, None)
    assert cfg.num_workers >= 1 and 0 <= cfg.seed < 2**63
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        PoolConfig.build(0, None, None, 0)
    with pytest.raises(TypeError, match="worker_init must be callable"):
        PoolConfig.build(1, None, 3, 0)


def test_shard_auto_reads_the_environment(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    assert resolve_shard("auto") == (0, 1)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    assert resolve_shard("auto") == (1, 3)
    monkeypatch.setenv("RANK", "x")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK='x' is not an integer"):
        resolve_shard("auto")


def test_deadline_bounds_each_wait_and_reports_a_stall_once():
    reports = []
    d = Deadline(None, (0.05, reports.append))
    assert 0 < d.step() <= 0.05
    d.check(lambda: "late")
    assert reports == []
    time.sleep(0.06)
    d.check(lambda: "late")
    d.check(lambda: "again")
    assert reports == ["late"]  # once per wait
    assert d.step() == POLL_INTERVAL_S  # no limit left: the poll interval bounds the wait
    d = Deadline(0.01, None)
    time.sleep(0.02)
    assert d.step() == 0
    with pytest.raises(fastload.LoaderTimeoutError, match=r"timeout=0.01s: stuck"):
        d.check(lambda: "stuck")


def test_deadline_stall_clock_can_start_late():
    reports = []
    d = Deadline(None, (0.01, reports.append), stall_now=False)
    assert d.stall_at == math.inf
    time.sleep(0.02)
    d.check(lambda: "x")
    assert reports == []
    d.start_stall()
    time.sleep(0.02)
    d.check(lambda: "x")
    assert reports == ["x"]


def test_death_policy_raise_restart_and_startup_failures():
    p = DeathPolicy("raise")
    v = p.judge([m.Death(1, 123, -9)], {1: [7]}, requeued=True)
    assert v.fatal and "worker 1 (pid 123) died with SIGKILL(-9) while loading sample index 7" \
        in str(v.error) and "on_worker_death='restart'" in str(v.error)
    v = p.judge([m.Death(0, 5, -9)], {}, requeued=False)  # idle: restarted quietly
    assert not v.fatal and v.error is None and "while idle; restarted it" in v.warning

    p = DeathPolicy("restart")
    for k in range(1, MAX_KILLS_PER_SAMPLE):
        v = p.judge([m.Death(0, k, -11)], {0: [4]}, requeued=True)
        assert not v.fatal and "re-queued its batch" in v.warning
    v = p.judge([m.Death(0, 9, -11)], {0: [4]}, requeued=True)
    assert v.fatal and f"Sample index 4 killed a worker {MAX_KILLS_PER_SAMPLE} times" in str(v.error)
    p.new_epoch()
    assert not p.judge([m.Death(0, 1, -11)], {0: [4]}, requeued=True).fatal

    p = DeathPolicy("restart")
    for _ in range(MAX_KILLS_PER_SAMPLE - 1):
        assert p.judge([m.Death(2, 1, 1, started=False)], {}, requeued=False).error is None
    v = p.judge([m.Death(2, 1, 1, started=False)], {}, requeued=False)
    assert not v.fatal and "fails while starting" in str(v.error)
    # a worker killed while idle after it had started (by the OOM killer, by another loader's
    # fault on a shared pool) is no start-up failure, however often it happens
    p = DeathPolicy("restart")
    for _ in range(2 * MAX_KILLS_PER_SAMPLE):
        assert p.judge([m.Death(2, 1, -9, started=True)], {}, requeued=False).error is None
    v = DeathPolicy("raise").judge([m.Death(0, 1, -7)], {0: [0]}, requeued=True)
    assert "SIGBUS: shared memory exhausted" in str(v.error)


def test_messages_pickle_and_compare_by_value():
    msgs = [m.Bell(4096), m.AddDataset(1, b"x"), m.Probe(1, 5, 8, 3, 0), m.Detach(2), m.Stop(),
            m.ProbeStarted(1), m.ProbeFailed(1, b"e"), m.BatchFailed(1, 3, 7, b"e"),
            m.Spill(1, 3, 7, b"o"), m.DatasetFailed(1, b"e"), m.InitFailed(b"e")]
    for msg in msgs:
        assert pickle.loads(pickle.dumps(msg)) == msg
    assert m.InitFailed(b"e").cid == -1


class _FakePool:
    """What a Mailbox uses of a WorkerPool: routed messages, liveness, pumping, checks."""

    def __init__(self):
        self.routed = []
        self.incarnation = [0]
        self.checks = 0

    def check(self):
        self.checks += 1  # restarting other dead workers: none here

    def take(self, cid):
        out, self.routed = self.routed, []
        return out

    alive = False  # "dead": take() returns what was sent without waiting

    def is_alive(self, worker, incarnation):
        return self.alive

    def pump(self, worker, timeout):
        time.sleep(timeout)

    def pid_of(self, worker):
        return 4242


def test_mailbox_never_hands_an_abandoned_batch_its_message():
    from fastload._mailbox import Mailbox

    pool = _FakePool()
    mail = Mailbox(pool, 7)
    # An abandoned batch (task 3) and the batch now delivered (task 9) in the same slot.
    pool.routed = [(0, m.Spill(7, 1, 3, b"old")), (0, m.Spill(7, 2, 5, b"other"))]
    assert mail.take(0, 1, 9) is None  # not the old batch's objects
    assert mail.msgs == {(2, 5, 0): m.Spill(7, 2, 5, b"other")}  # slot 1's task 3 is gone
    pool.routed = [(0, m.Spill(7, 1, 9, b"new"))]
    assert mail.take(0, 1, 9).image == b"new"
    # Another slot's older task may be another live pass's batch, delivered later (NOTE
    # [several passes]): it stays until that slot moves on.
    assert mail.take(0, 2, 5).image == b"other"
    pool.routed = [(0, m.Spill(7, 3, 4, b"a")), (0, m.Skipped(7, 3, 4, ())),
                   (0, m.Spill(7, 3, 6, b"b"))]
    mail.collect()  # filing task 6 of slot 3 drops what its task 4 left
    assert mail.msgs == {(3, 6, 0): m.Spill(7, 3, 6, b"b")} and mail.skips == {}


def test_collect_never_takes_the_pools_lock_under_its_own():
    """NOTE [lock order]: the pool's death callbacks take a mailbox's lock under the pool's, so
    a mailbox must not wait for the pool's lock while holding its own."""
    from fastload._mailbox import Mailbox

    class Strict(_FakePool):
        def take(self, cid):
            assert not mail.lock.locked(), "pool lock taken under the mailbox's lock"
            return super().take(cid)

    pool = Strict()
    mail = Mailbox(pool, 7)
    pool.routed = [(0, m.Spill(7, 1, 3, b"x"))]
    mail.collect()
    assert mail.msgs == {(1, 3, 0): m.Spill(7, 1, 3, b"x")}


def test_a_batch_message_that_never_comes_is_a_timeout_not_a_hang():
    from fastload._mailbox import Mailbox

    pool = _FakePool()
    pool.alive = True  # alive but silent: stopped (SIGSTOP) after marking its batch READY
    mail = Mailbox(pool, 7, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(fastload.LoaderTimeoutError, match=r"timeout=0.3s: worker 0 \(pid 4242\) "
                       r"finished the batch in slot 1 but has not sent"):
        mail.take(0, 1, 9)
    assert 0.3 <= time.monotonic() - t0 < 2
    assert pool.checks >= 2  # other workers' deaths are handled meanwhile


def test_a_redone_task_keeps_its_seq_and_its_place():
    """SlotTable.redo (a spilled batch whose worker died before sending it): the task is first
    in line again under its own seq. A new, larger seq would make the mailbox drop the next
    batch's message as "older" when taking this one (the soak found batches lost that way)."""
    layout = fastload.BatchLayout((np.zeros(2), "s"), 2)
    slots = SlotTable(layout, 3, {"copied_batches": 0})
    try:
        slots.queue(0, 0, np.array([0, 1]), 5)
        slots.queue(0, 1, np.array([2, 3]), 5)
        first = slots.inflight[0]
        t = slots.ring.take(0)
        assert t.slot == first.slot and slots.ring.done(t, 0)
        slots.inflight.popleft()
        slots.redo(first, 2)
        assert list(slots.inflight)[0] == first and [t.seq for t in slots.inflight] == [0, 1]
        info = slots.ring.slot_info(first.slot)
        assert info["state"] == _ring.QUEUED and info["seq"] == first.seq and info["count"] == 2
        assert slots.ring.take(0).slot == first.slot  # the lowest seq is taken first
    finally:
        slots.close()


def test_slot_table_tasks_round_trip_and_held_copies():
    layout = fastload.BatchLayout({"x": np.zeros(3, np.float32), "s": "a"}, 4)
    counters = {"copied_batches": 0}
    slots = SlotTable(layout, 3, counters)
    try:
        assert slots.can_queue(2)
        slots.queue(0, 0, np.array([5, 6, 7]), 99)
        task = slots.inflight[0]
        assert (task.seq, task.epoch, task.batch) == (0, 0, 0)
        assert slots.map.indices(task.slot, 3).tolist() == [5, 6, 7]
        assert slots.map.seed(task.slot) == 99
        slots.queue(0, 1, np.array([1]), 99)
        assert not slots.can_queue(2)  # depth reached
        slots.drop_tasks(0)  # unclaimed: cancelled, free again at once
        assert not slots.inflight and sorted(slots.free) == [0, 1, 2]
        # The variable image: written where the reader finds it, or refused when too large.
        small = VarImage(layout, ["a", "b"], 2)
        assert slots.map.write_image(0, small) == small.nbytes
        assert read_image(layout, slots.region.mm, slots.map.base(0) + layout.var_offset,
                          2) == (["a", "b"], {})
        assert slots.map.write_image(1, VarImage(layout, ["x" * layout.var_bytes], 1)) == 0
    finally:
        slots.close()


def test_one_fill_path_in_the_main_process_keeps_errors_and_context():
    class DS:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 3:
                raise KeyError("no sample 3")
            return np.float64(fastload.sample_rng().integers(1000))

    filler = BatchFiller(DS(), None)  # no fast path: one __getitem__ a sample
    layout, batch = filler.load(None, np.array([0, 1]), 2, seed=5, epoch=2)
    again = [np.float64(np.random.Generator(np.random.PCG64(np.random.SeedSequence([5, 2, i])))
                        .integers(1000)) for i in (0, 1)]
    assert batch.tolist() == again  # sample_rng() saw (seed, epoch, index)
    with pytest.raises(KeyError, match="no sample 3") as info:
        filler.load(layout, np.array([2, 3]), 2, seed=5, epoch=2)
    assert info.value.fastload_index == 3
    assert "the main process (num_workers=0)" in str(info.value)


def test_exception_wire_format_round_trip():
    try:
        raise ValueError("bad sample")
    except ValueError as e:
        payload = pack_exception(e, 12, 3)
    exc = rebuild_exception(payload)
    assert type(exc) is ValueError and exc.fastload_index == 12 and exc.fastload_worker == 3
    assert isinstance(exc.__cause__, fastload.errors.RemoteTraceback)
    assert "raise ValueError" in exc.__cause__.tb


class _ExitsAt:
    """sys.exit() or KeyboardInterrupt from user code at one index."""

    def __init__(self, at, exc):
        self.at, self.exc = at, exc

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == self.at:
            raise self.exc
        return np.float32(i)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()], ids=["exit", "ctrl-c"])
@pytest.mark.parametrize("at", [0, 5])
def test_exit_in_a_worker_sample_is_a_catchable_error_at_any_index(at, exc):
    with fastload.Loader(_ExitsAt(at, exc), 2, num_workers=2) as loader:
        with pytest.raises(fastload.WorkerError, match=f"{type(exc).__name__}.*sample index {at}"):
            for _ in loader:
                pass
        assert loader.stats()["worker_restarts"] == 0  # the worker did not die
    with fastload.Loader(_ExitsAt(at, exc), 2, num_workers=0) as loader:
        with pytest.raises(type(exc)):  # in the user's own process it is what it is
            for _ in loader:
                pass


def test_seeds_beyond_int64_are_refused_up_front():
    with pytest.raises(ValueError, match=r"seed must be None or an int in \[0, 2\*\*63\)"):
        fastload.Loader(np.arange(4.0), 2, num_workers=0, seed=2**64 - 1)
    with pytest.raises(ValueError, match="seed must be"):
        fastload.Pool(1, seed=2**63)
    with fastload.Loader(np.arange(4.0), 2, num_workers=0, seed=1) as loader:
        state = loader.state_dict()
        for bad in (2**64, -1, "1", None):
            with pytest.raises(ValueError, match="the state's seed must be"):
                loader.load_state_dict({**state, "seed": bad})
        with pytest.raises(ValueError, match="invalid state"):
            loader.load_state_dict({**state, "epoch": "0"})
        loader.load_state_dict(state)
        assert [b.tolist() for b in loader] == [[0.0, 1.0], [2.0, 3.0]]


def test_the_dataset_kind_is_decided_once_with_its_fallbacks():
    from fastload._kinds import kind_of
    from fastload._scheduler import may_share

    class Map:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i

    class Many(Map):
        def __getitems__(self, idx):
            return list(idx)

    class Gen:
        def __iter__(self):
            yield 1

    arrays = fastload.ArrayDataset(np.arange(6).reshape(3, 2))
    got = {name: kind_of(ds) for name, ds in
           (("map", Map()), ("getitems", Many()), ("iterable", Gen()), ("columns", arrays))}
    assert {k: v.name for k, v in got.items()} == {k: k for k in got}
    assert got["columns"].columns and got["columns"].getitems  # its fallback when not gathered
    assert [k for k, v in got.items() if v.per_sample] == ["map"]
    assert got["iterable"].iterable and not got["iterable"].positions
    cfg = loader_config(n=3, num_workers=2)
    plan = fastload._plan.EpochPlan(3, 2, shuffle=False, seed=1, drop_last=False)
    assert [k for k, v in got.items() if v.positions and may_share(cfg, plan, v)] == ["map"]


def test_config_copy_sets_no_slots_aside_for_held_batches():
    cfg = loader_config(num_workers=2, prefetch=3, max_held=4, copy=True)
    assert (cfg.max_held, cfg.nslots) == (0, loader_config(num_workers=2, prefetch=3,
                                                           max_held=0).nslots)
