"""The worker process: entry point, hygiene, and the fill loop.

NOTE [worker protocol]
Each worker has one duplex pipe (a socketpair) to the parent. A worker serves one or more
*clients* (loaders; NOTE [one pool, many loaders] in _pool.py), each named by an id (cid).
Parent -> worker messages:
``("bell", nbytes)`` + the pool's bell fd (SCM_RIGHTS): map it (sent first, once);
``("dataset", cid, pickled_dataset)``: a new client;
``("probe", cid, index, batch_size)``: load one sample and reply ``("layout", cid, BatchLayout)``
(or ``("probe_error", cid, payload)``);
``("attach", cid, layout, nbytes)`` + the client's region fd: map it and start filling its ring;
``("detach", cid)``: drop the client's dataset and unmap its region;
``("stop",)``: exit 0.
Worker -> parent: ``("layout", cid, ...)``, ``("error", cid, slot, state, payload)`` for a batch
that raised (sent *after* the slot is marked FAILED, so a large message can never block a worker
that the parent is not yet reading), ``("spill", cid, slot, state, payload)`` for object leaves
that did not fit the slot's variable area, ``("dataset_error", cid, payload)`` when a dataset
cannot be unpickled here, ``("init_error", payload)`` when worker_init fails.
Batch data never travels through the pipe: workers write straight into slots.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import parent_process
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle
from typing import Any

__all__ = ["WorkerInfo", "get_worker_info", "sample_rng", "worker_main", "pack_exception"]

#: How long one wait for work lasts before the worker re-checks its pipe and the stop flag.
_CLAIM_TIMEOUT_S = 0.1
#: While a worker has work, how often it reads its pipe (a new loader's probe, an attach, a
#: detach); idle workers read it as soon as a message rings the bell.
_MAIL_INTERVAL_S = 0.002
#: How often the watchdog thread checks that the parent is alive (it also wakes on its sentinel).
_WATCHDOG_PERIOD_S = 0.5


@dataclass(frozen=True)
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


#: (seed, epoch, index) of the sample being loaded, for sample_rng(); set by the fill loops.
_sample_ctx: list[int] = [0, 0, -1]


def sample_rng(index: int | None = None) -> Any:
    """A ``numpy.random.Generator`` for the sample being loaded, seeded from
    ``(seed, epoch, index)``.

    Call it inside ``__getitem__``: random augmentations are then bitwise reproducible whatever
    the number of workers, the start method, or a resume in between. In ``__getitems__`` pass
    the index explicitly. Outside a loader it raises RuntimeError.

    Examples
    --------
    >>> import numpy as np, fastload
    >>> class Noisy:
    ...     def __len__(self): return 4
    ...     def __getitem__(self, i):
    ...         return np.float64(i) + fastload.sample_rng().normal()
    >>> a = [b.tolist() for b in fastload.Loader(Noisy(), 2, seed=1, num_workers=0)]
    >>> b = [b.tolist() for b in fastload.Loader(Noisy(), 2, seed=1, num_workers=0)]
    >>> a == b
    True
    """
    import numpy as np

    seed, epoch, current = _sample_ctx
    i = current if index is None else int(index)
    if i < 0:
        raise RuntimeError(
            "fastload.sample_rng() is only meaningful while a fastload Loader loads a sample "
            "(inside __getitem__), or with an explicit index inside __getitems__"
        )
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, i])))


def get_worker_info() -> WorkerInfo | None:
    """Inside a worker: its :class:`WorkerInfo`. In the main process: ``None``."""
    return _worker_info


def pack_exception(exc: BaseException, index: int | None, worker_id: int) -> bytes:
    """Serialise an exception from user code with its traceback text (never raises)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        exc_bytes: bytes | None = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(exc_bytes)  # an exception that pickles but cannot be rebuilt
    except Exception:
        exc_bytes = None
    info = {
        "type_name": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": _safe_str(exc),
        "exc": exc_bytes,
        "tb": tb,
        "index": index,
        "worker_id": worker_id,
        "pid": os.getpid(),
    }
    return pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: str() failed>"


