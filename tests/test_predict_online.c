/*
 * Tests for live failure prediction (predict/predict_online.h): a GPU's probability is -1
 * until T minutes were seen, and then exactly rk_pred_predict of the window of its last T
 * minute rows made by hand with rk_fleet_features (oldest first, each row's counters against
 * the previous minute's reading, the first row ever against none), also after the ring
 * wrapped; a window in the wrong order or with the oldest row's counters not taken against
 * their previous minute gives another probability (so the comparison can fail); readings
 * within a minute after its first are ignored; a gap of minutes adds one row; a failed read
 * is ignored; a lost reading resets the window; GPUs are independent; a bad index, a time
 * going back a minute, a non-finite or negative time are refused and change nothing; a
 * regression model or another feature count is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "predict/fleetdata.h"
#include "predict/predict.h"
#include "predict/predict_online.h"
#include "rekindle/health.h"
#include "rekindle/rng.h"

enum { T = 6, F = RK_FLEET_FEATURES, NMIN = 40 };

/* The reading of a worn GPU at minute m (deterministic in seed and m): every feature the
 * model reads is valid, counters climb by a varying amount each minute. */
static rk_gpu_sample reading(uint64_t seed, int m, double t)
{
    rk_rng r;
    rk_rng_derive(&r, seed, (uint64_t)m, 0);
    rk_gpu_sample s;
    memset(&s, 0, sizeof s);
    s.t = t;
    s.temp_c = 60 + 0.4 * m + 3 * rk_rng_normal(&r);
    s.fan_pct = 50 + 10 * rk_rng_normal(&r);
    s.power_w = 150 + 20 * rk_rng_normal(&r);
    s.sm_mhz = 1500 + 50 * rk_rng_normal(&r);
    s.util_pct = 90 + 5 * rk_rng_normal(&r);
    s.clock_reasons = (m % 5 == 0) ? RK_CLOCK_HW_THERMAL : 0;
    s.ecc_corrected = 100 + (uint64_t)(m * m) + rk_rng_below(&r, 7);
    s.ecc_uncorrected = (uint64_t)m / 9;
    s.pcie_replay = 1000 + 13 * (uint64_t)m + rk_rng_below(&r, 30);
    s.xid_count = (uint64_t)m / 4;
    s.vrm_ripple_mv = 40 + m + 5 * rk_rng_normal(&r);
    s.fan_vib_hz = 200 + 4 * m + 10 * rk_rng_normal(&r);
    const rk_field fs[] = {
        RK_F_TEMP,        RK_F_FAN,           RK_F_POWER,         RK_F_SM_CLOCK,
        RK_F_UTIL,        RK_F_CLOCK_REASONS, RK_F_ECC_CORRECTED, RK_F_ECC_UNCORRECTED,
        RK_F_PCIE_REPLAY, RK_F_XID,           RK_F_VRM_RIPPLE,    RK_F_FAN_VIB};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
        rk_field_set(&s, fs[i]);
    return s;
}

/* Feature rows of minutes 0..n-1 of a GPU, as the dataset makes them. */
static void rows_of(uint64_t seed, int n, float *rows)
{
    rk_gpu_sample prev = {0};
    for (int m = 0; m < n; m++) {
        rk_gpu_sample s = reading(seed, m, 60.0 * m);
        uint8_t v[F];
        rk_fleet_features(&s, m ? &prev : NULL, rows + (size_t)m * F, v);
        for (int j = 0; j < F; j++)
            assert_int_equal(v[j], 1);
        prev = s;
    }
}

/* A classification model over T minutes of the 12 features, normalised on rows like the
 * readings', with weights larger than at initialisation so that windows differ visibly. */
static rk_pred_model *model(void)
{
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    c.window = T;
    c.features = F;
    c.hidden = 8;
    c.attn = 4;
    c.dense = 4;
    c.seed = 3;
    rk_pred_model *m = NULL;
    rk_err err = {0};
    assert_int_equal(rk_pred_create(&m, &c, &err), RK_OK);
    float rows[NMIN * F];
    rows_of(77, NMIN, rows);
    float x[(NMIN - T + 1) * T * F], y[NMIN - T + 1];
    for (int k = 0; k + T <= NMIN; k++) {
        memcpy(x + (size_t)k * T * F, rows + (size_t)k * F, sizeof(float) * T * F);
        y[k] = (float)(k % 2);
    }
    rk_pred_data d = {NMIN - T + 1, x, y};
    assert_int_equal(rk_pred_fit_norm(m, &d, &err), RK_OK);
    return m;
}

static float predict_window(const rk_pred_model *m, const float *w)
{
    float p = -1;
    rk_err err = {0};
    assert_int_equal(rk_pred_predict(m, w, 1, &p, &err), RK_OK);
    return p;
}

