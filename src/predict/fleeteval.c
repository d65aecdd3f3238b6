/*
 * Fleet datasets for training and judging failure detectors (rekindle/fleeteval.h): the
 * loader (jansson for the manifest, safetensors for the histories), labelled windows, the
 * logistic-regression baseline on window summaries, and the event-level evaluation.
 * Windows are made by rk_fleet_window (fleetdata.c), the same function the online code uses.
 */
#include "rekindle/fleeteval.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "rekindle/fileio.h"
#include "rekindle/rng.h"
#include "rekindle/safetensors.h"

#define F RK_FLEET_FEATURES

/* ---- loading ------------------------------------------------------------------------------ */

void rk_fleet_free(rk_fleet *f)
{
    if (!f)
        return;
    for (int i = 0; f->gpu && i < f->gpus; i++) {
        free(f->gpu[i].x);
        free(f->gpu[i].score);
    }
    free(f->gpu);
    memset(f, 0, sizeof *f);
}

static int load_history(rk_fleet_gpu *g, const char *path, rk_err *err)
{
    rk_st_file st;
    int rc = rk_st_read(path, &st, err);
    if (rc)
        return rc;
    const char *fmt = rk_st_meta(&st, "format");
    const int64_t shape[2] = {(int64_t)g->steps, F}, shape1[1] = {(int64_t)g->steps};
    if (!fmt || strcmp(fmt, "rekindle-fleet-history") != 0) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: not a rekindle fleet history", path);
        goto out;
    }
    g->x = malloc((g->steps ? g->steps : 1) * F * sizeof *g->x);
    if (!g->x) {
        rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if ((rc = rk_st_load_f32(&st, "x", 2, shape, g->x, err))) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: %s (the manifest says %zu steps)", path, err->msg,
                        g->steps);
        goto out;
    }
    for (size_t k = 0; k < g->steps * F; k++)
        if (!isfinite(g->x[k])) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: x at step %zu, feature %s is not finite", path,
                            k / F, rk_fleet_feature_names[k % F]);
            goto out;
        }
    if (rk_st_find(&st, "score")) {
        g->score = malloc((g->steps ? g->steps : 1) * sizeof *g->score);
        if (!g->score) {
            rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        if ((rc = rk_st_load_f32(&st, "score", 1, shape1, g->score, err))) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: %s", path, err->msg);
            goto out;
        }
    }
out:
    rk_st_free(&st);
    return rc;
}

static int want_int(json_t *o, const char *key, const char *file, int idx, long lo, long hi,
                    long *out, rk_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return rk_err_set(err, RK_EFORMAT, "%s: device %d: \"%s\" is missing or out of range", file,
                          idx, key);
    *out = (long)json_integer_value(v);
    return RK_OK;
}

/* Largest JSON file read (the manifest, MODEL.json): far above what rekindle writes. */
#define JSON_FILE_MAX ((size_t)64 << 20)

/* Parse the JSON file at path, read through the one bounded opener (regular file, at most
 * JSON_FILE_MAX bytes, no blocking on a FIFO): NULL with RK_ENOENT (naming the file and
 * `missing`, what writes it) when it does not exist, RK_EFORMAT with the parser's line and
 * message (never the bytes it stopped at) when it is not JSON, the opener's error otherwise. */
