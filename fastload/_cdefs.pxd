# The declarations of the C core (csrc/fl_*.h) that the Cython modules use, and nothing else.
from libc.stdint cimport uint32_t, uint64_t, int64_t

cdef extern from "fl_config.h" nogil:
    enum:
        FL_HAVE_FUTEX

cdef extern from "fl_status.h" nogil:
    enum:
        FL_OK
        FL_ETIMEOUT
        FL_ESTOPPED
        FL_ELAYOUT
        FL_EINVAL
        FL_ESTATE
        FL_ERANGE
        FL_ENOSPACE
    const char *fl_strerror(int rc)

cdef extern from "fl_layout.h" nogil:
    enum:
        FL_LAYOUT_VERSION
        FL_MAX_SLOTS
        FL_MAX_WORKERS
        FL_MAX_PIECES
        FL_MAX_UNITS
        FL_SLOT_FREE
        FL_SLOT_QUEUED
        FL_SLOT_CLOSING
        FL_SLOT_READY
        FL_SLOT_FAILED
        FL_SLOT_READING
        FL_SLOT_F_SPILLED
        FL_SLOT_F_ENDED
        FL_SLOT_F_SKIPPED
        FL_SHARE_OFF
        FL_SHARE_ON
        FL_PIECE_EMPTY
        FL_PIECE_GIVEN
        FL_PIECE_TAKEN
        FL_PIECE_DONE
        FL_PIECE_FREE
        FL_PIECE_CLOSED
        FL_PIECE_ERRORED
    ctypedef struct fl_header:
        uint32_t nslots
        uint64_t slot_bytes
        uint64_t data_offset
        uint64_t total_bytes
        int64_t creator_pid
        uint32_t max_pieces
        uint64_t n_queued
        uint64_t n_taken
        uint64_t n_published
        uint64_t n_released
        uint64_t n_given_back
        uint64_t n_closing
        uint64_t n_futex_waits
        uint64_t n_futex_wakes
    ctypedef struct fl_slot_hdr:
        uint32_t state
        uint32_t count
    uint32_t FL_STATE_BITS(uint32_t w)
    uint32_t FL_OWNER_BITS(uint32_t w)
    uint32_t FL_GEN_BITS(uint32_t w)

cdef extern from "fl_ring.h" nogil:
    ctypedef struct fl_take:
        uint32_t slot, state, piece, first, n, count, shared
        uint64_t seq, epoch
    ctypedef struct fl_slot_info:
        uint32_t state, count, flags, target, rows, share, err_row, err_owner, pid
        uint64_t seq, epoch, var_bytes
    ctypedef struct fl_piece_info:
        uint32_t kind, owner, first, n, done, pid
    size_t fl_ring_nbytes(uint32_t nslots, uint32_t max_pieces)
    int fl_ring_init(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                     uint64_t data_offset, int64_t creator_pid, uint32_t max_pieces)
    int fl_ring_attach(void *mem, size_t total_bytes)
    uint32_t fl_ring_unit(uint32_t count)
    int fl_ring_queue(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count,
                      uint32_t target, uint32_t share, const uint32_t *owners, uint32_t nowners)
    int fl_ring_wait(void *mem, uint32_t slot, int64_t timeout_ns, uint32_t *state_out)
    int fl_ring_begin_read(void *mem, uint32_t slot)
    int fl_ring_retire(void *mem, uint32_t slot, int *freed_out)
    int fl_ring_give_back(void *mem, uint32_t slot, uint32_t worker_id, int reopen,
                          uint32_t *n_out)
    int fl_ring_stop(void *mem)
    int fl_ring_stopped(const void *mem)
    int fl_ring_slot_state(const void *mem, uint32_t slot, uint32_t *state_out)
    int fl_ring_take(void *mem, uint32_t worker_id, uint32_t divisor, uint32_t min_units,
                     uint32_t pid, fl_take *out)
    int fl_ring_progress(void *mem, uint32_t slot, uint32_t piece, uint32_t rows, uint32_t pid)
    int fl_ring_done(void *mem, const fl_take *t, uint32_t worker_id, int *published_out)
    int fl_ring_fail(void *mem, const fl_take *t, uint32_t worker_id, uint32_t row,
                     int *published_out)
    int fl_ring_set_rows(void *mem, uint32_t slot, uint32_t rows)
    int fl_ring_set_result(void *mem, uint32_t slot, uint32_t flags, uint64_t var_bytes)
    int fl_ring_slot_info(const void *mem, uint32_t slot, fl_slot_info *out)
    int fl_ring_pieces(const void *mem, uint32_t slot, fl_piece_info *out, uint32_t cap,
                       uint32_t *n_out)
    fl_slot_hdr *fl_ring_slot(void *mem, uint32_t slot)

cdef extern from "fl_pack.h" nogil:
    int fl_pack_copy(void *dst, size_t dst_len, size_t offset, const void *src, size_t nbytes)
    int fl_pack_gather(void *dst, size_t dst_len, size_t offset, const void *src,
                       size_t src_rows, size_t row_bytes, const int64_t *indices, size_t n,
                       size_t *bad_k)

cdef extern from "fl_bell.h" nogil:
    size_t fl_bell_nbytes()
    int fl_bell_init(void *mem, size_t nbytes)
    int fl_bell_attach(void *mem, size_t nbytes)
    uint32_t fl_bell_value(const void *mem)
    int fl_bell_ring(void *mem, int wake_all)
    int fl_bell_wait(void *mem, uint32_t seen, int64_t timeout_ns)
    int fl_bell_stop(void *mem)
    int fl_bell_stats(const void *mem, uint64_t *rings, uint64_t *wakes, uint64_t *waits)
