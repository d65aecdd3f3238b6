/*
 * Tests for the textfile sensors (rk_textfile_merge, rk_textfile_merge_dir in
 * rekindle/health.h; docs/textfile.md): valid files with every construct of the format merge
 * both sensors by GPU index and by UUID and ignore everything else; the example in the docs
 * merges as they say; each kind of malformed line is RK_EFORMAT with the file, the line and
 * the exact problem, and changes nothing; a file merges all or nothing (every cut-off prefix
 * of a valid file); the limits; messages escape what they quote; a directory is read in name
 * order, skipping dot-files, other names and non-regular files, reporting a broken or
 * over-size file while merging the others.
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

#include "rekindle/health.h"
#include "testutil.h"

#define NGPU 3
/* The inputs; VRM is in volts, the sample's vrm_ripple_mv in millivolts */
#define VRM "rk_sensor_vrm_ripple_volts"
#define FAN "rk_sensor_fan_vibration_hertz"

static char g_dir[512];
static rk_gpu_info g_info[NGPU];

static int setup(void **state)
{
    (void)state;
    umask(022);
    /* GPU index 5 sits at position 2: selection goes by infos[i].index, not by position */
    static const int idx[NGPU] = {0, 1, 5};
    static const char *const uuid[NGPU] = {"GPU-aaaa", "GPU-bbbb", "GPU-cccc"};
    for (int i = 0; i < NGPU; i++) {
        memset(&g_info[i], 0, sizeof g_info[i]);
        g_info[i].index = idx[i];
        snprintf(g_info[i].uuid, sizeof g_info[i].uuid, "%s", uuid[i]);
        snprintf(g_info[i].name, sizeof g_info[i].name, "test GPU %d", idx[i]);
    }
    return test_dir_make(g_dir, sizeof g_dir, "test_textfile");
}

static int teardown(void **state)
{
    (void)state;
    rm_tree(g_dir);
    return 0;
}

/* Samples as a backend leaves them: a temperature read, no textfile sensor yet. */
static void fresh(rk_gpu_sample s[NGPU])
{
    memset(s, 0, NGPU * sizeof *s);
    for (int i = 0; i < NGPU; i++) {
        s[i].temp_c = 60 + i;
        rk_field_set(&s[i], RK_F_TEMP);
    }
}

static int merge_len(const char *text, size_t len, rk_gpu_sample s[NGPU], rk_err *err)
{
    return rk_textfile_merge("t.prom", text, len, g_info, s, NGPU, err);
}

static int merge(const char *text, rk_gpu_sample s[NGPU], rk_err *err)
{
    return merge_len(text, strlen(text), s, err);
}

static int has(const rk_gpu_sample *s, rk_field f)
{
    return rk_field_valid(s, f);
}

/* ---- valid files ------------------------------------------------------------------------ */

static void test_valid_file_merges_both_sensors_by_index_and_uuid(void **state)
{
    (void)state;
    /* clang-format off */
    static const char text[] =
        "# written by the riser sensor board\n"
        "# HELP " VRM " VRM output ripple, peak to peak \\\\ in V\\n(scope)\n"
        "# TYPE " VRM " gauge\n"
        "\n"
        VRM "{gpu=\"0\"} 0.0425\n"
        VRM "{board=\"riser \\\"7\\\" \\\\ \\n\",uuid=\"GPU-cccc\"} 0.12 1700000000000\n"
        "  \t\n"
        "#TYPE " FAN " GAUGE\n"
        "\t" FAN "{uuid=\"GPU-bbbb\"} 3.1e2 -5\n"
        FAN " { gpu = \"5\" , } 0\n"
        "node_hwmon_temp_celsius{chip=\"nct6779\",sensor=\"\xc2\xb0" "C\"} NaN\n"
        "other_metric +Inf\n"
        "other_metric{} -Inf 0\n"
        "# TYPE h histogram\n"
        "h_bucket{le=\"0.5\"} 1\n"
        "h_bucket{le=\"+Inf\"} 3\n"
        "h_sum 2\n"
        "h_count 3\n"
        "# TYPE q summary\n"
        "q{quantile=\"0.99\"} 1\n"
        "q_sum 1\n"
        "q_count 1\n"
        "# TYPE gh gauge_histogram\n"
        "not_a_histogram{le=\"x\",quantile=\"y\"} 1\n"
        VRM "_total{gpu=\"1\"} 999\n"
        "#" VRM "{gpu=\"1\"} 999\n"
        "# " VRM "{gpu=\"1\"} 999\n";
    /* clang-format on */
    rk_gpu_sample s[NGPU];
    rk_err err = {0};
    fresh(s);
    assert_int_equal(merge(text, s, &err), RK_OK);
    assert_true(has(&s[0], RK_F_VRM_RIPPLE));
    assert_float_equal(s[0].vrm_ripple_mv, 42.5, 1e-9); /* volts in, millivolts out */
    assert_false(has(&s[0], RK_F_FAN_VIB));
    assert_false(has(&s[1], RK_F_VRM_RIPPLE)); /* only _total and comments named GPU 1 */
    assert_true(has(&s[1], RK_F_FAN_VIB));
    assert_float_equal(s[1].fan_vib_hz, 310, 0);
    assert_true(has(&s[2], RK_F_VRM_RIPPLE) && has(&s[2], RK_F_FAN_VIB));
    assert_float_equal(s[2].vrm_ripple_mv, 120, 1e-9);
    assert_float_equal(s[2].fan_vib_hz, 0, 0); /* zero is a reading, valid */
    for (int i = 0; i < NGPU; i++) {           /* the backend's fields are untouched */
        assert_true(has(&s[i], RK_F_TEMP));
        assert_float_equal(s[i].temp_c, 60 + i, 0);
    }
}

