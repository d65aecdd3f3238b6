/*
 * One temperature limit everywhere (rekindle/health.h's RK_HEALTH_TEMP_WARN_C and
 * RK_HEALTH_TEMP_CRIT_C): the score's thermal_high fires at the warn limit and not just under
 * it, thermal_critical at the critical one; the alert rule RekindleGpuTemperatureHigh
 * (deploy/prometheus/rekindle.rules.yml) compares against the warn limit with ">=" and says
 * that number; the dashboard's Temperature panel (deploy/grafana/rekindle.json) draws its
 * orange and red lines at the two limits; docs/health.md's table states them. And the names
 * agree: each textfile input that docs/textfile.md lists is merged by the reader, is not an
 * output name of rk exporter (docs/metrics.md), and carries the same unit as the output it is
 * served as. Read from the source tree (RK_SRC_DIR), so none of them can drift again.
 */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rekindle/health.h"

#ifndef RK_SRC_DIR
#define RK_SRC_DIR "."
#endif

static char *slurp(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", RK_SRC_DIR, rel);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    char *buf = calloc(1, 1 << 20);
    assert_non_null(buf);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    assert_true(n > 0 && n < (1 << 20) - 1);
    return buf;
}

/* Does the score give `code` for a reading at temp_c? */
static int has_finding(double temp_c, const char *code)
{
    rk_gpu_sample s = {0};
    s.temp_c = temp_c;
    rk_field_set(&s, RK_F_TEMP);
    rk_finding f[RK_MAX_FINDINGS];
    int n = 0;
    rk_health_score(&s, NULL, f, &n);
    for (int i = 0; i < n; i++)
        if (strcmp(f[i].code, code) == 0)
            return 1;
    return 0;
}

static void test_score_uses_the_constants(void **st)
{
    (void)st;
    assert_true(RK_HEALTH_TEMP_WARN_C < RK_HEALTH_TEMP_CRIT_C);
    assert_false(has_finding(RK_HEALTH_TEMP_WARN_C - 0.5, "thermal_high"));
    assert_true(has_finding(RK_HEALTH_TEMP_WARN_C, "thermal_high"));
    assert_true(has_finding(RK_HEALTH_TEMP_CRIT_C - 0.5, "thermal_high"));
    assert_false(has_finding(RK_HEALTH_TEMP_CRIT_C - 0.5, "thermal_critical"));
    assert_true(has_finding(RK_HEALTH_TEMP_CRIT_C, "thermal_critical"));
    assert_false(has_finding(RK_HEALTH_TEMP_CRIT_C, "thermal_high"));
}

static void test_alert_rule_uses_the_warn_limit(void **st)
{
    (void)st;
    char *y = slurp("deploy/prometheus/rekindle.rules.yml");
    char *a = strstr(y, "- alert: RekindleGpuTemperatureHigh\n");
    assert_non_null(a);
    char *next = strstr(a + 1, "- alert:");
    if (next)
        *next = 0; /* this rule's block only */
    char *e = strstr(a, "expr: rk_gpu_temperature_celsius >= ");
    assert_non_null(e);
    char *end = NULL;
    double v = strtod(e + strlen("expr: rk_gpu_temperature_celsius >= "), &end);
    assert_true(end && *end == '\n');
    assert_true(v == RK_HEALTH_TEMP_WARN_C);
    char says[32];
    snprintf(says, sizeof says, "%d C or more", RK_HEALTH_TEMP_WARN_C);
    assert_non_null(strstr(a, says)); /* the summary and description say the same number */
    free(y);
}

static void test_dashboard_uses_both_limits(void **st)
{
    (void)st;
    char *text = slurp("deploy/grafana/rekindle.json");
    json_error_t je;
    json_t *d = json_loads(text, 0, &je);
    assert_non_null(d);
    json_t *panels = json_object_get(d, "panels"), *p;
    size_t i;
    int found = 0;
    json_array_foreach(panels, i, p)
    {
        const char *title = json_string_value(json_object_get(p, "title"));
        if (!title || strcmp(title, "Temperature") != 0)
            continue;
        found++;
        json_t *steps = json_object_get(
            json_object_get(json_object_get(json_object_get(p, "fieldConfig"), "defaults"),
                            "thresholds"),
            "steps");
        assert_int_equal(json_array_size(steps), 3);
        assert_true(json_is_null(json_object_get(json_array_get(steps, 0), "value")));
        assert_true(json_number_value(json_object_get(json_array_get(steps, 1), "value")) ==
                    RK_HEALTH_TEMP_WARN_C);
        assert_true(json_number_value(json_object_get(json_array_get(steps, 2), "value")) ==
                    RK_HEALTH_TEMP_CRIT_C);
    }
    assert_int_equal(found, 1);
    json_decref(d);
    free(text);
}

static void test_docs_state_the_limits(void **st)
{
    (void)st;
    char *doc = slurp("docs/health.md"), want[64];
    snprintf(want, sizeof want, "| thermal_high | warn | 20 | core >= %d C |",
             RK_HEALTH_TEMP_WARN_C);
    assert_non_null(strstr(doc, want));
    snprintf(want, sizeof want, "core >= %d C", RK_HEALTH_TEMP_CRIT_C);
    assert_non_null(strstr(doc, want));
    free(doc);
}

