/*
 * Trainer checkpoints (train_ckpt.h): the reference trainer's state as checkpoint items,
 * saved when the worker runtime says (its saver), and resumed by rank 0 reading the store and
 * broadcasting to every rank.
 */
#include "nn/train_ckpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/bytes.h"

/* model, optimiser moments, optim.t, the batch policy, the loss scaler, the residuals */
#define MAX_ITEMS (3 * RK_MAX_PARAMS + 2 + RK_BATCH_NITEMS + RK_LOSS_SCALER_NITEMS)

typedef struct item_set {
    rk_ckpt_item items[MAX_ITEMS];
    char names[MAX_ITEMS][48];
    int64_t shape8[1], shape_ef[2];
    uint8_t t_le[8];
    rk_loss_scaler_items scaler;
    size_t n;
} item_set;

static void add_item(item_set *s, const char *prefix, const rk_param *p, const float *data)
{
    snprintf(s->names[s->n], sizeof s->names[s->n], "%s%s", prefix, p->name);
    s->items[s->n] = (rk_ckpt_item){
        .name = s->names[s->n], .dtype = "F32", .ndim = p->ndim, .shape = p->shape, .data = data};
    s->n++;
}

/* The trainer's tensors: weights, optimiser moments (laid out like the weights), the
 * optimiser's step count and, when given, the batch policy's and the loss scaler's state and
 * the residuals. */
static void build_items(const rk_trainer_ckpt *t, item_set *s, const rk_batch_items *policy,
                        const rk_loss_scaler *scaler, const float *ef, int world)
{
    const rk_model *m = t->m;
    s->n = 0;
    for (int i = 0; i < m->nparams; i++) {
        const rk_param *p = &m->params[i];
        size_t off = (size_t)(p->data - m->data_block);
        add_item(s, "model.", p, p->data);
        if (t->opt->kind == RK_OPTIM_ADAMW) {
            add_item(s, "optim.m.", p, t->opt->s1 + off);
            add_item(s, "optim.v.", p, t->opt->s2 + off);
        } else {
            add_item(s, "optim.v.", p, t->opt->s1 + off);
        }
    }
    rk_le64_store(s->t_le, (uint64_t)t->opt->t);
    s->shape8[0] = 8;
    s->items[s->n++] = (rk_ckpt_item){
        .name = "optim.t", .dtype = "U8", .ndim = 1, .shape = s->shape8, .data = s->t_le};
    for (int i = 0; policy && i < RK_BATCH_NITEMS; i++)
        s->items[s->n++] = policy->item[i];
    if (scaler) {
        rk_loss_scaler_items_fill(scaler, &s->scaler);
        for (int i = 0; i < RK_LOSS_SCALER_NITEMS; i++)
            s->items[s->n++] = s->scaler.item[i];
    }
    if (ef) { /* every rank's error-feedback residuals, one row per rank */
        s->shape_ef[0] = world;
        s->shape_ef[1] = (int64_t)rk_compressor_state_len(t->cfg->compressor);
        s->items[s->n++] = (rk_ckpt_item){
            .name = "comm.residuals", .dtype = "F32", .ndim = 2, .shape = s->shape_ef, .data = ef};
    }
}

/* The compressor's residuals of every rank, gathered (NULL without error feedback; *rc set
 * on failure). Collective. */
static float *gather_residuals(const rk_trainer_ckpt *t, int world, int *rc, rk_err *err)
{
    rk_compressor *z = t->cfg->compressor;
    size_t len = z ? rk_compressor_state_len(z) : 0;
    *rc = RK_OK;
    if (!len)
        return NULL;
    float *all = malloc((size_t)world * len * sizeof(float));
    /* every rank must enter the collective, so a failed allocation is a failed gather */
    if (!all) {
        *rc = rk_err_set(err, RK_ENOMEM, "checkpoint: out of memory for the residuals");
        return NULL;
    }
    if (world == 1)
        memcpy(all, rk_compressor_state(z), len * sizeof(float));
    else if ((*rc = rk_comm_allgather(t->comm, rk_compressor_state(z), len * sizeof(float), all,
                                      err))) {
        free(all);
        return NULL;
    }
    return all;
}

