/*
 * Tests for the predictor (predict/predict.h, predict/model.h): the backward pass agrees with
 * central finite differences for every parameter tensor of both heads (and with a dropout
 * mask), element by element and
 * as a whole tensor, and the checker itself catches a 1% error in any one tensor (so the
 * bound is tight enough to fail a wrong backward); a saved model loads back with the same
 * configuration, bits and predictions, and wrong files are refused with a message naming the
 * problem; the same seeds give the same bits, another seed other bits; training learns tasks
 * that neither chance nor a model with an untrained LSTM can pass (the adding problem: do two
 * marked steps have the same sign; their sum), early stopping stops on a validation set with
 * nothing to learn and keeps the best epoch's weights; bad configurations, options and targets are
 * refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "predict/model.h"
#include "predict/predict.h"
#include "rekindle/rng.h"
#include "rekindle/safetensors.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_predict")

static const char *tmp_path(char *buf, size_t cap, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", g_dir, name);
    assert_true(n > 0 && (size_t)n < cap);
    unlink(buf);
    return buf;
}

static rk_pred_model *make(rk_pred_task task, int T, int F, int H, int A, int D, uint64_t seed)
{
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    c.task = task;
    c.window = T;
    c.features = F;
    c.hidden = H;
    c.attn = A;
    c.dense = D;
    c.seed = seed;
    rk_pred_model *m = NULL;
    rk_err err = {0};
    assert_int_equal(rk_pred_create(&m, &c, &err), RK_OK);
    assert_non_null(m);
    return m;
}

/* Random windows (offset and scaled, so normalisation matters) and targets. */
static void random_windows(rk_pred_task task, int n, int T, int F, uint64_t seed, float *x,
                           float *y)
{
    rk_rng r;
    rk_rng_seed(&r, seed);
    for (int i = 0; i < n * T * F; i++)
        x[i] = 5.0f + 3.0f * rk_rng_normal(&r) + (float)(i % F);
    for (int k = 0; k < n; k++)
        y[k] = task == RK_PRED_CLASSIFY ? (float)(k % 2) : 40.0f + 20.0f * rk_rng_normal(&r);
}

/* ---- gradient check ----------------------------------------------------------------------- */

enum { GC_T = 5, GC_F = 3, GC_H = 4, GC_A = 3, GC_D = 3, GC_B = 4 };

typedef struct gc {
    rk_pred_model *m;
    rk_pred_ws w;
    float x[GC_B * GC_T * GC_F], y[GC_B];
    float pw;
} gc;

static double gc_loss(gc *g)
{
    rk_pred_gather(g->m, &g->w, g->x, NULL, GC_B);
    rk_pred_forward(g->m, &g->w);
    return rk_pred_backward(g->m, &g->w, g->y, g->pw, NULL);
}

static void gc_init(gc *g, rk_pred_task task)
{
    memset(g, 0, sizeof *g);
    g->m = make(task, GC_T, GC_F, GC_H, GC_A, GC_D, 7);
    random_windows(task, GC_B, GC_T, GC_F, 11, g->x, g->y);
    g->pw = task == RK_PRED_CLASSIFY ? 3.0f : 1.0f;
    rk_err err = {0};
    rk_pred_data d = {GC_B, g->x, g->y};
    assert_int_equal(rk_pred_fit_norm(g->m, &d, &err), RK_OK);
    /* Non-zero biases and larger weights than at initialisation, so that every path
     * (saturating gates, attention weights far from uniform) carries gradient. */
    rk_rng r;
    rk_rng_seed(&r, 99);
    for (size_t i = 0; i < g->m->np; i++)
        g->m->p[i] = 0.8f * rk_rng_normal(&r);
    assert_int_equal(rk_pred_ws_init(&g->w, &g->m->c, GC_B, 1, &err), RK_OK);
}

static void gc_free(gc *g)
{
    rk_pred_ws_free(&g->w);
    rk_pred_free(g->m);
}

/* Central differences of the loss for every parameter, in double, with step h relative to
 * the parameter's size. */
