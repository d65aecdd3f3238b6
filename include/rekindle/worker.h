/*
 * The worker runtime: what a training program (one process per rank) calls to get rekindle's
 * guarantees under `rk run` (docs/worker.md). The trainer owns its model and its loop; it
 * registers the buffers that make its state (parameters, optimiser state: pointer, length,
 * name) and calls the runtime at four points of each step. The runtime does the rest:
 *
 *   - hello and bye with the supervisor (docs/protocol.md), a heartbeat per step, events;
 *   - the supervisor's commands (checkpoint, stop), agreed by all ranks so that every rank
 *     acts at the same step;
 *   - injected faults (RK_INJECT, docs/inject.md) delivered to this rank's registered
 *     buffers or process: crash, hang, slow, bitflip, nan, gradflip, commfail;
 *   - guard repair: every K steps the replicas' state is hashed and compared; on agreement it
 *     is kept in memory as the verified snapshot; on a mismatch every rank returns to that
 *     snapshot, the majority rank's state is broadcast to all, and the trainer replays;
 *   - checkpoints in the checkpoint store (rekindle/ckpt.h): every K steps or at Daly's
 *     interval, on the supervisor's command, a final one at the end, never after the
 *     supervisor has gone; resume from the newest valid one (RK_CKPT_DIR, RK_RESUME=1);
 *   - snapshots in node memory (RK_SNAP_DIR, rekindle/snap.h; docs/recovery.md): every K
 *     steps each rank puts its PARAM, STATE and LOCAL buffers; a resume restores the agreed
 *     step from there when it is at least as new as the newest checkpoint on disk, and the
 *     hello says where the state came from;
 *   - throughput observations for the batch policy (rekindle/batch.h).
 *
 * Without a supervisor (RK_HEARTBEAT unset) the link is a no-op; without MPI (one rank, the
 * "self" communicator) every agreement is local. None of it changes a fault-free run's bits:
 * the runtime writes to the trainer's buffers only to deliver a fault or to repair one.
 *
 * A step, as the trainer sees it:
 *
 *     rk_worker_step_begin(w, step, &back, &err);    faults; replica check every K steps;
 *     if (back >= 0) { step = back; continue; }      a repair: replay from the snapshot
 *     ... forward, backward into the registered gradient ...
 *     rk_worker_grads(w, step, &err);                faults on the gradient; "comm"
 *     ... allreduce, optimiser update ...
 *     step++;
 *     rk_worker_step_end(w, step, loss, seconds, &err);   heartbeat, checkpoint, commands
 *
 * Every call that says "collective" must be made by all ranks at the same step. Errors are
 * rekindle codes (rekindle/error.h) with a message in *err; the runtime never exits, except
 * where an injected crash or hang is the point. Buffers are host memory and must stay valid
 * and in place until rk_worker_close. Not thread-safe: one thread per worker.
 */
#ifndef REKINDLE_WORKER_H
#define REKINDLE_WORKER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rekindle/batch.h"
#include "rekindle/ckpt.h"
#include "rekindle/comm.h"
#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rk_worker rk_worker;

/* What a registered buffer is to the runtime. */
typedef enum rk_worker_buf {
    RK_WORKER_PARAM, /* parameters (float): replicated (hashed, snapshotted, repaired from the
                      * majority), saved in checkpoints; an injected bitflip lands here */
    RK_WORKER_STATE, /* optimiser state (any bytes: moments, a step counter): replicated and
                      * saved like parameters */
    RK_WORKER_GRAD,  /* this rank's gradient (float): where nan and gradflip land; neither
                      * compared nor saved */
    RK_WORKER_LOCAL  /* this rank's own state (any bytes: error-feedback residuals, a loss
                      * scaler): snapshotted and restored by a rollback, never compared */
} rk_worker_buf;

typedef struct rk_worker_opts {
    const char *name;   /* who speaks in notes ("rk train"); NULL: "worker" */
    FILE *notes;        /* where rank 0 says what it saved or resumed (NULL: quiet) */
    FILE *diag;         /* injected faults and guard trips, one line each (NULL: quiet) */
    uint64_t seed;      /* the run's seed: injected faults choose their element from it */
    int64_t hash_every; /* replica check every K steps (0: never; then no snapshot either) */
    const char *device; /* the device this rank uses, for hello (NULL: item `rank` of
                         * RK_DEVICES, else the rank number) */
} rk_worker_opts;

