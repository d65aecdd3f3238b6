/*
 * CPU backend: convolutions on oneDNN primitives (blocked layouts chosen by oneDNN, reordered
 * at the block's edges), 2x2 max pooling fused with the ReLU in plain C on the convolution's
 * own layout, dense layers on oneDNN's sgemm, and plain C loops for the element-wise work.
 * Everything runs on one OpenMP thread pool, sized once by init. Deterministic for a fixed thread
 * count: no op depends on thread timing.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "nn/backend.h"
#include "rekindle/rng.h"

static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

#define DNNL_TRY(call)                                                                             \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success)                                                                   \
            return rk_err_set(err, RK_EBACKEND, "oneDNN: %s failed with status %d (%s:%d)", #call, \
                              (int)st_, __FILE__, __LINE__);                                       \
    } while (0)

static int cpu_init(int threads, rk_err *err)
{
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    omp_set_num_threads(threads);
    if (!g_engine) {
        DNNL_TRY(dnnl_engine_create(&g_engine, dnnl_cpu, 0));
        DNNL_TRY(dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags));
    }
    return RK_OK;
}

static void *cpu_alloc(size_t bytes)
{
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        return NULL;
    return p;
}

static void cpu_free(void *p)
{
    free(p);
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

/* ---- dense ---------------------------------------------------------------------------- */

static int cpu_dense_forward(int n, int in, int out, const float *x, const float *w, const float *b,
                             float *y, int relu, rk_err *err)
{
    DNNL_TRY(dnnl_sgemm('N', 'T', n, out, in, 1.0f, x, in, w, in, 0.0f, y, out));
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        float *row = y + (size_t)i * out;
        for (int j = 0; j < out; j++) {
            float v = row[j] + b[j];
            row[j] = (relu && v < 0.0f) ? 0.0f : v;
        }
    }
    return RK_OK;
}

static int cpu_dense_backward(int n, int in, int out, const float *x, const float *w,
                              const float *y, float *dy, float *dx, float *dw, float *db, int relu,
                              rk_err *err)
{
    if (relu) {
        size_t total = (size_t)n * out;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < total; i++)
            if (y[i] <= 0.0f)
                dy[i] = 0.0f;
    }
    DNNL_TRY(dnnl_sgemm('T', 'N', out, in, n, 1.0f, dy, out, x, in, 0.0f, dw, in));
    for (int j = 0; j < out; j++)
        db[j] = 0.0f;
    for (int i = 0; i < n; i++) {
        const float *row = dy + (size_t)i * out;
        for (int j = 0; j < out; j++)
            db[j] += row[j];
    }
    if (dx)
        DNNL_TRY(dnnl_sgemm('N', 'N', n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in));
    return RK_OK;
}

/* ---- conv block ------------------------------------------------------------------------ */

/* A reorder between two layouts, built once; `src`/`dst` memories get their handles per call.
 * When the layouts are equal no primitive exists and callers use the buffer directly. */
typedef struct reorder {
    dnnl_primitive_t prim;
    dnnl_memory_t src, dst;
} reorder;

typedef struct plan {
    rk_convblock_shape s;
    int valid;
    /* user (plain) layouts */
    dnnl_memory_desc_t x_md, w_md, b_md;
    /* forward: conv (+bias, +ReLU post-op) into c, in a layout with channel blocks of `blk`
     * (1 = plain NCHW, 8 = nChw8c, 16 = nChw16c); pooling by pool_forward into the user's y */
    dnnl_primitive_desc_t conv_pd;
    dnnl_primitive_t conv;
    dnnl_memory_t m_xc, m_wc, m_b, m_c;
    float *xc, *wc, *c; /* owned buffers (xc, wc NULL when the user layout is used) */
    float *pm, *win;    /* pooled maxima and window winners (0..3), in c's layout, pooled */
    float *dpm;         /* pooled gradient in that layout (when it is not plain NCHW) */
    int blk;
    dnnl_memory_desc_t y_md, pm_md;
    reorder r_x, r_w, r_y, r_dy; /* pm layout <-> the user's NCHW y (none when blk is 1) */
    /* backward */
    dnnl_primitive_desc_t bw_pd, bd_pd;
    dnnl_primitive_t bw, bd;
    dnnl_memory_t m_dc, m_bw_src, m_bw_ddst, m_bw_dw, m_db, m_bd_w, m_bd_ddst, m_bd_dsrc;
    float *dc, *bw_src, *bw_ddst, *bw_dw, *bd_w, *bd_ddst, *bd_dsrc;
    reorder r_bw_src, r_bw_ddst, r_dw, r_bd_w, r_bd_ddst, r_dx;
    const float *x_user, *w_user; /* the inputs of the last forward, for backward */
    int has_bwd;
} plan;