static void numeric_grad(gc *g, double *num)
{
    for (size_t i = 0; i < g->m->np; i++) {
        float p0 = g->m->p[i];
        float h = 1e-2f * fmaxf(1.0f, fabsf(p0));
        g->m->p[i] = p0 + h;
        double hp = (double)g->m->p[i] - p0, lp = gc_loss(g);
        g->m->p[i] = p0 - h;
        double hm = (double)p0 - g->m->p[i], lm = gc_loss(g);
        g->m->p[i] = p0;
        num[i] = (lp - lm) / (hp + hm);
    }
}

/* 0 when the analytic gradient `an` agrees with `num` on tensor k: the relative error of the
 * whole tensor (L2) at most 3e-3 and every element within 1e-2 of the larger magnitude plus
 * 1e-3 of the tensor's norm (single elements carry float32 rounding noise of the forward
 * pass). Otherwise 1, and a line saying where. */
static int tensor_mismatch(const gc *g, int k, const float *an, const double *num, int quiet)
{
    const rk_pred_tensor *t = &g->m->t[k];
    double dn = 0, na = 0, nn = 0;
    for (size_t i = t->offset; i < t->offset + t->numel; i++) {
        dn += (an[i] - num[i]) * (an[i] - num[i]);
        na += (double)an[i] * an[i];
        nn += num[i] * num[i];
    }
    double scale = fmax(sqrt(na), sqrt(nn)), rel = sqrt(dn) / scale;
    if (!(scale > 1e-4)) {
        if (!quiet)
            print_error("%s: gradient norm %g is too small to check\n", t->name, scale);
        return 1;
    }
    if (getenv("RK_GRADCHECK_VERBOSE"))
        print_message("%-8s norm %.3g relative error %.2e\n", t->name, scale, rel);
    if (!(rel <= 3e-3)) {
        if (!quiet)
            print_error("%s: relative error %g\n", t->name, rel);
        return 1;
    }
    for (size_t i = t->offset; i < t->offset + t->numel; i++) {
        double e = fabs(an[i] - num[i]);
        double bound = 1e-2 * fmax(fabs(an[i]), fabs(num[i])) + 1e-3 * scale;
        if (!(e <= bound)) {
            if (!quiet)
                print_error("%s[%zu]: analytic %g numeric %g\n", t->name, i - t->offset, an[i],
                            num[i]);
            return 1;
        }
    }
    return 0;
}

static void gradient_check(rk_pred_task task, int dropout)
{
    gc g;
    gc_init(&g, task);
    float mask[GC_B * 2 * GC_H];
    if (dropout) { /* a fixed dropout mask, as training draws one per batch (rate 0.25) */
        rk_rng r;
        rk_rng_seed(&r, 12);
        for (int i = 0; i < GC_B * 2 * GC_H; i++)
            mask[i] = rk_rng_uniform(&r) < 0.25f ? 0.0f : 1.0f / 0.75f;
        mask[0] = 0.0f;
        g.w.mask = mask;
    }
    float *an = malloc(g.m->np * sizeof *an);
    double *num = malloc(g.m->np * sizeof *num);
    assert_non_null(an);
    assert_non_null(num);
    rk_pred_gather(g.m, &g.w, g.x, NULL, GC_B);
    rk_pred_forward(g.m, &g.w);
    double loss = rk_pred_backward(g.m, &g.w, g.y, g.pw, an);
    assert_true(isfinite(loss) && loss > 0);
    numeric_grad(&g, num);
    int bad = 0;
    for (int k = 0; k < RK_PT_COUNT; k++)
        bad += tensor_mismatch(&g, k, an, num, 0);
    assert_int_equal(bad, 0);

    /* The check fails a gradient that is 1% wrong in any single tensor. */
    for (int k = 0; k < RK_PT_COUNT; k++) {
        const rk_pred_tensor *t = &g.m->t[k];
        float *wrong = malloc(g.m->np * sizeof *wrong);
        assert_non_null(wrong);
        memcpy(wrong, an, g.m->np * sizeof *wrong);
        for (size_t i = t->offset; i < t->offset + t->numel; i++)
            wrong[i] *= 1.01f;
        assert_int_equal(tensor_mismatch(&g, k, wrong, num, 1), 1);
        free(wrong);
    }
    free(an);
    free(num);
    g.w.mask = NULL;
    gc_free(&g);
}

static void test_gradcheck_classify(void **state)
{
    (void)state;
    gradient_check(RK_PRED_CLASSIFY, 0);
}

static void test_gradcheck_regress(void **state)
{
    (void)state;
    gradient_check(RK_PRED_REGRESS, 0);
}

