"""The epoch plan: which samples form which batch of which epoch, and where a resume starts.

Pure logic (no processes, no shared memory): an epoch's order depends only on (seed, epoch,
rank, world size), and for an epoch resumed on another world size on the world sizes before it
(NOTE [resume across ranks]), never on the number of workers or on timing.

NOTE [rank sharding]
Every rank gets the same number of samples (distributed training hangs otherwise): the epoch's
global order is cut (drop_last) or padded by wrapping around to a multiple of world_size, then
rank r takes positions r, r + world, ... Padded positions are duplicates; ``mask`` says which
samples are real (``return_mask=True``).

NOTE [resume across ranks]
Data-parallel ranks consume batches in lock step (equal batch counts), so one rank's state is
every rank's: rank r at position p means the ranks together consumed the first
min(p * batch_size, n_local) * world positions of the epoch's padded global order (rank r takes
r, r + world, ...: what p batches take is a prefix), i.e. every sample before that point.
``state()`` records the world size, the batch size and the epoch's history of world changes;
``restore()`` on the same world size goes on with the very batches of an uninterrupted run (the
saving rank does not matter), and on another world size it splits the rest of the epoch (the
global order's unconsumed part, in order) across the new ranks as NOTE [rank sharding] does the
whole epoch: padded by wrapping around (masked) or cut with drop_last, equal batch counts, no
sample lost or repeated. Batches keep their numbers: the resumed epoch goes on at batch p and
has p + (the rest's batches) of them (``len(loader)``), as on the same world size, since the
training loops that restore a checkpoint (Lightning's) count the batches already done and stop
at ``len(loader)``. Only that epoch changes: the next epochs are the new world size's
usual plan. One state (rank 0's, as Lightning and ``torch.distributed.checkpoint`` save it) is
thus enough for every rank. A further world change in the same epoch applies to the rest: the
history lists each (world size, the batch number it stopped at) step. ``StreamPlan``
(fastload/_stream.py) shares this and only cuts the shares differently (contiguous ranges).

NOTE [batch plans]
Front ends with their own samplers (fastload.compat) pass ``batch_plan(epoch)`` -> batches of
indices. It is called once per epoch, in epoch order, and never before that epoch has started
(the queue runs at most into the epoch being iterated), so a sampler may depend on what happened
before (``DistributedSampler.set_epoch``); ``batch_size`` is then the largest batch it may return.
A plan may also have (fastload.TokenBudget has all four; each is used only where present):
``bind(batch_size=, seed=, n=)``, called once when the Loader is built (the row cap, the Loader's
seed, the dataset's length); ``num_batches(epoch)``, what ``len(loader)`` says for that epoch
(a plan without it is not asked ahead and ``len`` is ``ceil(len(dataset) / batch_size)``); and
``state_dict()`` / ``load_state_dict(state)``, which make the Loader's resume work: its state
carries the plan's, and a restored Loader asks the epoch again and goes on at its position, so
the plan must give the same batches for the same epoch (without them, resuming is refused).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["EpochPlan", "STATE_FORMAT"]

STATE_FORMAT = "fastload.Loader/1"

_Array = np.ndarray[Any, Any]


class EpochPlan:
    """Orders, masks and batches of every epoch (cached for the two epochs in use)."""

    #: A plain iterable's plan (fastload/_iterable.py): batches targeted at one worker, whose
    #: number is known only once every worker's iterator has ended.
    iterable = False
    #: Whether some batches must go to one worker (``target``): a plain iterable's.
    targeted = False
    #: Epochs whose orders and batches are kept whatever the epoch asked for (the live passes:
    #: a batch plan's sampler cannot be asked twice for one epoch; NOTE [several passes]).
    keep: Any = ()
    #: assign="round_robin": batch b of an epoch goes to worker b % round_robin (0: any worker)
    round_robin = 0

    def __init__(
        self,
        n: int,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        shard: tuple[int, int] = (0, 1),
        batch_plan: Callable[[int], Iterable[Sequence[int]]] | None = None,
    ) -> None:
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank, self.world = shard
        self.batch_plan = batch_plan
        bind = getattr(batch_plan, "bind", None)
        if bind is not None:  # NOTE [batch plans]
            bind(batch_size=batch_size, seed=seed, n=n)
        w = self.world
        #: samples per epoch on this rank (NOTE [rank sharding])
        self.n_local = (n // w if drop_last else math.ceil(n / w)) if n else 0
        nl = self.n_local
        #: batches per epoch (without a batch plan)
        self.nbatches = nl // batch_size if drop_last else math.ceil(nl / batch_size)
        self._orders: dict[int, tuple[_Array, _Array]] = {}  # epoch -> (order, valid)
        self._plans: dict[int, list[_Array]] = {}
        # epoch -> (its samples, in order, that no rank consumed before the world size changed,
        # the history of [world size, batch it stopped at] that left them): NOTE [resume across
        # ranks]; this rank's batch b of that epoch is batch b - skip of its share of the rest
        self.rest: dict[int, tuple[_Array, list[list[int]]]] = {}

    @property
    def rows(self) -> int:
        """The most samples a batch can hold: the rows a slot needs (batch_size=10**9 on 100
        samples needs 100 rows, not 10**9; a batch plan's batches can be up to batch_size)."""
        if self.batch_plan is not None:
            return self.batch_size
        return max(1, min(self.batch_size, self.n_local))

    @property
    def ahead(self) -> bool:
        """Whether the queue may plan the next epoch before it starts (not with a batch plan)."""
        return self.batch_plan is None

    def order(self, epoch: int) -> _Array:
        """This rank's sample indices of ``epoch``, in order (int64)."""
        return self._order(epoch)[0]

    def _global(self, epoch: int, seed: int | None = None) -> _Array:
        """The epoch's global order of samples (with ``seed``, default this plan's), before
        the ranks take their shares."""
        if not self.shuffle:
            return np.arange(self.n, dtype=np.int64)
        ss = np.random.SeedSequence([self.seed if seed is None else seed, epoch])
        o = np.random.Generator(np.random.PCG64(ss)).permutation(self.n)
        return o.astype(np.int64, copy=False)

    def _share(self, n: int, world: int) -> int:
        """Samples per rank when ``world`` ranks split ``n`` (NOTE [rank sharding])."""
        return (n // world if self.drop_last else math.ceil(n / world)) if n else 0

    def _split(self, samples: _Array) -> tuple[_Array, _Array]:
        """This rank's share of ``samples`` (in order), and which of it is real (NOTE [rank
        sharding]): positions rank, rank + world, ... of ``samples`` padded by wrapping around
        or cut to a multiple of the world size."""
        n, w = len(samples), self.world
        if w == 1:  # one rank: the order itself (no copy: 2-4 ms of a 200,000 first batch)
            return samples, np.ones(n, np.bool_)
        idx = np.arange(self._share(n, w), dtype=np.int64) * w + self.rank
        return (samples[idx % n] if n else samples[:0]), idx < n

    def _gone(self, n: int, world: int, position: int) -> _Array:
        """Which of ``n`` samples in order ``world`` ranks consumed with ``position`` batches
        each (NOTE [resume across ranks]): a prefix, as the shares interleave."""
        taken = min(position * self.batch_size, self._share(n, world)) * world
        gone: _Array = np.arange(n) < taken
        return gone

    def _order(self, epoch: int) -> tuple[_Array, _Array]:
        got = self._orders.get(epoch)
        if got is None:
            rest = self.rest.get(epoch)
            got = self._split(rest[0] if rest is not None else self._global(epoch))
            for old in [e for e in self._orders if e < epoch - 1 and e not in self.keep]:
                del self._orders[old]
            self._orders[epoch] = got
        return got

    def prepare(self, epoch: int) -> None:
        """Compute ``epoch``'s order now (shuffling 1e6 samples takes milliseconds: done ahead,
        while the queue is full, it does not stall the workers)."""
        if self.batch_plan is None and self.shuffle and epoch not in self._orders:
            self._order(epoch)

    def mask(self, epoch: int, b: int) -> _Array:
        """Which samples of batch ``b`` are real (False: a padded duplicate)."""
        if self.batch_plan is not None:
            return np.ones(len(self.plan(epoch)[b]), np.bool_)
        mask: _Array = self._order(epoch)[1][self._rows_of(epoch, b)].copy()
        return mask

    def skip(self, epoch: int) -> int:
        """Batches of ``epoch`` consumed before the world size changed (NOTE [resume across
        ranks]); 0 for an epoch that did not change."""
        rest = self.rest.get(epoch)
        return rest[1][-1][1] if rest is not None else 0

    def _rows_of(self, epoch: int, b: int) -> slice:
        """Where batch ``b`` of ``epoch`` is in this rank's order."""
        k = b - self.skip(epoch)
        if k < 0:
            raise IndexError(f"batch {b} of epoch {epoch} was consumed before the world size "
                             "changed (NOTE [resume across ranks])")
        return slice(k * self.batch_size, (k + 1) * self.batch_size)

    def plan(self, epoch: int) -> list[_Array]:
        """NOTE [batch plans]: the batches ``batch_plan(epoch)`` gave, checked."""
        p = self._plans.get(epoch)
        if p is None:
            assert self.batch_plan is not None
            p = []
            for k, batch in enumerate(self.batch_plan(epoch)):
                a = np.asarray(batch, dtype=np.int64).reshape(-1)
                if not 0 < len(a) <= self.batch_size:
                    raise ValueError(
                        f"batch {k} of epoch {epoch} has {len(a)} indices; expected 1 to "
                        f"{self.batch_size}"
                    )
                if a.min() < 0 or a.max() >= self.n:
                    bad = a[(a < 0) | (a >= self.n)][0]
                    raise IndexError(f"sampler index {bad} out of range for {self.n} samples")
                p.append(a)
            for old in [e for e in self._plans if e < epoch - 1 and e not in self.keep]:
                del self._plans[old]
            self._plans[epoch] = p
        return p

    def nbatches_of(self, epoch: int) -> int:
        if self.batch_plan is not None:
            return len(self.plan(epoch))
        if epoch not in self.rest:
            return self.nbatches
        return self.skip(epoch) + self._batches(len(self._order(epoch)[0]))

    def _batches(self, samples: int) -> int:
        """Batches of a rank's ``samples``."""
        bs = self.batch_size
        return samples // bs if self.drop_last else math.ceil(samples / bs)

    def user_len(self, epoch: int) -> int:
        """What len(loader) says for ``epoch``."""
        return self.nbatches_of(epoch)

    def len_of(self, epoch: int) -> int:
        """What len(loader) says for ``epoch`` before it is iterated: a batch plan is not asked
        ahead unless it counts its batches (``num_batches``, NOTE [batch plans])."""
        if self.batch_plan is None:
            return self.user_len(epoch)
        count = getattr(self.batch_plan, "num_batches", None)
        return int(count(epoch)) if count is not None else self.nbatches

    def target(self, epoch: int, b: int) -> int | None:
        """The worker that must load batch ``b`` (None: any worker)."""
        return b % self.round_robin if self.round_robin else None

    def probe_tasks(self, epoch: int, b: int, n: int, rows: bool = False
                    ) -> list[tuple[int, int]]:
        """NOTE [first samples] (_startup.py): (worker, sample) to load first, from batch ``b``
        on: the first of batches b, b + 1, ..., b + n - 1 by workers 0, 1, ... (at least one;
        none if the epoch has no batch ``b``). With ``rows`` (shared batches), the first
        samples of batch ``b`` itself, then the first of the batches after it."""
        nb = self.nbatches_of(epoch)
        if b >= nb:
            return []
        firsts = self.batch(epoch, b)[: max(1, n)] if rows else self.batch(epoch, b)[:1]
        out = [int(i) for i in firsts]
        later = range(1, min(n - len(out), nb - b - 1) + 1)
        out += [int(self.batch(epoch, b + k)[0]) for k in later]
        if self.round_robin and not rows:  # each first sample by the worker its batch goes to
            return [((b + k) % self.round_robin, i) for k, i in enumerate(out[: max(1, n)])]
        return list(enumerate(out[: max(1, n)]))

    def ended(self, epoch: int, worker: int) -> None:
        """A plain iterable's: ``worker``'s iterator of ``epoch`` has no sample left."""

    def all_ended(self, epoch: int) -> bool:
        """A plain iterable's: whether every worker's iterator of ``epoch`` has ended."""
        return False

    def done(self, epoch: int, b: int, rows: int, flags: int) -> bool:
        """Batch ``b`` came back with ``rows`` rows and the result ``flags``: whether it is a
        batch to deliver (always, but for a plain iterable's: fastload/_iterable.py)."""
        return True

    def batch(self, epoch: int, b: int) -> _Array:
        """The sample indices of batch ``b`` of ``epoch``."""
        if self.batch_plan is not None:
            return self.plan(epoch)[b]
        if not self.rest:  # no world-size change (the hot path: no _rows_of)
            bs = self.batch_size
            return self._order(epoch)[0][b * bs:(b + 1) * bs]
        return self._order(epoch)[0][self._rows_of(epoch, b)]

    # -- resume ------------------------------------------------------------------------------
    def state(self, epoch: int, position: int) -> dict[str, Any]:
        """A small JSON-serialisable dict: resume at batch ``position`` of ``epoch`` (on any
        rank and world size: NOTE [resume across ranks])."""
        return {
            "format": STATE_FORMAT,
            "seed": self.seed,
            "epoch": epoch,
            "position": position,
            "len": self.n,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "shard": [self.rank, self.world],
            "history": [list(h) for h in self.rest.get(epoch, (None, []))[1]],
            **self._plan_state(),
        }

    def _plan_state(self) -> dict[str, Any]:
        """A batch plan's own state, when it has one (NOTE [batch plans])."""
        sd = getattr(self.batch_plan, "state_dict", None)
        return {"batch_plan": sd()} if sd is not None else {}

    def _restore_plan(self, state: dict[str, Any]) -> tuple[int, int]:
        """``restore`` for a batch plan with ``load_state_dict`` (NOTE [batch plans])."""
        assert self.batch_plan is not None
        load = getattr(self.batch_plan, "load_state_dict", None)
        if load is None or "batch_plan" not in state:
            raise NotImplementedError("resuming a loader driven by a custom sampler")
        for key, mine in (("len", self.n), ("batch_size", self.batch_size)):
            if state.get(key) != mine:
                raise ValueError(f"the state was saved with {key}={state.get(key)!r} but this "
                                 f"loader has {key}={mine!r}")
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or not isinstance(position, int) or epoch < 0 \
                or position < 0:
            raise ValueError(f"invalid state: epoch {epoch!r}, position {position!r}")
        load(state["batch_plan"])
        self._plans.clear()
        if position > self.len_of(epoch):
            raise ValueError(f"invalid state: epoch {epoch!r}, position {position!r}")
        from ._settings import check_seed

        self.seed = check_seed(state.get("seed"), "the state's seed must be")
        return epoch, position

    def restore(self, state: dict[str, Any]) -> tuple[int, int]:
        """Take the seed of ``state`` (checked against this plan); returns (epoch, position).
        A state of any rank, of this or another world size, resumes this rank (NOTE [resume
        across ranks])."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a fastload Loader state: format {state.get('format')!r}")
        if self.batch_plan is not None:
            return self._restore_plan(state)
        if "stream" in state and type(self) is EpochPlan:
            raise ValueError("the state was saved by a Loader over a fastload.ShardedStream; "
                             "this one reads a map-style dataset")
        for key, mine in (("len", self.n), ("batch_size", self.batch_size),
                          ("shuffle", self.shuffle), ("drop_last", self.drop_last)):
            if state.get(key) != mine:
                raise ValueError(
                    f"the state was saved with {key}={state.get(key)!r} but this loader has "
                    f"{key}={mine!r}; resuming would not reproduce the same batches"
                )
        epoch, position = state.get("epoch"), state.get("position")
        shard, history = state.get("shard", [0, 1]), self._history(state)
        if (not isinstance(shard, (list, tuple)) or len(shard) != 2
                or not all(isinstance(x, int) for x in shard) or not 0 <= shard[0] < shard[1]):
            raise ValueError(f"invalid state: shard {shard!r} (expected [rank, world_size])")
        saved_world = int(shard[1])
        if not isinstance(epoch, int) or not isinstance(position, int) or epoch < 0:
            raise ValueError(f"invalid state: epoch {epoch!r}, position {position!r}")
        from ._settings import check_seed

        seed = check_seed(state.get("seed"), "the state's seed must be")
        left = self._remaining(seed, epoch, history)
        skip = history[-1][1] if history else 0
        if not skip <= position <= skip + self._batches(self._share(len(left), saved_world)):
            raise ValueError(f"invalid state: epoch {epoch!r}, position {position!r}")
        self.seed = seed
        self._orders.clear()
        self.rest.clear()
        if saved_world != self.world and position > skip:
            history.append([saved_world, position])
            left = self._remaining(seed, epoch, history)
        if history:
            self.rest[epoch] = (left, history)
        return epoch, position

    def _history(self, state: dict[str, Any]) -> list[list[int]]:
        history = state.get("history", [])
        try:
            out = [[int(w), int(p)] for w, p in history]
        except (TypeError, ValueError):
            raise ValueError(f"invalid state: history {history!r}") from None
        stops = [p for _, p in out]
        if any(w < 1 for w, _ in out) or stops != sorted(stops) or any(p < 0 for p in stops):
            raise ValueError(f"invalid state: history {history!r}")
        return out

    def _remaining(self, seed: int, epoch: int, history: list[list[int]]) -> _Array:
        """The samples of ``epoch`` (seed ``seed``), in order, that no rank consumed in
        ``history`` (NOTE [resume across ranks])."""
        left, done = self._global(epoch, seed), 0
        for w, p in history:  # world w's ranks took batches done..p - 1 of the epoch
            left = left[~self._gone(len(left), w, p - done)]
            done = p
        return left
