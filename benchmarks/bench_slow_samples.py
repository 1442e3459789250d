"""Slow samples: the time to the first batch and to the end of an epoch, with idle workers
sharing the rows of a batch (``share_rows=True``, NOTE [pieces] in csrc/fl_ring.c), without
(each batch loaded by one worker, as torch's DataLoader does: pytorch/pytorch#19836), and torch's
DataLoader, side by side.

    python benchmarks/bench_slow_samples.py [--workers 4] [--batch-size 4] [--n 8]
                                            [--delay 1.0] [--repeat 3]

Each sample sleeps ``--delay`` seconds (an image decoded from a slow network store, a speech
clip resampled...): sleeping needs no CPU, so the numbers do not depend on the machine's cores.
Every case runs in this process, one after the other, each round in a rotated order; medians
over ``--repeat`` rounds. A case times a fresh loader from construction to its first batch and to
the end of one epoch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402,F401  (makes fastload importable from a checkout)

import fastload  # noqa: E402


class Slow:
    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(self.delay)
        return np.full(16, i, np.float32)


def _epoch(loader: object) -> tuple[float, float, list[int]]:
    t = time.perf_counter()
    it = iter(loader)  # type: ignore[call-overload]
    first = np.asarray(next(it))
    t_first = time.perf_counter() - t
    seen = [int(v) for v in first[:, 0]]
    for b in it:
        seen += [int(v) for v in np.asarray(b)[:, 0]]
    return t_first, time.perf_counter() - t, seen


def case(kind: str, args: argparse.Namespace) -> tuple[float, float]:
    ds = Slow(args.n, args.delay)
    t0 = time.perf_counter()
    if kind == "torch":
        import torch.utils.data as tud

        loader: object = tud.DataLoader(ds, args.batch_size, num_workers=args.workers,
                                        multiprocessing_context="fork")
    else:
        loader = fastload.Loader(ds, args.batch_size, num_workers=args.workers,
                                 start_method="fork", share_rows=kind == "fastload")
    built = time.perf_counter() - t0
    t_first, t_epoch, seen = _epoch(loader)
    if kind != "torch":
        loader.close()  # type: ignore[attr-defined]
    assert seen == list(range(args.n)), seen
    return built + t_first, built + t_epoch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--delay", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-torch", action="store_true")
    args = p.parse_args()
    kinds = ["fastload", "fastload-noshare"] + ([] if args.no_torch else ["torch"])
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for r in range(args.repeat):
        for k in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
            got[k].append(case(k, args))
    print(f"{args.n} samples of {args.delay:g} s, batch {args.batch_size}, {args.workers} "
          f"workers (fork), medians of {args.repeat}:\n")
    print("| loader | first batch | epoch |\n|---|---:|---:|")
    label = {"fastload": "fastload (share_rows=True)",
             "fastload-noshare": "fastload (share_rows=False)", "torch": "torch DataLoader"}
    for k in kinds:
        first = statistics.median(f for f, _ in got[k])
        epoch = statistics.median(e for _, e in got[k])
        print(f"| {label[k]} | {first:.2f} s | {epoch:.2f} s |")


if __name__ == "__main__":
    main()
