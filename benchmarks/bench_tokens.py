#!/usr/bin/env python3
"""Token-budget batches: fastload.TokenBudget against fixed-size batches of the same mean size,
and against torch's DataLoader with a length-bucketing batch sampler and ``pad_sequence``.

    python benchmarks/bench_tokens.py [--repeat 3] [--workers 2] [--quick]

Data: 20,000 int32 token sequences, lengths lognormal (mean about 300, clipped to 1..2048),
views of one array built once (a tokenized corpus in memory), so that the loaders' own costs
(and the padding they write) are what is measured. Every loader pads (``ragged="pad"`` /
``pad_sequence``) and shuffles each epoch.

* ``fastload-tokens``: ``TokenBudget(lengths, max_tokens=16384, shuffle=True)``, batch_size
  (the row cap) 256: each batch at most 16,384 tokens padded.
* ``fastload-sorted``: the same with ``sort=True`` (fairseq's batches: each bucket sorted by
  length, only the batch order reshuffled each epoch).
* ``fastload-fixed``: ``Loader(batch_size=B, shuffle=True)``, B the mean rows of the token
  batches: what a loader without token budgets gives for the same number of steps.
* ``torch-bucket``: ``DataLoader(batch_sampler=...)`` with the sampler a user writes (shuffle,
  sort each window of 100 batches by length, cut batches of B rows, shuffle the batches; as
  torchtext's BucketIterator and Hugging Face's ``group_by_length`` do), ``pad_sequence`` collate.
* ``torch-tokens``: ``DataLoader(batch_sampler=...)`` given TokenBudget's batches: the same
  batches as fastload-tokens, so only the loader differs.

Reported per loader: padding waste (padded tokens / real tokens), the largest padded batch in
tokens (what a model's activations must fit), and real tokens/s over epochs 2..E (medians of
fresh-process runs, the loaders interleaved). Writes ``benchmarks/results/tokens.md``.
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

LOADERS = ["fastload-tokens", "fastload-sorted", "fastload-fixed", "torch-bucket", "torch-tokens"]
MAX_TOKENS = 16_384
ROW_CAP = 256
WINDOW = 100  # torch-bucket: batches per sorted window


def lengths_of(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sigma = 0.8
    raw = rng.lognormal(np.log(300) - sigma**2 / 2, sigma, n)
    return np.clip(raw.astype(np.int64), 1, 2048)


class Texts:
    def __init__(self, lengths: np.ndarray, seed: int = 0) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.flat = np.random.default_rng(seed).integers(0, 50_000, int(self.offsets[-1]),
                                                         dtype=np.int32)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"tokens": self.flat[self.offsets[i]:self.offsets[i + 1]]}


def token_plan(lengths: np.ndarray, seed: int, sort: bool = False) -> Any:
    import fastload

    return fastload.TokenBudget(lengths, MAX_TOKENS, shuffle=True, seed=seed, sort=sort)


def mean_rows(lengths: np.ndarray) -> int:
    plan = token_plan(lengths, 0)
    plan.bind(batch_size=ROW_CAP, seed=0, n=len(lengths))
    return round(len(lengths) / plan.num_batches(0))


class BucketSampler:
    """A length-bucketing batch sampler of the usual kind: shuffle, sort windows of WINDOW
    batches by length, cut batches of ``bs`` rows, shuffle the batches; reshuffled each epoch."""

    def __init__(self, lengths: np.ndarray, bs: int, seed: int) -> None:
        self.lengths, self.bs, self.rng = lengths, bs, np.random.default_rng(seed)

    def __iter__(self) -> Any:
        order = self.rng.permutation(len(self.lengths))
        w = self.bs * WINDOW
        batches = []
        for s in range(0, len(order), w):
            chunk = order[s:s + w]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[k:k + self.bs].tolist() for k in range(0, len(chunk), self.bs)]
        for k in self.rng.permutation(len(batches)):
            yield batches[k]

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.bs)


class PlanSampler:
    """TokenBudget's batches of epoch 0, 1, ... as a torch batch sampler."""

    def __init__(self, plan: Any) -> None:
        self.plan, self.epoch = plan, 0

    def __iter__(self) -> Any:
        batches = self.plan(self.epoch)
        self.epoch += 1
        return iter([b.tolist() for b in batches])


def torch_collate(samples: list[dict[str, Any]]) -> Any:
    import torch
    from torch.nn.utils.rnn import pad_sequence

    seqs = [torch.from_numpy(s["tokens"]) for s in samples]
    return pad_sequence(seqs, batch_first=True), torch.tensor([len(s) for s in seqs])


