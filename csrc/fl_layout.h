/* fl_layout.h: the versioned layout of the shared region's control block.
 *
 * NOTE [region layout]
 *   offset 0                       fl_header           (FL_CACHELINE-aligned fields)
 *   header_bytes                   fl_slot_hdr[nslots] (one cache line pair per slot)
 *   fl_slot_hdr + nslots           piece tables: per slot, max_pieces 64-bit piece words then
 *                                  max_pieces 32-bit progress words, cache-aligned
 *                                  (NOTE [pieces] in fl_ring.c)
 *   data_offset (caller's choice)  slot payloads, owned by the Python layer (fastload/_region.py)
 * C only formats and validates the control block (fl_ring_init / fl_ring_attach); it never maps
 * memory and never looks at payloads. Bumping FL_LAYOUT_VERSION needs a CHANGELOG line. */
#ifndef FASTLOAD_FL_LAYOUT_H
#define FASTLOAD_FL_LAYOUT_H

#include "fl_atomic.h"

#define FL_MAGIC "FASTLD\0\1"
#define FL_LAYOUT_VERSION 4u
#define FL_MAX_SLOTS 4096u
#define FL_MAX_WORKERS 4095u  /* 12 bits of the slot state word and of a piece word */
#define FL_MAX_PIECES 4096u   /* entries of a slot's piece table (NOTE [pieces] in fl_ring.c) */
#define FL_MAX_UNITS 65536u   /* a batch is cut into at most this many units of rows */

/* Slot states: the low 4 bits of fl_slot_hdr.state (NOTE [pieces] in fl_ring.c).
 * FREE -> QUEUED (parent) -> READY | FAILED (the worker whose piece settles it)
 *      -> READING (parent, lent to the user) -> FREE (parent, when the lease dies).
 * The parent retires a batch it no longer wants in any state (fl_ring_retire): FREE at once if
 * no worker loads a piece of it, else CLOSING, which the last loader (or the parent, for a
 * dead loader) turns FREE. Nothing else ever waits for a worker. */
enum fl_slot_state {
    FL_SLOT_FREE = 0,
    FL_SLOT_QUEUED = 1,
    FL_SLOT_CLOSING = 2,
    FL_SLOT_READY = 3,
    FL_SLOT_FAILED = 4,
    FL_SLOT_READING = 5,
};

/* The 32-bit state word (a futex word on Linux): gen:16 | owner:12 | state:4.
 * owner is meaningful in READY and FAILED (the worker whose message, if any, goes with the
 * result); gen grows on every QUEUE so a CAS built on a stale snapshot fails (no ABA). */
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
    uint32_t max_pieces;     /* entries of each slot's piece table */
    uint8_t _pad0[FL_CACHELINE - 60];
    /* written by the parent, read by workers */
    fl_atomic_u32 stop;
    uint8_t _pad1[FL_CACHELINE - 4];
    /* number of parent threads asleep on a slot state word */
    fl_atomic_u32 ready_waiters;
    uint8_t _pad2[FL_CACHELINE - 4];
    /* statistics (relaxed; exact only when quiescent) */
    fl_atomic_u64 n_queued;
    fl_atomic_u64 n_taken;      /* pieces */
    fl_atomic_u64 n_published;  /* READY or FAILED */
    fl_atomic_u64 n_released;   /* retired straight to FREE, or freed from CLOSING */
    fl_atomic_u64 n_given_back; /* pieces of dead workers */
    fl_atomic_u64 n_closing;    /* retired before it settled (QUEUED or FAILED) */
    fl_atomic_u64 n_futex_waits;
    fl_atomic_u64 n_futex_wakes;
    uint8_t _pad3[FL_CACHELINE - 64];
} fl_header;

