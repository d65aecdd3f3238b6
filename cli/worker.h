/*
 * rk train as a supervised worker: the glue between the trainer's hooks (nn/train.h) and
 * the heartbeat client and fault injection of the library (rekindle/heartbeat.h,
 * rekindle/inject.h). Without a supervisor (RK_HEARTBEAT unset) and without RK_INJECT every
 * hook is a no-op.
 */
#ifndef RK_CLI_WORKER_H
#define RK_CLI_WORKER_H

#include <stdint.h>

#include "nn/train.h"
#include "nn/train_ckpt.h"
#include "rekindle/comm.h"
#include "rekindle/heartbeat.h"
#include "rekindle/inject.h"

typedef struct rk_worker {
    rk_hb *hb;          /* NULL: no supervisor */
    rk_inject *inj;     /* NULL: no faults to inject */
    rk_comm *comm;
    int rank, world;
    uint64_t seed;      /* for the choices of bitflip, nan and gradflip */
    double t_arm;       /* when injection was armed (random faults count from here) */
    int pending_hang, pending_nan, pending_gradflip, pending_commfail; /* due, later point */
    int slow_ms;        /* an active slow fault: extra sleep per step */
    int64_t slow_until; /* its last step (INT64_MAX: to the end) */
    rk_trainer_ckpt *ck; /* for saves on command; NULL without --ckpt-dir */
    int stopped;        /* a stop command was carried out */
    int64_t last_step;  /* steps done, as last reported */
} rk_worker;

/* Reads RK_HEARTBEAT (connects, says hello with the start step later: see
 * rk_worker_hello), RK_INJECT, RK_INJECT_DONE, RK_LAUNCH. Errors name the variable. */
int rk_worker_open(rk_worker *w, rk_comm *comm, uint64_t seed, rk_err *err);
/* Connect to the supervisor and say hello (once the start step is known). */
int rk_worker_hello(rk_worker *w, int64_t start_step, rk_err *err);
/* Say goodbye (bye for exit statuses 0 and 4; an "exit" event naming the failure for 3 and
 * 5, with `why`), disconnect, free. */
void rk_worker_close(rk_worker *w, int64_t step, int status, const char *why);

/* Install the hooks on a config (point, incident, stepped). */
void rk_worker_hooks(rk_worker *w, rk_train_config *c);

/* Commands from the supervisor, agreed by all ranks every 8 steps (a collective when
 * supervised): "checkpoint" saves now, "stop" saves and returns RK_ESTOPPED. Call at each
 * step end. */
int rk_worker_commands(rk_worker *w, int64_t steps_done, int epoch, int64_t cursor, rk_err *err);

/* The checkpoint store's last check before it writes (rk_trainer_ckpt.may_save; `user` is
 * the rk_worker): RK_EIO once the supervisor has gone (rk_hb_alive), else RK_OK. */
int rk_worker_may_save(void *user, rk_err *err);

/* Tell the supervisor a checkpoint of `step` was saved. */
void rk_worker_saved(rk_worker *w, int64_t step, double seconds);

/* The device this rank uses: item `rank` of RK_DEVICES, else the rank number. */
const char *rk_worker_device(int rank, char *buf, size_t cap);

#endif
