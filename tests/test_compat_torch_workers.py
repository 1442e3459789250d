"""torch's view of the drop-in's workers (an iterator's ``_workers``, ``_shutdown_workers()``)
and DataPipe seeds per epoch: what torch's own test_dataloader.py inspects (issue 28)."""

from __future__ import annotations

import gc
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from torch.utils.data import Dataset, IterableDataset  # noqa: E402
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402
from torch.utils.data.datapipes.iter import IterableWrapper  # noqa: E402

from helpers import MP_TIMEOUT  # noqa: E402
from fastload.compat.torch import DataLoader  # noqa: E402


class PidDS(Dataset):  # type: ignore[misc]
    """(worker id, pid of the process that loaded the sample)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (-1 if info is None else info.id), os.getpid()


class PidStream(IterableDataset):  # type: ignore[misc]
    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        return iter([(info.id, os.getpid())] * 3)


@pytest.mark.parametrize("ds", [PidDS(), PidStream()], ids=["map", "iterable"])
@pytest.mark.parametrize("persistent", [False, True])
def test_workers_are_the_processes_that_load_and_exit_0_with_the_loader(ds, persistent):
    dl = DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=persistent)
    it = iter(dl)
    seen = {int(w): int(p) for ids, pids in it for w, p in zip(ids[0:1], pids[0:1])}
    workers = it._workers
    assert [w.pid for w in workers] == [seen[0], seen[1]]  # worker id -> its process
    assert all(w.is_alive() and w.exitcode is None for w in workers)
    assert os.getpid() not in seen.values()
    del it, dl  # nothing else holds the DataLoader: its workers stop, as torch's do
    gc.collect()
    for w in workers:  # their Process objects are closed by now; the view still answers
        w.join(MP_TIMEOUT)
        assert not w.is_alive()
        assert w.exitcode == 0
        w.terminate()  # (torch's tests do, in a finally: a no-op on an exited process)


def test_no_workers_attribute_without_workers_as_torch():
    it = iter(DataLoader(PidDS(), batch_size=4))
    with pytest.raises(AttributeError, match="_workers"):
        it._workers  # noqa: B018
    assert not hasattr(iter(TorchDataLoader(PidDS(), batch_size=4)), "_workers")


def test_shutdown_workers_stops_them_and_the_next_iter_starts_new_ones():
    dl = DataLoader(PidDS(), batch_size=4, num_workers=2)
    it = iter(dl)
    next(it)
    workers = it._workers
    it._shutdown_workers()
    for w in workers:
        w.join(MP_TIMEOUT)
        assert w.exitcode == 0
    assert dl._iterator is None  # torch's attribute (no iterator is kept on the loader)
    assert len(list(dl)) == 4
    assert {w.pid for w in iter(dl)._workers}.isdisjoint(w.pid for w in workers)
    dl.close()


def _pipe():  # type: ignore[no-untyped-def]
    return IterableWrapper(list(range(40))).shuffle(buffer_size=12).sharding_filter()


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_datapipe_shuffle_is_torchs_own_each_epoch(num_workers, persistent):
    """NOTE [datapipes]: each epoch's seed, drawn by iter() from torch's generator, reaches
    every worker: the same order as torch's DataLoader, epoch after epoch; the same seed gives
    the same order, another seed another one."""

    def epochs(cls, seeds):  # type: ignore[no-untyped-def]
        dl = cls(_pipe(), batch_size=4, shuffle=True, num_workers=num_workers,
                 persistent_workers=persistent)
        out = []
        for s in seeds:
            torch.manual_seed(s)
            out.append([int(x) for b in dl for x in b])
        if isinstance(dl, DataLoader):
            dl.close()
        return out

    seeds = [123, 123, 321]
    ours = epochs(DataLoader, seeds)
    assert ours == epochs(TorchDataLoader, seeds)
    assert ours[0] == ours[1] != ours[2]
    assert sorted(ours[2]) == list(range(40))
