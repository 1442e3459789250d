/* fl_config.h: compiler and platform macros shared by every C file of the core.
 * No Python here: csrc/ builds and tests without Python headers. */
#ifndef FASTLOAD_FL_CONFIG_H
#define FASTLOAD_FL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#error "fastload's compiled core does not support Windows yet (Linux and macOS only)"
#endif

#define FL_INLINE static inline
#define FL_CACHELINE 128 /* covers x86 adjacent-line prefetch and Apple Silicon's 128-byte lines */
#define FL_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)

/* Platform features. Each can be forced off with -DFL_NO_<FEATURE> so that the portable
 * fallback paths are compiled and tested on Linux too (see setup.py: FASTLOAD_PORTABLE=1). */
#if defined(__linux__) && !defined(FL_NO_FUTEX)
#define FL_HAVE_FUTEX 1
#else
#define FL_HAVE_FUTEX 0
#endif

#ifdef FL_DEBUG
#include <assert.h>
#define FL_ASSERT(x) assert(x)
#else
#define FL_ASSERT(x) ((void)0)
#endif

#endif /* FASTLOAD_FL_CONFIG_H */