/* The example of docs/textfile.md, as printed there (the rk_sensor_ names, base units). */
static void test_the_documented_example_merges_as_documented(void **state)
{
    (void)state;
    static const char text[] =
        "# HELP rk_sensor_vrm_ripple_volts VRM output ripple, peak to peak.\n"
        "# TYPE rk_sensor_vrm_ripple_volts gauge\n"
        "rk_sensor_vrm_ripple_volts{gpu=\"0\"} 0.0385\n"
        "rk_sensor_vrm_ripple_volts{gpu=\"1\",probe=\"scope-ch2\"} 0.112\n"
        "# HELP rk_sensor_fan_vibration_hertz Dominant fan vibration frequency.\n"
        "# TYPE rk_sensor_fan_vibration_hertz gauge\n"
        "rk_sensor_fan_vibration_hertz{uuid=\"GPU-5b0c3f1e-9a0d-4c7e-8e55-2f1d6b7a9c01\"} 180\n"
        "rk_sensor_fan_vibration_hertz{gpu=\"1\"} 310 1717000000000\n";
    rk_gpu_info info[2] = {{.index = 0, .uuid = "GPU-5b0c3f1e-9a0d-4c7e-8e55-2f1d6b7a9c01"},
                           {.index = 1, .uuid = "GPU-0d1e"}};
    rk_gpu_sample s[2] = {{0}};
    for (int i = 0; i < 2; i++) /* NVML read both (a failed reading gets no textfile values) */
        rk_field_set(&s[i], RK_F_TEMP);
    rk_err err = {0};
    assert_int_equal(rk_textfile_merge("gpu-sensors.prom", text, strlen(text), info, s, 2, &err),
                     RK_OK);
    assert_float_equal(s[0].vrm_ripple_mv, 38.5, 1e-9); /* volts in, millivolts in the sample */
    assert_float_equal(s[0].fan_vib_hz, 180, 0);
    assert_float_equal(s[1].vrm_ripple_mv, 112, 1e-9);
    assert_float_equal(s[1].fan_vib_hz, 310, 0);
    for (int i = 0; i < 2; i++)
        assert_true(has(&s[i], RK_F_VRM_RIPPLE) && has(&s[i], RK_F_FAN_VIB));
}

/* No output name is an input: rk exporter's own output (here its fan line, as a scrape saved
 * into the textfile directory would hold it) is just another metric, merged nowhere and no
 * error, even next to the real input for the same GPU. The old VRM input name (millivolts) is
 * refused with RK_EFORMAT naming the new name, wherever it is and whatever its labels, and
 * nothing of that file is merged. A volts value that would overflow in millivolts is refused,
 * not stored as inf. */
static void test_output_and_old_names_are_not_inputs(void **state)
{
    (void)state;
    rk_gpu_sample s[NGPU], before[NGPU];
    rk_err err = {0};
    fresh(s);
    memcpy(before, s, sizeof s);
    /* clang-format off */
    static const char scrape[] =
        "# HELP rk_gpu_fan_vibration_hertz Dominant fan vibration frequency.\n"
        "# TYPE rk_gpu_fan_vibration_hertz gauge\n"
        "rk_gpu_fan_vibration_hertz{gpu=\"0\"} 260\n"
        "rk_gpu_vrm_ripple_volts{gpu=\"0\"} 0.055\n";
    /* clang-format on */
    assert_int_equal(merge(scrape, s, &err), RK_OK);
    assert_false(has(&s[0], RK_F_FAN_VIB));
    assert_false(has(&s[0], RK_F_VRM_RIPPLE));
    assert_memory_equal(s, before, sizeof s);
    /* beside the input for the same GPU: not "already given", and the input's value counts */
    const char *both = FAN "{gpu=\"0\"} 180\n"
                           "rk_gpu_fan_vibration_hertz{gpu=\"0\"} 260\n";
    assert_int_equal(merge(both, s, &err), RK_OK);
    assert_true(has(&s[0], RK_F_FAN_VIB));
    assert_float_equal(s[0].fan_vib_hz, 180, 0);

    static const char *const old[] = {
        FAN "{gpu=\"1\"} 200\nrk_gpu_vrm_ripple_millivolts{gpu=\"0\"} 55\n",
        FAN "{gpu=\"1\"} 200\nrk_gpu_vrm_ripple_millivolts 55\n",            /* no label */
        FAN "{gpu=\"1\"} 200\nrk_gpu_vrm_ripple_millivolts{gpu=\"7\"} 55\n", /* not here */
        FAN "{gpu=\"1\"} 200\nrk_gpu_vrm_ripple_millivolts{gpu=\"0\"} -1\n", /* bad value */
    };
    for (size_t k = 0; k < sizeof old / sizeof old[0]; k++) {
        fresh(s);
        memcpy(before, s, sizeof s);
        int rc = merge(old[k], s, &err);
        if (rc != RK_EFORMAT)
            print_error("case %zu: %d %s\n", k, rc, err.msg);
        assert_int_equal(rc, RK_EFORMAT);
        assert_string_equal(err.msg, "t.prom:2: rk_gpu_vrm_ripple_millivolts is no longer read: "
                                     "give rk_sensor_vrm_ripple_volts, in volts "
                                     "(docs/textfile.md)");
        assert_memory_equal(s, before, sizeof s); /* line 1's fan value was not merged */
    }
    /* only that name: another metric that starts with it is just another metric */
    fresh(s);
    assert_int_equal(merge("rk_gpu_vrm_ripple_millivolts_total{gpu=\"0\"} 55\n", s, &err), RK_OK);
    assert_false(has(&s[0], RK_F_VRM_RIPPLE));

    fresh(s);
    const char *huge = VRM "{gpu=\"0\"} 1e308\n";
    assert_int_equal(merge(huge, s, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, VRM " must be a finite number"));
    assert_false(has(&s[0], RK_F_VRM_RIPPLE));
}

