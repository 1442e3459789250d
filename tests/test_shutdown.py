"""Exit scenarios, each in a fresh interpreter (as torch's _test_proper_exit does).

The script under test starts a loader whose samples carry the worker's pid, prints the worker
pids, then exits in the scenario's way. The test asserts the return code, no hang, no worker
traceback on stderr, and that every worker is gone within 2 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[1])

PRELUDE = f"""
import os, sys, time
sys.path[:0] = [{REPO!r}, {REPO + "/tests"!r}]
import numpy as np
import fastload
from helpers.shutdown import Slow

def start(method):
    loader = fastload.Loader(Slow(), batch_size=4, num_workers=2, start_method=method)
    it = iter(loader)
    next(it)
    assert len(loader.stats()["shared_dataset"]) == 2  # the scenarios include shared containers
    pids = [p.pid for p in loader._engine.pool.procs]
    print("PIDS", *pids, flush=True)
    return loader, it

def start_pool(method):
    # Two loaders on one shared pool, one of them mid-epoch.
    pool = fastload.Pool(2, start_method=method)
    other = fastload.Loader(Slow(), batch_size=2, pool=pool)
    next(iter(other))
    loader = fastload.Loader(Slow(), batch_size=4, pool=pool)
    it = iter(loader)
    next(it)
    print("PIDS", *[p.pid for p in pool._workers.procs], flush=True)
    return (pool, other, loader), it
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], deadline_s: float) -> list[int]:
    end = time.monotonic() + deadline_s
    alive = pids
    while alive and time.monotonic() < end:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.02)
    return [p for p in pids if _alive(p)]


def _spawn(body: str, tmpdir: Path | None = None) -> subprocess.Popen[str]:
    env = None if tmpdir is None else dict(os.environ, TMPDIR=str(tmpdir))
    return subprocess.Popen(
        [sys.executable, "-c", PRELUDE + body],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # own process group, like a shell job
        env=env,
    )


def _wait_empty(folder: Path, deadline_s: float) -> list[str]:
    end = time.monotonic() + deadline_s
    while os.listdir(folder) and time.monotonic() < end:
        time.sleep(0.02)
    return os.listdir(folder)


def _read_pids(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), (line, proc.stderr.read() if proc.stderr else "")
    return [int(x) for x in line.split()[1:]]


METHODS = ["fork", "forkserver", "spawn"]
#: start(): a loader with its own workers; start_pool(): two loaders on a shared fastload.Pool.
STARTS = ["start", "start_pool"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("start", STARTS)
def test_never_closed(method: str, start: str) -> None:
    proc = _spawn(f"loader, it = {start}({method!r})\nnext(it)\n")
    pids = _read_pids(proc)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert err == ""
    assert _wait_gone(pids, 2.0) == []


@pytest.mark.timeout(60)
def test_exception_out_of_with_block() -> None:
    body = (
        "with fastload.Loader(Slow(), batch_size=4, num_workers=2) as loader:\n"
        "    it = iter(loader); next(it)\n"
        "    print('PIDS', *[p.pid for p in loader._engine.pool.procs], flush=True)\n"
        "    raise ValueError('boom')\n"
    )
    proc = _spawn(body)
    pids = _read_pids(proc)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    assert "ValueError: boom" in err
    assert err.count("Traceback") == 1, err
    assert _wait_gone(pids, 2.0) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("target", ["process", "group"])
@pytest.mark.parametrize("start", STARTS)
def test_ctrl_c(method: str, target: str, start: str) -> None:
    body = f"loader, it = {start}({method!r})\nprint('GO', flush=True)\nfor b in it:\n    pass\n"
    proc = _spawn(body)
    pids = _read_pids(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "GO"
    t0 = time.monotonic()
    if target == "group":
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl+C does
    else:
        os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in err
    assert err.count("Traceback") == 1, err  # the main process's only: none from workers
    assert elapsed < 5.0
    assert _wait_gone(pids, 2.0) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("start", STARTS)
def test_parent_killed(method: str, sig: signal.Signals, start: str, tmp_path: Path) -> None:
    body = f"loader, it = {start}({method!r})\nfor b in it:\n    pass\n"
    proc = _spawn(body, tmp_path)
    pids = _read_pids(proc)
    os.kill(proc.pid, sig)
    proc.communicate(timeout=20)
    assert proc.returncode == -sig
    assert _wait_gone(pids, 2.0) == [], "workers outlived their killed parent"
    # nothing left in $TMPDIR: the fork server's socket directory included (NOTE [forkserver
    # leftovers] in fastload/_fsexit.py), which multiprocessing leaves behind a killed parent
    assert _wait_empty(tmp_path, 2.0) == []
