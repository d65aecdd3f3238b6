/*
 * Mixed precision (rekindle/amp.h): the unscale-and-check pass, the dynamic loss scaler's
 * state machine, and its state as named checkpoint tensors. The fp16/bf16 conversions are in
 * base/half.c (rekindle/half.h).
 */
#include "rekindle/amp.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <xxhash.h>

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

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
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

/* ---- checkpoint ----
 * Offsets (docs/amp.md): 0 magic "RKLS", 4 version, 5 flags (bit 0 consecutive_hysteresis),
 * 6 u16 reserved 0, 8 scale, 12 min_scale, 16 max_scale, 20 growth_factor, 24 backoff_factor
 * (f32), 28 growth_interval, 32 hysteresis, 36 good_steps, 40 hysteresis_left (i32),
 * 44 steps, 52 overflows, 60 overflows_in_row (i64), 68 XXH64 of bytes 0..67. */

#define MAGIC "RKLS"
#define SUM_AT 68

static void put_u32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *b)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)b[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

int rk_loss_scaler_pack(const rk_loss_scaler *s, uint8_t out[RK_LOSS_SCALER_BYTES])
{
    if (!s || !out)
        return RK_EINVAL;
    memcpy(out, MAGIC, 4);
    out[4] = RK_LOSS_SCALER_VERSION;
    out[5] = s->consecutive_hysteresis ? 1 : 0;
    out[6] = out[7] = 0;
    put_u32(out + 8, f32_bits(s->scale));
    put_u32(out + 12, f32_bits(s->min_scale));
    put_u32(out + 16, f32_bits(s->max_scale));
    put_u32(out + 20, f32_bits(s->growth_factor));
    put_u32(out + 24, f32_bits(s->backoff_factor));
    put_u32(out + 28, (uint32_t)s->growth_interval);
    put_u32(out + 32, (uint32_t)s->hysteresis);
    put_u32(out + 36, (uint32_t)s->good_steps);
    put_u32(out + 40, (uint32_t)s->hysteresis_left);
    put_u64(out + 44, (uint64_t)s->steps);
    put_u64(out + 52, (uint64_t)s->overflows);
    put_u64(out + 60, (uint64_t)s->overflows_in_row);
    put_u64(out + SUM_AT, XXH64(out, SUM_AT, 0));
    return RK_OK;
}

int rk_loss_scaler_unpack(rk_loss_scaler *s, const uint8_t *in, size_t len, rk_err *err)
{
    if (!s || (!in && len > 0))
        return rk_err_set(err, RK_EINVAL, "loss scaler state: NULL argument");
    if (len != RK_LOSS_SCALER_BYTES)
        return rk_err_set(err, RK_EFORMAT, "loss scaler state: length %zu bytes, expected %d", len,
                          RK_LOSS_SCALER_BYTES);
    if (memcmp(in, MAGIC, 4) != 0)
        return rk_err_set(err, RK_EFORMAT,
                          "loss scaler state: bad magic (not a loss scaler state)");
    if (in[4] != RK_LOSS_SCALER_VERSION)
        return rk_err_set(err, RK_EFORMAT,
                          "loss scaler state: version %u is not supported (this build reads %d)",
                          in[4], RK_LOSS_SCALER_VERSION);
    if (in[5] & ~1u)
        return rk_err_set(err, RK_EFORMAT, "loss scaler state: flags 0x%02x has unknown bits",
                          in[5]);
    if (in[6] || in[7])
        return rk_err_set(err, RK_EFORMAT, "loss scaler state: reserved bytes are not 0");
    uint64_t stored = get_u64(in + SUM_AT), computed = XXH64(in, SUM_AT, 0);
    if (stored != computed)
        return rk_err_set(err, RK_EFORMAT,
                          "loss scaler state: checksum mismatch (stored %016llx, computed "
                          "%016llx): the state is corrupt",
                          (unsigned long long)stored, (unsigned long long)computed);

    rk_loss_scaler t;
    memset(&t, 0, sizeof t);
    t.consecutive_hysteresis = in[5] & 1u;
    t.scale = bits_f32(get_u32(in + 8));
    t.min_scale = bits_f32(get_u32(in + 12));
    t.max_scale = bits_f32(get_u32(in + 16));
    t.growth_factor = bits_f32(get_u32(in + 20));
    t.backoff_factor = bits_f32(get_u32(in + 24));
    int32_t interval = (int32_t)get_u32(in + 28), hyst = (int32_t)get_u32(in + 32);
    int32_t good = (int32_t)get_u32(in + 36), left = (int32_t)get_u32(in + 40);
    int64_t steps = (int64_t)get_u64(in + 44), over = (int64_t)get_u64(in + 52);
    int64_t in_row = (int64_t)get_u64(in + 60);

    int rc = check_settings(t.min_scale, t.max_scale, t.growth_factor, t.backoff_factor, interval,
                            hyst, t.consecutive_hysteresis, RK_EFORMAT, "loss scaler state", err);
    if (rc < 0)
        return rc;
    if (!(isfinite(t.scale) && t.scale > 0))
        return rk_err_set(err, RK_EFORMAT, "loss scaler state: scale %g is not finite and > 0",
                          (double)t.scale);
    if (t.scale < t.min_scale || t.scale > t.max_scale)
        return rk_err_set(err, RK_EFORMAT,
                          "loss scaler state: scale %g is not in [min_scale %g, max_scale %g]",
                          (double)t.scale, (double)t.min_scale, (double)t.max_scale);
    if (good < 0 || good >= interval)
        return rk_err_set(err, RK_EFORMAT,
                          "loss scaler state: good_steps %d is not in 0..%d (growth_interval - 1)",
                          (int)good, (int)interval - 1);
    if (left < 1 || left > hyst)
        return rk_err_set(err, RK_EFORMAT,
                          "loss scaler state: hysteresis_left %d is not in 1..%d (hysteresis)",
                          (int)left, (int)hyst);
    if (steps < 0)
        return rk_err_set(err, RK_EFORMAT, "loss scaler state: steps %lld is negative",
                          (long long)steps);
    if (over < 0 || over > steps)
        return rk_err_set(err, RK_EFORMAT,
                          "loss scaler state: overflows %lld is not in 0..%lld (steps)",
                          (long long)over, (long long)steps);
    if (in_row < 0 || in_row > over)
        return rk_err_set(err, RK_EFORMAT,
                          "loss scaler state: overflows_in_row %lld is not in 0..%lld (overflows)",
                          (long long)in_row, (long long)over);
    t.growth_interval = interval;
    t.hysteresis = hyst;
    t.good_steps = good;
    t.hysteresis_left = left;
    t.steps = steps;
    t.overflows = over;
    t.overflows_in_row = in_row;
    *s = t;
    return RK_OK;
}
