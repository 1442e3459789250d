"""Regions are sized by what an epoch can need and refused, naming the sizes, when they would
take more memory than the machine (or the cgroup) has: never a silent wait for the OOM killer."""

from __future__ import annotations

import os

import pytest

import fastload
from fastload import _region
from helpers import MP_TIMEOUT
from helpers.datasets import Range


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_huge_batch_size_on_a_small_dataset_needs_its_samples_only(num_workers):
    with fastload.Loader(Range(100, (1000,)), 10**9, num_workers=num_workers) as loader:
        (batch,) = list(loader)
        assert batch.shape == (100, 1000)
        assert loader.layout.batch_size == 100  # rows of a slot: the epoch's samples
        if num_workers:
            assert loader.stats()["slot_bytes"] < 2 * 100 * 1000 * 8


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_region_larger_than_the_memory_left_is_refused_with_its_sizes(monkeypatch):
    monkeypatch.setattr(_region, "available_bytes", lambda: 1 << 20)  # 1 MiB left
    with fastload.Loader(Range(64, (4096,)), 32, num_workers=1) as loader:
        with pytest.raises(MemoryError, match=r"would need [\d.,]+ MiB of shared memory for \d+ "
                           r"slots of [\d.,]+ MiB \(batches of 32 samples of 32,768 bytes\), "
                           r"and only 1.0 MiB are available.*reduce batch_size"):
            next(iter(loader))
    with fastload.Loader(Range(64, (16,)), 4, num_workers=1) as loader:  # small enough
        assert next(iter(loader)).shape == (4, 16)


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="no /proc/meminfo here (not Linux)")
def test_available_bytes_reads_the_machine_and_the_cgroup():
    got = _region.available_bytes()
    assert got is None or 0 <= got < 1 << 50
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    assert got is not None and got <= avail * 1.5  # MemAvailable moves a little in between
