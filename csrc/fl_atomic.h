/* fl_atomic.h: the ONLY file that uses atomic builtins or memory orders.
 * Every memory order is spelled out; there is no implicit seq_cst. */
#ifndef FASTLOAD_FL_ATOMIC_H
#define FASTLOAD_FL_ATOMIC_H

#include "fl_config.h"

#if !defined(__GNUC__) && !defined(__clang__)
#error "fl_atomic.h needs GCC or Clang __atomic builtins (an MSVC branch is future work)"
#endif

/* A non-lock-free atomic in shared memory would be silently wrong across processes. */
FL_STATIC_ASSERT(__atomic_always_lock_free(4, 0), "32-bit atomics must be lock-free");
FL_STATIC_ASSERT(__atomic_always_lock_free(8, 0), "64-bit atomics must be lock-free");

typedef uint32_t fl_atomic_u32;
typedef uint64_t fl_atomic_u64;

FL_INLINE uint32_t fl_atomic_load_relaxed_u32(const fl_atomic_u32 *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
FL_INLINE uint32_t fl_atomic_load_acquire_u32(const fl_atomic_u32 *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
FL_INLINE void fl_atomic_store_relaxed_u32(fl_atomic_u32 *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
FL_INLINE void fl_atomic_store_release_u32(fl_atomic_u32 *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
/* Strong CAS; on failure *expected receives the current value (acquire). */
FL_INLINE int fl_atomic_cas_acq_rel_u32(fl_atomic_u32 *p, uint32_t *expected, uint32_t desired) {
    return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}
FL_INLINE uint32_t fl_atomic_fetch_add_acq_rel_u32(fl_atomic_u32 *p, uint32_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}
FL_INLINE uint32_t fl_atomic_fetch_sub_acq_rel_u32(fl_atomic_u32 *p, uint32_t v) {
    return __atomic_fetch_sub(p, v, __ATOMIC_ACQ_REL);
}
FL_INLINE uint64_t fl_atomic_load_relaxed_u64(const fl_atomic_u64 *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
FL_INLINE uint64_t fl_atomic_load_acquire_u64(const fl_atomic_u64 *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
FL_INLINE void fl_atomic_store_relaxed_u64(fl_atomic_u64 *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
FL_INLINE void fl_atomic_store_release_u64(fl_atomic_u64 *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
FL_INLINE uint64_t fl_atomic_fetch_add_relaxed_u64(fl_atomic_u64 *p, uint64_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
/* Strong CAS on 64 bits; on failure *expected receives the current value (acquire). */
FL_INLINE int fl_atomic_cas_acq_rel_u64(fl_atomic_u64 *p, uint64_t *expected, uint64_t desired) {
    return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}
/* Full fence: orders a store before a later load (Dekker-style "announce then re-check"). */
FL_INLINE void fl_atomic_fence_seq_cst(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

#endif /* FASTLOAD_FL_ATOMIC_H */
