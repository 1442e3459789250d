"""Fault matrix: how long fastload takes to report each fault, and what it says.

    python benchmarks/fault_matrix.py [--repeat 3]

Each case runs a 2-worker loader whose dataset misbehaves at one index and measures the time from
the ``next()`` call that hits the fault to the exception (median of --repeat runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]

import fastload  # noqa: E402
from _helpers import ExitAt, HangAt, KillAt, Raises, SegfaultAt  # noqa: E402

CASES = {
    "KeyError in __getitem__": lambda d: (Raises(64, 20, KeyError, ("k",)), {}),
    "SIGKILL (OOM killer)": lambda d: (KillAt(64, 20), {}),
    "segfault": lambda d: (SegfaultAt(64, 20), {}),
    "os._exit(3)": lambda d: (ExitAt(64, 20, 3), {}),
    "hang, timeout=2": lambda d: (HangAt(64, 20), {"timeout": 2.0}),
}


def run(make, tmp: str) -> tuple[float, str]:
    ds, kw = make(tmp)
    with fastload.Loader(ds, 4, num_workers=2, **kw) as loader:
        it = iter(loader)
        while True:
            t = time.monotonic()
            try:
                next(it)
            except StopIteration:
                return float("nan"), "no error"
            except Exception as e:  # noqa: BLE001
                return time.monotonic() - t, f"{type(e).__name__}: {str(e).splitlines()[0]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| fault | detection (median s) | message |\n| --- | --: | --- |")
    for name, make in CASES.items():
        times, msg = [], ""
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                t, msg = run(make, tmp)
            times.append(t)
        print(f"| {name} | {statistics.median(times):.3f} | {msg[:150]} |")


if __name__ == "__main__":
    main()
