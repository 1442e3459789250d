"""Synthetic workloads and the measurement loop behind ``python -m fastload bench``.

The full comparison suite lives in ``benchmarks/`` (not installed); it imports the workloads and
:func:`run_case` from here so that both report the same numbers. Everything in this module
imports with NumPy alone: torch and tqdm are used only when installed.

Workloads (``WORKLOADS``), each a module-level, picklable dataset class whose data is built
lazily, on the first ``__getitem__`` in whatever process calls it (so a worker builds its own
copy, and pickling a dataset for spawn/forkserver sends only its parameters):

========  =====================================================  =====  =========
name      sample                                                 batch  n
========  =====================================================  =====  =========
image     (uint8 (224, 224, 3) copied from a pool of 64, int64)    128      4,096
tiny      (float32 (16,) row view, int64 NumPy scalar)             256    200,000
compute   float32 (1024,) after ~1 ms of NumPy work                 64      2,048
dict      {"x": float32 (3, 32, 32), "y": int, "w": float}         256     50,000
========  =====================================================  =====  =========

One *case* is one loader over one workload for a few epochs, run in a fresh process
(:func:`run_case_subprocess`), so loaders never share worker pools, caches or page cache state
built by another loader. Loaders: ``fastload``, ``torch`` (``torch.utils.data.DataLoader`` with
``persistent_workers=True``), ``single`` (``__getitem__`` + ``np.stack`` per leaf in the
calling process) and ``getitem`` (``__getitem__`` alone: the cost of the samples themselves).
Steady state means epochs 2.. (the first epoch pays for process start and lazy data building).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np

__all__ = [
    "ImageDataset",
    "TinyDataset",
    "ComputeDataset",
    "DictDataset",
    "WORKLOADS",
    "LOADERS",
    "make_dataset",
    "np_collate",
    "touch",
    "run_case",
    "run_case_subprocess",
    "machine_info",
    "main",
]

RESULT_PREFIX = "#fastload-bench-result "
PROGRESS_PREFIX = "#fastload-bench-progress "


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------
class _LazyDataset:
    """Base: parameters are pickled, data arrays are built on first use in each process."""

    _data_attrs: tuple[str, ...] = ()

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = int(n)
        self.seed = int(seed)
        self._built = False

    def __len__(self) -> int:
        return self.n

    def _ensure(self) -> None:
        if not self._built:
            self._build(np.random.default_rng(self.seed))
            self._built = True

    def _build(self, rng: np.random.Generator) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for a dataset of {self.n} samples")
        return i

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for a in self._data_attrs:
            state.pop(a, None)
        state["_built"] = False
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, seed={self.seed})"


class ImageDataset(_LazyDataset):
    """``(uint8 (224, 224, 3) image, int64 label)``; each image is a fresh copy of one of 64
    random images (the cost of a decoded image without a decoder)."""

    _data_attrs = ("_pool", "_labels")
    POOL = 64
    SHAPE = (224, 224, 3)

    def _build(self, rng: np.random.Generator) -> None:
        self._pool = rng.integers(0, 256, (self.POOL, *self.SHAPE), dtype=np.uint8)
        self._labels = rng.integers(0, 1000, self.n, dtype=np.int64)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        self._ensure()
        i = self._check(i)
        return self._pool[i % self.POOL].copy(), self._labels[i]


class TinyDataset(_LazyDataset):
    """``(float32 (16,) row view, int64 NumPy scalar label)``: measures per-sample overhead."""

    _data_attrs = ("_x", "_y")
    DIM = 16

    def _build(self, rng: np.random.Generator) -> None:
        self._x = rng.standard_normal((self.n, self.DIM), dtype=np.float32)
        self._y = rng.integers(0, 10, self.n, dtype=np.int64)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        self._ensure()
        i = self._check(i)
        return self._x[i], self._y[i]


class ComputeDataset(_LazyDataset):
    """float32 ``(1024,)`` produced by ~1 ms of single-threaded NumPy work (sin, cumsum, sort
    over a ``(rows, 1024)`` block, in a scratch buffer reused across samples so that the time
    is arithmetic rather than page faults): a CPU-bound "augmentation" workload. No BLAS, so
    the cost does not depend on BLAS thread settings."""

    _data_attrs = ("_blocks", "_scratch")
    BLOCKS = 8
    ROWS = 224  # ~1 ms per sample on a 2020s x86 server core

    def __init__(self, n: int, seed: int = 0, rows: int | None = None) -> None:
        super().__init__(n, seed)
        self.rows = int(rows or self.ROWS)

    def _build(self, rng: np.random.Generator) -> None:
        self._blocks = rng.standard_normal((self.BLOCKS, self.rows, 1024), dtype=np.float32)
        self._scratch = np.empty((self.rows, 1024), np.float32)

    def __getitem__(self, i: int) -> np.ndarray:
        self._ensure()
        i = self._check(i)
        y = self._scratch
        np.multiply(self._blocks[i % self.BLOCKS], np.float32(1.0 + (i % 7) * 0.01), out=y)
        np.sin(y, out=y)
        np.cumsum(y, axis=1, out=y)
        y.sort(axis=1)
        return y.mean(axis=0, dtype=np.float32)


class DictDataset(_LazyDataset):
    """``{"x": float32 (3, 32, 32) view, "y": int, "w": float}`` (Python scalars, stored as
    int64 / float64 leaves)."""

    _data_attrs = ("_pool", "_y", "_w")
    POOL = 256

    def _build(self, rng: np.random.Generator) -> None:
        self._pool = rng.standard_normal((self.POOL, 3, 32, 32), dtype=np.float32)
        self._y = rng.integers(0, 10, self.n, dtype=np.int64)
        self._w = rng.random(self.n)

    def __getitem__(self, i: int) -> dict[str, Any]:
        self._ensure()
        i = self._check(i)
        return {"x": self._pool[i % self.POOL], "y": int(self._y[i]), "w": float(self._w[i])}


#: name -> (dataset class, batch size, n, quick n)
WORKLOADS: dict[str, tuple[type, int, int, int]] = {
    "image": (ImageDataset, 128, 4096, 1024),
    "tiny": (TinyDataset, 256, 200_000, 20_000),
    "compute": (ComputeDataset, 64, 2048, 256),
    "dict": (DictDataset, 256, 50_000, 5_000),
}

LOADERS = ("fastload", "torch", "single", "getitem")


def make_dataset(workload: str, n: int | None = None, seed: int = 0) -> Any:
    cls, _bs, default_n, _q = WORKLOADS[workload]
    return cls(default_n if n is None else n, seed)


# ---------------------------------------------------------------------------------------------
# Consumers
# ---------------------------------------------------------------------------------------------
def np_collate(samples: list[Any]) -> Any:
    """Stack a list of samples leaf by leaf (the single-process baseline's collate)."""
    first = samples[0]
    if isinstance(first, tuple) and hasattr(type(first), "_fields"):
        return type(first)(*(np_collate([s[k] for s in samples]) for k in range(len(first))))
    if isinstance(first, (tuple, list)):
        return type(first)(np_collate([s[k] for s in samples]) for k in range(len(first)))
    if isinstance(first, dict):
        return {k: np_collate([s[k] for s in samples]) for k in first}
    if isinstance(first, np.ndarray):
        return np.stack(samples)
    return np.array(samples)


def _leaves(batch: Any, out: list[Any]) -> list[Any]:
    if isinstance(batch, dict):
        for v in batch.values():
            _leaves(v, out)
    elif isinstance(batch, (tuple, list)):
        for v in batch:
            _leaves(v, out)
    else:
        out.append(batch)
    return out


def touch(batch: Any) -> tuple[int, int, float]:
    """Read one element of every row of every leaf (so no lazy path is unfairly fast).

    Returns ``(rows, nbytes, checksum)``. Torch tensors are viewed as NumPy (zero-copy).
    """
    rows, nbytes, acc = 0, 0, 0.0
    for a in _leaves(batch, []):
        if not isinstance(a, np.ndarray):
            a = a.numpy() if hasattr(a, "numpy") else np.asarray(a)
        rows = len(a)
        nbytes += a.nbytes
        acc += float(a.reshape(rows, -1)[:, 0].sum(dtype=np.float64))
    return rows, nbytes, acc


def _sample_nbytes(sample: Any) -> int:
    return sum(np.asarray(a).nbytes for a in _leaves(sample, []))


# ---------------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------------
def _versions() -> dict[str, Any]:
    import fastload

    out: dict[str, Any] = {
        "fastload": fastload.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    return out


def machine_info() -> dict[str, Any]:
    """Versions and machine facts (torch only if installed; it is not imported otherwise)."""
    info = _versions()
    info.update(
        cpu_count=os.cpu_count(),
        sched_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        platform=platform.platform(),
        machine=platform.machine(),
        processor=_cpu_model(),
    )
    try:
        import importlib.metadata as md

        info["torch"] = md.version("torch")
    except Exception:
        info["torch"] = None
    try:
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        info["loadavg"] = None
    return info


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _order(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    if shuffle:
        return np.random.default_rng([seed, epoch]).permutation(n)
    return np.arange(n)


def run_case(case: dict[str, Any], progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run one loader over one workload for ``case["epochs"]`` epochs in this process.

    ``case`` keys: loader, workload, n, batch_size, epochs, workers, prefetch, shuffle, seed,
    start_method (fastload), torch_collate ("default" tensors | "numpy"). Returns timings in
    nanoseconds (``epoch_ns``, ``first_batch_ns``, ``close_ns``, per-batch gaps of the steady
    state) and the derived samples/s and GB/s of the steady state (epochs 2.., or epoch 1 when
    only one was run).
    """
    loader_kind = case["loader"]
    workload = case["workload"]
    cls, default_bs, default_n, _q = WORKLOADS[workload]
    n = int(case.get("n") or default_n)
    bs = int(case.get("batch_size") or default_bs)
    epochs = int(case.get("epochs", 3))
    workers = int(case.get("workers", 2))
    prefetch = int(case.get("prefetch", 2))
    shuffle = bool(case.get("shuffle", True))
    seed = int(case.get("seed", 0))
    ds = cls(n, 0)
    clock = time.perf_counter_ns
    epoch_ns: list[int] = []
    gaps: list[list[int]] = []  # per epoch: ns between consecutive batches (consumer view)
    samples_per_epoch: list[int] = []
    bytes_per_epoch: list[int] = []
    first_batch_ns = None
    checksum = 0.0
    extra: dict[str, Any] = {}
    close_ns = 0
    cpu0 = cpu1 = None
    faults: list[int] = []  # minor page faults of this (consuming) process, per epoch
    try:
        import resource

        def minflt() -> int:
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except ImportError:  # pragma: no cover - not POSIX

        def minflt() -> int:
            return 0

    if loader_kind == "torch":
        import torch  # noqa: F401  (before the clock starts: first batch excludes the import)
    t_construct = clock()
    if loader_kind == "getitem":
        sample_nb = 0
        for e in range(epochs):
            order = _order(n, shuffle, seed, e).tolist()
            if e == min(1, epochs - 1):
                cpu0 = _cpu_times()
            f0 = minflt()
            t0 = clock()
            for i in order:
                s = ds[i]
                if first_batch_ns is None:
                    first_batch_ns = clock() - t_construct
                    sample_nb = _sample_nbytes(s)
                    t0 += clock() - t_construct - first_batch_ns  # exclude the nbytes count
            epoch_ns.append(clock() - t0)
            faults.append(minflt() - f0)
            cpu1 = _cpu_times()
            gaps.append([])
            samples_per_epoch.append(len(order))
            bytes_per_epoch.append(len(order) * sample_nb)
            if progress:
                progress(e + 1, epochs)
    else:
        if loader_kind == "fastload":
            import fastload

            loader: Any = fastload.Loader(
                ds, bs, shuffle=shuffle, seed=seed, num_workers=workers, prefetch=prefetch,
                start_method=case.get("start_method"),
            )
            extra["start_method"] = loader.start_method
            make_iter = lambda e: iter(loader)  # noqa: E731
        elif loader_kind == "torch":
            import torch
            from torch.utils.data import DataLoader

            g = torch.Generator()
            g.manual_seed(seed)
            collate = np_collate if case.get("torch_collate") == "numpy" else None
            kw: dict[str, Any] = {}
            if workers > 0:
                kw = dict(persistent_workers=True, prefetch_factor=prefetch)
                if case.get("start_method"):
                    kw["multiprocessing_context"] = case["start_method"]
            loader = DataLoader(
                ds, batch_size=bs, shuffle=shuffle, num_workers=workers, generator=g,
                collate_fn=collate, **kw,
            )
            extra["torch_collate"] = "numpy" if collate else "default (torch tensors)"
            extra["torch_version"] = torch.__version__
            extra["start_method"] = (
                case.get("start_method") or __import__("multiprocessing").get_start_method()
            ) if workers > 0 else None
            make_iter = lambda e: iter(loader)  # noqa: E731
        elif loader_kind == "single":
            loader = None

            def make_iter(e: int) -> Any:
                order = _order(n, shuffle, seed, e)
                for b in range(0, n, bs):
                    yield np_collate([ds[i] for i in order[b : b + bs].tolist()])

        else:
            raise ValueError(f"unknown loader {loader_kind!r}")
        try:
            for e in range(epochs):
                if e == min(1, epochs - 1):
                    cpu0 = _cpu_times()
                f0 = minflt()
                t0 = clock()
                last = t0
                g_e: list[int] = []
                ns = nbytes = 0
                for batch in make_iter(e):
                    rows, nb, acc = touch(batch)
                    now = clock()
                    if first_batch_ns is None:
                        first_batch_ns = now - t_construct
                    g_e.append(now - last)
                    last = now
                    ns += rows
                    nbytes += nb
                    checksum += acc
                    del batch
                epoch_ns.append(clock() - t0)
                faults.append(minflt() - f0)
                cpu1 = _cpu_times()
                gaps.append(g_e)
                samples_per_epoch.append(ns)
                bytes_per_epoch.append(nbytes)
                if progress:
                    progress(e + 1, epochs)
        finally:
            t_close = clock()
            if loader_kind == "fastload":
                try:
                    extra["stats"] = {
                        k: v for k, v in loader.stats().items() if k != "ring"
                    }
                except Exception:
                    pass
                loader.close()
            elif loader_kind == "torch":
                # persistent workers stop when the iterator is collected
                it = getattr(loader, "_iterator", None)
                if it is not None:
                    it._shutdown_workers()
                del loader
            close_ns = clock() - t_close

    steady = slice(1, None) if epochs >= 2 else slice(0, None)
    st_ns = sum(epoch_ns[steady])
    st_samples = sum(samples_per_epoch[steady])
    st_bytes = sum(bytes_per_epoch[steady])
    st_gaps = sorted(g for ge in gaps[steady] for g in ge)
    result = {
        "loader": loader_kind,
        "workload": workload,
        "n": n,
        "batch_size": bs,
        "epochs": epochs,
        "workers": workers if loader_kind in ("fastload", "torch") else 0,
        "prefetch": prefetch,
        "shuffle": shuffle,
        "epoch_ns": epoch_ns,
        "samples_per_epoch": samples_per_epoch,
        "first_batch_ns": first_batch_ns,
        "close_ns": close_ns,
        "steady_ns": st_ns,
        "samples_per_s": st_samples / (st_ns / 1e9) if st_ns else None,
        "gb_per_s": st_bytes / st_ns if st_ns else None,  # bytes/ns == GB/s
        "bytes_per_sample": (st_bytes / st_samples) if st_samples else None,
        "batch_gap_ns": _pcts(st_gaps),
        "minor_faults_per_epoch": faults,
        "checksum": checksum,
        "pid": os.getpid(),
        "loadavg_end": _loadavg(),
        "cpu_busy_steady": _busy(cpu0, cpu1),
    }
    result.update(extra)
    return result


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine from /proc/stat (Linux), else None."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def _busy(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    """Fraction of all CPUs busy between two :func:`_cpu_times` (this run and anything else)."""
    if a is None or b is None or b[1] <= a[1]:
        return None
    return round((b[0] - a[0]) / (b[1] - a[1]), 3)


def _pcts(sorted_vals: list[int]) -> dict[str, float] | None:
    if not sorted_vals:
        return None

    def q(p: float) -> float:
        k = (len(sorted_vals) - 1) * p
        lo = int(k)
        hi = min(lo + 1, len(sorted_vals) - 1)
        return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)

    return {"p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "max": float(sorted_vals[-1])}


def case_entry(argv: list[str] | None = None) -> int:
    """Child side of :func:`run_case_subprocess`: ``argv[0]`` is the case as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    case = json.loads(argv[0])

    def progress(done: int, total: int) -> None:
        print(PROGRESS_PREFIX + json.dumps([done, total]), flush=True)

    res = run_case(case, progress)
    print(RESULT_PREFIX + json.dumps(res), flush=True)
    return 0


def run_case_subprocess(
    case: dict[str, Any],
    argv: list[str] | None = None,
    timeout: float = 600.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run one case in a fresh interpreter and return its result dict.

    ``argv`` is the child's command line before the JSON case (default: this module's
    :func:`case_entry`); the child prints progress and result lines with fixed prefixes.
    Raises RuntimeError (with the child's stderr tail) when the child fails or times out.
    """
    if argv is None:
        argv = [sys.executable, "-c", "import sys, fastload._bench as b; sys.exit(b.case_entry())"]
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen(
        [*argv, json.dumps(case)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    result = None
    deadline = time.monotonic() + timeout
    import threading

    err_chunks: list[str] = []
    t = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    t.start()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(PROGRESS_PREFIX):
                if on_progress:
                    done, total = json.loads(line[len(PROGRESS_PREFIX):])
                    on_progress(done, total)
            elif line.startswith(RESULT_PREFIX):
                result = json.loads(line[len(RESULT_PREFIX):])
        rc = proc.wait()
    finally:
        timer.cancel()
        t.join(5)
    err = "".join(err_chunks)
    if result is None or rc != 0:
        why = "timed out" if time.monotonic() >= deadline else f"exited with {rc}"
        raise RuntimeError(
            f"benchmark case {case.get('loader')}/{case.get('workload')} {why}:\n{err[-3000:]}"
        )
    if err.strip():
        result["stderr"] = err[-2000:]
    return result


# ---------------------------------------------------------------------------------------------
# python -m fastload bench
# ---------------------------------------------------------------------------------------------
class _Progress:
    """tqdm when installed, else a ``\\r`` line on stderr (one line per finished run when
    stderr is not a terminal)."""

    def __init__(self, total: int, desc: str, per_run: int = 1) -> None:
        self.total, self.done, self.desc, self.per_run = total, 0, desc, max(1, per_run)
        self.bar: Any = None
        self.plain = False
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="epoch", leave=False, file=sys.stderr)
        except ImportError:
            self.plain = sys.stderr.isatty()  # no \r clutter in logs
            if self.plain:
                self._draw("")

    def _draw(self, what: str) -> None:
        pct = 100 * self.done / self.total if self.total else 100
        sys.stderr.write(f"\r{self.desc}: {self.done}/{self.total} epochs ({pct:3.0f}%) {what:<24}")
        sys.stderr.flush()

    def step(self, what: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(what, refresh=False)
            self.bar.update(1)
        elif self.plain:
            self._draw(what)
        elif self.done % self.per_run == 0:
            sys.stderr.write(f"{self.desc}: {what} ({self.done}/{self.total} epochs)\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.plain:
            sys.stderr.write("\r" + " " * (len(self.desc) + 50) + "\r")
            sys.stderr.flush()


def _torch_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def main(argv: list[str] | None = None) -> int:
    """``python -m fastload bench [--workload W] [--workers N] [--quick] ...``"""
    p = argparse.ArgumentParser(
        prog="python -m fastload bench",
        description="Throughput of fastload on a built-in synthetic dataset, against a "
        "single-process loop (and torch's DataLoader when torch is installed). Each loader "
        "runs in a fresh process; numbers are for the steady state (epochs 2..).",
    )
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="image")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--quick", action="store_true", help="smaller dataset, 2 epochs (a few seconds)")
    p.add_argument("--n", type=int, default=None, help="samples per epoch (default per workload)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None, help="default 4 (2 with --quick)")
    p.add_argument("--repeat", type=int, default=None,
                   help="fresh-process runs per loader, interleaved; the median is shown "
                        "(default 3, 1 with --quick)")
    p.add_argument("--torch", choices=("auto", "yes", "no"), default="auto",
                   help="include torch.utils.data.DataLoader (auto: when installed)")
    p.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), default=None)
    p.add_argument("--json", metavar="PATH", help="also append the results as JSON lines")
    args = p.parse_args(argv)

    cls, bs, n_full, n_quick = WORKLOADS[args.workload]
    n = args.n or (n_quick if args.quick else n_full)
    bs = args.batch_size or bs
    epochs = args.epochs or (2 if args.quick else 4)
    repeat = args.repeat or (1 if args.quick else 3)
    if epochs < 1 or repeat < 1 or args.workers < 0 or n < 1 or bs < 1:
        p.error("--epochs, --repeat, --n and --batch-size must be >= 1, --workers >= 0")
    with_torch = args.torch == "yes" or (args.torch == "auto" and _torch_installed())
    loaders = ["fastload", "single"] + (["torch"] if with_torch else [])
    base = dict(workload=args.workload, n=n, batch_size=bs, epochs=epochs, workers=args.workers,
                shuffle=True, seed=0, prefetch=2, start_method=args.start_method)
    info = machine_info()
    print(
        f"fastload {info['fastload']} bench: workload={args.workload} n={n} batch_size={bs} "
        f"workers={args.workers} epochs={epochs} repeat={repeat} | {info['cpu_count']} CPUs, "
        f"python {info['python']}, numpy {info['numpy']}"
        + (f", torch {info['torch']}" if with_torch else "")
    )
    bar = _Progress(total=epochs * len(loaders) * repeat, desc="fastload bench", per_run=epochs)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in loaders}
    try:
        for r in range(repeat):
            for name in loaders[r % len(loaders):] + loaders[: r % len(loaders)]:
                case = dict(base, loader=name)
                runs[name].append(run_case_subprocess(
                    case, on_progress=lambda d, t, name=name: bar.step(f"{name} epoch {d}/{t}")
                ))
    except KeyboardInterrupt:
        bar.close()
        print("interrupted", file=sys.stderr)
        return 130
    except RuntimeError as e:
        bar.close()
        print(f"error: {e}", file=sys.stderr)
        return 1
    bar.close()
    results = {name: _median_run(rs) for name, rs in runs.items()}

    steady = f"epochs 2..{epochs}" if epochs >= 2 else "epoch 1 (includes start-up)"
    print(f"steady state = {steady}, median of {repeat} fresh-process run(s); first batch = "
          "from constructing the loader")
    single = results["single"]["samples_per_s"]
    rows = []
    for name in loaders:
        r = results[name]
        label = {
            "fastload": f"fastload ({args.workers} workers, {r.get('start_method') or 'in-process'})",
            "single": "single process (__getitem__ + np.stack)",
            "torch": f"torch DataLoader ({args.workers} workers, tensors)",
        }[name]
        ratio = r["samples_per_s"] / single if single else float("nan")
        rows.append((label, _fmt_rate(r["samples_per_s"]), f"{r['gb_per_s']:.3f}",
                     f"{r['first_batch_ns'] / 1e6:.0f} ms", f"{ratio:.2f}x"))
    head = ("loader", "samples/s", "GB/s", "first batch", "vs single")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))))
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    if "torch" in results and results["torch"]["samples_per_s"]:
        print(f"fastload / torch: {results['fastload']['samples_per_s'] / results['torch']['samples_per_s']:.2f}x")
    if (os.cpu_count() or 1) <= args.workers:
        print(f"note: {os.cpu_count()} CPUs for {args.workers} workers plus the main process: "
              "workers compete with the consumer; numbers are noisy on shared machines.")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"type": "machine", **info}) + "\n")
            for rs in runs.values():
                for r in rs:
                    f.write(json.dumps({"type": "case", **r}) + "\n")
    return 0


def _median_run(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median samples/s, its first-batch time replaced by the median one."""
    rs = sorted(rs, key=lambda r: r["samples_per_s"] or 0.0)
    out = dict(rs[(len(rs) - 1) // 2])
    fb = sorted(r["first_batch_ns"] for r in rs)
    out["first_batch_ns"] = fb[(len(fb) - 1) // 2]
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
