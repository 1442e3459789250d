"""``python -m fastload``: the built-in benchmark an installed wheel runs, and ``info``."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_builtin_bench_runs_without_the_benchmarks_directory():
    # --builtin: what an installed wheel runs (it has no benchmarks/ directory to delegate to).
    proc = subprocess.run(
        [sys.executable, "-m", "fastload", "bench", "--builtin", "--quick", "--workload", "tiny",
         "--epochs", "2"],
        capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rows = {ln.split()[0]: ln for ln in lines if ln.startswith(("fastload (", "single-process"))}
    assert set(rows) == {"fastload", "single-process"}, proc.stdout
    assert rows["single-process"].rstrip().endswith("1.00x")
    assert any(ln.startswith("samples/s: median") for ln in lines)  # the legend
    assert max(len(ln) for ln in lines if not ln.startswith("note")) <= 100


def test_builtin_bench_rejects_bad_arguments():
    proc = subprocess.run([sys.executable, "-m", "fastload", "bench", "--builtin", "--epochs", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--epochs must be >= 2" in proc.stderr


def test_info_names_the_core_and_numpy():
    proc = subprocess.run([sys.executable, "-m", "fastload", "info"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "compiled core:" in proc.stdout and "numpy:" in proc.stdout
