/*
 * CPU backend: convolutions on oneDNN primitives (blocked layouts chosen by oneDNN, reordered
 * at the block's edges), 2x2 max pooling fused with the ReLU in plain C on the convolution's
 * own layout, dense layers on oneDNN's sgemm, and plain C loops for the element-wise work.
 * Conv blocks asked for bf16 storage keep their tensors in bf16 and run oneDNN's bf16 kernels
 * where this CPU has them (AVX512-BF16, AMX), else fp32; blocks asked for fp16 keep their input
 * copy in fp16 and run fp32 kernels on one set of fp32 transients shared by all fp16 blocks
 * (oneDNN 2.6 has no fp16 convolution on CPUs; docs/amp.md).
 * Everything runs on one OpenMP thread pool, sized once by init. Deterministic for a fixed thread
 * count: no op depends on thread timing.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_version.h>
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

/* A plan stores the block's tensors in `dt`: f32, or bf16 when the shape asked for it and
 * oneDNN has bf16 kernels for it here (cpu_convblock_storage). Only the op boundary is fp32:
 * the caller's x, w, b, y, dy, dx, dw and db, converted by reorders. In bf16 the convolutions
 * accumulate in fp32 and round their outputs once; weight and bias gradients stay fp32.
 *
 * What a plan holds between forward and backward is the input copy (xc; the caller's x when
 * its layout is the convolution's) and each window's winner (win). Everything else is a
 * transient, and the big ones do double duty: c holds the conv output in forward and its
 * gradient in backward, pm the pooled maxima in forward and the pooled gradient in backward.
 *
 * An fp16 plan (f16) runs the fp32 kernels (dt f32) but keeps only xh, the input copy in fp16
 * in the convolution's layout, and win; c, pm, the fp32 input copy and the backward's own
 * copies live in the shared scratch (regions S_*), which holds them only for one op. */
enum { S_C, S_PM, S_X, S_BWS, S_DD, S_NREG };
typedef struct plan {
    rk_convblock_shape s;
    int valid;
    dnnl_data_type_t dt; /* element type of xc, c, pm and the conv's own copies */
    size_t esz;          /* its size in bytes */
    /* user (plain, fp32) layouts */
    dnnl_memory_desc_t x_md, w_md, b_md;
    /* forward: conv (+bias, +ReLU post-op) into c, in a layout with channel blocks of `blk`
     * (1 = plain NCHW, 8 = nChw8c, 16 = nChw16c, oc = NHWC); pooling by pool_forward into
     * pm, reordered into the user's y */
    dnnl_primitive_desc_t conv_pd;
    dnnl_primitive_t conv;
    dnnl_memory_t m_xc, m_wc, m_b, m_c;
    void *xc, *wc, *c; /* owned buffers (xc, wc NULL when the user layout is used) */
    void *pm;          /* pooled maxima (forward), pooled gradient (backward); c's layout */
    uint8_t *win;      /* per pooled value: its window's winner 0..3, or 4: no gradient */
    int blk;
    dnnl_format_tag_t tag; /* c's layout, which pm shares */
    dnnl_memory_desc_t y_md, pm_md;
    reorder r_x, r_w, r_y, r_dy; /* pm <-> the user's NCHW y (none when the same) */
    /* backward: weights gradient (bw) and data gradient (bd), each built on first use */
    dnnl_primitive_desc_t bw_pd, bd_pd;
    dnnl_primitive_t bw, bd;
    dnnl_memory_t m_bw_src, m_bw_ddst, m_bw_dw, m_db, m_bd_w, m_bd_ddst, m_bd_dsrc;
    void *bw_src, *bw_ddst, *bw_dw, *bd_w, *bd_ddst, *bd_dsrc;
    reorder r_bw_src, r_bw_ddst, r_dw, r_bd_w, r_bd_ddst, r_dx;
    const float *x_user, *w_user; /* the inputs of the last forward, for backward */
    int has_bw, has_bd;
    /* fp16 storage: the input copy in fp16 (xn values, NULL when the caller's x is used) and
     * the scratch regions: sizes, offsets, total */
    int f16;
    uint16_t *xh;
    size_t xn;
    size_t sz[S_NREG], off[S_NREG], need;
} plan;

/* The fp32 transients of fp16 plans: one buffer for the process, grown to the largest plan's
 * need and freed with the last fp16 plan. The backend runs on one thread at a time. */
static struct {
    void *p;
    size_t cap;
    int users;
} g_scratch;

static int scratch_reserve(size_t need, rk_err *err)
{
    if (need <= g_scratch.cap)
        return RK_OK;
    free(g_scratch.p); /* nothing in it outlives an op */
    g_scratch.cap = 0;
    g_scratch.p = NULL;
    size_t bytes = (need + 63) & ~(size_t)63;
    if (posix_memalign(&g_scratch.p, 64, bytes) != 0) {
        g_scratch.p = NULL;
        return rk_err_set(err, RK_ENOMEM, "conv block: cannot allocate %zu bytes of scratch",
                          bytes);
    }
    memset(g_scratch.p, 0, bytes); /* as mem_owned: blocked layouts pad */
    g_scratch.cap = bytes;
    return RK_OK;
}

static void scratch_release(void)
{
    if (--g_scratch.users > 0)
        return;
    free(g_scratch.p);
    memset(&g_scratch, 0, sizeof g_scratch);
}

