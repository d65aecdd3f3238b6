/*
 * rk plan's discrete-event simulator (plan.h, docs/plan.md): one job through failures,
 * detection, restarts, saves, spares and repairs. Next failures of every GPU and host in one
 * min-heap (memory linear in the fleet); every random draw from rekindle/rng.h, taken only at
 * failure events, so runs of one seed at different save intervals see the same failures.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan.h"
#include "rekindle/rng.h"

/* ---- defaults (docs/plan.md, "Inputs", names each source) ----------------------------------- */

void rk_plan_config_default(rk_plan_config *c)
{
    memset(c, 0, sizeof *c);
    c->hosts = 1;
    c->gpus_per_host = 1;
    c->mix[0] = 1.0;                    /* every GPU failure a crash unless told otherwise */
    c->detect_s[RK_PLAN_CRASH] = 0.072; /* bench/RESULTS.md: relaunch breakdown, detection */
    c->detect_s[RK_PLAN_HANG] = 5.04;   /* bench/RESULTS.md: run_goodput, hang detection */
    c->detect_s[RK_PLAN_HOST] = 10.0;   /* docs/cluster.md: --node-timeout default */
    c->detect_s[RK_PLAN_SLOW] = 600.0;  /* assumption: no detector of fail-slow measured */
    c->slow_factor = 0.5;               /* assumption */
    c->repair_median_s = 0.85 * 86400;  /* InfiniteHBD trace: median repair 0.85 days */
    c->repair_mean_s = 5.5 * 86400;     /* InfiniteHBD trace: mean repair 5.5 days */
    c->mode = RK_PLAN_DISK;
    c->restart_s[RK_PLAN_DISK] = 1.44; /* bench/RESULTS.md: 1.51 s crash->resumed, less detection */
    c->restart_s[RK_PLAN_MEMORY] =
        0.78; /* bench/RESULTS.md: 0.85 s crash->resumed, less detection */
    c->restart_s[RK_PLAN_INPLACE] = 0.11; /* bench/RESULTS.md: worker.step (hello, first step) */
    c->host_restart_s = 2.83;             /* bench/RESULTS.md: many hosts, recovery median */
    c->ckpt_every_s = 600;
    c->ckpt_cost_s = 0.28; /* bench/RESULTS.md: ckpt_io, 256 MiB saved in 0.28 s */
    c->snap_every_s = 60;
    c->snap_cost_s = 0.021; /* bench/RESULTS.md: snap_bench, put of 64 MiB in 20.6 ms */
    c->step_s = 0.03;       /* bench/RESULTS.md: run_goodput, 34.3 steps/s */
    c->horizon_s = 30 * 86400.0;
}

static int bad(rk_err *err, const char *field, const char *what)
{
    return rk_err_set(err, RK_EINVAL, "plan: %s %s", field, what);
}

static int pos(double v)
{
    return isfinite(v) && v > 0;
}
static int nonneg(double v)
{
    return isfinite(v) && v >= 0;
}

static int law_check(const rk_plan_law *l, const char *who, rk_err *err)
{
    char f[64];
    switch (l->dist) {
    case RK_PLAN_NONE: return RK_OK;
    case RK_PLAN_EXPONENTIAL:
        snprintf(f, sizeof f, "%s mtbf", who);
        return pos(l->mtbf_s) ? RK_OK : bad(err, f, "must be a finite number > 0");
    case RK_PLAN_WEIBULL:
        snprintf(f, sizeof f, "%s weibull shape", who);
        if (!pos(l->shape) || l->shape > 100)
            return bad(err, f, "must be in (0, 100]");
        snprintf(f, sizeof f, "%s weibull scale", who);
        if (!pos(l->scale_s))
            return bad(err, f, "must be a finite number > 0");
        snprintf(f, sizeof f, "%s age", who);
        return nonneg(l->age_s) ? RK_OK : bad(err, f, "must be a finite number >= 0");
    }
    snprintf(f, sizeof f, "%s distribution", who);
    return bad(err, f, "is unknown");
}

