"""The passes over a loader: which are live, where each is, and the resume state derived from
them in one place.

Pure logic (no processes, no shared memory, no ring), tested on its own like ``_plan.py``.

NOTE [several passes]
Every ``iter(loader)`` is a pass over its own epoch (0, 1, ... in the order they were started),
and several may be live at once (``zip(dl, dl)``, one loader for training and validation), as
with torch's DataLoader: each has its own position (the batches it consumed), its own skip
count (``max_skips`` is per pass) and its own tasks in the ring, all served by the same
workers. A pass ends in one of three ways:

- *finished*: it delivered its last batch;
- *stopped*: it was left unfinished: its iterator was dropped (``break``, garbage-collected),
  or a ``next()`` ended with an error that is not its samples' (Ctrl+C or any exception raised
  by a signal handler, a timeout, a death in "raise" mode, a closed loader); the rest of its
  epoch is dropped, and the pass is remembered as ``left`` (its epoch and position);
- *superseded*: another call ended it (``load_state_dict``, or a new ``iter()`` over a plain
  iterable, whose workers iterate one pass at a time); its iterator says why.

A batch whose own samples raised is *consumed* before its error is raised (NOTE [errors do not
end the epoch] in _engine.py): the pass goes on.

NOTE [resume state]
``state()`` is the one place the resume point comes from: the point loaded by
``load_state_dict`` while no pass has started since; else the oldest live pass's position; else
the newest pass if it was stopped unfinished (``for ...: break``, or an interrupt inside
``next()``: a checkpoint saved on interruption resumes at the batch the interrupt lost, never
at the next epoch); else the start of the next epoch.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

__all__ = ["Pass", "Passes"]


class Pass:
    """One ``iter(loader)``: its epoch, its id (an epoch number can come again after
    ``load_state_dict``; a pass id cannot), the batches it consumed, what ``on_error="skip"``
    replaced in it, and a death's error that cost it a batch (raised at its next step)."""

    __slots__ = ("epoch", "token", "position", "skips", "lost", "total", "batch")

    def __init__(self, epoch: int, token: int, position: int) -> None:
        self.epoch = epoch
        self.token = token
        self.position = position
        #: its batches, once known (the engine asks the plan at the first next(): a batch
        #: plan is never asked before; a plain iterable's count is never fixed)
        self.total: int | None = None
        #: the plan's number of the batch delivered last (in_order=False: not position - 1)
        self.batch = 0
        self.skips: list[tuple[Any, str]] = []
        self.lost: BaseException | None = None

    def __repr__(self) -> str:
        return f"Pass(epoch={self.epoch}, token={self.token}, position={self.position})"


class Passes:
    """Every pass of one loader (NOTE [several passes]). Used by the loader's own thread, except
    ``dropped``, which an iterator's finalizer may call from any thread: it only notes."""

    def __init__(self) -> None:
        self.live: dict[int, Pass] = {}  # epoch -> its live pass, oldest first
        self.next_epoch = 0
        self.resume: tuple[int, int] | None = None  # loaded, no pass started since
        self.left: tuple[int, int] | None = None  # the newest pass stopped unfinished
        self.superseded: dict[int, str] = {}  # pass id -> why another call ended it
        self._ids = itertools.count()
        #: (epoch, pass id) of iterators dropped (any thread) since ``take_dropped`` last ran
        self.dropped_queue: deque[tuple[int, int]] = deque()

    # -- starting and looking up -------------------------------------------------------------
    def start(self) -> Pass:
        """A new pass over the next epoch (at the loaded position if it is the resumed one)."""
        e = self.next_epoch
        self.next_epoch += 1
        position = self.resume[1] if self.resume is not None and self.resume[0] == e else 0
        self.resume = None
        p = self.live[e] = Pass(e, next(self._ids), position)
        return p

    def get(self, epoch: int, token: int) -> Pass:
        """The live pass ``token``; StopIteration if it ended (finished, or stopped with its
        error already raised), RuntimeError saying why if another call superseded it."""
        p = self.live.get(epoch)
        if p is not None and p.token == token:
            return p
        why = self.superseded.get(token)
        if why is None:
            raise StopIteration
        raise RuntimeError(f"this epoch's iterator was superseded: {why}")

    def is_live(self, epoch: int) -> bool:
        return epoch in self.live

    @property
    def newest(self) -> int | None:
        """The newest live pass's epoch (None: none is live)."""
        return next(reversed(self.live), None)

    # -- ending ------------------------------------------------------------------------------
    def finish(self, p: Pass) -> None:
        """``p`` delivered its last batch."""
        if self.live.get(p.epoch) is p:
            del self.live[p.epoch]

    def stop(self, p: Pass, why: str | None = None) -> bool:
        """``p`` ends unfinished (NOTE [several passes]); ``why``: another call superseded it.
        Whether it was live (the caller then drops its tasks)."""
        if self.live.get(p.epoch) is not p:
            return False
        del self.live[p.epoch]
        self.left = (p.epoch, p.position)
        if why is not None:
            self.superseded[p.token] = why
        return True

    def dropped(self, epoch: int, token: int) -> None:
        """An iterator was dropped (any thread: only noted; ``take_dropped`` acts on it)."""
        self.dropped_queue.append((epoch, token))

    def take_dropped(self) -> list[Pass]:
        """Stop the live passes whose iterators were dropped; the passes stopped."""
        out = []
        while self.dropped_queue:
            e, token = self.dropped_queue.popleft()
            p = self.live.get(e)
            if p is not None and p.token == token and self.stop(p):
                out.append(p)
        return out

    def supersede_all(self, why: str) -> list[Pass]:
        """Stop every live pass, each iterator saying ``why``; the passes stopped."""
        out = list(self.live.values())
        for p in out:
            self.stop(p, why)
        return out

    # -- resume ------------------------------------------------------------------------------
    def state(self) -> tuple[int, int]:
        """(epoch, position) to resume from (NOTE [resume state]); the caller stops the
        dropped passes first (``take_dropped``: it also drops their tasks)."""
        if self.resume is not None:
            return self.resume
        if self.live:
            p = next(iter(self.live.values()))
            return p.epoch, p.position
        if self.left is not None and self.left[0] == self.next_epoch - 1:
            return self.left
        return self.next_epoch, 0

    def restore(self, epoch: int, position: int) -> list[Pass]:
        """Go on from (epoch, position) (``load_state_dict``): every live pass is superseded;
        the passes stopped."""
        out = self.supersede_all("load_state_dict() was called")
        self.next_epoch = epoch
        self.resume = (epoch, position)
        self.left = None
        return out
