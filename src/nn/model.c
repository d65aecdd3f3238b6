/*
 * Models of the reference workload (model.h): layer lists for mlp, cnn and cnn-small, weight
 * initialisation, forward/backward through the backend table, hashing and safetensors I/O.
 */
#include "nn/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "rekindle/rng.h"
#include "rekindle/safetensors.h"

const char *const rk_model_names[] = {"mlp", "cnn", "cnn-small", NULL};

static rk_param *param_add(rk_model *m, const char *layer, const char *what, int ndim,
                           const int64_t *shape)
{
    rk_param *p = &m->params[m->nparams++];
    snprintf(p->name, sizeof p->name, "%s.%s", layer, what);
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= (size_t)shape[i];
    }
    m->numel += p->numel;
    return p;
}

static rk_layer *layer_add(rk_model *m, rk_layer_kind kind, const char *name)
{
    rk_layer *l = &m->layers[m->nlayers++];
    memset(l, 0, sizeof *l);
    l->kind = kind;
    snprintf(l->name, sizeof l->name, "%s", name);
    return l;
}

static void add_dense(rk_model *m, const char *name, int in, int out, int relu)
{
    rk_layer *l = layer_add(m, RK_LAYER_DENSE, name);
    l->in_size = in;
    l->out_size = out;
    l->relu = relu;
    l->w = param_add(m, name, "weight", 2, (int64_t[]){out, in});
    l->b = param_add(m, name, "bias", 1, (int64_t[]){out});
}

static void add_conv(rk_model *m, const char *name, int c, int hw, int oc, int k)
{
    rk_layer *l = layer_add(m, RK_LAYER_CONVBLOCK, name);
    l->in_c = c;
    l->in_h = l->in_w = hw;
    l->out_c = oc;
    l->k = k;
    l->in_size = c * hw * hw;
    l->out_size = oc * (hw / 2) * (hw / 2);
    l->w = param_add(m, name, "weight", 4, (int64_t[]){oc, c, k, k});
    l->b = param_add(m, name, "bias", 1, (int64_t[]){oc});
}

static void add_dropout(rk_model *m, const char *name, int size, float rate)
{
    rk_layer *l = layer_add(m, RK_LAYER_DROPOUT, name);
    l->in_size = l->out_size = size;
    l->rate = rate;
}

static int define_layers(rk_model *m, const char *name, rk_err *err)
{
    if (strcmp(name, "mlp") == 0) {
        add_dense(m, "fc1", 784, 256, 1);
        add_dense(m, "fc2", 256, 128, 1);
        add_dense(m, "fc3", 128, RK_CLASSES, 0);
    } else if (strcmp(name, "cnn") == 0) {
        add_conv(m, "conv1", 1, 28, 32, 5);
        add_conv(m, "conv2", 32, 14, 64, 5);
        add_dense(m, "fc1", 64 * 7 * 7, 1024, 1);
        add_dropout(m, "dropout", 1024, 0.4f);
        add_dense(m, "fc2", 1024, RK_CLASSES, 0);
    } else if (strcmp(name, "cnn-small") == 0) {
        add_conv(m, "conv1", 1, 28, 32, 3);
        add_conv(m, "conv2", 32, 14, 64, 3);
        add_dense(m, "fc1", 64 * 7 * 7, 128, 1);
        add_dense(m, "fc2", 128, RK_CLASSES, 0);
    } else {
        return rk_err_set(err, RK_EINVAL, "unknown model '%s' (expected mlp, cnn or cnn-small)",
                          name);
    }
    return RK_OK;
}

/* Weights are drawn on the host and uploaded, so every backend starts from the same bits. */
static int init_weights(rk_model *m, uint64_t seed)
{
    rk_rng r;
    rk_rng_seed(&r, seed);
    size_t most = 0;
    for (int i = 0; i < m->nparams; i++)
        most = m->params[i].numel > most ? m->params[i].numel : most;
    float *host = malloc(most * sizeof(float));
    if (!host)
        return RK_ENOMEM;
    for (int i = 0; i < m->nlayers; i++) {
        rk_layer *l = &m->layers[i];
        if (!l->w)
            continue;
        size_t receptive = l->w->numel / (size_t)(l->w->shape[0] * l->w->shape[1]);
        size_t fan_in = (size_t)l->w->shape[1] * receptive;
        size_t fan_out = (size_t)l->w->shape[0] * receptive;
        int last = i == m->nlayers - 1;
        double bound = last ? sqrt(6.0 / (double)(fan_in + fan_out)) : sqrt(6.0 / (double)fan_in);
        for (size_t j = 0; j < l->w->numel; j++)
            host[j] = (float)((2.0 * rk_rng_uniform(&r) - 1.0) * bound);
        m->be->upload(l->w->data, host, l->w->numel * sizeof(float));
        memset(host, 0, l->b->numel * sizeof(float));
        m->be->upload(l->b->data, host, l->b->numel * sizeof(float));
    }
    free(host);
    return RK_OK;
}

