/*
 * Training loop of the reference workload (train.h): per-epoch seeded permutation, batch
 * gather, forward, softmax cross-entropy, backward, optimiser step; evaluation on the test set.
 * Deterministic: every random choice derives from the config's seed.
 */
#include "nn/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rekindle/rng.h"

#define LOSS_WINDOW 100

void rk_train_config_default(rk_train_config *c, rk_optim_kind optim)
{
    memset(c, 0, sizeof *c);
    c->epochs = 1;
    c->batch = 64;
    c->optim = optim;
    c->momentum = 0.9f;
    c->nesterov = 1;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->eps = 1e-8f;
    c->seed = 1;
    c->eval = 1;
    c->schedule = RK_LR_CONSTANT;
    if (optim == RK_OPTIM_ADAMW) {
        c->lr = 1e-3f;
        c->weight_decay = 0.01f;
    } else {
        c->lr = 0.01f;
        c->weight_decay = 0.0f;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int rk_optim_init(rk_optim *o, rk_optim_kind kind, const rk_model *m, rk_err *err)
{
    memset(o, 0, sizeof *o);
    o->kind = kind;
    size_t bytes = m->block_len * sizeof(float);
    o->s1 = m->be->alloc(bytes);
    o->s2 = kind == RK_OPTIM_ADAMW ? m->be->alloc(bytes) : NULL;
    if (!o->s1 || (kind == RK_OPTIM_ADAMW && !o->s2)) {
        rk_optim_free(o, m);
        return rk_err_set(err, RK_ENOMEM, "optimiser: out of memory");
    }
    memset(o->s1, 0, bytes);
    if (o->s2)
        memset(o->s2, 0, bytes);
    return RK_OK;
}

void rk_optim_free(rk_optim *o, const rk_model *m)
{
    m->be->free(o->s1);
    m->be->free(o->s2);
    o->s1 = o->s2 = NULL;
}

/* One update of the whole parameter block (padding stays zero: its gradient is zero). */
int rk_optim_step(rk_optim *o, rk_model *m, const rk_train_config *c, float lr, rk_err *err)
{
    o->t++;
    if (o->kind == RK_OPTIM_ADAMW)
        return m->be->adamw_step(m->block_len, m->data_block, m->grad_block, o->s1, o->s2, lr,
                                 c->beta1, c->beta2, c->eps, c->weight_decay, o->t, err);
    return m->be->sgd_step(m->block_len, m->data_block, m->grad_block, o->s1, lr, c->momentum,
                           c->weight_decay, c->nesterov, err);
}

int rk_evaluate(rk_model *m, const rk_dataset *ds, rk_comm *comm, double *accuracy, double *loss,
                rk_err *err)
{
    int rank = comm ? rk_comm_rank(comm) : 0, size = comm ? rk_comm_size(comm) : 1;
    int pixels = ds->rows * ds->cols;
    int lo = (int)((int64_t)ds->n * rank / size), hi = (int)((int64_t)ds->n * (rank + 1) / size);
    double sums[2] = {0.0, 0.0}; /* correct predictions, summed loss */
    for (int start = lo; start < hi; start += m->max_batch) {
        int n = hi - start < m->max_batch ? hi - start : m->max_batch;
        const float *logits;
        int rc = rk_model_forward(m, n, ds->images + (size_t)start * pixels, 0, 0, 0, 0, &logits,
                                  err);
        double l;
        int c;
        if (!rc)
            rc = m->be->softmax_xent(n, RK_CLASSES, logits, ds->labels + start, NULL, n, &l, &c,
                                     err);
        if (rc)
            return rc;
        sums[0] += c;
        sums[1] += l * n;
    }
    if (comm) {
        int rc = rk_comm_allreduce_sum_f64(comm, sums, 2, err);
        if (rc)
            return rc;
    }
    *accuracy = sums[0] / ds->n;
    if (loss)
        *loss = sums[1] / ds->n;
    return RK_OK;
}

/* Mean of the loss window: the last min(steps, LOSS_WINDOW) losses. */
static double window_mean(const double *window, int64_t steps)
{
    int w = steps < LOSS_WINDOW ? (int)steps : LOSS_WINDOW;
    double sum = 0.0;
    for (int i = 0; i < w; i++)
        sum += window[i];
    return w ? sum / w : NAN;
}

static float lr_at(const rk_train_config *c, int64_t step, int64_t total)
{
    if (c->schedule == RK_LR_COSINE && total > 0)
        return (float)(0.5 * c->lr * (1.0 + cos(M_PI * (double)step / (double)total)));
    return c->lr;
}

/* Even split: global / nranks each, the remainder to the lowest ranks. */
static void split_even(int64_t global, int nranks, int64_t *shares)
{
    for (int r = 0; r < nranks; r++)
        shares[r] = global / nranks + (r < global % nranks);
}

/* The shares of this step: the policy's for a full batch, an even split for the short last
 * batch of an epoch. Checked, since a bad split would silently skip or repeat samples. */
static int step_shares(const rk_train_config *c, int64_t global, int nranks, int max_share,
                       int64_t *shares, rk_err *err)
{
    if (c->shares && global == c->batch) {
        int rc = c->shares(c->shares_user, global, nranks, shares, err);
        if (rc)
            return rc;
    } else {
        split_even(global, nranks, shares);
    }
    int64_t sum = 0;
    for (int r = 0; r < nranks; r++) {
        if (shares[r] < 0 || shares[r] > max_share)
            return rk_err_set(err, RK_EINVAL, "batch policy gave rank %d a share of %lld (0..%d)",
                              r, (long long)shares[r], max_share);
        sum += shares[r];
    }
    if (sum != global)
        return rk_err_set(err, RK_EINVAL, "batch policy shares sum to %lld, not %lld",
                          (long long)sum, (long long)global);
    return RK_OK;
}

int rk_train(rk_model *m, rk_optim *opt, const rk_dataset *train, const rk_dataset *test,
             const rk_train_config *c, rk_comm *comm, rk_train_progress_fn progress,
             void *user, rk_train_result *res, rk_err *err)
{
    memset(res, 0, sizeof *res);
    res->test_accuracy = -1.0;
    int rank = comm ? rk_comm_rank(comm) : 0, nranks = comm ? rk_comm_size(comm) : 1;
    if (c->batch < nranks)
        return rk_err_set(err, RK_EINVAL, "global batch %d is smaller than the %d ranks",
                          c->batch, nranks);
    if (train->rows * train->cols != m->layers[0].in_size)
        return rk_err_set(err, RK_EMISMATCH, "model %s expects %d inputs per sample, data has %d",
                          m->name, m->layers[0].in_size, train->rows * train->cols);
    const rk_backend *be = m->be;
    int pixels = train->rows * train->cols;
    int64_t steps_per_epoch = (train->n + c->batch - 1) / c->batch;
    int64_t total_steps = steps_per_epoch * c->epochs;
    if (c->max_steps > 0 && c->max_steps < total_steps)
        total_steps = c->max_steps;

    if (c->start_step < 0 || c->start_step > total_steps)
        return rk_err_set(err, RK_EINVAL, "resume step %lld is outside 0..%lld",
                          (long long)c->start_step, (long long)total_steps);
    int rc = RK_OK;
    int cap = m->max_batch; /* the most samples one rank takes in a step */
    uint32_t *order = malloc((size_t)train->n * sizeof *order);
    int64_t *shares = malloc((size_t)nranks * sizeof *shares);
    float *xb = be->alloc((size_t)cap * pixels * sizeof(float));
    float *dlogits = be->alloc((size_t)cap * RK_CLASSES * sizeof(float));
    uint8_t *yb = malloc((size_t)cap);
    double window[LOSS_WINDOW];
    int64_t step = c->start_step, total_samples = 0, taken = 0; /* taken: steps in this run */
    if (!order || !shares || !xb || !dlogits || !yb) {
        rc = rk_err_set(err, RK_ENOMEM, "training: out of memory");
        goto out;
    }

    for (int epoch = (int)(step / steps_per_epoch); epoch < c->epochs && step < total_steps && !rc;
         epoch++) {
        rk_rng r;
        rk_rng_derive(&r, c->seed, 0x6570636fULL, (uint64_t)epoch);
        rk_rng_permutation(&r, order, (size_t)train->n);
        double t0 = now_s(), last_report = 0.0;
        int64_t samples = 0;
        int64_t first = step - (int64_t)epoch * steps_per_epoch; /* > 0 only when resuming */
        int64_t in_epoch = steps_per_epoch;
        if (total_steps - (int64_t)epoch * steps_per_epoch < in_epoch)
            in_epoch = total_steps - (int64_t)epoch * steps_per_epoch;
        for (int64_t s = first; s < in_epoch; s++) {
            /* this step's global batch: order[start, start + global); this rank's slice */
            int start = (int)(s * c->batch);
            int global = train->n - start < c->batch ? train->n - start : c->batch;
            if ((rc = step_shares(c, global, nranks, cap, shares, err)))
                break;
            int offset = 0;
            for (int q = 0; q < rank; q++)
                offset += (int)shares[q];
            int n = (int)shares[rank];
            for (int i = 0; i < n; i++) {
                uint32_t k = order[start + offset + i];
                memcpy(xb + (size_t)i * pixels, train->images + (size_t)k * pixels,
                       (size_t)pixels * sizeof(float));
                yb[i] = train->labels[k];
            }
            double loss = 0.0, loss_sum = 0.0, tc = now_s();
            if (n > 0) {
                const float *logits;
                if ((rc = rk_model_forward(m, n, xb, 1, c->seed, (uint64_t)step,
                                           (uint64_t)(start + offset), &logits, err)) ||
                    (rc = be->softmax_xent(n, RK_CLASSES, logits, yb, dlogits, global, &loss, NULL,
                                           err)) ||
                    (rc = rk_model_backward(m, n, dlogits, err)))
                    break;
                loss_sum = loss * n;
            } else {
                memset(m->grad_block, 0, m->block_len * sizeof(float));
            }
            tc = now_s() - tc;
            if (global == c->batch)
                for (int q = 0; q < nranks && q < 8; q++)
                    res->last_shares[q] = shares[q];
            double ta = now_s();
            if (nranks > 1 &&
                ((rc = rk_comm_allreduce_sum_f32(comm, m->grad_block, m->block_len, err)) ||
                 (rc = rk_comm_allreduce_sum_f64(comm, &loss_sum, 1, err))))
                break;
            res->allreduce_seconds += now_s() - ta;
            if ((rc = rk_optim_step(opt, m, c, lr_at(c, step, total_steps), err)) ||
                (c->observe && (rc = c->observe(c->shares_user, step, n, tc, err))))
                break;
            loss = loss_sum / global;
            if (c->loss_log)
                fprintf(c->loss_log, "%lld %.9g\n", (long long)step, loss);
            window[taken % LOSS_WINDOW] = loss;
            taken++;
            step++;
            samples += global;
            if (c->step_end &&
                (rc = c->step_end(c->step_end_user, step, epoch, (int64_t)start + global, err)))
                break;
            double t = now_s() - t0;
            if (progress && t - last_report >= 0.1 && s + 1 < in_epoch) {
                last_report = t;
                rk_train_progress p = {
                    .epoch = epoch + 1,
                    .epochs = c->epochs,
                    .step_in_epoch = s + 1,
                    .steps_in_epoch = in_epoch,
                    .step = step,
                    .loss = window_mean(window, taken),
                    .samples_per_s = t > 0 ? samples / t : 0.0,
                    .eta_s = (double)(in_epoch - s - 1) * t / (double)(s + 1 - first),
                    .test_accuracy = -1.0,
                };
                progress(&p, user);
            }
        }
        double epoch_s = now_s() - t0;
        res->train_seconds += epoch_s;
        res->epochs_run = epoch + 1;
        if (rc)
            break;
        if (c->eval && test)
            rc = rk_evaluate(m, test, comm, &res->test_accuracy, &res->test_loss, err);
        if (progress && !rc) {
            rk_train_progress p = {
                .epoch = epoch + 1,
                .epochs = c->epochs,
                .step_in_epoch = in_epoch,
                .steps_in_epoch = in_epoch,
                .step = step,
                .loss = window_mean(window, taken),
                .samples_per_s = epoch_s > 0 ? samples / epoch_s : 0.0,
                .eta_s = 0.0,
                .epoch_done = 1,
                .test_accuracy = c->eval && test ? res->test_accuracy : -1.0,
            };
            progress(&p, user);
        }
        total_samples += samples;
    }
    if (!rc) {
        res->final_train_loss = window_mean(window, taken);
        res->steps = step;
        res->train_samples_per_s = res->train_seconds > 0 ? total_samples / res->train_seconds : 0;
    }
out:
    free(order);
    free(shares);
    be->free(xb);
    be->free(dlogits);
    free(yb);
    return rc;
}
