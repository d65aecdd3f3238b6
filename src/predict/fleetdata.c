/*
 * Fleet histories for the predictor (predict/fleetdata.h): each GPU of a simulated fleet
 * (rk_telemetry_sim, health/sim.h) read once a simulated minute on a pinned clock, its
 * features written in the safetensors layout, its ground-truth failure taken from the
 * simulator's event log (parsed with jansson), and the devices split by a seeded draw.
 */
#include "predict/fleetdata.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "health/sim.h"
#include "rekindle/fileio.h"
#include "rekindle/health.h"
#include "rekindle/monitor.h"
#include "rekindle/rng.h"
#include "rekindle/safetensors.h"

const char *const rk_fleet_feature_names[RK_FLEET_FEATURES] = {
    "temp",        "fan",      "power",         "sm_clock",
    "util",        "throttle", "ecc_corrected", "ecc_uncorrected",
    "pcie_replay", "xid",      "vrm_ripple",    "fan_vibration"};

static const char *const split_names[3] = {"train", "val", "test"};

void rk_fleet_data_opts_default(rk_fleet_data_opts *o)
{
    memset(o, 0, sizeof *o);
    o->gpus = 64;
    o->hours = 2000;
    o->seed = 1;
    o->start_age_h = 20000;
    o->val_frac = 0.2;
    o->test_frac = 0.2;
}

/* One GPU's history and failure. */
typedef struct gpu_run {
    char uuid[96], profile[32];
    size_t steps;
    long start_minute; /* the first step is the reading at minute start_minute + 1 */
    long fail_minute;  /* -1: none (a step index, as every minute below) */
    long pre_minute;   /* the step at whose reading its warning signs had begun; -1 none */
    char fail_event[24];
    int lost;
    int split;
} gpu_run;

int rk_fleet_window(const float *rows, size_t steps, size_t m, int T, float *out)
{
    if (!rows || !out || T < 1 || m >= steps || m + 1 < (size_t)T)
        return RK_EINVAL;
    memcpy(out, rows + (m + 1 - (size_t)T) * RK_FLEET_FEATURES,
           (size_t)T * RK_FLEET_FEATURES * sizeof *out);
    return RK_OK;
}

void rk_fleet_features(const rk_gpu_sample *s, const rk_gpu_sample *prev, float *x, uint8_t *v)
{
    const uint64_t thermal = RK_CLOCK_SW_THERMAL | RK_CLOCK_HW_THERMAL | RK_CLOCK_HW_SLOWDOWN;
    struct {
        rk_field f;
        double val;
    } g[RK_FLEET_FEATURES] = {
        {RK_F_TEMP, s->temp_c},
        {RK_F_FAN, s->fan_pct},
        {RK_F_POWER, s->power_w},
        {RK_F_SM_CLOCK, s->sm_mhz},
        {RK_F_UTIL, s->util_pct},
        {RK_F_CLOCK_REASONS, (s->clock_reasons & thermal) ? 1.0 : 0.0},
        {RK_F_ECC_CORRECTED, 0},
        {RK_F_ECC_UNCORRECTED, 0},
        {RK_F_PCIE_REPLAY, 0},
        {RK_F_XID, 0},
        {RK_F_VRM_RIPPLE, s->vrm_ripple_mv},
        {RK_F_FAN_VIB, s->fan_vib_hz},
    };
    if (prev) {
#define DELTA(field) (s->field >= prev->field ? (double)(s->field - prev->field) : 0.0)
        if (rk_field_valid(prev, RK_F_ECC_CORRECTED))
            g[6].val = DELTA(ecc_corrected);
        if (rk_field_valid(prev, RK_F_ECC_UNCORRECTED))
            g[7].val = DELTA(ecc_uncorrected);
        if (rk_field_valid(prev, RK_F_PCIE_REPLAY))
            g[8].val = DELTA(pcie_replay);
        if (rk_field_valid(prev, RK_F_XID))
            g[9].val = DELTA(xid_count);
#undef DELTA
    }
    for (int j = 0; j < RK_FLEET_FEATURES; j++) {
        v[j] = rk_field_valid(s, g[j].f);
        x[j] = v[j] ? (float)g[j].val : 0.0f;
    }
}

/* The first failure event of `gpu` in the events file `path` (lines of other GPUs are
 * ignored) at or after second `from` (0 for all): its time in *t_fail (INFINITY: none) and,
 * when g is not NULL, its step and event in g with the start of the warning signs before it
 * (the latest "precursor" line before the failure). When `all` is not NULL, the GPU's lines
 * from `from` to `to` seconds are appended to it. */
