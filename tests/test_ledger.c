/*
 * Tests for the supervisor's ledger (src/supervisor/ledger.c): the events file is in time
 * order even when an incident waits for its recovery to be measured (a relaunch) while later
 * ones are final at once (a quarantine, an injection); an incident dated back to when its
 * failure was seen goes before the ones after it; the summary writes whatever still waits.
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
    assert_int_equal(rk_ledger_summary(&g, NULL, NULL, 10, 1, "failed", &err), RK_OK);
    kinds(got, sizeof got);
    assert_string_equal(got, "inject,health_gate,crash,quarantine,hang,nan");
    rk_ledger_close(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_events_in_time_order, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