/* The regions one after the other, each on a 64-byte boundary; call after each build step. */
static void plan_scratch_layout(plan *pl)
{
    size_t at = 0;
    for (int r = 0; r < S_NREG; r++) {
        pl->off[r] = at;
        at += (pl->sz[r] + 63) & ~(size_t)63;
    }
    pl->need = at;
}

/* A buffer of an fp16 plan: its region of the scratch. */
static void *scr(const plan *pl, int region)
{
    return (char *)g_scratch.p + pl->off[region];
}

/* fp32 <-> fp16 over many values, on the thread pool (both round as rk_f32_to_f16_n does). */
#define RK_CVT_CHUNK ((size_t)1 << 16)
static void to_f16(const float *src, uint16_t *dst, size_t n)
{
    long chunks = (long)((n + RK_CVT_CHUNK - 1) / RK_CVT_CHUNK);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < chunks; i++) {
        size_t o = (size_t)i * RK_CVT_CHUNK, k = n - o < RK_CVT_CHUNK ? n - o : RK_CVT_CHUNK;
        rk_f32_to_f16_n(src + o, dst + o, k);
    }
}

static void from_f16(const uint16_t *src, float *dst, size_t n)
{
    long chunks = (long)((n + RK_CVT_CHUNK - 1) / RK_CVT_CHUNK);
#pragma omp parallel for schedule(static)
    for (long i = 0; i < chunks; i++) {
        size_t o = (size_t)i * RK_CVT_CHUNK, k = n - o < RK_CVT_CHUNK ? n - o : RK_CVT_CHUNK;
        rk_f16_to_f32_n(src + o, dst + o, k);
    }
}

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
    dnnl_memory_t *mems[] = {&pl->m_xc,     &pl->m_wc,      &pl->m_b,      &pl->m_c,
                             &pl->m_bw_src, &pl->m_bw_ddst, &pl->m_bw_dw,  &pl->m_db,
                             &pl->m_bd_w,   &pl->m_bd_ddst, &pl->m_bd_dsrc};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
        mem_free(mems[i]);
    void *bufs[] = {pl->xc,      pl->wc,    pl->c,    pl->pm,      pl->win,    pl->bw_src,
                    pl->bw_ddst, pl->bw_dw, pl->bd_w, pl->bd_ddst, pl->bd_dsrc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    reorder *rs[] = {&pl->r_x,       &pl->r_w,  &pl->r_y,    &pl->r_dy,      &pl->r_bw_src,
                     &pl->r_bw_ddst, &pl->r_dw, &pl->r_bd_w, &pl->r_bd_ddst, &pl->r_dx};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
        reorder_free(rs[i]);
    free(pl->xh);
    if (pl->f16)
        scratch_release();
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
static int mem_owned(dnnl_memory_t *m, void **buf, const dnnl_memory_desc_t *md, rk_err *err)
{
    size_t bytes = dnnl_memory_desc_get_size(md);
    *buf = cpu_alloc(bytes);
    if (!*buf)
        return rk_err_set(err, RK_ENOMEM, "conv block: cannot allocate %zu bytes", bytes);
    memset(*buf, 0, bytes);
    DNNL_TRY(dnnl_memory_create(m, md, g_engine, *buf));
    return RK_OK;
}

/* Prepare a reorder from `from` to `to` layouts; no-op when equal. A reorder from f32 to bf16
 * rounds to nearest even, as rk_f32_to_bf16 does. */
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
static int staged(reorder *r, const void *src, void *buf, const void **out, rk_err *err)
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
                      const dnnl_memory_desc_t *user, reorder *r, dnnl_memory_t *m, void **buf,
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

/* layout_for in an fp16 plan: the buffer is scratch region `region`, grown to fit (its handle
 * is set per call). */
static int layout_for_scratch(plan *pl, dnnl_primitive_desc_t pd, dnnl_query_t what, int dir,
                              const dnnl_memory_desc_t *user, reorder *r, dnnl_memory_t *m,
                              int region, rk_err *err)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, what, 0);
    DNNL_TRY(dnnl_memory_create(m, md, g_engine, DNNL_MEMORY_NONE));
    if (dnnl_memory_desc_equal(md, user))
        return RK_OK;
    size_t bytes = dnnl_memory_desc_get_size(md);
    if (bytes > pl->sz[region])
        pl->sz[region] = bytes;
    plan_scratch_layout(pl);
    return dir == IN ? reorder_init(r, user, md, err) : reorder_init(r, md, user, err);
}

/* The layout_for of either kind of plan. */
static int plan_layout_for(plan *pl, dnnl_primitive_desc_t pd, dnnl_query_t what, int dir,
                           const dnnl_memory_desc_t *user, reorder *r, dnnl_memory_t *m, void **buf,
                           int region, rk_err *err)
{
    return pl->f16 ? layout_for_scratch(pl, pd, what, dir, user, r, m, region, err)
                   : layout_for(pd, what, dir, user, r, m, buf, err);
}

/* Channel block of a conv output layout we can pool in place: 1 (nchw), 8 or 16 (nChw8c,
 * nChw16c), or all oc channels (nhwc: one block of oc, what oneDNN's AMX bf16 kernels
 * choose); 0 for any other layout. */
