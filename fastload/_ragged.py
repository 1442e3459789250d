"""Ragged leaves: arrays whose shape varies from sample to sample, zero-copy.

NOTE [ragged leaves]
``Loader(..., ragged=...)`` declares array leaves whose shape may vary (same dtype and number of
dimensions as in the first sample). The packer treats a declared leaf as it treats an object
leaf: it hands the sample's array to the fill path instead of writing a fixed row. When every
row of the batch is loaded, the worker writes the batch's *variable image* into the slot's
variable area, after the fixed rows:

    [u64: head length][head: pickle of (object leaves, ragged metadata)][pad to 64][data]

The head holds the batch's other object leaves and, per ragged leaf, the offset of its data and
the ``(B, ndim)`` shapes; the data holds each ragged leaf's values, written straight from the
samples (no pickle): concatenated for ``"list"`` and ``"packed"``, padded to ``(B, *extent)``
with ``pad_value`` for ``"pad"`` (the worker pads, not the consumer). The consumer reads the head
and builds views of the data: a list of arrays, :class:`Packed` or :class:`Padded`, in every
batch whether or not its shapes happened to vary.

A batch whose image does not fit the variable area (sized from the first sample, at most
``MAX_VAR_BYTES`` per slot) is not truncated: the worker sends the image over its pipe instead
(``stats()["spilled_batches"]``) and the consumer's views are of that copy.
"""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._pack import write_at, write_rows
from .errors import LayoutMismatchError

__all__ = ["Padded", "Packed", "SampleSpec", "RaggedLeaf", "VarImage", "RowError", "read_image",
           "MODES", "MAX_VAR_BYTES"]

MODES = ("list", "pad", "packed")
#: The most a slot's variable area is sized to hold; a larger batch travels over the pipe.
MAX_VAR_BYTES = 16 << 20
_HEAD = 8  # the u64 head length
_ALIGN = 64


def _align(x: int) -> int:
    return (x + _ALIGN - 1) // _ALIGN * _ALIGN


def _is_path(key: str) -> bool:
    """Whether a ``ragged=`` key is a leaf path as errors print it (``sample``,
    ``sample[...]``, ``sample.name``) rather than a top-level key such as ``"samples"``."""
    return key == "sample" or key.startswith(("sample[", "sample."))


#: How many names an error message lists before it counts the rest.
SHOWN = 8


def listing(names: list[str], shown: int = SHOWN, noun: str = "leaves") -> str:
    """``names`` for an error message, the first ``shown`` of them and a count of the rest: a
    sample of nested lists (an image as lists of lists of ints) has thousands of leaves, and
    listing them all made messages of 170 KB."""
    text = "[" + ", ".join(repr(n) for n in names[:shown])
    if len(names) <= shown:
        return text + "]"
    return f"{text}, ...] (... and {len(names) - shown:,} more {noun})"


class Padded(NamedTuple):
    """A ``"pad"`` leaf: ``values`` of shape ``(B, *extent)``, each sample in its corner and
    ``pad_value`` elsewhere; ``lengths`` int64: ``(B,)`` for a 1-d leaf (each sample's
    length), else ``(B, ndim)`` (each sample's shape)."""

    values: np.ndarray
    lengths: np.ndarray


class Packed(NamedTuple):
    """A ``"packed"`` leaf: the samples concatenated along axis 0 and ``offsets`` int64 of shape
    ``(B + 1,)``; sample ``r`` is ``values[offsets[r]:offsets[r + 1]]`` (``cu_seqlens``)."""

    values: np.ndarray
    offsets: np.ndarray


