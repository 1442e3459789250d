#!/usr/bin/env python3
"""Streams read once: what building a ``fastload.Loader`` over a ShardedStream costs when its
shard lengths are counted, remembered, or given (NOTE [shard lengths] in
fastload/_shard_lengths.py), and what NpyShards' up-front file check costs.

    python benchmarks/bench_stream_count.py [--repeat 3] [--workers 2] [--shards 64]
                                            [--rows 20000] [--quick]

The stream: ``--shards`` text files of ``--rows`` integers, one per line, read by a
ShardedStream without ``shard_len`` (``iter_shard`` parses the lines, as user code would), the
page cache warm. Each case builds one Loader (batch 256, ``--workers`` workers) in a fresh
interpreter and times the constructor (workers started, nothing iterated):

* ``count``: the first build, nothing remembered: every shard read whole in the workers (what
  every build cost before the lengths were remembered).
* ``index``: a new process after ``count``: the lengths from the index in the cache folder.
* ``memory``: a second Loader over the same stream object in the process that counted.
* ``shard_len``: the same stream with ``shard_len`` (a list of lengths): nothing to count.

Each build also reports its ``iter_shard`` calls during the constructor, in every process:
``shard_len``'s are the first batches its workers start loading at once; more than that is
counting.

``npy``: ``NpyShards(paths)`` over ``--shards`` ``.npy`` files, which checks every file's dtype and
row shape from its header, against memory-mapping every file with ``np.load`` (what it did
before, without the check). In process, medians of ``--repeat`` after one warm-up.

Medians of ``--repeat`` runs, the cases interleaved within each. Writes
``benchmarks/results/stream-count.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

CASES = ["count", "index", "memory", "shard_len"]
BATCH = 256


class Lines(fastload.ShardedStream):
    """One text file per shard, one integer per line; no shard_len. ``log``: a folder where
    every iter_shard call appends a line to a file of its process."""

    def __init__(self, files: list[str], log: str | None = None) -> None:
        self.files = files
        self.log = log

    def shards(self) -> list[str]:
        return self.files

    def iter_shard(self, shard: str, start: int) -> Iterator[Any]:
        if self.log is not None:
            with open(os.path.join(self.log, f"{os.getpid()}.log"), "a") as f:
                f.write(f"{shard} {start}\n")
        with open(shard) as f:
            for i, line in enumerate(f):
                if i >= start:
                    yield np.int64(int(line))


class SizedLines(Lines):
    def __init__(self, files: list[str], lengths: list[int], log: str | None = None) -> None:
        super().__init__(files, log)
        self.lengths = dict(zip(files, lengths))

    def shard_len(self, shard: str) -> int:
        return self.lengths[shard]


def write_shards(folder: str, shards: int, rows: int) -> list[str]:
    files = []
    for k in range(shards):
        files.append(os.path.join(folder, f"{k:04d}.txt"))
        with open(files[-1], "w") as f:
            f.write("".join(f"{k * rows + i}\n" for i in range(rows)))
    return files


def time_build(stream: Any, workers: int) -> float:
    t = time.perf_counter()
    ld = fastload.Loader(stream, BATCH, num_workers=workers)
    took = time.perf_counter() - t
    ld.close()
    return took


def reads(log: str) -> int:
    """The iter_shard calls logged in ``log`` so far, in every process."""
    n = 0
    for name in os.listdir(log):
        with open(os.path.join(log, name)) as f:
            n += sum(1 for line in f if line.strip())
    return n


def run_case(case: str, folder: str, shards: int, rows: int, workers: int,
             cache: str) -> dict[str, Any]:
    """One build in this (fresh) process; ``cache``: the FASTLOAD_CACHE_DIR to use."""
    os.environ["FASTLOAD_CACHE_DIR"] = cache
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".txt"))
    log = tempfile.mkdtemp(prefix="fastload-bench-reads-")
    try:
        if case == "shard_len":
            s = time_build(SizedLines(files, [rows] * len(files), log), workers)
            return {"s": s, "reads": reads(log)}
        stream = Lines(files, log)
        before = 0
        if case == "memory":
            time_build(stream, workers)  # counts (nothing in the index: ``cache`` is fresh)
            before = reads(log)
        s = time_build(stream, workers)
        return {"s": s, "reads": reads(log) - before}
    finally:
        shutil.rmtree(log, ignore_errors=True)


def time_npy(shards: int, repeat: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="fastload-bench-npy-") as d:
        paths = []
        for k in range(shards):
            paths.append(os.path.join(d, f"{k:04d}.npy"))
            np.save(paths[-1], np.zeros((1024, 64), np.float32))
        fns = {"NpyShards(paths)": lambda: fastload.NpyShards(paths),
               "np.load(mmap_mode='r') each": lambda: [np.load(p, mmap_mode="r") for p in paths]}
        out: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():
            fn()  # warm-up
        for _ in range(repeat):
            for name, fn in fns.items():
                t = time.perf_counter()
                fn()
                out[name].append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards", type=int, default=64)
    p.add_argument("--rows", type=int, default=20000, help="lines per shard")
    p.add_argument("--quick", action="store_true", help="8 shards x 1000 lines, 1 repeat")
    p.add_argument("--out", default=None, help="markdown output (default "
                   "benchmarks/results/stream-count.md; '-': none)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(**json.loads(args.case))))
        return 0
    if args.quick:
        args.shards, args.rows, args.repeat = 8, 1000, 1
    results: dict[str, list[float]] = {c: [] for c in CASES}
    read: dict[str, list[int]] = {c: [] for c in CASES}
    with tempfile.TemporaryDirectory(prefix="fastload-bench-count-") as root:
        folder = os.path.join(root, "shards")
        os.mkdir(folder)
        write_shards(folder, args.shards, args.rows)
        for rep in range(args.repeat):
            cache = os.path.join(root, f"cache-{rep}")  # nothing remembered at the start
            for case in CASES:  # "count" fills the index "index" reads
                fresh = os.path.join(root, f"cache-{rep}-{case}")
                r = _common.run_fresh(__file__, dict(
                    case=case, folder=folder, shards=args.shards, rows=args.rows,
                    workers=args.workers, cache=cache if case in ("count", "index") else fresh))
                results[case].append(r["s"])
                read[case].append(r["reads"])
                print(f"repeat {rep + 1}/{args.repeat} {case:10s} {r['s'] * 1e3:10.1f} ms "
                      f"{r['reads']:5d} shards read", flush=True)
            shutil.rmtree(cache, ignore_errors=True)
    npy = time_npy(args.shards, max(args.repeat, 3))
    med = {c: statistics.median(v) for c, v in results.items()}
    lines = ["| build | ms (median) | runs (ms) | vs count | shards read |",
             "| --- | ---: | --- | ---: | ---: |"]
    for c in CASES:
        runs = ", ".join(f"{x * 1e3:.1f}" for x in results[c])
        got = ", ".join(sorted({str(n) for n in read[c]}))
        lines.append(f"| {c} | {med[c] * 1e3:.1f} | {runs} | {med[c] / med['count']:.3f}x "
                     f"| {got} |")
    lines += ["", f"| NpyShards check, {args.shards} files | ms (median) | runs (ms) |",
              "| --- | ---: | --- |"]
    for name, v in npy.items():
        runs = ", ".join(f"{x * 1e3:.2f}" for x in v)
        lines.append(f"| {name} | {statistics.median(v) * 1e3:.2f} | {runs} |")
    table = "\n".join(lines)
    print("\n" + table)
    out = args.out or os.path.join(_common.RESULTS_DIR, "stream-count.md")
    if out != "-":
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = "python benchmarks/bench_stream_count.py " + " ".join(
            argv if argv is not None else sys.argv[1:])
        with open(out, "w", encoding="utf-8") as f:
            f.write(f"# Streams read once: building a Loader over uncounted shards\n\n"
                    f"`{cmd.strip()}`: {args.shards} text shards x {args.rows} lines, a "
                    f"ShardedStream without shard_len, batch {BATCH}, {args.workers} workers; "
                    f"Loader construction time (workers started, nothing iterated), each run a "
                    f"fresh interpreter, medians of {args.repeat}, cases interleaved. count: "
                    f"nothing remembered (every build before lengths were remembered); index: "
                    f"a new process reading the lengths from the cache folder; memory: a second "
                    f"Loader in the process that counted; shard_len: lengths given. Shards read: "
                    f"iter_shard calls during the build, all processes (every run's, when they "
                    f"differ): shard_len's are the first batches the workers start loading at "
                    f"once, more is counting.\n\n"
                    f"{table}\n\nMachine: {json.dumps(_common.machine_info())}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
