#!/usr/bin/env python3
"""Python calls the main process makes per steady-state batch (cProfile, builtins included),
and the batches/s of the same loop without the profiler (issue 30: under 40 calls a batch).

    python benchmarks/bench_calls.py                 # tiny-like samples, 2 workers
    python benchmarks/bench_calls.py --top 30        # and the 30 most frequent calls

The count is deterministic (it does not depend on the machine's load); the rate is not: compare
rates only side by side in one run (e.g. this script from two git worktrees, alternately).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import numpy as np

import fastload


class Tiny:
    """A float32 and an int64 scalar per sample, as the harness's tiny workload."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.float32, np.int64]:
        return np.float32(i), np.int64(i)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=200, help="batches per epoch (200)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5, help="timed epochs, after a warm-up (5)")
    p.add_argument("--top", type=int, default=0, help="list the N most frequent calls")
    a = p.parse_args()
    if min(a.batches, a.batch_size, a.workers, a.epochs) < 1:
        p.error("--batches, --batch-size, --workers and --epochs must be >= 1")
    ds = Tiny(a.batches * a.batch_size)
    with fastload.Loader(ds, a.batch_size, num_workers=a.workers, shuffle=True, seed=0) as ld:
        for _ in ld:  # warm-up epoch: workers started, layout known, slots mapped
            pass
        prof, n = cProfile.Profile(), 0
        prof.enable()
        for _ in ld:
            n += 1
        prof.disable()
        rates = []
        for _ in range(a.epochs):
            t0 = time.perf_counter()
            for _ in ld:
                pass
            rates.append(a.batches * a.batch_size / (time.perf_counter() - t0))
    stats = pstats.Stats(prof)
    calls = sum(v[1] for v in stats.stats.values()) / n  # type: ignore[attr-defined]
    print(f"fastload {fastload.__version__}: {calls:.1f} Python calls per batch in the main "
          f"process (cProfile, {n} batches of {a.batch_size}, {a.workers} workers); "
          f"{statistics.median(rates):,.0f} samples/s (median of {a.epochs} epochs, "
          f"spread {min(rates):,.0f}..{max(rates):,.0f})")
    if a.top:
        rows = sorted(((v[1] / n, f"{k[0].split('/')[-1]}:{k[1]}({k[2]})")
                       for k, v in stats.stats.items()), reverse=True)  # type: ignore[attr-defined]
        for c, name in rows[: a.top]:
            print(f"  {c:6.2f}  {name}")


if __name__ == "__main__":
    main()
