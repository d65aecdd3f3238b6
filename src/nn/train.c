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

#include <stdarg.h>
#include <stdio.h>

#include "base/clock.h"
#include "rekindle/guard.h"
#include "rekindle/rng.h"
#include "rekindle/worker.h"

#define LOSS_WINDOW 100

void rk_train_config_default(rk_train_config *c, rk_optim_kind optim)
{
    memset(c, 0, sizeof *c);
    c->epochs = 1;
    c->batch = 64;
    c->optim = optim;
    c->momentum = 0.9f;
    c->nesterov = 1;
    c->compress_momentum = 1;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->eps = 1e-8f;
    c->seed = 1;
    c->eval = 1;
    c->schedule = RK_LR_CONSTANT;
    c->guard = 1;
    c->spike_z = RK_SPIKE_Z_DEFAULT;
    c->spike_window = RK_SPIKE_WINDOW_DEFAULT;
    c->grad_ratio = RK_GRAD_RATIO_DEFAULT;
    if (optim == RK_OPTIM_ADAMW) {
        c->lr = 1e-3f;
        c->weight_decay = 0.01f;
    } else {
        c->lr = 0.01f;
        c->weight_decay = 0.0f;
    }
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

/* Zero the gradient block between tensors and after the last (rk_model_backward leaves it so). */
static void zero_padding(rk_model *m)
{
    for (int i = 0; i < m->nparams; i++) {
        const rk_param *p = &m->params[i];
        float *end = i + 1 < m->nparams ? m->params[i + 1].grad : m->grad_block + m->block_len;
        memset(p->grad + p->numel, 0, (size_t)(end - (p->grad + p->numel)) * sizeof(float));
    }
}

/* grad += k * (momentum * v + weight_decay * w) over the block. With k = scale / ranks on every
 * rank before the allreduce, the sum of the ranks' blocks is the new momentum (times the loss
 * scale) that the SGD step would build from the summed gradient; with k = -scale after it, the
 * block is again a gradient, one from which the step rebuilds exactly that (compressed)
 * momentum. */
static void momentum_shift(rk_model *m, const rk_optim *o, const rk_train_config *c, float k)
{
    const float mu = c->momentum, wd = c->weight_decay;
    float *g = m->grad_block;
    const float *v = o->s1, *w = m->data_block;
    for (size_t i = 0; i < m->block_len; i++)
        g[i] += k * (mu * v[i] + wd * w[i]);
}

int rk_evaluate(rk_model *m, const rk_dataset *ds, rk_comm *comm, double *accuracy, double *loss,
                rk_err *err)
{
    int rank = comm ? rk_comm_rank(comm) : 0, size = comm ? rk_comm_size(comm) : 1;
    int pixels = ds->rows * ds->cols;
    int lo = (int)((int64_t)ds->n * rank / size), hi = (int)((int64_t)ds->n * (rank + 1) / size);
    double sums[2] = {0.0, 0.0}; /* correct predictions, summed loss */
    float *xb = m->be->alloc((size_t)m->max_batch * pixels * sizeof(float));
    if (!xb)
        return rk_err_set(err, RK_ENOMEM, "evaluation: out of memory for a batch of %d images",
                          m->max_batch);
    for (int start = lo; start < hi; start += m->max_batch) {
        int n = hi - start < m->max_batch ? hi - start : m->max_batch;
        const float *logits;
        rk_dataset_images(ds, start, n, xb);
        int rc = rk_model_forward(m, n, xb, 0, 0, 0, 0, &logits, err);
        double l;
        int c;
        if (!rc)
            rc = m->be->softmax_xent(n, RK_CLASSES, logits, ds->labels + start, NULL, n, &l, &c,
                                     err);
        if (rc) {
            m->be->free(xb);
            return rc;
        }
        sums[0] += c;
        sums[1] += l * n;
    }
    m->be->free(xb);
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

/* ---- guards --------------------------------------------------------------------------- */

static void report(const rk_train_config *c, rk_train_result *res, const char *kind,
                   const char *action, int64_t step, int blame, int64_t lost, const char *fmt, ...)
{
    res->incidents++;
    res->redone_steps += lost;
    if (!c->worker)
        return;
    char detail[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    rk_worker_event(c->worker, step, kind, blame, action, lost, detail);
}

/* Gradient norm of this rank, scaled to a full batch (each rank's gradient carries its share
 * n / global of the batch); NAN when the loss or a gradient is not finite; -1 without samples. */
static double grad_norm(const rk_model *m, int n, int global, double loss)
{
    if (n <= 0)
        return -1.0;
    double s = 0.0;
    const float *g = m->grad_block;
    for (size_t i = 0; i < m->block_len; i++)
        s += (double)g[i] * g[i];
    if (!isfinite(s) || !isfinite(loss))
        return NAN;
    return sqrt(s) * (double)global / n;
}

int rk_train_judge_grads(const double *norms, int nranks, double ratio, int *trip, int *blame,
                         char *who, size_t cap, rk_err *err)
{
    unsigned char *flags = malloc((size_t)nranks);
    if (!flags)
        return rk_err_set(err, RK_ENOMEM, "guards: out of memory");
    *trip = 0;
    *blame = -1;
    who[0] = '\0';
    if (rk_guard_outliers(norms, nranks, ratio, flags)) {
        size_t k = 0;
        *trip = 2;
        for (int r = 0; r < nranks; r++) /* a non-finite norm is the step's fault: its rank */
            if (flags[r] && !isfinite(norms[r]) && *trip == 2) {
                *trip = 1;
                *blame = r;
            }
        for (int r = 0; r < nranks; r++)
            if (flags[r]) {
                if (*blame < 0)
                    *blame = r;
                if (k + 40 < cap)
                    k += (size_t)snprintf(who + k, cap - k, "%srank %d norm %.3g", k ? ", " : "", r,
                                          norms[r]);
            }
    }
    free(flags);
    return RK_OK;
}

/* A loss spike's check: this rank's forward of the step again (the same samples, dropout's
 * seed, step and offset: the same masks), its loss compared bit for bit with the first one
 * (`first`), and one all-reduce of whether any rank's differed. *same: 1 if every rank's was
 * the same (the spike is the data), 0 if one differed (a transient fault: the step is redone).
 * A forward changes no state the step keeps (the model has no running statistics; the
 * gradients are reduced already). */
/* The training forward of this rank's n samples of step `step` (dropout's masks from seed,
 * step and offset) and its share of the global batch's loss into *loss, dlogits its gradient. */
static int forward_loss(rk_model *m, int n, const float *xb, const uint8_t *yb, float *dlogits,
                        int global, uint64_t seed, int64_t step, int offset, double *loss,
                        rk_err *err)
{
    const float *logits;
    int rc = rk_model_forward(m, n, xb, 1, seed, (uint64_t)step, (uint64_t)offset, &logits, err);
    return rc ? rc
              : m->be->softmax_xent(n, RK_CLASSES, logits, yb, dlogits, global, loss, NULL, err);
}

static int forward_again(rk_model *m, int n, const float *xb, const uint8_t *yb, float *dlogits,
                         int global, uint64_t seed, int64_t step, int offset, double first,
                         rk_comm *comm, int nranks, int *same, rk_err *err)
{
    double again = 0.0;
    int rc;
    if (n > 0 &&
        (rc = forward_loss(m, n, xb, yb, dlogits, global, seed, step, offset, &again, err)))
        return rc;
    double differs = memcmp(&again, &first, sizeof again) != 0;
    if (nranks > 1 && (rc = rk_comm_allreduce_sum_f64(comm, &differs, 1, err)))
        return rc;
    *same = differs == 0.0;
    return RK_OK;
}

/* ---- the loop ----------------------------------------------------------------------------- */

#define MAX_REDO 3 /* trips in a row at one step before a rollback */

int rk_train(rk_model *m, rk_optim *opt, const rk_dataset *train, const rk_dataset *test,
             const rk_train_config *c, rk_comm *comm, rk_train_progress_fn progress, void *user,
             rk_train_result *res, rk_err *err)
{
    memset(res, 0, sizeof *res);
    res->test_accuracy = -1.0;
    int rank = comm ? rk_comm_rank(comm) : 0, nranks = comm ? rk_comm_size(comm) : 1;
    if (c->batch < nranks)
        return rk_err_set(err, RK_EINVAL, "global batch %d is smaller than the %d ranks", c->batch,
                          nranks);
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
    double *red = malloc((1 + (size_t)nranks) * sizeof *red); /* loss sum, per-rank norms */
    float *xb = be->alloc((size_t)cap * pixels * sizeof(float));
    float *dlogits = be->alloc((size_t)cap * RK_CLASSES * sizeof(float));
    uint8_t *yb = malloc((size_t)cap);
    double window[LOSS_WINDOW];
    int64_t step = c->start_step, total_samples = 0, taken = 0; /* taken: steps in this run */
    rk_spike spike = {0};
    if (!order || !shares || !red || !xb || !dlogits || !yb) {
        rc = rk_err_set(err, RK_ENOMEM, "training: out of memory");
        goto out;
    }
    if (c->guard && (rc = rk_spike_init(&spike, c->spike_window, c->spike_z, err)))
        goto out;

    int epoch = -1, redo = 0, spike_redone = 0, outlier_rank = -1;
    int64_t outlier_step = -1, rolled_for = -1; /* rolled_for: a rollback's failing step */
    double outlier_norm = 0.0;
    double spike_loss = 0.0, local_loss = 0.0, t0 = 0.0, last_report = 0.0;
    int64_t samples = 0, first = 0, in_epoch = 0;
    while (step < total_steps) {
        if (step / steps_per_epoch != epoch) { /* a new epoch (or back to an earlier one) */
            epoch = (int)(step / steps_per_epoch);
            rk_rng r;
            rk_rng_derive(&r, c->seed, 0x6570636fULL, (uint64_t)epoch);
            rk_rng_permutation(&r, order, (size_t)train->n);
            t0 = rk_mono_s();
            last_report = 0.0;
            samples = 0;
            first = step - (int64_t)epoch * steps_per_epoch; /* > 0 only when resuming */
            in_epoch = steps_per_epoch;
            if (total_steps - (int64_t)epoch * steps_per_epoch < in_epoch)
                in_epoch = total_steps - (int64_t)epoch * steps_per_epoch;
        }
        int64_t s = step - (int64_t)epoch * steps_per_epoch;
        double tstep = rk_mono_s();
        if (c->worker) { /* injected faults; the replica check every hash_every steps */
            int64_t back;
            if ((rc = rk_worker_step_begin(c->worker, step, &back, err)))
                break;
            if (back >= 0) {
                res->incidents++;
                res->redone_steps += step - back;
                step = back;
                redo = 0;
                spike_redone = 0;
                rk_spike_reset(&spike);
                continue;
            }
        }
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
            rk_dataset_images(train, (int)k, 1, xb + (size_t)i * pixels);
            yb[i] = train->labels[k];
        }
        double loss = 0.0, loss_sum = 0.0, tc = rk_mono_s();
        if (n > 0) {
            if ((rc = forward_loss(m, n, xb, yb, dlogits, global, c->seed, step, start + offset,
                                   &loss, err)))
                break;
            local_loss = loss;
            if (c->scaler) /* the loss, and so every gradient, times the scale */
                for (size_t i = 0; i < (size_t)n * RK_CLASSES; i++)
                    dlogits[i] *= c->scaler->scale;
            if ((rc = rk_model_backward(m, n, dlogits, err)))
                break;
            loss_sum = loss * n;
        } else {
            memset(m->grad_block, 0, m->block_len * sizeof(float));
            local_loss = 0.0;
        }
        tc = rk_mono_s() - tc;
        if (c->worker && (rc = rk_worker_grads(c->worker, step, err)))
            break;
        /* the guards' numbers ride in the loss allreduce: slot 0 the loss sum, slot 1 + r
         * rank r's gradient norm (zero elsewhere, so the sum is an allgather) */
        red[0] = loss_sum;
        if (c->guard) {
            memset(red + 1, 0, (size_t)nranks * sizeof *red);
            red[1 + rank] = grad_norm(m, n, global, loss);
        }
        if (global == c->batch)
            for (int q = 0; q < nranks && q < 8; q++)
                res->last_shares[q] = shares[q];
        double ta = rk_mono_s();
        int compressed = c->compressor && step >= c->compress_warmup &&
                         rk_compressor_kind(c->compressor) != RK_COMPRESS_NONE;
        int on_momentum = compressed && nranks > 1 && c->compress_momentum &&
                          opt->kind == RK_OPTIM_SGD && c->momentum != 0.0f;
        float gscale = c->scaler ? c->scaler->scale : 1.0f;
        if (on_momentum) /* each rank's share of the new momentum (docs/compression.md) */
            momentum_shift(m, opt, c, gscale / (float)nranks);
        if (nranks > 1) {
            uint64_t sent = rk_comm_bytes_sent(comm);
            if ((rc = compressed
                          ? rk_compressor_allreduce(c->compressor, m->grad_block, 0, err)
                          : rk_comm_allreduce_sum_f32(comm, m->grad_block, m->block_len, err)))
                break;
            res->grad_bytes_sent += rk_comm_bytes_sent(comm) - sent;
            if (on_momentum) /* back to a gradient: the optimiser rebuilds the momentum from it */
                momentum_shift(m, opt, c, -gscale);
            /* a compressed block holds +-scale at the padding between tensors too: zero it, or
             * it would reach the momentum's and weights' padding, which checkpoints do not
             * keep (and, on the momentum, come back through the compressor) */
            if (compressed)
                zero_padding(m);
            if ((rc = rk_comm_allreduce_sum_f64(comm, red, c->guard ? 1 + (size_t)nranks : 1, err)))
                break;
        }
        res->allreduce_seconds += rk_mono_s() - ta;
        loss = red[0] / global;
        /* the loss scaler first: every rank holds the same summed gradient, so all agree. An
         * overflow skips the step (the batch is consumed, nothing is updated). */
        int skip = 0;
        if (c->scaler && isfinite(loss)) {
            int overflow =
                rk_unscale_check_f32(m->grad_block, m->block_len, rk_loss_scaler_inv(c->scaler));
            if (rk_loss_scaler_update(c->scaler, overflow)) {
                skip = 1;
                res->amp_skipped++;
            } else if (c->guard) /* norms of scaled gradients: back to the real ones */
                for (int q = 0; q < nranks; q++)
                    if (isfinite(red[1 + q]) && red[1 + q] > 0)
                        red[1 + q] *= rk_loss_scaler_inv(c->scaler);
        }
        if (c->guard && !skip) {
            int trip = 0, blame = -1;
            char who[160];
            if ((rc = rk_train_judge_grads(red + 1, nranks, c->grad_ratio, &trip, &blame, who,
                                           sizeof who, err)))
                break;
            /* An outlier is first only a suspect: the step is redone. If the redo reproduces
             * it bit for bit, it is the data (a batch slice of hard examples), not a fault,
             * and is kept; if the redo comes out clean, it was a transient fault in that
             * rank's arithmetic, and only then is it counted against the rank. */
            int suspect = outlier_step == step;
            if (trip == 2 && suspect && outlier_rank == blame && outlier_norm == red[1 + blame]) {
                report(c, res, "grad_kept", "kept", step, -1, 0,
                       "%s again on the redo, same bits: the data, not a fault", who);
                trip = 0;
                outlier_step = -1;
            } else if (trip == 0 && suspect) {
                report(c, res, "grad_outlier", "redo", step, outlier_rank, 1,
                       "rank %d's gradient norm was %.3g, %g times the others' or more; the "
                       "redo came out clean: a transient fault in its arithmetic",
                       outlier_rank, outlier_norm, c->grad_ratio);
                outlier_step = -1;
            } else if (trip == 2) {
                outlier_step = step;
                outlier_rank = blame;
                outlier_norm = red[1 + blame];
            }
            if (trip) {
                int64_t snap = rk_worker_snapshot_step(c->worker);
                if (++redo < MAX_REDO || snap < 0 || snap >= step) {
                    if (redo >= MAX_REDO + 2) {
                        rc = rk_err_set(err, RK_EGUARD, "step %lld: %s, %d times in a row",
                                        (long long)step, who, redo);
                        break;
                    }
                    report(c, res, trip == 1 ? "nan" : "grad_suspect", "redo", step,
                           trip == 1 ? blame : -1, 1, "%s%s",
                           trip == 1 ? "non-finite loss or gradient: "
                                     : "gradient far off the other ranks' (redo to tell a "
                                       "fault from the data): ",
                           who);
                    continue;
                }
                if (rolled_for == step) { /* it came back after a rollback: not transient */
                    rc = rk_err_set(err, RK_EGUARD,
                                    "step %lld: %s, again after rolling back to step %lld",
                                    (long long)step, who, (long long)snap);
                    break;
                }
                rolled_for = step;
                report(c, res, trip == 1 ? "nan" : "grad_outlier", "rollback", step, blame,
                       step - snap, "%s, %d times in a row; back to step %lld", who, redo,
                       (long long)snap);
                if ((rc = rk_worker_rollback(c->worker, &step, err)))
                    break;
                redo = 0;
                rk_spike_reset(&spike);
                continue;
            }
        }
        if (c->guard && !skip) {
            double z;
            if (rk_spike_test(&spike, loss, &z)) {
                int same = 0;
                /* a finite spike: first every rank's forward again (the step's loss is their
                 * sum; a third of a step's work, no collective but one flag): the same bits on
                 * every rank, the data; else the whole step is redone, as a NaN is */
                if (!spike_redone && isfinite(loss) &&
                    (rc = forward_again(m, n, xb, yb, dlogits, global, c->seed, step,
                                        start + offset, local_loss, comm, nranks, &same, err)))
                    break;
                if (same)
                    report(c, res, "spike_kept", "kept", step, -1, 0,
                           "loss %.6g, robust z %.1f over the last %d steps; every rank's "
                           "forward again gave the same bits: the data, not a fault",
                           loss, z, c->spike_window);
                else if (!spike_redone) { /* once: a transient fault goes away, data does not */
                    spike_redone = 1;
                    spike_loss = loss;
                    report(c, res, "loss_spike", "redo", step, -1, 1,
                           "loss %.6g, robust z %.1f over the last %d steps", loss, z,
                           c->spike_window);
                    continue;
                } else
                    report(c, res, "spike_kept", "kept", step, -1, 0,
                           "loss %.6g again on the redo (%s): the data, not a fault", loss,
                           loss == spike_loss ? "same bits" : "a different value");
            }
        }
        if (!skip && (rc = rk_optim_step(opt, m, c, lr_at(c, step, total_steps), err)))
            break;
        if (!skip && compressed)
            rk_compressor_commit(c->compressor);
        if (c->observe && (rc = c->observe(c->shares_user, step, n, tc, err)))
            break;
        if (c->guard && !skip)
            rk_spike_push(&spike, loss);
        redo = 0;
        spike_redone = 0;
        if (c->loss_log)
            fprintf(c->loss_log, "%lld %.9g\n", (long long)step, loss);
        window[taken % LOSS_WINDOW] = loss;
        taken++;
        step++;
        samples += global;
        if (c->worker && (rc = rk_worker_step_end(c->worker, step, loss, rk_mono_s() - tstep, err)))
            break;
        double t = rk_mono_s() - t0;
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
        if (s + 1 < in_epoch)
            continue;
        /* the epoch's last step */
        double epoch_s = rk_mono_s() - t0;
        res->train_seconds += epoch_s;
        res->epochs_run = epoch + 1;
        total_samples += samples;
        if (c->eval && test &&
            (rc = rk_evaluate(m, test, comm, &res->test_accuracy, &res->test_loss, err)))
            break;
        if (progress) {
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
    }
    if (c->scaler)
        res->loss_scale = c->scaler->scale;
    if (!rc) {
        res->final_train_loss = window_mean(window, taken);
        res->steps = step;
        res->train_samples_per_s = res->train_seconds > 0 ? total_samples / res->train_seconds : 0;
    }
out:
    free(order);
    free(shares);
    free(red);
    be->free(xb);
    be->free(dlogits);
    free(yb);
    rk_spike_free(&spike);
    return rc;
}
