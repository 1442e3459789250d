/* test_ring.c: tests of the slot ring (fl_ring.h) — argument validation, the single-threaded
 * state machine, wake-ups across threads, and multi-threaded stress runs in which threads stand
 * in for the parent and worker processes (the ring never knows the difference: it only sees a
 * caller-provided memory block).
 *
 * Build and run through the Makefile in this directory. Knobs:
 *   FL_TEST_TASKS=n   tasks of the main stress run (default FL_STRESS_TASKS, 1,000,000); the
 *                     chaos run (dying workers, failures, cancels) uses n / 4, the lost-wake-up
 *                     ping-pong n / 10 round trips per phase (and n with short jitter), the
 *                     shared-batch stress (NOTE [shared rows] in fl_ring.c) n / 25 batches
 *   FL_TEST_SEED=n    seed of the stress runs' random choices */
#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fl_pack.h"
#include "fl_ring.h"
#include "fl_status.h"
#include "fl_wait.h"
#include "fl_test.h"

#ifndef FL_STRESS_TASKS
#define FL_STRESS_TASKS 1000000L
#endif

#define MS (1000000LL) /* nanoseconds */
#define ST(w) FL_STATE_BITS(w)
#define OWNER(w) FL_OWNER_BITS(w)
#define GEN(w) FL_GEN_BITS(w)

/* ---------------------------------------------------------------------------------------- */
/* helpers                                                                                    */

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* aligned_alloc needs a size that is a multiple of the alignment (ASan checks it). */
static void *xalloc(size_t n) {
    void *p = aligned_alloc(FL_CACHELINE, round_up(n ? n : 1, FL_CACHELINE));
    assert(p != NULL);
    return p;
}

typedef struct ring {
    void *mem;
    size_t total;
    uint32_t nslots;
    uint32_t max_rows; /* rows of a shared batch (0: a ring without row tables) */
    uint64_t slot_bytes;
    uint64_t data_offset;
} ring;

/* A ring over dirty memory (init must not rely on zeroed pages), payload area after a gap;
 * with row tables for shared batches of up to max_rows rows if max_rows > 0. */
static ring ring_new_rows(uint32_t nslots, uint64_t slot_bytes, uint32_t max_rows) {
    ring r;
    r.nslots = nslots;
    r.max_rows = max_rows;
    r.slot_bytes = slot_bytes;
    r.data_offset = round_up(fl_ring_nbytes_rows(nslots, max_rows) + 64, FL_CACHELINE);
    r.total = (size_t)(r.data_offset + (uint64_t)nslots * slot_bytes);
    r.mem = xalloc(r.total);
    memset(r.mem, 0xCD, r.total);
    if (max_rows == 0)
        assert(fl_ring_init(r.mem, r.total, nslots, slot_bytes, r.data_offset, 4242) == FL_OK);
    else
        assert(fl_ring_init_rows(r.mem, r.total, nslots, slot_bytes, r.data_offset, 4242,
                                 max_rows) == FL_OK);
    assert(fl_ring_attach(r.mem, r.total) == FL_OK);
    return r;
}

static ring ring_new(uint32_t nslots, uint64_t slot_bytes) {
    return ring_new_rows(nslots, slot_bytes, 0);
}

static void ring_free(ring *r) {
    free(r->mem);
    r->mem = NULL;
}

static fl_header *H(const ring *r) { return (fl_header *)r->mem; }

static unsigned char *slot_data(const ring *r, uint32_t slot) {
    return (unsigned char *)r->mem + r->data_offset + (size_t)slot * r->slot_bytes;
}

static uint32_t state_of(const ring *r, uint32_t slot) {
    uint32_t w = 0xFFFFFFFFu;
    assert(fl_ring_slot_state(r->mem, slot, &w) == FL_OK);
    return w;
}

static uint64_t ctr(const fl_atomic_u64 *p) { return fl_atomic_load_acquire_u64(p); }

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static double ms_since(int64_t t0) { return (double)(fl_now_ns() - t0) / 1e6; }

/* Poll an atomic word until it is >= want, at most timeout_ms; returns 1 if it got there. */
static int await_u32_ge(const fl_atomic_u32 *p, uint32_t want, long timeout_ms) {
    int64_t end = fl_now_ns() + timeout_ms * MS;
    while (fl_atomic_load_acquire_u32(p) < want) {
        if (fl_now_ns() > end) return 0;
        sleep_ms(1);
    }
    return 1;
}

static int await_u64_ge(const fl_atomic_u64 *p, uint64_t want, long timeout_ms) {
    int64_t end = fl_now_ns() + timeout_ms * MS;
    while (fl_atomic_load_acquire_u64(p) < want) {
        if (fl_now_ns() > end) return 0;
        sleep_ms(1);
    }
    return 1;
}

/* queue + claim: returns the CLAIMED state word. */
static uint32_t queue_claim(ring *r, uint32_t slot, uint64_t seq, uint32_t worker) {
    assert(fl_ring_queue(r->mem, slot, seq, 0, 1) == FL_OK);
    uint32_t got = 99, st = 0;
    assert(fl_ring_claim(r->mem, worker, 0, &got, &st) == FL_OK);
    assert(got == slot);
    assert(ST(st) == FL_SLOT_CLAIMED && OWNER(st) == worker);
    return st;
}

/* Drive a FREE slot to the given state. Returns the state word. */
static uint32_t drive_to(ring *r, uint32_t slot, uint32_t target) {
    assert(ST(state_of(r, slot)) == FL_SLOT_FREE);
    if (target == FL_SLOT_FREE) return state_of(r, slot);
    if (target == FL_SLOT_QUEUED) {
        assert(fl_ring_queue(r->mem, slot, 1000 + slot, 0, 1) == FL_OK);
        return state_of(r, slot);
    }
    uint32_t st = queue_claim(r, slot, 1000 + slot, 7);
    if (target == FL_SLOT_CLAIMED) return st;
    assert(fl_ring_publish(r->mem, slot, st, target != FL_SLOT_FAILED) == FL_OK);
    if (target == FL_SLOT_READING) assert(fl_ring_begin_read(r->mem, slot) == FL_OK);
    uint32_t w = state_of(r, slot);
    assert(ST(w) == target);
    return w;
}

/* ---------------------------------------------------------------------------------------- */
/* sizes, layout, init, attach                                                                */

static void test_nbytes(void) {
    assert(fl_ring_nbytes(0) == 0);
    assert(fl_ring_nbytes(FL_MAX_SLOTS + 1) == 0);
    assert(fl_ring_nbytes(UINT32_MAX) == 0);
    assert(fl_ring_nbytes(1) == sizeof(fl_header) + sizeof(fl_slot_hdr));
    assert(fl_ring_nbytes(1) == 6 * FL_CACHELINE);
    assert(fl_ring_nbytes(8) == 5 * FL_CACHELINE + 8 * FL_CACHELINE);
    assert(fl_ring_nbytes(FL_MAX_SLOTS) == sizeof(fl_header) + FL_MAX_SLOTS * sizeof(fl_slot_hdr));
    for (uint32_t n = 1; n < FL_MAX_SLOTS; n++) assert(fl_ring_nbytes(n + 1) > fl_ring_nbytes(n));
}

static void test_layout_constants(void) {
    assert(sizeof(fl_header) == 5 * FL_CACHELINE);
    assert(sizeof(fl_slot_hdr) == FL_CACHELINE);
    assert(FL_MAX_WORKERS == 0xFFFu);
    assert(memcmp(FL_MAGIC, "FASTLD\0\1", 8) == 0);
    uint32_t w = FL_MAKE_STATE(0xBEEF, 0xABC, FL_SLOT_READING);
    assert(ST(w) == FL_SLOT_READING && OWNER(w) == 0xABC && GEN(w) == 0xBEEF);
    /* every field is masked to its width: no field bleeds into another */
    w = FL_MAKE_STATE(0x1FFFF, 0x1FFF, 0x1F);
    assert(GEN(w) == 0xFFFF && OWNER(w) == 0xFFF && ST(w) == 0xF);
    assert(FL_MAKE_STATE(0x10000, 0, 0) == 0);
    /* layout 3: shared batches (NOTE [shared rows] in fl_ring.c) */
    assert(FL_LAYOUT_VERSION == 3u && FL_CACHELINE == 128);
    assert(offsetof(fl_header, max_rows) == 56);
    assert(offsetof(fl_header, row_waiters) == FL_CACHELINE + 4);
    assert(offsetof(fl_slot_hdr, share) == 56);
    assert(FL_MAX_SHARED_ROWS == 65536u);
    /* a row word: FREE, a worker's id + 1, or one of three marks no worker id reaches */
    assert(FL_ROW_FREE == 0 && FL_ROW_CLOSED == 0xFFFFFFFDu);
    assert(FL_ROW_ERRORED == 0xFFFFFFFEu && FL_ROW_DONE == 0xFFFFFFFFu);
    assert(FL_MAX_WORKERS + 1 < FL_ROW_CLOSED);
    assert(FL_SHARE_OFF == 0 && FL_SHARE_ON == 1 && FL_SHARE_FAILING == 2);
    assert(FL_SHARE_CANCELLED == 3);
}

static void test_init_validation(void) {
    const uint32_t n = 4;
    const size_t ctl = fl_ring_nbytes(n);
    const size_t cap = 1 << 16;
    unsigned char *mem = xalloc(cap);
    memset(mem, 0xAB, cap);
    /* null and misaligned memory */
    assert(fl_ring_init(NULL, cap, n, 64, ctl, 1) == FL_EINVAL);
    assert(fl_ring_init(mem + 8, cap - 128, n, 64, ctl, 1) == FL_EINVAL);
    assert(fl_ring_init(mem + 64, cap - 128, n, 64, ctl, 1) == FL_EINVAL);
    assert(fl_ring_init(mem + 1, cap - 128, n, 64, ctl, 1) == FL_EINVAL);
    /* slot count */
    assert(fl_ring_init(mem, cap, 0, 64, ctl, 1) == FL_EINVAL);
    assert(fl_ring_init(mem, cap, FL_MAX_SLOTS + 1, 64, 1 << 15, 1) == FL_EINVAL);
    /* total_bytes too small for the control block */
    assert(fl_ring_init(mem, ctl - 1, n, 0, ctl, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, 0, n, 0, 0, 1) == FL_ENOSPACE);
    /* data_offset inside the control block */
    assert(fl_ring_init(mem, cap, n, 64, ctl - 1, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, cap, n, 64, 0, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, cap, n, 64, sizeof(fl_header), 1) == FL_ENOSPACE);
    /* slot area past total_bytes (by one byte, and entirely) */
    assert(fl_ring_init(mem, ctl + n * 100 - 1, n, 100, ctl, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, ctl + 1000, n, 100, ctl + 1000, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, ctl + 10, n, 0, ctl + 11, 1) == FL_ENOSPACE); /* offset past end */
    /* uint64 overflow of nslots * slot_bytes (wraps to 0) */
    assert(fl_ring_init(mem, cap, 2, (UINT64_MAX / 2) + 1, ctl, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, cap, 4, (uint64_t)1 << 62, ctl, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, cap, n, UINT64_MAX, ctl, 1) == FL_ENOSPACE);
    /* ... and of data_offset + nslots * slot_bytes (wraps to a small number) */
    assert(fl_ring_init(mem, cap, n, (UINT64_MAX - ctl) / n + 1, ctl, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, cap, n, 1, UINT64_MAX, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, cap, n, 1, UINT64_MAX - 1, 1) == FL_ENOSPACE);
    assert(fl_ring_init(mem, cap, 1, 16, UINT64_MAX - 15, 1) == FL_ENOSPACE); /* sum = 2^64 */
    /* no failing call wrote anything */
    for (size_t i = 0; i < cap; i++) assert(mem[i] == 0xAB);

    /* exact fit is accepted, and only the control block is written */
    const uint64_t off = ctl + 256, sb = 1000;
    const size_t total = (size_t)(off + n * sb);
    assert(fl_ring_init(mem, total, n, sb, off, -77) == FL_OK);
    for (size_t i = ctl; i < cap; i++) assert(mem[i] == 0xAB);
    const fl_header *h = (const fl_header *)mem;
    assert(memcmp(h->magic, FL_MAGIC, 8) == 0);
    assert(h->layout_version == FL_LAYOUT_VERSION);
    assert(h->header_bytes == sizeof(fl_header));
    assert(h->nslots == n && h->slot_hdr_bytes == sizeof(fl_slot_hdr));
    assert(h->slot_bytes == sb && h->data_offset == off && h->total_bytes == total);
    assert(h->creator_pid == -77);
    assert(h->stop == 0 && h->queued_counter == 0 && h->task_waiters == 0 && h->ready_waiters == 0);
    assert(h->n_queued == 0 && h->n_claimed == 0 && h->n_published == 0 && h->n_released == 0);
    assert(h->n_reclaimed == 0 && h->n_cancelled == 0);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t w = 1;
        assert(fl_ring_slot_state(mem, i, &w) == FL_OK && w == 0);
        const fl_slot_hdr *s = fl_ring_slot(mem, i);
        assert(s->seq == 0 && s->count == 0 && s->progress == 0 && s->pid == 0);
    }
    assert(fl_ring_attach(mem, total) == FL_OK);
    /* other valid shapes */
    assert(fl_ring_init(mem, ctl, n, 0, ctl, 0) == FL_OK);              /* no payload at all */
    assert(fl_ring_attach(mem, ctl) == FL_OK);
    assert(fl_ring_init(mem, ctl + 64, n, 16, ctl, 0) == FL_OK);        /* exact, offset = ctl */
    assert(fl_ring_nbytes(FL_MAX_SLOTS) > cap);
    assert(fl_ring_init(mem, cap, FL_MAX_SLOTS, 0, cap, 0) == FL_ENOSPACE);
    free(mem);

    /* the largest ring */
    const size_t bctl = fl_ring_nbytes(FL_MAX_SLOTS);
    unsigned char *big = xalloc(bctl + FL_MAX_SLOTS * 8);
    assert(fl_ring_init(big, bctl + FL_MAX_SLOTS * 8, FL_MAX_SLOTS, 8, bctl, 0) == FL_OK);
    assert(fl_ring_attach(big, bctl + FL_MAX_SLOTS * 8) == FL_OK);
    assert(fl_ring_slot(big, FL_MAX_SLOTS - 1) != NULL && fl_ring_slot(big, FL_MAX_SLOTS) == NULL);
    free(big);
}

