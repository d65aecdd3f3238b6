/*
 * The supervisor's ledger (supervisor.h): every incident as one line of the events file (its
 * format: events.h), the time of each applied step for goodput, and the closing summary (JSON
 * and text). Relies on jansson for JSON and rekindle/fileio.h for the atomic summary file.
 */
#include "supervisor/supervisor.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "rekindle/fileio.h"
#include "supervisor/events.h"

int rk_ledger_open(rk_ledger *g, const char *events_path, rk_err *err)
{
    memset(g, 0, sizeof *g);
    g->t0 = rk_mono_s();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g->wall0 = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    g->first_step = -1;
    g->at_step = -1;
    if (events_path && !(g->events = fopen(events_path, "ae")))
        return rk_err_set(err, RK_EIO, "--events %s: %s", events_path, strerror(errno));
    return RK_OK;
}

int rk_ledger_open_records(rk_ledger *g, const char *steps_path, const char *gate_path, rk_err *err)
{
    if (steps_path && !(g->steps = fopen(steps_path, "ae")))
        return rk_err_set(err, RK_EIO, "--steps %s: %s", steps_path, strerror(errno));
    if (gate_path && !(g->gatelog = fopen(gate_path, "ae")))
        return rk_err_set(err, RK_EIO, "--gate-log %s: %s", gate_path, strerror(errno));
    return RK_OK;
}

/* One record line; flushed (not fsync'ed: a step a line is too many fsyncs), fsync'ed at
 * close. A record the format refuses, or a full disk, leaves the line out. */
static void put_rec(FILE *f, const rk_runlog_rec *r)
{
    static char line[RK_RUNLOG_MAX_LINE + 1];
    long n = rk_runlog_format(r, line, sizeof line);
    if (n < 0)
        return;
    fprintf(f, "%s\n", line);
    fflush(f);
}

void rk_ledger_launch_rec(rk_ledger *g, int launch, const char *const *devices, int n)
{
    if (!g->steps || n < 1 || n > RK_RUNLOG_MAX_DEVICES)
        return;
    static rk_runlog_rec r; /* 16 KiB of device ids: not on the stack */
    rk_runlog_init(&r, RK_RUNLOG_LAUNCH);
    r.t = rk_ledger_now(g);
    r.launch = launch;
    r.ndevices = n;
    for (int i = 0; i < n; i++)
        snprintf(r.devices[i], sizeof r.devices[i], "%s", devices[i]);
    put_rec(g->steps, &r); /* launches are never thinned: there are few */
}

void rk_ledger_step_rec(rk_ledger *g, int launch, int rank, int64_t k, double loss, double dt)
{
    if (!g->steps || !rk_runlog_thin_keep(&g->thin_steps))
        return;
    static rk_runlog_rec r;
    rk_runlog_init(&r, RK_RUNLOG_STEP);
    r.t = rk_ledger_now(g);
    r.launch = launch;
    r.rank = rank;
    r.step = k;
    r.loss = loss;
    r.dt = dt;
    put_rec(g->steps, &r);
}

void rk_ledger_ckpt_rec(rk_ledger *g, int launch, int rank, int64_t k, double seconds)
{
    if (!g->steps || !rk_runlog_thin_keep(&g->thin_ckpt))
        return;
    static rk_runlog_rec r;
    rk_runlog_init(&r, RK_RUNLOG_CKPT);
    r.t = rk_ledger_now(g);
    r.launch = launch;
    r.rank = rank;
    r.step = k;
    r.seconds = seconds;
    put_rec(g->steps, &r);
}

void rk_ledger_gate_rec(rk_ledger *g, rk_runlog_rec *recs, int n)
{
    /* the bound counts lines: a reading of n GPUs is n of them */
    if (!g->gatelog || n < 1 || g->thin_gate.written * n >= RK_RUNLOG_MAX_LINES ||
        !rk_runlog_thin_keep(&g->thin_gate))
        return;
    double now = rk_ledger_now(g);
    for (int i = 0; i < n; i++) {
        recs[i].t = now;
        put_rec(g->gatelog, &recs[i]);
    }
}

static void close_rec(FILE *f)
{
    if (!f)
        return;
    fflush(f);
    fsync(fileno(f));
    fclose(f);
}

void rk_ledger_close(rk_ledger *g)
{
    if (g->events)
        fclose(g->events);
    close_rec(g->steps);
    close_rec(g->gatelog);
    free(g->inc);
    free(g->dt);
    memset(g, 0, sizeof *g);
}

double rk_ledger_now(const rk_ledger *g)
{
    return rk_mono_s() - g->t0;
}

