/* fl_ring.c: the lock-free slot state machine (see fl_ring.h and fl_layout.h).
 *
 * NOTE [pieces]
 * Every batch is owned in pieces, by one protocol. A slot has a piece table: entries cut in
 * order, each one 64-bit word (kind, owner, first unit, units, generation) and a progress word.
 * A worker that loads a batch alone takes one piece of all its rows (one CAS on entry 0); workers
 * that share a batch (the parent's choice, fl_slot_hdr.share: the first batch of an epoch and
 * its last ones, where workers would otherwise wait for one of them: pytorch/pytorch#19836)
 * cut pieces of a few rows each, guided (big first, single rows at the end). Each step is one
 * CAS on one word, so a worker killed at any instant leaves nothing half-done:
 *   - take: CAS an entry EMPTY -> TAKEN (cutting the next piece), or GIVEN/FREE -> TAKEN.
 *   - done: TAKEN -> DONE; whoever makes every row DONE publishes the batch READY.
 *   - fail: the row's number goes into the slot's `err` (a CAS to the lowest row that raised),
 *     then TAKEN -> ERRORED. Rows below the lowest error are still loaded, rows above it are
 *     no longer handed out, and whoever makes every row below it DONE publishes the batch
 *     FAILED, owned by the worker of that row (its error is in that worker's pipe): the error
 *     is the one a single worker loading the batch in order would raise. No worker waits for
 *     another: a worker whose row raised goes on with other work at once.
 *   - a dead worker's pieces are given back by the parent (fl_ring_give_back): FREE for others
 *     to load, or CLOSED if its batch is abandoned; that may settle the batch.
 *   - retire: the parent lets go of a batch in any state (a released lease, a raised error, an
 *     abandoned task). With no piece TAKEN the slot is FREE at once; else it is CLOSING, and the
 *     loader that gives back or finishes the last TAKEN piece frees it. A slot is therefore
 *     queued again only once no worker writes into it, and nothing ever waits for a worker to
 *     be able to cancel a batch (the parent re-checks CLOSING slots when it reaps).
 * The retire/finish race is Dekker's: the parent stores CLOSING then reads the pieces, a loader
 * stores its piece then reads the state, each with a full fence between; at least one of them
 * sees the other, so the slot is freed exactly once (a CAS) and never while a piece is TAKEN.
 *
 * Generations. A piece word carries its batch's generation (the slot's, + 1: never 0, so a word
 * of 0 was never written). At each queue the parent rewrites entries [0, hw) as EMPTY of the new
 * generation, where hw is a high-water mark that takers raise *before* cutting an entry. A
 * worker cuts an entry only from EMPTY of its own generation or 0, after reading the entries
 * before it as pieces of its generation: a worker that read an older batch stops at entry 0
 * (rewritten), so it cannot cut a piece of the new batch from an old view; the one window left
 * (it read entry 0 before the rewrite, and cuts at or past the old hw) leaves a word of its old
 * generation, which it takes back when it checks the state word after the CAS (or the parent
 * does, if it dies: fl_ring_give_back), and which current takers never overwrite. Generations
 * are 16 bits, as the state word's: a worker would have to sleep through 65535 batches of one
 * slot between two of its reads for a stale CAS to land (the same bound as the state word's).
 */
#include "fl_ring.h"

#include <string.h>

#include "fl_wait.h"

#define FL_SPIN_ROUNDS 64
#define FL_TAKE_ROUNDS 16 /* fl_ring_take re-scans after losing that many races, then says none */

FL_INLINE void fl_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* now + timeout, saturated (a huge timeout means "wait a very long time", never overflow). */
FL_INLINE int64_t deadline_after(int64_t timeout_ns) {
    int64_t now = fl_now_ns();
    if (timeout_ns <= 0) return now;
    return timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
}

FL_INLINE fl_header *hdr_of(void *mem) { return (fl_header *)mem; }

FL_INLINE fl_slot_hdr *slots_of(void *mem) {
    return (fl_slot_hdr *)((char *)mem + hdr_of(mem)->header_bytes);
}

/* A slot's piece table: max_pieces piece words, then max_pieces progress words
 * (rows done | pid << 32), padded to a cache line. */
FL_INLINE size_t table_stride(uint32_t max_pieces) {
    size_t n = (size_t)max_pieces * 16u;
    return (n + FL_CACHELINE - 1) & ~(size_t)(FL_CACHELINE - 1);
}

FL_INLINE fl_atomic_u64 *pieces_of(void *mem, uint32_t slot) {
    fl_header *h = hdr_of(mem);
    char *base = (char *)mem + h->header_bytes + (size_t)h->nslots * sizeof(fl_slot_hdr);
    return (fl_atomic_u64 *)(base + (size_t)slot * table_stride(h->max_pieces));
}

FL_INLINE fl_atomic_u64 *progress_of(void *mem, uint32_t slot) {
    return pieces_of(mem, slot) + hdr_of(mem)->max_pieces;
}

/* The generation of a batch's piece words: 1..65535 (0 is "never written"). */
FL_INLINE uint32_t piece_gen(uint32_t state) { return FL_GEN_BITS(state) % 65535u + 1u; }