static void test_attach(void) {
    ring r = ring_new(4, 512);
    fl_header *h = H(&r);
    assert(fl_ring_attach(r.mem, r.total) == FL_OK);
    assert(fl_ring_attach(NULL, r.total) == FL_ELAYOUT);
    assert(fl_ring_attach(r.mem, 0) == FL_ELAYOUT);
    assert(fl_ring_attach(r.mem, sizeof(fl_header) - 1) == FL_ELAYOUT);
    /* wrong magic: every byte matters */
    for (int i = 0; i < 8; i++) {
        h->magic[i] ^= 0x20;
        assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
        h->magic[i] ^= 0x20;
        assert(fl_ring_attach(r.mem, r.total) == FL_OK);
    }
    /* wrong layout version */
    h->layout_version = FL_LAYOUT_VERSION + 1;
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->layout_version = 0;
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->layout_version = FL_LAYOUT_VERSION;
    assert(fl_ring_attach(r.mem, r.total) == FL_OK);
    /* wrong total_bytes (the mapping the attacher sees has another size) */
    assert(fl_ring_attach(r.mem, r.total - 1) == FL_ELAYOUT);
    assert(fl_ring_attach(r.mem, r.total + 1) == FL_ELAYOUT);
    assert(fl_ring_attach(r.mem, r.total + 4096) == FL_ELAYOUT);
    assert(fl_ring_attach(r.mem, r.total / 2) == FL_ELAYOUT);
    /* header fields that disagree with this build */
    h->header_bytes += 8;
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->header_bytes -= 8;
    h->slot_hdr_bytes = 64;
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->slot_hdr_bytes = sizeof(fl_slot_hdr);
    /* sizes that do not fit */
    uint32_t ns = h->nslots;
    h->nslots = 0;
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->nslots = FL_MAX_SLOTS + 1;
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->nslots = ns + 1; /* slot area now runs past total_bytes */
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->nslots = ns;
    uint64_t off = h->data_offset;
    h->data_offset = fl_ring_nbytes(ns) - 1;
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->data_offset = off + 1;
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->data_offset = off;
    uint64_t sb = h->slot_bytes;
    h->slot_bytes = UINT64_MAX / 2 + 1; /* 4 * that wraps to 0 */
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    h->slot_bytes = sb;
    assert(fl_ring_attach(r.mem, r.total) == FL_OK);
    /* activity does not disturb attach */
    (void)drive_to(&r, 1, FL_SLOT_READING);
    assert(fl_ring_attach(r.mem, r.total) == FL_OK);
    /* never formatted */
    memset(r.mem, 0, r.total);
    assert(fl_ring_attach(r.mem, r.total) == FL_ELAYOUT);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* the single-threaded state machine                                                          */

static void test_full_cycle(void) {
    ring r = ring_new(4, 256);
    void *m = r.mem;
    for (uint32_t round = 1; round <= 3; round++) {
        fl_slot_hdr *s = fl_ring_slot(m, 2);
        s->flags = 77; /* stale worker fields must be reset by queue */
        s->var_bytes = 99;
        fl_atomic_store_relaxed_u64(&s->progress, 5);
        assert(fl_ring_queue(m, 2, 700 + round, 30 + round, 5 + round) == FL_OK);
        uint32_t w = state_of(&r, 2);
        assert(ST(w) == FL_SLOT_QUEUED && OWNER(w) == 0 && GEN(w) == round);
        assert(s->seq == 700 + round && s->epoch == 30 + round && s->count == 5 + round);
        assert(s->flags == 0 && s->var_bytes == 0 && s->progress == 0 && s->pid == 0);

        uint32_t slot = 99, st = 0;
        assert(fl_ring_claim(m, 3, 10 * MS, &slot, &st) == FL_OK);
        assert(slot == 2 && st == FL_MAKE_STATE(round, 3, FL_SLOT_CLAIMED));
        assert(state_of(&r, 2) == st);
        /* the worker fills the slot */
        memset(slot_data(&r, 2), (int)round, r.slot_bytes);
        s->var_bytes = 17;
        fl_atomic_store_relaxed_u64(&s->progress, s->count);
        assert(fl_ring_publish(m, 2, st, 1) == FL_OK);
        assert(state_of(&r, 2) == FL_MAKE_STATE(round, 3, FL_SLOT_READY));

        uint32_t seen = 0;
        int64_t t0 = fl_now_ns();
        assert(fl_ring_wait(m, 2, 1000 * MS, &seen) == FL_OK);
        assert(ms_since(t0) < 200);
        assert(seen == FL_MAKE_STATE(round, 3, FL_SLOT_READY));
        assert(fl_ring_begin_read(m, 2) == FL_OK);
        assert(state_of(&r, 2) == FL_MAKE_STATE(round, 3, FL_SLOT_READING));
        assert(fl_ring_begin_read(m, 2) == FL_ESTATE); /* already lent */
        assert(s->var_bytes == 17 && slot_data(&r, 2)[r.slot_bytes - 1] == round);
        assert(fl_ring_release(m, 2) == FL_OK);
        assert(state_of(&r, 2) == FL_MAKE_STATE(round, 0, FL_SLOT_FREE));
    }
    /* the other slots were never touched */
    for (uint32_t i = 0; i < 4; i++)
        if (i != 2) assert(state_of(&r, i) == 0);
    ring_free(&r);
}

static void test_claim_lowest_seq(void) {
    ring r = ring_new(8, 64);
    const uint64_t seqs[8] = {50, 20, 70, 10, 60, 30, 80, 40};
    for (uint32_t i = 0; i < 8; i++) assert(fl_ring_queue(r.mem, i, seqs[i], 0, 1) == FL_OK);
    const uint32_t order[8] = {3, 1, 5, 7, 0, 4, 2, 6};
    for (int k = 0; k < 8; k++) {
        uint32_t slot = 99, st = 0;
        assert(fl_ring_claim(r.mem, 1, 0, &slot, &st) == FL_OK);
        assert(slot == order[k]);
        assert(fl_ring_slot(r.mem, slot)->seq == seqs[order[k]]);
    }
    uint32_t slot = 99, st = 0;
    assert(fl_ring_claim(r.mem, 1, 0, &slot, &st) == FL_ETIMEOUT);
    for (uint32_t i = 0; i < 8; i++) assert(ST(state_of(&r, i)) == FL_SLOT_CLAIMED);

    /* a lower seq queued later, into a higher slot index, still goes first */
    ring r2 = ring_new(8, 64);
    assert(fl_ring_queue(r2.mem, 0, 100, 0, 1) == FL_OK);
    assert(fl_ring_queue(r2.mem, 1, 101, 0, 1) == FL_OK);
    assert(fl_ring_queue(r2.mem, 7, 99, 0, 1) == FL_OK);
    assert(fl_ring_claim(r2.mem, 1, 0, &slot, &st) == FL_OK && slot == 7);
    assert(fl_ring_queue(r2.mem, 6, 0, 0, 1) == FL_OK);
    assert(fl_ring_claim(r2.mem, 1, 0, &slot, &st) == FL_OK && slot == 6);
    assert(fl_ring_claim(r2.mem, 1, 0, &slot, &st) == FL_OK && slot == 0);
    /* a re-queued (reclaimed) task keeps its seq and is preferred over later ones */
    assert(fl_ring_queue(r2.mem, 5, 102, 0, 1) == FL_OK);
    uint32_t cnt = 0;
    assert(fl_ring_reclaim(r2.mem, 1, &cnt) == FL_OK && cnt == 3); /* slots 7, 6, 0 */
    assert(fl_ring_claim(r2.mem, 2, 0, &slot, &st) == FL_OK && slot == 6);  /* seq 0 */
    assert(fl_ring_claim(r2.mem, 2, 0, &slot, &st) == FL_OK && slot == 7);  /* seq 99 */
    assert(fl_ring_claim(r2.mem, 2, 0, &slot, &st) == FL_OK && slot == 0);  /* seq 100 */
    assert(fl_ring_claim(r2.mem, 2, 0, &slot, &st) == FL_OK && slot == 1);  /* seq 101 */
    assert(fl_ring_claim(r2.mem, 2, 0, &slot, &st) == FL_OK && slot == 5);  /* seq 102 */
    assert(fl_ring_claim(r2.mem, 2, 0, &slot, &st) == FL_ETIMEOUT);
    /* large seqs compare as unsigned 64-bit numbers */
    ring r3 = ring_new(3, 64);
    assert(fl_ring_queue(r3.mem, 0, UINT64_MAX - 1, 0, 1) == FL_OK);
    assert(fl_ring_queue(r3.mem, 1, (uint64_t)1 << 63, 0, 1) == FL_OK);
    assert(fl_ring_queue(r3.mem, 2, UINT32_MAX + (uint64_t)1, 0, 1) == FL_OK);
    assert(fl_ring_claim(r3.mem, 1, 0, &slot, &st) == FL_OK && slot == 2);
    assert(fl_ring_claim(r3.mem, 1, 0, &slot, &st) == FL_OK && slot == 1);
    assert(fl_ring_claim(r3.mem, 1, 0, &slot, &st) == FL_OK && slot == 0);
    ring_free(&r);
    ring_free(&r2);
    ring_free(&r3);
}

static void test_queue_non_free(void) {
    ring r = ring_new(6, 64);
    /* QUEUED last: drive_to claims the lowest queued seq */
    const uint32_t states[] = {FL_SLOT_CLAIMED, FL_SLOT_READY, FL_SLOT_FAILED, FL_SLOT_READING,
                               FL_SLOT_QUEUED};
    for (uint32_t i = 0; i < 5; i++) {
        uint32_t w = drive_to(&r, i, states[i]);
        fl_slot_hdr *s = fl_ring_slot(r.mem, i);
        uint64_t seq = s->seq;
        uint32_t count = s->count;
        uint64_t nq = ctr(&H(&r)->n_queued);
        assert(fl_ring_queue(r.mem, i, 9999, 1, 2) == FL_ESTATE);
        assert(state_of(&r, i) == w); /* nothing changed */
        assert(s->seq == seq && s->count == count);
        assert(ctr(&H(&r)->n_queued) == nq);
    }
    assert(fl_ring_queue(r.mem, 6, 1, 0, 1) == FL_EINVAL);
    assert(fl_ring_queue(r.mem, UINT32_MAX, 1, 0, 1) == FL_EINVAL);
    assert(fl_ring_queue(NULL, 0, 1, 0, 1) == FL_EINVAL);
    assert(fl_ring_queue(r.mem, 5, 1, 0, 1) == FL_OK); /* the FREE one */
    ring_free(&r);
}

static void test_claim_timeout(void) {
    ring r = ring_new(4, 64);
    uint32_t slot = 99, st = 77;
    int64_t t0 = fl_now_ns();
    assert(fl_ring_claim(r.mem, 1, 20 * MS, &slot, &st) == FL_ETIMEOUT);
    double el = ms_since(t0);
    printf("  claim(20 ms) on an empty ring returned after %.2f ms\n", el);
    assert(el >= 15.0 && el < 500.0);
    assert(slot == 99 && st == 77); /* outputs untouched on timeout */
    /* it slept rather than spun: a handful of kernel waits (futex) or one backoff loop */
    uint64_t waits = ctr(&H(&r)->n_futex_waits);
    assert(waits >= 1 && waits < 50);
    assert(fl_atomic_load_acquire_u32(&H(&r)->task_waiters) == 0);
    /* zero and negative timeouts: one look, no sleep */
    t0 = fl_now_ns();
    assert(fl_ring_claim(r.mem, 1, 0, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_claim(r.mem, 1, -5 * MS, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_claim(r.mem, 1, INT64_MIN, &slot, &st) == FL_ETIMEOUT);
    assert(ms_since(t0) < 100.0);
    /* only QUEUED slots are claimable */
    (void)drive_to(&r, 0, FL_SLOT_READY);
    (void)drive_to(&r, 1, FL_SLOT_CLAIMED);
    assert(fl_ring_claim(r.mem, 1, 0, &slot, &st) == FL_ETIMEOUT);
    /* argument checks */
    assert(fl_ring_claim(NULL, 1, 0, &slot, &st) == FL_EINVAL);
    assert(fl_ring_claim(r.mem, 1, 0, NULL, &st) == FL_EINVAL);
    assert(fl_ring_claim(r.mem, 1, 0, &slot, NULL) == FL_EINVAL);
    assert(fl_ring_claim(r.mem, FL_MAX_WORKERS + 1, 0, &slot, &st) == FL_EINVAL);
    assert(fl_ring_claim(r.mem, UINT32_MAX, 0, &slot, &st) == FL_EINVAL);
    ring_free(&r);
}

static void test_wait_timeout(void) {
    ring r = ring_new(4, 64);
    void *m = r.mem;
    assert(fl_ring_queue(m, 1, 5, 0, 1) == FL_OK);
    uint32_t q = state_of(&r, 1), seen = 0;
    int64_t t0 = fl_now_ns();
    assert(fl_ring_wait(m, 1, 20 * MS, &seen) == FL_ETIMEOUT);
    double el = ms_since(t0);
    printf("  wait(20 ms) on a QUEUED slot returned after %.2f ms\n", el);
    assert(el >= 15.0 && el < 500.0);
    assert(seen == q);
    assert(fl_atomic_load_acquire_u32(&H(&r)->ready_waiters) == 0);
    /* CLAIMED is still "not yet" */
    uint32_t slot, st;
    assert(fl_ring_claim(m, 2, 0, &slot, &st) == FL_OK && slot == 1);
    t0 = fl_now_ns();
    assert(fl_ring_wait(m, 1, 20 * MS, &seen) == FL_ETIMEOUT);
    el = ms_since(t0);
    assert(el >= 15.0 && el < 500.0);
    assert(seen == st);
    assert(fl_ring_wait(m, 1, 0, &seen) == FL_ETIMEOUT);
    assert(fl_ring_wait(m, 1, -1, &seen) == FL_ETIMEOUT);
    /* any other state returns at once */
    assert(fl_ring_publish(m, 1, st, 0) == FL_OK);
    t0 = fl_now_ns();
    assert(fl_ring_wait(m, 1, 0, &seen) == FL_OK && ST(seen) == FL_SLOT_FAILED);
    assert(fl_ring_wait(m, 1, 5000 * MS, &seen) == FL_OK && ST(seen) == FL_SLOT_FAILED);
    assert(fl_ring_wait(m, 0, 5000 * MS, &seen) == FL_OK && seen == 0); /* FREE */
    (void)drive_to(&r, 2, FL_SLOT_READY);
    (void)drive_to(&r, 3, FL_SLOT_READING);
    assert(fl_ring_wait(m, 2, 5000 * MS, &seen) == FL_OK && ST(seen) == FL_SLOT_READY);
    assert(fl_ring_wait(m, 3, 5000 * MS, &seen) == FL_OK && ST(seen) == FL_SLOT_READING);
    assert(ms_since(t0) < 100.0);
    /* arguments */
    assert(fl_ring_wait(m, 4, 0, &seen) == FL_EINVAL);
    assert(fl_ring_wait(m, 0, 0, NULL) == FL_EINVAL);
    assert(fl_ring_wait(NULL, 0, 0, &seen) == FL_EINVAL);
    ring_free(&r);
}

static void test_publish_stale(void) {
    ring r = ring_new(4, 64);
    void *m = r.mem;
    uint32_t slot, st, cnt;
    /* (a) reclaimed: the old owner's word is stale */
    uint32_t old = queue_claim(&r, 0, 10, 2);
    assert(fl_ring_reclaim(m, 2, &cnt) == FL_OK && cnt == 1);
    uint32_t q = state_of(&r, 0);
    assert(ST(q) == FL_SLOT_QUEUED && GEN(q) == GEN(old) + 1);
    assert(fl_ring_publish(m, 0, old, 1) == FL_ESTATE);
    assert(fl_ring_publish(m, 0, old, 0) == FL_ESTATE);
    assert(state_of(&r, 0) == q);
    /* a new owner (even with the same worker id) gets a different word */
    assert(fl_ring_claim(m, 2, 0, &slot, &st) == FL_OK && slot == 0);
    assert(st != old && GEN(st) == GEN(old) + 1 && OWNER(st) == 2);
    assert(fl_ring_publish(m, 0, old, 1) == FL_ESTATE);
    assert(state_of(&r, 0) == st);
    assert(fl_ring_publish(m, 0, st, 1) == FL_OK);
    assert(fl_ring_publish(m, 0, st, 1) == FL_ESTATE); /* published twice */
    assert(fl_ring_publish(m, 0, old, 1) == FL_ESTATE);
    assert(ST(state_of(&r, 0)) == FL_SLOT_READY);
    assert(fl_ring_release(m, 0) == FL_OK);
    assert(fl_ring_publish(m, 0, st, 1) == FL_ESTATE); /* FREE now */
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(st), 0, FL_SLOT_FREE));

    /* (b) reclaimed and then cancelled */
    old = queue_claim(&r, 1, 20, 3);
    assert(fl_ring_reclaim(m, 3, &cnt) == FL_OK && cnt == 1);
    int c = 0;
    assert(fl_ring_cancel(m, 1, &c) == FL_OK && c == 1);
    uint32_t f = state_of(&r, 1);
    assert(fl_ring_publish(m, 1, old, 1) == FL_ESTATE);
    assert(state_of(&r, 1) == f && ST(f) == FL_SLOT_FREE);

    /* (c) the slot went round (published, released, re-queued, cancelled) */
    old = queue_claim(&r, 2, 30, 4);
    assert(fl_ring_publish(m, 2, old, 1) == FL_OK);
    assert(fl_ring_release(m, 2) == FL_OK);
    assert(fl_ring_queue(m, 2, 31, 0, 1) == FL_OK);
    assert(fl_ring_publish(m, 2, old, 1) == FL_ESTATE); /* QUEUED, newer generation */
    assert(fl_ring_cancel(m, 2, &c) == FL_OK && c == 1);
    f = state_of(&r, 2);
    assert(fl_ring_publish(m, 2, old, 1) == FL_ESTATE);
    assert(state_of(&r, 2) == f);

    /* (d) a word that is not a CLAIMED word, or that names another owner */
    st = queue_claim(&r, 3, 40, 5);
    assert(fl_ring_publish(m, 3, FL_MAKE_STATE(GEN(st), 5, FL_SLOT_READY), 1) == FL_EINVAL);
    assert(fl_ring_publish(m, 3, FL_MAKE_STATE(GEN(st), 5, FL_SLOT_QUEUED), 1) == FL_EINVAL);
    assert(fl_ring_publish(m, 3, FL_MAKE_STATE(GEN(st), 6, FL_SLOT_CLAIMED), 1) == FL_ESTATE);
    assert(fl_ring_publish(m, 3, FL_MAKE_STATE(GEN(st) + 1, 5, FL_SLOT_CLAIMED), 1) == FL_ESTATE);
    assert(state_of(&r, 3) == st);
    assert(fl_ring_publish(m, 4, st, 1) == FL_EINVAL);
    assert(fl_ring_publish(NULL, 3, st, 1) == FL_EINVAL);
    assert(fl_ring_publish(m, 3, st, 1) == FL_OK);
    assert(ctr(&H(&r)->n_published) == 3);
    ring_free(&r);
}

static void test_cancel(void) {
    ring r = ring_new(4, 64);
    void *m = r.mem;
    int c = 42;
    assert(fl_ring_queue(m, 0, 1, 0, 1) == FL_OK);
    uint32_t q = state_of(&r, 0);
    assert(fl_ring_cancel(m, 0, &c) == FL_OK && c == 1);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q), 0, FL_SLOT_FREE));
    assert(ctr(&H(&r)->n_cancelled) == 1);
    uint32_t slot, st;
    assert(fl_ring_claim(m, 1, 0, &slot, &st) == FL_ETIMEOUT); /* nothing left to claim */
    c = 42;
    assert(fl_ring_cancel(m, 0, &c) == FL_OK && c == 0); /* cancel of FREE: no-op */
    /* the slot can be queued again, with a newer generation */
    assert(fl_ring_queue(m, 0, 2, 0, 1) == FL_OK);
    assert(GEN(state_of(&r, 0)) == GEN(q) + 1);

    /* CLAIMED (and every later state) is not cancellable */
    assert(fl_ring_claim(m, 9, 0, &slot, &st) == FL_OK && slot == 0);
    c = 42;
    assert(fl_ring_cancel(m, 0, &c) == FL_OK && c == 0);
    assert(state_of(&r, 0) == st);
    (void)drive_to(&r, 1, FL_SLOT_READY);
    (void)drive_to(&r, 2, FL_SLOT_FAILED);
    (void)drive_to(&r, 3, FL_SLOT_READING);
    for (uint32_t i = 1; i < 4; i++) {
        uint32_t w = state_of(&r, i);
        c = 42;
        assert(fl_ring_cancel(m, i, &c) == FL_OK && c == 0);
        assert(state_of(&r, i) == w);
    }
    assert(ctr(&H(&r)->n_cancelled) == 1);
    /* the cancelled claim can still be published by its owner */
    assert(fl_ring_publish(m, 0, st, 1) == FL_OK);
    /* arguments */
    assert(fl_ring_cancel(m, 4, &c) == FL_EINVAL);
    assert(fl_ring_cancel(m, 0, NULL) == FL_EINVAL);
    assert(fl_ring_cancel(NULL, 0, &c) == FL_EINVAL);
    ring_free(&r);
}

static void test_reclaim_slot(void) {
    ring r = ring_new(4, 64);
    void *m = r.mem;
    uint32_t a = queue_claim(&r, 0, 10, 1); /* worker 1 */
    uint32_t b = queue_claim(&r, 1, 11, 1); /* worker 1 */
    uint32_t c = queue_claim(&r, 2, 12, 2); /* worker 2 */
    int done = 7;
    /* wrong owner, wrong state, bad arguments */
    assert(fl_ring_reclaim_slot(m, 2, 1, 1, &done) == FL_OK && done == 0);
    assert(state_of(&r, 2) == c);
    assert(fl_ring_reclaim_slot(m, 3, 1, 1, &done) == FL_OK && done == 0); /* FREE slot */
    assert(fl_ring_reclaim_slot(m, 4, 1, 1, &done) == FL_EINVAL);
    assert(fl_ring_reclaim_slot(m, 0, 1, 1, NULL) == FL_EINVAL);
    /* requeue: QUEUED with a new generation, the task unchanged, claimable again */
    assert(fl_ring_reclaim_slot(m, 0, 1, 1, &done) == FL_OK && done == 1);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(a) + 1, 0, FL_SLOT_QUEUED));
    assert(fl_ring_slot(m, 0)->seq == 10);
    /* abandon: FREE with a new generation; the dead claim can no longer publish */
    assert(fl_ring_reclaim_slot(m, 1, 1, 0, &done) == FL_OK && done == 1);
    assert(state_of(&r, 1) == FL_MAKE_STATE(GEN(b) + 1, 0, FL_SLOT_FREE));
    assert(fl_ring_publish(m, 1, b, 1) == FL_ESTATE);
    assert(fl_ring_publish(m, 0, a, 1) == FL_ESTATE);
    assert(ctr(&H(&r)->n_reclaimed) == 2);
    uint32_t slot, st;
    assert(fl_ring_claim(m, 3, 0, &slot, &st) == FL_OK && slot == 0 && GEN(st) == GEN(a) + 1);
    assert(fl_ring_claim(m, 3, 0, &slot, &st) == FL_ETIMEOUT); /* slot 1 was not re-queued */
    ring_free(&r);
}

static void test_reclaim(void) {
    ring r = ring_new(8, 64);
    void *m = r.mem;
    /* worker 1 holds slots 0, 1, 2 and has published slot 3; worker 2 holds slot 4;
     * worker 1 also published FAILED on slot 5; slot 6 is still QUEUED. */
    uint32_t a = queue_claim(&r, 0, 10, 1);
    uint32_t b = queue_claim(&r, 1, 11, 1);
    uint32_t c = queue_claim(&r, 2, 12, 1);
    uint32_t d = queue_claim(&r, 3, 13, 1);
    uint32_t e = queue_claim(&r, 4, 14, 2);
    uint32_t f = queue_claim(&r, 5, 15, 1);
    assert(fl_ring_publish(m, 3, d, 1) == FL_OK);
    assert(fl_ring_publish(m, 5, f, 0) == FL_OK);
    assert(fl_ring_queue(m, 6, 16, 0, 1) == FL_OK);
    uint32_t q6 = state_of(&r, 6);
    uint32_t r3 = state_of(&r, 3), r5 = state_of(&r, 5);
    fl_atomic_store_relaxed_u64(&fl_ring_slot(m, 0)->progress, 123);

    uint32_t cnt = 99;
    assert(fl_ring_reclaim(m, 1, &cnt) == FL_OK && cnt == 3);
    const uint32_t held[3] = {a, b, c};
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t w = state_of(&r, i);
        assert(w == FL_MAKE_STATE(GEN(held[i]) + 1, 0, FL_SLOT_QUEUED));
        assert(fl_ring_slot(m, i)->seq == 10 + i); /* the task is unchanged */
    }
    assert(fl_ring_slot(m, 0)->progress == 0);
    assert(state_of(&r, 3) == r3); /* READY stays READY */
    assert(state_of(&r, 5) == r5); /* FAILED stays FAILED */
    assert(state_of(&r, 4) == e);  /* another worker's claim is untouched */
    assert(state_of(&r, 6) == q6); /* QUEUED untouched */
    assert(ctr(&H(&r)->n_reclaimed) == 3);
    /* a second reclaim finds nothing */
    assert(fl_ring_reclaim(m, 1, &cnt) == FL_OK && cnt == 0);
    assert(fl_ring_reclaim(m, 3, &cnt) == FL_OK && cnt == 0);
    assert(ctr(&H(&r)->n_reclaimed) == 3);
    /* the re-queued tasks are claimed again, lowest seq first */
    uint32_t slot, st;
    for (uint32_t i = 0; i < 3; i++) {
        assert(fl_ring_claim(m, 7, 0, &slot, &st) == FL_OK && slot == i);
        assert(GEN(st) == GEN(held[i]) + 1 && OWNER(st) == 7);
        assert(fl_ring_publish(m, slot, held[i], 1) == FL_ESTATE);
        assert(fl_ring_publish(m, slot, st, 1) == FL_OK);
    }
    /* reclaim of worker 2 */
    assert(fl_ring_reclaim(m, 2, &cnt) == FL_OK && cnt == 1);
    assert(state_of(&r, 4) == FL_MAKE_STATE(GEN(e) + 1, 0, FL_SLOT_QUEUED));
    /* arguments */
    assert(fl_ring_reclaim(m, FL_MAX_WORKERS + 1, &cnt) == FL_EINVAL);
    assert(fl_ring_reclaim(m, 1, NULL) == FL_EINVAL);
    assert(fl_ring_reclaim(NULL, 1, &cnt) == FL_EINVAL);
    assert(fl_ring_reclaim(m, FL_MAX_WORKERS, &cnt) == FL_OK && cnt == 0);
    ring_free(&r);
}

static void test_generation_wraps(void) {
    ring r = ring_new(2, 64);
    void *m = r.mem;
    int c;
    for (uint32_t i = 1; i <= 70000; i++) {
        assert(fl_ring_queue(m, 0, i, 0, 1) == FL_OK);
        uint32_t w = state_of(&r, 0);
        assert(ST(w) == FL_SLOT_QUEUED && GEN(w) == (i & 0xFFFFu) && OWNER(w) == 0);
        assert(fl_ring_cancel(m, 0, &c) == FL_OK && c == 1);
    }
    /* reclaim bumps the generation too, and wraps from 0xFFFF to 0 */
    while (GEN(state_of(&r, 1)) != 0xFFFEu) {
        assert(fl_ring_queue(m, 1, 1, 0, 1) == FL_OK);
        assert(fl_ring_cancel(m, 1, &c) == FL_OK && c == 1);
    }
    uint32_t st = queue_claim(&r, 1, 5, 4); /* gen 0xFFFF */
    assert(GEN(st) == 0xFFFFu);
    uint32_t cnt;
    assert(fl_ring_reclaim(m, 4, &cnt) == FL_OK && cnt == 1);
    assert(state_of(&r, 1) == FL_MAKE_STATE(0, 0, FL_SLOT_QUEUED));
    uint32_t slot, st2;
    assert(fl_ring_claim(m, 4, 0, &slot, &st2) == FL_OK && slot == 1 && GEN(st2) == 0);
    assert(fl_ring_publish(m, 1, st, 1) == FL_ESTATE);
    assert(fl_ring_publish(m, 1, st2, 1) == FL_OK);
    ring_free(&r);
}

static void test_owner_bits(void) {
    const uint32_t ids[] = {0, 1, 7, 100, 2048, FL_MAX_WORKERS};
    const uint32_t n = sizeof ids / sizeof ids[0];
    ring r = ring_new(n, 64);
    void *m = r.mem;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t st = queue_claim(&r, i, i, ids[i]);
        assert(OWNER(st) == ids[i] && OWNER(state_of(&r, i)) == ids[i]);
        assert(GEN(st) == 1);
        assert(fl_ring_publish(m, i, st, (int)(i & 1)) == FL_OK);
        uint32_t w = state_of(&r, i);
        assert(OWNER(w) == ids[i] && ST(w) == ((i & 1) ? FL_SLOT_READY : FL_SLOT_FAILED));
        if (i & 1) {
            assert(fl_ring_begin_read(m, i) == FL_OK);
            assert(OWNER(state_of(&r, i)) == ids[i]);
        }
        assert(fl_ring_release(m, i) == FL_OK);
        assert(OWNER(state_of(&r, i)) == 0);
    }
    uint32_t slot, st;
    assert(fl_ring_queue(m, 0, 1, 0, 1) == FL_OK);
    assert(fl_ring_claim(m, FL_MAX_WORKERS + 1, 0, &slot, &st) == FL_EINVAL);
    assert(ST(state_of(&r, 0)) == FL_SLOT_QUEUED); /* the bad call claimed nothing */
    ring_free(&r);
}

static void test_release_states(void) {
    ring r = ring_new(6, 64);
    void *m = r.mem;
    const uint32_t ok_states[] = {FL_SLOT_READY, FL_SLOT_FAILED, FL_SLOT_READING};
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t w = drive_to(&r, i, ok_states[i]);
        assert(fl_ring_release(m, i) == FL_OK);
        assert(state_of(&r, i) == FL_MAKE_STATE(GEN(w), 0, FL_SLOT_FREE));
        assert(fl_ring_release(m, i) == FL_ESTATE); /* now FREE */
    }
    assert(ctr(&H(&r)->n_released) == 3);
    const uint32_t bad_states[] = {FL_SLOT_FREE, FL_SLOT_CLAIMED, FL_SLOT_QUEUED};
    for (uint32_t i = 3; i < 6; i++) {
        uint32_t w = drive_to(&r, i, bad_states[i - 3]);
        assert(fl_ring_release(m, i) == FL_ESTATE);
        assert(state_of(&r, i) == w);
    }
    assert(ctr(&H(&r)->n_released) == 3);
    assert(fl_ring_release(m, 6) == FL_EINVAL);
    assert(fl_ring_release(NULL, 0) == FL_EINVAL);
    /* begin_read only from READY */
    assert(fl_ring_begin_read(m, 3) == FL_ESTATE); /* FREE */
    assert(fl_ring_begin_read(m, 4) == FL_ESTATE); /* CLAIMED */
    assert(fl_ring_begin_read(m, 5) == FL_ESTATE); /* QUEUED */
    (void)drive_to(&r, 1, FL_SLOT_FAILED);
    assert(fl_ring_begin_read(m, 1) == FL_ESTATE); /* FAILED */
    assert(fl_ring_begin_read(m, 6) == FL_EINVAL);
    ring_free(&r);
}

