/*
 * Mixed precision: the element types, and the dynamic loss scaler that keeps fp16
 * gradients inside fp16's range. A trainer keeps fp32 master weights, runs forward and
 * backward in a 16-bit format, and for fp16 multiplies the loss by a scale so that small
 * gradients do not underflow; the scaler lowers the scale when a gradient overflows (that
 * step is skipped) and raises it after a run of clean steps. docs/amp.md has the formats and the
 * rules; the fp16/bf16 conversions are declared in rekindle/half.h.
 *
 *     rk_loss_scaler ls;
 *     rk_loss_scaler_init(&ls, NULL, &err);               // 2^15, x2 per 2000 clean steps
 *     backward(loss * ls.scale);
 *     int bad = rk_unscale_check_f32(grad, n, rk_loss_scaler_inv(&ls));
 *     bad = allreduce_max(bad);                            // every rank decides alike
 *     if (!rk_loss_scaler_update(&ls, bad)) apply(grad);   // 1 = skip this step
 */
#ifndef REKINDLE_AMP_H
#define REKINDLE_AMP_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/ckpt.h"
#include "rekindle/error.h"
#include "rekindle/export.h"
#include "rekindle/half.h" /* the fp16/bf16 conversions a mixed-precision trainer uses */

#ifdef __cplusplus
extern "C" {
#endif

/* An element type for tensors and the --precision flag. */
typedef enum rk_dtype { RK_F32 = 0, RK_F16 = 1, RK_BF16 = 2 } rk_dtype;

/* "fp32", "fp16", "bf16"; "?" for a value outside the enum. */
RK_API const char *rk_dtype_name(rk_dtype t);
/* Exactly "fp32", "fp16" or "bf16" (lower case) into *out; RK_EINVAL (and *out untouched)
 * for anything else, NULL included. */
RK_API int rk_dtype_parse(const char *s, rk_dtype *out);
/* Bytes per element: 4, 2, 2; 0 for a value outside the enum. */
RK_API size_t rk_dtype_size(rk_dtype t);

/*
 * Dynamic loss scaler, with the rules of PyTorch's GradScaler and DeepSpeed's
 * DynamicLossScaler. rk_loss_scaler_update(s, found_nonfinite), once per step:
 *
 * - A non-finite gradient (found_nonfinite != 0): the step is skipped (returns 1);
 *   good_steps = 0. If hysteresis_left > 1 it is decremented and the scale is kept;
 *   otherwise the scale becomes max(scale * backoff_factor, min_scale) and hysteresis_left
 *   stays 1, so once the hysteresis is used up every further overflow backs off. At
 *   min_scale an overflow still skips the step and the scale stays: a run that overflows at
 *   the floor on every step makes no progress, which overflows_in_row shows the trainer.
 * - A clean step (returns 0, apply it): good_steps + 1. When it reaches growth_interval the
 *   scale becomes min(scale * growth_factor, max_scale), good_steps = 0 and hysteresis_left =
 *   hysteresis. With consecutive_hysteresis, every clean step also refills hysteresis_left, so
 *   only `hysteresis` overflows in a row back off (DeepSpeed's consecutive_hysteresis=True);
 *   without it (the default, as DeepSpeed) overflows count down until the next growth.
 *
 * With hysteresis 1 (the default) every overflow backs off, as in GradScaler. Growth comes
 * after exactly growth_interval clean steps in a row since the last overflow or growth.
 * With the defaults (powers of two throughout) the scale and its inverse are always powers
 * of two, so scaling and unscaling are exact unless a value leaves fp32's normal range.
 */
#define RK_LOSS_SCALE_INIT 32768.0f   /* 2^15 */
#define RK_LOSS_SCALE_MIN 1.0f        /* floor */
#define RK_LOSS_SCALE_MAX 16777216.0f /* 2^24, cap */
#define RK_LOSS_SCALE_GROWTH_INTERVAL 2000
#define RK_LOSS_SCALE_GROWTH 2.0f
#define RK_LOSS_SCALE_BACKOFF 0.5f
#define RK_LOSS_SCALE_HYSTERESIS 1

/* Settings. rk_loss_scaler_opts_default() fills the defaults above; change what you need.
 * Valid: 0 < min_scale <= init_scale <= max_scale, all finite; growth_factor > 1 and
 * 0 < backoff_factor < 1, finite; growth_interval >= 1; hysteresis >= 1. */
typedef struct rk_loss_scaler_opts {
    float init_scale, min_scale, max_scale;
    float growth_factor, backoff_factor;
    int growth_interval;
    int hysteresis;
    int consecutive_hysteresis; /* 0 or 1 */
} rk_loss_scaler_opts;

typedef struct rk_loss_scaler {
    /* settings (from the opts; checkpointed with the state) */
    float min_scale, max_scale;
    float growth_factor, backoff_factor;
    int growth_interval;
    int hysteresis;
    int consecutive_hysteresis;
    /* state */
    float scale;              /* multiply the loss by this */
    int good_steps;           /* clean steps since the last overflow or growth */
    int hysteresis_left;      /* overflows still absorbed before a backoff, 1..hysteresis */
    int64_t steps;            /* updates so far */
    int64_t overflows;        /* steps found non-finite (= steps skipped), <= steps */
    int64_t overflows_in_row; /* the current run of overflows (0 after a clean step) */
} rk_loss_scaler;

RK_API void rk_loss_scaler_opts_default(rk_loss_scaler_opts *o);
/* o NULL: the defaults. Bad settings: RK_EINVAL with a message naming the field, and *s
 * untouched. */
RK_API int rk_loss_scaler_init(rk_loss_scaler *s, const rk_loss_scaler_opts *o, rk_err *err);
/* Record one step; 1: skip it (a gradient was not finite), 0: apply it. Rules above. */
RK_API int rk_loss_scaler_update(rk_loss_scaler *s, int found_nonfinite);
/* 1 / scale: what the gradients are multiplied by before the update. */
RK_API float rk_loss_scaler_inv(const rk_loss_scaler *s);

/* g[i] *= inv_scale for every i < n (always all n), in one pass that also checks the
 * products; returns 1 if any product is inf or NaN, else 0. */
RK_API int rk_unscale_check_f32(float *g, size_t n, float inv_scale);

/*
 * Checkpoint: the whole struct, settings and state, as ordinary tensors of a checkpoint
 * (rekindle/ckpt.h), every one a scalar (ndim 0) named after its field:
 *
 *   F32  amp.scale, amp.min_scale, amp.max_scale, amp.growth_factor, amp.backoff_factor
 *   I64  amp.growth_interval, amp.hysteresis, amp.consecutive_hysteresis, amp.good_steps,
 *        amp.hysteresis_left, amp.steps, amp.overflows, amp.overflows_in_row
 *
 * The checkpoint's checksums cover them like every tensor. rk_loss_scaler_items_fill puts
 * the RK_LOSS_SCALER_NITEMS items in out->item (pointing into *out: keep it alive until the
 * save has taken them). rk_loss_scaler_load reads them back from a file (rk_ckpt_file) and
 * gives exactly the struct that was saved. It answers RK_ENOENT when there is no amp.scale (a
 * run without a loss scaler wrote it), and RK_EFORMAT, naming the tensor and leaving *s
 * untouched, for a missing tensor, another dtype or shape, a value init and update cannot
 * produce (a non-finite or non-positive scale, a scale outside [min_scale, max_scale],
 * settings init would refuse, good_steps outside 0..growth_interval-1, hysteresis_left outside
 * 1..hysteresis, negative counters, overflows > steps, overflows_in_row > overflows), and for
 * a checkpoint holding "scaler.state", the binary layout of earlier versions, which is no
 * longer read.
 */
#define RK_LOSS_SCALER_NITEMS 13

typedef struct rk_loss_scaler_items {
    rk_ckpt_item item[RK_LOSS_SCALER_NITEMS];
    float f32[5];
    int64_t i64[8];
} rk_loss_scaler_items;

RK_API void rk_loss_scaler_items_fill(const rk_loss_scaler *s, rk_loss_scaler_items *out);
RK_API int rk_loss_scaler_load(rk_loss_scaler *s, const rk_st_file *f, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
