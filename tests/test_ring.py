"""RingIndex: the piece protocol of csrc/fl_ring.c (NOTE [pieces]), through its Cython face."""

from __future__ import annotations

import math
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
from fastload._ring import (
    CLOSING,
    FAILED,
    FREE,
    PIECE_CLOSED,
    PIECE_DONE,
    PIECE_ERRORED,
    PIECE_FREE,
    PIECE_GIVEN,
    PIECE_TAKEN,
    QUEUED,
    READING,
    READY,
    RingIndex,
    Take,
    state_bits,
)

from helpers import MP_TIMEOUT

PAGE = 4096
NSLOTS = 4
MAX_PIECES = 16


def geometry(nslots, slot_bytes, max_pieces=1):
    ctl = _ring.control_nbytes(nslots, max_pieces)
    data_offset = -(-ctl // PAGE) * PAGE
    return data_offset, data_offset + nslots * slot_bytes


@pytest.fixture
def ring():
    """A 4-slot ring of up to 16 pieces a batch over an anonymous mapping (page-aligned, as the
    C core requires)."""
    off, total = geometry(NSLOTS, 256, MAX_PIECES)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, NSLOTS, 256, off, os.getpid(), max_pieces=MAX_PIECES)
    yield r
    r.close()
    mm.close()


def st(r, slot):
    return state_bits(r.state(slot))[0]


def kinds(r, slot):
    """[(kind, owner, first, n)] of the slot's pieces (without progress)."""
    return [p[:4] for p in r.pieces(slot)]


