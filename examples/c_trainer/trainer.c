/*
 * A second trainer on rekindle's worker runtime (docs/worker.md): logistic regression on a
 * seeded synthetic data set, data-parallel over the communicator (one process alone, or
 * ranks under mpirun / rk run), built only on the installed headers of include/rekindle/.
 *
 *     cc -std=c17 -O2 trainer.c -o trainer $(pkg-config --cflags --libs rekindle) -lm
 *     ./trainer --steps 300
 *     rk run -n 2 --ckpt-dir ck --inject crash@step=40:rank=1 -- ./trainer --steps 300
 *
 * Every step's batch is drawn from (seed, step) alone and the state is w and the momentum, so
 * a run that crashed and resumed, hung and was relaunched, or had a bit flipped and was
 * repaired ends with the same bits as a fault-free one: it prints the state's hash.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rekindle/comm.h>
#include <rekindle/error.h>
#include <rekindle/heartbeat.h>
#include <rekindle/rng.h>
#include <rekindle/worker.h>

#define FEATURES 16
#define SAMPLES 4096
#define NW (FEATURES + 1) /* weights and bias */

typedef struct opts {
    int64_t steps;
    int batch;
    float lr, momentum;
    uint64_t seed;
    int sleep_ms; /* 0..999 ms more per step, as a bigger model would take */
    const char *hash_file;
} opts;

/* The data set: x uniform in [-1, 1), y = 1 when a fixed "true" model says so (with 10% of
 * labels flipped), all from the seed. */
static void make_data(uint64_t seed, float *x, float *y)
{
    rk_rng r;
    float truth[NW];
    rk_rng_derive(&r, seed, 1, 0);
    for (int j = 0; j < NW; j++)
        truth[j] = 2.0f * rk_rng_uniform(&r) - 1.0f;
    for (int i = 0; i < SAMPLES; i++) {
        float z = truth[FEATURES];
        for (int j = 0; j < FEATURES; j++) {
            x[i * FEATURES + j] = 2.0f * rk_rng_uniform(&r) - 1.0f;
            z += truth[j] * x[i * FEATURES + j];
        }
        y[i] = (z > 0) != (rk_rng_uniform(&r) < 0.1f);
    }
}

/* This rank's part of the gradient of the batch's mean loss (into g) and its loss sum. */
static double local_grad(const opts *o, const float *x, const float *y, const float *w,
                         int64_t step, int rank, int world, float *g)
{
    rk_rng r;
    rk_rng_derive(&r, o->seed, 2, (uint64_t)step);
    int lo = o->batch * rank / world, hi = o->batch * (rank + 1) / world;
    double loss = 0.0;
    memset(g, 0, NW * sizeof *g);
    for (int k = 0; k < o->batch; k++) {
        int i = (int)rk_rng_below(&r, SAMPLES); /* every rank draws the whole batch */
        if (k < lo || k >= hi)
            continue;
        float z = w[FEATURES];
        for (int j = 0; j < FEATURES; j++)
            z += w[j] * x[i * FEATURES + j];
        float p = 1.0f / (1.0f + expf(-z)), d = (p - y[i]) / (float)o->batch;
        for (int j = 0; j < FEATURES; j++)
            g[j] += d * x[i * FEATURES + j];
        g[FEATURES] += d;
        loss -= y[i] ? log(p + 1e-12) : log(1.0 - p + 1e-12);
    }
    return loss;
}

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){.steps = 300, .batch = 64, .lr = 0.5f, .momentum = 0.9f, .seed = 1};
    int bad = 0;
    for (int i = 1; i < argc && !bad; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: trainer [--steps N] [--seed N] [--sleep-ms 0..999] "
                   "[--hash-file FILE]\n");
            return 1;
        }
        if (!strcmp(argv[i], "--steps") && v)
            o->steps = strtoll(v, NULL, 10);
        else if (!strcmp(argv[i], "--seed") && v)
            o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(argv[i], "--sleep-ms") && v)
            o->sleep_ms = atoi(v);
        else if (!strcmp(argv[i], "--hash-file") && v)
            o->hash_file = v;
        else
            bad = 1;
    }
    if (bad || o->steps < 0 || o->steps > (int64_t)1 << 40 || o->sleep_ms < 0 ||
        o->sleep_ms > 999) {
        fprintf(stderr, "usage: trainer [--steps N] [--seed N] [--sleep-ms 0..999] "
                        "[--hash-file FILE]\n");
        return -1;
    }
    return 0;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The loop: the worker runtime's four calls around an ordinary SGD step. */
