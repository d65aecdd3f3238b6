/*
 * Tests for the supervisor's ledger (src/supervisor/ledger.c): the events file is in time
 * order even when an incident waits for its recovery to be measured (a relaunch) while later
 * ones are final at once (a quarantine, an injection); an incident dated back to when its
 * failure was seen goes before the ones after it; the summary writes whatever still waits;
 * every line is one the reader takes (events.h), a detail cut mid-character included; the
 * snapshot notes are in the events file but not among the incidents, and the summary says the
 * recovery mode, the snapshot peak and the restores by source; the metrics file's text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "supervisor/events.h"
#include "supervisor/supervisor.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("ledger")
static char g_path[600];

/* The kinds in the events file, in file order, as "a,b,c". */
static void kinds(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(g_path, "r");
    if (!f)
        return;
    char line[2048];
    size_t used = 0;
    while (fgets(line, sizeof line, f)) {
        const char *k = strstr(line, "\"kind\":\"");
        assert_non_null(k);
        k += 8;
        size_t n = strcspn(k, "\"");
        used += (size_t)snprintf(out + used, cap - used, "%s%.*s", used ? "," : "", (int)n, k);
    }
    fclose(f);
}

static void test_events_in_time_order(void **state)
{
    (void)state;
    snprintf(g_path, sizeof g_path, "%s/events.jsonl", g_dir);
    rk_ledger g;
    rk_err err = {0};
    assert_int_equal(rk_ledger_open(&g, g_path, &err), RK_OK);
    rk_incident *i = rk_ledger_add(&g, "inject", 2, "2", "none", "fault 0");
    i->t = 1.0;
    rk_ledger_write(&g, i);
    /* a crash seen at t=2, added once the teardown ended: waits for its recovery */
    i = rk_ledger_add(&g, "crash", 2, "2", "relaunch", "vanished");
    i->t = 2.0;
    size_t crash = (size_t)(i - g.inc);
    /* the quarantine that followed, final at once, must wait behind it */
    i = rk_ledger_add(&g, "quarantine", 2, "2", "quarantine", "set aside");
    i->t = 3.0;
    rk_ledger_write(&g, i);
    char got[256];
    kinds(got, sizeof got);
    assert_string_equal(got, "inject");
    /* an incident dated before the crash goes first once the crash is final */
    i = rk_ledger_add(&g, "health_gate", -1, "1", "left_out", "score");
    i->t = 1.5;
    rk_ledger_write(&g, i);
    kinds(got, sizeof got);
    assert_string_equal(got, "inject,health_gate");
    g.inc[crash].recovery_s = 4.0;
    rk_ledger_write(&g, &g.inc[crash]);
    kinds(got, sizeof got);
    assert_string_equal(got, "inject,health_gate,crash,quarantine");
    /* one that never resolves is written by the summary */
    i = rk_ledger_add(&g, "hang", 1, "1", "relaunch", "stuck");
    i->t = 9.0;
    i = rk_ledger_add(&g, "nan", 0, "0", "redo", "nan");
    i->t = 10.0;
    rk_ledger_write(&g, i);
    kinds(got, sizeof got);
    assert_string_equal(got, "inject,health_gate,crash,quarantine");
    rk_sup_report rep = {0};
    assert_int_equal(rk_ledger_summary(&g, NULL, 10, 1, "failed", &rep, &err), RK_OK);
    kinds(got, sizeof got);
    assert_string_equal(got, "inject,health_gate,crash,quarantine,hang,nan");
    rk_sup_report_free(&rep);
    rk_ledger_close(&g);
}

/* The report has the summary's numbers: incidents by kind in order of first appearance
 * (injections not counted), the recovery median and maximum, the goodput's steps from the
 * job's first step; the summary file says the same. */