@dataclass(frozen=True)
class SampleSpec:
    """The validated ``ragged=``, ``pad_value=``, ``pad_to_multiple=`` and ``stack=`` of a
    Loader: how the first sample becomes a BatchLayout (None: every leaf stacked)."""

    modes: str | tuple[tuple[str, str], ...] | None  # one for all, (path, mode) pairs, or none
    pad_value: Any = 0
    pad_to_multiple: int = 1
    stack: bool = True

    @classmethod
    def build(cls, ragged: Any, pad_value: Any = 0, pad_to_multiple: Any = None,
              stack: bool = True) -> SampleSpec | None:
        if pad_to_multiple is not None and (
            isinstance(pad_to_multiple, bool) or not isinstance(pad_to_multiple, int)
            or pad_to_multiple < 1
        ):
            raise ValueError(
                f"pad_to_multiple must be None or an int >= 1, got {pad_to_multiple!r}")
        if not isinstance(pad_value, (int, float, complex, np.number, np.bool_)):
            raise TypeError(f"pad_value must be a number, got {type(pad_value).__name__}")
        if not isinstance(stack, bool):
            raise TypeError(f"stack must be True or False, got {stack!r}")
        if not stack:
            if ragged is not None:
                raise ValueError(
                    "ragged= does not apply with stack=False: each sample comes back with its "
                    "own arrays, whatever their shapes")
            return cls(None, pad_value, pad_to_multiple or 1, stack=False)
        if ragged is None:
            return None
        if isinstance(ragged, str):
            if ragged not in MODES:
                raise ValueError(f"ragged must be one of {MODES} or a dict of leaf -> mode, "
                                 f"got {ragged!r}")
            modes: str | tuple[tuple[str, str], ...] = ragged
        elif isinstance(ragged, Mapping):
            pairs = []
            for key, mode in ragged.items():
                if not isinstance(key, str):
                    raise TypeError(f"ragged: leaf names are strings (a path as errors print it, "
                                    f"e.g. \"sample['tokens']\", or a top-level key), got {key!r}")
                if mode not in MODES:
                    raise ValueError(f"ragged[{key!r}] must be one of {MODES}, got {mode!r}")
                path = key if _is_path(key) else f"sample[{key!r}]"
                pairs.append((path, str(mode)))
            modes = tuple(pairs)
        else:
            raise TypeError(f"ragged must be None, one of {MODES} or a dict of leaf -> mode, got "
                            f"{type(ragged).__name__}")
        return cls(modes, pad_value, pad_to_multiple or 1)

    def mode_of(self, path: str, a: np.ndarray) -> str | None:
        """The declared mode of the leaf at ``path`` whose first-sample array is ``a``."""
        if self.modes is None:
            return None
        if isinstance(self.modes, str):
            return self.modes if a.ndim >= 1 else None
        for p, mode in self.modes:
            if p == path:
                if a.ndim < 1:
                    raise LayoutMismatchError(
                        f"ragged: {path} is a 0-d value; only arrays of 1 or more dimensions can "
                        "vary in shape")
                return mode
        return None

    def check_used(self, found: list[str], leaves: list[str]) -> None:
        """Every named leaf must exist: a misspelt name would silently stack (or fail later)."""
        if self.modes is None or isinstance(self.modes, str):
            return
        missing = [p for p, _ in self.modes if p not in found]
        if missing:
            raise LayoutMismatchError(
                f"ragged names {missing}, which the first sample does not have as array leaves; "
                f"its leaves are {listing(leaves)}{_containers(missing, leaves)}")


def _containers(missing: list[str], leaves: list[str]) -> str:
    """What to do about a named leaf that is a list or tuple of leaves (an image as nested
    lists: a leaf per number)."""
    out = ""
    for path in missing:
        n = sum(leaf.startswith((path + "[", path + ".")) for leaf in leaves)
        if n:
            out += (f"; {path} is a list or tuple of {n:,} leaves, not an array: return it as "
                    "one array (np.asarray)")
    return out


@dataclass(frozen=True)
class RaggedLeaf:
    """A declared leaf, as the first sample showed it; ``obj``: its place among object leaves."""

    path: str
    mode: str
    dtype: np.dtype[Any]
    ndim: int
    obj: int
    pad_value: Any
    pad_to_multiple: int

    @property
    def pad_bytes(self) -> bytes:
        """``pad_value`` as one item of the leaf's dtype."""
        return np.array(self.pad_value, self.dtype).tobytes()


class RowError(Exception):
    """A row of the batch failed the ragged checks (the fill path names its sample index)."""

    def __init__(self, row: int, error: BaseException) -> None:
        super().__init__(row, error)
        self.row, self.error = row, error


