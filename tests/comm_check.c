/*
 * comm_check: run under mpirun by tests/it_compress.sh. Every rank feeds the compressed
 * allreduce (rekindle/comm.h) the same seeded inputs for several steps; rank 0 also computes
 * what every rank must get with a one-process reference written from the format's definition
 * (docs/compression.md), independent of src/comm/compress.c, and the results must be the same
 * bits on every rank and equal to the reference. It also checks the error-feedback invariant
 * (sum of inputs = sum of results + residuals), the collectives and byte counts, and
 * rk_comm_share_status (rank 0 acts, every rank learns its status).
 * Prints "ok ..." lines; exit 0 when everything held, 1 otherwise.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/amp.h"
#include "rekindle/comm.h"
#include "rekindle/rng.h"

#define BLK RK_COMPRESS_BLOCK

static int failures;

static void check(int ok, const char *what, int rank)
{
    if (!ok)
        failures++;
    if (rank == 0 || !ok)
        printf("%s - %s (rank %d)\n", ok ? "ok" : "FAIL", what, rank);
}

/* input of rank r at step t: gradient-like values, some exact zeros, a zero block, specials of
 * scale (tiny and large) */
static void input(float *g, size_t n, int r, int t)
{
    rk_rng rng;
    rk_rng_derive(&rng, 99, (uint64_t)r, (uint64_t)t);
    for (size_t i = 0; i < n; i++) {
        double u = rk_rng_uniform(&rng) * 2.0 - 1.0;
        float v = (float)(u * 1e-3);
        if (i % 97 == 5)
            v = 0.0f;
        if (i >= 2 * BLK && i < 3 * BLK)
            v = 0.0f; /* a block of zeros */
        if (i >= 3 * BLK && i < 4 * BLK)
            v *= 1e-6f; /* tiny values */
        if (i >= 4 * BLK && i < 5 * BLK)
            v *= 1e5f; /* large values */
        g[i] = v;
    }
}

/* ---- reference: the format, written plainly --------------------------------------- */

typedef struct ref {
    rk_compress kind;
    int p;
    size_t n, cs;
    float **ew; /* per rank, p * cs */
    float *es;  /* per chunk owner j: es + j * cs */
} ref;

static float ref_mean_abs(const float *x, int len)
{
    float part[32] = {0};
    for (int i = 0; i < len; i++)
        part[i % 32] += fabsf(x[i]);
    float s = 0.0f;
    for (int j = 0; j < 32; j++)
        s += part[j];
    return len > 0 ? s / (float)len : 0.0f;
}

/* compress-decompress one block of len values in place; returns residual into r (if not
 * NULL) */
static void ref_roundtrip(rk_compress kind, float *x, int len, float *resid)
{
    if (kind == RK_COMPRESS_ONEBIT || kind == RK_COMPRESS_ONEBIT_NOEF) {
        float s = ref_mean_abs(x, len);
        for (int i = 0; i < len; i++) {
            float d = signbit(x[i]) ? -s : s;
            if (resid)
                resid[i] = x[i] - d;
            x[i] = d;
        }
        return;
    }
    float k = 1.0f;
    if (kind == RK_COMPRESS_FP16) {
        float m = 0.0f;
        for (int i = 0; i < len; i++)
            if (fabsf(x[i]) > m)
                m = fabsf(x[i]);
        if (m > 0.0f && isfinite(m)) {
            int e = 0;
            while (ldexpf(m, -e) >= 1.0f)
                e++;
            while (ldexpf(m, -e) < 0.5f)
                e--;
            k = ldexpf(1.0f, 15 - e > 127 ? 127 : 15 - e);
        }
    }
    float inv = 1.0f / k;
    for (int i = 0; i < len; i++) {
        float v = x[i] * k;
        x[i] = kind == RK_COMPRESS_FP16 ? rk_f16_to_f32(rk_f32_to_f16(v)) * inv
                                        : rk_bf16_to_f32(rk_f32_to_bf16(v)) * inv;
    }
}