static void test_report_counts_incidents_and_recoveries(void **state)
{
    (void)state;
    snprintf(g_path, sizeof g_path, "%s/events.jsonl", g_dir);
    rk_ledger g;
    rk_err err = {0};
    assert_int_equal(rk_ledger_open(&g, NULL, &err), RK_OK);
    g.first_step = 2;
    for (int64_t k = 1; k <= 5; k++)
        rk_ledger_step(&g, k, 0.5);
    const char *seq[] = {"crash", "inject", "nan", "crash", "hang", "nan", "crash"};
    const double rec[] = {1.0, -1, 3.0, 2.0, -1, -1, 10.0};
    for (size_t q = 0; q < sizeof seq / sizeof seq[0]; q++) {
        rk_incident *i = rk_ledger_add(&g, seq[q], 0, "0", "relaunch", "x");
        i->recovery_s = rec[q];
    }
    /* a peer's absurd step claims are not counted and cost nothing (2^62 once hung rk run
     * doubling an int64 capacity until it wrapped) */
    rk_ledger_step(&g, (int64_t)1 << 62, 0.5);
    rk_ledger_step(&g, INT64_MAX, 0.5);
    assert_true(g.capdt <= 1024);
    g.restarts = 3;
    g.injected = 1;
    char sum[700];
    snprintf(sum, sizeof sum, "%s/summary.json", g_dir);
    rk_sup_report rep = {0};
    assert_int_equal(rk_ledger_summary(&g, sum, 5, 2, "finished", &rep, &err), RK_OK);
    assert_int_equal(rep.summary, 1);
    assert_string_equal(rep.outcome, "finished");
    assert_int_equal(rep.steps, 5);
    assert_int_equal(rep.first_step, 2);
    assert_int_equal(rep.final_ranks, 2);
    assert_int_equal(rep.restarts, 3);
    assert_int_equal(rep.injected, 1);
    assert_true(rep.productive_s > 1.49 && rep.productive_s < 1.51); /* steps 3..5 */
    assert_int_equal(rep.nkinds, 3);
    assert_string_equal(rep.incidents[0].kind, "crash");
    assert_int_equal(rep.incidents[0].count, 3);
    assert_string_equal(rep.incidents[1].kind, "nan");
    assert_int_equal(rep.incidents[1].count, 2);
    assert_string_equal(rep.incidents[2].kind, "hang");
    assert_int_equal(rep.incidents[2].count, 1);
    assert_true(rep.recovery_median_s > 2.49 && rep.recovery_median_s < 2.51);
    assert_true(rep.recovery_max_s > 9.99 && rep.recovery_max_s < 10.01);
    FILE *f = fopen(sum, "r");
    assert_non_null(f);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    assert_non_null(
        strstr(text, "\"incidents\": {\n    \"crash\": 3,\n    \"nan\": 2,\n    \"hang\": 1\n  }"));
    assert_non_null(strstr(text, "\"outcome\": \"finished\""));
    rk_sup_report_free(&rep);
    assert_null(rep.incidents);
    rk_ledger_close(&g);

    /* a job resumed at step 10^7: its steps count from there, in a small window */
    assert_int_equal(rk_ledger_open(&g, NULL, &err), RK_OK);
    g.first_step = 10000000;
    for (int64_t k = 10000001; k <= 10000003; k++)
        rk_ledger_step(&g, k, 1.0);
    assert_true(g.capdt <= 1024);
    assert_int_equal(rk_ledger_summary(&g, sum, 10000003, 1, "finished", &rep, &err), RK_OK);
    assert_true(rep.productive_s > 2.99 && rep.productive_s < 3.01);
    rk_sup_report_free(&rep);
    rk_ledger_close(&g);
}

/* The snapshot notes (rk_event_is_note) go to the events file but are not incidents; the
 * summary JSON says the recovery mode, whether snapshots were on, their peak and the relaunches'
 * restores by source. */
static void test_summary_says_the_snapshots_and_notes_are_not_incidents(void **state)
{
    (void)state;
    snprintf(g_path, sizeof g_path, "%s/events.jsonl", g_dir);
    rk_ledger g;
    rk_err err = {0};
    assert_int_equal(rk_ledger_open(&g, g_path, &err), RK_OK);
    const char *seq[] = {"snapshot_on", "crash", "snapshot_held", "snapshot_off", "snapshot_peak"};
    for (size_t q = 0; q < sizeof seq / sizeof seq[0]; q++)
        rk_ledger_write(&g, rk_ledger_add(&g, seq[q], -1, "", "none", "x"));
    assert_true(rk_event_is_note("snapshot_on") && rk_event_is_note("snapshot_held") &&
                rk_event_is_note("snapshot_peak"));
    assert_false(rk_event_is_note("snapshot_off") || rk_event_is_note("crash") ||
                 rk_event_is_note("snapshot"));
    g.recovery = "memory";
    g.snapshots = "off";
    g.snap_peak = (uint64_t)5 << 40; /* past 2^32: written whole */
    g.from_memory = 3;
    g.from_disk = 1;
    char sum[700];
    snprintf(sum, sizeof sum, "%s/summary-snap.json", g_dir);
    rk_sup_report rep = {0};
    assert_int_equal(rk_ledger_summary(&g, sum, 5, 2, "finished", &rep, &err), RK_OK);
    char got[256];
    kinds(got, sizeof got);
    assert_string_equal(got, "snapshot_on,crash,snapshot_held,snapshot_off,snapshot_peak");
    assert_int_equal(rep.nkinds, 2); /* crash and snapshot_off: the notes are not incidents */
    assert_string_equal(rep.incidents[0].kind, "crash");
    assert_string_equal(rep.incidents[1].kind, "snapshot_off");
    assert_string_equal(rep.recovery, "memory");
    assert_string_equal(rep.snapshots, "off");
    assert_true(rep.snap_peak == (uint64_t)5 << 40);
    assert_int_equal(rep.from_memory, 3);
    assert_int_equal(rep.from_disk, 1);
    FILE *f = fopen(sum, "r");
    assert_non_null(f);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    assert_non_null(strstr(text, "\"recovery\": \"memory\""));
    assert_non_null(strstr(text, "\"snapshots\": \"off\""));
    assert_non_null(strstr(text, "\"snapshot_bytes_peak\": 5497558138880"));
    assert_non_null(strstr(
        text, "\"restores\": {\n    \"memory\": 3,\n    \"disk\": 1,\n    \"in_place\": 0\n  }"));
    rk_sup_report_free(&rep);
    rk_ledger_close(&g);
}

