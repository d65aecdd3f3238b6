/*
 * Tests for the exporter's Prometheus text encoding (src/exporter/prom.c, docs/metrics.md):
 * the exact text for one hand-made GPU (HELP/TYPE lines, base units, label escaping of a name
 * with quotes, backslashes and a newline, absent fields giving no series); a lost GPU giving
 * rk_gpu_up 0 and only info/up/score; a failed read giving info and up 0 only; values never
 * NaN or Inf and always reading back to the same double; families grouped with one HELP and
 * TYPE each; duplicate findings merged; the failure predictor's probability served and
 * scored only when known; and the exporter's own counters.
 *
 * The test executables link librekindle but not the exporter library, so the encoder is
 * compiled in here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exporter/exporter.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* The exporter's path for one GPU: readings through a health monitor (rekindle/monitor.h),
 * with a scripted predictor probability when p is not NULL (p[k] for reading k), into
 * rk_prom_gpu_from_monitor, as the collector does. */
static const double *script_p;
static int script_k;
static int script_push(void *ctx, int gpu, double t, const rk_gpu_sample *s, double *prob,
                       rk_err *err)
{
    (void)ctx, (void)gpu, (void)t, (void)s, (void)err;
    *prob = script_p[script_k];
    return RK_OK;
}

static void assess(rk_prom_gpu *g, const rk_gpu_info *info, const rk_gpu_sample *s, int n,
                   const double *p, double horizon_min)
{
    rk_monitor_predictor pred = {script_push, NULL, horizon_min};
    rk_monitor_opts o = RK_MONITOR_OPTS_DEFAULT;
    o.history = 8;
    o.predictor = p ? &pred : NULL;
    rk_monitor *m;
    assert_int_equal(rk_monitor_create(&m, 1, &o, NULL), RK_OK);
    script_p = p;
    for (script_k = 0; script_k < n; script_k++)
        assert_int_equal(rk_monitor_push(m, 0, s[script_k].t, &s[script_k], NULL), RK_OK);
    rk_prom_gpu_from_monitor(g, info, rk_monitor_gpu_state(m, 0));
    rk_monitor_free(m);
}

static char *render(const rk_prom_gpu *g, int n, const rk_prom_stats *st)
{
    rk_buf b = {0};
    if (n)
        rk_prom_render_gpus(&b, g, n);
    if (st)
        rk_prom_render_stats(&b, st);
    assert_false(b.failed);
    if (!b.p) { /* nothing rendered */
        b.p = calloc(1, 1);
        assert_non_null(b.p);
    }
    return b.p;
}

static char *escaped(const char *s)
{
    rk_buf b = {0};
    rk_prom_escape_label(&b, s);
    assert_false(b.failed);
    return b.p ? b.p : calloc(1, 1);
}

static int count_lines(const char *text, const char *prefix)
{
    int n = 0;
    size_t lp = strlen(prefix);
    for (const char *p = text; *p;) {
        if (strncmp(p, prefix, lp) == 0)
            n++;
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        p = nl + 1;
    }
    return n;
}

/* The structure Prometheus requires of the text format: every line ends in a newline; each
 * family has one HELP and one TYPE line, before its samples, and all its samples together;
 * every sample's value parses as a finite number. Returns the number of samples. */
