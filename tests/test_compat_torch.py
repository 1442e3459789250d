"""fastload.compat.torch.DataLoader against the real torch.utils.data.DataLoader."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from torch.utils.data import BatchSampler, DistributedSampler, Sampler  # noqa: E402
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

from helpers import MP_TIMEOUT, region_range  # noqa: E402
from helpers.compat import (  # noqa: E402
    ArrayDS,
    EveryLeafDS,
    RaggedDS,
    FailingDS,
    MixedDS,
    ObjArrayDS,
    Point,
    SlowDS,
    StrDS,
    TensorPairDS,
    TorchStream,
    TouchInit,
    WorkerInfoDS,
    pad_collate,
    record_init,
)
import fastload  # noqa: E402
from fastload.compat.torch import DataLoader  # noqa: E402


def same(a, b) -> None:
    """Same structure, types, dtypes and values."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert torch.equal(a, b), (a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def epochs(loader, n=2):
    return [list(loader) for _ in range(n)]


def compare(ds, n_epochs=2, num_workers=0, seed=None, **kw):
    """Reference: torch with num_workers=0 (its order does not depend on workers), or 1
    persistent worker (persistent workers draw the base seed once, not every epoch)."""
    gen = (lambda: torch.Generator().manual_seed(seed)) if seed is not None else (lambda: None)
    torch.manual_seed(1234)
    ref_kw = dict(kw, num_workers=1, multiprocessing_context="fork") if kw.get(
        "persistent_workers") else kw
    ref_loader = TorchDataLoader(ds, generator=gen(), **ref_kw)
    ref = epochs(ref_loader, n_epochs)
    del ref_loader  # stops torch's persistent worker
    gc.collect()
    torch.manual_seed(1234)
    with DataLoader(ds, generator=gen(), num_workers=num_workers, **kw) as dl:
        assert len(dl) == len(ref[0])
        got = epochs(dl, n_epochs)
        same(got, ref)


def test_import_is_lazy():
    code = "import sys, fastload.compat; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import fastload.compat.torch\nexcept ImportError as e:\n"
            "    assert 'pip install torch' in str(e), e\nelse:\n    raise SystemExit(1)")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_order_in_process(shuffle, drop_last):
    compare(ArrayDS(), batch_size=4, shuffle=shuffle, drop_last=drop_last, seed=7)
    compare(ArrayDS(), batch_size=5, shuffle=shuffle, drop_last=drop_last)  # global RNG


@pytest.mark.timeout(60)
def test_order_workers_and_structures():
    compare(ArrayDS(), num_workers=2, batch_size=4, shuffle=True, seed=3)
    compare(ArrayDS(), num_workers=2, batch_size=4, shuffle=True)  # torch.manual_seed
    compare(MixedDS(), num_workers=2, batch_size=3, shuffle=True, seed=5)
    compare(TensorPairDS(), num_workers=2, batch_size=4)


@pytest.mark.timeout(60)
def test_persistent_workers_order():
    compare(ArrayDS(), n_epochs=3, num_workers=2, batch_size=4, shuffle=True,
            persistent_workers=True, seed=11)
    compare(ArrayDS(), n_epochs=3, num_workers=2, batch_size=4, shuffle=True,
            persistent_workers=True)


def test_structures_and_dtypes():
    compare(MixedDS(), batch_size=4)
    with DataLoader(MixedDS(), batch_size=4) as dl:
        b = next(iter(dl))
    assert b["img"].dtype == torch.float32 and b["img"].shape == (4, 2, 3)
    assert type(b["pair"]) is list  # torch turns tuples into lists
    assert b["pair"][0].dtype == torch.int64 and b["pair"][1].dtype == torch.float64
    assert type(b["pt"]) is Point and b["pt"].x.dtype == torch.int32
    assert b["name"] == ["s0", "s1", "s2", "s3"] and b["flag"].dtype == torch.bool


def test_batch_sampler_and_custom_sampler():
    class Odd(Sampler):
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return iter(range(1, self.n, 2))

        def __len__(self):
            return self.n // 2

    compare(ArrayDS(), sampler=Odd(23), batch_size=3)
    bs = BatchSampler(Odd(23), 4, drop_last=False)
    compare(ArrayDS(), batch_sampler=bs)
    uneven = [[0], [1, 2, 3, 4, 5, 6], [7, 8]]  # a plain iterable of lists works too
    compare(ArrayDS(), batch_sampler=uneven)


