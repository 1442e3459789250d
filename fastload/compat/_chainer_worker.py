"""The worker side of fastload.compat.chainer, without Chainer.

Workers import this module to unpickle the dataset wrapper; keeping Chainer out of it spares
each spawn/forkserver worker Chainer's import (about a second).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Leaf tags, added in the worker and removed in the main process (one dict level each), so that
# every sample comes back with the leaf types the dataset returned.
_T_PY = "\x00fastload.py"  # a Python bool / int / float / complex: stacked, back via .tolist()
_T_0D = "\x00fastload.0d"  # a 0-d array: stacked, back as a 0-d view
_T_OBJ = "\x00fastload.obj"  # anything else, in an _Opaque: pickled whole, as Chainer's pool does
_PY_NUMBERS = (bool, int, float, complex)


class _Opaque:
    """An object leaf fastload must not look into (a dict subclass, an array-like, ...)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Opaque, (self.value,))


def _encode(x: Any) -> Any:
    """Worker side: tag the leaves whose type stacking would lose (see the tags above)."""
    t = type(x)
    if t is np.ndarray or t is np.memmap:
        if x.dtype.hasobject:
            return {_T_OBJ: _Opaque(x)}
        return {_T_0D: x} if x.ndim == 0 else x
    if isinstance(x, np.generic):
        return x  # stacked; a row of the batch is again a NumPy scalar of its dtype
    if t in _PY_NUMBERS:
        return {_T_PY: x}
    if t is tuple:
        return tuple([_encode(v) for v in x])
    if t is list:
        return [_encode(v) for v in x]
    if t is dict:
        return {k: _encode(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(t, "_fields"):  # a namedtuple: fastload keeps its type
        return t(*[_encode(v) for v in x])
    return {_T_OBJ: _Opaque(x)}


class _ChainerDataset:
    """Picklable wrapper run in the workers: Chainer's index type, leaves tagged."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        # Chainer indexes with the elements of its index arrays (numpy.intp), not Python ints.
        return _encode(self.dataset[np.intp(index)])


