#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fl_wait.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <time.h>

#if FL_HAVE_FUTEX
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

int64_t fl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void fl_yield(void) { sched_yield(); }

#if FL_HAVE_FUTEX
void fl_wait_word(fl_atomic_u32 *word, uint32_t expected, int64_t timeout_ns) {
    if (timeout_ns <= 0) return;
    struct timespec ts;
    ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
    ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
    /* Returns at once with EAGAIN if *word != expected; EINTR lets Python see signals. */
    (void)syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

void fl_wake_word(fl_atomic_u32 *word, int n) {
    (void)syscall(SYS_futex, word, FUTEX_WAKE, n < 0 ? INT_MAX : n, NULL, NULL, 0);
}
#else
void fl_wait_word(fl_atomic_u32 *word, uint32_t expected, int64_t timeout_ns) {
    int64_t now = fl_now_ns();
    int64_t deadline = timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
    int64_t step = 50000; /* 50 us, doubling to 1 ms */
    while (fl_atomic_load_acquire_u32(word) == expected) {
        int64_t left = deadline - fl_now_ns();
        if (left <= 0) return;
        int64_t d = step < left ? step : left;
        struct timespec ts = {(time_t)(d / 1000000000LL), (long)(d % 1000000000LL)};
        if (nanosleep(&ts, NULL) != 0 && errno == EINTR) return;
        if (step < 1000000) step *= 2;
    }
}

void fl_wake_word(fl_atomic_u32 *word, int n) {
    (void)word;
    (void)n;
}
#endif