def test_growing_batch_sampler():
    class Growing:
        def __init__(self):
            self.k = 1

        def __iter__(self):
            self.k += 2
            return iter([list(range(self.k))])

        def __len__(self):
            return 1

    with DataLoader(ArrayDS(), batch_sampler=Growing()) as dl:
        assert [len(b) for e in epochs(dl, 3) for b in e] == [3, 5, 7]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_distributed_sampler_set_epoch(num_workers):
    ds = ArrayDS(21)
    seen = []
    for rank in (0, 1):
        ref_s = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
        our_s = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
        ref = TorchDataLoader(ds, batch_size=4, sampler=ref_s)
        with DataLoader(ds, batch_size=4, sampler=our_s, num_workers=num_workers) as dl:
            for epoch in range(3):
                ref_s.set_epoch(epoch)
                our_s.set_epoch(epoch)
                got = list(dl)
                same(got, list(ref))
                if epoch == 1:
                    seen.append(torch.cat(got)[:, 0])
    assert set(torch.cat(seen).tolist()) == set(range(21))  # the two ranks cover the data


def test_custom_collate_fn():
    ref = list(TorchDataLoader(MixedDS(), batch_size=4, collate_fn=pad_collate))
    with DataLoader(MixedDS(), batch_size=4, collate_fn=pad_collate) as dl:
        same(list(dl), ref)
    ident = list(TorchDataLoader(TensorPairDS(), batch_size=4, collate_fn=lambda s: s))
    with DataLoader(TensorPairDS(), batch_size=4, collate_fn=lambda s: s) as dl:
        got = list(dl)
    same([[tuple(s) for s in b] for b in got], [[tuple(s) for s in b] for b in ident])


