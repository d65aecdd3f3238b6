/*
 * Labelled windows of a fleet dataset (docs/predict.md, predict/fleetdata.h): the labels, the
 * minutes a detector watches, the training windows (positives, near, random and hard
 * negatives) and the window summaries the logistic-regression baseline reads. Windows are
 * made by rk_fleet_window (fleetdata.c), the same function the online code uses.
 *
 * Labels: the window ending at minute m (rk_fleet_window) of a GPU whose failure is at step f
 * is positive when m < f <= m + horizon, negative otherwise.
 */
#ifndef RK_PREDICT_WINDOWS_H
#define RK_PREDICT_WINDOWS_H

#include <stddef.h>
#include <stdint.h>

#include "predict/fleetdata.h"
#include "rekindle/error.h"

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
 * (risk as rk_fleet_risk_*, predict/fleeteval.h) among the negatives outside the near band
 * (the minutes the random negatives are drawn from), riskiest first (ties: GPU then minute
 * order). Fewer when fewer exist. RK_ENOMEM. */
int rk_fleet_mine(const rk_fleet *f, int split, const rk_fleet_sample_opts *o, float *const *risk,
                  size_t k, rk_fleet_windows *w, rk_err *err);

/* ---- window summaries ----------------------------------------------------------------------- */

/* Summary of a window (T rows of RK_FLEET_FEATURES): per feature its last value, mean, slope
 * (least squares, per minute) and maximum; out[k * F + j] for k = 0 last, 1 mean, 2 slope,
 * 3 max. */
#define RK_FLEET_SUMMARY (4 * RK_FLEET_FEATURES)
void rk_fleet_summary(const float *window, int T, float *out);
/* The summaries of all of w's windows (w->n x RK_FLEET_SUMMARY floats, malloc'd; NULL when out
 * of memory). */
float *rk_fleet_summaries(const rk_fleet_windows *w, int T);
/* The name of summary input k ("last:temp", ..., "max:fan_vibration") into buf. */
void rk_fleet_summary_name(int k, char *buf, size_t cap);

#endif