/* The Xid codes an alert rule's block compares rk_gpu_last_xid with ("rk_gpu_last_xid == N"):
 * a bit per code 0..255 in set[]. */
static void rule_codes(const char *rules, const char *alert, bool set[256])
{
    memset(set, 0, 256 * sizeof set[0]);
    char head[96];
    snprintf(head, sizeof head, "- alert: %s\n", alert);
    const char *a = strstr(rules, head);
    assert_non_null(a);
    const char *next = strstr(a + 1, "- alert:");
    const char *end = next ? next : a + strlen(a);
    for (const char *p = a; (p = strstr(p, "rk_gpu_last_xid == ")) && p < end;) {
        p += strlen("rk_gpu_last_xid == ");
        long v = strtol(p, NULL, 10);
        assert_true(v > 0 && v < 256);
        set[v] = true;
    }
    const char *range = strstr(a, "rk_gpu_last_xid >=");
    assert_true(!range || range >= end); /* every code written out, so this check sees it */
}

/* The Xid table: the score's classes, the two Xid alerts and docs/health.md's table agree. */
static void test_xid_table_agrees(void **st)
{
    (void)st;
    char *y = slurp("deploy/prometheus/rekindle.rules.yml");
    char *doc = slurp("docs/health.md");
    bool crit[256], warn[256];
    rule_codes(y, "RekindleGpuCriticalXid", crit);
    rule_codes(y, "RekindleGpuMemoryXid", warn);
    const int ignored[] = {13, 31, 43, 45, 68};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        assert_int_equal(rk_health_xid_class(ignored[i], NULL), RK_SEV_INFO);
    assert_int_equal(rk_health_xid_class(79, NULL), RK_SEV_CRIT);
    assert_int_equal(rk_health_xid_class(48, NULL), RK_SEV_CRIT);
    assert_int_equal(rk_health_xid_class(95, NULL), RK_SEV_CRIT);
    for (int x = 1; x < 256; x++) {
        const char *what;
        int c = rk_health_xid_class(x, &what);
        assert_int_equal(crit[x], c == RK_SEV_CRIT);
        assert_int_equal(warn[x], c == RK_SEV_WARN);
        if (c < 0)
            continue;
        char row[48];
        snprintf(row, sizeof row, "\n| %d | %s | ", x,
                 c == RK_SEV_CRIT   ? "crit"
                 : c == RK_SEV_WARN ? "warn"
                                    : "ignored");
        if (!strstr(doc, row))
            fail_msg("docs/health.md's Xid table has no row '%s'", row + 1);
    }
    free(y);
    free(doc);
}

/* The unit at the end of a metric name: "volts" of rk_sensor_vrm_ripple_volts. */
static const char *unit_of(const char *name)
{
    const char *u = strrchr(name, '_');
    return u ? u + 1 : name;
}

static void test_textfile_inputs_never_equal_outputs(void **st)
{
    (void)st;
    char *tf = slurp("docs/textfile.md"), *metrics = slurp("docs/metrics.md");
    int rows = 0;
    for (char *p = tf; (p = strstr(p, "\n| `rk_sensor_")); p++) {
        char in[64] = "", out[64] = "";
        assert_int_equal(sscanf(p, "\n| `%63[a-z_]`", in), 1);
        char *eol = strchr(p + 1, '\n'), *last = eol;
        while (last > p && *last != '`')
            last--; /* the row's last column: the exporter's name for it */
        char *first = last - 1;
        while (first > p && *first != '`')
            first--;
        assert_true(first > p && last - first - 1 < (long)sizeof out);
        memcpy(out, first + 1, (size_t)(last - first - 1));
        char want[80];
        snprintf(want, sizeof want, "| %s |", in);
        assert_null(strstr(metrics, want)); /* an input is never an output */
        snprintf(want, sizeof want, "| %s |", out);
        assert_non_null(strstr(metrics, want)); /* the output exists */
        assert_string_equal(unit_of(in), unit_of(out));
        /* and the reader takes it */
        rk_gpu_info info = {.index = 0, .uuid = "GPU-0"};
        rk_gpu_sample s = {0};
        rk_field_set(&s, RK_F_TEMP);
        char line[96];
        snprintf(line, sizeof line, "%s{gpu=\"0\"} 1\n", in);
        rk_err err = {0};
        assert_int_equal(rk_textfile_merge("t.prom", line, strlen(line), &info, &s, 1, &err),
                         RK_OK);
        assert_true(rk_field_valid(&s, RK_F_VRM_RIPPLE) || rk_field_valid(&s, RK_F_FAN_VIB));
        rows++;
        p = eol ? eol - 1 : p;
    }
    assert_int_equal(rows, 2);
    free(tf);
    free(metrics);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_score_uses_the_constants),
        cmocka_unit_test(test_alert_rule_uses_the_warn_limit),
        cmocka_unit_test(test_dashboard_uses_both_limits),
        cmocka_unit_test(test_docs_state_the_limits),
        cmocka_unit_test(test_xid_table_agrees),
        cmocka_unit_test(test_textfile_inputs_never_equal_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