static void test_gradcheck_dropout(void **state)
{
    (void)state;
    gradient_check(RK_PRED_REGRESS, 1);
}

/* ---- save / load ---------------------------------------------------------------------------- */

static void test_save_load_round_trip(void **state)
{
    (void)state;
    enum { T = 7, F = 4, N = 9 };
    for (int task = RK_PRED_CLASSIFY; task <= RK_PRED_REGRESS; task++) {
        rk_pred_model *m = make((rk_pred_task)task, T, F, 6, 5, 3, 21);
        float x[N * T * F], y[N], p1[N], p2[N];
        random_windows((rk_pred_task)task, N, T, F, 5, x, y);
        rk_pred_data d = {N, x, y};
        rk_err err = {0};
        assert_int_equal(rk_pred_fit_norm(m, &d, &err), RK_OK);
        assert_int_equal(rk_pred_predict(m, x, N, p1, &err), RK_OK);
        char path[600];
        tmp_path(path, sizeof path, "model.safetensors");
        assert_int_equal(rk_pred_save(m, path, &err), RK_OK);
        rk_pred_model *l = NULL;
        assert_int_equal(rk_pred_load(&l, path, &err), RK_OK);
        const rk_pred_config *a = rk_pred_config_of(m), *b = rk_pred_config_of(l);
        assert_int_equal(a->task, b->task);
        assert_int_equal(a->window, b->window);
        assert_int_equal(a->features, b->features);
        assert_int_equal(a->hidden, b->hidden);
        assert_int_equal(a->attn, b->attn);
        assert_int_equal(a->dense, b->dense);
        assert_int_equal(rk_pred_num_params(m), rk_pred_num_params(l));
        assert_memory_equal(m->p, l->p, m->np * sizeof(float));
        assert_memory_equal(m->mean, l->mean, F * sizeof(float));
        assert_memory_equal(m->std, l->std, F * sizeof(float));
        assert_int_equal(rk_pred_predict(l, x, N, p2, &err), RK_OK);
        assert_memory_equal(p1, p2, sizeof p1);
        /* Regression predictions are in target units, not standardised ones. */
        if (task == RK_PRED_REGRESS)
            assert_true(m->y_std > 1.0f && m->y_mean > 10.0f);
        rk_pred_free(m);
        rk_pred_free(l);
    }
}

static int load_fails(const char *path, int code, const char *needle)
{
    rk_pred_model *m = (rk_pred_model *)(uintptr_t)1;
    rk_err err = {0};
    int rc = rk_pred_load(&m, path, &err);
    if (rc != code || m != NULL || !strstr(err.msg, needle)) {
        print_error("load %s: rc %d, message '%s' (wanted %d, '%s')\n", path, rc, err.msg, code,
                    needle);
        return 0;
    }
    return 1;
}

/* Rewrite `src` (a saved model) to `dst` with one metadata value changed and, when `nan` is
 * set, the first weight made NaN. */
static void rewrite(const char *src, const char *dst, const char *key, const char *val, int nan)
{
    rk_st_file f;
    rk_err err = {0};
    assert_int_equal(rk_st_read(src, &f, &err), RK_OK);
    rk_st_entry e[32];
    void *bufs[32];
    assert_true(f.ntensors <= 32);
    for (size_t i = 0; i < f.ntensors; i++) {
        bufs[i] = malloc(f.tensors[i].nbytes);
        memcpy(bufs[i], f.tensors[i].data, f.tensors[i].nbytes);
        if (nan && i == 0)
            ((float *)bufs[i])[0] = NAN;
        e[i] = (rk_st_entry){f.tensors[i].name, bufs[i], f.tensors[i].ndim, f.tensors[i].shape,
                             f.tensors[i].dtype};
    }
    const char *meta[64];
    size_t n = 0;
    for (size_t i = 0; i < f.nmeta && n < 60; i++) {
        meta[n++] = f.meta_keys[i];
        meta[n++] = key && strcmp(key, f.meta_keys[i]) == 0 ? val : f.meta_vals[i];
    }
    meta[n] = NULL;
    assert_int_equal(rk_st_write(dst, e, f.ntensors, meta, &err), RK_OK);
    for (size_t i = 0; i < f.ntensors; i++)
        free(bufs[i]);
    rk_st_free(&f);
}

