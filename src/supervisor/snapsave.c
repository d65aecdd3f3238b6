/*
 * Disk checkpoints written from the snapshots (sup.h, docs/recovery.md "Disk checkpoints from
 * the snapshots"). Under RK_CKPT_FROM_SNAP=1 a PyTorch job's ranks, at a checkpoint step, put
 * and pin their generations of it in the node's snapshot directory and go on; once every rank
 * has (rank 0 knows it at the next step: every rank took part in that step's collectives),
 * rank 0 sends `save`. rk run then writes the checkpoint from the pinned generations in a
 * thread of its own (rk_snap_to_ckpt: verified, the replica hashes compared, byte for byte
 * the file rank 0 writes itself) and removes the pins, so that no rank waits for the disk.
 * One write at a time; a request that comes while one is being written waits, and a newer one
 * replaces it (its pins are removed: the newer checkpoint supersedes it, said). rk run owns the
 * pins' end: after a write, every pin up to its step goes (but the waiting one's). The main loop
 * records a finished write (the ledger's ckpt) or its failure: a storage error stops the job
 * as a rank's would (a full disk is not a device's fault); a missing or damaged generation or
 * replicas that disagree skip that checkpoint, said as an incident of no device's.
 */
#include "supervisor/sup.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "rekindle/snap.h"

typedef struct sup_snapsave {
    pthread_t th;
    int running;     /* a thread was started and not yet joined */
    atomic_int done; /* the running thread finished */
    char dir[RK_SNAP_PATH_MAX];
    const char *ckpt_dir;
    int world, keep;
    int64_t step;
    int rc;
    rk_err err;
    double seconds;
    /* the next request, not begun */
    int has_next, next_world, next_keep;
    int64_t next_step;
} sup_snapsave;

int sup_snapsave_on(const sup *s)
{
    const char *env = getenv("RK_CKPT_FROM_SNAP");
    return s->snap_dir[0] && !s->snap_off && s->o->ckpt_dir && !(env && strcmp(env, "0") == 0);
}

static void *write_it(void *arg)
{
    sup_snapsave *w = arg;
    w->rc = rk_snap_to_ckpt(w->dir, w->world, w->step, w->ckpt_dir, w->keep, &w->seconds, &w->err);
    atomic_store(&w->done, 1);
    return NULL;
}

/* The pins of `step` of every rank removed (a failure to is said: memory held, not lost). */
static void unpin(sup *s, const char *dir, int world, int64_t step)
{
    for (int r = 0; r < world; r++) {
        rk_err e = {0};
        if (rk_snap_unpin(dir, r, step, &e))
            sup_say(s, "snapshot: %s", e.msg);
    }
}

/* After the write of `step`: every rank's pins up to it removed but the waiting request's (a
 * pin whose request never came, its rank 0 gone before it sent it, goes too). */
static void unpin_done(sup *s, const sup_snapsave *w)
{
    for (int r = 0; r < w->world; r++) {
        rk_err e = {0};
        if (rk_snap_unpin_below(w->dir, r, w->step + 1, w->has_next ? w->next_step : -1, &e))
            sup_say(s, "snapshot: %s", e.msg);
    }
}

static void begin_next(sup *s)
{
    sup_snapsave *w = s->ss;
    if (w->running || !w->has_next)
        return;
    w->has_next = 0;
    snprintf(w->dir, sizeof w->dir, "%s", s->snap_dir); /* the job's, until drained */
    w->world = w->next_world;
    w->keep = w->next_keep;
    w->step = w->next_step;
    w->ckpt_dir = s->o->ckpt_dir;
    w->rc = RK_OK;
    memset(&w->err, 0, sizeof w->err);
    w->seconds = 0;
    atomic_store(&w->done, 0);
    if (pthread_create(&w->th, NULL, write_it, w) != 0) {
        sup_say(s, "checkpoint of step %" PRId64 " from the snapshots: cannot start a thread",
                w->step);
        unpin(s, w->dir, w->world, w->step);
        return;
    }
    w->running = 1;
}

