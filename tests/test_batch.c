/*
 * Batch policies (rekindle/batch.h): the even, throughput and fault-aware splits on
 * hand-computed numbers, the rounding rule (largest remainder, then raising zero shares), a
 * seeded property test over many (N, B, rates), argument checks, resizing, and the state as
 * checkpoint tensors: round trip, the documented tensors, every missing, mistyped or
 * impossible one named, the old binary blob refused; rk_batch_rank_set.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "items_file.h"
#include "rekindle/batch.h"
#include "rekindle/rng.h"
#include "rekindle/safetensors.h"

#define MAXN 8

static rk_batch_policy *make(rk_batch_kind kind, int n, int64_t b)
{
    rk_batch_policy *p = NULL;
    rk_err err;
    assert_int_equal(rk_batch_policy_create(&p, kind, n, b, &err), RK_OK);
    assert_non_null(p);
    return p;
}

/* Every rank's recorded state is the same in a and b, bit for bit. */
static void assert_same_state(const rk_batch_policy *a, const rk_batch_policy *b)
{
    assert_int_equal(rk_batch_policy_nranks(a), rk_batch_policy_nranks(b));
    for (int i = 0; i < rk_batch_policy_nranks(a); i++) {
        rk_batch_rank_state ra, rb;
        assert_int_equal(rk_batch_rank_get(a, i, &ra, NULL), RK_OK);
        assert_int_equal(rk_batch_rank_get(b, i, &rb, NULL), RK_OK);
        assert_memory_equal(&ra, &rb, sizeof ra);
    }
}

static void set_faults(rk_batch_policy *p, const double *f)
{
    for (int i = 0; i < rk_batch_policy_nranks(p); i++)
        assert_int_equal(rk_batch_set_fault_rate(p, i, f[i], NULL), RK_OK);
}

/* The shares of p equal want[0..n). */
static void expect_shares(const rk_batch_policy *p, const int64_t *want)
{
    int n = rk_batch_policy_nranks(p);
    int64_t got[MAXN];
    rk_err err;
    assert_true(n <= MAXN);
    assert_int_equal(rk_batch_shares(p, got, &err), RK_OK);
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i])
            printf("rank %d: share %lld, want %lld\n", i, (long long)got[i], (long long)want[i]);
        assert_int_equal(got[i], want[i]);
    }
}

static void expect_err(int rc, int code, const rk_err *err, const char *want)
{
    assert_int_equal(rc, code);
    assert_int_equal(err->code, code);
    if (!strstr(err->msg, want))
        printf("message '%s' lacks '%s'\n", err->msg, want);
    assert_non_null(strstr(err->msg, want));
    assert_null(strchr(err->msg, '\n'));
}

/* ---- kinds and shapes ---- */

static void test_kind_names_parse_and_print_back(void **state)
{
    (void)state;
    const char *names[] = {"even", "throughput", "fault-aware"};
    const rk_batch_kind kinds[] = {RK_BATCH_EVEN, RK_BATCH_THROUGHPUT, RK_BATCH_FAULT_AWARE};
    rk_err err;
    for (int i = 0; i < 3; i++) {
        rk_batch_kind k = (rk_batch_kind)99;
        assert_int_equal(rk_batch_kind_parse(names[i], &k, &err), RK_OK);
        assert_int_equal(k, kinds[i]);
        assert_string_equal(rk_batch_kind_name(k), names[i]);
    }
    rk_batch_kind k;
    expect_err(rk_batch_kind_parse("fault_aware", &k, &err), RK_EINVAL, &err,
               "unknown policy 'fault_aware'");
    expect_err(rk_batch_kind_parse("Even", &k, &err), RK_EINVAL, &err, "'Even'");
    expect_err(rk_batch_kind_parse("", &k, &err), RK_EINVAL, &err, "unknown policy ''");
    expect_err(rk_batch_kind_parse(NULL, &k, &err), RK_EINVAL, &err, "NULL");
    assert_string_equal(rk_batch_kind_name((rk_batch_kind)3), "unknown");
}

static void test_create_rejects_no_ranks_and_batch_below_ranks(void **state)
{
    (void)state;
    rk_batch_policy *p = (rk_batch_policy *)&p; /* must be reset to NULL */
    rk_err err;
    expect_err(rk_batch_policy_create(&p, RK_BATCH_EVEN, 0, 8, &err), RK_EINVAL, &err,
               "nranks 0 is outside 1..65536");
    assert_null(p);
    expect_err(rk_batch_policy_create(&p, RK_BATCH_EVEN, -3, 8, &err), RK_EINVAL, &err,
               "nranks -3");
    expect_err(rk_batch_policy_create(&p, RK_BATCH_EVEN, RK_BATCH_MAX_RANKS + 1, INT64_MAX, &err),
               RK_EINVAL, &err, "nranks 65537");
    expect_err(rk_batch_policy_create(&p, RK_BATCH_THROUGHPUT, 4, 3, &err), RK_EINVAL, &err,
               "global batch 3 is smaller than nranks 4");
    expect_err(rk_batch_policy_create(&p, RK_BATCH_FAULT_AWARE, 1, 0, &err), RK_EINVAL, &err,
               "global batch 0");
    expect_err(rk_batch_policy_create(&p, RK_BATCH_EVEN, 1, -5, &err), RK_EINVAL, &err,
               "global batch -5");
    expect_err(rk_batch_policy_create(&p, (rk_batch_kind)7, 2, 8, &err), RK_EINVAL, &err,
               "unknown kind 7");
    assert_null(p);
    expect_err(rk_batch_policy_create(NULL, RK_BATCH_EVEN, 2, 8, &err), RK_EINVAL, &err, "NULL");

    /* B = N is the smallest valid batch: one sample each. */
    p = make(RK_BATCH_FAULT_AWARE, 4, 4);
    set_faults(p, (const double[]){0, 0, 0, 100});
    expect_shares(p, (const int64_t[]){1, 1, 1, 1});
    rk_batch_policy_free(p);
    rk_batch_policy_free(NULL);
}