static void test_slot_bounds(void) {
    ring r = ring_new(5, 64);
    for (uint32_t i = 0; i < 5; i++)
        assert((char *)fl_ring_slot(r.mem, i) ==
               (char *)r.mem + sizeof(fl_header) + i * sizeof(fl_slot_hdr));
    assert(fl_ring_slot(r.mem, 5) == NULL);
    assert(fl_ring_slot(r.mem, 6) == NULL);
    assert(fl_ring_slot(r.mem, UINT32_MAX) == NULL);
    assert(fl_ring_slot(NULL, 0) == NULL);
    uint32_t w;
    assert(fl_ring_slot_state(r.mem, 5, &w) == FL_EINVAL);
    assert(fl_ring_slot_state(r.mem, 0, NULL) == FL_EINVAL);
    assert(fl_ring_slot_state(NULL, 0, &w) == FL_EINVAL);
    ring_free(&r);
}

static void test_progress_result_info(void) {
    ring r = ring_new(3, 64);
    void *m = r.mem;
    fl_slot_info info;
    memset(&info, 0xEE, sizeof info);
    assert(fl_ring_slot_info(m, 1, &info) == FL_OK);
    assert(info.state == 0 && info.seq == 0 && info.count == 0 && info.epoch == 0);
    assert(info.progress == 0 && info.pid == 0 && info.flags == 0 && info.var_bytes == 0);

    assert(fl_ring_queue(m, 1, 42, 7, 9) == FL_OK);
    assert(fl_ring_slot_info(m, 1, &info) == FL_OK);
    assert(info.state == state_of(&r, 1) && ST(info.state) == FL_SLOT_QUEUED);
    assert(info.seq == 42 && info.epoch == 7 && info.count == 9);
    uint32_t slot, st;
    assert(fl_ring_claim(m, 3, 0, &slot, &st) == FL_OK && slot == 1);
    assert(fl_ring_set_progress(m, 1, 5, 1234) == FL_OK);
    assert(fl_ring_slot_info(m, 1, &info) == FL_OK);
    assert(info.state == st && info.progress == 5 && info.pid == 1234);
    assert(fl_ring_set_progress(m, 1, 9, 1234) == FL_OK);
    assert(fl_ring_set_result(m, 1, FL_SLOT_F_SPILLED, 777) == FL_OK);
    assert(fl_ring_publish(m, 1, st, 1) == FL_OK);
    assert(fl_ring_slot_info(m, 1, &info) == FL_OK);
    assert(ST(info.state) == FL_SLOT_READY && OWNER(info.state) == 3);
    assert(info.progress == 9 && info.pid == 1234);
    assert(info.flags == FL_SLOT_F_SPILLED && info.var_bytes == 777);
    assert(info.seq == 42 && info.epoch == 7 && info.count == 9);
    /* the other slots are untouched */
    assert(fl_ring_slot_info(m, 0, &info) == FL_OK && info.progress == 0 && info.pid == 0);
    assert(fl_ring_slot_info(m, 2, &info) == FL_OK && info.flags == 0 && info.var_bytes == 0);
    /* release and re-queue reset what the previous worker wrote */
    assert(fl_ring_release(m, 1) == FL_OK);
    assert(fl_ring_queue(m, 1, 43, 8, 10) == FL_OK);
    assert(fl_ring_slot_info(m, 1, &info) == FL_OK);
    assert(info.seq == 43 && info.epoch == 8 && info.count == 10);
    assert(info.progress == 0 && info.pid == 0 && info.flags == 0 && info.var_bytes == 0);
    /* reclaim forgets the dead worker's progress */
    assert(fl_ring_claim(m, 4, 0, &slot, &st) == FL_OK && slot == 1);
    assert(fl_ring_set_progress(m, 1, 6, 99) == FL_OK);
    uint32_t cnt;
    assert(fl_ring_reclaim(m, 4, &cnt) == FL_OK && cnt == 1);
    assert(fl_ring_slot_info(m, 1, &info) == FL_OK && info.progress == 0);
    /* arguments */
    assert(fl_ring_set_progress(m, 3, 1, 1) == FL_EINVAL);
    assert(fl_ring_set_progress(NULL, 0, 1, 1) == FL_EINVAL);
    assert(fl_ring_set_result(m, 3, 1, 1) == FL_EINVAL);
    assert(fl_ring_set_result(m, UINT32_MAX, 1, 1) == FL_EINVAL);
    assert(fl_ring_set_result(NULL, 0, 1, 1) == FL_EINVAL);
    assert(fl_ring_slot_info(m, 3, &info) == FL_EINVAL);
    assert(fl_ring_slot_info(m, 0, NULL) == FL_EINVAL);
    assert(fl_ring_slot_info(NULL, 0, &info) == FL_EINVAL);
    ring_free(&r);
}

static void test_stats_balance(void) {
    ring r = ring_new(8, 64);
    void *m = r.mem;
    const fl_header *h = H(&r);
    uint32_t slot, st, cnt;
    int c;
    /* 6 queued; 1 cancelled; 5 claimed; of those 2 reclaimed and claimed again; 1 failed */
    for (uint32_t i = 0; i < 6; i++) assert(fl_ring_queue(m, i, i, 0, 1) == FL_OK);
    assert(fl_ring_cancel(m, 5, &c) == FL_OK && c == 1);
    uint32_t sts[5];
    for (uint32_t i = 0; i < 5; i++) {
        assert(fl_ring_claim(m, i < 2 ? 1 : 2, 0, &slot, &st) == FL_OK && slot == i);
        sts[i] = st;
    }
    assert(fl_ring_reclaim(m, 1, &cnt) == FL_OK && cnt == 2);
    for (uint32_t i = 0; i < 2; i++) {
        assert(fl_ring_claim(m, 3, 0, &slot, &st) == FL_OK && slot == i);
        sts[i] = st;
    }
    for (uint32_t i = 0; i < 5; i++) assert(fl_ring_publish(m, i, sts[i], i != 4) == FL_OK);
    assert(fl_ring_begin_read(m, 0) == FL_OK);
    for (uint32_t i = 0; i < 5; i++) assert(fl_ring_release(m, i) == FL_OK);
    assert(h->n_queued == 6 && h->n_cancelled == 1 && h->n_reclaimed == 2);
    assert(h->n_claimed == 7 && h->n_published == 5 && h->n_released == 5);
    /* the balance that holds whenever every slot is FREE */
    assert(h->n_queued + h->n_reclaimed == h->n_claimed + h->n_cancelled);
    assert(h->n_claimed == h->n_published + h->n_reclaimed);
    assert(h->n_published == h->n_released);
    for (uint32_t i = 0; i < 8; i++) assert(ST(state_of(&r, i)) == FL_SLOT_FREE);
    ring_free(&r);
}