static int block_of(const dnnl_memory_desc_t *md, const dnnl_dims_t dims, dnnl_format_tag_t *tag)
{
    static const struct {
        dnnl_format_tag_t tag;
        int blk;
    } known[] = {{dnnl_nChw8c, 8}, {dnnl_nChw16c, 16}, {dnnl_nchw, 1}, {dnnl_nhwc, -1}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        dnnl_memory_desc_t k;
        if (dnnl_memory_desc_init_by_tag(&k, 4, dims, md->data_type, known[i].tag) ==
                dnnl_success &&
            dnnl_memory_desc_equal(&k, md)) {
            *tag = known[i].tag;
            return known[i].blk > 0 ? known[i].blk : (int)dims[1];
        }
    }
    return 0;
}

static int impl_is_ref(dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
           impl && strncmp(impl, "ref", 3) == 0;
}

/* The forward convolution with bias and a ReLU post-op. Returns the dnnl status: for bf16,
 * dnnl_unimplemented is an answer (no kernels here), not an error. */
static dnnl_status_t conv_pd_create(plan *pl, const dnnl_memory_desc_t *xa,
                                    const dnnl_memory_desc_t *wa, const dnnl_memory_desc_t *ca,
                                    const rk_convblock_shape *s)
{
    int pad = s->k / 2;
    dnnl_dims_t stride1 = {1, 1}, padl = {pad, pad}, padr = {pad, pad};
    dnnl_convolution_desc_t conv_d;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_status_t st =
        dnnl_convolution_forward_desc_init(&conv_d, dnnl_forward_training, dnnl_convolution_direct,
                                           xa, wa, &pl->b_md, ca, stride1, padl, padr);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_create(&attr);
    if (st == dnnl_success)
        st = dnnl_post_ops_create(&po);
    if (st == dnnl_success)
        st = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
    if (st == dnnl_success)
        st = dnnl_primitive_attr_set_post_ops(attr, po);
    if (st == dnnl_success)
        st = dnnl_primitive_desc_create(&pl->conv_pd, &conv_d, attr, g_engine, NULL);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return st;
}

/* The backward descriptors. The gradient of c goes where c was (the same buffer) and the
 * weights gradient reads the forward's copy of x, so they are first asked for in exactly
 * those layouts: no copies. Only when that gives no kernel, or only a reference one, is
 * oneDNN free to choose (and reorders bridge the layouts). Returns the dnnl status. */
static dnnl_status_t bwd_pds_create(plan *pl)
{
    const rk_convblock_shape *s = &pl->s;
    int pad = s->k / 2;
    dnnl_dims_t xd = {s->n, s->ic, s->h, s->w}, wd = {s->oc, s->ic, s->k, s->k};
    dnnl_dims_t cd = {s->n, s->oc, s->h, s->w};
    dnnl_dims_t stride1 = {1, 1}, padl = {pad, pad}, padr = {pad, pad};
    const dnnl_memory_desc_t *c_md =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_dst_md, 0);
    const dnnl_memory_desc_t *x_fwd =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_src_md, 0);
    dnnl_memory_desc_t xa, wa, dwa, ca;
    dnnl_status_t st;
    if ((st = dnnl_memory_desc_init_by_tag(&xa, 4, xd, pl->dt, dnnl_format_tag_any)) ||
        (st = dnnl_memory_desc_init_by_tag(&wa, 4, wd, pl->dt, dnnl_format_tag_any)) ||
        (st = dnnl_memory_desc_init_by_tag(&dwa, 4, wd, dnnl_f32, dnnl_format_tag_any)) ||
        (st = dnnl_memory_desc_init_by_tag(&ca, 4, cd, pl->dt, dnnl_format_tag_any)))
        return st;
    for (int free_layout = 0; !pl->bw_pd && free_layout < 2; free_layout++) {
        dnnl_convolution_desc_t d;
        st = dnnl_convolution_backward_weights_desc_init(
            &d, dnnl_convolution_direct, free_layout ? &xa : x_fwd, &dwa, &pl->b_md,
            free_layout ? &ca : c_md, stride1, padl, padr);
        if (st == dnnl_success)
            st = dnnl_primitive_desc_create(&pl->bw_pd, &d, NULL, g_engine, pl->conv_pd);
        if (st == dnnl_success && !free_layout && impl_is_ref(pl->bw_pd))
            prim_free(NULL, &pl->bw_pd);
    }
    if (st != dnnl_success)
        return st;
    for (int free_layout = 0; !pl->bd_pd && free_layout < 2; free_layout++) {
        dnnl_convolution_desc_t d;
        st = dnnl_convolution_backward_data_desc_init(
            &d, dnnl_convolution_direct, &xa, &wa, free_layout ? &ca : c_md, stride1, padl, padr);
        if (st == dnnl_success)
            st = dnnl_primitive_desc_create(&pl->bd_pd, &d, NULL, g_engine, pl->conv_pd);
        if (st == dnnl_success && !free_layout && impl_is_ref(pl->bd_pd))
            prim_free(NULL, &pl->bd_pd);
    }
    return st;
}

/* The descriptors of all three convolutions for shape s stored in `dt`, and c's layout. For
 * a 16-bit dt a reference kernel counts as none: it would be tens of times slower than fp32. */
