/*
 * Tests for training and judging failure detectors on fleet datasets (src/predict: windows.h,
 * logreg.h, fleeteval.h, detectors.h; rk_fleet_window in fleetdata.h): the window is exactly
 * the stored rows m - T + 1..m and does not exist before T rows; the event-level protocol
 * counts detections, lead times, false-alarm episodes (merged within the horizon, early ones
 * named), silent failures and accuracy as docs/predict.md says, on hand-made alarms whose
 * answers are worked out below; the threshold pick maximises F1, under a lead-time requirement
 * when one is given; the training windows hold every positive, the near band and the drawn
 * negatives with the right labels, the same for the same seed; hard negatives are the riskiest;
 * the logistic regression learns a separable rule, the window summary is right on a ramp and
 * average precision on a worked example; a written dataset loads, and broken ones are refused
 * with the file named; the detectors file the writer writes is what the parser reads.
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

#include "predict/detectors.h"
#include "predict/fleetdata.h"
#include "predict/fleeteval.h"
#include "predict/logreg.h"
#include "predict/windows.h"
#include "testutil.h"

#define F RK_FLEET_FEATURES

RK_TEST_DIR_FIXTURE("test_fleeteval")

/* ---- windows ------------------------------------------------------------------------------ */

static void test_window_is_the_stored_rows(void **state)
{
    (void)state;
    enum { STEPS = 10, T = 4 };
    float rows[STEPS * F], out[T * F];
    for (int k = 0; k < STEPS * F; k++)
        rows[k] = (float)k;
    assert_int_equal(rk_fleet_window(rows, STEPS, 6, T, out), RK_OK);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < F; j++)
            assert_true(out[t * F + j] == rows[(6 - T + 1 + t) * F + j]); /* oldest first */
    assert_int_equal(rk_fleet_window(rows, STEPS, T - 1, T, out), RK_OK); /* the first one */
    assert_true(out[0] == 0.0f);
    assert_int_equal(rk_fleet_window(rows, STEPS, STEPS - 1, T, out), RK_OK); /* the last */
    assert_true(out[T * F - 1] == rows[STEPS * F - 1]);
    /* no window before T rows, none past the end, none of no rows */
    out[0] = -1;
    assert_int_equal(rk_fleet_window(rows, STEPS, T - 2, T, out), RK_EINVAL);
    assert_int_equal(rk_fleet_window(rows, STEPS, STEPS, T, out), RK_EINVAL);
    assert_int_equal(rk_fleet_window(rows, STEPS, 5, 0, out), RK_EINVAL);
    assert_int_equal(rk_fleet_window(NULL, STEPS, 5, T, out), RK_EINVAL);
    assert_true(out[0] == -1.0f); /* untouched */
}

/* ---- the event-level protocol ------------------------------------------------------------- */

/* A fleet in memory: GPUs of `steps` minutes, failures and precursors as given, all in the
 * test split; rows are zero (the protocol looks at risks only). */
static rk_fleet fake_fleet(int n, const size_t *steps, const long *fail, const long *pre)
{
    rk_fleet f = {0};
    f.gpus = n;
    f.gpu = calloc((size_t)n, sizeof *f.gpu);
    assert_non_null(f.gpu);
    for (int i = 0; i < n; i++) {
        rk_fleet_gpu *g = &f.gpu[i];
        g->index = i;
        g->split = RK_FLEET_TEST;
        g->steps = steps[i];
        g->failure = fail[i];
        g->precursor = pre[i];
        g->x = calloc(steps[i] * F, sizeof *g->x);
        assert_non_null(g->x);
    }
    return f;
}

static float **no_alarms(const rk_fleet *f)
{
    float **r = calloc((size_t)f->gpus, sizeof *r);
    assert_non_null(r);
    for (int i = 0; i < f->gpus; i++) {
        r[i] = malloc(f->gpu[i].steps * sizeof **r);
        assert_non_null(r[i]);
        for (size_t m = 0; m < f->gpu[i].steps; m++)
            r[i][m] = 0.1f;
    }
    return r;
}

