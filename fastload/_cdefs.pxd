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
        FL_MAX_SHARED_ROWS
        FL_SLOT_FREE
        FL_SLOT_QUEUED
        FL_SLOT_CLAIMED
        FL_SLOT_READY
        FL_SLOT_FAILED
        FL_SLOT_READING
        FL_SLOT_F_SPILLED
        FL_SLOT_F_ENDED
        FL_SLOT_F_SKIPPED
    ctypedef struct fl_header:
        uint32_t nslots
        uint64_t slot_bytes
        uint64_t data_offset
        uint64_t total_bytes
        int64_t creator_pid
        uint32_t max_rows
        uint64_t n_queued
        uint64_t n_claimed
        uint64_t n_published
        uint64_t n_released
        uint64_t n_reclaimed
        uint64_t n_cancelled
        uint64_t n_futex_waits
        uint64_t n_futex_wakes
    ctypedef struct fl_slot_hdr:
        uint32_t state
        uint32_t count
        uint64_t seq
        uint64_t epoch
        uint64_t progress
        uint32_t pid
        uint32_t flags
        uint64_t var_bytes
    uint32_t FL_STATE_BITS(uint32_t w)
    uint32_t FL_OWNER_BITS(uint32_t w)
    uint32_t FL_GEN_BITS(uint32_t w)

cdef extern from "fl_ring.h" nogil:
    size_t fl_ring_nbytes(uint32_t nslots)
    int fl_ring_init(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                     uint64_t data_offset, int64_t creator_pid)
    int fl_ring_attach(void *mem, size_t total_bytes)
    int fl_ring_queue(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count)
    int fl_ring_queue_to(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count,
                         uint32_t target)
    int fl_ring_claim(void *mem, uint32_t worker_id, int64_t timeout_ns, uint32_t *slot_out,
                      uint32_t *state_out)
    int fl_ring_publish(void *mem, uint32_t slot, uint32_t claimed_state, int ok)
    int fl_ring_wait(void *mem, uint32_t slot, int64_t timeout_ns, uint32_t *state_out)
    int fl_ring_begin_read(void *mem, uint32_t slot)
    int fl_ring_release(void *mem, uint32_t slot)
    int fl_ring_cancel(void *mem, uint32_t slot, int *cancelled_out)
    int fl_ring_reclaim(void *mem, uint32_t worker_id, uint32_t *count_out)
    int fl_ring_reclaim_slot(void *mem, uint32_t slot, uint32_t worker_id, int requeue,
                             int *done_out)
    int fl_ring_stop(void *mem)
    int fl_ring_stopped(const void *mem)
    int fl_ring_slot_state(const void *mem, uint32_t slot, uint32_t *state_out)
    fl_slot_hdr *fl_ring_slot(void *mem, uint32_t slot)
    int fl_ring_set_progress(void *mem, uint32_t slot, uint64_t rows, uint32_t pid)
    int fl_ring_set_result(void *mem, uint32_t slot, uint32_t flags, uint64_t var_bytes)
    int fl_ring_set_rows(void *mem, uint32_t slot, uint32_t rows)
    ctypedef struct fl_slot_info:
        uint32_t state, count, pid, flags, target, rows
        uint64_t seq, epoch, progress, var_bytes
    int fl_ring_slot_info(const void *mem, uint32_t slot, fl_slot_info *out)
    size_t fl_ring_nbytes_rows(uint32_t nslots, uint32_t max_rows)
    int fl_ring_init_rows(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                          uint64_t data_offset, int64_t creator_pid, uint32_t max_rows)
    int fl_ring_queue_shared(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch,
                             uint32_t count)
    int fl_ring_find_rows(void *mem, uint32_t *slot_out, uint32_t *state_out)
    int fl_ring_queue_shared_to(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch,
                                uint32_t count, const uint32_t *owners, uint32_t nowners)
    int fl_ring_find_rows_for(void *mem, uint32_t worker_id, uint32_t *slot_out,
                              uint32_t *state_out)
    int fl_ring_take_rows(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                          uint32_t row, uint32_t divisor, uint32_t *first_out, uint32_t *n_out)
    int fl_ring_rows_done(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                          uint32_t first, uint32_t n, int *published_out)
    int fl_ring_rows_fail(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                          uint32_t row, uint32_t end, int *won_out)
    int fl_ring_rows_settle(void *mem, uint32_t slot, int64_t timeout_ns, uint32_t *busy_out)
    int fl_ring_fail_shared(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id)
    int fl_ring_row_state(const void *mem, uint32_t slot, uint32_t row, uint32_t *word_out)
    int fl_ring_rows_of(const void *mem, uint32_t worker_id, uint32_t *slots, uint32_t *rows,
                        uint32_t cap, uint32_t *n_out)
    int fl_ring_reset_rows(void *mem, uint32_t worker_id, int reopen, uint32_t *n_out)
    int fl_ring_reset_slot_rows(void *mem, uint32_t slot, uint32_t worker_id, int reopen,
                                uint32_t *n_out)

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