int rk_plan_config_check(const rk_plan_config *c, rk_err *err)
{
    if (!c)
        return bad(err, "config", "is NULL");
    if (c->hosts < 1 || c->gpus_per_host < 1)
        return bad(err, "hosts and GPUs per host", "must be >= 1");
    uint64_t units = ((uint64_t)c->hosts + c->spare_hosts) * ((uint64_t)c->gpus_per_host + 1);
    if (units > 100000000)
        return bad(err, "fleet", "is larger than 100,000,000 GPUs and hosts");
    if (c->min_hosts > c->hosts)
        return bad(err, "min_hosts", "must not exceed hosts");
    int r = law_check(&c->gpu, "gpu", err);
    if (r)
        return r;
    if ((r = law_check(&c->host, "host", err)))
        return r;
    double mix = 0;
    for (int i = 0; i < 3; i++) {
        if (!nonneg(c->mix[i]))
            return bad(err, "mix", "shares must be finite numbers >= 0");
        mix += c->mix[i];
    }
    if (c->gpu.dist != RK_PLAN_NONE && !(mix > 0))
        return bad(err, "mix", "shares must not all be 0");
    for (int k = 0; k < RK_PLAN_KINDS; k++)
        if (!nonneg(c->detect_s[k]))
            return bad(err, "detection time", "must be a finite number >= 0");
    if (!pos(c->slow_factor) || c->slow_factor > 1)
        return bad(err, "slow factor", "must be in (0, 1]");
    if (!pos(c->repair_median_s) || !isfinite(c->repair_mean_s) ||
        c->repair_mean_s < c->repair_median_s)
        return bad(err, "repair time", "needs a median > 0 and a mean >= the median");
    if ((unsigned)c->mode >= RK_PLAN_MODES)
        return bad(err, "recovery mode", "is unknown");
    for (int m = 0; m < RK_PLAN_MODES; m++)
        if (!nonneg(c->restart_s[m]))
            return bad(err, "restart cost", "must be a finite number >= 0");
    if (!nonneg(c->host_restart_s))
        return bad(err, "host restart cost", "must be a finite number >= 0");
    if (!pos(c->ckpt_every_s) || !nonneg(c->ckpt_cost_s))
        return bad(err, "checkpoint interval and cost", "must be > 0 and >= 0");
    if (!pos(c->snap_every_s) || !nonneg(c->snap_cost_s))
        return bad(err, "snapshot interval and cost", "must be > 0 and >= 0");
    if (!pos(c->step_s))
        return bad(err, "step time", "must be a finite number > 0");
    if (!nonneg(c->work_s) || !pos(c->horizon_s))
        return bad(err, "work and horizon", "must be >= 0 and > 0");
    if (c->trace_len && !c->trace)
        return bad(err, "trace", "is NULL with faults counted");
    for (size_t i = 0; i < c->trace_len; i++) {
        const rk_plan_fault *f = &c->trace[i];
        if (f->host >= c->hosts + c->spare_hosts)
            return bad(err, "trace", "names a host beyond the fleet");
        if (!nonneg(f->start_s) || !isfinite(f->end_s) || f->end_s < f->start_s ||
            (i && f->start_s < c->trace[i - 1].start_s))
            return bad(err, "trace", "faults must be sorted, each ending after it starts");
    }
    return RK_OK;
}

/* ---- random draws ---------------------------------------------------------------------------- */

/* Uniform in (0, 1) with 53 random bits (never 0: logarithms below). */
static double unif(rk_rng *r)
{
    return ((double)(rk_rng_next(r) >> 11) + 0.5) * 0x1p-53;
}

static double draw_life(const rk_plan_law *l, rk_rng *r, double age)
{
    double e = -log(unif(r));
    switch (l->dist) {
    case RK_PLAN_EXPONENTIAL: return l->mtbf_s * e;
    case RK_PLAN_WEIBULL: {
        /* given survival to `age`: (age/s)^k + E = (T/s)^k */
        double a = pow(age / l->scale_s, l->shape);
        return l->scale_s * pow(a + e, 1.0 / l->shape) - age;
    }
    default: return INFINITY;
    }
}