/* -1 until T minutes, then the probability of the hand-made window of the last T rows, minute
 * after minute while the ring wraps several times. */
static void test_matches_hand_window(void **state)
{
    (void)state;
    rk_pred_model *m = model();
    rk_pred_online *o = NULL;
    rk_err err = {0};
    assert_int_equal(rk_pred_online_create(&o, m, 2, &err), RK_OK);
    float rows[NMIN * F];
    rows_of(5, NMIN, rows);
    int distinct = 0;
    double last = -1;
    for (int k = 0; k < NMIN; k++) {
        rk_gpu_sample s = reading(5, k, 60.0 * k);
        assert_int_equal(rk_pred_online_push(o, 0, 60.0 * k, &s, &err), 1);
        assert_int_equal(rk_pred_online_minutes(o, 0), k + 1 < T ? k + 1 : T);
        double p = rk_pred_online_prob(o, 0);
        if (k + 1 < T) {
            assert_true(p == -1.0);
            continue;
        }
        assert_true(p >= 0 && p <= 1);
        float want = predict_window(m, rows + (size_t)(k + 1 - T) * F);
        assert_true((float)p == want);
        distinct += p != last;
        last = p;
        assert_true(rk_pred_online_prob(o, 1) == -1.0); /* the other GPU saw nothing */
        assert_int_equal(rk_pred_online_minutes(o, 1), 0);
    }
    assert_true(distinct > (NMIN - T) / 2); /* the windows really differ */

    /* what the comparison would catch: the last window newest first, or with its oldest
     * row's counters taken against nothing instead of the minute before it */
    float rev[T * F], fresh[T * F];
    for (int t = 0; t < T; t++)
        memcpy(rev + (size_t)t * F, rows + (size_t)(NMIN - 1 - t) * F, sizeof(float) * F);
    memcpy(fresh, rows + (size_t)(NMIN - T) * F, sizeof fresh);
    rk_gpu_sample oldest = reading(5, NMIN - T, 60.0 * (NMIN - T));
    uint8_t v[F];
    rk_fleet_features(&oldest, NULL, fresh, v);
    assert_true((float)last != predict_window(m, rev));
    assert_true((float)last != predict_window(m, fresh));
    rk_pred_online_free(o);
    rk_pred_free(m);
}

/* Readings after a minute's first are ignored, whatever they say; the first of the next minute
 * counts, however late in it. */
static void test_same_minute_ignored(void **state)
{
    (void)state;
    rk_pred_model *m = model();
    rk_pred_online *o = NULL;
    rk_err err = {0};
    assert_int_equal(rk_pred_online_create(&o, m, 1, &err), RK_OK);
    float rows[NMIN * F];
    rows_of(9, NMIN, rows);
    for (int k = 0; k < T + 3; k++) {
        double t0 = 60.0 * k + (k % 3) * 19.5; /* anywhere in the minute */
        rk_gpu_sample s = reading(9, k, t0);
        assert_int_equal(rk_pred_online_push(o, 0, t0, &s, &err), 1);
        double p = rk_pred_online_prob(o, 0);
        for (double t = t0 + 1; t < 60.0 * (k + 1); t += 7.25) {
            rk_gpu_sample other = reading(1000 + (uint64_t)k, k, t); /* other values */
            assert_int_equal(rk_pred_online_push(o, 0, t, &other, &err), 0);
            assert_true(rk_pred_online_prob(o, 0) == p);
        }
        assert_int_equal(rk_pred_online_minutes(o, 0), k + 1 < T ? k + 1 : T);
    }
    assert_true((float)rk_pred_online_prob(o, 0) == predict_window(m, rows + 3 * F));
    rk_pred_online_free(o);
    rk_pred_free(m);
}

/* A gap of several minutes adds one row; a failed read adds nothing. */
static void test_gap_and_failed_read(void **state)
{
    (void)state;
    rk_pred_model *m = model();
    rk_pred_online *o = NULL;
    rk_err err = {0};
    assert_int_equal(rk_pred_online_create(&o, m, 1, &err), RK_OK);
    rk_gpu_sample s = reading(2, 0, 0);
    assert_int_equal(rk_pred_online_push(o, 0, 0, &s, &err), 1);
    s = reading(2, 1, 600);
    assert_int_equal(rk_pred_online_push(o, 0, 600, &s, &err), 1); /* ten minutes later */
    assert_int_equal(rk_pred_online_minutes(o, 0), 2);
    rk_gpu_sample failed = {0};
    failed.t = 700;
    assert_int_equal(rk_pred_online_push(o, 0, 700, &failed, &err), 0);
    assert_int_equal(rk_pred_online_minutes(o, 0), 2);
    rk_pred_online_free(o);
    rk_pred_free(m);
}

