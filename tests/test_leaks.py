"""Resource leak checks over many cycles, and a loader bigger than a Docker-sized /dev/shm."""

from __future__ import annotations

import gc
import importlib.util
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from multiprocessing import resource_tracker
from pathlib import Path

import pytest
from helpers import shm
from helpers.leaks import LockPerWorker, Small, leak_a_semaphore

import fastload

CYCLES = 200
RSS_LIMIT_BYTES = 50 * 2**20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _snapshot() -> tuple[int, int, int]:
    gc.collect()
    return len(os.listdir("/proc/self/fd")), len(mp.active_children()), _maps()


@pytest.mark.timeout(300)
def test_create_epoch_close_cycles() -> None:
    # Warm up once: first-use allocations (imports, caches) are not leaks.
    with fastload.Loader(Small(), batch_size=8, num_workers=2, start_method="fork") as loader:
        assert sum(len(b[1]) for b in loader) == 64
    fds0, kids0, maps0 = _snapshot()
    rss0 = _rss()
    for _ in range(CYCLES):
        with fastload.Loader(Small(), batch_size=8, num_workers=2, start_method="fork") as loader:
            assert sum(len(b[1]) for b in loader) == 64
    fds1, kids1, maps1 = _snapshot()
    assert (fds1, kids1) == (fds0, kids0)
    assert maps1 <= maps0 + 2, f"memory mappings grew from {maps0} to {maps1}"
    assert _rss() - rss0 < RSS_LIMIT_BYTES


@pytest.mark.timeout(300)
def test_abandoned_epochs() -> None:
    with fastload.Loader(Small(), batch_size=4, num_workers=2, start_method="fork") as loader:
        for b in loader:
            break
        del b
        fds0, kids0, maps0 = _snapshot()
        rss0 = _rss()
        pids0 = {p.pid for p in mp.active_children()}
        for _ in range(CYCLES):
            for b in loader:
                break  # abandon the epoch after one batch
        del b
        # a complete epoch still delivers every index exactly once
        seen = sorted(i for batch in loader for i in batch[1].tolist())
        assert seen == list(range(64))
        assert {p.pid for p in mp.active_children()} == pids0, "workers were restarted"
        fds1, kids1, maps1 = _snapshot()
        assert (fds1, kids1) == (fds0, kids0)
        assert maps1 <= maps0 + 2
        assert _rss() - rss0 < RSS_LIMIT_BYTES
        held = loader.stats()["held_batches"]
        assert held == 0


SMALL_SHM_SCRIPT = """
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
import shutil, fastload
from helpers.leaks import Big
total = shutil.disk_usage("/dev/shm").total
assert total <= 64 * 2**20, total
with fastload.Loader(Big(), batch_size=25, num_workers=2) as loader:
    n = 0
    for b in loader:
        assert (b[:, 0] == b[:, -1]).all()
        n += len(b)
    slots = loader.stats()["nslots"] * loader.stats()["slot_bytes"]
assert n == 200, n
assert slots >= 150 * 2**20, slots
print("OK", slots // 2**20, "MiB of slots with /dev/shm of", total // 2**20, "MiB")
"""


