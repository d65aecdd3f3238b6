/*
 * C-MAPSS FD001 (predict/cmapss.h): a strict reader for the NASA text files, the windowing
 * of the common RUL protocol, and the protocol itself: validation split by engine, an
 * ensemble of predictors (predict/predict.h) trained on the training engines, and one
 * scoring of the test engines' last cycles.
 */
#include "predict/cmapss.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/clock.h"
#include "rekindle/fileio.h"
#include "rekindle/rng.h"

/* s2 s3 s4 s7 s8 s9 s11 s12 s13 s14 s15 s17 s20 s21: sensor sK is value 3 + K - 1. */
const int rk_cmapss_feature_cols[RK_CMAPSS_FEATURES] = {4,  5,  6,  9,  10, 11, 13,
                                                        14, 15, 16, 17, 19, 22, 23};

void rk_cmapss_free(rk_cmapss_table *t)
{
    if (!t)
        return;
    free(t->unit);
    free(t->cycle);
    free(t->v);
    free(t->first);
    memset(t, 0, sizeof *t);
}

/* "unit", "cycle", "setting 1".., "s1".. for messages. */
static const char *column_name(int c)
{
    static const char *const names[RK_CMAPSS_COLS] = {
        "unit", "cycle", "setting 1", "setting 2", "setting 3", "s1",  "s2",  "s3",  "s4",
        "s5",   "s6",    "s7",        "s8",        "s9",        "s10", "s11", "s12", "s13",
        "s14",  "s15",   "s16",       "s17",       "s18",       "s19", "s20", "s21"};
    return c >= 0 && c < RK_CMAPSS_COLS ? names[c] : "?";
}

/* One token of `len` bytes: a finite number that fits a float into *v, or a missing-value marker
 * (NaN, NA, N/A, None, null, any case, optionally in quotes) with *missing set and *v NaN. -1 for
 * anything else. */
static int parse_value(const char *tok, size_t len, double *v, int *missing)
{
    static const char *const markers[] = {"nan", "-nan", "na", "n/a", "none", "null"};
    char buf[64];
    *missing = 0;
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, tok, len);
    buf[len] = 0;
    char *b = buf;
    if (len >= 2 && (b[0] == '\'' || b[0] == '"') && b[len - 1] == b[0]) {
        b[len - 1] = 0;
        b++;
    }
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++)
        if (strcasecmp(b, markers[i]) == 0) {
            *missing = 1;
            *v = NAN;
            return 0;
        }
    char *end;
    errno = 0;
    *v = strtod(b, &end);
    return end == b || *end || errno || !(fabs(*v) <= FLT_MAX) ? -1 : 0; /* fits a float */
}

/* A whole number in [lo, hi] from a parsed double. */
static int whole(double v, double lo, double hi)
{
    return v == floor(v) && v >= lo && v <= hi;
}

