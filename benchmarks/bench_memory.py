#!/usr/bin/env python3
"""Memory of a dataset kept as Python objects: fastload's ``share_dataset`` against a plain
fork (fastload ``share_dataset=False``, torch's DataLoader) and against spawn.

    python benchmarks/bench_memory.py [--items 2000000] [--repeat 3] [--configs a,b,...]

The dataset is COCO-like metadata: ``--items`` dicts ``{"path": str, "h": int, "w": int,
"boxes": [[x, y, w, h], ...] (0..20 boxes of Python floats), "label": int}`` in one Python list
attribute of a module-level class (so spawn can pickle it), built deterministically from a seed
inside the measured process (the build is timed, and not counted in the first batch).
``__getitem__(i)`` reads item i and returns fixed-shape arrays: float32 ``(5,)`` = (box count,
sum of the boxes, h, w, len(path)) and the label, so both loaders stack batches. 2 epochs,
shuffled, every item read once per epoch, 4 workers, batch size 256.

Configurations (``--configs``; each run in a fresh interpreter, the configurations interleaved
within each repeat and rotated from one repeat to the next):

* ``fastload``: ``fastload.Loader`` with the default ``share_dataset=True``, ``start_method="fork"``
* ``fastload-noshare``: ``share_dataset=False``, fork
* ``fastload-spawn``: ``share_dataset=True``, ``start_method="spawn"``
* ``torch-fork`` / ``torch-spawn``: ``torch.utils.data.DataLoader(num_workers=4,
  persistent_workers=True, multiprocessing_context=...)``, default collate

Measured in the process itself, outside the timed spans: at the end of epoch 1 and of epoch 2
(workers alive; persistent in both loaders) the USS of each worker and the PSS of the whole
process tree (main + workers + any helper such as multiprocessing's resource tracker), from
``/proc/<pid>/smaps_rollup`` (``fastload._memory.process_memory``). Worker pids: fastload's
``loader.memory()``; for torch psutil's children when psutil is installed, else the main
process's children from ``/proc/<pid>/task/*/children`` (the resource tracker excluded). Times:
loader construction -> first batch (for fastload this includes building the shared containers),
epoch 1 wall time (from construction, so it includes start-up) and epoch 2 wall time.
Reported: medians over ``--repeat`` runs, and the ratios fastload / torch-fork total PSS,
fastload / torch-fork USS growth (epoch 1 end -> epoch 2 end, mean over workers) and
torch-spawn / fastload-spawn time to the first batch.

Memory guard: a thread of the launching process reads MemAvailable every 0.1 s; below
``--min-available-gib`` (3) it records the tree's PSS, sends the measured process SIGUSR1 (it
stops and reports), SIGKILLs its workers, and the configuration is reported as stopped (the
PSS then is a lower bound of what it would have taken).

Writes (or updates: a section per command line) ``benchmarks/results/memory.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (makes fastload importable from a checkout)
from _harness import _children, _tree  # noqa: E402

from fastload._memory import process_memory  # noqa: E402

CONFIGS = ["fastload", "fastload-noshare", "fastload-spawn", "torch-fork", "torch-spawn"]
RESULT_PREFIX = "#bench-memory-result "
MIB = 2**20
GIB = 2**30


# ---------------------------------------------------------------------------------------------
# The dataset
# ---------------------------------------------------------------------------------------------
class CocoLike:
    """``n`` COCO-like annotation dicts in a Python list, built from ``seed``."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        counts = rng.integers(0, 21, n)
        hs = rng.integers(240, 641, n)
        ws = rng.integers(240, 641, n)
        labels = rng.integers(0, 80, n)
        total = int(counts.sum())
        owner = np.repeat(np.arange(n), counts)
        size = np.stack([ws[owner], hs[owner]], axis=1).astype(np.float64)
        xy = rng.random((total, 2)) * size * 0.9
        wh = rng.random((total, 2)) * (size - xy)
        boxes = np.round(np.concatenate([xy, wh], axis=1), 2).tolist()  # lists of 4 floats
        del owner, size, xy, wh
        o = np.concatenate([[0], np.cumsum(counts)]).tolist()
        self.items = [
            {"path": f"train2017/{i:012d}.jpg", "h": h, "w": w, "boxes": boxes[o[i]:o[i + 1]],
             "label": lab}
            for i, (h, w, lab) in enumerate(zip(hs.tolist(), ws.tolist(), labels.tolist()))
        ]
        self.label_sum = int(labels.sum())
        self.box_count = total

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        item = self.items[i]
        b = np.asarray(item["boxes"], np.float32).reshape(-1, 4)
        summary = np.array([len(b), b.sum(), item["h"], item["w"], len(item["path"])],
                           np.float32)
        return summary, item["label"]


