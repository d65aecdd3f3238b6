/*
 * Mixed precision (rekindle/amp.h): the unscale-and-check pass, the dynamic loss scaler's
 * state machine, and its state as named checkpoint tensors. The fp16/bf16 conversions are in
 * base/half.c (rekindle/half.h).
 */
#include "rekindle/amp.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/msg.h"

#define AMP_STEPS_MAX ((int64_t)1 << 62) /* steps a loaded scaler may have counted */

/* ---- dtypes ---- */

static const char *const dtype_names[] = {"fp32", "fp16", "bf16"};

const char *rk_dtype_name(rk_dtype t)
{
    return (unsigned)t < 3 ? dtype_names[t] : "?";
}

int rk_dtype_parse(const char *s, rk_dtype *out)
{
    if (!s || !out)
        return RK_EINVAL;
    for (int i = 0; i < 3; i++)
        if (strcmp(s, dtype_names[i]) == 0) {
            *out = (rk_dtype)i;
            return RK_OK;
        }
    return RK_EINVAL;
}

size_t rk_dtype_size(rk_dtype t)
{
    switch (t) {
    case RK_F32: return 4;
    case RK_F16:
    case RK_BF16: return 2;
    }
    return 0;
}

/* ---- unscaling ---- */

/* Rows of a fixed size so that GCC's -O2 cost model vectorises the inner loop. */
#define BLOCK 16

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

