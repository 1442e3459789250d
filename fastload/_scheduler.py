"""The scheduler: a loader's slots and what goes into them next.

It owns the ``SlotTable`` (fastload/_slots.py: the region, the ring, the tasks in flight), how far
each epoch is queued, and the sharing policy (which batches workers may cut into pieces, NOTE
[pieces] in csrc/fl_ring.c). It reads the passes (fastload/_passes.py) and the plan; it never
changes them.

NOTE [queueing passes]
Each live pass has its own tasks in the ring, all served by the same workers. ``queued`` says
how far each epoch is queued; a live epoch's tasks in flight are exactly its batches [position,
queued), in order. The queue is shared fairly: the live epoch with the fewest tasks in flight is
topped up first, and a pass waiting for a batch that is not queued gets a slot even past the
prefetch depth (a free one, or the newest task of the epoch with the most in flight, which
re-queues it later), so no pass can starve another. When every live epoch is queued to its end,
the queue runs one epoch ahead (the next ``iter()``'s). A pass that ends unfinished has its
tasks dropped (``drop``).

NOTE [sharing policy]
One sentence: a batch is shared (workers cut it into pieces) when workers would otherwise wait
for one of them (the first batch of an epoch, its last ``2 * num_workers``, and those queued ahead
for the next pass), and only for map-style datasets loaded one ``__getitem__`` at a time into
fixed-shape slots with two workers or more (``may_share``, ``shared_batch``). This is the only
place that decides it; the size of the pieces is the worker's (``_Client._timed`` in _worker.py:
guided pieces of at least 200 us of loading, a batch quicker than 20 ms taken whole). Every other
batch is taken whole, as one piece (NOTE [pieces] in csrc/fl_ring.c: the same protocol).

NOTE [out of order]
``in_order=False`` (torch's): a pass is handed whichever of its tasks in flight is loaded
first, oldest first among those (``SlotTable.await_any``), so a slow sample holds back only
its own batch. ``Pass.position`` then counts the batches delivered, and the tasks in flight are
the batches queued and not delivered, no longer [position, queued). With
``assign="round_robin"`` a batch goes, when it is queued, to the next worker in turn that has
fewer than ``prefetch`` batches outstanding (``_turn``; a plain iterable's tasks through
``IterPlan.room``), as torch's ``_try_put_index`` does, so a stuck worker is skipped instead of
holding every slot. The first sample's layout is taken from whichever worker loads its first
sample first (NOTE [first samples] in _startup.py). A mid-epoch ``state_dict()`` of such a pass
raises: a position cannot say which batches came.
"""

from __future__ import annotations

from typing import Any

from ._passes import Passes
from ._slots import SlotTable, Task

__all__ = ["Scheduler", "may_share", "shared_batch"]


def may_share(cfg: Any, plan: Any, kind: Any) -> bool:
    """Whether a loader's batches may be shared (NOTE [sharing policy]): the setting, two
    workers or more, a dataset of a ``kind`` loaded one ``__getitem__`` a sample (not a whole
    batch through ``__getitems__`` or a gather in C: NOTE [dataset kinds] in _kinds.py), and
    no on_error="skip" (which replaces a sample by another of its batch). The layout decides
    the rest (fixed-shape leaves only: ``Scheduler.start``)."""
    return bool(cfg.share_rows and cfg.num_workers > 1 and kind.per_sample
                and cfg.on_error != "skip")


def shared_batch(b: int, nbatches: int, workers: int, ahead: bool) -> bool:
    """Whether batch ``b`` of an epoch of ``nbatches`` is queued shared: the first batch and the
    last 2 x ``workers``, where workers would otherwise wait for one of them, and every batch
    queued ahead for a pass not yet started (the first batches of that pass once it starts).
    The others are taken whole, in one piece: cutting a batch of tiny samples into pieces costs
    more than it saves."""
    return b == 0 or b >= nbatches - 2 * workers or ahead


