"""Loading a batch into a slot: the one fill path, run by workers and, with num_workers=0, by
the main process (torch's ``_utils/fetch.py`` is the model: one fetcher for both).

A ``BatchFiller`` holds a dataset and its fast paths (``__getitems__``; the ``ArrayDataset``
gather in C) and loads a batch's samples into a packer's slot, with the sample context that
``sample_rng()`` reads set for each sample. It returns the batch's object leaves, or the packed
exception (``fastload._remote``) of the sample that failed.

NOTE [skipped samples]
With ``on_error="skip"`` a sample whose ``__getitem__`` raises is replaced by the next sample
of its batch that loads (the next index of the epoch's plan within that batch, wrapping round
to the batch's first), so a batch keeps its size and the result depends only on the plan and
the dataset: the same for any ``num_workers``, start method or resume. A worker holds only
its batch's indices, hence the wrap within the batch rather than into the next batch. A sample
that raised once in a fill is not asked again in that fill, and a replacement whose own row
comes later is loaded once, so a batch costs at most one ``__getitem__`` per index. When every
sample of a batch raises, the batch raises the first one's error (the next ``next()`` goes on,
NOTE [errors do not end the epoch]). With ``__getitems__``, a call that raises is followed by
one ``__getitem__`` per sample, to find which. Only the dataset's exceptions are skipped: a
sample that loads but does not fit the batch layout is a declaration to fix (``ragged=``,
``stack=False``), and raises. The fill lists what it replaced in ``skipped``; a worker sends it
(``Skipped``) after the batch, and the engine counts and logs it (``stats()["skipped"]``) and
raises ``SkipLimitError`` past ``max_skips`` in an epoch.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _rngs
from ._ragged import RowError, VarImage
from ._remote import pack_exception
from .errors import LayoutMismatchError

__all__ = ["WorkerInfo", "get_worker_info", "sample_rng", "sample_ctx", "BatchFiller",
           "set_worker_info"]


@dataclass(frozen=True)
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


class _Context(threading.local):
    """Per thread (worker_method="thread" runs workers as threads of this process): the
    worker's :class:`WorkerInfo`, and the (seed, epoch, index) of the sample being loaded, for
    sample_rng() (set by BatchFiller). Worker processes have one thread that loads."""

    info: WorkerInfo | None = None

    def __init__(self) -> None:
        self.ctx: list[int] = [0, 0, -1]


_local = _Context()


def sample_ctx() -> list[int]:
    """This thread's [seed, epoch, index] of the sample being loaded (changed in place)."""
    return _local.ctx


def set_worker_info(info: WorkerInfo | None) -> None:
    _local.info = info


def get_worker_info() -> WorkerInfo | None:
    """Inside a worker (process or thread): its :class:`WorkerInfo`. Elsewhere: ``None``."""
    return _local.info


def sample_rng(index: int | None = None) -> Any:
    """A ``numpy.random.Generator`` for the sample being loaded, seeded from
    ``(seed, epoch, index)``.

    Call it inside ``__getitem__``: random augmentations are then bitwise reproducible whatever
    the number of workers, the start method, or a resume in between. In ``__getitems__`` pass
    the index explicitly. Outside a loader it raises RuntimeError.

    Examples
    --------
    >>> import numpy as np, fastload
    >>> class Noisy:
    ...     def __len__(self): return 4
    ...     def __getitem__(self, i):
    ...         return np.float64(i) + fastload.sample_rng().normal()
    >>> a = [b.tolist() for b in fastload.Loader(Noisy(), 2, seed=1, num_workers=0)]
    >>> b = [b.tolist() for b in fastload.Loader(Noisy(), 2, seed=1, num_workers=0)]
    >>> a == b
    True
    """
    seed, epoch, current = _local.ctx
    i = current if index is None else int(index)
    if i < 0:
        raise RuntimeError(
            "fastload.sample_rng() is only meaningful while a fastload Loader loads a sample "
            "(inside __getitem__), or with an explicit index inside __getitems__"
        )
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, i])))


