"""What went wrong in a loader's workers and samples, and when the loader raises it.

NOTE [pool callbacks]
workers_died / workers_restarted run in whichever thread checks the pool (another loader's,
maybe): they only record (``pending``, a pass's ``lost``), give back pieces (a CAS in C each)
and send attach messages; the loader raises what they found, in its own thread (``raise_for``).
A batch the loader waits on whose pieces were CLOSED (abandoned after its worker died) stays
QUEUED: the wait's next check of the pool raises the verdict (the callback records it before
the pool's lock is released). A batch prefetched for a pass not yet started is always
re-queued, whatever ``on_worker_death`` says: the loader judges the deaths that happened
before an ``iter()`` at that ``iter()``, while the new pass is not yet live.

NOTE [skip accounting]
``on_error="skip"`` replacements are counted per pass (``Pass.skips``: ``max_skips`` applies to
each pass on its own, so ``zip(dl, dl)`` or a validation pass on the same loader count apart)
and per loader (``skipped``, the latest 1,000 for ``stats()``, and ``skipped_total``).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from . import _messages as m
from ._deaths import DeathPolicy
from ._mailbox import Mailbox
from ._passes import Pass, Passes
from ._scheduler import Scheduler

__all__ = ["Faults"]

log = logging.getLogger("fastload")
_LOGGED_SKIPS = 10  # on_error="skip": replacements logged one by one, per loader


class Faults:
    """Deaths (the pool's callbacks and the restart policy) and skipped samples of one
    loader."""

    def __init__(self, cfg: Any, passes: Passes, sched: Scheduler) -> None:
        self.cfg, self.passes, self.sched = cfg, passes, sched
        self.policy = DeathPolicy(cfg.on_worker_death)
        self.mail: Mailbox | None = None
        self.bell: Any = None  # the pool's bell (wakes workers for rows given back)
        self.pending: deque[BaseException] = deque()  # NOTE [pool callbacks]
        self.skipped: deque[dict[str, Any]] = deque(maxlen=1000)  # NOTE [skipped samples]
        self.skipped_total = 0

    def raise_for(self, p: Pass | None) -> None:
        """Raise what the callbacks recorded that concerns pass ``p``: a death that cost it a
        batch, or any other error (one at a time: the rest concern the same deaths)."""
        if p is not None and p.lost is not None:
            lost, p.lost = p.lost, None
            raise lost
        if self.pending:
            exc = self.pending.popleft()
            self.pending.clear()
            raise exc

    def workers_died(self, deaths: list[m.Death]) -> None:
        """The pool found dead workers (called before they are restarted, in whichever thread
        checked the pool: NOTE [pool callbacks]): the policy (_deaths.py) judges; the lost
        batches are re-queued, or abandoned if their pass ends (batches prefetched for a pass
        not yet started are always re-queued)."""
        assert self.mail is not None
        try:
            self.mail.collect()
        except BaseException as e:  # an init or probe error: raise it rather than a death
            self.pending.append(e)
            return
        lost: dict[int, list[int | None]] = {}
        held: list[tuple[int, int, int]] = []  # (worker, slot, epoch)
        for d in deaths:
            if self.sched.slots is not None:
                for slot, epoch, index in self.sched.slots.claimed_by(d.worker):
                    lost.setdefault(d.worker, []).append(index)
                    held.append((d.worker, slot, epoch))
            else:
                lost[d.worker] = self.mail.probe_lost(d.worker)  # the first sample?
        verdict = self.policy.judge(deaths, lost, bool(held))
        ended: set[int] = set()  # live passes whose batch is abandoned: each raises the error
        if self.sched.slots is not None:
            ring = self.sched.slots.ring
            doomed = set()  # (worker, slot) whose pieces are not loaded again
            for i, s, epoch in held:
                if verdict.fatal and self.passes.is_live(epoch):
                    ended.add(epoch)
                    doomed.add((i, s))
            # NOTE [pieces] (csrc/fl_ring.c): one path for every batch. Its pieces go back FREE
            # for other workers (a batch taken whole is loaded again from scratch), or CLOSED if
            # the batch is abandoned; pieces given to it up front, never begun, go back FREE.
            for d in deaths:
                for s in range(self.sched.slots.nslots):
                    ring.give_back(s, d.worker, (d.worker, s) not in doomed)
            self.bell.ring(True)
        if verdict.error is not None and ended:
            for epoch in ended:
                if (p := self.passes.live.get(epoch)) is not None:
                    p.lost = verdict.error
        elif verdict.error is not None and verdict.fatal and held:
            # every batch it cost was prefetched for a pass not yet started: re-queued, and
            # that pass loses nothing (NOTE [pool callbacks])
            log.warning("%s; restarted it and re-queued its batch of the next epoch",
                        str(verdict.error).split(". ")[0])
        elif verdict.error is not None:
            self.pending.append(verdict.error)
        elif verdict.warning is not None:
            log.warning("%s", verdict.warning)

    def note_skips(self, p: Pass, records: list[tuple[Any, ...]]) -> None:
        """NOTE [skipped samples] (_fill.py): count, log the first, raise past max_skips (of
        pass ``p``: each pass counts its own)."""
        epoch = p.epoch
        for index, kind, text, instead in records:
            if self.skipped_total < _LOGGED_SKIPS:
                last = self.skipped_total == _LOGGED_SKIPS - 1
                log.warning("sample %s raised %s: %s; sample %s was loaded in its place "
                            "(on_error='skip')%s", index, kind, text, instead,
                            "; further skips are only counted in stats()['skipped']"
                            if last else "")
            self.skipped_total += 1
            self.skipped.append({"epoch": epoch, "index": index, "error": f"{kind}: {text}",
                                 "replaced_by": instead})
            p.skips.append((index, f"{kind}: {text}"))
        limit = self.cfg.max_skips
        if limit is not None and len(p.skips) > limit:
            from .errors import SkipLimitError

            got = p.skips
            kinds: dict[str, int] = {}
            for _, text in got:
                kinds[text.split(":", 1)[0]] = kinds.get(text.split(":", 1)[0], 0) + 1
            listed = "\n  ".join(f"sample {i}: {t}" for i, t in got[:10])
            more = f"\n  ... and {len(got) - 10} more" if len(got) > 10 else ""
            by_kind = ", ".join(f"{k} x{c}" for k, c in sorted(kinds.items()))
            raise SkipLimitError(
                f"{len(got)} samples of epoch {epoch} raised, more than max_skips={limit} "
                f"(on_error='skip'), so the epoch ends here ({by_kind}):\n  {listed}{more}\n"
                "Fix the dataset (or raise max_skips); stats()['skipped'] lists them all",
                list(got))

