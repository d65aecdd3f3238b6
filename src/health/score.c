/*
 * The health score (rekindle/health.h): 100 minus documented penalties, each with a finding
 * that says what was seen and what to do. docs/health.md is the table of rules; keep both in
 * step.
 */
#include "rekindle/health.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *rk_severity_name(rk_severity s)
{
    switch (s) {
    case RK_SEV_INFO: return "info";
    case RK_SEV_WARN: return "warn";
    case RK_SEV_CRIT: return "crit";
    }
    return "?";
}

typedef struct acc {
    rk_finding *f;
    int n, total;
} acc;

static void add(acc *a, const char *code, rk_severity sev, int penalty, const char *action,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void add(acc *a, const char *code, rk_severity sev, int penalty, const char *action,
                const char *fmt, ...)
{
    a->total += penalty;
    if (!a->f || a->n >= RK_MAX_FINDINGS)
        return;
    rk_finding *f = &a->f[a->n++];
    memset(f, 0, sizeof *f);
    snprintf(f->code, sizeof f->code, "%s", code);
    f->severity = sev;
    f->penalty = penalty;
    snprintf(f->action, sizeof f->action, "%s", action);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->message, sizeof f->message, fmt, ap);
    va_end(ap);
}

static int worst_first(const void *x, const void *y)
{
    const rk_finding *a = x, *b = y;
    if (a->severity != b->severity)
        return (int)b->severity - (int)a->severity;
    return b->penalty - a->penalty;
}

/* Critical Xid codes: the ones that mean hardware or a lost GPU, not an application bug. */
static bool xid_critical(int x)
{
    static const int crit[] = {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120};
    for (size_t i = 0; i < sizeof crit / sizeof crit[0]; i++)
        if (crit[i] == x)
            return true;
    return false;
}

#define V(f) rk_field_valid(s, RK_F_##f)

int rk_health_score(const rk_gpu_sample *s, const rk_gpu_signals *g, rk_finding *findings,
                    int *nfindings)
{
    acc a = {findings, 0, 0};
    if (s->lost) {
        add(&a, "gpu_lost", RK_SEV_CRIT, 100,
            "reseat the card, its riser and power cables; retire it if it falls off again",
            "the GPU is gone (fell off the bus or shut down)");
        if (nfindings)
            *nfindings = a.n;
        return 0;
    }
    if (V(TEMP) && s->temp_c >= RK_HEALTH_TEMP_CRIT_C)
        add(&a, "thermal_critical", RK_SEV_CRIT, 40,
            "stop it; clean the heatsink, repaste, check the case airflow",
            "core at %.0f C (%d C or more)", s->temp_c, RK_HEALTH_TEMP_CRIT_C);
    else if (V(TEMP) && s->temp_c >= RK_HEALTH_TEMP_WARN_C)
        add(&a, "thermal_high", RK_SEV_WARN, 20, "clean the heatsink and repaste; check airflow",
            "core at %.0f C (%d C or more)", s->temp_c, RK_HEALTH_TEMP_WARN_C);
    if (g && g->dtdt_valid && g->dtdt_c_per_min > 15)
        add(&a, "thermal_paste", RK_SEV_WARN, 15,
            "heats too fast for its load: clean and repaste (dried thermal interface)",
            "temperature rising %.1f C/min (more than 15)", g->dtdt_c_per_min);
    if (g && g->throttled_thermal)
        add(&a, "throttling_thermal", RK_SEV_WARN, 10, "clean and repaste; lower the power limit",
            "clocks held down by temperature");
    if (g && g->hw_slowdown)
        add(&a, "hw_slowdown", RK_SEV_WARN, 15,
            "check the PSU and its cables; lock clocks lower (e.g. 1506 MHz)",
            "hardware slowdown or power brake engaged");
    if (V(FAN_VIB) && s->fan_vib_hz > 400)
        add(&a, "fan_bearing", RK_SEV_CRIT, 30, "replace the fan now",
            "fan vibration at %.0f Hz (more than 400: bearing failing)", s->fan_vib_hz);
    else if (V(FAN_VIB) && s->fan_vib_hz > 250)
        add(&a, "fan_bearing", RK_SEV_WARN, 15, "replace the fan",
            "fan vibration at %.0f Hz (more than 250: bearing wear)", s->fan_vib_hz);
    if (V(VRM_RIPPLE) && s->vrm_ripple_mv > 100)
        add(&a, "vrm_ripple", RK_SEV_CRIT, 35,
            "retire the card or replace the VRM capacitors: expect wrong arithmetic",
            "VRM ripple %.0f mV (more than 100)", s->vrm_ripple_mv);
    else if (V(VRM_RIPPLE) && s->vrm_ripple_mv > 50)
        add(&a, "vrm_ripple", RK_SEV_WARN, 15,
            "VRM capacitors ageing: lower the power limit, lock clocks, plan a repair",
            "VRM ripple %.0f mV (more than 50)", s->vrm_ripple_mv);
    if (V(ECC_UNCORRECTED) && s->ecc_uncorrected > 0)
        add(&a, "ecc_uncorrected", RK_SEV_CRIT, 30, "retire the card (its memory is failing)",
            "%llu uncorrected ECC errors", (unsigned long long)s->ecc_uncorrected);
    if (g && g->ecc_rate_valid && g->ecc_corrected_per_h > 10)
        add(&a, "ecc_corrected_rate", RK_SEV_WARN, 10, "watch it; plan to retire the card",
            "%.1f corrected ECC errors per hour (more than 10)", g->ecc_corrected_per_h);
    if (V(RETIRED) && s->retired_pages >= 60)
        add(&a, "retired_pages", RK_SEV_CRIT, 25, "retire the card (page retirement exhausted)",
            "%llu pages retired (60 is the limit)", (unsigned long long)s->retired_pages);
    else if (V(RETIRED) && s->retired_pages >= 15)
        add(&a, "retired_pages", RK_SEV_WARN, 10, "plan to retire the card",
            "%llu pages retired (15 or more)", (unsigned long long)s->retired_pages);
    if (V(RETIRED_PENDING) && s->retired_pending)
        add(&a, "retired_pending", RK_SEV_WARN, 15, "reset the GPU (or reboot) to retire the pages",
            "a page retirement waits for a GPU reset");
    if (V(REMAPPED) && s->remapped_rows > 0)
        add(&a, "remapped_rows", RK_SEV_INFO, 5, "watch it", "%llu memory rows remapped",
            (unsigned long long)s->remapped_rows);
    if (g && g->downtrained)
        add(&a, "pcie_downtrained", RK_SEV_WARN, 20,
            "reseat or replace the riser; force Gen3 in the BIOS",
            "PCIe link Gen%d x%d, the card and slot can do Gen%d x%d", s->pcie_gen, s->pcie_width,
            s->pcie_gen_max, s->pcie_width_max);
    if (g && g->replay_rate_valid && g->replay_per_min > g->replay_limit_per_min)
        add(&a, "pcie_replays", RK_SEV_WARN, 15, "reseat or replace the riser; force Gen3",
            "%.1f PCIe replays a minute (limit %.1f for Gen%d x%d)", g->replay_per_min,
            g->replay_limit_per_min, s->pcie_gen, s->pcie_width);
    if (V(XID) && s->xid_count > 0 && xid_critical(s->last_xid))
        add(&a, "xid", RK_SEV_CRIT, 20,
            "read the Xid in the driver log; reseat; retire if it repeats",
            "critical Xid %d (%llu Xid events)", s->last_xid, (unsigned long long)s->xid_count);
    if (g && g->fail_prob_valid && g->fail_prob >= 0.2 && g->fail_prob <= 1) {
        char within[48] = "within its horizon";
        if (g->fail_horizon_min > 0 && isfinite(g->fail_horizon_min))
            snprintf(within, sizeof within, "within %.0f min", g->fail_horizon_min);
        if (g->fail_prob >= RK_HEALTH_FAIL_PROB_PREDICTED)
            add(&a, "failure_predicted", RK_SEV_CRIT, 45,
                "drain its jobs, back up, replace or repair",
                "the predictor gives p=%.2f of failing %s", g->fail_prob, within);
        else
            add(&a, "failure_risk", RK_SEV_WARN, (int)lround(50 * g->fail_prob),
                "watch it: check its other findings, plan a repair",
                "the predictor gives p=%.2f of failing %s (%.1f or more predicts a failure)",
                g->fail_prob, within, RK_HEALTH_FAIL_PROB_PREDICTED);
    }
    if (g && g->throttled_power && !g->hw_slowdown)
        add(&a, "power_capped", RK_SEV_INFO, 0,
            "fine for a worn card; to steady it, lock clocks (e.g. rk tune --lock-clocks 1506)",
            "clocks held at the power limit");
    if (findings)
        qsort(findings, (size_t)a.n, sizeof *findings, worst_first);
    if (nfindings)
        *nfindings = a.n;
    int score = 100 - a.total;
    return score < 0 ? 0 : score;
}
