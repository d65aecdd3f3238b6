/*
 * Each layer's backward pass against central finite differences of its forward pass, on the
 * CPU backend: dense (with and without ReLU), the fused conv block (conv + bias + ReLU + 2x2
 * max pool, input and weight gradients), dropout and softmax cross-entropy. The scalar probed
 * is L = sum(y * r) for a fixed random r, so dL/dy = r. The conv block with bf16 storage is
 * checked against the fp32 block instead (skipped where the CPU has no bf16 kernels), and so
 * is the block with fp16 storage (fp32 kernels: bit-equal on fp16 values).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nn/backend.h"
#include "nn/train.h"
#include "rekindle/amp.h"
#include "rekindle/rng.h"

static const rk_backend *be;

static float *rand_buf(rk_rng *r, size_t n, float scale)
{
    float *p = be->alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = (2.0f * rk_rng_uniform(r) - 1.0f) * scale;
    return p;
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* Relative error between numeric and analytic gradients over probed coordinates. */
typedef struct gradcheck {
    double num2, diff2;
} gradcheck;

static void gc_add(gradcheck *g, double numeric, double analytic)
{
    g->num2 += numeric * numeric;
    g->diff2 += (numeric - analytic) * (numeric - analytic);
}

static double gc_rel(const gradcheck *g)
{
    return sqrt(g->diff2 / (g->num2 + 1e-30));
}

/* ---- dense ---- */

typedef struct dense_case {
    int n, in, out, relu;
    float *x, *w, *b, *y, *r;
} dense_case;

static double dense_loss(dense_case *c)
{
    assert_int_equal(be->dense_forward(c->n, c->in, c->out, c->x, c->w, c->b, c->y, c->relu, NULL),
                     0);
    return dot(c->y, c->r, (size_t)c->n * c->out);
}

