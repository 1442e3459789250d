/* fl_layout.h: the versioned layout of the shared region's control block.
 *
 * NOTE [region layout]
 *   offset 0                       fl_header           (FL_CACHELINE-aligned fields)
 *   header_bytes                   fl_slot_hdr[nslots] (one cache line pair per slot)
 *   (if max_rows > 0)              row tables: per slot, one cache line of meta then max_rows
 *                                  row words (NOTE [shared rows] in fl_ring.c), cache-aligned
 *   data_offset (caller's choice)  slot payloads, owned by the Python layer (fastload/_region.py)
 * C only formats and validates the control block (fl_ring_init / fl_ring_attach); it never maps
 * memory and never looks at payloads. Bumping FL_LAYOUT_VERSION needs a CHANGELOG line. */
#ifndef FASTLOAD_FL_LAYOUT_H
#define FASTLOAD_FL_LAYOUT_H

#include "fl_atomic.h"

#define FL_MAGIC "FASTLD\0\1"
#define FL_LAYOUT_VERSION 3u
#define FL_MAX_SLOTS 4096u
#define FL_MAX_WORKERS 4095u /* 12 bits of the slot state word */
#define FL_MAX_SHARED_ROWS 65536u /* rows of a shared batch (NOTE [shared rows] in fl_ring.c) */

/* Slot states: the low 4 bits of fl_slot_hdr.state.
 * FREE -> QUEUED (parent) -> CLAIMED (a worker, CAS) -> READY | FAILED (that worker, CAS)
 *      -> READING (parent, lent to the user) -> FREE (parent, when the lease dies).
 * QUEUED -> FREE (parent cancels an unclaimed task); CLAIMED by a dead worker -> QUEUED
 * (parent reclaims, new generation); READY | FAILED -> FREE (parent drops a stale result).
 * A shared batch (NOTE [shared rows] in fl_ring.c) is never CLAIMED: it goes QUEUED -> READY
 * (whoever finishes its last row) or FAILED (the worker whose row raised first). */
enum fl_slot_state {
    FL_SLOT_FREE = 0,
    FL_SLOT_QUEUED = 1,
    FL_SLOT_CLAIMED = 2,
    FL_SLOT_READY = 3,
    FL_SLOT_FAILED = 4,
    FL_SLOT_READING = 5,
};

/* The 32-bit state word (a futex word on Linux): gen:16 | owner:12 | state:4.
 * owner is meaningful in CLAIMED, READY and FAILED; gen grows on every QUEUE so a CAS built on
 * a stale snapshot fails (no ABA). */
#define FL_STATE_BITS(w) ((w) & 0xFu)
#define FL_OWNER_BITS(w) (((w) >> 4) & 0xFFFu)
#define FL_GEN_BITS(w) ((w) >> 16)
#define FL_MAKE_STATE(gen, owner, st) \
    ((((uint32_t)(gen) & 0xFFFFu) << 16) | (((uint32_t)(owner) & 0xFFFu) << 4) | ((uint32_t)(st) & 0xFu))

typedef struct fl_header {
    char magic[8];
    uint32_t layout_version;
    uint32_t header_bytes;   /* offset of the first fl_slot_hdr */
    uint32_t nslots;
    uint32_t slot_hdr_bytes; /* sizeof(fl_slot_hdr) */
    uint64_t slot_bytes;     /* payload bytes per slot (owned by Python) */
    uint64_t data_offset;    /* offset of slot 0's payload from the region start */
    uint64_t total_bytes;    /* size of the whole region */
    int64_t creator_pid;
    uint32_t max_rows;       /* rows of a shared batch's row table (0: no shared batches) */
    uint8_t _pad0[FL_CACHELINE - 60];
    /* written by the parent, polled by workers */
    fl_atomic_u32 stop;
    fl_atomic_u32 row_waiters; /* workers asleep on a shared batch's row bell */
    uint8_t _pad1[FL_CACHELINE - 8];
    /* bumped by the parent after each queue; workers futex-wait on it */
    fl_atomic_u32 queued_counter;
    fl_atomic_u32 task_waiters;
    uint8_t _pad2[FL_CACHELINE - 8];
    /* number of parent threads asleep on a slot state word */
    fl_atomic_u32 ready_waiters;
    uint8_t _pad3[FL_CACHELINE - 4];
    /* statistics (relaxed; exact only when quiescent) */
    fl_atomic_u64 n_queued;
    fl_atomic_u64 n_claimed;
    fl_atomic_u64 n_published;
    fl_atomic_u64 n_released;
    fl_atomic_u64 n_reclaimed;
    fl_atomic_u64 n_cancelled;
    fl_atomic_u64 n_futex_waits;
    fl_atomic_u64 n_futex_wakes;
    uint8_t _pad4[FL_CACHELINE - 64];
} fl_header;

