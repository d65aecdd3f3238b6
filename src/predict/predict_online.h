/*
 * Live failure prediction (docs/predict.md): one rolling window per GPU of one
 * feature row a minute, turned from readings exactly as the training data was
 * (rk_fleet_features of the minute's reading against the previous minute's), and the model's
 * probability that the GPU fails within its horizon. Used by rk run's drain, rk exporter and
 * rk doctor.
 *
 * Minutes: a reading taken at t seconds (simulated seconds for the simulator, any monotonic
 * clock otherwise) belongs to minute floor(t / 60). The first reading of a minute later than
 * the last one counted becomes that minute's row; further readings in the same minute are
 * ignored (the dataset reads once a minute). A gap of several minutes adds one row, so feed
 * at least once a minute. A lost GPU's reading resets its window; a failed read (not lost,
 * nothing valid: rk_monitor_read_failed) is no reading and is ignored.
 *
 * Not thread-safe: one caller feeds and reads a set of windows (the model it borrows may be
 * shared, rk_pred_predict only reads it).
 */
#ifndef REKINDLE_PREDICT_ONLINE_H
#define REKINDLE_PREDICT_ONLINE_H

#include <stddef.h>

#include "predict/predict.h"
#include "rekindle/error.h"
#include "rekindle/monitor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct rk_gpu_sample;
typedef struct rk_pred_online rk_pred_online;

/* Windows for `gpus` GPUs, for a classification model over RK_FLEET_FEATURES features (the
 * model is borrowed: it must outlive the windows). RK_EINVAL (naming what) for a regression
 * model or another feature count. */
int rk_pred_online_create(rk_pred_online **out, const rk_pred_model *m, int gpus, rk_err *err);
void rk_pred_online_free(rk_pred_online *o);

/* Feed GPU i's reading taken at t_s. Returns 1 when it added a minute row (and the GPU's
 * probability was recomputed once the window is full), 0 when it did not (same minute, a lost
 * GPU, a failed read), RK_EINVAL for a bad index, a time that is negative or not finite, or a
 * time before the last reading's minute (nothing changes then); the errors of rk_pred_predict
 * (the row is kept, the probability is the previous one). */
int rk_pred_online_push(rk_pred_online *o, int gpu, double t_s, const struct rk_gpu_sample *s,
                        rk_err *err);

/* The latest probability of GPU i failing within the model's horizon, in [0, 1]; -1 until
 * the window has been full once (T minutes seen since the start or the last reset). */
double rk_pred_online_prob(const rk_pred_online *o, int gpu);

/* Minutes seen in GPU i's current window (0..T). */
int rk_pred_online_minutes(const rk_pred_online *o, int gpu);

/* What the model's probability is about, minutes (rk_pred_config.horizon_min as the model
 * file recorded it; 0: unstated). */
double rk_pred_online_horizon_min(const rk_pred_online *o);

/* The windows as the health monitor's predictor (rekindle/monitor.h): push feeds a reading
 * (rk_pred_online_push) and gives the GPU's probability; the horizon is the model's. The
 * windows must have as many GPUs as the monitor and outlive it. */
void rk_pred_online_monitor(rk_pred_online *o, rk_monitor_predictor *out);

#ifdef __cplusplus
}
#endif
#endif
