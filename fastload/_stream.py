"""Sharded streams inside the engine: a stream is served as a map-style dataset of positions.

NOTE [stream order]
An epoch of a ShardedStream is one global sequence of its N samples: the shards in an order
(shuffled per (seed, epoch) with ``shuffle=True``), each shard's samples in order, or, shuffled,
permuted within consecutive windows of ``shuffle_buffer`` samples (per (seed, epoch, shard,
window)). Position g of that sequence is "sample g" of a map-style dataset (``StreamView``),
so batches, slots, layouts, ragged modes, errors, deaths and prefetch are the map-style ones.
``StreamPlan`` gives rank r of w the contiguous positions [r*m, (r+1)*m), m = ceil(N/w) (padded
by wrapping around, padding marked invalid by ``return_mask``) or floor(N/w) with drop_last:
every rank has the same number of batches, and each rank reads long runs of few shards. The
order depends on (seed, epoch, world size) only, never on num_workers or the start method.
Equal batch counts need N before the first batch: ``shard_len`` gives it, or each shard is
counted once, in parallel in worker processes, when a Loader is first built over it, and
remembered (NOTE [shard lengths] in _shard_lengths.py).

A worker loads batch b by reading, for each shard it touches, the range of raw positions it
needs (a shuffle window: the whole window) with ``iter_shard(shard, start)``; it keeps its last
few shard iterators open and goes on with one when the next range starts where it stopped.

NOTE [stream resume]
``state_dict()`` is (epoch, batches consumed) plus the epoch's history of world sizes; the
per-shard cursors it also lists are derived, for people. Resumed with the same world size, the
plan goes on with the very batches of an uninterrupted run; the first read of each shard starts
at the cursor (with shuffle, at the start of the window holding it: at most one window is read
again). With another world size, every rank computes the positions all ranks consumed (ranks
consume in lock step: equal batch counts, so one rank's position is every rank's) and splits
the rest of the epoch (in its order) across the new ranks as above; the order of the rest then
differs from an uninterrupted run, no sample is lost or repeated. Later epochs are as usual.
The bookkeeping is a map-style plan's (NOTE [resume across ranks] in _plan.py): a stream's
plan only cuts the shares (``_split``) and the consumed part (``_gone``) contiguously.
"""

from __future__ import annotations

import bisect
import zlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ._fill import sample_ctx
from ._plan import STATE_FORMAT, EpochPlan
from ._shard_lengths import shard_lengths
from .errors import LoaderTimeoutError
from .stream import ShardedStream

__all__ = ["StreamView", "StreamPlan", "stream_view"]

_Array = np.ndarray[Any, Any]
_OPEN_ITERATORS = 4  # shard iterators a worker keeps open (LRU)
_WINDOWS = 4  # shuffle windows a worker keeps read (LRU)
DEFAULT_SHUFFLE_BUFFER = 1024


