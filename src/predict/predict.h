/*
 * The failure predictor (docs/design.md, `rk predict`, docs/predict.md): a sequence model
 * over a window of T steps of F signals that says either how likely a failure is
 * (classification) or how long is left (regression, remaining useful life). Written in C on
 * OpenBLAS's cblas; float32 throughout.
 *
 * The model, for one window x_1..x_T (each x_t has F features):
 *
 *   x'_t = (x_t - mean) / std                      per-feature statistics of the training set
 *   [i f g o]_t = x'_t Wx + h_{t-1} Wh + b          LSTM, H units, gate order i f g o,
 *   i,f,o = sigmoid, g = tanh                       h_0 = c_0 = 0, forget bias starts at 1
 *   c_t = f c_{t-1} + i g,  h_t = o tanh(c_t)
 *   e_t = v . tanh(h_t Wa + ba)                     additive (Bahdanau-style) attention over
 *   alpha = softmax_t(e),  ctx = sum_t alpha_t h_t  the LSTM's T outputs, A units
 *   u = tanh([ctx, h_T] W1 + b1)                    dense layer, D units, on the attention
 *                                                   context and the last state side by side
 *                                                   (dropout on [ctx, h_T] while training)
 *   out = u . w2 + b2
 *   classification: p = sigmoid(out), the probability of the positive class; the loss is
 *                   binary cross-entropy with positives weighted by pos_weight
 *   regression:     y = out * y_std + y_mean; the loss is the mean squared error on the
 *                   standardised target (y - y_mean) / y_std
 *
 * Training (rk_pred_train): mini-batches in a seeded order, backpropagation through time,
 * Adam, the gradient clipped to a global L2 norm, early stopping on a validation set (the
 * weights of the best validation epoch are kept). The same seeds give the same bits.
 *
 *     rk_pred_config c = RK_PRED_CONFIG_DEFAULT;
 *     c.task = RK_PRED_REGRESS; c.window = 30; c.features = 14; c.seed = 1;
 *     rk_pred_model *m;
 *     if (rk_pred_create(&m, &c, &err)) return err.code;
 *     rk_pred_train_opts o = RK_PRED_TRAIN_OPTS_DEFAULT;
 *     rk_pred_data train = {n, x, y}, val = {nv, xv, yv};
 *     rk_pred_train(m, &train, &val, &o, &report, &err);
 *     rk_pred_predict(m, x_new, 1, &rul, &err);
 *     rk_pred_save(m, "model.safetensors", &err);
 *
 * Saved models use the safetensors layout (rekindle/safetensors.h): the weights, the
 * normalisation statistics and metadata (format, task, window, features, hidden, attn, horizon,
 * dense), so that a model is self-describing and Python reads it unchanged.
 */
#ifndef REKINDLE_PREDICT_H
#define REKINDLE_PREDICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rk_pred_task {
    RK_PRED_CLASSIFY = 0, /* sigmoid output: probability of the positive class (target 0/1) */
    RK_PRED_REGRESS = 1   /* linear output: a value in the target's units */
} rk_pred_task;

#define RK_PRED_MAX_WINDOW 4096
#define RK_PRED_MAX_FEATURES 1024
#define RK_PRED_MAX_UNITS 4096    /* hidden, attn and dense */
#define RK_PRED_MAX_HORIZON 10080 /* minutes (a week) */
/* The horizon of a classification model whose file does not record one: every failure
 * model rk predict train wrote before models recorded their horizon was trained for 60. */
#define RK_PRED_HORIZON_UNRECORDED 60

typedef struct rk_pred_config {
    rk_pred_task task;
    int window;    /* T: steps per window, 1..RK_PRED_MAX_WINDOW */
    int features;  /* F: signals per step, 1..RK_PRED_MAX_FEATURES */
    int hidden;    /* H: LSTM units (default 64) */
    int attn;      /* A: attention units (default 32) */
    int dense;     /* D: dense layer units (default 32) */
    uint64_t seed; /* initial weights */
    /* classification: the model's probability is that of a failure within this many minutes
     * after the window's last step (the horizon its labels were made with), 0 ..
     * RK_PRED_MAX_HORIZON; 0: unstated. Saved with the model; ignored for regression. */
    int horizon_min;
} rk_pred_config;

#define RK_PRED_CONFIG_DEFAULT                                                                     \
    {                                                                                              \
        RK_PRED_CLASSIFY, 60, 0, 64, 32, 32, 1, 60                                                 \
    }

typedef struct rk_pred_model rk_pred_model;

/* A set of windows: x holds n windows of T x F raw (un-normalised) values, window-major then
 * step then feature (x[(k * T + t) * F + j]); y holds n targets (0 or 1 for classification).
 * Every value must be finite. */
typedef struct rk_pred_data {
    size_t n;
    const float *x;
    const float *y;
} rk_pred_data;

/* A new model with seeded initial weights and identity normalisation (mean 0, std 1).
 * RK_EINVAL naming the field when the configuration is out of range. */
int rk_pred_create(rk_pred_model **out, const rk_pred_config *c, rk_err *err);
void rk_pred_free(rk_pred_model *m);
const rk_pred_config *rk_pred_config_of(const rk_pred_model *m);
/* Number of trainable parameters. */
size_t rk_pred_num_params(const rk_pred_model *m);

/* Set the normalisation statistics from a training set: each feature's mean and standard
 * deviation over every step of every window (a feature whose deviation is below 1e-6 gets std
 * 1: a constant signal stays constant), and for regression the target's mean and deviation.
 * rk_pred_train calls this itself. RK_EINVAL for an empty set or a non-finite value. */
int rk_pred_fit_norm(rk_pred_model *m, const rk_pred_data *d, rk_err *err);