static void test_strerror(void) {
    for (int rc = FL_STATUS_MIN; rc <= FL_OK; rc++) {
        const char *s = fl_strerror(rc);
        assert(s != NULL && *s != '\0');
        assert(strstr(s, "unknown") == NULL);
        for (int o = FL_STATUS_MIN; o < rc; o++) assert(strcmp(s, fl_strerror(o)) != 0);
    }
    assert(strstr(fl_strerror(1), "unknown") != NULL);
    assert(strstr(fl_strerror(FL_STATUS_MIN - 1), "unknown") != NULL);
    assert(fl_strerror(-1000000) != NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* sleeping and waking across threads                                                         */

typedef struct claimer {
    ring *r;
    uint32_t worker;
    int64_t timeout_ns;
    int rc;
    uint32_t slot, state;
    int64_t t_return;
    fl_atomic_u32 done;
} claimer;

static void *claimer_main(void *arg) {
    claimer *c = arg;
    c->rc = fl_ring_claim(c->r->mem, c->worker, c->timeout_ns, &c->slot, &c->state);
    c->t_return = fl_now_ns();
    fl_atomic_store_release_u32(&c->done, 1);
    return NULL;
}

static void test_stop_wakes_sleeping_claim(void) {
    ring r = ring_new(4, 64);
    assert(!fl_ring_stopped(r.mem));
    enum { NT = 3 };
    claimer c[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        c[i] = (claimer){.r = &r, .worker = (uint32_t)i + 1, .timeout_ns = 10000 * MS};
        assert(pthread_create(&th[i], NULL, claimer_main, &c[i]) == 0);
    }
    /* every thread has announced itself as a sleeper */
    assert(await_u32_ge(&H(&r)->task_waiters, NT, 5000));
    sleep_ms(30);
    for (int i = 0; i < NT; i++) assert(fl_atomic_load_acquire_u32(&c[i].done) == 0);
    int64_t t_stop = fl_now_ns();
    assert(fl_ring_stop(r.mem) == FL_OK);
    for (int i = 0; i < NT; i++) {
        assert(pthread_join(th[i], NULL) == 0);
        assert(c[i].rc == FL_ESTOPPED);
        double lat = (double)(c[i].t_return - t_stop) / 1e6;
        printf("  sleeping claim %d returned %.2f ms after stop\n", i, lat);
        assert(lat < 1000.0);
    }
    assert(fl_ring_stopped(r.mem));
    assert(fl_atomic_load_acquire_u32(&H(&r)->task_waiters) == 0);
    /* once stopped, claim refuses at once even with work queued */
    assert(fl_ring_queue(r.mem, 0, 1, 0, 1) == FL_OK);
    uint32_t slot, st;
    int64_t t0 = fl_now_ns();
    assert(fl_ring_claim(r.mem, 1, 0, &slot, &st) == FL_ESTOPPED);
    assert(fl_ring_claim(r.mem, 1, 1000 * MS, &slot, &st) == FL_ESTOPPED);
    assert(ms_since(t0) < 100.0);
    assert(ST(state_of(&r, 0)) == FL_SLOT_QUEUED);
    assert(fl_ring_stop(r.mem) == FL_OK); /* idempotent */
    assert(fl_ring_stop(NULL) == FL_EINVAL);
    assert(fl_ring_stopped(NULL) == 1);
    ring_free(&r);
}

static void test_queue_wakes_sleeping_claim(void) {
    ring r = ring_new(4, 64);
    claimer c = {.r = &r, .worker = 5, .timeout_ns = 10000 * MS};
    pthread_t th;
    assert(pthread_create(&th, NULL, claimer_main, &c) == 0);
    assert(await_u32_ge(&H(&r)->task_waiters, 1, 5000));
    assert(await_u64_ge(&H(&r)->n_futex_waits, 1, 5000));
    sleep_ms(20);
    int64_t t_q = fl_now_ns();
    assert(fl_ring_queue(r.mem, 2, 77, 0, 1) == FL_OK);
    assert(pthread_join(th, NULL) == 0);
    double lat = (double)(c.t_return - t_q) / 1e6;
    printf("  sleeping claim got the task %.2f ms after queue\n", lat);
    assert(c.rc == FL_OK && c.slot == 2 && OWNER(c.state) == 5);
    assert(lat < 1000.0);
    assert(ctr(&H(&r)->n_futex_wakes) >= 1);
    ring_free(&r);
}

static void test_reclaim_wakes_sleeping_claim(void) {
    ring r = ring_new(4, 64);
    uint32_t dead = queue_claim(&r, 3, 9, 11); /* worker 11 "dies" holding slot 3 */
    claimer c = {.r = &r, .worker = 12, .timeout_ns = 10000 * MS};
    pthread_t th;
    assert(pthread_create(&th, NULL, claimer_main, &c) == 0);
    assert(await_u32_ge(&H(&r)->task_waiters, 1, 5000));
    sleep_ms(20);
    int64_t t_q = fl_now_ns();
    uint32_t cnt;
    assert(fl_ring_reclaim(r.mem, 11, &cnt) == FL_OK && cnt == 1);
    assert(pthread_join(th, NULL) == 0);
    double lat = (double)(c.t_return - t_q) / 1e6;
    printf("  sleeping claim got the reclaimed task %.2f ms after reclaim\n", lat);
    assert(c.rc == FL_OK && c.slot == 3 && OWNER(c.state) == 12 && GEN(c.state) == GEN(dead) + 1);
    assert(lat < 1000.0);
    assert(fl_ring_publish(r.mem, 3, dead, 1) == FL_ESTATE);
    assert(fl_ring_publish(r.mem, 3, c.state, 1) == FL_OK);
    ring_free(&r);
}

typedef struct waiter {
    ring *r;
    uint32_t slot;
    int rc;
    uint32_t state;
    int64_t t_return;
} waiter;

static void *waiter_main(void *arg) {
    waiter *w = arg;
    w->rc = fl_ring_wait(w->r->mem, w->slot, 10000 * MS, &w->state);
    w->t_return = fl_now_ns();
    return NULL;
}

static void test_publish_wakes_sleeping_wait(void) {
    ring r = ring_new(4, 64);
    for (int ok = 0; ok <= 1; ok++) {
        uint32_t st = queue_claim(&r, 1, 5, 2);
        waiter w = {.r = &r, .slot = 1};
        pthread_t th;
        assert(pthread_create(&th, NULL, waiter_main, &w) == 0);
        assert(await_u32_ge(&H(&r)->ready_waiters, 1, 5000));
        sleep_ms(20);
        *(volatile unsigned char *)slot_data(&r, 1) = (unsigned char)(ok + 1); /* the payload */
        int64_t t_p = fl_now_ns();
        assert(fl_ring_publish(r.mem, 1, st, ok) == FL_OK);
        assert(pthread_join(th, NULL) == 0);
        double lat = (double)(w.t_return - t_p) / 1e6;
        printf("  sleeping wait saw the %s publish %.2f ms later\n", ok ? "READY" : "FAILED", lat);
        assert(w.rc == FL_OK && ST(w.state) == (ok ? FL_SLOT_READY : FL_SLOT_FAILED));
        assert(lat < 1000.0);
        assert(*slot_data(&r, 1) == ok + 1);
        assert(fl_ring_release(r.mem, 1) == FL_OK);
    }
    assert(fl_atomic_load_acquire_u32(&H(&r)->ready_waiters) == 0);
    ring_free(&r);
}

/* Many rounds of N threads racing for a single queued slot: exactly one wins each round. */
typedef struct racer {
    ring *r;
    uint32_t id;
    fl_atomic_u32 *go;
    uint32_t rounds;
    uint32_t wins;
} racer;

static void *racer_main(void *arg) {
    racer *x = arg;
    for (uint32_t round = 1; round <= x->rounds; round++) {
        while (fl_atomic_load_acquire_u32(x->go) < round) sched_yield();
        uint32_t slot, st;
        int rc = fl_ring_claim(x->r->mem, x->id, 0, &slot, &st);
        if (rc == FL_OK) {
            assert(slot == 0 && OWNER(st) == x->id);
            x->wins++;
            assert(fl_ring_publish(x->r->mem, 0, st, 1) == FL_OK);
        } else {
            assert(rc == FL_ETIMEOUT);
        }
        fl_atomic_fetch_add_acq_rel_u32(x->go + 1, 1); /* round finished */
    }
    return NULL;
}

static void test_claim_race_one_slot(void) {
    ring r = ring_new(1, 64);
    enum { NT = 3 };
    const uint32_t rounds = 2000;
    fl_atomic_u32 go[2] = {0, 0};
    racer x[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        x[i] = (racer){.r = &r, .id = (uint32_t)i + 1, .go = go, .rounds = rounds};
        assert(pthread_create(&th[i], NULL, racer_main, &x[i]) == 0);
    }
    for (uint32_t round = 1; round <= rounds; round++) {
        assert(fl_ring_queue(r.mem, 0, round, 0, 1) == FL_OK);
        fl_atomic_store_release_u32(&go[0], round);
        while (fl_atomic_load_acquire_u32(&go[1]) < round * NT) sched_yield();
        uint32_t w = state_of(&r, 0);
        assert(ST(w) == FL_SLOT_READY); /* someone won, exactly once */
        assert(fl_ring_release(r.mem, 0) == FL_OK);
    }
    uint32_t total = 0;
    for (int i = 0; i < NT; i++) {
        assert(pthread_join(th[i], NULL) == 0);
        total += x[i].wins;
    }
    assert(total == rounds);
    assert(ctr(&H(&r)->n_claimed) == rounds && ctr(&H(&r)->n_published) == rounds);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* multi-threaded stress: 1 parent thread, NW worker threads                                  */

#define SLOT_WORDS 32 /* payload words per slot (256 bytes) */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

/* The payload word i of batch seq, its row count and its epoch. */
static uint64_t payload_word(uint64_t seq, uint32_t i) {
    return mix64(seq * 0x9E3779B97F4A7C15ull + i + 1);
}
static uint32_t count_of(uint64_t seq) { return 1 + (uint32_t)(mix64(seq) % SLOT_WORDS); }
static uint64_t epoch_of(uint64_t seq) { return seq / 1000; }

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

typedef struct stress stress;

typedef struct worker {
    stress *S;
    pthread_t th;
    uint32_t id;
    uint64_t rng;
    int running;           /* parent-private: the thread exists and is not joined */
    fl_atomic_u32 dead;     /* set by the worker as its last touch of the ring (release) */
    fl_atomic_u32 reclaimed; /* set by the parent after fl_ring_reclaim (release) */
    uint32_t tasks_done;
} worker;

struct stress {
    ring r;
    uint64_t ntasks;
    uint32_t nworkers;
    /* chaos knobs, in 1/1,000,000 per claim */
    uint32_t die_ppm, zombie_ppm, fail_ppm, cancel_ppm;
    uint32_t max_deaths;
    fl_atomic_u32 *ok_published; /* per seq: successful READY publishes */
    fl_atomic_u32 *claims;       /* per seq: successful claims */
    fl_atomic_u32 deaths_started;
    fl_atomic_u32 stale_rejected;
    fl_atomic_u32 fails;
    worker *w;       /* nworkers entries */
    uint32_t next_id;
};

static void *worker_main(void *arg) {
    worker *me = arg;
    stress *S = me->S;
    void *m = S->r.mem;
    assert(fl_ring_attach(m, S->r.total) == FL_OK); /* what a worker process does first */
    uint64_t buf[SLOT_WORDS];
    for (;;) {
        uint32_t slot = UINT32_MAX, st = 0;
        int rc = fl_ring_claim(m, me->id, 20 * MS, &slot, &st);
        if (rc == FL_ESTOPPED) break;
        if (rc == FL_ETIMEOUT) continue;
        assert(rc == FL_OK);
        assert(slot < S->r.nslots);
        assert(ST(st) == FL_SLOT_CLAIMED && OWNER(st) == me->id);
        fl_slot_hdr *s = fl_ring_slot(m, slot);
        uint64_t seq = fl_atomic_load_relaxed_u64(&s->seq);
        assert(seq < S->ntasks);
        uint32_t count = s->count;
        assert(count == count_of(seq) && s->epoch == epoch_of(seq));
        fl_atomic_fetch_add_acq_rel_u32(&S->claims[seq], 1);
        assert(fl_ring_set_progress(m, slot, 0, me->id) == FL_OK);
        uint64_t *data = (uint64_t *)slot_data(&S->r, slot);

        uint64_t roll = rng_next(&me->rng) % 1000000u;
        if (roll < S->die_ppm &&
            fl_atomic_fetch_add_acq_rel_u32(&S->deaths_started, 1) < S->max_deaths) {
            /* die half-way through the batch, leaving torn data in the slot */
            for (uint32_t i = 0; i < count / 2 + 1; i++) data[i] = ~payload_word(seq, i);
            assert(fl_ring_set_progress(m, slot, count / 2 + 1, me->id) == FL_OK);
            int zombie = roll < S->zombie_ppm;
            fl_atomic_store_release_u32(&me->dead, 1); /* from here on: no data-plane access */
            if (zombie) {
                /* a process that was only presumed dead wakes up after the reclaim and tries
                 * to publish: its stale word must be refused */
                while (!fl_atomic_load_acquire_u32(&me->reclaimed)) sched_yield();
                assert(fl_ring_publish(m, slot, st, 1) == FL_ESTATE);
                fl_atomic_fetch_add_acq_rel_u32(&S->stale_rejected, 1);
            }
            return NULL;
        }
        for (uint32_t i = 0; i < count; i++) buf[i] = payload_word(seq, i);
        int ok = !(rng_next(&me->rng) % 1000000u < S->fail_ppm);
        if (ok) {
            assert(fl_pack_copy(data, S->r.slot_bytes, 0, buf, (size_t)count * 8) == FL_OK);
            assert(fl_ring_set_result(m, slot, (uint32_t)(seq & 1), (uint64_t)count * 8) == FL_OK);
        } else {
            fl_atomic_fetch_add_acq_rel_u32(&S->fails, 1);
        }
        assert(fl_ring_set_progress(m, slot, count, me->id) == FL_OK);
        /* nobody reclaims a live worker, so publish cannot lose */
        assert(fl_ring_publish(m, slot, st, ok) == FL_OK);
        if (ok) fl_atomic_fetch_add_acq_rel_u32(&S->ok_published[seq], 1);
        me->tasks_done++;
    }
    fl_atomic_store_release_u32(&me->dead, 1);
    return NULL;
}

static void spawn_worker(stress *S, uint32_t k) {
    worker *w = &S->w[k];
    assert(!w->running);
    assert(S->next_id <= FL_MAX_WORKERS);
    uint32_t id = S->next_id++;
    *w = (worker){.S = S, .id = id, .rng = mix64(id * 7919u + 1) | 1, .running = 1};
    assert(pthread_create(&w->th, NULL, worker_main, w) == 0);
}

/* Parent: find workers that died, reclaim their slots, start replacements. */
static uint32_t reap_dead(stress *S) {
    uint32_t reaped = 0;
    for (uint32_t k = 0; k < S->nworkers; k++) {
        worker *w = &S->w[k];
        if (!w->running || !fl_atomic_load_acquire_u32(&w->dead)) continue;
        uint32_t cnt = 99;
        assert(fl_ring_reclaim(S->r.mem, w->id, &cnt) == FL_OK);
        assert(cnt == 1); /* it died holding exactly one claim */
        fl_atomic_store_release_u32(&w->reclaimed, 1);
        assert(pthread_join(w->th, NULL) == 0);
        w->running = 0;
        reaped++;
        spawn_worker(S, k);
    }
    return reaped;
}

typedef struct stress_result {
    uint64_t requeued_failed, cancelled, deaths, wait_timeouts;
} stress_result;

static stress_result run_stress(uint64_t ntasks, uint32_t nworkers, uint32_t nslots,
                                uint32_t die_ppm, uint32_t zombie_ppm, uint32_t fail_ppm,
                                uint32_t cancel_ppm, int64_t parent_wait_ns, uint64_t seed) {
    stress S;
    memset(&S, 0, sizeof S);
    S.r = ring_new(nslots, SLOT_WORDS * 8);
    S.ntasks = ntasks;
    S.nworkers = nworkers;
    S.die_ppm = die_ppm;
    S.zombie_ppm = zombie_ppm;
    S.fail_ppm = fail_ppm;
    S.cancel_ppm = cancel_ppm;
    S.max_deaths = 2000;
    S.ok_published = calloc(ntasks, sizeof(fl_atomic_u32));
    S.claims = calloc(ntasks, sizeof(fl_atomic_u32));
    uint8_t *delivered = calloc(ntasks, 1);
    uint32_t *slot_of = calloc(nslots, sizeof(uint32_t));
    uint32_t *freel = calloc(nslots, sizeof(uint32_t));
    S.w = calloc(nworkers, sizeof(worker));
    assert(S.ok_published && S.claims && delivered && slot_of && freel && S.w);
    S.next_id = 1;
    for (uint32_t k = 0; k < nworkers; k++) spawn_worker(&S, k);

    void *m = S.r.mem;
    uint64_t rng = seed | 1;
    uint32_t nfree = nslots;
    for (uint32_t i = 0; i < nslots; i++) freel[i] = i;
    uint64_t next_q = 0, next_c = 0;
    uint32_t window = nslots;
    stress_result res = {0, 0, 0, 0};
    int64_t last_progress = fl_now_ns();

    while (next_c < ntasks) {
        /* keep up to `window` tasks in flight, each in a random free slot */
        if ((next_c & 1023) == 0) window = (rng_next(&rng) % 4 == 0) ? 1 + (uint32_t)(rng_next(&rng) % nslots) : nslots;
        while (next_q < ntasks && next_q - next_c < window && nfree > 0) {
            uint32_t j = (uint32_t)(rng_next(&rng) % nfree);
            uint32_t slot = freel[j];
            freel[j] = freel[--nfree];
            assert(fl_ring_queue(m, slot, next_q, epoch_of(next_q), count_of(next_q)) == FL_OK);
            if (cancel_ppm && rng_next(&rng) % 1000000u < cancel_ppm) {
                int c = 0;
                assert(fl_ring_cancel(m, slot, &c) == FL_OK);
                if (c) { /* not claimed yet: the slot is FREE again, queue the seq anew */
                    assert(ST(state_of(&S.r, slot)) == FL_SLOT_FREE);
                    freel[nfree++] = slot;
                    res.cancelled++;
                    continue;
                }
            }
            slot_of[next_q % nslots] = slot;
            next_q++;
        }
        uint32_t slot = slot_of[next_c % nslots];
        uint32_t w = 0;
        for (;;) {
            int rc = fl_ring_wait(m, slot, parent_wait_ns, &w);
            res.deaths += reap_dead(&S);
            if (rc == FL_OK) break;
            assert(rc == FL_ETIMEOUT);
            res.wait_timeouts++;
            if (fl_now_ns() - last_progress > 60000 * MS) {
                fprintf(stderr, "stress: no progress for 60 s at seq %llu (slot %u, state %#x)\n",
                        (unsigned long long)next_c, slot, w);
                abort();
            }
        }
        fl_slot_info info;
        assert(fl_ring_slot_info(m, slot, &info) == FL_OK);
        assert(info.seq == next_c && info.state == w);
        assert(info.count == count_of(next_c) && info.epoch == epoch_of(next_c));
        assert(info.pid == OWNER(w) && info.progress == info.count);
        if (ST(w) == FL_SLOT_FAILED) {
            /* the parent retries a failed batch in the same slot */
            assert(fl_ring_release(m, slot) == FL_OK);
            assert(fl_ring_queue(m, slot, next_c, epoch_of(next_c), count_of(next_c)) == FL_OK);
            res.requeued_failed++;
            continue;
        }
        assert(ST(w) == FL_SLOT_READY);
        assert(fl_ring_begin_read(m, slot) == FL_OK);
        uint32_t count = count_of(next_c);
        assert(info.var_bytes == (uint64_t)count * 8 && info.flags == (uint32_t)(next_c & 1));
        const uint64_t *data = (const uint64_t *)slot_data(&S.r, slot);
        for (uint32_t i = 0; i < count; i++) {
            if (data[i] != payload_word(next_c, i)) {
                fprintf(stderr, "stress: torn/wrong payload: seq %llu slot %u word %u\n",
                        (unsigned long long)next_c, slot, i);
                abort();
            }
        }
        assert(delivered[next_c] == 0);
        delivered[next_c] = 1;
        assert(fl_ring_release(m, slot) == FL_OK);
        freel[nfree++] = slot;
        next_c++;
        last_progress = fl_now_ns();
    }

    assert(fl_ring_stop(m) == FL_OK);
    uint64_t done = 0;
    for (uint32_t k = 0; k < nworkers; k++) {
        worker *w = &S.w[k];
        if (!w->running) continue;
        assert(pthread_join(w->th, NULL) == 0);
        done += w->tasks_done;
    }
    (void)done;

    /* every seq delivered exactly once, published READY exactly once */
    uint64_t total_claims = 0;
    for (uint64_t q = 0; q < ntasks; q++) {
        assert(delivered[q] == 1);
        assert(S.ok_published[q] == 1);
        assert(S.claims[q] >= 1);
        total_claims += S.claims[q];
    }
    const fl_header *h = H(&S.r);
    for (uint32_t i = 0; i < nslots; i++) assert(ST(state_of(&S.r, i)) == FL_SLOT_FREE);
    assert(h->n_queued == ntasks + res.requeued_failed + res.cancelled);
    assert(h->n_cancelled == res.cancelled);
    assert(h->n_reclaimed == res.deaths);
    assert(h->n_claimed == total_claims);
    assert(h->n_claimed == h->n_published + h->n_reclaimed);
    assert(h->n_published == ntasks + res.requeued_failed);
    assert(h->n_released == h->n_published);
    assert(h->n_queued + h->n_reclaimed == h->n_claimed + h->n_cancelled);
    assert(S.fails == res.requeued_failed);
    assert(S.stale_rejected <= res.deaths);
    assert(fl_atomic_load_acquire_u32(&h->task_waiters) == 0);
    assert(fl_atomic_load_acquire_u32(&h->ready_waiters) == 0);
    printf("  %llu tasks, %u workers (%u started), %u slots: %llu deaths (%u zombies refused), "
           "%llu failed+retried, %llu cancelled, %llu parent wait timeouts, "
           "%llu futex waits, %llu futex wakes\n",
           (unsigned long long)ntasks, nworkers, S.next_id - 1, nslots,
           (unsigned long long)res.deaths, S.stale_rejected,
           (unsigned long long)res.requeued_failed, (unsigned long long)res.cancelled,
           (unsigned long long)res.wait_timeouts, (unsigned long long)h->n_futex_waits,
           (unsigned long long)h->n_futex_wakes);
    free(S.ok_published);
    free(S.claims);
    free(delivered);
    free(slot_of);
    free(freel);
    free(S.w);
    ring_free(&S.r);
    return res;
}

static uint64_t stress_tasks(void) { return (uint64_t)fl_test_env_long("FL_TEST_TASKS", FL_STRESS_TASKS); }
static uint64_t stress_seed(void) { return (uint64_t)fl_test_env_long("FL_TEST_SEED", 20240601); }

static void test_stress_in_order(void) {
    uint64_t n = stress_tasks();
    assert(n >= 1);
    /* nobody dies here, so the parent can afford long waits: a lost wake-up of the parent would
     * show up as a 2 s timeout instead of being papered over by a short one */
    stress_result res = run_stress(n, 4, 8, 0, 0, 0, 0, 2000 * MS, stress_seed());
    assert(res.wait_timeouts == 0);
}

static void test_stress_dying_workers(void) {
    uint64_t n = stress_tasks() / 4;
    if (n < 1000) n = 1000;
    /* per claim: 0.1% die (a third of them as zombies that publish late), 0.2% fail,
     * and the parent cancels 2% of fresh tasks right after queueing them */
    stress_result res = run_stress(n, 4, 8, 1000, 333, 2000, 20000, 5 * MS, stress_seed() + 1);
    assert(res.deaths > 0);
    assert(res.requeued_failed > 0);
}

/* Ping-pong over one slot with long timeouts: each hand-off usually has the other side asleep in
 * the kernel, and a lost wake-up would stall a hop until its (long) timeout. The parent's waits
 * must never time out; with a single worker, neither may its claims. */
typedef struct pp_worker {
    ring *r;
    uint32_t id;
    int cpu; /* pin to this CPU if >= 0 */
    uint64_t timeouts, done;
} pp_worker;


static void *pp_worker_main(void *arg) {
    pp_worker *w = arg;
    pin_self(w->cpu);
    for (;;) {
        uint32_t slot, st;
        int rc = fl_ring_claim(w->r->mem, w->id, 3000 * MS, &slot, &st);
        if (rc == FL_ESTOPPED) break;
        if (rc == FL_ETIMEOUT) {
            w->timeouts++;
            continue;
        }
        assert(rc == FL_OK && slot == 0);
        uint64_t seq = fl_atomic_load_relaxed_u64(&fl_ring_slot(w->r->mem, 0)->seq);
        *(uint64_t *)slot_data(w->r, 0) = payload_word(seq, 0);
        assert(fl_ring_publish(w->r->mem, 0, st, 1) == FL_OK);
        w->done++;
    }
    return NULL;
}

static void pingpong(uint32_t nworkers, uint64_t n, int64_t jitter_ns) {
    ring r = ring_new(1, 64);
    pp_worker w[2];
    pthread_t th[2];
    assert(nworkers <= 2);
    /* With jitter, the parent and the worker must really run side by side: left to itself the
     * scheduler tends to wake the worker on the parent's CPU, and then the worker always spins
     * out and sleeps before the parent gets to queue. */
    int cpu0 = -1, cpu1 = -1;
    cpu_set_t saved;
    assert(sched_getaffinity(0, sizeof saved, &saved) == 0);
    if (jitter_ns > 0) {
        cpu0 = nth_allowed_cpu(0);
        cpu1 = nth_allowed_cpu(1);
        if (cpu1 < 0) cpu0 = -1;
    }
    pin_self(cpu0);
    for (uint32_t k = 0; k < nworkers; k++) {
        w[k] = (pp_worker){.r = &r, .id = k + 1, .cpu = cpu1};
        assert(pthread_create(&th[k], NULL, pp_worker_main, &w[k]) == 0);
    }
    int64_t worst = 0;
    uint64_t rng = 0x5EED1234u + nworkers;
    for (uint64_t seq = 0; seq < n; seq++) {
        if (jitter_ns > 0) {
            /* queue at a random point of the worker's spin-then-sleep sequence, so that the
             * queue sometimes lands right where a claimer decides to go to sleep; the delay is
             * log-uniform (128 ns .. jitter_ns) so that windows of any width and position in
             * that range get hit */
            unsigned top = 7;
            while (top < 40 && ((int64_t)1 << (top + 1)) <= jitter_ns) top++;
            unsigned e = 7 + (unsigned)(rng_next(&rng) % (top - 6));
            int64_t d = ((int64_t)1 << e) + (int64_t)(rng_next(&rng) % ((uint64_t)1 << e));
            int64_t until = fl_now_ns() + d;
            while (fl_now_ns() < until) {
            }
        }
        int64_t t0 = fl_now_ns();
        assert(fl_ring_queue(r.mem, 0, seq, 0, 1) == FL_OK);
        uint32_t st;
        int rc;
        if (jitter_ns > 0) {
            /* poll, so that the next queue follows the publish by the jitter alone (a parent
             * asleep in wait would add its own wake-up latency and always miss early windows) */
            do rc = fl_ring_wait(r.mem, 0, 0, &st);
            while (rc == FL_ETIMEOUT && fl_now_ns() - t0 < 3000 * MS);
        } else {
            rc = fl_ring_wait(r.mem, 0, 3000 * MS, &st);
        }
        if (rc != FL_OK) {
            fprintf(stderr, "pingpong: hop %llu stalled for 3 s (state %#x): lost wake-up?\n",
                    (unsigned long long)seq, st);
            abort();
        }
        assert(ST(st) == FL_SLOT_READY);
        assert(*(const uint64_t *)slot_data(&r, 0) == payload_word(seq, 0));
        assert(fl_ring_release(r.mem, 0) == FL_OK);
        int64_t dt = fl_now_ns() - t0;
        if (dt > worst) worst = dt;
    }
    assert(fl_ring_stop(r.mem) == FL_OK);
    uint64_t done = 0, timeouts = 0;
    for (uint32_t k = 0; k < nworkers; k++) {
        assert(pthread_join(th[k], NULL) == 0);
        done += w[k].done;
        timeouts += w[k].timeouts;
    }
    assert(done == n);
    if (nworkers == 1) assert(timeouts == 0);
    (void)pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    const fl_header *h = H(&r);
    printf("  %u worker(s), %llu round trips (jitter %lld us), slowest %.2f ms, %llu futex waits, "
           "%llu wakes\n", nworkers, (unsigned long long)n, (long long)(jitter_ns / 1000),
           (double)worst / 1e6,
           (unsigned long long)h->n_futex_waits, (unsigned long long)h->n_futex_wakes);
    assert(h->n_futex_waits > 0); /* the hand-offs did go through the sleeping path */
    ring_free(&r);
}

static void test_pingpong_no_lost_wakeups(void) {
    uint64_t n = stress_tasks() / 10;
    if (n < 1000) n = 1000;
    pingpong(1, n, 0);
    pingpong(2, n, 0);
    pingpong(1, n / 20, 1000000); /* wide windows anywhere up to 1 ms */
    pingpong(1, n, 8000);         /* narrow windows around the end of the claim's spin phase */
}

/* ---------------------------------------------------------------------------------------- */
/* regressions: bugs these tests found, fixed in the core                                  */

/* try_claim uses UINT64_MAX as "nothing found" and compares with <, so a task with
 * seq == UINT64_MAX is never claimed. */
static void test_regression_seq_max(void) {
    ring r = ring_new(2, 64);
    assert(fl_ring_queue(r.mem, 0, UINT64_MAX, 0, 1) == FL_OK);
    uint32_t slot, st;
    assert(fl_ring_claim(r.mem, 1, 0, &slot, &st) == FL_OK && slot == 0);
    ring_free(&r);
}

/* deadline = fl_now_ns() + timeout_ns overflows int64 (undefined behaviour; UBSan aborts). */
static void test_regression_huge_timeout(void) {
    ring r = ring_new(2, 64);
    assert(fl_ring_queue(r.mem, 0, 1, 0, 1) == FL_OK);
    uint32_t slot, st;
    assert(fl_ring_claim(r.mem, 1, INT64_MAX, &slot, &st) == FL_OK);
    assert(fl_ring_publish(r.mem, 0, st, 1) == FL_OK);
    assert(fl_ring_wait(r.mem, 0, INT64_MAX, &st) == FL_OK);
    ring_free(&r);
}

/* fl_ring_slot_info reads flags/var_bytes (and count/epoch) with plain loads; the parent calls
 * it on slots a live worker holds (loader.py: _timeout_error, _check_workers), while that worker
 * writes flags/var_bytes with plain stores in fl_ring_set_result: a data race (TSan reports it;
 * run the TSan build of this binary). */
static void *regression_info_worker(void *arg) {
    ring *r = arg;
    for (int i = 0; i < 2000; i++) {
        uint32_t slot, st;
        while (fl_ring_claim(r->mem, 1, 1 * MS, &slot, &st) != FL_OK) {
        }
        assert(fl_ring_set_result(r->mem, slot, 1, (uint64_t)i) == FL_OK);
        assert(fl_ring_publish(r->mem, slot, st, 1) == FL_OK);
    }
    return NULL;
}

static void test_regression_slot_info_race(void) {
    ring r = ring_new(1, 64);
    pthread_t th;
    assert(pthread_create(&th, NULL, regression_info_worker, &r) == 0);
    for (int i = 0; i < 2000; i++) {
        assert(fl_ring_queue(r.mem, 0, (uint64_t)i, 0, 1) == FL_OK);
        uint32_t w;
        fl_slot_info info;
        do assert(fl_ring_slot_info(r.mem, 0, &info) == FL_OK); /* e.g. a timeout report */
        while (fl_ring_wait(r.mem, 0, 0, &w) != FL_OK);
        assert(fl_ring_release(r.mem, 0) == FL_OK);
    }
    assert(pthread_join(th, NULL) == 0);
    ring_free(&r);
}


/* fl_ring_queue_to: a targeted slot is claimed by its worker only, whatever its seq; a
 * reclaimed one keeps its target; fl_ring_set_rows shrinks the batch, bounded by count, and
 * a reclaim restores it. */
static void test_targeted_queue_and_rows(void) {
    ring r = ring_new(4, 64);
    void *m = r.mem;
    fl_slot_info info;
    uint32_t slot, st;
    assert(fl_ring_queue_to(m, 0, 10, 0, 5, 2) == FL_OK);    /* oldest, for worker 2 */
    assert(fl_ring_queue_to(m, 1, 11, 0, 5, FL_TARGET_ANY) == FL_OK);
    assert(fl_ring_slot_info(m, 0, &info) == FL_OK && info.target == 2 && info.rows == 5);
    assert(fl_ring_slot_info(m, 1, &info) == FL_OK && info.target == FL_TARGET_ANY);
    /* worker 1 skips slot 0 (not its own) and takes the untargeted one */
    assert(fl_ring_claim(m, 1, 0, &slot, &st) == FL_OK && slot == 1);
    assert(fl_ring_claim(m, 1, 0, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_claim(m, 2, 0, &slot, &st) == FL_OK && slot == 0);
    /* rows: at most count */
    assert(fl_ring_set_rows(m, 0, 6) == FL_ERANGE);
    assert(fl_ring_set_rows(m, 0, 3) == FL_OK);
    assert(fl_ring_set_result(m, 0, FL_SLOT_F_ENDED, 0) == FL_OK);
    assert(fl_ring_slot_info(m, 0, &info) == FL_OK && info.rows == 3 && info.count == 5);
    assert(info.flags == FL_SLOT_F_ENDED);
    /* worker 2 dies: the slot is re-queued for worker 2 again, its result forgotten */
    uint32_t cnt;
    assert(fl_ring_reclaim(m, 2, &cnt) == FL_OK && cnt == 1);
    assert(fl_ring_slot_info(m, 0, &info) == FL_OK && info.target == 2);
    assert(info.rows == 5 && info.flags == 0 && ST(info.state) == FL_SLOT_QUEUED);
    assert(fl_ring_claim(m, 3, 0, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_claim(m, 2, 0, &slot, &st) == FL_OK && slot == 0);
    assert(fl_ring_set_rows(m, 0, 0) == FL_OK);
    assert(fl_ring_publish(m, 0, st, 1) == FL_OK);
    assert(fl_ring_slot_info(m, 0, &info) == FL_OK && info.rows == 0);
    /* release + plain queue: any worker again */
    assert(fl_ring_release(m, 0) == FL_OK);
    assert(fl_ring_queue(m, 0, 12, 1, 4) == FL_OK);
    assert(fl_ring_slot_info(m, 0, &info) == FL_OK && info.target == FL_TARGET_ANY);
    assert(info.rows == 4);
    assert(fl_ring_claim(m, 3, 0, &slot, &st) == FL_OK && slot == 0);
    /* arguments */
    assert(fl_ring_queue_to(m, 2, 13, 0, 1, FL_MAX_WORKERS) == FL_EINVAL);
    assert(fl_ring_queue_to(m, 4, 13, 0, 1, 0) == FL_EINVAL);
    assert(fl_ring_set_rows(m, 4, 0) == FL_EINVAL);
    assert(fl_ring_set_rows(NULL, 0, 0) == FL_EINVAL);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* shared batches (NOTE [shared rows] in fl_ring.c): single-threaded                          */

#define TAKEN(worker) ((uint32_t)(worker) + 1) /* the row word of a row taken by worker */

/* Row-table words per slot: one cache line of meta, then max_rows words rounded up to a line. */
static size_t row_stride_words(uint32_t max_rows) {
    return FL_CACHELINE / 4 + round_up(max_rows, FL_CACHELINE / 4);
}

/* The row word itself (NOTE [region layout] in fl_layout.h). Tests that simulate a worker killed
 * between two steps of the protocol write what it leaves behind here directly. */
static fl_atomic_u32 *row_word(const ring *r, uint32_t slot, uint32_t row) {
    assert(slot < r->nslots && row < r->max_rows);
    char *tables = (char *)r->mem + sizeof(fl_header) + (size_t)r->nslots * sizeof(fl_slot_hdr);
    return (fl_atomic_u32 *)tables + (size_t)slot * row_stride_words(r->max_rows) +
           FL_CACHELINE / 4 + row;
}

static uint32_t row_of(const ring *r, uint32_t slot, uint32_t row) {
    uint32_t v = 0x12345678u;
    assert(fl_ring_row_state(r->mem, slot, row, &v) == FL_OK);
    assert(v == fl_atomic_load_acquire_u32(row_word(r, slot, row))); /* the documented layout */
    return v;
}

static uint32_t share_of(const ring *r, uint32_t slot) {
    return fl_atomic_load_acquire_u32(&fl_ring_slot(r->mem, slot)->share);
}

/* Every row in [from, to) of slot holds word v. */
static void assert_rows(const ring *r, uint32_t slot, uint32_t from, uint32_t to, uint32_t v) {
    for (uint32_t k = from; k < to; k++) {
        uint32_t got = row_of(r, slot, k);
        if (got != v) {
            fprintf(stderr, "slot %u row %u holds %#x, expected %#x\n", slot, k, got, v);
            abort();
        }
    }
}

/* fl_ring_take_rows that must return FL_OK: the rows taken (*first_out: the first, 0 if none). */
static uint32_t sh_take(ring *r, uint32_t slot, uint32_t state, uint32_t worker, uint32_t row,
                        uint32_t divisor, uint32_t *first_out) {
    uint32_t first = 77, n = 77;
    assert(fl_ring_take_rows(r->mem, slot, state, worker, row, divisor, &first, &n) == FL_OK);
    if (n == 0) assert(first == 0);
    if (first_out != NULL) *first_out = first;
    return n;
}

/* fl_ring_rows_done that must return FL_OK: whether it published the batch. */
static int sh_done(ring *r, uint32_t slot, uint32_t state, uint32_t worker, uint32_t first,
                   uint32_t n) {
    int pub = 7;
    assert(fl_ring_rows_done(r->mem, slot, state, worker, first, n, &pub) == FL_OK);
    assert(pub == 0 || pub == 1);
    return pub;
}

/* fl_ring_rows_fail that must return FL_OK: whether this worker is the one to fail the batch. */
static int sh_fail(ring *r, uint32_t slot, uint32_t state, uint32_t worker, uint32_t row,
                   uint32_t end) {
    int won = 7;
    assert(fl_ring_rows_fail(r->mem, slot, state, worker, row, end, &won) == FL_OK);
    assert(won == 0 || won == 1);
    return won;
}

static int sh_cancel(ring *r, uint32_t slot) {
    int c = 7;
    assert(fl_ring_cancel(r->mem, slot, &c) == FL_OK);
    assert(c == 0 || c == 1);
    return c;
}

static uint32_t rows_held(const ring *r, uint32_t worker) {
    uint32_t n = 99;
    assert(fl_ring_rows_of(r->mem, worker, NULL, NULL, 0, &n) == FL_OK);
    return n;
}

static uint32_t settle(ring *r, uint32_t slot, int64_t timeout_ns, int want_rc) {
    uint32_t busy = 99;
    assert(fl_ring_rows_settle(r->mem, slot, timeout_ns, &busy) == want_rc);
    return busy;
}

static void test_nbytes_rows(void) {
    assert(FL_CACHELINE == 128); /* the numbers below: 32 words of meta, rows in lines of 32 */
    const uint32_t ns[] = {1, 2, 3, 7, 64, FL_MAX_SLOTS};
    const uint32_t mr[] = {1, 2, 31, 32, 33, 100, 1000, FL_MAX_SHARED_ROWS - 1, FL_MAX_SHARED_ROWS};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        uint32_t n = ns[i];
        assert(fl_ring_nbytes_rows(n, 0) == fl_ring_nbytes(n));
        for (size_t j = 0; j < sizeof mr / sizeof mr[0]; j++) {
            size_t want = fl_ring_nbytes(n) + (size_t)n * (32 + round_up(mr[j], 32)) * 4;
            assert(fl_ring_nbytes_rows(n, mr[j]) == want);
            assert(want % FL_CACHELINE == 0);
        }
        assert(fl_ring_nbytes_rows(n, FL_MAX_SHARED_ROWS + 1) == 0);
        assert(fl_ring_nbytes_rows(n, UINT32_MAX) == 0);
    }
    /* 5 header lines, a line per slot header, then per slot a line of meta and the rows */
    assert(fl_ring_nbytes_rows(1, 1) == 6 * 128 + 2 * 128);
    assert(fl_ring_nbytes_rows(1, 32) == 6 * 128 + 2 * 128);
    assert(fl_ring_nbytes_rows(1, 33) == 6 * 128 + 3 * 128);
    assert(fl_ring_nbytes_rows(4, 100) == 9 * 128 + 4 * (128 + 512));
    assert(fl_ring_nbytes_rows(FL_MAX_SLOTS, FL_MAX_SHARED_ROWS) ==
           (size_t)(5 + FL_MAX_SLOTS) * 128 + (size_t)FL_MAX_SLOTS * (32 + 65536) * 4);
    assert(fl_ring_nbytes_rows(0, 0) == 0 && fl_ring_nbytes_rows(0, 8) == 0);
    assert(fl_ring_nbytes_rows(FL_MAX_SLOTS + 1, 8) == 0);
    for (uint32_t m = 0; m < 300; m++)
        assert(fl_ring_nbytes_rows(3, m + 1) >= fl_ring_nbytes_rows(3, m));
}

static void test_init_attach_rows(void) {
    const uint32_t n = 3, mr = 40;
    const size_t ctl = fl_ring_nbytes_rows(n, mr), plain = fl_ring_nbytes(n);
    assert(ctl == plain + n * (32 + 64) * 4);
    const size_t cap = 1 << 16;
    unsigned char *mem = xalloc(cap);
    memset(mem, 0xAB, cap);
    /* too many rows, bad memory or slot count, payload areas over the row tables */
    assert(fl_ring_init_rows(mem, cap, n, 64, ctl, 1, FL_MAX_SHARED_ROWS + 1) == FL_EINVAL);
    assert(fl_ring_init_rows(mem, cap, 0, 64, ctl, 1, mr) == FL_EINVAL);
    assert(fl_ring_init_rows(NULL, cap, n, 64, ctl, 1, mr) == FL_EINVAL);
    assert(fl_ring_init_rows(mem + 64, cap - 128, n, 64, ctl, 1, mr) == FL_EINVAL);
    assert(fl_ring_init_rows(mem, cap, n, 64, plain, 1, mr) == FL_ENOSPACE); /* fits no rows */
    assert(fl_ring_init_rows(mem, cap, n, 64, ctl - 1, 1, mr) == FL_ENOSPACE);
    assert(fl_ring_init_rows(mem, ctl - 1, n, 0, ctl - 1, 1, mr) == FL_ENOSPACE);
    assert(fl_ring_init_rows(mem, ctl + n * 64 - 1, n, 64, ctl, 1, mr) == FL_ENOSPACE);
    for (size_t i = 0; i < cap; i++) assert(mem[i] == 0xAB); /* no failing call wrote */

    /* exact fit: the row tables are formatted (zero: every row FREE), nothing past them */
    const size_t total = ctl + n * 64;
    assert(fl_ring_init_rows(mem, total, n, 64, ctl, -5, mr) == FL_OK);
    for (size_t i = plain; i < ctl; i++) assert(mem[i] == 0);
    for (size_t i = ctl; i < cap; i++) assert(mem[i] == 0xAB);
    fl_header *h = (fl_header *)mem;
    assert(h->max_rows == mr && h->nslots == n && h->data_offset == ctl && h->total_bytes == total);
    assert(h->layout_version == FL_LAYOUT_VERSION && h->creator_pid == -5 && h->row_waiters == 0);
    ring r = {.mem = mem, .total = total, .nslots = n, .max_rows = mr, .slot_bytes = 64,
              .data_offset = ctl};
    uint32_t v = 99;
    for (uint32_t s = 0; s < n; s++) {
        assert(share_of(&r, s) == FL_SHARE_OFF && state_of(&r, s) == 0);
        assert_rows(&r, s, 0, mr, FL_ROW_FREE);
        assert(fl_ring_row_state(mem, s, mr, &v) == FL_ERANGE && v == 99);
    }
    assert(fl_ring_row_state(mem, n, 0, &v) == FL_EINVAL);
    assert(fl_ring_row_state(mem, 0, 0, NULL) == FL_EINVAL);
    assert(fl_ring_row_state(NULL, 0, 0, &v) == FL_EINVAL);

    /* attach checks the size the row tables need */
    assert(fl_ring_attach(mem, total) == FL_OK);
    assert(fl_ring_attach(mem, total - 1) == FL_ELAYOUT);
    assert(fl_ring_attach(mem, total + 1) == FL_ELAYOUT);
    assert(fl_ring_attach(mem, ctl) == FL_ELAYOUT);
    h->max_rows = FL_MAX_SHARED_ROWS + 1;
    assert(fl_ring_attach(mem, total) == FL_ELAYOUT);
    h->max_rows = mr + 32; /* the row tables would run into the payload area */
    assert(fl_ring_attach(mem, total) == FL_ELAYOUT);
    h->max_rows = mr;
    assert(fl_ring_attach(mem, total) == FL_OK);
    /* a region sized for a ring without rows whose header claims rows */
    assert(fl_ring_init(mem, plain + n * 64, n, 64, plain, 0) == FL_OK);
    assert(h->max_rows == 0);
    assert(fl_ring_attach(mem, plain + n * 64) == FL_OK);
    h->max_rows = 1;
    assert(fl_ring_attach(mem, plain + n * 64) == FL_ELAYOUT);
    free(mem);

    /* a ring without row tables has no shared batches; its plain tasks are untouched */
    ring p = ring_new(2, 64);
    void *m = p.mem;
    uint32_t slot = 9, st = 9, first = 9, cnt = 9;
    int x = 9;
    assert(fl_ring_queue_shared(m, 0, 1, 0, 1) == FL_EINVAL);
    assert(ST(state_of(&p, 0)) == FL_SLOT_FREE);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_queue(m, 0, 1, 0, 1) == FL_OK);
    uint32_t q = state_of(&p, 0);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT); /* a plain task has no rows to take */
    assert(fl_ring_take_rows(m, 0, q, 1, UINT32_MAX, 1, &first, &cnt) == FL_ESTATE);
    assert(cnt == 0 && first == 0);
    assert(fl_ring_rows_done(m, 0, q, 1, 0, 1, &x) == FL_ESTATE && x == 0);
    assert(fl_ring_rows_fail(m, 0, q, 1, 0, 1, &x) == FL_ESTATE && x == 0);
    assert(fl_ring_rows_settle(m, 0, 0, &cnt) == FL_EINVAL);
    assert(fl_ring_fail_shared(m, 0, q, 1) == FL_ESTATE);
    assert(fl_ring_row_state(m, 0, 0, &cnt) == FL_ERANGE);
    assert(fl_ring_rows_of(m, 1, NULL, NULL, 0, &cnt) == FL_OK && cnt == 0);
    assert(fl_ring_reset_rows(m, 1, 1, &cnt) == FL_OK && cnt == 0);
    assert(state_of(&p, 0) == q && share_of(&p, 0) == FL_SHARE_OFF);
    assert(fl_ring_claim(m, 1, 0, &slot, &st) == FL_OK && slot == 0);
    ring_free(&p);
}

static void test_shared_basic_flow(void) {
    ring r = ring_new_rows(4, 16 * 8, 16);
    void *m = r.mem;
    const fl_header *h = H(&r);
    uint32_t slot = 99, st = 0, first = 0;
    /* a plain task (seq 9) and a shared batch of 10 rows (seq 5, lower) */
    assert(fl_ring_queue(m, 0, 9, 0, 3) == FL_OK);
    fl_slot_hdr *s = fl_ring_slot(m, 1);
    s->flags = 5; /* stale worker fields are reset by queue_shared too */
    s->var_bytes = 6;
    assert(fl_ring_queue_shared(m, 1, 5, 2, 10) == FL_OK);
    const uint32_t q = state_of(&r, 1);
    assert(q == FL_MAKE_STATE(1, 0, FL_SLOT_QUEUED));
    assert(share_of(&r, 1) == FL_SHARE_ON && share_of(&r, 0) == FL_SHARE_OFF);
    fl_slot_info info;
    assert(fl_ring_slot_info(m, 1, &info) == FL_OK);
    assert(info.state == q && info.seq == 5 && info.epoch == 2 && info.count == 10);
    assert(info.rows == 10 && info.target == FL_TARGET_ANY && info.progress == 0);
    assert(info.pid == 0 && info.flags == 0 && info.var_bytes == 0);
    assert_rows(&r, 1, 0, 16, FL_ROW_FREE);
    assert(ctr(&h->n_queued) == 2);
    /* a shared batch is never CLAIMED: claim takes the plain task only, despite its seq */
    assert(fl_ring_claim(m, 1, 0, &slot, &st) == FL_OK && slot == 0);
    assert(fl_ring_claim(m, 1, 0, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_claim(m, 2, 5 * MS, &slot, &st) == FL_ETIMEOUT);
    assert(state_of(&r, 1) == q && ctr(&h->n_claimed) == 1);
    /* find_rows finds the shared batch only */
    slot = 99;
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 1 && st == q);
    assert(fl_ring_find_rows(NULL, &slot, &st) == FL_EINVAL);
    assert(fl_ring_find_rows(m, NULL, &st) == FL_EINVAL);
    assert(fl_ring_find_rows(m, &slot, NULL) == FL_EINVAL);

    /* guided pieces: max(1, (count - first FREE row) / divisor) rows from the first FREE one */
    assert(sh_take(&r, 1, q, 1, UINT32_MAX, 4, &first) == 2 && first == 0); /* 10 / 4 */
    assert(sh_take(&r, 1, q, 2, UINT32_MAX, 4, &first) == 2 && first == 2); /* 8 / 4 */
    assert(sh_take(&r, 1, q, 1, UINT32_MAX, 4, &first) == 1 && first == 4); /* 6 / 4 */
    /* an exact row, once */
    assert(sh_take(&r, 1, q, 3, 9, 4, &first) == 1 && first == 9);
    assert(sh_take(&r, 1, q, 2, 9, 4, &first) == 0);
    assert(sh_take(&r, 1, q, 2, 4, 4, &first) == 0);
    uint32_t n = 77;
    first = 77;
    assert(fl_ring_take_rows(m, 1, q, 2, 10, 4, &first, &n) == FL_ERANGE && n == 0 && first == 0);
    assert(fl_ring_take_rows(m, 1, q, 2, 16, 4, &first, &n) == FL_ERANGE && n == 0);
    assert(sh_take(&r, 1, q, 2, UINT32_MAX, 4, &first) == 1 && first == 5); /* 5 / 4 -> 1 */
    /* a piece stops at a row taken already (row 9) */
    assert(sh_take(&r, 1, q, 3, UINT32_MAX, 1, &first) == 3 && first == 6);
    /* nothing left: divisor 0 counts as 1 */
    assert(sh_take(&r, 1, q, 1, UINT32_MAX, 0, &first) == 0);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT);
    const uint32_t words[10] = {2, 2, 3, 3, 2, 3, 4, 4, 4, 4};
    for (uint32_t k = 0; k < 10; k++) assert(row_of(&r, 1, k) == words[k]);
    assert_rows(&r, 1, 10, 16, FL_ROW_FREE);
    /* argument checks of take_rows (nothing taken) */
    assert(fl_ring_take_rows(m, 1, q, FL_MAX_WORKERS, UINT32_MAX, 1, &first, &n) == FL_EINVAL);
    assert(fl_ring_take_rows(m, 1, q, 1, UINT32_MAX, 1, NULL, &n) == FL_EINVAL);
    assert(fl_ring_take_rows(m, 1, q, 1, UINT32_MAX, 1, &first, NULL) == FL_EINVAL);
    assert(fl_ring_take_rows(NULL, 1, q, 1, UINT32_MAX, 1, &first, &n) == FL_EINVAL);
    assert(fl_ring_take_rows(m, 4, q, 1, UINT32_MAX, 1, &first, &n) == FL_ESTATE);
    assert(fl_ring_take_rows(m, 0, state_of(&r, 0), 1, UINT32_MAX, 1, &first, &n) == FL_ESTATE);
    /* the batch is still QUEUED; the parent's wait sees it so */
    uint32_t seen = 0;
    assert(state_of(&r, 1) == q);
    assert(fl_ring_wait(m, 1, 0, &seen) == FL_ETIMEOUT && seen == q);
    /* rows_of: what each worker holds, in (slot, row) order */
    uint32_t ss[8], rr[8], cnt = 0;
    assert(fl_ring_rows_of(m, 1, ss, rr, 8, &cnt) == FL_OK && cnt == 3);
    assert(ss[0] == 1 && rr[0] == 0 && ss[1] == 1 && rr[1] == 1 && ss[2] == 1 && rr[2] == 4);
    assert(fl_ring_rows_of(m, 3, ss, rr, 8, &cnt) == FL_OK && cnt == 4);
    assert(rr[0] == 6 && rr[1] == 7 && rr[2] == 8 && rr[3] == 9);
    assert(rows_held(&r, 2) == 3 && rows_held(&r, 4) == 0);

    /* rows_done: only the taker's rows, in range, with the batch's word */
    int pub = 7;
    assert(fl_ring_rows_done(m, 1, q, 2, 4, 1, &pub) == FL_ESTATE && pub == 0); /* worker 1's */
    assert(row_of(&r, 1, 4) == TAKEN(1));
    assert(fl_ring_rows_done(m, 1, q, 3, 9, 2, &pub) == FL_ERANGE);
    assert(fl_ring_rows_done(m, 1, q, 3, 11, 0, &pub) == FL_ERANGE);
    assert(fl_ring_rows_done(m, 1, FL_MAKE_STATE(2, 0, FL_SLOT_QUEUED), 3, 9, 1, &pub) ==
           FL_ESTATE);
    assert(fl_ring_rows_done(m, 1, q, 3, 9, 1, NULL) == FL_EINVAL);
    assert(fl_ring_rows_done(m, 1, q, FL_MAX_WORKERS, 9, 1, &pub) == FL_EINVAL);
    assert(fl_ring_rows_done(NULL, 1, q, 3, 9, 1, &pub) == FL_EINVAL);
    assert(row_of(&r, 1, 9) == TAKEN(3));
    /* every row DONE but the last: nothing published */
    assert(sh_done(&r, 1, q, 1, 0, 2) == 0);
    assert_rows(&r, 1, 0, 2, FL_ROW_DONE);
    assert(fl_ring_rows_done(m, 1, q, 1, 0, 1, &pub) == FL_ESTATE); /* DONE already */
    assert(sh_done(&r, 1, q, 2, 2, 2) == 0);
    assert(sh_done(&r, 1, q, 1, 4, 1) == 0);
    assert(sh_done(&r, 1, q, 2, 5, 1) == 0);
    assert(sh_done(&r, 1, q, 3, 9, 1) == 0);
    assert(state_of(&r, 1) == q && ctr(&h->n_published) == 0);
    /* the call that makes every row DONE publishes it READY, owned by its worker */
    assert(sh_done(&r, 1, q, 3, 6, 3) == 1);
    assert_rows(&r, 1, 0, 10, FL_ROW_DONE);
    const uint32_t ready = FL_MAKE_STATE(1, 3, FL_SLOT_READY);
    assert(state_of(&r, 1) == ready && ctr(&h->n_published) == 1 && ctr(&h->n_claimed) == 1);
    assert(fl_ring_wait(m, 1, 1000 * MS, &seen) == FL_OK && seen == ready);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_take_rows(m, 1, q, 1, UINT32_MAX, 1, &first, &n) == FL_ESTATE && n == 0);
    assert(fl_ring_take_rows(m, 1, ready, 1, UINT32_MAX, 1, &first, &n) == FL_ESTATE);
    assert(fl_ring_rows_done(m, 1, q, 3, 6, 3, &pub) == FL_ESTATE && pub == 0);
    assert(fl_ring_publish(m, 1, q, 1) == FL_EINVAL); /* not a CLAIMED word */
    assert(rows_held(&r, 3) == 0);
    assert(state_of(&r, 1) == ready);
    /* read and released as any batch; queued again, its rows are FREE and taken from row 0 */
    assert(fl_ring_begin_read(m, 1) == FL_OK);
    assert(fl_ring_release(m, 1) == FL_OK);
    assert(state_of(&r, 1) == FL_MAKE_STATE(1, 0, FL_SLOT_FREE));
    assert(fl_ring_queue_shared(m, 1, 6, 2, 3) == FL_OK);
    const uint32_t q2 = state_of(&r, 1);
    assert(q2 == FL_MAKE_STATE(2, 0, FL_SLOT_QUEUED) && share_of(&r, 1) == FL_SHARE_ON);
    assert_rows(&r, 1, 0, 3, FL_ROW_FREE);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 1 && st == q2);
    assert(sh_take(&r, 1, q2, 5, UINT32_MAX, 4, &first) == 1 && first == 0);
    /* queue_shared's checks */
    assert(fl_ring_queue_shared(m, 1, 7, 0, 3) == FL_ESTATE); /* not FREE */
    assert(state_of(&r, 1) == q2);
    assert(fl_ring_queue_shared(m, 2, 7, 0, 0) == FL_EINVAL);
    assert(fl_ring_queue_shared(m, 2, 7, 0, 17) == FL_EINVAL);
    assert(fl_ring_queue_shared(m, 4, 7, 0, 1) == FL_EINVAL);
    assert(fl_ring_queue_shared(NULL, 2, 7, 0, 1) == FL_EINVAL);
    assert(fl_ring_queue(m, 0, 1, 0, 1) == FL_ESTATE); /* CLAIMED */
    assert(ST(state_of(&r, 2)) == FL_SLOT_FREE && ctr(&h->n_queued) == 3);
    assert(fl_ring_queue_shared(m, 2, 7, 0, 16) == FL_OK); /* max_rows rows */
    assert(sh_take(&r, 2, state_of(&r, 2), 5, 15, 1, &first) == 1 && first == 15);
    /* the lower seq goes first */
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 1);
    assert(fl_ring_queue_shared(m, 3, 1, 0, 2) == FL_OK);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 3);
    ring_free(&r);
}