static int check_exposition(const char *text)
{
    char seen[64][96];
    int nseen = 0, samples = 0;
    char fam[96] = "";
    size_t len = strlen(text);
    assert_true(len == 0 || text[len - 1] == '\n');
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        assert_non_null(nl);
        char line[2048];
        size_t ll = (size_t)(nl - p);
        assert_true(ll < sizeof line);
        memcpy(line, p, ll);
        line[ll] = '\0';
        p = nl + 1;
        char name[96], type[32];
        if (strncmp(line, "# HELP ", 7) == 0) {
            assert_int_equal(sscanf(line + 7, "%95s", name), 1);
            for (int i = 0; i < nseen; i++)
                assert_string_not_equal(seen[i], name); /* a family appears once */
            assert_true(nseen < 64);
            strcpy(seen[nseen++], name);
            strcpy(fam, name);
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            assert_int_equal(sscanf(line + 7, "%95s %31s", name, type), 2);
            assert_string_equal(name, fam);
            assert_true(strcmp(type, "gauge") == 0 || strcmp(type, "counter") == 0);
            if (strcmp(type, "counter") == 0) /* counters end in _total (docs/metrics.md) */
                assert_string_equal(name + strlen(name) - 6, "_total");
            continue;
        }
        assert_true(line[0] != '#');
        size_t nl2 = strcspn(line, "{ ");
        assert_true(nl2 > 0 && nl2 < sizeof name);
        memcpy(name, line, nl2);
        name[nl2] = '\0';
        assert_string_equal(name, fam); /* a sample belongs to the family above it */
        const char *val = strrchr(line, ' ');
        assert_non_null(val);
        char *end;
        double v = strtod(val + 1, &end);
        assert_true(*end == '\0' && end != val + 1);
        assert_true(isfinite(v));
        samples++;
    }
    assert_null(strstr(text, "NaN"));
    assert_null(strstr(text, "Inf"));
    assert_null(strstr(text, "nan"));
    assert_null(strstr(text, "inf "));
    return samples;
}

/* A GPU with a hostile name, a few fields valid and the rest absent. */
static void one_gpu(rk_prom_gpu *g)
{
    memset(g, 0, sizeof *g);
    g->info.index = 0;
    snprintf(g->info.name, sizeof g->info.name, "GTX \"1070\" Ti\\mining\nrig");
    snprintf(g->info.uuid, sizeof g->info.uuid, "GPU-0f1e");
    g->info.simulated = false;
    g->info.backend = "nvml";
    rk_gpu_sample *s = &g->sample;
    s->t = 1000;
    s->temp_c = 71.5, rk_field_set(s, RK_F_TEMP);
    s->fan_pct = 40, rk_field_set(s, RK_F_FAN);
    s->power_w = 150.25, rk_field_set(s, RK_F_POWER);
    s->sm_mhz = 1506, rk_field_set(s, RK_F_SM_CLOCK);
    s->clock_reasons = RK_CLOCK_SW_POWER_CAP | RK_CLOCK_HW_SLOWDOWN;
    rk_field_set(s, RK_F_CLOCK_REASONS);
    s->mem_total_bytes = 8589934592ull, rk_field_set(s, RK_F_MEM_TOTAL);
    s->pcie_gen = 3, rk_field_set(s, RK_F_PCIE_GEN);
    s->pcie_width = 8, rk_field_set(s, RK_F_PCIE_WIDTH);
    s->pcie_width_max = 16, rk_field_set(s, RK_F_PCIE_WIDTH_MAX);
    s->pcie_replay = 12, rk_field_set(s, RK_F_PCIE_REPLAY);
    s->xid_count = 0, rk_field_set(s, RK_F_XID);
    g->has_signals = true;
    g->sig.dtdt_valid = true, g->sig.dtdt_c_per_min = 6;
    g->sig.replay_rate_valid = true, g->sig.replay_per_min = 3;
    g->sig.replay_limit_per_min = 6;
    g->sig.downtrained = true;
    g->has_score = true;
    g->score = 65;
    g->nfindings = 2;
    g->findings[0] = (rk_finding){"pcie_downtrained", RK_SEV_WARN, 20, "x8 of x16", "reseat"};
    g->findings[1] = (rk_finding){"hw_slowdown", RK_SEV_WARN, 15, "slowdown", "check the PSU"};
}

#define L0                                                                                         \
    "{gpu=\"0\",uuid=\"GPU-0f1e\",name=\"GTX \\\"1070\\\" "                                        \
    "Ti\\\\mining\\nrig\",simulated=\"false\""

