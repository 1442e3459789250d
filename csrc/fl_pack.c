#include "fl_pack.h"

#include <string.h>

int fl_pack_copy(void *dst, size_t dst_len, size_t offset, const void *src, size_t nbytes) {
    if (nbytes == 0) return FL_OK;
    if (dst == NULL || src == NULL) return FL_EINVAL;
    if (offset > dst_len || nbytes > dst_len - offset) return FL_ERANGE;
    memcpy((char *)dst + offset, src, nbytes);
    return FL_OK;
}

int fl_pack_gather(void *dst, size_t dst_len, size_t offset, const void *src, size_t src_rows,
                   size_t row_bytes, const int64_t *indices, size_t n, size_t *bad_k) {
    if (n == 0) return FL_OK;
    if (dst == NULL || src == NULL || indices == NULL) return FL_EINVAL;
    if (offset > dst_len) return FL_ERANGE;
    if (row_bytes != 0 && n > (dst_len - offset) / row_bytes) return FL_ERANGE;
    char *out = (char *)dst + offset;
    const char *in = (const char *)src;
    for (size_t k = 0; k < n; k++) {
        int64_t i = indices[k];
        if (i < 0 || (uint64_t)i >= (uint64_t)src_rows) {
            if (bad_k != NULL) *bad_k = k;
            return FL_ERANGE;
        }
        memcpy(out + k * row_bytes, in + (size_t)i * row_bytes, row_bytes);
    }
    return FL_OK;
}

size_t fl_pack_align(size_t x, size_t align) {
    if (align == 0 || (align & (align - 1)) != 0) return 0;
    if (x > SIZE_MAX - (align - 1)) return 0;
    return (x + align - 1) & ~(align - 1);
}
