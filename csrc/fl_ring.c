/* fl_ring.c: the lock-free slot state machine (see fl_ring.h and fl_layout.h).
 * Every sleep and wake-up goes through the two halves of NOTE [sleeping without lost wake-ups]
 * in fl_wait.h. */
#include "fl_ring.h"

#include <string.h>

#include "fl_wait.h"

#define FL_SPIN_ROUNDS 64

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

/* Shared batches (NOTE [shared rows], below). */
static fl_atomic_u32 *rows_of(void *mem, uint32_t slot);
static void close_free_rows(fl_atomic_u32 *rows, uint32_t count);
static uint32_t count_taken(fl_atomic_u32 *rows, uint32_t count);
FL_INLINE void ring_row_bell(void *mem, uint32_t slot);

FL_INLINE fl_slot_hdr *slots_of(void *mem) {
    return (fl_slot_hdr *)((char *)mem + hdr_of(mem)->header_bytes);
}

/* Row table of a slot: FL_META_WORDS words of meta (one cache line), then max_rows row words,
 * padded to a cache line. */
#define FL_META_WORDS (FL_CACHELINE / 4u)
#define FL_META_HINT 0    /* no FREE row below it (a hint: lowered when rows are given back) */
#define FL_META_FAILER 1  /* worker + 1 failing the batch (FL_SHARE_FAILING) */
#define FL_META_BELL 2    /* bumped when rows are done or given back (the failer sleeps on it) */

FL_INLINE size_t row_stride(uint32_t max_rows) { /* in 32-bit words */
    return FL_META_WORDS + (((size_t)max_rows + FL_META_WORDS - 1) & ~(size_t)(FL_META_WORDS - 1));
}

size_t fl_ring_nbytes_rows(uint32_t nslots, uint32_t max_rows) {
    if (nslots == 0 || nslots > FL_MAX_SLOTS || max_rows > FL_MAX_SHARED_ROWS) return 0;
    size_t n = sizeof(fl_header) + (size_t)nslots * sizeof(fl_slot_hdr);
    if (max_rows > 0) n += (size_t)nslots * row_stride(max_rows) * sizeof(uint32_t);
    return n;
}

size_t fl_ring_nbytes(uint32_t nslots) { return fl_ring_nbytes_rows(nslots, 0); }

int fl_ring_init(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                 uint64_t data_offset, int64_t creator_pid) {
    return fl_ring_init_rows(mem, total_bytes, nslots, slot_bytes, data_offset, creator_pid, 0);
}

int fl_ring_init_rows(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                      uint64_t data_offset, int64_t creator_pid, uint32_t max_rows) {
    if (mem == NULL || ((uintptr_t)mem % FL_CACHELINE) != 0) return FL_EINVAL;
    size_t ctl = fl_ring_nbytes_rows(nslots, max_rows);
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
    h->max_rows = max_rows;
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
    size_t ctl = fl_ring_nbytes_rows(h->nslots, h->max_rows);
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

int fl_ring_queue(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count) {
    return fl_ring_queue_to(mem, slot, seq, epoch, count, FL_TARGET_ANY);
}

/* FREE (state word w) -> QUEUED: the task's fields, then the release store of the state word
 * that publishes them, then a wake-up of `wake` sleeping workers (-1: all). Fields are atomic:
 * workers read count, epoch, seq, target and share on slots they have not claimed. */
static void queue_task(fl_header *h, fl_slot_hdr *s, uint32_t w, uint64_t seq, uint64_t epoch,
                       uint32_t count, uint32_t target_word, uint32_t share, int wake) {
    fl_atomic_store_release_u32(&s->count, count); /* after the slot left its old state */
    fl_atomic_store_relaxed_u64(&s->epoch, epoch);
    fl_atomic_store_relaxed_u32(&s->target, target_word);
    fl_atomic_store_relaxed_u32(&s->rows, count);
    fl_atomic_store_relaxed_u32(&s->flags, 0);
    fl_atomic_store_relaxed_u64(&s->var_bytes, 0);
    fl_atomic_store_relaxed_u64(&s->seq, seq);
    fl_atomic_store_relaxed_u64(&s->progress, 0);
    fl_atomic_store_relaxed_u32(&s->pid, 0);
    fl_atomic_store_relaxed_u32(&s->share, share);
    fl_atomic_store_release_u32(&s->state, FL_MAKE_STATE(FL_GEN_BITS(w) + 1, 0, FL_SLOT_QUEUED));
    fl_atomic_fetch_add_relaxed_u64(&h->n_queued, 1);
    fl_atomic_fetch_add_acq_rel_u32(&h->queued_counter, 1);
    fl_wake_if_waiting(&h->queued_counter, &h->task_waiters, wake, &h->n_futex_wakes);
}

int fl_ring_queue_to(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count,
                     uint32_t target) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || (target != FL_TARGET_ANY && target >= FL_MAX_WORKERS)) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    if (FL_STATE_BITS(w) != FL_SLOT_FREE) return FL_ESTATE;
    queue_task(h, s, w, seq, epoch, count, target == FL_TARGET_ANY ? 0 : target + 1,
               FL_SHARE_OFF, target == FL_TARGET_ANY ? 1 : -1);
    return FL_OK;
}

