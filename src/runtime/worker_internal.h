/*
 * The worker runtime's state (rekindle/worker.h), shared by its two files: worker.c (the
 * supervisor link, faults, guard repair, commands) and worker_ckpt.c (checkpoints).
 */
#ifndef RK_RUNTIME_WORKER_INTERNAL_H
#define RK_RUNTIME_WORKER_INTERNAL_H

#include <limits.h>
#include <stdio.h>

#include "rekindle/ckpt.h"
#include "rekindle/heartbeat.h"
#include "rekindle/inject.h"
#include "rekindle/worker.h"

#define MAX_BUFS 256

typedef struct wbuf {
    rk_worker_buf kind;
    char name[64];
    void *data;
    size_t bytes;
    int f32; /* registered as floats */
    int64_t shape[1];
    void *snap; /* the verified snapshot's copy (PARAM, STATE, LOCAL) */
} wbuf;

/* The count of puts at which the snapshots' K is chosen for the last time (worker_snap.c). */
#define RK_WORKER_MEM_TIMED_LAST 256

struct rk_worker {
    rk_comm *comm;
    int rank, world;
    char name[64];
    FILE *notes, *diag;
    char device[64];
    uint64_t seed;
    int64_t hash_every;
    rk_hb *hb;      /* NULL: no supervisor */
    rk_inject *inj; /* NULL: no faults to inject */
    double t_arm;   /* when injection was armed (random faults count from here) */
    int pending_hang, pending_nan, pending_gradflip, pending_commfail; /* due, later point */
    int slow_ms;        /* an active slow fault: extra sleep per step */
    int64_t slow_until; /* its last step (INT64_MAX: to the end) */
    int64_t last_step;  /* steps done, as last reported */
    int hello_said;
    int step_said;        /* a step was said since the hello (the trace's first step) */
    int began;            /* rk_worker_step_begin was called: no more buffers */
    uint64_t *gather;     /* world entries: every per-step allgather's result */
    unsigned char *flags; /* world entries: the replica vote's minority */
    wbuf bufs[MAX_BUFS];
    int nbufs;
    int snap_valid;
    int64_t snap_step;
    /* checkpoints */
    int ckpt; /* a directory is set */
    char dir[PATH_MAX];
    char *config;
    rk_worker_saver saver;
    int keep;
    int64_t every, next_at, ckpt_last; /* ckpt_last: the step of the last save or resume */
    int64_t start_step;                /* where this run started */
    double mtbf_s, last_save_s, last_step_t, step_s;
    rk_ckpt_lockfile *held;
    /* snapshots in memory (worker_snap.c, docs/recovery.md) */
    int mem_on;             /* RK_SNAP_DIR given, with checkpoints, and not turned off */
    int mem_room_checked;   /* the room rule was applied at the first put */
    char mem_dir[PATH_MAX]; /* RK_SNAP_DIR */
    int64_t mem_every;      /* K, steps between puts (1 while the first puts are timed) */
    int64_t mem_next;       /* the step of the next put */
    int mem_timed;          /* puts made, counted to RK_WORKER_MEM_TIMED_LAST: the first (which
                             * makes the rank's directory) is not timed, the next are (worker_snap.c) */
    double mem_put_s;       /* the seconds of the puts timed since K was last chosen */
    int mem_nput;           /* ... how many */
    double mem_steps[RK_WORKER_MEM_TIMED_LAST]; /* the steps before them (s) */
    int mem_nsteps;
    int64_t mem_pin_every; /* M (RK_SNAP_PIN_EVERY): pin the first put at or past each
                            * multiple of M; 0: no pins */
    int mem_pin_auto;      /* RK_SNAP_PIN_EVERY=auto: M chosen at the (MEM_TIMED + 1)th put */
    int64_t mem_puts;      /* puts made by this process */
    double mem_fastest_s;  /* the fastest step at a put so far */
    int64_t mem_pin_last;  /* the previous put's step (at the first put: the step resumed
                            * at, -1 at a fresh start); INT64_MIN before the first put */
    rk_hb_restore restore; /* where the state at start_step came from (hello) */
};

static inline int replicated(const wbuf *b)
{
    return b->kind == RK_WORKER_PARAM || b->kind == RK_WORKER_STATE;
}

/* After each applied step: a checkpoint when the schedule says so (every K steps, or at
 * Daly's interval). Collective. */
int rk_worker_ckpt_step_end(rk_worker *w, int64_t steps_done, rk_err *err);

/* Snapshots in memory (worker_snap.c). Set up from RK_SNAP_DIR (after the checkpoint
 * directory and config are known). */
void rk_worker_mem_init(rk_worker *w);
/* Resume from the node's snapshot when it is at least as new as the newest checkpoint on
 * disk (collective): *used 1 and *step its step, else *used 0 and nothing changed (the
 * caller resumes from disk). Only a communication failure is an error. */
int rk_worker_mem_resume(rk_worker *w, int64_t *step, int *used, rk_err *err);
/* After step `steps_done` - 1 was applied, `step_s` its seconds (collective): a put when due
 * (every K steps), or `force` (the same on every rank: a disk checkpoint of this step is
 * due). *put 1 if one was made (its time is not a training step's). A put that cannot be made
 * turns snapshots off (one event snapshot_off); only a communication failure is an error. */
int rk_worker_mem_step_end(rk_worker *w, int64_t steps_done, double step_s, int force, int *put,
                           rk_err *err);
/* K, the steps between puts, from a put's and a step's seconds, at most `cap`, the puts
 * forced every `forced` steps (the disk checkpoints'; 0: none) counted in the 1 % (worker_snap.c).
 */
double rk_worker_snap_every(double put, double step, int64_t cap, int64_t forced);

#endif
