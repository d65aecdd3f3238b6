/*
 * Saving and loading predictors (predict/predict.h) in the safetensors layout
 * (rekindle/safetensors.h): the parameter tensors, the normalisation statistics and metadata
 * that say what the model is. Loading trusts nothing: every tensor's shape and every value is
 * checked, and a message names the file and the problem.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "predict/model.h"
#include "rekindle/safetensors.h"

#define FORMAT "rekindle-predictor"
#define VERSION "1"

int rk_pred_save(const rk_pred_model *m, const char *path, rk_err *err)
{
    const int64_t F = m->c.features, one = 1;
    rk_st_entry e[RK_PT_COUNT + 4];
    size_t n = 0;
    for (int k = 0; k < RK_PT_COUNT; k++)
        e[n++] =
            (rk_st_entry){m->t[k].name, m->p + m->t[k].offset, m->t[k].ndim, m->t[k].shape, "F32"};
    e[n++] = (rk_st_entry){"norm.mean", m->mean, 1, &F, "F32"};
    e[n++] = (rk_st_entry){"norm.std", m->std, 1, &F, "F32"};
    e[n++] = (rk_st_entry){"target.mean", &m->y_mean, 1, &one, "F32"};
    e[n++] = (rk_st_entry){"target.std", &m->y_std, 1, &one, "F32"};
    char num[6][24];
    const int v[6] = {m->c.window, m->c.features, m->c.hidden,
                      m->c.attn,   m->c.dense,    m->c.horizon_min};
    for (int i = 0; i < 6; i++)
        snprintf(num[i], sizeof num[i], "%d", v[i]);
    const int horizon = m->c.task == RK_PRED_CLASSIFY && m->c.horizon_min > 0;
    const char *meta[] = {"format",
                          FORMAT,
                          "version",
                          VERSION,
                          "task",
                          m->c.task == RK_PRED_REGRESS ? "regress" : "classify",
                          "window",
                          num[0],
                          "features",
                          num[1],
                          "hidden",
                          num[2],
                          "attn",
                          num[3],
                          "dense",
                          num[4],
                          "gate_order",
                          "ifgo",
                          horizon ? "horizon_min" : NULL,
                          num[5],
                          NULL};
    return rk_st_write(path, e, n, meta, err);
}

/* The metadata value `key` of `f` as an int in [1, max]. */
static int meta_int(const rk_st_file *f, const char *key, int max, int *out, rk_err *err)
{
    const char *s = rk_st_meta(f, key);
    if (!s)
        return rk_err_set(err, RK_EFORMAT, "%s: metadata '%s' is missing", f->name, key);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > max)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: metadata '%s' = '%.40s' is not a whole number in [1, %d]", f->name,
                          key, s, max);
    *out = (int)v;
    return RK_OK;
}

static int load_checked(const rk_st_file *f, const char *name, int ndim, const int64_t *shape,
                        float *dst, size_t n, rk_err *err)
{
    rk_err e = {0};
    if (rk_st_load_f32(f, name, ndim, shape, dst, &e))
        return rk_err_set(err, RK_EFORMAT, "%s", e.msg); /* a missing tensor too: a bad file */
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return rk_err_set(err, RK_EFORMAT, "%s: tensor '%s' element %zu is not finite", f->name,
                              name, i);
    return RK_OK;
}

