/*
 * The devices of a job (sup.h): which ones each launch runs on, the quarantine of one that
 * keeps failing, and the health gate's readings during a run, with the one drain (checkpoint,
 * stop, relaunch without the device). What to do is policy.h's; this reads the gate
 * (supervisor.h), writes the ledger and talks to the ranks.
 */
#include "supervisor/sup.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void sup_record(sup *s, const char *kind, int rank, const char *device, const char *action,
                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rk_incident *i = rk_ledger_addv(&s->g, kind, rank, device, action, fmt, ap);
    va_end(ap);
    if (i) {
        i->lost_steps = 0;
        rk_ledger_write(&s->g, i);
    }
}

void sup_quarantine_device(sup *s, int d)
{
    if (s->devs[d].quarantined)
        return;
    s->devs[d].quarantined = 1;
    s->g.quarantined++; /* the summary's count: a node's devices go with it */
}

int64_t sup_steps_done(const sup *s)
{
    return s->g.first_step >= 0 && s->last_done > s->g.first_step ? s->last_done - s->g.first_step
                                                                  : 0;
}

int64_t sup_step_now(const sup *s)
{
    return s->g.first_step >= 0 ? s->last_done : -1;
}

/* 1 if the backend reads the devices' health (the agents over the hosts, with --health). */
static int remote_health(const sup *s)
{
    return s->b.ops->health && s->o->health;
}

/* 1 if device d's host is down or quarantined (over the hosts). */
static int node_down(const sup *s, int d)
{
    return s->b.ops->node_up && !s->b.ops->node_up(s->b.ctx, d);
}

/* 1 if device d's last reading came from a simulated GPU, as the backend's host read it. */
static int remote_sim(const sup *s, int d)
{
    return s->b.ops->health_sim && s->b.ops->health_sim(s->b.ctx, d);
}

void sup_count_failure(sup *s, int rank, const char *why)
{
    if (rank < 0 || rank >= s->n)
        return;
    int d = s->dev[rank];
    if (!rk_sup_count_failure(&s->devs[d], s->o->failure_threshold))
        return;
    s->g.quarantined++;
    sup_record(s, "quarantine", rank, s->o->devices[d], "quarantine",
               "device %s failed %d times (last: %s); set aside", s->o->devices[d],
               s->devs[d].fails, why);
    sup_say(s, "device %s quarantined after %d failures (last: %s)", s->o->devices[d],
            s->devs[d].fails, why);
    if (rk_sup_shrink_now(sup_failing(s),
                          sup_stop_sent(s))) /* the job is healthy: stop it cleanly */
        sup_stop_job(s);
}

void sup_count_recorded(sup *s)
{
    for (int r = 0; r < s->n && r < RK_SUP_MAX_DEVICES; r++)
        for (; s->to_count[r] > 0; s->to_count[r]--)
            sup_count_failure(s, r, s->count_kind[r]);
}

static int is_sim(const sup *s)
{
    return s->gate && strcmp(rk_gate_backend(s->gate), "sim") == 0;
}

/* What the gate read for device d (over the hosts: what its agent read; no gate: a sound
 * device): the latest reading, or with `worst` the worst since the last such look (every
 * reading counts, however many a sample took: rk_gate_take_worst). */
static rk_sup_health reading(sup *s, int d, int worst, char *why, size_t cap)
{
    rk_sup_health h = {.lost = 0, .fatal = 0, .score = 100, .prob = -1.0};
    why[0] = '\0';
    if ((remote_health(s) && s->b.ops->health(s->b.ctx, d, worst, &h, why, cap)) || !s->gate)
        return h;
    return rk_gate_reading(s->gate, s->o->devices[d], worst, why, cap);
}

