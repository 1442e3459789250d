"""WorkerPool: persistent worker processes, their pipes, liveness and shutdown.

NOTE [shutdown] (docs/design.md has the whole protocol)
1. set the stop flag in the region header (workers in the fill loop see it within
   ``_worker._CLAIM_TIMEOUT_S``) and send ``Stop`` on every pipe (workers not yet attached);
2. workers exit 0;
3. ``join(_JOIN_TIMEOUT_S)``, then ``terminate()``, then ``kill()``;
4. slots of dead workers need no reclaim at shutdown (the region goes away);
5. the region is closed (memfd: nothing to unlink).
Every step is idempotent and safe after a partial failure.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import threading
import weakref
from collections import deque
from collections.abc import Iterable
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import send_handle
from typing import Any, Protocol

from . import _messages as m
from . import _threads
from ._frames import FrameReader
from ._host import Host, hosted_reason
from ._procs import (
    NotPicklable,
    _check_picklable_init,
    _pickle_for_workers,
    choose_start_method,
    default_start_method,
    exit_code_name,
    preload_in_fork_server,
    refuse_unguarded_main,
    refuse_unimportable_main,
    start_process,
)
from ._settings import PoolConfig
from ._worker import thread_main, worker_main
from .errors import WorkerDied

log = logging.getLogger("fastload")

__all__ = ["Pool", "PoolClient", "WorkerPool", "exit_code_name", "default_start_method"]

#: How long close() lets workers exit on their own before terminate() (they poll every 0.1 s).
_JOIN_TIMEOUT_S = 2.0
#: How long to wait for the exit code of a worker whose sentinel says it is exiting.
_REAP_TIMEOUT_S = 1.0
#: After terminate() (SIGTERM), how long before kill() (SIGKILL).
_TERM_TIMEOUT_S = 1.0

_PAGE = 4096

class PoolClient(Protocol):
    """What a pool needs of a loader registered with it (NOTE [pool callbacks] in _faults.py:
    the callbacks run in whichever thread checks the pool)."""

    def workers_died(self, deaths: list[m.Death]) -> None:
        """Called before the dead workers are restarted: reclaim their slots, judge the loss."""

    def workers_restarted(self, restarted: list[int]) -> None:
        """Called after: the fresh workers have the client's dataset; send them its region."""

    def close(self, reason: str = ...) -> None:
        """The pool is closing."""


