"""``python -m fastload doctor module:make_dataset`` and ``fastload.doctor(dataset)``: where a
dataset's loading time goes on this machine, and the settings to use.

NOTE [doctor]
Every figure is measured here, now, on the user's dataset; nothing is estimated from a model:

1. ``__getitem__`` alone (and ``__getitems__`` when the dataset has one), in this process, over
   a shuffled order: seconds per sample.
2. The single-process loop, ``Loader(num_workers=0)``: the dataset plus fastload's packing of
   each sample into the batch; packing = this minus (1).
3. ``Loader(num_workers=k)`` for k = 1 .. the CPUs this process may use (or ``workers=``): the
   steady rate (after a warm-up of a few batches, which also takes the start-up out), and the
   main process's CPU per sample (what the consumer pays to receive a batch).

The loop holds each batch until the next one is in hand, as a user's ``for batch in loader``
does (dropping it first lets ``num_workers=0`` reuse the batch's memory, which a training loop
does not: measured here, that alone made the single process look 45 % faster on the image
workload). Each measurement runs for ``seconds`` (at least a few batches); all of them run
``repeat`` times, interleaved (a busy spell of the machine then hits every setting, not one),
and the median is used. The recommendation is the setting with the best median; a fewer-worker
setting within 3 % of it is named as the cheaper alternative. ``prefetch`` is then measured at
the recommended worker count: twice the default, interleaved with more runs of the default,
which join that count's row (one row and one figure per setting; the recommendation line
repeats the figure of the row it marks). Memory per worker is read from
``/proc/<pid>/smaps_rollup`` at the recommended setting over two epochs (or as much of them as
``memory_seconds`` allows, said so). Warnings come from measurements too: threads found in a
worker (a BLAS or OpenMP pool per worker), threads running in this process before workers fork,
a worker's private memory growing (copy-on-read of Python objects), batches that were copied or
spilled out of their slot, object leaves, and other processes' CPU use before and during the runs.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import textwrap
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._bench import DOCTOR_DATASETS as _BUILTIN

__all__ = ["Diagnosis", "doctor", "main"]

#: A fewer-worker setting this close to the best (fraction of its rate) is named as cheaper.
NEAR_BEST = 0.97
#: Private dirty memory a worker may gain over the memory run before it is warned about.
GROWTH_WARN_BYTES = 32 * 2**20


@dataclass
class Setting:
    """One measured loader setting."""

    workers: int
    prefetch: int | None = None
    rates: list[float] = field(default_factory=list)  # samples/s, one per repeat
    main_cpu: list[float] = field(default_factory=list)  # main-process CPU s per sample
    threads: int | None = None  # threads of worker 0 at the end (None: no worker)
    method: str = "process"  # worker_method (NOTE [thread workers] in _threads.py)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def label(self) -> str:
        if self.workers == 0:
            return "single process (num_workers=0)"
        extra = f", prefetch={self.prefetch}" if self.prefetch is not None else ""
        return f"num_workers={self.workers}{extra}{', threads' * (self.method == 'thread')}"


@dataclass
class Diagnosis:
    """What ``doctor`` measured and recommends (also printed as a table)."""

    samples: int
    batch_size: int
    cpus: int
    getitem_s: float  # median seconds per __getitem__
    getitem_p90_s: float
    getitems_s: float | None  # per sample through __getitems__, if the dataset has it
    settings: list[Setting]
    prefetch: list[Setting]
    recommended_workers: int
    recommended_prefetch: int | None
    cheaper_workers: int | None
    memory: dict[str, Any]
    warnings: list[str]
    advice: list[str]
    threads: Setting | None = None  # the best count's rate with thread workers, if measured
    recommended_method: str = "process"  # "thread": thread workers do as well (or better)
    loader_kwargs: dict[str, Any] = field(default_factory=dict)  # given, used in every run

    @property
    def best(self) -> Setting:
        return max(self.settings, key=lambda s: s.rate)

    @property
    def recommended(self) -> Setting:
        """The measured setting that :meth:`kwargs` recommends (the row marked ``*``)."""
        rec = (self.recommended_workers, self.recommended_method, self.recommended_prefetch)
        rows = [*self.settings, *self.prefetch, *([self.threads] if self.threads else [])]
        return next(s for s in rows if (s.workers, s.method, s.prefetch) == rec)

    def kwargs(self) -> dict[str, Any]:
        """The recommended ``fastload.Loader`` keyword arguments, then those every run was
        given (``ragged=``, ``start_method=``...): the setting measured."""
        kw: dict[str, Any] = {"num_workers": self.recommended_workers}
        if self.recommended_method == "thread":
            kw["worker_method"] = "thread"
        if self.recommended_prefetch is not None:
            kw["prefetch"] = self.recommended_prefetch
        return kw | {k: v for k, v in self.loader_kwargs.items() if k not in kw}

    def table(self) -> str:
        """The report, at most 80 columns wide."""
        single = next((s for s in self.settings if s.workers == 0), None)
        out = [f"{'setting':<34}{'samples/s':>12}{'vs single':>11}{'main CPU/sample':>17}"]
        recommended = self.recommended
        for s in [*self.settings, *self.prefetch, *([self.threads] if self.threads else [])]:
            vs = f"{s.rate / single.rate:.2f}x" if single and single.rate else "-"
            cpu = f"{statistics.median(s.main_cpu) * 1e6:,.1f} us" if s.main_cpu else "-"
            mark = " *" if s is recommended else ""
            out.append(f"{s.label + mark:<34}{s.rate:>12,.0f}{vs:>11}{cpu:>17}")
        out.append("")
        out.append("where a sample's time goes (one process):")
        pack = max(0.0, 1 / single.rate - self.getitem_s) if single and single.rate else None
        out.append(f"  dataset __getitem__   {_us(self.getitem_s)} (90th percentile "
                   f"{_us(self.getitem_p90_s)})")
        if self.getitems_s is not None:
            out.append(f"  dataset __getitems__  {_us(self.getitems_s)} per sample")
        if pack is not None:
            out.append(f"  packing into a batch  {_us(pack)}")
        pooled = [s for s in self.settings if s.workers and s.main_cpu]
        if pooled:  # with workers, the main process only receives (the best such setting)
            top = max(pooled, key=lambda s: s.rate)
            out.append(f"  consumer (main CPU)   {_us(statistics.median(top.main_cpu))} at "
                       f"{top.label}")
        mem = self.memory
        if mem.get("workers"):
            out.append("")
            out.append(f"memory at num_workers={mem['num_workers']} ({mem['over']}):")
            for w in mem["workers"]:
                growth = w.get("growth")
                g = f", grew {growth / 2**20:+,.1f} MiB" if growth is not None else ""
                out.append(f"  worker {w['worker']}: USS {w['uss'] / 2**20:,.1f} MiB, PSS "
                           f"{w['pss'] / 2**20:,.1f} MiB{g}")
        out.append("")
        line = f"recommended: fastload.Loader(dataset, {self.batch_size}, "
        items = [f"{k}={v!r}" for k, v in self.kwargs().items()]
        for i, item in enumerate(items):  # wrapped between arguments, within 80 columns
            piece = item + (", " if i < len(items) - 1 else ")")
            if len(line) + len(piece) > 75 and i:
                out.append(line.rstrip())
                line = " " * 29
            line += piece
        out.append(line + "  [*]")
        n = len(recommended.rates)
        out.append(f"  {recommended.rate:,.0f} samples/s: the row marked *, the median of {n} "
                   f"run{'s' * (n != 1)}")
        if self.cheaper_workers is not None:
            out.append(f"  num_workers={self.cheaper_workers} is within "
                       f"{(1 - NEAR_BEST) * 100:.0f}% of it with fewer workers")
        for a in self.advice:
            out.extend(textwrap.wrap(a, 80, initial_indent="  - ", subsequent_indent="    "))
        if self.warnings:
            out.append("")
            out.append("warnings:")
            for w in self.warnings:
                out.extend(textwrap.wrap(w, 80, initial_indent="  ! ",
                                         subsequent_indent="    "))
        out.append("")
        out.extend(textwrap.wrap(
            "samples/s: median over repeats of the steady rate (after warm-up batches); vs "
            "single: over num_workers=0; main CPU/sample: CPU time of this process per sample "
            "(with workers: receiving and unpacking batches); * the recommended setting", 80))
        return "\n".join(out)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:>10,.1f} us"


def _threads_of(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def _busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has been busy (``/proc/stat``; None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and its children that have ended (the workers, closed)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _others_cpus(seconds: float) -> float | None:
    """How many CPUs other processes keep busy, measured over ``seconds`` now."""
    b0, o0, t0 = _busy_cpu_s(), _own_cpu_s(), time.perf_counter()
    if b0 is None:
        return None
    time.sleep(seconds)
    b1, o1 = _busy_cpu_s(), _own_cpu_s()
    assert b1 is not None
    return max(0.0, (b1 - b0) - (o1 - o0)) / (time.perf_counter() - t0)


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _copy_of(ds: Any) -> Any:
    """``ds`` as a spawned worker would get it (pickled), else a deep copy, else itself."""
    import copy
    import pickle

    try:
        return pickle.loads(pickle.dumps(ds, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - not picklable (fork workers need not pickle it)
        pass
    try:
        return copy.deepcopy(ds)
    except Exception:  # noqa: BLE001
        return ds


def _time_getitem(ds: Any, order: list[int], seconds: float) -> tuple[float, float]:
    """Median and 90th-percentile seconds per ``ds[i]``."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    for i in order:
        t = time.perf_counter()
        ds[i]
        times.append(time.perf_counter() - t)
        if t > deadline and len(times) >= 8:
            break
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.9))]