static json_t *json_file(const char *path, const char *missing, int *rc, rk_err *err)
{
    uint8_t *buf;
    size_t len;
    int r = rk_file_read_all(path, &buf, &len, JSON_FILE_MAX, err);
    if (r == RK_ENOENT) {
        *rc = rk_err_set(err, RK_ENOENT, "%s: no such file (%s)", path, missing);
        return NULL;
    }
    if (r < 0) {
        *rc = r;
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb((const char *)buf, len, 0, &je);
    free(buf);
    if (!j) {
        char tb[JSON_ERROR_TEXT_LENGTH];
        *rc = rk_err_set(err, RK_EFORMAT, "%s: line %d: %s", path, je.line,
                         rk_msg_parser_text(tb, sizeof tb, je.text));
    }
    return j;
}

/* The manifest's fields into f (every GPU's metadata, no history); `path` names it in errors. */
static int parse_manifest(rk_fleet *f, json_t *j, const char *path, rk_err *err)
{
    int rc = RK_OK;
    json_t *fmt = json_object_get(j, "format"), *devs = json_object_get(j, "devices");
    json_t *hours = json_object_get(j, "hours"), *seed = json_object_get(j, "seed");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "rekindle-fleet-dataset") != 0)
        return rk_err_set(err, RK_EFORMAT, "%s: not a rekindle fleet dataset", path);
    if (!json_is_array(devs) || json_array_size(devs) < 1 || json_array_size(devs) > 1024 ||
        !json_is_number(hours) || !json_is_integer(seed))
        return rk_err_set(err, RK_EFORMAT, "%s: devices, hours or seed missing or malformed",
                          path);
    json_t *feat = json_object_get(j, "features");
    if (!json_is_array(feat) || json_array_size(feat) != F)
        return rk_err_set(err, RK_EFORMAT, "%s: %zu features, expected %d", path,
                          json_array_size(feat), F);
    for (int k = 0; k < F; k++) {
        json_t *nm = json_array_get(feat, (size_t)k);
        if (!json_is_string(nm) || strcmp(json_string_value(nm), rk_fleet_feature_names[k]))
            return rk_err_set(err, RK_EFORMAT, "%s: feature %d is not \"%s\"", path, k,
                              rk_fleet_feature_names[k]);
    }
    f->seed = (uint64_t)json_integer_value(seed);
    f->hours = json_number_value(hours);
    json_t *span = json_object_get(j, "span_h"), *age = json_object_get(j, "start_age_h");
    f->span_h = json_is_number(span) ? json_number_value(span) : f->hours;
    f->start_age_h = json_is_number(age) ? json_number_value(age) : 0;
    f->gpus = (int)json_array_size(devs);
    f->gpu = calloc((size_t)f->gpus, sizeof *f->gpu);
    if (!f->gpu)
        return rk_err_set(err, RK_ENOMEM, "dataset: out of memory");
    for (int i = 0; i < f->gpus && !rc; i++) {
        json_t *d = json_array_get(devs, (size_t)i);
        rk_fleet_gpu *g = &f->gpu[i];
        g->failure = g->precursor = -1;
        long idx, steps, start = 0;
        const char *split = json_string_value(json_object_get(d, "split"));
        const char *file = json_string_value(json_object_get(d, "file"));
        const char *uuid = json_string_value(json_object_get(d, "uuid"));
        const char *prof = json_string_value(json_object_get(d, "profile"));
        if ((rc = want_int(d, "index", path, i, i, i, &idx, err)) ||
            (rc = want_int(d, "steps", path, i, 0, 100000L * 60, &steps, err)))
            break;
        if (json_object_get(d, "start_minute") &&
            (rc = want_int(d, "start_minute", path, i, 0, 200000L * 60, &start, err)))
            break;
        g->index = i;
        g->steps = (size_t)steps;
        g->start_minute = start;
        g->split = !split                        ? -1
                   : strcmp(split, "train") == 0 ? RK_FLEET_TRAIN
                   : strcmp(split, "val") == 0   ? RK_FLEET_VAL
                   : strcmp(split, "test") == 0  ? RK_FLEET_TEST
                                                 : -1;
        if (g->split < 0 || !file || !uuid || !prof || strchr(file, '/') || file[0] == '.' ||
            strlen(file) >= sizeof g->file) {
            rc = rk_err_set(err, RK_EFORMAT,
                            "%s: device %d: split, file, uuid or profile missing or malformed",
                            path, i);
            break;
        }
        snprintf(g->file, sizeof g->file, "%s", file);
        snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
        snprintf(g->profile, sizeof g->profile, "%s", prof);
        json_t *fl = json_object_get(d, "failure");
        if (fl && !json_is_null(fl)) {
            const char *ev = json_string_value(json_object_get(fl, "event"));
            if ((rc = want_int(fl, "minute", path, i, 0, steps, &g->failure, err)))
                break;
            if (!ev) {
                rc = rk_err_set(err, RK_EFORMAT, "%s: device %d: failure without an event", path,
                                i);
                break;
            }
            snprintf(g->event, sizeof g->event, "%s", ev);
            json_t *pm = json_object_get(fl, "precursor_minute");
            if (pm && !json_is_null(pm) &&
                (rc = want_int(fl, "precursor_minute", path, i, 0, g->failure, &g->precursor,
                               err)))
                break;
        }
    }
    return rc;
}