class WorkerPool:
    """``num_workers`` persistent processes serving the datasets of one or more loaders.

    NOTE [one pool, many loaders]
    Each loader registered here is a *client* with an id (cid). Its dataset reaches every worker
    once (a ``("dataset", cid, ...)`` message; a private pool started with fork hands its first
    client's dataset over by inheritance instead, unpickled), then its shared region
    (``("attach", cid, ...)`` + the fd). A worker claims tasks from every ring it is attached to,
    and when all are empty it sleeps on the pool's bell (csrc/fl_bell.h), which every client
    rings after queueing. Every message a worker sends names its client; the pool routes it to
    that client's inbox, so two loaders can read one worker's pipe in any order. A dead worker
    is seen by whichever client checks first: every client is told (``workers_died``) before
    the restart, so it reclaims its slots while no other process has that worker id, and again
    after (``workers_restarted``), so it re-attaches.
    """

    def __init__(self, config: PoolConfig, first: tuple[int, Any] | None = None) -> None:
        num_workers, worker_init, seed = config.num_workers, config.worker_init, config.seed
        #: NOTE [thread workers] (_threads.py): threads of this process, not processes
        self.threads = config.start_method == "thread"
        method, why = ("thread", "worker_method='thread'") if self.threads else \
            choose_start_method(config.start_method)
        if not self.threads:
            refuse_unguarded_main()
            refuse_unimportable_main(None, method)
            if method not in mp.get_all_start_methods():
                raise ValueError(
                    f"start_method={method!r} is not available here; choose one of "
                    f"{mp.get_all_start_methods()}"
                )
        self.hosted = config.worker_method == "process_threads"  # NOTE [hosted threads]
        self.worker_method = "thread" if self.threads else config.worker_method
        self.start_method = method
        #: why this method (NOTE [start method] in _procs.py): stats()["start_method_reason"]
        self.start_method_reason = hosted_reason(num_workers, method, why) if self.hosted else why
        if not self.threads:
            log.info("fastload: %d worker %s start with %s (%s)", num_workers,
                     "threads in one process" if self.hosted else "processes", method, why)
        self.ctx: Any = None if self.threads else mp.get_context(method)  # typeshed: no .Process
        if method == "forkserver":
            preload_in_fork_server(self.ctx)
        self.num_workers = num_workers
        self.seed = seed
        self.worker_init = worker_init
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.clients: weakref.WeakValueDictionary[int, PoolClient] = weakref.WeakValueDictionary()
        self.payloads: dict[int, bytes] = {}  # cid -> pickled dataset, kept for restarts
        self.refs: dict[int, int] = {}  # cid -> its dataset's key (thread workers: _threads.put)
        self.inbox: dict[int, deque[tuple[int, Any]]] = {}  # cid -> (worker, message)
        self.incarnation = [0] * num_workers
        self.started = [False] * num_workers  # said Started (NOTE [worker protocol])
        # The first client of a private pool: inherited under fork, pickled once otherwise.
        if worker_init is not None and method not in ("fork", "thread"):
            _check_picklable_init(worker_init, method)
        self._first_cid = -1 if first is None else first[0]
        self._first: Any = None if first is None else first[1]
        self._first_pickled = False
        if first is not None and method not in ("fork", "thread"):
            self._first, self._first_pickled = _pickle_for_workers(first[1], method, worker_init)
        if first is not None:
            self.inbox[first[0]] = deque()
        from . import _ring
        from ._region import SharedRegion

        self.bell_region = SharedRegion(_PAGE)
        self.bell = _ring.Bell(self.bell_region.mm, create=True)
        self.procs: list[Any] = [None] * num_workers
        self.host: Host | None = None  # NOTE [hosted threads]: the one the workers run in
        self.conns: list[Connection | None] = [None] * num_workers
        self.readers: list[FrameReader | None] = [None] * num_workers  # of conns[i]
        self.restarts = 0
        self.closed = False
        try:
            for i in range(num_workers):
                self.start_worker(i)
        except BaseException:
            self.close()
            raise

    # -- clients -----------------------------------------------------------------------------
    def register(self, cid: int, client: PoolClient, dataset: Any) -> None:
        """Send ``dataset`` to every worker, once; ``client`` gets the death callbacks."""
        with self.lock:
            self.clients[cid] = client
            self.inbox.setdefault(cid, deque())
            if cid == self._first_cid:
                return
            if self.threads:  # NOTE [thread workers]: the user's object, by reference
                key = self.refs[cid] = _threads.put(dataset)
                for i in range(self.num_workers):
                    self.send(i, m.AddDatasetRef(cid, key))
                return
            refuse_unimportable_main(dataset, self.start_method)
            try:
                payload = pickle.dumps(dataset, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                raise NotPicklable(
                    f"fastload: the dataset {type(dataset).__qualname__} cannot be pickled "
                    f"({type(e).__name__}: {e}). A Loader on a shared fastload.Pool sends its "
                    "dataset to the running workers, so it must pickle: keep unpicklable members "
                    "(open files, locks, lambdas) out of it or create them lazily in "
                    "__getitem__, or give the Loader its own workers (no pool=)"
                ) from e
            self.payloads[cid] = payload
            for i in range(self.num_workers):
                self.send(i, m.AddDataset(cid, payload))  # a dead one gets it at its restart

    def unregister(self, cid: int) -> None:
        """The client is gone: workers drop its dataset and unmap its region."""
        with self.lock:
            self.clients.pop(cid, None)
            self.payloads.pop(cid, None)
            key = self.refs.pop(cid, None)
            if key is not None:
                _threads.drop(key)
            self.inbox.pop(cid, None)
            if self.closed:
                return
            for i in range(self.num_workers):
                self.send(i, m.Detach(cid))  # a dead one: its restart does not attach it

    # -- messages ----------------------------------------------------------------------------
    def _route(self, i: int, msg: Any) -> None:
        if isinstance(msg, m.Started):
            self.started[i] = True
            return
        if isinstance(msg, m.InitFailed):
            for box in self.inbox.values():
                box.append((i, msg))
            return
        mine = self.inbox.get(msg.cid)
        if mine is not None:  # else: a client that is gone
            mine.append((i, msg))

    def pump(self, workers: Iterable[int], timeout: float) -> None:
        """Read what the ``workers`` have sent, waiting up to ``timeout`` for a first message
        from any of them (never for the rest of one: NOTE [resumable reads])."""
        with self.lock:
            conns = {c: i for i in workers
                     if (c := self.conns[i]) is not None and self.readers[i] is not None}
            try:
                ready = wait(list(conns), timeout) if conns else []
            except OSError:
                return
            for ready_conn in ready:
                i = conns[ready_conn]  # type: ignore[index]
                try:
                    for msg in self.readers[i].read():  # type: ignore[union-attr]
                        self._route(i, msg)
                except (EOFError, OSError):
                    pass  # it died: check() says how

    def take(self, cid: int) -> list[tuple[int, Any]]:
        """Every message routed to client ``cid`` so far."""
        with self.lock:
            box = self.inbox.get(cid)
            if not box:
                return []
            out = list(box)
            box.clear()
            return out

    def send(self, i: int, msg: Any, fd: int | None = None) -> bool:
        """Send ``msg`` to worker i, then ``fd`` (SCM_RIGHTS) if given, as one unit: loaders in
        different threads may share the pool, and a worker reads an fd right after its message.
        Then wake the workers that sleep on the bell, so they read it now. False if worker i is
        dead (check() restarts it, and the restart sends the datasets and regions it needs)."""
        owned = None
        if isinstance(msg, m.AddDataset) and len(msg.payload) > _INLINE_BYTES:
            owned = fd = _memfd_of(msg.payload)
            msg = m.AddDatasetFd(msg.cid, len(msg.payload))
        try:
            with self.lock:
                conn, p = self.conns[i], self.procs[i]
                if conn is None or p is None:
                    return False
                try:
                    conn.send(msg)
                    if fd is not None:
                        send_handle(conn, fd, p.pid)
                except (OSError, EOFError):
                    return False
        finally:
            if owned is not None:
                os.close(owned)
        self.wake()
        return True

    def wake(self) -> None:
        """Wake every worker sleeping on the bell, so it reads its pipe now rather than after
        its wait times out (a probe or a new loader's region while other loaders are idle)."""
        if not self.bell.closed:
            self.bell.ring(True)

    # -- workers -----------------------------------------------------------------------------
    def start_worker(self, i: int) -> None:
        self.started[i] = False
        args = (i, self.num_workers, self._first_cid, self._first, self._first_pickled,
                self.worker_init, self.seed,
                0 if self.start_method == "forkserver" else os.getpid(),
                # PDEATHSIG fires when the *thread* that forks exits: armed only for a start
                # from the main thread (a restart may run in any loader's thread)
                not self.threads and threading.current_thread() is threading.main_thread())
        p: Any
        if self.threads:  # NOTE [thread workers] (_threads.py): a thread of this process
            p, conn = _threads.start_thread(thread_main, args)
        elif self.hosted:  # NOTE [hosted threads]: a thread of the host (a new one if it died)
            self.host, (p, conn) = Host.thread_of(self.host, self.ctx, args)
        else:
            p, conn = start_process(self.ctx, worker_main, args)
        self.procs[i] = p
        self.conns[i] = conn
        self.readers[i] = FrameReader(conn)
        self.send(i, m.Bell(self.bell_region.nbytes), self.bell_region.fd)
        for cid, payload in self.payloads.items():
            self.send(i, m.AddDataset(cid, payload))
        for cid, key in self.refs.items():
            self.send(i, m.AddDatasetRef(cid, key))

    def dead_workers(self, timeout: float = 0.0) -> list[int]:
        """Indices of workers whose process has exited, checked via their sentinels (NOTE
        [hosted threads]: one sentinel may be several workers')."""
        by_sentinel: dict[int, list[int]] = {}
        for i, p in enumerate(self.procs):
            if p is not None:
                by_sentinel.setdefault(p.sentinel, []).append(i)
        dead: list[int] = []
        for r in wait(list(by_sentinel), timeout=timeout) if by_sentinel else []:
            ids = by_sentinel[r]  # type: ignore[index]
            # The sentinel closes while the process exits, a moment before it can be reaped:
            # wait (boundedly) for the exit code instead of reporting a running process.
            self.procs[ids[0]].join(_REAP_TIMEOUT_S)
            dead.extend(ids)
        return sorted(dead)

    def check(self) -> None:
        """Restart dead workers; tell every client before (reclaim) and after (re-attach). A
        worker whose restart failed (fork: EAGAIN, EMFILE, ENOMEM) is started again at the next
        check, and until then every check raises WorkerDied saying so."""
        with self.lock:
            if self.closed:
                return
            dead = self.dead_workers(0)
            missing = [i for i, p in enumerate(self.procs) if p is None]  # a failed restart
            if not dead and not missing:
                return
            deaths = []
            for i in dead:
                self.pump((i,), 0)  # what it sent before dying (errors, spills) reaches its client
                deaths.append(m.Death(i, self.pid_of(i), self.exitcode(i), self.started[i]))
            clients = list(self.clients.values())
            if deaths:
                for c in clients:
                    c.workers_died(deaths)
            restarted, failed = [], []
            for i in dead + missing:
                try:
                    self.restart(i)
                    restarted.append(i)
                except OSError as e:
                    failed.append(f"worker {i}: {type(e).__name__}: {e}")
            if restarted:
                for c in clients:
                    c.workers_restarted(restarted)
            if failed:
                raise WorkerDied(
                    f"could not start a worker again after it died ({'; '.join(failed)}); "
                    "free processes, file descriptors or memory: it is tried again at the next "
                    "batch"
                )

    def pids(self) -> list[int | None]:
        return [None if p is None else p.pid for p in self.procs]

    def pid_of(self, i: int) -> int | None:
        p = self.procs[i]
        return None if p is None else p.pid

    def exitcode(self, i: int) -> int | None:
        p = self.procs[i]
        return None if p is None else p.exitcode

    def is_alive(self, i: int, incarnation: int) -> bool:
        """Whether worker i is still the process ``incarnation`` and has not exited."""
        p = self.procs[i]
        return self.incarnation[i] == incarnation and p is not None and p.exitcode is None

    def discard(self, i: int) -> None:
        """Forget a dead worker (close its pipe and process handle)."""
        p, conn = self.procs[i], self.conns[i]
        self.procs[i] = None
        self.conns[i] = None
        reader, self.readers[i] = self.readers[i], None
        if reader is not None:
            reader.close()
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
        self.incarnation[i] += 1
        self.start_worker(i)

    def close(self) -> None:
        """Steps 1-3 of NOTE [shutdown] (clients stop their rings first). Idempotent."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            try:
                self.bell.stop()  # sleeping workers wake and exit
            except ValueError:
                pass
            for conn in self.conns:
                if conn is not None:
                    try:
                        conn.send(m.Stop())
                    except (OSError, ValueError):
                        pass
            procs = [p for p in self.procs if p is not None]
            # Read (and drop) what workers are still sending: a worker blocked writing a large
            # message to a full pipe would otherwise never see the stop flag.
            _join_all(procs, _JOIN_TIMEOUT_S, [r for r in self.readers if r is not None])
            for p in procs:
                if p.exitcode is None:
                    p.terminate()
            _join_all(procs, _TERM_TIMEOUT_S)
            for p in procs:
                if p.exitcode is None:
                    p.kill()
            # A thread cannot be killed (NOTE [thread workers]): one stuck in user code is
            # left to end on its own (a daemon thread: it never blocks interpreter exit).
            _join_all(procs, _TERM_TIMEOUT_S if self.threads else None)
            for i in range(self.num_workers):
                self.discard(i)
            self.bell.close()
            self.bell_region.close()
            self.inbox.clear()
            self.payloads.clear()


def _join_all(procs: list[Any], timeout: float | None, readers: list[FrameReader] = ()) -> None:  # type: ignore[assignment]
    alive = [p for p in procs if p.exitcode is None]
    if not alive:
        return
    if timeout is None:
        for p in alive:
            p.join()
        return
    import time

    deadline = time.monotonic() + timeout
    socks = {r.sock: r for r in readers}
    while alive:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        # one sentinel per process (hosted threads share their host's)
        ready = wait(list({p.sentinel for p in alive}) + list(socks), timeout=left)
        for sock in [s for s in ready if s in socks]:
            try:
                socks[sock].read()  # dropped (a spill's mapping is freed with it)
            except (EOFError, OSError):
                del socks[sock]
        alive = [p for p in alive if p.exitcode is None]


class Pool:
    """Worker processes shared by several loaders: ``Loader(dataset, ..., pool=pool)``.

    Train and validation loaders (or a loader re-created every epoch) share the same processes:
    each loader's dataset is sent to every worker once, when the loader is created, and its first
    batch costs no process start. Two loaders on one pool can be iterated at the same time,
    interleaved; their batches never mix. Closing a loader leaves the pool running (its workers
    drop that loader's dataset and shared memory); closing the pool closes the loaders still on
    it and ends the workers. Worker deaths are handled as for a loader's own workers (each loader
    applies its ``on_worker_death``; the pool restarts the process).

    Parameters
    ----------
    num_workers : int, optional
        Worker processes; None means ``os.cpu_count()``.
    start_method : {"fork", "forkserver", "spawn"}, optional
        As for :class:`fastload.Loader`. Datasets always reach a shared pool's workers pickled
        (they exist before the datasets do), whatever the start method.
    worker_init : callable, optional
        Called once in each worker as ``worker_init(worker_id)`` when it starts.
    seed : int, optional
        Seeds each worker process's global ``random`` and ``numpy.random`` state (per worker
        id); random if None. Shuffling and :func:`fastload.sample_rng` follow each loader's own
        seed.
    worker_method : {"process", "thread", "process_threads"}
        As for :class:`fastload.Loader`: ``"thread"`` runs the workers as threads of this
        process, and loaders on it hand them their datasets as they are (never pickled);
        ``"process_threads"`` runs them as threads of one helper process (started with
        ``start_method``).

    Examples
    --------
    >>> import numpy as np, fastload
    >>> with fastload.Pool(2) as pool:
    ...     train = fastload.Loader(np.arange(8.0), 4, shuffle=True, seed=0, pool=pool)
    ...     val = fastload.Loader(np.arange(4.0), 2, pool=pool)
    ...     [len(b) for b in train], [b.tolist() for b in val]
    ([4, 4], [[0.0, 1.0], [2.0, 3.0]])
    """

    def __init__(
        self,
        num_workers: int | None = None,
        start_method: str | None = None,
        worker_init: Any = None,
        *,
        seed: int | None = None,
        worker_method: str = "process",
    ) -> None:
        from multiprocessing.util import Finalize

        self._workers: WorkerPool | None = None
        config = PoolConfig.build(num_workers, start_method, worker_init, seed, worker_method)
        self.seed = config.seed
        self._workers = WorkerPool(config)
        # Loaders' finalizers (exitpriority 10) run before this one at interpreter exit.
        self._finalizer = Finalize(self, Pool._shutdown, args=(self._workers,), exitpriority=5)

    @staticmethod
    def _shutdown(workers: WorkerPool) -> None:
        if os.getpid() != workers.pid:
            return
        for client in list(workers.clients.values()):
            client.close(reason="its fastload.Pool was closed")
        workers.close()

    @property
    def num_workers(self) -> int:
        assert self._workers is not None
        return self._workers.num_workers

    @property
    def start_method(self) -> str:
        assert self._workers is not None
        return self._workers.start_method

    @property
    def worker_method(self) -> str:
        """``"process"``, ``"thread"`` or ``"process_threads"`` (as given)."""
        assert self._workers is not None
        return self._workers.worker_method

    @property
    def closed(self) -> bool:
        return self._workers is None or self._workers.closed

    def check_usable(self) -> WorkerPool:
        """The worker pool, or a clear error if this pool cannot serve a new loader."""
        w = self._workers
        if w is None or w.closed:
            from .errors import LoaderClosedError

            raise LoaderClosedError("this fastload.Pool is closed; create a new one")
        if os.getpid() != w.pid:
            raise RuntimeError(
                "a fastload.Pool can only be used in the process that created it "
                f"(created in pid {w.pid}, used in pid {os.getpid()})"
            )
        return w

    def close(self) -> None:
        """Close the loaders still on this pool, then end the workers. Idempotent."""
        if self._workers is not None:
            self._finalizer()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        w = self._workers
        if w is None:
            return "<fastload.Pool (not constructed)>"
        state = "closed" if w.closed else f"open, {len(w.clients)} loaders"
        return (
            f"<fastload.Pool num_workers={w.num_workers} start_method={w.start_method!r} "
            f"{state}>"
        )


#: Larger messages to a worker go in an anonymous file (NOTE [worker protocol]: a memfd, or an
#: unlinked temporary file where there is no memfd_create): a pipe holds ~200 KiB.
_INLINE_BYTES = 64 * 1024


def _memfd_of(data: bytes) -> int:
    from ._region import new_fd

    fd = new_fd(len(data), "a dataset sent to the workers")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd
