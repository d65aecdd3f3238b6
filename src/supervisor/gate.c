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

#include "rekindle/health.h"

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
    if (!g->info || !g->smp || !g->h || !g->score || !g->why) {
        rk_gate_close(g);
        return rk_err_set(err, RK_ENOMEM, "health gate: out of memory");
    }
    for (int i = 0; i < g->n; i++)
        if ((rc = rk_history_init(&g->h[i], HISTORY, err))) {
            rk_gate_close(g);
            return rc;
        }
    *out = g;
    return RK_OK;
}

int rk_gate_sample(rk_gate *g, rk_err *err)
{
    int rc = rk_telemetry_read_all(g->t, g->info, g->smp, err);
    for (int i = 0; i < g->n; i++) {
        rk_history_push(&g->h[i], &g->smp[i]);
        rk_gpu_signals sig;
        rk_signals_compute(&g->h[i], &sig);
        rk_finding f[RK_MAX_FINDINGS];
        int nf = 0;
        g->score[i] = rk_health_score(&g->smp[i], &sig, f, &nf);
        if (nf)
            snprintf(g->why[i], sizeof g->why[i], "%s: %s", f[0].code, f[0].message);
        else
            g->why[i][0] = '\0';
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

const char *rk_gate_backend(const rk_gate *g)
{
    return rk_telemetry_backend(g->t);
}