FL_INLINE uint64_t with_kind(uint64_t word, uint32_t kind, uint32_t owner) {
    return FL_MAKE_PIECE(kind, owner, FL_PIECE_GEN(word), FL_PIECE_FIRST(word), FL_PIECE_N(word));
}

/* Whether `word` is a piece of generation g (cut or given, not EMPTY). */
FL_INLINE int is_piece(uint64_t word, uint32_t g) {
    return word != 0 && FL_PIECE_GEN(word) == g && FL_PIECE_KIND(word) != FL_PIECE_EMPTY;
}

uint32_t fl_ring_unit(uint32_t count) {
    return count <= FL_MAX_UNITS ? 1u : (uint32_t)(((uint64_t)count + FL_MAX_UNITS - 1) / FL_MAX_UNITS);
}

FL_INLINE uint32_t units_of(uint32_t count, uint32_t unit) {
    return (uint32_t)(((uint64_t)count + unit - 1) / unit);
}


#define ERR_ROW(e) ((uint32_t)(((e) >> 12) - 1))
#define ERR_OWNER(e) ((uint32_t)((e) & 0xFFFu))

/* ---- format, attach ------------------------------------------------------------------- */

size_t fl_ring_nbytes(uint32_t nslots, uint32_t max_pieces) {
    if (nslots == 0 || nslots > FL_MAX_SLOTS || max_pieces == 0 || max_pieces > FL_MAX_PIECES)
        return 0;
    return sizeof(fl_header) + (size_t)nslots * (sizeof(fl_slot_hdr) + table_stride(max_pieces));
}

int fl_ring_init(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                 uint64_t data_offset, int64_t creator_pid, uint32_t max_pieces) {
    if (mem == NULL || ((uintptr_t)mem % FL_CACHELINE) != 0) return FL_EINVAL;
    size_t ctl = fl_ring_nbytes(nslots, max_pieces);
    if (ctl == 0) return FL_EINVAL;
    if (total_bytes < ctl || data_offset < ctl) return FL_ENOSPACE;
    if (slot_bytes != 0 && (uint64_t)nslots > (UINT64_MAX - data_offset) / slot_bytes)
        return FL_ENOSPACE;
    if (data_offset + (uint64_t)nslots * slot_bytes > (uint64_t)total_bytes) return FL_ENOSPACE;
    memset(mem, 0, ctl);
    fl_header *h = hdr_of(mem);
    memcpy(h->magic, FL_MAGIC, 8);
    h->layout_version = FL_LAYOUT_VERSION;
    h->header_bytes = (uint32_t)sizeof(fl_header);
    h->nslots = nslots;
    h->slot_hdr_bytes = (uint32_t)sizeof(fl_slot_hdr);
    h->slot_bytes = slot_bytes;
    h->data_offset = data_offset;
    h->total_bytes = (uint64_t)total_bytes;
    h->creator_pid = creator_pid;
    h->max_pieces = max_pieces;
    fl_atomic_fence_seq_cst();
    return FL_OK;
}

int fl_ring_attach(void *mem, size_t total_bytes) {
    if (mem == NULL || total_bytes < sizeof(fl_header)) return FL_ELAYOUT;
    const fl_header *h = hdr_of(mem);
    if (memcmp(h->magic, FL_MAGIC, 8) != 0) return FL_ELAYOUT;
    if (h->layout_version != FL_LAYOUT_VERSION) return FL_ELAYOUT;
    if (h->header_bytes != sizeof(fl_header) || h->slot_hdr_bytes != sizeof(fl_slot_hdr))
        return FL_ELAYOUT;
    size_t ctl = fl_ring_nbytes(h->nslots, h->max_pieces);
    if (ctl == 0 || h->total_bytes != (uint64_t)total_bytes || h->data_offset < ctl)
        return FL_ELAYOUT;
    if (h->slot_bytes != 0 && (uint64_t)h->nslots > (UINT64_MAX - h->data_offset) / h->slot_bytes)
        return FL_ELAYOUT;
    if (h->data_offset + (uint64_t)h->nslots * h->slot_bytes > (uint64_t)total_bytes)
        return FL_ELAYOUT;
    return FL_OK;
}

fl_slot_hdr *fl_ring_slot(void *mem, uint32_t slot) {
    if (mem == NULL || slot >= hdr_of(mem)->nslots) return NULL;
    return &slots_of(mem)[slot];
}

int fl_ring_slot_state(const void *mem, uint32_t slot, uint32_t *state_out) {
    fl_slot_hdr *s = fl_ring_slot((void *)mem, slot);
    if (s == NULL || state_out == NULL) return FL_EINVAL;
    *state_out = fl_atomic_load_acquire_u32(&s->state);
    return FL_OK;
}

/* ---- the pieces of a batch, read in one pass -------------------------------------------- */

