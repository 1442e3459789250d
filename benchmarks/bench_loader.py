#!/usr/bin/env python3
"""fastload against torch's DataLoader, a single-process loop, ``__getitem__`` alone and a
plain memcpy of the same bytes (the physical ceiling).

    python benchmarks/bench_loader.py --workload all                  # the whole suite
    python benchmarks/bench_loader.py --workload image --repeat 5
    python benchmarks/bench_loader.py --quick --workload tiny --repeat 1   # CI smoke, seconds

Every (loader, repeat) runs in a fresh interpreter (``--case``, internal), repeats interleave
the loaders (so slow drift of a shared machine hits all of them alike), and the table reports
medians over repeats of the steady state (epochs 2..). Writes
``benchmarks/results/loader-<workload>[-quick].md`` and ``.png`` (chart, when matplotlib is
installed) and JSON lines (git-ignored). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import math
import os
import shlex
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402
from _common import fmt_rate  # noqa: E402

import _harness as _bench  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=(*_bench.WORKLOADS, "all"), default="all")
    p.add_argument("--workers", type=int, default=2, help="worker processes of fastload and torch (2)")
    p.add_argument("--repeat", type=int, default=None, help="fresh-process runs per loader (3; 1 with --quick)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per run (3; 2 with --quick); steady state = 2..")
    p.add_argument("--quick", action="store_true",
                   help="small n (memmap: a 64 MiB file), 2 epochs, 1 repeat: a smoke run")
    p.add_argument("--n", type=int, default=None, help="override samples per epoch (every workload)")
    p.add_argument("--batch-size", type=int, default=None, help="override the workload's batch size")
    p.add_argument("--loaders", default=None,
                   help="comma-separated subset of " + ",".join(_bench.LOADERS) +
                        " (default: all; fastload-1w only for compute)")
    p.add_argument("--prefetch", type=int, default=2, help="fastload prefetch = torch prefetch_factor (2)")
    p.add_argument("--no-shuffle", action="store_true", help="sequential order (default: shuffled)")
    p.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), default=None,
                   help="for fastload and torch (default: each library's own default)")
    p.add_argument("--torch-collate", choices=("default", "numpy"), default="default",
                   help="torch collate: default (torch tensors via shared memory) or numpy "
                        "(np.stack in the worker; arrays are pickled through the result queue)")
    p.add_argument("--pss-interval", type=float, default=0.02,
                   help="seconds between PSS samples of the process tree (0: off)")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                   help="before starting, wait up to S seconds for the machine to be < 10%% busy, "
                        "and before each case up to min(S, 60) s for 1 s below 10%% (default 0: "
                        "don't wait)")
    p.add_argument("--retry-noisy", type=float, default=0.25, metavar="F",
                   help="run a case again (up to 2 more times) when other processes took more "
                        "than F of all CPUs during its steady state (default 0.25; 0: never); "
                        "the summary uses the last attempt, the JSON keeps all")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case before it is killed")
    p.add_argument("--out", metavar="PREFIX", default=None,
                   help="write PREFIX.md and PREFIX.png (default benchmarks/results/"
                        "loader-<workload>[-quick]; '-' for none)")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="JSON-lines output (default benchmarks/results/loader-<time>.json; '-' for none)")
    p.add_argument("--render", metavar="JSON",
                   help="run nothing: write the .md / .png again from the JSON lines of an "
                        "earlier run (its summary records; --out as usual)")
    p.add_argument("--live-thread", action="store_true",
                   help="keep one more thread alive in the training process from before the "
                        "loader is built (a memory sampler, as training loops have progress, "
                        "metrics and logging threads)")
    p.add_argument("--prebuilt", action="store_true",
                   help="build the workload's data (its first __getitem__) in the training "
                        "process before the clock starts, so 'first batch' leaves out the "
                        "lazy build (fork and thread workers inherit the built data; spawn and "
                        "forkserver workers still build their own)")
    p.add_argument("--case", metavar="JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.epochs is None:
        args.epochs = 2 if args.quick else 3
    if args.repeat < 1 or args.epochs < 1 or args.workers < 0:
        p.error("--repeat and --epochs must be >= 1, --workers >= 0")
    if args.loaders is not None:
        args.loaders = [x.strip() for x in args.loaders.split(",") if x.strip()]
        bad = [x for x in args.loaders if x not in _bench.LOADERS]
        if bad:
            p.error(f"unknown loader(s) {bad}; choose from {_bench.LOADERS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.case is not None:
        return _bench.case_entry([args.case])
    if args.render is not None:
        return render_from_json(args.render, args.out)

    workloads = list(_bench.WORKLOADS) if args.workload == "all" else [args.workload]
    if args.workload == "all" and not _bench.have_pillow():
        workloads.remove("decode")  # (needs Pillow: pip install pillow)
    have_torch = importlib.util.find_spec("torch") is not None
    if not have_torch:
        print("note: torch is not installed; skipping the torch DataLoader", file=sys.stderr)
    json_path = None if args.json == "-" else (args.json or _common.default_json_path("loader"))
    out_prefix = _out_prefix(args.out, args)
    out = _common.JsonLines(json_path)
    info = _common.machine_info()
    started = _dt.datetime.now()
    print(f"fastload {info['fastload']} | python {info['python']} | numpy {info['numpy']} | "
          f"torch {info['torch'] or '-'} | {info['cpu_count']} CPUs ({info['processor']}) | "
          f"load {info['loadavg']}")
    if args.quick:
        info["busy_before"] = None
    else:
        if args.wait_quiet > 0:
            _bench.wait_quiet(args.wait_quiet, report=lambda m: print(m, file=sys.stderr, flush=True))
        info["busy_before"] = _bench.machine_busy(3.0)
        print(f"machine busy before the run (3 s, other processes): "
              f"{_pct(info['busy_before'])}", flush=True)
        if info["busy_before"] is not None and info["busy_before"] > 0.1:
            print(f"warning: the machine is {info['busy_before']:.0%} busy before the run: results "
                  "will be noisy (see the 'others' figure; --wait-quiet S waits for quiet)",
                  file=sys.stderr)
    if not _bench.pss_supported():
        print("note: /proc/<pid>/smaps_rollup or task children not readable: no PSS figures",
              file=sys.stderr)
    script = os.path.abspath(__file__)
    t_all = time.monotonic()
    summaries: list[dict[str, Any]] = []
    warnings: list[str] = []
    retried = 0
    for w in workloads:
        cls, bs, n_full, n_quick = _bench.WORKLOADS[w]
        n = args.n or (n_quick if args.quick else n_full)
        bs = args.batch_size or bs
        loaders = [x for x in (args.loaders or _bench.default_loaders(w))
                   if x != "torch" or have_torch]
        base = dict(workload=w, n=n, batch_size=bs, epochs=args.epochs, workers=args.workers,
                    prefetch=args.prefetch, shuffle=not args.no_shuffle, seed=0,
                    start_method=args.start_method, torch_collate=args.torch_collate,
                    live_thread=args.live_thread, prebuilt=args.prebuilt)
        print(f"\n## {w}: n={n:,} batch_size={bs} epochs={args.epochs} workers={args.workers} "
              f"repeat={args.repeat}", flush=True)
        if w == "memmap":
            t0 = time.monotonic()
            path = _bench.ensure_memmap_file(n, 0, _bench.MemmapDataset.DIM)
            print(f"  file {path} ({os.path.getsize(path) / 2**20:,.0f} MiB; "
                  f"{time.monotonic() - t0:.1f} s to find or create; each case first reads it "
                  "once into the page cache, before its clock starts)", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in loaders}
        for r in range(args.repeat):
            # rotate the order each repeat: drift of a shared machine spreads over all loaders
            order = loaders[r % len(loaders):] + loaders[: r % len(loaders)]
            for name in order:
                case = dict(base, loader=name)
                quiet = None
                if args.wait_quiet > 0:
                    quiet = _bench.wait_quiet(min(args.wait_quiet, 60.0), window=1.0)
                res = None
                for attempt in range(3):
                    t0 = time.monotonic()
                    try:
                        res = _common.run_case_subprocess(script, case, timeout=args.timeout,
                                                          pss_interval=args.pss_interval)
                    except RuntimeError as e:
                        print(f"  {name:<12} repeat {r + 1}: FAILED\n{e}", file=sys.stderr)
                        out.write("error", {"case": case, "repeat": r, "error": str(e)})
                        warnings.append(f"{w}/{name} repeat {r + 1} failed: {str(e).splitlines()[0]}")
                        res = None
                        break
                    res.update(repeat=r, attempt=attempt, busy_before_case=quiet)
                    others = res.get("cpu_others_steady")
                    noisy = bool(args.retry_noisy and others is not None and others > args.retry_noisy)
                    res["noisy"] = noisy
                    out.write("case", res)
                    print(_case_line(name, r, args.repeat, res, time.monotonic() - t0)
                          + ("  [noisy: again]" if noisy and attempt < 2 else ""), flush=True)
                    if not noisy:
                        break
                    retried += 1
                    if args.wait_quiet > 0:
                        _bench.wait_quiet(min(args.wait_quiet, 60.0), window=1.0)
                if res is not None:
                    runs[name].append(res)
        ws = {}
        for name in loaders:
            if runs[name]:
                s = _bench.summarize_runs(runs[name])
                s["machine"] = info
                summaries.append(s)
                ws[name] = s
        warnings += _check_checksums(w, ws)
        rat = _bench.ratios(ws)
        for s in ws.values():
            s["ratios"] = rat
            out.write("summary", s)
        shown = {k: v for k, v in rat.items() if k.split("/")[1] in ("torch", "single")}
        if shown:
            print("  " + "  ".join(f"{k} = {v:.2f}x" for k, v in shown.items()), flush=True)

    total_s = time.monotonic() - t_all
    if retried:
        warnings.append(f"{retried} case(s) were run again because other processes took more "
                        f"than {args.retry_noisy:.0%} of the CPUs during their steady state")
    print(f"\n(total {total_s:.0f} s)\n")
    for m in warnings:
        print(f"warning: {m}", file=sys.stderr)
    cmd = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    end = {"total_s": round(total_s, 1), "loadavg_after": _bench._loadavg(),
           "busy_before": info.get("busy_before"), "warnings": warnings, "command": cmd,
           "started": started.isoformat(timespec="seconds")}
    out.write("end", end)
    write_outputs(args, info, started, summaries, end, out_prefix)
    if json_path:
        print(f"JSON lines: {os.path.relpath(json_path)}")
    return 0


def write_outputs(args: argparse.Namespace, info: dict[str, Any], started: _dt.datetime,
                  summaries: list[dict[str, Any]], end: dict[str, Any],
                  out_prefix: str | None) -> None:
    """Print the table and the targets; write PREFIX.md and PREFIX.png."""
    targets = _bench.evaluate_targets(summaries)
    table = _bench.render_table(summaries)
    print(table)
    print()
    print(_bench.render_targets(targets))
    if not out_prefix:
        return
    md = render_markdown(args, info, started, summaries, table, targets, end)
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    with open(out_prefix + ".md", "w") as f:
        f.write(md)
    print(f"\nmarkdown: {os.path.relpath(out_prefix + '.md')}")
    msg = _bench.plot_summaries(
        summaries, out_prefix + ".png",
        f"fastload {info['fastload']} vs torch {info['torch'] or '-'}: {args.workers} workers, "
        f"{info['cpu_count']} CPUs, median of {args.repeat}, {started:%Y-%m-%d}")
    print(f"chart: {msg}" if msg else f"chart: {os.path.relpath(out_prefix + '.png')}")


def render_from_json(path: str, out: str | None) -> int:
    """``--render``: the outputs of an earlier run from its JSON lines."""
    import json

    info: dict[str, Any] | None = None
    end: dict[str, Any] = {}
    summaries: list[dict[str, Any]] = []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            kind = rec.pop("type")
            rec.pop("run_id", None)
            if kind == "machine" and info is None:
                info = rec
            elif kind == "summary":
                summaries.append(rec)
            elif kind == "end":
                end = rec
    if info is None or not summaries:
        print(f"{path}: no machine or summary records", file=sys.stderr)
        return 1
    argv = list(info.get("argv") or [])[1:]
    args = parse_args(argv)
    end.setdefault("command", " ".join(shlex.quote(a) for a in argv))
    started = _dt.datetime.fromisoformat(end.get("started") or info["time"])
    write_outputs(args, info, started, summaries, end, _out_prefix(out, args))
    return 0


def _out_prefix(out: str | None, args: argparse.Namespace) -> str | None:
    """``--out``: '-' for none, else PREFIX, by default results/loader-<workload>[-quick]."""
    return None if out == "-" else (out or os.path.join(
        _common.RESULTS_DIR, f"loader-{args.workload}{'-quick' if args.quick else ''}"))


def _case_line(name: str, r: int, repeat: int, res: dict[str, Any], wall: float) -> str:
    b = res.get("boundary_ns") or []
    pss = (res.get("pss") or {}).get("peak_kib")
    return (f"  {name:<12} {r + 1}/{repeat}: {fmt_rate(res['samples_per_s']):>11} samples/s "
            f"{res['gb_per_s']:6.3f} GB/s  first {res['first_batch_ns'] / 1e6:6.1f} ms  "
            f"boundary {max(b) / 1e6 if b else math.nan:6.2f} ms  "
            f"next() {res['wait_frac']:4.0%}  "
            f"PSS {pss / 1024 if pss else math.nan:6.0f} MiB  "
            f"epochs {', '.join(f'{e / 1e9:.2f}' for e in res['epoch_ns'])} s  "
            f"busy {_pct(res.get('cpu_busy_steady'))} (others {_pct(res.get('cpu_others_steady'))})"
            f"  ({wall:.1f} s)")


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _check_checksums(w: str, ws: dict[str, dict[str, Any]]) -> list[str]:
    """fastload and single read the same batches in the same order: identical checksums.
    torch shuffles with its own generator: same sum up to float rounding."""
    ref = ws.get("single")
    if ref is None:
        return []
    out = []
    r = ref["checksums"][0]
    for name in ("fastload", "fastload-1w", "torch"):
        s = ws.get(name)
        if s is None:
            continue
        for c in s["checksums"]:
            tol = 1e-9 * max(1.0, abs(r)) if name == "torch" else 0.0
            if c is None or abs(c - r) > tol:
                out.append(f"{w}: checksum of {name} ({c!r}) differs from single's ({r!r})")
                break
    return out


def render_markdown(args: argparse.Namespace, info: dict[str, Any], started: _dt.datetime,
                    summaries: list[dict[str, Any]], table: str,
                    targets: list[dict[str, Any]], end: dict[str, Any]) -> str:
    cmd = ("python benchmarks/bench_loader.py " + end.get("command", "")).strip()
    total = end.get("total_s")
    lines = [
        f"# fastload loader benchmark: {args.workload}{' (quick)' if args.quick else ''}",
        "",
        f"`{cmd}` on {started:%Y-%m-%d %H:%M}"
        + (f", {total / 60:.1f} min." if total is not None else "."),
        "",
        f"fastload {info['fastload']}, Python {info['python']}, NumPy {info['numpy']}, "
        f"torch {info['torch'] or 'not installed'}; {info['cpu_count']} CPUs ({info['processor']}), "
        f"{info.get('mem_total_gib')} GiB RAM, {info['platform']}; load average before the run "
        f"{info['loadavg']}, after {end.get('loadavg_after', '?')}; CPUs busy with other processes "
        f"in the 3 s before the run: {_pct(end.get('busy_before'))}.",
        "",
        f"{args.workers} workers for fastload and torch (`fastload-1w`: 1), prefetch "
        f"{args.prefetch}, {'shuffled' if not args.no_shuffle else 'sequential'}, "
        f"{args.epochs} epochs per run (steady state = epochs 2..{args.epochs}), "
        f"{args.repeat} fresh-process run(s) per loader, interleaved; medians.",
        "",
        table,
        "",
        _bench.COLUMN_NOTES,
        "",
    ]
    if any(s["loader"] == "torch" for s in summaries):
        coll = next(s["torch_collate"] for s in summaries if s["loader"] == "torch")
        lines += [f"torch: `DataLoader(num_workers={args.workers}, persistent_workers=True, "
                  f"prefetch_factor={args.prefetch})`, collate = {coll}.", ""]
    rat_lines = []
    for w in dict.fromkeys(s["workload"] for s in summaries):
        rat = _bench.ratios({s["loader"]: s for s in summaries if s["workload"] == w})
        if rat:
            rat_lines.append(f"- {w}: " + ", ".join(f"{k} = {v:.3g}x" for k, v in rat.items()))
    if rat_lines:
        lines += ["## Ratios (median samples/s)", "", *rat_lines, ""]
    lines += ["## Targets", "", _bench.render_targets(targets), "",
              f"A boundary counts as a stall when it exceeds {_bench.STALL_FACTOR:g}x the "
              "steady-state p90 batch gap (and 1 ms).", ""]
    cpus = info["cpu_count"] or 1
    notes = []
    if cpus <= args.workers:
        notes.append(f"{cpus} CPUs for {args.workers} workers + the consuming process: "
                     "multi-process loaders cannot scale here, and every loader competes with "
                     "the consumer; `cpu busy` near 100% for an in-process loader means company.")
    notes += end.get("warnings") or []
    if notes:
        lines += ["## Notes", "", *(f"- {m}" for m in notes), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