rk_incident *rk_ledger_addv(rk_ledger *g, const char *kind, int rank, const char *device,
                            const char *action, const char *fmt, va_list ap)
{
    if (g->ninc == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        rk_incident *p = realloc(g->inc, cap * sizeof *p);
        if (!p)
            return NULL;
        g->inc = p;
        g->cap = cap;
    }
    rk_incident *i = &g->inc[g->ninc++];
    memset(i, 0, sizeof *i);
    i->t = rk_ledger_now(g);
    snprintf(i->kind, sizeof i->kind, "%s", kind);
    i->rank = rank;
    snprintf(i->device, sizeof i->device, "%s", device ? device : "");
    snprintf(i->action, sizeof i->action, "%s", action);
    i->lost_steps = -1;
    i->recovery_s = -1;
    i->step = g->at_step;
    vsnprintf(i->detail, sizeof i->detail, fmt, ap);
    return i;
}

rk_incident *rk_ledger_add(rk_ledger *g, const char *kind, int rank, const char *device,
                           const char *action, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rk_incident *i = rk_ledger_addv(g, kind, rank, device, action, fmt, ap);
    va_end(ap);
    return i;
}

/* The incident as one events line (events.h's one format); fsync'ed. A line the format
 * refuses, or a full disk, is left out. */
static void write_line(rk_ledger *g, const rk_incident *i)
{
    if (!g->events)
        return;
    static rk_event e;
    static char line[RK_EVENT_MAX_LINE + 1];
    rk_event_init(&e);
    rk_event_stamp(&e, g->wall0 + i->t);
    e.t = i->t;
    snprintf(e.kind, sizeof e.kind, "%s", i->kind);
    e.rank = i->rank;
    snprintf(e.device, sizeof e.device, "%s", i->device);
    snprintf(e.action, sizeof e.action, "%s", i->action);
    e.step = i->step;
    e.lost_steps = i->lost_steps;
    e.recovery_s = i->recovery_s >= 0 ? i->recovery_s : NAN;
    snprintf(e.detail, sizeof e.detail, "%s", i->detail);
    snprintf(e.stacks, sizeof e.stacks, "%s", i->stacks);
    if (rk_event_format(&e, line, sizeof line) < 0)
        return;
    fprintf(g->events, "%s\n", line);
    fflush(g->events);
    fsync(fileno(g->events));
}

/* Write, in order of t (ties: the order they were added), every unwritten incident up to the
 * first that is not final. */
static void drain(rk_ledger *g)
{
    while (g->nwritten < g->ninc && g->inc[g->nwritten].written)
        g->nwritten++;
    for (;;) {
        rk_incident *next = NULL;
        for (size_t q = g->nwritten; q < g->ninc; q++)
            if (!g->inc[q].written && (!next || g->inc[q].t < next->t))
                next = &g->inc[q];
        if (!next || !next->final)
            return;
        write_line(g, next);
        next->written = 1;
        while (g->nwritten < g->ninc && g->inc[g->nwritten].written)
            g->nwritten++;
    }
}

void rk_ledger_write(rk_ledger *g, rk_incident *i)
{
    i->final = 1;
    drain(g);
}

void rk_ledger_flush(rk_ledger *g)
{
    for (size_t q = 0; q < g->ninc; q++)
        g->inc[q].final = 1;
    drain(g);
}

