/*
 * rekindle's GPU kernels: the SGEMM variants, the memory tests and the compare kernel of
 * rk burn (docs/gpu.md). Compiled to PTX at build time by Debian's clang (NVPTX target, no CUDA
 * toolkit headers: -nocudainc), once for sm_61 and once for sm_80, embedded in rk as text and
 * JIT-compiled by the driver (gpu/cuda.c). The arithmetic each kernel does element by element
 * lives in gpu/ref_common.h, shared with the host references of gpu/ref.c.
 */
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))

#include "ref_common.h"

typedef unsigned long size_t_dev;

__device__ static inline unsigned tid_x(void)
{
    return __nvvm_read_ptx_sreg_tid_x();
}
__device__ static inline unsigned ntid_x(void)
{
    return __nvvm_read_ptx_sreg_ntid_x();
}
__device__ static inline unsigned ctaid_x(void)
{
    return __nvvm_read_ptx_sreg_ctaid_x();
}
__device__ static inline unsigned ctaid_y(void)
{
    return __nvvm_read_ptx_sreg_ctaid_y();
}
__device__ static inline unsigned nctaid_x(void)
{
    return __nvvm_read_ptx_sreg_nctaid_x();
}
/* This thread's index in a 1-D grid, and the grid's thread count. */
__device__ static inline rk_u64 gtid(void)
{
    return (rk_u64)ctaid_x() * ntid_x() + tid_x();
}
__device__ static inline rk_u64 gthreads(void)
{
    return (rk_u64)nctaid_x() * ntid_x();
}

/* One thread's finds into the result pair {count, lowest bad index}: one atomic each. */
__device__ static inline void report(rk_u64 *res, rk_u64 count, rk_u64 first)
{
    if (count) {
        __nvvm_atom_add_gen_ll((long long *)&res[0], (long long)count);
        __nvvm_atom_min_gen_ull(&res[1], first);
    }
}

