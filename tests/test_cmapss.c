/*
 * Tests for the C-MAPSS reader and protocol (predict/cmapss.h): a well-formed table parses
 * into engines with their rows; missing-value markers are counted and filled by linear
 * interpolation within the engine (never across engines); broken inputs (column counts, text,
 * infinities, a missing unit, cycle gaps, engines out of order, empty files, bad RUL files)
 * are refused with a message naming the file, line and problem; and the protocol on a small
 * synthetic fleet makes the windows it should (counts, padding of short test engines), learns
 * something, leaves the test files unread when asked, and names a missing file.
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
#include <sys/stat.h>
#include <unistd.h>

#include "predict/cmapss.h"
#include "rekindle/rng.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_cmapss")

/* A row: unit, cycle, then 24 values v0 + j (j = 0..23), or `tok` at value index `at`. */
static int row(char *buf, size_t cap, int unit, int cycle, float v0, int at, const char *tok)
{
    int n = snprintf(buf, cap, "%d %d", unit, cycle);
    for (int j = 0; j < RK_CMAPSS_VALUES; j++)
        n += j == at ? snprintf(buf + n, cap - (size_t)n, " %s", tok)
                     : snprintf(buf + n, cap - (size_t)n, " %.4f", v0 + (float)j);
    n += snprintf(buf + n, cap - (size_t)n, "  \n");
    return n;
}

static int parse(const char *text, rk_cmapss_table *t, rk_err *err)
{
    return rk_cmapss_parse(text, strlen(text), "t.txt", t, err);
}

static void test_parse_good(void **state)
{
    (void)state;
    char text[8192];
    size_t n = 0;
    int lens[3] = {3, 1, 4};
    for (int u = 0; u < 3; u++)
        for (int c = 1; c <= lens[u]; c++)
            n += (size_t)row(text + n, sizeof text - n, u + 1, c, (float)(100 * u + c), -1, NULL);
    n += (size_t)snprintf(text + n, sizeof text - n, "\n"); /* the files end with a blank */
    rk_cmapss_table t;
    rk_err err = {0};
    assert_int_equal(parse(text, &t, &err), RK_OK);
    assert_int_equal(t.rows, 8);
    assert_int_equal(t.engines, 3);
    assert_int_equal(t.first[0], 0);
    assert_int_equal(t.first[1], 3);
    assert_int_equal(t.first[2], 4);
    assert_int_equal(t.first[3], 8);
    assert_int_equal(t.missing, 0);
    assert_int_equal(t.unit[5], 3);
    assert_int_equal(t.cycle[5], 2);
    assert_true(t.v[5 * RK_CMAPSS_VALUES + 7] == 202.0f + 7.0f);
    rk_cmapss_free(&t);
}

static void test_missing_values_imputed(void **state)
{
    (void)state;
    /* Engine 1: value 4 (s2) missing at cycles 1, 3, 4 and 6 of 6 (start, a gap of two, end);
     * engine 2: one missing value that must not borrow from engine 1. Markers of every kind
     * the shared copy uses. */
    const char *tok[7] = {"NAN", NULL, "'N/A'", "None", NULL, "nan", NULL};
    char text[8192];
    size_t n = 0;
    for (int c = 1; c <= 6; c++)
        n += (size_t)row(text + n, sizeof text - n, 1, c, (float)(10 * c), tok[c - 1] ? 4 : -1,
                         tok[c - 1]);
    n += (size_t)row(text + n, sizeof text - n, 2, 1, 500.0f, 4, "\"null\"");
    n += (size_t)row(text + n, sizeof text - n, 2, 2, 600.0f, -1, NULL);
    rk_cmapss_table t;
    rk_err err = {0};
    assert_int_equal(parse(text, &t, &err), RK_OK);
    assert_int_equal(t.missing, 5);
    assert_true(isnan(t.v[0 * RK_CMAPSS_VALUES + 4]));
    assert_int_equal(rk_cmapss_impute(&t, "t.txt", &err), RK_OK);
    const float *v = t.v + 4;
    const size_t S = RK_CMAPSS_VALUES;
    assert_true(v[0 * S] == 24.0f);               /* start: the next value (cycle 2) */
    assert_true(fabsf(v[2 * S] - 34.0f) < 1e-4f); /* 24 .. 54 over three steps */
    assert_true(fabsf(v[3 * S] - 44.0f) < 1e-4f);
    assert_true(v[5 * S] == 54.0f);  /* end: the last value (cycle 5) */
    assert_true(v[6 * S] == 604.0f); /* engine 2: its own next value */
    for (size_t i = 0; i < t.rows * S; i++)
        assert_true(isfinite(t.v[i]));
    rk_cmapss_free(&t);

    /* A column with no value at all in one engine cannot be filled. */
    n = 0;
    n += (size_t)row(text + n, sizeof text - n, 1, 1, 1.0f, -1, NULL);
    n += (size_t)row(text + n, sizeof text - n, 2, 1, 1.0f, 9, "NaN");
    n += (size_t)row(text + n, sizeof text - n, 2, 2, 1.0f, 9, "NaN");
    assert_int_equal(parse(text, &t, &err), RK_OK);
    assert_int_equal(rk_cmapss_impute(&t, "t.txt", &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "unit 2"));
    assert_non_null(strstr(err.msg, "s7"));
    rk_cmapss_free(&t);
}