typedef struct fl_slot_hdr {
    fl_atomic_u32 state;    /* gen:16 | owner:12 | state:4, see above */
    uint32_t count;         /* rows in this batch (written by the parent before QUEUED) */
    fl_atomic_u64 seq;      /* the parent's batch sequence number (written before QUEUED) */
    fl_atomic_u64 epoch;    /* informative (written before QUEUED; atomic: read by workers
                             * that scan shared batches they have not taken rows of) */
    fl_atomic_u64 progress; /* rows done by the claiming worker (relaxed; for error messages) */
    fl_atomic_u32 pid;      /* pid of the claiming worker */
    fl_atomic_u32 flags;    /* worker-written before READY (e.g. FL_SLOT_F_SPILLED) */
    fl_atomic_u64 var_bytes; /* worker-written before READY: bytes used in the variable area */
    fl_atomic_u32 target;   /* 0: any worker may claim it; k + 1: only worker k (before QUEUED;
                             * atomic: claimers scan it, as seq, on slots they do not own) */
    fl_atomic_u32 rows;     /* rows the batch has: count when queued, fewer if the worker's
                             * stream ended (fl_ring_set_rows, before READY) */
    fl_atomic_u32 share;    /* FL_SHARE_*: whether workers take this batch's rows one by one */
    uint8_t _pad[FL_CACHELINE - 60];
} fl_slot_hdr;

#define FL_SLOT_F_SPILLED 1u /* the variable-size part did not fit: it travels by pipe */
#define FL_SLOT_F_ENDED 2u   /* the worker's stream ended in (rows < count) or before this batch */
#define FL_SLOT_F_SKIPPED 4u /* on_error="skip" replaced failing samples: a Skipped message says which */
#define FL_TARGET_ANY UINT32_MAX /* fl_ring_queue_to: any worker may claim the slot */
/* fl_slot_hdr.share */
#define FL_SHARE_OFF 0u     /* one worker claims the whole batch (fl_ring_claim) */
#define FL_SHARE_ON 1u      /* its rows are taken by any worker (fl_ring_take_rows) */
#define FL_SHARE_FAILING 2u /* a row raised: the worker that set this fails the batch */
#define FL_SHARE_CANCELLED 3u /* the parent abandoned it: freed once no row is being loaded */
/* Row words of a shared batch: FREE, taken by worker k (k + 1), given to worker k up front
 * (FL_ROW_GIVEN | (k + 1): only k takes it), or one of the last three. */
#define FL_ROW_FREE 0u
#define FL_ROW_GIVEN 0x40000000u
#define FL_ROW_CLOSED 0xFFFFFFFDu  /* not to be loaded: the batch fails, or was cancelled */
#define FL_ROW_ERRORED 0xFFFFFFFEu /* loading it raised */
#define FL_ROW_DONE 0xFFFFFFFFu    /* loaded */

FL_STATIC_ASSERT(sizeof(fl_header) == 5 * FL_CACHELINE, "fl_header size is pinned");
FL_STATIC_ASSERT(offsetof(fl_header, stop) == FL_CACHELINE, "stop flag offset is pinned");
FL_STATIC_ASSERT(offsetof(fl_header, queued_counter) == 2 * FL_CACHELINE, "counter offset");
FL_STATIC_ASSERT(sizeof(fl_slot_hdr) == FL_CACHELINE, "fl_slot_hdr size is pinned");
FL_STATIC_ASSERT(offsetof(fl_slot_hdr, progress) == 24, "progress offset is pinned");
FL_STATIC_ASSERT(offsetof(fl_slot_hdr, rows) == 52, "rows offset is pinned");
FL_STATIC_ASSERT(offsetof(fl_header, max_rows) == 56, "max_rows offset is pinned");

#endif /* FASTLOAD_FL_LAYOUT_H */
