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

NOTE [several passes]
Every ``iter(loader)`` is a pass over its own epoch (0, 1, ... in the order they were started),
and several may be live at once (``zip(dl, dl)``, one loader for training and validation), as
with torch's DataLoader: each has its own position (``live``: epoch -> batches delivered) and
its own tasks in the ring, all served by the same workers. ``queued`` says how far each epoch
is queued; a live epoch's tasks in flight are exactly its batches [delivered, queued), in order.
The queue is shared fairly: the live epoch with the fewest tasks in flight is topped up first,
and a pass waiting for a batch that is not queued gets a slot even past the prefetch depth (a
free one, or the newest task of the epoch with the most in flight, which re-queues it later),
so no pass can starve another. When every live epoch is queued to its end, the queue runs one
epoch ahead (the next ``iter()``'s). A pass whose iterator is dropped unfinished (``break``, the
iterator garbage-collected) is ended at the engine's next step (``abandoned``), freeing its
slots. ``state_dict()`` describes the oldest live pass, or, if none is live, the newest pass
if it was left unfinished (``for ...: break`` then ``state_dict()`` resumes after the break).
A plain iterable's workers iterate one pass at a time (each worker's replica has one
iterator), so there a new ``iter()`` supersedes the live pass, as does ``load_state_dict``
for every pass.

NOTE [errors do not end the epoch]
A batch whose samples raised (in a worker: its slot is FAILED; in the main process: the fill
raised an ``Exception``; the probe: its first sample raised) counts as consumed before its error
is raised, so the next ``next()`` on the same iterator goes on with the next batch, as torch's
iterator does (users catch per batch and go on). Anything else that ends a ``next()`` with an
error (a timeout, a death in "raise" mode, Ctrl+C, a closed loader) leaves ``consumed``
unchanged and drops the rest of the epoch, as before.
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
from ._pool import Pool, WorkerPool, default_start_method
from ._share import Sharing, share_dataset, unshared
from ._slots import SlotTable, may_share, shared_batch
from ._stream import plan_of
from ._wait import POLL_INTERVAL_S, Deadline
from .errors import LoaderClosedError
from .layout import BatchLayout

__all__ = ["Engine"]

