# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True, embedsignature=True
"""RingIndex: the Python face of csrc/fl_ring.c over a shared buffer.

This module only converts types, releases the GIL around waits and turns status codes into
exceptions (fastload._status); all policy lives in the Python layer.
"""
from libc.stdint cimport uint32_t, uint64_t, int64_t
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE

from fastload._cdefs cimport *
from fastload._status import raise_for_status

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

    def __cinit__(self, buffer, *, bint _format=False, uint32_t nslots=0, uint64_t slot_bytes=0,
                  uint64_t data_offset=0, int64_t creator_pid=0):
        self._what = "ring"
        if _format:
            _check(fl_ring_init(self._mem, self._nbytes, nslots, slot_bytes, data_offset,
                                creator_pid), "formatting the shared region")
        _check(fl_ring_attach(self._mem, self._nbytes), "attaching to the shared region")
        cdef fl_header *h = <fl_header *>self._mem
        self.nslots = h.nslots
        self.slot_bytes = h.slot_bytes
        self.data_offset = h.data_offset

    @classmethod
    def create(cls, buffer, uint32_t nslots, uint64_t slot_bytes, uint64_t data_offset,
               int64_t creator_pid):
        """Format ``buffer`` as a ring of ``nslots`` slots of ``slot_bytes`` at ``data_offset``."""
        return cls(buffer, _format=True, nslots=nslots, slot_bytes=slot_bytes,
                   data_offset=data_offset, creator_pid=creator_pid)


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
