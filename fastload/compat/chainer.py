"""``chainer.iterators.MultiprocessIterator`` (Chainer 7.8.1) on fastload's engine.

    from fastload.compat.chainer import MultiprocessIterator  # instead of chainer.iterators'

Same arguments, validation and attributes (``epoch``, ``epoch_detail``,
``previous_epoch_detail``, ``is_new_epoch``, ``current_position``, ...), the same batches (a
list of samples, each in the structure the dataset returned), in the same order: Chainer's own
state machine (``chainer.iterators._statemachine``) runs in the main process, so batches cross
epoch boundaries as Chainer's do and an ``order_sampler`` is called with the same arguments, the
same number of times per epoch, as Chainer calls it. ``serialize()`` reads and writes Chainer's
keys, so trainer snapshots move both ways between this iterator and Chainer's. It is a
``chainer.dataset.Iterator``, so ``StandardUpdater``, ``Evaluator`` and ``Trainer`` take it as is.

NOTE [blocks of batches]
fastload's ``Loader`` loads a finite list of batches per Loader epoch (``batch_plan``, NOTE
[batch plans] in fastload/_plan.py); Chainer's stream is infinite with ``repeat=True``. The
stream is cut into blocks, one Loader epoch each. A block is planned, by running Chainer's state
machine, at the ``next()`` that needs its first batch, and ends just before the next batch that
crosses an epoch boundary (or after ``_MAX_BLOCK`` batches). So the order sampler is called when
you ask for the batch that needs the new order, exactly as ``SerialIterator`` calls it, and the
batches of a run depend only on the sampler's seed even across ``reset()``, snapshots and a
sampler that shares NumPy's global random state with the model (Chainer's prefetch thread calls
it up to ``n_prefetch + 1`` batches ahead, at times that vary from run to run). The price: the
loader's queue is empty at each block's start, so the first batch of every epoch waits for one
worker to load it (measured with benchmarks/bench_chainer.py, 2 workers: 3% of throughput with
32 batches per epoch, 8% with 4; a batch larger than the dataset crosses a boundary every time,
so it is loaded without prefetching). ``_MIN_BLOCK > 1`` would group short epochs into one block
at the cost of that exactness. The Chainer state after every planned batch is kept with it, so
the attributes and ``serialize()`` describe the batches you have received, not the prefetched.

What differs from Chainer's iterator:

* Samples come from fastload's shared-memory slots (``Loader(stack=False)``, NOTE [unstacked
  batches] in fastload/_ragged.py): every array of a sample (not of objects), wherever it is in
  the sample, is a zero-copy view into the slot (Chainer returns fresh copies); everything else
  comes back as itself, pickled, as Chainer's pool does. Views stay valid and unchanged while
  referenced; holding more than ``max_held`` batches (3) makes later batches copies (NOTE [held
  batches] in fastload/_slots.py).
* Samples may differ in structure, keys, dtypes and shapes, as with Chainer's iterator, and use
  shared memory all the same (no "shared memory is not used" warning). ``shared_mem`` is
  accepted and ignored: a batch larger than its slot (sized from the first sample) is sent in
  a memory file of its own.
* ``maxtasksperchild`` is accepted (validated as ``multiprocessing.Pool`` does) and has no
  effect: fastload's workers are persistent and are replaced only when they die. A value other
  than None issues a ``UserWarning`` saying so, since it usually means a dataset leaks memory.
* Errors are raised, not hung on: an exception in ``dataset[i]`` is raised by ``next()`` with
  the sample index and the worker's traceback, and a dead worker raises ``fastload.WorkerDied``
  (Chainer's prefetch thread dies and ``next()`` waits forever). A failed batch is planned again
  at the next ``next()``.
* ``dataset_timeout``: ``MultiprocessIterator.TimeoutWarning`` (Chainer's class) is issued once
  per batch that takes longer, naming the worker and the sample it is loading; the wait goes on.
* ``serialize()`` while saving leaves the prefetched batches alone (Chainer's discards them and
  asks the order sampler again for an epoch boundary it had prefetched past). With
  ``shuffle=False`` the ``order`` key is not written or read (Chainer's raises AttributeError).
* Negative ``n_processes`` and invalid ``maxtasksperchild`` raise at construction (Chainer's pool
  raises at the first ``next()``); ``batch_size`` must be an int >= 1; ``next()`` after
  ``finalize()`` raises ``fastload.LoaderClosedError``.
* Workers start at the first ``next()`` and are seeded per worker (``random``, ``np.random``),
  where Chainer's forked pool workers all inherit the parent's NumPy random state.

Extra keyword arguments ``max_held``, ``copy`` and ``pool`` are passed to :class:`fastload.Loader`:
with ``pool=fastload.Pool(n)`` the train and test iterators (and the copies Chainer's
``Evaluator`` makes) share that pool's ``n`` workers instead of starting ``n_processes`` each.
"""

