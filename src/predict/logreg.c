/*
 * The logistic-regression baseline (predict/logreg.h): standardisation, Adam with early
 * stopping, batches drawn with the seeded permutations of rekindle/rng.h.
 */
#include "predict/logreg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/rng.h"

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