static void test_load_rejects_wrong_files(void **state)
{
    (void)state;
    char good[600], bad[600];
    rk_pred_model *m = make(RK_PRED_REGRESS, 4, 2, 3, 2, 2, 1);
    rk_err err = {0};
    tmp_path(good, sizeof good, "good.safetensors");
    assert_int_equal(rk_pred_save(m, good, &err), RK_OK);
    rk_pred_free(m);

    tmp_path(bad, sizeof bad, "absent.safetensors");
    assert_true(load_fails(bad, RK_ENOENT, "absent.safetensors"));

    tmp_path(bad, sizeof bad, "garbage.safetensors");
    FILE *f = fopen(bad, "wb");
    assert_non_null(f);
    fputs("this is not a model", f);
    fclose(f);
    assert_true(load_fails(bad, RK_EFORMAT, "garbage.safetensors"));

    /* A valid safetensors file that is something else (a checkpoint, another tool's file). */
    tmp_path(bad, sizeof bad, "other.safetensors");
    float v[2] = {1, 2};
    int64_t two = 2;
    rk_st_entry e = {"weight", v, 1, &two, "F32"};
    assert_int_equal(rk_st_write(bad, &e, 1, NULL, &err), RK_OK);
    assert_true(load_fails(bad, RK_EFORMAT, "not a rekindle predictor"));

    tmp_path(bad, sizeof bad, "hidden.safetensors");
    rewrite(good, bad, "hidden", "5", 0);
    assert_true(load_fails(bad, RK_EFORMAT, "has shape"));
    rewrite(good, bad, "hidden", "-3", 0);
    assert_true(load_fails(bad, RK_EFORMAT, "'hidden'"));
    rewrite(good, bad, "task", "cluster", 0);
    assert_true(load_fails(bad, RK_EFORMAT, "'task'"));
    rewrite(good, bad, "version", "2", 0);
    assert_true(load_fails(bad, RK_EFORMAT, "version"));
    rewrite(good, bad, NULL, NULL, 1);
    assert_true(load_fails(bad, RK_EFORMAT, "not finite"));
    rewrite(good, bad, NULL, NULL, 0); /* unchanged: loads */
    assert_int_equal(rk_pred_load(&m, bad, &err), RK_OK);
    rk_pred_free(m);
}

/* ---- determinism ---------------------------------------------------------------------------- */

static rk_pred_model *train_small(uint64_t seed, uint64_t order, rk_pred_report *rep)
{
    enum { T = 6, F = 3, N = 40 };
    static float x[N * T * F], y[N];
    random_windows(RK_PRED_CLASSIFY, N, T, F, 3, x, y);
    rk_pred_model *m = make(RK_PRED_CLASSIFY, T, F, 8, 4, 4, seed);
    rk_pred_train_opts o = RK_PRED_TRAIN_OPTS_DEFAULT;
    o.max_epochs = 3;
    o.batch = 16;
    o.seed = order;
    rk_pred_data d = {N, x, y}, v = {N / 2, x, y};
    rk_err err = {0};
    assert_int_equal(rk_pred_train(m, &d, &v, &o, rep, &err), RK_OK);
    return m;
}

static void test_determinism(void **state)
{
    (void)state;
    rk_pred_model *a = make(RK_PRED_CLASSIFY, 5, 3, 8, 4, 4, 42);
    rk_pred_model *b = make(RK_PRED_CLASSIFY, 5, 3, 8, 4, 4, 42);
    rk_pred_model *c = make(RK_PRED_CLASSIFY, 5, 3, 8, 4, 4, 43);
    assert_memory_equal(a->p, b->p, a->np * sizeof(float));
    assert_memory_not_equal(a->p, c->p, a->np * sizeof(float));
    rk_pred_free(a);
    rk_pred_free(b);
    rk_pred_free(c);

    rk_pred_report r1, r2, r3;
    a = train_small(1, 1, &r1);
    b = train_small(1, 1, &r2);
    c = train_small(1, 2, &r3); /* same weights, another batch order */
    assert_memory_equal(a->p, b->p, a->np * sizeof(float));
    assert_int_equal(r1.epochs, r2.epochs);
    assert_true(r1.best_val_loss == r2.best_val_loss);
    assert_memory_not_equal(a->p, c->p, a->np * sizeof(float));
    rk_pred_free(a);
    rk_pred_free(b);
    rk_pred_free(c);
}

