/*
 * Checkpoints of the reference trainer: which tensors make its state (weights, optimiser
 * state, batch policy) in the checkpoint store (rekindle/ckpt.h), as the worker runtime's
 * saver (rekindle/worker.h: it decides when to save). Rank 0 writes; on resume rank 0 reads and
 * broadcasts, so ranks need no shared file system. All tensors are world-size independent: a
 * checkpoint written by 4 ranks resumes on 3. Every random choice of the trainer derives from
 * (seed, epoch, step), so the manifest's step is the whole RNG state.
 */
#ifndef RK_NN_TRAIN_CKPT_H
#define RK_NN_TRAIN_CKPT_H

#include <stdio.h>

#include "nn/train.h"
#include "rekindle/batch.h"
#include "rekindle/ckpt.h"
#include "rekindle/comm.h"
#include "rekindle/worker.h"

typedef struct rk_trainer_ckpt {
    /* set by the caller */
    const char *dir;
    int keep;
    int async;       /* write in a background thread */
    int64_t samples; /* the training set's size (a checkpoint's epoch and cursor) */
    rk_model *m;
    rk_optim *opt;
    rk_batch_policy *policy;
    rk_comm *comm;
    const rk_train_config *cfg;
    FILE *log; /* where rank 0 says what it saved (NULL: quiet) */
    /* NULL, or asked by rank 0 right before each write (rk_worker_may_save): an error stops
     * the save (and, through the save's status collective, every rank) with nothing written */
    rk_worker *worker;
    /* kept by the module */
    rk_ckpt_writer *writer;
    char config[512];
} rk_trainer_ckpt;

/* Prepare (after m, opt, policy and cfg are set): builds the config JSON, the async writer.
 * The directory's lock, the schedule and the final checkpoint are the worker runtime's
 * (rekindle/worker.h), which calls the saver below. */
int rk_trainer_ckpt_init(rk_trainer_ckpt *t, rk_err *err);
/* Wait for an async write in flight, release the writer. */
int rk_trainer_ckpt_finish(rk_trainer_ckpt *t, rk_err *err);

/* Restore the newest valid checkpoint of this model, optimiser, seed and batch from t->dir
 * into the model, optimiser and policy on every rank; *step gets its step (0 and RK_ENOENT
 * when there is none). Skipped (corrupt or torn) checkpoints are described on t->log. */
int rk_trainer_ckpt_resume(rk_trainer_ckpt *t, int64_t *step, rk_err *err);

/* Save now (rank 0 writes; every rank must call). */
int rk_trainer_ckpt_save(rk_trainer_ckpt *t, int64_t step, int epoch, int64_t cursor, rk_err *err);

/* This format as the worker runtime's saver (save and resume above; `user` is t). */
rk_worker_saver rk_trainer_ckpt_saver(rk_trainer_ckpt *t);

#endif
