/* fl_pack.h: bounds-checked copies into and out of slot payloads.
 * Every function checks its ranges with overflow-safe arithmetic before touching memory and
 * returns FL_ERANGE instead of writing outside [dst, dst + dst_len). Callers release the GIL. */
#ifndef FASTLOAD_FL_PACK_H
#define FASTLOAD_FL_PACK_H

#include "fl_config.h"
#include "fl_status.h"

/* Copy nbytes from src to dst[offset : offset + nbytes]. */
int fl_pack_copy(void *dst, size_t dst_len, size_t offset, const void *src, size_t nbytes);

/* For k in [0, n): copy row indices[k] of a table of rows (src, src_rows rows of row_bytes) to
 * dst[offset + k * row_bytes]. Any index outside [0, src_rows) gives FL_ERANGE, and *bad_k
 * (if not NULL) receives the position k of the first bad index; nothing past it is copied. */
int fl_pack_gather(void *dst, size_t dst_len, size_t offset, const void *src, size_t src_rows,
                   size_t row_bytes, const int64_t *indices, size_t n, size_t *bad_k);

/* Round x up to a multiple of align (a power of two); 0 if that would overflow. */
size_t fl_pack_align(size_t x, size_t align);

#endif /* FASTLOAD_FL_PACK_H */
