"""``share_dataset=True``: the workers' copy of a dataset, its large Python containers shared.

NOTE [shared datasets]
Before the workers start, the dataset object is walked: its attributes, one level into plain
lists / tuples / dicts among them, and the attributes of plain objects it holds (a wrapped
dataset, up to ``_MAX_DEPTH`` objects deep). A ``list``, ``tuple`` or ``dict`` (exactly those
types: a subclass may carry behaviour) of at least ``ITEMS`` items or an estimated ``BYTES``
bytes becomes a SharedList / SharedDict (NOTE [shared containers] in shared.py). The objects on
the way to it are shallow-copied (``copy.copy``) and the copy gets the shared container, so the
user's own dataset in the main process is never changed; the workers get the copy. A container
whose items cannot all be stored (an unpicklable item, a key type without a stable hash) is left
as it is, whole, and said at DEBUG level. A converted container changed later in a worker (say
in ``worker_init``) becomes a private copy in that worker, so such code keeps working with the
memory it used to cost.

Under fork this ends the copy-on-write growth: workers read the shared container, never the
user's list, whose pages stay shared. Under spawn and forkserver the pickled dataset holds
handles, not the data, so workers start without unpickling it.

Sharing never changes what a dataset does (the workers' copy must behave as the user's object):

- An object whose class has pickling of its own (``__getstate__``, ``__setstate__``,
  ``__reduce__`` or ``__reduce_ex__`` other than ``object``'s: the dataset, or an object it
  wraps) is left as it is, with nothing inside it shared: its pickling decides what a worker
  gets (say, memory-mapped files dropped and reopened lazily there), and a copy made attribute
  by attribute would run it in the main process (``copy.copy`` calls ``__getstate__``) or
  bypass it. It is said at DEBUG level and listed by ``unshared`` (``Loader.memory()``'s
  warning, ``python -m fastload doctor``) with the method that decided it.
- Arrays, ``np.memmap``, mmap objects and open files are never walked into or converted, nor
  is a container whose items (sampled) are file-backed: a container of memmaps is file pages
  already, and converting it would read every file into shared memory. Under fork a container
  of in-memory arrays is left too (reading an array never writes its data pages).
- A container's size is estimated from ``len()`` and ``sys.getsizeof`` of a sample of its items
  (one level into tuples, lists and dicts; arrays count 0): never by pickling its items.

Converted containers are ``list`` / ``dict`` subclasses whose own storage holds none of the
items (NOTE [shared containers]), so the dataset's code works on them as on what they replaced
(``isinstance``, ``json.dumps``, ``**d``); their ``copy()`` and ``+`` (``|``) give a plain list
(dict). ``share_dataset=False`` sends the dataset as it is.
"""

from __future__ import annotations

import copy
import io
import itertools
import logging
import mmap
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .shared import SharedDict, SharedList, release

__all__ = ["ITEMS", "BYTES", "Sharing", "share_dataset", "unshared"]

log = logging.getLogger("fastload")

#: A container this long, or estimated this large (sys.getsizeof of its items), is shared.
ITEMS = 10_000
BYTES = 16 << 20
_MAX_DEPTH = 3
_SAMPLE = 64  # items looked at to estimate a container's size or what its items are
#: The methods by which a class has pickling of its own (NOTE [shared datasets]).
_OWN_PICKLING = ("__getstate__", "__setstate__", "__reduce__", "__reduce_ex__")
_PLAIN = (list, tuple, dict)


@dataclass
class Sharing:
    """What share_dataset did: the workers' dataset, and what it converted or left alone."""

    dataset: Any
    converted: list[dict[str, Any]] = field(default_factory=list)
    left: list[dict[str, Any]] = field(default_factory=list)  # large, but kept as they were
    #: objects with pickling of their own, left as they are with nothing inside them shared
    kept: list[dict[str, Any]] = field(default_factory=list)
    shared: list[Any] = field(default_factory=list)
    enabled: bool = False

    def tag(self, owner: int) -> None:
        """Mark the containers made here as loader ``owner``'s (NOTE [shared containers] and
        _region.drop_inherited: other loaders' forked workers let go of them)."""
        for c in self.shared:
            c._region.owner = owner

    def close(self) -> None:
        """The loader is closed: no worker will attach again. Close every container's fds and
        mapping here (the workers' copy is not read in the main process)."""
        for c in self.shared:
            release(c)
        self.shared.clear()
        self.dataset = None