static void refused(const char *text, const char *needle)
{
    rk_cmapss_table t;
    rk_err err = {0};
    int rc = parse(text, &t, &err);
    if (rc != RK_EFORMAT || !strstr(err.msg, needle) || !strstr(err.msg, "t.txt")) {
        print_error("input %.60s...: rc %d message '%s', wanted '%s'\n", text, rc, err.msg, needle);
        fail();
    }
    assert_null(t.unit);
    assert_int_equal(t.rows, 0);
}

static void test_parse_broken(void **state)
{
    (void)state;
    char a[1024], b[1024], text[4096];
    row(a, sizeof a, 1, 1, 1.0f, -1, NULL);
    /* 25 and 27 columns. */
    snprintf(text, sizeof text,
             "%s1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25\n", a);
    refused(text, "t.txt:2: 25 columns, expected 26");
    snprintf(text, sizeof text, "%.*s 7\n", (int)strlen(a) - 1, a);
    refused(text, "t.txt:1: more than 26 columns");
    /* Text, infinity, a number with junk after it. */
    row(b, sizeof b, 1, 2, 1.0f, 6, "abc");
    snprintf(text, sizeof text, "%s%s", a, b);
    refused(text, "t.txt:2: column 9 (s4) is not a number");
    row(b, sizeof b, 1, 2, 1.0f, 6, "inf");
    snprintf(text, sizeof text, "%s%s", a, b);
    refused(text, "column 9 (s4) is not a number");
    row(b, sizeof b, 1, 2, 1.0f, 6, "1e39"); /* finite, but not as a float */
    snprintf(text, sizeof text, "%s%s", a, b);
    refused(text, "column 9 (s4) is not a number");
    row(b, sizeof b, 1, 2, 1.0f, 6, "1.5x");
    snprintf(text, sizeof text, "%s%s", a, b);
    refused(text, "not a number");
    /* The unit or the cycle missing, fractional or zero. */
    refused("NaN 1 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24\n",
            "column 1 (unit) is missing");
    refused("1 1.5 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24\n",
            "whole numbers");
    refused("0 1 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24\n",
            "whole numbers");
    /* A cycle gap, an engine that does not start at cycle 1, engines out of order. */
    row(b, sizeof b, 1, 3, 1.0f, -1, NULL);
    snprintf(text, sizeof text, "%s%s", a, b);
    refused(text, "t.txt:2: unit 1 cycle 3, expected cycle 2");
    row(b, sizeof b, 2, 2, 1.0f, -1, NULL);
    snprintf(text, sizeof text, "%s%s", a, b);
    refused(text, "unit 2 cycle 2, expected cycle 1");
    char c[1024];
    row(b, sizeof b, 2, 1, 1.0f, -1, NULL);
    row(c, sizeof c, 1, 1, 1.0f, -1, NULL);
    snprintf(text, sizeof text, "%s%s%s", a, b, c);
    refused(text, "t.txt:3: unit 1 after unit 2");
    /* Nothing at all. */
    refused("", "no rows");
    refused("\n  \n\n", "no rows");
}

static void test_rul(void **state)
{
    (void)state;
    float rul[3];
    rk_err err = {0};
    const char *good = "112\n98 \n\n69\n";
    assert_int_equal(rk_cmapss_parse_rul(good, strlen(good), "R", 3, rul, &err), RK_OK);
    assert_true(rul[0] == 112 && rul[1] == 98 && rul[2] == 69);
    struct {
        const char *text, *needle;
    } bad[] = {
        {"1\n2\n", "R: 2 values for 3 test engines"},
        {"1\n2\n3\n4\n", "R:4: more lines than the 3 test engines"},
        {"1\n-2\n3\n", "R:2: not a whole number"},
        {"1\n2.5\n3\n", "R:2: not a whole number"},
        {"1\nNaN\n3\n", "R:2: not a whole number"},
        {"1\n2 3\n4\n", "R:2: not a whole number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(rk_cmapss_parse_rul(bad[i].text, strlen(bad[i].text), "R", 3, rul, &err),
                         RK_EFORMAT);
        if (!strstr(err.msg, bad[i].needle)) {
            print_error("'%s': '%s', wanted '%s'\n", bad[i].text, err.msg, bad[i].needle);
            fail();
        }
    }
}

/* ---- the protocol on a synthetic fleet ------------------------------------------------------ */

