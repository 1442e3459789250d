"""Shared helpers of the benchmark scripts: timing, statistics, machine info, JSON lines,
and running one case in a fresh interpreter.

The measurement loop itself (and the workloads) live in ``_harness.py``, which
``python -m fastload bench`` also runs from a checkout, so both measure the same way.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS_DIR = os.path.join(HERE, "results")


def ensure_fastload_importable() -> None:
    """Let ``python benchmarks/x.py`` work from a checkout built in place without PYTHONPATH."""
    try:
        import fastload  # noqa: F401
    except ImportError:
        sys.path.insert(0, REPO)
        import fastload  # noqa: F401


ensure_fastload_importable()

import _harness as _bench  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
now_ns = time.perf_counter_ns


class Timer:
    """``with Timer() as t: ...``; then ``t.ns`` / ``t.s``."""

    def __enter__(self) -> Timer:
        self.start = now_ns()
        self.ns = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self.ns = now_ns() - self.start

    @property
    def s(self) -> float:
        return self.ns / 1e9


def time_repeat(fn: Callable[[], Any], *, warmup: int = 1, repeat: int = 5) -> list[int]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeat`` times; return each call's ns."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = now_ns()
        fn()
        out.append(now_ns() - t0)
    return out


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------
def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile, ``p`` in [0, 100] (NumPy's default method)."""
    return _bench._quantile(values, p / 100.0)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def summarize(values: Iterable[float | None]) -> dict[str, float]:
    """median / p10 / p90 / min / max / mean / n of the non-missing values."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return {**_bench._stat(vals), "mean": sum(vals) / len(vals) if vals else math.nan}


# ---------------------------------------------------------------------------------------------
# Machine info and output
# ---------------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    """cpu count, python, numpy, fastload, torch (if installed; not imported), load average."""
    return _bench.machine_info()


def default_json_path(prefix: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join(RESULTS_DIR, f"{prefix}-{stamp}.json")


class JsonLines:
    """Appends one JSON object per line; every record gets ``run_id`` and a ``type``.

    The first record of a run is ``{"type": "machine", ...}`` with :func:`machine_info`.
    """

    def __init__(self, path: str | None, argv: Sequence[str] | None = None) -> None:
        self.path = path
        self.run_id = uuid.uuid4().hex[:12]
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self.write("machine", {
                **machine_info(),
                "argv": list(argv if argv is not None else sys.argv),
                "time": _dt.datetime.now().isoformat(timespec="seconds"),
            })

    def write(self, kind: str, record: dict[str, Any]) -> None:
        if not self.path:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"type": kind, "run_id": self.run_id, **record}, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    return str(o)


# ---------------------------------------------------------------------------------------------
# Fresh-process cases
# ---------------------------------------------------------------------------------------------
def run_case_subprocess(
    script: str,
    case: dict[str, Any],
    *,
    timeout: float = 600.0,
    on_progress: Callable[[int, int], None] | None = None,
    pss_interval: float = 0.02,
) -> dict[str, Any]:
    """Run ``python SCRIPT --case JSON`` and return the case's result dict (with ``pss``, the
    peak PSS of the child's process tree, unless ``pss_interval`` is 0).

    The script must hand ``--case`` to :func:`_harness.case_entry`, which prints
    progress and result lines; RuntimeError (with the child's stderr) when it fails.
    """
    return _bench.run_case_subprocess(
        case, argv=[sys.executable, script, "--case"], timeout=timeout, on_progress=on_progress,
        pss_interval=pss_interval,
    )


def run_fresh(script: str, case: dict[str, Any], timeout: float = 900.0) -> dict[str, Any]:
    """Run ``python SCRIPT --case JSON`` (a script printing its result as the last JSON line)
    and return that result; RuntimeError with the child's output when it fails."""
    import subprocess

    proc = subprocess.run([sys.executable, script, "--case", json.dumps(case)],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{os.path.basename(script)} --case {json.dumps(case)} failed:\n"
                           f"{proc.stdout}{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def time_epochs(epoch: Callable[[], int], n: int, epochs: int, t0: float,
                close: Callable[[], Any]) -> tuple[float, float]:
    """Run ``epoch()`` (samples it delivered, must be ``n``) ``epochs`` times, then ``close()``:
    (median samples/s over epochs 2.., seconds from ``t0`` to the end of the first)."""
    import statistics

    rates, first = [], 0.0
    try:
        for e in range(epochs):
            t = time.perf_counter()
            got = epoch()
            assert got == n, (got, n)
            if e == 0:
                first = time.perf_counter() - t0
            else:
                rates.append(got / (time.perf_counter() - t))
    finally:
        close()
    return statistics.median(rates), first


fmt_rate = _bench._rate


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one char per column, 'l' or 'r'."""
    return _bench._md_table([str(h) for h in header], [[str(c) for c in r] for r in rows],
                            align or "l" + "r" * (len(header) - 1))