static void check_dense(int relu)
{
    rk_rng rng;
    rk_rng_seed(&rng, 42 + relu);
    dense_case c = {.n = 5, .in = 7, .out = 6, .relu = relu};
    c.x = rand_buf(&rng, (size_t)c.n * c.in, 1.0f);
    c.w = rand_buf(&rng, (size_t)c.out * c.in, 0.5f);
    c.b = rand_buf(&rng, (size_t)c.out, 0.3f);
    c.y = be->alloc((size_t)c.n * c.out * sizeof(float));
    c.r = rand_buf(&rng, (size_t)c.n * c.out, 1.0f);
    float *dy = be->alloc((size_t)c.n * c.out * sizeof(float));
    float *dx = be->alloc((size_t)c.n * c.in * sizeof(float));
    float *dw = be->alloc((size_t)c.out * c.in * sizeof(float));
    float *db = be->alloc((size_t)c.out * sizeof(float));
    dense_loss(&c);
    memcpy(dy, c.r, (size_t)c.n * c.out * sizeof(float));
    assert_int_equal(
        be->dense_backward(c.n, c.in, c.out, c.x, c.w, c.y, dy, dx, dw, db, relu, NULL), 0);

    const float h = 1e-3f;
    struct {
        float *v, *g;
        size_t n;
        const char *what;
    } sets[] = {{c.x, dx, (size_t)c.n * c.in, "x"},
                {c.w, dw, (size_t)c.out * c.in, "w"},
                {c.b, db, (size_t)c.out, "b"}};
    for (int s = 0; s < 3; s++) {
        gradcheck g = {0};
        for (size_t i = 0; i < sets[s].n; i++) {
            float keep = sets[s].v[i];
            sets[s].v[i] = keep + h;
            double lp = dense_loss(&c);
            sets[s].v[i] = keep - h;
            double lm = dense_loss(&c);
            sets[s].v[i] = keep;
            gc_add(&g, (lp - lm) / (2.0 * h), sets[s].g[i]);
        }
        printf("dense relu=%d d%s: relative error %.2e\n", relu, sets[s].what, gc_rel(&g));
        assert_true(gc_rel(&g) < 1e-2);
        assert_true(g.num2 > 0.0); /* the probe saw a non-zero gradient */
    }
    float *bufs[] = {c.x, c.w, c.b, c.y, c.r, dy, dx, dw, db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(bufs[i]);
}

static void dense_backward_matches_finite_differences(void **state)
{
    (void)state;
    check_dense(0);
}

static void dense_relu_backward_matches_finite_differences(void **state)
{
    (void)state;
    check_dense(1);
}

/* ---- conv block ---- */

static double conv_loss(rk_op_cache **cache, const rk_convblock_shape *s, const float *x,
                        const float *w, const float *b, float *y, const float *r)
{
    assert_int_equal(be->convblock_forward(cache, s, x, w, b, y, NULL), 0);
    return dot(y, r, (size_t)s->n * s->oc * (s->h / 2) * (s->w / 2));
}

static void check_conv(int ic, int oc, int k, int hw)
{
    rk_rng rng;
    rk_rng_seed(&rng, 7 + (uint64_t)k + (uint64_t)ic * 100);
    rk_convblock_shape s = {2, ic, hw, hw, oc, k, RK_F32};
    size_t nx = (size_t)s.n * ic * hw * hw, nw = (size_t)oc * ic * k * k;
    size_t ny = (size_t)s.n * oc * (hw / 2) * (hw / 2);
    float *x = rand_buf(&rng, nx, 1.0f), *w = rand_buf(&rng, nw, 0.5f);
    float *b = rand_buf(&rng, (size_t)oc, 0.2f), *r = rand_buf(&rng, ny, 1.0f);
    float *y = be->alloc(ny * sizeof(float)), *dy = be->alloc(ny * sizeof(float));
    float *dx = be->alloc(nx * sizeof(float)), *dw = be->alloc(nw * sizeof(float));
    float *db = be->alloc((size_t)oc * sizeof(float));
    rk_op_cache *cache = NULL;
    rk_err err = {0};

    conv_loss(&cache, &s, x, w, b, y, r);
    memcpy(dy, r, ny * sizeof(float));
    int rc = be->convblock_backward(&cache, &s, dy, dx, dw, db, &err);
    if (rc)
        fail_msg("%s", err.msg);

    /* The block is piecewise linear (ReLU, max pool): a probe whose +h and -h slopes differ
     * straddles a kink, where no derivative exists; such probes are skipped and counted. */
    const float h = 1e-3f;
    double l0 = conv_loss(&cache, &s, x, w, b, y, r);
    struct {
        float *v, *g;
        size_t n;
        const char *what;
    } sets[] = {{x, dx, nx, "x"}, {w, dw, nw, "w"}, {b, db, (size_t)oc, "b"}};
    for (int t = 0; t < 3; t++) {
        gradcheck g = {0};
        int probes = 0, kinks = 0;
        size_t stride = sets[t].n > 200 ? sets[t].n / 200 : 1; /* probe up to ~200 values */
        for (size_t i = 0; i < sets[t].n; i += stride) {
            float keep = sets[t].v[i];
            sets[t].v[i] = keep + h;
            double lp = conv_loss(&cache, &s, x, w, b, y, r);
            sets[t].v[i] = keep - h;
            double lm = conv_loss(&cache, &s, x, w, b, y, r);
            sets[t].v[i] = keep;
            probes++;
            if (fabs(lp - 2.0 * l0 + lm) > 1e-4 * (fabs(lp - lm) + 1e-2)) {
                kinks++;
                continue;
            }
            gc_add(&g, (lp - lm) / (2.0 * h), sets[t].g[i]);
        }
        printf("conv block ic=%d oc=%d k=%d d%s: relative error %.2e (%d of %d probes at kinks)\n",
               ic, oc, k, sets[t].what, gc_rel(&g), kinks, probes);
        assert_true(gc_rel(&g) < 2e-3);
        assert_true(g.num2 > 0.0);
        assert_true(kinks * 4 < probes);
    }
    be->cache_free(cache);
    float *bufs[] = {x, w, b, r, y, dy, dx, dw, db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(bufs[i]);
}

static void convblock_3x3_backward_matches_finite_differences(void **state)
{
    (void)state;
    check_conv(3, 8, 3, 8);
}

static void convblock_5x5_backward_matches_finite_differences(void **state)
{
    (void)state;
    check_conv(8, 16, 5, 10);
}

static void convblock_single_channel_input_backward_matches(void **state)
{
    (void)state;
    check_conv(1, 8, 3, 12); /* the first layer of every CNN: one input channel */
}

static void convblock_channels_not_multiple_of_block_backward_matches(void **state)
{
    (void)state;
    check_conv(2, 12, 3, 6); /* 12 channels: blocked layouts carry padded lanes */
}

static void convblock_backward_without_forward_is_an_error(void **state)
{
    (void)state;
    rk_op_cache *cache = NULL;
    rk_convblock_shape s = {1, 1, 4, 4, 2, 3, RK_F32};
    float dy[8] = {0}, dw[18], db[2];
    rk_err err = {0};
    assert_int_equal(be->convblock_backward(&cache, &s, dy, NULL, dw, db, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "backward"));
}

/* ---- conv block with bf16 storage ----
 *
 * The bf16 block against the fp32 block on the same bf16 values. Its convolutions multiply
 * bf16 values (the products are exact in fp32) and accumulate in fp32, as the fp32 block
 * does, and round once where they store: the conv output, the pooled values and dx. So:
 * - with inputs whose conv outputs are exact in bf16 (small integers times multiples of 1/4,
 *   at most 64 in magnitude: 8 significant bits hold them), both blocks pick the same window
 *   winners and y is bit for bit the same; dw and db are fp32 sums of the same exact
 *   products, equal up to summation order (1e-5 relative, norm-wise, covers fp32's 6e-8 unit
 *   roundoff over the few hundred terms per sum); dx is the fp32 result rounded to bf16 once,
 *   so it is within half a bf16 ulp: |dx16 - dx32| <= 2^-8 |dx32| (8-bit mantissa, round to
 *   nearest), plus the same summation slack;
 * - with general bf16 inputs, every y is the fp32 y rounded once: within 2^-8 of it,
 *   relatively. (Gradients are not compared there: a window whose two largest values round
 *   to the same bf16 may pick another winner, which moves a whole gradient term.) */

static float bf16_round(float v)
{
    return rk_bf16_to_f32(rk_f32_to_bf16(v));
}

/* The blocks need this CPU's bf16 kernels; without them the test says so and is skipped. */
static int have_bf16(const rk_convblock_shape *s)
{
    char why[128] = "";
    if (be->convblock_storage && be->convblock_storage(s, why, sizeof why) == RK_BF16)
        return 1;
    print_message("skipped: no bf16 conv kernels here (%s)\n", why);
    return 0;
}

typedef struct conv_run {
    float *y, *dx, *dw, *db;
} conv_run;

static void conv_run_block(rk_convblock_shape s, rk_dtype dt, const float *x, const float *w,
                           const float *b, const float *dy, conv_run *out)
{
    size_t nx = (size_t)s.n * s.ic * s.h * s.w, nw = (size_t)s.oc * s.ic * s.k * s.k;
    size_t ny = (size_t)s.n * s.oc * (s.h / 2) * (s.w / 2);
    out->y = be->alloc(ny * sizeof(float));
    out->dx = be->alloc(nx * sizeof(float));
    out->dw = be->alloc(nw * sizeof(float));
    out->db = be->alloc((size_t)s.oc * sizeof(float));
    float *g = be->alloc(ny * sizeof(float));
    memcpy(g, dy, ny * sizeof(float));
    rk_op_cache *cache = NULL;
    rk_err err = {0};
    s.dtype = dt;
    if (be->convblock_forward(&cache, &s, x, w, b, out->y, &err) ||
        be->convblock_backward(&cache, &s, g, out->dx, out->dw, out->db, &err))
        fail_msg("%s", err.msg);
    be->cache_free(cache);
    be->free(g);
}

static void conv_run_free(conv_run *r)
{
    float *bufs[] = {r->y, r->dx, r->dw, r->db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(bufs[i]);
}

/* Norm-wise relative difference. */
static double rel_diff(const float *a, const float *ref, size_t n)
{
    double d2 = 0.0, r2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        d2 += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r2 += (double)ref[i] * ref[i];
    }
    return sqrt(d2 / (r2 + 1e-30));
}

/* exact = 1: x in {-1, 0, 1}, w and b multiples of 1/4 in [-1/2, 1/2] (the shapes keep
 * ic * k * k / 2 + 1/2 <= 64); else uniform values rounded to bf16. dy: uniform, rounded. */
static void check_conv_bf16(int n, int ic, int oc, int k, int hw, int exact)
{
    rk_convblock_shape s = {n, ic, hw, hw, oc, k, RK_BF16};
    if (!have_bf16(&s)) {
        skip();
        return;
    }
    assert_true(!exact || ic * k * k / 2 + 1 <= 64);
    rk_rng rng;
    rk_rng_seed(&rng, 11 + (uint64_t)oc + (uint64_t)k * 7 + (uint64_t)exact);
    size_t nx = (size_t)n * ic * hw * hw, nw = (size_t)oc * ic * k * k;
    size_t ny = (size_t)n * oc * (hw / 2) * (hw / 2);
    float *x = rand_buf(&rng, nx, 1.0f), *w = rand_buf(&rng, nw, 0.5f);
    float *b = rand_buf(&rng, (size_t)oc, 0.5f), *dy = rand_buf(&rng, ny, 1.0f);
    for (size_t i = 0; i < nx; i++)
        x[i] = exact ? roundf(x[i]) : bf16_round(x[i]);
    for (size_t i = 0; i < nw; i++)
        w[i] = exact ? roundf(w[i] * 4.0f) / 4.0f : bf16_round(w[i]);
    for (int i = 0; i < oc; i++)
        b[i] = exact ? roundf(b[i] * 4.0f) / 4.0f : bf16_round(b[i]);
    for (size_t i = 0; i < ny; i++)
        dy[i] = bf16_round(dy[i]);

    conv_run r32, r16;
    conv_run_block(s, RK_F32, x, w, b, dy, &r32);
    conv_run_block(s, RK_BF16, x, w, b, dy, &r16);

    int positive = 0;
    for (size_t i = 0; i < ny; i++) {
        positive += r32.y[i] > 0.0f;
        if (exact) {
            if (r16.y[i] != r32.y[i])
                fail_msg("y[%zu]: bf16 %.9g, fp32 %.9g: not bit-equal", i, (double)r16.y[i],
                         (double)r32.y[i]);
        } else if (fabsf(r16.y[i] - r32.y[i]) > 0x1p-8f * fabsf(r32.y[i]) * 1.001f + 1e-6f) {
            fail_msg("y[%zu]: bf16 %.9g, fp32 %.9g: more than half a bf16 ulp apart", i,
                     (double)r16.y[i], (double)r32.y[i]);
        }
        assert_true(r16.y[i] == bf16_round(r16.y[i])); /* stored in bf16: a bf16 value */
    }
    assert_true(positive * 4 > (int)ny); /* the ReLU left enough to compare */
    if (exact) {
        double edw = rel_diff(r16.dw, r32.dw, nw), edb = rel_diff(r16.db, r32.db, (size_t)oc);
        double worst = 0.0; /* dx: in units of half a bf16 ulp */
        for (size_t i = 0; i < nx; i++) {
            double d = fabs((double)r16.dx[i] - r32.dx[i]);
            double half_ulp = 0x1p-8 * fabs((double)r32.dx[i]) + 1e-6;
            worst = d / half_ulp > worst ? d / half_ulp : worst;
            assert_true(r16.dx[i] == bf16_round(r16.dx[i]));
        }
        printf("conv block bf16 n=%d ic=%d oc=%d k=%d: y bit-equal; dw %.1e, db %.1e relative; "
               "dx within %.2f of half a bf16 ulp\n",
               n, ic, oc, k, edw, edb, worst);
        assert_true(edw < 1e-5);
        assert_true(edb < 1e-5);
        assert_true(worst <= 1.0);
        assert_true(dot(r32.dw, r32.dw, nw) > 0.0 && dot(r32.dx, r32.dx, nx) > 0.0);
    } else {
        printf("conv block bf16 n=%d ic=%d oc=%d k=%d: y within half a bf16 ulp; dw differs "
               "by %.1e, dx by %.1e (window ties)\n",
               n, ic, oc, k, rel_diff(r16.dw, r32.dw, nw), rel_diff(r16.dx, r32.dx, nx));
    }
    conv_run_free(&r32);
    conv_run_free(&r16);
    float *bufs[] = {x, w, b, dy};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(bufs[i]);
}

static void convblock_bf16_matches_fp32_3x3(void **state)
{
    (void)state;
    check_conv_bf16(2, 3, 8, 3, 8, 1);
}

static void convblock_bf16_matches_fp32_single_channel_input(void **state)
{
    (void)state;
    check_conv_bf16(2, 1, 8, 3, 12, 1);
    check_conv_bf16(3, 1, 32, 5, 28, 1); /* conv1 of cnn */
}

static void convblock_bf16_matches_fp32_channels_not_multiple_of_block(void **state)
{
    (void)state;
    check_conv_bf16(2, 2, 12, 3, 6, 1);
}

static void convblock_bf16_matches_fp32_5x5_many_channels(void **state)
{
    (void)state;
    check_conv_bf16(2, 4, 16, 5, 10, 1);
    check_conv_bf16(3, 8, 64, 3, 14, 1); /* 64 channels: the NHWC layout of AMX kernels */
}

static void convblock_bf16_output_is_fp32_output_rounded(void **state)
{
    (void)state;
    check_conv_bf16(2, 3, 8, 3, 8, 0);
    check_conv_bf16(3, 32, 64, 5, 14, 0); /* conv2 of cnn */
}

/* RK_NO_HALF_KERNELS=1 makes a bf16 (or fp16) block the fp32 block, bit for bit, and the
 * storage query says fp32. */
static void convblock_half_kernels_off_is_fp32_exactly(void **state)
{
    (void)state;
    rk_convblock_shape s = {2, 3, 8, 8, 8, 3, RK_BF16};
    rk_rng rng;
    rk_rng_seed(&rng, 99);
    size_t nx = 2 * 3 * 8 * 8, nw = 8 * 3 * 3 * 3, ny = 2 * 8 * 4 * 4;
    float *x = rand_buf(&rng, nx, 1.0f), *w = rand_buf(&rng, nw, 0.5f);
    float *b = rand_buf(&rng, 8, 0.2f), *dy = rand_buf(&rng, ny, 1.0f);
    const char *was = getenv("RK_NO_HALF_KERNELS");
    char keep[64];
    snprintf(keep, sizeof keep, "%s", was ? was : "");
    assert_int_equal(setenv("RK_NO_HALF_KERNELS", "1", 1), 0);
    char why[128] = "";
    assert_int_equal(be->convblock_storage(&s, why, sizeof why), RK_F32);
    assert_non_null(strstr(why, "RK_NO_HALF_KERNELS"));
    conv_run r32, r16, rh;
    conv_run_block(s, RK_F32, x, w, b, dy, &r32);
    conv_run_block(s, RK_BF16, x, w, b, dy, &r16);
    conv_run_block(s, RK_F16, x, w, b, dy, &rh);
    char why16[128] = "";
    s.dtype = RK_F16; /* the fp16 query says fp32 too */
    rk_dtype fp16_storage = be->convblock_storage(&s, why16, sizeof why16);
    if (was) /* as it was: the run may have set it for every test */
        setenv("RK_NO_HALF_KERNELS", keep, 1);
    else
        unsetenv("RK_NO_HALF_KERNELS");
    assert_memory_equal(r16.y, r32.y, ny * sizeof(float));
    assert_memory_equal(r16.dx, r32.dx, nx * sizeof(float));
    assert_memory_equal(r16.dw, r32.dw, nw * sizeof(float));
    assert_memory_equal(rh.y, r32.y, ny * sizeof(float));
    assert_memory_equal(rh.dx, r32.dx, nx * sizeof(float));
    assert_memory_equal(rh.dw, r32.dw, nw * sizeof(float));
    assert_int_equal(fp16_storage, RK_F32);
    assert_non_null(strstr(why16, "RK_NO_HALF_KERNELS"));
    conv_run *runs[] = {&r32, &r16, &rh};
    for (int i = 0; i < 3; i++)
        conv_run_free(runs[i]);
    float *bufs[] = {x, w, b, dy};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(bufs[i]);
}

/* ---- conv block with fp16 storage ----
 *
 * The fp16 block keeps its input copy in fp16 and runs the fp32 block's kernels on fp32
 * transients, so on inputs that are fp16 values (what the model hands it: every activation
 * is rounded to fp16) its y, dx, dw and db are bit-equal to the fp32 block's. The storage
 * query says fp16 (unless RK_NO_HALF_KERNELS is set for the whole run: then skipped). */
static float f16_round(float v)
{
    return rk_f16_to_f32(rk_f32_to_f16(v));
}

static int fp16_stored(const rk_convblock_shape *s)
{
    char why[128] = "";
    rk_dtype got = be->convblock_storage(s, why, sizeof why);
    if (got != RK_F16 && getenv("RK_NO_HALF_KERNELS")) {
        print_message("skipped: %s\n", why);
        return 0;
    }
    assert_int_equal(got, RK_F16);
    assert_non_null(strstr(why, "fp32 oneDNN kernels"));
    return 1;
}

/* Inputs for shape s (fp16 values) in *x, *w, *b, *dy. */
static void f16_inputs(const rk_convblock_shape *s, uint64_t seed, float **x, float **w, float **b,
                       float **dy)
{
    rk_rng rng;
    rk_rng_seed(&rng, seed);
    size_t nx = (size_t)s->n * s->ic * s->h * s->w, nw = (size_t)s->oc * s->ic * s->k * s->k;
    size_t ny = (size_t)s->n * s->oc * (s->h / 2) * (s->w / 2);
    *x = rand_buf(&rng, nx, 1.0f);
    *w = rand_buf(&rng, nw, 0.5f);
    *b = rand_buf(&rng, (size_t)s->oc, 0.2f);
    *dy = rand_buf(&rng, ny, 1.0f);
    float *bufs[] = {*x, *w, *b, *dy};
    size_t lens[] = {nx, nw, (size_t)s->oc, ny};
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < lens[k]; i++)
            bufs[k][i] = f16_round(bufs[k][i]);
}

static void assert_runs_equal(const rk_convblock_shape *s, const conv_run *a, const conv_run *ref)
{
    size_t nx = (size_t)s->n * s->ic * s->h * s->w, nw = (size_t)s->oc * s->ic * s->k * s->k;
    size_t ny = (size_t)s->n * s->oc * (s->h / 2) * (s->w / 2);
    assert_memory_equal(a->y, ref->y, ny * sizeof(float));
    assert_memory_equal(a->dx, ref->dx, nx * sizeof(float));
    assert_memory_equal(a->dw, ref->dw, nw * sizeof(float));
    assert_memory_equal(a->db, ref->db, (size_t)s->oc * sizeof(float));
}

static void check_conv_f16(int n, int ic, int oc, int k, int hw)
{
    rk_convblock_shape s = {n, ic, hw, hw, oc, k, RK_F16};
    if (!fp16_stored(&s))
        skip();
    float *x, *w, *b, *dy;
    f16_inputs(&s, 4242 + (uint64_t)ic * 100 + (uint64_t)oc, &x, &w, &b, &dy);
    conv_run r32, r16;
    conv_run_block(s, RK_F32, x, w, b, dy, &r32);
    conv_run_block(s, RK_F16, x, w, b, dy, &r16);
    assert_runs_equal(&s, &r16, &r32);
    printf("conv block fp16 n=%d ic=%d oc=%d k=%d hw=%d: y, dx, dw, db bit-equal to fp32\n", n, ic,
           oc, k, hw);
    conv_run_free(&r32);
    conv_run_free(&r16);
    float *bufs[] = {x, w, b, dy};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        be->free(bufs[i]);
}

static void convblock_fp16_matches_fp32_bit_for_bit(void **state)
{
    (void)state;
    check_conv_f16(2, 3, 8, 3, 8);
    check_conv_f16(2, 2, 12, 3, 6);   /* channels not a multiple of the block */
    check_conv_f16(3, 1, 32, 5, 28);  /* conv1 of cnn */
    check_conv_f16(3, 32, 64, 5, 14); /* conv2 of cnn: its input copy is kept in fp16 */
}

/* Two fp16 blocks share one scratch: B's forward (which grows it) runs between A's forward
 * and A's backward, as in a model. A's backward still gives the fp32 block's results, so
 * nothing A needs between its ops lives in the scratch. */
static void convblock_fp16_blocks_share_the_scratch(void **state)
{
    (void)state;
    rk_convblock_shape sa = {2, 32, 14, 14, 64, 5, RK_F16}, sb = {4, 1, 28, 28, 32, 5, RK_F16};
    if (!fp16_stored(&sa))
        skip();
    const rk_convblock_shape *sh[2] = {&sa, &sb};
    float *x[2], *w[2], *b[2], *dy[2];
    conv_run ref[2], got[2];
    rk_op_cache *cache[2] = {NULL, NULL};
    rk_err err = {0};
    for (int i = 0; i < 2; i++) {
        f16_inputs(sh[i], 77 + (uint64_t)i, &x[i], &w[i], &b[i], &dy[i]);
        conv_run_block(*sh[i], RK_F32, x[i], w[i], b[i], dy[i], &ref[i]);
        const rk_convblock_shape *s = sh[i];
        size_t nx = (size_t)s->n * s->ic * s->h * s->w, nw = (size_t)s->oc * s->ic * s->k * s->k;
        size_t ny = (size_t)s->n * s->oc * (s->h / 2) * (s->w / 2);
        got[i].y = be->alloc(ny * sizeof(float));
        got[i].dx = be->alloc(nx * sizeof(float));
        got[i].dw = be->alloc(nw * sizeof(float));
        got[i].db = be->alloc((size_t)s->oc * sizeof(float));
    }
    for (int i = 0; i < 2; i++) /* forward A, then B */
        if (be->convblock_forward(&cache[i], sh[i], x[i], w[i], b[i], got[i].y, &err))
            fail_msg("%s", err.msg);
    for (int i = 1; i >= 0; i--) /* backward B, then A */
        if (be->convblock_backward(&cache[i], sh[i], dy[i], got[i].dx, got[i].dw, got[i].db, &err))
            fail_msg("%s", err.msg);
    for (int i = 0; i < 2; i++) {
        assert_runs_equal(sh[i], &got[i], &ref[i]);
        be->cache_free(cache[i]);
        conv_run_free(&ref[i]);
        conv_run_free(&got[i]);
        float *bufs[] = {x[i], w[i], b[i], dy[i]};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++)
            be->free(bufs[j]);
    }
}