def share_dataset(dataset: Any, start_method: str, enabled: bool = True) -> Sharing:
    """The dataset the workers should get (the user's object if nothing was converted)."""
    out = Sharing(dataset, enabled=enabled)
    if enabled:
        walk = _Walk(out, start_method)
        if type(dataset) in (list, tuple):  # a list of samples is a dataset too
            out.dataset = walk.value(dataset, "dataset", 0, False)
        else:
            out.dataset = walk.obj(dataset, "dataset", 0)
    return out


def unshared(sharing: Sharing | None, dataset: Any) -> list[str]:
    """The large containers workers read as Python objects: those share_dataset left, or (with
    share_dataset=False) every one it would have shared, as "path (type of n items)"."""
    if sharing is not None and sharing.enabled:
        return [f"{e['attribute']} ({e['type']} of {e['items']:,} items: {e['reason']})"
                for e in sharing.left] + [f"{e['attribute']} ({e['type']}: {e['reason']})"
                                          for e in sharing.kept]
    found = Sharing(dataset)
    walk = _Walk(found, "pickled", dry=True)
    if type(dataset) in (list, tuple):
        walk.value(dataset, "dataset", 0, False)
    else:
        walk.obj(dataset, "dataset", 0)
    return [f"{e['attribute']} ({e['type']} of {e['items']:,} items)" for e in found.left]


