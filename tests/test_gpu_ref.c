/*
 * The GPU kernels' host references (src/gpu/ref.c), on the CPU: every SGEMM variant's blocking,
 * emulated thread by thread, gives the bits of one fmaf chain per element and stays within the
 * documented error bound of the exact product; the bound catches a wrong element; the compare
 * rule counts what differs per copy (NaN included, differences within the tolerance not); and
 * each memory test finds the faults it is for (bit flips, a stuck address line, a misplaced
 * word, a stuck bit) at the right words.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "gpu/ref.h"

/* Every variant on a problem two tiles wide each way: the tiled emulation equals the fmaf
 * chain bit for bit, and both are within RK_SGEMM_REL_BOUND of the exact product. */
static void test_sgemm_variants(void **state)
{
    (void)state;
    const int m = 256, n = 256, k = 96;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
    float *c1 = malloc(sizeof(float) * m * n), *c2 = malloc(sizeof(float) * m * n);
    assert_true(a && b && c1 && c2);
    rk_ref_fill_input(a, (size_t)m * k, 1);
    rk_ref_fill_input(b, (size_t)k * n, 2);
    rk_ref_sgemm_fma(a, b, c1, m, n, k);
    assert_int_equal(rk_ref_sgemm_outside_bound(c1, a, b, m, n, k), 0);
    assert_true(rk_sgemm_variant_count >= 3);
    for (int v = 0; v < rk_sgemm_variant_count; v++) {
        const rk_sgemm_variant *var = &rk_sgemm_variants[v];
        assert_int_equal(rk_sgemm_variant_find(var->name), v);
        assert_true(rk_sgemm_variant_threads(var) <= 1024);
        memset(c2, 0xff, sizeof(float) * m * n); /* NaNs: an element not written shows */
        assert_true(rk_ref_sgemm_tiled(var, a, b, c2, m, n, k));
        assert_memory_equal(c1, c2, sizeof(float) * m * n);
    }
    assert_int_equal(rk_sgemm_variant_find("rk_sgemm_nope"), -1);
    free(a), free(b), free(c1), free(c2);
}

/* Sizes that are not a multiple of the tiles are refused, nothing written. */
static void test_sgemm_fits(void **state)
{
    (void)state;
    const rk_sgemm_variant *v = &rk_sgemm_variants[0];
    assert_true(rk_sgemm_variant_fits(v, v->bm, v->bn, v->bk));
    assert_false(rk_sgemm_variant_fits(v, v->bm + 1, v->bn, v->bk));
    assert_false(rk_sgemm_variant_fits(v, v->bm, v->bn, v->bk + 1));
    assert_false(rk_sgemm_variant_fits(v, 0, v->bn, v->bk));
    float x = 7.0f;
    assert_false(rk_ref_sgemm_tiled(v, &x, &x, &x, 1, 1, 1));
    assert_true(x == 7.0f);
}

/* The bound is tight enough to catch a wrong element: one low mantissa bit flipped in one
 * result element of a K = 512 product puts exactly that element outside. */
static void test_sgemm_bound_catches(void **state)
{
    (void)state;
    const int m = 32, n = 32, k = 512;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
    float *c = malloc(sizeof(float) * m * n);
    assert_true(a && b && c);
    rk_ref_fill_input(a, (size_t)m * k, 3);
    rk_ref_fill_input(b, (size_t)k * n, 4);
    rk_ref_sgemm_fma(a, b, c, m, n, k);
    assert_int_equal(rk_ref_sgemm_outside_bound(c, a, b, m, n, k), 0);
    uint32_t w;
    memcpy(&w, &c[77], 4);
    w ^= 1u << 14; /* 2^-9 relative: far beyond k * 2^-24 = 2^-15 */
    memcpy(&c[77], &w, 4);
    assert_int_equal(rk_ref_sgemm_outside_bound(c, a, b, m, n, k), 1);
    c[5] = NAN;
    assert_int_equal(rk_ref_sgemm_outside_bound(c, a, b, m, n, k), 2);
    free(a), free(b), free(c);
}