class StreamView:
    """A ShardedStream as the map-style dataset of its epoch positions (NOTE [stream order]).
    Position -> sample needs the epoch and seed of the batch being loaded: the fill path has
    them in ``sample_ctx()`` (fastload/_fill.py), the same in a worker and in process."""

    def __init__(self, stream: Any, shards: list[Any], lengths: _Array, shuffle: bool,
                 window: int) -> None:
        self.stream = stream
        self.shards = shards
        self.lengths = lengths
        self.n = int(lengths.sum())
        self.shuffle = shuffle
        self.window = window
        self.take = getattr(stream, "_fastload_take", None)
        self._init_caches()

    def _init_caches(self) -> None:
        # (seed, epoch) -> (shard order, ends, both as lists for the contiguous fast path)
        self._maps: OrderedDict[tuple[int, int], tuple[Any, ...]] = OrderedDict()
        self._iters: OrderedDict[int, list[Any]] = OrderedDict()  # shard -> [iterator, next pos]
        self._windows: OrderedDict[tuple[int, int, int, int], list[Any]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_maps", "_iters", "_windows", "take"):
            state.pop(k)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.take = getattr(self.stream, "_fastload_take", None)
        self._init_caches()

    def __len__(self) -> int:
        return self.n

    # -- where position g is -----------------------------------------------------------------
    def epoch_map(self, seed: int, epoch: int) -> tuple[_Array, _Array]:
        """(shard order, end position of each shard in it) of ``epoch``."""
        key = (seed, epoch)
        got = self._maps.get(key)
        if got is None:
            s = len(self.shards)
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
                    [seed, epoch, 1])))
                order = rng.permutation(s).astype(np.int64)
            else:
                order = np.arange(s, dtype=np.int64)
            ends = np.cumsum(self.lengths[order])
            got = self._maps[key] = (order, ends, order.tolist(), ends.tolist())
            while len(self._maps) > 2:
                self._maps.popitem(last=False)
        return got[0], got[1]

    def locate(self, seed: int, epoch: int, g: _Array) -> tuple[_Array, _Array]:
        """(shard index, position in the shard's epoch order) of each position ``g``."""
        order, ends = self.epoch_map(seed, epoch)
        j = np.searchsorted(ends, g, side="right")
        return order[j], g - (ends[j] - self.lengths[order[j]])

    def raw(self, seed: int, epoch: int, s: int, q: _Array) -> _Array:
        """The positions in the shard itself (what iter_shard counts) of epoch positions q."""
        if not self.shuffle:
            return q
        w = self.window
        out: _Array = q.copy()
        for k in np.unique(q // w).tolist():
            n_k = int(min(w, self.lengths[s] - k * w))
            perm = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
                [seed, epoch, 2, s, k]))).permutation(n_k)
            sel = (q // w) == k
            out[sel] = k * w + perm[q[sel] - k * w]
        return out

    # -- reading -----------------------------------------------------------------------------
    def __getitem__(self, g: int) -> Any:
        got = self.__getitems__([int(g)])
        return got[0] if isinstance(got, list) else _first(got)

    def __getitems__(self, gs: list[int]) -> Any:
        """The samples at positions ``gs`` (a list), or, for a stream that stacks its own
        rows (NpyShards), the stacked batch."""
        seed, epoch = sample_ctx()[:2]
        pieces = [self._take(s, raws, g) if self.take is not None
                  else self._samples(seed, epoch, s, raws, g) for s, raws, g in self._runs(gs)]
        if self.take is not None:
            return pieces[0] if len(pieces) == 1 else _concat(pieces)
        return [x for p in pieces for x in p]

    def _runs(self, gs: Any) -> list[tuple[int, _Array, _Array]]:
        """(shard, raw positions, epoch positions) of each run of positions in one shard."""
        seed, epoch = sample_ctx()[:2]
        g = np.asarray(gs, dtype=np.int64)
        n = len(g)
        if n and not self.shuffle:
            g0, g1 = int(g[0]), int(g[-1])
            if g1 - g0 == n - 1 and 0 <= g0 and g1 < self.n:  # one run of positions (the
                return self._contiguous_runs(seed, epoch, g, g0, g1)  # usual batch): no NumPy
        return self._general_runs(seed, epoch, g)

    def _general_runs(self, seed: int, epoch: int, g: _Array) -> list[tuple[int, _Array, _Array]]:
        if len(g) and (g.min() < 0 or g.max() >= self.n):
            raise IndexError(f"stream position out of range for {self.n} samples")
        shard_of, q = self.locate(seed, epoch, g)
        cut = np.flatnonzero(np.diff(shard_of)).tolist()  # runs of one shard
        out = []
        for a, b in zip([0, *(c + 1 for c in cut)], [*(c + 1 for c in cut), len(g)]):
            s = int(shard_of[a])
            out.append((s, self.raw(seed, epoch, s, q[a:b]), g[a:b]))
        return out

    def _contiguous_runs(self, seed: int, epoch: int, g: _Array, g0: int,
                         g1: int) -> list[tuple[int, _Array, _Array]]:
        """_runs of the positions g0..g1 (``g``), without shuffle: shard by shard, in order."""
        self.epoch_map(seed, epoch)
        _, _, order, ends = self._maps[(seed, epoch)]
        j = bisect.bisect_right(ends, g0)
        out = []
        pos = g0
        while pos <= g1:
            s, end = order[j], ends[j]
            stop = min(g1 + 1, end)
            if stop > pos:
                first = end - int(self.lengths[s])
                out.append((s, np.arange(pos - first, stop - first, dtype=np.int64),
                            g[pos - g0: stop - g0]))
                pos = stop
            j += 1
        return out

    def _fastload_pieces(self, indices: Any) -> list[tuple[list[Any], _Array]] | None:
        """For fastload/_fill.py: the batch as (columns of a shard, its rows) pieces, gathered
        in C straight into the slot (NpyShards); None for a stream without columns."""
        columns_of = getattr(self.stream, "_fastload_columns_of", None)
        if columns_of is None:
            return None
        out = []
        for s, raws, g in self._runs(indices):
            try:
                out.append((columns_of(self.shards[s]), np.ascontiguousarray(raws)))
            except Exception as e:
                _name(e, int(g[0]), f"shard {self.shards[s]!r} (shard {s}), positions "
                                    f"{int(raws.min())}..{int(raws.max())} of the shard")
                raise
        return out

    def _take(self, s: int, raws: _Array, g: _Array) -> Any:
        take = self.take
        assert take is not None
        try:
            return take(self.shards[s], raws)
        except Exception as e:
            _name(e, int(g[0]), f"shard {self.shards[s]!r} (shard {s}), positions "
                                f"{int(raws.min())}..{int(raws.max())} of the shard")
            raise

    def _samples(self, seed: int, epoch: int, s: int, raws: _Array, g: _Array) -> list[Any]:
        if not self.shuffle:
            lo, hi = int(raws.min()), int(raws.max()) + 1
            got = self._range(s, lo, hi, g)
            return [got[r - lo] for r in raws.tolist()]
        w = self.window
        out = []
        for r in raws.tolist():
            k = r // w
            key = (seed, epoch, s, k)
            win = self._windows.get(key)
            if win is None:
                win = self._windows[key] = self._range(
                    s, k * w, int(min((k + 1) * w, self.lengths[s])), g)
                while len(self._windows) > _WINDOWS:
                    self._windows.popitem(last=False)
            out.append(win[r - k * w])
        return out

    def _range(self, s: int, lo: int, hi: int, g: _Array) -> list[Any]:
        """Raw positions [lo, hi) of shard s, through a kept iterator when one stopped at lo,
        else a new ``iter_shard(shard, lo)`` (never a skip: it would read, and fail on,
        samples of other batches; ShardedStream.iter_shard asks for a cheap start)."""
        shard = self.shards[s]
        kept = self._iters.pop(s, None)
        if kept is None or kept[1] != lo:
            if kept is not None:
                _close(kept[0])
            try:
                kept = [iter(self.stream.iter_shard(shard, lo)), lo]
            except Exception as e:
                _name(e, int(g[0]), f"iter_shard({shard!r}, start={lo}) (shard {s})")
                raise
        it, pos = kept
        out: list[Any] = []
        try:
            while pos < hi:
                try:
                    x = next(it)
                except StopIteration:
                    raise ValueError(
                        f"shard {shard!r} (shard {s}) ended at position {pos}, but its length "
                        f"is {int(self.lengths[s])} (from shard_len, or counted when the "
                        "Loader was built): iter_shard(shard, start) must yield every sample "
                        "from start to the end, the same every time") from None
                out.append(x)
                pos += 1
        except Exception as e:
            _close(it)  # a generator that raised is finished: the next read opens a new one
            at = pos - lo  # the batch's sample there, if it is one (no shuffle: g[0] is lo)
            _name(e, int(g[at] if not self.shuffle and at < len(g) else g[0]),
                  f"iter_shard({shard!r}, start={kept[1]}) (shard {s}) at position {pos} of "
                  "the shard")
            raise
        self._iters[s] = [it, pos]
        while len(self._iters) > _OPEN_ITERATORS:
            _close(self._iters.popitem(last=False)[1][0])
        return out


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass


def _name(e: BaseException, g: int, where: str, what: str | None = None) -> None:
    """Say in the error where in the stream it happened (read by fastload/_remote.py):
    ``where`` after the sample ``g``, or, with ``what``, ``what`` instead of "sample index g"
    (the counting pass, whose item numbers are nobody's samples)."""
    try:
        if getattr(e, "_fastload_context", None) is None:
            e._fastload_context = where  # type: ignore[attr-defined]
            e._fastload_sample = g  # type: ignore[attr-defined]
            if what is not None:
                e._fastload_where = what  # type: ignore[attr-defined]
    except Exception:
        pass  # an exception type without attributes: the batch is still named


def _first(batch: Any) -> Any:
    if isinstance(batch, tuple):
        return tuple(_first(x) for x in batch)
    if isinstance(batch, dict):
        return {k: _first(v) for k, v in batch.items()}
    return batch[0]


def _concat(pieces: list[Any]) -> Any:
    first = pieces[0]
    if isinstance(first, tuple):
        return tuple(_concat([p[i] for p in pieces]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _concat([p[k] for p in pieces]) for k in first}
    return np.concatenate(pieces, axis=0)


class _ShardCounter:
    """Map-style: item k is the number of samples of shard ``todo[k]`` (a stream without
    shard_len, NOTE [shard lengths] in _shard_lengths.py); an error names the shard and the
    position it was read to, not the counter's item."""

    def __init__(self, stream: Any, shards: list[Any], todo: list[int]) -> None:
        self.stream, self.shards, self.todo = stream, shards, todo

    def __len__(self) -> int:
        return len(self.todo)

    def __getitem__(self, k: int) -> Any:
        s = self.todo[k]
        shard = self.shards[s]
        n = 0
        try:
            for _ in self.stream.iter_shard(shard, 0):
                n += 1
        except Exception as e:
            _name(e, s, f"counting its samples: iter_shard({shard!r}, start=0) at position {n} "
                        "of the shard", what=f"shard {shard!r} (shard {s})")
            raise
        return np.int64(n)


def _count(stream: Any, shards: list[Any], todo: list[int], loader: Callable[..., Any] | None,
           num_workers: int | None, start_method: str | None,
           timeout: float | None) -> list[int]:
    """The lengths of shards ``todo``, read whole in parallel by the workers of a ``loader``
    (fastload.Loader), one shard a batch, each within ``timeout`` seconds."""
    assert loader is not None, "counting a stream's shards needs fastload.Loader"
    nw = min(len(todo), num_workers if num_workers is not None else 2)
    got: list[int] = []
    try:
        with loader(_ShardCounter(stream, shards, todo), 1, num_workers=nw,
                    start_method=start_method, share_dataset=False, timeout=timeout) as ld:
            got += (int(b[0]) for b in ld)
    except LoaderTimeoutError as e:
        s = todo[len(got)]  # batches come in order: the first shard not counted yet
        raise LoaderTimeoutError(
            f"counting the samples of shard {shards[s]!r} (shard {s}) took more than "
            f"timeout={timeout}s (the stream has no shard_len, so each shard is read whole "
            "once, and then remembered: NOTE [shard lengths]). Define shard_len, raise the "
            f"timeout, or look at the read of that shard. ({e})") from e
    return got


def stream_view(stream: ShardedStream, shuffle: bool, shuffle_buffer: int | None,
                num_workers: int | None, start_method: str | None,
                loader: Callable[..., Any] | None = None,
                timeout: float | None = None) -> StreamView:
    """The StreamView of ``stream``: its shards, their lengths (from shard_len, remembered, or
    counted in workers by a ``loader``, fastload.Loader: NOTE [shard lengths]) and the shuffle
    window."""
    shards = list(stream.shards())
    window = DEFAULT_SHUFFLE_BUFFER if shuffle_buffer is None else shuffle_buffer
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"shuffle_buffer must be an int >= 1, got {shuffle_buffer!r}")
    lengths = shard_lengths(stream, shards, lambda todo: _count(
        stream, shards, todo, loader, num_workers, start_method, timeout))
    for s, n in zip(shards, lengths):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"shard_len({s!r}) returned {n!r}; expected an int >= 0")
    return StreamView(stream, shards, np.asarray(lengths, dtype=np.int64).reshape(-1),
                      shuffle, window)