/* One pass over the slots: claim the QUEUED slot with the lowest seq. 1 = claimed. */
static int try_claim(void *mem, uint32_t worker_id, uint32_t *slot_out, uint32_t *state_out) {
    fl_header *h = hdr_of(mem);
    fl_slot_hdr *slots = slots_of(mem);
    uint32_t n = h->nslots;
    for (;;) {
        uint32_t best = UINT32_MAX, best_w = 0;
        uint64_t best_seq = UINT64_MAX;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t w = fl_atomic_load_acquire_u32(&slots[i].state);
            if (FL_STATE_BITS(w) != FL_SLOT_QUEUED) continue;
            if (fl_atomic_load_relaxed_u32(&slots[i].share) != FL_SHARE_OFF) continue;
            /* A stale target (the slot re-queued since w was read) is harmless: the CAS below
             * fails on the generation. */
            uint32_t t = fl_atomic_load_relaxed_u32(&slots[i].target);
            if (t != 0 && t != worker_id + 1) continue;
            uint64_t seq = fl_atomic_load_relaxed_u64(&slots[i].seq);
            if (best == UINT32_MAX || seq < best_seq) {
                best_seq = seq;
                best = i;
                best_w = w;
            }
        }
        if (best == UINT32_MAX) return 0;
        uint32_t want = FL_MAKE_STATE(FL_GEN_BITS(best_w), worker_id, FL_SLOT_CLAIMED);
        uint32_t expected = best_w;
        if (fl_atomic_cas_acq_rel_u32(&slots[best].state, &expected, want)) {
            fl_atomic_fetch_add_relaxed_u64(&h->n_claimed, 1);
            *slot_out = best;
            *state_out = want;
            return 1;
        }
        /* Lost the race for that slot (another worker, or the parent cancelled it): rescan. */
    }
}

int fl_ring_claim(void *mem, uint32_t worker_id, int64_t timeout_ns, uint32_t *slot_out,
                  uint32_t *state_out) {
    if (mem == NULL || slot_out == NULL || state_out == NULL || worker_id > FL_MAX_WORKERS)
        return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    int64_t deadline = deadline_after(timeout_ns);
    int spins = 0;
    for (;;) {
        if (fl_atomic_load_acquire_u32(&h->stop)) return FL_ESTOPPED;
        uint32_t c = fl_atomic_load_acquire_u32(&h->queued_counter);
        if (try_claim(mem, worker_id, slot_out, state_out)) return FL_OK;
        int64_t left = deadline - fl_now_ns();
        if (left <= 0) return FL_ETIMEOUT;
        if (spins < FL_SPIN_ROUNDS) {
            spins++;
            fl_cpu_relax();
            continue;
        }
        fl_sleep_unless_changed(&h->queued_counter, c, &h->task_waiters, &h->stop, left,
                                &h->n_futex_waits);
    }
}

int fl_ring_publish(void *mem, uint32_t slot, uint32_t claimed_state, int ok) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL) return FL_EINVAL;
    if (FL_STATE_BITS(claimed_state) != FL_SLOT_CLAIMED) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    uint32_t expected = claimed_state;
    uint32_t want = FL_MAKE_STATE(FL_GEN_BITS(claimed_state), FL_OWNER_BITS(claimed_state),
                                  ok ? FL_SLOT_READY : FL_SLOT_FAILED);
    if (!fl_atomic_cas_acq_rel_u32(&s->state, &expected, want)) return FL_ESTATE;
    fl_atomic_fetch_add_relaxed_u64(&h->n_published, 1);
    fl_wake_if_waiting(&s->state, &h->ready_waiters, -1, &h->n_futex_wakes);
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
        uint32_t st = FL_STATE_BITS(w);
        *state_out = w;
        if (st != FL_SLOT_QUEUED && st != FL_SLOT_CLAIMED) return FL_OK;
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

int fl_ring_release(void *mem, uint32_t slot) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL) return FL_EINVAL;
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    uint32_t st = FL_STATE_BITS(w);
    if (st != FL_SLOT_READING && st != FL_SLOT_READY && st != FL_SLOT_FAILED) return FL_ESTATE;
    if (!fl_atomic_cas_acq_rel_u32(&s->state, &w, FL_MAKE_STATE(FL_GEN_BITS(w), 0, FL_SLOT_FREE)))
        return FL_ESTATE;
    fl_atomic_fetch_add_relaxed_u64(&hdr_of(mem)->n_released, 1);
    return FL_OK;
}

int fl_ring_cancel(void *mem, uint32_t slot, int *cancelled_out) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || cancelled_out == NULL) return FL_EINVAL;
    *cancelled_out = 0;
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    if (FL_STATE_BITS(w) != FL_SLOT_QUEUED) return FL_OK;
    uint32_t sh = fl_atomic_load_acquire_u32(&s->share);
    if (sh != FL_SHARE_OFF) { /* NOTE [shared rows]: stop takers, then wait for loaders */
        uint32_t on = FL_SHARE_ON;
        if (sh == FL_SHARE_ON && fl_atomic_cas_acq_rel_u32(&s->share, &on, FL_SHARE_CANCELLED))
            sh = FL_SHARE_CANCELLED;
        else if (sh == FL_SHARE_ON)
            sh = on;
        if (sh != FL_SHARE_CANCELLED) return FL_OK; /* failing: its worker publishes FAILED */
        uint32_t count = fl_atomic_load_relaxed_u32(&s->count);
        if (count > hdr_of(mem)->max_rows) return FL_EINVAL;
        fl_atomic_u32 *rows = rows_of(mem, slot);
        close_free_rows(rows, count);
        if (count_taken(rows, count) > 0) return FL_OK; /* freed by a later cancel (reap) */
    }
    if (fl_atomic_cas_acq_rel_u32(&s->state, &w, FL_MAKE_STATE(FL_GEN_BITS(w), 0, FL_SLOT_FREE))) {
        *cancelled_out = 1;
        fl_atomic_fetch_add_relaxed_u64(&hdr_of(mem)->n_cancelled, 1);
    }
    return FL_OK;
}