int rk_fleet_parse_manifest(rk_fleet *f, const char *text, size_t len, const char *name,
                            rk_err *err)
{
    memset(f, 0, sizeof *f);
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    char tb[JSON_ERROR_TEXT_LENGTH];
    if (!j)
        return rk_err_set(err, RK_EFORMAT, "%s: line %d: %s", name, je.line,
                          rk_msg_parser_text(tb, sizeof tb, je.text));
    int rc = parse_manifest(f, j, name, err);
    json_decref(j);
    if (rc)
        rk_fleet_free(f);
    return rc;
}

int rk_fleet_load(rk_fleet *f, const char *dir, unsigned splits, rk_err *err)
{
    memset(f, 0, sizeof *f);
    size_t plen = strlen(dir) + 64;
    char *path = malloc(plen);
    if (!path)
        return rk_err_set(err, RK_ENOMEM, "dataset: out of memory");
    snprintf(path, plen, "%s/fleet.json", dir);
    int rc = RK_OK;
    json_t *j = json_file(path, "not a dataset of rk predict dataset", &rc, err);
    if (!j) {
        free(path);
        return rc;
    }
    rc = parse_manifest(f, j, path, err);
    for (int i = 0; i < f->gpus && !rc; i++) {
        rk_fleet_gpu *g = &f->gpu[i];
        if (!((splits >> g->split) & 1u))
            continue;
        char *hp = malloc(strlen(dir) + strlen(g->file) + 2);
        if (!hp) {
            rc = rk_err_set(err, RK_ENOMEM, "dataset: out of memory");
            break;
        }
        sprintf(hp, "%s/%s", dir, g->file);
        rc = load_history(g, hp, err);
        free(hp);
    }
    json_decref(j);
    free(path);
    if (rc)
        rk_fleet_free(f);
    return rc;
}

int rk_fleet_label(const rk_fleet_gpu *g, size_t m, int horizon)
{
    return g->failure >= 0 && (long)m < g->failure && g->failure <= (long)m + horizon;
}

size_t rk_fleet_watch_end(const rk_fleet_gpu *g)
{
    return g->failure >= 0 && (size_t)g->failure < g->steps ? (size_t)g->failure : g->steps;
}

/* ---- training windows --------------------------------------------------------------------- */

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
                          split == RK_FLEET_TRAIN ? "train"
                          : split == RK_FLEET_VAL ? "val"
                                                  : "test");
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

typedef struct scored {
    float p;
    size_t i;
} scored;

