/* fl_ring.h: the lock-free slot ring in a caller-provided shared region (placement API).
 *
 * One parent (the consumer) hands batch tasks to N worker processes (producers of data):
 * every operation is a single CAS or store on a slot's 32-bit state word, so a process killed
 * at any instant can never wedge the others (there is no lock to hold). Waits spin briefly, then
 * sleep in the kernel (futex on Linux, a short-sleep backoff elsewhere) against a monotonic
 * deadline; callers pass short timeouts (<= ~100 ms) and re-check liveness between calls.
 *
 * Roles: functions marked [parent] may only be called by the one process that queues tasks;
 * [worker] by any worker process. */
#ifndef FASTLOAD_FL_RING_H
#define FASTLOAD_FL_RING_H

#include "fl_layout.h"
#include "fl_status.h"

/* Bytes needed for the control block of a ring with nslots slots (0 if nslots is invalid). */
size_t fl_ring_nbytes(uint32_t nslots);

/* [parent] Format a control block at mem. data_offset/slot_bytes describe the payload area,
 * which must lie inside [0, total_bytes) after the control block. mem must be 128-byte aligned. */
int fl_ring_init(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                 uint64_t data_offset, int64_t creator_pid);

/* Validate an existing control block (magic, version, sizes against total_bytes). */
int fl_ring_attach(void *mem, size_t total_bytes);

/* [parent] Hand slot `slot` (which must be FREE) to the workers as batch `seq` of `count` rows.
 * Wakes one sleeping worker if any. */
int fl_ring_queue(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count);

/* [parent] fl_ring_queue for one worker: only worker `target` (< FL_MAX_WORKERS) may claim the
 * slot, or any worker with FL_TARGET_ANY. Wakes every sleeping worker when targeted (the one
 * woken must be the target). A reclaimed slot keeps its target. */
int fl_ring_queue_to(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count,
                     uint32_t target);

/* [worker] Claim the QUEUED slot with the lowest seq for worker `worker_id`, waiting up to
 * timeout_ns. On success *slot_out is the slot and *state_out its state word (pass it back to
 * fl_ring_publish). FL_ETIMEOUT when nothing was queued in time, FL_ESTOPPED when stopped. */
int fl_ring_claim(void *mem, uint32_t worker_id, int64_t timeout_ns, uint32_t *slot_out,
                  uint32_t *state_out);

/* [worker] CLAIMED -> READY (ok != 0) or FAILED, only if the state word still equals
 * `claimed_state` (FL_ESTATE otherwise: the slot was reclaimed or cancelled). Wakes the parent. */
int fl_ring_publish(void *mem, uint32_t slot, uint32_t claimed_state, int ok);

/* [parent] Wait up to timeout_ns until slot leaves QUEUED/CLAIMED; *state_out gets the word. */
int fl_ring_wait(void *mem, uint32_t slot, int64_t timeout_ns, uint32_t *state_out);

/* [parent] READY -> READING (the batch is lent to the user). */
int fl_ring_begin_read(void *mem, uint32_t slot);

/* [parent] READING, READY or FAILED -> FREE. */
int fl_ring_release(void *mem, uint32_t slot);

/* [parent] QUEUED -> FREE if no worker has claimed it yet. *cancelled_out = 1 if it was. */
int fl_ring_cancel(void *mem, uint32_t slot, int *cancelled_out);

/* [parent] Re-queue (new generation) every slot CLAIMED by `worker_id`, which must be dead.
 * *count_out gets the number of slots re-queued. Wakes sleeping workers. */
int fl_ring_reclaim(void *mem, uint32_t worker_id, uint32_t *count_out);

/* [parent] If `slot` is CLAIMED by `worker_id` (which must be dead), move it to QUEUED with a new
 * generation (requeue != 0: another worker loads the batch again) or to FREE (requeue == 0: the
 * batch is abandoned). *done_out = 1 if the slot was moved. */
int fl_ring_reclaim_slot(void *mem, uint32_t slot, uint32_t worker_id, int requeue, int *done_out);

/* [parent] Set the stop flag and wake every sleeping worker. */
int fl_ring_stop(void *mem);
int fl_ring_stopped(const void *mem);

/* Read a slot's state word (acquire). */
int fl_ring_slot_state(const void *mem, uint32_t slot, uint32_t *state_out);

/* [worker] Record progress (rows done) and the worker's pid on a claimed slot (relaxed). */
int fl_ring_set_progress(void *mem, uint32_t slot, uint64_t rows, uint32_t pid);

/* [worker] The batch has `rows` rows (<= count: a worker's stream ended), before publish.
 * FL_ERANGE if rows > count. */
int fl_ring_set_rows(void *mem, uint32_t slot, uint32_t rows);

/* [worker] Record result flags and variable-area bytes before fl_ring_publish. */
int fl_ring_set_result(void *mem, uint32_t slot, uint32_t flags, uint64_t var_bytes);

/* A racy-but-defined snapshot of a slot's header (atomic fields read relaxed). */
typedef struct fl_slot_info {
    uint32_t state, count, pid, flags, target, rows;
    uint64_t seq, epoch, progress, var_bytes;
} fl_slot_info;
int fl_ring_slot_info(const void *mem, uint32_t slot, fl_slot_info *out);

