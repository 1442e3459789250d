/* fl_bell.c: see fl_bell.h. */
#include "fl_bell.h"

#include <stdint.h>
#include <string.h>

#include "fl_status.h"
#include "fl_wait.h"

FL_INLINE fl_bell *bell_of(void *mem) { return (fl_bell *)mem; }

FL_INLINE int bell_ok(const void *mem) {
    return mem != NULL && ((uintptr_t)mem % 8) == 0 &&
           ((const fl_bell *)mem)->magic == FL_BELL_MAGIC;
}

size_t fl_bell_nbytes(void) { return sizeof(fl_bell); }

int fl_bell_init(void *mem, size_t nbytes) {
    if (mem == NULL || ((uintptr_t)mem % 8) != 0 || nbytes < sizeof(fl_bell)) return FL_EINVAL;
    memset(mem, 0, sizeof(fl_bell));
    fl_bell *b = bell_of(mem);
    fl_atomic_fence_seq_cst();
    b->magic = FL_BELL_MAGIC;
    return FL_OK;
}

int fl_bell_attach(void *mem, size_t nbytes) {
    if (mem == NULL || ((uintptr_t)mem % 8) != 0 || nbytes < sizeof(fl_bell)) return FL_EINVAL;
    return bell_ok(mem) ? FL_OK : FL_ELAYOUT;
}

uint32_t fl_bell_value(const void *mem) {
    if (!bell_ok(mem)) return 0;
    return fl_atomic_load_acquire_u32(&((const fl_bell *)mem)->counter);
}

int fl_bell_ring(void *mem, int wake_all) {
    if (!bell_ok(mem)) return FL_EINVAL;
    fl_bell *b = bell_of(mem);
    fl_atomic_fetch_add_acq_rel_u32(&b->counter, 1);
    fl_atomic_fetch_add_relaxed_u64(&b->n_rings, 1);
    fl_wake_if_waiting(&b->counter, &b->waiters, wake_all ? -1 : 1, &b->n_wakes);
    return FL_OK;
}

int fl_bell_wait(void *mem, uint32_t seen, int64_t timeout_ns) {
    if (!bell_ok(mem)) return FL_EINVAL;
    fl_bell *b = bell_of(mem);
    if (fl_atomic_load_acquire_u32(&b->stop)) return FL_ESTOPPED;
    if (fl_atomic_load_acquire_u32(&b->counter) != seen) return FL_OK;
    if (timeout_ns <= 0) return FL_ETIMEOUT;
    int64_t now = fl_now_ns();
    int64_t deadline = timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
    fl_sleep_unless_changed(&b->counter, seen, &b->waiters, &b->stop, deadline - now, &b->n_waits);
    if (fl_atomic_load_acquire_u32(&b->stop)) return FL_ESTOPPED;
    if (fl_atomic_load_acquire_u32(&b->counter) != seen) return FL_OK;
    return fl_now_ns() >= deadline ? FL_ETIMEOUT : FL_OK;
}

int fl_bell_stop(void *mem) {
    if (!bell_ok(mem)) return FL_EINVAL;
    fl_bell *b = bell_of(mem);
    fl_atomic_store_release_u32(&b->stop, 1);
    fl_atomic_fetch_add_acq_rel_u32(&b->counter, 1);
    fl_wake_if_waiting(&b->counter, &b->waiters, -1, NULL);
    return FL_OK;
}

int fl_bell_stats(const void *mem, uint64_t *rings, uint64_t *wakes, uint64_t *waits) {
    if (!bell_ok(mem) || rings == NULL || wakes == NULL || waits == NULL) return FL_EINVAL;
    fl_bell *b = bell_of((void *)mem);
    *rings = fl_atomic_load_relaxed_u64(&b->n_rings);
    *wakes = fl_atomic_load_relaxed_u64(&b->n_wakes);
    *waits = fl_atomic_load_relaxed_u64(&b->n_waits);
    return FL_OK;
}