static void test_shared_fail(void) {
    ring r = ring_new_rows(2, 64, 12);
    void *m = r.mem;
    const uint32_t A = 1, B = 2, C = 3;
    uint32_t first = 0, slot, st;
    int won = 7;
    assert(fl_ring_queue_shared(m, 0, 1, 0, 9) == FL_OK);
    const uint32_t q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, A, UINT32_MAX, 3, &first) == 3 && first == 0); /* 0..2 */
    assert(sh_take(&r, 0, q, B, UINT32_MAX, 3, &first) == 2 && first == 3); /* 3..4 */
    assert(sh_done(&r, 0, q, A, 0, 1) == 0);                                  /* row 0 */
    /* argument checks (nothing changes) */
    assert(fl_ring_rows_fail(m, 0, q, A, 9, 9, &won) == FL_ERANGE && won == 0);
    assert(fl_ring_rows_fail(m, 0, q, A, 1, 1, &won) == FL_ERANGE);
    assert(fl_ring_rows_fail(m, 0, q, A, 1, 10, &won) == FL_ERANGE);
    assert(fl_ring_rows_fail(m, 0, q, A, 3, 4, &won) == FL_ESTATE); /* B's row */
    assert(fl_ring_rows_fail(m, 0, q, A, 0, 1, &won) == FL_ESTATE); /* DONE */
    assert(fl_ring_rows_fail(m, 0, q, A, 5, 6, &won) == FL_ESTATE); /* FREE */
    assert(fl_ring_rows_fail(m, 0, FL_MAKE_STATE(9, 0, FL_SLOT_QUEUED), A, 1, 3, &won) ==
           FL_ESTATE);
    assert(fl_ring_rows_fail(m, 0, q, A, 1, 3, NULL) == FL_EINVAL);
    assert(fl_ring_rows_fail(m, 0, q, FL_MAX_WORKERS, 1, 3, &won) == FL_EINVAL);
    assert(fl_ring_rows_fail(NULL, 0, q, A, 1, 3, &won) == FL_EINVAL);
    assert(row_of(&r, 0, 0) == FL_ROW_DONE);
    assert_rows(&r, 0, 1, 3, TAKEN(A));
    assert_rows(&r, 0, 3, 5, TAKEN(B));
    assert_rows(&r, 0, 5, 9, FL_ROW_FREE);
    assert(share_of(&r, 0) == FL_SHARE_ON);

    /* A's row 1 raises: A fails the batch; its row 2 and every FREE row are closed */
    assert(sh_fail(&r, 0, q, A, 1, 3) == 1);
    assert(share_of(&r, 0) == FL_SHARE_FAILING && state_of(&r, 0) == q);
    assert(row_of(&r, 0, 0) == FL_ROW_DONE);
    assert(row_of(&r, 0, 1) == FL_ROW_ERRORED);
    assert(row_of(&r, 0, 2) == FL_ROW_CLOSED);
    assert_rows(&r, 0, 3, 5, TAKEN(B));
    assert_rows(&r, 0, 5, 9, FL_ROW_CLOSED);
    /* nothing to take any more; the parent cannot cancel it */
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT);
    assert(sh_take(&r, 0, q, C, UINT32_MAX, 1, &first) == 0);
    assert(sh_take(&r, 0, q, C, 6, 1, &first) == 0);
    assert(sh_cancel(&r, 0) == 0);
    assert(share_of(&r, 0) == FL_SHARE_FAILING && state_of(&r, 0) == q);
    /* settling waits for B's two rows */
    int64_t t0 = fl_now_ns();
    assert(settle(&r, 0, 20 * MS, FL_ETIMEOUT) == 2);
    double el = ms_since(t0);
    assert(el >= 15.0 && el < 1000.0);
    assert(settle(&r, 0, 0, FL_ETIMEOUT) == 2);
    /* B's row 3 raises too: B does not fail the batch, it gives the row back (settling closes
     * it) */
    assert(sh_fail(&r, 0, q, B, 3, 4) == 0);
    assert(row_of(&r, 0, 3) == FL_ROW_FREE && row_of(&r, 0, 4) == TAKEN(B));
    assert(share_of(&r, 0) == FL_SHARE_FAILING);
    assert(sh_take(&r, 0, q, C, 3, 1, &first) == 0); /* not to be taken */
    assert(settle(&r, 0, 20 * MS, FL_ETIMEOUT) == 1);
    assert(row_of(&r, 0, 3) == FL_ROW_CLOSED);
    /* only the failer publishes it FAILED */
    assert(fl_ring_fail_shared(m, 0, q, B) == FL_ESTATE);
    assert(fl_ring_fail_shared(m, 0, q, C) == FL_ESTATE);
    assert(state_of(&r, 0) == q);
    assert(sh_done(&r, 0, q, B, 4, 1) == 0); /* B's last row: not published (rows raised) */
    assert(state_of(&r, 0) == q);
    t0 = fl_now_ns();
    assert(settle(&r, 0, 1000 * MS, FL_OK) == 0);
    assert(ms_since(t0) < 500.0);
    assert(fl_ring_fail_shared(m, 0, FL_MAKE_STATE(GEN(q) + 1, 0, FL_SLOT_QUEUED), A) ==
           FL_ESTATE);
    assert(fl_ring_fail_shared(m, 2, q, A) == FL_EINVAL);
    assert(fl_ring_fail_shared(m, 0, q, FL_MAX_WORKERS) == FL_EINVAL);
    assert(ctr(&H(&r)->n_published) == 0);
    assert(fl_ring_fail_shared(m, 0, q, A) == FL_OK);
    const uint32_t failed = FL_MAKE_STATE(GEN(q), A, FL_SLOT_FAILED);
    assert(state_of(&r, 0) == failed && ctr(&H(&r)->n_published) == 1);
    assert(fl_ring_fail_shared(m, 0, q, A) == FL_ESTATE); /* once */
    uint32_t seen = 0;
    assert(fl_ring_wait(m, 0, 1000 * MS, &seen) == FL_OK && seen == failed);
    assert(fl_ring_rows_done(m, 0, q, B, 4, 1, &won) == FL_ESTATE);
    assert(fl_ring_begin_read(m, 0) == FL_ESTATE);
    assert(rows_held(&r, B) == 0);
    uint32_t busy = 5;
    assert(fl_ring_rows_settle(m, 0, 0, NULL) == FL_EINVAL);
    assert(fl_ring_rows_settle(m, 2, 0, &busy) == FL_EINVAL);
    assert(fl_ring_rows_settle(NULL, 0, 0, &busy) == FL_EINVAL);

    /* released and queued again: a new batch, with nobody failing it */
    assert(fl_ring_release(m, 0) == FL_OK);
    assert(fl_ring_queue_shared(m, 0, 2, 0, 4) == FL_OK);
    const uint32_t q2 = state_of(&r, 0);
    assert(share_of(&r, 0) == FL_SHARE_ON);
    assert_rows(&r, 0, 0, 4, FL_ROW_FREE);
    assert(sh_take(&r, 0, q2, B, 2, 1, &first) == 1 && first == 2);
    assert(sh_take(&r, 0, q2, C, 0, 1, &first) == 1);
    assert(sh_fail(&r, 0, q2, B, 2, 3) == 1); /* the first to fail a row of this batch */
    assert(fl_ring_fail_shared(m, 0, q2, A) == FL_ESTATE);
    assert(sh_fail(&r, 0, q2, C, 0, 1) == 0);
    assert(row_of(&r, 0, 0) == FL_ROW_FREE);
    assert(settle(&r, 0, 0, FL_OK) == 0);
    assert(row_of(&r, 0, 0) == FL_ROW_CLOSED && row_of(&r, 0, 1) == FL_ROW_CLOSED);
    assert(row_of(&r, 0, 2) == FL_ROW_ERRORED && row_of(&r, 0, 3) == FL_ROW_CLOSED);
    assert(fl_ring_fail_shared(m, 0, q2, B) == FL_OK);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q2), B, FL_SLOT_FAILED));
    /* once stopped, settle says so */
    assert(fl_ring_release(m, 0) == FL_OK);
    assert(fl_ring_queue_shared(m, 0, 3, 0, 2) == FL_OK);
    const uint32_t q3 = state_of(&r, 0);
    assert(sh_take(&r, 0, q3, A, 0, 1, &first) == 1);
    assert(sh_take(&r, 0, q3, B, 1, 1, &first) == 1);
    assert(sh_fail(&r, 0, q3, A, 0, 1) == 1);
    assert(fl_ring_stop(m) == FL_OK);
    t0 = fl_now_ns();
    assert(fl_ring_rows_settle(m, 0, 1000 * MS, &busy) == FL_ESTOPPED);
    assert(ms_since(t0) < 500.0);
    ring_free(&r);
}