static void test_empty_and_comment_only_files_change_nothing(void **state)
{
    (void)state;
    rk_gpu_sample s[NGPU], before[NGPU];
    rk_err err = {0};
    fresh(s);
    memcpy(before, s, sizeof s);
    assert_int_equal(merge("", s, &err), RK_OK);
    assert_int_equal(merge_len(NULL, 0, s, &err), RK_OK);
    assert_int_equal(merge("\n\n# nothing yet\n# HELP\n# TYPE " VRM "\n", s, &err), RK_OK);
    assert_int_equal(merge("# blanks may end a file without a newline\n \t", s, &err), RK_OK);
    assert_memory_equal(s, before, sizeof s);
    assert_int_equal(rk_textfile_merge("t.prom", "x 1\n", 4, NULL, NULL, 0, &err), RK_OK);
}

/* Values are read as Go's strconv.ParseFloat reads them (less hex and '_'), here as volts of
 * VRM ripple (stored in millivolts). */
static void test_values_are_read_as_go_floats(void **state)
{
    (void)state;
    static const struct {
        const char *tok;
        double v;
    } good[] = {{"0", 0},
                {"1.", 1},
                {".5", 0.5},
                {"+2", 2},
                {"1e3", 1000},
                {"1E+3", 1000},
                {"2.5e-1", 0.25},
                {"007", 7},
                {"-0", 0},
                {"1e-400", 0},
                {"123456789012345678901234567890", 1.2345678901234568e29}};
    static const char *const bad_tok[] = {"1e",  ".",   "e3",    "0x10", "1_000", "1p3",  "1,5",
                                          "++1", "- 1", "infin", "+nan", "nan1",  "Inf1", "1e+"};
    char text[256], want[256];
    rk_gpu_sample s[NGPU];
    rk_err err = {0};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fresh(s);
        snprintf(text, sizeof text, VRM "{gpu=\"1\"} %s\n", good[i].tok);
        int rc = merge(text, s, &err);
        if (rc)
            print_error("%s: %s\n", good[i].tok, err.msg);
        assert_int_equal(rc, RK_OK);
        assert_true(has(&s[1], RK_F_VRM_RIPPLE));
        /* volts in, millivolts in the sample */
        assert_float_equal(s[1].vrm_ripple_mv, good[i].v * 1e3, fabs(good[i].v) * 1e3 * 1e-15);
        assert_false(signbit(s[1].vrm_ripple_mv)); /* -0 is stored as 0 */
    }
    for (size_t i = 0; i < sizeof bad_tok / sizeof bad_tok[0]; i++) {
        fresh(s);
        snprintf(text, sizeof text, "x 1\n" VRM "{gpu=\"1\"} %s\n", bad_tok[i]);
        const char *tok = bad_tok[i];
        if (strcmp(tok, "- 1") == 0) /* the value is "-", then "1" reads as a timestamp */
            tok = "-";
        (void)tok; /* the message gives the column, never the token */
        snprintf(want, sizeof want, "t.prom:2: invalid value (column %zu)",
                 strlen(VRM "{gpu=\"1\"} ") + 1);
        assert_int_equal(merge(text, s, &err), RK_EFORMAT);
        assert_string_equal(err.msg, want);
        assert_false(has(&s[1], RK_F_VRM_RIPPLE));
    }
    /* overflow is out of range, as in Go; underflow (above) is 0 */
    assert_int_equal(merge("x 1e999\n", s, &err), RK_EFORMAT);
    assert_string_equal(err.msg, "t.prom:1: invalid value (column 3, out of range)");
    assert_int_equal(merge("x -1.8e308\n", s, &err), RK_EFORMAT);
    assert_string_equal(err.msg, "t.prom:1: invalid value (column 3, out of range)");
    /* special values: fine for other metrics, in any case Go accepts */
    assert_int_equal(
        merge("a NaN\na nan\nb +Inf\nb -inf\nc Infinity\nc -INFINITY\nd 1.7976931348623157e308\n",
              s, &err),
        RK_OK);
}

/* ---- malformed input ---------------------------------------------------------------------- */

