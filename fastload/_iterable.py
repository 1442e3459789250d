"""Plain iterable datasets: every worker iterates its own replica, as torch's workers do.

NOTE [iterable datasets]
A dataset with ``__iter__`` and no ``__getitem__`` (torch's ``IterableDataset`` is one) has no
positions the parent could hand out: worker k of W iterates ``iter()`` of its own copy of the
dataset every epoch, and the user splits the stream with ``get_worker_info()`` (or does not, and
every worker yields all of it, as with torch). The batches come in torch's order: batch r of
worker 0, 1, ..., W-1, then batch r + 1 of each, a worker whose iterator ended being skipped
from then on; each worker's last batch may be short (dropped with ``drop_last``).

The parent queues each batch for one worker (``fl_ring_queue_to``: only that worker may claim
the slot), as the positions [r*B, (r+1)*B) of that worker's stream. The worker takes up to B
samples from its iterator and records how many it took (``fl_ring_set_rows``) and, if its
iterator ended, ``F_ENDED``. A batch that ended with no row (or short, with drop_last) is no
batch: the parent skips it and plans no more batches for that worker in the epoch. The epoch
ends when every worker's iterator has ended. The first sample of each worker's stream (NOTE
[first samples] in _startup.py) is loaded by all workers at once and kept for its batch; a worker
whose stream is empty answers the probe with ``ProbeEnded``, and the next worker is asked.

Positions make a restarted worker (``on_worker_death="restart"``) and a resumed loader exact for
an iterable that yields the same samples each time it is iterated: a new iterator skips
(reads and drops) the samples before the batch it starts with; a plain iterable cannot seek
(a fastload.ShardedStream can). An iterator that goes on after a sample raised continues with
its next sample, not with the next batch's first position, as torch's do.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ._fill import BatchFiller, sample_ctx
from ._plan import STATE_FORMAT, EpochPlan
from ._ragged import RowError, VarImage
from ._remote import pack_exception

__all__ = ["is_iterable", "check_iterable_args", "IterPlan", "IterFiller", "StreamEnded"]

_Array = np.ndarray[Any, Any]


def is_iterable(dataset: Any) -> bool:
    """Whether ``dataset`` is a plain iterable dataset: ``__iter__`` and no ``__getitem__``, or
    a torch ``IterableDataset`` (whose base class has a ``__getitem__`` that raises)."""
    if not hasattr(dataset, "__iter__"):
        return False
    return not hasattr(dataset, "__getitem__") or any(
        c.__name__ == "IterableDataset" and c.__module__.startswith("torch.utils.data")
        for c in type(dataset).__mro__)


def check_iterable_args(dataset: Any, *, shuffle: bool, shard: Any, batch_plan: Any) -> None:
    """Refuse what a Loader cannot do to a plain iterable: it sees only iterators."""
    name = type(dataset).__name__
    if hasattr(dataset, "__next__"):
        raise TypeError(
            f"dataset is an iterator ({name}): it can be read once, by one process. Pass an "
            "iterable whose __iter__ returns a new iterator every time (a class with __iter__ "
            "written as a generator function), so that every worker and every epoch starts one"
        )
    for what, given in (("shuffle=True", shuffle), (f"shard={shard!r}", shard is not None),
                        ("batch_plan", batch_plan is not None)):
        if given:
            raise ValueError(
                f"{what} needs positions to reorder or split, and {name} is a plain iterable "
                "dataset (__iter__, no __getitem__): shuffle or split it inside __iter__ (with "
                "fastload.get_worker_info() and your rank), or make it a fastload.ShardedStream "
                "(fastload shuffles its shards and splits them across ranks and workers)"
            )


class StreamEnded(Exception):
    """The worker's iterator ended before the sample asked for (the probe)."""


class _Stream:
    """One epoch's iterator in one process: where it is, samples kept for later, its end."""

    __slots__ = ("it", "pos", "kept", "ended")

    def __init__(self, it: Any) -> None:
        self.it, self.pos, self.ended = it, 0, False
        self.kept: list[tuple[bool, Any]] = []  # (ok, sample or the exception it raised)


