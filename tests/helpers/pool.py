"""Module-level datasets for tests/test_pool.py (picklable for every start method)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

#: How many times a CountsPickles dataset was pickled in this process.
PICKLED = [0]


class CountsPickles:
    """Sample i: (i, tag); counts its own pickling in the process that pickles it."""

    def __init__(self, n: int, tag: int = 0) -> None:
        self.n, self.tag = n, tag

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return (np.full((3,), i, np.int64), self.tag)

    def __getstate__(self) -> dict[str, Any]:
        PICKLED[0] += 1
        return dict(self.__dict__)


class Tagged:
    """Sample i: i * 1000 + tag (tells the loaders of a pool apart)."""

    def __init__(self, n: int, tag: int) -> None:
        self.n, self.tag = n, tag

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return np.int64(i * 1000 + self.tag)


class Unpicklable:
    def __init__(self, n: int) -> None:
        self.n = n
        self.fn = lambda: None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def worker_memfds(pid: int) -> int:
    """How many fastload memfd mappings process ``pid`` has (the bell plus one per loader)."""
    regions = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "memfd:fastload" in line:
                regions.add(line.split()[4])  # inode
    return len(regions)


def pid_of_worker(_: int) -> int:
    return os.getpid()


def failing_init(worker_id: int) -> None:
    raise OSError(f"worker {worker_id}: no accelerator here")


class SlowSamples:
    """Every sample takes `delay` seconds (a batch is still loading when the pool closes)."""

    def __init__(self, n: int = 100, delay: float = 0.3) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.delay)
        return np.zeros(1000)


def close_pool_under_a_waiting_thread(rounds: int = 4) -> None:
    """Run in a fresh interpreter by tests/test_pool.py: a thread waits inside the ring for a
    batch while the main thread closes the pool; the thread must get LoaderClosedError."""
    import threading

    import fastload

    for k in range(rounds):
        pool = fastload.Pool(2)
        loader = fastload.Loader(SlowSamples(), 4, pool=pool)
        out: list[Any] = []

        def run(loader: Any = loader, out: list[Any] = out) -> None:
            try:
                out.append([b.shape for b in loader])
            except BaseException as e:
                out.append(e)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.45 + 0.1 * k)  # the thread is inside ring.wait (GIL released) by now
        pool.close()
        t.join(10)
        assert not t.is_alive(), "the waiting thread hangs"
        assert isinstance(out[0], fastload.LoaderClosedError), out
    print("ok")


class Heavy:
    """A dataset that pickles to `mib` MiB (its table travels to each worker of a Pool)."""

    def __init__(self, mib: int = 16) -> None:
        self.table = np.arange((mib << 20) // 8, dtype=np.int64)

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> Any:
        return self.table[i * 1000: i * 1000 + 4].copy()
