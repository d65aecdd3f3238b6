/*
 * A fake libcuda.so.1 for tests (loaded through the real dlopen path with RK_CUDA_LIB): one
 * simulated device, "Simulated GPU (fake_cuda, tests only)", bus 0000:01:00.0 (fake_nvml's
 * GPU 0), cc 8.0, 6 MiB free, host memory as device memory, and every kernel of
 * src/gpu/kernels.cu run on the CPU by its host reference (gpu/ref.c). Faults are injected
 * with FAKE_CUDA_FAULT: "sgemm:COPY" flips a bit of result copy COPY's element 5 after each
 * SGEMM into it; "memory:WORD" makes word WORD of the largest allocation read back wrong
 * in every memory test check. Nothing else of the driver is emulated.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/ref.h"

typedef int CUresult;
#define FREE_BYTES (6u << 20)

static size_t used, big_n;
static uint64_t big_base;
static int fault_copy = -1;
static long long fault_word = -1;
static int sgemm_calls;

static void fault_init(void)
{
    const char *f = getenv("FAKE_CUDA_FAULT");
    if (f && !strncmp(f, "sgemm:", 6))
        fault_copy = atoi(f + 6);
    if (f && !strncmp(f, "memory:", 7))
        fault_word = atoll(f + 7);
}

CUresult cuInit(unsigned flags);
CUresult cuInit(unsigned flags)
{
    (void)flags;
    fault_init();
    return 0;
}
CUresult cuDriverGetVersion(int *v);
CUresult cuDriverGetVersion(int *v)
{
    *v = 12040;
    return 0;
}
CUresult cuGetErrorName(CUresult e, const char **s);
CUresult cuGetErrorName(CUresult e, const char **s)
{
    *s = e == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
CUresult cuGetErrorString(CUresult e, const char **s);
CUresult cuGetErrorString(CUresult e, const char **s)
{
    *s = e == 2 ? "out of memory" : "unknown error";
    return 0;
}
CUresult cuDeviceGet(int *d, int ordinal);
CUresult cuDeviceGet(int *d, int ordinal)
{
    *d = ordinal;
    return ordinal == 0 ? 0 : 101;
}
CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetCount(int *n)
{
    *n = 1;
    return 0;
}
CUresult cuDeviceGetName(char *name, int len, int d);
CUresult cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    snprintf(name, (size_t)len, "Simulated GPU (fake_cuda, tests only)");
    return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int d);
CUresult cuDeviceGetAttribute(int *v, int attr, int d)
{
    (void)d;
    *v = attr == 75 ? 8 : attr == 76 ? 0 : attr == 16 ? 1 : 0;
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *b, int d);
CUresult cuDeviceTotalMem_v2(size_t *b, int d)
{
    (void)d;
    *b = FREE_BYTES;
    return 0;
}
CUresult cuDeviceGetPCIBusId(char *bus, int len, int d);
CUresult cuDeviceGetPCIBusId(char *bus, int len, int d)
{
    (void)d;
    snprintf(bus, (size_t)len, "0000:01:00.0");
    return 0;
}
static int ctx_token;
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d);
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d)
{
    (void)d;
    *ctx = &ctx_token;
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d);
CUresult cuDevicePrimaryCtxRelease_v2(int d)
{
    (void)d;
    return 0;
}
CUresult cuCtxSetCurrent(void *ctx);
CUresult cuCtxSetCurrent(void *ctx)
{
    (void)ctx;
    return 0;
}
CUresult cuCtxSynchronize(void);
CUresult cuCtxSynchronize(void)
{
    return 0;
}
CUresult cuMemGetInfo_v2(size_t *f, size_t *t);
CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
    *f = FREE_BYTES - used;
    *t = FREE_BYTES;
    return 0;
}
CUresult cuMemAlloc_v2(uint64_t *p, size_t bytes);
CUresult cuMemAlloc_v2(uint64_t *p, size_t bytes)
{
    if (bytes > FREE_BYTES - used)
        return 2;
    void *m = malloc(bytes + 8);
    if (!m)
        return 2;
    memcpy(m, &bytes, 8);
    used += bytes;
    *p = (uint64_t)(uintptr_t)((char *)m + 8);
    if (bytes / 4 > big_n) {
        big_n = bytes / 4;
        big_base = *p;
    }
    return 0;
}
CUresult cuMemFree_v2(uint64_t p);
CUresult cuMemFree_v2(uint64_t p)
{
    char *m = (char *)(uintptr_t)p - 8;
    size_t bytes;
    memcpy(&bytes, m, 8);
    used -= bytes;
    if (p == big_base)
        big_base = 0, big_n = 0;
    free(m);
    return 0;
}
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *s, size_t n);
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *s, size_t n)
{
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
CUresult cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n);
CUresult cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n)
{
    memcpy(d, (const void *)(uintptr_t)s, n);
    return 0;
}
CUresult cuMemsetD32_v2(uint64_t d, unsigned v, size_t n);
CUresult cuMemsetD32_v2(uint64_t d, unsigned v, size_t n)
{
    uint32_t *p = (uint32_t *)(uintptr_t)d;
    for (size_t i = 0; i < n; i++)
        p[i] = v;
    return 0;
}
static int module_token;
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, int *o, void **v);
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, int *o, void **v)
{
    (void)img, (void)n, (void)o, (void)v;
    *m = &module_token;
    return 0;
}
CUresult cuModuleUnload(void *m);
CUresult cuModuleUnload(void *m)
{
    (void)m;
    return 0;
}

static const char *const kernel_names[] = {
    "rk_fill_input",   "rk_compare",         "rk_mt_lines_write",  "rk_mt_lines_check",
    "rk_mt_own_write", "rk_mt_own_check",    "rk_mt_fill",         "rk_mt_check_invert",
    "rk_mt_check",     "rk_mt_random_write", "rk_mt_random_check",
};
#define NK (sizeof kernel_names / sizeof kernel_names[0])
static int fn_ids[NK + 16];

CUresult cuModuleGetFunction(void **f, void *m, const char *name);
CUresult cuModuleGetFunction(void **f, void *m, const char *name)
{
    (void)m;
    for (size_t i = 0; i < NK; i++)
        if (!strcmp(name, kernel_names[i])) {
            fn_ids[i] = (int)i;
            *f = &fn_ids[i];
            return 0;
        }
    int v = rk_sgemm_variant_find(name);
    if (v < 0)
        return 500;
    fn_ids[NK + v] = (int)NK + v;
    *f = &fn_ids[NK + v];
    return 0;
}

#define P(i, T) (*(T *)args[i])
#define PTR(i, T) ((T *)(uintptr_t)P(i, uint64_t))

/* A memory checker's view: the faulty word reads back flipped. */
static void inject_mem(uint32_t *p, uint64_t n)
{
    if (fault_word >= 0 && (uint64_t)(uintptr_t)p == big_base && (uint64_t)fault_word < n)
        p[fault_word] ^= 0x00010000u;
}
static void report(uint64_t *res, uint64_t bad, uint64_t first)
{
    if (bad) {
        res[0] += bad;
        res[1] = first < res[1] ? first : res[1];
    }
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shm, void *stream, void **args, void **extra);
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shm, void *stream, void **args, void **extra)
{
    (void)gy, (void)gz, (void)by, (void)bz, (void)shm, (void)stream, (void)extra;
    int id = *(int *)f;
    uint64_t threads = (uint64_t)gx * bx, first;
    if (id >= (int)NK) {
        const float *a = PTR(0, const float), *b = PTR(1, const float);
        float *c = PTR(2, float);
        int m = P(3, int), n = P(4, int), k = P(5, int);
        rk_ref_sgemm_fma(a, b, c, m, n, k);
        /* copies lie n*n apart from the region's start: the largest allocation */
        uint64_t off = (uint64_t)(uintptr_t)c - big_base, copy = off / ((uint64_t)m * n * 4);
        if (fault_copy >= 0 && (uint64_t)(uintptr_t)c >= big_base && copy == (uint64_t)fault_copy)
            c[5] = -c[5] - 1.0f;
        sgemm_calls++;
        return 0;
    }
    switch (id) {
    case 0: rk_ref_fill_input(PTR(0, float), P(1, uint64_t), P(2, uint32_t)); break;
    case 1: {
        uint64_t faulty[256] = {0};
        int copies = P(2, int);
        rk_ref_compare(PTR(0, const float), P(1, uint64_t), copies, P(3, float), faulty);
        uint64_t *out = PTR(4, uint64_t);
        for (int i = 1; i < copies && i < 256; i++)
            out[i] += faulty[i];
        break;
    }
    case 2: rk_ref_mt_lines_write(PTR(0, uint32_t), P(1, uint64_t)); break;
    case 3: {
        inject_mem(PTR(0, uint32_t), P(1, uint64_t));
        uint64_t bad = rk_ref_mt_lines_check(PTR(0, uint32_t), P(1, uint64_t), &first);
        report(PTR(2, uint64_t), bad, first);
        break;
    }
    case 4: rk_ref_mt_own_write(PTR(0, uint32_t), P(1, uint64_t), P(2, uint64_t)); break;
    case 5: {
        inject_mem(PTR(0, uint32_t), P(1, uint64_t));
        uint64_t bad =
            rk_ref_mt_own_check(PTR(0, uint32_t), P(1, uint64_t), P(2, uint64_t), &first);
        report(PTR(3, uint64_t), bad, first);
        break;
    }
    case 6: rk_ref_mt_fill(PTR(0, uint32_t), P(1, uint64_t), P(2, uint32_t)); break;
    case 7: {
        inject_mem(PTR(0, uint32_t), P(1, uint64_t));
        uint64_t bad =
            rk_ref_mt_check_invert(PTR(0, uint32_t), P(1, uint64_t), P(2, uint32_t), &first);
        report(PTR(3, uint64_t), bad, first);
        break;
    }
    case 8: {
        uint64_t bad =
            rk_ref_mt_check(PTR(0, const uint32_t), P(1, uint64_t), P(2, uint32_t), &first);
        report(PTR(3, uint64_t), bad, first);
        break;
    }
    case 9:
        rk_ref_mt_random_write(PTR(0, uint32_t), P(1, uint64_t), P(2, uint32_t), threads);
        break;
    case 10: {
        inject_mem(PTR(0, uint32_t), P(1, uint64_t));
        uint64_t bad = rk_ref_mt_random_check(PTR(0, const uint32_t), P(1, uint64_t),
                                              P(2, uint32_t), threads, &first);
        report(PTR(3, uint64_t), bad, first);
        break;
    }
    }
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
CUresult cuEventCreate(void **e, unsigned flags);
CUresult cuEventCreate(void **e, unsigned flags)
{
    (void)flags;
    *e = calloc(1, sizeof(double));
    return *e ? 0 : 2;
}
CUresult cuEventRecord(void *e, void *stream);
CUresult cuEventRecord(void *e, void *stream)
{
    (void)stream;
    *(double *)e = now_ms();
    return 0;
}
CUresult cuEventSynchronize(void *e);
CUresult cuEventSynchronize(void *e)
{
    (void)e;
    return 0;
}
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b);
CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b)
{
    *ms = (float)(*(double *)b - *(double *)a);
    return 0;
}
CUresult cuEventDestroy_v2(void *e);
CUresult cuEventDestroy_v2(void *e)
{
    free(e);
    return 0;
}