static double draw_repair(const rk_plan_config *c, rk_rng *r)
{
    double sigma = sqrt(2.0 * log(c->repair_mean_s / c->repair_median_s));
    double u1 = unif(r), u2 = unif(r);
    double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    return c->repair_median_s * exp(sigma * z);
}

/* ---- a min-heap of (time, id) ------------------------------------------------------------------
 */

typedef struct heap {
    double *t;
    uint32_t *id;
    size_t n, cap;
} heap;

static int heap_init(heap *h, size_t cap)
{
    h->n = 0;
    h->cap = cap ? cap : 1;
    h->t = malloc(h->cap * sizeof *h->t);
    h->id = malloc(h->cap * sizeof *h->id);
    return h->t && h->id ? 0 : -1;
}

static void heap_free(heap *h)
{
    free(h->t);
    free(h->id);
}

static void heap_down(heap *h, size_t i)
{
    double t = h->t[i];
    uint32_t id = h->id[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->t[c + 1] < h->t[c])
            c++;
        if (!(h->t[c] < t))
            break;
        h->t[i] = h->t[c];
        h->id[i] = h->id[c];
        i = c;
    }
    h->t[i] = t;
    h->id[i] = id;
}

static int heap_push(heap *h, double t, uint32_t id)
{
    if (h->n == h->cap) {
        size_t cap = h->cap * 2;
        double *nt = realloc(h->t, cap * sizeof *nt);
        if (!nt)
            return -1;
        h->t = nt;
        uint32_t *ni = realloc(h->id, cap * sizeof *ni);
        if (!ni)
            return -1;
        h->id = ni;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!(t < h->t[p]))
            break;
        h->t[i] = h->t[p];
        h->id[i] = h->id[p];
        i = p;
    }
    h->t[i] = t;
    h->id[i] = id;
    return 0;
}

static void heap_pop(heap *h)
{
    h->n--;
    if (h->n) {
        h->t[0] = h->t[h->n];
        h->id[0] = h->id[h->n];
        heap_down(h, 0);
    }
}

static double heap_top(const heap *h)
{
    return h->n ? h->t[0] : INFINITY;
}

/* ---- the run -----------------------------------------------------------------------------------
 */

enum { H_ACTIVE, H_SPARE, H_DOWN, H_JOINING };
enum { P_COMPUTE, P_SAVE, P_DOWN, P_WAIT };

typedef struct slow_gpu {
    double detect_t;
    uint32_t host;
} slow_gpu;

typedef struct run {
    const rk_plan_config *c;
    rk_plan_result *res;
    rk_rng rng;
    uint32_t n_hosts, n_gpus; /* all, spares included */
    uint8_t *state;           /* per host */
    uint32_t *down_count;     /* per host: faults open */
    double *down_since;
    heap fail;    /* next failure of every unit: ids < n_gpus GPUs, then hosts */
    heap repairs; /* repair ends: host ids */
    slow_gpu *slow;
    size_t n_slow, cap_slow;
    /* the job */
    double t;
    int phase;
    double phase_end;
    uint32_t active, joining, full, min_active;
    double work, w_ckpt, w_snap, w_saving, since_ckpt, since_snap, compute_total;
    int saving_ckpt;
} run;

static double rate(const run *s)
{
    return (double)s->active / s->full * (s->n_slow ? s->c->slow_factor : 1.0);
}

static void start_down(run *s, double d)
{
    s->phase = P_DOWN;
    s->phase_end = s->t + d;
    s->res->restarts++;
}

/* Lose the work since `keep` (a failure in compute or a save; nothing in a restart). */
static void roll_back(run *s, double keep)
{
    if (s->phase == P_COMPUTE || s->phase == P_SAVE) {
        if (keep > s->work)
            keep = s->work;
        s->res->lost_work_s += s->work - keep;
        s->work = keep;
        s->since_ckpt = s->since_snap = 0;
    }
}