static int cmp_scored(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

double rk_fleet_average_precision(const float *p, const float *y, size_t n)
{
    scored *s = malloc((n ? n : 1) * sizeof *s);
    if (!s)
        return NAN;
    for (size_t i = 0; i < n; i++)
        s[i] = (scored){isnan(p[i]) ? -INFINITY : p[i], i};
    qsort(s, n, sizeof *s, cmp_scored);
    double tp = 0, sum = 0;
    for (size_t k = 0; k < n; k++)
        if (y[s[k].i] > 0.5f) {
            tp++;
            sum += tp / (double)(k + 1);
        }
    free(s);
    return tp > 0 ? sum / tp : 0.0;
}

/* ---- the logistic-regression baseline ------------------------------------------------------- */

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

void rk_logreg_free(rk_logreg *m)
{
    if (!m)
        return;
    free(m->mean);
    free(m->std);
    free(m->w);
    memset(m, 0, sizeof *m);
}

double rk_logreg_prob(const rk_logreg *m, const float *x)
{
    /* in double: any finite float weights and std > 0 keep z finite */
    double z = m->b;
    for (int k = 0; k < m->d; k++)
        z += (double)m->w[k] * (((double)x[k] - m->mean[k]) / m->std[k]);
    return 1.0 / (1.0 + exp(-z));
}

/* Mean weighted cross-entropy of m on rows x, y. */
static double logreg_loss(const rk_logreg *m, const float *x, const float *y, size_t n, double pw)
{
    double s = 0, wsum = 0;
    for (size_t i = 0; i < n; i++) {
        double p = rk_logreg_prob(m, x + i * (size_t)m->d), w = y[i] > 0.5f ? pw : 1.0;
        p = fmin(fmax(p, 1e-12), 1 - 1e-12);
        s -= w * (y[i] > 0.5f ? log(p) : log(1 - p));
        wsum += w;
    }
    return wsum > 0 ? s / wsum : 0;
}

int rk_logreg_train(rk_logreg *m, int d, const float *x, const float *y, size_t n, const float *xv,
                    const float *yv, size_t nv, const rk_logreg_opts *o, rk_err *err)
{
    memset(m, 0, sizeof *m);
    if (d < 1 || n < 1 || o->max_epochs < 1 || o->batch < 1 || !(o->lr > 0) || !(o->l2 >= 0) ||
        !(o->pos_weight >= 0) || o->patience < 0)
        return rk_err_set(err, RK_EINVAL, "logistic regression: bad options or no data");
    size_t npos = 0;
    for (size_t i = 0; i < n; i++) {
        if (y[i] != 0.0f && y[i] != 1.0f)
            return rk_err_set(err, RK_EINVAL, "logistic regression: target %zu is %g", i, y[i]);
        npos += y[i] == 1.0f;
    }
    if (npos == 0 || npos == n)
        return rk_err_set(err, RK_EINVAL, "logistic regression: the training set has one class");
    const double pw = o->pos_weight > 0 ? o->pos_weight : (double)(n - npos) / (double)npos;
    m->d = d;
    m->mean = calloc((size_t)d, sizeof *m->mean);
    m->std = calloc((size_t)d, sizeof *m->std);
    m->w = calloc((size_t)d, sizeof *m->w);
    float *best = malloc(((size_t)d + 1) * sizeof *best);
    double *g = malloc(((size_t)d + 1) * sizeof *g), *mom = calloc((size_t)d + 1, sizeof *mom);
    double *vel = calloc((size_t)d + 1, sizeof *vel);
    uint32_t *perm = malloc(n * sizeof *perm);
    int rc = RK_OK;
    if (!m->mean || !m->std || !m->w || !best || !g || !mom || !vel || !perm) {
        rc = rk_err_set(err, RK_ENOMEM, "logistic regression: out of memory");
        goto out;
    }
    for (int k = 0; k < d; k++) {
        double s = 0, ss = 0;
        for (size_t i = 0; i < n; i++) {
            double v = x[i * (size_t)d + k];
            if (!isfinite(v)) {
                rc = rk_err_set(err, RK_EINVAL, "logistic regression: input %zu, %d not finite", i,
                                k);
                goto out;
            }
            s += v;
            ss += v * v;
        }
        double mean = s / (double)n, var = ss / (double)n - mean * mean;
        m->mean[k] = (float)mean;
        m->std[k] = var > 1e-12 ? (float)sqrt(var) : 1.0f;
    }
    double best_loss = INFINITY;
    int since = 0;
    long step = 0;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int e = 0; e < o->max_epochs; e++) {
        rk_rng r;
        rk_rng_derive(&r, o->seed, 0x1065, (uint64_t)e);
        rk_rng_permutation(&r, perm, n);
        for (size_t s0 = 0; s0 < n; s0 += (size_t)o->batch) {
            size_t s1 = s0 + (size_t)o->batch < n ? s0 + (size_t)o->batch : n;
            memset(g, 0, ((size_t)d + 1) * sizeof *g);
            double wsum = 0;
            for (size_t q = s0; q < s1; q++) {
                size_t i = perm[q];
                const float *xi = x + i * (size_t)d;
                double p = rk_logreg_prob(m, xi), w = y[i] > 0.5f ? pw : 1.0;
                double dz = w * (p - y[i]);
                for (int k = 0; k < d; k++)
                    g[k] += dz * ((xi[k] - m->mean[k]) / m->std[k]);
                g[d] += dz;
                wsum += w;
            }
            step++;
            for (int k = 0; k <= d; k++) {
                double gk = g[k] / wsum + (k < d ? o->l2 * m->w[k] : 0.0);
                mom[k] = b1 * mom[k] + (1 - b1) * gk;
                vel[k] = b2 * vel[k] + (1 - b2) * gk * gk;
                double mh = mom[k] / (1 - pow(b1, (double)step)),
                       vh = vel[k] / (1 - pow(b2, (double)step));
                double upd = o->lr * mh / (sqrt(vh) + eps);
                if (k < d)
                    m->w[k] -= (float)upd;
                else
                    m->b -= (float)upd;
            }
        }
        double loss = nv ? logreg_loss(m, xv, yv, nv, pw) : logreg_loss(m, x, y, n, pw);
        if (!isfinite(loss)) {
            rc = rk_err_set(err, RK_EBACKEND, "logistic regression: the loss is not finite");
            break;
        }
        if (loss < best_loss - 1e-7) {
            best_loss = loss;
            since = 0;
            memcpy(best, m->w, (size_t)d * sizeof *best);
            best[d] = m->b;
        } else if (o->patience && ++since >= o->patience) {
            break;
        }
    }
    if (isfinite(best_loss)) {
        memcpy(m->w, best, (size_t)d * sizeof *best);
        m->b = best[d];
    }
out:
    free(best);
    free(g);
    free(mom);
    free(vel);
    free(perm);
    if (rc)
        rk_logreg_free(m);
    return rc;
}