#define RK_PLAN_SLOTS 3
struct rk_op_cache {
    plan slot[RK_PLAN_SLOTS];
    unsigned use[RK_PLAN_SLOTS];
    unsigned clock;
};

static void reorder_free(reorder *r)
{
    if (r->prim)
        dnnl_primitive_destroy(r->prim);
    if (r->src)
        dnnl_memory_destroy(r->src);
    if (r->dst)
        dnnl_memory_destroy(r->dst);
    memset(r, 0, sizeof *r);
}

static void mem_free(dnnl_memory_t *m)
{
    if (*m)
        dnnl_memory_destroy(*m);
    *m = NULL;
}

static void prim_free(dnnl_primitive_t *p, dnnl_primitive_desc_t *pd)
{
    if (p && *p)
        dnnl_primitive_destroy(*p);
    if (pd && *pd)
        dnnl_primitive_desc_destroy(*pd);
    if (p)
        *p = NULL;
    if (pd)
        *pd = NULL;
}

static void plan_free(plan *pl)
{
    prim_free(&pl->conv, &pl->conv_pd);
    prim_free(&pl->bw, &pl->bw_pd);
    prim_free(&pl->bd, &pl->bd_pd);
    dnnl_memory_t *mems[] = {&pl->m_xc, &pl->m_wc,     &pl->m_b,       &pl->m_c,
                             &pl->m_dc, &pl->m_bw_src, &pl->m_bw_ddst, &pl->m_bw_dw,
                             &pl->m_db, &pl->m_bd_w,   &pl->m_bd_ddst, &pl->m_bd_dsrc};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
        mem_free(mems[i]);
    float *bufs[] = {pl->xc,      pl->wc,    pl->c,    pl->dc,      pl->bw_src,
                     pl->bw_ddst, pl->bw_dw, pl->bd_w, pl->bd_ddst, pl->bd_dsrc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(pl->pm);
    free(pl->win);
    free(pl->dpm);
    reorder *rs[] = {&pl->r_x,       &pl->r_w,  &pl->r_y,    &pl->r_dy,      &pl->r_bw_src,
                     &pl->r_bw_ddst, &pl->r_dw, &pl->r_bd_w, &pl->r_bd_ddst, &pl->r_dx};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
        reorder_free(rs[i]);
    memset(pl, 0, sizeof *pl);
}

static void cpu_cache_free(rk_op_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < RK_PLAN_SLOTS; i++)
        plan_free(&c->slot[i]);
    free(c);
}

/* A memory object over a buffer we own, sized for `md` (zeroed: blocked layouts pad). */
static int mem_owned(dnnl_memory_t *m, float **buf, const dnnl_memory_desc_t *md, rk_err *err)
{
    size_t bytes = dnnl_memory_desc_get_size(md);
    *buf = cpu_alloc(bytes);
    if (!*buf)
        return rk_err_set(err, RK_ENOMEM, "conv block: cannot allocate %zu bytes", bytes);
    memset(*buf, 0, bytes);
    DNNL_TRY(dnnl_memory_create(m, md, g_engine, *buf));
    return RK_OK;
}

/* Prepare a reorder from `from` to `to` layouts; no-op when equal. */
static int reorder_init(reorder *r, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                        rk_err *err)
{
    if (dnnl_memory_desc_equal(from, to))
        return RK_OK;
    dnnl_primitive_desc_t pd;
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&pd, from, g_engine, to, g_engine, NULL));
    dnnl_status_t st = dnnl_primitive_create(&r->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success)
        return rk_err_set(err, RK_EBACKEND, "oneDNN: reorder create failed (%d)", (int)st);
    DNNL_TRY(dnnl_memory_create(&r->src, from, g_engine, DNNL_MEMORY_NONE));
    DNNL_TRY(dnnl_memory_create(&r->dst, to, g_engine, DNNL_MEMORY_NONE));
    return RK_OK;
}

static int reorder_run(reorder *r, const void *src, void *dst, rk_err *err)
{
    DNNL_TRY(dnnl_memory_set_data_handle(r->src, (void *)src));
    DNNL_TRY(dnnl_memory_set_data_handle(r->dst, dst));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, r->src}, {DNNL_ARG_TO, r->dst}};
    DNNL_TRY(dnnl_primitive_execute(r->prim, g_stream, 2, args));
    return RK_OK;
}

/* `src` in the layout a reorder was built for: reordered into `buf` when the reorder exists,
 * else `src` itself (the layouts are equal). The result is in *out. */