void sup_snapsave_request(sup *s, int64_t step, int keep)
{
    if (!s->snap_dir[0] || !s->o->ckpt_dir) {
        sup_say(s,
                "ignored rank 0's request to save step %" PRId64
                " from the snapshots: this launch keeps none here",
                step);
        return;
    }
    if (!s->ss && !(s->ss = calloc(1, sizeof *s->ss))) {
        sup_say(s, "checkpoint of step %" PRId64 " from the snapshots: out of memory", step);
        return;
    }
    sup_snapsave *w = s->ss;
    if (w->has_next && w->next_step != step) { /* superseded before it began */
        unpin(s, s->snap_dir, w->next_world, w->next_step);
        sup_say(s,
                "checkpoint of step %" PRId64 " not written: step %" PRId64
                "'s came while the disk still wrote step %" PRId64 "'s (the newer one is written)",
                w->next_step, step, w->step);
    }
    w->has_next = 1;
    w->next_step = step;
    w->next_keep = keep;
    w->next_world = s->n;
    begin_next(s);
}

static void storage_incident(sup *s, int64_t step, const char *msg)
{
    rk_incident *i = rk_ledger_add(&s->g, "storage", -1, "", "stop", "%s", msg);
    if (i) {
        i->step = step;
        rk_ledger_write(&s->g, i);
    }
    sup_say(s, "storage error on the checkpoint directory %s: %s", s->o->ckpt_dir, msg);
}

/* The write in flight joined and recorded (blocking when `wait`). 1 if one was. `live`: the
 * launch is running (a storage error fails it, and its verdict is the incident); else the
 * incident is recorded here and s->ss_storage set for run.c. */
static int finish(sup *s, int wait, int live)
{
    sup_snapsave *w = s->ss;
    if (!w || !w->running || (!wait && !atomic_load(&w->done)))
        return 0;
    pthread_join(w->th, NULL);
    w->running = 0;
    unpin_done(s, w);
    if (w->rc == RK_OK) {
        rk_ledger_ckpt_rec(&s->g, s->launch_no, 0, w->step, w->seconds);
        if (!s->ss_told++)
            sup_say(s,
                    "checkpoint of step %" PRId64 " written from the ranks' snapshots in %.3f s: "
                    "rk run writes the disk checkpoints, the ranks do not wait for the disk",
                    w->step, w->seconds);
        return 1;
    }
    if (w->rc == RK_ESTORAGE || w->rc == RK_EIO) { /* the disk: the job cannot go on */
        if (live) { /* the launch fails as when rank 0 could not write: a storage stop (its
                     * verdict is the incident: ss_storage 2 until run.c sees it was) */
            s->ss_storage = s->ss_storage ? s->ss_storage : 2;
            if (s->seen.storage_rank < 0) { /* the first failure names it */
                s->seen.storage_rank = 0;   /* the job's checkpoint: rank 0 asked for it */
                snprintf(s->storage_detail, sizeof s->storage_detail, "%s", w->err.msg);
            }
            s->seen.ckpt_failed = 1; /* the rest is lost work: torn down at once */
            sup_fail(s, "rk run could not write the checkpoint of step %" PRId64 ": %s", w->step,
                     w->err.msg);
            return 1;
        }
        if (!s->ss_storage) { /* else one incident tells it already (or will: a verdict) */
            s->ss_storage = 1;
            storage_incident(s, w->step, w->err.msg);
        } else {
            sup_say(s, "storage error on the checkpoint directory %s: %s", s->o->ckpt_dir,
                    w->err.msg);
        }
        return 1;
    }
    rk_incident *i =
        rk_ledger_add(&s->g, "ckpt_skipped", -1, "", "none",
                      "checkpoint of step %" PRId64 " not written: %s", w->step, w->err.msg);
    if (i) {
        i->step = w->step;
        rk_ledger_write(&s->g, i);
    }
    sup_say(s, "checkpoint of step %" PRId64 " from the snapshots not written: %s", w->step,
            w->err.msg);
    return 1;
}

void sup_snapsave_tick(sup *s)
{
    if (!s->ss)
        return;
    finish(s, 0, 1);
    begin_next(s);
}

int sup_snapsave_drain(sup *s, int finished)
{
    if (finished && s->ss_storage == 2) { /* failed, but the launch ended first: no verdict */
        storage_incident(s, s->last_done, s->storage_detail);
        s->ss_storage = 1;
    }
    if (!s->ss)
        return s->ss_storage;
    while (finish(s, 1, 0) || (s->ss->has_next && (begin_next(s), s->ss->running)))
        ;
    free(s->ss);
    s->ss = NULL;
    return s->ss_storage;
}