class IterFiller(BatchFiller):
    """A plain iterable's samples -> a slot: up to a batch of rows from this process's iterator
    of ``epoch``. After :meth:`fill`, ``flags`` is ``F_ENDED`` if the iterator ended (the rows
    the batch got are in the slot: ``fl_ring_set_rows``; in process, ``rows``)."""

    def __init__(self, dataset: Any, worker_id: int | None, num_workers: int) -> None:
        super().__init__(dataset, worker_id)
        self.getitems = self.columns = self.pieces = None
        self.k, self.nw = worker_id or 0, max(1, num_workers)
        self.streams: dict[int, _Stream] = {}
        self.rows = 0

    def _stream(self, epoch: int, start: int) -> _Stream:
        """This epoch's iterator, at position ``start``: a new one if there is none or it is
        past ``start`` (the epoch is read again: a resumed loader), moved on if it is behind
        (a restarted worker, a resumed loader, or a batch cut short by a sample that raised:
        the rest of its positions are dropped, as a map-style batch's samples are)."""
        s = self.streams.get(epoch)
        if s is None or s.pos - len(s.kept) > start:
            self.streams = {}  # an epoch's iterator is dropped when the next one starts
            s = self.streams[epoch] = _Stream(iter(self.dataset))
        while s.pos - len(s.kept) < start and self._next(s) is not None:
            pass
        return s

    def _next(self, s: _Stream) -> tuple[bool, Any] | None:
        """The next (ok, sample) of ``s``, or None at its end."""
        if s.kept:
            return s.kept.pop(0)
        if s.ended:
            return None
        ctx = sample_ctx()
        ctx[2] = s.pos * self.nw + self.k  # sample_rng(): distinct per worker and position
        try:
            got = (True, next(s.it))
        except StopIteration:
            s.ended = True
            return None
        except Exception as e:
            got = (False, e)
        s.pos += 1
        return got

    def _keep(self, epoch: int, position: int, seed: int) -> tuple[bool, Any]:
        sample_ctx()[0:2] = seed, epoch
        s = self._stream(epoch, position)
        got = self._next(s)
        if got is None:
            raise StreamEnded(f"worker {self.k}'s iterator of epoch {epoch} has no sample")
        s.kept.insert(0, got)
        return got

    def warm_up(self, index: int, seed: int, epoch: int) -> None:
        try:
            self._keep(epoch, index, seed)
        except Exception:  # ended (the probe of this worker says so), or iter() raised:
            pass  # its batch raises it again
        finally:
            sample_ctx()[2] = -1

    def probe(self, index: int, batch_size: int, seed: int, epoch: int,
              spec: Any = None, alternates: Any = ()) -> Any:
        """The BatchLayout of this worker's sample at ``index`` (kept for its batch); raises
        StreamEnded if the iterator has no sample there. (No ``alternates``: on_error="skip"
        is refused for plain iterables.)"""
        from .layout import BatchLayout

        try:
            ok, sample = self._keep(epoch, index, seed)
        finally:
            sample_ctx()[2] = -1
        if not ok:
            self.streams[epoch].kept.pop(0)  # raised once, for the probe's batch
            raise sample
        return BatchLayout(sample, batch_size, spec)

    def reads_apply(self) -> bool:
        """A worker's iterator yields its samples in order: no reads in flight (NOTE [reads in
        flight] in _io.py)."""
        return False

    def fill(self, packer: Any, layout: Any, slot: int, indices: Any, seed: int, epoch: int,
             ring: Any = None, pid: int = 0,
             pre: Any = None) -> tuple[VarImage | None, bytes | None]:
        from ._ring import F_ENDED

        objects: list[Any] = []
        start, rows = int(indices[0]), 0
        self.flags = 0
        ctx = sample_ctx()
        ctx[0], ctx[1] = seed, epoch
        try:
            s = self._stream(epoch, start)
            while rows < len(indices):
                if ring is not None:
                    ring.set_progress(slot, rows, pid)
                got = self._next(s)
                if got is None:
                    break
                if not got[0]:
                    raise got[1]
                packer.pack(slot, rows, got[1], objects)
                rows += 1
            if s.ended and not s.kept:
                self.flags = F_ENDED
            self.rows = rows
            if ring is not None:
                ring.set_rows(slot, rows)
            image = (VarImage(layout, objects, rows, self.worker_id is None)
                     if layout.n_objects else None)
        except RowError as e:
            return None, pack_exception(e.error, start + e.row, self.worker_id,
                                        where=self._where(start + e.row))
        except BaseException as e:
            if self.worker_id is None and isinstance(e, (SystemExit, KeyboardInterrupt)):
                raise
            return None, pack_exception(e, start + rows, self.worker_id,
                                        where=self._where(start + rows))
        finally:
            ctx[2] = -1
        return image, None

    def _where(self, position: int) -> str:
        return (f"sample {position} of the dataset's iterator (a plain iterable: "
                "counted from the start of this epoch's iterator in this process)")

    def load(self, layout: Any, indices: Any, batch_size: int, seed: int, epoch: int,
             spec: Any = None) -> Any:
        """num_workers=0: (layout, batch), batch None when the iterator had ended."""
        from ._remote import raise_rebuilt

        indices = np.ascontiguousarray(indices, dtype=np.int64)
        if layout is None:
            try:
                layout = self.probe(int(indices[0]), batch_size, seed, epoch, spec)
            except StreamEnded:
                self.rows, self.flags = 0, 1
                return None, None
            except Exception as e:
                raise_rebuilt(pack_exception(e, int(indices[0]), None,
                                             where=self._where(int(indices[0]))))
        return super().load(layout, indices, batch_size, seed, epoch, spec)


