"""SharedList and SharedDict: read-only containers whose contents live in one shared region.

NOTE [shared containers]
A dataset that keeps its metadata in Python lists and dicts is copied into every worker: under
fork because reading an object writes its reference count (so each page it touches is copied,
pytorch/pytorch#13246), under spawn and forkserver because it is pickled to each. A shared
container holds the same items as flat arrays in one anonymous memfd, built once in the parent:

- a *column* when every item agrees: ``int`` (int64), ``float`` (float64), ``bool``, NumPy
  scalars of one dtype, NumPy arrays of one dtype and shape (one ``(n, *shape)`` array);
- an *arena* + int64 offsets for ``str`` (UTF-8) and ``bytes``;
- otherwise each item pickled into an arena (+ offsets).

A read decodes one item into a new Python object; nothing in the region is written after it is
built, so no page of it is ever copied, and a worker's private memory does not grow with what it
reads. A SharedDict is its keys and values as two such sequences plus an open-addressing table of
key hashes (int64), probed from the region: no Python dict of the keys exists in a worker. The
hash of a key is computed by fastload (CRC-32 of its UTF-8 or bytes, ``hash()`` of numbers, which
Python does not randomise), so it is the same in every process whatever PYTHONHASHSEED is.

Pickling a container pickles a handle: the builder's pid, the fd of its memfd, and a random token
written at the start of the region. A process of the same user attaches by opening
``/proc/<pid>/fd/<fd>`` (Linux), mapping it read-only and checking the token, so it works however
the container travels: fastload's workers under fork, forkserver and spawn, a torch DataLoader, a
multiprocessing Pool. The builder keeps the fd until the container is freed (share_dataset's
containers: until their loader closes); a reader keeps its read-only mapping, and the one fd
Python's mmap holds with it, while it holds the container. Nothing has a name, so nothing is left
after a crash. Where there is no /proc (macOS)
a container pickles as its items, like the list or dict it came from.

A SharedList is a ``list`` and a SharedDict a ``dict`` (subclasses), so that a dataset's own
code behaves as with the list or dict share_dataset replaced: ``isinstance(x, list)``,
``json.dumps``, ``copy()``, ``[0] + x``, ``{**d}``, ``dict(d)``, ``f(**d)``. Their list / dict
storage holds none of the items: every method that reads is overridden to read the region, and
CPython's C code reaches a subclass through those methods (``PySequence_Fast``, ``list.extend``
and ``dict.update`` iterate any subclass that overrides ``__iter__``; ``list + x`` and ``x ==
list`` try the subclass's reflected method first). One exception: json's C encoder writes
``{}`` for a dict whose storage is empty without calling ``items()``, so a SharedDict's storage
holds one private sentinel key (``_STORED``), which no overridden method shows. What still sees
the storage are unbound calls on the base type (``dict.keys(d)``, ``list.__len__(x)``) and C
functions that require an exact list or dict (``exec``'s globals): documented.
"""

from __future__ import annotations

import logging
import mmap
import operator
import os
import pickle
import secrets
import weakref
import zlib
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any

import numpy as np

__all__ = ["SharedList", "SharedDict"]

log = logging.getLogger("fastload")

_MAGIC = b"FLSHARE1"
_HEAD = 32  # magic (8) + token (16) + reserved
_ALIGN = 64
_HAVE_PROC = os.path.isdir("/proc/self/fd")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_MASK = 0xFFFFFFFFFFFFFFFF


def _read_only(what: str) -> TypeError:
    return TypeError(
        f"fastload.{what} is read-only: its items live in shared memory that every worker reads. "
        f"Change the data before building the {what} (or the Loader), or keep a plain "
        f"{'list' if what == 'SharedList' else 'dict'} (Loader(..., share_dataset=False))"
    )


