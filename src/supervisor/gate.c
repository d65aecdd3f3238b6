/*
 * The health gate of rk run (supervisor.h): reads the node's GPUs through the health
 * monitor (rekindle/monitor.h: history, signals, the predictor's probability, score), and
 * notes uncorrectable errors; the watch loop leaves out devices below the threshold before a
 * launch and drains them during one.
 */
#include "supervisor/supervisor.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "health/sim.h"
#include "predict/predict_online.h"
#include "rekindle/health.h"
#include "rekindle/monitor.h"

#define HISTORY 12

struct rk_gate {
    rk_telemetry *t;
    int n;
    rk_monitor *mon; /* history, signals, probability and score of every GPU */
    double threshold;
    /* the predictor (NULL without one) */
    rk_pred_model *model;
    rk_pred_online *online;
    rk_sim *sim;    /* the simulator when the backend is "sim" and the gate drives it */
    double t0_real; /* monotonic seconds at open */
    double sim_t0;  /* simulated seconds at open (the skip) */
    double time_scale;
    double step_s;     /* > 0: the fleet ages step_s simulated seconds a step of the job */
    int64_t progress;  /* steps the job has done (rk_gate_set_progress) */
    int64_t step_read; /* the last step whose minute was read (step clock) */
    long minute;       /* the last minute read (driven clock) */
    /* the worst of the readings since rk_gate_take_worst, per GPU */
    int *worst_score; /* -1: none since */
    double *worst_prob;
    char (*worst_why)[200];
    uint64_t *unc;                   /* uncorrectable ECC count at the previous reading */
    unsigned char *unc_seen, *fatal; /* a count to compare with; an error since the last look */
};

void rk_gate_close(rk_gate *g)
{
    if (!g)
        return;
    rk_monitor_free(g->mon);
    rk_pred_online_free(g->online);
    rk_pred_free(g->model);
    free(g->unc);
    free(g->worst_score);
    free(g->worst_prob);
    free(g->worst_why);
    free(g->unc_seen);
    free(g->fatal);
    rk_telemetry_close(g->t);
    free(g);
}

int rk_gate_open(rk_gate **out, const rk_sup_opts *o, rk_err *err)
{
    *out = NULL;
    rk_telemetry_opts to = RK_TELEMETRY_OPTS_DEFAULT;
    to.sim_gpus = o->health_sim_gpus;
    to.seed = o->health_seed;
    to.time_scale = o->health_time_scale;
    to.start_age_h = o->health_age_h;
    to.sim_load = o->health_sim_load;
    to.sim_sensors = o->health_sim_sensors;
    rk_telemetry *t = NULL;
    int rc = rk_telemetry_open(&t, o->health, &to, err);
    return rc ? rc : rk_gate_open_telemetry(out, t, o, err);
}

