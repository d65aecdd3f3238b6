/*
 * The arithmetic the GPU kernels (gpu/kernels.cu) and their host references (gpu/ref.c) share,
 * in one header compiled both ways: by clang for the NVPTX target (no CUDA headers: RK_HD marks
 * these device functions) and by the C compiler for the host. Each rule lives here once: the
 * SGEMM variants' tile sizes, the inputs' generator, the memory tests' patterns and the
 * compare rule (docs/gpu.md). Plain C: no libc, no types beyond the built-in ones.
 */
#ifndef RK_GPU_REF_COMMON_H
#define RK_GPU_REF_COMMON_H

#ifdef __NVPTX__
#define RK_HD __attribute__((device)) static inline
#else
#define RK_HD static inline
#endif

typedef unsigned int rk_u32;
typedef unsigned long long rk_u64;

/* ---- SGEMM variants ------------------------------------------------------------------------
 * C[M x N] = A[M x K] * B[K x N], row-major, every dimension a multiple of the variant's tile
 * (the caller checks). A block of (BM/TM) * (BN/TN) threads computes a BM x BN tile of C; each
 * thread a TM x TN sub-tile held in registers; A and B pass through shared memory BK columns /
 * rows at a time. Every element of C is one fused multiply-add chain over k = 0 .. K-1 in
 * order, from 0: the kernels' blocking changes where the operands come from, not the order of
 * the sums (gpu/ref.c's tiled emulation checks that on the host).
 *   X(name, BM, BN, BK, TM, TN)                                                              */
#define RK_SGEMM_VARIANTS(X)                                                                       \
    X(rk_sgemm_128x128x8_8x8, 128, 128, 8, 8, 8)                                                   \
    X(rk_sgemm_128x128x16_8x8, 128, 128, 16, 8, 8)                                                 \
    X(rk_sgemm_128x64x8_8x4, 128, 64, 8, 8, 4)                                                     \
    X(rk_sgemm_64x64x8_4x4, 64, 64, 8, 4, 4)                                                       \
    X(rk_sgemm_64x64x16_8x8, 64, 64, 16, 8, 8)

/* ---- the SGEMM's inputs -------------------------------------------------------------------- */

/* A 32-bit mix of (seed, i) (the finaliser of MurmurHash3 over both halves). */
RK_HD rk_u32 rk_mix32(rk_u32 seed, rk_u64 i)
{
    rk_u32 h = seed ^ (rk_u32)i ^ ((rk_u32)(i >> 32) * 0x85ebca6bu);
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

/* Element i of an input matrix drawn with `seed`: a multiple of 2^-24 in [0, 1), exact in
 * float, the same on the GPU and the host. */
RK_HD float rk_sgemm_input(rk_u32 seed, rk_u64 i)
{
    return (float)(rk_mix32(seed, i) >> 8) * (1.0f / 16777216.0f);
}

/* ---- the compare rule (gpu-burn's) ----------------------------------------------------------
 * Every result copy is compared with copy 0, element by element: an element is wrong when
 * |c - c0| > RK_CMP_TOLERANCE, or when either is NaN (gpu-burn's fabs(a - b) > 0.001 counts a
 * NaN as right; ours does not). Copies of one deterministic kernel on one input are
 * bit-identical on a healthy GPU, so any difference above the tolerance is a fault.          */
#define RK_CMP_TOLERANCE 1e-3f

RK_HD int rk_cmp_differs(float c0, float c, float tol)
{
    float d = c - c0;
    if (d < 0)
        d = -d;
    return !(d <= tol); /* NaN: the comparison is false, so the element differs */
}

/* ---- memory test patterns -------------------------------------------------------------------
 * Memory is tested as 32-bit words; word i of a region at device address `base`.             */

/* Walking ones on the address lines: line 0 is word 0, line b >= 1 is word 2^(b-1). Each gets
 * its own value, written first, then all are read back: a stuck or shorted address line makes
 * two of them the same cell, and one value overwrites the other. */
RK_HD rk_u64 rk_mt_line_index(int line)
{
    return line == 0 ? 0 : 1ull << (line - 1);
}
RK_HD rk_u32 rk_mt_line_value(int line)
{
    return 0x5a5a0000u ^ ((rk_u32)line * 0x9e3779b9u);
}
/* How many lines a region of n words has: word 0 and every power of two below n. */
RK_HD int rk_mt_lines(rk_u64 n)
{
    int lines = n > 0 ? 1 : 0;
    while (lines < 64 && rk_mt_line_index(lines) < n)
        lines++;
    return lines;
}

/* Own address: each word holds (a fold of) its own byte address, so a word written or read at
 * the wrong place shows. */
RK_HD rk_u32 rk_mt_own_value(rk_u64 base, rk_u64 i)
{
    rk_u64 a = base + 4 * i;
    return (rk_u32)a ^ (rk_u32)(a >> 32);
}

/* Moving inversions: the patterns, each written everywhere, checked and inverted in one pass,
 * then the inversion checked (cuda_memtest's test 5 with memtest86's data patterns). */
#define RK_MT_INVERSION_PATTERNS 4
RK_HD rk_u32 rk_mt_inversion_pattern(int k)
{
    return k == 0 ? 0x00000000u : k == 1 ? 0x55555555u : k == 2 ? 0x33333333u : 0x0f0f0f0fu;
}

/* Random patterns: thread t of T walks words t, t + T, t + 2T, ... with its own xorshift32
 * state, seeded from (seed, t) and never 0. Writing and checking must use the same T. */
RK_HD rk_u32 rk_mt_random_state(rk_u32 seed, rk_u64 t)
{
    rk_u32 s = rk_mix32(seed ^ 0x2545f491u, t);
    return s ? s : 0x9e3779b9u;
}
RK_HD rk_u32 rk_xorshift32(rk_u32 x)
{
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
}

#endif
