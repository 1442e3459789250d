#!/usr/bin/env python3
"""Ragged samples: fastload's ragged modes against torch's DataLoader with the collate_fn a user
writes for them, and against a single-process loop doing the same work.

    python benchmarks/bench_ragged.py [--workload tokens|boxes|all] [--repeat 3] [--workers 2]

Workloads (the samples are views of arrays built once, as a tokenized corpus in memory is, so
that a sample costs nothing to produce and the loaders' own costs are what is measured;
``--copy-samples`` makes each sample a fresh copy instead, as ``_harness.ImageDataset`` does for
"a decoded image without a decoder"):

* ``tokens``: int32 sequences, lengths log-uniform in 16..1024, and an int64 label; batch 64.
  fastload ``ragged={"tokens": "pad"}`` and ``"packed"``; torch ``num_workers=W`` with a
  ``pad_sequence`` collate_fn; a single-process loop padding with NumPy.
* ``boxes``: a uint8 (3, 128, 128) image and float32 (k, 4) boxes, k in 0..50; batch 32.
  fastload ``ragged={"boxes": "list"}``; torch with a collate_fn that stacks the images and
  keeps the boxes a list; the single-process loop likewise.

Each (workload, loader, repeat) runs in a fresh interpreter, the loaders interleaved within each
repeat; samples/s over epochs 2..E (the steady state), medians over repeats, and ratios of
fastload to torch and to the single-process loop measured in the same run. Writes
``benchmarks/results/ragged.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (makes fastload importable from a checkout)

LOADERS = {
    "tokens": ["fastload-pad", "fastload-packed", "torch", "single"],
    "boxes": ["fastload-list", "torch", "single"],
}
BATCH = {"tokens": 64, "boxes": 32}


class Tokens:
    def __init__(self, n: int, seed: int = 0, copy: bool = False) -> None:
        self.copy = copy
        rng = np.random.default_rng(seed)
        lengths = np.exp(rng.uniform(np.log(16), np.log(1024), n)).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.flat = rng.integers(0, 50_000, int(self.offsets[-1]), dtype=np.int32)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> dict[str, Any]:
        tokens = self.flat[self.offsets[i]:self.offsets[i + 1]]
        return {"tokens": tokens.copy() if self.copy else tokens, "label": i}


class Boxes:
    def __init__(self, n: int, seed: int = 0, copy: bool = False) -> None:
        self.copy = copy
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, (64, 3, 128, 128), dtype=np.uint8)  # reused rows
        counts = rng.integers(0, 51, n)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self.flat = rng.random((int(self.offsets[-1]), 4)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        image, boxes = self.images[i % 64], self.flat[self.offsets[i]:self.offsets[i + 1]]
        return (image.copy(), boxes.copy()) if self.copy else (image, boxes)


def _pad(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(s) for s in seqs], np.int64)
    out = np.zeros((len(seqs), int(lengths.max())), seqs[0].dtype)
    for r, s in enumerate(seqs):
        out[r, :len(s)] = s
    return out, lengths


def torch_tokens_collate(samples: list[dict[str, Any]]) -> Any:
    import torch
    from torch.nn.utils.rnn import pad_sequence

    seqs = [torch.from_numpy(s["tokens"]) for s in samples]
    return (pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs]),
            torch.tensor([s["label"] for s in samples]))


def torch_boxes_collate(samples: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    import torch

    return (torch.from_numpy(np.stack([s[0] for s in samples])),
            [torch.from_numpy(s[1]) for s in samples])


def _batches(workload: str, loader: str, ds: Any, bs: int, workers: int, epoch_seed: int) -> Any:
    """A function that runs one epoch and returns the samples it delivered."""
    n = len(ds)
    if loader.startswith("fastload"):
        import fastload

        mode = loader.split("-")[1]
        key = "tokens" if workload == "tokens" else "sample[1]"
        fl = fastload.Loader(ds, bs, shuffle=True, seed=epoch_seed, num_workers=workers,
                             ragged={key: mode})

        def epoch() -> int:
            got = 0
            for b in fl:
                got += len(b["label"]) if workload == "tokens" else len(b[1])
            return got
        return epoch, fl.close
    if loader == "torch":
        import torch

        collate = torch_tokens_collate if workload == "tokens" else torch_boxes_collate
        tl = torch.utils.data.DataLoader(ds, bs, shuffle=True, num_workers=workers,
                                         collate_fn=collate, persistent_workers=True,
                                         generator=torch.Generator().manual_seed(epoch_seed))

        def epoch() -> int:
            got = 0
            for b in tl:
                got += len(b[-1]) if workload == "tokens" else len(b[1])
            return got
        return epoch, lambda: None
    rng = np.random.default_rng(epoch_seed)

    def epoch() -> int:
        order = rng.permutation(n)
        got = 0
        for s in range(0, n, bs):
            samples = [ds[int(i)] for i in order[s:s + bs]]
            if workload == "tokens":
                _pad([x["tokens"] for x in samples])
                np.array([x["label"] for x in samples])
            else:
                np.stack([x[0] for x in samples])
                [x[1] for x in samples]
            got += len(samples)
        return got
    return epoch, lambda: None


def run_case(workload: str, loader: str, n: int, workers: int, epochs: int,
             copy: bool) -> dict[str, Any]:
    ds = (Tokens if workload == "tokens" else Boxes)(n, copy=copy)
    t0 = time.perf_counter()
    epoch, close = _batches(workload, loader, ds, BATCH[workload], workers, 1)
    rate, first = _common.time_epochs(epoch, n, epochs, t0, close)
    return {"workload": workload, "loader": loader, "rate": rate, "first_epoch_s": first}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=("tokens", "boxes", "all"), default="all")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--n", type=int, default=None, help="samples per epoch (tokens 20000, boxes 4000)")
    p.add_argument("--out", default=None,
                   help="markdown output (default benchmarks/results/ragged[-copy].md; '-': none)")
    p.add_argument("--copy-samples", action="store_true",
                   help="each sample a fresh copy (the cost of reading or decoding it)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        c = json.loads(args.case)
        print(json.dumps(run_case(**c)))
        return 0
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    workloads = ["tokens", "boxes"] if args.workload == "all" else [args.workload]
    results: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.repeat):
        for w in workloads:
            n = args.n or (20_000 if w == "tokens" else 4_000)
            for loader in LOADERS[w]:
                if loader == "torch" and not have_torch:
                    continue
                case = dict(workload=w, loader=loader, n=n, workers=args.workers,
                            epochs=args.epochs, copy=args.copy_samples)
                r = _common.run_fresh(__file__, case)
                results.setdefault((w, loader), []).append(r["rate"])
                print(f"repeat {rep + 1}/{args.repeat} {w:6s} {loader:16s} "
                      f"{r['rate']:>12,.0f} samples/s", flush=True)
    lines = ["| workload | loader | samples/s (median) | runs | vs torch | vs single |",
             "| --- | --- | ---: | --- | ---: | ---: |"]
    for w in workloads:
        med = {ld: statistics.median(v) for (ww, ld), v in results.items() if ww == w}
        for ld, rate in med.items():
            vs_t = f"{rate / med['torch']:.2f}x" if "torch" in med else "-"
            vs_s = f"{rate / med['single']:.2f}x"
            runs = ", ".join(f"{x:,.0f}" for x in results[(w, ld)])
            lines.append(f"| {w} | {ld} | {rate:,.0f} | {runs} | {vs_t} | {vs_s} |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.out is None:
        args.out = os.path.join(_common.RESULTS_DIR,
                                "ragged-copy.md" if args.copy_samples else "ragged.md")
    if args.out != "-":
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        cmd = "python benchmarks/bench_ragged.py " + " ".join(argv if argv is not None
                                                              else sys.argv[1:])
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(f"# Ragged samples\n\n`{cmd.strip()}`, {args.workers} workers, "
                    f"{args.epochs} epochs per run (rate: epochs 2..), medians of "
                    f"{args.repeat} fresh-process runs, loaders interleaved.\n\n{table}\n\n"
                    f"Machine: {json.dumps(_common.machine_info())}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