/* Each line after a valid prefix: RK_EFORMAT with this exact message, nothing merged. */
static void test_malformed_lines_are_named_with_line_and_problem(void **state)
{
    (void)state;
    static const char prefix[] = "# fine\n" VRM "{gpu=\"0\"} 1\n";
    static const struct {
        const char *line, *msg;
    } cases[] = {
        /* metric names */
        {"9lives 1\n", "t.prom:3: invalid metric name (column 1)"},
        {"foo-bar 1\n", "t.prom:3: invalid metric name (column 1)"},
        {"foo\"x\" 1\n", "t.prom:3: invalid metric name (column 1)"},
        {"{a=\"b\"} 1\n", "t.prom:3: missing metric name before '{'"},
        /* label names */
        {"foo{9a=\"b\"} 1\n", "t.prom:3: invalid label name (column 5)"},
        {"foo{a:b=\"c\"} 1\n", "t.prom:3: invalid label name (column 5)"},
        {"foo{,} 1\n", "t.prom:3: missing label name"},
        {"foo{a=\"1\",,} 1\n", "t.prom:3: missing label name"},
        {"foo{__name__=\"x\"} 1\n", "t.prom:3: label name \"__name__\" is reserved"},
        {"foo{a=\"1\",b=\"2\",a=\"3\"} 1\n", "t.prom:3: the label at column 17 is given twice"},
        /* quoting and escapes */
        {"foo{a \"1\"} 1\n", "t.prom:3: expected '=' after the label at column 5"},
        {"foo{a=1} 1\n", "t.prom:3: the value of the label at column 5 is not in double quotes"},
        {"foo{a='1'} 1\n", "t.prom:3: the value of the label at column 5 is not in double quotes"},
        {"foo{a=\"1} 1\n",
         "t.prom:3: unterminated value of the label at column 5 (no closing '\"')"},
        {"foo{a=\"1\\\"} 1\n",
         "t.prom:3: unterminated value of the label at column 5 (no closing '\"')"},
        {"foo{a=\"x\\ty\"} 1\n", "t.prom:3: invalid escape in the value of the label at column 5 "
                                 "(column 9; only \\\\, \\\" and \\n)"},
        {"foo{a=\"\xff\"} 1\n", "t.prom:3: the value of the label at column 5 is not valid UTF-8"},
        {"foo{a=\"\xc0\xaf\"} 1\n",
         "t.prom:3: the value of the label at column 5 is not valid UTF-8"},
        {"foo{a=\"\xed\xa0\x80\"} 1\n",
         "t.prom:3: the value of the label at column 5 is not valid UTF-8"},
        {"foo{a=\"1\" b=\"2\"} 1\n",
         "t.prom:3: expected ',' or '}' after the value of the label at column 5"},
        {"foo{a=\"1\"\n", "t.prom:3: missing '}' at the end of the labels"},
        {"foo{\n", "t.prom:3: missing '}' at the end of the labels"},
        /* values and timestamps */
        {"foo\n", "t.prom:3: missing value"},
        {"foo{a=\"1\"}   \n", "t.prom:3: missing value"},
        {"foo abc\n", "t.prom:3: invalid value (column 5)"},
        {"foo 1\r\n", "t.prom:3: invalid value (column 5)"},
        {"foo 1 1.5\n",
         "t.prom:3: invalid timestamp (column 7; an integer, milliseconds since the epoch)"},
        {"foo 1 9223372036854775808\n",
         "t.prom:3: invalid timestamp (column 7; an integer, milliseconds since the epoch)"},
        {"foo 1 2 3\n", "t.prom:3: unexpected text after the timestamp (column 9)"},
        {"foo 1 \n", "t.prom:3: space or tab at the end of the line"},
        {"foo 1 2\t\n", "t.prom:3: space or tab at the end of the line"},
        /* HELP and TYPE */
        {"# HELP foo a\\tb\n",
         "t.prom:3: invalid escape in the HELP text of this metric (column 13; only \\\\ and \\n)"},
        {"# HELP foo ends in \\\n",
         "t.prom:3: invalid escape in the HELP text of this metric (column 20; only \\\\ and \\n)"},
        {"# HELP foo$ x\n", "t.prom:3: invalid metric name in a HELP line (column 8)"},
        {"# TYPE 1foo gauge\n", "t.prom:3: invalid metric name in a TYPE line (column 8)"},
        {"# TYPE foo gauges\n", "t.prom:3: unknown metric type for this metric (column 12; "
                                "counter, gauge, histogram, summary or untyped)"},
        {"# TYPE foo gauge \n", "t.prom:3: unknown metric type for this metric (column 12; "
                                "counter, gauge, histogram, summary or untyped)"},
        {"# HELP foo a\n# HELP foo b\n", "t.prom:4: second HELP line for this metric"},
        {"# TYPE foo gauge\n# TYPE foo counter\n", "t.prom:4: second TYPE line for this metric"},
        {"# TYPE " VRM " gauge\n", "t.prom:3: TYPE line for \"" VRM "\" after its samples"},
        /* histograms and summaries: bounds are numbers; foo_sum, foo_count, foo_bucket are foo */
        {"# TYPE foo histogram\nfoo_bucket{le=\"x\"} 1\n",
         "t.prom:4: the value of label le is not a number"},
        {"# TYPE foo summary\nfoo{quantile=\"0.5\\n\"} 1\n",
         "t.prom:4: the value of label quantile is not a number"},
        {"# TYPE foo summary\n# HELP foo a\n# HELP foo_count b\n",
         "t.prom:5: second HELP line for this metric"},
        {"# TYPE foo histogram\n# TYPE foo_bucket gauge\n",
         "t.prom:4: second TYPE line for this metric"},
        /* the two sensors */
        {VRM "{gpu=\"1\"} -1\n", "t.prom:3: " VRM " must be a finite number >= 0 (column 37)"},
        {FAN "{gpu=\"1\"} NaN\n", "t.prom:3: " FAN " must be a finite number >= 0 (column 40)"},
        {FAN "{gpu=\"1\"} +Inf\n", "t.prom:3: " FAN " must be a finite number >= 0 (column 40)"},
        {FAN "{gpu=\"7\"} -2e-3\n", "t.prom:3: " FAN " must be a finite number >= 0 (column 40)"},
        {FAN " 3\n", "t.prom:3: " FAN " needs a label gpu=\"<index>\" or uuid=\"<uuid>\""},
        {FAN "{slot=\"1\"} 3\n",
         "t.prom:3: " FAN " needs a label gpu=\"<index>\" or uuid=\"<uuid>\""},
        {FAN "{gpu=\"x\"} 3\n", "t.prom:3: label gpu is not a GPU index (0, 1, ...)"},
        {FAN "{gpu=\"01\"} 3\n", "t.prom:3: label gpu is not a GPU index (0, 1, ...)"},
        {FAN "{gpu=\"-1\"} 3\n", "t.prom:3: label gpu is not a GPU index (0, 1, ...)"},
        {FAN "{gpu=\"\"} 3\n", "t.prom:3: label gpu is not a GPU index (0, 1, ...)"},
        {FAN "{gpu=\"0\",uuid=\"GPU-bbbb\"} 3\n",
         "t.prom:3: labels gpu and uuid name different GPUs"},
        {FAN "{gpu=\"5\"} 3\n" FAN "{uuid=\"GPU-cccc\"} 4\n",
         "t.prom:4: " FAN " for GPU 5 already given on line 3"},
        {VRM "{gpu=\"0\"} 2\n", "t.prom:3: " VRM " for GPU 0 already given on line 2"},
        /* the end of the file */
        {"foo 1", "t.prom:3: no newline at the end of the file (cut off while being written?)"},
        {"# a comment",
         "t.prom:3: no newline at the end of the file (cut off while being written?)"},
    };
    char text[512];
    rk_gpu_sample s[NGPU], before[NGPU];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rk_err err = {0};
        snprintf(text, sizeof text, "%s%s", prefix, cases[i].line);
        fresh(s);
        memcpy(before, s, sizeof s);
        int rc = merge(text, s, &err);
        if (rc != RK_EFORMAT || strcmp(err.msg, cases[i].msg) != 0)
            print_error("case %zu: %s\n got: %d %s\nwant: %s\n", i, cases[i].line, rc, err.msg,
                        cases[i].msg);
        assert_int_equal(rc, RK_EFORMAT);
        assert_int_equal(err.code, RK_EFORMAT);
        assert_string_equal(err.msg, cases[i].msg);
        assert_memory_equal(s, before, sizeof s); /* GPU 0's valid line 2 was not merged */
    }
}

