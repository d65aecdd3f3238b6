/*
 * Training and judging failure detectors on fleet datasets (issue 7, docs/predict.md, the
 * datasets of rekindle/fleetdata.h): load a dataset, draw labelled windows for training, the
 * logistic-regression baseline on window summaries, and the event-level evaluation of any
 * detector that gives a risk per GPU and minute (the predictor's probability, the baseline's,
 * 100 minus the health score).
 *
 * Labels: the window ending at minute m (rk_fleet_window) of a GPU whose failure is at step f
 * is positive when m < f <= m + horizon, negative otherwise.
 *
 * The event-level protocol (rk_fleet_evaluate): a detector watches each GPU of a split minute
 * by minute, as it would online, from the first minute with a full window (window - 1) until
 * the GPU's failure (or the end of its history): at minute m it alarms when risk[m] >=
 * threshold.
 *   - a failure is detected (a true positive) when an alarm fires within the horizon before
 *     it (f - horizon <= m < f); its lead time is f minus the first such alarm's minute;
 *   - an alarm with no failure within the horizon after it (no f with m < f <= m + horizon)
 *     is false; false alarms no more than `horizon` minutes apart are one episode, and each
 *     episode counts once. An episode that ends within the horizon before a failure's
 *     detection window is also counted apart as "early" (it is false all the same);
 *   - precision = detected / (detected + false alarm episodes), recall = detected / failures,
 *     F1 their harmonic mean; false alarms per GPU-day over the minutes watched; accuracy is
 *     the share of watched minutes whose alarm matches the label (reported only beside the
 *     others: failures are rare).
 */
#ifndef REKINDLE_FLEETEVAL_H
#define REKINDLE_FLEETEVAL_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/fleetdata.h"
#include "rekindle/predict.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { RK_FLEET_TRAIN = 0, RK_FLEET_VAL = 1, RK_FLEET_TEST = 2 };

typedef struct rk_fleet_gpu {
    int index, split; /* split: RK_FLEET_* */
    char uuid[96], profile[32], event[24];
    char file[64];  /* its history's file name in the dataset directory */
    size_t steps;
    long start_minute;
    long failure;   /* the step of its failure, -1: none */
    long precursor; /* the step by which its warning signs had begun, -1: none or silent */
    float *x;       /* steps x RK_FLEET_FEATURES, NULL when its split was not loaded */
    float *score;   /* steps health scores, NULL when not loaded */
} rk_fleet_gpu;

typedef struct rk_fleet {
    uint64_t seed;
    int gpus;
    double hours, span_h, start_age_h;
    rk_fleet_gpu *gpu; /* gpus entries, by index */
} rk_fleet;

/* Read DIR/fleet.json and the histories of the GPUs whose split is in `splits` (a mask of
 * 1 << RK_FLEET_*). RK_ENOENT naming the file when a file is missing; RK_EFORMAT naming the
 * file and problem for anything malformed (another format, a shape that disagrees with the
 * manifest, a non-finite value, a failure outside the history). On failure *f is empty. */
int rk_fleet_load(rk_fleet *f, const char *dir, unsigned splits, rk_err *err);
/* The manifest alone (len bytes of fleet.json's text, `name` for errors): every GPU's metadata,
 * no history. The same checks and errors as rk_fleet_load. */
int rk_fleet_parse_manifest(rk_fleet *f, const char *text, size_t len, const char *name,
                            rk_err *err);
void rk_fleet_free(rk_fleet *f);

/* 1 when the window ending at minute m is positive (m < failure <= m + horizon), else 0. */
int rk_fleet_label(const rk_fleet_gpu *g, size_t m, int horizon);
/* The end of the minutes a detector watches: min(steps, failure) (a GPU is out of service
 * from its failure on). */
size_t rk_fleet_watch_end(const rk_fleet_gpu *g);

/* ---- training windows --------------------------------------------------------------------- */

typedef struct rk_fleet_sample_opts {
    int window, horizon;
    int near;         /* negative windows ending in the `near` minutes before a failure's
                         positive ones (default 2 x horizon: where timing is learnt)... */
    int near_step;    /* ...every near_step-th of them, counting back from the last (default 2:
                         neighbouring windows differ by one row) */
    double neg_ratio; /* and negatives drawn at random among all other minutes, this many per
                         positive (default 1) */
    uint64_t seed;
} rk_fleet_sample_opts;

#define RK_FLEET_SAMPLE_OPTS_DEFAULT                                                               \
    {                                                                                              \
        60, 60, 120, 2, 1.0, 1                                                                     \
    }

typedef struct rk_fleet_windows {
    size_t n, positives;
    float *x; /* n x window x RK_FLEET_FEATURES (rk_fleet_window) */
    float *y; /* n labels, 0 or 1 */
} rk_fleet_windows;

/* Labelled windows of the GPUs of `split`: every positive window, the near negatives (every
 * near_step-th), and the random negatives, in GPU then minute order. Deterministic in the seed.
 * RK_EINVAL for bad options or a split with no positive window; RK_ENOMEM. */
int rk_fleet_sample(const rk_fleet *f, int split, const rk_fleet_sample_opts *o,
                    rk_fleet_windows *out, rk_err *err);
void rk_fleet_windows_free(rk_fleet_windows *w);

/* Hard negatives: append to w the k windows of `split` that a first detector rated riskiest
 * (risk as rk_fleet_risk_*) among the negatives outside the near band (the minutes the random
 * negatives are drawn from), riskiest first (ties: GPU then minute order). Fewer when fewer
 * exist. RK_ENOMEM. */
