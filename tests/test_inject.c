/*
 * Fault-injection specs (rekindle/inject.h): the documented example parses to the right
 * fields, defaults and units; canonical formatting round-trips (hand-picked and seeded random
 * specs); every class of bad spec is RK_EINVAL with the right byte position and escaped text;
 * the limits; and the runtime: fixed faults fire exactly once, done lists and rank filters
 * suppress, slow faults fire at their first step, mtbf arrivals are deterministic per
 * (seed, rank, launch) and have the right mean; and RK_INJECT/RK_INJECT_DONE/RK_LAUNCH.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rekindle/inject.h"
#include "rekindle/rng.h"

#define EXAMPLE                                                                                    \
    "crash@step=120:rank=2,hang@step=300:rank=1,nan@step=200,bitflip@step=400:rank=3,"             \
    "slow@step=50:rank=0:ms=200:for=20,commfail@step=500:rank=1,gradflip@step=250:rank=0,"         \
    "crash@mtbf=120s:seed=7"

static rk_inject *parse_ok(const char *spec)
{
    rk_inject *inj = NULL;
    rk_err err = {0};
    int rc = rk_inject_parse(spec, &inj, &err);
    if (rc != RK_OK)
        printf("spec '%s': %s\n", spec, err.msg);
    assert_int_equal(rc, RK_OK);
    assert_non_null(inj);
    return inj;
}

static void expect_fault(const rk_fault *f, rk_fault_kind kind, int64_t step, int rank,
                         double mtbf_s, uint64_t seed, int ms, int64_t steps)
{
    assert_non_null(f);
    assert_int_equal(f->kind, kind);
    assert_int_equal(f->step, step);
    assert_int_equal(f->rank, rank);
    assert_true(f->mtbf_s == mtbf_s);
    assert_int_equal(f->seed, seed);
    assert_int_equal(f->ms, ms);
    assert_int_equal(f->steps, steps);
}

static void expect_same_lists(const rk_inject *a, const rk_inject *b)
{
    assert_int_equal(rk_inject_count(a), rk_inject_count(b));
    for (size_t i = 0; i < rk_inject_count(a); i++) {
        const rk_fault *x = rk_inject_get(a, i);
        expect_fault(rk_inject_get(b, i), x->kind, x->step, x->rank, x->mtbf_s, x->seed, x->ms,
                     x->steps);
    }
}

static void expect_err(int rc, const rk_err *err, const char *want)
{
    assert_int_equal(rc, RK_EINVAL);
    assert_int_equal(err->code, RK_EINVAL);
    if (!strstr(err->msg, want))
        printf("message '%s' lacks '%s'\n", err->msg, want);
    assert_non_null(strstr(err->msg, want));
    assert_null(strchr(err->msg, '\n'));
}

/* ---- parsing ---- */

static void test_example_parses_to_the_documented_fields(void **state)
{
    (void)state;
    rk_inject *inj = parse_ok(EXAMPLE);
    assert_int_equal(rk_inject_count(inj), 8);
    expect_fault(rk_inject_get(inj, 0), RK_FAULT_CRASH, 120, 2, 0.0, 0, 0, 0);
    expect_fault(rk_inject_get(inj, 1), RK_FAULT_HANG, 300, 1, 0.0, 0, 0, 0);
    expect_fault(rk_inject_get(inj, 2), RK_FAULT_NAN, 200, 0, 0.0, 0, 0, 0);
    expect_fault(rk_inject_get(inj, 3), RK_FAULT_BITFLIP, 400, 3, 0.0, 0, 0, 0);
    expect_fault(rk_inject_get(inj, 4), RK_FAULT_SLOW, 50, 0, 0.0, 0, 200, 20);
    expect_fault(rk_inject_get(inj, 5), RK_FAULT_COMMFAIL, 500, 1, 0.0, 0, 0, 0);
    expect_fault(rk_inject_get(inj, 6), RK_FAULT_GRADFLIP, 250, 0, 0.0, 0, 0, 0);
    expect_fault(rk_inject_get(inj, 7), RK_FAULT_CRASH, -1, -1, 120.0, 7, 0, 0);
    assert_null(rk_inject_get(inj, 8));
    rk_inject_free(inj);
}

static void test_null_and_empty_specs_are_empty_lists(void **state)
{
    (void)state;
    rk_inject *a = parse_ok(NULL), *b = parse_ok("");
    assert_int_equal(rk_inject_count(a), 0);
    assert_int_equal(rk_inject_count(b), 0);
    assert_int_equal(rk_inject_count(NULL), 0);
    assert_null(rk_inject_get(a, 0));
    char buf[8] = "x";
    assert_int_equal(rk_inject_format(a, buf, sizeof buf), RK_OK);
    assert_string_equal(buf, "");
    assert_int_equal(rk_inject_arm(b, 0, 0, NULL, NULL), RK_OK);
    size_t idx[4];
    assert_int_equal(rk_inject_due(b, 0, 1e9, idx, 4), 0);
    rk_inject_free(a);
    rk_inject_free(b);
    rk_inject_free(NULL);
}