/* ---- dropout ---- */

static void dropout_backward_matches_finite_differences(void **state)
{
    (void)state;
    enum { N = 400 };
    rk_rng rng;
    rk_rng_seed(&rng, 3);
    float *x = rand_buf(&rng, N, 1.0f), *r = rand_buf(&rng, N, 1.0f);
    float y[N], dx[N];
    uint8_t mask[N];
    assert_int_equal(be->dropout_forward(4, N / 4, 0.4f, 11, 5, 0, x, y, mask, NULL), 0);
    int kept = 0;
    for (int i = 0; i < N; i++)
        kept += mask[i];
    assert_true(kept > N * 0.45 && kept < N * 0.75); /* about 60% kept */
    assert_int_equal(be->dropout_backward(N, 0.4f, mask, r, dx, NULL), 0);
    gradcheck g = {0};
    const float h = 1e-2f;
    for (int i = 0; i < N; i++) {
        float keep = x[i];
        x[i] = keep + h;
        be->dropout_forward(4, N / 4, 0.4f, 11, 5, 0, x, y, mask, NULL);
        double lp = dot(y, r, N);
        x[i] = keep - h;
        be->dropout_forward(4, N / 4, 0.4f, 11, 5, 0, x, y, mask, NULL);
        double lm = dot(y, r, N);
        x[i] = keep;
        gc_add(&g, (lp - lm) / (2.0 * h), dx[i]);
    }
    printf("dropout dx: relative error %.2e\n", gc_rel(&g));
    assert_true(gc_rel(&g) < 1e-3);
    be->free(x);
    be->free(r);
}

