/*
 * The health monitor (rekindle/monitor.h): per GPU a history of readings, the signals over
 * it, the predictor's probability checked to [0, 1], and the score with findings. The rule
 * for failed readings and the check of probabilities live here and nowhere else. Each
 * rk_monitor_read also looks at the burn-in state file (health/burnstate.h) and gives every
 * GPU its last burn verdict, by serial, else UUID.
 */
#include "rekindle/monitor.h"

#include "health/burnstate.h"

#include <sys/stat.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MONITOR_MAX_GPUS 1024

typedef struct mon_gpu {
    rk_gpu_history h;
    rk_monitor_gpu st;
    bool has_burn;
    rk_burn_record burn; /* its last burn-in, when has_burn */
} mon_gpu;

struct rk_monitor {
    int n;
    bool has_pred;
    rk_monitor_predictor pred;
    mon_gpu *g;
    rk_gpu_info *infos;     /* of the last rk_monitor_read */
    rk_gpu_sample *samples; /* its scratch */
    rk_burn_state *burn;    /* the state file as last loaded; NULL: none or bad */
    bool burn_seen;         /* burn_st is of a file that was looked at */
    struct stat burn_st;    /* the file loaded (or refused) last */
};

bool rk_monitor_read_failed(const rk_gpu_sample *s)
{
    return !s->lost && s->valid == 0;
}

void rk_monitor_free(rk_monitor *m)
{
    if (!m)
        return;
    for (int i = 0; m->g && i < m->n; i++)
        rk_history_free(&m->g[i].h);
    free(m->g);
    free(m->infos);
    free(m->samples);
    rk_burn_state_free(m->burn);
    free(m);
}

int rk_monitor_create(rk_monitor **out, int gpus, const rk_monitor_opts *o, rk_err *err)
{
    *out = NULL;
    rk_monitor_opts def = RK_MONITOR_OPTS_DEFAULT;
    if (!o)
        o = &def;
    if (gpus < 0 || gpus > MONITOR_MAX_GPUS)
        return rk_err_set(err, RK_EINVAL, "monitor: %d GPUs (0..%d)", gpus, MONITOR_MAX_GPUS);
    if (o->history < 2 || o->history > 1 << 20)
        return rk_err_set(err, RK_EINVAL, "monitor: a history of %d readings (2..%d)", o->history,
                          1 << 20);
    if (o->predictor && (!o->predictor->push || !(o->predictor->horizon_min >= 0) ||
                         !isfinite(o->predictor->horizon_min)))
        return rk_err_set(err, RK_EINVAL,
                          "monitor: a predictor without push or with a horizon of %g minutes",
                          o->predictor->horizon_min);
    rk_monitor *m = calloc(1, sizeof *m);
    if (!m)
        return rk_err_set(err, RK_ENOMEM, "monitor: out of memory");
    m->n = gpus;
    if (o->predictor) {
        m->has_pred = true;
        m->pred = *o->predictor;
    }
    size_t cap = (size_t)(gpus ? gpus : 1);
    m->g = calloc(cap, sizeof *m->g);
    m->infos = calloc(cap, sizeof *m->infos);
    m->samples = calloc(cap, sizeof *m->samples);
    if (!m->g || !m->infos || !m->samples) {
        rk_monitor_free(m);
        return rk_err_set(err, RK_ENOMEM, "monitor: out of memory for %d GPUs", gpus);
    }
    for (int i = 0; i < gpus; i++) {
        int rc = rk_history_init(&m->g[i].h, o->history, err);
        if (rc) {
            rk_monitor_free(m);
            return rc;
        }
        m->g[i].st.prob = -1.0;
        m->g[i].st.horizon_min = m->has_pred ? m->pred.horizon_min : 0;
    }
    *out = m;
    return RK_OK;
}

int rk_monitor_gpus(const rk_monitor *m)
{
    return m->n;
}

/* The score of GPU i from its history, latest reading and probability; info (may be NULL)
 * fits the advice to what the card allows. */
static void rescore(mon_gpu *g, const rk_gpu_info *info)
{
    rk_monitor_gpu *st = &g->st;
    rk_signals_compute(&g->h, &st->sig);
    if (st->prob >= 0) { /* the score counts a predicted failure too (docs/health.md) */
        st->sig.fail_prob_valid = true;
        st->sig.fail_prob = st->prob;
        st->sig.fail_horizon_min = st->horizon_min;
    }
    if (g->has_burn) { /* the last burn-in's verdict (docs/burn.md) */
        st->sig.burn_valid = true;
        st->sig.burn_ok = g->burn.ok;
        st->sig.burn_when = g->burn.when;
        snprintf(st->sig.burn_failed, sizeof st->sig.burn_failed, "%s", g->burn.failed);
    }
    int nf = 0;
    st->score = rk_health_score_gpu(info, &st->latest, &st->sig, st->findings, &nf);
    st->nfindings = nf < 0 ? 0 : nf > RK_MAX_FINDINGS ? RK_MAX_FINDINGS : nf;
    st->has_score = true;
}