static int staged(reorder *r, const float *src, float *buf, const float **out, rk_err *err)
{
    *out = src;
    if (!r->prim)
        return RK_OK;
    *out = buf;
    return reorder_run(r, src, buf, err);
}

/* The layout a primitive uses for `what`: a buffer in that layout (owned when it differs from
 * the user layout) and the reorder between the two: from the user layout for an input
 * (IN), back to the user layout for an output (OUT). No reorder when they are equal. */
enum { IN, OUT };
static int layout_for(dnnl_primitive_desc_t pd, dnnl_query_t what, int dir,
                      const dnnl_memory_desc_t *user, reorder *r, dnnl_memory_t *m, float **buf,
                      rk_err *err)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, what, 0);
    if (dnnl_memory_desc_equal(md, user)) {
        DNNL_TRY(dnnl_memory_create(m, md, g_engine, DNNL_MEMORY_NONE));
        return RK_OK;
    }
    int rc = dir == IN ? reorder_init(r, user, md, err) : reorder_init(r, md, user, err);
    if (rc == RK_OK)
        rc = mem_owned(m, buf, md, err);
    return rc;
}

/* Channel block of a conv output layout we can pool in place: 1 (nchw), 8 or 16 (nChw8c,
 * nChw16c); 0 for any other layout. */
static int block_of(const dnnl_memory_desc_t *md, const dnnl_dims_t dims)
{
    static const struct {
        dnnl_format_tag_t tag;
        int blk;
    } known[] = {{dnnl_nChw8c, 8}, {dnnl_nChw16c, 16}, {dnnl_nchw, 1}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        dnnl_memory_desc_t k;
        if (dnnl_memory_desc_init_by_tag(&k, 4, dims, dnnl_f32, known[i].tag) == dnnl_success &&
            dnnl_memory_desc_equal(&k, md))
            return known[i].blk;
    }
    return 0;
}

static int conv_pd_create(plan *pl, const dnnl_memory_desc_t *xa, const dnnl_memory_desc_t *wa,
                          const dnnl_memory_desc_t *ca, const rk_convblock_shape *s, rk_err *err)
{
    int pad = s->k / 2;
    dnnl_dims_t stride1 = {1, 1}, padl = {pad, pad}, padr = {pad, pad};
    dnnl_convolution_desc_t conv_d;
    DNNL_TRY(dnnl_convolution_forward_desc_init(&conv_d, dnnl_forward_training,
                                                dnnl_convolution_direct, xa, wa, &pl->b_md, ca,
                                                stride1, padl, padr));
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    DNNL_TRY(dnnl_primitive_attr_create(&attr));
    DNNL_TRY(dnnl_post_ops_create(&po));
    DNNL_TRY(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
    DNNL_TRY(dnnl_primitive_attr_set_post_ops(attr, po));
    dnnl_status_t st = dnnl_primitive_desc_create(&pl->conv_pd, &conv_d, attr, g_engine, NULL);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success)
        return rk_err_set(err, RK_EBACKEND, "oneDNN: no convolution for %dx%dx%dx%d k%d (%d)", s->n,
                          s->ic, s->h, s->w, s->k, (int)st);
    return RK_OK;
}

