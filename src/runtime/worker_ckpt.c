/*
 * The worker runtime's checkpoints (rekindle/worker.h): the writer lock, resume or a refused
 * start, the schedule (every K steps, Daly's interval, on command, final), and the built-in
 * format over the registered buffers; a trainer's own format comes in as a saver.
 */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/phase.h"
#include "runtime/worker_internal.h"

#define AUTO_FIRST_SAVE 50 /* steps before the first save when the interval is automatic */

void rk_worker_ckpt_opts_default(rk_worker_ckpt_opts *o)
{
    memset(o, 0, sizeof *o);
    o->every = RK_CKPT_EVERY_DEFAULT;
    o->mtbf_s = 3600.0;
    o->keep = RK_CKPT_KEEP_DEFAULT;
    o->lock = 1;
}

void rk_worker_ckpt_env(const char **dir, int *resume)
{
    const char *d = getenv("RK_CKPT_DIR"), *r = getenv("RK_RESUME");
    if (dir)
        *dir = d && *d ? d : NULL;
    if (resume)
        *resume = r && strcmp(r, "1") == 0;
}

int rk_worker_may_save(rk_worker *w, rk_err *err)
{
    if (!w->hb || rk_hb_alive(w->hb))
        return RK_OK;
    return rk_err_set(err, RK_EIO,
                      "the supervisor has gone (its heartbeat socket closed): "
                      "no checkpoint is written after it");
}

/* The built-in format: one item per replicated buffer. */
static size_t builtin_items(const rk_worker *w, rk_ckpt_item *items)
{
    size_t n = 0;
    for (int i = 0; i < w->nbufs; i++) {
        const wbuf *b = &w->bufs[i];
        if (replicated(b))
            items[n++] = (rk_ckpt_item){.name = b->name,
                                        .dtype = b->f32 ? "F32" : "U8",
                                        .ndim = 1,
                                        .shape = b->shape,
                                        .data = b->data};
    }
    return n;
}

static int builtin_save(rk_worker *w, int64_t step, rk_err *err)
{
    int rc = RK_OK;
    if (w->rank == 0) {
        rk_ckpt_item *items = malloc((size_t)(w->nbufs + 1) * sizeof *items);
        if (!items)
            rc = rk_err_set(err, RK_ENOMEM, "checkpoint: out of memory");
        rk_ckpt_meta meta = {.step = step, .world_size = w->world, .config_json = w->config};
        if (!rc)
            rc = rk_worker_may_save(w, err);
        if (!rc)
            rc = rk_ckpt_save(w->dir, &meta, items, builtin_items(w, items), w->keep, err);
        free(items);
        if (!rc && w->notes)
            fprintf(w->notes, "checkpoint: step %lld saved in %s\n", (long long)step, w->dir);
    }
    /* every rank learns whether rank 0 managed, so none trains on alone after a failure */
    int learned;
    rc = rk_comm_share_status(w->world > 1 ? w->comm : NULL, rc, NULL, 0, &learned, err);
    if (learned)
        return rk_err_set(err, rc, "checkpoint: rank 0 could not save step %lld (%s)",
                          (long long)step, rk_strerror(rc));
    return rc;
}