# -- building ------------------------------------------------------------------------------------
def _column(items: list[Any]) -> tuple[str, Any] | None:
    """(kind, array) when every item agrees on one fixed-size type, else None."""
    if not items:
        return None
    t = type(items[0])
    if any(type(x) is not t for x in items):
        return None
    if t is bool:
        return "bool", np.array(items, dtype=np.bool_)
    if t is int:
        lo, hi = min(items), max(items)
        if _INT64[0] <= lo and hi <= _INT64[1]:
            return "int", np.array(items, dtype=np.int64)
        return None
    if t is float:
        return "float", np.array(items, dtype=np.float64)
    if issubclass(t, np.generic) and not isinstance(items[0], (np.str_, np.bytes_, np.void)):
        dt = items[0].dtype
        if dt.kind == "O" or any(x.dtype != dt for x in items):
            return None
        return "scalar", np.array(items, dtype=dt)
    if t is np.ndarray:
        a0 = items[0]
        if a0.dtype.kind == "O" or a0.dtype.fields is not None:
            return None
        if any(x.dtype != a0.dtype or x.shape != a0.shape for x in items):
            return None
        return "array", np.stack(items) if a0.ndim else np.array(items, dtype=a0.dtype)
    return None


def _arena(items: list[Any]) -> tuple[str, bytes, Any]:
    """(kind, joined bytes, offsets) for str, bytes or pickled items."""
    if items and all(type(x) is str for x in items):
        kind, parts = "str", [x.encode("utf-8", "surrogatepass") for x in items]
    elif items and all(type(x) is bytes for x in items):
        kind, parts = "bytes", items
    else:
        kind, parts = "pickle", [pickle.dumps(x, pickle.HIGHEST_PROTOCOL) for x in items]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    return kind, b"".join(parts), offsets


def _hash(key: Any) -> int:
    """A hash of a key equal in every process (str/bytes hashes are randomised per process)."""
    if isinstance(key, str):
        return zlib.crc32(str.encode(key, "utf-8", "surrogatepass")) * 0x9E3779B1
    if isinstance(key, bytes):
        return zlib.crc32(key) * 0x85EBCA77 + 1
    if isinstance(key, np.generic) and key.dtype.kind in "biuf":
        key = key.item()  # np.int64(3) is the key 3, as in a dict
    if isinstance(key, (int, float)) and key == key:
        return hash(key)  # 1, 1.0 and True are one key, as in a dict
    if isinstance(key, tuple):
        h = 0x345678
        for x in key:
            h = ((h * 1000003) ^ _hash(x)) & _MASK
        return h
    if key is None:
        return 0x5BD1E995
    raise TypeError(
        f"fastload.SharedDict keys must be str, bytes, int, float (not NaN), bool, None or tuples "
        f"of them; got {type(key).__qualname__}"
    )


