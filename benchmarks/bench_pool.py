"""Time to the first batch of a new loader: on a warm fastload.Pool, against a new
torch DataLoader and a new fastload Loader with its own workers.

    python benchmarks/bench_pool.py [--workers 2] [--repeat 7]

A fourth case is torch code on the warm pool: a new ``fastload.compat.torch.DataLoader(...,
pool=pool)`` over the same images as tensors.

The situation: a training script creates a validation loader every epoch (or many small
loaders). Each case creates a loader over the same small image-like dataset (uint8 64x64x3 +
label, batch 32) and times construction + ``next(iter(loader))``, then closes it. The warm pool
is created once, outside the timing (its start is what the other cases pay each time). All cases
use the same start method (fork, each library's default on Linux). Prints the median and the
ratio to the torch case; medians over --repeat rounds, the cases interleaved within each round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (makes fastload importable from a checkout)

import fastload  # noqa: E402


class Images:
    def __init__(self, n: int = 512) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((64, 64, 3), i % 251, np.uint8), i % 10


def first_batch_fastload(pool: fastload.Pool | None, workers: int) -> float:
    t = time.perf_counter()
    if pool is None:
        loader = fastload.Loader(Images(), 32, num_workers=workers, start_method="fork")
    else:
        loader = fastload.Loader(Images(), 32, pool=pool)
    x, y = next(iter(loader))
    dt = time.perf_counter() - t
    assert x.shape == (32, 64, 64, 3)
    loader.close()
    return dt


def first_batch_torch(workers: int) -> float:
    import torch.utils.data as tud

    t = time.perf_counter()
    loader = tud.DataLoader(Images(), 32, num_workers=workers, multiprocessing_context="fork")
    it = iter(loader)
    x, y = next(it)
    dt = time.perf_counter() - t
    assert tuple(x.shape) == (32, 64, 64, 3)
    del it, loader  # torch ends its workers when the iterator is collected
    return dt


class TorchImages:
    """Images as a torch-style dataset (tensors), for the drop-in's case."""

    def __init__(self, n: int = 512) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        import torch

        return torch.full((64, 64, 3), i % 251, dtype=torch.uint8), i % 10


def first_batch_compat(pool: fastload.Pool) -> float:
    """A new fastload.compat.torch.DataLoader (torch's code, one argument added) on the pool."""
    from fastload.compat.torch import DataLoader

    t = time.perf_counter()
    loader = DataLoader(TorchImages(), 32, pool=pool)
    x, y = next(iter(loader))
    dt = time.perf_counter() - t
    assert tuple(x.shape) == (32, 64, 64, 3)
    loader.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    times: dict[str, list[float]] = {
        "warm pool": [],
        "warm pool, a train loader attached": [],
        "drop-in DataLoader(pool=) on the warm pool": [],
        "new Loader": [],
        "torch DataLoader": [],
    }
    with fastload.Pool(args.workers, start_method="fork") as pool:
        first_batch_fastload(pool, args.workers)  # warm-up: imports, first layout
        if have_torch:
            first_batch_compat(pool)
        for _ in range(args.repeat):
            times["warm pool"].append(first_batch_fastload(pool, args.workers))
            # The train/validation case: another loader on the pool is mid-epoch and idle, so
            # the workers sleep on the pool's bell rather than on their pipes.
            train = fastload.Loader(Images(), 32, pool=pool)
            it = iter(train)
            next(it)
            times["warm pool, a train loader attached"].append(first_batch_fastload(pool, args.workers))
            del it
            train.close()
            if have_torch:
                times["drop-in DataLoader(pool=) on the warm pool"].append(first_batch_compat(pool))
            times["new Loader"].append(first_batch_fastload(None, args.workers))
            if have_torch:
                times["torch DataLoader"].append(first_batch_torch(args.workers))
    ref = statistics.median(times["torch DataLoader"]) if have_torch else None
    print(f"first batch of a new loader, {args.workers} workers, median of {args.repeat}")
    print("| case | median ms | min ms | torch / case |")
    print("|---|--:|--:|--:|")
    for name, ts in times.items():
        if not ts:
            print(f"| {name} | (torch not installed) | | |")
            continue
        med = statistics.median(ts)
        ratio = f"{ref / med:.1f}x" if ref else "-"
        print(f"| {name} | {med * 1e3:.2f} | {min(ts) * 1e3:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
