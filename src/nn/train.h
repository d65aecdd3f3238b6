/*
 * The training loop of the reference workload: seeded per-epoch shuffling, mini-batch SGD
 * (Nesterov) or AdamW on a model, evaluation on the test set, and the numbers `rk train`
 * reports. No printing here: progress goes to a callback the CLI renders.
 */
#ifndef RK_NN_TRAIN_H
#define RK_NN_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "nn/idx.h"
#include "nn/model.h"
#include "rekindle/amp.h"
#include "rekindle/comm.h"
#include "rekindle/worker.h"

typedef enum rk_optim_kind { RK_OPTIM_SGD, RK_OPTIM_ADAMW } rk_optim_kind;

/* How a global batch of `global` samples is split over nranks ranks: fills shares[nranks]
 * (each >= 0, summing to global). Must give the same answer on every rank. */
typedef int (*rk_train_shares_fn)(void *user, int64_t global, int nranks, int64_t *shares,
                                  rk_err *err);
typedef enum rk_lr_schedule { RK_LR_CONSTANT, RK_LR_COSINE } rk_lr_schedule;

typedef struct rk_train_config {
    int epochs;        /* full passes over the training set */
    int64_t max_steps; /* stop after this many optimiser steps (0: no limit) */
    int batch;
    rk_optim_kind optim;
    float lr, momentum, weight_decay;
    int nesterov;
    float beta1, beta2, eps;
    rk_lr_schedule schedule;
    uint64_t seed;
    int eval;                  /* evaluate on the test set after each epoch and at the end */
    FILE *loss_log;            /* when set: one line per step, "step loss" (global mean loss) */
    rk_train_shares_fn shares; /* NULL: even split */
    /* Called on every rank after each step with this rank's sample count and the seconds
     * its forward and backward took (for throughput-based policies); may be NULL. A
     * collective may be used inside: every rank calls it at the same step. */
    int (*observe)(void *user, int64_t step, int n_local, double seconds, rk_err *err);
    void *shares_user; /* passed to shares and observe */
    /* Resume: the global step to start from (0: a fresh run). Epoch and position in the epoch
     * follow from it, and every random choice is derived from (seed, epoch, step), so a
     * resumed run continues bit for bit given the model and optimiser state. */
    int64_t start_step;
    /* Guards (docs/guards.md). guard = 1 checks every step, before the update, for a
     * non-finite loss or gradient on any rank, a rank whose gradient norm is grad_ratio times
     * the others', and a loss spike (robust z above spike_z over the last spike_window
     * steps); a trip redoes the step (params untouched), three trips in a row roll back to
     * the worker's verified snapshot. None of it changes a fault-free run's bits. */
    int guard;
    double spike_z, grad_ratio;
    int spike_window;
    /* The worker runtime (rekindle/worker.h; NULL: none): its step calls run in each step
     * (injected faults, replica checks with repair and replay, heartbeats, checkpoints, the
     * supervisor's commands; an error stops training with it), guard trips are its events,
     * and a guard rollback returns to its snapshot. The caller registers the model's and
     * optimiser's buffers with it. */
    rk_worker *worker;
    /* Gradient compression (docs/compression.md): a compressor the caller made for
     * m->block_len values on comm (NULL, or kind none: the plain allreduce). The first
     * compress_warmup steps use the plain allreduce. Its residuals are committed when a step
     * is applied and are part of the guards' rollback snapshot. */
    rk_compressor *compressor;
    int64_t compress_warmup;
    /* With SGD momentum, compress each rank's share of the new momentum instead of its
     * gradient (as DeepSpeed's 1-bit Adam does with Adam's): the optimiser's momentum becomes
     * the compressed sum. Default 1; ignored by AdamW and by the plain allreduce. */
    int compress_momentum;
    /* Mixed precision (docs/amp.md): RK_F16 or RK_BF16 store activations, activation
     * gradients and weight gradients in that format, with fp32 master weights (the model must
     * be set to it with rk_model_set_precision). scaler (for fp16; NULL: no loss scaling)
     * multiplies the loss; a step whose gradients are not finite on any rank is skipped and
     * the scale backs off, and non-finite gradients with a finite loss are the scaler's, not
     * the guards'. Its state is part of the rollback snapshot. */
    rk_dtype precision;
    rk_loss_scaler *scaler;
} rk_train_config;

