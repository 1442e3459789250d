/* fl_bell.h: a doorbell shared by the processes of one fastload.Pool.
 *
 * A pool's workers serve several rings (one per loader). A worker that finds no queued task in
 * any of its rings sleeps on the pool's bell instead of on one ring; every loader rings the bell
 * after queueing a task. The protocol (NOTE [sleeping without lost wake-ups] in fl_wait.h):
 *   worker:  seen = fl_bell_value(); scan every ring; nothing? fl_bell_wait(seen, timeout)
 *   loader:  fl_ring_queue(...); fl_bell_ring()
 * A ring that happens between the read of `seen` and the sleep changes the counter, so the
 * sleep returns at once: no queued task is ever left while every worker sleeps.
 * Nothing here is a lock: a process killed anywhere leaves the bell usable. */
#ifndef FASTLOAD_FL_BELL_H
#define FASTLOAD_FL_BELL_H

#include <stddef.h>
#include "fl_config.h"
#include "fl_atomic.h"

#define FL_BELL_MAGIC 0x6c6c6562u /* "bell" */

typedef struct fl_bell {
    uint32_t magic;
    fl_atomic_u32 counter; /* bumped by every ring (wraps) */
    fl_atomic_u32 waiters; /* processes inside fl_bell_wait's sleep */
    fl_atomic_u32 stop;    /* 1: the pool is closing; waits return FL_ESTOPPED */
    fl_atomic_u64 n_rings;
    fl_atomic_u64 n_wakes; /* rings that made a wake-up system call */
    fl_atomic_u64 n_waits; /* sleeps that made a wait system call */
    uint8_t pad_[FL_CACHELINE - 40];
} fl_bell;

FL_STATIC_ASSERT(sizeof(fl_bell) == FL_CACHELINE, "the bell is one cache line");

/* Bytes the bell needs. */
size_t fl_bell_nbytes(void);
/* Initialise (creator only); mem must be 8-byte aligned and nbytes >= fl_bell_nbytes(). */
int fl_bell_init(void *mem, size_t nbytes);
/* Check that mem holds an initialised bell. */
int fl_bell_attach(void *mem, size_t nbytes);
/* The counter (acquire): read it before scanning for work. */
uint32_t fl_bell_value(const void *mem);
/* Bump the counter; wake one sleeper if there is one (all of them with wake_all). */
int fl_bell_ring(void *mem, int wake_all);
/* Sleep while the counter equals `seen`, at most timeout_ns. FL_OK (rung, or a spurious
 * wake-up), FL_ETIMEOUT, FL_ESTOPPED. */
int fl_bell_wait(void *mem, uint32_t seen, int64_t timeout_ns);
/* Set the stop flag and wake everyone. */
int fl_bell_stop(void *mem);
/* Counters: rings, wake system calls, wait system calls. */
int fl_bell_stats(const void *mem, uint64_t *rings, uint64_t *wakes, uint64_t *waits);

#endif /* FASTLOAD_FL_BELL_H */
