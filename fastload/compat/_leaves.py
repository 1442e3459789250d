"""Leaf tags: compat.torch's default collation of leaves fastload does not stack.

With torch's default collate, compat.torch stacks samples as fastload does (arrays and tensors
become tensors; dicts, lists and namedtuples keep their structure). A leaf fastload does not
stack (a string, None, an IntEnum, an object array) comes back as a per-batch list, which in a
batch is indistinguishable from a list in the sample: the worker wraps such a leaf in a one-key
dict whose key is a tag (``fastload.layout.TAG_PREFIX`` + "obj") and whose value is an
:class:`Opaque`; layout paths skip the tag, so errors name ``sample['x']``, never the tag; the
main process hands the values to torch's default_collate rules. (A custom ``collate_fn`` and
compat.chainer need no tags: their batches are unstacked, ``Loader(stack=False)``.)

NumPy only: workers import this module to unpickle :class:`Opaque`, under spawn too, without
importing torch.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from fastload.layout import TAG_PREFIX

__all__ = ["T_OBJ", "Opaque", "encode", "tag_of"]

T_OBJ = TAG_PREFIX + "obj"  # a leaf fastload does not stack, in an Opaque: pickled whole
#: A dict subclass's own type (defaultdict, OrderedDict, the user's): an empty copy of it, an
#: Opaque leaf beside its items, which the main side copies and fills as torch's collate does
T_MAP = TAG_PREFIX + "map"
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
    """Worker side: ``x`` ready to be stacked by torch's rules.

    Tensors (instances of ``tensor_type``) become their NumPy arrays; arrays, NumPy scalars and
    exact Python numbers are stacked as they are; anything else that is not a container (a
    string, None, an IntEnum, an object array) is opaque, so that torch's default_collate rules
    decide what it becomes. Any tuple, list and dict is walked and comes back as the builtin
    type, as torch's collation gives; namedtuples keep their type.
    """
    if tensor_type is not None and isinstance(x, tensor_type):
        if getattr(x, "is_nested", False):  # torch's default_collate refuses them so
            raise RuntimeError(
                "Batches of nested tensors are not currently supported by the default "
                "collate_fn; please provide a custom collate_fn to handle them appropriately.")
        return x.detach().cpu().numpy()  # type: ignore[attr-defined]
    t = type(x)
    if t is np.ndarray or t is np.memmap:
        return {T_OBJ: Opaque(x)} if x.dtype.hasobject else x
    if isinstance(x, np.generic) or t in _PY_NUMBERS:
        return x
    if isinstance(x, tuple) and hasattr(t, "_fields"):  # a namedtuple: fastload keeps its type
        return t(*[encode(v, tensor_type) for v in x])
    if isinstance(x, tuple):
        return tuple([encode(v, tensor_type) for v in x])
    if isinstance(x, list):
        return [encode(v, tensor_type) for v in x]
    if isinstance(x, dict):
        out = {k: encode(v, tensor_type) for k, v in x.items()}
        if t is not dict:  # torch keeps a mutable mapping's type: copy.copy, then update
            empty = copy.copy(x)
            empty.clear()
            out[T_MAP] = {T_OBJ: Opaque(empty)}
        return out
    return {T_OBJ: Opaque(x)}


def tag_of(x: Any) -> str | None:
    """The tag of a tagged leaf (a one-key dict with a tag key), else None."""
    if type(x) is dict and len(x) == 1:
        k = next(iter(x))
        if k == T_OBJ:
            return T_OBJ
    return None