/* The inputs are exact multiples of 2^-24 in [0, 1), and the same for the same seed. */
static void test_inputs(void **state)
{
    (void)state;
    float p[4096], q[4096];
    rk_ref_fill_input(p, 4096, 9);
    rk_ref_fill_input(q, 4096, 9);
    assert_memory_equal(p, q, sizeof p);
    double sum = 0;
    for (int i = 0; i < 4096; i++) {
        assert_true(p[i] >= 0.0f && p[i] < 1.0f);
        assert_true(ldexpf(p[i], 24) == floorf(ldexpf(p[i], 24)));
        sum += p[i];
    }
    assert_true(fabs(sum / 4096 - 0.5) < 0.03); /* roughly uniform */
    rk_ref_fill_input(q, 4096, 10);
    assert_memory_not_equal(p, q, sizeof p);
}

/* Copies 3 and 7 wrong: counted per copy. NaN is wrong; a difference within the tolerance is
 * not; one just above it is. */
static void test_compare(void **state)
{
    (void)state;
    enum { N = 1000, COPIES = 9 };
    static float c[N * COPIES];
    for (int k = 0; k < COPIES; k++)
        rk_ref_fill_input(c + (size_t)k * N, N, 5);
    uint64_t f[COPIES];
    rk_ref_compare(c, N, COPIES, RK_CMP_TOLERANCE, f);
    for (int k = 0; k < COPIES; k++)
        assert_int_equal(f[k], 0);
    c[3 * N + 10] += 1.0f;
    c[3 * N + 11] = NAN;
    c[7 * N + 999] -= 0.5f;
    c[5 * N + 20] += 0.5f * RK_CMP_TOLERANCE; /* within */
    c[6 * N + 21] += 2.0f * RK_CMP_TOLERANCE; /* above */
    rk_ref_compare(c, N, COPIES, RK_CMP_TOLERANCE, f);
    assert_int_equal(f[3], 2);
    assert_int_equal(f[5], 0);
    assert_int_equal(f[6], 1);
    assert_int_equal(f[7], 1);
    assert_int_equal(f[1] + f[2] + f[4] + f[8], 0);
    /* a NaN in copy 0 makes every copy wrong there */
    c[0] = NAN;
    rk_ref_compare(c, N, COPIES, RK_CMP_TOLERANCE, f);
    assert_int_equal(f[1], 1);
    assert_int_equal(f[3], 3);
}

enum { WORDS = 1 << 16 };

/* Bit flips at chosen words: each checker counts exactly those and names the lowest. */
static void test_mt_bit_flips(void **state)
{
    (void)state;
    static uint32_t p[WORDS];
    const uint64_t flips[] = {40000, 123, 65535};
    uint64_t first;
    for (int kind = 0; kind < 4; kind++) {
        uint32_t pat = rk_mt_inversion_pattern(kind);
        if (kind == 0)
            rk_ref_mt_own_write(p, WORDS, 0x7f0000000000ull);
        else if (kind == 1)
            rk_ref_mt_random_write(p, WORDS, 77, 1024);
        else
            rk_ref_mt_fill(p, WORDS, pat);
        uint64_t clean = kind == 0   ? rk_ref_mt_own_check(p, WORDS, 0x7f0000000000ull, &first)
                         : kind == 1 ? rk_ref_mt_random_check(p, WORDS, 77, 1024, &first)
                                     : rk_ref_mt_check(p, WORDS, pat, &first);
        assert_int_equal(clean, 0);
        assert_true(first == UINT64_MAX);
        for (int f = 0; f < 3; f++)
            p[flips[f]] ^= 1u << (f * 11);
        uint64_t bad = kind == 0   ? rk_ref_mt_own_check(p, WORDS, 0x7f0000000000ull, &first)
                       : kind == 1 ? rk_ref_mt_random_check(p, WORDS, 77, 1024, &first)
                                   : rk_ref_mt_check(p, WORDS, pat, &first);
        assert_int_equal(bad, 3);
        assert_int_equal(first, 123);
    }
}

/* A stuck address line: memory where address bit 9 is ignored (words i and i | 512 are one
 * cell). Walking ones on the address lines finds it; with every line working it finds nothing. */
