"""WorkerPool: persistent worker processes, their pipes, liveness and shutdown.

NOTE [shutdown] (docs/design.md has the whole protocol)
1. set the stop flag in the region header (workers in the fill loop see it within
   ``_worker._CLAIM_TIMEOUT_S``) and send ``("stop",)`` on every pipe (workers not yet attached);
2. workers exit 0;
3. ``join(_JOIN_TIMEOUT_S)``, then ``terminate()``, then ``kill()``;
4. slots of dead workers need no reclaim at shutdown (the region goes away);
5. the region is closed (memfd: nothing to unlink).
Every step is idempotent and safe after a partial failure.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import send_handle
from typing import Any

from ._worker import worker_main

__all__ = ["WorkerPool", "exit_code_name", "default_start_method"]

#: The parent's longest uninterrupted wait: between two waits it checks worker sentinels,
#: the user's timeout and pending signals (Ctrl+C is handled within this bound).
_POLL_INTERVAL_S = 0.1
#: How long close() lets workers exit on their own before terminate() (they poll every 0.1 s).
_JOIN_TIMEOUT_S = 2.0
#: How long to wait for the exit code of a worker whose sentinel says it is exiting.
_REAP_TIMEOUT_S = 1.0
#: After terminate() (SIGTERM), how long before kill() (SIGKILL).
_TERM_TIMEOUT_S = 1.0

_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def exit_code_name(code: int | None) -> str:
    """``-11`` -> ``SIGSEGV(-11)``, ``3`` -> ``EXIT(3)`` (loky's _get_exitcode_name)."""
    if code is None:
        return "RUNNING"
    if code < 0:
        try:
            return f"{signal.Signals(-code).name}({code})"
        except ValueError:
            return f"SIGNAL({code})"
    return f"EXIT({code})"


def default_start_method() -> str:
    """``$FASTLOAD_START_METHOD`` if set; else fork when it is safe and available (fastest
    start: no re-import, no pickling of the dataset), else forkserver (POSIX), else spawn.

    fork is unsafe once the parent runs other threads (a lock held by another thread is
    copied locked into the child), so a multi-threaded parent gets forkserver.
    """
    methods = mp.get_all_start_methods()
    forced = os.environ.get("FASTLOAD_START_METHOD")
    if forced:
        if forced not in methods:
            raise ValueError(
                f"FASTLOAD_START_METHOD={forced!r} is not available here; choose one of {methods}"
            )
        return forced
    if "fork" in methods and sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    if "forkserver" in methods:
        return "forkserver"
    return "spawn"


class WorkerPool:
    """``num_workers`` persistent processes serving one dataset."""

    def __init__(
        self,
        dataset: Any,
        num_workers: int,
        start_method: str | None,
        worker_init: Any,
        seed: int,
    ) -> None:
        method = start_method or default_start_method()
        if method not in mp.get_all_start_methods():
            raise ValueError(
                f"start_method={method!r} is not available here; choose one of "
                f"{mp.get_all_start_methods()}"
            )
        self.start_method = method
        self.ctx: Any = mp.get_context(method)  # typeshed: BaseContext lacks .Process
        self.num_workers = num_workers
        self.seed = seed
        self.worker_init = worker_init
        if method == "fork":
            self._payload, self._pickled = dataset, False
        else:
            self._payload, self._pickled = _pickle_for_workers(dataset, worker_init, method), True
        # PDEATHSIG fires when the *thread* that forked exits: only arm it from the main thread.
        self._pdeathsig = threading.current_thread() is threading.main_thread()
        self.procs: list[Any] = [None] * num_workers
        self.conns: list[Connection | None] = [None] * num_workers
        self.restarts = 0
        self.closed = False
        for i in range(num_workers):
            self.start_worker(i)

    def start_worker(self, i: int) -> None:
        parent_conn, child_conn = self.ctx.Pipe(duplex=True)
        p = self.ctx.Process(
            target=worker_main,
            args=(
                i,
                self.num_workers,
                child_conn,
                self._payload,
                self._pickled,
                self.worker_init,
                self.seed,
                0 if self.start_method == "forkserver" else os.getpid(),
                self._pdeathsig,
            ),
            name=f"fastload-worker-{i}",
            daemon=True,
        )
        saved = {k: os.environ.get(k) for k in _THREAD_ENV}
        # Block SIGINT while starting: the child inherits the mask (fork and exec alike), so a
        # Ctrl+C that reaches it before worker_main ignores SIGINT stays pending and is then
        # discarded, instead of printing a KeyboardInterrupt traceback from a half-started
        # worker. The parent gets its own pending SIGINT as soon as the mask is restored.
        mask = _block_sigint()
        try:
            for k in _THREAD_ENV:  # before the child imports NumPy (spawn/forkserver)
                os.environ.setdefault(k, "1")
            p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
            _restore_sigmask(mask)
        child_conn.close()
        self.procs[i] = p
        self.conns[i] = parent_conn

    def send(self, i: int, msg: tuple[Any, ...]) -> None:
        conn = self.conns[i]
        assert conn is not None
        conn.send(msg)

    def send_fd(self, i: int, fd: int) -> None:
        conn, p = self.conns[i], self.procs[i]
        assert conn is not None and p is not None
        send_handle(conn, fd, p.pid)

    def sentinels(self) -> dict[int, int]:
        return {p.sentinel: i for i, p in enumerate(self.procs) if p is not None}

    def dead_workers(self, timeout: float = 0.0) -> list[int]:
        """Indices of workers whose process has exited (checked via their sentinels)."""
        s = self.sentinels()
        if not s:
            return []
        ready = wait(list(s), timeout=timeout)
        dead = []
        for r in ready:
            i = s[r]  # type: ignore[index]
            p = self.procs[i]
            # The sentinel closes while the process exits, a moment before it can be reaped:
            # wait (boundedly) for the exit code instead of reporting a running process.
            p.join(_REAP_TIMEOUT_S)
            dead.append(i)
        return dead

    def pid(self, i: int) -> int | None:
        p = self.procs[i]
        return None if p is None else p.pid

    def exitcode(self, i: int) -> int | None:
        p = self.procs[i]
        return None if p is None else p.exitcode

    def discard(self, i: int) -> None:
        """Forget a dead worker (close its pipe and process handle)."""
        p, conn = self.procs[i], self.conns[i]
        self.procs[i] = None
        self.conns[i] = None
        if conn is not None:
            conn.close()
        if p is not None:
            p.join(0)
            try:
                p.close()
            except ValueError:
                pass

    def restart(self, i: int) -> None:
        self.discard(i)
        self.restarts += 1
        self.start_worker(i)

    def close(self) -> None:
        """Steps 1-3 of NOTE [shutdown] (the caller sets the stop flag first). Idempotent."""
        if self.closed:
            return
        self.closed = True
        for conn in self.conns:
            if conn is not None:
                try:
                    conn.send(("stop",))
                except (OSError, ValueError):
                    pass
        procs = [p for p in self.procs if p is not None]
        # Read (and drop) what workers are still sending: a worker blocked writing a large
        # message to a full pipe would otherwise never see the stop flag.
        conns = [c for c in self.conns if c is not None]
        _join_all(procs, _JOIN_TIMEOUT_S, conns)
        for p in procs:
            if p.exitcode is None:
                p.terminate()
        _join_all(procs, _TERM_TIMEOUT_S)
        for p in procs:
            if p.exitcode is None:
                p.kill()
        _join_all(procs, None)
        for i in range(self.num_workers):
            self.discard(i)


def _block_sigint() -> Any:
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _restore_sigmask(mask: Any) -> None:
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _join_all(procs: list[Any], timeout: float | None, conns: list[Connection] = ()) -> None:  # type: ignore[assignment]
    alive = [p for p in procs if p.exitcode is None]
    if not alive:
        return
    if timeout is None:
        for p in alive:
            p.join()
        return
    import time

    deadline = time.monotonic() + timeout
    conns = list(conns)
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        ready = wait([p.sentinel for p in alive] + conns, timeout=left)
        for c in conns[:]:
            if c in ready:
                try:
                    c.recv_bytes()
                except (EOFError, OSError):
                    conns.remove(c)
        alive = [p for p in alive if p.exitcode is None]


def _pickle_for_workers(dataset: Any, worker_init: Any, method: str) -> bytes:
    """Pickle the dataset once for every worker; name the object that failed."""
    for what, obj in (("worker_init", worker_init),):
        if obj is not None:
            try:
                pickle.dumps(obj)
            except Exception as e:
                raise TypeError(
                    f"fastload: {what}={obj!r} cannot be pickled for start_method={method!r} "
                    f"({type(e).__name__}: {e}); define it at module level, or use "
                    "start_method='fork'"
                ) from e
    try:
        return pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(
            f"fastload: the dataset {type(dataset).__qualname__} cannot be pickled for "
            f"start_method={method!r} ({type(e).__name__}: {e}). Workers started with "
            f"{method!r} receive a pickled copy: keep unpicklable members (open files, locks, "
            "lambdas) out of the dataset or create them lazily in __getitem__/worker_init, or use "
            "start_method='fork'"
        ) from e