def wait_until(pred, timeout=10.0, what="a condition"):
    """Poll ``pred`` (bounded): for states another thread or process reaches, where no event
    exists to wait on (e.g. "that thread is asleep inside the C wait")."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def sleeping_in_wait(r, before):
    """The ring's parent wait bumps ``futex_waits`` just before it sleeps (fl_wait.h), in the
    portable build too: a thread is (about to be) asleep once the counter moved."""
    return lambda: r.stats()["futex_waits"] > before


# -- create / attach --------------------------------------------------------------------------------
def test_create_then_attach_sees_the_same_geometry():
    off, total = geometry(8, 4096, 5)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 8, 4096, off, 1234, max_pieces=5)
    r2 = RingIndex(mm)
    for x in (r, r2):
        assert (x.nslots, x.slot_bytes, x.data_offset, x.max_pieces) == (8, 4096, off, 5)
        assert not x.stopped and not x.closed
    assert all(st(r2, s) == FREE for s in range(8))
    r.queue(3, 17, 2, 5)
    assert st(r2, 3) == QUEUED and r2.slot_info(3)["seq"] == 17
    t = r2.take(1)  # what one view queues, the other takes
    assert t is not None and t is not False and t.slot == 3
    r.close()
    r2.close()
    mm.close()


def test_create_defaults_to_one_piece():
    off, total = geometry(2, 64)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 2, 64, off, 1)
    assert r.max_pieces == 1
    r.queue(0, 0, 0, 10, share=True)  # one entry: a shared batch is still taken whole
    t = r.take(1, divisor=5)
    assert isinstance(t, Take) and (t.first, t.n, t.shared) == (0, 10, True)
    assert r.take(2) is None
    r.close()
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
    assert _ring.control_nbytes(4) == _ring.control_nbytes(4, 1)
    # the piece tables grow with max_pieces
    assert _ring.control_nbytes(4, 1) <= _ring.control_nbytes(4, 64) < _ring.control_nbytes(4, 512)
    with pytest.raises(ValueError):
        _ring.control_nbytes(0)
    with pytest.raises(ValueError):
        _ring.control_nbytes(_ring.MAX_SLOTS + 1)
    with pytest.raises(ValueError):
        _ring.control_nbytes(4, 0)
    with pytest.raises(ValueError):
        _ring.control_nbytes(4, _ring.MAX_PIECES + 1)
    assert _ring.control_nbytes(_ring.MAX_SLOTS) > 0
    assert _ring.control_nbytes(1, _ring.MAX_PIECES) > 0


@pytest.mark.parametrize(
    "nslots, slot_bytes, data_offset, max_pieces",
    [
        (0, 64, PAGE, 1),  # no slots
        (4, 64, 64, 1),  # data overlaps the control block (ENOSPACE)
        (4, 2 * PAGE, PAGE, 1),  # slots do not fit
        (4, 2**62, PAGE, 1),  # overflow
        (4, 64, PAGE, 0),  # no piece table
        (4, 64, PAGE, _ring.MAX_PIECES + 1),  # too many pieces
        (4, 64, 2 * PAGE - 4 * 64, _ring.MAX_PIECES),  # piece tables overlap the data
    ],
)
def test_create_rejects_bad_geometry(nslots, slot_bytes, data_offset, max_pieces):
    mm = mmap.mmap(-1, 2 * PAGE)
    with pytest.raises(ValueError):
        RingIndex.create(mm, nslots, slot_bytes, data_offset, 1, max_pieces=max_pieces)
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
    assert _ring.LAYOUT_VERSION == 4
    # Corrupt the layout version (bytes 8..12).
    good = mm[8:12]
    mm[8:12] = struct.pack("<I", _ring.LAYOUT_VERSION - 1)  # a region of the old protocol
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(mm)
    mm[8:12] = struct.pack("<I", _ring.LAYOUT_VERSION + 1)
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(mm)
    mm[8:12] = good
    # A piece table size the region has no room for (max_pieces, bytes 56..60).
    good = mm[56:60]
    mm[56:60] = struct.pack("<I", _ring.MAX_PIECES)
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(mm)
    mm[56:60] = good
    RingIndex(mm).close()
    mm[0:1] = b"X"  # magic
    with pytest.raises(fastload.LayoutMismatchError):
        RingIndex(mm)
    mm.close()


def test_ring_keeps_buffer_exported_until_closed():
    off, total = geometry(1, 64)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 1, 64, off, 1)
    r.queue(0, 0, 0, 1)
    t = r.take(1)
    assert isinstance(t, Take)
    with pytest.raises(BufferError):
        mm.close()
    r.close()
    r.close()  # idempotent
    assert r.closed and r.stopped
    for call in (lambda: r.queue(0, 0, 0, 1), lambda: r.take(1), lambda: r.done(t, 1),
                 lambda: r.fail(t, 1, 0), lambda: r.retire(0), lambda: r.give_back(0, 1, True),
                 lambda: r.pieces(0), lambda: r.progress(0, 0, 1, 1),
                 lambda: r.set_progress(0, 1, 1), lambda: r.set_rows(0, 1),
                 lambda: r.set_result(0, 0, 0), lambda: r.begin_read(0), r.stop,
                 lambda: r.state(0), lambda: r.slot_info(0), lambda: r.slot_count(0), r.stats):
        with pytest.raises(ValueError, match="the ring is closed"):
            call()
    # wait() and await_result() say "closed" instead: another thread may close the ring between
    # a loader's last check and its wait (pool.close()), and the loader then raises
    # LoaderClosedError
    assert r.wait(0, 0) is False
    assert r.await_result(0, 0) is False
    mm.close()


# -- a batch taken whole ----------------------------------------------------------------------------
def test_full_cycle(ring):
    r = ring
    r.queue(1, seq=10, epoch=3, count=7)
    info = r.slot_info(1)
    assert (info["state"], info["seq"], info["epoch"], info["count"], info["rows"]) == (
        QUEUED, 10, 3, 7, 7)
    assert (info["target"], info["shared"], info["err_row"]) == (None, False, None)
    assert r.slot_count(1) == 7
    assert kinds(r, 1) == []  # nothing cut yet
    t = r.take(5, pid=4242)
    assert isinstance(t, Take)
    assert (t.slot, t.piece, t.first, t.n, t.count, t.shared, t.seq, t.epoch) == (
        1, 0, 0, 7, 7, False, 10, 3)
    assert t.state == r.state(1) and state_bits(t.state)[0] == QUEUED
    assert "slot=1" in repr(t) and "[0, 7)" in repr(t)
    assert r.pieces(1) == [(PIECE_TAKEN, 5, 0, 7, 0, 4242)]
    r.set_progress(1, 3, 4242)
    assert r.pieces(1) == [(PIECE_TAKEN, 5, 0, 7, 3, 4242)]
    assert r.slot_info(1)["pid"] == 4242
    assert r.wait(1, 0.05) is None  # still loading
    assert r.await_result(1, 0.0) is None
    r.set_result(1, _ring.F_SPILLED, 99)
    assert r.take(6) is None  # a batch taken whole is nobody else's
    assert r.done(t, 5) is True  # published it
    assert r.pieces(1)[0][0] == PIECE_DONE
    w = r.wait(1, 1.0)
    assert state_bits(w)[:2] == (READY, 5)
    res = r.await_result(1, 1.0)
    assert res == (READY, 5, 10, 7, 7, _ring.F_SPILLED, 99, 4242, w)
    r.begin_read(1)
    assert st(r, 1) == READING
    assert r.retire(1) is True
    assert st(r, 1) == FREE
    assert r.retire(1) is True  # FREE stays FREE
    assert r.done(t, 5) is None  # twice: no longer its piece
    s = r.stats()
    assert (s["queued"], s["taken"], s["published"], s["released"], s["closing"]) == (
        1, 1, 1, 1, 0)


def test_set_rows_a_short_last_batch(ring):
    r = ring
    r.queue(0, 0, 0, 8)
    t = r.take(2, pid=9)
    r.set_rows(0, 5)
    r.set_result(0, _ring.F_ENDED, 0)
    with pytest.raises(ValueError, match="has 8 rows, not 9"):
        r.set_rows(0, 9)  # more than it was queued with
    assert r.done(t, 2) is True
    assert r.await_result(0, 1.0)[:8] == (READY, 2, 0, 5, 8, _ring.F_ENDED, 0, 9)


def test_fail_a_batch_taken_whole(ring):
    r = ring
    r.queue(0, 4, 0, 6)
    t = r.take(1, pid=77)
    with pytest.raises(ValueError, match=r"row 6 is not in the piece \(rows \[0, 6\)\)"):
        r.fail(t, 1, 6)  # not a row of the piece
    assert st(r, 0) == QUEUED
    assert r.fail(t, 1, 3) is True  # the rows before it are in its own piece: settled at once
    res = r.await_result(0, 1.0)
    assert res[:3] == (FAILED, 1, 4) and res[7] == 77
    info = r.slot_info(0)
    assert (info["err_row"], info["err_owner"], info["pid"]) == (3, 1, 77)
    assert r.pieces(0) == [(PIECE_ERRORED, 1, 0, 6, 3, 77)]  # the row that raised
    with pytest.raises(fastload.FastloadError):
        r.begin_read(0)  # only READY can be read
    assert r.fail(t, 1, 3) is None  # no longer a TAKEN piece
    assert r.retire(0) is True
    assert st(r, 0) == FREE
    r.queue(0, 5, 0, 6)  # a new batch forgets the error
    assert r.slot_info(0)["err_row"] is None


def test_take_order_lowest_seq_first(ring):
    r = ring
    for slot, seq in [(0, 30), (1, 10), (2, 40), (3, 20)]:
        r.queue(slot, seq, 0, 1)
    got = [r.take(1).slot for _ in range(4)]
    assert got == [1, 3, 0, 2]
    assert r.take(1) is None


def test_take_order_oldest_epoch_then_begun_shared_batches(ring):
    r = ring
    r.queue(0, 1, 1, 1)  # epoch 1, the lowest seq
    r.queue(1, 9, 0, 1)  # epoch 0: before it
    assert r.take(1).slot == 1
    r.queue(2, 5, 1, 4, share=True)
    a = r.take(2, divisor=4)  # slot 2 (seq 5) or slot 0 (seq 1)? lowest seq of the oldest epoch
    assert a.slot == 0
    b = r.take(2, divisor=4)
    assert (b.slot, b.first, b.n) == (2, 0, 1)
    r.queue(3, 0, 2, 1)  # a later epoch: the begun shared batch (helping) comes first
    c = r.take(3, divisor=4)
    assert (c.slot, c.first) == (2, 1)


def test_take_finds_a_task_with_the_largest_seq(ring):
    r = ring
    r.queue(2, 2**64 - 1, 0, 1)
    assert r.take(1).slot == 2
    r.queue(0, 2**64 - 1, 2**64 - 1, 1)
    r.queue(1, 2**64 - 2, 2**64 - 1, 1)
    t = r.take(1)
    assert (t.slot, t.seq, t.epoch) == (1, 2**64 - 2, 2**64 - 1)
    assert r.take(1).slot == 0


def test_take_returns_none_when_nothing_is_queued(ring):
    r = ring
    assert r.take(1) is None
    r.queue(0, 0, 0, 1)
    t = r.take(1)
    assert r.take(1) is None  # taken
    r.done(t, 1)
    assert r.take(1) is None  # READY
    r.queue(1, 0, 0, 1, target=3)
    assert r.take(1) is None  # someone else's
    assert r.slot_info(1)["target"] == 3
    assert r.take(3).slot == 1


def test_generation_grows_on_every_queue(ring):
    r = ring
    gens = []
    for _ in range(3):
        r.queue(2, 0, 0, 1)
        gens.append(state_bits(r.state(2))[2])
        assert r.slot_info(2)["gen"] == gens[-1]
        assert r.retire(2) is True
    assert gens[0] < gens[1] < gens[2]


def test_queue_requires_free(ring):
    r = ring
    r.queue(0, 0, 0, 1)
    with pytest.raises(fastload.FastloadError):
        r.queue(0, 1, 0, 1)  # QUEUED
    t = r.take(1)
    assert r.retire(0) is False  # CLOSING: a worker still loads it
    with pytest.raises(fastload.FastloadError):
        r.queue(0, 1, 0, 1)  # CLOSING
    assert r.done(t, 1) is False
    r.queue(0, 1, 0, 1)  # FREE again
    r.done(r.take(1), 1)
    with pytest.raises(fastload.FastloadError):
        r.queue(0, 2, 0, 1)  # READY
    assert st(r, 0) == READY


def test_queue_rejects_bad_arguments(ring):
    r = ring
    for kwargs in (
        {"count": 0},
        {"count": 4, "target": _ring.MAX_WORKERS},
        {"count": 4, "owners": [1]},  # owners of a batch not shared
        {"count": 4, "share": True, "owners": [1, 2, 3, 1, 2]},  # more owners than rows
        {"count": 4, "share": True, "owners": [1], "target": 1},  # a target and owners
        {"count": 4, "share": True, "owners": [_ring.MAX_WORKERS]},
        {"count": 70_000, "share": True, "owners": [1]},  # rows of several per unit
    ):
        with pytest.raises(ValueError):
            r.queue(0, 0, 0, **kwargs)
        assert st(r, 0) == FREE, kwargs
    with pytest.raises(OverflowError):
        r.queue(0, 0, 0, 4, target=-1)


# -- a shared batch, in pieces -----------------------------------------------------------------------
def test_shared_batch_cut_into_pieces_by_two_workers(ring):
    r = ring
    r.queue(1, 6, 2, 10, share=True)
    assert r.slot_info(1)["shared"] is True
    a = r.take(1, divisor=2, pid=11)  # half of what is left: 5 rows
    b = r.take(2, divisor=2, pid=22)  # 2 of the 5 left
    c = r.take(1, divisor=2, min_units=2, pid=11)  # 3 // 2 = 1 < min_units
    d = r.take(2, divisor=2, pid=22)  # the last row
    got = [(t.piece, t.first, t.n, t.count, t.shared, t.seq, t.epoch) for t in (a, b, c, d)]
    assert got == [(0, 0, 5, 10, True, 6, 2), (1, 5, 2, 10, True, 6, 2),
                   (2, 7, 2, 10, True, 6, 2), (3, 9, 1, 10, True, 6, 2)]
    assert r.take(3) is None  # every row is handed out
    assert kinds(r, 1) == [(PIECE_TAKEN, 1, 0, 5), (PIECE_TAKEN, 2, 5, 2),
                           (PIECE_TAKEN, 1, 7, 2), (PIECE_TAKEN, 2, 9, 1)]
    r.progress(1, b.piece, 1, 22)
    assert r.pieces(1)[1] == (PIECE_TAKEN, 2, 5, 2, 1, 22)
    with pytest.raises(ValueError):
        r.progress(1, MAX_PIECES, 1, 22)  # no such entry
    assert r.done(d, 2) is False
    assert r.done(a, 1) is False
    assert r.done(b, 1) is None  # not worker 1's piece
    assert r.done(b, 2) is False
    assert r.await_result(1, 0.0) is None
    assert r.done(c, 1) is True  # the last piece publishes the batch
    res = r.await_result(1, 1.0)
    assert res[:5] == (READY, 1, 6, 10, 10)  # owned by the worker that finished it
    assert res[7] == 11  # the loader of its first piece
    assert all(p[0] == PIECE_DONE for p in r.pieces(1))
    assert r.stats()["taken"] == 4


def test_divisor_one_takes_the_rest_and_the_last_entry_takes_all(ring):
    r = ring
    r.queue(0, 0, 0, 100, share=True)
    assert r.take(1).n == 100  # divisor 1 (the default): all that is left
    off, total = geometry(1, 64, 2)
    mm = mmap.mmap(-1, total)
    r2 = RingIndex.create(mm, 1, 64, off, 1, max_pieces=2)
    r2.queue(0, 0, 0, 100, share=True)
    a = r2.take(1, divisor=10)
    b = r2.take(2, divisor=10)  # the table's last entry: never leave rows nobody can cut
    assert (a.first, a.n, b.first, b.n) == (0, 10, 10, 90)
    assert r2.take(3) is None
    r2.close()
    mm.close()


def test_pieces_count_units_of_rows_for_huge_batches(ring):
    """Over 65536 rows a piece counts units of several rows (fl_ring_unit); take and pieces
    speak rows, and the last piece ends at the batch's count."""
    r = ring
    count = 200_001  # 4 rows a unit (the last unit holds 1)
    r.queue(0, 0, 0, count, share=True)
    a = r.take(1, divisor=2)
    b = r.take(1, divisor=2)
    c = r.take(1)
    # 50001 units: half of them, then half of the 25001 left, then the rest
    assert (a.first, a.n) == (0, 25_000 * 4)
    assert (b.first, b.n) == (100_000, 12_500 * 4)
    assert (c.first, c.n) == (150_000, count - 150_000)  # 12501 units, the last one short
    assert [(p[2], p[3]) for p in r.pieces(0)] == [(t.first, t.n) for t in (a, b, c)]
    assert r.done(a, 1) is False and r.done(b, 1) is False and r.done(c, 1) is True
    assert r.await_result(0, 1.0)[3] == count