static int plan_build_forward(plan *pl, const rk_convblock_shape *s, rk_err *err)
{
    dnnl_dims_t xd = {s->n, s->ic, s->h, s->w}, wd = {s->oc, s->ic, s->k, s->k}, bd = {s->oc};
    dnnl_dims_t cd = {s->n, s->oc, s->h, s->w};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&pl->x_md, 4, xd, dnnl_f32, dnnl_nchw));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&pl->w_md, 4, wd, dnnl_f32, dnnl_oihw));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&pl->b_md, 1, bd, dnnl_f32, dnnl_x));
    dnnl_memory_desc_t xa, wa, ca;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&xa, 4, xd, dnnl_f32, dnnl_format_tag_any));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wa, 4, wd, dnnl_f32, dnnl_format_tag_any));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&ca, 4, cd, dnnl_f32, dnnl_format_tag_any));
    int rc = conv_pd_create(pl, &xa, &wa, &ca, s, err);
    if (rc)
        return rc;
    pl->blk = block_of(dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_dst_md, 0), cd);
    if (!pl->blk) { /* a layout the pooling loop does not know: ask for plain NCHW */
        dnnl_primitive_desc_destroy(pl->conv_pd);
        pl->conv_pd = NULL;
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&ca, 4, cd, dnnl_f32, dnnl_nchw));
        if ((rc = conv_pd_create(pl, &xa, &wa, &ca, s, err)))
            return rc;
        pl->blk = 1;
    }
    DNNL_TRY(dnnl_primitive_create(&pl->conv, pl->conv_pd));
    if ((rc = layout_for(pl->conv_pd, dnnl_query_src_md, IN, &pl->x_md, &pl->r_x, &pl->m_xc,
                         &pl->xc, err)) ||
        (rc = layout_for(pl->conv_pd, dnnl_query_weights_md, IN, &pl->w_md, &pl->r_w, &pl->m_wc,
                         &pl->wc, err)))
        return rc;
    DNNL_TRY(dnnl_memory_create(&pl->m_b, &pl->b_md, g_engine, DNNL_MEMORY_NONE));
    const dnnl_memory_desc_t *c_md =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_dst_md, 0);
    if ((rc = mem_owned(&pl->m_c, &pl->c, c_md, err)))
        return rc;
    static const dnnl_format_tag_t tag_of_blk[17] = {
        [1] = dnnl_nchw, [8] = dnnl_nChw8c, [16] = dnnl_nChw16c};
    dnnl_dims_t yd = {s->n, s->oc, s->h / 2, s->w / 2};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&pl->y_md, 4, yd, dnnl_f32, dnnl_nchw));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&pl->pm_md, 4, yd, dnnl_f32, tag_of_blk[pl->blk]));
    size_t pooled = dnnl_memory_desc_get_size(&pl->pm_md);
    pl->pm = cpu_alloc(pooled);
    pl->win = cpu_alloc(pooled);
    pl->dpm = cpu_alloc(pooled);
    if (!pl->pm || !pl->win || !pl->dpm)
        return rk_err_set(err, RK_ENOMEM, "conv block: out of memory for pooling");
    memset(pl->dpm, 0, pooled);
    if ((rc = reorder_init(&pl->r_y, &pl->pm_md, &pl->y_md, err)) ||
        (rc = reorder_init(&pl->r_dy, &pl->y_md, &pl->pm_md, err)))
        return rc;
    pl->s = *s;
    pl->valid = 1;
    return RK_OK;
}

/* 2x2/2 max pooling of c (ReLU already applied; channel blocks of `blk`) into pm (same
 * layout, pooled), remembering each window's winner (0..3, as float) in win. Windows tile c
 * exactly (h, w even). One output row (n, channel block cb, row i) per call; inlined with a
 * constant blk so the lane loop vectorises. */
static inline __attribute__((always_inline)) void pool_fwd_row(const rk_convblock_shape *s, int blk,
                                                               const float *c, float *pm,
                                                               float *win, int n, int cb, int i)
{
    const int cb_n = (s->oc + blk - 1) / blk, oh = s->h / 2, ow = s->w / 2;
    const float *r0 = c + (((size_t)n * cb_n + cb) * s->h + 2 * i) * s->w * blk;
    const float *r1 = r0 + (size_t)s->w * blk;
    size_t o = (((size_t)n * cb_n + cb) * oh + i) * ow * blk;
#ifdef __SSE2__
    if (blk % 4 == 0) { /* 4 lanes at a time; same ties as the scalar loop below */
        const __m128 one = _mm_set1_ps(1.0f), two = _mm_set1_ps(2.0f);
        for (int j = 0; j < ow; j++)
            for (int k = 0; k < blk; k += 4) {
                __m128 v0 = _mm_loadu_ps(r0 + (2 * j) * blk + k);
                __m128 v1 = _mm_loadu_ps(r0 + (2 * j + 1) * blk + k);
                __m128 v2 = _mm_loadu_ps(r1 + (2 * j) * blk + k);
                __m128 v3 = _mm_loadu_ps(r1 + (2 * j + 1) * blk + k);
                __m128 m01 = _mm_max_ps(v0, v1), m23 = _mm_max_ps(v2, v3);
                __m128 w01 = _mm_and_ps(_mm_cmpgt_ps(v1, v0), one);
                __m128 w23 = _mm_add_ps(two, _mm_and_ps(_mm_cmpgt_ps(v3, v2), one));
                __m128 hi = _mm_cmpgt_ps(m23, m01);
                _mm_storeu_ps(pm + o + j * blk + k, _mm_max_ps(m01, m23));
                _mm_storeu_ps(win + o + j * blk + k,
                              _mm_or_ps(_mm_and_ps(hi, w23), _mm_andnot_ps(hi, w01)));
            }
        return;
    }
#endif
    for (int j = 0; j < ow; j++)
        for (int k = 0; k < blk; k++) {
            float v0 = r0[(2 * j) * blk + k], v1 = r0[(2 * j + 1) * blk + k];
            float v2 = r1[(2 * j) * blk + k], v3 = r1[(2 * j + 1) * blk + k];
            float m01 = v1 > v0 ? v1 : v0, w01 = v1 > v0 ? 1.0f : 0.0f;
            float m23 = v3 > v2 ? v3 : v2, w23 = v3 > v2 ? 3.0f : 2.0f;
            pm[o + j * blk + k] = m23 > m01 ? m23 : m01;
            win[o + j * blk + k] = m23 > m01 ? w23 : w01;
        }
}

