"""Hosted thread workers (``worker_method="process_threads"``): the N worker threads of a pool
in one helper process, each dressed as the process a WorkerPool expects.

NOTE [hosted threads]
Thread workers (NOTE [thread workers] in _threads.py) in the loader's process contend with the
training loop for its GIL; the same threads in a process of their own do not. So a pool may
start one *host* process (the start method as for worker processes, and worker_main's hygiene:
SIGINT ignored, PDEATHSIG, the parent watchdog, ``exit_worker``) and run its workers as threads
of it, each the same loop as a thread worker (``thread_main``) on a pipe of its own: the
pool's side of the protocol (send, pump, a message per worker id) does not change.
- The parent makes each worker's pipe and hands the child end to the host over the host's
  control pipe (an ``AddWorker`` message, then the fd); the host starts a thread on it.
- The first dataset comes once with the host (inherited under fork, pickled once otherwise)
  and its threads share it; a dataset sent later reaches every worker, and the first thread to
  read it unpickles it for all (``HostDatasets``, by client id). Threads share one mapping of
  each region (NOTE [one mapping per process] in _region.py) and the process's global RNGs
  (not seeded per worker: ``sample_rng()``, as thread workers).
- A death is the whole host's: a thread whose loop raises, or whose start fails, ends the
  host (``exit_worker`` with its code), so every worker's sentinel, the host's, fires together
  and ``WorkerPool.check`` restarts them all: the first restart starts a new host, the others
  attach their thread to it. A thread that ends with 0 was stopped (close()): the host exits 0
  when all have. ``terminate``/``kill`` of any worker act on the host.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

from ._procs import exit_worker, start_process

__all__ = ["Host", "HostedWorker", "HostDatasets", "host_main"]

#: After its control pipe closes (the pool closed or died), how long the host lets its threads
#: finish before it exits anyway (the pool's close() gives it _JOIN_TIMEOUT_S, then SIGTERM).
_DRAIN_S = 2.0


@dataclass(frozen=True)
class AddWorker:
    """Host control message: start worker ``worker_id``'s thread on the pipe whose fd follows
    (SCM_RIGHTS)."""

    worker_id: int


class Host:
    """The parent's handle on one host process: the process, its control pipe, and the
    workers attached to it (``HostedWorker`` stand-ins: the last to close it closes it)."""

    def __init__(self, ctx: Any, args: tuple[Any, ...]) -> None:
        self.ctx = ctx
        # args as worker_main's, the worker id replaced by "host": the process is named
        # fastload-worker-host (what refuse_unguarded_main recognises as a worker of ours)
        self.process, self.control = start_process(ctx, host_main, ("host", *args[1:]))
        self.users = 0
        self.pid: int = self.process.pid
        self._code: int | None = None  # once the process handle is closed

    @property
    def exitcode(self) -> int | None:
        if self.process is None:
            return self._code
        return self.process.exitcode  # type: ignore[no-any-return]

    @classmethod
    def thread_of(cls, host: Host | None, ctx: Any,
                  args: tuple[Any, ...]) -> tuple[Host, tuple[HostedWorker, Connection]]:
        """Worker ``args[0]`` (worker_main's arguments) as a thread of ``host``, or of a new
        host if there is none or it died: the host, the worker and the pool's end of its
        pipe."""
        if host is None or host.exitcode is not None:
            host = cls(ctx, args)
        return host, host.add(args[0])

    def add(self, worker_id: int) -> tuple[HostedWorker, Connection]:
        """Start worker ``worker_id`` as a thread of this host; its stand-in and the pool's end
        of its pipe. OSError if the host is gone (check() then restarts it)."""
        parent_conn, child_conn = self.ctx.Pipe(duplex=True)
        try:
            self.control.send(AddWorker(worker_id))
            send_handle(self.control, child_conn.fileno(), self.pid)
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()  # the host has its own copy
        self.users += 1
        return HostedWorker(self, worker_id), parent_conn

    def release(self) -> None:
        """One worker let go of the host; the last one closes the control pipe (the host then
        exits once its threads have) and, once it has exited, the process handle."""
        self.users -= 1
        if self.users > 0:
            return
        self.control.close()
        code = self.process.exitcode if self.process is not None else self._code
        if code is not None and self.process is not None:
            self._code = code
            self.process.close()
            self.process = None


def hosted_reason(num_workers: int, method: str, why: str) -> str:
    """stats()["start_method_reason"] of a pool of hosted threads."""
    return (f"worker_method='process_threads': {num_workers} worker threads in one helper "
            f"process started with {method} ({why})")


class HostedWorker:
    """The parts of ``multiprocessing.Process`` a WorkerPool uses, for a thread of a host
    process (NOTE [hosted threads]): ``pid`` and ``sentinel`` are the host's, and so are
    ``exitcode``, ``join``, ``terminate`` and ``kill``."""

    def __init__(self, host: Host, worker_id: int) -> None:
        self.host = host
        self.pid = host.pid
        self.sentinel = host.process.sentinel
        self.name = f"fastload-worker-{worker_id} (in host process {host.pid})"
        self._closed = False

    @property
    def exitcode(self) -> int | None:
        return self.host.exitcode

    def is_alive(self) -> bool:
        return self.host.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        if self.host.process is not None:
            self.host.process.join(timeout)

    def terminate(self) -> None:
        if self.host.exitcode is None:
            self.host.process.terminate()

    def kill(self) -> None:
        if self.host.exitcode is None:
            self.host.process.kill()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.host.release()


class HostDatasets:
    """The datasets of a host's threads by client id (NOTE [hosted threads]): unpickled once,
    by the first thread that receives one, and dropped when the last detaches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, list[Any]] = {}  # cid -> [dataset, threads holding it]

    def get(self, cid: int, load: Any) -> Any:
        """The dataset of ``cid``, ``load()`` the first time (raises what ``load`` raises)."""
        with self._lock:
            held = self._held.get(cid)
            if held is None:
                held = self._held[cid] = [load(), 0]
            held[1] += 1
            return held[0]

    def release(self, cid: int) -> None:
        with self._lock:
            held = self._held.get(cid)
            if held is not None:
                held[1] -= 1
                if held[1] <= 0:
                    del self._held[cid]