/* ---- risks -------------------------------------------------------------------------------- */

void rk_fleet_risk_free(const rk_fleet *f, float **risk)
{
    if (!risk)
        return;
    for (int i = 0; i < f->gpus; i++)
        free(risk[i]);
    free(risk);
}

/* NAN-filled arrays for the GPUs of `split`. */
static int risk_alloc(const rk_fleet *f, int split, float ***out, rk_err *err)
{
    *out = calloc((size_t)f->gpus, sizeof **out);
    if (!*out)
        return rk_err_set(err, RK_ENOMEM, "out of memory");
    for (int i = 0; i < f->gpus; i++) {
        const rk_fleet_gpu *g = &f->gpu[i];
        if (g->split != split || !g->x)
            continue;
        float *r = malloc((g->steps ? g->steps : 1) * sizeof *r);
        if (!r) {
            rk_fleet_risk_free(f, *out);
            *out = NULL;
            return rk_err_set(err, RK_ENOMEM, "out of memory for GPU %d's risks", i);
        }
        for (size_t m = 0; m < g->steps; m++)
            r[m] = NAN;
        (*out)[i] = r;
    }
    return RK_OK;
}

#define RISK_BATCH 256

int rk_fleet_risk_model(const rk_fleet *f, int split, const rk_pred_model *m, float ***out,
                        rk_err *err)
{
    const rk_pred_config *c = rk_pred_config_of(m);
    if (c->features != F || c->task != RK_PRED_CLASSIFY)
        return rk_err_set(err, RK_EINVAL,
                          "the model reads %d features (%s); fleet windows "
                          "have %d (classification)",
                          c->features,
                          c->task == RK_PRED_CLASSIFY ? "classification" : "regression", F);
    int rc = risk_alloc(f, split, out, err);
    if (rc)
        return rc;
    const size_t T = (size_t)c->window;
    float *win = malloc(RISK_BATCH * T * F * sizeof *win), p[RISK_BATCH];
    if (!win) {
        rk_fleet_risk_free(f, *out);
        *out = NULL;
        return rk_err_set(err, RK_ENOMEM, "out of memory");
    }
    for (int i = 0; i < f->gpus && !rc; i++) {
        const rk_fleet_gpu *g = &f->gpu[i];
        if (!(*out)[i])
            continue;
        size_t end = rk_fleet_watch_end(g);
        for (size_t m0 = T - 1; m0 < end && !rc; m0 += RISK_BATCH) {
            size_t nb = end - m0 < RISK_BATCH ? end - m0 : RISK_BATCH;
            for (size_t b = 0; b < nb; b++)
                rk_fleet_window(g->x, g->steps, m0 + b, (int)T, win + b * T * F);
            if ((rc = rk_pred_predict(m, win, nb, p, err)))
                break;
            for (size_t b = 0; b < nb; b++)
                (*out)[i][m0 + b] = p[b];
        }
    }
    free(win);
    if (rc) {
        rk_fleet_risk_free(f, *out);
        *out = NULL;
    }
    return rc;
}

