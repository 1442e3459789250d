/* test_bell.c: tests of the pool's doorbell (fl_bell.h) — argument validation, the counter and
 * its timeouts, wake-ups across threads, stop, and no-lost-wake-up stress runs of the protocol in
 * fl_bell.h (producers queue a task and ring; consumers read the counter, look for a task, and
 * sleep on the counter if there is none), with threads and with processes over a shared mapping.
 *
 * Build and run through the Makefile in this directory. Knobs:
 *   FL_TEST_TASKS=n   tasks of the thread stress runs (default FL_BELL_STRESS_TASKS, 200,000,
 *                     spread over five runs); the process stress runs use n / 2 in all
 *   FL_TEST_SEED=n    seed of the producers' random delays */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fl_bell.h"
#include "fl_status.h"
#include "fl_wait.h"
#include "fl_test.h"

#ifndef FL_BELL_STRESS_TASKS
#define FL_BELL_STRESS_TASKS 200000L
#endif

#define MS (1000000LL) /* nanoseconds */

/* ---------------------------------------------------------------------------------------- */
/* helpers                                                                                    */

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* aligned_alloc needs a size that is a multiple of the alignment (ASan checks it). */
static void *xalloc(size_t n) {
    void *p = aligned_alloc(FL_CACHELINE, round_up(n ? n : 1, FL_CACHELINE));
    assert(p != NULL);
    return p;
}

/* A bell over dirty memory (init must not rely on zeroed pages). */
static fl_bell *bell_new(void) {
    void *m = xalloc(sizeof(fl_bell));
    memset(m, 0xCD, sizeof(fl_bell));
    assert(fl_bell_init(m, sizeof(fl_bell)) == FL_OK);
    assert(fl_bell_attach(m, sizeof(fl_bell)) == FL_OK);
    return (fl_bell *)m;
}

typedef struct stats {
    uint64_t rings, wakes, waits;
} stats;

static stats stats_of(const fl_bell *b) {
    stats s = {99, 99, 99};
    assert(fl_bell_stats(b, &s.rings, &s.wakes, &s.waits) == FL_OK);
    return s;
}

static uint32_t waiters_of(const fl_bell *b) { return fl_atomic_load_acquire_u32(&b->waiters); }

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static double ms_since(int64_t t0) { return (double)(fl_now_ns() - t0) / 1e6; }

/* Poll until the bell has at least `want` announced waiters and `want_waits` sleeps have
 * reached the sleeping call (or the backoff loop), at most timeout_ms; then give the sleepers a
 * moment to get into the kernel. */
