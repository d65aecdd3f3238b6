/*
 * The health gate of rk run (supervisor.h): reads the node's GPUs through the telemetry
 * layer (rekindle/health.h), keeps a short history per GPU for rates and dT/dt, and scores
 * them; the watch loop leaves out devices below the threshold before a launch and drains
 * them during one.
 */
#include "supervisor/supervisor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include <time.h>

#include "base/clock.h"
#include "health/sim.h"
#include "rekindle/health.h"
#include "rekindle/predict_online.h"

#define HISTORY 12

struct rk_gate {
    rk_telemetry *t;
    int n;
    rk_gpu_info *info;
    rk_gpu_sample *smp;
    rk_gpu_history *h;
    int *score;
    char (*why)[200];
    double threshold;
    /* the predictor (NULL without one) and the clock it is fed by */
    rk_pred_model *model;
    rk_pred_online *online;
    void *sim;          /* the simulator's state when the backend is "sim" and it is driven */
    double t0_real;     /* monotonic seconds at open */
    double sim_t0;      /* simulated seconds at open (the skip) */
    double time_scale;
    long minute;        /* the last minute read (driven clock) */
    uint64_t *unc;      /* uncorrectable ECC count at the previous reading */
    unsigned char *unc_seen, *fatal; /* a count to compare with; an error since the last look */
};

void rk_gate_close(rk_gate *g)
{
    if (!g)
        return;
    for (int i = 0; g->h && i < g->n; i++)
        rk_history_free(&g->h[i]);
    free(g->h);
    free(g->info);
    free(g->smp);
    free(g->score);
    free(g->why);
    rk_pred_online_free(g->online);
    rk_pred_free(g->model);
    free(g->unc);
    free(g->unc_seen);
    free(g->fatal);
    rk_telemetry_close(g->t);
    free(g);
}

int rk_gate_open(rk_gate **out, const rk_sup_opts *o, rk_err *err)
{
    *out = NULL;
    rk_gate *g = calloc(1, sizeof *g);
    if (!g)
        return rk_err_set(err, RK_ENOMEM, "health gate: out of memory");
    rk_telemetry_opts to = RK_TELEMETRY_OPTS_DEFAULT;
    to.sim_gpus = o->health_sim_gpus;
    to.seed = o->health_seed;
    to.time_scale = o->health_time_scale;
    to.start_age_h = o->health_age_h;
    g->threshold = o->health_threshold;
    int rc = rk_telemetry_open(&g->t, o->health, &to, err);
    if (rc) {
        free(g);
        return rc;
    }
    g->n = rk_telemetry_count(g->t);
    size_t n = (size_t)(g->n ? g->n : 1);
    g->info = calloc(n, sizeof *g->info);
    g->smp = calloc(n, sizeof *g->smp);
    g->h = calloc(n, sizeof *g->h);
    g->score = calloc(n, sizeof *g->score);
    g->why = calloc(n, sizeof *g->why);
    g->unc = calloc(n, sizeof *g->unc);
    g->unc_seen = calloc(n, 1);
    g->fatal = calloc(n, 1);
    if (!g->info || !g->smp || !g->h || !g->score || !g->why || !g->unc || !g->unc_seen ||
        !g->fatal) {
        rk_gate_close(g);
        return rk_err_set(err, RK_ENOMEM, "health gate: out of memory");
    }
    for (int i = 0; i < g->n; i++)
        if ((rc = rk_history_init(&g->h[i], HISTORY, err))) {
            rk_gate_close(g);
            return rc;
        }
    int sim = strcmp(rk_telemetry_backend(g->t), "sim") == 0;
    if (sim && (o->predictor || o->sim_skip_h > 0)) { /* drive the fleet's clock ourselves */
        g->sim = rk_telemetry_state(g->t);
        g->time_scale = o->health_time_scale;
        g->sim_t0 = o->sim_skip_h * 3600.0;
        g->minute = -1;
        if ((rc = rk_sim_set_time(g->sim, 0.0))) {
            rk_gate_close(g);
            return rk_err_set(err, rc, "health gate: cannot pin the simulated clock");
        }
    }
    if (o->predictor &&
        ((rc = rk_pred_load(&g->model, o->predictor, err)) ||
         (rc = rk_pred_online_create(&g->online, g->model, g->n ? g->n : 1, err)))) {
        rk_gate_close(g);
        return rc;
    }
    g->t0_real = rk_mono_s();
    *out = g;
    return RK_OK;
}

/* Remember GPU i's latest reading: an uncorrectable ECC error since the previous one is
 * fatal to the process using the GPU (a double-bit error ends its CUDA context). */