int rk_model_create(rk_model *m, const char *name, int max_batch, const rk_backend *be,
                    uint64_t seed, rk_err *err)
{
    memset(m, 0, sizeof *m);
    if (max_batch < 1)
        return rk_err_set(err, RK_EINVAL, "batch size %d must be at least 1", max_batch);
    int rc = define_layers(m, name, err);
    if (rc)
        return rc;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->be = be;
    m->max_batch = max_batch;
    /* All weights in one block and all gradients in another (each tensor starts on a 64-byte
     * boundary), so a collective or a checkpoint moves them in one piece. */
    size_t offs[RK_MAX_PARAMS], total = 0;
    for (int i = 0; i < m->nparams; i++) {
        offs[i] = total;
        total += (m->params[i].numel + 15) & ~(size_t)15;
    }
    m->block_len = total;
    m->data_block = be->alloc(total * sizeof(float));
    m->grad_block = be->alloc(total * sizeof(float));
    if (!m->data_block || !m->grad_block)
        goto oom;
    memset(m->grad_block, 0, total * sizeof(float));
    memset(m->data_block, 0, total * sizeof(float));
    for (int i = 0; i < m->nparams; i++) {
        rk_param *p = &m->params[i];
        p->device = be->device;
        p->data = m->data_block + offs[i];
        p->grad = m->grad_block + offs[i];
    }
    /* act[0] is the caller's input batch and dact[0] is never needed (no input gradient). */
    for (int i = 1; i <= m->nlayers; i++) {
        size_t bytes = (size_t)max_batch * (size_t)m->layers[i - 1].out_size * sizeof(float);
        m->act[i] = be->alloc(bytes);
        m->dact[i] = be->alloc(bytes);
        if (!m->act[i] || !m->dact[i])
            goto oom;
    }
    for (int i = 0; i < m->nlayers; i++) {
        rk_layer *l = &m->layers[i];
        if (l->kind == RK_LAYER_DROPOUT) {
            l->mask = be->alloc((size_t)max_batch * l->in_size);
            if (!l->mask)
                goto oom;
        }
    }
    if (init_weights(m, seed) == RK_OK)
        return RK_OK;
oom:
    rk_model_destroy(m);
    return rk_err_set(err, RK_ENOMEM, "model %s: out of memory for batch %d", name, max_batch);
}

void rk_model_destroy(rk_model *m)
{
    if (!m->be)
        return;
    m->be->free(m->work_block);
    m->be->free(m->data_block);
    m->be->free(m->grad_block);
    for (int i = 1; i <= m->nlayers; i++) {
        m->be->free(m->act[i]);
        m->be->free(m->dact[i]);
    }
    for (int i = 0; i < m->nlayers; i++) {
        m->be->free(m->layers[i].mask);
        m->be->cache_free(m->layers[i].cache);
    }
    memset(m, 0, sizeof *m);
}

int rk_model_set_precision(rk_model *m, rk_dtype dtype, rk_err *err)
{
    if (dtype != RK_F32 && dtype != RK_F16 && dtype != RK_BF16)
        return rk_err_set(err, RK_EINVAL, "model: unknown precision %d", (int)dtype);
    if (dtype != RK_F32 && !m->work_block) {
        m->work_block = m->be->alloc(m->block_len * sizeof(float));
        if (!m->work_block)
            return rk_err_set(err, RK_ENOMEM,
                              "model %s: out of memory for the half-precision "
                              "weights",
                              m->name);
        memset(m->work_block, 0, m->block_len * sizeof(float));
    }
    m->dtype = dtype;
    /* Ask the backend per conv block (at the largest batch) what it will store in. The model
     * keeps its own roundings either way: on values a 16-bit block already stored they change
     * nothing, and the dense layers and the weights need them. */
    int convs = 0, real = 0;
    char why[96] = "";
    for (int i = 0; i < m->nlayers; i++) {
        rk_layer *l = &m->layers[i];
        if (l->kind != RK_LAYER_CONVBLOCK)
            continue;
        rk_convblock_shape s = {m->max_batch, l->in_c, l->in_h, l->in_w, l->out_c, l->k, dtype};
        char note[96] = "no 16-bit kernels in this backend";
        l->store = dtype == RK_F32            ? RK_F32
                   : m->be->convblock_storage ? m->be->convblock_storage(&s, note, sizeof note)
                                              : RK_F32;
        convs++;
        real += l->store == dtype;
        if (!why[0] || (l->store != dtype && real == convs - 1))
            snprintf(why, sizeof why, "%s", note); /* the first block that falls back, if any */
    }
    const char *name = rk_dtype_name(dtype);
    m->conv_store = convs > 0 && real == convs ? dtype : RK_F32;
    if (dtype == RK_F32)
        snprintf(m->storage_note, sizeof m->storage_note, "precision fp32: stored in fp32");
    else if (convs == 0)
        snprintf(m->storage_note, sizeof m->storage_note,
                 "precision %s: rounded to %s, stored in fp32 (no conv blocks in model %s)", name,
                 name, m->name);
    else if (real == convs)
        snprintf(m->storage_note, sizeof m->storage_note,
                 "precision %s: conv activations stored in %s (%s); the rest rounded to %s, "
                 "stored in fp32",
                 name, name, why, name);
    else if (real == 0)
        snprintf(m->storage_note, sizeof m->storage_note,
                 "precision %s: rounded to %s, stored in fp32 (%s)", name, name, why);
    else
        snprintf(m->storage_note, sizeof m->storage_note,
                 "precision %s: %d of %d conv blocks store in %s, the rest rounded to %s and "
                 "stored in fp32 (%s)",
                 name, real, convs, name, name, why);
    return RK_OK;
}

