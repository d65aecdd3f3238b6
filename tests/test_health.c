/*
 * The health score and signals (rekindle/health.h, docs/health.md) on hand-made samples: a
 * healthy card scores 100 with no finding; each rule fires at its threshold and not below it,
 * with its code, severity and penalty; absent fields never count as zero; a lost GPU scores
 * 0; findings come worst first; dT/dt is the least-squares slope; rates come from counter
 * differences; an idle GPU's lower link generation is not downtraining but fewer lanes are;
 * replay limits scale with the link; the failure predictor's probability, when given, takes
 * graded points off and, at 0.5 or more, takes the score below the threshold.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "rekindle/health.h"

/* A healthy busy GTX 1070 Ti-like reading: every field but ECC, VRM ripple, vibration. */
static rk_gpu_sample healthy(double t)
{
    rk_gpu_sample s = {0};
    s.t = t;
    s.temp_c = 65;
    s.fan_pct = 55;
    s.power_w = 150;
    s.power_limit_w = 180;
    s.sm_mhz = 1607;
    s.mem_mhz = 4004;
    s.util_pct = 97;
    s.mem_used_bytes = 6ull << 30;
    s.mem_total_bytes = 8ull << 30;
    s.pcie_gen = 3;
    s.pcie_width = 16;
    s.pcie_gen_max = 3;
    s.pcie_width_max = 16;
    s.pcie_replay = 10;
    s.energy_j = 1e6;
    rk_field f[] = {RK_F_TEMP,          RK_F_FAN,
                    RK_F_POWER,         RK_F_POWER_LIMIT,
                    RK_F_SM_CLOCK,      RK_F_MEM_CLOCK,
                    RK_F_CLOCK_REASONS, RK_F_UTIL,
                    RK_F_MEM_USED,      RK_F_MEM_TOTAL,
                    RK_F_PCIE_GEN,      RK_F_PCIE_WIDTH,
                    RK_F_PCIE_GEN_MAX,  RK_F_PCIE_WIDTH_MAX,
                    RK_F_PCIE_REPLAY,   RK_F_ENERGY};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        rk_field_set(&s, f[i]);
    return s;
}

/* Score one sample, its signals from a history of just that sample. */
static int score1(const rk_gpu_sample *s, rk_finding *f, int *n)
{
    rk_gpu_history h;
    assert_int_equal(rk_history_init(&h, 4, NULL), RK_OK);
    rk_history_push(&h, s);
    rk_gpu_signals g;
    rk_signals_compute(&h, &g);
    rk_history_free(&h);
    return rk_health_score(s, &g, f, n);
}

static const rk_finding *find(const rk_finding *f, int n, const char *code)
{
    for (int i = 0; i < n; i++)
        if (strcmp(f[i].code, code) == 0)
            return &f[i];
    return NULL;
}

static void healthy_card_scores_100(void **state)
{
    (void)state;
    rk_gpu_sample s = healthy(0);
    rk_finding f[RK_MAX_FINDINGS];
    int n = -1;
    assert_int_equal(score1(&s, f, &n), 100);
    assert_int_equal(n, 0);
}

