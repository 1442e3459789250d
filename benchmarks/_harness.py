"""Synthetic workloads and the measurement loop of the benchmark scripts (bench_loader.py and
the others), and of ``python -m fastload bench`` when it runs from a source checkout.

Everything here uses fastload's public API only, and imports with NumPy alone: torch, tqdm and
matplotlib are used only when installed. An installed fastload has a smaller built-in benchmark
of its own (fastload/_bench.py) for when this directory is not there.

Workloads (``WORKLOADS``), each a module-level, picklable dataset class whose data is built
lazily, on the first ``__getitem__`` in whatever process calls it (so a worker builds its own
copy, and pickling a dataset for spawn/forkserver sends only its parameters):

========  =====================================================  =====  =========  =========
name      sample                                                 batch  n          quick n
========  =====================================================  =====  =========  =========
image     (uint8 (224, 224, 3) copied from a pool of 64, int64)    128      4,096      1,024
tiny      (float32 (16,) row view, int64 NumPy scalar)             256    200,000     20,000
compute   float32 (1024,) after ~1 ms of NumPy work                 64      2,048        256
dict      {"x": float32 (3, 32, 32), "y": int, "w": float}         256     50,000      5,000
memmap    float32 (1024,) row of a np.memmap file (2 GiB)          256    524,288     16,384
========  =====================================================  =====  =========  =========

One *case* is one loader over one workload for a few epochs, run in a fresh process
(:func:`run_case_subprocess`), so loaders never share worker pools, caches or allocator state.
Loaders (``LOADERS``): ``fastload`` (N workers), ``fastload-1w`` (1 worker),
``fastload-noshare`` (N workers, ``share_rows=False``: each batch loaded by one worker, as before
shared rows; only with ``--loaders``), ``torch`` (``torch.utils.data.DataLoader`` with ``persistent_workers=True``), ``single``
(``__getitem__`` + ``np.stack`` per leaf in the consuming process), ``getitem``
(``__getitem__`` alone: the cost of the samples themselves), and the physical ceiling of moving
the same bytes: ``memcpy-warm`` (``np.copyto`` into one preallocated batch) and
``memcpy-fresh`` (a copy into freshly mapped pages every batch).

Per case: steady-state samples/s and GB/s (epochs 2..), time to the first batch, the epoch
boundary (last batch of epoch k -> first batch of epoch k+1), batch gaps, the fraction of wall
time the consumer spent inside the loader's ``next()``, and the peak PSS of the whole process
tree (sampled every ~20 ms from ``/proc/<pid>/smaps_rollup`` by a thread of the *launching*
process, so the measured process stays single-threaded and keeps its default start method).
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ImageDataset",
    "TinyDataset",
    "ComputeDataset",
    "DictDataset",
    "MemmapDataset",
    "WORKLOADS",
    "LOADERS",
    "LOADER_LABEL",
    "TARGETS",
    "bench_dir",
    "default_loaders",
    "ensure_memmap_file",
    "make_dataset",
    "np_collate",
    "touch",
    "run_case",
    "run_case_subprocess",
    "PssSampler",
    "summarize_runs",
    "ratios",
    "evaluate_targets",
    "render_table",
    "render_console",
    "render_targets",
    "plot_summaries",
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

    @classmethod
    def prepare(cls, n: int, seed: int = 0) -> dict[str, Any]:
        """Run once per case before the clock starts (e.g. create a file); returns facts."""
        return {}

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
    # (the scratch buffer is per thread: thread workers share the dataset object)
    ROWS = 224  # ~1 ms per sample on a 2020s x86 server core

    def __init__(self, n: int, seed: int = 0, rows: int | None = None) -> None:
        super().__init__(n, seed)
        self.rows = int(rows or self.ROWS)

    def _build(self, rng: np.random.Generator) -> None:
        self._blocks = rng.standard_normal((self.BLOCKS, self.rows, 1024), dtype=np.float32)
        self._scratch = threading.local()

    def __getitem__(self, i: int) -> np.ndarray:
        self._ensure()
        i = self._check(i)
        y = getattr(self._scratch, "y", None)
        if y is None:
            y = self._scratch.y = np.empty((self.rows, 1024), np.float32)
        np.multiply(self._blocks[i % self.BLOCKS], np.float32(1.0 + (i % 7) * 0.01), out=y)
        np.sin(y, out=y)
        np.cumsum(y, axis=1, out=y)
        y.sort(axis=1)
        return y.mean(axis=0, dtype=np.float32)


class DecodeDataset(_LazyDataset):
    """``(uint8 (224, 224, 3) image, int64 label)`` decoded by Pillow from one of 16 JPEGs of
    256 x 256, then resized to 224 (the decoder releases the GIL: thread workers' case)."""

    _data_attrs = ("_jpegs", "_labels")
    POOL = 16

    def _build(self, rng: np.random.Generator) -> None:
        import io

        from PIL import Image

        self._jpegs = []
        for _ in range(self.POOL):
            pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
            self._jpegs.append(buf.getvalue())
        self._labels = rng.integers(0, 1000, self.n, dtype=np.int64)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        import io

        from PIL import Image

        self._ensure()
        i = self._check(i)
        with Image.open(io.BytesIO(self._jpegs[i % self.POOL])) as im:
            return np.asarray(im.convert("RGB").resize((224, 224))), self._labels[i]


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


def bench_dir() -> str:
    """Where benchmark files live: ``$FASTLOAD_BENCH_DIR`` or ``/tmp/fastload-bench``."""
    return os.environ.get("FASTLOAD_BENCH_DIR") or os.path.join(
        os.environ.get("TMPDIR") or "/tmp", "fastload-bench"
    )


def ensure_memmap_file(rows: int, seed: int = 0, dim: int = 1024) -> str:
    """Create (once; reused across runs) a file of ``rows`` float32 rows of ``dim`` values.

    Safe against concurrent creators (an flock, then an atomic rename); a file of the right
    size is trusted as is.
    """
    d = bench_dir()
    path = os.path.join(d, f"memmap-{rows}x{dim}-f32-seed{seed}.bin")
    size = rows * dim * 4
    if _size(path) == size:
        return path
    import fcntl

    os.makedirs(d, exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _size(path) == size:
            return path
        tmp = f"{path}.tmp{os.getpid()}"
        rng = np.random.default_rng(seed)
        chunk = max(1, (64 << 20) // (dim * 4))
        try:
            with open(tmp, "wb") as f:
                for start in range(0, rows, chunk):
                    rng.random((min(chunk, rows - start), dim), dtype=np.float32).tofile(f)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def _warm_page_cache(path: str) -> float:
    """Read the whole file once (sequentially) so every loader starts with it in page cache."""
    t0 = time.perf_counter()
    buf = bytearray(16 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


class MemmapDataset(_LazyDataset):
    """float32 ``(1024,)`` row ``i`` of a ``np.memmap`` file (4 KiB per sample, read by index).

    The file (``n`` rows; 2 GiB at the default n) is created once under :func:`bench_dir` and
    reused. ``__getitem__`` returns a view into the mapping: the bytes are read (page-cache
    faults, then a copy) by whoever stacks the batch. Each process maps the file itself.
    """

    _data_attrs = ("_x",)
    DIM = 1024

    def _build(self, rng: np.random.Generator) -> None:
        path = ensure_memmap_file(self.n, self.seed, self.DIM)
        # copy-on-write mode: writable (torch warns about read-only arrays), reads are shared
        self._x = np.asarray(np.memmap(path, np.float32, "c", shape=(self.n, self.DIM)))

    def __getitem__(self, i: int) -> np.ndarray:
        self._ensure()
        i = self._check(i)
        return self._x[i]

    @classmethod
    def prepare(cls, n: int, seed: int = 0) -> dict[str, Any]:
        t0 = time.perf_counter()
        path = ensure_memmap_file(n, seed, cls.DIM)
        created = time.perf_counter() - t0
        return {"memmap_path": path, "memmap_bytes": _size(path),
                "memmap_create_s": round(created, 3),
                "memmap_warm_s": round(_warm_page_cache(path), 3)}


#: name -> (dataset class, batch size, n, quick n)
WORKLOADS: dict[str, tuple[type, int, int, int]] = {
    "image": (ImageDataset, 128, 4096, 1024),
    "tiny": (TinyDataset, 256, 200_000, 20_000),
    "compute": (ComputeDataset, 64, 2048, 256),
    "decode": (DecodeDataset, 64, 2048, 256),
    "dict": (DictDataset, 256, 50_000, 5_000),
    "memmap": (MemmapDataset, 256, 2 << 30 >> 12, 64 << 20 >> 12),  # 2 GiB / 64 MiB of rows
}

LOADERS = ("fastload", "fastload-1w", "torch", "single", "getitem", "memcpy-warm", "memcpy-fresh",
           "fastload-noshare", "fastload-thread", "fastload-process-threads", "grain",
           "grain-threads", "spdl")
#: The loaders that are fastload Loaders (``fastload-thread``: worker_method="thread";
#: ``fastload-process-threads``: worker_method="process_threads").
FASTLOAD_KINDS = ("fastload", "fastload-1w", "fastload-noshare", "fastload-thread",
                  "fastload-process-threads")
LOADER_LABEL = {
    "fastload": "fastload",
    "fastload-1w": "fastload",
    "fastload-noshare": "fastload, share_rows=False",
    "fastload-thread": "fastload, worker threads",
    "fastload-process-threads": "fastload, worker threads in one helper process",
    "grain": "Grain DataLoader (worker processes)",
    "grain-threads": "Grain MapDataset (thread reads)",
    "spdl": "SPDL pipeline (thread pool)",
    "torch": "torch DataLoader",
    "single": "single process",
    "getitem": "__getitem__ only",
    "memcpy-warm": "memcpy, warm buffer",
    "memcpy-fresh": "memcpy, fresh pages",
}


def default_loaders(workload: str) -> list[str]:
    """Every loader; ``fastload-1w`` only for ``compute`` (where the scaling matters);
    ``fastload-noshare`` (NOTE [pieces]: batches loaded by one worker each, as before)
    only when asked for."""
    return [x for x in LOADERS
            if (x != "fastload-1w" or workload == "compute")
            and x not in ("fastload-noshare", "fastload-thread", "fastload-process-threads",
                          "grain", "grain-threads", "spdl")]


def _grain(ds: Any, n: int, bs: int, shuffle: bool, seed: int, workers: int, prefetch: int,
           kind: str, extra: dict[str, Any]) -> Callable[[int], Iterator[Any]]:
    """Grain (``grain`` 0.2.18): its DataLoader with ``worker_count`` processes, or a MapDataset
    read by ``num_threads`` threads; one endless iterator, ``ceil(n / bs)`` batches an epoch
    (as Grain is used: its workers start once)."""
    import grain.python as gp

    extra["grain_version"] = __import__("grain").__version__
    if kind == "grain":
        sampler = gp.IndexSampler(num_records=n, shard_options=gp.NoSharding(), shuffle=shuffle,
                                  num_epochs=None, seed=seed)
        it: Iterator[Any] = iter(gp.DataLoader(
            data_source=ds, sampler=sampler, operations=[gp.Batch(bs, drop_remainder=False)],
            worker_count=workers, worker_buffer_size=prefetch))
    else:
        mds = gp.MapDataset.source(ds)
        if shuffle:
            mds = mds.shuffle(seed=seed)
        it = iter(mds.repeat().batch(bs).to_iter_dataset(
            gp.ReadOptions(num_threads=workers, prefetch_buffer_size=prefetch * bs)))
    per_epoch = -(-n // bs)

    def make_iter(e: int) -> Iterator[Any]:
        for _ in range(per_epoch):
            yield next(it)

    return make_iter


def _spdl(ds: Any, n: int, bs: int, shuffle: bool, seed: int, workers: int, prefetch: int,
          extra: dict[str, Any]) -> Callable[[int], Iterator[Any]]:
    """SPDL (``spdl-core`` 0.8.0): a pipeline per epoch over the epoch's batches of indices,
    whose stage loads and stacks one batch per task, ``workers`` tasks at once on its thread
    pool. (Every item through a stage costs SPDL ~0.17 ms of asyncio: a source of single
    indices, or a stage per sample, ran at 2.5-6k samples/s on tiny; batches are its fast
    path.)"""
    from spdl.pipeline import PipelineBuilder

    def load(idx: list[int]) -> Any:
        return np_collate([ds[i] for i in idx])

    def make_iter(e: int) -> Iterator[Any]:
        order = _order(n, shuffle, seed, e).tolist()
        chunks = [order[b:b + bs] for b in range(0, n, bs)]
        pipeline = (PipelineBuilder().add_source(chunks)
                    .pipe(load, concurrency=workers, output_order="input")
                    .add_sink(prefetch).build(num_threads=workers))
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=120)

    return make_iter


def have_pillow() -> bool:
    """Whether the ``decode`` workload can run (it decodes JPEGs with Pillow)."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        return False
    return True


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


class _Counted:
    """What the ``getitem`` loader yields per batch of indices: counts, no data to touch."""

    __slots__ = ("rows", "nbytes")

    def __init__(self, rows: int, nbytes: int) -> None:
        self.rows, self.nbytes = rows, nbytes


def touch(batch: Any) -> tuple[int, int, float]:
    """Read one element of every row of every leaf (so no lazy path is unfairly fast).

    Returns ``(rows, nbytes, checksum)``. Torch tensors are viewed as NumPy (zero-copy).
    """
    if isinstance(batch, _Counted):
        return batch.rows, batch.nbytes, 0.0
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


def _fresh_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array in freshly mapped anonymous pages (unmapped when the array dies).

    ``np.empty`` would not do: after the first big free, glibc raises its mmap threshold and
    then recycles the same warm heap pages batch after batch.
    """
    count = math.prod(shape)
    m = mmap.mmap(-1, max(1, count * dtype.itemsize))
    return np.frombuffer(m, dtype, count).reshape(shape)


class _MemcpySource:
    """The physical ceiling: per batch, copy the batch's bytes from an epoch-sized source.

    The source holds as many distinct bytes as one epoch delivers (rows tiled from the first
    real batch; for ``memmap`` it is the mapped file itself, read in contiguous chunks), so the
    copy streams from memory rather than from cache whenever the real epoch would. ``warm``:
    ``np.copyto`` into one preallocated batch; else into freshly mapped pages every batch.
    """

    def __init__(self, ds: Any, n: int, bs: int, warm: bool) -> None:
        self.n, self.bs, self.warm = n, bs, warm
        if isinstance(ds, MemmapDataset):
            ds._ensure()
            self.src: list[np.ndarray] = [ds._x]
        else:
            first = _leaves(np_collate([ds[i] for i in range(min(bs, n))]), [])
            self.src = []
            for leaf in first:
                s = np.empty((n, *leaf.shape[1:]), leaf.dtype)
                for start in range(0, n, len(leaf)):
                    k = min(len(leaf), n - start)
                    s[start : start + k] = leaf[:k]
                self.src.append(s)
        self.dst = [np.zeros((bs, *s.shape[1:]), s.dtype) for s in self.src] if warm else None

    def epoch(self, e: int) -> Iterator[tuple[np.ndarray, ...]]:
        for start in range(0, self.n, self.bs):
            k = min(self.bs, self.n - start)
            if self.dst is not None:
                out = [d[:k] for d in self.dst]
            else:
                out = [_fresh_array((k, *s.shape[1:]), s.dtype) for s in self.src]
            for d, s in zip(out, self.src):
                np.copyto(d, s[start : start + k])
            yield tuple(out)


# ---------------------------------------------------------------------------------------------
# Machine facts
# ---------------------------------------------------------------------------------------------
def _versions() -> dict[str, Any]:
    import fastload

    return {
        "fastload": fastload.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def machine_info() -> dict[str, Any]:
    """Versions and machine facts (torch only if installed; it is not imported otherwise)."""
    info = _versions()
    info.update(
        cpu_count=os.cpu_count(),
        sched_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        platform=platform.platform(),
        machine=platform.machine(),
        processor=_cpu_model(),
        mem_total_gib=_mem_total_gib(),
    )
    try:
        import importlib.metadata as md

        info["torch"] = md.version("torch")
    except Exception:
        info["torch"] = None
    info["loadavg"] = _loadavg()
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


def _mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


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


#: /proc/stat counts in ticks (usually 10 ms) per CPU: shorter intervals give no figure
_MIN_TICKS = 20


def _busy(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    """Fraction of all CPUs busy between two :func:`_cpu_times` (this run and anything else)."""
    if a is None or b is None or b[1] - a[1] < _MIN_TICKS:
        return None
    return round((b[0] - a[0]) / (b[1] - a[1]), 3)


def machine_busy(seconds: float = 2.0) -> float | None:
    """Fraction of all CPUs busy over the next ``seconds`` (call it while nothing of ours runs:
    other containers on the same machine do not show in ``top`` but do in /proc/stat)."""
    a = _cpu_times()
    time.sleep(seconds)
    return _busy(a, _cpu_times())


def wait_quiet(max_wait: float, threshold: float = 0.1, window: float = 3.0,
               report: Callable[[str], None] | None = None) -> float | None:
    """Wait (up to ``max_wait`` s) until the machine is below ``threshold`` busy over ``window``
    seconds; returns the last busy fraction measured."""
    deadline = time.monotonic() + max_wait
    while True:
        busy = machine_busy(window)
        if busy is None or busy < threshold or time.monotonic() >= deadline:
            return busy
        if report:
            report(f"machine {busy:.0%} busy (other processes); waiting for it to be quiet "
                   f"({deadline - time.monotonic():.0f} s left)")


def _tree_ticks(root: int) -> int | None:
    """utime + stime (clock ticks, the unit of /proc/stat) of ``root`` and its descendants."""
    total = 0
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            if pid == root:
                return None
    return total


def _others(a: tuple[int, int] | None, b: tuple[int, int] | None,
            ta: int | None, tb: int | None) -> float | None:
    """Fraction of all CPUs busy with processes *outside* this run's tree (other load)."""
    if a is None or b is None or ta is None or tb is None or b[1] - a[1] < _MIN_TICKS:
        return None
    return round(max(0.0, ((b[0] - a[0]) - (tb - ta)) / (b[1] - a[1])), 3)


# ---------------------------------------------------------------------------------------------
# Memory: PSS of a process tree
# ---------------------------------------------------------------------------------------------
def _pss_kib(pid: int) -> int | None:
    """``Pss`` of one process in KiB from ``/proc/<pid>/smaps_rollup`` (None if gone/unknown)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return out


def _tree(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo.extend(_children(p))
    return pids


def pss_supported() -> bool:
    return _pss_kib(os.getpid()) is not None and os.path.exists(
        f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children"
    )


class PssSampler(threading.Thread):
    """Samples the summed PSS of ``root`` and all its descendants every ``interval`` s.

    PSS (proportional set size) charges each shared page to the processes that map it in equal
    parts, so the sum over a tree counts shared memory (fork-shared pages, shared memory
    segments, page cache mapped by several workers) once, unlike RSS. Reading smaps_rollup
    walks the page tables of the target, which costs CPU for big mappings: the period
    stretches so that sampling takes at most ``max_busy`` of one CPU.
    """

    def __init__(self, root: int, interval: float = 0.02, max_busy: float = 0.05) -> None:
        super().__init__(name="fastload-pss-sampler", daemon=True)
        self.root, self.interval, self.max_busy = root, interval, max_busy
        self.peak_kib = 0
        self.peak_procs = 0
        self.max_procs = 0
        self.samples = 0
        self.cost_s = 0.0
        self.t0 = time.perf_counter()
        self.t_last = self.t0
        self._stop_ev = threading.Event()

    def sample(self) -> None:
        t = time.thread_time()
        total, procs = 0, 0
        for pid in _tree(self.root):
            k = _pss_kib(pid)
            if k is not None:
                total += k
                procs += 1
        if procs:
            self.samples += 1
            self.max_procs = max(self.max_procs, procs)
            if total > self.peak_kib:
                self.peak_kib, self.peak_procs = total, procs
        self.t_last = time.perf_counter()
        self.cost_s += time.thread_time() - t

    def run(self) -> None:
        while True:
            self.sample()
            cost = self.cost_s / max(1, self.samples)
            if self._stop_ev.wait(max(self.interval, cost / self.max_busy - cost)):
                return

    def stop(self) -> dict[str, Any]:
        self._stop_ev.set()
        self.join(5)
        span = self.t_last - self.t0
        return {
            "peak_kib": self.peak_kib or None,
            "peak_procs": self.peak_procs,
            "max_procs": self.max_procs,
            "samples": self.samples,
            "mean_period_ms": round(1e3 * span / max(1, self.samples - 1), 2),
            "sampler_cpu_ms": round(1e3 * self.cost_s, 1),
        }


# ---------------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------------
def _order(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """fastload's order (same SeedSequence), so single/getitem read the same batches."""
    if shuffle:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
        return rng.permutation(n).astype(np.int64)
    return np.arange(n, dtype=np.int64)


def _start_live_thread() -> None:
    """One more thread alive in the consuming process for the whole case, as training loops
    have (progress bars, metrics, logging, a memory sampler): it wakes every 10 ms and reads
    this process's RSS. Start methods are chosen by the threads alive (NOTE [start method] in
    fastload/_procs.py), so this is where a program with such a thread differs."""
    import threading

    def sample() -> None:
        while True:
            try:
                with open("/proc/self/statm") as f:
                    f.read()
            except OSError:
                pass
            time.sleep(0.01)

    threading.Thread(target=sample, name="memory-sampler", daemon=True).start()


def run_case(case: dict[str, Any], progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run one loader over one workload for ``case["epochs"]`` epochs in this process.

    ``case`` keys: loader, workload, n, batch_size, epochs, workers, prefetch, shuffle, seed,
    start_method (fastload and torch), torch_collate ("default" tensors | "numpy"), live_thread
    (one more thread alive from before construction: ``_start_live_thread``), prebuilt (the
    dataset's lazy build done before the clock starts: ``ds[0]``). Returns
    timings in nanoseconds and the derived figures of the steady state (epochs 2.., or epoch 1
    when only one was run). Must run in a fresh, single-threaded process (see PssSampler).

    Per epoch the consumer calls ``iter()`` and then ``next()`` until StopIteration; the time
    spent in those calls is the loader's (``wait``), the rest of the epoch is the consumer's
    ``touch`` of each batch. The *boundary* before epoch k+1 is the loader time from the
    consumer finishing the last batch of epoch k to holding the first batch of epoch k+1 (the
    StopIteration ``next()``, ``iter()``, the first ``next()``) plus the touch of that batch,
    i.e. the same definition as a batch gap; the benchmark's own bookkeeping between epochs
    is not counted.
    """
    kind = case["loader"]
    workload = case["workload"]
    cls, default_bs, default_n, _q = WORKLOADS[workload]
    n = int(case.get("n") or default_n)
    bs = int(case.get("batch_size") or default_bs)
    epochs = int(case.get("epochs", 3))
    workers = int(case.get("workers", 2))
    if kind == "fastload-1w":
        workers = 1
    prefetch = int(case.get("prefetch", 2))
    shuffle = bool(case.get("shuffle", True))
    seed = int(case.get("seed", 0))
    clock = time.perf_counter_ns
    extra: dict[str, Any] = {"prepare": cls.prepare(n, 0)}
    ds = cls(n, 0)
    try:
        import resource

        def minflt() -> int:
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

        def cpu_split() -> tuple[float, float]:  # (user, system) CPU seconds of this process
            u = resource.getrusage(resource.RUSAGE_SELF)
            return u.ru_utime, u.ru_stime
    except ImportError:  # pragma: no cover - not POSIX

        def minflt() -> int:
            return 0

        def cpu_split() -> tuple[float, float]:
            return 0.0, 0.0

    if kind == "torch":
        import torch  # noqa: F401  (before the clock starts: first batch excludes the import)
    if case.get("live_thread"):
        _start_live_thread()
    if case.get("prebuilt"):
        ds[0]  # the lazy build, outside "first batch" (fork and thread workers inherit it)
    pss_before = _pss_kib(os.getpid())
    loader: Any = None
    t_construct = clock()
    if kind in FASTLOAD_KINDS:
        import fastload

        how: dict[str, Any] = ({"worker_method": "thread"} if kind == "fastload-thread"
                               else {"start_method": case.get("start_method")})
        if kind == "fastload-process-threads":
            how["worker_method"] = "process_threads"
        loader = fastload.Loader(
            ds, bs, shuffle=shuffle, seed=seed, num_workers=workers, prefetch=prefetch,
            share_rows=kind != "fastload-noshare", **how,
        )
        extra["start_method"] = loader.start_method
        make_iter: Callable[[int], Iterator[Any]] = lambda e: iter(loader)  # noqa: E731
    elif kind == "torch":
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
    elif kind in ("grain", "grain-threads"):
        make_iter = _grain(ds, n, bs, shuffle, seed, workers, prefetch, kind, extra)
    elif kind == "spdl":
        make_iter = _spdl(ds, n, bs, shuffle, seed, workers, prefetch, extra)
    elif kind == "single":

        def make_iter(e: int) -> Iterator[Any]:
            order = _order(n, shuffle, seed, e)
            for b in range(0, n, bs):
                yield np_collate([ds[i] for i in order[b : b + bs].tolist()])

    elif kind == "getitem":

        def make_iter(e: int) -> Iterator[Any]:
            order = _order(n, shuffle, seed, e)
            nb = 0
            for b in range(0, n, bs):
                chunk = order[b : b + bs].tolist()
                for i in chunk:
                    s = ds[i]
                if not nb:
                    nb = _sample_nbytes(s)
                yield _Counted(len(chunk), len(chunk) * nb)

    elif kind in ("memcpy-warm", "memcpy-fresh"):
        src = _MemcpySource(ds, n, bs, warm=kind == "memcpy-warm")
        make_iter = src.epoch
    else:
        raise ValueError(f"unknown loader {kind!r}")

    epoch_ns: list[int] = []
    wait_ns: list[int] = []  # per epoch: time inside iter() / next()
    gaps: list[list[int]] = []  # per epoch: consumer-seen gaps, first batch of the epoch excluded
    boundary_ns: list[int] = []  # per epoch k >= 1 (0-based): gap from the end of epoch k-1
    boundary_wait_ns: list[int] = []
    samples_per_epoch: list[int] = []
    bytes_per_epoch: list[int] = []
    faults: list[int] = []  # minor page faults of this (consuming) process, per epoch
    sys_frac: list[float] = []  # kernel share of this process's CPU time, per epoch
    first_batch_ns = None
    checksum = 0.0
    close_ns = 0
    cpu0 = cpu1 = cpu_all0 = None
    tree0 = tree1 = tree_all0 = None
    tail = 0  # the StopIteration next() of the previous epoch
    try:
        for e in range(epochs):
            if e == 0:
                cpu_all0, tree_all0 = _cpu_times(), _tree_ticks(os.getpid())
            if e == min(1, epochs - 1):
                cpu0, tree0 = _cpu_times(), _tree_ticks(os.getpid())
            f0 = minflt()
            u0, s0 = cpu_split()
            t0 = clock()
            it = make_iter(e)
            t_it = clock()
            w = t_it - t0
            lead = w  # loader time before the first batch of this epoch
            g_e: list[int] = []
            ns = nbytes = 0
            last = 0
            while True:
                a = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    tail = clock() - a
                    w += tail
                    break
                b = clock()
                w += b - a
                rows, nb, acc = touch(batch)
                del batch
                done = clock()
                if first_batch_ns is None:
                    first_batch_ns = done - t_construct
                if not last:
                    if e:
                        boundary_wait_ns.append(tail + lead + (b - a))
                        boundary_ns.append(tail + lead + (done - a))
                else:
                    g_e.append(done - last)
                last = done
                ns += rows
                nbytes += nb
                checksum += acc
            epoch_ns.append(clock() - t0)
            wait_ns.append(w)
            faults.append(minflt() - f0)
            u1, s1 = cpu_split()
            sys_frac.append((s1 - s0) / ((u1 - u0) + (s1 - s0)) if u1 + s1 > u0 + s0 else 0.0)
            cpu1, tree1 = _cpu_times(), _tree_ticks(os.getpid())
            gaps.append(g_e)
            samples_per_epoch.append(ns)
            bytes_per_epoch.append(nbytes)
            if progress:
                progress(e + 1, epochs)
    finally:
        t_close = clock()
        if kind in FASTLOAD_KINDS:
            try:
                extra["stats"] = {k: v for k, v in loader.stats().items() if k != "ring"}
            except Exception:
                pass
            loader.close()
        elif kind == "torch":
            # persistent workers stop when the iterator is collected
            it_ = getattr(loader, "_iterator", None)
            if it_ is not None:
                it_._shutdown_workers()
        loader = None
        close_ns = clock() - t_close

    steady = slice(1, None) if epochs >= 2 else slice(0, None)
    st_ns = sum(epoch_ns[steady])
    st_samples = sum(samples_per_epoch[steady])
    st_bytes = sum(bytes_per_epoch[steady])
    st_gaps = [g for ge in gaps[steady] for g in ge]
    result = {
        "loader": kind,
        "workload": workload,
        "n": n,
        "batch_size": bs,
        "epochs": epochs,
        "workers": workers if kind in (*FASTLOAD_KINDS, "torch", "grain", "grain-threads",
                                       "spdl") else 0,
        "prefetch": prefetch,
        "shuffle": shuffle,
        "epoch_ns": epoch_ns,
        "wait_ns": wait_ns,
        "samples_per_epoch": samples_per_epoch,
        "first_batch_ns": first_batch_ns,
        "close_ns": close_ns,
        "steady_ns": st_ns,
        "samples_per_s": st_samples / (st_ns / 1e9) if st_ns else None,
        "gb_per_s": st_bytes / st_ns if st_ns else None,  # bytes/ns == GB/s
        "bytes_per_sample": (st_bytes / st_samples) if st_samples else None,
        "wait_frac": sum(wait_ns[steady]) / st_ns if st_ns else None,
        "batch_gap_ns": _pcts(st_gaps),
        "boundary_ns": boundary_ns,
        "boundary_wait_ns": boundary_wait_ns,
        "minor_faults_per_epoch": faults,
        "sys_frac_per_epoch": sys_frac,
        "checksum": checksum,
        "pid": os.getpid(),
        "pss_before_loader_kib": pss_before,
        "loadavg_end": _loadavg(),
    }
    # CPU use: over the steady state, or over all epochs (cpu_window) when that was too short
    # for /proc/stat's ticks
    window = "steady"
    if _busy(cpu0, cpu1) is None and _busy(cpu_all0, cpu1) is not None:
        cpu0, tree0, window = cpu_all0, tree_all0, "all epochs"
    result.update(
        cpu_window=window,
        cpu_busy_steady=_busy(cpu0, cpu1),
        cpu_others_steady=_others(cpu0, cpu1, tree0, tree1),
        cpu_tree_steady=(None if cpu0 is None or cpu1 is None or tree0 is None
                         or tree1 is None or cpu1[1] - cpu0[1] < _MIN_TICKS
                         else round((tree1 - tree0) / (cpu1[1] - cpu0[1]), 3)),
    )
    result.update(extra)
    return result


def _pcts(vals: list[int]) -> dict[str, float] | None:
    if not vals:
        return None
    return {"p10": _quantile(vals, 0.1), "p50": _quantile(vals, 0.5), "p90": _quantile(vals, 0.9),
            "max": float(max(vals))}


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
    pss_interval: float = 0.02,
) -> dict[str, Any]:
    """Run one case in a fresh interpreter and return its result dict.

    ``argv`` is the child's command line before the JSON case (default: this module's
    :func:`case_entry`); the child prints progress and result lines with fixed prefixes. A
    thread of *this* process samples the PSS of the child's process tree (``pss`` in the
    result; ``pss_interval=0`` turns it off). Raises RuntimeError (with the child's stderr
    tail) when the child fails or times out.
    """
    if argv is None:
        argv = [sys.executable, "-c", "import sys, _harness as b; sys.exit(b.case_entry())"]
    env = dict(os.environ)
    # The child (and its spawn/forkserver workers, which unpickle this module's datasets) finds
    # fastload's checkout and this directory first.
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.dirname(here), here] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    proc = subprocess.Popen(
        [*argv, json.dumps(case)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    sampler = PssSampler(proc.pid, pss_interval) if pss_interval > 0 and pss_supported() else None
    if sampler is not None:
        sampler.start()
    result = None
    deadline = time.monotonic() + timeout
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
                if sampler is not None:  # stop before the interpreter's teardown
                    result["pss"] = sampler.stop()
                    sampler = None
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
        if sampler is not None:
            sampler.stop()
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
# Summaries, targets, table, chart
# ---------------------------------------------------------------------------------------------
def _quantile(vals: Sequence[float | None], p: float) -> float:
    v = sorted(float(x) for x in vals if x is not None and not math.isnan(float(x)))
    if not v:
        return math.nan
    k = (len(v) - 1) * p
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _stat(vals: Sequence[float | None]) -> dict[str, float]:
    v = [x for x in vals if x is not None and not math.isnan(float(x))]
    return {"n": len(v), "median": _quantile(v, 0.5), "p10": _quantile(v, 0.1),
            "p90": _quantile(v, 0.9), "min": min(v) if v else math.nan,
            "max": max(v) if v else math.nan}


def _faults_per_batch(r: dict[str, Any]) -> float | None:
    """Minor page faults of the consuming process per steady-state batch."""
    f = r.get("minor_faults_per_epoch") or []
    steady = slice(1, None) if len(f) >= 2 else slice(0, None)
    samples = sum(r["samples_per_epoch"][steady])
    if not samples:
        return None
    return sum(f[steady]) / (samples / r["batch_size"])


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def summarize_runs(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and p10 / p90 / min / max) over the repeats of one (workload, loader)."""
    r0 = rs[0]
    gap = [r.get("batch_gap_ns") or {} for r in rs]
    pss = [r.get("pss") or {} for r in rs]

    def kib_to_mib(x: float | None) -> float | None:
        return None if x is None else x / 1024

    return {
        "workload": r0["workload"],
        "loader": r0["loader"],
        "n": r0["n"],
        "batch_size": r0["batch_size"],
        "epochs": r0["epochs"],
        "workers": r0["workers"],
        "repeats": len(rs),
        "start_method": r0.get("start_method"),
        "torch_collate": r0.get("torch_collate"),
        "bytes_per_sample": r0.get("bytes_per_sample"),
        "samples_per_s": _stat([r["samples_per_s"] for r in rs]),
        "gb_per_s": _stat([r["gb_per_s"] for r in rs]),
        "first_batch_ms": _stat([_ms(r["first_batch_ns"]) for r in rs]),
        "first_epoch_s": _stat([r["epoch_ns"][0] / 1e9 for r in rs]),
        "close_ms": _stat([_ms(r["close_ns"]) for r in rs]),
        # worst boundary of each run (k >= 1), median over runs
        "boundary_ms": _stat([_ms(max(r["boundary_ns"])) if r.get("boundary_ns") else None
                              for r in rs]),
        "gap_p50_ms": _stat([_ms(g.get("p50")) for g in gap]),
        "gap_p90_ms": _stat([_ms(g.get("p90")) for g in gap]),
        "gap_max_ms": _stat([_ms(g.get("max")) for g in gap]),
        "wait_frac": _stat([r.get("wait_frac") for r in rs]),
        "peak_pss_mib": _stat([kib_to_mib(p.get("peak_kib")) for p in pss]),
        "pss_before_mib": _stat([kib_to_mib(r.get("pss_before_loader_kib")) for r in rs]),
        "faults_per_batch": _stat([_faults_per_batch(r) for r in rs]),
        "sys_frac_steady": _stat([statistics.median((r.get("sys_frac_per_epoch") or [0.0])[1:]
                                                    or r.get("sys_frac_per_epoch") or [0.0])
                                  for r in rs]),
        "cpu_busy_steady": _stat([r.get("cpu_busy_steady") for r in rs]),
        "cpu_others_steady": _stat([r.get("cpu_others_steady") for r in rs]),
        "cpu_tree_steady": _stat([r.get("cpu_tree_steady") for r in rs]),
        "cpu_window_all": any(r.get("cpu_window") == "all epochs" for r in rs),
        "checksums": [r.get("checksum") for r in rs],
    }


def ratios(ws: dict[str, dict[str, Any]]) -> dict[str, float]:
    """fastload/torch, fastload/single, fastload/getitem (and fastload-1w/...) of median
    samples/s within one workload (``ws``: loader -> summary)."""
    out: dict[str, float] = {}
    for f in ("fastload", "fastload-1w"):
        s = ws.get(f)
        if s is None:
            continue
        fm = s["samples_per_s"]["median"]
        for other in ("torch", "single", "getitem", "memcpy-warm"):
            o = ws.get(other)
            if o is not None and o["samples_per_s"]["median"]:
                out[f"{f}/{other}"] = fm / o["samples_per_s"]["median"]
    noshare = ws.get("fastload-noshare")
    if "fastload" in ws and noshare is not None and noshare["samples_per_s"]["median"]:
        out["fastload/fastload-noshare"] = (ws["fastload"]["samples_per_s"]["median"]
                                            / noshare["samples_per_s"]["median"])
    return out


#: (workload, metric, threshold, description) of the throughput targets fastload is held to
TARGETS: tuple[tuple[str, str, float, str], ...] = (
    ("image", "fastload/torch", 1.5, "image: fastload >= 1.5x torch"),
    ("image", "fastload/single", 1.8, "image: fastload >= 1.8x single"),
    ("tiny", "fastload/torch", 4.0, "tiny: fastload >= 4x torch"),
    ("tiny", "fastload/single", 1.0, "tiny: fastload >= 1x single"),
    ("compute", "fastload/single", 1.9, "compute: fastload >= 1.9x single"),
    ("dict", "fastload/torch", 2.0, "dict: fastload >= 2x torch"),
)
#: a boundary is a stall when its gap exceeds this multiple of the steady p90 batch gap (and 1 ms)
STALL_FACTOR = 2.0


def evaluate_targets(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The throughput targets against the summaries; each row: target, value, goal, met, margin."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for s in summaries:
        by.setdefault(s["workload"], {})[s["loader"]] = s
    rows: list[dict[str, Any]] = []
    for w, key, goal, desc in TARGETS:
        rat = ratios(by.get(w, {}))
        if key in rat:
            v = rat[key]
            rows.append(dict(target=desc, value=f"{v:.2f}x", met=v >= goal,
                             margin=f"{v / goal - 1:+.1%}"))
    for w, ws in by.items():
        f, t = ws.get("fastload"), ws.get("torch")
        if f and t:
            fv, tv = f["first_batch_ms"]["median"], t["first_batch_ms"]["median"]
            rows.append(dict(target=f"{w}: first batch no later than torch's",
                             value=f"{fv:.0f} vs {tv:.0f} ms", met=fv <= tv,
                             margin=f"{fv - tv:+.0f} ms"))
    for w, ws in by.items():
        f = ws.get("fastload")
        if f and f["boundary_ms"]["n"]:
            b, p90 = f["boundary_ms"]["median"], f["gap_p90_ms"]["median"]
            limit = max(STALL_FACTOR * p90, 1.0) if not math.isnan(p90) else 1.0
            rows.append(dict(target=f"{w}: no stall at epoch boundaries (k >= 1)",
                             value=f"{b:.2f} ms (gap p90 {p90:.2f} ms)", met=b <= limit,
                             margin=f"{b - limit:+.2f} ms vs limit {limit:.2f}"))
    ws = by.get("image", {})
    f, t = ws.get("fastload"), ws.get("torch")
    if f and t and f["peak_pss_mib"]["n"] and t["peak_pss_mib"]["n"]:
        fv, tv = f["peak_pss_mib"]["median"], t["peak_pss_mib"]["median"]
        rows.append(dict(target="image: peak PSS <= 1/2 of torch's", value=f"{fv:.0f} vs {tv:.0f} MiB "
                         f"({fv / tv:.2f}x)", met=fv <= tv / 2, margin=f"{fv / (tv / 2) - 1:+.0%}"))
    return rows


def _rate(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w)
                                 for c, w, a in zip(cells, widths, align)) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else (":" + "-" * (w + 1))
                         for w, a in zip(widths, align)) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def loader_label(s: dict[str, Any]) -> str:
    label = LOADER_LABEL[s["loader"]]
    if s["loader"] in (*FASTLOAD_KINDS, "torch") and s.get("workers"):
        label += f" ({s['workers']}w, {s.get('start_method') or '?'})"
    return label


def render_table(summaries: list[dict[str, Any]]) -> str:
    """The markdown results table (one row per workload and loader)."""
    header = ["workload", "loader", "samples/s", "spread", "GB/s", "first batch",
              "epoch boundary", "gap p50 / p90 / max", "in next()", "peak PSS (loader)",
              "cpu busy (others)", "faults/batch", "vs torch", "vs single"]
    rows = []
    for s in summaries:
        ws = {x["loader"]: x for x in summaries if x["workload"] == s["workload"]}
        sp = s["samples_per_s"]
        med = sp["median"]

        def rel(other: str) -> str:
            o = ws.get(other)
            if o is None or not o["samples_per_s"]["median"]:
                return ""
            return f"{med / o['samples_per_s']['median']:.2f}x"

        spread = f"±{(sp['p90'] - sp['p10']) / 2 / med:.0%}" if sp["n"] > 1 and med else "-"
        memcpy = s["loader"].startswith("memcpy")
        pk, before = s["peak_pss_mib"]["median"], s["pss_before_mib"]["median"]
        pss = "-" if math.isnan(pk) else (
            f"{pk:,.0f} MiB" + ("" if math.isnan(before) else f" (+{pk - before:,.0f})"))
        b = s["boundary_ms"]
        gap = "-"
        if s["gap_p50_ms"]["n"]:
            gap = (f"{s['gap_p50_ms']['median']:.2f} / {s['gap_p90_ms']['median']:.2f} / "
                   f"{s['gap_max_ms']['median']:.1f} ms")
        rows.append([
            s["workload"],
            loader_label(s),
            _rate(med),
            spread,
            f"{s['gb_per_s']['median']:.3f}",
            "-" if memcpy else f"{s['first_batch_ms']['median']:.0f} ms",
            f"{b['median']:.2f} ms" if b["n"] and s["loader"] != "getitem" else "-",
            gap if s["loader"] != "getitem" else "-",
            f"{s['wait_frac']['median']:.0%}" if s["wait_frac"]["n"] else "-",
            pss,
            _busy_cell(s),
            f"{s['faults_per_batch']['median']:.0f}" if s["faults_per_batch"]["n"] else "-",
            rel("torch") if s["loader"] != "torch" else "1.00x" if "torch" in ws else "",
            rel("single") if s["loader"] != "single" else "1.00x",
        ])
    return _md_table(header, rows, "llrrrrrrrrrrrr")


#: What the narrow table of ``python -m fastload bench`` shows, one line per column.
CONSOLE_LEGEND = (
    ("samples/s", "steady state (epochs 2..E), median over fresh-process runs"),
    ("vs torch", "samples/s over torch DataLoader's, same dataset, order and workers"),
    ("vs single", "samples/s over the single-process loop's (same dataset, order, np.stack)"),
    ("1st batch", "from building the loader to the first batch in hand"),
    ("epoch gap", "worst pause between the last batch of an epoch and the next epoch's first"),
    ("peak PSS", "peak memory of the loader's processes together (shared pages counted once)"),
    ("faults/b", "minor page faults of the consuming process per batch"),
)

#: Others' CPU use (fraction of all CPUs) above which the run is warned about.
BUSY_WARN = 0.25
#: Kernel share of the single-process loop's CPU time above which it is called
#: page-fault-bound (its time goes to mapping and zeroing fresh pages, not to its work).
FAULT_BOUND = 0.3


def render_console(summaries: list[dict[str, Any]]) -> str:
    """The table of ``python -m fastload bench``: at most 100 columns, a legend line for every
    column, and warnings about what makes its ratios unreliable (others using the CPUs, a
    page-fault-bound baseline). The wide table is ``--wide`` (and benchmarks/bench_loader.py)."""
    import textwrap

    header = ["loader", "samples/s", "vs torch", "vs single", "1st batch", "epoch gap",
              "peak PSS", "faults/b"]
    by = {x["loader"]: x for x in summaries}
    rows = []
    for s in summaries:
        med = s["samples_per_s"]["median"]

        def rel(other: str) -> str:
            o = by.get(other)
            if o is None or not o["samples_per_s"]["median"]:
                return "-"
            return f"{med / o['samples_per_s']['median']:.2f}x"

        label = loader_label(s).replace("torch DataLoader", "torch")
        b, pk, f = s["boundary_ms"], s["peak_pss_mib"]["median"], s["faults_per_batch"]
        rows.append([label, _rate(med), rel("torch"), rel("single"),
                     f"{s['first_batch_ms']['median']:.0f} ms",
                     f"{b['median']:.1f} ms" if b["n"] else "-",
                     "-" if math.isnan(pk) else f"{pk:,.0f} MiB",
                     f"{f['median']:,.0f}" if f["n"] else "-"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    out = [fmt(header), *(fmt(r) for r in rows), ""]
    for name, what in CONSOLE_LEGEND:
        out.append(f"{name + ':':<11}{what}")
    warn = []
    others = [x["cpu_others_steady"]["max"] for x in summaries if x["cpu_others_steady"]["n"]]
    if others and max(others) > BUSY_WARN:
        warn.append(
            f"other processes kept up to {max(others):.0%} of the CPUs busy during the runs: "
            "every figure is lower and the ratios noisier than on a quiet machine; rerun when "
            "it is quiet")
    single = by.get("single")
    if single is not None and single.get("sys_frac_steady", {}).get("n"):
        kernel = single["sys_frac_steady"]["median"]
        if kernel > FAULT_BOUND:
            faults = single["faults_per_batch"]["median"] if single["faults_per_batch"]["n"] \
                else math.nan
            warn.append(
                f"the single-process baseline spent {kernel:.0%} of its CPU time in the kernel "
                f"({faults:,.0f} page faults per batch): it is page-fault-bound here, so 'vs "
                "single' depends on how fast this machine maps fresh memory (huge pages, "
                "cgroup accounting) and varies between machines; 'vs torch' does not")
    if warn:
        out.append("")
        for w in warn:
            out.extend(textwrap.wrap(w, 100, initial_indent="warning: ",
                                     subsequent_indent="         "))
    return "\n".join(out)


def _busy_cell(s: dict[str, Any]) -> str:
    b, o = s["cpu_busy_steady"], s["cpu_others_steady"]
    if not b["n"]:
        return "?"
    return (f"{b['median']:.0%}" + (f" ({o['max']:.0%})" if o["n"] else "")
            + ("*" if s.get("cpu_window_all") else ""))


def render_targets(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no targets could be evaluated: fastload and torch/single are both needed)"
    return _md_table(["target", "measured", "met", "margin"],
                     [[r["target"], r["value"], "yes" if r["met"] else "**no**", r["margin"]]
                      for r in rows], "llll")


COLUMN_NOTES = """\
- **samples/s, GB/s**: steady state (epochs 2..E), median over fresh-process repeats; *spread*
  is half the p10-p90 range across repeats, relative to the median. GB/s = bytes of the
  delivered batch arrays per second (10^9).
- **first batch**: from constructing the loader to the first batch in hand and touched (worker
  start, the workers' lazy dataset build, shared memory setup, the batch itself).
- **epoch boundary**: worst over the boundaries k -> k+1 (k >= 1, i.e. every boundary of the
  run) of the time from the consumer finishing the last batch of epoch k to finishing the first
  batch of epoch k+1 (StopIteration, `iter()`, first `next()`, touch), median over repeats.
  Compare it with *gap*, the same interval between two batches of one epoch in the steady
  state (p50 / p90 / max within a run, median over runs): a boundary well above the p90 gap
  is a stall; a max far above p90 is a stall somewhere else in the epoch.
- **in next()**: fraction of the steady-state wall time the consumer spent inside the loader's
  `iter()` / `next()` (waiting for data, or doing the work itself for the in-process loaders).
- **peak PSS (loader)**: peak over the whole run of the summed `Pss` (smaps_rollup) of the
  consuming process and all its descendants (workers, forkserver, resource tracker), sampled
  every ~20 ms (less often when sampling would take over 5% of one CPU: ~1 ms per process
  with torch loaded) by a thread of the launching process; in parentheses the growth over the
  consuming process's own PSS just before the loader was built (interpreter, NumPy and, for
  torch, torch itself are in the total but not in the growth). Shared pages are counted once.
- **cpu busy (others)**: fraction of *all* CPUs busy during the steady state (from
  /proc/stat, median over repeats); in parentheses the part used by processes *outside* the
  run's own process tree, in the worst repeat: other jobs on a shared machine, and the PSS
  sampler (a few % of one CPU).
  `*`: the steady state was too short for /proc/stat's 10 ms ticks, so the figure covers all
  epochs (start-up included); "?": even that was too short.
- **faults/batch**: minor page faults of the consuming process per steady-state batch.
- **vs torch / vs single**: ratio of median samples/s.
- **memcpy rows**: the physical ceiling: per batch, `np.copyto` of the same bytes from an
  epoch-sized source (for memmap: the mapped file, contiguous rows) into one preallocated
  buffer (warm) or into freshly `mmap`ed pages (fresh); no dataset code, no workers."""


def plot_summaries(summaries: list[dict[str, Any]], path: str, title: str = "") -> str | None:
    """Bar chart (samples/s, log scale, and peak PSS) per workload; returns a message when
    matplotlib is missing (nothing written), else None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no chart written"
    workloads = list(dict.fromkeys(s["workload"] for s in summaries))
    fig, axes = plt.subplots(len(workloads), 2, figsize=(12, 1.0 + 2.3 * len(workloads)),
                             squeeze=False, gridspec_kw={"width_ratios": [3, 2]})
    colors = {"fastload": "#1f77b4", "fastload-1w": "#6baed6", "fastload-noshare": "#9467bd",
              "torch": "#ee4c2c",
              "single": "#7f7f7f", "getitem": "#bdbdbd", "memcpy-warm": "#2ca02c",
              "memcpy-fresh": "#98df8a"}
    for row, w in enumerate(workloads):
        ss = [s for s in summaries if s["workload"] == w]
        labels = [loader_label(s) for s in ss]
        y = np.arange(len(ss))
        ax = axes[row][0]
        vals = [s["samples_per_s"]["median"] for s in ss]
        lo = [v - s["samples_per_s"]["min"] for v, s in zip(vals, ss)]
        hi = [s["samples_per_s"]["max"] - v for v, s in zip(vals, ss)]
        ax.barh(y, vals, xerr=[lo, hi], color=[colors.get(s["loader"], "#999") for s in ss])
        ax.set_xscale("log")
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{w}: samples/s (steady state, median; bars: min-max)", fontsize=9)
        for yi, v, s in zip(y, vals, ss):
            ax.text(max(v, s["samples_per_s"]["max"]) * 1.05, yi,
                    f"{_rate(v)}  {s['gb_per_s']['median']:.2f} GB/s", va="center", fontsize=7)
        ax.set_xlim(right=max(vals) * 8)
        ax = axes[row][1]
        pk = [s["peak_pss_mib"]["median"] for s in ss]
        pk = [0.0 if math.isnan(v) else v for v in pk]
        ax.barh(y, pk, color=[colors.get(s["loader"], "#999") for s in ss])
        ax.set_yticks(y, [""] * len(ss))
        ax.invert_yaxis()
        ax.set_title(f"{w}: peak PSS of the process tree (MiB)", fontsize=9)
        for yi, v in zip(y, pk):
            ax.text(v, yi, f" {v:,.0f}", va="center", fontsize=7)
        ax.set_xlim(right=max(pk + [1.0]) * 1.25)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


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
        sys.stderr.write(f"\r{self.desc}: {self.done}/{self.total} epochs ({pct:3.0f}%) {what:<26}")
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
            sys.stderr.write("\r" + " " * (len(self.desc) + 52) + "\r")
            sys.stderr.flush()


def _torch_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def main(argv: list[str] | None = None) -> int:
    """``python -m fastload bench [--workload W] [--workers N] [--quick] [--plot PNG] ...``"""
    from fastload._cli import non_negative_int, positive_int

    p = argparse.ArgumentParser(
        prog="python -m fastload bench",
        description="Throughput of fastload on a built-in synthetic dataset, against a "
        "single-process loop (and torch's DataLoader when torch is installed). Each loader "
        "runs in a fresh process; numbers are for the steady state (epochs 2..). The full "
        "suite is benchmarks/bench_loader.py in the source tree.",
    )
    p.add_argument("--workload", choices=list(WORKLOADS), default="image")
    p.add_argument("--workers", type=non_negative_int, default=2,
                   help="worker processes (default 2)")
    p.add_argument("--quick", action="store_true", help="smaller dataset, 2 epochs (a few seconds)")
    p.add_argument("--n", type=positive_int, default=None,
                   help="samples per epoch (default per workload)")
    p.add_argument("--batch-size", type=positive_int, default=None)
    p.add_argument("--epochs", type=positive_int, default=None, help="default 3 (2 with --quick)")
    p.add_argument("--repeat", type=positive_int, default=None,
                   help="fresh-process runs per loader, interleaved; the median is shown "
                        "(default 3, 1 with --quick)")
    p.add_argument("--torch", choices=("auto", "yes", "no"), default="auto",
                   help="include torch.utils.data.DataLoader (auto: when installed)")
    p.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), default=None)
    p.add_argument("--plot", metavar="PNG", help="also write a bar chart (needs matplotlib)")
    p.add_argument("--json", metavar="PATH", help="also append the results as JSON lines")
    p.add_argument("--wide", action="store_true",
                   help="every measured column (GB/s, spread, gaps, CPU, ...) with its notes")
    args = p.parse_args(argv)

    cls, bs, n_full, n_quick = WORKLOADS[args.workload]
    # Refused at parse time when < 1 (positive_int): 0 is not "the default".
    n = args.n if args.n is not None else (n_quick if args.quick else n_full)
    bs = args.batch_size if args.batch_size is not None else bs
    epochs = args.epochs if args.epochs is not None else (2 if args.quick else 3)
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
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
    if args.workload == "memmap":
        path = ensure_memmap_file(n, 0, MemmapDataset.DIM)
        print(f"memmap file: {path} ({_size(path) / 2**20:,.0f} MiB, reused across runs)")
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
    summaries = [summarize_runs(runs[name]) for name in loaders]
    steady = f"epochs 2..{epochs}" if epochs >= 2 else "epoch 1 (includes start-up)"
    print(f"steady state = {steady}, median of {repeat} fresh-process run(s)\n")
    if args.wide:
        print(render_table(summaries) + "\n\n" + COLUMN_NOTES)
    else:
        print(render_console(summaries))
    if (os.cpu_count() or 1) <= args.workers:
        print(f"note: {os.cpu_count()} CPUs for {args.workers} workers plus the main process: "
              "workers compete with the consumer;\n      numbers are noisy on shared machines.")
    if args.plot:
        msg = plot_summaries(summaries, args.plot,
                             f"python -m fastload bench --workload {args.workload} (n={n}, "
                             f"{args.workers} workers, {info['cpu_count']} CPUs)")
        print(f"chart: {msg}" if msg else f"chart: {args.plot}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"type": "machine", **info}) + "\n")
            for rs in runs.values():
                for r in rs:
                    f.write(json.dumps({"type": "case", **r}) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