/* A slot taken back from a dead worker is loaded again from scratch: what that worker may have
 * recorded of its result is forgotten (published by the CAS that re-queues the slot). */
static void reset_result(fl_slot_hdr *s) {
    fl_atomic_store_relaxed_u64(&s->progress, 0);
    fl_atomic_store_relaxed_u32(&s->rows, s->count);
    fl_atomic_store_relaxed_u32(&s->flags, 0);
    fl_atomic_store_relaxed_u64(&s->var_bytes, 0);
}

int fl_ring_reclaim(void *mem, uint32_t worker_id, uint32_t *count_out) {
    if (mem == NULL || count_out == NULL || worker_id > FL_MAX_WORKERS) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    fl_slot_hdr *slots = slots_of(mem);
    uint32_t n = 0;
    for (uint32_t i = 0; i < h->nslots; i++) {
        uint32_t w = fl_atomic_load_acquire_u32(&slots[i].state);
        if (FL_STATE_BITS(w) != FL_SLOT_CLAIMED || FL_OWNER_BITS(w) != worker_id) continue;
        reset_result(&slots[i]);
        uint32_t want = FL_MAKE_STATE(FL_GEN_BITS(w) + 1, 0, FL_SLOT_QUEUED);
        if (fl_atomic_cas_acq_rel_u32(&slots[i].state, &w, want)) n++;
    }
    *count_out = n;
    if (n > 0) {
        fl_atomic_fetch_add_relaxed_u64(&h->n_reclaimed, n);
        fl_atomic_fetch_add_acq_rel_u32(&h->queued_counter, 1);
        fl_wake_if_waiting(&h->queued_counter, &h->task_waiters, -1, NULL);
    }
    return FL_OK;
}

int fl_ring_reclaim_slot(void *mem, uint32_t slot, uint32_t worker_id, int requeue, int *done_out) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || done_out == NULL || worker_id > FL_MAX_WORKERS) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    *done_out = 0;
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    if (FL_STATE_BITS(w) != FL_SLOT_CLAIMED || FL_OWNER_BITS(w) != worker_id) return FL_OK;
    reset_result(s);
    uint32_t want = requeue ? FL_MAKE_STATE(FL_GEN_BITS(w) + 1, 0, FL_SLOT_QUEUED)
                            : FL_MAKE_STATE(FL_GEN_BITS(w) + 1, 0, FL_SLOT_FREE);
    if (!fl_atomic_cas_acq_rel_u32(&s->state, &w, want)) return FL_OK;
    *done_out = 1;
    fl_atomic_fetch_add_relaxed_u64(&h->n_reclaimed, 1);
    if (requeue) {
        fl_atomic_fetch_add_acq_rel_u32(&h->queued_counter, 1);
        fl_wake_if_waiting(&h->queued_counter, &h->task_waiters,
                           fl_atomic_load_relaxed_u32(&s->target) ? -1 : 1, NULL);
    }
    return FL_OK;
}

int fl_ring_stop(void *mem) {
    if (mem == NULL) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    fl_atomic_store_release_u32(&h->stop, 1);
    fl_atomic_fetch_add_acq_rel_u32(&h->queued_counter, 1);
    fl_wake_if_waiting(&h->queued_counter, &h->task_waiters, -1, NULL);
    /* and the failers asleep in fl_ring_rows_settle, each on its batch's row bell */
    for (uint32_t i = 0; h->max_rows > 0 && i < h->nslots; i++) ring_row_bell(mem, i);
    return FL_OK;
}

int fl_ring_stopped(const void *mem) {
    if (mem == NULL) return 1;
    return fl_atomic_load_acquire_u32(&((fl_header *)mem)->stop) != 0;
}

int fl_ring_set_progress(void *mem, uint32_t slot, uint64_t rows, uint32_t pid) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL) return FL_EINVAL;
    fl_atomic_store_relaxed_u64(&s->progress, rows);
    fl_atomic_store_relaxed_u32(&s->pid, pid);
    return FL_OK;
}

int fl_ring_set_rows(void *mem, uint32_t slot, uint32_t rows) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL) return FL_EINVAL;
    if (rows > s->count) return FL_ERANGE;
    fl_atomic_store_relaxed_u32(&s->rows, rows); /* published by fl_ring_publish's release */
    return FL_OK;
}

int fl_ring_set_result(void *mem, uint32_t slot, uint32_t flags, uint64_t var_bytes) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL) return FL_EINVAL;
    /* Relaxed: published to the parent by the release CAS in fl_ring_publish; atomic because
     * fl_ring_slot_info may read them concurrently for an error message. */
    fl_atomic_store_relaxed_u32(&s->flags, flags);
    fl_atomic_store_relaxed_u64(&s->var_bytes, var_bytes);
    return FL_OK;
}