class IterPlan(EpochPlan):
    """The batches of a plain iterable (NOTE [iterable datasets]): batch b of an epoch is the
    next round of the next worker whose iterator has not ended, in round-robin order; the
    epoch has as many batches as the workers' iterators give."""

    iterable = True

    def __init__(self, dataset: Any, batch_size: int, workers: int, drop_last: bool,
                 seed: int) -> None:
        super().__init__(0, batch_size, shuffle=False, seed=seed, drop_last=drop_last)
        self.dataset = dataset
        self.workers = workers  # 0: the main process alone, as "worker 0"
        self._epochs: dict[int, _EpochTasks] = {}
        self._resume: dict[str, Any] | None = None
        #: NOTE [out of order] (_scheduler.py): whether a worker may be given one more task
        self.room: Callable[[int], bool] | None = None

    @property
    def rows(self) -> int:
        return self.batch_size

    def _of(self, epoch: int) -> _EpochTasks:
        t = self._epochs.get(epoch)
        if t is None:
            t = self._epochs[epoch] = _EpochTasks(max(1, self.workers), self._resume, epoch)
            self._resume = None
            for old in [e for e in self._epochs if e < epoch - 1]:
                del self._epochs[old]
        return t

    def prepare(self, epoch: int) -> None:
        pass

    def nbatches_of(self, epoch: int) -> int:
        """Tasks of ``epoch`` (so far: huge while a worker's iterator may go on)."""
        t = self._of(epoch)
        return t.base + len(t.tasks) if t.all_ended else sys.maxsize

    def user_len(self, epoch: int) -> int:
        """len(loader): from len(dataset), as torch computes it, if the dataset has one."""
        try:
            n = len(self.dataset)
        except TypeError:
            raise TypeError(
                f"len() of a Loader over {type(self.dataset).__name__}, an iterable dataset "
                "without __len__: its batches are known only once its iterators end"
            ) from None
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    targeted = True

    def target(self, epoch: int, b: int) -> int | None:
        return self._of(epoch).task(b, self.room)[0] if self.workers else None

    def batch(self, epoch: int, b: int) -> _Array:
        r = self._of(epoch).task(b, self.room)[1]
        return np.arange(r * self.batch_size, (r + 1) * self.batch_size, dtype=np.int64)

    def mask(self, epoch: int, b: int) -> _Array:
        return np.ones(self._of(epoch).last_rows, np.bool_)

    def probe_tasks(self, epoch: int, b: int, n: int, rows: bool = False
                    ) -> list[tuple[int, int]]:
        """(worker, position) of the first batch from task ``b`` on of up to ``n`` workers
        whose iterators may go on (the first is the probe's)."""
        t, out = self._of(epoch), list[tuple[int, int]]()
        stop = b + 2 * t.nw  # every worker whose iterator may go on has a task in there
        while not t.all_ended and len(out) < max(1, n) and b < stop:
            k, r = t.task(b)
            if k not in t.ended and all(k != w for w, _ in out):
                out.append((k, r * self.batch_size))
            b += 1
        return out

    def done(self, epoch: int, b: int, rows: int, flags: int) -> bool:
        """Task ``b`` came back: its worker's iterator ended there (F_ENDED), no more tasks for
        that worker; a batch unless it has no row (or is short, with drop_last)."""
        from ._ring import F_ENDED

        t = self._of(epoch)
        k, r = t.task(b)
        if flags & F_ENDED:
            t.ended.add(k)
        if rows == 0 or (self.drop_last and rows < self.batch_size):
            return False
        t.next_round[k], t.cycle, t.last_rows = r + 1, (k + 1) % t.nw, rows
        return True

    def ended(self, epoch: int, worker: int) -> None:
        """``worker``'s iterator of ``epoch`` has no sample left (its probe said so)."""
        self._of(epoch).ended.add(worker)

    def all_ended(self, epoch: int) -> bool:
        return self._of(epoch).all_ended

    # -- resume ------------------------------------------------------------------------------
    def state(self, epoch: int, position: int) -> dict[str, Any]:
        t = self._epochs.get(epoch)
        return {
            "format": STATE_FORMAT, "seed": self.seed, "epoch": epoch, "position": position,
            "batch_size": self.batch_size, "drop_last": self.drop_last,
            "iterable": {"workers": self.workers,
                         "rounds": list(t.next_round) if t and position else None,
                         "ended": sorted(t.ended) if t and position else [],
                         "cycle": t.cycle if t and position else 0},
        }

    def restore(self, state: dict[str, Any]) -> tuple[int, int]:
        it = state.get("iterable") if isinstance(state, dict) else None
        if state.get("format") != STATE_FORMAT or not isinstance(it, dict):
            raise ValueError("not the state of a fastload Loader over a plain iterable dataset")
        for key, mine in (("batch_size", self.batch_size), ("drop_last", self.drop_last)):
            if state.get(key) != mine:
                raise ValueError(f"the state was saved with {key}={state.get(key)!r} but this "
                                 f"loader has {key}={mine!r}")
        if it.get("workers") != self.workers:
            raise ValueError(
                f"the state was saved with num_workers={it.get('workers')} but this loader has "
                f"num_workers={self.workers}: each worker iterates its own replica of a plain "
                "iterable dataset, so only the same number of workers continues the same "
                "streams (a fastload.ShardedStream resumes with any number)"
            )
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or not isinstance(position, int) or min(epoch,
                                                                              position) < 0:
            raise ValueError(f"invalid state: epoch {epoch!r}, position {position!r}")
        self._epochs.clear()
        self._resume = dict(it, position=position) if position else None
        return epoch, position