typedef struct scan {
    uint32_t np;      /* pieces of the batch: entries [0, np) */
    uint32_t end;     /* units cut: the end of the last piece */
    uint32_t next;    /* the entry after them (np), if it can be cut (EMPTY of g, or 0) */
    uint64_t next_word;
    int can_cut;
    int taken;        /* a piece is TAKEN */
    int begun;        /* a piece is TAKEN, DONE or ERRORED */
    int all_done;     /* every piece is DONE */
    int given_k;      /* a piece GIVEN to `me` (-1: none) */
    int free_k;       /* a FREE piece below `limit` (-1: none) */
    uint32_t settled; /* units from 0 that are DONE or ERRORED, in order (a prefix) */
} scan;

static void scan_pieces(void *mem, uint32_t slot, uint32_t g, uint32_t me, uint32_t limit,
                        scan *out) {
    fl_atomic_u64 *p = pieces_of(mem, slot);
    uint32_t cap = hdr_of(mem)->max_pieces;
    memset(out, 0, sizeof(*out));
    out->all_done = 1;
    out->given_k = out->free_k = -1;
    int prefix = 1;
    uint32_t k = 0;
    for (; k < cap; k++) {
        uint64_t w = fl_atomic_load_acquire_u64(&p[k]);
        if (!is_piece(w, g)) {
            out->next_word = w;
            out->can_cut = w == 0 || w == FL_MAKE_PIECE(FL_PIECE_EMPTY, 0, g, 0, 0);
            break;
        }
        uint32_t kind = FL_PIECE_KIND(w), first = FL_PIECE_FIRST(w), n = FL_PIECE_N(w);
        out->end = first + n;
        if (kind != FL_PIECE_DONE) out->all_done = 0;
        if (kind == FL_PIECE_TAKEN) out->taken = 1;
        if (kind == FL_PIECE_TAKEN || kind == FL_PIECE_DONE || kind == FL_PIECE_ERRORED)
            out->begun = 1;
        if (kind == FL_PIECE_GIVEN && FL_PIECE_OWNER(w) == me && out->given_k < 0)
            out->given_k = (int)k;
        if (kind == FL_PIECE_FREE && first < limit && out->free_k < 0) out->free_k = (int)k;
        if (prefix && (kind == FL_PIECE_DONE || kind == FL_PIECE_ERRORED) &&
            first == out->settled)
            out->settled = first + n;
        else
            prefix = 0;
    }
    out->np = out->next = k;
    if (k == cap) out->can_cut = 0;
}

/* Wake the parent if it sleeps on this slot's state word. */
FL_INLINE void wake_parent(fl_header *h, fl_slot_hdr *s) {
    fl_wake_if_waiting(&s->state, &h->ready_waiters, -1, &h->n_futex_wakes);
}

/* Settle the batch whose state word was `seen`, after a piece changed: publish it READY or
 * FAILED if that is what it waited for; free a CLOSING slot whose last loader left. 1 if this
 * call published the batch. Call it after a full fence (NOTE [pieces]: Dekker). */
static int settle(void *mem, uint32_t slot, uint32_t seen, uint32_t me) {
    fl_header *h = hdr_of(mem);
    fl_slot_hdr *s = &slots_of(mem)[slot];
    for (;;) {
        uint32_t w = fl_atomic_load_acquire_u32(&s->state);
        if (FL_GEN_BITS(w) != FL_GEN_BITS(seen)) return 0;
        uint32_t st = FL_STATE_BITS(w);
        if (st != FL_SLOT_QUEUED && st != FL_SLOT_CLOSING) return 0;
        uint32_t count = fl_atomic_load_relaxed_u32(&s->count);
        uint32_t unit = fl_ring_unit(count), units = units_of(count, unit);
        uint64_t err = fl_atomic_load_acquire_u64(&s->err);
        scan sc;
        scan_pieces(mem, slot, piece_gen(w), FL_MAX_WORKERS, units, &sc);
        if (st == FL_SLOT_CLOSING) {
            if (sc.taken) return 0;
            if (fl_atomic_cas_acq_rel_u32(&s->state, &w, FL_MAKE_STATE(FL_GEN_BITS(w), 0,
                                                                       FL_SLOT_FREE)))
                fl_atomic_fetch_add_relaxed_u64(&h->n_released, 1);
            return 0;
        }
        /* A failure that lowered err after we read it has its piece ERRORED after its err
         * CAS: seeing that piece settled, we see the new err here, and look again. */
        if (fl_atomic_load_acquire_u64(&s->err) != err) continue;
        uint32_t want;
        if (err == 0) {
            if (!(sc.all_done && sc.end == units && sc.np > 0)) return 0;
            uint32_t owner = me;
            if (sc.np == 1) owner = FL_PIECE_OWNER(fl_atomic_load_relaxed_u64(pieces_of(mem, slot)));
            want = FL_MAKE_STATE(FL_GEN_BITS(w), owner, FL_SLOT_READY);
        } else {
            uint32_t need = ERR_ROW(err) / unit + 1; /* units up to the one holding that row */
            if (sc.settled < (need < units ? need : units))
                return 0; /* rows below the error not all loaded yet */
            want = FL_MAKE_STATE(FL_GEN_BITS(w), ERR_OWNER(err), FL_SLOT_FAILED);
        }
        if (!fl_atomic_cas_acq_rel_u32(&s->state, &w, want)) continue;
        fl_atomic_fetch_add_relaxed_u64(&h->n_published, 1);
        wake_parent(h, s);
        return 1;
    }
}

