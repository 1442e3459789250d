"""A loader's end of its workers' pipes: the messages the pool routed to it, the first-sample
probe, and the batch messages (errors, spills) filed by slot until the loader asks for them."""

from __future__ import annotations

import threading
from typing import Any, NoReturn

from . import _messages as m
from ._pool import WorkerPool
from ._remote import message_of, raise_rebuilt
from ._wait import POLL_INTERVAL_S, Deadline
from .errors import WorkerDied, WorkerError

__all__ = ["Mailbox"]


class Mailbox:
    """Messages of one client (``cid``) of a worker pool. ``collect`` may run in another
    loader's thread (NOTE [pool callbacks] in _faults.py): it only files messages.

    NOTE [lock order]
    The pool's lock may be held while a mailbox's lock is taken (the pool's death callbacks
    collect every client's messages), never the other way round: ``collect`` takes what the
    pool routed (the pool's lock, released) before it takes its own lock to file it. Loaders of
    one Pool in several threads cannot deadlock on these two locks."""

    def __init__(self, pool: WorkerPool, cid: int, timeout: float | None = None) -> None:
        self.pool = pool
        self.cid = cid
        self.timeout = timeout  # the loader's: also bounds the wait for a batch's message
        #: (slot, seq, worker) -> BatchFailed/Spill: several workers may fail rows of one
        #: shared batch (NOTE [pieces] in csrc/fl_ring.c); the batch's owner says whose counts
        self.msgs: dict[tuple[int, int, int], Any] = {}
        self.skips: dict[tuple[int, int, int], m.Skipped] = {}  # can follow its Spill
        self.lock = threading.Lock()
        self.layout: Any = None  # what the probe found
        self.probe: m.Probe | None = None  # sent, not yet answered
        self.probe_worker = 0  # who it was sent to
        self.probe_started = False  # that worker said it began loading the probe sample
        self.probe_failed = False  # the error being raised is the probe sample's
        self.probe_stale = False  # load_state_dict moved the start: a failure is not ours
        #: (worker, epoch) whose iterator had no probe sample (NOTE [iterable datasets])
        self.probe_ended: tuple[int, int] | None = None

    def send_probe(self, probe: m.Probe, warm: list[tuple[int, int]], to: int = 0,
                   hint: bool = False) -> None:
        """``probe`` to worker ``to``; each (worker, sample) of ``warm`` to load and keep
        (NOTE [first samples] in _startup.py), and with ``hint`` to say its layout too."""
        # Not kept if the worker is dead: the engine asks again once it is restarted.
        self.probe = probe if self.pool.send(to, probe) else None
        self.probe_worker = to
        self.probe_started = self.probe_failed = self.probe_stale = False
        for k, index in warm:
            self.pool.send(k, probe._replace(sample=index, spec=probe.spec if hint else None,
                                             report=False, rest=(), alternates=(),
                                             hint=hint))

    def retarget(self) -> None:
        """``load_state_dict`` moved where the first pass starts: a probe in flight was sent
        for another batch, so its failure is not that batch's error (it is dropped and the
        probe sent again for the resumed batch); its layout is still the dataset's."""
        with self.lock:
            if self.probe is not None and self.layout is None:
                self.probe_stale = True

    def probe_lost(self, worker: int) -> list[int | None]:
        """``worker`` died: the probe sample it was loading (it is asked again after the
        restart), if any."""
        if worker != self.probe_worker or self.probe is None or self.layout is not None:
            return []
        lost: list[int | None] = [self.probe.sample] if self.probe_started else []
        self.probe, self.probe_started = None, False
        return lost

    def collect(self) -> None:
        """File the messages routed to us; raise what stops the loader from starting (after
        filing the rest)."""
        first: BaseException | None = None
        routed = self.pool.take(self.cid)  # NOTE [lock order]: the pool's lock, not under ours
        if not routed:
            return
        with self.lock:
            for i, msg in routed:
                try:
                    self._note(i, msg)
                except BaseException as e:
                    first = first or e
        if first is not None:
            raise first

    def _note(self, i: int, msg: Any) -> None:
        if isinstance(msg, (m.BatchFailed, m.Spill)):
            self._forget_before(msg.slot, msg.seq)
            self.msgs[(msg.slot, msg.seq, i)] = msg
        elif isinstance(msg, m.Skipped):
            self._forget_before(msg.slot, msg.seq)
            self.skips[(msg.slot, msg.seq, i)] = msg
        elif isinstance(msg, m.ProbeStarted):
            self.probe_started = True
        elif isinstance(msg, m.ProbeEnded):
            self.probe, self.probe_ended = None, (i, msg.epoch)
        elif isinstance(msg, m.LayoutFound):
            if self.layout is None:
                self.layout = msg.layout
        elif isinstance(msg, m.ProbeFailed) and (self.probe_stale or self.layout is not None):
            # sent again for the resumed batch; or a layout came first from another worker
            # (in_order=False): the sample's batch raises its error when it loads again
            self.probe, self.probe_stale = None, False
        elif isinstance(msg, (m.ProbeFailed, m.InitFailed)):
            self.probe = None
            self.probe_failed = isinstance(msg, m.ProbeFailed)
            raise_rebuilt(msg.error)
        elif isinstance(msg, m.DatasetFailed):
            try:
                raise_rebuilt(msg.error)
            except BaseException as exc:
                raise WorkerError(
                    f"worker {i} could not unpickle the dataset: {type(exc).__name__}: "
                    f"{message_of(msg.error)}. A Loader on a shared fastload.Pool sends its "
                    "dataset, pickled, to workers that are already running: its class must be "
                    "importable there (define it in a module, or, with fork, in the main script "
                    "before the Pool is created)"
                ) from exc

    def raise_failure(self, slot: int, seq: int, owner: int, what: str, pid: int) -> NoReturn:
        """Raise the error of the FAILED slot's batch (worker ``owner``, process ``pid``, loaded
        its lowest failing row: NOTE [pieces] in csrc/fl_ring.c)."""
        msg = self.take(owner, slot, seq, pid)
        if msg is None:
            raise WorkerDied(
                f"worker {owner} failed {what} and died before it could report why"
            )
        raise_rebuilt(msg.error)

    def spilled_image(self, slot: int, seq: int, owner: int, pid: int, on_death: str) -> Any:
        """The variable image (object leaves, ragged leaves) of a READY slot's batch that
        travelled over the pipe because it did not fit the slot; if its worker died before it
        sent it: None with ``on_death="restart"`` (the batch is loaded again), else WorkerDied."""
        msg = self.take(owner, slot, seq, pid)
        if msg is None and on_death == "restart":
            return None
        if msg is None:
            raise WorkerDied(f"worker {owner} died while sending batch objects")
        return msg.image

    def skipped(self, slot: int, seq: int, owner: int, pid: int) -> list[tuple[Any, ...]]:
        """What on_error="skip" replaced in a READY slot's batch (its F_SKIPPED flag is set;
        NOTE [skipped samples] in _fill.py); one record of unknown index if its worker died
        before it said."""
        msg = self.take(owner, slot, seq, pid, self.skips)
        if msg is None:
            return [(None, "unknown", f"worker {owner} died before it said which samples of "
                     "this batch it replaced", None)]
        return list(msg.records)

    def take(self, worker: int, slot: int, seq: int, pid: int = 0,
             box: dict[tuple[int, int, int], Any] | None = None) -> Any:
        """The message ``worker`` (process ``pid``, if known) sent about task ``seq`` in
        ``slot``, watching its liveness: None if it died before sending it (also when it was
        restarted already: the new process never sends it)."""
        key = (slot, seq, worker)
        msgs = self.msgs if box is None else box
        pool = self.pool
        incarnation = pool.incarnation[worker]
        if pid and pool.pid_of(worker) != pid:
            incarnation = -1  # the process that published it is gone
        wait = Deadline(self.timeout, None)
        while True:
            self.collect()
            self._forget_before(slot, seq)  # the slot is at task seq now
            if key in msgs:
                return msgs.pop(key)
            if not pool.is_alive(worker, incarnation):
                pool.pump((worker,), 0)  # it died: what it sent is all there is
                self.collect()
                return msgs.pop(key, None)
            wait.check(lambda: f"worker {worker} (pid {pool.pid_of(worker)}) finished the batch "
                       f"in slot {slot} but has not sent what goes with it (its process is "
                       f"{_process_state(pool.pid_of(worker))}; `kill -USR1 <pid>` prints "
                       "where it is)")
            pool.check()  # other workers that die meanwhile are restarted, not left dead
            pool.pump((worker,), wait.step() or POLL_INTERVAL_S)

    def _forget_before(self, slot: int, seq: int) -> None:
        """Drop what was filed about tasks of ``slot`` older than ``seq``: a slot holds one
        task at a time and seqs grow, so they were abandoned (a pass ended, a task re-queued).
        Only the slot's own: several passes' tasks are not delivered in seq order (NOTE
        [several passes] in _passes.py). At most one task's messages per slot stay filed."""
        for filed in (self.msgs, self.skips):
            for old in [k for k in filed if k[0] == slot and k[1] < seq]:
                del filed[old]

    def clear(self) -> None:
        self.msgs.clear()
        self.skips.clear()


_STATES = {"R": "running", "S": "sleeping", "D": "in an uninterruptible wait",
           "T": "stopped (SIGSTOP?)", "t": "stopped by a debugger", "Z": "a zombie"}


def _process_state(pid: int | None) -> str:
    """What Linux says a process is doing, for a timeout's message ("unknown" elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "in an unknown state"
    return _STATES.get(state, f"in state {state}")
