"""``loader.memory()``: what each process of a loader costs, and a warning when workers grow.

USS (private memory: pages only this process maps) and PSS (each page divided by the processes
sharing it) come from ``/proc/<pid>/smaps_rollup`` (Linux >= 4.14). A worker whose private dirty
memory grows from one epoch to the next is copying something (clean private pages are file
pages, e.g. of a memory-mapped dataset only this worker read: not copies, never warned about):
under fork, usually the dataset's Python lists and dicts, page by page as it reads them (NOTE
[shared datasets] in _share.py). The baseline of each worker is taken once the loader's first
batch is out (the worker has imported what it needs and loaded samples; taken at the next
``next()``, so the first batch waits for nothing), and when a
later epoch starts, a worker grown by more than ``WARN_GROWTH_BYTES`` since then is warned about
once per loader, naming the dataset's large containers that are not shared. Copy-on-write of a
forked dataset happens over the first epoch, as items are first read: that is the growth seen
when the second epoch starts.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["WARN_GROWTH_BYTES", "MemoryWatch", "process_memory"]

#: Growth of a worker's private memory across epochs that is warned about (MiB from
#: $FASTLOAD_MEMORY_WARN_MIB).
WARN_GROWTH_BYTES = int(float(os.environ.get("FASTLOAD_MEMORY_WARN_MIB", "256")) * 2**20)


def process_memory(pid: int) -> dict[str, int] | None:
    """{"uss", "pss", "rss"} in bytes, or None if the process is gone or /proc cannot say."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return None
    kb: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            kb[parts[0].rstrip(":")] = int(parts[1])
    if "Pss" not in kb:
        return None
    return {"uss": (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) * 1024,
            "pss": kb["Pss"] * 1024, "rss": kb.get("Rss", 0) * 1024,
            "private_dirty": kb.get("Private_Dirty", 0) * 1024}


class MemoryWatch:
    """Baselines per worker pid, and the one warning."""

    def __init__(self) -> None:
        # pid -> (USS, private dirty bytes) after the first batch
        self.baseline: dict[int, tuple[int, int]] = {}
        self.warned = False
        self.epochs = 0  # started by this loader

    def first_batch_out(self, pids: list[int | None]) -> None:
        if self.epochs == 1 and not self.baseline:
            for pid in pids:
                mem = process_memory(pid) if pid is not None else None
                if mem is not None:
                    self.baseline[pid] = (mem["uss"], mem["private_dirty"])  # type: ignore

    def epoch_started(self, pids: list[int | None], suspects: Any) -> None:
        """``suspects()``: the dataset's large containers left as Python objects."""
        self.epochs += 1
        if self.epochs < 2 or not pids:
            return
        for i, pid in enumerate(pids):
            if pid is None:
                continue
            mem = process_memory(pid)
            if mem is None:
                continue
            if pid not in self.baseline:  # a restarted worker: from its first epoch on
                self.baseline[pid] = (mem["uss"], mem["private_dirty"])
                continue
            # Dirty pages only: clean private pages are file pages (a memory-mapped dataset
            # read by this worker alone) that the kernel drops under pressure, not copies.
            grew = mem["private_dirty"] - self.baseline[pid][1]
            if grew > WARN_GROWTH_BYTES and not self.warned:
                self.warned = True
                found = suspects()
                cause = ("; likely: " + ", ".join(found)) if found else ""
                warnings.warn(
                    f"fastload: worker {i} (pid {pid}) private (dirty) memory grew by "
                    f"{grew / 2**20:,.0f} MiB since the loader's first batch{cause}. Python "
                    "objects a worker reads are copied into it (their reference counts are "
                    "written): keep "
                    "large lists and dicts in fastload.SharedList / SharedDict, NumPy arrays "
                    "or files (share_dataset=True does it for the dataset's attributes); "
                    "loader.memory() shows each process",
                    RuntimeWarning, stacklevel=5,
                )

    def report(self, pids: list[int | None], shared_bytes: int) -> dict[str, Any]:
        workers = []
        for i, pid in enumerate(pids):
            mem = process_memory(pid) if pid is not None else None
            row: dict[str, Any] = {"worker": i, "pid": pid}
            if mem is not None:
                row.update(mem)
                base = self.baseline.get(pid)  # type: ignore[arg-type]
                row["uss_growth"] = None if base is None else mem["uss"] - base[0]
            workers.append(row)
        main = process_memory(os.getpid())
        return {"main": {"pid": os.getpid(), **(main or {})}, "workers": workers,
                "shared_dataset_bytes": shared_bytes,
                "total_pss": sum(r.get("pss", 0) for r in workers) + (main or {}).get("pss", 0)}
