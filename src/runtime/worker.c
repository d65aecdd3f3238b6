/*
 * The worker runtime (rekindle/worker.h): a rank's link to the supervisor (heartbeat.h),
 * injected faults delivered to the trainer's registered buffers (inject.h), replica hashes
 * with rollback and majority repair (guard.h), the supervisor's commands agreed over the
 * communicator (comm.h). The checkpoint policy is in worker_ckpt.c.
 */
#include "runtime/worker_internal.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include <stdint.h>

#include "base/clock.h"
#include "base/phase.h"
#include "base/text.h"
#include "rekindle/ckpt.h"
#include "rekindle/guard.h"
#include "rekindle/heartbeat.h"
#include "rekindle/inject.h"
#include "rekindle/rng.h"

#define COMMAND_EVERY 8           /* steps between agreements on the supervisor's commands */
#define GONE (RK_HB_CMD_STOP + 1) /* in the agreement: a rank's supervisor has gone */

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
    if (!rk_text_list_item(getenv("RK_DEVICES"), rank, buf, cap))
        snprintf(buf, cap, "%d", rank);
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
    /* one gather buffer for every per-step collective (world never changes) */
    w->gather = malloc((size_t)w->world * sizeof *w->gather);
    w->flags = malloc((size_t)w->world);
    if (!w->gather || !w->flags) {
        free(w->gather);
        free(w->flags);
        free(w);
        return rk_err_set(err, RK_ENOMEM, "worker: out of memory");
    }
    int rc = rk_inject_from_env(&w->inj, w->rank, err);
    w->t_arm = rk_mono_s();
    if (rc) {
        free(w->gather);
        free(w->flags);
        free(w);
        return rc;
    }
    *out = w;
    return RK_OK;
}

static int add(rk_worker *w, rk_worker_buf kind, const char *name, void *data, size_t bytes,
               int f32, rk_err *err)
{
    if (!w || !name || !*name || strlen(name) > 63 || !data || bytes == 0)
        return rk_err_set(err, RK_EINVAL,
                          "worker: buffer '%s': a name of 1..63 bytes, memory "
                          "and a length are needed",
                          name ? name : "(null)");
    if ((unsigned)kind > RK_WORKER_LOCAL)
        return rk_err_set(err, RK_EINVAL,
                          "worker: buffer '%s': kind %d is none of RK_WORKER_PARAM, _STATE, "
                          "_GRAD, _LOCAL",
                          name, (int)kind);
    if (w->began) /* its snapshot would be garbage at the next rollback */
        return rk_err_set(err, RK_EINVAL,
                          "worker: buffer '%s' registered after the first step (register "
                          "every buffer before rk_worker_step_begin)",
                          name);
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
    if (n > SIZE_MAX / sizeof(float))
        return rk_err_set(err, RK_EINVAL, "worker: buffer '%s': %zu floats do not fit in memory",
                          name ? name : "(null)", n);
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
    /* RK_TRACE_LAUNCH (base/phase.h): before the hello, so that rk run cannot act on it first */
    rk_phase_mark_env("worker.hello");
    return rk_hb_open_restored(&w->hb, w->rank, w->world, w->device, start_step, w->restore, err);
}

int rk_worker_exit_status(int code)
{
    switch (code) {
    case RK_OK: return RK_EXIT_OK;
    case RK_EINVAL:
    case RK_EFORMAT:
    case RK_ENOENT:
    case RK_EMISMATCH:
    case RK_EBUSY: return RK_EXIT_USAGE;
    case RK_ECOMM: return RK_EXIT_COMM;
    case RK_ESTOPPED: return RK_EXIT_STOPPED;
    case RK_EGUARD:
    case RK_ENONFINITE:
        return RK_EXIT_GUARD; /* wrong numbers: back to the last good state */
    /* a full, read-only or failing disk: its own status, so that rk run does not blame a GPU */
    case RK_ESTORAGE: return RK_EXIT_STORAGE;
    default: return RK_EXIT_FAIL;
    }
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
    free(w->gather);
    free(w->flags);
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

uint64_t rk_worker_state_hash(const rk_worker *w)
{
    XXH64_state_t st; /* on the stack: no allocation that could fail into a hash of 0 */
    XXH64_reset(&st, 0);
    for (int i = 0; i < w->nbufs; i++)
        if (replicated(&w->bufs[i]))
            XXH64_update(&st, w->bufs[i].data, w->bufs[i].bytes);
    return XXH64_digest(&st);
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
        uint64_t *all = w->gather;
        unsigned char *flags = w->flags;
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
                if (strict)
                    snprintf(detail, sizeof detail,
                             "parameters of rank %s differ from the majority's (%d of %d "
                             "ranks); repaired from rank %d, replaying from step %lld",
                             who, nranks - bad, nranks, root, (long long)w->snap_step);
                else /* a tie (1 against 1): which rank is wrong is unknown, none is blamed */
                    snprintf(detail, sizeof detail,
                             "the replicas of %d ranks differ with no majority; every rank "
                             "back to the verified snapshot, repaired from rank %d, replaying "
                             "from step %lld",
                             nranks, root, (long long)w->snap_step);
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
    int64_t ignored;
    if (!rolled_to) /* a trainer that never replays may pass NULL: a rollback is then an error */
        rolled_to = &ignored;
    *rolled_to = -1;
    w->began = 1;
    if (w->inj)
        faults_due(w, step);
    if (w->slow_until >= step) {
        struct timespec ts = {w->slow_ms / 1000, (long)(w->slow_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (w->hash_every > 0 && step % w->hash_every == 0 &&
        !(w->snap_valid && w->snap_step == step)) {
        int rc = replica_check(w, step, rolled_to, err);
        if (!rc && rolled_to == &ignored && ignored >= 0)
            return rk_err_set(err, RK_EGUARD,
                              "worker: the replicas were rolled back to step %lld, but the "
                              "trainer passed no rolled_to to replay from",
                              (long long)ignored);
        return rc;
    }
    return RK_OK;
}

int rk_worker_observe(rk_worker *w, rk_batch_policy *policy, int n_local, double seconds,
                      rk_err *err)
{
    int nranks = w->world;
    uint64_t mine, *all = w->gather;
    double rate = n_local > 0 && seconds > 0 ? n_local / seconds : 0.0;
    memcpy(&mine, &rate, sizeof mine);
    int rc = rk_comm_allgather_u64(w->comm, mine, all, err);
    for (int r = 0; r < nranks && !rc; r++) {
        double v;
        memcpy(&v, &all[r], sizeof v);
        if (v > 0) /* a rank with no samples this step has nothing to report */
            rc = rk_batch_observe_throughput(policy, r, v, err);
    }
    return rc;
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
        uint64_t *v = w->gather;
        int rc = rk_comm_allgather_u64(w->comm, mine, v, err);
        for (int r = 0; r < w->world && !rc; r++)
            agreed = v[r] > agreed ? v[r] : agreed;
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
    if (!w->step_said) { /* the launch's first step, about to be said: before rk run can act */
        w->step_said = 1;
        rk_phase_mark_env("worker.step");
    }
    rk_hb_step(w->hb, steps_done, loss, seconds);
    int rc = w->ckpt ? rk_worker_ckpt_step_end(w, steps_done, err) : RK_OK;
    return rc ? rc : commands(w, steps_done, err);
}
