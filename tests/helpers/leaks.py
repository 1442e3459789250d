"""Module-level datasets for tests/test_leaks.py."""

from __future__ import annotations

import os

import numpy as np


class Small:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((8,), i, np.float32), i


class Big:
    """Samples of 1 MiB: with batch 25 and 7 slots the region is about 175 MiB."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(2**18, i, np.float32)


def leak_a_semaphore(conn) -> None:  # type: ignore[no-untyped-def]
    """A spawn child that makes a multiprocessing Lock (a named semaphore: the start method is
    spawn here), sends its name and leaves without multiprocessing's finalizers, as fastload's
    workers did before NOTE [worker exit]: the semaphore stays in /dev/shm."""
    import multiprocessing as mp

    lock = mp.Lock()
    conn.send(lock._semlock.name)
    conn.close()
    os._exit(0)


class LockPerWorker:
    """Each worker keeps a multiprocessing Lock made at its first sample until it exits: of
    multiprocessing's default context (named under spawn and forkserver, not under fork), or
    of ``method``'s (a library that asks for spawn: named in every worker)."""

    held: list = []

    def __init__(self, method: str | None = None) -> None:
        self.method = method

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> np.ndarray:
        if not LockPerWorker.held:
            import multiprocessing as mp

            ctx = mp.get_context(self.method) if self.method else mp
            LockPerWorker.held.append(ctx.Lock())
        return np.full(2, i)
