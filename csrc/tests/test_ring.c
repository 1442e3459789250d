/* test_ring.c: tests of the slot ring (fl_ring.h, layout version 4: batches owned in pieces,
 * NOTE [pieces] in fl_ring.c) — argument validation, the single-threaded protocol driven call
 * by call (fl_ring_take called as different worker ids stands in for different workers), the
 * parent's wait across threads, and a multi-threaded stress run in which threads stand in for
 * the parent and the worker processes (the ring never knows the difference: it only sees a
 * caller-provided memory block).
 *
 * Build and run through the Makefile in this directory. Knobs:
 *   FL_TEST_TASKS=n   size of the thread runs: test_stress queues n / STRESS_TASKS_PER_BATCH
 *                     batches (default FL_STRESS_TASKS, 1,000,000: 125,000 batches, under a
 *                     second here; the Makefile's 400,000 under TSan takes about 4 s),
 *                     test_retire_done_race n / 50
 *   FL_TEST_SEED=n    seed of the stress run's random choices */
#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fl_ring.h"
#include "fl_status.h"
#include "fl_wait.h"
#include "fl_test.h"

#ifndef FL_STRESS_TASKS
#define FL_STRESS_TASKS 1000000L
#endif
#define STRESS_TASKS_PER_BATCH 8 /* FL_TEST_TASKS / this = batches of the stress run */

#define MS (1000000LL) /* nanoseconds */
#define ST(w) FL_STATE_BITS(w)
#define OWNER(w) FL_OWNER_BITS(w)
#define GEN(w) FL_GEN_BITS(w)

