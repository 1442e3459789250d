"""RingIndex: the slot state machine of csrc/fl_ring.c, through its Cython face."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import struct
import threading
import time
from collections import deque

import numpy as np
import pytest

import fastload
from fastload import _ring
from fastload._ring import CLAIMED, FAILED, FREE, QUEUED, READING, READY, RingIndex, state_bits

from helpers import MP_TIMEOUT

PAGE = 4096


def geometry(nslots, slot_bytes):
    ctl = _ring.control_nbytes(nslots)
    data_offset = -(-ctl // PAGE) * PAGE
    return data_offset, data_offset + nslots * slot_bytes


@pytest.fixture
def ring():
    """A 4-slot ring over an anonymous mapping (page-aligned, as the C core requires)."""
    off, total = geometry(4, 256)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 4, 256, off, os.getpid())
    yield r
    r.close()
    mm.close()


def st(r, slot):
    return state_bits(r.state(slot))[0]


# -- create / attach --------------------------------------------------------------------------------
def test_create_then_attach_sees_the_same_geometry():
    off, total = geometry(8, 4096)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 8, 4096, off, 1234)
    r2 = RingIndex(mm)
    for x in (r, r2):
        assert (x.nslots, x.slot_bytes, x.data_offset) == (8, 4096, off)
        assert not x.stopped and not x.closed
    assert all(st(r2, s) == FREE for s in range(8))
    r.queue(3, 17, 2, 5)
    assert st(r2, 3) == QUEUED and r2.slot_info(3)["seq"] == 17
    r.close()
    r2.close()
    mm.close()


def test_create_over_a_bytearray():
    off, total = geometry(2, 64)
    # bytearray storage is not necessarily 128-byte aligned: the core either formats it or refuses
    # with ValueError (EINVAL); it must never corrupt memory or crash.
    buf = bytearray(total + 256)
    try:
        r = RingIndex.create(buf, 2, 64, off, 1)
    except ValueError:
        return
    r.queue(0, 0, 0, 1)
    assert st(r, 0) == QUEUED
    r.close()


def test_control_nbytes():
    assert _ring.control_nbytes(1) < _ring.control_nbytes(2) < _ring.control_nbytes(100)
    with pytest.raises(ValueError):
        _ring.control_nbytes(0)
    with pytest.raises(ValueError):
        _ring.control_nbytes(_ring.MAX_SLOTS + 1)
    assert _ring.control_nbytes(_ring.MAX_SLOTS) > 0


@pytest.mark.parametrize(
    "nslots, slot_bytes, data_offset, exc",
    [
        (0, 64, PAGE, ValueError),  # no slots
        (4, 64, 64, ValueError),  # data overlaps the control block (ENOSPACE)
        (4, 2 * PAGE, PAGE, ValueError),  # slots do not fit
        (4, 2**62, PAGE, ValueError),  # overflow
    ],
)
def test_create_rejects_bad_geometry(nslots, slot_bytes, data_offset, exc):
    mm = mmap.mmap(-1, 2 * PAGE)
    with pytest.raises(exc):
        RingIndex.create(mm, nslots, slot_bytes, data_offset, 1)
    mm.close()


def test_create_rejects_misaligned_memory():
    off, total = geometry(2, 64)
    mm = mmap.mmap(-1, total + PAGE)
    view = memoryview(mm)[8:]
    with pytest.raises(ValueError):
        RingIndex.create(view, 2, 64, off, 1)
    view.release()
    mm.close()


def test_attach_garbage_is_a_layout_mismatch():
    mm = mmap.mmap(-1, 2 * PAGE)
    mm.write(np.random.default_rng(0).integers(0, 256, 2 * PAGE, dtype=np.uint8).tobytes())
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(mm)
    mm.close()


def test_attach_zeroed_and_tiny_buffers_are_layout_mismatches():
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(bytearray(2 * PAGE))
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(bytearray(16))
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(bytearray(0))


def test_attach_checks_version_and_size():
    off, total = geometry(2, 64)
    mm = mmap.mmap(-1, total + PAGE)
    RingIndex.create(mm, 2, 64, off, 1).close()
    # A view of another size than the one formatted.
    view = memoryview(mm)[:total]
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(view)
    view.release()
    RingIndex(mm).close()  # the full buffer still attaches
    # Corrupt the layout version (bytes 8..12).
    good = mm[8:12]
    mm[8:12] = struct.pack("<I", _ring.LAYOUT_VERSION + 1)
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(mm)
    mm[8:12] = good
    mm[0:1] = b"X"  # magic
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(mm)
    mm.close()


def test_ring_keeps_buffer_exported_until_closed():
    off, total = geometry(1, 64)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 1, 64, off, 1)
    with pytest.raises(BufferError):
        mm.close()
    r.close()
    r.close()  # idempotent
    assert r.closed and r.stopped
    for call in (lambda: r.queue(0, 0, 0, 1), lambda: r.claim(1, 0),
                 lambda: r.release(0), lambda: r.cancel(0), lambda: r.reclaim(1), r.stop,
                 lambda: r.state(0), lambda: r.slot_info(0), r.stats):
        with pytest.raises(ValueError):
            call()
    # wait() says "closed" instead: another thread may close the ring between a loader's
    # last check and its wait (pool.close()), and the loader then raises LoaderClosedError
    assert r.wait(0, 0) == -2
    mm.close()


# -- the state machine ------------------------------------------------------------------------------
def test_full_cycle(ring):
    r = ring
    r.queue(1, seq=10, epoch=3, count=7)
    info = r.slot_info(1)
    assert (info["state"], info["seq"], info["epoch"], info["count"]) == (QUEUED, 10, 3, 7)
    assert r.slot_count(1) == 7
    slot, word = r.claim(5, 0.5)
    assert slot == 1
    assert state_bits(word)[:2] == (CLAIMED, 5)
    r.set_progress(1, 3, 4242)
    info = r.slot_info(1)
    assert (info["state"], info["owner"], info["progress"], info["pid"]) == (CLAIMED, 5, 3, 4242)
    assert r.wait(1, 0.05) == -1  # still claimed
    r.set_result(1, _ring.F_SPILLED, 99)
    assert r.publish(1, word, True) is True
    w = r.wait(1, 1.0)
    assert state_bits(w)[:2] == (READY, 5)
    assert r.slot_info(1)["flags"] == _ring.F_SPILLED and r.slot_info(1)["var_bytes"] == 99
    r.begin_read(1)
    assert st(r, 1) == READING
    assert r.release(1) is True
    assert st(r, 1) == FREE
    assert r.release(1) is False  # already free
    s = r.stats()
    assert (s["queued"], s["claimed"], s["published"], s["released"]) == (1, 1, 1, 1)


def test_failed_publish_and_release(ring):
    r = ring
    r.queue(0, 0, 0, 1)
    slot, word = r.claim(1, 0.5)
    assert r.publish(slot, word, False) is True
    w = r.wait(slot, 0.5)
    assert state_bits(w)[0] == FAILED
    with pytest.raises(fastload.FastloadError):
        r.begin_read(slot)  # only READY can be read
    assert r.release(slot) is True
    assert st(r, slot) == FREE


def test_claim_takes_lowest_seq_first(ring):
    r = ring
    for slot, seq in [(0, 30), (1, 10), (2, 40), (3, 20)]:
        r.queue(slot, seq, 0, 1)
    got = [r.claim(1, 0.1)[0] for _ in range(4)]
    assert got == [1, 3, 0, 2]
    assert r.claim(1, 0.0) == (-1, 0)


def test_generation_grows_on_every_queue(ring):
    r = ring
    gens = []
    for _ in range(3):
        r.queue(2, 0, 0, 1)
        gens.append(state_bits(r.state(2))[2])
        assert r.cancel(2) is True
    assert gens[0] < gens[1] < gens[2]


def test_queue_requires_free(ring):
    r = ring
    r.queue(0, 0, 0, 1)
    with pytest.raises(fastload.FastloadError):
        r.queue(0, 1, 0, 1)
    r.claim(1, 0.1)
    with pytest.raises(fastload.FastloadError):
        r.queue(0, 1, 0, 1)


def test_cancel(ring):
    r = ring
    assert r.cancel(0) is False  # FREE: nothing to cancel
    r.queue(0, 0, 0, 1)
    assert r.cancel(0) is True
    assert st(r, 0) == FREE
    assert r.claim(1, 0.0) == (-1, 0)
    r.queue(0, 1, 0, 1)
    slot, word = r.claim(1, 0.1)
    assert r.cancel(slot) is False  # claimed: cannot be cancelled
    assert st(r, slot) == CLAIMED
    assert r.stats()["cancelled"] == 1


def test_publish_with_stale_or_wrong_word(ring):
    r = ring
    r.queue(0, 0, 0, 1)
    slot, word = r.claim(1, 0.1)
    with pytest.raises(ValueError):
        r.publish(slot, (word & ~0xF) | READY, True)  # not a CLAIMED word: EINVAL
    assert r.publish(slot, word + (1 << 16), True) is False  # other generation
    assert r.publish((slot + 1) % 4, word, True) is False  # other slot (FREE)
    assert st(r, slot) == CLAIMED
    assert r.publish(slot, word, True) is True
    assert r.publish(slot, word, True) is False  # twice


def test_reclaim_requeues_a_dead_workers_slots(ring):
    r = ring
    r.queue(0, 0, 0, 1)
    r.queue(1, 1, 0, 1)
    r.queue(2, 2, 0, 1)
    s0, w0 = r.claim(7, 0.1)
    s1, w1 = r.claim(8, 0.1)
    s2, w2 = r.claim(7, 0.1)
    assert (s0, s1, s2) == (0, 1, 2)
    r.set_progress(s0, 5, 1)
    assert r.reclaim(7) == 2
    assert st(r, 0) == QUEUED and st(r, 2) == QUEUED and st(r, 1) == CLAIMED
    assert r.slot_info(0)["progress"] == 0
    assert r.slot_info(0)["seq"] == 0  # same task, new generation
    # The dead worker's late publish must fail (no ABA).
    assert r.publish(s0, w0, True) is False
    assert st(r, 0) == QUEUED
    # Another worker picks the re-queued tasks up, lowest seq first.
    assert r.claim(9, 0.1)[0] == 0
    assert r.claim(9, 0.1)[0] == 2
    assert r.reclaim(7) == 0
    assert r.stats()["reclaimed"] == 2


def test_stop_wakes_and_refuses_claims(ring):
    r = ring
    assert not r.stopped
    r.stop()
    assert r.stopped
    t = time.monotonic()
    assert r.claim(1, 5.0) == (-2, 0)
    assert time.monotonic() - t < 0.5
    r.queue(0, 0, 0, 1)  # queueing is still allowed; claiming is not
    assert r.claim(1, 0.0) == (-2, 0)


@pytest.mark.parametrize("timeout", [0.0, 0.05, 0.2])
def test_timeouts_return_quickly(ring, timeout):
    r = ring
    t = time.monotonic()
    assert r.claim(1, timeout) == (-1, 0)
    assert timeout * 0.9 <= time.monotonic() - t < timeout + 0.25
    r.queue(0, 0, 0, 1)
    t = time.monotonic()
    assert r.wait(0, timeout) == -1
    assert timeout * 0.9 <= time.monotonic() - t < timeout + 0.25


def test_claim_finds_a_task_with_the_largest_seq(ring):
    r = ring
    r.queue(2, 2**64 - 1, 0, 1)
    assert r.claim(1, 0.1)[0] == 2
    r.queue(0, 2**64 - 1, 0, 1)
    r.queue(1, 2**64 - 2, 0, 1)
    assert [r.claim(1, 0.1)[0] for _ in range(2)] == [1, 0]


@pytest.mark.parametrize("timeout", [1e10, 1e300, float("inf")])
def test_huge_timeout_means_wait_long_not_return_at_once(ring, timeout):
    """A timeout too large for int64 nanoseconds must saturate (wait), not overflow into an
    immediate time-out."""
    r = ring
    r.queue(0, 0, 0, 1)
    slot, word = r.claim(1, 0.1)
    publisher = threading.Timer(0.3, r.publish, args=(slot, word, True))
    t = time.monotonic()
    publisher.start()
    try:
        w = r.wait(slot, timeout)
        took = time.monotonic() - t
    finally:
        publisher.join()
    assert w >= 0, f"wait({timeout}) timed out after {took:.6f}s"
    assert state_bits(w)[0] == READY
    assert took >= 0.25


def test_wait_returns_at_once_for_done_or_free_slots(ring):
    r = ring
    t = time.monotonic()
    w = r.wait(0, 5.0)  # FREE is not "in flight"
    assert time.monotonic() - t < 0.5
    assert state_bits(w)[0] == FREE


@pytest.mark.parametrize("slot", [4, 5, 2**31, 2**32 - 1])
def test_bad_slot_is_index_error(ring, slot):
    r = ring
    for call in (lambda: r.queue(slot, 0, 0, 1), lambda: r.wait(slot, 0), lambda: r.release(slot),
                 lambda: r.cancel(slot), lambda: r.begin_read(slot), lambda: r.state(slot),
                 lambda: r.slot_info(slot), lambda: r.slot_count(slot),
                 lambda: r.publish(slot, CLAIMED, True), lambda: r.set_progress(slot, 0, 0),
                 lambda: r.set_result(slot, 0, 0)):
        with pytest.raises(IndexError):
            call()


@pytest.mark.parametrize("slot", [-1, 2**32])
def test_slot_outside_uint32_is_index_error(ring, slot):
    """A bad slot is an IndexError, also when it does not even fit the C type."""
    r = ring
    for call in (lambda: r.queue(slot, 0, 0, 1), lambda: r.wait(slot, 0), lambda: r.release(slot),
                 lambda: r.cancel(slot), lambda: r.state(slot), lambda: r.slot_info(slot)):
        with pytest.raises(IndexError):
            call()


def test_bad_worker_id(ring):
    with pytest.raises(ValueError):
        ring.claim(_ring.MAX_WORKERS + 1, 0)
    with pytest.raises(ValueError):
        ring.reclaim(_ring.MAX_WORKERS + 1)


def test_state_bits():
    word = (0x1234 << 16) | (0xABC << 4) | READY
    assert state_bits(word) == (READY, 0xABC, 0x1234)


# -- multi-process stress ----------------------------------------------------------------------------
STRESS_TASKS = 250_000  # x4 operations (claim + publish + wait + release) = 1,000,000
STRESS_SLOTS = 16
STRESS_SLOT_BYTES = 128
PRODUCERS = 3
MULT = 0x9E3779B97F4A7C15
MASK = 2**64 - 1


def payload(seq, k):
    return (seq * MULT + k) & MASK


def _producer(mm, worker_id):
    """Claim, check the task, write a payload derived from seq into the slot, publish."""
    r = RingIndex(mm)
    off, size = r.data_offset, r.slot_bytes
    done = 0
    while True:
        slot, word = r.claim(worker_id, 0.1)
        if slot == -2:
            break
        if slot < 0:
            continue
        base = off + slot * size
        (seq,) = struct.unpack_from("<Q", mm, base)
        if state_bits(word)[:2] != (CLAIMED, worker_id) or r.slot_info(slot)["seq"] != seq:
            os._exit(10)
        struct.pack_into("<8Q", mm, base + 8, *(payload(seq, k) for k in range(8)))
        struct.pack_into("<Q", mm, base + 72, worker_id)
        if not r.publish(slot, word, True):
            os._exit(11)
        done += 1
    r.close()
    os._exit(0 if done > 0 else 12)


@pytest.mark.timeout(MP_TIMEOUT)
def test_stress_three_producers_one_consumer():
    off, total = geometry(STRESS_SLOTS, STRESS_SLOT_BYTES)
    mm = mmap.mmap(-1, total)  # MAP_SHARED | MAP_ANONYMOUS: shared with forked children
    ring = RingIndex.create(mm, STRESS_SLOTS, STRESS_SLOT_BYTES, off, os.getpid())
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_producer, args=(mm, w + 1), daemon=True) for w in range(PRODUCERS)]
    for p in procs:
        p.start()
    ops = 0
    per_worker = [0] * (PRODUCERS + 1)
    t0 = time.monotonic()
    try:
        free = list(range(STRESS_SLOTS))
        inflight: deque = deque()
        next_seq = 0
        for expected in range(STRESS_TASKS):
            while free and next_seq < STRESS_TASKS:
                s = free.pop()
                struct.pack_into("<Q", mm, off + s * STRESS_SLOT_BYTES, next_seq)
                ring.queue(s, next_seq, 0, 1)
                inflight.append((next_seq, s))
                next_seq += 1
            seq, s = inflight.popleft()
            assert seq == expected
            while True:
                w = ring.wait(s, 0.1)
                if w >= 0:
                    break
                assert all(p.exitcode is None for p in procs), [p.exitcode for p in procs]
                assert time.monotonic() - t0 < MP_TIMEOUT - 5, "stress test stalled"
            state, owner, _ = state_bits(w)
            assert state == READY and 1 <= owner <= PRODUCERS
            base = off + s * STRESS_SLOT_BYTES
            got = struct.unpack_from("<9Q", mm, base + 8)
            assert got[:8] == tuple(payload(seq, k) for k in range(8)), f"seq {seq}: torn payload"
            assert got[8] == owner
            per_worker[owner] += 1
            assert ring.release(s)
            free.append(s)
            ops += 4
    finally:
        ring.stop()
        for p in procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()
                p.join()
    elapsed = time.monotonic() - t0
    assert [p.exitcode for p in procs] == [0] * PRODUCERS
    assert ops == 1_000_000
    stats = ring.stats()
    assert stats["queued"] == stats["claimed"] == stats["published"] == stats["released"] == STRESS_TASKS
    assert sum(per_worker) == STRESS_TASKS
    ring.close()
    mm.close()
    assert elapsed < 60, elapsed


# -- the pool's bell (csrc/fl_bell.h; the C tests cover its concurrency) ----------------------
def test_bell_create_attach_and_errors():
    m = mmap.mmap(-1, 4096)
    with pytest.raises(fastload.LayoutMismatchError):
        _ring.Bell(m)  # not formatted
    bell = _ring.Bell(m, create=True)
    other = _ring.Bell(m)  # a second view of the same bell, as a worker has
    assert bell.value() == other.value() == 0
    bell.ring()
    assert other.value() == 1
    assert bell.stats() == {"rings": 1, "wakes": 0, "waits": 0}  # nobody slept: no syscall
    with pytest.raises(ValueError):
        _ring.Bell(bytearray(8), create=True)  # smaller than the bell
    other.close()
    bell.close()
    bell.close()  # idempotent
    assert bell.closed
    with pytest.raises(ValueError, match="the bell is closed"):
        bell.value()
    with pytest.raises(ValueError, match="the bell is closed"):
        bell.ring()
    m.close()  # no export left


def test_bell_wait_returns_at_once_timeout_or_ring():
    m = mmap.mmap(-1, 4096)
    bell = _ring.Bell(m, create=True)
    seen = bell.value()
    assert bell.wait(seen + 1, 10.0) is True  # the counter already moved: no sleep
    t = time.monotonic()
    assert bell.wait(seen, 0.05) is False
    assert time.monotonic() - t >= 0.04
    assert bell.wait(seen, 0.0) is False and bell.wait(seen, float("nan")) is False

    def ring_soon():
        time.sleep(0.05)
        bell.ring()

    th = threading.Thread(target=ring_soon)
    th.start()
    t = time.monotonic()
    assert bell.wait(seen, 30.0) is True  # the GIL is released while it sleeps
    assert time.monotonic() - t < 10
    th.join()
    assert bell.stats()["waits"] >= 1
    bell.stop()
    assert bell.wait(bell.value(), 30.0) is None  # stopped: at once
    bell.close()
    m.close()


def test_close_from_another_thread_keeps_the_buffer_until_the_waiter_leaves():
    """pool.close() in one thread, ring.wait() in another: the buffer stays exported (mapped)
    until the waiter is out of the C loop; then wait() says closed (-2), never touches it."""
    off, total = geometry(4, 256)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 4, 256, off, os.getpid())
    r.queue(0, 1, 0, 1)  # QUEUED and never claimed: wait() sleeps its whole timeout
    got = []
    t = threading.Thread(target=lambda: got.append(r.wait(0, 0.5)))
    t.start()
    time.sleep(0.1)
    r.close()
    assert r.closed
    with pytest.raises(BufferError):
        mm.close()  # the waiter still holds the export: unmapping now would crash it
    t.join(5)
    assert got == [-1]  # it timed out normally, reading a mapped buffer
    assert r.wait(0, 0.1) == -2 and r.closed
    mm.close()  # the last waiter left: the export is gone