/* Gradient of pool(ReLU(conv)) with respect to the conv output, one pooled row: dpm (same
 * layout as pm) goes to each window's winner when the window's maximum is positive; zero
 * everywhere else, so dc is fully written. */
static inline __attribute__((always_inline)) void pool_bwd_row(const rk_convblock_shape *s, int blk,
                                                               const float *pm, const float *win,
                                                               const float *dpm, float *dc, int n,
                                                               int cb, int i)
{
    const int cb_n = (s->oc + blk - 1) / blk, oh = s->h / 2, ow = s->w / 2;
    float *r0 = dc + (((size_t)n * cb_n + cb) * s->h + 2 * i) * s->w * blk;
    float *r1 = r0 + (size_t)s->w * blk;
    size_t o = (((size_t)n * cb_n + cb) * oh + i) * ow * blk;
#ifdef __SSE2__
    if (blk % 4 == 0) {
        const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f);
        const __m128 two = _mm_set1_ps(2.0f), three = _mm_set1_ps(3.0f);
        for (int j = 0; j < ow; j++)
            for (int k = 0; k < blk; k += 4) {
                size_t q = o + j * blk + k;
                __m128 g =
                    _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(pm + q), zero), _mm_loadu_ps(dpm + q));
                __m128 w = _mm_loadu_ps(win + q);
                _mm_storeu_ps(r0 + (2 * j) * blk + k, _mm_and_ps(_mm_cmpeq_ps(w, zero), g));
                _mm_storeu_ps(r0 + (2 * j + 1) * blk + k, _mm_and_ps(_mm_cmpeq_ps(w, one), g));
                _mm_storeu_ps(r1 + (2 * j) * blk + k, _mm_and_ps(_mm_cmpeq_ps(w, two), g));
                _mm_storeu_ps(r1 + (2 * j + 1) * blk + k, _mm_and_ps(_mm_cmpeq_ps(w, three), g));
            }
        return;
    }
#endif
    for (int j = 0; j < ow; j++)
        for (int k = 0; k < blk; k++) {
            float g = pm[o + j * blk + k] > 0.0f ? dpm[o + j * blk + k] : 0.0f;
            float w = win[o + j * blk + k];
            r0[(2 * j) * blk + k] = w == 0.0f ? g : 0.0f;
            r0[(2 * j + 1) * blk + k] = w == 1.0f ? g : 0.0f;
            r1[(2 * j) * blk + k] = w == 2.0f ? g : 0.0f;
            r1[(2 * j + 1) * blk + k] = w == 3.0f ? g : 0.0f;
        }
}

static void pool_forward(const plan *pl)
{
    const rk_convblock_shape *s = &pl->s;
    const int blk = pl->blk, cb_n = (s->oc + blk - 1) / blk, oh = s->h / 2;
#pragma omp parallel for collapse(3) schedule(static)
    for (int n = 0; n < s->n; n++)
        for (int cb = 0; cb < cb_n; cb++)
            for (int i = 0; i < oh; i++) {
                if (blk == 8)
                    pool_fwd_row(s, 8, pl->c, pl->pm, pl->win, n, cb, i);
                else if (blk == 16)
                    pool_fwd_row(s, 16, pl->c, pl->pm, pl->win, n, cb, i);
                else
                    pool_fwd_row(s, blk, pl->c, pl->pm, pl->win, n, cb, i);
            }
}

static void pool_backward(const plan *pl, const float *dpm)
{
    const rk_convblock_shape *s = &pl->s;
    const int blk = pl->blk, cb_n = (s->oc + blk - 1) / blk, oh = s->h / 2;
#pragma omp parallel for collapse(3) schedule(static)
    for (int n = 0; n < s->n; n++)
        for (int cb = 0; cb < cb_n; cb++)
            for (int i = 0; i < oh; i++) {
                if (blk == 8)
                    pool_bwd_row(s, 8, pl->pm, pl->win, dpm, pl->dc, n, cb, i);
                else if (blk == 16)
                    pool_bwd_row(s, 16, pl->pm, pl->win, dpm, pl->dc, n, cb, i);
                else
                    pool_bwd_row(s, blk, pl->pm, pl->win, dpm, pl->dc, n, cb, i);
            }
}