/* CHECK_EQ: like assert(a == b), printing both values (as long long) when they differ. */
#define CHECK_EQ(a, b)                                                                        \
    do {                                                                                      \
        long long a_ = (long long)(a), b_ = (long long)(b);                                   \
        if (a_ != b_) {                                                                       \
            fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %lld != %lld\n", __FILE__,       \
                    __LINE__, #a, #b, a_, b_);                                                \
            abort();                                                                          \
        }                                                                                     \
    } while (0)
#define CHECK_RC(call, want) CHECK_EQ((call), (want))
#define CHECK_OK(call) CHECK_RC((call), FL_OK)

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
    uint32_t nslots, max_pieces;
    uint64_t slot_bytes;
    uint64_t data_offset;
} ring;

/* A ring over dirty memory (init must not rely on zeroed pages), payload area after a gap. */
static ring ring_new(uint32_t nslots, uint32_t max_pieces, uint64_t slot_bytes) {
    ring r;
    r.nslots = nslots;
    r.max_pieces = max_pieces;
    r.slot_bytes = slot_bytes;
    size_t ctl = fl_ring_nbytes(nslots, max_pieces);
    assert(ctl > 0);
    r.data_offset = round_up(ctl + 64, FL_CACHELINE);
    r.total = (size_t)(r.data_offset + (uint64_t)nslots * slot_bytes);
    r.mem = xalloc(r.total);
    memset(r.mem, 0xCD, r.total);
    CHECK_OK(fl_ring_init(r.mem, r.total, nslots, slot_bytes, r.data_offset, 4242, max_pieces));
    CHECK_OK(fl_ring_attach(r.mem, r.total));
    return r;
}

static void ring_free(ring *r) {
    free(r->mem);
    r->mem = NULL;
}

static fl_header *H(const ring *r) { return (fl_header *)r->mem; }
static uint64_t ctr(const fl_atomic_u64 *p) { return fl_atomic_load_acquire_u64(p); }

static uint32_t state_of(const ring *r, uint32_t slot) {
    uint32_t w = 0xFFFFFFFFu;
    CHECK_OK(fl_ring_slot_state(r->mem, slot, &w));
    return w;
}

static fl_slot_info info_of(const ring *r, uint32_t slot) {
    fl_slot_info in;
    memset(&in, 0xEE, sizeof in);
    CHECK_OK(fl_ring_slot_info(r->mem, slot, &in));
    return in;
}

/* The pieces of slot's batch, into out (cap entries); returns how many there are. */
static uint32_t pieces_of(const ring *r, uint32_t slot, fl_piece_info *out, uint32_t cap) {
    uint32_t n = 0xFFFFFFFFu;
    CHECK_OK(fl_ring_pieces(r->mem, slot, out, cap, &n));
    return n;
}

/* The raw piece word k of slot (the layout of NOTE [region layout]: for tests that play the
 * part of a worker killed between two steps). */
static fl_atomic_u64 *raw_piece(const ring *r, uint32_t slot, uint32_t k) {
    size_t stride = round_up((size_t)r->max_pieces * 16u, FL_CACHELINE);
    char *base = (char *)r->mem + sizeof(fl_header) + (size_t)r->nslots * sizeof(fl_slot_hdr);
    return (fl_atomic_u64 *)(base + (size_t)slot * stride) + k;
}

static void queue_ok(ring *r, uint32_t slot, uint64_t seq, uint32_t count, uint32_t target,
                     uint32_t share) {
    CHECK_OK(fl_ring_queue(r->mem, slot, seq, 0, count, target, share, NULL, 0));
    CHECK_EQ(ST(state_of(r, slot)), FL_SLOT_QUEUED);
}

static fl_take take_ok(ring *r, uint32_t worker, uint32_t divisor, uint32_t min_units) {
    fl_take t;
    memset(&t, 0xEE, sizeof t);
    CHECK_OK(fl_ring_take(r->mem, worker, divisor, min_units, 1000 + worker, &t));
    return t;
}

static int take_rc(ring *r, uint32_t worker, uint32_t divisor, uint32_t min_units) {
    fl_take t;
    return fl_ring_take(r->mem, worker, divisor, min_units, 1000 + worker, &t);
}

/* fl_ring_done that must succeed; returns published. */
static int done_ok(ring *r, const fl_take *t, uint32_t worker) {
    int pub = -1;
    CHECK_OK(fl_ring_done(r->mem, t, worker, &pub));
    assert(pub == 0 || pub == 1);
    return pub;
}

static int fail_ok(ring *r, const fl_take *t, uint32_t worker, uint32_t row) {
    int pub = -1;
    CHECK_OK(fl_ring_fail(r->mem, t, worker, row, &pub));
    assert(pub == 0 || pub == 1);
    return pub;
}

static int retire(ring *r, uint32_t slot) {
    int freed = -1;
    CHECK_OK(fl_ring_retire(r->mem, slot, &freed));
    assert(freed == 0 || freed == 1);
    return freed;
}

static uint32_t give_back(ring *r, uint32_t slot, uint32_t worker, int reopen) {
    uint32_t n = 0xFFFFFFFFu;
    CHECK_OK(fl_ring_give_back(r->mem, slot, worker, reopen, &n));
    return n;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static uint64_t rng_next_ext(uint64_t *s) {
    uint64_t x = (*s += 0x9E3779B97F4A7C15ull);
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The guided piece size fl_ring_take documents: max(min_units, left / divisor), 1..left. */
static uint32_t guided(uint32_t left, uint32_t divisor, uint32_t min_units) {
    uint32_t n = left / (divisor ? divisor : 1);
    if (n < min_units) n = min_units;
    if (n < 1) n = 1;
    if (n > left) n = left;
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* 1. sizes, init, attach                                                                     */

static void test_nbytes(void) {
    CHECK_EQ(fl_ring_nbytes(0, 1), 0);
    CHECK_EQ(fl_ring_nbytes(FL_MAX_SLOTS + 1, 1), 0);
    CHECK_EQ(fl_ring_nbytes(1, 0), 0);
    CHECK_EQ(fl_ring_nbytes(1, FL_MAX_PIECES + 1), 0);
    size_t a = fl_ring_nbytes(1, 1), b = fl_ring_nbytes(2, 1), c = fl_ring_nbytes(2, 64);
    assert(a >= sizeof(fl_header) + sizeof(fl_slot_hdr) + 16);
    assert(b > a && c > b);
    CHECK_EQ(a % FL_CACHELINE, 0);
    CHECK_EQ(c % FL_CACHELINE, 0);
    /* per slot: a header and a table of max_pieces (8-byte word + 8-byte progress) */
    CHECK_EQ(c - fl_ring_nbytes(1, 64), sizeof(fl_slot_hdr) + 64 * 16);
    assert(fl_ring_nbytes(FL_MAX_SLOTS, FL_MAX_PIECES) > 0);
    CHECK_EQ(fl_ring_unit(1), 1);
    CHECK_EQ(fl_ring_unit(FL_MAX_UNITS), 1);
    CHECK_EQ(fl_ring_unit(FL_MAX_UNITS + 1), 2);
    CHECK_EQ(fl_ring_unit(200000), 4);
    CHECK_EQ(fl_ring_unit(UINT32_MAX), 65536);
}

static void test_init_validation(void) {
    const uint32_t nslots = 4, mp = 8;
    size_t ctl = fl_ring_nbytes(nslots, mp);
    size_t total = ctl + 4 * 256 + 2 * FL_CACHELINE;
    char *mem = xalloc(total + FL_CACHELINE);
    memset(mem, 0xAB, total + FL_CACHELINE);
    CHECK_RC(fl_ring_init(NULL, total, nslots, 256, ctl, 1, mp), FL_EINVAL);
    CHECK_RC(fl_ring_init(mem + 8, total, nslots, 256, ctl, 1, mp), FL_EINVAL); /* misaligned */
    CHECK_RC(fl_ring_init(mem + 64, total, nslots, 256, ctl, 1, mp), FL_EINVAL);
    CHECK_RC(fl_ring_init(mem, total, 0, 256, ctl, 1, mp), FL_EINVAL);
    CHECK_RC(fl_ring_init(mem, total, FL_MAX_SLOTS + 1, 256, ctl, 1, mp), FL_EINVAL);
    CHECK_RC(fl_ring_init(mem, total, nslots, 256, ctl, 1, 0), FL_EINVAL);
    CHECK_RC(fl_ring_init(mem, total, nslots, 256, ctl, 1, FL_MAX_PIECES + 1), FL_EINVAL);
    CHECK_RC(fl_ring_init(mem, ctl - 1, nslots, 0, ctl, 1, mp), FL_ENOSPACE);   /* too small */
    CHECK_RC(fl_ring_init(mem, total, nslots, 256, ctl - 8, 1, mp), FL_ENOSPACE); /* overlaps */
    CHECK_RC(fl_ring_init(mem, total, nslots, 1024, ctl, 1, mp), FL_ENOSPACE); /* payload out */
    CHECK_RC(fl_ring_init(mem, total, nslots, UINT64_MAX / 2, ctl, 1, mp), FL_ENOSPACE);
    /* nothing was written by the failed calls */
    CHECK_EQ((unsigned char)mem[0], 0xAB);
    CHECK_OK(fl_ring_init(mem, total, nslots, 256, ctl, 77, mp));
    CHECK_OK(fl_ring_init(mem, ctl, nslots, 0, ctl, 77, mp)); /* no payload: fits exactly */
    CHECK_OK(fl_ring_init(mem, total, nslots, 256, ctl, 77, mp));
    fl_header *h = (fl_header *)mem;
    CHECK_EQ(memcmp(h->magic, FL_MAGIC, 8), 0);
    CHECK_EQ(h->layout_version, FL_LAYOUT_VERSION);
    CHECK_EQ(h->nslots, nslots);
    CHECK_EQ(h->max_pieces, mp);
    CHECK_EQ(h->creator_pid, 77);
    CHECK_EQ(h->data_offset, ctl);
    for (uint32_t i = 0; i < nslots; i++) {
        uint32_t w = 1;
        CHECK_OK(fl_ring_slot_state(mem, i, &w));
        CHECK_EQ(w, 0); /* FREE, generation 0, over dirty memory */
        uint32_t np = 99;
        CHECK_OK(fl_ring_pieces(mem, i, NULL, 0, &np));
        CHECK_EQ(np, 0);
    }
    CHECK_EQ(fl_ring_stopped(mem), 0);
    free(mem);
}

static void test_attach(void) {
    ring r = ring_new(3, 16, 128);
    fl_header *h = H(&r);
    CHECK_RC(fl_ring_attach(NULL, r.total), FL_ELAYOUT);
    CHECK_RC(fl_ring_attach(r.mem, sizeof(fl_header) - 1), FL_ELAYOUT);
    CHECK_RC(fl_ring_attach(r.mem, r.total - 1), FL_ELAYOUT); /* wrong total */
    CHECK_RC(fl_ring_attach(r.mem, r.total + FL_CACHELINE), FL_ELAYOUT);
    h->magic[0] ^= 1;
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->magic[0] ^= 1;
    CHECK_OK(fl_ring_attach(r.mem, r.total));
    h->layout_version = FL_LAYOUT_VERSION - 1;
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->layout_version = FL_LAYOUT_VERSION + 1;
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->layout_version = FL_LAYOUT_VERSION;
    CHECK_OK(fl_ring_attach(r.mem, r.total));
    h->max_pieces = 0;
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->max_pieces = FL_MAX_PIECES + 1;
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->max_pieces = 4096; /* a bigger table would overlap the payloads */
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->max_pieces = 16;
    h->slot_hdr_bytes += 8;
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->slot_hdr_bytes -= 8;
    h->nslots = 0;
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->nslots = 3;
    h->slot_bytes = UINT64_MAX / 2;
    CHECK_RC(fl_ring_attach(r.mem, r.total), FL_ELAYOUT);
    h->slot_bytes = 128;
    CHECK_OK(fl_ring_attach(r.mem, r.total));
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 2. a whole batch, start to end                                                              */

static void test_whole_batch_cycle(void) {
    ring r = ring_new(4, 8, 64);
    void *m = r.mem;
    CHECK_OK(fl_ring_queue(m, 1, 7, 3, 5, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0));
    uint32_t q = state_of(&r, 1);
    CHECK_EQ(ST(q), FL_SLOT_QUEUED);
    uint32_t g1 = GEN(q);
    CHECK_RC(fl_ring_queue(m, 1, 8, 3, 5, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0), FL_ESTATE);
    fl_slot_info in = info_of(&r, 1);
    CHECK_EQ(in.seq, 7);
    CHECK_EQ(in.epoch, 3);
    CHECK_EQ(in.count, 5);
    CHECK_EQ(in.rows, 5);
    CHECK_EQ(in.target, FL_TARGET_ANY);
    CHECK_EQ(in.share, FL_SHARE_OFF);
    CHECK_EQ(in.err_row, UINT32_MAX);

    uint32_t w = 0;
    CHECK_RC(fl_ring_wait(m, 1, 0, &w), FL_ETIMEOUT);
    CHECK_EQ(w, q);

    fl_take t = take_ok(&r, 3, 4, 1);
    CHECK_EQ(t.slot, 1);
    CHECK_EQ(t.state, q);
    CHECK_EQ(t.piece, 0);
    CHECK_EQ(t.first, 0);
    CHECK_EQ(t.n, 5); /* share off: all rows, whatever the divisor */
    CHECK_EQ(t.count, 5);
    CHECK_EQ(t.shared, 0);
    CHECK_EQ(t.seq, 7);
    CHECK_EQ(t.epoch, 3);
    CHECK_RC(take_rc(&r, 2, 4, 1), FL_ETIMEOUT); /* nothing left to take, and no wait */
    CHECK_RC(take_rc(&r, 3, 4, 1), FL_ETIMEOUT);

    fl_piece_info pi[4];
    CHECK_EQ(pieces_of(&r, 1, pi, 4), 1);
    CHECK_EQ(pi[0].kind, FL_PIECE_TAKEN);
    CHECK_EQ(pi[0].owner, 3);
    CHECK_EQ(pi[0].first, 0);
    CHECK_EQ(pi[0].n, 5);
    CHECK_EQ(pi[0].pid, 1003);
    CHECK_EQ(pi[0].done, 0);
    CHECK_OK(fl_ring_progress(m, 1, 0, 3, 1003));
    CHECK_EQ(pieces_of(&r, 1, pi, 4), 1);
    CHECK_EQ(pi[0].done, 3);

    CHECK_OK(fl_ring_set_result(m, 1, FL_SLOT_F_SPILLED, 99));
    CHECK_RC(fl_ring_set_rows(m, 1, 6), FL_ERANGE);
    CHECK_OK(fl_ring_set_rows(m, 1, 4));
    CHECK_EQ(ST(state_of(&r, 1)), FL_SLOT_QUEUED);

    CHECK_EQ(done_ok(&r, &t, 3), 1);
    w = state_of(&r, 1);
    CHECK_EQ(ST(w), FL_SLOT_READY);
    CHECK_EQ(OWNER(w), 3);
    CHECK_EQ(GEN(w), g1);
    int pub = 7;
    CHECK_RC(fl_ring_done(m, &t, 3, &pub), FL_ESTATE); /* DONE already */
    CHECK_EQ(pub, 0);
    CHECK_OK(fl_ring_wait(m, 1, 1000 * MS, &w));
    CHECK_EQ(ST(w), FL_SLOT_READY);
    in = info_of(&r, 1);
    CHECK_EQ(in.rows, 4);
    CHECK_EQ(in.flags, FL_SLOT_F_SPILLED);
    CHECK_EQ(in.var_bytes, 99);
    CHECK_EQ(in.pid, 1003);
    CHECK_EQ(in.err_row, UINT32_MAX);
    CHECK_EQ(pieces_of(&r, 1, pi, 4), 1);
    CHECK_EQ(pi[0].kind, FL_PIECE_DONE);

    CHECK_RC(fl_ring_queue(m, 1, 8, 3, 5, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0), FL_ESTATE);
    CHECK_OK(fl_ring_begin_read(m, 1));
    CHECK_EQ(ST(state_of(&r, 1)), FL_SLOT_READING);
    CHECK_EQ(OWNER(state_of(&r, 1)), 3);
    CHECK_RC(fl_ring_begin_read(m, 1), FL_ESTATE);
    CHECK_OK(fl_ring_wait(m, 1, 0, &w)); /* not QUEUED: returns at once */
    CHECK_EQ(retire(&r, 1), 1);
    CHECK_EQ(ST(state_of(&r, 1)), FL_SLOT_FREE);
    CHECK_EQ(retire(&r, 1), 1); /* FREE stays FREE */
    CHECK_RC(fl_ring_begin_read(m, 1), FL_ESTATE);

    /* queued again: a new generation, fresh header fields */
    CHECK_OK(fl_ring_queue(m, 1, 9, 4, 2, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0));
    w = state_of(&r, 1);
    CHECK_EQ(GEN(w), g1 + 1);
    in = info_of(&r, 1);
    CHECK_EQ(in.rows, 2);
    CHECK_EQ(in.flags, 0);
    CHECK_EQ(in.var_bytes, 0);
    CHECK_EQ(in.seq, 9);
    CHECK_EQ(pieces_of(&r, 1, pi, 4), 0);
    CHECK_RC(fl_ring_done(m, &t, 3, &pub), FL_ESTATE); /* the old take is not of this batch */
    t = take_ok(&r, 0, 1, 1);
    CHECK_EQ(t.slot, 1);
    CHECK_EQ(t.n, 2);
    CHECK_EQ(done_ok(&r, &t, 0), 1);
    CHECK_EQ(ST(state_of(&r, 1)), FL_SLOT_READY);
    CHECK_EQ(OWNER(state_of(&r, 1)), 0);
    CHECK_EQ(retire(&r, 1), 1); /* READY straight to FREE, without a read */
    CHECK_EQ(ctr(&H(&r)->n_queued), 2);
    CHECK_EQ(ctr(&H(&r)->n_taken), 2);
    CHECK_EQ(ctr(&H(&r)->n_published), 2);
    CHECK_EQ(ctr(&H(&r)->n_released), 2);
    CHECK_EQ(ctr(&H(&r)->n_closing), 0);
    /* the other slots were never touched */
    CHECK_EQ(state_of(&r, 0), 0);
    CHECK_EQ(state_of(&r, 2), 0);
    ring_free(&r);
}

/* Which slot a worker takes first: the lowest seq of the oldest epoch; a later epoch last. */
static void test_take_order(void) {
    ring r = ring_new(4, 8, 0);
    void *m = r.mem;
    CHECK_OK(fl_ring_queue(m, 0, 20, 1, 1, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0));
    CHECK_OK(fl_ring_queue(m, 1, 12, 0, 1, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0));
    CHECK_OK(fl_ring_queue(m, 2, 10, 0, 1, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0));
    CHECK_OK(fl_ring_queue(m, 3, 5, 2, 1, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0));
    fl_take a = take_ok(&r, 0, 1, 1), b = take_ok(&r, 1, 1, 1), c = take_ok(&r, 2, 1, 1),
            d = take_ok(&r, 3, 1, 1);
    CHECK_EQ(a.slot, 2); /* epoch 0, seq 10 */
    CHECK_EQ(b.slot, 1); /* epoch 0, seq 12 */
    /* slots 1, 2 are still QUEUED (epoch 0 is still the oldest): slots 0 and 3 are both
     * unbegun batches of a later epoch, taken lowest seq first */
    CHECK_EQ(c.slot, 3); /* epoch 2, seq 5 */
    CHECK_EQ(d.slot, 0); /* epoch 1, seq 20 */
    CHECK_RC(take_rc(&r, 4, 1, 1), FL_ETIMEOUT);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 3. shared batches: guided pieces                                                            */

/* Take a shared batch of `count` rows in pieces (workers 0..nw-1 in turn), check the sizes
 * against the documented guided rule, then finish them in a scrambled order. */
static void shared_run(uint32_t count, uint32_t divisor, uint32_t min_units, uint32_t nw,
                       uint32_t max_pieces) {
    ring r = ring_new(2, max_pieces, 0);
    queue_ok(&r, 1, 5, count, FL_TARGET_ANY, FL_SHARE_ON);
    uint32_t q = state_of(&r, 1);
    fl_take *t = calloc(max_pieces, sizeof *t);
    uint32_t *who = calloc(max_pieces, sizeof *who);
    assert(t != NULL && who != NULL);
    uint32_t np = 0, end = 0;
    while (end < count) {
        assert(np < max_pieces);
        uint32_t left = count - end;
        uint32_t want = np + 1 < max_pieces ? guided(left, divisor, min_units) : left;
        who[np] = np % nw;
        t[np] = take_ok(&r, who[np], divisor, min_units);
        CHECK_EQ(t[np].slot, 1);
        CHECK_EQ(t[np].state, q);
        CHECK_EQ(t[np].piece, np);
        CHECK_EQ(t[np].first, end);
        CHECK_EQ(t[np].n, want);
        CHECK_EQ(t[np].count, count);
        CHECK_EQ(t[np].shared, 1);
        CHECK_EQ(t[np].seq, 5);
        end += t[np].n;
        np++;
    }
    for (uint32_t w = 0; w < nw + 1; w++) CHECK_RC(take_rc(&r, w, divisor, min_units), FL_ETIMEOUT);
    fl_piece_info *pi = calloc(max_pieces, sizeof *pi);
    CHECK_EQ(pieces_of(&r, 1, pi, max_pieces), np);
    for (uint32_t k = 0; k < np; k++) {
        CHECK_EQ(pi[k].kind, FL_PIECE_TAKEN);
        CHECK_EQ(pi[k].owner, who[k]);
        CHECK_EQ(pi[k].first, t[k].first);
        CHECK_EQ(pi[k].n, t[k].n);
    }
    /* finish: odd pieces first, then even ones, the last of those publishes */
    uint32_t finished = 0;
    for (int pass = 1; pass >= 0; pass--)
        for (uint32_t k = (uint32_t)pass; k < np; k += 2) {
            finished++;
            int pub = done_ok(&r, &t[k], who[k]);
            uint32_t w = state_of(&r, 1);
            if (finished < np) {
                CHECK_EQ(pub, 0);
                CHECK_EQ(w, q);
            } else {
                CHECK_EQ(pub, 1);
                CHECK_EQ(ST(w), FL_SLOT_READY);
                /* the worker whose done publishes it owns it (one piece: its loader) */
                CHECK_EQ(OWNER(w), who[k]);
            }
        }
    CHECK_EQ(ctr(&H(&r)->n_taken), np);
    CHECK_EQ(ctr(&H(&r)->n_published), 1);
    CHECK_EQ(retire(&r, 1), 1);
    free(pi);
    free(who);
    free(t);
    ring_free(&r);
}

static void test_shared_guided_pieces(void) {
    /* the documented sequences, spelled out */
    static const uint32_t seq_d4_m1[] = {5, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1};
    static const uint32_t seq_d4_m3[] = {5, 3, 3, 3, 3, 3};
    ring r = ring_new(1, 32, 0);
    for (int v = 0; v < 3; v++) {
        const uint32_t *want = v == 0 ? seq_d4_m1 : seq_d4_m3;
        uint32_t nwant = v == 0 ? 11 : v == 1 ? 6 : 1;
        uint32_t min_units = v == 0 ? 1 : 3, divisor = v == 2 ? 1 : 4;
        queue_ok(&r, 0, 1 + (uint64_t)v, 20, FL_TARGET_ANY, FL_SHARE_ON);
        fl_take t[32];
        uint32_t first = 0;
        for (uint32_t k = 0; k < nwant; k++) {
            t[k] = take_ok(&r, k % 3, divisor, min_units);
            CHECK_EQ(t[k].first, first);
            CHECK_EQ(t[k].n, v == 2 ? 20 : want[k]);
            first += t[k].n;
        }
        CHECK_EQ(first, 20);
        CHECK_RC(take_rc(&r, 0, divisor, min_units), FL_ETIMEOUT);
        for (uint32_t k = nwant; k-- > 0;) CHECK_EQ(done_ok(&r, &t[k], k % 3), k == 0);
        CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_READY);
        CHECK_EQ(OWNER(state_of(&r, 0)), 0);
        CHECK_EQ(retire(&r, 0), 1);
    }
    ring_free(&r);
    shared_run(20, 4, 1, 3, 64);
    shared_run(64, 2, 1, 4, 64);
    shared_run(64, 8, 2, 4, 64);
    shared_run(1, 4, 1, 2, 64);
    shared_run(100, 1000, 1, 5, 128); /* single rows */
    shared_run(20, 4, 1, 3, 3);       /* the last entry of the table takes the rest */
    shared_run(20, 4, 1, 3, 1);       /* a table of one entry: taken whole */
}

/* A worker helps finish a begun shared batch before taking a later unbegun one of the same
 * epoch; it prefers an unbegun batch of the oldest epoch to helping. */
static void test_shared_help_order(void) {
    ring r = ring_new(3, 16, 0);
    void *m = r.mem;
    CHECK_OK(fl_ring_queue(m, 0, 1, 0, 8, FL_TARGET_ANY, FL_SHARE_ON, NULL, 0));
    CHECK_OK(fl_ring_queue(m, 1, 2, 0, 8, FL_TARGET_ANY, FL_SHARE_ON, NULL, 0));
    fl_take a = take_ok(&r, 0, 2, 1);
    CHECK_EQ(a.slot, 0);
    CHECK_EQ(a.n, 4);
    fl_take b = take_ok(&r, 1, 2, 1); /* slot 1 is unbegun, oldest epoch: rank 1 */
    CHECK_EQ(b.slot, 1);
    fl_take c = take_ok(&r, 2, 2, 1); /* both begun: help the lower seq */
    CHECK_EQ(c.slot, 0);
    CHECK_EQ(c.first, 4);
    CHECK_EQ(c.n, 2);
    CHECK_OK(fl_ring_queue(m, 2, 3, 1, 8, FL_TARGET_ANY, FL_SHARE_ON, NULL, 0));
    fl_take d = take_ok(&r, 3, 2, 1); /* later epoch unbegun (rank 3) < helping (rank 2) */
    CHECK_EQ(d.slot, 0);
    CHECK_EQ(d.first, 6);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 4. given rows                                                                               */

static void test_given_rows(void) {
    ring r = ring_new(2, 16, 0);
    void *m = r.mem;
    uint32_t owners[3] = {2, FL_TARGET_ANY, 1};
    CHECK_OK(fl_ring_queue(m, 0, 1, 0, 6, FL_TARGET_ANY, FL_SHARE_ON, owners, 3));
    fl_piece_info pi[8];
    CHECK_EQ(pieces_of(&r, 0, pi, 8), 3);
    CHECK_EQ(pi[0].kind, FL_PIECE_GIVEN);
    CHECK_EQ(pi[0].owner, 2);
    CHECK_EQ(pi[1].kind, FL_PIECE_FREE);
    CHECK_EQ(pi[2].kind, FL_PIECE_GIVEN);
    CHECK_EQ(pi[2].owner, 1);
    for (uint32_t k = 0; k < 3; k++) {
        CHECK_EQ(pi[k].first, k);
        CHECK_EQ(pi[k].n, 1);
    }
    fl_take a = take_ok(&r, 1, 1, 1); /* its given row first, though the batch could be cut */
    CHECK_EQ(a.piece, 2);
    CHECK_EQ(a.first, 2);
    CHECK_EQ(a.n, 1);
    fl_take b = take_ok(&r, 3, 1, 1); /* a FREE piece before cutting a new one */
    CHECK_EQ(b.piece, 1);
    CHECK_EQ(b.first, 1);
    CHECK_EQ(b.n, 1);
    fl_take c = take_ok(&r, 0, 1, 1); /* row 0 is worker 2's: cut the rest */
    CHECK_EQ(c.piece, 3);
    CHECK_EQ(c.first, 3);
    CHECK_EQ(c.n, 3);
    CHECK_RC(take_rc(&r, 0, 1, 1), FL_ETIMEOUT);
    CHECK_RC(take_rc(&r, 1, 1, 1), FL_ETIMEOUT);
    CHECK_EQ(done_ok(&r, &a, 1), 0);
    CHECK_EQ(done_ok(&r, &b, 3), 0);
    CHECK_EQ(done_ok(&r, &c, 0), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_QUEUED); /* row 0 not loaded yet */
    fl_take d = take_ok(&r, 2, 1, 1);
    CHECK_EQ(d.piece, 0);
    CHECK_EQ(d.first, 0);
    CHECK_EQ(done_ok(&r, &d, 2), 1);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_READY);
    CHECK_EQ(OWNER(state_of(&r, 0)), 2);
    CHECK_EQ(retire(&r, 0), 1);

    /* a given row comes before an older unbegun batch in another slot */
    CHECK_OK(fl_ring_queue(m, 0, 10, 0, 4, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0));
    uint32_t o1[1] = {1};
    CHECK_OK(fl_ring_queue(m, 1, 11, 0, 4, FL_TARGET_ANY, FL_SHARE_ON, o1, 1));
    fl_take e = take_ok(&r, 1, 1, 1);
    CHECK_EQ(e.slot, 1);
    CHECK_EQ(e.piece, 0);
    CHECK_EQ(e.n, 1);
    fl_take f = take_ok(&r, 0, 1, 1); /* lower seq, unbegun, before helping slot 1 */
    CHECK_EQ(f.slot, 0);
    CHECK_EQ(f.n, 4);
    fl_take g = take_ok(&r, 5, 1, 1);
    CHECK_EQ(g.slot, 1);
    CHECK_EQ(g.first, 1);
    CHECK_EQ(g.n, 3);
    CHECK_EQ(retire(&r, 0), 0); /* a piece TAKEN: CLOSING */
    CHECK_EQ(done_ok(&r, &f, 0), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_FREE);
    CHECK_EQ(done_ok(&r, &g, 5), 0);
    CHECK_EQ(done_ok(&r, &e, 1), 1);
    CHECK_EQ(retire(&r, 1), 1);

    /* a batch whose only row is given to worker 1: nobody else takes it */
    CHECK_OK(fl_ring_queue(m, 0, 20, 0, 1, FL_TARGET_ANY, FL_SHARE_ON, o1, 1));
    CHECK_RC(take_rc(&r, 0, 1, 1), FL_ETIMEOUT);
    CHECK_RC(take_rc(&r, 2, 1, 1), FL_ETIMEOUT);
    a = take_ok(&r, 1, 1, 1);
    CHECK_EQ(done_ok(&r, &a, 1), 1);
    CHECK_EQ(retire(&r, 0), 1);

    /* EINVAL: owners with share off, more owners than rows, NULL owners, a bad worker id,
     * owners of a batch of more than one row per unit */
    uint32_t big[3] = {0, 1, 2}, bad[1] = {FL_MAX_WORKERS};
    CHECK_RC(fl_ring_queue(m, 0, 1, 0, 6, FL_TARGET_ANY, FL_SHARE_OFF, big, 3), FL_EINVAL);
    CHECK_RC(fl_ring_queue(m, 0, 1, 0, 2, FL_TARGET_ANY, FL_SHARE_ON, big, 3), FL_EINVAL);
    CHECK_RC(fl_ring_queue(m, 0, 1, 0, 6, FL_TARGET_ANY, FL_SHARE_ON, NULL, 2), FL_EINVAL);
    CHECK_RC(fl_ring_queue(m, 0, 1, 0, 6, FL_TARGET_ANY, FL_SHARE_ON, bad, 1), FL_EINVAL);
    CHECK_RC(fl_ring_queue(m, 0, 1, 0, FL_MAX_UNITS + 1, FL_TARGET_ANY, FL_SHARE_ON, big, 1),
             FL_EINVAL);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_FREE);
    CHECK_EQ(ctr(&H(&r)->n_queued), 4);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 5. targets                                                                                  */

static void test_target(void) {
    ring r = ring_new(2, 8, 0);
    void *m = r.mem;
    queue_ok(&r, 0, 1, 3, 2, FL_SHARE_OFF);
    CHECK_EQ(info_of(&r, 0).target, 2);
    CHECK_RC(take_rc(&r, 1, 1, 1), FL_ETIMEOUT);
    CHECK_RC(take_rc(&r, 0, 1, 1), FL_ETIMEOUT);
    queue_ok(&r, 1, 2, 3, FL_TARGET_ANY, FL_SHARE_OFF);
    fl_take a = take_ok(&r, 1, 1, 1); /* not slot 0, though its seq is lower */
    CHECK_EQ(a.slot, 1);
    fl_take b = take_ok(&r, 2, 1, 1);
    CHECK_EQ(b.slot, 0);
    CHECK_EQ(b.n, 3);
    CHECK_EQ(done_ok(&r, &b, 2), 1);
    CHECK_EQ(OWNER(state_of(&r, 0)), 2);
    /* a shared batch targeted at a worker: only it takes pieces */
    CHECK_EQ(retire(&r, 0), 1);
    queue_ok(&r, 0, 3, 4, 2, FL_SHARE_ON);
    CHECK_RC(take_rc(&r, 3, 2, 1), FL_ETIMEOUT);
    fl_take c = take_ok(&r, 2, 2, 1);
    CHECK_EQ(c.n, 2);
    CHECK_RC(take_rc(&r, 3, 2, 1), FL_ETIMEOUT);
    CHECK_RC(fl_ring_queue(m, 0, 4, 0, 1, FL_MAX_WORKERS, FL_SHARE_OFF, NULL, 0), FL_EINVAL);
    CHECK_RC(fl_ring_queue(m, 0, 4, 0, 1, FL_TARGET_ANY, 2, NULL, 0), FL_EINVAL);
    CHECK_RC(fl_ring_queue(m, 0, 4, 0, 0, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0), FL_EINVAL);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 6, 7. failures; retiring a failing batch                                                    */

/* A shared batch of 8 rows taken in single rows 0..5 by workers 10 + row (pid 100 + row). */
static void take_rows_0_to_5(ring *r, fl_take t[8]) {
    queue_ok(r, 0, 1, 8, FL_TARGET_ANY, FL_SHARE_ON);
    for (uint32_t row = 0; row < 6; row++) {
        CHECK_OK(fl_ring_take(r->mem, 10 + row, 1000, 1, 100 + row, &t[row]));
        CHECK_EQ(t[row].first, row);
        CHECK_EQ(t[row].n, 1);
    }
}

static void test_fail_high_then_low(void) {
    ring r = ring_new(1, 16, 0);
    fl_take t[8];
    take_rows_0_to_5(&r, t);
    int pub = 9;
    CHECK_RC(fl_ring_fail(r.mem, &t[5], 15, 4, &pub), FL_ERANGE); /* not a row of its piece */
    CHECK_RC(fl_ring_fail(r.mem, &t[5], 15, 6, &pub), FL_ERANGE);
    CHECK_RC(fl_ring_fail(r.mem, &t[5], 14, 5, &pub), FL_ESTATE); /* not its piece */
    CHECK_EQ(fail_ok(&r, &t[5], 15, 5), 0);
    fl_slot_info in = info_of(&r, 0);
    CHECK_EQ(in.err_row, 5);
    CHECK_EQ(in.err_owner, 15);
    CHECK_EQ(ST(in.state), FL_SLOT_QUEUED);
    /* rows 6, 7 are above the error: no longer handed out */
    CHECK_RC(take_rc(&r, 30, 1000, 1), FL_ETIMEOUT);
    CHECK_EQ(fail_ok(&r, &t[2], 12, 2), 0);
    in = info_of(&r, 0);
    CHECK_EQ(in.err_row, 2);
    CHECK_EQ(in.err_owner, 12);
    CHECK_EQ(in.pid, 102);
    CHECK_EQ(done_ok(&r, &t[0], 10), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_QUEUED); /* row 1 still loads */
    CHECK_EQ(done_ok(&r, &t[1], 11), 1);
    uint32_t w = state_of(&r, 0);
    CHECK_EQ(ST(w), FL_SLOT_FAILED);
    CHECK_EQ(OWNER(w), 12);
    CHECK_OK(fl_ring_wait(r.mem, 0, 0, &w));
    CHECK_EQ(ST(w), FL_SLOT_FAILED);
    in = info_of(&r, 0);
    CHECK_EQ(in.err_row, 2);
    CHECK_EQ(in.err_owner, 12);
    CHECK_EQ(in.pid, 102);
    CHECK_RC(fl_ring_begin_read(r.mem, 0), FL_ESTATE);
    /* 7. retired while rows 3 and 4 still load: CLOSING; the last of them frees it */
    CHECK_EQ(retire(&r, 0), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_CLOSING);
    CHECK_RC(fl_ring_queue(r.mem, 0, 2, 0, 1, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0), FL_ESTATE);
    CHECK_RC(take_rc(&r, 30, 1000, 1), FL_ETIMEOUT);
    CHECK_EQ(done_ok(&r, &t[3], 13), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_CLOSING);
    CHECK_EQ(retire(&r, 0), 0);
    CHECK_EQ(done_ok(&r, &t[4], 14), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_FREE);
    CHECK_EQ(retire(&r, 0), 1);
    CHECK_EQ(ctr(&H(&r)->n_published), 1);
    CHECK_EQ(ctr(&H(&r)->n_closing), 1);
    CHECK_EQ(ctr(&H(&r)->n_released), 1);
    ring_free(&r);
}

static void test_fail_low_then_high(void) {
    ring r = ring_new(1, 16, 0);
    fl_take t[8];
    take_rows_0_to_5(&r, t);
    CHECK_EQ(fail_ok(&r, &t[2], 12, 2), 0);
    CHECK_EQ(fail_ok(&r, &t[5], 15, 5), 0); /* above the error: err stays row 2 */
    fl_slot_info in = info_of(&r, 0);
    CHECK_EQ(in.err_row, 2);
    CHECK_EQ(in.err_owner, 12);
    CHECK_EQ(done_ok(&r, &t[3], 13), 0);
    CHECK_RC(take_rc(&r, 30, 1000, 1), FL_ETIMEOUT);
    CHECK_EQ(done_ok(&r, &t[0], 10), 0);
    CHECK_EQ(done_ok(&r, &t[1], 11), 1);
    uint32_t w = state_of(&r, 0);
    CHECK_EQ(ST(w), FL_SLOT_FAILED);
    CHECK_EQ(OWNER(w), 12);
    CHECK_EQ(info_of(&r, 0).pid, 102);
    /* 7. retired while row 4 loads; its worker dies: given back, the slot is FREE */
    CHECK_EQ(retire(&r, 0), 0);
    CHECK_EQ(give_back(&r, 0, 14, 1), 1);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_FREE);
    CHECK_EQ(retire(&r, 0), 1);
    CHECK_EQ(ctr(&H(&r)->n_given_back), 1);
    ring_free(&r);
}

/* The batch fails at once when the failing row's own piece settles the prefix. */
static void test_fail_whole_and_first_row(void) {
    ring r = ring_new(1, 16, 0);
    queue_ok(&r, 0, 1, 8, FL_TARGET_ANY, FL_SHARE_OFF);
    fl_take t = take_ok(&r, 4, 1, 1);
    int pub = 0;
    CHECK_RC(fl_ring_fail(r.mem, &t, 4, 8, &pub), FL_ERANGE);
    CHECK_EQ(fail_ok(&r, &t, 4, 3), 1);
    uint32_t w = state_of(&r, 0);
    CHECK_EQ(ST(w), FL_SLOT_FAILED);
    CHECK_EQ(OWNER(w), 4);
    fl_slot_info in = info_of(&r, 0);
    CHECK_EQ(in.err_row, 3);
    CHECK_EQ(in.err_owner, 4);
    CHECK_EQ(in.pid, 1004);
    fl_piece_info pi[2];
    CHECK_EQ(pieces_of(&r, 0, pi, 2), 1);
    CHECK_EQ(pi[0].kind, FL_PIECE_ERRORED);
    CHECK_EQ(pi[0].done, 3); /* rows before the failing one were loaded */
    CHECK_RC(fl_ring_done(r.mem, &t, 4, &pub), FL_ESTATE);
    CHECK_EQ(retire(&r, 0), 1);

    /* shared: row 0 fails while rows above still load; FAILED at once */
    queue_ok(&r, 0, 2, 8, FL_TARGET_ANY, FL_SHARE_ON);
    fl_take a = take_ok(&r, 1, 4, 1), b = take_ok(&r, 2, 4, 1);
    CHECK_EQ(a.first, 0);
    CHECK_EQ(fail_ok(&r, &a, 1, 0), 1);
    w = state_of(&r, 0);
    CHECK_EQ(ST(w), FL_SLOT_FAILED);
    CHECK_EQ(OWNER(w), 1);
    CHECK_RC(take_rc(&r, 3, 4, 1), FL_ETIMEOUT);
    CHECK_EQ(done_ok(&r, &b, 2), 0); /* a late loader finishes: nothing changes */
    CHECK_EQ(state_of(&r, 0), w);
    CHECK_EQ(retire(&r, 0), 1);
    ring_free(&r);
}

/* A QUEUED batch retired while pieces load (a cancel), and rows still FREE to take. */
static void test_retire_queued(void) {
    ring r = ring_new(1, 16, 0);
    queue_ok(&r, 0, 1, 8, FL_TARGET_ANY, FL_SHARE_ON);
    CHECK_EQ(retire(&r, 0), 1); /* nothing taken: FREE at once */
    CHECK_EQ(ctr(&H(&r)->n_released), 1);
    queue_ok(&r, 0, 2, 8, FL_TARGET_ANY, FL_SHARE_ON);
    fl_take a = take_ok(&r, 1, 2, 1), b = take_ok(&r, 2, 2, 1);
    CHECK_EQ(retire(&r, 0), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_CLOSING);
    CHECK_RC(take_rc(&r, 3, 2, 1), FL_ETIMEOUT); /* rows 6, 7 are not handed out any more */
    CHECK_EQ(done_ok(&r, &a, 1), 0);
    CHECK_EQ(retire(&r, 0), 0);
    int pub = 1;
    CHECK_OK(fl_ring_fail(r.mem, &b, 2, 5, &pub)); /* fails while CLOSING: the last loader */
    CHECK_EQ(pub, 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_FREE);
    CHECK_EQ(retire(&r, 0), 1);
    CHECK_EQ(ctr(&H(&r)->n_published), 0);
    /* n_closing counts every retire of a QUEUED or FAILED batch (it passes through CLOSING,
     * even when no piece is TAKEN and it is FREE at once) */
    CHECK_EQ(ctr(&H(&r)->n_closing), 2);
    CHECK_EQ(ctr(&H(&r)->n_released), 2);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 8. give_back                                                                                */

static void test_give_back_whole(void) {
    ring r = ring_new(2, 8, 0);
    queue_ok(&r, 0, 1, 6, FL_TARGET_ANY, FL_SHARE_OFF);
    fl_take t = take_ok(&r, 1, 1, 1);
    CHECK_OK(fl_ring_set_rows(r.mem, 0, 4));
    CHECK_OK(fl_ring_set_result(r.mem, 0, FL_SLOT_F_ENDED | FL_SLOT_F_SPILLED, 77));
    CHECK_OK(fl_ring_progress(r.mem, 0, 0, 3, 1001));
    CHECK_EQ(give_back(&r, 0, 2, 1), 0); /* not worker 2's */
    CHECK_EQ(give_back(&r, 0, 1, 1), 1);
    CHECK_EQ(give_back(&r, 0, 1, 1), 0);
    fl_slot_info in = info_of(&r, 0);
    CHECK_EQ(in.rows, 6);
    CHECK_EQ(in.flags, 0);
    CHECK_EQ(in.var_bytes, 0);
    fl_piece_info pi[2];
    CHECK_EQ(pieces_of(&r, 0, pi, 2), 1);
    CHECK_EQ(pi[0].kind, FL_PIECE_FREE);
    CHECK_EQ(pi[0].done, 0);
    int pub = 1;
    CHECK_RC(fl_ring_done(r.mem, &t, 1, &pub), FL_ESTATE); /* no longer its piece */
    CHECK_RC(fl_ring_fail(r.mem, &t, 1, 0, &pub), FL_ESTATE);
    fl_take u = take_ok(&r, 2, 1, 1);
    CHECK_EQ(u.slot, 0);
    CHECK_EQ(u.piece, 0);
    CHECK_EQ(u.first, 0);
    CHECK_EQ(u.n, 6);
    CHECK_EQ(done_ok(&r, &u, 2), 1);
    uint32_t w = state_of(&r, 0);
    CHECK_EQ(ST(w), FL_SLOT_READY);
    CHECK_EQ(OWNER(w), 2);
    CHECK_EQ(info_of(&r, 0).pid, 1002);
    CHECK_EQ(give_back(&r, 0, 2, 1), 0); /* DONE pieces are not given back */
    CHECK_EQ(state_of(&r, 0), w);
    CHECK_EQ(retire(&r, 0), 1);

    /* reopen = 0: CLOSED, the batch is never READY, retire frees it */
    queue_ok(&r, 0, 2, 6, FL_TARGET_ANY, FL_SHARE_OFF);
    t = take_ok(&r, 3, 1, 1);
    CHECK_OK(fl_ring_set_result(r.mem, 0, FL_SLOT_F_SPILLED, 5));
    CHECK_EQ(give_back(&r, 0, 3, 0), 1);
    CHECK_EQ(pieces_of(&r, 0, pi, 2), 1);
    CHECK_EQ(pi[0].kind, FL_PIECE_CLOSED);
    CHECK_RC(take_rc(&r, 4, 1, 1), FL_ETIMEOUT);
    CHECK_RC(fl_ring_wait(r.mem, 0, 0, &w), FL_ETIMEOUT);
    CHECK_EQ(retire(&r, 0), 1);
    CHECK_EQ(ctr(&H(&r)->n_given_back), 2);
    ring_free(&r);
}

static void test_give_back_shared(void) {
    ring r = ring_new(1, 16, 0);
    queue_ok(&r, 0, 1, 10, FL_TARGET_ANY, FL_SHARE_ON);
    fl_take a = take_ok(&r, 1, 2, 1), b = take_ok(&r, 2, 2, 1), c = take_ok(&r, 3, 2, 1);
    CHECK_EQ(a.n, 5);
    CHECK_EQ(b.first, 5);
    CHECK_EQ(b.n, 2);
    CHECK_EQ(c.first, 7);
    CHECK_EQ(c.n, 1);
    CHECK_EQ(give_back(&r, 0, 1, 1), 1);
    /* another worker takes exactly the dead one's rows, before cutting new ones */
    fl_take d = take_ok(&r, 4, 2, 1);
    CHECK_EQ(d.piece, a.piece);
    CHECK_EQ(d.first, 0);
    CHECK_EQ(d.n, 5);
    CHECK_EQ(done_ok(&r, &b, 2), 0);
    CHECK_EQ(done_ok(&r, &d, 4), 0);
    CHECK_EQ(done_ok(&r, &c, 3), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_QUEUED);
    fl_take e = take_ok(&r, 4, 1, 1);
    CHECK_EQ(e.first, 8);
    CHECK_EQ(e.n, 2);
    CHECK_EQ(done_ok(&r, &e, 4), 1);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_READY);
    CHECK_EQ(retire(&r, 0), 1);

    /* reopen = 0 on a shared batch: never READY */
    queue_ok(&r, 0, 2, 10, FL_TARGET_ANY, FL_SHARE_ON);
    a = take_ok(&r, 1, 2, 1);
    b = take_ok(&r, 2, 1, 1);
    CHECK_EQ(give_back(&r, 0, 1, 0), 1);
    CHECK_EQ(done_ok(&r, &b, 2), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_QUEUED);
    CHECK_RC(take_rc(&r, 3, 1, 1), FL_ETIMEOUT);
    CHECK_EQ(retire(&r, 0), 1);

    /* GIVEN pieces of a dead worker: FREE for others */
    uint32_t owners[3] = {1, 1, 2};
    CHECK_OK(fl_ring_queue(r.mem, 0, 3, 0, 3, FL_TARGET_ANY, FL_SHARE_ON, owners, 3));
    CHECK_RC(take_rc(&r, 3, 1, 1), FL_ETIMEOUT);
    CHECK_EQ(give_back(&r, 0, 1, 1), 2);
    fl_take g0 = take_ok(&r, 3, 1, 1), g1 = take_ok(&r, 3, 1, 1);
    CHECK_EQ(g0.first, 0);
    CHECK_EQ(g1.first, 1);
    CHECK_RC(take_rc(&r, 3, 1, 1), FL_ETIMEOUT); /* row 2 is worker 2's */
    fl_take g2 = take_ok(&r, 2, 1, 1);
    CHECK_EQ(g2.first, 2);
    CHECK_EQ(done_ok(&r, &g0, 3) + done_ok(&r, &g2, 2) + done_ok(&r, &g1, 3), 1);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_READY);
    CHECK_EQ(retire(&r, 0), 1);

    /* GIVEN pieces closed: the batch is abandoned */
    CHECK_OK(fl_ring_queue(r.mem, 0, 4, 0, 3, FL_TARGET_ANY, FL_SHARE_ON, owners, 3));
    CHECK_EQ(give_back(&r, 0, 2, 0), 1);
    g0 = take_ok(&r, 1, 1, 1);
    g1 = take_ok(&r, 1, 1, 1);
    CHECK_RC(take_rc(&r, 1, 1, 1), FL_ETIMEOUT);
    CHECK_EQ(done_ok(&r, &g0, 1) + done_ok(&r, &g1, 1), 0);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_QUEUED);
    CHECK_EQ(retire(&r, 0), 1);

    /* a dead worker's piece below the error: reopened, its new loader settles the batch */
    queue_ok(&r, 0, 5, 4, FL_TARGET_ANY, FL_SHARE_ON);
    a = take_ok(&r, 1, 1000, 1);
    b = take_ok(&r, 2, 1000, 1);
    CHECK_EQ(fail_ok(&r, &b, 2, 1), 0);
    CHECK_EQ(give_back(&r, 0, 1, 1), 1);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_QUEUED);
    c = take_ok(&r, 3, 1000, 1);
    CHECK_EQ(c.first, 0);
    CHECK_RC(take_rc(&r, 3, 1000, 1), FL_ETIMEOUT);
    CHECK_EQ(done_ok(&r, &c, 3), 1);
    uint32_t w = state_of(&r, 0);
    CHECK_EQ(ST(w), FL_SLOT_FAILED);
    CHECK_EQ(OWNER(w), 2);
    CHECK_EQ(retire(&r, 0), 1);
    /* ... or closed: the batch cannot settle, retire frees it */
    queue_ok(&r, 0, 6, 4, FL_TARGET_ANY, FL_SHARE_ON);
    a = take_ok(&r, 1, 1000, 1);
    b = take_ok(&r, 2, 1000, 1);
    CHECK_EQ(fail_ok(&r, &b, 2, 1), 0);
    CHECK_EQ(give_back(&r, 0, 1, 0), 1);
    CHECK_RC(take_rc(&r, 3, 1000, 1), FL_ETIMEOUT);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_QUEUED);
    CHECK_EQ(retire(&r, 0), 1);
    ring_free(&r);
}

/* A worker killed between its piece's DONE (or ERRORED) CAS and the settle that follows it in
 * fl_ring_done: every piece is DONE, the state word still QUEUED. The parent gives the dead
 * worker's pieces back (none left), and fl_ring_give_back's contract says it settles the batch
 * "if that was what it waited for" (its code comments: "it may have died after its last DONE").
 * We play the dying worker by storing the DONE word ourselves. */
static void test_give_back_settles_after_death_in_done(void) {
    ring r = ring_new(1, 8, 0);
    queue_ok(&r, 0, 1, 4, FL_TARGET_ANY, FL_SHARE_ON);
    fl_take a = take_ok(&r, 1, 2, 1), b = take_ok(&r, 2, 1, 1);
    CHECK_EQ(done_ok(&r, &a, 1), 0);
    fl_atomic_u64 *pb = raw_piece(&r, 0, b.piece);
    uint64_t v = fl_atomic_load_acquire_u64(pb);
    CHECK_EQ(FL_PIECE_KIND(v), FL_PIECE_TAKEN);
    CHECK_EQ(FL_PIECE_OWNER(v), 2);
    fl_atomic_store_release_u64(pb, (v & ~(uint64_t)7) | FL_PIECE_DONE); /* ... and dies */
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_QUEUED);
    CHECK_EQ(give_back(&r, 0, 2, 1), 0);
    uint32_t w = state_of(&r, 0);
    CHECK_EQ(ST(w), FL_SLOT_READY);
    CHECK_EQ(retire(&r, 0), 1);

    /* the same with the ERRORED word of a failing row */
    queue_ok(&r, 0, 2, 1, FL_TARGET_ANY, FL_SHARE_OFF);
    a = take_ok(&r, 3, 1, 1);
    fl_slot_hdr *s = fl_ring_slot(r.mem, 0);
    fl_atomic_store_release_u64(&s->err, ((uint64_t)0 + 1) << 12 | 3);
    fl_atomic_u64 *pa = raw_piece(&r, 0, 0);
    v = fl_atomic_load_acquire_u64(pa);
    fl_atomic_store_release_u64(pa, (v & ~(uint64_t)7) | FL_PIECE_ERRORED);
    CHECK_EQ(give_back(&r, 0, 3, 1), 0);
    w = state_of(&r, 0);
    CHECK_EQ(ST(w), FL_SLOT_FAILED);
    CHECK_EQ(OWNER(w), 3);
    CHECK_EQ(retire(&r, 0), 1);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 9. stale views                                                                              */

static void test_stale_take(void) {
    ring r = ring_new(1, 8, 0);
    void *m = r.mem;
    queue_ok(&r, 0, 1, 8, FL_TARGET_ANY, FL_SHARE_ON);
    fl_take old = take_ok(&r, 1, 2, 1);
    CHECK_EQ(old.n, 4);
    CHECK_EQ(retire(&r, 0), 0);
    CHECK_EQ(give_back(&r, 0, 1, 0), 1); /* the parent took worker 1 for dead */
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_FREE);
    queue_ok(&r, 0, 2, 8, FL_TARGET_ANY, FL_SHARE_ON);
    int pub = 1;
    CHECK_RC(fl_ring_done(m, &old, 1, &pub), FL_ESTATE);
    CHECK_EQ(pub, 0);
    CHECK_RC(fl_ring_fail(m, &old, 1, 0, &pub), FL_ESTATE);
    /* the new batch is untouched by the stale calls */
    fl_piece_info pi[4];
    CHECK_EQ(pieces_of(&r, 0, pi, 4), 0);
    CHECK_EQ(info_of(&r, 0).err_row, UINT32_MAX);
    /* the same piece index in the new batch, taken by the same worker: still not the old take */
    fl_take now = take_ok(&r, 1, 2, 1);
    CHECK_EQ(now.piece, old.piece);
    assert(now.state != old.state);
    CHECK_RC(fl_ring_done(m, &old, 1, &pub), FL_ESTATE);
    CHECK_EQ(pieces_of(&r, 0, pi, 4), 1);
    CHECK_EQ(pi[0].kind, FL_PIECE_TAKEN);
    CHECK_EQ(done_ok(&r, &now, 1), 0);
    ring_free(&r);
}

