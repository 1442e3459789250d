#!/usr/bin/env python3
"""Does ``python -m fastload doctor`` recommend the setting that is really best here?

    python benchmarks/bench_doctor.py [--repeat 3] [--seconds 2] [--workloads image tiny compute]

For each workload (the doctor's built-ins: ``fastload:image``, ``fastload:tiny``,
``fastload:compute``), ``fastload.doctor`` runs with its defaults (1..CPU workers); then an
independent sweep measures ``fastload.Loader`` with ``num_workers`` 0..CPUs, each setting in a
fresh loader, ``--repeat`` interleaved runs of ``--seconds`` each after a warm-up epoch, the
median taken. The doctor's recommendation passes when it is within one worker of the sweep's
best setting, or its measured rate in the sweep is within 5 % of the best (two settings that
close are a tie on a noisy machine). Writes ``benchmarks/results/doctor.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import fastload  # noqa: E402
from fastload import _doctor  # noqa: E402

BATCH = {"fastload:image": 64, "fastload:tiny": 256, "fastload:compute": 32}


def sweep_rate(ds, bs: int, workers: int, seconds: float) -> float:
    """Samples/s of a plain loop over a Loader, after one warm-up epoch (or 2 s of it)."""
    with fastload.Loader(ds, bs, shuffle=True, seed=3, num_workers=workers) as loader:
        t_warm = time.perf_counter() + 2.0
        for _ in loader:
            if time.perf_counter() > t_warm:
                break
        got, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for b in loader:
                got += len(b[0]) if isinstance(b, tuple) else len(b)
                if time.perf_counter() - t0 >= seconds:
                    break
        return got / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--workloads", nargs="+", default=list(BATCH),
                   help="built-in workloads (fastload:image, fastload:tiny, fastload:compute)")
    args = p.parse_args()
    cpus = _doctor._usable_cpus()
    lines = [f"# doctor vs an independent sweep ({cpus} CPUs, repeat {args.repeat}, "
             f"{args.seconds:g} s per run)", "",
             "| workload | doctor recommends | sweep best | sweep samples/s (0..N workers) "
             "| recommended's rate / best's | within one worker |", "|---|---|---|---|---|---|"]
    ok_all = True
    for name in args.workloads:
        name = name if ":" in name else f"fastload:{name}"
        ds = _doctor._BUILTIN[name]()
        bs = BATCH.get(name, 64)
        d = fastload.doctor(ds, bs, quiet=True, repeat=args.repeat, seconds=args.seconds)
        counts = list(range(0, cpus + 1))
        rates: dict[int, list[float]] = {k: [] for k in counts}
        for r in range(args.repeat):
            for k in (counts if r % 2 == 0 else counts[::-1]):
                rates[k].append(sweep_rate(_doctor._BUILTIN[name](), bs, k, args.seconds))
        med = {k: statistics.median(v) for k, v in rates.items()}
        best = max(med, key=lambda k: med[k])
        rec = d.recommended_workers
        ok = abs(rec - best) <= 1 or med[rec] >= 0.95 * med[best]
        ok_all &= ok
        row = ", ".join(f"{med[k]:,.0f}" for k in counts)
        lines.append(f"| {name.split(':')[1]} | {rec} ({d.recommended.rate:,.0f}/s) | {best} | {row} "
                     f"| {med[rec] / med[best]:.2f} | {'yes' if ok else 'NO'} |")
        print(lines[-1], flush=True)
    lines += ["", "Reproduce: `python benchmarks/bench_doctor.py --repeat "
              f"{args.repeat} --seconds {args.seconds:g}`"]
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "doctor.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
