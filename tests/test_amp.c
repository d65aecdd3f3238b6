/*
 * Mixed precision (rekindle/amp.h). Conversions: all 65,536 fp16 and all 65,536 bf16 bit
 * patterns decode to what an independent decoder written here from the IEEE definition (with
 * ldexp) gives, and encode back to the same bits; every midpoint between adjacent fp16
 * values ties to the even one and one fp32 ulp either side goes down / up; the overflow
 * threshold 65520 and the subnormal edge 2^-25; bf16 rounding of random and tie values
 * against a reference done in double; NaNs never become inf; the bulk forms, portable and
 * (where the CPU has it) F16C, equal the scalar ones. Loss scaler: growth after exactly
 * growth_interval clean steps, backoff and skip, floor and cap, hysteresis both ways, the
 * same scales as a transcription of DeepSpeed's update rule over random overflow sequences;
 * its checkpoint tensors' names and values, their round trip (through a real checkpoint too),
 * and every missing, mistyped or impossible one rejected with the tensor named, the binary
 * blob of earlier versions refused. Unscale: inf and NaN found at every position class, every
 * element multiplied.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "items_file.h"
#include "rekindle/amp.h"
#include "rekindle/ckpt.h"
#include "rekindle/rng.h"

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- reference decoders, straight from the IEEE 754 definitions ---- */

/* binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits */
static double ref_f16(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 0x3ff;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, 1 - 15 - 10);
    else
        v = ldexp(1024 + m, e - 15 - 10);
    return copysign(v, (h & 0x8000) ? -1.0 : 1.0);
}

/* bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits */
static double ref_bf16(uint16_t h)
{
    int e = (h >> 7) & 255, m = h & 0x7f;
    double v;
    if (e == 255)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, 1 - 127 - 7);
    else
        v = ldexp(128 + m, e - 127 - 7);
    return copysign(v, (h & 0x8000) ? -1.0 : 1.0);
}

/* ---- conversions ---- */

static void f16_every_pattern_decodes_and_round_trips(void **state)
{
    (void)state;
    int nans = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = rk_f16_to_f32(h);
        double ref = ref_f16(h);
        assert_int_equal(!!signbit(f), !!(h & 0x8000));
        uint16_t back = rk_f32_to_f16(f);
        if (isnan(ref)) {
            nans++;
            assert_true(isnan(f));
            /* quiet, sign and payload kept */
            assert_int_equal(fbits(f), ((uint32_t)(h & 0x8000) << 16) | 0x7fc00000u |
                                           ((uint32_t)(h & 0x3ff) << 13));
            assert_true(isnan(ref_f16(back)));
            assert_int_equal(back & 0x8000, h & 0x8000);
            assert_int_equal(back, h | 0x0200); /* the quiet bit, nothing else changed */
        } else {
            if ((double)f != ref)
                fail_msg("fp16 %04x decodes to %a, reference %a", h, (double)f, ref);
            if (back != h)
                fail_msg("fp16 %04x -> %a -> %04x", h, (double)f, back);
        }
    }
    assert_int_equal(nans, 2 * 1023);
}

static void bf16_every_pattern_decodes_and_round_trips(void **state)
{
    (void)state;
    int nans = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = rk_bf16_to_f32(h);
        double ref = ref_bf16(h);
        assert_int_equal(!!signbit(f), !!(h & 0x8000));
        uint16_t back = rk_f32_to_bf16(f);
        if (isnan(ref)) {
            nans++;
            assert_true(isnan(f));
            assert_int_equal(fbits(f), ((uint32_t)h << 16) | 0x00400000u);
            assert_true(isnan(ref_bf16(back)));
            assert_int_equal(back, h | 0x0040);
        } else {
            if ((double)f != ref)
                fail_msg("bf16 %04x decodes to %a, reference %a", h, (double)f, ref);
            if (back != h)
                fail_msg("bf16 %04x -> %a -> %04x", h, (double)f, back);
        }
    }
    assert_int_equal(nans, 2 * 127);
}

/* Every midpoint between adjacent finite fp16 values, both signs: the tie goes to the even
 * pattern, one fp32 ulp below goes down, one above goes up (away from zero). */
static void f16_rounds_ties_to_even_at_every_midpoint(void **state)
{
    (void)state;
    for (uint16_t h = 0; h < 0x7bff; h++) {
        double lo = ref_f16(h), hi = ref_f16((uint16_t)(h + 1));
        double mid_d = (lo + hi) / 2;
        float mid = (float)mid_d;
        assert_true((double)mid == mid_d); /* exact in fp32: 12 significant bits */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : h;
        for (int neg = 0; neg < 2; neg++) {
            float m = neg ? -mid : mid;
            uint16_t s = neg ? 0x8000 : 0;
            uint16_t got = rk_f32_to_f16(m);
            if (got != (even | s))
                fail_msg("midpoint %a -> %04x, expected %04x", (double)m, got, even | s);
            assert_int_equal(rk_f32_to_f16(nextafterf(m, 0)), h | s);
            assert_int_equal(rk_f32_to_f16(nextafterf(m, neg ? -INFINITY : INFINITY)), (h + 1) | s);
        }
    }
}