class _Sections:
    """Named arrays laid out one after another in a region, 64-byte aligned."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, bytes | np.ndarray]] = []

    def add(self, name: str, data: bytes | np.ndarray) -> None:
        self.parts.append((name, data))

    def build(self) -> tuple[int, int, dict[str, tuple[int, int, str, tuple[int, ...]]]]:
        """Write every section to a new memfd: (fd, nbytes, name -> (offset, nbytes, dtype,
        shape))."""
        from ._region import new_fd

        meta: dict[str, tuple[int, int, str, tuple[int, ...]]] = {}
        pos = _HEAD
        for name, data in self.parts:
            pos = -(-pos // _ALIGN) * _ALIGN
            if isinstance(data, np.ndarray):
                meta[name] = (pos, data.nbytes, data.dtype.str, data.shape)
                pos += data.nbytes
            else:
                meta[name] = (pos, len(data), "|u1", (len(data),))
                pos += len(data)
        nbytes = max(pos, _HEAD)
        fd = new_fd(nbytes, "a shared dataset container")
        try:
            token = secrets.token_bytes(16)
            _write(fd, _MAGIC + token, 0)
            for name, data in self.parts:
                raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).data
                _write(fd, raw, meta[name][0])
        except BaseException:
            os.close(fd)
            raise
        meta["token"] = (0, 0, token.hex(), ())
        return fd, nbytes, meta


def _write(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


# -- the region and its readers --------------------------------------------------------------------
#: Every container region built in this process (what a forked worker looks at).
_built: weakref.WeakSet[_Region] = weakref.WeakSet()


def regions_of_other_loaders(keep: int | None) -> list[_Region]:
    """The built container regions that share_dataset made for a loader other than ``keep``."""
    return [r for r in list(_built) if r.owner is not None and r.owner != keep]


class _Region:
    """A read-only mapping of a container's memfd, and (in the builder) the fd that lets other
    processes open it."""

    #: The loader (its client id) whose share_dataset built it, else None (a container the user
    #: built): a forked worker keeps only its own loader's and the user's (_region.drop_inherited).
    owner: int | None = None

    def __init__(self, fd: int, nbytes: int, meta: dict[str, Any], owner_fd: bool) -> None:
        self.nbytes, self.meta = nbytes, meta
        self.mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        token = bytes.fromhex(meta["token"][2])
        if self.mm[:_HEAD - 8] != _MAGIC + token:
            self.mm.close()
            raise RuntimeError("fastload: the shared region opened is not the container's (its "
                               "token differs): the process that built it closed it")
        self.pid = os.getpid()
        self.fd = fd if owner_fd else -1
        if owner_fd:
            self._fin = weakref.finalize(self, os.close, fd)
            _built.add(self)

    def close_fd(self) -> None:
        """No other process can attach from now on (those attached keep their mapping)."""
        if self.fd >= 0:
            self._fin()
            self.fd = -1

    def array(self, name: str) -> np.ndarray:
        off, n, dtype, shape = self.meta[name]
        dt = np.dtype(dtype)
        count = n // dt.itemsize if dt.itemsize else 0
        a: np.ndarray = np.frombuffer(self.mm, dtype=dt, count=count, offset=off).reshape(shape)
        return a

    def handle(self) -> tuple[int, int, int, dict[str, Any]]:
        if self.fd < 0:  # attached here: the builder's fd is still the way in
            if not hasattr(self, "src"):
                raise RuntimeError("fastload: this shared container's loader is closed: it "
                                   "cannot be sent to another process any more")
            return self.src
        return (self.pid, self.fd, self.nbytes, self.meta)

    @classmethod
    def attach(cls, pid: int, fd: int, nbytes: int, meta: dict[str, Any]) -> _Region:
        try:
            mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise RuntimeError(
                f"fastload: cannot attach a shared container built by process {pid} (its fd "
                f"{fd}): {e.strerror}. Shared containers are read through the process that "
                "built them, which must still run and hold the container; build it in the main "
                "process, before the workers start"
            ) from None
        try:
            r = cls(mine, nbytes, meta, owner_fd=False)
        finally:
            os.close(mine)
        r.src = (pid, fd, nbytes, meta)
        return r

    src: tuple[int, int, int, dict[str, Any]]


class _Items:
    """Item i of one section group (prefix ``p``): a column or an arena. ``get`` is made once
    for the kind: a closure over the mapping and the offsets (not a bound method: that would be
    a cycle, and the mapping could not be closed until a garbage collection)."""

    def __init__(self, region: _Region, p: str, kind: str, n: int) -> None:
        self.kind, self.n = kind, n
        if kind in ("str", "bytes", "pickle"):
            self.get = _arena_reader(kind, region.mm, region.meta[p + "arena"][0],
                                     region.array(p + "offsets").data)  # ints, not np scalars
        else:
            self.col = col = region.array(p + "col")
            # array: a read-only view of the shared rows; scalar: the NumPy scalar it was
            self.get = col.__getitem__ if kind in ("array", "scalar") else (
                lambda i: col[i].item())  # int, float, bool

    def many(self, start: int, stop: int) -> list[Any]:
        if self.kind in ("int", "float", "bool"):
            out: list[Any] = self.col[start:stop].tolist()
            return out
        get = self.get
        return [get(i) for i in range(start, stop)]


def _arena_reader(kind: str, mm: mmap.mmap, base: int, off: memoryview) -> Any:
    def raw(i: int) -> bytes:
        return mm[base + off[i]: base + off[i + 1]]

    if kind == "str":
        return lambda i: raw(i).decode("utf-8", "surrogatepass")
    return raw if kind == "bytes" else (lambda i: pickle.loads(raw(i)))


def _add_items(sec: _Sections, p: str, items: list[Any]) -> str:
    col = _column(items)
    if col is not None:
        sec.add(p + "col", col[1])
        return col[0]
    kind, arena, offsets = _arena(items)
    sec.add(p + "arena", arena)
    sec.add(p + "offsets", offsets)
    return kind


# -- SharedList ------------------------------------------------------------------------------------
class _Shared:
    """What SharedList and SharedDict have in common: the region, pickling as a handle, and the
    private copy a changed share_dataset container becomes (``_mutator``)."""

    _what = ""
    _region: _Region
    _private: Any
    _cow: bool
    __hash__ = None  # type: ignore[assignment]

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the items take."""
        return self._region.nbytes

    def _materialize(self) -> Any:
        raise NotImplementedError

    def __ne__(self, other: object) -> bool:  # list's and dict's read the (empty) storage
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __reduce__(self) -> Any:
        if self._private is not None:
            return (type(self._private), (self._private,))
        if not _HAVE_PROC:
            return (type(self), (self._materialize(),))
        return (_attach, (type(self), self._region.handle(), self._cow))