static double restore_point(const run *s, int host_lost)
{
    const rk_plan_config *c = s->c;
    if (c->mode == RK_PLAN_INPLACE) {
        double lost = fmod(s->compute_total, c->step_s) * rate(s);
        double w = s->work - lost;
        return w > s->w_ckpt ? w : s->w_ckpt;
    }
    if (c->mode == RK_PLAN_MEMORY && !host_lost)
        return s->w_snap > s->w_ckpt ? s->w_snap : s->w_ckpt;
    return s->w_ckpt;
}

static void host_down(run *s, uint32_t h)
{
    if (s->down_count[h]++ == 0)
        s->down_since[h] = s->t;
}

static void drop_slow_of(run *s, uint32_t h)
{
    for (size_t i = 0; i < s->n_slow;)
        if (s->slow[i].host == h)
            s->slow[i] = s->slow[--s->n_slow];
        else
            i++;
}

/* Host h left the job (lost, or drained): a spare takes its place, or the job shrinks or
 * waits. `lost`: the job's state on it is gone (else drained after a checkpoint). */
static void job_lose_host(run *s, uint32_t h, int lost)
{
    const rk_plan_config *c = s->c;
    int prev = s->state[h];
    s->state[h] = H_DOWN;
    drop_slow_of(s, h);
    if (prev == H_JOINING) {
        s->joining--;
        return;
    }
    if (prev != H_ACTIVE)
        return;
    s->res->failures[RK_PLAN_HOST] += lost;
    if (lost)
        roll_back(s, restore_point(s, 1));
    else if (s->phase == P_COMPUTE || s->phase == P_SAVE) {
        /* the drain: a checkpoint of the work so far first */
        s->w_ckpt = s->work;
        s->since_ckpt = s->since_snap = 0;
    }
    int spare = 0;
    for (uint32_t i = 0; i < s->n_hosts && !spare; i++)
        if (s->state[i] == H_SPARE) {
            s->state[i] = H_ACTIVE;
            s->res->spares_used++;
            spare = 1;
        }
    if (!spare)
        s->active--;
    if (s->phase == P_WAIT)
        return;
    if (s->active < s->min_active) {
        s->phase = P_WAIT;
        return;
    }
    double d = (lost ? c->detect_s[RK_PLAN_HOST] : c->ckpt_cost_s) + c->host_restart_s;
    start_down(s, d);
}

static int on_unit_failure(run *s, uint32_t id)
{
    const rk_plan_config *c = s->c;
    double u = unif(&s->rng); /* drawn always: the same draws whatever the job does */
    if (id >= s->n_gpus) {
        uint32_t h = id - s->n_gpus;
        if (s->down_count[h])
            return 0;
        host_down(s, h);
        if (heap_push(&s->repairs, s->t + draw_repair(c, &s->rng), h))
            return -1;
        job_lose_host(s, h, 1);
        return 0;
    }
    uint32_t h = id / c->gpus_per_host;
    double tot = c->mix[0] + c->mix[1] + c->mix[2];
    int kind = u * tot < c->mix[0]               ? RK_PLAN_CRASH
               : u * tot < c->mix[0] + c->mix[1] ? RK_PLAN_HANG
                                                 : RK_PLAN_SLOW;
    if (s->state[h] != H_ACTIVE || s->phase == P_WAIT)
        return 0;
    s->res->failures[kind]++;
    if (kind == RK_PLAN_SLOW) {
        if (s->n_slow == s->cap_slow) {
            size_t cap = s->cap_slow ? 2 * s->cap_slow : 8;
            slow_gpu *n = realloc(s->slow, cap * sizeof *n);
            if (!n)
                return -1;
            s->slow = n;
            s->cap_slow = cap;
        }
        s->slow[s->n_slow++] = (slow_gpu){s->t + c->detect_s[RK_PLAN_SLOW], h};
        return 0;
    }
    roll_back(s, restore_point(s, 0));
    start_down(s, c->detect_s[kind] + c->restart_s[c->mode]);
    return 0;
}

