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

/* ---- Xids (docs/health.md, "Xids": keep the table there in step) -------------------------- */

static const struct xid_rule {
    int xid;
    int sev; /* rk_severity; RK_SEV_INFO: an application's error, ignored */
    const char *what;
} xid_rules[] = {
    {13, RK_SEV_INFO, "graphics engine exception"},
    {31, RK_SEV_INFO, "GPU memory page fault"},
    {43, RK_SEV_INFO, "GPU stopped processing"},
    {45, RK_SEV_INFO, "preemptive cleanup"},
    {48, RK_SEV_CRIT, "double-bit ECC error"},
    {61, RK_SEV_CRIT, "internal micro-controller breakpoint"},
    {62, RK_SEV_CRIT, "internal micro-controller halt"},
    {63, RK_SEV_WARN, "page retirement or row remapping event"},
    {64, RK_SEV_WARN, "page retirement or row remapping failure"},
    {68, RK_SEV_INFO, "video processor exception"},
    {74, RK_SEV_CRIT, "NVLink error"},
    {79, RK_SEV_CRIT, "fell off the bus"},
    {92, RK_SEV_WARN, "high single-bit ECC error rate"},
    {94, RK_SEV_WARN, "contained ECC error"},
    {95, RK_SEV_CRIT, "uncontained ECC error"},
    {119, RK_SEV_CRIT, "GSP RPC timeout"},
    {120, RK_SEV_CRIT, "GSP error"},
};

int rk_health_xid_class(int xid, const char **what)
{
    for (size_t i = 0; i < sizeof xid_rules / sizeof xid_rules[0]; i++)
        if (xid_rules[i].xid == xid) {
            if (what)
                *what = xid_rules[i].what;
            return xid_rules[i].sev;
        }
    if (what)
        *what = "";
    return -1;
}

/* What to do after a critical Xid: the bus (79) and the GSP are the riser and seating; the
 * memory codes retire the card. */
static const char *xid_action(int xid)
{
    switch (xid) {
    case 79: return "reseat the card, its riser and power cables; retire it if it falls off again";
    case 48:
    case 95: return "retire the card (its memory is failing)";
    default: return "read the Xid in the driver log; reseat; retire if it repeats";
    }
}

/* One finding per severity: "xid" (critical codes) and "xid_memory" (the memory codes that
 * warn), listing codes and counts. From xids[] when the kernel log was read, else from the
 * latest code only (NVML's events). */
static void score_xids(acc *a, const rk_gpu_sample *s)
{
    if (!rk_field_valid(s, RK_F_XID) || s->xid_count == 0)
        return;
    int codes[RK_XID_SLOTS];
    uint64_t counts[RK_XID_SLOTS];
    int n = 0;
    if (s->nxids > 0) {
        for (int k = 0; k < s->nxids && k < RK_XID_SLOTS; k++) {
            codes[n] = s->xids[k].xid;
            counts[n++] = s->xids[k].count;
        }
    } else {
        codes[n] = s->last_xid;
        counts[n++] = 0; /* unknown: the count of all events is xid_count */
    }
    for (int sev = RK_SEV_CRIT; sev >= RK_SEV_WARN; sev--) {
        char list[120] = "";
        size_t used = 0;
        int first = -1;
        for (int k = 0; k < n; k++) {
            const char *what;
            if (rk_health_xid_class(codes[k], &what) != sev)
                continue;
            if (first < 0)
                first = codes[k];
            int w = counts[k]
                        ? snprintf(list + used, sizeof list - used, "%s%d x%llu (%s)",
                                   used ? ", " : "", codes[k], (unsigned long long)counts[k], what)
                        : snprintf(list + used, sizeof list - used, "%s%d (%s)", used ? ", " : "",
                                   codes[k], what);
            if (w < 0 || (size_t)w >= sizeof list - used)
                break;
            used += (size_t)w;
        }
        if (first < 0)
            continue;
        if (sev == RK_SEV_CRIT)
            add(a, "xid", RK_SEV_CRIT, RK_HEALTH_XID_CRIT_PENALTY, xid_action(first),
                "critical Xid %s; %llu Xid events", list, (unsigned long long)s->xid_count);
        else
            add(a, "xid_memory", RK_SEV_WARN, RK_HEALTH_XID_WARN_PENALTY,
                "memory errors caught by ECC: watch it, reset the GPU to apply remapped rows",
                "memory Xid %s", list);
    }
}