class _EpochTasks:
    """The tasks of one epoch so far: (worker, round) of task base, base + 1, ..."""

    def __init__(self, nw: int, resume: dict[str, Any] | None, epoch: int) -> None:
        self.nw = nw
        self.base = 0
        self.tasks: list[tuple[int, int]] = []
        self.next_round = [0] * nw  # the next round to assign per worker
        self.ended: set[int] = set()  # workers whose end the parent has seen, in task order
        self.cycle = 0  # the worker whose turn comes next
        self.last_rows = 0
        if resume is not None:
            self.base = int(resume["position"])
            self.next_round = [int(r) for r in resume["rounds"]]
            self.ended = set(resume["ended"])
            self.cycle = int(resume["cycle"])
        self.assign_round = list(self.next_round)
        self.assign_cycle = self.cycle

    @property
    def all_ended(self) -> bool:
        return len(self.ended) >= self.nw

    def task(self, b: int, room: Callable[[int], bool] | None = None) -> tuple[int, int]:
        """(worker, round) of task ``b``, assigned now if it is new: to the next worker in
        turn whose iterator has not ended (and, given ``room``, that has room)."""
        i = b - self.base
        while len(self.tasks) <= i:
            if self.all_ended:
                raise IndexError(f"no task {b}: every worker's iterator has ended")
            live = [k for k in ((self.assign_cycle + j) % self.nw for j in range(self.nw))
                    if k not in self.ended]
            # NOTE [out of order] (_scheduler.py): the next worker in turn that has room
            k = next((w for w in live if room(w)), live[0]) if room is not None else live[0]
            self.tasks.append((k, self.assign_round[k]))
            self.assign_round[k] += 1
            self.assign_cycle = (k + 1) % self.nw
        return self.tasks[i]