/* ---- even ---- */

static void test_even_split_gives_the_remainder_to_the_lowest_ranks(void **state)
{
    (void)state;
    static const struct {
        int n;
        int64_t b;
        int64_t want[MAXN];
    } cases[] = {
        {4, 10, {3, 3, 2, 2}},
        {3, 256, {86, 85, 85}},
        {4, 256, {64, 64, 64, 64}},
        {1, 7, {7}},
        {5, 5, {1, 1, 1, 1, 1}},
        {7, 13, {2, 2, 2, 2, 2, 2, 1}},
        {2, 3, {2, 1}},
        {8, 15, {2, 2, 2, 2, 2, 2, 2, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rk_batch_policy *p = make(RK_BATCH_EVEN, cases[c].n, cases[c].b);
        expect_shares(p, cases[c].want);
        rk_batch_policy_free(p);
    }
    /* The largest batch: no overflow, still the integer split. */
    rk_batch_policy *p = make(RK_BATCH_EVEN, 3, INT64_MAX);
    int64_t q = INT64_MAX / 3, r = INT64_MAX % 3;
    expect_shares(p, (const int64_t[]){q + (r > 0), q + (r > 1), q});
    rk_batch_policy_free(p);
}

static void test_even_ignores_throughput_and_fault_rates(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_EVEN, 4, 10);
    set_faults(p, (const double[]){0, 9, 0, 0});
    assert_int_equal(rk_batch_observe_throughput(p, 2, 1000.0, NULL), RK_OK);
    assert_int_equal(rk_batch_observe_throughput(p, 3, 1.0, NULL), RK_OK);
    expect_shares(p, (const int64_t[]){3, 3, 2, 2});
    rk_batch_policy_free(p);
}

/* ---- fault-aware ---- */

static void test_fault_aware_formula_on_hand_computed_rates(void **state)
{
    (void)state;
    /* f = {1,1,2,4}, mean 2: w = 1 + 0.5(1 - f/2) = {1.25, 1.25, 1, 0.5}, sum 4:
     * 256 * w / 4 = {80, 80, 64, 32} exactly. */
    rk_batch_policy *p = make(RK_BATCH_FAULT_AWARE, 4, 256);
    set_faults(p, (const double[]){1, 1, 2, 4});
    expect_shares(p, (const int64_t[]){80, 80, 64, 32});
    rk_batch_policy_free(p);

    /* f = {1,3}, mean 2: w = {1.25, 0.75}: targets 62.5 and 37.5, floors 62 + 37 = 99; the
     * last unit goes to the tie's lower rank. */
    p = make(RK_BATCH_FAULT_AWARE, 2, 100);
    set_faults(p, (const double[]){1, 3});
    expect_shares(p, (const int64_t[]){63, 37});
    rk_batch_policy_free(p);

    /* f = {0.5, 2, 0.5}, mean 1: w = {1.25, 0.5, 1.25}, sum 3: 60 * w / 3 = {25, 10, 25}. */
    p = make(RK_BATCH_FAULT_AWARE, 3, 60);
    set_faults(p, (const double[]){0.5, 2, 0.5});
    expect_shares(p, (const int64_t[]){25, 10, 25});
    rk_batch_policy_free(p);
}

static void test_fault_aware_clamps_ranks_above_three_times_the_mean(void **state)
{
    (void)state;
    /* f = {0,0,0,4}, mean 1: w = {1.5, 1.5, 1.5, 1 + 0.5(1 - 4) = -0.5 -> 0}. Targets 85.33
     * each: floors 255, the last unit to rank 0 (tie); rank 3 is raised to 1 from the largest
     * share, rank 0. */
    rk_batch_policy *p = make(RK_BATCH_FAULT_AWARE, 4, 256);
    set_faults(p, (const double[]){0, 0, 0, 4});
    expect_shares(p, (const int64_t[]){85, 85, 85, 1});
    rk_batch_policy_free(p);

    /* f = {0,0,0,0,100}, mean 20: w = {1.5 x4, -1 -> 0}: targets 2.5 each, floors 8, two
     * units to ranks 0 and 1 -> {3,3,2,2,0}; rank 4 takes one from rank 0. */
    p = make(RK_BATCH_FAULT_AWARE, 5, 10);
    set_faults(p, (const double[]){0, 0, 0, 0, 100});
    expect_shares(p, (const int64_t[]){2, 3, 2, 2, 1});
    rk_batch_policy_free(p);

    /* f = {0,0,0,0,50,50}, mean 100/6: ranks 4 and 5 sit at exactly 3x the mean, w = 0
     * without clamping. {2,2,2,2,0,0}: the two raises take from ranks 0 then 1. */
    p = make(RK_BATCH_FAULT_AWARE, 6, 8);
    set_faults(p, (const double[]){0, 0, 0, 0, 50, 50});
    expect_shares(p, (const int64_t[]){1, 1, 2, 2, 1, 1});
    rk_batch_policy_free(p);
}

static void test_fault_aware_without_faults_is_even(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_FAULT_AWARE, 4, 10);
    expect_shares(p, (const int64_t[]){3, 3, 2, 2});
    set_faults(p, (const double[]){0, 0, 7, 0});
    /* w = {1.5, 1.5, 0, 1.5}: targets 3.33, floors {3,3,0,3}, the unit to rank 0, then rank 2
     * is raised from rank 0. */
    expect_shares(p, (const int64_t[]){3, 3, 1, 3});
    set_faults(p, (const double[]){0, 0, 0, 0});
    expect_shares(p, (const int64_t[]){3, 3, 2, 2});
    /* Equal non-zero rates: every rank is at the mean, w = 1. */
    set_faults(p, (const double[]){5, 5, 5, 5});
    expect_shares(p, (const int64_t[]){3, 3, 2, 2});
    rk_batch_policy_free(p);
}