static void dropout_mask_of_a_sample_does_not_depend_on_its_batch_slot(void **state)
{
    (void)state;
    enum { ROWS = 6, COLS = 50 };
    float x[ROWS * COLS], y[ROWS * COLS], y2[2 * COLS];
    uint8_t mask[ROWS * COLS], mask2[2 * COLS];
    for (int i = 0; i < ROWS * COLS; i++)
        x[i] = 1.0f;
    /* the whole batch (samples 10..15), then samples 13..14 alone as a second rank would */
    assert_int_equal(be->dropout_forward(ROWS, COLS, 0.5f, 9, 2, 10, x, y, mask, NULL), 0);
    assert_int_equal(be->dropout_forward(2, COLS, 0.5f, 9, 2, 13, x, y2, mask2, NULL), 0);
    assert_memory_equal(mask + 3 * COLS, mask2, 2 * COLS);
    assert_memory_equal(y + 3 * COLS, y2, 2 * COLS * sizeof(float));
    /* and another step draws other masks */
    assert_int_equal(be->dropout_forward(2, COLS, 0.5f, 9, 3, 13, x, y2, mask2, NULL), 0);
    assert_true(memcmp(mask + 3 * COLS, mask2, 2 * COLS) != 0);
}

/* ---- softmax cross-entropy ---- */