/* The next line of buf[0..len) from *pos: its start and length (without the newline). */
static int next_line(const char *buf, size_t len, size_t *pos, const char **line, size_t *n)
{
    if (*pos >= len)
        return 0;
    const char *s = buf + *pos, *nl = memchr(s, '\n', len - *pos);
    *line = s;
    *n = nl ? (size_t)(nl - s) : len - *pos;
    *pos += *n + (nl != NULL);
    return 1;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

int rk_cmapss_parse(const char *buf, size_t len, const char *name, rk_cmapss_table *out,
                    rk_err *err)
{
    memset(out, 0, sizeof *out);
    if (!name)
        name = "<memory>";
    size_t cap = 0, n = 0, ecap = 0, pos = 0, ll;
    const char *line;
    long lineno = 0;
    int rc = RK_OK;
    rk_cmapss_table t = {0};
    while (next_line(buf, len, &pos, &line, &ll)) {
        lineno++;
        double col[RK_CMAPSS_COLS];
        int nc = 0;
        size_t i = 0;
        for (;;) {
            while (i < ll && is_space(line[i]))
                i++;
            if (i == ll)
                break;
            size_t tok = i;
            while (i < ll && !is_space(line[i]))
                i++;
            if (nc == RK_CMAPSS_COLS) {
                rc = rk_err_set(err, RK_EFORMAT, "%s:%ld: more than %d columns", name, lineno,
                                RK_CMAPSS_COLS);
                goto fail;
            }
            int missing;
            if (parse_value(line + tok, i - tok, &col[nc], &missing) || (missing && nc < 2)) {
                rc =
                    rk_err_set(err, RK_EFORMAT, "%s:%ld: column %d (%s) is %s", name, lineno,
                               nc + 1, column_name(nc),
                               missing ? "missing (unit and cycle must be given)" : "not a number");
                goto fail;
            }
            t.missing += (size_t)missing;
            nc++;
        }
        if (nc == 0)
            continue; /* a blank line (the files end with one) */
        if (nc != RK_CMAPSS_COLS) {
            rc = rk_err_set(err, RK_EFORMAT, "%s:%ld: %d columns, expected %d", name, lineno, nc,
                            RK_CMAPSS_COLS);
            goto fail;
        }
        if (!whole(col[0], 1, 1e6) || !whole(col[1], 1, 1e6)) {
            rc = rk_err_set(err, RK_EFORMAT,
                            "%s:%ld: unit and cycle must be whole numbers in [1, 1e6] (got %g, "
                            "%g)",
                            name, lineno, col[0], col[1]);
            goto fail;
        }
        int unit = (int)col[0], cycle = (int)col[1];
        int new_engine = n == 0 || unit != t.unit[n - 1];
        if (new_engine && n > 0 && unit < t.unit[n - 1]) {
            rc = rk_err_set(err, RK_EFORMAT,
                            "%s:%ld: unit %d after unit %d (engines must be in increasing "
                            "order, each in one block)",
                            name, lineno, unit, t.unit[n - 1]);
            goto fail;
        }
        int want = new_engine ? 1 : t.cycle[n - 1] + 1;
        if (cycle != want) {
            rc = rk_err_set(err, RK_EFORMAT, "%s:%ld: unit %d cycle %d, expected cycle %d", name,
                            lineno, unit, cycle, want);
            goto fail;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            int *u = realloc(t.unit, cap * sizeof *u);
            if (u)
                t.unit = u;
            int *c = u ? realloc(t.cycle, cap * sizeof *c) : NULL;
            if (c)
                t.cycle = c;
            float *v = c ? realloc(t.v, cap * RK_CMAPSS_VALUES * sizeof *v) : NULL;
            if (!v) {
                rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", name);
                goto fail;
            }
            t.v = v;
        }
        if (new_engine) {
            if ((size_t)t.engines + 2 > ecap) {
                ecap = ecap ? 2 * ecap : 128;
                size_t *fe = realloc(t.first, ecap * sizeof *fe);
                if (!fe) {
                    rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", name);
                    goto fail;
                }
                t.first = fe;
            }
            t.first[t.engines++] = n;
        }
        t.unit[n] = unit;
        t.cycle[n] = cycle;
        for (int j = 0; j < RK_CMAPSS_VALUES; j++)
            t.v[n * RK_CMAPSS_VALUES + j] = (float)col[2 + j];
        n++;
    }
    if (n == 0) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: no rows", name);
        goto fail;
    }
    t.rows = n;
    t.first[t.engines] = n;
    *out = t;
    return RK_OK;
fail:
    rk_cmapss_free(&t);
    return rc;
}

int rk_cmapss_read(const char *path, rk_cmapss_table *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    uint8_t *buf;
    size_t len;
    int rc = rk_file_read_all(path, &buf, &len, RK_CMAPSS_MAX_FILE, err);
    if (rc)
        return rc;
    rc = rk_cmapss_parse((const char *)buf, len, path, out, err);
    free(buf);
    return rc;
}

int rk_cmapss_parse_rul(const char *buf, size_t len, const char *name, int engines, float *rul,
                        rk_err *err)
{
    if (!name)
        name = "<memory>";
    size_t pos = 0, ll;
    const char *line;
    long lineno = 0;
    int n = 0;
    while (next_line(buf, len, &pos, &line, &ll)) {
        lineno++;
        size_t i = 0, e;
        while (i < ll && is_space(line[i]))
            i++;
        if (i == ll)
            continue;
        for (e = i; e < ll && !is_space(line[e]);)
            e++;
        size_t rest = e;
        while (rest < ll && is_space(line[rest]))
            rest++;
        double v;
        int missing;
        if (rest != ll || parse_value(line + i, e - i, &v, &missing) || missing ||
            !whole(v, 0, 1e6))
            return rk_err_set(err, RK_EFORMAT, "%s:%ld: not a whole number of cycles >= 0", name,
                              lineno);
        if (n == engines)
            return rk_err_set(err, RK_EFORMAT, "%s:%ld: more lines than the %d test engines", name,
                              lineno, engines);
        rul[n++] = (float)v;
    }
    if (n != engines)
        return rk_err_set(err, RK_EFORMAT, "%s: %d values for %d test engines", name, n, engines);
    return RK_OK;
}

