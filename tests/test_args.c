/*
 * Tests for cli/args.h, the one parser of rk's option values: every kind of value takes what
 * its rule says and refuses the rest (fractions, exponents and hex in whole numbers, octal-
 * looking leading zeros, signs, surrounding spaces, empty strings, non-finite numbers, values
 * out of the kind's range); a refusal names the flag, the value and the range and is exit 2;
 * a path of the wrong kind is refused from its stat alone, nothing created.
 */
#define _POSIX_C_SOURCE 200809L

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

#include "args.h"
#include "rekindle/heartbeat.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_args")

static rk_args g_a = {.cmd = "test", .usage = "usage: test\n", .quiet = 1};

/* Strings no whole number accepts, whatever its range. */
static const char *const not_whole[] = {
    "",    " ",     "10 ",   " 10",  "\t10", "10\n", "+10",  "1.5", "1.0",
    "1e3", "1E3",   "0x10",  "0X10", "010",  "00",   "-010", "-0",  "10abc",
    "abc", "1,000", "1_000", "--1",  "-",    "inf",  "nan",  "0b1", "１０", /* fullwidth digits */
};

static void test_int_accepts_decimal_digits(void **state)
{
    (void)state;
    int64_t v = -1;
    assert_true(rk_args_int("0", 0, 10, &v));
    assert_int_equal(v, 0);
    assert_true(rk_args_int("10", 0, 10, &v));
    assert_int_equal(v, 10);
    assert_true(rk_args_int("-5", -10, 10, &v));
    assert_int_equal(v, -5);
    assert_true(rk_args_int("9223372036854775807", 0, INT64_MAX, &v));
    assert_int_equal(v, INT64_MAX);
    assert_true(rk_args_int("-9223372036854775808", INT64_MIN, 0, &v));
    assert_true(v == INT64_MIN);
}

static void test_int_refuses_the_rest(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof not_whole / sizeof not_whole[0]; i++) {
        int64_t v = 42;
        uint64_t u = 42;
        if (rk_args_int(not_whole[i], INT64_MIN, INT64_MAX, &v) || rk_args_u64(not_whole[i], &u))
            fail_msg("'%s' accepted as a whole number", not_whole[i]);
        assert_int_equal(v, 42); /* untouched on refusal */
        assert_true(u == 42);
    }
    int64_t v;
    assert_false(rk_args_int("11", 0, 10, &v));
    assert_false(rk_args_int("-1", 0, 10, &v));
    assert_false(rk_args_int("9223372036854775808", 0, INT64_MAX, &v)); /* overflow */
    assert_false(rk_args_int("99999999999999999999999", INT64_MIN, INT64_MAX, &v));
}

/* 0..2^63-1: a seed goes into JSON (a checkpoint's config), which is read back as int64; a
 * larger one once trained a whole run and then failed to save its checkpoint */
/* --gpu(s) lists: indices and ranges, in the order given, duplicates kept out. */
static void test_gpu_list(void **state)
{
    (void)state;
    int idx[8], n = -1;
    assert_true(rk_args_gpu_list("0,2,5-7", 8, idx, &n));
    assert_int_equal(n, 5);
    assert_int_equal(idx[0], 0);
    assert_int_equal(idx[1], 2);
    assert_int_equal(idx[4], 7);
    assert_true(rk_args_gpu_list("3,1-3,3", 8, idx, &n));
    assert_int_equal(n, 3);
    assert_int_equal(idx[0], 3);
    assert_int_equal(idx[1], 1);
    assert_int_equal(idx[2], 2);
    static const char *const bad[] = {"",   ",", "1,", ",1", "1,,2", "3-1", "8",    "0-8",
                                      "-1", "a", "1-", "-",  "1 ",   "01x", "1-2-3"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        if (rk_args_gpu_list(bad[k], 8, idx, &n))
            print_error("accepted '%s'\n", bad[k]);
        assert_false(rk_args_gpu_list(bad[k], 8, idx, &n));
    }
}