/* Backward primitives, built on the first backward of a plan (inference never needs them). */
static int plan_build_backward(plan *pl, rk_err *err)
{
    const rk_convblock_shape *s = &pl->s;
    int pad = s->k / 2;
    dnnl_dims_t xd = {s->n, s->ic, s->h, s->w}, wd = {s->oc, s->ic, s->k, s->k};
    dnnl_dims_t cd = {s->n, s->oc, s->h, s->w};
    dnnl_dims_t stride1 = {1, 1}, padl = {pad, pad}, padr = {pad, pad};
    const dnnl_memory_desc_t *dc_md =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_dst_md, 0);
    int rc;
    if ((rc = mem_owned(&pl->m_dc, &pl->dc, dc_md, err)))
        return rc;

    dnnl_memory_desc_t xa, wa, ca;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&xa, 4, xd, dnnl_f32, dnnl_format_tag_any));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wa, 4, wd, dnnl_f32, dnnl_format_tag_any));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&ca, 4, cd, dnnl_f32, dnnl_format_tag_any));

    /* weights gradient */
    dnnl_convolution_desc_t bw_d;
    DNNL_TRY(dnnl_convolution_backward_weights_desc_init(&bw_d, dnnl_convolution_direct, &xa, &wa,
                                                         &pl->b_md, &ca, stride1, padl, padr));
    DNNL_TRY(dnnl_primitive_desc_create(&pl->bw_pd, &bw_d, NULL, g_engine, pl->conv_pd));
    DNNL_TRY(dnnl_primitive_create(&pl->bw, pl->bw_pd));
    const dnnl_memory_desc_t *x_fwd =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_src_md, 0);
    if ((rc = layout_for(pl->bw_pd, dnnl_query_src_md, IN, x_fwd, &pl->r_bw_src, &pl->m_bw_src,
                         &pl->bw_src, err)) ||
        (rc = layout_for(pl->bw_pd, dnnl_query_diff_dst_md, IN, dc_md, &pl->r_bw_ddst,
                         &pl->m_bw_ddst, &pl->bw_ddst, err)))
        return rc;
    if ((rc = layout_for(pl->bw_pd, dnnl_query_diff_weights_md, OUT, &pl->w_md, &pl->r_dw,
                         &pl->m_bw_dw, &pl->bw_dw, err)))
        return rc;
    DNNL_TRY(dnnl_memory_create(&pl->m_db, &pl->b_md, g_engine, DNNL_MEMORY_NONE));

    /* data gradient */
    dnnl_convolution_desc_t bd_d;
    DNNL_TRY(dnnl_convolution_backward_data_desc_init(&bd_d, dnnl_convolution_direct, &xa, &wa, &ca,
                                                      stride1, padl, padr));
    DNNL_TRY(dnnl_primitive_desc_create(&pl->bd_pd, &bd_d, NULL, g_engine, pl->conv_pd));
    DNNL_TRY(dnnl_primitive_create(&pl->bd, pl->bd_pd));
    if ((rc = layout_for(pl->bd_pd, dnnl_query_weights_md, IN, &pl->w_md, &pl->r_bd_w, &pl->m_bd_w,
                         &pl->bd_w, err)) ||
        (rc = layout_for(pl->bd_pd, dnnl_query_diff_dst_md, IN, dc_md, &pl->r_bd_ddst,
                         &pl->m_bd_ddst, &pl->bd_ddst, err)))
        return rc;
    if ((rc = layout_for(pl->bd_pd, dnnl_query_diff_src_md, OUT, &pl->x_md, &pl->r_dx,
                         &pl->m_bd_dsrc, &pl->bd_dsrc, err)))
        return rc;
    pl->has_bwd = 1;
    return RK_OK;
}

