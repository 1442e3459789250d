"""Loader: the public iterator over batches (the engine behind it: fastload/_engine.py)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from multiprocessing.util import Finalize
from typing import Any

from ._config import LoaderConfig, dataset_len
from ._options import OPTIONS, check_options, docstring_parameters
from ._pool import Pool
from .errors import LayoutMismatchError, LoaderClosedError
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
        try:
            return self._engine.next_batch(self.epoch, self._pass)
        except LayoutMismatchError as e:
            advice = _format_advice(self._engine.dataset)
            if advice and advice not in getattr(e, "__notes__", ()):
                e.add_note(advice)
            raise

    def __del__(self) -> None:
        # Dropped unfinished (break, garbage): its pass ends and frees its slots at the
        # engine's next step (NOTE [several passes] in _passes.py); noted only, as this may
        # run in any thread.
        engine = getattr(self, "_engine", None)
        if engine is not None and getattr(self, "_pass", None) is not None:
            engine.abandon(self.epoch, self._pass)

    def __len__(self) -> int:
        return self._engine.plan.len_of(self.epoch)  # NOTE [batch plans] (_plan.py)


def _format_advice(dataset: Any) -> str | None:
    """For a Hugging Face ``datasets.Dataset`` (or a wrapper's ``.dataset``) whose format is not
    NumPy: its samples are Python lists, a leaf per number, which is why they do not stack.
    Recognised by its type's module and name; ``datasets`` is not imported."""
    for d in (dataset, getattr(dataset, "dataset", None)):
        t = type(d)
        if t.__name__ in ("Dataset", "IterableDataset") and t.__module__.split(".")[0] == \
                "datasets":
            fmt = getattr(d, "format", None)
            kind = fmt.get("type") if isinstance(fmt, Mapping) else None
            if kind != "numpy":
                return (f"fastload: this is a Hugging Face dataset in the {kind or 'python'!r} "
                        "format, whose samples are nested Python lists (a leaf per number); "
                        "call dataset.set_format(\"numpy\") first, so that they are arrays")
    return None


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


def _check_auto_shard_still_holds(built: tuple[int, int]) -> None:
    """NOTE [rank detection] (_config.py): shard="auto" is resolved when the Loader is built. A
    Loader built before the launcher started the ranks (Lightning's ``Trainer.fit`` starts them
    and sets their variables) took the whole dataset on rank 0 while the other ranks shard:
    different batch counts, a hang or duplicated data. The first ``iter()`` reads "auto" again
    and refuses a change."""
    from ._config import resolve_shard

    now = resolve_shard("auto")
    if now != built:
        raise ValueError(
            f"shard='auto' was rank {built[0]} of {built[1]} when this Loader was built but is "
            f"rank {now[0]} of {now[1]} now: the ranks were started (or torch.distributed "
            "initialized) after it was built. Build the Loader where the ranks exist (with "
            "Lightning: in train_dataloader() or a LightningDataModule's hooks), or pass "
            "shard=(rank, world_size)"
        )


def _warn_if_every_rank_gets_everything(engine: Engine) -> None:
    """NOTE [one rank of many]: a map-style dataset or a ShardedStream iterated by each of
    several ranks (torchrun, Slurm, MPI, torch.distributed) without ``shard=`` hands every rank
    the whole epoch: duplicated training data and no error. fastload does not shard on its own
    (the same script must give the same batches wherever it runs); it warns, once per loader,
    at the first ``iter()``. A batch plan (its owner samples) and a plain iterable (it splits
    itself, as under torch) are left alone."""
    from ._config import distributed_world, resolve_shard

    if engine.cfg.batch_plan is not None or engine.plan.iterable:
        return
    world = distributed_world()
    if world is None:
        return
    import warnings

    try:  # the advice must work here: shard="auto" reads what distributed_world() read
        resolve_shard("auto")
        advice = "Pass shard='auto' (each rank its own share, equal batch counts) or "
    except ValueError as e:
        advice = f"shard='auto' cannot tell this rank here ({e}). Pass "
    warnings.warn(
        f"this process is one of {world[0]} ranks ({world[1]}) and this fastload.Loader is not "
        f"sharded: every rank loads the whole dataset each epoch. {advice}"
        "shard=(rank, world_size); shard=(0, 1) says that every rank should see everything and "
        "silences this warning",
        RuntimeWarning, stacklevel=3,
    )


class Loader:
    """Batches of NumPy arrays from a dataset, loaded by persistent worker processes.

    (The "Parameters" section is written from fastload/_options.py at import: see
    ``_document_parameters``.)

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
        worker_method: str = "process",
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
        seed_globals: bool | None = None,
        io_concurrency: int = 1,
        assign: str = "any",
        in_order: bool = True,
        **unknown: Any,
    ) -> None:
        given = locals()
        self._engine: Engine | None = None
        self._world_checked = shard is not None  # NOTE [one rank of many]: said explicitly
        # NOTE [rank detection] (_config.py): "auto" is read when the Loader is built, and read
        # again at the first iter() (a launcher may start the ranks in between: Lightning's)
        self._auto_checked = not (isinstance(shard, str) and shard == "auto")
        if unknown:
            raise TypeError(_unknown_arguments(unknown))
        # Checked before anything uses them (a stream's shuffle, an iterable's checks);
        # LoaderConfig.build checks them again with the rest.
        shuffle = check_options({o.name: given[o.name] for o in OPTIONS})["shuffle"]
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
                                  loader=Loader, timeout=timeout)
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
            worker_method=worker_method,
            worker_init=worker_init, timeout=timeout, max_held=max_held, copy=copy,
            on_worker_death=on_worker_death, shard=shard, return_mask=return_mask,
            batch_plan=batch_plan, on_stall=on_stall, pool=pool, ragged=ragged,
            pad_value=pad_value, pad_to_multiple=pad_to_multiple, stack=stack,
            share_dataset=share_dataset, on_error=on_error, max_skips=max_skips,
            share_rows=share_rows, seed_globals=seed_globals, assign=assign,
            io_concurrency=io_concurrency, in_order=in_order,
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
        """The start method in use (None when there are no workers; ``"thread"`` for thread
        workers)."""
        e = self._engine
        return None if e is None or e.pool is None else e.pool.start_method

    @property
    def worker_method(self) -> str:
        """``"thread"`` when the workers are threads of this process, ``"process_threads"``
        when they are threads of one helper process, else ``"process"`` (also with
        ``num_workers=0``)."""
        e = self._engine
        return "process" if e is None or e.pool is None else e.pool.worker_method

    def __len__(self) -> int:
        assert self._engine is not None
        e = self._engine  # a batch plan: NOTE [batch plans] (_plan.py)
        return e.plan.len_of(e.active_epoch if e.active_epoch is not None else e.next_epoch)

    def __iter__(self) -> _EpochIterator:
        if self._engine is None:
            raise LoaderClosedError("this Loader was not constructed")
        if not self._world_checked:
            self._world_checked = True
            _warn_if_every_rank_gets_everything(self._engine)
        if not self._auto_checked:
            _check_auto_shard_still_holds(self._engine.cfg.shard)  # each iter() until it holds
            self._auto_checked = True
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
        With ``shard``, the state of any one rank (rank 0's) resumes every rank, on the same
        world size (each rank's uninterrupted batches) or another (the rest of the epoch split
        across the new ranks, nothing lost or repeated: NOTE [resume across ranks]).
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
        workers share the rows of batches (``share_rows``, once the first batch is loaded);
        ``seeded_globals``: whether the global RNGs are seeded before each sample
        (``seed_globals``, once the first sample has loaded); ``start_method`` and
        ``start_method_reason``: how the workers started and why (None without workers)."""
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

    def _worker_processes(self) -> list[Any]:
        """The running workers by id: ``multiprocessing.Process`` objects (``pid``,
        ``is_alive()``, ``join()``, ``exitcode``), thread workers' stand-ins for them; [] without
        workers or once closed."""
        e = self._engine
        if e is None or e.pool is None or e.closed:
            return []
        return [p for p in e.pool.procs if p is not None]

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


def _document_parameters(doc: str) -> str:
    """Loader's docstring with its "Parameters" section, from the options' records
    (fastload/_options.py), in place of the note that says so."""
    head, sep, examples = doc.partition("    Examples\n")
    head = head[: head.index("    (The \"Parameters\" section")]
    params = textwrap.indent(docstring_parameters(), "    ")
    return f"{head}{params}\n\n{sep}{examples}"


if Loader.__doc__:  # None under python -OO
    Loader.__doc__ = _document_parameters(Loader.__doc__)