/* Every prefix of a valid file that ends inside a line (a writer cut off) is refused and
 * merges nothing; a prefix ending at a line's end merges exactly the lines it holds. */
static void test_a_file_merges_all_or_nothing(void **state)
{
    (void)state;
    /* clang-format off */
    static const char text[] =
        "# TYPE " VRM " gauge\n"
        VRM "{gpu=\"0\"} 11\n"
        FAN "{uuid=\"GPU-bbbb\"} 222\n"
        "other{a=\"b\"} 3 17\n"
        VRM "{gpu=\"5\"} 33\n";
    /* clang-format on */
    size_t len = strlen(text), full = 0;
    rk_gpu_sample s[NGPU], before[NGPU];
    rk_err err = {0};
    for (size_t cut = 0; cut <= len; cut++) {
        fresh(s);
        memcpy(before, s, sizeof s);
        int rc = merge_len(text, cut, s, &err);
        int lines = 0; /* whole lines in the prefix */
        for (size_t k = 0; k < cut; k++)
            lines += text[k] == '\n';
        if (cut == 0 || text[cut - 1] == '\n') {
            assert_int_equal(rc, RK_OK);
            assert_int_equal(has(&s[0], RK_F_VRM_RIPPLE), lines >= 2);
            assert_int_equal(has(&s[1], RK_F_FAN_VIB), lines >= 3);
            assert_int_equal(has(&s[2], RK_F_VRM_RIPPLE), lines == 5);
            full += cut == len;
        } else {
            assert_int_equal(rc, RK_EFORMAT);
            assert_memory_equal(s, before, sizeof s);
        }
    }
    assert_int_equal(full, 1);
    /* a bad last line undoes the good lines before it */
    fresh(s);
    memcpy(before, s, sizeof s);
    char bad[512];
    snprintf(bad, sizeof bad, "%s" FAN "{gpu=\"0\"} -1\n", text);
    assert_int_equal(merge(bad, s, &err), RK_EFORMAT);
    assert_string_equal(err.msg, "t.prom:6: " FAN " must be a finite number >= 0 (column 40)");
    assert_memory_equal(s, before, sizeof s);
}

static void test_unknown_and_lost_gpus_are_left_alone(void **state)
{
    (void)state;
    rk_gpu_sample s[NGPU], before[NGPU];
    rk_err err = {0};
    fresh(s);
    memcpy(before, s, sizeof s);
    /* GPU 2 is not here (position 2 holds index 5); neither is GPU-zzzz; a uuid of another
     * node next to a local index is not this GPU; a uuid longer than any is none */
    char text[1024];
    char long_uuid[300];
    memset(long_uuid, 'u', sizeof long_uuid - 1);
    long_uuid[sizeof long_uuid - 1] = '\0';
    /* clang-format off */
    snprintf(text, sizeof text,
             VRM "{gpu=\"2\"} 1\n"
             VRM "{uuid=\"GPU-zzzz\"} 1\n"
             FAN "{gpu=\"0\",uuid=\"GPU-zzzz\"} 1\n"
             FAN "{uuid=\"%s\"} 1\n"
             FAN "{uuid=\"GPU-aaaa\\n\"} 1\n"
             FAN "{gpu=\"999999999\"} 1\n",
             long_uuid);
    /* clang-format on */
    assert_int_equal(merge(text, s, &err), RK_OK);
    assert_memory_equal(s, before, sizeof s);
    /* agreeing labels select the GPU */
    assert_int_equal(merge(FAN "{uuid=\"GPU-cccc\",gpu=\"5\"} 7\n", s, &err), RK_OK);
    assert_true(has(&s[2], RK_F_FAN_VIB));
    assert_float_equal(s[2].fan_vib_hz, 7, 0);
    /* a lost GPU reports nothing else, textfile sensors included */
    fresh(s);
    s[1].lost = true;
    s[1].valid = 0;
    assert_int_equal(merge(VRM "{gpu=\"1\"} 9\n" VRM "{gpu=\"0\"} 8\n", s, &err), RK_OK);
    assert_int_equal(s[1].valid, 0);
    assert_true(has(&s[0], RK_F_VRM_RIPPLE));
    /* a failed reading (not lost, nothing valid) stays failed: a textfile value would make it
     * look like a good, nearly empty reading, which scores about 100 (rk_monitor_read_failed) */
    fresh(s);
    s[1].valid = 0;
    assert_int_equal(merge(VRM "{gpu=\"1\"} 9\n" FAN "{gpu=\"1\"} 9\n", s, &err), RK_OK);
    assert_int_equal(s[1].valid, 0);
    /* no GPUs at all: still checked */
    static const char ok[] = VRM "{gpu=\"0\"} 8\n", neg[] = VRM "{gpu=\"0\"} -8\n";
    assert_int_equal(rk_textfile_merge("t.prom", ok, strlen(ok), NULL, NULL, 0, &err), RK_OK);
    assert_int_equal(rk_textfile_merge("t.prom", neg, strlen(neg), NULL, NULL, 0, &err),
                     RK_EFORMAT);
    assert_int_equal(rk_textfile_merge("t.prom", "x 1\n", 4, g_info, s, -1, &err), RK_EINVAL);
}