static void test_shared_cancel(void) {
    ring r = ring_new_rows(3, 64, 8);
    void *m = r.mem;
    const fl_header *h = H(&r);
    uint32_t first = 0, slot, st;
    /* (a) nothing taken: cancelled at once */
    assert(fl_ring_queue_shared(m, 0, 1, 0, 5) == FL_OK);
    uint32_t q = state_of(&r, 0);
    assert(sh_cancel(&r, 0) == 1);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q), 0, FL_SLOT_FREE));
    assert(ctr(&h->n_cancelled) == 1);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_take_rows(m, 0, q, 1, UINT32_MAX, 1, &first, &st) == FL_ESTATE);
    assert(sh_cancel(&r, 0) == 0); /* FREE */

    /* (b) a row being loaded: the FREE rows are closed, the slot is freed by a later cancel */
    assert(fl_ring_queue_shared(m, 0, 2, 0, 6) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 1, 2, 1, &first) == 1 && first == 2);
    assert(sh_cancel(&r, 0) == 0);
    assert(state_of(&r, 0) == q && share_of(&r, 0) == FL_SHARE_CANCELLED);
    assert_rows(&r, 0, 0, 2, FL_ROW_CLOSED);
    assert(row_of(&r, 0, 2) == TAKEN(1));
    assert_rows(&r, 0, 3, 6, FL_ROW_CLOSED);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT);
    assert(sh_take(&r, 0, q, 2, UINT32_MAX, 1, &first) == 0);
    assert(sh_take(&r, 0, q, 2, 0, 1, &first) == 0);
    assert(sh_take(&r, 0, q, 1, 5, 1, &first) == 0);
    assert(sh_cancel(&r, 0) == 0); /* still loading */
    assert(state_of(&r, 0) == q && share_of(&r, 0) == FL_SHARE_CANCELLED);
    assert(rows_held(&r, 1) == 1);
    assert(sh_done(&r, 0, q, 1, 2, 1) == 0); /* not published: the other rows are CLOSED */
    assert(state_of(&r, 0) == q && row_of(&r, 0, 2) == FL_ROW_DONE);
    assert(sh_cancel(&r, 0) == 1);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q), 0, FL_SLOT_FREE));
    assert(ctr(&h->n_cancelled) == 2 && ctr(&h->n_published) == 0);

    /* (c) failing: not cancellable, its failer publishes it FAILED */
    assert(fl_ring_queue_shared(m, 0, 3, 0, 4) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 1, 1, 1, &first) == 1);
    assert(sh_fail(&r, 0, q, 1, 1, 2) == 1);
    assert(sh_cancel(&r, 0) == 0);
    assert(share_of(&r, 0) == FL_SHARE_FAILING && state_of(&r, 0) == q);
    assert(sh_cancel(&r, 0) == 0);
    assert(settle(&r, 0, 0, FL_OK) == 0);
    assert(fl_ring_fail_shared(m, 0, q, 1) == FL_OK);
    assert(sh_cancel(&r, 0) == 0);
    assert(ST(state_of(&r, 0)) == FL_SLOT_FAILED);
    assert(fl_ring_release(m, 0) == FL_OK);

    /* (d) cancelled after every row was taken: its last rows_done publishes it READY (a stale
     * result the parent releases, as that of a CLAIMED task it cancelled too late) */
    assert(fl_ring_queue_shared(m, 0, 4, 0, 3) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 1, UINT32_MAX, 1, &first) == 3);
    assert(sh_cancel(&r, 0) == 0);
    assert(share_of(&r, 0) == FL_SHARE_CANCELLED);
    assert_rows(&r, 0, 0, 3, TAKEN(1));
    assert(sh_done(&r, 0, q, 1, 0, 3) == 1);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q), 1, FL_SLOT_READY));
    assert(sh_cancel(&r, 0) == 0);
    assert(fl_ring_release(m, 0) == FL_OK);

    /* (e) a row of a cancelled batch raises: its worker does not fail the batch (the row goes
     * back, for the cancel to close) */
    assert(fl_ring_queue_shared(m, 0, 5, 0, 4) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 2, 0, 1, &first) == 1);
    assert(sh_cancel(&r, 0) == 0);
    assert(sh_fail(&r, 0, q, 2, 0, 1) == 0);
    assert(share_of(&r, 0) == FL_SHARE_CANCELLED && row_of(&r, 0, 0) == FL_ROW_FREE);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_fail_shared(m, 0, q, 2) == FL_ESTATE);
    assert(sh_cancel(&r, 0) == 1);
    assert(ST(state_of(&r, 0)) == FL_SLOT_FREE);

    /* (f) a plain task on a ring with row tables cancels as ever; a shared one next to it too */
    assert(fl_ring_queue(m, 1, 6, 0, 2) == FL_OK);
    assert(fl_ring_queue_shared(m, 2, 7, 0, 2) == FL_OK);
    assert(sh_cancel(&r, 1) == 1 && sh_cancel(&r, 2) == 1);
    assert(ctr(&h->n_cancelled) == 5);
    assert(share_of(&r, 1) == FL_SHARE_OFF && share_of(&r, 2) == FL_SHARE_CANCELLED);
    /* cancelled: a new queue of the slot starts afresh */
    assert(fl_ring_queue_shared(m, 2, 8, 0, 2) == FL_OK);
    assert(share_of(&r, 2) == FL_SHARE_ON);
    assert_rows(&r, 2, 0, 2, FL_ROW_FREE);
    ring_free(&r);
}

static void test_shared_dead_workers(void) {
    ring r = ring_new_rows(3, 64, 16);
    void *m = r.mem;
    const fl_header *h = H(&r);
    uint32_t first = 0, slot = 9, st = 0, n = 0;
    assert(fl_ring_queue_shared(m, 0, 10, 0, 12) == FL_OK);
    assert(fl_ring_queue_shared(m, 1, 11, 1, 4) == FL_OK); /* a later epoch */
    const uint32_t q0 = state_of(&r, 0), q1 = state_of(&r, 1);
    assert(sh_take(&r, 0, q0, 2, 11, 4, &first) == 1 && first == 11);
    assert(sh_take(&r, 0, q0, 2, UINT32_MAX, 4, &first) == 3 && first == 0); /* 12 / 4 */
    assert(sh_take(&r, 0, q0, 5, UINT32_MAX, 1, &first) == 8 && first == 3); /* up to row 11 */
    assert(sh_take(&r, 1, q1, 2, 1, 1, &first) == 1);
    /* rows_of: every (slot, row) worker 2 holds; n counts past cap */
    uint32_t ss[8], rr[8], cnt = 0;
    assert(fl_ring_rows_of(m, 2, ss, rr, 8, &cnt) == FL_OK && cnt == 5);
    const uint32_t want_s[5] = {0, 0, 0, 0, 1}, want_r[5] = {0, 1, 2, 11, 1};
    for (int k = 0; k < 5; k++) assert(ss[k] == want_s[k] && rr[k] == want_r[k]);
    for (int k = 0; k < 8; k++) ss[k] = rr[k] = 777;
    assert(fl_ring_rows_of(m, 2, ss, rr, 2, &cnt) == FL_OK && cnt == 5);
    assert(ss[0] == 0 && rr[0] == 0 && ss[1] == 0 && rr[1] == 1);
    assert(ss[2] == 777 && rr[2] == 777); /* nothing written past cap */
    assert(rows_held(&r, 2) == 5 && rows_held(&r, 5) == 8 && rows_held(&r, 9) == 0);
    assert(fl_ring_rows_of(m, 2, NULL, rr, 1, &cnt) == FL_EINVAL);
    assert(fl_ring_rows_of(m, 2, ss, NULL, 1, &cnt) == FL_EINVAL);
    assert(fl_ring_rows_of(m, 2, ss, rr, 1, NULL) == FL_EINVAL);
    assert(fl_ring_rows_of(m, FL_MAX_WORKERS, ss, rr, 1, &cnt) == FL_EINVAL);
    assert(fl_ring_rows_of(NULL, 2, ss, rr, 1, &cnt) == FL_EINVAL);
    assert(fl_ring_reset_rows(m, 2, 1, NULL) == FL_EINVAL);
    assert(fl_ring_reset_rows(m, FL_MAX_WORKERS, 1, &n) == FL_EINVAL);
    assert(fl_ring_reset_rows(NULL, 2, 1, &n) == FL_EINVAL);

    /* worker 2 dies: its rows are FREE again (others load them), and sleeping workers hear */
    uint32_t qc = fl_atomic_load_acquire_u32(&h->queued_counter);
    assert(fl_ring_reset_rows(m, 2, 1, &n) == FL_OK && n == 5);
    assert(fl_atomic_load_acquire_u32(&h->queued_counter) == qc + 1);
    assert_rows(&r, 0, 0, 3, FL_ROW_FREE);
    assert_rows(&r, 0, 3, 11, TAKEN(5));
    assert(row_of(&r, 0, 11) == FL_ROW_FREE);
    assert(row_of(&r, 1, 1) == FL_ROW_FREE);
    assert(rows_held(&r, 2) == 0 && rows_held(&r, 5) == 8);
    assert(state_of(&r, 0) == q0 && state_of(&r, 1) == q1); /* the batches are unchanged */
    assert(fl_ring_reset_rows(m, 2, 1, &n) == FL_OK && n == 0);
    assert(fl_atomic_load_acquire_u32(&h->queued_counter) == qc + 1);
    /* the oldest batch (lowest seq, oldest epoch) has rows to take again */
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 0 && st == q0);
    /* a piece starts at the first row given back, not past the pieces taken before */
    assert(sh_take(&r, 0, q0, 3, UINT32_MAX, 1, &first) == 3 && first == 0);
    assert(sh_take(&r, 0, q0, 3, UINT32_MAX, 1, &first) == 1 && first == 11);
    assert(sh_done(&r, 0, q0, 5, 3, 8) == 0);
    assert(sh_done(&r, 0, q0, 3, 11, 1) == 0);
    assert(sh_done(&r, 0, q0, 3, 0, 3) == 1);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q0), 3, FL_SLOT_READY));
    assert(fl_ring_release(m, 0) == FL_OK);

    /* not reopened: a dead worker's rows are CLOSED, and the parent cancels the batch */
    assert(sh_take(&r, 1, q1, 6, 1, 1, &first) == 1);
    assert(sh_take(&r, 1, q1, 7, 0, 1, &first) == 1);
    assert(fl_ring_reset_rows(m, 6, 0, &n) == FL_OK && n == 1);
    assert(row_of(&r, 1, 0) == TAKEN(7) && row_of(&r, 1, 1) == FL_ROW_CLOSED);
    assert_rows(&r, 1, 2, 4, FL_ROW_FREE);
    assert(share_of(&r, 1) == FL_SHARE_ON && state_of(&r, 1) == q1);
    assert(sh_cancel(&r, 1) == 0); /* worker 7 is loading row 0 */
    assert_rows(&r, 1, 1, 4, FL_ROW_CLOSED);
    assert(sh_done(&r, 1, q1, 7, 0, 1) == 0);
    assert(sh_cancel(&r, 1) == 1);

    /* worker 3 holds the last row, the others are DONE; it dies: another worker loads it and
     * publishes */
    assert(fl_ring_queue_shared(m, 2, 12, 0, 3) == FL_OK);
    uint32_t q2 = state_of(&r, 2);
    assert(sh_take(&r, 2, q2, 4, UINT32_MAX, 1, &first) == 3);
    assert(sh_done(&r, 2, q2, 4, 0, 2) == 0);
    assert(fl_ring_reset_rows(m, 4, 1, &n) == FL_OK && n == 1);
    assert(row_of(&r, 2, 2) == FL_ROW_FREE && state_of(&r, 2) == q2);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 2 && st == q2);
    assert(sh_take(&r, 2, q2, 8, UINT32_MAX, 2, &first) == 1 && first == 2);
    assert(sh_done(&r, 2, q2, 8, 2, 1) == 1);
    assert(state_of(&r, 2) == FL_MAKE_STATE(GEN(q2), 8, FL_SLOT_READY));
    assert(fl_ring_release(m, 2) == FL_OK);

    /* it died between marking its last rows DONE and publishing (rows_done's CASes done, its
     * publish not): the parent publishes it, owned by the dead worker */
    assert(fl_ring_queue_shared(m, 2, 13, 0, 3) == FL_OK);
    q2 = state_of(&r, 2);
    assert(sh_take(&r, 2, q2, 4, UINT32_MAX, 1, &first) == 3);
    for (uint32_t k = 0; k < 3; k++) fl_atomic_store_release_u32(row_word(&r, 2, k), FL_ROW_DONE);
    uint64_t np = ctr(&h->n_published);
    assert(fl_ring_reset_rows(m, 4, 1, &n) == FL_OK && n == 0);
    assert(state_of(&r, 2) == FL_MAKE_STATE(GEN(q2), 4, FL_SLOT_READY));
    assert(ctr(&h->n_published) == np + 1);
    assert(fl_ring_release(m, 2) == FL_OK);
    assert(ctr(&h->n_claimed) == 0 && ctr(&h->n_reclaimed) == 0);
    ring_free(&r);
}

static void test_shared_dead_failer(void) {
    ring r = ring_new_rows(2, 64, 8);
    void *m = r.mem;
    uint32_t first = 0, slot, st, n = 0;
    /* (a) the failer dies before settling: reopened, the batch is loaded again */
    assert(fl_ring_queue_shared(m, 0, 1, 0, 6) == FL_OK);
    uint32_t q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 1, 0, 1, &first) == 1);
    assert(sh_done(&r, 0, q, 1, 0, 1) == 0);
    assert(sh_take(&r, 0, q, 2, 1, 1, &first) == 1); /* worker 2 still loads row 1 */
    assert(sh_take(&r, 0, q, 3, 2, 1, &first) == 1);
    assert(sh_take(&r, 0, q, 3, 3, 1, &first) == 1);
    assert(sh_fail(&r, 0, q, 3, 2, 4) == 1);
    assert_rows(&r, 0, 3, 6, FL_ROW_CLOSED);
    assert(fl_ring_reset_rows(m, 3, 1, &n) == FL_OK && n == 0);
    assert(share_of(&r, 0) == FL_SHARE_ON && state_of(&r, 0) == q);
    assert(row_of(&r, 0, 0) == FL_ROW_DONE && row_of(&r, 0, 1) == TAKEN(2));
    assert_rows(&r, 0, 2, 6, FL_ROW_FREE); /* its ERRORED and CLOSED rows */
    assert(fl_ring_fail_shared(m, 0, q, 3) == FL_ESTATE);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 0 && st == q);
    assert(sh_take(&r, 0, q, 4, UINT32_MAX, 1, &first) == 4 && first == 2);
    assert(sh_done(&r, 0, q, 2, 1, 1) == 0);
    assert(sh_done(&r, 0, q, 4, 2, 4) == 1);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q), 4, FL_SLOT_READY));
    assert(fl_ring_release(m, 0) == FL_OK);

    /* (b) reopened, a row raises again: that worker is the failer now */
    assert(fl_ring_queue_shared(m, 0, 2, 0, 4) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 1, 0, 1, &first) == 1);
    assert(sh_fail(&r, 0, q, 1, 0, 1) == 1);
    assert(fl_ring_reset_rows(m, 1, 1, &n) == FL_OK && n == 0);
    assert(share_of(&r, 0) == FL_SHARE_ON);
    assert_rows(&r, 0, 0, 4, FL_ROW_FREE);
    assert(sh_take(&r, 0, q, 2, 0, 1, &first) == 1);
    assert(sh_fail(&r, 0, q, 2, 0, 1) == 1);
    assert(fl_ring_fail_shared(m, 0, q, 1) == FL_ESTATE);
    assert(settle(&r, 0, 0, FL_OK) == 0);
    assert(fl_ring_fail_shared(m, 0, q, 2) == FL_OK);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q), 2, FL_SLOT_FAILED));
    assert(fl_ring_release(m, 0) == FL_OK);

    /* (c) not reopened: cancelled, freed by a cancel once nobody loads a row */
    assert(fl_ring_queue_shared(m, 0, 3, 0, 4) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 5, 0, 1, &first) == 1);
    assert(sh_take(&r, 0, q, 6, 1, 1, &first) == 1);
    assert(sh_fail(&r, 0, q, 5, 0, 1) == 1);
    assert(fl_ring_reset_rows(m, 5, 0, &n) == FL_OK && n == 0);
    assert(share_of(&r, 0) == FL_SHARE_CANCELLED && state_of(&r, 0) == q);
    assert(row_of(&r, 0, 0) == FL_ROW_ERRORED && row_of(&r, 0, 1) == TAKEN(6));
    assert_rows(&r, 0, 2, 4, FL_ROW_CLOSED);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_ETIMEOUT);
    assert(fl_ring_fail_shared(m, 0, q, 5) == FL_ESTATE);
    assert(sh_cancel(&r, 0) == 0);
    assert(sh_done(&r, 0, q, 6, 1, 1) == 0);
    assert(sh_cancel(&r, 0) == 1);
    assert(ST(state_of(&r, 0)) == FL_SLOT_FREE);

    /* (d) a dead worker's rows in a batch a live worker fails: CLOSED even when reopening */
    assert(fl_ring_queue_shared(m, 0, 4, 0, 4) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 7, 0, 1, &first) == 1);
    assert(sh_take(&r, 0, q, 8, 1, 1, &first) == 1);
    assert(sh_fail(&r, 0, q, 7, 0, 1) == 1);
    assert(settle(&r, 0, 0, FL_ETIMEOUT) == 1);
    assert(fl_ring_reset_rows(m, 8, 1, &n) == FL_OK && n == 1);
    assert(row_of(&r, 0, 1) == FL_ROW_CLOSED && share_of(&r, 0) == FL_SHARE_FAILING);
    assert(settle(&r, 0, 0, FL_OK) == 0);
    assert(fl_ring_fail_shared(m, 0, q, 7) == FL_OK);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q), 7, FL_SLOT_FAILED));
    ring_free(&r);
}