static plan *plan_get(rk_op_cache **cachep, const rk_convblock_shape *s, int create, rk_err *err)
{
    if (!*cachep) {
        *cachep = calloc(1, sizeof **cachep);
        if (!*cachep) {
            rk_err_set(err, RK_ENOMEM, "conv block: out of memory");
            return NULL;
        }
    }
    rk_op_cache *c = *cachep;
    c->clock++;
    int victim = -1;
    for (int i = 0; i < RK_PLAN_SLOTS; i++) {
        if (c->slot[i].valid && memcmp(&c->slot[i].s, s, sizeof *s) == 0) {
            c->use[i] = c->clock;
            return &c->slot[i];
        }
    }
    for (int i = 0; i < RK_PLAN_SLOTS && victim < 0; i++)
        if (!c->slot[i].valid)
            victim = i;
    if (victim < 0) { /* all in use: evict the least recently used */
        victim = 0;
        for (int i = 1; i < RK_PLAN_SLOTS; i++)
            if (c->use[i] < c->use[victim])
                victim = i;
    }
    if (!create) {
        rk_err_set(err, RK_EINVAL, "conv block: backward without a forward of the same shape");
        return NULL;
    }
    plan_free(&c->slot[victim]);
    if (plan_build_forward(&c->slot[victim], s, err) != RK_OK) {
        plan_free(&c->slot[victim]);
        return NULL;
    }
    c->use[victim] = c->clock;
    return &c->slot[victim];
}

static int cpu_convblock_forward(rk_op_cache **cache, const rk_convblock_shape *s, const float *x,
                                 const float *w, const float *b, float *y, rk_err *err)
{
    if (s->h % 2 || s->w % 2 || s->k % 2 == 0)
        return rk_err_set(err, RK_EINVAL, "conv block: needs even height/width and odd kernel");
    plan *pl = plan_get(cache, s, 1, err);
    if (!pl)
        return err ? err->code : RK_EBACKEND;
    int rc;
    const float *xs, *ws;
    if ((rc = staged(&pl->r_x, x, pl->xc, &xs, err)) ||
        (rc = staged(&pl->r_w, w, pl->wc, &ws, err)))
        return rc;
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_xc, (void *)xs));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_wc, (void *)ws));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_b, (void *)b));
    dnnl_exec_arg_t cargs[4] = {{DNNL_ARG_SRC, pl->m_xc},
                                {DNNL_ARG_WEIGHTS, pl->m_wc},
                                {DNNL_ARG_BIAS, pl->m_b},
                                {DNNL_ARG_DST, pl->m_c}};
    DNNL_TRY(dnnl_primitive_execute(pl->conv, g_stream, 4, cargs));
    pool_forward(pl);
    if (pl->r_y.prim) {
        if ((rc = reorder_run(&pl->r_y, pl->pm, y, err)))
            return rc;
    } else {
        memcpy(y, pl->pm, dnnl_memory_desc_get_size(&pl->y_md));
    }
    pl->x_user = x;
    pl->w_user = w;
    return RK_OK;
}

static int cpu_convblock_backward(rk_op_cache **cache, const rk_convblock_shape *s, const float *dy,
                                  float *dx, float *dw, float *db, rk_err *err)
{
    plan *pl = *cache ? plan_get(cache, s, 0, err) : NULL;
    if (!pl)
        return rk_err_set(err, RK_EINVAL, "conv block: backward without a forward of this shape");
    int rc;
    if (!pl->has_bwd && (rc = plan_build_backward(pl, err)))
        return rc;

    const float *dpm;
    if ((rc = staged(&pl->r_dy, dy, pl->dpm, &dpm, err)))
        return rc;
    pool_backward(pl, dpm);

    /* weights and bias gradient */
    const float *src;
    if ((rc = staged(&pl->r_bw_src, pl->xc ? pl->xc : pl->x_user, pl->bw_src, &src, err)))
        return rc;
    const float *ddst;
    if ((rc = staged(&pl->r_bw_ddst, pl->dc, pl->bw_ddst, &ddst, err)))
        return rc;
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bw_src, (void *)src));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bw_ddst, (void *)ddst));
    if (!pl->r_dw.prim)
        DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bw_dw, dw));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_db, db));
    dnnl_exec_arg_t wargs[4] = {{DNNL_ARG_SRC, pl->m_bw_src},
                                {DNNL_ARG_DIFF_DST, pl->m_bw_ddst},
                                {DNNL_ARG_DIFF_WEIGHTS, pl->m_bw_dw},
                                {DNNL_ARG_DIFF_BIAS, pl->m_db}};
    DNNL_TRY(dnnl_primitive_execute(pl->bw, g_stream, 4, wargs));
    if (pl->r_dw.prim && (rc = reorder_run(&pl->r_dw, pl->bw_dw, dw, err)))
        return rc;

    if (!dx)
        return RK_OK;
    /* data gradient (weights are unchanged since the forward that saved w_user) */
    const float *wb;
    if ((rc = staged(&pl->r_bd_w, pl->w_user, pl->bd_w, &wb, err)))
        return rc;
    const float *bdd;
    if ((rc = staged(&pl->r_bd_ddst, pl->dc, pl->bd_ddst, &bdd, err)))
        return rc;
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bd_w, (void *)wb));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bd_ddst, (void *)bdd));
    if (!pl->r_dx.prim)
        DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bd_dsrc, dx));
    dnnl_exec_arg_t dargs[3] = {{DNNL_ARG_WEIGHTS, pl->m_bd_w},
                                {DNNL_ARG_DIFF_DST, pl->m_bd_ddst},
                                {DNNL_ARG_DIFF_SRC, pl->m_bd_dsrc}};
    DNNL_TRY(dnnl_primitive_execute(pl->bd, g_stream, 3, dargs));
    if (pl->r_dx.prim && (rc = reorder_run(&pl->r_dx, pl->bd_dsrc, dx, err)))
        return rc;
    return RK_OK;
}

