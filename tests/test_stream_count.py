"""Streams read once: shard lengths counted at most once per shard content (in memory, in the
index of file shards), the counting pass bounded by timeout= and its errors naming the shard,
NpyShards' files checked from their headers (NOTE [shard lengths] in fastload/_shard_lengths.py).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from helpers.streams import (
    BASE,
    Counted,
    CountFailsAt,
    HangsCounting,
    Lines,
    Pairs,
    Sized,
    SizedLines,
    calls,
    expected,
)

import fastload
from fastload import _shard_lengths

UNEVEN = [1, 7, 100, 33, 0]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache folder of this test's own, and nothing remembered from other tests."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(folder))
    _shard_lengths._FILES.clear()
    _shard_lengths._OBJECTS.clear()
    yield folder
    _shard_lengths._FILES.clear()
    _shard_lengths._OBJECTS.clear()


def _forget_in_memory():
    """As a new process would start: only the index on disk is left."""
    _shard_lengths._FILES.clear()
    _shard_lengths._OBJECTS.clear()


@pytest.fixture
def files(tmp_path):
    out = []
    for k, n in enumerate(UNEVEN):
        out.append(str(tmp_path / f"{k}.txt"))
        with open(out[-1], "w") as f:
            f.writelines(f"{k * BASE + i}\n" for i in range(n))
    return out


def _log(tmp_path, name):
    d = tmp_path / name
    d.mkdir()
    return str(d)


def _flat(loader):
    return [x for b in loader for x in b.tolist()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 2])
def test_a_second_loader_over_the_same_stream_reads_no_shard_to_count_it(tmp_path, nw):
    log = _log(tmp_path, "log")
    stream = Counted(UNEVEN, log=log)
    with fastload.Loader(stream, 8, num_workers=nw) as ld:
        assert len(ld) == 18
    assert {s for _, s, start in calls(log) if start == 0} == set(range(5))  # counted
    for name in os.listdir(log):
        os.unlink(os.path.join(log, name))
    with fastload.Loader(stream, 8, num_workers=nw) as ld:
        assert len(ld) == 18 and sorted(_flat(ld)) == expected(UNEVEN)
    assert 4 not in {s for _, s, _ in calls(log)}  # the empty shard: only a count reads it
    if nw == 0:  # one reader: the very reads of a stream with shard_len
        ref = _log(tmp_path, "ref")
        with fastload.Loader(Sized(UNEVEN, log=ref), 8, num_workers=nw) as ld:
            _flat(ld)
        assert sorted(calls(log)) == sorted(calls(ref))


@pytest.mark.timeout(60)
def test_file_shards_are_counted_once_across_processes(tmp_path, files, cache):
    with fastload.Loader(Lines(files), 8, num_workers=2) as ld:
        assert len(ld) == 18
    index = sorted(os.listdir(cache / "shard-lengths"))
    assert len(index) == 5 and all(name.endswith(".json") for name in index)
    doc = json.loads((cache / "shard-lengths" / index[0]).read_text())
    assert doc["format"] == 1 and doc["lengths"] == {
        "helpers.streams.Lines": UNEVEN[files.index(doc["path"])]
    }
    _forget_in_memory()
    log = _log(tmp_path, "log")
    # a new stream object, lengths from the index: len() reads nothing (in-process loading,
    # so no worker's first-sample probe races the check, as it did with workers)
    with fastload.Loader(Lines(files, log=log), 8, num_workers=0) as ld:
        assert len(ld) == 18 and calls(log) == []
        assert sorted(_flat(ld)) == expected(UNEVEN)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_resume_reads_only_what_it_delivers(tmp_path, files, shuffle):
    with fastload.Loader(Lines(files), 8, shuffle=shuffle, seed=2, num_workers=2) as ld:
        it = iter(ld)
        head = [next(it).tolist() for _ in range(6)]
        state = json.loads(json.dumps(ld.state_dict()))
        tail = [b.tolist() for b in it]
    assert len(head) + len(tail) == 18
    _forget_in_memory()  # the resume runs in a new process: only the index is left
    log = _log(tmp_path, "log")
    with fastload.Loader(Lines(files, log=log), 8, shuffle=shuffle, num_workers=0) as ld:
        assert calls(log) == []
        ld.load_state_dict(state)
        assert [b.tolist() for b in ld] == tail
    ref = _log(tmp_path, "ref")
    with fastload.Loader(SizedLines(files, log=ref), 8, shuffle=shuffle, num_workers=0) as ld:
        ld.load_state_dict(state)
        assert [b.tolist() for b in ld] == tail
    assert sorted(calls(log)) == sorted(calls(ref))  # what a stream with shard_len reads
    cursors = {int(k): v for k, v in state["stream"]["cursors"].items()}
    window = 1024 if shuffle else 1
    for _, s, start in calls(log):  # never from the start of a shard it had delivered from
        assert start >= cursors.get(s, 0) // window * window


def test_a_changed_file_is_counted_again(files):
    with fastload.Loader(Lines(files), 8, num_workers=0) as ld:
        assert len(ld) == 18
    with open(files[1], "a") as f:
        f.write(f"{BASE + 7}\n")
    st = os.stat(files[1])
    os.utime(files[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    for forget in (False, True):  # in this process, and in a new one (the index)
        if forget:
            _forget_in_memory()
        with fastload.Loader(Lines(files), 8, num_workers=0) as ld:
            assert len(ld) == 18 and len(_flat(ld)) == 142


def test_two_stream_classes_reading_one_file_keep_their_own_counts(files):
    with fastload.Loader(Lines(files), 8, num_workers=0) as ld:
        assert len(_flat(ld)) == sum(UNEVEN)
    _forget_in_memory()
    with fastload.Loader(Pairs(files), 8, num_workers=0) as ld:
        assert len(_flat(ld)) == sum(n // 2 for n in UNEVEN)
    _forget_in_memory()
    with fastload.Loader(Lines(files), 8, num_workers=0) as ld:
        assert len(_flat(ld)) == sum(UNEVEN)


def test_an_unwritable_cache_folder_keeps_counts_in_memory_silently(tmp_path, files,
                                                                    monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(blocker / "cache"))  # cannot be created
    log = _log(tmp_path, "log")
    with fastload.Loader(Lines(files, log=log), 8, num_workers=0) as ld:
        assert len(ld) == 18
    counted = len(calls(log))
    with fastload.Loader(Lines(files, log=log), 8, num_workers=0) as ld:
        assert len(ld) == 18 and len(calls(log)) == counted  # remembered in this process
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", "")  # "": in memory only, by choice
    _forget_in_memory()
    with fastload.Loader(Lines(files), 8, num_workers=0) as ld:
        assert len(ld) == 18
    assert not (tmp_path / "cache").exists()


def test_shard_file_none_keeps_a_file_out_of_the_index(files, cache):
    class NotIndexed(Lines):
        def shard_file(self, shard):
            return None

    with fastload.Loader(NotIndexed(files), 8, num_workers=0) as ld:
        assert len(ld) == 18
    assert not cache.exists()


@pytest.mark.timeout(60)
def test_a_stalled_read_while_counting_raises_within_timeout_and_names_the_shard():
    t0 = time.monotonic()
    with pytest.raises(fastload.LoaderTimeoutError) as info:
        fastload.Loader(HangsCounting(UNEVEN), 8, num_workers=2, timeout=1.0)
    assert time.monotonic() - t0 < 30
    msg = str(info.value)
    assert "counting the samples of shard 'part-001' (shard 1)" in msg
    assert "timeout=1.0s" in msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nw", [0, 2])
def test_an_error_while_counting_names_the_shard_and_the_position(nw):
    with pytest.raises(OSError, match="corrupt record 40") as info:
        fastload.Loader(CountFailsAt(UNEVEN, 2, 40), 8, num_workers=nw)
    msg = str(info.value)
    assert "while loading shard 'part-002' (shard 2): counting its samples" in msg
    assert "at position 40 of the shard" in msg
    assert "sample index" not in msg


# -- NpyShards: every file checked from its header -------------------------------------------
def _save(tmp_path, arrays):
    paths = []
    for k, x in enumerate(arrays):
        paths.append(str(tmp_path / f"x{k}.npy"))
        np.save(paths[-1], x)
    return paths


def test_npy_shards_name_the_file_of_another_dtype(tmp_path):
    arrays = [np.zeros((n, 4), np.float32) for n in (3, 2, 5)]
    arrays.insert(2, np.zeros((4, 4), np.int64))
    paths = _save(tmp_path, arrays)
    with pytest.raises(ValueError, match=r"'[^']*x2\.npy' has dtype int64, the other 3 files "
                                         r"float32"):
        fastload.NpyShards(paths)


def test_npy_shards_name_the_file_of_another_row_shape(tmp_path):
    paths = _save(tmp_path, [np.zeros((3, 4), np.float32), np.zeros((2, 5), np.float32),
                             np.zeros((6, 4), np.float32)])
    with pytest.raises(ValueError, match=r"'[^']*x1\.npy' has row shape \(5,\), the other 2 "
                                         r"files \(4,\)"):
        fastload.NpyShards(paths)


def test_npy_shards_check_label_files_alike(tmp_path):
    paths = _save(tmp_path, [np.zeros((3, 2), np.float32), np.zeros((2, 2), np.float32)])
    labels = [str(tmp_path / "y0.npy"), str(tmp_path / "y1.npy")]
    np.save(labels[0], np.zeros(3, np.int64))
    np.save(labels[1], np.zeros(2, np.float64))
    with pytest.raises(ValueError, match=r"label array '[^']*y[01]\.npy' has dtype"):
        fastload.NpyShards(paths, labels)


def test_npy_shards_read_headers_only_when_built(tmp_path, monkeypatch):
    paths = _save(tmp_path, [np.arange(6, dtype=np.float32).reshape(3, 2),
                             np.arange(4, dtype=np.float32).reshape(2, 2)])
    np.save(tmp_path / "v2.npy", np.zeros((1, 2), np.float32))  # a format 2.0 header too
    with open(tmp_path / "v2.npy", "wb") as f:
        np.lib.format.write_array(f, np.zeros((1, 2), np.float32), version=(2, 0))
    paths.append(str(tmp_path / "v2.npy"))

    def no_load(*args, **kwargs):
        raise AssertionError("NpyShards read data when it was built")

    monkeypatch.setattr(np, "load", no_load)
    ds = fastload.NpyShards(paths)
    assert [ds.shard_len(k) for k in ds.shards()] == [3, 2, 1]
    monkeypatch.undo()
    with fastload.Loader(ds, 4, num_workers=0) as ld:
        assert sum(len(b) for b in ld) == 6


def test_npy_shards_refuse_a_file_that_is_not_npy(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"not an array")
    with pytest.raises(ValueError, match=r"'[^']*bad\.npy' is not a \.npy file"):
        fastload.NpyShards([str(tmp_path / "bad.npy")])
