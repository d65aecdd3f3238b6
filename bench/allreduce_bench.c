/*
 * allreduce_bench: times MPI_Allreduce (the peer) against rekindle's compressed allreduce
 * (rekindle/comm.h) on the same ranks and the same gradient-like data; run under mpirun by
 * bench/allreduce. Each timing is the slowest rank's, after a barrier; the median of --reps
 * is reported. One JSON line per (method, size) on rank 0's stdout.
 *
 *   allreduce_bench --sizes 16777216,67108864 --methods mpi,fp16,bf16,onebit [--reps 3]
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rekindle/comm.h"
#include "rekindle/rng.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(void)
{
    fprintf(stderr, "usage: allreduce_bench --sizes N[,N...] --methods mpi,none,fp16,bf16,onebit,"
                    "onebit-noef [--reps R]\n");
}

int main(int argc, char **argv)
{
    const char *sizes = NULL, *methods = NULL;
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            sizes = argv[++i];
        else if (!strcmp(argv[i], "--methods") && i + 1 < argc)
            methods = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            usage();
            return 2;
        }
    }
    if (!sizes || !methods || reps < 1 || reps > 100) {
        usage();
        return 2;
    }
    rk_comm *c = NULL;
    rk_err err = {0};
    if (rk_comm_open(&c, "mpi", &err)) {
        fprintf(stderr, "allreduce_bench: %s\n", err.msg);
        return 1;
    }
    int rank = rk_comm_rank(c), p = rk_comm_size(c);
    char szbuf[256];
    snprintf(szbuf, sizeof szbuf, "%s", sizes);
    for (char *ss, *s = strtok_r(szbuf, ",", &ss); s; s = strtok_r(NULL, ",", &ss)) {
        size_t n = strtoull(s, NULL, 10);
        float *data = malloc(n * sizeof(float)), *buf = malloc(n * sizeof(float));
        if (!n || !data || !buf) {
            fprintf(stderr, "allreduce_bench: cannot hold %s floats\n", s);
            return 1;
        }
        rk_rng r;
        rk_rng_derive(&r, 5, (uint64_t)rank, n);
        for (size_t i = 0; i < n; i++) /* gradient-like: normal, scale 1e-3 */
            data[i] = (float)(1e-3 * sqrt(-2.0 * log(rk_rng_uniform(&r) + 1e-300)) *
                              cos(6.283185307179586 * rk_rng_uniform(&r)));
        char mbuf[256];
        snprintf(mbuf, sizeof mbuf, "%s", methods);
        for (char *ms, *m = strtok_r(mbuf, ",", &ms); m; m = strtok_r(NULL, ",", &ms)) {
            int mpi = !strcmp(m, "mpi");
            rk_compress kind = RK_COMPRESS_NONE;
            rk_compressor *z = NULL;
            if (!mpi &&
                (rk_compress_parse(m, &kind, &err) || rk_compressor_create(&z, c, kind, n, &err))) {
                fprintf(stderr, "allreduce_bench: %s\n", err.msg);
                return 2;
            }
            double t[101];
            double err_rel = 0.0;
            rk_comm_stats_reset(c);
            for (int k = -1; k < reps; k++) { /* k = -1: warm-up */
                memcpy(buf, data, n * sizeof(float));
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = now_s();
                int rc = mpi ? (MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM,
                                              MPI_COMM_WORLD) != MPI_SUCCESS
                                    ? RK_ECOMM
                                    : RK_OK)
                             : rk_compressor_allreduce(z, buf, 0, &err);
                double dt = now_s() - t0;
                if (rc) {
                    fprintf(stderr, "allreduce_bench: %s: %s\n", m, err.msg);
                    return 1;
                }
                if (z)
                    rk_compressor_commit(z);
                MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (k >= 0)
                    t[k] = dt;
            }
            if (!mpi) { /* relative error of one call against the exact sum (first call's) */
                float *exact = malloc(n * sizeof(float));
                memcpy(exact, data, n * sizeof(float));
                MPI_Allreduce(MPI_IN_PLACE, exact, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                double num = 0.0, den = 0.0;
                memcpy(buf, data, n * sizeof(float));
                rk_compressor_allreduce(z, buf, 0, &err);
                for (size_t i = 0; i < n; i++) {
                    num += ((double)buf[i] - exact[i]) * ((double)buf[i] - exact[i]);
                    den += (double)exact[i] * exact[i];
                }
                err_rel = sqrt(num / (den > 0 ? den : 1));
                free(exact);
            }
            qsort(t, (size_t)reps, sizeof t[0], cmp_double);
            uint64_t bytes = z ? rk_compressor_bytes_per_call(z)
                               : (uint64_t)(2.0 * (p - 1) / p * (double)(n * sizeof(float)));
            if (rank == 0) {
                printf("{\"method\":\"%s\",\"floats\":%zu,\"ranks\":%d,\"reps\":%d,"
                       "\"median_s\":%.6f,\"min_s\":%.6f,\"max_s\":%.6f,\"bytes_per_rank\":%llu,"
                       "\"rel_error\":%.3g}\n",
                       m, n, p, reps, t[reps / 2], t[0], t[reps - 1], (unsigned long long)bytes,
                       err_rel);
                fflush(stdout);
            }
            rk_compressor_free(z);
        }
        free(data);
        free(buf);
    }
    rk_comm_close(c);
    return 0;
}