from __future__ import annotations

import multiprocessing as _mp
import warnings
from collections import deque
from typing import Any

import numpy as np

try:
    from chainer.dataset.iterator import Iterator as _ChainerIterator
    from chainer.iterators import MultiprocessIterator as _ChainerMultiprocessIterator
    from chainer.iterators import _statemachine
    from chainer.iterators.order_samplers import ShuffleOrderSampler as _ShuffleOrderSampler
except (ImportError, AttributeError) as _e:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "fastload.compat.chainer needs Chainer 7.8.1, which needs NumPy < 2 and an old "
        "setuptools to build: pip install 'numpy<2' 'setuptools<70' wheel && pip install "
        f"--no-build-isolation chainer==7.8.1 (importing chainer failed: {_e!r})"
    ) from _e

from fastload._pool import Pool
from fastload.compat._chainer_worker import _ChainerDataset
from fastload.errors import LoaderClosedError
from fastload.loader import Loader

__all__ = ["MultiprocessIterator"]

# Chainer's originals, held from import time: a program may replace
# chainer.iterators.MultiprocessIterator with this class.
_TimeoutWarning: type[Warning] = _ChainerMultiprocessIterator.TimeoutWarning
_IteratorState: Any = _statemachine.IteratorState
_statemachine_step: Any = _statemachine.iterator_statemachine

#: NOTE [blocks of batches]: a block takes a batch that crosses an epoch boundary (asking the
#: order sampler) only while it holds fewer than this many batches: 1, only as its first ...
_MIN_BLOCK = 1
#: ... and is cut, mid-epoch if need be, at this many (planning runs the state machine per
#: batch: about 10 us each, paid at the first next() of the block).
_MAX_BLOCK = 1024

_TIMEOUT_MESSAGE = (
    "Stalled dataset is detected. "
    "See the documentation of MultiprocessIterator for common causes and "
    "workarounds:\n"
    "https://docs.chainer.org/en/stable/reference/generated/"
    "chainer.iterators.MultiprocessIterator.html"
)

_INIT_ATTRIBUTES = frozenset({
    "dataset", "batch_size", "repeat", "shuffle", "n_processes", "n_prefetch", "shared_mem",
    "dataset_timeout", "_maxtasksperchild", "order_sampler", "_max_held", "_copy",
})


def _warn_stalled(description: str) -> None:
    """Loader ``on_stall`` hook: Chainer's TimeoutWarning, plus what the batch waits for."""
    warnings.warn(f"{_TIMEOUT_MESSAGE}\n(fastload: {description})", _TimeoutWarning, stacklevel=1)