/* Defaults: sgd, lr 0.01, momentum 0.9, Nesterov, no weight decay (AdamW: lr 1e-3, decay
 * 0.01, betas 0.9/0.999, eps 1e-8), batch 64, 1 epoch, seed 1, constant lr, eval on; guards
 * on, spike z 10 over 32 steps, gradient ratio 1000. */
void rk_train_config_default(rk_train_config *c, rk_optim_kind optim);

typedef struct rk_train_progress {
    int epoch, epochs; /* 1-based epoch */
    int64_t step_in_epoch, steps_in_epoch;
    int64_t step;         /* global optimiser steps done */
    double loss;          /* mean loss over the last few steps */
    double samples_per_s; /* training throughput so far in this epoch */
    double eta_s;         /* seconds left in this epoch */
    int epoch_done;       /* 1 on the call that ends an epoch */
    double test_accuracy; /* at epoch end when eval is on, else -1 */
} rk_train_progress;

typedef void (*rk_train_progress_fn)(const rk_train_progress *p, void *user);

typedef struct rk_train_result {
    int epochs_run;
    int64_t steps;
    double final_train_loss;    /* mean loss over the last min(100, steps) steps of this run */
    double train_samples_per_s; /* samples / training seconds (evaluation excluded) */
    double train_seconds;
    double allreduce_seconds; /* of train_seconds, time in the gradient allreduce */
    int64_t last_shares[8];   /* the split of the last full step, first 8 ranks */
    double test_accuracy;     /* full test set, -1 when not evaluated */
    double test_loss;
    int64_t redone_steps;     /* steps redone or replayed by the guards */
    int64_t incidents;        /* guard trips */
    int64_t amp_skipped;      /* steps skipped by the loss scaler (gradient overflow) */
    double loss_scale;        /* the loss scale at the end (0 without a scaler) */
    uint64_t grad_bytes_sent; /* bytes this rank sent in gradient allreduces */
} rk_train_result;

/* Optimiser state for a model: velocity (sgd) or AdamW moments, each one block laid out like
 * the model's parameter block, and the step count. */
typedef struct rk_optim {
    rk_optim_kind kind;
    float *s1, *s2; /* s2 only for AdamW */
    int64_t t;
} rk_optim;

int rk_optim_init(rk_optim *o, rk_optim_kind kind, const rk_model *m, rk_err *err);
void rk_optim_free(rk_optim *o, const rk_model *m);
int rk_optim_step(rk_optim *o, rk_model *m, const rk_train_config *c, float lr, rk_err *err);

/* Accuracy and mean loss of the model on a dataset, in batches of up to m->max_batch. With a
 * communicator of several ranks each rank scores a contiguous part and the counts are summed,
 * so every rank gets the result. comm may be NULL (one process). */
int rk_evaluate(rk_model *m, const rk_dataset *ds, rk_comm *comm, double *accuracy, double *loss,
                rk_err *err);

/* The step guard's verdict on every rank's gradient norm (gathered by the step's loss
 * allreduce; rk_guard_outliers, docs/guards.md). *trip: 0 none, 1 a non-finite norm, 2 a
 * finite outlier; *blame: the rank of a non-finite norm when there is one (the step's fault
 * is its), else the first outlier, -1 none; `who` names every flagged rank. RK_ENOMEM. */
int rk_train_judge_grads(const double *norms, int nranks, double ratio, int *trip, int *blame,
                         char *who, size_t cap, rk_err *err);

/* Train data-parallel over comm (NULL: one process), updating m with the optimiser opt (made
 * by rk_optim_init for m; its state may have been restored from a checkpoint). c->batch is the
 * global batch: every step takes the next c->batch samples of one seeded global order per epoch
 * (independent of the rank count) and splits them into contiguous slices, one per rank, of sizes
 * given by c->shares (NULL: even); each rank scales its gradient by its share of the global batch
 * and the sum over ranks is the gradient of the whole batch, so a step equals a one-process step on
 * the same samples. The model's max_batch must be at least the largest share. Progress callbacks
 * and results are the same on every rank. */
int rk_train(rk_model *m, rk_optim *opt, const rk_dataset *train, const rk_dataset *test,
             const rk_train_config *c, rk_comm *comm, rk_train_progress_fn progress, void *user,
             rk_train_result *res, rk_err *err);

#endif