int rk_fleet_mine(const rk_fleet *f, int split, const rk_fleet_sample_opts *o, float *const *risk,
                  size_t k, rk_fleet_windows *w, rk_err *err);

/* Average precision of scores p against labels y (0 or 1) over n windows: the mean, over the
 * positives, of the precision among the windows scored at least as high (ties broken by
 * index). 0 when there is no positive. The predictor's training judges epochs by it on the
 * validation windows (rk_pred_train_opts.val_score). */
double rk_fleet_average_precision(const float *p, const float *y, size_t n);

/* ---- the logistic-regression baseline ------------------------------------------------------- */

/* Summary of a window (T rows of RK_FLEET_FEATURES): per feature its last value, mean, slope
 * (least squares, per minute) and maximum; out[k * F + j] for k = 0 last, 1 mean, 2 slope,
 * 3 max. */
#define RK_FLEET_SUMMARY (4 * RK_FLEET_FEATURES)
void rk_fleet_summary(const float *window, int T, float *out);

typedef struct rk_logreg {
    int d;
    float *mean, *std, *w; /* d each: inputs standardised with the training set's statistics */
    float b;
} rk_logreg;

typedef struct rk_logreg_opts {
    int max_epochs, batch, patience;
    float lr, l2;
    float pos_weight; /* 0: negatives / positives of the training set */
    uint64_t seed;
} rk_logreg_opts;

#define RK_LOGREG_OPTS_DEFAULT                                                                     \
    {                                                                                              \
        200, 256, 10, 0.01f, 1e-4f, 0.0f, 1                                                        \
    }

/* Fit on n rows of d inputs (x row-major, y 0 or 1) by Adam on the class-weighted
 * cross-entropy plus l2 / 2 |w|^2, stopping early on the validation rows (nv may be 0) and
 * keeping the best epoch's weights. RK_EINVAL for bad options or data; RK_ENOMEM. */
int rk_logreg_train(rk_logreg *m, int d, const float *x, const float *y, size_t n, const float *xv,
                    const float *yv, size_t nv, const rk_logreg_opts *o, rk_err *err);
double rk_logreg_prob(const rk_logreg *m, const float *x);
void rk_logreg_free(rk_logreg *m);

/* ---- the detectors file ------------------------------------------------------------------- */

/* What rk predict train writes beside MODEL as MODEL.json: the window and horizon it trained
 * for, the predictor's threshold and the logistic-regression baseline with its two thresholds
 * (the predictor's rule, and its own best validation F1), all chosen on the val split. */
typedef struct rk_fleet_detectors {
    int window, horizon;
    double threshold;
    double lr_threshold, lr_threshold_best_f1;
    rk_logreg lr;
} rk_fleet_detectors;

/* Read MODEL.json (RK_ENOENT when missing; RK_EFORMAT naming the problem: another format, a
 * window or horizon out of range, a weight that is not a finite float, a std that is not > 0).
 * On failure *d is empty. */
int rk_fleet_detectors_load(rk_fleet_detectors *d, const char *path, rk_err *err);
/* The same from len bytes of text (`name` for errors). */
int rk_fleet_detectors_parse(rk_fleet_detectors *d, const char *text, size_t len,
                             const char *name, rk_err *err);
void rk_fleet_detectors_free(rk_fleet_detectors *d);

/* ---- risks and the event-level evaluation ------------------------------------------------- */

/* Per GPU of `split`, a risk for every step (NAN where the detector does not decide: before
 * the first full window and from the watch end on); other GPUs get NULL. *out holds f->gpus
 * pointers; free with rk_fleet_risk_free. */
int rk_fleet_risk_model(const rk_fleet *f, int split, const rk_pred_model *m, float ***out,
                        rk_err *err);
int rk_fleet_risk_logreg(const rk_fleet *f, int split, const rk_logreg *m, int window, float ***out,
                         rk_err *err);
/* 100 minus the health score of each minute's reading: alarming at risk > 100 - s is alarming
 * at a score below s. Decides from the same minutes as a window detector of `window`. */
int rk_fleet_risk_score(const rk_fleet *f, int split, int window, float ***out, rk_err *err);
void rk_fleet_risk_free(const rk_fleet *f, float **risk);

typedef struct rk_fleet_metrics {
    double threshold;
    int gpus;        /* GPUs watched */
    double gpu_days; /* minutes watched / 1440 */
    size_t minutes, positive_minutes;
    int failures, detected, false_alarms, early_alarms;
    int silent, silent_detected; /* failures without warning signs (precursor -1) */
    double precision, recall, f1;
    double lead_mean, lead_median; /* minutes, over detected failures (0 when none) */
    double false_alarms_per_gpu_day;
    double accuracy;
} rk_fleet_metrics;

/* Judge alarms at risk >= threshold on the GPUs of `split` (docs above). RK_EINVAL for a
 * bad window or horizon or a split with nothing to watch. */
int rk_fleet_evaluate(const rk_fleet *f, int split, float *const *risk, int window, int horizon,
                      double threshold, rk_fleet_metrics *out, rk_err *err);

/* The threshold among cands[0..n) with the best F1 on `split` (ties: the higher precision,
 * then the higher threshold) among those whose mean lead time is at least min_lead minutes
 * (0: all of them; when none is, among all), and its metrics. */
int rk_fleet_pick_threshold(const rk_fleet *f, int split, float *const *risk, int window,
                            int horizon, const double *cands, int n, double min_lead,
                            rk_fleet_metrics *best, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