int rk_fleet_risk_logreg(const rk_fleet *f, int split, const rk_logreg *lr, int window,
                         float ***out, rk_err *err)
{
    if (lr->d != RK_FLEET_SUMMARY || window < 1)
        return rk_err_set(err, RK_EINVAL, "logistic regression: %d inputs, expected %d", lr->d,
                          RK_FLEET_SUMMARY);
    int rc = risk_alloc(f, split, out, err);
    if (rc)
        return rc;
    const size_t T = (size_t)window;
    float *win = malloc(T * F * sizeof *win), s[RK_FLEET_SUMMARY];
    if (!win) {
        rk_fleet_risk_free(f, *out);
        *out = NULL;
        return rk_err_set(err, RK_ENOMEM, "out of memory");
    }
    for (int i = 0; i < f->gpus; i++) {
        const rk_fleet_gpu *g = &f->gpu[i];
        if (!(*out)[i])
            continue;
        size_t end = rk_fleet_watch_end(g);
        for (size_t m = T - 1; m < end; m++) {
            rk_fleet_window(g->x, g->steps, m, window, win);
            rk_fleet_summary(win, window, s);
            (*out)[i][m] = (float)rk_logreg_prob(lr, s);
        }
    }
    free(win);
    return RK_OK;
}

int rk_fleet_risk_score(const rk_fleet *f, int split, int window, float ***out, rk_err *err)
{
    for (int i = 0; i < f->gpus; i++)
        if (f->gpu[i].split == split && f->gpu[i].x && !f->gpu[i].score)
            return rk_err_set(err, RK_EFORMAT,
                              "GPU %d's history has no health scores (a dataset "
                              "from an older rk predict dataset: write it again)",
                              i);
    int rc = risk_alloc(f, split, out, err);
    if (rc)
        return rc;
    for (int i = 0; i < f->gpus; i++) {
        const rk_fleet_gpu *g = &f->gpu[i];
        if (!(*out)[i])
            continue;
        size_t end = rk_fleet_watch_end(g);
        for (size_t m = window > 0 ? (size_t)window - 1 : 0; m < end; m++)
            (*out)[i][m] = 100.0f - g->score[m];
    }
    return RK_OK;
}

