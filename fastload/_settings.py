"""Settings a Pool and a Loader share, validated: seeds and the worker arguments (a leaf module:
the plan, the pool and the loader's config import it, and it imports none of them)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SEED_LIMIT", "WORKER_METHODS", "check_seed", "check_worker_args", "thread_or",
           "PoolConfig"]

#: Seeds travel in each slot's task header as an int64 (NOTE [slot payload layout]).
SEED_LIMIT = 2**63


def check_seed(seed: Any, what: str) -> int:
    """A seed as an int in [0, 2**63), or a ValueError starting with ``what``."""
    if (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
            or not 0 <= seed < SEED_LIMIT):
        raise ValueError(
            f"{what} an int in [0, 2**63), got {seed!r} (reduce a larger one, e.g. "
            "secrets.randbits(64) or SeedSequence().entropy, with % 2**63)"
        )
    return int(seed)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class PoolConfig:
    """What the worker processes are: shared by a Loader's own workers and a fastload.Pool."""

    num_workers: int
    start_method: str | None
    worker_init: Callable[[int], Any] | None
    seed: int
    #: "thread" (``start_method`` says "thread" too) or "process_threads": threads of one host
    #: process (NOTE [hosted threads] in _host.py), started with ``start_method``
    worker_method: str = "process"

    @classmethod
    def build(
        cls, num_workers: int | None, start_method: str | None, worker_init: Any, seed: Any,
        worker_method: Any = "process",
    ) -> PoolConfig:
        """A fastload.Pool's settings (num_workers None: os.cpu_count())."""
        if num_workers is None:
            num_workers = os.cpu_count() or 1
        seed = check_worker_args(num_workers, start_method, worker_init, seed, min_workers=1)
        return cls(num_workers, thread_or(start_method, worker_method), worker_init, seed,
                   worker_method)


#: What workers can be: processes, threads of this process (NOTE [thread workers] in
#: _threads.py), threads of one host process (NOTE [hosted threads] in _host.py).
WORKER_METHODS = ("process", "thread", "process_threads")


def thread_or(start_method: str | None, worker_method: Any) -> str | None:
    """The start method a pool runs: ``"thread"`` for thread workers (NOTE [thread workers] in
    _threads.py), else the process start method as given (for worker processes, or for the
    host process of ``"process_threads"``)."""
    if worker_method not in WORKER_METHODS:
        raise ValueError("worker_method must be 'process', 'thread' or 'process_threads', got "
                         f"{worker_method!r}")
    if worker_method != "thread":
        return start_method
    if start_method is not None:
        raise ValueError(
            f"start_method={start_method!r} applies to worker processes; worker_method='thread' "
            "runs the workers as threads of this process: leave start_method unset")
    return "thread"


def check_worker_args(
    num_workers: int | None, start_method: str | None, worker_init: Any, seed: Any,
    *, min_workers: int,
) -> int:
    """Validate what a Loader and a Pool both take (num_workers None: not checked); returns
    the seed, drawn at random when None."""
    from . import _ring

    if num_workers is not None:
        if not _is_int(num_workers) or num_workers < min_workers:
            raise ValueError(f"num_workers must be an int >= {min_workers}, got {num_workers!r}")
        if num_workers > _ring.MAX_WORKERS:
            raise ValueError(f"num_workers must be <= {_ring.MAX_WORKERS}, got {num_workers}")
    if start_method not in (None, "fork", "forkserver", "spawn"):
        raise ValueError(
            f"start_method must be None, 'fork', 'forkserver' or 'spawn', got {start_method!r}"
        )
    if worker_init is not None and not callable(worker_init):
        raise TypeError(f"worker_init must be callable, got {type(worker_init).__name__}")
    if seed is None:
        return int(np.random.SeedSequence().entropy % SEED_LIMIT)  # type: ignore[operator]
    return check_seed(seed, "seed must be None or")
