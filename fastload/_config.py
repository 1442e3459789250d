"""The validated, frozen settings of a Loader and of a Pool (one validation for both)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._options import check_options
from ._ragged import SampleSpec
from ._settings import PoolConfig, check_worker_args, thread_or

__all__ = ["PoolConfig", "LoaderConfig", "check_worker_args", "dataset_len", "resolve_shard",
           "distributed_world"]

#: The launchers' (rank, world size) variables, in the order shard="auto" reads them after an
#: initialized process group (NOTE [rank detection]); Lightning's, without a global rank, apart.
_SHARD_ENV = (
    ("RANK", "WORLD_SIZE"),  # torchrun, accelerate launch (GPU: torchrun), torch's env:// init
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),  # Open MPI
    ("PMI_RANK", "PMI_SIZE"),  # MPICH, Intel MPI (accelerate launch on CPUs reads them too)
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),  # MVAPICH
)


# NOTE [thread depth]
# Every batch in flight holds a slot, and every slot a worker has written to stays resident
# (slot_bytes each: 18 MiB for the image benchmark's batches of 128 x 224x224x3). Worker
# processes keep ``prefetch`` batches per worker. Thread workers keep one per thread (the one
# it is loading) plus ``prefetch`` queued for the pool as a whole, when that is fewer: the
# threads take their next task from the same ring in the same process, and a queue per
# thread bought no throughput. Measured on 2 cores, image, 8 workers, prefetch=2, medians of
# 5 interleaved runs: depth 16 (8 x 2) 23,698 samples/s and 336 MiB peak PSS; depth 12
# 24,004 /s, 262 MiB; depth 10 (8 + 2) 26,902 /s, 226 MiB (spreads +-10-25%: a loaded
# machine). With 2 workers (2 x 2 = 2 + 2) nothing changes; with prefetch=1 neither. The
# threads of a host process (NOTE [hosted threads] in _host.py) share one ring in one process
# as well, and keep the same depth.


@dataclass(frozen=True)
class LoaderConfig:
    """Every setting of a Loader, validated once (see Loader's docstring for their meaning).

    ``num_workers`` is what the loader uses: 0 for in-process loading (also for an empty
    dataset), the pool's count on a shared pool."""

    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    num_workers: int
    prefetch: int
    start_method: str | None
    worker_init: Callable[[int], Any] | None
    timeout: float | None
    max_held: int
    copy: bool
    on_worker_death: str
    shard: tuple[int, int]
    return_mask: bool
    batch_plan: Callable[[int], Iterable[Sequence[int]]] | None
    on_stall: tuple[float, Callable[[str], None]] | None
    sample_spec: SampleSpec | None = None
    share_dataset: bool = True
    on_error: str = "raise"  # NOTE [skipped samples] (_fill.py)
    max_skips: int | None = None  # per epoch, with on_error="skip"
    share_rows: bool = True  # NOTE [pieces] (csrc/fl_ring.c), where a batch allows it
    seed_globals: bool | None = None  # NOTE [global RNGs] (_rngs.py)
    assign: str = "any"  # "round_robin": batch b to worker b % num_workers
    in_order: bool = True  # False: each batch as soon as it is loaded (NOTE [out of order])
    io_concurrency: int = 1  # NOTE [reads in flight] (_io.py)
    #: "thread" (start_method says "thread" too) or "process_threads": threads of one host
    #: process (NOTE [hosted threads] in _host.py), started with start_method
    worker_method: str = "process"

    @property
    def depth(self) -> int:
        """Batches in flight (queued or being loaded) at once: ``prefetch`` per worker
        process; for thread workers one per thread plus ``prefetch`` for them all, if fewer
        (NOTE [thread depth])."""
        if self.worker_method != "process":
            return max(1, min(self.num_workers * self.prefetch,
                              self.num_workers + self.prefetch))
        return max(1, self.num_workers * self.prefetch)

    @property
    def nslots(self) -> int:
        """NOTE [held batches] (_slots.py): the batches in flight plus those the user holds
        (none with ``copy``: build sets ``max_held`` to 0)."""
        return self.depth + self.max_held

    def pool_config(self) -> PoolConfig:
        return PoolConfig(self.num_workers, self.start_method, self.worker_init, self.seed,
                          self.worker_method)

    @classmethod
    def build(
        cls, n: int | None, *, batch_size: Any, shuffle: bool, seed: Any, drop_last: bool,
        num_workers: Any, prefetch: Any, start_method: Any, worker_init: Any, timeout: Any,
        worker_method: Any = "process",
        max_held: Any, copy: bool, on_worker_death: Any, shard: Any, return_mask: bool,
        batch_plan: Any, on_stall: Any, pool: Any, ragged: Any = None, pad_value: Any = 0,
        stack: bool = True,
        pad_to_multiple: Any = None,
        share_dataset: bool = True,
        on_error: Any = "raise",
        max_skips: Any = None,
        share_rows: bool = True,
        seed_globals: bool | None = None,
        assign: str = "any",
        io_concurrency: int = 1,
        in_order: bool = True,
    ) -> LoaderConfig:
        """Validate a Loader's arguments (``pool``: a fastload.Pool or None; ``n``: the
        dataset's length, None for a plain iterable)."""
        c = check_options(dict(
            batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, prefetch=prefetch,
            timeout=timeout, max_held=max_held, copy=copy, on_worker_death=on_worker_death,
            return_mask=return_mask, batch_plan=batch_plan, on_stall=on_stall, stack=stack,
            share_dataset=share_dataset, on_error=on_error, max_skips=max_skips,
            share_rows=share_rows, seed_globals=seed_globals, assign=assign,
            io_concurrency=io_concurrency, in_order=in_order,
        ))
        if c["max_skips"] is not None and on_error != "skip":
            raise ValueError("max_skips applies with on_error='skip' (samples that raise "
                             "are skipped, up to max_skips per epoch)")
        if batch_plan is not None:
            for what, given in (("shuffle=True", c["shuffle"]),
                                (f"shard={shard!r}", shard is not None)):
                if given:
                    raise ValueError(
                        f"{what} does not apply with batch_plan: the plan's batches are this "
                        "process's epoch, in their order. Shuffle or split them inside "
                        "batch_plan (e.g. with a torch sampler: fastload.compat.torch.DataLoader "
                        "takes a DistributedSampler) and leave shuffle=False, shard=None"
                    )
        rank_world = resolve_shard(shard)
        sample_spec = SampleSpec.build(ragged, pad_value, pad_to_multiple, c["stack"])
        if num_workers is None and pool is None:
            num_workers = os.cpu_count() or 1
        seed = check_worker_args(num_workers, start_method, worker_init, seed, min_workers=0)
        if pool is None:
            start_method = thread_or(start_method, worker_method)
        elif worker_method != "process" and worker_method != pool.worker_method:
            raise ValueError(f"worker_method={worker_method!r} conflicts with the pool's "
                             f"worker_method={pool.worker_method!r}; leave worker_method unset "
                             "when passing pool=")
        if pool is not None:
            from ._pool import Pool

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
        return cls(
            batch_size=batch_size, shuffle=c["shuffle"], seed=seed, drop_last=c["drop_last"],
            num_workers=num_workers if n is None or n else 0, prefetch=prefetch,
            start_method=start_method, worker_init=worker_init, timeout=timeout,
            # copy=True returns copies only: no slot is set aside for held batches
            max_held=0 if c["copy"] else max_held, copy=c["copy"],
            on_worker_death=on_worker_death,
            shard=rank_world, return_mask=c["return_mask"], batch_plan=batch_plan,
            on_stall=on_stall, sample_spec=sample_spec, share_dataset=c["share_dataset"],
            on_error=on_error, max_skips=max_skips,
            # io_concurrency: a batch's reads overlap in its worker (NOTE [reads in flight]);
            # pieces of shared batches would start as single rows, one read at a time
            share_rows=c["share_rows"] and c["assign"] == "any" and c["io_concurrency"] == 1,
            seed_globals=c["seed_globals"], assign=c["assign"],
            io_concurrency=c["io_concurrency"], in_order=c["in_order"],
            worker_method=pool.worker_method if pool is not None else worker_method,
        )


def dataset_len(dataset: Any) -> int:
    """len(dataset), or a clear error for something that is not a map-style dataset."""
    if not hasattr(dataset, "__getitem__"):
        raise TypeError(
            f"dataset must support __getitem__(int) and __len__(); got {type(dataset).__name__}"
        )
    try:
        n = int(len(dataset))
    except TypeError:
        raise TypeError(
            f"dataset must define __len__(); {type(dataset).__name__} has no len()"
        ) from None
    if n < 0:
        raise ValueError(f"len(dataset) must be >= 0, got {n}")
    return n


# NOTE [rank detection]
# shard="auto" asks, in order:
# 1. an initialized ``torch.distributed`` process group (only if torch is already imported: the
#    loader never imports it): its rank and world size are what the training step uses;
# 2. the launchers' variables: ``RANK``/``WORLD_SIZE`` (torchrun, ``accelerate launch``), then
#    Lightning's (its launcher sets ``WORLD_SIZE``, ``LOCAL_RANK`` and ``NODE_RANK`` but no
#    ``RANK``; the global rank is NODE_RANK * processes per node + LOCAL_RANK, and the processes
#    per node are known only on node 0 (any count) or from ``LOCAL_WORLD_SIZE``), then Slurm,
#    Open MPI, PMI (MPICH, Intel MPI) and MVAPICH;
# 3. none of them: one process, (0, 1).
# A group and a launcher of several processes that disagree are refused (two truths about this
# rank: one of them would shard wrongly, silently); a launcher that says one process (Slurm's
# single task running ``mp.spawn``) does not contradict a group. Variables that say several
# processes without saying which this one is (WORLD_SIZE=2 alone) are refused unless a group
# or a later launcher of that size says it.


@dataclass(frozen=True)
class _EnvRanks:
    """What the launchers' variables say: ``rank`` None when they give the world size only."""

    rank: int | None
    world: int
    source: str  # the variables read, for errors
    world_var: str  # the one that gave the world size (the shard=None warning names it)


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"shard='auto': {name}={value!r} is not an integer") from None