/* ---- element-wise ops, loss, optimisers --------------------------------------------------- */

static int cpu_dropout_forward(size_t rows, size_t cols, float p, uint64_t seed, uint64_t stream,
                               uint64_t first_row, const float *x, float *y, uint8_t *mask,
                               rk_err *err)
{
    if (!(p >= 0.0f && p < 1.0f))
        return rk_err_set(err, RK_EINVAL, "dropout: rate %g is outside [0, 1)", (double)p);
    float scale = 1.0f / (1.0f - p);
    for (size_t r = 0; r < rows; r++) {
        rk_rng g;
        rk_rng_derive(&g, seed ^ 0x64726f706f7574ULL, stream, first_row + r);
        size_t base = r * cols;
        for (size_t i = 0; i < cols; i++) {
            mask[base + i] = rk_rng_uniform(&g) >= p;
            y[base + i] = mask[base + i] ? x[base + i] * scale : 0.0f;
        }
    }
    return RK_OK;
}

static int cpu_dropout_backward(size_t n, float p, const uint8_t *mask, const float *dy, float *dx,
                                rk_err *err)
{
    (void)err;
    float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++)
        dx[i] = mask[i] ? dy[i] * scale : 0.0f;
    return RK_OK;
}

static int cpu_softmax_xent(int n, int classes, const float *logits, const uint8_t *labels,
                            float *dlogits, int denom, double *loss, int *correct, rk_err *err)
{
    double total = 0.0;
    int right = 0;
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        if (labels[i] >= classes)
            return rk_err_set(err, RK_EINVAL, "loss: label %d of row %d is not below %d", labels[i],
                              i, classes);
        int arg = 0;
        float mx = z[0];
        for (int j = 1; j < classes; j++)
            if (z[j] > mx) {
                mx = z[j];
                arg = j;
            }
        right += arg == labels[i];
        double sum = 0.0;
        for (int j = 0; j < classes; j++)
            sum += exp((double)(z[j] - mx));
        double lse = log(sum) + mx;
        total += lse - z[labels[i]];
        if (dlogits) {
            float *d = dlogits + (size_t)i * classes;
            for (int j = 0; j < classes; j++)
                d[j] = (float)(exp((double)z[j] - lse) / denom);
            d[labels[i]] -= 1.0f / (float)denom;
        }
    }
    if (loss)
        *loss = total / n;
    if (correct)
        *correct = right;
    return RK_OK;
}

static int cpu_sgd_step(size_t n, float *p, const float *g, float *v, float lr, float momentum,
                        float weight_decay, int nesterov, rk_err *err)
{
    (void)err;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] + weight_decay * p[i];
        if (momentum != 0.0f) {
            v[i] = momentum * v[i] + gi;
            gi = nesterov ? gi + momentum * v[i] : v[i];
        }
        p[i] -= lr * gi;
    }
    return RK_OK;
}

static int cpu_adamw_step(size_t n, float *p, const float *g, float *m, float *v, float lr,
                          float b1, float b2, float eps, float weight_decay, int64_t t, rk_err *err)
{
    (void)err;
    float c1 = 1.0f / (1.0f - powf(b1, (float)t));
    float c2 = 1.0f / (1.0f - powf(b2, (float)t));
    float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] = p[i] * decay - lr * (m[i] * c1) / (sqrtf(v[i] * c2) + eps);
    }
    return RK_OK;
}

const rk_backend rk_backend_cpu = {
    .name = "cpu (oneDNN)",
    .device = RK_DEVICE_CPU,
    .init = cpu_init,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .cache_free = cpu_cache_free,
    .dense_forward = cpu_dense_forward,
    .dense_backward = cpu_dense_backward,
    .convblock_forward = cpu_convblock_forward,
    .convblock_backward = cpu_convblock_backward,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .softmax_xent = cpu_softmax_xent,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
};