/* Predict n windows (raw values, as in rk_pred_data.x): out[k] is the probability of the
 * positive class (classification) or the value (regression). Thread-safe: the model is only
 * read. RK_ENOMEM if the work space cannot be allocated. */
int rk_pred_predict(const rk_pred_model *m, const float *x, size_t n, float *out, rk_err *err);

typedef struct rk_pred_epoch {
    int epoch;         /* 1.. */
    double train_loss; /* mean training loss of the epoch (the optimised, normalised loss) */
    double val_loss;   /* validation loss: MSE in target units, or the weighted BCE */
    double seconds;    /* since training began */
    bool best;         /* the best validation loss so far */
} rk_pred_epoch;

typedef struct rk_pred_train_opts {
    int max_epochs;     /* at most this many passes over the training set (default 60) */
    int batch;          /* windows per mini-batch (default 64) */
    float lr;           /* Adam's learning rate (default 1e-3; beta 0.9, 0.999, eps 1e-8) */
    float clip;         /* clip the gradient to this global L2 norm; 0: no clipping (default 1) */
    int patience;       /* stop after this many epochs without a better validation loss
                           (default 8); 0: never stop early */
    float pos_weight;   /* classification: weight of positive windows in the loss; 0 (default):
                           negatives / positives of the training set (balanced) */
    float input_noise;  /* regularisation: Gaussian noise of this sd added to the normalised
                           inputs of each training batch (default 0: none) */
    float weight_decay; /* regularisation: decoupled weight decay (AdamW), per step
                           p -= lr * weight_decay * p on the weight matrices (default 0) */
    float dropout;      /* regularisation: dropout rate on [ctx, h_T] before the dense layer
                           while training, in [0, 1) (default 0) */
    uint64_t seed;      /* mini-batch order and noise (default 1) */
    /* Called after each epoch (NULL: not called). */
    void (*on_epoch)(const rk_pred_epoch *e, void *ctx);
    void *ctx;
    /* Judges the model after each epoch in place of the validation loss, lower is better (for
     * example minus the average precision on the validation windows, where the loss rewards
     * calibration more than ranking); called with ctx and only when there is a validation
     * set. The best epoch and early stopping follow it and rk_pred_epoch.val_loss reports it.
     * NULL (default): the validation loss. An error it returns stops training. */
    int (*val_score)(const rk_pred_model *m, void *ctx, double *score, rk_err *err);
    float level_noise; /* regularisation: a Gaussian offset of this sd added to each feature of
                          each training window, the same at every step (normalised units), so
                          that the model reads changes within a window more than the levels
                          one device happens to run at (default 0: none) */
} rk_pred_train_opts;

#define RK_PRED_TRAIN_OPTS_DEFAULT                                                                 \
    {                                                                                              \
        60, 64, 1e-3f, 1.0f, 8, 0.0f, 0.0f, 0.0f, 0.0f, 1, NULL, NULL, NULL, 0.0f                  \
    }

typedef struct rk_pred_report {
    int epochs;           /* epochs run */
    int best_epoch;       /* the epoch whose weights the model now holds */
    double best_val_loss; /* its validation loss (as rk_pred_epoch.val_loss) */
    double seconds;       /* wall-clock time of the whole training */
    float pos_weight;     /* classification: the weight used */
} rk_pred_report;

/* Fit the normalisation statistics on `train`, then train. `val` (may be NULL or empty: then
 * every epoch counts as the best and all max_epochs run) drives early stopping; at the end
 * the model holds the weights of the best validation epoch. `report` may be NULL.
 * RK_EINVAL for bad options, an empty training set, non-finite data or (classification)
 * targets other than 0 and 1 or a set with a single class and no pos_weight; RK_EBACKEND if
 * the loss becomes non-finite (the model then holds the last good weights). */
int rk_pred_train(rk_pred_model *m, const rk_pred_data *train, const rk_pred_data *val,
                  const rk_pred_train_opts *o, rk_pred_report *report, rk_err *err);

/* The loss of the model on `d`, as rk_pred_epoch.val_loss: the mean squared error in target
 * units (regression) or the mean weighted binary cross-entropy (classification, positives
 * weighted by pos_weight; pass 1 for the plain loss). */
int rk_pred_loss(const rk_pred_model *m, const rk_pred_data *d, float pos_weight, double *loss,
                 rk_err *err);

/* Save the model atomically (safetensors layout: tensors lstm.wx [F,4H], lstm.wh [H,4H],
 * lstm.b [4H], attn.w [H,A], attn.b [A], attn.v [A], head.w1 [2H,D], head.b1 [D], head.w2 [D],
 * head.b2 [1], norm.mean [F], norm.std [F], target.mean [1], target.std [1]; metadata format =
 * "rekindle-predictor", version "1", task "classify" or "regress", window, features, hidden,
 * attn, dense and, for a classification model with a stated horizon, horizon_min). */
int rk_pred_save(const rk_pred_model *m, const char *path, rk_err *err);

/* Load a model saved by rk_pred_save. RK_ENOENT if the file does not exist; RK_EFORMAT with
 * a message naming the file and the problem for anything else (not safetensors, not a
 * rekindle predictor, a missing or badly shaped tensor, a bad metadata value, a non-finite
 * weight, a non-positive std). A classification model without horizon_min (a file written
 * before models recorded it) gets RK_PRED_HORIZON_UNRECORDED (60), the horizon rk predict
 * train used then; rk_pred_config_of(m)->horizon_min says what was read. */
int rk_pred_load(rk_pred_model **out, const char *path, rk_err *err);
/* The same from a file's bytes in memory; `name` labels messages (NULL: "<memory>"). */
int rk_pred_decode(const uint8_t *buf, size_t len, const char *name, rk_pred_model **out,
                   rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