@pytest.mark.parametrize("ds", [StrDS(), ObjArrayDS()], ids=["str", "object-array"])
def test_samples_of_object_leaves(ds):
    """Per-sample items (custom collate_fn, batch_size=None) when object leaves are all a
    sample has, or are object arrays."""
    def same_samples(a, b):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            if isinstance(x, dict):
                assert list(x) == list(y) and x["y"] == y["y"]
                assert type(x["o"]) is type(y["o"]) and x["o"].tolist() == y["o"].tolist()
            else:
                assert x == y

    ref = list(TorchDataLoader(ds, batch_size=2, collate_fn=lambda s: s))
    with DataLoader(ds, batch_size=2, collate_fn=lambda s: s) as dl:
        got = list(dl)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        same_samples(a, b)
    ref = list(TorchDataLoader(ds, batch_size=None))
    with DataLoader(ds, batch_size=None) as dl:
        same_samples(list(dl), ref)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_leaf_type_as_torch_returns_it(num_workers):
    """Default collation, a custom collate_fn (the samples as the dataset returned them) and
    batch_size=None, each against torch, for every leaf type the front end tags."""
    ds = EveryLeafDS()
    compare(ds, n_epochs=1, num_workers=num_workers, batch_size=4)
    compare(ds, n_epochs=1, num_workers=num_workers, batch_size=None)
    ident = lambda samples: samples  # noqa: E731
    ref = list(TorchDataLoader(ds, batch_size=4, collate_fn=ident))
    with DataLoader(ds, batch_size=4, num_workers=num_workers, collate_fn=ident) as dl:
        got = list(dl)
    assert len(got) == len(ref)
    for batch, ref_batch in zip(got, ref):
        for sample, want in zip(batch, ref_batch):
            assert list(sample) == list(want)
            assert torch.equal(sample["t"], want["t"])
            assert type(sample["zero_d"]) is np.ndarray and sample["zero_d"].shape == ()
            assert sample["zero_d"] == want["zero_d"]
            assert type(sample["scalar"]) is np.float32 and sample["scalar"] == want["scalar"]
            assert sample["color"] == want["color"] and sample["flag"] is want["flag"]
            assert sample["name"] == want["name"]
            assert sample["extra"]["a"] == want["extra"]["a"]
            assert sample["extra"]["b"][1] == want["extra"]["b"][1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_varying_shape_raises_what_torchs_default_collate_raises(num_workers):
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(TorchDataLoader(EveryLeafDS(ragged_at=5), batch_size=4))
    with DataLoader(EveryLeafDS(ragged_at=5), batch_size=4, num_workers=num_workers) as dl:
        with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size") as info:
            list(dl)
    assert isinstance(info.value, fastload.LayoutMismatchError)
    msg = str(info.value)
    assert "sample['t']: expected shape (3,) (as in the first sample), got (4,)" in msg
    assert "(sample index 5)" in msg and "pad_sequence" in msg and "\x00" not in msg


def pad_tokens(samples):
    from torch.nn.utils.rnn import pad_sequence

    return (pad_sequence([s["tokens"] for s in samples], batch_first=True),
            torch.tensor([len(s["tokens"]) for s in samples]), [s["name"] for s in samples])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_collate_gets_samples_of_any_shape_and_structure(num_workers):
    ds = RaggedDS()
    for collate in (pad_tokens, lambda s: s):
        ref = list(TorchDataLoader(ds, batch_size=3, collate_fn=collate))
        with DataLoader(ds, batch_size=3, num_workers=num_workers, collate_fn=collate) as dl:
            got = list(dl)
        same(got, ref)
    ref = list(TorchDataLoader(ds, batch_size=None))
    with DataLoader(ds, batch_size=None, num_workers=num_workers) as dl:
        same(list(dl), ref)


@pytest.mark.timeout(60)
def test_custom_collate_tensors_are_views_of_the_slot():
    dl = DataLoader(RaggedDS(), batch_size=3, num_workers=2, collate_fn=lambda s: s)
    batch = next(iter(dl))
    lo, hi = region_range(dl)
    tensors = [s["tokens"] for s in batch if s["tokens"].numel()]
    assert tensors and all(lo <= t.data_ptr() < hi for t in tensors)
    del batch, tensors
    dl.collate_fn = None  # a different kind of collation next epoch: a new engine, stacked
    with pytest.raises(fastload.LayoutMismatchError, match="dict keys differ"):
        list(dl)
    dl.close()


def test_batch_size_none():
    ref = list(TorchDataLoader(TensorPairDS(), batch_size=None))
    with DataLoader(TensorPairDS(), batch_size=None) as dl:
        assert len(dl) == len(ref)
        same(list(dl), ref)


@pytest.mark.timeout(60)
def test_worker_init_and_worker_info():
    torch.manual_seed(99)
    with DataLoader(WorkerInfoDS(), batch_size=2, num_workers=2, worker_init_fn=record_init,
                    multiprocessing_context="spawn") as dl:
        rows = torch.cat(list(dl))
    torch.manual_seed(99)
    with DataLoader(WorkerInfoDS(), batch_size=2, num_workers=2,
                    multiprocessing_context=torch.multiprocessing.get_context("forkserver")) as dl:
        rows2 = torch.cat(list(dl))
    torch.manual_seed(99)
    base = int(torch.empty((), dtype=torch.int64).random_().item())  # what torch would draw
    assert sorted(rows[:, 0].tolist()) == list(range(8))
    for i, wid, nw, seed, initial, init in rows.tolist():
        assert nw == 2 and seed == initial == base + wid and init == 100 + wid
    assert set(rows[:, 4].tolist()) <= {base, base + 1}
    assert set(rows2[:, 4].tolist()) <= {base, base + 1} and (rows2[:, 5] == -1).all()


@pytest.mark.timeout(60)
def test_errors_reraised_with_type():
    with DataLoader(FailingDS(), batch_size=2, num_workers=2) as dl:
        with pytest.raises(KeyError, match="bad sample 4"):
            list(dl)
    with DataLoader(FailingDS(), batch_size=2) as dl:
        with pytest.raises(KeyError, match="bad sample 4"):
            list(dl)


@pytest.mark.timeout(60)
def test_timeout_is_a_runtime_error_like_torch():
    with DataLoader(SlowDS(), batch_size=2, num_workers=1, timeout=0.5) as dl:
        it = iter(dl)
        assert next(it).tolist() == [0.0, 1.0]
        with pytest.raises(RuntimeError, match="DataLoader timed out after 0.5 seconds"):
            next(it)


@pytest.mark.timeout(60)
def test_zero_copy_and_valid_after_close():
    dl = DataLoader(ArrayDS(), batch_size=4, num_workers=2)
    it = iter(dl)
    t = next(it)
    lo, hi = region_range(dl)
    assert lo <= t.data_ptr() < hi  # the tensor is a view of the shared slot
    del it
    dl.close()
    assert t[:, 0].tolist() == [0, 1, 2, 3]  # and it still holds the slot after close
    assert [b[0, 0].item() for b in dl][:2] == [0, 4]  # iter() after close: new workers
    dl.close()


def test_timeout_pin_memory_and_context():
    if torch.accelerator.is_available():  # pragma: no cover - pins, as torch does
        with DataLoader(ArrayDS(), batch_size=4, pin_memory=True, timeout=5) as dl:
            assert all(t.is_pinned() for t in dl)
    else:  # torch's warning, once per iterator
        with pytest.warns(UserWarning, match="no accelerator is found") as rec:
            with DataLoader(ArrayDS(), batch_size=4, pin_memory=True, timeout=5) as dl:
                assert len(list(dl)) == 6
        with pytest.warns(UserWarning) as ref_rec:
            list(TorchDataLoader(ArrayDS(), batch_size=4, pin_memory=True))
        assert [str(w.message) for w in rec] == [str(w.message) for w in ref_rec]
    with DataLoader(ArrayDS(), batch_size=4, num_workers=1, timeout=0.5, persistent_workers=True,
                    prefetch_factor=3, multiprocessing_context="fork") as dl:
        assert dl._loader is None  # workers start at the first iter(), as torch's


ARG_CASES = [
    (dict(num_workers=-1), "num_workers option should be non-negative"),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(prefetch_factor=2), "prefetch_factor option could only be specified in multiprocessing"),
    (dict(num_workers=1, prefetch_factor=-1), "prefetch_factor option should be non-negative"),
    (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
    (dict(sampler=[0, 1], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], shuffle=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], sampler=[0]), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching"),
    (dict(multiprocessing_context="fork"), "multiprocessing_context can only be used with"),
    (dict(num_workers=1, multiprocessing_context="nope"), "should specify a valid start method"),
]


