/*
 * Checkpoints of the reference trainer: which tensors make its state (weights, optimiser
 * state, batch policy) and the glue between rk_train's step hook and the checkpoint store
 * (rekindle/ckpt.h). Rank 0 writes; on resume rank 0 reads and broadcasts, so ranks need no
 * shared file system. All tensors are world-size independent: a checkpoint written by 4
 * ranks resumes on 3. Every random choice of the trainer derives from (seed, epoch, step),
 * so the manifest's step is the whole RNG state.
 */
#ifndef RK_NN_TRAIN_CKPT_H
#define RK_NN_TRAIN_CKPT_H

#include <stdio.h>

#include "nn/train.h"
#include "rekindle/batch.h"
#include "rekindle/ckpt.h"
#include "rekindle/comm.h"

typedef struct rk_trainer_ckpt {
    /* set by the caller */
    const char *dir;
    int keep;
    int64_t every;    /* steps between checkpoints; 0: auto (Daly, from save cost and mtbf) */
    double mtbf_s;    /* for auto */
    int async;        /* write in a background thread */
    int lock;         /* take the directory's writer lock (rank 0) for the run: a standalone
                         run; under a supervisor that holds it, 0 */
    rk_model *m;
    rk_optim *opt;
    rk_batch_policy *policy;
    rk_comm *comm;
    const rk_train_config *cfg;
    FILE *log;        /* where rank 0 says what it saved (NULL: quiet) */
    /* NULL, or asked by rank 0 right before each write: an error stops the save (and, through
     * the save's status collective, every rank) with nothing written */
    int (*may_save)(void *user, rk_err *err);
    void *may_save_user;
    /* kept by the module */
    rk_ckpt_writer *writer;
    rk_ckpt_lockfile *held; /* the lock, while held */
    char config[512];
    double last_save_s, last_step_t, step_s;
    int64_t next_at, saves, last_step;
} rk_trainer_ckpt;

/* Prepare (after m, opt, policy and cfg are set): takes the directory's lock when t->lock
 * (rank 0 takes it, every rank learns the outcome: RK_EBUSY naming the holder's pid on every
 * rank; collective), builds the config JSON, the async writer. */
int rk_trainer_ckpt_init(rk_trainer_ckpt *t, rk_err *err);
/* Wait for an async write in flight, release the writer and the lock. */
int rk_trainer_ckpt_finish(rk_trainer_ckpt *t, rk_err *err);

/* Restore the newest valid checkpoint of this model, optimiser, seed and batch from t->dir
 * into the model, optimiser and policy on every rank; *step gets its step (0 and RK_ENOENT
 * when there is none). Skipped (corrupt or torn) checkpoints are described on t->log. */
int rk_trainer_ckpt_resume(rk_trainer_ckpt *t, int64_t *step, rk_err *err);

/* Save now (rank 0 writes; every rank must call). */
int rk_trainer_ckpt_save(rk_trainer_ckpt *t, int64_t step, int epoch, int64_t cursor, rk_err *err);

/* rk_train's step_end hook: saves every `every` steps (or at the auto interval). */
int rk_trainer_ckpt_step_end(void *user, int64_t steps_done, int epoch, int64_t cursor,
                             rk_err *err);

#endif
