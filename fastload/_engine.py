"""The engine behind a Loader: orchestration of the plan, the slots, the workers and deaths.

NOTE [data path]
The parent plans batches (fastload/_plan.py: an epoch's order depends only on seed and epoch),
writes each batch's sample indices into a FREE slot and queues it (fastload/_slots.py); a worker
claims the slot, loads each sample and packs it straight into its row of the slot
(fastload/_fill.py, the same code the main process runs with num_workers=0); the parent waits
for the slot and hands the user NumPy views of it whose owner (``.base``) is a ``SlotLease``.
The slot is FREE again when the last array of the batch dies. The queue runs ahead into the next
epoch, so workers keep filling while the user is between epochs.

NOTE [errors do not end the epoch]
A batch whose samples raised (in a worker: its slot is FAILED; in the main process: the fill
raised an ``Exception``; the probe: its first sample raised) counts as consumed before its error
is raised, so the next ``next()`` on the same iterator goes on with the next batch, as torch's
iterator does (users catch per batch and go on). Anything else that ends a ``next()`` with an
error (a timeout, a death in "raise" mode, Ctrl+C, a closed loader) leaves ``consumed``
unchanged and stops the pass (the rest of its epoch is dropped; ``state_dict()`` resumes at
the batch it did not deliver: NOTE [resume state] in _passes.py). With num_workers=0 an
``Exception`` raised while a sample loads is that sample's error, whatever raised it.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from . import _messages as m
from . import _ring
from ._config import LoaderConfig
from ._faults import Faults
from ._kinds import filler_for, kind_of, plan_for
from ._mailbox import Mailbox
from ._memory import MemoryWatch
from ._passes import Pass, Passes
from ._pool import Pool, WorkerPool
from ._rngs import mode_of
from ._scheduler import Scheduler, may_share
from ._share import Sharing, unshared
from ._slots import SlotTable
from ._startup import Startup, start_workers
from ._wait import POLL_INTERVAL_S, Deadline
from .errors import LoaderClosedError, WorkerDied
from .layout import BatchLayout

__all__ = ["Engine"]

_client_ids = itertools.count()
#: This process's pid, kept by a fork hook (registered with the first Engine, not at import):
#: next_batch's "used in another process?" check costs no getpid() system call per batch.
_pid: list[int] = []


def _track_pid() -> None:
    if not _pid:
        _pid.append(os.getpid())
        os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
_ENDED = object()  # a plain iterable's epoch ended (NOTE [iterable datasets])


def _undeliverable(epoch: int, b: int, indices: Any, worker: int, pid: int) -> str:
    """Where a batch that loaded but cannot be read in the main process came from (an object
    leaf whose class the workers can import and the main process cannot)."""
    import reprlib

    # (why the objects did not unpickle is read_image's note: NOTE [unpicklable leaves])
    return (f"fastload: batch {b} of epoch {epoch} (sample indices "
            f"{reprlib.repr([int(i) for i in indices])}), loaded by worker {worker} (pid {pid}), "
            "could not be read in the main process. The batch is skipped; the next next() "
            "goes on")


def _check_resumable(cfg: Any, plan: Any, epoch: int, position: int) -> None:
    """NOTE [out of order] (_scheduler.py): in_order=False cannot resume mid-epoch."""
    if not cfg.in_order and cfg.num_workers and 0 < position < plan.nbatches_of(epoch):
        raise ValueError("state_dict() in the middle of an epoch needs in_order=True: with "
                         "in_order=False batches came out of order, and a position cannot say "
                         "which; save the state between epochs")


def _stats(self: Any) -> dict[str, Any]:
    """Loader.stats() (an Engine's)."""
    slots, out, pool = self.slots, dict[str, Any](self.counters), self.pool
    out.update(held_batches=slots.held if slots else 0, nslots=self.cfg.nslots,
               slot_bytes=self.layout.slot_bytes if self.layout is not None else None,
               shared_rows=bool(slots is not None and slots.shared),
               # NOTE [global RNGs] (_rngs.py): known once the first sample has loaded
               seeded_globals=bool(self.layout is not None and self.layout.global_rng),
               start_method=pool and pool.start_method,  # NOTE [start method] (_procs.py)
               start_method_reason=pool and pool.start_method_reason)
    if slots is not None and not slots.ring.closed:
        out["ring"] = slots.ring.stats()
    out["shared_dataset"] = list(self.sharing.converted) if self.sharing else []
    f = self.faults
    out["skipped"], out["skipped_total"] = list(f.skipped), f.skipped_total
    return out


class Engine:
    """Everything a loader owns. Holds no reference to the Loader (so finalizers work)."""

    def __init__(self, dataset: Any, n: int | None, cfg: LoaderConfig,
                 pool: Pool | None) -> None:
        _track_pid()
        self.pid = os.getpid()
        self.cid = next(_client_ids)
        self.cfg = cfg
        self.dataset = dataset
        self.n = n
        self.kind = kind_of(dataset)  # NOTE [dataset kinds] (_kinds.py): decided once
        self.plan = plan_for(dataset, self.kind, n, cfg)
        self.passes = Passes()  # NOTE [several passes] (_passes.py)
        self.plan.keep = self.passes.live  # a live epoch's batches are never forgotten
        self.sched = Scheduler(cfg, self.plan, self.passes, may_share(cfg, self.plan, self.kind))
        self.faults = Faults(cfg, self.passes, self.sched)  # deaths and skips (_faults.py)
        self.closed, self.closed_reason = False, ""
        self.layout: BatchLayout | None = None
        self.counters = {"copied_batches": 0, "spilled_batches": 0, "worker_restarts": 0}
        self.shared_pool = pool  # a fastload.Pool (kept alive while this loader is), or None
        self._last_check = time.monotonic()
        #: the first wait for a batch (NOTE [bounded waits] in _wait.py): no Deadline is made
        #: for a batch that comes within it
        self._first_wait = min(POLL_INTERVAL_S, cfg.timeout or POLL_INTERVAL_S,
                               cfg.on_stall[0] if cfg.on_stall else POLL_INTERVAL_S)
        self.filler = filler_for(dataset, None, 0) if cfg.num_workers == 0 else None
        if self.filler is not None:
            self.filler.skip = cfg.on_error == "skip"
            self.filler.io = cfg.io_concurrency  # NOTE [reads in flight] (_io.py)
            self.filler.globals = mode_of(cfg.seed_globals, threads=cfg.io_concurrency > 1,
                                          iterable=self.plan.iterable)  # NOTE [global RNGs]
        self.pool: WorkerPool | None = None
        self.mail: Mailbox | None = None
        self.startup: Startup | None = None  # the probe, the region (_startup.py)
        self.sharing: Sharing | None = None  # NOTE [shared datasets] (_share.py)
        self.memwatch = MemoryWatch()
        if cfg.num_workers > 0:
            self.sharing, self.startup = start_workers(self.cid, dataset, cfg, self.plan,
                                                       self.passes, self.sched, pool)
            self.pool, self.mail = self.startup.pool, self.startup.mail
            self.faults.mail, self.faults.bell = self.mail, self.pool.bell
            self.pool.register(self.cid, self, self.sharing.dataset)
            if self.plan.ahead:  # a batch plan is asked in its epoch only
                self.startup.send_probe()

    # -- epochs ------------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self.closed:
            raise LoaderClosedError(
                f"this Loader is closed ({self.closed_reason}); create a new one")
        if os.getpid() != self.pid:
            raise RuntimeError(
                "a fastload Loader can only be used in the process that created it "
                f"(created in pid {self.pid}, used in pid {os.getpid()})"
            )

    def start_epoch(self) -> tuple[int, int]:
        """Start a pass: (its epoch, its pass id)."""
        self.check_usable()
        self._end_dropped()
        if self.pool is not None and self.slots is not None:
            # A worker that died before this iter() (while prefetching this epoch) is judged
            # now, while the epoch is not live: its batches are re-queued, never the reason
            # this epoch fails (NOTE [pool callbacks])
            try:
                self.pool.check()  # only records: what it found is raised by next()
            except WorkerDied:
                pass  # a failed restart: tried again, and raised, at the next check
        if self.plan.iterable:  # NOTE [several passes]: one pass at a time
            for old in self.passes.supersede_all(
                    "iter(loader) was called again, and a plain iterable dataset's workers "
                    "iterate one pass at a time"):
                self._drop_pass(old)
        p = self.passes.start()
        self.sched.queue_from(p.epoch, p.position)
        self.faults.policy.new_epoch()
        if self.pool is not None:
            self.memwatch.epoch_started(self.pool.pids(), self.suspects)
        return p.epoch, p.token

    @property
    def slots(self) -> SlotTable | None:
        """The shared region's slots (the scheduler's), once the layout is known."""
        return self.sched.slots

    @property
    def active_epoch(self) -> int | None:
        """The newest live pass's epoch (None: none is live)."""
        return self.passes.newest

    @property
    def next_epoch(self) -> int:
        return self.passes.next_epoch

    def abandon(self, epoch: int, token: int) -> None:
        """An iterator was dropped (any thread: only noted, NOTE [several passes])."""
        self.passes.dropped(epoch, token)

    def _end_dropped(self) -> None:
        for p in self.passes.take_dropped():
            self._drop_pass(p)

    def suspects(self) -> list[str]:
        return unshared(self.sharing, self.dataset)

    def memory(self) -> dict[str, Any]:
        pids = self.pool.pids() if self.pool is not None else []
        shared = sum(c["bytes"] for c in self.sharing.converted) if self.sharing else 0
        return self.memwatch.report(pids, shared)

    def _drop_pass(self, p: Pass) -> None:
        """Pass ``p`` ended unfinished: drop the tasks of its epoch."""
        self.sched.pass_ended(p.epoch, drop=True)

    def _finish(self, p: Pass) -> None:
        self.passes.finish(p)
        self.sched.pass_ended(p.epoch, drop=False)

    def next_batch(self, epoch: int, token: int) -> Any:
        if self.closed or _pid[0] != self.pid:
            self.check_usable()
        p = self.passes.live.get(epoch)  # (the hot path: Passes.get says why when it is not)
        if p is None or p.token != token:
            p = self.passes.get(epoch, token)
        total = p.total
        if total is None:
            total = self.plan.nbatches_of(epoch)
            if not self.plan.iterable:
                p.total = total
        b = p.position
        if b >= total:
            self._finish(p)
            raise StopIteration
        if b == 1 and self.pool is not None:
            self.memwatch.first_batch_out(self.pool.pids())
        p.batch = b  # (the worker path's task says which, in_order=False)
        try:
            batch = self._worker_batch(p) if self.pool else self._inprocess_batch(p)
            if batch is _ENDED:  # NOTE [iterable datasets]: every worker's iterator ended
                raise StopIteration
        except BaseException as e:
            if p.position == b:  # NOTE [errors do not end the epoch]: not consumed
                if self.passes.stop(p):  # state_dict() resumes at this batch
                    self._drop_pass(p)
            elif p.position >= total:
                self._finish(p)
            if self.closed and isinstance(e, Exception) and not isinstance(e, LoaderClosedError):
                # closed by another thread (Pool.close) mid-batch: whatever broke under us (a
                # closed bell or ring, slots gone) is that, and is said so
                raise LoaderClosedError(
                    f"this Loader was closed while it loaded a batch ({self.closed_reason})"
                ) from e
            raise
        p.position = b + 1
        if b + 1 >= total:
            self._finish(p)
        return (batch, self.plan.mask(epoch, p.batch)) if self.cfg.return_mask else batch

    def _inprocess_batch(self, p: Pass) -> Any:
        """num_workers=0: the workers' fill path (fastload/_fill.py), into a private buffer."""
        filler, plan, epoch, b = self.filler, self.plan, p.epoch, p.position
        assert filler is not None
        try:
            self.layout, batch = filler.load(self.layout, plan.batch(epoch, b), plan.rows,
                                             plan.seed, epoch, self.cfg.sample_spec)
        except Exception:
            p.position = b + 1  # NOTE [errors do not end the epoch]
            raise
        if filler.skipped:
            self.faults.note_skips(p, filler.skipped)
        return batch if plan.done(epoch, b, filler.rows, filler.flags) else _ENDED

    # -- the worker path ---------------------------------------------------------------------
    def _worker_batch(self, p: Pass) -> Any:
        """NOTE [data path]. The parent's hot path: one refill (which reaps), one wait that
        returns the slot's result, one delivery per batch (issue 30: under 40 Python calls a
        batch in the steady state, ``benchmarks/bench_calls.py``)."""
        epoch = p.epoch
        slots = self.sched.slots
        if slots is None:
            self._setup_region(p)
            slots = self.sched.slots
            assert slots is not None
        if self.faults.pending or p.lost or time.monotonic() - self._last_check > POLL_INTERVAL_S:
            self._check_workers(p)  # also while data flows: a worker may have died idle
        plan = self.plan
        room: Deadline | None = None
        while True:
            if self.passes.dropped_queue:
                self._end_dropped()
            task = self.sched.refill(epoch)  # the slots the user let go, the prefetch depth
            if task is None:
                if plan.iterable and plan.all_ended(epoch):
                    return _ENDED
                # NOTE [queueing passes]: no slot for this pass yet (the others' tasks are
                # being loaded): wait for one to come free
                room = room or Deadline(self.cfg.timeout, self.cfg.on_stall)
                self._check_workers(p)
                room.check(lambda: "no slot came free for this pass: the loader's other "
                           "passes and held batches use them all")
                time.sleep(0.001)
                continue
            assert plan.iterable or task.batch == p.position or not self.cfg.in_order
            task, (state, owner, _, rows, count, flags, var_bytes, pid, _) = self._wait_slot(
                task, p)
            slots.take(task)
            p.batch = task.batch
            assert self.mail is not None and self.layout is not None
            spilled = None
            if state == _ring.FAILED:
                slots.release(task.slot)
                p.position += 1  # its samples raised: the next next() goes on
                what = f"batch {task.batch} of epoch {epoch}"
                self.mail.raise_failure(task.slot, task.seq, owner, what, pid)
            if plan.iterable and not plan.done(epoch, task.batch, rows, flags):
                slots.release(task.slot)  # NOTE [iterable datasets]: no batch, skipped
                continue
            if flags & _ring.F_SPILLED and self.layout.n_objects:
                spilled = self.mail.spilled_image(task.slot, task.seq, owner, pid,
                                                  self.cfg.on_worker_death)
                if spilled is None:  # restart mode: its worker died before it sent it: again
                    slots.redo(task, count)
                    continue
                self.counters["spilled_batches"] += 1
            if flags & _ring.F_SKIPPED:
                try:
                    self.faults.note_skips(p, self.mail.skipped(task.slot, task.seq, owner, pid))
                except BaseException:
                    slots.release(task.slot)
                    raise
            try:
                return slots.deliver(task.slot, rows, var_bytes, spilled, self.cfg.copy,
                                     self.cfg.max_held)
            except Exception as e:  # an object leaf the main process cannot unpickle: the
                p.position += 1  # batch is consumed (NOTE [errors do not end the epoch])
                e.add_note(_undeliverable(epoch, task.batch, plan.batch(epoch, task.batch),
                                          owner, pid))
                raise

    def _wait_slot(self, task: Any, p: Pass) -> tuple[Any, Any]:
        """The task and its slot's result (RingIndex.await_result) once READY or FAILED (with
        in_order=False any task of the pass that is: NOTE [out of order] in _scheduler.py): a
        batch whose worker died stays QUEUED (its pieces given back, or CLOSED if its pass
        ends: NOTE [pool callbacks] in _faults.py), so each step checks the workers. A batch
        that is there within the first step costs no Deadline."""
        slots = self.sched.slots
        assert slots is not None
        ring, slot, step, wait = slots.ring, task.slot, self._first_wait, None
        while True:
            if self.cfg.in_order:
                got = ring.await_result(slot, step)
            else:
                task, got = slots.await_any(p.epoch, task, step)
            if got:
                return task, got
            wait = wait or Deadline(self.cfg.timeout, self.cfg.on_stall,
                                    elapsed=step if got is None else 0)
            self._check_workers(p)  # closed? dead workers? (it waits for the pool's lock: a
            wait.check(lambda: slots.why_late(slot))  # death's verdict is recorded by then)
            step = wait.step()

    # -- the region ---------------------------------------------------------------------------
    def _setup_region(self, p: Pass) -> None:
        """Wait for the probe's layout (NOTE [first samples] in _startup.py), then create the
        region and attach every worker."""
        assert self.startup is not None
        self.layout = layout = self.startup.wait_layout(p, self._check_workers)
        assert self.pool is not None
        slots = self.sched.start(layout, self.counters, self.pool.bell)
        slots.threads = self.pool.threads  # (its messages name threads as such)
        if self.closed:  # by another thread, which may have looked at self.slots before it was
            slots.close()  # set (close() sets closed first): never leave a region behind
            self.sched.slots = None
            self.check_usable()
        for i in range(self.cfg.num_workers):
            self.startup.attach(i, layout)

    # -- messages and deaths -----------------------------------------------------------------
    def _check_workers(self, p: Pass | None) -> None:
        """Closed by another thread (pool.close())? Dead workers (any loader's)? Raise here
        what concerns pass ``p``: a death that cost it a batch, or any other error."""
        self.check_usable()
        if self.pool is None:
            return
        self._last_check = time.monotonic()
        self.pool.check()
        self.faults.raise_for(p)

    def workers_died(self, deaths: list[m.Death]) -> None:
        """NOTE [pool callbacks] (_faults.py)."""
        self.faults.workers_died(deaths)

    def workers_restarted(self, restarted: list[int]) -> None:
        """The pool restarted these workers (they have this loader's dataset again)."""
        self.counters["worker_restarts"] += len(restarted)
        for i in restarted if self.slots is not None else []:
            assert self.startup is not None and self.layout is not None
            self.startup.attach(i, self.layout)

    # -- shutdown, resume, stats -------------------------------------------------------------
    def close(self, reason: str = "close() was called") -> None:
        """NOTE [shutdown] (fastload/_pool.py, docs/design.md). Idempotent; never raises."""
        if self.closed or os.getpid() != self.pid:
            return
        self.closed, self.closed_reason = True, reason
        self.passes.supersede_all(f"the loader was closed ({reason})")
        try:
            if self.slots is not None:
                self.slots.ring.stop()  # step 1
            if self.pool is not None:
                if self.shared_pool is None:
                    self.pool.close()  # steps 2-3
                else:  # the pool's workers stay; they unmap our region and drop our dataset
                    self.pool.unregister(self.cid)
        finally:
            if self.slots is not None:
                self.slots.close()  # step 5: live zero-copy batches keep the mapping
            self.sched.slots = None
            if self.mail is not None:
                self.mail.clear()
            if self.filler is not None:
                self.filler.close()  # its read threads (NOTE [reads in flight] in _io.py)
            self.dataset = self.filler = None
            if self.sharing is not None:
                self.sharing.close()

    def state_dict(self) -> dict[str, Any]:
        self._end_dropped()
        epoch, position = self.passes.state()  # NOTE [resume state] (_passes.py)
        _check_resumable(self.cfg, self.plan, epoch, position)
        return self.plan.state(epoch, position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_usable()
        epoch, position = self.plan.restore(state)
        self.passes.restore(epoch, position)
        if self.slots is None and self.mail is not None:
            self.mail.retarget()  # NOTE [first samples]: the probe follows the resume point
        self.sched.restart_at(epoch, position)


    stats = _stats  # (a module function: this class is at its size limit)