static void raise_alarms(float **r, int gpu, long from, long to)
{
    for (long m = from; m <= to; m++)
        r[gpu][m] = 0.9f;
}

static void test_event_protocol_on_hand_made_alarms(void **state)
{
    (void)state;
    enum { T = 60, H = 60 };
    /* A fails at 200, B at 300, C never, D at 400 (silent), E at 500 (a DBE: runs on) */
    const size_t steps[5] = {200, 300, 1000, 400, 800};
    const long fail[5] = {200, 300, -1, 400, 500}, pre[5] = {120, 200, -1, -1, 420};
    rk_fleet f = fake_fleet(5, steps, fail, pre);
    float **r = no_alarms(&f);
    raise_alarms(r, 0, 10, 58);   /* before the first full window: no decision, no alarm */
    raise_alarms(r, 0, 150, 199); /* A: detected 50 minutes ahead */
    raise_alarms(r, 1, 100, 105); /* B: a false alarm... */
    raise_alarms(r, 1, 120, 120); /* ...the same episode (20 minutes later, within the horizon) */
    raise_alarms(r, 1, 230, 299); /* B: 230..239 false (an early episode), detected 60 ahead */
    raise_alarms(r, 2, 500, 500); /* C: two episodes 100 minutes apart... */
    raise_alarms(r, 2, 600, 600);
    raise_alarms(r, 2, 630, 640); /* ...and this one merges with the second */
    r[2][700] = NAN;              /* no decision: never an alarm */
    raise_alarms(r, 4, 500, 700); /* E: after its failure the GPU is out of service: not watched */
    raise_alarms(r, 4, 499, 499); /* E: detected 1 minute ahead */

    rk_fleet_metrics m;
    rk_err err = {0};
    assert_int_equal(rk_fleet_evaluate(&f, RK_FLEET_TEST, r, T, H, 0.5, &m, &err), RK_OK);
    assert_int_equal(m.gpus, 5);
    assert_int_equal(m.failures, 4);
    assert_int_equal(m.detected, 3);
    assert_int_equal(m.false_alarms, 4); /* B twice, C twice */
    assert_int_equal(m.early_alarms, 1); /* B's second */
    assert_int_equal(m.silent, 1);
    assert_int_equal(m.silent_detected, 0);
    assert_true(fabs(m.precision - 3.0 / 7) < 1e-12);
    assert_true(fabs(m.recall - 3.0 / 4) < 1e-12);
    assert_true(fabs(m.f1 - 2 * (3.0 / 7) * 0.75 / (3.0 / 7 + 0.75)) < 1e-12);
    assert_true(fabs(m.lead_mean - (50 + 60 + 1) / 3.0) < 1e-12);
    assert_true(m.lead_median == 50);
    /* minutes watched: from minute 59 to the failure (or the end) */
    size_t minutes = (200 - 59) + (300 - 59) + (1000 - 59) + (400 - 59) + (500 - 59);
    assert_int_equal(m.minutes, minutes);
    assert_int_equal(m.positive_minutes, 60 * 4);
    assert_true(fabs(m.gpu_days - minutes / 1440.0) < 1e-12);
    assert_true(fabs(m.false_alarms_per_gpu_day - 4 / (minutes / 1440.0)) < 1e-12);
    /* accuracy: wrong where a label-0 minute alarms (6 + 1 + 10 + 1 + 1 + 11) or a label-1
     * minute does not (A 10, D 60, E 59) */
    size_t wrong = (6 + 1 + 10) + (1 + 1 + 11) + (10 + 60 + 59);
    assert_true(fabs(m.accuracy - (double)(minutes - wrong) / minutes) < 1e-12);

    /* a threshold above every alarm: nothing detected, no false alarm, precision 0 */
    assert_int_equal(rk_fleet_evaluate(&f, RK_FLEET_TEST, r, T, H, 0.95, &m, &err), RK_OK);
    assert_int_equal(m.detected + m.false_alarms, 0);
    assert_true(m.f1 == 0 && m.recall == 0);

    /* the pick among 0.95 (F1 0), 0.5 (precision 3/7, recall 3/4: F1 0.545) and 0.05
     * (everything alarms: every failure detected 60 minutes ahead and one false episode on
     * each GPU, the NAN minute not breaking C's: precision 4/9, recall 1, F1 0.615) */
    const double cands[3] = {0.95, 0.5, 0.05};
    rk_fleet_metrics best, low;
    assert_int_equal(rk_fleet_pick_threshold(&f, RK_FLEET_TEST, r, T, H, cands, 3, 0, &best, &err),
                     RK_OK);
    assert_int_equal(rk_fleet_evaluate(&f, RK_FLEET_TEST, r, T, H, 0.05, &low, &err), RK_OK);
    assert_int_equal(low.detected, 4);
    assert_int_equal(low.false_alarms, 5);
    assert_true(low.lead_mean == 60);
    assert_true(fabs(low.f1 - 2 * (4.0 / 9) / (4.0 / 9 + 1)) < 1e-12);
    assert_true(best.threshold == 0.05);
    assert_true(best.f1 == low.f1);

    /* a lead requirement: X fails at 200; risk 0.9 over its last 20 minutes, 0.6 from 120
     * and at 100..110 (a false alarm at 0.5). 0.8: precision 1, recall 1, lead 20; 0.5:
     * precision 1/2, lead 60. The best F1 is 0.8 unless the lead must reach 30; no threshold
     * reaches 70, and then the best F1 is taken. */
    const size_t sx[1] = {300};
    const long fx[1] = {200}, px[1] = {100};
    rk_fleet x = fake_fleet(1, sx, fx, px);
    float **rx = no_alarms(&x);
    for (long k = 100; k <= 110; k++)
        rx[0][k] = 0.6f;
    for (long k = 120; k < 180; k++)
        rx[0][k] = 0.6f;
    for (long k = 180; k < 200; k++)
        rx[0][k] = 0.9f;
    const double cx[2] = {0.8, 0.5};
    assert_int_equal(rk_fleet_pick_threshold(&x, RK_FLEET_TEST, rx, T, H, cx, 2, 0, &best, &err),
                     RK_OK);
    assert_true(best.threshold == 0.8 && best.lead_mean == 20 && best.f1 == 1.0);
    assert_int_equal(rk_fleet_pick_threshold(&x, RK_FLEET_TEST, rx, T, H, cx, 2, 30, &best, &err),
                     RK_OK);
    assert_true(best.threshold == 0.5 && best.lead_mean == 60 && best.false_alarms == 1);
    assert_int_equal(rk_fleet_pick_threshold(&x, RK_FLEET_TEST, rx, T, H, cx, 2, 70, &best, &err),
                     RK_OK);
    assert_true(best.threshold == 0.8);
    rk_fleet_risk_free(&x, rx);
    rk_fleet_free(&x);

    /* nothing of the split to watch */
    for (int i = 0; i < 5; i++)
        f.gpu[i].split = RK_FLEET_TRAIN;
    assert_int_equal(rk_fleet_evaluate(&f, RK_FLEET_TEST, r, T, H, 0.5, &m, &err), RK_EINVAL);
    rk_fleet_risk_free(&f, r);
    rk_fleet_free(&f);
}