def _sampled(c: Any, values: bool = False) -> list[Any]:
    """Up to _SAMPLE items of a container, spread over it (a dict's: its (key, value) pairs, or
    its values with ``values``), without copying a large container to take them."""
    n = len(c)
    if not n:
        return []
    step = max(1, n // _SAMPLE)
    if isinstance(c, dict):
        return list(itertools.islice(c.values() if values else c.items(), 0, None, step))[
            :_SAMPLE]
    return [c[i] for i in range(0, n, step)][:_SAMPLE]


def _estimate(c: Any) -> int:
    """Bytes the container's items take, from sys.getsizeof of a sample of them (one level into
    tuples, lists and dicts; an array counts 0). Never pickled: an item may be a memmap, whose
    pickle is its whole file, or an object whose pickling does work."""
    sample = _sampled(c)
    if not sample:
        return 0
    size = sum(_size_of(x) for x in sample)
    return size * len(c) // len(sample)


def _size_of(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return 0
    try:
        size = sys.getsizeof(x)
        if type(x) in (tuple, list):
            size += sum(sys.getsizeof(y) for y in x if not isinstance(y, np.ndarray))
        elif type(x) is dict:
            size += sum(sys.getsizeof(k) + (0 if isinstance(v, np.ndarray) else sys.getsizeof(v))
                        for k, v in x.items())
    except Exception:  # noqa: BLE001 - a __sizeof__ of theirs that raises: counted small
        return 64
    return int(size)


def _large(c: Any) -> bool:
    return len(c) >= ITEMS or _estimate(c) >= BYTES


def _of_arrays(c: Any) -> bool:
    """Whether a container's items are (or hold, one level down: a Chainer ``(image, label)``
    tuple) NumPy arrays, sampled. Under fork an array's data pages are never written by reading
    it (only its small header is), so sharing them would gain little and copy all the data
    once more."""
    vals = _sampled(c, values=True)
    return bool(vals) and all(_holds(x, _is_array) for x in vals)


def _of_files(c: Any) -> bool:
    """Whether any of a container's items (sampled; one level into tuples, lists and dicts) is
    file-backed: converting it would read the files into shared memory."""
    return any(_holds(x, _file_backed) for x in _sampled(c, values=True))


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def _file_backed(x: Any) -> bool:
    """An np.memmap (or a view of one, or of an mmap), an mmap, or an open file."""
    if isinstance(x, (mmap.mmap, io.IOBase)):
        return True
    depth = 0
    while isinstance(x, np.ndarray) and depth < 16:
        if isinstance(x, np.memmap) or isinstance(x.base, mmap.mmap):
            return True
        x, depth = x.base, depth + 1
    return False


def _holds(x: Any, test: Any) -> bool:
    """``test(x)``, or for a plain tuple, list or dict, ``test`` of any of its items."""
    if test(x):
        return True
    if type(x) in (tuple, list):
        return any(test(y) for y in x)
    if type(x) is dict:
        return any(test(y) for y in x.values())
    return False


def own_pickling(t: type) -> str | None:
    """The method by which class ``t`` has pickling of its own (not ``object``'s), or None."""
    for name in _OWN_PICKLING:
        mine = getattr(t, name, None)
        if mine is not None and mine is not getattr(object, name, None):
            return name
    return None


class _Walk:
    def __init__(self, out: Sharing, start_method: str, dry: bool = False) -> None:
        self.out, self.dry = out, dry
        self.fork = start_method == "fork"
        self.seen: set[int] = set()
        self.done: dict[int, Any] = {}  # id of a container -> what replaced it

    def value(self, v: Any, path: str, depth: int, into_plain: bool) -> Any:
        """v, or what replaces it in the workers' copy."""
        t = type(v)
        if t in _PLAIN:
            if id(v) in self.done:
                return self.done[id(v)]
            if _of_files(v):
                return v  # NOTE [shared datasets]: file pages already; never read into memory
            if _large(v) and not (self.fork and _of_arrays(v)):
                self.done[id(v)] = out = self.convert(v, path)
                return out
            if into_plain:  # one level into a plain container of attributes
                return self.plain(v, path, depth)
            return v
        if depth < _MAX_DEPTH and _is_plain_object(v):
            return self.obj(v, path, depth + 1)
        return v

    def convert(self, c: Any, path: str) -> Any:
        if self.dry:  # only say where the large containers are
            self.out.left.append({"attribute": path, "type": type(c).__name__, "items": len(c)})
            return c
        try:
            shared: SharedList | SharedDict = (
                SharedDict(c) if isinstance(c, dict) else SharedList(c))
        except Exception as e:
            # Only the text: a log record holding the exception would hold its frames, and the
            # loader being built in them, for as long as a handler keeps records.
            reason = f"{type(e).__name__}: {e}"
            log.debug("fastload: share_dataset left %s (%s of %d items) as it is: %s",
                      path, type(c).__name__, len(c), reason)
            self.out.left.append({"attribute": path, "type": type(c).__name__, "items": len(c),
                                  "reason": reason})
            return c
        shared._cow = True
        self.out.shared.append(shared)
        entry = {"attribute": path, "type": type(c).__name__, "items": len(c),
                 "bytes": shared.nbytes,
                 "kind": shared.kind if isinstance(shared, SharedList) else "dict"}
        log.debug("fastload: share_dataset shared %s", entry)
        self.out.converted.append(entry)
        return shared

    def plain(self, c: Any, path: str, depth: int) -> Any:
        if isinstance(c, dict):
            new = {k: self.value(v, f"{path}[{k!r}]", depth, False) for k, v in c.items()}
            changed = any(new[k] is not v for k, v in c.items())
            return new if changed else c
        items = [self.value(v, f"{path}[{i}]", depth, False) for i, v in enumerate(c)]
        if all(a is b for a, b in zip(items, c)):
            return c
        return type(c)(items)

    def obj(self, o: Any, path: str, depth: int) -> Any:
        if id(o) in self.seen or not _is_plain_object(o):
            return o
        self.seen.add(id(o))
        own = own_pickling(type(o))
        if own is not None:  # NOTE [shared datasets]: its pickling decides what workers get
            reason = (f"its class defines {own}: left as it is, nothing in it shared; its "
                      "pickling decides what workers get")
            log.debug("fastload: share_dataset left %s (%s) as it is: %s", path,
                      type(o).__qualname__, reason)
            self.out.kept.append({"attribute": path, "type": type(o).__qualname__,
                                  "reason": reason})
            return o
        attrs = vars(o)
        new = {}
        for name, v in list(attrs.items()):
            w = self.value(v, f"{path}.{name}", depth, True)
            if w is not v:
                new[name] = w
        if not new:
            return o
        try:
            clone = copy.copy(o)
        except Exception as e:
            log.debug("fastload: share_dataset cannot copy %s (%s: %s): left as it is", path,
                      type(e).__name__, e)
            return o
        if type(clone) is not type(o) or vars(clone) is attrs:
            return o
        vars(clone).update(new)  # not setattr: a property or __setattr__ of theirs is bypassed
        return clone


def _is_plain_object(o: Any) -> bool:
    """An instance of a Python class with a __dict__ (a dataset, a wrapper of one), not a
    module, class, function or anything of NumPy's."""
    if isinstance(o, type) or not hasattr(o, "__dict__"):
        return False
    mod = type(o).__module__ or ""
    if mod.startswith(("torch.utils.data", "fastload.compat")):  # Subset, front-end wrappers
        return True
    return mod.split(".")[0] not in _NOT_WALKED


#: Libraries whose objects are not walked into (their state is theirs, and a DataFrame or a tensor
#: is not a list of Python objects).
_NOT_WALKED = frozenset((
    "builtins", "types", "numpy", "pandas", "torch", "scipy", "pyarrow", "polars", "PIL", "h5py",
    "zarr", "cv2", "tensorflow", "jax", "sklearn", "threading", "multiprocessing", "logging",
    "io", "socket", "sqlite3", "ssl", "fastload", "_io", "_thread", "collections", "functools",
))
