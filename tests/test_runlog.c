/*
 * Tests for the run's records (src/supervisor/runlog.c) and rk report's renderer
 * (src/report/report.c): every record type survives format and parse; broken lines are
 * refused naming the field; the thinning keeps every record at first and never more than its
 * bound; the ledger writes launches, steps, checkpoints, gate readings and each incident's
 * step; the page has one incident marker per incident, escapes markup from the files, names
 * a bad line by file and number, and leaves out a torn last line; past the report's limits
 * (docs/report.md, "Limits") it keeps the first and last incidents and launches, samples the
 * steps (keeping the last), caps bars and device lines, and says what it left out; device ids
 * reach the page cleaned of control characters.
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

#include "report/report.h"
#include "supervisor/events.h"
#include "supervisor/runlog.h"
#include "supervisor/supervisor.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("runlog")

static rk_runlog_rec g_a, g_b;

static void roundtrip(const rk_runlog_rec *r, rk_runlog_rec *out)
{
    char line[RK_RUNLOG_MAX_LINE + 1];
    long n = rk_runlog_format(r, line, sizeof line);
    assert_true(n > 0);
    assert_int_equal((size_t)n, strlen(line));
    assert_null(strchr(line, '\n'));
    rk_err err = {0};
    assert_int_equal(rk_runlog_parse(line, (size_t)n, out, &err), RK_OK);
    assert_int_equal(out->type, r->type);
    assert_true(fabs(out->t - r->t) < 1e-3);
}

static void test_every_type_roundtrips(void **state)
{
    (void)state;
    rk_runlog_init(&g_a, RK_RUNLOG_LAUNCH);
    g_a.t = 1.5;
    g_a.launch = 3;
    g_a.ndevices = 3;
    strcpy(g_a.devices[0], "0");
    strcpy(g_a.devices[1], "h1:2");
    strcpy(g_a.devices[2], "cuda \"7\"");
    roundtrip(&g_a, &g_b);
    assert_int_equal(g_b.launch, 3);
    assert_int_equal(g_b.ndevices, 3);
    assert_string_equal(g_b.devices[1], "h1:2");
    assert_string_equal(g_b.devices[2], "cuda \"7\"");

    rk_runlog_init(&g_a, RK_RUNLOG_STEP);
    g_a.t = 2.25;
    g_a.launch = 1;
    g_a.step = 120;
    g_a.loss = 0.4127;
    g_a.dt = 0.031;
    roundtrip(&g_a, &g_b);
    assert_int_equal(g_b.step, 120);
    assert_true(fabs(g_b.loss - 0.4127) < 1e-9 && fabs(g_b.dt - 0.031) < 1e-9);
    g_a.loss = NAN; /* a NaN step: null in the file, NAN back */
    roundtrip(&g_a, &g_b);
    assert_true(isnan(g_b.loss));

    rk_runlog_init(&g_a, RK_RUNLOG_CKPT);
    g_a.t = 3;
    g_a.step = 100;
    g_a.seconds = 0.25;
    roundtrip(&g_a, &g_b);
    assert_int_equal(g_b.step, 100);
    assert_true(fabs(g_b.seconds - 0.25) < 1e-9);

    rk_runlog_init(&g_a, RK_RUNLOG_GATE);
    g_a.t = 4;
    strcpy(g_a.device, "2");
    g_a.score = 55;
    g_a.temperature_c = 84;
    g_a.simulated = 1;
    g_a.threshold = 60;
    roundtrip(&g_a, &g_b);
    assert_string_equal(g_b.device, "2");
    assert_int_equal(g_b.score, 55);
    assert_true(g_b.temperature_c == 84 && g_b.simulated && !g_b.lost && g_b.threshold == 60);
    g_a.temperature_c = NAN; /* not reported */
    roundtrip(&g_a, &g_b);
    assert_true(isnan(g_b.temperature_c));
}