/* ---- training windows --------------------------------------------------------------------- */

static void test_training_windows_and_hard_negatives(void **state)
{
    (void)state;
    enum { T = 10, H = 5, NEAR = 7 };
    const size_t steps[3] = {100, 80, 60};
    const long fail[3] = {90, -1, 60}, pre[3] = {70, -1, 50};
    rk_fleet f = fake_fleet(3, steps, fail, pre);
    for (int i = 0; i < 3; i++) /* each row says where it is: gpu * 1000 + minute */
        for (size_t m = 0; m < steps[i]; m++)
            for (int j = 0; j < F; j++)
                f.gpu[i].x[m * F + j] = (float)(i * 1000 + (int)m);
    rk_fleet_sample_opts o = {T, H, NEAR, 1, 2.0, 7};
    rk_fleet_windows w, w2;
    rk_err err = {0};
    assert_int_equal(rk_fleet_sample(&f, RK_FLEET_TEST, &o, &w, &err), RK_OK);
    /* positives: 5 per failure; near: 7 per failure; random: 2 per positive */
    assert_int_equal(w.positives, 10);
    assert_int_equal(w.n, 10 + 14 + 20);
    size_t pos = 0, near = 0;
    for (size_t k = 0; k < w.n; k++) {
        float last = w.x[(k * T + T - 1) * F];
        int gpu = (int)last / 1000;
        long m = (long)last % 1000;
        /* the window is the stored rows ending at its minute */
        assert_true(w.x[k * T * F] == (float)(gpu * 1000 + m - T + 1));
        assert_true(m >= T - 1 && m < (long)rk_fleet_watch_end(&f.gpu[gpu]));
        int y = rk_fleet_label(&f.gpu[gpu], (size_t)m, H);
        assert_true(w.y[k] == (float)y);
        pos += (size_t)y;
        near += !y && fail[gpu] >= 0 && m >= fail[gpu] - H - NEAR;
    }
    assert_int_equal(pos, 10);
    assert_int_equal(near, 14);
    /* the same seed, the same windows */
    assert_int_equal(rk_fleet_sample(&f, RK_FLEET_TEST, &o, &w2, &err), RK_OK);
    assert_int_equal(w2.n, w.n);
    assert_memory_equal(w2.x, w.x, w.n * T * F * sizeof *w.x);
    rk_fleet_windows_free(&w2);
    /* every second near window, counting back from the last before the positives */
    rk_fleet_sample_opts o2 = o;
    o2.near_step = 2;
    assert_int_equal(rk_fleet_sample(&f, RK_FLEET_TEST, &o2, &w2, &err), RK_OK);
    assert_int_equal(w2.n, 10 + 8 + 20); /* 4 of 7 near minutes per failure */
    size_t near2 = 0;
    for (size_t k = 0; k < w2.n; k++) {
        float last = w2.x[(k * T + T - 1) * F];
        int gpu = (int)last / 1000;
        long m = (long)last % 1000;
        if (!w2.y[k] && fail[gpu] >= 0 && m >= fail[gpu] - H - NEAR) {
            assert_true((fail[gpu] - H - 1 - m) % 2 == 0);
            near2++;
        }
    }
    assert_int_equal(near2, 8);
    rk_fleet_windows_free(&w2);

    /* hard negatives: the riskiest minutes outside the near band, riskiest first */
    float **r = no_alarms(&f);
    r[1][40] = 0.99f;
    r[1][41] = 0.98f;
    r[0][30] = 0.97f;
    r[0][85] = 1.0f; /* a positive minute: never a negative */
    size_t n0 = w.n;
    assert_int_equal(rk_fleet_mine(&f, RK_FLEET_TEST, &o, r, 3, &w, &err), RK_OK);
    assert_int_equal(w.n, n0 + 3);
    const float want[3] = {1040, 1041, 30};
    for (int q = 0; q < 3; q++) {
        assert_true(w.x[((n0 + q) * T + T - 1) * F] == want[q]);
        assert_true(w.y[n0 + q] == 0.0f);
    }
    rk_fleet_risk_free(&f, r);
    rk_fleet_windows_free(&w);

    /* no failure to learn from */
    f.gpu[0].failure = f.gpu[2].failure = -1;
    assert_int_equal(rk_fleet_sample(&f, RK_FLEET_TEST, &o, &w, &err), RK_EINVAL);
    rk_fleet_free(&f);
}

