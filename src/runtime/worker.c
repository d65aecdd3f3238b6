/*
 * The worker runtime (rekindle/worker.h): a rank's link to the supervisor (heartbeat.h),
 * injected faults delivered to the trainer's registered buffers (inject.h), replica hashes
 * with rollback and majority repair (guard.h), the supervisor's commands agreed over the
 * communicator (comm.h), and the checkpoint policy over the store (ckpt.h).
 */
#include "rekindle/worker.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/clock.h"
#include "rekindle/ckpt.h"
#include "rekindle/guard.h"
#include "rekindle/heartbeat.h"
#include "rekindle/inject.h"
#include "rekindle/rng.h"

#define COMMAND_EVERY 8           /* steps between agreements on the supervisor's commands */
#define GONE (RK_HB_CMD_STOP + 1) /* in the agreement: a rank's supervisor has gone */
#define AUTO_FIRST_SAVE 50        /* steps before the first save when the interval is automatic */
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
};

/* ---- set-up ------------------------------------------------------------------------------ */

void rk_worker_opts_default(rk_worker_opts *o)
{
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->hash_every = 10;
}

/* Item `rank` of RK_DEVICES, else the rank number. */
static void device_of(int rank, char *buf, size_t cap)
{
    const char *list = getenv("RK_DEVICES");
    snprintf(buf, cap, "%d", rank);
    if (!list || !*list)
        return;
    const char *p = list;
    for (int i = 0; i < rank && p; i++) {
        p = strchr(p, ',');
        if (p)
            p++;
    }
    if (p && *p) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < cap) {
            memcpy(buf, p, n);
            buf[n] = '\0';
        }
    }
}

int rk_worker_open(rk_worker **out, rk_comm *comm, const rk_worker_opts *o, rk_err *err)
{
    *out = NULL;
    rk_worker_opts def;
    if (!o) {
        rk_worker_opts_default(&def);
        o = &def;
    }
    if (!comm)
        return rk_err_set(err, RK_EINVAL, "worker: no communicator");
    if (o->hash_every < 0)
        return rk_err_set(err, RK_EINVAL, "worker: hash_every %lld is negative",
                          (long long)o->hash_every);
    rk_worker *w = calloc(1, sizeof *w);
    if (!w)
        return rk_err_set(err, RK_ENOMEM, "worker: out of memory");
    w->comm = comm;
    w->rank = rk_comm_rank(comm);
    w->world = rk_comm_size(comm);
    snprintf(w->name, sizeof w->name, "%s", o->name ? o->name : "worker");
    w->notes = w->rank == 0 ? o->notes : NULL;
    w->diag = o->diag;
    w->seed = o->seed;
    w->hash_every = o->hash_every;
    w->slow_until = -1;
    w->snap_step = -1;
    w->ckpt_last = -1;
    if (o->device)
        snprintf(w->device, sizeof w->device, "%s", o->device);
    else
        device_of(w->rank, w->device, sizeof w->device);
    int rc = rk_inject_from_env(&w->inj, w->rank, err);
    w->t_arm = rk_mono_s();
    if (rc) {
        free(w);
        return rc;
    }
    *out = w;
    return RK_OK;
}

static int add(rk_worker *w, rk_worker_buf kind, const char *name, void *data, size_t bytes,
               int f32, rk_err *err)
{
    if (!w || !name || !*name || strlen(name) > 63 || !data || bytes == 0 ||
        (unsigned)kind > RK_WORKER_LOCAL)
        return rk_err_set(err, RK_EINVAL,
                          "worker: buffer '%s': a name of 1..63 bytes, memory "
                          "and a length are needed",
                          name ? name : "(null)");
    if (!f32 && (kind == RK_WORKER_PARAM || kind == RK_WORKER_GRAD))
        return rk_err_set(err, RK_EINVAL,
                          "worker: buffer '%s': parameters and gradients are "
                          "floats (rk_worker_add_f32)",
                          name);
    if (w->nbufs == MAX_BUFS)
        return rk_err_set(err, RK_EINVAL, "worker: more than %d buffers", MAX_BUFS);
    for (int i = 0; i < w->nbufs; i++)
        if (strcmp(w->bufs[i].name, name) == 0)
            return rk_err_set(err, RK_EINVAL, "worker: buffer '%s' registered twice", name);
    wbuf *b = &w->bufs[w->nbufs];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    snprintf(b->name, sizeof b->name, "%s", name);
    b->data = data;
    b->bytes = bytes;
    b->f32 = f32;
    b->shape[0] = (int64_t)(f32 ? bytes / sizeof(float) : bytes);
    if (kind != RK_WORKER_GRAD && w->hash_every > 0 && !(b->snap = malloc(bytes)))
        return rk_err_set(err, RK_ENOMEM, "worker: out of memory for the snapshot of '%s'", name);
    w->nbufs++;
    return RK_OK;
}

