"""Loader: the public iterator over batches, and the engine that drives the ring.

NOTE [data path]
The parent plans batches (an epoch's order depends only on seed and epoch), writes each batch's
sample indices into a FREE slot and queues it; a worker claims the slot, calls ``dataset[i]``
for each index and packs every sample straight into its row of the slot; the parent waits for
the slot, and hands the user NumPy views of it whose owner (``.base``) is a ``SlotLease``. The
slot is FREE again when the last array of the batch dies. The queue runs ahead into the next
epoch, so workers keep filling while the user is between epochs.

NOTE [held batches]
The ring has ``num_workers * prefetch`` slots in flight plus ``max_held`` slots the user may hold
as zero-copy batches. When the user already holds ``max_held`` batches, the next batch is
returned as a copy (one memcpy of the slot) and its slot is reused at once: holding any number of
batches never deadlocks and never lets a held batch change. ``Loader.stats()["copied_batches"]``
counts those copies.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ._errors_remote import rebuild_exception
from ._pool import _POLL_INTERVAL_S, Pool, WorkerPool, check_worker_args, exit_code_name
from . import _worker
from ._worker import pack_exception, pack_getitems
from .errors import LoaderClosedError, LoaderTimeoutError, WorkerDied, WorkerError
from .layout import PAGE, BatchLayout

try:
    from . import _pack, _ring
except ImportError as e:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        f"fastload's compiled core is not importable ({e}). Reinstall with a C compiler and "
        "Python headers available (e.g. apt-get install build-essential python3-dev; then "
        "pip install --force-reinstall --no-binary fastload fastload)."
    ) from e

__all__ = ["Loader", "backend"]

#: The compiled core is always in use (there is no slow fallback engine).
backend = "c"

_client_ids = itertools.count()
log = logging.getLogger("fastload")
#: With on_worker_death="restart": a sample that kills this many workers raises WorkerDied.
_MAX_KILLS_PER_SAMPLE = 3


_STATE_NAMES = {
    _ring.FREE: "FREE",
    _ring.QUEUED: "QUEUED",
    _ring.CLAIMED: "CLAIMED",
    _ring.READY: "READY",
    _ring.FAILED: "FAILED",
    _ring.READING: "READING",
}


class _Returner:
    """Takes slots back from dying leases (in whatever thread the last array is freed)."""

    def __init__(self, ring: Any) -> None:
        self.ring = ring
        self.freed: deque[int] = deque()
        self.closed = False

    def release(self, slot: int) -> None:
        if not self.closed:
            self.ring.release(slot)
            self.freed.append(slot)


class _Engine:
    """Everything a loader owns. Holds no reference to the Loader (so finalizers work)."""

    def __init__(
        self,
        dataset: Any,
        n: int,
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        num_workers: int,
        prefetch: int,
        start_method: str | None,
        worker_init: Any,
        timeout: float | None,
        max_held: int,
        copy: bool,
        on_worker_death: str = "raise",
        shard: tuple[int, int] = (0, 1),
        return_mask: bool = False,
        batch_plan: Any = None,
        stall: tuple[float, Any] | None = None,
        pool: Any = None,
    ) -> None:
        self.pid = os.getpid()
        self.cid = next(_client_ids)
        # (seconds, callback): callback(info) once per batch that takes longer than seconds;
        # the wait goes on (Chainer's dataset_timeout warning; fastload.compat.chainer).
        self.stall = stall
        # NOTE [batch plans]: front ends with their own samplers (fastload.compat) pass
        # batch_plan(epoch) -> list of index sequences; it is called once per epoch, in epoch
        # order (the queue runs at most one epoch ahead), and batch_size is then the largest
        # batch it may return.
        self.batch_plan = batch_plan
        self._plans: dict[int, list[np.ndarray[Any, Any]]] = {}
        self.rank, self.world = shard
        self.return_mask = return_mask
        self._masks: dict[int, np.ndarray[Any, Any]] = {}
        self.on_worker_death = on_worker_death
        self.kills: dict[Any, int] = {}
        self.idle_deaths: dict[int, int] = {}
        self.dataset = dataset
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.timeout = timeout
        self.max_held = max_held
        self.copy = copy
        # NOTE [rank sharding]: every rank gets the same number of samples (distributed training
        # hangs otherwise): the epoch's global order is cut (drop_last) or padded by wrapping
        # around to a multiple of world_size, then rank r takes positions r, r + world, ...
        # Padded positions are duplicates; return_mask=True says which samples are real.
        self.n_local = (n // self.world if drop_last else math.ceil(n / self.world)) if n else 0
        n_loc = self.n_local
        self.nbatches = n_loc // batch_size if drop_last else math.ceil(n_loc / batch_size)
        self.depth = max(1, num_workers * prefetch)
        self.nslots = self.depth + max_held
        self.closed = False
        self.closed_reason = ""
        self.layout: BatchLayout | None = None
        self.region: Any = None
        self.ring: Any = None
        self.returner: _Returner | None = None
        self.free: list[int] = []
        self.leased: set[int] = set()
        self.stale: set[int] = set()
        self.inflight: deque[tuple[int, int, int, int]] = deque()  # (seq, slot, epoch, batch)
        self.msgs: dict[tuple[int, int], tuple[Any, ...]] = {}
        self.seq = 0
        self.next_epoch = 0
        self.active_epoch: int | None = None
        self.superseded: set[int] = set()  # epochs whose iterator was replaced mid-way
        self.resume_epoch: int | None = None  # set by load_state_dict
        self.resume_position = 0
        self.consumed = 0
        self.plan_epoch = 0
        self.plan_batch = 0
        self._orders: dict[int, np.ndarray[Any, Any]] = {}
        self.counters = {"copied_batches": 0, "spilled_batches": 0, "worker_restarts": 0}
        self.pool: WorkerPool | None = None
        self.shared_pool = pool  # a fastload.Pool (kept alive while this loader is), or None
        # NOTE [pool callbacks]: workers_died / workers_restarted run in whichever thread checks
        # the pool (another loader's, maybe): they only append here, reclaim slots (one CAS in
        # C each) and send attach messages; this loader raises what they found, in its thread.
        self.pending: deque[BaseException] = deque()
        self._msg_lock = threading.Lock()  # _collect may run in another loader's thread
        self.probe_sent = False
        self.probe_started = False  # worker 0 said it began loading the probe sample
        self.probe_index = -1
        self._last_check = time.monotonic()
        if num_workers > 0:
            self.pool = (
                pool.check_usable() if pool is not None
                else WorkerPool(num_workers, start_method, worker_init, seed, (self.cid, dataset))
            )
            self.pool.register(self.cid, self, dataset)
        if self.pool is not None and batch_plan is None:  # a sampler is asked in its epoch only
            self._send_probe()

    # -- order -------------------------------------------------------------------------------
    def order(self, epoch: int) -> np.ndarray[Any, Any]:
        o = self._orders.get(epoch)
        if o is None:
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
                o = rng.permutation(self.n).astype(np.int64, copy=False)
            else:
                o = np.arange(self.n, dtype=np.int64)
            valid = np.ones(len(o), np.bool_)
            if self.world > 1:  # NOTE [rank sharding]
                total = self.n_local * self.world
                valid = np.arange(total) < self.n
                o = np.resize(o, total)[self.rank :: self.world]
                valid = valid[self.rank :: self.world]
            for old in [e for e in self._orders if e < epoch - 1]:
                del self._orders[old]
                self._masks.pop(old, None)
            self._orders[epoch] = o
            self._masks[epoch] = valid
        return o

    def plan(self, epoch: int) -> list[np.ndarray[Any, Any]]:
        p = self._plans.get(epoch)
        if p is None:
            p = []
            for k, batch in enumerate(self.batch_plan(epoch)):
                a = np.asarray(batch, dtype=np.int64).reshape(-1)
                if not 0 < len(a) <= self.batch_size:
                    raise ValueError(
                        f"batch {k} of epoch {epoch} has {len(a)} indices; expected 1 to "
                        f"{self.batch_size}"
                    )
                if len(a) and (a.min() < 0 or a.max() >= self.n):
                    bad = a[(a < 0) | (a >= self.n)][0]
                    raise IndexError(f"sampler index {bad} out of range for {self.n} samples")
                p.append(a)
            for old in [e for e in self._plans if e < epoch - 1]:
                del self._plans[old]
            self._plans[epoch] = p
        return p

    def nbatches_of(self, epoch: int) -> int:
        return self.nbatches if self.batch_plan is None else len(self.plan(epoch))

    def batch_indices(self, epoch: int, b: int) -> np.ndarray[Any, Any]:
        if self.batch_plan is not None:
            return self.plan(epoch)[b]
        return self.order(epoch)[b * self.batch_size : (b + 1) * self.batch_size]

    # -- epochs ------------------------------------------------------------------------------
    def check_usable(self) -> None:
        if self.closed:
            raise LoaderClosedError(f"this Loader is closed ({self.closed_reason}); create a new one")
        if os.getpid() != self.pid:
            raise RuntimeError(
                "a fastload Loader can only be used in the process that created it "
                f"(created in pid {self.pid}, used in pid {os.getpid()})"
            )

    def start_epoch(self) -> int:
        self.check_usable()
        if self.active_epoch is not None:
            self.superseded.add(self.active_epoch)
            self.abort_epoch()
        e = self.next_epoch
        self.next_epoch += 1
        self.active_epoch = e
        self.consumed = self.resume_position if e == self.resume_epoch else 0
        self.resume_epoch, self.resume_position = None, 0
        self.kills.clear()
        self.idle_deaths.clear()
        if self.plan_epoch < e:
            self.plan_epoch, self.plan_batch = e, 0
        return e

    def abort_epoch(self) -> None:
        """Drop the rest of the active epoch (break, error, or a new iter())."""
        e = self.active_epoch
        if e is None:
            return
        self.active_epoch = None
        if self.ring is not None:
            keep: deque[tuple[int, int, int, int]] = deque()
            for task in self.inflight:
                if task[2] == e:
                    self._drop_slot(task[1])
                else:
                    keep.append(task)
            self.inflight = keep
        if self.plan_epoch == e:
            self.plan_epoch, self.plan_batch = e + 1, 0

    def _drop_slot(self, slot: int) -> None:
        if self.ring.cancel(slot) or _ring.state_bits(self.ring.state(slot))[0] == _ring.FREE:
            self.free.append(slot)  # unclaimed, or abandoned by a reclaim
        else:
            self.stale.add(slot)

    # -- the batch path ----------------------------------------------------------------------
    def next_batch(self, epoch: int) -> Any:
        self.check_usable()
        if self.active_epoch != epoch:
            if epoch not in self.superseded:
                raise StopIteration  # ended normally, or with an error already raised
            raise RuntimeError(
                "this epoch's iterator was superseded: iter(loader) was called again (a new "
                "epoch started) or the epoch ended with an error"
            )
        if self.consumed >= self.nbatches_of(epoch):
            self.active_epoch = None
            raise StopIteration
        try:
            if self.pool is None:
                batch = self._inprocess_batch(epoch, self.consumed)
            else:
                batch = self._worker_batch(epoch)
        except BaseException:
            self.abort_epoch()
            raise
        b = self.consumed
        self.consumed += 1
        if self.consumed >= self.nbatches_of(epoch):
            self.active_epoch = None
        if self.return_mask:
            self.order(epoch)
            mask = self._masks[epoch][b * self.batch_size : (b + 1) * self.batch_size].copy()
            return batch, mask
        return batch

    def _inprocess_batch(self, epoch: int, b: int) -> Any:
        idx = self.batch_indices(epoch, b).tolist()
        index = idx[0]
        try:
            if self.layout is None:
                ctx = _worker._sample_ctx
                ctx[0], ctx[1], ctx[2] = self.seed, epoch, index
                try:
                    self.layout = BatchLayout(self.dataset[index], self.batch_size)
                finally:
                    ctx[2] = -1
            lay = self.layout
            buf = np.empty(lay.slot_bytes, np.uint8)
            packer = _pack.Packer(buf, 0, lay.slot_bytes, 1, lay.batch_size, lay.tree, lay.packer_fields)
            objs: list[Any] = []
            getitems = getattr(self.dataset, "__getitems__", None)
            ctx = _worker._sample_ctx
            ctx[0], ctx[1] = self.seed, epoch
            try:
                if getitems is not None:
                    pack_getitems(packer, 0, idx, getitems(idx), objs)
                else:
                    for row, index in enumerate(idx):
                        ctx[2] = index
                        packer.pack(0, row, self.dataset[index], objs)
            finally:
                ctx[2] = -1
            packer.close()
        except Exception as e:
            exc = rebuild_exception(pack_exception(e, index, None))  # type: ignore[arg-type]
            raise exc from exc.__cause__  # the RemoteTraceback, as for worker errors
        return lay.unpack(buf, len(idx), objs)

    def _worker_batch(self, epoch: int) -> Any:
        if self.ring is None:
            self._setup_region()
        if self.pending or time.monotonic() - self._last_check > _POLL_INTERVAL_S:
            self._check_workers()  # also while data flows: a worker may have died idle
        self._refill()
        seq, slot, task_epoch, b = self.inflight[0]
        assert task_epoch == epoch and b == self.consumed, (task_epoch, epoch, b, self.consumed)
        word = self._wait_slot(slot)
        self.inflight.popleft()
        st, owner, _gen = _ring.state_bits(word)
        if st == _ring.FAILED:
            msg = self._take_msg(owner, slot, word)
            self.ring.release(slot)
            self.free.append(slot)
            if msg is None:
                raise WorkerDied(
                    f"worker {owner} failed batch {b} of epoch {epoch} and died before it could "
                    "report why"
                )
            raise rebuild_exception(msg[4])
        batch = self._deliver(slot, word)
        self._refill()
        return batch

    def _deliver(self, slot: int, word: int) -> Any:
        lay, ring = self.layout, self.ring
        assert lay is not None
        info = ring.slot_info(slot)
        count = info["count"]
        base = ring.data_offset + slot * ring.slot_bytes
        objects: list[Any] | None = None
        if lay.n_objects:
            if info["flags"] & _ring.F_SPILLED:
                msg = self._take_msg(info["owner"], slot, word)
                if msg is None:
                    raise WorkerDied(f"worker {info['owner']} died while sending batch objects")
                objects = pickle.loads(msg[4])
                self.counters["spilled_batches"] += 1
            else:
                start = base + lay.var_offset
                objects = pickle.loads(self.region.mm[start : start + info["var_bytes"]])
        self._drain_freed()
        if not self.copy and len(self.leased) < self.max_held:
            ring.begin_read(slot)
            lease = _pack.SlotLease(self.region.mm, base, ring.slot_bytes, slot, self.returner)
            self.leased.add(slot)
            return lay.unpack(lease, count, objects)
        # NOTE [held batches]: too many batches held (or copy=True): one copy, slot back at once.
        data = np.empty(lay.var_offset, np.uint8)
        data[:] = np.frombuffer(self.region.mm, np.uint8, lay.var_offset, base)
        ring.release(slot)
        self.free.append(slot)
        if not self.copy:
            self.counters["copied_batches"] += 1
        return lay.unpack(data, count, objects)

    def _drain_freed(self) -> None:
        freed = self.returner.freed if self.returner is not None else None
        while freed:
            s = freed.popleft()
            self.leased.discard(s)
            self.free.append(s)

    def _refill(self) -> None:
        self._drain_freed()
        ring = self.ring
        self._reap_stale()
        cur = self.active_epoch if self.active_epoch is not None else self.next_epoch
        if (self.batch_plan is None and self.shuffle and cur + 1 not in self._orders
                and self.plan_epoch == cur and 2 * self.plan_batch >= self.nbatches):
            # Shuffle the next epoch halfway through this one, while the queue is full: done at
            # the last moment it stalled the workers for the permutation's time (ms for 1e6).
            self.order(cur + 1)
        lay = self.layout
        assert lay is not None and self.pool is not None
        bell = self.pool.bell
        while len(self.inflight) < self.depth and self.free:
            if self.batch_plan is not None and self.plan_epoch > cur:
                break  # NOTE [batch plans]: a sampler is only asked once its epoch has started
            if self.plan_batch >= self.nbatches_of(self.plan_epoch):
                if self.plan_epoch >= cur + (0 if self.batch_plan is not None else 1):
                    break  # never plan more than one epoch ahead
                self.plan_epoch, self.plan_batch = self.plan_epoch + 1, 0
                if self.nbatches_of(self.plan_epoch) == 0:
                    break
                continue
            idx = self.batch_indices(self.plan_epoch, self.plan_batch)
            slot = self.free.pop()
            base = ring.data_offset + slot * ring.slot_bytes
            task = np.frombuffer(self.region.mm, np.int64, lay.batch_size + 1, base)
            task[: len(idx)] = idx  # NOTE [slot payload layout] in layout.py
            task[-1] = self.seed
            ring.queue(slot, self.seq, self.plan_epoch, len(idx))
            bell.ring()
            self.inflight.append((self.seq, slot, self.plan_epoch, self.plan_batch))
            self.seq += 1
            self.plan_batch += 1

    def _wait_slot(self, slot: int) -> int:
        deadline = self._deadline()
        stall_at = self._stall_at()
        ring = self.ring
        while True:
            now = time.monotonic()
            word = ring.wait(slot, max(min(_POLL_INTERVAL_S, deadline - now, stall_at - now), 0.0))
            if word >= 0:
                return word
            self._check_workers()
            stall_at = self._watch(deadline, stall_at, lambda: self._why_late(slot))

    # The two limits of a wait for a batch: the user's timeout (LoaderTimeoutError) and the
    # stall hook (called once, the wait goes on). Monotonic times; math.inf: no limit.
    def _deadline(self) -> float:
        return math.inf if self.timeout is None else time.monotonic() + self.timeout

    def _stall_at(self) -> float:
        return math.inf if self.stall is None else time.monotonic() + self.stall[0]

    def _watch(self, deadline: float, stall_at: float, why: Any) -> float:
        """Raise past the deadline; past stall_at, report why() once. Returns the new stall_at."""
        now = time.monotonic()
        if now >= deadline:
            raise LoaderTimeoutError(f"no batch within timeout={self.timeout}s: {why()}")
        if now >= stall_at:
            assert self.stall is not None
            self.stall[1](why())
            return math.inf
        return stall_at

    def _why_late(self, slot: int) -> str:
        """What the batch in ``slot`` is waiting for: which worker loads which sample, or none."""
        info = self.ring.slot_info(slot)
        st = info["state"]
        if st == _ring.CLAIMED:
            index, row, count = self._loading(slot, info)
            return (
                f"worker {info['owner']} (pid {info['pid']}) has been loading sample index "
                f"{index} (row {row} of {count} in this batch) for too long"
            )
        return (
            f"the batch was still {_STATE_NAMES.get(st, st)} (no worker picked it up); "
            f"{len(self.leased)} batches still referenced by the caller"
        )

    def _loading(self, slot: int, info: dict[str, Any]) -> tuple[int | None, int, int]:
        """(sample index, row, rows) a worker is loading in a CLAIMED slot, from its progress."""
        idx = self.indices_of(slot)
        row = min(info["progress"], max(len(idx) - 1, 0))
        return (idx[row] if idx else None), row, len(idx)

    def indices_of(self, slot: int) -> list[int]:
        ring, lay = self.ring, self.layout
        assert lay is not None
        count = ring.slot_count(slot)
        base = ring.data_offset + slot * ring.slot_bytes + lay.index_offset
        return np.frombuffer(self.region.mm, np.int64, count, base).tolist()  # type: ignore[no-any-return]

    # -- workers -----------------------------------------------------------------------------
    def _send_probe(self) -> None:
        assert self.pool is not None
        e = self.active_epoch if self.active_epoch is not None else self.next_epoch
        if self.n == 0 or self.nbatches_of(e) == 0:
            return
        self.probe_index = int(self.batch_indices(e, self.consumed)[0])
        # False if worker 0 is dead: _check_workers restarts it and we ask again.
        self.probe_sent = self.pool.send(0, ("probe", self.cid, self.probe_index, self.batch_size))

    def _setup_region(self) -> None:
        """Wait for worker 0's layout, then create the region and attach every worker."""
        pool = self.pool
        assert pool is not None
        if not self.probe_sent:
            self._send_probe()
        deadline = self._deadline()
        stall_at: float | None = None  # counted from when worker 0 starts loading the sample
        while True:
            pool.pump(0, _POLL_INTERVAL_S)
            self._collect()
            if self.layout is not None:
                break
            self._check_workers()
            if not self.probe_sent:
                self._send_probe()
            if stall_at is None and self.probe_started:  # a slow process start is not a slow
                stall_at = self._stall_at()                 # dataset: count from here
            next_stall = self._watch(
                deadline, math.inf if stall_at is None else stall_at,
                lambda: f"worker 0 (pid {pool.pid_of(0)}) is still loading sample index "
                f"{self.probe_index} (the first sample, which sets the batch layout)",
            )
            if stall_at is not None:
                stall_at = next_stall
        lay = self.layout
        assert lay is not None
        ctl = _ring.control_nbytes(self.nslots)
        data_offset = -(-ctl // PAGE) * PAGE
        total = data_offset + self.nslots * lay.slot_bytes
        from ._region import SharedRegion

        self.region = SharedRegion(total)
        self.ring = _ring.RingIndex.create(self.region.mm, self.nslots, lay.slot_bytes, data_offset, os.getpid())
        self.returner = _Returner(self.ring)
        self.free = list(range(self.nslots - 1, -1, -1))
        for i in range(self.num_workers):
            self._attach(i)

    def _attach(self, i: int) -> None:
        pool = self.pool
        assert pool is not None and self.region is not None
        # A dead worker is re-attached when check() has restarted it (workers_restarted).
        pool.send(i, ("attach", self.cid, self.layout, self.region.nbytes), self.region.fd)

    def _collect(self) -> None:
        """Take the messages the pool routed to this loader: keep batch errors and spills for
        the slots they concern; raise what stops the loader from starting (after keeping the
        rest)."""
        assert self.pool is not None
        first: BaseException | None = None
        with self._msg_lock:  # NOTE [pool callbacks]
            for i, msg in self.pool.take(self.cid):
                try:
                    self._note(i, msg)
                except BaseException as e:
                    first = first or e
        if first is not None:
            raise first

    def _note(self, i: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind in ("error", "spill"):
            # Keyed by (slot, generation): the worker sends its CLAIMED state word, the
            # parent holds the READY/FAILED one; both carry the same generation.
            self.msgs[(msg[2], msg[3] >> 16)] = msg
        elif kind == "probe_start":
            self.probe_started = True
        elif kind == "layout":
            if self.layout is None:
                self.layout = msg[2]
        elif kind == "probe_error":
            self.probe_sent = False
            raise rebuild_exception(msg[2])
        elif kind == "init_error":
            self.probe_sent = False
            raise rebuild_exception(msg[1])
        elif kind == "dataset_error":
            exc = rebuild_exception(msg[2])
            what = pickle.loads(msg[2])["message"]  # without the traceback (in __cause__)
            raise WorkerError(
                f"worker {i} could not unpickle the dataset: {type(exc).__name__}: {what}. "
                "A Loader on a shared fastload.Pool sends its dataset, pickled, to workers "
                "that are already running: its class must be importable there (define it "
                "in a module, or, with fork, in the main script before the Pool is created)"
            ) from exc

    def _check_workers(self) -> None:
        """Detect dead workers (of the pool, whichever loader they were serving), have them
        restarted, and raise what their death means for this loader (see workers_died)."""
        pool = self.pool
        if pool is None:
            return
        self._last_check = time.monotonic()
        pool.check()
        if self.pending:
            exc = self.pending.popleft()
            self.pending.clear()  # one error at a time: the rest concern the same deaths
            raise exc

    def workers_died(self, deaths: list[tuple[int, int | None, int | None]]) -> None:
        """The pool found dead workers (called before they are restarted).

        A worker that held no batch of this loader (it died idle, or serving another loader)
        is restarted quietly. Otherwise, with on_worker_death="restart" its batches are
        re-queued for the fresh worker; with "raise" (or once a sample has killed
        _MAX_KILLS_PER_SAMPLE workers) the batches of the running epoch are abandoned, so no
        other worker picks up a doomed batch, and WorkerDied is raised at this loader's next
        check. Batches prefetched for the next epoch are always re-queued.
        """
        reports, held = [], []  # held: (worker, slot, epoch)
        any_lost = False
        startup_failure = None
        try:
            self._collect()
        except BaseException as e:  # an init or probe error: raise it rather than a death
            self.pending.append(e)
            return
        for i, pid, code in deaths:
            lost = []
            if self.ring is not None:
                for s in range(self.nslots):
                    info = self.ring.slot_info(s)
                    if info["state"] == _ring.CLAIMED and info["owner"] == i:
                        lost.append(self._loading(s, info)[0])
                        held.append((i, s, info["epoch"]))
            elif i == 0 and self.probe_sent and self.layout is None:
                if self.probe_started:  # it died loading the first sample
                    lost.append(self.probe_index)
                self.probe_sent = self.probe_started = False  # asked again after the restart
            name = exit_code_name(code)
            hint = ""
            if code == -7:  # SIGBUS
                hint = (
                    " (SIGBUS: shared memory exhausted: free memory or enlarge /dev/shm, "
                    "or reduce batch_size/prefetch)"
                )
            where = f" while loading sample index {lost[0]}" if lost else " while idle"
            reports.append(f"worker {i} (pid {pid}) died with {name}{where}{hint}")
            for index in lost:
                self.kills[index] = self.kills.get(index, 0) + 1
            any_lost = any_lost or bool(lost)
            if not lost:
                n_idle = self.idle_deaths[i] = self.idle_deaths.get(i, 0) + 1
                if n_idle >= _MAX_KILLS_PER_SAMPLE:
                    # Dying without ever holding a batch, again and again: a start-up failure
                    # (e.g. an import error under spawn). Restarting forever would hang.
                    startup_failure = (
                        f"worker {i} died {n_idle} times without loading anything (last: pid "
                        f"{pid}, {name}); it fails while starting: see its stderr above"
                    )
        worst = max(self.kills.items(), key=lambda kv: kv[1], default=(None, 0))
        fatal = any_lost and (
            self.on_worker_death == "raise" or worst[1] >= _MAX_KILLS_PER_SAMPLE
        )
        if self.ring is not None:
            for i, s, epoch in held:
                self.ring.reclaim_slot(s, i, not (fatal and epoch == self.active_epoch))
        report = "; ".join(reports)
        if startup_failure is not None and not fatal:
            self.pending.append(WorkerDied(startup_failure))
        elif not fatal:
            log.warning("%s; restarted it%s", report, " and re-queued its batch" if held else "")
        elif self.on_worker_death == "restart":
            self.pending.append(WorkerDied(
                f"{report}. Sample index {worst[0]} killed a worker {worst[1]} times; giving up "
                "on this epoch (the worker was restarted)."
            ))
        else:
            self.pending.append(WorkerDied(
                f"{report}. It was restarted; this epoch was stopped, the next one runs normally "
                "(pass on_worker_death='restart' to recompute the lost batch instead)."
            ))

    def workers_restarted(self, restarted: list[int]) -> None:
        """The pool restarted these workers (they have this loader's dataset again)."""
        self.counters["worker_restarts"] += len(restarted)
        if self.ring is not None:
            for i in restarted:
                self._attach(i)

    def _reap_stale(self) -> None:
        """Free the slots of abandoned tasks that no worker holds any more."""
        ring = self.ring
        for s in list(self.stale):
            st = _ring.state_bits(ring.state(s))[0]
            if st in (_ring.READY, _ring.FAILED):
                ring.release(s)
            elif not (st == _ring.FREE or (st == _ring.QUEUED and ring.cancel(s))):
                continue  # still being loaded (FREE/QUEUED: abandoned or re-queued by a reclaim)
            self.stale.discard(s)
            self.free.append(s)

    def _take_msg(self, worker: int, slot: int, word: int) -> tuple[Any, ...] | None:
        """The pipe message that worker sent about (slot, word), watching its liveness."""
        key = (slot, word >> 16)
        pool = self.pool
        assert pool is not None
        incarnation = pool.incarnation[worker]
        while True:
            self._collect()
            if key in self.msgs:
                return self.msgs.pop(key)
            p = pool.procs[worker]
            if pool.incarnation[worker] != incarnation or p is None or p.exitcode is not None:
                pool.pump(worker, 0)  # it died: what it sent is all there is
                self._collect()
                return self.msgs.pop(key, None)
            pool.pump(worker, _POLL_INTERVAL_S)

    # -- shutdown ----------------------------------------------------------------------------
    def close(self, reason: str = "close() was called") -> None:
        """NOTE [shutdown] (fastload/_pool.py, docs/design.md). Idempotent; never raises."""
        if self.closed or os.getpid() != self.pid:
            return
        self.closed = True
        self.closed_reason = reason
        self.active_epoch = None
        try:
            if self.ring is not None:
                self.ring.stop()  # step 1
            if self.pool is not None:
                if self.shared_pool is None:
                    self.pool.close()  # steps 2-3
                else:  # the pool's workers stay; they unmap our region and drop our dataset
                    self.pool.unregister(self.cid)
        finally:
            if self.returner is not None:
                self.returner.closed = True
            if self.ring is not None:
                self.ring.close()
            if self.region is not None:
                self.region.close()  # step 5
                # Live zero-copy batches keep the mapping (their leases export it); dropping our
                # reference lets it be unmapped, and its fd closed, with the last of them.
                self.region = None
            self.inflight.clear()
            self.msgs.clear()
            self.dataset = None

    # -- resume ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.active_epoch is not None:
            epoch, position = self.active_epoch, self.consumed
        else:
            epoch, position = self.next_epoch, 0
        if self.resume_epoch is not None:  # loaded, not yet iterated
            epoch, position = self.resume_epoch, self.resume_position
        return {
            "format": "fastload.Loader/1",
            "seed": self.seed,
            "epoch": epoch,
            "position": position,
            "len": self.n,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "shard": [self.rank, self.world],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_usable()
        if self.batch_plan is not None:
            raise NotImplementedError("resuming a loader driven by a custom sampler")
        if state.get("format") != "fastload.Loader/1":
            raise ValueError(f"not a fastload Loader state: format {state.get('format')!r}")
        for key, mine in (("len", self.n), ("batch_size", self.batch_size),
                          ("shuffle", self.shuffle), ("drop_last", self.drop_last),
                          ("shard", [self.rank, self.world])):
            if state.get(key, [0, 1] if key == "shard" else None) != mine:
                raise ValueError(
                    f"the state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{key}={mine!r}; resuming would not reproduce the same batches"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not (0 <= position <= self.nbatches):
            raise ValueError(f"invalid state: epoch {epoch}, position {position}")
        if self.active_epoch is not None:
            self.superseded.add(self.active_epoch)
            self.abort_epoch()
        if self.ring is not None:  # whatever ran ahead belongs to another order
            for task in self.inflight:
                self._drop_slot(task[1])
            self.inflight.clear()
        self.seed = int(state["seed"])
        self._orders.clear()
        self.next_epoch = epoch
        self.resume_epoch, self.resume_position = epoch, position
        self.plan_epoch, self.plan_batch = epoch, position
        self.superseded = {e for e in self.superseded if e < epoch}

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counters)
        out["held_batches"] = len(self.leased) - len(self.returner.freed if self.returner else ())
        out["nslots"] = self.nslots
        out["slot_bytes"] = self.layout.slot_bytes if self.layout is not None else None
        if self.ring is not None and not self.ring.closed:
            out["ring"] = self.ring.stats()
        return out


_SHARD_ENV = (
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)


def _resolve_shard(shard: tuple[int, int] | str | None) -> tuple[int, int]:
    if shard is None:
        return (0, 1)
    if shard == "auto":
        for rk, wk in _SHARD_ENV:
            if rk in os.environ and wk in os.environ:
                try:
                    rank, world = int(os.environ[rk]), int(os.environ[wk])
                except ValueError:
                    raise ValueError(
                        f"shard='auto': {rk}={os.environ[rk]!r}, {wk}={os.environ[wk]!r} are not "
                        "integers"
                    ) from None
                return _resolve_shard((rank, world))
        return (0, 1)
    if isinstance(shard, str):
        raise ValueError(f"shard must be None, 'auto' or (rank, world_size), got {shard!r}")
    try:
        rank, world = (int(x) for x in shard)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"shard must be None, 'auto' or (rank, world_size), got {shard!r}") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"shard=(rank, world_size) needs 0 <= rank < world_size, got {shard!r}")
    return (rank, world)


class _EpochIterator(Iterator[Any]):
    """One pass over the loader: ``iter(loader)``. ``epoch`` is the epoch it iterates
    (0, 1, ... in the order ``iter()`` was called, or as resumed by ``load_state_dict``)."""

    def __init__(self, engine: _Engine, loader: Loader) -> None:
        self._engine = engine
        # Keeps the loader alive while its epoch is iterated: ``for b in Loader(...)`` would
        # otherwise close the loader (its finalizer runs) right after iter().
        self._loader = loader
        self.epoch = engine.start_epoch()

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        return self._engine.next_batch(self.epoch)

    def __len__(self) -> int:
        return self._engine.nbatches


class Loader:
    """Batches of NumPy arrays from a dataset, loaded by persistent worker processes.

    Parameters
    ----------
    dataset : object
        Anything with ``__len__`` and ``__getitem__(int)``; a sample is an array, a scalar, or a
        tuple / list / dict / namedtuple of them, nested to any depth. Leaves that are not
        arrays or numbers (strings, arbitrary objects) are delivered as a list per batch. A
        ``__getitems__(list_of_int)`` method, if present, is called once per batch instead.
    batch_size : int
        Samples per batch (the last batch may be smaller unless ``drop_last``).
    shuffle : bool
        Reshuffle every epoch. The order depends only on ``(seed, epoch)``.
    seed : int, optional
        Seed of the shuffle and of each worker's global RNGs; random if None.
    drop_last : bool
        Drop the last, incomplete batch.
    num_workers : int, optional
        Worker processes; None means ``os.cpu_count()``; 0 loads in the calling process with
        identical results.
    prefetch : int
        Batches in flight per worker.
    start_method : {"fork", "forkserver", "spawn"}, optional
        How workers start. Default: fork when the parent is single-threaded on Linux, else
        forkserver.
    worker_init : callable, optional
        Called once in each worker as ``worker_init(worker_id)`` before it loads anything.
    timeout : float, optional
        Seconds to wait for one batch before raising :class:`LoaderTimeoutError`.
    max_held : int
        Zero-copy batches the caller may hold at once; past that, batches are copies (see
        NOTE [held batches] in fastload/loader.py).
    copy : bool
        Always return owned copies instead of zero-copy views.
    shard : (rank, world_size), "auto" or None
        Load only this rank's share of every epoch (NOTE [rank sharding] in loader.py): ranks
        are disjoint, cover the dataset, and get the same number of batches; without
        ``drop_last`` the last positions are padded with wrapped-around samples. ``"auto"`` reads
        torchrun's ``RANK``/``WORLD_SIZE``, Slurm's ``SLURM_PROCID``/``SLURM_NTASKS`` or Open
        MPI's ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` (a single process if none is set).
    return_mask : bool
        Yield ``(batch, mask)`` where ``mask`` is a bool array, False for padded duplicates, so
        evaluation metrics can ignore them.
    pool : fastload.Pool, optional
        Use this pool's worker processes instead of starting new ones (``num_workers``,
        ``start_method`` and ``worker_init`` are the pool's). The dataset is sent to the pool's
        workers once, pickled. Closing the loader leaves the pool running.
    on_worker_death : {"raise", "restart"}
        What a dead worker (signal, ``os._exit``, OOM kill) does to the epoch. Either way the
        worker is restarted. ``"raise"``: :class:`WorkerDied` ends the epoch. ``"restart"``: the
        batch it was loading is loaded again by the fresh worker and the epoch goes on; a sample
        that kills 3 workers raises :class:`WorkerDied` naming its index.
    batch_plan : callable, optional
        ``batch_plan(epoch)`` returns the epoch's batches as sequences of sample indices (for
        samplers of your own: the front ends in :mod:`fastload.compat` drive torch's and
        Chainer's samplers through it). It is called once per epoch, at the epoch's first
        ``next()``, never ahead of it, so a sampler may depend on what happened before;
        ``batch_size`` is then the largest batch it may return, and ``shuffle``,
        ``drop_last`` and ``shard`` do not apply. The epoch number is the ``epoch`` attribute
        of ``iter(loader)``. A loader with a batch plan cannot be resumed with
        :meth:`load_state_dict` (the plan's owner knows where it was).
    on_stall : (seconds, callback), optional
        ``callback(description)`` is called once for each batch that takes longer than
        ``seconds`` to arrive (also while the first sample, which sets the layout, is loading),
        with a sentence saying which worker loads which sample; the wait goes on (unlike
        ``timeout``).

    Examples
    --------
    >>> import numpy as np, fastload
    >>> data = np.arange(10, dtype=np.float32)
    >>> with fastload.Loader(data, batch_size=4, num_workers=0) as loader:
    ...     [b.tolist() for b in loader]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        num_workers: int | None = None,
        prefetch: int = 2,
        start_method: str | None = None,
        worker_init: Any = None,
        timeout: float | None = None,
        max_held: int = 3,
        copy: bool = False,
        on_worker_death: str = "raise",
        shard: tuple[int, int] | str | None = None,
        return_mask: bool = False,
        pool: Pool | None = None,
        batch_plan: Callable[[int], Iterable[Sequence[int]]] | None = None,
        on_stall: tuple[float, Callable[[str], None]] | None = None,
    ) -> None:
        self._engine: _Engine | None = None
        rank_world = _resolve_shard(shard)
        if on_worker_death not in ("raise", "restart"):
            raise ValueError(
                f"on_worker_death must be 'raise' or 'restart', got {on_worker_death!r}"
            )
        if not hasattr(dataset, "__getitem__"):
            raise TypeError(
                f"dataset must support __getitem__(int) and __len__(); got {type(dataset).__name__}"
            )
        try:
            n = len(dataset)
        except TypeError:
            raise TypeError(
                f"dataset must define __len__(); {type(dataset).__name__} has no len()"
            ) from None
        n = int(n)
        if n < 0:
            raise ValueError(f"len(dataset) must be >= 0, got {n}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if num_workers is None and pool is None:
            num_workers = os.cpu_count() or 1
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1, got {prefetch!r}")
        if isinstance(max_held, bool) or not isinstance(max_held, int) or max_held < 0:
            raise ValueError(f"max_held must be an int >= 0, got {max_held!r}")
        if batch_plan is not None and not callable(batch_plan):
            raise TypeError(f"batch_plan must be callable, got {type(batch_plan).__name__}")
        if on_stall is not None and not (
            isinstance(on_stall, tuple) and len(on_stall) == 2 and on_stall[0] > 0
            and callable(on_stall[1])
        ):
            raise ValueError(f"on_stall must be (seconds > 0, callable), got {on_stall!r}")
        if timeout is not None and not (timeout > 0):
            raise ValueError(f"timeout must be None or > 0 seconds, got {timeout!r}")
        seed = check_worker_args(num_workers, start_method, worker_init, seed, min_workers=0)
        if pool is not None:
            if not isinstance(pool, Pool):
                raise TypeError(f"pool must be a fastload.Pool, got {type(pool).__name__}")
            pool.check_usable()
            for name, mine, theirs in (("num_workers", num_workers, pool.num_workers),
                                       ("start_method", start_method, pool.start_method)):
                if mine is not None and mine != theirs:
                    raise ValueError(
                        f"{name}={mine!r} conflicts with the pool's {name}={theirs!r}; leave "
                        f"{name} unset when passing pool= (the pool's workers serve this loader)"
                    )
            if worker_init is not None:
                raise ValueError(
                    "worker_init runs once per worker when the pool starts: pass it to "
                    "fastload.Pool(..., worker_init=...), not to a Loader on that pool"
                )
            num_workers = pool.num_workers
        if n == 0 or num_workers is None:
            num_workers = 0  # nothing to load: start no process
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = int(seed)
        self._engine = _Engine(
            dataset, n, batch_size, shuffle, int(seed), drop_last, num_workers, prefetch,
            start_method, worker_init, timeout, max_held, copy, on_worker_death, rank_world,
            return_mask, batch_plan, on_stall, pool,
        )
        from multiprocessing.util import Finalize

        # Runs on garbage collection, and at interpreter exit before multiprocessing reaps its
        # children (exitpriority >= 0 runs in _exit_function's first pass).
        self._finalizer = Finalize(self, _Engine.close, args=(self._engine,), exitpriority=10)

    @property
    def layout(self) -> BatchLayout | None:
        """The :class:`BatchLayout` of this loader's batches, known once the first sample has
        loaded (None before)."""
        return None if self._engine is None else self._engine.layout

    @property
    def start_method(self) -> str | None:
        """The start method in use (None when there are no worker processes)."""
        e = self._engine
        return None if e is None or e.pool is None else e.pool.start_method

    def __len__(self) -> int:
        assert self._engine is not None
        e = self._engine
        return e.nbatches_of(e.active_epoch if e.active_epoch is not None else e.next_epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._engine is None:
            raise LoaderClosedError("this Loader was not constructed")
        return _EpochIterator(self._engine, self)

    def close(self) -> None:
        """Stop the workers and free the shared memory. Idempotent.

        Batches still referenced stay valid (their memory is freed with the last of them).
        """
        if self._engine is not None:
            self._engine.close()

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: a small JSON-serialisable dict (seed, epoch, position).

        Taken after receiving batch ``k`` of an epoch, a loader that loads it continues with
        batch ``k + 1``; taken between epochs, with the next epoch. No sample data is stored.
        """
        assert self._engine is not None
        return self._engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken (any num_workers or start method).

        The dataset length, batch_size, shuffle and drop_last must match; the seed is taken
        from the state. The next ``for`` over the loader resumes mid-epoch if the state was.
        """
        if self._engine is None:
            raise LoaderClosedError("this Loader was not constructed")
        self._engine.load_state_dict(state)
        self.seed = self._engine.seed

    def stats(self) -> dict[str, Any]:
        """Counters: copied and spilled batches, worker restarts, ring operations."""
        assert self._engine is not None
        return self._engine.stats()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        e = self._engine
        state = "closed" if e is None or e.closed else "open"
        return (
            f"<fastload.Loader batch_size={self.batch_size} num_workers={self.num_workers} "
            f"batches={len(self) if e else '?'} {state}>"
        )