def _lightning_rank(world: int) -> _EnvRanks:
    """Lightning's launcher: WORLD_SIZE, LOCAL_RANK and NODE_RANK (GROUP_RANK), no RANK."""
    local = _env_int("LOCAL_RANK")
    node_var = "NODE_RANK" if "NODE_RANK" in os.environ else "GROUP_RANK"
    node = _env_int(node_var) if node_var in os.environ else 0
    said = f"WORLD_SIZE={world}, LOCAL_RANK={local}, {node_var}={node}"
    if node == 0:
        return _EnvRanks(local, world, said, f"WORLD_SIZE={world}")
    if "LOCAL_WORLD_SIZE" in os.environ:
        per_node = _env_int("LOCAL_WORLD_SIZE")
        return _EnvRanks(node * per_node + local, world, f"{said}, LOCAL_WORLD_SIZE={per_node}",
                         f"WORLD_SIZE={world}")
    return _EnvRanks(None, world, f"{said} and no RANK or LOCAL_WORLD_SIZE", f"WORLD_SIZE={world}")


def _env_ranks() -> _EnvRanks | None:
    """NOTE [rank detection], step 2: the first launcher whose variables are set."""
    unresolved: _EnvRanks | None = None
    for rk, wk in _SHARD_ENV:
        if wk not in os.environ:
            if rk == "RANK" and rk in os.environ and _env_int(rk) > 0:
                unresolved = _EnvRanks(None, 0, f"RANK={os.environ[rk]} and no WORLD_SIZE", "")
            continue
        world = _env_int(wk)
        if rk in os.environ:
            found = _EnvRanks(_env_int(rk), world, f"{rk}={os.environ[rk]}, {wk}={world}",
                              f"{wk}={world}")
        elif rk == "RANK" and "LOCAL_RANK" in os.environ:
            found = _lightning_rank(world)
        elif world > 1:
            found = _EnvRanks(None, world, f"{wk}={world} and no {rk}", f"{wk}={world}")
        else:
            continue
        if found.rank is not None:
            if unresolved is not None and unresolved.world not in (0, found.world):
                raise ValueError(
                    f"shard='auto': the launchers' variables disagree ({unresolved.source}; "
                    f"{found.source}); pass shard=(rank, world_size)")
            return found
        unresolved = unresolved or found
    return unresolved