static void test_seed_is_0_to_int64_max(void **state)
{
    (void)state;
    uint64_t s = 0;
    assert_int_equal(rk_arg_seed(&g_a, "--seed", "9223372036854775807", &s), 0);
    assert_true(s == (uint64_t)INT64_MAX);
    assert_int_equal(rk_arg_seed(&g_a, "--seed", "9007199254740993", &s), 0); /* 2^53 + 1 */
    assert_true(s == 9007199254740993ull);
    assert_int_equal(rk_arg_seed(&g_a, "--seed", "0", &s), 0);
    assert_true(s == 0);
    const char *bad[] = {"9223372036854775808",
                         "18446744073709551615",
                         "18446744073709551616",
                         "-1",
                         "1.5",
                         "1e3",
                         "0x10",
                         " 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s = 7;
        assert_int_equal(rk_arg_seed(&g_a, "--seed", bad[i], &s), RK_EXIT_USAGE);
        assert_true(s == 7);
        assert_non_null(strstr(g_a.msg, "--seed"));
        assert_non_null(strstr(g_a.msg, bad[i]));
        assert_non_null(strstr(g_a.msg, "0..9223372036854775807"));
    }
}

static void test_count_and_step(void **state)
{
    (void)state;
    int n = -1;
    assert_int_equal(rk_arg_count(&g_a, "--batch", "64", 1, 60000, &n), 0);
    assert_int_equal(n, 64);
    assert_int_equal(rk_arg_count(&g_a, "--batch", "60001", 1, 60000, &n), RK_EXIT_USAGE);
    assert_string_equal(g_a.msg, "--batch '60001' is not a whole number in 1..60000");
    assert_int_equal(rk_arg_count(&g_a, "--batch", "1.5", 1, 60000, &n), RK_EXIT_USAGE);
    assert_string_equal(g_a.msg, "--batch '1.5' is not a whole number in 1..60000");
    assert_int_equal(n, 64);
    int64_t st = -1;
    assert_int_equal(rk_arg_step(&g_a, "--step", "0", 0, &st), 0);
    assert_int_equal(st, 0);
    assert_int_equal(rk_arg_step(&g_a, "--max-steps", "0", 1, &st), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "--max-steps '0'"));
    assert_non_null(strstr(g_a.msg, "1..9223372036854775807"));
    assert_int_equal(rk_arg_step(&g_a, "--step", "1e3", 0, &st), RK_EXIT_USAGE);
}

static void test_real_syntax(void **state)
{
    (void)state;
    double v = 0;
    const struct {
        const char *s;
        double v;
    } good[] = {{"0", 0},      {"0.5", 0.5},   {".5", 0.5},  {"-0.25", -0.25}, {"1e-4", 1e-4},
                {"1E+3", 1e3}, {"2.5e2", 250}, {"100", 100}, {"1e-400", 0}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        if (!rk_args_real(good[i].s, -1e9, 1e9, &v))
            fail_msg("'%s' refused as a number", good[i].s);
        assert_true(v == good[i].v);
    }
    const char *bad[] = {"",     " 1",    "1 ",  "+1",   "1.",  "0x10", "0x1p3", "inf",
                         "-inf", "nan",   "NAN", "1e",   "1e+", "e3",   "1.5x",  "010",
                         "00.5", "1e999", "--1", "1..2", "1,5", "."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = 42;
        if (rk_args_real(bad[i], -HUGE_VAL, HUGE_VAL, &v))
            fail_msg("'%s' accepted as a number", bad[i]);
        assert_true(v == 42);
    }
    assert_false(rk_args_real("100.5", 0, 100, &v));
    assert_int_equal(rk_arg_real(&g_a, "--lr", "200", 1e-12, 100, &v), RK_EXIT_USAGE);
    assert_string_equal(g_a.msg, "--lr '200' is not a number in [1e-12, 100]");
}

