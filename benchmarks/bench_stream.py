#!/usr/bin/env python3
"""Sharded streams: fastload's ShardedStream and NpyShards against torch's DataLoader over an
IterableDataset (shards split by get_worker_info, the usual user code) and a single-process
loop.

    python benchmarks/bench_stream.py [--repeat 3] [--workers 2] [--shards 64] [--rows 4096]

The stream: ``--shards`` ``.npy`` files of float32 (256,) rows and an int64 label file each,
written once to a temporary folder (memory-mapped by every loader, so the page cache holds
them after the first pass: the loaders' own costs are what is measured). Batch 256, no shuffle.

* ``fastload-stream``: ``fastload.Loader`` over a ``ShardedStream`` whose ``iter_shard`` yields
  ``(row, label)`` from the memory maps, as a user would write it.
* ``fastload-npy``: ``fastload.NpyShards`` (rows gathered with one take per shard and batch).
* ``fastload-iterable``: ``fastload.Loader`` over a plain iterable (``__iter__`` only) that
  splits the shards by ``fastload.get_worker_info()``, the code a torch user brings along.
* ``compat-torch``: ``fastload.compat.torch.DataLoader`` over the same torch ``IterableDataset``
  as ``torch`` below (the drop-in, default collate to tensors).
* ``torch``: ``torch.utils.data.DataLoader(IterableDataset, batch_size, num_workers=W,
  persistent_workers=True)``, the dataset yielding the same ``(row, label)`` pairs of the shards
  ``k`` with ``k % num_workers == worker id``; default collate.
* ``single``: the same generator in the main process, batches stacked with NumPy.

Each (loader, repeat) runs in a fresh interpreter, the loaders interleaved within each repeat;
samples/s over epochs 2..E, medians over repeats, ratios measured in the same run. Writes
``benchmarks/results/stream.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (makes fastload importable from a checkout)

import fastload  # noqa: E402

LOADERS = ["fastload-stream", "fastload-npy", "fastload-iterable", "compat-torch", "torch", "single"]
BATCH = 256
DIM = 256


def write_shards(folder: str, shards: int, rows: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(0)
    xs, ys = [], []
    for k in range(shards):
        xs.append(os.path.join(folder, f"x{k:03d}.npy"))
        ys.append(os.path.join(folder, f"y{k:03d}.npy"))
        if not os.path.exists(ys[-1]):
            np.save(xs[-1], rng.random((rows, DIM), dtype=np.float32))
            np.save(ys[-1], np.arange(rows, dtype=np.int64) + k * rows)
    return xs, ys


def rows_of(x: str, y: str, start: int = 0) -> Iterator[tuple[Any, Any]]:
    """What a user's reader does: map the files, yield (row, label)."""
    xm, ym = np.load(x, mmap_mode="r"), np.load(y, mmap_mode="r")
    for i in range(start, len(xm)):
        yield xm[i], ym[i]


class UserStream(fastload.ShardedStream):
    def __init__(self, xs: list[str], ys: list[str]) -> None:
        self.xs, self.ys = xs, ys

    def shards(self) -> list[int]:
        return list(range(len(self.xs)))

    def shard_len(self, k: int) -> int:
        return int(np.load(self.xs[k], mmap_mode="r").shape[0])

    def iter_shard(self, k: int, start: int) -> Iterator[tuple[Any, Any]]:
        return rows_of(self.xs[k], self.ys[k], start)


class UserIterable:
    """A plain iterable dataset: each worker reads the shards ``k % num_workers == id``."""

    def __init__(self, xs: list[str], ys: list[str]) -> None:
        self.xs, self.ys = xs, ys

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        info = fastload.get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for k in range(wid, len(self.xs), nw):
            yield from rows_of(self.xs[k], self.ys[k])