static void await_sleepers(const fl_bell *b, uint32_t want, uint64_t want_waits, long timeout_ms) {
    int64_t end = fl_now_ns() + timeout_ms * MS;
    while (waiters_of(b) < want || stats_of(b).waits < want_waits) {
        assert(fl_now_ns() < end);
        sleep_ms(1);
    }
    sleep_ms(30);
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* A sleeper thread: one fl_bell_wait, with the time it returned. */
typedef struct sleeper {
    fl_bell *b;
    uint32_t seen;
    int64_t timeout_ns;
    int rc;
    int64_t t_return;
    fl_atomic_u32 done;
} sleeper;

static void *sleeper_main(void *arg) {
    sleeper *s = arg;
    s->rc = fl_bell_wait(s->b, s->seen, s->timeout_ns);
    s->t_return = fl_now_ns();
    fl_atomic_store_release_u32(&s->done, 1);
    return NULL;
}

static void sleeper_start(sleeper *s, pthread_t *th, fl_bell *b, uint32_t seen, int64_t timeout_ns) {
    *s = (sleeper){.b = b, .seen = seen, .timeout_ns = timeout_ns, .rc = 12345};
    assert(pthread_create(th, NULL, sleeper_main, s) == 0);
}

static unsigned count_done(sleeper *s, int n) {
    unsigned k = 0;
    for (int i = 0; i < n; i++) k += fl_atomic_load_acquire_u32(&s[i].done);
    return k;
}

/* ---------------------------------------------------------------------------------------- */
/* layout, init, attach, bad pointers                                                         */

static void test_layout(void) {
    assert(sizeof(fl_bell) == 128);
    assert(sizeof(fl_bell) == FL_CACHELINE);
    assert(fl_bell_nbytes() == sizeof(fl_bell));
    assert(fl_bell_nbytes() == 128);
    /* the futex word is 4-byte aligned, the 64-bit counters 8-byte aligned */
    assert(offsetof(fl_bell, counter) % 4 == 0);
    assert(offsetof(fl_bell, n_rings) % 8 == 0 && offsetof(fl_bell, n_wakes) % 8 == 0 &&
           offsetof(fl_bell, n_waits) % 8 == 0);
    assert(FL_BELL_MAGIC == 0x6c6c6562u); /* "bell" in little-endian byte order */
}

static void test_init_attach(void) {
    const size_t cap = 1024;
    unsigned char *mem = xalloc(cap);
    memset(mem, 0xAB, cap);
    /* null, misaligned and too-small buffers */
    assert(fl_bell_init(NULL, cap) == FL_EINVAL);
    assert(fl_bell_init(mem + 1, cap - 8) == FL_EINVAL);
    assert(fl_bell_init(mem + 4, cap - 8) == FL_EINVAL);
    assert(fl_bell_init(mem + 7, cap - 8) == FL_EINVAL);
    assert(fl_bell_init(mem, 0) == FL_EINVAL);
    assert(fl_bell_init(mem, sizeof(fl_bell) - 1) == FL_EINVAL);
    assert(fl_bell_init(mem, 1) == FL_EINVAL);
    assert(fl_bell_attach(NULL, cap) == FL_EINVAL);
    assert(fl_bell_attach(mem + 1, cap - 8) == FL_EINVAL);
    assert(fl_bell_attach(mem + 4, cap - 8) == FL_EINVAL);
    assert(fl_bell_attach(mem, 0) == FL_EINVAL);
    assert(fl_bell_attach(mem, sizeof(fl_bell) - 1) == FL_EINVAL);
    /* never formatted (dirty, and zeroed) */
    assert(fl_bell_attach(mem, cap) == FL_ELAYOUT);
    assert(fl_bell_attach(mem + 8, cap - 8) == FL_ELAYOUT);
    /* no failing call wrote anything */
    for (size_t i = 0; i < cap; i++) assert(mem[i] == 0xAB);
    memset(mem, 0, cap);
    assert(fl_bell_attach(mem, cap) == FL_ELAYOUT);
    assert(fl_bell_attach(mem, sizeof(fl_bell)) == FL_ELAYOUT);

    /* exact fit over dirty memory: every field starts at zero, nothing past the bell is written */
    memset(mem, 0xAB, cap);
    assert(fl_bell_init(mem, sizeof(fl_bell)) == FL_OK);
    for (size_t i = sizeof(fl_bell); i < cap; i++) assert(mem[i] == 0xAB);
    const fl_bell *b = (const fl_bell *)mem;
    assert(b->magic == FL_BELL_MAGIC);
    assert(b->counter == 0 && b->waiters == 0 && b->stop == 0);
    assert(b->n_rings == 0 && b->n_wakes == 0 && b->n_waits == 0);
    for (size_t i = 40; i < sizeof(fl_bell); i++) assert(mem[i] == 0); /* padding too */
    assert(fl_bell_attach(mem, sizeof(fl_bell)) == FL_OK);
    assert(fl_bell_attach(mem, cap) == FL_OK); /* a bigger mapping is fine */
    assert(fl_bell_attach(mem, sizeof(fl_bell) - 1) == FL_EINVAL);
    assert(fl_bell_value(mem) == 0);
    /* 8-byte alignment is enough (not a whole cache line) */
    assert(fl_bell_init(mem + 8 * 3, cap - 24) == FL_OK);
    assert(fl_bell_attach(mem + 8 * 3, sizeof(fl_bell)) == FL_OK);
    assert(fl_bell_ring(mem + 8 * 3, 0) == FL_OK && fl_bell_value(mem + 8 * 3) == 1);

    /* every byte of the magic matters */
    assert(fl_bell_init(mem, cap) == FL_OK);
    for (int i = 0; i < 4; i++) {
        mem[i] ^= 0x20;
        assert(fl_bell_attach(mem, cap) == FL_ELAYOUT);
        mem[i] ^= 0x20;
        assert(fl_bell_attach(mem, cap) == FL_OK);
    }
    /* re-init resets a used bell (counter, stop flag, counters) */
    assert(fl_bell_ring(mem, 0) == FL_OK && fl_bell_ring(mem, 1) == FL_OK);
    assert(fl_bell_stop(mem) == FL_OK);
    assert(fl_bell_value(mem) == 3);
    assert(fl_bell_init(mem, cap) == FL_OK);
    assert(fl_bell_value(mem) == 0);
    assert(fl_bell_wait(mem, 0, 0) == FL_ETIMEOUT); /* not stopped any more */
    stats s = stats_of((fl_bell *)mem);
    assert(s.rings == 0 && s.wakes == 0 && s.waits == 0);
    free(mem);
}

static void test_bad_pointers(void) {
    unsigned char *mem = xalloc(512);
    memset(mem, 0, 512);
    assert(fl_bell_init(mem, 512) == FL_OK);
    for (int i = 0; i < 5; i++) assert(fl_bell_ring(mem, 0) == FL_OK);
    assert(fl_bell_value(mem) == 5);
    unsigned char *unformatted = mem + 256;
    void *bad[] = {NULL, mem + 1, mem + 4, unformatted};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        uint64_t r = 7, w = 7, x = 7;
        assert(fl_bell_value(bad[k]) == 0);
        assert(fl_bell_ring(bad[k], 0) == FL_EINVAL);
        assert(fl_bell_ring(bad[k], 1) == FL_EINVAL);
        assert(fl_bell_wait(bad[k], 0, 0) == FL_EINVAL);
        assert(fl_bell_wait(bad[k], 0, 1000 * MS) == FL_EINVAL); /* at once, no sleep */
        assert(fl_bell_stop(bad[k]) == FL_EINVAL);
        assert(fl_bell_stats(bad[k], &r, &w, &x) == FL_EINVAL);
        assert(r == 7 && w == 7 && x == 7);
    }
    for (size_t i = 256; i < 512; i++) assert(mem[i] == 0); /* nothing wrote there */
    /* a bell whose magic was overwritten reads as 0 and refuses everything */
    mem[0] ^= 1;
    assert(fl_bell_value(mem) == 0);
    assert(fl_bell_ring(mem, 0) == FL_EINVAL);
    assert(fl_bell_wait(mem, 5, 0) == FL_EINVAL);
    mem[0] ^= 1;
    assert(fl_bell_value(mem) == 5);
    /* stats needs all three outputs */
    uint64_t r, w, x;
    assert(fl_bell_stats(mem, NULL, &w, &x) == FL_EINVAL);
    assert(fl_bell_stats(mem, &r, NULL, &x) == FL_EINVAL);
    assert(fl_bell_stats(mem, &r, &w, NULL) == FL_EINVAL);
    assert(fl_bell_stats(mem, &r, &w, &x) == FL_OK && r == 5 && w == 0 && x == 0);
    free(mem);
}

/* ---------------------------------------------------------------------------------------- */
/* the counter, waits that return at once, timeouts                                           */