static int builtin_resume(rk_worker *w, int64_t *step, rk_err *err)
{
    int64_t hdr[2] = {0, 0}; /* rank 0's status, the step */
    int rc = RK_OK, learned;
    if (w->rank == 0) {
        rk_ckpt_item *items = malloc((size_t)(w->nbufs + 1) * sizeof *items);
        rk_ckpt *c = NULL;
        char report[4096] = "";
        if (!items)
            rc = rk_err_set(err, RK_ENOMEM, "checkpoint: out of memory");
        size_t n = items ? builtin_items(w, items) : 0;
        rk_ckpt_expect expect = {.config_json = w->config, .items = items, .nitems = n};
        if (!rc)
            rc = rk_ckpt_load_latest(w->dir, &expect, &c, report, sizeof report, err);
        if (report[0] && w->notes)
            fprintf(w->notes, "checkpoint: skipped in %s:\n%s", w->dir, report);
        for (size_t i = 0; i < n && !rc; i++) {
            const rk_st_tensor *t = rk_ckpt_find(c, items[i].name);
            if (strcmp(items[i].dtype, "F32") == 0)
                rc = rk_st_load_f32(rk_ckpt_file(c), items[i].name, 1, items[i].shape,
                                    (float *)items[i].data, err);
            else if (t && t->nbytes == (size_t)items[i].shape[0])
                memcpy((void *)items[i].data, t->data, t->nbytes);
            else
                rc = rk_err_set(err, RK_EFORMAT, "%s: %s is missing", rk_ckpt_path(c),
                                items[i].name);
        }
        if (!rc) {
            hdr[1] = rk_ckpt_meta_of(c)->step;
            if (w->notes)
                fprintf(w->notes, "checkpoint: resuming from %s (step %lld)\n", rk_ckpt_path(c),
                        (long long)hdr[1]);
        }
        hdr[0] = rc;
        rk_ckpt_free(c);
        free(items);
    }
    if (w->world > 1) {
        rc = rk_comm_share_status(w->comm, (int)hdr[0], &hdr[1], 1, &learned, err);
        if (learned)
            return rc == RK_ENOENT ? rk_err_set(err, RK_ENOENT, "checkpoint: none in %s", w->dir)
                                   : rk_err_set(err, rc, "checkpoint: rank 0 could not resume");
        for (int i = 0; i < w->nbufs && !rc; i++)
            if (replicated(&w->bufs[i]))
                rc = rk_comm_bcast(w->comm, w->bufs[i].data, w->bufs[i].bytes, 0, err);
    }
    *step = hdr[0] ? 0 : hdr[1];
    return hdr[0] ? (int)hdr[0] : rc;
}

/* Rank 0 takes the lock; the others learn whether it did (and the holder's pid). */
static int take_lock(rk_worker *w, rk_err *err)
{
    int64_t holder = 0; /* the holder's pid, as rank 0 found it */
    int rc = RK_OK, learned;
    if (w->rank == 0) {
        long pid = 0;
        rc = rk_ckpt_lock(w->dir, &w->held, &pid, err);
        holder = pid;
    }
    rc = rk_comm_share_status(w->world > 1 ? w->comm : NULL, rc, &holder, 1, &learned, err);
    if (learned)
        return rk_err_set(err, rc, "checkpoint: rank 0 could not lock %s (holder pid %lld)", w->dir,
                          (long long)holder);
    if (rc) { /* not taken, or the others could not learn it was: no rank goes on */
        rk_ckpt_unlock(w->held);
        w->held = NULL;
    }
    return rc;
}

/* Whether this run takes DIR's writer lock: yes, unless it runs under a supervisor (`rk run`
 * sets RK_HEARTBEAT) that holds the lock of this very directory (its RK_CKPT_DIR). */
static int takes_lock(const char *dir)
{
    const char *sup = getenv("RK_HEARTBEAT"), *sup_dir;
    rk_worker_ckpt_env(&sup_dir, NULL);
    if (!sup || !*sup || !sup_dir)
        return 1;
    if (strcmp(dir, sup_dir) == 0)
        return 0;
    char a[PATH_MAX], b[PATH_MAX];
    return !(realpath(dir, a) && realpath(sup_dir, b) && strcmp(a, b) == 0);
}

/* Valid checkpoints already in DIR (0 when it is missing or holds none). A checkpoint that
 * cannot be read is an error (*rc, err), never "none". */
