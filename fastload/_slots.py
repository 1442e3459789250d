"""The slots of a loader's shared region: where a slot's task and data are, and, in the parent,
which slots are free, queued, held by the user or abandoned.

NOTE [held batches]
The ring has ``num_workers * prefetch`` slots in flight plus ``max_held`` slots the user may hold
as zero-copy batches. When the user already holds ``max_held`` batches, the next batch is
returned as a copy (one memcpy of the slot) and its slot is reused at once: holding any number of
batches never deadlocks and never lets a held batch change. ``Loader.stats()["copied_batches"]``
counts those copies.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np

from . import _pack, _ring
from ._ragged import VarImage, read_image
from ._region import SharedRegion
from .layout import PAGE, BatchLayout

__all__ = ["SlotMap", "SlotTable", "Task", "STATE_NAMES"]

STATE_NAMES = {
    _ring.FREE: "FREE",
    _ring.QUEUED: "QUEUED",
    _ring.CLOSING: "CLOSING",
    _ring.READY: "READY",
    _ring.FAILED: "FAILED",
    _ring.READING: "READING",
}


class SlotMap:
    """The one place that knows where a slot and its task are in a region (NOTE [slot payload
    layout] in layout.py): used by the parent, which writes tasks, and by workers, which read
    them and write the variable area."""

    __slots__ = ("mm", "ring", "layout", "data_offset", "slot_bytes")

    def __init__(self, mm: Any, ring: Any, layout: BatchLayout) -> None:
        self.mm, self.ring, self.layout = mm, ring, layout
        self.data_offset, self.slot_bytes = ring.data_offset, ring.slot_bytes

    def base(self, slot: int) -> int:
        return int(self.data_offset + slot * self.slot_bytes)

    def write_task(self, slot: int, indices: Any, seed: int) -> int:
        """Write a task's sample indices and seed into ``slot``; returns how many indices."""
        lay, k = self.layout, len(indices)
        task = np.frombuffer(self.mm, np.int64, lay.batch_size + 1,
                             self.data_offset + slot * self.slot_bytes)
        task[:k] = indices
        task[lay.batch_size] = seed  # lay.seed_offset == 8 * batch_size
        return k

    def indices(self, slot: int, count: int) -> np.ndarray[Any, Any]:
        """The task's sample indices (a view: int64, ``count`` of them)."""
        return np.frombuffer(self.mm, np.int64, count, self.base(slot) + self.layout.index_offset)

    def seed(self, slot: int) -> int:
        at = self.base(slot) + self.layout.seed_offset
        return int(np.frombuffer(self.mm, np.int64, 1, at)[0])

    def write_image(self, slot: int, image: VarImage) -> int:
        """Put a batch's variable image in its variable area: its size, or 0 if it does not fit
        (NOTE [ragged leaves] in fastload/_ragged.py)."""
        nbytes = image.nbytes
        if nbytes > self.layout.var_bytes:
            return 0
        image.write_into(self.mm, self.base(slot) + self.layout.var_offset)
        return nbytes


class Task(NamedTuple):
    """A batch queued in a slot."""

    seq: int
    slot: int
    epoch: int
    batch: int
    target: int | None = None  # the worker that must load it (None: any)


#: This process's pid, updated in a forked child (os.register_at_fork).
_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


class _Returner:
    """Takes slots back from dying leases (in whatever thread the last array is freed)."""

    def __init__(self, ring: Any) -> None:
        self.ring = ring
        self.freed: deque[int] = deque()
        self.closed = False
        self.pid = _pid[0]

    def release(self, slot: int) -> None:
        # Not in a forked child: a lease it inherited and frees (its GC) is the parent's to
        # return, and the child has dropped the mapping (_region.drop_inherited). The pid is
        # kept up to date at fork, so this costs no getpid() per batch.
        if not self.closed and _pid[0] == self.pid:
            self.ring.retire(slot)  # READING -> FREE (no worker loads a lent batch)
            self.freed.append(slot)


