/* fl_wait.h: sleeping on a 32-bit word shared between processes, with a monotonic deadline.
 * Linux: futex (FUTEX_WAIT/FUTEX_WAKE, not private: the word lives in shared memory).
 * Elsewhere, or with -DFL_NO_FUTEX: a short-sleep backoff (50 us doubling to 1 ms). */
#ifndef FASTLOAD_FL_WAIT_H
#define FASTLOAD_FL_WAIT_H

#include "fl_config.h"
#include "fl_atomic.h"

/* Monotonic clock in nanoseconds. */
int64_t fl_now_ns(void);

/* Sleep while *word == expected, at most timeout_ns (spurious wake-ups allowed). */
void fl_wait_word(fl_atomic_u32 *word, uint32_t expected, int64_t timeout_ns);

/* Wake up to n sleepers on word (n < 0: all). No-op in the portable build. */
void fl_wake_word(fl_atomic_u32 *word, int n);

/* Give the CPU away once (sched_yield). */
void fl_yield(void);

/* NOTE [sleeping without lost wake-ups]
 * A sleeper announces itself (waiters += 1), issues a full fence, re-reads the word it will sleep
 * on and only then calls the kernel, which re-checks the word atomically. A waker changes the word,
 * issues a full fence and wakes only if it sees a waiter. Either the sleeper sees the new word, or
 * the waker sees the waiter: no wake-up is lost, and no system call is made when nobody sleeps.
 * The two halves below are the only implementation (the ring's task counter and slot states,
 * the pool's bell). */

/* The sleeper's half: sleep on *word while it is `seen` and *stop (if not NULL) is 0, at most
 * timeout_ns. *calls (if not NULL) counts the kernel calls; it is bumped just before the call, so
 * a test can tell that a sleeper is (about to be) asleep. */
FL_INLINE void fl_sleep_unless_changed(fl_atomic_u32 *word, uint32_t seen, fl_atomic_u32 *waiters,
                                       const fl_atomic_u32 *stop, int64_t timeout_ns,
                                       fl_atomic_u64 *calls) {
    fl_atomic_fetch_add_acq_rel_u32(waiters, 1);
    fl_atomic_fence_seq_cst();
    if (fl_atomic_load_acquire_u32(word) == seen &&
        (stop == NULL || !fl_atomic_load_acquire_u32(stop))) {
        if (calls != NULL) fl_atomic_fetch_add_relaxed_u64(calls, 1);
        fl_wait_word(word, seen, timeout_ns);
    }
    fl_atomic_fetch_sub_acq_rel_u32(waiters, 1);
}

/* The waker's half, after changing *word: wake up to n sleepers (n < 0: all) if any announced
 * itself; *calls (if not NULL) counts the kernel calls. */
FL_INLINE void fl_wake_if_waiting(fl_atomic_u32 *word, const fl_atomic_u32 *waiters, int n,
                                  fl_atomic_u64 *calls) {
    fl_atomic_fence_seq_cst();
    if (fl_atomic_load_relaxed_u32(waiters) == 0) return;
    if (calls != NULL) fl_atomic_fetch_add_relaxed_u64(calls, 1);
    fl_wake_word(word, n);
}

#endif /* FASTLOAD_FL_WAIT_H */