int rk_worker_add_f32(rk_worker *w, rk_worker_buf kind, const char *name, float *data, size_t n,
                      rk_err *err)
{
    return add(w, kind, name, data, n * sizeof(float), 1, err);
}

int rk_worker_add_bytes(rk_worker *w, rk_worker_buf kind, const char *name, void *data,
                        size_t bytes, rk_err *err)
{
    return add(w, kind, name, data, bytes, 0, err);
}

int rk_worker_hello(rk_worker *w, int64_t start_step, rk_err *err)
{
    if (w->hello_said)
        return RK_OK;
    w->hello_said = 1;
    w->last_step = start_step;
    return rk_hb_open(&w->hb, w->rank, w->world, w->device, start_step, err);
}

void rk_worker_close(rk_worker *w, int64_t step, int status, const char *why)
{
    if (!w)
        return;
    if (w->hb && (status == RK_EXIT_OK || status == RK_EXIT_STOPPED))
        rk_hb_bye(w->hb, step, status == RK_EXIT_OK ? "done" : "stopped");
    /* the exit status alone tells the supervisor what happened (docs/protocol.md); the event
     * says which rank, where and why. A storage error is said by rank 0, the checkpoint
     * writer: the other ranks only relay that it failed */
    else if (w->hb && (status == RK_EXIT_COMM || status == RK_EXIT_GUARD ||
                       status == RK_EXIT_USAGE || (status == RK_EXIT_STORAGE && w->rank == 0)))
        rk_hb_event(w->hb, step > w->last_step ? step : w->last_step,
                    status == RK_EXIT_COMM    ? "commfail"
                    : status == RK_EXIT_GUARD ? "guard_failed"
                    : status == RK_EXIT_USAGE ? "usage"
                                              : "storage",
                    status == RK_EXIT_COMM || status == RK_EXIT_GUARD ? w->rank : -1, "exit", 0,
                    why);
    rk_hb_close(w->hb);
    rk_inject_free(w->inj);
    rk_ckpt_unlock(w->held);
    for (int i = 0; i < w->nbufs; i++)
        free(w->bufs[i].snap);
    free(w->config);
    free(w);
}

/* ---- injected faults ----------------------------------------------------------------------- */

/* A seeded choice for an injected fault at `step`: the same run makes the same choice. */
static uint64_t choice(const rk_worker *w, int64_t step, uint64_t what)
{
    rk_rng r;
    rk_rng_derive(&r, w->seed ^ 0x696e6a656374ULL, (uint64_t)step, what);
    return rk_rng_next(&r);
}

static void flip(float *x, int bit)
{
    uint32_t u;
    memcpy(&u, x, sizeof u);
    u ^= (uint32_t)1 << bit;
    memcpy(x, &u, sizeof u);
}

static size_t floats_of(const rk_worker *w, rk_worker_buf kind)
{
    size_t n = 0;
    for (int i = 0; i < w->nbufs; i++)
        if (w->bufs[i].kind == kind)
            n += w->bufs[i].bytes / sizeof(float);
    return n;
}

/* Element `idx` of the floats of every buffer of `kind`, in registration order. */
static float *float_at(rk_worker *w, rk_worker_buf kind, size_t idx, const char **name, size_t *at)
{
    for (int i = 0; i < w->nbufs; i++) {
        wbuf *b = &w->bufs[i];
        size_t n = b->bytes / sizeof(float);
        if (b->kind != kind)
            continue;
        if (idx < n) {
            *name = b->name;
            *at = idx;
            return (float *)b->data + idx;
        }
        idx -= n;
    }
    return NULL;
}

/* One bit of one parameter of this replica. */
static void inject_bitflip(rk_worker *w, int64_t step)
{
    size_t n = floats_of(w, RK_WORKER_PARAM), at = 0;
    const char *name = "";
    if (n == 0)
        return;
    uint64_t c = choice(w, step, 1);
    int bit = (int)((c >> 40) % 32);
    float *x = float_at(w, RK_WORKER_PARAM, (size_t)(c % n), &name, &at);
    flip(x, bit);
    if (w->diag)
        fprintf(w->diag, "%s (rank %d): injected bitflip: bit %d of %s[%zu] at step %lld\n",
                w->name, w->rank, bit, name, at, (long long)step);
}