static void test_fixed_ranges(void **state)
{
    (void)state;
    double v;
    unsigned mhz = 0;
    assert_int_equal(rk_arg_probability(&g_a, "--drain-probability", "1", &v), 0);
    assert_int_equal(rk_arg_probability(&g_a, "--drain-probability", "1.01", &v), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "[0, 1]"));
    assert_int_equal(rk_arg_probability(&g_a, "--threshold", "-0.1", &v), RK_EXIT_USAGE);
    assert_int_equal(rk_arg_score(&g_a, "--threshold", "100", &v), 0);
    assert_int_equal(rk_arg_score(&g_a, "--threshold", "100.5", &v), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "[0, 100]"));
    assert_int_equal(rk_arg_hours(&g_a, "--age", "1000000", &v), 0);
    assert_int_equal(rk_arg_hours(&g_a, "--age", "1e7", &v), RK_EXIT_USAGE);
    assert_int_equal(rk_arg_hours(&g_a, "--age", "-1", &v), RK_EXIT_USAGE);
    assert_int_equal(rk_arg_mhz(&g_a, "--lock-clocks", "1506", &mhz), 0);
    assert_int_equal(mhz, 1506);
    assert_int_equal(rk_arg_mhz(&g_a, "--lock-clocks", "1506.5", &mhz), RK_EXIT_USAGE);
    assert_int_equal(rk_arg_mhz(&g_a, "--lock-clocks", "0", &mhz), RK_EXIT_USAGE);
    assert_int_equal(rk_arg_mhz(&g_a, "--lock-clocks", "100001", &mhz), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "1..100000"));
    assert_int_equal(mhz, 1506);
    assert_int_equal(rk_arg_watts(&g_a, "--power-limit", "150.5", &v), 0);
    assert_true(v == 150.5);
    assert_int_equal(rk_arg_watts(&g_a, "--power-limit", "0.5", &v), RK_EXIT_USAGE);
    assert_int_equal(rk_arg_watts(&g_a, "--power-limit", "inf", &v), RK_EXIT_USAGE);
    assert_int_equal(rk_arg_watts(&g_a, "--power-limit", "0x64", &v), RK_EXIT_USAGE);
    rk_sim_load load = RK_SIM_LOAD_IDLE;
    assert_int_equal(rk_arg_sim_load(&g_a, "--sim-load", "busy", &load), 0);
    assert_int_equal(load, RK_SIM_LOAD_BUSY);
    assert_int_equal(rk_arg_sim_load(&g_a, "--sim-load", "idle", &load), 0);
    assert_int_equal(load, RK_SIM_LOAD_IDLE);
    assert_int_equal(rk_arg_sim_load(&g_a, "--sim-load", "Busy", &load), RK_EXIT_USAGE);
    assert_int_equal(rk_arg_sim_load(&g_a, "--sim-load", "", &load), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "is not idle or busy"));
    assert_int_equal(load, RK_SIM_LOAD_IDLE);
}

static void test_seconds(void **state)
{
    (void)state;
    const struct {
        const char *s;
        double v;
    } good[] = {{"5", 5},     {"5s", 5},    {"500ms", 0.5}, {"1m", 60},
                {"2h", 7200}, {"0.5", 0.5}, {"1.5m", 90}};
    double v;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        if (!rk_args_seconds(good[i].s, 0, 86400, &v))
            fail_msg("'%s' refused as a duration", good[i].s);
        assert_true(fabs(v - good[i].v) < 1e-12);
    }
    const char *bad[] = {"",    "s",    "5 s", " 5s", "5x", "5sec", "0x10",   "0x10s",
                         "inf", "nans", "-1s", "25h", "5S", "5ms ", "1e999ms"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (rk_args_seconds(bad[i], 0, 86400, &v))
            fail_msg("'%s' accepted as a duration", bad[i]);
    assert_int_equal(rk_arg_seconds(&g_a, "--interval", "50ms", 0.1, 86400, &v), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "--interval '50ms'"));
    assert_non_null(strstr(g_a.msg, "[0.1, 86400] seconds"));
}

static void test_message_shows_control_bytes_safely(void **state)
{
    (void)state;
    int n;
    assert_int_equal(rk_arg_count(&g_a, "--batch", "1\n2", 1, 10, &n), RK_EXIT_USAGE);
    assert_null(strchr(g_a.msg, '\n'));
    assert_non_null(strstr(g_a.msg, "--batch '1?2'"));
}

static void test_cli_number_is_the_same_parser(void **state)
{
    (void)state;
    double v = 3;
    /* stderr gets the usage error; only the status and the value matter here */
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    assert_non_null(stderr);
    int hex = rk_cli_number("test", "usage\n", "--x", "0x10", 0, 100, &v);
    int spaced = rk_cli_number("test", "usage\n", "--x", " 5", 0, 100, &v);
    int good = rk_cli_number("test", "usage\n", "--x", "5", 0, 100, &v);
    fclose(stderr);
    stderr = saved;
    assert_int_equal(hex, RK_EXIT_USAGE);
    assert_int_equal(spaced, RK_EXIT_USAGE);
    assert_int_equal(good, 0);
    assert_true(v == 5);
}

