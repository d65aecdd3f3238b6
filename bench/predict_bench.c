/*
 * predict_bench: inference time of the failure predictor (predict/predict.h) for one GPU's
 * window, the cost `rk run` and the exporter pay per GPU per decision. The goal: a
 * window of 60 steps x 10 signals with 64 LSTM units in at most 1 ms on the 2-core dev
 * machine. Times rk_pred_predict on one window (work space allocated per call, as callers
 * use it), repeated; then a fleet of 32 windows in one call (per window). The peer, in the
 * same run: the same matrix products alone through cblas (input projection, 60 recurrent
 * products, attention projection), a floor no implementation on this BLAS can go under; the
 * ratio says what the element-wise work and the allocation add.
 *
 * usage: predict_bench [WINDOW [FEATURES [HIDDEN [REPEATS]]]]   (default 60 10 64 3000)
 * Prints a table and one JSON line. One BLAS thread unless OPENBLAS_NUM_THREADS says
 * otherwise (as `rk predict`).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"
#include "predict/predict.h"
#include "rekindle/rng.h"

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, dbl_cmp);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

int main(int argc, char **argv)
{
    int T = argc > 1 ? atoi(argv[1]) : 60, F = argc > 2 ? atoi(argv[2]) : 10;
    int H = argc > 3 ? atoi(argv[3]) : 64, reps = argc > 4 ? atoi(argv[4]) : 3000;
    if (T < 1 || F < 1 || H < 1 || reps < 10) {
        fprintf(stderr, "usage: predict_bench [WINDOW [FEATURES [HIDDEN [REPEATS]]]]\n");
        return 2;
    }
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1); /* one window is too small to share */
    enum { FLEET = 32 };
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    c.task = RK_PRED_CLASSIFY;
    c.window = T;
    c.features = F;
    c.hidden = H;
    rk_pred_model *m;
    rk_err err = {0};
    if (rk_pred_create(&m, &c, &err)) {
        fprintf(stderr, "predict_bench: %s\n", err.msg);
        return 1;
    }
    const size_t win = (size_t)T * F;
    float *x = malloc(FLEET * win * sizeof *x), out[FLEET];
    double *t1 = malloc((size_t)reps * sizeof *t1), *tb = malloc((size_t)reps * sizeof *tb);
    const int A = c.attn, G = 4 * H;
    float *wx = calloc((size_t)F * G, sizeof(float)), *wh = calloc((size_t)H * G, sizeof(float));
    float *wa = calloc((size_t)H * A, sizeof(float)), *gates = calloc((size_t)T * G, sizeof(float));
    float *hs = calloc((size_t)T * H, sizeof(float)), *sc = calloc((size_t)T * A, sizeof(float));
    if (!x || !t1 || !tb || !wx || !wh || !wa || !gates || !hs || !sc)
        return 1;
    rk_rng r;
    rk_rng_seed(&r, 1);
    for (size_t i = 0; i < FLEET * win; i++)
        x[i] = rk_rng_normal(&r);
    for (size_t i = 0; i < (size_t)H * G; i++)
        wh[i] = 0.01f * rk_rng_normal(&r);

    double sink = 0;
    /* Warm up (page in code and BLAS buffers). */
    for (int i = 0; i < 50; i++)
        rk_pred_predict(m, x, 1, out, &err);
    for (int i = 0; i < reps; i++) {
        double a = now_s();
        if (rk_pred_predict(m, x + (size_t)(i % FLEET) * win, 1, out, &err)) {
            fprintf(stderr, "predict_bench: %s\n", err.msg);
            return 1;
        }
        t1[i] = now_s() - a;
        sink += out[0];
    }
    int fleet_reps = reps / 10;
    for (int i = 0; i < fleet_reps; i++) {
        double a = now_s();
        rk_pred_predict(m, x, FLEET, out, &err);
        tb[i] = (now_s() - a) / FLEET;
        sink += out[1];
    }
    double *tp = malloc((size_t)reps * sizeof *tp);
    for (int i = 0; i < reps; i++) {
        double a = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, G, F, 1.0f, x, F, wx, G, 0.0f,
                    gates, G);
        for (int t = 1; t < T; t++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, G, H, 1.0f,
                        hs + (size_t)(t - 1) * H, H, wh, G, 1.0f, gates + (size_t)t * G, G);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, A, H, 1.0f, hs, H, wa, A, 0.0f,
                    sc, A);
        tp[i] = now_s() - a;
        sink += gates[i % G];
    }
    double p50 = pct(t1, reps, 0.5) * 1e3, p99 = pct(t1, reps, 0.99) * 1e3;
    double f50 = pct(tb, fleet_reps, 0.5) * 1e3, b50 = pct(tp, reps, 0.5) * 1e3;
    printf("predictor inference: window %d x %d features, LSTM %d, attention %d, dense %d, "
           "%zu parameters, %d repeats\n\n",
           T, F, H, c.attn, c.dense, rk_pred_num_params(m), reps);
    printf("| case | median ms | p99 ms | goal |\n|---|---|---|---|\n");
    printf("| one window per call | %.4f | %.4f | <= 1 ms |\n", p50, p99);
    printf("| fleet of %d in one call, per window | %.4f | | |\n", FLEET, f50);
    printf("| peer: the matrix products alone (cblas) | %.4f | | |\n", b50);
    printf("\nratio one window / matrix products alone: %.2f\n", p50 / b50);
    printf("{\"window\": %d, \"features\": %d, \"hidden\": %d, \"one_ms_median\": %.5f, "
           "\"one_ms_p99\": %.5f, \"fleet_ms_per_window\": %.5f, \"blas_floor_ms\": %.5f, "
           "\"goal_ms\": 1.0, \"met\": %s}\n",
           T, F, H, p50, p99, f50, b50, p50 <= 1.0 ? "true" : "false");
    if (sink == 12345.678)
        printf("\n");
    rk_pred_free(m);
    free(x);
    free(t1);
    free(tb);
    free(tp);
    free(wx);
    free(wh);
    free(wa);
    free(gates);
    free(hs);
    free(sc);
    return 0;
}