static dnnl_status_t plan_pds_create(plan *pl, const rk_convblock_shape *s, dnnl_data_type_t dt)
{
    dnnl_dims_t xd = {s->n, s->ic, s->h, s->w}, wd = {s->oc, s->ic, s->k, s->k}, bd = {s->oc};
    dnnl_dims_t cd = {s->n, s->oc, s->h, s->w};
    dnnl_memory_desc_t xa, wa, ca;
    dnnl_status_t st;
    pl->s = *s;
    pl->dt = dt;
    pl->esz = dt == dnnl_bf16 ? 2 : 4;
    if ((st = dnnl_memory_desc_init_by_tag(&pl->x_md, 4, xd, dnnl_f32, dnnl_nchw)) ||
        (st = dnnl_memory_desc_init_by_tag(&pl->w_md, 4, wd, dnnl_f32, dnnl_oihw)) ||
        (st = dnnl_memory_desc_init_by_tag(&pl->b_md, 1, bd, dnnl_f32, dnnl_x)) ||
        (st = dnnl_memory_desc_init_by_tag(&xa, 4, xd, dt, dnnl_format_tag_any)) ||
        (st = dnnl_memory_desc_init_by_tag(&wa, 4, wd, dt, dnnl_format_tag_any)) ||
        (st = dnnl_memory_desc_init_by_tag(&ca, 4, cd, dt, dnnl_format_tag_any)) ||
        (st = conv_pd_create(pl, &xa, &wa, &ca, s)))
        return st;
    pl->blk =
        block_of(dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_dst_md, 0), cd, &pl->tag);
    if (!pl->blk) { /* a layout the pooling loop does not know: ask for plain NCHW */
        prim_free(NULL, &pl->conv_pd);
        if ((st = dnnl_memory_desc_init_by_tag(&ca, 4, cd, dt, dnnl_nchw)) ||
            (st = conv_pd_create(pl, &xa, &wa, &ca, s)))
            return st;
        pl->blk = 1;
        pl->tag = dnnl_nchw;
    }
    if (dt != dnnl_f32) {
        if (impl_is_ref(pl->conv_pd))
            return dnnl_unimplemented;
        if ((st = bwd_pds_create(pl)))
            return st;
        if (impl_is_ref(pl->bw_pd) || impl_is_ref(pl->bd_pd))
            return dnnl_unimplemented;
    }
    return dnnl_success;
}

/* RK_NO_HALF_KERNELS=1 turns the 16-bit kernels off, so tests and benchmarks can run the
 * fp32 fallback on a machine that has them. */
static int half_kernels_off(void)
{
    const char *e = getenv("RK_NO_HALF_KERNELS");
    return e && *e && strcmp(e, "0") != 0;
}

/* What a block of shape s stores in (the convblock_storage entry), with the kernel's name or
 * the reason for falling back in `why`. The answer comes from creating the three primitive
 * descriptors, as a plan would: oneDNN answers dnnl_unimplemented where it has no kernel for
 * this CPU. fp16 is always stored in fp16 and computed by the fp32 kernels (oneDNN 2.6 has no
 * fp16 convolution on CPUs; the pooling has no fp16 path either). */
static rk_dtype cpu_convblock_storage(const rk_convblock_shape *s, char *why, size_t why_len)
{
    const char *name = s->dtype == RK_F16 ? "fp16" : "bf16";
    if (s->dtype != RK_F16 && s->dtype != RK_BF16) {
        snprintf(why, why_len, "fp32 kernels");
        return RK_F32;
    }
    if (half_kernels_off()) {
        snprintf(why, why_len, "RK_NO_HALF_KERNELS is set");
        return RK_F32;
    }
    if (s->dtype == RK_F16) {
        snprintf(why, why_len,
                 "fp16 storage, fp32 oneDNN kernels (no fp16 convolution in oneDNN %d.%d)",
                 DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR);
        return RK_F16;
    }
    plan pl;
    memset(&pl, 0, sizeof pl);
    dnnl_status_t st = g_engine ? plan_pds_create(&pl, s, s->dtype == RK_F16 ? dnnl_f16 : dnnl_bf16)
                                : dnnl_runtime_error;
    const char *impl = NULL;
    if (st == dnnl_success)
        dnnl_primitive_desc_query(pl.conv_pd, dnnl_query_impl_info_str, 0, &impl);
    plan_free(&pl);
    if (st == dnnl_success && s->dtype == RK_BF16) {
        snprintf(why, why_len, "oneDNN bf16 kernels, %s", impl ? impl : "?");
        return RK_BF16;
    }
    if (st == dnnl_success)
        snprintf(why, why_len, "oneDNN has %s kernels here, but this backend has no %s path", name,
                 name);
    else if (st == dnnl_unimplemented)
        snprintf(why, why_len, "no %s kernels on this CPU in oneDNN %d.%d: dnnl_unimplemented",
                 name, DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR);
    else
        snprintf(why, why_len, "oneDNN %s probe failed with status %d", name, (int)st);
    return RK_F32;
}

/* Loads and stores of four stored values as fp32 lanes, and the scalar forms: bf16 widens
 * exactly (it is the top half of an fp32). Every value the pooling stores in bf16 is already
 * a bf16 value (a maximum of bf16 values, a copy, or zero), so narrowing keeps the top half:
 * an arithmetic shift puts it in the signed 16-bit range, where the saturating pack is
 * exact. `bf` is a constant at every call site, so the branches fold away. */
