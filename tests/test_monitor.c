/*
 * The health monitor (rekindle/monitor.h) and the four paths that use it. One recorded
 * sequence of readings (two GPUs, six minutes: a hot card, a failed reading, a GPU that
 * falls off the bus) goes through the monitor itself and through each path's entry point:
 * rk doctor's check (rk_monitor_sample), the exporter's collector (rk_monitor_read into
 * rk_prom_gpu_from_monitor, rendered), rk run's health gate (rk_gate_sample, rk_gate_score)
 * and the predictor's dataset builder (rk_fleet_record), with a real (untrained) failure
 * predictor whose horizon comes from its model file. Every path must give the same score
 * after every reading. Also: the failed-reading rule and the probability check alone.
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
#include <unistd.h>

#include "exporter/exporter.h"
#include "health/burnstate.h"
#include "predict/fleetdata.h"
#include "predict/predict.h"
#include "predict/predict_online.h"
#include "rekindle/monitor.h"
#include "supervisor/supervisor.h"

#define GPUS 2
#define READS 6 /* within the shortest history of the four paths (the dataset's six) */
#define MODEL RK_TEST_TMPDIR "/monitor-model.safetensors"
#define HORIZON 45

static rk_gpu_sample seq[READS][GPUS];

/* The recording: one reading a minute. GPU 0 heats up, is hot at minute 3 (thermal_high),
 * cannot be read at minute 4, and is hot again; GPU 1 piles up corrected ECC errors and PCIe
 * replays and falls off the bus at minute 6. */
static void record(void)
{
    memset(seq, 0, sizeof seq);
    for (int k = 0; k < READS; k++) {
        for (int i = 0; i < GPUS; i++) {
            rk_gpu_sample *s = &seq[k][i];
            s->t = 60.0 * (k + 1);
            s->temp_c = i == 0 ? 70 + 8 * k : 55 + k;
            s->fan_pct = 60, s->power_w = 150, s->sm_mhz = 1600, s->util_pct = 90;
            s->ecc_corrected = i == 1 ? 100 + 50 * (uint64_t)k : 0;
            s->pcie_replay = i == 1 ? 1000 + 400 * (uint64_t)k : 3;
            s->pcie_gen = s->pcie_gen_max = 3, s->pcie_width = s->pcie_width_max = 16;
            const rk_field f[] = {RK_F_TEMP,           RK_F_FAN,          RK_F_POWER,
                                  RK_F_SM_CLOCK,       RK_F_UTIL,         RK_F_ECC_CORRECTED,
                                  RK_F_PCIE_GEN,       RK_F_PCIE_GEN_MAX, RK_F_PCIE_WIDTH,
                                  RK_F_PCIE_WIDTH_MAX, RK_F_PCIE_REPLAY};
            for (size_t j = 0; j < sizeof f / sizeof f[0]; j++)
                rk_field_set(s, f[j]);
        }
    }
    memset(&seq[3][0], 0, sizeof seq[3][0]); /* the failed reading: nothing valid */
    seq[3][0].t = 60.0 * 4;
    rk_gpu_sample *gone = &seq[READS - 1][1];
    double t = gone->t;
    memset(gone, 0, sizeof *gone);
    gone->t = t, gone->lost = true;
}

/* ---- a telemetry backend that replays the recording --------------------------------------- */

typedef struct replay {
    int next[GPUS];
} replay;