/* ---- learning --------------------------------------------------------------------------- */

/* The adding problem (Hochreiter & Schmidhuber): each step has a value uniform in [-1, 1] and
 * a marker; exactly two steps of the window are marked, anywhere. Regression: the sum of the
 * two marked values; classification: do they have the same sign. Only a model that learns to
 * pick out the marked steps and keep them solves it. Measured with the LSTM and attention
 * gradients zeroed (only the head trains; docs/predict.md): classification 0.51 held-out
 * accuracy (chance), regression RMSE 0.14 of the target's sd; trained in full: 0.96 and
 * 0.027. The bounds below sit between. */
enum { LT = 12, LF = 2 };

static void adding_task(rk_pred_task task, int n, uint64_t seed, float *x, float *y)
{
    rk_rng r;
    rk_rng_seed(&r, seed);
    for (int k = 0; k < n; k++) {
        int a = (int)rk_rng_below(&r, LT), b = (int)rk_rng_below(&r, LT - 1);
        b += b >= a;
        for (int t = 0; t < LT; t++) {
            x[(k * LT + t) * LF] = 2.0f * rk_rng_uniform(&r) - 1.0f;
            x[(k * LT + t) * LF + 1] = t == a || t == b;
        }
        float va = x[(k * LT + a) * LF], vb = x[(k * LT + b) * LF];
        y[k] = task == RK_PRED_CLASSIFY ? (va * vb > 0 ? 1.0f : 0.0f) : va + vb;
    }
}

static void test_learns_marked_signs(void **state)
{
    (void)state;
    enum { NT = 1200, NV = 300, NE = 600 };
    float *x = malloc(sizeof(float) * (NT + NV + NE) * LT * LF);
    float *y = malloc(sizeof(float) * (NT + NV + NE)), *p = malloc(sizeof(float) * NE);
    assert_true(x && y && p);
    adding_task(RK_PRED_CLASSIFY, NT + NV + NE, 17, x, y);
    rk_pred_model *m = make(RK_PRED_CLASSIFY, LT, LF, 16, 8, 8, 5);
    rk_pred_data tr = {NT, x, y}, va = {NV, x + NT * LT * LF, y + NT};
    const float *xe = x + (NT + NV) * LT * LF, *ye = y + NT + NV;
    rk_err err = {0};
    /* Untrained, the model is no better than chance (the test below could fail). */
    assert_int_equal(rk_pred_predict(m, xe, NE, p, &err), RK_OK);
    int right0 = 0;
    for (int k = 0; k < NE; k++)
        right0 += (p[k] > 0.5f) == (ye[k] > 0.5f);
    rk_pred_train_opts o = RK_PRED_TRAIN_OPTS_DEFAULT;
    o.max_epochs = 40;
    o.batch = 32;
    o.lr = 3e-3f;
    o.patience = 8;
    rk_pred_report rep;
    assert_int_equal(rk_pred_train(m, &tr, &va, &o, &rep, &err), RK_OK);
    assert_int_equal(rk_pred_predict(m, xe, NE, p, &err), RK_OK);
    int right = 0;
    for (int k = 0; k < NE; k++)
        right += (p[k] > 0.5f) == (ye[k] > 0.5f);
    print_message("adding problem, same sign: held-out accuracy %.3f untrained, %.3f after %d "
                  "epochs (best %d)\n",
                  (double)right0 / NE, (double)right / NE, rep.epochs, rep.best_epoch);
    assert_true(right0 < 0.6 * NE);
    assert_true(right >= 0.9 * NE);
    assert_true(rep.pos_weight > 0.5f && rep.pos_weight < 2.0f);
    rk_pred_free(m);
    free(x);
    free(y);
    free(p);
}

