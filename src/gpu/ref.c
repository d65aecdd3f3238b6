/*
 * Host references of the GPU kernels (gpu/ref.h): the same element rules as gpu/kernels.cu,
 * from gpu/ref_common.h, compiled for the CPU. The tiled SGEMM follows its kernel's loops one
 * for one (blocks, threads, shared tiles, registers), so a change of blocking that changed the
 * arithmetic shows on the host. Pure C over caller-owned arrays.
 */
#include "gpu/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VARIANT(name, bm, bn, bk, tm, tn) {#name, bm, bn, bk, tm, tn},
const rk_sgemm_variant rk_sgemm_variants[] = {RK_SGEMM_VARIANTS(VARIANT)};
#undef VARIANT
const int rk_sgemm_variant_count = (int)(sizeof rk_sgemm_variants / sizeof rk_sgemm_variants[0]);

int rk_sgemm_variant_find(const char *name)
{
    for (int i = 0; name && i < rk_sgemm_variant_count; i++)
        if (strcmp(rk_sgemm_variants[i].name, name) == 0)
            return i;
    return -1;
}

int rk_sgemm_variant_threads(const rk_sgemm_variant *v)
{
    return (v->bm / v->tm) * (v->bn / v->tn);
}

bool rk_sgemm_variant_fits(const rk_sgemm_variant *v, int m, int n, int k)
{
    return m > 0 && n > 0 && k > 0 && m % v->bm == 0 && n % v->bn == 0 && k % v->bk == 0;
}

void rk_ref_fill_input(float *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = rk_sgemm_input(seed, i);
}

void rk_ref_sgemm_exact(const float *a, const float *b, double *c, int m, int n, int k)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int l = 0; l < k; l++)
                s += (double)a[(size_t)i * k + l] * b[(size_t)l * n + j];
            c[(size_t)i * n + j] = s;
        }
}

void rk_ref_sgemm_fma(const float *a, const float *b, float *c, int m, int n, int k)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float s = 0.0f;
            for (int l = 0; l < k; l++)
                s = fmaf(a[(size_t)i * k + l], b[(size_t)l * n + j], s);
            c[(size_t)i * n + j] = s;
        }
}

/* One block (by, bx) of variant v, its threads one after another: the kernel's loops. */
static void tiled_block(const rk_sgemm_variant *v, const float *A, const float *B, float *C, int N,
                        int K, int by, int bx, float *As, float *Bs, float *acc)
{
    const int BM = v->bm, BN = v->bn, BK = v->bk, TM = v->tm, TN = v->tn;
    const int nthreads = rk_sgemm_variant_threads(v);
    A += (size_t)by * BM * K;
    B += (size_t)bx * BN;
    C += (size_t)by * BM * N + (size_t)bx * BN;
    for (int i = 0; i < nthreads * TM * TN; i++)
        acc[i] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += BK) {
        /* every thread's share of the loads, then the barrier */
        for (int tid = 0; tid < nthreads; tid++) {
            for (int i = tid; i < BM * BK; i += nthreads)
                As[(i % BK) * BM + i / BK] = A[(size_t)(i / BK) * K + i % BK];
            for (int i = tid; i < BK * BN; i += nthreads)
                Bs[(i / BN) * BN + i % BN] = B[(size_t)(i / BN) * N + i % BN];
        }
        for (int tid = 0; tid < nthreads; tid++) {
            int trow = tid / (BN / TN), tcol = tid % (BN / TN);
            float *t = acc + (size_t)tid * TM * TN;
            float ra[16], rb[16];
            for (int k = 0; k < BK; k++) {
                for (int mm = 0; mm < TM; mm++)
                    ra[mm] = As[k * BM + trow * TM + mm];
                for (int nn = 0; nn < TN; nn++)
                    rb[nn] = Bs[k * BN + tcol * TN + nn];
                for (int mm = 0; mm < TM; mm++)
                    for (int nn = 0; nn < TN; nn++)
                        t[mm * TN + nn] = fmaf(ra[mm], rb[nn], t[mm * TN + nn]);
            }
        }
        A += BK;
        B += (size_t)BK * N;
    }
    for (int tid = 0; tid < nthreads; tid++) {
        int trow = tid / (BN / TN), tcol = tid % (BN / TN);
        const float *t = acc + (size_t)tid * TM * TN;
        for (int mm = 0; mm < TM; mm++)
            for (int nn = 0; nn < TN; nn++)
                C[(size_t)(trow * TM + mm) * N + tcol * TN + nn] = t[mm * TN + nn];
    }
}