static void test_mt_address_line(void **state)
{
    (void)state;
    static uint32_t cell[WORDS], p[WORDS];
    assert_int_equal(rk_mt_lines(WORDS), 17); /* word 0 and 2^0 .. 2^15 */
    assert_int_equal(rk_mt_lines(1), 1);
    assert_int_equal(rk_mt_lines(0), 0);
    rk_ref_mt_lines_write(p, WORDS);
    uint64_t first;
    assert_int_equal(rk_ref_mt_lines_check(p, WORDS, &first), 0);
    /* the faulty memory: write through the aliasing, read through it */
    memset(cell, 0, sizeof cell);
    for (int l = 0; l < rk_mt_lines(WORDS); l++)
        cell[rk_mt_line_index(l) & ~(uint64_t)512] = rk_mt_line_value(l);
    for (uint64_t i = 0; i < WORDS; i++)
        p[i] = cell[i & ~(uint64_t)512];
    /* line 10 (word 512) overwrote line 0 (word 0): both read 512's value */
    assert_int_equal(rk_ref_mt_lines_check(p, WORDS, &first), 1);
    assert_int_equal(first, 0);
}

/* Own address: two words swapped (written at each other's place) are both found. */
static void test_mt_misplaced(void **state)
{
    (void)state;
    static uint32_t p[WORDS];
    rk_ref_mt_own_write(p, WORDS, 0x10000);
    uint32_t t = p[100];
    p[100] = p[9000];
    p[9000] = t;
    uint64_t first;
    assert_int_equal(rk_ref_mt_own_check(p, WORDS, 0x10000, &first), 2);
    assert_int_equal(first, 100);
    /* every word differs from its neighbours: a shifted copy is wrong everywhere */
    memmove(p, p + 1, sizeof(uint32_t) * (WORDS - 1));
    assert_int_equal(rk_ref_mt_own_check(p, WORDS - 1, 0x10000, &first), WORDS - 1);
}

/* Moving inversions: a bit stuck at 1 in word 5000 is caught by the pattern with that bit 0 or
 * its inversion, whichever holds it 0; a healthy pass inverts every word. */
static void test_mt_inversions(void **state)
{
    (void)state;
    static uint32_t p[WORDS];
    uint64_t first, total = 0;
    for (int k = 0; k < RK_MT_INVERSION_PATTERNS; k++) {
        uint32_t pat = rk_mt_inversion_pattern(k);
        rk_ref_mt_fill(p, WORDS, pat);
        p[5000] |= 1u << 3; /* stuck */
        uint64_t a = rk_ref_mt_check_invert(p, WORDS, pat, &first);
        assert_int_equal(first, a ? 5000 : UINT64_MAX);
        assert_int_equal(p[1], ~pat);
        p[5000] |= 1u << 3;
        uint64_t b = rk_ref_mt_check(p, WORDS, ~pat, &first);
        assert_int_equal(first, b ? 5000 : UINT64_MAX);
        assert_int_equal(a + b, 1); /* exactly one phase has bit 3 at 0 */
        total += a + b;
    }
    assert_int_equal(total, RK_MT_INVERSION_PATTERNS);
}

/* The random pattern depends on the seed and on the thread count, as the kernels write it. */
static void test_mt_random(void **state)
{
    (void)state;
    static uint32_t p[WORDS];
    uint64_t first;
    rk_ref_mt_random_write(p, WORDS, 1, 4096);
    assert_int_equal(rk_ref_mt_random_check(p, WORDS, 1, 4096, &first), 0);
    assert_true(rk_ref_mt_random_check(p, WORDS, 2, 4096, &first) > WORDS - 16);
    assert_true(rk_ref_mt_random_check(p, WORDS, 1, 2048, &first) > WORDS / 2);
    /* no thread's stream is stuck at zero */
    for (int i = 0; i < WORDS; i++)
        assert_true(p[i] != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgemm_variants),
        cmocka_unit_test(test_sgemm_fits),
        cmocka_unit_test(test_sgemm_bound_catches),
        cmocka_unit_test(test_inputs),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_mt_bit_flips),
        cmocka_unit_test(test_mt_address_line),
        cmocka_unit_test(test_mt_misplaced),
        cmocka_unit_test(test_mt_inversions),
        cmocka_unit_test(test_mt_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
