/*
 * Live windows for the failure predictor (predict/predict_online.h): per GPU a ring of the
 * last T feature rows (rk_fleet_features), unrolled oldest first into the model's window on
 * every new minute once full, and predicted one window at a time (rk_pred_predict).
 */
#include "predict/predict_online.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "predict/fleetdata.h"
#include "rekindle/health.h"

typedef struct gpu_win {
    float *rows;        /* T x F ring */
    int head, count;    /* next slot, rows held (<= T) */
    long minute;        /* the last minute counted, -1 none */
    rk_gpu_sample prev; /* that minute's reading */
    double prob;        /* -1 until full */
} gpu_win;

struct rk_pred_online {
    const rk_pred_model *m;
    int gpus, T;
    gpu_win *g;
    float *window; /* T x F scratch */
};

int rk_pred_online_create(rk_pred_online **out, const rk_pred_model *m, int gpus, rk_err *err)
{
    *out = NULL;
    const rk_pred_config *c = rk_pred_config_of(m);
    if (c->task != RK_PRED_CLASSIFY)
        return rk_err_set(err, RK_EINVAL,
                          "predictor: a failure model must classify; this one "
                          "is a regression model");
    if (c->features != RK_FLEET_FEATURES)
        return rk_err_set(err, RK_EINVAL,
                          "predictor: the model reads %d features per minute, "
                          "live readings give %d",
                          c->features, RK_FLEET_FEATURES);
    if (gpus < 1)
        return rk_err_set(err, RK_EINVAL, "predictor: %d GPUs", gpus);
    rk_pred_online *o = calloc(1, sizeof *o);
    if (!o)
        return rk_err_set(err, RK_ENOMEM, "predictor: out of memory");
    o->m = m;
    o->gpus = gpus;
    o->T = c->window;
    o->g = calloc((size_t)gpus, sizeof *o->g);
    o->window = malloc((size_t)o->T * RK_FLEET_FEATURES * sizeof(float));
    int ok = o->g && o->window;
    for (int i = 0; ok && i < gpus; i++) {
        o->g[i].rows = malloc((size_t)o->T * RK_FLEET_FEATURES * sizeof(float));
        o->g[i].minute = -1;
        o->g[i].prob = -1.0;
        ok = o->g[i].rows != NULL;
    }
    if (!ok) {
        rk_pred_online_free(o);
        return rk_err_set(err, RK_ENOMEM, "predictor: out of memory for %d windows", gpus);
    }
    *out = o;
    return RK_OK;
}

void rk_pred_online_free(rk_pred_online *o)
{
    if (!o)
        return;
    for (int i = 0; o->g && i < o->gpus; i++)
        free(o->g[i].rows);
    free(o->g);
    free(o->window);
    free(o);
}

int rk_pred_online_push(rk_pred_online *o, int gpu, double t_s, const rk_gpu_sample *s, rk_err *err)
{
    if (gpu < 0 || gpu >= o->gpus)
        return rk_err_set(err, RK_EINVAL, "predictor: GPU %d outside 0..%d", gpu, o->gpus - 1);
    if (!isfinite(t_s) || t_s < 0)
        return rk_err_set(err, RK_EINVAL, "predictor: reading time %g", t_s);
    gpu_win *w = &o->g[gpu];
    long minute = (long)floor(t_s / 60.0);
    if (minute < w->minute)
        return rk_err_set(err, RK_EINVAL,
                          "predictor: GPU %d: a reading of minute %ld after minute %ld", gpu,
                          minute, w->minute);
    if (rk_monitor_read_failed(s))
        return 0;  /* the read failed: no reading, nothing to count (rekindle/monitor.h) */
    if (s->lost) { /* gone: nothing to predict; a GPU that comes back starts afresh */
        w->count = w->head = 0;
        w->minute = minute;
        w->prob = -1.0;
        memset(&w->prev, 0, sizeof w->prev);
        return 0;
    }
    if (minute == w->minute)
        return 0;
    uint8_t valid[RK_FLEET_FEATURES];
    rk_fleet_features(s, w->count ? &w->prev : NULL, w->rows + (size_t)w->head * RK_FLEET_FEATURES,
                      valid);
    w->prev = *s;
    w->minute = minute;
    w->head = (w->head + 1) % o->T;
    if (w->count < o->T)
        w->count++;
    if (w->count < o->T)
        return 1;
    /* oldest first: the ring's head is the oldest row once it is full */
    for (int k = 0; k < o->T; k++)
        memcpy(o->window + (size_t)k * RK_FLEET_FEATURES,
               w->rows + (size_t)((w->head + k) % o->T) * RK_FLEET_FEATURES,
               RK_FLEET_FEATURES * sizeof(float));
    float p;
    int rc = rk_pred_predict(o->m, o->window, 1, &p, err);
    if (rc)
        return rc;
    w->prob = p;
    return 1;
}

double rk_pred_online_prob(const rk_pred_online *o, int gpu)
{
    return gpu >= 0 && gpu < o->gpus ? o->g[gpu].prob : -1.0;
}

int rk_pred_online_minutes(const rk_pred_online *o, int gpu)
{
    return gpu >= 0 && gpu < o->gpus ? o->g[gpu].count : 0;
}

double rk_pred_online_horizon_min(const rk_pred_online *o)
{
    return rk_pred_config_of(o->m)->horizon_min;
}

static int monitor_push(void *ctx, int gpu, double t_s, const rk_gpu_sample *s, double *prob,
                        rk_err *err)
{
    rk_pred_online *o = ctx;
    int rc = rk_pred_online_push(o, gpu, t_s, s, err);
    *prob = rk_pred_online_prob(o, gpu);
    return rc < 0 ? rc : RK_OK;
}

void rk_pred_online_monitor(rk_pred_online *o, rk_monitor_predictor *out)
{
    out->push = monitor_push;
    out->ctx = o;
    out->horizon_min = rk_pred_online_horizon_min(o);
}
