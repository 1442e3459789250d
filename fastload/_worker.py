"""The worker process: entry point, hygiene, and the loop that claims and fills slots.

The messages it exchanges with the parent are in fastload/_messages.py (NOTE [worker protocol]);
the fill itself, shared with num_workers=0, in fastload/_fill.py.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing import parent_process
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

import numpy as np

from . import _messages as m
from ._fill import WorkerInfo, set_worker_info
from ._iterable import StreamEnded
from ._kinds import filler_for
from ._procs import exit_worker
from ._remote import pack_exception

__all__ = ["worker_main"]

#: How long one wait for work lasts before the worker re-checks its pipe and the stop flag.
_CLAIM_TIMEOUT_S = 0.1
#: A shared batch's rows are taken in pieces of at least this much loading time (_timed), and
#: a batch quicker than _SHARE_MIN_S to load is taken whole (what idle workers could save on it
#: is less than the per-piece bookkeeping costs).
_PIECE_S = 200e-6
_SHARE_MIN_S = 20e-3
#: While a worker has work, how often it reads its pipe (a new loader's probe, an attach, a
#: detach); idle workers read it as soon as a message rings the bell.
_MAIL_INTERVAL_S = 0.002
#: How often the watchdog thread checks that the parent is alive (it also wakes on its sentinel).
_WATCHDOG_PERIOD_S = 0.5


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
    process_hygiene(first_cid, pickled, parent_pid, pdeathsig)
    worker = _Worker(worker_id, num_workers, conn, seed)
    try:
        dataset = pickle.loads(first_payload) if pickled and first_cid >= 0 else first_payload
        worker.begin(first_cid, dataset, worker_init, seed_globals=True)
    except BaseException as e:
        conn.send(m.InitFailed(pack_exception(e, None, worker_id)))
        drain_and_close(conn)
        exit_worker(1)
    conn.send(m.Started(worker_id))
    worker.run()
    exit_worker(0)  # NOTE [worker exit] in _procs.py: multiprocessing's finalizers, then os._exit


def process_hygiene(first_cid: int, pickled: bool, parent_pid: int, pdeathsig: bool) -> None:
    """What a fastload process (a worker, or the host of worker threads: NOTE [hosted threads]
    in _host.py) does first, before any user code."""
    # Ctrl+C goes to the parent only (it shuts us down); native crashes print.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # the parent blocked SIGINT around our start
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    faulthandler.enable()
    if hasattr(faulthandler, "register") and hasattr(signal, "SIGUSR1"):
        # `kill -USR1 <worker pid>` prints where a (stuck) worker is, without stopping it
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    if pdeathsig:
        _set_pdeathsig()
    # Our parent is the loader's process (fork, spawn) or the forkserver, which exits when the
    # loader's process dies. parent_pid == 0: forkserver, whose pid we do not know in advance.
    ppid = os.getppid()
    if parent_pid and ppid != parent_pid:
        os._exit(0)  # the parent died before PDEATHSIG was armed
    _start_watchdog(ppid)
    if not pickled:  # fork: other loaders' regions came with the parent's memory; let go
        from ._region import drop_inherited

        drop_inherited(first_cid)


def thread_main(
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
    datasets: Any = None,
) -> None:
    """Entry point of a worker thread (NOTE [thread workers] in _threads.py): worker_main's
    loop without what belongs to a process (signals, the parent watchdog, global RNG seeding,
    os._exit). The first dataset is the user's object (or its host's: NOTE [hosted threads] in
    _host.py, whose ``datasets`` the threads share)."""
    worker = _Worker(worker_id, num_workers, conn, seed)
    worker.threaded = True
    worker.datasets = datasets
    try:
        try:
            worker.begin(first_cid, first_payload, worker_init, seed_globals=False)
        except Exception as e:
            conn.send(m.InitFailed(pack_exception(e, None, worker_id)))
            raise SystemExit(1) from None
        conn.send(m.Started(worker_id))
        worker.run()
    finally:
        for client in list(worker.clients.values()):
            client.detach()
        if worker.bell_region is not None:
            worker.bell_region.close()
        conn.close()


def drain_and_close(conn: Connection) -> None:
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


def _seed_worker(seed: int, worker_id: int) -> None:
    """Distinct, reproducible global RNG state per worker (NumPy and `random`)."""
    import random


    ss = np.random.SeedSequence(seed).spawn(worker_id + 1)[worker_id]
    state = ss.generate_state(4)
    random.seed(int(state[0]) << 32 | int(state[1]))
    np.random.seed(state[2:4])


class _Client:
    """What a worker holds for one loader: its dataset, and once attached its ring."""

    def __init__(self, worker: _Worker, cid: int, dataset: Any) -> None:
        self.worker = worker
        self.cid = cid
        self.filler: Any = filler_for(dataset, worker.worker_id, worker.num_workers)
        self.info = WorkerInfo(worker.worker_id, worker.num_workers, worker.seed, dataset)
        self.pid = worker.pid
        self.ring: Any = None
        self.packer: Any = None
        self.region: Any = None
        self.layout: Any = None
        self.slots: Any = None
        self.shared = False  # its batches may be shared (NOTE [pieces] in csrc/fl_ring.c)
        #: NOTE [reads in flight] (_io.py): a batch taken ahead, and reads in flight by slot
        self.ahead: Any = None
        self.reads: dict[int, Any] = {}
        self.row_s = 1.0  # seconds to load one row (a moving average): slow until measured
        #: fl_ring_take's shape of this worker's pieces of shared batches (``_timed``): single
        #: rows until a row's time is known
        self.divisor = 2 * worker.num_workers
        self.min_units = 1

    def attach(self, layout: Any, nbytes: int, fd: int) -> None:
        from ._pack import Packer
        from ._region import BorrowedRegion, SharedRegion
        from ._ring import RingIndex
        from ._slots import SlotMap

        self.layout = layout
        # a thread uses this process's own mapping (NOTE [one mapping per process], _region.py)
        self.region = (BorrowedRegion.map(fd, nbytes) if self.worker.threaded
                       else SharedRegion.attach(fd, nbytes))
        self.ring = RingIndex(self.region.mm)
        self.slots = SlotMap(self.region.mm, self.ring, layout)
        self.shared = self.ring.max_pieces > 1
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
        self.ring = self.packer = self.region = self.slots = None
        for pre in self.reads.values():
            pre.cancel()
        self.reads.clear()
        self.ahead = None  # the loader retires its slot (any state)
        if self.filler is not None:
            self.filler.close()  # its read threads (NOTE [reads in flight] in _io.py)
        self.filler = None

    def probe(self, msg: m.Probe) -> None:
        conn = self.worker.conn
        assert self.filler is not None
        set_worker_info(self.info)
        self.filler.globals = msg.globals  # NOTE [global RNGs] (_rngs.py)
        self.filler.io = msg.io  # NOTE [reads in flight] (_io.py): the batch's reads begin
        if msg.rest and self.filler.reads_apply():
            self.filler.read_ahead(msg.rest, msg.seed, msg.epoch)
        if not msg.report and not msg.hint:  # NOTE [first samples] (_startup.py): load it
            self.filler.warm_up(msg.sample, msg.seed, msg.epoch)  # now, pack it later
            return
        if msg.report:  # Tells the loader that a death from now on is this sample's doing (a
            conn.send(m.ProbeStarted(self.cid))  # shared pool's worker may die on another
        try:  # loader's batch before it reads the probe)
            layout = self.filler.probe(msg.sample, msg.batch_size, msg.seed, msg.epoch, msg.spec,
                                       msg.alternates)
            layout.check_picklable()  # an error of the probe's sample, not of this worker
        except StreamEnded:  # NOTE [iterable datasets]: this worker's iterator has no sample
            conn.send(m.ProbeEnded(self.cid, msg.epoch))
        except BaseException as e:
            if msg.report:
                conn.send(m.ProbeFailed(self.cid, pack_exception(e, msg.sample,
                                                                 self.worker.worker_id)))
            elif isinstance(e, Exception):  # a hint (in_order=False): its batch raises it
                self.filler.warm[(msg.seed, msg.epoch, msg.sample)] = (False, e)
            else:
                raise
        else:  # (a hint's sample is kept by probe() for its batch, as a warm one)
            conn.send(m.LayoutFound(self.cid, layout))

    def take(self) -> Any:
        """The next piece to load: the batch taken ahead (NOTE [reads in flight] in _io.py),
        else RingIndex.take's answer."""
        if self.ahead is not None:
            t, self.ahead = self.ahead, None
            return t
        return self.ring.take(self.worker.worker_id, self.divisor, self.min_units, self.pid)

    def _read_ahead(self, t: Any) -> Any:
        """NOTE [reads in flight]: the reads of batch ``t`` (already in flight, or started now),
        and the next batch taken now with its reads started, so that a worker's reads do not
        stop between its batches."""
        filler, slots = self.filler, self.slots
        assert filler is not None
        pre = self.reads.pop(t.slot, None)
        if pre is None:
            pre = filler.start_reads(slots.indices(t.slot, t.count), slots.seed(t.slot),
                                     t.epoch)
        nxt = self.ring.take(self.worker.worker_id, self.divisor, self.min_units, self.pid)
        if nxt and not nxt.shared:
            self.ahead = nxt
            self.reads[nxt.slot] = filler.start_reads(slots.indices(nxt.slot, nxt.count),
                                                      slots.seed(nxt.slot), nxt.epoch)
        elif nxt:
            self.ahead = nxt
        return pre

    def load(self, t: Any) -> None:
        """Load the piece ``t`` (RingIndex.take) took: a whole batch, or a piece of a shared one
        (NOTE [pieces] in csrc/fl_ring.c)."""
        set_worker_info(self.info)
        if t.shared:
            self.fill_rows(t)
        else:
            self.fill(t)

    def fill(self, t: Any) -> None:
        """Load a whole batch, with everything a whole batch may have: object and ragged
        leaves (the variable image), skipped samples, a stream that ended."""
        ring, slots, slot = self.ring, self.slots, t.slot
        assert self.filler is not None
        indices = slots.indices(slot, t.count)
        wid = self.worker.worker_id
        t0 = time.perf_counter()
        pre = self._read_ahead(t) if self.filler.reads_apply() else None
        image, error = self.filler.fill(
            self.packer, self.layout, slot, indices, slots.seed(slot), t.epoch, ring, self.pid,
            pre,
        )
        if self.shared:  # how long a row takes, for the pieces of shared batches
            self._timed(t0, len(indices))
        if error is not None:
            self._fail(t, 0, error)
            return
        spill: int | None = None
        flags = self.filler.flags  # F_ENDED: a plain iterable's iterator ended
        skipped = self.filler.skipped  # NOTE [skipped samples] (_fill.py)
        if skipped:
            from ._ring import F_SKIPPED

            flags |= F_SKIPPED
        if flags and image is None:
            ring.set_result(slot, flags, 0)
        if image is not None:
            # Before publishing: a failure here (no memory; the image is pickled in the fill,
            # NOTE [unpicklable leaves] in _ragged.py) is this batch's error, never the worker's.
            try:
                nbytes = slots.write_image(slot, image)
                if not nbytes:
                    spill = _overflow(image)
            except Exception as e:
                self._fail(t, 0, pack_exception(e, None, wid))
                return
            if nbytes:
                ring.set_result(slot, flags, nbytes)
            else:
                from ._ring import F_SPILLED

                ring.set_result(slot, F_SPILLED | flags, 0)
        if ring.done(t, wid) is None:
            if spill is not None:
                os.close(spill)
            return  # given back meanwhile (the parent took this worker for dead)
        if spill is not None:  # NOTE [worker protocol]: the memfd follows its message
            try:
                nbytes = image.nbytes
                self.worker.conn.send(m.SpillFd(self.cid, slot, t.seq, nbytes))
                send_handle(self.worker.conn, spill, os.getppid())
            finally:
                os.close(spill)
        if skipped:
            self.worker.conn.send(m.Skipped(self.cid, slot, t.seq, tuple(skipped)))

    def fill_rows(self, t: Any) -> None:
        """Load the rows of a piece of a shared batch (fixed-shape leaves only); rows this
        worker loaded first (NOTE [first samples]) come from what it kept."""
        slots, filler = self.slots, self.filler
        assert filler is not None
        slot = t.slot
        indices = slots.indices(slot, t.count)
        t0 = time.perf_counter()
        row, error = filler.fill_rows(self.packer, slot, indices, t.first, t.n, slots.seed(slot),
                                      t.epoch, self.ring, t.piece, self.pid,
                                      self.layout.global_rng)
        self._timed(t0, (row if error is not None else t.first + t.n) - t.first)
        if error is None:
            self.ring.done(t, self.worker.worker_id)
        else:
            self._fail(t, row, error)

    def _fail(self, t: Any, row: int, error: bytes) -> None:
        """Row ``row`` of the piece raised: the ring learns it first (NOTE [pieces]: nothing
        waits for other workers), then, if it is the batch's lowest row that raised so far,
        the error goes to the parent, which reads it once the batch is FAILED with this worker
        as its owner. In that order: a large message can never block a worker whose batch the
        parent is not reading yet (docs/design.md, "Errors from user code")."""
        wid = self.worker.worker_id
        if self.ring.fail(t, wid, row) is None:
            return  # given back meanwhile (the parent took this worker for dead)
        info = self.ring.slot_info(t.slot)
        if info["seq"] == t.seq and info["err_row"] == row and info["err_owner"] == wid:
            self.worker.conn.send(m.BatchFailed(self.cid, t.slot, t.seq, error))

    def _timed(self, t0: float, rows: int) -> None:
        """``rows`` were loaded since ``t0``: the moving average of a row's time, and from it
        the shape of this worker's pieces of shared batches (NOTE [sharing policy] in
        _scheduler.py): guided pieces (units left / divisor, at most 2 x num_workers pieces of
        what is left), none shorter than _PIECE_S of loading (a piece costs a few us of
        bookkeeping), and a batch quicker than _SHARE_MIN_S taken whole (sharing it would save
        less than it costs)."""
        if not rows:
            return
        self.row_s += ((time.perf_counter() - t0) / rows - self.row_s) / 4
        count = self.layout.batch_size
        if count * self.row_s < _SHARE_MIN_S:
            self.divisor, self.min_units = 1, 1
        else:
            self.divisor = 2 * self.worker.num_workers
            self.min_units = max(1, int(_PIECE_S / max(self.row_s, 1e-9)))