class SharedList(_Shared, list):  # type: ignore[type-arg]
    """A read-only list whose items live in shared memory (NOTE [shared containers]).

    ``SharedList(iterable)`` reads the iterable once. Indexing, slicing (a list), ``len``,
    iteration, ``in``, ``index``, ``count`` and ``==`` with a list behave as on the list; items
    come back equal to the originals (NumPy arrays as read-only views of the shared rows). It
    pickles as a handle, so workers attach the one copy instead of receiving their own.
    ``copy()``, ``+`` and ``*`` give a plain list. It is a ``list`` subclass whose list storage
    is empty (NOTE [shared containers]): ``isinstance(x, list)`` holds and ``json.dumps(x)``
    works, but unbound calls of list's methods (``list.__len__(x)``) see no items.
    """

    _what = "SharedList"

    def __init__(self, iterable: Iterable[Any] = ()) -> None:
        items = list(iterable)
        sec = _Sections()
        kind = _add_items(sec, "", items)
        fd, nbytes, meta = sec.build()
        meta["list"] = (len(items), 0, kind, ())
        self._open(_Region(fd, nbytes, meta, owner_fd=True))

    def _open(self, region: _Region) -> None:
        self._region = region
        n, _, kind, _ = region.meta["list"]
        self._n = n
        self._items = _Items(region, "", kind, n)
        self._private: list[Any] | None = None
        self._cow = False

    @property
    def kind(self) -> str:
        """How the items are stored: int, float, bool, scalar, array, str, bytes or pickle."""
        return self._items.kind

    def __len__(self) -> int:
        return self._n if self._private is None else len(self._private)

    def __getitem__(self, i: Any) -> Any:
        if self._private is not None:
            return self._private[i]
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step == 1:
                return self._items.many(start, max(start, stop))
            return [self._items.get(j) for j in range(start, stop, step)]
        try:
            j = i.__index__()
        except AttributeError:
            raise TypeError(
                f"list indices must be integers or slices, not {type(i).__name__}") from None
        if j < 0:
            j += self._n
        if not 0 <= j < self._n:
            raise IndexError("list index out of range")
        return self._items.get(j)

    def __iter__(self) -> Iterator[Any]:
        if self._private is not None:
            yield from self._private
            return
        step = 4096
        for start in range(0, self._n, step):
            yield from self._items.many(start, min(self._n, start + step))

    def __reversed__(self) -> Iterator[Any]:
        for j in range(len(self) - 1, -1, -1):
            yield self[j]

    def __contains__(self, value: object) -> bool:
        return any(_same(x, value) for x in self)

    def index(self, value: Any, start: Any = 0, stop: Any = None) -> int:
        n = len(self)
        start, stop, _ = slice(start, stop).indices(n)
        for j in range(start, stop):
            if _same(self[j], value):
                return j
        raise ValueError(f"{value!r} is not in list")

    def count(self, value: Any) -> int:
        return sum(1 for x in self if _same(x, value))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):  # a SharedList too
            return len(self) == len(other) and all(
                _same(a, b) for a, b in zip(self, other))
        return NotImplemented

    def __mul__(self, n: Any) -> list[Any]:
        out: list[Any] = list(self) * n
        return out

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return f"fastload.SharedList({len(self)} items, {self.kind}, {self.nbytes:,} bytes shared)"

    def copy(self) -> list[Any]:
        """A plain list of the items (as ``list.copy()``: the caller may change it)."""
        return list(self)

    def __add__(self, other: Any) -> list[Any]:
        if isinstance(other, list):
            return list(self) + list(other)
        return NotImplemented

    def __radd__(self, other: Any) -> list[Any]:
        if isinstance(other, list):
            return other + list(self)
        return NotImplemented

    def _materialize(self) -> list[Any]:
        return list(self)