bool rk_ref_sgemm_tiled(const rk_sgemm_variant *v, const float *a, const float *b, float *c, int m,
                        int n, int k)
{
    if (!rk_sgemm_variant_fits(v, m, n, k) || v->tm > 16 || v->tn > 16)
        return false;
    float *as = malloc(sizeof(float) * (size_t)v->bk * v->bm);
    float *bs = malloc(sizeof(float) * (size_t)v->bk * v->bn);
    float *acc = malloc(sizeof(float) * (size_t)v->bm * v->bn);
    bool ok = as && bs && acc;
    for (int by = 0; ok && by < m / v->bm; by++)
        for (int bx = 0; bx < n / v->bn; bx++)
            tiled_block(v, a, b, c, n, k, by, bx, as, bs, acc);
    free(as);
    free(bs);
    free(acc);
    return ok;
}

size_t rk_ref_sgemm_outside_bound(const float *c, const float *a, const float *b, int m, int n,
                                  int k)
{
    size_t outside = 0;
    const double u = ldexp(1.0, -24);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0, abs_s = 0;
            for (int l = 0; l < k; l++) {
                double p = (double)a[(size_t)i * k + l] * b[(size_t)l * n + j];
                s += p;
                abs_s += fabs(p);
            }
            double err = fabs((double)c[(size_t)i * n + j] - s);
            if (!(err <= RK_SGEMM_REL_BOUND * k * u * abs_s))
                outside++;
        }
    return outside;
}

void rk_ref_compare(const float *c, size_t n, int copies, float tol, uint64_t *faulty)
{
    if (copies > 0)
        faulty[0] = 0;
    for (int k = 1; k < copies; k++) {
        uint64_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += (uint64_t)rk_cmp_differs(c[i], c[(size_t)k * n + i], tol);
        faulty[k] = bad;
    }
}

/* count one wrong word at i */
static void wrong(uint64_t *bad, uint64_t *first, uint64_t i)
{
    ++*bad;
    if (i < *first)
        *first = i;
}

void rk_ref_mt_lines_write(uint32_t *p, uint64_t n)
{
    for (int l = 0; l < rk_mt_lines(n); l++)
        p[rk_mt_line_index(l)] = rk_mt_line_value(l);
}

uint64_t rk_ref_mt_lines_check(const uint32_t *p, uint64_t n, uint64_t *first)
{
    uint64_t bad = 0;
    *first = UINT64_MAX;
    for (int l = 0; l < rk_mt_lines(n); l++)
        if (p[rk_mt_line_index(l)] != rk_mt_line_value(l))
            wrong(&bad, first, rk_mt_line_index(l));
    return bad;
}

void rk_ref_mt_own_write(uint32_t *p, uint64_t n, uint64_t base)
{
    for (uint64_t i = 0; i < n; i++)
        p[i] = rk_mt_own_value(base, i);
}

uint64_t rk_ref_mt_own_check(const uint32_t *p, uint64_t n, uint64_t base, uint64_t *first)
{
    uint64_t bad = 0;
    *first = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != rk_mt_own_value(base, i))
            wrong(&bad, first, i);
    return bad;
}

void rk_ref_mt_fill(uint32_t *p, uint64_t n, uint32_t pattern)
{
    for (uint64_t i = 0; i < n; i++)
        p[i] = pattern;
}

uint64_t rk_ref_mt_check_invert(uint32_t *p, uint64_t n, uint32_t pattern, uint64_t *first)
{
    uint64_t bad = 0;
    *first = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] != pattern)
            wrong(&bad, first, i);
        p[i] = ~pattern;
    }
    return bad;
}

uint64_t rk_ref_mt_check(const uint32_t *p, uint64_t n, uint32_t pattern, uint64_t *first)
{
    uint64_t bad = 0;
    *first = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != pattern)
            wrong(&bad, first, i);
    return bad;
}

void rk_ref_mt_random_write(uint32_t *p, uint64_t n, uint32_t seed, uint64_t threads)
{
    for (uint64_t t = 0; t < threads && t < n; t++) {
        uint32_t s = rk_mt_random_state(seed, t);
        for (uint64_t i = t; i < n; i += threads)
            p[i] = s = rk_xorshift32(s);
    }
}

uint64_t rk_ref_mt_random_check(const uint32_t *p, uint64_t n, uint32_t seed, uint64_t threads,
                                uint64_t *first)
{
    uint64_t bad = 0;
    *first = UINT64_MAX;
    for (uint64_t t = 0; t < threads && t < n; t++) {
        uint32_t s = rk_mt_random_state(seed, t);
        for (uint64_t i = t; i < n; i += threads) {
            s = rk_xorshift32(s);
            if (p[i] != s)
                wrong(&bad, first, i);
        }
    }
    return bad;
}