static void f16_overflow_and_subnormal_edges(void **state)
{
    (void)state;
    /* 65520 is the midpoint between 65504 (0x7bff, odd) and 2^16: the tie rounds up to inf */
    assert_int_equal(rk_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(rk_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(rk_f32_to_f16(nextafterf(65520.0f, 0)), 0x7bff);
    assert_int_equal(rk_f32_to_f16(nextafterf(65520.0f, INFINITY)), 0x7c00);
    assert_int_equal(rk_f32_to_f16(-65520.0f), 0xfc00);
    assert_int_equal(rk_f32_to_f16(-nextafterf(65520.0f, 0)), 0xfbff);
    assert_int_equal(rk_f32_to_f16(65536.0f), 0x7c00);
    assert_int_equal(rk_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(rk_f32_to_f16(FLT_MAX), 0x7c00);
    assert_int_equal(rk_f32_to_f16(-FLT_MAX), 0xfc00);
    assert_int_equal(rk_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(rk_f32_to_f16(-INFINITY), 0xfc00);
    /* 2^-24 is the smallest subnormal; half of it ties to 0 (even); just above goes up */
    const float tiny = 0x1p-24f, half = 0x1p-25f;
    assert_int_equal(rk_f32_to_f16(tiny), 0x0001);
    assert_int_equal(rk_f32_to_f16(half), 0x0000);
    assert_int_equal(rk_f32_to_f16(-half), 0x8000);
    assert_int_equal(rk_f32_to_f16(nextafterf(half, 1)), 0x0001);
    assert_int_equal(rk_f32_to_f16(-nextafterf(half, 1)), 0x8001);
    assert_int_equal(rk_f32_to_f16(nextafterf(half, 0)), 0x0000);
    assert_int_equal(rk_f32_to_f16(1.5f * tiny), 0x0002); /* tie between 1 and 2: even */
    assert_int_equal(rk_f32_to_f16(2.5f * tiny), 0x0002); /* tie between 2 and 3: even */
    /* the largest subnormal rounds up into the smallest normal */
    assert_int_equal(rk_f32_to_f16(nextafterf(0x1p-14f, 0)), 0x0400);
    assert_int_equal(rk_f32_to_f16(0x1p-14f), 0x0400);
    assert_int_equal(rk_f32_to_f16(1023 * tiny), 0x03ff);
    /* fp32 subnormals and zeros keep their sign */
    assert_int_equal(rk_f32_to_f16(FLT_TRUE_MIN), 0x0000);
    assert_int_equal(rk_f32_to_f16(-FLT_TRUE_MIN), 0x8000);
    assert_int_equal(rk_f32_to_f16(0.0f), 0x0000);
    assert_int_equal(rk_f32_to_f16(-0.0f), 0x8000);
    assert_true(signbit(rk_f16_to_f32(0x8000)));
    assert_int_equal(rk_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(rk_f32_to_f16(-2.0f), 0xc000);
}

/* A NaN is never inf: fp32 NaNs whose payload is only in the bits that are dropped. */
static void nans_stay_nans(void **state)
{
    (void)state;
    const uint32_t nans[] = {0x7f800001u, 0x7f800fffu, 0x7f801000u, 0x7f80ffffu, 0x7f810000u,
                             0x7fc00000u, 0x7fffffffu, 0x7fbfffffu, 0x7f802000u};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++)
        for (int neg = 0; neg < 2; neg++) {
            uint32_t u = nans[i] | (neg ? 0x80000000u : 0);
            uint16_t h = rk_f32_to_f16(bitsf(u)), b = rk_f32_to_bf16(bitsf(u));
            assert_true(isnan(ref_f16(h)));
            assert_true(isnan(ref_bf16(b)));
            assert_int_equal(h & 0x8000, neg ? 0x8000 : 0);
            assert_int_equal(b & 0x8000, neg ? 0x8000 : 0);
            assert_true(h & 0x0200); /* quiet */
            assert_true(b & 0x0040);
            /* the top payload bits that fit are kept */
            assert_int_equal(h & 0x1ff, (u >> 13) & 0x1ff);
            assert_int_equal(b & 0x3f, (u >> 16) & 0x3f);
        }
}

/* bf16 nearest-even reference in double: the two bf16 neighbours of |x| (toward zero:
 * truncation; away: the next pattern, where inf stands for 2^128 as IEEE's unbounded
 * exponent says), distances in exact double arithmetic, a tie to the even pattern. */
static uint16_t ref_to_bf16(float x)
{
    uint32_t u = fbits(x);
    uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
    if (a == 0x7f800000u)
        return (uint16_t)((sign | a) >> 16);
    uint32_t lo = a & 0xffff0000u, hi = lo + 0x10000u;
    double dx = (double)bitsf(a), dlo = (double)bitsf(lo);
    double dhi = hi == 0x7f800000u ? ldexp(1, 128) : (double)bitsf(hi);
    double below = dx - dlo, above = dhi - dx;
    uint32_t r;
    if (below < above)
        r = lo;
    else if (above < below)
        r = hi;
    else
        r = (lo & 0x10000u) ? hi : lo;
    return (uint16_t)((sign | r) >> 16);
}

static void bf16_rounds_like_a_double_reference(void **state)
{
    (void)state;
    rk_rng r;
    rk_rng_seed(&r, 11);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rk_rng_next(&r);
        /* any bits; an exact tie; one fp32 ulp either side of a tie; a value in [1, 2) */
        switch (i % 4) {
        case 0: break;
        case 1: u = (u & 0xffff0000u) | 0x8000u; break;
        case 2: u = ((u & 0xffff0000u) | 0x8000u) + ((i & 8) ? 1u : -1u); break;
        case 3: u = (u & 0x807fffffu) | (127u << 23); break;
        }
        float x = bitsf(u);
        if (isnan(x))
            continue;
        uint16_t got = rk_f32_to_bf16(x), want = ref_to_bf16(x);
        if (got != want)
            fail_msg("bf16 of %08x: %04x, reference %04x", u, got, want);
    }
    /* the edges by hand */
    assert_int_equal(rk_f32_to_bf16(FLT_MAX), 0x7f80); /* above the overflow midpoint */
    assert_int_equal(rk_f32_to_bf16(bitsf(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(rk_f32_to_bf16(bitsf(0x7f7f8000u)), 0x7f80); /* tie, 0x7f7f odd: up */
    assert_int_equal(rk_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(rk_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(rk_f32_to_bf16(FLT_TRUE_MIN), 0x0000);       /* 2^-149: under half of 2^-133 */
    assert_int_equal(rk_f32_to_bf16(bitsf(0x00008000u)), 0x0000); /* subnormal tie: even */
    assert_int_equal(rk_f32_to_bf16(bitsf(0x00018000u)), 0x0002);
    assert_int_equal(rk_f32_to_bf16(1.0f), 0x3f80);
}

static float special_f32(rk_rng *r)
{
    static const uint32_t specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
        0x7f800001u, 0xff800001u, 0x7fffffffu, 0x477ff000u, 0x477fefffu, 0xc77ff000u,
        0x33000000u, 0x33000001u, 0xb3000000u, 0x33800000u, 0x387fffffu, 0x38800000u,
        0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x7f7f8000u, 0x3f808000u, 0x3f818000u};
    return bitsf(specials[rk_rng_below(r, sizeof specials / sizeof *specials)]);
}

static void bulk_equals_scalar(void **state)
{
    (void)state;
    enum { N = (1 << 20) + 13 };
    float *f = malloc((N + 1) * sizeof *f), *g = malloc((N + 1) * sizeof *g);
    uint16_t *h = malloc((N + 1) * sizeof *h);
    assert_non_null(f);
    assert_non_null(g);
    assert_non_null(h);
    rk_rng r;
    rk_rng_seed(&r, 5);
    for (size_t i = 0; i <= N; i++) {
        switch (rk_rng_below(&r, 4)) {
        case 0: f[i] = special_f32(&r); break;
        case 1: f[i] = bitsf((uint32_t)rk_rng_next(&r)); break;
        case 2: f[i] = rk_rng_normal(&r) * 1e-5f; break; /* fp16 subnormal range */
        default: f[i] = rk_rng_normal(&r) * 1000.0f; break;
        }
    }
    uint16_t *all = malloc(65536 * sizeof *all), *h2 = malloc((N + 1) * sizeof *h2);
    assert_non_null(all);
    assert_non_null(h2);
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    for (size_t i = 0; i <= N; i++)
        h2[i] = (uint16_t)rk_rng_next(&r);
    /* the portable loops, then F16C where this CPU has it */
    assert_int_equal(rk_half_use_f16c(0), 0);
    for (int hw = 0; hw < 2; hw++) {
        if (hw && !rk_half_use_f16c(1))
            break;
        /* from offset 1 as well: the blocks are not aligned */
        for (int off = 0; off < 2; off++) {
            rk_f32_to_f16_n(f + off, h, N);
            for (size_t i = 0; i < N; i++)
                if (h[i] != rk_f32_to_f16(f[off + i]))
                    fail_msg("f32_to_f16_n[%zu] of %08x (f16c %d)", i, fbits(f[off + i]), hw);
            rk_f32_to_bf16_n(f + off, h, N);
            for (size_t i = 0; i < N; i++)
                if (h[i] != rk_f32_to_bf16(f[off + i]))
                    fail_msg("f32_to_bf16_n[%zu] of %08x", i, fbits(f[off + i]));
        }
        /* decoding: every pattern, then random ones */
        rk_f16_to_f32_n(all, g, 65536);
        for (uint32_t i = 0; i < 65536; i++)
            assert_int_equal(fbits(g[i]), fbits(rk_f16_to_f32(all[i])));
        rk_bf16_to_f32_n(all, g, 65536);
        for (uint32_t i = 0; i < 65536; i++)
            assert_int_equal(fbits(g[i]), fbits(rk_bf16_to_f32(all[i])));
        for (int off = 0; off < 2; off++) {
            rk_f16_to_f32_n(h2 + off, g, N);
            for (size_t i = 0; i < N; i++)
                assert_int_equal(fbits(g[i]), fbits(rk_f16_to_f32(h2[off + i])));
            rk_bf16_to_f32_n(h2 + off, g, N);
            for (size_t i = 0; i < N; i++)
                assert_int_equal(fbits(g[i]), fbits(rk_bf16_to_f32(h2[off + i])));
        }
        /* short lengths write exactly n elements */
        for (size_t n = 0; n < 40; n++) {
            uint16_t out[41];
            memset(out, 0xab, sizeof out);
            rk_f32_to_f16_n(f, out, n);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(out[i], rk_f32_to_f16(f[i]));
            assert_int_equal(out[n], 0xabab);
            float outf[41];
            memset(outf, 0xab, sizeof outf);
            rk_f16_to_f32_n(h2, outf, n);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(fbits(outf[i]), fbits(rk_f16_to_f32(h2[i])));
            assert_int_equal(fbits(outf[n]), 0xabababab);
            rk_bf16_to_f32_n(h2, outf, n);
            assert_int_equal(fbits(outf[n]), 0xabababab);
            rk_f32_to_bf16_n(f, out, n);
            assert_int_equal(out[n], 0xabab);
        }
    }
    free(h2);
    free(all);
    free(f);
    free(g);
    free(h);
}

static void dtypes_parse_and_name(void **state)
{
    (void)state;
    const rk_dtype all[] = {RK_F32, RK_F16, RK_BF16};
    const size_t sizes[] = {4, 2, 2};
    for (int i = 0; i < 3; i++) {
        rk_dtype t = RK_F32;
        assert_int_equal(rk_dtype_parse(rk_dtype_name(all[i]), &t), RK_OK);
        assert_int_equal(t, all[i]);
        assert_int_equal(rk_dtype_size(all[i]), sizes[i]);
    }
    assert_string_equal(rk_dtype_name(RK_F16), "fp16");
    assert_string_equal(rk_dtype_name(RK_BF16), "bf16");
    assert_string_equal(rk_dtype_name(RK_F32), "fp32");
    assert_string_equal(rk_dtype_name((rk_dtype)7), "?");
    assert_int_equal(rk_dtype_size((rk_dtype)7), 0);
    const char *bad[] = {"", "FP16", "fp", "fp16 ", "f16", "bfloat16", "fp64", "bf16x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rk_dtype t = RK_BF16;
        assert_int_equal(rk_dtype_parse(bad[i], &t), RK_EINVAL);
        assert_int_equal(t, RK_BF16); /* untouched */
    }
    rk_dtype t;
    assert_int_equal(rk_dtype_parse(NULL, &t), RK_EINVAL);
    assert_int_equal(rk_dtype_parse("fp16", NULL), RK_EINVAL);
}

/* ---- unscale ---- */

static void unscale_finds_inf_and_nan_anywhere(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 2, 15, 16, 17, 31, 32, 33, 1000, 4099};
    const float bads[] = {INFINITY, -INFINITY, NAN, -NAN};
    float *g = malloc(4099 * sizeof *g), *orig = malloc(4099 * sizeof *orig);
    assert_non_null(g);
    assert_non_null(orig);
    rk_rng r;
    rk_rng_seed(&r, 9);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        for (size_t i = 0; i < n; i++)
            orig[i] = rk_rng_normal(&r) * 65536.0f;
        /* clean: 0, and every element multiplied exactly */
        memcpy(g, orig, n * sizeof *g);
        assert_int_equal(rk_unscale_check_f32(g, n, 0x1p-15f), 0);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(fbits(g[i]), fbits(orig[i] * 0x1p-15f));
        /* one bad value first, in the middle, last (the tail after the blocks), and at a
         * block edge */
        size_t pos[] = {0, n / 2, n - 1, n > 16 ? 16 : 0, n > 15 ? 15 : 0};
        for (size_t p = 0; p < sizeof pos / sizeof *pos; p++)
            for (size_t b = 0; b < sizeof bads / sizeof *bads; b++) {
                memcpy(g, orig, n * sizeof *g);
                g[pos[p]] = bads[b];
                assert_int_equal(rk_unscale_check_f32(g, n, 0x1p-15f), 1);
                for (size_t i = 0; i < n; i++)
                    if (i != pos[p])
                        assert_int_equal(fbits(g[i]), fbits(orig[i] * 0x1p-15f));
                assert_false(isfinite(g[pos[p]]));
            }
    }
    /* finite in, inf out: a product that overflows is non-finite too */
    float big[3] = {1.0f, FLT_MAX, 2.0f};
    assert_int_equal(rk_unscale_check_f32(big, 3, 4.0f), 1);
    float fine[3] = {FLT_MAX, -FLT_MAX, FLT_TRUE_MIN};
    assert_int_equal(rk_unscale_check_f32(fine, 3, 1.0f), 0);
    assert_int_equal(rk_unscale_check_f32(NULL, 0, 1.0f), 0);
    free(g);
    free(orig);
}

/* ---- loss scaler ---- */

static void scaler_defaults(void **state)
{
    (void)state;
    rk_loss_scaler s;
    assert_int_equal(rk_loss_scaler_init(&s, NULL, NULL), RK_OK);
    assert_true(s.scale == 32768.0f);
    assert_true(s.min_scale == 1.0f);
    assert_true(s.max_scale == 16777216.0f);
    assert_true(s.growth_factor == 2.0f);
    assert_true(s.backoff_factor == 0.5f);
    assert_int_equal(s.growth_interval, 2000);
    assert_int_equal(s.hysteresis, 1);
    assert_int_equal(s.hysteresis_left, 1);
    assert_int_equal(s.consecutive_hysteresis, 0);
    assert_int_equal(s.good_steps, 0);
    assert_int_equal(s.steps, 0);
    assert_int_equal(s.overflows, 0);
    assert_true(rk_loss_scaler_inv(&s) == 0x1p-15f);
}

static void scaler_grows_after_exactly_the_interval(void **state)
{
    (void)state;
    rk_loss_scaler s;
    rk_loss_scaler_init(&s, NULL, NULL);
    for (int i = 0; i < 1999; i++)
        assert_int_equal(rk_loss_scaler_update(&s, 0), 0);
    assert_true(s.scale == 32768.0f);
    assert_int_equal(s.good_steps, 1999);
    assert_int_equal(rk_loss_scaler_update(&s, 0), 0);
    assert_true(s.scale == 65536.0f);
    assert_int_equal(s.good_steps, 0);
    for (int i = 0; i < 2000; i++)
        rk_loss_scaler_update(&s, 0);
    assert_true(s.scale == 131072.0f);
    assert_true(rk_loss_scaler_inv(&s) == 0x1p-17f);
    assert_int_equal(s.steps, 4000);
    assert_int_equal(s.overflows, 0);
}

static void scaler_backs_off_skips_and_resets_the_clean_count(void **state)
{
    (void)state;
    rk_loss_scaler s;
    rk_loss_scaler_init(&s, NULL, NULL);
    for (int i = 0; i < 1999; i++)
        rk_loss_scaler_update(&s, 0);
    assert_int_equal(rk_loss_scaler_update(&s, 1), 1); /* skip */
    assert_true(s.scale == 16384.0f);
    assert_int_equal(s.good_steps, 0);
    assert_int_equal(s.overflows, 1);
    assert_int_equal(s.overflows_in_row, 1);
    /* the 1999 clean steps before the overflow do not count */
    for (int i = 0; i < 1999; i++)
        assert_int_equal(rk_loss_scaler_update(&s, 0), 0);
    assert_true(s.scale == 16384.0f);
    assert_int_equal(s.overflows_in_row, 0);
    rk_loss_scaler_update(&s, 0);
    assert_true(s.scale == 32768.0f);
    /* any non-zero flag is an overflow */
    assert_int_equal(rk_loss_scaler_update(&s, 7), 1);
    assert_true(s.scale == 16384.0f);
    assert_int_equal(s.steps, 4001);
    assert_int_equal(s.overflows, 2);
}

static void scaler_floor_and_cap(void **state)
{
    (void)state;
    rk_loss_scaler_opts o;
    rk_loss_scaler_opts_default(&o);
    o.init_scale = 16;
    o.min_scale = 4;
    o.growth_interval = 3;
    rk_loss_scaler s;
    assert_int_equal(rk_loss_scaler_init(&s, &o, NULL), RK_OK);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 8);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 4);
    /* at the floor: still skipped, the scale stays */
    for (int i = 0; i < 10; i++) {
        assert_int_equal(rk_loss_scaler_update(&s, 1), 1);
        assert_true(s.scale == 4);
    }
    assert_int_equal(s.overflows_in_row, 12);
    /* a floor that is not a power of two of the scale: clamped to it, not below */
    o.min_scale = 5;
    assert_int_equal(rk_loss_scaler_init(&s, &o, NULL), RK_OK);
    rk_loss_scaler_update(&s, 1);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 5);
    /* and it grows again from the floor */
    for (int i = 0; i < 3; i++)
        assert_int_equal(rk_loss_scaler_update(&s, 0), 0);
    assert_true(s.scale == 10);

    /* the cap: reached, never passed, even off the growth factor's grid */
    rk_loss_scaler_opts_default(&o);
    o.growth_interval = 2;
    o.max_scale = 100000;
    assert_int_equal(rk_loss_scaler_init(&s, &o, NULL), RK_OK);
    rk_loss_scaler_update(&s, 0);
    rk_loss_scaler_update(&s, 0);
    assert_true(s.scale == 65536);
    rk_loss_scaler_update(&s, 0);
    rk_loss_scaler_update(&s, 0);
    assert_true(s.scale == 100000);
    for (int i = 0; i < 10; i++)
        rk_loss_scaler_update(&s, 0);
    assert_true(s.scale == 100000);
    assert_int_equal(s.good_steps, 0);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 50000);
    /* the default cap 2^24 */
    rk_loss_scaler_init(&s, NULL, NULL);
    for (int i = 0; i < 20 * 2000; i++)
        rk_loss_scaler_update(&s, 0);
    assert_true(s.scale == 16777216.0f);
}

static void scaler_hysteresis_counts_down_until_a_growth(void **state)
{
    (void)state;
    rk_loss_scaler_opts o;
    rk_loss_scaler_opts_default(&o);
    o.hysteresis = 3;
    o.growth_interval = 4;
    rk_loss_scaler s;
    assert_int_equal(rk_loss_scaler_init(&s, &o, NULL), RK_OK);
    assert_int_equal(s.hysteresis_left, 3);
    /* the first two overflows are skipped without a backoff, the third backs off */
    assert_int_equal(rk_loss_scaler_update(&s, 1), 1);
    assert_true(s.scale == 32768);
    assert_int_equal(rk_loss_scaler_update(&s, 1), 1);
    assert_true(s.scale == 32768);
    assert_int_equal(s.hysteresis_left, 1);
    assert_int_equal(rk_loss_scaler_update(&s, 1), 1);
    assert_true(s.scale == 16384);
    /* used up: every further overflow backs off, clean steps short of a growth do not
     * refill it */
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 8192);
    rk_loss_scaler_update(&s, 0);
    rk_loss_scaler_update(&s, 0);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 4096);
    /* a growth refills it */
    for (int i = 0; i < 4; i++)
        rk_loss_scaler_update(&s, 0);
    assert_true(s.scale == 8192);
    assert_int_equal(s.hysteresis_left, 3);
    rk_loss_scaler_update(&s, 1);
    rk_loss_scaler_update(&s, 0);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 8192);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 4096);
}

