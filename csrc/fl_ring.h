/* fl_ring.h: the lock-free slot ring in a caller-provided shared region (placement API).
 *
 * One parent (the consumer) hands batch tasks to worker processes or threads (producers of
 * data). A batch is owned in pieces, one protocol for every batch (NOTE [pieces] in fl_ring.c):
 * a worker that loads a batch alone takes one piece of all its rows, workers that share it take
 * pieces of a few rows each. Every step is one CAS on one word, so a worker killed at any
 * instant can never wedge the others: there is no lock to hold, and no call here waits for a
 * worker. The parent's one wait (fl_ring_wait) is bounded by its timeout; workers never wait in
 * the ring (they sleep on the pool's bell, fl_bell.h).
 *
 * Roles: functions marked [parent] may only be called by the one thread that queues tasks;
 * [worker] by any worker, process or thread. */
#ifndef FASTLOAD_FL_RING_H
#define FASTLOAD_FL_RING_H

#include "fl_layout.h"
#include "fl_status.h"

/* Bytes of the control block of nslots slots whose piece tables have max_pieces entries
 * (1..FL_MAX_PIECES); 0 if either is invalid. */
size_t fl_ring_nbytes(uint32_t nslots, uint32_t max_pieces);

/* [parent] Format a control block at mem. data_offset/slot_bytes describe the payload area,
 * which must lie inside [0, total_bytes) after the control block. mem must be
 * FL_CACHELINE-aligned. */
int fl_ring_init(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                 uint64_t data_offset, int64_t creator_pid, uint32_t max_pieces);

/* Validate an existing control block (magic, version, sizes against total_bytes). */
int fl_ring_attach(void *mem, size_t total_bytes);

/* Rows per unit of a batch of `count` rows: pieces are counted in units (at most FL_MAX_UNITS
 * of them), so a piece word holds any batch; 1 for batches of up to 65536 rows. */
uint32_t fl_ring_unit(uint32_t count);

/* [parent] Hand FREE slot `slot` to the workers as batch `seq` of `count` rows (count >= 1).
 * target: FL_TARGET_ANY, or the only worker that may take it. share: FL_SHARE_ON lets workers
 * cut it into pieces (NOTE [pieces]). owners[r] (r < nowners, share on, at most one row per
 * unit, no target, fewer than max_pieces unless they are all the rows): row r is given to
 * worker owners[r] up front (FL_TARGET_ANY: to none), as that worker
 * loaded its sample already (NOTE [first samples] in fastload/_startup.py). */
int fl_ring_queue(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count,
                  uint32_t target, uint32_t share, const uint32_t *owners, uint32_t nowners);

/* [parent] Wait up to timeout_ns until `slot` is no longer QUEUED; *state_out gets the word. */
int fl_ring_wait(void *mem, uint32_t slot, int64_t timeout_ns, uint32_t *state_out);

/* [parent] READY -> READING (the batch is lent to the user). */
int fl_ring_begin_read(void *mem, uint32_t slot);

/* [parent] The parent is done with `slot`, in any state: READY or READING (a released lease),
 * FAILED (its error raised), QUEUED (abandoned), CLOSING (retired before). *freed_out = 1 if
 * the slot is FREE now; else workers still load pieces of it and the last of them frees it
 * (retire it again later to know). FREE stays FREE. */
int fl_ring_retire(void *mem, uint32_t slot, int *freed_out);

/* [parent] Worker `worker_id` is dead: the pieces of `slot` it had taken or was given go back,
 * FREE for other workers to load (reopen != 0) or CLOSED (the batch is abandoned: retire it).
 * Settles the batch (READY, FAILED, or FREE if CLOSING) if that was what it waited for.
 * *n_out = pieces given back. */
int fl_ring_give_back(void *mem, uint32_t slot, uint32_t worker_id, int reopen, uint32_t *n_out);

/* [parent] Set the stop flag: workers take nothing more. */
int fl_ring_stop(void *mem);
int fl_ring_stopped(const void *mem);

/* Read a slot's state word (acquire). */
int fl_ring_slot_state(const void *mem, uint32_t slot, uint32_t *state_out);