int fl_ring_slot_info(const void *mem, uint32_t slot, fl_slot_info *out) {
    fl_slot_hdr *s = fl_ring_slot((void *)mem, slot);
    if (s == NULL || out == NULL) return FL_EINVAL;
    out->state = fl_atomic_load_acquire_u32(&s->state);
    out->seq = fl_atomic_load_relaxed_u64(&s->seq);
    out->progress = fl_atomic_load_relaxed_u64(&s->progress);
    out->pid = fl_atomic_load_relaxed_u32(&s->pid);
    /* The rest is only stable while the caller owns the slot (parent: READY/READING). */
    out->count = fl_atomic_load_relaxed_u32(&s->count); /* a worker reads a shared slot's */
    out->epoch = fl_atomic_load_relaxed_u64(&s->epoch);
    uint32_t t = fl_atomic_load_relaxed_u32(&s->target);
    out->target = t == 0 ? FL_TARGET_ANY : t - 1;
    out->rows = fl_atomic_load_relaxed_u32(&s->rows);
    out->flags = fl_atomic_load_relaxed_u32(&s->flags);
    out->var_bytes = fl_atomic_load_relaxed_u64(&s->var_bytes);
    return FL_OK;
}

/* NOTE [shared rows]
 * A shared batch is loaded by any number of workers at once, a few rows each: so the first batch
 * of an epoch, and its last ones, do not wait for one worker while the others idle (torch's
 * DataLoader has that problem: pytorch/pytorch#19836). Its slot has a row table (one 32-bit word
 * per row: FREE, taken by worker k as k + 1, DONE, ERRORED or CLOSED), and every step of a batch is
 * one CAS on one of those words, so a worker killed at any instant leaves nothing half-done:
 *   - a worker takes FREE rows (fl_ring_take_rows: CAS FREE -> k + 1), loads them into the slot,
 *     and marks them DONE; the one whose DONE makes every row DONE publishes the batch READY.
 *     Nobody owns the batch, so there is no owner to lose.
 *   - a dead worker's rows are given back by the parent (fl_ring_reset_rows): FREE again, loaded
 *     by another worker; rows it had marked DONE are in the slot already. If it died after its
 *     last DONE and before publishing, the parent publishes.
 *   - a row that raises is ERRORED; the first worker to fail a row (a CAS of share ON -> FAILING)
 *     closes the FREE rows, waits until nobody loads a row of the batch (fl_ring_rows_settle),
 *     and publishes it FAILED with its error; later failures just give their rows back.
 *   - the parent cancels a batch by a CAS of share ON -> CANCELLED, closing its FREE rows; the
 *     slot becomes FREE only when no row is being loaded (a later fl_ring_cancel, from reap).
 * A slot is therefore reused (re-queued, its rows FREE again) only once no worker writes into it:
 * READY means every row is DONE, FAILED comes after settling, and a cancel waits for loaders. A
 * worker that saw an older state of the slot takes rows and then checks the state word and share
 * again (same generation, still ON), giving the rows back otherwise: it never loads a row of a
 * batch it did not read.
 * The Python layer (fastload/_engine.py, _queue) shares the first batch of an epoch, its last
 * 2 x num_workers (where workers would wait for one of them) and the batches queued ahead for
 * the next pass; the others are queued whole (fl_ring_queue), as the per-row CASes cost a batch
 * of tiny samples ~5%. Workers claim whole batches first, then take rows, and take a batch
 * quicker than 20 ms to load in one piece (fastload/_worker.py). */

FL_INLINE fl_atomic_u32 *meta_of(void *mem, uint32_t slot) {
    fl_header *h = hdr_of(mem);
    char *base = (char *)mem + h->header_bytes + (size_t)h->nslots * sizeof(fl_slot_hdr);
    return (fl_atomic_u32 *)(base + (size_t)slot * row_stride(h->max_rows) * sizeof(uint32_t));
}

static fl_atomic_u32 *rows_of(void *mem, uint32_t slot) {
    return meta_of(mem, slot) + FL_META_WORDS;
}

FL_INLINE int row_taken(uint32_t v) { return v != FL_ROW_FREE && v <= FL_MAX_WORKERS; }
FL_INLINE int row_given(uint32_t v) {
    return (v & ~(uint32_t)0xFFFu) == FL_ROW_GIVEN && (v & 0xFFFu) != 0;
}

/* A slot that is a shared batch in state `state` now (count: its rows, read atomically). */
static fl_slot_hdr *shared_slot(void *mem, uint32_t slot, uint32_t state, uint32_t *count_out) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || hdr_of(mem)->max_rows == 0) return NULL;
    if (fl_atomic_load_acquire_u32(&s->state) != state) return NULL;
    uint32_t count = fl_atomic_load_acquire_u32(&s->count);
    /* The slot may be queued again right after the check above (a worker that read the batch
     * has not taken a row yet): count is stored (release) after the slot left `state`, so read
     * the state again to know that this count is that batch's. */
    if (fl_atomic_load_relaxed_u32(&s->state) != state) return NULL;
    if (count == 0 || count > hdr_of(mem)->max_rows) return NULL;
    *count_out = count;
    return s;
}

FL_INLINE void ring_row_bell(void *mem, uint32_t slot) {
    fl_atomic_u32 *bell = &meta_of(mem, slot)[FL_META_BELL];
    fl_atomic_fetch_add_acq_rel_u32(bell, 1);
    fl_wake_if_waiting(bell, &hdr_of(mem)->row_waiters, -1, NULL);
}

/* FREE rows, and rows given to a worker that has not taken them yet, -> CLOSED. */
static void close_free_rows(fl_atomic_u32 *rows, uint32_t count) {
    for (uint32_t r = 0; r < count; r++) {
        uint32_t v = fl_atomic_load_relaxed_u32(&rows[r]);
        if (v == FL_ROW_FREE || row_given(v)) fl_atomic_cas_acq_rel_u32(&rows[r], &v, FL_ROW_CLOSED);
    }
}