void rk_ledger_step(rk_ledger *g, int64_t k, double dt)
{
    if (k >= 0 && k <= RK_RUNLOG_MAX_STEP)
        g->at_step = k; /* where the job is, for the incidents (a replay goes back) */
    if (k < 1 || !(dt >= 0) || !isfinite(dt))
        return;
    if (!g->capdt) /* the first step seen fixes the window: a job resumed at step 10^7 */
        g->base = k - 1;
    /* a step before the window (a claim below where the job began) or beyond its bound (a
     * peer's claim of step 2^62 once made rk run double an int64 until it wrapped, forever)
     * is not counted */
    if (k <= g->base || k - g->base > RK_LEDGER_MAX_STEPS)
        return;
    int64_t i = k - 1 - g->base;
    if (i >= g->capdt) {
        int64_t cap = g->capdt ? g->capdt : 1024;
        while (cap <= i)
            cap = cap > RK_LEDGER_MAX_STEPS / 2 ? RK_LEDGER_MAX_STEPS : 2 * cap;
        double *p = realloc(g->dt, (size_t)cap * sizeof *p);
        if (!p)
            return;
        for (int64_t q = g->capdt; q < cap; q++)
            p[q] = 0.0;
        g->dt = p;
        g->capdt = cap;
    }
    g->dt[i] = dt;
    if (k > g->ndt)
        g->ndt = k;
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Incidents that are failures (not injections, not notes: rk_event_is_note). */
static int is_incident(const rk_incident *i)
{
    return strcmp(i->kind, "inject") != 0 && !rk_event_is_note(i->kind);
}

/* One more incident of `kind` in rep's counts (in order of first appearance). */
static int count_kind(rk_sup_report *rep, size_t *cap, const char *kind)
{
    for (size_t q = 0; q < rep->nkinds; q++)
        if (strcmp(rep->incidents[q].kind, kind) == 0) {
            rep->incidents[q].count++;
            return RK_OK;
        }
    if (rep->nkinds == *cap) {
        size_t n = *cap ? 2 * *cap : 16;
        rk_sup_count *p = realloc(rep->incidents, n * sizeof *p);
        if (!p)
            return RK_ENOMEM;
        rep->incidents = p;
        *cap = n;
    }
    rk_sup_count *c = &rep->incidents[rep->nkinds++];
    snprintf(c->kind, sizeof c->kind, "%s", kind);
    c->count = 1;
    return RK_OK;
}

int rk_ledger_summary(rk_ledger *g, const char *path, int64_t final_step, int final_ranks,
                      const char *outcome, rk_sup_report *rep, rk_err *err)
{
    rk_ledger_flush(g);
    double wall = rk_ledger_now(g), productive = 0.0;
    int64_t from = g->first_step > 0 ? g->first_step : 0;
    for (int64_t k = (from > g->base ? from : g->base) + 1; k <= final_step && k <= g->ndt; k++)
        productive += g->dt[k - 1 - g->base];
    double *rec = malloc((g->ninc ? g->ninc : 1) * sizeof *rec);
    size_t nrec = 0, cap = 0;
    free(rep->incidents);
    rep->incidents = NULL;
    rep->nkinds = 0;
    for (size_t q = 0; q < g->ninc; q++) {
        const rk_incident *i = &g->inc[q];
        if (!is_incident(i))
            continue;
        (void)count_kind(rep, &cap, i->kind);
        if (rec && i->recovery_s >= 0)
            rec[nrec++] = i->recovery_s;
    }
    double med = -1, max = -1;
    if (rec && nrec) {
        qsort(rec, nrec, sizeof *rec, dbl_cmp);
        med = nrec % 2 ? rec[nrec / 2] : 0.5 * (rec[nrec / 2 - 1] + rec[nrec / 2]);
        max = rec[nrec - 1];
    }
    free(rec);
    rep->summary = 1;
    rep->outcome = outcome;
    rep->steps = final_step;
    rep->first_step = from;
    rep->final_ranks = final_ranks;
    rep->wall_s = wall;
    rep->productive_s = productive;
    rep->goodput = wall > 0 ? productive / wall : 0.0;
    rep->restarts = g->restarts;
    rep->quarantined = g->quarantined;
    rep->injected = g->injected;
    rep->recovery_median_s = med;
    rep->recovery_max_s = max;
    rep->recovery = g->recovery ? g->recovery : "disk";
    rep->snapshots = g->snapshots ? g->snapshots : "none";
    rep->snap_peak = g->snap_peak;
    rep->held_peak = g->held_peak;
    rep->from_memory = g->from_memory;
    rep->from_disk = g->from_disk;
    rep->in_place = g->in_place;
    if (!path)
        return RK_OK;
    json_t *by_kind = json_object();
    for (size_t q = 0; q < rep->nkinds; q++)
        json_object_set_new(by_kind, rep->incidents[q].kind, json_integer(rep->incidents[q].count));
    json_t *j = json_object();
    json_object_set_new(j, "outcome", json_string(outcome));
    json_object_set_new(j, "wall_s", json_real(wall));
    json_object_set_new(j, "productive_s", json_real(productive));
    json_object_set_new(j, "goodput", json_real(rep->goodput));
    json_object_set_new(j, "steps", json_integer(final_step));
    json_object_set_new(j, "first_step", json_integer(from));
    json_object_set_new(j, "final_ranks", json_integer(final_ranks));
    json_object_set_new(j, "restarts", json_integer(g->restarts));
    json_object_set_new(j, "quarantined", json_integer(g->quarantined));
    json_object_set_new(j, "injected_faults", json_integer(g->injected));
    json_object_set_new(j, "incidents", by_kind);
    json_object_set_new(j, "recovery_median_s", med >= 0 ? json_real(med) : json_null());
    json_object_set_new(j, "recovery_max_s", max >= 0 ? json_real(max) : json_null());
    json_object_set_new(j, "recovery", json_string(rep->recovery));
    json_object_set_new(j, "snapshots", json_string(rep->snapshots));
    json_object_set_new(j, "snapshot_bytes_peak", json_integer((json_int_t)g->snap_peak));
    json_object_set_new(j, "snapshot_held_bytes_peak", json_integer((json_int_t)g->held_peak));
    json_t *restores = json_object();
    json_object_set_new(restores, "memory", json_integer(g->from_memory));
    json_object_set_new(restores, "disk", json_integer(g->from_disk));
    json_object_set_new(restores, "in_place", json_integer(g->in_place));
    json_object_set_new(j, "restores", restores);
    int rc = RK_OK;
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    if (!text) {
        rc = rk_err_set(err, RK_ENOMEM, "summary: cannot encode JSON");
    } else {
        size_t len = strlen(text);
        text[len] = '\n';
        rc = rk_file_write_atomic(path, text, len + 1, err);
        free(text);
    }
    json_decref(j);
    return rc;
}