def test_owners_rows_are_taken_first_by_their_worker(ring):
    r = ring
    r.queue(0, 0, 0, 1)  # the lowest seq, nobody's in particular
    r.queue(1, 1, 0, 6, share=True, owners=[2, None, 1])
    assert kinds(r, 1) == [(PIECE_GIVEN, 2, 0, 1), (PIECE_FREE, 0, 1, 1), (PIECE_GIVEN, 1, 2, 1)]
    g1 = r.take(1, divisor=6)
    assert (g1.slot, g1.first, g1.n) == (1, 2, 1)  # its own row before the lower seq
    g2 = r.take(2, divisor=6)
    assert (g2.slot, g2.first, g2.n) == (1, 0, 1)
    other = r.take(3, divisor=6)
    assert other.slot == 0  # nothing given to worker 3: the lowest seq
    f = r.take(3, divisor=6)
    assert (f.slot, f.first, f.n) == (1, 1, 1)  # the row given to none
    rest = r.take(4)
    assert (rest.first, rest.n) == (3, 3)  # cut after the given rows
    for t, w in ((g1, 1), (g2, 2), (f, 3)):
        assert r.done(t, w) is False
    assert r.done(rest, 4) is True
    assert r.await_result(1, 1.0)[:2] == (READY, 4)