class SlotTable:
    """The parent's view of a loader's region: the ring, its slots' bookkeeping and the tasks
    in flight, oldest first."""

    def __init__(self, layout: BatchLayout, nslots: int, counters: dict[str, int],
                 shared: bool = False) -> None:
        #: Batches may be shared (NOTE [pieces] in csrc/fl_ring.c): workers take pieces of them.
        self.shared = shared
        self.shared_queued = False  # since the engine last rang the bell
        max_pieces = min(layout.batch_size, _ring.MAX_PIECES) if shared else 1
        ctl = _ring.control_nbytes(nslots, max_pieces)
        data_offset = -(-ctl // PAGE) * PAGE
        self.region = SharedRegion(
            data_offset + nslots * layout.slot_bytes,
            what=f"{nslots} slots of {layout.slot_bytes / 2**20:,.2f} MiB (batches of "
                 f"{layout.batch_size} samples of {layout.describe_size()})")
        try:
            self.ring = _ring.RingIndex.create(
                self.region.mm, nslots, layout.slot_bytes, data_offset, os.getpid(), max_pieces
            )
        except BaseException:
            self.region.close()
            raise
        self.layout = layout
        self.nslots = nslots
        self.map = SlotMap(self.region.mm, self.ring, layout)
        self.returner = _Returner(self.ring)
        self.free = list(range(nslots - 1, -1, -1))
        self.leased: set[int] = set()  # held by the user as zero-copy batches
        self.stale: set[int] = set()  # abandoned tasks a worker may still be loading
        self.inflight: deque[Task] = deque()
        self.seq = 0
        self.counters = counters  # the loader's stats(): copied_batches
        self.threads = False  # its workers are threads (NOTE [thread workers] in _threads.py)

    # -- queueing ----------------------------------------------------------------------------
    def can_queue(self, depth: int) -> bool:
        return len(self.inflight) < depth and bool(self.free)

    def queue(self, epoch: int, batch: int, indices: Any, seed: int,
              target: int | None = None, owners: list[int] | None = None) -> None:
        """Queue batch ``batch`` of ``epoch`` for any worker, or for worker ``target`` only;
        with ``owners`` (the table being shared), as a shared batch whose first rows are given
        to workers ``owners`` (NOTE [first samples])."""
        slot = self.free.pop()
        k = self.map.write_task(slot, indices, seed)
        shared = self.shared and target is None and owners is not None
        given = (owners or [])[:k] if shared else ()
        self.ring.queue(slot, self.seq, epoch, k, target, shared, given)
        self.shared_queued |= shared
        self.inflight.append(Task(self.seq, slot, epoch, batch, target))
        self.seq += 1

    def redo(self, task: Task, count: int) -> None:
        """Queue ``task`` again in its READY slot, first in line: its result is lost (its
        worker died before sending the part that travels over the pipe). The slot still holds
        the task's indices and seed. It keeps its seq: tasks are delivered in seq order (the
        mailbox drops messages of older seqs as abandoned, and workers claim the lowest seq
        first), and its dead worker can send nothing more under it."""
        self.ring.retire(task.slot)  # READY: no worker loads it
        self.ring.queue(task.slot, task.seq, task.epoch, count, task.target)
        self.inflight.appendleft(task)

    def first_of(self, epoch: int) -> Task | None:
        """The oldest task of ``epoch`` in flight (its next batch), if any."""
        for task in self.inflight:
            if task.epoch == epoch:
                return task
        return None

    def await_any(self, epoch: int, first: Task, timeout: float) -> tuple[Task, Any]:
        """NOTE [out of order] (_scheduler.py): the oldest task of ``epoch`` in flight whose
        slot is done, and its result (RingIndex.await_result), waiting up to ``timeout`` on
        ``first`` (the oldest) while none is, and looking at the others at least every 20 ms;
        (``first``, None) on timeout."""
        ring, done = self.ring, (_ring.READY, _ring.FAILED)
        end, step = time.monotonic() + timeout, 0.0005
        while True:
            for task in self.inflight:
                if task.epoch == epoch and _ring.state_bits(ring.state(task.slot))[0] in done:
                    return task, ring.await_result(task.slot, 0)
            left = end - time.monotonic()
            got = ring.await_result(first.slot, max(0.0, min(step, left)))
            if got is not None or left <= step:
                return first, got
            step = min(2 * step, 0.02)

    def count_of(self, epoch: int) -> int:
        return sum(1 for task in self.inflight if task.epoch == epoch)

    def take(self, task: Task) -> None:
        """``task``'s slot is READY or FAILED: it is no longer in flight."""
        if self.inflight and self.inflight[0] is task:
            self.inflight.popleft()
        else:
            self.inflight.remove(task)

    def drop_newest(self, epoch: int) -> Task | None:
        """Abandon the newest task of ``epoch`` if its slot can be freed now (queued, or
        loaded already: not while a worker loads it), to give its slot to another pass
        (NOTE [several passes] in _passes.py); the task abandoned, or None."""
        for task in reversed(self.inflight):
            if task.epoch == epoch:
                if self.loaders(task.slot):
                    return None  # workers load it, or pieces of it
                self.inflight.remove(task)
                self.drop(task.slot)
                return task
        return None

    def drop(self, slot: int) -> None:
        """Abandon the task in ``slot``: freed now if no worker loads a piece of it, else by
        the last of them (``reap`` finds it FREE: NOTE [pieces] in csrc/fl_ring.c)."""
        if self.ring.retire(slot):
            self.free.append(slot)
        else:
            self.stale.add(slot)

    def drop_tasks(self, epoch: int | None = None) -> None:
        """Abandon the tasks of ``epoch`` in flight (None: all of them)."""
        keep: deque[Task] = deque()
        for task in self.inflight:
            if epoch is None or task.epoch == epoch:
                self.drop(task.slot)
            else:
                keep.append(task)
        self.inflight = keep

    def reap(self) -> None:
        """Take back the slots the user's batches released and the abandoned tasks that no
        worker holds any more."""
        freed = self.returner.freed
        while freed:
            s = freed.popleft()
            self.leased.discard(s)
            self.free.append(s)
        if not self.stale:
            return
        ring = self.ring
        for s in list(self.stale):
            if ring.retire(s):  # CLOSING until its last loader left
                self.stale.discard(s)
                self.free.append(s)

    # -- delivery ----------------------------------------------------------------------------
    def release(self, slot: int) -> None:
        """A FAILED (or copied) slot goes back to the free list, or, while workers still load
        rows of it past the error, once they are done (``reap``)."""
        self.drop(slot)

    def deliver(self, slot: int, count: int, var_bytes: int, spilled: Any, copy: bool,
                max_held: int) -> Any:
        """The batch in a READY slot: zero-copy views owned by a lease, or (NOTE [held
        batches]) a copy when the user holds ``max_held`` batches already or ``copy``.
        ``var_bytes``: the size of its variable image in the slot; ``spilled``: the image, if
        it came over the pipe instead (bytes, or the mapping of the memfd it came in)."""
        lay, ring, m = self.layout, self.ring, self.map
        base = m.data_offset + slot * m.slot_bytes
        image: Any = None
        if spilled is None:
            pass
        elif isinstance(spilled, bytes):  # an aligned, writable copy; the views keep it alive
            image = np.empty(len(spilled), np.uint8)
            image[:] = np.frombuffer(spilled, np.uint8)
        else:
            image = spilled  # a memfd's mapping of its own: the views keep it alive
        # (the engine reaped at this batch's refill: the leases freed since are in ``freed``)
        if not copy and self.held < max_held:  # (the refill of this batch reaped)
            ring.begin_read(slot)
            buf: Any = _pack.SlotLease(self.region.mm, base, ring.slot_bytes, slot, self.returner)
            self.leased.add(slot)
        else:
            used = lay.var_offset + (var_bytes if lay.object_paths and image is None else 0)
            buf = np.empty(used, np.uint8)
            buf[:] = np.frombuffer(self.region.mm, np.uint8, used, base)
            self.release(slot)
            if not copy:
                self.counters["copied_batches"] += 1
        objects, ragged = None, None
        if image is not None:
            objects, ragged = read_image(lay, image, 0, count)
        elif lay.object_paths:
            objects, ragged = read_image(lay, buf, lay.var_offset, count)
        return lay.unpack(buf, count, objects, ragged)

    @property
    def held(self) -> int:
        return len(self.leased) - len(self.returner.freed)

    # -- what workers are doing --------------------------------------------------------------
    def loaders(self, slot: int, pieces: Any = None) -> list[tuple[int, int, int]]:
        """(worker, pid, row being loaded) of each piece of ``slot`` being loaded (``pieces``:
        RingIndex.pieces of it, if read already)."""
        return [(owner, pid, first + min(done, max(n - 1, 0)))
                for kind, owner, first, n, done, pid in
                (self.ring.pieces(slot) if pieces is None else pieces)
                if kind == _ring.PIECE_TAKEN]

    def claimed_by(self, worker: int) -> list[tuple[int, int, int | None]]:
        """(slot, epoch, sample index being loaded) of every piece ``worker`` is loading."""
        out = []
        for s in range(self.nslots):
            rows = [row for w, _, row in self.loaders(s) if w == worker]
            if rows:
                info = self.ring.slot_info(s)
                idx = self.map.indices(s, info["count"])
                out += [(s, info["epoch"], int(idx[row]) if len(idx) else None) for row in rows]
        return out

    def _who(self, worker: int, pid: int) -> str:
        return (f"worker thread {worker} (fastload-worker-{worker})" if self.threads
                else f"worker {worker} (pid {pid})")

    def why_late(self, slot: int) -> str:
        """What the batch in ``slot`` is waiting for: which worker loads which sample, or none."""
        info = self.ring.slot_info(slot)
        count = info["count"]
        pieces = self.ring.pieces(slot) if info["state"] == _ring.QUEUED else []
        loading = self.loaders(slot, pieces)
        if loading:
            idx = self.map.indices(slot, count)
            who = [f"{self._who(w, pid)} has been loading sample index {int(idx[row])} (row "
                   f"{row} of {count} in this batch)" for w, pid, row in loading[:8]]
            return f"{', '.join(who)}{' ...' if len(loading) > 8 else ''} for too long"
        given = [(owner, first) for kind, owner, first, _, _, _ in pieces
                 if kind == _ring.PIECE_GIVEN]
        if given:  # NOTE [first samples] (_startup.py): each loads its sample before the ring
            idx = self.map.indices(slot, count)
            who = [f"worker {w} sample index {int(idx[r])} (row {r})" for w, r in given[:8]]
            return (f"rows of this batch of {count} were given to workers that loaded their "
                    f"sample first and have not finished it: {', '.join(who)}")
        return (
            f"the batch was still {STATE_NAMES.get(info['state'], info['state'])} (no worker "
            f"picked it up); {len(self.leased)} batches still referenced by the caller"
        )

    def close(self) -> None:
        """Unmap (live zero-copy batches keep the mapping until the last of them dies)."""
        self.returner.closed = True
        self.inflight.clear()
        self.ring.close()
        self.region.close()