/* Raise slot s's high-water mark to at least k + 1 (before cutting entry k). */
FL_INLINE void raise_hw(fl_slot_hdr *s, uint32_t k) {
    uint32_t hw = fl_atomic_load_acquire_u32(&s->hw);
    while (hw < k + 1 && !fl_atomic_cas_acq_rel_u32(&s->hw, &hw, k + 1)) {
    }
}

/* ---- parent ---------------------------------------------------------------------------- */

int fl_ring_queue(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count,
                  uint32_t target, uint32_t share, const uint32_t *owners, uint32_t nowners) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || count == 0 || (target != FL_TARGET_ANY && target >= FL_MAX_WORKERS))
        return FL_EINVAL;
    if (share != FL_SHARE_OFF && share != FL_SHARE_ON) return FL_EINVAL;
    if (nowners > 0 && (owners == NULL || share != FL_SHARE_ON || fl_ring_unit(count) != 1 ||
                        nowners > count || target != FL_TARGET_ANY)) /* (none could take it) */
        return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    /* the given rows must fit the table, leaving an entry to cut the other rows from */
    if (nowners > h->max_pieces || (nowners == h->max_pieces && nowners < count))
        return FL_EINVAL;
    for (uint32_t r = 0; r < nowners; r++)
        if (owners[r] != FL_TARGET_ANY && owners[r] >= FL_MAX_WORKERS) return FL_EINVAL;
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    if (FL_STATE_BITS(w) != FL_SLOT_FREE) return FL_ESTATE;
    uint32_t next = FL_MAKE_STATE(FL_GEN_BITS(w) + 1, 0, FL_SLOT_QUEUED);
    uint32_t g = piece_gen(next);
    /* NOTE [pieces] (generations): nobody loads a piece of a FREE slot; entries that may have
     * been written are rewritten as EMPTY of the new generation, entry 0 always. */
    fl_atomic_u64 *p = pieces_of(mem, slot), *prog = progress_of(mem, slot);
    uint32_t hw = fl_atomic_load_acquire_u32(&s->hw);
    if (hw > h->max_pieces) hw = h->max_pieces;
    if (hw == 0) hw = 1;
    for (uint32_t k = 0; k < hw; k++) {
        uint64_t v = k < nowners ? FL_MAKE_PIECE(owners[k] == FL_TARGET_ANY ? FL_PIECE_FREE
                                                                          : FL_PIECE_GIVEN,
                                                 owners[k] == FL_TARGET_ANY ? 0 : owners[k], g,
                                                 k, 1)
                                 : FL_MAKE_PIECE(FL_PIECE_EMPTY, 0, g, 0, 0);
        fl_atomic_store_relaxed_u64(&p[k], v);
        fl_atomic_store_relaxed_u64(&prog[k], 0);
    }
    for (uint32_t k = hw; k < nowners; k++) {
        fl_atomic_store_relaxed_u64(&p[k], FL_MAKE_PIECE(owners[k] == FL_TARGET_ANY
                                                             ? FL_PIECE_FREE : FL_PIECE_GIVEN,
                                                         owners[k] == FL_TARGET_ANY ? 0
                                                                                    : owners[k],
                                                         g, k, 1));
        fl_atomic_store_relaxed_u64(&prog[k], 0);
    }
    raise_hw(s, (nowners > hw ? nowners : hw) - 1); /* never lowered: a stale cut may raise it */
    fl_atomic_store_relaxed_u32(&s->count, count);
    fl_atomic_store_relaxed_u64(&s->epoch, epoch);
    fl_atomic_store_relaxed_u64(&s->seq, seq);
    fl_atomic_store_relaxed_u64(&s->err, 0);
    fl_atomic_store_relaxed_u32(&s->target, target == FL_TARGET_ANY ? 0 : target + 1);
    fl_atomic_store_relaxed_u32(&s->rows, count);
    fl_atomic_store_relaxed_u32(&s->flags, 0);
    fl_atomic_store_relaxed_u64(&s->var_bytes, 0);
    fl_atomic_store_relaxed_u32(&s->share, share);
    fl_atomic_store_release_u32(&s->state, next); /* publishes everything above */
    fl_atomic_fetch_add_relaxed_u64(&h->n_queued, 1);
    return FL_OK;
}

int fl_ring_wait(void *mem, uint32_t slot, int64_t timeout_ns, uint32_t *state_out) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || state_out == NULL) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    int64_t deadline = deadline_after(timeout_ns);
    int spins = 0;
    for (;;) {
        uint32_t w = fl_atomic_load_acquire_u32(&s->state);
        *state_out = w;
        if (FL_STATE_BITS(w) != FL_SLOT_QUEUED) return FL_OK;
        int64_t left = deadline - fl_now_ns();
        if (left <= 0) return FL_ETIMEOUT;
        if (spins < FL_SPIN_ROUNDS) {
            spins++;
            fl_cpu_relax();
            continue;
        }
        fl_sleep_unless_changed(&s->state, w, &h->ready_waiters, NULL, left, &h->n_futex_waits);
    }
}

