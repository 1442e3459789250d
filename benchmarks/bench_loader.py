#!/usr/bin/env python3
"""fastload against torch's DataLoader, a single-process loop and ``__getitem__`` alone.

    python benchmarks/bench_loader.py --workload image --workers 2 --repeat 3
    python benchmarks/bench_loader.py --workload all --quick        # < 60 s smoke run

Every (loader, repeat) runs in a fresh interpreter (``--case``, internal), repeats interleave
the loaders (so slow drift of a shared machine hits all of them alike), and the table reports
medians over repeats of the steady state (epochs 2..). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
from _common import fmt_rate, markdown_table, summarize  # noqa: E402

from fastload import _bench  # noqa: E402

ALL_LOADERS = ("fastload", "torch", "single", "getitem")
LOADER_LABEL = {
    "fastload": "fastload",
    "torch": "torch DataLoader",
    "single": "single process",
    "getitem": "__getitem__ only",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=(*_bench.WORKLOADS, "all"), default="all")
    p.add_argument("--workers", type=int, default=2, help="worker processes of fastload and torch (2)")
    p.add_argument("--repeat", type=int, default=None, help="fresh-process runs per loader (3; 1 with --quick)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (3; 2 with --quick); steady state = 2..")
    p.add_argument("--quick", action="store_true", help="small n, 2 epochs, 1 repeat: the whole run in < 60 s")
    p.add_argument("--n", type=int, default=None, help="override samples per epoch (every workload)")
    p.add_argument("--batch-size", type=int, default=None, help="override the workload's batch size")
    p.add_argument("--loaders", default=",".join(ALL_LOADERS),
                   help="comma-separated subset of " + ",".join(ALL_LOADERS))
    p.add_argument("--prefetch", type=int, default=2, help="fastload prefetch = torch prefetch_factor (2)")
    p.add_argument("--no-shuffle", action="store_true", help="sequential order (default: shuffled)")
    p.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), default=None,
                   help="for fastload and torch (default: each library's own default)")
    p.add_argument("--torch-collate", choices=("default", "numpy"), default="default",
                   help="torch collate: default (torch tensors via shared memory) or numpy "
                        "(np.stack in the worker; arrays are pickled through the result queue)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case before it is killed")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="JSON-lines output (default benchmarks/results/loader-<time>.json; '-' for none)")
    p.add_argument("--case", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.epochs is None:
        args.epochs = 2 if args.quick else 3
    if args.repeat < 1 or args.epochs < 1 or args.workers < 0:
        p.error("--repeat and --epochs must be >= 1, --workers >= 0")
    args.loaders = [x.strip() for x in args.loaders.split(",") if x.strip()]
    bad = [x for x in args.loaders if x not in ALL_LOADERS]
    if bad:
        p.error(f"unknown loader(s) {bad}; choose from {ALL_LOADERS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.case is not None:
        return _bench.case_entry([args.case])

    workloads = list(_bench.WORKLOADS) if args.workload == "all" else [args.workload]
    loaders = list(args.loaders)
    if "torch" in loaders and importlib.util.find_spec("torch") is None:
        print("note: torch is not installed; skipping the torch DataLoader", file=sys.stderr)
        loaders.remove("torch")
    json_path = None if args.json == "-" else (args.json or _common.default_json_path("loader"))
    out = _common.JsonLines(json_path)
    info = _common.machine_info()
    print(f"fastload {info['fastload']} | python {info['python']} | numpy {info['numpy']} | "
          f"torch {info['torch'] or '-'} | {info['cpu_count']} CPUs ({info['processor']}) | "
          f"load {info['loadavg']}")
    script = os.path.abspath(__file__)
    t_all = time.monotonic()
    summaries: list[dict[str, Any]] = []
    for w in workloads:
        cls, bs, n_full, n_quick = _bench.WORKLOADS[w]
        n = args.n or (n_quick if args.quick else n_full)
        bs = args.batch_size or bs
        base = dict(workload=w, n=n, batch_size=bs, epochs=args.epochs, workers=args.workers,
                    prefetch=args.prefetch, shuffle=not args.no_shuffle, seed=0,
                    start_method=args.start_method, torch_collate=args.torch_collate)
        print(f"\n## {w}: n={n} batch_size={bs} epochs={args.epochs} workers={args.workers} "
              f"repeat={args.repeat}")
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in loaders}
        for r in range(args.repeat):
            # rotate the order each repeat: drift of a shared machine spreads over all loaders
            order = loaders[r % len(loaders):] + loaders[: r % len(loaders)]
            for name in order:
                case = dict(base, loader=name)
                t0 = time.monotonic()
                try:
                    res = _common.run_case_subprocess(script, case, timeout=args.timeout)
                except RuntimeError as e:
                    print(f"  {name:<9} repeat {r + 1}: FAILED\n{e}", file=sys.stderr)
                    out.write("error", {"case": case, "repeat": r, "error": str(e)})
                    continue
                res["repeat"] = r
                runs[name].append(res)
                out.write("case", res)
                print(f"  {name:<9} repeat {r + 1}/{args.repeat}: "
                      f"{fmt_rate(res['samples_per_s']):>11} samples/s  "
                      f"{res['gb_per_s']:.3f} GB/s  first batch {res['first_batch_ns'] / 1e6:7.1f} ms  "
                      f"epochs {', '.join(f'{e / 1e9:.2f}' for e in res['epoch_ns'])} s  "
                      f"faults/epoch {res['minor_faults_per_epoch'][-1]}  "
                      f"cpu busy {_pct(res.get('cpu_busy_steady'))}  "
                      f"({time.monotonic() - t0:.1f} s wall)", flush=True)
        for name in loaders:
            rs = runs[name]
            if not rs:
                continue
            s = {
                "workload": w,
                "loader": name,
                "n": n,
                "batch_size": bs,
                "epochs": args.epochs,
                "workers": rs[0]["workers"],
                "repeats": len(rs),
                "samples_per_s": summarize(r["samples_per_s"] for r in rs),
                "gb_per_s": summarize(r["gb_per_s"] for r in rs),
                "first_batch_s": summarize(r["first_batch_ns"] / 1e9 for r in rs),
                "first_epoch_s": summarize(r["epoch_ns"][0] / 1e9 for r in rs),
                "close_s": summarize(r["close_ns"] / 1e9 for r in rs),
                "batch_gap_p50_ms": summarize(
                    r["batch_gap_ns"]["p50"] / 1e6 for r in rs if r.get("batch_gap_ns")),
                "batch_gap_p90_ms": summarize(
                    r["batch_gap_ns"]["p90"] / 1e6 for r in rs if r.get("batch_gap_ns")),
                "faults_per_batch": summarize(_faults_per_batch(r) for r in rs),
                "cpu_busy_steady": summarize(r.get("cpu_busy_steady") for r in rs),
                "start_method": rs[0].get("start_method"),
                "torch_collate": rs[0].get("torch_collate"),
                "bytes_per_sample": rs[0].get("bytes_per_sample"),
                "machine": info,
            }
            summaries.append(s)
        ws = {s["loader"]: s for s in summaries if s["workload"] == w}
        ratios = _ratios(ws)
        for s in ws.values():
            s["ratios"] = ratios
            out.write("summary", s)
        if ratios:
            print("  " + "  ".join(f"{k} = {v:.2f}x" for k, v in ratios.items()))

    print(f"\n(total {time.monotonic() - t_all:.0f} s)\n")
    print(render_table(summaries, args))
    if json_path:
        print(f"\nJSON lines: {os.path.relpath(json_path)}")
    return 0


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _faults_per_batch(r: dict[str, Any]) -> float | None:
    """Minor page faults of the consuming process per steady-state batch."""
    f = r.get("minor_faults_per_epoch") or []
    steady = slice(1, None) if len(f) >= 2 else slice(0, None)
    samples = sum(r["samples_per_epoch"][steady])
    if not samples:
        return None
    return sum(f[steady]) / (samples / r["batch_size"])


def _ratios(ws: dict[str, dict[str, Any]]) -> dict[str, float]:
    out = {}
    f = ws.get("fastload")
    if f is None:
        return out
    fm = f["samples_per_s"]["median"]
    for other, key in (("torch", "fastload/torch"), ("single", "fastload/single"),
                       ("getitem", "fastload/getitem")):
        o = ws.get(other)
        if o is not None and o["samples_per_s"]["median"]:
            out[key] = fm / o["samples_per_s"]["median"]
    return out


def render_table(summaries: list[dict[str, Any]], args: argparse.Namespace) -> str:
    header = ["workload", "loader", "samples/s", "p10 - p90", "GB/s", "first batch",
              "batch gap p50 / p90", "faults/batch", "close", "vs torch", "vs single"]
    rows = []
    for s in summaries:
        ws = {x["loader"]: x for x in summaries if x["workload"] == s["workload"]}
        med = s["samples_per_s"]["median"]

        def rel(other: str) -> str:
            o = ws.get(other)
            if o is None or not o["samples_per_s"]["median"] or o is s:
                return "" if o is not s else "1.00x"
            return f"{med / o['samples_per_s']['median']:.2f}x"

        label = LOADER_LABEL[s["loader"]]
        if s["loader"] in ("fastload", "torch") and s.get("start_method"):
            label += f" ({s['workers']}w, {s['start_method']})"
        gap = "-"
        if s["batch_gap_p50_ms"]["n"]:
            gap = f"{s['batch_gap_p50_ms']['median']:.2f} / {s['batch_gap_p90_ms']['median']:.2f} ms"
        rows.append([
            s["workload"],
            label,
            fmt_rate(med),
            f"{fmt_rate(s['samples_per_s']['p10'])} - {fmt_rate(s['samples_per_s']['p90'])}",
            f"{s['gb_per_s']['median']:.3f}",
            f"{s['first_batch_s']['median'] * 1e3:.0f} ms",
            gap,
            f"{s['faults_per_batch']['median']:.0f}",
            f"{s['close_s']['median'] * 1e3:.0f} ms" if s["loader"] in ("fastload", "torch") else "-",
            rel("torch") if "torch" in ws else "",
            rel("single") if "single" in ws else "",
        ])
    lines = [markdown_table(header, rows, "llrrrrrrrrr"), ""]
    lines.append(f"samples/s and GB/s: steady state (epochs 2..{args.epochs}), median over "
                 f"{args.repeat} fresh-process repeat(s); p10 - p90 across repeats. GB/s counts "
                 "the bytes of the delivered batch arrays.")
    lines.append("first batch: from constructing the loader (includes worker start and the "
                 "workers' lazy dataset build). close: loader.close() / torch worker shutdown.")
    lines.append("batch gap: time between consecutive batches seen by the consumer (p50 / p90 "
                 "within the steady state, median over repeats). faults/batch: minor page faults "
                 "of the consuming process per steady-state batch (fresh memory being touched).")
    if any(s["loader"] == "torch" for s in summaries):
        coll = next(s["torch_collate"] for s in summaries if s["loader"] == "torch")
        lines.append(f"torch: DataLoader(num_workers={args.workers}, persistent_workers=True, "
                     f"prefetch_factor={args.prefetch}), collate = {coll}.")
    cpus = os.cpu_count() or 1
    if cpus <= args.workers:
        lines.append(f"note: {cpus} CPUs for {args.workers} workers + the consuming process: "
                     "multi-process loaders cannot scale here; expect noise on a shared machine.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
