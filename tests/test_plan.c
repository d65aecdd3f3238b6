/*
 * rk plan's simulator (src/plan/, docs/plan.md): its checks of the config, its determinism,
 * the cases with an answer known in closed form (no failures; exponential failures at fixed
 * costs against Daly's model, the interval and the goodput), the replay of InfiniteHBD's
 * fault trace against the trace's own counts, spares and shrinking, and the trace reader's
 * refusals of broken input.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "plan/fleet.h"
#include "plan/plan.h"

#ifndef RK_SRC_DIR
#define RK_SRC_DIR "."
#endif

#define assert_near(a, b, eps) near_((a), (b), (eps), #a, __LINE__)
static void near_(double a, double b, double eps, const char *what, int line)
{
    if (!(fabs(a - b) <= eps))
        fail_msg("line %d: %s = %.10g, want %.10g within %g", line, what, a, b, eps);
}

/* Exponential crashes only, at a job MTBF of mtbf_s over `gpus` GPUs; detection 0, restart
 * r_s, checkpoint cost c_s every tau_s: Daly's model exactly. */
static void daly_config(rk_plan_config *c, int gpus, double mtbf_s, double c_s, double r_s,
                        double tau_s, double horizon_s)
{
    rk_plan_config_default(c);
    c->hosts = (uint32_t)gpus;
    c->gpu.dist = RK_PLAN_EXPONENTIAL;
    c->gpu.mtbf_s = mtbf_s * gpus;
    for (int k = 0; k < RK_PLAN_KINDS; k++)
        c->detect_s[k] = 0;
    c->restart_s[RK_PLAN_DISK] = r_s;
    c->ckpt_cost_s = c_s;
    c->ckpt_every_s = tau_s;
    c->horizon_s = horizon_s;
}

static void test_config_refused(void **state)
{
    (void)state;
    rk_plan_config c;
    rk_plan_result r;
    rk_err err = {0};
    rk_plan_config_default(&c);
    assert_int_equal(rk_plan_config_check(&c, &err), RK_OK);
    c.hosts = 0;
    assert_int_equal(rk_plan_run(&c, 1, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "hosts"));
    rk_plan_config_default(&c);
    c.gpu.dist = RK_PLAN_EXPONENTIAL;
    c.gpu.mtbf_s = -1;
    assert_int_equal(rk_plan_config_check(&c, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "gpu mtbf"));
    rk_plan_config_default(&c);
    c.gpu.dist = RK_PLAN_WEIBULL;
    c.gpu.shape = 0;
    c.gpu.scale_s = 1;
    assert_int_equal(rk_plan_config_check(&c, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "weibull shape"));
    rk_plan_config_default(&c);
    c.ckpt_every_s = NAN;
    assert_int_equal(rk_plan_config_check(&c, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "checkpoint interval"));
    rk_plan_config_default(&c);
    c.repair_mean_s = c.repair_median_s / 2;
    assert_int_equal(rk_plan_config_check(&c, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "repair"));
    rk_plan_config_default(&c);
    c.min_hosts = 2;
    assert_int_equal(rk_plan_config_check(&c, &err), RK_EINVAL);
    rk_plan_config_default(&c);
    rk_plan_fault f[2] = {{0, 10, 20}, {0, 5, 30}};
    c.trace = f;
    c.trace_len = 2;
    assert_int_equal(rk_plan_config_check(&c, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "sorted"));
    f[1].start_s = 15;
    f[1].host = 1;
    assert_int_equal(rk_plan_config_check(&c, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "beyond the fleet"));
}

/* No failure: goodput is tau / (tau + C) to the last save, and a job of W seconds of work
 * ends at W plus one save per tau before it. */
static void test_no_failures(void **state)
{
    (void)state;
    rk_plan_config c;
    rk_plan_result r;
    rk_err err = {0};
    rk_plan_config_default(&c);
    c.hosts = 4;
    c.gpus_per_host = 8;
    c.ckpt_every_s = 100;
    c.ckpt_cost_s = 5;
    c.horizon_s = 105 * 1000 + 50; /* 1000 saves, then 50 s of work */
    assert_int_equal(rk_plan_run(&c, 7, &r, &err), RK_OK);
    assert_near(r.goodput, 100050.0 / 105050.0, 1e-9);
    assert_int_equal(r.ckpts, 1000);
    assert_int_equal(r.restarts, 0);
    c.work_s = 1050; /* 10 saves on the way, then 50 s */
    assert_int_equal(rk_plan_run(&c, 7, &r, &err), RK_OK);
    assert_true(r.finished);
    assert_near(r.wall_s, 1050 + 10 * 5, 1e-6);
}