/* one step of the whole world: inputs g[r] (n each) -> out (n), residuals updated */
static void ref_step(ref *R, float **g, float *out, int mean)
{
    int ef = R->kind == RK_COMPRESS_ONEBIT;
    size_t wl = (size_t)R->p * R->cs;
    float *dec = calloc((size_t)R->p * wl, sizeof(float)); /* rank r's decompressed input */
    float *x = calloc(wl, sizeof(float));
    for (int r = 0; r < R->p; r++) {
        for (size_t i = 0; i < wl; i++)
            x[i] = i < R->n ? (ef ? g[r][i] + R->ew[r][i] : g[r][i]) : 0.0f;
        for (size_t at = 0; at < wl; at += BLK) {
            int len = at >= R->n ? 0 : (int)(R->n - at < BLK ? R->n - at : BLK);
            float resid[BLK] = {0};
            ref_roundtrip(R->kind, x + at, len, ef ? resid : NULL);
            if (ef)
                memcpy(R->ew[r] + at, resid, sizeof resid);
            memcpy(dec + (size_t)r * wl + at, x + at, (size_t)len * sizeof(float));
        }
    }
    for (int j = 0; j < R->p; j++) {
        for (size_t at = (size_t)j * R->cs; at < (size_t)(j + 1) * R->cs; at += BLK) {
            int len = at >= R->n ? 0 : (int)(R->n - at < BLK ? R->n - at : BLK);
            float y[BLK] = {0}, resid[BLK] = {0};
            for (int i = 0; i < len; i++) {
                float s = dec[at + i];
                for (int r = 1; r < R->p; r++)
                    s += dec[(size_t)r * wl + at + i];
                if (mean)
                    s /= (float)R->p;
                if (ef)
                    s += R->es[at + i];
                y[i] = s;
            }
            ref_roundtrip(R->kind, y, len, ef ? resid : NULL);
            if (ef)
                memcpy(R->es + at, resid, sizeof resid);
            for (int i = 0; i < len; i++)
                out[at + i] = y[i];
        }
    }
    free(dec);
    free(x);
}

