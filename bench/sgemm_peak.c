/*
 * sgemm_peak: the machine's sgemm roofline for bench/train_throughput. Times C = A * B on
 * square float32 matrices (default 1024^3, row-major, random values in [-1, 1], so nothing
 * sinks into denormals) through OpenBLAS's cblas_sgemm or oneDNN's dnnl_sgemm at a given
 * thread count, and prints one JSON line with the best GFLOP/s of the timed calls (2 n^3
 * FLOPs a call; one untimed call first). Relies on OpenBLAS (pthread build: its pool size
 * is set with openblas_set_num_threads) and oneDNN (OpenMP: omp_set_num_threads).
 *
 * usage: sgemm_peak openblas|onednn THREADS [N [REPEATS]]
 */
#define _POSIX_C_SOURCE 200809L

#include <cblas.h>
#include <errno.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"

static long parse_long(const char *what, const char *s, long min, long max)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        fprintf(stderr, "sgemm_peak: %s: expected an integer in %ld..%ld, got '%s'\n", what, min,
                max, s);
        exit(2);
    }
    return v;
}

/* xorshift64*: a fixed-seed fill, so every run multiplies the same matrices */
static void fill(float *p, size_t n, unsigned long long seed)
{
    unsigned long long x = seed;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        unsigned long long r = x * 2685821657736338717ULL;
        p[i] = (float)((double)(r >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: sgemm_peak openblas|onednn THREADS [N [REPEATS]]\n");
        return 2;
    }
    int onednn;
    if (!strcmp(argv[1], "openblas"))
        onednn = 0;
    else if (!strcmp(argv[1], "onednn"))
        onednn = 1;
    else {
        fprintf(stderr, "sgemm_peak: library: expected openblas or onednn, got '%s'\n", argv[1]);
        return 2;
    }
    int threads = (int)parse_long("THREADS", argv[2], 1, 1024);
    long n = argc > 3 ? parse_long("N", argv[3], 16, 16384) : 1024;
    int reps = argc > 4 ? (int)parse_long("REPEATS", argv[4], 1, 1000) : 5;

    /* Only the library being timed gets the threads; the other one is held to one. */
    openblas_set_num_threads(onednn ? 1 : threads);
    omp_set_num_threads(onednn ? threads : 1);

    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "sgemm_peak: out of memory for three %ldx%ld matrices\n", n, n);
        return 1;
    }
    fill(a, nn, 1);
    fill(b, nn, 2);
    memset(c, 0, nn * sizeof *c);

    double best = 0.0;
    for (int r = 0; r <= reps; r++) {
        double t0 = rk_mono_s();
        if (onednn) {
            dnnl_status_t st = dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            if (st != dnnl_success) {
                fprintf(stderr, "sgemm_peak: dnnl_sgemm failed (status %d)\n", (int)st);
                return 1;
            }
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a,
                        (int)n, b, (int)n, 0.0f, c, (int)n);
        }
        double s = rk_mono_s() - t0;
        if (r > 0 && (best == 0.0 || s < best)) /* call 0 is the untimed warm-up */
            best = s;
    }
    double gflops = 2.0 * (double)n * (double)n * (double)n / best / 1e9;
    printf("{\"lib\":\"%s\",\"threads\":%d,\"n\":%ld,\"repeats\":%d,\"best_s\":%.6f,"
           "\"gflops\":%.2f,\"check\":%.4f}\n",
           argv[1], threads, n, reps, best, gflops, (double)c[nn / 2]);
    free(a);
    free(b);
    free(c);
    return 0;
}
