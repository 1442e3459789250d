"""Module-level, picklable datasets and callables of the fastload tests, by theme.

Everything here is importable by name (conftest.py puts ``tests/`` on ``sys.path``, which
spawn/forkserver workers inherit), so workers can unpickle it. This module holds what they all
share: the per-test timeout, the one "misbehave the first N times" mechanism and the one stderr
silencer of crashing helpers.

Helpers that must misbehave only the first time(s) (so that "the next epoch completes" can be
checked) take a flag path: the first process to create that file (O_EXCL, so exactly one wins
across all workers) misbehaves and records ``"<pid> <time.monotonic()>"`` in it; every later call
behaves. ``time.monotonic()`` is CLOCK_MONOTONIC, shared by every process on the machine, so the
parent can measure how long after the crash it noticed.
"""

from __future__ import annotations

import os
import time

#: Per-test timeout for tests that start worker processes (60 s); set FASTLOAD_TEST_TIMEOUT lower
#: to get through a run quickly when a hang bug is present.
MP_TIMEOUT = int(os.environ.get("FASTLOAD_TEST_TIMEOUT", "60"))


def claim(flag_path: str | None, times: int = 1) -> bool:
    """True for the first ``times`` callers per flag, across every process (always True without
    a flag). The first claim creates ``flag_path`` itself, later ones ``flag_path.1``, ..."""
    if flag_path is None:
        return True
    for k in range(times):
        path = flag_path if k == 0 else f"{flag_path}.{k}"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            continue
        try:
            os.write(fd, f"{os.getpid()} {time.monotonic()!r}".encode())
        finally:
            os.close(fd)
        return True
    return False


def read_flag(flag_path: str) -> tuple[int, float]:
    """(pid, monotonic time) recorded by the process that made the first claim."""
    with open(flag_path) as f:
        pid, t = f.read().split()
    return int(pid), float(t)


def silence_stderr() -> None:
    """Crashing helpers: keep faulthandler / multiprocessing noise out of the test logs."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def region_range(engine_owner: object) -> tuple[int, int]:
    """[start, end) addresses of the shared slot region of a Loader (or of the object whose
    ``_loader`` is one: a compat DataLoader), to check that arrays are views of it."""
    import numpy as np

    loader = getattr(engine_owner, "_loader", None) or engine_owner
    view = np.frombuffer(loader._engine.slots.region.mm, np.uint8)  # type: ignore[attr-defined]
    lo = view.ctypes.data
    return lo, lo + view.nbytes