@pytest.mark.parametrize("kw,msg", ARG_CASES)
def test_argument_validation_matches_torch(kw, msg):
    with pytest.raises(ValueError, match=msg) as ref:
        TorchDataLoader(ArrayDS(), **kw)
    with pytest.raises(ValueError, match=msg) as ours:
        DataLoader(ArrayDS(), **kw)
    assert str(ours.value) == str(ref.value)
    with pytest.raises(TypeError, match="valid context object"):
        DataLoader(ArrayDS(), num_workers=1, multiprocessing_context=3)


@pytest.mark.timeout(MP_TIMEOUT)
def test_the_datasets_metadata_is_shared_by_default():
    from helpers.compat import PathsDS

    ds = PathsDS()
    want = list(TorchDataLoader(ds, batch_size=1000, num_workers=0))
    with DataLoader(ds, batch_size=1000, num_workers=2) as dl:
        got = list(dl)
        shared = dl._loader.stats()["shared_dataset"]
    assert [e["attribute"] for e in shared] == ["dataset.dataset.paths"]
    assert all(torch.equal(g[0], w[0]) for g, w in zip(got, want)) and len(got) == len(want)
    assert {k for _, kinds in got for k in kinds} == {"SharedList"}  # what the workers read
    assert {k for _, kinds in want for k in kinds} == {"list"}
    assert type(ds.paths) is list


def _catch_all(loader):
    it, out = iter(loader), []
    while True:
        try:
            out.append(next(it).tolist())
        except StopIteration:
            return out
        except KeyError as e:
            assert "bad sample 4" in str(e)
            out.append("KeyError")


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_does_not_end_the_iterator_as_in_torch(num_workers):
    ref = _catch_all(TorchDataLoader(FailingDS(), batch_size=2, num_workers=num_workers))
    assert ref[2] == "KeyError" and len(ref) == 3  # torch: the last batch raised
    with DataLoader(FailingDS(), batch_size=1, num_workers=num_workers) as dl:
        got = _catch_all(dl)
        want = _catch_all(TorchDataLoader(FailingDS(), batch_size=1, num_workers=num_workers))
    assert got == want and got[4] == "KeyError" and got[5] == [5.0]


@pytest.mark.timeout(MP_TIMEOUT)
def test_two_live_iterators_of_one_loader_as_in_torch():
    # torch allows several iterators of one DataLoader at once (zip(dl, dl), a validation pass
    # inside a training pass); each is a whole pass of its own. torch's multiprocessing
    # iterator draws its sampler when it is created, as fastload's front end does, so with
    # shuffle both see the same permutations in the same order.
    def passes(make):
        torch.manual_seed(77)
        dl = make(ArrayDS(), batch_size=4, shuffle=True, num_workers=2,
                  multiprocessing_context="fork")
        try:
            pairs = [(a.clone(), b.clone()) for a, b in zip(dl, dl)]
            a, b = iter(dl), iter(dl)  # interleaved by hand, b finished first
            first = [next(a).clone()]
            second = [x.clone() for x in b]
            first += [x.clone() for x in a]
            return pairs, first, second
        finally:
            getattr(dl, "close", lambda: None)()

    want, got = passes(TorchDataLoader), passes(DataLoader)
    same(got, want)
    assert len(got[0]) == len(DataLoader(ArrayDS(), batch_size=4))
    assert not torch.equal(got[1][0], got[2][0])  # two passes, two permutations