def test_owners_never_leave_rows_nobody_can_take():
    # Owners that fill the piece table while rows are left would leave those rows uncuttable
    # (the batch would never settle): refused. Owners of every row may fill it.
    off, total = geometry(1, 64, 2)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 1, 64, off, 1, max_pieces=2)
    try:
        with pytest.raises(ValueError):
            r.queue(0, 0, 0, 4, share=True, owners=[1, 2, 3])
        with pytest.raises(ValueError):
            r.queue(0, 0, 0, 4, share=True, owners=[1, 2])
        r.queue(0, 0, 0, 2, share=True, owners=[1, 2])
        for w in (1, 2):
            t = r.take(w)
            assert (t.first, t.n) == (w - 1, 1)
            r.done(t, w)
        assert st(r, 0) == READY, r.pieces(0)
    finally:
        r.close()
        mm.close()


def test_fail_on_a_shared_batch_waits_for_the_rows_below(ring):
    r = ring
    r.queue(2, 3, 0, 10, share=True)
    a = r.take(1, divisor=2, pid=11)  # [0, 5)
    b = r.take(2, divisor=2, pid=22)  # [5, 7)
    c = r.take(1, divisor=2, min_units=2, pid=11)  # [7, 9)
    assert (a.first, b.first, c.first) == (0, 5, 7)
    assert r.fail(b, 2, 6) is False  # rows 0..5 are not all loaded yet
    assert st(r, 2) == QUEUED
    info = r.slot_info(2)
    assert (info["err_row"], info["err_owner"], info["pid"]) == (6, 2, 22)
    assert r.pieces(2)[1] == (PIECE_ERRORED, 2, 5, 2, 1, 22)  # row 6 is the piece's second
    assert r.take(3) is None  # row 9 is above the error: nobody loads it any more
    assert r.fail(c, 1, 8) is False  # a higher row: the error stays row 6's
    assert r.slot_info(2)["err_row"] == 6
    assert r.done(a, 1) is True  # every row below row 6 is loaded: FAILED now
    res = r.await_result(2, 1.0)
    assert res[:3] == (FAILED, 2, 3)  # the worker of the lowest failing row, not the publisher
    assert res[7] == 22
    assert r.retire(2) is True


def test_fail_a_lower_row_takes_the_error_over(ring):
    r = ring
    r.queue(0, 0, 0, 10, share=True)
    a = r.take(1, divisor=2, pid=11)  # [0, 5)
    b = r.take(2, divisor=2, pid=22)  # [5, 7)
    c = r.take(3, pid=33)  # [7, 10)
    assert r.fail(c, 3, 8) is False
    assert r.fail(b, 2, 5) is False  # lower: now row 5's, still waiting for rows 0..4
    assert (r.slot_info(0)["err_row"], r.slot_info(0)["err_owner"]) == (5, 2)
    assert r.fail(a, 1, 2) is True  # lower still, and its rows below are in its own piece
    res = r.await_result(0, 1.0)
    assert res[:2] == (FAILED, 1) and res[7] == 11
    info = r.slot_info(0)
    assert (info["err_row"], info["err_owner"], info["pid"]) == (2, 1, 11)


def test_a_piece_above_the_error_may_still_finish_after_failed(ring):
    r = ring
    r.queue(0, 0, 0, 4, share=True)
    a = r.take(1, divisor=4)  # [0, 1)
    b = r.take(2, divisor=4)  # [1, 2)
    assert r.fail(a, 1, 0) is True  # nothing below row 0: FAILED at once
    assert st(r, 0) == FAILED
    assert r.take(3) is None
    assert r.retire(0) is False  # worker 2 still writes into the slot: CLOSING
    assert st(r, 0) == CLOSING
    assert r.done(b, 2) is False  # the last loader out frees it
    assert st(r, 0) == FREE
    assert r.retire(0) is True


# -- retire, give back -----------------------------------------------------------------------------
def test_retire_in_each_state(ring):
    r = ring
    s0 = r.stats()
    # QUEUED, not begun: FREE at once, and nobody takes it any more
    r.queue(0, 0, 0, 3)
    assert r.retire(0) is True and st(r, 0) == FREE
    assert r.take(1) is None
    # READY (and READING)
    r.queue(0, 1, 0, 3)
    r.done(r.take(1), 1)
    assert st(r, 0) == READY and r.retire(0) is True and st(r, 0) == FREE
    r.queue(0, 2, 0, 3)
    r.done(r.take(1), 1)
    r.begin_read(0)
    assert r.retire(0) is True and st(r, 0) == FREE
    # FAILED, no piece left TAKEN
    r.queue(0, 3, 0, 3)
    r.fail(r.take(1), 1, 0)
    assert st(r, 0) == FAILED and r.retire(0) is True and st(r, 0) == FREE
    # QUEUED with a TAKEN piece: CLOSING, until its loader finishes
    r.queue(0, 4, 0, 3)
    t = r.take(1)
    assert r.retire(0) is False
    assert st(r, 0) == CLOSING
    assert r.wait(0, 0.0) == r.state(0)  # not QUEUED: nothing to wait for
    assert r.take(2) is None
    assert r.retire(0) is False  # again: still CLOSING
    assert r.done(t, 1) is False  # not published: the loader frees the slot instead
    assert st(r, 0) == FREE
    assert r.retire(0) is True
    s = r.stats()
    assert s["closing"] - s0["closing"] == 3  # every retire of a batch not settled READY
    assert s["released"] - s0["released"] == 5
    assert s["published"] - s0["published"] == 3


