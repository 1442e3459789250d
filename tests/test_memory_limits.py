"""Regions are sized by what an epoch can need and refused, naming the sizes, when they would
take more memory than the machine (or the cgroup) has: never a silent wait for the OOM killer."""

from __future__ import annotations

import os
import re
import subprocess
import sys

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


_UNDER_ULIMIT_V = """
import resource, sys
import numpy as np
import fastload

class Big:
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        return np.zeros(1 << 20, np.uint8)

# 2 GiB of address space (ulimit -v): the interpreter and NumPy fit, 1 GiB slots do not.
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    with fastload.Loader(Big(), 1024, num_workers=1) as loader:
        next(iter(loader))
except MemoryError as e:
    print("MemoryError:", e)
    sys.exit(0)
print("no error")
sys.exit(1)
"""


@pytest.mark.timeout(MP_TIMEOUT)
@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd_create here (not Linux)")
def test_an_address_space_limit_is_a_memory_error_with_the_sizes_and_the_limit():
    # mmap under RLIMIT_AS fails with ENOMEM however much memory is free: it was a bare
    # "OSError: [Errno 12] Cannot allocate memory". A subprocess, so this one keeps its limit.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < 2 << 30:
        pytest.skip(f"this machine's hard RLIMIT_AS ({hard} bytes) is under the test's 2 GiB")
    proc = subprocess.run([sys.executable, "-c", _UNDER_ULIMIT_V], capture_output=True,
                          text=True, timeout=MP_TIMEOUT - 5)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"MemoryError: fastload could not map [\d,]+\.\d MiB of shared memory for "
                     r"\d+ slots of 1,024.01 MiB \(batches of 1024 samples of 1,048,576 bytes\) "
                     r"\(Cannot allocate memory\)", proc.stdout), proc.stdout
    assert "address space is limited to 2,048.0 MiB (ulimit -v, RLIMIT_AS)" in proc.stdout
    assert "raise the limit, or reduce batch_size" in proc.stdout


def test_no_room_from_ftruncate_or_fallocate_is_a_memory_error(monkeypatch):
    import errno

    def full(fd, *args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "ftruncate", full)
    with pytest.raises(MemoryError, match=r"could not size 3.0 MiB of shared memory for "
                       r"the test \(No space left on device\); free memory, or reduce") as info:
        _region.new_fd(3 << 20, "the test")
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    if hasattr(os, "posix_fallocate"):
        monkeypatch.setattr(os, "posix_fallocate", full)
        with pytest.raises(MemoryError, match=r"could not reserve 3.0 MiB .* for the test"):
            _region.new_fd(3 << 20, "the test")