class BatchFiller:
    """A dataset's samples -> a slot (``worker_id`` None: the main process)."""

    def __init__(self, dataset: Any, worker_id: int | None, getitems: bool = False,
                 columns: bool = False, pieces: bool = False) -> None:
        """The fast paths the dataset has (NOTE [dataset kinds] in _kinds.py, which decides
        them: ``filler_for``)."""
        self.dataset = dataset
        self.worker_id = worker_id
        self.getitems = dataset.__getitems__ if getitems else None
        # fastload.ArrayDataset: rows are gathered in C, no Python call per sample.
        self.columns: list[Any] | None = dataset._fastload_columns() if columns else None
        # fastload.NpyShards (through _stream.StreamView): a batch is pieces of shards, each
        # (its columns, its rows), gathered in C one after the other.
        self.pieces: Any = dataset._fastload_pieces if pieces else None
        # NOTE [first samples] (_startup.py): (seed, epoch, index) -> (sample, or the exception
        # loading it raised), loaded before the layout was known, packed when its batch comes.
        self.warm: dict[tuple[int, int, int], tuple[bool | None, Any]] = {}
        #: Result flags of the last fill for its slot (fastload._ring.F_ENDED: a plain
        #: iterable's iterator ended, fastload/_iterable.py); 0 for map-style datasets.
        self.flags = 0
        self.rows = 0  # rows of the last fill (fewer than its indices: a plain iterable's end)
        self.skip = False  # on_error="skip" (NOTE [skipped samples])
        #: What the last fill replaced: (index, exception type, message, index loaded instead)
        self.skipped: list[tuple[int, str, str, int]] = []
        #: NOTE [global RNGs] (_rngs.py): _rngs.OFF, DETECT or ON, for the first samples (the
        #: probe, warm-ups); the batches follow what the layout says (``layout.global_rng``)
        self.globals = _rngs.OFF
        #: NOTE [reads in flight] (_io.py): samples of a batch loading at once (io_concurrency),
        #: on ``reads`` (a ReadPool, started at the first batch that needs it)
        self.io = 1
        self.reads: Any = None
        #: an ``async def __getitem__``: its samples are awaited, on the read pool's loops
        self.is_async = inspect.iscoroutinefunction(getattr(type(dataset), "__getitem__", None))

    def warm_up(self, index: int, seed: int, epoch: int) -> None:
        """Load sample ``index`` now and keep it (or its exception) for the batch that has it."""
        ctx = _local.ctx
        ctx[0], ctx[1], ctx[2] = seed, epoch, index
        if self.globals:
            _rngs.seed_globals(seed, epoch, index)
        try:
            self.warm[(seed, epoch, index)] = (True, self._one(index))
        except Exception as e:
            self.warm[(seed, epoch, index)] = (False, e)
        finally:
            ctx[2] = -1

    def _one(self, index: int) -> Any:
        """Sample ``index``, in this thread (an async ``__getitem__`` awaited here)."""
        if self.is_async:
            return asyncio.run(self.dataset[index])
        return self.dataset[index]

    def _prefetched(self, ds: Any, indices: list[int], seed: int, epoch: int) -> Any:
        """NOTE [reads in flight] (_io.py): ``ds`` with ``indices`` loading on the read pool."""
        from ._io import Prefetched, ReadPool

        if self.reads is None:
            self.reads = ReadPool(max(1, self.io), _local)
        return Prefetched(self.reads, ds, indices, seed, epoch)

    def reads_apply(self) -> bool:
        """Whether a batch's samples load on the read pool (NOTE [reads in flight]): the
        one-sample path, with io_concurrency > 1 or an async ``__getitem__``."""
        return ((self.io > 1 or self.is_async) and self.getitems is None
                and self.columns is None and self.pieces is None)

    def start_reads(self, indices: Any, seed: int, epoch: int) -> Any:
        """The samples ``indices`` of a batch loading now, for its fill (``pre``)."""
        ds = _Kept(self, seed, epoch) if self.warm else self.dataset
        return self._prefetched(ds, indices.tolist(), seed, epoch)

    def read_ahead(self, indices: tuple[int, ...], seed: int, epoch: int) -> None:
        """Start reading ``indices`` now, kept for the batch that has them, as a probe's first
        samples are (NOTE [first samples], NOTE [reads in flight])."""
        from ._io import ReadPool

        if self.reads is None:
            self.reads = ReadPool(max(1, self.io), _local)
        ctx = (_local.info, seed, epoch, 0)
        for i in indices:
            if (seed, epoch, i) not in self.warm:
                self.warm[(seed, epoch, i)] = (None, self.reads.submit(self.dataset.__getitem__,
                                                                       ctx, i))

    def close(self) -> None:
        """Stop the read threads (NOTE [reads in flight]), if any."""
        if self.reads is not None:
            self.reads.close()
            self.reads = None

    def _sample(self, seed: int, epoch: int, index: int) -> Any:
        got = self.warm.pop((seed, epoch, index), None)
        if got is None:
            for key in [k for k in list(self.warm) if k[:2] != (seed, epoch)]:
                # of an epoch that was abandoned, or went by (pop: a read thread may race)
                self.warm.pop(key, None)
            return self.dataset[index]
        ok, value = got
        if ok is None:  # a read started ahead (read_ahead): its Future
            return value.result()
        if not ok:
            raise value
        return value

    def probe(self, index: int, batch_size: int, seed: int, epoch: int,
              spec: Any = None, alternates: Any = ()) -> Any:
        """The BatchLayout of sample ``index`` (raises what the dataset raises); if it raises,
        that of the first of ``alternates`` that loads (on_error="skip"; raising ``index``'s
        error if none does)."""
        from .layout import BatchLayout

        ctx = _local.ctx
        ctx[0], ctx[1] = seed, epoch
        first: Exception | None = None
        mode = self.globals
        try:
            for i in (index, *alternates):
                ctx[2] = i
                if mode:
                    _rngs.seed_globals(seed, epoch, i)
                    seeded = _rngs.fingerprint() if mode == _rngs.DETECT else None
                try:
                    sample = self._one(i)
                except Exception as e:
                    if not alternates:
                        raise
                    first = first or e
                    continue
                layout = BatchLayout(sample, batch_size, spec)
                # NOTE [global RNGs]: did the sample draw from them? (then seed every sample)
                layout.global_rng = mode == _rngs.ON or (
                    mode == _rngs.DETECT and _rngs.fingerprint() != seeded)
                self.warm[(seed, epoch, i)] = (True, sample)  # packed with its batch
                return layout
        finally:
            ctx[2] = -1
        assert first is not None
        raise first

    def fill(self, packer: Any, layout: Any, slot: int, indices: Any, seed: int, epoch: int,
             ring: Any = None, pid: int = 0,
             pre: Any = None) -> tuple[VarImage | None, bytes | None]:
        """Load the samples ``indices`` (an int64 array) into ``slot``. Returns (the batch's
        variable image, or None if the layout has no object or ragged leaves, None) or (None,
        the packed exception). With a ``ring``, the row being loaded is recorded in the slot
        before each sample (stall reports and death reports read it)."""
        objects: list[Any] = []
        index = None
        image = None
        batch: list[int] | None = None
        # NOTE [reads in flight] (_io.py): ``pre``, the batch's reads if already in flight
        self.rows = len(indices)
        self.skipped = []
        ctx = _local.ctx
        ctx[0], ctx[1] = seed, epoch
        if ring is not None:  # who loads it, whatever the path (the parent reads it: _mailbox)
            ring.set_progress(slot, 0, pid)
        try:
            if self.columns is not None and self._gather(packer, layout, slot, indices):
                pass
            elif self.pieces is not None and self._gather_pieces(packer, layout, slot,
                                                                 indices):
                pass
            else:
                idx_list = indices.tolist()
                samples: Any = _NONE
                if self.getitems is not None:
                    batch = idx_list  # an error names the batch it was loading
                    if layout.global_rng:  # NOTE [global RNGs]: one call, one seeding
                        _rngs.seed_globals(seed, epoch, idx_list[0])
                    if not self.skip:
                        samples = self.getitems(idx_list)
                    else:
                        try:
                            samples = self.getitems(idx_list)
                        except Exception:  # NOTE [skipped samples]: find which, one by one
                            samples, batch = _NONE, None
                if samples is not _NONE:
                    _pack_getitems(packer, layout, slot, idx_list, samples, objects)
                else:  # one sample at a time, a kept first sample (NOTE [first samples]) as is
                    pack = packer.pack
                    ds = _Kept(self, seed, epoch) if self.warm else self.dataset
                    if layout.global_rng:  # NOTE [global RNGs]
                        ds = _rngs.Seeding(ds, seed, epoch)
                    if pre is not None:  # NOTE [reads in flight] (_io.py): started already
                        ds = pre
                    elif self.io > 1 or self.is_async:
                        ds = pre = self._prefetched(ds, idx_list, seed, epoch)
                    if self.skip:
                        ds = _Skipping(self, ds, idx_list)
                    for row, index in enumerate(idx_list):
                        if ring is not None:
                            ring.set_progress(slot, row, pid)
                        ctx[2] = index
                        pack(slot, row, ds[row] if self.skip else ds[index], objects)
            if layout.n_objects:
                image = VarImage(layout, objects, len(indices), self.worker_id is None)
        except RowError as e:  # a ragged leaf of one row is not what was declared
            return None, pack_exception(e.error, int(indices[e.row]), self.worker_id)
        except BaseException as e:
            if self.worker_id is None and isinstance(e, (SystemExit, KeyboardInterrupt)):
                raise  # num_workers=0: the user's own process (Ctrl+C, sys.exit) goes on as is
            # In a worker, they come from user code (workers ignore SIGINT): an error of the
            # sample, rebuilt in the main process as a catchable WorkerError (fastload._remote).
            if batch is not None:
                index = getattr(e, "_fastload_sample", None)  # set by _pack_getitems
            return None, pack_exception(e, index, self.worker_id, batch)
        finally:
            ctx[2] = -1
            if pre is not None:
                pre.cancel()
        return image, None

    def fill_rows(self, packer: Any, slot: int, indices: Any, first: int, n: int, seed: int,
                  epoch: int, ring: Any = None, piece: int = 0, pid: int = 0,
                  seeding: bool = False) -> tuple[int, bytes | None]:
        """Load rows [first, first + n) of a shared batch (fixed-shape leaves only) into
        ``slot``: (-1, None), or (the row that raised, its packed exception). With a ``ring``,
        the rows of piece ``piece`` loaded so far are recorded before each sample (stall and
        death reports read them)."""
        ctx = _local.ctx
        ctx[0], ctx[1] = seed, epoch
        ds = _Kept(self, seed, epoch) if self.warm else self.dataset
        if seeding:  # NOTE [global RNGs] (the layout's global_rng)
            ds = _rngs.Seeding(ds, seed, epoch)
        rows = indices[first:first + n].tolist()
        pre = (self._prefetched(ds, rows, seed, epoch) if self.io > 1 or self.is_async
               else None)
        if pre is not None:  # NOTE [reads in flight] (_io.py)
            ds = pre
        pack, objects = packer.pack, list[Any]()
        row, index = first, None
        try:
            for row, index in enumerate(rows, first):
                if ring is not None:
                    ring.progress(slot, piece, row - first, pid)
                ctx[2] = index
                pack(slot, row, ds[index], objects)
        except BaseException as e:  # in a worker, as fill(): an error of the sample
            return row, pack_exception(e, index, self.worker_id)
        finally:
            ctx[2] = -1
            if pre is not None:
                pre.cancel()
        return -1, None

    def load(self, layout: Any, indices: Any, batch_size: int, seed: int, epoch: int,
             spec: Any = None) -> Any:
        """num_workers=0: (layout, batch) of the samples ``indices``, filled as a worker fills
        a slot, into a buffer of its own (the batch's arrays are views of it). ``layout`` None:
        the first sample sets it. Raises what the dataset raised, rebuilt as for a worker's."""
        indices = np.ascontiguousarray(indices, dtype=np.int64)
        # NOTE [global RNGs] (_rngs.py): the user's RNG states, as they were before the batch
        saved = (_rngs.save() if self.globals and (layout is None or layout.global_rng)
                 else None)
        try:
            return self._load(layout, indices, batch_size, seed, epoch, spec)
        finally:
            if saved is not None:
                _rngs.restore(saved)

    def _load(self, layout: Any, indices: Any, batch_size: int, seed: int, epoch: int,
              spec: Any) -> Any:
        from ._pack import Packer
        from ._remote import raise_rebuilt

        if layout is None:
            try:
                alternates = indices[1:].tolist() if self.skip else ()
                layout = self.probe(int(indices[0]), batch_size, seed, epoch, spec, alternates)
            except Exception as e:
                raise_rebuilt(pack_exception(e, int(indices[0]), None))
        buf = np.empty(layout.slot_bytes, np.uint8)
        packer = Packer(buf, 0, layout.slot_bytes, 1, layout.batch_size, layout.tree,
                        layout.packer_fields)
        try:
            image, error = self.fill(packer, layout, 0, indices, seed, epoch)
        finally:
            packer.close()
        if error is not None:
            raise_rebuilt(error)
        objects, ragged = image.local() if image is not None else (None, None)
        return layout, layout.unpack(buf, self.rows, objects, ragged)

    def _gather(self, packer: Any, layout: Any, slot: int, indices: Any) -> bool:
        """ArrayDataset fast path; False (and never again) if a column cannot be gathered."""
        cols = self.columns
        assert cols is not None
        if layout.n_objects or len(cols) != len(layout.fields):
            self.columns = None
            return False
        try:
            for k, col in enumerate(cols):
                packer.gather(slot, k, col, indices)
        except (BufferError, ValueError):  # a non-contiguous column: use __getitems__
            self.columns = None
            return False
        return True

    def _gather_pieces(self, packer: Any, layout: Any, slot: int, indices: Any) -> bool:
        """NpyShards fast path; False (and never again) if a piece cannot be gathered."""
        pieces = self.pieces(indices)
        if pieces is None or layout.n_objects:
            self.pieces = None
            return False
        row0 = 0
        try:
            for cols, rows in pieces:
                if len(cols) != len(layout.fields):
                    raise ValueError("not the layout's fields")
                for k, col in enumerate(cols):
                    packer.gather(slot, k, col, rows, row0)
                row0 += len(rows)
        except (BufferError, ValueError, LayoutMismatchError):  # e.g. a strided label array
            self.pieces = None
            return False
        return True