static void test_limits_on_labels_and_line_length(void **state)
{
    (void)state;
    rk_gpu_sample s[NGPU];
    rk_err err = {0};
    char *text = malloc(70000);
    assert_non_null(text);
    /* 64 labels (gpu among them) are fine; a 65th is not */
    for (int nl = 64; nl <= 65; nl++) {
        size_t j = (size_t)sprintf(text, "x 1\n" VRM "{gpu=\"1\"");
        for (int k = 1; k < nl; k++)
            j += (size_t)sprintf(text + j, ",l%d=\"v\"", k);
        sprintf(text + j, "} 4\n");
        fresh(s);
        int rc = merge(text, s, &err);
        if (nl == 64) {
            assert_int_equal(rc, RK_OK);
            assert_true(has(&s[1], RK_F_VRM_RIPPLE));
        } else {
            assert_int_equal(rc, RK_EFORMAT);
            assert_string_equal(err.msg, "t.prom:2: more than 64 labels");
        }
    }
    /* a line of 65536 bytes (without its newline) is fine, of 65537 not */
    for (size_t len = 65535; len <= 65537; len++) {
        /* VRM{gpu="0",pad="xxx..."} 5 */
        size_t j = (size_t)sprintf(text, "# c\n" VRM "{gpu=\"0\",pad=\""), start = 4;
        size_t tail = strlen("\"} 5");
        size_t pad = len - (j - start) - tail;
        memset(text + j, 'x', pad);
        j += pad;
        j += (size_t)sprintf(text + j, "\"} 5\n");
        assert_int_equal(j - start - 1, len);
        fresh(s);
        int rc = merge_len(text, j, s, &err);
        if (len <= 65536) {
            assert_int_equal(rc, RK_OK);
            assert_true(has(&s[0], RK_F_VRM_RIPPLE));
        } else {
            assert_int_equal(rc, RK_EFORMAT);
            assert_string_equal(err.msg, "t.prom:2: line longer than 65536 bytes");
            assert_false(has(&s[0], RK_F_VRM_RIPPLE));
        }
    }
    /* comments count too */
    memset(text, '#', 65537);
    text[65537] = '\n';
    assert_int_equal(merge_len(text, 65538, s, &err), RK_EFORMAT);
    assert_string_equal(err.msg, "t.prom:1: line longer than 65536 bytes");
    free(text);
}

/* A message names the file, the line and the column, never the file's bytes: whatever a
 * file holds (here escape sequences, control bytes, a long name, UTF-8 text), nothing of it
 * appears in the message, which stays one short printable line; a path with a newline too. */
static void test_messages_quote_nothing_from_the_file(void **state)
{
    (void)state;
    rk_gpu_sample s[NGPU];
    rk_err err = {0};
    char text[512];
    int j = snprintf(text, sizeof text, "\x1b[31mevil\x01\xff");
    memset(text + j, 'A', 200);
    snprintf(text + j + 200, sizeof text - (size_t)j - 200, " 1\n");
    fresh(s);
    assert_int_equal(merge(text, s, &err), RK_EFORMAT);
    for (const char *p = err.msg; *p; p++)
        assert_true((unsigned char)*p >= 0x20 && *p != 0x7f);
    assert_string_equal(err.msg, "t.prom:1: invalid metric name (column 1)");
    char val[256] = "x ";
    for (int k = 0; k < 40; k++)
        strcat(val, "\xc3\xa9");
    strcat(val, "\n");
    assert_int_equal(merge(val, s, &err), RK_EFORMAT);
    assert_string_equal(err.msg, "t.prom:1: invalid value (column 3)");
    /* the kinds of problem a secret's first line makes (it was quoted before: 52 bytes of a
     * root-only file showed through /healthz) */
    static const char *const secrets[] = {
        "root:$6$SECRET$hash:19000:0:99999:7:::\n",
        "SECRET_name{k=\"SECRET\"} SECRET\n",
        "SECRET_name{SECRET=1} 1\n",
        "SECRET_name{k=\"SECRET\\q\"} 1\n",
        "# HELP SECRET_name SECRET\\q\n",
        "# TYPE SECRET_name SECRETTYPE\n",
        "SECRET_name 1 SECRET\n",
        "SECRET_name 1 1 SECRET\n",
        FAN "{gpu=\"SECRET\"} 1\n",
        FAN "{gpu=\"0\"} -1.5e-SECRET\n",
        "rk_gpu_vrm_ripple_millivolts{k=\"SECRET\"} 1\n", /* the old VRM name: refused */
        "# TYPE SECRET_name histogram\nSECRET_name_bucket{le=\"SECRET\"} 1\n",
    };
    for (size_t k = 0; k < sizeof secrets / sizeof secrets[0]; k++) {
        fresh(s);
        int rc = merge(secrets[k], s, &err);
        if (rc != RK_EFORMAT || strstr(err.msg, "SECRET") || strstr(err.msg, "root"))
            print_error("case %zu: %d %s\n", k, rc, err.msg);
        assert_int_equal(rc, RK_EFORMAT);
        assert_null(strstr(err.msg, "SECRET"));
        assert_null(strstr(err.msg, "root"));
    }
    /* a path with a newline stays on one line */
    assert_int_equal(rk_textfile_merge("bad\nname.prom", "x y\n", 4, g_info, s, NGPU, &err),
                     RK_EFORMAT);
    assert_string_equal(err.msg, "bad?name.prom:1: invalid value (column 3)");
}

/* ---- a directory of textfiles ------------------------------------------------------------- */

