"""What kind of dataset a loader has, decided once, and what follows from it: its plan, its
fill path and what it can do.

NOTE [dataset kinds]
``kind_of(dataset)`` is the one place that looks at a dataset's methods (torch's
``_DatasetKind.create_fetcher`` is the model: the kind is decided once, and the rest asks it):

========== ============================================= =====================================
kind       how it is recognised                          how a batch is loaded
========== ============================================= =====================================
iterable   ``__iter__`` and no ``__getitem__``, or a     each worker's own iterator, round
           torch ``IterableDataset``                     robin (NOTE [iterable datasets])
columns    ``_fastload_columns()`` (``ArrayDataset``)    rows gathered in C, no Python call
pieces     ``_fastload_pieces`` (a ``ShardedStream``     pieces of shards gathered in C (or
           over ``NpyShards``, seen as its StreamView)   one ``__getitem__`` a sample)
getitems   ``__getitems__(indices)``                     one call per batch
map        ``__len__`` and ``__getitem__(index)``        one ``__getitem__`` per sample
========== ============================================= =====================================

A stream (``ShardedStream``) reaches the engine as a ``StreamView``, a map-style dataset of
epoch positions (fastload/_stream.py); ``stream`` says so, whatever its kind above. Only a
``map`` kind is loaded one ``__getitem__`` at a time (``per_sample``), which is what sharing a
batch's rows between workers needs (NOTE [sharing policy] in _scheduler.py); a ``columns`` or
``pieces`` dataset falls back to ``__getitem__`` per sample when a column cannot be gathered.

The gather hooks are a protocol (``GatherHooks``), for fastload's own datasets; a user's class
may implement them too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ._fill import BatchFiller
from ._iterable import IterFiller, IterPlan, is_iterable
from ._plan import EpochPlan
from ._stream import StreamPlan, StreamView

__all__ = ["Kind", "GatherHooks", "kind_of", "plan_for", "filler_for"]


class GatherHooks(Protocol):
    """What a dataset may add so that workers gather its rows in C (NOTE [dataset kinds]).

    ``_fastload_columns()``: the source arrays, one per leaf of a sample in the layout's leaf
    order, each indexed by sample along axis 0; a batch is ``col[indices]`` for every column,
    gathered straight into the slot (bounds-checked per index, GIL released). A column that
    cannot be gathered (not C-contiguous) sends the dataset back to ``__getitems__`` or
    ``__getitem__``.

    ``_fastload_pieces(indices)``: the batch as ``[(columns, rows), ...]`` pieces, each the
    columns of one source (a shard) and the rows to take from it, in batch order; None when it
    cannot (the dataset is then loaded one ``__getitem__`` a sample).
    """

    def _fastload_columns(self) -> list[np.ndarray[Any, Any]]: ...

    def _fastload_pieces(self, indices: Sequence[int]
                         ) -> list[tuple[list[np.ndarray[Any, Any]], np.ndarray[Any, Any]]] | None:
        ...


@dataclass(frozen=True)
class Kind:
    """A dataset's kind (NOTE [dataset kinds]) and what it can do: its fast paths, each a
    fallback for the one before (columns or pieces, then ``__getitems__``, then
    ``__getitem__``)."""

    name: str  # "iterable", "columns", "pieces", "getitems" or "map"
    stream: bool  # a ShardedStream's StreamView
    columns: bool = False  # _fastload_columns()
    pieces: bool = False  # _fastload_pieces(indices)
    getitems: bool = False  # __getitems__(indices)

    @property
    def iterable(self) -> bool:
        return self.name == "iterable"

    @property
    def per_sample(self) -> bool:
        """Loaded one ``__getitem__`` a sample (rows of a batch can go to several workers)."""
        return self.name == "map"

    @property
    def positions(self) -> bool:
        """Samples have positions (shuffle, shard, resume by position, skip a sample)."""
        return not self.iterable


def kind_of(dataset: Any) -> Kind:
    """The kind of ``dataset`` (NOTE [dataset kinds])."""
    stream = isinstance(dataset, StreamView)
    if is_iterable(dataset):
        return Kind("iterable", stream)
    columns = callable(getattr(dataset, "_fastload_columns", None))
    pieces = getattr(dataset, "_fastload_pieces", None) is not None
    getitems = getattr(dataset, "__getitems__", None) is not None
    name = ("columns" if columns else "pieces" if pieces else "getitems" if getitems
            else "map")
    return Kind(name, stream, columns, pieces, getitems)


def plan_for(dataset: Any, kind: Kind, n: int | None, cfg: Any) -> EpochPlan:
    """The epoch plan of a loader's dataset of ``kind`` (``n``: its length) from its config."""
    if kind.iterable:
        return IterPlan(dataset, cfg.batch_size, cfg.num_workers, cfg.drop_last, cfg.seed)
    plan: EpochPlan
    if kind.stream:
        plan = StreamPlan(dataset, cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed,
                          drop_last=cfg.drop_last, shard=cfg.shard)
    else:
        assert n is not None
        plan = EpochPlan(n, cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed,
                         drop_last=cfg.drop_last, shard=cfg.shard, batch_plan=cfg.batch_plan)
    if cfg.assign == "round_robin" and cfg.num_workers > 1:  # torch's order of workers
        plan.targeted, plan.round_robin = True, cfg.num_workers
    return plan


def filler_for(dataset: Any, worker_id: int | None, num_workers: int) -> BatchFiller:
    """The fill path of ``dataset`` in a worker (``worker_id``) or the main process (None)."""
    kind = kind_of(dataset)
    if kind.iterable:
        return IterFiller(dataset, worker_id, num_workers)
    return BatchFiller(dataset, worker_id, kind.getitems, kind.columns, kind.pieces)