/* ---- the burn-in (docs/burn.md) ------------------------------------------------------------ */

static void score_burn(acc *a, const rk_gpu_signals *g)
{
    if (!g || !g->burn_valid || g->burn_ok)
        return;
    add(a, "burn_failed", RK_SEV_CRIT, RK_HEALTH_BURN_FAILED_PENALTY,
        "wrong arithmetic under load: retire or down-clock and burn again",
        "the last burn-in was FAULTY: %.130s", g->burn_failed[0] ? g->burn_failed : "?");
}

/* ---- what steadies this card (docs/tune.md, "Which cards can") ------------------------------ */

/* The way to hold a worn card below the top of its clock/voltage curve, in the words of an
 * action: locked clocks where the card has them, else a clock offset, else a lower power
 * limit, else only the BIOS. Unknown routes name every one. */
static const char *steady(const rk_gpu_info *in, char *buf, size_t cap)
{
    if (!in || !(in->tune & RK_TUNE_KNOWN))
        return "lock clocks lower or lower the power limit (rk tune)";
    if (in->tune & RK_TUNE_LOCK_CLOCKS)
        return "lock clocks lower (rk tune --lock-clocks MHZ)";
    const char *no = in->arch != RK_ARCH_UNKNOWN ? rk_gpu_arch_name(in->arch) : "this card";
    if (in->tune & RK_TUNE_CLOCK_OFFSET)
        snprintf(buf, cap,
                 "lower its clock curve (rk tune --clock-offset -100; %s cannot lock "
                 "clocks)",
                 no);
    else if (in->tune & RK_TUNE_POWER_LIMIT)
        snprintf(buf, cap,
                 "lower the power limit (rk tune --power-limit W; %s cannot lock "
                 "clocks)",
                 no);
    else
        snprintf(buf, cap,
                 "only a BIOS with lower clocks steadies it (the driver sets no "
                 "clock or power limit here)");
    return buf;
}

#define V(f) rk_field_valid(s, RK_F_##f)

int rk_health_score(const rk_gpu_sample *s, const rk_gpu_signals *g, rk_finding *findings,
                    int *nfindings)
{
    return rk_health_score_gpu(NULL, s, g, findings, nfindings);
}

int rk_health_score_gpu(const rk_gpu_info *info, const rk_gpu_sample *s, const rk_gpu_signals *g,
                        rk_finding *findings, int *nfindings)
{
    acc a = {findings, 0, 0};
    char how[112], act[160];
    const char *steady_how = steady(info, how, sizeof how);
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
    if (g && g->hw_slowdown) {
        snprintf(act, sizeof act, "check the PSU and its cables; %s", steady_how);
        add(&a, "hw_slowdown", RK_SEV_WARN, 15, act, "hardware slowdown or power brake engaged");
    }
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
    else if (V(VRM_RIPPLE) && s->vrm_ripple_mv > 50) {
        snprintf(act, sizeof act, "VRM capacitors ageing: %s; plan a repair", steady_how);
        add(&a, "vrm_ripple", RK_SEV_WARN, 15, act, "VRM ripple %.0f mV (more than 50)",
            s->vrm_ripple_mv);
    }
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
    score_xids(&a, s);
    score_burn(&a, g);
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
    if (g && g->throttled_power && !g->hw_slowdown) {
        snprintf(act, sizeof act, "fine for a worn card; to steady it, %s", steady_how);
        add(&a, "power_capped", RK_SEV_INFO, 0, act, "clocks held at the power limit");
    }
    if (findings)
        qsort(findings, (size_t)a.n, sizeof *findings, worst_first);
    if (nfindings)
        *nfindings = a.n;
    int score = 100 - a.total;
    return score < 0 ? 0 : score;
}
