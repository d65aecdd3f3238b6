/*
 * Labelled windows of a fleet dataset (predict/windows.h): labels, training windows drawn
 * with the seeded generator of rekindle/rng.h, hard negatives, window summaries.
 */
#include "predict/windows.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "predict/predict.h"
#include "rekindle/rng.h"

#define F RK_FLEET_FEATURES

int rk_fleet_label(const rk_fleet_gpu *g, size_t m, int horizon)
{
    return g->failure >= 0 && (long)m < g->failure && g->failure <= (long)m + horizon;
}

size_t rk_fleet_watch_end(const rk_fleet_gpu *g)
{
    return g->failure >= 0 && (size_t)g->failure < g->steps ? (size_t)g->failure : g->steps;
}

void rk_fleet_windows_free(rk_fleet_windows *w)
{
    if (!w)
        return;
    free(w->x);
    free(w->y);
    memset(w, 0, sizeof *w);
}

/* The minutes of g that are random-negative candidates: [T - 1, hi). */
static size_t neg_hi(const rk_fleet_gpu *g, const rk_fleet_sample_opts *o)
{
    size_t end = rk_fleet_watch_end(g);
    if (g->failure >= 0) {
        long lo = g->failure - o->horizon - o->near;
        if (lo < (long)end)
            end = lo < 0 ? 0 : (size_t)lo;
    }
    return end;
}

/* A near-band minute m (negative, after neg_hi) is taken: every near_step-th, counting back
 * from the minute before the positives. */