def _group_ranks() -> tuple[int, int] | None:
    """NOTE [rank detection], step 1: (rank, world size) of an initialized torch.distributed."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except (RuntimeError, ValueError, AttributeError):
        pass
    return None


def distributed_world() -> tuple[int, str] | None:
    """``(world size, where it was read)`` when this process is one of several ranks: an
    initialized ``torch.distributed`` (only if torch is already imported), else the launchers'
    variables (NOTE [rank detection]); None for a single process."""
    group = _group_ranks()
    if group is not None:
        return (group[1], "torch.distributed") if group[1] > 1 else None
    try:
        env = _env_ranks()
    except ValueError:
        return None  # shard="auto" says what is wrong with the variables
    if env is None or env.world <= 1:
        return None
    return env.world, env.world_var


def resolve_shard(shard: tuple[int, int] | str | None) -> tuple[int, int]:
    """``shard=`` of a Loader: None, "auto" (NOTE [rank detection]) or (rank, world_size)."""
    if shard is None:
        return (0, 1)
    if shard == "auto":
        group = _group_ranks()
        env = _env_ranks()
        several = env is not None and env.world > 1
        if group is not None:
            if several and env is not None and (env.world != group[1] or env.rank not in (
                    None, group[0])):
                raise ValueError(
                    f"shard='auto': torch.distributed says rank {group[0]} of {group[1]} but "
                    f"the launcher's variables say {env.source}; fix the launch (or the "
                    "variables) so that they agree, or pass shard=(rank, world_size)"
                )
            return resolve_shard(group)
        if env is None:
            return (0, 1)
        if env.rank is None:
            raise ValueError(
                f"shard='auto': the environment says several processes ({env.source}) but not "
                "which one this is; set RANK (with WORLD_SIZE), build the Loader after "
                "torch.distributed.init_process_group, or pass shard=(rank, world_size)"
            )
        return resolve_shard((env.rank, env.world))
    if isinstance(shard, str):
        raise ValueError(f"shard must be None, 'auto' or (rank, world_size), got {shard!r}")
    try:
        rank, world = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise ValueError(
            f"shard must be None, 'auto' or (rank, world_size), got {shard!r}"
        ) from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"shard=(rank, world_size) needs 0 <= rank < world_size, got {shard!r}")
    return (rank, world)