/* NOTE [pieces] (generations): the one window of a stale cutter (it read entry 0 before the
 * parent's rewrite, and cuts at or past the old high-water mark) leaves a word of its old
 * generation. Current takers must not overwrite it nor count it as a piece, and the parent's
 * give_back of that (dead) worker clears it. We play the stale cutter by hand. */
static void test_stale_cut_window(void) {
    ring r = ring_new(1, 8, 0);
    fl_slot_hdr *s = fl_ring_slot(r.mem, 0);
    queue_ok(&r, 0, 1, 8, FL_TARGET_ANY, FL_SHARE_ON);
    uint32_t old_gen = GEN(state_of(&r, 0)) % 65535u + 1u;
    CHECK_EQ(retire(&r, 0), 1);
    queue_ok(&r, 0, 2, 8, FL_TARGET_ANY, FL_SHARE_ON);
    fl_take a = take_ok(&r, 2, 2, 1); /* entry 0 of the new batch */
    CHECK_EQ(a.n, 4);
    /* worker 5, from its view of the old batch, raises hw and cuts entry 1 */
    uint32_t hw = fl_atomic_load_acquire_u32(&s->hw);
    assert(hw >= 1);
    if (hw < 2) fl_atomic_store_release_u32(&s->hw, 2);
    fl_atomic_u64 *p1 = raw_piece(&r, 0, 1);
    uint64_t zero = fl_atomic_load_acquire_u64(p1);
    CHECK_EQ(zero, 0);
    uint64_t stale = FL_MAKE_PIECE(FL_PIECE_TAKEN, 5, old_gen, 0, 4);
    assert(fl_atomic_cas_acq_rel_u64(p1, &zero, stale));
    fl_piece_info pi[4];
    CHECK_EQ(pieces_of(&r, 0, pi, 4), 1); /* not a piece of this batch */
    CHECK_RC(take_rc(&r, 3, 2, 1), FL_ETIMEOUT); /* and not overwritten */
    CHECK_EQ(fl_atomic_load_acquire_u64(p1), stale);
    CHECK_EQ(give_back(&r, 0, 5, 1), 0); /* cleared, not counted */
    CHECK_EQ(fl_atomic_load_acquire_u64(p1), 0);
    fl_take b = take_ok(&r, 3, 1, 1);
    CHECK_EQ(b.piece, 1);
    CHECK_EQ(b.first, 4);
    CHECK_EQ(b.n, 4);
    CHECK_EQ(done_ok(&r, &a, 2), 0);
    CHECK_EQ(done_ok(&r, &b, 3), 1);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_READY);
    /* re-queued: every entry up to hw is rewritten, so an old take finds nothing of it */
    CHECK_EQ(retire(&r, 0), 1);
    queue_ok(&r, 0, 3, 8, FL_TARGET_ANY, FL_SHARE_ON);
    CHECK_EQ(pieces_of(&r, 0, pi, 4), 0);
    int pub = 0;
    CHECK_RC(fl_ring_done(r.mem, &b, 3, &pub), FL_ESTATE);
    fl_take c = take_ok(&r, 3, 1, 1);
    CHECK_EQ(c.piece, 0);
    CHECK_EQ(c.n, 8);
    ring_free(&r);
}

