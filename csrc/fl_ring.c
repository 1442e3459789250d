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

FL_INLINE fl_slot_hdr *slots_of(void *mem) {
    return (fl_slot_hdr *)((char *)mem + hdr_of(mem)->header_bytes);
}

size_t fl_ring_nbytes(uint32_t nslots) {
    if (nslots == 0 || nslots > FL_MAX_SLOTS) return 0;
    return sizeof(fl_header) + (size_t)nslots * sizeof(fl_slot_hdr);
}

int fl_ring_init(void *mem, size_t total_bytes, uint32_t nslots, uint64_t slot_bytes,
                 uint64_t data_offset, int64_t creator_pid) {
    if (mem == NULL || ((uintptr_t)mem % FL_CACHELINE) != 0) return FL_EINVAL;
    size_t ctl = fl_ring_nbytes(nslots);
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
    size_t ctl = fl_ring_nbytes(h->nslots);
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

int fl_ring_queue_to(void *mem, uint32_t slot, uint64_t seq, uint64_t epoch, uint32_t count,
                     uint32_t target) {
    fl_slot_hdr *s = fl_ring_slot(mem, slot);
    if (s == NULL || (target != FL_TARGET_ANY && target >= FL_MAX_WORKERS)) return FL_EINVAL;
    fl_header *h = hdr_of(mem);
    uint32_t w = fl_atomic_load_acquire_u32(&s->state);
    if (FL_STATE_BITS(w) != FL_SLOT_FREE) return FL_ESTATE;
    /* Plain fields are published by the release store of the state word below; seq is atomic
     * because claimers scan it on slots they do not own. */
    s->count = count;
    s->epoch = epoch;
    fl_atomic_store_relaxed_u32(&s->target, target == FL_TARGET_ANY ? 0 : target + 1);
    fl_atomic_store_relaxed_u32(&s->rows, count);
    fl_atomic_store_relaxed_u32(&s->flags, 0);
    fl_atomic_store_relaxed_u64(&s->var_bytes, 0);
    fl_atomic_store_relaxed_u64(&s->seq, seq);
    fl_atomic_store_relaxed_u64(&s->progress, 0);
    fl_atomic_store_relaxed_u32(&s->pid, 0);
    fl_atomic_store_release_u32(&s->state, FL_MAKE_STATE(FL_GEN_BITS(w) + 1, 0, FL_SLOT_QUEUED));
    fl_atomic_fetch_add_relaxed_u64(&h->n_queued, 1);
    fl_atomic_fetch_add_acq_rel_u32(&h->queued_counter, 1);
    fl_wake_if_waiting(&h->queued_counter, &h->task_waiters, target == FL_TARGET_ANY ? 1 : -1,
                       &h->n_futex_wakes);
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
    out->count = s->count;
    out->epoch = s->epoch;
    uint32_t t = fl_atomic_load_relaxed_u32(&s->target);
    out->target = t == 0 ? FL_TARGET_ANY : t - 1;
    out->rows = fl_atomic_load_relaxed_u32(&s->rows);
    out->flags = fl_atomic_load_relaxed_u32(&s->flags);
    out->var_bytes = fl_atomic_load_relaxed_u64(&s->var_bytes);
    return FL_OK;
}