static void on_repair(run *s, uint32_t h)
{
    if (--s->down_count[h])
        return;
    s->res->host_down_s += s->t - s->down_since[h];
    if (s->active + s->joining >= s->full) {
        s->state[h] = H_SPARE;
        return;
    }
    if (s->phase == P_WAIT || s->phase == P_DOWN) {
        s->state[h] = H_ACTIVE;
        s->active++;
        if (s->phase == P_WAIT && s->active >= s->min_active) {
            s->phase = P_DOWN; /* relaunch on the hosts now there */
            s->phase_end = s->t + s->c->host_restart_s;
            s->res->restarts++;
        }
        return;
    }
    s->state[h] = H_JOINING; /* joins at the next save */
    s->joining++;
}

static int on_trace_fault(run *s, const rk_plan_fault *f)
{
    s->res->trace_faults++;
    int was_down = s->down_count[f->host] > 0;
    host_down(s, f->host);
    if (heap_push(&s->repairs, f->end_s, f->host))
        return -1;
    if (!was_down)
        job_lose_host(s, f->host, 1);
    return 0;
}

static void on_phase_end(run *s)
{
    const rk_plan_config *c = s->c;
    switch (s->phase) {
    case P_COMPUTE: {
        int memory = c->mode != RK_PLAN_DISK;
        s->phase = P_SAVE;
        s->w_saving = s->work;
        s->saving_ckpt = !memory || s->since_ckpt >= c->ckpt_every_s * (1 - 1e-12);
        s->phase_end = s->t + (s->saving_ckpt ? c->ckpt_cost_s : c->snap_cost_s);
        if (s->saving_ckpt)
            s->since_ckpt = 0;
        s->since_snap = 0;
        break;
    }
    case P_SAVE:
        if (s->saving_ckpt) {
            s->w_ckpt = s->w_saving;
            s->res->ckpts++;
        } else
            s->res->snaps++;
        if (s->w_saving > s->w_snap || s->saving_ckpt)
            s->w_snap = s->w_saving;
        s->phase = P_COMPUTE;
        if (s->joining) {
            for (uint32_t h = 0; h < s->n_hosts; h++)
                if (s->state[h] == H_JOINING)
                    s->state[h] = H_ACTIVE;
            s->active += s->joining;
            s->joining = 0;
            start_down(s, c->host_restart_s);
        }
        break;
    case P_DOWN:
        s->phase = P_COMPUTE;
        s->since_ckpt = s->since_snap = 0;
        break;
    default: break;
    }
}

static void account(run *s, double to)
{
    double dt = to - s->t;
    if (dt <= 0)
        return;
    switch (s->phase) {
    case P_COMPUTE:
        s->work += rate(s) * dt;
        s->since_ckpt += dt;
        s->since_snap += dt;
        s->compute_total += dt;
        break;
    case P_SAVE: s->res->save_s += dt; break;
    case P_DOWN: s->res->down_s += dt; break;
    default: s->res->wait_s += dt; break;
    }
    s->t = to;
}

static double next_phase_end(const run *s)
{
    const rk_plan_config *c = s->c;
    if (s->phase == P_SAVE || s->phase == P_DOWN)
        return s->phase_end;
    if (s->phase != P_COMPUTE)
        return INFINITY;
    double dt = c->ckpt_every_s - s->since_ckpt;
    if (c->mode != RK_PLAN_DISK && c->snap_every_s - s->since_snap < dt)
        dt = c->snap_every_s - s->since_snap;
    return s->t + (dt > 0 ? dt : 0);
}

static double finish_time(const run *s)
{
    if (s->c->work_s <= 0 || s->phase != P_COMPUTE)
        return INFINITY;
    return s->t + (s->c->work_s - s->work) / rate(s);
}

/* At the start of a save cycle, with nothing due before `t_ext` (a failure, a repair, the
 * horizon): skip whole cycles (compute, snapshots, checkpoint) at once, as the event loop
 * would run them, so that runs cost events per failure, not per save. */