/* ---- throughput ---- */

static void test_throughput_shares_are_proportional_to_samples_per_second(void **state)
{
    (void)state;
    /* 100 * {1,1,2,4} / 8 = {12.5, 12.5, 25, 50}: the odd unit to rank 0 (tie). */
    rk_batch_policy *p = make(RK_BATCH_THROUGHPUT, 4, 100);
    const double tput[] = {100, 100, 200, 400};
    for (int i = 0; i < 4; i++)
        assert_int_equal(rk_batch_observe_throughput(p, i, tput[i], NULL), RK_OK);
    expect_shares(p, (const int64_t[]){13, 12, 25, 50});
    rk_batch_policy_free(p);

    /* 1000 * {3, 1} / 4 = {750, 250}. */
    p = make(RK_BATCH_THROUGHPUT, 2, 1000);
    assert_int_equal(rk_batch_observe_throughput(p, 0, 2400.0, NULL), RK_OK);
    assert_int_equal(rk_batch_observe_throughput(p, 1, 800.0, NULL), RK_OK);
    expect_shares(p, (const int64_t[]){750, 250});
    rk_batch_policy_free(p);
}

static void test_throughput_is_smoothed_with_alpha_0_3(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_THROUGHPUT, 2, 200);
    rk_batch_rank_state r;
    /* First observation is taken as is; then s += 0.3 (x - s): 100 -> 130 -> 100. */
    assert_int_equal(rk_batch_observe_throughput(p, 0, 100.0, NULL), RK_OK);
    assert_int_equal(rk_batch_rank_get(p, 0, &r, NULL), RK_OK);
    assert_true(r.throughput == 100.0 && r.observations == 1);
    assert_int_equal(rk_batch_observe_throughput(p, 0, 200.0, NULL), RK_OK);
    assert_int_equal(rk_batch_rank_get(p, 0, &r, NULL), RK_OK);
    assert_true(fabs(r.throughput - 130.0) < 1e-9);
    assert_int_equal(r.observations, 2);
    assert_int_equal(rk_batch_observe_throughput(p, 1, 70.0, NULL), RK_OK);
    /* 200 * {130, 70} / 200 = {130, 70}; unsmoothed (200 vs 70) it would be {148, 52}. */
    expect_shares(p, (const int64_t[]){130, 70});
    assert_int_equal(rk_batch_observe_throughput(p, 0, 30.0, NULL), RK_OK);
    assert_int_equal(rk_batch_rank_get(p, 0, &r, NULL), RK_OK);
    assert_true(fabs(r.throughput - 100.0) < 1e-9);
    assert_int_equal(r.observations, 3);
    /* 200 * {100, 70} / 170 = {117.6, 82.4}: floors 117 + 82, the unit to rank 0 (.65 > .35). */
    expect_shares(p, (const int64_t[]){118, 82});
    rk_batch_policy_free(p);
}

static void test_throughput_counts_unobserved_ranks_as_the_mean(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_THROUGHPUT, 4, 80);
    expect_shares(p, (const int64_t[]){20, 20, 20, 20}); /* nothing observed: even */
    assert_int_equal(rk_batch_observe_throughput(p, 0, 100.0, NULL), RK_OK);
    expect_shares(p, (const int64_t[]){20, 20, 20, 20}); /* one observed: all at its mean */
    assert_int_equal(rk_batch_observe_throughput(p, 1, 300.0, NULL), RK_OK);
    /* mean 200 for ranks 2 and 3: 80 * {100, 300, 200, 200} / 800. */
    expect_shares(p, (const int64_t[]){10, 30, 20, 20});
    rk_batch_policy_free(p);
}

static void test_raising_zero_shares_takes_from_the_largest_lowest_rank_first(void **state)
{
    (void)state;
    /* Weights {1e9,1,1,1}: floors {9,0,0,0}, the missing unit to rank 0 -> {10,0,0,0}; the
     * three zeros each take one unit from rank 0. */
    rk_batch_policy *p = make(RK_BATCH_THROUGHPUT, 4, 10);
    const double a[] = {1e9, 1, 1, 1};
    for (int i = 0; i < 4; i++)
        assert_int_equal(rk_batch_observe_throughput(p, i, a[i], NULL), RK_OK);
    expect_shares(p, (const int64_t[]){7, 1, 1, 1});
    rk_batch_policy_free(p);

    /* Weights {1e12,1e12,1e-3,1e-3,1e-3}: {5,5,0,0,0}. Three raises take from rank 0 (5 -> 4),
     * rank 1 (5 -> 4), then rank 0 again (4 -> 3). */
    p = make(RK_BATCH_THROUGHPUT, 5, 10);
    const double b[] = {1e12, 1e12, 1e-3, 1e-3, 1e-3};
    for (int i = 0; i < 5; i++)
        assert_int_equal(rk_batch_observe_throughput(p, i, b[i], NULL), RK_OK);
    expect_shares(p, (const int64_t[]){3, 4, 1, 1, 1});
    rk_batch_policy_free(p);

    /* Weights {1e-3, 1e12, 1e12, 1e12}, B = 9: {0,3,3,3}; one raise takes from rank 1. */
    p = make(RK_BATCH_THROUGHPUT, 4, 9);
    const double c[] = {1e-3, 1e12, 1e12, 1e12};
    for (int i = 0; i < 4; i++)
        assert_int_equal(rk_batch_observe_throughput(p, i, c[i], NULL), RK_OK);
    expect_shares(p, (const int64_t[]){1, 2, 3, 3});
    rk_batch_policy_free(p);
}

