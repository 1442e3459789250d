"""``python -m fastload bench|info``."""

from __future__ import annotations

import sys


def _futex_in_core(ring_module: object) -> str:
    """Whether the compiled core waits with futex(2) or with the portable backoff."""
    if not sys.platform.startswith("linux"):
        return "no (not Linux: portable wait path)"
    have = getattr(ring_module, "HAVE_FUTEX", None)
    if have is None:
        return "unknown"
    return "yes" if have else "no (portable wait path: built with FASTLOAD_PORTABLE=1)"


def _pdeathsig() -> str:
    if not sys.platform.startswith("linux"):
        return "no (not Linux: the watchdog thread alone ends orphaned workers)"
    try:
        import ctypes

        ctypes.CDLL(None).prctl  # noqa: B018 - the lookup is the check
    except (OSError, AttributeError):
        return "no (prctl not found: the watchdog thread alone ends orphaned workers)"
    return "yes"


def _info() -> int:
    """Versions and platform features, one per line, for bug reports."""
    import multiprocessing as mp
    import os
    import platform
    import shutil

    import numpy as np

    import fastload
    from fastload import _ring
    from fastload._pool import default_start_method

    def row(name: str, value: object) -> None:
        print(f"  {name + ':':<18} {value}")

    print(f"fastload {fastload.__version__}")
    row("compiled core", f"{fastload.backend} ({os.path.basename(_ring.__file__ or '?')}), "
        f"shared layout version {_ring.LAYOUT_VERSION}")
    row("python", f"{platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.platform()}")
    row("numpy", np.__version__)
    try:
        import torch

        row("torch", torch.__version__)
    except ImportError:
        row("torch", "not installed")
    memfd = hasattr(os, "memfd_create")
    row("memfd_create", "yes (regions are anonymous memfds)" if memfd
        else "no (regions are unlinked temporary files)")
    row("futex", _futex_in_core(_ring))
    row("PR_SET_PDEATHSIG", _pdeathsig())
    try:
        default = default_start_method()
    except ValueError as e:  # a bad $FASTLOAD_START_METHOD
        default = f"error: {e}"
    forced = os.environ.get("FASTLOAD_START_METHOD")
    row("start methods", ", ".join(mp.get_all_start_methods()))
    row("default start", default + (f" (from FASTLOAD_START_METHOD={forced})" if forced else ""))
    if os.path.isdir("/dev/shm"):
        du = shutil.disk_usage("/dev/shm")
        note = " (not used: fastload maps memfd regions)" if memfd else ""
        row("/dev/shm", f"{du.total / 2**20:.0f} MiB, {du.free / 2**20:.0f} MiB free{note}")
    else:
        row("/dev/shm", "absent")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    row("cpu count", f"{os.cpu_count()}" + (f" ({usable} usable by this process)"
                                            if usable is not None else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m fastload {bench,info} [options]\n"
              "  bench  run the built-in synthetic benchmark (python -m fastload bench --help)\n"
              "  info   versions and platform features, for bug reports")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "bench":
        from fastload._bench import main as bench_main

        return int(bench_main(rest) or 0)
    if cmd == "info":
        return _info()
    print(f"python -m fastload: unknown command {cmd!r} (use bench or info)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