static void test_counter_and_wait_at_once(void) {
    fl_bell *b = bell_new();
    assert(fl_bell_value(b) == 0);
    for (uint32_t i = 1; i <= 100; i++) {
        assert(fl_bell_ring(b, (int)(i & 1)) == FL_OK);
        assert(fl_bell_value(b) == i);
    }
    /* the counter differs from `seen`: FL_OK at once, whatever the timeout, and no sleep */
    int64_t t0 = fl_now_ns();
    assert(fl_bell_wait(b, 99, 5000 * MS) == FL_OK);
    assert(fl_bell_wait(b, 0, 5000 * MS) == FL_OK);
    assert(fl_bell_wait(b, 101, INT64_MAX) == FL_OK);
    assert(fl_bell_wait(b, 99, 0) == FL_OK);
    assert(fl_bell_wait(b, 99, -1) == FL_OK);
    assert(fl_bell_wait(b, 99, INT64_MIN) == FL_OK);
    assert(ms_since(t0) < 100.0);
    stats s = stats_of(b);
    assert(s.rings == 100 && s.wakes == 0 && s.waits == 0);
    assert(waiters_of(b) == 0);
    /* the counter wraps, and a wait across the wrap still sees the change */
    fl_atomic_store_release_u32(&b->counter, UINT32_MAX);
    assert(fl_bell_value(b) == UINT32_MAX);
    assert(fl_bell_ring(b, 0) == FL_OK);
    assert(fl_bell_value(b) == 0);
    assert(fl_bell_wait(b, UINT32_MAX, 5000 * MS) == FL_OK);
    assert(fl_bell_wait(b, 0, 0) == FL_ETIMEOUT);
    free(b);
}

static void test_wait_timeout(void) {
    fl_bell *b = bell_new();
    assert(fl_bell_ring(b, 0) == FL_OK);
    uint32_t v = fl_bell_value(b);
    /* zero and negative timeouts: one look, no sleep */
    int64_t t0 = fl_now_ns();
    assert(fl_bell_wait(b, v, 0) == FL_ETIMEOUT);
    assert(fl_bell_wait(b, v, -1) == FL_ETIMEOUT);
    assert(fl_bell_wait(b, v, -5000 * MS) == FL_ETIMEOUT);
    assert(fl_bell_wait(b, v, INT64_MIN) == FL_ETIMEOUT);
    assert(ms_since(t0) < 50.0);
    assert(stats_of(b).waits == 0);
    /* a tiny timeout sleeps at most a tiny bit */
    t0 = fl_now_ns();
    assert(fl_bell_wait(b, v, 1) == FL_ETIMEOUT);
    assert(fl_bell_wait(b, v, 1000) == FL_ETIMEOUT);
    assert(ms_since(t0) < 100.0);
    /* bounded waits: never before the timeout, and not much after */
    const int64_t timeouts_ms[] = {1, 20, 100, 250};
    for (size_t i = 0; i < sizeof timeouts_ms / sizeof timeouts_ms[0]; i++) {
        uint64_t waits = stats_of(b).waits;
        t0 = fl_now_ns();
        assert(fl_bell_wait(b, v, timeouts_ms[i] * MS) == FL_ETIMEOUT);
        double el = ms_since(t0);
        printf("  wait(%lld ms) on a silent bell returned after %.2f ms\n",
               (long long)timeouts_ms[i], el);
        assert(el >= (double)timeouts_ms[i]);
        assert(el < (double)timeouts_ms[i] + 500.0);
        /* it slept once (one kernel wait, or one backoff loop), rather than spinning */
        assert(stats_of(b).waits == waits + 1);
        assert(waiters_of(b) == 0);
    }
    assert(fl_bell_value(b) == v);
    assert(stats_of(b).rings == 1 && stats_of(b).wakes == 0);
    free(b);
}

/* A huge timeout saturates instead of overflowing now + timeout (UBSan would abort), and the
 * sleeper still wakes when rung. */
static void test_huge_timeout(void) {
    fl_bell *b = bell_new();
    enum { NT = 4 };
    sleeper s[NT];
    pthread_t th[NT];
    const int64_t near = INT64_MAX - fl_now_ns() + 1000; /* overflows by a hair */
    const int64_t t[NT] = {INT64_MAX, INT64_MAX - 1, near, INT64_MAX / 2};
    uint32_t v = fl_bell_value(b);
    for (int i = 0; i < NT; i++) sleeper_start(&s[i], &th[i], b, v, t[i]);
    await_sleepers(b, NT, NT, 5000);
    assert(count_done(s, NT) == 0); /* none of them mistook the timeout for an expired one */
    int64_t t_ring = fl_now_ns();
    assert(fl_bell_ring(b, 1) == FL_OK);
    for (int i = 0; i < NT; i++) {
        assert(pthread_join(th[i], NULL) == 0);
        assert(s[i].rc == FL_OK);
        assert((double)(s[i].t_return - t_ring) / 1e6 < 1000.0);
    }
    assert(waiters_of(b) == 0);
    /* and the same once more, woken by stop */
    v = fl_bell_value(b);
    uint64_t waits = stats_of(b).waits;
    for (int i = 0; i < NT; i++) sleeper_start(&s[i], &th[i], b, v, t[i]);
    await_sleepers(b, NT, waits + NT, 5000);
    assert(fl_bell_stop(b) == FL_OK);
    for (int i = 0; i < NT; i++) {
        assert(pthread_join(th[i], NULL) == 0);
        assert(s[i].rc == FL_ESTOPPED);
    }
    free(b);
}

/* ---------------------------------------------------------------------------------------- */
/* ring, stop                                                                                 */

