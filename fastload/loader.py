"""Loader: the public iterator over batches (the engine behind it: fastload/_engine.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from multiprocessing.util import Finalize
from typing import Any

from ._config import LoaderConfig, dataset_len
from ._pool import Pool
from .errors import LoaderClosedError
from .layout import BatchLayout

try:
    from . import _pack, _ring  # noqa: F401  (the compiled core must import)
except ImportError as e:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        f"fastload's compiled core is not importable ({e}). Reinstall with a C compiler and "
        "Python headers available (e.g. apt-get install build-essential python3-dev; then "
        "pip install --force-reinstall --no-binary fastload-numpy fastload-numpy)."
    ) from e

from ._engine import Engine
from ._iterable import check_iterable_args
from ._kinds import kind_of
from ._stream import stream_view
from .stream import ShardedStream

__all__ = ["Loader", "backend"]

#: The compiled core is always in use (there is no slow fallback engine).
backend = "c"


class _EpochIterator(Iterator[Any]):
    """One pass over the loader: ``iter(loader)``. ``epoch`` is the epoch it iterates
    (0, 1, ... in the order ``iter()`` was called, or as resumed by ``load_state_dict``)."""

    def __init__(self, engine: Engine, loader: Loader) -> None:
        self._engine = engine
        # Keeps the loader alive while its epoch is iterated: ``for b in Loader(...)`` would
        # otherwise close the loader (its finalizer runs) right after iter().
        self._loader = loader
        self.epoch, self._pass = engine.start_epoch()

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        return self._engine.next_batch(self.epoch, self._pass)

    def __del__(self) -> None:
        # Dropped unfinished (break, garbage): its pass ends and frees its slots at the
        # engine's next step (NOTE [several passes] in _passes.py); noted only, as this may
        # run in any thread.
        engine = getattr(self, "_engine", None)
        if engine is not None and getattr(self, "_pass", None) is not None:
            engine.abandon(self.epoch, self._pass)

    def __len__(self) -> int:
        plan = self._engine.plan  # (a batch plan is not asked before the epoch's first next())
        return plan.nbatches if plan.batch_plan is not None else plan.user_len(self.epoch)


# Keyword arguments of the loaders users come from, and what fastload.Loader takes instead.
_FOREIGN = {
    "worker_init_fn": "use worker_init= (called as worker_init(worker_id))",
    "persistent_workers": "drop it: fastload's workers always persist across epochs",
    "prefetch_factor": "use prefetch= (batches in flight per worker)",
    "collate_fn": "drop it: fastload stacks samples itself (ragged= or stack=False for samples "
                  "that do not stack); for a collate_fn use fastload.compat.torch.DataLoader",
    "sampler": "use batch_plan= (a callable epoch -> batches of indices), or "
               "fastload.compat.torch.DataLoader, which takes torch samplers",
    "batch_sampler": "use batch_plan= (a callable epoch -> batches of indices), or "
                     "fastload.compat.torch.DataLoader, which takes torch samplers",
    "generator": "use seed= (the order depends only on seed and epoch)",
    "multiprocessing_context": "use start_method= ('fork', 'forkserver' or 'spawn')",
    "pin_memory": "drop it: batches are NumPy arrays in shared memory "
                  "(fastload.compat.torch.DataLoader takes pin_memory)",
    "in_order": "drop it: batches always come in the plan's order",
    "n_processes": "use num_workers=",
    "n_prefetch": "use prefetch=",
    "shared_mem": "drop it: slots are sized from the first samples and grow as needed",
    "dataset_timeout": "use timeout=",
    "repeat": "drop it: every iter(loader) is one epoch",
    "order_sampler": "use batch_plan= (a callable epoch -> batches of indices), or "
                     "fastload.compat.chainer.MultiprocessIterator",
}


def _unknown_arguments(unknown: Mapping[str, Any]) -> str:
    """The TypeError text for keyword arguments Loader does not take, with what to use."""
    import difflib
    import inspect

    known = [p for p in inspect.signature(Loader.__init__).parameters
             if p not in ("self", "dataset", "unknown")]
    lines = []
    for name in unknown:
        if name in _FOREIGN:
            hint = _FOREIGN[name]
        else:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {near[0]}=?" if near else "see help(fastload.Loader)"
        lines.append(f"{name!r}: {hint}")
    if len(lines) == 1:
        return f"Loader() got an unexpected keyword argument {lines[0]}"
    return "Loader() got unexpected keyword arguments:\n  " + "\n  ".join(lines)


def _warn_if_every_rank_gets_everything(engine: Engine) -> None:
    """NOTE [one rank of many]: a map-style dataset or a ShardedStream iterated by each of
    several ranks (torchrun, Slurm, MPI, torch.distributed) without ``shard=`` hands every rank
    the whole epoch: duplicated training data and no error. fastload does not shard on its own
    (the same script must give the same batches wherever it runs); it warns, once per loader,
    at the first ``iter()``. A batch plan (its owner samples) and a plain iterable (it splits
    itself, as under torch) are left alone."""
    from ._config import distributed_world

    if engine.cfg.batch_plan is not None or engine.plan.iterable:
        return
    world = distributed_world()
    if world is None:
        return
    import warnings

    warnings.warn(
        f"this process is one of {world[0]} ranks ({world[1]}) and this fastload.Loader is not "
        "sharded: every rank loads the whole dataset each epoch. Pass shard='auto' (each rank "
        "its own share, equal batch counts) or shard=(rank, world_size); shard=(0, 1) says "
        "that every rank should see everything and silences this warning",
        RuntimeWarning, stacklevel=3,
    )


class Loader:
    """Batches of NumPy arrays from a dataset, loaded by persistent worker processes.

    Parameters
    ----------
    dataset : object
        Anything with ``__len__`` and ``__getitem__(int)``; a sample is an array, a scalar, or a
        tuple / list / dict / namedtuple of them, nested to any depth. Leaves that are not
        arrays or numbers (strings, arbitrary objects) are delivered as a list per batch. A
        ``__getitems__(list_of_int)`` method, if present, is called once per batch instead.
        Also a :class:`fastload.ShardedStream`, or a plain iterable (``__iter__`` and no
        ``__getitem__``, e.g. torch's ``IterableDataset``): each worker then iterates its own
        copy every epoch, as torch's workers do (split it with :func:`get_worker_info`), and
        batches come round-robin from the workers (NOTE [iterable datasets] in
        fastload/_iterable.py); ``len(loader)`` needs the dataset's ``__len__``.
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
        NOTE [held batches] in fastload/_slots.py).
    copy : bool
        Always return owned copies instead of zero-copy views.
    shard : (rank, world_size), "auto" or None
        Load only this rank's share of every epoch (NOTE [rank sharding] in fastload/_plan.py):
        ranks are disjoint, cover the dataset, and get the same number of batches; without
        ``drop_last`` the last positions are padded with wrapped-around samples. ``"auto"`` reads
        torchrun's ``RANK``/``WORLD_SIZE``, Slurm's ``SLURM_PROCID``/``SLURM_NTASKS`` or Open
        MPI's ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE`` (a single process if none is set).
        ``None`` in one of several ranks warns at the first ``iter()`` (NOTE [one rank of
        many]); ``(0, 1)`` means every rank should see everything and is not warned.
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
    ragged : {"list", "pad", "packed"} or dict, optional
        Array leaves whose shape varies from sample to sample (same dtype and number of
        dimensions); NOTE [ragged leaves] in fastload/_ragged.py. A mode for every array leaf
        of 1 or more dimensions, or a dict from leaf (its path as errors print it, e.g.
        ``"sample['tokens']"``, or a top-level dict key, ``"tokens"``) to a mode. A declared
        leaf comes back in its mode in every batch: ``"list"``, a list of arrays (views);
        ``"pad"``, :class:`fastload.Padded` ``(values, lengths)``, padded by the worker with
        ``pad_value``; ``"packed"``, :class:`fastload.Packed` ``(values, offsets)``, the
        samples concatenated along axis 0 (``offsets`` is ``cu_seqlens``). Ragged values are
        written into the slot without pickling and read as views; a batch too large for its
        slot travels over the worker's pipe (``stats()["spilled_batches"]``).
    pad_value : number
        What ``"pad"`` fills with (0).
    pad_to_multiple : int, optional
        ``"pad"`` rounds each varying extent up to a multiple of this (fewer distinct shapes
        for compiled models).
    stack : bool
        ``False``: each batch is the list of its samples, each with its own structure (keys,
        nesting, leaf types and shapes may differ from sample to sample; NOTE [unstacked
        batches] in fastload/_ragged.py). Their arrays still travel through the slot without
        pickling and come back as views; other leaves come back as themselves (pickled).
    shuffle_buffer : int, optional
        For a :class:`fastload.ShardedStream` with ``shuffle=True``: each shard's samples are
        permuted within consecutive windows of this many samples (default 1024), besides the
        shard order (NOTE [stream order] in fastload/_stream.py).
    share_dataset : bool
        Before the workers start, replace the dataset's large Python lists, tuples and dicts
        (10,000 items or ~16 MiB; in its attributes, one level into plain containers of them,
        and in objects it wraps) with :class:`fastload.SharedList` / :class:`fastload.SharedDict`
        in the copy the workers get, so that every worker reads one shared copy instead of
        copying it (fork: page by page as it reads; spawn/forkserver: unpickled whole). Your
        object is not changed; ``stats()["shared_dataset"]`` lists what was shared (NOTE
        [shared datasets] in fastload/_share.py). ``False`` sends the dataset as it is.
    on_error : {"raise", "skip"}
        What a sample whose ``__getitem__`` raises does. ``"raise"``: its batch raises the
        error (rebuilt as :class:`WorkerError` from a worker) and the next ``next()`` goes on
        with the next batch, as torch's iterator does. ``"skip"``: the sample is replaced by
        the next sample of its batch that loads (wrapping round to the batch's first), so
        batches keep their size and the result is the same for any ``num_workers`` and across
        a resume; each replacement is logged (the first 10) and listed in
        ``stats()["skipped"]``; a batch whose every sample raises still raises (NOTE [skipped
        samples] in fastload/_fill.py). Map-style datasets only.
    max_skips : int, optional
        With ``on_error="skip"``: more than this many replaced samples in one epoch raise
        :class:`SkipLimitError` (listing them) and end the epoch; None: no limit.
    share_rows : bool
        Let idle workers load the remaining samples of the oldest unfinished batch, so the
        first batch and the last ones of an epoch do not wait for one worker while the others
        idle (default True): the first batch of each epoch, its last ``2 * num_workers`` and
        those loaded ahead for the next epoch are shared (a batch that takes less than 20 ms
        to load is still taken whole by one worker), the others are each loaded by one
        worker. It applies to map-style datasets
        loaded one ``__getitem__`` at a time into fixed-shape batches (no ``__getitems__``,
        ragged or object leaves, or ``on_error="skip"``), with two workers or more; the
        batches are the same either way, only which worker loads which sample changes
        (``get_worker_info().id`` may differ between the samples of a shared batch). NOTE
        [shared rows] in csrc/fl_ring.c.

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
        ragged: str | Mapping[str, str] | None = None,
        pad_value: float = 0,
        pad_to_multiple: int | None = None,
        stack: bool = True,
        share_dataset: bool = True,
        shuffle_buffer: int | None = None,
        on_error: str = "raise",
        max_skips: int | None = None,
        share_rows: bool = True,
        **unknown: Any,
    ) -> None:
        self._engine: Engine | None = None
        self._world_checked = shard is not None  # NOTE [one rank of many]: said explicitly
        if unknown:
            raise TypeError(_unknown_arguments(unknown))
        if isinstance(dataset, ShardedStream):
            if batch_plan is not None:
                raise ValueError("batch_plan cannot drive a ShardedStream: fastload plans the "
                                 "stream's order itself (NOTE [stream order])")
            if on_error == "skip":
                raise ValueError(
                    "on_error='skip' replaces a failing sample by another sample of its batch, "
                    "which needs a map-style dataset; a ShardedStream's iter_shard cannot go on "
                    "after it raised. Skip bad records inside iter_shard (catch, log, continue)")
            dataset = stream_view(dataset, shuffle, shuffle_buffer, num_workers, start_method,
                                  loader=Loader)
        elif shuffle_buffer is not None:
            raise ValueError("shuffle_buffer applies to a fastload.ShardedStream dataset; a "
                             "map-style dataset is shuffled whole (shuffle=True)")
        iterable = kind_of(dataset).iterable  # NOTE [dataset kinds] (_kinds.py)
        if on_error == "skip" and iterable:
            raise ValueError(
                "on_error='skip' replaces a failing sample by another sample of its batch, "
                "which needs a map-style dataset (__getitem__); a stream's iterator cannot go "
                f"on after it raised. Skip bad records inside {type(dataset).__name__}'s "
                "iterator instead (catch, log, continue)")
        if iterable:
            check_iterable_args(dataset, shuffle=shuffle, shard=shard, batch_plan=batch_plan)
        n = None if iterable else dataset_len(dataset)
        cfg = LoaderConfig.build(
            n, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
            num_workers=num_workers, prefetch=prefetch, start_method=start_method,
            worker_init=worker_init, timeout=timeout, max_held=max_held, copy=copy,
            on_worker_death=on_worker_death, shard=shard, return_mask=return_mask,
            batch_plan=batch_plan, on_stall=on_stall, pool=pool, ragged=ragged,
            pad_value=pad_value, pad_to_multiple=pad_to_multiple, stack=stack,
            share_dataset=share_dataset, on_error=on_error, max_skips=max_skips,
            share_rows=share_rows,
        )
        self.batch_size = cfg.batch_size
        self.num_workers = cfg.num_workers
        self.seed = cfg.seed
        self._engine = Engine(dataset, n, cfg, pool)
        # Runs on garbage collection, and at interpreter exit before multiprocessing reaps its
        # children (exitpriority >= 0 runs in _exit_function's first pass).
        self._finalizer = Finalize(self, Engine.close, args=(self._engine,), exitpriority=10)

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
        if e.plan.batch_plan is not None:  # not asked before its epoch's first next()
            return e.plan.nbatches
        return e.plan.user_len(e.active_epoch if e.active_epoch is not None else e.next_epoch)

    def __iter__(self) -> _EpochIterator:
        if self._engine is None:
            raise LoaderClosedError("this Loader was not constructed")
        if not self._world_checked:
            self._world_checked = True
            _warn_if_every_rank_gets_everything(self._engine)
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
        self.seed = self._engine.plan.seed

    def stats(self) -> dict[str, Any]:
        """Counters: copied and spilled batches, worker restarts, ring operations;
        ``skipped`` (on_error="skip"): the replaced samples, the latest 1,000, each a dict of
        ``epoch``, ``index``, ``error`` (the exception's type and message) and ``replaced_by``
        (the index loaded in its place), and ``skipped_total``; ``shared_rows``: whether
        workers share the rows of batches (``share_rows``, once the first batch is loaded)."""
        assert self._engine is not None
        return self._engine.stats()

    def memory(self) -> dict[str, Any]:
        """What the loader's processes cost now, in bytes: ``main`` and each of ``workers``
        (``pid``, ``uss`` private, ``pss`` proportional share, ``rss``, ``private_dirty`` (the
        part of ``uss`` that is not clean file pages) and ``uss_growth`` since
        the first batch), ``shared_dataset_bytes`` (the containers share_dataset made)
        and ``total_pss`` (the machine's memory they take together). From /proc (Linux); a
        process /proc cannot read has only its pid. A worker whose private dirty memory grew by
        more than 256 MiB ($FASTLOAD_MEMORY_WARN_MIB) is warned about once, naming the likely
        dataset attributes (pages of memory-mapped files it read are clean: never warned)."""
        assert self._engine is not None
        return self._engine.memory()

    # -- for fastload's own front ends and tools (they never reach into the engine) --------
    def _live_epochs(self) -> list[int]:
        """The epochs of the live passes, oldest first (NOTE [several passes])."""
        return list(self._engine.passes.live) if self._engine is not None else []

    def _worker_pids(self) -> list[int | None]:
        """The worker processes' pids (None: a worker not running now); [] without workers."""
        e = self._engine
        return e.pool.pids() if e is not None and e.pool is not None else []

    def _unshared(self) -> list[str]:
        """Large containers share_dataset left unshared, and why (NOTE [shared datasets])."""
        return self._engine.suspects() if self._engine is not None else []

    def _len_or_unknown(self) -> int | str:
        try:
            return len(self) if self._engine is not None else "?"
        except TypeError:  # a plain iterable without __len__
            return "?"

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        e = self._engine
        state = "closed" if e is None or e.closed else "open"
        return (
            f"<fastload.Loader batch_size={self.batch_size} num_workers={self.num_workers} "
            f"batches={self._len_or_unknown()} {state}>"
        )
