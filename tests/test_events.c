/*
 * Tests for the events file's line (src/supervisor/events.c), written by the ledger and read
 * by rk report through one table of fields: an event of every kind, with every field known and
 * with every field unknown, formats and parses back as the same event; lines the ledger wrote
 * (a demo run's) parse and format back to the same bytes; hostile lines are refused naming the
 * field; text is cleaned and cut on a character boundary; the writer never leaves a field out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "supervisor/events.h"
#include "supervisor/policy.h"

static rk_event g_a, g_b;
static char g_line[RK_EVENT_MAX_LINE + 1];

static void assert_same(const rk_event *a, const rk_event *b)
{
    assert_string_equal(a->time, b->time);
    assert_true(a->t == b->t);
    assert_string_equal(a->kind, b->kind);
    assert_int_equal(a->rank, b->rank);
    assert_string_equal(a->device, b->device);
    assert_string_equal(a->action, b->action);
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->lost_steps, b->lost_steps);
    assert_true(a->recovery_s == b->recovery_s || (isnan(a->recovery_s) && isnan(b->recovery_s)));
    assert_string_equal(a->detail, b->detail);
    assert_string_equal(a->stacks, b->stacks);
}

/* format, then parse: the same event, and the same line again */
static void roundtrip(const rk_event *e)
{
    long n = rk_event_format(e, g_line, sizeof g_line);
    assert_true(n > 0);
    assert_int_equal((size_t)n, strlen(g_line));
    assert_null(strchr(g_line, '\n'));
    rk_err err = {0};
    assert_int_equal(rk_event_parse(g_line, (size_t)n, &g_b, &err), RK_OK);
    assert_same(e, &g_b);
    char again[RK_EVENT_MAX_LINE + 1];
    assert_int_equal(rk_event_format(&g_b, again, sizeof again), n);
    assert_string_equal(again, g_line);
}

/* Every word the policy names, and the others docs/run.md lists ("Accounting"). */
static const char *const k_other[] = {
    "commfail",    "nan",          "grad_outlier",      "replica_mismatch", "quarantine",
    "health_gate", "health_drain", "predicted_failure", "inject",           "a later kind"};

static void each_kind(void (*fn)(const char *kind))
{
    int named = 0;
    for (int k = 0; k <= RK_SUP_KIND_OTHER; k++)
        if (rk_sup_kind_name((rk_sup_kind)k)) {
            fn(rk_sup_kind_name((rk_sup_kind)k));
            named++;
        }
    assert_true(named >= 12); /* crash, hang, ..., node_lost */
    for (size_t q = 0; q < sizeof k_other / sizeof k_other[0]; q++)
        fn(k_other[q]);
}

static void full_event(const char *kind)
{
    rk_event_init(&g_a);
    rk_event_stamp(&g_a, 1796544963.125);
    assert_string_equal(g_a.time, "2026-12-06T08:16:03.125Z");
    g_a.t = 82.259;
    snprintf(g_a.kind, sizeof g_a.kind, "%s", kind);
    g_a.rank = 65535;
    snprintf(g_a.device, sizeof g_a.device, "host-b:GPU-5e1f");
    snprintf(g_a.action, sizeof g_a.action, "relaunch");
    g_a.step = (int64_t)1 << 53;
    g_a.lost_steps = 50;
    g_a.recovery_s = 8.61;
    snprintf(g_a.detail, sizeof g_a.detail, "rank 1 (device 1) \"quoted\" \\ <b> é 漢");
    snprintf(g_a.stacks, sizeof g_a.stacks, "/run/a/stacks-rank0.txt\n/run/a/stacks-rank1.txt");
    roundtrip(&g_a);
}

static void unknown_event(const char *kind)
{
    rk_event_init(&g_a); /* rank, device, step, lost_steps, recovery_s, stacks unknown */
    g_a.t = 0;
    snprintf(g_a.kind, sizeof g_a.kind, "%s", kind);
    roundtrip(&g_a);
    assert_null(strstr(g_line, "\"stacks\""));
    assert_non_null(strstr(g_line, "\"rank\":null,\"device\":null,\"action\":\"\",\"step\":null,"
                                   "\"lost_steps\":null,\"recovery_s\":null,\"detail\":\"\"}"));
}

static void test_every_kind_round_trips(void **state)
{
    (void)state;
    each_kind(full_event);
    each_kind(unknown_event);
}

/* Lines the ledger wrote before events.c (a demo run of rk run, and a hang with its stack
 * dumps): parsed and formatted, the same bytes. */