/* (an array of pieces: C17 compilers need not take string literals over 4095 bytes) */
static const char *const one_gpu_text[] = {
    "# HELP rk_gpu_info What each GPU is: always 1, with labels profile (simulated fleets) and "
    "backend.\n",
    "# TYPE rk_gpu_info gauge\n",
    "rk_gpu_info" L0 ",backend=\"nvml\"} 1\n",
    "# HELP rk_gpu_up 1 while the GPU answers, 0 once it is lost (fell off the bus) or its read "
    "failed.\n",
    "# TYPE rk_gpu_up gauge\n",
    "rk_gpu_up" L0 "} 1\n",
    "# HELP rk_gpu_health_score Health score 0-100, 100 healthy (docs/health.md).\n",
    "# TYPE rk_gpu_health_score gauge\n",
    "rk_gpu_health_score" L0 "} 65\n",
    "# HELP rk_gpu_health_findings One series per finding that took points off the health "
    "score, by code and severity; the value is the penalty in points (count() gives the number "
    "of findings).\n",
    "# TYPE rk_gpu_health_findings gauge\n",
    "rk_gpu_health_findings" L0 ",code=\"pcie_downtrained\",severity=\"warn\"} 20\n",
    "rk_gpu_health_findings" L0 ",code=\"hw_slowdown\",severity=\"warn\"} 15\n",
    "# HELP rk_gpu_temperature_celsius GPU core temperature in celsius.\n",
    "# TYPE rk_gpu_temperature_celsius gauge\n",
    "rk_gpu_temperature_celsius" L0 "} 71.5\n",
    "# HELP rk_gpu_temperature_rate_celsius_per_second dT/dt of the core temperature, least "
    "squares over the sample window.\n",
    "# TYPE rk_gpu_temperature_rate_celsius_per_second gauge\n",
    "rk_gpu_temperature_rate_celsius_per_second" L0 "} 0.1\n",
    "# HELP rk_gpu_fan_speed_ratio Fan speed, 0-1 of its maximum.\n",
    "# TYPE rk_gpu_fan_speed_ratio gauge\n",
    "rk_gpu_fan_speed_ratio" L0 "} 0.4\n",
    "# HELP rk_gpu_power_watts Board power draw in watts.\n",
    "# TYPE rk_gpu_power_watts gauge\n",
    "rk_gpu_power_watts" L0 "} 150.25\n",
    "# HELP rk_gpu_sm_clock_hertz SM clock in hertz.\n",
    "# TYPE rk_gpu_sm_clock_hertz gauge\n",
    "rk_gpu_sm_clock_hertz" L0 "} 1506000000\n",
    "# HELP rk_gpu_clock_event_active 1 while the clock event (throttle) reason is active, else "
    "0.\n",
    "# TYPE rk_gpu_clock_event_active gauge\n",
    "rk_gpu_clock_event_active" L0 ",reason=\"gpu_idle\"} 0\n",
    "rk_gpu_clock_event_active" L0 ",reason=\"app_setting\"} 0\n",
    "rk_gpu_clock_event_active" L0 ",reason=\"sw_power_cap\"} 1\n",
    "rk_gpu_clock_event_active" L0 ",reason=\"hw_slowdown\"} 1\n",
    "rk_gpu_clock_event_active" L0 ",reason=\"sync_boost\"} 0\n",
    "rk_gpu_clock_event_active" L0 ",reason=\"sw_thermal\"} 0\n",
    "rk_gpu_clock_event_active" L0 ",reason=\"hw_thermal\"} 0\n",
    "rk_gpu_clock_event_active" L0 ",reason=\"hw_power_brake\"} 0\n",
    "# HELP rk_gpu_memory_total_bytes Device memory in total, bytes.\n",
    "# TYPE rk_gpu_memory_total_bytes gauge\n",
    "rk_gpu_memory_total_bytes" L0 "} 8589934592\n",
    "# HELP rk_gpu_pcie_link_generation Current PCIe link generation.\n",
    "# TYPE rk_gpu_pcie_link_generation gauge\n",
    "rk_gpu_pcie_link_generation" L0 "} 3\n",
    "# HELP rk_gpu_pcie_link_width Current PCIe link width, lanes.\n",
    "# TYPE rk_gpu_pcie_link_width gauge\n",
    "rk_gpu_pcie_link_width" L0 "} 8\n",
    "# HELP rk_gpu_pcie_link_width_max Widest PCIe link the card and slot can do, lanes.\n",
    "# TYPE rk_gpu_pcie_link_width_max gauge\n",
    "rk_gpu_pcie_link_width_max" L0 "} 16\n",
    "# HELP rk_gpu_pcie_link_downtrained 1 if the PCIe link runs below its maximum "
    "(docs/health.md), else 0.\n",
    "# TYPE rk_gpu_pcie_link_downtrained gauge\n",
    "rk_gpu_pcie_link_downtrained" L0 "} 1\n",
    "# HELP rk_gpu_pcie_replays_total PCIe replay counter.\n",
    "# TYPE rk_gpu_pcie_replays_total counter\n",
    "rk_gpu_pcie_replays_total" L0 "} 12\n",
    "# HELP rk_gpu_pcie_replays_per_second PCIe replays per second over the sample window.\n",
    "# TYPE rk_gpu_pcie_replays_per_second gauge\n",
    "rk_gpu_pcie_replays_per_second" L0 "} 0.05\n",
    "# HELP rk_gpu_pcie_replay_limit_per_second PCIe replays per second judged bad for this "
    "link's generation and width (docs/health.md).\n",
    "# TYPE rk_gpu_pcie_replay_limit_per_second gauge\n",
    "rk_gpu_pcie_replay_limit_per_second" L0 "} 0.1\n",
    "# HELP rk_gpu_xid_events_total Xid events seen.\n",
    "# TYPE rk_gpu_xid_events_total counter\n",
    "rk_gpu_xid_events_total" L0 "} 0\n"};

