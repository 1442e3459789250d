"""One RingIndex and one Packer hammered from many threads (NOTE [free threading] in
fastload/_ring.pyx): every batch queued is taken and published exactly once, and a close() from
another thread while others wait, take or copy never crashes and never unmaps memory under
them: their calls raise ValueError (or a wait returns False) from then on. On a GIL build the
GIL already orders these calls (the tests pass without the critical sections too: they check the
protocol, a close deferred by threads inside); on a free-threaded build (none can be had on
these machines) the same tests are the stress test of the critical sections."""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time

import numpy as np
import pytest

from fastload import _ring
from fastload._pack import Packer
from fastload._ring import READY, RingIndex, state_bits
from fastload.layout import BatchLayout

PAGE = mmap.PAGESIZE
THREADS = 8


def _ring_over(nslots: int, slot_bytes: int = 256) -> tuple[RingIndex, mmap.mmap]:
    ctl = _ring.control_nbytes(nslots, 1)
    off = -(-ctl // PAGE) * PAGE
    mm = mmap.mmap(-1, off + nslots * slot_bytes)
    return RingIndex.create(mm, nslots, slot_bytes, off, os.getpid()), mm


@pytest.fixture(autouse=True)
def _fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # GIL build: switch threads as often as possible
    yield
    sys.setswitchinterval(old)


def test_many_threads_take_every_batch_once():
    ring, mm = _ring_over(16)
    batches = 4000
    taken: list[list[int]] = [[] for _ in range(THREADS)]
    stop = threading.Event()

    def worker(w: int) -> None:
        while not stop.is_set():
            t = ring.take(w)
            if t is False:
                return
            if t:
                taken[w].append(t.seq)
                assert ring.done(t, w) is True

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(THREADS)]
    for t in threads:
        t.start()
    try:
        free = list(range(16))
        inflight: list[int] = []
        seq = 0
        got = 0
        deadline = time.monotonic() + 60
        while got < batches:
            assert time.monotonic() < deadline, "the threads stopped taking"
            while free and seq < batches:
                slot = free.pop()
                ring.queue(slot, seq, 0, 1)
                inflight.append(slot)
                seq += 1
            slot = inflight.pop(0)
            r = ring.await_result(slot, 10.0)
            assert r is not None and r[0] == READY
            ring.begin_read(slot)
            assert ring.retire(slot)
            free.append(slot)
            got += 1
    finally:
        ring.stop()
        stop.set()
        for t in threads:
            t.join(10)
    seqs = sorted(s for per in taken for s in per)
    assert seqs == list(range(batches))  # each batch exactly once
    assert sum(1 for per in taken if per) > 1  # several threads took batches
    ring.close()
    mm.close()


def test_close_while_threads_wait_and_take():
    ring, mm = _ring_over(4)
    ring.queue(0, 0, 0, 1)  # slot 0 QUEUED: waits on it block until the timeout
    errors: list[BaseException] = []
    seen: list[object] = []

    def waiter() -> None:
        try:
            seen.append(ring.wait(0, 5.0))
        except BaseException as e:  # pragma: no cover - a failure is reported below
            errors.append(e)

    def taker(w: int) -> None:
        while True:
            try:
                t = ring.take(w)
            except ValueError:
                return  # closed: every call after close() says so
            except BaseException as e:  # pragma: no cover
                errors.append(e)
                return
            if t:
                ring.fail(t, w, 0)  # never publish READY: slot 0 stays busy for the waiter

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    threads += [threading.Thread(target=taker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    ring.close()  # the waiters still inside keep the export; new calls are refused
    assert ring.closed
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert not errors, errors
    with pytest.raises(ValueError, match="closed"):
        ring.take(0)
    assert ring.wait(0, 0.0) is False
    mm.close()  # every export dropped: the mapping can go (BufferError otherwise)


def test_close_while_threads_pack():
    lay = BatchLayout(np.zeros((512, 512), np.float32), batch_size=4)  # 1 MiB: copies release the GIL
    nslots = THREADS
    buf = mmap.mmap(-1, lay.slot_bytes * nslots)
    p = Packer(buf, 0, lay.slot_bytes, nslots, 4, lay.tree, lay.packer_fields)
    sample = np.ones((512, 512), np.float32)
    errors: list[BaseException] = []
    packed = [0] * THREADS

    def packer(w: int) -> None:
        while True:
            try:
                p.pack(w, packed[w] % 4, sample, [])
            except ValueError:
                return  # closed
            except BaseException as e:  # pragma: no cover
                errors.append(e)
                return
            packed[w] += 1

    threads = [threading.Thread(target=packer, args=(w,)) for w in range(THREADS)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    p.close()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert not errors, errors
    assert all(packed)
    buf.close()  # no export left
    assert state_bits(0)[0] == 0