static void each_rule_at_its_threshold(void **state)
{
    (void)state;
    rk_finding f[RK_MAX_FINDINGS];
    int n;
    /* temperature: 82.9 nothing, 83 warn 20, 90 crit 40 */
    rk_gpu_sample s = healthy(0);
    s.temp_c = 82.9;
    assert_int_equal(score1(&s, f, &n), 100);
    s.temp_c = 83;
    assert_int_equal(score1(&s, f, &n), 80);
    assert_non_null(find(f, n, "thermal_high"));
    s.temp_c = 90;
    assert_int_equal(score1(&s, f, &n), 60);
    assert_int_equal(f[0].severity, RK_SEV_CRIT);
    assert_string_equal(f[0].code, "thermal_critical");
    assert_null(find(f, n, "thermal_high")); /* only the worse level */
    /* fan vibration, from a textfile sensor */
    s = healthy(0);
    s.fan_vib_hz = 250;
    rk_field_set(&s, RK_F_FAN_VIB);
    assert_int_equal(score1(&s, f, &n), 100);
    s.fan_vib_hz = 251;
    assert_int_equal(score1(&s, f, &n), 85);
    s.fan_vib_hz = 401;
    assert_int_equal(score1(&s, f, &n), 70);
    assert_string_equal(f[0].action, "replace the fan now");
    /* VRM ripple */
    s = healthy(0);
    s.vrm_ripple_mv = 51;
    rk_field_set(&s, RK_F_VRM_RIPPLE);
    assert_int_equal(score1(&s, f, &n), 85);
    s.vrm_ripple_mv = 101;
    assert_int_equal(score1(&s, f, &n), 65);
    /* memory: uncorrected ECC, retired pages and pending, remapped rows */
    s = healthy(0);
    s.ecc_uncorrected = 1;
    s.retired_pages = 15;
    s.retired_pending = 1;
    s.remapped_rows = 2;
    rk_field_set(&s, RK_F_ECC_UNCORRECTED);
    rk_field_set(&s, RK_F_RETIRED);
    rk_field_set(&s, RK_F_RETIRED_PENDING);
    rk_field_set(&s, RK_F_REMAPPED);
    assert_int_equal(score1(&s, f, &n), 100 - 30 - 10 - 15 - 5);
    assert_string_equal(f[0].code, "ecc_uncorrected"); /* worst first */
    assert_string_equal(f[n - 1].code, "remapped_rows");
    s.retired_pages = 60;
    score1(&s, f, &n);
    assert_int_equal(find(f, n, "retired_pages")->penalty, 25);
    /* a critical Xid; a non-critical one (13, an application fault) costs nothing */
    s = healthy(0);
    s.xid_count = 1;
    s.last_xid = 13;
    rk_field_set(&s, RK_F_XID);
    assert_int_equal(score1(&s, f, &n), 100);
    s.last_xid = 79;
    assert_int_equal(score1(&s, f, &n), 100 - RK_HEALTH_XID_CRIT_PENALTY);
    assert_true(100 - RK_HEALTH_XID_CRIT_PENALTY < RK_HEALTH_THRESHOLD_DEFAULT);
    /* throttling reasons */
    s = healthy(0);
    s.clock_reasons = RK_CLOCK_HW_THERMAL | RK_CLOCK_HW_SLOWDOWN;
    assert_int_equal(score1(&s, f, &n), 100 - 10 - 15);
    s.clock_reasons = RK_CLOCK_SW_POWER_CAP;
    assert_int_equal(score1(&s, f, &n), 100);
    assert_non_null(find(f, n, "power_capped")); /* info, no points */
}

static void absent_fields_never_count(void **state)
{
    (void)state;
    /* a card with nothing but a temperature: no rule about the rest fires */
    rk_gpu_sample s = {0};
    s.temp_c = 60;
    rk_field_set(&s, RK_F_TEMP);
    rk_finding f[RK_MAX_FINDINGS];
    int n;
    assert_int_equal(score1(&s, f, &n), 100);
    /* large values in fields marked absent are ignored */
    s.ecc_uncorrected = 99;
    s.vrm_ripple_mv = 500;
    s.fan_vib_hz = 900;
    s.pcie_width = 1;
    s.pcie_width_max = 16;
    assert_int_equal(score1(&s, f, &n), 100);
}