def release(c: SharedList | SharedDict) -> None:
    """Close a container share_dataset made, in the main process, when its loader closes: the
    fd that let workers attach, and the mapping (Python's mmap keeps an fd of its own with it).
    Only the workers' copy of the dataset held it; a view still alive keeps the mapping until it
    goes."""
    c._region.close_fd()
    for name in ("_items", "_keys", "_values", "_hashes", "_table"):
        c.__dict__.pop(name, None)
    try:
        c._region.mm.close()
    except BufferError:
        pass


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def _attach(cls: Any, handle: tuple[int, int, int, dict[str, Any]], cow: bool) -> Any:
    obj = cls.__new__(cls)
    obj._open(_Region.attach(*handle))
    obj._cow = cow
    return obj


def _mutator(name: str) -> Any:
    """The list (dict) method ``name``: refused on a container the user built; on one that
    ``share_dataset`` made in place of the user's list (``_cow``), applied to a private copy that
    serves every later read in this process, so code that changes its dataset keeps working
    (with the memory a list costs)."""

    def op(self: Any, *args: Any, **kw: Any) -> Any:
        if not self._cow:
            raise _read_only(self._what)
        if self._private is None:
            log.info("fastload: a shared %s of %d items was changed (%s) in process %d: it is "
                     "a private copy there from now on", self._what, len(self), name,
                     os.getpid())
            self._private = self._materialize()
        out = getattr(self._private, name)(*args, **kw)
        return self if out is self._private else out

    op.__name__ = name
    return op


# -- SharedDict ------------------------------------------------------------------------------------
#: The one key a SharedDict's own dict storage holds (NOTE [shared containers])
_STORED = object()