/* ---- property test ---- */

static double log_uniform(rk_rng *r, double lo, double hi)
{
    return lo * exp(log(hi / lo) * rk_rng_uniform(r));
}

/* A random policy of a random kind: some ranks observed (1-3 times), some faulty. */
static rk_batch_policy *random_policy(rk_rng *rng, int maxn)
{
    rk_batch_kind kind = (rk_batch_kind)rk_rng_below(rng, 3);
    int n = 1 + (int)rk_rng_below(rng, (uint64_t)maxn);
    int64_t b;
    switch (rk_rng_below(rng, 4)) {
    case 0: b = n; break;
    case 1: b = n + (int64_t)rk_rng_below(rng, 8); break;
    case 2: b = n + (int64_t)rk_rng_below(rng, 5000); break;
    default: b = n + (int64_t)rk_rng_below(rng, (uint64_t)1 << 40); break;
    }
    rk_batch_policy *p = make(kind, n, b);
    for (int i = 0; i < n; i++) {
        int obs = (int)rk_rng_below(rng, 4);
        for (int k = 0; k < obs; k++)
            assert_int_equal(rk_batch_observe_throughput(p, i, log_uniform(rng, 1.0, 1e6), NULL),
                             RK_OK);
        switch (rk_rng_below(rng, 4)) {
        case 0: break; /* fault-free */
        case 1:
            assert_int_equal(rk_batch_set_fault_rate(p, i, rk_rng_uniform(rng), NULL), RK_OK);
            break;
        case 2:
            assert_int_equal(rk_batch_set_fault_rate(p, i, log_uniform(rng, 1e-3, 1e3), NULL),
                             RK_OK);
            break;
        default: /* one hot rank: likely above 3x the mean, so clamped */
            assert_int_equal(rk_batch_set_fault_rate(p, i, 50.0 * n, NULL), RK_OK);
            break;
        }
    }
    return p;
}

/* The weights per the formulas in rekindle/batch.h, from the policy's recorded state. */
static void reference_weights(const rk_batch_policy *p, long double *w)
{
    int n = rk_batch_policy_nranks(p);
    rk_batch_rank_state r;
    long double sum = 0;
    int seen = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(rk_batch_rank_get(p, i, &r, NULL), RK_OK);
        w[i] = 1;
        if (rk_batch_policy_kind(p) == RK_BATCH_THROUGHPUT && r.observations > 0) {
            sum += r.throughput;
            seen++;
        } else if (rk_batch_policy_kind(p) == RK_BATCH_FAULT_AWARE) {
            sum += r.fault_rate;
        }
    }
    for (int i = 0; i < n; i++) {
        assert_int_equal(rk_batch_rank_get(p, i, &r, NULL), RK_OK);
        if (rk_batch_policy_kind(p) == RK_BATCH_THROUGHPUT && seen > 0)
            w[i] = r.observations > 0 ? (long double)r.throughput : sum / seen;
        if (rk_batch_policy_kind(p) == RK_BATCH_FAULT_AWARE && sum > 0) {
            long double fbar = sum / n;
            w[i] = 1 + 0.5L * (1 - r.fault_rate / fbar);
            if (w[i] < 0)
                w[i] = 0;
        }
    }
}

static void test_random_policies_sum_to_b_with_every_share_at_least_1(void **state)
{
    (void)state;
    enum { CASES = 3000, MAXR = 200 };
    rk_rng rng;
    rk_rng_seed(&rng, 20240607);
    int64_t *s = malloc(MAXR * sizeof *s), *again = malloc(MAXR * sizeof *again);
    long double *w = malloc(MAXR * sizeof *w);
    int clamped_cases = 0, raised_cases = 0;
    for (int c = 0; c < CASES; c++) {
        rk_batch_policy *p = random_policy(&rng, c % 10 == 0 ? MAXR : 12);
        int n = rk_batch_policy_nranks(p);
        int64_t b = rk_batch_policy_global_batch(p);
        assert_int_equal(rk_batch_shares(p, s, NULL), RK_OK);
        int64_t sum = 0;
        for (int i = 0; i < n; i++) {
            assert_true(s[i] >= 1);
            sum += s[i];
        }
        assert_int_equal(sum, b);

        /* Each share is its target rounded down or up (raising zeros only lowers the largest
         * shares and lifts zeros to 1), and when every target is at least 1 nothing was raised,
         * so no share is below its target's floor either. */
        reference_weights(p, w);
        long double wsum = 0;
        int zero_weight = 0;
        for (int i = 0; i < n; i++) {
            wsum += w[i];
            zero_weight += w[i] == 0;
        }
        long double tol = 1e-6L + (long double)b * n * 0x1p-50L, min_t = INFINITY;
        for (int i = 0; i < n; i++) {
            long double t = (long double)b * w[i] / wsum;
            if (t < min_t)
                min_t = t;
            if (!(s[i] < t + 1 + tol))
                printf("case %d rank %d: share %lld, target %Lf\n", c, i, (long long)s[i], t);
            assert_true(s[i] < t + 1 + tol);
        }
        if (min_t >= 1 + tol) {
            for (int i = 0; i < n; i++)
                assert_true(s[i] > (long double)b * w[i] / wsum - 1 - tol);
        } else {
            raised_cases++;
        }
        clamped_cases += zero_weight > 0;

        /* Deterministic: the same state, asked again, gives the same shares. */
        assert_int_equal(rk_batch_shares(p, again, NULL), RK_OK);
        assert_memory_equal(s, again, (size_t)n * sizeof *s);
        rk_batch_policy_free(p);
    }
    printf("%d random policies: %d with clamped ranks, %d with targets below 1\n", CASES,
           clamped_cases, raised_cases);
    assert_true(clamped_cases > 100); /* the clamp and the raising were exercised */
    assert_true(raised_cases > 100);
    free(s);
    free(again);
    free(w);
}

