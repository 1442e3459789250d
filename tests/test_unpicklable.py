"""A sample part that pickle refuses (NOTE [unpicklable leaves] in fastload/_ragged.py): with
workers, a TypeError of its batch naming the sample index, the part's path and type and what to
do, raised in the main process like any sample's error, the worker alive; num_workers=0, which
pickles nothing, unchanged."""

from __future__ import annotations

import pytest

import fastload

from helpers import MP_TIMEOUT
from helpers.unpicklable import (
    BAD_PATHS, BadPartAt, Box, LocalNamedtupleSamples, RebuildFailsAt,
)

pytestmark = pytest.mark.timeout(MP_TIMEOUT)

N, BATCH, BAD = 16, 4, 5  # sample 5: the second batch


def _epoch(loader) -> tuple[list[object], set[int]]:
    """Each batch's indices, or the exception it raised; the pids that loaded the batches."""
    out: list[object] = []
    pids: set[int] = set()
    it = iter(loader)
    while True:
        try:
            b = next(it)
        except StopIteration:
            return out, pids
        except Exception as e:  # noqa: BLE001 - the exception is the result
            out.append(e)
            continue
        if isinstance(b, list):  # stack=False: the samples
            b = {k: [int(s[k]) for s in b] for k in ("x", "pid")}
        out.append([int(x) for x in b["x"]])
        pids.update(int(p) for p in b["pid"])


@pytest.mark.parametrize("on_death", ["raise", "restart"])
@pytest.mark.parametrize("kind", sorted(BAD_PATHS))
def test_an_unpicklable_part_fails_its_batch_not_the_worker(kind, on_death):
    path, type_name = BAD_PATHS[kind]
    with fastload.Loader(BadPartAt(N, BAD, kind), BATCH, num_workers=1,
                         on_worker_death=on_death) as loader:
        out, pids = _epoch(loader)
        assert [o for i, o in enumerate(out) if i != 1] == [[0, 1, 2, 3], [8, 9, 10, 11],
                                                           [12, 13, 14, 15]], out
        e = out[1]
        assert type(e) is TypeError, repr(e)
        text = str(e)
        assert f"sample index {BAD}" in text and path in text and type_name in text, text
        assert "which cannot be pickled" in text and "num_workers=0" in text, text
        assert len(pids) == 1, pids  # one worker loaded every batch: it did not die
        assert loader.stats()["worker_restarts"] == 0
        again, pids_again = _epoch(loader)  # the next epoch: the same, same worker
        assert [type(o) for o in again] == [list, TypeError, list, list]
        assert pids_again == pids


def test_memoryview_advice_names_the_conversions():
    with fastload.Loader(BadPartAt(N, BAD, "memoryview"), BATCH, num_workers=1) as loader:
        out, _ = _epoch(loader)
    assert "bytes(view)" in str(out[1]) and "np.asarray(view)" in str(out[1])


def test_every_start_method(start_method):
    with fastload.Loader(BadPartAt(N, BAD, "lock"), BATCH, num_workers=2,
                         start_method=start_method) as loader:
        out, pids = _epoch(loader)
        assert [type(o) for o in out] == [list, TypeError, list, list], out
        assert f"sample index {BAD}" in str(out[1]) and "sample['meta'].part" in str(out[1])
        assert loader.stats()["worker_restarts"] == 0


@pytest.mark.parametrize("on_death", ["raise", "restart"])
def test_a_namedtuple_class_defined_in_a_function_as_the_sample_structure(on_death):
    """The layout holds the sample's namedtuple class (batches are built of it), and a worker
    sends the layout pickled: the first sample's error, the worker alive."""
    with fastload.Loader(LocalNamedtupleSamples(8), 4, num_workers=1,
                         on_worker_death=on_death) as loader:
        out, _ = _epoch(loader)
        assert out and all(type(o) is TypeError for o in out), out
        text = str(out[0])
        assert "sample index 0" in text and "namedtuple of class" in text, text
        assert "top level of a module" in text, text
        assert loader.stats()["worker_restarts"] == 0


def test_stack_false_names_the_sample_and_the_part():
    with fastload.Loader(BadPartAt(N, BAD, "lock"), BATCH, num_workers=1,
                         stack=False) as loader:
        out, _ = _epoch(loader)
    assert type(out[1]) is TypeError, out
    text = str(out[1])
    assert f"sample index {BAD}" in text and "sample['meta'].part" in text, text


@pytest.mark.parametrize("kind", sorted(BAD_PATHS))
def test_num_workers_0_is_unchanged(kind):
    """Nothing crosses a process: the batch holds the objects themselves."""
    with fastload.Loader(BadPartAt(N, BAD, kind), BATCH, num_workers=0) as loader:
        batches = list(loader)
    assert len(batches) == 4
    meta = batches[1]["meta"]
    assert meta[0] == Box(4) and meta[BAD - BATCH] is not None
    if kind == "memoryview":
        assert type(meta[BAD - BATCH]) is memoryview


def test_num_workers_0_namedtuple_sample_is_unchanged():
    with fastload.Loader(LocalNamedtupleSamples(8), 4, num_workers=0) as loader:
        b = next(iter(loader))
    assert type(b).__name__ == "Local" and b.a.tolist() == [0, 1, 2, 3]


def test_a_part_that_pickles_but_cannot_be_rebuilt_fails_its_batch_with_a_note():
    """Rebuilt in the main process: its error, with a note saying what was being rebuilt."""
    with fastload.Loader(RebuildFailsAt(N, BAD), BATCH, num_workers=1) as loader:
        out, pids = _epoch(loader)
        assert [type(o) for o in out] == [list, ValueError, list, list], out
        notes = "\n".join(getattr(out[1], "__notes__", []))
        assert "cannot rebuild" in str(out[1]) and "a batch a worker pickled" in notes
        assert len(pids) == 1 and loader.stats()["worker_restarts"] == 0


def test_the_part_is_found_in_a_structure_that_refers_to_itself():
    import threading

    from fastload._ragged import unpicklable_part

    box = Box(None)
    box.part = [box] * 10 + [{"ok": 1, "lock": threading.Lock()}]
    path, value, error = unpicklable_part(box, "sample['meta']")
    assert path == "sample['meta'].part[10]['lock']" and isinstance(error, TypeError)
    assert unpicklable_part({"a": [1, 2], "b": Box(3)}, "sample") is None