static int scan_events(const char *path, int gpu, double from, double to, FILE *all, gpu_run *g,
                       double *t_fail, rk_err *err)
{
    *t_fail = INFINITY;
    int fd;
    int rc = rk_file_open_read(path, SIZE_MAX, &fd, NULL, err);
    if (rc < 0)
        return rc == RK_ENOENT ? RK_OK : rc;
    /* rk-fd: fdopen ignores "e": fd is O_CLOEXEC from rk_file_open_read */
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
    }
    char *line = NULL;
    size_t cap = 0;
    double t_pre = -INFINITY;
    while (getline(&line, &cap, f) != -1) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        json_t *jg = j ? json_object_get(j, "gpu") : NULL;
        json_t *jt = j ? json_object_get(j, "t") : NULL;
        json_t *je2 = j ? json_object_get(j, "event") : NULL;
        if (!json_is_integer(jg) || !json_is_number(jt) || !json_is_string(je2)) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: a line the simulator wrote does not parse", path);
            json_decref(j);
            break;
        }
        double t = json_number_value(jt);
        if (json_integer_value(jg) == gpu && t >= from) {
            if (all && t <= to)
                fputs(line, all);
            const char *ev = json_string_value(je2);
            if (*t_fail == INFINITY && strcmp(ev, "precursor") == 0)
                t_pre = t;
            if (*t_fail == INFINITY &&
                (strcmp(ev, "off_bus") == 0 || strcmp(ev, "thermal_shutdown") == 0 ||
                 strcmp(ev, "dbe") == 0)) {
                *t_fail = t;
                if (g) {
                    double base = (double)g->start_minute;
                    double m = ceil(t / 60.0) - 1.0 - base;
                    g->fail_minute = m < 0 ? 0 : (long)m;
                    snprintf(g->fail_event, sizeof g->fail_event, "%s", ev);
                    /* warning signs of this failure begin at most 150 minutes before it (a
                     * seized fan's card overheats within hours: docs/sim.md) */
                    if (t_pre >= t - 6 * 3600.0) {
                        double pm = ceil(t_pre / 60.0) - 1.0 - base;
                        g->pre_minute = pm < 0 ? 0 : (long)pm;
                    }
                }
            }
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    return rc;
}

/* The dataset's simulated fleet, its event log written afresh to `events`. */
static int open_sim(const rk_fleet_data_opts *o, const char *events, rk_telemetry **t, rk_err *err)
{
    unlink(events);
    rk_telemetry_opts to = RK_TELEMETRY_OPTS_DEFAULT;
    to.sim_gpus = o->gpus;
    to.seed = o->seed;
    to.start_age_h = o->start_age_h;
    to.events_path = events;
    /* GPUs in a job, with the VRM and fan sensors fitted: the histories the models were
     * trained on (the fleet's defaults are idle and NVML's fields only) */
    to.sim_load = RK_SIM_LOAD_BUSY;
    to.sim_sensors = true;
    return rk_telemetry_open(t, "sim", &to, err);
}

/* Where GPU i's history starts (minutes after open). Without a span longer than the history,
 * at 0. With one, the GPU is first run alone to the span's end to find its first failure: a
 * GPU that fails within the span is read over the stretch that holds its failure at a seeded
 * place at least SPAN_LEAD_H hours from the start; any other over a seeded stretch. */
#define SPAN_LEAD_H 6.0
static int place_history(const rk_fleet_data_opts *o, int i, const char *events, long *start,
                         rk_err *err)
{
    *start = 0;
    const long minutes = llround(o->hours * 60.0), span = llround(o->span_h * 60.0);
    if (span <= minutes)
        return RK_OK;
    rk_telemetry *t = NULL;
    int rc = open_sim(o, events, &t, err);
    if (rc)
        return rc;
    rk_gpu_sample s;
    if (!(rc = rk_sim_set_time(rk_telemetry_sim_of(t), (double)span * 60.0)))
        rc = rk_telemetry_read(t, i, &s, err);
    rk_telemetry_close(t);
    double t_fail;
    if (rc || (rc = scan_events(events, i, 0, 0, NULL, NULL, &t_fail, err)))
        return rc;
    unlink(events);
    rk_rng r;
    rk_rng_derive(&r, o->seed, 0x5fa2, (uint64_t)i);
    double u = ((double)(rk_rng_next(&r) >> 11) + 0.5) * 0x1p-53;
    if (t_fail <= (double)span * 60.0) {
        long lo = llround(fmin(SPAN_LEAD_H * 60.0, minutes / 2.0));
        long fm = (long)ceil(t_fail / 60.0) - 1;
        long at = lo + (long)floor(u * (double)(minutes - lo)); /* the failure's step */
        *start = fm - at > 0 ? fm - at : 0;
    } else {
        *start = (long)floor(u * (double)(span - minutes + 1));
    }
    return RK_OK;
}

