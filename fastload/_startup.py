"""Start-up of a loader with workers: the first-sample probe, the region, attaching workers.

NOTE [first samples]
A batch layout comes from the first sample (fastload/layout.py), loaded by worker 0 (the
probe); with in_order=False, from whichever of the first samples below loads first (their
probes say its layout too, ``hint``: a slow first sample holds back nothing but its batch).
The first time, every other worker loads another sample at the same time (a Probe with
report=False) and keeps it (BatchFiller.warm) for when a batch that has it is filled: all
workers start at once, so a dataset whose ``__getitem__`` waits until several workers have
begun a sample (a barrier) works, and the first batches do not wait for one worker. With shared
batches (NOTE [sharing policy] in _scheduler.py) those are the next rows of the first batch,
and the first batch is queued with each of those rows given to the worker that loaded it
(``Scheduler.given``): no sample is loaded twice, and the first batch takes one sample's time.
Otherwise they are the first samples of the next batches, and a kept sample packed into a batch
claimed by another worker is loaded again there (the ring hands batches to whichever worker is
free): at most ``num_workers - 1`` samples, once.

The constructor probes the first batch of epoch 0; ``load_state_dict`` moves where the first
pass starts, so a probe still in flight then is retargeted (``Mailbox.retarget``): its layout
is kept (it is the dataset's), its failure is dropped and the resumed batch is probed instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _messages as m
from ._mailbox import Mailbox
from ._passes import Pass, Passes
from ._pool import Pool, WorkerPool, default_start_method
from ._rngs import mode_of
from ._scheduler import Scheduler
from ._share import Sharing, share_dataset
from ._wait import POLL_INTERVAL_S, Deadline
from .layout import BatchLayout

__all__ = ["Startup", "start_workers"]


def start_workers(cid: int, dataset: Any, cfg: Any, plan: Any, passes: Passes,
                  sched: Scheduler, pool: Pool | None) -> tuple[Sharing, Startup]:
    """The workers of client ``cid``: its dataset as the workers get it (NOTE [shared
    datasets] in _share.py), a pool (``pool``'s, or a private one started now) and the
    mailbox of its pipes, in a Startup. The caller registers itself with the pool."""
    method = cfg.start_method or default_start_method()
    fork = pool is None and method in ("fork", "thread")
    threads = method == "thread" or (pool is not None and pool.check_usable().threads)
    # thread workers use the dataset itself: nothing to share (NOTE [thread workers])
    sharing = share_dataset(dataset, "fork" if fork else "pickled",
                            cfg.share_dataset and not threads)
    sharing.tag(cid)
    workers = (pool.check_usable() if pool is not None
               else WorkerPool(cfg.pool_config(), (cid, sharing.dataset)))
    mail = Mailbox(workers, cid, cfg.timeout)
    return sharing, Startup(cid, cfg, plan, passes, sched, workers, mail)


class Startup:
    """The probe, the region and the attach messages of client ``cid`` of ``pool``."""

    def __init__(self, cid: int, cfg: Any, plan: Any, passes: Passes, sched: Scheduler,
                 pool: WorkerPool, mail: Mailbox) -> None:
        self.cid, self.cfg, self.plan, self.passes, self.sched = cid, cfg, plan, passes, sched
        self.pool, self.mail = pool, mail
        self.warmed = False  # NOTE [first samples]: the other workers were given samples
        #: in_order=False (NOTE [out of order] in _scheduler.py): the first layout found by any
        #: worker loading its first sample, not only worker 0's
        self.hints = not cfg.in_order and not plan.iterable and cfg.on_error != "skip"

    def send_probe(self, p: Pass | None = None) -> None:
        """Ask a worker (0, for a map-style dataset) for the layout of pass ``p``'s next batch's
        first sample (None: the newest live pass's, else the next epoch's first); NOTE [first
        samples]: the first time, also have each other worker load a sample."""
        if p is None and (e := self.passes.newest) is not None:
            p = self.passes.live[e]
        e, b = (p.epoch, p.position) if p is not None else (self.passes.next_epoch, 0)
        warm = 0 if self.warmed else self.cfg.num_workers
        firsts = self.plan.probe_tasks(e, b, warm, self.sched.share)
        if not firsts:
            return
        if self.sched.share:  # the first rows of batch b: given to the workers that load them
            k = min(len(firsts), len(self.plan.batch(e, b)))
            self.sched.given = (e, b, [w for w, _ in firsts[:k]])
        (to, sample), rest = firsts[0], firsts[1:]
        alternates: tuple[int, ...] = ()
        if self.cfg.on_error == "skip":  # NOTE [skipped samples]: the rest of its batch
            alternates = tuple(int(i) for i in self.plan.batch(e, b)[1:])
        globals_mode = mode_of(self.cfg.seed_globals,
                               threads=(self.pool.threads or self.pool.hosted
                                        or self.cfg.io_concurrency > 1),
                               iterable=self.plan.iterable)  # NOTE [global RNGs] (_rngs.py)
        io, ahead = self.cfg.io_concurrency, tuple[int, ...]()  # NOTE [reads in flight] (_io.py)
        if io > 1 and not self.plan.iterable:
            ahead = tuple(int(i) for i in self.plan.batch(e, b)[1:])
        self.mail.send_probe(m.Probe(self.cid, sample, self.plan.rows, self.plan.seed, e,
                                     self.cfg.sample_spec, alternates=alternates,
                                     globals=globals_mode, io=io, rest=ahead), rest, to,
                            hint=self.hints)
        self.warmed = True

    def wait_layout(self, p: Pass, check_workers: Callable[[Pass], None]) -> BatchLayout:
        """The layout, once the probe for pass ``p`` answers (bounded by the loader's timeout;
        ``check_workers`` raises what the workers' deaths mean for ``p``). The probe sample's
        error is its batch's: that batch is consumed (NOTE [errors do not end the epoch])."""
        pool, mail = self.pool, self.mail
        wait = Deadline(self.cfg.timeout, self.cfg.on_stall, stall_now=False)
        while True:
            if mail.probe is None:
                self.send_probe(p)
            # (in_order=False: any worker may say the layout first)
            pool.pump(range(self.cfg.num_workers) if self.hints else (mail.probe_worker,),
                          POLL_INTERVAL_S)
            try:
                mail.collect()
            except BaseException:
                if mail.probe_failed and self.passes.is_live(p.epoch):  # the batch's first
                    mail.probe_failed = False  # sample raised: that batch is consumed
                    p.position += 1  # (nothing is queued yet)
                    self.sched.queue_from(p.epoch, p.position)
                raise
            if mail.layout is not None:
                return mail.layout  # type: ignore[no-any-return]
            if mail.probe_ended is not None:  # NOTE [iterable datasets]: ask the next worker
                (worker, pe), mail.probe_ended = mail.probe_ended, None
                self.plan.ended(pe, worker)
                if pe == p.epoch and self.plan.all_ended(pe):
                    raise StopIteration  # no worker's iterator has a sample this epoch
            check_workers(p)
            if mail.probe_started:  # a slow process start is not a slow dataset: count from
                wait.start_stall()  # when worker 0 starts loading the sample
            w = mail.probe_worker
            wait.check(lambda: f"worker {w} (pid {pool.pid_of(w)}) is still "  # noqa: B023
                       f"loading sample index "
                       f"{mail.probe.sample if mail.probe else '?'} (the first sample, which sets "
                       "the batch layout)")

    def attach(self, i: int, layout: BatchLayout) -> None:
        """Send worker ``i`` the region (a restarted worker is attached again)."""
        slots = self.sched.slots
        assert slots is not None
        region = slots.region
        self.pool.send(i, m.Attach(self.cid, layout, region.nbytes,
                                   self.cfg.on_error == "skip", self.cfg.io_concurrency),
                       region.fd)