def test_retire_a_shared_batch_while_a_piece_fails(ring):
    r = ring
    r.queue(0, 0, 0, 4, share=True)
    a = r.take(1, divisor=2)
    assert r.retire(0) is False
    assert r.fail(a, 1, 0) is False  # CLOSING: never published, but freed
    assert st(r, 0) == FREE


def test_stale_take_after_retire_and_requeue(ring):
    r = ring
    r.queue(0, 0, 0, 2)
    old = r.take(1)
    assert r.retire(0) is False
    assert r.give_back(0, 1, False) == 1  # worker 1 is dead: that frees the CLOSING slot
    assert st(r, 0) == FREE
    r.queue(0, 1, 0, 2)
    new = r.take(2)
    assert new.slot == 0 and new.seq == 1
    assert r.done(old, 1) is None  # a piece of the batch before: not this one's
    assert r.fail(old, 1, 0) is None
    assert r.pieces(0) == [(PIECE_TAKEN, 2, 0, 2, 0, 0)]
    assert st(r, 0) == QUEUED
    assert r.done(new, 2) is True
    assert r.await_result(0, 1.0)[:3] == (READY, 2, 1)


@pytest.mark.parametrize("reopen", [True, False])
def test_give_back_a_batch_taken_whole(ring, reopen):
    r = ring
    r.queue(0, 0, 0, 5)
    dead = r.take(7, pid=70)
    r.set_progress(0, 3, 70)
    r.set_rows(0, 4)
    r.set_result(0, _ring.F_SPILLED, 12)
    assert r.give_back(0, 8, reopen) == 0  # not worker 8's
    assert r.give_back(0, 7, reopen) == 1
    assert r.give_back(0, 7, reopen) == 0  # nothing left of it
    assert r.stats()["given_back"] == 1
    assert r.done(dead, 7) is None  # the dead worker's late done lands nowhere
    info = r.slot_info(0)
    assert info["state"] == QUEUED
    if not reopen:
        assert kinds(r, 0) == [(PIECE_CLOSED, 7, 0, 5)]
        assert r.take(8) is None  # abandoned: nobody loads it
        assert r.retire(0) is True
        return
    # loaded again from scratch: what it recorded is forgotten
    assert (info["rows"], info["flags"], info["var_bytes"]) == (5, 0, 0)
    assert r.pieces(0) == [(PIECE_FREE, 7, 0, 5, 0, 0)]  # its progress is forgotten too
    t = r.take(8, pid=80)
    assert (t.first, t.n) == (0, 5)
    assert r.done(t, 8) is True
    assert r.await_result(0, 1.0)[:8] == (READY, 8, 0, 5, 5, 0, 0, 80)


def test_give_back_pieces_of_a_shared_batch(ring):
    r = ring
    r.queue(0, 0, 0, 10, share=True, owners=[3])
    a = r.take(1, divisor=2)  # row 0 is worker 3's: cut from row 1, half of the 9 left
    b = r.take(2, divisor=2)
    assert (a.first, a.n, b.first, b.n) == (1, 4, 5, 2)
    assert r.done(a, 1) is False
    # worker 3 died before taking its given row; worker 2 died with its piece
    assert r.give_back(0, 3, True) == 1
    assert r.give_back(0, 2, True) == 1
    assert [p[0] for p in r.pieces(0)][:3] == [PIECE_FREE, PIECE_DONE, PIECE_FREE]
    assert r.done(b, 2) is None
    got = []
    while (t := r.take(4, divisor=2)) is not None:
        got.append(t)
    assert sorted((t.first, t.first + t.n) for t in got)[0] == (0, 1)
    assert sum(t.n for t in got) == 10 - a.n
    assert [r.done(t, 4) for t in got][-1] is True
    assert r.await_result(0, 1.0)[:2] == (READY, 4)


def test_give_back_reopens_the_rows_below_an_error(ring):
    r = ring
    r.queue(0, 0, 0, 4, share=True)
    a = r.take(1, divisor=2, pid=11)  # [0, 2)
    b = r.take(2, pid=22)  # [2, 4)
    assert r.fail(b, 2, 3) is False  # waits for rows 0..2
    assert r.give_back(0, 1, False) == 1  # worker 1 died, its rows abandoned
    assert st(r, 0) == QUEUED and r.take(3) is None  # a CLOSED piece is nobody's
    assert r.retire(0) is True  # the parent abandons the batch
    r.queue(0, 1, 0, 4, share=True)
    a = r.take(1, divisor=2, pid=11)
    b = r.take(2, pid=22)
    assert r.fail(b, 2, 3) is False
    assert r.give_back(0, 1, True) == 1  # reopened: for another worker
    assert kinds(r, 0)[0] == (PIECE_FREE, 1, 0, 2)
    c = r.take(3, divisor=2, pid=33)
    assert (c.piece, c.first, c.n) == (0, 0, 2)  # the FREE piece first, whole
    assert r.done(a, 1) is None
    assert r.done(c, 3) is True  # the rows below the error: FAILED, worker 2's
    res = r.await_result(0, 1.0)
    assert res[:3] == (FAILED, 2, 1) and res[7] == 22
    assert r.stats()["given_back"] == 2


def test_give_back_frees_a_closing_slot(ring):
    r = ring
    r.queue(0, 0, 0, 3)
    r.take(5)
    assert r.retire(0) is False
    assert r.give_back(0, 5, True) == 1  # reopened, but nobody takes a CLOSING batch
    assert st(r, 0) == FREE
    assert r.take(6) is None


def test_stop_refuses_takes(ring):
    r = ring
    assert not r.stopped
    r.queue(0, 0, 0, 1)
    r.stop()
    assert r.stopped
    assert r.take(1) is False
    r.queue(1, 0, 0, 1)  # queueing is still allowed; taking is not
    assert r.take(1) is False
    assert st(r, 0) == QUEUED and st(r, 1) == QUEUED