/* ---- the baseline ------------------------------------------------------------------------- */

static void test_summary_and_logistic_regression(void **state)
{
    (void)state;
    enum { T = 8 };
    float win[T * F], s[RK_FLEET_SUMMARY];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < F; j++)
            win[t * F + j] = j == 3 ? (float)(2 * t + 1) : (t == 2 ? 5.0f : 1.0f);
    rk_fleet_summary(win, T, s);
    assert_true(s[3] == 15.0f && s[F + 3] == 8.0f && fabsf(s[2 * F + 3] - 2.0f) < 1e-6f &&
                s[3 * F + 3] == 15.0f); /* a ramp: last, mean, slope, max */
    assert_true(s[0] == 1.0f && s[F] == 1.5f && s[3 * F] == 5.0f); /* a spike */

    /* a rule on two of three inputs: y = x0 + 2 x1 > 1.5 (about half the rows) */
    enum { N = 2000, D = 3 };
    float *x = malloc(N * D * sizeof *x), y[N];
    assert_non_null(x);
    unsigned seed = 12345;
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < D; k++) {
            seed = seed * 1103515245u + 12345u;
            x[i * D + k] = (float)((seed >> 8) % 10000) / 10000.0f;
        }
        y[i] = x[i * D] + 2 * x[i * D + 1] > 1.5f ? 1.0f : 0.0f;
    }
    rk_logreg lr;
    rk_logreg_opts o = RK_LOGREG_OPTS_DEFAULT;
    rk_err err = {0};
    assert_int_equal(
        rk_logreg_train(&lr, D, x, y, N - 500, x + (N - 500) * D, y + N - 500, 500, &o, &err),
        RK_OK);
    int right = 0;
    for (int i = N - 500; i < N; i++)
        right += (rk_logreg_prob(&lr, x + i * D) >= 0.5) == (y[i] == 1.0f);
    print_message("logistic regression: %d of 500 validation rows right\n", right);
    assert_true(right >= 480);
    assert_true(fabsf(lr.w[2]) < 0.1f * fabsf(lr.w[1]));  /* the unused input stays small */
    assert_true(lr.w[1] > 1.5f * lr.w[0] && lr.w[0] > 0); /* and the rule's 1 : 2 shows */
    rk_logreg_free(&lr);
    /* average precision: positives ranked 1st and 3rd: (1/1 + 2/3) / 2; ties by index */
    const float ps[4] = {0.9f, 0.8f, 0.7f, 0.6f}, ys[4] = {1, 0, 1, 0};
    assert_true(fabs(rk_fleet_average_precision(ps, ys, 4) - (1 + 2.0 / 3) / 2) < 1e-12);
    const float pt[2] = {0.5f, 0.5f}, yt[2] = {0, 1};
    assert_true(rk_fleet_average_precision(pt, yt, 2) == 0.5);
    assert_true(rk_fleet_average_precision(pt, ys + 1, 1) == 0.0); /* no positive */
    /* one class only */
    for (int i = 0; i < N; i++)
        y[i] = 0;
    assert_int_equal(rk_logreg_train(&lr, D, x, y, N, NULL, NULL, 0, &o, &err), RK_EINVAL);
    free(x);
}