static uint32_t count_taken(fl_atomic_u32 *rows, uint32_t count) {
    uint32_t busy = 0;
    for (uint32_t r = 0; r < count; r++)
        if (row_taken(fl_atomic_load_acquire_u32(&rows[r]))) busy++;
    return busy;
}

static int all_done(fl_atomic_u32 *rows, uint32_t count) {
    for (uint32_t r = 0; r < count; r++)
        if (fl_atomic_load_acquire_u32(&rows[r]) != FL_ROW_DONE) return 0;
    return 1;
}

/* QUEUED (state) -> READY or FAILED with `owner` as the publisher; wakes the parent. */
static int publish_shared(void *mem, fl_slot_hdr *s, uint32_t state, uint32_t owner, int ok) {
    uint32_t expected = state;
    uint32_t want = FL_MAKE_STATE(FL_GEN_BITS(state), owner, ok ? FL_SLOT_READY : FL_SLOT_FAILED);
    if (!fl_atomic_cas_acq_rel_u32(&s->state, &expected, want)) return 0;
    fl_header *h = hdr_of(mem);
    fl_atomic_fetch_add_relaxed_u64(&h->n_published, 1);
    fl_wake_if_waiting(&s->state, &h->ready_waiters, -1, &h->n_futex_wakes);
    return 1;
}

int fl_ring_queue_shared(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count) {
    return fl_ring_queue_shared_to(mem, slot, seq, epoch, count, NULL, 0);
}

int fl_ring_queue_shared_to(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch,
                            uint32_t count, const uint32_t *owners, uint32_t nowners) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    fl_header *h = hdr_of(mem);
    if (s == NULL || count == 0 || count > h->max_rows || nowners > count) return FL_EINVAL;
    if (nowners > 0 && owners == NULL) return FL_EINVAL;
    for (uint32_t r = 0; r < nowners; r++)
        if (owners[r] != FL_TARGET_ANY && owners[r] >= FL_MAX_WORKERS) return FL_EINVAL;
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    if (FL_STATE_BITS(w) != FL_SLOT_FREE) return FL_ESTATE;
    fl_atomic_u32 *meta = meta_of(mem, slot), *rows = meta + FL_META_WORDS;
    /* Nobody loads a row of a FREE slot (NOTE [shared rows]); a worker with an older view that
     * takes one of these rows gives it back when it sees the new state word. */
    for (uint32_t r = 0; r < count; r++) {
        uint32_t v = r < nowners && owners[r] != FL_TARGET_ANY ? FL_ROW_GIVEN | (owners[r] + 1)
                                                                : FL_ROW_FREE;
        fl_atomic_store_relaxed_u32(&rows[r], v);
    }
    fl_atomic_store_relaxed_u32(&meta[FL_META_HINT], 0);
    fl_atomic_store_relaxed_u32(&meta[FL_META_FAILER], 0);
    queue_task(h, s, w, seq, epoch, count, 0, FL_SHARE_ON, -1);
    return FL_OK;
}

/* The first FREE row at or after `from`, else before it; count if none. */
static uint32_t first_free(fl_atomic_u32 *rows, uint32_t count, uint32_t from) {
    if (from > count) from = count;
    for (uint32_t r = from; r < count; r++)
        if (fl_atomic_load_relaxed_u32(&rows[r]) == FL_ROW_FREE) return r;
    for (uint32_t r = 0; r < from; r++) /* the hint is only a hint */
        if (fl_atomic_load_relaxed_u32(&rows[r]) == FL_ROW_FREE) return r;
    return count;
}

int fl_ring_find_rows(void *mem, uint32_t *slot_out, uint32_t *state_out) {
    return fl_ring_find_rows_for(mem, FL_TARGET_ANY, slot_out, state_out);
}

/* Whether no row of `rows` has been taken, loaded or closed yet (a batch nobody works on). */
static int untouched(fl_atomic_u32 *rows, uint32_t count) {
    for (uint32_t r = 0; r < count; r++) {
        uint32_t v = fl_atomic_load_relaxed_u32(&rows[r]);
        if (v != FL_ROW_FREE && !row_given(v)) return 0;
    }
    return 1;
}

/* Whether a row of `rows` is given to `worker_id` (never FL_TARGET_ANY). */
static int has_own_row(fl_atomic_u32 *rows, uint32_t count, uint32_t worker_id) {
    if (worker_id >= FL_MAX_WORKERS) return 0;
    for (uint32_t r = 0; r < count; r++)
        if (fl_atomic_load_relaxed_u32(&rows[r]) == (FL_ROW_GIVEN | (worker_id + 1))) return 1;
    return 0;
}