def test_bad_worker_id(ring):
    r = ring
    r.queue(0, 0, 0, 1)
    with pytest.raises(ValueError):
        r.take(_ring.MAX_WORKERS)
    t = r.take(1)
    with pytest.raises(ValueError):
        r.done(t, _ring.MAX_WORKERS)
    with pytest.raises(ValueError):
        r.fail(t, _ring.MAX_WORKERS, 0)
    with pytest.raises(ValueError):
        r.give_back(0, _ring.MAX_WORKERS, True)
    assert r.pieces(0)[0][:2] == (PIECE_TAKEN, 1)
    assert r.done(t, _ring.MAX_WORKERS - 1) is None  # a valid id, not its owner


def test_a_take_made_by_hand_owns_nothing(ring):
    r = ring
    r.queue(0, 0, 0, 1)
    r.take(1)
    assert r.done(Take(), 1) is None  # zeroed: no batch's generation


# -- waits ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("timeout", [0.0, 0.05, 0.2])
def test_timeouts_return_quickly(ring, timeout):
    r = ring
    r.queue(0, 0, 0, 1)
    t = time.monotonic()
    assert r.wait(0, timeout) is None
    assert timeout * 0.9 <= time.monotonic() - t < timeout + 0.25
    t = time.monotonic()
    assert r.await_result(0, timeout) is None
    assert timeout * 0.9 <= time.monotonic() - t < timeout + 0.25


@pytest.mark.parametrize("timeout", [-1.0, -1e300, float("-inf"), float("nan")])
def test_negative_and_nan_timeouts_do_not_wait(ring, timeout):
    r = ring
    r.queue(0, 0, 0, 1)
    t = time.monotonic()
    assert r.wait(0, timeout) is None
    assert r.await_result(0, timeout) is None
    assert time.monotonic() - t < 0.5


def _finish_once_asleep(r, t, wid):
    before = r.stats()["futex_waits"]

    def go():
        wait_until(sleeping_in_wait(r, before), what="the parent to sleep in its wait")
        r.done(t, wid)

    th = threading.Thread(target=go)
    th.start()
    return th


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timeout", [1e10, 9.2e9, 1e300, float("inf")])
@pytest.mark.parametrize("how", ["wait", "await_result"])
def test_huge_timeout_means_wait_long_not_return_at_once(ring, timeout, how):
    """A timeout too large for int64 nanoseconds must saturate (wait), not overflow into an
    immediate time-out."""
    r = ring
    r.queue(0, 0, 0, 1)
    t = r.take(1)
    finisher = _finish_once_asleep(r, t, 1)
    try:
        got = getattr(r, how)(0, timeout)
    finally:
        finisher.join(15)
    assert not finisher.is_alive()
    if how == "wait":
        assert got >= 0, f"wait({timeout}) timed out"
        assert state_bits(got)[0] == READY
    else:
        assert isinstance(got, tuple), f"await_result({timeout}) returned {got!r}"
        assert got[:2] == (READY, 1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["wait", "await_result"])
def test_the_gil_is_released_while_waiting(ring, how):
    """Another Python thread runs while the parent waits: it publishes the batch the wait is
    for (were the GIL held, the wait would time out first)."""
    r = ring
    r.queue(0, 0, 0, 1)
    t = r.take(1)
    finisher = _finish_once_asleep(r, t, 1)
    start = time.monotonic()
    try:
        got = getattr(r, how)(0, 10.0)
    finally:
        finisher.join(15)
    assert time.monotonic() - start < 9
    assert got is not None, "the wait timed out: the other thread never ran"
    assert (state_bits(got)[0] if how == "wait" else got[0]) == READY


def test_wait_returns_at_once_for_settled_or_free_slots(ring):
    r = ring
    t = time.monotonic()
    w = r.wait(0, 5.0)  # FREE is not "in flight"
    assert state_bits(w)[0] == FREE
    r.queue(1, 0, 0, 1)
    r.done(r.take(1), 1)
    assert state_bits(r.wait(1, 5.0))[0] == READY
    assert r.await_result(1, 5.0)[0] == READY
    assert time.monotonic() - t < 0.5


@pytest.mark.parametrize("slot", [4, 5, 2**31, 2**32 - 1])
def test_bad_slot_is_index_error(ring, slot):
    r = ring
    for call in (lambda: r.queue(slot, 0, 0, 1), lambda: r.wait(slot, 0),
                 lambda: r.await_result(slot, 0), lambda: r.retire(slot),
                 lambda: r.give_back(slot, 1, True), lambda: r.begin_read(slot),
                 lambda: r.state(slot), lambda: r.slot_info(slot), lambda: r.slot_count(slot),
                 lambda: r.pieces(slot), lambda: r.progress(slot, 0, 0, 0),
                 lambda: r.set_progress(slot, 0, 0), lambda: r.set_rows(slot, 0),
                 lambda: r.set_result(slot, 0, 0)):
        with pytest.raises(IndexError):
            call()


@pytest.mark.parametrize("slot", [-1, 2**32])
def test_slot_outside_uint32_is_index_error(ring, slot):
    """A bad slot is an IndexError, also when it does not even fit the C type."""
    r = ring
    for call in (lambda: r.queue(slot, 0, 0, 1), lambda: r.wait(slot, 0),
                 lambda: r.await_result(slot, 0), lambda: r.retire(slot),
                 lambda: r.give_back(slot, 1, True), lambda: r.state(slot),
                 lambda: r.slot_info(slot), lambda: r.pieces(slot)):
        with pytest.raises(IndexError):
            call()


def test_state_bits():
    word = (0x1234 << 16) | (0xABC << 4) | READY
    assert state_bits(word) == (READY, 0xABC, 0x1234)


def test_constants():
    states = {FREE, QUEUED, CLOSING, READY, FAILED, READING}
    assert len(states) == 6 and all(0 <= s < 16 for s in states)
    pieces = {PIECE_GIVEN, PIECE_TAKEN, PIECE_DONE, PIECE_FREE, PIECE_CLOSED, PIECE_ERRORED}
    assert len(pieces) == 6 and 0 not in pieces  # 0 is EMPTY: never reported
    assert _ring.MAX_PIECES == 4096 and _ring.MAX_WORKERS == 4095
    for gone in ("CLAIMED", "MAX_SHARED_ROWS", "ROW_TAKEN"):
        assert not hasattr(_ring, gone)
    for gone in ("claim", "publish", "cancel", "release", "reclaim", "take_rows", "max_rows"):
        assert not hasattr(RingIndex, gone)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["wait", "await_result"])