@pytest.mark.timeout(120)
def test_works_with_small_dev_shm() -> None:
    """Docker's default 64 MB /dev/shm: fastload's memfd region does not live there."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs on /dev/shm in a private mount namespace")
    if shutil.which("unshare") is None:
        pytest.skip("the unshare command (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here: {probe.stderr.decode().strip()}")
    repo = str(Path(__file__).resolve().parents[1])
    script = SMALL_SHM_SCRIPT.format(repo=repo, tests=repo + "/tests")
    cmd = (
        "mount --make-rprivate / && mount -t tmpfs -o size=64m tmpfs /dev/shm && "
        f'exec {sys.executable} -c "$0"'
    )
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd, script], capture_output=True,
                       text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK"), r.stdout


def _memfd_mappings(pid: int) -> list[int]:
    """Sizes of the fastload memfd mappings of process ``pid``."""
    with open(f"/proc/{pid}/maps") as f:
        spans = [ln.split()[0] for ln in f if "memfd:fastload" in ln]
    return [int(b, 16) - int(a, 16) for a, b in (s.split("-") for s in spans)]


@pytest.mark.timeout(120)
def test_forked_workers_do_not_keep_other_loaders_regions() -> None:
    from helpers.datasets import Range

    a = fastload.Loader(Range(1000, (1000,)), 64, num_workers=2, start_method="fork")
    list(a)
    a_bytes = a._engine.slots.region.nbytes
    b = fastload.Loader(Range(100), 10, num_workers=1, start_method="fork")
    list(b)
    pid = b._engine.pool.procs[0].pid
    own = b._engine.slots.region.nbytes
    sizes = _memfd_mappings(pid)
    assert a_bytes not in sizes and max(sizes) < a_bytes, (sizes, a_bytes)
    assert len(sizes) == 2 and -(-own // 4096) * 4096 in sizes  # its own region and the bell
    fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert sum("memfd:fastload" in f for f in fds) == 2  # the fds Python's mmap keeps of those
    a.close()
    assert sum(len(bb) for bb in b) == 100  # b's workers never touched what they let go
    b.close()


@pytest.mark.timeout(120)
def test_forked_workers_do_not_keep_other_loaders_shared_containers() -> None:
    # share_dataset's containers of loader a (NOTE [shared containers]) are a's; b's forked
    # workers map only their own (issue 15: a closed loader's memory held by another's workers)
    from helpers.shared import Meta, meta_expected

    a = fastload.Loader(Meta(30_000), 256, num_workers=1, start_method="fork")
    a_sizes = {-(-c["bytes"] // 4096) * 4096 for c in a.stats()["shared_dataset"]}
    assert a_sizes, a.stats()["shared_dataset"]
    b = fastload.Loader(Meta(20_000), 256, num_workers=1, start_method="fork")
    b_sizes = {-(-c["bytes"] // 4096) * 4096 for c in b.stats()["shared_dataset"]}
    got = [int(x) for batch in b for x in batch["i"]]
    assert got == [meta_expected(i)["i"] for i in range(20_000)]  # b reads its own containers
    sizes = _memfd_mappings(b._engine.pool.procs[0].pid)
    assert not a_sizes & set(sizes) and b_sizes <= set(sizes), (a_sizes, b_sizes, sizes)
    assert sum(int(x) for batch in a for x in batch["h"]) == sum(
        meta_expected(i)["h"] for i in range(30_000))  # a's own workers still read theirs
    a.close()
    b.close()


WORKER_EXIT = str(Path(__file__).resolve().parent / "helpers" / "worker_exit.py")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("method", "kind"), [
    ("fork", "lock"), ("spawn", "lock"), ("forkserver", "lock"), ("spawn", "hf"),
    ("forkserver", "hf"), ("spawn", "unguarded"), ("forkserver", "unguarded")])
def test_workers_leave_no_semaphores(method: str, kind: str) -> None:
    """NOTE [worker exit]: what multiprocessing made in a worker goes with it. Before, each
    worker's named semaphore stayed in /dev/shm after close() and the program's resource
    tracker printed "There appear to be 2 leaked semaphore objects" when it ended."""
    if kind == "hf" and importlib.util.find_spec("datasets") is None:
        pytest.skip("Hugging Face datasets is not installed")
    r = subprocess.run([sys.executable, WORKER_EXIT, method, kind], capture_output=True,
                       text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    if kind != "unguarded":  # the workers did make semaphores (fork: unnamed, none in /dev/shm)
        assert (report["during"] >= 1) == (method != "fork"), report
    assert report["left"] == [], report
    assert "leaked" not in r.stderr, r.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_run_their_own_finalizers_not_the_parents(method: str) -> None:
    # the parent's named semaphore, whose multiprocessing finalizer unlinks it: a fork worker
    # inherits that registration, and must not run it when it exits (NOTE [worker exit])
    mine = mp.get_context("spawn").Lock()
    path = "/dev/shm/sem." + mine._semlock.name.lstrip("/")  # type: ignore[attr-defined]
    assert os.path.exists(path)
    before = shm.snapshot()
    with fastload.Loader(LockPerWorker("spawn"), 4, num_workers=2, start_method=method) as loader:
        assert sum(len(b) for b in loader) == 16
        made = shm.own_new_entries(before, shm.mark_process_tree())
        assert made, "the workers' semaphores are named and carry this run's mark"
    assert shm.own_new_entries(before, shm.mark_process_tree()) == []  # theirs went with them
    assert os.path.exists(path)  # ours did not
    with mine:  # and it still works
        pass
    del mine
    gc.collect()
    assert not os.path.exists(path)


@pytest.mark.timeout(60)
def test_leak_check_reports_a_childs_leaked_semaphore() -> None:
    """The leak check (NOTE [own /dev/shm entries]) still fails a test whose child leaves a
    semaphore: the child has exited, nothing holds it, its name has this run's mark."""
    before = shm.snapshot()
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    p = ctx.Process(target=leak_a_semaphore, args=(child_conn,))
    p.start()
    child_conn.close()
    with parent_conn:
        assert parent_conn.poll(60)
        name = parent_conn.recv()
    p.join(30)
    try:
        assert p.exitcode == 0
        assert shm.own_new_entries(before, shm.mark_process_tree()) == ["sem." + name[1:]]
    finally:  # leave nothing for this test's own check, nor the tracker's warning at exit
        import _multiprocessing

        _multiprocessing.sem_unlink(name)
        resource_tracker.unregister(name, "semaphore")
    assert shm.own_new_entries(before, shm.mark_process_tree()) == []


def test_leak_check_reports_what_this_run_holds() -> None:
    from multiprocessing import shared_memory

    before = shm.snapshot()
    block = shared_memory.SharedMemory(create=True, size=4096)  # no mark: held by pytest
    try:
        assert shm.own_new_entries(before, shm.mark_process_tree()) == [block.name.lstrip("/")]
    finally:
        block.close()
        block.unlink()


FOREIGN = """
import multiprocessing as mp, os, sys, time
lock = mp.get_context("spawn").Lock()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {lock._semlock.name}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1] + ".stop") and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.mark.timeout(120)
def test_leak_check_ignores_other_programs_entries(tmp_path: Path) -> None:
    """A semaphore made meanwhile by a program outside this run (issue 28: a newcomer's first
    run failed for any other program's) is not this test's."""
    before = shm.snapshot()
    ready = tmp_path / "ready"
    # started by a shell that exits at once: the program is no descendant of pytest
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" "$1" >/dev/null 2>&1 &',
                    FOREIGN, str(ready)], check=True, timeout=30)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid, name = ready.read_text().split()
    try:
        assert int(pid) not in shm.tree_pids()
        entry = "sem." + name[1:]
        assert entry in shm.snapshot() - before  # what the old, machine-wide check failed on
        assert shm.own_new_entries(before, shm.mark_process_tree()) == []
    finally:
        (tmp_path / "ready.stop").touch()  # it exits and unlinks its semaphore
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.path.exists(f"/proc/{pid}"):  # pragma: no cover - it ignored the stop file
            os.kill(int(pid), signal.SIGKILL)
