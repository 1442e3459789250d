"""fastload.compat.torch.DataLoader on a warm fastload.Pool (pool=, or the pool as
multiprocessing_context=): torch's batches and draws, several DataLoaders at once, no worker
started per DataLoader (NOTE [pool workers] in fastload/compat/_torch_worker.py)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

import fastload  # noqa: E402
from fastload.compat.torch import DataLoader  # noqa: E402
from tests.helpers.torch_pool import Drawn, MarkInit, Split  # noqa: E402


def _all(loader):
    try:
        return torch.cat(list(loader))
    finally:
        if hasattr(loader, "close"):
            loader.close()


def _seeded(cls, **kw):
    return cls(Drawn(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7),
               **kw)


@pytest.fixture
def pool():
    with fastload.Pool(2, start_method="fork") as p:
        yield p


def test_batches_and_draws_equal_torchs(pool):
    theirs = _all(_seeded(torch.utils.data.DataLoader, num_workers=2,
                          multiprocessing_context="fork"))
    assert torch.equal(_all(_seeded(DataLoader, pool=pool)), theirs)
    # where the seed's users put their pool, and with the pool's worker count said
    assert torch.equal(_all(_seeded(DataLoader, num_workers=2, multiprocessing_context=pool)),
                       theirs)


def test_several_dataloaders_at_once_on_one_pool(pool):
    pids = [pool._workers.pid_of(w) for w in range(2)]
    a = DataLoader(Drawn(30), batch_size=4, pool=pool)
    b = DataLoader(Drawn(30), batch_size=3, shuffle=True, pool=pool)
    try:
        got_a, got_b = [], []
        it_a, it_b = iter(a), iter(b)
        for x in it_a:  # both in flight at once: one batch of each in turn
            got_a.append(x)
            got_b.append(next(it_b))
        got_b += list(it_b)
    finally:
        a.close()
        b.close()
    assert torch.cat(got_a)[:, 0].tolist() == list(range(30))
    assert sorted(torch.cat(got_b)[:, 0].tolist()) == list(range(30))
    # the pool's workers served both, and still serve
    assert sorted(_all(DataLoader(Drawn(8), batch_size=8, pool=pool))[:, 0].tolist()) == \
        list(range(8))
    assert [pool._workers.pid_of(w) for w in range(2)] == pids  # no worker started anew


def test_an_iterable_dataset_is_split_by_torchs_worker_info(pool):
    out = _all(DataLoader(Split(40), batch_size=5, pool=pool))
    assert sorted(out.tolist()) == list(range(40))


def test_worker_init_fn_runs_in_each_worker_for_each_dataloader(pool, tmp_path):
    for k in range(2):
        where = tmp_path / str(k)
        where.mkdir()
        _all(DataLoader(Drawn(16), batch_size=2, pool=pool, worker_init_fn=MarkInit(str(where))))
        names = sorted(os.listdir(where))
        assert [n.split("-")[0] for n in names] == ["0", "1"], names


def test_bad_pool_arguments_are_refused(pool):
    with pytest.raises(TypeError, match="pool must be a fastload.Pool"):
        DataLoader(Drawn(), pool=object())
    with pytest.raises(ValueError, match="num_workers=3 conflicts with the pool's"):
        DataLoader(Drawn(), num_workers=3, pool=pool)
    with pytest.raises(ValueError, match="multiprocessing_context does not apply"):
        DataLoader(Drawn(), pool=pool, multiprocessing_context="fork")
    with fastload.Pool(1, start_method="fork") as other:
        with pytest.raises(ValueError, match="pass the fastload.Pool once"):
            DataLoader(Drawn(), pool=pool, multiprocessing_context=other)