static void skip_cycles(run *s, double t_ext)
{
    const rk_plan_config *c = s->c;
    if (s->phase != P_COMPUTE || s->since_ckpt != 0 || s->since_snap != 0 || s->n_slow ||
        s->joining || !isfinite(c->ckpt_every_s))
        return;
    double tau = c->ckpt_every_s, snaps = 0;
    if (c->mode != RK_PLAN_DISK)
        snaps = ceil(tau / c->snap_every_s) - 1;
    if (snaps < 0)
        snaps = 0;
    double period = tau + snaps * c->snap_cost_s + c->ckpt_cost_s;
    double r = rate(s), room = t_ext - s->t;
    if (!(period > 0) || room < 3 * period)
        return;
    double k = floor(room / period) - 1;
    if (c->work_s > 0) {
        double kw = floor((c->work_s - s->work) / (tau * r)) - 1;
        if (kw < k)
            k = kw;
    }
    if (k < 1)
        return;
    s->work += k * tau * r;
    s->w_ckpt = s->w_snap = s->work;
    s->compute_total += k * tau;
    s->res->ckpts += (uint64_t)k;
    s->res->snaps += (uint64_t)(k * snaps);
    s->res->save_s += k * (snaps * c->snap_cost_s + c->ckpt_cost_s);
    s->t += k * period;
}

static int simulate(run *s)
{
    const rk_plan_config *c = s->c;
    size_t ti = 0;
    for (;;) {
        double t_fail = heap_top(&s->fail), t_rep = heap_top(&s->repairs);
        double t_trace = ti < c->trace_len ? c->trace[ti].start_s : INFINITY;
        double t_slow = INFINITY;
        size_t si = 0;
        for (size_t i = 0; i < s->n_slow; i++)
            if (s->slow[i].detect_t < t_slow)
                t_slow = s->slow[i].detect_t, si = i;
        skip_cycles(s, fmin(fmin(fmin(t_fail, t_rep), fmin(t_trace, t_slow)), c->horizon_s));
        double t_phase = next_phase_end(s), t_fin = finish_time(s);
        double t = fmin(fmin(fmin(t_fail, t_rep), fmin(t_trace, t_slow)), fmin(t_phase, t_fin));
        if (t > c->horizon_s) { /* events at the horizon itself are run (a fault there counts) */
            account(s, c->horizon_s);
            return 0;
        }
        if (t < s->t)
            t = s->t;
        account(s, t);
        if (t == t_fin) {
            s->work = c->work_s;
            s->res->finished = 1;
            return 0;
        }
        if (t == t_phase)
            on_phase_end(s);
        else if (t == t_rep) {
            uint32_t h = s->repairs.id[0];
            heap_pop(&s->repairs);
            on_repair(s, h);
        } else if (t == t_trace) {
            if (on_trace_fault(s, &c->trace[ti++]))
                return -1;
        } else if (t == t_slow) {
            uint32_t h = s->slow[si].host;
            s->slow[si] = s->slow[--s->n_slow];
            host_down(s, h);
            if (heap_push(&s->repairs, s->t + draw_repair(c, &s->rng), h))
                return -1;
            job_lose_host(s, h, 0);
        } else {
            uint32_t id = s->fail.id[0];
            const rk_plan_law *l = id < s->n_gpus ? &c->gpu : &c->host;
            s->fail.t[0] = t + draw_life(l, &s->rng, 0);
            heap_down(&s->fail, 0);
            if (on_unit_failure(s, id))
                return -1;
        }
    }
}