def _check(leaf: RaggedLeaf, value: Any, row: int) -> np.ndarray:
    a = value if isinstance(value, np.ndarray) else None
    if a is None and hasattr(value, "__array__") and not isinstance(value, (str, bytes)):
        try:
            a = np.asarray(value)
        except Exception:
            a = None
    if a is None or a.dtype.hasobject:
        raise RowError(row, LayoutMismatchError(
            f"{leaf.path}: declared ragged ({leaf.mode!r}): expected an array of {leaf.dtype}, "
            f"got {type(value).__name__}"))
    if a.ndim != leaf.ndim or not np.can_cast(a.dtype, leaf.dtype, "equiv"):
        raise RowError(row, LayoutMismatchError(
            f"{leaf.path}: declared ragged ({leaf.mode!r}): the shape may vary, not the dtype or "
            f"the number of dimensions: expected {leaf.dtype} with {leaf.ndim} dimensions (as in "
            f"the first sample), got {a.dtype} with shape {a.shape}"))
    return a


class _Column(NamedTuple):
    leaf: RaggedLeaf
    arrays: list[np.ndarray]
    shapes: np.ndarray  # (B, ndim) int64
    extent: tuple[int, ...] | None  # "pad": the padded shape of one sample
    offset: int  # of its data, from the start of the data area


class _ArrayPickler(pickle.Pickler):
    """Pickles a batch's samples with every array (not of objects) left out, wherever it is
    (in dicts, lists, dict subclasses, user objects): the array goes to ``arrays`` and the
    pickle keeps its number (a persistent id)."""

    def __init__(self, file: Any, arrays: list[np.ndarray]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arrays = arrays
        self.seen: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:
        t = type(obj)
        if (t is np.ndarray or t is np.memmap) and not obj.dtype.hasobject:
            k = self.seen.get(id(obj))
            if k is None:  # the same array twice in a batch: one copy, two references
                k = self.seen[id(obj)] = len(self.arrays)
                self.arrays.append(obj if obj.flags.c_contiguous else np.ascontiguousarray(obj))
            return k
        return None


class _ArrayUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, views: list[np.ndarray]) -> None:
        super().__init__(file)
        self.views = views

    def persistent_load(self, pid: Any) -> np.ndarray:
        view: np.ndarray = self.views[pid]
        return view


#: Each array of an unstacked batch starts at a multiple of this (any dtype's alignment).
_ARRAY_ALIGN = 16


class _Unstacked:
    """NOTE [unstacked batches]: with ``stack=False`` the layout's one object leaf is the whole
    sample. The samples are pickled without their arrays (_ArrayPickler); the arrays go into the
    data area grouped by (dtype, shape), each group one contiguous block (64-aligned) of rows,
    and the head holds the pickle and each group's (offset, dtype, shape, array numbers). The
    consumer unpickles with each array replaced by a view, a row of its group's block: one
    ndarray per group, not per array, and its rows made in C (samples of a fixed shape cost
    about what stacked batches cost)."""

    def __init__(self, samples: list[Any]) -> None:
        arrays: list[np.ndarray] = []
        f = io.BytesIO()
        _ArrayPickler(f, arrays).dump(samples)
        self.pickled = f.getvalue()
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, a in enumerate(arrays):
            groups.setdefault((a.dtype, a.shape), []).append(i)
        ordered: list[np.ndarray] = []
        offsets: list[int] = []
        self.groups: list[tuple[int, Any, tuple[int, ...], list[int]]] = []
        end = 0
        for (dt, shape), ids in groups.items():
            end = _align(end)
            self.groups.append((end, dt if dt.fields is not None else dt.str, shape, ids))
            for i in ids:
                ordered.append(arrays[i])
                offsets.append(end)
                end += arrays[i].nbytes
        self.arrays = ordered  # in data-area order
        self.offsets = np.array(offsets, np.int64)
        self.count = len(arrays)
        self.nbytes = end

    def head(self) -> tuple[Any, ...]:
        return (self.pickled, self.count, self.groups)


def _samples_of(head: tuple[Any, ...], buf: Any, data: int) -> list[Any]:
    pickled, count, groups = head
    views: list[Any] = [None] * count
    for off, dt, shape, ids in groups:
        block = np.ndarray((len(ids), *shape), dt, buffer=buf, offset=data + off)
        rows = [block[r, ...] for r in range(len(ids))] if not shape else block
        for i, row in zip(ids, rows):
            views[i] = row
    samples: list[Any] = _ArrayUnpickler(io.BytesIO(pickled), views).load()
    return samples