static void test_same_feed_gives_the_same_shares_and_state(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        rk_rng r1, r2;
        rk_rng_seed(&r1, seed);
        rk_rng_seed(&r2, seed);
        rk_batch_policy *a = random_policy(&r1, 64), *b = random_policy(&r2, 64);
        int64_t sa[64], sb[64];
        assert_int_equal(rk_batch_shares(a, sa, NULL), RK_OK);
        assert_int_equal(rk_batch_shares(b, sb, NULL), RK_OK);
        assert_memory_equal(sa, sb, (size_t)rk_batch_policy_nranks(a) * sizeof sa[0]);
        assert_same_state(a, b);
        rk_batch_policy_free(a);
        rk_batch_policy_free(b);
    }
}

/* ---- invalid arguments ---- */

static void test_bad_ranks_and_rates_are_rejected_and_change_nothing(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_THROUGHPUT, 3, 30);
    rk_err err;
    expect_err(rk_batch_observe_throughput(p, 3, 10.0, &err), RK_EINVAL, &err,
               "rank 3 is outside 0..2");
    expect_err(rk_batch_observe_throughput(p, -1, 10.0, &err), RK_EINVAL, &err, "rank -1");
    expect_err(rk_batch_set_fault_rate(p, 3, 1.0, &err), RK_EINVAL, &err, "rank 3");
    expect_err(rk_batch_set_fault_rate(p, -1, 1.0, &err), RK_EINVAL, &err, "rank -1");
    const double bad_tput[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, -5.0, 2e15};
    for (size_t i = 0; i < sizeof bad_tput / sizeof bad_tput[0]; i++)
        expect_err(rk_batch_observe_throughput(p, 1, bad_tput[i], &err), RK_EINVAL, &err,
                   "rank 1: throughput");
    const double bad_fault[] = {NAN, INFINITY, -1.0, -1e-300, 2e15};
    for (size_t i = 0; i < sizeof bad_fault / sizeof bad_fault[0]; i++)
        expect_err(rk_batch_set_fault_rate(p, 2, bad_fault[i], &err), RK_EINVAL, &err,
                   "rank 2: fault rate");
    rk_batch_rank_state r;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rk_batch_rank_get(p, i, &r, NULL), RK_OK);
        assert_true(r.throughput == 0.0 && r.observations == 0 && r.fault_rate == 0.0);
    }
    expect_err(rk_batch_rank_get(p, 3, &r, &err), RK_EINVAL, &err, "rank 3");
    expect_err(rk_batch_shares(p, NULL, &err), RK_EINVAL, &err, "NULL");
    expect_err(rk_batch_shares(NULL, (int64_t[3]){0}, &err), RK_EINVAL, &err, "NULL");
    expect_err(rk_batch_observe_throughput(NULL, 0, 1.0, &err), RK_EINVAL, &err, "NULL");
    /* The limits themselves are accepted. */
    assert_int_equal(rk_batch_observe_throughput(p, 0, RK_BATCH_MAX_RATE, NULL), RK_OK);
    assert_int_equal(rk_batch_set_fault_rate(p, 0, RK_BATCH_MAX_RATE, NULL), RK_OK);
    assert_int_equal(rk_batch_set_fault_rate(p, 0, 0.0, NULL), RK_OK);
    rk_batch_policy_free(p);
}

/* ---- resize ---- */

static void fill_distinct(rk_batch_policy *p)
{
    for (int i = 0; i < rk_batch_policy_nranks(p); i++) {
        assert_int_equal(rk_batch_observe_throughput(p, i, 100.0 * (i + 1), NULL), RK_OK);
        assert_int_equal(rk_batch_observe_throughput(p, i, 110.0 * (i + 1), NULL), RK_OK);
        assert_int_equal(rk_batch_set_fault_rate(p, i, 0.25 * i, NULL), RK_OK);
    }
}

