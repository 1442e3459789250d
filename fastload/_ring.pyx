# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True, embedsignature=True
"""RingIndex: the Python face of csrc/fl_ring.c over a shared buffer.

This module only converts types, releases the GIL around waits and turns status codes into
exceptions (fastload._status); all policy lives in the Python layer.
"""
from libc.stdint cimport uint32_t, uint64_t, int64_t
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE

from fastload._cdefs cimport *
from fastload._status import raise_for_status
import numpy as np

FREE = FL_SLOT_FREE
QUEUED = FL_SLOT_QUEUED
CLAIMED = FL_SLOT_CLAIMED
READY = FL_SLOT_READY
FAILED = FL_SLOT_FAILED
READING = FL_SLOT_READING
F_SPILLED = FL_SLOT_F_SPILLED
F_ENDED = FL_SLOT_F_ENDED
F_SKIPPED = FL_SLOT_F_SKIPPED
LAYOUT_VERSION = FL_LAYOUT_VERSION
MAX_SLOTS = FL_MAX_SLOTS
MAX_WORKERS = FL_MAX_WORKERS
MAX_SHARED_ROWS = FL_MAX_SHARED_ROWS
ROW_DONE = 0xFFFFFFFF  # FL_ROW_* (fl_layout.h): a shared batch's row words
ROW_ERRORED = 0xFFFFFFFE
ROW_CLOSED = 0xFFFFFFFD
#: Whether this build waits with futex(2) (else the portable backoff, FASTLOAD_PORTABLE=1).
HAVE_FUTEX = bool(FL_HAVE_FUTEX)

cdef extern from *:
    """
    #define FL_STR_(x) #x
    #define FL_STR(x) FL_STR_(x)
    #ifndef FL_BUILD_FLAGS
    #define FL_BUILD_FLAGS "unknown"
    #endif
    #if defined(__clang__)
    #define FL_COMPILER_VERSION __VERSION__
    #elif defined(__GNUC__)
    #define FL_COMPILER_VERSION "gcc " __VERSION__
    #elif defined(_MSC_VER)
    #define FL_COMPILER_VERSION "MSVC " FL_STR(_MSC_FULL_VER)
    #else
    #define FL_COMPILER_VERSION "unknown"
    #endif
    static const unsigned long fl_cython_hex_version = CYTHON_HEX_VERSION;
    """
    const char *FL_BUILD_FLAGS
    const char *FL_COMPILER_VERSION
    const unsigned long fl_cython_hex_version

#: How this core was built (setup.py's options and compiler flags), for `python -m fastload info`.
BUILD_FLAGS = FL_BUILD_FLAGS.decode("utf-8", "replace")
#: The C compiler's own version string (``__VERSION__``), and the Cython that generated the C.
COMPILER_VERSION = FL_COMPILER_VERSION.decode("utf-8", "replace")
CYTHON_VERSION = "%d.%d.%d" % ((fl_cython_hex_version >> 24) & 0xFF,
                               (fl_cython_hex_version >> 16) & 0xFF,
                               (fl_cython_hex_version >> 8) & 0xFF)

STATUS_CODES = {
    "OK": FL_OK, "ETIMEOUT": FL_ETIMEOUT, "ESTOPPED": FL_ESTOPPED, "ELAYOUT": FL_ELAYOUT,
    "EINVAL": FL_EINVAL, "ESTATE": FL_ESTATE, "ERANGE": FL_ERANGE, "ENOSPACE": FL_ENOSPACE,
}


def strerror(int rc):
    """The C core's message for a status code."""
    return fl_strerror(rc).decode()


cdef inline int64_t _to_ns(double timeout) noexcept:
    """Seconds to nanoseconds, saturating: NaN and negatives are 0, huge values and inf wait
    about 292 years instead of overflowing."""
    if not (timeout > 0):
        return 0
    if timeout >= 9.2e9:
        return 9200000000000000000
    return <int64_t>(timeout * 1e9)


cdef inline int _check(int rc, str context) except -1:
    if rc != FL_OK:
        raise_for_status(rc, fl_strerror(rc).decode(), context)
    return 0