static void test_ring_wakes_sleeper(void) {
    fl_bell *b = bell_new();
    double worst = 0;
    for (int round = 0; round < 5; round++) {
        stats before = stats_of(b);
        uint32_t v = fl_bell_value(b);
        sleeper s;
        pthread_t th;
        sleeper_start(&s, &th, b, v, 10000 * MS);
        await_sleepers(b, 1, before.waits + 1, 5000);
        assert(fl_atomic_load_acquire_u32(&s.done) == 0);
        int64_t t_ring = fl_now_ns();
        assert(fl_bell_ring(b, round & 1) == FL_OK);
        assert(pthread_join(th, NULL) == 0);
        assert(s.rc == FL_OK);
        double lat = (double)(s.t_return - t_ring) / 1e6;
        if (lat > worst) worst = lat;
        assert(lat < 200.0); /* well under the 10 s timeout */
        stats after = stats_of(b);
        assert(after.rings == before.rings + 1);
        assert(after.wakes == before.wakes + 1); /* it saw the sleeper and woke it */
        assert(after.waits == before.waits + 1);
        assert(waiters_of(b) == 0);
        assert(fl_bell_value(b) == v + 1);
    }
    printf("  a sleeping wait returned at most %.2f ms after the ring\n", worst);
    free(b);
}

static void test_ring_without_waiters_no_syscall(void) {
    fl_bell *b = bell_new();
    for (int i = 0; i < 1000; i++) assert(fl_bell_ring(b, i & 1) == FL_OK);
    stats s = stats_of(b);
    assert(s.rings == 1000 && s.wakes == 0 && s.waits == 0);
    assert(fl_bell_value(b) == 1000);
    /* a waiter that came and went (timed out) leaves no trace: still no wake-up calls */
    assert(fl_bell_wait(b, 1000, 5 * MS) == FL_ETIMEOUT);
    assert(waiters_of(b) == 0);
    for (int i = 0; i < 1000; i++) assert(fl_bell_ring(b, 0) == FL_OK);
    s = stats_of(b);
    assert(s.rings == 2000 && s.wakes == 0 && s.waits == 1);
    free(b);
}

/* ring(0) wakes one sleeper (futex build; the portable build's sleepers poll the counter and all
 * notice), ring(1) wakes all. */
static void test_wake_one_and_all(void) {
    fl_bell *b = bell_new();
    enum { NT = 3 };
    sleeper s[NT];
    pthread_t th[NT];
    uint32_t v = fl_bell_value(b);
    for (int i = 0; i < NT; i++) sleeper_start(&s[i], &th[i], b, v, 20000 * MS);
    await_sleepers(b, NT, NT, 5000);
    assert(count_done(s, NT) == 0);
    assert(fl_bell_ring(b, 0) == FL_OK);
    int64_t end = fl_now_ns() + 2000 * MS;
    while (count_done(s, NT) < 1 && fl_now_ns() < end) sleep_ms(1);
    sleep_ms(100);
#if FL_HAVE_FUTEX
    assert(count_done(s, NT) == 1);
    assert(waiters_of(b) == NT - 1);
#else
    assert(count_done(s, NT) == NT);
#endif
    int64_t t_ring = fl_now_ns();
    assert(fl_bell_ring(b, 1) == FL_OK);
    for (int i = 0; i < NT; i++) {
        assert(pthread_join(th[i], NULL) == 0);
        assert(s[i].rc == FL_OK);
        assert((double)(s[i].t_return - t_ring) / 1e6 < 1000.0);
    }
    assert(waiters_of(b) == 0);
    stats st = stats_of(b);
#if FL_HAVE_FUTEX
    assert(st.rings == 2 && st.wakes == 2 && st.waits == NT);
#else
    assert(st.rings == 2 && st.wakes == 1 && st.waits == NT);
#endif
    free(b);
}

static void test_stop(void) {
    fl_bell *b = bell_new();
    enum { NT = 4 };
    sleeper s[NT];
    pthread_t th[NT];
    uint32_t v = fl_bell_value(b);
    for (int i = 0; i < NT; i++) sleeper_start(&s[i], &th[i], b, v, 10000 * MS);
    await_sleepers(b, NT, NT, 5000);
    assert(count_done(s, NT) == 0);
    int64_t t_stop = fl_now_ns();
    assert(fl_bell_stop(b) == FL_OK);
    for (int i = 0; i < NT; i++) {
        assert(pthread_join(th[i], NULL) == 0);
        assert(s[i].rc == FL_ESTOPPED);
        double lat = (double)(s[i].t_return - t_stop) / 1e6;
        printf("  sleeping wait %d returned %.2f ms after stop\n", i, lat);
        assert(lat < 1000.0);
    }
    assert(waiters_of(b) == 0);
    assert(fl_bell_value(b) != v); /* stop moves the counter (that is how sleepers notice) */
    /* every later wait refuses at once, whatever it saw and whatever its timeout */
    int64_t t0 = fl_now_ns();
    uint32_t now = fl_bell_value(b);
    assert(fl_bell_wait(b, now, 5000 * MS) == FL_ESTOPPED);
    assert(fl_bell_wait(b, now, INT64_MAX) == FL_ESTOPPED);
    assert(fl_bell_wait(b, now, 0) == FL_ESTOPPED);
    assert(fl_bell_wait(b, now, -1) == FL_ESTOPPED);
    assert(fl_bell_wait(b, v, 5000 * MS) == FL_ESTOPPED); /* stale `seen`: still stopped */
    assert(fl_bell_ring(b, 0) == FL_OK);                 /* a late ring is harmless */
    assert(fl_bell_wait(b, fl_bell_value(b), 5000 * MS) == FL_ESTOPPED);
    assert(fl_bell_stop(b) == FL_OK); /* idempotent */
    assert(fl_bell_wait(b, fl_bell_value(b), 5000 * MS) == FL_ESTOPPED);
    /* a thread that starts waiting after the stop */
    sleeper late;
    pthread_t lt;
    sleeper_start(&late, &lt, b, fl_bell_value(b), 10000 * MS);
    assert(pthread_join(lt, NULL) == 0);
    assert(late.rc == FL_ESTOPPED);
    assert(ms_since(t0) < 1000.0);
    assert(stats_of(b).waits == NT); /* none of the later waits slept */
    free(b);

    /* stop with nobody waiting */
    b = bell_new();
    assert(fl_bell_stop(b) == FL_OK);
    assert(fl_bell_wait(b, fl_bell_value(b), 1000 * MS) == FL_ESTOPPED);
    assert(stats_of(b).waits == 0);
    free(b);
}