/* The same seed gives the same bits; another seed other failures. */
static void test_deterministic(void **state)
{
    (void)state;
    rk_plan_config c;
    rk_plan_result a, b;
    rk_err err = {0};
    rk_plan_config_default(&c);
    c.hosts = 16;
    c.gpus_per_host = 4;
    c.spare_hosts = 1;
    c.min_hosts = 8;
    c.gpu.dist = RK_PLAN_WEIBULL;
    c.gpu.shape = 1.6;
    c.gpu.scale_s = 2e6;
    c.gpu.age_s = 1e6;
    c.mix[0] = 0.6, c.mix[1] = 0.3, c.mix[2] = 0.1;
    c.host.dist = RK_PLAN_EXPONENTIAL;
    c.host.mtbf_s = 20 * 86400.0;
    c.mode = RK_PLAN_MEMORY;
    assert_int_equal(rk_plan_run(&c, 42, &a, &err), RK_OK);
    assert_int_equal(rk_plan_run(&c, 42, &b, &err), RK_OK);
    assert_memory_equal(&a, &b, sizeof a);
    assert_true(a.failures[RK_PLAN_CRASH] > 0 && a.failures[RK_PLAN_HANG] > 0 &&
                a.failures[RK_PLAN_SLOW] > 0 && a.failures[RK_PLAN_HOST] > 0);
    assert_true(a.snaps > 0 && a.ckpts > 0);
    assert_true(a.goodput > 0.5 && a.goodput < 1.0);
    assert_int_equal(rk_plan_run(&c, 43, &b, &err), RK_OK);
    assert_true(a.goodput != b.goodput);
}

/* (a) Exponential failures at fixed costs: the simulated goodput within 0.005 of Daly's
 * closed form (Daly 2006, eq. 20: failures in work, saves and restarts alike) at the optimum
 * and on both sides of it. */
static void test_daly_goodput(void **state)
{
    (void)state;
    const double M = 3600, C = 300, R = 60;
    const double taus[] = {400, 1276.5, 4000};
    for (size_t i = 0; i < sizeof taus / sizeof taus[0]; i++) {
        rk_plan_config c;
        rk_plan_stats st;
        rk_err err = {0};
        daly_config(&c, 8, M, C, R, taus[i], 20000 * 3600.0);
        assert_int_equal(rk_plan_estimate(&c, 100, 8, &st, &err), RK_OK);
        double want = rk_plan_daly_goodput(taus[i], C, R, M);
        printf("tau %.1f s: goodput %.5f (sd %.5f over %d runs of 20000 h), Daly %.5f\n", taus[i],
               st.goodput_mean, st.goodput_sd, st.runs, want);
        assert_true(fabs(st.goodput_mean - want) <= 0.005);
    }
}

/* (a) The simulator's best checkpoint interval within 2 % of Daly's higher-order optimum
 * (Daly 2006, eq. 37: sqrt(2CM)(1 + sqrt(C/2M)/3 + C/18M) - C, within 0.03 % of the exact
 * optimum of eq. 20 here; Young's sqrt(2CM) is 15 % longer at C/M = 1/12 and is printed
 * beside it). */
static void test_daly_interval(void **state)
{
    (void)state;
    const double M = 3600, C = 300, R = 60;
    rk_plan_config c;
    rk_plan_best best;
    rk_err err = {0};
    daly_config(&c, 8, M, C, R, 1, 20000 * 3600.0);
    double iv[11], gp[11];
    assert_int_equal(rk_plan_best_interval(&c, 0, 700, 2800, 11, 200, 8, iv, gp, &best, &err),
                     RK_OK);
    double daly = rk_plan_daly_interval(C, M), young = rk_plan_young_interval(C, M);
    for (int i = 0; i < 11; i++)
        printf("  tau %7.1f s: goodput %.5f (Daly %.5f)\n", iv[i], gp[i],
               rk_plan_daly_goodput(iv[i], C, R, M));
    printf("best interval %.1f s (grid point %.1f s); Daly higher-order %.1f s (%+.2f %%), "
           "Young %.1f s\n",
           best.interval_s, iv[best.index], daly, 100 * (best.interval_s - daly) / daly, young);
    assert_true(fabs(best.interval_s - daly) <= 0.02 * daly);
}