static void test_learns_adding_sum(void **state)
{
    (void)state;
    enum { NT = 1200, NV = 300, NE = 600 };
    float *x = malloc(sizeof(float) * (NT + NV + NE) * LT * LF);
    float *y = malloc(sizeof(float) * (NT + NV + NE)), *p = malloc(sizeof(float) * NE);
    assert_true(x && y && p);
    adding_task(RK_PRED_REGRESS, NT + NV + NE, 23, x, y);
    for (int k = 0; k < NT + NV + NE; k++)
        y[k] = 100.0f + 50.0f * y[k]; /* target units far from standardised ones */
    rk_pred_model *m = make(RK_PRED_REGRESS, LT, LF, 16, 8, 8, 5);
    rk_pred_data tr = {NT, x, y}, va = {NV, x + NT * LT * LF, y + NT};
    const float *xe = x + (NT + NV) * LT * LF, *ye = y + NT + NV;
    double mean = 0, var = 0, se = 0;
    for (int k = 0; k < NE; k++)
        mean += ye[k] / NE;
    for (int k = 0; k < NE; k++)
        var += (ye[k] - mean) * (ye[k] - mean) / NE;
    rk_pred_train_opts o = RK_PRED_TRAIN_OPTS_DEFAULT;
    o.max_epochs = 40;
    o.batch = 32;
    o.lr = 3e-3f;
    rk_pred_report rep;
    rk_err err = {0};
    assert_int_equal(rk_pred_train(m, &tr, &va, &o, &rep, &err), RK_OK);
    assert_int_equal(rk_pred_predict(m, xe, NE, p, &err), RK_OK);
    for (int k = 0; k < NE; k++)
        se += (p[k] - ye[k]) * (p[k] - ye[k]) / NE;
    print_message("adding problem, sum: held-out RMSE %.3f against target sd %.3f (%d epochs)\n",
                  sqrt(se), sqrt(var), rep.epochs);
    /* Predicting the mean gives RMSE = sd. */
    assert_true(sqrt(se) < 0.06 * sqrt(var));
    /* The validation loss reported is the MSE of the weights the model kept, in target units. */
    double vl;
    assert_int_equal(rk_pred_loss(m, &va, 1.0f, &vl, &err), RK_OK);
    assert_true(fabs(vl - rep.best_val_loss) <= 1e-9 * fmax(1.0, vl));
    rk_pred_free(m);
    free(x);
    free(y);
    free(p);
}

static void count_epochs(const rk_pred_epoch *e, void *ctx)
{
    int *n = ctx;
    assert_int_equal(e->epoch, *n + 1);
    (*n)++;
}

static void test_early_stopping(void **state)
{
    (void)state;
    /* Random labels: the validation loss cannot keep improving, so patience ends training
     * long before max_epochs, and the model keeps the best epoch's weights. */
    enum { T = 6, F = 3, N = 200 };
    static float x[N * T * F], y[N];
    random_windows(RK_PRED_CLASSIFY, N, T, F, 8, x, y);
    rk_rng r;
    rk_rng_seed(&r, 4);
    for (int k = 0; k < N; k++)
        y[k] = (float)(rk_rng_next(&r) & 1);
    rk_pred_model *m = make(RK_PRED_CLASSIFY, T, F, 16, 8, 8, 3);
    rk_pred_train_opts o = RK_PRED_TRAIN_OPTS_DEFAULT;
    o.max_epochs = 500;
    o.batch = 16;
    o.lr = 1e-2f;
    o.patience = 3;
    int seen = 0;
    o.on_epoch = count_epochs;
    o.ctx = &seen;
    rk_pred_data tr = {N / 2, x, y}, va = {N / 2, x + N / 2 * T * F, y + N / 2};
    rk_pred_report rep;
    rk_err err = {0};
    assert_int_equal(rk_pred_train(m, &tr, &va, &o, &rep, &err), RK_OK);
    assert_int_equal(seen, rep.epochs);
    assert_true(rep.epochs < 100);
    assert_int_equal(rep.epochs, rep.best_epoch + o.patience);
    double vl;
    assert_int_equal(rk_pred_loss(m, &va, rep.pos_weight, &vl, &err), RK_OK);
    assert_true(fabs(vl - rep.best_val_loss) <= 1e-9);
    rk_pred_free(m);
}

/* A scripted judge: epoch k scores |k - 4| (best at 4) and remembers the model's output on
 * one window then; from epoch `fail_at` on it fails. */
typedef struct judge {
    int epoch, fail_at;
    const float *x;
    float at_best;
} judge;

static int judge_score(const rk_pred_model *m, void *ctx, double *score, rk_err *err)
{
    judge *j = ctx;
    j->epoch++;
    if (j->epoch >= j->fail_at)
        return rk_err_set(err, RK_EIO, "judge failed at epoch %d", j->epoch);
    *score = fabs(j->epoch - 4.0);
    if (j->epoch == 4)
        assert_int_equal(rk_pred_predict(m, j->x, 1, &j->at_best, err), RK_OK);
    return RK_OK;
}