int rk_gate_open_telemetry(rk_gate **out, rk_telemetry *t, const rk_sup_opts *o, rk_err *err)
{
    *out = NULL;
    rk_gate *g = calloc(1, sizeof *g);
    if (!g) {
        rk_telemetry_close(t);
        return rk_err_set(err, RK_ENOMEM, "health gate: out of memory");
    }
    g->t = t;
    g->threshold = o->health_threshold;
    g->n = rk_telemetry_count(g->t);
    size_t n = (size_t)(g->n ? g->n : 1);
    g->unc = calloc(n, sizeof *g->unc);
    g->unc_seen = calloc(n, 1);
    g->fatal = calloc(n, 1);
    g->worst_score = malloc(n * sizeof *g->worst_score);
    g->worst_prob = malloc(n * sizeof *g->worst_prob);
    g->worst_why = calloc(n, sizeof *g->worst_why);
    if (!g->unc || !g->unc_seen || !g->fatal || !g->worst_score || !g->worst_prob ||
        !g->worst_why) {
        rk_gate_close(g);
        return rk_err_set(err, RK_ENOMEM, "health gate: out of memory");
    }
    for (size_t i = 0; i < n; i++)
        g->worst_score[i] = -1, g->worst_prob[i] = -1.0;
    int rc;
    rk_sim *sim = rk_telemetry_sim_of(g->t);
    if (sim && (o->predictor || o->sim_skip_h > 0 || o->sim_step_s > 0)) { /* drive its clock */
        g->sim = sim;
        g->time_scale = o->health_time_scale;
        g->step_s = o->sim_step_s > 0 ? o->sim_step_s : 0;
        g->sim_t0 = o->sim_skip_h * 3600.0;
        g->minute = -1;
        g->step_read = -1;
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
    rk_monitor_predictor pred;
    rk_monitor_opts mo = RK_MONITOR_OPTS_DEFAULT;
    mo.history = HISTORY;
    if (g->online) {
        rk_pred_online_monitor(g->online, &pred);
        mo.predictor = &pred;
    }
    if ((rc = rk_monitor_create(&g->mon, g->n, &mo, err))) {
        rk_gate_close(g);
        return rc;
    }
    g->t0_real = rk_mono_s();
    *out = g;
    return RK_OK;
}

/* After a reading: an uncorrectable ECC error since the previous one is fatal to the process
 * using the GPU (a double-bit error ends its CUDA context). A failed reading changes nothing
 * (the monitor's latest reading is still the previous one). */
static void note(rk_gate *g, int i)
{
    const rk_monitor_gpu *m = rk_monitor_gpu_state(g->mon, i);
    if (m->has_score && (g->worst_score[i] < 0 || m->score < g->worst_score[i])) {
        g->worst_score[i] = m->score;
        g->worst_why[i][0] = '\0';
        if (m->nfindings)
            snprintf(g->worst_why[i], sizeof g->worst_why[i], "%s: %s", m->findings[0].code,
                     m->findings[0].message);
    }
    if (m->prob > g->worst_prob[i])
        g->worst_prob[i] = m->prob;
    const rk_gpu_sample *x = &m->latest;
    if (x->lost || !rk_field_valid(x, RK_F_ECC_UNCORRECTED))
        return;
    if (g->unc_seen[i] && x->ecc_uncorrected > g->unc[i])
        g->fatal[i] = 1;
    g->unc[i] = x->ecc_uncorrected;
    g->unc_seen[i] = 1;
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

/* Read minute m of the driven simulator and feed it to the monitor. */
static int read_minute(rk_gate *g, long m, rk_err *err)
{
    int rc = rk_sim_set_time(g->sim, (double)m * 60.0);
    if (rc)
        return rk_err_set(err, rc, "health gate: the simulated clock refused minute %ld", m);
    rc = rk_monitor_read(g->mon, g->t, err);
    for (int i = 0; i < g->n; i++)
        note(g, i);
    g->minute = m;
    return rc;
}

/* Minutes `last - keep .. last` not read yet (a longer gap is crossed in one jump: the
 * simulator integrates it in one go, and only the last minutes matter to the window and the
 * history). */
static int read_up_to(rk_gate *g, long last, long keep, rk_err *err)
{
    long first = g->minute + 1;
    if (last - first > keep)
        first = last - keep;
    int rc = RK_OK;
    for (long m = first; m <= last && !rc; m++)
        rc = read_minute(g, m, err);
    return rc;
}

/* The steps beyond which one sample stops reading each step's minute and jumps to the last
 * (a job that reports a step far ahead costs one jump, not a read for each step). */
#define STEP_JUMP 100000

/* The driven simulator. On the wall clock: every minute from the last one read up to now
 * (the fleet's clock started at the skip). On the step clock: the minute of each step the job
 * has done since the last sample (skip + step * step_s), each with the minutes before it the
 * predictor's window and the history need; the readings depend on the job's steps alone,
 * not on when the samples happen, so the same seed tells the same story on any machine. */
static int sample_driven(rk_gate *g, rk_err *err)
{
    long keep = HISTORY + (g->online ? rk_pred_config_of(g->model)->window + 1 : 0);
    if (g->step_s <= 0) {
        double now = g->sim_t0 + (rk_mono_s() - g->t0_real) * g->time_scale;
        return read_up_to(g, (long)floor(now / 60.0), keep, err);
    }
    int64_t s = g->step_read + 1;
    if (g->progress - s > STEP_JUMP)
        s = g->progress;
    int rc = RK_OK;
    for (; s <= g->progress && !rc; s++) {
        double t = g->sim_t0 + (double)s * g->step_s;
        long m = t < 9e15 ? (long)floor(t / 60.0) : (long)15e13;
        if (m > g->minute)
            rc = read_up_to(g, m, g->online ? keep : 0, err);
        g->step_read = s;
    }
    return rc;
}

void rk_gate_set_progress(rk_gate *g, int64_t steps)
{
    if (steps > g->progress)
        g->progress = steps;
}

int rk_gate_take_worst(rk_gate *g, const char *id, int *score, double *prob, char *why, size_t cap)
{
    int i = index_of(g, id);
    if (why && cap)
        why[0] = '\0';
    if (i < 0)
        return -1;
    if (g->worst_score[i] < 0) { /* no reading since the last look: the latest */
        *score = rk_gate_score(g, id, why, cap);
        *prob = rk_gate_prob(g, id);
    } else {
        *score = g->worst_score[i];
        *prob = g->worst_prob[i];
        if (why && cap)
            snprintf(why, cap, "%s", g->worst_why[i]);
    }
    g->worst_score[i] = -1;
    g->worst_prob[i] = -1.0;
    return 0;
}

int rk_gate_sample(rk_gate *g, rk_err *err)
{
    if (g->sim)
        return sample_driven(g, err);
    int rc = rk_monitor_read(g->mon, g->t, err);
    for (int i = 0; i < g->n; i++)
        note(g, i);
    return rc;
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
    const rk_monitor_gpu *m = rk_monitor_gpu_state(g->mon, i);
    if (!m->has_score) { /* never read: nothing says it is sound */
        if (why && cap)
            snprintf(why, cap, "unreadable: no reading of the GPU has succeeded");
        return 0;
    }
    if (why && cap && m->nfindings)
        snprintf(why, cap, "%s: %s", m->findings[0].code, m->findings[0].message);
    return m->score;
}

double rk_gate_prob(const rk_gate *g, const char *id)
{
    int i = index_of(g, id);
    return i >= 0 ? rk_monitor_gpu_state(g->mon, i)->prob : -1.0;
}

int rk_gate_lost(const rk_gate *g, const char *id)
{
    int i = index_of(g, id);
    return i >= 0 && rk_monitor_gpu_state(g->mon, i)->latest.lost;
}

double rk_gate_temperature(const rk_gate *g, const char *id)
{
    int i = index_of(g, id);
    if (i < 0)
        return NAN;
    const rk_gpu_sample *x = &rk_monitor_gpu_state(g->mon, i)->latest;
    return !x->lost && rk_field_valid(x, RK_F_TEMP) ? x->temp_c : NAN;
}

int rk_gate_take_fatal(rk_gate *g, const char *id)
{
    int i = index_of(g, id);
    if (i < 0)
        return 0;
    int f = g->fatal[i] || rk_monitor_gpu_state(g->mon, i)->latest.lost;
    g->fatal[i] = 0;
    return f;
}

const char *rk_gate_backend(const rk_gate *g)
{
    return rk_telemetry_backend(g->t);
}

rk_sup_health rk_gate_reading(rk_gate *g, const char *id, int worst, char *why, size_t cap)
{
    rk_sup_health h = {.lost = 0, .fatal = 0, .score = 100, .prob = -1.0};
    h.lost = rk_gate_lost(g, id);
    if (worst) {
        rk_gate_take_worst(g, id, &h.score, &h.prob, why, cap);
    } else {
        h.score = rk_gate_score(g, id, why, cap);
        h.prob = rk_gate_prob(g, id);
    }
    return h;
}