def _time_getitems(ds: Any, order: list[int], bs: int, seconds: float) -> float:
    done, t0 = 0, time.perf_counter()
    while done < len(order):
        ds.__getitems__(order[done : done + bs])
        done += len(order[done : done + bs])
        if time.perf_counter() - t0 > seconds and done >= 2 * bs:
            break
    return (time.perf_counter() - t0) / max(done, 1)


class _Progress:
    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.done, self.quiet = total, 0, quiet

    def __call__(self, what: str) -> None:
        self.done += 1
        if not self.quiet:
            print(f"doctor [{self.done}/{self.total}] {what}", file=sys.stderr, flush=True)


def _measure(ds: Any, bs: int, s: Setting, seconds: float, loader_kw: dict[str, Any],
             caught: list[str]) -> None:
    """One run of setting ``s``: appends its steady rate and the main CPU per sample."""
    from .loader import Loader

    kw = dict(loader_kw, worker_method=s.method)
    if s.prefetch is not None:
        kw["prefetch"] = s.prefetch
    warm = max(2, 2 * s.workers)  # batches: start-up, the first samples, the pipeline filling
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with Loader(ds, bs, shuffle=True, seed=0, num_workers=s.workers, **kw) as ld:
            got = batches = 0
            t0 = c0 = 0.0
            deadline = math.inf
            for batch in _epochs(ld):  # as many epochs as it takes (a small dataset)
                batches += 1
                if batches == warm:
                    t0, c0 = time.perf_counter(), time.process_time()
                    deadline = t0 + seconds
                elif batches > warm:
                    got += _rows(batch, bs)
                    if time.perf_counter() > deadline and got >= 2 * bs:
                        break
                # ``batch`` stays referenced while the next one is made, as in a user's
                # ``for batch in loader:`` loop (with num_workers=0 that decides whether its
                # memory can be reused or fresh pages are mapped for every batch)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            if s.workers and s.method == "process" and ld._worker_pids():
                pid = ld._worker_pids()[0]
                s.threads = _threads_of(pid) if pid else None
            stats = ld.stats()
    s.rates.append(got / elapsed)
    s.main_cpu.append(cpu / max(got, 1))
    if stats.get("copied_batches"):
        caught.append(f"{s.label}: {stats['copied_batches']} batches were copied out of their "
                      "slot (more batches held at once than max_held allows)")
    if stats.get("spilled_batches"):
        caught.append(f"{s.label}: {stats['spilled_batches']} batches outgrew their slot and "
                      "travelled by the worker's pipe (object or ragged leaves larger than the "
                      "first sample's)")
    caught.extend(str(x.message) for x in w)


