"""fastload.compat.chainer.MultiprocessIterator against Chainer 7.8.1's own iterators.

The reference is the real thing, side by side: ``chainer.iterators.SerialIterator`` (which
calls the order sampler exactly when a batch needs it, as ours does) and
``chainer.iterators.MultiprocessIterator``. Chainer needs NumPy < 2 (see README.md); without it
every test but the ImportError one skips.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import fastload

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # chainer 7.8.1 imports numpy.distutils (deprecated)
        import chainer
        import chainer.links as L
        from chainer import serializers, training
        from chainer.iterators import MultiprocessIterator as ChainerMP
        from chainer.iterators import SerialIterator, ShuffleOrderSampler
        from chainer.training import extensions
except Exception:  # not installed, or broken by NumPy 2
    chainer = None

if chainer is not None:
    from fastload.compat.chainer import MultiprocessIterator

from helpers.chainer import (  # noqa: E402
    Arrays,
    CountingShuffle,
    Dicts,
    ExitsOnce,
    Fails,
    IndexType,
    Ints,
    Mixed,
    Pid,
    RollSampler,
    Slow,
    Tuples,
    Varying,
)

needs_chainer = pytest.mark.skipif(
    chainer is None, reason="chainer not installed (needs numpy<2: see README)"
)
pytestmark = [
    pytest.mark.timeout(60),
    # Chainer's own MultiprocessIterator starts its prefetch thread with Thread.setDaemon().
    pytest.mark.filterwarnings("ignore:setDaemon\\(\\) is deprecated:DeprecationWarning"),
]

DATASETS = {"tuples": Tuples, "dicts": Dicts, "arrays": Arrays, "ints": Ints, "mixed": Mixed,
            "varying": Varying}


@pytest.fixture(scope="module", autouse=True)
def _multiprocessing_heap():
    """Chainer's MultiprocessIterator allocates its shared memory from multiprocessing's heap,
    whose first arena (two fds on a deleted /dev/shm file) lives until the interpreter exits:
    create it before the leak check's snapshots, as conftest does for the forkserver."""
    from multiprocessing import sharedctypes

    arena = sharedctypes.RawArray("b", 1 << 20)
    del arena
    yield


# -- helpers ------------------------------------------------------------------------------------
def same(a, b, path="batch") -> None:
    """Same structure, types, dtypes, shapes and values."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__} ({a!r}, {b!r})"
    if isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{path}: {a!r} != {b!r}"
        if a.dtype.hasobject:
            assert a.tolist() == b.tolist(), path
        else:
            assert np.array_equal(a, b), f"{path}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def attrs(it) -> tuple:
    return (it.epoch, it.current_position, it.is_new_epoch, it.epoch_detail,
            it.previous_epoch_detail)


def trace(it, steps: int) -> list:
    """Each step's batch (or "stop") and the attributes after it."""
    out = []
    for _ in range(steps):
        try:
            batch = it.next()
        except StopIteration:
            batch = "stop"
        out.append((batch, attrs(it)))
    return out


def same_trace(a, b) -> None:
    assert len(a) == len(b)
    for step, ((ba, sa), (bb, sb)) in enumerate(zip(a, b)):
        same(ba, bb, f"step {step}")
        assert sa == sb, f"step {step}: attributes {sa} != {sb}"


def make(kind, ds, batch_size, mode=None, seed=0, **kw):
    """kind: ours / chainer / serial. mode: seq (shuffle=False), shuffle (shuffle=True on the
    global NumPy RNG, seeded here), default (shuffle=None: the same), sampler (a
    ShuffleOrderSampler over RandomState(seed)), roll (a stateless RollSampler), None (as kw)."""
    if mode == "seq":
        kw["shuffle"] = False
    elif mode in ("shuffle", "default"):
        np.random.seed(seed)
        if mode == "shuffle":
            kw["shuffle"] = True
    elif mode == "sampler":
        kw["order_sampler"] = ShuffleOrderSampler(np.random.RandomState(seed))
    elif mode == "roll":
        kw["order_sampler"] = RollSampler()
    if kind == "serial":
        kw.pop("n_processes", None)
        return SerialIterator(ds, batch_size, **kw)
    kw.setdefault("n_processes", 2)
    return (MultiprocessIterator if kind == "ours" else ChainerMP)(ds, batch_size, **kw)


