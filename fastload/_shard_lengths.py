"""The lengths of a ShardedStream's shards, counted at most once per shard content.

NOTE [shard lengths]
Equal batch counts on every rank need every shard's length before the first batch (NOTE
[stream order] in _stream.py). A stream's ``shard_len`` gives them. Otherwise a shard is counted
by reading it whole through ``iter_shard(shard, 0)``: a full pass over the data, so a count is
remembered and made once per shard content, not once per Loader:

- in this process, per stream object: a second Loader over the same stream reads no shard to
  count it;
- across processes (a resume, the next run, the other ranks on the machine), for a shard that
  is a file (``ShardedStream.shard_file``; by default the shard itself when it is a path to a
  file): in a small JSON index per file in the cache folder, keyed by the file's real path, size
  and mtime_ns and by the stream's class (two classes may cut one file into different samples).
  A file changed since is counted again.

The index lives in the cache folder (``FASTLOAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastload``,
else ``~/.cache/fastload``), never next to the data: a file there would become a shard of the
next ``glob("shards/*")``, and data folders are often read-only or shared by many users. It is
written atomically (a temporary file renamed over it), so a concurrent reader sees the old index
or the new one. A folder that cannot be written keeps the count in memory only, silently: the
index saves time, it never changes a result. ``FASTLOAD_CACHE_DIR=""`` keeps counts in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

__all__ = ["CACHE_ENV", "cache_dir", "shard_lengths"]

CACHE_ENV = "FASTLOAD_CACHE_DIR"
INDEX_FORMAT = 1
_INDEX_FOLDER = "shard-lengths"


class _File(NamedTuple):
    """What a count of a file shard is valid for: this content of this file."""

    path: str  # real path
    size: int
    mtime_ns: int


# (stream class, file) -> length: counted or read from the index in this process
_FILES: dict[tuple[str, _File], int] = {}
# id(stream) -> (a weak reference to it, {shard key: length}) for shards that are not files
_OBJECTS: dict[int, tuple[weakref.ref[Any], dict[Any, int]]] = {}


def cache_dir() -> str | None:
    """The folder of the length index; None: remember counts in memory only."""
    given = os.environ.get(CACHE_ENV)
    if given is not None:
        return given or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload")


def shard_lengths(
    stream: Any, shards: Sequence[Any], count: Callable[[list[int]], list[int]]
) -> list[Any]:
    """The length of every shard in ``shards``: ``stream.shard_len``'s when it has one, else the
    remembered count, else ``count(todo)`` (the lengths of the shards at indices ``todo``, read
    from the data) remembered for next time (NOTE [shard lengths])."""
    shard_len = getattr(stream, "shard_len", None)
    if shard_len is not None:
        return [shard_len(s) for s in shards]  # checked by the caller
    cls = f"{type(stream).__module__}.{type(stream).__qualname__}"
    memory = _object_memory(stream)
    lengths: list[int | None] = [None] * len(shards)
    files: list[_File | None] = [None] * len(shards)
    keys: list[Any] = [None] * len(shards)
    for k, s in enumerate(shards):
        f = files[k] = _file_of(stream, s)
        if f is not None:  # the file as it is now: a change since is counted again
            n = _FILES.get((cls, f))
            lengths[k] = n if n is not None else _read_index(cls, f)
        elif memory is not None:
            keys[k] = _key(s)
            if keys[k] is not None:
                lengths[k] = memory.get(keys[k])
    todo = [k for k, n in enumerate(lengths) if n is None]
    if todo:
        for k, n in zip(todo, count(todo)):
            lengths[k] = n
            f = files[k]
            if f is not None:
                _write_index(cls, f, n)
    for k, n in enumerate(lengths):
        assert n is not None
        f = files[k]
        if f is not None:
            _FILES[(cls, f)] = n
        elif memory is not None and keys[k] is not None:
            memory[keys[k]] = n
    return lengths


def _object_memory(stream: Any) -> dict[Any, int] | None:
    """The counts remembered for the stream object ``stream`` (None: it takes no weak
    reference, so nothing is remembered for its shards that are not files)."""
    got = _OBJECTS.get(id(stream))
    if got is not None and got[0]() is stream:
        return got[1]
    key = id(stream)

    def forget(ref: weakref.ref[Any]) -> None:
        if _OBJECTS.get(key, (None,))[0] is ref:
            del _OBJECTS[key]

    try:
        ref = weakref.ref(stream, forget)
    except TypeError:
        return None
    memory: dict[Any, int] = {}
    _OBJECTS[key] = (ref, memory)
    return memory


def _key(shard: Any) -> Any:
    """A dict key for a shard description (hashable, else its pickle; None: neither)."""
    try:
        hash(shard)
        return (0, shard)
    except TypeError:
        pass
    try:
        return (1, pickle.dumps(shard, protocol=4))
    except Exception:
        return None


def _file_of(stream: Any, shard: Any) -> _File | None:
    shard_file = getattr(stream, "shard_file", None)
    path = shard_file(shard) if shard_file is not None else None
    if path is None:
        return None
    try:
        real = os.path.realpath(os.fspath(path))
        st = os.stat(real)
    except (OSError, TypeError, ValueError):
        return None  # not a file after all: counted, remembered per stream object only
    return _File(real, st.st_size, st.st_mtime_ns)


def _index_path(f: _File) -> str | None:
    folder = cache_dir()
    if folder is None:
        return None
    name = hashlib.sha1(f.path.encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(folder, _INDEX_FOLDER, f"{name}.json")


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _same_file(doc: dict[str, Any] | None, f: _File) -> bool:
    return (
        doc is not None
        and doc.get("format") == INDEX_FORMAT
        and doc.get("path") == f.path
        and doc.get("size") == f.size
        and doc.get("mtime_ns") == f.mtime_ns
        and isinstance(doc.get("lengths"), dict)
    )


def _read_index(cls: str, f: _File) -> int | None:
    path = _index_path(f)
    doc = None if path is None else _read(path)
    if doc is None or not _same_file(doc, f):
        return None
    n = doc["lengths"].get(cls)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _write_index(cls: str, f: _File, n: int) -> None:
    """Remember ``n`` for file ``f`` and stream class ``cls`` in the index, atomically; a
    folder that cannot be written keeps it in memory only (NOTE [shard lengths])."""
    path = _index_path(f)
    if path is None:
        return
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        doc = _read(path)
        if not _same_file(doc, f):  # another file there, or this one before it changed
            doc = {
                "format": INDEX_FORMAT,
                "path": f.path,
                "size": f.size,
                "mtime_ns": f.mtime_ns,
                "lengths": {},
            }
        assert doc is not None
        doc["lengths"][cls] = int(n)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