static void test_defaults_units_and_spacing(void **state)
{
    (void)state;
    rk_inject *inj = parse_ok("slow@step=7, slow@mtbf=250ms:rank=4,  hang@mtbf=1.5h:seed=0,"
                              "nan@mtbf=2m:seed=18446744073709551615,crash@mtbf=30,"
                              "gradflip@step=0004611686018427387904:rank=65535,bitflip@mtbf=0.5s");
    assert_int_equal(rk_inject_count(inj), 7);
    /* slow: ms 100, until the end; fixed faults: rank 0, seed 0 */
    expect_fault(rk_inject_get(inj, 0), RK_FAULT_SLOW, 7, 0, 0.0, 0, 100, 0);
    /* mtbf faults: seed 1, rank -1 unless given; units ms, h, m, bare seconds, s */
    expect_fault(rk_inject_get(inj, 1), RK_FAULT_SLOW, -1, 4, 0.25, 1, 100, 0);
    expect_fault(rk_inject_get(inj, 2), RK_FAULT_HANG, -1, -1, 5400.0, 0, 0, 0);
    expect_fault(rk_inject_get(inj, 3), RK_FAULT_NAN, -1, -1, 120.0, UINT64_MAX, 0, 0);
    expect_fault(rk_inject_get(inj, 4), RK_FAULT_CRASH, -1, -1, 30.0, 1, 0, 0);
    expect_fault(rk_inject_get(inj, 5), RK_FAULT_GRADFLIP, (int64_t)1 << 62, 65535, 0.0, 0, 0, 0);
    expect_fault(rk_inject_get(inj, 6), RK_FAULT_BITFLIP, -1, -1, 0.5, 1, 0, 0);
    rk_inject_free(inj);
}

static void test_kind_names(void **state)
{
    (void)state;
    const char *names[] = {"crash", "hang", "nan", "bitflip", "gradflip", "slow", "commfail"};
    for (int k = RK_FAULT_CRASH; k <= RK_FAULT_COMMFAIL; k++) {
        assert_string_equal(rk_fault_kind_name((rk_fault_kind)k), names[k]);
        char spec[32];
        snprintf(spec, sizeof spec, "%s@step=1", names[k]);
        rk_inject *inj = parse_ok(spec);
        assert_int_equal(rk_inject_get(inj, 0)->kind, k);
        rk_inject_free(inj);
    }
    assert_string_equal(rk_fault_kind_name((rk_fault_kind)99), "unknown");
}

/* ---- formatting ---- */

static char *format_ok(const rk_inject *inj, char *buf, size_t cap)
{
    assert_int_equal(rk_inject_format(inj, buf, cap), RK_OK);
    return buf;
}