def _epochs(loader: Any) -> Any:
    while True:
        yield from loader


def _rows(batch: Any, bs: int) -> int:
    """Samples in a batch (its first array leaf's length; else the batch size)."""
    leaf = batch
    while isinstance(leaf, (tuple, list, dict)) and len(leaf):
        leaf = next(iter(leaf.values())) if isinstance(leaf, dict) else leaf[0]
    return len(leaf) if isinstance(leaf, np.ndarray) and leaf.ndim else bs


def _memory_run(ds: Any, bs: int, workers: int, prefetch: int | None, epoch_s: float,
                budget_s: float, loader_kw: dict[str, Any]) -> dict[str, Any]:
    """Each worker's memory after the first batch and after two epochs (or the budget)."""
    from ._memory import process_memory
    from .loader import Loader

    if workers == 0:
        return {}
    kw = dict(loader_kw)
    if prefetch is not None:
        kw["prefetch"] = prefetch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the growth is reported below, with numbers
        with Loader(ds, bs, shuffle=True, seed=1, num_workers=workers, **kw) as ld:
            deadline = time.perf_counter() + budget_s
            start: dict[int, int] = {}
            epochs = 0
            cut = False
            for _ in range(2):
                for k, batch in enumerate(ld):
                    del batch
                    if not start:
                        for pid in ld._worker_pids():
                            mem = process_memory(pid) if pid is not None else None
                            if pid is not None and mem is not None:
                                start[pid] = mem["private_dirty"]
                    if time.perf_counter() > deadline and k > 0:
                        cut = True
                        break
                if cut:
                    break
                epochs += 1
            rows = []
            for i, pid in enumerate(ld._worker_pids()):
                mem = process_memory(pid) if pid else None
                if mem is None:
                    continue
                growth = mem["private_dirty"] - start[pid] if pid in start else None
                rows.append({"worker": i, "pid": pid, "uss": mem["uss"], "pss": mem["pss"],
                             "growth": growth})
            suspects = ld._unshared()
    over = "two epochs" if not cut else (
        f"{epochs} epoch(s) and part of the next: {budget_s:.0f} s allowed, an epoch takes "
        f"~{epoch_s:.0f} s")
    return {"num_workers": workers, "workers": rows, "over": over, "suspects": suspects}


