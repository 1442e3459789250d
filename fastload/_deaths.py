"""What a dead worker means for a loader: what to re-queue, what to raise, when to give up.

Pure logic: the engine says which samples each dead worker was loading; the policy says whether
the epoch goes on (the lost batches are re-queued for the restarted worker) or ends with
``WorkerDied``, and what to tell the user.
"""

from __future__ import annotations

from typing import NamedTuple

from ._messages import Death
from ._procs import EXIT_UNGUARDED_MAIN, exit_code_name, unguarded_main_text
from .errors import WorkerDied

__all__ = ["Death", "DeathPolicy", "Verdict", "MAX_KILLS_PER_SAMPLE", "RESTART_ADVICE"]

#: With on_worker_death="restart": a sample that kills this many workers raises WorkerDied; a
#: worker that dies this many times without loading anything is failing at start-up.
MAX_KILLS_PER_SAMPLE = 3

_SIGBUS = -7

#: The advice of a WorkerDied under on_worker_death="raise": Loader's own option. A front end
#: without that option (compat.torch) replaces it with advice of its own.
RESTART_ADVICE = "pass on_worker_death='restart' to recompute the lost batch instead"


class Verdict(NamedTuple):
    """``fatal``: abandon the running epoch's lost batches (else re-queue them); ``error``: to
    raise at the loader's next check; ``warning``: to log when the epoch goes on."""

    fatal: bool
    error: WorkerDied | None
    warning: str | None


class DeathPolicy:
    """``on_worker_death`` ("raise" or "restart") and the kill counts of the running epoch."""

    def __init__(self, on_worker_death: str) -> None:
        self.on_worker_death = on_worker_death
        self.kills: dict[int | None, int] = {}  # sample index -> workers it killed
        self.idle_deaths: dict[int, int] = {}  # worker -> deaths without loading anything

    def new_epoch(self) -> None:
        self.kills.clear()
        self.idle_deaths.clear()

    def judge(self, deaths: list[Death], lost: dict[int, list[int | None]],
              requeued: bool) -> Verdict:
        """``lost[worker]``: the sample indices it was loading (empty: it died idle or on
        another loader's batch); ``requeued``: whether re-queueing is possible at all."""
        reports = []
        any_lost = False
        startup_failure = None
        for d in deaths:
            mine = lost.get(d.worker, [])
            name = exit_code_name(d.exitcode)
            hint = ""
            if d.exitcode == _SIGBUS:
                hint = (
                    " (SIGBUS: shared memory exhausted: free memory or enlarge /dev/shm, "
                    "or reduce batch_size/prefetch)"
                )
            where = f" while loading sample index {mine[0]}" if mine else " while idle"
            reports.append(f"worker {d.worker} (pid {d.pid}) died with {name}{where}{hint}")
            for index in mine:
                self.kills[index] = self.kills.get(index, 0) + 1
            any_lost = any_lost or bool(mine)
            if d.exitcode == EXIT_UNGUARDED_MAIN and not d.started:  # NOTE [unguarded main]
                startup_failure = unguarded_main_text()
            elif not mine and not d.started:  # a worker that dies idle after it started is not
                n_idle = self.idle_deaths[d.worker] = self.idle_deaths.get(d.worker, 0) + 1
                if n_idle >= MAX_KILLS_PER_SAMPLE:
                    # Dying without ever holding a batch, again and again: a start-up failure
                    # (e.g. an import error under spawn). Restarting forever would hang.
                    startup_failure = (
                        f"worker {d.worker} died {n_idle} times without loading anything (last: "
                        f"pid {d.pid}, {name}); it fails while starting: see its stderr above"
                    )
        worst = max(self.kills.items(), key=lambda kv: kv[1], default=(None, 0))
        fatal = any_lost and (
            self.on_worker_death == "raise" or worst[1] >= MAX_KILLS_PER_SAMPLE
        )
        report = "; ".join(reports)
        verdict = self._verdict(report, fatal, startup_failure, requeued, worst)
        if verdict.error is not None:  # for front ends that word it their way (compat.torch)
            verdict.error.fastload_deaths = tuple((d.pid, d.exitcode) for d in deaths)
        return verdict

    def _verdict(self, report: str, fatal: bool, startup_failure: str | None, requeued: bool,
                 worst: tuple[int | None, int]) -> Verdict:
        if not fatal:
            if startup_failure is not None:
                return Verdict(False, WorkerDied(startup_failure), None)
            return Verdict(False, None, f"{report}; restarted it"
                           + (" and re-queued its batch" if requeued else ""))
        if self.on_worker_death == "restart":
            return Verdict(True, WorkerDied(
                f"{report}. Sample index {worst[0]} killed a worker {worst[1]} times; giving up "
                "on this epoch (the worker was restarted)."
            ), None)
        return Verdict(True, WorkerDied(
            f"{report}. It was restarted; this epoch was stopped, the next one runs normally "
            f"({RESTART_ADVICE})."
        ), None)