_NONE = object()  # no samples from __getitems__ (NOTE [skipped samples]: one at a time)


class _Skipping:
    """on_error="skip": ``[row]`` is that row's sample, or the next of the batch that loads in
    its place (NOTE [skipped samples]); what was replaced goes to ``filler.skipped``."""

    __slots__ = ("filler", "ds", "indices", "failed", "loaded")

    def __init__(self, filler: BatchFiller, ds: Any, indices: list[int]) -> None:
        self.filler, self.ds, self.indices = filler, ds, indices
        self.failed: dict[int, Exception] = {}  # index -> what it raised in this fill
        self.loaded: dict[int, Any] = {}  # replacements whose own row comes later

    def __getitem__(self, row: int) -> Any:
        indices, failed, ctx = self.indices, self.failed, _local.ctx
        index = indices[row]
        if index in self.loaded:
            return self.loaded.pop(index)
        if index not in failed:
            try:
                return self.ds[index]
            except Exception as e:
                failed[index] = e
        n = len(indices)
        try:
            for k in range(1, n):
                other = (row + k) % n
                j = indices[other]
                if j in failed:
                    continue
                if j in self.loaded:
                    sample = self.loaded[j]
                else:
                    ctx[2] = j
                    try:
                        sample = self.ds[j]
                    except Exception as e:
                        failed[j] = e
                        continue
                    if other > row:
                        self.loaded[j] = sample
                error = failed[index]
                self.filler.skipped.append((index, type(error).__name__, _short(error), j))
                return sample
        finally:
            ctx[2] = index
        raise failed[index]  # every sample of the batch raised: the batch raises