/* Rows given up front (fl_ring_queue_shared_to: NOTE [first samples]), the preference order of
 * fl_ring_find_rows_for, and fl_ring_reset_slot_rows. */
static void test_shared_given_rows_and_preference(void) {
    ring r = ring_new_rows(4, 16 * 8, 8);
    void *m = r.mem;
    uint32_t slot = 99, st = 0, first = 0, n = 0;
    const uint32_t owners[3] = {2, FL_TARGET_ANY, 0};
    assert(fl_ring_queue_shared_to(m, 0, 10, 0, 4, owners, 3) == FL_OK);
    const uint32_t q0 = state_of(&r, 0);
    assert(row_of(&r, 0, 0) == (FL_ROW_GIVEN | 3) && row_of(&r, 0, 1) == FL_ROW_FREE);
    assert(row_of(&r, 0, 2) == (FL_ROW_GIVEN | 1) && row_of(&r, 0, 3) == FL_ROW_FREE);
    /* bad owners and counts are refused, nothing queued */
    const uint32_t bad[1] = {FL_MAX_WORKERS};
    assert(fl_ring_queue_shared_to(m, 1, 11, 0, 4, bad, 1) == FL_EINVAL);
    assert(fl_ring_queue_shared_to(m, 1, 11, 0, 2, owners, 3) == FL_EINVAL);
    assert(fl_ring_queue_shared_to(m, 1, 11, 0, 2, NULL, 1) == FL_EINVAL);
    assert(FL_STATE_BITS(state_of(&r, 1)) == FL_SLOT_FREE);
    /* a given row is taken by its worker only; a guided piece skips it */
    assert(sh_take(&r, 0, q0, 1, FL_TAKE_GIVEN, 1, &first) == 0);
    assert(sh_take(&r, 0, q0, 1, 0, 1, &first) == 0); /* not even exactly */
    assert(sh_take(&r, 0, q0, 1, FL_TAKE_PIECE, 1, &first) == 1 && first == 1);
    assert(sh_take(&r, 0, q0, 2, FL_TAKE_GIVEN, 1, &first) == 1 && first == 0);
    assert(row_of(&r, 0, 0) == 3); /* now taken (being loaded) by worker 2 */
    assert(sh_take(&r, 0, q0, 2, FL_TAKE_GIVEN, 1, &first) == 0);
    /* a batch nobody has begun is preferred to helping the begun one; a given row beats both */
    assert(fl_ring_queue_shared(m, 1, 11, 0, 4) == FL_OK);
    const uint32_t q1 = state_of(&r, 1);
    assert(fl_ring_find_rows_for(m, 3, &slot, &st) == FL_OK && slot == 1 && st == q1);
    assert(fl_ring_find_rows_for(m, 0, &slot, &st) == FL_OK && slot == 0 && st == q0);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 1);
    /* a later epoch's batch nobody has begun comes after helping */
    assert(fl_ring_queue_shared(m, 2, 12, 1, 4) == FL_OK);
    assert(sh_take(&r, 1, q1, 3, FL_TAKE_PIECE, 1, &first) == 4 && first == 0);
    assert(fl_ring_find_rows_for(m, 3, &slot, &st) == FL_OK && slot == 0); /* row 3 of slot 0 */
    assert(sh_take(&r, 0, q0, 3, FL_TAKE_PIECE, 1, &first) == 1 && first == 3);
    assert(fl_ring_find_rows_for(m, 3, &slot, &st) == FL_OK && slot == 2); /* the next epoch */
    assert(fl_ring_find_rows_for(m, 0, &slot, &st) == FL_OK && slot == 0); /* its given row */
    /* worker 0 dies: reset_slot_rows on another slot leaves its given row alone */
    assert(fl_ring_reset_slot_rows(m, 1, 0, 1, &n) == FL_OK && n == 0);
    assert(row_of(&r, 0, 2) == (FL_ROW_GIVEN | 1));
    assert(fl_ring_reset_slot_rows(m, 0, 0, 1, &n) == FL_OK && n == 1);
    assert(row_of(&r, 0, 2) == FL_ROW_FREE);
    assert(fl_ring_reset_slot_rows(m, 4, 0, 1, &n) == FL_EINVAL);
    /* rows_of lists taken rows, never given ones */
    assert(fl_ring_queue_shared_to(m, 3, 13, 1, 2, owners, 1) == FL_OK);
    uint32_t ss[4], rr[4];
    assert(fl_ring_rows_of(m, 2, ss, rr, 4, &n) == FL_OK && n == 1 && ss[0] == 0 && rr[0] == 0);
    /* the rest loads, and the last rows_done publishes each batch */
    int pub = 0;
    assert(sh_take(&r, 0, q0, 1, FL_TAKE_PIECE, 1, &first) == 1 && first == 2);
    assert(fl_ring_rows_done(m, 0, q0, 1, 1, 2, &pub) == FL_OK && pub == 0);
    assert(fl_ring_rows_done(m, 0, q0, 3, 3, 1, &pub) == FL_OK && pub == 0);
    assert(fl_ring_rows_done(m, 0, q0, 2, 0, 1, &pub) == FL_OK && pub == 1);
    assert(FL_STATE_BITS(state_of(&r, 0)) == FL_SLOT_READY);
    assert(fl_ring_rows_done(m, 1, q1, 3, 0, 4, &pub) == FL_OK && pub == 1);
    ring_free(&r);
}

static void test_shared_stale_view(void) {
    ring r = ring_new_rows(2, 64, 8);
    void *m = r.mem;
    uint32_t slot = 9, old = 0, first = 5, n = 5, st;
    int x = 5;
    /* a worker reads the batch; the parent cancels it and queues another in the slot */
    assert(fl_ring_queue_shared(m, 1, 1, 0, 5) == FL_OK);
    assert(fl_ring_find_rows(m, &slot, &old) == FL_OK && slot == 1);
    assert(sh_cancel(&r, 1) == 1);
    assert(fl_ring_queue_shared(m, 1, 2, 0, 7) == FL_OK);
    const uint32_t nw = state_of(&r, 1);
    assert(GEN(nw) == GEN(old) + 1);
    /* the old word takes nothing of the new batch */
    assert(fl_ring_take_rows(m, 1, old, 1, UINT32_MAX, 1, &first, &n) == FL_ESTATE);
    assert(n == 0 && first == 0);
    assert(fl_ring_take_rows(m, 1, old, 1, 3, 1, &first, &n) == FL_ESTATE && n == 0);
    assert(fl_ring_rows_done(m, 1, old, 1, 0, 1, &x) == FL_ESTATE && x == 0);
    assert(fl_ring_rows_fail(m, 1, old, 1, 0, 1, &x) == FL_ESTATE && x == 0);
    assert(fl_ring_fail_shared(m, 1, old, 1) == FL_ESTATE);
    assert_rows(&r, 1, 0, 7, FL_ROW_FREE);
    assert(state_of(&r, 1) == nw && share_of(&r, 1) == FL_SHARE_ON);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 1 && st == nw);
    /* a word of the slot's generation that is not its state word */
    assert(fl_ring_take_rows(m, 1, FL_MAKE_STATE(GEN(nw), 1, FL_SLOT_QUEUED), 1, UINT32_MAX, 1,
                             &first, &n) == FL_ESTATE);
    assert(fl_ring_take_rows(m, 1, FL_MAKE_STATE(GEN(nw), 0, FL_SLOT_CLAIMED), 1, UINT32_MAX,
                             1, &first, &n) == FL_ESTATE);
    assert_rows(&r, 1, 0, 7, FL_ROW_FREE);
    /* published, released and queued again: the word read before is stale again */
    assert(sh_take(&r, 1, nw, 2, UINT32_MAX, 1, &first) == 7);
    assert(sh_done(&r, 1, nw, 2, 0, 7) == 1);
    assert(fl_ring_release(m, 1) == FL_OK);
    assert(fl_ring_queue_shared(m, 1, 3, 0, 4) == FL_OK);
    const uint32_t n3 = state_of(&r, 1);
    assert(fl_ring_take_rows(m, 1, nw, 2, UINT32_MAX, 1, &first, &n) == FL_ESTATE && n == 0);
    assert(fl_ring_take_rows(m, 1, old, 2, 0, 1, &first, &n) == FL_ESTATE && n == 0);
    assert_rows(&r, 1, 0, 4, FL_ROW_FREE);
    assert(state_of(&r, 1) == n3);
    /* a plain task has no rows to take (and stays claimable) */
    assert(fl_ring_queue(m, 0, 4, 0, 1) == FL_OK);
    const uint32_t p = state_of(&r, 0);
    first = n = 5;
    assert(fl_ring_take_rows(m, 0, p, 2, UINT32_MAX, 1, &first, &n) == FL_OK);
    assert(n == 0 && first == 0 && state_of(&r, 0) == p);
    assert(fl_ring_take_rows(m, 0, p, 2, 0, 1, &first, &n) == FL_OK && n == 0);
    assert(fl_ring_claim(m, 2, 0, &slot, &st) == FL_OK && slot == 0);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* shared batches: sleeping and waking across threads                                         */

typedef struct settler {
    ring *r;
    uint32_t slot;
    int64_t timeout_ns;
    int rc;
    uint32_t busy;
    int64_t t_return;
    fl_atomic_u32 done;
} settler;

static void *settler_main(void *arg) {
    settler *x = arg;
    x->rc = fl_ring_rows_settle(x->r->mem, x->slot, x->timeout_ns, &x->busy);
    x->t_return = fl_now_ns();
    fl_atomic_store_release_u32(&x->done, 1);
    return NULL;
}

/* The failer asleep in rows_settle wakes when the last row being loaded is done, or failed, or
 * when the ring is stopped (fl_ring_stop: "wake every sleeping worker"). */
static void test_shared_settle_wakes(void) {
    ring r = ring_new_rows(2, 64, 8);
    void *m = r.mem;
    uint32_t first;
    for (int how = 0; how < 3; how++) { /* rows_done, rows_fail, stop */
        assert(fl_ring_queue_shared(m, 0, (uint64_t)how, 0, 4) == FL_OK);
        const uint32_t q = state_of(&r, 0);
        assert(sh_take(&r, 0, q, 1, 0, 1, &first) == 1);
        assert(sh_take(&r, 0, q, 2, 1, 1, &first) == 1);
        assert(sh_fail(&r, 0, q, 1, 0, 1) == 1);
        settler x = {.r = &r, .slot = 0, .timeout_ns = 10000 * MS, .busy = 99};
        pthread_t th;
        uint64_t waits = ctr(&H(&r)->n_futex_waits);
        assert(pthread_create(&th, NULL, settler_main, &x) == 0);
        assert(await_u32_ge(&H(&r)->row_waiters, 1, 5000));
        assert(await_u64_ge(&H(&r)->n_futex_waits, waits + 1, 5000)); /* (about to be) asleep */
        sleep_ms(20);
        assert(fl_atomic_load_acquire_u32(&x.done) == 0);
        int64_t t0 = fl_now_ns();
        if (how == 0)
            assert(sh_done(&r, 0, q, 2, 1, 1) == 0);
        else if (how == 1)
            assert(sh_fail(&r, 0, q, 2, 1, 2) == 0);
        else
            assert(fl_ring_stop(m) == FL_OK);
        assert(pthread_join(th, NULL) == 0);
        double lat = (double)(x.t_return - t0) / 1e6;
        printf("  sleeping settle returned %.2f ms after %s\n", lat,
               how == 0 ? "rows_done" : how == 1 ? "rows_fail" : "stop");
        assert(lat < 1000.0);
        assert(fl_atomic_load_acquire_u32(&H(&r)->row_waiters) == 0);
        if (how == 2) {
            assert(x.rc == FL_ESTOPPED);
            break;
        }
        assert(x.rc == FL_OK && x.busy == 0);
        assert(fl_ring_fail_shared(m, 0, q, 1) == FL_OK);
        assert(fl_ring_release(m, 0) == FL_OK);
    }
    ring_free(&r);
}