int fl_ring_find_rows_for(void *mem, uint32_t worker_id, uint32_t *slot_out,
                          uint32_t *state_out) {
    if (mem == NULL || slot_out == NULL || state_out == NULL) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    if (h->max_rows == 0) return FL_ETIMEOUT;
    /* Preference: a batch with a row given to this worker; then one of the oldest epoch that
     * nobody works on yet (so that each worker fills batches of its own while there are
     * enough); then the oldest with rows left (helping: NOTE [shared rows]); then a batch of a
     * later epoch (queued ahead) that nobody works on. The lowest seq within each. */
    fl_slot_hdr *slots = slots_of(mem);
    uint64_t oldest = UINT64_MAX; /* epoch (informative field, read racily: a preference) */
    for (uint32_t i = 0; i < h->nslots; i++) {
        uint32_t w = fl_atomic_load_acquire_u32(&slots[i].state);
        if (FL_STATE_BITS(w) == FL_SLOT_QUEUED &&
            fl_atomic_load_relaxed_u32(&slots[i].share) == FL_SHARE_ON) {
            uint64_t e = fl_atomic_load_relaxed_u64(&slots[i].epoch);
            if (e < oldest) oldest = e;
        }
    }
    uint32_t best = UINT32_MAX, best_w = 0, best_rank = 4;
    uint64_t best_seq = UINT64_MAX;
    for (uint32_t i = 0; i < h->nslots; i++) {
        uint32_t w = fl_atomic_load_acquire_u32(&slots[i].state);
        if (FL_STATE_BITS(w) != FL_SLOT_QUEUED) continue;
        if (fl_atomic_load_relaxed_u32(&slots[i].share) != FL_SHARE_ON) continue;
        uint64_t seq = fl_atomic_load_relaxed_u64(&slots[i].seq);
        uint32_t count = fl_atomic_load_relaxed_u32(&slots[i].count);
        if (count == 0 || count > h->max_rows) continue;
        fl_atomic_u32 *meta = meta_of(mem, i), *rows = meta + FL_META_WORDS;
        uint32_t rank;
        if (has_own_row(rows, count, worker_id))
            rank = 0;
        else if (first_free(rows, count, fl_atomic_load_relaxed_u32(&meta[FL_META_HINT])) ==
                 count)
            continue;
        else if (!untouched(rows, count))
            rank = 2;
        else
            rank = fl_atomic_load_relaxed_u64(&slots[i].epoch) == oldest ? 1 : 3;
        if (rank > best_rank || (rank == best_rank && seq >= best_seq)) continue;
        best = i;
        best_w = w;
        best_seq = seq;
        best_rank = rank;
    }
    if (best == UINT32_MAX) return FL_ETIMEOUT;
    *slot_out = best;
    *state_out = best_w;
    return FL_OK;
}

int fl_ring_take_rows(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                      uint32_t row, uint32_t divisor, uint32_t *first_out, uint32_t *n_out) {
    if (mem == NULL || first_out == NULL || n_out == NULL || worker_id >= FL_MAX_WORKERS)
        return FL_EINVAL;
    *first_out = 0;
    *n_out = 0;
    uint32_t count = 0;
    fl_slot_hdr *s = shared_slot(mem, slot, state, &count);
    if (s == NULL || FL_STATE_BITS(state) != FL_SLOT_QUEUED) return FL_ESTATE;
    if (fl_atomic_load_acquire_u32(&s->share) != FL_SHARE_ON) return FL_OK;
    fl_atomic_u32 *meta = meta_of(mem, slot), *rows = meta + FL_META_WORDS;
    uint32_t me = worker_id + 1, first, n = 0;
    uint32_t hint = fl_atomic_load_relaxed_u32(&meta[FL_META_HINT]);
    if (row == FL_TAKE_GIVEN) { /* a row given to us (fl_ring_queue_shared_to) */
        for (first = 0; first < count; first++) {
            uint32_t v = FL_ROW_GIVEN | me;
            if (fl_atomic_load_relaxed_u32(&rows[first]) == v &&
                fl_atomic_cas_acq_rel_u32(&rows[first], &v, me))
                break;
        }
        if (first >= count) return FL_OK;
        n = 1;
    } else if (row != FL_TAKE_PIECE) {
        if (row >= count) return FL_ERANGE;
        uint32_t v = FL_ROW_FREE;
        if (!fl_atomic_cas_acq_rel_u32(&rows[row], &v, me)) return FL_OK;
        first = row;
        n = 1;
    } else {
        for (first = first_free(rows, count, hint); first < count;
             first = first_free(rows, count, first + 1)) {
            uint32_t v = FL_ROW_FREE;
            if (fl_atomic_cas_acq_rel_u32(&rows[first], &v, me)) break;
        }
        if (first >= count) return FL_OK;
        n = 1;
        uint32_t want = (count - first) / (divisor ? divisor : 1);
        while (n < want && first + n < count) {
            uint32_t v = FL_ROW_FREE;
            if (!fl_atomic_cas_acq_rel_u32(&rows[first + n], &v, me)) break;
            n++;
        }
        /* Raise the hint past what was taken, unless it moved meanwhile (rows given back lower
         * it after freeing them, so a stale raise could hide a FREE row: then it fails). */
        if (first <= hint + 1 && first + n > hint) {
            uint32_t expected = hint;
            fl_atomic_cas_acq_rel_u32(&meta[FL_META_HINT], &expected, first + n);
        }
    }
    /* NOTE [shared rows]: the rows are ours only if the batch is still the one we read. */
    uint32_t now = fl_atomic_load_acquire_u32(&s->state);
    uint32_t sh = fl_atomic_load_acquire_u32(&s->share);
    if (now != state || sh != FL_SHARE_ON) {
        uint32_t back = now == state ? FL_ROW_CLOSED : FL_ROW_FREE;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t v = me;
            fl_atomic_cas_acq_rel_u32(&rows[first + k], &v, back);
        }
        ring_row_bell(mem, slot); /* a failer settling may have counted them as being loaded */
        return FL_OK;
    }
    *first_out = first;
    *n_out = n;
    return FL_OK;
}