# ---------------------------------------------------------------------------------------------
# One configuration, in the measured process
# ---------------------------------------------------------------------------------------------
class _MemoryStop(BaseException):
    """Raised by SIGUSR1: the launching process saw MemAvailable under the guard."""


def _on_usr1(signum: int, frame: Any) -> None:
    raise _MemoryStop


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _child_workers() -> list[int]:
    """The main process's worker children (psutil if installed, else /proc)."""
    try:
        import psutil

        pids = [c.pid for c in psutil.Process().children()]
    except ImportError:
        pids = _children(os.getpid())
    return sorted(p for p in pids if b"resource_tracker" not in _cmdline(p)
                  and b"forkserver" not in _cmdline(p))


def _snapshot(worker_pids: list[int]) -> dict[str, Any]:
    tree = _tree(os.getpid())
    mems = {p: process_memory(p) for p in tree}
    return {
        "tree_pids": len(tree),
        "tree_pss": sum(m["pss"] for m in mems.values() if m),
        "main_pss": (mems.get(os.getpid()) or {}).get("pss"),
        "workers": worker_pids,
        "worker_uss": [(process_memory(p) or {}).get("uss") for p in worker_pids],
    }


def run_case(config: str, items: int, seed: int, epochs: int, workers: int,
             batch_size: int) -> dict[str, Any]:
    signal.signal(signal.SIGUSR1, _on_usr1)
    rec: dict[str, Any] = {"config": config, "items": items, "phase": "build"}
    caught: list[str] = []

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Any = None) -> None:
        caught.append(f"{category.__name__}: {message}")
        print(f"  [{config}] {category.__name__}: {message}", file=sys.stderr, flush=True)

    warnings.showwarning = show
    warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
    loader: Any = None
    try:
        t = time.perf_counter()
        ds = CocoLike(items, seed)
        rec["build_s"] = time.perf_counter() - t
        rec["phase"] = "start"
        t0 = time.perf_counter()
        if config.startswith("fastload"):
            import fastload

            loader = fastload.Loader(
                ds, batch_size, shuffle=True, seed=seed, num_workers=workers,
                start_method="spawn" if config.endswith("spawn") else "fork",
                share_dataset=config != "fastload-noshare")
            rec["shared"] = loader.stats().get("shared_dataset")

            def pids() -> list[int]:
                return sorted(w["pid"] for w in loader.memory()["workers"]
                              if w.get("pid") is not None)
        else:
            import torch

            loader = torch.utils.data.DataLoader(
                ds, batch_size, shuffle=True, num_workers=workers, persistent_workers=True,
                multiprocessing_context=config.split("-")[1],
                generator=torch.Generator().manual_seed(seed))
            pids = _child_workers
        first = None
        rec["epoch_s"], rec["snapshots"] = [], []
        for e in range(epochs):
            rec["phase"] = f"epoch {e + 1}"
            te = time.perf_counter()
            n = labels = boxes = 0
            for b in loader:
                if first is None:
                    first = time.perf_counter() - t0
                    rec["first_batch_s"] = first
                s, y = np.asarray(b[0]), np.asarray(b[1])
                n += len(y)
                labels += int(y.sum())
                boxes += int(s[:, 0].astype(np.int64).sum())
            end = time.perf_counter()
            rec["epoch_s"].append(end - (t0 if e == 0 else te))
            if (n, labels, boxes) != (items, ds.label_sum, ds.box_count):
                raise AssertionError(f"epoch {e + 1}: {n} samples, label sum {labels}, "
                                     f"{boxes} boxes; expected {items}, {ds.label_sum}, "
                                     f"{ds.box_count}")
            rec["snapshots"].append(_snapshot(pids()))
            print(f"  [{config}] epoch {e + 1}/{epochs}: {rec['epoch_s'][-1]:.1f} s, tree PSS "
                  f"{rec['snapshots'][-1]['tree_pss'] / GIB:.2f} GiB", file=sys.stderr,
                  flush=True)
        if config.startswith("fastload"):
            m = loader.memory()
            rec["fastload_memory"] = {"total_pss": m["total_pss"],
                                      "shared_dataset_bytes": m["shared_dataset_bytes"],
                                      "uss_growth": [w.get("uss_growth") for w in m["workers"]]}
        rec["phase"] = "done"
    except _MemoryStop:
        rec["stopped"] = f"MemAvailable under the guard during {rec['phase']}"
        if "t0" in locals():
            rec["stopped_after_s"] = time.perf_counter() - t0  # since the loader's construction
    except BaseException as e:  # reported, not raised: the launcher prints it
        rec["error"] = f"{type(e).__name__}: {e} (during {rec['phase']})"
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        try:
            if loader is not None and config.startswith("fastload"):
                loader.close()
            loader = None
        except BaseException as e:
            rec.setdefault("error", f"close: {type(e).__name__}: {e}")
    rec["warnings"] = caught
    return rec


