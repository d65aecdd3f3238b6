/*
 * Tests for the supervisor's ledger (src/supervisor/ledger.c): the events file is in time
 * order even when an incident waits for its recovery to be measured (a relaunch) while later
 * ones are final at once (a quarantine, an injection); an incident dated back to when its
 * failure was seen goes before the ones after it; the summary writes whatever still waits;
 * every line is one the reader takes (events.h), a detail cut mid-character included.
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