static void note(rk_gate *g, int i)
{
    const rk_gpu_sample *x = &g->smp[i];
    rk_history_push(&g->h[i], x);
    if (x->lost || !rk_field_valid(x, RK_F_ECC_UNCORRECTED))
        return;
    if (g->unc_seen[i] && x->ecc_uncorrected > g->unc[i])
        g->fatal[i] = 1;
    g->unc[i] = x->ecc_uncorrected;
    g->unc_seen[i] = 1;
}

/* Score GPU i from its history and the predictor's probability (when known). */
static void rescore(rk_gate *g, int i)
{
    rk_gpu_signals sig;
    rk_signals_compute(&g->h[i], &sig);
    double p = g->online ? rk_pred_online_prob(g->online, i) : -1.0;
    if (p >= 0) { /* the score counts a predicted failure too (docs/health.md) */
        sig.fail_prob_valid = true;
        sig.fail_prob = p;
        sig.fail_horizon_min = 60;
    }
    rk_finding f[RK_MAX_FINDINGS];
    int nf = 0;
    g->score[i] = rk_health_score(&g->smp[i], &sig, f, &nf);
    if (nf)
        snprintf(g->why[i], sizeof g->why[i], "%s: %s", f[0].code, f[0].message);
    else
        g->why[i][0] = '\0';
}

/* The driven simulator: every minute from the last one read up to now (the fleet's clock
 * started at the skip), read and fed to the history and the predictor. A gap longer than the
 * window (the skip itself) is crossed in one jump up to the minutes the window needs. */
static int sample_driven(rk_gate *g, rk_err *err)
{
    double now = g->sim_t0 + (rk_mono_s() - g->t0_real) * g->time_scale;
    long last = (long)floor(now / 60.0);
    int rc = RK_OK;
    /* only the last minutes matter to the window and the history: a longer gap (the skip)
     * is one jump, which the simulator integrates in one go */
    long keep = HISTORY + (g->online ? rk_pred_config_of(g->model)->window + 1 : 0);
    long first = g->minute + 1;
    if (last - first > keep)
        first = last - keep;
    for (long m = first; m <= last && !rc; m++) {
        if ((rc = rk_sim_set_time(g->sim, (double)m * 60.0))) {
            rk_err_set(err, rc, "health gate: the simulated clock refused minute %ld", m);
            break;
        }
        if ((rc = rk_telemetry_read_all(g->t, g->info, g->smp, err)))
            break;
        /* the window holds the last T minutes: older ones (a replayed skip) only age the
         * fleet, which saves a prediction per GPU per minute */
        int feed = g->online && m >= last - rk_pred_config_of(g->model)->window;
        for (int i = 0; i < g->n && !rc; i++) {
            note(g, i);
            if (feed && (rc = rk_pred_online_push(g->online, i, (double)m * 60.0, &g->smp[i],
                                                  err)) > 0)
                rc = RK_OK; /* a minute row added */
        }
        g->minute = m;
    }
    for (int i = 0; i < g->n; i++)
        rescore(g, i);
    return rc;
}

int rk_gate_sample(rk_gate *g, rk_err *err)
{
    if (g->sim)
        return sample_driven(g, err);
    int rc = rk_telemetry_read_all(g->t, g->info, g->smp, err);
    double t = rk_mono_s() - g->t0_real;
    for (int i = 0; i < g->n; i++) {
        note(g, i);
        if (g->online && !rc && (rc = rk_pred_online_push(g->online, i, t, &g->smp[i], err)) > 0)
            rc = RK_OK;
        rescore(g, i);
    }
    return rc;
}

/* The GPU index a device id names, or -1. */
static int index_of(const rk_gate *g, const char *id)
{
    char *end;
    errno = 0;
    long v = strtol(id, &end, 10);
    if (errno || end == id || *end || v < 0 || v >= g->n)
        return -1;
    return (int)v;
}

int rk_gate_knows(const rk_gate *g, const char *id)
{
    return index_of(g, id) >= 0;
}

int rk_gate_score(const rk_gate *g, const char *id, char *why, size_t cap)
{
    int i = index_of(g, id);
    if (why && cap)
        why[0] = '\0';
    if (i < 0)
        return -1;
    if (why && cap)
        snprintf(why, cap, "%s", g->why[i]);
    return g->score[i];
}

double rk_gate_prob(const rk_gate *g, const char *id)
{
    int i = index_of(g, id);
    return i >= 0 && g->online ? rk_pred_online_prob(g->online, i) : -1.0;
}

int rk_gate_lost(const rk_gate *g, const char *id)
{
    int i = index_of(g, id);
    return i >= 0 && g->smp[i].lost;
}

int rk_gate_take_fatal(rk_gate *g, const char *id)
{
    int i = index_of(g, id);
    if (i < 0)
        return 0;
    int f = g->fatal[i] || g->smp[i].lost;
    g->fatal[i] = 0;
    return f;
}

const char *rk_gate_backend(const rk_gate *g)
{
    return rk_telemetry_backend(g->t);
}