static inline float ld1(const void *p, size_t i, int bf)
{
    if (!bf)
        return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void st1(void *p, size_t i, float v, int bf)
{
    if (!bf) {
        ((float *)p)[i] = v;
        return;
    }
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
}

#ifdef __SSE2__
static inline __m128 ld4(const void *p, size_t i, int bf)
{
    if (!bf)
        return _mm_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadl_epi64((const __m128i *)((const uint16_t *)p + i));
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
}

static inline void st4(void *p, size_t i, __m128 v, int bf)
{
    if (!bf) {
        _mm_storeu_ps((float *)p + i, v);
        return;
    }
    __m128i t = _mm_srai_epi32(_mm_castps_si128(v), 16);
    _mm_storel_epi64((__m128i *)((uint16_t *)p + i), _mm_packs_epi32(t, t));
}

/* Four window codes (0..4, as floats) to bytes, and back to 32-bit lanes. */
static inline void win_st4(uint8_t *win, size_t i, __m128 w)
{
    __m128i b = _mm_cvttps_epi32(w);
    b = _mm_packs_epi32(b, b);
    b = _mm_packus_epi16(b, b);
    int32_t four = _mm_cvtsi128_si32(b);
    memcpy(win + i, &four, sizeof four);
}

static inline __m128i win_ld4(const uint8_t *win, size_t i)
{
    int32_t four;
    memcpy(&four, win + i, sizeof four);
    __m128i z = _mm_setzero_si128();
    return _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(four), z), z);
}
#endif

/* 2x2/2 max pooling of c (ReLU already applied; channel blocks of `blk`) into pm (same
 * layout, pooled), remembering each window's winner (0..3) in win, or 4 when the window's
 * maximum is not positive: ReLU's gradient is zero there, so backward needs neither c nor
 * pm. Windows tile c exactly (h, w even). One output row (n, channel block cb, row i) per
 * call; inlined with a constant blk and element type so the lane loop vectorises. */
static inline __attribute__((always_inline)) void pool_fwd_row(const rk_convblock_shape *s, int blk,
                                                               int bf, const void *c, void *pm,
                                                               uint8_t *win, int n, int cb, int i)
{
    const int cb_n = (s->oc + blk - 1) / blk, oh = s->h / 2, ow = s->w / 2;
    const size_t r0 = (((size_t)n * cb_n + cb) * s->h + 2 * i) * s->w * blk;
    const size_t r1 = r0 + (size_t)s->w * blk;
    size_t o = (((size_t)n * cb_n + cb) * oh + i) * ow * blk;
#ifdef __SSE2__
    if (blk % 4 == 0) { /* 4 lanes at a time; same ties as the scalar loop below */
        const __m128 zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f);
        const __m128 two = _mm_set1_ps(2.0f), four = _mm_set1_ps(4.0f);
        for (int j = 0; j < ow; j++)
            for (int k = 0; k < blk; k += 4) {
                __m128 v0 = ld4(c, r0 + (2 * j) * blk + k, bf);
                __m128 v1 = ld4(c, r0 + (2 * j + 1) * blk + k, bf);
                __m128 v2 = ld4(c, r1 + (2 * j) * blk + k, bf);
                __m128 v3 = ld4(c, r1 + (2 * j + 1) * blk + k, bf);
                __m128 m01 = _mm_max_ps(v0, v1), m23 = _mm_max_ps(v2, v3);
                __m128 w01 = _mm_and_ps(_mm_cmpgt_ps(v1, v0), one);
                __m128 w23 = _mm_add_ps(two, _mm_and_ps(_mm_cmpgt_ps(v3, v2), one));
                __m128 hi = _mm_cmpgt_ps(m23, m01);
                __m128 m = _mm_max_ps(m01, m23);
                __m128 w = _mm_or_ps(_mm_and_ps(hi, w23), _mm_andnot_ps(hi, w01));
                __m128 pos = _mm_cmpgt_ps(m, zero);
                st4(pm, o + j * blk + k, m, bf);
                win_st4(win, o + j * blk + k,
                        _mm_or_ps(_mm_and_ps(pos, w), _mm_andnot_ps(pos, four)));
            }
        return;
    }
#endif
    for (int j = 0; j < ow; j++)
        for (int k = 0; k < blk; k++) {
            float v0 = ld1(c, r0 + (2 * j) * blk + k, bf),
                  v1 = ld1(c, r0 + (2 * j + 1) * blk + k, bf);
            float v2 = ld1(c, r1 + (2 * j) * blk + k, bf),
                  v3 = ld1(c, r1 + (2 * j + 1) * blk + k, bf);
            float m01 = v1 > v0 ? v1 : v0, w01 = v1 > v0 ? 1.0f : 0.0f;
            float m23 = v3 > v2 ? v3 : v2, w23 = v3 > v2 ? 3.0f : 2.0f;
            float m = m23 > m01 ? m23 : m01;
            st1(pm, o + j * blk + k, m, bf);
            win[o + j * blk + k] = m > 0.0f ? (uint8_t)(m23 > m01 ? w23 : w01) : 4;
        }
}

/* Gradient of pool(ReLU(conv)) with respect to the conv output, one pooled row: dpm (same
 * layout as pm) goes to each window's winner; zero everywhere else (and in whole windows
 * coded 4), so dc is fully written. */
