/*
 * Inside rekindle: host references of the GPU kernels (gpu/kernels.cu), for the unit tests and
 * for rk burn's checks of what a GPU computed. Each computes on the CPU what its kernel
 * computes, from the same element rules (gpu/ref_common.h): the SGEMM variants (their blocking
 * emulated thread by thread), the memory tests' writers and checkers, and the compare rule.
 * Not public API; pure functions, thread-safe.
 */
#ifndef RK_GPU_REF_H
#define RK_GPU_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/ref_common.h"

/* ---- SGEMM --------------------------------------------------------------------------------- */

/* One kernel of RK_SGEMM_VARIANTS: tiles of C (bm x bn), of K (bk), per thread (tm x tn). */
typedef struct rk_sgemm_variant {
    const char *name; /* the kernel's name in the PTX */
    int bm, bn, bk, tm, tn;
} rk_sgemm_variant;

extern const rk_sgemm_variant rk_sgemm_variants[];
extern const int rk_sgemm_variant_count;

/* The index of the variant called `name`, -1 when there is none. */
int rk_sgemm_variant_find(const char *name);
/* Threads per block: (bm / tm) * (bn / tn). */
int rk_sgemm_variant_threads(const rk_sgemm_variant *v);
/* Whether M x N x K is a multiple of the variant's tiles (the kernels do not check bounds). */
bool rk_sgemm_variant_fits(const rk_sgemm_variant *v, int m, int n, int k);

/* p[i] = rk_sgemm_input(seed, i), what the rk_fill_input kernel writes. */
void rk_ref_fill_input(float *p, size_t n, uint32_t seed);

/* C = A * B (row-major; A m x k, B k x n) in double: the exact product of the floats, to the
 * rounding of a double sum. */
void rk_ref_sgemm_exact(const float *a, const float *b, double *c, int m, int n, int k);
/* C = A * B in float, each element one fmaf chain over k in order from 0: what every variant
 * computes. */
void rk_ref_sgemm_fma(const float *a, const float *b, float *c, int m, int n, int k);
/* C = A * B the way variant v's kernel does it: block by block, shared tiles loaded, each
 * thread's registers and sub-tile. false (nothing written) when the sizes do not fit v. */
bool rk_ref_sgemm_tiled(const rk_sgemm_variant *v, const float *a, const float *b, float *c, int m,
                        int n, int k);
/* The documented error bound of a float SGEMM element against the exact product:
 * |c - exact| <= RK_SGEMM_REL_BOUND * k * 2^-24 * sum_k |a_ik * b_kj| (the classic gamma_k
 * bound of a recursive sum, with margin). The number of elements of c outside it. */
#define RK_SGEMM_REL_BOUND 1.01
size_t rk_ref_sgemm_outside_bound(const float *c, const float *a, const float *b, int m, int n,
                                  int k);

/* ---- the compare rule ---------------------------------------------------------------------- */

/* faulty[i] = elements of copy i (copies lie n floats apart in c) that differ from copy 0 by
 * rk_cmp_differs with tolerance tol; faulty[0] = 0. What the rk_compare kernel counts. */
void rk_ref_compare(const float *c, size_t n, int copies, float tol, uint64_t *faulty);

/* ---- memory tests (32-bit words; each checker: words wrong, *first the lowest, or
 *      UINT64_MAX when none) ----------------------------------------------------------------- */

void rk_ref_mt_lines_write(uint32_t *p, uint64_t n);
uint64_t rk_ref_mt_lines_check(const uint32_t *p, uint64_t n, uint64_t *first);
void rk_ref_mt_own_write(uint32_t *p, uint64_t n, uint64_t base);
uint64_t rk_ref_mt_own_check(const uint32_t *p, uint64_t n, uint64_t base, uint64_t *first);
void rk_ref_mt_fill(uint32_t *p, uint64_t n, uint32_t pattern);
/* Count words that are not `pattern` and leave ~pattern in every word. */
uint64_t rk_ref_mt_check_invert(uint32_t *p, uint64_t n, uint32_t pattern, uint64_t *first);
uint64_t rk_ref_mt_check(const uint32_t *p, uint64_t n, uint32_t pattern, uint64_t *first);
/* The random pattern as `threads` GPU threads write it (each its own xorshift32 stream). */
void rk_ref_mt_random_write(uint32_t *p, uint64_t n, uint32_t seed, uint64_t threads);
uint64_t rk_ref_mt_random_check(const uint32_t *p, uint64_t n, uint32_t seed, uint64_t threads,
                                uint64_t *first);

#endif