void rk_round_to(rk_dtype dtype, float *x, size_t n)
{
    if (dtype == RK_F32)
        return;
    uint16_t h[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t k = n - i < 1024 ? n - i : 1024;
        if (dtype == RK_F16) {
            rk_f32_to_f16_n(x + i, h, k);
            rk_f16_to_f32_n(h, x + i, k);
        } else {
            rk_f32_to_bf16_n(x + i, h, k);
            rk_bf16_to_f32_n(h, x + i, k);
        }
    }
}

/* Point every parameter's data at the working (rounded) copy, or back at the master block. */
static void use_work(rk_model *m, int on)
{
    if (m->dtype == RK_F32)
        return;
    float *from = on ? m->data_block : m->work_block, *to = on ? m->work_block : m->data_block;
    for (int i = 0; i < m->nparams; i++)
        m->params[i].data = to + (m->params[i].data - from);
}

static rk_convblock_shape conv_shape(const rk_layer *l, int n)
{
    rk_convblock_shape s = {n, l->in_c, l->in_h, l->in_w, l->out_c, l->k, l->store};
    return s;
}

int rk_model_forward(rk_model *m, int n, const float *x, int training, uint64_t seed, uint64_t step,
                     uint64_t sample0, const float **logits, rk_err *err)
{
    if (n < 1 || n > m->max_batch)
        return rk_err_set(err, RK_EINVAL, "batch of %d is outside 1..%d", n, m->max_batch);
    m->act[0] = (float *)x;
    const rk_backend *be = m->be;
    if (m->dtype != RK_F32) { /* this step's weights: the master weights, rounded */
        memcpy(m->work_block, m->data_block, m->block_len * sizeof(float));
        rk_round_to(m->dtype, m->work_block, m->block_len);
        use_work(m, 1);
    }
    for (int i = 0; i < m->nlayers; i++) {
        rk_layer *l = &m->layers[i];
        const float *in = m->act[i];
        float *out = m->act[i + 1];
        int rc = RK_OK;
        switch (l->kind) {
        case RK_LAYER_DENSE:
            rc = be->dense_forward(n, l->in_size, l->out_size, in, l->w->data, l->b->data, out,
                                   l->relu, err);
            break;
        case RK_LAYER_CONVBLOCK: {
            rk_convblock_shape s = conv_shape(l, n);
            rc = be->convblock_forward(&l->cache, &s, in, l->w->data, l->b->data, out, err);
            break;
        }
        case RK_LAYER_DROPOUT:
            if (training) {
                rc = be->dropout_forward((size_t)n, (size_t)l->in_size, l->rate, seed,
                                         step * RK_MAX_LAYERS + (uint64_t)i, sample0, in, out,
                                         l->mask, err);
            } else {
                memcpy(out, in, (size_t)n * l->in_size * sizeof(float));
            }
            break;
        }
        if (rc) {
            use_work(m, 0);
            return rc;
        }
        rk_round_to(m->dtype, m->act[i + 1], (size_t)n * l->out_size);
    }
    use_work(m, 0);
    *logits = m->act[m->nlayers];
    return RK_OK;
}