static void test_early_stopping_follows_a_validation_score(void **state)
{
    (void)state;
    enum { T = 6, F = 3, N = 120 };
    static float x[N * T * F], y[N];
    random_windows(RK_PRED_CLASSIFY, N, T, F, 8, x, y);
    rk_pred_model *m = make(RK_PRED_CLASSIFY, T, F, 8, 4, 4, 3);
    rk_pred_train_opts o = RK_PRED_TRAIN_OPTS_DEFAULT;
    o.max_epochs = 50;
    o.batch = 16;
    o.lr = 1e-2f;
    o.patience = 2;
    judge j = {0, 1000, x, 0};
    o.val_score = judge_score;
    o.ctx = &j;
    rk_pred_data tr = {N / 2, x, y}, va = {N / 2, x + N / 2 * T * F, y + N / 2};
    rk_pred_report rep;
    rk_err err = {0};
    assert_int_equal(rk_pred_train(m, &tr, &va, &o, &rep, &err), RK_OK);
    assert_int_equal(rep.best_epoch, 4); /* the score's best, not the loss's */
    assert_int_equal(rep.epochs, 6);
    assert_true(rep.best_val_loss == 0.0);
    float now;
    assert_int_equal(rk_pred_predict(m, x, 1, &now, &err), RK_OK);
    assert_true(now == j.at_best); /* the weights of epoch 4 */
    /* a judge that fails stops training with its error */
    j = (judge){0, 2, x, 0};
    assert_int_equal(rk_pred_train(m, &tr, &va, &o, &rep, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "epoch 2"));
    rk_pred_free(m);
}

/* ---- refusals ------------------------------------------------------------------------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    rk_pred_model *m = NULL;
    rk_err err = {0};
    assert_int_equal(rk_pred_create(&m, &c, &err), RK_EINVAL); /* features 0 */
    assert_non_null(strstr(err.msg, "features"));
    c.features = 3;
    c.hidden = 0;
    assert_int_equal(rk_pred_create(&m, &c, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "hidden"));
    assert_null(m);

    enum { T = 3, F = 2, N = 4 };
    float x[N * T * F] = {0}, y[N] = {0, 1, 2, 0};
    m = make(RK_PRED_CLASSIFY, T, F, 4, 2, 2, 1);
    rk_pred_train_opts o = RK_PRED_TRAIN_OPTS_DEFAULT;
    rk_pred_data d = {N, x, y};
    assert_int_equal(rk_pred_train(m, &d, NULL, &o, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "0 or 1"));
    y[2] = 0;
    y[1] = 0;
    assert_int_equal(rk_pred_train(m, &d, NULL, &o, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "only negative"));
    y[1] = 1;
    x[5] = NAN;
    assert_int_equal(rk_pred_train(m, &d, NULL, &o, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "non-finite"));
    x[5] = 0;
    o.batch = 0;
    assert_int_equal(rk_pred_train(m, &d, NULL, &o, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "batch"));
    o.batch = 2;
    o.lr = -1;
    assert_int_equal(rk_pred_train(m, &d, NULL, &o, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "learning rate"));
    rk_pred_data empty = {0, x, y};
    o.lr = 1e-3f;
    assert_int_equal(rk_pred_train(m, &empty, NULL, &o, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "empty"));
    /* Without a validation set, every epoch runs. */
    o.max_epochs = 4;
    rk_pred_report rep;
    assert_int_equal(rk_pred_train(m, &d, NULL, &o, &rep, &err), RK_OK);
    assert_int_equal(rep.epochs, 4);
    assert_int_equal(rep.best_epoch, 4);
    rk_pred_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck_classify),
        cmocka_unit_test(test_gradcheck_regress),
        cmocka_unit_test(test_gradcheck_dropout),
        cmocka_unit_test_setup_teardown(test_save_load_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_rejects_wrong_files, setup, teardown),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_learns_marked_signs),
        cmocka_unit_test(test_learns_adding_sum),
        cmocka_unit_test(test_early_stopping),
        cmocka_unit_test(test_early_stopping_follows_a_validation_score),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
