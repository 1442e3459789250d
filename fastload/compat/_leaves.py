"""Leaf tags: how compat.torch brings back the leaf types a dataset returned.

fastload's batches hold arrays, dicts, lists, tuples and namedtuples (fastload/layout.py). A
leaf whose type stacking would lose (a torch tensor, a Python number, a 0-d array, an object
fastload must not look into) is wrapped by the worker in a one-key dict whose key is a tag
(``fastload.layout.TAG_PREFIX`` + a name). The packer stacks the tagged value as it would any
leaf; layout paths skip the tag, so an error names ``sample['x']``, never the tag; and the main
process unwraps every tag column by column (:func:`columns`) or, for torch's default collation,
in place.

NumPy only: workers import this module to unpickle :class:`Opaque`, under spawn too, without
importing torch. (compat.chainer needs no tags: its batches are unstacked, ``stack=False``.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastload.layout import TAG_PREFIX

__all__ = ["T_TENSOR", "T_PY", "T_0D", "T_OBJ", "Opaque", "encode", "tag_of", "columns"]

T_TENSOR = TAG_PREFIX + "tensor"  # a torch tensor, sent as its NumPy array
T_PY = TAG_PREFIX + "py"  # a Python bool / int / float / complex: stacked, back via .tolist()
T_0D = TAG_PREFIX + "0d"  # a 0-d array: stacked, back as 0-d views
T_OBJ = TAG_PREFIX + "obj"  # anything else, in an Opaque: pickled whole
_TAGS = frozenset({T_TENSOR, T_PY, T_0D, T_OBJ})
_PY_NUMBERS = (bool, int, float, complex)


class Opaque:
    """An object leaf fastload must not look into (a string, a dict subclass, an array-like):
    pickled whole, never walked, so it comes back as the very type the dataset returned."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (Opaque, (self.value,))


def encode(x: Any, tensor_type: type | None = None) -> Any:
    """Worker side: ``x`` with the leaves whose type stacking would lose tagged.

    Arrays and NumPy scalars are stacked as they are; Python numbers, 0-d arrays and tensors
    (instances of ``tensor_type``, sent as their NumPy array) are tagged; object arrays and
    anything that is not a container are opaque. Any tuple, list and dict is walked and comes
    back as the builtin type, as torch's collation gives; namedtuples keep their type.
    (compat.chainer needs none of this: its batches are unstacked, ``Loader(stack=False)``.)
    """
    if tensor_type is not None and isinstance(x, tensor_type):
        return {T_TENSOR: x.detach().cpu().numpy()}  # type: ignore[attr-defined]
    t = type(x)
    if t is np.ndarray or t is np.memmap:
        if x.dtype.hasobject:
            return {T_OBJ: Opaque(x)}
        return {T_0D: x} if x.ndim == 0 else x
    if isinstance(x, np.generic):
        return x  # stacked; a row of the batch is again a NumPy scalar of its dtype
    if t in _PY_NUMBERS:  # exactly: an IntEnum is opaque, and comes back as itself
        return {T_PY: x}
    if isinstance(x, tuple) and hasattr(t, "_fields"):  # a namedtuple: fastload keeps its type
        return t(*[encode(v, tensor_type) for v in x])
    if isinstance(x, tuple):
        return tuple([encode(v, tensor_type) for v in x])
    if isinstance(x, list):
        return [encode(v, tensor_type) for v in x]
    if isinstance(x, dict):
        return {k: encode(v, tensor_type) for k, v in x.items()}
    return {T_OBJ: Opaque(x)}


def tag_of(x: Any) -> str | None:
    """The tag of a tagged leaf (a one-key dict with a tag key), else None."""
    if type(x) is dict and len(x) == 1:
        k = next(iter(x))
        if k in _TAGS:
            return str(k)
    return None


def columns(x: Any, count: int,
            tensor_rows: Callable[[np.ndarray], Sequence[Any]] | None = None) -> Sequence[Any]:
    """Main side: the ``count`` per-sample items of one node of a batch, as the dataset returned
    them (views where they were arrays), built column by column: one Python call per node, not
    per sample, below the leaves. ``tensor_rows`` turns a ``T_TENSOR`` column into per-sample
    tensors (compat.torch)."""
    t = type(x)
    if t is np.ndarray:
        return x  # type: ignore[no-any-return]  # iterating gives row views
    if t is dict:
        tag = tag_of(x)
        if tag is not None:
            v = x[tag]
            if tag == T_OBJ:
                return [o.value for o in v]
            if tag == T_PY:
                # an int beyond int64 was packed as an object: a list already
                return v.tolist() if type(v) is np.ndarray else v  # type: ignore[no-any-return]
            if tag == T_0D:
                return [v[r, ...] for r in range(count)]
            assert tag == T_TENSOR and tensor_rows is not None, tag
            return tensor_rows(v)
        keys = list(x)
        if not keys:
            return [{} for _ in range(count)]
        cols = [columns(x[k], count, tensor_rows) for k in keys]
        return [dict(zip(keys, vals)) for vals in zip(*cols)]
    if isinstance(x, (tuple, list)):
        cols = [columns(v, count, tensor_rows) for v in x]
        if not cols:
            return [t() for _ in range(count)]
        if t is tuple:
            return list(zip(*cols))
        if t is list:
            return [list(vals) for vals in zip(*cols)]
        return [t._make(vals) for vals in zip(*cols)]  # a namedtuple
    raise TypeError(f"unexpected node {t.__name__} in a batch")  # pragma: no cover