/* ---------------------------------------------------------------------------------------- */
/* processes                                                                                  */

/* A shared anonymous mapping survives fork: the non-private futex then works across processes. */
static void *map_shared(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert(p != MAP_FAILED);
    return p;
}

/* fork a child that dies with its parent (the test's own process) and that cannot outlive a
 * stuck run; the child never returns from here. */
static pid_t fork_child(void (*fn)(void *), void *arg) {
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert(pid >= 0);
    if (pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(3); /* the parent is already gone */
        alarm(120);
        fn(arg);
        _exit(0); /* not exit(): the child shares the parent's heap (LeakSanitizer) */
    }
    return pid;
}

static void kill_and_reap(pid_t *pids, int n) {
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) (void)kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++) {
        if (pids[i] <= 0) continue;
        while (waitpid(pids[i], NULL, 0) < 0 && errno == EINTR) {
        }
        pids[i] = 0;
    }
}

static void child_sleep_forever(void *arg) {
    fl_bell *b = arg;
    (void)fl_bell_wait(b, fl_bell_value(b), INT64_MAX);
    _exit(7); /* only the SIGKILL below should end it */
}

/* A process killed while asleep on the bell leaves it usable (nothing is a lock): its waiter
 * count stays behind, which costs later rings a wake-up call, nothing more. */
static void test_killed_sleeper_leaves_bell_usable(void) {
    const size_t n = 4096;
    fl_bell *b = map_shared(n);
    memset(b, 0xCD, n);
    assert(fl_bell_init(b, n) == FL_OK);
    pid_t pid = fork_child(child_sleep_forever, b);
    await_sleepers(b, 1, 1, 5000);
    assert(kill(pid, SIGKILL) == 0);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0) assert(errno == EINTR);
    assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    assert(waiters_of(b) == 1); /* the dead process's announcement is left over */
    /* rings, waits and wake-ups still work */
    assert(fl_bell_ring(b, 0) == FL_OK);
    assert(fl_bell_wait(b, fl_bell_value(b), 10 * MS) == FL_ETIMEOUT);
    uint64_t waits = stats_of(b).waits;
    sleeper s;
    pthread_t th;
    sleeper_start(&s, &th, b, fl_bell_value(b), 10000 * MS);
    /* the stale count: 2 announcements, 1 of them alive */
    await_sleepers(b, 2, waits + 1, 5000);
    int64_t t_ring = fl_now_ns();
    assert(fl_bell_ring(b, 0) == FL_OK);
    assert(pthread_join(th, NULL) == 0);
    assert(s.rc == FL_OK && (double)(s.t_return - t_ring) / 1e6 < 200.0);
    assert(waiters_of(b) == 1);
    assert(munmap(b, n) == 0);
}

/* Cross-process wake-up: a child sleeps on a bell in a shared mapping, the parent rings. */
static void child_wait_then_report(void *arg) {
    fl_bell *b = arg;
    /* the shared word after the bell holds the counter value to wait on; a mismatch = failure */
    fl_atomic_u32 *seen = (fl_atomic_u32 *)((char *)b + sizeof(fl_bell));
    fl_atomic_u32 *rc_out = seen + 1;
    int rc = fl_bell_wait(b, fl_atomic_load_acquire_u32(seen), 10000 * MS);
    fl_atomic_store_release_u32(rc_out, (uint32_t)(rc + 100));
    _exit(rc == FL_OK ? 0 : 1);
}

static void test_ring_wakes_other_process(void) {
    const size_t n = 4096;
    fl_bell *b = map_shared(n);
    assert(fl_bell_init(b, n) == FL_OK);
    fl_atomic_u32 *seen = (fl_atomic_u32 *)((char *)b + sizeof(fl_bell));
    fl_atomic_u32 *rc_out = seen + 1;
    for (int round = 0; round < 3; round++) {
        stats before = stats_of(b);
        fl_atomic_store_release_u32(seen, fl_bell_value(b));
        fl_atomic_store_release_u32(rc_out, 0);
        pid_t pid = fork_child(child_wait_then_report, b);
        await_sleepers(b, 1, before.waits + 1, 5000);
        assert(fl_atomic_load_acquire_u32(rc_out) == 0);
        int64_t t_ring = fl_now_ns();
        assert(fl_bell_ring(b, 0) == FL_OK);
        int st = 0;
        while (waitpid(pid, &st, 0) < 0) assert(errno == EINTR);
        double lat = ms_since(t_ring);
        printf("  child process woken and reaped %.2f ms after the ring\n", lat);
        assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert(fl_atomic_load_acquire_u32(rc_out) == 100 + FL_OK);
        assert(lat < 1000.0);
        assert(stats_of(b).wakes == before.wakes + 1);
        assert(waiters_of(b) == 0);
    }
    assert(munmap(b, n) == 0);
}

/* ---------------------------------------------------------------------------------------- */
/* stress: no lost wake-ups under the protocol of fl_bell.h                                   */

#define MAX_PRODUCERS 8
#define MAX_CONSUMERS 8

/* Everything producers and consumers share; lives in private memory (threads) or in a shared
 * mapping (processes), the bell on its own cache line first. */