/* ---- tests -------------------------------------------------------------------------------- */

/* The whole text for one GPU, byte for byte: names, HELP and TYPE, units converted to base
 * units (percent -> ratio, MHz -> Hz, per minute -> per second), the name's quotes,
 * backslash and newline escaped, and nothing for the fields the card did not report (no
 * ECC, no energy, no memory used, no last Xid before the first one). */
static void one_gpu_exact(void **state)
{
    (void)state;
    rk_prom_gpu g;
    one_gpu(&g);
    char *text = render(&g, 1, NULL);
    rk_buf want = {0};
    for (size_t i = 0; i < sizeof one_gpu_text / sizeof one_gpu_text[0]; i++)
        rk_buf_put(&want, one_gpu_text[i], strlen(one_gpu_text[i]));
    assert_false(want.failed);
    assert_string_equal(text, want.p);
    rk_buf_free(&want);
    assert_int_equal(check_exposition(text), 27);
    free(text);
}

/* A lost GPU: rk_gpu_up 0 and only the info, up and score series, whatever else the sample
 * and signals still hold; the score comes from rk_health_score (0, finding gpu_lost). */
static void lost_gpu(void **state)
{
    (void)state;
    rk_prom_gpu g0;
    one_gpu(&g0);
    rk_gpu_sample seq[2] = {g0.sample, g0.sample};
    seq[1].lost = true; /* stale fields left in on purpose */
    rk_prom_gpu g;
    assess(&g, &g0.info, seq, 2, NULL, 0);
    assert_true(g.has_score);
    assert_int_equal(g.score, 0);
    assert_true(g.nfindings >= 1);
    assert_string_equal(g.findings[0].code, "gpu_lost");
    char *text = render(&g, 1, NULL);
    assert_int_equal(check_exposition(text), 3);
    assert_non_null(strstr(text, "rk_gpu_info" L0 ",backend=\"nvml\"} 1\n"));
    assert_non_null(strstr(text, "\nrk_gpu_up" L0 "} 0\n"));
    assert_non_null(strstr(text, "\nrk_gpu_health_score" L0 "} 0\n"));
    assert_int_equal(count_lines(text, "# TYPE "), 3);
    assert_null(strstr(text, "findings"));
    assert_null(strstr(text, "temperature"));
    free(text);
}

/* A read that failed this cycle (nothing valid, not lost): info and up 0, and no score
 * when no reading ever succeeded (an empty sample would otherwise score a perfect 100); after
 * a good reading, the monitor's rule: the score of that last good reading, and no other
 * series. */
