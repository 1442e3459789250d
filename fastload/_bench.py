"""``python -m fastload bench``: fastload against a single-process loop on a built-in dataset.

From a source checkout this runs the benchmark harness of ``benchmarks/`` (fresh processes per
case, torch when installed, PSS, charts: ``benchmarks/_harness.py``). An installed fastload has
no ``benchmarks/`` directory: it runs the small benchmark below, which needs NumPy alone. Both
measure the steady state (epochs 2..) and the baseline the same way in every environment: the
same dataset, the same shuffled order, and ``np.stack`` of each leaf of the samples of a batch.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ._cli import non_negative_int, positive_int

__all__ = ["main"]


class _Images:
    """uint8 (224, 224, 3) images, copied from a pool of 16, with an int64 label."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool: np.ndarray[Any, Any] | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], np.int64]:
        if self.pool is None:  # built lazily: in each worker, not pickled to it
            self.pool = np.random.default_rng(0).integers(0, 255, (16, 224, 224, 3), np.uint8)
        return self.pool[i % 16].copy(), np.int64(i)


class _Tiny:
    """float32 (16,) rows with an int64 label: per-sample overhead dominates."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.rows: np.ndarray[Any, Any] | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], np.int64]:
        if self.rows is None:
            self.rows = np.random.default_rng(0).random((self.n, 16), np.float32)
        return self.rows[i], np.int64(i)


#: name: (dataset class, batch size, samples per epoch, samples per epoch with --quick)
class Compute:
    """float32 (1024,) after ~0.5 ms of NumPy arithmetic (no BLAS): a CPU-bound sample (the
    doctor's ``fastload:compute``)."""

    def __init__(self, n: int = 2048, rows: int = 96) -> None:
        self.n, self.rows = n, rows
        self.block: np.ndarray[Any, Any] | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray[Any, Any]:
        if self.block is None:
            self.block = np.random.default_rng(0).standard_normal((self.rows, 1024),
                                                                  dtype=np.float32)
        x = np.sin(self.block + np.float32(i))
        np.cumsum(x, axis=0, out=x)
        x.sort(axis=1)
        out: np.ndarray[Any, Any] = x[-1] * np.float32(1 / math.sqrt(self.rows))
        return out


#: The doctor's built-in datasets (``python -m fastload doctor fastload:image``).
DOCTOR_DATASETS: dict[str, Callable[[], Any]] = {
    "fastload:image": lambda: _Images(2048), "fastload:tiny": lambda: _Tiny(50_000),
    "fastload:compute": Compute}

WORKLOADS = {"image": (_Images, 128, 4096, 1024), "tiny": (_Tiny, 256, 200_000, 20_000)}


def _stack(samples: list[Any]) -> Any:
    """The single-process baseline's collate: np.stack of each leaf (tuples of arrays)."""
    return tuple(np.stack([s[k] for s in samples]) for k in range(len(samples[0])))


def _single(ds: Any, bs: int, epochs: int) -> tuple[list[float], float]:
    """Seconds per epoch and seconds to the first batch of a plain loop in this process."""
    n, times, t0 = len(ds), [], time.perf_counter()
    first = 0.0
    for e in range(epochs):
        start = time.perf_counter()
        order = np.random.default_rng([0, e]).permutation(n).tolist()
        for b in range(0, n, bs):
            _stack([ds[i] for i in order[b : b + bs]])
            if not first:
                first = time.perf_counter() - t0
        times.append(time.perf_counter() - start)
    return times, first


def _fastload(ds: Any, bs: int, epochs: int, workers: int) -> tuple[list[float], float]:
    from .loader import Loader

    times, t0 = [], time.perf_counter()
    first = 0.0
    with Loader(ds, bs, shuffle=True, seed=0, num_workers=workers) as loader:
        for _ in range(epochs):
            start = time.perf_counter()
            for _batch in loader:
                if not first:
                    first = time.perf_counter() - t0
            times.append(time.perf_counter() - start)
    return times, first


def _builtin(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fastload bench",
        description="fastload against a single-process loop (the same dataset, order and "
        "np.stack collate) on a built-in synthetic dataset; steady state = epochs 2..",
    )
    p.add_argument("--workload", choices=list(WORKLOADS), default="image")
    p.add_argument("--workers", type=non_negative_int, default=2,
                   help="worker processes (default 2)")
    p.add_argument("--quick", action="store_true", help="a smaller dataset (a few seconds)")
    p.add_argument("--epochs", type=positive_int, default=3, help="epochs per run (default 3)")
    p.add_argument("--repeat", type=positive_int, default=None,
                   help="runs, interleaved (3; 1 --quick)")
    p.add_argument("--builtin", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be >= 2 (epoch 1 is the warm-up)")
    cls, bs, n_full, n_quick = WORKLOADS[args.workload]
    n = n_quick if args.quick else n_full
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    from ._version import __version__

    print(f"fastload {__version__} bench (built-in): workload={args.workload} n={n} "
          f"batch_size={bs}\n  workers={args.workers} epochs={args.epochs} repeat={repeat}; "
          f"{os.cpu_count()} CPUs, numpy {np.__version__}", flush=True)
    rates: dict[str, list[float]] = {"fastload": [], "single": []}
    firsts: dict[str, list[float]] = {"fastload": [], "single": []}
    for r in range(repeat):
        for name in (("fastload", "single") if r % 2 == 0 else ("single", "fastload")):
            ds = cls(n)
            times, first = (_fastload(ds, bs, args.epochs, args.workers) if name == "fastload"
                            else _single(ds, bs, args.epochs))
            rates[name].append(n * (len(times) - 1) / sum(times[1:]))
            firsts[name].append(first)
            print(f"  run {r + 1}/{repeat} {name}: {rates[name][-1]:,.0f} samples/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    label = {"fastload": f"fastload ({args.workers} workers)", "single": "single-process loop"}
    print(f"\n{'loader':<22} {'samples/s':>12} {'first batch':>12} {'vs single':>10}")
    for name in ("fastload", "single"):
        first_ms = statistics.median(firsts[name]) * 1e3
        print(f"{label[name]:<22} {med[name]:>12,.0f} {first_ms:>9.0f} ms "
              f"{med[name] / med['single']:>9.2f}x")
    print("\nsamples/s: median over runs of the steady state (epochs 2..)\n"
          "first batch: from constructing the loader to the first batch in hand\n"
          "vs single: samples/s over the single-process loop's (same dataset, order, np.stack)")
    if (os.cpu_count() or 1) <= args.workers:
        print(f"note: {os.cpu_count()} CPUs for {args.workers} workers plus the main process: "
              "workers compete with the consumer.")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    harness = Path(__file__).resolve().parent.parent / "benchmarks" / "_harness.py"
    if "--builtin" in argv or not harness.is_file():
        return _builtin(argv)
    sys.path.insert(0, str(harness.parent))
    import _harness  # type: ignore[import-not-found]

    return int(_harness.main(argv) or 0)