class VarImage:
    """A batch's variable image (NOTE [ragged leaves]), built from the fill path's flat list of
    object leaves (row-major, ``n_objects`` per row; ragged leaves hold their arrays)."""

    def __init__(self, layout: Any, objects: list[Any], count: int,
                 in_process: bool = False) -> None:
        self.k = k = layout.n_objects  # object leaves per row
        self.count = count
        self.objects = objects
        self._head: bytes | None = None
        #: stack=False with num_workers=0, samples that cannot be pickled (a class defined in a
        #: function, a namedtuple not importable by name): handed over as deep copies instead,
        #: since nothing crosses a process (torch's num_workers=0 does not pickle either).
        self.as_copies = False
        self.unstacked: _Unstacked | None = None
        if not layout.stack:
            try:
                self.unstacked = _Unstacked(objects)
            except Exception as e:
                if not in_process:  # NOTE [unpicklable leaves]
                    raise _unpicklable(layout, objects, count, e) from e
                self.as_copies = True
        if not layout.stack:
            self.columns: list[_Column] = []
            self.data_bytes = self.unstacked.nbytes if self.unstacked is not None else 0
            return
        cols: list[_Column] = []
        end = 0
        for leaf in layout.ragged:
            dt, nd, j = leaf.dtype, leaf.ndim, leaf.obj
            arrays = []
            for r in range(count):
                v = objects[r * k + j]
                if not (type(v) is np.ndarray and v.dtype == dt and v.ndim == nd
                        and v.flags.c_contiguous):
                    # anything else: checked (or refused) the slow way, then made contiguous
                    v = np.ascontiguousarray(_check(leaf, v, r), dtype=dt)
                arrays.append(v)
            shapes = np.array([a.shape for a in arrays], np.int64).reshape(count, leaf.ndim)
            extent = None
            itemsize = dt.itemsize
            if leaf.mode == "pad":
                hi, lo = shapes.max(axis=0), shapes.min(axis=0)
                m = leaf.pad_to_multiple
                # A 1-d leaf's one axis is the one that varies: always rounded, even when the
                # batch's rows agree (a 1-row batch of 25 is 32 with m=16, not a new shape 25).
                # An axis of a leaf of more dimensions is rounded where the batch's rows differ:
                # one on which they agree may be fixed (channels), and is kept.
                extent = tuple(int(-(-h // m) * m) if m > 1 and (h != low or nd == 1) else int(h)
                               for h, low in zip(hi, lo))
                nbytes = count * math.prod(extent) * itemsize
            else:
                if leaf.mode == "packed" and nd > 1:
                    bad = np.nonzero((shapes[:, 1:] != shapes[0, 1:]).any(axis=1))[0]
                    if len(bad):
                        r = int(bad[0])
                        raise RowError(r, LayoutMismatchError(
                            f"{leaf.path}: declared 'packed', which concatenates the samples "
                            f"along axis 0, so their other axes must agree: shape "
                            f"{tuple(shapes[r])} here, {tuple(shapes[0])} in the batch's first "
                            "sample; declare it 'pad' or 'list' instead"))
                nbytes = int(shapes.prod(axis=1).sum()) * itemsize
            offset = _align(end)
            end = offset + nbytes
            cols.append(_Column(leaf, arrays, shapes, extent, offset))
        self.columns = cols
        self.data_bytes = end
        if not in_process:
            try:  # NOTE [unpicklable leaves]: pickled now, where an error is the batch's
                self.head()
            except Exception as e:
                raise _unpicklable(layout, objects, count, e) from e

    # -- a worker's image (pickled head + data) ----------------------------------------------
    def head(self) -> bytes:
        u = self.unstacked
        if self._head is None and u is not None:
            self._head = pickle.dumps((None, u.head()), protocol=pickle.HIGHEST_PROTOCOL)
        if self._head is None:
            plain, meta, k = list(self.objects), [], self.k
            for c in self.columns:
                for r in range(self.count):
                    plain[r * k + c.leaf.obj] = None
                meta.append((c.offset, c.shapes, c.extent))
            self._head = pickle.dumps((plain, meta), protocol=pickle.HIGHEST_PROTOCOL)
        return self._head

    @property
    def nbytes(self) -> int:
        return _align(_HEAD + len(self.head())) + self.data_bytes

    def write_into(self, buf: Any, start: int) -> None:
        """Write the image at ``buf[start:]`` (a writable buffer with ``nbytes`` room)."""
        head = self.head()
        mv = memoryview(buf).cast("B")
        mv[start:start + _HEAD] = len(head).to_bytes(_HEAD, "little")
        mv[start + _HEAD:start + _HEAD + len(head)] = head
        self.write_data(buf, start + _align(_HEAD + len(head)))

    # -- the data, shared by workers and num_workers=0 ---------------------------------------
    def write_data(self, buf: Any, start: int) -> None:
        if self.unstacked is not None:
            write_at(buf, start, self.unstacked.arrays, self.unstacked.offsets)
        for c in self.columns:
            leaf, base = c.leaf, start + c.offset
            if c.extent is not None and leaf.ndim == 1:  # in C: each sample, then its padding
                write_rows(buf, base, c.arrays, c.extent[0] * leaf.dtype.itemsize,
                           leaf.pad_bytes)
            elif c.extent is not None:
                out = np.ndarray((self.count, *c.extent), leaf.dtype, buffer=buf, offset=base)
                out.fill(leaf.pad_value)
                for r, a in enumerate(c.arrays):
                    out[(r,) + tuple(slice(0, s) for s in a.shape)] = a
            else:  # "list" and "packed": the samples' bytes one after the other, in C
                write_rows(buf, base, c.arrays, 0, b"")

    def local(self) -> tuple[list[Any], dict[int, Any]]:
        """num_workers=0: the object leaves as they are (not pickled) and the ragged leaves'
        values, in a buffer of their own."""
        if self.as_copies:
            import copy

            try:
                return copy.deepcopy(self.objects), {}
            except Exception:  # noqa: BLE001 - not copyable either: the samples themselves
                return list(self.objects), {}
        buf = np.empty(max(self.data_bytes, 1), np.uint8)
        self.write_data(buf, 0)
        if self.unstacked is not None:  # copied (pickled, arrays copied) as a worker's are
            return _samples_of(self.unstacked.head(), buf, 0), {}
        meta = [(c.offset, c.shapes, c.extent) for c in self.columns]
        return self.objects, _values([c.leaf for c in self.columns], meta, buf, 0, self.count)


#: How deep unpicklable_part looks into containers and attributes for the part that fails.
_FIND_DEPTH = 32


def _unpicklable(layout: Any, objects: list[Any], count: int, error: Exception) -> Exception:
    """NOTE [unpicklable leaves]
    A worker sends a batch's object leaves (with ``stack=False``, its samples) to the main
    process pickled, in the slot's variable image. That pickle is made inside the fill (the
    image's head, VarImage), so that a leaf pickle refuses (a lock, an open file, a
    memoryview, an instance of a class defined in a function) is an error of its batch, raised
    in the main process as any sample's error (NOTE [errors do not end the epoch] in _engine.py),
    and not an exception in the worker's loop, which would kill it. The error is a TypeError
    naming the sample index (the RowError's row), the part of the sample that failed (its path
    and type) and what to do. ``num_workers=0`` pickles nothing, and is unchanged.

    Returns the RowError of the first row and leaf that fail alone, or ``error`` itself when no
    single leaf fails (then the batch raises that)."""
    k = layout.n_objects
    paths = layout.object_paths
    ragged = {leaf.obj for leaf in layout.ragged}
    for r in range(count):
        for j in range(k):
            if j in ragged:
                continue
            found = unpicklable_part(objects[r * k + j], paths[j])
            if found is not None:
                return RowError(r, TypeError(_unpicklable_message(*found)))
    return error


def unpicklable_part(value: Any, path: str, depth: int = 0, seen: set[int] | None = None
                     ) -> tuple[str, Any, BaseException] | None:
    """The innermost part of ``value`` that pickle refuses, as (its path, it, the error), or
    None if ``value`` pickles. Arrays are not pickled (they travel as raw bytes). Each object
    is looked into once (``seen``): a structure that refers to itself is not walked again."""
    t = type(value)
    if (t is np.ndarray or t is np.memmap) and not value.dtype.hasobject:
        return None
    seen = set() if seen is None else seen
    if id(value) in seen:
        return None
    seen.add(id(value))
    try:
        pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return None
    except Exception as e:
        error: BaseException = e
    if depth < _FIND_DEPTH:
        parts: list[tuple[str, Any]] = []
        if isinstance(value, dict):
            parts = [(f"{path}[{key!r}]", v) for key, v in value.items()]
        elif isinstance(value, tuple) and hasattr(t, "_fields"):
            parts = [(f"{path}.{name}", v) for name, v in zip(t._fields, value)]
        elif isinstance(value, (list, tuple)):
            parts = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(getattr(value, "__dict__", None), dict):
            parts = [(f"{path}.{name}", v) for name, v in vars(value).items()]
        for p, v in parts:
            found = unpicklable_part(v, p, depth + 1, seen)
            if found is not None:
                return found
    return path, value, error


def _unpicklable_message(path: str, value: Any, error: BaseException) -> str:
    t = type(value)
    name = f"{t.__module__}.{t.__qualname__}"
    if isinstance(value, memoryview):
        todo = ("convert it: bytes(view), or np.asarray(view) (an array leaf, which travels "
                "without pickling)")
    elif "<locals>" in t.__qualname__ or isinstance(error, (pickle.PicklingError,
                                                            AttributeError)):
        todo = (f"define {t.__qualname__} at the top level of a module, where the main process "
                "can import it by name (pickle saves a class by its name), or return a "
                "dict, tuple or array instead")
    else:
        todo = ("return a picklable value instead (the data it holds, not the object), or give "
                "its class a __getstate__ or __reduce__ that leaves the unpicklable part out")
    return (f"{path} is a {name}, which cannot be pickled ({type(error).__name__}: {error}). "
            "A worker sends the Python objects of a sample (every leaf that is not an array) "
            f"to the main process pickled; {todo}. (num_workers=0 does not pickle samples, "
            "which is why it works there.)")


def read_image(layout: Any, buf: Any, start: int, count: int) -> tuple[list[Any], dict[int, Any]]:
    """Consumer side: (object leaves, {object index: ragged value}) of the image at
    ``buf[start:]``; ragged values are views of ``buf`` (which they keep alive)."""
    mv = memoryview(buf).cast("B")
    n = int.from_bytes(mv[start:start + _HEAD], "little")
    try:
        objects, meta = pickle.loads(mv[start + _HEAD:start + _HEAD + n])
    except Exception as e:  # NOTE [unpicklable leaves]: pickled there, not rebuilt here
        e.add_note("fastload: raised rebuilding the Python objects (the leaves that are not "
                   "arrays) of a batch a worker pickled: their class, or what its __reduce__ "
                   "returns, must be importable and callable in the main process too")
        raise
    data = start + _align(_HEAD + n)
    if not layout.stack:
        return _samples_of(meta, buf, data), {}
    return objects, _values(layout.ragged, meta, buf, data, count)


def _values(leaves: list[RaggedLeaf], meta: list[Any], buf: Any, data: int,
            count: int) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for leaf, (offset, shapes, extent) in zip(leaves, meta):
        base = data + offset
        if leaf.mode == "pad":
            values = np.ndarray((count, *extent), leaf.dtype, buffer=buf, offset=base)
            out[leaf.obj] = Padded(values, shapes[:, 0].copy() if leaf.ndim == 1 else shapes)
            continue
        sizes = shapes.prod(axis=1) * leaf.dtype.itemsize
        if leaf.mode == "packed":
            trailing = tuple(int(s) for s in shapes[0, 1:]) if count else ()
            offsets = np.zeros(count + 1, np.int64)
            np.cumsum(shapes[:, 0], out=offsets[1:])
            values = np.ndarray((int(offsets[-1]), *trailing), leaf.dtype, buffer=buf,
                                offset=base)
            out[leaf.obj] = Packed(values, offsets)
            continue
        views, o = [], base
        for r in range(count):
            views.append(np.ndarray(tuple(int(s) for s in shapes[r]), leaf.dtype, buffer=buf,
                                    offset=o))
            o += int(sizes[r])
        out[leaf.obj] = views
    return out
