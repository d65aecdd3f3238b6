/*
 * The detectors file (docs/predict.md): what rk predict train writes beside MODEL as
 * MODEL.json and rk predict eval and rk run read back: the window and horizon the predictor
 * was trained for, its threshold, and the logistic-regression baseline with its two
 * thresholds (the predictor's rule, and its own best validation F1), all chosen on the val
 * split; beside them, for people, each detector's metrics on the val split and how training
 * ran. Written (rk_fleet_detectors_save) and read (rk_fleet_detectors_parse) here only.
 *
 * The file is JSON: format "rekindle-fleet-detectors", version 1, simulated, window, horizon,
 * min_lead, predictor {threshold, val}, logreg {threshold, threshold_best_f1, inputs, mean,
 * std, w, b, val, val_best_f1}, health_score {below, val}, training {dataset, seed, hidden,
 * attn, dense, near, negatives, hard, level_noise, dropout, max_epochs, patience, epochs,
 * best_epoch, val_ap, seconds}.
 */
#ifndef RK_PREDICT_DETECTORS_H
#define RK_PREDICT_DETECTORS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "predict/fleeteval.h"
#include "predict/logreg.h"
#include "rekindle/error.h"

/* The detectors a file judges, in the order of rk_fleet_detectors.val (and of rk predict
 * eval's rows). */
enum {
    RK_FLEET_DET_PREDICTOR,      /* the LSTM + attention at `threshold` */
    RK_FLEET_DET_LOGREG,         /* the baseline at lr_threshold (the predictor's rule) */
    RK_FLEET_DET_HEALTH,         /* a health score below health_below */
    RK_FLEET_DET_LOGREG_BEST_F1, /* the baseline at lr_threshold_best_f1 */
    RK_FLEET_DETECTORS
};

/* How the predictor was trained (the file's "training"; written, not read back). */
typedef struct rk_fleet_training {
    const char *dataset; /* the dataset directory (borrowed) */
    uint64_t seed;
    int hidden, attn, dense, near, max_epochs, patience;
    double negatives, hard, level_noise, dropout;
    int epochs, best_epoch;
    double val_ap;  /* the predictor's average precision on the val windows at its best epoch */
    double seconds; /* training's wall-clock time, dataset loaded to file written */
} rk_fleet_training;

typedef struct rk_fleet_detectors {
    int window, horizon;
    double threshold;
    double lr_threshold, lr_threshold_best_f1;
    rk_logreg lr; /* RK_FLEET_SUMMARY inputs (predict/windows.h) */
    /* Written by rk_fleet_detectors_save; the parser leaves them zero. */
    double min_lead; /* the mean lead (minutes) the thresholds were held to */
    int health_below;
    rk_fleet_metrics val[RK_FLEET_DETECTORS];
    rk_fleet_training training;
} rk_fleet_detectors;

/* The path of MODEL's detectors file, "MODEL.json" (malloc'd; NULL when out of memory). */
char *rk_fleet_detectors_path(const char *model);

/* The file's JSON object (NULL when out of memory). */
json_t *rk_fleet_detectors_json(const rk_fleet_detectors *d);
/* Write it to path atomically (rekindle/fileio.h). RK_EINVAL unless d->lr has
 * RK_FLEET_SUMMARY inputs; RK_ENOMEM; RK_EIO naming the path. */
int rk_fleet_detectors_save(const rk_fleet_detectors *d, const char *path, rk_err *err);

/* Read MODEL.json (RK_ENOENT when missing; RK_EFORMAT naming the problem: another format, a
 * window or horizon out of range, a weight that is not a finite float, a std that is not > 0).
 * On failure *d is empty. */
int rk_fleet_detectors_load(rk_fleet_detectors *d, const char *path, rk_err *err);
/* The same from len bytes of text (`name` for errors). */
int rk_fleet_detectors_parse(rk_fleet_detectors *d, const char *text, size_t len, const char *name,
                             rk_err *err);
void rk_fleet_detectors_free(rk_fleet_detectors *d);

#endif