def _read_all(fd: int, nbytes: int) -> list[bytes]:
    parts, off = [], 0
    while off < nbytes:
        part = os.pread(fd, nbytes - off, off)
        if not part:
            raise EOFError(f"a {nbytes}-byte message ended after {off} bytes")
        parts.append(part)
        off += len(part)
    return parts


def _overflow(image: Any) -> int:
    """A variable image too large for its slot, written into an anonymous file of its own (a
    memfd on Linux, an unlinked temporary file elsewhere: _region.new_fd) whose fd is sent to
    the parent. Never the pipe: a large pipe write would wait for a parent that no longer reads
    this batch (an epoch left early), or that waits to send to this worker. The file's pages are
    reserved up front, so that no memory is an error here instead of a SIGBUS while writing."""
    from ._region import new_fd

    fd = new_fd(image.nbytes, "a batch too large for its slot")
    try:
        with mmap.mmap(fd, image.nbytes) as mm:
            image.write_into(mm, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        self.threaded = False  # a thread of the loader's process or of a host (thread_main)
        #: a host's threads: the datasets they share by client id (HostDatasets in _host.py)
        self.datasets: Any = None

    def begin(self, first_cid: int, dataset: Any, worker_init: Any, seed_globals: bool) -> None:
        """Before a worker says Started (process or thread alike): the first loader's dataset
        (``first_cid`` >= 0), the worker info, ``worker_init``; ``seed_globals``: seed the
        global RNGs per worker (a process's own; a thread shares its process's). Raises what
        fails."""
        if first_cid >= 0:
            self.add_client(first_cid, dataset)
        if seed_globals:
            _seed_worker(self.seed, self.worker_id)
        set_worker_info(self.clients[first_cid].info if first_cid >= 0
                        else WorkerInfo(self.worker_id, self.num_workers, self.seed, None))
        if worker_init is not None:
            worker_init(self.worker_id)

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
                # NOTE [pieces] (csrc/fl_ring.c): a piece given to this worker first, then the
                # oldest batch nobody began, then a piece of a shared batch begun
                t = client.take()
                if t:
                    self.next = (self.next + k + 1) % n  # the next scan starts past this ring
                    client.load(t)
                    claimed = True
                    break
                if t is False:  # that loader is closing; its detach message follows
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
        """Handle every message sent so far; False on Stop."""
        while self.conn.poll():
            if not self._handle(self.conn.recv()):
                return False
        return True

    def _handle(self, msg: Any) -> bool:
        if isinstance(msg, m.Stop):
            return False
        if isinstance(msg, m.Bell):
            from ._region import BorrowedRegion, SharedRegion
            from ._ring import Bell

            fd = recv_handle(self.conn)
            self.bell_region = (BorrowedRegion.map(fd, msg.nbytes) if self.threaded
                                else SharedRegion.attach(fd, msg.nbytes))
            self.bell = Bell(self.bell_region.mm)
            return True
        if isinstance(msg, m.AddDatasetRef):  # a thread worker: the user's object itself
            from . import _threads

            try:
                self.add_client(msg.cid, _threads.get(msg.key))
            except BaseException as e:
                self.conn.send(m.DatasetFailed(msg.cid, pack_exception(e, None, self.worker_id)))
            return True
        if isinstance(msg, (m.AddDataset, m.AddDatasetFd)):
            fd = -1
            try:
                if isinstance(msg, m.AddDatasetFd):
                    fd = recv_handle(self.conn)

                def load() -> Any:
                    if isinstance(msg, m.AddDatasetFd):
                        return pickle.loads(b"".join(_read_all(fd, msg.nbytes)))
                    return pickle.loads(msg.payload)

                # a host's threads unpickle it once (NOTE [hosted threads] in _host.py)
                self.add_client(msg.cid, load() if self.datasets is None
                                else self.datasets.get(msg.cid, load))
            except BaseException as e:
                self.conn.send(m.DatasetFailed(msg.cid, pack_exception(e, None, self.worker_id)))
            finally:
                if fd >= 0:
                    os.close(fd)
            return True
        client = self.clients.get(msg.cid)
        if isinstance(msg, m.Detach):
            if client is not None:
                del self.clients[msg.cid]
                if self.datasets is not None:
                    self.datasets.release(msg.cid)
                if client in self.active:
                    self.active.remove(client)
                client.detach()
            return True
        if isinstance(msg, m.Probe):
            if client is not None:
                client.probe(msg)
            return True
        if isinstance(msg, m.Attach):
            fd = recv_handle(self.conn)
            if client is None:  # its dataset failed to load here (the loader was told)
                os.close(fd)
                return True
            client.attach(msg.layout, msg.nbytes, fd)
            client.filler.skip = msg.skip
            client.filler.io = msg.io
            self.active.append(client)
            return True
        raise RuntimeError(f"fastload worker: unknown message {msg!r}")
