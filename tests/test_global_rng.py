"""Augmentation drawn from the global RNGs inside ``__getitem__`` (``random``, ``np.random``,
torch's generator) is reproducible: the same batches for any num_workers, start method, shared
rows, skips and resume (NOTE [global RNGs] in fastload/_rngs.py); assign="round_robin" is
torch's order of workers."""

from __future__ import annotations

import random

import numpy as np
import pytest

import fastload
from tests.helpers.rngs import (
    Augmented,
    AugmentedBatches,
    FailingAugmented,
    LateDraws,
    Which,
)


def _epochs(dataset, epochs=2, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("shuffle", True)
    with fastload.Loader(dataset, seed=11, **kw) as loader:
        out = np.concatenate([b for _ in range(epochs) for b in loader])
        stats = loader.stats()
    return out, stats


def test_the_same_batches_for_any_worker_count(start_method):
    ref, stats = _epochs(Augmented(40), num_workers=0)
    assert stats["seeded_globals"]
    assert len(np.unique(ref[:, 1])) == len(ref)  # the draws differ per sample
    # a second epoch draws anew (the epoch is part of the seed)
    assert not np.array_equal(ref[:40][np.argsort(ref[:40, 0])],
                              ref[40:][np.argsort(ref[40:, 0])])
    for workers in (1, 2, 3):
        out, stats = _epochs(Augmented(40), num_workers=workers, start_method=start_method)
        np.testing.assert_array_equal(out, ref)
        assert stats["seeded_globals"]


def test_shared_rows_and_whole_batches_draw_the_same():
    # slow rows: the first and last batches are shared between the workers (fill_rows)
    ref, _ = _epochs(Augmented(48, delay=0.004), epochs=1, batch_size=8, num_workers=0)
    out, stats = _epochs(Augmented(48, delay=0.004), epochs=1, batch_size=8, num_workers=2)
    assert stats["shared_rows"]
    np.testing.assert_array_equal(out, ref)


def test_the_users_own_rng_is_untouched_with_num_workers_0():
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    _epochs(Augmented(12), num_workers=0)
    assert (random.random(), np.random.rand()) == expected


def test_a_dataset_that_does_not_draw_is_not_seeded():
    # detection at the first sample (index 0, not shuffled): it does not draw, so no sample
    # is seeded
    _, stats = _epochs(LateDraws(16), epochs=1, num_workers=0, shuffle=False)
    assert not stats["seeded_globals"]
    # seed_globals=True seeds every sample regardless: any worker count agrees
    ref, stats = _epochs(LateDraws(16), num_workers=0, seed_globals=True)
    assert stats["seeded_globals"]
    out, _ = _epochs(LateDraws(16), num_workers=2, seed_globals=True, start_method="fork")
    np.testing.assert_array_equal(out, ref)


def test_seed_globals_false_leaves_each_workers_own_streams():
    ref, _ = _epochs(Augmented(40), num_workers=0)
    out, stats = _epochs(Augmented(40), num_workers=2, seed_globals=False, start_method="fork")
    assert not stats["seeded_globals"]
    np.testing.assert_array_equal(out[:, 0], ref[:, 0])  # the same samples
    assert not np.array_equal(out[:, 1:], ref[:, 1:])  # drawn from the workers' own streams


def test_getitems_is_seeded_once_per_batch():
    ref, stats = _epochs(AugmentedBatches(30), num_workers=0)
    assert stats["seeded_globals"]
    out, _ = _epochs(AugmentedBatches(30), num_workers=2, start_method="fork")
    np.testing.assert_array_equal(out, ref)


def test_skipped_samples_draw_as_the_sample_loaded_in_their_place():
    kw = dict(on_error="skip", epochs=1)
    ref, _ = _epochs(FailingAugmented(32, {3, 17}), num_workers=0, **kw)
    out, _ = _epochs(FailingAugmented(32, {3, 17}), num_workers=2, start_method="fork", **kw)
    np.testing.assert_array_equal(out, ref)
    plain, _ = _epochs(Augmented(32), num_workers=0, epochs=1)
    # a replacement's values are those of the sample it is (seeded by its own index)
    rows = {int(r[0]): r for r in plain}
    for r in out:
        np.testing.assert_array_equal(r, rows[int(r[0])])


def test_a_resume_on_another_worker_count_draws_the_rest_the_same():
    ref, _ = _epochs(Augmented(40), epochs=1, num_workers=0)
    with fastload.Loader(Augmented(40), 4, shuffle=True, seed=11, num_workers=2,
                         start_method="fork") as loader:
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = loader.state_dict()
    with fastload.Loader(Augmented(40), 4, shuffle=True, seed=11, num_workers=3,
                         start_method="fork") as loader:
        loader.load_state_dict(state)
        tail = list(loader)
    np.testing.assert_array_equal(np.concatenate(head + tail), ref)


def test_thread_workers_never_seed_the_process_rngs():
    random.seed(9)
    expected = random.random()
    random.seed(9)
    out, stats = _epochs(Augmented(16), epochs=1, num_workers=2, worker_method="thread")
    assert not stats["seeded_globals"]
    assert len(out) == 16
    # the threads drew from this process's stream, which nobody re-seeded
    assert expected in out[:, 1]


def test_round_robin_gives_batch_b_to_worker_b_mod_n():
    with fastload.Loader(Which(), 2, num_workers=3, assign="round_robin",
                         start_method="fork") as loader:
        for _ in range(2):
            for b, batch in enumerate(loader):
                assert (batch[:, 1] == b % 3).all(), (b, batch)
        assert not loader.stats()["shared_rows"]


def test_round_robin_makes_each_workers_own_streams_reproducible():
    def run():
        out, _ = _epochs(Which(), num_workers=3, assign="round_robin", seed_globals=False,
                         start_method="fork")
        return out

    first = run()
    np.testing.assert_array_equal(run(), first)


@pytest.mark.parametrize("name, value, error", [
    ("seed_globals", "yes", TypeError),
    ("seed_globals", 2, TypeError),
    ("assign", "rr", ValueError),
])
def test_bad_values_are_refused(name, value, error):
    with pytest.raises(error, match=name):
        fastload.Loader(Augmented(4), 2, num_workers=0, **{name: value})
