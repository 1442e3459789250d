"""Datasets for tests/test_doctor.py (importable by name: the CLI loads them as module:attr)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


class Rows:
    """float32 (8,) rows and an int64 label."""

    def __init__(self, n: int = 512) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        return np.full(8, i, np.float32), np.int64(i)


def make_rows() -> Rows:
    return Rows()


class Threads(Rows):
    """Starts 6 idle threads in a worker that loads its first sample (as a BLAS or OpenMP pool
    of its own per worker would)."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        import fastload

        if fastload.get_worker_info() is not None and not getattr(self, "_started", False):
            self._started = True
            self._stop = threading.Event()
            for _ in range(6):
                threading.Thread(target=self._stop.wait, daemon=True).start()
        return super().__getitem__(i)


class Strings(Rows):
    """A str leaf: kept as a Python object."""

    def __getitem__(self, i: int) -> Any:
        return np.full(8, i, np.float32), f"name{i}"


class PythonFloats:
    """A list of 2M Python floats (~64 MiB of objects); each sample reads a share of it, so a
    forked worker's copy-on-read of the list grows its private memory over an epoch."""

    def __init__(self, n: int = 64, size: int = 2_000_000) -> None:
        self.n = n
        self.values = [float(k) for k in range(size)]
        self.step = size // n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        part = self.values[i * self.step : (i + 1) * self.step]
        return np.array([sum(part)], np.float64)


class NotMapStyle:
    def __iter__(self) -> Any:
        return iter(range(3))


class Sleepy(Rows):
    """Rows that take 2 ms each, waiting (the GIL released, as a file read): workers win,
    threads as well as processes."""

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        import time

        time.sleep(0.002)
        return super().__getitem__(i)


class Tokens:
    """A dict sample whose "tokens" leaf varies in length: needs ragged= to batch."""

    def __init__(self, n: int = 256) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"tokens": np.arange(1 + i % 7, dtype=np.int64), "label": np.int64(i)}