static void failed_read(void **state)
{
    (void)state;
    rk_prom_gpu g0;
    one_gpu(&g0);
    rk_gpu_sample empty = {0};
    rk_prom_gpu g;
    assess(&g, &g0.info, &empty, 1, NULL, 0);
    assert_false(g.has_score);
    char *text = render(&g, 1, NULL);
    assert_int_equal(check_exposition(text), 2);
    assert_non_null(strstr(text, "\nrk_gpu_up" L0 "} 0\n"));
    assert_null(strstr(text, "rk_gpu_health_score"));
    free(text);
    rk_gpu_sample hot = {.t = 1, .temp_c = 85};
    rk_field_set(&hot, RK_F_TEMP);
    rk_gpu_sample seq[2] = {hot, empty};
    assess(&g, &g0.info, seq, 2, NULL, 0);
    assert_true(g.has_score);
    assert_int_equal(g.score, 80); /* thermal_high, from the good reading */
    text = render(&g, 1, NULL);
    assert_non_null(strstr(text, "\nrk_gpu_up" L0 "} 0\n"));
    assert_non_null(strstr(text, "\nrk_gpu_health_score" L0 "} 80\n"));
    assert_null(strstr(text, "temperature"));
    free(text);
}

/* Absent fields and signals give no series at all (not 0): a card that reports only its
 * temperature, with no window yet, has info, up, score and temperature and nothing else. */
static void absent_fields(void **state)
{
    (void)state;
    rk_gpu_info info = {.index = 3, .name = "Tesla", .uuid = "GPU-3", .backend = "nvml"};
    rk_gpu_sample s = {.t = 5, .temp_c = 40};
    rk_field_set(&s, RK_F_TEMP);
    rk_prom_gpu g;
    assess(&g, &info, &s, 1, NULL, 0);
    assert_true(g.has_score);
    assert_int_equal(g.score, 100);
    char *text = render(&g, 1, NULL);
    assert_int_equal(check_exposition(text), 4);
    assert_non_null(strstr(text,
                           "rk_gpu_temperature_celsius{gpu=\"3\",uuid=\"GPU-3\",name=\"Tesla\","
                           "simulated=\"false\"} 40\n"));
    const char *never[] = {"fan", "power",  "clock",  "ecc",  "pcie",    "xid",
                           "vrm", "energy", "memory", "rate", "findings"};
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        assert_null(strstr(text, never[i]));
    free(text);
}

/* Values that are not finite are never written: the series is left out instead. */
static void non_finite_values_left_out(void **state)
{
    (void)state;
    rk_prom_gpu g;
    one_gpu(&g);
    g.sample.temp_c = NAN;
    g.sample.power_w = INFINITY;
    g.sample.fan_pct = -INFINITY;
    g.sig.dtdt_c_per_min = NAN;
    g.sig.replay_limit_per_min = INFINITY;
    char *text = render(&g, 1, NULL);
    assert_int_equal(check_exposition(text), 27 - 5);
    assert_null(strstr(text, "rk_gpu_temperature_celsius"));
    assert_null(strstr(text, "rk_gpu_power_watts"));
    assert_null(strstr(text, "rk_gpu_fan_speed_ratio"));
    assert_null(strstr(text, "rk_gpu_temperature_rate"));
    assert_null(strstr(text, "rk_gpu_pcie_replay_limit"));
    free(text);
}

static void format_values(void **state)
{
    (void)state;
    struct {
        double v;
        const char *want;
    } cases[] = {
        {0, "0"},
        {-0.0, "0"},
        {42, "42"},
        {-3, "-3"},
        {0.1, "0.1"},
        {71.5, "71.5"},
        {1506e6, "1506000000"},
        {8589934592.0, "8589934592"},
        {1e20, "1e+20"},
        {1.0 / 3, "0.33333333333333331"},
        {9007199254740993.0, "9007199254740992"},
        {1e-300, "1e-300"},
    };
    char buf[40];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_true(rk_prom_format_value(cases[i].v, buf, sizeof buf));
        assert_string_equal(buf, cases[i].want);
    }
    assert_false(rk_prom_format_value(NAN, buf, sizeof buf));
    assert_false(rk_prom_format_value(INFINITY, buf, sizeof buf));
    assert_false(rk_prom_format_value(-INFINITY, buf, sizeof buf));
    /* any finite double reads back to itself */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 100000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double v;
        memcpy(&v, &x, sizeof v);
        if (!isfinite(v))
            continue;
        assert_true(rk_prom_format_value(v, buf, sizeof buf));
        assert_true(strtod(buf, NULL) == v);
        assert_null(strpbrk(buf, " ,\"}"));
    }
}

