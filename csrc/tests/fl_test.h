/* fl_test.h: a tiny test runner for the plain-C tests of the compiled core (no framework).
 *
 * Tests use plain assert() (the Makefile compiles with -UNDEBUG). Every test runs in a forked
 * child, so a failing assert (SIGABRT), a sanitizer report or a hang (alarm) fails that test only
 * and the others still run. The runner prints one line per test and then exactly
 * "N passed, M failed"; the exit status is 0 only if M == 0.
 *
 * Usage: ./test_x [substring]     run only the tests whose name contains substring
 * Environment: FL_TEST_NOFORK=1   run tests in-process (for gdb); the first failure aborts
 *              FL_TEST_ALARM=s    per-test time limit in seconds (default 240) */
#ifndef FASTLOAD_FL_TEST_H
#define FASTLOAD_FL_TEST_H

#ifdef NDEBUG
#error "the tests need assert(): compile with -UNDEBUG"
#endif

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct fl_test_case {
    const char *name;
    void (*fn)(void);
} fl_test_case;

#define FL_TEST(fn) {#fn, fn}

/* The n-th CPU this process may run on (-1 if there are not that many). */
static inline int nth_allowed_cpu(int n) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set) && n-- == 0) return c;
    return -1;
}

/* Pin the calling thread to cpu (best effort; cpu < 0: leave it). */
static inline void pin_self(int cpu) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static inline double fl_test_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline long fl_test_env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return dflt;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || x <= 0) {
        fprintf(stderr, "ignoring bad %s=%s\n", name, v);
        return dflt;
    }
    return x;
}

static inline int fl_test_main(const char *suite, const fl_test_case *tests, size_t ntests,
                               int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* interleave sensibly with sanitizer reports */
    const char *filter = argc > 1 ? argv[1] : NULL;
    int nofork = getenv("FL_TEST_NOFORK") != NULL && strcmp(getenv("FL_TEST_NOFORK"), "0") != 0;
    unsigned alarm_s = (unsigned)fl_test_env_long("FL_TEST_ALARM", 240);
    int passed = 0, failed = 0;
    double t_all = fl_test_now_s();
    for (size_t i = 0; i < ntests; i++) {
        if (filter != NULL && strstr(tests[i].name, filter) == NULL) continue;
        double t0 = fl_test_now_s();
        int ok;
        char why[64] = "";
        fflush(stdout);
        fflush(stderr);
        if (nofork) {
            tests[i].fn();
            ok = 1;
        } else {
            pid_t pid = fork();
            assert(pid >= 0);
            if (pid == 0) {
                alarm(alarm_s);
                tests[i].fn();
                /* exit(), not _exit(): LeakSanitizer checks the child at exit */
                exit(0);
            }
            int st = 0;
            while (waitpid(pid, &st, 0) < 0) {
            }
            ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
            if (WIFSIGNALED(st))
                snprintf(why, sizeof why, " (signal %d%s)", WTERMSIG(st),
                         WTERMSIG(st) == SIGALRM ? ": time limit" : "");
            else if (!ok)
                snprintf(why, sizeof why, " (exit status %d)", WEXITSTATUS(st));
        }
        printf("%s %s/%s (%.3f s)%s\n", ok ? "PASS" : "FAIL", suite, tests[i].name,
               fl_test_now_s() - t0, why);
        if (ok)
            passed++;
        else
            failed++;
    }
    printf("# %s: %.1f s\n", suite, fl_test_now_s() - t_all);
    printf("%d passed, %d failed\n", passed, failed);
    fflush(stdout);
    return failed == 0 && passed > 0 ? 0 : 1;
}

#endif /* FASTLOAD_FL_TEST_H */