def _set_pdeathsig() -> None:
    """Linux: have the kernel SIGKILL this worker when the parent thread dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except Exception:  # pragma: no cover - best effort, the watchdog still runs
        pass


def _start_watchdog(parent_pid: int) -> None:
    """Exit when the parent dies, even while user code is stuck (portable twin of PDEATHSIG)."""
    parent = parent_process()
    sentinel = parent.sentinel if parent is not None else None

    def watch() -> None:
        while True:
            if sentinel is not None:
                try:
                    if wait([sentinel], timeout=_WATCHDOG_PERIOD_S):
                        os._exit(0)
                except OSError:
                    os._exit(0)
            else:  # pragma: no cover
                threading.Event().wait(_WATCHDOG_PERIOD_S)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="fastload-watchdog", daemon=True).start()


def worker_main(
    worker_id: int,
    num_workers: int,
    conn: Connection,
    first_cid: int,
    first_payload: Any,
    pickled: bool,
    worker_init: Any,
    seed: int,
    parent_pid: int,
    pdeathsig: bool,
) -> None:
    """Entry point of every worker process (module-level: works with spawn and forkserver)."""
    # Hygiene first: Ctrl+C goes to the parent only (it shuts us down); native crashes print.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # the parent blocked SIGINT around our start
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    faulthandler.enable()
    if pdeathsig:
        _set_pdeathsig()
    # Our parent is the loader's process (fork, spawn) or the forkserver, which exits when the
    # loader's process dies. parent_pid == 0: forkserver, whose pid we do not know in advance.
    ppid = os.getppid()
    if parent_pid and ppid != parent_pid:
        os._exit(0)  # the parent died before PDEATHSIG was armed
    _start_watchdog(ppid)
    worker = _Worker(worker_id, num_workers, conn, seed)
    try:
        if first_cid >= 0:
            worker.add_client(first_cid, pickle.loads(first_payload) if pickled else first_payload)
        _seed_worker(seed, worker_id)
        global _worker_info
        _worker_info = (
            worker.clients[first_cid].info if first_cid >= 0
            else WorkerInfo(worker_id, num_workers, seed, None)
        )
        if worker_init is not None:
            worker_init(worker_id)
    except BaseException as e:
        conn.send(("init_error", pack_exception(e, None, worker_id)))
        _drain_and_close(conn)
        os._exit(1)
    worker.run()
    os._exit(0)


def _drain_and_close(conn: Connection) -> None:
    """Read what the parent already sent before closing: closing a socket with unread data
    resets the connection, and the parent would lose the message we just sent.

    Raw reads, not ``recv_bytes``: an fd sent with SCM_RIGHTS arrives as a 1-byte message that
    recv_bytes would take for the start of a length header and wait for the rest, forever (the
    kernel closes fds that arrive in data read this way)."""
    try:
        os.set_blocking(conn.fileno(), False)
        while os.read(conn.fileno(), 1 << 16):
            pass
    except OSError:  # BlockingIOError: nothing more to read
        pass
    conn.close()


def pack_getitems(packer: Any, slot: int, idx_list: list[int], samples: Any, objs: list[Any]) -> None:
    """Pack what ``__getitems__`` returned: a list of samples (torch's convention), or one
    already-stacked batch (the sample structure with a leading batch axis on every array)."""
    count = len(idx_list)
    if not isinstance(samples, list):
        packer.pack_batch(slot, samples, count)
        return
    if len(samples) != count:
        raise ValueError(f"__getitems__ returned {len(samples)} samples for {count} indices")
    for row, sample in enumerate(samples):
        try:
            packer.pack(slot, row, sample, objs)
        except Exception as e:
            if hasattr(e, "add_note"):
                e.add_note(f"(sample index {idx_list[row]}, from __getitems__)")
            raise


def _seed_worker(seed: int, worker_id: int) -> None:
    """Distinct, reproducible global RNG state per worker (NumPy and `random`)."""
    import random

    import numpy as np

    ss = np.random.SeedSequence(seed).spawn(worker_id + 1)[worker_id]
    state = ss.generate_state(4)
    random.seed(int(state[0]) << 32 | int(state[1]))
    np.random.seed(state[2:4])


class _Client:
    """What a worker holds for one loader: its dataset, and once attached its ring."""

    def __init__(self, worker: _Worker, cid: int, dataset: Any) -> None:
        self.worker = worker
        self.cid = cid
        self.dataset = dataset
        self.info = WorkerInfo(worker.worker_id, worker.num_workers, worker.seed, dataset)
        self.pid = worker.pid
        self.ring: Any = None
        self.packer: Any = None
        self.region: Any = None
        self.layout: Any = None
        self.getitems = getattr(dataset, "__getitems__", None)
        columns = getattr(dataset, "_fastload_columns", None)
        # fastload.ArrayDataset: rows are gathered in C, no Python call per sample.
        self.columns: list[Any] | None = columns() if callable(columns) else None

    def attach(self, layout: Any, nbytes: int, fd: int) -> None:
        from ._pack import Packer
        from ._region import SharedRegion
        from ._ring import RingIndex

        self.layout = layout
        self.region = SharedRegion.attach(fd, nbytes)
        self.ring = RingIndex(self.region.mm)
        self.packer = Packer(
            self.region.mm,
            self.ring.data_offset,
            self.ring.slot_bytes,
            self.ring.nslots,
            layout.batch_size,
            layout.tree,
            layout.packer_fields,
        )

    def detach(self) -> None:
        if self.packer is not None:
            self.packer.close()
        if self.ring is not None:
            self.ring.close()
        if self.region is not None:
            self.region.close()
        self.ring = self.packer = self.region = None
        self.dataset = self.getitems = self.columns = None

    def probe(self, index: int, batch_size: int) -> None:
        conn, seed = self.worker.conn, self.worker.seed
        global _worker_info
        _worker_info = self.info
        # Tells the loader that a death from now on is this sample's doing (a shared pool's
        # worker may die on another loader's batch before it reads the probe).
        conn.send(("probe_start", self.cid))
        try:
            from .layout import BatchLayout

            _sample_ctx[0], _sample_ctx[1], _sample_ctx[2] = seed, 0, index
            try:
                layout = BatchLayout(self.dataset[index], batch_size)
            finally:
                _sample_ctx[2] = -1
            conn.send(("layout", self.cid, layout))
        except BaseException as e:
            conn.send(("probe_error", self.cid, pack_exception(e, index, self.worker.worker_id)))

    def fill(self, slot: int, state: int) -> None:
        import numpy as np

        global _worker_info
        _worker_info = self.info
        ring, layout = self.ring, self.layout
        count = ring.slot_count(slot)
        base = ring.data_offset + slot * ring.slot_bytes
        indices = np.frombuffer(self.region.mm, np.int64, count, base + layout.index_offset)
        seed = int(np.frombuffer(self.region.mm, np.int64, 1, base + layout.seed_offset)[0])
        idx_list = indices.tolist()
        objects: list[Any] | None = [] if layout.n_objects else None
        index = None
        ctx = _sample_ctx  # for sample_rng()
        ctx[0], ctx[1] = seed, ring.slot_info(slot)["epoch"]
        try:
            pack, ds = self.packer.pack, self.dataset
            objs = objects if objects is not None else []
            if self.columns is not None and self._gather(slot, indices):
                pass
            elif self.getitems is not None:
                pack_getitems(self.packer, slot, idx_list, self.getitems(idx_list), objs)
            else:
                for row, index in enumerate(idx_list):
                    ring.set_progress(slot, row, self.pid)
                    ctx[2] = index
                    pack(slot, row, ds[index], objs)
                ctx[2] = -1
            flags, var_bytes = 0, 0
            if objects is not None:
                flags, var_bytes = self._put_objects(slot, base, objects)
        except BaseException as e:
            if isinstance(e, (SystemExit, KeyboardInterrupt)):
                raise
            payload = pack_exception(e, index, self.worker.worker_id)
            del e
            if ring.publish(slot, state, False):
                self.worker.conn.send(("error", self.cid, slot, state, payload))
            return
        ring.set_result(slot, flags, var_bytes)
        if not ring.publish(slot, state, True):
            return  # reclaimed meanwhile (cannot happen while we live) or cancelled
        if flags:
            self.worker.conn.send(("spill", self.cid, slot, state, pickle.dumps(objects, protocol=5)))

    def _gather(self, slot: int, indices: Any) -> bool:
        """ArrayDataset fast path; False (and never again) if a column cannot be gathered."""
        cols = self.columns
        assert cols is not None
        if self.layout.n_objects or len(cols) != len(self.layout.fields):
            self.columns = None
            return False
        try:
            for k, col in enumerate(cols):
                self.packer.gather(slot, k, col, indices)
        except (BufferError, ValueError):  # a non-contiguous column: use __getitems__
            self.columns = None
            return False
        return True

    def _put_objects(self, slot: int, base: int, objects: list[Any]) -> tuple[int, int]:
        from ._ring import F_SPILLED

        data = pickle.dumps(objects, protocol=pickle.HIGHEST_PROTOCOL)
        layout = self.layout
        if len(data) > layout.var_bytes:
            return F_SPILLED, 0
        start = base + layout.var_offset
        self.region.mm[start : start + len(data)] = data
        return 0, len(data)


class _Worker:
    """The fill loop: claim a task from any attached ring, fill it, publish; sleep on the bell."""

    def __init__(self, worker_id: int, num_workers: int, conn: Connection, seed: int) -> None:
        self.worker_id = worker_id
        self.num_workers = num_workers
        self.seed = seed
        self.conn = conn
        self.pid = os.getpid()
        self.clients: dict[int, _Client] = {}
        self.active: list[_Client] = []  # attached, ring not stopped
        self.next = 0  # round robin over self.active
        self.mail_at = 0.0  # monotonic time of the next pipe check while busy
        self.bell: Any = None
        self.bell_region: Any = None

    def add_client(self, cid: int, dataset: Any) -> None:
        self.clients[cid] = _Client(self, cid, dataset)

    def run(self) -> None:
        while True:
            if self.bell is None or not self.active:
                if not self._handle(self.conn.recv()):
                    return
                continue
            seen = self.bell.value()
            active, n = self.active, len(self.active)
            claimed = False
            closing = []
            for k in range(n):
                client = active[(self.next + k) % n]
                slot, state = client.ring.claim(self.worker_id, 0.0)
                if slot >= 0:
                    self.next = (self.next + k + 1) % n  # the next scan starts past this ring
                    client.fill(slot, state)
                    claimed = True
                    break
                if slot == -2:  # that loader is closing; its detach message follows
                    closing.append(client)
            for client in closing:
                active.remove(client)
            if claimed:
                # Busy: read the pipe only every _MAIL_INTERVAL_S, not after every batch (a
                # poll() system call of ~5 us each; NOTE [data path]: none per batch).
                now = time.monotonic()
                if now < self.mail_at:
                    continue
                self.mail_at = now + _MAIL_INTERVAL_S
            else:
                # Idle. A message that rang the bell before `seen` was read will not end the
                # wait: read the pipe first (messages that come later do end it).
                if not self._read_mail() or self.bell.wait(seen, _CLAIM_TIMEOUT_S) is None:
                    return  # stopped, or the pool is closing
            if not self._read_mail():
                return

    def _read_mail(self) -> bool:
        """Handle every message sent so far; False on ("stop",)."""
        while self.conn.poll():
            if not self._handle(self.conn.recv()):
                return False
        return True

    def _handle(self, msg: tuple[Any, ...]) -> bool:
        kind = msg[0]
        if kind == "stop":
            return False
        if kind == "bell":
            from ._region import SharedRegion
            from ._ring import Bell

            fd = recv_handle(self.conn)
            self.bell_region = SharedRegion.attach(fd, msg[1])
            self.bell = Bell(self.bell_region.mm)
            return True
        if kind == "dataset":
            try:
                self.add_client(msg[1], pickle.loads(msg[2]))
            except BaseException as e:
                self.conn.send(("dataset_error", msg[1], pack_exception(e, None, self.worker_id)))
            return True
        client = self.clients.get(msg[1])
        if kind == "detach":
            if client is not None:
                del self.clients[msg[1]]
                if client in self.active:
                    self.active.remove(client)
                client.detach()
            return True
        if kind == "probe":
            if client is not None:
                client.probe(msg[2], msg[3])
            return True
        if kind == "attach":
            fd = recv_handle(self.conn)
            if client is None:  # its dataset failed to load here (the loader was told)
                os.close(fd)
                return True
            client.attach(msg[2], msg[3], fd)
            self.active.append(client)
            return True
        raise RuntimeError(f"fastload worker: unknown message {kind!r}")