int rk_fleet_record(rk_telemetry *t, int gpu, double t0_s, size_t minutes, float *x, uint8_t *v,
                    float *score, size_t *steps, int *lost, rk_err *err)
{
    *steps = 0;
    *lost = 0;
    rk_monitor *mon = NULL;
    rk_monitor_opts mo = RK_MONITOR_OPTS_DEFAULT;
    mo.history = RK_FLEET_SCORE_HISTORY;
    int rc = rk_monitor_create(&mon, 1, &mo, err);
    if (rc)
        return rc;
    rk_sim *sim = rk_telemetry_sim_of(t);
    rk_gpu_sample s, prev;
    size_t n = 0;
    for (size_t m = 0; m < minutes; m++) {
        double tm = t0_s + (double)(m + 1) * 60.0;
        if (sim && (rc = rk_sim_set_time(sim, tm)) != RK_OK) {
            rk_err_set(err, rc, "dataset: the simulator refused minute %.0f", tm / 60.0);
            break;
        }
        if ((rc = rk_telemetry_read(t, gpu, &s, err)))
            break;
        if (s.lost) {
            *lost = 1;
            break;
        }
        if ((rc = rk_monitor_push(mon, 0, tm, &s, err)))
            break;
        if (rk_monitor_read_failed(&s))
            continue; /* no reading, no row (the monitor's rule) */
        rk_fleet_features(&s, n ? &prev : NULL, x + n * RK_FLEET_FEATURES,
                          v + n * RK_FLEET_FEATURES);
        score[n] = (float)rk_monitor_gpu_state(mon, 0)->score;
        prev = s;
        n++;
    }
    rk_monitor_free(mon);
    *steps = n;
    return rc;
}

/* Simulate GPU i alone (a fleet of the same seed and size, only GPU i read) and write its
 * history to `path`. */
static int run_gpu(const rk_fleet_data_opts *o, int i, const char *path, const char *events,
                   FILE *all, gpu_run *g, rk_err *err)
{
    memset(g, 0, sizeof *g);
    g->fail_minute = -1;
    g->pre_minute = -1;
    const size_t minutes = (size_t)llround(o->hours * 60.0);
    float *x = malloc((minutes ? minutes : 1) * RK_FLEET_FEATURES * sizeof *x);
    uint8_t *v = malloc((minutes ? minutes : 1) * RK_FLEET_FEATURES);
    float *score = malloc((minutes ? minutes : 1) * sizeof *score);
    int rc = RK_OK;
    if (!x || !v || !score) {
        rc = rk_err_set(err, RK_ENOMEM, "dataset: out of memory for %zu minutes", minutes);
        goto out;
    }
    if ((rc = place_history(o, i, events, &g->start_minute, err)))
        goto out;
    rk_telemetry *t = NULL;
    if ((rc = open_sim(o, events, &t, err)))
        goto out;
    rk_gpu_info info;
    rk_telemetry_info(t, i, &info);
    snprintf(g->uuid, sizeof g->uuid, "%s", info.uuid);
    snprintf(g->profile, sizeof g->profile, "%s", info.profile);
    size_t n = 0;
    const double t0 = (double)g->start_minute * 60.0;
    rc = rk_fleet_record(t, i, t0, minutes, x, v, score, &n, &g->lost, err);
    rk_telemetry_close(t); /* flushes the event log */
    if (rc)
        goto out;
    g->steps = n;
    double t_fail;
    if ((rc = scan_events(events, i, t0, t0 + (double)minutes * 60.0, all, g, &t_fail, err)))
        goto out;
    unlink(events);
    const int64_t shape[2] = {(int64_t)n, RK_FLEET_FEATURES}, shape1[1] = {(int64_t)n};
    rk_st_entry e[3] = {{"x", x, 2, shape, "F32"},
                        {"valid", v, 2, shape, "U8"},
                        {"score", score, 1, shape1, "F32"}};
    char fm[32], sm[32], pm[32];
    snprintf(fm, sizeof fm, "%ld", g->fail_minute);
    snprintf(sm, sizeof sm, "%ld", g->start_minute);
    snprintf(pm, sizeof pm, "%ld", g->pre_minute);
    const char *meta[] = {"format",
                          "rekindle-fleet-history",
                          "version",
                          "1",
                          "simulated",
                          "true",
                          "uuid",
                          g->uuid,
                          "profile",
                          g->profile,
                          "step_s",
                          "60",
                          "start_minute",
                          sm,
                          "failure_minute",
                          fm,
                          "failure_event",
                          g->fail_event,
                          "precursor_minute",
                          pm,
                          NULL};
    rc = rk_st_write(path, e, 3, meta, err);
out:
    free(x);
    free(v);
    free(score);
    return rc;
}