/* Entries of g_dir: the path checks must create nothing. */
static int entries(void)
{
    int n = 0;
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void test_paths(void **state)
{
    (void)state;
    char file[600], sub[600], missing[600], under_file[600], deep[600];
    snprintf(file, sizeof file, "%s/file", g_dir);
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    snprintf(missing, sizeof missing, "%s/missing", g_dir);
    snprintf(under_file, sizeof under_file, "%s/file/x", g_dir);
    snprintf(deep, sizeof deep, "%s/missing/a/b", g_dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(mkdir(sub, 0755), 0);
    int before = entries();

    /* an existing directory */
    assert_int_equal(rk_arg_path(&g_a, "--data", sub, RK_PATH_DIR), 0);
    assert_int_equal(rk_arg_path(&g_a, "--textfile-dir", missing, RK_PATH_DIR), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "--textfile-dir"));
    assert_non_null(strstr(g_a.msg, "no such directory"));
    assert_int_equal(rk_arg_path(&g_a, "--data", file, RK_PATH_DIR), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "not a directory"));
    assert_int_equal(rk_arg_path(&g_a, "--data", "", RK_PATH_DIR), RK_EXIT_USAGE);

    /* a directory or one to create */
    assert_int_equal(rk_arg_path(&g_a, "--ckpt-dir", sub, RK_PATH_DIR_OR_NEW), 0);
    assert_int_equal(rk_arg_path(&g_a, "--ckpt-dir", deep, RK_PATH_DIR_OR_NEW), 0);
    assert_int_equal(rk_arg_path(&g_a, "--ckpt-dir", file, RK_PATH_DIR_OR_NEW), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "--ckpt-dir"));
    assert_non_null(strstr(g_a.msg, "not a directory"));
    assert_int_equal(rk_arg_path(&g_a, "--ckpt-dir", under_file, RK_PATH_DIR_OR_NEW),
                     RK_EXIT_USAGE);
    assert_int_equal(rk_arg_path(&g_a, "--ckpt-dir", "/proc/version", RK_PATH_DIR_OR_NEW),
                     RK_EXIT_USAGE);

    /* a file to read */
    assert_int_equal(rk_arg_path(&g_a, "--init", file, RK_PATH_FILE), 0);
    assert_int_equal(rk_arg_path(&g_a, "--init", sub, RK_PATH_FILE), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "--init"));
    assert_non_null(strstr(g_a.msg, "is a directory, not a regular file"));
    assert_int_equal(rk_arg_path(&g_a, "--predictor", missing, RK_PATH_FILE), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "no such file"));
    assert_int_equal(rk_arg_path(&g_a, "--init", "/dev/null", RK_PATH_FILE), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "not a regular file"));

    /* a file to write */
    assert_int_equal(rk_arg_path(&g_a, "--save", file, RK_PATH_OUTPUT), 0);
    assert_int_equal(rk_arg_path(&g_a, "--save", missing, RK_PATH_OUTPUT), 0);
    assert_int_equal(rk_arg_path(&g_a, "--save", "relative-name", RK_PATH_OUTPUT), 0);
    assert_int_equal(rk_arg_path(&g_a, "--save", sub, RK_PATH_OUTPUT), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "is a directory, not a regular file"));
    assert_int_equal(rk_arg_path(&g_a, "--events", deep, RK_PATH_OUTPUT), RK_EXIT_USAGE);
    assert_non_null(strstr(g_a.msg, "--events"));
    assert_non_null(strstr(g_a.msg, "does not exist: create it first (mkdir -p "));
    assert_int_equal(rk_arg_path(&g_a, "--summary-json", under_file, RK_PATH_OUTPUT),
                     RK_EXIT_USAGE);
    assert_int_equal(rk_arg_path(&g_a, "--loss-log", "/dev/null", RK_PATH_OUTPUT), RK_EXIT_USAGE);
    char slash[620];
    snprintf(slash, sizeof slash, "%s/", missing);
    assert_int_equal(rk_arg_path(&g_a, "--save", slash, RK_PATH_OUTPUT), RK_EXIT_USAGE);

    assert_int_equal(entries(), before); /* nothing created */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int_accepts_decimal_digits),
        cmocka_unit_test(test_int_refuses_the_rest),
        cmocka_unit_test(test_seed_is_0_to_int64_max),
        cmocka_unit_test(test_gpu_list),
        cmocka_unit_test(test_count_and_step),
        cmocka_unit_test(test_real_syntax),
        cmocka_unit_test(test_fixed_ranges),
        cmocka_unit_test(test_seconds),
        cmocka_unit_test(test_message_shows_control_bytes_safely),
        cmocka_unit_test(test_cli_number_is_the_same_parser),
        cmocka_unit_test_setup_teardown(test_paths, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