def test_in_process_samples_need_not_be_picklable_as_in_torch():
    # num_workers=0 moves nothing between processes: a sample of a class defined in a function
    # (or a namedtuple not importable by name) reaches the collate_fn, as torch's does
    class Local:
        def __init__(self, i):
            self.i = i

    Point = __import__("collections").namedtuple("Point", ["x", "y"])

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return (Local(i), Point(np.full(2, i), i))

    def seen(batches, batched):
        samples = [s for b in batches for s in b] if batched else batches
        return [(type(a).__name__, a.i, type(p).__name__, p.y, np.asarray(p.x).tolist())
                for a, p in samples]

    for batched, kw in ((False, dict(batch_size=None)),
                        (True, dict(batch_size=2, collate_fn=list))):
        with DataLoader(DS(), **kw) as dl:
            got = seen(list(dl), batched)
        assert got == seen(list(TorchDataLoader(DS(), **kw)), batched)
        assert got[3] == ("Local", 3, "Point", 3, [3, 3])


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_nested_tensors_reach_a_collate_fn_and_default_collate_refuses_them_as_torch(num_workers):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: nested tensors are a prototype
        data = [torch.nested.nested_tensor([torch.full((k + 1,), float(k))]) for k in range(4)]
    with DataLoader(data, batch_size=2, num_workers=num_workers,
                    collate_fn=lambda b: [x.clone() for x in b]) as dl:
        got = [x for b in dl for x in b]
    assert all(x.is_nested for x in got)
    assert [x.unbind()[0].tolist() for x in got] == [[float(k)] * (k + 1) for k in range(4)]
    with DataLoader(data, batch_size=2, num_workers=num_workers) as dl:
        with pytest.raises(RuntimeError, match="Batches of nested tensors are not currently "
                           "supported by the default collate_fn"):
            next(iter(dl))


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_worker_killed_by_a_signal_is_reported_in_torchs_words():
    from helpers.faults import KillAt

    with DataLoader(KillAt(8, 0), batch_size=2, num_workers=2) as dl:
        with pytest.raises(RuntimeError, match=r"^DataLoader worker \(pid \d+\) is killed by "
                           r"signal: Killed\. worker \d \(pid \d+\) died with SIGKILL") as e:
            list(dl)
    assert isinstance(e.value, fastload.WorkerDied) and e.value.fastload_deaths[0][1] == -9


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize(("fault", "oom"), [("kill", True), ("exit", False)])
def test_a_dead_worker_advises_what_this_dataloader_accepts(fault, oom):
    # Loader's advice (on_worker_death='restart') is an option this DataLoader does not take.
    from helpers.faults import ExitAt, KillAt

    from fastload._deaths import RESTART_ADVICE

    with pytest.raises(TypeError, match="on_worker_death"):
        DataLoader(list(range(4)), on_worker_death="restart")
    data = KillAt(8, 0) if fault == "kill" else ExitAt(8, 0)
    with DataLoader(data, batch_size=2, num_workers=2) as dl:
        with pytest.raises(fastload.WorkerDied) as e:
            list(dl)
    text = str(e.value)
    assert RESTART_ADVICE not in text and "pass on_worker_death" not in text
    assert ("this DataLoader stops the epoch as torch's does; " in text
            and "use fastload.Loader(..., on_worker_death='restart') instead of this DataLoader"
            in text), text
    assert ("out-of-memory killer: reduce num_workers, batch_size or prefetch_factor" in text) == oom
    with fastload.Loader(data, batch_size=2, num_workers=2) as loader:  # Loader's own advice
        with pytest.raises(fastload.WorkerDied, match=RESTART_ADVICE):
            list(loader)


def _shuffled_pipe(n=60, buffer=20):
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(list(range(n))).shuffle(buffer_size=buffer).sharding_filter()


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_datapipe_is_sharded_across_workers_and_shuffled_per_epoch(num_workers):
    # NOTE [datapipes]: each worker keeps its sharding_filter() share of one shared shuffled
    # order, so every epoch has every element once, as with torch's DataLoader; epochs differ
    with DataLoader(_shuffled_pipe(), num_workers=num_workers, shuffle=True,
                    persistent_workers=True) as dl:
        epochs = [[int(x) for x in dl] for _ in range(2)]
    for got in epochs:
        assert sorted(got) == list(range(60))
    assert epochs[0] != epochs[1]
    want = [int(x) for x in TorchDataLoader(_shuffled_pipe(), num_workers=num_workers,
                                              multiprocessing_context="fork", shuffle=True)]
    assert sorted(want) == sorted(epochs[0])


