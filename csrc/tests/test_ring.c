/* test_ring.c: tests of the slot ring (fl_ring.h) — argument validation, the single-threaded
 * state machine, wake-ups across threads, and multi-threaded stress runs in which threads stand
 * in for the parent and worker processes (the ring never knows the difference: it only sees a
 * caller-provided memory block).
 *
 * Build and run through the Makefile in this directory. Knobs:
 *   FL_TEST_TASKS=n   tasks of the main stress run (default FL_STRESS_TASKS, 1,000,000); the
 *                     chaos run (dying workers, failures, cancels) uses n / 4, the lost-wake-up
 *                     ping-pong n / 10 round trips per phase (and n with short jitter)
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
    uint64_t slot_bytes;
    uint64_t data_offset;
} ring;

/* A ring over dirty memory (init must not rely on zeroed pages), payload area after a gap. */
static ring ring_new(uint32_t nslots, uint64_t slot_bytes) {
    ring r;
    r.nslots = nslots;
    r.slot_bytes = slot_bytes;
    r.data_offset = round_up(fl_ring_nbytes(nslots) + 64, FL_CACHELINE);
    r.total = (size_t)(r.data_offset + (uint64_t)nslots * slot_bytes);
    r.mem = xalloc(r.total);
    memset(r.mem, 0xCD, r.total);
    assert(fl_ring_init(r.mem, r.total, nslots, slot_bytes, r.data_offset, 4242) == FL_OK);
    assert(fl_ring_attach(r.mem, r.total) == FL_OK);
    return r;
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
    };
#if FL_HAVE_FUTEX
    const char *suite = "test_ring";
#else
    const char *suite = "test_ring[portable-wait]";
#endif
    return fl_test_main(suite, tests, sizeof tests / sizeof tests[0], argc, argv);
}
