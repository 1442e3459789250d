"""Several reads in flight per worker: ``Loader(io_concurrency=k)``.

NOTE [reads in flight]
A sample on an object store or a network file system waits 10-100 ms for its bytes. torch's
DataLoader needs one process per outstanding read; here each fill path (a worker's, or the main
process's with num_workers=0) may keep up to k samples of its batch loading at once, on k daemon
threads of its own (a ``ReadPool``). The fill loop itself does not change: it asks for the
batch's samples one row after the other as before, through ``Prefetched``, which submitted every
index of the batch (or of its piece) up front and hands back each sample (or raises its
exception) when its row's turn comes. So rows stay in order, the row recorded in the slot is the
one being waited for (stall and death reports name it), the error of a batch is its lowest
failing row's, on_error="skip" replaces samples exactly as it does one at a time, and what is
still queued when a row raises is cancelled. The sample context (``sample_rng()``,
``get_worker_info()``) is set in the reading thread for the sample it loads; the global RNGs are
not seeded per sample (threads would draw between another's seeding and its draw: NOTE [global
RNGs] in _rngs.py), so ``sample_rng()`` is the way to reproducible augmentation here.

The threads are daemons, so a read stuck in user code never holds up a worker's exit or the
interpreter's (a worker process leaves with os._exit; the main process does not join them), and
``close()`` stops them after their current sample. A dataset whose ``__getitem__`` is
``async def`` is awaited on one event loop per reading thread.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from concurrent.futures import Future
from typing import Any

__all__ = ["ReadPool", "Prefetched"]

_STOP = object()


class ReadPool:
    """``k`` daemon threads that run ``load(index)`` calls of one fill path, oldest first;
    ``local``: the fill path's thread-local sample context (``_fill._local``), set in each
    thread for the sample it loads."""

    def __init__(self, k: int, local: Any, name: str = "fastload-read") -> None:
        self.k = k
        self.local = local
        self.tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                        for i in range(k)]
        for t in self.threads:
            t.start()

    def submit(self, call: Any, ctx: tuple[Any, int, int, int], index: int) -> Future[Any]:
        fut: Future[Any] = Future()
        self.tasks.put((fut, call, ctx, index))
        return fut

    def _run(self) -> None:
        loop: asyncio.AbstractEventLoop | None = None
        local = self.local
        while True:
            task = self.tasks.get()
            if task is _STOP:
                if loop is not None:
                    loop.close()
                return
            fut, call, (info, seed, epoch, _), index = task
            if not fut.set_running_or_notify_cancel():
                continue
            local.info = info
            ctx = local.ctx
            ctx[0], ctx[1], ctx[2] = seed, epoch, index
            value: Any = None
            try:
                value = call(index)
                if inspect.isawaitable(value):  # an async def __getitem__
                    if loop is None:
                        loop = asyncio.new_event_loop()
                    value = loop.run_until_complete(value)
            except BaseException as e:  # the sample's: its row raises it (the thread goes on)
                fut.set_exception(e)
            else:
                fut.set_result(value)
            finally:
                ctx[2] = -1
            task = fut = value = None  # nothing of a batch kept alive by an idle thread

    def close(self) -> None:
        """Stop the threads once they finish what they are loading (not waited for)."""
        for _ in self.threads:
            self.tasks.put(_STOP)


def _awaited(value: Any) -> Any:
    """``value``, awaited in a loop of its own if it is awaitable."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    return asyncio.run(wait())


class Prefetched:
    """The dataset as a batch's fill loop sees it: every index of ``indices`` submitted to the
    pool at once; ``[index]`` is that sample (its first request), or raises what loading it
    raised. Other requests (a replacement asked twice by on_error="skip") load in this thread."""

    __slots__ = ("ds", "pending")

    def __init__(self, pool: ReadPool, ds: Any, indices: list[int], seed: int,
                 epoch: int) -> None:
        self.ds = ds
        ctx = (pool.local.info, seed, epoch, 0)
        call = ds.__getitem__
        self.pending: dict[int, Future[Any]] = {}
        for i in indices:
            if i not in self.pending:
                self.pending[i] = pool.submit(call, ctx, i)

    def __getitem__(self, index: int) -> Any:
        fut = self.pending.pop(index, None)
        if fut is None:
            value = self.ds[index]
            return _awaited(value)
        return fut.result()

    def cancel(self) -> None:
        """What was not started is not loaded (the batch ended: it raised, or was given up)."""
        for fut in self.pending.values():
            fut.cancel()
        self.pending.clear()