static size_t valid_checkpoints(const char *dir, int *rc, rk_err *err)
{
    rk_ckpt_info *items = NULL;
    size_t n = 0, ntemp = 0, valid = 0;
    *rc = RK_OK;
    if (rk_ckpt_list(dir, &items, &n, &ntemp, NULL) == RK_OK)
        for (size_t i = 0; i < n && !*rc; i++) {
            valid += items[i].valid != 0;
            if (items[i].unreadable)
                *rc = rk_err_set(err, RK_EIO, "checkpoint directory %s: %s", dir, items[i].problem);
        }
    free(items);
    return valid;
}

/* valid_checkpoints as rank 0 sees DIR, on every rank (collective): the ranks need no shared
 * file system, and one rank deciding alone would leave the others waiting in a collective
 * (and N ranks reading every checkpoint of a shared one is N times the I/O). */
static size_t valid_checkpoints_all(rk_worker *w, int *rc, rk_err *err)
{
    int64_t count = 0; /* as rank 0 found it */
    int learned;
    *rc = RK_OK;
    if (w->rank == 0)
        count = (int64_t)valid_checkpoints(w->dir, rc, err);
    *rc = rk_comm_share_status(w->world > 1 ? w->comm : NULL, *rc, &count, 1, &learned, err);
    if (learned)
        *rc = rk_err_set(err, *rc, "checkpoint directory %s: rank 0 could not list it", w->dir);
    return (size_t)count;
}

static int do_resume(rk_worker *w, int64_t *step, rk_err *err)
{
    return w->saver.resume ? w->saver.resume(w->saver.user, step, err)
                           : builtin_resume(w, step, err);
}

int rk_worker_ckpt(rk_worker *w, const rk_worker_ckpt_opts *o, int64_t *start_step, rk_err *err)
{
    *start_step = 0;
    const char *dir;
    int env_resume;
    rk_worker_ckpt_env(&dir, &env_resume);
    if (o->dir)
        dir = o->dir;
    if (!dir || !*dir)
        return RK_OK;
    if (strlen(dir) >= sizeof w->dir)
        return rk_err_set(err, RK_EINVAL, "checkpoint directory name too long");
    if (o->keep < 1 || o->every < 0 || !(o->mtbf_s > 0) || (o->saver.save && !o->saver.resume))
        return rk_err_set(err, RK_EINVAL,
                          "checkpoints: keep >= 1, every >= 0, mtbf > 0 and a "
                          "saver with both save and resume are needed");
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    free(w->config);
    if (!(w->config = strdup(o->config_json ? o->config_json : "{}")))
        return rk_err_set(err, RK_ENOMEM, "checkpoint: out of memory");
    w->saver = o->saver;
    w->keep = o->keep;
    w->every = o->every;
    w->mtbf_s = o->mtbf_s;
    w->next_at = w->every > 0 ? w->every : AUTO_FIRST_SAVE;
    w->ckpt = 1;
    w->restore = RK_HB_RESTORE_NONE;
    rk_worker_mem_init(w);
    int rc = RK_OK;
    if (o->lock > 0 && takes_lock(w->dir) && (rc = take_lock(w, err)))
        return rc;
    /* The directory is listed (every checkpoint read and verified) only when the answer
     * matters: no usable checkpoint of this run, or a fresh start. */
    if (o->resume || env_resume) {
        int64_t step = 0;
        int from_memory = 0; /* the node's snapshot first, when it is as new as the disk's */
        rk_phase_mark_env("worker.resume"); /* RK_TRACE_LAUNCH (base/phase.h) */
        rc = rk_worker_mem_resume(w, &step, &from_memory, err);
        if (!rc && !from_memory)
            rc = do_resume(w, &step, err);
        rk_phase_mark_env("worker.resumed");
        int lrc = RK_OK;
        size_t existing = rc == RK_ENOENT ? valid_checkpoints_all(w, &lrc, err) : 0;
        if (lrc)
            rc = lrc;
        else if (rc == RK_ENOENT && existing > 0)
            rc = rk_err_set(err, RK_EMISMATCH,
                            "checkpoint directory %s holds %zu checkpoint(s), none of "
                            "this run (%s); choose another directory",
                            w->dir, existing, w->config);
        else if (rc == RK_ENOENT) {
            if (w->notes)
                fprintf(w->notes, "checkpoint: none in %s yet, starting from step 0\n", w->dir);
            rc = RK_OK;
        } else if (!rc) {
            w->restore = from_memory ? RK_HB_RESTORE_MEMORY : RK_HB_RESTORE_DISK;
            *start_step = w->start_step = step;
            w->ckpt_last = step;
            w->next_at = step + (w->every > 0 ? w->every : AUTO_FIRST_SAVE);
        }
    } else {
        size_t existing = valid_checkpoints_all(w, &rc, err);
        if (!rc && existing > 0)
            rc = rk_err_set(
                err, RK_EINVAL,
                "checkpoint directory %s already holds %zu checkpoint(s): "
                "resume to continue that run (the resume option, e.g. rk train --resume; "
                "RK_RESUME=1 under rk run), or choose an "
                "empty directory",
                w->dir, existing);
    }
    w->last_step_t = rk_mono_s();
    return rc;
}