class MultiprocessIterator(_ChainerIterator):  # type: ignore[misc]
    """``chainer.iterators.MultiprocessIterator`` on fastload (differences: module docstring).

    Parameters are Chainer's: ``dataset``, ``batch_size``, ``repeat=True``, ``shuffle=None``
    (shuffle unless an ``order_sampler`` is given), ``n_processes=None`` (the CPU count),
    ``n_prefetch=1`` (batches in flight per worker), ``shared_mem=None`` (ignored),
    ``order_sampler=None``, ``dataset_timeout=30.0`` (seconds before a ``TimeoutWarning``;
    None: never), ``maxtasksperchild=None`` (no effect). Keyword-only extras ``max_held=3``,
    ``copy=False`` and ``pool=None`` (a :class:`fastload.Pool` to share) are
    :class:`fastload.Loader`'s.
    """

    TimeoutWarning = _TimeoutWarning

    # Class-level defaults, so that finalize() (called by __del__) works on a half-built object.
    _finalized = False
    _loader: Loader | None = None
    _block: Any = None
    _pool: Pool | None = None  # also what an unpickled iterator has (pools do not pickle)

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        repeat: bool = True,
        shuffle: bool | None = None,
        n_processes: int | None = None,
        n_prefetch: int = 1,
        shared_mem: int | None = None,
        order_sampler: Any = None,
        dataset_timeout: float | None = 30.0,
        maxtasksperchild: int | None = None,
        *,
        max_held: int = 3,
        copy: bool = False,
        pool: Pool | None = None,
    ) -> None:
        # -- Chainer's attributes and validation (chainer/iterators/multiprocess_iterator.py) --
        self.dataset = dataset
        self.batch_size = batch_size
        self.repeat = repeat
        self.shuffle = shuffle
        self.n_processes = n_processes or _mp.cpu_count()
        self.n_prefetch = max(n_prefetch, 1)
        self.shared_mem = shared_mem
        self.dataset_timeout = dataset_timeout
        self._maxtasksperchild = maxtasksperchild
        if self.shuffle is not None:
            if order_sampler is not None:
                raise ValueError('`shuffle` is not `None` and a custom '
                                 '`order_sampler` is set. Please set '
                                 '`shuffle` to `None` to use the custom '
                                 'order sampler.')
            else:
                if self.shuffle:
                    order_sampler = _ShuffleOrderSampler()
        else:
            if order_sampler is None:
                order_sampler = _ShuffleOrderSampler()
        self.order_sampler = order_sampler
        # -- what multiprocessing.Pool checks at Chainer's first next(), checked now ----------
        if self.n_processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if maxtasksperchild is not None and (
            not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0
        ):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if maxtasksperchild is not None:
            warnings.warn(
                "fastload.compat.chainer.MultiprocessIterator ignores maxtasksperchild: its "
                "worker processes are persistent and are replaced only when they die",
                UserWarning,
                stacklevel=2,
            )
        self._max_held = max_held
        self._copy = copy
        if pool is not None and not isinstance(pool, Pool):
            raise TypeError(f"pool must be a fastload.Pool, got {type(pool).__name__}")
        # A shared pool (train and test iterators, Evaluator copies): its workers, not
        # n_processes of our own. Not pickled: an unpickled iterator starts its own workers.
        self._pool = pool
        self._initialize_loop()

    def _initialize_loop(self) -> None:
        """fastload's side (no process starts before the first next()), then reset()."""
        # The loader's shape, fixed here as Chainer's prefetch loop fixes it at construction.
        self._bs: int = self.batch_size
        self._repeat = bool(self.repeat)
        self._sampler = self.order_sampler
        self._n = len(self.dataset)
        self._plans: dict[int, list[Any]] = {}  # Loader epoch -> its block's index arrays
        self._pending: deque[tuple[Any, int]] = deque()  # (state after the batch, its size)
        self._plan_state: Any = None  # state after the last planned batch (None: _state)
        self._block = None
        self._loader = None
        self.reset()

    # -- Chainer's state ---------------------------------------------------------------------
    @property
    def current_position(self) -> int:
        position: int = self._state.current_position
        return position

    @property
    def epoch(self) -> int:
        epoch: int = self._state.epoch
        return epoch

    @property
    def is_new_epoch(self) -> bool:
        is_new: bool = self._state.is_new_epoch
        return is_new

    @property
    def epoch_detail(self) -> float:
        return self.epoch + self.current_position / self._epoch_size

    @property
    def previous_epoch_detail(self) -> float | None:
        if self._previous_epoch_detail < 0:
            return None
        return self._previous_epoch_detail

    @property
    def _epoch_size(self) -> int:
        order = self._state.order
        return len(self.dataset) if order is None else len(order)

    def reset(self) -> None:
        """Back to the first batch of epoch 0 (the order sampler is called once, as Chainer)."""
        if self.order_sampler is None:
            order = None
        else:
            order = self.order_sampler(np.arange(len(self.dataset)), 0)
        self._reset_state(0, 0, False, order)
        self._previous_epoch_detail = -1.0

    def _reset_state(self, current_position: int, epoch: int, is_new_epoch: bool,
                     order: Any) -> None:
        if self._finalized:
            raise NotImplementedError(
                'Reset of finalized MultiProcessIterator is currently not '
                'supported.')
        self._state = _IteratorState(current_position, epoch, is_new_epoch, order)
        self._drop_plan()

    def _drop_plan(self) -> None:
        """Forget what was planned past the batches received (the next block starts anew)."""
        self._pending.clear()
        self._plan_state = None
        self._block = None  # dropped, its Loader pass ends (NOTE [several passes])

    # -- batches -----------------------------------------------------------------------------
    def __next__(self) -> list[Any]:
        if self._finalized:
            raise LoaderClosedError("this MultiprocessIterator was finalized; create a new one")
        if not self._pending:
            self._plan_block()
        if not self._pending:  # repeat=False, and the epoch is over
            self._previous_epoch_detail = self.epoch_detail
            raise StopIteration
        state, count = self._pending[0]
        if count:
            try:
                batch = next(self._block)
            except BaseException:
                self._drop_plan()  # the Loader ended this block: plan again from _state
                raise
            samples: list[Any] = batch  # stack=False: the samples, as the dataset returned them
            del batch
        else:
            samples = []  # an empty dataset with repeat=False: Chainer's one empty batch
        self._pending.popleft()
        self._previous_epoch_detail = self.epoch_detail
        self._state = state
        return samples

    next = __next__

    def _plan_block(self) -> None:
        """NOTE [blocks of batches]: run Chainer's state machine for the next block."""
        st = self._state if self._plan_state is None else self._plan_state
        bs, repeat, n = self._bs, self._repeat, self._n
        plan: list[Any] = []
        pending: list[tuple[Any, int]] = []
        while len(plan) < _MAX_BLOCK:
            if len(plan) >= _MIN_BLOCK:
                size = n if st.order is None else len(st.order)
                if st.current_position + bs >= size:
                    break  # the next batch crosses into a new epoch: it starts the next block
            nxt, indices = _statemachine_step(st, bs, repeat, self._sampler, n)
            if indices is None:
                break
            st = nxt
            plan.append(indices)
            pending.append((st, len(indices)))
            if not repeat and st.epoch > 0:
                break
        if not pending:
            return
        if pending[0][1] == 0:  # len(dataset) == 0 (repeat=False): nothing to load
            self._pending.extend(pending)
            self._plan_state = st
            return
        loader = self._loader
        if loader is None:
            loader = self._loader = self._make_loader()
        self._block = iter(loader)  # one Loader epoch per block: NOTE [batch plans]
        self._plans.clear()
        self._plans[self._block.epoch] = plan  # asked for at the block's first next()
        self._pending.extend(pending)
        self._plan_state = st

    def _make_loader(self) -> Loader:
        stall = None
        if self.dataset_timeout is not None:
            stall = (float(self.dataset_timeout), _warn_stalled)
        pool = self._pool if self._pool is not None and not self._pool.closed else None
        return Loader(
            _ChainerDataset(self.dataset),
            self._bs,
            num_workers=self.n_processes if pool is None else None,
            pool=pool,
            prefetch=self.n_prefetch,
            max_held=self._max_held,
            copy=self._copy,
            batch_plan=self._plans.pop,  # no reference back to self
            on_stall=stall,
            stack=False,  # any sample Chainer takes: structures, keys, shapes may vary
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def finalize(self) -> None:
        """Stop the workers and free the shared memory. Idempotent; samples held stay valid."""
        if self._finalized:
            return
        self._finalized = True
        self._block = None
        loader, self._loader = self._loader, None
        if loader is not None:
            loader.close()

    def __copy__(self) -> MultiprocessIterator:
        # As Chainer's: a new iterator (whose __init__ calls the order sampler once) set to this
        # one's state; dataset_timeout and maxtasksperchild are not passed on, as in Chainer.
        other = MultiprocessIterator(
            self.dataset, self.batch_size, self.repeat, shuffle=None,
            n_processes=self.n_processes, n_prefetch=self.n_prefetch,
            shared_mem=self.shared_mem, order_sampler=self.order_sampler,
            max_held=self._max_held, copy=self._copy, pool=self._pool)
        other._reset_state(self.current_position, self.epoch,
                           self.is_new_epoch, self._state.order)
        other._previous_epoch_detail = self._previous_epoch_detail
        return other

    # -- snapshots ---------------------------------------------------------------------------
    def serialize(self, serializer: Any) -> None:
        """Chainer's keys: ``current_position``, ``epoch``, ``is_new_epoch``, ``order``
        (``_order`` in old snapshots; absent with ``shuffle=False``), ``previous_epoch_detail``.
        """
        current_position = serializer('current_position', self.current_position)
        epoch = serializer('epoch', self.epoch)
        is_new_epoch = serializer('is_new_epoch', self.is_new_epoch)
        old = self._state
        order = old.order
        if order is not None:
            order = order.copy()
            try:
                serializer('order', order)
            except KeyError:
                serializer('_order', order)
        if self._finalized:
            raise NotImplementedError(
                'Reset of finalized MultiProcessIterator is currently not '
                'supported.')
        same = (
            current_position == old.current_position and epoch == old.epoch
            and is_new_epoch == old.is_new_epoch
            and (order is None or np.array_equal(order, old.order))
        )
        if not same:  # loading another state (saving keeps what is prefetched)
            self._reset_state(current_position, epoch, is_new_epoch, order)
        try:
            self._previous_epoch_detail = serializer(
                'previous_epoch_detail', self._previous_epoch_detail)
        except KeyError:
            # guess previous_epoch_detail for older version (as Chainer does)
            self._previous_epoch_detail = self.epoch + \
                (self.current_position - self.batch_size) / self._epoch_size
            if self.epoch_detail > 0:
                self._previous_epoch_detail = max(
                    self._previous_epoch_detail, 0.)
            else:
                self._previous_epoch_detail = -1.

    def __getstate__(self) -> dict[str, Any]:
        # As Chainer's: the state, and the attributes to rebuild the iterator from.
        init = {k: v for k, v in self.__dict__.items() if k in _INIT_ATTRIBUTES}
        st = self._state
        return {
            "current_position": st.current_position, "epoch": st.epoch,
            "is_new_epoch": st.is_new_epoch, "order": st.order,
            "previous_epoch_detail": self._previous_epoch_detail, "init": init,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        # As Chainer's: the attributes, a fresh loop (whose reset() calls the order sampler
        # once), then the state.
        self.__dict__.update(state["init"])
        self._initialize_loop()
        self._reset_state(state["current_position"], state["epoch"], state["is_new_epoch"],
                          state["order"])
        self._previous_epoch_detail = state["previous_epoch_detail"]

    def __repr__(self) -> str:
        return (
            f"<fastload.compat.chainer.MultiprocessIterator batch_size={self.batch_size} "
            f"n_processes={self.n_processes} epoch={self.epoch} "
            f"position={self.current_position}{' finalized' if self._finalized else ''}>"
        )
