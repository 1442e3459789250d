"""Token-budget batches: ``fastload.TokenBudget``, a ``batch_plan`` whose batches hold up to a
number of tokens rather than a number of samples.

NOTE [token budgets]
A batch's cost is what the model pays for it: with ``padded=True`` (``ragged="pad"``) the rows
times its longest row (rounded up to ``pad_to_multiple``), with ``padded=False``
(``ragged="packed"``) the sum of its lengths. Every batch costs at most ``max_tokens`` and has at
most the Loader's ``batch_size`` rows (the slot's rows; the Loader tells the plan through
``bind``, NOTE [batch plans] in fastload/_plan.py).

The samples are split into length buckets and batched greedily within each bucket, in order:
a sample joins the current batch while the batch's cost stays within the budget, else it starts
the next one. Taken from fairseq's ``data_utils.batch_by_size`` (the greedy cut with the cost
``(rows + 1) * longest``, checked as each sample is added; fairseq sorts all samples by length
and shuffles the batches each epoch) and Lhotse's ``DynamicBucketingSampler`` (bucket bounds
from ``estimate_duration_buckets``: each bucket holds about the same total length, so buckets
give about the same number of batches; a bucket's samples are drawn in a random order, so the
batches differ from epoch to epoch while the bucket's width bounds the padding). So:

- ``shuffle=True``: each bucket's samples in a random order of (seed, epoch), then the epoch's
  batches (of all buckets) in a random order of (seed, epoch). The number of batches can differ
  a little between epochs (``num_batches(epoch)``; ``len(loader)`` asks it).
- ``shuffle=True, sort=True``: each bucket's samples sorted by length, equal lengths in a random
  order of (seed, epoch), the batches in a random order: fairseq's batches (the least padding,
  and the same number of batches every epoch, but about the same batches every epoch).
- ``shuffle=False``: each bucket's samples sorted by length (then index), the batches in bucket
  order: shortest first, the same every epoch.

Sorting (fairseq) pads least but gives about the same batches every epoch; more buckets pad less
and mix less. Over 20,000 lognormal lengths (mean 298, max_tokens=16384): 32 equal-token buckets
padded 5.7 % of the real tokens, ``sort=True`` 0.5 %, shuffled fixed-size batches of the same
mean size 346 % (benchmarks/results/tokens.md). A sample that alone costs more than max_tokens
is refused by index rather than dropped: dropping would change the epoch without a word.

Ranks (``shard=``): every rank builds the same global list of the epoch's batches (the same
seed: one is required with several ranks and ``shuffle=True``, as ``seed=None`` draws one per
process) and takes batches r, r + world, ... of it. Ranks must make the same number of steps, so
when the count does not divide, the short ranks wrap around to the list's first batches (a few
samples twice in that epoch, as the Loader's own ``shard=`` pads), or, with ``drop_last=True``,
the last ``count % world`` batches are dropped (a few samples missing that epoch).

Resume: the batches are a function of (lengths, settings, seed, epoch, rank), so a Loader
restored from ``state_dict()`` asks the epoch again and goes on at its position; the plan's own
``state_dict()`` (carried in the Loader's) gives the seed and checks that the lengths and
settings are those it was saved with.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TokenBudget"]

STATE_FORMAT = "fastload.TokenBudget/1"
#: Default bucket count when padded: over 20,000 lognormal lengths, 32 equal-token buckets
#: padded 5.7 % of the real tokens, 16 buckets 11.6 %, 64 buckets 2.9 % (fewer buckets mix the
#: batches more). Packed batches have no padding to save: one bucket (each bucket ends in a
#: partly filled batch; 32 buckets filled packed batches to 78 % on average, one bucket to 99 %).
DEFAULT_BUCKETS = 32

_Array = np.ndarray[Any, Any]


def _cuts(lens: list[int], budget: int, rows_cap: int, padded: bool, mult: int) -> list[int]:
    """Where greedy batching cuts ``lens`` (lengths in batch order): the start of every batch
    but the first (NOTE [token budgets]: fairseq's cut, the cost checked as each sample joins)."""
    cuts: list[int] = []
    rows = total = top = 0
    for k, n in enumerate(lens):
        if padded:
            t = max(top, -(-n // mult) * mult)
            over = (rows + 1) * t > budget
        else:
            t = 0
            over = total + n > budget
        if rows and (over or rows == rows_cap):
            cuts.append(k)
            rows = total = 0
            t = -(-n // mult) * mult if padded else 0
        rows += 1
        total += n
        top = t
    return cuts


class TokenBudget:
    """A ``batch_plan`` of token-budget batches: each costs at most ``max_tokens`` (rows times
    the longest row with ``padded=True``, the sum of the lengths with ``padded=False``) and has
    at most the Loader's ``batch_size`` rows; samples of similar length share a batch (length
    buckets), reshuffled every epoch from (seed, epoch) with ``shuffle=True``, the same number
    of batches on every rank of ``shard``, resumed exactly by the Loader's ``state_dict()``.

    >>> import numpy as np, fastload
    >>> tb = fastload.TokenBudget([5, 3, 8, 2, 7, 4], max_tokens=16, buckets=2)
    >>> [b.tolist() for b in tb(0)]
    [[3, 1, 5], [0], [4, 2]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | _Array,
        max_tokens: int,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        shard: tuple[int, int] | str | None = None,
        buckets: int | Sequence[int] | None = None,
        padded: bool = True,
        pad_to_multiple: int | None = None,
        drop_last: bool = False,
        sort: bool = False,
    ) -> None:
        from ._config import resolve_shard
        from ._settings import check_seed

        lens = np.asarray(lengths)
        if lens.ndim != 1 or not (lens.dtype.kind in "iu" or lens.size == 0):
            raise TypeError(f"lengths must be a 1-d sequence of ints (tokens per sample), got "
                            f"{lens.dtype} of shape {lens.shape}")
        lens = lens.astype(np.int64)
        if type(max_tokens) is not int or max_tokens <= 0:  # bool is not a budget
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        mult = 1 if pad_to_multiple is None else pad_to_multiple
        if type(mult) is not int or mult < 1:
            raise ValueError(f"pad_to_multiple must be None or a positive int, got {mult!r}")
        if lens.size and lens.min() < 0:
            i = int(np.flatnonzero(lens < 0)[0])
            raise ValueError(f"lengths must be >= 0: sample {i} has {lens[i]}")
        cost1 = -(-lens // mult) * mult if padded else lens  # a batch of one sample
        too_long = np.flatnonzero(cost1 > max_tokens)
        if too_long.size:
            i = int(too_long[0])
            more = f" ({too_long.size} samples do)" if too_long.size > 1 else ""
            rounded = f" padded to {cost1[i]}" if mult > 1 else ""
            raise ValueError(
                f"sample {i} has {lens[i]} tokens{rounded}, more than max_tokens={max_tokens}"
                f"{more}: raise max_tokens, or leave such samples out of the dataset (or "
                "truncate them)")
        self.lengths = lens
        self.max_tokens = max_tokens
        self.shuffle = bool(shuffle)
        self.padded = bool(padded)
        self.pad_to_multiple = mult
        self.drop_last = bool(drop_last)
        self.sort = bool(sort)
        self.rank, self.world = resolve_shard(shard)
        if seed is None and self.shuffle and self.world > 1:
            raise ValueError(
                "TokenBudget with shuffle=True and several ranks needs seed=: every rank must "
                "draw the same epoch order (seed=None would be each process's own random seed)")
        self.seed = None if seed is None else check_seed(seed, "seed must be None or")
        self.boundaries = self._boundaries(
            buckets if buckets is not None else DEFAULT_BUCKETS if self.padded else 1)
        by_length = np.argsort(lens, kind="stable")  # length, then index
        starts = np.searchsorted(lens[by_length], self.boundaries, side="left")
        #: each bucket's samples sorted by (length, index); empty buckets left out
        self._members = [m for m in np.split(by_length, starts) if m.size]
        self._rows: int | None = None  # the Loader's batch_size (bind)
        self._loader_seed = 0  # the Loader's seed (bind): seed=None uses it
        self._epochs: dict[int, list[_Array]] = {}

    def _boundaries(self, buckets: int | Sequence[int]) -> _Array:
        """Bucket ``j`` holds the lengths in [bounds[j-1], bounds[j]) (Lhotse's convention): ``k``
        buckets of about equal total length (Lhotse's ``estimate_duration_buckets``), or the
        bounds given."""
        if isinstance(buckets, (int, np.integer)) and not isinstance(buckets, bool):
            if buckets < 1:
                raise ValueError(f"buckets must be >= 1 or a list of bounds, got {buckets!r}")
            s = np.sort(self.lengths)
            if buckets == 1 or not s.size or not s[-1]:
                return np.zeros(0, np.int64)
            c = np.cumsum(s)
            at = np.searchsorted(c, c[-1] * np.arange(1, buckets) / buckets, side="left")
            b: _Array = np.unique(s[np.minimum(at, s.size - 1)])
            above: _Array = b[b > s[0]]  # a bound at the shortest length: an empty bucket
            return above
        bounds = np.asarray(buckets)
        if (bounds.ndim != 1 or (bounds.size and bounds.dtype.kind not in "iu")
                or np.any(np.diff(bounds) <= 0)):
            raise ValueError(f"buckets must be an int or increasing int bounds, got {buckets!r}")
        out: _Array = bounds.astype(np.int64)
        return out

    # -- NOTE [batch plans] (fastload/_plan.py): the Loader's hooks ----------------------------
    def bind(self, *, batch_size: int, seed: int, n: int) -> None:
        """Called by the Loader this plan drives: its ``batch_size`` is the most rows a batch
        may have (the slot's rows), its ``seed`` is used when ``seed=None``, and its dataset
        must have one sample per length."""
        if n != self.lengths.size:
            raise ValueError(f"TokenBudget has {self.lengths.size} lengths but the dataset has "
                             f"{n} samples")
        if batch_size == 1 and self.lengths.size > 1:
            import warnings

            warnings.warn(
                "Loader(batch_size=1) caps every TokenBudget batch at one row; pass batch_size="
                "the most rows a batch may have (at most max_tokens // the shortest length)",
                RuntimeWarning, stacklevel=4)
        self._rows, self._loader_seed = batch_size, seed
        self._epochs.clear()

    def __call__(self, epoch: int) -> list[_Array]:
        """This rank's batches of ``epoch`` (arrays of sample indices), in order."""
        got = self._epochs.get(epoch)
        if got is None:
            got = self._share(self._global(epoch))
            for old in [e for e in self._epochs if e < epoch - 1]:
                del self._epochs[old]
            self._epochs[epoch] = got
        return got

    def num_batches(self, epoch: int) -> int:
        """This rank's number of batches in ``epoch`` (what ``len(loader)`` says)."""
        return len(self(epoch))

    def state_dict(self) -> dict[str, Any]:
        """The seed in use and what the batches depend on (checked by ``load_state_dict``)."""
        return {
            "format": STATE_FORMAT,
            "seed": self._seed,
            "lengths_crc32": zlib.crc32(self.lengths.astype("<i8").tobytes()),
            "n": int(self.lengths.size),
            "max_tokens": self.max_tokens,
            "rows": self._rows,
            "padded": self.padded,
            "pad_to_multiple": self.pad_to_multiple,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "sort": self.sort,
            "boundaries": self.boundaries.tolist(),
            "world": self.world,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the seed of ``state``, after checking that its batches are this plan's (the
        same lengths and settings; any rank of the same world size)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            got = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a fastload.TokenBudget state: {got!r}")
        mine = self.state_dict()
        for key in mine:
            if key not in ("format", "seed") and state.get(key) != mine[key]:
                raise ValueError(
                    f"the state was saved by a TokenBudget with {key}={state.get(key)!r} but "
                    f"this one has {key}={mine[key]!r}; resuming would not give the same batches")
        seed = state.get("seed")
        if type(seed) is not int:
            raise ValueError(f"invalid TokenBudget state: seed {seed!r}")
        self.seed = seed
        self._epochs.clear()

    # -- the batches -----------------------------------------------------------------------------
    @property
    def _seed(self) -> int:
        return self._loader_seed if self.seed is None else self.seed

    def cost(self, batch: Sequence[int] | _Array) -> int:
        """What ``batch`` (sample indices) costs against ``max_tokens``."""
        lens = self.lengths[np.asarray(batch, dtype=np.int64)]
        if not lens.size:
            return 0
        if self.padded:
            m = self.pad_to_multiple
            return int(lens.size * (-(-int(lens.max()) // m) * m))
        return int(lens.sum())

    def _global(self, epoch: int) -> list[_Array]:
        """Every batch of ``epoch``, for all ranks (NOTE [token budgets])."""
        rng = (np.random.Generator(np.random.PCG64(np.random.SeedSequence([self._seed, epoch])))
               if self.shuffle else None)
        cap = self._rows if self._rows is not None else max(1, self.lengths.size)
        out: list[_Array] = []
        for members in self._members:
            order = members if rng is None else rng.permutation(members)
            if rng is not None and self.sort:  # equal lengths stay in their random order
                order = order[np.argsort(self.lengths[order], kind="stable")]
            cuts = _cuts(self.lengths[order].tolist(), self.max_tokens, cap, self.padded,
                         self.pad_to_multiple)
            out += np.split(order, cuts)
        if rng is not None:
            out = [out[i] for i in rng.permutation(len(out))]
        return out

    def _share(self, batches: list[_Array]) -> list[_Array]:
        """This rank's batches: r, r + world, ... of the epoch's, padded by wrapping around or
        cut (``drop_last``) to the same count on every rank (NOTE [token budgets])."""
        n, w = len(batches), self.world
        count = n // w if self.drop_last else -(-n // w)
        return [batches[(k * w + self.rank) % n] for k in range(count)]

    def __repr__(self) -> str:
        return (f"TokenBudget({self.lengths.size} samples, max_tokens={self.max_tokens}, "
                f"{'padded' if self.padded else 'packed'}, {len(self.boundaries) + 1} buckets, "
                f"shuffle={self.shuffle}, shard=({self.rank}, {self.world}))")