def doctor(dataset: Any, batch_size: int = 64, workers: list[int] | int | None = None, *,
           seconds: float = 2.0, repeat: int = 3, memory_seconds: float = 20.0,
           quiet: bool = False, **loader_kwargs: Any) -> Diagnosis:
    """Measure ``dataset`` (an object with ``__len__`` and ``__getitem__``, or a callable
    returning one) on this machine and recommend ``num_workers`` and ``prefetch``.

    ``workers``: the worker counts to try (an int: 1 .. that; default 1 .. the CPUs this
    process may use); the single process is always measured. ``seconds``: per measurement;
    ``repeat``: runs of every setting, interleaved, the median counted. Other keyword
    arguments go to every ``fastload.Loader`` (``ragged=``, ``stack=``, ``start_method=``...).
    Progress goes to stderr (``quiet=True``: none). See NOTE [doctor] in fastload/_doctor.py.
    """
    if isinstance(dataset, type) or (callable(dataset) and not hasattr(dataset, "__getitem__")):
        dataset = dataset()  # a factory, or a class whose arguments all have defaults
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(
            f"doctor needs a map-style dataset (__len__ and __getitem__), got "
            f"{type(dataset).__name__}; pass the dataset, or a function that returns one")
    if batch_size < 1 or seconds <= 0 or repeat < 1:
        raise ValueError("batch_size and repeat must be >= 1, seconds > 0")
    n = len(dataset)
    if n < 1:
        raise ValueError("the dataset is empty: nothing to measure")
    cpus = _usable_cpus()
    if workers is None:
        counts = list(range(1, cpus + 1))
    elif isinstance(workers, int):
        counts = list(range(1, workers + 1))
    else:
        counts = sorted({int(k) for k in workers if int(k) > 0})
    bs = min(batch_size, n)
    found: list[str] = []
    others_before = _others_cpus(0.5)
    busy0, own0, wall0 = _busy_cpu_s(), _own_cpu_s(), time.perf_counter()
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    steps = 1 + repeat * (1 + len(counts)) + 3 * repeat + 1
    progress = _Progress(steps, quiet)

    # What runs in this process (the timing of __getitem__, num_workers=0) runs on a copy, as a
    # spawned worker gets it: a dataset that opens files or starts threads at its first sample
    # must not do that here before the workers fork (they would inherit it all).
    local = _copy_of(dataset)
    order = np.random.default_rng(0).permutation(n).tolist()
    progress("timing __getitem__ alone")
    per, p90 = _time_getitem(local, order, seconds)
    per_many = None
    if callable(getattr(local, "__getitems__", None)):
        per_many = _time_getitems(local, order, bs, seconds)

    settings = [Setting(0)] + [Setting(k) for k in counts]
    for r in range(repeat):
        for s in (settings if r % 2 == 0 else settings[::-1]):
            progress(f"run {r + 1}/{repeat}: {s.label}")
            _measure(local if s.workers == 0 else dataset, bs, s, seconds, loader_kwargs,
                     found)
    best = max(settings, key=lambda s: s.rate)

    rec_prefetch: int | None = None
    pre: list[Setting] = []
    threads: Setting | None = None  # worker_method="thread" at the best count
    if best.workers:
        import inspect

        from .loader import Loader

        default = int(inspect.signature(Loader).parameters["prefetch"].default)
        # The default prefetch is ``best`` itself: its runs here join its row (NOTE [doctor]).
        pre = [Setting(best.workers, 2 * default)]
        for r in range(repeat):
            for s in ([best, pre[0]] if r % 2 == 0 else [pre[0], best]):
                progress(f"run {r + 1}/{repeat}: {s.label}")
                _measure(dataset, bs, s, seconds, loader_kwargs, found)
        if pre[0].rate > best.rate / NEAR_BEST:
            rec_prefetch = pre[0].prefetch
        if "start_method" not in loader_kwargs:  # threads at that count: as fast, no processes?
            threads = Setting(best.workers, rec_prefetch, method="thread")
            for r in range(repeat):
                progress(f"run {r + 1}/{repeat}: {threads.label}")
                _measure(dataset, bs, threads, seconds, loader_kwargs, found)
    progress("memory per worker over two epochs")
    # at the recommended worker count; if that is the single process, at the best count of
    # workers (what workers would cost, if the user runs them where CPUs are free)
    pooled = max((s for s in settings if s.workers), key=lambda s: s.rate, default=None)
    at = best if best.workers or pooled is None else pooled
    memory = _memory_run(dataset, bs, at.workers, rec_prefetch, n / (at.rate or 1.0),
                         memory_seconds, loader_kwargs)
    busy1, own1 = _busy_cpu_s(), _own_cpu_s()
    others_during = None  # CPUs other processes used while the runs went on
    if busy0 is not None and busy1 is not None:
        others_during = max(0.0, (busy1 - busy0) - (own1 - own0)) / (time.perf_counter() - wall0)

    warn = _warnings(local, settings + pre, memory, found, cpus, others_before, others_during,
                     alive, best, loader_kwargs)
    advice = _advice(dataset, per, per_many, settings, best, cpus, others_during)
    method = "thread" if threads and threads.rate >= NEAR_BEST * max(
        s.rate for s in settings + pre) else "process"
    processes = pre[0] if rec_prefetch is not None else best  # at the same prefetch
    if threads is not None:
        advice.append(f"worker threads (worker_method='thread') at num_workers={best.workers}: "
                      f"{threads.rate / processes.rate:.2f}x the processes' rate; "
                      + ("as fast with no worker processes: recommended" if method == "thread"
                         else "slower here (__getitem__ holds the GIL): keep processes"))
    rec = threads if method == "thread" else processes
    assert rec is not None
    cheaper = next((s.workers for s in settings  # against the figure the report recommends
                    if s.workers < rec.workers and s.rate >= NEAR_BEST * rec.rate), None)
    return Diagnosis(n, bs, cpus, per, p90, per_many, settings, pre, best.workers, rec_prefetch,
                     cheaper, memory, warn, advice, threads, method, dict(loader_kwargs))


