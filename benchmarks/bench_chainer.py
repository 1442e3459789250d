"""fastload.compat.chainer.MultiprocessIterator against Chainer's own, on an image-like dataset.

    python benchmarks/bench_chainer.py [--n 2048] [--batch-size 64] [--workers 2] [--repeat 3]

Needs Chainer 7.8.1 (NumPy < 2; see README.md). Data: ``--n`` samples, each a uint8 (3, 96, 96)
row of a preallocated array cropped to (3, 80, 80), maybe flipped and scaled to float32 (a
typical Chainer transform, ~20 us) plus Gaussian noise (~100 us; ``--no-noise`` leaves it
out), and a Python int label; ``repeat=True``, shuffled with a seeded ``ShuffleOrderSampler``. The consumer calls
``chainer.dataset.concat_examples`` on every batch (what ``StandardUpdater`` does). Each run
builds a fresh iterator, takes ``--warmup`` batches, then times ``--batches`` batches; prints one
JSON line per (iterator, run) and a summary of medians. ``serial`` is Chainer's SerialIterator
(one process, no workers) as the baseline. ``--min-block K`` sets fastload.compat.chainer's
_MIN_BLOCK (NOTE [blocks of batches]) to measure what cutting blocks at epoch boundaries costs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (makes fastload importable from a checkout)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Chainer 7.8.1 imports numpy.distutils (deprecated)
    import chainer  # noqa: E402
    from chainer.dataset import concat_examples  # noqa: E402

import fastload  # noqa: E402
from fastload.compat import chainer as fl_chainer  # noqa: E402


class Images:
    def __init__(self, n: int, shape: tuple[int, ...], noise: bool) -> None:
        self.x = np.random.default_rng(0).integers(0, 255, (n, *shape), dtype=np.uint8)
        self.crop = shape[-1] - 16
        self.noise = noise

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        # A typical Chainer transform: random-ish crop, flip, scale to float32 in [0, 1].
        o = int(i) % 17
        img = self.x[i][:, o : o + self.crop, o : o + self.crop].astype(np.float32) / 255.0
        if i % 2:
            img = img[:, :, ::-1]
        if self.noise:  # Gaussian noise augmentation: ~100 us more per sample
            img = img + np.random.default_rng(int(i)).standard_normal(img.shape, np.float32) * 0.05
        return np.ascontiguousarray(img), int(i) % 10


def make(kind: str, ds: Images, args: argparse.Namespace) -> chainer.dataset.Iterator:
    sampler = chainer.iterators.ShuffleOrderSampler(np.random.RandomState(0))
    if kind == "serial":
        return chainer.iterators.SerialIterator(ds, args.batch_size, order_sampler=sampler)
    cls = (fl_chainer.MultiprocessIterator if kind == "fastload"
           else chainer.iterators.MultiprocessIterator)
    return cls(ds, args.batch_size, n_processes=args.workers, n_prefetch=args.prefetch,
               order_sampler=sampler)


def run(kind: str, ds: Images, args: argparse.Namespace) -> float:
    it = make(kind, ds, args)
    try:
        for _ in range(args.warmup):
            concat_examples(it.next())
        t = time.perf_counter()
        for _ in range(args.batches):
            concat_examples(it.next())
        return args.batches * args.batch_size / (time.perf_counter() - t)
    finally:
        it.finalize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--shape", default="3,96,96")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prefetch", type=int, default=1, help="n_prefetch")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--iterators", default="fastload,chainer,serial")
    ap.add_argument("--min-block", type=int, default=None)
    ap.add_argument("--noise", action=argparse.BooleanOptionalAction, default=True,
                    help="add Gaussian noise in __getitem__ (--no-noise: a light transform)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: small and short")
    args = ap.parse_args()
    if args.quick:
        args.n, args.batches, args.warmup, args.repeat = 256, 20, 2, 1
    if args.min_block is not None:
        fl_chainer._MIN_BLOCK = args.min_block
    shape = tuple(int(s) for s in args.shape.split(","))
    ds = Images(args.n, shape, args.noise)
    kinds = args.iterators.split(",")
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.repeat):  # interleaved, so drift hits every iterator alike
        for kind in kinds:
            rate = run(kind, ds, args)
            rates[kind].append(rate)
            print(json.dumps({
                "bench": "chainer", "iterator": kind, "run": r, "samples_per_s": round(rate),
                "n": args.n, "shape": shape, "batch_size": args.batch_size,
                "workers": args.workers, "n_prefetch": args.prefetch,
                "noise": args.noise, "min_block": fl_chainer._MIN_BLOCK, "cpus": os.cpu_count(),
                "python": platform.python_version(), "numpy": np.__version__,
                "chainer": chainer.__version__, "fastload": fastload.__version__,
            }), flush=True)
    print()
    base = statistics.median(rates["chainer"]) if "chainer" in rates else None
    for kind in kinds:
        med = statistics.median(rates[kind])
        vs = f"  {med / base:.2f}x Chainer's MultiprocessIterator" if base else ""
        print(f"{kind:>9}: {med:12,.0f} samples/s (median of {len(rates[kind])}){vs}")


if __name__ == "__main__":
    main()