int rk_unscale_check_f32(float *g, size_t n, float inv_scale)
{
    /* a value is inf or NaN when its exponent bits are all ones; OR-ing the test keeps the
     * loop free of early exits so it vectorises */
    uint32_t bad = 0;
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int j = 0; j < BLOCK; j++) {
            float v = g[i + j] * inv_scale;
            g[i + j] = v;
            bad |= (f32_bits(v) & 0x7f800000u) == 0x7f800000u;
        }
    for (; i < n; i++) {
        float v = g[i] * inv_scale;
        g[i] = v;
        bad |= (f32_bits(v) & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}

/* ---- loss scaler ---- */

void rk_loss_scaler_opts_default(rk_loss_scaler_opts *o)
{
    o->init_scale = RK_LOSS_SCALE_INIT;
    o->min_scale = RK_LOSS_SCALE_MIN;
    o->max_scale = RK_LOSS_SCALE_MAX;
    o->growth_factor = RK_LOSS_SCALE_GROWTH;
    o->backoff_factor = RK_LOSS_SCALE_BACKOFF;
    o->growth_interval = RK_LOSS_SCALE_GROWTH_INTERVAL;
    o->hysteresis = RK_LOSS_SCALE_HYSTERESIS;
    o->consecutive_hysteresis = 0;
}

/* The settings' rules, shared by init (RK_EINVAL) and unpack (RK_EFORMAT). `what` starts
 * the message. */
static int check_settings(float min_scale, float max_scale, float growth, float backoff,
                          long long interval, long long hyst, long long consecutive, int code,
                          const char *what, rk_err *err)
{
    if (!(isfinite(min_scale) && min_scale > 0))
        return rk_err_set(err, code, "%s: min_scale %g is not finite and > 0", what,
                          (double)min_scale);
    if (!(isfinite(max_scale) && max_scale >= min_scale))
        return rk_err_set(err, code, "%s: max_scale %g is not finite and >= min_scale %g", what,
                          (double)max_scale, (double)min_scale);
    if (!(isfinite(growth) && growth > 1))
        return rk_err_set(err, code, "%s: growth_factor %g is not finite and > 1", what,
                          (double)growth);
    if (!(backoff > 0 && backoff < 1))
        return rk_err_set(err, code, "%s: backoff_factor %g is not in (0, 1)", what,
                          (double)backoff);
    if (interval < 1 || interval > INT32_MAX)
        return rk_err_set(err, code, "%s: growth_interval %lld is not in 1..%d", what, interval,
                          INT32_MAX);
    if (hyst < 1 || hyst > INT32_MAX)
        return rk_err_set(err, code, "%s: hysteresis %lld is not in 1..%d", what, hyst, INT32_MAX);
    if (consecutive != 0 && consecutive != 1)
        return rk_err_set(err, code, "%s: consecutive_hysteresis %lld is not 0 or 1", what,
                          consecutive);
    return RK_OK;
}

int rk_loss_scaler_init(rk_loss_scaler *s, const rk_loss_scaler_opts *o, rk_err *err)
{
    rk_loss_scaler_opts def;
    if (!s)
        return rk_err_set(err, RK_EINVAL, "loss scaler: NULL argument");
    if (!o) {
        rk_loss_scaler_opts_default(&def);
        o = &def;
    }
    int rc = check_settings(o->min_scale, o->max_scale, o->growth_factor, o->backoff_factor,
                            o->growth_interval, o->hysteresis, o->consecutive_hysteresis, RK_EINVAL,
                            "loss scaler", err);
    if (rc < 0)
        return rc;
    if (!(o->init_scale >= o->min_scale && o->init_scale <= o->max_scale))
        return rk_err_set(err, RK_EINVAL,
                          "loss scaler: init_scale %g is not in [min_scale %g, max_scale %g]",
                          (double)o->init_scale, (double)o->min_scale, (double)o->max_scale);
    memset(s, 0, sizeof *s);
    s->min_scale = o->min_scale;
    s->max_scale = o->max_scale;
    s->growth_factor = o->growth_factor;
    s->backoff_factor = o->backoff_factor;
    s->growth_interval = o->growth_interval;
    s->hysteresis = o->hysteresis;
    s->consecutive_hysteresis = o->consecutive_hysteresis;
    s->scale = o->init_scale;
    s->hysteresis_left = o->hysteresis;
    return RK_OK;
}

int rk_loss_scaler_update(rk_loss_scaler *s, int found_nonfinite)
{
    s->steps++;
    if (found_nonfinite) {
        s->overflows++;
        s->overflows_in_row++;
        s->good_steps = 0;
        if (s->hysteresis_left > 1) {
            s->hysteresis_left--;
        } else {
            float next = s->scale * s->backoff_factor;
            s->scale = next > s->min_scale ? next : s->min_scale;
        }
        return 1;
    }
    s->overflows_in_row = 0;
    if (s->consecutive_hysteresis)
        s->hysteresis_left = s->hysteresis;
    if (++s->good_steps >= s->growth_interval) {
        float next = s->scale * s->growth_factor;
        s->scale = next < s->max_scale ? next : s->max_scale;
        s->good_steps = 0;
        s->hysteresis_left = s->hysteresis;
    }
    return 0;
}

float rk_loss_scaler_inv(const rk_loss_scaler *s)
{
    return 1.0f / s->scale;
}

/* ---- checkpoint: named tensors ---- */

/* The tensors, in the order they are saved: F32 first, then I64 (docs/amp.md). */
static const char *const f32_names[5] = {"amp.scale", "amp.min_scale", "amp.max_scale",
                                         "amp.growth_factor", "amp.backoff_factor"};
static const char *const i64_names[8] = {
    "amp.growth_interval", "amp.hysteresis",      "amp.consecutive_hysteresis",
    "amp.good_steps",      "amp.hysteresis_left", "amp.steps",
    "amp.overflows",       "amp.overflows_in_row"};

void rk_loss_scaler_items_fill(const rk_loss_scaler *s, rk_loss_scaler_items *out)
{
    const float f[5] = {s->scale, s->min_scale, s->max_scale, s->growth_factor, s->backoff_factor};
    const int64_t v[8] = {s->growth_interval, s->hysteresis,      s->consecutive_hysteresis,
                          s->good_steps,      s->hysteresis_left, s->steps,
                          s->overflows,       s->overflows_in_row};
    memcpy(out->f32, f, sizeof f);
    memcpy(out->i64, v, sizeof v);
    for (int i = 0; i < 5; i++)
        out->item[i] = (rk_ckpt_item){.name = f32_names[i], .dtype = "F32", .data = &out->f32[i]};
    for (int i = 0; i < 8; i++)
        out->item[5 + i] =
            (rk_ckpt_item){.name = i64_names[i], .dtype = "I64", .data = &out->i64[i]};
}

int rk_loss_scaler_load(rk_loss_scaler *s, const rk_st_file *f, rk_err *err)
{
    if (!s || !f)
        return rk_err_set(err, RK_EINVAL, "loss scaler: NULL argument");
    char lb[256];
    const char *L = rk_msg_show(lb, sizeof lb, f->name ? f->name : "<memory>");
    if (!rk_st_find(f, "amp.scale")) {
        if (rk_st_find(f, "scaler.state"))
            return rk_err_set(err, RK_EFORMAT,
                              "%s: tensor 'scaler.state' holds the loss scaler in the binary "
                              "layout of earlier versions, which this version does not read "
                              "(resume from a newer checkpoint, or start afresh)",
                              L);
        return rk_err_set(err, RK_ENOENT, "%s: no loss scaler state (no tensor 'amp.scale')", L);
    }
    float fv[5];
    int64_t v[8];
    for (int i = 0; i < 13; i++) {
        int rc = i < 5 ? rk_st_load(f, f32_names[i], "F32", 0, NULL, &fv[i], err)
                       : rk_st_load(f, i64_names[i - 5], "I64", 0, NULL, &v[i - 5], err);
        if (rc == RK_ENOENT || rc == RK_EMISMATCH) /* a partial or mistyped state */
            return err ? (err->code = RK_EFORMAT) : RK_EFORMAT;
        if (rc < 0)
            return rc;
    }
    rk_loss_scaler t;
    memset(&t, 0, sizeof t);
    t.scale = fv[0];
    t.min_scale = fv[1];
    t.max_scale = fv[2];
    t.growth_factor = fv[3];
    t.backoff_factor = fv[4];
    int64_t interval = v[0], hyst = v[1], good = v[3], left = v[4], steps = v[5], over = v[6],
            in_row = v[7];
    char what[300];
    snprintf(what, sizeof what, "%s: loss scaler state", L);
    int rc = check_settings(t.min_scale, t.max_scale, t.growth_factor, t.backoff_factor, interval,
                            hyst, v[2], RK_EFORMAT, what, err);
    if (rc < 0)
        return rc;
    if (!(isfinite(t.scale) && t.scale > 0))
        return rk_err_set(err, RK_EFORMAT, "%s: amp.scale %g is not finite and > 0", what,
                          (double)t.scale);
    if (t.scale < t.min_scale || t.scale > t.max_scale)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: amp.scale %g is not in [min_scale %g, max_scale %g]", what,
                          (double)t.scale, (double)t.min_scale, (double)t.max_scale);
    if (good < 0 || good >= interval)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: amp.good_steps %lld is not in 0..%lld (growth_interval - 1)", what,
                          (long long)good, (long long)interval - 1);
    if (left < 1 || left > hyst)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: amp.hysteresis_left %lld is not in 1..%lld (hysteresis)", what,
                          (long long)left, (long long)hyst);
    if (steps < 0 || steps > AMP_STEPS_MAX) /* a step count no run can reach: its ++
                                             * would overflow */
        return rk_err_set(err, RK_EFORMAT, "%s: amp.steps %lld is not in 0..%lld", what,
                          (long long)steps, (long long)AMP_STEPS_MAX);
    if (over < 0 || over > steps)
        return rk_err_set(err, RK_EFORMAT, "%s: amp.overflows %lld is not in 0..%lld (steps)", what,
                          (long long)over, (long long)steps);
    if (in_row < 0 || in_row > over)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: amp.overflows_in_row %lld is not in 0..%lld (overflows)", what,
                          (long long)in_row, (long long)over);
    t.growth_interval = (int)interval;
    t.hysteresis = (int)hyst;
    t.consecutive_hysteresis = (int)v[2];
    t.good_steps = (int)good;
    t.hysteresis_left = (int)left;
    t.steps = steps;
    t.overflows = over;
    t.overflows_in_row = in_row;
    *s = t;
    return RK_OK;
}
