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
"""

from __future__ import annotations

import copy
import logging
import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .shared import SharedDict, SharedList, release

__all__ = ["ITEMS", "BYTES", "Sharing", "share_dataset", "unshared"]

log = logging.getLogger("fastload")

#: A container this long, or estimated this large when pickled, is shared.
ITEMS = 10_000
BYTES = 16 << 20
_MAX_DEPTH = 3
_SAMPLE = 64  # items pickled to estimate a container's size
_PLAIN = (list, tuple, dict)


@dataclass
class Sharing:
    """What share_dataset did: the workers' dataset, and what it converted or left alone."""

    dataset: Any
    converted: list[dict[str, Any]] = field(default_factory=list)
    left: list[dict[str, Any]] = field(default_factory=list)  # large, but kept as they were
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
                for e in sharing.left]
    found = Sharing(dataset)
    walk = _Walk(found, "pickled", dry=True)
    if type(dataset) in (list, tuple):
        walk.value(dataset, "dataset", 0, False)
    else:
        walk.obj(dataset, "dataset", 0)
    return [f"{e['attribute']} ({e['type']} of {e['items']:,} items)" for e in found.left]


def _estimate(c: Any) -> int:
    """Bytes the container would take pickled, from a sample of its items."""
    n = len(c)
    if not n:
        return 0
    items = list(c.items()) if isinstance(c, dict) else c
    step = max(1, n // _SAMPLE)
    sample = [items[i] for i in range(0, n, step)][:_SAMPLE]
    try:
        size = sum(len(pickle.dumps(x, pickle.HIGHEST_PROTOCOL)) for x in sample)
    except Exception:
        return 0
    return size * n // len(sample)


def _large(c: Any) -> bool:
    return len(c) >= ITEMS or _estimate(c) >= BYTES


def _of_arrays(c: Any) -> bool:
    """Whether a container's items are (or hold, one level down: a Chainer ``(image, label)``
    tuple) NumPy arrays, sampled. Under fork an array's data pages are never written by reading
    it (only its small header is), so sharing them would gain little and copy all the data
    once more."""
    vals = list(c.values()) if isinstance(c, dict) else c
    step = max(1, len(vals) // _SAMPLE)
    return bool(vals) and all(_holds_array(vals[i]) for i in range(0, len(vals), step))


def _holds_array(x: Any) -> bool:
    if type(x) is np.ndarray:
        return True
    if type(x) in (tuple, list):
        return any(type(y) is np.ndarray for y in x)
    if type(x) is dict:
        return any(type(y) is np.ndarray for y in x.values())
    return False


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