/* The parent asleep in fl_ring_wait on a shared batch wakes when it is published. */
static void test_shared_publish_wakes_wait(void) {
    ring r = ring_new_rows(2, 64, 8);
    void *m = r.mem;
    for (int ok = 0; ok <= 1; ok++) {
        assert(fl_ring_queue_shared(m, 1, 5, 0, 3) == FL_OK);
        const uint32_t q = state_of(&r, 1);
        uint32_t first;
        assert(sh_take(&r, 1, q, 2, UINT32_MAX, 1, &first) == 3);
        waiter w = {.r = &r, .slot = 1};
        pthread_t th;
        assert(pthread_create(&th, NULL, waiter_main, &w) == 0);
        assert(await_u32_ge(&H(&r)->ready_waiters, 1, 5000));
        sleep_ms(20);
        *(volatile unsigned char *)slot_data(&r, 1) = (unsigned char)(ok + 1); /* the payload */
        int64_t t_p = fl_now_ns();
        if (ok) {
            assert(sh_done(&r, 1, q, 2, 0, 3) == 1);
        } else {
            assert(sh_fail(&r, 1, q, 2, 0, 3) == 1);
            assert(settle(&r, 1, 0, FL_OK) == 0);
            assert(fl_ring_fail_shared(m, 1, q, 2) == FL_OK);
        }
        assert(pthread_join(th, NULL) == 0);
        double lat = (double)(w.t_return - t_p) / 1e6;
        printf("  sleeping wait saw the shared %s publish %.2f ms later\n", ok ? "READY" : "FAILED",
               lat);
        assert(w.rc == FL_OK);
        assert(w.state == FL_MAKE_STATE(GEN(q), 2, ok ? FL_SLOT_READY : FL_SLOT_FAILED));
        assert(lat < 1000.0);
        assert(*slot_data(&r, 1) == ok + 1);
        assert(fl_ring_release(m, 1) == FL_OK);
    }
    assert(fl_atomic_load_acquire_u32(&H(&r)->ready_waiters) == 0);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* shared batches under stress: 1 parent thread queues shared batches (and some plain tasks)  */
/* into the slots, fails and cancels; NW worker threads take their rows                       */

#define SH_ROWS 48 /* rows of a shared batch; its payload is one word per row */

static uint32_t sh_count_of(uint64_t seq) { return 1 + (uint32_t)(mix64(seq ^ 0xABCDu) % SH_ROWS); }
static uint64_t sh_word(uint64_t seq, uint32_t row) { return seq * 1000 + row; }
static int sh_is_plain(uint64_t seq) { return mix64(seq + 77) % 8 == 0; } /* 1 in 8: a plain task */

typedef struct sh_stress sh_stress;

typedef struct sh_worker {
    sh_stress *S;
    pthread_t th;
    uint32_t id;
    uint64_t rng;
    uint64_t pieces, rows, claims, stale, wins, losses, settle_timeouts, slow_settles;
} sh_worker;

struct sh_stress {
    ring r;
    uint64_t nbatches;
    uint32_t nworkers, divisor;
    uint32_t fail_ppm;  /* per piece taken: one of its rows raises */
    uint32_t exact_ppm; /* per take: an exact row (as a worker's kept rows: NOTE [first samples]) */
    int64_t settle_ns;
    fl_atomic_u32 *published; /* per seq: publishes READY (rows_done, or a plain publish) */
    fl_atomic_u32 *wins;      /* per seq: rows_fail calls that won (each publishes FAILED) */
    fl_atomic_u32 *winner;    /* per slot: worker + 1 that failed the batch in it */
    sh_worker *w;
};

/* Loading a row takes a while (0 to ~2 us here), so that the parent's cancels and the other
 * workers' takes and failures land while rows are being loaded. */
static void sh_load_work(sh_worker *me) {
    uint64_t x = rng_next(&me->rng), k = x % 64;
    for (uint64_t i = 0; i < k; i++) x = mix64(x);
    if (x == 42) me->rows++; /* keep the loop */
}

/* A worker's loop, as fastload/_worker.py's fill_rows: read the batch, then take pieces of it
 * until none is left, loading each (the pattern seq * 1000 + row) before marking it done. */
static void sh_fill(sh_worker *me, uint32_t slot, uint32_t st) {
    sh_stress *S = me->S;
    void *m = S->r.mem;
    /* read before taking, as the Python worker does: by now it may describe another batch, and
     * then no take below succeeds */
    fl_slot_info info;
    assert(fl_ring_slot_info(m, slot, &info) == FL_OK);
    const uint64_t seq = info.seq;
    const uint32_t count = info.count;
    uint64_t *data = (uint64_t *)slot_data(&S->r, slot);
    for (;;) {
        uint32_t row = UINT32_MAX, first = 0, n = 0;
        if (count >= 1 && count <= SH_ROWS && rng_next(&me->rng) % 1000000u < S->exact_ppm)
            row = (uint32_t)(rng_next(&me->rng) % count);
        int rc = fl_ring_take_rows(m, slot, st, me->id, row, S->divisor, &first, &n);
        if (rc == FL_ESTATE) { /* not the batch read */
            me->stale++;
            return;
        }
        assert(rc == FL_OK);
        if (n == 0) {
            if (row != UINT32_MAX) continue;
            return;
        }
        /* the rows are ours, so the batch is the one read */
        me->pieces++;
        me->rows += n;
        assert(seq < S->nbatches && !sh_is_plain(seq));
        assert(count == sh_count_of(seq) && info.epoch == epoch_of(seq) && first + n <= count);
        assert(fl_atomic_load_relaxed_u64(&fl_ring_slot(m, slot)->seq) == seq);
        assert(row == UINT32_MAX || (first == row && n == 1));
        uint32_t bad = n; /* the first row that raises: none */
        if (S->fail_ppm && rng_next(&me->rng) % 1000000u < S->fail_ppm)
            bad = (uint32_t)(rng_next(&me->rng) % n);
        for (uint32_t k = 0; k < bad; k++) {
            assert(fl_atomic_load_relaxed_u32(row_word(&S->r, slot, first + k)) == me->id + 1);
            sh_load_work(me);
            data[first + k] = sh_word(seq, first + k);
        }
        int pub = 0, won = 0;
        if (bad == n) {
            assert(fl_ring_rows_done(m, slot, st, me->id, first, n, &pub) == FL_OK);
            if (pub) {
                fl_atomic_fetch_add_acq_rel_u32(&S->published[seq], 1);
                return;
            }
            continue;
        }
        if (bad > 0) {
            assert(fl_ring_rows_done(m, slot, st, me->id, first, bad, &pub) == FL_OK);
            assert(pub == 0); /* row first + bad is still ours */
        }
        data[first + bad] = ~sh_word(seq, first + bad); /* half-loaded */
        assert(fl_ring_rows_fail(m, slot, st, me->id, first + bad, first + n, &won) == FL_OK);
        if (!won) {
            me->losses++;
            return;
        }
        me->wins++;
        fl_atomic_store_relaxed_u32(&S->winner[slot], me->id + 1); /* published by fail_shared */
        for (;;) {
            uint32_t busy = 99;
            int64_t t0 = fl_now_ns();
            rc = fl_ring_rows_settle(m, slot, S->settle_ns, &busy);
            /* rows take microseconds to load here: a settle that sleeps most of its timeout
             * missed the wake-up of the last row given back */
            if (fl_now_ns() - t0 > S->settle_ns / 2) me->slow_settles++;
            if (rc == FL_OK) {
                assert(busy == 0);
                break;
            }
            assert(rc == FL_ETIMEOUT && busy > 0 && busy <= count);
            me->settle_timeouts++;
        }
        /* settled: nothing is being loaded, nothing is left to take */
        for (uint32_t k = 0; k < count; k++) {
            uint32_t v = fl_atomic_load_acquire_u32(row_word(&S->r, slot, k));
            assert(v == FL_ROW_DONE || v == FL_ROW_ERRORED || v == FL_ROW_CLOSED);
        }
        fl_atomic_fetch_add_acq_rel_u32(&S->wins[seq], 1);
        assert(fl_ring_fail_shared(m, slot, st, me->id) == FL_OK);
        return;
    }
}

static void *sh_worker_main(void *arg) {
    sh_worker *me = arg;
    sh_stress *S = me->S;
    void *m = S->r.mem;
    assert(fl_ring_attach(m, S->r.total) == FL_OK);
    uint32_t idle = 0;
    while (!fl_ring_stopped(m)) {
        uint32_t slot = UINT32_MAX, st = 0;
        if (fl_ring_find_rows(m, &slot, &st) == FL_OK) {
            assert(slot < S->r.nslots && ST(st) == FL_SLOT_QUEUED);
            sh_fill(me, slot, st);
            idle = 0;
            continue;
        }
        if (fl_ring_claim(m, me->id, 0, &slot, &st) == FL_OK) { /* a plain task */
            fl_slot_hdr *s = fl_ring_slot(m, slot);
            uint64_t seq = fl_atomic_load_relaxed_u64(&s->seq);
            assert(seq < S->nbatches && sh_is_plain(seq) && s->count == sh_count_of(seq));
            assert(share_of(&S->r, slot) == FL_SHARE_OFF);
            uint64_t *data = (uint64_t *)slot_data(&S->r, slot);
            for (uint32_t k = 0; k < s->count; k++) data[k] = sh_word(seq, k);
            assert(fl_ring_publish(m, slot, st, 1) == FL_OK);
            fl_atomic_fetch_add_acq_rel_u32(&S->published[seq], 1);
            me->claims++;
            idle = 0;
            continue;
        }
        if (++idle < 50) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000}; /* 50 us */
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

typedef struct sh_result {
    uint64_t ready, failed, cancelled, recancels, dropped_ready, dropped_failed, wait_timeouts;
    uint64_t slow_settles;
} sh_result;

/* Poison a slot's payload the parent owns again: the next batch in it must load every row. */
static void sh_poison(sh_stress *S, uint32_t slot) {
    uint64_t *data = (uint64_t *)slot_data(&S->r, slot);
    for (uint32_t k = 0; k < SH_ROWS; k++) data[k] = ~(uint64_t)0;
}

/* The parent's checks of a batch a worker published (late: after the parent cancelled it). */
static void sh_check(sh_stress *S, uint32_t slot, uint64_t seq, uint32_t w, int late) {
    fl_slot_info info;
    assert(fl_ring_slot_info(S->r.mem, slot, &info) == FL_OK);
    const uint32_t count = sh_count_of(seq);
    assert(info.state == w && info.seq == seq && info.count == count && info.rows == count);
    assert(info.epoch == epoch_of(seq));
    assert(OWNER(w) >= 1 && OWNER(w) <= S->nworkers);
    const uint64_t *data = (const uint64_t *)slot_data(&S->r, slot);
    const int plain = sh_is_plain(seq);
    const uint32_t sh = share_of(&S->r, slot);
    if (plain)
        assert(sh == FL_SHARE_OFF);
    else if (ST(w) == FL_SLOT_FAILED)
        assert(sh == FL_SHARE_FAILING);
    else
        assert(sh == FL_SHARE_ON || (late && sh == FL_SHARE_CANCELLED));
    if (ST(w) == FL_SLOT_READY) {
        for (uint32_t k = 0; k < count; k++) {
            if (!plain) assert(row_of(&S->r, slot, k) == FL_ROW_DONE);
            if (data[k] != sh_word(seq, k)) {
                fprintf(stderr, "shared stress: seq %llu slot %u row %u holds %llu\n",
                        (unsigned long long)seq, slot, k, (unsigned long long)data[k]);
                abort();
            }
        }
        return;
    }
    assert(ST(w) == FL_SLOT_FAILED && !plain);
    assert(fl_atomic_load_relaxed_u32(&S->winner[slot]) == OWNER(w) + 1);
    fl_atomic_store_relaxed_u32(&S->winner[slot], 0);
    uint32_t errored = 0;
    for (uint32_t k = 0; k < count; k++) {
        uint32_t v = row_of(&S->r, slot, k);
        if (v == FL_ROW_DONE) {
            assert(data[k] == sh_word(seq, k)); /* a row done is loaded, even in a failed batch */
        } else if (v == FL_ROW_ERRORED) {
            errored++;
        } else {
            assert(v == FL_ROW_CLOSED);
        }
    }
    assert(errored >= 1);
}

static void sh_queue(sh_stress *S, uint32_t slot, uint64_t seq) {
    if (sh_is_plain(seq))
        assert(fl_ring_queue(S->r.mem, slot, seq, epoch_of(seq), sh_count_of(seq)) == FL_OK);
    else
        assert(fl_ring_queue_shared(S->r.mem, slot, seq, epoch_of(seq), sh_count_of(seq)) == FL_OK);
}

static sh_result run_shared_stress(uint64_t nbatches, uint32_t nworkers, uint32_t nslots,
                                   uint32_t fail_ppm, uint32_t cancel_ppm, uint64_t seed) {
    sh_stress S;
    memset(&S, 0, sizeof S);
    S.r = ring_new_rows(nslots, SH_ROWS * 8, SH_ROWS);
    S.nbatches = nbatches;
    S.nworkers = nworkers;
    S.divisor = 2 * nworkers; /* as fastload/_worker.py */
    S.fail_ppm = fail_ppm;
    S.exact_ppm = 100000;
    S.settle_ns = 2000 * MS; /* a lost wake-up shows as a settle timeout */
    S.published = calloc(nbatches, sizeof(fl_atomic_u32));
    S.wins = calloc(nbatches, sizeof(fl_atomic_u32));
    S.winner = calloc(nslots, sizeof(fl_atomic_u32));
    S.w = calloc(nworkers, sizeof(sh_worker));
    uint32_t *dropped_ready = calloc(nbatches, sizeof(uint32_t));
    uint32_t *failed = calloc(nbatches, sizeof(uint32_t));
    uint32_t *slot_of = calloc(nslots, sizeof(uint32_t));
    uint32_t *freel = calloc(nslots, sizeof(uint32_t));
    assert(S.published && S.wins && S.winner && S.w && dropped_ready && failed && slot_of && freel);
    for (uint32_t k = 0; k < nworkers; k++) {
        S.w[k] = (sh_worker){.S = &S, .id = k + 1, .rng = mix64(seed * 31 + k) | 1};
        assert(pthread_create(&S.w[k].th, NULL, sh_worker_main, &S.w[k]) == 0);
    }
    void *m = S.r.mem;
    uint64_t rng = seed | 1;
    uint32_t nfree = nslots;
    for (uint32_t i = 0; i < nslots; i++) freel[i] = i;
    uint64_t next_q = 0, next_c = 0;
    sh_result res;
    memset(&res, 0, sizeof res);
    while (next_c < nbatches) {
        while (next_q < nbatches && next_q - next_c < nslots && nfree > 0) {
            uint32_t j = (uint32_t)(rng_next(&rng) % nfree);
            uint32_t slot = freel[j];
            freel[j] = freel[--nfree];
            sh_queue(&S, slot, next_q);
            slot_of[next_q % nslots] = slot;
            next_q++;
        }
        /* now and then the parent abandons a batch in flight while workers may be loading it
         * (as _slots.py drop): freed by a cancel once none is, or published meanwhile (a stale
         * result, released); then it queues the batch again in that slot */
        if (cancel_ppm && next_q > next_c && rng_next(&rng) % 1000000u < cancel_ppm) {
            uint64_t seq = next_c + rng_next(&rng) % (next_q - next_c);
            uint32_t slot = slot_of[seq % nslots];
            int64_t t0 = fl_now_ns();
            for (uint32_t tries = 0;; tries++) {
                int c = sh_cancel(&S.r, slot);
                uint32_t w = state_of(&S.r, slot);
                if (c) { /* nobody loads a row of it: the parent owns the slot again */
                    assert(ST(w) == FL_SLOT_FREE);
                    sh_poison(&S, slot);
                    res.cancelled++;
                    res.recancels += tries;
                    break;
                }
                if (ST(w) == FL_SLOT_READY || ST(w) == FL_SLOT_FAILED) {
                    sh_check(&S, slot, seq, w, 1); /* a stale result */
                    if (ST(w) == FL_SLOT_READY) {
                        dropped_ready[seq]++;
                        res.dropped_ready++;
                    } else {
                        failed[seq]++;
                        res.dropped_failed++;
                    }
                    sh_poison(&S, slot);
                    assert(fl_ring_release(m, slot) == FL_OK);
                    break;
                }
                assert(ST(w) == FL_SLOT_QUEUED || ST(w) == FL_SLOT_CLAIMED);
                if (ST(w) == FL_SLOT_QUEUED && !sh_is_plain(seq)) {
                    uint32_t sh = share_of(&S.r, slot);
                    assert(sh == FL_SHARE_CANCELLED || sh == FL_SHARE_FAILING);
                }
                if (fl_now_ns() - t0 > 60000 * MS) {
                    fprintf(stderr, "shared stress: slot %u (seq %llu) not cancelled in 60 s, "
                            "state %#x share %u\n", slot, (unsigned long long)seq, w,
                            share_of(&S.r, slot));
                    abort();
                }
                sched_yield();
            }
            sh_queue(&S, slot, seq);
            continue;
        }
        uint32_t slot = slot_of[next_c % nslots], w = 0;
        int64_t t0 = fl_now_ns();
        for (;;) {
            int rc = fl_ring_wait(m, slot, 50 * MS, &w);
            if (rc == FL_OK) break;
            assert(rc == FL_ETIMEOUT);
            res.wait_timeouts++;
            if (fl_now_ns() - t0 > 60000 * MS) {
                fprintf(stderr, "shared stress: no progress for 60 s at seq %llu (slot %u, "
                        "state %#x, share %u)\n", (unsigned long long)next_c, slot, w,
                        share_of(&S.r, slot));
                abort();
            }
        }
        sh_check(&S, slot, next_c, w, 0);
        if (ST(w) == FL_SLOT_FAILED) { /* retried in the same slot */
            failed[next_c]++;
            res.failed++;
            sh_poison(&S, slot);
            assert(fl_ring_release(m, slot) == FL_OK);
            sh_queue(&S, slot, next_c);
            continue;
        }
        assert(fl_ring_begin_read(m, slot) == FL_OK);
        sh_poison(&S, slot);
        assert(fl_ring_release(m, slot) == FL_OK);
        res.ready++;
        freel[nfree++] = slot;
        next_c++;
    }
    assert(fl_ring_stop(m) == FL_OK);
    sh_worker tot;
    memset(&tot, 0, sizeof tot);
    for (uint32_t k = 0; k < nworkers; k++) {
        assert(pthread_join(S.w[k].th, NULL) == 0);
        tot.pieces += S.w[k].pieces;
        tot.rows += S.w[k].rows;
        tot.claims += S.w[k].claims;
        tot.stale += S.w[k].stale;
        tot.wins += S.w[k].wins;
        tot.losses += S.w[k].losses;
        tot.settle_timeouts += S.w[k].settle_timeouts;
        tot.slow_settles += S.w[k].slow_settles;
        assert(rows_held(&S.r, S.w[k].id) == 0);
    }
    /* every batch published READY once, plus the stale READY results dropped; every failure
     * won published FAILED once */
    for (uint64_t q = 0; q < nbatches; q++) {
        assert(S.published[q] == 1 + dropped_ready[q]);
        assert(S.wins[q] == failed[q]);
        if (sh_is_plain(q)) assert(failed[q] == 0);
    }
    const fl_header *h = H(&S.r);
    for (uint32_t i = 0; i < nslots; i++) assert(ST(state_of(&S.r, i)) == FL_SLOT_FREE);
    uint64_t published = res.ready + res.failed + res.dropped_ready + res.dropped_failed;
    assert(h->n_published == published && h->n_released == published);
    assert(h->n_cancelled == res.cancelled && h->n_reclaimed == 0);
    assert(h->n_queued == nbatches + res.failed + res.cancelled + res.dropped_ready +
                              res.dropped_failed);
    assert(h->n_claimed == tot.claims);
    assert(tot.wins == res.failed + res.dropped_failed);
    assert(fl_atomic_load_acquire_u32(&h->row_waiters) == 0);
    assert(fl_atomic_load_acquire_u32(&h->ready_waiters) == 0);
    assert(fl_atomic_load_acquire_u32(&h->task_waiters) == 0);
    printf("  %llu batches, %u workers, %u slots: %llu pieces (%llu rows), %llu plain claims, "
           "%llu stale reads, %llu failed (%llu lost races to fail), %llu cancelled (%llu "
           "re-cancels), %llu dropped late (%llu ready, %llu failed), %llu settle timeouts "
           "(%llu slow settles), %llu parent wait timeouts\n",
           (unsigned long long)nbatches, nworkers, nslots, (unsigned long long)tot.pieces,
           (unsigned long long)tot.rows, (unsigned long long)tot.claims,
           (unsigned long long)tot.stale, (unsigned long long)res.failed,
           (unsigned long long)tot.losses, (unsigned long long)res.cancelled,
           (unsigned long long)res.recancels,
           (unsigned long long)(res.dropped_ready + res.dropped_failed),
           (unsigned long long)res.dropped_ready, (unsigned long long)res.dropped_failed,
           (unsigned long long)tot.settle_timeouts, (unsigned long long)tot.slow_settles,
           (unsigned long long)res.wait_timeouts);
    res.slow_settles = tot.slow_settles;
    free(S.published);
    free(S.wins);
    free(S.winner);
    free(S.w);
    free(dropped_ready);
    free(failed);
    free(slot_of);
    free(freel);
    ring_free(&S.r);
    return res;
}

static void test_stress_shared(void) {
    uint64_t n = stress_tasks() / 25;
    if (n < 1000) n = 1000;
    /* per piece taken: 1% raise; the parent abandons a batch in flight at 5% of its turns */
    sh_result res = run_shared_stress(n, 4, 6, 10000, 50000, stress_seed() + 2);
    assert(res.failed + res.dropped_failed > 0);
    assert(res.cancelled > 0);
    assert(res.slow_settles == 0); /* no lost wake-up of a settling failer */
}

/* ---------------------------------------------------------------------------------------- */
/* regressions of shared batches: bugs these tests found, fixed in the core                  */

/* fl_ring_take_rows gave rows back (the batch failing or cancelled under it) without ringing
 * the row bell: a failer that had counted them as being loaded slept in fl_ring_rows_settle until
 * its timeout, though nobody loaded anything. Here worker 2 takes a long piece (2047 rows, one
 * CAS each); once it is half-way (row 1000 is its), worker 1 fails the batch: the piece stops at
 * the first row worker 1 closed, worker 2 gives its rows back, and the settle, which saw them
 * being loaded, must be woken at once. */
typedef struct gb_taker {
    ring *r;
    uint32_t rounds;
    int cpu; /* pinned there if >= 0 (then it spins instead of yielding) */
    fl_atomic_u32 go, done_round, last_n;
} gb_taker;

static void *gb_taker_main(void *arg) {
    gb_taker *t = arg;
    pin_self(t->cpu);
    for (uint32_t round = 1; round <= t->rounds; round++) {
        while (fl_atomic_load_acquire_u32(&t->go) < round)
            if (t->cpu < 0) sched_yield();
        uint32_t st = state_of(t->r, 0), first = 0, n = 0;
        assert(fl_ring_take_rows(t->r->mem, 0, st, 2, UINT32_MAX, 1, &first, &n) == FL_OK);
        if (n > 0) assert(sh_done(t->r, 0, st, 2, first, n) == 0); /* kept: loaded */
        fl_atomic_store_relaxed_u32(&t->last_n, n);
        fl_atomic_store_release_u32(&t->done_round, round);
    }
    return NULL;
}

static void test_regression_giveback_wakes_settle(void) {
    const uint32_t N = 2048, MID = 1000;
    ring r = ring_new_rows(1, 64, N);
    /* the two must run side by side: on one CPU the piece is taken in one time slice */
    cpu_set_t saved;
    assert(sched_getaffinity(0, sizeof saved, &saved) == 0);
    int cpu0 = nth_allowed_cpu(0), cpu1 = nth_allowed_cpu(1);
    if (cpu1 < 0) cpu0 = -1;
    pin_self(cpu0);
    gb_taker t = {.r = &r, .rounds = 200, .cpu = cpu1};
    pthread_t th;
    assert(pthread_create(&th, NULL, gb_taker_main, &t) == 0);
    uint64_t slow = 0, given_back = 0;
    double worst = 0;
    const fl_atomic_u32 *mid = row_word(&r, 0, MID);
    for (uint32_t round = 1; round <= t.rounds; round++) {
        assert(fl_ring_queue_shared(r.mem, 0, round, 0, N) == FL_OK);
        const uint32_t q = state_of(&r, 0);
        uint32_t first;
        assert(sh_take(&r, 0, q, 1, 0, 1, &first) == 1);
        fl_atomic_store_release_u32(&t.go, round);
        /* wait until worker 2 is half-way through its piece (or done with it) */
        for (uint32_t spins = 0; fl_atomic_load_acquire_u32(mid) != TAKEN(2) &&
                                 fl_atomic_load_acquire_u32(&t.done_round) < round;
             spins++)
            if (cpu1 < 0 && spins > 1000) sched_yield();
        int halfway = fl_atomic_load_acquire_u32(&t.done_round) < round;
        assert(sh_fail(&r, 0, q, 1, 0, 1) == 1);
        int64_t t0 = fl_now_ns();
        uint32_t busy = 99;
        int rc = fl_ring_rows_settle(r.mem, 0, 200 * MS, &busy);
        double ms = ms_since(t0);
        if (ms > worst) worst = ms;
        if (ms > 100.0) slow++;
        while (fl_atomic_load_acquire_u32(&t.done_round) < round) sched_yield();
        if (halfway && fl_atomic_load_relaxed_u32(&t.last_n) == 0) given_back++;
        if (rc != FL_OK) assert(rc == FL_ETIMEOUT && busy > 0);
        assert(settle(&r, 0, 1000 * MS, FL_OK) == 0);
        assert(fl_ring_fail_shared(r.mem, 0, q, 1) == FL_OK);
        assert(fl_ring_release(r.mem, 0) == FL_OK);
    }
    assert(pthread_join(th, NULL) == 0);
    (void)pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    printf("  %u rounds: the half-taken piece was given back in %llu; slowest settle %.2f ms, "
           "%llu slept past 100 ms\n", t.rounds, (unsigned long long)given_back, worst,
           (unsigned long long)slow);
    if (cpu1 >= 0) assert(given_back > t.rounds / 2); /* the race this is about did run */
    assert(slow == 0);
    ring_free(&r);
}

/* A worker killed inside fl_ring_rows_fail, at each point between its steps: the parent's
 * fl_ring_reset_rows leaves a batch that can still end (READY, FAILED, or cancelled). Before the
 * fix, a death after the failing row went ERRORED but before share went FAILING left that row to
 * nobody (the batch QUEUED for ever with nothing to take), and one after share went FAILING but
 * before FL_META_FAILER was written left a failing batch with no failer (not cancellable: the
 * slot lost). The deaths are simulated by writing what those steps leave behind. */
static fl_atomic_u32 *failer_word(const ring *r, uint32_t slot) {
    return row_word(r, slot, 0) - FL_CACHELINE / 4 + 1; /* FL_META_FAILER in the meta line */
}

static void test_regression_death_inside_rows_fail(void) {
    ring r = ring_new_rows(2, 64, 8);
    void *m = r.mem;
    uint32_t first = 0, n = 0, slot, st;
    /* the steps, as the real call takes them: rows after `row` back FREE, FAILER claimed, share
     * ON -> FAILING, the FREE rows closed, `row` ERRORED */
    assert(fl_ring_queue_shared(m, 0, 1, 0, 4) == FL_OK);
    uint32_t q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 3, UINT32_MAX, 2, &first) == 2 && first == 0);
    assert(sh_fail(&r, 0, q, 3, 0, 2) == 1);
    assert(fl_atomic_load_acquire_u32(failer_word(&r, 0)) == TAKEN(3));
    assert(row_of(&r, 0, 0) == FL_ROW_ERRORED);
    assert_rows(&r, 0, 1, 4, FL_ROW_CLOSED);
    assert(settle(&r, 0, 0, FL_OK) == 0);
    assert(fl_ring_fail_shared(m, 0, q, 3) == FL_OK);
    assert(fl_ring_release(m, 0) == FL_OK);

    /* (a) killed after claiming FAILER, before share: the claim is dropped, its row reloaded, and
     * the next row to raise fails the batch */
    assert(fl_ring_queue_shared(m, 0, 2, 0, 4) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 3, 1, 1, &first) == 1);
    fl_atomic_store_release_u32(failer_word(&r, 0), TAKEN(3));
    assert(sh_take(&r, 0, q, 5, 2, 1, &first) == 1);
    assert(sh_fail(&r, 0, q, 5, 2, 3) == 0); /* worker 3 "is failing it" */
    assert(row_of(&r, 0, 2) == FL_ROW_FREE && share_of(&r, 0) == FL_SHARE_ON);
    assert(fl_ring_reset_rows(m, 3, 1, &n) == FL_OK && n == 1);
    assert(fl_atomic_load_acquire_u32(failer_word(&r, 0)) == 0);
    assert(row_of(&r, 0, 1) == FL_ROW_FREE && share_of(&r, 0) == FL_SHARE_ON);
    assert(sh_take(&r, 0, q, 5, 2, 1, &first) == 1);
    assert(sh_fail(&r, 0, q, 5, 2, 3) == 1);
    assert(settle(&r, 0, 0, FL_OK) == 0);
    assert(fl_ring_fail_shared(m, 0, q, 5) == FL_OK);
    assert(state_of(&r, 0) == FL_MAKE_STATE(GEN(q), 5, FL_SLOT_FAILED));
    assert(fl_ring_release(m, 0) == FL_OK);

    /* (b) killed after share went FAILING, its row still taken: reopened, and loaded again */
    assert(fl_ring_queue_shared(m, 0, 3, 0, 4) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 3, 1, 1, &first) == 1);
    fl_atomic_store_release_u32(failer_word(&r, 0), TAKEN(3));
    fl_atomic_store_release_u32(&fl_ring_slot(m, 0)->share, FL_SHARE_FAILING);
    assert(fl_ring_reset_rows(m, 3, 1, &n) == FL_OK && n == 1);
    assert(share_of(&r, 0) == FL_SHARE_ON && fl_atomic_load_acquire_u32(failer_word(&r, 0)) == 0);
    assert_rows(&r, 0, 0, 4, FL_ROW_FREE);
    assert(fl_ring_find_rows(m, &slot, &st) == FL_OK && slot == 0 && st == q);
    assert(sh_take(&r, 0, q, 6, UINT32_MAX, 1, &first) == 4);
    assert(sh_done(&r, 0, q, 6, 0, 4) == 1);
    assert(fl_ring_release(m, 0) == FL_OK);

    /* (c) the same, not reopened: cancelled, and freed by a cancel */
    assert(fl_ring_queue_shared(m, 0, 4, 0, 4) == FL_OK);
    q = state_of(&r, 0);
    assert(sh_take(&r, 0, q, 3, 1, 1, &first) == 1);
    fl_atomic_store_release_u32(failer_word(&r, 0), TAKEN(3));
    fl_atomic_store_release_u32(&fl_ring_slot(m, 0)->share, FL_SHARE_FAILING);
    assert(sh_cancel(&r, 0) == 0); /* failing: not the parent's to cancel */
    assert(fl_ring_reset_rows(m, 3, 0, &n) == FL_OK && n == 1);
    assert(share_of(&r, 0) == FL_SHARE_CANCELLED && row_of(&r, 0, 1) == FL_ROW_CLOSED);
    assert(sh_cancel(&r, 0) == 1);
    ring_free(&r);
}

int main(int argc, char **argv) {
    static const fl_test_case tests[] = {
        FL_TEST(test_nbytes),
        FL_TEST(test_layout_constants),
        FL_TEST(test_init_validation),
        FL_TEST(test_attach),
        FL_TEST(test_full_cycle),
        FL_TEST(test_claim_lowest_seq),
        FL_TEST(test_queue_non_free),
        FL_TEST(test_claim_timeout),
        FL_TEST(test_wait_timeout),
        FL_TEST(test_publish_stale),
        FL_TEST(test_cancel),
        FL_TEST(test_reclaim),
        FL_TEST(test_reclaim_slot),
        FL_TEST(test_generation_wraps),
        FL_TEST(test_owner_bits),
        FL_TEST(test_release_states),
        FL_TEST(test_slot_bounds),
        FL_TEST(test_progress_result_info),
        FL_TEST(test_targeted_queue_and_rows),
        FL_TEST(test_stats_balance),
        FL_TEST(test_strerror),
        FL_TEST(test_stop_wakes_sleeping_claim),
        FL_TEST(test_queue_wakes_sleeping_claim),
        FL_TEST(test_reclaim_wakes_sleeping_claim),
        FL_TEST(test_publish_wakes_sleeping_wait),
        FL_TEST(test_claim_race_one_slot),
        FL_TEST(test_pingpong_no_lost_wakeups),
        FL_TEST(test_stress_in_order),
        FL_TEST(test_stress_dying_workers),
        FL_TEST(test_regression_seq_max),
        FL_TEST(test_regression_huge_timeout),
        FL_TEST(test_regression_slot_info_race),
        FL_TEST(test_regression_giveback_wakes_settle),
        FL_TEST(test_nbytes_rows),
        FL_TEST(test_init_attach_rows),
        FL_TEST(test_shared_basic_flow),
        FL_TEST(test_shared_fail),
        FL_TEST(test_shared_cancel),
        FL_TEST(test_shared_dead_workers),
        FL_TEST(test_shared_dead_failer),
        FL_TEST(test_shared_stale_view),
        FL_TEST(test_shared_given_rows_and_preference),
        FL_TEST(test_shared_settle_wakes),
        FL_TEST(test_shared_publish_wakes_wait),
        FL_TEST(test_stress_shared),
        FL_TEST(test_regression_death_inside_rows_fail),
    };
#if FL_HAVE_FUTEX
    const char *suite = "test_ring";
#else
    const char *suite = "test_ring[portable-wait]";
#endif
    return fl_test_main(suite, tests, sizeof tests / sizeof tests[0], argc, argv);
}
