"""A randomized soak: random mixes of what users and failures do to loaders, every delivered
batch checked against num_workers=0, no hang past the timeouts, nothing left behind (the
leak check of conftest.py runs after it: processes, fds, memfds).

Seeded (``FASTLOAD_SOAK_SEED``, fixed by default) and bounded in time
(``FASTLOAD_SOAK_SECONDS``, 45 s by default; CI runs it for 180 s). It prints its figures:
actions run, faults injected, batches checked.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest

import fastload
from helpers.soak import KINDS, SoakData, fingerprint, loader_kwargs

SEED = int(os.environ.get("FASTLOAD_SOAK_SEED", "20261203"))
BUDGET_S = float(os.environ.get("FASTLOAD_SOAK_SECONDS", "45"))
TIMEOUT_S = 20.0  # per batch: a hang is a LoaderTimeoutError, and fails the soak

_refs: dict[tuple[Any, ...], list[Any]] = {}


def reference(kind: str, n: int, bs: int, seed: int, epoch: int) -> list[Any]:
    """The batches of ``epoch`` as num_workers=0 loads them (epoch orders depend on (seed,
    epoch) only)."""
    key = (kind, n, bs, seed, epoch)
    if key not in _refs:
        with fastload.Loader(SoakData(n, kind), bs, shuffle=True, seed=seed, num_workers=0,
                             **loader_kwargs(kind)) as ref:
            ref.load_state_dict({**ref.state_dict(), "epoch": epoch})
            _refs[key] = [fingerprint(kind, b) for b in ref]
    return _refs[key]


class Case:
    """One loader under test and what the soak knows of it."""

    def __init__(self, rng: random.Random, stats: Counter[str], pool: Any = None) -> None:
        self.rng, self.stats = rng, stats
        self.shared = pool is not None  # another loader's faults reach this one too
        self.kills = 0  # SIGKILLs not yet seen as a WorkerDied (a death may surface later: a
        # worker killed while loading the next epoch's batch is reported in that epoch)
        # a short timeout lets a stopped worker's batch become a LoaderTimeoutError quickly
        self.timeout = TIMEOUT_S if self.shared else rng.choice([5.0, TIMEOUT_S])
        self.kind = rng.choice(KINDS)
        self.n, self.bs = rng.randint(1, 60), rng.choice([1, 3, 4, 8])
        self.seed = rng.randrange(2**32)
        self.mode = rng.choice(["raise", "restart"])
        if pool is None:
            self.start = rng.choices(["fork", "forkserver", "spawn"], [6, 2, 1])[0]
            kw: dict[str, Any] = dict(num_workers=rng.randint(1, 3), start_method=self.start)
        else:
            kw = dict(pool=pool)
        self.loader = fastload.Loader(
            SoakData(self.n, self.kind), self.bs, shuffle=True, seed=self.seed,
            timeout=self.timeout, on_worker_death=self.mode, **kw, **loader_kwargs(self.kind))
        stats["loaders"] += 1

    def ref(self, epoch: int) -> list[Any]:
        return reference(self.kind, self.n, self.bs, self.seed, epoch)

    def check(self, epoch: int, b: int, batch: Any) -> None:
        assert fingerprint(self.kind, batch) == self.ref(epoch)[b], (self.kind, epoch, b)
        self.stats["batches checked"] += 1
        if self.kind == "shared" and self.loader.stats()["shared_rows"]:
            self.stats["batches checked, shared rows"] += 1

    def pids(self) -> list[int]:
        procs = self.loader._engine.pool.procs if self.loader._engine.pool else []
        return [p.pid for p in procs if p is not None and p.pid is not None]

    def fault(self, sig: int) -> int | None:
        pids = self.pids()
        if not pids:
            return None
        pid = self.rng.choice(pids)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return None
        self.stats[f"faults: {signal.Signals(sig).name}"] += 1
        self.kills += sig == signal.SIGKILL
        return pid

    # -- actions -----------------------------------------------------------------------------
    def epoch(self, stop_after: int | None = None, fault: int | None = None) -> None:
        it = iter(self.loader)
        e, faulted, stopped, got = it.epoch, False, None, 0
        self.stats["actions: epoch" if stop_after is None else "actions: break"] += 1
        try:
            for b, batch in enumerate(it):
                self.check(e, b, batch)
                got += 1
                if fault is not None and not faulted:
                    faulted = True
                    pid = self.fault(fault)
                    stopped = pid if fault == signal.SIGSTOP else None
                if stop_after is not None and got >= stop_after:
                    break
            else:
                assert got == len(self.ref(e)), (got, len(self.ref(e)))
        except fastload.WorkerDied:
            # raise mode: the death ends the epoch; restart mode: only a sample that kills
            # three workers does, which these datasets never are
            assert (self.kills or self.shared) and self.mode == "raise", (self.mode, faulted)
            self.kills = 0
            self.stats["expected errors"] += 1
        except fastload.LoaderTimeoutError as e:
            if stopped is None:  # unexpected: have every worker print where it is
                for pid in self.pids():
                    os.kill(pid, signal.SIGUSR1)
                time.sleep(1)
                with open(f"/proc/{self.pids()[0]}/status") as f:
                    print(f.read()[:300], e)
            assert stopped is not None  # only a stopped worker may make a batch late
            self.stats["expected errors"] += 1
        finally:
            if stopped is not None:
                try:
                    os.kill(stopped, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def reiter(self) -> None:
        # a second pass while the first is live (NOTE [several passes]): both complete, each
        # its own epoch's batches in order, the first going on where it was left
        first = iter(self.loader)
        e, got = first.epoch, 0
        if len(self.ref(e)) > 1:
            self.check(e, 0, next(first))
            got = 1
        self.stats["actions: iter() again"] += 1
        self.epoch()
        for b, batch in enumerate(first, got):
            self.check(e, b, batch)
            got += 1
        assert got == len(self.ref(e)), (got, len(self.ref(e)))

    def resume(self) -> None:
        it = iter(self.loader)
        e, k = it.epoch, self.rng.randint(0, max(0, len(self.ref(it.epoch)) - 1))
        for b in range(k):
            self.check(e, b, next(it))
        state = self.loader.state_dict()
        self.stats["actions: load_state_dict"] += 1
        with fastload.Loader(SoakData(self.n, self.kind), self.bs, shuffle=True, seed=self.seed,
                             num_workers=self.rng.randint(0, 2), timeout=TIMEOUT_S,
                             start_method="fork", **loader_kwargs(self.kind)) as again:
            again.load_state_dict(state)
            for b, batch in enumerate(again, k):
                self.check(e, b, batch)

    def close_holding(self) -> None:
        it = iter(self.loader)
        e, held = it.epoch, []
        for b, batch in enumerate(it):
            held.append((b, batch))
            if len(held) == 2:
                break
        self.loader.close()
        self.stats["actions: close holding batches"] += 1
        for b, batch in held:  # still valid after close
            self.check(e, b, batch)

    def run(self, steps: int) -> None:
        try:
            for _ in range(steps):
                try:
                    self.act()
                except fastload.WorkerDied:
                    # a death in raise mode may end any action's epoch: one this loader caused
                    # earlier, or (on a shared pool) one the other thread's loader caused
                    assert (self.kills or self.shared) and self.mode == "raise", self.mode
                    self.kills = 0
                    self.stats["expected errors"] += 1
            if self.rng.random() < 0.3:
                try:
                    self.close_holding()
                except fastload.WorkerDied:
                    assert (self.kills or self.shared) and self.mode == "raise", self.mode
                    self.stats["expected errors"] += 1
        finally:
            self.loader.close()

    def act(self) -> None:
        action = self.rng.choices(
            ["epoch", "break", "kill", "stop", "reiter", "resume"], [4, 2, 2, 1, 1, 2])[0]
        if action == "epoch":
            self.epoch()
        elif action == "break":
            self.epoch(stop_after=self.rng.randint(1, 3))
        elif action == "kill":
            self.epoch(fault=signal.SIGKILL)
        elif action == "stop" and self.timeout < TIMEOUT_S:
            self.epoch(fault=signal.SIGSTOP)
        elif action == "reiter":
            self.reiter()
        elif action == "resume":
            self.resume()


def _threads(rng: random.Random, stats: Counter[str]) -> None:
    """Loaders of one Pool in two threads, a worker killed now and then."""
    with fastload.Pool(rng.randint(1, 3), start_method="fork") as pool:
        cases = [Case(random.Random(rng.randrange(2**32)), stats, pool) for _ in range(2)]
        errors: list[BaseException] = []

        def drive(case: Case) -> None:
            try:
                case.run(case.rng.randint(1, 4))
            except BaseException as e:  # reported in the main thread
                errors.append(e)

        ts = [threading.Thread(target=drive, args=(c,)) for c in cases]
        stats["actions: two threads on one pool"] += 1
        for t in ts:
            t.start()
        for t in ts:
            t.join(TIMEOUT_S * 10)
            assert not t.is_alive(), "a loader thread hangs"
        if errors:
            raise errors[0]


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.timeout(int(BUDGET_S) + 300)
def test_soak():
    rng = random.Random(SEED)
    stats: Counter[str] = Counter()
    t0 = time.monotonic()
    while time.monotonic() - t0 < BUDGET_S:
        if rng.random() < 0.25:
            _threads(rng, stats)
        else:
            Case(rng, stats).run(rng.randint(1, 5))
    figures = ", ".join(f"{k} {v}" for k, v in sorted(stats.items()))
    print(f"\nsoak (seed {SEED}, {time.monotonic() - t0:.0f} s): {figures}")
    assert stats["batches checked"] > 0
