"""``torch.utils.data.DataLoader`` on fastload's engine.

    from fastload.compat.torch import DataLoader   # instead of torch.utils.data.DataLoader

Same arguments, validation and error messages, same sampling order (torch's own samplers are
built exactly as torch builds them, with the same generator draws), same collation (NumPy
arrays, tensors and numbers become tensors; dicts, lists, namedtuples keep their type; tuples
become lists; strings become lists of str). What differs:

* Batches are zero-copy: every tensor of a batch is ``torch.from_numpy`` of a view into the
  shared-memory slot the worker packed it into; the tensor keeps the slot alive. Hold fewer than
  ``max_held`` batches at once (3 by default) or later batches are copies (see NOTE [held
  batches] in fastload/_slots.py).
* Workers are fastload's: started at the first ``iter()`` and kept until :meth:`close` (or
  garbage collection), whatever ``persistent_workers`` says. They are seeded the way torch
  seeds them (``torch.initial_seed() == base_seed + worker_id``, ``random`` likewise, NumPy with
  torch's ``_generate_state``), with the ``base_seed`` drawn at that first ``iter()``; with
  ``persistent_workers=False`` a base seed is still drawn from the generator at every
  ``iter()``, so the sampling order of every epoch equals torch's, but workers are not
  re-seeded (their RNG streams continue, as with ``persistent_workers=True``).
* Batch i of an epoch goes to worker i % num_workers, as torch orders them, so randomness
  drawn from the workers' global RNGs inside ``__getitem__`` is torch's, run to run.
  ``in_order=False`` is torch's too: the next batch goes to the next worker in turn that has
  fewer than ``prefetch_factor`` batches outstanding, and batches come as they are loaded.
  ``fastload.sample_rng()`` gives per-sample reproducible augmentation for any worker count.
* ``pool=fastload.Pool(n)`` (also accepted as ``multiprocessing_context=``) runs a DataLoader
  on that pool's workers, already started and shared with other loaders: a new DataLoader starts
  no process, several can be iterated at once, and each worker seeds itself, sets torch's
  ``get_worker_info()`` and runs ``worker_init_fn`` as torch's fresh worker would, at its first
  sample of that DataLoader (NOTE [pool workers] in fastload/compat/_torch_worker.py).
* A custom ``collate_fn`` runs in the main process on the samples as the dataset returned them,
  of any structure and shapes (``fastload.Loader(stack=False)``: each tensor's and array's data
  travels through the shared slot, not pickled, and comes back as a zero-copy view: a tensor
  for a tensor, an array for an array; other leaves as themselves). With torch's default
  collate, samples are stacked by fastload in the workers; a leaf whose shape varies raises
  what torch's default collate raises, a RuntimeError that says so (``stack expects each
  tensor to be equal size``), which is also a ``fastload.LayoutMismatchError``.
* The index sampler (``batch_sampler``) is iterated at ``iter()`` rather than lazily at the
  first ``next()``; its draws from the generator come in the same order as torch's.
  Whatever it yields reaches ``__getitem__`` as torch passes it: keys of a dict-like dataset
  (which then needs no ``__len__``), (index, scale) tuples, ints past ``len(dataset)`` (NOTE
  [sampler keys] in fastload/compat/_torch_worker.py); shapes that vary between batches (a
  multi-scale batch sampler) need ``collate_fn=torch.utils.data.default_collate``, since
  fastload stacks into the first sample's layout.

* An ``IterableDataset`` is iterated by every worker, its own replica (``get_worker_info()``
  says which worker it is in), batches of ``batch_size`` per worker, round-robin over the
  workers as torch orders them; ``len()`` and its warning are torch's. Unlike torch, a sample
  that raises loses the rest of its batch's samples (as a map-style batch does), and a worker
  that dies can be restarted (``on_worker_death`` of fastload.Loader is not exposed here:
  torch's behaviour, an error, is kept).

Not supported: ``pin_memory_device`` (accepted and ignored with torch's warning), tensors
NumPy cannot represent (``bfloat16``, sparse, quantized).
"""