/* ---- loading ------------------------------------------------------------------------------ */

static void put(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void test_dataset_loads_and_broken_ones_are_refused(void **state)
{
    (void)state;
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/ds", g_dir);
    rk_fleet_data_opts o;
    rk_fleet_data_opts_default(&o);
    o.dir = dir;
    o.gpus = 5;
    o.hours = 3;
    o.seed = 2;
    rk_fleet_data_report rep;
    rk_err err = {0};
    assert_int_equal(rk_fleet_data_write(&o, &rep, &err), RK_OK);
    rk_fleet f;
    assert_int_equal(rk_fleet_load(&f, dir, 1u << RK_FLEET_TRAIN, &err), RK_OK);
    assert_int_equal(f.gpus, 5);
    int loaded = 0;
    for (int i = 0; i < 5; i++) {
        const rk_fleet_gpu *g = &f.gpu[i];
        assert_int_equal(g->steps, 180);
        assert_int_equal(g->x != NULL, g->split == RK_FLEET_TRAIN);
        if (g->x) {
            loaded++;
            assert_non_null(g->score);
            for (size_t m = 0; m < g->steps; m++)
                assert_true(g->score[m] >= 0 && g->score[m] <= 100);
        }
    }
    assert_int_equal(loaded, rep.devices[0]);
    /* the health-score risks of the loaded split: 100 - score from the first decision on */
    float **r;
    assert_int_equal(rk_fleet_risk_score(&f, RK_FLEET_TRAIN, 60, &r, &err), RK_OK);
    for (int i = 0; i < 5; i++)
        if (r[i]) {
            assert_true(isnan(r[i][58]));
            assert_true(r[i][59] == 100.0f - f.gpu[i].score[59]);
        }
    rk_fleet_risk_free(&f, r);
    rk_fleet_free(&f);

    /* no dataset there */
    snprintf(path, sizeof path, "%s/none", g_dir);
    assert_int_equal(rk_fleet_load(&f, path, 7, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "fleet.json"));
    /* a history that disagrees with the manifest */
    snprintf(path, sizeof path, "%s/fleet.json", dir);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = '\0';
    char *st = strstr(text, "\"steps\": 180");
    assert_non_null(st);
    memcpy(st, "\"steps\": 181", 12);
    put(path, text);
    assert_int_equal(rk_fleet_load(&f, dir, 7, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "gpu-000"));
    /* not a dataset */
    put(path, "{\"format\": \"something else\"}");
    assert_int_equal(rk_fleet_load(&f, dir, 7, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "fleet.json"));
    put(path, "{not json");
    assert_int_equal(rk_fleet_load(&f, dir, 7, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "fleet.json"));
}

/* A detectors file as rk predict train writes it, with `window`, the first std and the first
 * weight given as text. */
static char *detectors_text(const char *window, const char *std0, const char *w0)
{
    static char t[1 << 14];
    int n = snprintf(t, sizeof t,
                     "{\"format\": \"rekindle-fleet-detectors\", \"window\": %s, \"horizon\": 60,"
                     " \"predictor\": {\"threshold\": 0.9}, \"logreg\": {\"threshold\": 0.8,"
                     " \"threshold_best_f1\": 0.95, \"b\": -1.5, \"w\": [%s",
                     window, w0);
    for (int k = 1; k < RK_FLEET_SUMMARY; k++)
        n += snprintf(t + n, sizeof t - (size_t)n, ", 0.01");
    n += snprintf(t + n, sizeof t - (size_t)n, "], \"mean\": [0");
    for (int k = 1; k < RK_FLEET_SUMMARY; k++)
        n += snprintf(t + n, sizeof t - (size_t)n, ", 0");
    n += snprintf(t + n, sizeof t - (size_t)n, "], \"std\": [%s", std0);
    for (int k = 1; k < RK_FLEET_SUMMARY; k++)
        n += snprintf(t + n, sizeof t - (size_t)n, ", 2");
    snprintf(t + n, sizeof t - (size_t)n, "]}}");
    return t;
}

static void test_detectors_file_and_manifest_parsers(void **state)
{
    (void)state;
    rk_fleet_detectors d;
    rk_err err = {0};
    const char *t = detectors_text("60", "2", "0.5");
    assert_int_equal(rk_fleet_detectors_parse(&d, t, strlen(t), "m.json", &err), RK_OK);
    assert_int_equal(d.window, 60);
    assert_int_equal(d.horizon, 60);
    assert_true(d.threshold == 0.9 && d.lr_threshold == 0.8 && d.lr_threshold_best_f1 == 0.95);
    float x[RK_FLEET_SUMMARY] = {0};
    x[0] = 4; /* standardised 2, weight 0.5: z = -1.5 + 1 */
    assert_true(fabs(rk_logreg_prob(&d.lr, x) - 1 / (1 + exp(0.5))) < 1e-9);
    rk_fleet_detectors_free(&d);
    /* the same from a file; a missing file is RK_ENOENT naming it */
    char path[700];
    snprintf(path, sizeof path, "%s/m.json", g_dir);
    put(path, t);
    assert_int_equal(rk_fleet_detectors_load(&d, path, &err), RK_OK);
    rk_fleet_detectors_free(&d);
    snprintf(path, sizeof path, "%s/none.json", g_dir);
    assert_int_equal(rk_fleet_detectors_load(&d, path, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "none.json"));
    /* refused, each with its reason */
    struct {
        const char *window, *std0, *w0, *says;
    } bad[] = {{"0", "2", "0.5", "window 0"},        {"99999", "2", "0.5", "out of range"},
               {"60", "0", "0.5", "std > 0"},        {"60", "-1", "0.5", "std > 0"},
               {"60", "2", "1e300", "finite float"}, {"60.5", "2", "0.5", "not the detectors file"},
               {"60", "2", "\"a\"", "not a number"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = detectors_text(bad[i].window, bad[i].std0, bad[i].w0);
        assert_int_equal(rk_fleet_detectors_parse(&d, t, strlen(t), "m.json", &err), RK_EFORMAT);
        assert_non_null(strstr(err.msg, "m.json"));
        if (!strstr(err.msg, bad[i].says))
            fail_msg("case %zu: '%s' does not say '%s'", i, err.msg, bad[i].says);
        assert_null(d.lr.w);
    }
    assert_int_equal(rk_fleet_detectors_parse(&d, "{", 1, "m.json", &err), RK_EFORMAT);

    /* the manifest alone: metadata without histories; a file outside the directory or a
     * failure after the history's end is refused */
    const char *head = "{\"format\": \"rekindle-fleet-dataset\", \"seed\": 3, \"hours\": 2,"
                       " \"features\": [\"temp\", \"fan\", \"power\", \"sm_clock\", \"util\","
                       " \"throttle\", \"ecc_corrected\", \"ecc_uncorrected\", \"pcie_replay\","
                       " \"xid\", \"vrm_ripple\", \"fan_vibration\"], \"devices\": [";
    char text[2048];
    rk_fleet f;
    snprintf(text, sizeof text,
             "%s{\"index\": 0, \"uuid\": \"u\", \"profile\": \"p\", \"split\":"
             " \"test\", \"file\": \"gpu-0000.safetensors\", \"steps\": 120, \"failure\":"
             " {\"minute\": 100, \"event\": \"dbe\", \"precursor_minute\": 40}}]}",
             head);
    assert_int_equal(rk_fleet_parse_manifest(&f, text, strlen(text), "fleet.json", &err), RK_OK);
    assert_int_equal(f.gpus, 1);
    assert_int_equal(f.gpu[0].split, RK_FLEET_TEST);
    assert_int_equal(f.gpu[0].failure, 100);
    assert_int_equal(f.gpu[0].precursor, 40);
    assert_string_equal(f.gpu[0].file, "gpu-0000.safetensors");
    assert_null(f.gpu[0].x);
    rk_fleet_free(&f);
    snprintf(text, sizeof text,
             "%s{\"index\": 0, \"uuid\": \"u\", \"profile\": \"p\", \"split\":"
             " \"test\", \"file\": \"../x\", \"steps\": 120}]}",
             head);
    assert_int_equal(rk_fleet_parse_manifest(&f, text, strlen(text), "fleet.json", &err),
                     RK_EFORMAT);
    assert_non_null(strstr(err.msg, "device 0"));
    snprintf(text, sizeof text,
             "%s{\"index\": 0, \"uuid\": \"u\", \"profile\": \"p\", \"split\":"
             " \"test\", \"file\": \"g\", \"steps\": 120, \"failure\": {\"minute\": 121,"
             " \"event\": \"dbe\"}}]}",
             head);
    assert_int_equal(rk_fleet_parse_manifest(&f, text, strlen(text), "fleet.json", &err),
                     RK_EFORMAT);
    assert_non_null(strstr(err.msg, "minute"));
    assert_null(f.gpu);
}

/* The detectors file as rk_fleet_detectors_save writes it is what the parser reads: the same
 * window, horizon and baseline bits (floats at 9 significant digits round-trip exactly), the
 * thresholds to 9 digits; beside them the inputs' names and each detector's val metrics. A
 * baseline of the wrong size is refused and nothing is written. */
static void test_detectors_file_round_trip(void **state)
{
    (void)state;
    float w[RK_FLEET_SUMMARY], mu[RK_FLEET_SUMMARY], sd[RK_FLEET_SUMMARY];
    for (int k = 0; k < RK_FLEET_SUMMARY; k++) {
        w[k] = (float)((k % 2 ? -1 : 1) * (k + 1) / 7.0);
        mu[k] = (float)(1e5 / (k + 3.0));
        sd[k] = (float)(1e-3 * (k + 1) / 3.0);
    }
    rk_fleet_detectors d = {.window = 30,
                            .horizon = 45,
                            .threshold = 0.2497398941234,
                            .lr_threshold = 1 / (1 + exp(-1.3)),
                            .lr_threshold_best_f1 = 0.880797078,
                            .lr = {RK_FLEET_SUMMARY, mu, sd, w, -0.123456789f},
                            .min_lead = 35,
                            .health_below = 60};
    d.val[RK_FLEET_DET_HEALTH].failures = 11;
    d.training.dataset = "ds";
    d.training.val_ap = 0.5;
    char path[700];
    snprintf(path, sizeof path, "%s/m.safetensors.json", g_dir);
    char *side = rk_fleet_detectors_path("m.safetensors");
    assert_string_equal(side, "m.safetensors.json");
    free(side);
    rk_err err = {0};
    assert_int_equal(rk_fleet_detectors_save(&d, path, &err), RK_OK);
    rk_fleet_detectors back;
    assert_int_equal(rk_fleet_detectors_load(&back, path, &err), RK_OK);
    assert_int_equal(back.window, 30);
    assert_int_equal(back.horizon, 45);
    assert_true(fabs(back.threshold - d.threshold) < 1e-9);
    assert_true(fabs(back.lr_threshold - d.lr_threshold) < 1e-9);
    assert_true(fabs(back.lr_threshold_best_f1 - d.lr_threshold_best_f1) < 1e-9);
    assert_int_equal(back.lr.d, RK_FLEET_SUMMARY);
    assert_memory_equal(back.lr.w, w, sizeof w);
    assert_memory_equal(back.lr.mean, mu, sizeof mu);
    assert_memory_equal(back.lr.std, sd, sizeof sd);
    assert_true(back.lr.b == d.lr.b);
    rk_fleet_detectors_free(&back);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    static char text[1 << 16];
    text[fread(text, 1, sizeof text - 1, fp)] = 0;
    fclose(fp);
    assert_non_null(strstr(text, "\"format\": \"rekindle-fleet-detectors\""));
    assert_non_null(strstr(text, "\"last:temp\""));
    assert_non_null(strstr(text, "\"max:fan_vibration\""));
    assert_non_null(strstr(text, "\"val_best_f1\""));
    assert_non_null(strstr(text, "\"failures\": 11"));
    assert_non_null(strstr(text, "\"dataset\": \"ds\""));
    /* a baseline of another size: refused, the file left as it was */
    d.lr.d = 3;
    assert_int_equal(rk_fleet_detectors_save(&d, path, &err), RK_EINVAL);
    assert_int_equal(rk_fleet_detectors_load(&back, path, &err), RK_OK);
    assert_int_equal(back.lr.d, RK_FLEET_SUMMARY);
    rk_fleet_detectors_free(&back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_is_the_stored_rows),
        cmocka_unit_test(test_event_protocol_on_hand_made_alarms),
        cmocka_unit_test(test_training_windows_and_hard_negatives),
        cmocka_unit_test(test_summary_and_logistic_regression),
        cmocka_unit_test_setup_teardown(test_dataset_loads_and_broken_ones_are_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_detectors_file_and_manifest_parsers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_detectors_file_round_trip, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
