# cython: language_level=3, freethreading_compatible=True, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True, embedsignature=True
"""RingIndex: the Python face of csrc/fl_ring.c over a shared buffer.

This module only converts types, releases the GIL around waits and turns status codes into
exceptions (fastload._status); all policy lives in the Python layer.

NOTE [free threading]
Both compiled modules declare ``freethreading_compatible``. What a GIL build gave for free is
explicit: every method of a RingIndex, a Bell and a Packer runs in a critical section on its
object (``@cython.critical_section``; a no-op with the GIL), so a close() from another thread
can never come between a method's "closed?" check and its use of the mapping. Waits and copies
release the GIL (on a free-threaded build: leave the critical section) inside; they count
themselves in ``_inside``, changed only within the critical section, and a close() meanwhile
only forbids new calls: the last thread to leave drops the buffer export, so the mapping is
never unmapped under a C loop that reads it. The C ring itself is lock-free (atomics; the C
tests run under TSan). The Python state of these objects is set at construction and read-only
after (the packer's tree and field lists), and the Python layer above gives each worker thread
its own RingIndex and Packer (one attach per client). A free-threaded interpreter cannot be had
on the machines this was written on: the stress test (tests/test_free_threading.py) runs on GIL
builds and would run as is on a free-threaded one.
"""
cimport cython
from libc.stdint cimport uint32_t, uint64_t, int64_t
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE

from fastload._cdefs cimport *
from fastload._status import raise_for_status
import numpy as np

FREE = FL_SLOT_FREE
QUEUED = FL_SLOT_QUEUED
CLOSING = FL_SLOT_CLOSING
READY = FL_SLOT_READY
FAILED = FL_SLOT_FAILED
READING = FL_SLOT_READING
F_SPILLED = FL_SLOT_F_SPILLED
F_ENDED = FL_SLOT_F_ENDED
F_SKIPPED = FL_SLOT_F_SKIPPED
LAYOUT_VERSION = FL_LAYOUT_VERSION
MAX_SLOTS = FL_MAX_SLOTS
MAX_WORKERS = FL_MAX_WORKERS
MAX_PIECES = FL_MAX_PIECES
#: Pieces of a slot's batch (NOTE [pieces] in csrc/fl_ring.c), as RingIndex.pieces reports them.
PIECE_GIVEN = FL_PIECE_GIVEN
PIECE_TAKEN = FL_PIECE_TAKEN
PIECE_DONE = FL_PIECE_DONE
PIECE_FREE = FL_PIECE_FREE
PIECE_CLOSED = FL_PIECE_CLOSED
PIECE_ERRORED = FL_PIECE_ERRORED
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


def control_nbytes(uint32_t nslots, uint32_t max_pieces=1):
    """Bytes the ring's control block needs for ``nslots`` slots whose batches may be cut into
    up to ``max_pieces`` pieces (NOTE [pieces] in csrc/fl_ring.c)."""
    cdef size_t n = fl_ring_nbytes(nslots, max_pieces)
    if n == 0:
        raise ValueError(f"invalid ring size: nslots must be in [1, {FL_MAX_SLOTS}] and "
                         f"max_pieces in [1, {FL_MAX_PIECES}], got {nslots} and {max_pieces}")
    return n


def state_bits(uint32_t word):
    """Split a slot state word into (state, owner, generation)."""
    return FL_STATE_BITS(word), FL_OWNER_BITS(word), FL_GEN_BITS(word)


cdef class _Mapped:
    """A writable buffer, kept exported (so it cannot be unmapped) until :meth:`close`; the base
    of the classes over shared memory below. Every method of a closed one raises ValueError
    (but RingIndex.wait and await_result, which return False).

    A thread inside a wait (GIL released) keeps the export: :meth:`close` from another thread
    then only forbids new calls, and the last thread to leave its wait drops the export, so the
    region is never unmapped under a C loop that reads it."""
    cdef Py_buffer _view
    cdef bint _has_view
    cdef void *_mem
    cdef size_t _nbytes
    cdef str _what
    cdef int _inside  # threads in a wait on this buffer (changed in the critical section)
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

    @cython.critical_section
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