def _torch_dataset(xs: list[str], ys: list[str]) -> Any:
    import torch

    class Shards(torch.utils.data.IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Iterator[tuple[Any, Any]]:
            info = torch.utils.data.get_worker_info()
            wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
            for k in range(wid, len(xs), nw):
                yield from rows_of(xs[k], ys[k])

    return Shards()


def run_case(loader: str, folder: str, shards: int, rows: int, workers: int,
             epochs: int) -> dict[str, Any]:
    xs, ys = write_shards(folder, shards, rows)
    n = shards * rows
    t0 = time.perf_counter()
    close: Any = lambda: None  # noqa: E731
    if loader.startswith("fastload"):
        ds = {"fastload-stream": lambda: UserStream(xs, ys),
              "fastload-npy": lambda: fastload.NpyShards(xs, ys),
              "fastload-iterable": lambda: UserIterable(xs, ys)}[loader]()
        fl = fastload.Loader(ds, BATCH, num_workers=workers)
        close = fl.close

        def epoch() -> int:
            return sum(len(y) for _, y in fl)
    elif loader in ("torch", "compat-torch"):
        import torch

        if loader == "torch":
            tl = torch.utils.data.DataLoader(_torch_dataset(xs, ys), BATCH, num_workers=workers,
                                             persistent_workers=True)
        else:
            from fastload.compat.torch import DataLoader

            tl = DataLoader(_torch_dataset(xs, ys), BATCH, num_workers=workers,
                            persistent_workers=True)
            close = tl.close

        def epoch() -> int:
            return sum(len(y) for _, y in tl)
    else:
        def epoch() -> int:
            got = 0
            for k in range(shards):
                it = rows_of(xs[k], ys[k])
                while True:
                    part = [s for _, s in zip(range(BATCH), it)]
                    if not part:
                        break
                    np.stack([p[0] for p in part])
                    np.array([p[1] for p in part])
                    got += len(part)
            return got
    rate, first = _common.time_epochs(epoch, n, epochs, t0, close)
    return {"loader": loader, "rate": rate, "first_epoch_s": first}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--rows", type=int, default=4096, help="rows per shard")
    p.add_argument("--out", default=None, help="markdown output (default "
                   "benchmarks/results/stream.md; '-': none)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(**json.loads(args.case))))
        return 0
    try:
        import torch  # noqa: F401
        loaders = LOADERS
    except ImportError:
        loaders = [x for x in LOADERS if "torch" not in x]
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="fastload-bench-stream-") as folder:
        write_shards(folder, args.shards, args.rows)
        for rep in range(args.repeat):
            for loader in loaders:
                case = dict(loader=loader, folder=folder, shards=args.shards, rows=args.rows,
                            workers=args.workers, epochs=args.epochs)
                r = _common.run_fresh(__file__, case)
                results.setdefault(loader, []).append(r["rate"])
                print(f"repeat {rep + 1}/{args.repeat} {loader:16s} {r['rate']:>12,.0f} "
                      f"samples/s", flush=True)
    med = {ld: statistics.median(v) for ld, v in results.items()}
    lines = ["| loader | samples/s (median) | runs | vs torch | vs single |",
             "| --- | ---: | --- | ---: | ---: |"]
    for ld, rate in med.items():
        vs_t = f"{rate / med['torch']:.2f}x" if "torch" in med else "-"
        runs = ", ".join(f"{x:,.0f}" for x in results[ld])
        lines.append(f"| {ld} | {rate:,.0f} | {runs} | {vs_t} | {rate / med['single']:.2f}x |")
    table = "\n".join(lines)
    print("\n" + table)
    out = args.out or os.path.join(_common.RESULTS_DIR, "stream.md")
    if out != "-":
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = "python benchmarks/bench_stream.py " + " ".join(argv if argv is not None
                                                              else sys.argv[1:])
        with open(out, "w", encoding="utf-8") as f:
            f.write(f"# Sharded streams\n\n`{cmd.strip()}`: {args.shards} shards x {args.rows} "
                    f"rows of float32 ({DIM},) + int64 labels, batch {BATCH}, {args.workers} "
                    f"workers, {args.epochs} epochs per run (rate: epochs 2..), medians of "
                    f"{args.repeat} fresh-process runs, loaders interleaved.\n\n{table}\n\n"
                    f"Machine: {json.dumps(_common.machine_info())}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