/* Defaults: name "worker", quiet, seed 1, hash_every 10. */
RK_API void rk_worker_opts_default(rk_worker_opts *o);

/* Make a worker for this rank of comm (kept, not owned): reads RK_INJECT, RK_INJECT_DONE and
 * RK_LAUNCH (errors name the variable). Says nothing to the supervisor yet: rk_worker_hello.
 * RK_EINVAL, RK_ENOMEM. */
RK_API int rk_worker_open(rk_worker **out, rk_comm *comm, const rk_worker_opts *o, rk_err *err);

/* Register a buffer (before the first rk_worker_step_begin: later is RK_EINVAL; the name is
 * copied, at most 63 bytes, unique). PARAM and GRAD take floats (n values); STATE and LOCAL
 * any bytes. The memory stays the caller's and must live until rk_worker_close. RK_EINVAL,
 * RK_ENOMEM. */
RK_API int rk_worker_add_f32(rk_worker *w, rk_worker_buf kind, const char *name, float *data,
                             size_t n, rk_err *err);
RK_API int rk_worker_add_bytes(rk_worker *w, rk_worker_buf kind, const char *name, void *data,
                               size_t bytes, rk_err *err);

/* Connect to $RK_HEARTBEAT and say hello with the step this run starts from (0, or the
 * resumed checkpoint's). Without RK_HEARTBEAT: nothing. Once. */
RK_API int rk_worker_hello(rk_worker *w, int64_t start_step, rk_err *err);

/* The exit status (rekindle/heartbeat.h, RK_EXIT_*) a worker returns for an error code, as
 * `rk run` reads it: 0 for RK_OK; 2 bad usage or input (RK_EINVAL, RK_EFORMAT, RK_ENOENT,
 * RK_EMISMATCH, RK_EBUSY); 3 RK_ECOMM; 4 RK_ESTOPPED; 5 a guard that gave up or non-finite
 * weights (RK_EGUARD, RK_ENONFINITE); 6 storage (RK_ESTORAGE); 1 anything else. */
RK_API int rk_worker_exit_status(int code);

/* Say goodbye and free (NULL-safe). status is the exit status the process is about to
 * return (rekindle/heartbeat.h, RK_EXIT_*): bye "done" for 0, "stopped" for 4; for 2, 3, 5
 * and 6 an "exit" event naming the failure, with `why` (NULL: none) as its detail. */
RK_API void rk_worker_close(rk_worker *w, int64_t step, int status, const char *why);

/* Start of step `step` (collective): the injected faults due now fire (crash and hang never
 * return; bitflip flips one bit of one PARAM value), then, every hash_every steps, the
 * replica check: on agreement the replicated and local buffers are snapshotted; on a
 * mismatch every rank is returned to the snapshot, the majority's state is broadcast, an
 * event names the minority, and *rolled_to gets the snapshot's step (the trainer replays
 * from there); else *rolled_to = -1. rolled_to may be NULL for a trainer that cannot replay:
 * a rollback is then RK_EGUARD. RK_EGUARD when replicas differ with no snapshot to return
 * to, or still differ after the repair; RK_ECOMM. */
RK_API int rk_worker_step_begin(rk_worker *w, int64_t step, int64_t *rolled_to, rk_err *err);

/* This rank's gradient of `step` is ready, before its collectives: nan and gradflip land
 * in the GRAD buffers, a hang stops here, a commfail returns RK_ECOMM; the supervisor hears
 * "comm". */
RK_API int rk_worker_grads(rk_worker *w, int64_t step, rk_err *err);

/* Step `steps_done` - 1 was applied (collective): the heartbeat (loss of the step, and its
 * wall seconds: rk run's goodput reads them, so pass the real duration), a
 * scheduled checkpoint, and every 8 steps the supervisor's commands agreed over all ranks:
 * "checkpoint" saves now; "stop" saves and returns RK_ESTOPPED; a supervisor that has gone returns
 * RK_EIO (nothing is saved after it). */
RK_API int rk_worker_step_end(rk_worker *w, int64_t steps_done, double loss, double seconds,
                              rk_err *err);

/* A guard trip the trainer handled itself (kind and action words [a-z_]{1,31}, blame the
 * rank held responsible or -1, lost steps, detail): rank 0 sends it to the supervisor and
 * says it on diag. Call on every rank alike. */
RK_API void rk_worker_event(rk_worker *w, int64_t step, const char *kind, int blame,
                            const char *action, int64_t lost_steps, const char *detail);

