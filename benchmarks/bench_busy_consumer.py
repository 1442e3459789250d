"""Where worker threads should live when the training loop itself runs Python (issue 26,
NOTE [hosted threads] in fastload/_host.py).

    python benchmarks/bench_busy_consumer.py [--methods process,thread,process_threads,single]
                                             [--repeat 3] [--consume 40000]

The dataset's ``__getitem__`` is pure Python (it holds the GIL); the consumer runs a pure-Python
loop of ``--consume`` additions per batch, as a training step's Python does. Thread workers in
the loader's process then take the GIL from the consumer; the same threads in one helper
process (``worker_method="process_threads"``) do not. Prints batches/s per method (median of
--repeat runs, the methods interleaved within each round; the first batch of each run left out).
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


class PyRows:
    """64 x 400 samples, each ~200 pure-Python multiply-adds."""

    def __len__(self) -> int:
        return 64 * 400

    def __getitem__(self, i: int) -> np.ndarray:
        s = 0
        for k in range(200):
            s += k * i
        return np.array([i, s % 7], dtype=np.int64)


def _consume(n: int) -> int:
    s = 0
    for k in range(n):
        s += k
    return s


def run(method: str, consume: int, workers: int) -> float:
    kw: dict[str, object] = ({"num_workers": 0} if method == "single" else
                             {"num_workers": workers, "worker_method": method})
    with fastload.Loader(PyRows(), 64, shuffle=True, seed=0, **kw) as loader:  # type: ignore[arg-type]
        it = iter(loader)
        next(it)
        t0, n = time.perf_counter(), 0
        for _ in it:
            _consume(consume)
            n += 1
        return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default="process,thread,process_threads,single")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--consume", type=int, default=40000,
                   help="pure-Python additions per batch in the consumer")
    args = p.parse_args(argv)
    methods = args.methods.split(",")
    got: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.repeat):
        for m in methods:
            got[m].append(run(m, args.consume, args.workers))
    for m in methods:
        print(f"{m:16s} {statistics.median(got[m]):8.1f} batches/s (median of {args.repeat}: "
              f"{', '.join(f'{x:.0f}' for x in got[m])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