int rk_model_backward(rk_model *m, int n, const float *dlogits, rk_err *err)
{
    const rk_backend *be = m->be;
    size_t last = (size_t)n * m->layers[m->nlayers - 1].out_size;
    memcpy(m->dact[m->nlayers], dlogits, last * sizeof(float));
    rk_round_to(m->dtype, m->dact[m->nlayers], last);
    use_work(m, 1); /* the weights the forward used (its rounded copy) */
    int rc = RK_OK;
    for (int i = m->nlayers - 1; i >= 0; i--) {
        rk_layer *l = &m->layers[i];
        float *dout = m->dact[i + 1];
        float *din = i > 0 ? m->dact[i] : NULL; /* no input gradient for the first layer */
        switch (l->kind) {
        case RK_LAYER_DENSE:
            rc = be->dense_backward(n, l->in_size, l->out_size, m->act[i], l->w->data,
                                    m->act[i + 1], dout, din, l->w->grad, l->b->grad, l->relu, err);
            break;
        case RK_LAYER_CONVBLOCK: {
            rk_convblock_shape s = conv_shape(l, n);
            rc = be->convblock_backward(&l->cache, &s, dout, din, l->w->grad, l->b->grad, err);
            break;
        }
        case RK_LAYER_DROPOUT:
            rc = be->dropout_backward((size_t)n * l->in_size, l->rate, l->mask, dout, din, err);
            break;
        }
        if (rc)
            break;
        if (din)
            rk_round_to(m->dtype, din, (size_t)n * l->in_size);
    }
    use_work(m, 0);
    if (rc)
        return rc;
    /* the padding between tensors in the gradient block is zero again: a compressed allreduce
     * writes every position of the block, and a stale value there would be fed back */
    for (int i = 0; i < m->nparams; i++) {
        const rk_param *p = &m->params[i];
        float *end = i + 1 < m->nparams ? m->params[i + 1].grad : m->grad_block + m->block_len;
        memset(p->grad + p->numel, 0, (size_t)(end - (p->grad + p->numel)) * sizeof(float));
    }
    rk_round_to(m->dtype, m->grad_block, m->block_len); /* stored in the format too */
    return RK_OK;
}

/* A host copy of every parameter, in order (for hashing and saving). NULL when out of memory. */
static float *params_to_host(const rk_model *m)
{
    float *host = malloc(m->numel * sizeof(float));
    if (!host)
        return NULL;
    size_t off = 0;
    for (int i = 0; i < m->nparams; i++) {
        m->be->download(host + off, m->params[i].data, m->params[i].numel * sizeof(float));
        off += m->params[i].numel;
    }
    return host;
}

uint64_t rk_model_hash(const rk_model *m)
{
    float *host = params_to_host(m);
    uint64_t h = host ? XXH64(host, m->numel * sizeof(float), 0) : 0;
    free(host);
    return h;
}

int rk_model_save(const rk_model *m, const char *path, rk_err *err)
{
    rk_st_entry entries[RK_MAX_PARAMS];
    float *host = params_to_host(m);
    if (!host)
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory copying weights", path);
    size_t off = 0;
    for (int i = 0; i < m->nparams; off += m->params[i].numel, i++)
        entries[i] = (rk_st_entry){.name = m->params[i].name,
                                   .data = host + off,
                                   .ndim = m->params[i].ndim,
                                   .shape = m->params[i].shape,
                                   .dtype = "F32"};
    const char *meta[] = {"format", "rekindle-weights-1", "model", m->name, NULL};
    int rc = rk_st_write(path, entries, (size_t)m->nparams, meta, err);
    free(host);
    return rc;
}

int rk_model_load(rk_model *m, const char *path, rk_err *err)
{
    rk_st_file f;
    int rc = rk_st_read(path, &f, err);
    if (rc)
        return rc;
    const char *model = rk_st_meta(&f, "model");
    if (model && strcmp(model, m->name) != 0) {
        rc = rk_err_set(err, RK_EMISMATCH, "%s: holds weights of model '%s', not '%s'", path, model,
                        m->name);
        goto out;
    }
    for (int i = 0; i < m->nparams && !rc; i++) {
        const rk_param *p = &m->params[i];
        const rk_st_tensor *t = rk_st_find(&f, p->name);
        if (!t) {
            rc = rk_err_set(err, RK_EMISMATCH, "%s: tensor '%s' is missing", path, p->name);
            break;
        }
        int same = strcmp(t->dtype, "F32") == 0 && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = t->shape[d] == p->shape[d];
        if (!same) {
            rc = rk_err_set(err, RK_EMISMATCH,
                            "%s: tensor '%s' has dtype %s and another shape "
                            "than model %s expects",
                            path, p->name, t->dtype, m->name);
            break;
        }
        size_t bad = rk_st_find_nonfinite(t->dtype, t->data, t->nbytes);
        if (bad != SIZE_MAX)
            rc = rk_err_set(err, RK_EFORMAT,
                            "%s: tensor '%s': element %zu is %s; weights must "
                            "be finite",
                            path, p->name, bad, rk_st_nonfinite_name(t->dtype, t->data, bad));
    }
    for (int i = 0; i < m->nparams && !rc; i++) {
        const rk_st_tensor *t = rk_st_find(&f, m->params[i].name);
        m->be->upload(m->params[i].data, t->data, m->params[i].numel * sizeof(float));
    }
out:
    rk_st_free(&f);
    return rc;
}