static int near_taken(const rk_fleet_gpu *g, size_t m, const rk_fleet_sample_opts *o)
{
    long back = g->failure - o->horizon - 1 - (long)m;
    return back >= 0 && back % o->near_step == 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int rk_fleet_sample(const rk_fleet *f, int split, const rk_fleet_sample_opts *o,
                    rk_fleet_windows *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    if (o->window < 1 || o->window > RK_PRED_MAX_WINDOW || o->horizon < 1 || o->near < 0 ||
        o->near_step < 1 || !(o->neg_ratio >= 0 && o->neg_ratio <= 1000))
        return rk_err_set(err, RK_EINVAL,
                          "windows: bad options (window %d, horizon %d, near %d, "
                          "negatives %g)",
                          o->window, o->horizon, o->near, o->neg_ratio);
    const size_t T = (size_t)o->window;
    size_t pos = 0, near = 0, eligible = 0;
    for (int i = 0; i < f->gpus; i++) {
        const rk_fleet_gpu *g = &f->gpu[i];
        if (g->split != split || !g->x)
            continue;
        size_t end = rk_fleet_watch_end(g), hi = neg_hi(g, o);
        for (size_t m = T - 1; m < end; m++) {
            if (rk_fleet_label(g, m, o->horizon))
                pos++;
            else if (m >= hi)
                near += near_taken(g, m, o);
        }
        if (hi > T - 1)
            eligible += hi - (T - 1);
    }
    if (pos == 0)
        return rk_err_set(err, RK_EINVAL, "windows: the %s split has no failure to learn from",
                          rk_fleet_split_name(split));
    size_t draws = eligible ? (size_t)llround(o->neg_ratio * (double)pos) : 0;
    uint64_t *pick = malloc((draws ? draws : 1) * sizeof *pick);
    size_t n = pos + near + draws;
    out->x = malloc(n * T * F * sizeof *out->x);
    out->y = malloc(n * sizeof *out->y);
    if (!pick || !out->x || !out->y) {
        free(pick);
        rk_fleet_windows_free(out);
        return rk_err_set(err, RK_ENOMEM, "windows: out of memory for %zu windows", n);
    }
    rk_rng r;
    rk_rng_derive(&r, o->seed, 0x5a3e, (uint64_t)split);
    for (size_t k = 0; k < draws; k++)
        pick[k] = rk_rng_below(&r, eligible);
    qsort(pick, draws, sizeof *pick, cmp_u64);
    size_t k = 0, p = 0, base = 0;
    for (int i = 0; i < f->gpus; i++) {
        const rk_fleet_gpu *g = &f->gpu[i];
        if (g->split != split || !g->x)
            continue;
        size_t end = rk_fleet_watch_end(g), hi = neg_hi(g, o);
        size_t span = hi > T - 1 ? hi - (T - 1) : 0;
        for (size_t m = T - 1; m < end; m++) {
            int y = rk_fleet_label(g, m, o->horizon);
            size_t copies = 0;
            if (y || m >= hi)
                copies = y || near_taken(g, m, o);
            else
                while (p < draws && pick[p] == base + (m - (T - 1))) {
                    copies++;
                    p++;
                }
            for (size_t c = 0; c < copies; c++) {
                rk_fleet_window(g->x, g->steps, m, o->window, out->x + k * T * F);
                out->y[k++] = (float)y;
            }
        }
        base += span;
    }
    free(pick);
    out->n = k;
    out->positives = pos;
    return RK_OK;
}

typedef struct mined {
    float risk;
    int gpu;
    size_t m;
} mined;

static int cmp_mined(const void *a, const void *b)
{
    const mined *x = a, *y = b;
    if (x->risk != y->risk)
        return x->risk > y->risk ? -1 : 1;
    if (x->gpu != y->gpu)
        return x->gpu < y->gpu ? -1 : 1;
    return x->m < y->m ? -1 : x->m > y->m;
}

int rk_fleet_mine(const rk_fleet *f, int split, const rk_fleet_sample_opts *o, float *const *risk,
                  size_t k, rk_fleet_windows *w, rk_err *err)
{
    const size_t T = (size_t)o->window;
    size_t cand = 0;
    for (int i = 0; i < f->gpus; i++)
        if (f->gpu[i].split == split && f->gpu[i].x && risk[i]) {
            size_t hi = neg_hi(&f->gpu[i], o);
            cand += hi > T - 1 ? hi - (T - 1) : 0;
        }
    if (k > cand)
        k = cand;
    if (k == 0)
        return RK_OK;
    mined *c = malloc(cand * sizeof *c);
    float *x = realloc(w->x, (w->n + k) * T * F * sizeof *x);
    if (x)
        w->x = x;
    float *y = x ? realloc(w->y, (w->n + k) * sizeof *y) : NULL;
    if (y)
        w->y = y;
    if (!c || !x || !y) {
        free(c);
        return rk_err_set(err, RK_ENOMEM, "windows: out of memory for %zu hard negatives", k);
    }
    size_t n = 0;
    for (int i = 0; i < f->gpus; i++) {
        const rk_fleet_gpu *g = &f->gpu[i];
        if (g->split != split || !g->x || !risk[i])
            continue;
        size_t hi = neg_hi(g, o);
        for (size_t m = T - 1; m < hi; m++)
            c[n++] = (mined){isnan(risk[i][m]) ? -INFINITY : risk[i][m], i, m};
    }
    qsort(c, n, sizeof *c, cmp_mined);
    for (size_t q = 0; q < k; q++) {
        const rk_fleet_gpu *g = &f->gpu[c[q].gpu];
        rk_fleet_window(g->x, g->steps, c[q].m, o->window, w->x + (w->n + q) * T * F);
        w->y[w->n + q] = 0.0f;
    }
    w->n += k;
    free(c);
    return RK_OK;
}

void rk_fleet_summary(const float *w, int T, float *out)
{
    const double tm = (T - 1) / 2.0;
    double stt = 0;
    for (int t = 0; t < T; t++)
        stt += (t - tm) * (t - tm);
    for (int j = 0; j < F; j++) {
        double sum = 0, sty = 0, mx = -INFINITY;
        for (int t = 0; t < T; t++) {
            double v = w[(size_t)t * F + j];
            sum += v;
            sty += (t - tm) * v;
            if (v > mx)
                mx = v;
        }
        out[j] = w[(size_t)(T - 1) * F + j];
        out[F + j] = (float)(sum / T);
        out[2 * F + j] = (float)(stt > 0 ? sty / stt : 0.0);
        out[3 * F + j] = (float)mx;
    }
}

float *rk_fleet_summaries(const rk_fleet_windows *w, int T)
{
    float *s = malloc((w->n ? w->n : 1) * RK_FLEET_SUMMARY * sizeof *s);
    for (size_t k = 0; s && k < w->n; k++)
        rk_fleet_summary(w->x + k * (size_t)T * F, T, s + k * RK_FLEET_SUMMARY);
    return s;
}

void rk_fleet_summary_name(int k, char *buf, size_t cap)
{
    static const char *const kind[4] = {"last", "mean", "slope", "max"};
    snprintf(buf, cap, "%s:%s", kind[k / F], rk_fleet_feature_names[k % F]);
}
