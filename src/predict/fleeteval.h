/*
 * Judging failure detectors on fleet datasets (docs/predict.md, predict/fleetdata.h): the
 * risks any detector gives per GPU and minute (the predictor's probability, the logistic
 * baseline's, 100 minus the health score), the event-level evaluation, the choice of
 * thresholds, and the average precision the predictor's training judges its epochs by.
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
#ifndef RK_PREDICT_FLEETEVAL_H
#define RK_PREDICT_FLEETEVAL_H

#include <jansson.h>
#include <stddef.h>

#include "predict/fleetdata.h"
#include "predict/logreg.h"
#include "predict/predict.h"
#include "rekindle/error.h"

/* Average precision of scores p against labels y (0 or 1) over n windows: the mean, over the
 * positives, of the precision among the windows scored at least as high (ties broken by
 * index). 0 when there is no positive. The predictor's training judges epochs by it on the
 * validation windows. */
double rk_fleet_average_precision(const float *p, const float *y, size_t n);

/* ---- risks -------------------------------------------------------------------------------- */

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

/* ---- the event-level evaluation ----------------------------------------------------------- */

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

/* The candidate thresholds of a probability: RK_FLEET_PROB_CANDS of them, the logistic of
 * -6 .. 16 by 0.1, into c. */
#define RK_FLEET_PROB_CANDS 221
void rk_fleet_prob_candidates(double *c);
/* The risk threshold (rk_fleet_risk_score) that alarms at a health score below `below`. */
double rk_fleet_score_threshold(int below);

/* The metrics as JSON (threshold, precision, recall, f1, lead_mean_min, lead_median_min,
 * false_alarms_per_gpu_day, accuracy, failures, detected, false_alarms, early_alarms, silent,
 * silent_detected): what rk predict eval --json and the detectors file show. NULL when out of
 * memory. */
json_t *rk_fleet_metrics_json(const rk_fleet_metrics *m);

#endif
