"""fastload.compat.torch.DataLoader draws from the workers' global RNGs as torch's DataLoader
does: batch i to worker i % num_workers, each worker seeded from (base seed, worker id), so the
values equal torch's own (torch's test_worker_seed_reproducibility)."""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from fastload.compat.torch import DataLoader  # noqa: E402
from tests.helpers.rngs import Synchronized, TorchAugmented  # noqa: E402


def _run(cls, workers, **kw):
    loader = cls(TorchAugmented(), batch_size=4, shuffle=True, num_workers=workers,
                 generator=torch.Generator().manual_seed(42), persistent_workers=workers > 0,
                 **kw)
    try:
        return torch.cat([b for _ in range(2) for b in loader])
    finally:
        if hasattr(loader, "close"):
            loader.close()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [2, 3])
def test_global_rng_draws_equal_torchs(workers):
    ours = _run(DataLoader, workers, multiprocessing_context="fork")
    theirs = _run(torch.utils.data.DataLoader, workers, multiprocessing_context="fork")
    assert torch.equal(ours, theirs)
    assert torch.equal(_run(DataLoader, workers, multiprocessing_context="fork"), ours)


def test_num_workers_0_draws_from_the_users_rngs_as_torch():
    def seeded(cls):
        random.seed(3)
        np.random.seed(3)
        torch.manual_seed(3)
        return _run(cls, 0)

    assert torch.equal(seeded(DataLoader), seeded(torch.utils.data.DataLoader))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_worker_seed_reproducibility(tmp_path):
    # torch's own test (test/test_dataloader.py, v2.6.0), in spirit: 6 workers, each must load
    # one of the 6 batches at the same time; the set of worker seeds is the same run to run
    def seeds(where):
        where.mkdir()
        loader = DataLoader(Synchronized(6, str(where)), batch_size=1, num_workers=6,
                            generator=torch.Generator().manual_seed(42),
                            multiprocessing_context="fork")
        try:
            return {int(b) for b in loader}
        finally:
            loader.close()

    first = seeds(tmp_path / "first")
    assert len(first) == 6
    assert seeds(tmp_path / "second") == first


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_in_order_false_lets_any_worker_take_a_batch():
    out = _run(DataLoader, 2, multiprocessing_context="fork", in_order=False)
    assert sorted(out[:37, 0].tolist()) == list(range(37))