/* 16-bit generations wrap; piece generations skip 0 (a word of 0 was never written). */
static void test_generation_wraps(void) {
    ring r = ring_new(1, 4, 0);
    fl_take t;
    for (uint32_t i = 0; i < 65536u + 10u; i++) {
        uint32_t share = i % 3 == 0 ? FL_SHARE_ON : FL_SHARE_OFF;
        CHECK_OK(fl_ring_queue(r.mem, 0, i, 0, 2, FL_TARGET_ANY, share, NULL, 0));
        CHECK_OK(fl_ring_take(r.mem, i % 7, 1, 1, 1, &t));
        CHECK_EQ(t.n, 2);
        int pub = 0;
        CHECK_OK(fl_ring_done(r.mem, &t, i % 7, &pub));
        CHECK_EQ(pub, 1);
        int freed = 0;
        CHECK_OK(fl_ring_retire(r.mem, 0, &freed));
        CHECK_EQ(freed, 1);
    }
    CHECK_EQ(GEN(state_of(&r, 0)), (65536u + 10u) & 0xFFFFu);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 10. units: batches of more than 65536 rows                                                  */

static void cover_check(uint32_t count, uint32_t divisor, uint32_t min_units) {
    ring r = ring_new(1, FL_MAX_PIECES, 0);
    uint32_t unit = fl_ring_unit(count);
    queue_ok(&r, 0, 1, count, FL_TARGET_ANY, FL_SHARE_OFF);
    fl_take t = take_ok(&r, 0, divisor, min_units);
    CHECK_EQ(t.first, 0);
    CHECK_EQ(t.n, count);
    CHECK_EQ(done_ok(&r, &t, 0), 1);
    CHECK_EQ(retire(&r, 0), 1);

    queue_ok(&r, 0, 2, count, FL_TARGET_ANY, FL_SHARE_ON);
    fl_take *ts = calloc(FL_MAX_PIECES, sizeof *ts);
    assert(ts != NULL);
    uint64_t end = 0;
    uint32_t np = 0;
    while (end < count) {
        assert(np < FL_MAX_PIECES);
        ts[np] = take_ok(&r, np % 5, divisor, min_units);
        CHECK_EQ(ts[np].first, end);
        CHECK_EQ(ts[np].first % unit, 0);
        assert(ts[np].n > 0);
        if (end + ts[np].n < count) CHECK_EQ(ts[np].n % unit, 0);
        end += ts[np].n;
        np++;
    }
    CHECK_EQ(end, count);
    CHECK_RC(take_rc(&r, 0, divisor, min_units), FL_ETIMEOUT);
    fl_piece_info *pi = calloc(FL_MAX_PIECES, sizeof *pi);
    CHECK_EQ(pieces_of(&r, 0, pi, FL_MAX_PIECES), np);
    uint64_t pend = 0;
    for (uint32_t k = 0; k < np; k++) {
        CHECK_EQ(pi[k].first, pend);
        pend += pi[k].n;
    }
    CHECK_EQ(pend, count);
    for (uint32_t k = 0; k < np; k++) CHECK_EQ(done_ok(&r, &ts[k], k % 5), k + 1 == np);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_READY);
    CHECK_EQ(retire(&r, 0), 1);
    free(pi);
    free(ts);
    ring_free(&r);
}