static void scaler_consecutive_hysteresis_needs_overflows_in_a_row(void **state)
{
    (void)state;
    rk_loss_scaler_opts o;
    rk_loss_scaler_opts_default(&o);
    o.hysteresis = 3;
    o.consecutive_hysteresis = 1;
    rk_loss_scaler s;
    assert_int_equal(rk_loss_scaler_init(&s, &o, NULL), RK_OK);
    /* two in a row, a clean step, two in a row: never three in a row, no backoff */
    for (int k = 0; k < 5; k++) {
        assert_int_equal(rk_loss_scaler_update(&s, 1), 1);
        assert_int_equal(rk_loss_scaler_update(&s, 1), 1);
        assert_int_equal(rk_loss_scaler_update(&s, 0), 0);
        assert_int_equal(s.hysteresis_left, 3);
    }
    assert_true(s.scale == 32768);
    rk_loss_scaler_update(&s, 1);
    rk_loss_scaler_update(&s, 1);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 16384);
    rk_loss_scaler_update(&s, 1);
    assert_true(s.scale == 8192);
    assert_int_equal(s.overflows_in_row, 4);
}

/* DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py),
 * transcribed, with the cap added. */
typedef struct ds_scaler {
    double cur_scale, min_scale, max_scale, factor;
    long cur_iter, last_overflow_iter, scale_window;
    int delayed_shift, cur_hysteresis, consecutive_hysteresis;
} ds_scaler;

