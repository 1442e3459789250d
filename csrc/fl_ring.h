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

/* Pointer to a slot's header (NULL if out of range). */
fl_slot_hdr *fl_ring_slot(void *mem, uint32_t slot);

#endif /* FASTLOAD_FL_RING_H */