static void test_resize_keeps_the_listed_ranks_state_in_the_new_order(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_THROUGHPUT, 5, 120);
    fill_distinct(p);
    rk_batch_rank_state old[5], r;
    for (int i = 0; i < 5; i++)
        assert_int_equal(rk_batch_rank_get(p, i, &old[i], NULL), RK_OK);

    const int keep[] = {4, 1, -1};
    rk_err err;
    assert_int_equal(rk_batch_policy_resize(p, keep, 3, &err), RK_OK);
    assert_int_equal(rk_batch_policy_nranks(p), 3);
    assert_int_equal(rk_batch_policy_global_batch(p), 120);
    assert_int_equal(rk_batch_policy_kind(p), RK_BATCH_THROUGHPUT);
    assert_int_equal(rk_batch_rank_get(p, 0, &r, NULL), RK_OK);
    assert_memory_equal(&r, &old[4], sizeof r);
    assert_int_equal(rk_batch_rank_get(p, 1, &r, NULL), RK_OK);
    assert_memory_equal(&r, &old[1], sizeof r);
    assert_int_equal(rk_batch_rank_get(p, 2, &r, NULL), RK_OK);
    assert_true(r.observations == 0 && r.throughput == 0.0 && r.fault_rate == 0.0);
    assert_int_equal(rk_batch_rank_get(p, 3, &r, &err), RK_EINVAL);
    /* Smoothed throughputs are 103 (i + 1): rank 0 = old 4 = 515, rank 1 = old 1 = 206, the
     * new rank 2 = their mean 360.5; 120 * w / 1081.5 = {57.14, 22.86, 40}. */
    expect_shares(p, (const int64_t[]){57, 23, 40});

    /* Bad lists change nothing. */
    expect_err(rk_batch_policy_resize(p, (const int[]){0, 0}, 2, &err), RK_EINVAL, &err,
               "keep[1] repeats old rank 0");
    expect_err(rk_batch_policy_resize(p, (const int[]){1, 3}, 2, &err), RK_EINVAL, &err,
               "keep[1] = 3 is neither -1 nor an old rank 0..2");
    expect_err(rk_batch_policy_resize(p, (const int[]){-2}, 1, &err), RK_EINVAL, &err,
               "keep[0] = -2");
    expect_err(rk_batch_policy_resize(p, keep, 0, &err), RK_EINVAL, &err, "nranks 0");
    expect_err(rk_batch_policy_resize(p, NULL, 2, &err), RK_EINVAL, &err, "NULL");
    rk_batch_policy_free(p);

    p = make(RK_BATCH_EVEN, 2, 3);
    expect_err(rk_batch_policy_resize(p, (const int[]){0, 1, -1, -1}, 4, &err), RK_EINVAL, &err,
               "global batch 3 is smaller than nranks 4");
    assert_int_equal(rk_batch_policy_nranks(p), 2);
    assert_int_equal(rk_batch_policy_resize(p, (const int[]){1}, 1, &err), RK_OK);
    expect_shares(p, (const int64_t[]){3});
    rk_batch_policy_free(p);
}

static void test_resize_of_fault_rates_changes_the_mean(void **state)
{
    (void)state;
    /* Dropping the faulty rank 3 of {0,0,0,4} leaves no faults: even. Keeping {3, 0}
     * gives f = {4, 0}, mean 2: w = {0.5, 1.5}, 100 * w / 2 = {25, 75}. */
    rk_batch_policy *p = make(RK_BATCH_FAULT_AWARE, 4, 100);
    set_faults(p, (const double[]){0, 0, 0, 4});
    assert_int_equal(rk_batch_policy_resize(p, (const int[]){2, 1, 0}, 3, NULL), RK_OK);
    expect_shares(p, (const int64_t[]){34, 33, 33});
    rk_batch_policy_free(p);
    p = make(RK_BATCH_FAULT_AWARE, 4, 100);
    set_faults(p, (const double[]){0, 0, 0, 4});
    assert_int_equal(rk_batch_policy_resize(p, (const int[]){3, 0}, 2, NULL), RK_OK);
    expect_shares(p, (const int64_t[]){25, 75});
    rk_batch_policy_free(p);
}

/* ---- state: one rank, and the checkpoint tensors ---- */

static rk_batch_policy *through_items(const rk_batch_policy *p)
{
    rk_batch_items it;
    rk_err err;
    assert_int_equal(rk_batch_items_fill(p, &it, &err), RK_OK);
    rk_st_file f;
    items_file(it.item, RK_BATCH_NITEMS, -1, NULL, &f);
    rk_batch_policy *q = NULL;
    if (rk_batch_load(&q, &f, &err) != RK_OK)
        fail_msg("load: %s", err.msg);
    rk_st_free(&f);
    rk_batch_items_free(&it);
    return q;
}

static void test_items_round_trip_gives_identical_shares_and_state(void **state)
{
    (void)state;
    rk_rng rng;
    rk_rng_seed(&rng, 77);
    for (int c = 0; c < 200; c++) {
        rk_batch_policy *p = random_policy(&rng, c % 20 == 0 ? 300 : 16);
        rk_batch_policy *q = through_items(p);
        int n = rk_batch_policy_nranks(p);
        assert_int_equal(rk_batch_policy_kind(q), rk_batch_policy_kind(p));
        assert_int_equal(rk_batch_policy_nranks(q), n);
        assert_int_equal(rk_batch_policy_global_batch(q), rk_batch_policy_global_batch(p));
        assert_same_state(p, q);
        int64_t *sp = malloc((size_t)n * sizeof *sp), *sq = malloc((size_t)n * sizeof *sq);
        assert_int_equal(rk_batch_shares(p, sp, NULL), RK_OK);
        assert_int_equal(rk_batch_shares(q, sq, NULL), RK_OK);
        assert_memory_equal(sp, sq, (size_t)n * sizeof *sp);
        /* Feeding both the same observation keeps them in step (the smoothing state and the
         * observation count came back). */
        assert_int_equal(rk_batch_observe_throughput(p, 0, 1234.5, NULL), RK_OK);
        assert_int_equal(rk_batch_observe_throughput(q, 0, 1234.5, NULL), RK_OK);
        assert_same_state(p, q);
        free(sp);
        free(sq);
        rk_batch_policy_free(p);
        rk_batch_policy_free(q);
    }
}

