"""ArrayDataset: NumPy arrays or memory maps, gathered row by row in C.

A worker serving an :class:`ArrayDataset` does not call ``__getitem__`` per sample: for each
field it copies the batch's rows straight from the source array into the slot with one C loop
(``fl_pack_gather``), the GIL released. Memory maps stay memory maps in the workers (they are
reopened from their file, never pickled as data).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

__all__ = ["ArrayDataset"]


def _reopen(
    filename: str, dtype: Any, shape: tuple[int, ...], offset: int, mode: Literal["r", "r+"]
) -> Any:
    return np.memmap(filename, dtype=dtype, mode=mode, shape=shape, offset=offset)


#: numpy.lib.array_utils.byte_bounds (NumPy >= 2), numpy.byte_bounds before.
_byte_bounds: Any = getattr(np.lib, "array_utils", np).byte_bounds


def _reopen_strided(filename: str, dtype: Any, shape: tuple[int, ...], strides: tuple[int, ...],
                    span_offset: int, span: int, first: int, mode: Literal["r", "r+"]) -> Any:
    raw = np.memmap(filename, dtype=np.uint8, mode=mode, shape=(span,), offset=span_offset)
    return np.ndarray(shape, dtype, buffer=raw, offset=first, strides=strides)


class _MemmapRef:
    """Pickles a memory map as (file, dtype, shape, offset), not as its data."""

    def __init__(self, mm: np.memmap[Any, Any]) -> None:
        self.mm = mm

    def __reduce__(self) -> Any:
        mm = self.mm
        base = mm
        while isinstance(base.base, np.memmap):  # a row slice of a bigger map
            base = base.base
        if mm.filename is None or mm.mode == "c":
            # mode "c" (copy-on-write): changes made in memory are not in the file, so the
            # array itself is sent, not a way to reopen the file
            return (np.asarray, (np.asarray(mm),))
        start = mm.offset + (
            mm.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        )
        mode = "r" if mm.mode == "r" or not mm.flags.writeable else "r+"
        if mm.flags.c_contiguous:
            return (_reopen, (mm.filename, mm.dtype.str, mm.shape, start, mode))
        # A strided view (x[:, :16]): the bytes it spans, reopened, viewed with its strides.
        lo, hi = _byte_bounds(mm)
        first = mm.__array_interface__["data"][0]
        return (_reopen_strided, (mm.filename, mm.dtype.str, mm.shape, mm.strides,
                                  start - (first - lo), hi - lo, first - lo, mode))


class ArrayDataset:
    """A dataset over arrays that share their first axis.

    Parameters
    ----------
    *arrays : array_like, or a single dict of arrays
        Sample ``i`` is ``tuple(a[i] for a in arrays)`` (a single array gives ``a[i]`` alone;
        a dict gives ``{k: a[i]}``). ``np.memmap`` inputs are read lazily in each worker
        (reopened from their file); a copy-on-write map (``mode="c"``, ``np.load(...,
        mmap_mode="c")``), whose changes are only in memory, is sent to spawned workers as
        data. A list of arrays (shards) is refused: concatenate them first.

    Examples
    --------
    >>> import numpy as np, fastload
    >>> ds = fastload.ArrayDataset(np.arange(12.0).reshape(6, 2), np.arange(6))
    >>> ds[1]
    (array([2., 3.]), np.int64(1))
    >>> with fastload.Loader(ds, batch_size=4, num_workers=0) as loader:
    ...     [b[1].tolist() for b in loader]
    [[0, 1, 2, 3], [4, 5]]
    """

    def __init__(self, *arrays: Any) -> None:
        if len(arrays) == 1 and isinstance(arrays[0], dict):
            self._keys: tuple[Any, ...] | None = tuple(arrays[0])
            cols = list(arrays[0].values())
            self._single = False
        else:
            self._keys = None
            cols = list(arrays)
            self._single = len(cols) == 1
        if not cols:
            raise ValueError("ArrayDataset needs at least one array")
        fixed = []
        for k, c in enumerate(cols):
            if isinstance(c, (list, tuple)) and any(isinstance(x, np.ndarray) and x.ndim
                                                    for x in c):
                raise TypeError(
                    f"array {k} is a {type(c).__name__} of {len(c)} arrays: ArrayDataset takes "
                    "one array per field, and would read a list of shards as one array with a "
                    "shard axis (len(dataset) == number of shards). Pass np.concatenate(shards) "
                    "(a copy), or write the shards to one .npy file and pass "
                    "np.load(path, mmap_mode='r')"
                )
            if not isinstance(c, np.ndarray):
                c = np.asarray(c)
            if c.ndim == 0:
                raise ValueError(f"array {k} is 0-d: ArrayDataset needs a leading sample axis")
            if c.dtype.hasobject:
                raise TypeError(f"array {k} has dtype object: ArrayDataset holds numeric arrays")
            if not isinstance(c, np.memmap) and not c.flags.c_contiguous:
                c = np.ascontiguousarray(c)
            fixed.append(c)
        n = len(fixed[0])
        for k, c in enumerate(fixed):
            if len(c) != n:
                raise ValueError(
                    f"arrays must share their first axis: array 0 has {n} rows, array {k} has "
                    f"{len(c)}"
                )
        self._cols = fixed
        self._n = n
        # A row of a string column is a 0-d array of the column's dtype, not an np.str_ whose
        # width is its text's: the batch has the column's width whatever the first row holds.
        self._text = [c.dtype.kind in "US" and c.ndim == 1 for c in fixed]

    def __len__(self) -> int:
        return self._n

    def _wrap(self, parts: list[Any]) -> Any:
        if self._keys is not None:
            return dict(zip(self._keys, parts))
        return parts[0] if self._single else tuple(parts)

    def __getitem__(self, i: int) -> Any:
        return self._wrap([c[i, ...] if s else c[i] for c, s in zip(self._cols, self._text)])

    def __getitems__(self, indices: list[int]) -> Any:
        """The whole batch, already stacked (one fancy-indexing gather per array)."""
        idx = np.asarray(indices, dtype=np.int64)
        return self._wrap([c[idx] for c in self._cols])

    def _fastload_columns(self) -> list[Any]:
        """The source arrays, in the leaf order of a sample (used by fastload's workers)."""
        return self._cols

    def __reduce__(self) -> Any:
        cols = [_MemmapRef(c) if isinstance(c, np.memmap) else c for c in self._cols]
        if self._keys is not None:
            return (_rebuild, (dict(zip(self._keys, cols)),))
        return (_rebuild, tuple(cols))

    def __repr__(self) -> str:
        parts = ", ".join(f"{c.dtype}{tuple(c.shape)}" for c in self._cols)
        return f"ArrayDataset({parts})"


def _rebuild(*cols: Any) -> ArrayDataset:
    return ArrayDataset(*cols)