# ---------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------
def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def run_one(case: dict[str, Any], min_available: int, timeout: float) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter under the memory guard."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--case", json.dumps(case)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    guard: dict[str, Any] = {"min_available": mem_available()}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            avail = mem_available()
            guard["min_available"] = min(guard["min_available"], avail)
            if avail < min_available and "tripped" not in guard:
                tree = _tree(proc.pid)
                guard["tripped"] = avail
                guard["pss_at_stop"] = sum((process_memory(p) or {}).get("pss", 0) for p in tree)
                workers = [p for p in tree[1:] if b"resource_tracker" not in _cmdline(p)]
                for sig, pids in ((signal.SIGUSR1, tree[:1]), (signal.SIGKILL, workers)):
                    for p in pids:
                        try:
                            os.kill(p, sig)
                        except OSError:
                            pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        guard["timeout"] = True
    except BaseException:  # interrupted: the run's own session goes with the launcher
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        done.set()
        watcher.join()
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
    rec = json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else {
        "config": case["config"], "error": f"no result (exit code {proc.returncode})"}
    try:  # nothing of the run may outlive it (workers of a killed process)
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    rec["min_available_gib"] = guard["min_available"] / GIB
    if "tripped" in guard:
        rec["stopped"] = (f"stopped: MemAvailable {guard['tripped'] / GIB:.2f} GiB < "
                          f"{min_available / GIB:g} GiB during {rec.get('phase', '?')}")
        rec["pss_at_stop"] = guard["pss_at_stop"]
        rec.pop("error", None)  # whatever the stop made fail in the process
    if guard.get("timeout"):
        rec["error"] = f"timed out after {timeout:.0f} s (during {rec.get('phase', '?')})"
    return rec


def _ok(r: dict[str, Any]) -> bool:
    return "stopped" not in r and "error" not in r