static int trace_path(char *buf, size_t cap)
{
    const char *env = getenv("RK_INFINITEHBD_DIR");
    snprintf(buf, cap, "%s/fault_trace.json", env ? env : RK_SRC_DIR "/../shared/data/infinitehbd");
    struct stat st;
    return stat(buf, &st) == 0;
}

/* (b) Replaying InfiniteHBD's fault trace on 400 hosts (the servers it sampled) gives the
 * trace's own figures exactly: 584 faults and the nodes' unavailability, 3231.3222 node-days
 * (the union of each node's fault intervals, computed independently in Python from the JSON:
 * two faults overlap on one node, so the plain sum of durations, 3232.4438, is not it). */
static void test_trace_replay(void **state)
{
    (void)state;
    char path[4200];
    if (!trace_path(path, sizeof path)) {
        printf("skip - %s absent (../shared/data beside the source tree, or set "
               "RK_INFINITEHBD_DIR)\n",
               path);
        skip();
    }
    rk_plan_trace t;
    rk_err err = {0};
    assert_int_equal(rk_plan_trace_load(path, &t, &err), RK_OK);
    assert_int_equal(t.n, 584);
    assert_int_equal(t.nodes, 231);
    assert_near(t.unavail_s / 86400, 3231.3222, 1e-6);
    assert_near(t.span_s / 86400, 348.9798, 1e-9);
    rk_plan_config c;
    rk_plan_result r;
    rk_plan_config_default(&c);
    c.hosts = 400;
    c.gpus_per_host = 8;
    c.min_hosts = 1;
    c.trace = t.faults;
    c.trace_len = t.n;
    c.horizon_s = t.span_s;
    assert_int_equal(rk_plan_run(&c, 1, &r, &err), RK_OK);
    printf("replay: %llu faults, %.4f node-days down, goodput %.4f, %llu restarts\n",
           (unsigned long long)r.trace_faults, r.host_down_s / 86400, r.goodput,
           (unsigned long long)r.restarts);
    assert_int_equal(r.trace_faults, 584);
    /* two started on a node already down; a few on a repaired node waiting to rejoin */
    assert_true(r.failures[RK_PLAN_HOST] <= 582 && r.failures[RK_PLAN_HOST] > 500);
    assert_near(r.host_down_s, t.unavail_s, 1e-9 * t.unavail_s);
    assert_near(r.host_down_s / 86400, 3231.3222, 1e-6);
    rk_plan_trace_free(&t);
}

/* A trace fault that starts at the horizon itself counts, as the trace reader counts it
 * (fuzz_plan found a trace whose last fault started at its last event: the replay counted
 * one fault fewer than the trace). */
static void test_trace_fault_at_horizon(void **state)
{
    (void)state;
    rk_plan_fault f[2] = {{0, 0, 259200}, {0, 259200, 259200}};
    rk_plan_config c;
    rk_plan_result r;
    rk_err err = {0};
    rk_plan_config_default(&c);
    c.hosts = 2;
    c.min_hosts = 1;
    c.trace = f;
    c.trace_len = 2;
    c.horizon_s = 259200;
    assert_int_equal(rk_plan_run(&c, 1, &r, &err), RK_OK);
    assert_int_equal(r.trace_faults, 2);
    assert_near(r.host_down_s, 259200, 0);
}

static int parse(const char *text, rk_plan_trace *t, rk_err *err)
{
    return rk_plan_trace_parse(text, strlen(text), "t.json", t, err);
}

#define EV(node, time, type)                                                                       \
    "{\"node_id\":\"" node "\",\"event_time\":" time ",\"event_type\":\"" type "\"}"

