"""``python -m fastload bench|info``."""

from __future__ import annotations

import sys


def _info() -> int:
    import multiprocessing as mp
    import os
    import platform
    import shutil

    import numpy as np

    import fastload
    from fastload._pool import default_start_method

    print(f"fastload {fastload.__version__} (compiled core: {fastload.backend})")
    print(f"python {platform.python_version()} on {platform.platform()}")
    print(f"numpy {np.__version__}")
    try:
        import torch

        print(f"torch {torch.__version__}")
    except ImportError:
        print("torch not installed")
    linux = sys.platform.startswith("linux")
    print(f"memfd_create: {hasattr(os, 'memfd_create')}   futex: {linux}   PR_SET_PDEATHSIG: {linux}")
    print(f"start methods: {mp.get_all_start_methods()} (default here: {default_start_method()})")
    if os.path.isdir("/dev/shm"):
        du = shutil.disk_usage("/dev/shm")
        print(f"/dev/shm: {du.total / 2**20:.0f} MiB, {du.free / 2**20:.0f} MiB free (unused on "
              "Linux: fastload maps memfd regions)")
    print(f"cpu count: {os.cpu_count()}")
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