static void softmax_xent_gradient_matches_finite_differences(void **state)
{
    (void)state;
    enum { N = 4, C = 10 };
    rk_rng rng;
    rk_rng_seed(&rng, 5);
    float *z = rand_buf(&rng, N * C, 3.0f);
    float dz[N * C];
    uint8_t labels[N] = {0, 3, 9, 3};
    double loss, lp, lm;
    int correct;
    assert_int_equal(be->softmax_xent(N, C, z, labels, dz, N, &loss, &correct, NULL), 0);
    assert_true(loss > 0.0);
    gradcheck g = {0};
    const float h = 1e-3f;
    for (int i = 0; i < N * C; i++) {
        float keep = z[i];
        z[i] = keep + h;
        be->softmax_xent(N, C, z, labels, NULL, N, &lp, NULL, NULL);
        z[i] = keep - h;
        be->softmax_xent(N, C, z, labels, NULL, N, &lm, NULL, NULL);
        z[i] = keep;
        gc_add(&g, (lp - lm) / (2.0 * h), dz[i]);
    }
    printf("softmax xent dz: relative error %.2e\n", gc_rel(&g));
    assert_true(gc_rel(&g) < 1e-3);
    uint8_t bad[N] = {0, 10, 0, 0};
    assert_int_equal(be->softmax_xent(N, C, z, bad, NULL, N, &loss, NULL, NULL), RK_EINVAL);
    be->free(z);
}

