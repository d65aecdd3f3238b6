/*
 * mkmodel: write an untrained failure predictor for tests (it_exporter_predict.sh) and
 * measurements: a classification model over RK_FLEET_FEATURES features with seeded weights,
 * its normalisation fitted on minute rows of a small simulated fleet (rk_fleet_features of
 * readings a simulated minute apart), so that live readings give it inputs of a sensible size.
 * Its probabilities mean nothing; their range and where they appear are what tests check.
 *
 *   mkmodel OUT [WINDOW [HIDDEN [BIAS [TASK]]]]
 *
 * WINDOW minutes (default 5); HIDDEN LSTM units (default 8; attention and dense get half, so
 * 64 gives rk predict's default sizes); BIAS added to the output's bias (default 0; 6 makes
 * every probability about 0.99); TASK classify (default) or regress.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "health/sim.h"
#include "predict/fleetdata.h"
#include "predict/model.h"
#include "predict/predict.h"
#include "rekindle/health.h"

enum { GPUS = 4 };

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 6) {
        fprintf(stderr, "usage: mkmodel OUT [WINDOW [HIDDEN [BIAS [classify|regress]]]]\n");
        return 2;
    }
    rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
    c.features = RK_FLEET_FEATURES;
    c.window = argc > 2 ? atoi(argv[2]) : 5;
    c.hidden = argc > 3 ? atoi(argv[3]) : 8;
    c.attn = c.dense = c.hidden > 1 ? c.hidden / 2 : 1;
    c.task = argc > 5 && strcmp(argv[5], "regress") == 0 ? RK_PRED_REGRESS : RK_PRED_CLASSIFY;
    c.seed = 1;
    rk_err err = {0};
    rk_pred_model *m = NULL;
    if (rk_pred_create(&m, &c, &err)) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return 2;
    }
    if (argc > 4)
        m->p[m->t[RK_PT_B2].offset] += (float)atof(argv[4]);

    /* 2 T minutes of each GPU of a worn simulated fleet: T + 1 windows per GPU */
    int minutes = 2 * c.window, per = minutes - c.window + 1;
    size_t n = (size_t)GPUS * (size_t)per;
    float *rows = malloc(sizeof(float) * (size_t)minutes * RK_FLEET_FEATURES);
    float *x = malloc(sizeof(float) * n * (size_t)c.window * RK_FLEET_FEATURES);
    float *y = calloc(n, sizeof(float));
    rk_telemetry_opts to = RK_TELEMETRY_OPTS_DEFAULT;
    to.sim_gpus = GPUS;
    to.seed = 1;
    to.start_age_h = 20000;
    to.sim_load = RK_SIM_LOAD_BUSY; /* as the dataset builder runs the fleet (fleetdata.c) */
    to.sim_sensors = true;
    rk_sim *st = NULL;
    int rc = rows && x && y ? rk_sim_open(&st, &to, &err) : RK_ENOMEM;
    for (int g = 0; !rc && g < GPUS; g++) {
        rk_gpu_sample s, prev;
        for (int k = 0; k < minutes && !rc; k++) {
            if ((rc = rk_sim_set_time(st, 60.0 * (g * minutes + k + 1))) ||
                (rc = rk_sim_read(st, g, &s, &err)))
                break;
            if (s.lost) /* a lost reading: keep the previous minute's row */
                s = k ? prev : s;
            uint8_t v[RK_FLEET_FEATURES];
            rk_fleet_features(&s, k ? &prev : NULL, rows + (size_t)k * RK_FLEET_FEATURES, v);
            prev = s;
        }
        for (int w = 0; !rc && w < per; w++) {
            size_t k = (size_t)g * (size_t)per + (size_t)w;
            memcpy(x + k * (size_t)c.window * RK_FLEET_FEATURES,
                   rows + (size_t)w * RK_FLEET_FEATURES,
                   sizeof(float) * (size_t)c.window * RK_FLEET_FEATURES);
            y[k] = (float)(k % 2);
        }
    }
    if (st)
        rk_sim_close(st);
    rk_pred_data d = {n, x, y};
    if (!rc)
        rc = rk_pred_fit_norm(m, &d, &err);
    if (!rc)
        rc = rk_pred_save(m, argv[1], &err);
    if (rc)
        fprintf(stderr, "mkmodel: %s\n", err.msg[0] ? err.msg : rk_strerror(rc));
    free(rows);
    free(x);
    free(y);
    rk_pred_free(m);
    return rc ? 1 : 0;
}