static int rp_open(void **state, const rk_telemetry_opts *o, rk_err *err)
{
    (void)o, (void)err;
    *state = calloc(1, sizeof(replay));
    return *state ? RK_OK : RK_ENOMEM;
}
static int rp_count(void *state)
{
    (void)state;
    return GPUS;
}
static int rp_info(void *state, int i, rk_gpu_info *out)
{
    (void)state;
    out->index = i;
    snprintf(out->name, sizeof out->name, "Replayed GPU %d", i);
    snprintf(out->uuid, sizeof out->uuid, "GPU-replay-%d", i);
    out->backend = "replay";
    return RK_OK;
}
static int rp_read(void *state, int i, rk_gpu_sample *out, rk_err *err)
{
    replay *r = state;
    if (r->next[i] >= READS)
        return rk_err_set(err, RK_EIO, "replay: GPU %d has no more readings", i);
    *out = seq[r->next[i]++][i];
    return RK_OK;
}
static void rp_close(void *state)
{
    free(state);
}
/* the recording's clock: the time of GPU 0's latest reading */
static double rp_now(void *state)
{
    replay *r = state;
    return r->next[0] ? seq[r->next[0] - 1][0].t : 0;
}
static const rk_telemetry_ops replay_ops = {"replay", rp_open,  rp_count, rp_info,
                                            rp_read,  rp_close, rp_now};

static rk_telemetry *replay_open(void)
{
    rk_telemetry *t = NULL;
    rk_err err = {0};
    assert_int_equal(rk_telemetry_open_ops(&t, &replay_ops, NULL, &err), RK_OK);
    return t;
}

/* ---- the paths ---------------------------------------------------------------------------- */

/* The reference: the readings pushed straight into a monitor (with the model's windows when
 * `model` is not NULL). want[k][i]: GPU i's score after reading k; prob likewise. */
static void reference(const rk_pred_model *model, int want[READS][GPUS], double prob[READS][GPUS])
{
    rk_pred_online *po = NULL;
    rk_monitor_predictor mp;
    rk_monitor_opts o = RK_MONITOR_OPTS_DEFAULT;
    o.history = READS;
    if (model) {
        assert_int_equal(rk_pred_online_create(&po, model, GPUS, NULL), RK_OK);
        rk_pred_online_monitor(po, &mp);
        assert_true(mp.horizon_min == HORIZON); /* from the model file */
        o.predictor = &mp;
    }
    rk_monitor *m;
    assert_int_equal(rk_monitor_create(&m, GPUS, &o, NULL), RK_OK);
    for (int k = 0; k < READS; k++)
        for (int i = 0; i < GPUS; i++) {
            assert_int_equal(rk_monitor_push(m, i, seq[k][i].t, &seq[k][i], NULL), RK_OK);
            const rk_monitor_gpu *g = rk_monitor_gpu_state(m, i);
            assert_true(g->has_score);
            want[k][i] = g->score;
            if (prob)
                prob[k][i] = g->prob;
        }
    rk_monitor_free(m);
    rk_pred_online_free(po);
}

/* rk doctor's check of k readings: its monitor (history k + 1) over rk_monitor_sample. */
static int doctor_score(const rk_pred_model *model, int k, int gpu)
{
    rk_telemetry *t = replay_open();
    rk_pred_online *po = NULL;
    assert_int_equal(rk_pred_online_create(&po, model, GPUS, NULL), RK_OK);
    rk_monitor_predictor mp;
    rk_pred_online_monitor(po, &mp);
    rk_monitor_opts o = RK_MONITOR_OPTS_DEFAULT;
    o.history = k + 1;
    o.predictor = &mp;
    rk_monitor *m;
    assert_int_equal(rk_monitor_create(&m, GPUS, &o, NULL), RK_OK);
    assert_int_equal(rk_monitor_sample(m, t, k, 0, NULL), RK_OK);
    int score = rk_monitor_gpu_state(m, gpu)->score;
    rk_monitor_free(m);
    rk_pred_online_free(po);
    rk_telemetry_close(t);
    return score;
}

/* The score a /metrics text gives GPU `gpu`, -1 when it has none. */
static int metrics_score(const char *text, int gpu)
{
    char key[64];
    snprintf(key, sizeof key, "\nrk_gpu_health_score{gpu=\"%d\",", gpu);
    const char *p = strstr(text, key);
    if (!p)
        return -1;
    p = strchr(p, '}');
    return p ? atoi(p + 2) : -1;
}