class SharedDict(_Shared, dict):  # type: ignore[type-arg]
    """A read-only dict whose keys and values live in shared memory (NOTE [shared containers]).

    ``SharedDict(mapping)`` (or an iterable of pairs). Lookup, ``in``, ``get``, ``len``,
    iteration (insertion order), ``keys()`` / ``values()`` / ``items()`` and ``==`` with a dict
    behave as on the dict. Keys must be str, bytes, numbers, None or tuples of them: their hash
    has to be the same in every process. ``copy()`` and ``|`` give a plain dict. It is a
    ``dict`` subclass whose dict storage holds none of the items (NOTE [shared containers]):
    ``isinstance(x, dict)`` holds and ``json.dumps(x)``, ``dict(x)`` and ``f(**x)`` work, but
    unbound calls of dict's methods (``dict.keys(x)``) do not see the items.
    """

    _what = "SharedDict"

    def __init__(self, mapping: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = ()) -> None:
        d = dict(mapping)
        keys, values = list(d), list(d.values())
        hashes = np.array([_hash(k) & _MASK for k in keys], dtype=np.uint64)
        size = 8
        while size < 2 * len(keys):
            size *= 2
        table = np.full(size, -1, dtype=np.int64)
        mask = size - 1
        for idx, h in enumerate(hashes.tolist()):
            j = h & mask
            while table[j] >= 0:
                j = (j + 1) & mask
            table[j] = idx
        sec = _Sections()
        kkind = _add_items(sec, "k.", keys)
        vkind = _add_items(sec, "v.", values)
        sec.add("hashes", hashes)
        sec.add("table", table)
        fd, nbytes, meta = sec.build()
        meta["dict"] = (len(keys), 0, f"{kkind},{vkind}", ())
        self._open(_Region(fd, nbytes, meta, owner_fd=True))

    def _open(self, region: _Region) -> None:
        self._region = region
        n, _, kinds, _ = region.meta["dict"]
        kkind, vkind = kinds.split(",")
        self._n = n
        self._keys = _Items(region, "k.", kkind, n)
        self._values = _Items(region, "v.", vkind, n)
        self._hashes = region.array("hashes").data  # probed per lookup: plain ints
        self._table = region.array("table").data
        self._mask = len(self._table) - 1
        self._private: dict[Any, Any] | None = None
        self._cow = False
        dict.__setitem__(self, _STORED, None)  # NOTE [shared containers]: json's C encoder

    def _find(self, key: Any) -> int:
        try:
            h = _hash(key) & _MASK
        except TypeError:
            hash(key)  # an unhashable key raises as a dict would
            return -1  # a key type no SharedDict holds: absent
        table, hashes, j = self._table, self._hashes, h & self._mask
        while True:
            idx = table[j]
            if idx < 0:
                return -1
            if hashes[idx] == h and self._keys.get(idx) == key:
                return idx
            j = (j + 1) & self._mask

    def __getitem__(self, key: Any) -> Any:
        if self._private is not None:
            return self._private[key]
        idx = self._find(key)
        if idx < 0:
            raise KeyError(key)
        return self._values.get(idx)

    def __contains__(self, key: object) -> bool:
        if self._private is not None:
            return key in self._private
        return self._find(key) >= 0

    def get(self, key: Any, default: Any = None) -> Any:
        if self._private is not None:
            return self._private.get(key, default)
        idx = self._find(key)
        return default if idx < 0 else self._values.get(idx)

    def __len__(self) -> int:
        return self._n if self._private is None else len(self._private)

    def __iter__(self) -> Iterator[Any]:
        if self._private is not None:
            yield from self._private
            return
        for start in range(0, self._n, 4096):
            yield from self._keys.many(start, min(self._n, start + 4096))

    def __reversed__(self) -> Iterator[Any]:
        if self._private is not None:
            yield from reversed(self._private)
            return
        for j in range(self._n - 1, -1, -1):
            yield self._keys.get(j)

    def keys(self) -> Any:
        return KeysView(self)

    def items(self) -> Any:
        return _ItemsView(self)

    def values(self) -> Any:
        return _ValuesView(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):  # a SharedDict too
            return len(self) == len(other) and all(
                k in other and _same(v, other[k]) for k, v in self.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"fastload.SharedDict({len(self)} items, {self.nbytes:,} bytes shared)"

    def copy(self) -> dict[Any, Any]:
        """A plain dict of the items (as ``dict.copy()``: the caller may change it)."""
        return dict(self.items())

    def __or__(self, other: Any) -> dict[Any, Any]:
        if isinstance(other, Mapping):
            return {**self.copy(), **other}
        return NotImplemented

    def __ror__(self, other: Any) -> dict[Any, Any]:
        if isinstance(other, Mapping):
            return {**other, **self.copy()}
        return NotImplemented

    def _materialize(self) -> dict[Any, Any]:
        return dict(_ItemsView(self))


class _ItemsView(ItemsView):  # type: ignore[type-arg]
    def __init__(self, d: SharedDict) -> None:
        super().__init__(d)
        self.d = d

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        d = self.d
        if d._private is not None:
            yield from d._private.items()
            return
        for start in range(0, d._n, 4096):
            stop = min(d._n, start + 4096)
            yield from zip(d._keys.many(start, stop), d._values.many(start, stop))

    def __contains__(self, kv: object) -> bool:
        k: Any = kv[0]  # type: ignore[index]
        v: Any = kv[1]  # type: ignore[index]
        got = self.d.get(k, _ItemsView)  # (a sentinel no value can be)
        return got is not _ItemsView and _same(got, v)


class _ValuesView(ValuesView):  # type: ignore[type-arg]
    def __iter__(self) -> Iterator[Any]:
        for _, v in _ItemsView(self._mapping):  # type: ignore[attr-defined]
            yield v

    def __contains__(self, v: object) -> bool:
        return any(_same(x, v) for x in self)


for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend",
              "insert", "pop", "remove", "clear", "sort", "reverse"):
    setattr(SharedList, _name, _mutator(_name))
for _name in ("__setitem__", "__delitem__", "__ior__", "pop", "popitem", "clear", "update",
              "setdefault"):
    setattr(SharedDict, _name, _mutator(_name))


def _ordering(name: str) -> Any:
    """SharedList's ``<``, ``<=``, ``>``, ``>=``: list's, on its items (list's own would compare
    the empty storage)."""
    compare = getattr(operator, name.strip("_"))  # the full dispatch: other may be shared

    def op(self: SharedList, other: Any) -> Any:
        return compare(list(self), other) if isinstance(other, list) else NotImplemented

    op.__name__ = name
    return op


for _name in ("__lt__", "__le__", "__gt__", "__ge__"):
    setattr(SharedList, _name, _ordering(_name))
