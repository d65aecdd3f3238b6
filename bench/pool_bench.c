/*
 * pool_bench: the device memory pool (gpu/pool.h) against its peer on the CPU. Both sides
 * replay bench/pool_trace.h's training-like trace: the pool over a backend that calls
 * malloc/free for its segments, and malloc/free called directly for every block. Rounds
 * alternate between the two; each round makes a fresh pool (its first pass pays for the
 * segments), replays the trace --passes times and destroys it. Prints ns per operation per
 * side (median and best of the rounds) and the ratio peer / pool (> 1: the pool is faster),
 * and the pool's statistics after one pass. The GPU version is bench/gpu_pool.c.
 *
 *   pool_bench [--rounds N] [--passes N]
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/pool.h"
#include "pool_trace.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int host_alloc(void *ctx, size_t bytes, uint64_t *addr, rk_err *err)
{
    (void)ctx;
    void *p = malloc(bytes);
    if (!p)
        return rk_err_set(err, RK_ENOMEM, "malloc(%zu) failed", bytes);
    *addr = (uint64_t)(uintptr_t)p;
    return RK_OK;
}

static void host_free(void *ctx, uint64_t addr, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free((void *)(uintptr_t)addr);
}

static uint64_t g_slot[RK_TRACE_MAX_SLOTS];

/* One round of the pool: ns per op. */
static double run_pool(int passes, rk_pool_stats *st)
{
    rk_pool_backend be = {NULL, host_alloc, host_free};
    rk_pool_opts o = {"bench", 0};
    rk_pool *p;
    rk_err err;
    size_t n = rk_trace_len();
    double t0 = now_ns();
    if (rk_pool_create(&p, &be, &o, &err) != RK_OK) {
        fprintf(stderr, "pool_bench: %s\n", err.msg);
        exit(1);
    }
    for (int pass = 0; pass < passes; pass++) {
        for (size_t i = 0; i < n; i++) {
            int is_free;
            size_t bytes, slot;
            rk_trace_op(i, &is_free, &bytes, &slot);
            int rc = is_free ? rk_pool_free(p, g_slot[slot], &err)
                             : rk_pool_alloc(p, bytes, &g_slot[slot], &err);
            if (rc != RK_OK) {
                fprintf(stderr, "pool_bench: op %zu: %s\n", i, err.msg);
                exit(1);
            }
        }
        if (pass == 0 && st)
            rk_pool_stats_get(p, st);
    }
    rk_pool_destroy(p);
    return (now_ns() - t0) / ((double)n * passes);
}

/* One round of malloc/free: ns per op. */
static double run_malloc(int passes)
{
    size_t n = rk_trace_len();
    double t0 = now_ns();
    for (int pass = 0; pass < passes; pass++) {
        for (size_t i = 0; i < n; i++) {
            int is_free;
            size_t bytes, slot;
            rk_trace_op(i, &is_free, &bytes, &slot);
            if (is_free) {
                free((void *)(uintptr_t)g_slot[slot]);
            } else {
                void *q = malloc(bytes);
                if (!q) {
                    fprintf(stderr, "pool_bench: malloc(%zu) failed\n", bytes);
                    exit(1);
                }
                g_slot[slot] = (uint64_t)(uintptr_t)q;
            }
        }
    }
    return (now_ns() - t0) / ((double)n * passes);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int parse_count(const char *flag, const char *v, int *out)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < 1 || x > 100000) {
        fprintf(stderr, "pool_bench: %s needs a count from 1 to 100000, got '%s'\n", flag,
                v ? v : "");
        return 2;
    }
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv)
{
    int rounds = 9, passes = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: pool_bench [--rounds N] [--passes N]\n"
                   "Replays bench/pool_trace.h's training-like allocation trace through the\n"
                   "device memory pool over malloc (CPU) and through malloc/free directly,\n"
                   "alternating, N rounds (default 9) of N passes (default 20); prints ns per\n"
                   "operation for each and the ratio malloc / pool.\n");
            return 0;
        }
        int rc;
        if (!strcmp(argv[i], "--rounds"))
            rc = parse_count("--rounds", i + 1 < argc ? argv[++i] : NULL, &rounds);
        else if (!strcmp(argv[i], "--passes"))
            rc = parse_count("--passes", i + 1 < argc ? argv[++i] : NULL, &passes);
        else {
            fprintf(stderr, "pool_bench: unknown argument '%s' (see --help)\n", argv[i]);
            rc = 2;
        }
        if (rc)
            return rc;
    }
    size_t n = rk_trace_len();
    size_t allocs = 0;
    for (size_t i = 0; i < n; i++) {
        int is_free;
        size_t bytes, slot;
        rk_trace_op(i, &is_free, &bytes, &slot);
        allocs += !is_free;
    }
    printf("trace: %zu ops (%zu allocs), %zu slots, peak %.1f MiB live; %d rounds x %d passes\n", n,
           allocs, rk_trace_slots(), (double)rk_trace_peak_bytes() / (1 << 20), rounds, passes);
    double *tp = calloc((size_t)rounds, sizeof *tp), *tm = calloc((size_t)rounds, sizeof *tm);
    if (!tp || !tm)
        return 1;
    rk_pool_stats st;
    run_pool(1, &st); /* warm both once, untimed */
    run_malloc(1);
    for (int r = 0; r < rounds; r++) {
        if (r % 2) {
            tm[r] = run_malloc(passes);
            tp[r] = run_pool(passes, NULL);
        } else {
            tp[r] = run_pool(passes, NULL);
            tm[r] = run_malloc(passes);
        }
    }
    qsort(tp, (size_t)rounds, sizeof *tp, cmp_double);
    qsort(tm, (size_t)rounds, sizeof *tm, cmp_double);
    double mp = tp[rounds / 2], mm = tm[rounds / 2];
    printf("| side | median ns/op | best ns/op |\n|---|---|---|\n");
    printf("| pool over malloc | %.1f | %.1f |\n", mp, tp[0]);
    printf("| malloc/free | %.1f | %.1f |\n", mm, tm[0]);
    printf("ratio malloc / pool (median): %.2f\n", mm / mp);
    printf("pool after one pass: reserved %" PRIu64 " B (peak %" PRIu64 "), %" PRIu64
           " segments, %" PRIu64 " device allocs, peak allocated %" PRIu64
           " B, peak inactive split %" PRIu64 " B\n",
           st.reserved_bytes[RK_POOL_ALL].current, st.reserved_bytes[RK_POOL_ALL].peak,
           st.segment[RK_POOL_ALL].current, st.num_device_alloc,
           st.allocated_bytes[RK_POOL_ALL].peak, st.inactive_split_bytes[RK_POOL_ALL].peak);
    free(tp);
    free(tm);
    return 0;
}
