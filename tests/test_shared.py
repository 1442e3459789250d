"""SharedList / SharedDict (NOTE [shared containers]) and share_dataset (NOTE [shared datasets])."""

from __future__ import annotations

import copy
import gc
import json
import math
import multiprocessing as mp
import os
import pickle
import signal
import warnings

import numpy as np
import pytest
from helpers import MP_TIMEOUT
from helpers.shared import (
    Introspective, MemmapShards, Meta, OpenShards, Special, Wrapper, grow_in_worker, meta_expected,
    read_all,
    uss_of,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from fastload import SharedDict, SharedList

METHODS = ["fork", "forkserver", "spawn"]


def _eq(a, b) -> bool:
    """Equality that treats NaN as equal to NaN, recursively (a float column is NaN-faithful)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_eq, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_eq(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
                and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")))
    return type(a) is type(b) and a == b


# -- round trips ---------------------------------------------------------------------------------
leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True), st.text(), st.text(max_size=0), st.binary(),
)
nested = st.recursive(leaves, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=5), kids, max_size=4),
    st.tuples(kids, kids)), max_leaves=12)
# Lists whose items agree, so each column kind is drawn, not only the pickled one.
uniform = st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1)), st.lists(st.floats(allow_nan=True)),
    st.lists(st.booleans()), st.lists(st.text()), st.lists(st.binary()), st.lists(nested),
    st.lists(st.integers(-(2**80), 2**80)),
)
keys = st.one_of(st.text(), st.integers(), st.binary(), st.tuples(st.text(), st.integers()),
                 st.none(), st.floats(allow_nan=False))


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(uniform)
def test_a_shared_list_reads_back_what_it_was_given(items):
    s = SharedList(items)
    for got in (s, pickle.loads(pickle.dumps(s))):
        assert len(got) == len(items)
        assert _eq(list(got), items)
        assert all(_eq(got[i], items[i]) for i in range(-len(items), len(items)))
        assert _eq(got[1:-1], items[1:-1]) and _eq(got[::2], items[::2])
        assert _eq(got[::-1], items[::-1])
    with pytest.raises(IndexError):
        s[len(items)]


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(keys, nested, max_size=30))
def test_a_shared_dict_reads_back_what_it_was_given(d):
    s = SharedDict(d)
    for got in (s, pickle.loads(pickle.dumps(s))):
        assert len(got) == len(d) and list(got) == list(d)  # keys, in insertion order
        for k, v in d.items():
            assert k in got and _eq(got[k], v) and _eq(got.get(k), v)
        assert _eq(list(got.values()), list(d.values()))
        assert [k for k, _ in got.items()] == list(d)
        assert "\x00absent" not in got and got.get("\x00absent", 7) == 7
        with pytest.raises(KeyError):
            got["\x00absent"]


def test_column_kinds_and_their_types():
    cases = {
        "int": [1, -2, 2**63 - 1], "float": [1.5, float("nan"), -0.0], "bool": [True, False],
        "str": ["", "日本語", "a\x00b", "\udc80"], "bytes": [b"", b"\x00\xff"],
        "scalar": [np.float32(1), np.float32(2.5)], "array": [np.arange(3), np.arange(3) * 2],
        "pickle": [1, "a", None, [1, 2], {"k": (1, 2)}, 10**40, np.arange(2), np.arange(3)],
    }
    for kind, items in cases.items():
        s = SharedList(items)
        assert s.kind == kind
        assert _eq(list(s), items), kind
    rows = SharedList([np.ones((2, 3), np.float32) * i for i in range(4)])
    assert rows[2].dtype == np.float32 and rows[2].shape == (2, 3)
    assert not rows[2].flags.writeable  # a view of the shared rows: read-only
    assert SharedList([1, 2]) == [1, 2] and [1, 2] == SharedList([1, 2])
    assert SharedList([1, 2]) != [1, 3]
    assert SharedDict({"a": 1}) == {"a": 1} and {"a": 1} == SharedDict({"a": 1})


def test_numbers_that_are_one_key_in_a_dict_are_one_key_here():
    d = SharedDict({1: "one", "x": "ex", (1, "z"): "t"})
    assert d[1.0] == d[True] == d[np.int64(1)] == "one"
    assert d[(1.0, "z")] == "t"
    assert 2 not in d and "y" not in d and b"x" not in d
    with pytest.raises(TypeError, match="unhashable"):
        d[[1]]
    with pytest.raises(TypeError, match="keys must be str, bytes"):
        SharedDict({frozenset([1]): 1})
    with pytest.raises(TypeError, match="not NaN"):
        SharedDict({float("nan"): 1})


def test_a_dict_lookup_is_the_same_whatever_the_hash_seed(tmp_path):
    # Python randomises str hashes per process; a worker started with another seed must find
    # every key the parent stored.
    import subprocess
    import sys

    d = SharedDict({f"key{i}": i for i in range(2000)})
    path = tmp_path / "d.pkl"
    path.write_bytes(pickle.dumps(d))
    code = ("import pickle, sys; d = pickle.loads(open(sys.argv[1], 'rb').read()); "
            "print(sum(d[f'key{i}'] for i in range(2000)), 'key5' in d, d.get('nope'))")
    for seed in ("0", "1", "12345"):
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                             text=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60)
        assert out.stdout.split() == [str(sum(range(2000))), "True", "None"], out.stderr


def test_mutation_is_refused_with_what_to_do():
    s, d = SharedList([1, 2]), SharedDict({"a": 1})
    for op in (lambda: s.append(3), lambda: s.__setitem__(0, 5), lambda: s.sort(),
               lambda: s.extend([1]), lambda: s.pop(), lambda: s.__delitem__(0)):
        with pytest.raises(TypeError, match="SharedList is read-only.*share_dataset=False"):
            op()
    for op in (lambda: d.__setitem__("b", 2), lambda: d.update(b=2), lambda: d.pop("a"),
               lambda: d.setdefault("c", 1), lambda: d.clear()):
        with pytest.raises(TypeError, match="SharedDict is read-only"):
            op()
    assert list(s) == [1, 2] and dict(d.items()) == {"a": 1}


# -- attaching -----------------------------------------------------------------------------------
@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("method", METHODS)
def test_a_container_attaches_in_a_child_of_every_start_method(method):
    items = [{"x": i, "s": "é" * (i % 5)} for i in range(3000)]
    d = {f"k{i}": [i, str(i)] for i in range(3000)}
    sl, sd = SharedList(items), SharedDict(d)
    with mp.get_context(method).Pool(1) as p:  # pickled to it: a handle, not the items
        got_l = p.apply(read_all, (sl,))
        got_d = p.apply(read_all, (sd,))
    assert got_l == (items, 3000, items[-1])
    assert got_d == (list(d.items()), "default", 3000)
    assert len(pickle.dumps(sl)) < 1000  # a handle


def test_attaching_after_the_builder_let_go_is_a_clear_error():
    s = SharedList(range(10))
    blob = pickle.dumps(s)
    s._region.close_fd()  # as when its loader closed
    with pytest.raises(RuntimeError, match="cannot be sent to another process"):
        pickle.dumps(s)
    with pytest.raises(RuntimeError, match="cannot attach a shared container built by process"):
        pickle.loads(blob)


# -- share_dataset -------------------------------------------------------------------------------
def _collect(loader):
    out = {}
    for b in loader:
        for j, i in enumerate(b["i"].tolist()):
            out[i] = {"i": i, "h": int(b["h"][j]), "nboxes": int(b["nboxes"][j]),
                      "area": float(b["area"][j])}
            assert b["kind"][j] == "SharedList"
    return out


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("method", METHODS)
def test_share_dataset_converts_large_containers_for_the_workers_only(method):
    ds = Meta(12_000)
    with fastload.Loader(ds, 500, num_workers=2, start_method=method) as loader:
        got = _collect(loader)
        shared = {e["attribute"]: e for e in loader.stats()["shared_dataset"]}
    assert got == {i: meta_expected(i) for i in range(12_000)}
    assert set(shared) == {"dataset.items", "dataset.names", "dataset.index_of"}
    assert shared["dataset.names"]["kind"] == "str" and shared["dataset.items"]["items"] == 12_000
    assert shared["dataset.index_of"]["type"] == "dict" and shared["dataset.items"]["bytes"] > 0
    # The user's own object is untouched.
    assert type(ds.items) is list and type(ds.index_of) is dict and type(ds.small) is list


@pytest.mark.timeout(MP_TIMEOUT)
def test_share_dataset_false_and_in_process_loading_send_the_dataset_as_it_is():
    ds = Meta(12_000)
    with fastload.Loader(ds, 4000, num_workers=1, share_dataset=False) as loader:
        kinds = {k for b in loader for k in b["kind"]}
        assert loader.stats()["shared_dataset"] == [] and kinds == {"list"}
    with fastload.Loader(ds, 4000, num_workers=0) as loader:
        kinds = {k for b in loader for k in b["kind"]}
        assert loader.stats()["shared_dataset"] == [] and kinds == {"list"}


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_wrapped_dataset_and_a_list_of_samples_are_shared_too():
    inner = Meta(10_000)
    with fastload.Loader(Wrapper(inner, list(range(0, 10_000, 3)) * 4), 1000,
                         num_workers=2, start_method="spawn") as loader:
        got = _collect(loader)
        paths = {e["attribute"] for e in loader.stats()["shared_dataset"]}
    assert set(got) == set(range(0, 10_000, 3))
    assert paths == {"dataset.indices", "dataset.inner.items", "dataset.inner.names",
                     "dataset.inner.index_of"}
    samples = [np.full(3, i, np.int32) for i in range(20_000)]
    with fastload.Loader(samples, 5000, num_workers=2, start_method="spawn") as loader:
        assert [e["attribute"] for e in loader.stats()["shared_dataset"]] == ["dataset"]
        assert np.concatenate(list(loader))[:, 0].tolist() == list(range(20_000))
    with fastload.Loader(samples, 5000, num_workers=2, start_method="fork") as loader:
        # Under fork reading an array never copies its data: sharing it would only copy it.
        assert loader.stats()["shared_dataset"] == []


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_what_must_not_be_converted_keeps_working(method, caplog):
    n = 12_000
    with caplog.at_level("DEBUG", logger="fastload"):
        with fastload.Loader(Special(n), 3000, num_workers=2, start_method=method,
                             worker_init=grow_in_worker) as loader:
            batches = list(loader)
            shared = [e["attribute"] for e in loader.stats()["shared_dataset"]]
    assert shared == ["dataset.grown"]  # not the subclass, not the dict of frozenset keys
    assert "left dataset.odd (dict of 12000 items) as it is: TypeError: " in caplog.text
    neg = np.concatenate([b["neg"] for b in batches])
    assert neg.tolist() == [-i for i in range(n)]
    # Each worker appended to its copy in worker_init: it became private there and kept working.
    assert set(np.concatenate([b["n"] for b in batches]).tolist()) == {n + 1}
    assert set(np.concatenate([b["tail"] for b in batches]).tolist()) <= {1000, 1001}
    assert {g for b in batches for g in b["grown"]} == {"SharedList"}
    assert np.concatenate([b["odd"] for b in batches]).tolist() == list(range(n))


# -- memory ----------------------------------------------------------------------------------------
@pytest.mark.timeout(MP_TIMEOUT * 2)
def test_a_workers_private_memory_stays_flat_over_epochs():
    if not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("needs /proc/<pid>/smaps_rollup (Linux >= 4.14)")
    ds = Meta(200_000)
    growth = {}
    for share in (True, False):
        with fastload.Loader(ds, 2000, num_workers=2, start_method="fork",
                             share_dataset=share) as loader:
            it = iter(loader)
            next(it)
            pids = [p.pid for p in loader._engine.pool.procs]
            before = [uss_of(p) for p in pids]
            for _ in it:
                pass
            for _ in range(2):
                for _ in loader:
                    pass
            after = [uss_of(p) for p in pids]
            report = loader.memory()
        growth[share] = max(a - b for a, b in zip(after, before))
        assert {w["pid"] for w in report["workers"]} == set(pids)
        assert all(w["uss"] > 0 and w["pss"] > 0 for w in report["workers"])
        assert report["total_pss"] >= sum(w["pss"] for w in report["workers"])
    # Without sharing each worker copies the pages of the ~200k dicts it reads (~90 MiB here);
    # with it, nothing it reads is copied: what is left (a few MiB) is the allocator's own
    # churn over 3 epochs of decoded items and batches.
    assert growth[False] > 40 * 2**20, growth
    assert growth[True] < min(12 * 2**20, growth[False] / 8), growth


@pytest.mark.timeout(MP_TIMEOUT * 2)
def test_a_growing_worker_is_warned_about_once_naming_the_attributes(monkeypatch):
    if not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("needs /proc/<pid>/smaps_rollup (Linux >= 4.14)")
    import fastload._memory as memory

    monkeypatch.setattr(memory, "WARN_GROWTH_BYTES", 2 * 2**20)
    ds = Meta(100_000)
    with fastload.Loader(ds, 2000, num_workers=1, start_method="fork",
                         share_dataset=False) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(4):  # the baseline is the second epoch's start
                for _ in loader:
                    pass
    msgs = [str(w.message) for w in caught if "private (dirty) memory grew" in str(w.message)]
    assert len(msgs) == 1, msgs
    assert "dataset.items (list of 100,000 items)" in msgs[0] and "SharedList" in msgs[0]
    assert caught[0].filename == __file__  # points at the user's loop


def test_a_worker_reading_a_memory_mapped_file_is_not_warned_about(monkeypatch, tmp_path):
    """File pages only the worker touched are private but clean (not copies): the warning
    watches dirty private memory. It warned here, about the file's size, before."""
    if not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("needs /proc/<pid>/smaps_rollup (Linux >= 4.14)")
    import fastload._memory as memory

    monkeypatch.setattr(memory, "WARN_GROWTH_BYTES", 16 * 2**20)
    np.save(tmp_path / "x.npy", np.ones((8192, 1024), np.float32))  # 32 MiB
    os.sync()  # a file just written has dirty page-cache pages; a dataset's files are clean
    ds = fastload.ArrayDataset(np.load(tmp_path / "x.npy", mmap_mode="r"))
    with fastload.Loader(ds, 256, num_workers=1, start_method="fork") as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                assert sum(len(b) for b in loader) == 8192
        grown = loader.memory()["workers"][0]["uss_growth"]
    assert grown is None or grown > 16 * 2**20  # the file's pages are in its USS ...
    assert not [w for w in caught if "memory grew" in str(w.message)]  # ... and not warned


# -- no leaks ------------------------------------------------------------------------------------
def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_nothing_is_left_after_close_or_a_worker_crash(method):
    ds = Meta(12_000)
    with fastload.Loader(ds, 500, num_workers=1, start_method=method):
        pass  # warm: imports, the forkserver
    gc.collect()
    before = _fds()
    with fastload.Loader(ds, 500, num_workers=2, start_method=method,
                         on_worker_death="restart") as loader:
        it = iter(loader)
        next(it)
        os.kill(loader._engine.pool.procs[0].pid, signal.SIGKILL)  # it attaches again
        rest = sum(len(b["i"]) for b in it)
        assert rest == 12_000 - 500
        assert len(loader.stats()["shared_dataset"]) == 3
    gc.collect()
    assert _fds() == before
    assert not mp.active_children()


# -- share_dataset never changes what a dataset does ------------------------------------------------
def _shards(tmp_path, n_shards: int = 8, rows: int = 64, width: int = 1024) -> tuple[list, list]:
    """8 shards of 64 rows of 1024 float32 (256 KiB each, 2 MiB in all) and their labels."""
    xs, ys = [], []
    for s in range(n_shards):
        x = np.arange(s * rows * width, (s + 1) * rows * width, dtype=np.float32)
        np.save(tmp_path / f"x{s}.npy", x.reshape(rows, width))
        np.save(tmp_path / f"y{s}.npy", np.arange(s * rows, (s + 1) * rows, dtype=np.int64))
        xs.append(str(tmp_path / f"x{s}.npy"))
        ys.append(str(tmp_path / f"y{s}.npy"))
    return xs, ys


def _batches(loader) -> list:
    return [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in b.items()}
            for b in loader]


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_dataset_with_its_own_pickling_is_left_as_it_is(method, tmp_path, caplog,
                                                          monkeypatch):
    """The reported case: memmaps kept in lists, dropped in __getstate__ and reopened lazily
    (the threshold lowered so that 2 MiB of shards would count as large)."""
    monkeypatch.setattr("fastload._share.BYTES", 1 << 20)
    ds = MemmapShards(*_shards(tmp_path))
    got = {}
    with caplog.at_level("DEBUG", logger="fastload"):
        for share in (True, False):
            with fastload.Loader(ds, 50, num_workers=2, start_method=method,
                                 share_dataset=share) as loader:
                got[share] = _batches(loader)
                assert loader.stats()["shared_dataset"] == []
                if share:
                    assert any("its class defines __getstate__" in u
                               for u in loader._unshared()), loader._unshared()
    assert len(got[True]) == len(got[False]) == math.ceil(512 / 50)
    for a, b in zip(got[True], got[False]):
        assert np.array_equal(a["x"], b["x"]) and np.array_equal(a["y"], b["y"])
        assert a["kind"] == b["kind"] == ["list"] * len(a["y"])
    assert np.concatenate([b["y"] for b in got[True]]).tolist() == list(range(512))
    assert "share_dataset left dataset (MemmapShards) as it is" in caplog.text
    assert type(ds._x) is list and type(ds._x[0]) is np.memmap  # the user's object untouched


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_wrapped_object_with_its_own_pickling_is_left_as_it_is(tmp_path):
    xs, ys = _shards(tmp_path, n_shards=2)
    ds = Wrapper(MemmapShards(xs, ys), list(range(128)) * 100)  # a large plain list: shared
    with fastload.Loader(ds, 64, num_workers=2, start_method="spawn") as loader:
        ys_got = np.concatenate([b["y"] for b in loader]).tolist()
        shared = [e["attribute"] for e in loader.stats()["shared_dataset"]]
    assert ys_got == list(range(128)) * 100
    assert shared == ["dataset.indices"]


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_memmaps_in_a_list_are_not_converted_and_a_large_plain_list_still_is(method, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr("fastload._share.BYTES", 1 << 20)  # 2 MiB of shards would count
    xs, _ = _shards(tmp_path)
    ds = OpenShards(xs, 12_000)
    results = {}
    for share in (True, False):
        with fastload.Loader(ds, 64, num_workers=2, start_method=method,
                             share_dataset=share) as loader:
            results[share] = _batches(loader)
            shared = [e["attribute"] for e in loader.stats()["shared_dataset"]]
        assert shared == (["dataset.names"] if share else [])
    for a, b in zip(results[True], results[False]):
        assert np.array_equal(a["x"], b["x"]) and a["name"] == b["name"]
        assert set(a["kind"]) == {"list"}
    assert {n for b in results[True] for n in b["names"]} == {"SharedList"}


@pytest.mark.timeout(MP_TIMEOUT)
def test_sizes_are_estimated_without_pickling_items():
    from helpers.shared import PICKLED, ManyPickled

    ds = ManyPickled(500)
    PICKLED[0] = 0
    with fastload.Loader(ds, 100, num_workers=1, start_method="fork") as loader:
        assert np.concatenate(list(loader)).tolist() == list(range(500))
    assert PICKLED[0] == 0


def test_file_backed_values_are_recognised(tmp_path):
    from fastload._share import _file_backed, _of_files, own_pickling

    np.save(tmp_path / "a.npy", np.zeros(10))
    mm = np.load(tmp_path / "a.npy", mmap_mode="r")
    with open(tmp_path / "a.npy", "rb") as f:
        assert _file_backed(f) and _file_backed(mm) and _file_backed(mm[2:5])
        assert _file_backed(np.asarray(mm)) and not _file_backed(np.zeros(3))
        assert _of_files([(mm, 1)]) and _of_files({"k": f}) and not _of_files([np.zeros(2)])
    del mm
    assert own_pickling(MemmapShards) == "__getstate__" and own_pickling(Meta) is None


def test_copy_and_concatenation_give_plain_containers():
    lst, d = SharedList(range(5)), SharedDict({"a": 1, "b": 2})
    assert type(lst.copy()) is list and lst.copy() == [0, 1, 2, 3, 4]
    assert lst + [5] == [0, 1, 2, 3, 4, 5] and [9] + lst == [9, 0, 1, 2, 3, 4]
    assert type(d.copy()) is dict and d.copy() == {"a": 1, "b": 2}
    assert d | {"c": 3} == {"a": 1, "b": 2, "c": 3} and {"z": 0} | d == {"z": 0, "a": 1, "b": 2}
    c = lst.copy()
    c.append(5)  # the caller's own list
    assert len(lst) == 5


# What a dataset's own code does with a list or dict attribute, each as a function of it: the
# shared container must give what the plain one gives (NOTE [shared containers]).
LIST_USES = {
    "isinstance": lambda x: isinstance(x, list),
    "json": lambda x: json.dumps(x),
    "json indent": lambda x: json.dumps({"k": x}, indent=1),
    "len bool": lambda x: (len(x), bool(x)),
    "index": lambda x: (x[0], x[-1], x[1:3], x[::2]),
    "iter": lambda x: (list(x), tuple(x), sorted(x), list(reversed(x))),
    "unpack": lambda x: (lambda a, b, *rest: (a, b, rest))(*x),
    "contains": lambda x: ("b" in x, "zz" in x),
    "methods": lambda x: (x.index("b"), x.count("b"), x.copy()),
    "concat": lambda x: (x + ["z"], ["z"] + x, x * 2, 2 * x),
    "extend": lambda x: (lambda y: (y.extend(x), y)[1])(["z"]),
    "iadd": lambda x: (lambda y: (y.__iadd__(x)))(["z"]),
    "compare": lambda x: (x == list(x), list(x) == x, x != ["q"], x < ["zz"], x >= ["a"]),
    "compare alike": lambda x: (x < type(x)(["zz"]), type(x)(["a"]) < x, x == type(x)(x)),
    "join": lambda x: ",".join(x),
    "numpy": lambda x: np.asarray(x).tolist(),
    "copy": lambda x: (copy.copy(x) == x, copy.deepcopy(x) == x),
    "set": lambda x: sorted(set(x)),
}
DICT_USES = {
    "isinstance": lambda d: isinstance(d, dict),
    "json": lambda d: json.dumps(d, sort_keys=True),
    "json nested": lambda d: json.dumps({"k": d, "e": {}}),
    "len bool": lambda d: (len(d), bool(d)),
    "get": lambda d: (d["a"], d.get("b"), d.get("zz", 7), "a" in d, "zz" in d),
    "views": lambda d: (list(d), list(d.keys()), list(d.values()), list(d.items()),
                        d.keys() & {"a", "q"}, ("a", 1) in d.items(), list(reversed(d))),
    "copies": lambda d: (dict(d), {**d}, d.copy(), (lambda **k: k)(**d)),
    "merge": lambda d: (d | {"z": 0}, {"z": 0} | d, (lambda y: (y.update(d), y)[1])({})),
    "compare": lambda d: (d == dict(d), dict(d) == d, d != {}),
    "format": lambda d: ("{a}-{c}".format(**d), "%(a)s" % d, "{a}".format_map(d)),
    "copy": lambda d: (copy.copy(d) == d, copy.deepcopy(d) == d),
}


@pytest.mark.parametrize("use", list(LIST_USES))
def test_a_shared_list_does_what_the_list_does(use: str) -> None:
    items = ["a", "b", "c", "b", "d"]
    f = LIST_USES[use]
    assert f(SharedList(items)) == f(list(items))


@pytest.mark.parametrize("use", list(DICT_USES))
def test_a_shared_dict_does_what_the_dict_does(use: str) -> None:
    items = {"a": 1, "b": [2, 3], "c": "x"}
    f = DICT_USES[use]
    assert f(SharedDict(items)) == f(dict(items))


def test_shared_containers_in_workers_serve_the_datasets_own_code() -> None:
    # The review's case: isinstance, .copy() and json.dumps of its attributes in the dataset's
    # __getitem__, which share_dataset=True (the default) broke with workers and not without.
    data = Introspective(20_000)
    expected = [b[:, 0].tolist() for b in fastload.Loader(data, batch_size=5000, num_workers=0)]
    with fastload.Loader(data, batch_size=5000, num_workers=2, timeout=60) as loader:
        got = [b[:, 0].tolist() for b in loader]
        assert loader.stats()["shared_dataset"], "nothing was shared: the test tests nothing"
    assert got == expected
