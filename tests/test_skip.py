"""on_error="skip": a sample that raises is replaced by the next of its batch that loads
(NOTE [skipped samples] in fastload/_fill.py), the same for any num_workers, start method and
resume; counted, logged, limited by max_skips."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from helpers.skip import Flaky, FlakyGetitems, Mismatch, expected

import fastload

BAD = frozenset({0, 3, 4, 13, 19, 22})


def _xs(loader) -> list[list[int]]:
    return [b["x"][:, 0].tolist() for b in loader]


def _plan(n: int, batch_size: int, **kw) -> list[list[int]]:
    """The loader's plain batches of indices (no dataset errors)."""
    with fastload.Loader(np.arange(n), batch_size, num_workers=0, **kw) as ref:
        return [b.tolist() for b in ref]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_replaced_by_the_next_sample_of_the_batch(num_workers):
    with fastload.Loader(Flaky(24, BAD), 5, num_workers=num_workers, on_error="skip",
                         start_method="fork") as loader:
        got = [(b["x"][:, 0].tolist(), b["name"]) for b in loader]
        stats = loader.stats()
    want = expected(_plan(24, 5), BAD)
    assert [x for x, _ in got] == want
    assert [names for _, names in got] == [[f"s{i}" for i in b] for b in want]
    assert stats["skipped_total"] == len(BAD)
    assert sorted(r["index"] for r in stats["skipped"]) == sorted(BAD)
    rec = next(r for r in stats["skipped"] if r["index"] == 3)
    assert rec == {"epoch": 0, "index": 3, "error": "ValueError: corrupt record 3",
                   "replaced_by": 1}


def test_same_batches_for_any_workers_and_start_method(start_method):
    kw = dict(shuffle=True, seed=7, on_error="skip")
    with fastload.Loader(Flaky(40, BAD), 6, num_workers=0, **kw) as ref:
        want = [_xs(ref), _xs(ref)]  # two epochs
    with fastload.Loader(Flaky(40, BAD), 6, num_workers=3, start_method=start_method,
                         **kw) as loader:
        assert [_xs(loader), _xs(loader)] == want
        assert loader.stats()["skipped_total"] == 2 * len(BAD)
    assert want[0] == expected(_plan(40, 6, shuffle=True, seed=7), BAD)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_that_raises_is_retried_sample_by_sample(num_workers):
    with fastload.Loader(FlakyGetitems(24, BAD), 5, num_workers=num_workers,
                         on_error="skip", start_method="fork") as loader:
        assert _xs(loader) == expected(_plan(24, 5), BAD)
        assert loader.stats()["skipped_total"] == len(BAD)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_first_sample_of_the_epoch_may_raise(num_workers):
    """The probe (the first sample sets the layout) moves on to the next sample of its batch."""
    bad = {0, 1}
    with fastload.Loader(Flaky(6, bad), 3, num_workers=num_workers, on_error="skip",
                         start_method="fork") as loader:
        assert _xs(loader) == [[2, 2, 2], [3, 4, 5]]
        assert loader.layout is not None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_whose_every_sample_raises_raises_and_the_epoch_goes_on(num_workers):
    bad = {5, 6, 7, 8, 9}  # all of batch 1
    with fastload.Loader(Flaky(15, bad), 5, num_workers=num_workers, on_error="skip",
                         start_method="fork") as loader:
        it = iter(loader)
        assert next(it)["x"][:, 0].tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="corrupt record 5"):
            next(it)
        assert next(it)["x"][:, 0].tolist() == [10, 11, 12, 13, 14]
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_max_skips_ends_the_epoch_with_the_reasons(num_workers):
    bad = {3, 7, 8, 12}
    with fastload.Loader(Flaky(20, bad), 5, num_workers=num_workers, on_error="skip",
                         max_skips=2, start_method="fork") as loader:
        it = iter(loader)
        assert next(it)["x"][:, 0].tolist() == [0, 1, 2, 4, 4]
        with pytest.raises(fastload.SkipLimitError) as info:
            next(it)  # batch 1 has 7 and 8: 3 in this epoch
        text = str(info.value)
        assert "3 samples of epoch 0 raised, more than max_skips=2" in text
        for i in (3, 7, 8):
            assert f"sample {i}: ValueError: corrupt record {i}" in text
        assert [i for i, _ in info.value.skipped] == [3, 7, 8]
        with pytest.raises(StopIteration):  # the limit ends the epoch
            next(it)
        # a new epoch counts again from 0: it fails at the same batch
        it = iter(loader)
        next(it)
        with pytest.raises(fastload.SkipLimitError):
            next(it)


