/*
 * Training the predictor (predict/predict.h): seeded mini-batch order, backpropagation through
 * time (predict/model.c), the gradient clipped to a global L2 norm, Adam, and early stopping
 * on a validation set that keeps the best epoch's weights.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "predict/model.h"
#include "rekindle/rng.h"

static int check_data(const rk_pred_model *m, const rk_pred_data *d, const char *what, size_t *npos,
                      rk_err *err)
{
    if (!d->x || !d->y)
        return rk_err_set(err, RK_EINVAL, "predictor: %s set has no data", what);
    if (d->n > UINT32_MAX)
        return rk_err_set(err, RK_EINVAL, "predictor: %s set has more than 2^32 windows", what);
    const size_t vals = d->n * (size_t)m->c.window * m->c.features;
    for (size_t i = 0; i < vals; i++)
        if (!isfinite(d->x[i]))
            return rk_err_set(err, RK_EINVAL, "predictor: %s window %zu has a non-finite value",
                              what, i / ((size_t)m->c.window * m->c.features));
    *npos = 0;
    for (size_t k = 0; k < d->n; k++) {
        float y = d->y[k];
        if (!isfinite(y))
            return rk_err_set(err, RK_EINVAL, "predictor: %s target %zu is not finite", what, k);
        if (m->c.task == RK_PRED_CLASSIFY) {
            if (y != 0.0f && y != 1.0f)
                return rk_err_set(err, RK_EINVAL,
                                  "predictor: %s target %zu is %g; classification needs 0 or 1",
                                  what, k, y);
            *npos += y == 1.0f;
        }
    }
    return RK_OK;
}

static int check_opts(const rk_pred_train_opts *o, rk_err *err)
{
    if (o->max_epochs < 1 || o->max_epochs > 1000000)
        return rk_err_set(err, RK_EINVAL, "predictor: max_epochs %d is not in [1, 1000000]",
                          o->max_epochs);
    if (o->batch < 1 || o->batch > 65536)
        return rk_err_set(err, RK_EINVAL, "predictor: batch %d is not in [1, 65536]", o->batch);
    if (!(o->lr > 0.0f) || !isfinite(o->lr))
        return rk_err_set(err, RK_EINVAL, "predictor: learning rate %g is not positive", o->lr);
    if (!(o->clip >= 0.0f) || !isfinite(o->clip))
        return rk_err_set(err, RK_EINVAL, "predictor: clip %g is not >= 0", o->clip);
    if (o->patience < 0)
        return rk_err_set(err, RK_EINVAL, "predictor: patience %d is negative", o->patience);
    if (!(o->input_noise >= 0.0f) || !isfinite(o->input_noise))
        return rk_err_set(err, RK_EINVAL, "predictor: input_noise %g is not >= 0", o->input_noise);
    if (!(o->level_noise >= 0.0f) || !isfinite(o->level_noise))
        return rk_err_set(err, RK_EINVAL, "predictor: level_noise %g is not >= 0", o->level_noise);
    if (!(o->weight_decay >= 0.0f) || !isfinite(o->weight_decay))
        return rk_err_set(err, RK_EINVAL, "predictor: weight_decay %g is not >= 0",
                          o->weight_decay);
    if (!(o->dropout >= 0.0f && o->dropout < 1.0f))
        return rk_err_set(err, RK_EINVAL, "predictor: dropout %g is not in [0, 1)", o->dropout);
    if (!(o->pos_weight >= 0.0f) || !isfinite(o->pos_weight))
        return rk_err_set(err, RK_EINVAL, "predictor: pos_weight %g is not >= 0", o->pos_weight);
    return RK_OK;
}

int rk_pred_train(rk_pred_model *m, const rk_pred_data *train, const rk_pred_data *val,
                  const rk_pred_train_opts *o, rk_pred_report *report, rk_err *err)
{
    const double t0 = rk_mono_s();
    rk_pred_report rep = {0};
    int rc = check_opts(o, err);
    if (rc)
        return rc;
    if (!train || train->n == 0)
        return rk_err_set(err, RK_EINVAL, "predictor: the training set is empty");
    size_t npos = 0, vpos = 0;
    if ((rc = check_data(m, train, "training", &npos, err)))
        return rc;
    const bool has_val = val && val->n > 0;
    if (has_val && (rc = check_data(m, val, "validation", &vpos, err)))
        return rc;
    float pw = 1.0f;
    if (m->c.task == RK_PRED_CLASSIFY) {
        pw = o->pos_weight;
        if (pw == 0.0f) {
            if (npos == 0 || npos == train->n)
                return rk_err_set(err, RK_EINVAL,
                                  "predictor: the training set has only %s windows; class "
                                  "weighting needs both (or an explicit pos_weight)",
                                  npos ? "positive" : "negative");
            pw = (float)((double)(train->n - npos) / (double)npos);
        }
    }
    rep.pos_weight = pw;
    if ((rc = rk_pred_fit_norm(m, train, err)))
        return rc;

    const size_t n = train->n, np = m->np;
    const int bmax = n < (size_t)o->batch ? (int)n : o->batch;
    rk_pred_ws w;
    if ((rc = rk_pred_ws_init(&w, &m->c, bmax, 1, err)))
        return rc;
    float *grad = malloc(np * sizeof *grad), *am = calloc(np, sizeof *am);
    float *av = calloc(np, sizeof *av), *best = malloc(np * sizeof *best);
    float *yb = malloc((size_t)bmax * sizeof *yb);
    uint32_t *idx = malloc(n * sizeof *idx);
    const size_t zn = (size_t)bmax * 2 * m->c.hidden;
    float *mask = o->dropout > 0.0f ? malloc(zn * sizeof *mask) : NULL;
    if (!grad || !am || !av || !best || !yb || !idx || (o->dropout > 0.0f && !mask)) {
        rc = rk_err_set(err, RK_ENOMEM, "predictor: out of memory for training");
        goto out;
    }
    memcpy(best, m->p, np * sizeof *best);

    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    double best_val = INFINITY;
    int since_best = 0;
    long step = 0;
    for (int epoch = 1; epoch <= o->max_epochs; epoch++) {
        rk_rng r, noise;
        rk_rng_derive(&r, o->seed, (uint64_t)epoch, 0);
        rk_rng_derive(&noise, o->seed, (uint64_t)epoch, 1);
        rk_rng_permutation(&r, idx, n);
        double sum = 0.0;
        for (size_t k0 = 0; k0 < n; k0 += (size_t)bmax) {
            int b = n - k0 < (size_t)bmax ? (int)(n - k0) : bmax;
            rk_pred_gather(m, &w, train->x, idx + k0, b);
            if (mask) {
                const float keep = 1.0f / (1.0f - o->dropout);
                for (size_t i = 0; i < zn; i++)
                    mask[i] = rk_rng_uniform(&noise) < o->dropout ? 0.0f : keep;
            }
            w.mask = mask;
            if (o->input_noise > 0.0f)
                for (size_t i = 0, nx = (size_t)b * m->c.window * m->c.features; i < nx; i++)
                    w.xn[i] += o->input_noise * rk_rng_normal(&noise);
            if (o->level_noise > 0.0f) /* layout [T][b][F]: one offset per window and feature */
                for (int k = 0; k < b; k++)
                    for (int j = 0; j < m->c.features; j++) {
                        float d = o->level_noise * rk_rng_normal(&noise);
                        for (int t = 0; t < m->c.window; t++)
                            w.xn[((size_t)t * b + k) * m->c.features + j] += d;
                    }
            for (int k = 0; k < b; k++)
                yb[k] = train->y[idx[k0 + k]];
            rk_pred_forward(m, &w);
            double loss = rk_pred_backward(m, &w, yb, pw, grad);
            w.mask = NULL;
            double norm2 = 0.0;
            for (size_t i = 0; i < np; i++)
                norm2 += (double)grad[i] * grad[i];
            if (!isfinite(loss) || !isfinite(norm2)) {
                memcpy(m->p, best, np * sizeof *best);
                rc = rk_err_set(err, RK_EBACKEND,
                                "predictor: the loss became non-finite in epoch %d; the model "
                                "holds the best weights so far",
                                epoch);
                goto out;
            }
            sum += loss * b;
            float scale = 1.0f;
            if (o->clip > 0.0f && norm2 > (double)o->clip * o->clip)
                scale = (float)(o->clip / sqrt(norm2));
            step++;
            const float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
            const float lr = o->lr * sqrtf(c2) / c1;
            for (size_t i = 0; i < np; i++) {
                float g = grad[i] * scale;
                am[i] = b1 * am[i] + (1.0f - b1) * g;
                av[i] = b2 * av[i] + (1.0f - b2) * g * g;
                m->p[i] -= lr * am[i] / (sqrtf(av[i]) + eps);
            }
            if (o->weight_decay > 0.0f)
                for (int k = 0; k < RK_PT_COUNT; k++)
                    if (m->t[k].ndim == 2) {
                        float *p = m->p + m->t[k].offset, d = 1.0f - o->lr * o->weight_decay;
                        for (size_t i = 0; i < m->t[k].numel; i++)
                            p[i] *= d;
                    }
        }
        rk_pred_epoch e = {epoch, sum / (double)n, NAN, rk_mono_s() - t0, false};
        if (has_val) {
            rc = o->val_score ? o->val_score(m, o->ctx, &e.val_loss, err)
                              : rk_pred_loss(m, val, pw, &e.val_loss, err);
            if (rc)
                goto out;
            e.best = e.val_loss < best_val;
        } else {
            e.best = true;
        }
        rep.epochs = epoch;
        if (e.best) {
            best_val = e.val_loss;
            rep.best_epoch = epoch;
            since_best = 0;
            memcpy(best, m->p, np * sizeof *best);
        } else {
            since_best++;
        }
        if (o->on_epoch)
            o->on_epoch(&e, o->ctx);
        if (has_val && o->patience > 0 && since_best >= o->patience)
            break;
    }
    memcpy(m->p, best, np * sizeof *best);
    rep.best_val_loss = best_val;
out:
    rep.seconds = rk_mono_s() - t0;
    if (report)
        *report = rep;
    free(grad);
    free(am);
    free(av);
    free(best);
    free(yb);
    free(idx);
    free(mask);
    w.mask = NULL;
    rk_pred_ws_free(&w);
    return rc;
}
