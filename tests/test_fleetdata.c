/*
 * Tests for the fleet datasets (predict/fleetdata.h): each GPU's history holds exactly what
 * the whole simulated fleet reports for it, read once a minute (values, valid bits, counter
 * increments); a GPU that falls off the bus ends its history at the minute of its logged
 * failure, which the manifest and the file's metadata give; the same options give the same
 * bytes; the split is by device, stratified by failure, and every device is in one split;
 * with a span, each failure lies inside its history, which starts where the manifest says,
 * and the stored health scores are the readings' scores;
 * bad options are refused and leave nothing behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "health/sim.h"
#include "predict/fleetdata.h"
#include "rekindle/fileio.h"
#include "rekindle/health.h"
#include "rekindle/safetensors.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_fleetdata")

static void sub(char *buf, size_t cap, const char *a, const char *b)
{
    int n = snprintf(buf, cap, "%s/%s%s%s", g_dir, a, b ? "/" : "", b ? b : "");
    assert_true(n > 0 && (size_t)n < cap);
}

static rk_fleet_data_opts opts(const char *dir, int gpus, double hours, uint64_t seed, double age)
{
    rk_fleet_data_opts o;
    rk_fleet_data_opts_default(&o);
    o.dir = dir;
    o.gpus = gpus;
    o.hours = hours;
    o.seed = seed;
    o.start_age_h = age;
    return o;
}

static void test_history_matches_fleet(void **state)
{
    (void)state;
    enum { N = 4, HOURS = 12 };
    char dir[600], path[700];
    sub(dir, sizeof dir, "a", NULL);
    rk_fleet_data_opts o = opts(dir, N, HOURS, 3, 30000);
    rk_fleet_data_report r;
    rk_err err = {0};
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_OK);
    assert_int_equal(r.gpus, N);
    assert_int_equal(r.steps, N * HOURS * 60);

    /* The whole fleet, read every minute as the dataset is. */
    rk_telemetry_opts to = RK_TELEMETRY_OPTS_DEFAULT;
    to.sim_gpus = N;
    to.seed = 3;
    to.start_age_h = 30000;
    to.sim_load = RK_SIM_LOAD_BUSY; /* as the dataset builder runs it */
    to.sim_sensors = true;
    rk_sim *st;
    assert_int_equal(rk_sim_open(&st, &to, &err), RK_OK);
    rk_st_file f[N];
    for (int i = 0; i < N; i++) {
        snprintf(path, sizeof path, "%s/gpu-%04d.safetensors", dir, i);
        assert_int_equal(rk_st_read(path, &f[i], &err), RK_OK);
        assert_string_equal(rk_st_meta(&f[i], "format"), "rekindle-fleet-history");
        assert_string_equal(rk_st_meta(&f[i], "simulated"), "true");
        const rk_st_tensor *x = rk_st_find(&f[i], "x"), *v = rk_st_find(&f[i], "valid");
        assert_non_null(x);
        assert_non_null(v);
        assert_int_equal(x->shape[0], HOURS * 60);
        assert_int_equal(x->shape[1], RK_FLEET_FEATURES);
        assert_string_equal(v->dtype, "U8");
    }
    rk_gpu_sample prev[N];
    int ecc_cards = 0;
    for (int m = 0; m < HOURS * 60; m++) {
        assert_int_equal(rk_sim_set_time(st, (m + 1) * 60.0), RK_OK);
        for (int i = 0; i < N; i++) {
            rk_gpu_sample s;
            assert_int_equal(rk_sim_read(st, i, &s, &err), RK_OK);
            float x[RK_FLEET_FEATURES];
            uint8_t v[RK_FLEET_FEATURES];
            const rk_st_tensor *tx = rk_st_find(&f[i], "x"), *tv = rk_st_find(&f[i], "valid");
            memcpy(x, tx->data + (size_t)m * sizeof x, sizeof x);
            memcpy(v, tv->data + (size_t)m * sizeof v, sizeof v);
            assert_int_equal(v[0], rk_field_valid(&s, RK_F_TEMP));
            assert_true(x[0] == (float)s.temp_c);
            assert_int_equal(v[1], rk_field_valid(&s, RK_F_FAN));
            assert_true(x[1] == (v[1] ? (float)s.fan_pct : 0.0f));
            assert_true(x[10] == (float)s.vrm_ripple_mv);
            assert_int_equal(v[6], rk_field_valid(&s, RK_F_ECC_CORRECTED));
            ecc_cards += m == 0 && v[6];
            if (m > 0) {
                assert_true(x[8] == (float)(s.pcie_replay - prev[i].pcie_replay));
                if (v[6])
                    assert_true(x[6] == (float)(s.ecc_corrected - prev[i].ecc_corrected));
            } else {
                assert_true(x[8] == 0.0f); /* no increment before the first minute */
            }
            prev[i] = s;
        }
    }
    rk_sim_close(st);
    for (int i = 0; i < N; i++)
        rk_st_free(&f[i]);
    print_message("%d of %d GPUs report ECC\n", ecc_cards, N);

    /* The same options give the same bytes. */
    char dir2[600];
    sub(dir2, sizeof dir2, "b", NULL);
    o.dir = dir2;
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_OK);
    const char *files[] = {"fleet.json", "events.jsonl", "gpu-0000.safetensors",
                           "gpu-0003.safetensors"};
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        uint8_t *a, *b;
        size_t la, lb;
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        assert_int_equal(rk_file_read_all(path, &a, &la, SIZE_MAX, &err), RK_OK);
        snprintf(path, sizeof path, "%s/%s", dir2, files[k]);
        assert_int_equal(rk_file_read_all(path, &b, &lb, SIZE_MAX, &err), RK_OK);
        assert_int_equal(la, lb);
        assert_memory_equal(a, b, la);
        free(a);
        free(b);
    }
}