static int run_kind(rk_comm *c, rk_compress kind, size_t n, int mean, int steps)
{
    int rank = rk_comm_rank(c), p = rk_comm_size(c);
    rk_err err = {0};
    rk_compressor *z = NULL;
    if (rk_compressor_create(&z, c, kind, n, &err)) {
        printf("FAIL - create: %s\n", err.msg);
        return 1;
    }
    size_t cs = ((n + (size_t)p - 1) / (size_t)p + BLK - 1) / BLK * BLK;
    if (cs == 0)
        cs = BLK;
    ref R = {.kind = kind, .p = p, .n = n, .cs = cs};
    R.ew = calloc((size_t)p, sizeof *R.ew);
    for (int r = 0; r < p; r++)
        R.ew[r] = calloc((size_t)p * cs, sizeof(float));
    R.es = calloc((size_t)p * cs, sizeof(float));
    float **g = calloc((size_t)p, sizeof *g);
    for (int r = 0; r < p; r++)
        g[r] = calloc(n + 1, sizeof(float));
    float *buf = calloc(n + 1, sizeof(float)), *want = calloc(n + 1, sizeof(float));
    double *in_sum = calloc(n + 1, sizeof(double)), *out_sum = calloc(n + 1, sizeof(double));
    int same = 1, agree = 1;
    for (int t = 0; t < steps; t++) {
        for (int r = 0; r < p; r++)
            input(g[r], n, r, t);
        memcpy(buf, g[rank], n * sizeof(float));
        if (rk_compressor_allreduce(z, buf, mean, &err)) {
            printf("FAIL - allreduce: %s\n", err.msg);
            return 1;
        }
        rk_compressor_commit(z);
        ref_step(&R, g, want, mean);
        if (memcmp(buf, want, n * sizeof(float)) != 0)
            same = 0;
        uint64_t h = 1469598103934665603ULL, all[64];
        for (size_t i = 0; i < n * sizeof(float); i++)
            h = (h ^ ((const uint8_t *)buf)[i]) * 1099511628211ULL;
        rk_comm_allgather_u64(c, h, all, &err);
        for (int r = 0; r < p; r++)
            agree &= all[r] == h;
        for (size_t i = 0; i < n; i++) {
            for (int r = 0; r < p; r++)
                in_sum[i] += g[r][i];
            out_sum[i] += mean ? (double)buf[i] * p : buf[i];
        }
    }
    char what[160];
    snprintf(what, sizeof what, "%s n=%zu %s, %d steps: same bits as the one-process reference",
             rk_compress_name(kind), n, mean ? "mean" : "sum", steps);
    check(same, what, rank);
    snprintf(what, sizeof what, "%s n=%zu: every rank has the same bits", rk_compress_name(kind),
             n);
    check(agree, what, rank);
    if (kind == RK_COMPRESS_ONEBIT) {
        /* invariant: inputs = results + every residual (worker residuals of all ranks, server
         * residuals of all chunk owners), up to float rounding; with mean the server works on
         * sums / p, so its residual counts p times */
        size_t len = rk_compressor_state_len(z);
        float *all = calloc((size_t)p * len, sizeof(float));
        rk_comm_allgather(c, rk_compressor_state(z), len * sizeof(float), all, &err);
        double worst = 0.0, scale = 0.0;
        for (size_t i = 0; i < n; i++) {
            double resid = 0.0;
            for (int r = 0; r < p; r++)
                resid += all[(size_t)r * len + i];
            size_t owner = i / cs, off = i % cs;
            resid += (mean ? p : 1) * (double)all[owner * len + (size_t)p * cs + off];
            double d = fabs(in_sum[i] - (out_sum[i] + resid));
            worst = d > worst ? d : worst;
            scale = fabs(in_sum[i]) > scale ? fabs(in_sum[i]) : scale;
        }
        snprintf(what, sizeof what,
                 "onebit n=%zu: inputs = results + residuals (worst gap %.3g of max %.3g)", n,
                 worst, scale);
        check(worst <= 1e-5 * scale, what, rank);
        /* the state is what the reference kept */
        int st = memcmp(rk_compressor_state(z), R.ew[rank], (size_t)p * cs * sizeof(float)) == 0 &&
                 memcmp(rk_compressor_state(z) + (size_t)p * cs, R.es + (size_t)rank * cs,
                        cs * sizeof(float)) == 0;
        snprintf(what, sizeof what, "onebit n=%zu: residuals equal the reference's", n);
        check(st, what, rank);
        free(all);
    }
    rk_compressor_free(z);
    for (int r = 0; r < p; r++) {
        free(R.ew[r]);
        free(g[r]);
    }
    free(R.ew);
    free(R.es);
    free(g);
    free(buf);
    free(want);
    free(in_sum);
    free(out_sum);
    return 0;
}