int rk_cmapss_read_rul(const char *path, int engines, float *rul, rk_err *err)
{
    uint8_t *buf;
    size_t len;
    int rc = rk_file_read_all(path, &buf, &len, RK_CMAPSS_MAX_FILE, err);
    if (rc)
        return rc;
    rc = rk_cmapss_parse_rul((const char *)buf, len, path, engines, rul, err);
    free(buf);
    return rc;
}

int rk_cmapss_impute(rk_cmapss_table *t, const char *name, rk_err *err)
{
    if (!t->missing)
        return RK_OK;
    for (int e = 0; e < t->engines; e++) {
        const size_t a = t->first[e], b = t->first[e + 1];
        for (int j = 0; j < RK_CMAPSS_VALUES; j++) {
            float *v = t->v + j;
            const size_t S = RK_CMAPSS_VALUES;
            size_t prev = SIZE_MAX; /* the last row with a value */
            for (size_t r = a; r < b; r++) {
                if (isnan(v[r * S]))
                    continue;
                /* Fill the gap before r: interpolate from prev, or copy r back to the start. */
                for (size_t q = prev == SIZE_MAX ? a : prev + 1; q < r; q++)
                    v[q * S] =
                        prev == SIZE_MAX
                            ? v[r * S]
                            : (float)(v[prev * S] + ((double)v[r * S] - v[prev * S]) *
                                                        (double)(q - prev) / (double)(r - prev));
                prev = r;
            }
            if (prev == SIZE_MAX)
                return rk_err_set(
                    err, RK_EFORMAT, "%s: unit %d has no value at all for column %d (%s)",
                    name ? name : "C-MAPSS table", t->unit[a], j + 3, column_name(j + 2));
            for (size_t q = prev + 1; q < b; q++)
                v[q * S] = v[prev * S];
        }
    }
    return RK_OK;
}

/* ---- windows -------------------------------------------------------------------------------- */

/* The window of T rows of engine e ending at row `last` (absolute), its steps before the
 * engine's first row filled with the first row. */
static void window_at(const rk_cmapss_table *t, int e, size_t last, int T, float *dst)
{
    for (int s = 0; s < T; s++) {
        long r = (long)last - (T - 1 - s);
        size_t row = r < (long)t->first[e] ? t->first[e] : (size_t)r;
        for (int j = 0; j < RK_CMAPSS_FEATURES; j++)
            dst[s * RK_CMAPSS_FEATURES + j] =
                t->v[row * RK_CMAPSS_VALUES + (size_t)rk_cmapss_feature_cols[j]];
    }
}

typedef struct windows {
    size_t n;
    float *x, *y;
} windows;

/* The windows of the engines with keep[e] == want, ending at every cycle from first_end on
 * (one ending at the last cycle for an engine shorter than that), padded where they would
 * start before the engine; targets min(RUL, cap). */
static int make_windows(const rk_cmapss_table *t, const unsigned char *keep, int want, int T,
                        int first_end, float cap, windows *w, rk_err *err)
{
    memset(w, 0, sizeof *w);
    size_t n = 0, E = (size_t)first_end;
    for (int e = 0; e < t->engines; e++) {
        size_t len = t->first[e + 1] - t->first[e];
        if (keep[e] == want)
            n += len >= E ? len - E + 1 : 1;
    }
    w->x = malloc(n * (size_t)T * RK_CMAPSS_FEATURES * sizeof *w->x);
    w->y = malloc((n ? n : 1) * sizeof *w->y);
    if (!w->x || !w->y) {
        free(w->x);
        free(w->y);
        return rk_err_set(err, RK_ENOMEM, "cmapss: out of memory for %zu windows", n);
    }
    size_t k = 0;
    for (int e = 0; e < t->engines; e++) {
        if (keep[e] != want)
            continue;
        size_t a = t->first[e], b = t->first[e + 1], len = b - a;
        size_t from = len >= E ? a + E - 1 : b - 1;
        for (size_t last = from; last < b; last++, k++) {
            window_at(t, e, last, T, w->x + k * (size_t)T * RK_CMAPSS_FEATURES);
            float rul = (float)(b - 1 - last);
            w->y[k] = rul < cap ? rul : cap;
        }
    }
    w->n = n;
    return RK_OK;
}