static inline __attribute__((always_inline)) void pool_bwd_row(const rk_convblock_shape *s, int blk,
                                                               int bf, const uint8_t *win,
                                                               const void *dpm, void *dc, int n,
                                                               int cb, int i)
{
    const int cb_n = (s->oc + blk - 1) / blk, oh = s->h / 2, ow = s->w / 2;
    const size_t r0 = (((size_t)n * cb_n + cb) * s->h + 2 * i) * s->w * blk;
    const size_t r1 = r0 + (size_t)s->w * blk;
    size_t o = (((size_t)n * cb_n + cb) * oh + i) * ow * blk;
#ifdef __SSE2__
    if (blk % 4 == 0) {
        const __m128i zero = _mm_setzero_si128(), one = _mm_set1_epi32(1);
        const __m128i two = _mm_set1_epi32(2), three = _mm_set1_epi32(3);
        for (int j = 0; j < ow; j++)
            for (int k = 0; k < blk; k += 4) {
                size_t q = o + j * blk + k;
                __m128 g = ld4(dpm, q, bf);
                __m128i w = win_ld4(win, q);
                st4(dc, r0 + (2 * j) * blk + k,
                    _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(w, zero)), g), bf);
                st4(dc, r0 + (2 * j + 1) * blk + k,
                    _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(w, one)), g), bf);
                st4(dc, r1 + (2 * j) * blk + k,
                    _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(w, two)), g), bf);
                st4(dc, r1 + (2 * j + 1) * blk + k,
                    _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(w, three)), g), bf);
            }
        return;
    }
#endif
    for (int j = 0; j < ow; j++)
        for (int k = 0; k < blk; k++) {
            float g = ld1(dpm, o + j * blk + k, bf);
            int w = win[o + j * blk + k];
            st1(dc, r0 + (2 * j) * blk + k, w == 0 ? g : 0.0f, bf);
            st1(dc, r0 + (2 * j + 1) * blk + k, w == 1 ? g : 0.0f, bf);
            st1(dc, r1 + (2 * j) * blk + k, w == 2 ? g : 0.0f, bf);
            st1(dc, r1 + (2 * j + 1) * blk + k, w == 3 ? g : 0.0f, bf);
        }
}

/* One pooled row in either direction, with the block and element type as constants for the
 * common layouts (nChw8c, nChw16c, and nhwc with 32 or 64 channels). */
#define POOL_DISPATCH(fn, pl, ...)                                                                 \
    do {                                                                                           \
        int bf_ = (pl)->dt == dnnl_bf16;                                                           \
        switch ((pl)->blk * 2 + bf_) {                                                             \
        case 16: fn(&(pl)->s, 8, 0, __VA_ARGS__); break;                                           \
        case 17: fn(&(pl)->s, 8, 1, __VA_ARGS__); break;                                           \
        case 32: fn(&(pl)->s, 16, 0, __VA_ARGS__); break;                                          \
        case 33: fn(&(pl)->s, 16, 1, __VA_ARGS__); break;                                          \
        case 64: fn(&(pl)->s, 32, 0, __VA_ARGS__); break;                                          \
        case 65: fn(&(pl)->s, 32, 1, __VA_ARGS__); break;                                          \
        case 128: fn(&(pl)->s, 64, 0, __VA_ARGS__); break;                                         \
        case 129: fn(&(pl)->s, 64, 1, __VA_ARGS__); break;                                         \
        default:                                                                                   \
            if (bf_)                                                                               \
                fn(&(pl)->s, (pl)->blk, 1, __VA_ARGS__);                                           \
            else                                                                                   \
                fn(&(pl)->s, (pl)->blk, 0, __VA_ARGS__);                                           \
        }                                                                                          \
    } while (0)

static void pool_forward(const plan *pl, const void *c, void *pm)
{
    const rk_convblock_shape *s = &pl->s;
    const int cb_n = (s->oc + pl->blk - 1) / pl->blk, oh = s->h / 2;
#pragma omp parallel for collapse(3) schedule(static)
    for (int n = 0; n < s->n; n++)
        for (int cb = 0; cb < cb_n; cb++)
            for (int i = 0; i < oh; i++)
                POOL_DISPATCH(pool_fwd_row, pl, c, pm, pl->win, n, cb, i);
}

static void pool_backward(const plan *pl, const void *dpm, void *dc)
{
    const rk_convblock_shape *s = &pl->s;
    const int cb_n = (s->oc + pl->blk - 1) / pl->blk, oh = s->h / 2;
#pragma omp parallel for collapse(3) schedule(static)
    for (int n = 0; n < s->n; n++)
        for (int cb = 0; cb < cb_n; cb++)
            for (int i = 0; i < oh; i++)
                POOL_DISPATCH(pool_bwd_row, pl, pl->win, dpm, dc, n, cb, i);
}

/* A plan for shape s: its descriptors in bf16 when s asks for bf16 and this CPU has the
 * kernels (else fp32, which the caller's rounding turns into the emulation; for fp16 with
 * the input copy stored in fp16 and the transients in the scratch), the forward primitive
 * and its buffers. */