static void every_path_gives_the_same_scores(void **state)
{
    (void)state;
    record();
    /* an untrained predictor over two-minute windows, trained (so it says) for 45 minutes */
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    c.window = 2, c.features = RK_FLEET_FEATURES, c.hidden = 8, c.attn = 4, c.dense = 4;
    c.horizon_min = HORIZON;
    rk_pred_model *tmp, *model;
    rk_err err = {0};
    assert_int_equal(rk_pred_create(&tmp, &c, &err), RK_OK);
    assert_int_equal(rk_pred_save(tmp, MODEL, &err), RK_OK);
    rk_pred_free(tmp);
    assert_int_equal(rk_pred_load(&model, MODEL, &err), RK_OK);
    assert_int_equal(rk_pred_config_of(model)->horizon_min, HORIZON);

    int want[READS][GPUS], plain[READS][GPUS];
    double prob[READS][GPUS];
    reference(model, want, prob);
    reference(NULL, plain, NULL);
    /* the recording shows what it should: a probability counted, the failed reading kept
     * out (the hot reading's score stands), the lost GPU at 0 */
    assert_true(prob[2][0] >= 0 && prob[2][0] <= 1);
    assert_int_equal(want[3][0], want[2][0]);
    assert_true(plain[2][0] <= 80);
    assert_int_equal(want[READS - 1][1], 0);

    /* the exporter's collector: rk_monitor_read, rk_prom_gpu_from_monitor, rendered */
    rk_exporter_opts xo = RK_EXPORTER_OPTS_DEFAULT;
    rk_telemetry *t = replay_open();
    rk_pred_online *po = NULL;
    assert_int_equal(rk_pred_online_create(&po, model, GPUS, NULL), RK_OK);
    rk_monitor_predictor mp;
    rk_pred_online_monitor(po, &mp);
    rk_monitor_opts mo = RK_MONITOR_OPTS_DEFAULT;
    mo.history = xo.history;
    mo.predictor = &mp;
    rk_monitor *xm;
    assert_int_equal(rk_monitor_create(&xm, GPUS, &mo, NULL), RK_OK);

    /* the health gate, over the same kind of replay, with the model file */
    rk_sup_opts so;
    memset(&so, 0, sizeof so);
    so.health_threshold = RK_HEALTH_THRESHOLD_DEFAULT;
    so.health_time_scale = 1;
    so.predictor = MODEL;
    rk_gate *gate;
    assert_int_equal(rk_gate_open_telemetry(&gate, replay_open(), &so, &err), RK_OK);

    for (int k = 0; k < READS; k++) {
        assert_int_equal(rk_monitor_read(xm, t, &err), RK_OK);
        rk_prom_gpu pg[GPUS];
        for (int i = 0; i < GPUS; i++)
            rk_prom_gpu_from_monitor(&pg[i], rk_monitor_info(xm, i), rk_monitor_gpu_state(xm, i));
        rk_buf b = {0};
        rk_prom_render_gpus(&b, pg, GPUS);
        assert_false(b.failed);
        assert_int_equal(rk_gate_sample(gate, &err), RK_OK);
        for (int i = 0; i < GPUS; i++) {
            char id[8], why[200];
            snprintf(id, sizeof id, "%d", i);
            print_message("reading %d GPU %d: monitor %d (p=%.3f), exporter %d, gate %d\n", k, i,
                          want[k][i], prob[k][i], metrics_score(b.p, i),
                          rk_gate_score(gate, id, why, sizeof why));
            assert_int_equal(metrics_score(b.p, i), want[k][i]);
            assert_int_equal(rk_gate_score(gate, id, why, sizeof why), want[k][i]);
            assert_true(rk_gate_prob(gate, id) == prob[k][i]);
            assert_int_equal(doctor_score(model, k + 1, i), want[k][i]);
        }
        rk_buf_free(&b);
    }
    rk_gate_close(gate);
    rk_monitor_free(xm);
    rk_pred_online_free(po);
    rk_telemetry_close(t);

    /* the dataset builder: one GPU at a time, no predictor; a row per good reading */
    for (int i = 0; i < GPUS; i++) {
        float x[READS * RK_FLEET_FEATURES], score[READS];
        uint8_t v[READS * RK_FLEET_FEATURES];
        size_t steps;
        int lost;
        t = replay_open();
        assert_int_equal(rk_fleet_record(t, i, 0, READS, x, v, score, &steps, &lost, &err), RK_OK);
        rk_telemetry_close(t);
        size_t r = 0;
        for (int k = 0; k < READS; k++) {
            if (seq[k][i].lost)
                break;
            if (rk_monitor_read_failed(&seq[k][i]))
                continue;
            assert_true(r < steps);
            print_message("dataset GPU %d row %zu (reading %d): %g, monitor %d\n", i, r, k,
                          score[r], plain[k][i]);
            assert_int_equal((int)score[r], plain[k][i]);
            r++;
        }
        assert_int_equal(r, steps);
        assert_int_equal(lost, i == 1);
    }
    rk_pred_free(model);
    remove(MODEL);
}