def steps_for(n: int, batch_size: int, repeat: bool) -> int:
    return (3 * n) // batch_size + 2 if repeat else -(-n // batch_size) + 2


# -- import without Chainer ---------------------------------------------------------------------
def test_import_error_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['chainer'] = None  # import chainer fails\n"
        "try:\n"
        "    import fastload.compat.chainer\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    env = dict(os.environ)
    root = str(Path(fastload.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    msg = proc.stdout
    for needle in ("fastload.compat.chainer needs Chainer 7.8.1", "numpy<2", "setuptools<70",
                   "--no-build-isolation chainer==7.8.1"):
        assert needle in msg, msg


# -- same batches and attributes ----------------------------------------------------------------
CASES = [
    # (dataset, n, batch_size, mode, repeat)
    ("tuples", 10, 4, "seq", True),
    ("tuples", 10, 4, "sampler", True),
    ("tuples", 10, 4, "shuffle", False),
    ("dicts", 12, 4, "default", True),
    ("dicts", 9, 4, "sampler", False),
    ("arrays", 3, 8, "sampler", True),  # every batch spans several epochs
    ("arrays", 7, 7, "seq", False),
    ("ints", 11, 3, "roll", True),
    ("ints", 5, 2, "shuffle", False),
    ("mixed", 6, 4, "seq", True),
    ("mixed", 7, 3, "sampler", False),
    ("varying", 13, 4, "seq", True),
    ("varying", 9, 3, "shuffle", False),
]


@needs_chainer
@pytest.mark.parametrize("name,n,bs,mode,repeat", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_same_as_serial_iterator(name, n, bs, mode, repeat) -> None:
    steps = steps_for(n, bs, repeat)
    ref = trace(make("serial", DATASETS[name](n), bs, mode, repeat=repeat), steps)
    with make("ours", DATASETS[name](n), bs, mode, repeat=repeat) as it:
        same_trace(trace(it, steps), ref)


MP_CASES = [
    ("tuples", 10, 4, "sampler", True),
    ("mixed", 6, 4, "seq", False),
    ("dicts", 9, 4, "shuffle", False),
    ("ints", 3, 8, "roll", True),
]


@needs_chainer
@pytest.mark.parametrize("name,n,bs,mode,repeat", MP_CASES,
                         ids=["-".join(map(str, c)) for c in MP_CASES])
def test_same_as_chainer_multiprocess_iterator(name, n, bs, mode, repeat) -> None:
    steps = steps_for(n, bs, repeat)
    with make("chainer", DATASETS[name](n), bs, mode, repeat=repeat) as ref_it:
        ref = trace(ref_it, steps)
    with make("ours", DATASETS[name](n), bs, mode, repeat=repeat) as it:
        same_trace(trace(it, steps), ref)


@needs_chainer
def test_dataset_gets_numpy_indices_as_from_chainer() -> None:
    with make("ours", IndexType(), 4, "seq", repeat=False) as it:
        assert it.next() == [type(np.intp(0)).__name__] * 4
    with make("chainer", IndexType(), 4, "seq", repeat=False) as ref:
        assert ref.next() == [type(np.intp(0)).__name__] * 4


@needs_chainer
def test_replacing_chainers_class(monkeypatch) -> None:
    """Code that builds Chainer's iterator itself can be pointed at ours: the module holds
    Chainer's originals (TimeoutWarning, the state machine) from import time."""
    original = chainer.iterators.MultiprocessIterator
    monkeypatch.setattr(chainer.iterators, "MultiprocessIterator", MultiprocessIterator)
    with chainer.iterators.MultiprocessIterator(Ints(10), 4, shuffle=False, n_processes=1) as it:
        assert it.TimeoutWarning is original.TimeoutWarning
        assert it.next() == [0, 10, 20, 30]
        with copy.copy(it) as c:
            assert type(c) is MultiprocessIterator and c.next() == [40, 50, 60, 70]


@needs_chainer
def test_one_worker_deep_prefetch_tiny_epochs() -> None:
    ref = trace(make("serial", Tuples(5), 2, "sampler"), 40)
    with make("ours", Tuples(5), 2, "sampler", n_processes=1, n_prefetch=3) as it:
        same_trace(trace(it, 40), ref)


@needs_chainer
def test_workers_load_the_samples() -> None:
    with make("ours", Pid(), 8, "seq", n_processes=2) as it:
        pids = {p for _ in range(16) for p in it.next()}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


@needs_chainer
@pytest.mark.parametrize("repeat", [True, False])
def test_empty_dataset_as_chainer(repeat) -> None:
    """Chainer's iterators fail on an empty dataset: ValueError with repeat=True; with
    repeat=False, ZeroDivisionError computing epoch_detail (MultiprocessIterator with
    shared_mem set: without it, measuring the first batch fails first)."""
    errors = []
    for kind in ("chainer", "ours"):
        with make(kind, Ints(0), 4, "sampler", repeat=repeat,
                  shared_mem=None if repeat else 64) as it:
            with pytest.raises(Exception) as e:
                it.next()
            errors.append((type(e.value), str(e.value)))
    assert errors[0] == errors[1]
    assert errors[0][0] is (ValueError if repeat else ZeroDivisionError)


@needs_chainer
def test_samples_stay_valid_while_held() -> None:
    ref = make("serial", Tuples(40), 4, "seq")
    with make("ours", Tuples(40), 4, "seq") as it:
        held = [it.next() for _ in range(25)]  # beyond max_held: the later ones are copies
        for b in held:
            same(b, ref.next())


# -- order samplers -------------------------------------------------------------------------------
@needs_chainer
def test_order_sampler_called_as_chainer_calls_it() -> None:
    """Same arguments, same number of calls as SerialIterator for any next()/reset() sequence
    (ours calls it when a batch needs the new order); Chainer's MultiprocessIterator makes the
    same calls, some of them ahead of time (its prefetch thread)."""
    ops = ["next"] * 7 + ["reset"] + ["next"] * 6
    out = {}
    for kind in ("serial", "ours"):
        sampler = RollSampler()
        it = make(kind, Ints(10), 4, order_sampler=sampler)
        steps = []
        for op in ops:
            if op == "reset":
                it.reset()
                steps.append((None, attrs(it)))
            else:
                steps.append((it.next(), attrs(it)))
        it.finalize()
        out[kind] = (steps, sampler.calls)
    same_trace(out["ours"][0], out["serial"][0])
    assert out["ours"][1] == out["serial"][1]

    sampler = RollSampler()
    with make("ours", Ints(10), 4, order_sampler=sampler) as it:
        first = trace(it, 7)
        ours_calls = list(sampler.calls)
    sampler = RollSampler()
    with make("chainer", Ints(10), 4, order_sampler=sampler) as ref:
        same_trace(first, trace(ref, 7))
        assert sampler.calls[: len(ours_calls)] == ours_calls


@needs_chainer
def test_seeded_shuffle_sampler_and_reset() -> None:
    """A ShuffleOrderSampler over RandomState(0) gives SerialIterator's batches, reset() too."""
    out = []
    for kind in ("serial", "ours"):
        sampler = CountingShuffle(0)
        it = make(kind, Tuples(10), 3, order_sampler=sampler)
        t = trace(it, 9)
        it.reset()
        t += [(None, attrs(it))] + trace(it, 9)
        it.finalize()
        out.append((t, sampler.calls))
    same_trace(out[1][0], out[0][0])
    assert out[1][1] == out[0][1]


# -- reset, copy, pickle, finalize -----------------------------------------------------------------
@needs_chainer
def test_reset_mid_epoch_and_after_the_end() -> None:
    for repeat in (True, False):
        ref = make("serial", Dicts(9), 4, "roll", repeat=repeat)
        with make("ours", Dicts(9), 4, "roll", repeat=repeat) as it:
            for x in (ref, it):
                x.next()
            it.reset()
            ref.reset()
            assert attrs(it) == attrs(ref) == (0, 0, False, 0.0, None)
            same_trace(trace(it, 6), trace(ref, 6))
            it.reset()
            ref.reset()
            same_trace(trace(it, 6), trace(ref, 6))


@needs_chainer
@pytest.mark.parametrize("mode", ["roll", "seq"])
def test_copy_as_chainer(mode) -> None:
    out = {}
    for kind in ("chainer", "ours"):
        it = make(kind, Ints(10), 4, mode, dataset_timeout=5.0)
        before = trace(it, 3)
        np.random.seed(1)  # copying a shuffle=False iterator draws once from np.random
        c = copy.copy(it)
        out[kind] = (before, attrs(c), trace(c, 6), trace(it, 6), type(c.order_sampler),
                     c.dataset_timeout, np.random.randint(1 << 30))
        c.finalize()
        it.finalize()
    a, b = out["ours"], out["chainer"]
    same_trace(a[0], b[0])
    assert a[1] == b[1]
    same_trace(a[2], b[2])
    same_trace(a[3], b[3])
    assert a[4] is b[4] and a[5] == b[5] == 30.0 and a[6] == b[6]


@needs_chainer
def test_pickle_round_trip() -> None:
    with make("ours", Tuples(10), 4, "roll") as it:
        trace(it, 3)
        with pickle.loads(pickle.dumps(it)) as other:
            assert attrs(other) == attrs(it)
            same_trace(trace(other, 8), trace(it, 8))


@needs_chainer
def test_finalize_and_context_manager() -> None:
    it = make("ours", Tuples(10), 4, "seq")
    it.next()
    loader = it._loader
    assert loader is not None and loader._engine.pool is not None
    it.finalize()
    it.finalize()  # idempotent
    assert loader._engine.closed and it._loader is None
    with pytest.raises(fastload.LoaderClosedError):
        it.next()
    ref = make("chainer", Tuples(10), 4, "seq")
    ref.finalize()
    for x in (it, ref):  # Chainer's message and type
        with pytest.raises(NotImplementedError, match="Reset of finalized"):
            x.reset()
    with make("ours", Tuples(10), 4, "seq") as it2:
        it2.next()
    assert it2._finalized
    it3 = make("ours", Tuples(10), 4, "seq")
    it3.next()
    del it3  # garbage collection finalizes (the conftest checks for leaked workers)


# -- snapshots ----------------------------------------------------------------------------------
SNAPSHOT_CASES = [
    ("ours", "ours"), ("chainer", "ours"), ("ours", "chainer"), ("serial", "ours"),
]


@needs_chainer
@pytest.mark.parametrize("mode,steps", [("roll", 8), ("sampler", 4)])
@pytest.mark.parametrize("src,dst", SNAPSHOT_CASES, ids=["-".join(c) for c in SNAPSHOT_CASES])
def test_snapshot_round_trip(src, dst, mode, steps, tmp_path) -> None:
    """save_npz mid-epoch from one iterator, load_npz into another that has already run: the
    same attributes and the same following batches. With a seeded ShuffleOrderSampler (whose
    random state a snapshot does not hold) only the rest of the epoch is compared."""
    path = str(tmp_path / "iterator.npz")
    a = make(src, Tuples(12), 2, mode)
    trace(a, 2)  # position 4 of epoch 0: 4 batches to the end of the epoch
    serializers.save_npz(path, a)
    saved = attrs(a)
    b = make(dst, Tuples(12), 2, mode, seed=1)
    trace(b, 3)  # somewhere else, with batches prefetched
    serializers.load_npz(path, b)
    assert attrs(b) == saved
    same_trace(trace(b, steps), trace(a, steps))
    a.finalize()
    b.finalize()


@needs_chainer
def test_saving_keeps_the_stream(tmp_path) -> None:
    """serialize() while saving changes nothing: the batches, and the order sampler's calls, are
    those of a run without a snapshot (SerialIterator's)."""
    sampler = CountingShuffle(0)
    with make("ours", Tuples(10), 4, order_sampler=sampler) as it:
        t = []
        for k in range(12):
            t += trace(it, 1)
            if k % 3 == 1:
                serializers.save_npz(str(tmp_path / f"s{k}.npz"), it)
        ref_sampler = CountingShuffle(0)
        same_trace(t, trace(make("serial", Tuples(10), 4, order_sampler=ref_sampler), 12))
        assert sampler.calls == ref_sampler.calls


@needs_chainer
def test_snapshot_keys_and_old_format() -> None:
    with make("ours", Tuples(10), 4, "roll") as it:
        trace(it, 2)
        d = serializers.DictionarySerializer()
        d.save(it)
        assert sorted(d.target) == ["current_position", "epoch", "is_new_epoch", "order",
                                    "previous_epoch_detail"]
    # A snapshot from an old Chainer: "_order", and no previous_epoch_detail (Chainer guesses).
    old = {"current_position": np.asarray(8), "epoch": np.asarray(1),
           "is_new_epoch": np.asarray(False), "_order": np.arange(10)[::-1].copy()}
    results = []
    for kind in ("chainer", "ours"):
        with make(kind, Tuples(10), 4, "roll") as x:
            serializers.NpzDeserializer(old).load(x)
            results.append((attrs(x), trace(x, 5)))
    assert results[0][0] == results[1][0]
    same_trace(results[1][1], results[0][1])


@needs_chainer
def test_shuffle_false_snapshots_have_no_order(tmp_path) -> None:
    """Chainer's MultiprocessIterator cannot serialize with shuffle=False (order is None);
    ours writes what SerialIterator writes, and loads it back."""
    with make("ours", Ints(10), 4, "seq") as it:
        trace(it, 3)
        serializers.save_npz(str(tmp_path / "s.npz"), it)
        with make("ours", Ints(10), 4, "seq") as other:
            serializers.load_npz(str(tmp_path / "s.npz"), other)
            same_trace(trace(other, 5), trace(it, 5))
    ser = make("serial", Ints(10), 4, "seq")
    trace(ser, 3)
    d1, d2 = serializers.DictionarySerializer(), serializers.DictionarySerializer()
    d1.save(ser)
    with make("ours", Ints(10), 4, "seq") as it:
        trace(it, 3)
        d2.save(it)
    assert sorted(d1.target) == sorted(d2.target)
    ref = make("chainer", Ints(10), 4, "seq")
    with pytest.raises(AttributeError):
        serializers.DictionarySerializer().save(ref)
    ref.finalize()


# -- dataset_timeout, errors, arguments ------------------------------------------------------------
@needs_chainer
def test_dataset_timeout_warns_and_waits() -> None:
    assert MultiprocessIterator.TimeoutWarning is ChainerMP.TimeoutWarning
    with make("ours", Slow(8, 5, 0.6), 2, "seq", repeat=False, n_processes=1,
              dataset_timeout=0.2) as it:
        with pytest.warns(ChainerMP.TimeoutWarning) as rec:
            batches = list(it)
    assert [[float(v) for v in b] for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    msgs = [str(w.message) for w in rec if w.category is ChainerMP.TimeoutWarning]
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("Stalled dataset is detected.") and "sample index 5" in msgs[0]


@needs_chainer
def test_dataset_timeout_as_error_then_resume() -> None:
    """Chainer's documented recipe: warnings.simplefilter('error', TimeoutWarning)."""
    with make("ours", Slow(8, 5, 0.5), 2, "seq", n_processes=1, dataset_timeout=0.1) as it:
        assert [float(v) for v in it.next() + it.next()] == [0, 1, 2, 3]
        with warnings.catch_warnings():
            warnings.simplefilter("error", MultiprocessIterator.TimeoutWarning)
            with pytest.raises(MultiprocessIterator.TimeoutWarning):
                it.next()
        assert it.current_position == 4
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MultiprocessIterator.TimeoutWarning)
            assert [float(v) for v in it.next()] == [4, 5]


@needs_chainer
def test_no_warning_without_dataset_timeout() -> None:
    with make("ours", Slow(4, 2, 0.3), 2, "seq", repeat=False, n_processes=1,
              dataset_timeout=None) as it:
        assert len(list(it)) == 2  # filterwarnings=error: a warning would fail the test


@needs_chainer
def test_dataset_error_is_raised_and_the_batch_retried() -> None:
    with make("ours", Fails(6, 3), 2, "seq") as it:
        assert [float(v) for v in it.next()] == [0, 1]
        for _ in range(2):
            with pytest.raises(KeyError, match="no sample 3"):
                it.next()
            assert (it.epoch, it.current_position) == (0, 2)


@needs_chainer
@pytest.mark.crash
def test_dead_worker_is_raised_and_the_batch_retried(tmp_path) -> None:
    """Chainer's iterator waits forever for a batch whose worker died; ours raises WorkerDied
    (the worker is restarted) and loads the batch again at the next next()."""
    ds = ExitsOnce(8, 5, str(tmp_path / "died"))
    with make("ours", ds, 2, "seq") as it:
        got = trace(it, 2)
        with pytest.raises(fastload.WorkerDied, match="sample index 5"):
            it.next()
        assert (it.epoch, it.current_position) == (0, 4)
        got += trace(it, 4)
    same_trace(got, trace(make("serial", ds, 2, "seq"), 6))  # (in this process: after the exit)


ARG_CASES = [
    dict(),
    dict(shuffle=False, n_processes=0, n_prefetch=0, shared_mem=1 << 20, dataset_timeout=None),
    dict(shuffle=True, repeat=False, n_processes=3, n_prefetch=4, dataset_timeout=2.5),
]


@needs_chainer
@pytest.mark.parametrize("kw", ARG_CASES)
def test_attributes_as_chainer(kw) -> None:
    with ChainerMP(Ints(10), 4, **kw) as ref, MultiprocessIterator(Ints(10), 4, **kw) as it:
        for name in ("batch_size", "repeat", "shuffle", "n_processes", "n_prefetch",
                     "shared_mem", "dataset_timeout", "epoch", "current_position",
                     "is_new_epoch", "epoch_detail", "previous_epoch_detail"):
            assert getattr(it, name) == getattr(ref, name), name
        assert type(it.order_sampler) is type(ref.order_sampler)
        assert it.dataset is ref.dataset or type(it.dataset) is type(ref.dataset)
        assert isinstance(it, chainer.dataset.Iterator) and iter(it) is it


@needs_chainer
def test_argument_errors_as_chainer() -> None:
    sampler = ShuffleOrderSampler()
    msgs = []
    for cls in (ChainerMP, MultiprocessIterator):
        with pytest.raises(ValueError) as e:
            cls(Ints(10), 4, shuffle=True, order_sampler=sampler)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    # Chainer's pool rejects these at the first next(); ours at construction, same errors.
    for kw, match in ((dict(n_processes=-1), "Number of processes must be at least 1"),
                      (dict(maxtasksperchild=0), "maxtasksperchild must be a positive int")):
        ref = ChainerMP(Ints(10), 4, shuffle=False, **kw)
        with pytest.raises(ValueError, match=match):
            ref.next()
        ref.finalize()
        with pytest.raises(ValueError, match=match):
            MultiprocessIterator(Ints(10), 4, shuffle=False, **kw)
    with pytest.raises(ValueError, match="batch_size"):
        MultiprocessIterator(Ints(10), 0)
    with pytest.warns(UserWarning, match="ignores maxtasksperchild"):
        it = MultiprocessIterator(Ints(10), 4, shuffle=False, maxtasksperchild=10)
    with it:
        assert it.next() == [0, 10, 20, 30]


# -- Chainer's training loop -------------------------------------------------------------------------
def _train(kind: str, out: Path) -> tuple:
    rng = np.random.RandomState(0)
    x = rng.standard_normal((40, 4)).astype(np.float32)
    t = (np.arange(40) % 3).astype(np.int32)
    data = chainer.datasets.TupleDataset(x, t)
    np.random.seed(0)
    model = L.Classifier(L.Linear(4, 3))
    opt = chainer.optimizers.SGD(lr=0.1)
    opt.setup(model)
    if kind == "serial":
        train_it = SerialIterator(data, 8, order_sampler=ShuffleOrderSampler(
            np.random.RandomState(0)))
        val_it = SerialIterator(data, 16, repeat=False, shuffle=False)
    else:
        cls = MultiprocessIterator if kind == "ours" else ChainerMP
        train_it = cls(data, 8, n_processes=2,
                       order_sampler=ShuffleOrderSampler(np.random.RandomState(0)))
        val_it = cls(data, 16, repeat=False, shuffle=False, n_processes=2)
    updater = training.updaters.StandardUpdater(train_it, opt)
    trainer = training.Trainer(updater, (2, "epoch"), out=str(out))
    trainer.extend(extensions.Evaluator(val_it, model), trigger=(1, "epoch"))
    log = extensions.LogReport(trigger=(1, "epoch"), filename=None)
    trainer.extend(log)
    trainer.run()
    entries = [{k: v for k, v in e.items() if k != "elapsed_time"} for e in log.log]
    return updater.iteration, entries, model.predictor.W.array.copy()


@needs_chainer
def test_trainer_with_evaluator(tmp_path) -> None:
    ref = _train("serial", tmp_path / "serial")
    for kind in ("ours", "chainer"):
        it, log, w = _train(kind, tmp_path / kind)
        assert it == ref[0] == 10
        assert log == ref[1], kind
        assert np.array_equal(w, ref[2]), kind


@needs_chainer
def test_iterators_share_a_fastload_pool() -> None:
    # pool= (a fastload extra): the train and test iterators, and Evaluator-style copies, use
    # the pool's workers; batches are the same as with workers of their own.
    with fastload.Pool(2) as pool:
        train = make("ours", Tuples(10), 4, "roll", pool=pool)
        test = make("ours", Ints(7), 3, None, repeat=False, shuffle=False, pool=pool)
        ref_train = make("serial", Tuples(10), 4, "roll")
        ref_test = make("serial", Ints(7), 3, None, repeat=False, shuffle=False)
        got_train, got_test = trace(train, 4), trace(test, 4)  # both loaders are live
        same_trace(got_train, trace(ref_train, 4))
        same_trace(got_test, trace(ref_test, 4))
        c = copy.copy(train)
        same_trace(trace(c, 3), trace(copy.copy(ref_train), 3))
        pids = {p.pid for p in pool._workers.procs}
        with make("ours", Pid(), 8, "seq", pool=pool) as where:
            assert {int(x) for x in where.next()} <= pids  # loaded by the pool's workers
        for it in (train, test, c):
            assert it._loader is not None and it._loader._engine.shared_pool is pool
            it.finalize()
        assert not pool.closed  # finalize() leaves the pool running
        with pickle.loads(pickle.dumps(make("ours", Tuples(10), 4, "roll", pool=pool))) as own:
            own.next()
            assert own._loader._engine.shared_pool is None  # pools do not pickle: own workers
    with pytest.raises(TypeError, match="fastload.Pool"):
        make("ours", Tuples(10), 4, "roll", pool=2)


@needs_chainer
def test_a_list_dataset_is_shared_with_the_workers() -> None:
    # Chainer users pass plain lists: of str here (file names), shared by default.
    names = [f"img{i:05d}.png" for i in range(12_000)]
    ref = trace(make("serial", names, 500, "seq", repeat=False), 24)
    with make("ours", names, 500, "seq", repeat=False) as it:
        got = trace(it, 24)
        shared = it._loader.stats()["shared_dataset"]
    same_trace(got, ref)
    assert [(e["attribute"], e["kind"]) for e in shared] == [("dataset.dataset", "str")]