/* The model in a parsed file; frees the file. */
static int from_file(rk_st_file f, rk_pred_model **out, rk_err *err)
{
    int rc;
    rk_pred_model *m = NULL;
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    const char *fmt = rk_st_meta(&f, "format"), *ver = rk_st_meta(&f, "version");
    const char *task = rk_st_meta(&f, "task");
    if (!fmt || strcmp(fmt, FORMAT) != 0) {
        rc = rk_err_set(
            err, RK_EFORMAT,
            "%s: not a rekindle predictor (metadata 'format' is %s%s%s, expected '" FORMAT "')",
            f.name, fmt ? "'" : "", fmt ? fmt : "missing", fmt ? "'" : "");
        goto out;
    }
    if (!ver || strcmp(ver, VERSION) != 0) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: predictor format version '%s' is not " VERSION,
                        f.name, ver ? ver : "(missing)");
        goto out;
    }
    if (task && strcmp(task, "regress") == 0) {
        c.task = RK_PRED_REGRESS;
    } else if (task && strcmp(task, "classify") == 0) {
        c.task = RK_PRED_CLASSIFY;
    } else {
        rc = rk_err_set(err, RK_EFORMAT, "%s: metadata 'task' is '%s', not 'classify' or 'regress'",
                        f.name, task ? task : "(missing)");
        goto out;
    }
    if ((rc = meta_int(&f, "window", RK_PRED_MAX_WINDOW, &c.window, err)) ||
        (rc = meta_int(&f, "features", RK_PRED_MAX_FEATURES, &c.features, err)) ||
        (rc = meta_int(&f, "hidden", RK_PRED_MAX_UNITS, &c.hidden, err)) ||
        (rc = meta_int(&f, "attn", RK_PRED_MAX_UNITS, &c.attn, err)) ||
        (rc = meta_int(&f, "dense", RK_PRED_MAX_UNITS, &c.dense, err)))
        goto out;
    /* what the probability is about; files from before models recorded it: the trainer's
     * horizon then (predict/predict.h) */
    c.horizon_min = 0;
    if (c.task == RK_PRED_CLASSIFY) {
        c.horizon_min = RK_PRED_HORIZON_UNRECORDED;
        if (rk_st_meta(&f, "horizon_min") &&
            (rc = meta_int(&f, "horizon_min", RK_PRED_MAX_HORIZON, &c.horizon_min, err)))
            goto out;
    }
    const char *order = rk_st_meta(&f, "gate_order");
    if (order && strcmp(order, "ifgo") != 0) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: gate order '%s' is not 'ifgo'", f.name, order);
        goto out;
    }
    if ((rc = rk_pred_create(&m, &c, err)))
        goto out;
    for (int k = 0; k < RK_PT_COUNT; k++)
        if ((rc = load_checked(&f, m->t[k].name, m->t[k].ndim, m->t[k].shape, m->p + m->t[k].offset,
                               m->t[k].numel, err)))
            goto out;
    const int64_t F = c.features, one = 1;
    if ((rc = load_checked(&f, "norm.mean", 1, &F, m->mean, (size_t)F, err)) ||
        (rc = load_checked(&f, "norm.std", 1, &F, m->std, (size_t)F, err)) ||
        (rc = load_checked(&f, "target.mean", 1, &one, &m->y_mean, 1, err)) ||
        (rc = load_checked(&f, "target.std", 1, &one, &m->y_std, 1, err)))
        goto out;
    for (int64_t j = 0; j < F; j++)
        if (!(m->std[j] > 0.0f)) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: norm.std[%lld] = %g is not positive", f.name,
                            (long long)j, m->std[j]);
            goto out;
        }
    if (!(m->y_std > 0.0f)) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: target.std = %g is not positive", f.name, m->y_std);
        goto out;
    }
    *out = m;
    m = NULL;
out:
    rk_pred_free(m);
    rk_st_free(&f);
    return rc;
}

int rk_pred_load(rk_pred_model **out, const char *path, rk_err *err)
{
    *out = NULL;
    rk_st_file f;
    int rc = rk_st_read(path, &f, err);
    return rc ? rc : from_file(f, out, err);
}

int rk_pred_decode(const uint8_t *buf, size_t len, const char *name, rk_pred_model **out,
                   rk_err *err)
{
    *out = NULL;
    rk_st_file f;
    int rc = rk_st_parse(buf, len, name, &f, err);
    return rc ? rc : from_file(f, out, err);
}