def _warnings(ds: Any, settings: list[Setting], memory: dict[str, Any], found: list[str],
              cpus: int, others_before: float | None, others_during: float | None,
              alive: list[str], best: Setting, loader_kw: dict[str, Any]) -> list[str]:
    from fastload._pool import default_start_method

    out: list[str] = []
    threads = [s.threads for s in settings if s.threads is not None]
    if threads and max(threads) > 3:
        out.append(
            f"a worker runs {max(threads)} threads (fastload's own use 2 or 3): a BLAS/OpenMP "
            "pool per worker competes with the other workers. Set OMP_NUM_THREADS=1 (and "
            "OPENBLAS_NUM_THREADS, MKL_NUM_THREADS) before NumPy is imported, or cap it in "
            "worker_init (threadpoolctl)")
    method = loader_kw.get("start_method") or default_start_method()
    if alive and method == "fork":
        names = ", ".join(alive[:5]) + (f" and {len(alive) - 5} more" if len(alive) > 5 else "")
        out.append(
            f"{len(alive)} thread(s) run in this process ({names}) and workers "
            "are forked: a forked worker holds a copy of their locks in whatever state they "
            "were, and no running thread (a thread pool inherited by fork can deadlock). Create "
            "the Loader before starting threads, or use start_method='forkserver'")
    for w in memory.get("workers", []):
        g = w.get("growth")
        if g is not None and g > GROWTH_WARN_BYTES:
            sus = memory.get("suspects") or []
            cause = f" (likely {', '.join(sus)})" if sus else ""
            out.append(
                f"worker {w['worker']}'s private memory grew by {g / 2**20:,.0f} MiB over "
                f"{memory['over']}{cause}: Python objects a worker reads are copied into it. "
                "Keep large lists and dicts as NumPy arrays, fastload.SharedList/SharedDict, or "
                "pass share_dataset=True")
            break
    for msg in dict.fromkeys(found):  # in order, once each
        out.append(msg)
    try:
        from .loader import Loader

        with Loader(ds, 1, num_workers=0, **loader_kw) as ld:
            next(iter(ld))
            layout = ld.layout
        ragged = {r.path for r in getattr(layout, "ragged", ())}  # written into the slot
        objects = [p for p in getattr(layout, "object_paths", None) or () if p not in ragged]
        if objects:
            out.append(
                f"leaves kept as Python objects ({', '.join(objects[:4])}) are pickled per "
                "batch, not stacked: arrays of a fixed dtype stack without copies (declare "
                "varying shapes with ragged=)")
    except Exception as e:  # noqa: BLE001 - the runs above loaded it; this is a hint only
        out.append(f"could not read the batch layout: {type(e).__name__}: {e}")
    for when, others in (("before the runs", others_before), ("during the runs", others_during)):
        if others is not None and others > 0.25 * cpus:
            out.append(
                f"other processes kept {others:.1f} of the {cpus} CPUs busy {when}: they "
                "compete with the workers, and the figures are lower than on a quiet machine "
                "(rerun when it is quiet)")
            break
    if len(best.rates) >= 2:
        lo, hi = min(best.rates), max(best.rates)
        if hi > 1.25 * lo:
            out.append(f"the best setting's runs varied from {lo:,.0f} to {hi:,.0f} samples/s: "
                       "the machine is noisy, rerun with more --repeat")
    return out