def control_nbytes_rows(uint32_t nslots, uint32_t max_rows):
    """Bytes of the control block of ``nslots`` slots with row tables of ``max_rows`` rows
    (shared batches, NOTE [shared rows] in csrc/fl_ring.c)."""
    cdef size_t n = fl_ring_nbytes_rows(nslots, max_rows)
    if n == 0:
        raise ValueError(f"invalid ring size: {nslots} slots of {max_rows} shared rows "
                         f"(at most {FL_MAX_SHARED_ROWS} rows)")
    return n


def control_nbytes(uint32_t nslots):
    """Bytes the ring's control block needs for ``nslots`` slots."""
    cdef size_t n = fl_ring_nbytes(nslots)
    if n == 0:
        raise ValueError(f"nslots must be in [1, {FL_MAX_SLOTS}], got {nslots}")
    return n


def state_bits(uint32_t word):
    """Split a slot state word into (state, owner, generation)."""
    return FL_STATE_BITS(word), FL_OWNER_BITS(word), FL_GEN_BITS(word)


cdef class _Mapped:
    """A writable buffer, kept exported (so it cannot be unmapped) until :meth:`close`; the base
    of the classes over shared memory below. Every method of a closed one raises ValueError
    (but RingIndex.wait, which returns -2).

    A thread inside a wait (GIL released) keeps the export: :meth:`close` from another thread
    then only forbids new calls, and the last thread to leave its wait drops the export, so the
    region is never unmapped under a C loop that reads it."""
    cdef Py_buffer _view
    cdef bint _has_view
    cdef void *_mem
    cdef size_t _nbytes
    cdef str _what
    cdef int _inside  # threads in a wait on this buffer (changed with the GIL held)
    cdef bint _close_pending

    def __cinit__(self, buffer, *args, **kwargs):
        PyObject_GetBuffer(buffer, &self._view, PyBUF_WRITABLE | PyBUF_SIMPLE)
        self._has_view = True
        self._mem = self._view.buf
        self._nbytes = <size_t>self._view.len
        self._what = type(self).__name__

    def __dealloc__(self):
        if self._has_view:
            PyBuffer_Release(&self._view)
            self._has_view = False

    def close(self):
        """Drop the buffer export (idempotent; deferred while a thread waits inside). Every
        other method then raises ValueError."""
        self._mem = NULL
        if self._inside:
            self._close_pending = True
        else:
            self._release()

    cdef void _release(self) noexcept:
        if self._has_view:
            PyBuffer_Release(&self._view)
            self._has_view = False
        self._close_pending = False

    cdef inline void _enter(self) noexcept:
        self._inside += 1

    cdef inline void _leave(self) noexcept:
        self._inside -= 1
        if self._close_pending and self._inside == 0:
            self._release()

    @property
    def closed(self):
        return self._mem == NULL

    cdef inline void *_m(self) except NULL:
        if self._mem == NULL:
            raise ValueError(f"the {self._what} is closed")
        return self._mem