def _metrics(r: dict[str, Any]) -> dict[str, float]:
    s1, s2 = r["snapshots"][0], r["snapshots"][-1]
    grow = [b - a for a, b in zip(s1["worker_uss"], s2["worker_uss"])
            if a is not None and b is not None]
    uss2 = [u for u in s2["worker_uss"] if u is not None]
    return {
        "build_s": r["build_s"],
        "first_batch_s": r["first_batch_s"],
        "epoch1_s": r["epoch_s"][0],
        "epoch2_s": r["epoch_s"][-1],
        "tree_pss": s2["tree_pss"],
        "main_pss": s2["main_pss"],
        "worker_uss": statistics.mean(uss2) if uss2 else float("nan"),
        "uss_growth": statistics.mean(grow) if grow else float("nan"),
        "shared": sum(c["bytes"] for c in r.get("shared") or []),
        "workers": len(s2["workers"]),
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out = {}
    for cfg, rs in runs.items():
        good = [_metrics(r) for r in rs if _ok(r)]
        med = {k: statistics.median(m[k] for m in good) for k in good[0]} if good else {}
        stops = [r for r in rs if not _ok(r)]
        out[cfg] = {"median": med, "ok": len(good), "runs": len(rs), "stops": stops}
    return out


def _mib(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x / MIB:,.0f}"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(summary: dict[str, dict[str, Any]]) -> str:
    header = ["config", "ok runs", "build s", "first batch s", "epoch 1 s (incl. start)",
              "epoch 2 s", "total PSS MiB", "main PSS MiB", "worker USS MiB (mean)",
              "USS growth ep1->ep2 MiB (mean)", "shared MiB"]
    rows = []
    for cfg, s in summary.items():
        m = s["median"]
        if not m:
            # what the stopped runs got to: build, first batch, epoch 1, and the PSS at the stop
            def got(key: str, st: list[dict[str, Any]] = s["stops"]) -> str:
                vals = [r[key] for r in st if r.get(key) is not None]
                return _s(statistics.median(vals)) if vals else "-"

            ep1 = [r["epoch_s"][0] for r in s["stops"] if r.get("epoch_s")]
            pss = [r["pss_at_stop"] for r in s["stops"] if "pss_at_stop" in r]
            what = f">= {max(pss) / MIB:,.0f} (stopped)" if pss else "-"
            rows.append([cfg, f"0/{s['runs']}", got("build_s"), got("first_batch_s"),
                         _s(statistics.median(ep1)) if ep1 else "-", "-", what, "-", "-", "-",
                         "-"])
            continue
        rows.append([cfg, f"{s['ok']}/{s['runs']}", _s(m["build_s"]), _s(m["first_batch_s"]),
                     _s(m["epoch1_s"]), _s(m["epoch2_s"]), _mib(m["tree_pss"]),
                     _mib(m["main_pss"]), _mib(m["worker_uss"]), _mib(m["uss_growth"]),
                     _mib(m["shared"]) if cfg.startswith("fastload") else "-"])
    return _common.markdown_table(header, rows, "lr" + "r" * (len(header) - 2))


def ratios(summary: dict[str, dict[str, Any]]) -> list[list[str]]:
    def med(cfg: str, key: str) -> float | None:
        m = summary.get(cfg, {}).get("median") or {}
        return m.get(key)

    def stopped(cfg: str, key: str) -> float | None:
        """The largest ``key`` of cfg's stopped runs that never reached its first batch (for
        stopped_after_s) or any stopped run (pss_at_stop)."""
        vals = [r[key] for r in summary.get(cfg, {}).get("stops", []) if key in r
                and (key != "stopped_after_s" or r.get("first_batch_s") is None)]
        return max(vals) if vals else None

    def bound(name: str, a: float | None, b: float | None, target: float, op: str) -> list[str]:
        """A bound of a/b from a configuration stopped by the guard (b from its stop)."""
        if a is None or not b:
            return [name, "n/a", f"{op} {target:g}", "-"]
        r = a / b
        met = r <= target if op == "<=" else r >= target
        return [name, f"{op} {r:.3f} (a bound: stopped run)", f"{op} {target:g}",
                "met" if met else "bound inconclusive"]

    out = []
    a, b = med("fastload", "tree_pss"), med("torch-fork", "tree_pss")
    if b is None and stopped("torch-fork", "pss_at_stop"):
        # torch-fork took at least its PSS at the stop: fastload / that is an upper bound
        out.append(bound("fastload / torch-fork total PSS", a,
                         stopped("torch-fork", "pss_at_stop"), 0.35, "<="))
    else:
        out.append(_ratio_row("fastload / torch-fork total PSS", a, b, 0.35, "<="))
    out.append(_ratio_row("fastload / torch-fork worker USS growth",
                          med("fastload", "uss_growth"), med("torch-fork", "uss_growth"), 0.05,
                          "<=", pct=True))
    a, b = med("torch-spawn", "first_batch_s"), med("fastload-spawn", "first_batch_s")
    if a is None and stopped("torch-spawn", "stopped_after_s"):
        # stopped before its first batch: it would have taken longer than it had run
        out.append(bound("torch-spawn / fastload-spawn first batch",
                         stopped("torch-spawn", "stopped_after_s"), b, 10, ">="))
    else:
        out.append(_ratio_row("torch-spawn / fastload-spawn first batch", a, b, 10, ">="))
    out.append(_ratio_row("fastload-noshare / torch-fork total PSS (same fork, no sharing)",
                          med("fastload-noshare", "tree_pss"), med("torch-fork", "tree_pss"),
                          None, ""))
    return out


def _ratio_row(name: str, a: float | None, b: float | None, target: float | None, op: str,
               pct: bool = False) -> list[str]:
    tgt = "-" if target is None else f"{op} {target:.0%}" if pct else f"{op} {target:g}"
    if a is None or b is None or not b:
        return [name, "n/a", tgt, "-"]
    r = a / b
    val = f"{r:.1%}" if pct else f"{r:.3f}"
    if target is None:
        return [name, val, "-", "-"]
    met = r <= target if op == "<=" else r >= target
    return [name, val, tgt, "met" if met else "missed"]


def per_run_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    rows = []
    for cfg, rs in runs.items():
        for i, r in enumerate(rs):
            if _ok(r):
                m = _metrics(r)
                rows.append([cfg, str(i + 1), _s(m["build_s"]), _s(m["first_batch_s"]),
                             _s(m["epoch1_s"]), _s(m["epoch2_s"]), _mib(m["tree_pss"]),
                             _mib(m["uss_growth"]), f"{r['min_available_gib']:.1f}", ""])
            else:
                why = r.get("stopped") or r.get("error", "?")
                pss = _mib(r.get("pss_at_stop")) if "pss_at_stop" in r else "-"
                rows.append([cfg, str(i + 1), _s(r.get("build_s")), _s(r.get("first_batch_s")),
                             _s(r["epoch_s"][0]) if r.get("epoch_s") else "-", "-", pss, "-", f"{r['min_available_gib']:.1f}", why])
    return _common.markdown_table(
        ["config", "repeat", "build s", "first batch s", "epoch 1 s", "epoch 2 s",
         "total PSS MiB", "USS growth MiB", "min MemAvailable GiB", "note"], rows,
        "lrrrrrrrrl")


def _meminfo_total() -> str:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    return "?"


def _git_state() -> str:
    """The commit fastload was measured at, and which of its files had uncommitted changes."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=_common.REPO, capture_output=True, text=True,
                              timeout=30).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "fastload").splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    changed = ", ".join(ln[3:] for ln in dirty)
    return f"{head}" + (f" with uncommitted changes to {changed}" if changed else "")


def write_section(path: str, cmd: str, body: str) -> None:
    """Replace the section of ``cmd`` in ``path`` (or append one)."""
    marker = f"<!-- run: {cmd} -->"
    title = ("# Memory of a dataset of Python objects in workers\n\n"
             "Written by `benchmarks/bench_memory.py` (its docstring says how it measures); "
             "one section per command line, the latest run of each.\n")
    sections: list[str] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        sections = ["<!-- run: " + s for s in text.split("<!-- run: ")[1:]]
    new = f"{marker}\n{body.rstrip()}\n"
    for i, s in enumerate(sections):
        if s.startswith(marker + "\n"):
            sections[i] = new
            break
    else:
        sections.append(new)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(title + "\n" + "\n".join(sections))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=2_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-available-gib", type=float, default=3.0,
                   help="stop a configuration when MemAvailable drops under this (GiB)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per configuration")
    p.add_argument("--out", default=None,
                   help="markdown output (default benchmarks/results/memory.md; '-': none)")
    p.add_argument("--case", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        rec = run_case(**json.loads(args.case))
        print(RESULT_PREFIX + json.dumps(rec), flush=True)
        return 0
    configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad or args.epochs < 2 or args.repeat < 1 or args.items < args.batch_size:
        p.error(f"unknown configs {bad}" if bad else "--epochs >= 2, --repeat >= 1, "
                "--items >= --batch-size")
    if any(c.startswith("torch") for c in configs):
        try:
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                raise ImportError
        except ImportError:
            print("torch is not installed: its configurations are left out", file=sys.stderr)
            configs = [c for c in configs if not c.startswith("torch")]
    cmd = "python benchmarks/bench_memory.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    cmd = cmd.strip()
    info = _common.machine_info()
    started = _dt.datetime.now().isoformat(timespec="seconds")
    print(f"{cmd}\nN={args.items:,} items, {args.workers} workers, batch {args.batch_size}, "
          f"{args.epochs} epochs; nproc {os.cpu_count()}, MemTotal {_meminfo_total()}, "
          f"MemAvailable {mem_available() / GIB:.1f} GiB", flush=True)
    min_avail = int(args.min_available_gib * GIB)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # runs the cleanup of run_one
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    t_all = time.perf_counter()
    for rep in range(args.repeat):
        for cfg in configs[rep % len(configs):] + configs[:rep % len(configs)]:
            case = dict(config=cfg, items=args.items, seed=args.seed, epochs=args.epochs,
                        workers=args.workers, batch_size=args.batch_size)
            if mem_available() < min_avail:
                r = {"config": cfg, "min_available_gib": mem_available() / GIB,
                     "stopped": "not started: MemAvailable under the guard"}
            else:
                r = run_one(case, min_avail, args.timeout)
            runs[cfg].append(r)
            if _ok(r):
                m = _metrics(r)
                print(f"repeat {rep + 1}/{args.repeat} {cfg:17s} build {m['build_s']:6.1f} s  "
                      f"first batch {m['first_batch_s']:6.2f} s  epochs {m['epoch1_s']:6.1f} / "
                      f"{m['epoch2_s']:6.1f} s  total PSS {m['tree_pss'] / MIB:8,.0f} MiB  "
                      f"USS growth {m['uss_growth'] / MIB:7,.1f} MiB", flush=True)
            else:
                print(f"repeat {rep + 1}/{args.repeat} {cfg:17s} "
                      f"{r.get('stopped') or r.get('error')}", flush=True)
            time.sleep(1.0)
    wall = time.perf_counter() - t_all
    summary = summarize(runs)
    table = render(summary)
    rat = _common.markdown_table(["ratio (medians)", "value", "target", ""], ratios(summary),
                                 "lrrl")
    per_run = per_run_table(runs)
    warned = sorted({w for rs in runs.values() for r in rs for w in r.get("warnings", [])})
    print("\n" + table + "\n\n" + rat + "\n\n" + per_run)
    print(f"\nwall time {wall / 60:.1f} min")
    if args.out != "-":
        out = args.out or os.path.join(_common.RESULTS_DIR, "memory.md")
        machine = (f"nproc {os.cpu_count()}, MemTotal {_meminfo_total()}, "
                   f"{info.get('processor')}, Python {info['python']}, NumPy {info['numpy']}, "
                   f"fastload {info['fastload']} (git {_git_state()}), torch {info.get('torch')}, load average at "
                   f"the end {info.get('loadavg')}")
        body = (f"## `{cmd}`\n\n{started}, {wall / 60:.1f} min. N = {args.items:,} items, "
                f"{args.workers} workers, batch size {args.batch_size}, {args.epochs} epochs "
                f"(shuffled), medians of {args.repeat} fresh-process run(s) per "
                f"configuration, configurations interleaved.\n\nMachine: {machine}.\n\n"
                f"{table}\n\n{rat}\n\nEach run:\n\n{per_run}\n")
        if warned:
            body += "\nWarnings the runs printed:\n\n" + "\n".join(
                f"- `{w}`" for w in warned) + "\n"
        write_section(out, cmd, body)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