def _advice(ds: Any, per: float, per_many: float | None, settings: list[Setting],
            best: Setting, cpus: int, others: float | None) -> list[str]:
    from fastload.arrays import ArrayDataset

    out: list[str] = []
    single = settings[0]
    if best.workers == 0:
        if per < 20e-6:
            out.append("the single process is fastest: a sample costs too little for workers "
                       "to pay off (their batches still cost the main process to receive)")
        elif others is not None and others > 0.25 * cpus:
            out.append(f"the single process is fastest here because other processes keep "
                       f"{others:.1f} of {cpus} CPUs busy: workers have no CPU to run on")
        else:
            out.append("the single process is fastest: the main process, not the dataset, is "
                       "the limit (see main CPU/sample)")
    if isinstance(ds, ArrayDataset):
        return out
    if per_many is None and per < 50e-6:
        out.append(
            f"__getitem__ takes {per * 1e6:.1f} us a sample: per-sample Python calls dominate. "
            "A __getitems__(indices) that loads a whole batch at once, or fastload.ArrayDataset "
            "for samples that are rows of arrays, removes them")
    elif per_many is not None and per_many < 0.7 * per:
        out.append(f"__getitems__ is used ({per_many * 1e6:.1f} us a sample against "
                   f"{per * 1e6:.1f} us through __getitem__)")
    if single.rate and best.workers and best.rate < 1.3 * single.rate and per >= 50e-6:
        out.append("workers barely beat one process: the consumer or the machine's CPUs are "
                   "the limit (see main CPU/sample and the CPU count)")
    return out