int fl_ring_begin_read(void *mem, uint32_t slot) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL) return FL_EINVAL;
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    if (FL_STATE_BITS(w) != FL_SLOT_READY) return FL_ESTATE;
    uint32_t want = FL_MAKE_STATE(FL_GEN_BITS(w), FL_OWNER_BITS(w), FL_SLOT_READING);
    if (!fl_atomic_cas_acq_rel_u32(&s->state, &w, want)) return FL_ESTATE;
    return FL_OK;
}

int fl_ring_retire(void *mem, uint32_t slot, int *freed_out) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || freed_out == NULL) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    *freed_out = 0;
    for (;;) {
        uint32_t w = fl_atomic_load_acquire_u32(&s->state);
        uint32_t st = FL_STATE_BITS(w), free_w = FL_MAKE_STATE(FL_GEN_BITS(w), 0, FL_SLOT_FREE);
        if (st == FL_SLOT_FREE) {
            *freed_out = 1;
            return FL_OK;
        }
        if (st == FL_SLOT_READY || st == FL_SLOT_READING) { /* every piece DONE: no loader */
            if (!fl_atomic_cas_acq_rel_u32(&s->state, &w, free_w)) continue;
            fl_atomic_fetch_add_relaxed_u64(&h->n_released, 1);
            *freed_out = 1;
            return FL_OK;
        }
        if (st == FL_SLOT_QUEUED || st == FL_SLOT_FAILED) {
            uint32_t closing = FL_MAKE_STATE(FL_GEN_BITS(w), 0, FL_SLOT_CLOSING);
            if (!fl_atomic_cas_acq_rel_u32(&s->state, &w, closing)) continue;
            fl_atomic_fetch_add_relaxed_u64(&h->n_closing, 1);
            w = closing;
        } else if (st != FL_SLOT_CLOSING) {
            return FL_ESTATE;
        }
        fl_atomic_fence_seq_cst(); /* NOTE [pieces]: CLOSING stored, then the pieces read */
        settle(mem, slot, w, 0);
        *freed_out = FL_STATE_BITS(fl_atomic_load_acquire_u32(&s->state)) == FL_SLOT_FREE;
        return FL_OK;
    }
}

int fl_ring_give_back(void *mem, uint32_t slot, uint32_t worker_id, int reopen, uint32_t *n_out) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || n_out == NULL || worker_id >= FL_MAX_WORKERS) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    *n_out = 0;
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    uint32_t g = piece_gen(w), n = 0;
    fl_atomic_u64 *p = pieces_of(mem, slot);
    uint32_t hw = fl_atomic_load_acquire_u32(&s->hw);
    if (hw > h->max_pieces) hw = h->max_pieces;
    int reset = 0;
    for (uint32_t k = 0; k < hw; k++) {
        uint64_t v = fl_atomic_load_acquire_u64(&p[k]);
        if (v == 0 || FL_PIECE_OWNER(v) != worker_id) continue;
        uint32_t kind = FL_PIECE_KIND(v);
        if (kind != FL_PIECE_TAKEN && kind != FL_PIECE_GIVEN) continue;
        if (FL_PIECE_GEN(v) != g) { /* a stale cut it did not live to take back */
            fl_atomic_cas_acq_rel_u64(&p[k], &v, 0);
            continue;
        }
        if (!reset && reopen && fl_atomic_load_relaxed_u32(&s->share) == FL_SHARE_OFF) {
            /* a batch taken whole is loaded again from scratch: forget what it recorded */
            fl_atomic_store_relaxed_u32(&s->rows, fl_atomic_load_relaxed_u32(&s->count));
            fl_atomic_store_relaxed_u32(&s->flags, 0);
            fl_atomic_store_relaxed_u64(&s->var_bytes, 0);
            reset = 1;
        }
        uint64_t back = with_kind(v, reopen ? FL_PIECE_FREE : FL_PIECE_CLOSED, worker_id);
        if (fl_atomic_cas_acq_rel_u64(&p[k], &v, back)) {
            fl_atomic_store_relaxed_u64(&progress_of(mem, slot)[k], 0);
            n++;
        }
    }
    *n_out = n;
    if (n > 0) fl_atomic_fetch_add_relaxed_u64(&h->n_given_back, n);
    /* Settle even when nothing was given back: the worker may have died between its last
     * piece's DONE (or ERRORED) CAS and the settle that follows it in fl_ring_done
     * (fl_ring_fail), leaving a batch whose rows are all settled still QUEUED. */
    fl_atomic_fence_seq_cst();
    settle(mem, slot, w, worker_id);
    return FL_OK;
}

int fl_ring_stop(void *mem) {
    if (mem == NULL) return FL_EINVAL;
    fl_atomic_store_release_u32(&hdr_of(mem)->stop, 1);
    return FL_OK;
}

int fl_ring_stopped(const void *mem) {
    if (mem == NULL) return 1;
    return fl_atomic_load_acquire_u32(&((fl_header *)mem)->stop) != 0;
}

/* ---- workers --------------------------------------------------------------------------- */