/* The metrics file's text: every metric with its HELP and TYPE, the labels, the values. */
static void test_metrics_text(void **state)
{
    (void)state;
    rk_sup_metrics m = {.snap_bytes = 4096,
                        .snap_peak = (uint64_t)1 << 40,
                        .from_memory = 2,
                        .from_disk = 1,
                        .held_bytes = 2048,
                        .held_peak = 8192,
                        .restarts = 4,
                        .step = 130,
                        .recovery = "memory",
                        .snapshots = "on"};
    char buf[RK_SUP_METRICS_MAX];
    long n = rk_sup_metrics_format(&m, buf, sizeof buf);
    assert_true(n > 0 && (size_t)n == strlen(buf) && buf[n - 1] == '\n');
    const char *want[] = {"\nrk_run_info{recovery=\"memory\",snapshots=\"on\"} 1\n",
                          "\nrk_run_snapshot_bytes 4096\n",
                          "\nrk_run_snapshot_bytes_peak 1099511627776\n",
                          "\nrk_run_snapshot_held_bytes 2048\n",
                          "\nrk_run_snapshot_held_bytes_peak 8192\n",
                          "\nrk_run_relaunches_total{source=\"memory\"} 2\n",
                          "\nrk_run_relaunches_total{source=\"disk\"} 1\n",
                          "\nrk_run_restarts_total 4\n",
                          "\nrk_run_step 130\n",
                          "# TYPE rk_run_snapshot_bytes gauge\n",
                          "# TYPE rk_run_relaunches_total counter\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!strstr(buf, want[i]))
            print_error("missing: %s\nin:\n%s", want[i], buf);
        assert_non_null(strstr(buf, want[i]));
    }
    /* every metric has its HELP and TYPE */
    const char *names[] = {"rk_run_info",
                           "rk_run_snapshot_bytes",
                           "rk_run_snapshot_bytes_peak",
                           "rk_run_snapshot_held_bytes",
                           "rk_run_snapshot_held_bytes_peak",
                           "rk_run_relaunches_total",
                           "rk_run_restarts_total",
                           "rk_run_step"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char h[96], t[96];
        snprintf(h, sizeof h, "# HELP %s ", names[i]);
        snprintf(t, sizeof t, "# TYPE %s ", names[i]);
        assert_non_null(strstr(buf, h));
        assert_non_null(strstr(buf, t));
    }
    /* too small a buffer: -1, not a cut file */
    assert_int_equal(rk_sup_metrics_format(&m, buf, 100), -1);
}

/* Every line the ledger writes is one rk report reads (events.h), with every field: a detail
 * cut mid-character by the incident's buffer (575 bytes of 2-byte characters) is written
 * cleaned, where it was once left out of the line (jansson refuses a string that is not
 * UTF-8). */
static void test_events_line_keeps_a_cut_detail(void **state)
{
    (void)state;
    snprintf(g_path, sizeof g_path, "%s/events.jsonl", g_dir);
    rk_ledger g;
    rk_err err = {0};
    assert_int_equal(rk_ledger_open(&g, g_path, &err), RK_OK);
    char long_detail[700] = "";
    for (int k = 0; k < 300; k++)
        strcat(long_detail, "\xc3\xa9"); /* é */
    rk_incident *i = rk_ledger_add(&g, "nan", 0, "0", "redo", "%s", long_detail);
    assert_int_equal(strlen(i->detail), sizeof i->detail - 1); /* cut mid-character */
    rk_ledger_write(&g, i);
    rk_ledger_close(&g);
    FILE *f = fopen(g_path, "r");
    assert_non_null(f);
    static char line[4096];
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_non_null(strstr(line, "\"detail\":\"\xc3\xa9\xc3\xa9"));
    rk_event e;
    assert_int_equal(rk_event_parse(line, strcspn(line, "\n"), &e, &err), RK_OK);
    assert_string_equal(e.kind, "nan");
    assert_int_equal(strlen(e.detail), sizeof i->detail - 1);
    assert_int_equal(e.detail[sizeof i->detail - 2], '?'); /* the cut character's first byte */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_events_in_time_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_counts_incidents_and_recoveries, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_events_line_keeps_a_cut_detail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_summary_says_the_snapshots_and_notes_are_not_incidents,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_text, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
