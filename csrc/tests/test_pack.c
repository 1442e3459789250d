/* test_pack.c: bounds checks of fl_pack_copy, fl_pack_gather and fl_pack_align (fl_pack.h).
 * Build and run through the Makefile in this directory (plain and ASan+UBSan builds). */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "fl_pack.h"
#include "fl_status.h"
#include "fl_test.h"

#define CANARY 0xA5u

static int all_bytes(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* fl_pack_copy                                                                               */

static void test_copy_basic(void) {
    unsigned char dst[64], src[64];
    for (int i = 0; i < 64; i++) src[i] = (unsigned char)(i + 1);
    memset(dst, CANARY, sizeof dst);
    assert(fl_pack_copy(dst, sizeof dst, 8, src, 16) == FL_OK);
    assert(all_bytes(dst, 8, CANARY));
    assert(memcmp(dst + 8, src, 16) == 0);
    assert(all_bytes(dst + 24, 40, CANARY));
}

static void test_copy_exact_fit(void) {
    unsigned char dst[64], src[64];
    for (int i = 0; i < 64; i++) src[i] = (unsigned char)(255 - i);
    memset(dst, CANARY, sizeof dst);
    /* the whole buffer */
    assert(fl_pack_copy(dst, sizeof dst, 0, src, 64) == FL_OK);
    assert(memcmp(dst, src, 64) == 0);
    /* the last bytes, ending exactly at dst_len */
    memset(dst, CANARY, sizeof dst);
    assert(fl_pack_copy(dst, sizeof dst, 60, src, 4) == FL_OK);
    assert(all_bytes(dst, 60, CANARY));
    assert(memcmp(dst + 60, src, 4) == 0);
    /* a heap buffer of the exact size, so ASan would catch a one-byte overrun */
    unsigned char *h = malloc(37);
    assert(h != NULL);
    assert(fl_pack_copy(h, 37, 0, src, 37) == FL_OK);
    assert(memcmp(h, src, 37) == 0);
    assert(fl_pack_copy(h, 37, 36, src, 1) == FL_OK);
    assert(h[36] == src[0]);
    free(h);
}

static void test_copy_zero_bytes(void) {
    unsigned char dst[16], src[16] = {0};
    memset(dst, CANARY, sizeof dst);
    assert(fl_pack_copy(dst, sizeof dst, 0, src, 0) == FL_OK);
    assert(fl_pack_copy(dst, sizeof dst, 16, src, 0) == FL_OK); /* at the end */
    assert(fl_pack_copy(NULL, 0, 0, NULL, 0) == FL_OK);         /* documented no-op */
    assert(all_bytes(dst, sizeof dst, CANARY));
}

static void test_copy_offset_past_end(void) {
    unsigned char dst[32], src[32] = {1};
    memset(dst, CANARY, sizeof dst);
    assert(fl_pack_copy(dst, sizeof dst, 33, src, 1) == FL_ERANGE);
    assert(fl_pack_copy(dst, sizeof dst, 32, src, 1) == FL_ERANGE);
    assert(fl_pack_copy(dst, sizeof dst, SIZE_MAX, src, 1) == FL_ERANGE);
    assert(fl_pack_copy(dst, 0, 0, src, 1) == FL_ERANGE);
    assert(all_bytes(dst, sizeof dst, CANARY));
}

static void test_copy_nbytes_past_end(void) {
    unsigned char dst[32], src[64] = {1};
    memset(dst, CANARY, sizeof dst);
    assert(fl_pack_copy(dst, sizeof dst, 0, src, 33) == FL_ERANGE);
    assert(fl_pack_copy(dst, sizeof dst, 1, src, 32) == FL_ERANGE);
    assert(fl_pack_copy(dst, sizeof dst, 31, src, 2) == FL_ERANGE);
    assert(fl_pack_copy(dst, sizeof dst, 16, src, 17) == FL_ERANGE);
    assert(all_bytes(dst, sizeof dst, CANARY));
}

static void test_copy_size_overflow(void) {
    unsigned char dst[32], src[32] = {1};
    memset(dst, CANARY, sizeof dst);
    /* offset + nbytes wraps around to a small number: a naive check would pass */
    assert(fl_pack_copy(dst, sizeof dst, 8, src, SIZE_MAX - 7) == FL_ERANGE);   /* sum = 0 */
    assert(fl_pack_copy(dst, sizeof dst, 8, src, SIZE_MAX) == FL_ERANGE);       /* sum = 7 */
    assert(fl_pack_copy(dst, sizeof dst, SIZE_MAX, src, 2) == FL_ERANGE);       /* sum = 1 */
    assert(fl_pack_copy(dst, SIZE_MAX, SIZE_MAX, src, 1) == FL_ERANGE);         /* at the end */
    assert(fl_pack_copy(dst, SIZE_MAX, 2, src, SIZE_MAX - 1) == FL_ERANGE);
    assert(all_bytes(dst, sizeof dst, CANARY));
}

static void test_copy_null(void) {
    unsigned char dst[8], src[8] = {0};
    assert(fl_pack_copy(NULL, 8, 0, src, 1) == FL_EINVAL);
    assert(fl_pack_copy(dst, 8, 0, NULL, 1) == FL_EINVAL);
}

/* ---------------------------------------------------------------------------------------- */
/* fl_pack_gather                                                                             */

#define ROWS 10
#define ROWB 12

static void make_table(unsigned char *src) {
    for (size_t r = 0; r < ROWS; r++)
        for (size_t b = 0; b < ROWB; b++) src[r * ROWB + b] = (unsigned char)(r * 16 + b);
}

static void test_gather_valid(void) {
    unsigned char src[ROWS * ROWB];
    make_table(src);
    const int64_t idx[] = {3, 0, 9, 3, 7, 1};
    const size_t n = sizeof idx / sizeof idx[0];
    const size_t off = 5;
    unsigned char dst[off + n * ROWB + 7];
    memset(dst, CANARY, sizeof dst);
    size_t bad = 12345;
    assert(fl_pack_gather(dst, sizeof dst, off, src, ROWS, ROWB, idx, n, &bad) == FL_OK);
    assert(bad == 12345); /* untouched on success */
    assert(all_bytes(dst, off, CANARY));
    for (size_t k = 0; k < n; k++) assert(memcmp(dst + off + k * ROWB, src + idx[k] * ROWB, ROWB) == 0);
    assert(all_bytes(dst + off + n * ROWB, 7, CANARY));
    /* bad_k may be NULL */
    memset(dst, CANARY, sizeof dst);
    assert(fl_pack_gather(dst, sizeof dst, off, src, ROWS, ROWB, idx, n, NULL) == FL_OK);
    for (size_t k = 0; k < n; k++) assert(memcmp(dst + off + k * ROWB, src + idx[k] * ROWB, ROWB) == 0);
}

static void test_gather_exact_fit_heap(void) {
    unsigned char src[ROWS * ROWB];
    make_table(src);
    int64_t idx[ROWS];
    for (int i = 0; i < ROWS; i++) idx[i] = ROWS - 1 - i;
    const size_t len = 3 + ROWS * ROWB;
    unsigned char *dst = malloc(len); /* exact size: ASan catches any overrun */
    assert(dst != NULL);
    assert(fl_pack_gather(dst, len, 3, src, ROWS, ROWB, idx, ROWS, NULL) == FL_OK);
    for (size_t k = 0; k < ROWS; k++) assert(memcmp(dst + 3 + k * ROWB, src + idx[k] * ROWB, ROWB) == 0);
    /* one row more does not fit */
    int64_t idx2[ROWS + 1];
    memcpy(idx2, idx, sizeof idx);
    idx2[ROWS] = 0;
    assert(fl_pack_gather(dst, len, 3, src, ROWS, ROWB, idx2, ROWS + 1, NULL) == FL_ERANGE);
    /* nor does the same gather one byte later */
    assert(fl_pack_gather(dst, len, 4, src, ROWS, ROWB, idx, ROWS, NULL) == FL_ERANGE);
    free(dst);
}

static void check_bad_index(int64_t badval) {
    unsigned char src[ROWS * ROWB];
    make_table(src);
    int64_t idx[] = {2, 4, 6, 8, 1};
    const size_t n = sizeof idx / sizeof idx[0];
    for (size_t pos = 0; pos < n; pos++) {
        int64_t v[sizeof idx / sizeof idx[0]];
        memcpy(v, idx, sizeof idx);
        v[pos] = badval;
        unsigned char dst[n * ROWB];
        memset(dst, CANARY, sizeof dst);
        size_t bad = 999;
        assert(fl_pack_gather(dst, sizeof dst, 0, src, ROWS, ROWB, v, n, &bad) == FL_ERANGE);
        assert(bad == pos);
        /* rows before the bad one were copied, nothing at or past it */
        for (size_t k = 0; k < pos; k++) assert(memcmp(dst + k * ROWB, src + v[k] * ROWB, ROWB) == 0);
        assert(all_bytes(dst + pos * ROWB, (n - pos) * ROWB, CANARY));
        /* bad_k = NULL is allowed */
        assert(fl_pack_gather(dst, sizeof dst, 0, src, ROWS, ROWB, v, n, NULL) == FL_ERANGE);
    }
}

static void test_gather_negative_index(void) {
    check_bad_index(-1);
    check_bad_index(INT64_MIN);
}

static void test_gather_index_eq_rows(void) {
    check_bad_index(ROWS);
    check_bad_index(ROWS + 1);
    check_bad_index(INT64_MAX);
    /* the first bad index wins */
    unsigned char src[ROWS * ROWB], dst[4 * ROWB];
    make_table(src);
    const int64_t v[] = {0, ROWS, -1, 3};
    size_t bad = 0;
    assert(fl_pack_gather(dst, sizeof dst, 0, src, ROWS, ROWB, v, 4, &bad) == FL_ERANGE);
    assert(bad == 1);
    /* an empty table rejects every index */
    bad = 7;
    assert(fl_pack_gather(dst, sizeof dst, 0, src, 0, ROWB, v, 1, &bad) == FL_ERANGE);
    assert(bad == 0);
}

static void test_gather_dst_overflow(void) {
    unsigned char src[ROWS * ROWB];
    make_table(src);
    const int64_t v[] = {1, 2, 3, 4};
    unsigned char dst[4 * ROWB];
    memset(dst, CANARY, sizeof dst);
    size_t bad = 4242;
    /* dst too small by one byte: rejected before anything is copied */
    assert(fl_pack_gather(dst, 4 * ROWB - 1, 0, src, ROWS, ROWB, v, 4, &bad) == FL_ERANGE);
    assert(fl_pack_gather(dst, 4 * ROWB, 1, src, ROWS, ROWB, v, 4, &bad) == FL_ERANGE);
    /* offset past the end */
    assert(fl_pack_gather(dst, 4 * ROWB, 4 * ROWB + 1, src, ROWS, ROWB, v, 1, &bad) == FL_ERANGE);
    assert(fl_pack_gather(dst, 4 * ROWB, SIZE_MAX, src, ROWS, ROWB, v, 1, &bad) == FL_ERANGE);
    /* offset exactly at the end: no room for a row */
    assert(fl_pack_gather(dst, 4 * ROWB, 4 * ROWB, src, ROWS, ROWB, v, 1, &bad) == FL_ERANGE);
    assert(all_bytes(dst, sizeof dst, CANARY));
    assert(bad == 4242); /* a size error is not an index error */

    /* n * row_bytes overflows size_t: it wraps to a small number that would "fit" */
    const size_t big_row = (SIZE_MAX / 2) + 1; /* 2 * big_row == 0 (mod 2^64) */
    assert(fl_pack_gather(dst, sizeof dst, 0, src, ROWS, big_row, v, 2, &bad) == FL_ERANGE);
    const size_t row3 = SIZE_MAX / 3 + 1;       /* 3 * row3 wraps to 2 */
    assert(fl_pack_gather(dst, sizeof dst, 0, src, ROWS, row3, v, 3, &bad) == FL_ERANGE);
    /* n huge, row small: n * 8 wraps to 8, which would fit in dst */
    assert(fl_pack_gather(dst, sizeof dst, 0, src, ROWS, 8, v, SIZE_MAX / 8 + 2, &bad) == FL_ERANGE);
    assert(fl_pack_gather(dst, SIZE_MAX, 0, src, ROWS, 8, v, SIZE_MAX / 4, &bad) == FL_ERANGE);
    /* offset + n * row_bytes wraps */
    assert(fl_pack_gather(dst, SIZE_MAX, SIZE_MAX - 8, src, ROWS, 8, v, 2, &bad) == FL_ERANGE);
    assert(all_bytes(dst, sizeof dst, CANARY));
    assert(bad == 4242);
}

static void test_gather_empty_and_null(void) {
    unsigned char src[ROWS * ROWB], dst[ROWB];
    make_table(src);
    memset(dst, CANARY, sizeof dst);
    const int64_t v[] = {-5};
    /* n == 0: nothing to do, even with a bad index array or a zero-size dst */
    assert(fl_pack_gather(dst, 0, 0, src, ROWS, ROWB, v, 0, NULL) == FL_OK);
    assert(fl_pack_gather(NULL, 0, 0, NULL, 0, ROWB, NULL, 0, NULL) == FL_OK);
    assert(all_bytes(dst, sizeof dst, CANARY));
    const int64_t ok[] = {0};
    assert(fl_pack_gather(NULL, ROWB, 0, src, ROWS, ROWB, ok, 1, NULL) == FL_EINVAL);
    assert(fl_pack_gather(dst, ROWB, 0, NULL, ROWS, ROWB, ok, 1, NULL) == FL_EINVAL);
    assert(fl_pack_gather(dst, ROWB, 0, src, ROWS, ROWB, NULL, 1, NULL) == FL_EINVAL);
}

/* ---------------------------------------------------------------------------------------- */
/* fl_pack_align                                                                              */

static void test_align_powers_of_two(void) {
    assert(fl_pack_align(0, 1) == 0);
    assert(fl_pack_align(5, 1) == 5);
    assert(fl_pack_align(1, 8) == 8);
    assert(fl_pack_align(8, 8) == 8);
    assert(fl_pack_align(9, 8) == 16);
    assert(fl_pack_align(0, 64) == 0);
    assert(fl_pack_align(1, 64) == 64);
    assert(fl_pack_align(127, 128) == 128);
    assert(fl_pack_align(129, 128) == 256);
    assert(fl_pack_align(4097, 4096) == 8192);
    for (unsigned sh = 0; sh < 63; sh++) {
        size_t a = (size_t)1 << sh;
        assert(fl_pack_align(a, a) == a);
        assert(fl_pack_align(a + 1, a) == (sh == 0 ? a + 1 : 2 * a));
        if (a > 1) assert(fl_pack_align(a - 1, a) == a);
        size_t r = fl_pack_align(12345, a);
        assert(r >= 12345 && r % a == 0 && r - 12345 < a);
    }
    /* the largest representable results */
    const size_t top = (size_t)1 << 63;
    assert(fl_pack_align(top, top) == top);
    assert(fl_pack_align(1, top) == top);
    assert(fl_pack_align(SIZE_MAX, 1) == SIZE_MAX);
    assert(fl_pack_align(SIZE_MAX - 7, 8) == SIZE_MAX - 7);
}

static void test_align_non_power(void) {
    const size_t bad[] = {0, 3, 6, 12, 24, 100, 4095, SIZE_MAX, ((size_t)1 << 63) + 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert(fl_pack_align(0, bad[i]) == 0);
        assert(fl_pack_align(17, bad[i]) == 0);
        assert(fl_pack_align(4096, bad[i]) == 0);
    }
}

static void test_align_overflow(void) {
    assert(fl_pack_align(SIZE_MAX, 2) == 0);
    assert(fl_pack_align(SIZE_MAX - 6, 8) == 0); /* would need SIZE_MAX + 1 */
    assert(fl_pack_align(SIZE_MAX - 126, 128) == 0);
    assert(fl_pack_align(SIZE_MAX - 127, 128) == SIZE_MAX - 127); /* already aligned: fits */
    assert(fl_pack_align(((size_t)1 << 63) + 1, (size_t)1 << 63) == 0);
    assert(fl_pack_align(SIZE_MAX, (size_t)1 << 63) == 0);
    assert(fl_pack_align(SIZE_MAX - 4094, 4096) == 0);
}

int main(int argc, char **argv) {
    static const fl_test_case tests[] = {
        FL_TEST(test_copy_basic),
        FL_TEST(test_copy_exact_fit),
        FL_TEST(test_copy_zero_bytes),
        FL_TEST(test_copy_offset_past_end),
        FL_TEST(test_copy_nbytes_past_end),
        FL_TEST(test_copy_size_overflow),
        FL_TEST(test_copy_null),
        FL_TEST(test_gather_valid),
        FL_TEST(test_gather_exact_fit_heap),
        FL_TEST(test_gather_negative_index),
        FL_TEST(test_gather_index_eq_rows),
        FL_TEST(test_gather_dst_overflow),
        FL_TEST(test_gather_empty_and_null),
        FL_TEST(test_align_powers_of_two),
        FL_TEST(test_align_non_power),
        FL_TEST(test_align_overflow),
    };
    return fl_test_main("test_pack", tests, sizeof tests / sizeof tests[0], argc, argv);
}