int rk_trainer_ckpt_init(rk_trainer_ckpt *t, rk_err *err)
{
    const rk_train_config *c = t->cfg;
    snprintf(t->config, sizeof t->config,
             "{\"model\":\"%s\",\"optimizer\":\"%s\",\"seed\":%llu,\"batch\":%d}", t->m->name,
             c->optim == RK_OPTIM_ADAMW ? "adamw" : "sgd", (unsigned long long)c->seed, c->batch);
    t->writer = NULL;
    if (t->async && (!t->comm || rk_comm_rank(t->comm) == 0))
        return rk_ckpt_writer_create(&t->writer, t->dir, t->keep, err);
    return RK_OK;
}

int rk_trainer_ckpt_finish(rk_trainer_ckpt *t, rk_err *err)
{
    int rc = RK_OK;
    if (t->writer) {
        rc = rk_ckpt_writer_wait(t->writer, NULL, err);
        rk_ckpt_writer_free(t->writer);
        t->writer = NULL;
    }
    return rc;
}

int rk_trainer_ckpt_save(rk_trainer_ckpt *t, int64_t step, int epoch, int64_t cursor, rk_err *err)
{
    int rank = t->comm ? rk_comm_rank(t->comm) : 0;
    int world = t->comm ? rk_comm_size(t->comm) : 1;
    int rc = RK_OK;
    float *ef = gather_residuals(t, world, &rc, err);
    if (rc)
        return rc;
    if (rank == 0) {
        rk_batch_items policy = {0};
        if (t->policy && (rc = rk_batch_items_fill(t->policy, &policy, err))) {
            free(ef);
            return rc;
        }
        item_set s;
        build_items(t, &s, t->policy ? &policy : NULL, t->cfg->scaler, ef, world);
        rk_ckpt_meta meta = {.step = step,
                             .epoch = epoch,
                             .cursor = cursor,
                             .world_size = world,
                             .config_json = t->config};
        if (t->worker)
            rc = rk_worker_may_save(t->worker, err);
        if (!rc)
            rc = t->writer ? rk_ckpt_writer_submit(t->writer, &meta, s.items, s.n, err)
                           : rk_ckpt_save(t->dir, &meta, s.items, s.n, t->keep, err);
        rk_batch_items_free(&policy);
        free(ef);
        ef = NULL;
        if (!rc && t->log)
            fprintf(t->log, "checkpoint: step %lld %s %s\n", (long long)step,
                    t->writer ? "snapshot, writing in the background to" : "saved in", t->dir);
    }
    free(ef);
    /* every rank learns whether rank 0 managed, so none trains on alone after a failure, and
     * every rank ends with its code (the same exit status) */
    int learned;
    rc = rk_comm_share_status(t->comm, rc, NULL, 0, &learned, err);
    if (learned)
        return rk_err_set(err, rc, "checkpoint: rank 0 could not save step %lld (%s)",
                          (long long)step, rk_strerror(rc));
    return rc;
}

/* The batch policy's state from checkpoint `c` into ranks[0..world) when it was saved for
 * this world, kind and global batch (*found 1), else nothing (*found 0: the fresh policy
 * stays). */
static int read_policy(const rk_trainer_ckpt *t, const rk_ckpt *c, int world,
                       rk_batch_rank_state *ranks, int64_t *found, rk_err *err)
{
    rk_batch_policy *loaded = NULL;
    *found = 0;
    int rc = rk_batch_load(&loaded, rk_ckpt_file(c), err);
    if (rc == RK_ENOENT)
        return RK_OK;
    if (rc)
        return rc;
    if (rk_batch_policy_nranks(loaded) == world &&
        rk_batch_policy_kind(loaded) == rk_batch_policy_kind(t->policy) &&
        rk_batch_policy_global_batch(loaded) == rk_batch_policy_global_batch(t->policy)) {
        for (int r = 0; r < world && !rc; r++) /* same world: carry it over rank by rank */
            rc = rk_batch_rank_get(loaded, r, &ranks[r], err);
        *found = !rc;
    }
    rk_batch_policy_free(loaded);
    return rc;
}