/* ---- the event-level evaluation ----------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int rk_fleet_evaluate(const rk_fleet *f, int split, float *const *risk, int window, int horizon,
                      double threshold, rk_fleet_metrics *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    out->threshold = threshold;
    if (window < 1 || horizon < 1)
        return rk_err_set(err, RK_EINVAL, "evaluation: window %d, horizon %d", window, horizon);
    double *leads = malloc((size_t)f->gpus * sizeof *leads);
    if (!leads)
        return rk_err_set(err, RK_ENOMEM, "evaluation: out of memory");
    size_t correct = 0;
    const long H = horizon;
    for (int i = 0; i < f->gpus; i++) {
        const rk_fleet_gpu *g = &f->gpu[i];
        if (g->split != split || !risk[i])
            continue;
        out->gpus++;
        const long fl = g->failure, end = (long)rk_fleet_watch_end(g);
        int detected = 0;
        long last_fa = -1;
        for (long m = window - 1; m < end; m++) {
            int y = rk_fleet_label(g, (size_t)m, horizon);
            int alarm = risk[i][m] >= threshold; /* NAN: no alarm */
            out->minutes++;
            out->positive_minutes += (size_t)y;
            correct += alarm == y;
            if (!alarm)
                continue;
            if (y) {
                if (!detected) {
                    detected = 1;
                    leads[out->detected++] = (double)(fl - m);
                }
            } else {
                if (last_fa < 0 || m - last_fa > H)
                    out->false_alarms++;
                last_fa = m;
            }
        }
        if (fl >= 0) {
            out->failures++;
            if (g->precursor < 0) {
                out->silent++;
                out->silent_detected += detected;
            }
            if (last_fa >= 0 && last_fa >= fl - 2 * H)
                out->early_alarms++;
        }
    }
    if (out->gpus == 0) {
        free(leads);
        return rk_err_set(err, RK_EINVAL, "evaluation: no GPU of the split to watch");
    }
    out->gpu_days = (double)out->minutes / 1440.0;
    int alarms = out->detected + out->false_alarms;
    out->precision = alarms ? (double)out->detected / alarms : 0;
    out->recall = out->failures ? (double)out->detected / out->failures : 0;
    out->f1 = out->precision + out->recall > 0
                  ? 2 * out->precision * out->recall / (out->precision + out->recall)
                  : 0;
    out->false_alarms_per_gpu_day = out->gpu_days > 0 ? out->false_alarms / out->gpu_days : 0;
    out->accuracy = out->minutes ? (double)correct / (double)out->minutes : 0;
    if (out->detected) {
        double s = 0;
        for (int k = 0; k < out->detected; k++)
            s += leads[k];
        out->lead_mean = s / out->detected;
        qsort(leads, (size_t)out->detected, sizeof *leads, cmp_double);
        int h = out->detected / 2;
        out->lead_median = out->detected % 2 ? leads[h] : 0.5 * (leads[h - 1] + leads[h]);
    }
    free(leads);
    return RK_OK;
}

int rk_fleet_pick_threshold(const rk_fleet *f, int split, float *const *risk, int window,
                            int horizon, const double *cands, int n, double min_lead,
                            rk_fleet_metrics *best, rk_err *err)
{
    if (n < 1)
        return rk_err_set(err, RK_EINVAL, "evaluation: no candidate thresholds");
    int have = 0, have_lead = 0;
    for (int k = 0; k < n; k++) {
        rk_fleet_metrics m;
        int rc = rk_fleet_evaluate(f, split, risk, window, horizon, cands[k], &m, err);
        if (rc)
            return rc;
        int lead_ok = m.detected > 0 && m.lead_mean >= min_lead;
        if (have_lead && !lead_ok)
            continue;
        if (!have || (lead_ok && !have_lead) || m.f1 > best->f1 ||
            (m.f1 == best->f1 &&
             (m.precision > best->precision ||
              (m.precision == best->precision && m.threshold > best->threshold)))) {
            *best = m;
            have = 1;
            have_lead |= lead_ok;
        }
    }
    return RK_OK;
}

/* ---- the detectors file (MODEL.json) ------------------------------------------------------ */

void rk_fleet_detectors_free(rk_fleet_detectors *d)
{
    if (d)
        rk_logreg_free(&d->lr);
}