/* ---- the rules alone ---------------------------------------------------------------------- */

static const double *script;
static int script_push(void *ctx, int gpu, double t, const rk_gpu_sample *s, double *prob,
                       rk_err *err)
{
    (void)ctx, (void)gpu, (void)t, (void)s, (void)err;
    *prob = *script++;
    return RK_OK;
}

/* A failed reading changes nothing and is counted; a GPU never read has no score;
 * probabilities outside [0, 1] (or not finite) are none. */
static void failed_readings_and_probabilities(void **state)
{
    (void)state;
    const double p[] = {0.3, 1.5, NAN, -1, 0.75};
    script = p;
    rk_monitor_predictor mp = {script_push, NULL, 30};
    rk_monitor_opts o = RK_MONITOR_OPTS_DEFAULT;
    o.predictor = &mp;
    rk_monitor *m;
    assert_int_equal(rk_monitor_create(&m, 1, &o, NULL), RK_OK);
    const rk_monitor_gpu *g = rk_monitor_gpu_state(m, 0);
    rk_gpu_sample empty = {0}, s = {.t = 1, .temp_c = 50};
    rk_field_set(&s, RK_F_TEMP);
    assert_int_equal(rk_monitor_push(m, 0, 1, &empty, NULL), RK_OK);
    assert_false(g->has_score);
    assert_false(g->read);
    assert_int_equal(g->failed_reads, 1);

    assert_int_equal(rk_monitor_push(m, 0, 60, &s, NULL), RK_OK); /* p = 0.3: failure_risk */
    assert_true(g->prob == 0.3);
    assert_int_equal(g->score, 85);
    assert_string_equal(g->findings[0].code, "failure_risk");
    assert_non_null(strstr(g->findings[0].message, "within 30 min"));
    assert_int_equal(rk_monitor_push(m, 0, 61, &empty, NULL), RK_OK); /* nothing changes */
    assert_int_equal(g->score, 85);
    assert_false(g->current);
    assert_int_equal(g->failed_reads, 1);
    assert_int_equal(g->readings, 1);
    for (int k = 0; k < 3; k++) { /* 1.5, NaN, -1: no probability */
        assert_int_equal(rk_monitor_push(m, 0, 120 + 60 * k, &s, NULL), RK_OK);
        assert_true(g->prob == -1);
        assert_int_equal(g->score, 100);
        assert_false(g->sig.fail_prob_valid);
    }
    assert_int_equal(rk_monitor_push(m, 0, 400, &s, NULL), RK_OK);
    assert_int_equal(g->score, 55); /* p = 0.75: failure_predicted */
    assert_int_equal(rk_monitor_push(m, 1, 400, &s, NULL), RK_EINVAL);
    rk_monitor_free(m);

    rk_monitor_opts bad = {1, NULL};
    assert_int_equal(rk_monitor_create(&m, 1, &bad, NULL), RK_EINVAL);
    mp.horizon_min = NAN;
    assert_int_equal(rk_monitor_create(&m, 1, &o, NULL), RK_EINVAL);
}