/* What a worker could take in one slot, and how much it wants it (lower rank first). */
typedef struct candidate {
    uint32_t slot, state, rank, limit, unit;
    uint64_t seq;
    scan sc;
} candidate;

/* The rank of slot i for worker `me` (-1: nothing to take there). */
static int assess(void *mem, uint32_t i, uint32_t me, uint64_t oldest, candidate *c) {
    fl_slot_hdr *s = &slots_of(mem)[i];
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    if (FL_STATE_BITS(w) != FL_SLOT_QUEUED) return -1;
    uint32_t t = fl_atomic_load_relaxed_u32(&s->target);
    if (t != 0 && t != me + 1) return -1;
    uint32_t count = fl_atomic_load_relaxed_u32(&s->count);
    if (count == 0) return -1;
    uint32_t unit = fl_ring_unit(count), units = units_of(count, unit), limit = units;
    uint64_t err = fl_atomic_load_acquire_u64(&s->err);
    if (err != 0) { /* rows above the lowest error are not needed */
        uint32_t below = ERR_ROW(err) / unit + 1; /* units up to the one holding that row */
        if (below < limit) limit = below;
    }
    scan_pieces(mem, i, piece_gen(w), me, limit, &c->sc);
    int cut = c->sc.can_cut && c->sc.end < limit;
    if (c->sc.given_k < 0 && c->sc.free_k < 0 && !cut) return -1;
    uint64_t epoch = fl_atomic_load_relaxed_u64(&s->epoch);
    if (c->sc.given_k >= 0)
        c->rank = 0;
    else if (!c->sc.begun)
        c->rank = epoch == oldest ? 1 : 3;
    else
        c->rank = fl_atomic_load_relaxed_u32(&s->share) == FL_SHARE_ON ? 2 : 1;
    c->slot = i;
    c->state = w;
    c->limit = limit;
    c->unit = unit;
    c->seq = fl_atomic_load_relaxed_u64(&s->seq);
    return (int)c->rank;
}

/* Try to take a piece of candidate c. 1: taken (out filled); 0: lost a race. */
static int take_from(void *mem, const candidate *c, uint32_t me, uint32_t divisor,
                     uint32_t min_units, uint32_t pid, fl_take *out) {
    fl_header *h = hdr_of(mem);
    fl_slot_hdr *s = &slots_of(mem)[c->slot];
    fl_atomic_u64 *p = pieces_of(mem, c->slot);
    uint32_t g = piece_gen(c->state), k;
    uint64_t expected, want;
    if (c->sc.given_k >= 0 || c->sc.free_k >= 0) {
        k = (uint32_t)(c->sc.given_k >= 0 ? c->sc.given_k : c->sc.free_k);
        expected = fl_atomic_load_acquire_u64(&p[k]);
        uint32_t kind = FL_PIECE_KIND(expected);
        if (!is_piece(expected, g) || !(kind == FL_PIECE_FREE ||
                                        (kind == FL_PIECE_GIVEN && FL_PIECE_OWNER(expected) == me)))
            return 0;
        want = with_kind(expected, FL_PIECE_TAKEN, me);
    } else {
        k = c->sc.next;
        uint32_t left = c->limit - c->sc.end, n = left;
        if (fl_atomic_load_relaxed_u32(&s->share) == FL_SHARE_ON && k + 1 < h->max_pieces) {
            n = left / (divisor ? divisor : 1);
            if (n < min_units) n = min_units;
            if (n < 1) n = 1;
            if (n > left) n = left;
        }
        raise_hw(s, k);
        expected = c->sc.next_word;
        want = FL_MAKE_PIECE(FL_PIECE_TAKEN, me, g, c->sc.end, n);
    }
    if (!fl_atomic_cas_acq_rel_u64(&p[k], &expected, want)) return 0;
    fl_atomic_fence_seq_cst(); /* NOTE [pieces]: the piece stored, then the state read */
    uint32_t now = fl_atomic_load_acquire_u32(&s->state);
    if (now != c->state) { /* not the batch we read any more (retired, re-queued, settled) */
        uint64_t mine = want;
        if (FL_GEN_BITS(now) != FL_GEN_BITS(c->state)) {
            fl_atomic_cas_acq_rel_u64(&p[k], &mine, 0); /* a stale cut: undo it */
        } else {
            fl_atomic_cas_acq_rel_u64(&p[k], &mine, with_kind(want, FL_PIECE_FREE, me));
            fl_atomic_fence_seq_cst();
            settle(mem, c->slot, c->state, me); /* we may be the last loader of a CLOSING one */
        }
        return 0;
    }
    uint32_t count = fl_atomic_load_relaxed_u32(&s->count);
    uint64_t first = (uint64_t)FL_PIECE_FIRST(want) * c->unit;
    uint64_t n = (uint64_t)FL_PIECE_N(want) * c->unit;
    if (first >= count) n = 0;
    else if (n > count - first) n = count - first;
    fl_atomic_store_relaxed_u64(&progress_of(mem, c->slot)[k], (uint64_t)pid << 32);
    fl_atomic_fetch_add_relaxed_u64(&h->n_taken, 1);
    out->slot = c->slot;
    out->state = c->state;
    out->piece = k;
    out->first = (uint32_t)first;
    out->n = (uint32_t)n;
    out->count = count;
    out->shared = fl_atomic_load_relaxed_u32(&s->share) == FL_SHARE_ON;
    out->seq = fl_atomic_load_relaxed_u64(&s->seq);
    out->epoch = fl_atomic_load_relaxed_u64(&s->epoch);
    return 1;
}