cdef class RingIndex(_Mapped):
    """A ring over a writable buffer (the whole shared region).

    ``RingIndex(buffer)`` attaches to a formatted region; ``RingIndex.create(...)`` formats it.
    The buffer stays exported (so it cannot be unmapped) until :meth:`close`.
    """
    cdef readonly uint32_t nslots
    cdef readonly uint64_t slot_bytes
    cdef readonly uint64_t data_offset
    cdef readonly uint32_t max_rows

    def __cinit__(self, buffer, *, bint _format=False, uint32_t nslots=0, uint64_t slot_bytes=0,
                  uint64_t data_offset=0, int64_t creator_pid=0, uint32_t max_rows=0):
        self._what = "ring"
        if _format:
            _check(fl_ring_init_rows(self._mem, self._nbytes, nslots, slot_bytes, data_offset,
                                     creator_pid, max_rows), "formatting the shared region")
        _check(fl_ring_attach(self._mem, self._nbytes), "attaching to the shared region")
        cdef fl_header *h = <fl_header *>self._mem
        self.nslots = h.nslots
        self.slot_bytes = h.slot_bytes
        self.data_offset = h.data_offset
        self.max_rows = h.max_rows

    @classmethod
    def create(cls, buffer, uint32_t nslots, uint64_t slot_bytes, uint64_t data_offset,
               int64_t creator_pid, uint32_t max_rows=0):
        """Format ``buffer`` as a ring of ``nslots`` slots of ``slot_bytes`` at ``data_offset``
        (with row tables for shared batches of up to ``max_rows`` rows)."""
        return cls(buffer, _format=True, nslots=nslots, slot_bytes=slot_bytes,
                   data_offset=data_offset, creator_pid=creator_pid, max_rows=max_rows)


    cdef inline int _slot_ok(self, long long slot) except -1:
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"slot {slot} out of range [0, {self.nslots})")
        return 0

    def queue(self, long long slot, uint64_t seq, uint64_t epoch, uint32_t count,
              target=None):
        """[parent] FREE -> QUEUED: hand ``slot`` to the workers as batch ``seq``; with a
        ``target`` worker id, to that worker only."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t t = 0xFFFFFFFFu
        if target is not None:
            if not 0 <= target < FL_MAX_WORKERS:
                raise ValueError(f"target worker must be in [0, {FL_MAX_WORKERS}), got {target}")
            t = target
        _check(fl_ring_queue_to(m, slot, seq, epoch, count, t), f"queueing slot {slot}")

    # -- shared batches (NOTE [shared rows] in csrc/fl_ring.c) --------------------------------
    def queue_shared(self, long long slot, uint64_t seq, uint64_t epoch, uint32_t count,
                     owners=()):
        """[parent] FREE -> QUEUED as a batch whose rows any worker takes; row ``r`` of
        ``owners`` given to worker ``owners[r]`` up front (None: to none)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t n = len(owners)
        if n > count:
            raise ValueError(f"{n} row owners for a batch of {count} rows")
        cdef uint32_t[::1] own = np.array(
            [0xFFFFFFFF if w is None else w for w in owners] or [0], np.uint32)
        _check(fl_ring_queue_shared_to(m, slot, seq, epoch, count, &own[0], n),
               f"queueing shared slot {slot}")

    def find_rows(self, worker_id=None):
        """[worker] ``(slot, state)`` of the oldest shared batch with a row to take (or a row
        given to ``worker_id``), or ``(-1, 0)``."""
        cdef void *m = self._m()
        cdef uint32_t slot = 0, state = 0
        cdef uint32_t w = 0xFFFFFFFFu if worker_id is None else <uint32_t>worker_id
        if fl_ring_find_rows_for(m, w, &slot, &state) != FL_OK:
            return -1, 0
        return slot, state

    def take_rows(self, long long slot, uint32_t state, uint32_t worker_id, long long row,
                  uint32_t divisor):
        """[worker] ``(first, n)``: rows taken, ``row`` exactly (``row >= 0``), a guided
        piece (``-1``) or a row given to this worker up front (``-2``); ``n == 0``: none.
        ``None`` if the batch is no longer that one."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t first = 0, n = 0
        cdef uint32_t r = 0xFFFFFFFEu if row == -2 else (0xFFFFFFFFu if row < 0 else <uint32_t>row)
        cdef int rc = fl_ring_take_rows(m, slot, state, worker_id, r, divisor, &first, &n)
        if rc == FL_ESTATE:
            return None
        _check(rc, f"taking rows of slot {slot}")
        return first, n

    def rows_done(self, long long slot, uint32_t state, uint32_t worker_id, uint32_t first,
                  uint32_t n):
        """[worker] Rows loaded; True if that finished (and published) the batch."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef int published = 0
        _check(fl_ring_rows_done(m, slot, state, worker_id, first, n, &published),
               f"finishing rows of slot {slot}")
        return bool(published)

    def rows_fail(self, long long slot, uint32_t state, uint32_t worker_id, uint32_t row,
                  uint32_t end):
        """[worker] Row ``row`` raised (rows up to ``end`` given up); True: fail the batch."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef int won = 0
        _check(fl_ring_rows_fail(m, slot, state, worker_id, row, end, &won),
               f"failing a row of slot {slot}")
        return bool(won)

    def rows_settle(self, long long slot, double timeout):
        """[worker] Wait (GIL released) until no row of the batch is being loaded: 0 when
        none is, else how many are (timed out); -2 once stopped."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t busy = 0
        cdef int64_t ns = _to_ns(timeout)
        cdef int rc
        self._enter()
        with nogil:
            rc = fl_ring_rows_settle(m, slot, ns, &busy)
        self._leave()
        if rc == FL_ESTOPPED:
            return -2
        if rc != FL_ETIMEOUT:
            _check(rc, f"settling slot {slot}")
        return busy

    def fail_shared(self, long long slot, uint32_t state, uint32_t worker_id):
        """[worker] Publish a shared batch FAILED (the worker that won rows_fail)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef int rc = fl_ring_fail_shared(m, slot, state, worker_id)
        if rc == FL_ESTATE:
            return False
        _check(rc, f"failing slot {slot}")
        return True

    def row_state(self, long long slot, uint32_t row):
        """A shared batch's row word: 0 FREE, k + 1 taken by worker k, or ROW_DONE,
        ROW_ERRORED, ROW_CLOSED."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t w = 0
        _check(fl_ring_row_state(m, slot, row, &w), f"reading row {row} of slot {slot}")
        return w

    def rows_of(self, uint32_t worker_id):
        """[parent] The ``(slot, row)`` pairs dead worker ``worker_id`` had taken."""
        cdef void *m = self._m()
        cdef uint32_t n = 0
        _check(fl_ring_rows_of(m, worker_id, NULL, NULL, 0, &n), "listing a worker's rows")
        if n == 0:
            return []
        cdef uint32_t[::1] slots = np.empty(n, np.uint32)
        cdef uint32_t[::1] rows = np.empty(n, np.uint32)
        cdef uint32_t got = 0
        _check(fl_ring_rows_of(m, worker_id, &slots[0], &rows[0], n, &got),
               "listing a worker's rows")
        return [(int(slots[k]), int(rows[k])) for k in range(min(n, got))]

    def reset_rows(self, uint32_t worker_id, bint reopen):
        """[parent] Give back dead worker ``worker_id``'s rows (FREE if ``reopen``, else
        CLOSED); returns how many."""
        cdef void *m = self._m()
        cdef uint32_t n = 0
        _check(fl_ring_reset_rows(m, worker_id, reopen, &n), "giving back a worker's rows")
        return n

    def reset_slot_rows(self, long long slot, uint32_t worker_id, bint reopen):
        """[parent] reset_rows for shared batch ``slot`` only."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t n = 0
        _check(fl_ring_reset_slot_rows(m, slot, worker_id, reopen, &n),
               f"giving back worker {worker_id}'s rows of slot {slot}")
        return n

    def claim(self, uint32_t worker_id, double timeout):
        """[worker] Claim the oldest queued slot, waiting up to ``timeout`` seconds (GIL released).

        Returns ``(slot, state_word)``, or ``(-1, 0)`` on timeout, ``(-2, 0)`` once stopped.
        """
        cdef void *m = self._m()
        cdef uint32_t slot = 0, state = 0
        cdef int64_t ns = _to_ns(timeout)
        cdef int rc
        self._enter()
        with nogil:
            rc = fl_ring_claim(m, worker_id, ns, &slot, &state)
        self._leave()
        if rc == FL_OK:
            return slot, state
        if rc == FL_ETIMEOUT:
            return -1, 0
        if rc == FL_ESTOPPED:
            return -2, 0
        _check(rc, f"worker {worker_id} claiming a slot")

    def publish(self, long long slot, uint32_t claimed_state, bint ok):
        """[worker] CLAIMED -> READY/FAILED. False if the slot was reclaimed meanwhile."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef int rc = fl_ring_publish(m, slot, claimed_state, ok)
        if rc == FL_ESTATE:
            return False
        _check(rc, f"publishing slot {slot}")
        return True

    def wait(self, long long slot, double timeout):
        """[parent] Wait (GIL released) up to ``timeout`` s for ``slot`` to be done.

        Returns the state word, -1 on timeout, -2 if the ring was closed (by another thread)."""
        if self._mem == NULL:
            return -2
        cdef void *m = self._mem
        self._slot_ok(slot)
        cdef uint32_t state = 0
        cdef int64_t ns = _to_ns(timeout)
        cdef int rc
        self._enter()
        with nogil:
            rc = fl_ring_wait(m, slot, ns, &state)
        self._leave()
        if rc == FL_ETIMEOUT:
            return -1
        _check(rc, f"waiting for slot {slot}")
        return state

    def await_result(self, long long slot, double timeout):
        """[parent] Wait (GIL released) up to ``timeout`` s for ``slot`` to be done, then read
        its result in the same call (the parent's hot path: one call per batch).

        Returns None on timeout, False if the ring was closed (by another thread), else the
        tuple ``(state, owner, seq, rows, count, flags, var_bytes, pid, word)``: ``state`` is
        READY or FAILED, or FREE when a reclaim abandoned the batch; ``owner`` the worker that
        published it (named in errors); ``rows`` the rows it holds (a plain iterable's last
        batch may hold fewer than ``count``); ``word`` the raw state word (for messages filed
        by it)."""
        if self._mem == NULL:
            return False
        cdef void *m = self._mem
        self._slot_ok(slot)
        cdef uint32_t state = 0
        cdef int64_t ns = _to_ns(timeout)
        cdef int rc
        cdef fl_slot_info i
        self._enter()
        with nogil:
            rc = fl_ring_wait(m, slot, ns, &state)
            if rc == FL_OK:
                rc = fl_ring_slot_info(m, slot, &i)
        self._leave()
        if rc == FL_ETIMEOUT:
            return None
        _check(rc, f"waiting for slot {slot}")
        return (FL_STATE_BITS(state), FL_OWNER_BITS(state), i.seq, i.rows, i.count, i.flags,
                i.var_bytes, i.pid, state)

    def begin_read(self, long long slot):
        cdef void *m = self._m()
        self._slot_ok(slot)
        _check(fl_ring_begin_read(m, slot), f"reading slot {slot}")

    def release(self, long long slot):
        """[parent] READING/READY/FAILED -> FREE. False if the slot was not in those states."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef int rc = fl_ring_release(m, slot)
        if rc == FL_ESTATE:
            return False
        _check(rc, f"releasing slot {slot}")
        return True

    def cancel(self, long long slot):
        """[parent] QUEUED -> FREE if unclaimed. True if it was cancelled."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef int cancelled = 0
        _check(fl_ring_cancel(m, slot, &cancelled), f"cancelling slot {slot}")
        return bool(cancelled)

    def reclaim(self, uint32_t worker_id):
        """[parent] Re-queue the slots claimed by dead worker ``worker_id``; returns the count."""
        cdef void *m = self._m()
        cdef uint32_t n = 0
        _check(fl_ring_reclaim(m, worker_id, &n), f"reclaiming worker {worker_id}'s slots")
        return n

    def reclaim_slot(self, long long slot, uint32_t worker_id, bint requeue):
        """[parent] Move ``slot``, if CLAIMED by dead worker ``worker_id``, to QUEUED (requeue)
        or FREE (abandon). True if it was moved."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef int done = 0
        _check(fl_ring_reclaim_slot(m, slot, worker_id, requeue, &done),
               f"reclaiming slot {slot} of worker {worker_id}")
        return bool(done)

    def stop(self):
        """[parent] Set the stop flag and wake every sleeping worker."""
        _check(fl_ring_stop(self._m()), "stopping the ring")

    @property
    def stopped(self):
        return self._mem == NULL or fl_ring_stopped(self._mem) != 0

    def state(self, long long slot):
        """The slot's state word (use :func:`state_bits` to split it)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t w = 0
        fl_ring_slot_state(m, slot, &w)
        return w

    def slot_info(self, long long slot):
        """A snapshot of a slot's header, for error messages and tests."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef fl_slot_info i
        _check(fl_ring_slot_info(m, slot, &i), f"reading slot {slot}")
        return {
            "state": FL_STATE_BITS(i.state), "owner": FL_OWNER_BITS(i.state),
            "gen": FL_GEN_BITS(i.state), "seq": i.seq, "epoch": i.epoch, "count": i.count,
            "progress": i.progress, "pid": i.pid, "flags": i.flags, "var_bytes": i.var_bytes,
            "rows": i.rows, "target": None if i.target == 0xFFFFFFFFu else i.target,
        }

    def slot_count(self, long long slot):
        """Rows in the batch queued into ``slot``."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        return fl_ring_slot(m, slot).count

    def set_progress(self, long long slot, uint64_t rows, uint32_t pid):
        """[worker] Record how many rows are done (for error messages about hangs and crashes)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        fl_ring_set_progress(m, slot, rows, pid)

    def set_rows(self, long long slot, uint32_t rows):
        """[worker] The batch has ``rows`` rows (at most its count: the worker's stream ended)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        _check(fl_ring_set_rows(m, slot, rows), f"setting the rows of slot {slot}")

    def set_result(self, long long slot, uint32_t flags, uint64_t var_bytes):
        """[worker] Record the result flags and variable-area size before publishing."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        fl_ring_set_result(m, slot, flags, var_bytes)

    def stats(self):
        """Operation counters from the control block (exact when no one is running)."""
        cdef fl_header *h = <fl_header *>self._m()
        return {
            "queued": h.n_queued, "claimed": h.n_claimed, "published": h.n_published,
            "released": h.n_released, "reclaimed": h.n_reclaimed, "cancelled": h.n_cancelled,
            "futex_waits": h.n_futex_waits, "futex_wakes": h.n_futex_wakes,
        }


BELL_NBYTES = fl_bell_nbytes()


cdef class Bell(_Mapped):
    """The doorbell of a fastload.Pool (csrc/fl_bell.h) over a writable buffer.

    Workers read :meth:`value`, look for work in every ring, and :meth:`wait` if they found
    none; loaders :meth:`ring` after queueing. ``Bell(buffer, create=True)`` formats it.
    """

    def __cinit__(self, buffer, *, bint create=False):
        self._what = "bell"
        if create:
            _check(fl_bell_init(self._mem, self._nbytes), "formatting the pool's bell")
        _check(fl_bell_attach(self._mem, self._nbytes), "attaching to the pool's bell")

    def value(self):
        """The counter; read it before looking for work."""
        return fl_bell_value(self._m())

    def ring(self, bint wake_all=False):
        """Bump the counter and wake one sleeping worker (all with ``wake_all``)."""
        _check(fl_bell_ring(self._m(), wake_all), "ringing the pool's bell")

    def wait(self, uint32_t seen, double timeout):
        """Sleep (GIL released) while the counter is ``seen``, at most ``timeout`` seconds.

        True: rung (or a spurious wake-up); False: timed out; None: the pool is stopping.
        """
        cdef void *m = self._m()
        cdef int64_t ns = _to_ns(timeout)
        cdef int rc
        self._enter()
        with nogil:
            rc = fl_bell_wait(m, seen, ns)
        self._leave()
        if rc == FL_OK:
            return True
        if rc == FL_ETIMEOUT:
            return False
        if rc == FL_ESTOPPED:
            return None
        _check(rc, "waiting on the pool's bell")

    def stop(self):
        """Set the stop flag and wake every sleeper."""
        _check(fl_bell_stop(self._m()), "stopping the pool's bell")

    def stats(self):
        cdef uint64_t rings = 0, wakes = 0, waits = 0
        _check(fl_bell_stats(self._m(), &rings, &wakes, &waits), "reading the bell's counters")
        return {"rings": rings, "wakes": wakes, "waits": waits}