def test_skips_are_logged_then_only_counted(caplog):
    bad = set(range(1, 40, 2))  # 20 odd samples
    with caplog.at_level(logging.WARNING, logger="fastload"):
        with fastload.Loader(Flaky(40, bad), 4, num_workers=0, on_error="skip") as loader:
            batches = _xs(loader)
    assert batches == expected(_plan(40, 4), bad)
    lines = [r.getMessage() for r in caplog.records if "on_error='skip'" in r.getMessage()]
    assert len(lines) == 10
    assert lines[0] == ("sample 1 raised ValueError: corrupt record 1; sample 2 was loaded in "
                        "its place (on_error='skip')")
    assert "further skips are only counted" in lines[-1]


@pytest.mark.parametrize("stop", [1, 3])
def test_resume_gives_the_uninterrupted_batches(stop):
    kw = dict(shuffle=True, seed=3, on_error="skip")
    with fastload.Loader(Flaky(30, BAD), 4, num_workers=0, **kw) as ref:
        want = _xs(ref)
    with fastload.Loader(Flaky(30, BAD), 4, num_workers=2, start_method="fork", **kw) as a:
        it = iter(a)
        before = [next(it)["x"][:, 0].tolist() for _ in range(stop)]
        state = a.state_dict()
    with fastload.Loader(Flaky(30, BAD), 4, num_workers=1, start_method="fork", **kw) as b:
        b.load_state_dict(state)
        assert before + _xs(b) == want


def test_skip_records_travel_with_spilled_batches():
    """Object leaves too large for the slot travel over the pipe (a Spill), and the skip
    records of the same batch follow them (filed apart: both reach the batch)."""
    bad = {2, 9}
    with fastload.Loader(Flaky(12, bad, big_from=8), 4, num_workers=2, on_error="skip",
                         start_method="fork") as loader:
        got = [(b["x"][:, 0].tolist(), list(b["name"])) for b in loader]
        stats = loader.stats()
    want = expected(_plan(12, 4), bad)
    assert [x for x, _ in got] == want
    assert [n for _, n in got] == [[f"s{i}" + "x" * (1 << 20) * (i >= 8) for i in b]
                                  for b in want]
    assert stats["spilled_batches"] >= 1
    assert sorted(r["index"] for r in stats["skipped"]) == [2, 9]


def test_a_sample_that_does_not_fit_the_layout_is_not_skipped():
    with fastload.Loader(Mismatch(), 5, num_workers=0, on_error="skip") as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(fastload.LayoutMismatchError):
            next(it)


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got 'ignore'"):
        fastload.Loader(np.arange(4), 2, num_workers=0, on_error="ignore")
    with pytest.raises(ValueError, match="max_skips applies with on_error='skip'"):
        fastload.Loader(np.arange(4), 2, num_workers=0, max_skips=3)
    with pytest.raises(ValueError, match="max_skips must be None or an int >= 0"):
        fastload.Loader(np.arange(4), 2, num_workers=0, on_error="skip", max_skips=-1)

    class Stream:
        def __iter__(self):
            yield from range(3)

    with pytest.raises(ValueError, match="needs a map-style dataset"):
        fastload.Loader(Stream(), 2, num_workers=0, on_error="skip")

    class Shards(fastload.ShardedStream):
        def shards(self):
            return [0]

        def iter_shard(self, shard, start):
            yield from range(start, 3)

    with pytest.raises(ValueError, match="iter_shard cannot go on"):
        fastload.Loader(Shards(), 2, num_workers=0, on_error="skip")


def test_raise_mode_is_unchanged():
    """The default: the batch raises, the next next() goes on (torch's iterator)."""
    with fastload.Loader(Flaky(10, {3}), 5, num_workers=0) as loader:
        it = iter(loader)
        with pytest.raises(ValueError, match="corrupt record 3"):
            next(it)
        assert next(it)["x"][:, 0].tolist() == [5, 6, 7, 8, 9]
        assert loader.stats()["skipped_total"] == 0