static int plan_build_forward(plan *pl, const rk_convblock_shape *s, rk_err *err)
{
    dnnl_status_t st = dnnl_unimplemented;
    if (s->dtype == RK_BF16 && !half_kernels_off()) {
        st = plan_pds_create(pl, s, dnnl_bf16);
        if (st != dnnl_success)
            plan_free(pl);
    }
    if (st != dnnl_success && (st = plan_pds_create(pl, s, dnnl_f32)) != dnnl_success)
        return rk_err_set(err, RK_EBACKEND, "oneDNN: no convolution for %dx%dx%dx%d k%d (%d)", s->n,
                          s->ic, s->h, s->w, s->k, (int)st);
    if (s->dtype == RK_F16 && !half_kernels_off()) {
        pl->f16 = 1;
        g_scratch.users++; /* released by plan_free */
    }
    int rc;
    DNNL_TRY(dnnl_primitive_create(&pl->conv, pl->conv_pd));
    if ((rc = plan_layout_for(pl, pl->conv_pd, dnnl_query_src_md, IN, &pl->x_md, &pl->r_x,
                              &pl->m_xc, &pl->xc, S_X, err)) ||
        (rc = layout_for(pl->conv_pd, dnnl_query_weights_md, IN, &pl->w_md, &pl->r_w, &pl->m_wc,
                         &pl->wc, err)))
        return rc;
    if (pl->f16 && pl->r_x.prim) { /* the input copy, kept in fp16 */
        pl->xn = pl->sz[S_X] / sizeof(float);
        pl->xh = cpu_alloc(pl->xn * sizeof(uint16_t));
        if (!pl->xh)
            return rk_err_set(err, RK_ENOMEM, "conv block: out of memory for the fp16 input");
    }
    DNNL_TRY(dnnl_memory_create(&pl->m_b, &pl->b_md, g_engine, DNNL_MEMORY_NONE));
    const dnnl_memory_desc_t *c_md =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_dst_md, 0);
    if (pl->f16) {
        DNNL_TRY(dnnl_memory_create(&pl->m_c, c_md, g_engine, DNNL_MEMORY_NONE));
        pl->sz[S_C] = dnnl_memory_desc_get_size(c_md);
    } else if ((rc = mem_owned(&pl->m_c, &pl->c, c_md, err))) {
        return rc;
    }
    dnnl_dims_t yd = {s->n, s->oc, s->h / 2, s->w / 2};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&pl->y_md, 4, yd, dnnl_f32, dnnl_nchw));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&pl->pm_md, 4, yd, pl->dt, pl->tag));
    size_t pooled = dnnl_memory_desc_get_size(&pl->pm_md);
    if (pl->f16) {
        pl->sz[S_PM] = pooled;
        plan_scratch_layout(pl);
    } else {
        pl->pm = cpu_alloc(pooled);
        if (pl->pm)
            memset(pl->pm, 0, pooled);
    }
    pl->win = cpu_alloc(pooled / pl->esz);
    if ((!pl->f16 && !pl->pm) || !pl->win)
        return rk_err_set(err, RK_ENOMEM, "conv block: out of memory for pooling");
    if ((rc = reorder_init(&pl->r_y, &pl->pm_md, &pl->y_md, err)) ||
        (rc = reorder_init(&pl->r_dy, &pl->y_md, &pl->pm_md, err)))
        return rc;
    pl->s = *s;
    pl->valid = 1;
    return RK_OK;
}

/* Weights-gradient primitive and its buffers, built on the first backward of a plan
 * (inference never needs them). */
static int plan_build_bw(plan *pl, rk_err *err)
{
    dnnl_status_t st = bwd_pds_create(pl);
    if (st != dnnl_success)
        return rk_err_set(err, RK_EBACKEND, "oneDNN: no backward convolution for this shape (%d)",
                          (int)st);
    const dnnl_memory_desc_t *c_md =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_dst_md, 0);
    const dnnl_memory_desc_t *x_fwd =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_src_md, 0);
    int rc;
    DNNL_TRY(dnnl_primitive_create(&pl->bw, pl->bw_pd));
    if ((rc = plan_layout_for(pl, pl->bw_pd, dnnl_query_src_md, IN, x_fwd, &pl->r_bw_src,
                              &pl->m_bw_src, &pl->bw_src, S_BWS, err)) ||
        (rc = plan_layout_for(pl, pl->bw_pd, dnnl_query_diff_dst_md, IN, c_md, &pl->r_bw_ddst,
                              &pl->m_bw_ddst, &pl->bw_ddst, S_DD, err)) ||
        (rc = layout_for(pl->bw_pd, dnnl_query_diff_weights_md, OUT, &pl->w_md, &pl->r_dw,
                         &pl->m_bw_dw, &pl->bw_dw, err)))
        return rc;
    DNNL_TRY(dnnl_memory_create(&pl->m_db, &pl->b_md, g_engine, DNNL_MEMORY_NONE));
    pl->has_bw = 1;
    return RK_OK;
}

/* Data-gradient primitive and its buffers, built on the first backward that wants dx (the
 * first layer of a model never does). */