def test_a_datapipe_in_process_is_shuffled_exactly_as_torch_shuffles_it():
    # num_workers=0: the shared seed is torch's own draw from the generator, at torch's point
    def run(make):
        out = []
        for seed in (123, 123, 321):
            torch.manual_seed(seed)
            out.append([int(x) for x in make(_shuffled_pipe(), shuffle=True)])
        return out

    got, want = run(DataLoader), run(TorchDataLoader)
    assert got == want and got[0] == got[1] != got[2]
    pipe = _shuffled_pipe()
    assert [int(x) for x in DataLoader(pipe, shuffle=False)] == list(range(60))  # shuffle off


def test_settings_torch_freezes_are_frozen_and_the_class_is_generic():
    dl = DataLoader(ArrayDS(), batch_size=4)
    ref = TorchDataLoader(ArrayDS(), batch_size=4)
    for attr, val in (("batch_size", 8), ("sampler", None), ("drop_last", True),
                      ("dataset", ArrayDS(3)), ("batch_sampler", None),
                      ("persistent_workers", True)):
        with pytest.raises(ValueError) as theirs:
            setattr(ref, attr, val)
        with pytest.raises(ValueError) as ours:
            setattr(dl, attr, val)
        assert str(ours.value) == str(theirs.value)
    dl.num_workers = 0  # torch allows these
    dl.timeout = 1.0
    assert DataLoader[int] is not None and TorchDataLoader[int] is not None
    assert [b.shape for b in dl] == [b.shape for b in ref]


def test_too_many_workers_warns_as_torch_does(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    with pytest.warns(UserWarning, match="suggested max number of worker in current system is 1"):
        TorchDataLoader(ArrayDS(), num_workers=3)
    with pytest.warns(UserWarning, match="suggested max number of worker in current system is 1"):
        dl, ref = DataLoader(ArrayDS(), num_workers=3), TorchDataLoader(ArrayDS(), num_workers=3)
    with dl:  # torch warns again at every iter() (its _get_iterator checks too)
        for loader in (ref, dl):
            with pytest.warns(UserWarning, match="will create 3 worker processes in total"):
                it = iter(loader)
            del it


# -- IterableDataset ---------------------------------------------------------------------------
ITER_CASES = [  # (num_workers, batch_size, drop_last, per-worker lengths)
    (0, 3, False, [7]),
    (2, 3, False, [7, 2]),
    (2, 3, True, [7, 2]),
    (3, 2, False, [0, 5, 1]),
    (2, None, False, [3, 2]),
]


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers, 2 CPUs
@pytest.mark.parametrize("nw,bs,drop_last,lengths", ITER_CASES)
def test_an_iterable_dataset_gives_torchs_batches_in_torchs_order(nw, bs, drop_last, lengths):
    ds = TorchStream(lengths)
    want = list(TorchDataLoader(ds, batch_size=bs, num_workers=nw, drop_last=drop_last))
    with DataLoader(ds, batch_size=bs, num_workers=nw, drop_last=drop_last,
                    timeout=MP_TIMEOUT) as dl:
        got = list(dl)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            same(a, b)
        again = list(dl)  # the next epoch: every replica iterated again
        assert len(again) == len(want)


@pytest.mark.timeout(120)
def test_an_iterable_dataset_sees_torchs_worker_info_and_worker_init_fn(tmp_path):
    with DataLoader(TorchStream([2, 2]), batch_size=2, num_workers=2, timeout=MP_TIMEOUT,
                    worker_init_fn=TouchInit(str(tmp_path))) as dl:
        batches = list(dl)
    assert [b[:, 0].tolist() for b in batches] == [[0, 0], [1, 1]]  # worker ids, from torch's
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]


def test_an_iterable_dataset_refuses_what_torch_refuses_with_torchs_messages():
    ds = TorchStream([3])
    for kwargs in (dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0]])):
        with pytest.raises(ValueError) as theirs:
            TorchDataLoader(ds, **kwargs)
        with pytest.raises(ValueError) as mine:
            DataLoader(ds, **kwargs)
        assert str(mine.value) == str(theirs.value)


@pytest.mark.timeout(120)
def test_an_iterable_datasets_len_and_the_warning_when_it_yields_more():
    ds = TorchStream([3, 3], length=2)  # reports 2 samples, its 2 workers yield 6
    theirs = TorchDataLoader(ds, batch_size=1, num_workers=2)
    with DataLoader(ds, batch_size=1, num_workers=2, timeout=MP_TIMEOUT) as dl:
        assert len(dl) == len(theirs) == 2
        with pytest.warns(UserWarning, match="Length of IterableDataset") as mine:
            list(dl)
    with pytest.warns(UserWarning, match="Length of IterableDataset") as ref:
        list(theirs)
    strip = [str(w.message).split(" was reported")[1] for w in mine
             if "Length of" in str(w.message)]
    assert strip == [str(w.message).split(" was reported")[1] for w in ref
                     if "Length of" in str(w.message)]
    with pytest.raises(TypeError):
        len(DataLoader(TorchStream([3]), batch_size=1))