/* A fleet of n GPUs with seed and age in which some GPU is drawn to fall off the bus within
 * `within` hours: its index, or -1. */
static int early_off_bus(uint64_t seed, int n, double age, double within, double *hours)
{
    for (int i = 0; i < n; i++) {
        const char *ev = NULL;
        double h = rk_sim_lifetime_hours(seed, i, NULL, age, &ev);
        if (ev && strcmp(ev, "off_bus") == 0 && h > 1 && h < within) {
            *hours = h;
            return i;
        }
    }
    return -1;
}

static void test_failure_ends_history(void **state)
{
    (void)state;
    enum { N = 6 };
    const double age = 60000;
    uint64_t seed = 0;
    int gpu = -1;
    double fail_h = 0;
    for (uint64_t s = 1; s < 2000 && gpu < 0; s++)
        if ((gpu = early_off_bus(s, N, age, 40, &fail_h)) >= 0)
            seed = s;
    assert_true(gpu >= 0);
    char dir[600];
    sub(dir, sizeof dir, "f", NULL);
    rk_fleet_data_opts o = opts(dir, N, ceil(fail_h) + 2, seed, age);
    o.val_frac = 0.4;
    o.test_frac = 0.2;
    rk_fleet_data_report r;
    rk_err err = {0};
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_OK);
    assert_true(r.lost >= 1);

    char path[700];
    snprintf(path, sizeof path, "%s/fleet.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    assert_non_null(j);
    assert_true(json_is_true(json_object_get(j, "simulated")));
    assert_int_equal(json_array_size(json_object_get(j, "features")), RK_FLEET_FEATURES);
    json_t *devs = json_object_get(j, "devices");
    assert_int_equal(json_array_size(devs), N);
    int per_split[3] = {0}, failed = 0;
    for (int i = 0; i < N; i++) {
        json_t *d = json_array_get(devs, (size_t)i);
        const char *split = json_string_value(json_object_get(d, "split"));
        assert_non_null(split);
        per_split[strcmp(split, "train") == 0 ? 0 : strcmp(split, "val") == 0 ? 1 : 2]++;
        json_t *fl = json_object_get(d, "failure");
        failed += !json_is_null(fl);
        if (i != gpu)
            continue;
        /* The drawn failure, logged, ends the history at its minute. */
        assert_false(json_is_null(fl));
        assert_string_equal(json_string_value(json_object_get(fl, "event")), "off_bus");
        json_int_t minute = json_integer_value(json_object_get(fl, "minute"));
        assert_true(fabs((double)minute - fail_h * 60.0) <= 1.0);
        assert_true(json_is_true(json_object_get(d, "lost")));
        assert_int_equal(json_integer_value(json_object_get(d, "steps")), minute);
        rk_st_file f;
        snprintf(path, sizeof path, "%s/gpu-%04d.safetensors", dir, i);
        assert_int_equal(rk_st_read(path, &f, &err), RK_OK);
        assert_int_equal(rk_st_find(&f, "x")->shape[0], minute);
        assert_int_equal(strtoll(rk_st_meta(&f, "failure_minute"), NULL, 10), minute);
        assert_string_equal(rk_st_meta(&f, "failure_event"), "off_bus");
        rk_st_free(&f);
    }
    /* Every device in one split; the shares drawn among failed and healthy devices apart. */
    assert_int_equal(per_split[0] + per_split[1] + per_split[2], N);
    assert_int_equal(per_split[0], r.devices[0]);
    assert_int_equal(r.failed[0] + r.failed[1] + r.failed[2], failed);
    int healthy = N - failed;
    assert_int_equal(r.devices[2] - r.failed[2], (int)lround(healthy * 0.2));
    assert_int_equal(r.devices[1] - r.failed[1], (int)lround(healthy * 0.4));
    json_decref(j);
}

/* With a span longer than the histories: every GPU that fails within the span has the stretch
 * that holds its first failure (at least 6 hours in), warning signs no later than it; a
 * history is what the fleet reports at minutes start_minute + 1, + 2, ...; the health score of
 * each minute is rk_health_score of that reading over the last six. */
