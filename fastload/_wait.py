"""The bounds of every wait in the parent, and one deadline helper for waits on a batch.

NOTE [bounded waits]
No wait in the parent lasts longer than ``POLL_INTERVAL_S``: between two waits it checks the
workers' sentinels, the user's ``timeout`` and pending signals, so Ctrl+C is handled and a dead
worker becomes a clear error within that bound, and a frozen worker becomes a
``LoaderTimeoutError`` at the deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .errors import LoaderTimeoutError

__all__ = ["POLL_INTERVAL_S", "Deadline"]

#: The parent's longest uninterrupted wait (see NOTE [bounded waits]).
POLL_INTERVAL_S = 0.1


class Deadline:
    """The two limits of one wait for a batch: the user's ``timeout`` (LoaderTimeoutError) and
    the ``on_stall`` hook (called once, the wait goes on). Monotonic times; inf: no limit.

    The stall clock may start later than the deadline's (``stall_now=False``, then
    :meth:`start_stall`): a slow process start is not a slow dataset."""

    __slots__ = ("timeout", "at", "stall", "stall_at")

    def __init__(
        self,
        timeout: float | None,
        stall: tuple[float, Callable[[str], None]] | None,
        stall_now: bool = True,
        elapsed: float = 0.0,
    ) -> None:
        now = time.monotonic() - elapsed  # ``elapsed``: seconds already waited
        self.timeout = timeout
        self.at = math.inf if timeout is None else now + timeout
        self.stall = stall
        self.stall_at = math.inf
        if stall_now:
            self.start_stall()

    def start_stall(self) -> None:
        if self.stall is not None and self.stall_at == math.inf:
            self.stall_at = time.monotonic() + self.stall[0]

    def step(self) -> float:
        """Seconds for the next wait: at most POLL_INTERVAL_S, never past either limit."""
        now = time.monotonic()
        return max(min(POLL_INTERVAL_S, self.at - now, self.stall_at - now), 0.0)

    def check(self, why: Callable[[], str]) -> None:
        """Raise past the deadline; past the stall time, report ``why()`` once."""
        now = time.monotonic()
        if now >= self.at:
            raise LoaderTimeoutError(f"no batch within timeout={self.timeout}s: {why()}")
        if now >= self.stall_at:
            assert self.stall is not None
            report = self.stall[1]
            self.stall, self.stall_at = None, math.inf  # reported: never again for this wait
            report(why())