int rk_worker_ckpt_save(rk_worker *w, int64_t steps_done, rk_err *err)
{
    if (!w->ckpt)
        return RK_OK;
    double t0 = rk_mono_s();
    int rc = w->saver.save ? w->saver.save(w->saver.user, steps_done, err)
                           : builtin_save(w, steps_done, err);
    if (rc)
        return rc;
    w->last_save_s = rk_mono_s() - t0;
    w->ckpt_last = steps_done;
    if (w->rank == 0)
        rk_hb_ckpt(w->hb, steps_done, w->last_save_s);
    return RK_OK;
}

/* Every `every` steps, or at Daly's interval from the last save's cost and the step time. */
int rk_worker_ckpt_step_end(rk_worker *w, int64_t steps_done, rk_err *err)
{
    double now = rk_mono_s();
    double dt = now - w->last_step_t;
    w->last_step_t = now;
    w->step_s = w->step_s > 0 ? 0.9 * w->step_s + 0.1 * dt : dt;
    /* a disk checkpoint's step is put in memory too: memory is never older than the disk, so
     * a relaunch (or a rank replaced in place) restores from memory */
    int put = 0, rc = rk_worker_mem_step_end(w, steps_done, dt, w->ckpt && steps_done >= w->next_at,
                                             &put, err);
    if (rc)
        return rc;
    if (put)
        w->last_step_t = rk_mono_s(); /* the snapshot is not a training step */
    if (steps_done < w->next_at)
        return RK_OK;
    rc = rk_worker_ckpt_save(w, steps_done, err);
    if (rc)
        return rc;
    int64_t every = w->every;
    if (every <= 0) { /* auto: Daly's interval from this save's cost and the step time */
        every = rk_ckpt_auto_steps(w->last_save_s, w->mtbf_s, w->step_s);
        if (every <= 0)
            every = RK_CKPT_EVERY_DEFAULT;
        if (w->world > 1) { /* every rank must agree on the schedule */
            double e = (double)every;
            if ((rc = rk_comm_bcast(w->comm, &e, sizeof e, 0, err)))
                return rc;
            every = (int64_t)e;
        }
        if (w->notes)
            fprintf(w->notes,
                    "checkpoint: save took %.3f s, step %.4f s, MTBF %.0f s: next in "
                    "%lld steps (Daly)\n",
                    w->last_save_s, w->step_s, w->mtbf_s, (long long)every);
    }
    w->next_at = steps_done + every;
    w->last_step_t = rk_mono_s(); /* the save is not a training step */
    return RK_OK;
}

int rk_worker_ckpt_final(rk_worker *w, int64_t steps_done, rk_err *err)
{
    if (!w->ckpt || steps_done <= w->ckpt_last || steps_done <= w->start_step)
        return RK_OK;
    return rk_worker_ckpt_save(w, steps_done, err);
}
