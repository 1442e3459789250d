"""The validated, frozen settings of a Loader and of a Pool (one validation for both)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._options import check_options
from ._ragged import SampleSpec
from ._settings import PoolConfig, check_worker_args

__all__ = ["PoolConfig", "LoaderConfig", "check_worker_args", "dataset_len", "resolve_shard",
           "distributed_world"]

#: Where shard="auto" looks for (rank, world size), in this order.
_SHARD_ENV = (
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)


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
    share_rows: bool = True  # NOTE [shared rows] (csrc/fl_ring.c), where a batch allows it

    @property
    def depth(self) -> int:
        """Batches in flight (queued or being loaded) at once."""
        return max(1, self.num_workers * self.prefetch)

    @property
    def nslots(self) -> int:
        """NOTE [held batches] (_slots.py): the batches in flight plus those the user holds
        (none with ``copy``: build sets ``max_held`` to 0)."""
        return self.depth + self.max_held

    def pool_config(self) -> PoolConfig:
        return PoolConfig(self.num_workers, self.start_method, self.worker_init, self.seed)

    @classmethod
    def build(
        cls, n: int | None, *, batch_size: Any, shuffle: bool, seed: Any, drop_last: bool,
        num_workers: Any, prefetch: Any, start_method: Any, worker_init: Any, timeout: Any,
        max_held: Any, copy: bool, on_worker_death: Any, shard: Any, return_mask: bool,
        batch_plan: Any, on_stall: Any, pool: Any, ragged: Any = None, pad_value: Any = 0,
        stack: bool = True,
        pad_to_multiple: Any = None,
        share_dataset: bool = True,
        on_error: Any = "raise",
        max_skips: Any = None,
        share_rows: bool = True,
    ) -> LoaderConfig:
        """Validate a Loader's arguments (``pool``: a fastload.Pool or None; ``n``: the
        dataset's length, None for a plain iterable)."""
        c = check_options(dict(
            batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, prefetch=prefetch,
            timeout=timeout, max_held=max_held, copy=copy, on_worker_death=on_worker_death,
            return_mask=return_mask, batch_plan=batch_plan, on_stall=on_stall, stack=stack,
            share_dataset=share_dataset, on_error=on_error, max_skips=max_skips,
            share_rows=share_rows,
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
            on_error=on_error, max_skips=max_skips, share_rows=c["share_rows"],
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


def distributed_world() -> tuple[int, str] | None:
    """``(world size, where it was read)`` when this process is one of several ranks: an
    initialized ``torch.distributed`` (only if torch is already imported), else the launchers'
    environment (``_SHARD_ENV``); None for a single process."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            world = int(dist.get_world_size())
            return (world, "torch.distributed") if world > 1 else None
    except (RuntimeError, ValueError, AttributeError):
        pass
    for _, wk in _SHARD_ENV:
        value = os.environ.get(wk, "")
        if value.isdigit():
            return (int(value), f"{wk}={value}") if int(value) > 1 else None
    return None


def resolve_shard(shard: tuple[int, int] | str | None) -> tuple[int, int]:
    """``shard=`` of a Loader: None, "auto" (from the environment) or (rank, world_size)."""
    if shard is None:
        return (0, 1)
    if shard == "auto":
        for rk, wk in _SHARD_ENV:
            if rk in os.environ and wk in os.environ:
                try:
                    rank, world = int(os.environ[rk]), int(os.environ[wk])
                except ValueError:
                    raise ValueError(
                        f"shard='auto': {rk}={os.environ[rk]!r}, {wk}={os.environ[wk]!r} are not "
                        "integers"
                    ) from None
                return resolve_shard((rank, world))
        return (0, 1)
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