int main(void)
{
    rk_comm *c = NULL;
    rk_err err = {0};
    if (rk_comm_open(&c, "auto", &err)) {
        fprintf(stderr, "comm_check: %s\n", err.msg);
        return 1;
    }
    int rank = rk_comm_rank(c), p = rk_comm_size(c);
    if (p > 64) {
        fprintf(stderr, "comm_check: at most 64 ranks\n");
        return 1;
    }
    /* plain collectives: alltoall delivers piece j of rank i to rank j at slot i */
    int send[64], recv[64];
    for (int j = 0; j < p; j++)
        send[j] = rank * 1000 + j;
    rk_comm_stats_reset(c);
    int ok = rk_comm_alltoall(c, send, sizeof(int), recv, &err) == RK_OK;
    for (int i = 0; i < p && ok; i++)
        ok = recv[i] == i * 1000 + rank;
    check(ok, "alltoall delivers piece j of rank i to rank j, slot i", rank);
    int mine = rank + 7, all[64];
    ok = rk_comm_allgather(c, &mine, sizeof mine, all, &err) == RK_OK;
    for (int i = 0; i < p && ok; i++)
        ok = all[i] == i + 7;
    check(ok, "allgather puts rank i's piece at slot i", rank);
    rk_comm_stats st;
    rk_comm_stats_get(c, &st);
    check(st.calls[RK_COMM_ALLTOALL] == 1 && st.bytes[RK_COMM_ALLTOALL] == (uint64_t)(p - 1) * 4 &&
              st.bytes[RK_COMM_ALLGATHER] == (uint64_t)(p - 1) * 4,
          "alltoall and allgather count (p-1) pieces sent", rank);
    float v[3] = {(float)rank, 1.0f, 2.0f * rank};
    ok = rk_comm_allreduce_mean_f32(c, v, 3, &err) == RK_OK;
    check(ok && v[1] == 1.0f && v[0] == (float)(p - 1) / 2.0f, "allreduce mean", rank);

    /* rank 0 acts, every rank learns its status: rank 0's status and data reach every rank
     * (the others' own status is ignored), and only the others are told rank 0 failed */
    int64_t data[2] = {rank == 0 ? 42 : 0, rank == 0 ? -7 : 0};
    int learned = -1;
    rk_comm_stats_reset(c);
    int got = rk_comm_share_status(c, rank == 0 ? RK_OK : RK_EIO, data, 2, &learned, &err);
    rk_comm_stats_get(c, &st);
    check(got == RK_OK && learned == 0 && data[0] == 42 && data[1] == -7 &&
              st.calls[RK_COMM_BCAST] == (p > 1),
          "share_status: rank 0's success and data reach every rank in one broadcast", rank);
    rk_err own = {0};
    int64_t holder = rank == 0 ? 1234 : 0;
    if (rank == 0)
        rk_err_set(&own, RK_EBUSY, "rank 0's own words");
    got = rk_comm_share_status(c, rank == 0 ? RK_EBUSY : RK_OK, &holder, 1, &learned, &own);
    check(got == RK_EBUSY && own.code == RK_EBUSY && holder == 1234 && learned == (rank != 0) &&
              strcmp(own.msg, rank == 0 ? "rank 0's own words"
                                        : "rank 0 failed: in use by another process") == 0,
          "share_status: rank 0's failure is every rank's, said as rank 0's on the others", rank);
    int64_t many[RK_COMM_STATUS_DATA_MAX + 1] = {0};
    got = rk_comm_share_status(c, RK_OK, many, RK_COMM_STATUS_DATA_MAX + 1, &learned, &own);
    check(got == (p > 1 ? RK_EINVAL : RK_OK) && learned == 0,
          "share_status: more values than RK_COMM_STATUS_DATA_MAX are refused on every rank", rank);

    static const rk_compress kinds[] = {RK_COMPRESS_FP16, RK_COMPRESS_BF16, RK_COMPRESS_ONEBIT,
                                        RK_COMPRESS_ONEBIT_NOEF};
    size_t sizes[] = {1, (size_t)p * BLK, 5 * BLK * (size_t)p + 13, 100003};
    for (size_t k = 0; k < 4; k++)
        for (size_t s = 0; s < 4; s++)
            if (run_kind(c, kinds[k], sizes[s], s % 2, 6))
                failures++;
    /* bytes: onebit sends 1 bit per value plus a scale per block, twice (alltoall, allgather) */
    rk_compressor *z = NULL, *none = NULL;
    rk_compressor_create(&z, c, RK_COMPRESS_ONEBIT, 1 << 20, &err);
    rk_compressor_create(&none, c, RK_COMPRESS_NONE, 1 << 20, &err);
    float *big = calloc(1 << 20, sizeof(float));
    rk_comm_stats_reset(c);
    rk_compressor_allreduce(z, big, 0, &err);
    uint64_t sent = rk_comm_bytes_sent(c);
    char what[160];
    snprintf(what, sizeof what,
             "onebit of 1 Mi values sends %llu bytes (counted %llu), %.1fx less "
             "than a ring allreduce",
             (unsigned long long)rk_compressor_bytes_per_call(z), (unsigned long long)sent,
             (double)rk_compressor_bytes_per_call(none) / (double)(sent ? sent : 1));
    check(p == 1 || (sent == rk_compressor_bytes_per_call(z) &&
                     sent * 25 < rk_compressor_bytes_per_call(none)),
          what, rank);
    free(big);
    rk_compressor_free(z);
    rk_compressor_free(none);
    int total = failures;
    double f = total;
    rk_comm_allreduce_sum_f64(c, &f, 1, &err);
    if (rank == 0)
        printf("%s: %d rank(s), %.0f failure(s)\n", f == 0 ? "PASS" : "FAIL", p, f);
    rk_comm_close(c);
    return f == 0 ? 0 : 1;
}
