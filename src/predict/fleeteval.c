/*
 * Judging failure detectors on fleet datasets (predict/fleeteval.h): risks of the predictor
 * (predict/predict.h), the logistic baseline (predict/logreg.h) and the health score, the
 * event-level evaluation and the choice of thresholds.
 */
#include "predict/fleeteval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "predict/windows.h"

#define F RK_FLEET_FEATURES

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

void rk_fleet_prob_candidates(double *c)
{
    for (int k = 0; k < RK_FLEET_PROB_CANDS; k++)
        c[k] = 1.0 / (1.0 + exp(-(-6.0 + 0.1 * k)));
}

/* "alarm when the score is below s": risk (100 - score) >= 100.5 - s */
double rk_fleet_score_threshold(int below)
{
    return 100.5 - below;
}

json_t *rk_fleet_metrics_json(const rk_fleet_metrics *m)
{
    json_t *j = json_object();
    json_object_set_new(j, "threshold", json_real(m->threshold));
    json_object_set_new(j, "precision", json_real(m->precision));
    json_object_set_new(j, "recall", json_real(m->recall));
    json_object_set_new(j, "f1", json_real(m->f1));
    json_object_set_new(j, "lead_mean_min", json_real(m->lead_mean));
    json_object_set_new(j, "lead_median_min", json_real(m->lead_median));
    json_object_set_new(j, "false_alarms_per_gpu_day", json_real(m->false_alarms_per_gpu_day));
    json_object_set_new(j, "accuracy", json_real(m->accuracy));
    json_object_set_new(j, "failures", json_integer(m->failures));
    json_object_set_new(j, "detected", json_integer(m->detected));
    json_object_set_new(j, "false_alarms", json_integer(m->false_alarms));
    json_object_set_new(j, "early_alarms", json_integer(m->early_alarms));
    json_object_set_new(j, "silent", json_integer(m->silent));
    json_object_set_new(j, "silent_detected", json_integer(m->silent_detected));
    return j;
}
