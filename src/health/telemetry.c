/*
 * Telemetry dispatch (rekindle/health.h): picks a backend's operation table, forwards to it,
 * and merges textfile sensors into every sample read, and for NVML the Xids since boot from
 * the kernel log (kmsg.c). Backends: nvml.c, sim.c.
 */
#include "rekindle/health.h"

#include "base/clock.h"
#include "health/kmsg.h"
#include "health/sim.h"

#include <stdlib.h>
#include <string.h>

struct rk_telemetry {
    const rk_telemetry_ops *ops;
    void *state;
    char *textfile_dir;
    rk_kmsg *kmsg; /* NVML only: the kernel log's Xids, kept across reads */
};

static const char *const field_names[RK_F_COUNT] = {
    "temp",           "fan",
    "power",          "power_limit",
    "sm_clock",       "mem_clock",
    "clock_reasons",  "util",
    "mem_used",       "mem_total",
    "ecc_corrected",  "ecc_uncorrected",
    "retired_pages",  "retired_pending",
    "remapped_rows",  "pcie_gen",
    "pcie_width",     "pcie_gen_max",
    "pcie_width_max", "pcie_replay",
    "energy",         "xid",
    "vrm_ripple",     "fan_vibration",
};

const char *rk_gpu_arch_name(rk_gpu_arch a)
{
    static const char *const names[] = {"unknown", "Kepler", "Maxwell", "Pascal", "Volta",
                                        "Turing",  "Ampere", "Ada",     "Hopper", "Blackwell"};
    return (unsigned)a < sizeof names / sizeof names[0] ? names[a] : "unknown";
}

const char *rk_field_name(rk_field f)
{
    return (unsigned)f < RK_F_COUNT ? field_names[f] : "?";
}

static int check_opts(const rk_telemetry_opts *o, rk_err *err)
{
    if (o->sim_gpus < 1 || o->sim_gpus > 1024)
        return rk_err_set(err, RK_EINVAL, "telemetry: %d simulated GPUs (1..1024)", o->sim_gpus);
    if (!(o->time_scale > 0) || o->time_scale > 1e9)
        return rk_err_set(err, RK_EINVAL, "telemetry: time scale %g (> 0, <= 1e9)", o->time_scale);
    if (!(o->start_age_h >= 0) || o->start_age_h > 1e6)
        return rk_err_set(err, RK_EINVAL, "telemetry: start age %g h (0..1e6)", o->start_age_h);
    return RK_OK;
}

int rk_telemetry_open(rk_telemetry **out, const char *backend, const rk_telemetry_opts *o,
                      rk_err *err)
{
    *out = NULL;
    const rk_telemetry_ops *ops = NULL;
    if (!backend || strcmp(backend, "auto") == 0 || strcmp(backend, "nvml") == 0)
        ops = &rk_telemetry_nvml;
    else if (strcmp(backend, "sim") == 0)
        ops = &rk_telemetry_sim;
    else
        return rk_err_set(err, RK_EINVAL, "telemetry: unknown backend '%.32s' (nvml, sim, auto)",
                          backend);
    return rk_telemetry_open_ops(out, ops, o, err);
}

int rk_telemetry_open_ops(rk_telemetry **out, const rk_telemetry_ops *ops,
                          const rk_telemetry_opts *o, rk_err *err)
{
    *out = NULL;
    rk_telemetry_opts def = RK_TELEMETRY_OPTS_DEFAULT;
    if (!o)
        o = &def;
    int rc = check_opts(o, err);
    if (rc)
        return rc;
    if (!ops || !ops->open || !ops->count || !ops->info || !ops->read || !ops->close)
        return rk_err_set(err, RK_EINVAL, "telemetry: a backend table without its operations");
    rk_telemetry *t = calloc(1, sizeof *t);
    if (!t)
        return rk_err_set(err, RK_ENOMEM, "telemetry: out of memory");
    t->ops = ops;
    if (o->textfile_dir && !(t->textfile_dir = strdup(o->textfile_dir))) {
        free(t);
        return rk_err_set(err, RK_ENOMEM, "telemetry: out of memory");
    }
    rc = ops->open(&t->state, o, err);
    if (rc) {
        free(t->textfile_dir);
        free(t);
        return rc;
    }
    *out = t;
    return RK_OK;
}

void rk_telemetry_close(rk_telemetry *t)
{
    if (!t)
        return;
    t->ops->close(t->state);
    rk_kmsg_free(t->kmsg);
    free(t->textfile_dir);
    free(t);
}

int rk_telemetry_count(const rk_telemetry *t)
{
    return t->ops->count(t->state);
}

const char *rk_telemetry_backend(const rk_telemetry *t)
{
    return t->ops->name;
}

const char *rk_telemetry_kmsg_source(const rk_telemetry *t, const char **note)
{
    if (note)
        *note = t && t->kmsg ? rk_kmsg_note(t->kmsg) : "";
    return t && t->kmsg ? rk_kmsg_source(t->kmsg) : NULL;
}

rk_sim *rk_telemetry_sim_of(rk_telemetry *t)
{
    return t && t->ops == &rk_telemetry_sim ? t->state : NULL;
}

double rk_telemetry_now(rk_telemetry *t)
{
    return t->ops->now ? t->ops->now(t->state) : rk_mono_s();
}

int rk_telemetry_info(const rk_telemetry *t, int i, rk_gpu_info *out)
{
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= t->ops->count(t->state))
        return RK_EINVAL;
    return t->ops->info(t->state, i, out);
}

int rk_telemetry_read(rk_telemetry *t, int i, rk_gpu_sample *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    int n = t->ops->count(t->state);
    if (i < 0 || i >= n)
        return rk_err_set(err, RK_EINVAL, "telemetry: GPU %d out of range (0..%d)", i, n - 1);
    return t->ops->read(t->state, i, out, err);
}

int rk_telemetry_read_all(rk_telemetry *t, rk_gpu_info *infos, rk_gpu_sample *samples, rk_err *err)
{
    int n = t->ops->count(t->state), first = RK_OK;
    rk_err e = {0};
    for (int i = 0; i < n; i++) {
        rk_telemetry_info(t, i, &infos[i]);
        int rc = rk_telemetry_read(t, i, &samples[i], &e);
        if (rc && !first) {
            first = rc;
            if (err)
                *err = e;
        }
    }
    if (t->ops == &rk_telemetry_nvml) { /* real cards only: the simulator keeps its own Xids */
        int rc = t->kmsg ? RK_OK : rk_kmsg_create(&t->kmsg, &e);
        if (!rc)
            rc = rk_kmsg_read(t->kmsg, &e);
        rk_kmsg_merge(t->kmsg, infos, samples, n);
        if (rc && !first) {
            first = rc;
            if (err)
                *err = e;
        }
    }
    if (t->textfile_dir) {
        int rc = rk_textfile_merge_dir(t->textfile_dir, infos, samples, n, &e);
        if (rc && !first) {
            first = rc;
            if (err)
                *err = e;
        }
    }
    return first;
}