def test_close_from_another_thread_keeps_the_buffer_until_the_waiter_leaves(how):
    """pool.close() in one thread, ring.wait() in another: the buffer stays exported (mapped)
    until the waiter is out of the C loop; then the wait says closed, never touches it."""
    off, total = geometry(4, 256, 4)
    mm = mmap.mmap(-1, total)
    r = RingIndex.create(mm, 4, 256, off, os.getpid(), max_pieces=4)
    worker = RingIndex(mm)  # a worker's view of the same region
    r.queue(0, 1, 0, 1)
    t = worker.take(1)
    got = []
    before = worker.stats()["futex_waits"]
    th = threading.Thread(target=lambda: got.append(getattr(r, how)(0, 20.0)))
    th.start()
    try:
        wait_until(sleeping_in_wait(worker, before), what="the waiter to sleep")
        r.close()
        assert r.closed
        worker.close()
        with pytest.raises(BufferError):
            mm.close()  # the waiter still holds the export: unmapping now would crash it
        late = RingIndex(mm)  # the worker comes back and finishes the batch
        assert late.done(t, 1) is True
    finally:
        th.join(15)
    assert not th.is_alive()
    assert len(got) == 1
    if how == "wait":  # it woke normally, reading a mapped buffer
        assert state_bits(got[0])[:2] == (READY, 1)
        assert r.wait(0, 0.1) is False
    else:
        assert got[0][:3] == (READY, 1, 1)
        assert r.await_result(0, 0.1) is False
    assert r.closed
    late.close()
    mm.close()  # the last waiter left: the export is gone


# -- processes ------------------------------------------------------------------------------------------
ROW_BYTES = 8
XP_BATCHES = 200
XP_ROWS = 24
XP_SLOTS = 4


def row_value(seq, row):
    return (seq * 1_000_003 + row * 7 + 1) & (2**64 - 1)


def _piece_loader(mm, bell_mm, worker_id):
    """A forked worker: attach to the ring, take pieces and write their rows, until stopped;
    sleep on the bell when there is nothing to take (as a pool's worker does)."""
    r = RingIndex(mm)
    bell = _ring.Bell(bell_mm)
    off, size = r.data_offset, r.slot_bytes
    pid = os.getpid()
    loaded = 0
    while True:
        seen = bell.value()
        t = r.take(worker_id, divisor=3, min_units=1, pid=pid)
        if t is False:
            break
        if t is None:
            bell.wait(seen, 0.1)
            continue
        base = off + t.slot * size
        for k in range(t.n):
            row = t.first + k
            struct.pack_into("<Q", mm, base + row * ROW_BYTES, row_value(t.seq, row))
            r.progress(t.slot, t.piece, k + 1, pid)
        if r.done(t, worker_id) is None:
            os._exit(11)
        loaded += t.n
    bell.close()
    r.close()
    os._exit(0 if loaded > 0 else 12)


@pytest.mark.timeout(MP_TIMEOUT)
def test_forked_workers_load_shared_batches_while_the_parent_awaits():
    off, total = geometry(XP_SLOTS, XP_ROWS * ROW_BYTES, 16)
    mm = mmap.mmap(-1, total)  # MAP_SHARED | MAP_ANONYMOUS: shared with forked children
    bell_mm = mmap.mmap(-1, PAGE)
    ring = RingIndex.create(mm, XP_SLOTS, XP_ROWS * ROW_BYTES, off, os.getpid(), max_pieces=16)
    bell = _ring.Bell(bell_mm, create=True)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_piece_loader, args=(mm, bell_mm, w), daemon=True)
             for w in (1, 2)]
    for p in procs:
        p.start()
    pids = {p.pid for p in procs}
    t0 = time.monotonic()
    seen_pids = set()
    try:
        free = list(range(XP_SLOTS))
        inflight: deque = deque()
        next_seq = 0
        for expected in range(XP_BATCHES):
            while free and next_seq < XP_BATCHES:
                s = free.pop()
                mm[off + s * XP_ROWS * ROW_BYTES:off + (s + 1) * XP_ROWS * ROW_BYTES] = bytes(
                    XP_ROWS * ROW_BYTES)
                ring.queue(s, next_seq, 0, XP_ROWS, share=True)
                bell.ring(wake_all=True)
                inflight.append((next_seq, s))
                next_seq += 1
            seq, s = inflight.popleft()
            assert seq == expected
            while True:
                res = ring.await_result(s, 0.1)
                if res is not None:
                    break
                assert all(p.exitcode is None for p in procs), [p.exitcode for p in procs]
                assert time.monotonic() - t0 < MP_TIMEOUT - 10, "the workers stalled"
            state, owner, rseq, rows, count, _, _, pid, _ = res
            assert (state, rseq, rows, count) == (READY, seq, XP_ROWS, XP_ROWS)
            assert owner in (1, 2) and pid in pids
            pieces = ring.pieces(s)
            assert all(k == PIECE_DONE and owner_ in (1, 2) and pid_ in pids and done == n
                       for k, owner_, _, n, done, pid_ in pieces)
            assert sum(p[3] for p in pieces) == XP_ROWS
            seen_pids.update(p[5] for p in pieces)
            got = struct.unpack_from(f"<{XP_ROWS}Q", mm, off + s * XP_ROWS * ROW_BYTES)
            assert got == tuple(row_value(seq, k) for k in range(XP_ROWS)), f"seq {seq}: torn"
            assert ring.retire(s) is True
            free.append(s)
    finally:
        ring.stop()
        bell.stop()
        for p in procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()
                p.join(5)
    assert [p.exitcode for p in procs] == [0, 0]
    stats = ring.stats()
    assert stats["queued"] == stats["published"] == stats["released"] == XP_BATCHES
    assert stats["taken"] >= XP_BATCHES
    assert stats["given_back"] == stats["closing"] == 0
    assert seen_pids and seen_pids <= pids
    bell.close()
    ring.close()
    mm.close()
    bell_mm.close()


def _sleepy_loader(mm, worker_id, took):
    """A forked worker that takes one piece, says so, and never finishes it."""
    r = RingIndex(mm)
    t = r.take(worker_id, pid=os.getpid())
    took.set()
    if t is None or t is False:
        os._exit(12)
    while True:
        time.sleep(1)