def _short(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:
        text = "<str() of the exception failed>"
    return text if len(text) <= 300 else text[:297] + "..."


class _Kept:
    """The dataset, as seen by a batch that may have samples kept at start (BatchFiller.warm)."""

    __slots__ = ("filler", "seed", "epoch")

    def __init__(self, filler: BatchFiller, seed: int, epoch: int) -> None:
        self.filler, self.seed, self.epoch = filler, seed, epoch

    def __getitem__(self, index: int) -> Any:
        return self.filler._sample(self.seed, self.epoch, index)


def _pack_getitems(packer: Any, layout: Any, slot: int, idx_list: list[int], samples: Any,
                   objs: list[Any]) -> None:
    """Pack what ``__getitems__`` returned: a list of samples (torch's convention), or one
    already-stacked batch (the sample structure with a leading batch axis on every array); a
    tuple is whichever of the two the layout says it is (_tuple_of_samples)."""
    count = len(idx_list)
    if isinstance(samples, tuple) and len(samples) == count and _tuple_of_samples(layout,
                                                                                  samples):
        samples = list(samples)
    if not isinstance(samples, list):
        packer.pack_batch(slot, samples, count)
        return
    if len(samples) != count:
        raise ValueError(f"__getitems__ returned {len(samples)} samples for {count} indices")
    for row, sample in enumerate(samples):
        try:
            packer.pack(slot, row, sample, objs)
        except Exception as e:
            try:
                e._fastload_sample = idx_list[row]  # type: ignore[attr-defined]
            except Exception:
                pass  # an exception type without attributes: the batch is still named
            raise


def _tuple_of_samples(layout: Any, value: tuple[Any, ...]) -> bool:
    """Whether the tuple ``__getitems__`` returned holds samples rather than being the stacked
    batch of a tuple-shaped sample: ``value[0]`` is followed down the layout's tree along first
    children, as a whole sample would be (a stacked batch's ``value[0]`` is one level off: a
    stacked leaf where the tree has a container, or an array with one dimension too many)."""
    from .layout import N_ARRAY, N_DICT, N_LIST, N_OBJECT

    if not layout.stack:
        return True
    node, v = layout.tree, value[0]
    while True:
        kind = node[0]
        if kind == N_ARRAY:
            return bool(np.ndim(v) == len(layout.fields[node[2]].shape))
        if kind == N_OBJECT:
            return True  # a stacked batch cannot carry objects
        if kind == N_DICT:
            if not isinstance(v, dict) or not node[3] or node[3][0] not in v:
                return False
            node, v = node[2][0], v[node[3][0]]
            continue
        expected = list if kind == N_LIST else tuple
        if not isinstance(v, expected) or not node[2] or not len(v):
            return isinstance(v, expected) and not node[2]
        node, v = node[2][0], v[0]
