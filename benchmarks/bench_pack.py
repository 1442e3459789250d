#!/usr/bin/env python3
"""Per-sample cost of fastload's fill path against ``np.stack``, in one process (no workers).

    python benchmarks/bench_pack.py [--repeat 20] [--json PATH]

For one batch of samples of each workload (and a few single-leaf variants that isolate a leaf
type), times one epoch of ``fastload.Loader(samples, batch_size=len(samples), num_workers=0)``:
the fill path a worker runs (every sample packed into a slot: the same code with and without
workers) plus one slot-sized buffer and the batch's views, and ``np_collate`` (``np.stack`` per
leaf: the single-process baseline), in ns per sample, median over ``--repeat`` timed batches
after one warm-up. This isolates the packing overhead from process scheduling and IPC.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
from _common import markdown_table, summarize, time_repeat  # noqa: E402

import numpy as np  # noqa: E402

import _harness  # noqa: E402

import fastload  # noqa: E402


class _Samples:
    """The batch's samples as a dataset."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]


def cases() -> list[tuple[str, list]]:
    out = []
    for w in ("image", "tiny", "dict"):
        cls, bs, _n, _q = _harness.WORKLOADS[w]
        ds = cls(max(bs, 1024))
        out.append((w, [ds[i] for i in range(bs)]))
    tiny = out[1][1]
    out += [
        ("tiny: (view, Python int)", [(a, int(b)) for a, b in tiny]),
        ("leaf: float32 (16,) view", [a for a, _ in tiny]),
        ("leaf: np.int64 scalar", [b for _, b in tiny]),
        ("leaf: Python int", [int(b) for _, b in tiny]),
        ("leaf: 0-d int64 array", [np.asarray(b) for _, b in tiny]),
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", default=None, help="JSON-lines output ('-' or omitted: none)")
    args = p.parse_args(argv)
    out = _common.JsonLines(None if args.json in (None, "-") else args.json)
    rows = []
    for name, samples in cases():
        bs = len(samples)
        loader = fastload.Loader(_Samples(samples), bs, num_workers=0)

        def pack_all() -> None:
            for _batch in loader:  # one epoch: one batch
                pass

        def stack_all() -> None:
            _harness.np_collate(samples)

        res = {}
        for label, fn in (("pack", pack_all), ("np_stack", stack_all)):
            ns = time_repeat(fn, warmup=1, repeat=args.repeat)
            res[label] = summarize(x / bs for x in ns)
        loader.close()
        out.write("pack", {"case": name, "batch_size": bs, **{k: v for k, v in res.items()}})
        rows.append([name, str(bs), f"{res['pack']['median']:,.0f}", f"{res['np_stack']['median']:,.0f}",
                     f"{res['pack']['median'] / res['np_stack']['median']:.2f}"])
    print(markdown_table(["samples", "batch", "fastload fill ns/sample", "np.stack ns/sample", "ratio"],
                         rows, "lrrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