static const char *const k_written[] = {
    "{\"time\":\"2026-12-06T08:14:49.050Z\",\"t\":33.125,\"kind\":\"inject\",\"rank\":2,"
    "\"device\":\"2\",\"action\":\"none\",\"step\":150,\"lost_steps\":0,\"recovery_s\":null,"
    "\"detail\":\"injected fault 0 (crash) at step 150 (simulated)\"}",
    "{\"time\":\"2026-12-06T08:15:38.184Z\",\"t\":82.259,\"kind\":\"hang\",\"rank\":1,"
    "\"device\":\"1\",\"action\":\"relaunch\",\"step\":350,\"lost_steps\":0,\"recovery_s\":8.61,"
    "\"detail\":\"rank 1 (device 1) made no progress for 5.1 s at step 350; the other ranks "
    "wait for it\"}",
    "{\"time\":\"2026-12-06T08:16:04.212Z\",\"t\":108.288,\"kind\":\"replica_mismatch\","
    "\"rank\":2,\"device\":\"2\",\"action\":\"rollback\",\"step\":450,\"lost_steps\":10,"
    "\"recovery_s\":0.276,\"detail\":\"step 450: parameters of rank 2 differ from the "
    "majority's (3 of 4 ranks); repaired from rank 0, replaying from step 440\"}",
    "{\"time\":\"2026-12-06T08:16:05.000Z\",\"t\":1234.5,\"kind\":\"hang\",\"rank\":0,"
    "\"device\":\"0\",\"action\":\"relaunch\",\"step\":12,\"lost_steps\":3,\"recovery_s\":"
    "1.001,\"detail\":\"no progress\",\"stacks\":[\"/tmp/r/stacks-rank0-launch1.txt\","
    "\"/tmp/r/stacks-rank1-launch1.txt\"]}",
    "{\"time\":\"2026-12-06T08:16:05.000Z\",\"t\":0.001,\"kind\":\"usage\",\"rank\":null,"
    "\"device\":null,\"action\":\"stop\",\"step\":null,\"lost_steps\":null,\"recovery_s\":null,"
    "\"detail\":\"rank 0 exited with status 2\"}",
};

static void test_written_lines_read_back_the_same(void **state)
{
    (void)state;
    for (size_t q = 0; q < sizeof k_written / sizeof k_written[0]; q++) {
        rk_err err = {0};
        assert_int_equal(rk_event_parse(k_written[q], strlen(k_written[q]), &g_a, &err), RK_OK);
        assert_int_equal(rk_event_format(&g_a, g_line, sizeof g_line), strlen(k_written[q]));
        assert_string_equal(g_line, k_written[q]);
    }
}

static void test_hostile_lines_refused(void **state)
{
    (void)state;
    static const struct {
        const char *line, *names;
    } bad[] = {
        {"", "not JSON"},
        {"[1]", "not a JSON object"},
        {"{\"kind\":\"crash\"}", "\"t\""},
        {"{\"t\":-1,\"kind\":\"crash\"}", "\"t\""},
        {"{\"t\":1e11,\"kind\":\"crash\"}", "\"t\""},
        {"{\"t\":\"1\",\"kind\":\"crash\"}", "\"t\""},
        {"{\"t\":null,\"kind\":\"crash\"}", "\"t\""},
        {"{\"t\":1}", "\"kind\""},
        {"{\"t\":1,\"kind\":\"\"}", "\"kind\""},
        {"{\"t\":1,\"kind\":null}", "\"kind\""},
        {"{\"t\":1,\"kind\":3}", "\"kind\""},
        {"{\"t\":1,\"kind\":\"crash\",\"time\":5}", "\"time\""},
        {"{\"t\":1,\"kind\":\"crash\",\"rank\":70000}", "\"rank\""},
        {"{\"t\":1,\"kind\":\"crash\",\"rank\":-1}", "\"rank\""},
        {"{\"t\":1,\"kind\":\"crash\",\"rank\":1.5}", "\"rank\""},
        {"{\"t\":1,\"kind\":\"crash\",\"rank\":\"1\"}", "\"rank\""},
        {"{\"t\":1,\"kind\":\"crash\",\"device\":[]}", "\"device\""},
        {"{\"t\":1,\"kind\":\"crash\",\"action\":true}", "\"action\""},
        {"{\"t\":1,\"kind\":\"crash\",\"step\":-1}", "\"step\""},
        {"{\"t\":1,\"kind\":\"crash\",\"step\":9007199254740993}", "\"step\""},
        {"{\"t\":1,\"kind\":\"crash\",\"lost_steps\":-2}", "\"lost_steps\""},
        {"{\"t\":1,\"kind\":\"crash\",\"recovery_s\":-1}", "\"recovery_s\""},
        {"{\"t\":1,\"kind\":\"crash\",\"recovery_s\":\"x\"}", "\"recovery_s\""},
        {"{\"t\":1,\"kind\":\"crash\",\"detail\":5}", "\"detail\""},
        {"{\"t\":1,\"kind\":\"crash\",\"stacks\":\"/a\"}", "\"stacks\""},
        {"{\"t\":1,\"kind\":\"crash\",\"stacks\":[1]}", "\"stacks\""},
        {"{\"t\":1,\"t\":2,\"kind\":\"crash\"}", "not JSON"},
    };
    for (size_t q = 0; q < sizeof bad / sizeof bad[0]; q++) {
        rk_err err = {0};
        int rc = rk_event_parse(bad[q].line, strlen(bad[q].line), &g_a, &err);
        if (rc != RK_EFORMAT || !strstr(err.msg, bad[q].names))
            fail_msg("line %zu (%s): status %d, \"%s\" (wanted it to name %s)", q, bad[q].line, rc,
                     err.msg, bad[q].names);
    }
    /* longer than a line may be: refused before it is parsed */
    static char big[RK_EVENT_MAX_LINE + 2];
    memset(big, ' ', sizeof big - 1);
    memcpy(big, "{\"t\":1,\"kind\":\"crash\"}", 22);
    rk_err err = {0};
    assert_int_equal(rk_event_parse(big, RK_EVENT_MAX_LINE + 1, &g_a, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "longer than 65536"));
    assert_int_equal(rk_event_parse(big, RK_EVENT_MAX_LINE, &g_a, &err), RK_OK);
    /* the writer writes nothing the reader refuses */
    rk_event_init(&g_a);
    g_a.t = 1;
    assert_int_equal(rk_event_format(&g_a, g_line, sizeof g_line), -1); /* kind empty */
    snprintf(g_a.kind, sizeof g_a.kind, "crash");
    g_a.t = NAN;
    assert_int_equal(rk_event_format(&g_a, g_line, sizeof g_line), -1);
    g_a.t = 2e10;
    assert_int_equal(rk_event_format(&g_a, g_line, sizeof g_line), -1);
    g_a.t = 1;
    assert_int_equal(rk_event_format(&g_a, g_line, 10), -1); /* does not fit */
    /* a value outside its field's bounds is written as unknown */
    g_a.rank = 70000;
    g_a.step = -5;
    g_a.recovery_s = -1;
    assert_true(rk_event_format(&g_a, g_line, sizeof g_line) > 0);
    assert_non_null(strstr(g_line, "\"rank\":null"));
    assert_non_null(strstr(g_line, "\"step\":null"));
    assert_non_null(strstr(g_line, "\"recovery_s\":null"));
    assert_int_equal(rk_event_parse(g_line, strlen(g_line), &g_b, &err), RK_OK);
}