/* A model file records its horizon; a file without one (older models) reads as 60. */
static bool has_code(const rk_monitor_gpu *g, const char *code)
{
    for (int k = 0; k < g->nfindings; k++)
        if (strcmp(g->findings[k].code, code) == 0)
            return true;
    return false;
}

/* The burn verdicts: the state file's record for a GPU's UUID (the replayed GPUs have no
 * serial) gives it burn_failed; a new verdict in the file is seen at the next reading; a file
 * that does not load is one warning (once per version of the file) and no finding. */
static void burn_verdicts_follow_the_file(void **state)
{
    (void)state;
    record();
    const char *path = RK_TEST_TMPDIR "/monitor-burn.json";
    unlink(path);
    setenv(RK_BURN_STATE_ENV, path, 1);
    rk_burn_record r = {0};
    snprintf(r.key, sizeof r.key, "GPU-replay-1");
    snprintf(r.name, sizeof r.name, "Replayed GPU 1");
    r.when = 1764660000;
    r.duration_s = 60;
    r.ok = false;
    snprintf(r.failed, sizeof r.failed, "memory: moving inversions, 4 addresses wrong");
    r.bad_addresses = 4;
    rk_err err = {0};
    assert_int_equal(rk_burn_state_put(path, &r, &err), RK_OK);
    rk_telemetry *t = replay_open();
    rk_monitor *m;
    assert_int_equal(rk_monitor_create(&m, GPUS, NULL, &err), RK_OK);
    assert_int_equal(rk_monitor_read(m, t, &err), RK_OK);
    const rk_monitor_gpu *g0 = rk_monitor_gpu_state(m, 0), *g1 = rk_monitor_gpu_state(m, 1);
    assert_false(g0->sig.burn_valid);
    assert_false(has_code(g0, "burn_failed"));
    assert_true(g1->sig.burn_valid && !g1->sig.burn_ok);
    assert_true(g1->sig.burn_when == 1764660000);
    assert_true(has_code(g1, "burn_failed"));
    assert_true(g1->score < RK_HEALTH_THRESHOLD_DEFAULT);
    /* burnt again, OK now: the next reading sees it */
    r.ok = true;
    r.failed[0] = '\0';
    r.bad_addresses = 0;
    assert_int_equal(rk_burn_state_put(path, &r, &err), RK_OK);
    assert_int_equal(rk_monitor_read(m, t, &err), RK_OK);
    g1 = rk_monitor_gpu_state(m, 1);
    assert_true(g1->sig.burn_valid && g1->sig.burn_ok);
    assert_false(has_code(g1, "burn_failed"));
    /* a file that does not load: one warning, then quiet; no verdict */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"format\": \"rekindle-burn-state\", \"gpus\": [", f);
    fclose(f);
    assert_int_equal(rk_monitor_read(m, t, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "warning: burn verdicts not used: "));
    assert_non_null(strstr(err.msg, "monitor-burn.json"));
    g1 = rk_monitor_gpu_state(m, 1);
    assert_false(g1->sig.burn_valid);
    assert_false(has_code(g1, "burn_failed"));
    assert_int_equal(rk_monitor_read(m, t, &err), RK_OK); /* the same bad file: said once */
    assert_false(rk_monitor_gpu_state(m, 1)->sig.burn_valid);
    rk_monitor_free(m);
    rk_telemetry_close(t);
    unsetenv(RK_BURN_STATE_ENV);
    unlink(path);
    char lock[256];
    snprintf(lock, sizeof lock, "%s.lock", path);
    unlink(lock);
}