from __future__ import annotations

import copy
import math
import multiprocessing as _mp
import warnings
from typing import Any, TypeVar

import numpy as np

try:
    import torch
    from torch.utils.data import (
        BatchSampler,
        IterableDataset,
        IterDataPipe,
        RandomSampler,
        SequentialSampler,
    )
    from torch.utils.data import DataLoader as TorchDataLoader
    from torch.utils.data import default_collate as _default_collate
    from torch.utils.data.dataloader import _DatasetKind, _InfiniteConstantSampler
except ImportError as _e:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "fastload.compat.torch needs PyTorch: pip install torch (fastload itself does not)"
    ) from _e

from fastload import Pool
from fastload._deaths import RESTART_ADVICE
from fastload._procs import program_start_method
from fastload.compat._accelerate import keep_fastload_in_accelerate
from fastload.compat._accelerate import register as register_for_accelerate
from fastload.compat._leaves import T_MAP, T_OBJ, tag_of
from fastload.compat._torch_iter import WorkerProcess, warn_on_pickle_error, worker_processes
from fastload.compat._torch_worker import (
    _TorchDataset,
    _TorchDatasetGetitems,
    _TorchIterable,
    _WorkerInit,
    keyed_plan,
)
from fastload.errors import LayoutMismatchError, LoaderTimeoutError, WorkerDied
from fastload.loader import Loader

__all__ = ["DataLoader", "DataLoaderTimeoutError", "DataLoaderCollateError",
           "keep_fastload_in_accelerate"]


class DataLoaderTimeoutError(LoaderTimeoutError, RuntimeError):
    """No batch within ``timeout``: a RuntimeError, as torch raises, and a
    :class:`fastload.LoaderTimeoutError`."""


class DataLoaderCollateError(LayoutMismatchError, RuntimeError):
    """Torch's default collate cannot stack a leaf whose shape varies: a RuntimeError, as
    torch's ``torch.stack`` raises, and a :class:`fastload.LayoutMismatchError`."""


def _collate(x: Any, in_sequence: bool = False) -> Any:
    """Main side: torch's default_collate of a fastload batch (arrays -> tensors, zero-copy).
    ``in_sequence``: below a list or tuple, where torch transposes the samples with zip() and
    so hands a tuple, not a list, of each leaf's values to its rules."""
    if isinstance(x, np.ndarray):
        if x.dtype.char in "SaUO":
            raise TypeError(
                "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or "
                f"lists; found {x.dtype}"
            )
        return torch.from_numpy(x)
    if tag_of(x) == T_OBJ:  # torch's own rules for what fastload does not stack (str, IntEnum)
        values = [o.value for o in x[T_OBJ]]
        return _default_collate(tuple(values) if in_sequence else values)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_collate(v, True) for v in x))
    if isinstance(x, (tuple, list)):
        return [_collate(v, True) for v in x]  # torch: tuples become lists
    if isinstance(x, dict):
        kind = x.get(T_MAP)
        out = {k: _collate(v) for k, v in x.items() if k != T_MAP}
        if kind is None:
            return out
        clone = copy.copy(kind[T_OBJ][0].value)  # a dict subclass: torch's copy.copy + update
        clone.update(out)
        return clone
    return x


def _pin_memory(pin_memory: bool, device: str) -> bool:
    """Whether batches are pinned, with torch's warnings (at iter(), as torch's)."""
    if pin_memory and device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the "
            "device,"
            f"ignore pin_memory_device='{device}'.",
            stacklevel=3,
        )
    if pin_memory and not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=3,
        )
    return pin_memory and torch.accelerator.is_available()