_client_ids = itertools.count()
log = logging.getLogger("fastload")
_ENDED = object()  # a plain iterable's epoch ended (NOTE [iterable datasets])
_LOGGED_SKIPS = 10  # on_error="skip": replacements logged one by one, per loader


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
        self.live: dict[int, int] = {}  # NOTE [several passes]: epoch -> batches delivered
        self.queued: dict[int, int] = {}  # epoch -> its next batch to queue
        self.plan.keep = self.live  # a live epoch's batches are never forgotten by the plan
        self.abandoned: deque[tuple[int, int]] = deque()  # (epoch, pass) of dropped iterators
        self.lost: dict[int, BaseException] = {}  # a live epoch's batch a death abandoned
        self.left: tuple[int, int] | None = None  # (epoch, position) of a pass left unfinished
        self.deaths = DeathPolicy(cfg.on_worker_death)
        self.closed, self.closed_reason = False, ""
        self.layout: BatchLayout | None = None
        self.slots: SlotTable | None = None  # the shared region, once the layout is known
        self.next_epoch = 0
        self.superseded: dict[int, str] = {}  # passes ended by another call: why
        self.passes: dict[int, int] = {}  # live epoch -> its pass (an epoch number can come
        self._pass_ids = itertools.count()  # again after load_state_dict; a pass cannot)
        self.resume: tuple[int, int] | None = None  # (epoch, position) from load_state_dict
        self.counters = {"copied_batches": 0, "spilled_batches": 0, "worker_restarts": 0}
        self.skipped: deque[dict[str, Any]] = deque(maxlen=1000)  # NOTE [skipped samples]
        self.skipped_total = 0
        self.epoch_skips: list[tuple[int | None, str]] = []  # of the active epoch
        self.shared_pool = pool  # a fastload.Pool (kept alive while this loader is), or None
        self.pending: deque[BaseException] = deque()  # NOTE [pool callbacks]
        self.warmed = False  # NOTE [first samples]
        self.given: tuple[int, int, list[int]] | None = None  # (epoch, batch, row -> worker)
        #: Whether batches may be shared (NOTE [shared rows] in csrc/fl_ring.c): they are if,
        #: besides, the layout is all fixed-shape arrays (_setup_region).
        self.share = may_share(cfg, self.plan, dataset)
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
        self._end_abandoned()
        if self.plan.iterable:  # NOTE [several passes]: one pass at a time
            for old in list(self.live):
                self.superseded[self.passes[old]] = (
                    "iter(loader) was called again, and a plain iterable dataset's workers "
                    "iterate one pass at a time")
                self.abort_epoch(old)
        e = self.next_epoch
        self.next_epoch += 1
        position = self.resume[1] if self.resume is not None and self.resume[0] == e else 0
        self.resume = None
        self.live[e] = position
        self.queued[e] = max(self.queued.get(e, position), position)
        token = self.passes[e] = next(self._pass_ids)
        self.epoch_skips = []
        self.deaths.new_epoch()
        if self.pool is not None:
            self.memwatch.epoch_started(self.pool.pids(), self.suspects)
        return e, token

    @property
    def active_epoch(self) -> int | None:
        """The newest live pass's epoch (None: none is live)."""
        return next(reversed(self.live), None)

    def abandon(self, epoch: int, token: int) -> None:
        """An iterator was dropped (any thread: only noted, NOTE [several passes])."""
        self.abandoned.append((epoch, token))

    def _end_abandoned(self) -> None:
        while self.abandoned:
            e, token = self.abandoned.popleft()
            if e in self.live and self.passes.get(e) == token:  # unfinished: state_dict()
                # still says where it was left
                self.left = (e, self.live[e])
                self.abort_epoch(e)

    def suspects(self) -> list[str]:
        return unshared(self.sharing, self.dataset)

    def memory(self) -> dict[str, Any]:
        pids = self.pool.pids() if self.pool is not None else []
        shared = sum(c["bytes"] for c in self.sharing.converted) if self.sharing else 0
        return self.memwatch.report(pids, shared)

    def abort_epoch(self, e: int) -> None:
        """Drop the rest of pass ``e`` (an error, load_state_dict, its iterator dropped)."""
        if e not in self.live:
            return
        self._end(e)
        if self.slots is not None:
            self.slots.drop_tasks(e)

    def _end(self, e: int) -> None:
        """Forget pass ``e`` (it delivered its last batch; or abort_epoch, which also drops
        its tasks)."""
        self.live.pop(e, None)
        self.passes.pop(e, None)
        self.queued.pop(e, None)
        self.lost.pop(e, None)

    def next_batch(self, epoch: int, token: int) -> Any:
        self.check_usable()
        if self.passes.get(epoch) != token:
            why = self.superseded.get(token)
            if why is None:
                raise StopIteration  # ended normally, or with an error already raised
            raise RuntimeError(f"this epoch's iterator was superseded: {why}")
        total = self.plan.nbatches_of(epoch)
        b = self.live[epoch]
        if b >= total:
            self._end(epoch)
            raise StopIteration
        if b == 1 and self.pool is not None:
            self.memwatch.first_batch_out(self.pool.pids())
        try:
            batch = self._worker_batch(epoch) if self.pool else self._inprocess_batch(epoch, b)
            if batch is _ENDED:  # NOTE [iterable datasets]: every worker's iterator ended
                raise StopIteration
        except BaseException as e:
            now = self.live.get(epoch)
            if now == b:  # NOTE [errors do not end the epoch]
                self.abort_epoch(epoch)
            elif now is not None and now >= total:
                self._end(epoch)
            if self.closed and isinstance(e, Exception) and not isinstance(e, LoaderClosedError):
                # closed by another thread (Pool.close) mid-batch: whatever broke under us (a
                # closed bell or ring, slots gone) is that, and is said so
                raise LoaderClosedError(
                    f"this Loader was closed while it loaded a batch ({self.closed_reason})"
                ) from e
            raise
        self.live[epoch] = b + 1
        if b + 1 >= total:
            self._end(epoch)
        return (batch, self.plan.mask(epoch, b)) if self.cfg.return_mask else batch

    def _inprocess_batch(self, epoch: int, b: int) -> Any:
        """num_workers=0: the workers' fill path (fastload/_fill.py), into a private buffer."""
        filler, plan = self.filler, self.plan
        assert filler is not None
        try:
            self.layout, batch = filler.load(self.layout, plan.batch(epoch, b), plan.rows,
                                             plan.seed, epoch, self.cfg.sample_spec)
        except Exception:
            self.live[epoch] = b + 1  # NOTE [errors do not end the epoch]
            raise
        if filler.skipped:
            self._note_skips(epoch, filler.skipped)
        return batch if plan.done(epoch, b, filler.rows, filler.flags) else _ENDED

    # -- the worker path ---------------------------------------------------------------------
    def _worker_batch(self, epoch: int) -> Any:
        if self.slots is None:
            self._setup_region(epoch)
        assert (slots := self.slots) is not None
        if self.pending or self.lost or time.monotonic() - self._last_check > POLL_INTERVAL_S:
            self._check_workers(epoch)  # also while data flows: a worker may have died idle
        plan = self.plan
        room: Deadline | None = None
        while True:
            self._refill(epoch)
            task = slots.first_of(epoch)
            if task is None:
                if plan.iterable and plan.all_ended(epoch):
                    return _ENDED
                # NOTE [several passes]: no slot for this pass yet (the others' tasks are
                # being loaded): wait for one to come free
                room = room or Deadline(self.cfg.timeout, self.cfg.on_stall)
                self._check_workers(epoch)
                room.check(lambda: "no slot came free for this pass: the loader's other "
                           "passes and held batches use them all")
                time.sleep(0.001)
                continue
            assert plan.iterable or task.batch == self.live[epoch]
            word = self._wait_slot(task.slot, epoch)
            slots.take(task)
            assert self.mail is not None and self.layout is not None
            info, spilled = slots.ring.slot_info(task.slot), None  # info["pid"]: who published
            if _ring.state_bits(word)[0] == _ring.FAILED:
                slots.release(task.slot)
                self.live[epoch] += 1  # its samples raised: the next next() goes on
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
                    self._note_skips(epoch, self.mail.skipped(task.slot, task.seq, word,
                                                              info["pid"]))
                except BaseException:
                    slots.release(task.slot)
                    raise
            batch = slots.deliver(task.slot, info["rows"], info["var_bytes"], spilled,
                                  self.cfg.copy, self.cfg.max_held)
            self._refill(None)
            return batch

    def _note_skips(self, epoch: int, records: list[tuple[Any, ...]]) -> None:
        """NOTE [skipped samples] (_fill.py): count, log the first, raise past max_skips."""
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
            self.epoch_skips.append((index, f"{kind}: {text}"))
        limit = self.cfg.max_skips
        if limit is not None and len(self.epoch_skips) > limit:
            from .errors import SkipLimitError

            got = self.epoch_skips
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
        """Queue tasks (NOTE [several passes]): first the next batch of pass ``want`` if it has
        none in flight, then up to the prefetch depth, the live epoch with the fewest tasks in
        flight first, then one epoch ahead."""
        slots, pool, plan = self.slots, self.pool, self.plan
        assert slots is not None and pool is not None
        self._end_abandoned()
        slots.reap()
        queued = False
        if want is not None and slots.first_of(want) is None and self._left(want):
            if not slots.free:
                self._make_room(want)
            if slots.free:
                queued = self._queue(want)
        while slots.can_queue(self.cfg.depth):
            e = self._pick()
            if e is None or not self._queue(e):
                break
            queued = True
        newest = self.active_epoch
        if newest is not None and 2 * self.queued.get(newest, 0) >= plan.nbatches_of(newest):
            plan.prepare(newest + 1)  # shuffle the next epoch halfway through this one
        if queued:  # a shared batch: every idle worker may take rows of it
            pool.bell.ring(slots.shared_queued)
            slots.shared_queued = False

    def _left(self, e: int) -> bool:
        """Whether epoch ``e`` has batches not yet queued."""
        return self.queued.get(e, 0) < self.plan.nbatches_of(e)

    def _pick(self) -> int | None:
        """The epoch to queue a task of next: the live one with the fewest tasks in flight
        (the oldest of equals), else the next epoch (never with a batch plan: NOTE [batch
        plans]), else None."""
        slots = self.slots
        assert slots is not None
        best: tuple[int, int] | None = None
        for e in self.live:
            if self._left(e):
                n = slots.count_of(e)
                if best is None or n < best[0]:
                    best = (n, e)
        if best is not None:
            return best[1]
        ahead = self.next_epoch
        if not self.plan.ahead or (self.live and ahead != max(self.live) + 1):
            return None
        self.queued.setdefault(ahead, 0)
        if self.plan.nbatches_of(ahead) == 0 or not self._left(ahead):
            return None
        return ahead

    def _queue(self, e: int) -> bool:
        assert self.slots is not None
        b = self.queued.get(e, 0)
        if b >= self.plan.nbatches_of(e) or not self.slots.free:
            return False
        self.queued[e] = b + 1
        plan = self.plan
        owners: list[int] | None = None  # not shared
        if self.slots.shared and shared_batch(b, plan.nbatches_of(e), self.cfg.num_workers,
                                              ahead=e not in self.live):
            owners = []
            if self.given is not None and self.given[:2] == (e, b):
                owners, self.given = self.given[2], None
        self.slots.queue(e, b, plan.batch(e, b), plan.seed, plan.target(e, b), owners)
        return True

    def _make_room(self, want: int) -> None:
        """No free slot for pass ``want``'s next batch: give up the newest task of the epoch
        with the most in flight (it is queued again when its pass needs it)."""
        slots = self.slots
        assert slots is not None
        counts = {e: slots.count_of(e) for e in {t.epoch for t in slots.inflight}}
        counts.pop(want, None)
        if not counts:
            return  # every slot is held by the user or still loading an abandoned task
        e = max(counts, key=lambda k: (counts[k], k))
        task = slots.drop_newest(e)
        if task is not None:
            self.queued[e] = task.batch
            slots.reap()

    def _wait_slot(self, slot: int, epoch: int) -> int:
        """The slot's word once READY or FAILED (FREE: NOTE [pool callbacks])."""
        assert self.slots is not None
        ring, wait = self.slots.ring, Deadline(self.cfg.timeout, self.cfg.on_stall)
        while True:
            word = ring.wait(slot, wait.step())
            if word >= 0 and _ring.state_bits(word)[0] != _ring.FREE:
                return int(word)
            self._check_workers(epoch)  # waits for the pool's lock: the verdict is there then
            wait.check(lambda: self.slots.why_late(slot))  # type: ignore[union-attr]
            time.sleep(0.001 if word >= 0 else 0)  # (never spin on a FREE slot)

    # -- the first sample and the region -----------------------------------------------------
    def _send_probe(self, e: int | None = None) -> None:
        """Ask a worker (0, for a map-style dataset) for the layout of the next batch's first
        sample; NOTE [first samples]: the first time, also have each other worker load the
        first sample of a later batch."""
        assert self.mail is not None and self.pool is not None
        if e is None:
            e = self.active_epoch if self.active_epoch is not None else self.next_epoch
        b = self.live.get(e, 0)
        warm = 0 if self.warmed else self.cfg.num_workers
        firsts = self.plan.probe_tasks(e, b, warm, self.share)
        if not firsts:
            return
        if self.share:  # the first rows of batch b: given to the workers that load them
            b_rows = self.plan.batch(e, b)
            k = min(len(firsts), len(b_rows))
            self.given = (e, b, [w for w, _ in firsts[:k]])
        (to, sample), rest = firsts[0], firsts[1:]
        alternates: tuple[int, ...] = ()
        if self.cfg.on_error == "skip":  # NOTE [skipped samples]: the rest of its batch
            alternates = tuple(int(i) for i in self.plan.batch(e, b)[1:])
        self.mail.send_probe(m.Probe(self.cid, sample, self.plan.rows, self.plan.seed, e,
                                     self.cfg.sample_spec, alternates=alternates), rest, to)
        self.warmed = True

    def _setup_region(self, e: int) -> None:
        """Wait for worker 0's layout, then create the region and attach every worker."""
        pool, mail = self.pool, self.mail
        assert pool is not None and mail is not None
        wait = Deadline(self.cfg.timeout, self.cfg.on_stall, stall_now=False)
        while True:
            if mail.probe is None:
                self._send_probe(e)
            pool.pump(mail.probe_worker, POLL_INTERVAL_S)
            try:
                mail.collect()
            except BaseException:
                if mail.probe_failed and e in self.live:  # the batch's first sample raised:
                    mail.probe_failed = False  # that batch is consumed; nothing is queued yet
                    self.live[e] += 1
                    self.queued[e] = max(self.queued.get(e, 0), self.live[e])
                raise
            if mail.layout is not None:
                break
            if mail.probe_ended is not None:  # NOTE [iterable datasets]: ask the next worker
                (worker, pe), mail.probe_ended = mail.probe_ended, None
                self.plan.ended(pe, worker)
                if pe == e and self.plan.all_ended(pe):
                    raise StopIteration  # no worker's iterator has a sample this epoch
            self._check_workers(e)
            if mail.probe_started:  # a slow process start is not a slow dataset: count from
                wait.start_stall()  # when worker 0 starts loading the sample
            w = mail.probe_worker
            wait.check(lambda: f"worker {w} (pid {pool.pid_of(w)}) is still "  # noqa: B023
                       f"loading sample index "
                       f"{mail.probe.sample if mail.probe else '?'} (the first sample, which sets "
                       "the batch layout)")
        self.layout = mail.layout
        shared = self.share and not self.layout.n_objects
        slots = self.slots = SlotTable(self.layout, self.cfg.nslots, self.counters, shared)
        if self.closed:  # by another thread, which may have looked at self.slots before it was
            slots.close()  # set (close() sets closed first): never leave a region behind
            self.slots = None
            self.check_usable()
        for i in range(self.cfg.num_workers):
            self._attach(i)

    def _attach(self, i: int) -> None:
        assert self.pool is not None and self.slots is not None
        region = self.slots.region  # a restarted worker is attached by workers_restarted
        self.pool.send(i, m.Attach(self.cid, self.layout, region.nbytes,
                                   self.cfg.on_error == "skip"), region.fd)

    # -- messages and deaths -----------------------------------------------------------------
    def _check_workers(self, epoch: int) -> None:
        """Closed by another thread (pool.close())? Dead workers (any loader's)? Raise here
        what concerns pass ``epoch``: a death that cost it a batch, or any other error."""
        self.check_usable()
        if self.pool is None:
            return
        self._last_check = time.monotonic()
        self.pool.check()
        if epoch in self.lost:
            raise self.lost.pop(epoch)
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
                requeue = not (verdict.fatal and epoch in self.live)
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
                self.lost[epoch] = verdict.error
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
        self.live.clear()
        self.passes.clear()
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
            self.slots = None
            if self.mail is not None:
                self.mail.clear()
            self.dataset = self.filler = None
            if self.sharing is not None:
                self.sharing.close()

    def state_dict(self) -> dict[str, Any]:
        if self.resume is not None:  # loaded, not yet iterated
            return self.plan.state(*self.resume)
        self._end_abandoned()
        if self.live:  # NOTE [several passes]: the oldest live pass
            e = next(iter(self.live))
            return self.plan.state(e, self.live[e])
        if self.left is not None and self.left[0] == self.next_epoch - 1:
            return self.plan.state(*self.left)  # the newest pass, left with break
        return self.plan.state(self.next_epoch, 0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_usable()
        epoch, position = self.plan.restore(state)
        for old in list(self.live):
            self.superseded[self.passes[old]] = "load_state_dict() was called"
            self.abort_epoch(old)
        if self.slots is not None:  # whatever ran ahead belongs to another order
            self.slots.drop_tasks()
        self.next_epoch = epoch
        self.resume = (epoch, position)
        self.queued = {epoch: position}
        self.left = None


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

