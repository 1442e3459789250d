"""Shared fixtures: a leak check around every test, and the start_method parametrization."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import sys
import time

import pytest

# Test modules import the ``helpers`` package by name; spawn/forkserver children inherit this sys.path, so
# they can unpickle the helper datasets (pytest's importlib mode does not touch sys.path).
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from helpers import shm  # noqa: E402 - after the path it is found by

#: This run's mark on the multiprocessing semaphores of its processes (NOTE [own /dev/shm
#: entries] in tests/helpers/shm.py): set before any test creates a process.
SHM_MARK = shm.mark_process_tree()

START_METHODS = ["fork", "forkserver", "spawn"]
_CHILD_EXIT_GRACE_S = 3.0


def _fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own directory fd, already closed
            continue
    return out


def _os_children() -> set[int]:
    """Every direct child pid of this process (zombies included), where Linux exposes them."""
    pids: set[int] = set()
    try:
        tids = os.listdir("/proc/self/task")
    except FileNotFoundError:  # pragma: no cover
        return pids
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return pids


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.fixture(scope="session", autouse=True)
def _multiprocessing_infrastructure():
    """Start the forkserver and the resource tracker once, before any snapshot: they are
    per-interpreter singletons (a process and a few fds that live until exit), not leaks."""
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()
    forkserver.ensure_running()
    yield


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Fail a test that leaves child processes, file descriptors or /dev/shm entries behind (its
    own: NOTE [own /dev/shm entries] in tests/helpers/shm.py)."""
    gc.collect()
    children_before = {p.pid for p in mp.active_children()}
    os_children_before = _os_children()
    fds_before = _fds()
    shm_before = shm.snapshot()
    yield
    gc.collect()
    problems = []

    deadline = time.monotonic() + _CHILD_EXIT_GRACE_S
    leaked = [p for p in mp.active_children() if p.pid not in children_before]
    for p in leaked:
        p.join(max(0.0, deadline - time.monotonic()))
    leaked = [p for p in mp.active_children() if p.pid not in children_before]
    if leaked:
        problems.append(
            "child processes still alive %.0f s after the test: %s"
            % (_CHILD_EXIT_GRACE_S, [(p.name, p.pid) for p in leaked])
        )
        for p in leaked:  # do not let the leak cascade into the next tests
            p.kill()
            p.join(5)

    stray = sorted(pid for pid in _os_children() - os_children_before if _pid_alive(pid))
    if stray:
        problems.append(f"processes forked by the test are still alive: pids {stray}")

    fds_after = _fds()
    if len(fds_after) > len(fds_before):
        new_fds = {fd: t for fd, t in fds_after.items() if fds_before.get(fd) != t}
        problems.append(
            f"file descriptors leaked ({len(fds_before)} open before, {len(fds_after)} after): "
            f"{new_fds}"
        )

    new_shm = shm.own_new_entries(shm_before, SHM_MARK)
    if new_shm:
        problems.append(f"new /dev/shm entries: {new_shm}")

    if problems and getattr(request.node, "_fastload_call_failed", False):
        # The failure's traceback keeps the test's frames (and loaders) alive: what looks like a
        # leak here is a consequence of that failure, already reported. Leaked children were
        # killed above so that the next tests start clean.
        return
    if problems:
        pytest.fail(f"{request.node.nodeid} leaked resources:\n  " + "\n  ".join(problems),
                    pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item._fastload_call_failed = rep.failed


@pytest.fixture(params=START_METHODS)
def start_method(request) -> str:
    return request.param
