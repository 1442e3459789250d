"""BatchLayout: from the first sample to the byte layout of a slot (pure Python).

NOTE [slot payload layout]
A slot holds one batch. Its payload is, in order, each region aligned to ``ALIGN`` bytes:

1. the task: the batch's sample indices, ``batch_size`` int64, then the loader's seed (one
   int64, for ``sample_rng``), written by the parent and read by workers;
2. one region per array leaf, ``batch_size`` rows of ``itemsize * prod(shape)`` bytes;
3. the variable area, holding the batch's variable image (NOTE [ragged leaves] in
   fastload/_ragged.py): its object leaves (strings, arbitrary Python objects) pickled once per
   batch, its ragged leaves' values, or with ``stack=False`` its samples; an image that does not
   fit is sent to the parent in a memfd of its own, or over the worker's pipe where there is no
   memfd (counted in ``Loader.stats()["spilled_batches"]``).

The structure of a sample (tuples, lists, dicts, namedtuples, nested to any depth) is kept as a
``tree`` of small tuples that the compiled packer walks; arrays in a batch are views into the slot
stacked on a new leading axis, exactly ``np.stack`` of the samples' leaves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ._ragged import MAX_VAR_BYTES, RaggedLeaf, SampleSpec, _Unstacked
from .errors import LayoutMismatchError

__all__ = ["BatchLayout", "Field", "ALIGN", "TAG_PREFIX"]

#: Alignment of every region inside a slot (a cache line; SIMD loads stay aligned).
ALIGN = 64
#: Smallest variable area reserved when a sample has object leaves.
MIN_VAR_BYTES = 64 * 1024
#: Smallest room per row of a ragged leaf in the variable area (fastload/_ragged.py).
MIN_RAGGED_ROW_BYTES = 16 * 1024
#: Slots are rounded up to whole pages so that large copies start page-aligned.
PAGE = 4096

#: A one-key dict whose key starts with this is a front end's wrapper of one leaf (see
#: fastload/compat/_leaves.py): it is packed as any dict, but paths skip its key, so that errors
#: name the leaf as the user's dataset returned it.
TAG_PREFIX = "\x00fastload."

# Node kinds (must match fastload/_pack.pyx).
N_TUPLE, N_LIST, N_DICT, N_NAMEDTUPLE, N_ARRAY, N_OBJECT = range(6)


def _align(x: int, a: int = ALIGN) -> int:
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class Field:
    """One leaf of a sample: where it sits in the sample, and where its rows sit in a slot."""

    path: str
    dtype: np.dtype[Any] | None  # None for an object leaf
    shape: tuple[int, ...]
    offset: int  # from the start of the slot payload (array leaves)
    row_bytes: int

    @property
    def is_object(self) -> bool:
        return self.dtype is None


def _is_namedtuple(x: object) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _leaf_array(x: object) -> np.ndarray[Any, Any] | None:
    """The array a leaf packs as, or None for an object leaf (packed by pickle)."""
    if isinstance(x, np.ndarray):
        return None if x.dtype.hasobject else x
    if isinstance(x, (str, bytes)):
        return None  # np.str_ / np.bytes_ too: their width varies with the text, as a str's
    if isinstance(x, np.generic):
        a = np.asarray(x)
        return None if a.dtype.hasobject else a
    if type(x) is bool:
        return np.asarray(x, dtype=np.bool_)
    if type(x) is int:
        try:
            return np.asarray(x, dtype=np.int64)
        except OverflowError:
            return None
    if type(x) is float:
        return np.asarray(x, dtype=np.float64)
    if type(x) is complex:
        return np.asarray(x, dtype=np.complex128)
    if hasattr(x, "__array__") and not isinstance(x, (str, bytes)):
        # Array-likes from other libraries (e.g. a CPU torch tensor).
        try:
            a = np.asarray(x)
        except Exception:
            return None
        return None if a.dtype.hasobject else a
    return None


class BatchLayout:
    """The layout of one slot, computed from the first sample.

    Parameters
    ----------
    sample : object
        The first sample: an array, a scalar or a nested tuple / list / dict / namedtuple of them.
    batch_size : int
        Rows per slot.

    Examples
    --------
    >>> import numpy as np
    >>> lay = BatchLayout((np.zeros((2, 3), np.float32), 7), batch_size=4)
    >>> [(f.path, str(f.dtype), f.shape) for f in lay.fields]
    [('sample[0]', 'float32', (2, 3)), ('sample[1]', 'int64', ())]
    """

    #: Whether the global RNGs are seeded before each sample of the loader's batches (NOTE
    #: [global RNGs] in fastload/_rngs.py): set by the probe, read by every filler.
    global_rng = False

    def __init__(self, sample: object, batch_size: int, spec: SampleSpec | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.fields: list[Field] = []  # array leaves, in tree order
        self.object_paths: list[str] = []  # object leaves (and ragged leaves), in tree order
        self.ragged: list[RaggedLeaf] = []  # NOTE [ragged leaves] (fastload/_ragged.py)
        self._spec = spec
        self._array_paths: list[str] = []
        self._offset = _align(8 * (batch_size + 1))  # after the task header + index area
        self.stack = spec is None or spec.stack
        if self.stack:
            self.tree = self._build(sample, "sample", depth=0)
        else:  # NOTE [unstacked batches] (fastload/_ragged.py): the sample is the one leaf
            self.object_paths.append("sample")
            self.tree = (N_OBJECT, "sample", 0)
        if spec is not None:
            spec.check_used([r.path for r in self.ragged], self._array_paths)
        self._flat_v = self._flat()  # unpack's fast path
        self.index_offset = 0
        self.seed_offset = 8 * batch_size  # int64: the loader's seed when the batch was queued
        self.var_offset = self._offset
        self.var_bytes = 0
        if self.object_paths:
            import pickle

            objs: list[object] = []
            self._collect_objects(self.tree, sample, objs)
            ragged_bytes = 0
            if not self.stack:  # its arrays travel as ragged values do
                try:
                    unstacked = _Unstacked([sample])
                except Exception:  # its batch will say what cannot be pickled
                    unstacked = None
                if unstacked is not None:
                    ragged_bytes = sum(max(2 * a.nbytes, 1024) + 16 for a in unstacked.arrays)
                    ragged_bytes = max(ragged_bytes, MIN_RAGGED_ROW_BYTES // 2)
                    objs = [unstacked.pickled]
            for leaf in self.ragged:  # the first sample says little of the longest: room for
                # 4x it, and at least MIN_RAGGED_ROW_BYTES per row
                first = int(np.asarray(objs[leaf.obj]).nbytes)
                ragged_bytes += max(2 * first, MIN_RAGGED_ROW_BYTES // 2) + ALIGN
                objs[leaf.obj] = None
            try:
                per_sample = len(pickle.dumps(objs, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception:
                per_sample = 1024
            # Room for twice the first sample's objects and ragged values per row (a longer
            # sample, padding); a batch that needs more travels over the pipe (_ragged.py).
            want = 2 * (per_sample + ragged_bytes) * batch_size + 1024
            self.var_bytes = _align(max(MIN_VAR_BYTES, min(want, MAX_VAR_BYTES)))
        self.slot_bytes = _align(self.var_offset + self.var_bytes, PAGE)

    # -- construction ------------------------------------------------------------------------
    def _build(self, x: object, path: str, depth: int) -> tuple[Any, ...]:
        if depth > 64:
            raise LayoutMismatchError(f"{path}: sample nested deeper than 64 levels")
        if _is_namedtuple(x):
            t = cast("tuple[Any, ...]", x)
            kids = tuple(
                self._build(v, f"{path}.{name}", depth + 1)
                for name, v in zip(type(x)._fields, t)  # type: ignore[attr-defined]
            )
            return (N_NAMEDTUPLE, path, kids, type(x))
        if isinstance(x, (tuple, list)):
            kind = N_TUPLE if isinstance(x, tuple) else N_LIST
            kids = tuple(self._build(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(x))
            return (kind, path, kids)
        if isinstance(x, dict):
            keys = tuple(x.keys())
            if len(keys) == 1 and isinstance(keys[0], str) and keys[0].startswith(TAG_PREFIX):
                return (N_DICT, path, (self._build(x[keys[0]], path, depth + 1),), keys)
            kids = tuple(self._build(x[k], f"{path}[{k!r}]", depth + 1) for k in keys)
            return (N_DICT, path, kids, keys)
        a = _leaf_array(x)
        if a is None:
            self.object_paths.append(path)
            return (N_OBJECT, path, len(self.object_paths) - 1)
        self._array_paths.append(path)
        mode = self._spec.mode_of(path, a) if self._spec is not None else None
        if mode is not None:  # the packer hands it over as it does an object leaf
            self.object_paths.append(path)
            dt = np.dtype(a.dtype.newbyteorder("=") if a.dtype.byteorder == ">" else a.dtype)
            spec = self._spec
            assert spec is not None
            leaf = RaggedLeaf(path, mode, dt, a.ndim, len(self.object_paths) - 1,
                              spec.pad_value, spec.pad_to_multiple)
            if mode == "pad":
                try:
                    leaf.pad_bytes  # noqa: B018  (can pad_value be one of its items?)
                except (OverflowError, ValueError, TypeError) as e:
                    raise LayoutMismatchError(
                        f"{path}: pad_value={spec.pad_value!r} is not a value of its dtype {dt} "
                        f"({e})") from None
            self.ragged.append(leaf)
            return (N_OBJECT, path, len(self.object_paths) - 1)
        dt = a.dtype.newbyteorder("=") if a.dtype.byteorder not in ("=", "|") else a.dtype
        dt = np.dtype(dt)
        row_bytes = int(dt.itemsize * math.prod(a.shape))
        offset = self._offset
        self._offset = _align(offset + row_bytes * self.batch_size)
        self.fields.append(Field(path, dt, tuple(int(s) for s in a.shape), offset, row_bytes))
        return (N_ARRAY, path, len(self.fields) - 1)

    def _collect_objects(self, node: tuple[Any, ...], x: Any, out: list[object]) -> None:
        kind = node[0]
        if kind == N_OBJECT:
            out.append(x)
        elif kind in (N_TUPLE, N_LIST, N_NAMEDTUPLE):
            for child, v in zip(node[2], x):
                self._collect_objects(child, v, out)
        elif kind == N_DICT:
            for child, k in zip(node[2], node[3]):
                self._collect_objects(child, x[k], out)

    def check_picklable(self) -> None:
        """Raise TypeError if this layout cannot be sent to the main process: a worker sends
        the layout it found pickled, and the layout holds the class of each namedtuple of the
        sample (to build batches of it), which pickle saves by name (NOTE [unpicklable leaves]
        in fastload/_ragged.py)."""
        import pickle

        try:
            pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)
            return
        except Exception as e:
            error = e
        for path, cls in self._namedtuple_types(self.tree):
            try:
                pickle.dumps(cls, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                raise TypeError(
                    f"{path} is a namedtuple of class {cls.__module__}.{cls.__qualname__}, "
                    f"which cannot be pickled ({type(e).__name__}: {e}). A worker sends the "
                    "sample's structure to the main process, which builds batches of that "
                    "class; pickle saves a class by its name, so define the namedtuple at the "
                    "top level of a module, where the main process can import it (or return "
                    "a tuple or dict instead). (num_workers=0 does not pickle it, which is why "
                    "it works there.)"
                ) from e
        raise error

    def _namedtuple_types(self, node: tuple[Any, ...]) -> list[tuple[str, type]]:
        kind = node[0]
        if kind in (N_ARRAY, N_OBJECT):
            return []
        found = [(node[1], node[3])] if kind == N_NAMEDTUPLE else []
        for child in node[2]:
            found += self._namedtuple_types(child)
        return found

    # -- use ---------------------------------------------------------------------------------
    @property
    def packer_fields(self) -> list[tuple[int, int, np.dtype[Any], tuple[int, ...]]]:
        return [(f.offset, f.row_bytes, f.dtype, f.shape) for f in self.fields]  # type: ignore[misc]

    @property
    def n_objects(self) -> int:
        return len(self.object_paths)

    def unpack(self, buf: Any, count: int, objects: list[object] | None,
               ragged: dict[int, Any] | None = None) -> Any:
        """Build the batch: the sample's structure with each leaf stacked on a new axis.

        ``buf`` exports the slot payload (a SlotLease or any buffer); arrays are views into it.
        ``objects`` is the flat list of the batch's object leaves (``count * n_objects``);
        ``ragged`` the built values of the ragged leaves, by object index (_ragged.py).
        """
        arrays = [
            np.ndarray((count, *f.shape), f.dtype, buffer=buf, offset=f.offset)
            for f in self.fields
        ]
        flat = self._flat_v
        if flat is not None:  # arrays only, one level (the hot path): no walk of the tree
            kind, node = flat
            return arrays[0] if kind == N_ARRAY else _container(node, arrays)
        return self._assemble(self.tree, arrays, objects, count, ragged or {})

    def _flat(self) -> tuple[int, tuple[Any, ...]] | None:
        """(kind, node) of a tree that is one array, or one container of the arrays in field
        order; None otherwise (kept in ``_flat_v`` for ``unpack``)."""
        node, out = self.tree, None
        if node[0] == N_ARRAY:
            out = (N_ARRAY, node)
        elif node[0] in (N_TUPLE, N_LIST, N_NAMEDTUPLE, N_DICT) and all(
                c[0] == N_ARRAY and c[2] == k for k, c in enumerate(node[2])) and len(
                node[2]) == len(self.fields):
            out = (node[0], node)
        return out

    def _assemble(self, node: tuple[Any, ...], arrays: list[Any], objects: Any, count: int,
                  ragged: dict[int, Any]) -> Any:
        kind = node[0]
        if kind == N_ARRAY:
            return arrays[node[2]]
        if kind == N_OBJECT:
            k, j = self.n_objects, node[2]
            if j in ragged:
                return ragged[j]
            return [objects[r * k + j] for r in range(count)]
        return _container(node, [self._assemble(c, arrays, objects, count, ragged)
                                 for c in node[2]])

    def describe_size(self) -> str:
        """A sample's size in a slot, for error messages."""
        rows = sum(f.row_bytes for f in self.fields)
        extra = f" + {self.var_bytes / 2**20:,.2f} MiB of room for objects per slot" \
            if self.var_bytes else ""
        return f"{rows:,} bytes{extra}"

    def describe(self) -> str:
        """One line per leaf, for error messages and ``repr``."""
        lines = [f"  {f.path}: {f.dtype} {f.shape}" for f in self.fields]
        modes = {r.path: r for r in self.ragged}
        lines += [f"  {p}: {modes[p].dtype} ragged, {modes[p].ndim}-d ({modes[p].mode!r})"
                  if p in modes else f"  {p}: Python object (pickled)" for p in self.object_paths]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"BatchLayout(batch_size={self.batch_size}, slot_bytes={self.slot_bytes},"
            f" fields=\n{self.describe()})"
        )


def _container(node: tuple[Any, ...], kids: list[Any]) -> Any:
    """The tuple, list, namedtuple or dict of tree ``node`` holding ``kids``."""
    kind = node[0]
    if kind == N_TUPLE:
        return tuple(kids)
    if kind == N_LIST:
        return kids
    if kind == N_NAMEDTUPLE:
        return node[3](*kids)
    return dict(zip(node[3], kids))