/* The gate's reading of every device into the gate file (--gate-log). */
static void record_reading(sup *s)
{
    const rk_sup_opts *o = s->o;
    if (!s->g.gatelog || (!s->gate && !remote_health(s)))
        return;
    static rk_runlog_rec rec[RK_SUP_MAX_DEVICES];
    int n = 0;
    for (int d = 0; d < o->ndevices && d < RK_SUP_MAX_DEVICES; d++) {
        char why[200];
        rk_sup_health h = reading(s, d, 0, why, sizeof why);
        rk_runlog_rec *r = &rec[n];
        rk_runlog_init(r, RK_RUNLOG_GATE);
        snprintf(r->device, sizeof r->device, "%s", o->devices[d]);
        r->score = h.score < 0 ? 0 : h.score > 100 ? 100 : h.score;
        r->lost = h.lost != 0;
        r->temperature_c = s->gate ? rk_gate_temperature(s->gate, o->devices[d]) : NAN;
        r->simulated = is_sim(s) || remote_sim(s, d);
        r->threshold = s->rules.threshold;
        if (r->device[0] && strlen(o->devices[d]) < sizeof r->device)
            n++;
    }
    rk_ledger_gate_rec(&s->g, rec, n);
}

static void sample(sup *s)
{
    rk_err err = {0};
    if (s->gate && s->g.first_step >= 0 && s->last_done > s->g.first_step)
        rk_gate_set_progress(s->gate, s->last_done - s->g.first_step);
    if (s->gate && rk_gate_sample(s->gate, &err))
        sup_say(s, "health gate: %s", err.msg);
    s->last_gate = rk_ledger_now(&s->g);
    record_reading(s);
}

/* Pick the devices of the next launch: the first n that are not quarantined and, with the
 * health gate, score at least the threshold now (a GPU left out may come back later). */
int sup_pick_devices(sup *s)
{
    const rk_sup_opts *o = s->o;
    sample(s);
    rk_sup_health h[RK_SUP_MAX_DEVICES];
    char why[RK_SUP_MAX_DEVICES][200];
    rk_sup_pick pick[RK_SUP_MAX_DEVICES];
    for (int d = 0; d < o->ndevices; d++) {
        h[d] = reading(s, d, 0, why[d], sizeof why[d]);
        char drop[8];
        if (s->gate && rk_gate_knows(s->gate, o->devices[d])) /* a launch starts afresh */
            rk_gate_take_worst(s->gate, o->devices[d], &(int){0}, &(double){0}, drop, 0);
        if (node_down(s, d)) { /* its host is down or quarantined */
            h[d].lost = 1;
            snprintf(why[d], sizeof why[d], "node %s is not connected",
                     s->b.ops->node_name(s->b.ctx, d));
        }
    }
    /* across hosts: each device's node, so that a node's ranks stay consecutive */
    int group[RK_SUP_MAX_DEVICES], *grp = NULL;
    if (s->b.ops->node_name) {
        grp = group;
        for (int d = 0; d < o->ndevices; d++) {
            const char *nd = s->b.ops->node_name(s->b.ctx, d);
            group[d] = d;
            for (int e = 0; e < d && nd; e++)
                if (group[e] == e && s->b.ops->node_name(s->b.ctx, e) &&
                    !strcmp(s->b.ops->node_name(s->b.ctx, e), nd)) {
                    group[d] = e;
                    break;
                }
        }
    }
    int prev[RK_SUP_MAX_DEVICES], nprev = s->n; /* the last launch's placement */
    memcpy(prev, s->dev, (size_t)nprev * sizeof prev[0]);
    s->n = rk_sup_pick_devices(&s->rules, o->ndevices, h, s->devs, o->n, prev, nprev, grp, s->dev,
                               pick);
    for (int d = 0; d < o->ndevices; d++) {
        const char *id = o->devices[d];
        const char *w = why[d][0] ? why[d] : "below the margin to come back";
        switch (pick[d].why) {
        case RK_SUP_OUT_LOST:
            if (node_down(s, d))
                break; /* said once per node, not per device */
            sup_say(s, "health gate: device %s left out of this launch: the GPU is gone%s", id,
                    is_sim(s) || remote_sim(s, d) ? " (simulated)" : "");
            break;
        case RK_SUP_OUT_SCORE:
            sup_record(s, "health_gate", -1, id, "left_out", "score %d below %.0f: %s", h[d].score,
                       pick[d].need, w);
            sup_say(s, "health gate: device %s left out of this launch: score %d (%s)", id,
                    h[d].score, w);
            break;
        case RK_SUP_OUT_PREDICTED:
            sup_record(s, "predicted_failure", -1, id, "left_out",
                       "the predictor gives p=%.2f of failing within its horizon", h[d].prob);
            sup_say(s,
                    "health gate: device %s left out of this launch: predicted to fail "
                    "(p=%.2f)",
                    id, h[d].prob);
            break;
        case RK_SUP_IN:
        case RK_SUP_OUT_QUARANTINED:
        case RK_SUP_OUT_DRAINED:
        case RK_SUP_NOT_NEEDED: break;
        }
    }
    return s->n;
}