static void free_windows(windows *w)
{
    free(w->x);
    free(w->y);
    memset(w, 0, sizeof *w);
}

/* ---- the protocol --------------------------------------------------------------------------- */

void rk_cmapss_opts_default(rk_cmapss_opts *o)
{
    memset(o, 0, sizeof *o);
    o->window = 50;
    o->first_end = 30;
    o->rul_cap = 125.0f;
    o->val_engines = 20;
    o->seed = 1;
    o->ensemble = 5;
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    c.task = RK_PRED_REGRESS;
    c.hidden = 32;
    o->model = c;
    rk_pred_train_opts t = RK_PRED_TRAIN_OPTS_DEFAULT;
    t.batch = 128;
    t.lr = 1e-3f;
    t.max_epochs = 30;
    t.patience = 5;
    o->train = t;
}

static double rmse(const float *p, const float *y, size_t n)
{
    double s = 0;
    for (size_t k = 0; k < n; k++)
        s += ((double)p[k] - y[k]) * ((double)p[k] - y[k]);
    return sqrt(s / (double)n);
}

int rk_cmapss_run(const rk_cmapss_opts *o, rk_cmapss_result *r, rk_err *err)
{
    const double t0 = rk_mono_s();
    memset(r, 0, sizeof *r);
    if (!o->dir)
        return rk_err_set(err, RK_EINVAL, "cmapss: no data directory");
    if (o->window < 1 || o->window > RK_PRED_MAX_WINDOW)
        return rk_err_set(err, RK_EINVAL, "cmapss: window %d is not in [1, %d]", o->window,
                          RK_PRED_MAX_WINDOW);
    if (o->first_end < 0 || o->first_end > 100000)
        return rk_err_set(err, RK_EINVAL, "cmapss: first_end %d is not in [0, 100000]",
                          o->first_end);
    if (o->ensemble < 1 || o->ensemble > RK_CMAPSS_MAX_MEMBERS)
        return rk_err_set(err, RK_EINVAL, "cmapss: ensemble %d is not in [1, %d]", o->ensemble,
                          RK_CMAPSS_MAX_MEMBERS);
    if (!(o->rul_cap > 0) || !isfinite(o->rul_cap))
        return rk_err_set(err, RK_EINVAL, "cmapss: RUL cap %g is not positive", o->rul_cap);
    char path[3][4096];
    const char *names[3] = {"train_FD001.txt", "test_FD001.txt", "RUL_FD001.txt"};
    for (int i = 0; i < 3; i++)
        if (snprintf(path[i], sizeof path[i], "%s/%s", o->dir, names[i]) >= (int)sizeof path[i])
            return rk_err_set(err, RK_EINVAL, "cmapss: data directory path is too long");

    rk_cmapss_table train = {0}, test = {0};
    windows tr = {0}, va = {0};
    float *rul = NULL, *xt = NULL, *pt = NULL, *pv = NULL, *sum_t = NULL, *sum_v = NULL;
    unsigned char *is_val = NULL;
    uint32_t *perm = NULL;
    rk_pred_model *m = NULL;
    int rc;
    r->test_rmse = r->test_rmse_capped = r->test_score = NAN;
    if ((rc = rk_cmapss_read(path[0], &train, err)) ||
        (!o->validate_only && (rc = rk_cmapss_read(path[1], &test, err))))
        goto out;
    r->missing_train = train.missing;
    r->missing_test = test.missing;
    if ((rc = rk_cmapss_impute(&train, path[0], err)) ||
        (rc = rk_cmapss_impute(&test, path[1], err)))
        goto out;
    if (o->val_engines < 1 || o->val_engines >= train.engines) {
        rc = rk_err_set(err, RK_EINVAL, "cmapss: %d validation engines of %d training engines",
                        o->val_engines, train.engines);
        goto out;
    }
    rul = malloc(((size_t)test.engines + 1) * sizeof *rul);
    is_val = calloc((size_t)train.engines, 1);
    perm = malloc((size_t)train.engines * sizeof *perm);
    if (!rul || !is_val || !perm) {
        rc = rk_err_set(err, RK_ENOMEM, "cmapss: out of memory");
        goto out;
    }
    if (!o->validate_only && (rc = rk_cmapss_read_rul(path[2], test.engines, rul, err)))
        goto out;

    /* The split: by engine, drawn with the seed. */
    rk_rng rng;
    rk_rng_derive(&rng, o->seed, 0xc3a955, 0);
    rk_rng_permutation(&rng, perm, (size_t)train.engines);
    for (int i = 0; i < o->val_engines; i++)
        is_val[perm[i]] = 1;
    const int T = o->window;
    const int first_end = o->first_end ? o->first_end : T;
    if ((rc = make_windows(&train, is_val, 0, T, first_end, o->rul_cap, &tr, err)) ||
        (rc = make_windows(&train, is_val, 1, T, first_end, o->rul_cap, &va, err)))
        goto out;

    /* The test inputs: each engine's last window. */
    const size_t win = (size_t)T * RK_CMAPSS_FEATURES, ne = (size_t)test.engines;
    xt = malloc((ne + 1) * win * sizeof *xt);
    pt = malloc((ne + 1) * sizeof *pt);
    pv = malloc(va.n * sizeof *pv);
    sum_t = calloc(ne + 1, sizeof *sum_t);
    sum_v = calloc(va.n, sizeof *sum_v);
    if (!xt || !pt || !pv || !sum_t || !sum_v) {
        rc = rk_err_set(err, RK_ENOMEM, "cmapss: out of memory");
        goto out;
    }
    for (int e = 0; e < test.engines; e++)
        window_at(&test, e, test.first[e + 1] - 1, T, xt + (size_t)e * win);

    r->train_engines = train.engines - o->val_engines;
    r->val_engines = o->val_engines;
    r->test_engines = test.engines;
    r->train_windows = tr.n;
    r->val_windows = va.n;
    rk_pred_data dtr = {tr.n, tr.x, tr.y}, dva = {va.n, va.x, va.y};
    for (int k = 0; k < o->ensemble; k++) {
        rk_pred_config c = o->model;
        c.task = RK_PRED_REGRESS;
        c.window = T;
        c.features = RK_CMAPSS_FEATURES;
        c.seed = o->seed + (uint64_t)k;
        rk_pred_train_opts to = o->train;
        to.seed = o->seed + (uint64_t)k;
        rk_pred_report rep;
        if ((rc = rk_pred_create(&m, &c, err)) ||
            (rc = rk_pred_train(m, &dtr, &dva, &to, &rep, err)) ||
            (rc = rk_pred_predict(m, va.x, va.n, pv, err)) ||
            (rc = rk_pred_predict(m, xt, ne, pt, err)))
            goto out;
        rk_pred_free(m);
        m = NULL;
        for (size_t i = 0; i < va.n; i++)
            sum_v[i] += pv[i];
        for (size_t i = 0; i < ne; i++)
            sum_t[i] += pt[i];
        rk_cmapss_member *mb = &r->member[k];
        mb->epochs = rep.epochs;
        mb->best_epoch = rep.best_epoch;
        mb->val_rmse = rmse(pv, va.y, va.n);
        mb->seconds = rep.seconds;
        r->members = k + 1;
        r->epochs += rep.epochs;
        if (o->on_member)
            o->on_member(k, &rep, mb->val_rmse, o->ctx);
    }

    /* The ensemble: validation, then the test, once. */
    for (size_t i = 0; i < va.n; i++)
        pv[i] = sum_v[i] / (float)o->ensemble;
    r->val_rmse = rmse(pv, va.y, va.n);
    rc = RK_OK;
    if (o->validate_only)
        goto out;
    double se = 0, sec = 0, score = 0;
    for (size_t i = 0; i < ne; i++) {
        double p = sum_t[i] / (double)o->ensemble, y = rul[i];
        double yc = y < o->rul_cap ? y : o->rul_cap, d = p - y;
        se += d * d;
        sec += (p - yc) * (p - yc);
        score += d < 0 ? exp(-d / 13.0) - 1.0 : exp(d / 10.0) - 1.0;
    }
    r->test_rmse = sqrt(se / (double)ne);
    r->test_rmse_capped = sqrt(sec / (double)ne);
    r->test_score = score;
out:
    r->seconds = rk_mono_s() - t0;
    rk_pred_free(m);
    rk_cmapss_free(&train);
    rk_cmapss_free(&test);
    free_windows(&tr);
    free_windows(&va);
    free(rul);
    free(xt);
    free(pt);
    free(pv);
    free(sum_t);
    free(sum_v);
    free(is_val);
    free(perm);
    return rc;
}
