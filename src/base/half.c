/*
 * fp32 <-> fp16 / bf16 conversions (rekindle/half.h) in integer bit arithmetic (one float add
 * for fp16 subnormals, exact under round-to-nearest), with F16C for the fp16 bulk forms when
 * the CPU has it. Used by the loss scaler's trainers, the compressed collectives and the
 * layers; relies on nothing but the C library (and cpuid on x86-64).
 */
#include "rekindle/half.h"

#include <stdatomic.h>
#include <string.h>

/* ---- conversions ----
 * Written branch-free (selects, not jumps) so the _n loops vectorise. */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* All ones when c is true, else 0: selects written as masks, so every lane is computed and
 * the compiler has no branch to keep (it will not if-convert a float op that might trap). */
static inline uint32_t mask_if(int c)
{
    return 0u - (uint32_t)c;
}

static inline uint32_t pick(uint32_t m, uint32_t a, uint32_t b)
{
    return (a & m) | (b & ~m);
}

static inline uint16_t to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* |x| >= 2^-14: rebias the exponent (127 -> 15), round the 13 dropped bits to nearest
     * even; a carry moves into the exponent, and from 65520 up into inf (0x7c00). */
    uint32_t normal = (a - ((127u - 15u) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* |x| < 2^-14: adding 0.5f puts units of 2^-24 (fp16's smallest subnormal) in the low
     * mantissa bits of the sum, rounded to nearest even by the float add itself; subtracting
     * 0.5f's bits leaves the fp16 bits (0x400, the smallest normal, when it rounds up). The
     * add sees |x| clamped below 2^-14 so that no lane works on inf or NaN. */
    uint32_t small = pick(mask_if(a < 0x38800000u), a, 0);
    uint32_t sub = f32_bits(bits_f32(small) + 0.5f) - 0x3f000000u;
    /* |x| >= 2^16 (the normal formula is only right below): inf, or a NaN made quiet keeping
     * the top 9 payload bits */
    uint32_t special = pick(mask_if(a > 0x7f800000u), 0x7e00u | ((a >> 13) & 0x3ffu), 0x7c00u);
    uint32_t r = pick(mask_if(a < 0x38800000u), sub, normal);
    r = pick(mask_if(a >= 0x47800000u), special, r);
    return (uint16_t)(sign | r);
}

static inline float from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t normal = (em << 13) + ((127u - 15u) << 23);
    /* subnormal (and zero): m * 2^-24, exact as an int to float conversion and a scale */
    uint32_t sub = f32_bits((float)(int32_t)(em & 0x3ffu) * 0x1p-24f);
    /* inf, or a NaN made quiet */
    uint32_t special = 0x7f800000u | (em & 0x3ffu) << 13 | (mask_if(em > 0x7c00u) & 0x00400000u);
    uint32_t r = pick(mask_if(em < 0x0400u), sub, normal);
    r = pick(mask_if(em >= 0x7c00u), special, r);
    return bits_f32(sign | r);
}

static inline uint16_t to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    /* round to nearest even on the 16 dropped bits; a carry runs into the exponent and from
     * the overflow threshold up into inf; inf itself has no bits to round */
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    /* NaN: truncate and set the quiet bit, so a payload only in the low bits stays a NaN */
    uint32_t nan = (u >> 16) | 0x0040u;
    return (uint16_t)pick(mask_if((u & 0x7fffffffu) > 0x7f800000u), nan, rounded);
}

static inline float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    u |= mask_if((u & 0x7fffffffu) > 0x7f800000u) & 0x00400000u; /* NaN: quiet */
    return bits_f32(u);
}

uint16_t rk_f32_to_f16(float x)
{
    return to_f16(x);
}
float rk_f16_to_f32(uint16_t h)
{
    return from_f16(h);
}
uint16_t rk_f32_to_bf16(float x)
{
    return to_bf16(x);
}
float rk_bf16_to_f32(uint16_t h)
{
    return from_bf16(h);
}

/* Blocks of a fixed size so that GCC's -O2 cost model (which vectorises only loops whose
 * trip count it knows) vectorises the inner loop; the tail goes one by one. */
#define BLOCK 16

static void f32_to_f16_portable(const float *restrict src, uint16_t *restrict dst, size_t n)
{
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int j = 0; j < BLOCK; j++)
            dst[i + j] = to_f16(src[i + j]);
    for (; i < n; i++)
        dst[i] = to_f16(src[i]);
}

static void f16_to_f32_portable(const uint16_t *restrict src, float *restrict dst, size_t n)
{
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int j = 0; j < BLOCK; j++)
            dst[i + j] = from_f16(src[i + j]);
    for (; i < n; i++)
        dst[i] = from_f16(src[i]);
}

/* x86-64 with F16C: the hardware conversions, about 15x (to fp16) and 7x (from fp16) the
 * portable loops (docs/amp.md), chosen at run time. They give the same bits as to_f16/from_f16 for
 * every input (checked over all 2^32 fp32 patterns): the rounding comes from the instruction's
 * immediate, not MXCSR. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C 1

__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *src, uint16_t *dst,
                                                                size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        dst[i] = to_f16(src[i]);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *src, float *dst,
                                                                size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    for (; i < n; i++)
        dst[i] = from_f16(src[i]);
}

/* CPUID says F16C and AVX, and the OS saves the ymm registers (XCR0 bits 1 and 2). */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    if (!(c & bit_OSXSAVE) || !(c & bit_AVX) || !(c & bit_F16C))
        return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
}
#endif

/* -1 not decided yet, 0 portable, 1 F16C */
static _Atomic int use_f16c = -1;

int rk_half_use_f16c(int on)
{
#ifdef HAVE_F16C
    int v = on && cpu_has_f16c();
#else
    int v = 0;
    (void)on;
#endif
    atomic_store_explicit(&use_f16c, v, memory_order_relaxed);
    return v;
}

static int f16c_on(void)
{
    int v = atomic_load_explicit(&use_f16c, memory_order_relaxed);
    return v >= 0 ? v : rk_half_use_f16c(1);
}

void rk_f32_to_f16_n(const float *restrict src, uint16_t *restrict dst, size_t n)
{
#ifdef HAVE_F16C
    if (f16c_on()) {
        f32_to_f16_f16c(src, dst, n);
        return;
    }
#endif
    f32_to_f16_portable(src, dst, n);
}

void rk_f16_to_f32_n(const uint16_t *restrict src, float *restrict dst, size_t n)
{
#ifdef HAVE_F16C
    if (f16c_on()) {
        f16_to_f32_f16c(src, dst, n);
        return;
    }
#endif
    f16_to_f32_portable(src, dst, n);
}

void rk_f32_to_bf16_n(const float *restrict src, uint16_t *restrict dst, size_t n)
{
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int j = 0; j < BLOCK; j++)
            dst[i + j] = to_bf16(src[i + j]);
    for (; i < n; i++)
        dst[i] = to_bf16(src[i]);
}

void rk_bf16_to_f32_n(const uint16_t *restrict src, float *restrict dst, size_t n)
{
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int j = 0; j < BLOCK; j++)
            dst[i + j] = from_bf16(src[i + j]);
    for (; i < n; i++)
        dst[i] = from_bf16(src[i]);
}