static void test_span_keeps_each_failure_inside_its_history(void **state)
{
    (void)state;
    enum { N = 12, HOURS = 8 };
    char dir[600], path[700];
    sub(dir, sizeof dir, "s", NULL);
    rk_fleet_data_opts o = opts(dir, N, HOURS, 4, 20000);
    o.span_h = 20000;
    rk_fleet_data_report r;
    rk_err err = {0};
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_OK);
    snprintf(path, sizeof path, "%s/fleet.json", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    assert_non_null(j);
    assert_true(json_real_value(json_object_get(j, "span_h")) == 20000.0);
    json_t *devs = json_object_get(j, "devices");
    int failed = 0, checked = 0;
    for (int i = 0; i < N; i++) {
        json_t *d = json_array_get(devs, (size_t)i), *fl = json_object_get(d, "failure");
        json_int_t start = json_integer_value(json_object_get(d, "start_minute"));
        json_int_t steps = json_integer_value(json_object_get(d, "steps"));
        assert_true(start >= 0 && start + steps <= 20000 * 60 + HOURS * 60);
        if (!json_is_null(fl)) {
            failed++;
            json_int_t m = json_integer_value(json_object_get(fl, "minute"));
            assert_true(m >= HOURS * 60 / 2 && m <= steps); /* 6 h in, or half of shorter */
            json_t *pm = json_object_get(fl, "precursor_minute");
            assert_true(json_is_null(pm) || json_integer_value(pm) <= m);
        } else {
            assert_int_equal(steps, HOURS * 60);
        }
        if (checked >= 2 || (checked == 1 && json_is_null(fl)))
            continue;
        /* the first 30 minutes again, from a fleet of the same seed and size read by hand */
        rk_telemetry_opts to = RK_TELEMETRY_OPTS_DEFAULT;
        to.sim_gpus = N;
        to.seed = 4;
        to.start_age_h = 20000;
        to.sim_load = RK_SIM_LOAD_BUSY;
        to.sim_sensors = true;
        rk_sim *st;
        assert_int_equal(rk_sim_open(&st, &to, &err), RK_OK);
        rk_st_file f;
        snprintf(path, sizeof path, "%s/gpu-%04d.safetensors", dir, i);
        assert_int_equal(rk_st_read(path, &f, &err), RK_OK);
        assert_int_equal(strtoll(rk_st_meta(&f, "start_minute"), NULL, 10), start);
        const rk_st_tensor *tx = rk_st_find(&f, "x"), *ts = rk_st_find(&f, "score");
        assert_non_null(ts);
        assert_int_equal(ts->shape[0], steps);
        rk_gpu_history h;
        assert_int_equal(rk_history_init(&h, 6, &err), RK_OK);
        rk_gpu_sample s, prev;
        for (int m = 0; m < 30 && m < steps; m++) {
            assert_int_equal(rk_sim_set_time(st, (double)(start + m + 1) * 60.0), RK_OK);
            assert_int_equal(rk_sim_read(st, i, &s, &err), RK_OK);
            float x[RK_FLEET_FEATURES], want[RK_FLEET_FEATURES], sc;
            uint8_t v[RK_FLEET_FEATURES];
            rk_fleet_features(&s, m ? &prev : NULL, want, v);
            memcpy(x, tx->data + (size_t)m * sizeof x, sizeof x);
            assert_memory_equal(x, want, sizeof x);
            rk_history_push(&h, &s);
            rk_gpu_signals sig;
            rk_signals_compute(&h, &sig);
            memcpy(&sc, ts->data + (size_t)m * sizeof sc, sizeof sc);
            assert_true(sc == (float)rk_health_score(&s, &sig, NULL, NULL));
            prev = s;
        }
        rk_history_free(&h);
        rk_st_free(&f);
        rk_sim_close(st);
        checked++;
    }
    print_message("%d of %d GPUs fail within the span\n", failed, N);
    assert_true(failed >= 2 && failed < N);
    assert_int_equal(failed, r.failed[0] + r.failed[1] + r.failed[2]);
    assert_int_equal(checked, 2);
    json_decref(j);
    /* a span shorter than the histories is refused */
    o.span_h = HOURS - 1;
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "span"));
}

static void test_bad_options(void **state)
{
    (void)state;
    char dir[600];
    sub(dir, sizeof dir, "bad", NULL);
    rk_fleet_data_report r;
    rk_err err = {0};
    rk_fleet_data_opts o = opts(dir, 0, 10, 1, 0);
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "GPUs"));
    o = opts(dir, 2, 0, 1, 0);
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "hours"));
    o = opts(dir, 2, 1, 1, 0);
    o.val_frac = 0.5;
    o.test_frac = 0.5;
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "training"));
    struct stat sb;
    assert_int_not_equal(stat(dir, &sb), 0); /* nothing created */
    /* A directory that cannot be made. */
    char file[600], under[700];
    sub(file, sizeof file, "plain", NULL);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(under, sizeof under, "%s/x", file);
    o = opts(under, 2, 1, 1, 0);
    assert_int_equal(rk_fleet_data_write(&o, &r, &err), RK_EIO);
    assert_non_null(strstr(err.msg, under));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_history_matches_fleet, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_ends_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_span_keeps_each_failure_inside_its_history, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_bad_options, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