static int parse_detectors(rk_fleet_detectors *d, json_t *j, const char *path, rk_err *err)
{
    json_t *fmt = json_object_get(j, "format"), *jl = json_object_get(j, "logreg");
    json_t *jp = json_object_get(j, "predictor");
    json_t *w = json_object_get(jl, "w"), *mu = json_object_get(jl, "mean"),
           *sd = json_object_get(jl, "std");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "rekindle-fleet-detectors") ||
        !json_is_integer(json_object_get(j, "window")) ||
        !json_is_integer(json_object_get(j, "horizon")) ||
        !json_is_number(json_object_get(jp, "threshold")) ||
        !json_is_number(json_object_get(jl, "threshold")) ||
        !json_is_number(json_object_get(jl, "threshold_best_f1")) ||
        !json_is_number(json_object_get(jl, "b")) || json_array_size(w) != RK_FLEET_SUMMARY ||
        json_array_size(mu) != RK_FLEET_SUMMARY || json_array_size(sd) != RK_FLEET_SUMMARY)
        return rk_err_set(err, RK_EFORMAT, "%s: not the detectors file of rk predict train",
                          path);
    json_int_t win = json_integer_value(json_object_get(j, "window"));
    json_int_t hor = json_integer_value(json_object_get(j, "horizon"));
    if (win < 1 || win > RK_PRED_MAX_WINDOW || hor < 1 || hor > 1440)
        return rk_err_set(err, RK_EFORMAT, "%s: window %lld or horizon %lld out of range "
                          "(1..%d, 1..1440)", path, (long long)win, (long long)hor,
                          RK_PRED_MAX_WINDOW);
    d->window = (int)win;
    d->horizon = (int)hor;
    d->threshold = json_number_value(json_object_get(jp, "threshold"));
    d->lr_threshold = json_number_value(json_object_get(jl, "threshold"));
    d->lr_threshold_best_f1 = json_number_value(json_object_get(jl, "threshold_best_f1"));
    rk_logreg *lr = &d->lr;
    lr->d = RK_FLEET_SUMMARY;
    lr->w = malloc(RK_FLEET_SUMMARY * sizeof *lr->w);
    lr->mean = malloc(RK_FLEET_SUMMARY * sizeof *lr->mean);
    lr->std = malloc(RK_FLEET_SUMMARY * sizeof *lr->std);
    if (!lr->w || !lr->mean || !lr->std)
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
    lr->b = (float)json_number_value(json_object_get(jl, "b"));
    if (!isfinite(lr->b))
        return rk_err_set(err, RK_EFORMAT, "%s: logreg b is not a finite float", path);
    for (int k = 0; k < RK_FLEET_SUMMARY; k++) {
        json_t *a = json_array_get(w, (size_t)k), *b = json_array_get(mu, (size_t)k),
               *s = json_array_get(sd, (size_t)k);
        if (!json_is_number(a) || !json_is_number(b) || !json_is_number(s))
            return rk_err_set(err, RK_EFORMAT, "%s: logreg value %d is not a number", path, k);
        lr->w[k] = (float)json_number_value(a);
        lr->mean[k] = (float)json_number_value(b);
        lr->std[k] = (float)json_number_value(s);
        if (!isfinite(lr->w[k]) || !isfinite(lr->mean[k]) || !(lr->std[k] > 0) ||
            !isfinite(lr->std[k]))
            return rk_err_set(err, RK_EFORMAT,
                              "%s: logreg value %d is not a finite float (std > 0)", path, k);
    }
    return RK_OK;
}

int rk_fleet_detectors_parse(rk_fleet_detectors *d, const char *text, size_t len,
                             const char *name, rk_err *err)
{
    memset(d, 0, sizeof *d);
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    char tb[JSON_ERROR_TEXT_LENGTH];
    if (!j)
        return rk_err_set(err, RK_EFORMAT, "%s: line %d: %s", name, je.line,
                          rk_msg_parser_text(tb, sizeof tb, je.text));
    int rc = parse_detectors(d, j, name, err);
    json_decref(j);
    if (rc)
        rk_fleet_detectors_free(d);
    return rc;
}

int rk_fleet_detectors_load(rk_fleet_detectors *d, const char *path, rk_err *err)
{
    memset(d, 0, sizeof *d);
    int rc = RK_OK;
    json_t *j = json_file(path, "rk predict train writes it beside the model", &rc, err);
    if (!j)
        return rc;
    rc = parse_detectors(d, j, path, err);
    json_decref(j);
    if (rc)
        rk_fleet_detectors_free(d);
    return rc;
}
