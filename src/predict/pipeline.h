/*
 * The fleet pipelines of rk predict train and rk predict eval (docs/predict.md), each one
 * call: a dataset of predict/fleetdata.h in, a model (predict/predict.h) and its detectors
 * file (predict/detectors.h) out, or the held-out split's metrics of all four detectors.
 * Deterministic in the seed: the same options give the same model and thresholds.
 */
#ifndef RK_PREDICT_PIPELINE_H
#define RK_PREDICT_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "predict/detectors.h"
#include "predict/fleeteval.h"
#include "predict/predict.h"
#include "predict/windows.h"
#include "rekindle/error.h"

/* One epoch of the predictor's training, judged by average precision on the val windows. */
typedef struct rk_fleet_epoch {
    int epoch;
    double train_loss; /* the mean weighted cross-entropy of the epoch */
    double val_ap;     /* average precision on the validation windows */
    bool best;         /* the best val_ap so far */
    double seconds;    /* since the predictor's training began */
} rk_fleet_epoch;

/* What rk_fleet_train has done so far, for progress lines. */
enum {
    RK_FLEET_STAGE_WINDOWS,  /* the training and validation windows are drawn */
    RK_FLEET_STAGE_PREDICTOR /* the predictor is trained */
};

struct rk_fleet_train_report;

typedef struct rk_fleet_train_opts {
    const char *dir; /* the dataset (rk predict dataset -o DIR) */
    const char *out; /* MODEL; its detectors file is MODEL.json */
    uint64_t seed;   /* weights, batches, windows and the baseline (default 1) */
    /* The predictor: window, hidden, attn, dense (features, task and seed are the pipeline's) */
    rk_pred_config model;
    /* Its training (defaults of rk predict train: 15 epochs, patience 3, dropout 0.2, level
     * noise 0.5; seed, on_epoch, ctx and val_score are the pipeline's) */
    rk_pred_train_opts train;
    /* The windows: horizon, near (< 0: 2 x horizon), near_step, neg_ratio (window and seed
     * are the pipeline's) */
    rk_fleet_sample_opts sample;
    double hard;     /* hard negatives per positive, mined by a first logistic regression on
                        the same windows (default 1; 0: none) */
    double min_lead; /* thresholds: the best val F1 with at least this mean lead, minutes
                        (default 35) */
    /* Called after each epoch of the predictor and after each stage (NULL: not called). */
    void (*on_epoch)(const rk_fleet_epoch *e, void *ctx);
    void (*on_stage)(int stage, const struct rk_fleet_train_report *r, void *ctx);
    void *ctx;
} rk_fleet_train_opts;

void rk_fleet_train_opts_default(rk_fleet_train_opts *o);

typedef struct rk_fleet_train_report {
    size_t train_windows, train_positives, val_windows, val_positives;
    double windows_seconds;   /* since the dataset was loaded, when the windows were drawn */
    double predictor_seconds; /* the predictor's training */
    /* What MODEL.json now holds: thresholds, baseline, val metrics, training record
     * (training.dataset points into the options' dir). */
    rk_fleet_detectors det;
} rk_fleet_train_report;

/* Load the train and val splits of o->dir; draw labelled windows (rk_fleet_sample) and hard
 * negatives (rk_fleet_mine); train the predictor, early-stopped on its average precision on
 * the val windows, and the logistic-regression baseline on the same windows; choose the
 * thresholds by event-level F1 on every minute of the val split (rk_fleet_pick_threshold);
 * write o->out (rk_pred_save) and MODEL.json (rk_fleet_detectors_save). The errors of those
 * steps, naming the file or problem; on failure *r is empty and nothing is written unless
 * the model was (then MODEL.json is not). Free r with rk_fleet_train_report_free. */
int rk_fleet_train(const rk_fleet_train_opts *o, rk_fleet_train_report *r, rk_err *err);
void rk_fleet_train_report_free(rk_fleet_train_report *r);

typedef struct rk_fleet_eval_opts {
    const char *dir;   /* the dataset */
    const char *model; /* MODEL, with MODEL.json beside it */
    int split;         /* RK_FLEET_TEST (default) or RK_FLEET_VAL */
    double threshold;  /* the predictor's; < 0 (default): MODEL.json's */
} rk_fleet_eval_opts;

void rk_fleet_eval_opts_default(rk_fleet_eval_opts *o);

typedef struct rk_fleet_eval_report {
    int window, horizon;
    rk_fleet_metrics m[RK_FLEET_DETECTORS]; /* by RK_FLEET_DET_* */
    double seconds;
} rk_fleet_eval_report;

/* Judge the four detectors of MODEL.json on o->split at their thresholds. RK_ENOENT or
 * RK_EFORMAT for a missing or malformed model, detectors file or dataset (a model whose
 * window differs from its detectors file's is malformed), the errors of rk_fleet_evaluate. */
int rk_fleet_eval(const rk_fleet_eval_opts *o, rk_fleet_eval_report *r, rk_err *err);

#endif