/* A high exponent bit (30) of one gradient element of magnitude in (0, 2): the value grows by
 * 2^128, to a huge number or infinity. */
static void inject_gradflip(rk_worker *w, int64_t step)
{
    size_t n = floats_of(w, RK_WORKER_GRAD), at;
    const char *name;
    if (n == 0)
        return;
    size_t start = (size_t)(choice(w, step, 2) % n);
    for (size_t k = 0; k < n; k++) {
        float *g = float_at(w, RK_WORKER_GRAD, (start + k) % n, &name, &at);
        if (*g != 0.0f && fabsf(*g) < 2.0f) {
            flip(g, 30);
            return;
        }
    }
}

static void inject_nan(rk_worker *w, int64_t step)
{
    size_t n = floats_of(w, RK_WORKER_GRAD), at;
    const char *name;
    if (n > 0)
        *float_at(w, RK_WORKER_GRAD, (size_t)(choice(w, step, 3) % n), &name, &at) = NAN;
}

/* The faults due at the start of `step`: crash, slow and bitflip act now; hang, nan and
 * gradflip wait for the gradients, commfail for the collectives. */
static void faults_due(rk_worker *w, int64_t step)
{
    size_t idx[16];
    size_t n = rk_inject_due(w->inj, step, rk_mono_s() - w->t_arm, idx, 16);
    for (size_t i = 0; i < n; i++) {
        const rk_fault *f = rk_inject_get(w->inj, idx[i]);
        const char *kind = rk_fault_kind_name(f->kind);
        rk_hb_inject(w->hb, step, (int)idx[i], kind); /* said before it happens */
        if (w->diag)
            fprintf(w->diag, "%s (rank %d): injected fault %s at step %lld (simulated)\n", w->name,
                    w->rank, kind, (long long)step);
        switch (f->kind) {
        case RK_FAULT_CRASH:
            fflush(NULL);
            raise(SIGKILL); /* dies here, no clean-up, like a process the driver took down */
            break;
        case RK_FAULT_HANG: w->pending_hang = 1; break;
        case RK_FAULT_SLOW:
            w->slow_ms = f->ms;
            w->slow_until = f->steps > 0 ? step + f->steps - 1 : INT64_MAX;
            break;
        case RK_FAULT_BITFLIP: inject_bitflip(w, step); break;
        case RK_FAULT_NAN: w->pending_nan = 1; break;
        case RK_FAULT_GRADFLIP: w->pending_gradflip = 1; break;
        case RK_FAULT_COMMFAIL: w->pending_commfail = 1; break;
        }
    }
}

int rk_worker_grads(rk_worker *w, int64_t step, rk_err *err)
{
    if (w->pending_hang) {
        fflush(NULL);
        for (;;)
            pause(); /* stuck in compute, as in a kernel or driver call that never returns */
    }
    if (w->pending_nan)
        inject_nan(w, step);
    if (w->pending_gradflip)
        inject_gradflip(w, step);
    w->pending_nan = w->pending_gradflip = 0;
    if (w->pending_commfail) {
        w->pending_commfail = 0;
        return rk_err_set(err, RK_ECOMM, "step %lld: injected communication failure (simulated)",
                          (long long)step);
    }
    rk_hb_comm(w->hb, step);
    return RK_OK;
}

/* ---- guard repair ----------------------------------------------------------------------- */

static int replicated(const wbuf *b)
{
    return b->kind == RK_WORKER_PARAM || b->kind == RK_WORKER_STATE;
}