/* The drain: rank r's device is out for the rest of the job; the incident says why, and the
 * ranks are asked to checkpoint and stop (the relaunch runs without it). */
static void drain(sup *s, int r, rk_sup_why why, const rk_sup_health *h, const char *text)
{
    const char *id = sup_devname(s, r);
    if (why == RK_SUP_OUT_PREDICTED) {
        sup_record(s, "predicted_failure", r, id, "drain",
                   "the predictor gives p=%.2f of failing within its horizon at step %lld: "
                   "checkpoint, relaunch without it",
                   h->prob, (long long)s->last_done);
        sup_say(s, "health gate: draining device %s (rank %d): predicted to fail (p=%.2f)", id, r,
                h->prob);
    } else {
        sup_record(s, "health_drain", r, id, "drain", "score %d fell below %.0f at step %lld: %s",
                   h->score, s->rules.threshold, (long long)s->last_done, text);
        sup_say(s, "health gate: draining device %s (rank %d): score %d (%s)", id, r, h->score,
                text);
    }
    s->devs[s->dev[r]].drained = 1;
    sup_stop_job(s);
}

/* A simulated GPU that fails (off the bus, an uncorrectable ECC error) takes its rank down,
 * as a real one would (a real GPU's failure reaches its process without our help). Returns
 * 1 if a rank was killed. */
static int deliver_sim_failures(sup *s)
{
    int killed = 0;
    for (int r = 0; r < s->n; r++) {
        if (!rk_gate_take_fatal(s->gate, sup_devname(s, r)))
            continue;
        for (int k = 0; k < s->nconn; k++)
            if (s->c[k].rank == r && s->c[k].pid > 1 && !sup_conn_left(&s->c[k]) &&
                s->c[k].node < 0 &&
                rk_launch_owns(&s->l, (pid_t)s->c[k].pid)) { /* only a rank of ours */
                sup_say(s,
                        "simulated GPU %s failed (%s): killing rank %d (pid %ld), as the "
                        "failure would",
                        sup_devname(s, r),
                        rk_gate_lost(s->gate, sup_devname(s, r)) ? "off the bus"
                                                                 : "uncorrectable ECC error",
                        r, s->c[k].pid);
                kill((pid_t)s->c[k].pid, SIGKILL);
                killed = 1;
            }
    }
    return killed;
}

/* During a run: read the GPUs every --health-interval; drain a device of this launch whose
 * score fell below the threshold or that the predictor expects to fail. */
void sup_gate_tick(sup *s)
{
    double now = rk_ledger_now(&s->g);
    if (!rk_sup_gate_due(s->gate != NULL || remote_health(s), sup_failing(s), sup_stop_sent(s),
                         sup_hellos(s), s->n, now, s->last_gate, s->o->health_interval_s))
        return;
    sample(s);
    if (is_sim(s) && deliver_sim_failures(s))
        return; /* the crash is classified by the watch loop */
    rk_sup_health h[RK_SUP_MAX_DEVICES];
    char why[RK_SUP_MAX_DEVICES][200];
    for (int r = 0; r < s->n; r++)
        h[r] = reading(s, s->dev[r], 1, why[r], sizeof why[r]);
    rk_sup_why reason;
    int r = rk_sup_drain_rank(&s->rules, s->n, h, &reason);
    if (r >= 0)
        drain(s, r, reason, &h[r], why[r]);
}
