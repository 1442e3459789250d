"""What seeding the global RNGs per sample costs (NOTE [global RNGs] in fastload/_rngs.py).

    python benchmarks/bench_global_rng.py [--workers 2] [--repeat 3] [--n 20000]

Two datasets whose ``__getitem__`` draws from ``random`` and ``np.random`` (torch-habit
augmentation), each loaded with ``seed_globals=False`` (each worker's RNGs seeded once) and with
the default (the first sample draws, so every sample is seeded): ``tiny`` (a float32 (16,)
sample plus two draws: the worst case, a sample that costs a few microseconds) and ``image`` (a
uint8 224x224x3 sample with a random flip and crop offset: a sample that costs what an augmented
image costs). Prints samples/s per case (median of --repeat epochs, the cases interleaved within
each round, after one warm-up epoch each) and the ratio seeded / not seeded.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (makes fastload importable from a checkout)

import fastload  # noqa: E402


class Tiny:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        x = np.full(16, i, np.float32)
        x[0] += random.random()
        x[1] += np.random.rand()
        return x


class Image:
    def __init__(self, n: int) -> None:
        self.n = n
        self.base = np.arange(240 * 240 * 3, dtype=np.uint32).astype(np.uint8).reshape(240, 240, 3)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        y, x = np.random.randint(0, 16, size=2)
        crop = self.base[y:y + 224, x:x + 224]
        return crop[:, ::-1] if random.random() < 0.5 else crop


def _epoch_rate(loader: fastload.Loader, n: int) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--n", type=int, default=20000, help="samples of the tiny dataset "
                    "(the image dataset has n / 10)")
    args = ap.parse_args()
    for what in ("workers", "repeat", "n"):
        if getattr(args, what) < 1:
            ap.error(f"--{what} must be >= 1")
    cases = {}
    for name, ds, bs in (("tiny", Tiny(args.n), 256), ("image", Image(args.n // 10), 64)):
        for mode in (False, None):
            loader = fastload.Loader(ds, bs, num_workers=args.workers, seed_globals=mode)
            _epoch_rate(loader, len(ds))  # warm-up: workers started, layout known
            assert loader.stats()["seeded_globals"] is (mode is None)
            cases[(name, mode)] = (loader, len(ds), [])
    for _ in range(args.repeat):
        for loader, n, rates in cases.values():
            rates.append(_epoch_rate(loader, n))
    print(f"| workload | seed_globals=False | seeded (default) | ratio |   ({args.workers} "
          f"workers, medians of {args.repeat})")
    print("| --- | --: | --: | --: |")
    for name in ("tiny", "image"):
        off = statistics.median(cases[(name, False)][2])
        on = statistics.median(cases[(name, None)][2])
        print(f"| {name} | {off:,.0f} /s | {on:,.0f} /s | {on / off:.2f}x |")
    for loader, _, _ in cases.values():
        loader.close()


if __name__ == "__main__":
    main()