int fl_ring_take(void *mem, uint32_t worker_id, uint32_t divisor, uint32_t min_units,
                 uint32_t pid, fl_take *out) {
    if (mem == NULL || out == NULL || worker_id >= FL_MAX_WORKERS) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    fl_slot_hdr *slots = slots_of(mem);
    for (int round = 0; round < FL_TAKE_ROUNDS; round++) {
        if (fl_atomic_load_acquire_u32(&h->stop)) return FL_ESTOPPED;
        uint64_t oldest = UINT64_MAX; /* the oldest epoch queued (a preference, read racily) */
        for (uint32_t i = 0; i < h->nslots; i++) {
            uint32_t w = fl_atomic_load_acquire_u32(&slots[i].state);
            if (FL_STATE_BITS(w) != FL_SLOT_QUEUED) continue;
            uint64_t e = fl_atomic_load_relaxed_u64(&slots[i].epoch);
            if (e < oldest) oldest = e;
        }
        if (oldest == UINT64_MAX) return FL_ETIMEOUT;
        candidate best, c;
        memset(&best, 0, sizeof best);
        int have = 0;
        for (uint32_t i = 0; i < h->nslots; i++) {
            if (assess(mem, i, worker_id, oldest, &c) < 0) continue;
            if (have && (c.rank > best.rank || (c.rank == best.rank && c.seq >= best.seq)))
                continue;
            best = c;
            have = 1;
        }
        if (!have) return FL_ETIMEOUT;
        if (take_from(mem, &best, worker_id, divisor, min_units, pid, out)) return FL_OK;
    }
    return FL_ETIMEOUT; /* lost every race: others took the work */
}

/* The entry of take `t`, if it is still worker `me`'s TAKEN piece (else 0). */
static uint64_t own_piece(void *mem, const fl_take *t, uint32_t me) {
    fl_slot_hdr *s = fl_ring_slot(mem, t->slot);
    if (s == NULL || t->piece >= hdr_of(mem)->max_pieces) return 0;
    uint64_t v = fl_atomic_load_acquire_u64(&pieces_of(mem, t->slot)[t->piece]);
    if (!is_piece(v, piece_gen(t->state)) || FL_PIECE_KIND(v) != FL_PIECE_TAKEN ||
        FL_PIECE_OWNER(v) != me)
        return 0;
    return v;
}

int fl_ring_progress(void *mem, uint32_t slot, uint32_t piece, uint32_t rows, uint32_t pid) {
    if (fl_ring_slot(mem, slot) == NULL || piece >= hdr_of(mem)->max_pieces) return FL_EINVAL;
    fl_atomic_store_relaxed_u64(&progress_of(mem, slot)[piece], (uint64_t)pid << 32 | rows);
    return FL_OK;
}

int fl_ring_done(void *mem, const fl_take *t, uint32_t worker_id, int *published_out) {
    if (mem == NULL || t == NULL || published_out == NULL || worker_id >= FL_MAX_WORKERS)
        return FL_EINVAL;
    *published_out = 0;
    uint64_t v = own_piece(mem, t, worker_id);
    if (v == 0) return FL_ESTATE;
    if (!fl_atomic_cas_acq_rel_u64(&pieces_of(mem, t->slot)[t->piece], &v,
                                   with_kind(v, FL_PIECE_DONE, worker_id)))
        return FL_ESTATE;
    fl_atomic_fence_seq_cst(); /* NOTE [pieces]: the piece stored, then the state read */
    *published_out = settle(mem, t->slot, t->state, worker_id);
    return FL_OK;
}

int fl_ring_fail(void *mem, const fl_take *t, uint32_t worker_id, uint32_t row,
                 int *published_out) {
    if (mem == NULL || t == NULL || published_out == NULL || worker_id >= FL_MAX_WORKERS)
        return FL_EINVAL;
    *published_out = 0;
    uint64_t v = own_piece(mem, t, worker_id);
    if (v == 0) return FL_ESTATE;
    if (row < t->first || row - t->first >= t->n) return FL_ERANGE;
    fl_slot_hdr *s = &slots_of(mem)[t->slot];
    fl_atomic_u64 *prog = &progress_of(mem, t->slot)[t->piece];
    uint64_t pid = fl_atomic_load_relaxed_u64(prog) >> 32;
    fl_atomic_store_relaxed_u64(prog, pid << 32 | (row - t->first));
    uint64_t mine = ((uint64_t)row + 1) << 12 | worker_id;
    uint64_t cur = fl_atomic_load_acquire_u64(&s->err);
    while ((cur == 0 || ERR_ROW(cur) > row) && !fl_atomic_cas_acq_rel_u64(&s->err, &cur, mine)) {
    }
    if (!fl_atomic_cas_acq_rel_u64(&pieces_of(mem, t->slot)[t->piece], &v,
                                   with_kind(v, FL_PIECE_ERRORED, worker_id)))
        return FL_ESTATE;
    fl_atomic_fence_seq_cst();
    *published_out = settle(mem, t->slot, t->state, worker_id);
    return FL_OK;
}

