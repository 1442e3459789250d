"""Sharded streams: datasets that arrive as shards read in order (files, tables, buckets).

A :class:`ShardedStream` says what its shards are and how to read one from a position; fastload
plans every epoch itself (NOTE [stream order] in fastload/_stream.py): which rank and which
batch reads which part of which shard, the same for any number of workers, resumable exactly.
:class:`NpyShards` is the built-in one, over ``.npy`` files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["ShardedStream", "NpyShards"]


class ShardedStream:
    """The protocol of a sharded stream: subclass it and define :meth:`shards` and
    :meth:`iter_shard` (and :meth:`shard_len` when a shard's length is cheap to know).

    Give the object to :class:`fastload.Loader` as the dataset. fastload assigns the shards to
    ranks and workers (never call ``get_worker_info`` to split them), delivers every sample of
    the epoch exactly once across all ranks and workers, gives every rank the same number of
    batches, and resumes mid-epoch from ``state_dict()`` with any ``num_workers``.

    Examples
    --------
    >>> import numpy as np, fastload
    >>> class Lines(fastload.ShardedStream):
    ...     def __init__(self, sizes): self.sizes = sizes
    ...     def shards(self): return [f"part-{k}" for k in range(len(self.sizes))]
    ...     def shard_len(self, shard): return self.sizes[int(shard.split("-")[1])]
    ...     def iter_shard(self, shard, start):
    ...         k = int(shard.split("-")[1])
    ...         for i in range(start, self.sizes[k]):
    ...             yield np.int64(100 * k + i)
    >>> with fastload.Loader(Lines([3, 2]), batch_size=2, num_workers=0) as loader:
    ...     [b.tolist() for b in loader]
    [[0, 1], [2, 100], [101]]
    """

    def shards(self) -> Sequence[Any]:
        """The shards, in their natural order: picklable descriptions (file paths, URLs, row
        ranges); called once, in the main process, when the Loader is built."""
        raise NotImplementedError(f"{type(self).__name__} must define shards()")

    def iter_shard(self, shard: Any, start: int) -> Iterator[Any]:
        """The samples of ``shard`` from position ``start`` (0-based) to its end, in order.

        fastload calls it in its workers, at the position where a batch's part of the shard
        begins (with ``shuffle=True``, where the shuffle window holding it begins), so that a
        resumed loader never re-reads the part already consumed. Make ``start`` cheap (seek)
        when you can: workers read one shard in parallel, each from its own position; a source
        that can only read from its beginning costs each worker a skip to ``start``."""
        raise NotImplementedError(f"{type(self).__name__} must define iter_shard(shard, start)")

    # shard_len(self, shard) -> int is optional: define it when cheap (a file header, a table's
    # row count). Without it fastload reads each shard whole once, in the workers, when a Loader
    # is first built over it (equal batches on every rank need every shard's length: NOTE
    # [stream order]), and remembers the count (NOTE [shard lengths] in _shard_lengths.py).

    def shard_file(self, shard: Any) -> str | os.PathLike[str] | None:
        """The file whose content fixes how many samples ``shard`` has, or None.

        Used only without :meth:`shard_len`: fastload counts such a shard once and remembers
        the count, for the file's path, size and modification time and the stream's class, in
        its cache folder (``FASTLOAD_CACHE_DIR``), so a later run or a resume reads the file
        only for what it delivers. By default, the shard itself when it is a path to a file.
        Return None for a shard that two objects of this class would count differently."""
        if isinstance(shard, (str, os.PathLike)) and os.path.isfile(shard):
            return shard
        return None


def _npy_header(path: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """(shape, dtype) of the .npy file ``path``, from its header alone (no data read)."""
    fmt = np.lib.format
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = fmt.read_array_header_2_0(f)
            else:  # 3.0 (utf-8 field names): let np.load read that header
                x = np.load(path, mmap_mode="r")
                shape, dtype = x.shape, x.dtype
        except ValueError as e:
            raise ValueError(f"NpyShards: {path!r} is not a .npy file NumPy can read: {e}") \
                from None
    return tuple(shape), np.dtype(dtype)


def _alike(what: str, names: list[str], heads: list[tuple[tuple[int, ...], Any]]) -> None:
    """Every array of ``heads`` (shape, dtype) has one dtype and one row shape, or a ValueError
    naming the first that differs from the most common one."""
    for index, label in ((1, "dtype"), (0, "row shape")):
        seen: list[Any] = [h[1] if index else h[0][1:] for h in heads]
        common = max(seen, key=seen.count)
        odd = [k for k, v in enumerate(seen) if v != common]
        if odd:
            k = odd[0]
            more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
            raise ValueError(
                f"NpyShards: {what} {names[k]!r}{more} has {label} {_show(seen[k])}, the other "
                f"{len(seen) - len(odd)} {what}s {_show(common)}; every {what} must have the "
                f"same dtype and row shape (shape {heads[k][0]} here)")


def _show(x: Any) -> str:
    return str(x) if isinstance(x, np.dtype) else str(tuple(x))


class NpyShards(ShardedStream):
    """A :class:`ShardedStream` over ``.npy`` files: the rows of each file are its samples.

    Parameters
    ----------
    paths : sequence of str or os.PathLike
        One ``.npy`` file per shard; every file has the same dtype and row shape (checked
        from the headers when it is built: a ValueError names the file that differs).
    labels : sequence of paths or arrays, optional
        A companion array per shard (same number of rows): samples are then ``(row, label)``.

    Files are memory-mapped (read-only) in each worker; a batch's rows are copied from the maps
    straight into the shared slot in C (as :class:`fastload.ArrayDataset` rows are), with no
    Python call per sample, and the length of a shard is read from its header, never counted.

    Examples
    --------
    >>> import numpy as np, fastload, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> paths = []
    >>> for k, n in enumerate([3, 2]):
    ...     paths.append(os.path.join(d, f"{k}.npy"))
    ...     np.save(paths[-1], np.arange(n, dtype=np.float32) + 10 * k)
    >>> with fastload.Loader(fastload.NpyShards(paths), batch_size=4, num_workers=0) as ld:
    ...     [b.tolist() for b in ld]
    [[0.0, 1.0, 2.0, 10.0], [11.0]]
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]],
                 labels: Sequence[Any] | None = None) -> None:
        if isinstance(paths, (str, os.PathLike)):
            raise TypeError("NpyShards(paths): give a list of .npy files, not one path")
        self.paths = [os.fspath(p) for p in paths]
        if labels is not None and len(labels) != len(self.paths):
            raise ValueError(f"NpyShards: {len(labels)} label arrays for {len(self.paths)} "
                             "shards; give one per shard")
        self.labels = None if labels is None else [
            os.fspath(a) if isinstance(a, (str, os.PathLike)) else np.asarray(a) for a in labels]
        self._maps: dict[int, tuple[Any, Any]] = {}
        # Clear errors now, in the main process, from the headers alone: a file of another
        # dtype or row width would otherwise surface as a batch NumPy upcast or cannot stack.
        heads = [_npy_header(p) for p in self.paths]
        for p, (shape, dtype) in zip(self.paths, heads):
            if not shape:
                raise ValueError(f"NpyShards: {p!r} holds a scalar; shards must have a first "
                                 "axis of rows")
            if dtype.hasobject:
                raise ValueError(f"NpyShards: {p!r} holds Python objects (dtype {dtype}); "
                                 "its rows cannot be memory-mapped")
        _alike("file", self.paths, heads)
        self.lengths = [shape[0] for shape, _ in heads]
        if self.labels is not None:
            names = [lab if isinstance(lab, str) else f"labels[{k}]"
                     for k, lab in enumerate(self.labels)]
            lheads = [_npy_header(lab) if isinstance(lab, str) else (lab.shape, lab.dtype)
                      for lab in self.labels]
            for k, (shape, _) in enumerate(lheads):
                if (shape[0] if shape else 1) != self.lengths[k]:
                    raise ValueError(f"NpyShards: shard {self.paths[k]!r} has "
                                     f"{self.lengths[k]} rows but its labels have "
                                     f"{shape[0] if shape else 'no rows (a scalar)'}")
            _alike("label array", names, lheads)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}}  # workers map the files themselves

    def _open(self, k: int) -> tuple[Any, Any]:
        got = self._maps.get(k)
        if got is None:
            x = np.load(self.paths[k], mmap_mode="r")
            y = None
            if self.labels is not None:
                lab = self.labels[k]
                y = np.load(lab, mmap_mode="r") if isinstance(lab, str) else lab
            got = self._maps[k] = (x, y)
        return got

    def shards(self) -> Sequence[Any]:
        return list(range(len(self.paths)))

    def shard_len(self, shard: int) -> int:
        return self.lengths[shard]

    def iter_shard(self, shard: int, start: int) -> Iterator[Any]:
        x, y = self._open(shard)
        for i in range(start, len(x)):
            yield x[i] if y is None else (x[i], y[i])

    def _fastload_columns_of(self, shard: int) -> list[Any]:
        """The arrays a batch's rows of ``shard`` are gathered from (fastload/_fill.py)."""
        x, y = self._open(shard)
        return [x] if y is None else [x, y]

    def _fastload_take(self, shard: int, rows: Any) -> Any:
        """The rows ``rows`` (int64 array) of ``shard``, stacked: one gather per array."""
        x, y = self._open(shard)
        xs = np.take(x, rows, axis=0)
        return xs if y is None else (xs, np.take(y, rows, axis=0))