static void test_trace_refused(void **state)
{
    (void)state;
    rk_plan_trace t;
    rk_err err = {0};
    const struct {
        const char *text, *want;
    } cases[] = {
        {"", "t.json: line"},
        {"{}", "not a JSON array"},
        {"[1]", "event 0: not an object"},
        {"[{\"node_id\":\"\",\"event_time\":1,\"event_type\":\"fault_start\"}]", "node_id"},
        {"[{\"node_id\":\"a\",\"event_time\":-1,\"event_type\":\"fault_start\"}]", "event_time"},
        {"[{\"node_id\":\"a\",\"event_time\":\"1\",\"event_type\":\"fault_start\"}]", "event_time"},
        {"[{\"node_id\":\"a\",\"event_time\":1,\"event_type\":\"start\"}]", "event_type"},
        {"[" EV("a", "2", "fault_start") "," EV("a", "1", "fault_end") "]",
         "event 1: event_time goes backwards"},
        {"[" EV("a", "1", "fault_end") "]", "event 0: a fault_end with no fault open"},
        {"[" EV("a", "1", "fault_start") "," EV("b", "2", "fault_start") "," EV("a", "3",
                                                                                "fault_end") "]",
         "node 1 (by first appearance, from 0): a fault never ends"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(parse(cases[i].text, &t, &err), RK_EFORMAT);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
        assert_null(t.faults);
    }
    /* a good one: overlapping faults on a node counted once in the unavailability */
    assert_int_equal(
        parse("[" EV("a", "1", "fault_start") "," EV("b", "1.5", "fault_start") "," EV(
                  "a", "2",
                  "fault_start") "," EV("a", "3",
                                        "fault_end") "," EV("b", "3",
                                                            "fault_end") "," EV("a", "4",
                                                                                "fault_end") "]",
              &t, &err),
        RK_OK);
    assert_int_equal(t.n, 3);
    assert_int_equal(t.nodes, 2);
    assert_int_equal(t.faults[1].host, 1);
    assert_near(t.unavail_s, (3.0 + 1.5) * 86400, 1e-6);
    rk_plan_trace_free(&t);
}

/* Host losses: a spare keeps the job whole (goodput up), and a job that may not shrink waits
 * for repairs (goodput down). */
static void test_spares_and_shrink(void **state)
{
    (void)state;
    rk_plan_config c;
    rk_plan_stats none, spare, wait;
    rk_err err = {0};
    rk_plan_config_default(&c);
    c.hosts = 8;
    c.gpus_per_host = 4;
    c.min_hosts = 4;
    c.host.dist = RK_PLAN_EXPONENTIAL;
    c.host.mtbf_s = 30 * 86400.0;
    c.horizon_s = 90 * 86400.0;
    assert_int_equal(rk_plan_estimate(&c, 1, 8, &none, &err), RK_OK);
    c.spare_hosts = 2;
    assert_int_equal(rk_plan_estimate(&c, 1, 8, &spare, &err), RK_OK);
    c.spare_hosts = 0;
    c.min_hosts = 0;
    assert_int_equal(rk_plan_estimate(&c, 1, 8, &wait, &err), RK_OK);
    printf("goodput: shrink %.4f, 2 spares %.4f, wait %.4f\n", none.goodput_mean,
           spare.goodput_mean, wait.goodput_mean);
    assert_true(spare.goodput_mean > none.goodput_mean);
    assert_true(wait.goodput_mean < none.goodput_mean);
}

/* Llama 3's published rate (419 unexpected interruptions in 54 days on 16,384 GPUs) put in as
 * a per-GPU MTBF comes back out as 419 interruptions, within 3 standard deviations of a
 * Poisson count, on the full fleet. */
static void test_llama3_rate(void **state)
{
    (void)state;
    rk_plan_config c;
    rk_plan_stats st;
    rk_err err = {0};
    rk_plan_config_default(&c);
    c.hosts = 2048;
    c.gpus_per_host = 8;
    c.gpu.dist = RK_PLAN_EXPONENTIAL;
    c.gpu.mtbf_s = 16384 * 54 * 86400.0 / 419;
    c.horizon_s = 54 * 86400.0;
    assert_int_equal(rk_plan_estimate(&c, 3, 4, &st, &err), RK_OK);
    printf("16,384 GPUs x 54 days: %.1f interruptions a run (Llama 3: 419)\n", st.failures_mean);
    assert_true(fabs(st.failures_mean - 419) <= 3 * sqrt(419.0 / 4));
}

/* The recovery modes on the same failures (crashes and hangs): disk loses the work since the
 * checkpoint, memory since the snapshot, in place the current step; goodput in that order. */
static void test_recovery_modes(void **state)
{
    (void)state;
    rk_plan_config c;
    rk_plan_result r[RK_PLAN_MODES];
    rk_err err = {0};
    rk_plan_config_default(&c);
    c.hosts = 16;
    c.gpus_per_host = 8;
    c.gpu.dist = RK_PLAN_EXPONENTIAL;
    c.gpu.mtbf_s = 128 * 3600.0; /* a failure an hour */
    c.mix[0] = 0.7, c.mix[1] = 0.3, c.mix[2] = 0;
    c.ckpt_every_s = 900;
    c.snap_every_s = 30;
    c.horizon_s = 20 * 86400.0;
    for (int m = 0; m < RK_PLAN_MODES; m++) {
        c.mode = (rk_plan_mode)m;
        assert_int_equal(rk_plan_run(&c, 11, &r[m], &err), RK_OK);
        printf("mode %d: goodput %.5f, lost %.0f s over %llu crashes and %llu hangs\n", m,
               r[m].goodput, r[m].lost_work_s, (unsigned long long)r[m].failures[RK_PLAN_CRASH],
               (unsigned long long)r[m].failures[RK_PLAN_HANG]);
    }
    assert_int_equal(r[RK_PLAN_DISK].failures[RK_PLAN_HANG],
                     r[RK_PLAN_MEMORY].failures[RK_PLAN_HANG]);
    assert_true(r[RK_PLAN_DISK].lost_work_s > r[RK_PLAN_MEMORY].lost_work_s);
    assert_true(r[RK_PLAN_MEMORY].lost_work_s > r[RK_PLAN_INPLACE].lost_work_s);
    assert_true(r[RK_PLAN_INPLACE].lost_work_s <=
                c.step_s *
                    (double)(r[RK_PLAN_INPLACE].failures[0] + r[RK_PLAN_INPLACE].failures[1]));
    assert_true(r[RK_PLAN_DISK].goodput < r[RK_PLAN_MEMORY].goodput);
    assert_true(r[RK_PLAN_MEMORY].goodput < r[RK_PLAN_INPLACE].goodput);
}

/* The fleet file: a good one and its totals, then each refusal naming the line and field. */
static void test_fleet_file(void **state)
{
    (void)state;
    rk_plan_fleet f;
    rk_err err = {0};
    const char *good = "# a rack\nhosts 5\r\ncard model=gtx-1070-ti count=12 hours=100 watts=180 "
                       "price=110 tflops=8.1\ncard model=p106 count=8 score=50 # old\n";
    assert_int_equal(rk_plan_fleet_parse(good, strlen(good), "f", &f, &err), RK_OK);
    assert_int_equal(f.hosts, 5);
    assert_int_equal(f.n, 2);
    assert_int_equal(f.gpus, 20);
    assert_near(f.tflops, 12 * 8.1 + 8, 1e-9);
    assert_near(f.watts, 12 * 180, 1e-9);
    assert_near(f.hours_mean, 60, 1e-9);
    assert_near(f.score_mean, (12 * 100 + 8 * 50) / 20.0, 1e-9);
    const struct {
        const char *text, *want;
    } cases[] = {
        {"", "needs a hosts line"},
        {"hosts 2\n", "needs a hosts line and at least one card"},
        {"hosts 0\ncard model=a count=2\n", "f:1: hosts needs one whole number"},
        {"hosts 2 3\ncard model=a count=2\n", "f:1: hosts needs one whole number"},
        {"hosts 1\nhosts 1\n", "f:2: a second hosts line"},
        {"hosts 1\ngpu model=a count=1\n", "f:2: a line starts with hosts or card"},
        {"hosts 1\ncard model=a\n", "f:2: a card needs model= and count="},
        {"hosts 1\ncard model=a count=1.5\n", "f:2: count must be a whole number"},
        {"hosts 1\ncard model=a count=1 watts=inf\n", "f:2: watts must be a number"},
        {"hosts 1\ncard model=a count=1 score=101\n", "f:2: score must be a number in [0, 100]"},
        {"hosts 1\ncard model=a count=1 tflops=0x10\n", "f:2: tflops must be a number"},
        {"hosts 1\ncard model=a/b count=1\n", "f:2: model must be"},
        {"hosts 1\ncard model=a count=1 colour\n", "f:2: a card's fields are key=value"},
        {"hosts 3\ncard model=a count=4\n", "4 cards do not divide evenly among 3 hosts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(rk_plan_fleet_parse(cases[i].text, strlen(cases[i].text), "f", &f, &err),
                         RK_EFORMAT);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
    }
    char longline[700];
    memset(longline, 'x', sizeof longline - 1);
    longline[sizeof longline - 1] = 0;
    assert_int_equal(rk_plan_fleet_parse(longline, strlen(longline), "f", &f, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "f:1: line longer than 512 bytes"));
    assert_int_equal(rk_plan_fleet_parse("hosts 1\0", 9, "f", &f, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "NUL"));
}

/* An rk run summary as the job, and its refusals. */
static void test_summary(void **state)
{
    (void)state;
    rk_plan_measured m;
    rk_err err = {0};
    const char *s = "{\"productive_s\": 629, \"steps\": 22611, \"recovery_median_s\": 1.15, "
                    "\"recovery\": \"memory\", \"snapshot_bytes_peak\": 4194304, "
                    "\"final_ranks\": 4}";
    assert_int_equal(rk_plan_summary_parse(s, strlen(s), "s", 0.072, &m, &err), RK_OK);
    assert_near(m.step_s, 629.0 / 22611, 1e-12);
    assert_near(m.restart_s, 1.15 - 0.072, 1e-12);
    assert_int_equal(m.mode, RK_PLAN_MEMORY);
    assert_near(m.state_bytes, 4194304 / 8.0, 1e-9);
    const struct {
        const char *text, *want;
    } cases[] = {
        {"[]", "s: not a JSON object"},
        {"{\"steps\": 1}", "s: no productive_s"},
        {"{\"productive_s\": 1, \"steps\": \"2\"}", "s: steps must be a number"},
        {"{\"productive_s\": 0, \"steps\": 2}", "no productive steps"},
        {"{\"productive_s\": 1, \"steps\": 2, \"recovery\": \"tape\"}", "recovery must be"},
        {"{\"productive_s\": 1, \"steps\": 2, \"steps\": 3}", "s: line 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(
            rk_plan_summary_parse(cases[i].text, strlen(cases[i].text), "s", 0, &m, &err),
            RK_EFORMAT);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
    }
}

/* The failure models by name: Llama 3's rate a GPU, whatever the split between crashes and
 * host losses; the refusals name the spec. */
static void test_failure_models(void **state)
{
    (void)state;
    rk_plan_config c;
    rk_err err = {0};
    rk_plan_config_default(&c);
    c.hosts = 2048;
    c.gpus_per_host = 8;
    assert_int_equal(rk_plan_failures_set(&c, "llama3", 0, &err), RK_OK);
    double rate = 1 / c.gpu.mtbf_s + 1 / (c.host.mtbf_s * c.gpus_per_host);
    assert_near(rate * 16384 * 54 * 86400, 419, 1e-6);
    assert_near(rk_plan_job_mtbf(&c), 54 * 86400.0 / 419, 1e-6);
    assert_int_equal(rk_plan_failures_set(&c, "weibull:1.6,3.2e8", 3600, &err), RK_OK);
    assert_int_equal(c.gpu.dist, RK_PLAN_WEIBULL);
    assert_near(c.gpu.age_s, 3600, 0);
    assert_int_equal(rk_plan_failures_set(&c, "exp:3600", 0, &err), RK_OK);
    assert_near(rk_plan_job_mtbf(&c), 3600.0 / 16384, 1e-9);
    const char *bad[] = {"llama4", "exp:", "exp:-1", "weibull:1.6", "weibull:x,1", "exp:1e400"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(rk_plan_failures_set(&c, bad[i], 0, &err), RK_EINVAL);
        assert_non_null(strstr(err.msg, "is none of"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_refused),
        cmocka_unit_test(test_no_failures),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_daly_goodput),
        cmocka_unit_test(test_daly_interval),
        cmocka_unit_test(test_trace_replay),
        cmocka_unit_test(test_trace_fault_at_horizon),
        cmocka_unit_test(test_trace_refused),
        cmocka_unit_test(test_spares_and_shrink),
        cmocka_unit_test(test_llama3_rate),
        cmocka_unit_test(test_fleet_file),
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_failure_models),
        cmocka_unit_test(test_recovery_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