/* ---- Shared batches: workers take the rows of one batch (NOTE [shared rows] in fl_ring.c) ---- */

/* Bytes of the control block with row tables of max_rows rows (<= FL_MAX_SHARED_ROWS; 0 if
 * invalid); fl_ring_nbytes(n) == fl_ring_nbytes_rows(n, 0). */
size_t fl_ring_nbytes_rows(uint32_t nslots, uint32_t max_rows);

/* [parent] fl_ring_init with row tables for shared batches of up to max_rows rows. */
int fl_ring_init_rows(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                      uint64_t data_offset, int64_t creator_pid, uint32_t max_rows);

/* [parent] FREE -> QUEUED as a shared batch of `count` (1..max_rows) rows, all FREE. */
int fl_ring_queue_shared(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count);

/* [parent] fl_ring_queue_shared with rows given to workers up front: row r < nowners to worker
 * owners[r] (FL_TARGET_ANY: to none), as if that worker had taken it (it loaded that sample
 * already: NOTE [first samples] in fastload/_engine.py). */
int fl_ring_queue_shared_to(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch,
                            uint32_t count, const uint32_t *owners, uint32_t nowners);

/* [worker] A QUEUED shared batch with a FREE row: *slot_out and its state word (pass it to the
 * calls below). FL_ETIMEOUT if there is none (this never waits). In order of preference: one
 * with a row given to this worker (fl_ring_find_rows_for); one of the oldest epoch queued that
 * nobody has begun (each worker fills batches of its own while there are enough); the oldest
 * begun one (idle workers help finish it); one of a later epoch nobody has begun; the lowest
 * seq first within each. */
int fl_ring_find_rows(void *mem, uint32_t *slot_out, uint32_t *state_out);

/* [worker] fl_ring_find_rows, also counting rows given to worker_id (fl_ring_queue_shared_to). */
int fl_ring_find_rows_for(void *mem, uint32_t worker_id, uint32_t *slot_out,
                          uint32_t *state_out);

/* [worker] Take FREE rows of a shared batch: `row` exactly (*n_out 0 or 1), or with
 * row == FL_TAKE_PIECE up to max(1, rows left / divisor) consecutive FREE rows from the first FREE
 * one (guided scheduling: big pieces first, single rows at the end), or with FL_TAKE_GIVEN one
 * row given to worker_id up front (fl_ring_queue_shared_to). *n_out 0: none to take. */
#define FL_TAKE_PIECE UINT32_MAX
#define FL_TAKE_GIVEN (UINT32_MAX - 1)
int fl_ring_take_rows(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                      uint32_t row, uint32_t divisor, uint32_t *first_out, uint32_t *n_out);

/* [worker] Rows [first, first + n), taken by worker_id, are loaded. *published_out = 1 if that
 * finished the batch: this call published it READY. */
int fl_ring_rows_done(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                      uint32_t first, uint32_t n, int *published_out);

/* [worker] Loading row `row` (taken by worker_id) raised; rows (row, end) it had taken are given
 * up. *won_out = 1 if this worker is the one to fail the batch (the first to fail a row): it must
 * then wait with fl_ring_rows_settle, then publish it FAILED with fl_ring_fail_shared. */
int fl_ring_rows_fail(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                      uint32_t row, uint32_t end, int *won_out);

/* [worker] The failing worker waits up to timeout_ns until no row is being loaded (FREE rows are
 * closed). FL_OK when none is, FL_ETIMEOUT (call again), FL_ESTOPPED. */
int fl_ring_rows_settle(void *mem, uint32_t slot, int64_t timeout_ns, uint32_t *busy_out);

/* [worker] QUEUED -> FAILED (owner worker_id) for the worker that won fl_ring_rows_fail. */
int fl_ring_fail_shared(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id);

/* Row word `row` of a shared batch (FL_ROW_*, or worker + 1). */
int fl_ring_row_state(const void *mem, uint32_t slot, uint32_t row, uint32_t *word_out);

/* [parent] The rows worker_id (dead) had taken (not those only given to it): up to cap
 * (slot, row) pairs; *n_out = how many there are in all. */
int fl_ring_rows_of(const void *mem, uint32_t worker_id, uint32_t *slots, uint32_t *rows,
                    uint32_t cap, uint32_t *n_out);

/* [parent] Give back the rows of worker_id (dead), taken or given: FREE again (reopen != 0:
 * other workers load them) or CLOSED; a batch it was failing is opened again (reopen) for another worker to fail,
 * and a batch whose rows are all loaded is published READY. *n_out = rows given back. */
int fl_ring_reset_rows(void *mem, uint32_t worker_id, int reopen, uint32_t *n_out);

/* [parent] fl_ring_reset_rows for one slot only. */
int fl_ring_reset_slot_rows(void *mem, uint32_t slot, uint32_t worker_id, int reopen,
                            uint32_t *n_out);

/* Pointer to a slot's header (NULL if out of range). */
fl_slot_hdr *fl_ring_slot(void *mem, uint32_t slot);

#endif /* FASTLOAD_FL_RING_H */