# -- a real torch DataLoader, and several ranks (NOTE [a real torch DataLoader]) -------------
def test_is_a_torch_dataloader_with_torchs_attributes():
    from torch.utils.data.dataloader import _DatasetKind

    with DataLoader(ArrayDS(), batch_size=4, num_workers=2,
                    multiprocessing_context="fork") as dl:
        assert isinstance(dl, TorchDataLoader) and issubclass(DataLoader, TorchDataLoader)
        assert dl._dataset_kind == _DatasetKind.Map and dl._iterator is None
        assert dl.multiprocessing_context.get_start_method() == "fork"  # torch's property
        assert dl._auto_collation and not DataLoader(ArrayDS(), batch_size=None)._auto_collation
        assert len(list(dl)) == len(TorchDataLoader(ArrayDS(), batch_size=4))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_recreated_with_a_distributed_sampler_each_rank_gets_its_share(world):
    # What Lightning does to a DataLoader under DDP: type(dl)(**its arguments, sampler=...).
    dl = DataLoader(ArrayDS(), batch_size=4, num_workers=2)
    seen = []
    for rank in range(world):
        sampler = torch.utils.data.DistributedSampler(dl.dataset, num_replicas=world, rank=rank,
                                                      shuffle=False)
        with type(dl)(dl.dataset, batch_size=dl.batch_size, num_workers=dl.num_workers,
                      sampler=sampler) as mine:
            ref = list(TorchDataLoader(dl.dataset, batch_size=4, sampler=sampler))
            got = list(mine)
            same(got, ref)
            seen += [tuple(r) for b in got for r in b.tolist()]
    dl.close()
    whole = {tuple(ArrayDS()[i].tolist()) for i in range(len(ArrayDS()))}
    assert set(seen) == whole and len(seen) == -(-len(whole) // world) * world  # torch pads


@pytest.mark.timeout(120)
def test_lightnings_own_recreation_keeps_fastload():
    pytest.importorskip("lightning", reason="lightning is not installed on this machine")
    from lightning.fabric.utilities.data import _replace_dunder_methods, _update_dataloader

    with _replace_dunder_methods(TorchDataLoader, "dataset"):
        dl = DataLoader(ArrayDS(), batch_size=4, num_workers=2)
    sampler = torch.utils.data.DistributedSampler(dl.dataset, num_replicas=2, rank=1,
                                                  shuffle=False)
    new = _update_dataloader(dl, sampler)
    assert type(new) is DataLoader and new.num_workers == 2
    same(list(new), list(TorchDataLoader(ArrayDS(), batch_size=4, sampler=sampler)))
    new.close()
    dl.close()


@pytest.mark.timeout(MP_TIMEOUT * 2)
def test_lightning_trains_and_validates_on_one_loader_as_with_torchs():
    # val_check_interval=0.5 runs validation in the middle of each training epoch, on the same
    # loader: two live iterators (NOTE [several passes]). Every batch, in order, as torch's.
    L = pytest.importorskip("lightning", reason="lightning is not installed on this machine")
    from helpers.lightning_models import Recorder

    def fit(make):
        torch.manual_seed(0)
        dl = make(ArrayDS(40), batch_size=4, num_workers=2, shuffle=True)
        model = Recorder()
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, val_check_interval=0.5,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice on shuffled validation
            trainer.fit(model, train_dataloaders=dl, val_dataloaders=dl)
        getattr(dl, "close", lambda: None)()
        return model.seen

    want, got = fit(TorchDataLoader), fit(DataLoader)
    assert got == want
    assert sum(k == "train" for k, *_ in got) == 20 and sum(k == "val" for k, *_ in got) == 40
    for epoch in (0, 1):  # each training epoch is the whole dataset
        rows = sorted(x for k, e, b in got if k == "train" and e == epoch for x in b)
        assert rows == list(range(40))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(MP_TIMEOUT * 3)
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("split", ["split", "nosplit"])
def test_accelerate_prepare_keeps_fastload_and_gives_each_rank_its_share(world, split, tmp_path):
    # NOTE [accelerate]: prepare() rebuilds the loader; the rebuilt inner loader is fastload's,
    # and every rank gets what it gets from torch's DataLoader prepared the same way.
    pytest.importorskip("accelerate", reason="accelerate is not installed on this machine")
    script = os.path.join(os.path.dirname(__file__), "helpers", "accelerate_ranks.py")
    n = 40
    if world == 1:
        cmd = [sys.executable, script, str(tmp_path), split, str(n)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
               f"--master_port={_free_port()}", script, str(tmp_path), split, str(n)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=MP_TIMEOUT * 3, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [__import__("json").loads((tmp_path / f"rank{k}.json").read_text())
             for k in range(world)]
    per_rank = n // world
    for d in ranks:
        assert d["world"] == world
        assert d["inner"] == "fastload.compat.torch" and d["published"] >= 1  # fastload's workers
        assert d["got"] == d["ref"]  # what torch's loader gives this rank under accelerate
        for epoch in d["got"]:
            assert sum(len(b) for b in epoch) == per_rank
            assert all(len(b) == (2 if split == "split" and world == 2 else 4) for b in epoch)
    for e in range(2):  # the ranks' shares: disjoint, together the whole dataset
        rows = sorted(x for d in ranks for b in d["got"][e] for x in b)
        assert rows == list(range(n))
    assert ranks[0]["got"][0] != ranks[0]["got"][1]  # reshuffled per epoch (set_epoch)


@pytest.mark.timeout(MP_TIMEOUT * 4)
def test_lightning_ddp_on_two_processes_shards_as_with_torchs(tmp_path):
    # Lightning injects its DistributedSampler into the loader (re-created as type(dl)(...)):
    # each of 2 ranks trains on its own half, batch for batch what torch's DataLoader gives it.
    pytest.importorskip("lightning", reason="lightning is not installed on this machine")
    script = os.path.join(os.path.dirname(__file__), "helpers", "lightning_ddp.py")
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env["MASTER_PORT"] = str(_free_port())
    runs = {}
    for kind in ("torch", "fastload"):
        r = subprocess.run([sys.executable, script, str(tmp_path), kind], capture_output=True,
                           text=True, timeout=MP_TIMEOUT * 2, env=env, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        runs[kind] = [__import__("json").loads((tmp_path / f"{kind}-rank{k}.json").read_text())
                      for k in range(2)]
    for want, got in zip(runs["torch"], runs["fastload"]):
        assert got["world"] == 2 and got["types"] == ["fastload.compat.torch.DataLoader"]
        assert got["seen"] == want["seen"] and len(got["seen"]) == 10  # 5 batches x 2 epochs
    for e in range(2):  # each epoch: the ranks' halves are disjoint and cover the dataset
        rows = sorted(x for d in runs["fastload"] for b in d["seen"][5 * e : 5 * e + 5]
                      for x in b)
        assert rows == list(range(40))


@pytest.mark.timeout(MP_TIMEOUT * 3)
def test_lightning_resumes_a_mid_epoch_checkpoint_with_the_exact_data_order(tmp_path):
    # Lightning saves and restores the state_dict() of a loader that has one: a fastload.Loader
    # resumed from a checkpoint taken mid-epoch goes on with the very next batch.
    L = pytest.importorskip("lightning", reason="lightning is not installed on this machine")
    from helpers.lightning_models import Recorder

    class Crash(L.Callback):  # after the checkpoint of step 13 (epoch 1, its 4th batch)
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 14:
                raise RuntimeError("simulated crash")

    def fit(model, callbacks=(), ckpt_path=None):
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=bool(callbacks), callbacks=list(callbacks),
                            default_root_dir=str(tmp_path), num_sanity_val_steps=0)
        with fastload.Loader(ArrayDS(40), 4, shuffle=True, seed=5, num_workers=2) as loader:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)

    whole, crashed, resumed = Recorder(), Recorder(), Recorder()
    fit(whole)
    every13 = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=13,
                                                  save_top_k=-1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(crashed, [every13, Crash()])
    fit(resumed, ckpt_path=str(tmp_path / "epoch=1-step=13.ckpt"))
    assert len(whole.seen) == 20 and len(resumed.seen) == 7
    assert crashed.seen[:13] + resumed.seen == whole.seen


def test_one_rank_of_several_with_torchs_default_sampler_is_warned(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    dl = DataLoader(ArrayDS(), batch_size=4)  # no warning at construction: Lightning re-creates
    with pytest.warns(RuntimeWarning, match=r"one of 2 ranks \(WORLD_SIZE=2\).*DistributedSampler"):
        first = list(dl)
    assert list(map(len, list(dl))) == list(map(len, first))  # once per loader (error otherwise)
    sampler = torch.utils.data.DistributedSampler(ArrayDS(), num_replicas=2, rank=0)
    assert len(list(DataLoader(ArrayDS(), batch_size=4, sampler=sampler))) == 3  # not warned
    monkeypatch.setenv("WORLD_SIZE", "1")
    list(DataLoader(ArrayDS(), batch_size=4))  # a single rank: not warned
