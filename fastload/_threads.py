"""Thread workers (``worker_method="thread"``): a worker thread dressed as the process a
WorkerPool expects, and the datasets they get by reference.

NOTE [thread workers]
A thread worker runs the same loop as a worker process (fastload/_worker.py: the ring, the
fill, the messages over a pipe of its own, the bell), so claiming, packing, errors, skips and
shared batches have one implementation. What differs is only what a process gives for free:
- the dataset is the user's object, handed over by reference (``put``), never pickled;
- no signal set-up, no parent watchdog, no global RNG seeding (``random`` and ``np.random`` are
  the process's: use ``fastload.sample_rng()``), and ``get_worker_info()`` is per thread;
- a thread cannot be killed: a sample stuck in user code keeps its thread. ``close()`` waits
  for it a bounded time (2 s, then gives up on it: it is a daemon thread and never blocks
  interpreter exit), and a timeout names the thread and the sample, as for a process. A thread
  "dies" only if the loop itself raises (a bug): the pool sees it by its sentinel, as a process's.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["ThreadWorker", "start_thread", "put", "get", "drop"]

_objects: dict[int, Any] = {}
_keys = itertools.count(1)
_lock = threading.Lock()


def put(obj: Any) -> int:
    """Keep ``obj`` for thread workers; the key they look it up by."""
    with _lock:
        key = next(_keys)
        _objects[key] = obj
        return key


def get(key: int) -> Any:
    with _lock:
        return _objects[key]


def drop(key: int) -> None:
    with _lock:
        _objects.pop(key, None)


class ThreadWorker:
    """The parts of ``multiprocessing.Process`` a WorkerPool uses, for a thread: ``pid`` (this
    process's), ``sentinel`` (the read end of a pipe whose write end closes when the thread
    ends: ``multiprocessing.connection.wait`` watches it as a process's), ``exitcode`` (None
    while it runs), ``join``; ``terminate``/``kill`` can do nothing to a thread."""

    def __init__(self, target: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self._read, self._write = os.pipe()
        self.sentinel = self._read
        self.pid = os.getpid()
        self.name = name
        self.exitcode: int | None = None
        self._thread = threading.Thread(target=self._run, args=(target, args), name=name,
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
        code = 1
        try:
            target(*args)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # a bug of the loop: say where, then die as a process would
            print(f"fastload: worker thread {self.name} failed:", file=sys.stderr)
            traceback.print_exc()
        finally:
            self.exitcode = code
            os.close(self._write)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def terminate(self) -> None:
        """A thread cannot be stopped from outside (NOTE [thread workers])."""

    kill = terminate

    def close(self) -> None:
        """Let go of the sentinel (a thread still stuck in user code ends on its own)."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1


def start_thread(target: Callable[..., Any],
                 args: tuple[Any, ...]) -> tuple[ThreadWorker, Connection]:
    """Start worker ``args[0]`` as a thread running ``target`` (thread_main) with its end of a
    pipe (a socket pair: fds pass over it as between processes) inserted as its third
    argument; the worker and the pool's end. The thread owns its end and closes it."""
    parent_conn, child_conn = mp.Pipe(duplex=True)
    t = ThreadWorker(target, (*args[:2], child_conn, *args[2:]), f"fastload-worker-{args[0]}")
    try:
        t.start()
    except BaseException:
        parent_conn.close()
        child_conn.close()
        t.close()
        raise
    return t, parent_conn
