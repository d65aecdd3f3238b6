/*
 * rk train under `rk run` (worker.h): heartbeats at each step, guard trips as events,
 * injected faults delivered at the trainer's hook points, and the supervisor's checkpoint and
 * stop commands agreed by all ranks. Relies on rekindle/heartbeat.h and rekindle/inject.h.
 */
#include "worker.h"

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "rekindle/rng.h"

#define COMMAND_EVERY 8 /* steps between agreements on the supervisor's commands */
#define GONE (RK_HB_CMD_STOP + 1) /* in the agreement: a rank's supervisor has gone */

const char *rk_worker_device(int rank, char *buf, size_t cap)
{
    const char *list = getenv("RK_DEVICES");
    snprintf(buf, cap, "%d", rank);
    if (!list || !*list)
        return buf;
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
    return buf;
}

int rk_worker_open(rk_worker *w, rk_comm *comm, uint64_t seed, rk_err *err)
{
    memset(w, 0, sizeof *w);
    w->comm = comm;
    w->rank = rk_comm_rank(comm);
    w->world = rk_comm_size(comm);
    w->seed = seed;
    w->slow_until = -1;
    int rc = rk_inject_from_env(&w->inj, w->rank, err);
    w->t_arm = rk_mono_s();
    return rc;
}

int rk_worker_hello(rk_worker *w, int64_t start_step, rk_err *err)
{
    if (w->hb)
        return RK_OK;
    char dev[64];
    return rk_hb_open(&w->hb, w->rank, w->world, rk_worker_device(w->rank, dev, sizeof dev),
                      start_step, err);
}

void rk_worker_close(rk_worker *w, int64_t step, int status, const char *why)
{
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
    w->hb = NULL;
    w->inj = NULL;
}

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

/* One bit of one parameter of this replica. */
static void inject_bitflip(rk_worker *w, rk_model *m, int64_t step)
{
    uint64_t c = choice(w, step, 1);
    size_t idx = (size_t)(c % m->numel);
    int bit = (int)((c >> 40) % 32);
    for (int p = 0; p < m->nparams; p++) {
        if (idx < m->params[p].numel) {
            flip(&m->params[p].data[idx], bit);
            fprintf(stderr, "rk train (rank %d): injected bitflip: bit %d of %s[%zu] at step %lld\n",
                    w->rank, bit, m->params[p].name, idx, (long long)step);
            return;
        }
        idx -= m->params[p].numel;
    }
}

/* A high exponent bit (30) of one gradient element of magnitude in (0, 2): the value grows by
 * 2^128, to a huge number or infinity. */
static void inject_gradflip(rk_worker *w, rk_model *m, int64_t step)
{
    size_t n = m->block_len, start = (size_t)(choice(w, step, 2) % n);
    for (size_t k = 0; k < n; k++) {
        float *g = &m->grad_block[(start + k) % n];
        if (*g != 0.0f && fabsf(*g) < 2.0f) {
            flip(g, 30);
            return;
        }
    }
}

static void inject_nan(rk_worker *w, rk_model *m, int64_t step)
{
    size_t idx = (size_t)(choice(w, step, 3) % m->numel);
    for (int p = 0; p < m->nparams; p++) {
        if (idx < m->params[p].numel) {
            m->params[p].grad[idx] = NAN;
            return;
        }
        idx -= m->params[p].numel;
    }
}

/* The faults due at the start of `step`: crash, slow and bitflip act now; hang, nan and
 * gradflip wait for the gradients, commfail for the collectives. */
static void faults_due(rk_worker *w, int64_t step, rk_model *m)
{
    size_t idx[16];
    size_t n = rk_inject_due(w->inj, step, rk_mono_s() - w->t_arm, idx, 16);
    for (size_t i = 0; i < n; i++) {
        const rk_fault *f = rk_inject_get(w->inj, idx[i]);
        const char *kind = rk_fault_kind_name(f->kind);
        rk_hb_inject(w->hb, step, (int)idx[i], kind); /* said before it happens */
        fprintf(stderr, "rk train (rank %d): injected fault %s at step %lld (simulated)\n",
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
        case RK_FAULT_BITFLIP: inject_bitflip(w, m, step); break;
        case RK_FAULT_NAN: w->pending_nan = 1; break;
        case RK_FAULT_GRADFLIP: w->pending_gradflip = 1; break;
        case RK_FAULT_COMMFAIL: w->pending_commfail = 1; break;
        }
    }
}

static int hook_point(void *user, rk_train_point where, int64_t step, rk_model *m, rk_err *err)
{
    rk_worker *w = user;
    switch (where) {
    case RK_POINT_STEP:
        if (w->inj)
            faults_due(w, step, m);
        if (w->slow_until >= step) {
            struct timespec ts = {w->slow_ms / 1000, (long)(w->slow_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        break;
    case RK_POINT_GRADS:
        if (w->pending_hang) {
            fflush(NULL);
            for (;;)
                pause(); /* stuck in compute, as in a kernel or driver call that never returns */
        }
        if (w->pending_nan)
            inject_nan(w, m, step);
        if (w->pending_gradflip)
            inject_gradflip(w, m, step);
        w->pending_nan = w->pending_gradflip = 0;
        break;
    case RK_POINT_COMM:
        if (w->pending_commfail) {
            w->pending_commfail = 0;
            return rk_err_set(err, RK_ECOMM,
                              "step %lld: injected communication failure (simulated)",
                              (long long)step);
        }
        rk_hb_comm(w->hb, step);
        break;
    }
    return RK_OK;
}

static void hook_incident(void *user, const rk_train_incident *inc)
{
    rk_worker *w = user;
    /* every rank sees the same trip; rank 0 speaks for the job */
    if (w->rank != 0)
        return;
    rk_hb_event(w->hb, inc->step, inc->kind, inc->blame, inc->action, inc->lost_steps,
                inc->detail);
    fprintf(stderr, "rk train: guard: step %lld: %s -> %s: %s\n", (long long)inc->step,
            inc->kind, inc->action, inc->detail);
}

static void hook_stepped(void *user, int64_t step, double loss, double seconds)
{
    rk_worker *w = user;
    w->last_step = step;
    rk_hb_step(w->hb, step, loss, seconds);
}

void rk_worker_hooks(rk_worker *w, rk_train_config *c)
{
    c->point = hook_point;
    c->incident = hook_incident;
    c->stepped = hook_stepped;
    c->hook_user = w;
}

int rk_worker_may_save(void *user, rk_err *err)
{
    rk_worker *w = user;
    if (!w->hb || rk_hb_alive(w->hb))
        return RK_OK;
    return rk_err_set(err, RK_EIO,
                      "the supervisor has gone (its heartbeat socket closed): "
                      "no checkpoint is written after it");
}

void rk_worker_saved(rk_worker *w, int64_t step, double seconds)
{
    if (w->rank == 0)
        rk_hb_ckpt(w->hb, step, seconds);
}

int rk_worker_commands(rk_worker *w, int64_t steps_done, int epoch, int64_t cursor, rk_err *err)
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
    if (w->ck && w->ck->last_step != steps_done) {
        double t0 = rk_mono_s();
        int rc = rk_trainer_ckpt_save(w->ck, steps_done, epoch, cursor, err);
        if (rc)
            return rc;
        rk_worker_saved(w, steps_done, rk_mono_s() - t0);
    }
    if (agreed == RK_HB_CMD_STOP) {
        w->stopped = 1;
        return rk_err_set(err, RK_ESTOPPED, "stopped at step %lld on the supervisor's command%s",
                          (long long)steps_done, w->ck ? ", checkpoint saved" : "");
    }
    return RK_OK;
}