class StreamPlan(EpochPlan):
    """EpochPlan of a StreamView: contiguous rank ranges of positions (NOTE [stream order]),
    resume across world sizes as a map-style plan's (NOTE [stream resume])."""

    def __init__(self, view: StreamView, batch_size: int, *, shuffle: bool, seed: int,
                 drop_last: bool, shard: tuple[int, int] = (0, 1)) -> None:
        super().__init__(view.n, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         shard=shard)
        self.view = view

    def _global(self, epoch: int, seed: int | None = None) -> _Array:
        # the view's positions: the view shuffles (NOTE [stream order])
        return np.arange(self.n, dtype=np.int64)

    def _split(self, positions: _Array) -> tuple[_Array, _Array]:
        n = len(positions)
        m = self._share(n, self.world)
        idx = np.arange(self.rank * m, (self.rank + 1) * m)
        return (positions[idx % n] if n else positions[:0]), idx < n

    def _gone(self, n: int, world: int, position: int) -> _Array:
        m = self._share(n, world)
        take = min(position * self.batch_size, m)
        gone = np.zeros(n, np.bool_)
        for r in range(world):
            gone[r * m: min(r * m + take, n)] = True
        return gone

    def digest(self) -> list[int]:
        lengths = self.view.lengths
        return [len(lengths), self.n, zlib.crc32(lengths.astype("<i8").tobytes())]

    def state(self, epoch: int, position: int) -> dict[str, Any]:
        st = super().state(epoch, position)
        order, valid = self._order(epoch)
        upto = (position - self.skip(epoch)) * self.batch_size  # since the last world change
        done = order[:upto][valid[:upto]]
        shard_of, _ = self.view.locate(self.seed, epoch, done)
        counts = np.bincount(shard_of, minlength=len(self.view.lengths))
        st["stream"] = {
            "digest": self.digest(),
            # derived, for people: samples of each shard this rank has delivered this epoch
            "cursors": {str(k): int(c) for k, c in enumerate(counts.tolist()) if c},
        }
        return st

    def restore(self, state: dict[str, Any]) -> tuple[int, int]:
        if state.get("format") != STATE_FORMAT or "stream" not in state:
            raise ValueError("not the state of a fastload Loader over a ShardedStream")
        stream = state["stream"]
        if list(stream.get("digest", [])) != self.digest():
            raise ValueError("the state was saved for a stream with other shards or shard "
                             f"lengths (digest {stream.get('digest')!r}, this one "
                             f"{self.digest()!r}); resuming would not continue the same epoch")
        state = dict(state, len=self.n)  # the digest checked it
        if "history" not in state and stream.get("history"):
            # an earlier state: history in "stream", batches counted from the last world change
            try:
                stops = np.cumsum([int(p) for _, p in stream["history"]]).tolist()
                state["history"] = [[int(w), p] for (w, _), p in zip(stream["history"], stops)]
                state["position"] = int(state["position"]) + stops[-1]
            except (TypeError, ValueError, KeyError):
                raise ValueError(f"invalid state: history {stream['history']!r}") from None
        return super().restore(state)