/* ---- optimisers ---- */

static void sgd_nesterov_step_matches_formula(void **state)
{
    (void)state;
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 0.25f}, v[2] = {0.1f, 0.0f};
    assert_int_equal(be->sgd_step(2, p, g, v, 0.1f, 0.9f, 0.0f, 1, NULL), 0);
    /* v = 0.9 v + g; p -= lr (g + 0.9 v) */
    assert_float_equal(v[0], 0.59f, 1e-6);
    assert_float_equal(p[0], 1.0f - 0.1f * (0.5f + 0.9f * 0.59f), 1e-6);
    assert_float_equal(p[1], -2.0f - 0.1f * (0.25f + 0.9f * 0.25f), 1e-6);
}

static void adamw_first_step_moves_by_lr(void **state)
{
    (void)state;
    float p[2] = {1.0f, 1.0f}, g[2] = {3.0f, -0.01f}, m[2] = {0}, v[2] = {0};
    assert_int_equal(be->adamw_step(2, p, g, m, v, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, NULL), 0);
    /* bias-corrected first step is lr * sign(g) */
    assert_float_equal(p[0], 0.99f, 1e-5);
    assert_float_equal(p[1], 1.01f, 1e-5);
}

/* The step guard's blame (rk_train_judge_grads): a non-finite norm is the step's fault and its
 * rank is blamed, even with a finite outlier at a lower rank (norms 1,1,1,5000,NaN blamed
 * rank 3, the outlier, in the nan event). */