typedef struct stress_shared {
    fl_bell bell;
    fl_atomic_u64 avail; /* queued and not yet taken */
    fl_atomic_u64 taken;
    fl_atomic_u64 produced;
    fl_atomic_u64 timeouts;   /* waits that ran into their timeout: see consumer_run */
    fl_atomic_u64 sleeps;     /* waits that returned FL_OK */
    fl_atomic_u64 longest_ns; /* the longest wait */
    uint8_t pad_[FL_CACHELINE - 6 * 8];
    uint64_t per_producer_tasks;
    uint64_t seed;
    int closed_loop; /* producers wait for the queue to drain before each task */
    fl_atomic_u64 took[MAX_CONSUMERS]; /* written by one consumer each */
} stress_shared;

typedef struct stress_arg {
    stress_shared *sh;
    int id;
    int cpu; /* pin to this CPU if >= 0 */
} stress_arg;


/* Spin for a log-uniform delay of 0 or 128 ns .. 64 us, so that rings land anywhere in the
 * consumers' read-scan-announce-sleep sequence. */
static void jitter(uint64_t *rng) {
    uint64_t r = rng_next(rng);
    if ((r & 3) == 0) return; /* a quarter back to back */
    unsigned e = 7 + (unsigned)((r >> 2) % 10);
    int64_t d = ((int64_t)1 << e) + (int64_t)((r >> 8) % ((uint64_t)1 << e));
    int64_t until = fl_now_ns() + d;
    while (fl_now_ns() < until) {
    }
}

static void producer_run(stress_shared *sh, int id) {
    uint64_t rng = sh->seed * 0x9E3779B97F4A7C15ull + (uint64_t)id * 7919 + 1;
    for (uint64_t i = 0; i < sh->per_producer_tasks; i++) {
        jitter(&rng);
        /* queue the task ... */
        fl_atomic_fetch_add_relaxed_u64(&sh->produced, 1);
        __atomic_fetch_add(&sh->avail, 1, __ATOMIC_ACQ_REL);
        /* ... then ring (wake one) */
        assert(fl_bell_ring(&sh->bell, 0) == FL_OK);
        if (sh->closed_loop) {
            /* Wait (without the bell) until a consumer has taken it: the consumers go back to
             * sleep between tasks, so every ring's wake-up is needed, and a lost one stalls the
             * run until a consumer's 5 s timeout (which the check below counts). */
            int64_t end = fl_now_ns() + 20000 * MS;
            for (unsigned spins = 0; fl_atomic_load_acquire_u64(&sh->avail) > 0; spins++) {
                if (fl_now_ns() > end) {
                    fprintf(stderr, "producer %d: task %llu not taken for 20 s\n", id,
                            (unsigned long long)i);
                    abort();
                }
                /* poll tightly, so that the next task follows the take by the jitter alone */
                if (spins >= 20000) fl_yield();
            }
        }
    }
}

/* The consumers' timeout: long, so that a lost wake-up cannot hide behind it. */
#define STRESS_WAIT_NS (5000 * MS)