@pytest.mark.timeout(MP_TIMEOUT)
def test_a_dead_workers_pieces_are_given_back_to_the_living():
    off, total = geometry(1, 64, 4)
    mm = mmap.mmap(-1, total)
    ring = RingIndex.create(mm, 1, 64, off, os.getpid(), max_pieces=4)
    ring.queue(0, 0, 0, 8, share=True)
    ctx = mp.get_context("fork")
    took = ctx.Event()
    p = ctx.Process(target=_sleepy_loader, args=(mm, 3, took), daemon=True)
    p.start()
    try:
        assert took.wait(MP_TIMEOUT / 2)
        assert ring.pieces(0) == [(PIECE_TAKEN, 3, 0, 8, 0, p.pid)]
        assert ring.await_result(0, 0.05) is None
    finally:
        p.kill()
        p.join(10)
    assert p.exitcode is not None
    assert ring.give_back(0, 3, True) == 1
    t = ring.take(4)
    assert (t.first, t.n) == (0, 8)
    assert ring.done(t, 4) is True
    assert ring.await_result(0, 1.0)[:2] == (READY, 4)
    ring.close()
    mm.close()


# -- multi-process stress ----------------------------------------------------------------------------
STRESS_TASKS = 250_000  # x4 operations (take + done + await + retire) = 1,000,000
STRESS_SLOTS = 16
STRESS_SLOT_BYTES = 128
PRODUCERS = 3
MULT = 0x9E3779B97F4A7C15
MASK = 2**64 - 1


def payload(seq, k):
    return (seq * MULT + k) & MASK


def _producer(mm, bell_mm, worker_id):
    """Take a batch, check it, write a payload derived from seq into the slot, finish it; sleep
    on the bell when there is nothing to take (as a pool's worker does)."""
    r = RingIndex(mm)
    bell = _ring.Bell(bell_mm)
    off, size = r.data_offset, r.slot_bytes
    done = 0
    while True:
        seen = bell.value()
        t = r.take(worker_id)
        if t is False:
            break
        if t is None:
            bell.wait(seen, 0.1)
            continue
        base = off + t.slot * size
        (seq,) = struct.unpack_from("<Q", mm, base)
        if (t.piece, t.first, t.n, t.shared) != (0, 0, 1, False) or t.seq != seq:
            os._exit(10)
        struct.pack_into("<8Q", mm, base + 8, *(payload(seq, k) for k in range(8)))
        struct.pack_into("<Q", mm, base + 72, worker_id)
        if r.done(t, worker_id) is not True:
            os._exit(11)
        done += 1
    bell.close()
    r.close()
    os._exit(0 if done > 0 else 12)


@pytest.mark.timeout(MP_TIMEOUT)
def test_stress_three_producers_one_consumer():
    off, total = geometry(STRESS_SLOTS, STRESS_SLOT_BYTES)
    mm = mmap.mmap(-1, total)  # MAP_SHARED | MAP_ANONYMOUS: shared with forked children
    bell_mm = mmap.mmap(-1, PAGE)
    ring = RingIndex.create(mm, STRESS_SLOTS, STRESS_SLOT_BYTES, off, os.getpid())
    bell = _ring.Bell(bell_mm, create=True)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_producer, args=(mm, bell_mm, w + 1), daemon=True)
             for w in range(PRODUCERS)]
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
            queued = False
            while free and next_seq < STRESS_TASKS:
                s = free.pop()
                struct.pack_into("<Q", mm, off + s * STRESS_SLOT_BYTES, next_seq)
                ring.queue(s, next_seq, 0, 1)
                inflight.append((next_seq, s))
                next_seq += 1
                queued = True
            if queued:
                bell.ring(wake_all=True)
            seq, s = inflight.popleft()
            assert seq == expected
            while True:
                res = ring.await_result(s, 0.1)
                if res is not None:
                    break
                assert all(p.exitcode is None for p in procs), [p.exitcode for p in procs]
                assert time.monotonic() - t0 < MP_TIMEOUT - 5, "stress test stalled"
            state, owner, rseq = res[:3]
            assert state == READY and 1 <= owner <= PRODUCERS and rseq == seq
            base = off + s * STRESS_SLOT_BYTES
            got = struct.unpack_from("<9Q", mm, base + 8)
            assert got[:8] == tuple(payload(seq, k) for k in range(8)), f"seq {seq}: torn payload"
            assert got[8] == owner
            per_worker[owner] += 1
            assert ring.retire(s) is True
            free.append(s)
            ops += 4
    finally:
        ring.stop()
        bell.stop()
        for p in procs:
            p.join(10)
            if p.exitcode is None:
                p.kill()
                p.join(5)
    elapsed = time.monotonic() - t0
    assert [p.exitcode for p in procs] == [0] * PRODUCERS
    assert ops == 1_000_000
    stats = ring.stats()
    assert stats["queued"] == stats["taken"] == stats["published"] == stats["released"] == STRESS_TASKS
    assert stats["given_back"] == stats["closing"] == 0
    assert sum(per_worker) == STRESS_TASKS
    bell.close()
    ring.close()
    mm.close()
    bell_mm.close()
    assert elapsed < MP_TIMEOUT - 5, elapsed


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


@pytest.mark.timeout(30)
def test_bell_wait_returns_at_once_timeout_or_ring():
    m = mmap.mmap(-1, 4096)
    bell = _ring.Bell(m, create=True)
    seen = bell.value()
    assert bell.wait(seen + 1, 10.0) is True  # the counter already moved: no sleep
    t = time.monotonic()
    assert bell.wait(seen, 0.05) is False
    assert time.monotonic() - t >= 0.04
    assert bell.wait(seen, 0.0) is False and bell.wait(seen, float("nan")) is False
    assert bell.wait(seen, -1.0) is False
    waits = bell.stats()["waits"]

    def ring_once_asleep():
        # the bell bumps "waits" just before its sleeper's system call (fl_wait.h)
        wait_until(lambda: bell.stats()["waits"] > waits, what="the bell's sleeper")
        bell.ring()

    th = threading.Thread(target=ring_once_asleep)
    th.start()
    t = time.monotonic()
    try:
        assert bell.wait(seen, 20.0) is True  # the GIL is released while it sleeps
    finally:
        th.join(15)
    assert time.monotonic() - t < 10
    assert bell.stats()["waits"] >= waits + 1
    bell.stop()
    assert bell.wait(bell.value(), 30.0) is None  # stopped: at once
    bell.close()
    m.close()


def test_bell_huge_timeout_saturates():
    m = mmap.mmap(-1, 4096)
    bell = _ring.Bell(m, create=True)
    assert bell.wait(bell.value() + 1, math.inf) is True  # moved: at once, no overflow
    bell.close()
    m.close()