/* The step of the verified snapshot, -1 while there is none. */
RK_API int64_t rk_worker_snapshot_step(const rk_worker *w);
/* Return the replicated and local buffers to the verified snapshot (on this rank; every rank
 * calls it when the trainer's guards agree); *step gets its step. RK_ENOENT without one. */
RK_API int rk_worker_rollback(rk_worker *w, int64_t *step, rk_err *err);
/* XXH64 of the replicated buffers (PARAM and STATE, in registration order): equal on every
 * rank of a healthy job, and equal across runs that end with the same bits. */
RK_API uint64_t rk_worker_state_hash(const rk_worker *w);

/* Throughput observation (collective): every rank's samples/s of this step (n_local samples
 * in `seconds`) gathered and fed to the policy, so every rank's policy sees the same numbers.
 * A rank without samples reports nothing. */
RK_API int rk_worker_observe(rk_worker *w, rk_batch_policy *policy, int n_local, double seconds,
                             rk_err *err);

/* ---- checkpoints ------------------------------------------------------------------------ */

/* A trainer's own checkpoint format (rk train's, say). Both collective; save writes `step`
 * (rank 0 writes, every rank learns the outcome); resume restores the newest valid
 * checkpoint of this run into every rank and sets *step, RK_ENOENT when there is none. */
typedef struct rk_worker_saver {
    int (*save)(void *user, int64_t step, rk_err *err);
    int (*resume)(void *user, int64_t *step, rk_err *err);
    void *user;
} rk_worker_saver;

typedef struct rk_worker_ckpt_opts {
    const char *dir;         /* NULL: $RK_CKPT_DIR (rk run sets it); NULL or "" there: none */
    int resume;              /* continue from the newest valid checkpoint; also RK_RESUME=1 */
    int64_t every;           /* steps between checkpoints; 0: auto (Daly, from the measured save
                              * cost and mtbf_s) */
    double mtbf_s;           /* for auto */
    int keep;                /* checkpoints kept */
    const char *config_json; /* identifies the run: a checkpoint of another is not resumed
                              * (the built-in format; NULL: "{}") */
    rk_worker_saver saver;   /* save NULL: the runtime's own format, one item per PARAM and
                              * STATE buffer under its name (F32 or U8) */
    int lock;                /* take the directory's writer lock for the run: 1 (default) unless
                              * a supervisor that holds it (RK_HEARTBEAT with RK_CKPT_DIR the same
                              * directory) runs this worker; -1 never */
} rk_worker_ckpt_opts;

/* What a supervisor (rk run) asks of this process's checkpoints, read from the environment
 * in this one place: *dir the directory (RK_CKPT_DIR; NULL when unset or empty), *resume 1
 * when it says to continue from the newest valid checkpoint there (RK_RESUME=1), else 0.
 * Either pointer may be NULL. *dir points into the environment. */
RK_API void rk_worker_ckpt_env(const char **dir, int *resume);

/* Defaults: dir NULL, no resume, every RK_CKPT_EVERY_DEFAULT, mtbf 3600 s, keep
 * RK_CKPT_KEEP_DEFAULT, built-in format, lock as described. */
RK_API void rk_worker_ckpt_opts_default(rk_worker_ckpt_opts *o);

/* Set up checkpoints and find where this run starts (collective; after the buffers are
 * registered, before rk_worker_hello): takes the lock (RK_EBUSY naming the holder's pid), and
 * with resume restores the newest valid checkpoint of this run (*start_step gets its step; 0
 * when the directory has none yet). A fresh start into a directory that holds checkpoints is
 * refused (RK_EINVAL), so is a resume into one whose checkpoints are all of another run
 * (RK_EMISMATCH). Without a directory: *start_step = 0 and nothing is saved later. */
RK_API int rk_worker_ckpt(rk_worker *w, const rk_worker_ckpt_opts *o, int64_t *start_step,
                          rk_err *err);

/* The run ended after `steps_done` steps (collective): a final checkpoint unless the last
 * step was just saved or no step ran in this run. */
RK_API int rk_worker_ckpt_final(rk_worker *w, int64_t steps_done, rk_err *err);

/* Save `steps_done` now (collective), and say so to the supervisor. */
RK_API int rk_worker_ckpt_save(rk_worker *w, int64_t steps_done, rk_err *err);

/* The last check before rank 0 writes a checkpoint: RK_EIO once the supervisor has gone. */
RK_API int rk_worker_may_save(rk_worker *w, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