static void ds_update(ds_scaler *d, int overflow)
{
    if (overflow) {
        if (d->delayed_shift == 1 || d->cur_hysteresis == 1)
            d->cur_scale = fmax(d->cur_scale / d->factor, d->min_scale);
        else
            d->cur_hysteresis -= 1;
        d->last_overflow_iter = d->cur_iter;
    } else {
        if (d->consecutive_hysteresis)
            d->cur_hysteresis = d->delayed_shift;
        if ((d->cur_iter - d->last_overflow_iter) % d->scale_window == 0) {
            if (!d->consecutive_hysteresis)
                d->cur_hysteresis = d->delayed_shift;
            d->cur_scale = fmin(d->cur_scale * d->factor, d->max_scale);
        }
    }
    d->cur_iter += 1;
}

static void scaler_matches_deepspeed_on_random_runs(void **state)
{
    (void)state;
    rk_rng r;
    rk_rng_seed(&r, 17);
    for (int run = 0; run < 400; run++) {
        rk_loss_scaler_opts o;
        rk_loss_scaler_opts_default(&o);
        o.growth_interval = 1 + (int)rk_rng_below(&r, 8);
        o.hysteresis = 1 + (int)rk_rng_below(&r, 4);
        o.consecutive_hysteresis = (int)rk_rng_below(&r, 2);
        o.init_scale = 1024;
        o.min_scale = 1;
        o.max_scale = 65536;
        rk_loss_scaler s;
        assert_int_equal(rk_loss_scaler_init(&s, &o, NULL), RK_OK);
        ds_scaler d = {.cur_scale = 1024,
                       .min_scale = 1,
                       .max_scale = 65536,
                       .factor = 2,
                       .cur_iter = 0,
                       .last_overflow_iter = -1,
                       .scale_window = o.growth_interval,
                       .delayed_shift = o.hysteresis,
                       .cur_hysteresis = o.hysteresis,
                       .consecutive_hysteresis = o.consecutive_hysteresis};
        float p = 0.05f + 0.5f * rk_rng_uniform(&r); /* overflow probability of this run */
        for (int step = 0; step < 500; step++) {
            int of = rk_rng_uniform(&r) < p;
            assert_int_equal(rk_loss_scaler_update(&s, of), of);
            ds_update(&d, of);
            if ((double)s.scale != d.cur_scale)
                fail_msg("run %d step %d: scale %g, DeepSpeed %g", run, step, (double)s.scale,
                         d.cur_scale);
            assert_int_equal(s.hysteresis_left, d.cur_hysteresis);
        }
    }
}