typedef struct fl_slot_hdr {
    fl_atomic_u32 state;    /* gen:16 | owner:12 | state:4, see above */
    fl_atomic_u32 count;    /* rows in this batch (written by the parent before QUEUED) */
    fl_atomic_u64 seq;      /* the parent's batch sequence number (written before QUEUED) */
    fl_atomic_u64 epoch;    /* informative (written before QUEUED) */
    fl_atomic_u64 err;      /* the lowest row that raised: (row + 1) << 12 | worker; 0: none */
    fl_atomic_u32 hw;       /* piece entries that may have been written since the slot was
                             * formatted (a high-water mark: reset up to it at each queue) */
    fl_atomic_u32 flags;    /* worker-written before READY (e.g. FL_SLOT_F_SPILLED) */
    fl_atomic_u64 var_bytes; /* worker-written before READY: bytes used in the variable area */
    fl_atomic_u32 target;   /* 0: any worker may take it; k + 1: only worker k */
    fl_atomic_u32 rows;     /* rows the batch has: count when queued, fewer if the worker's
                             * stream ended (fl_ring_set_rows, before READY) */
    fl_atomic_u32 share;    /* FL_SHARE_*: whether its rows may be cut into several pieces */
    uint8_t _pad[FL_CACHELINE - 60];
} fl_slot_hdr;

#define FL_SLOT_F_SPILLED 1u /* the variable-size part did not fit: it travels by pipe */
#define FL_SLOT_F_ENDED 2u   /* the worker's stream ended in (rows < count) or before this batch */
#define FL_SLOT_F_SKIPPED 4u /* on_error="skip" replaced failing samples: a Skipped message says which */
#define FL_TARGET_ANY UINT32_MAX /* fl_ring_queue: any worker may take the batch */
/* fl_slot_hdr.share */
#define FL_SHARE_OFF 0u /* one worker takes the whole batch, as one piece */
#define FL_SHARE_ON 1u  /* workers take pieces of it (NOTE [pieces] in fl_ring.c) */

/* A piece word (64 bits): n:17 | first:16 | gen:16 | owner:12 | kind:3. first and n count
 * units of rows (fl_ring_units); gen is the slot's generation + 1 (mod 2^16, never 0: a word
 * of 0 was never written). */
enum fl_piece_kind {
    FL_PIECE_EMPTY = 0,   /* not allocated */
    FL_PIECE_GIVEN = 1,   /* given to `owner` up front (NOTE [first samples] in _startup.py) */
    FL_PIECE_TAKEN = 2,   /* `owner` loads it */
    FL_PIECE_DONE = 3,    /* loaded */
    FL_PIECE_FREE = 4,    /* given back (its loader died): for any worker to take */
    FL_PIECE_CLOSED = 5,  /* given back, not to be loaded (the batch is abandoned) */
    FL_PIECE_ERRORED = 6, /* a row of it raised (slot err holds the lowest such row) */
};
#define FL_PIECE_KIND(p) ((uint32_t)((p) & 0x7u))
#define FL_PIECE_OWNER(p) ((uint32_t)(((p) >> 3) & 0xFFFu))
#define FL_PIECE_GEN(p) ((uint32_t)(((p) >> 15) & 0xFFFFu))
#define FL_PIECE_FIRST(p) ((uint32_t)(((p) >> 31) & 0xFFFFu))
#define FL_PIECE_N(p) ((uint32_t)((p) >> 47))
#define FL_MAKE_PIECE(kind, owner, gen, first, n)                                         \
    (((uint64_t)(n) << 47) | ((uint64_t)((first) & 0xFFFFu) << 31) |                     \
     ((uint64_t)((gen) & 0xFFFFu) << 15) | ((uint64_t)((owner) & 0xFFFu) << 3) |          \
     (uint64_t)((kind) & 0x7u))

FL_STATIC_ASSERT(sizeof(fl_header) == 4 * FL_CACHELINE, "fl_header size is pinned");
FL_STATIC_ASSERT(offsetof(fl_header, stop) == FL_CACHELINE, "stop flag offset is pinned");
FL_STATIC_ASSERT(sizeof(fl_slot_hdr) == FL_CACHELINE, "fl_slot_hdr size is pinned");
FL_STATIC_ASSERT(offsetof(fl_slot_hdr, rows) == 52, "rows offset is pinned");
FL_STATIC_ASSERT(offsetof(fl_header, max_pieces) == 56, "max_pieces offset is pinned");

#endif /* FASTLOAD_FL_LAYOUT_H */