cdef class Take:
    """A piece a worker took (RingIndex.take): rows [first, first + n) of the batch in
    ``slot``, whose state word was ``state``; hand it back to done() or fail()."""
    cdef fl_take t
    @property
    def slot(self): return self.t.slot
    @property
    def state(self): return self.t.state
    @property
    def piece(self): return self.t.piece
    @property
    def first(self): return self.t.first
    @property
    def n(self): return self.t.n
    @property
    def count(self): return self.t.count
    @property
    def shared(self): return bool(self.t.shared)
    @property
    def seq(self): return self.t.seq
    @property
    def epoch(self): return self.t.epoch

    def __repr__(self):
        return (f"Take(slot={self.t.slot}, piece={self.t.piece}, rows=[{self.t.first}, "
                f"{self.t.first + self.t.n}))")


cdef class RingIndex(_Mapped):
    """A ring over a writable buffer (the whole shared region): NOTE [pieces] in
    csrc/fl_ring.c. Safe to call from several threads (NOTE [free threading]: a critical
    section per call; the C calls are lock-free), with one parent thread queueing.

    ``RingIndex(buffer)`` attaches to a formatted region; ``RingIndex.create(...)`` formats it.
    The buffer stays exported (so it cannot be unmapped) until :meth:`close`.
    """
    cdef readonly uint32_t nslots
    cdef readonly uint64_t slot_bytes
    cdef readonly uint64_t data_offset
    cdef readonly uint32_t max_pieces

    def __cinit__(self, buffer, *, bint _format=False, uint32_t nslots=0, uint64_t slot_bytes=0,
                  uint64_t data_offset=0, int64_t creator_pid=0, uint32_t max_pieces=1):
        self._what = "ring"
        if _format:
            _check(fl_ring_init(self._mem, self._nbytes, nslots, slot_bytes, data_offset,
                                creator_pid, max_pieces), "formatting the shared region")
        _check(fl_ring_attach(self._mem, self._nbytes), "attaching to the shared region")
        cdef fl_header *h = <fl_header *>self._mem
        self.nslots = h.nslots
        self.slot_bytes = h.slot_bytes
        self.data_offset = h.data_offset
        self.max_pieces = h.max_pieces

    @classmethod
    def create(cls, buffer, uint32_t nslots, uint64_t slot_bytes, uint64_t data_offset,
               int64_t creator_pid, uint32_t max_pieces=1):
        """Format ``buffer`` as a ring of ``nslots`` slots of ``slot_bytes`` at ``data_offset``
        whose batches may be cut into up to ``max_pieces`` pieces."""
        return cls(buffer, _format=True, nslots=nslots, slot_bytes=slot_bytes,
                   data_offset=data_offset, creator_pid=creator_pid, max_pieces=max_pieces)

    cdef inline int _slot_ok(self, long long slot) except -1:
        if slot < 0 or slot >= self.nslots:
            raise IndexError(f"slot {slot} out of range [0, {self.nslots})")
        return 0

    # -- parent ---------------------------------------------------------------------------
    @cython.critical_section
    def queue(self, long long slot, uint64_t seq, uint64_t epoch, uint32_t count,
              target=None, bint share=False, owners=()):
        """[parent] FREE ``slot`` -> QUEUED: batch ``seq`` of ``count`` rows, for any worker or
        worker ``target`` only; ``share``: workers may cut it into pieces; ``owners[r]``: row r
        is given to that worker up front (None: to none; a shared batch only)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t t = 0xFFFFFFFFu if target is None else <uint32_t>target
        cdef uint32_t n = len(owners)
        cdef uint32_t[::1] own
        cdef const uint32_t *p = NULL
        if n:
            own = np.array([0xFFFFFFFF if o is None else o for o in owners], np.uint32)
            p = &own[0]
        _check(fl_ring_queue(m, slot, seq, epoch, count, t, FL_SHARE_ON if share else FL_SHARE_OFF,
                             p, n), f"queueing slot {slot}")

    @cython.critical_section
    def wait(self, long long slot, double timeout):
        """[parent] Wait (GIL released) up to ``timeout`` s for ``slot`` to leave QUEUED.

        Returns the state word, None on timeout, False if the ring was closed (by another
        thread)."""
        if self._mem == NULL:
            return False
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
            return None
        _check(rc, f"waiting for slot {slot}")
        return state

    @cython.critical_section
    def await_result(self, long long slot, double timeout):
        """[parent] Wait (GIL released) up to ``timeout`` s for ``slot`` to be done, then read
        its result in the same call (the parent's hot path: one call per batch).

        Returns None on timeout, False if the ring was closed (by another thread), else the
        tuple ``(state, owner, seq, rows, count, flags, var_bytes, pid, word)``: ``state`` is
        READY or FAILED (FREE or CLOSING if the parent retired the slot: check it); ``owner`` the worker whose message goes with it (its loader, or the
        worker of its first row that raised); ``rows`` the rows it holds (a plain iterable's
        last batch may hold fewer than ``count``); ``pid`` that worker's process; ``word`` the
        raw state word."""
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

    @cython.critical_section
    def begin_read(self, long long slot):
        cdef void *m = self._m()
        self._slot_ok(slot)
        _check(fl_ring_begin_read(m, slot), f"reading slot {slot}")

    @cython.critical_section
    def retire(self, long long slot):
        """[parent] Done with ``slot`` in whatever state (NOTE [pieces]): True if it is FREE
        now, False while workers still load pieces of it (the last of them frees it)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef int freed = 0
        _check(fl_ring_retire(m, slot, &freed), f"retiring slot {slot}")
        return bool(freed)

    @cython.critical_section
    def give_back(self, long long slot, uint32_t worker_id, bint reopen):
        """[parent] Dead worker ``worker_id``'s pieces of ``slot``: FREE for others to load
        (``reopen``) or CLOSED (the batch is abandoned). Returns how many."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t n = 0
        _check(fl_ring_give_back(m, slot, worker_id, reopen, &n),
               f"giving back worker {worker_id}'s pieces of slot {slot}")
        return n

    @cython.critical_section
    def stop(self):
        """[parent] Set the stop flag: workers take nothing more."""
        _check(fl_ring_stop(self._m()), "stopping the ring")

    @property
    def stopped(self):
        with cython.critical_section(self):
            return self._mem == NULL or fl_ring_stopped(self._mem) != 0

    # -- workers --------------------------------------------------------------------------
    @cython.critical_section
    def take(self, uint32_t worker_id, uint32_t divisor=1, uint32_t min_units=1, uint32_t pid=0):
        """[worker] The next piece for ``worker_id`` (csrc/fl_ring.h: fl_ring_take; never
        waits): a :class:`Take`, None if there is nothing to take, False once stopped."""
        cdef void *m = self._m()
        cdef Take t = Take.__new__(Take)
        cdef int rc
        self._enter()  # a close() from another thread meanwhile waits for us to leave
        with nogil:
            rc = fl_ring_take(m, worker_id, divisor, min_units, pid, &t.t)
        self._leave()
        if rc == FL_OK:
            return t
        if rc == FL_ETIMEOUT:
            return None
        if rc == FL_ESTOPPED:
            return False
        _check(rc, f"worker {worker_id} taking a piece")

    @cython.critical_section
    def done(self, Take t, uint32_t worker_id):
        """[worker] The piece is loaded. True if that published the batch READY; None if the
        piece was no longer this worker's (given back: the parent took it for dead)."""
        cdef void *m = self._m()
        cdef int published = 0
        cdef int rc = fl_ring_done(m, &t.t, worker_id, &published)
        if rc == FL_ESTATE:
            return None
        _check(rc, f"finishing a piece of slot {t.t.slot}")
        return bool(published)

    @cython.critical_section
    def fail(self, Take t, uint32_t worker_id, uint32_t row):
        """[worker] Row ``row`` of the piece raised (send the error first). True if that
        published the batch FAILED; None if the piece was no longer this worker's."""
        cdef void *m = self._m()
        cdef int published = 0
        if row < t.t.first or row - t.t.first >= t.t.n:
            raise ValueError(f"row {row} is not in the piece (rows [{t.t.first}, "
                             f"{t.t.first + t.t.n}))")
        cdef int rc = fl_ring_fail(m, &t.t, worker_id, row, &published)
        if rc == FL_ESTATE:
            return None
        _check(rc, f"failing row {row} of slot {t.t.slot}")
        return bool(published)

    @cython.critical_section
    def progress(self, long long slot, uint32_t piece, uint32_t rows, uint32_t pid):
        """[worker] Rows of the piece loaded so far, and the loader's pid (for messages about
        hangs and crashes)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        _check(fl_ring_progress(m, slot, piece, rows, pid), f"progress of slot {slot}")

    @cython.critical_section
    def set_progress(self, long long slot, uint32_t rows, uint32_t pid):
        """[worker] progress() of a batch taken whole (its one piece)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        fl_ring_progress(m, slot, 0, rows, pid)

    @cython.critical_section
    def set_rows(self, long long slot, uint32_t rows):
        """[worker] The batch has ``rows`` rows (at most its count: the worker's stream ended)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        if rows > fl_ring_slot(m, slot).count:
            raise ValueError(f"slot {slot}'s batch has {fl_ring_slot(m, slot).count} rows, "
                             f"not {rows}")
        _check(fl_ring_set_rows(m, slot, rows), f"setting the rows of slot {slot}")

    @cython.critical_section
    def set_result(self, long long slot, uint32_t flags, uint64_t var_bytes):
        """[worker] Record the result flags and variable-area size before done()."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        fl_ring_set_result(m, slot, flags, var_bytes)

    # -- reading --------------------------------------------------------------------------
    @cython.critical_section
    def state(self, long long slot):
        """The slot's state word (use :func:`state_bits` to split it)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t w = 0
        fl_ring_slot_state(m, slot, &w)
        return w

    @cython.critical_section
    def slot_info(self, long long slot):
        """A snapshot of a slot's header, for error messages and tests."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef fl_slot_info i
        _check(fl_ring_slot_info(m, slot, &i), f"reading slot {slot}")
        return {
            "state": FL_STATE_BITS(i.state), "owner": FL_OWNER_BITS(i.state),
            "gen": FL_GEN_BITS(i.state), "seq": i.seq, "epoch": i.epoch, "count": i.count,
            "pid": i.pid, "flags": i.flags, "var_bytes": i.var_bytes, "rows": i.rows,
            "target": None if i.target == 0xFFFFFFFFu else i.target, "shared": bool(i.share),
            "err_row": None if i.err_row == 0xFFFFFFFFu else i.err_row,
            "err_owner": i.err_owner,
        }

    @cython.critical_section
    def pieces(self, long long slot):
        """The pieces of ``slot``'s batch, in row order: tuples (kind, owner, first, n, done,
        pid) (kind: PIECE_*; rows [first, first + n), ``done`` of them loaded)."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        cdef uint32_t n = 0
        _check(fl_ring_pieces(m, slot, NULL, 0, &n), f"reading the pieces of slot {slot}")
        if n == 0:
            return []
        arr = np.zeros(n * 6, np.uint32)
        cdef uint32_t[::1] flat = arr
        cdef uint32_t got = 0
        _check(fl_ring_pieces(m, slot, <fl_piece_info *>&flat[0], n, &got),
               f"reading the pieces of slot {slot}")
        got = min(got, n)
        return [tuple(int(x) for x in arr[6 * k:6 * k + 6]) for k in range(got)]

    @cython.critical_section
    def slot_count(self, long long slot):
        """Rows in the batch queued into ``slot``."""
        cdef void *m = self._m()
        self._slot_ok(slot)
        return fl_ring_slot(m, slot).count

    @cython.critical_section
    def stats(self):
        """Operation counters from the control block (exact when no one is running)."""
        cdef fl_header *h = <fl_header *>self._m()
        return {
            "queued": h.n_queued, "taken": h.n_taken, "published": h.n_published,
            "released": h.n_released, "given_back": h.n_given_back, "closing": h.n_closing,
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

    @cython.critical_section
    def value(self):
        """The counter; read it before looking for work."""
        return fl_bell_value(self._m())

    @cython.critical_section
    def ring(self, bint wake_all=False):
        """Bump the counter and wake one sleeping worker (all with ``wake_all``)."""
        _check(fl_bell_ring(self._m(), wake_all), "ringing the pool's bell")

    @cython.critical_section
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

    @cython.critical_section
    def stop(self):
        """Set the stop flag and wake every sleeper."""
        _check(fl_bell_stop(self._m()), "stopping the pool's bell")

    @cython.critical_section
    def stats(self):
        cdef uint64_t rings = 0, wakes = 0, waits = 0
        _check(fl_bell_stats(self._m(), &rings, &wakes, &waits), "reading the bell's counters")
        return {"rings": rings, "wakes": wakes, "waits": waits}