def host_main(
    name: str,
    num_workers: int,
    control: Connection,
    first_cid: int,
    first_payload: Any,
    pickled: bool,
    worker_init: Any,
    seed: int,
    parent_pid: int,
    pdeathsig: bool,
) -> None:
    """Entry point of a host process (module-level: works with spawn and forkserver): the
    process hygiene of a worker process, the first dataset once, then a thread per AddWorker
    received on ``control`` until the pool closes (NOTE [hosted threads])."""
    import pickle

    from . import _messages as m
    from ._remote import pack_exception
    from ._worker import drain_and_close, process_hygiene, thread_main

    process_hygiene(first_cid, pickled, parent_pid, pdeathsig)
    failed: BaseException | None = None
    try:
        dataset = pickle.loads(first_payload) if pickled and first_cid >= 0 else first_payload
    except BaseException as e:  # the first thread says so, as a worker process would
        dataset, failed = None, e
    datasets = HostDatasets()
    lock = threading.Lock()
    running: list[threading.Thread] = []

    def run(worker_id: int, conn: Connection) -> None:
        if failed is not None:
            conn.send(m.InitFailed(pack_exception(failed, None, worker_id)))
            drain_and_close(conn)
            exit_worker(1)
        code = 1
        try:
            thread_main(worker_id, num_workers, conn, first_cid, dataset, False, worker_init,
                        seed, parent_pid, False, datasets)
            code = 0
        except SystemExit as e:  # a failed start: InitFailed was sent
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # a bug of the loop: say where, then end the host
            print(f"fastload: worker thread {worker_id} failed:", file=sys.stderr)
            traceback.print_exc()
        if code != 0:
            exit_worker(code)  # NOTE [hosted threads]: a death is the whole host's
        with lock:
            running.remove(threading.current_thread())
            if not running:  # the pool stopped every thread (close()): so ends the host
                exit_worker(0)

    while True:
        try:
            msg = control.recv()
            fd = recv_handle(control)
        except (EOFError, OSError):  # the pool let go of us: let the threads finish, then exit
            deadline = time.monotonic() + _DRAIN_S
            for t in list(running):
                t.join(max(0.0, deadline - time.monotonic()))
            exit_worker(0)
        if not isinstance(msg, AddWorker):
            os.close(fd)
            continue
        t = threading.Thread(target=run, args=(msg.worker_id, Connection(fd)),
                             name=f"fastload-worker-{msg.worker_id}", daemon=True)
        with lock:
            running.append(t)
        t.start()
