"""``python -m fastload bench|doctor|info``."""

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


def _installed() -> str:
    """Where fastload is imported from, from which distribution, and whether it is editable."""
    import json
    import os
    from importlib import metadata

    import fastload

    where = os.path.dirname(os.path.abspath(fastload.__file__ or "?"))
    try:
        dist = metadata.distribution("fastload-numpy")
    except metadata.PackageNotFoundError:
        return f"{where} (no installed distribution: imported from a source tree)"
    kind = "installed"
    if os.path.abspath(str(dist.locate_file(""))) == os.path.dirname(where):
        kind = "its source tree's metadata: run from the repository root"
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        if direct.get("dir_info", {}).get("editable"):
            kind = "editable install of " + direct.get("url", "?").removeprefix("file://")
    except (ValueError, OSError):
        pass
    return f"{where} ({dist.metadata['Name']} {dist.version}, {kind})"


def _version_of(*names: str) -> str:
    """The installed version of the first of ``names`` (distribution names) that is present,
    without importing it."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name) + ("" if name == names[0] else f" ({name})")
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cgroup_limits() -> tuple[str, str]:
    """This process's cgroup memory and CPU limits (v2, else v1), as text."""
    mem = _read("/sys/fs/cgroup/memory.max")
    if mem is None:
        mem = _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    if mem is None:
        mem_text = "unknown (no cgroup memory controller readable)"
    elif not mem.isdigit() or int(mem) >= 1 << 60:
        mem_text = "none"
    else:
        mem_text = f"{int(mem) / 2**20:,.0f} MiB"
    cpu = _read("/sys/fs/cgroup/cpu.max")  # "max 100000" or "200000 100000"
    if cpu is not None:
        quota, _, period = cpu.partition(" ")
    else:
        quota = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or ""
        period = _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") or ""
    if quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0 and int(period) > 0:
        cpu_text = f"{int(quota) / int(period):g} CPUs ({quota}/{period} us)"
    elif quota or cpu is not None:
        cpu_text = "none"
    else:
        cpu_text = "unknown (no cgroup cpu controller readable)"
    return mem_text, cpu_text


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
    row("installed at", _installed())
    row("build", f"{_ring.BUILD_FLAGS}; {_ring.COMPILER_VERSION}; Cython {_ring.CYTHON_VERSION}")
    row("numpy", np.__version__)
    for name, dists in (("torch", ("torch",)), ("chainer", ("chainer",)),
                        ("accelerate", ("accelerate",)),
                        ("lightning", ("lightning", "pytorch-lightning"))):
        row(name, _version_of(*dists))
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
    mem_limit, cpu_limit = _cgroup_limits()
    row("cgroup memory", mem_limit)
    row("cgroup cpu", cpu_limit)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m fastload {bench,doctor,info} [options]\n"
              "  bench   run the built-in synthetic benchmark (python -m fastload bench --help)\n"
              "  doctor  measure your dataset here and recommend settings\n"
              "          (python -m fastload doctor my_module:make_dataset --batch-size 64)\n"
              "  info    versions and platform features, for bug reports")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "bench":
        from fastload._bench import main as bench_main

        return int(bench_main(rest) or 0)
    if cmd == "doctor":
        from fastload._doctor import main as doctor_main

        return doctor_main(rest)
    if cmd == "info":
        return _info()
    print(f"python -m fastload: unknown command {cmd!r} (use bench, doctor or info)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