/* The tensors the header documents, with their dtypes, shapes and values. */
static void test_items_are_the_documented_tensors(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_FAULT_AWARE, 3, 64);
    assert_int_equal(rk_batch_observe_throughput(p, 1, 250.0, NULL), RK_OK);
    assert_int_equal(rk_batch_set_fault_rate(p, 2, 1.5, NULL), RK_OK);
    rk_batch_items it;
    assert_int_equal(rk_batch_items_fill(p, &it, NULL), RK_OK);
    static const char *const names[] = {"batch.kind", "batch.global_batch", "batch.throughput",
                                        "batch.observations", "batch.fault_rate"};
    static const char *const dtypes[] = {"I64", "I64", "F64", "I64", "F64"};
    for (int i = 0; i < RK_BATCH_NITEMS; i++) {
        assert_string_equal(it.item[i].name, names[i]);
        assert_string_equal(it.item[i].dtype, dtypes[i]);
        assert_int_equal(it.item[i].ndim, i < 2 ? 0 : 1);
        if (i >= 2)
            assert_int_equal(it.item[i].shape[0], 3);
    }
    assert_int_equal(*(const int64_t *)it.item[0].data, 2);
    assert_int_equal(*(const int64_t *)it.item[1].data, 64);
    const double *thr = it.item[2].data, *fr = it.item[4].data;
    const int64_t *obs = it.item[3].data;
    assert_true(thr[0] == 0 && thr[1] == 250.0 && thr[2] == 0);
    assert_true(obs[0] == 0 && obs[1] == 1 && obs[2] == 0);
    assert_true(fr[0] == 0 && fr[1] == 0 && fr[2] == 1.5);
    rk_batch_items_free(&it);
    rk_batch_items_free(&it); /* twice is safe */
    rk_batch_policy_free(p);
}

static void expect_bad_file(const rk_st_file *f, int code, const char *want)
{
    rk_batch_policy *q = (rk_batch_policy *)&q;
    rk_err err;
    expect_err(rk_batch_load(&q, f, &err), code, &err, want);
    assert_null(q);
}

static void test_load_names_each_bad_tensor(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_FAULT_AWARE, 3, 64);
    assert_int_equal(rk_batch_observe_throughput(p, 1, 250.0, NULL), RK_OK);
    assert_int_equal(rk_batch_set_fault_rate(p, 2, 1.5, NULL), RK_OK);
    rk_batch_items good;
    assert_int_equal(rk_batch_items_fill(p, &good, NULL), RK_OK);
    rk_st_file f;
    /* each tensor missing (no batch.kind: no state at all) */
    static const char *const missing[] = {"no tensor 'batch.kind'", "'batch.global_batch'",
                                          "batch.throughput is missing", "'batch.observations'",
                                          "'batch.fault_rate'"};
    for (int i = 0; i < RK_BATCH_NITEMS; i++) {
        items_file(good.item, RK_BATCH_NITEMS, i, NULL, &f);
        expect_bad_file(&f, i == 0 ? RK_ENOENT : RK_EFORMAT, missing[i]);
        rk_st_free(&f);
    }
    /* another dtype or shape */
    double d = 1;
    int64_t two[1] = {2}, v3[3] = {0, 1, 0};
    const struct {
        int skip;
        rk_st_entry e;
        const char *want;
    } wrong[] = {
        {0, {.name = "batch.kind", .data = &d, .dtype = "F64"}, "'batch.kind' is F64"},
        {1,
         {.name = "batch.global_batch", .data = v3, .ndim = 1, .shape = two, .dtype = "I64"},
         "'batch.global_batch' has shape [2]"},
        {3,
         {.name = "batch.observations", .data = v3, .ndim = 1, .shape = two, .dtype = "I64"},
         "'batch.observations' has shape [2], expected [3]"},
        {4,
         {.name = "batch.fault_rate",
          .data = v3,
          .ndim = 1,
          .shape = (int64_t[]){3},
          .dtype = "I64"},
         "'batch.fault_rate' is I64, expected F64"},
        {2,
         {.name = "batch.throughput", .data = &d, .dtype = "F64"},
         "batch.throughput is not 1-D"},
    };
    for (size_t c = 0; c < sizeof wrong / sizeof wrong[0]; c++) {
        items_file(good.item, RK_BATCH_NITEMS, wrong[c].skip, &wrong[c].e, &f);
        expect_bad_file(&f, RK_EFORMAT, wrong[c].want);
        rk_st_free(&f);
    }
    /* values the policy could not have saved */
    static const struct {
        int64_t kind, b;
        int rank;
        double thr, fr;
        int64_t obs;
        const char *want;
    } cases[] = {
        {3, 64, -1, 0, 0, 0, "batch.kind 3 is not 0, 1 or 2"},
        {-1, 64, -1, 0, 0, 0, "batch.kind -1"},
        {2, 2, -1, 0, 0, 0, "batch.global_batch 2 is smaller than the 3 ranks"},
        {2, -1, -1, 0, 0, 0, "batch.global_batch -1"},
        {2, 64, 0, 5.0, 0, 0, "rank 0: throughput 5 with no observations"},
        {2, 64, 0, -0.0, 0, 0, "rank 0: throughput -0 with no observations"},
        {2, 64, 1, NAN, 0, 1, "rank 1: throughput nan is not in (0, 1e+15]"},
        {2, 64, 1, -250.0, 0, 1, "rank 1: throughput -250"},
        {2, 64, 1, 0.0, 0, 1, "rank 1: throughput 0 is not in"},
        {2, 64, 1, 3e15, 0, 1, "rank 1: throughput 3e+15"},
        {2, 64, 2, 0, -1.5, 0, "rank 2: fault rate -1.5 is not in [0, 1e+15]"},
        {2, 64, 2, 0, INFINITY, 0, "rank 2: fault rate inf"},
        {2, 64, 2, 0, NAN, 0, "rank 2: fault rate nan"},
        {2, 64, 0, 0, 0, -1, "rank 0: observations -1 is negative"},
        {2, 64, 0, 0, 0, 1, "rank 0: throughput 0 is not in"}, /* observed, but no value */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rk_batch_items b;
        assert_int_equal(rk_batch_items_fill(p, &b, NULL), RK_OK);
        b.kind = cases[c].kind;
        b.global_batch = cases[c].b;
        if (cases[c].rank >= 0) {
            b.throughput[cases[c].rank] = cases[c].thr;
            b.fault_rate[cases[c].rank] = cases[c].fr;
            b.observations[cases[c].rank] = cases[c].obs;
        }
        items_file(b.item, RK_BATCH_NITEMS, -1, NULL, &f);
        expect_bad_file(&f, RK_EFORMAT, cases[c].want);
        rk_st_free(&f);
        rk_batch_items_free(&b);
    }
    /* the binary blob of earlier versions is refused, by name */
    uint8_t blob[112] = "RKBATCH";
    rk_st_entry old = {
        .name = "policy", .data = blob, .ndim = 1, .shape = (int64_t[]){112}, .dtype = "U8"};
    items_file(good.item, RK_BATCH_NITEMS, 0, &old, &f);
    expect_bad_file(&f, RK_EFORMAT, "tensor 'policy' holds the batch policy in the binary layout");
    rk_st_free(&f);
    /* the untouched items still load */
    items_file(good.item, RK_BATCH_NITEMS, -1, NULL, &f);
    rk_batch_policy *q = NULL;
    assert_int_equal(rk_batch_load(&q, &f, NULL), RK_OK);
    assert_same_state(p, q);
    rk_batch_policy_free(q);
    rk_err err;
    expect_err(rk_batch_load(&q, NULL, &err), RK_EINVAL, &err, "NULL");
    expect_err(rk_batch_load(NULL, &f, &err), RK_EINVAL, &err, "NULL");
    rk_st_free(&f);
    rk_batch_items_free(&good);
    rk_batch_policy_free(p);
}