int fl_ring_set_rows(void *mem, uint32_t slot, uint32_t rows) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL) return FL_EINVAL;
    if (rows > fl_atomic_load_relaxed_u32(&s->count)) return FL_ERANGE;
    fl_atomic_store_relaxed_u32(&s->rows, rows); /* published by the release in fl_ring_done */
    return FL_OK;
}

int fl_ring_set_result(void *mem, uint32_t slot, uint32_t flags, uint64_t var_bytes) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL) return FL_EINVAL;
    fl_atomic_store_relaxed_u32(&s->flags, flags);
    fl_atomic_store_relaxed_u64(&s->var_bytes, var_bytes);
    return FL_OK;
}

/* ---- reading --------------------------------------------------------------------------- */

int fl_ring_pieces(const void *mem, uint32_t slot, fl_piece_info *out, uint32_t cap,
                   uint32_t *n_out) {
    void *m = (void *)mem;
    fl_slot_hdr *s = fl_ring_slot(m, slot);
    if (s == NULL || n_out == NULL || (cap > 0 && out == NULL)) return FL_EINVAL;
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    uint32_t g = piece_gen(w), count = fl_atomic_load_relaxed_u32(&s->count);
    uint32_t unit = fl_ring_unit(count), n = 0;
    fl_atomic_u64 *p = pieces_of(m, slot), *prog = progress_of(m, slot);
    for (uint32_t k = 0; k < hdr_of(m)->max_pieces; k++) {
        uint64_t v = fl_atomic_load_acquire_u64(&p[k]);
        if (!is_piece(v, g)) break;
        if (n < cap) {
            uint64_t first = (uint64_t)FL_PIECE_FIRST(v) * unit;
            uint64_t rows = (uint64_t)FL_PIECE_N(v) * unit;
            if (first >= count) rows = 0;
            else if (rows > count - first) rows = count - first;
            uint64_t pr = fl_atomic_load_relaxed_u64(&prog[k]);
            out[n].kind = FL_PIECE_KIND(v);
            out[n].owner = FL_PIECE_OWNER(v);
            out[n].first = (uint32_t)first;
            out[n].n = (uint32_t)rows;
            out[n].done = (uint32_t)pr;
            out[n].pid = (uint32_t)(pr >> 32);
        }
        n++;
    }
    *n_out = n;
    return FL_OK;
}

int fl_ring_slot_info(const void *mem, uint32_t slot, fl_slot_info *out) {
    void *m = (void *)mem;
    fl_slot_hdr *s = fl_ring_slot(m, slot);
    if (s == NULL || out == NULL) return FL_EINVAL;
    out->state = fl_atomic_load_acquire_u32(&s->state);
    out->seq = fl_atomic_load_relaxed_u64(&s->seq);
    out->count = fl_atomic_load_relaxed_u32(&s->count);
    out->epoch = fl_atomic_load_relaxed_u64(&s->epoch);
    uint32_t t = fl_atomic_load_relaxed_u32(&s->target);
    out->target = t == 0 ? FL_TARGET_ANY : t - 1;
    out->rows = fl_atomic_load_relaxed_u32(&s->rows);
    out->flags = fl_atomic_load_relaxed_u32(&s->flags);
    out->var_bytes = fl_atomic_load_relaxed_u64(&s->var_bytes);
    out->share = fl_atomic_load_relaxed_u32(&s->share);
    uint64_t err = fl_atomic_load_acquire_u64(&s->err);
    out->err_row = err ? ERR_ROW(err) : UINT32_MAX;
    out->err_owner = err ? ERR_OWNER(err) : 0;
    out->pid = 0;
    /* The process behind the result: the loader of a batch taken whole, or the one whose row
     * raised first (its error is in its pipe). */
    uint32_t g = piece_gen(out->state), unit = fl_ring_unit(out->count);
    fl_atomic_u64 *p = pieces_of(m, slot), *prog = progress_of(m, slot);
    for (uint32_t k = 0; k < hdr_of(m)->max_pieces; k++) {
        uint64_t v = fl_atomic_load_acquire_u64(&p[k]);
        if (!is_piece(v, g)) break;
        uint64_t first = (uint64_t)FL_PIECE_FIRST(v) * unit;
        uint64_t end = first + (uint64_t)FL_PIECE_N(v) * unit;
        int mine = err ? (FL_PIECE_KIND(v) == FL_PIECE_ERRORED && FL_PIECE_OWNER(v) == ERR_OWNER(err) &&
                          first <= ERR_ROW(err) && ERR_ROW(err) < end)
                       : k == 0;
        if (mine) {
            out->pid = (uint32_t)(fl_atomic_load_relaxed_u64(&prog[k]) >> 32);
            break;
        }
    }
    return FL_OK;
}