static void models_record_their_horizon(void **state)
{
    (void)state;
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    c.window = 2, c.features = 3, c.hidden = 4, c.attn = 2, c.dense = 2, c.horizon_min = 90;
    rk_pred_model *m, *back;
    assert_int_equal(rk_pred_create(&m, &c, NULL), RK_OK);
    assert_int_equal(rk_pred_save(m, MODEL, NULL), RK_OK);
    assert_int_equal(rk_pred_load(&back, MODEL, NULL), RK_OK);
    assert_int_equal(rk_pred_config_of(back)->horizon_min, 90);
    rk_pred_free(back);
    rk_pred_free(m);
    c.horizon_min = 0; /* unstated: not written, read as the old trainer's 60 */
    assert_int_equal(rk_pred_create(&m, &c, NULL), RK_OK);
    assert_int_equal(rk_pred_save(m, MODEL, NULL), RK_OK);
    assert_int_equal(rk_pred_load(&back, MODEL, NULL), RK_OK);
    assert_int_equal(rk_pred_config_of(back)->horizon_min, RK_PRED_HORIZON_UNRECORDED);
    rk_pred_free(back);
    rk_pred_free(m);
    c.horizon_min = RK_PRED_MAX_HORIZON + 1;
    assert_int_equal(rk_pred_create(&m, &c, NULL), RK_EINVAL);
    remove(MODEL);
}

/* rk run's gate on the step clock (sim_step_s): the readings are a function of the job's
 * steps, not of when the samples happen. Two gates over the same simulated fleet, one
 * sampled at every step, the other at uneven strides (as a loaded machine samples: 1, 7, 50,
 * 3, ... steps apart), agree on every device's latest score at each common point, and the
 * worst score each saw over the same span is the same (a dip between two samples of the slow
 * one is not lost). */
static void step_clock_reads_by_steps_not_by_samples(void **state)
{
    (void)state;
    rk_sup_opts so;
    memset(&so, 0, sizeof so);
    so.health = "sim";
    so.health_sim_gpus = 5;
    so.health_seed = 40;
    so.health_age_h = 8000;
    so.health_time_scale = 60;
    so.sim_step_s = 1800;
    so.health_sim_load = RK_SIM_LOAD_BUSY;
    so.health_sim_sensors = true;
    so.health_threshold = 60;
    rk_err err = {0};
    rk_gate *every, *uneven;
    assert_int_equal(rk_gate_open(&every, &so, &err), RK_OK);
    assert_int_equal(rk_gate_open(&uneven, &so, &err), RK_OK);
    static const int stride[] = {1, 7, 50, 3, 120, 2, 33};
    int worst_every[5], below = 0;
    for (int i = 0; i < 5; i++)
        worst_every[i] = 101;
    int next = 0, k = 0;
    for (int64_t s = 0; s <= 600; s++) {
        rk_gate_set_progress(every, s);
        assert_int_equal(rk_gate_sample(every, &err), RK_OK);
        for (int i = 0; i < 5; i++) {
            char id[4];
            int sc;
            double p;
            snprintf(id, sizeof id, "%d", i);
            assert_int_equal(rk_gate_take_worst(every, id, &sc, &p, NULL, 0), 0);
            if (sc < worst_every[i])
                worst_every[i] = sc;
        }
        if (s != next)
            continue;
        rk_gate_set_progress(uneven, s);
        assert_int_equal(rk_gate_sample(uneven, &err), RK_OK);
        for (int i = 0; i < 5; i++) {
            char id[4], why[200];
            int sc;
            double p;
            snprintf(id, sizeof id, "%d", i);
            assert_int_equal(rk_gate_score(uneven, id, why, sizeof why),
                             rk_gate_score(every, id, why, sizeof why));
            assert_int_equal(rk_gate_take_worst(uneven, id, &sc, &p, why, sizeof why), 0);
            assert_int_equal(sc, worst_every[i]); /* the same span's worst */
            below += sc < so.health_threshold;
            worst_every[i] = 101;
        }
        next = s + stride[k++ % (int)(sizeof stride / sizeof *stride)];
    }
    assert_true(below > 0); /* the fleet does dip below the threshold in these steps */
    rk_gate_close(every);
    rk_gate_close(uneven);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_path_gives_the_same_scores),
        cmocka_unit_test(step_clock_reads_by_steps_not_by_samples),
        cmocka_unit_test(failed_readings_and_probabilities),
        cmocka_unit_test(models_record_their_horizon),
        cmocka_unit_test(burn_verdicts_follow_the_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