int rk_plan_run(const rk_plan_config *c, uint64_t seed, rk_plan_result *out, rk_err *err)
{
    int r = rk_plan_config_check(c, err);
    if (r)
        return r;
    memset(out, 0, sizeof *out);
    run s = {.c = c, .res = out};
    rk_rng_seed(&s.rng, seed);
    s.n_hosts = c->hosts + c->spare_hosts;
    s.n_gpus = s.n_hosts * c->gpus_per_host;
    s.full = s.active = c->hosts;
    s.min_active = c->min_hosts ? c->min_hosts : c->hosts;
    s.state = calloc(s.n_hosts, 1);
    s.down_count = calloc(s.n_hosts, sizeof *s.down_count);
    s.down_since = calloc(s.n_hosts, sizeof *s.down_since);
    size_t units = (c->gpu.dist ? s.n_gpus : 0) + (c->host.dist ? s.n_hosts : 0);
    int ok = s.state && s.down_count && s.down_since && !heap_init(&s.fail, units) &&
             !heap_init(&s.repairs, 16);
    if (ok) {
        for (uint32_t h = 0; h < s.n_hosts; h++)
            s.state[h] = h < c->hosts ? H_ACTIVE : H_SPARE;
        /* first failures in unit order, then heapify */
        if (c->gpu.dist)
            for (uint32_t g = 0; g < s.n_gpus; g++) {
                s.fail.t[s.fail.n] = draw_life(&c->gpu, &s.rng, c->gpu.age_s);
                s.fail.id[s.fail.n++] = g;
            }
        if (c->host.dist)
            for (uint32_t h = 0; h < s.n_hosts; h++) {
                s.fail.t[s.fail.n] = draw_life(&c->host, &s.rng, c->host.age_s);
                s.fail.id[s.fail.n++] = s.n_gpus + h;
            }
        for (size_t i = s.fail.n / 2; i-- > 0;)
            heap_down(&s.fail, i);
        ok = simulate(&s) == 0;
    }
    if (ok) {
        for (uint32_t h = 0; h < s.n_hosts; h++)
            if (s.down_count[h])
                out->host_down_s += s.t - s.down_since[h];
        out->wall_s = s.t;
        out->work_s = s.work;
        out->goodput = s.t > 0 ? s.work / s.t : 0;
    }
    heap_free(&s.fail);
    heap_free(&s.repairs);
    free(s.slow);
    free(s.state);
    free(s.down_count);
    free(s.down_since);
    return ok ? RK_OK
              : rk_err_set(err, RK_ENOMEM, "plan: out of memory for a fleet of %u hosts",
                           s.n_hosts);
}

/* ---- many runs, sweeps -------------------------------------------------------------------------
 */

int rk_plan_estimate(const rk_plan_config *c, uint64_t seed, int runs, rk_plan_stats *out,
                     rk_err *err)
{
    if (runs < 1)
        return rk_err_set(err, RK_EINVAL, "plan: runs must be >= 1");
    memset(out, 0, sizeof *out);
    double sum = 0, sum2 = 0;
    out->goodput_min = INFINITY;
    out->goodput_max = -INFINITY;
    for (int i = 0; i < runs; i++) {
        rk_plan_result r;
        int rc = rk_plan_run(c, seed + (uint64_t)i, &r, err);
        if (rc)
            return rc;
        sum += r.goodput;
        sum2 += r.goodput * r.goodput;
        out->goodput_min = fmin(out->goodput_min, r.goodput);
        out->goodput_max = fmax(out->goodput_max, r.goodput);
        out->wall_mean_s += r.wall_s / runs;
        out->finished += r.finished;
        for (int k = 0; k < RK_PLAN_KINDS; k++)
            out->failures_mean += (double)r.failures[k] / runs;
        out->lost_work_mean_s += r.lost_work_s / runs;
    }
    out->runs = runs;
    out->goodput_mean = sum / runs;
    double var = runs > 1 ? (sum2 - sum * sum / runs) / (runs - 1) : 0;
    out->goodput_sd = var > 0 ? sqrt(var) : 0;
    return RK_OK;
}

