/*
 * Prometheus text format 0.0.4 encoding of the node's GPU state (exporter/exporter.h). The
 * metric names, types, units and labels are the contract in docs/metrics.md: keep the two in
 * step. Relies on rekindle/health.h for samples, signals and scores; does no I/O.
 */
#include "exporter/exporter.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"

/* ---- buffer ------------------------------------------------------------------------------- */

void rk_buf_free(rk_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static bool buf_reserve(rk_buf *b, size_t extra)
{
    if (b->failed)
        return false;
    if (extra >= (size_t)-1 / 2 - b->len) {
        b->failed = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void rk_buf_put(rk_buf *b, const char *s, size_t len)
{
    if (!buf_reserve(b, len))
        return;
    memcpy(b->p + b->len, s, len);
    b->len += len;
    b->p[b->len] = '\0';
}

static void buf_puts(rk_buf *b, const char *s)
{
    rk_buf_put(b, s, strlen(s));
}

void rk_buf_printf(rk_buf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        rk_buf_put(b, small, (size_t)n);
        return;
    }
    if (!buf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* ---- values and labels -------------------------------------------------------------------- */

bool rk_prom_format_value(double v, char *buf, size_t cap)
{
    if (!isfinite(v) || cap < 32) {
        if (cap)
            buf[0] = '\0';
        return false;
    }
    if (v == 0) { /* also -0, which would print as "-0" */
        snprintf(buf, cap, "0");
        return true;
    }
    if (fabs(v) < 1e15 && v == floor(v)) {
        snprintf(buf, cap, "%.0f", v);
        return true;
    }
    snprintf(buf, cap, "%.15g", v);
    if (strtod(buf, NULL) != v)
        snprintf(buf, cap, "%.17g", v);
    return true;
}

void rk_prom_escape_label(rk_buf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        const unsigned char *run = p; /* copy plain bytes in runs */
        while (*p && *p != '\\' && *p != '"' && *p != '\n' && *p < 0x80)
            p++;
        if (p > run)
            rk_buf_put(b, (const char *)run, (size_t)(p - run));
        if (!*p)
            break;
        switch (*p) {
        case '\\': rk_buf_put(b, "\\\\", 2), p++; break;
        case '"': rk_buf_put(b, "\\\"", 2), p++; break;
        case '\n': rk_buf_put(b, "\\n", 2), p++; break;
        default: {
            size_t n = rk_utf8_next(p, 4, NULL); /* stops at the NUL */
            if (n) {
                rk_buf_put(b, (const char *)p, n);
                p += n;
            } else {
                rk_buf_put(b, "\xef\xbf\xbd", 3); /* U+FFFD */
                p++;
            }
        }
        }
    }
}

/* ---- metric families ---------------------------------------------------------------------- */

/* The per-GPU metrics in output order (docs/metrics.md). The special ones (info, up, score,
 * findings, clock events) are rendered by their own code; the rest are one value per GPU. */
enum metric_id {
    M_INFO,
    M_UP,
    M_SCORE,
    M_FINDINGS,
    M_FAIL_PROB,
    M_TEMP,
    M_TEMP_RATE,
    M_FAN,
    M_FAN_VIB,
    M_POWER,
    M_POWER_LIMIT,
    M_SM_CLOCK,
    M_MEM_CLOCK,
    M_CLOCK_EVENT,
    M_UTIL,
    M_MEM_USED,
    M_MEM_TOTAL,
    M_ECC_CORR,
    M_ECC_UNCORR,
    M_ECC_CORR_RATE,
    M_RETIRED,
    M_RETIRED_PENDING,
    M_REMAPPED,
    M_PCIE_GEN,
    M_PCIE_GEN_MAX,
    M_PCIE_WIDTH,
    M_PCIE_WIDTH_MAX,
    M_PCIE_DOWNTRAINED,
    M_PCIE_REPLAYS,
    M_PCIE_REPLAY_RATE,
    M_PCIE_REPLAY_LIMIT,
    M_ENERGY,
    M_XID,
    M_LAST_XID,
    M_XID_ERRORS,
    M_BURN_OK,
    M_BURN_TS,
    M_VRM_RIPPLE,
    M_COUNT
};

typedef struct metric {
    const char *name, *type, *help;
} metric;

static const metric metrics[M_COUNT] = {
    [M_INFO] = {"rk_gpu_info", "gauge",
                "What each GPU is: always 1, with labels profile (simulated fleets) and backend."},
    [M_UP] = {"rk_gpu_up", "gauge",
              "1 while the GPU answers, 0 once it is lost (fell off the bus) or its read failed."},
    [M_SCORE] = {"rk_gpu_health_score", "gauge",
                 "Health score 0-100, 100 healthy (docs/health.md)."},
    [M_FINDINGS] = {"rk_gpu_health_findings", "gauge",
                    "One series per finding that took points off the health score, by code and "
                    "severity; the value is the penalty in points (count() gives the number of "
                    "findings)."},
    [M_FAIL_PROB] = {"rk_gpu_failure_probability", "gauge",
                     "A model's estimate, not a measurement: the failure predictor's probability "
                     "(0-1) that the GPU fails within its horizon (60 minutes unless the model "
                     "was trained for another; docs/predict.md), from its last minutes of "
                     "readings; absent until the GPU's window of minutes is full."},
    [M_TEMP] = {"rk_gpu_temperature_celsius", "gauge", "GPU core temperature in celsius."},
    [M_TEMP_RATE] = {"rk_gpu_temperature_rate_celsius_per_second", "gauge",
                     "dT/dt of the core temperature, least squares over the sample window."},
    [M_FAN] = {"rk_gpu_fan_speed_ratio", "gauge", "Fan speed, 0-1 of its maximum."},
    [M_FAN_VIB] = {"rk_gpu_fan_vibration_hertz", "gauge",
                   "Dominant fan vibration frequency (textfile sensor or simulator)."},
    [M_POWER] = {"rk_gpu_power_watts", "gauge", "Board power draw in watts."},
    [M_POWER_LIMIT] = {"rk_gpu_power_limit_watts", "gauge", "Enforced power limit in watts."},
    [M_SM_CLOCK] = {"rk_gpu_sm_clock_hertz", "gauge", "SM clock in hertz."},
    [M_MEM_CLOCK] = {"rk_gpu_memory_clock_hertz", "gauge", "Memory clock in hertz."},
    [M_CLOCK_EVENT] = {"rk_gpu_clock_event_active", "gauge",
                       "1 while the clock event (throttle) reason is active, else 0."},
    [M_UTIL] = {"rk_gpu_utilization_ratio", "gauge", "GPU utilisation, 0-1."},
    [M_MEM_USED] = {"rk_gpu_memory_used_bytes", "gauge", "Device memory in use, bytes."},
    [M_MEM_TOTAL] = {"rk_gpu_memory_total_bytes", "gauge", "Device memory in total, bytes."},
    [M_ECC_CORR] = {"rk_gpu_ecc_corrected_errors_total", "counter",
                    "Corrected (single-bit) ECC errors."},
    [M_ECC_UNCORR] = {"rk_gpu_ecc_uncorrected_errors_total", "counter",
                      "Uncorrected (double-bit) ECC errors."},
    [M_ECC_CORR_RATE] = {"rk_gpu_ecc_corrected_errors_per_second", "gauge",
                         "Corrected ECC errors per second over the sample window."},
    [M_RETIRED] = {"rk_gpu_retired_pages", "gauge", "Memory pages retired."},
    [M_RETIRED_PENDING] = {"rk_gpu_retired_pages_pending", "gauge",
                           "1 if a page retirement waits for a GPU reset, else 0."},
    [M_REMAPPED] = {"rk_gpu_remapped_rows", "gauge", "Memory rows remapped."},
    [M_PCIE_GEN] = {"rk_gpu_pcie_link_generation", "gauge", "Current PCIe link generation."},
    [M_PCIE_GEN_MAX] = {"rk_gpu_pcie_link_generation_max", "gauge",
                        "Highest PCIe link generation the card and slot can do."},
    [M_PCIE_WIDTH] = {"rk_gpu_pcie_link_width", "gauge", "Current PCIe link width, lanes."},
    [M_PCIE_WIDTH_MAX] = {"rk_gpu_pcie_link_width_max", "gauge",
                          "Widest PCIe link the card and slot can do, lanes."},
    [M_PCIE_DOWNTRAINED] = {"rk_gpu_pcie_link_downtrained", "gauge",
                            "1 if the PCIe link runs below its maximum (docs/health.md), else 0."},
    [M_PCIE_REPLAYS] = {"rk_gpu_pcie_replays_total", "counter", "PCIe replay counter."},
    [M_PCIE_REPLAY_RATE] = {"rk_gpu_pcie_replays_per_second", "gauge",
                            "PCIe replays per second over the sample window."},
    [M_PCIE_REPLAY_LIMIT] = {"rk_gpu_pcie_replay_limit_per_second", "gauge",
                             "PCIe replays per second judged bad for this link's generation and "
                             "width (docs/health.md)."},
    [M_ENERGY] = {"rk_gpu_energy_joules_total", "counter",
                  "Energy used since the driver loaded, joules."},
    [M_XID] = {"rk_gpu_xid_events_total", "counter", "Xid events seen."},
    [M_LAST_XID] = {"rk_gpu_last_xid", "gauge", "The code of the latest Xid event."},
    [M_XID_ERRORS] = {"rk_gpu_xid_errors_total", "counter",
                      "Xid events by code (label xid) since boot, from the kernel log "
                      "(docs/health.md, \"Past Xids\"); the most frequent codes of each GPU."},
    [M_BURN_OK] = {"rk_gpu_burn_ok", "gauge",
                   "1 if the GPU's last burn-in (rk burn, docs/burn.md) passed, 0 if it was "
                   "FAULTY; absent without a record."},
    [M_BURN_TS] = {"rk_gpu_burn_timestamp_seconds", "gauge",
                   "When the GPU's last burn-in ended, Unix time; absent without a record."},
    [M_VRM_RIPPLE] = {"rk_gpu_vrm_ripple_volts", "gauge",
                      "VRM output ripple, volts peak to peak (textfile sensor or simulator)."},
};

/* The clock event reasons, label value and bit, in docs/metrics.md's order. */
static const struct {
    const char *reason;
    uint64_t bit;
} clock_reasons[] = {
    {"gpu_idle", RK_CLOCK_GPU_IDLE},         {"app_setting", RK_CLOCK_APP_SETTING},
    {"sw_power_cap", RK_CLOCK_SW_POWER_CAP}, {"hw_slowdown", RK_CLOCK_HW_SLOWDOWN},
    {"sync_boost", RK_CLOCK_SYNC_BOOST},     {"sw_thermal", RK_CLOCK_SW_THERMAL},
    {"hw_thermal", RK_CLOCK_HW_THERMAL},     {"hw_power_brake", RK_CLOCK_HW_POWER_BRAKE},
};

/* A GPU that answered this cycle: its fields and signals are exposed. */
static bool answering(const rk_prom_gpu *g)
{
    return !g->sample.lost && g->sample.valid != 0;
}

static bool has(const rk_prom_gpu *g, rk_field f)
{
    return answering(g) && rk_field_valid(&g->sample, f);
}

/* The value of a plain per-GPU metric, false when absent. */
static bool gpu_value(int id, const rk_prom_gpu *g, double *v)
{
    const rk_gpu_sample *s = &g->sample;
    const rk_gpu_signals *q = &g->sig;
    bool sig = answering(g) && g->has_signals;
    switch (id) {
    case M_TEMP: *v = s->temp_c; return has(g, RK_F_TEMP);
    case M_TEMP_RATE: *v = q->dtdt_c_per_min / 60.0; return sig && q->dtdt_valid;
    case M_FAN: *v = s->fan_pct / 100.0; return has(g, RK_F_FAN);
    case M_FAN_VIB: *v = s->fan_vib_hz; return has(g, RK_F_FAN_VIB);
    case M_POWER: *v = s->power_w; return has(g, RK_F_POWER);
    case M_POWER_LIMIT: *v = s->power_limit_w; return has(g, RK_F_POWER_LIMIT);
    case M_SM_CLOCK: *v = s->sm_mhz * 1e6; return has(g, RK_F_SM_CLOCK);
    case M_MEM_CLOCK: *v = s->mem_mhz * 1e6; return has(g, RK_F_MEM_CLOCK);
    case M_UTIL: *v = s->util_pct / 100.0; return has(g, RK_F_UTIL);
    case M_MEM_USED: *v = (double)s->mem_used_bytes; return has(g, RK_F_MEM_USED);
    case M_MEM_TOTAL: *v = (double)s->mem_total_bytes; return has(g, RK_F_MEM_TOTAL);
    case M_ECC_CORR: *v = (double)s->ecc_corrected; return has(g, RK_F_ECC_CORRECTED);
    case M_ECC_UNCORR: *v = (double)s->ecc_uncorrected; return has(g, RK_F_ECC_UNCORRECTED);
    case M_ECC_CORR_RATE: *v = q->ecc_corrected_per_h / 3600.0; return sig && q->ecc_rate_valid;
    case M_RETIRED: *v = (double)s->retired_pages; return has(g, RK_F_RETIRED);
    case M_RETIRED_PENDING: *v = s->retired_pending ? 1 : 0; return has(g, RK_F_RETIRED_PENDING);
    case M_REMAPPED: *v = (double)s->remapped_rows; return has(g, RK_F_REMAPPED);
    case M_PCIE_GEN: *v = s->pcie_gen; return has(g, RK_F_PCIE_GEN);
    case M_PCIE_GEN_MAX: *v = s->pcie_gen_max; return has(g, RK_F_PCIE_GEN_MAX);
    case M_PCIE_WIDTH: *v = s->pcie_width; return has(g, RK_F_PCIE_WIDTH);
    case M_PCIE_WIDTH_MAX: *v = s->pcie_width_max; return has(g, RK_F_PCIE_WIDTH_MAX);
    case M_PCIE_DOWNTRAINED:
        /* judged only when the link can be compared with its maximum */
        *v = q->downtrained ? 1 : 0;
        return sig && ((has(g, RK_F_PCIE_GEN) && has(g, RK_F_PCIE_GEN_MAX)) ||
                       (has(g, RK_F_PCIE_WIDTH) && has(g, RK_F_PCIE_WIDTH_MAX)));
    case M_PCIE_REPLAYS: *v = (double)s->pcie_replay; return has(g, RK_F_PCIE_REPLAY);
    case M_PCIE_REPLAY_RATE: *v = q->replay_per_min / 60.0; return sig && q->replay_rate_valid;
    case M_PCIE_REPLAY_LIMIT:
        /* the limit the replay counter is judged against: only where there is a counter */
        *v = q->replay_limit_per_min / 60.0;
        return sig && has(g, RK_F_PCIE_REPLAY);
    case M_ENERGY: *v = s->energy_j; return has(g, RK_F_ENERGY);
    case M_XID: *v = (double)s->xid_count; return has(g, RK_F_XID);
    case M_LAST_XID: /* no latest code before the first event */
        *v = s->last_xid;
        return has(g, RK_F_XID) && s->xid_count > 0;
    case M_VRM_RIPPLE: *v = s->vrm_ripple_mv / 1000.0; return has(g, RK_F_VRM_RIPPLE);
    case M_BURN_OK: *v = q->burn_ok ? 1 : 0; return answering(g) && q->burn_valid;
    case M_BURN_TS: *v = q->burn_when; return answering(g) && q->burn_valid && q->burn_when > 0;
    case M_FAIL_PROB: /* not derived from the window: present without signals too */
        *v = q->fail_prob;
        return answering(g) && q->fail_prob_valid && q->fail_prob >= 0 && q->fail_prob <= 1;
    default: return false;
    }
}

/* Writes a family's HELP and TYPE lines before its first series. */
typedef struct family {
    rk_buf *b;
    const metric *m;
    bool started;
} family;

static void family_begin(family *f)
{
    if (f->started)
        return;
    f->started = true;
    rk_buf_printf(f->b, "# HELP %s %s\n# TYPE %s %s\n", f->m->name, f->m->help, f->m->name,
                  f->m->type);
}

/* `name{gpu="0",uuid="...",name="...",simulated="true"` (no closing brace). */
static void gpu_labels(rk_buf *b, const char *metric_name, const rk_prom_gpu *g)
{
    rk_buf_printf(b, "%s{gpu=\"%d\",uuid=\"", metric_name, g->info.index);
    rk_prom_escape_label(b, g->info.uuid);
    buf_puts(b, "\",name=\"");
    rk_prom_escape_label(b, g->info.name);
    buf_puts(b, g->info.simulated ? "\",simulated=\"true\"" : "\",simulated=\"false\"");
}

static void label(rk_buf *b, const char *key, const char *value)
{
    rk_buf_printf(b, ",%s=\"", key);
    rk_prom_escape_label(b, value);
    buf_puts(b, "\"");
}

/* One series: labels already written up to the closing brace; writes "} value\n". */
static void series_end(rk_buf *b, double v)
{
    char num[40];
    rk_prom_format_value(v, num, sizeof num);
    rk_buf_printf(b, "} %s\n", num);
}

static void render_info(rk_buf *b, const rk_prom_gpu *g, int n)
{
    family f = {b, &metrics[M_INFO], false};
    for (int i = 0; i < n; i++) {
        family_begin(&f);
        gpu_labels(b, f.m->name, &g[i]);
        if (g[i].info.profile[0])
            label(b, "profile", g[i].info.profile);
        if (g[i].info.backend && g[i].info.backend[0])
            label(b, "backend", g[i].info.backend);
        series_end(b, 1);
    }
}

static void render_up(rk_buf *b, const rk_prom_gpu *g, int n)
{
    family f = {b, &metrics[M_UP], false};
    for (int i = 0; i < n; i++) {
        family_begin(&f);
        gpu_labels(b, f.m->name, &g[i]);
        series_end(b, answering(&g[i]) ? 1 : 0);
    }
}

static void render_score(rk_buf *b, const rk_prom_gpu *g, int n)
{
    family f = {b, &metrics[M_SCORE], false};
    for (int i = 0; i < n; i++) {
        if (!g[i].has_score)
            continue;
        family_begin(&f);
        gpu_labels(b, f.m->name, &g[i]);
        series_end(b, g[i].score);
    }
}

/* One series per (code, severity): a repeated pair (not made by rk_health_score, but cheap to
 * guard against: a duplicate series would make the whole scrape invalid) adds its penalty to
 * the first. */
static void render_findings(rk_buf *b, const rk_prom_gpu *g, int n)
{
    family f = {b, &metrics[M_FINDINGS], false};
    for (int i = 0; i < n; i++) {
        if (!answering(&g[i]) || !g[i].has_score)
            continue;
        int nf = g[i].nfindings < 0 ? 0 : g[i].nfindings;
        if (nf > RK_MAX_FINDINGS)
            nf = RK_MAX_FINDINGS;
        const rk_finding *fs = g[i].findings;
        for (int k = 0; k < nf; k++) {
            bool seen = false;
            for (int j = 0; j < k && !seen; j++)
                seen = fs[j].severity == fs[k].severity &&
                       strncmp(fs[j].code, fs[k].code, sizeof fs[k].code) == 0;
            if (seen)
                continue;
            double penalty = fs[k].penalty;
            for (int j = k + 1; j < nf; j++)
                if (fs[j].severity == fs[k].severity &&
                    strncmp(fs[j].code, fs[k].code, sizeof fs[k].code) == 0)
                    penalty += fs[j].penalty;
            char code[sizeof fs[k].code + 1];
            memcpy(code, fs[k].code, sizeof fs[k].code);
            code[sizeof fs[k].code] = '\0';
            family_begin(&f);
            gpu_labels(b, f.m->name, &g[i]);
            label(b, "code", code);
            label(b, "severity", rk_severity_name(fs[k].severity));
            series_end(b, penalty);
        }
    }
}

static void render_clock_events(rk_buf *b, const rk_prom_gpu *g, int n)
{
    family f = {b, &metrics[M_CLOCK_EVENT], false};
    for (int i = 0; i < n; i++) {
        if (!has(&g[i], RK_F_CLOCK_REASONS))
            continue;
        family_begin(&f);
        for (size_t r = 0; r < sizeof clock_reasons / sizeof clock_reasons[0]; r++) {
            gpu_labels(b, f.m->name, &g[i]);
            label(b, "reason", clock_reasons[r].reason);
            series_end(b, (g[i].sample.clock_reasons & clock_reasons[r].bit) ? 1 : 0);
        }
    }
}

/* One series per Xid code the kernel log counted for the GPU (xids[]). */
static void render_xid_errors(rk_buf *b, const rk_prom_gpu *g, int n)
{
    family f = {b, &metrics[M_XID_ERRORS], false};
    for (int i = 0; i < n; i++) {
        if (!has(&g[i], RK_F_XID))
            continue;
        const rk_gpu_sample *s = &g[i].sample;
        for (int k = 0; k < s->nxids && k < RK_XID_SLOTS; k++) {
            bool seen = false; /* a code twice would make the scrape invalid */
            for (int j = 0; j < k && !seen; j++)
                seen = s->xids[j].xid == s->xids[k].xid;
            if (seen)
                continue;
            char code[16];
            snprintf(code, sizeof code, "%d", s->xids[k].xid);
            family_begin(&f);
            gpu_labels(b, f.m->name, &g[i]);
            label(b, "xid", code);
            series_end(b, (double)s->xids[k].count);
        }
    }
}

static void render_plain(rk_buf *b, int id, const rk_prom_gpu *g, int n)
{
    family f = {b, &metrics[id], false};
    for (int i = 0; i < n; i++) {
        double v;
        if (!gpu_value(id, &g[i], &v) || !isfinite(v))
            continue;
        family_begin(&f);
        gpu_labels(b, f.m->name, &g[i]);
        series_end(b, v);
    }
}

void rk_prom_render_gpus(rk_buf *b, const rk_prom_gpu *g, int n)
{
    for (int id = 0; id < M_COUNT; id++) {
        switch (id) {
        case M_INFO: render_info(b, g, n); break;
        case M_UP: render_up(b, g, n); break;
        case M_SCORE: render_score(b, g, n); break;
        case M_FINDINGS: render_findings(b, g, n); break;
        case M_CLOCK_EVENT: render_clock_events(b, g, n); break;
        case M_XID_ERRORS: render_xid_errors(b, g, n); break;
        default: render_plain(b, id, g, n); break;
        }
    }
}

static void stat_line(rk_buf *b, const char *name, const char *type, const char *help, double v)
{
    char num[40];
    if (!rk_prom_format_value(v, num, sizeof num))
        return;
    rk_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, type, name, num);
}

void rk_prom_render_stats(rk_buf *b, const rk_prom_stats *s)
{
    stat_line(b, "rk_exporter_collections_total", "counter", "Collection cycles run.",
              (double)s->collections);
    stat_line(b, "rk_exporter_collection_errors_total", "counter",
              "Collection cycles in which a GPU read or a textfile failed.", (double)s->errors);
    if (s->duration_s >= 0)
        stat_line(b, "rk_exporter_collection_duration_seconds", "gauge",
                  "Wall time of the last collection cycle (read, score, render).", s->duration_s);
    if (s->last_ts > 0)
        stat_line(b, "rk_exporter_last_collection_timestamp_seconds", "gauge",
                  "When the last collection cycle ended, Unix time.", s->last_ts);
    stat_line(b, "rk_exporter_gpus", "gauge", "GPUs watched.", s->gpus);
}

/* ---- assessment --------------------------------------------------------------------------- */

void rk_prom_gpu_from_monitor(rk_prom_gpu *g, const rk_gpu_info *info, const rk_monitor_gpu *m)
{
    memset(g, 0, sizeof *g);
    g->info = *info;
    if (m->current) { /* this cycle's reading; a failed one leaves the sample empty */
        g->sample = m->latest;
        g->has_signals = !m->latest.lost;
        g->sig = m->sig;
    }
    g->has_score = m->has_score;
    g->score = m->score;
    g->nfindings = m->nfindings;
    memcpy(g->findings, m->findings, sizeof g->findings);
}