static void test_text_cleaned_and_cut(void **state)
{
    (void)state;
    /* control characters read as '?', unknown fields ignored, absent ones unknown */
    const char *l = "{\"t\":1,\"kind\":\"cr\\u001bash\",\"detail\":\"a\\nb\\u0007\",\"new\":[1]}";
    rk_err err = {0};
    assert_int_equal(rk_event_parse(l, strlen(l), &g_a, &err), RK_OK);
    assert_string_equal(g_a.kind, "cr?ash");
    assert_string_equal(g_a.detail, "a?b?");
    assert_int_equal(g_a.rank, -1);
    assert_int_equal(g_a.step, -1);
    assert_true(isnan(g_a.recovery_s));
    /* a detail longer than the field: cut on a character boundary */
    static char line[8192];
    int n = snprintf(line, sizeof line, "{\"t\":1,\"kind\":\"x\",\"detail\":\"a");
    for (int k = 0; k < 1000; k++)
        n += snprintf(line + n, sizeof line - (size_t)n, "é");
    snprintf(line + n, sizeof line - (size_t)n, "\"}");
    assert_int_equal(rk_event_parse(line, strlen(line), &g_a, &err), RK_OK);
    assert_int_equal(strlen(g_a.detail), 1023);
    /* stacks: the files that fit whole */
    n = snprintf(line, sizeof line, "{\"t\":1,\"kind\":\"hang\",\"stacks\":[");
    for (int k = 0; k < 40; k++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s\"/%060d\"", k ? "," : "", k);
    snprintf(line + n, sizeof line - (size_t)n, "]}");
    assert_int_equal(rk_event_parse(line, strlen(line), &g_a, &err), RK_OK);
    assert_int_equal(strlen(g_a.stacks), 33 * 62 - 1); /* 33 of 61 bytes, newlines between */
    /* the writer: text that is not UTF-8 (a detail cut mid-character) is written cleaned */
    rk_event_init(&g_a);
    g_a.t = 1;
    snprintf(g_a.kind, sizeof g_a.kind, "crash");
    snprintf(g_a.detail, sizeof g_a.detail, "cut \xc3");
    snprintf(g_a.stacks, sizeof g_a.stacks, "/a\xff");
    assert_true(rk_event_format(&g_a, g_line, sizeof g_line) > 0);
    assert_non_null(strstr(g_line, "\"detail\":\"cut ?\",\"stacks\":[\"/a?\"]}"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_round_trips),
        cmocka_unit_test(test_written_lines_read_back_the_same),
        cmocka_unit_test(test_hostile_lines_refused),
        cmocka_unit_test(test_text_cleaned_and_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