int rk_trainer_ckpt_resume(rk_trainer_ckpt *t, int64_t *step, rk_err *err)
{
    rk_model *m = t->m;
    int rank = t->comm ? rk_comm_rank(t->comm) : 0;
    int world = t->comm ? rk_comm_size(t->comm) : 1;
    int adamw = t->opt->kind == RK_OPTIM_ADAMW;
    /* header broadcast from rank 0: status, step, batch policy state found, optimiser t, loss
     * scaler state found, residuals of this world found */
    int64_t hdr[6] = {0, 0, 0, 0, 0, 0};
    rk_batch_rank_state *ranks = NULL;
    rk_loss_scaler scaler;
    float *ef = NULL;
    rk_compressor *z = t->cfg->compressor;
    size_t ef_len = z ? rk_compressor_state_len(z) : 0;
    rk_ckpt *c = NULL;
    int rc = RK_OK;
    if (t->policy && !(ranks = calloc((size_t)world, sizeof *ranks)))
        rc = rk_err_set(err, RK_ENOMEM, "checkpoint: out of memory");
    if (rank == 0) {
        item_set s;
        /* the batch policy and the loss scaler are optional: a checkpoint of an fp32 run
         * resumes at fp16, one of another policy with a fresh policy */
        build_items(t, &s, NULL, NULL, NULL, world);
        rk_ckpt_expect expect = {.config_json = t->config, .items = s.items, .nitems = s.n};
        char report[4096] = "";
        if (!rc)
            rc = rk_ckpt_load_latest(t->dir, &expect, &c, report, sizeof report, err);
        if (report[0] && t->log)
            fprintf(t->log, "checkpoint: skipped in %s:\n%s", t->dir, report);
        if (!rc) {
            const rk_st_file *f = rk_ckpt_file(c);
            for (size_t i = 0; i < s.n && !rc; i++) {
                if (strcmp(s.items[i].dtype, "F32") != 0)
                    continue;
                rc = rk_st_load_f32(f, s.items[i].name, s.items[i].ndim, s.items[i].shape,
                                    (float *)s.items[i].data, err);
            }
            const rk_st_tensor *tt = rk_ckpt_find(c, "optim.t");
            const rk_st_tensor *et = rk_ckpt_find(c, "comm.residuals");
            if (!rc && t->cfg->scaler) {
                rc = rk_loss_scaler_load(&scaler, f, err);
                hdr[4] = rc == RK_OK;
                if (rc == RK_ENOENT)
                    rc = RK_OK;
            }
            if (!rc && t->policy)
                rc = read_policy(t, c, world, ranks, &hdr[2], err);
            if (ef_len && et && strcmp(et->dtype, "F32") == 0 && et->ndim == 2 &&
                et->shape[0] == world && et->shape[1] == (int64_t)ef_len &&
                (ef = malloc((size_t)world * ef_len * sizeof(float)))) {
                memcpy(ef, et->data, (size_t)world * ef_len * sizeof(float));
                hdr[5] = 1;
            }
            if (!rc && ef_len && !hdr[5] && t->log)
                fprintf(t->log,
                        "checkpoint: no error-feedback residuals for %d ranks in it: "
                        "they start from zero\n",
                        world);
            if (!rc && (!tt || tt->nbytes != 8))
                rc = rk_err_set(err, RK_EFORMAT, "%s: optim.t is missing", rk_ckpt_path(c));
            if (!rc) {
                hdr[3] = (int64_t)rk_le64_load(tt->data);
                hdr[1] = rk_ckpt_meta_of(c)->step;
            }
            if (!rc && t->log)
                fprintf(t->log, "checkpoint: resuming from %s (step %lld, written by %d rank%s)\n",
                        rk_ckpt_path(c), (long long)hdr[1], rk_ckpt_meta_of(c)->world_size,
                        rk_ckpt_meta_of(c)->world_size == 1 ? "" : "s");
        }
        hdr[0] = rc;
    }
    if (world > 1) {
        /* a rank that failed to allocate still joins the broadcasts it can, and fails after */
        int learned;
        int shared = rk_comm_share_status(t->comm, (int)hdr[0], &hdr[1], 5, &learned, err);
        if (learned) {
            rc = shared == RK_ENOENT
                     ? rk_err_set(err, RK_ENOENT, "checkpoint: none in %s", t->dir)
                     : rk_err_set(err, shared, "checkpoint: rank 0 could not resume");
            goto out;
        }
        if (shared || rc) {
            rc = shared ? shared : rc; /* rc: this rank's allocation failed; the others fail in
                                        * the next collective */
            goto out;
        }
        size_t bytes = m->block_len * sizeof(float);
        if ((rc = rk_comm_bcast(t->comm, m->data_block, bytes, 0, err)) ||
            (rc = rk_comm_bcast(t->comm, t->opt->s1, bytes, 0, err)) ||
            (adamw && (rc = rk_comm_bcast(t->comm, t->opt->s2, bytes, 0, err))) ||
            (hdr[2] &&
             (rc = rk_comm_bcast(t->comm, ranks, (size_t)world * sizeof *ranks, 0, err))) ||
            (hdr[4] && (rc = rk_comm_bcast(t->comm, &scaler, sizeof scaler, 0, err))))
            goto out;
        if (hdr[5]) {
            if (rank != 0 && !(ef = malloc((size_t)world * ef_len * sizeof(float)))) {
                rc = rk_err_set(err, RK_ENOMEM, "checkpoint: out of memory");
                goto out;
            }
            if ((rc = rk_comm_bcast(t->comm, ef, (size_t)world * ef_len * sizeof(float), 0, err)))
                goto out;
        }
    }
    if (rc)
        goto out;
    t->opt->t = hdr[3];
    if (hdr[4])
        *t->cfg->scaler = scaler;
    if (hdr[5])
        memcpy(rk_compressor_state(z), ef + (size_t)rank * ef_len, ef_len * sizeof(float));
    for (int r = 0; hdr[2] && r < world && !rc; r++)
        rc = rk_batch_rank_set(t->policy, r, &ranks[r], err);
    if (rc)
        goto out;
    *step = hdr[1];
out:
    free(ranks);
    free(ef);
    rk_ckpt_free(c);
    if (rc == RK_OK)
        return RK_OK;
    *step = 0;
    return rc;
}

/* As the worker runtime's saver: the epoch and cursor of `step` follow from the batch and the
 * training set's size (the epoch of the last step done, and the samples consumed in it). */
static int saver_save(void *user, int64_t step, rk_err *err)
{
    rk_trainer_ckpt *t = user;
    int64_t batch = t->cfg->batch, per_epoch = (t->samples + batch - 1) / batch;
    int64_t epoch = step > 0 ? (step - 1) / per_epoch : 0, in = step - epoch * per_epoch;
    int64_t cursor = in * batch < t->samples ? in * batch : t->samples;
    return rk_trainer_ckpt_save(t, step, (int)epoch, cursor, err);
}

static int saver_resume(void *user, int64_t *step, rk_err *err)
{
    return rk_trainer_ckpt_resume(user, step, err);
}

rk_worker_saver rk_trainer_ckpt_saver(rk_trainer_ckpt *t)
{
    return (rk_worker_saver){.save = saver_save, .resume = saver_resume, .user = t};
}
