/*
 * Step guards (rekindle/guard.h): the loss spike z-score on hand-made series (a spike trips,
 * ordinary noise and a slow drift do not, nothing trips before the window is full, NaN
 * always trips), gradient-norm outliers at n = 1, 2, 3, 4 (a flipped exponent bit stands out,
 * a 2x spread does not, skipped ranks are skipped), and the replica hash vote (minority named,
 * root is a majority rank, ties and strictness).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "rekindle/guard.h"
#include "rekindle/rng.h"

static void spike_trips_on_a_spike_only(void **state)
{
    (void)state;
    rk_spike s;
    rk_err err;
    assert_int_equal(rk_spike_init(&s, 32, RK_SPIKE_Z_DEFAULT, &err), RK_OK);
    rk_rng r;
    rk_rng_seed(&r, 3);
    double z;
    /* before the window is full nothing is a spike, however large */
    for (int i = 0; i < 31; i++) {
        assert_false(rk_spike_test(&s, 100.0, &z));
        rk_spike_push(&s, 0.5 + 0.02 * rk_rng_normal(&r));
    }
    rk_spike_push(&s, 0.5);
    /* noise of the same size as the window's never trips in 1000 draws */
    for (int i = 0; i < 1000; i++) {
        double l = 0.5 + 0.02 * rk_rng_normal(&r);
        assert_false(rk_spike_test(&s, l, &z));
    }
    /* a jump to 3x the loss does, with a large z */
    assert_true(rk_spike_test(&s, 1.5, &z));
    assert_true(z > 20);
    /* a drop never does */
    assert_false(rk_spike_test(&s, 0.01, &z));
    /* non-finite always does */
    assert_true(rk_spike_test(&s, NAN, NULL));
    assert_true(rk_spike_test(&s, INFINITY, NULL));
    rk_spike_free(&s);
}

static void spike_follows_a_slow_drift(void **state)
{
    (void)state;
    rk_spike s;
    assert_int_equal(rk_spike_init(&s, 16, RK_SPIKE_Z_DEFAULT, NULL), RK_OK);
    /* a loss falling smoothly by 0.2% a step, the way training goes, never trips */
    double l = 2.3;
    for (int i = 0; i < 2000; i++) {
        assert_false(rk_spike_test(&s, l, NULL));
        rk_spike_push(&s, l);
        l *= 0.998;
    }
    /* a flat stretch (MAD 0) does not make a 1% wiggle a spike: the MAD floor */
    rk_spike_reset(&s);
    for (int i = 0; i < 16; i++)
        rk_spike_push(&s, 0.25);
    assert_false(rk_spike_test(&s, 0.2525, NULL));
    assert_true(rk_spike_test(&s, 0.5, NULL));
    rk_spike_free(&s);
}

static void spike_rejects_bad_settings(void **state)
{
    (void)state;
    rk_spike s;
    rk_err err;
    assert_int_equal(rk_spike_init(&s, 2, 6, &err), RK_EINVAL);
    assert_int_equal(rk_spike_init(&s, 32, 0, &err), RK_EINVAL);
    assert_int_equal(rk_spike_init(&s, 32, NAN, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "loss spike guard"));
}

static void outliers_by_rank_count(void **state)
{
    (void)state;
    unsigned char f[4];
    /* one rank: only non-finite */
    double one[1] = {1e30};
    assert_int_equal(rk_guard_outliers(one, 1, 50, f), 0);
    one[0] = NAN;
    assert_int_equal(rk_guard_outliers(one, 1, 50, f), 1);
    /* two ranks: a 2x spread is normal, a flipped exponent bit (x 2^64) is not, and the
     * larger one is named */
    double two[2] = {0.8, 1.6};
    assert_int_equal(rk_guard_outliers(two, 2, 50, f), 0);
    two[0] = 0.8 * 18446744073709551616.0;
    assert_int_equal(rk_guard_outliers(two, 2, 50, f), 1);
    assert_int_equal(f[0], 1);
    assert_int_equal(f[1], 0);
    /* four ranks: the odd one out by the median */
    double four[4] = {1.0, 1.3, 0.7, 1e12};
    assert_int_equal(rk_guard_outliers(four, 4, 50, f), 1);
    assert_memory_equal(f, ((unsigned char[]){0, 0, 0, 1}), 4);
    four[3] = INFINITY;
    assert_int_equal(rk_guard_outliers(four, 4, 50, f), 1);
    assert_int_equal(f[3], 1);
    /* a rank without samples (negative) is skipped: three usable, none off */
    double skip[4] = {1.0, -1.0, 1.2, 0.9};
    assert_int_equal(rk_guard_outliers(skip, 4, 50, f), 0);
    /* three ranks, all ordinary */
    double three[3] = {0.5, 2.0, 1.0};
    assert_int_equal(rk_guard_outliers(three, 3, 50, f), 0);
}

static void vote_names_the_minority(void **state)
{
    (void)state;
    unsigned char f[5];
    int root = -1, strict = -1;
    uint64_t same[4] = {7, 7, 7, 7};
    assert_int_equal(rk_guard_vote(same, 4, &root, f, &strict), 0);
    assert_int_equal(root, 0);
    assert_int_equal(strict, 1);
    uint64_t one_off[4] = {7, 7, 7, 9};
    assert_int_equal(rk_guard_vote(one_off, 4, &root, f, &strict), 1);
    assert_memory_equal(f, ((unsigned char[]){0, 0, 0, 1}), 4);
    assert_int_equal(root, 0);
    assert_int_equal(strict, 1);
    /* rank 0 in the minority: root is the lowest majority rank */
    uint64_t zero_off[5] = {1, 5, 5, 5, 5};
    assert_int_equal(rk_guard_vote(zero_off, 5, &root, f, &strict), 1);
    assert_int_equal(root, 1);
    assert_int_equal(f[0], 1);
    /* two ranks that disagree: no strict majority, rank 0's hash wins the tie */
    uint64_t split[2] = {3, 4};
    assert_int_equal(rk_guard_vote(split, 2, &root, f, &strict), 1);
    assert_int_equal(root, 0);
    assert_int_equal(strict, 0);
    assert_int_equal(f[1], 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spike_trips_on_a_spike_only), cmocka_unit_test(spike_follows_a_slow_drift),
        cmocka_unit_test(spike_rejects_bad_settings),  cmocka_unit_test(outliers_by_rank_count),
        cmocka_unit_test(vote_names_the_minority),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