static void test_rank_set_restores_exactly_and_refuses_what_could_not_be(void **state)
{
    (void)state;
    rk_batch_policy *p = make(RK_BATCH_THROUGHPUT, 2, 10);
    rk_batch_rank_state st = {.throughput = 123.25, .observations = 7, .fault_rate = 0.5}, got;
    assert_int_equal(rk_batch_rank_set(p, 1, &st, NULL), RK_OK);
    assert_int_equal(rk_batch_rank_get(p, 1, &got, NULL), RK_OK);
    assert_memory_equal(&st, &got, sizeof st);
    rk_err err;
    const rk_batch_rank_state bad[] = {{.throughput = 1, .observations = 0},
                                       {.throughput = 0, .observations = 3},
                                       {.throughput = NAN, .observations = 3},
                                       {.throughput = 1, .observations = 1, .fault_rate = -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        expect_err(rk_batch_rank_set(p, 1, &bad[i], &err), RK_EINVAL, &err, "rank 1:");
        assert_int_equal(rk_batch_rank_get(p, 1, &got, NULL), RK_OK);
        assert_memory_equal(&st, &got, sizeof st); /* unchanged */
    }
    expect_err(rk_batch_rank_set(p, 2, &st, &err), RK_EINVAL, &err, "rank");
    expect_err(rk_batch_rank_set(p, 0, NULL, &err), RK_EINVAL, &err, "NULL");
    rk_batch_policy_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_names_parse_and_print_back),
        cmocka_unit_test(test_create_rejects_no_ranks_and_batch_below_ranks),
        cmocka_unit_test(test_even_split_gives_the_remainder_to_the_lowest_ranks),
        cmocka_unit_test(test_even_ignores_throughput_and_fault_rates),
        cmocka_unit_test(test_fault_aware_formula_on_hand_computed_rates),
        cmocka_unit_test(test_fault_aware_clamps_ranks_above_three_times_the_mean),
        cmocka_unit_test(test_fault_aware_without_faults_is_even),
        cmocka_unit_test(test_throughput_shares_are_proportional_to_samples_per_second),
        cmocka_unit_test(test_throughput_is_smoothed_with_alpha_0_3),
        cmocka_unit_test(test_throughput_counts_unobserved_ranks_as_the_mean),
        cmocka_unit_test(test_raising_zero_shares_takes_from_the_largest_lowest_rank_first),
        cmocka_unit_test(test_random_policies_sum_to_b_with_every_share_at_least_1),
        cmocka_unit_test(test_same_feed_gives_the_same_shares_and_state),
        cmocka_unit_test(test_bad_ranks_and_rates_are_rejected_and_change_nothing),
        cmocka_unit_test(test_resize_keeps_the_listed_ranks_state_in_the_new_order),
        cmocka_unit_test(test_resize_of_fault_rates_changes_the_mean),
        cmocka_unit_test(test_items_round_trip_gives_identical_shares_and_state),
        cmocka_unit_test(test_items_are_the_documented_tensors),
        cmocka_unit_test(test_load_names_each_bad_tensor),
        cmocka_unit_test(test_rank_set_restores_exactly_and_refuses_what_could_not_be),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