static void put(const char *dir, const char *name, const char *text, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void puts_(const char *dir, const char *name, const char *text)
{
    put(dir, name, text, strlen(text));
}

static const char *fresh_dir(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
    rm_tree(buf);
    assert_int_equal(mkdir(buf, 0755), 0);
    return buf;
}

/* Files are merged in name order (the last word on a GPU wins), whatever order they were
 * written in; dot-files, other names, directories and FIFOs are not read; a link to a file in
 * the same directory is read; a scrape of rk exporter among them merges nothing. */
static void test_dir_reads_prom_files_in_name_order_and_skips_the_rest(void **state)
{
    (void)state;
    char dir[600], text[128], name[32], path[700];
    fresh_dir(dir, sizeof dir, "order");
    for (int k = 9; k >= 0; k--) { /* written last to first */
        snprintf(name, sizeof name, "f%d.prom", k);
        snprintf(text, sizeof text, VRM "{gpu=\"0\"} 0.0%d\n", k); /* k * 10 mV */
        puts_(dir, name, text);
    }
    puts_(dir, "e.prom", FAN "{uuid=\"GPU-bbbb\"} 150\n");
    /* a scrape of rk exporter saved here: its output names are read, never merged */
    puts_(dir, "scrape.prom",
          "# TYPE rk_gpu_fan_vibration_hertz gauge\n"
          "rk_gpu_fan_vibration_hertz{gpu=\"0\",uuid=\"GPU-aaaa\",name=\"test GPU 0\","
          "simulated=\"false\"} 999\n"
          "rk_gpu_vrm_ripple_volts{gpu=\"0\",uuid=\"GPU-aaaa\",name=\"test GPU 0\","
          "simulated=\"false\"} 9\n");
    /* each of these would change GPU 0's ripple or fail if it were read */
    puts_(dir, ".hidden.prom", VRM "{gpu=\"0\"} 1\n");
    puts_(dir, ".tmp.prom", "half a li");
    puts_(dir, "z.prom.tmp", "garbage\n");
    puts_(dir, "z.prom~", VRM "{gpu=\"0\"} 2\n");
    puts_(dir, "zprom", VRM "{gpu=\"0\"} 3\n");
    puts_(dir, "z.PROM", VRM "{gpu=\"0\"} 4\n");
    snprintf(path, sizeof path, "%s/zz.prom", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/zzz.prom", dir);
    assert_int_equal(mkfifo(path, 0644), 0); /* opening it must not hang */
    snprintf(path, sizeof path, "%s/zzzz.prom", dir);
    assert_int_equal(symlink("zzz.prom", path), 0); /* to the FIFO: not a textfile */
    /* a symbolic link to a regular file in the same directory is read */
    puts_(dir, "sensor.out", FAN "{gpu=\"5\"} 77\n");
    snprintf(path, sizeof path, "%s/link.prom", dir);
    assert_int_equal(symlink("sensor.out", path), 0);
    snprintf(path, sizeof path, "%s/dangling.prom", dir);
    assert_int_equal(symlink("no-such-file", path), 0);

    rk_gpu_sample s[NGPU];
    rk_err err = {0};
    fresh(s);
    int rc = rk_textfile_merge_dir(dir, g_info, s, NGPU, &err);
    if (rc)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, RK_OK);
    assert_true(has(&s[0], RK_F_VRM_RIPPLE));
    assert_float_equal(s[0].vrm_ripple_mv, 90, 1e-9); /* f9.prom, the last by name */
    assert_float_equal(s[1].fan_vib_hz, 150, 0);
    assert_float_equal(s[2].fan_vib_hz, 77, 0); /* through link.prom */
    assert_false(has(&s[0], RK_F_FAN_VIB));     /* scrape.prom */
    /* a trailing slash on the directory changes nothing */
    snprintf(path, sizeof path, "%s/", dir);
    fresh(s);
    assert_int_equal(rk_textfile_merge_dir(path, g_info, s, NGPU, &err), RK_OK);
    assert_float_equal(s[0].vrm_ripple_mv, 90, 1e-9);
}

/* A symbolic link out of the directory is never followed, wherever it points (a root-only
 * file, /dev/zero, a file beside the directory, the directory above): it is reported, naming
 * the link and nothing of the target, and the other files still merge. */
static void test_dir_does_not_follow_links_out_of_it(void **state)
{
    (void)state;
    char dir[600], path[700], target[700], want[900];
    fresh_dir(dir, sizeof dir, "links");
    snprintf(target, sizeof target, "%s/secret.txt", g_dir);
    FILE *f = fopen(target, "w");
    assert_non_null(f);
    fputs("SECRET-PASSWORD-HASH\n" FAN "{gpu=\"0\"} 999\n", f);
    assert_int_equal(fclose(f), 0);
    chmod(target, 0400);
    puts_(dir, "good.prom", FAN "{gpu=\"1\"} 12\n");
    static const char *const links[][2] = {
        {"a-abs.prom", NULL}, /* the absolute path of secret.txt */
        {"b-up.prom", "../secret.txt"},
        {"c-zero.prom", "/dev/zero"},
        {"d-sub.prom", "./good.prom"},
    };
    for (size_t k = 0; k < sizeof links / sizeof links[0]; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, links[k][0]);
        assert_int_equal(symlink(links[k][1] ? links[k][1] : target, path), 0);
    }
    rk_gpu_sample s[NGPU];
    rk_err err = {0};
    fresh(s);
    alarm(20);
    int rc = rk_textfile_merge_dir(dir, g_info, s, NGPU, &err);
    alarm(0);
    assert_int_equal(rc, RK_EINVAL);
    snprintf(want, sizeof want,
             "%s/a-abs.prom: is a symbolic link out of the textfile directory; not followed "
             "(only a link to a file in the same directory is read)",
             dir);
    assert_string_equal(err.msg, want);
    assert_null(strstr(err.msg, "SECRET"));
    assert_false(has(&s[0], RK_F_FAN_VIB)); /* secret.txt was not read */
    assert_float_equal(s[1].fan_vib_hz, 12, 0);
    /* each of the links alone is refused the same way */
    for (size_t k = 0; k < sizeof links / sizeof links[0]; k++) {
        char one[600];
        fresh_dir(one, sizeof one, "one-link");
        snprintf(path, sizeof path, "%s/x.prom", one);
        assert_int_equal(symlink(links[k][1] ? links[k][1] : target, path), 0);
        fresh(s);
        assert_int_equal(rk_textfile_merge_dir(one, g_info, s, NGPU, &err), RK_EINVAL);
        assert_non_null(strstr(err.msg, "x.prom: is a symbolic link out of the textfile"));
        assert_false(has(&s[0], RK_F_FAN_VIB));
        rm_tree(path);
    }
    /* a link to a link in the same directory (hop.prom -> hop.out -> the secret): not followed,
     * and said (it was skipped without a word) */
    char two[600], hop[700];
    fresh_dir(two, sizeof two, "two-hops");
    snprintf(hop, sizeof hop, "%s/hop.out", two);
    assert_int_equal(symlink(target, hop), 0);
    snprintf(path, sizeof path, "%s/hop.prom", two);
    assert_int_equal(symlink("hop.out", path), 0);
    fresh(s);
    assert_int_equal(rk_textfile_merge_dir(two, g_info, s, NGPU, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "hop.prom: is a symbolic link to a symbolic link"));
    assert_null(strstr(err.msg, "SECRET"));
    assert_false(has(&s[0], RK_F_FAN_VIB));
    rm_tree(path);
    rm_tree(hop);
}