/* Assign splits: among failed and healthy GPUs separately, a seeded permutation, the first
 * round(n * test) to test, the next round(n * val) to val, the rest to train. */
static int assign_splits(const rk_fleet_data_opts *o, gpu_run *g, int n, rk_err *err)
{
    uint32_t *perm = malloc((size_t)n * sizeof *perm), *idx = malloc((size_t)n * sizeof *idx);
    if (!perm || !idx) {
        free(perm);
        free(idx);
        return rk_err_set(err, RK_ENOMEM, "dataset: out of memory");
    }
    for (int cls = 0; cls < 2; cls++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if ((g[i].fail_minute >= 0) == cls)
                idx[m++] = (uint32_t)i;
        rk_rng r;
        rk_rng_derive(&r, o->seed, 0x5917, (uint64_t)cls);
        rk_rng_permutation(&r, perm, (size_t)m);
        int nt = (int)lround(m * o->test_frac), nv = (int)lround(m * o->val_frac);
        for (int k = 0; k < m; k++)
            g[idx[perm[k]]].split = k < nt ? 2 : k < nt + nv ? 1 : 0;
    }
    free(perm);
    free(idx);
    return RK_OK;
}

static int write_manifest(const char *path, const rk_fleet_data_opts *o, const gpu_run *g,
                          rk_err *err)
{
    json_t *j = json_object(), *feat = json_array(), *dev = json_array();
    json_object_set_new(j, "format", json_string("rekindle-fleet-dataset"));
    json_object_set_new(j, "version", json_integer(1));
    json_object_set_new(j, "simulated", json_true());
    json_object_set_new(j, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(j, "gpus", json_integer(o->gpus));
    json_object_set_new(j, "hours", json_real(o->hours));
    json_object_set_new(j, "start_age_h", json_real(o->start_age_h));
    json_object_set_new(j, "span_h", json_real(o->span_h > o->hours ? o->span_h : o->hours));
    json_object_set_new(j, "step_s", json_integer(60));
    for (int k = 0; k < RK_FLEET_FEATURES; k++)
        json_array_append_new(feat, json_string(rk_fleet_feature_names[k]));
    json_object_set_new(j, "features", feat);
    for (int i = 0; i < o->gpus; i++) {
        json_t *d = json_object();
        char file[32];
        snprintf(file, sizeof file, "gpu-%04d.safetensors", i);
        json_object_set_new(d, "index", json_integer(i));
        json_object_set_new(d, "uuid", json_string(g[i].uuid));
        json_object_set_new(d, "profile", json_string(g[i].profile));
        json_object_set_new(d, "split", json_string(split_names[g[i].split]));
        json_object_set_new(d, "file", json_string(file));
        json_object_set_new(d, "start_minute", json_integer(g[i].start_minute));
        json_object_set_new(d, "steps", json_integer((json_int_t)g[i].steps));
        json_object_set_new(d, "lost", json_boolean(g[i].lost));
        if (g[i].fail_minute >= 0) {
            json_t *f = json_object();
            json_object_set_new(f, "minute", json_integer(g[i].fail_minute));
            json_object_set_new(f, "event", json_string(g[i].fail_event));
            json_object_set_new(f, "precursor_minute",
                                g[i].pre_minute >= 0 ? json_integer(g[i].pre_minute) : json_null());
            json_object_set_new(d, "failure", f);
        } else {
            json_object_set_new(d, "failure", json_null());
        }
        json_array_append_new(dev, d);
    }
    json_object_set_new(j, "devices", dev);
    char *text = json_dumps(j, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
    json_decref(j);
    if (!text)
        return rk_err_set(err, RK_ENOMEM, "dataset: out of memory for the manifest");
    size_t len = strlen(text);
    char *nl = realloc(text, len + 2);
    if (!nl) {
        free(text);
        return rk_err_set(err, RK_ENOMEM, "dataset: out of memory for the manifest");
    }
    nl[len] = '\n';
    int rc = rk_file_write_atomic(path, nl, len + 1, err);
    free(nl);
    return rc;
}

int rk_fleet_data_write(const rk_fleet_data_opts *o, rk_fleet_data_report *r, rk_err *err)
{
    const double t0 = rk_mono_s();
    memset(r, 0, sizeof *r);
    if (!o->dir || !*o->dir)
        return rk_err_set(err, RK_EINVAL, "dataset: no output directory");
    if (o->gpus < 1 || o->gpus > 1024)
        return rk_err_set(err, RK_EINVAL, "dataset: %d GPUs is not in [1, 1024]", o->gpus);
    if (!(o->hours > 0 && o->hours <= 100000) || o->hours * 60.0 < 1.0)
        return rk_err_set(err, RK_EINVAL, "dataset: %g hours is not in (0, 100000]", o->hours);
    if (!(o->start_age_h >= 0 && o->start_age_h <= 1e6))
        return rk_err_set(err, RK_EINVAL, "dataset: start age %g h is not in [0, 1e6]",
                          o->start_age_h);
    if (!(o->span_h == 0 || (o->span_h >= o->hours && o->span_h <= 200000)))
        return rk_err_set(err, RK_EINVAL,
                          "dataset: a span of %g hours must be at least the %g hours of history "
                          "and at most 200000",
                          o->span_h, o->hours);
    if (!(o->val_frac >= 0 && o->test_frac >= 0 && o->val_frac + o->test_frac < 1))
        return rk_err_set(err, RK_EINVAL,
                          "dataset: validation %g and test %g shares must be >= 0 and leave "
                          "some devices for training",
                          o->val_frac, o->test_frac);
    if (mkdir(o->dir, 0755) != 0 && errno != EEXIST)
        return rk_err_set(err, RK_EIO, "%s: cannot create: %s", o->dir, strerror(errno));
    struct stat sb;
    if (stat(o->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return rk_err_set(err, RK_EIO, "%s: not a directory", o->dir);

    size_t plen = strlen(o->dir) + 64;
    char *path = malloc(plen), *events = malloc(plen), *all_path = malloc(plen);
    gpu_run *g = calloc((size_t)o->gpus, sizeof *g);
    FILE *all = NULL;
    int rc = RK_OK;
    if (!path || !events || !all_path || !g) {
        rc = rk_err_set(err, RK_ENOMEM, "dataset: out of memory");
        goto out;
    }
    snprintf(events, plen, "%s/.events-one.jsonl", o->dir);
    snprintf(all_path, plen, "%s/events.jsonl", o->dir);
    if (!(all = fopen(all_path, "we"))) {
        rc = rk_err_set(err, RK_EIO, "%s: cannot write: %s", all_path, strerror(errno));
        goto out;
    }
    for (int i = 0; i < o->gpus; i++) {
        snprintf(path, plen, "%s/gpu-%04d.safetensors", o->dir, i);
        if ((rc = run_gpu(o, i, path, events, all, &g[i], err)))
            goto out;
        r->steps += g[i].steps;
        r->lost += g[i].lost;
        if (o->progress)
            o->progress(i, o->gpus, o->ctx);
    }
    if (fclose(all) != 0) {
        all = NULL;
        rc = rk_err_set(err, RK_EIO, "%s: write failed", all_path);
        goto out;
    }
    all = NULL;
    if ((rc = assign_splits(o, g, o->gpus, err)))
        goto out;
    for (int i = 0; i < o->gpus; i++) {
        r->devices[g[i].split]++;
        r->failed[g[i].split] += g[i].fail_minute >= 0;
    }
    r->gpus = o->gpus;
    snprintf(path, plen, "%s/fleet.json", o->dir);
    rc = write_manifest(path, o, g, err);
out:
    if (all)
        fclose(all);
    free(path);
    free(events);
    free(all_path);
    free(g);
    r->seconds = rk_mono_s() - t0;
    return rc;
}
