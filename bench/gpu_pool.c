/*
 * gpu_pool: the device memory pool (src/gpu/pool.h) over cuMemAlloc/cuMemFree (gpu/cuda.h)
 * against cuMemAlloc/cuMemFree called directly, on bench/pool_trace.h's deterministic mixed
 * allocation trace, same device, same run (scripts/gpu-check.sh runs it). Built only where the
 * pool is in the tree (CMakeLists.txt, RK_GPU_BENCH).
 *
 * usage: gpu_pool [--device N] [--reps R]
 * Prints a markdown table on stdout; exit 0 done, 1 no GPU or a failure, 2 bad usage.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "gpu/cuda.h"
#include "gpu/pool.h"
#include "pool_trace.h" /* beside this file */

static rk_cuda_ctx *x;

static int be_alloc(void *ctx, size_t bytes, uint64_t *addr, rk_err *err)
{
    (void)ctx;
    return rk_cuda_alloc(x, bytes, addr, err);
}

static void be_free(void *ctx, uint64_t addr, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    rk_err e = {0};
    (void)rk_cuda_free(x, addr, &e);
}

/* One pass of the trace: through the pool (p) or straight to the driver (p NULL). Seconds. */
static double run(rk_pool *p, uint64_t *slot, rk_err *err)
{
    size_t n = rk_trace_len();
    double t0 = rk_mono_s();
    for (size_t i = 0; i < n; i++) {
        int is_free;
        size_t bytes, s;
        rk_trace_op(i, &is_free, &bytes, &s);
        int rc = is_free ? (p ? rk_pool_free(p, slot[s], err) : rk_cuda_free(x, slot[s], err))
                         : (p ? rk_pool_alloc(p, bytes, &slot[s], err)
                              : rk_cuda_alloc(x, bytes, &slot[s], err));
        if (rc < 0)
            return -1;
    }
    if (rk_cuda_sync(x, err) < 0)
        return -1;
    return rk_mono_s() - t0;
}

int main(int argc, char **argv)
{
    int dev = 0, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            dev = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gpu_pool [--device N] [--reps R]\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (reps < 1 || reps > 100)
        return 2;
    rk_err err = {0};
    rk_cuda *c;
    if (rk_cuda_open(&c, &err) < 0 || rk_cuda_ctx_open(c, dev, &x, &err) < 0) {
        fprintf(stderr, "gpu_pool: %s\n", err.msg);
        return 1;
    }
    uint64_t free_b = 0, total_b = 0;
    if (rk_cuda_mem_info(x, &free_b, &total_b, &err) < 0) {
        fprintf(stderr, "gpu_pool: %s\n", err.msg);
        return 1;
    }
    if (rk_trace_peak_bytes() > free_b / 2) {
        fprintf(stderr, "gpu_pool: the trace's peak %llu bytes exceeds half the free memory\n",
                (unsigned long long)rk_trace_peak_bytes());
        return 1;
    }
    uint64_t *slot = calloc(rk_trace_slots() + 1, sizeof *slot);
    if (!slot)
        return 1;
    rk_pool_backend be = {.ctx = NULL, .alloc = be_alloc, .free = be_free};
    rk_pool_opts o = {.name = "GPU", .limit_bytes = 0};
    rk_pool *p;
    if (rk_pool_create(&p, &be, &o, &err) < 0) {
        fprintf(stderr, "gpu_pool: %s\n", err.msg);
        return 1;
    }
    double best_drv = INFINITY, best_pool = INFINITY;
    for (int r = 0; r < reps; r++) {
        double td = run(NULL, slot, &err), tp = td < 0 ? -1 : run(p, slot, &err);
        if (td < 0 || tp < 0) {
            fprintf(stderr, "gpu_pool: %s\n", err.msg);
            return 1;
        }
        best_drv = fmin(best_drv, td);
        best_pool = fmin(best_pool, tp);
    }
    rk_pool_stats st;
    rk_pool_stats_get(p, &st);
    size_t n = rk_trace_len();
    printf("| trace ops | cuMemAlloc/Free ops/s | pool ops/s | pool speed-up | pool segments "
           "(cuMemAlloc calls) | peak reserved MiB |\n|---|---|---|---|---|---|\n");
    printf("| %zu | %.0f | %.0f | %.1fx | %llu | %.1f |\n", n, n / best_drv, n / best_pool,
           best_drv / best_pool, (unsigned long long)st.num_device_alloc,
           st.reserved_bytes[RK_POOL_ALL].peak / 1048576.0);
    rk_pool_destroy(p);
    free(slot);
    rk_cuda_ctx_close(x);
    rk_cuda_close(c);
    return 0;
}