/* A broken file is reported (the first by name) and merges nothing; the others still merge. */
static void test_dir_reports_a_broken_file_and_merges_the_good_ones(void **state)
{
    (void)state;
    char dir[600], want[800];
    fresh_dir(dir, sizeof dir, "broken");
    puts_(dir, "a.prom", FAN "{gpu=\"1\"} 300\n");
    puts_(dir, "b.prom", VRM "{gpu=\"1\"} 0.07\n" VRM "{gpu=\"0\"} x\n");
    puts_(dir, "c.prom", VRM "{gpu=\"0\"} 0.06\n");
    puts_(dir, "d.prom", FAN "{gpu=\"5\"} 1\n" FAN "{gpu=\"5\"} NaN\n");
    puts_(dir, "e.prom", FAN "{gpu=\"0\"} 5");
    rk_gpu_sample s[NGPU];
    rk_err err = {0};
    fresh(s);
    assert_int_equal(rk_textfile_merge_dir(dir, g_info, s, NGPU, &err), RK_EFORMAT);
    snprintf(want, sizeof want, "%s/b.prom:2: invalid value (column 37)", dir);
    assert_string_equal(err.msg, want);
    assert_int_equal(err.code, RK_EFORMAT);
    assert_float_equal(s[1].fan_vib_hz, 300, 0);      /* a.prom */
    assert_float_equal(s[0].vrm_ripple_mv, 60, 1e-9); /* c.prom */
    assert_false(has(&s[1], RK_F_VRM_RIPPLE));        /* b.prom's good line 1 */
    assert_false(has(&s[2], RK_F_FAN_VIB));           /* d.prom */
    assert_false(has(&s[0], RK_F_FAN_VIB));           /* e.prom, cut off */
}

/* A file over 1 MiB is refused by its size, even if valid; exactly 1 MiB is read. */
static void test_dir_refuses_a_file_over_one_mebibyte(void **state)
{
    (void)state;
    char dir[600], want[800];
    const size_t mib = 1024 * 1024;
    fresh_dir(dir, sizeof dir, "size");
    char *text = malloc(mib + 2);
    assert_non_null(text);
    for (size_t extra = 0; extra <= 1; extra++) {
        static const char line[] = VRM "{gpu=\"0\"} 0.055\n";
        size_t len = mib + extra, body = len - strlen(line);
        memset(text, ' ', body); /* lines of blanks */
        for (size_t k = 1000; k < body; k += 1000)
            text[k] = '\n';
        text[body - 1] = '\n';
        memcpy(text + body, line, strlen(line));
        put(dir, extra ? "big.prom" : "exact.prom", text, len);
    }
    free(text);
    rk_gpu_sample s[NGPU];
    rk_err err = {0};
    fresh(s);
    assert_int_equal(rk_textfile_merge_dir(dir, g_info, s, NGPU, &err), RK_EFORMAT);
    snprintf(want, sizeof want,
             "%s/big.prom: file is 1048577 bytes, more than the limit of 1048576", dir);
    assert_string_equal(err.msg, want);
    assert_true(has(&s[0], RK_F_VRM_RIPPLE)); /* exact.prom */
    assert_float_equal(s[0].vrm_ripple_mv, 55, 1e-9);
}

static void test_dir_missing_or_empty(void **state)
{
    (void)state;
    char dir[600], want[800];
    rk_gpu_sample s[NGPU], before[NGPU];
    rk_err err = {0};
    fresh(s);
    memcpy(before, s, sizeof s);
    snprintf(dir, sizeof dir, "%s/no-such-dir", g_dir);
    assert_int_equal(rk_textfile_merge_dir(dir, g_info, s, NGPU, &err), RK_ENOENT);
    snprintf(want, sizeof want, "%s: cannot open the textfile directory: No such file or directory",
             dir);
    assert_string_equal(err.msg, want);
    fresh_dir(dir, sizeof dir, "empty");
    assert_int_equal(rk_textfile_merge_dir(dir, g_info, s, NGPU, &err), RK_OK);
    assert_memory_equal(s, before, sizeof s);
    assert_int_equal(rk_textfile_merge_dir(NULL, g_info, s, NGPU, &err), RK_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file_merges_both_sensors_by_index_and_uuid),
        cmocka_unit_test(test_the_documented_example_merges_as_documented),
        cmocka_unit_test(test_output_and_old_names_are_not_inputs),
        cmocka_unit_test(test_empty_and_comment_only_files_change_nothing),
        cmocka_unit_test(test_values_are_read_as_go_floats),
        cmocka_unit_test(test_malformed_lines_are_named_with_line_and_problem),
        cmocka_unit_test(test_a_file_merges_all_or_nothing),
        cmocka_unit_test(test_unknown_and_lost_gpus_are_left_alone),
        cmocka_unit_test(test_limits_on_labels_and_line_length),
        cmocka_unit_test(test_messages_quote_nothing_from_the_file),
        cmocka_unit_test(test_dir_reads_prom_files_in_name_order_and_skips_the_rest),
        cmocka_unit_test(test_dir_does_not_follow_links_out_of_it),
        cmocka_unit_test(test_dir_reports_a_broken_file_and_merges_the_good_ones),
        cmocka_unit_test(test_dir_refuses_a_file_over_one_mebibyte),
        cmocka_unit_test(test_dir_missing_or_empty),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