static void escape_labels(void **state)
{
    (void)state;
    struct {
        const char *in, *want;
    } cases[] = {
        {"", ""},
        {"plain GeForce GTX 1070 Ti", "plain GeForce GTX 1070 Ti"},
        {"a\\b\"c\nd", "a\\\\b\\\"c\\nd"},
        {"\\\\", "\\\\\\\\"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\xa5", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\xa5"},
        {"bad\xff", "bad\xef\xbf\xbd"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong '/' */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate */
        {"cut\xe2\x82", "cut\xef\xbf\xbd\xef\xbf\xbd"},           /* truncated at the end */
        {"tab\tcr\r", "tab\tcr\r"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = escaped(cases[i].in);
        assert_string_equal(got, cases[i].want);
        free(got);
    }
}

/* Two GPUs, one simulated with a profile: each family has one HELP and TYPE and its series
 * in GPU order; profile and backend labels on rk_gpu_info only. */
static void families_grouped(void **state)
{
    (void)state;
    rk_prom_gpu g[2];
    one_gpu(&g[0]);
    one_gpu(&g[1]);
    g[1].info.index = 1;
    snprintf(g[1].info.name, sizeof g[1].info.name, "GeForce GTX 1070 Ti");
    snprintf(g[1].info.uuid, sizeof g[1].info.uuid, "SIM-1-1");
    snprintf(g[1].info.profile, sizeof g[1].info.profile, "1070ti-mining");
    g[1].info.simulated = true;
    g[1].info.backend = "sim";
    char *text = render(g, 2, NULL);
    assert_int_equal(check_exposition(text), 2 * 27);
    const char *a = strstr(text, "rk_gpu_temperature_celsius{gpu=\"0\"");
    const char *b = strstr(text, "rk_gpu_temperature_celsius{gpu=\"1\"");
    assert_true(a && b && a < b);
    assert_non_null(strstr(text,
                           "rk_gpu_info{gpu=\"1\",uuid=\"SIM-1-1\",name=\"GeForce GTX 1070 "
                           "Ti\",simulated=\"true\",profile=\"1070ti-mining\",backend=\"sim\"} "
                           "1\n"));
    assert_int_equal(count_lines(text, "rk_gpu_up{gpu=\"1\""), 1);
    assert_null(strstr(text, "profile=\"1070ti-mining\"}")); /* only on rk_gpu_info */
    assert_int_equal(count_lines(text, "rk_gpu_temperature_celsius{"), 2);
    free(text);
}

/* A (code, severity) pair repeated in the findings becomes one series with the penalties
 * added: two series with the same labels would make Prometheus reject the whole scrape. */
static void duplicate_findings_merged(void **state)
{
    (void)state;
    rk_prom_gpu g;
    one_gpu(&g);
    g.nfindings = 3;
    g.findings[2] = (rk_finding){"pcie_downtrained", RK_SEV_WARN, 5, "again", "reseat"};
    char *text = render(&g, 1, NULL);
    check_exposition(text);
    assert_int_equal(count_lines(text, "rk_gpu_health_findings{"), 2);
    assert_non_null(strstr(text, ",code=\"pcie_downtrained\",severity=\"warn\"} 25\n"));
    free(text);
}

/* Per-code Xid counters (one series per code, a code twice never twice) and the burn
 * verdict's two gauges, absent without a record and for a GPU that does not answer. */
static void xid_codes_and_burn(void **state)
{
    (void)state;
    rk_prom_gpu g;
    one_gpu(&g);
    char *text = render(&g, 1, NULL);
    assert_null(strstr(text, "rk_gpu_xid_errors_total"));
    assert_null(strstr(text, "rk_gpu_burn_ok"));
    free(text);
    g.sample.xid_count = 4;
    g.sample.last_xid = 79;
    g.sample.nxids = 3;
    g.sample.xids[0].xid = 79, g.sample.xids[0].count = 3;
    g.sample.xids[1].xid = 48, g.sample.xids[1].count = 1;
    g.sample.xids[2].xid = 79, g.sample.xids[2].count = 1; /* a duplicate: left out */
    g.sig.burn_valid = true;
    g.sig.burn_ok = false;
    g.sig.burn_when = 1764660000.5;
    text = render(&g, 1, NULL);
    check_exposition(text);
    assert_int_equal(count_lines(text, "rk_gpu_xid_errors_total{"), 2);
    assert_non_null(strstr(text, "# TYPE rk_gpu_xid_errors_total counter\n"));
    assert_non_null(strstr(text, "rk_gpu_xid_errors_total" L0 ",xid=\"79\"} 3\n"));
    assert_non_null(strstr(text, "rk_gpu_xid_errors_total" L0 ",xid=\"48\"} 1\n"));
    assert_non_null(strstr(text, "rk_gpu_burn_ok" L0 "} 0\n"));
    assert_non_null(strstr(text, "rk_gpu_burn_timestamp_seconds" L0 "} 1764660000.5\n"));
    free(text);
    g.sig.burn_ok = true;
    text = render(&g, 1, NULL);
    assert_non_null(strstr(text, "rk_gpu_burn_ok" L0 "} 1\n"));
    free(text);
    g.sample.lost = true; /* gone: nothing but info, up and score */
    text = render(&g, 1, NULL);
    assert_null(strstr(text, "rk_gpu_burn_ok"));
    assert_null(strstr(text, "rk_gpu_xid_errors_total"));
    free(text);
}

/* Samples run through the monitor with a real window: the signals and findings come
 * from the health layer and show up with the right units. */
static void assess_window(void **state)
{
    (void)state;
    rk_gpu_info info = {.index = 0, .name = "GTX 1070 Ti", .uuid = "GPU-x", .backend = "nvml"};
    rk_gpu_sample seq[5];
    for (int k = 0; k < 5; k++) { /* +0.5 C every 2 s: 15 C/min */
        rk_gpu_sample s = {0};
        s.t = 100 + 2.0 * k;
        s.temp_c = 60 + 0.5 * k, rk_field_set(&s, RK_F_TEMP);
        s.ecc_corrected = 10 + 2u * (unsigned)k, rk_field_set(&s, RK_F_ECC_CORRECTED);
        seq[k] = s;
    }
    rk_prom_gpu g;
    assess(&g, &info, seq, 5, NULL, 0);
    char *text = render(&g, 1, NULL);
    check_exposition(text);
    assert_non_null(strstr(text, "rk_gpu_temperature_rate_celsius_per_second{gpu=\"0\",uuid=\"GPU-"
                                 "x\",name=\"GTX 1070 Ti\",simulated=\"false\"} 0.25\n"));
    assert_non_null(strstr(text, "rk_gpu_ecc_corrected_errors_per_second{gpu=\"0\",uuid=\"GPU-x\","
                                 "name=\"GTX 1070 Ti\",simulated=\"false\"} 1\n"));
    assert_non_null(strstr(text, "rk_gpu_ecc_corrected_errors_total{gpu=\"0\",uuid=\"GPU-x\","
                                 "name=\"GTX 1070 Ti\",simulated=\"false\"} 18\n"));
    free(text);
}

static void exporter_stats(void **state)
{
    (void)state;
    rk_prom_stats st = {
        .collections = 12, .errors = 1, .duration_s = 0.00125, .last_ts = 1700000000.5, .gpus = 8};
    char *text = render(NULL, 0, &st);
    assert_string_equal(text,
                        "# HELP rk_exporter_collections_total Collection cycles run.\n"
                        "# TYPE rk_exporter_collections_total counter\n"
                        "rk_exporter_collections_total 12\n"
                        "# HELP rk_exporter_collection_errors_total Collection cycles in which a "
                        "GPU read or a textfile failed.\n"
                        "# TYPE rk_exporter_collection_errors_total counter\n"
                        "rk_exporter_collection_errors_total 1\n"
                        "# HELP rk_exporter_collection_duration_seconds Wall time of the last "
                        "collection cycle (read, score, render).\n"
                        "# TYPE rk_exporter_collection_duration_seconds gauge\n"
                        "rk_exporter_collection_duration_seconds 0.00125\n"
                        "# HELP rk_exporter_last_collection_timestamp_seconds When the last "
                        "collection cycle ended, Unix time.\n"
                        "# TYPE rk_exporter_last_collection_timestamp_seconds gauge\n"
                        "rk_exporter_last_collection_timestamp_seconds 1700000000.5\n"
                        "# HELP rk_exporter_gpus GPUs watched.\n"
                        "# TYPE rk_exporter_gpus gauge\n"
                        "rk_exporter_gpus 8\n");
    free(text);
    st.duration_s = -1;
    st.last_ts = 0;
    text = render(NULL, 0, &st);
    assert_int_equal(check_exposition(text), 3);
    free(text);
}

/* A buffer grows past its first allocation without losing bytes. */
static void buffer_grows(void **state)
{
    (void)state;
    rk_buf b = {0};
    for (int i = 0; i < 20000; i++)
        rk_buf_printf(&b, "%05d\n", i);
    assert_false(b.failed);
    assert_int_equal(b.len, 20000 * 6);
    assert_int_equal(strncmp(b.p + 6 * 19999, "19999\n", 6), 0);
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    rk_buf_printf(&b, "%s", big);
    assert_int_equal(b.len, 20000 * 6 + 999);
    assert_int_equal(strlen(b.p), b.len);
    rk_buf_free(&b);
}

/* The failure predictor's probability (through the monitor): served as
 * rk_gpu_failure_probability with the GPU's labels and taken into the score; unknown
 * (negative, NaN, above 1), a lost GPU or a failed read give no series and the score without
 * it. */
static void failure_probability(void **state)
{
    (void)state;
    rk_gpu_info info = {.index = 3, .name = "Tesla", .uuid = "GPU-3", .backend = "nvml"};
    rk_gpu_sample s = {.t = 5, .temp_c = 40};
    rk_field_set(&s, RK_F_TEMP);
    rk_prom_gpu g;
    assess(&g, &info, &s, 1, (const double[]){0.75}, 60);
    assert_int_equal(g.score, 55);
    assert_string_equal(g.findings[0].code, "failure_predicted");
    assert_string_equal(g.findings[0].message,
                        "the predictor gives p=0.75 of failing within 60 min");
    char *text = render(&g, 1, NULL);
    assert_int_equal(check_exposition(text), 6); /* info, up, score, finding, probability, temp */
    assert_non_null(strstr(text,
                           "# TYPE rk_gpu_failure_probability gauge\n"
                           "rk_gpu_failure_probability{gpu=\"3\",uuid=\"GPU-3\",name=\"Tesla\","
                           "simulated=\"false\"} 0.75\n"));
    free(text);
    assess(&g, &info, &s, 1, (const double[]){0.3}, 60);
    assert_int_equal(g.score, 85);
    assert_string_equal(g.findings[0].code, "failure_risk");
    const double unknown[] = {-1, NAN, 1.5, INFINITY};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assess(&g, &info, &s, 1, &unknown[i], 60);
        assert_int_equal(g.score, 100);
        text = render(&g, 1, NULL);
        assert_null(strstr(text, "failure"));
        free(text);
    }
    rk_gpu_sample lost = s;
    lost.lost = true;
    assess(&g, &info, &lost, 1, (const double[]){0.9}, 60);
    assert_int_equal(g.score, 0);
    assert_int_equal(g.nfindings, 1);
    text = render(&g, 1, NULL);
    assert_null(strstr(text, "rk_gpu_failure_probability"));
    free(text);
    rk_gpu_sample empty = {0};
    assess(&g, &info, &empty, 1, (const double[]){0.9}, 60);
    assert_false(g.has_score);
    text = render(&g, 1, NULL);
    assert_null(strstr(text, "rk_gpu_failure_probability"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_gpu_exact),    cmocka_unit_test(xid_codes_and_burn),
        cmocka_unit_test(lost_gpu),         cmocka_unit_test(failed_read),
        cmocka_unit_test(absent_fields),    cmocka_unit_test(non_finite_values_left_out),
        cmocka_unit_test(format_values),    cmocka_unit_test(escape_labels),
        cmocka_unit_test(families_grouped), cmocka_unit_test(duplicate_findings_merged),
        cmocka_unit_test(assess_window),    cmocka_unit_test(failure_probability),
        cmocka_unit_test(exporter_stats),   cmocka_unit_test(buffer_grows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
