"""fastload.ArrayDataset (rows gathered in C) against a single-process loop over the same rows.

    python benchmarks/bench_arrays.py [--rows 200000] [--width 16] [--repeat 3]

Data: a float32 np.memmap of ``rows x width`` (created in a temporary directory, page cache warm)
plus int64 labels, batch 256, shuffled. The single-process loop is ``__getitem__`` of a memmap
row and its label, then ``np.stack`` per leaf (bench_loader's ``single``: Python int indices,
``_harness.np_collate``). Prints samples/s (epochs 2-3, median of
--repeat runs) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (makes fastload importable from a checkout)

import fastload  # noqa: E402
from _harness import np_collate  # noqa: E402


class Rows:
    def __init__(self, mm: np.ndarray, labels: np.ndarray) -> None:
        self.mm, self.labels = mm, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        return self.mm[i], self.labels[i]


def single(ds: Rows, bs: int, order: np.ndarray) -> float:
    t = time.perf_counter()
    touched = 0.0
    for k in range(0, len(order), bs):
        x, _ = np_collate([ds[i] for i in order[k : k + bs].tolist()])
        touched += float(x[0, 0])
    return len(order) / (time.perf_counter() - t)


def fastload_rate(mm: np.ndarray, labels: np.ndarray, bs: int, workers: int) -> float:
    n = len(labels)
    rate = 0.0
    with fastload.Loader(fastload.ArrayDataset(mm, labels), bs, shuffle=True, seed=0,
                         num_workers=workers) as loader:
        for epoch in range(3):
            t = time.perf_counter()
            touched = 0.0
            for x, _ in loader:
                touched += float(x[0, 0])
            if epoch:
                rate = n / (time.perf_counter() - t)  # the last of epochs 2-3
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastload-bench-") as tmp:
        path = os.path.join(tmp, "rows.f32")
        mm = np.memmap(path, np.float32, "w+", shape=(args.rows, args.width))
        mm[:] = 1.0
        mm.flush()
        del mm
        mm = np.memmap(path, np.float32, "r", shape=(args.rows, args.width))
        labels = np.arange(args.rows)
        order = np.random.default_rng(0).permutation(args.rows)
        res: dict[str, list[float]] = {"single": [], "fastload": []}
        for _ in range(args.repeat):
            res["single"].append(single(Rows(mm, labels), args.batch_size, order))
            res["fastload"].append(fastload_rate(mm, labels, args.batch_size, args.workers))
        med = {k: statistics.median(v) for k, v in res.items()}
    print(f"single-process loop: {med['single']:,.0f} samples/s")
    print(f"fastload ArrayDataset ({args.workers} workers): {med['fastload']:,.0f} samples/s")
    print(f"ratio: {med['fastload'] / med['single']:.1f}x")


if __name__ == "__main__":
    main()