int rk_monitor_push(rk_monitor *m, int gpu, double t_s, const rk_gpu_sample *s, rk_err *err)
{
    if (gpu < 0 || gpu >= m->n)
        return rk_err_set(err, RK_EINVAL, "monitor: GPU %d outside 0..%d", gpu, m->n - 1);
    mon_gpu *g = &m->g[gpu];
    if (rk_monitor_read_failed(s)) { /* no reading: everything stays as it was */
        g->st.current = false;
        g->st.failed_reads++;
        return RK_OK;
    }
    g->st.read = g->st.current = true;
    g->st.failed_reads = 0;
    g->st.readings++;
    g->st.latest = *s;
    rk_history_push(&g->h, s);
    int rc = RK_OK;
    if (m->has_pred) {
        double p = -1.0;
        rc = m->pred.push(m->pred.ctx, gpu, t_s, s, &p, err);
        /* the one check of a probability: finite and in [0, 1], else none */
        g->st.prob = isfinite(p) && p >= 0.0 && p <= 1.0 ? p : -1.0;
    }
    rescore(g, &m->infos[gpu]);
    return rc;
}

/* Load the burn state file again when it changed (inode, size or mtime). A missing file is no
 * records; one that does not load is no records and an RK_EFORMAT/RK_EINVAL warning, returned
 * once per version of the file. */
static int burn_refresh(rk_monitor *m, rk_err *err)
{
    const char *path = rk_burn_state_path();
    struct stat st;
    if (stat(path, &st) != 0) {
        rk_burn_state_free(m->burn);
        m->burn = NULL;
        m->burn_seen = false;
        return RK_OK;
    }
    if (m->burn_seen && st.st_ino == m->burn_st.st_ino && st.st_dev == m->burn_st.st_dev &&
        st.st_size == m->burn_st.st_size && st.st_mtim.tv_sec == m->burn_st.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == m->burn_st.st_mtim.tv_nsec)
        return RK_OK;
    m->burn_seen = true;
    m->burn_st = st;
    rk_burn_state_free(m->burn);
    m->burn = NULL;
    rk_err e = {0};
    int rc = rk_burn_state_load(path, &m->burn, &e);
    if (rc)
        return rk_err_set(err, rc, "warning: burn verdicts not used: %s", e.msg);
    return RK_OK;
}

int rk_monitor_read(rk_monitor *m, rk_telemetry *t, rk_err *err)
{
    int n = rk_telemetry_count(t);
    if (n != m->n)
        return rk_err_set(err, RK_EINVAL, "monitor: %d GPUs, the backend has %d", m->n, n);
    rk_err e = {0};
    int first = rk_telemetry_read_all(t, m->infos, m->samples, &e);
    if (first && err)
        *err = e;
    int brc = burn_refresh(m, &e);
    if (brc && !first) {
        first = brc;
        if (err)
            *err = e;
    }
    for (int i = 0; i < n; i++) {
        const rk_burn_record *r = rk_burn_state_find(m->burn, m->infos[i].serial, m->infos[i].uuid);
        m->g[i].has_burn = r != NULL;
        if (r)
            m->g[i].burn = *r;
    }
    double now = rk_telemetry_now(t);
    for (int i = 0; i < n; i++) {
        int rc = rk_monitor_push(m, i, now, &m->samples[i], &e);
        if (rc && !first) {
            first = rc;
            if (err)
                *err = e;
        }
    }
    return first;
}

static void nap(double s)
{
    if (!(s > 0))
        return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int rk_monitor_sample(rk_monitor *m, rk_telemetry *t, int k, double interval_s, rk_err *err)
{
    int first = RK_OK;
    rk_err e = {0};
    for (int c = 0; c < k; c++) {
        if (c)
            nap(interval_s);
        int rc = rk_monitor_read(m, t, &e);
        if (rc && !first) {
            first = rc;
            if (err)
                *err = e;
        }
    }
    return first;
}

const rk_monitor_gpu *rk_monitor_gpu_state(const rk_monitor *m, int gpu)
{
    return gpu >= 0 && gpu < m->n ? &m->g[gpu].st : NULL;
}

const rk_gpu_info *rk_monitor_info(const rk_monitor *m, int gpu)
{
    return gpu >= 0 && gpu < m->n ? &m->infos[gpu] : NULL;
}
