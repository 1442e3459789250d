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

#endif /* FASTLOAD_FL_WAIT_H */