static int try_take(stress_shared *sh) {
    uint64_t a = fl_atomic_load_acquire_u64(&sh->avail);
    while (a > 0) {
        if (__atomic_compare_exchange_n(&sh->avail, &a, a - 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return 1;
    }
    return 0;
}

static void consumer_run(stress_shared *sh, int id) {
    uint64_t took = 0;
    for (;;) {
        uint32_t seen = fl_bell_value(&sh->bell);
        if (try_take(sh)) {
            took++;
            fl_atomic_store_relaxed_u64(&sh->took[id], took);
            __atomic_fetch_add(&sh->taken, 1, __ATOMIC_ACQ_REL);
            continue;
        }
        int64_t t0 = fl_now_ns();
        int rc = fl_bell_wait(&sh->bell, seen, STRESS_WAIT_NS);
        int64_t dt = fl_now_ns() - t0;
        if (rc == FL_ESTOPPED) break;
        uint64_t longest = fl_atomic_load_relaxed_u64(&sh->longest_ns);
        while ((uint64_t)dt > longest &&
               !__atomic_compare_exchange_n(&sh->longest_ns, &longest, (uint64_t)dt, 0,
                                            __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        }
        /* A lost wake-up does not show as FL_ETIMEOUT: the ring did move the counter, so the
         * sleeper wakes at its deadline, sees the new value and returns FL_OK. What gives it
         * away is the time: while tasks keep coming (and until the stop, which follows the last
         * take within milliseconds) no sleeper should ever sleep through its whole timeout. */
        if (rc == FL_ETIMEOUT || dt >= STRESS_WAIT_NS) {
            uint64_t n = __atomic_add_fetch(&sh->timeouts, 1, __ATOMIC_ACQ_REL);
            fprintf(stderr,
                    "consumer %d: wait(%u) slept %.2f s, returned %d, counter now %u, %llu task(s) "
                    "queued: lost wake-up?\n",
                    id, seen, (double)dt / 1e9, rc, fl_bell_value(&sh->bell),
                    (unsigned long long)fl_atomic_load_acquire_u64(&sh->avail));
            if (n >= 3) { /* enough: do not let a broken bell crawl to the time limit */
                fprintf(stderr, "consumer %d: giving up after %llu stalled waits\n", id,
                        (unsigned long long)n);
                abort();
            }
            continue;
        }
        assert(rc == FL_OK);
        fl_atomic_fetch_add_relaxed_u64(&sh->sleeps, 1);
    }
}

static void *producer_thread(void *p) {
    stress_arg *a = p;
    pin_self(a->cpu);
    producer_run(a->sh, a->id);
    return NULL;
}

static void *consumer_thread(void *p) {
    stress_arg *a = p;
    pin_self(a->cpu);
    consumer_run(a->sh, a->id);
    return NULL;
}

static void producer_child(void *p) {
    stress_arg *a = p;
    pin_self(a->cpu);
    producer_run(a->sh, a->id);
}

static void consumer_child(void *p) {
    stress_arg *a = p;
    pin_self(a->cpu);
    consumer_run(a->sh, a->id);
}

static void stress_setup(stress_shared *sh, uint64_t ntasks, int np, int closed_loop) {
    memset(sh, 0xCD, sizeof *sh);
    assert(fl_bell_init(&sh->bell, sizeof sh->bell) == FL_OK);
    fl_atomic_store_release_u64(&sh->avail, 0);
    fl_atomic_store_release_u64(&sh->taken, 0);
    fl_atomic_store_release_u64(&sh->produced, 0);
    fl_atomic_store_release_u64(&sh->timeouts, 0);
    fl_atomic_store_release_u64(&sh->longest_ns, 0);
    fl_atomic_store_release_u64(&sh->sleeps, 0);
    for (int i = 0; i < MAX_CONSUMERS; i++) fl_atomic_store_release_u64(&sh->took[i], 0);
    sh->per_producer_tasks = (ntasks + (uint64_t)np - 1) / (uint64_t)np;
    sh->closed_loop = closed_loop;
    sh->seed = (uint64_t)fl_test_env_long("FL_TEST_SEED", 20240601);
}

/* Wait until every task is taken; 1 if so, 0 if nothing moved for stall_ms (or `alive` says a
 * participant died: then 0 at once). */
static int await_all_taken(stress_shared *sh, uint64_t total, long stall_ms,
                           int (*alive)(void *), void *ctx) {
    uint64_t last = 0;
    int64_t last_t = fl_now_ns();
    for (;;) {
        uint64_t t = fl_atomic_load_acquire_u64(&sh->taken);
        if (t == total && fl_atomic_load_acquire_u64(&sh->produced) == total) return 1;
        if (alive != NULL && !alive(ctx)) return 0;
        if (t != last) {
            last = t;
            last_t = fl_now_ns();
        } else if (fl_now_ns() - last_t > stall_ms * MS) {
            return 0;
        }
        sleep_ms(1);
    }
}

static void stress_check(stress_shared *sh, uint64_t total, int np, int nc, const char *what,
                         double secs) {
    const char *mode = sh->closed_loop ? "closed loop" : "open loop";
    uint64_t sum = 0;
    for (int i = 0; i < nc; i++) sum += fl_atomic_load_acquire_u64(&sh->took[i]);
    stats s = stats_of(&sh->bell);
    printf("  %s, %s: %llu tasks, %d producer(s), %d consumer(s), %.2f s: %llu sleeps woken, "
           "%llu wait calls, %llu wake calls, longest wait %.1f ms, %llu stalled waits\n",
           what, mode, (unsigned long long)total, np, nc, secs,
           (unsigned long long)fl_atomic_load_acquire_u64(&sh->sleeps),
           (unsigned long long)s.waits, (unsigned long long)s.wakes,
           (double)fl_atomic_load_acquire_u64(&sh->longest_ns) / 1e6,
           (unsigned long long)fl_atomic_load_acquire_u64(&sh->timeouts));
    /* every task taken exactly once: the CAS never takes a task that is not there, and the
     * takes add up to the tasks queued */
    assert(fl_atomic_load_acquire_u64(&sh->produced) == total);
    assert(fl_atomic_load_acquire_u64(&sh->taken) == total);
    assert(sum == total);
    assert(fl_atomic_load_acquire_u64(&sh->avail) == 0);
    /* nobody had to rely on the 5 s timeout (see consumer_run) */
    assert(fl_atomic_load_acquire_u64(&sh->timeouts) == 0);
    assert(s.rings == total);     /* stop moves the counter but is not a ring */
    assert(s.waits > 0);          /* the consumers did go through the sleeping path */
    assert(waiters_of(&sh->bell) == 0);
}

static uint64_t stress_tasks(void) {
    return (uint64_t)fl_test_env_long("FL_TEST_TASKS", FL_BELL_STRESS_TASKS);
}

/* pin: with one producer and one consumer, put them on two different CPUs (if there are two):
 * left to itself the scheduler tends to wake the consumer on the producer's CPU, and then the
 * producer's rings never land inside the consumer's way to sleep. */
static void pinned_pair(int np, int nc, int pin, int *pcpu, int *ccpu) {
    *pcpu = *ccpu = -1;
    if (!pin || np != 1 || nc != 1) return;
    int c0 = nth_allowed_cpu(0), c1 = nth_allowed_cpu(1);
    if (c0 >= 0 && c1 >= 0) {
        *pcpu = c0;
        *ccpu = c1;
    }
}

static void stress_threads(uint64_t ntasks, int np, int nc, int closed_loop) {
    assert(np <= MAX_PRODUCERS && nc <= MAX_CONSUMERS);
    stress_shared *sh = xalloc(sizeof *sh);
    stress_setup(sh, ntasks, np, closed_loop);
    uint64_t total = sh->per_producer_tasks * (uint64_t)np;
    stress_arg pa[MAX_PRODUCERS], ca[MAX_CONSUMERS];
    pthread_t pt[MAX_PRODUCERS], ct[MAX_CONSUMERS];
    int pcpu, ccpu;
    pinned_pair(np, nc, closed_loop, &pcpu, &ccpu);
    int64_t t0 = fl_now_ns();
    for (int i = 0; i < nc; i++) {
        ca[i] = (stress_arg){sh, i, ccpu};
        assert(pthread_create(&ct[i], NULL, consumer_thread, &ca[i]) == 0);
    }
    for (int i = 0; i < np; i++) {
        pa[i] = (stress_arg){sh, i, pcpu};
        assert(pthread_create(&pt[i], NULL, producer_thread, &pa[i]) == 0);
    }
    for (int i = 0; i < np; i++) assert(pthread_join(pt[i], NULL) == 0);
    if (!await_all_taken(sh, total, 20000, NULL, NULL)) {
        fprintf(stderr, "stress: stuck at %llu of %llu tasks taken, %llu queued\n",
                (unsigned long long)fl_atomic_load_acquire_u64(&sh->taken),
                (unsigned long long)total,
                (unsigned long long)fl_atomic_load_acquire_u64(&sh->avail));
        abort();
    }
    assert(fl_bell_stop(&sh->bell) == FL_OK);
    for (int i = 0; i < nc; i++) assert(pthread_join(ct[i], NULL) == 0);
    stress_check(sh, total, np, nc, "threads", ms_since(t0) / 1e3);
    free(sh);
}

static void test_stress_threads(void) {
    uint64_t n = stress_tasks();
    if (n < 1000) n = 1000;
    /* open loop: producers queue as fast as their random delays let them */
    stress_threads(n / 2, 2, 3, 0); /* more consumers than producers: many sleepers */
    stress_threads(n / 8, 3, 1, 0);
    /* closed loop: one task at a time, each ring lands somewhere in a consumer's
     * read-look-announce-sleep sequence, and its wake-up is the only one coming */
    stress_threads(n / 4, 1, 1, 1);
    stress_threads(n / 8, 1, 3, 1);
    stress_threads(n / 8, 2, 2, 1);
}

typedef struct procs {
    pid_t pids[MAX_PRODUCERS + MAX_CONSUMERS];
    int n;
    int failed; /* a child exited with a failure */
} procs;

/* Reap children that have exited; 0 if one of them failed. */
static int procs_alive(void *ctx) {
    procs *p = ctx;
    for (int i = 0; i < p->n; i++) {
        if (p->pids[i] <= 0) continue;
        int st = 0;
        pid_t r = waitpid(p->pids[i], &st, WNOHANG);
        if (r == 0) continue;
        assert(r == p->pids[i]);
        p->pids[i] = 0;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            fprintf(stderr, "stress: child %d (pid %d) failed (status %#x)\n", i, (int)r, st);
            p->failed = 1;
        }
    }
    return !p->failed;
}

static void stress_processes(uint64_t ntasks, int np, int nc, int closed_loop) {
    assert(np <= MAX_PRODUCERS && nc <= MAX_CONSUMERS);
    const size_t bytes = round_up(sizeof(stress_shared), 4096);
    stress_shared *sh = map_shared(bytes);
    stress_setup(sh, ntasks, np, closed_loop);
    uint64_t total = sh->per_producer_tasks * (uint64_t)np;
    procs p = {.n = 0};
    int pcpu, ccpu;
    pinned_pair(np, nc, closed_loop, &pcpu, &ccpu);
    int64_t t0 = fl_now_ns();
    for (int i = 0; i < nc; i++) {
        stress_arg a = {sh, i, ccpu};
        p.pids[p.n++] = fork_child(consumer_child, &a);
    }
    for (int i = 0; i < np; i++) {
        stress_arg a = {sh, i, pcpu};
        p.pids[p.n++] = fork_child(producer_child, &a);
    }
    int ok = await_all_taken(sh, total, 20000, procs_alive, &p);
    if (!ok) {
        fprintf(stderr, "stress: %s at %llu of %llu tasks taken, %llu queued\n",
                p.failed ? "a child failed" : "stuck",
                (unsigned long long)fl_atomic_load_acquire_u64(&sh->taken),
                (unsigned long long)total,
                (unsigned long long)fl_atomic_load_acquire_u64(&sh->avail));
        (void)fl_bell_stop(&sh->bell);
        kill_and_reap(p.pids, p.n);
        abort();
    }
    assert(fl_bell_stop(&sh->bell) == FL_OK);
    /* every child exits by itself now (consumers see the stop); reap them, with a time limit */
    int64_t end = fl_now_ns() + 10000 * MS;
    for (;;) {
        int ok2 = procs_alive(&p);
        int left = 0;
        for (int i = 0; i < p.n; i++) left += p.pids[i] > 0;
        if (!ok2 || left == 0 || fl_now_ns() > end) {
            if (!ok2 || left > 0) {
                fprintf(stderr, "stress: %d child(ren) %s\n", left,
                        ok2 ? "did not exit after the stop" : "failed");
                kill_and_reap(p.pids, p.n);
                abort();
            }
            break;
        }
        sleep_ms(1);
    }
    stress_check(sh, total, np, nc, "processes", ms_since(t0) / 1e3);
    assert(munmap(sh, bytes) == 0);
}

static void test_stress_processes(void) {
    uint64_t n = stress_tasks() / 2;
    if (n < 1000) n = 1000;
    stress_processes(n / 2, 2, 3, 0);
    stress_processes(n / 2, 1, 1, 1);
}

int main(int argc, char **argv) {
    static const fl_test_case tests[] = {
        FL_TEST(test_layout),
        FL_TEST(test_init_attach),
        FL_TEST(test_bad_pointers),
        FL_TEST(test_counter_and_wait_at_once),
        FL_TEST(test_wait_timeout),
        FL_TEST(test_huge_timeout),
        FL_TEST(test_ring_wakes_sleeper),
        FL_TEST(test_ring_without_waiters_no_syscall),
        FL_TEST(test_wake_one_and_all),
        FL_TEST(test_stop),
        FL_TEST(test_ring_wakes_other_process),
        FL_TEST(test_killed_sleeper_leaves_bell_usable),
        FL_TEST(test_stress_threads),
        FL_TEST(test_stress_processes),
    };
#if FL_HAVE_FUTEX
    const char *suite = "test_bell";
#else
    const char *suite = "test_bell[portable-wait]";
#endif
    return fl_test_main(suite, tests, sizeof tests / sizeof tests[0], argc, argv);
}
