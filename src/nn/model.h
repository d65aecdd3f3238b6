/*
 * The reference workload's models: a short list of layers (dense, fused conv blocks, dropout)
 * ending in 10 logits, with their parameters, gradients and activation buffers. All compute
 * goes through the model's backend (backend.h), so the same model runs wherever a backend
 * exists. Parameter order (layer order, weight then bias) is the order used for hashing and
 * saving; docs/weights.md documents it.
 */
#ifndef RK_NN_MODEL_H
#define RK_NN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "nn/backend.h"
#include "rekindle/amp.h"
#include "rekindle/error.h"

#define RK_MAX_LAYERS 8
#define RK_MAX_PARAMS 16
#define RK_CLASSES 10

typedef struct rk_param {
    char name[32]; /* e.g. "conv1.weight" */
    int ndim;
    int64_t shape[4];
    size_t numel;
    rk_device device; /* where data and grad live */
    float *data;      /* memory of the model's backend (device memory) */
    float *grad;
} rk_param;

typedef enum rk_layer_kind { RK_LAYER_DENSE, RK_LAYER_CONVBLOCK, RK_LAYER_DROPOUT } rk_layer_kind;

typedef struct rk_layer {
    rk_layer_kind kind;
    char name[16];
    int in_size, out_size;          /* values per sample */
    int relu;                       /* dense: ReLU on the output */
    int in_c, in_h, in_w, out_c, k; /* conv block geometry (input side) */
    float rate;                     /* dropout */
    rk_param *w, *b;
    rk_dtype store; /* conv block: the type the backend keeps its tensors in */
    rk_op_cache *cache;
    uint8_t *mask;
} rk_layer;

typedef struct rk_model {
    char name[16];
    const rk_backend *be;
    int nlayers, nparams;
    rk_layer layers[RK_MAX_LAYERS];
    rk_param params[RK_MAX_PARAMS];
    int max_batch;
    float *act[RK_MAX_LAYERS + 1]; /* act[0]: input batch; act[i+1]: output of layer i */
    float *dact[RK_MAX_LAYERS + 1];
    size_t numel;      /* total parameter count */
    float *data_block; /* every param's data, in order, padded: block_len floats */
    float *grad_block; /* every param's grad, same layout (padding stays zero) */
    size_t block_len;
    /* Mixed precision (rk_model_set_precision): with RK_F16 or RK_BF16 the forward and
     * backward run on work_block, the master weights rounded to that format, and every
     * activation, activation gradient and weight gradient is rounded to it as it is stored.
     * Conv blocks whose backend can store the format (the CPU: bf16 where oneDNN has bf16
     * kernels, fp16 always, computed by fp32 kernels) also keep their tensors in it
     * (conv_store); everything else is held in fp32 buffers between the roundings
     * (docs/amp.md). */
    rk_dtype dtype;
    float *work_block;
    rk_dtype conv_store;    /* dtype when every conv block stores in it, else RK_F32 */
    char storage_note[256]; /* one line saying which storage is used, and why */
} rk_model;

/* Names accepted by rk_model_create, NULL-terminated. */
extern const char *const rk_model_names[];

/* Build a model by name ("mlp", "cnn", "cnn-small") for batches up to max_batch, with weights
 * initialised from `seed` (He-uniform for ReLU layers, Glorot-uniform for the output layer,
 * zero biases). */
int rk_model_create(rk_model *m, const char *name, int max_batch, const rk_backend *be,
                    uint64_t seed, rk_err *err);
void rk_model_destroy(rk_model *m);

/* Forward n samples (n * 784 floats at x) to logits (returned in *logits). In training mode
 * dropout is active, each sample's mask drawn from (seed, step, sample0 + its row): sample0 is
 * the batch's first sample in the global batch, so a split batch draws the same masks. */
int rk_model_forward(rk_model *m, int n, const float *x, int training, uint64_t seed, uint64_t step,
                     uint64_t sample0, const float **logits, rk_err *err);
/* Backward from dlogits (n x 10) through every layer: fills every param's grad. */
int rk_model_backward(rk_model *m, int n, const float *dlogits, rk_err *err);

/* Store activations and gradients in `dtype` (RK_F32: off, the default), keeping the fp32
 * master weights in data_block. Asks the backend, per conv block, whether it can keep the
 * block's tensors in `dtype` (real 16-bit storage) or only fp32 (the format is emulated by
 * rounding); either way the values are those of `dtype`. storage_note says which. */
int rk_model_set_precision(rk_model *m, rk_dtype dtype, rk_err *err);
/* Round n floats in place to the nearest value of `dtype` (a no-op for RK_F32). */
void rk_round_to(rk_dtype dtype, float *x, size_t n);

/* xxHash64 of all parameters in order (raw little-endian float32 bytes, seed 0). */
uint64_t rk_model_hash(const rk_model *m);

/* Save / load weights in the safetensors layout (metadata: model name, format). Load checks
 * that every tensor is present with the right dtype and shape and names the first that is not. */
int rk_model_save(const rk_model *m, const char *path, rk_err *err);
int rk_model_load(rk_model *m, const char *path, rk_err *err);

#endif