/* Engines whose sensors drift with wear (life fraction) plus noise, in C-MAPSS layout. Test
 * engines are cut off at a random cycle; engine 1 of the test set is shorter than the
 * window. */
static void write_fleet(const char *dir, int ntrain, int ntest, uint64_t seed)
{
    char path[700];
    rk_rng r;
    rk_rng_seed(&r, seed);
    for (int which = 0; which < 2; which++) {
        snprintf(path, sizeof path, "%s/%s", dir, which ? "test_FD001.txt" : "train_FD001.txt");
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        FILE *rf = NULL;
        if (which) {
            snprintf(path, sizeof path, "%s/RUL_FD001.txt", dir);
            rf = fopen(path, "w");
            assert_non_null(rf);
        }
        for (int u = 1; u <= (which ? ntest : ntrain); u++) {
            int life = 60 + (int)rk_rng_below(&r, 60);
            int shown =
                which ? (u == 1 ? 8 : 20 + (int)rk_rng_below(&r, (uint64_t)life - 25)) : life;
            for (int c = 1; c <= shown; c++) {
                double wear = (double)c / life;
                fprintf(f, "%d %d 0 0 100", u, c);
                for (int s = 1; s <= 21; s++)
                    fprintf(f, " %.4f",
                            500.0 + 10.0 * s + (s % 3 ? 8.0 : -5.0) * wear * wear +
                                0.3 * rk_rng_normal(&r));
                fprintf(f, "\n");
            }
            if (rf)
                fprintf(rf, "%d\n", life - shown);
        }
        fclose(f);
        if (rf)
            fclose(rf);
    }
}

static void test_protocol_synthetic(void **state)
{
    (void)state;
    enum { NTRAIN = 24, NTEST = 10, T = 10 };
    write_fleet(g_dir, NTRAIN, NTEST, 5);
    rk_cmapss_opts o;
    rk_cmapss_opts_default(&o);
    o.dir = g_dir;
    o.window = T;
    o.first_end = 6; /* windows ending at cycles 6..9 are padded */
    o.val_engines = 6;
    o.ensemble = 2;
    o.rul_cap = 60;
    o.model.hidden = 8;
    o.model.attn = 4;
    o.model.dense = 4;
    o.train.max_epochs = 30;
    o.train.batch = 32;
    o.train.lr = 5e-3f;
    rk_cmapss_result r;
    rk_err err = {0};
    assert_int_equal(rk_cmapss_run(&o, &r, &err), RK_OK);
    assert_int_equal(r.train_engines, NTRAIN - 6);
    assert_int_equal(r.val_engines, 6);
    assert_int_equal(r.test_engines, NTEST);
    assert_int_equal(r.members, 2);
    assert_int_equal(r.missing_train, 0);
    /* Windows: one per cycle from the 6th on, for each engine on its side of the split. */
    rk_cmapss_table t;
    char path[700];
    snprintf(path, sizeof path, "%s/train_FD001.txt", g_dir);
    assert_int_equal(rk_cmapss_read(path, &t, &err), RK_OK);
    size_t all = 0;
    for (int e = 0; e < t.engines; e++)
        all += t.first[e + 1] - t.first[e] - 5;
    assert_int_equal(r.train_windows + r.val_windows, all);
    rk_cmapss_free(&t);
    /* Learned: the RULs (capped at 60) spread over 0..60, so predicting any constant gives an
     * RMSE near 20 or more; the bounds need the windows, targets and scoring to be right. */
    print_message("synthetic fleet: validation RMSE %.2f, test RMSE %.2f (capped %.2f)\n",
                  r.val_rmse, r.test_rmse, r.test_rmse_capped);
    assert_true(isfinite(r.test_rmse) && isfinite(r.test_score));
    assert_true(r.val_rmse < 12.0);
    assert_true(r.test_rmse_capped < 15.0);

    /* Tuning mode: the test files are never read (removed here). */
    snprintf(path, sizeof path, "%s/test_FD001.txt", g_dir);
    unlink(path);
    o.validate_only = 1;
    o.ensemble = 1;
    o.train.max_epochs = 2;
    assert_int_equal(rk_cmapss_run(&o, &r, &err), RK_OK);
    assert_true(isnan(r.test_rmse));
    assert_true(isfinite(r.val_rmse));
    /* Scoring needs them, and says which is missing. */
    o.validate_only = 0;
    assert_int_equal(rk_cmapss_run(&o, &r, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "test_FD001.txt"));
    /* Bad options. */
    o.val_engines = NTRAIN;
    write_fleet(g_dir, NTRAIN, NTEST, 5);
    assert_int_equal(rk_cmapss_run(&o, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "validation engines"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_good),
        cmocka_unit_test(test_missing_values_imputed),
        cmocka_unit_test(test_parse_broken),
        cmocka_unit_test(test_rul),
        cmocka_unit_test_setup_teardown(test_protocol_synthetic, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
