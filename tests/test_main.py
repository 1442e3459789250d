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


@pytest.mark.parametrize(("args", "said"), [
    (["--n", "0"], "argument --n: must be >= 1, got 0"),
    (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    (["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    (["--n", "-5"], "argument --n: must be >= 1, got -5"),
    (["--workers", "-1"], "argument --workers: must be >= 0, got -1"),
    (["--batch-size", "x"], "argument --batch-size: expected a whole number, got 'x'"),
    (["--builtin", "--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    (["--builtin", "--workers", "-2"], "argument --workers: must be >= 0, got -2"),
])
def test_bench_refuses_counts_below_one_instead_of_running_the_defaults(capsys, args, said):
    # "--n 0" ran the default n (args.n or default): nothing said the flag was ignored.
    from fastload._bench import main as bench_main

    with pytest.raises(SystemExit) as e:
        bench_main(args)
    assert e.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(("args", "said"), [
    (["--batch-size", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["--workers", "0"], "argument --workers: must be >= 1, got 0"),
    (["--workers", "-3"], "argument --workers: must be >= 1, got -3"),
    (["--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
    (["--seconds", "0"], "argument --seconds: must be a number > 0, got 0"),
    (["--memory-seconds", "-1"], "argument --memory-seconds: must be a number > 0, got -1"),
    (["--seconds", "nan"], "argument --seconds: must be a number > 0, got nan"),
])
def test_doctor_refuses_counts_and_durations_out_of_range(capsys, args, said):
    from fastload._doctor import main as doctor_main

    with pytest.raises(SystemExit) as e:
        doctor_main(["fastload:tiny", *args])
    assert e.value.code == 2
    assert said in capsys.readouterr().err


def test_info_names_the_core_and_numpy():
    proc = subprocess.run([sys.executable, "-m", "fastload", "info"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "compiled core:" in proc.stdout and "numpy:" in proc.stdout
    rows = {ln.split(":", 1)[0].strip(): ln.split(":", 1)[1].strip()
            for ln in proc.stdout.splitlines()[1:] if ":" in ln}
    for name in ("installed at", "build", "torch", "chainer", "accelerate", "lightning",
                 "cgroup memory", "cgroup cpu"):
        assert rows.get(name), f"no {name!r} row in:\n{proc.stdout}"
    import fastload
    from fastload import _ring

    assert rows["installed at"].startswith(str(__import__("pathlib").Path(fastload.__file__)
                                               .parent))
    assert f"Cython {_ring.CYTHON_VERSION}" in rows["build"] and _ring.CYTHON_VERSION[0] == "3"


@pytest.mark.parametrize(("files", "mem", "cpu"), [
    ({"/sys/fs/cgroup/memory.max": "1073741824", "/sys/fs/cgroup/cpu.max": "150000 100000"},
     "1,024 MiB", "1.5 CPUs (150000/100000 us)"),
    ({"/sys/fs/cgroup/memory.max": "max", "/sys/fs/cgroup/cpu.max": "max 100000"},
     "none", "none"),
    ({"/sys/fs/cgroup/memory/memory.limit_in_bytes": str(2**63 - 4096),
      "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "200000",
      "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, "none", "2 CPUs (200000/100000 us)"),
    ({}, "unknown (no cgroup memory controller readable)",
     "unknown (no cgroup cpu controller readable)"),
])
def test_info_reads_cgroup_v1_and_v2_limits(monkeypatch, files, mem, cpu):
    from fastload import __main__ as cli

    monkeypatch.setattr(cli, "_read", files.get)
    assert cli._cgroup_limits() == (mem, cpu)


def _summary(loader: str, rate: float, others: float = 0.0, kernel: float = 0.0) -> dict:
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    h = importlib.import_module("_harness")
    st = h._stat
    return {"workload": "image", "loader": loader, "workers": 2, "start_method": "fork",
            "batch_size": 128, "bytes_per_sample": 150536,
            "samples_per_s": st([rate]), "first_batch_ms": st([180.0]),
            "boundary_ms": st([16.5]), "peak_pss_mib": st([150.0]),
            "faults_per_batch": st([377.0]), "cpu_others_steady": st([others]),
            "sys_frac_steady": st([kernel])}


def _console(*summaries: dict) -> str:
    import importlib

    return importlib.import_module("_harness").render_console(list(summaries))


def test_the_bench_table_fits_100_columns_and_every_column_has_a_legend():
    text = _console(_summary("fastload", 14588), _summary("single", 21015),
                    _summary("torch", 4897))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    header = lines[0].split()
    for column in ("samples/s", "vs", "torch", "single", "1st", "batch", "epoch", "gap",
                   "peak", "PSS", "faults/b"):
        assert column in header
    legend = {line.split(":")[0] for line in lines[5:] if ":" in line}
    assert legend >= {"samples/s", "vs torch", "vs single", "1st batch", "epoch gap",
                      "peak PSS", "faults/b"}
    assert "2.98x" in lines[1] and "0.69x" in lines[1]  # fastload vs torch, vs single
    assert "warning" not in text  # a quiet machine, a baseline not bound by page faults


def test_the_bench_warns_when_others_use_the_cpus_or_the_baseline_is_fault_bound():
    busy = _console(_summary("fastload", 100.0, others=0.6), _summary("single", 50.0))
    assert "warning: other processes kept up to 60% of the CPUs busy" in busy
    bound = _console(_summary("fastload", 100.0), _summary("single", 50.0, kernel=0.7))
    assert "spent 70% of its CPU time in the kernel" in bound and "page-fault-bound" in bound
    assert max(len(line) for line in bound.splitlines()) <= 100