int fl_ring_rows_done(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                      uint32_t first, uint32_t n, int *published_out) {
    if (mem == NULL || published_out == NULL || worker_id >= FL_MAX_WORKERS) return FL_EINVAL;
    *published_out = 0;
    uint32_t count = 0;
    fl_slot_hdr *s = shared_slot(mem, slot, state, &count);
    if (s == NULL) return FL_ESTATE;
    if (first > count || n > count - first) return FL_ERANGE;
    fl_atomic_u32 *rows = rows_of(mem, slot);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t v = worker_id + 1;
        if (!fl_atomic_cas_acq_rel_u32(&rows[first + k], &v, FL_ROW_DONE)) return FL_ESTATE;
    }
    ring_row_bell(mem, slot);
    if (all_done(rows, count)) *published_out = publish_shared(mem, s, state, worker_id, 1);
    return FL_OK;
}

int fl_ring_rows_fail(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id,
                      uint32_t row, uint32_t end, int *won_out) {
    if (mem == NULL || won_out == NULL || worker_id >= FL_MAX_WORKERS) return FL_EINVAL;
    *won_out = 0;
    uint32_t count = 0;
    fl_slot_hdr *s = shared_slot(mem, slot, state, &count);
    if (s == NULL) return FL_ESTATE;
    if (row >= count || end > count || end < row + 1) return FL_ERANGE;
    fl_atomic_u32 *meta = meta_of(mem, slot), *rows = meta + FL_META_WORDS;
    uint32_t me = worker_id + 1, v;
    if (fl_atomic_load_acquire_u32(&rows[row]) != me) return FL_ESTATE;
    /* `row` stays ours (being loaded) until this worker knows whether it fails the batch, so
     * the slot cannot be freed and queued again meanwhile: share and meta have no generation,
     * and a CAS on them after our last row was let go could land on a later batch. The failer
     * claims FL_META_FAILER before share, so a worker that dies at any point is known to the
     * parent (fl_ring_reset_rows). Rows given up go back FREE: the failer closes them, or the
     * failer's settle, or the cancel; a loser leaves nothing to clean up. */
    for (uint32_t r = row + 1; r < end; r++) {
        v = me;
        fl_atomic_cas_acq_rel_u32(&rows[r], &v, FL_ROW_FREE);
    }
    int won = 0;
    uint32_t zero = 0, on = FL_SHARE_ON;
    if (fl_atomic_load_acquire_u32(&s->share) == FL_SHARE_ON &&
        fl_atomic_cas_acq_rel_u32(&meta[FL_META_FAILER], &zero, me)) {
        if (fl_atomic_cas_acq_rel_u32(&s->share, &on, FL_SHARE_FAILING))
            won = 1;
        else /* cancelled meanwhile: nobody fails it */
            fl_atomic_store_release_u32(&meta[FL_META_FAILER], 0);
    }
    if (won) close_free_rows(rows, count);
    v = me;
    fl_atomic_cas_acq_rel_u32(&rows[row], &v, won ? FL_ROW_ERRORED : FL_ROW_FREE);
    *won_out = won;
    ring_row_bell(mem, slot);
    return FL_OK;
}

int fl_ring_rows_settle(void *mem, uint32_t slot, int64_t timeout_ns, uint32_t *busy_out) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || busy_out == NULL || hdr_of(mem)->max_rows == 0) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    uint32_t count = fl_atomic_load_relaxed_u32(&s->count);
    if (count > h->max_rows) return FL_EINVAL;
    fl_atomic_u32 *meta = meta_of(mem, slot), *rows = meta + FL_META_WORDS;
    int64_t deadline = deadline_after(timeout_ns);
    for (;;) {
        if (fl_atomic_load_acquire_u32(&h->stop)) return FL_ESTOPPED;
        uint32_t seen = fl_atomic_load_acquire_u32(&meta[FL_META_BELL]);
        close_free_rows(rows, count); /* rows a dead worker's were given back as */
        *busy_out = count_taken(rows, count);
        if (*busy_out == 0) return FL_OK;
        int64_t left = deadline - fl_now_ns();
        if (left <= 0) return FL_ETIMEOUT;
        fl_sleep_unless_changed(&meta[FL_META_BELL], seen, &h->row_waiters, &h->stop, left,
                                &h->n_futex_waits);
    }
}

int fl_ring_fail_shared(void *mem, uint32_t slot, uint32_t state, uint32_t worker_id) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || worker_id >= FL_MAX_WORKERS) return FL_EINVAL;
    if (fl_atomic_load_acquire_u32(&s->share) != FL_SHARE_FAILING ||
        fl_atomic_load_acquire_u32(&meta_of(mem, slot)[FL_META_FAILER]) != worker_id + 1)
        return FL_ESTATE;
    return publish_shared(mem, s, state, worker_id, 0) ? FL_OK : FL_ESTATE;
}

int fl_ring_row_state(const void *mem, uint32_t slot, uint32_t row, uint32_t *word_out) {
    fl_slot_hdr *s = fl_ring_slot((void *)mem, slot);
    if (s == NULL || word_out == NULL) return FL_EINVAL;
    if (row >= hdr_of((void *)mem)->max_rows) return FL_ERANGE;
    *word_out = fl_atomic_load_acquire_u32(&rows_of((void *)mem, slot)[row]);
    return FL_OK;
}