class Scheduler:
    """The slots of one loader and the order tasks enter them (NOTE [queueing passes])."""

    def __init__(self, cfg: Any, plan: Any, passes: Passes, share: bool) -> None:
        self.cfg = cfg
        self.plan = plan
        self.passes = passes
        #: Whether batches may be shared (NOTE [sharing policy]); they are if, besides, the
        #: layout is all fixed-shape arrays (``start``).
        self.share = share
        self.slots: SlotTable | None = None  # the shared region, once the layout is known
        self.queued: dict[int, int] = {}  # epoch -> its next batch to queue
        self.depth = cfg.depth  # tasks in flight at most (refill's; read once)
        self.prepared = -1  # the epoch whose order was computed ahead last (_queue)
        #: NOTE [first samples] (_startup.py): the first batch's rows each worker loaded
        self.given: tuple[int, int, list[int]] | None = None  # (epoch, batch, row -> worker)
        self.bell: Any = None  # the pool's (``start``)
        #: NOTE [out of order]: assign="round_robin" with in_order=False is torch's turn: the
        #: next worker in turn with fewer than ``prefetch`` batches outstanding
        self.turns = cfg.assign == "round_robin" and not cfg.in_order and cfg.num_workers > 1
        self.turn = 0  # the worker whose turn comes next
        if self.turns and plan.iterable:  # its tasks are assigned as they are queued
            plan.room = self._has_room

    def start(self, layout: Any, counters: dict[str, int], bell: Any) -> SlotTable:
        """Create the region for ``layout`` (the first sample's); ``bell``: the pool's, rung
        when tasks are queued."""
        shared = self.share and not layout.n_objects
        self.slots = SlotTable(layout, self.cfg.nslots, counters, shared)
        self.bell = bell
        return self.slots

    # -- passes ------------------------------------------------------------------------------
    def queue_from(self, epoch: int, position: int) -> None:
        """Batches of ``epoch`` before ``position`` need no task: a pass starts there, or they
        were consumed before anything was queued (the probe's batch)."""
        self.queued[epoch] = max(self.queued.get(epoch, 0), position)

    def pass_ended(self, epoch: int, drop: bool) -> None:
        """The pass over ``epoch`` ended; ``drop``: unfinished, drop its tasks."""
        self.queued.pop(epoch, None)
        if drop and self.slots is not None:
            self.slots.drop_tasks(epoch)

    def restart_at(self, epoch: int, position: int) -> None:
        """``load_state_dict``: whatever ran ahead belongs to another order."""
        if self.slots is not None:
            self.slots.drop_tasks()
        self.queued = {epoch: position}
        self.prepared = -1

    # -- queueing ----------------------------------------------------------------------------
    def refill(self, want: int) -> Task | None:
        """Take back the slots the user let go, then queue: first the next batch of the pass
        over ``want`` if it has none in flight, then up to the prefetch depth, the live epoch
        with the fewest tasks in flight first, then one epoch ahead; wake the workers. The
        oldest task of ``want`` in flight (its next batch), if any: once per batch, on the
        parent's hot path."""
        slots = self.slots
        assert slots is not None
        slots.reap()
        queued = False
        inflight, free, depth = slots.inflight, slots.free, self.depth
        first = inflight[0] if inflight and inflight[0].epoch == want else slots.first_of(want)
        if first is None and self._left(want):
            if not free:
                self._make_room(want)
            if free and self._queue(want):
                queued, first = True, slots.inflight[-1]
        room = depth - len(inflight)
        live = self.passes.live
        try:
            (only,) = live  # one pass: the usual case
        except ValueError:
            only = None
        while room > 0 and free:
            if only is not None and self._queue(only):  # (no need to pick)
                room -= 1
                queued = True
                continue
            only = None
            e = self._pick()
            if e is None or not self._queue(e):
                break
            room -= 1
            queued = True
        if queued:  # a shared batch: every idle worker may take pieces of it
            self.bell.ring(slots.shared_queued)
            slots.shared_queued = False
        return first

    def _left(self, e: int) -> bool:
        """Whether epoch ``e`` has batches not yet queued."""
        return bool(self.queued.get(e, 0) < self.plan.nbatches_of(e))

    def _pick(self) -> int | None:
        """The epoch to queue a task of next: the live one with the fewest tasks in flight
        (the oldest of equals), else the next epoch (never with a batch plan: NOTE [batch
        plans]), else None."""
        slots = self.slots
        assert slots is not None
        best: tuple[int, int] | None = None
        live = self.passes.live
        if len(live) == 1:  # one pass (the usual case): no counting
            (e,) = live
            if self.queued.get(e, 0) < self.plan.nbatches_of(e):  # _left(e)
                return e
        for e in live:
            if self._left(e):
                n = slots.count_of(e)
                if best is None or n < best[0]:
                    best = (n, e)
        if best is not None:
            return best[1]
        ahead = self.passes.next_epoch
        if not self.plan.ahead or (live and ahead != max(live) + 1):
            return None
        self.queued.setdefault(ahead, 0)
        if self.plan.nbatches_of(ahead) == 0 or not self._left(ahead):
            return None
        return ahead

    def _queue(self, e: int) -> bool:
        slots, plan = self.slots, self.plan
        assert slots is not None
        b = self.queued.get(e, 0)
        n = plan.nbatches_of(e)
        if b >= n or not slots.free:
            return False
        target = plan.target(e, b) if plan.targeted else None
        if self.turns and not plan.iterable:
            target = self._turn()
            if target is None:  # every worker has its prefetch outstanding
                return False
        self.queued[e] = b + 1
        if 2 * (b + 1) >= n and self.prepared <= e:  # halfway through epoch e: shuffle the
            self.prepared = e + 1  # next one now, not when the queue reaches it
            plan.prepare(e + 1)
        owners: list[int] | None = None  # not shared
        # shared_batch(), inline (the hot path)
        if slots.shared and (b == 0 or b >= n - 2 * self.cfg.num_workers
                             or e not in self.passes.live):
            owners = []
            if self.given is not None and self.given[:2] == (e, b):
                owners, self.given = self.given[2], None
        slots.queue(e, b, plan.batch(e, b), plan.seed, target, owners)
        return True

    def _has_room(self, worker: int) -> bool:
        """Whether ``worker`` has fewer than ``prefetch`` batches outstanding (NOTE [out of
        order])."""
        assert self.slots is not None
        outstanding = sum(1 for t in self.slots.inflight if t.target == worker)
        return bool(outstanding < self.cfg.prefetch)

    def _turn(self) -> int | None:
        """torch's in_order=False assignment: the next worker in turn that has room, or None."""
        n = self.cfg.num_workers
        for _ in range(n):
            k, self.turn = self.turn, (self.turn + 1) % n
            if self._has_room(k):
                return k
        return None

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