static void test_units(void) {
    cover_check(200000, 4, 1);
    cover_check(200000, 1000, 1);
    cover_check(65537, 3, 2);
    cover_check(65536, 2, 1);
    cover_check(UINT32_MAX, 8, 1);
    /* a failing row in a batch of units of 4 rows: FAILED once its unit is settled */
    ring r = ring_new(1, 64, 0);
    queue_ok(&r, 0, 1, 200000, FL_TARGET_ANY, FL_SHARE_ON);
    fl_take a = take_ok(&r, 1, 2, 1), b = take_ok(&r, 2, 2, 1);
    CHECK_EQ(a.n, 100000);
    CHECK_EQ(b.first, 100000);
    CHECK_EQ(fail_ok(&r, &b, 2, 100001), 0);
    CHECK_EQ(info_of(&r, 0).err_row, 100001);
    CHECK_RC(take_rc(&r, 3, 2, 1), FL_ETIMEOUT);
    CHECK_EQ(done_ok(&r, &a, 1), 1);
    CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_FAILED);
    CHECK_EQ(OWNER(state_of(&r, 0)), 2);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 11. stop, bounds                                                                            */

static void test_stop_and_bounds(void) {
    ring r = ring_new(2, 8, 0);
    void *m = r.mem;
    const uint32_t bad = 2;
    uint32_t w = 0, n = 0;
    int x = 0;
    fl_take t;
    memset(&t, 0, sizeof t);
    t.n = 1;
    fl_slot_info in;
    fl_piece_info pi[1];
    CHECK_RC(fl_ring_queue(m, bad, 1, 0, 1, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0), FL_EINVAL);
    CHECK_RC(fl_ring_wait(m, bad, 0, &w), FL_EINVAL);
    CHECK_RC(fl_ring_begin_read(m, bad), FL_EINVAL);
    CHECK_RC(fl_ring_retire(m, bad, &x), FL_EINVAL);
    CHECK_RC(fl_ring_give_back(m, bad, 0, 1, &n), FL_EINVAL);
    CHECK_RC(fl_ring_slot_state(m, bad, &w), FL_EINVAL);
    CHECK_RC(fl_ring_slot_info(m, bad, &in), FL_EINVAL);
    CHECK_RC(fl_ring_pieces(m, bad, pi, 1, &n), FL_EINVAL);
    CHECK_RC(fl_ring_set_rows(m, bad, 0), FL_EINVAL);
    CHECK_RC(fl_ring_set_result(m, bad, 0, 0), FL_EINVAL);
    CHECK_RC(fl_ring_progress(m, bad, 0, 0, 0), FL_EINVAL);
    CHECK_RC(fl_ring_progress(m, 0, 8, 0, 0), FL_EINVAL);
    assert(fl_ring_slot(m, bad) == NULL);
    assert(fl_ring_slot(m, 1) != NULL);
    CHECK_RC(fl_ring_wait(m, 0, 0, NULL), FL_EINVAL);
    CHECK_RC(fl_ring_retire(m, 0, NULL), FL_EINVAL);
    CHECK_RC(fl_ring_give_back(m, 0, 0, 1, NULL), FL_EINVAL);
    CHECK_RC(fl_ring_give_back(m, 0, FL_MAX_WORKERS, 1, &n), FL_EINVAL);
    CHECK_RC(fl_ring_take(m, FL_MAX_WORKERS, 1, 1, 0, &t), FL_EINVAL);
    CHECK_RC(fl_ring_take(m, 0, 1, 1, 0, NULL), FL_EINVAL);
    CHECK_RC(fl_ring_take(NULL, 0, 1, 1, 0, &t), FL_EINVAL);
    CHECK_RC(fl_ring_pieces(m, 0, NULL, 1, &n), FL_EINVAL);
    CHECK_RC(fl_ring_slot_info(m, 0, NULL), FL_EINVAL);
    CHECK_RC(fl_ring_stop(NULL), FL_EINVAL);
    CHECK_RC(fl_ring_take(m, 0, 1, 1, 0, &t), FL_ETIMEOUT); /* empty ring: nothing, no wait */

    queue_ok(&r, 0, 1, 4, FL_TARGET_ANY, FL_SHARE_ON);
    t = take_ok(&r, 0, 2, 1);
    CHECK_RC(fl_ring_done(m, &t, FL_MAX_WORKERS, &x), FL_EINVAL);
    CHECK_RC(fl_ring_done(m, &t, 0, NULL), FL_EINVAL);
    CHECK_RC(fl_ring_done(m, &t, 1, &x), FL_ESTATE); /* another worker's piece */
    CHECK_RC(fl_ring_fail(m, &t, FL_MAX_WORKERS, 0, &x), FL_EINVAL);
    CHECK_RC(fl_ring_fail(m, &t, 0, 2, &x), FL_ERANGE);
    CHECK_RC(fl_ring_set_rows(m, 0, 5), FL_ERANGE);
    fl_take bogus = t;
    bogus.slot = bad;
    CHECK_RC(fl_ring_done(m, &bogus, 0, &x), FL_ESTATE);
    bogus = t;
    bogus.piece = 8;
    CHECK_RC(fl_ring_done(m, &bogus, 0, &x), FL_ESTATE);
    CHECK_EQ(info_of(&r, 0).err_row, UINT32_MAX); /* the refused fail left no trace */

    CHECK_EQ(fl_ring_stopped(m), 0);
    CHECK_OK(fl_ring_stop(m));
    CHECK_EQ(fl_ring_stopped(m), 1);
    CHECK_EQ(fl_ring_stopped(NULL), 1);
    CHECK_RC(take_rc(&r, 1, 2, 1), FL_ESTOPPED); /* work is left, but stopped */
    CHECK_EQ(done_ok(&r, &t, 0), 0);             /* a taken piece still finishes */
    CHECK_EQ(retire(&r, 0), 1);
    CHECK_RC(fl_ring_queue(m, 0, 2, 0, 1, FL_TARGET_ANY, FL_SHARE_OFF, NULL, 0), FL_OK);
    CHECK_RC(take_rc(&r, 1, 2, 1), FL_ESTOPPED);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* 12. the parent's wait                                                                       */

static void test_wait_timeout(void) {
    ring r = ring_new(1, 4, 0);
    queue_ok(&r, 0, 1, 1, FL_TARGET_ANY, FL_SHARE_OFF);
    uint32_t w = 0;
    int64_t t0 = fl_now_ns();
    CHECK_RC(fl_ring_wait(r.mem, 0, 50 * MS, &w), FL_ETIMEOUT);
    int64_t el = fl_now_ns() - t0;
    CHECK_EQ(ST(w), FL_SLOT_QUEUED);
    if (el < 50 * MS || el > 2000 * MS) {
        fprintf(stderr, "wait(50 ms) took %.1f ms\n", (double)el / 1e6);
        abort();
    }
    t0 = fl_now_ns();
    CHECK_RC(fl_ring_wait(r.mem, 0, -5, &w), FL_ETIMEOUT);
    CHECK_RC(fl_ring_wait(r.mem, 0, 0, &w), FL_ETIMEOUT);
    assert(fl_now_ns() - t0 < 1000 * MS);
    CHECK_EQ(fl_atomic_load_acquire_u32(&H(&r)->ready_waiters), 0);
    ring_free(&r);
}

typedef struct publisher {
    ring *r;
    long delay_ms;
    int fail;
    fl_atomic_u32 took;
} publisher;

static void *publish_later(void *arg) {
    publisher *p = arg;
    fl_take t;
    CHECK_OK(fl_ring_take(p->r->mem, 6, 1, 1, 66, &t));
    fl_atomic_store_release_u32(&p->took, 1);
    sleep_ms(p->delay_ms);
    int pub = 0;
    if (p->fail)
        CHECK_OK(fl_ring_fail(p->r->mem, &t, 6, 0, &pub));
    else
        CHECK_OK(fl_ring_done(p->r->mem, &t, 6, &pub));
    CHECK_EQ(pub, 1);
    return NULL;
}

static void test_wait_wakes_on_publish(void) {
    ring r = ring_new(1, 4, 0);
    for (int round = 0; round < 4; round++) {
        queue_ok(&r, 0, 1 + (uint64_t)round, 1, FL_TARGET_ANY, FL_SHARE_OFF);
        publisher p = {&r, round < 2 ? 100 : 5, round % 2, 0};
        pthread_t th;
        assert(pthread_create(&th, NULL, publish_later, &p) == 0);
        uint32_t w = 0;
        int64_t t0 = fl_now_ns();
        CHECK_OK(fl_ring_wait(r.mem, 0, 10000 * MS, &w));
        int64_t el = fl_now_ns() - t0;
        CHECK_EQ(ST(w), round % 2 ? FL_SLOT_FAILED : FL_SLOT_READY);
        CHECK_EQ(OWNER(w), 6);
        if (el > 3000 * MS) { /* woken by the publish, not by the 10 s timeout */
            fprintf(stderr, "wait woke %.1f ms after a publish due in %ld ms\n",
                    (double)el / 1e6, p.delay_ms);
            abort();
        }
        assert(pthread_join(th, NULL) == 0);
        CHECK_EQ(retire(&r, 0), 1);
    }
#if FL_HAVE_FUTEX
    /* the 100 ms rounds slept in the kernel, and were woken by the publisher's futex wake */
    assert(ctr(&H(&r)->n_futex_waits) >= 2);
    assert(ctr(&H(&r)->n_futex_wakes) >= 2);
#endif
    CHECK_EQ(fl_atomic_load_acquire_u32(&H(&r)->ready_waiters), 0);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* the retire/finish race (NOTE [pieces]: Dekker): threads                                     */

typedef struct racer {
    ring *r;
    uint32_t id;
    uint64_t rng;
    uint64_t dones;
} racer;

static void spin_for(uint64_t *rng, uint32_t max) {
    uint32_t n = (uint32_t)(rng_next_ext(rng) % max);
    for (volatile uint32_t i = 0; i < n; i++) {
    }
}

static void *race_worker(void *arg) {
    racer *R = arg;
    for (;;) {
        fl_take t;
        int rc = fl_ring_take(R->r->mem, R->id, 2, 1, R->id, &t);
        if (rc == FL_ESTOPPED) return NULL;
        if (rc == FL_ETIMEOUT) {
            sched_yield();
            continue;
        }
        CHECK_OK(rc);
        spin_for(&R->rng, 4000);
        int pub = 0;
        CHECK_OK(fl_ring_done(R->r->mem, &t, R->id, &pub));
        R->dones++;
    }
}

/* The parent retires a batch while its loaders finish their pieces: whatever the interleaving,
 * the slot is freed exactly once, and never while a piece is TAKEN (a retire that leaves it
 * CLOSING is followed by the last loader freeing it). */
static void test_retire_done_race(void) {
    long iters = fl_test_env_long("FL_TEST_TASKS", FL_STRESS_TASKS) / 50;
    if (iters < 2000) iters = 2000;
    ring r = ring_new(1, 8, 0);
    racer rs[2] = {{&r, 0, 11, 0}, {&r, 1, 22, 0}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) assert(pthread_create(&th[k], NULL, race_worker, &rs[k]) == 0);
    uint64_t rng = 33, closing = 0;
    for (long i = 0; i < iters; i++) {
        uint32_t share = i % 2 ? FL_SHARE_ON : FL_SHARE_OFF;
        uint64_t taken0 = ctr(&H(&r)->n_taken);
        CHECK_OK(fl_ring_queue(r.mem, 0, (uint64_t)i, 0, 2, FL_TARGET_ANY, share, NULL, 0));
        /* wait until a piece is taken (bounded), then retire at a random instant */
        int64_t end = fl_now_ns() + 10000 * MS;
        while (ctr(&H(&r)->n_taken) == taken0) {
            assert(fl_now_ns() < end);
            sched_yield();
        }
        spin_for(&rng, 1000);
        if (!retire(&r, 0)) {
            closing++;
            end = fl_now_ns() + 10000 * MS;
            while (ST(state_of(&r, 0)) != FL_SLOT_FREE) {
                if (fl_now_ns() > end) {
                    fprintf(stderr, "retire race: slot stuck in state %#x\n", state_of(&r, 0));
                    abort();
                }
                sched_yield();
            }
            CHECK_EQ(retire(&r, 0), 1);
        }
        CHECK_EQ(ST(state_of(&r, 0)), FL_SLOT_FREE);
        /* (the loader that freed it bumps n_released just after its CAS: i or i + 1) */
        uint64_t rel = ctr(&H(&r)->n_released);
        assert(rel == (uint64_t)i || rel == (uint64_t)i + 1);
    }
    CHECK_OK(fl_ring_stop(r.mem));
    for (int k = 0; k < 2; k++) assert(pthread_join(th[k], NULL) == 0);
    CHECK_EQ(ctr(&H(&r)->n_released), iters); /* freed exactly once each */
    CHECK_EQ(ctr(&H(&r)->n_taken), rs[0].dones + rs[1].dones);
    printf("# retire race: %ld batches, %llu retires left CLOSING\n", iters,
           (unsigned long long)closing);
    ring_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* stress: 1 parent thread, NW worker threads                                                  */
/* The parent queues batches of 1..MAXR rows (whole or shared, some targeted, some with given
 * rows) into NSLOTS slots, waits for them (bounded), and checks every READY batch row by row:
 * each row holds its batch's value (a slot freed while a loader still wrote, or a lost piece,
 * shows here, and to TSan as a race with the parent's poisoning of the rows before the next
 * queue), the pieces are all DONE and tile [0, count). Rows fail deterministically
 * (row_fails): a FAILED batch must report the lowest failing row. Loaders claim a shadow word
 * per row while they write it, so two live loaders of one row abort at once. The parent
 * cancels batches at random (more often while a piece loads). Workers "die" at random holding
 * a piece (some rows written): they set their dead flag and exit; the parent gives their pieces
 * back in every slot (reopen at random; a batch with a closed piece is retired) and starts a
 * replacement with the same id. A watchdog aborts after 60 s without progress, and a batch
 * QUEUED for 60 s aborts the run: a hang is a failure with a dump of the ring. */

#define NW 4
#define NSLOTS 8
#define MAXR 64 /* rows per batch at most; the payload is one uint64 per row */
#define NPIECES 16 /* piece table entries: small, so a table fills up (its last entry takes the rest) */
#define DIE_EVERY 1500 /* a worker dies once in about this many takes */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    return mix64(*s);
}

/* The payload of row `row` of batch seq (never 0: 0 is the parent's poison). */
static uint64_t row_value(uint64_t seq, uint32_t row) {
    return mix64(seq * 0x9E3779B97F4A7C15ull + row + 1) | 1;
}

/* Whether row `row` of batch seq raises (deterministic: any loader of it raises). */
static int row_fails(uint64_t seq, uint32_t row) {
    return seq % 3 == 0 && mix64(seq ^ ((uint64_t)row << 40) ^ 0x5151) % 37 == 0;
}

typedef struct stress stress;

typedef struct sworker {
    stress *S;
    uint32_t id, incarnation;
    pthread_t th;
    fl_atomic_u32 dead; /* set (release) by a worker that "dies"; then it touches nothing */
    /* the piece it held when it died (read by the parent after seeing `dead`) */
    int held;
    uint32_t held_slot, held_first, held_n;
    uint64_t rng;
    /* counters (read by the parent after joining) */
    uint64_t takes, dones, fails, published, deaths;
} sworker;

struct stress {
    ring r;
    uint64_t seed;
    sworker w[NW];
    fl_atomic_u32 shadow[NSLOTS * MAXR]; /* worker id + 1 while a loader writes that row */
    fl_atomic_u64 progress;               /* batches finished by the parent (the watchdog's) */
    fl_atomic_u32 watchdog_stop;
};

static uint64_t *payload_of(stress *S, uint32_t slot) {
    return (uint64_t *)((char *)S->r.mem + S->r.data_offset + (size_t)slot * S->r.slot_bytes);
}

static void dump_ring(stress *S) {
    for (uint32_t i = 0; i < NSLOTS; i++) {
        fl_slot_info in = info_of(&S->r, i);
        fprintf(stderr, "  slot %u: state %#x (st %u owner %u) seq %llu count %u share %u "
                        "target %u err_row %u\n",
                i, in.state, ST(in.state), OWNER(in.state), (unsigned long long)in.seq, in.count,
                in.share, in.target, in.err_row);
        fl_piece_info pi[MAXR];
        uint32_t np = pieces_of(&S->r, i, pi, MAXR);
        for (uint32_t k = 0; k < np && k < MAXR; k++)
            fprintf(stderr, "    piece %u: kind %u owner %u rows [%u, %u) done %u\n", k,
                    pi[k].kind, pi[k].owner, pi[k].first, pi[k].first + pi[k].n, pi[k].done);
    }
}

/* Claim the shadow word of a row before writing it: two live loaders of one row, or a loader
 * of an old batch still writing into a re-queued slot, meet here. */
static void shadow_claim(stress *S, uint32_t slot, uint32_t row, uint32_t me) {
    uint32_t zero = 0;
    if (!fl_atomic_cas_acq_rel_u32(&S->shadow[slot * MAXR + row], &zero, me + 1)) {
        fprintf(stderr, "stress: row %u of slot %u loaded by workers %u and %u at once\n", row,
                slot, zero - 1, me);
        abort();
    }
}

static void shadow_release(stress *S, uint32_t slot, uint32_t first, uint32_t n, uint32_t me) {
    for (uint32_t row = first; row < first + n; row++) {
        uint32_t mine = me + 1;
        if (!fl_atomic_cas_acq_rel_u32(&S->shadow[slot * MAXR + row], &mine, 0)) {
            fprintf(stderr, "stress: row %u of slot %u: shadow %u, not worker %u's\n", row, slot,
                    mine, me);
            abort();
        }
    }
}

static void *stress_worker(void *arg) {
    sworker *W = arg;
    stress *S = W->S;
    void *m = S->r.mem;
    uint32_t idle = 0;
    for (;;) {
        static const uint32_t divisors[4] = {1, 2, 4, 8};
        uint32_t divisor = divisors[rng_next(&W->rng) % 4];
        uint32_t min_units = 1 + (uint32_t)(rng_next(&W->rng) % 2);
        fl_take t;
        int rc = fl_ring_take(m, W->id, divisor, min_units, 100 * W->id + W->incarnation, &t);
        if (rc == FL_ESTOPPED) break;
        if (rc == FL_ETIMEOUT) {
            if (++idle % 16 == 0)
                sleep_ms(0), sched_yield();
            else
                sched_yield();
            continue;
        }
        CHECK_OK(rc);
        idle = 0;
        W->takes++;
        fl_slot_hdr *s = fl_ring_slot(m, t.slot);
        uint64_t seq = t.seq;
        uint32_t count = t.count;
        /* stable while our piece is TAKEN: the slot cannot be queued again before it is done */
        if (fl_atomic_load_relaxed_u64(&s->seq) != seq || fl_atomic_load_relaxed_u32(&s->count) != count ||
            t.shared != (fl_atomic_load_relaxed_u32(&s->share) == FL_SHARE_ON)) {
            fprintf(stderr, "stress: worker %u: fl_take says seq %llu count %u, the slot %llu %u\n",
                    W->id, (unsigned long long)seq, count,
                    (unsigned long long)fl_atomic_load_relaxed_u64(&s->seq), fl_atomic_load_relaxed_u32(&s->count));
            abort();
        }
        if (count > MAXR || t.first + t.n > count || t.n == 0) {
            fprintf(stderr, "stress: worker %u took rows [%u, %u) of a batch of %u\n", W->id,
                    t.first, t.first + t.n, count);
            abort();
        }
        uint32_t die_at = UINT32_MAX;
        if (rng_next(&W->rng) % DIE_EVERY == 0) die_at = (uint32_t)(rng_next(&W->rng) % (t.n + 1));
        uint64_t *pay = payload_of(S, t.slot);
        int failed = 0;
        for (uint32_t j = 0; j < t.n; j++) {
            uint32_t row = t.first + j;
            if (j == die_at) break;
            if (row_fails(seq, row)) {
                shadow_release(S, t.slot, t.first, j, W->id);
                int pub = 0;
                CHECK_OK(fl_ring_fail(m, &t, W->id, row, &pub));
                W->fails++;
                W->published += (uint64_t)pub;
                failed = 1;
                break;
            }
            shadow_claim(S, t.slot, row, W->id);
            pay[row] = row_value(seq, row);
            if ((j & 7) == 7) CHECK_OK(fl_ring_progress(m, t.slot, t.piece, j + 1, 0));
        }
        if (failed) continue;
        if (die_at != UINT32_MAX) {
            /* dies holding the piece, some of its rows written */
            W->held = 1;
            W->held_slot = t.slot;
            W->held_first = t.first;
            W->held_n = die_at;
            W->deaths++;
            fl_atomic_store_release_u32(&W->dead, 1);
            return NULL;
        }
        if (!t.shared)
            CHECK_OK(fl_ring_set_result(m, t.slot, (uint32_t)(seq & 3), seq));
        shadow_release(S, t.slot, t.first, t.n, W->id);
        int pub = 0;
        CHECK_OK(fl_ring_done(m, &t, W->id, &pub));
        W->dones++;
        W->published += (uint64_t)pub;
    }
    return NULL;
}

static void *stress_watchdog(void *arg) {
    stress *S = arg;
    uint64_t last = fl_atomic_load_acquire_u64(&S->progress);
    int64_t since = fl_now_ns();
    while (!fl_atomic_load_acquire_u32(&S->watchdog_stop)) {
        sleep_ms(20);
        uint64_t now = fl_atomic_load_acquire_u64(&S->progress);
        if (now != last) {
            last = now;
            since = fl_now_ns();
        } else if (fl_now_ns() - since > 60000 * MS) {
            fprintf(stderr, "stress: no batch finished for 60 s (after %llu); the ring:\n",
                    (unsigned long long)now);
            dump_ring(S);
            abort();
        }
    }
    return NULL;
}

static void start_worker(stress *S, uint32_t id) {
    sworker *W = &S->w[id];
    W->S = S;
    W->id = id;
    W->held = 0;
    fl_atomic_store_relaxed_u32(&W->dead, 0);
    W->rng = S->seed * 1000003u + id * 7919u + W->incarnation * 104729u;
    assert(pthread_create(&W->th, NULL, stress_worker, W) == 0);
}

typedef struct pslot {
    int busy, closing, abandon;
    uint64_t seq;
    uint32_t count, share, low_fail;
    uint64_t queued_at;
} pslot;

typedef struct stress_res {
    uint64_t batches, ready, failed, cancelled, abandoned, deaths, given_back, reopened,
        closed, ready_shared, read, timeouts;
    uint64_t retires, retires_closing; /* first retires of a batch; of those, left CLOSING */
} stress_res;

/* Worker id died: clear the shadows of the rows it held, give back its pieces everywhere,
 * and start a replacement with the same id. */
static void reap(stress *S, uint32_t id, pslot *ps, uint64_t *rng, stress_res *res, int restart) {
    sworker *W = &S->w[id];
    assert(pthread_join(W->th, NULL) == 0);
    if (W->held)
        for (uint32_t row = W->held_first; row < W->held_first + W->held_n; row++)
            fl_atomic_store_release_u32(&S->shadow[W->held_slot * MAXR + row], 0);
    for (uint32_t i = 0; i < NSLOTS; i++) {
        int reopen = (int)(rng_next(rng) % 2);
        uint32_t n = give_back(&S->r, i, id, reopen);
        res->given_back += n;
        if (n > 0 && reopen) res->reopened++;
        if (n > 0 && !reopen) {
            res->closed++;
            if (ps[i].busy && !ps[i].closing) ps[i].abandon = 1;
        }
    }
    res->deaths++;
    W->incarnation++;
    if (restart) start_worker(S, id);
}

/* The parent is done with slot i: retire it, remember whether it is CLOSING. */
static void parent_retire(stress *S, pslot *p, uint32_t i, stress_res *res) {
    int first = !p->closing;
    p->closing = 1;
    int freed = retire(&S->r, i);
    if (first) {
        res->retires++;
        res->retires_closing += (uint64_t)!freed;
    }
    if (freed) {
        p->busy = 0;
        p->closing = 0;
        fl_atomic_fetch_add_relaxed_u64(&S->progress, 1);
    }
}

static void check_ready(stress *S, pslot *p, uint32_t i, uint32_t w) {
    fl_slot_info in = info_of(&S->r, i);
    if (p->low_fail != UINT32_MAX || in.seq != p->seq || in.count != p->count ||
        in.rows != p->count || in.err_row != UINT32_MAX || in.state != w) {
        fprintf(stderr, "stress: READY batch seq %llu (slot %u) expected lowest failing row %u"
                        ": info seq %llu count %u rows %u err_row %u\n",
                (unsigned long long)p->seq, i, p->low_fail, (unsigned long long)in.seq,
                in.count, in.rows, in.err_row);
        dump_ring(S);
        abort();
    }
    if (p->share == FL_SHARE_OFF) {
        CHECK_EQ(in.flags, p->seq & 3);
        CHECK_EQ(in.var_bytes, p->seq);
    } else {
        CHECK_EQ(in.flags, 0);
    }
    /* the pieces: all DONE, covering [0, count) in order, without gaps or overlaps */
    fl_piece_info pi[MAXR];
    uint32_t np = pieces_of(&S->r, i, pi, MAXR), end = 0;
    assert(np >= 1 && np <= MAXR);
    for (uint32_t k = 0; k < np; k++) {
        if (pi[k].kind != FL_PIECE_DONE || pi[k].first != end) {
            fprintf(stderr, "stress: READY batch seq %llu: piece %u kind %u rows [%u, %u), "
                            "expected DONE from row %u\n",
                    (unsigned long long)p->seq, k, pi[k].kind, pi[k].first,
                    pi[k].first + pi[k].n, end);
            dump_ring(S);
            abort();
        }
        end += pi[k].n;
    }
    CHECK_EQ(end, p->count);
    if (np == 1) CHECK_EQ(OWNER(w), pi[0].owner);
    assert(OWNER(w) < NW);
    const uint64_t *pay = payload_of(S, i);
    for (uint32_t row = 0; row < p->count; row++) {
        if (pay[row] != row_value(p->seq, row) ||
            fl_atomic_load_acquire_u32(&S->shadow[i * MAXR + row]) != 0) {
            fprintf(stderr, "stress: READY batch seq %llu (slot %u): row %u holds %#llx, "
                            "expected %#llx (shadow %u)\n",
                    (unsigned long long)p->seq, i, row, (unsigned long long)pay[row],
                    (unsigned long long)row_value(p->seq, row),
                    fl_atomic_load_acquire_u32(&S->shadow[i * MAXR + row]));
            dump_ring(S);
            abort();
        }
    }
}

static void check_failed(stress *S, pslot *p, uint32_t i, uint32_t w) {
    fl_slot_info in = info_of(&S->r, i);
    if (in.err_row != p->low_fail || in.err_owner != OWNER(w) || in.seq != p->seq ||
        in.err_owner >= NW) {
        fprintf(stderr, "stress: FAILED batch seq %llu (slot %u): err_row %u owner %u (state "
                        "owner %u), expected lowest failing row %u\n",
                (unsigned long long)p->seq, i, in.err_row, in.err_owner, OWNER(w),
                p->low_fail);
        dump_ring(S);
        abort();
    }
}

static void test_stress(void) {
    long tasks = fl_test_env_long("FL_TEST_TASKS", FL_STRESS_TASKS);
    uint64_t nbatches = (uint64_t)tasks / STRESS_TASKS_PER_BATCH;
    if (nbatches < 100) nbatches = 100;
    stress *S = calloc(1, sizeof *S);
    assert(S != NULL);
    S->seed = (uint64_t)fl_test_env_long("FL_TEST_SEED", 20240601);
    S->r = ring_new(NSLOTS, NPIECES, MAXR * sizeof(uint64_t));
    void *m = S->r.mem;
    memset((char *)m + S->r.data_offset, 0, NSLOTS * MAXR * sizeof(uint64_t));
    pthread_t wd;
    assert(pthread_create(&wd, NULL, stress_watchdog, S) == 0);
    for (uint32_t id = 0; id < NW; id++) start_worker(S, id);

    pslot ps[NSLOTS];
    memset(ps, 0, sizeof ps);
    stress_res res;
    memset(&res, 0, sizeof res);
    uint64_t rng = S->seed ^ 0xA5A5A5A5ull, next_seq = 1;
    int64_t t0 = fl_now_ns();
    for (;;) {
        for (uint32_t id = 0; id < NW; id++)
            if (fl_atomic_load_acquire_u32(&S->w[id].dead)) reap(S, id, ps, &rng, &res, 1);
        int busy = 0;
        uint32_t oldest = UINT32_MAX;
        for (uint32_t i = 0; i < NSLOTS; i++) {
            pslot *p = &ps[i];
            if (!p->busy && next_seq <= nbatches) {
                /* queue a new batch: poison its rows first (a late writer would show) */
                uint64_t *pay = payload_of(S, i);
                for (uint32_t row = 0; row < MAXR; row++) pay[row] = 0;
                uint64_t x = rng_next(&rng);
                p->seq = next_seq++;
                p->count = 1 + (uint32_t)(x % MAXR);
                p->share = (x >> 8) % 2 ? FL_SHARE_ON : FL_SHARE_OFF;
                uint32_t target = (x >> 12) % 8 == 0 ? (uint32_t)((x >> 16) % NW) : FL_TARGET_ANY;
                uint32_t owners[4], nowners = 0;
                /* given rows only with target ANY (a row given to a worker the target
                 * excludes could never be taken) */
                if (p->share == FL_SHARE_ON && target == FL_TARGET_ANY && (x >> 20) % 3 == 0) {
                    nowners = 1 + (uint32_t)((x >> 24) % 4);
                    if (nowners > p->count) nowners = p->count;
                    for (uint32_t k = 0; k < nowners; k++) {
                        uint32_t o = (uint32_t)((x >> (28 + 3 * k)) % (NW + 1));
                        owners[k] = o == NW ? FL_TARGET_ANY : o;
                    }
                }
                p->low_fail = UINT32_MAX;
                for (uint32_t row = 0; row < p->count; row++)
                    if (row_fails(p->seq, row)) {
                        p->low_fail = row;
                        break;
                    }
                CHECK_OK(fl_ring_queue(m, i, p->seq, p->seq / 64, p->count, target, p->share,
                                       owners, nowners));
                p->busy = 1;
                p->closing = p->abandon = 0;
                p->queued_at = (uint64_t)fl_now_ns();
                res.batches++;
            }
            if (!p->busy) continue;
            busy = 1;
            if (p->closing || p->abandon) {
                if (p->abandon && !p->closing) res.abandoned++;
                p->abandon = 0;
                parent_retire(S, p, i, &res);
                continue;
            }
            if (oldest == UINT32_MAX || p->seq < ps[oldest].seq) oldest = i;
        }
        if (!busy) break;
        /* wait (bounded) on the oldest batch, look at every slot without waiting */
        for (uint32_t i = 0; i < NSLOTS; i++) {
            pslot *p = &ps[i];
            if (!p->busy || p->closing || p->abandon) continue;
            uint32_t w = 0;
            int rc = fl_ring_wait(m, i, i == oldest ? 2 * MS : 0, &w);
            if (rc == FL_ETIMEOUT) {
                CHECK_EQ(ST(w), FL_SLOT_QUEUED);
                if (i == oldest) res.timeouts++;
                if ((uint64_t)fl_now_ns() - p->queued_at > 60000 * (uint64_t)MS) {
                    fprintf(stderr, "stress: batch seq %llu (slot %u) QUEUED for 60 s\n",
                            (unsigned long long)p->seq, i);
                    dump_ring(S);
                    abort();
                }
                fl_piece_info pi[2];
                uint32_t np = pieces_of(&S->r, i, pi, 2);
                int loading = np > 0 && pi[0].kind == FL_PIECE_TAKEN;
                /* cancel it, pieces in flight or not (more often while a piece loads) */
                if (rng_next(&rng) % (loading ? 20 : 400) == 0) {
                    res.cancelled++;
                    parent_retire(S, p, i, &res);
                }
                continue;
            }
            CHECK_OK(rc);
            if (ST(w) == FL_SLOT_READY) {
                check_ready(S, p, i, w);
                res.ready++;
                if (p->share == FL_SHARE_ON) res.ready_shared++;
                if (rng_next(&rng) % 2) {
                    CHECK_OK(fl_ring_begin_read(m, i));
                    res.read++;
                }
                parent_retire(S, p, i, &res);
                if (p->busy) {
                    fprintf(stderr, "stress: READY batch seq %llu not freed by retire\n",
                            (unsigned long long)p->seq);
                    abort();
                }
            } else if (ST(w) == FL_SLOT_FAILED) {
                check_failed(S, p, i, w);
                res.failed++;
                parent_retire(S, p, i, &res);
            } else {
                fprintf(stderr, "stress: slot %u (seq %llu) in state %u the parent never set\n",
                        i, (unsigned long long)p->seq, ST(w));
                dump_ring(S);
                abort();
            }
        }
    }
    /* stop the workers; a worker that died meanwhile is reaped (not restarted) */
    CHECK_OK(fl_ring_stop(m));
    for (uint32_t id = 0; id < NW; id++) {
        if (fl_atomic_load_acquire_u32(&S->w[id].dead))
            reap(S, id, ps, &rng, &res, 0);
        else
            assert(pthread_join(S->w[id].th, NULL) == 0);
    }
    fl_atomic_store_release_u32(&S->watchdog_stop, 1);
    assert(pthread_join(wd, NULL) == 0);
    double secs = (double)(fl_now_ns() - t0) / 1e9;

    /* every slot FREE, nothing TAKEN, counters consistent */
    uint64_t takes = 0, published = 0;
    for (uint32_t id = 0; id < NW; id++) {
        takes += S->w[id].takes;
        published += S->w[id].published;
    }
    for (uint32_t i = 0; i < NSLOTS; i++) {
        CHECK_EQ(ST(state_of(&S->r, i)), FL_SLOT_FREE);
        CHECK_EQ(retire(&S->r, i), 1);
    }
    for (uint32_t k = 0; k < NSLOTS * MAXR; k++) CHECK_EQ(fl_atomic_load_acquire_u32(&S->shadow[k]), 0);
    fl_header *h = H(&S->r);
    CHECK_EQ(ctr(&h->n_queued), res.batches);
    CHECK_EQ(ctr(&h->n_released), res.batches); /* each batch freed exactly once */
    CHECK_EQ(ctr(&h->n_taken), takes);
    CHECK_EQ(ctr(&h->n_given_back), res.given_back);
    assert(ctr(&h->n_published) >= res.ready + res.failed);
    assert(ctr(&h->n_published) >= published);
    assert(ctr(&h->n_published) <= res.batches);
    CHECK_EQ(res.ready + res.failed + res.cancelled + res.abandoned >= res.batches, 1);
    CHECK_EQ(fl_atomic_load_acquire_u32(&h->ready_waiters), 0);
    printf("# stress: %llu batches in %.2f s: %llu ready (%llu shared, %llu read), %llu failed, "
           "%llu cancelled, %llu abandoned; %llu deaths, %llu pieces given back (%llu slots "
           "reopened, %llu closed); %llu takes, %llu futex waits, %llu wait timeouts; "
           "%llu of %llu retires left CLOSING\n",
           (unsigned long long)res.batches, secs, (unsigned long long)res.ready,
           (unsigned long long)res.ready_shared, (unsigned long long)res.read,
           (unsigned long long)res.failed, (unsigned long long)res.cancelled,
           (unsigned long long)res.abandoned, (unsigned long long)res.deaths,
           (unsigned long long)res.given_back, (unsigned long long)res.reopened,
           (unsigned long long)res.closed, (unsigned long long)takes,
           (unsigned long long)ctr(&h->n_futex_waits), (unsigned long long)res.timeouts,
           (unsigned long long)res.retires_closing, (unsigned long long)res.retires);
    /* every path of the run was exercised (so the checks above checked something) */
    if (res.batches >= 20000) {
        assert(res.ready_shared > 0 && res.ready > res.ready_shared && res.failed > 0);
        assert(res.cancelled > 0 && res.deaths > 0 && res.reopened > 0 && res.closed > 0);
    }
    if (res.batches >= 100000) /* (timing-dependent: only in the long runs) */
        assert(res.retires_closing > 0); /* retired while a loader held a piece */
    ring_free(&S->r);
    free(S);
}

/* ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    static const fl_test_case tests[] = {
        FL_TEST(test_nbytes),
        FL_TEST(test_init_validation),
        FL_TEST(test_attach),
        FL_TEST(test_whole_batch_cycle),
        FL_TEST(test_take_order),
        FL_TEST(test_shared_guided_pieces),
        FL_TEST(test_shared_help_order),
        FL_TEST(test_given_rows),
        FL_TEST(test_target),
        FL_TEST(test_fail_high_then_low),
        FL_TEST(test_fail_low_then_high),
        FL_TEST(test_fail_whole_and_first_row),
        FL_TEST(test_retire_queued),
        FL_TEST(test_give_back_whole),
        FL_TEST(test_give_back_shared),
        FL_TEST(test_give_back_settles_after_death_in_done),
        FL_TEST(test_stale_take),
        FL_TEST(test_stale_cut_window),
        FL_TEST(test_generation_wraps),
        FL_TEST(test_units),
        FL_TEST(test_stop_and_bounds),
        FL_TEST(test_wait_timeout),
        FL_TEST(test_wait_wakes_on_publish),
        FL_TEST(test_retire_done_race),
        FL_TEST(test_stress),
    };
#if FL_HAVE_FUTEX
    const char *suite = "test_ring";
#else
    const char *suite = "test_ring[portable-wait]";
#endif
    return fl_test_main(suite, tests, sizeof tests / sizeof tests[0], argc, argv);
}