/* Every setting init must refuse: RK_EINVAL, the field named, *s untouched. */
static void scaler_rejects_bad_settings(void **state)
{
    (void)state;
    const struct {
        const char *field; /* as the message names it */
        int which;         /* the opts field below */
        double value;
    } cases[] = {
        {"init_scale", 0, 0.5},
        {"init_scale", 0, NAN},
        {"init_scale", 0, 0x1p25},
        {"min_scale", 1, 0},
        {"min_scale", 1, -1},
        {"min_scale", 1, NAN},
        {"min_scale", 1, INFINITY},
        {"max_scale", 2, 0.5},
        {"max_scale", 2, INFINITY},
        {"max_scale", 2, NAN},
        {"growth_factor", 3, 1},
        {"growth_factor", 3, 0.5},
        {"growth_factor", 3, NAN},
        {"growth_factor", 3, INFINITY},
        {"backoff_factor", 4, 0},
        {"backoff_factor", 4, 1},
        {"backoff_factor", 4, 1.5},
        {"backoff_factor", 4, -0.5},
        {"backoff_factor", 4, NAN},
        {"growth_interval", 5, 0},
        {"growth_interval", 5, -5},
        {"hysteresis", 6, 0},
        {"hysteresis", 6, -1},
        {"consecutive_hysteresis", 7, 2},
        {"consecutive_hysteresis", 7, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        rk_loss_scaler_opts o;
        rk_loss_scaler_opts_default(&o);
        float v = (float)cases[i].value;
        switch (cases[i].which) {
        case 0: o.init_scale = v; break;
        case 1: o.min_scale = v; break;
        case 2: o.max_scale = v; break;
        case 3: o.growth_factor = v; break;
        case 4: o.backoff_factor = v; break;
        case 5: o.growth_interval = (int)cases[i].value; break;
        case 6: o.hysteresis = (int)cases[i].value; break;
        case 7: o.consecutive_hysteresis = (int)cases[i].value; break;
        }
        rk_loss_scaler s, before;
        memset(&s, 0x5a, sizeof s);
        memcpy(&before, &s, sizeof s);
        rk_err err;
        assert_int_equal(rk_loss_scaler_init(&s, &o, &err), RK_EINVAL);
        char want[64];
        snprintf(want, sizeof want, ": %s ", cases[i].field);
        if (!strstr(err.msg, want))
            fail_msg("case %zu: message \"%s\" does not name %s", i, err.msg, cases[i].field);
        assert_memory_equal(&s, &before, sizeof s);
    }
    rk_err err;
    assert_int_equal(rk_loss_scaler_init(NULL, NULL, &err), RK_EINVAL);
}

/* ---- checkpoint ---- */

static void assert_same_scaler(const rk_loss_scaler *a, const rk_loss_scaler *b)
{
    assert_int_equal(fbits(a->scale), fbits(b->scale));
    assert_int_equal(fbits(a->min_scale), fbits(b->min_scale));
    assert_int_equal(fbits(a->max_scale), fbits(b->max_scale));
    assert_int_equal(fbits(a->growth_factor), fbits(b->growth_factor));
    assert_int_equal(fbits(a->backoff_factor), fbits(b->backoff_factor));
    assert_int_equal(a->growth_interval, b->growth_interval);
    assert_int_equal(a->hysteresis, b->hysteresis);
    assert_int_equal(a->consecutive_hysteresis, b->consecutive_hysteresis);
    assert_int_equal(a->good_steps, b->good_steps);
    assert_int_equal(a->hysteresis_left, b->hysteresis_left);
    assert_int_equal(a->steps, b->steps);
    assert_int_equal(a->overflows, b->overflows);
    assert_int_equal(a->overflows_in_row, b->overflows_in_row);
}

/* A valid state with a distinct value in every field. */
static void odd_state(rk_loss_scaler *s)
{
    rk_loss_scaler_opts o;
    rk_loss_scaler_opts_default(&o);
    o.init_scale = 1024;
    o.min_scale = 2;
    o.max_scale = 0x1p20f;
    o.growth_factor = 4;
    o.backoff_factor = 0.25f;
    o.growth_interval = 0x01020304;
    o.hysteresis = 9;
    o.consecutive_hysteresis = 1;
    assert_int_equal(rk_loss_scaler_init(s, &o, NULL), RK_OK);
    s->good_steps = 0x00050607;
    s->hysteresis_left = 7;
    s->steps = 0x0102030405060708;
    s->overflows = 0x0a0b0c0d0e;
    s->overflows_in_row = 3;
}

/* The tensors docs/amp.md names: every one a scalar of its field's value. */
static void items_name_every_field(void **state)
{
    (void)state;
    rk_loss_scaler s;
    odd_state(&s);
    rk_loss_scaler_items it;
    rk_loss_scaler_items_fill(&s, &it);
    static const char *const names[RK_LOSS_SCALER_NITEMS] = {
        "amp.scale",           "amp.min_scale",
        "amp.max_scale",       "amp.growth_factor",
        "amp.backoff_factor",  "amp.growth_interval",
        "amp.hysteresis",      "amp.consecutive_hysteresis",
        "amp.good_steps",      "amp.hysteresis_left",
        "amp.steps",           "amp.overflows",
        "amp.overflows_in_row"};
    const float f[5] = {1024, 2, 0x1p20f, 4, 0.25f};
    const int64_t v[8] = {0x01020304, 9, 1, 0x00050607, 7, 0x0102030405060708, 0x0a0b0c0d0e, 3};
    for (int i = 0; i < RK_LOSS_SCALER_NITEMS; i++) {
        assert_string_equal(it.item[i].name, names[i]);
        assert_int_equal(it.item[i].ndim, 0);
        if (i < 5) {
            assert_string_equal(it.item[i].dtype, "F32");
            assert_int_equal(fbits(*(const float *)it.item[i].data), fbits(f[i]));
        } else {
            assert_string_equal(it.item[i].dtype, "I64");
            assert_int_equal(*(const int64_t *)it.item[i].data, v[i - 5]);
        }
    }
}

static void items_round_trip_exactly(void **state)
{
    (void)state;
    rk_rng r;
    rk_rng_seed(&r, 23);
    for (int run = 0; run < 200; run++) {
        rk_loss_scaler_opts o;
        rk_loss_scaler_opts_default(&o);
        o.growth_interval = 1 + (int)rk_rng_below(&r, 20);
        o.hysteresis = 1 + (int)rk_rng_below(&r, 4);
        o.consecutive_hysteresis = (int)rk_rng_below(&r, 2);
        o.growth_factor = 1.5f + rk_rng_uniform(&r);
        o.backoff_factor = 0.1f + 0.8f * rk_rng_uniform(&r);
        rk_loss_scaler a, b;
        assert_int_equal(rk_loss_scaler_init(&a, &o, NULL), RK_OK);
        int steps = (int)rk_rng_below(&r, 300);
        for (int i = 0; i < steps; i++)
            rk_loss_scaler_update(&a, rk_rng_uniform(&r) < 0.2f);
        rk_loss_scaler_items it;
        rk_loss_scaler_items_fill(&a, &it);
        rk_st_file f;
        items_file(it.item, RK_LOSS_SCALER_NITEMS, -1, NULL, &f);
        memset(&b, 0, sizeof b);
        rk_err err;
        if (rk_loss_scaler_load(&b, &f, &err) != RK_OK)
            fail_msg("run %d: %s", run, err.msg);
        rk_st_free(&f);
        assert_same_scaler(&a, &b);
        /* and the two go on alike */
        for (int i = 0; i < 100; i++) {
            int of = rk_rng_uniform(&r) < 0.2f;
            assert_int_equal(rk_loss_scaler_update(&a, of), rk_loss_scaler_update(&b, of));
        }
        assert_same_scaler(&a, &b);
    }
    /* through a real checkpoint too */
    rk_loss_scaler s, t;
    odd_state(&s);
    rk_loss_scaler_items it;
    rk_loss_scaler_items_fill(&s, &it);
    rk_ckpt_meta meta = {.step = 1, .world_size = 1};
    uint8_t *buf;
    size_t len;
    rk_ckpt *c;
    assert_int_equal(rk_ckpt_encode(&meta, it.item, RK_LOSS_SCALER_NITEMS, &buf, &len, NULL),
                     RK_OK);
    assert_int_equal(rk_ckpt_parse(buf, len, "ckpt-000000000001.safetensors", &c, NULL), RK_OK);
    assert_int_equal(rk_loss_scaler_load(&t, rk_ckpt_file(c), NULL), RK_OK);
    assert_same_scaler(&s, &t);
    rk_ckpt_free(c);
    free(buf);
}

/* Load `f` expecting `code` with `field` in the message, and *s untouched. */
static void expect_rejected(const rk_st_file *f, int code, const char *field, const char *what)
{
    rk_loss_scaler s, before;
    memset(&s, 0x5a, sizeof s);
    memcpy(&before, &s, sizeof s);
    rk_err err;
    rk_err_clear(&err);
    int rc = rk_loss_scaler_load(&s, f, &err);
    if (rc != code)
        fail_msg("%s: load returned %d, not %d (%s)", what, rc, code, err.msg);
    if (err.code != code)
        fail_msg("%s: err.code %d, not %d", what, err.code, code);
    if (field && !strstr(err.msg, field))
        fail_msg("%s: message \"%s\" does not name \"%s\"", what, err.msg, field);
    assert_memory_equal(&s, &before, sizeof s);
}

static void load_rejects_every_bad_state(void **state)
{
    (void)state;
    rk_loss_scaler s;
    odd_state(&s);
    rk_loss_scaler_items good;
    rk_loss_scaler_items_fill(&s, &good);
    rk_st_file f;
    char what[96];

    /* each tensor missing, of another dtype, of another shape */
    for (int i = 0; i < RK_LOSS_SCALER_NITEMS; i++) {
        if (i == 0)
            continue; /* no amp.scale: no state at all, below */
        items_file(good.item, RK_LOSS_SCALER_NITEMS, i, NULL, &f);
        snprintf(what, sizeof what, "%s missing", good.item[i].name);
        expect_rejected(&f, RK_EFORMAT, good.item[i].name, what);
        rk_st_free(&f);
    }
    for (int i = 0; i < RK_LOSS_SCALER_NITEMS; i++) {
        int64_t one[1] = {1};
        double d = 1;
        rk_st_entry wrong[2] = {{.name = good.item[i].name, .data = &d, .dtype = "F64"},
                                {.name = good.item[i].name,
                                 .data = good.item[i].data,
                                 .ndim = 1,
                                 .shape = one,
                                 .dtype = good.item[i].dtype}};
        for (int k = 0; k < 2; k++) {
            items_file(good.item, RK_LOSS_SCALER_NITEMS, i, &wrong[k], &f);
            snprintf(what, sizeof what, "%s %s", good.item[i].name, k ? "1-D" : "F64");
            expect_rejected(&f, RK_EFORMAT, good.item[i].name, what);
            rk_st_free(&f);
        }
    }
    /* no state: RK_ENOENT; the binary blob of earlier versions: refused, named */
    items_file(good.item, RK_LOSS_SCALER_NITEMS, 0, NULL,
               &f); /* the other amp.* tensors alone do not count */
    expect_rejected(&f, RK_ENOENT, "amp.scale", "no amp.scale");
    rk_st_free(&f);
    rk_st_entry none = {.name = "model.w", .data = &good.f32[0], .dtype = "F32"};
    {
        uint8_t *buf;
        size_t len;
        assert_int_equal(rk_st_encode(&none, 1, NULL, &buf, &len, NULL), RK_OK);
        assert_int_equal(rk_st_parse(buf, len, "ck", &f, NULL), RK_OK);
        free(buf);
        expect_rejected(&f, RK_ENOENT, "amp.scale", "no state");
        rk_st_free(&f);
        uint8_t blob[76] = {'R', 'K', 'L', 'S', 1};
        int64_t shape[1] = {76};
        rk_st_entry old[2] = {
            none, {.name = "scaler.state", .data = blob, .ndim = 1, .shape = shape, .dtype = "U8"}};
        assert_int_equal(rk_st_encode(old, 2, NULL, &buf, &len, NULL), RK_OK);
        assert_int_equal(rk_st_parse(buf, len, "ck", &f, NULL), RK_OK);
        free(buf);
        expect_rejected(&f, RK_EFORMAT, "'scaler.state'", "old blob");
        rk_st_free(&f);
    }

    /* every field given a value the scaler could not have saved */
    const struct {
        int item;
        double f;
        int64_t i;
        const char *field;
    } bad[] = {
        {0, NAN, 0, "amp.scale "},
        {0, INFINITY, 0, "amp.scale "},
        {0, -INFINITY, 0, "amp.scale "},
        {0, 0.0, 0, "amp.scale "},
        {0, -0.0, 0, "amp.scale "},
        {0, -1024, 0, "amp.scale "},
        {0, 1, 0, "amp.scale "},      /* below min_scale 2 */
        {0, 0x1p21, 0, "amp.scale "}, /* above max_scale 2^20 */
        {1, 0, 0, ": min_scale "},
        {1, -2, 0, ": min_scale "},
        {1, NAN, 0, ": min_scale "},
        {1, INFINITY, 0, ": min_scale "},
        {1, 4096, 0, "min_scale 4096"}, /* above the scale */
        {2, 1, 0, ": max_scale "},      /* below min_scale */
        {2, INFINITY, 0, ": max_scale "},
        {2, NAN, 0, ": max_scale "},
        {2, 512, 0, "max_scale 512"}, /* below the scale */
        {3, 1, 0, ": growth_factor "},
        {3, 0.5, 0, ": growth_factor "},
        {3, NAN, 0, ": growth_factor "},
        {3, INFINITY, 0, ": growth_factor "},
        {4, 0, 0, ": backoff_factor "},
        {4, 1, 0, ": backoff_factor "},
        {4, 2, 0, ": backoff_factor "},
        {4, -0.25, 0, ": backoff_factor "},
        {4, NAN, 0, ": backoff_factor "},
        {5, 0, 0, ": growth_interval "},
        {5, 0, -1, ": growth_interval "},
        {5, 0, (int64_t)INT32_MAX + 1, ": growth_interval "},
        {5, 0, 0x00050607, "amp.good_steps "}, /* good_steps must stay below it */
        {6, 0, 0, ": hysteresis "},
        {6, 0, -1, ": hysteresis "},
        {6, 0, (int64_t)INT32_MAX + 1, ": hysteresis "},
        {6, 0, 6, "amp.hysteresis_left "}, /* below hysteresis_left 7 */
        {7, 0, 2, ": consecutive_hysteresis "},
        {7, 0, -1, ": consecutive_hysteresis "},
        {8, 0, -1, "amp.good_steps "},
        {8, 0, 0x01020304, "amp.good_steps "},
        {9, 0, 0, "amp.hysteresis_left "},
        {9, 0, 10, "amp.hysteresis_left "},
        {9, 0, -1, "amp.hysteresis_left "},
        {10, 0, -1, "amp.steps "},
        {10, 0, INT64_MAX, "amp.steps "},        /* its ++ would overflow: no run gets there */
        {10, 0, 0x0a0b0c0d0d, "amp.overflows "}, /* fewer steps than overflows */
        {11, 0, -1, "amp.overflows "},
        {11, 0, 0x0102030405060709, "amp.overflows "},
        {11, 0, 2, "amp.overflows_in_row "}, /* fewer overflows than the run of them */
        {12, 0, -1, "amp.overflows_in_row "},
        {12, 0, 0x0a0b0c0d0f, "amp.overflows_in_row "},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rk_loss_scaler_items b = good;
        for (int k = 0; k < 5; k++) /* the items point into b, not good */
            b.item[k].data = &b.f32[k];
        for (int k = 0; k < 8; k++)
            b.item[5 + k].data = &b.i64[k];
        if (bad[i].item < 5)
            b.f32[bad[i].item] = (float)bad[i].f;
        else
            b.i64[bad[i].item - 5] = bad[i].i;
        items_file(b.item, RK_LOSS_SCALER_NITEMS, -1, NULL, &f);
        snprintf(what, sizeof what, "case %zu (%s)", i, b.item[bad[i].item].name);
        expect_rejected(&f, RK_EFORMAT, bad[i].field, what);
        rk_st_free(&f);
    }
    /* the untouched state still loads: the cases above are what failed, not the base */
    items_file(good.item, RK_LOSS_SCALER_NITEMS, -1, NULL, &f);
    rk_loss_scaler t;
    assert_int_equal(rk_loss_scaler_load(&t, &f, NULL), RK_OK);
    assert_same_scaler(&s, &t);
    rk_st_free(&f);
    assert_int_equal(rk_loss_scaler_load(NULL, &f, NULL), RK_EINVAL);
    assert_int_equal(rk_loss_scaler_load(&t, NULL, NULL), RK_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f16_every_pattern_decodes_and_round_trips),
        cmocka_unit_test(bf16_every_pattern_decodes_and_round_trips),
        cmocka_unit_test(f16_rounds_ties_to_even_at_every_midpoint),
        cmocka_unit_test(f16_overflow_and_subnormal_edges),
        cmocka_unit_test(nans_stay_nans),
        cmocka_unit_test(bf16_rounds_like_a_double_reference),
        cmocka_unit_test(bulk_equals_scalar),
        cmocka_unit_test(dtypes_parse_and_name),
        cmocka_unit_test(unscale_finds_inf_and_nan_anywhere),
        cmocka_unit_test(scaler_defaults),
        cmocka_unit_test(scaler_grows_after_exactly_the_interval),
        cmocka_unit_test(scaler_backs_off_skips_and_resets_the_clean_count),
        cmocka_unit_test(scaler_floor_and_cap),
        cmocka_unit_test(scaler_hysteresis_counts_down_until_a_growth),
        cmocka_unit_test(scaler_consecutive_hysteresis_needs_overflows_in_a_row),
        cmocka_unit_test(scaler_matches_deepspeed_on_random_runs),
        cmocka_unit_test(scaler_rejects_bad_settings),
        cmocka_unit_test(items_name_every_field),
        cmocka_unit_test(items_round_trip_exactly),
        cmocka_unit_test(load_rejects_every_bad_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