/* What fl_ring_take hands a worker: piece `piece` of the batch in `slot` (state word `state`),
 * rows [first, first + n) of its `count`; the batch's seq and epoch, and whether it is shared
 * (else the piece is the whole batch). */
typedef struct fl_take {
    uint32_t slot, state, piece, first, n, count, shared;
    uint64_t seq, epoch;
} fl_take;

/* [worker] Take the next piece to load for worker `worker_id`, over all slots, in this order:
 * a piece given to it; a piece of the oldest epoch's batch nobody has begun (lowest seq first);
 * a piece of a begun shared batch (helping finish it); a batch of a later epoch nobody has
 * begun. `pid` is recorded with the piece (fl_ring_progress). A batch not shared is taken whole; a shared one in a piece of
 * max(min_units, units left / divisor) units (guided scheduling: big pieces first, single rows
 * at the end; divisor 1 takes the rest). FL_ETIMEOUT if there is nothing to take (this never
 * waits), FL_ESTOPPED once stopped. */
int fl_ring_take(void *mem, uint32_t worker_id, uint32_t divisor, uint32_t min_units,
                 uint32_t pid, fl_take *out);

/* [worker] Rows of the piece loaded so far, and the loader's pid (relaxed; for the parent's
 * messages about a batch late or lost with its worker, and to know which process published
 * it). */
int fl_ring_progress(void *mem, uint32_t slot, uint32_t piece, uint32_t rows, uint32_t pid);

/* [worker] The piece (all its rows) is loaded. *published_out = 1 if that finished the batch:
 * this call published it READY. FL_ESTATE if the piece is no longer this worker's (it was
 * given back after the parent took this worker for dead). */
int fl_ring_done(void *mem, const fl_take *t, uint32_t worker_id, int *published_out);

/* [worker] Row `row` of the piece raised (the rows before it in the piece are loaded). The
 * batch fails with the error of its lowest row that raises, as one worker loading it in order
 * would: rows before that one are still loaded, rows after it are not handed out any more.
 * *published_out = 1 if this call published the batch FAILED. Send the error to the parent
 * before calling this (the parent reads it when the batch is FAILED and its owner is you). */
int fl_ring_fail(void *mem, const fl_take *t, uint32_t worker_id, uint32_t row,
                 int *published_out);

/* [worker] A batch of fewer rows than queued (a worker's stream ended), before fl_ring_done of
 * its one piece. FL_ERANGE if rows > count. */
int fl_ring_set_rows(void *mem, uint32_t slot, uint32_t rows);

/* [worker] Result flags and variable-area bytes of a batch taken whole, before fl_ring_done. */
int fl_ring_set_result(void *mem, uint32_t slot, uint32_t flags, uint64_t var_bytes);

/* A racy-but-defined snapshot of a slot's header (atomic fields read relaxed). */
typedef struct fl_slot_info {
    uint32_t state, count, flags, target, rows, share, err_row, err_owner, pid;
    uint64_t seq, epoch, var_bytes;
} fl_slot_info;
/* (err_row, err_owner: the lowest row that raised and its worker, err_row UINT32_MAX if none;
 * pid: the process that published a READY batch taken whole, or that raised err_row.) */
int fl_ring_slot_info(const void *mem, uint32_t slot, fl_slot_info *out);

/* A piece of a slot's current batch, decoded: rows [first, first + n), loaded up to `done`. */
typedef struct fl_piece_info {
    uint32_t kind, owner, first, n, done, pid;
} fl_piece_info;

/* The pieces of `slot`'s current batch (in the order they were cut), up to cap; *n_out gets
 * how many there are. Racy but defined: for the parent's messages and for tests. */
int fl_ring_pieces(const void *mem, uint32_t slot, fl_piece_info *out, uint32_t cap,
                   uint32_t *n_out);

/* Pointer to a slot's header (NULL if out of range). */
fl_slot_hdr *fl_ring_slot(void *mem, uint32_t slot);

#endif /* FASTLOAD_FL_RING_H */