extern "C" {

/* ---- SGEMM --------------------------------------------------------------------------------- */

/* p[i] = rk_sgemm_input(seed, i) for i < n. */
__global__ void rk_fill_input(float *p, rk_u64 n, rk_u32 seed)
{
    for (rk_u64 i = gtid(); i < n; i += gthreads())
        p[i] = rk_sgemm_input(seed, i);
}

/* One variant (ref_common.h, RK_SGEMM_VARIANTS): grid (N/BN, M/BM), block (BM/TM)*(BN/TN). */
#define RK_SGEMM_KERNEL(NAME, BM, BN, BK, TM, TN)                                                  \
    __global__ void NAME(const float *A, const float *B, float *C, int M, int N, int K)            \
    {                                                                                              \
        __shared__ float As[(BK) * (BM)]; /* transposed: As[k * BM + m] */                         \
        __shared__ float Bs[(BK) * (BN)];                                                          \
        const int nthreads = ((BM) / (TM)) * ((BN) / (TN));                                        \
        const int tid = (int)tid_x();                                                              \
        const int trow = tid / ((BN) / (TN)), tcol = tid % ((BN) / (TN));                          \
        A += (long)ctaid_y() * (BM) * K;                                                           \
        B += (long)ctaid_x() * (BN);                                                               \
        C += (long)ctaid_y() * (BM) * N + (long)ctaid_x() * (BN);                                  \
        float acc[(TM) * (TN)];                                                                    \
        _Pragma("unroll")                                                                          \
        for (int i = 0; i < (TM) * (TN); i++)                                                      \
            acc[i] = 0.0f;                                                                         \
        float ra[TM], rb[TN];                                                                      \
        for (int k0 = 0; k0 < K; k0 += (BK)) {                                                     \
            for (int i = tid; i < (BM) * (BK); i += nthreads) {                                    \
                int m = i / (BK), k = i % (BK);                                                    \
                As[k * (BM) + m] = A[(long)m * K + k];                                             \
            }                                                                                      \
            for (int i = tid; i < (BK) * (BN); i += nthreads) {                                    \
                int k = i / (BN), n = i % (BN);                                                    \
                Bs[k * (BN) + n] = B[(long)k * N + n];                                             \
            }                                                                                      \
            __syncthreads();                                                                       \
            _Pragma("unroll")                                                                      \
            for (int k = 0; k < (BK); k++) {                                                       \
                _Pragma("unroll")                                                                  \
                for (int m = 0; m < (TM); m++)                                                     \
                    ra[m] = As[k * (BM) + trow * (TM) + m];                                        \
                _Pragma("unroll")                                                                  \
                for (int n = 0; n < (TN); n++)                                                     \
                    rb[n] = Bs[k * (BN) + tcol * (TN) + n];                                        \
                _Pragma("unroll")                                                                  \
                for (int m = 0; m < (TM); m++)                                                     \
                    _Pragma("unroll")                                                              \
                    for (int n = 0; n < (TN); n++)                                                 \
                        acc[m * (TN) + n] = __builtin_fmaf(ra[m], rb[n], acc[m * (TN) + n]);       \
            }                                                                                      \
            __syncthreads();                                                                       \
            A += (BK);                                                                             \
            B += (long)(BK) * N;                                                                   \
        }                                                                                          \
        _Pragma("unroll")                                                                          \
        for (int m = 0; m < (TM); m++)                                                             \
            _Pragma("unroll")                                                                      \
            for (int n = 0; n < (TN); n++)                                                         \
                C[(long)(trow * (TM) + m) * N + tcol * (TN) + n] = acc[m * (TN) + n];              \
    }
RK_SGEMM_VARIANTS(RK_SGEMM_KERNEL)

/* faulty[c] += the elements of copy c (1 <= c < copies) that differ from copy 0
 * (rk_cmp_differs); copies lie n floats apart. */
__global__ void rk_compare(const float *C, rk_u64 n, int copies, float tol, rk_u64 *faulty)
{
    for (int c = 1; c < copies; c++) {
        rk_u64 bad = 0;
        const float *Cc = C + (rk_u64)c * n;
        for (rk_u64 i = gtid(); i < n; i += gthreads())
            bad += (rk_u64)rk_cmp_differs(C[i], Cc[i], tol);
        if (bad)
            __nvvm_atom_add_gen_ll((long long *)&faulty[c], (long long)bad);
    }
}

/* ---- memory tests: res = {words wrong, lowest wrong index}, res[1] starts at ~0 ------------- */

__global__ void rk_mt_lines_write(rk_u32 *p, rk_u64 n)
{
    int lines = rk_mt_lines(n);
    for (rk_u64 l = gtid(); l < (rk_u64)lines; l += gthreads())
        p[rk_mt_line_index((int)l)] = rk_mt_line_value((int)l);
}

__global__ void rk_mt_lines_check(const rk_u32 *p, rk_u64 n, rk_u64 *res)
{
    int lines = rk_mt_lines(n);
    rk_u64 bad = 0, first = ~0ull;
    for (rk_u64 l = gtid(); l < (rk_u64)lines; l += gthreads()) {
        rk_u64 i = rk_mt_line_index((int)l);
        if (p[i] != rk_mt_line_value((int)l)) {
            bad++;
            first = i < first ? i : first;
        }
    }
    report(res, bad, first);
}

__global__ void rk_mt_own_write(rk_u32 *p, rk_u64 n, rk_u64 base)
{
    for (rk_u64 i = gtid(); i < n; i += gthreads())
        p[i] = rk_mt_own_value(base, i);
}

__global__ void rk_mt_own_check(const rk_u32 *p, rk_u64 n, rk_u64 base, rk_u64 *res)
{
    rk_u64 bad = 0, first = ~0ull;
    for (rk_u64 i = gtid(); i < n; i += gthreads())
        if (p[i] != rk_mt_own_value(base, i)) {
            bad++;
            first = i < first ? i : first;
        }
    report(res, bad, first);
}

__global__ void rk_mt_fill(rk_u32 *p, rk_u64 n, rk_u32 pattern)
{
    for (rk_u64 i = gtid(); i < n; i += gthreads())
        p[i] = pattern;
}

/* Check every word holds `pattern`, and leave ~pattern there. */
__global__ void rk_mt_check_invert(rk_u32 *p, rk_u64 n, rk_u32 pattern, rk_u64 *res)
{
    rk_u64 bad = 0, first = ~0ull;
    for (rk_u64 i = gtid(); i < n; i += gthreads()) {
        if (p[i] != pattern) {
            bad++;
            first = i < first ? i : first;
        }
        p[i] = ~pattern;
    }
    report(res, bad, first);
}

__global__ void rk_mt_check(const rk_u32 *p, rk_u64 n, rk_u32 pattern, rk_u64 *res)
{
    rk_u64 bad = 0, first = ~0ull;
    for (rk_u64 i = gtid(); i < n; i += gthreads())
        if (p[i] != pattern) {
            bad++;
            first = i < first ? i : first;
        }
    report(res, bad, first);
}

__global__ void rk_mt_random_write(rk_u32 *p, rk_u64 n, rk_u32 seed)
{
    rk_u32 s = rk_mt_random_state(seed, gtid());
    for (rk_u64 i = gtid(); i < n; i += gthreads()) {
        s = rk_xorshift32(s);
        p[i] = s;
    }
}

__global__ void rk_mt_random_check(const rk_u32 *p, rk_u64 n, rk_u32 seed, rk_u64 *res)
{
    rk_u64 bad = 0, first = ~0ull;
    rk_u32 s = rk_mt_random_state(seed, gtid());
    for (rk_u64 i = gtid(); i < n; i += gthreads()) {
        s = rk_xorshift32(s);
        if (p[i] != s) {
            bad++;
            first = i < first ? i : first;
        }
    }
    report(res, bad, first);
}

} /* extern "C" */