uint64_t rk_worker_state_hash(const rk_worker *w)
{
    XXH64_state_t *st = XXH64_createState();
    if (!st)
        return 0;
    XXH64_reset(st, 0);
    for (int i = 0; i < w->nbufs; i++)
        if (replicated(&w->bufs[i]))
            XXH64_update(st, w->bufs[i].data, w->bufs[i].bytes);
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

/* Copy the live buffers into the snapshot (to_snap) or back; `which`: 1 the replicated
 * ones, 2 the local ones, 3 both. */
static void snap_copy(rk_worker *w, int to_snap, int which)
{
    for (int i = 0; i < w->nbufs; i++) {
        wbuf *b = &w->bufs[i];
        if (!b->snap || !(which & (replicated(b) ? 1 : 2)))
            continue;
        if (to_snap)
            memcpy(b->snap, b->data, b->bytes);
        else
            memcpy(b->data, b->snap, b->bytes);
    }
}

int64_t rk_worker_snapshot_step(const rk_worker *w)
{
    return w && w->snap_valid ? w->snap_step : -1;
}

int rk_worker_rollback(rk_worker *w, int64_t *step, rk_err *err)
{
    if (!w->snap_valid)
        return rk_err_set(err, RK_ENOENT, "no verified snapshot to return to");
    snap_copy(w, 0, 3);
    *step = w->snap_step;
    return RK_OK;
}

void rk_worker_event(rk_worker *w, int64_t step, const char *kind, int blame, const char *action,
                     int64_t lost_steps, const char *detail)
{
    /* every rank sees the same trip; rank 0 speaks for the job */
    if (w->rank != 0)
        return;
    rk_hb_event(w->hb, step, kind, blame, action, lost_steps, detail);
    if (w->diag)
        fprintf(w->diag, "%s: guard: step %lld: %s -> %s: %s\n", w->name, (long long)step, kind,
                action, detail ? detail : "");
}

/* Compare replica hashes; on agreement snapshot the state at `step`. On a mismatch name the
 * minority, return every rank to the snapshot, broadcast the majority's snapshot (repair) and
 * check again: *rolled_to gets the snapshot's step (-1 when nothing was rolled back). */
static int replica_check(rk_worker *w, int64_t step, int64_t *rolled_to, rk_err *err)
{
    *rolled_to = -1;
    int nranks = w->world;
    if (nranks > 1) {
        uint64_t *all = malloc((size_t)nranks * sizeof *all);
        unsigned char *flags = malloc((size_t)nranks);
        if (!all || !flags) {
            free(all);
            free(flags);
            return rk_err_set(err, RK_ENOMEM, "guards: out of memory");
        }
        int root = 0, strict = 0;
        int rc = rk_comm_allgather_u64(w->comm, rk_worker_state_hash(w), all, err);
        int bad = rc ? 0 : rk_guard_vote(all, nranks, &root, flags, &strict);
        if (!rc && bad) {
            char who[96] = "", detail[400];
            size_t k = 0;
            int blame = -1;
            for (int r = 0; r < nranks && k + 8 < sizeof who; r++)
                if (flags[r]) {
                    k += (size_t)snprintf(who + k, sizeof who - k, k ? ",%d" : "%d", r);
                    blame = blame < 0 ? r : blame;
                }
            if (!w->snap_valid) {
                rc = rk_err_set(err, RK_EGUARD,
                                "step %lld: replicas differ (rank %s) and there is no verified "
                                "snapshot to return to",
                                (long long)step, who);
            } else {
                /* back to the last verified state, then everyone takes the majority's */
                snap_copy(w, 0, 3);
                for (int i = 0; i < w->nbufs && !rc; i++)
                    if (replicated(&w->bufs[i]))
                        rc = rk_comm_bcast(w->comm, w->bufs[i].data, w->bufs[i].bytes, root, err);
                if (rc)
                    goto done;
                snap_copy(w, 1, 1);
                snprintf(detail, sizeof detail,
                         "parameters of rank %s differ from the majority's (%d of %d ranks); "
                         "repaired from rank %d, replaying from step %lld",
                         who, nranks - bad, nranks, root, (long long)w->snap_step);
                rk_worker_event(w, step, "replica_mismatch", strict ? blame : -1, "rollback",
                                step - w->snap_step, detail);
                *rolled_to = w->snap_step;
                if ((rc = rk_comm_allgather_u64(w->comm, rk_worker_state_hash(w), all, err)))
                    goto done;
                if (rk_guard_vote(all, nranks, &root, flags, &strict))
                    rc = rk_err_set(err, RK_EGUARD,
                                    "step %lld: replicas still differ after the repair",
                                    (long long)step);
            }
        }
    done:
        free(all);
        free(flags);
        if (rc || *rolled_to >= 0)
            return rc;
    }
    snap_copy(w, 1, 3);
    w->snap_step = step;
    w->snap_valid = 1;
    return RK_OK;
}

int rk_worker_step_begin(rk_worker *w, int64_t step, int64_t *rolled_to, rk_err *err)
{
    *rolled_to = -1;
    if (w->inj)
        faults_due(w, step);
    if (w->slow_until >= step) {
        struct timespec ts = {w->slow_ms / 1000, (long)(w->slow_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (w->hash_every > 0 && step % w->hash_every == 0 && !(w->snap_valid && w->snap_step == step))
        return replica_check(w, step, rolled_to, err);
    return RK_OK;
}

int rk_worker_observe(rk_worker *w, rk_batch_policy *policy, int n_local, double seconds,
                      rk_err *err)
{
    int nranks = w->world;
    uint64_t mine, *all = malloc((size_t)nranks * sizeof *all);
    if (!all)
        return rk_err_set(err, RK_ENOMEM, "throughput policy: out of memory");
    double rate = n_local > 0 && seconds > 0 ? n_local / seconds : 0.0;
    memcpy(&mine, &rate, sizeof mine);
    int rc = rk_comm_allgather_u64(w->comm, mine, all, err);
    for (int r = 0; r < nranks && !rc; r++) {
        double v;
        memcpy(&v, &all[r], sizeof v);
        if (v > 0) /* a rank with no samples this step has nothing to report */
            rc = rk_batch_observe_throughput(policy, r, v, err);
    }
    free(all);
    return rc;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

void rk_worker_ckpt_opts_default(rk_worker_ckpt_opts *o)
{
    memset(o, 0, sizeof *o);
    o->every = RK_CKPT_EVERY_DEFAULT;
    o->mtbf_s = 3600.0;
    o->keep = RK_CKPT_KEEP_DEFAULT;
    o->lock = 1;
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
    if (w->world > 1) {
        double status = rc;
        int crc = rk_comm_allreduce_sum_f64(w->comm, &status, 1, w->rank == 0 ? NULL : err);
        if (crc)
            return crc;
        if (w->rank != 0 && status != 0)
            return rk_err_set(err, (int)status, "checkpoint: rank 0 could not save step %lld (%s)",
                              (long long)step, rk_strerror((int)status));
    }
    return rc;
}

static int builtin_resume(rk_worker *w, int64_t *step, rk_err *err)
{
    int64_t hdr[2] = {0, 0}; /* rank 0's status, the step */
    int rc = RK_OK;
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
        int brc = rk_comm_bcast(w->comm, hdr, sizeof hdr, 0, w->rank == 0 ? NULL : err);
        if (brc)
            return brc;
        if (w->rank != 0 && hdr[0] != 0)
            return (int)hdr[0] == RK_ENOENT
                       ? rk_err_set(err, RK_ENOENT, "checkpoint: none in %s", w->dir)
                       : rk_err_set(err, (int)hdr[0], "checkpoint: rank 0 could not resume");
        for (int i = 0; i < w->nbufs && !hdr[0] && !rc; i++)
            if (replicated(&w->bufs[i]))
                rc = rk_comm_bcast(w->comm, w->bufs[i].data, w->bufs[i].bytes, 0, err);
    }
    *step = hdr[0] ? 0 : hdr[1];
    return hdr[0] ? (int)hdr[0] : rc;
}

/* Rank 0 takes the lock; the others learn whether it did (and the holder's pid). */
static int take_lock(rk_worker *w, rk_err *err)
{
    double st[2] = {0, 0}; /* rank 0's result, the holder's pid */
    int rc = RK_OK;
    if (w->rank == 0) {
        long holder = 0;
        rc = rk_ckpt_lock(w->dir, &w->held, &holder, err);
        st[0] = rc;
        st[1] = (double)holder;
    }
    if (w->world > 1) {
        int brc = rk_comm_bcast(w->comm, st, sizeof st, 0, w->rank == 0 ? NULL : err);
        if (brc) {
            rk_ckpt_unlock(w->held);
            w->held = NULL;
            return brc;
        }
        if (w->rank != 0 && st[0] != 0)
            return rk_err_set(err, (int)st[0],
                              "checkpoint: rank 0 could not lock %s (holder "
                              "pid %.0f)",
                              w->dir, st[1]);
    }
    return rc;
}

/* Whether this run takes DIR's writer lock: yes, unless it runs under a supervisor (`rk run`
 * sets RK_HEARTBEAT) that holds the lock of this very directory (its RK_CKPT_DIR). */
static int takes_lock(const char *dir)
{
    const char *sup = getenv("RK_HEARTBEAT"), *sup_dir = getenv("RK_CKPT_DIR");
    if (!sup || !*sup || !sup_dir || !*sup_dir)
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

static int do_resume(rk_worker *w, int64_t *step, rk_err *err)
{
    return w->saver.resume ? w->saver.resume(w->saver.user, step, err)
                           : builtin_resume(w, step, err);
}

int rk_worker_ckpt(rk_worker *w, const rk_worker_ckpt_opts *o, int64_t *start_step, rk_err *err)
{
    *start_step = 0;
    const char *dir = o->dir ? o->dir : getenv("RK_CKPT_DIR");
    const char *env_resume = getenv("RK_RESUME");
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
    int rc = RK_OK;
    if (o->lock > 0 && takes_lock(w->dir) && (rc = take_lock(w, err)))
        return rc;
    /* The directory is listed (every checkpoint read and verified) only when the answer
     * matters: no usable checkpoint of this run, or a fresh start. */
    if (o->resume || (env_resume && strcmp(env_resume, "1") == 0)) {
        int64_t step = 0;
        rc = do_resume(w, &step, err);
        int lrc = RK_OK;
        size_t existing = rc == RK_ENOENT ? valid_checkpoints(w->dir, &lrc, err) : 0;
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
            *start_step = w->start_step = step;
            w->ckpt_last = step;
            w->next_at = step + (w->every > 0 ? w->every : AUTO_FIRST_SAVE);
        }
    } else {
        size_t existing = valid_checkpoints(w->dir, &rc, err);
        if (!rc && existing > 0)
            rc = rk_err_set(err, RK_EINVAL,
                            "checkpoint directory %s already holds %zu checkpoint(s): "
                            "resume to continue that run (--resume, RK_RESUME=1), or choose an "
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
static int scheduled_save(rk_worker *w, int64_t steps_done, rk_err *err)
{
    double now = rk_mono_s();
    double dt = now - w->last_step_t;
    w->last_step_t = now;
    w->step_s = w->step_s > 0 ? 0.9 * w->step_s + 0.1 * dt : dt;
    if (steps_done < w->next_at)
        return RK_OK;
    int rc = rk_worker_ckpt_save(w, steps_done, err);
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

/* ---- commands ----------------------------------------------------------------------------- */

static int commands(rk_worker *w, int64_t steps_done, rk_err *err)
{
    /* every COMMAND_EVERY steps: agreeing costs a collective, which oversubscribed ranks
     * feel; a stop waits at most that many steps */
    if (!w->hb || steps_done % COMMAND_EVERY != 0)
        return RK_OK;
    rk_hb_cmd cmd = RK_HB_CMD_NONE;
    rk_hb_poll(w->hb, &cmd);
    /* a supervisor that vanished took the job with it: every rank stops, none saves */
    uint64_t mine = rk_hb_alive(w->hb) ? (uint64_t)cmd : GONE, agreed = mine;
    if (w->world > 1) { /* every rank acts at the same step, or a save would deadlock */
        uint64_t *v = malloc((size_t)w->world * sizeof *v);
        if (!v)
            return rk_err_set(err, RK_ENOMEM, "commands: out of memory");
        int rc = rk_comm_allgather_u64(w->comm, mine, v, err);
        for (int r = 0; r < w->world && !rc; r++)
            agreed = v[r] > agreed ? v[r] : agreed;
        free(v);
        if (rc)
            return rc;
    }
    if (agreed == RK_HB_CMD_NONE)
        return RK_OK;
    if (agreed == GONE)
        return rk_err_set(err, RK_EIO,
                          "step %lld: the supervisor has gone (its heartbeat socket "
                          "closed): stopping without a checkpoint",
                          (long long)steps_done);
    if (w->ckpt && w->ckpt_last != steps_done) {
        int rc = rk_worker_ckpt_save(w, steps_done, err);
        if (rc)
            return rc;
    }
    if (agreed == RK_HB_CMD_STOP)
        return rk_err_set(err, RK_ESTOPPED, "stopped at step %lld on the supervisor's command%s",
                          (long long)steps_done, w->ckpt ? ", checkpoint saved" : "");
    return RK_OK;
}

int rk_worker_step_end(rk_worker *w, int64_t steps_done, double loss, double seconds, rk_err *err)
{
    w->last_step = steps_done;
    rk_hb_step(w->hb, steps_done, loss, seconds);
    int rc = w->ckpt ? scheduled_save(w, steps_done, err) : RK_OK;
    return rc ? rc : commands(w, steps_done, err);
}
