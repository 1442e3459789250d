"""The engine behind a Loader: orchestration of the plan, the slots, the workers and deaths.

NOTE [data path]
The parent plans batches (fastload/_plan.py: an epoch's order depends only on seed and epoch),
writes each batch's sample indices into a FREE slot and queues it (fastload/_slots.py); a worker
claims the slot, loads each sample and packs it straight into its row of the slot
(fastload/_fill.py, the same code the main process runs with num_workers=0); the parent waits
for the slot and hands the user NumPy views of it whose owner (``.base``) is a ``SlotLease``.
The slot is FREE again when the last array of the batch dies. The queue runs ahead into the next
epoch, so workers keep filling while the user is between epochs.

NOTE [pool callbacks]
workers_died / workers_restarted run in whichever thread checks the pool (another loader's,
maybe): they only append to ``pending``, reclaim slots (one CAS in C each) and send attach
messages; this loader raises what they found, in its own thread. A slot this loader waits on
may so become FREE (its batch abandoned after its worker died): the wait then raises the
verdict from ``pending`` (the callback appends it before the pool's lock is released).

NOTE [first samples]
A batch layout comes from the first sample (fastload/layout.py), loaded by worker 0 (the
probe). The first time, every other worker loads another sample at the same time (a Probe with
report=False) and keeps it (BatchFiller.warm) for when a batch that has it is filled: all
workers start at once, so a dataset whose ``__getitem__`` waits until several workers have
begun a sample (a barrier) works, and the first batches do not wait for one worker. With shared
batches (``self.share``, NOTE [shared rows] in csrc/fl_ring.c) those are the next rows of the
first batch, and the first batch is queued with each of those rows given to the worker that
loaded it (``given``): no sample is loaded twice, and the first batch takes one sample's time.
Otherwise they are the first samples of the next batches, and a kept sample packed into a batch
claimed by another worker is loaded again there (the ring hands batches to whichever worker is
free): at most ``num_workers - 1`` samples, once.

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
import logging
import os
import time
from collections import deque
from typing import Any

from . import _messages as m
from . import _ring
from ._config import LoaderConfig
from ._deaths import DeathPolicy
from ._iterable import filler_for
from ._mailbox import Mailbox
from ._memory import MemoryWatch
from ._passes import Pass, Passes
from ._pool import Pool, WorkerPool, default_start_method
from ._scheduler import Scheduler, may_share
from ._share import Sharing, share_dataset, unshared
from ._slots import SlotTable
from ._stream import plan_of
from ._wait import POLL_INTERVAL_S, Deadline
from .errors import LoaderClosedError, WorkerDied
from .layout import BatchLayout

__all__ = ["Engine"]

_client_ids = itertools.count()
log = logging.getLogger("fastload")
_ENDED = object()  # a plain iterable's epoch ended (NOTE [iterable datasets])
_LOGGED_SKIPS = 10  # on_error="skip": replacements logged one by one, per loader


def _undeliverable(epoch: int, b: int, indices: Any, worker: int, pid: int) -> str:
    """What to add to the error of a batch that loaded but cannot be read in the main process
    (an object leaf whose class the workers can import and the main process cannot)."""
    import reprlib

    return (f"fastload: batch {b} of epoch {epoch} (sample indices "
            f"{reprlib.repr([int(i) for i in indices])}), loaded by worker {worker} (pid {pid}), "
            "could not be read in the main process: an object in one of its samples does not "
            "unpickle here (a class the workers can import but this process cannot? define it "
            "in a module both can import). The batch is skipped; the next next() goes on")


class Engine:
    """Everything a loader owns. Holds no reference to the Loader (so finalizers work)."""

    def __init__(self, dataset: Any, n: int | None, cfg: LoaderConfig,
                 pool: Pool | None) -> None:
        self.pid = os.getpid()
        self.cid = next(_client_ids)
        self.cfg = cfg
        self.dataset = dataset
        self.n = n
        self.plan = plan_of(dataset, n, cfg)
        self.passes = Passes()  # NOTE [several passes] (_passes.py)
        self.plan.keep = self.passes.live  # a live epoch's batches are never forgotten
        self.sched = Scheduler(cfg, self.plan, self.passes, may_share(cfg, self.plan, dataset))
        self.deaths = DeathPolicy(cfg.on_worker_death)
        self.closed, self.closed_reason = False, ""
        self.layout: BatchLayout | None = None
        self.counters = {"copied_batches": 0, "spilled_batches": 0, "worker_restarts": 0}
        self.skipped: deque[dict[str, Any]] = deque(maxlen=1000)  # NOTE [skipped samples]
        self.skipped_total = 0
        self.shared_pool = pool  # a fastload.Pool (kept alive while this loader is), or None
        self.pending: deque[BaseException] = deque()  # NOTE [pool callbacks]
        self.warmed = False  # NOTE [first samples]
        self._last_check = time.monotonic()
        self.filler = filler_for(dataset, None, 0) if cfg.num_workers == 0 else None
        if self.filler is not None:
            self.filler.skip = cfg.on_error == "skip"
        self.pool: WorkerPool | None = None
        self.mail: Mailbox | None = None
        self.sharing: Sharing | None = None  # NOTE [shared datasets] (_share.py)
        self.memwatch = MemoryWatch()
        if cfg.num_workers > 0:
            fork = pool is None and (cfg.start_method or default_start_method()) == "fork"
            self.sharing = share_dataset(dataset, "fork" if fork else "pickled", cfg.share_dataset)
            self.sharing.tag(self.cid)
            dataset = self.sharing.dataset
            self.pool = (pool.check_usable() if pool is not None
                         else WorkerPool(cfg.pool_config(), (self.cid, dataset)))
            self.mail = Mailbox(self.pool, self.cid, cfg.timeout)
            self.pool.register(self.cid, self, dataset)
            if self.plan.ahead:  # a batch plan is asked in its epoch only
                self._send_probe()

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
        self.sched.pass_started(p.epoch, p.position)
        self.deaths.new_epoch()
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
        self.check_usable()
        p = self.passes.get(epoch, token)
        total = self.plan.nbatches_of(epoch)
        b = p.position
        if b >= total:
            self._finish(p)
            raise StopIteration
        if b == 1 and self.pool is not None:
            self.memwatch.first_batch_out(self.pool.pids())
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
        return (batch, self.plan.mask(epoch, b)) if self.cfg.return_mask else batch

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
            self._note_skips(p, filler.skipped)
        return batch if plan.done(epoch, b, filler.rows, filler.flags) else _ENDED

    # -- the worker path ---------------------------------------------------------------------
    def _worker_batch(self, p: Pass) -> Any:
        epoch = p.epoch
        if self.slots is None:
            self._setup_region(p)
        assert (slots := self.slots) is not None
        if self.pending or p.lost or time.monotonic() - self._last_check > POLL_INTERVAL_S:
            self._check_workers(p)  # also while data flows: a worker may have died idle
        plan = self.plan
        room: Deadline | None = None
        while True:
            self._refill(epoch)
            task = slots.first_of(epoch)
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
            assert plan.iterable or task.batch == p.position
            word = self._wait_slot(task.slot, p)
            slots.take(task)
            assert self.mail is not None and self.layout is not None
            info, spilled = slots.ring.slot_info(task.slot), None  # info["pid"]: who published
            if _ring.state_bits(word)[0] == _ring.FAILED:
                slots.release(task.slot)
                p.position += 1  # its samples raised: the next next() goes on
                what = f"batch {task.batch} of epoch {epoch}"
                self.mail.raise_failure(task.slot, task.seq, word, what, info["pid"])
            if not plan.done(epoch, task.batch, info["rows"], info["flags"]):
                slots.release(task.slot)  # NOTE [iterable datasets]: no batch, skipped
                continue
            if self.layout.n_objects and info["flags"] & _ring.F_SPILLED:
                spilled = self.mail.spilled_image(task.slot, task.seq, word, info["pid"],
                                                  self.cfg.on_worker_death)
                if spilled is None:  # restart mode: its worker died before it sent it: again
                    slots.redo(task, info["count"])
                    continue
                self.counters["spilled_batches"] += 1
            if info["flags"] & _ring.F_SKIPPED:
                try:
                    self._note_skips(p, self.mail.skipped(task.slot, task.seq, word,
                                                              info["pid"]))
                except BaseException:
                    slots.release(task.slot)
                    raise
            try:
                batch = slots.deliver(task.slot, info["rows"], info["var_bytes"], spilled,
                                      self.cfg.copy, self.cfg.max_held)
            except Exception as e:  # an object leaf the main process cannot unpickle: the
                p.position += 1  # batch is consumed (NOTE [errors do not end the epoch])
                e.add_note(_undeliverable(epoch, task.batch, plan.batch(epoch, task.batch),
                                          _ring.state_bits(word)[1], info["pid"]))
                raise
            self._refill(None)
            return batch

    def _note_skips(self, p: Pass, records: list[tuple[Any, ...]]) -> None:
        """NOTE [skipped samples] (_fill.py): count, log the first, raise past max_skips (of
        pass ``p``: each pass counts its own)."""
        epoch = p.epoch
        for index, kind, text, instead in records:
            if self.skipped_total < _LOGGED_SKIPS:
                last = self.skipped_total == _LOGGED_SKIPS - 1
                log.warning("sample %s raised %s: %s; sample %s was loaded in its place "
                            "(on_error='skip')%s", index, kind, text, instead,
                            "; further skips are only counted in stats()['skipped']"
                            if last else "")
            self.skipped_total += 1
            self.skipped.append({"epoch": epoch, "index": index, "error": f"{kind}: {text}",
                                 "replaced_by": instead})
            p.skips.append((index, f"{kind}: {text}"))
        limit = self.cfg.max_skips
        if limit is not None and len(p.skips) > limit:
            from .errors import SkipLimitError

            got = p.skips
            kinds: dict[str, int] = {}
            for _, text in got:
                kinds[text.split(":", 1)[0]] = kinds.get(text.split(":", 1)[0], 0) + 1
            listed = "\n  ".join(f"sample {i}: {t}" for i, t in got[:10])
            more = f"\n  ... and {len(got) - 10} more" if len(got) > 10 else ""
            by_kind = ", ".join(f"{k} x{c}" for k, c in sorted(kinds.items()))
            raise SkipLimitError(
                f"{len(got)} samples of epoch {epoch} raised, more than max_skips={limit} "
                f"(on_error='skip'), so the epoch ends here ({by_kind}):\n  {listed}{more}\n"
                "Fix the dataset (or raise max_skips); stats()['skipped'] lists them all",
                list(got))

    def _refill(self, want: int | None) -> None:
        """Queue tasks (NOTE [queueing passes] in _scheduler.py); wake the workers."""
        self._end_dropped()
        if self.sched.refill(want):  # a shared batch: every idle worker may take rows of it
            slots = self.sched.slots
            assert slots is not None and self.pool is not None
            self.pool.bell.ring(slots.shared_queued)
            slots.shared_queued = False

    def _wait_slot(self, slot: int, p: Pass) -> int:
        """The slot's word once READY or FAILED (FREE: NOTE [pool callbacks])."""
        assert self.slots is not None
        ring, wait = self.slots.ring, Deadline(self.cfg.timeout, self.cfg.on_stall)
        while True:
            word = ring.wait(slot, wait.step())
            if word >= 0 and _ring.state_bits(word)[0] != _ring.FREE:
                return int(word)
            self._check_workers(p)  # waits for the pool's lock: the verdict is there then
            wait.check(lambda: self.slots.why_late(slot))  # type: ignore[union-attr]
            time.sleep(0.001 if word >= 0 else 0)  # (never spin on a FREE slot)

    # -- the first sample and the region -----------------------------------------------------
    def _send_probe(self, p: Pass | None = None) -> None:
        """Ask a worker (0, for a map-style dataset) for the layout of the next batch's first
        sample; NOTE [first samples]: the first time, also have each other worker load the
        first sample of a later batch."""
        assert self.mail is not None and self.pool is not None
        if p is None:
            live = self.passes.live
            p = live.get(self.active_epoch) if self.active_epoch is not None else None
        e, b = (p.epoch, p.position) if p is not None else (self.next_epoch, 0)
        warm = 0 if self.warmed else self.cfg.num_workers
        firsts = self.plan.probe_tasks(e, b, warm, self.sched.share)
        if not firsts:
            return
        if self.sched.share:  # the first rows of batch b: given to the workers that load them
            b_rows = self.plan.batch(e, b)
            k = min(len(firsts), len(b_rows))
            self.sched.given = (e, b, [w for w, _ in firsts[:k]])
        (to, sample), rest = firsts[0], firsts[1:]
        alternates: tuple[int, ...] = ()
        if self.cfg.on_error == "skip":  # NOTE [skipped samples]: the rest of its batch
            alternates = tuple(int(i) for i in self.plan.batch(e, b)[1:])
        self.mail.send_probe(m.Probe(self.cid, sample, self.plan.rows, self.plan.seed, e,
                                     self.cfg.sample_spec, alternates=alternates), rest, to)
        self.warmed = True

    def _setup_region(self, p: Pass) -> None:
        """Wait for worker 0's layout, then create the region and attach every worker."""
        pool, mail = self.pool, self.mail
        assert pool is not None and mail is not None
        wait = Deadline(self.cfg.timeout, self.cfg.on_stall, stall_now=False)
        while True:
            if mail.probe is None:
                self._send_probe(p)
            pool.pump(mail.probe_worker, POLL_INTERVAL_S)
            try:
                mail.collect()
            except BaseException:
                if mail.probe_failed and self.passes.is_live(p.epoch):  # the batch's first
                    mail.probe_failed = False  # sample raised: that batch is consumed
                    p.position += 1  # (nothing is queued yet)
                    self.sched.consumed_unqueued(p.epoch, p.position)
                raise
            if mail.layout is not None:
                break
            if mail.probe_ended is not None:  # NOTE [iterable datasets]: ask the next worker
                (worker, pe), mail.probe_ended = mail.probe_ended, None
                self.plan.ended(pe, worker)
                if pe == p.epoch and self.plan.all_ended(pe):
                    raise StopIteration  # no worker's iterator has a sample this epoch
            self._check_workers(p)
            if mail.probe_started:  # a slow process start is not a slow dataset: count from
                wait.start_stall()  # when worker 0 starts loading the sample
            w = mail.probe_worker
            wait.check(lambda: f"worker {w} (pid {pool.pid_of(w)}) is still "  # noqa: B023
                       f"loading sample index "
                       f"{mail.probe.sample if mail.probe else '?'} (the first sample, which sets "
                       "the batch layout)")
        self.layout = mail.layout
        slots = self.sched.start(self.layout, self.counters)
        if self.closed:  # by another thread, which may have looked at self.slots before it was
            slots.close()  # set (close() sets closed first): never leave a region behind
            self.sched.slots = None
            self.check_usable()
        for i in range(self.cfg.num_workers):
            self._attach(i)

    def _attach(self, i: int) -> None:
        assert self.pool is not None and self.slots is not None
        region = self.slots.region  # a restarted worker is attached by workers_restarted
        self.pool.send(i, m.Attach(self.cid, self.layout, region.nbytes,
                                   self.cfg.on_error == "skip"), region.fd)

    # -- messages and deaths -----------------------------------------------------------------
    def _check_workers(self, p: Pass | None) -> None:
        """Closed by another thread (pool.close())? Dead workers (any loader's)? Raise here
        what concerns pass ``p``: a death that cost it a batch, or any other error."""
        self.check_usable()
        if self.pool is None:
            return
        self._last_check = time.monotonic()
        self.pool.check()
        if p is not None and p.lost is not None:
            lost, p.lost = p.lost, None
            raise lost
        if self.pending:
            exc = self.pending.popleft()
            self.pending.clear()  # one error at a time: the rest concern the same deaths
            raise exc

    def workers_died(self, deaths: list[m.Death]) -> None:
        """The pool found dead workers (called before they are restarted): fastload/_deaths.py
        judges; the lost batches are re-queued, or abandoned if the epoch ends (batches
        prefetched for the next epoch are always re-queued)."""
        assert self.mail is not None
        try:
            self.mail.collect()
        except BaseException as e:  # an init or probe error: raise it rather than a death
            self.pending.append(e)
            return
        lost: dict[int, list[int | None]] = {}
        held: list[tuple[int, int, int]] = []  # (worker, slot, epoch)
        for d in deaths:
            if self.slots is not None:
                for slot, epoch, index in self.slots.claimed_by(d.worker):
                    lost.setdefault(d.worker, []).append(index)
                    held.append((d.worker, slot, epoch))
            else:
                lost[d.worker] = self.mail.probe_lost(d.worker)  # the first sample?
        verdict = self.deaths.judge(deaths, lost, bool(held))
        ended: set[int] = set()  # live passes whose batch is abandoned: each raises the error
        if self.slots is not None:
            ring = self.slots.ring
            for i, s, epoch in held:
                requeue = not (verdict.fatal and self.passes.is_live(epoch))
                if not requeue:
                    ended.add(epoch)
                if _ring.state_bits(ring.state(s))[0] == _ring.CLAIMED:
                    ring.reclaim_slot(s, i, requeue)
                else:  # NOTE [shared rows]: its rows are loaded by others, or closed
                    ring.reset_slot_rows(s, i, requeue)
            if self.slots.shared:  # rows given to it up front, never begun: for others
                for d in deaths:
                    ring.reset_rows(d.worker, True)
                if self.pool is not None:
                    self.pool.bell.ring(True)
        if verdict.error is not None and ended:
            for epoch in ended:
                if (p := self.passes.live.get(epoch)) is not None:
                    p.lost = verdict.error
        elif verdict.error is not None and verdict.fatal and held:
            # every batch it cost was prefetched for a pass not yet started: re-queued, and
            # that pass loses nothing (NOTE [pool callbacks])
            log.warning("%s; restarted it and re-queued its batch of the next epoch",
                        str(verdict.error).split(". ")[0])
        elif verdict.error is not None:
            self.pending.append(verdict.error)
        elif verdict.warning is not None:
            log.warning("%s", verdict.warning)

    def workers_restarted(self, restarted: list[int]) -> None:
        """The pool restarted these workers (they have this loader's dataset again)."""
        self.counters["worker_restarts"] += len(restarted)
        for i in restarted if self.slots is not None else []:
            self._attach(i)

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
            self.dataset = self.filler = None
            if self.sharing is not None:
                self.sharing.close()

    def state_dict(self) -> dict[str, Any]:
        self._end_dropped()
        return self.plan.state(*self.passes.state())  # NOTE [resume state] (_passes.py)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_usable()
        epoch, position = self.plan.restore(state)
        self.passes.restore(epoch, position)
        if self.slots is None and self.mail is not None:
            self.mail.retarget()  # NOTE [first samples]: the probe follows the resume point
        self.sched.restart_at(epoch, position)


    def stats(self) -> dict[str, Any]:
        slots, out = self.slots, dict[str, Any](self.counters)
        out.update(held_batches=slots.held if slots else 0, nslots=self.cfg.nslots,
                   slot_bytes=self.layout.slot_bytes if self.layout is not None else None,
                   shared_rows=bool(slots is not None and slots.shared))
        if slots is not None and not slots.ring.closed:
            out["ring"] = slots.ring.stats()
        out["shared_dataset"] = list(self.sharing.converted) if self.sharing else []
        out["skipped"], out["skipped_total"] = list(self.skipped), self.skipped_total
        return out