static void judge_grads_blames_the_nonfinite_rank(void **state)
{
    (void)state;
    char who[256];
    int trip, blame;
    rk_err err = {0};
    const double mixed[] = {1, 1, 1, 5000, NAN};
    assert_int_equal(rk_train_judge_grads(mixed, 5, 1000, &trip, &blame, who, sizeof who, &err),
                     RK_OK);
    assert_int_equal(trip, 1);
    assert_int_equal(blame, 4);
    assert_non_null(strstr(who, "rank 3"));
    assert_non_null(strstr(who, "rank 4"));
    const double outlier[] = {1, 1, 5000, 1};
    assert_int_equal(rk_train_judge_grads(outlier, 4, 1000, &trip, &blame, who, sizeof who, &err),
                     RK_OK);
    assert_int_equal(trip, 2);
    assert_int_equal(blame, 2);
    const double sound[] = {1, 1.1, 0.9};
    assert_int_equal(rk_train_judge_grads(sound, 3, 1000, &trip, &blame, who, sizeof who, &err),
                     RK_OK);
    assert_int_equal(trip, 0);
    assert_int_equal(blame, -1);
}

int main(void)
{
    be = rk_backend_get(RK_DEVICE_CPU, NULL);
    if (!be || be->init(2, NULL) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dense_backward_matches_finite_differences),
        cmocka_unit_test(judge_grads_blames_the_nonfinite_rank),
        cmocka_unit_test(dense_relu_backward_matches_finite_differences),
        cmocka_unit_test(convblock_3x3_backward_matches_finite_differences),
        cmocka_unit_test(convblock_5x5_backward_matches_finite_differences),
        cmocka_unit_test(convblock_single_channel_input_backward_matches),
        cmocka_unit_test(convblock_channels_not_multiple_of_block_backward_matches),
        cmocka_unit_test(convblock_backward_without_forward_is_an_error),
        cmocka_unit_test(convblock_bf16_matches_fp32_3x3),
        cmocka_unit_test(convblock_bf16_matches_fp32_single_channel_input),
        cmocka_unit_test(convblock_bf16_matches_fp32_channels_not_multiple_of_block),
        cmocka_unit_test(convblock_bf16_matches_fp32_5x5_many_channels),
        cmocka_unit_test(convblock_bf16_output_is_fp32_output_rounded),
        cmocka_unit_test(convblock_fp16_matches_fp32_bit_for_bit),
        cmocka_unit_test(convblock_fp16_blocks_share_the_scratch),
        cmocka_unit_test(convblock_half_kernels_off_is_fp32_exactly),
        cmocka_unit_test(dropout_backward_matches_finite_differences),
        cmocka_unit_test(dropout_mask_of_a_sample_does_not_depend_on_its_batch_slot),
        cmocka_unit_test(softmax_xent_gradient_matches_finite_differences),
        cmocka_unit_test(sgd_nesterov_step_matches_formula),
        cmocka_unit_test(adamw_first_step_moves_by_lr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