static void test_format_is_canonical_and_round_trips(void **state)
{
    (void)state;
    char buf[RK_INJECT_SPEC_MAX + 1];
    rk_inject *inj = parse_ok(EXAMPLE);
    const char *want = "crash@step=120:rank=2,hang@step=300:rank=1,nan@step=200,"
                       "bitflip@step=400:rank=3,slow@step=50:ms=200:for=20,"
                       "commfail@step=500:rank=1,gradflip@step=250,crash@mtbf=2m:seed=7";
    assert_string_equal(format_ok(inj, buf, sizeof buf), want);
    rk_inject *back = parse_ok(buf);
    expect_same_lists(inj, back);
    rk_inject_free(back);

    /* Exactly enough room works; one byte less is RK_EINVAL with an empty buffer. */
    size_t len = strlen(want);
    char *tight = malloc(len + 1);
    assert_non_null(tight);
    assert_string_equal(format_ok(inj, tight, len + 1), want);
    assert_int_equal(rk_inject_format(inj, tight, len), RK_EINVAL);
    assert_string_equal(tight, "");
    assert_int_equal(rk_inject_format(inj, NULL, 10), RK_EINVAL);
    free(tight);
    rk_inject_free(inj);

    /* Different spellings of one list give one text: the shortest unit, defaults dropped. */
    const char *pairs[][2] = {
        {"crash@mtbf=3600s", "crash@mtbf=1h"},
        {"crash@mtbf=60", "crash@mtbf=60"},
        {"crash@mtbf=1m", "crash@mtbf=60"},
        {"crash@mtbf=1.5h", "crash@mtbf=90m"},
        {"crash@mtbf=500ms", "crash@mtbf=0.5"},
        {"crash@mtbf=0.001", "crash@mtbf=1ms"},
        {"crash@mtbf=1000000000", "crash@mtbf=1000000000"},
        {"nan@mtbf=000120.500:seed=1:rank=0", "nan@mtbf=120.5:rank=0"},
        {"slow@for=3:ms=100:step=009", "slow@step=9:for=3"},
        {"hang@rank=0:step=1,  nan@step=2", "hang@step=1,nan@step=2"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        rk_inject *a = parse_ok(pairs[i][0]);
        assert_string_equal(format_ok(a, buf, sizeof buf), pairs[i][1]);
        rk_inject *b = parse_ok(buf);
        expect_same_lists(a, b);
        rk_inject_free(a);
        rk_inject_free(b);
    }

    /* 7291122019556398e-319 ms: the 16-digit rounding of the number it parses to does not
     * parse back to it, its upper 16-digit neighbour (the input) does; the text must not grow
     * to 17 digits (that would break the "never longer" promise). */
    char tiny[400] = "crash@mtbf=0.";
    for (int i = 0; i < 303; i++)
        strcat(tiny, "0");
    strcat(tiny, "7291122019556398ms");
    rk_inject *a = parse_ok(tiny);
    format_ok(a, buf, sizeof buf);
    if (strlen(buf) > strlen(tiny))
        printf("'%s' formats longer: '%s'\n", tiny, buf);
    assert_true(strlen(buf) <= strlen(tiny));
    rk_inject *b = parse_ok(buf);
    expect_same_lists(a, b);
    rk_inject_free(a);
    rk_inject_free(b);
}

/* Append a random decimal integer in 0..max with up to 2 leading zeros. */
static void put_int(rk_rng *r, char *s, uint64_t min, uint64_t max)
{
    uint64_t v = min + rk_rng_below(r, max - min + 1);
    int zeros = (int)rk_rng_below(r, 3);
    size_t o = strlen(s);
    for (int i = 0; i < zeros; i++)
        s[o++] = '0';
    snprintf(s + o, 32, "%llu", (unsigned long long)v);
}

/* A random DUR between about 1e-3 and 1e5 units: digits, an optional fraction, a unit. */
static void put_dur(rk_rng *r, char *s)
{
    static const char *const units[] = {"", "s", "ms", "m", "h"};
    size_t o = strlen(s);
    int ndig = 1 + (int)rk_rng_below(r, 5);
    s[o++] = (char)('1' + rk_rng_below(r, 9));
    for (int i = 1; i < ndig; i++)
        s[o++] = (char)('0' + rk_rng_below(r, 10));
    if (rk_rng_below(r, 2)) {
        s[o++] = '.';
        int nfrac = 1 + (int)rk_rng_below(r, 12);
        for (int i = 0; i < nfrac; i++)
            s[o++] = (char)('0' + rk_rng_below(r, 10));
    }
    s[o] = '\0';
    strcat(s, units[rk_rng_below(r, 5)]);
}

static void test_random_specs_round_trip_and_never_grow(void **state)
{
    (void)state;
    static const char *const kinds[] = {"crash",    "hang", "nan",     "bitflip",
                                        "gradflip", "slow", "commfail"};
    rk_rng r;
    rk_rng_seed(&r, 2024);
    char spec[2048], buf[RK_INJECT_SPEC_MAX + 1], again[RK_INJECT_SPEC_MAX + 1];
    for (int trial = 0; trial < 2000; trial++) {
        spec[0] = '\0';
        int n = 1 + (int)rk_rng_below(&r, 8);
        for (int i = 0; i < n; i++) {
            if (i > 0)
                strcat(spec, rk_rng_below(&r, 2) ? "," : ", ");
            int kind = (int)rk_rng_below(&r, 7);
            bool is_random = rk_rng_below(&r, 2);
            strcat(spec, kinds[kind]);
            strcat(spec, "@");
            /* keys in a random order: the time key first or after the others */
            char extra[256] = "";
            if (rk_rng_below(&r, 2)) {
                strcat(extra, ":rank=");
                put_int(&r, extra, 0, 65535);
            }
            if (is_random && rk_rng_below(&r, 2)) {
                strcat(extra, ":seed=");
                put_int(&r, extra, 0, UINT64_MAX - 1);
            }
            if (kind == RK_FAULT_SLOW && rk_rng_below(&r, 2)) {
                strcat(extra, ":ms=");
                put_int(&r, extra, 1, 600000);
            }
            if (kind == RK_FAULT_SLOW && rk_rng_below(&r, 2)) {
                strcat(extra, ":for=");
                put_int(&r, extra, 1, (uint64_t)1 << 62);
            }
            char time[128] = "";
            strcat(time, is_random ? "mtbf=" : "step=");
            if (is_random)
                put_dur(&r, time);
            else
                put_int(&r, time, 0, (uint64_t)1 << 62);
            if (extra[0] && rk_rng_below(&r, 2)) {
                strcat(spec, extra + 1);
                strcat(spec, ":");
                strcat(spec, time);
            } else {
                strcat(spec, time);
                strcat(spec, extra);
            }
        }
        rk_inject *a = parse_ok(spec);
        format_ok(a, buf, sizeof buf);
        if (strlen(buf) > strlen(spec))
            printf("'%s' formats longer: '%s'\n", spec, buf);
        assert_true(strlen(buf) <= strlen(spec));
        rk_inject *b = parse_ok(buf);
        expect_same_lists(a, b);
        assert_string_equal(format_ok(b, again, sizeof again), buf); /* a fixed point */
        rk_inject_free(a);
        rk_inject_free(b);
    }
}

/* ---- errors ---- */

static void expect_bad(const char *spec, const char *want)
{
    rk_inject *inj = (rk_inject *)&inj; /* must be reset to NULL */
    rk_err err = {0};
    expect_err(rk_inject_parse(spec, &inj, &err), &err, want);
    assert_null(inj);
}

static void test_exact_messages_name_the_position_and_problem(void **state)
{
    (void)state;
    rk_inject *inj = NULL;
    rk_err err = {0};
    assert_int_equal(rk_inject_parse("crsh@step=1", &inj, &err), RK_EINVAL);
    assert_string_equal(err.msg, "fault spec: position 1: unknown fault kind 'crsh' (expected "
                                 "crash, hang, nan, bitflip, gradflip, slow, commfail)");
    assert_int_equal(rk_inject_parse("crash@step=1:rnk=2", &inj, &err), RK_EINVAL);
    assert_string_equal(err.msg, "fault spec: position 14: unknown key 'rnk' (expected step, "
                                 "rank, mtbf, seed, ms, for)");
    assert_int_equal(rk_inject_parse("nan@step=5,crash@step=12x", &inj, &err), RK_EINVAL);
    assert_string_equal(err.msg, "fault spec: position 23: bad value '12x' for step (expected a "
                                 "decimal integer 0..4611686018427387904)");
    assert_int_equal(rk_inject_parse("slow@step=1:ms=600001", &inj, &err), RK_EINVAL);
    assert_string_equal(err.msg, "fault spec: position 16: ms=600001 is out of range (1..600000)");
    assert_int_equal(rk_inject_parse("hang@step=3:seed=2", &inj, &err), RK_EINVAL);
    assert_string_equal(err.msg, "fault spec: position 13: seed= is only allowed with mtbf= (a "
                                 "step= fault is not random)");
    assert_null(inj);
}

static void test_every_error_class_is_einval_at_its_position(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        /* kinds and structure */
        {"CRASH@step=1", "position 1: unknown fault kind 'CRASH'"},
        {"crash", "position 6: expected '@' after 'crash'"},
        {"crash:step=1", "position 6: expected '@' after 'crash'"},
        {"@step=1", "position 1: missing fault kind"},
        {"crash@", "position 7: missing key"},
        {"crash@step=1:", "position 14: missing key"},
        {"crash@step", "position 11: expected '=' after 'step'"},
        {"crash@step=", "position 12: empty value for 'step'"},
        {"crash@step=:rank=1", "position 12: empty value for 'step'"},
        {"crash@step=1,", "position 14: missing fault kind"},
        {"crash@step=1, ", "position 15: missing fault kind"},
        {"crash@step=1,,nan@step=2", "position 14: missing fault kind"},
        /* spaces only after a comma */
        {" crash@step=1", "position 1: unknown fault kind ' crash'"},
        {"crash@step=1 ,nan@step=2", "position 12: bad value '1 ' for step"},
        {"crash@ step=1", "position 7: unknown key ' step'"},
        {"crash@step=1: rank=1", "position 14: unknown key ' rank'"},
        {"crash@step= 1", "position 12: bad value ' 1' for step"},
        {"crash@step=1,\tnan@step=2", "position 14: unknown fault kind '\\x09nan'"},
        /* keys */
        {"crash@step=1:step=2", "position 14: duplicate key 'step'"},
        {"slow@step=1:ms=5:ms=5", "position 18: duplicate key 'ms'"},
        {"crash@step=1:ms=5", "position 14: key 'ms' is only allowed for slow, not crash"},
        {"nan@step=1:for=5", "position 12: key 'for' is only allowed for slow, not nan"},
        {"crash@step=1:mtbf=5", "position 14: step= and mtbf= exclude each other"},
        {"crash@mtbf=5:step=1", "position 14: step= and mtbf= exclude each other"},
        {"crash@rank=1", "position 1: crash fault needs step= or mtbf="},
        {"nan@step=1,slow@ms=5", "position 12: slow fault needs step= or mtbf="},
        /* integers with junk or out of range */
        {"crash@step=-1", "position 12: bad value '-1' for step"},
        {"crash@step=0x10", "position 12: bad value '0x10' for step"},
        {"crash@step=+5", "position 12: bad value '+5' for step"},
        {"crash@step=1.0", "position 12: bad value '1.0' for step"},
        {"crash@step=4611686018427387905", "position 12: step=4611686018427387905 is out of range"},
        {"crash@step=99999999999999999999999", "position 12: step=99999999999999999999999 is out"},
        {"crash@step=1:rank=65536", "position 19: rank=65536 is out of range (0..65535)"},
        {"crash@step=1:rank=-1", "position 19: bad value '-1' for rank"},
        {"slow@step=1:ms=0", "position 16: ms=0 is out of range (1..600000)"},
        {"slow@step=1:for=0", "position 17: for=0 is out of range (1..4611686018427387904)"},
        {"crash@mtbf=5:seed=18446744073709551616", "position 19: seed=18446744073709551616 is out"},
        {"crash@mtbf=5:seed=1=2", "position 19: bad value '1=2' for seed"},
        /* durations */
        {"crash@mtbf=0", "position 12: mtbf=0 is out of range (above 0, at most 1e9 seconds)"},
        {"crash@mtbf=0.000ms", "position 12: mtbf=0.000ms is out of range"},
        {"crash@mtbf=1000000001", "position 12: mtbf=1000000001 is out of range"},
        {"crash@mtbf=16666667m", "position 12: mtbf=16666667m is out of range"},
        {"crash@mtbf=1e3", "position 12: bad value '1e3' for mtbf (expected a number"},
        {"crash@mtbf=5d", "position 12: bad value '5d' for mtbf"},
        {"crash@mtbf=5sec", "position 12: bad value '5sec' for mtbf"},
        {"crash@mtbf=1.", "position 12: bad value '1.' for mtbf"},
        {"crash@mtbf=.5", "position 12: bad value '.5' for mtbf"},
        {"crash@mtbf=-5", "position 12: bad value '-5' for mtbf"},
        {"crash@mtbf=+5", "position 12: bad value '+5' for mtbf"},
        {"crash@mtbf=inf", "position 12: bad value 'inf' for mtbf"},
        {"crash@mtbf=nan", "position 12: bad value 'nan' for mtbf"},
        {"crash@mtbf=5 s", "position 12: bad value '5 s' for mtbf"},
        {"crash@mtbf=ms", "position 12: bad value 'ms' for mtbf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_bad(cases[i][0], cases[i][1]);
}

static void test_untrusted_text_is_escaped_and_cut(void **state)
{
    (void)state;
    expect_bad("cr\x01\xffsh@step=1", "position 1: unknown fault kind 'cr\\x01\\xffsh' (");
    expect_bad("it's@step=1", "unknown fault kind 'it\\'s'");
    expect_bad("a\\b@step=1", "unknown fault kind 'a\\\\b'");
    char spec[160] = "crash@step=1:";
    memset(spec + 13, 'k', 100);
    strcpy(spec + 113, "=1");
    expect_bad(spec, "position 14: unknown key 'kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk...' (");
}

static void test_length_and_fault_count_limits(void **state)
{
    (void)state;
    /* 4096 bytes is fine, 4097 is not */
    char *spec = malloc(RK_INJECT_SPEC_MAX + 2);
    assert_non_null(spec);
    strcpy(spec, "crash@step=");
    size_t head = strlen(spec);
    memset(spec + head, '0', RK_INJECT_SPEC_MAX - head - 1);
    strcpy(spec + RK_INJECT_SPEC_MAX - 1, "7");
    assert_int_equal(strlen(spec), RK_INJECT_SPEC_MAX);
    rk_inject *inj = parse_ok(spec);
    assert_int_equal(rk_inject_get(inj, 0)->step, 7);
    rk_inject_free(inj);
    strcat(spec, "7");
    expect_bad(spec, "position 4097: spec is longer than 4096 bytes");

    /* 256 faults are fine, the 257th is not (each "nan@step=1," is 11 bytes) */
    spec[0] = '\0';
    for (int i = 0; i < RK_INJECT_MAX_FAULTS; i++)
        strcat(spec, i ? ",nan@step=1" : "nan@step=1");
    inj = parse_ok(spec);
    assert_int_equal(rk_inject_count(inj), RK_INJECT_MAX_FAULTS);
    rk_inject_free(inj);
    strcat(spec, ",nan@step=1");
    expect_bad(spec, "position 2817: more than 256 faults");
    free(spec);
}

/* ---- runtime ---- */

static rk_inject *armed(const char *spec, int rank, uint64_t launch, const char *done)
{
    rk_inject *inj = parse_ok(spec);
    rk_err err = {0};
    int rc = rk_inject_arm(inj, rank, launch, done, &err);
    if (rc != RK_OK)
        printf("arm: %s\n", err.msg);
    assert_int_equal(rc, RK_OK);
    return inj;
}

/* due(step, elapsed) returns exactly want[0..n). */
static void expect_due(rk_inject *inj, int64_t step, double elapsed, const size_t *want, size_t n)
{
    size_t idx[16];
    size_t got = rk_inject_due(inj, step, elapsed, idx, 16);
    if (got != n)
        printf("step %lld: %zu faults due, want %zu\n", (long long)step, got, n);
    assert_int_equal(got, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(idx[i], want[i]);
}

#define DUE(inj, step, ...)                                                                        \
    do {                                                                                           \
        const size_t want_[] = {__VA_ARGS__};                                                      \
        expect_due(inj, step, 0.0, want_ + 1, sizeof want_ / sizeof want_[0] - 1);                 \
    } while (0)

static void test_due_fires_fixed_faults_exactly_once(void **state)
{
    (void)state;
    rk_inject *inj = parse_ok("crash@step=5,nan@step=5:rank=1,hang@step=7,bitflip@step=5");
    size_t idx[4];
    assert_int_equal(rk_inject_due(inj, 5, 0.0, idx, 4), 0); /* not armed yet */
    assert_int_equal(rk_inject_arm(inj, 0, 0, NULL, NULL), RK_OK);
    DUE(inj, 4, 0);
    DUE(inj, 5, 0, 0, 3);
    DUE(inj, 5, 0); /* the same step again: nothing */
    DUE(inj, 6, 0);
    DUE(inj, 7, 0, 2);
    DUE(inj, 7, 0);
    DUE(inj, 5, 0); /* going back (a resume) does not fire again in this arm */
    /* Arming again (a relaunch) makes them pending again. */
    assert_int_equal(rk_inject_arm(inj, 0, 1, NULL, NULL), RK_OK);
    DUE(inj, 5, 0, 0, 3);
    rk_inject_free(inj);
}

static void test_due_keeps_what_did_not_fit_in_cap(void **state)
{
    (void)state;
    rk_inject *inj = armed("crash@step=5,nan@step=5,hang@step=5", 0, 0, NULL);
    size_t idx[2];
    assert_int_equal(rk_inject_due(inj, 5, 0.0, idx, 2), 2);
    assert_int_equal(idx[0], 0);
    assert_int_equal(idx[1], 1);
    assert_int_equal(rk_inject_due(inj, 5, 0.0, idx, 0), 0);
    assert_int_equal(rk_inject_due(inj, 5, 0.0, NULL, 2), 0);
    assert_int_equal(rk_inject_due(inj, 5, 0.0, idx, 2), 1);
    assert_int_equal(idx[0], 2);
    assert_int_equal(rk_inject_due(inj, 5, 0.0, idx, 2), 0);
    rk_inject_free(inj);
}

static void test_done_list_suppresses_and_bad_lists_are_rejected(void **state)
{
    (void)state;
    const char *spec = "crash@step=5,nan@step=6,hang@step=7,slow@mtbf=1ms";
    rk_inject *inj = armed(spec, 0, 1, "0");
    DUE(inj, 5, 0);
    DUE(inj, 6, 0, 1);
    DUE(inj, 7, 0, 2);
    rk_inject_free(inj);

    inj = armed(spec, 0, 2, "2, 0,0,3"); /* spaces after commas, repeats */
    DUE(inj, 5, 0);
    DUE(inj, 6, 0, 1);
    DUE(inj, 7, 0);
    assert_true(isinf(rk_inject_next_arrival(inj, 3)));
    expect_due(inj, 8, 1e9, NULL, 0); /* the listed random fault never fires */
    rk_inject_free(inj);

    inj = armed(spec, 0, 0, "");
    static const char *const bad[][2] = {
        {"x", "fault done list 'x': position 1: bad fault index 'x' (expected 0..3)"},
        {"4", "position 1: bad fault index '4' (expected 0..3)"},
        {"0,,1", "fault done list '0,,1': position 3: missing fault index '' (expected 0..3)"},
        {"1,", "position 3: missing fault index"},
        {"-1", "bad fault index '-1'"},
        {" 1", "position 1: bad fault index ' 1'"},
        {"1 ,2", "position 1: bad fault index '1 '"},
        {"99999999999999999999999", "bad fault index '99999999999999999999999'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rk_err err = {0};
        expect_err(rk_inject_arm(inj, 1, 5, bad[i][0], &err), &err, bad[i][1]);
    }
    /* A failed arm left the earlier one (rank 0, nothing listed) in place. */
    DUE(inj, 5, 0, 0);
    rk_inject_free(inj);

    inj = parse_ok("");
    rk_err err = {0};
    expect_err(rk_inject_arm(inj, 0, 0, "0", &err), &err, "(the spec has no faults)");
    rk_inject_free(inj);
}

static void test_rank_filtering(void **state)
{
    (void)state;
    const char *spec = "crash@step=5,nan@step=5:rank=1,hang@mtbf=10,slow@mtbf=10:rank=2";
    rk_inject *r0 = armed(spec, 0, 0, NULL);
    rk_inject *r1 = armed(spec, 1, 0, NULL);
    rk_inject *r2 = armed(spec, 2, 0, NULL);
    /* no rank= on a fixed fault: rank 0 only */
    DUE(r0, 5, 0, 0);
    DUE(r1, 5, 0, 1);
    DUE(r2, 5, 0);
    /* no rank= on an mtbf fault: every rank; rank=2 narrows it */
    assert_true(isfinite(rk_inject_next_arrival(r0, 2)));
    assert_true(isfinite(rk_inject_next_arrival(r1, 2)));
    assert_true(isfinite(rk_inject_next_arrival(r2, 2)));
    assert_true(isinf(rk_inject_next_arrival(r0, 3)));
    assert_true(isinf(rk_inject_next_arrival(r1, 3)));
    assert_true(isfinite(rk_inject_next_arrival(r2, 3)));
    assert_true(isinf(rk_inject_next_arrival(r0, 0))); /* fixed */
    expect_due(r0, 9, 1e12, (const size_t[]){2}, 1);
    expect_due(r2, 9, 1e12, (const size_t[]){2, 3}, 2);
    rk_inject_free(r0);
    rk_inject_free(r1);
    rk_inject_free(r2);

    rk_inject *inj = parse_ok(spec);
    rk_err err = {0};
    expect_err(rk_inject_arm(inj, 65536, 0, NULL, &err), &err, "rank 65536 is outside 0..65535");
    expect_err(rk_inject_arm(inj, -1, 0, NULL, &err), &err, "rank -1 is outside 0..65535");
    expect_err(rk_inject_arm(NULL, 0, 0, NULL, &err), &err, "NULL");
    rk_inject_free(inj);
}

static void test_slow_fires_at_its_first_step_only(void **state)
{
    (void)state;
    rk_inject *inj = armed("slow@step=3:ms=250:for=4", 0, 0, NULL);
    expect_fault(rk_inject_get(inj, 0), RK_FAULT_SLOW, 3, 0, 0.0, 0, 250, 4);
    DUE(inj, 2, 0);
    DUE(inj, 3, 0, 0);
    for (int s = 4; s < 10; s++)
        DUE(inj, s, 0);
    rk_inject_free(inj);
}

static void test_mark_done_stops_a_fault_for_good(void **state)
{
    (void)state;
    rk_inject *inj = armed("crash@mtbf=1,nan@step=4", 0, 0, NULL);
    double t = rk_inject_next_arrival(inj, 0);
    expect_due(inj, 0, t, (const size_t[]){0}, 1);
    rk_inject_mark_done(inj, 0);
    rk_inject_mark_done(inj, 1);
    rk_inject_mark_done(inj, 99); /* out of range: no-op */
    rk_inject_mark_done(NULL, 0);
    assert_true(isinf(rk_inject_next_arrival(inj, 0)));
    expect_due(inj, 4, 1e12, NULL, 0);
    assert_int_equal(rk_inject_arm(inj, 0, 1, NULL, NULL), RK_OK); /* re-arming keeps marks */
    expect_due(inj, 4, 1e12, NULL, 0);
    rk_inject_free(inj);
}

/* The first n arrival times of random fault i, fired one by one through due(). */
static void arrivals(rk_inject *inj, size_t i, double *t, int n)
{
    for (int k = 0; k < n; k++) {
        t[k] = rk_inject_next_arrival(inj, i);
        assert_true(isfinite(t[k]) && t[k] >= (k ? t[k - 1] : 0.0));
        size_t idx[4];
        /* just before the arrival nothing fires; at it, exactly this fault */
        if (t[k] > 0.0)
            assert_int_equal(rk_inject_due(inj, k, nextafter(t[k], 0.0), idx, 4), 0);
        assert_int_equal(rk_inject_due(inj, k, t[k], idx, 4), 1);
        assert_int_equal(idx[0], i);
    }
}

static void test_mtbf_draws_depend_only_on_seed_rank_launch(void **state)
{
    (void)state;
    enum { N = 8 };
    const char *spec = "crash@mtbf=10:seed=7";
    double a[N], b[N], c[N];
    rk_inject *x = armed(spec, 3, 5, NULL), *y = armed(spec, 3, 5, NULL);
    arrivals(x, 0, a, N);
    arrivals(y, 0, b, N);
    assert_memory_equal(a, b, sizeof a); /* same (seed, rank, launch): same bits */
    assert_int_equal(rk_inject_arm(x, 3, 5, NULL, NULL), RK_OK);
    arrivals(x, 0, c, N);
    assert_memory_equal(a, c, sizeof a); /* re-arming the same launch replays it */
    /* another launch, rank, seed or index gives other times */
    assert_int_equal(rk_inject_arm(x, 3, 6, NULL, NULL), RK_OK);
    assert_true(rk_inject_next_arrival(x, 0) != a[0]);
    assert_int_equal(rk_inject_arm(x, 4, 5, NULL, NULL), RK_OK);
    assert_true(rk_inject_next_arrival(x, 0) != a[0]);
    rk_inject *z = armed("crash@mtbf=10:seed=8", 3, 5, NULL);
    assert_true(rk_inject_next_arrival(z, 0) != a[0]);
    rk_inject *w = armed("nan@step=1,crash@mtbf=10:seed=7", 3, 5, NULL);
    assert_true(rk_inject_next_arrival(w, 1) != a[0]);
    rk_inject_free(x);
    rk_inject_free(y);
    rk_inject_free(z);
    rk_inject_free(w);
}

static void test_mtbf_arrivals_have_mean_and_spread_of_the_mtbf(void **state)
{
    (void)state;
    /* Exponential inter-arrivals with mean m have standard deviation m; over 20000 of them the
     * sample mean's standard error is m / 141, so 10% is a 14-sigma bound (and the streams
     * are seeded, so the result is fixed anyway). A constant or uniform draw fails the spread
     * check. */
    enum { N = 20000 };
    static const char *const specs[] = {"crash@mtbf=10", "crash@mtbf=250ms:seed=99",
                                        "crash@mtbf=2h:seed=3:rank=7"};
    static const int ranks[] = {0, 11, 7};
    static const double mtbf[] = {10.0, 0.25, 7200.0};
    for (int s = 0; s < 3; s++) {
        rk_inject *inj = armed(specs[s], ranks[s], (uint64_t)s, NULL);
        double prev = 0.0, sum = 0.0, sum2 = 0.0;
        size_t idx[2];
        for (int k = 0; k < N; k++) {
            double t = rk_inject_next_arrival(inj, 0);
            assert_int_equal(rk_inject_due(inj, k, t, idx, 2), 1);
            double gap = t - prev;
            assert_true(gap >= 0.0 && gap <= 40.0 * mtbf[s]);
            sum += gap;
            sum2 += gap * gap;
            prev = t;
        }
        double mean = sum / N, sd = sqrt(sum2 / N - mean * mean);
        if (fabs(mean / mtbf[s] - 1.0) >= 0.1 || fabs(sd / mtbf[s] - 1.0) >= 0.2)
            printf("%s: mean %g, sd %g\n", specs[s], mean, sd);
        assert_true(fabs(mean / mtbf[s] - 1.0) < 0.1);
        assert_true(fabs(sd / mtbf[s] - 1.0) < 0.2);
        rk_inject_free(inj);
    }
}

static void test_from_env_reads_spec_done_list_and_launch(void **state)
{
    (void)state;
    rk_inject *inj = (rk_inject *)&inj;
    rk_err err = {0};
    unsetenv("RK_INJECT");
    unsetenv("RK_INJECT_DONE");
    unsetenv("RK_LAUNCH");
    assert_int_equal(rk_inject_from_env(&inj, 0, &err), RK_OK);
    assert_null(inj); /* injection off */

    setenv("RK_INJECT", "crash@step=2:rank=1,nan@step=3:rank=1,hang@mtbf=5:rank=1", 1);
    assert_int_equal(rk_inject_from_env(&inj, 1, &err), RK_OK);
    DUE(inj, 2, 0, 0);
    rk_inject *ref = armed(getenv("RK_INJECT"), 1, 0, NULL); /* RK_LAUNCH unset: launch 0 */
    assert_true(rk_inject_next_arrival(inj, 2) == rk_inject_next_arrival(ref, 2));
    rk_inject_free(ref);
    rk_inject_free(inj);

    setenv("RK_INJECT_DONE", "0", 1);
    setenv("RK_LAUNCH", "3", 1);
    assert_int_equal(rk_inject_from_env(&inj, 1, &err), RK_OK);
    DUE(inj, 2, 0);
    DUE(inj, 3, 0, 1);
    ref = armed(getenv("RK_INJECT"), 1, 3, "0");
    assert_true(rk_inject_next_arrival(inj, 2) == rk_inject_next_arrival(ref, 2));
    rk_inject_free(ref);
    rk_inject_free(inj);

    setenv("RK_INJECT_DONE", "0,7", 1);
    expect_err(rk_inject_from_env(&inj, 1, &err), &err,
               "RK_INJECT_DONE: fault done list '0,7': position 3: bad fault index '7'");
    assert_null(inj);
    setenv("RK_INJECT_DONE", "", 1);
    setenv("RK_LAUNCH", "3x", 1);
    expect_err(rk_inject_from_env(&inj, 1, &err), &err,
               "RK_LAUNCH: '3x' is not a decimal launch number");
    setenv("RK_LAUNCH", "", 1);
    expect_err(rk_inject_from_env(&inj, 1, &err), &err, "RK_LAUNCH: ''");
    unsetenv("RK_LAUNCH");
    setenv("RK_INJECT", "crash@stp=1", 1);
    expect_err(rk_inject_from_env(&inj, 1, &err), &err,
               "RK_INJECT: fault spec: position 7: unknown key 'stp'");
    assert_null(inj);
    setenv("RK_INJECT", "", 1); /* set but empty: an empty, armed list */
    assert_int_equal(rk_inject_from_env(&inj, 0, &err), RK_OK);
    assert_non_null(inj);
    assert_int_equal(rk_inject_count(inj), 0);
    rk_inject_free(inj);
    unsetenv("RK_INJECT");
    unsetenv("RK_INJECT_DONE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_parses_to_the_documented_fields),
        cmocka_unit_test(test_null_and_empty_specs_are_empty_lists),
        cmocka_unit_test(test_defaults_units_and_spacing),
        cmocka_unit_test(test_kind_names),
        cmocka_unit_test(test_format_is_canonical_and_round_trips),
        cmocka_unit_test(test_random_specs_round_trip_and_never_grow),
        cmocka_unit_test(test_exact_messages_name_the_position_and_problem),
        cmocka_unit_test(test_every_error_class_is_einval_at_its_position),
        cmocka_unit_test(test_untrusted_text_is_escaped_and_cut),
        cmocka_unit_test(test_length_and_fault_count_limits),
        cmocka_unit_test(test_due_fires_fixed_faults_exactly_once),
        cmocka_unit_test(test_due_keeps_what_did_not_fit_in_cap),
        cmocka_unit_test(test_done_list_suppresses_and_bad_lists_are_rejected),
        cmocka_unit_test(test_rank_filtering),
        cmocka_unit_test(test_slow_fires_at_its_first_step_only),
        cmocka_unit_test(test_mark_done_stops_a_fault_for_good),
        cmocka_unit_test(test_mtbf_draws_depend_only_on_seed_rank_launch),
        cmocka_unit_test(test_mtbf_arrivals_have_mean_and_spread_of_the_mtbf),
        cmocka_unit_test(test_from_env_reads_spec_done_list_and_launch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