def _plot(d: Diagnosis, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"--plot needs matplotlib ({e}): pip install matplotlib") from e
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [s.workers for s in d.settings]
    ax.plot(xs, [s.rate for s in d.settings], "o-", label="median")
    for s in d.settings:
        ax.plot([s.workers] * len(s.rates), s.rates, ".", color="gray", alpha=0.6)
    ax.axvline(d.recommended_workers, linestyle="--", color="green", label="recommended")
    ax.set_xlabel("num_workers (0: single process)")
    ax.set_ylabel("samples/s")
    ax.set_xticks(xs)
    ax.legend()
    ax.set_title(f"fastload doctor: batch_size={d.batch_size}, {d.cpus} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ._cli import positive_float, positive_int, ragged_arg, ragged_flag, resolve

    p = argparse.ArgumentParser(
        prog="python -m fastload doctor",
        description="Measure a dataset's loading on this machine and recommend num_workers "
        "and prefetch (NOTE [doctor] in fastload/_doctor.py).")
    p.add_argument("dataset", help="module:function returning the dataset (or module:object; a "
                   "path/to/file.py:function works too); built-in: fastload:image, "
                   "fastload:tiny, fastload:compute")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--workers", type=positive_int, default=None,
                   help="try 1..N workers (default: the CPUs this process may use)")
    p.add_argument("--seconds", type=positive_float, default=2.0,
                   help="per measurement (default 2)")
    p.add_argument("--repeat", type=positive_int, default=3, help="runs per setting, interleaved")
    p.add_argument("--memory-seconds", type=positive_float, default=20.0,
                   help="bound of the two-epoch memory run (default 20)")
    p.add_argument("--start-method", default=None, choices=["fork", "spawn", "forkserver"])
    p.add_argument("--ragged", type=ragged_arg, default=None, metavar="MODE|JSON",
                   help="Loader(ragged=): pad, packed or list for every array leaf, or a JSON "
                   """object of leaf -> mode, e.g. '{"tokens": "pad"}'""")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="a chart of the runs")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    if args.dataset in _BUILTIN:
        ds = _BUILTIN[args.dataset]()
    else:
        ds = resolve(args.dataset)
    kw: dict[str, Any] = {"start_method": args.start_method} if args.start_method else {}
    if args.ragged is not None:
        kw["ragged"] = args.ragged
    try:
        d = doctor(ds, args.batch_size, args.workers, seconds=args.seconds,
                   repeat=args.repeat, memory_seconds=args.memory_seconds, quiet=args.quiet,
                   **kw)
    except (TypeError, ValueError) as e:
        print(f"doctor: {e}", file=sys.stderr)
        mismatch = getattr(e, "shape_mismatch", None)
        if mismatch is not None and "ragged" in str(e):  # its advice, in this CLI's words
            print(f"doctor: here, pass --ragged {ragged_flag(mismatch[0])} (or list, packed "
                  "for its mode)", file=sys.stderr)
        return 2
    print(d.table())
    if args.plot:
        _plot(d, args.plot)
        print(f"chart: {args.plot}")
    return 0

