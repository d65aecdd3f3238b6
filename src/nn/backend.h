/*
 * The compute seam of the reference workload: every op a layer or optimiser runs goes through
 * one table of function pointers, chosen by the device the tensors live on (nvtop's vendor
 * table is the model). The CPU backend (backend_cpu.c) runs on oneDNN; a CUDA backend plugs
 * in by filling the same table. Ops are synchronous; buffers are device pointers of that
 * backend; every op returns 0 or a negative RK_E* code and fills `err`.
 */
#ifndef RK_NN_BACKEND_H
#define RK_NN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/amp.h"
#include "rekindle/error.h"

typedef enum rk_device { RK_DEVICE_CPU = 0, RK_DEVICE_CUDA = 1 } rk_device;

const char *rk_device_name(rk_device d);

/* A fused convolution block: conv k x k, stride 1, "same" padding, bias, ReLU, then 2x2 max
 * pooling with stride 2. Input NCHW [n, ic, h, w]; output NCHW [n, oc, h/2, w/2]. Weights
 * OIHW [oc, ic, k, k]. The op's arguments are always fp32; `dtype` asks the backend to keep
 * the block's own tensors (its copy of x, the conv output, their gradients, the pooled
 * values) in that type: RK_F32 (0, what an initialiser that omits it gets), or RK_F16 /
 * RK_BF16, honoured where convblock_storage says so and stored in fp32 otherwise. The CPU
 * backend honours RK_F16 by storing in fp16 and computing with fp32 kernels, so its values
 * are those of fp32 storage rounded to fp16 where stored. */
typedef struct rk_convblock_shape {
    int n, ic, h, w, oc, k;
    rk_dtype dtype;
} rk_convblock_shape;

/* Per-layer state a backend keeps between calls (primitives, saved activations). Opaque. */
typedef struct rk_op_cache rk_op_cache;

typedef struct rk_backend {
    const char *name;
    rk_device device;
    /* Threads the backend may use (0: all online CPUs). Call before any op. */
    int (*init)(int threads, rk_err *err);
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* Copies between host memory and this backend's memory (memcpy on the CPU). */
    void (*upload)(void *dst_dev, const void *src_host, size_t bytes);
    void (*download)(void *dst_host, const void *src_dev, size_t bytes);
    void (*cache_free)(rk_op_cache *c);

    /* y[n, out] = x[n, in] * w[out, in]^T + b, then ReLU if relu != 0. */
    int (*dense_forward)(int n, int in, int out, const float *x, const float *w, const float *b,
                         float *y, int relu, rk_err *err);
    /* Given y (the forward output) and dy, write dw, db and (if dx != NULL) dx. With relu,
     * dy is masked in place by y > 0 first. */
    int (*dense_backward)(int n, int in, int out, const float *x, const float *w, const float *y,
                          float *dy, float *dx, float *dw, float *db, int relu, rk_err *err);

    /* Forward saves what backward needs in *cache (created on first use, rebuilt when the
     * shape changes). Backward must follow a forward of the same shape. dx may be NULL. */
    int (*convblock_forward)(rk_op_cache **cache, const rk_convblock_shape *s, const float *x,
                             const float *w, const float *b, float *y, rk_err *err);
    int (*convblock_backward)(rk_op_cache **cache, const rk_convblock_shape *s, const float *dy,
                              float *dx, float *dw, float *db, rk_err *err);
    /* The type a block of shape s really stores its tensors in when asked for s->dtype:
     * s->dtype where this backend has kernels for it on this machine, else RK_F32 (the caller
     * then emulates the format by rounding). `why` gets a short note for the user: the
     * kernels used, or why there are none. Call after init. NULL in a backend that has no
     * 16-bit kernels at all: the same as answering RK_F32. */
    rk_dtype (*convblock_storage)(const rk_convblock_shape *s, char *why, size_t why_len);

    /* Inverted dropout over `rows` samples of `cols` values: y = x * mask / (1 - p), with
     * mask ~ Bernoulli(1 - p). Row r draws from (seed, stream, first_row + r) alone, so a
     * sample gets the same mask whichever rank or batch slot computes it. The mask is kept
     * for backward. */
    int (*dropout_forward)(size_t rows, size_t cols, float p, uint64_t seed, uint64_t stream,
                           uint64_t first_row, const float *x, float *y, uint8_t *mask,
                           rk_err *err);
    int (*dropout_backward)(size_t n, float p, const uint8_t *mask, const float *dy, float *dx,
                            rk_err *err);

    /* Softmax cross-entropy over n rows of `classes` logits: the mean loss over the rows to
     * *loss, the count of rows whose argmax equals the label to *correct (either may be NULL)
     * and, when dlogits is not NULL, the gradient of (sum of row losses) / denom, where denom
     * is the global batch size (n for one process). */
    int (*softmax_xent)(int n, int classes, const float *logits, const uint8_t *labels,
                        float *dlogits, int denom, double *loss, int *correct, rk_err *err);

    /* Optimiser updates over n parameters. */
    int (*sgd_step)(size_t n, float *p, const float *g, float *v, float lr, float momentum,
                    float weight_decay, int nesterov, rk_err *err);
    int (*adamw_step)(size_t n, float *p, const float *g, float *m, float *v, float lr, float b1,
                      float b2, float eps, float weight_decay, int64_t t, rk_err *err);
} rk_backend;

/* The backend for a device, or NULL (and err filled) when this build or machine has none. */
const rk_backend *rk_backend_get(rk_device device, rk_err *err);

extern const rk_backend rk_backend_cpu;

#endif