def _distributed_settings() -> tuple[int, int]:
    """(world size, rank) as torch's DataLoader reads them (1, 0 without torch.distributed)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def _start_method_of(ctx: Any) -> str | None:
    if ctx is None:  # torch takes multiprocessing's default context: the program's, if it set one
        return program_start_method()
    return ctx if isinstance(ctx, str) else str(ctx.get_start_method())


def _pool_of(pool: Any, ctx: Any, num_workers: int) -> tuple[Any, Any, int]:
    """NOTE [pool workers] (_torch_worker.py): (the fastload.Pool given as ``pool=`` or, where
    the seed's users put theirs, as the multiprocessing context; the context left; the number
    of workers), checked."""
    if isinstance(ctx, Pool):
        if pool is not None and pool is not ctx:
            raise ValueError("pass the fastload.Pool once: as pool= or as "
                             "multiprocessing_context=, not two different pools")
        pool, ctx = ctx, None
    if pool is None:
        return None, ctx, num_workers
    if not isinstance(pool, Pool):
        raise TypeError(f"pool must be a fastload.Pool, got {type(pool).__name__}")
    if num_workers not in (0, pool.num_workers):
        raise ValueError(
            f"num_workers={num_workers} conflicts with the pool's "
            f"num_workers={pool.num_workers}; leave num_workers unset when passing "
            "pool= (the pool's workers serve this DataLoader)")
    if ctx is not None:
        raise ValueError("multiprocessing_context does not apply with pool=: the pool's "
                         "workers are already started (fastload.Pool(start_method=...) "
                         "chooses how)")
    return pool, None, pool.num_workers


_T_co = TypeVar("_T_co", covariant=True)

#: What torch refuses to change once a DataLoader is built (its __setattr__).
_FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")


class DataLoader(TorchDataLoader[_T_co]):  # type: ignore[misc]  # torch: not type-checked
    """``torch.utils.data.DataLoader`` on fastload (see the module docstring for differences).

    Extra keyword arguments ``max_held`` and ``copy`` are passed to :class:`fastload.Loader`;
    ``pool=fastload.Pool(n)``: on that pool's running workers (see the module docstring).
    Call :meth:`close` (or use ``with``) to stop the workers; garbage collection also does.

    NOTE [a real torch DataLoader]
    This is a subclass of torch's DataLoader, so that ``isinstance(dl, DataLoader)`` holds for
    the frameworks that look (Lightning injects its DistributedSampler only into DataLoaders,
    re-creating them as ``type(dl)(**arguments)``, which keeps fastload). torch's ``__init__``
    is not called (it would build torch's iterator machinery); this one sets every attribute
    torch's sets, with torch's validation and messages, and overrides what loads data:
    ``__iter__``, ``__len__``, ``_index_sampler``. ``_auto_collation`` is torch's read-only
    property: shadowed here by a class attribute, set per instance.
    """

    _auto_collation: bool = True

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        max_held: int = 3,
        copy: bool = False,
        pool: Any = None,
    ) -> None:
        self._loader: Loader | None = None
        self._loader_unstacked = False
        pool, multiprocessing_context, num_workers = _pool_of(pool, multiprocessing_context,
                                                              num_workers)
        # -- torch's validation, same order and messages (torch/utils/data/dataloader.py) ----
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; "
                "use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing."
                "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor "
                "to None."
            )
        elif num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        iterable = isinstance(dataset, IterableDataset)
        if isinstance(dataset, IterDataPipe) and shuffle is not None:  # torch's: shuffle=
            # turns the pipe's shuffle()s on or off
            dataset = torch.utils.data.graph_settings.apply_shuffle_settings(dataset,
                                                                             shuffle=shuffle)
        elif iterable:  # torch's checks (NOTE [ Custom Samplers and IterableDataset ] there)
            if shuffle not in {False, None}:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle option, but "
                    f"got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler option, but "
                    f"got sampler={sampler}"
                )
            elif batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified "
                    f"batch_sampler option, but got batch_sampler={batch_sampler}"
                )
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive "
                    "with batch_size, shuffle, sampler, and "
                    "drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None:
            if drop_last:
                raise ValueError(
                    "batch_size=None option disables auto-batching "
                    "and is mutually exclusive with drop_last"
                )
        if multiprocessing_context is not None:
            if num_workers > 0:
                if isinstance(multiprocessing_context, str):
                    valid = torch.multiprocessing.get_all_start_methods()
                    if multiprocessing_context not in valid:
                        raise ValueError(
                            "multiprocessing_context option "
                            f"should specify a valid start method in {valid!r}, but got "
                            f"multiprocessing_context={multiprocessing_context!r}"
                        )
                    multiprocessing_context = torch.multiprocessing.get_context(
                        multiprocessing_context
                    )
                if not isinstance(multiprocessing_context, _mp.context.BaseContext):
                    raise TypeError(
                        "multiprocessing_context option should be a valid context "
                        "object or a string specifying the start method, but got "
                        f"multiprocessing_context={multiprocessing_context}"
                    )
            else:
                raise ValueError(
                    "multiprocessing_context can only be used with "
                    "multi-process loading (num_workers > 0), but got "
                    f"num_workers={num_workers}"
                )
        if sampler is None:
            if iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        self._auto_collation = batch_size is not None or batch_sampler is not None
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.collate_fn = collate_fn  # None: torch's default_collate semantics, done here
        self._dataset_kind = _DatasetKind.Iterable if iterable else _DatasetKind.Map
        self._iterator = None  # torch's attribute; fastload's iterators are not kept here
        self._max_held = max_held
        self._copy = copy
        self.pool = pool  # an attribute of the argument's name: frameworks re-create loaders
        keep_fastload_in_accelerate()  # NOTE [accelerate]: once accelerate is imported
        self._plans: dict[int, list[Any]] = {}
        self._iterable = iterable
        self._IterableDataset_len_called: int | None = None  # torch's name: see __len__
        self._base_seed: int | None = None
        self._keys: Any = None  # NOTE [sampler keys] (_torch_worker.py)
        self._datapipe_seeds: Any = None  # NOTE [datapipes] (_torch_worker.py)
        self._initialized = True
        # torch's own check (a warning when num_workers exceeds the CPUs this process may use)
        TorchDataLoader.check_worker_number_rationality(self)

    def __setattr__(self, attr: str, val: Any) -> None:
        if attr in _FROZEN and self.__dict__.get("_initialized"):
            raise ValueError(
                f"{attr} attribute should not be set after {type(self).__name__} is initialized"
            )
        super().__setattr__(attr, val)

    # -- the index sampler ------------------------------------------------------------------
    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._iterable:  # as torch: from len(dataset), remembered for the warning in next()
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = (length // self.batch_size if self.drop_last
                          else math.ceil(length / self.batch_size))
            return length
        return len(self._index_sampler)

    @property
    def _unstacked(self) -> bool:
        """A custom collate_fn, or no auto-collation: the samples as the dataset returned them
        (any structure, shapes that vary), not stacked by fastload."""
        return self.collate_fn is not None or not self._auto_collation

    def _make_loader(self, max_batch: int, base_seed: int) -> Loader:
        getitems = hasattr(self.dataset, "__getitems__")
        unstacked = self._unstacked
        wrapped: Any
        if self._iterable:
            wrapped = _TorchIterable(self.dataset, unstacked, base_seed)
            self._datapipe_seeds = wrapped.seeds  # NOTE [datapipes] (_torch_worker.py)
        else:
            wrapped = (_TorchDatasetGetitems if getitems else _TorchDataset)(self.dataset,
                                                                            unstacked)
            wrapped.keys = self._keys
        plan: Any = {} if self._iterable else {"batch_plan": self._plans.pop}
        pool = self.pool
        threads = pool is not None and pool.start_method == "thread"
        init = (_WorkerInit(base_seed, self.num_workers, self.worker_init_fn,
                            _distributed_settings(), threads) if self.num_workers else None)
        if pool is not None:  # NOTE [pool workers]: each worker runs it at its first sample
            wrapped.init = init
        return warn_on_pickle_error(Loader)(
            wrapped,
            max(1, max_batch),
            num_workers=None if pool is not None else self.num_workers,
            pool=pool,
            prefetch=max(1, self.prefetch_factor or 1),
            start_method=_start_method_of(self.multiprocessing_context),
            worker_init=init if pool is None else None,
            timeout=float(self.timeout) if self.timeout > 0 else None,
            max_held=self._max_held,
            copy=self._copy,
            seed=base_seed % (2**63),
            drop_last=self.drop_last if self._iterable else False,
            stack=not unstacked,
            # torch loads each batch in one worker (get_worker_info() is the same for all of
            # its samples, and torch's tests rely on it): no shared batches (NOTE [pieces] in
            # csrc/fl_ring.c)
            share_rows=False,
            # torch's assignment (batch i to worker i % num_workers; in_order=False: NOTE [out
            # of order] in fastload/_scheduler.py) and torch's per-worker seeding, not
            # per-sample seeding: draws from the global RNGs in __getitem__ are torch's
            assign="round_robin", in_order=self.in_order,
            seed_globals=False,
            **plan,  # a map-style dataset's batches: no reference back to self
        )

    def __iter__(self) -> Any:
        # torch's own check and warning (too many workers for the CPUs this process may use),
        # at the same point of iter() as torch's _get_iterator; it reads num_workers only
        torch.utils.data.DataLoader.check_worker_number_rationality(self)
        if not self.__dict__.get("_world_checked"):
            object.__setattr__(self, "_world_checked", True)
            self._warn_if_every_rank_gets_everything()
        pin = _pin_memory(self.pin_memory, self.pin_memory_device)
        shared_seed = None
        if isinstance(self.dataset, IterDataPipe):  # torch draws it first (NOTE [datapipes])
            shared_seed = int(torch.empty((), dtype=torch.int64)
                              .random_(generator=self.generator).item())
        # torch draws the base seed when it creates an iterator: every iter() unless the workers
        # are persistent (then only the first), before the sampler draws anything.
        if self._base_seed is None or not self.persistent_workers:
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
            if self._base_seed is None:
                self._base_seed = seed
        if self._iterable:  # NOTE [iterable datasets] in fastload/_iterable.py
            if self._loader is None:
                self._loader = self._make_loader(self.batch_size or 1, self._base_seed)
                self._loader_unstacked = self._unstacked
            seeds = self._datapipe_seeds  # NOTE [datapipes]: each epoch's seed to the workers
            it = iter(self._loader) if seeds is None else seeds.start(self._loader, shared_seed)
            return _BatchIter(self, it, pin, None)
        if self._auto_collation:
            plan = [list(b) for b in self.batch_sampler]
        else:
            plan = [[i] for i in self.sampler]
        plan, keys = keyed_plan(plan, self._keys, self.dataset)  # NOTE [sampler keys]
        if keys is not self._keys:  # the first epoch of keys: a keyed loader from now on
            self.close()
            self._keys = keys
        biggest = max((len(b) for b in plan), default=1)
        if self._loader is not None and (
            biggest > self._loader.batch_size or self._loader_unstacked != self._unstacked
        ):
            self._loader.close()  # a custom batch sampler grew, or collate_fn changed kind
            self._loader = None
        if self._loader is None:
            hint = self.batch_size if self.batch_size else biggest
            self._loader = self._make_loader(max(hint, biggest), self._base_seed)
            self._loader_unstacked = self._unstacked
        it = iter(self._loader)  # one Loader epoch per iter(): see NOTE [batch plans]
        live = self._loader._live_epochs()  # passes may overlap (NOTE [several passes])
        for e in [e for e in self._plans if e not in live]:
            del self._plans[e]  # an iterator created and dropped unstarted
        self._plans[it.epoch] = plan  # asked for at the first next(), then popped
        return _BatchIter(self, it, pin, len(plan))

    def _warn_if_every_rank_gets_everything(self) -> None:
        """NOTE [one rank of many] in fastload/loader.py, torch's way: torch's DataLoader
        does not shard either (the sampler does), so neither does this one; but one of several
        ranks iterating torch's default sampler over the whole dataset is warned, once, at the
        first iter(). A sampler or batch sampler of any other type is taken to know what it does
        (DistributedSampler, Lightning's and accelerate's wrappers, the user's own)."""
        from fastload._config import distributed_world

        if self._iterable:
            return
        default = (SequentialSampler, RandomSampler)
        if type(self.sampler) not in default or (
            self.batch_sampler is not None
            and (type(self.batch_sampler) is not BatchSampler
                 or type(self.batch_sampler.sampler) not in default)
        ):
            return
        world = distributed_world()
        if world is None:
            return
        warnings.warn(
            f"this process is one of {world[0]} ranks ({world[1]}) and this DataLoader samples "
            f"the whole dataset with a {type(self.sampler).__name__}: every rank loads every "
            "sample each epoch, as torch's DataLoader would. Pass sampler="
            "torch.utils.data.DistributedSampler(dataset) (its shuffle= instead of the "
            "DataLoader's), or hand the loader to Lightning's Trainer, which re-creates it "
            "with one",
            RuntimeWarning, stacklevel=3,
        )

    def close(self) -> None:
        """Stop the workers and free the shared memory; batches still held stay valid.

        A later ``iter()`` starts new workers (seeded with the same base seed).
        """
        if self._loader is not None:
            self._loader.close()
            self._loader = None
        for table in (self._keys, self._datapipe_seeds):  # their anonymous files
            if table is not None:
                table.close()
        self._keys = self._datapipe_seeds = None

    def __enter__(self) -> DataLoader[_T_co]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<fastload.compat.torch.DataLoader batch_size={self.batch_size} "
            f"num_workers={self.num_workers} batches={len(self)}>"
        )


def _torch_worker_died(e: WorkerDied) -> WorkerDied:
    """The same error worded as torch's (torch/utils/data/_utils/signal_handling.py and
    dataloader.py), then fastload's own account of it."""
    import signal

    pid, code = e.fastload_deaths[0]
    if code is not None and code < 0:
        try:
            what = signal.strsignal(-code) or f"signal {-code}"
        except ValueError:
            what = f"signal {-code}"
        head = f"DataLoader worker (pid {pid}) is killed by signal: {what}. "
    else:
        pids = ", ".join(str(p) for p, _ in e.fastload_deaths)
        head = f"DataLoader worker (pid(s) {pids}) exited unexpectedly. "
    # This DataLoader has no on_worker_death (torch's behaviour, an error, is kept): advise
    # what applies to it instead of the Loader's option.
    oom = ("a SIGKILL is often the out-of-memory killer: reduce num_workers, batch_size or "
           "prefetch_factor; " if any(c == -9 for _, c in e.fastload_deaths) else "")
    text = str(e).replace(RESTART_ADVICE, (
        f"this DataLoader stops the epoch as torch's does; {oom}to recompute the lost batch and "
        "go on, use fastload.Loader(..., on_worker_death='restart') instead of this DataLoader"))
    out = WorkerDied(head + text)
    out.fastload_deaths = e.fastload_deaths
    return out


def _convert(x: Any) -> Any:
    """torch's default_convert for one sample (batch_size=None): arrays -> tensors."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x) if x.dtype.char not in "SaUO" else x
    if isinstance(x, np.generic):
        return torch.as_tensor(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_convert(v) for v in x))
    if isinstance(x, (tuple, list)):
        return [_convert(v) for v in x]  # torch: tuples become lists
    if isinstance(x, dict):
        return type(x)({k: _convert(v) for k, v in x.items()})
    return x


class _BatchIter:
    """One pass over a DataLoader. Like torch's iterator (and unlike a generator, which ends at
    its first exception), a batch whose samples raised is reported and the next ``next()`` goes
    on with the next batch (NOTE [errors do not end the epoch] in fastload/_engine.py)."""

    def __init__(self, dl: DataLoader[Any], it: Any, pin: bool, nbatches: int | None) -> None:
        self.dl, self.it, self.pin, self.nbatches, self.done = dl, it, pin, nbatches, 0
        self.collate, self.auto = dl.collate_fn, dl._auto_collation
        self.len_called = dl._IterableDataset_len_called  # an IterableDataset's (torch)
        self.yielded = 0

    def __iter__(self) -> _BatchIter:
        return self

    def __len__(self) -> int:
        return self.nbatches if self.nbatches is not None else len(self.dl)

    @property
    def _workers(self) -> list[WorkerProcess]:
        """torch's attribute: the worker processes serving this pass (the DataLoader's: they
        outlive the iterator until the DataLoader is closed or collected, or belong to its
        pool=). Without workers, torch's single-process iterator has no such attribute."""
        if not self.dl.num_workers:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '_workers' "
                                 "(num_workers=0: torch's single-process iterator has none)")
        return worker_processes(self.dl._loader)

    def _shutdown_workers(self) -> None:
        """torch's method: stop the workers (the DataLoader's: :meth:`DataLoader.close`)."""
        self.dl.close()

    def __next__(self) -> Any:
        if self.nbatches is not None and self.done >= self.nbatches:  # the plan's batches
            raise StopIteration
        self.done += 1
        out = self._next()
        self.yielded += 1
        if self.len_called is not None and self.yielded > self.len_called:
            msg = (f"Length of IterableDataset {self.dl.dataset} was reported to be "
                   f"{self.len_called}(when accessing len(dataloader)), but {self.yielded} samples "
                   "have been fetched. ")
            if self.dl.num_workers > 0:
                msg += ("For multiprocessing data-loading, this could be caused by not properly "
                        "configuring the IterableDataset replica at each worker. Please see "
                        "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset"
                        " for examples.")
            warnings.warn(msg, stacklevel=2)
        return out

    def _next(self) -> Any:
        collate = self.collate
        try:
            batch = next(self.it)
        except LoaderTimeoutError as e:
            raise DataLoaderTimeoutError(
                f"DataLoader timed out after {self.dl.timeout} seconds ({e})"
            ) from e
        except WorkerDied as e:
            if not e.fastload_deaths:
                raise
            raise _torch_worker_died(e) from e
        except LayoutMismatchError as e:
            mismatch = getattr(e, "shape_mismatch", None)
            if collate is not None or mismatch is None:
                raise
            path, want, got = mismatch
            what = f"{path}: expected shape {want} (as in the first sample), got {got}"
            index = getattr(e, "fastload_index", None)
            if index is not None and self.dl._keys is not None:  # NOTE [sampler keys]
                index = repr(self.dl._keys.key(index))
            where = f" (sample index {index})" if index is not None else ""
            raise DataLoaderCollateError(
                f"stack expects each tensor to be equal size: {what}{where}. torch's default "
                "collate stacks every leaf of the samples; pass a collate_fn (e.g. one using "
                "torch.nn.utils.rnn.pad_sequence) for samples whose shapes vary, or "
                "collate_fn=torch.utils.data.default_collate where the shapes agree within a "
                "batch but vary between batches (multi-scale batch samplers): fastload stacks "
                "into the layout of the first sample"
            ) from e
        if not self.auto:
            out = _convert(batch[0])  # unstacked: the sample as the dataset returned it
        elif collate is None:
            out = _collate(batch)
        else:
            out = collate(batch)  # unstacked: the list of samples
        if self.pin:
            from torch.utils.data._utils.pin_memory import pin_memory as _pin

            out = _pin(out, torch.accelerator.current_accelerator().type)
        return out


register_for_accelerate(DataLoader)
keep_fastload_in_accelerate()  # NOTE [accelerate]: if accelerate was imported first