static int plan_build_bd(plan *pl, rk_err *err)
{
    const dnnl_memory_desc_t *c_md =
        dnnl_primitive_desc_query_md(pl->conv_pd, dnnl_query_dst_md, 0);
    int rc;
    DNNL_TRY(dnnl_primitive_create(&pl->bd, pl->bd_pd));
    if ((rc = layout_for(pl->bd_pd, dnnl_query_weights_md, IN, &pl->w_md, &pl->r_bd_w, &pl->m_bd_w,
                         &pl->bd_w, err)) ||
        (rc = plan_layout_for(pl, pl->bd_pd, dnnl_query_diff_dst_md, IN, c_md, &pl->r_bd_ddst,
                              &pl->m_bd_ddst, &pl->bd_ddst, S_DD, err)) ||
        (rc = plan_layout_for(pl, pl->bd_pd, dnnl_query_diff_src_md, OUT, &pl->x_md, &pl->r_dx,
                              &pl->m_bd_dsrc, &pl->bd_dsrc, S_X, err)))
        return rc;
    pl->has_bd = 1;
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
    if (s->dtype != RK_F32 && s->dtype != RK_F16 && s->dtype != RK_BF16)
        return rk_err_set(err, RK_EINVAL, "conv block: unknown storage type %d", (int)s->dtype);
    plan *pl = plan_get(cache, s, 1, err);
    if (!pl)
        return err ? err->code : RK_EBACKEND;
    int rc;
    if (pl->f16 && (rc = scratch_reserve(pl->need, err)))
        return rc;
    void *c = pl->f16 ? scr(pl, S_C) : pl->c, *pm = pl->f16 ? scr(pl, S_PM) : pl->pm;
    const void *xs, *ws;
    if ((rc = staged(&pl->r_x, x, pl->f16 ? scr(pl, S_X) : pl->xc, &xs, err)) ||
        (rc = staged(&pl->r_w, w, pl->wc, &ws, err)))
        return rc;
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_c, c));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_xc, (void *)xs));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_wc, (void *)ws));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_b, (void *)b));
    dnnl_exec_arg_t cargs[4] = {{DNNL_ARG_SRC, pl->m_xc},
                                {DNNL_ARG_WEIGHTS, pl->m_wc},
                                {DNNL_ARG_BIAS, pl->m_b},
                                {DNNL_ARG_DST, pl->m_c}};
    DNNL_TRY(dnnl_primitive_execute(pl->conv, g_stream, 4, cargs));
    pool_forward(pl, c, pm);
    if (pl->r_y.prim) {
        if ((rc = reorder_run(&pl->r_y, pm, y, err)))
            return rc;
    } else {
        memcpy(y, pm, dnnl_memory_desc_get_size(&pl->y_md));
    }
    if (pl->xh) /* keep the input copy in fp16; the fp32 one was a transient */
        to_f16(xs, pl->xh, pl->xn);
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
    if (!pl->has_bw && (rc = plan_build_bw(pl, err)))
        return rc;
    if (dx && !pl->has_bd && (rc = plan_build_bd(pl, err)))
        return rc;
    if (pl->f16 && (rc = scratch_reserve(pl->need, err)))
        return rc;
    void *c = pl->f16 ? scr(pl, S_C) : pl->c, *pm = pl->f16 ? scr(pl, S_PM) : pl->pm;

    /* the pooled gradient goes into pm and dc into c: the forward is done with both */
    const void *dpm;
    if ((rc = staged(&pl->r_dy, dy, pm, &dpm, err)))
        return rc;
    pool_backward(pl, dpm, c);

    /* weights and bias gradient; an fp16 plan widens its input copy into the scratch */
    const void *x_fwd = pl->xc ? pl->xc : (const void *)pl->x_user;
    if (pl->xh) {
        from_f16(pl->xh, scr(pl, S_X), pl->xn);
        x_fwd = scr(pl, S_X);
    }
    const void *src;
    if ((rc = staged(&pl->r_bw_src, x_fwd, pl->f16 ? scr(pl, S_BWS) : pl->bw_src, &src, err)))
        return rc;
    const void *ddst;
    if ((rc = staged(&pl->r_bw_ddst, c, pl->f16 ? scr(pl, S_DD) : pl->bw_ddst, &ddst, err)))
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
    const void *wb;
    if ((rc = staged(&pl->r_bd_w, pl->w_user, pl->bd_w, &wb, err)))
        return rc;
    const void *bdd;
    if ((rc = staged(&pl->r_bd_ddst, c, pl->f16 ? scr(pl, S_DD) : pl->bd_ddst, &bdd, err)))
        return rc;
    void *dsrc = !pl->r_dx.prim ? (void *)dx : pl->f16 ? scr(pl, S_X) : pl->bd_dsrc;
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bd_w, (void *)wb));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bd_ddst, (void *)bdd));
    DNNL_TRY(dnnl_memory_set_data_handle(pl->m_bd_dsrc, dsrc));
    dnnl_exec_arg_t dargs[3] = {{DNNL_ARG_WEIGHTS, pl->m_bd_w},
                                {DNNL_ARG_DIFF_DST, pl->m_bd_ddst},
                                {DNNL_ARG_DIFF_SRC, pl->m_bd_dsrc}};
    DNNL_TRY(dnnl_primitive_execute(pl->bd, g_stream, 3, dargs));
    if (pl->r_dx.prim && (rc = reorder_run(&pl->r_dx, dsrc, dx, err)))
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
    .convblock_storage = cpu_convblock_storage,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .softmax_xent = cpu_softmax_xent,
    .sgd_step = cpu_sgd_step,
    .adamw_step = cpu_adamw_step,
};