int fl_ring_rows_of(const void *mem, uint32_t worker_id, uint32_t *slots_out, uint32_t *rows_out,
                    uint32_t cap, uint32_t *n_out) {
    if (mem == NULL || n_out == NULL || worker_id >= FL_MAX_WORKERS) return FL_EINVAL;
    if (cap > 0 && (slots_out == NULL || rows_out == NULL)) return FL_EINVAL;
    void *m = (void *)mem;
    fl_header *h = hdr_of(m);
    uint32_t n = 0;
    for (uint32_t i = 0; h->max_rows > 0 && i < h->nslots; i++) {
        fl_slot_hdr *s = &slots_of(m)[i];
        if (FL_STATE_BITS(fl_atomic_load_acquire_u32(&s->state)) != FL_SLOT_QUEUED) continue;
        if (fl_atomic_load_acquire_u32(&s->share) == FL_SHARE_OFF) continue;
        uint32_t count = fl_atomic_load_relaxed_u32(&s->count);
        if (count > h->max_rows) continue;
        fl_atomic_u32 *rows = rows_of(m, i);
        for (uint32_t r = 0; r < count; r++) {
            if (fl_atomic_load_acquire_u32(&rows[r]) != worker_id + 1) continue;
            if (n < cap) {
                slots_out[n] = i;
                rows_out[n] = r;
            }
            n++;
        }
    }
    *n_out = n;
    return FL_OK;
}

static int reset_rows_in(void *mem, uint32_t worker_id, uint32_t from, uint32_t to, int reopen,
                         uint32_t *n_out) {
    if (mem == NULL || n_out == NULL || worker_id >= FL_MAX_WORKERS) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    uint32_t me = worker_id + 1, n = 0;
    int woke = 0; /* rows (or a whole batch) opened again: sleeping workers should look */
    if (to > h->nslots) to = h->nslots;
    for (uint32_t i = from; h->max_rows > 0 && i < to; i++) {
        fl_slot_hdr *s = &slots_of(mem)[i];
        uint32_t state = fl_atomic_load_acquire_u32(&s->state);
        if (FL_STATE_BITS(state) != FL_SLOT_QUEUED) continue;
        uint32_t sh = fl_atomic_load_acquire_u32(&s->share);
        if (sh == FL_SHARE_OFF) continue;
        uint32_t count = fl_atomic_load_relaxed_u32(&s->count);
        if (count > h->max_rows) continue;
        fl_atomic_u32 *meta = meta_of(mem, i), *rows = meta + FL_META_WORDS;
        int changed = 0, lowest = -1;
        uint32_t failer = me;
        if (sh != FL_SHARE_FAILING) /* it died claiming to fail it, before share said so */
            fl_atomic_cas_acq_rel_u32(&meta[FL_META_FAILER], &failer, 0);
        if (sh == FL_SHARE_FAILING && fl_atomic_load_acquire_u32(&meta[FL_META_FAILER]) == me) {
            /* It died failing the batch: its error never reached us. Opened again, the rows are
             * loaded again and the first to raise fails it (or, not reopened, it is cancelled). */
            fl_atomic_store_release_u32(&meta[FL_META_FAILER], 0);
            uint32_t failing = FL_SHARE_FAILING;
            fl_atomic_cas_acq_rel_u32(&s->share, &failing,
                                      reopen ? FL_SHARE_ON : FL_SHARE_CANCELLED);
            sh = reopen ? FL_SHARE_ON : FL_SHARE_CANCELLED;
            for (uint32_t r = 0; reopen && r < count; r++) {
                uint32_t v = fl_atomic_load_acquire_u32(&rows[r]);
                if (v != FL_ROW_CLOSED && v != FL_ROW_ERRORED) continue;
                if (fl_atomic_cas_acq_rel_u32(&rows[r], &v, FL_ROW_FREE) && lowest < 0)
                    lowest = (int)r;
            }
            changed = 1;
        }
        uint32_t back = reopen && sh == FL_SHARE_ON ? FL_ROW_FREE : FL_ROW_CLOSED;
        for (uint32_t r = 0; r < count; r++) {
            uint32_t v = fl_atomic_load_relaxed_u32(&rows[r]);
            if (v != me && v != (FL_ROW_GIVEN | me)) continue;
            if (fl_atomic_cas_acq_rel_u32(&rows[r], &v, back)) {
                n++;
                changed = 1;
                if (back == FL_ROW_FREE && (lowest < 0 || (int)r < lowest)) lowest = (int)r;
            }
        }
        if (lowest >= 0) { /* after freeing them: a take that read the old hint cannot raise it */
            uint32_t hint = fl_atomic_load_relaxed_u32(&meta[FL_META_HINT]);
            while (hint > (uint32_t)lowest &&
                   !fl_atomic_cas_acq_rel_u32(&meta[FL_META_HINT], &hint, (uint32_t)lowest)) {
            }
        }
        /* It may have died between its last DONE and publishing the batch. */
        if (all_done(rows, count)) publish_shared(mem, s, state, worker_id, 1);
        if (changed) ring_row_bell(mem, i);
        woke |= lowest >= 0;
    }
    *n_out = n;
    if (woke) {
        fl_atomic_fetch_add_acq_rel_u32(&h->queued_counter, 1);
        fl_wake_if_waiting(&h->queued_counter, &h->task_waiters, -1, NULL);
    }
    return FL_OK;
}

int fl_ring_reset_rows(void *mem, uint32_t worker_id, int reopen, uint32_t *n_out) {
    return reset_rows_in(mem, worker_id, 0, UINT32_MAX, reopen, n_out);
}

int fl_ring_reset_slot_rows(void *mem, uint32_t slot, uint32_t worker_id, int reopen,
                            uint32_t *n_out) {
    if (fl_ring_slot(mem, slot) == NULL) return FL_EINVAL;
    return reset_rows_in(mem, worker_id, slot, slot + 1, reopen, n_out);
}