/* A lost reading empties the window: -1 again, and T fresh minutes are needed, the first one
 * with no previous reading for its counters. */
static void test_lost_resets(void **state)
{
    (void)state;
    rk_pred_model *m = model();
    rk_pred_online *o = NULL;
    rk_err err = {0};
    assert_int_equal(rk_pred_online_create(&o, m, 3, &err), RK_OK);
    for (int k = 0; k < T + 2; k++) {
        rk_gpu_sample s = reading(4, k, 60.0 * k);
        assert_int_equal(rk_pred_online_push(o, 1, 60.0 * k, &s, &err), 1);
    }
    assert_true(rk_pred_online_prob(o, 1) >= 0);
    rk_gpu_sample lost = {0};
    lost.lost = true;
    lost.t = 60.0 * (T + 2) + 5;
    assert_int_equal(rk_pred_online_push(o, 1, lost.t, &lost, &err), 0);
    assert_true(rk_pred_online_prob(o, 1) == -1.0);
    assert_int_equal(rk_pred_online_minutes(o, 1), 0);

    /* it comes back: minutes k0.. are a new history */
    int k0 = T + 3;
    float rows[T * F];
    rk_gpu_sample prev = {0};
    for (int k = 0; k < T; k++) {
        rk_gpu_sample s = reading(4, k0 + k, 60.0 * (k0 + k));
        uint8_t v[F];
        rk_fleet_features(&s, k ? &prev : NULL, rows + (size_t)k * F, v);
        prev = s;
        assert_int_equal(rk_pred_online_push(o, 1, s.t, &s, &err), 1);
        assert_true(k + 1 == T || rk_pred_online_prob(o, 1) == -1.0);
    }
    assert_true((float)rk_pred_online_prob(o, 1) == predict_window(m, rows));
    rk_pred_online_free(o);
    rk_pred_free(m);
}

/* Bad index and times are refused with a message and change nothing. */
static void test_refusals(void **state)
{
    (void)state;
    rk_pred_model *m = model();
    rk_pred_online *o = NULL;
    rk_err err = {0};
    assert_int_equal(rk_pred_online_create(&o, m, 2, &err), RK_OK);
    rk_gpu_sample s = reading(6, 3, 200);
    assert_int_equal(rk_pred_online_push(o, -1, 200, &s, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "GPU -1"));
    assert_int_equal(rk_pred_online_push(o, 2, 200, &s, &err), RK_EINVAL);
    assert_int_equal(rk_pred_online_push(o, 0, NAN, &s, &err), RK_EINVAL);
    assert_int_equal(rk_pred_online_push(o, 0, INFINITY, &s, &err), RK_EINVAL);
    assert_int_equal(rk_pred_online_push(o, 0, -1, &s, &err), RK_EINVAL);
    assert_int_equal(rk_pred_online_minutes(o, 0), 0);
    assert_int_equal(rk_pred_online_push(o, 0, 200, &s, &err), 1); /* minute 3 */
    memset(&err, 0, sizeof err);
    assert_int_equal(rk_pred_online_push(o, 0, 179.9, &s, &err), RK_EINVAL); /* minute 2 */
    assert_non_null(strstr(err.msg, "minute"));
    assert_int_equal(rk_pred_online_minutes(o, 0), 1);
    assert_int_equal(rk_pred_online_push(o, 0, 180, &s, &err), 0); /* minute 3 again */
    assert_true(rk_pred_online_prob(o, -1) == -1.0);
    assert_true(rk_pred_online_prob(o, 2) == -1.0);
    assert_int_equal(rk_pred_online_minutes(o, 7), 0);
    rk_pred_online_free(o);
    assert_int_equal(rk_pred_online_create(&o, m, 0, &err), RK_EINVAL);
    assert_null(o);
    rk_pred_free(m);

    /* models it cannot feed */
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    c.window = T;
    c.features = F;
    c.hidden = c.attn = c.dense = 4;
    c.task = RK_PRED_REGRESS;
    assert_int_equal(rk_pred_create(&m, &c, &err), RK_OK);
    assert_int_equal(rk_pred_online_create(&o, m, 1, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "regression"));
    assert_null(o);
    rk_pred_free(m);
    c.task = RK_PRED_CLASSIFY;
    c.features = F + 2;
    assert_int_equal(rk_pred_create(&m, &c, &err), RK_OK);
    assert_int_equal(rk_pred_online_create(&o, m, 1, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "14 features"));
    assert_null(o);
    rk_pred_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_hand_window),
        cmocka_unit_test(test_same_minute_ignored),
        cmocka_unit_test(test_gap_and_failed_read),
        cmocka_unit_test(test_lost_resets),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