static int train(const opts *o, rk_comm *comm, rk_worker *w, const float *x, const float *y,
                 float *wt, float *g, float *v, int64_t *step, rk_err *err)
{
    int rank = rk_comm_rank(comm), world = rk_comm_size(comm), rc, redo = 0;
    while (*step < o->steps) {
        double t0 = mono_s();
        int64_t back;
        if ((rc = rk_worker_step_begin(w, *step, &back, err)))
            return rc;
        if (back >= 0) { /* replicas differed: repaired from the majority, replay */
            *step = back;
            continue;
        }
        double loss = local_grad(o, x, y, wt, *step, rank, world, g);
        if (o->sleep_ms > 0)
            nanosleep(&(struct timespec){0, o->sleep_ms * 1000000L}, NULL);
        if ((rc = rk_worker_grads(w, *step, err)) ||
            (rc = rk_comm_allreduce_sum_f32(comm, g, NW, err)) ||
            (rc = rk_comm_allreduce_sum_f64(comm, &loss, 1, err)))
            return rc;
        double norm = 0.0;
        for (int j = 0; j < NW; j++)
            norm += (double)g[j] * g[j];
        if (!isfinite(norm) || !isfinite(loss)) { /* every rank sees the same sums: redo */
            if (++redo > 3)
                return rk_err_set(err, RK_EGUARD, "step %lld: non-finite gradient, %d times",
                                  (long long)*step, redo);
            rk_worker_event(w, *step, "nan", -1, "redo", 1, "non-finite gradient");
            continue;
        }
        redo = 0;
        for (int j = 0; j < NW; j++) { /* SGD with momentum */
            v[j] = o->momentum * v[j] + g[j];
            wt[j] -= o->lr * v[j];
        }
        ++*step;
        if ((rc = rk_worker_step_end(w, *step, loss / o->batch, mono_s() - t0, err)))
            return rc;
    }
    return rk_worker_ckpt_final(w, *step, err);
}

int main(int argc, char **argv)
{
    opts o;
    int p = parse(argc, argv, &o);
    if (p)
        return p > 0 ? RK_EXIT_OK : RK_EXIT_USAGE; /* --help, or bad usage */
    static float x[SAMPLES * FEATURES], y[SAMPLES];
    float wt[NW] = {0}, g[NW] = {0}, v[NW] = {0};
    make_data(o.seed, x, y);

    rk_err err = {0};
    rk_comm *comm = NULL;
    rk_worker *w = NULL;
    int64_t step = 0;
    int rc = rk_comm_open(&comm, "auto", &err);
    rk_worker_opts wo;
    rk_worker_opts_default(&wo);
    wo.name = "c_trainer";
    wo.notes = stdout;
    wo.diag = stderr;
    wo.seed = o.seed;
    wo.hash_every = 10;
    if (!rc)
        rc = rk_worker_open(&w, comm, &wo, &err);
    /* what the runtime may hash, repair, save and flip bits in */
    if (!rc && !(rc = rk_worker_add_f32(w, RK_WORKER_PARAM, "model.w", wt, NW, &err)) &&
        !(rc = rk_worker_add_f32(w, RK_WORKER_STATE, "optim.v", v, NW, &err)))
        rc = rk_worker_add_f32(w, RK_WORKER_GRAD, "grad.w", g, NW, &err);
    if (!rc) { /* checkpoints in $RK_CKPT_DIR (rk run sets it), resumed with RK_RESUME=1 */
        rk_worker_ckpt_opts co;
        rk_worker_ckpt_opts_default(&co);
        co.every = 25;
        co.config_json = "{\"trainer\":\"c_trainer\"}";
        rc = rk_worker_ckpt(w, &co, &step, &err);
    }
    if (!rc)
        rc = rk_worker_hello(w, step, &err);
    if (!rc)
        rc = train(&o, comm, w, x, y, wt, g, v, &step, &err);
    int rank = comm ? rk_comm_rank(comm) : 0;
    if (!rc && rank == 0) {
        printf("trained %lld steps: w[0] %.6f bias %.6f, state xxh64 %016llx\n", (long long)step,
               (double)wt[0], (double)wt[FEATURES], (unsigned long long)rk_worker_state_hash(w));
        FILE *f = o.hash_file ? fopen(o.hash_file, "w") : NULL;
        if (f) {
            fprintf(f, "%016llx\n", (unsigned long long)rk_worker_state_hash(w));
            fclose(f);
        }
    }
    if (rc)
        fprintf(stderr, "c_trainer (rank %d): %s\n", rank, err.msg[0] ? err.msg : rk_strerror(rc));
    int status = rk_worker_exit_status(rc);
    rk_worker_close(w, step, status, rc ? err.msg : NULL);
    rk_comm_close(comm);
    return status;
}