/* Least squares y = a + b x + q x^2 over n points; the vertex, or NAN when not a maximum. */
static double parabola_vertex(const double *x, const double *y, int n)
{
    double s[5] = {0}, t[3] = {0};
    for (int i = 0; i < n; i++) {
        double p = 1;
        for (int k = 0; k < 5; k++, p *= x[i])
            s[k] += p;
        t[0] += y[i];
        t[1] += y[i] * x[i];
        t[2] += y[i] * x[i] * x[i];
    }
    /* normal equations [s0 s1 s2; s1 s2 s3; s2 s3 s4] [a b q] = t, by Cramer's rule */
    double m[3][3] = {{s[0], s[1], s[2]}, {s[1], s[2], s[3]}, {s[2], s[3], s[4]}};
#define DET3(A)                                                                                    \
    ((A)[0][0] * ((A)[1][1] * (A)[2][2] - (A)[1][2] * (A)[2][1]) -                                 \
     (A)[0][1] * ((A)[1][0] * (A)[2][2] - (A)[1][2] * (A)[2][0]) +                                 \
     (A)[0][2] * ((A)[1][0] * (A)[2][1] - (A)[1][1] * (A)[2][0]))
    double d = DET3(m);
    if (d == 0)
        return NAN;
    double mb[3][3], mq[3][3];
    memcpy(mb, m, sizeof m);
    memcpy(mq, m, sizeof m);
    for (int i = 0; i < 3; i++) {
        mb[i][1] = t[i];
        mq[i][2] = t[i];
    }
    double b = DET3(mb) / d, q = DET3(mq) / d;
#undef DET3
    return q < 0 ? -b / (2 * q) : NAN;
}

int rk_plan_best_interval(const rk_plan_config *c, int snap, double lo_s, double hi_s, int n,
                          uint64_t seed, int runs, double *interval, double *goodput,
                          rk_plan_best *out, rk_err *err)
{
    if (n < 3 || n > 1000 || !pos(lo_s) || !(hi_s > lo_s) || !isfinite(hi_s))
        return rk_err_set(err, RK_EINVAL,
                          "plan: a sweep needs 3 to 1000 intervals from lo > 0 to hi > lo");
    double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return rk_err_set(err, RK_ENOMEM, "plan: out of memory for a sweep");
    }
    rk_plan_config k = *c;
    int best = 0, rc = RK_OK;
    for (int i = 0; i < n && !rc; i++) {
        x[i] = log(lo_s) + (log(hi_s) - log(lo_s)) * i / (n - 1);
        if (snap)
            k.snap_every_s = exp(x[i]);
        else
            k.ckpt_every_s = exp(x[i]);
        rk_plan_stats st;
        rc = rk_plan_estimate(&k, seed, runs, &st, err);
        y[i] = st.goodput_mean;
        if (interval)
            interval[i] = exp(x[i]);
        if (goodput)
            goodput[i] = y[i];
        if (!rc && y[i] > y[best])
            best = i;
    }
    if (!rc) {
        int a = best - 2, b = best + 2;
        if (a < 0)
            a = 0, b = n < 5 ? n - 1 : 4;
        if (b > n - 1)
            b = n - 1, a = n - 5 < 0 ? 0 : n - 5;
        double v = parabola_vertex(x + a, y + a, b - a + 1);
        if (!isfinite(v) || v < x[a] || v > x[b])
            v = x[best];
        out->interval_s = exp(v);
        out->goodput = y[best];
        out->index = best;
    }
    free(x);
    free(y);
    return rc;
}

/* ---- closed forms ------------------------------------------------------------------------------
 */

double rk_plan_daly_goodput(double tau_s, double c_s, double r_s, double mtbf_s)
{
    return tau_s / (mtbf_s * exp(r_s / mtbf_s) * expm1((tau_s + c_s) / mtbf_s));
}

double rk_plan_young_interval(double c_s, double mtbf_s)
{
    return sqrt(2 * c_s * mtbf_s);
}

double rk_plan_daly_interval(double c_s, double mtbf_s)
{
    if (c_s >= 2 * mtbf_s)
        return mtbf_s;
    double y = sqrt(2 * c_s * mtbf_s);
    return y * (1 + sqrt(c_s / (2 * mtbf_s)) / 3 + c_s / (18 * mtbf_s)) - c_s;
}