static void test_bad_lines_refused(void **state)
{
    (void)state;
    static const struct {
        const char *line, *field;
    } bad[] = {
        {"", "not JSON"},
        {"[1]", "not a JSON object"},
        {"{\"t\":1}", "\"type\""},
        {"{\"type\":\"boom\",\"t\":1}", "\"type\""},
        {"{\"type\":\"step\",\"t\":-1,\"launch\":0,\"rank\":0,\"step\":1,\"loss\":1,\"dt\":0}",
         "\"t\""},
        {"{\"type\":\"step\",\"t\":1,\"launch\":0,\"rank\":0,\"step\":0,\"loss\":1,\"dt\":0}",
         "\"step\""},
        {"{\"type\":\"step\",\"t\":1,\"launch\":0,\"rank\":0,\"step\":1,\"loss\":\"x\",\"dt\":0}",
         "\"loss\""},
        {"{\"type\":\"step\",\"t\":1,\"launch\":0,\"rank\":0,\"step\":1,\"loss\":1,\"dt\":-2}",
         "\"dt\""},
        {"{\"type\":\"step\",\"t\":1,\"launch\":-1,\"rank\":0,\"step\":1,\"loss\":1,\"dt\":0}",
         "\"launch\""},
        {"{\"type\":\"step\",\"t\":1,\"launch\":0,\"rank\":70000,\"step\":1,\"loss\":1,\"dt\":0}",
         "\"rank\""},
        {"{\"type\":\"launch\",\"t\":1,\"launch\":0,\"devices\":[]}", "\"devices\""},
        {"{\"type\":\"launch\",\"t\":1,\"launch\":0,\"devices\":[\"\"]}", "\"devices\""},
        {"{\"type\":\"launch\",\"t\":1,\"launch\":0,\"devices\":[3]}", "\"devices\""},
        {"{\"type\":\"gate\",\"t\":1,\"device\":\"0\",\"score\":101,\"temperature_c\":50,"
         "\"lost\":false,\"simulated\":true,\"threshold\":60}",
         "\"score\""},
        {"{\"type\":\"gate\",\"t\":1,\"device\":\"0\",\"score\":50,\"temperature_c\":5000,"
         "\"lost\":false,\"simulated\":true,\"threshold\":60}",
         "\"temperature_c\""},
        {"{\"type\":\"gate\",\"t\":1,\"device\":\"0\",\"score\":50,\"temperature_c\":50,"
         "\"lost\":0,\"simulated\":true,\"threshold\":60}",
         "\"lost\""},
        {"{\"type\":\"ckpt\",\"t\":1,\"t\":2,\"launch\":0,\"rank\":0,\"step\":1,\"seconds\":0}",
         "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rk_err err = {0};
        rk_runlog_rec *r = &g_b;
        int rc = rk_runlog_parse(bad[i].line, strlen(bad[i].line), r, &err);
        if (rc != RK_EFORMAT || !strstr(err.msg, bad[i].field))
            fail_msg("line %zu (%s): rc %d, message '%s', wanted '%s'", i, bad[i].line, rc, err.msg,
                     bad[i].field);
    }
    /* the writer refuses what the reader would */
    char line[256];
    rk_runlog_init(&g_a, RK_RUNLOG_GATE);
    g_a.score = 101;
    strcpy(g_a.device, "0");
    assert_int_equal(rk_runlog_format(&g_a, line, sizeof line), -1);
    g_a.score = 50;
    g_a.device[0] = '\0';
    assert_int_equal(rk_runlog_format(&g_a, line, sizeof line), -1);
    strcpy(g_a.device, "0");
    assert_true(rk_runlog_format(&g_a, line, sizeof line) > 0);
    assert_int_equal(rk_runlog_format(&g_a, line, 10), -1); /* does not fit */
}

static void test_thinning_bounds_the_files(void **state)
{
    (void)state;
    rk_runlog_thin th = {0};
    for (int i = 0; i < RK_RUNLOG_THIN_EVERY; i++)
        assert_true(rk_runlog_thin_keep(&th));
    /* then one in two for the next RK_RUNLOG_THIN_EVERY lines */
    assert_true(rk_runlog_thin_keep(&th));
    assert_false(rk_runlog_thin_keep(&th));
    assert_true(rk_runlog_thin_keep(&th));
    assert_false(rk_runlog_thin_keep(&th));
    /* a very long run: never more than the bound */
    for (int64_t i = 0; i < 100000000; i++)
        (void)rk_runlog_thin_keep(&th);
    assert_true(th.written <= RK_RUNLOG_MAX_LINES);
    assert_true(th.written > 5 * RK_RUNLOG_THIN_EVERY);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *buf = malloc(1 << 20);
    assert_non_null(buf);
    *len = fread(buf, 1, (1 << 20) - 1, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

static void test_ledger_writes_records(void **state)
{
    (void)state;
    char ev[600], steps[600], gate[600];
    snprintf(ev, sizeof ev, "%s/events.jsonl", g_dir);
    snprintf(steps, sizeof steps, "%s/steps.jsonl", g_dir);
    snprintf(gate, sizeof gate, "%s/gate.jsonl", g_dir);
    rk_ledger g;
    rk_err err = {0};
    assert_int_equal(rk_ledger_open(&g, ev, &err), RK_OK);
    assert_int_equal(rk_ledger_open_records(&g, steps, gate, &err), RK_OK);
    const char *devs[2] = {"0", "3"};
    rk_ledger_launch_rec(&g, 0, devs, 2);
    for (int k = 1; k <= 5; k++) {
        rk_ledger_step(&g, k, 0.01);
        rk_ledger_step_rec(&g, 0, 0, k, k == 4 ? NAN : 1.0 / k, 0.01);
    }
    rk_ledger_ckpt_rec(&g, 0, 0, 5, 0.02);
    static rk_runlog_rec rd[2];
    for (int i = 0; i < 2; i++) {
        rk_runlog_init(&rd[i], RK_RUNLOG_GATE);
        strcpy(rd[i].device, devs[i]);
        rd[i].score = 90 - 40 * i;
        rd[i].threshold = 60;
    }
    rk_ledger_gate_rec(&g, rd, 2);
    rk_incident *i = rk_ledger_add(&g, "crash", 1, "3", "relaunch", "rank 1 vanished");
    assert_non_null(i);
    assert_int_equal(i->step, 5); /* where the job was */
    rk_ledger_write(&g, i);
    rk_ledger_close(&g);

    size_t n;
    char *text = slurp(steps, &n);
    int lines = 0, type_count[4] = {0};
    for (char *p = text, *nl; (nl = strchr(p, '\n')); p = nl + 1, lines++) {
        assert_int_equal(rk_runlog_parse(p, (size_t)(nl - p), &g_b, &err), RK_OK);
        type_count[g_b.type]++;
        if (g_b.type == RK_RUNLOG_STEP && g_b.step == 4)
            assert_true(isnan(g_b.loss));
    }
    assert_int_equal(lines, 7);
    assert_int_equal(type_count[RK_RUNLOG_LAUNCH], 1);
    assert_int_equal(type_count[RK_RUNLOG_STEP], 5);
    assert_int_equal(type_count[RK_RUNLOG_CKPT], 1);
    free(text);
    text = slurp(gate, &n);
    assert_non_null(strstr(text, "\"device\":\"3\",\"score\":50"));
    free(text);
    text = slurp(ev, &n);
    assert_non_null(strstr(text, "\"step\":5"));
    rk_event e;
    assert_int_equal(rk_event_parse(text, strcspn(text, "\n"), &e, &err), RK_OK);
    assert_string_equal(e.kind, "crash");
    assert_int_equal(e.step, 5);
    assert_int_equal(e.rank, 1);
    free(text);
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static void test_report_marks_and_escapes(void **state)
{
    (void)state;
    const char *events =
        "{\"t\":1.0,\"kind\":\"crash\",\"rank\":1,\"device\":\"1\",\"action\":\"relaunch\","
        "\"step\":2,\"detail\":\"x\"}\n"
        "{\"t\":1.5,\"kind\":\"inject\",\"rank\":1,\"device\":\"1\",\"action\":\"none\","
        "\"detail\":\"y\"}\n"
        "{\"t\":2.0,\"kind\":\"<script>k</script>\",\"rank\":null,\"device\":null,"
        "\"action\":\"a\",\"detail\":\"<script>alert('x')</script> & \\\"q\\\"\"}\n";
    const char *steps = "{\"type\":\"launch\",\"t\":0,\"launch\":0,\"devices\":[\"0\",\"1\"]}\n"
                        "{\"type\":\"step\",\"t\":0.5,\"launch\":0,\"rank\":0,\"step\":1,"
                        "\"loss\":2,\"dt\":0.1}\n"
                        "{\"type\":\"step\",\"t\":0.9,\"launch\":0,\"rank\":0,\"step\":2,"
                        "\"loss\":1,\"dt\":0.1}\n";
    rk_report_in in = {.name = "r<1>",
                       .events = events,
                       .events_len = strlen(events),
                       .steps = steps,
                       .steps_len = strlen(steps)};
    char *html = NULL;
    size_t len = 0;
    rk_report_stats st;
    rk_err err = {0};
    assert_int_equal(rk_report_render(&in, &html, &len, &st, &err), RK_OK);
    assert_int_equal(st.incidents, 2);
    assert_int_equal(st.injections, 1);
    assert_int_equal(st.steps, 2);
    assert_int_equal(st.launches, 1);
    assert_int_equal(count(html, "<g class=\"incident-marker"), 2);
    assert_int_equal(count(html, "class=\"inject-marker\""), 1);
    assert_int_equal(count(html, "class=\"launch-bar\""), 2);
    assert_int_equal(count(html, "<script"), 0);
    assert_non_null(strstr(html, "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; "
                                 "&quot;q&quot;"));
    assert_non_null(strstr(html, "data-kind=\"&lt;script&gt;k&lt;/script&gt;\""));
    assert_non_null(strstr(html, "rk report: r&lt;1&gt;"));
    assert_non_null(strstr(html, "data-kind=\"crash\" data-step=\"2\""));
    free(html);

    /* a bad line in the middle: the file and line are named, no page */
    const char *broken = "{\"type\":\"launch\",\"t\":0,\"launch\":0,\"devices\":[\"0\"]}\n"
                         "{\"type\":\"step\",\"t\":0.5}\n"
                         "{\"type\":\"launch\",\"t\":0,\"launch\":1,\"devices\":[\"0\"]}\n";
    in.steps = broken;
    in.steps_len = strlen(broken);
    assert_int_equal(rk_report_render(&in, &html, &len, &st, &err), RK_EFORMAT);
    assert_null(html);
    assert_non_null(strstr(err.msg, "steps.jsonl line 2: field \"launch\""));

    /* a torn last line (the writer was killed): left out, said */
    const char *torn = "{\"type\":\"launch\",\"t\":0,\"launch\":0,\"devices\":[\"0\"]}\n"
                       "{\"type\":\"step\",\"t\":0.5,\"lau";
    in.steps = torn;
    in.steps_len = strlen(torn);
    assert_int_equal(rk_report_render(&in, &html, &len, &st, &err), RK_OK);
    assert_int_equal(st.torn, 1);
    assert_int_equal(st.steps, 0);
    assert_non_null(strstr(html, "cut line"));
    free(html);

    /* gate records in the steps file are refused */
    const char *mixed = "{\"type\":\"gate\",\"t\":1,\"device\":\"0\",\"score\":50,"
                        "\"temperature_c\":50,\"lost\":false,\"simulated\":true,"
                        "\"threshold\":60}\n";
    in.steps = mixed;
    in.steps_len = strlen(mixed);
    assert_int_equal(rk_report_render(&in, &html, &len, &st, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "gate records"));

    /* a summary that is not an object */
    in.steps = steps;
    in.steps_len = strlen(steps);
    in.summary = "[]";
    in.summary_len = 2;
    assert_int_equal(rk_report_render(&in, &html, &len, &st, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "summary.json: not a JSON object"));
}

static void test_report_reads_train_loss_log(void **state)
{
    (void)state;
    const char *loss = "0 2.30258512\n1 1.5\n2 nan\n3 0.9\n";
    rk_report_in in = {.name = "solo", .loss = loss, .loss_len = strlen(loss)};
    char *html = NULL;
    size_t len = 0;
    rk_report_stats st;
    rk_err err = {0};
    assert_int_equal(rk_report_render(&in, &html, &len, &st, &err), RK_OK);
    assert_int_equal(st.steps, 4);
    assert_int_equal(count(html, "class=\"loss-line\""), 2); /* broken at the NaN step */
    assert_int_equal(count(html, "class=\"nan-step\""), 1);
    assert_non_null(strstr(html, "loss.log has no times"));
    free(html);
    static const char *const bad[] = {"1 2\nx 1\n", "1 2\n2  1\n", "1 2\n2 x\n", "1 2\n-2 1\n",
                                      "1 2\n2 1 3\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        in.loss = bad[i];
        in.loss_len = strlen(bad[i]);
        assert_int_equal(rk_report_render(&in, &html, &len, &st, &err), RK_EFORMAT);
        assert_non_null(strstr(err.msg, "loss.log line 2: not \"STEP LOSS\""));
    }
}

/* A text of many lines into a new buffer: line(i, buf) writes line i (with its newline). */
typedef int (*line_gen)(long i, char *buf, size_t cap);

static char *lines_of(long n, line_gen gen, size_t *len)
{
    size_t cap = 1 << 16, used = 0;
    char *t = malloc(cap);
    assert_non_null(t);
    for (long i = 0; i < n; i++) {
        char line[8192];
        int k = gen(i, line, sizeof line);
        assert_true(k > 0 && (size_t)k < sizeof line);
        if (used + (size_t)k + 1 > cap) {
            cap *= 2;
            t = realloc(t, cap);
            assert_non_null(t);
        }
        memcpy(t + used, line, (size_t)k);
        used += (size_t)k;
    }
    t[used] = '\0';
    *len = used;
    return t;
}

static int gen_incident(long i, char *b, size_t cap)
{
    return snprintf(b, cap, "{\"t\":%ld,\"kind\":\"crash\",\"detail\":\"incident %ld\"}\n", i,
                    i + 1);
}

static int gen_loss(long i, char *b, size_t cap)
{
    return snprintf(b, cap, "%ld %g\n", i, 1.0 / (double)(i + 1));
}

static int gen_launch(long i, char *b, size_t cap)
{
    int k = snprintf(b, cap, "{\"type\":\"launch\",\"t\":%ld,\"launch\":%ld,\"devices\":[", i, i);
    for (int r = 0; r < RK_RUNLOG_MAX_DEVICES; r++)
        k += snprintf(b + k, cap - (size_t)k, "%s\"d%d\"", r ? "," : "", r);
    return k + snprintf(b + k, cap - (size_t)k, "]}\n");
}

static int gen_gate(long i, char *b, size_t cap)
{
    return snprintf(b, cap,
                    "{\"type\":\"gate\",\"t\":%ld,\"device\":\"g%ld\",\"score\":50,"
                    "\"temperature_c\":50,\"lost\":false,\"simulated\":true,\"threshold\":30}\n",
                    i / 300, i % 300);
}

static char *render_ok(const rk_report_in *in, size_t *len, rk_report_stats *st)
{
    char *html = NULL;
    rk_err err = {0};
    assert_int_equal(rk_report_render(in, &html, len, st, &err), RK_OK);
    assert_true(*len <= RK_REPORT_MAX_PAGE);
    return html;
}

/* 600 incidents: the first 250 and the last 250 are marked and listed, with their numbers;
 * the page and the table say which 100 were left out. */
static void test_report_keeps_first_and_last_incidents(void **state)
{
    (void)state;
    size_t n;
    char *events = lines_of(600, gen_incident, &n);
    rk_report_in in = {.name = "many", .events = events, .events_len = n};
    rk_report_stats st;
    size_t len;
    char *html = render_ok(&in, &len, &st);
    assert_int_equal(st.incidents, 600);
    assert_true(st.left_out);
    assert_int_equal(count(html, "<g class=\"incident-marker"), RK_REPORT_KEEP_EVENTS);
    assert_non_null(strstr(html, "data-n=\"250\""));
    assert_null(strstr(html, "data-n=\"251\""));
    assert_null(strstr(html, "data-n=\"350\""));
    assert_non_null(strstr(html, "data-n=\"351\""));
    assert_non_null(strstr(html, "data-n=\"600\""));
    assert_non_null(strstr(html, "<td>600</td>"));
    assert_non_null(strstr(html, "incident 600</td>"));
    assert_non_null(strstr(html, "100 of the 600 incidents in events.jsonl (#251 to #350"));
    assert_non_null(strstr(html, "&#8230; 100 more left out"));
    assert_non_null(strstr(html, "<dt>incidents</dt><dd>600</dd>"));
    free(html);
    free(events);
}

/* A million steps in loss.log: one in 4 kept (the sample halves each time it fills: 250000),
 * and the last one too; the page says so, and its step count is the last step's. */
static void test_report_samples_steps(void **state)
{
    (void)state;
    size_t n;
    char *loss = lines_of(1000000, gen_loss, &n);
    rk_report_in in = {.name = "long", .loss = loss, .loss_len = n};
    rk_report_stats st;
    size_t len;
    char *html = render_ok(&in, &len, &st);
    assert_int_equal(st.steps, 1000000);
    assert_true(st.left_out);
    assert_non_null(strstr(html, "749999 of the 1000000 step records of loss.log (one in 4 is "
                                 "drawn, and the last)"));
    assert_non_null(strstr(html, "<dt>steps</dt><dd>1000000</dd>"));
    assert_int_equal(count(html, "class=\"loss-line\""), 1);
    free(html);
    free(loss);
}

/* 20 launches of 256 ranks: 5120 bars would be drawn; the first 4 launches and the last 4
 * have theirs (2048), and the page says which are left out. 300 devices read by the gate:
 * 256 have lines. */
static void test_report_caps_bars_and_lines(void **state)
{
    (void)state;
    size_t n, ng;
    char *steps = lines_of(20, gen_launch, &n);
    char *gate = lines_of(600, gen_gate, &ng);
    rk_report_in in = {
        .name = "wide", .steps = steps, .steps_len = n, .gate = gate, .gate_len = ng};
    rk_report_stats st;
    size_t len;
    char *html = render_ok(&in, &len, &st);
    assert_int_equal(st.launches, 20);
    assert_int_equal(st.gpus, 300);
    assert_int_equal(count(html, "<g class=\"launch-bar\""), RK_REPORT_MAX_BARS);
    assert_non_null(strstr(html, "data-launch=\"3\" data-rank=\"255\""));
    assert_null(strstr(html, "data-launch=\"4\" data-rank=\"0\""));
    assert_non_null(strstr(html, "data-launch=\"16\" data-rank=\"0\""));
    assert_non_null(strstr(html, "the bars of 12 of the 20 launches kept"));
    assert_int_equal(count(html, "class=\"score-line\""), RK_REPORT_MAX_SERIES);
    assert_int_equal(count(html, "class=\"temp-line\""), RK_REPORT_MAX_SERIES);
    assert_non_null(strstr(html, "the lines of 44 of the 300 devices in gate.jsonl"));
    free(html);
    free(steps);
    free(gate);
}

/* Device ids from steps.jsonl and gate.jsonl reach the page cleaned, as every string does. */
static void test_report_cleans_device_ids(void **state)
{
    (void)state;
    const char *steps =
        "{\"type\":\"launch\",\"t\":0,\"launch\":0,\"devices\":[\"\\u001b[31mred\",\"b\\u0007\","
        "\"\\u009b2J\"]}\n";
    const char *gate = "{\"type\":\"gate\",\"t\":1,\"device\":\"\\u001b]0;x\\u0007\",\"score\":50,"
                       "\"temperature_c\":50,\"lost\":false,\"simulated\":true,"
                       "\"threshold\":30}\n";
    rk_report_in in = {.name = "ids",
                       .steps = steps,
                       .steps_len = strlen(steps),
                       .gate = gate,
                       .gate_len = strlen(gate)};
    rk_report_stats st;
    size_t len;
    char *html = render_ok(&in, &len, &st);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)html[i];
        assert_false((c < 0x20 && c != '\n') || c == 0x7f);
        assert_false(c == 0xc2 && i + 1 < len && (unsigned char)html[i + 1] >= 0x80 &&
                     (unsigned char)html[i + 1] <= 0x9f); /* C1 */
    }
    assert_non_null(strstr(html, "data-device=\"?[31mred\""));
    assert_non_null(strstr(html, "data-device=\"b?\""));
    assert_non_null(strstr(html, "data-device=\"?2J\""));
    assert_non_null(strstr(html, "device ?]0;x?"));
    free(html);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_roundtrips),
        cmocka_unit_test(test_bad_lines_refused),
        cmocka_unit_test(test_thinning_bounds_the_files),
        cmocka_unit_test_setup_teardown(test_ledger_writes_records, setup, teardown),
        cmocka_unit_test(test_report_marks_and_escapes),
        cmocka_unit_test(test_report_reads_train_loss_log),
        cmocka_unit_test(test_report_keeps_first_and_last_incidents),
        cmocka_unit_test(test_report_samples_steps),
        cmocka_unit_test(test_report_caps_bars_and_lines),
        cmocka_unit_test(test_report_cleans_device_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
