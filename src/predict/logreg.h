/*
 * The logistic-regression baseline of the failure predictor (docs/predict.md): a linear model
 * on standardised inputs (the window summaries of predict/windows.h, RK_FLEET_SUMMARY of them),
 * fitted by Adam on the class-weighted cross-entropy. Deterministic in its seed.
 */
#ifndef RK_PREDICT_LOGREG_H
#define RK_PREDICT_LOGREG_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

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
/* The probability of row x (d inputs), in [0, 1]: in double, so that any finite float weights
 * and std > 0 keep it a number. */
double rk_logreg_prob(const rk_logreg *m, const float *x);
void rk_logreg_free(rk_logreg *m);

#endif