static void lost_gpu_scores_zero(void **state)
{
    (void)state;
    rk_gpu_sample s = {0};
    s.lost = true;
    rk_finding f[RK_MAX_FINDINGS];
    int n;
    assert_int_equal(score1(&s, f, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(f[0].code, "gpu_lost");
}

static void dtdt_is_the_least_squares_slope(void **state)
{
    (void)state;
    rk_gpu_history h;
    assert_int_equal(rk_history_init(&h, 8, NULL), RK_OK);
    /* 20 C/min = 1/3 C/s, with +-0.5 C of alternating noise around the line */
    for (int k = 0; k < 8; k++) {
        rk_gpu_sample s = healthy(1000.0 + 10.0 * k);
        s.temp_c = 50.0 + (10.0 * k) / 3.0 + (k % 2 ? 0.5 : -0.5);
        rk_history_push(&h, &s);
    }
    rk_gpu_signals g;
    rk_signals_compute(&h, &g);
    assert_true(g.dtdt_valid);
    assert_true(fabs(g.dtdt_c_per_min - 20.0) < 0.6);
    rk_finding f[RK_MAX_FINDINGS];
    int n;
    rk_gpu_sample last = h.s[(h.next + h.cap - 1) % h.cap];
    int sc = rk_health_score(&last, &g, f, &n);
    assert_non_null(find(f, n, "thermal_paste"));
    assert_int_equal(sc, 85);
    /* the ring keeps the last 8: 20 more flat readings make the slope 0 */
    for (int k = 0; k < 20; k++) {
        rk_gpu_sample s = healthy(2000.0 + k);
        rk_history_push(&h, &s);
    }
    rk_signals_compute(&h, &g);
    assert_true(fabs(g.dtdt_c_per_min) < 1e-9);
    rk_history_free(&h);
}

static void rates_and_links(void **state)
{
    (void)state;
    rk_gpu_history h;
    assert_int_equal(rk_history_init(&h, 16, NULL), RK_OK);
    /* over 10 minutes: 30 corrected ECC errors (3/min = 180/h), 100 replays (10/min) */
    for (int k = 0; k <= 10; k++) {
        rk_gpu_sample s = healthy(60.0 * k);
        s.ecc_corrected = 3u * (unsigned)k;
        rk_field_set(&s, RK_F_ECC_CORRECTED);
        s.pcie_replay = 10u * (unsigned)k;
        rk_history_push(&h, &s);
    }
    rk_gpu_signals g;
    rk_signals_compute(&h, &g);
    assert_true(g.ecc_rate_valid && fabs(g.ecc_corrected_per_h - 180) < 1e-9);
    assert_true(g.replay_rate_valid && fabs(g.replay_per_min - 10) < 1e-9);
    assert_true(fabs(g.replay_limit_per_min - 8) < 1e-9); /* Gen3 x16: DCGM's 8 */
    assert_false(g.downtrained);
    rk_history_free(&h);
    /* Gen1 x8: the limit scales with bandwidth: 8 * (2.5*8)/(8*16) = 1.25 */
    assert_int_equal(rk_history_init(&h, 4, NULL), RK_OK);
    rk_gpu_sample s = healthy(0);
    s.pcie_gen = 1;
    s.pcie_width = 8;
    rk_history_push(&h, &s);
    rk_signals_compute(&h, &g);
    assert_true(fabs(g.replay_limit_per_min - 1.25) < 1e-9);
    assert_true(g.downtrained); /* x8 of x16, and Gen1 while busy */
    /* idle at Gen1 x16: power saving, not a fault */
    s.pcie_width = 16;
    s.util_pct = 0;
    rk_history_free(&h);
    assert_int_equal(rk_history_init(&h, 4, NULL), RK_OK);
    rk_history_push(&h, &s);
    rk_signals_compute(&h, &g);
    assert_false(g.downtrained);
    rk_history_free(&h);
}

/* The failure predictor's probability: unknown changes nothing; below 0.2 nothing; 0.2..0.5
 * a graded warning of round(50 p) points that keeps a healthy card above the threshold; 0.5
 * or more a critical finding that takes it below; a value outside [0, 1] is ignored; a lost
 * GPU still scores 0 with its one finding. */
/* The Xid table: per-code counts from the kernel log; critical codes fail the GPU, the memory
 * codes that warn cost a little, application errors nothing; one finding per severity. */
static void xid_table(void **state)
{
    (void)state;
    rk_finding f[RK_MAX_FINDINGS];
    int n;
    rk_gpu_sample s = healthy(0);
    rk_field_set(&s, RK_F_XID);
    assert_int_equal(score1(&s, f, &n), 100); /* read, none */
    const struct {
        int xid, sev;
    } table[] = {{79, RK_SEV_CRIT}, {48, RK_SEV_CRIT}, {95, RK_SEV_CRIT}, {63, RK_SEV_WARN},
                 {64, RK_SEV_WARN}, {94, RK_SEV_WARN}, {13, RK_SEV_INFO}, {31, RK_SEV_INFO},
                 {43, RK_SEV_INFO}, {45, RK_SEV_INFO}, {68, RK_SEV_INFO}, {1000, -1}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const char *what = NULL;
        assert_int_equal(rk_health_xid_class(table[i].xid, &what), table[i].sev);
        assert_non_null(what);
        s.xid_count = 3;
        s.nxids = 1;
        s.xids[0].xid = table[i].xid;
        s.xids[0].count = 3;
        s.last_xid = table[i].xid;
        int want = table[i].sev == RK_SEV_CRIT   ? 100 - RK_HEALTH_XID_CRIT_PENALTY
                   : table[i].sev == RK_SEV_WARN ? 100 - RK_HEALTH_XID_WARN_PENALTY
                                                 : 100;
        assert_int_equal(score1(&s, f, &n), want);
    }
    /* the latest code harmless, an earlier one critical: the counts still see it */
    s.xid_count = 6;
    s.nxids = 3;
    s.xids[0].xid = 13;
    s.xids[0].count = 3;
    s.xids[1].xid = 79;
    s.xids[1].count = 2;
    s.xids[2].xid = 94;
    s.xids[2].count = 1;
    s.last_xid = 13;
    assert_int_equal(score1(&s, f, &n),
                     100 - RK_HEALTH_XID_CRIT_PENALTY - RK_HEALTH_XID_WARN_PENALTY);
    assert_int_equal(n, 2);
    assert_string_equal(f[0].code, "xid");
    assert_non_null(strstr(f[0].message, "79 x2 (fell off the bus)"));
    assert_non_null(strstr(f[0].action, "riser"));
    assert_string_equal(f[1].code, "xid_memory");
    assert_non_null(strstr(f[1].message, "94 x1"));
}

/* A failed burn-in is a critical finding below the threshold; a passed one or none, nothing. */
static void burn_verdict(void **state)
{
    (void)state;
    rk_gpu_sample s = healthy(0);
    rk_gpu_history h;
    assert_int_equal(rk_history_init(&h, 4, NULL), RK_OK);
    rk_history_push(&h, &s);
    rk_gpu_signals g;
    rk_signals_compute(&h, &g);
    rk_history_free(&h);
    assert_false(g.burn_valid); /* not derived from the window */
    rk_finding f[RK_MAX_FINDINGS];
    int n;
    g.burn_ok = false; /* not valid: ignored */
    assert_int_equal(rk_health_score(&s, &g, f, &n), 100);
    g.burn_valid = true;
    g.burn_ok = true;
    assert_int_equal(rk_health_score(&s, &g, f, &n), 100);
    g.burn_ok = false;
    snprintf(g.burn_failed, sizeof g.burn_failed, "sgemm: 12 elements wrong in copies 3,7");
    int score = rk_health_score(&s, &g, f, &n);
    assert_int_equal(score, 100 - RK_HEALTH_BURN_FAILED_PENALTY);
    assert_true(score < RK_HEALTH_THRESHOLD_DEFAULT);
    assert_int_equal(n, 1);
    assert_string_equal(f[0].code, "burn_failed");
    assert_int_equal(f[0].severity, RK_SEV_CRIT);
    assert_non_null(strstr(f[0].message, "12 elements wrong in copies 3,7"));
    assert_string_equal(f[0].action,
                        "wrong arithmetic under load: retire or down-clock and burn again");
}

static void predicted_failure(void **state)
{
    (void)state;
    rk_gpu_sample s = healthy(0);
    rk_gpu_history h;
    assert_int_equal(rk_history_init(&h, 4, NULL), RK_OK);
    rk_history_push(&h, &s);
    rk_gpu_signals g;
    rk_signals_compute(&h, &g);
    rk_history_free(&h);
    assert_false(g.fail_prob_valid); /* not derived from the window */
    rk_finding f[RK_MAX_FINDINGS];
    int n;
    g.fail_prob = 0.99; /* not valid: ignored */
    assert_int_equal(rk_health_score(&s, &g, f, &n), 100);
    g.fail_prob_valid = true;
    g.fail_horizon_min = 60;
    const struct {
        double p;
        int score;
        const char *code;
    } cases[] = {{0, 100, NULL},
                 {0.199, 100, NULL},
                 {0.2, 90, "failure_risk"},
                 {0.3, 85, "failure_risk"},
                 {0.499, 75, "failure_risk"},
                 {0.5, 55, "failure_predicted"},
                 {0.93, 55, "failure_predicted"},
                 {1, 55, "failure_predicted"},
                 {1.5, 100, NULL},
                 {-0.5, 100, NULL},
                 {NAN, 100, NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g.fail_prob = cases[i].p;
        int sc = rk_health_score(&s, &g, f, &n);
        assert_int_equal(sc, cases[i].score);
        assert_int_equal(n, cases[i].code ? 1 : 0);
        if (!cases[i].code)
            continue;
        assert_string_equal(f[0].code, cases[i].code);
        assert_int_equal(f[0].penalty, 100 - cases[i].score);
        bool crit = cases[i].p >= RK_HEALTH_FAIL_PROB_PREDICTED;
        assert_int_equal(f[0].severity, crit ? RK_SEV_CRIT : RK_SEV_WARN);
        assert_true(crit ? sc < RK_HEALTH_THRESHOLD_DEFAULT : sc >= RK_HEALTH_THRESHOLD_DEFAULT);
    }
    g.fail_prob = 0.93;
    rk_health_score(&s, &g, f, &n);
    assert_string_equal(f[0].message, "the predictor gives p=0.93 of failing within 60 min");
    assert_string_equal(f[0].action, "drain its jobs, back up, replace or repair");
    g.fail_horizon_min = 0; /* not stated */
    rk_health_score(&s, &g, f, &n);
    assert_string_equal(f[0].message, "the predictor gives p=0.93 of failing within its horizon");
    /* with other findings: the penalties add, worst first */
    s.temp_c = 85;
    assert_int_equal(rk_health_score(&s, &g, f, &n), 100 - 45 - 20);
    assert_string_equal(f[0].code, "failure_predicted");
    assert_string_equal(f[1].code, "thermal_high");
    s.lost = true;
    assert_int_equal(rk_health_score(&s, &g, f, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(f[0].code, "gpu_lost");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(healthy_card_scores_100),
        cmocka_unit_test(each_rule_at_its_threshold),
        cmocka_unit_test(absent_fields_never_count),
        cmocka_unit_test(lost_gpu_scores_zero),
        cmocka_unit_test(dtdt_is_the_least_squares_slope),
        cmocka_unit_test(rates_and_links),
        cmocka_unit_test(predicted_failure),
        cmocka_unit_test(xid_table),
        cmocka_unit_test(burn_verdict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