def _loader(name: str, ds: Texts, lengths: np.ndarray, workers: int, seed: int) -> Any:
    """(a function running one epoch and returning (samples, padded tokens, largest batch),
    a close function)."""
    if name.startswith("fastload"):
        import fastload

        if name in ("fastload-tokens", "fastload-sorted"):
            plan = token_plan(lengths, seed, sort=name == "fastload-sorted")
            fl = fastload.Loader(ds, ROW_CAP, batch_plan=plan, num_workers=workers,
                                 ragged={"tokens": "pad"})
        else:
            fl = fastload.Loader(ds, mean_rows(lengths), shuffle=True, seed=seed,
                                 num_workers=workers, ragged={"tokens": "pad"})

        def epoch() -> tuple[int, int, int]:
            got = padded = top = 0
            for b in fl:
                v = b["tokens"].values
                got, padded, top = got + len(v), padded + v.size, max(top, v.size)
            return got, padded, top
        return epoch, fl.close
    import torch

    sampler: Any = (BucketSampler(lengths, mean_rows(lengths), seed) if name == "torch-bucket"
                    else PlanSampler(token_plan(lengths, seed)))
    if name == "torch-tokens":
        sampler.plan.bind(batch_size=ROW_CAP, seed=seed, n=len(lengths))
    tl = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=workers,
                                     collate_fn=torch_collate, persistent_workers=workers > 0)

    def tepoch() -> tuple[int, int, int]:
        got = padded = top = 0
        for x, _ in tl:
            got, padded, top = got + len(x), padded + x.numel(), max(top, x.numel())
        return got, padded, top
    return tepoch, lambda: None


def run_case(loader: str, n: int, workers: int, epochs: int) -> dict[str, Any]:
    lengths = lengths_of(n)
    ds = Texts(lengths)
    t0 = time.perf_counter()
    run, close = _loader(loader, ds, lengths, workers, 1)
    seen: dict[str, int] = {}

    def epoch() -> int:
        got, padded, top = run()
        seen.update(padded=padded, top=max(top, seen.get("top", 0)))
        return got
    rate, first = _common.time_epochs(epoch, n, epochs, t0, close)
    real = int(lengths.sum())
    return {"loader": loader, "tokens_per_s": rate * real / n, "waste": seen["padded"] / real,
            "largest_batch": seen["top"], "first_epoch_s": first}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--n", type=int, default=20_000, help="samples per epoch")
    p.add_argument("--quick", action="store_true", help="1 repeat, 4,000 samples (a smoke test)")
    p.add_argument("--out", default=None,
                   help="markdown output (default benchmarks/results/tokens.md; '-': none)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(**json.loads(args.case))))
        return 0
    if args.quick:
        args.repeat, args.n = 1, 4_000
        args.out = args.out or "-"
    try:
        import torch  # noqa: F401
        loaders = LOADERS
    except ImportError:
        loaders = [ld for ld in LOADERS if not ld.startswith("torch")]
    results: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.repeat):
        for loader in loaders:
            r = _common.run_fresh(__file__, dict(loader=loader, n=args.n, workers=args.workers,
                                                 epochs=args.epochs))
            results.setdefault(loader, []).append(r)
            print(f"repeat {rep + 1}/{args.repeat} {loader:16s} {r['tokens_per_s']:>14,.0f} "
                  f"tokens/s  waste {r['waste']:.3f}x", flush=True)
    lengths = lengths_of(args.n)
    rows = mean_rows(lengths)
    lines = ["| loader | padding waste (padded / real tokens) | largest batch (padded tokens) "
             "| real tokens/s (median) | runs | vs torch-bucket |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    med = {ld: statistics.median(r["tokens_per_s"] for r in v) for ld, v in results.items()}
    for ld, v in results.items():
        base = med.get("torch-bucket")
        vs = f"{med[ld] / base:.2f}x" if base else "-"
        runs = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in v)
        waste = statistics.median(r["waste"] for r in v)
        top = max(r["largest_batch"] for r in v)
        lines.append(f"| {ld} | {waste:.3f}x | {top:,} | {med[ld]:,.0f} | {runs} | {vs} |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.out is None:
        args.out = os.path.join(_common.RESULTS_DIR, "tokens.md")
    if args.out != "-":
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        cmd = "python benchmarks/bench_tokens.py " + " ".join(argv if argv is not None
                                                              else sys.argv[1:])
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(
                f"# Token-budget batches\n\n`{cmd.strip()}`: {args.n:,} sequences, lengths "
                f"lognormal (mean {lengths.mean():.0f}, max {lengths.max()}), "
                f"max_tokens={MAX_TOKENS:,}, row cap {ROW_CAP}; fixed-size batches of {rows} "
                f"rows (the token batches' mean); {args.workers} workers, {args.epochs} epochs "
                f"per run (rate: epochs 2..), medians of {args.repeat} fresh-process runs, "
                f"loaders interleaved.\n\n{table}\n\n"
                f"Machine: {json.dumps(_common.machine_info())}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
