/*
 * The predictor's model (predict/predict.h, predict/model.h): parameters, seeded
 * initialisation, normalisation, the forward pass and backpropagation through time of an LSTM
 * with additive attention and a dense head. The matrix products go to OpenBLAS's cblas; the
 * element-wise parts are plain loops over the time-major work space.
 */
#include "predict/model.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/rng.h"

#define P(m, k) ((m)->p + (m)->t[k].offset)

/* exp, sigmoid and tanh for the element-wise parts, as plain arithmetic the compiler can
 * vectorise (glibc's expf is a call per element; its tanhf, through expm1f, took half of the
 * training time). exp: Cephes's range reduction and polynomial, relative error below 2e-7 on
 * [-87, 88], clamped outside. tanh through exp has an absolute error about 1e-7 and
 * saturates cleanly to +-1. */
static inline float fast_exp(float x)
{
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.0f ? -87.0f : x;
    const float big = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504088896341f + big) - big;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

static inline float sigm(float x)
{
    return 1.0f / (1.0f + fast_exp(-x));
}

static inline float fast_tanh(float x)
{
    return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
}

static int check_config(const rk_pred_config *c, rk_err *err)
{
    if (c->task != RK_PRED_CLASSIFY && c->task != RK_PRED_REGRESS)
        return rk_err_set(err, RK_EINVAL, "predictor: task %d is neither classify nor regress",
                          (int)c->task);
    struct {
        const char *name;
        int v, max;
    } f[] = {{"window", c->window, RK_PRED_MAX_WINDOW},
             {"features", c->features, RK_PRED_MAX_FEATURES},
             {"hidden", c->hidden, RK_PRED_MAX_UNITS},
             {"attn", c->attn, RK_PRED_MAX_UNITS},
             {"dense", c->dense, RK_PRED_MAX_UNITS}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < 1 || f[i].v > f[i].max)
            return rk_err_set(err, RK_EINVAL, "predictor: %s %d is not in [1, %d]", f[i].name,
                              f[i].v, f[i].max);
    if (c->horizon_min < 0 || c->horizon_min > RK_PRED_MAX_HORIZON)
        return rk_err_set(err, RK_EINVAL, "predictor: horizon %d minutes is not in [0, %d]",
                          c->horizon_min, RK_PRED_MAX_HORIZON);
    return RK_OK;
}

static void fill_uniform(rk_rng *r, float *p, size_t n, float k)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (2.0f * rk_rng_uniform(r) - 1.0f) * k;
}

int rk_pred_create(rk_pred_model **out, const rk_pred_config *c, rk_err *err)
{
    *out = NULL;
    int rc = check_config(c, err);
    if (rc)
        return rc;
    const int64_t F = c->features, H = c->hidden, A = c->attn, D = c->dense;
    rk_pred_model *m = calloc(1, sizeof *m);
    if (!m)
        return rk_err_set(err, RK_ENOMEM, "predictor: out of memory");
    m->c = *c;
    const struct {
        const char *name;
        int ndim;
        int64_t d0, d1;
    } spec[RK_PT_COUNT] = {
        [RK_PT_WX] = {"lstm.wx", 2, F, 4 * H}, [RK_PT_WH] = {"lstm.wh", 2, H, 4 * H},
        [RK_PT_B] = {"lstm.b", 1, 4 * H, 0},   [RK_PT_WA] = {"attn.w", 2, H, A},
        [RK_PT_BA] = {"attn.b", 1, A, 0},      [RK_PT_VA] = {"attn.v", 1, A, 0},
        [RK_PT_W1] = {"head.w1", 2, 2 * H, D}, [RK_PT_B1] = {"head.b1", 1, D, 0},
        [RK_PT_W2] = {"head.w2", 1, D, 0},     [RK_PT_B2] = {"head.b2", 1, 1, 0},
    };
    size_t off = 0;
    for (int k = 0; k < RK_PT_COUNT; k++) {
        rk_pred_tensor *t = &m->t[k];
        t->name = spec[k].name;
        t->ndim = spec[k].ndim;
        t->shape[0] = spec[k].d0;
        t->shape[1] = spec[k].d1;
        t->numel = (size_t)spec[k].d0 * (size_t)(spec[k].ndim == 2 ? spec[k].d1 : 1);
        t->offset = off;
        off += t->numel;
    }
    m->np = off;
    m->p = calloc(m->np, sizeof *m->p);
    m->mean = calloc((size_t)F, sizeof *m->mean);
    m->std = malloc((size_t)F * sizeof *m->std);
    if (!m->p || !m->mean || !m->std) {
        rk_pred_free(m);
        return rk_err_set(err, RK_ENOMEM, "predictor: out of memory for %zu parameters", off);
    }
    for (int64_t j = 0; j < F; j++)
        m->std[j] = 1.0f;
    m->y_mean = 0.0f;
    m->y_std = 1.0f;

    rk_rng r;
    rk_rng_seed(&r, c->seed);
    float kl = 1.0f / sqrtf((float)H);
    fill_uniform(&r, P(m, RK_PT_WX), m->t[RK_PT_WX].numel, kl);
    fill_uniform(&r, P(m, RK_PT_WH), m->t[RK_PT_WH].numel, kl);
    float *b = P(m, RK_PT_B);
    for (int64_t j = 0; j < H; j++)
        b[H + j] = 1.0f; /* forget gate: remember by default */
    fill_uniform(&r, P(m, RK_PT_WA), m->t[RK_PT_WA].numel, sqrtf(6.0f / (float)(H + A)));
    fill_uniform(&r, P(m, RK_PT_VA), m->t[RK_PT_VA].numel, sqrtf(6.0f / (float)(A + 1)));
    fill_uniform(&r, P(m, RK_PT_W1), m->t[RK_PT_W1].numel, sqrtf(6.0f / (float)(2 * H + D)));
    fill_uniform(&r, P(m, RK_PT_W2), m->t[RK_PT_W2].numel, sqrtf(6.0f / (float)(D + 1)));
    *out = m;
    return RK_OK;
}

void rk_pred_free(rk_pred_model *m)
{
    if (!m)
        return;
    free(m->p);
    free(m->mean);
    free(m->std);
    free(m);
}

const rk_pred_config *rk_pred_config_of(const rk_pred_model *m)
{
    return &m->c;
}

size_t rk_pred_num_params(const rk_pred_model *m)
{
    return m->np;
}

int rk_pred_fit_norm(rk_pred_model *m, const rk_pred_data *d, rk_err *err)
{
    const size_t T = (size_t)m->c.window, F = (size_t)m->c.features;
    if (!d || d->n == 0 || !d->x || !d->y)
        return rk_err_set(err, RK_EINVAL, "predictor: no training windows to normalise on");
    double *sum = calloc(2 * F, sizeof *sum);
    if (!sum)
        return rk_err_set(err, RK_ENOMEM, "predictor: out of memory");
    double *sq = sum + F;
    const size_t rows = d->n * T;
    /* Two passes (mean, then squared deviations) for accuracy on large offsets. */
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < F; j++) {
            float v = d->x[r * F + j];
            if (!isfinite(v)) {
                free(sum);
                return rk_err_set(err, RK_EINVAL,
                                  "predictor: window %zu, step %zu, feature %zu is not finite",
                                  r / T, r % T, j);
            }
            sum[j] += v;
        }
    for (size_t j = 0; j < F; j++)
        sum[j] /= (double)rows;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < F; j++) {
            double dv = d->x[r * F + j] - sum[j];
            sq[j] += dv * dv;
        }
    for (size_t j = 0; j < F; j++) {
        double sd = sqrt(sq[j] / (double)rows);
        m->mean[j] = (float)sum[j];
        m->std[j] = sd < 1e-6 ? 1.0f : (float)sd;
    }
    free(sum);
    if (m->c.task == RK_PRED_REGRESS) {
        double s = 0, s2 = 0;
        for (size_t k = 0; k < d->n; k++) {
            if (!isfinite(d->y[k]))
                return rk_err_set(err, RK_EINVAL, "predictor: target %zu is not finite", k);
            s += d->y[k];
        }
        s /= (double)d->n;
        for (size_t k = 0; k < d->n; k++)
            s2 += (d->y[k] - s) * (d->y[k] - s);
        double sd = sqrt(s2 / (double)d->n);
        m->y_mean = (float)s;
        m->y_std = sd < 1e-6 ? 1.0f : (float)sd;
    } else {
        m->y_mean = 0.0f;
        m->y_std = 1.0f;
    }
    return RK_OK;
}

/* ---- work space ------------------------------------------------------------------------- */

int rk_pred_ws_init(rk_pred_ws *w, const rk_pred_config *c, int bmax, int backward, rk_err *err)
{
    memset(w, 0, sizeof *w);
    const size_t T = (size_t)c->window, F = (size_t)c->features, H = (size_t)c->hidden,
                 A = (size_t)c->attn, D = (size_t)c->dense, B = (size_t)bmax;
    w->bmax = bmax;
    struct {
        float **p;
        size_t n;
        int bwd;
    } a[] = {
        {&w->xn, T * B * F, 0},
        {&w->gate, T * B * 4 * H, 0},
        {&w->h, (T + 1) * B * H, 0},
        {&w->c, (T + 1) * B * H, 0},
        {&w->tc, T * B * H, 0},
        {&w->s, T * B * A, 0},
        {&w->alpha, T * B, 0},
        {&w->z, B * 2 * H, 0},
        {&w->u, B * D, 0},
        {&w->out, B, 0},
        {&w->dgate, T * B * 4 * H, 1},
        {&w->dh, T * B * H, 1},
        {&w->ds, T * B * A, 1},
        {&w->dz, B * 2 * H, 1},
        {&w->du, B * D, 1},
        {&w->dhr, B * H, 1},
        {&w->dcr, B * H, 1},
        {&w->tmp, T * B, 1},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        if (a[i].bwd && !backward)
            continue;
        *a[i].p = calloc(a[i].n, sizeof(float));
        if (!*a[i].p) {
            rk_pred_ws_free(w);
            return rk_err_set(err, RK_ENOMEM, "predictor: out of memory for a batch of %d", bmax);
        }
    }
    return RK_OK;
}

void rk_pred_ws_free(rk_pred_ws *w)
{
    float *all[] = {w->xn,  w->gate,  w->h,  w->c,  w->tc, w->s,  w->alpha, w->z,   w->u,
                    w->out, w->dgate, w->dh, w->ds, w->dz, w->du, w->dhr,   w->dcr, w->tmp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    memset(w, 0, sizeof *w);
}

void rk_pred_gather(const rk_pred_model *m, rk_pred_ws *w, const float *x, const uint32_t *idx,
                    int b)
{
    const size_t T = (size_t)m->c.window, F = (size_t)m->c.features, B = (size_t)b;
    w->b = b;
    for (size_t k = 0; k < B; k++) {
        const float *src = x + (idx ? idx[k] : k) * T * F;
        for (size_t t = 0; t < T; t++) {
            float *dst = w->xn + (t * B + k) * F;
            for (size_t j = 0; j < F; j++)
                dst[j] = (src[t * F + j] - m->mean[j]) / m->std[j];
        }
    }
}

/* ---- forward ---------------------------------------------------------------------------- */

/* One window's cell update from its activated gates g = [i f g o]: c = f c_prev + i g,
 * tc = tanh(c), h = o tc. */
static void lstm_cell(int H, const float *restrict g, const float *restrict cp, float *restrict cn,
                      float *restrict tc, float *restrict hn)
{
    for (int j = 0; j < H; j++) {
        float cv = g[H + j] * cp[j] + g[j] * g[2 * H + j], tv = fast_tanh(cv);
        cn[j] = cv;
        tc[j] = tv;
        hn[j] = g[3 * H + j] * tv;
    }
}

void rk_pred_forward(const rk_pred_model *m, rk_pred_ws *w)
{
    const int T = m->c.window, F = m->c.features, H = m->c.hidden, A = m->c.attn, D = m->c.dense,
              B = w->b, G = 4 * H;
    const float *Wx = P(m, RK_PT_WX), *Wh = P(m, RK_PT_WH), *bias = P(m, RK_PT_B);
    const float *Wa = P(m, RK_PT_WA), *ba = P(m, RK_PT_BA), *va = P(m, RK_PT_VA);
    const float *W1 = P(m, RK_PT_W1), *b1 = P(m, RK_PT_B1), *w2 = P(m, RK_PT_W2);
    const float b2 = *P(m, RK_PT_B2);

    /* LSTM: the input projection of every step at once, then the recurrence. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T * B, G, F, 1.0f, w->xn, F, Wx, G, 0.0f,
                w->gate, G);
    memset(w->h, 0, (size_t)B * H * sizeof(float));
    memset(w->c, 0, (size_t)B * H * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *gt = w->gate + (size_t)t * B * G;
        const float *hp = w->h + (size_t)t * B * H, *cp = w->c + (size_t)t * B * H;
        float *hn = w->h + (size_t)(t + 1) * B * H, *cn = w->c + (size_t)(t + 1) * B * H;
        float *tc = w->tc + (size_t)t * B * H;
        if (t > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, G, H, 1.0f, hp, H, Wh, G,
                        1.0f, gt, G);
        for (int k = 0; k < B; k++) {
            float *g = gt + (size_t)k * G;
            for (int j = 0; j < 2 * H; j++)
                g[j] = sigm(g[j] + bias[j]);
            for (int j = 2 * H; j < 3 * H; j++)
                g[j] = fast_tanh(g[j] + bias[j]);
            for (int j = 3 * H; j < G; j++)
                g[j] = sigm(g[j] + bias[j]);
            lstm_cell(H, g, cp + (size_t)k * H, cn + (size_t)k * H, tc + (size_t)k * H,
                      hn + (size_t)k * H);
        }
    }

    /* Additive attention over h_1..h_T: scores, softmax over time, context. */
    const float *hs = w->h + (size_t)B * H; /* [T*B, H] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T * B, A, H, 1.0f, hs, H, Wa, A, 0.0f,
                w->s, A);
    for (int r = 0; r < T * B; r++) {
        float *s = w->s + (size_t)r * A, e = 0.0f;
        for (int a = 0; a < A; a++) {
            s[a] = fast_tanh(s[a] + ba[a]);
            e += s[a] * va[a];
        }
        w->alpha[r] = e;
    }
    for (int k = 0; k < B; k++) {
        float mx = -INFINITY, sum = 0.0f;
        for (int t = 0; t < T; t++)
            mx = fmaxf(mx, w->alpha[t * B + k]);
        for (int t = 0; t < T; t++) {
            float e = expf(w->alpha[t * B + k] - mx);
            w->alpha[t * B + k] = e;
            sum += e;
        }
        float *z = w->z + (size_t)k * 2 * H;
        memset(z, 0, (size_t)H * sizeof(float));
        for (int t = 0; t < T; t++) {
            float a = w->alpha[t * B + k] /= sum;
            const float *ht = hs + ((size_t)t * B + k) * H;
            for (int j = 0; j < H; j++)
                z[j] += a * ht[j];
        }
        memcpy(z + H, hs + ((size_t)(T - 1) * B + k) * H, (size_t)H * sizeof(float));
        if (w->mask)
            for (int j = 0; j < 2 * H; j++)
                z[j] *= w->mask[(size_t)k * 2 * H + j];
    }

    /* Head: u = tanh(z W1 + b1), out = u . w2 + b2. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, D, 2 * H, 1.0f, w->z, 2 * H, W1, D,
                0.0f, w->u, D);
    for (int k = 0; k < B; k++) {
        float *u = w->u + (size_t)k * D, o = b2;
        for (int d = 0; d < D; d++) {
            u[d] = fast_tanh(u[d] + b1[d]);
            o += u[d] * w2[d];
        }
        w->out[k] = o;
    }
}

/* ---- loss and backward ------------------------------------------------------------------ */

double rk_pred_unit_loss(const rk_pred_model *m, float out, float y, float pos_weight, double *dout)
{
    if (m->c.task == RK_PRED_REGRESS) {
        double yn = ((double)y - m->y_mean) / m->y_std, d = (double)out - yn;
        *dout = 2.0 * d;
        return d * d;
    }
    double wgt = y > 0.5f ? pos_weight : 1.0, x = out;
    /* BCE with logits: softplus(x) - y x, computed without overflow. */
    double sp = x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
    *dout = wgt * (1.0 / (1.0 + exp(-x)) - y);
    return wgt * (sp - y * x);
}

static void colsum(const float *x, int rows, int cols, float *out)
{
    memset(out, 0, (size_t)cols * sizeof(float));
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++)
            out[j] += x[(size_t)r * cols + j];
}

double rk_pred_backward(const rk_pred_model *m, rk_pred_ws *w, const float *y, float pos_weight,
                        float *grad)
{
    const int T = m->c.window, F = m->c.features, H = m->c.hidden, A = m->c.attn, D = m->c.dense,
              B = w->b, G = 4 * H;
    double loss = 0.0;
    float *dout = w->tmp; /* [B] for now; reused for the attention's scores below */
    for (int k = 0; k < B; k++) {
        double d;
        loss += rk_pred_unit_loss(m, w->out[k], y[k], pos_weight, &d);
        dout[k] = (float)(d / B);
    }
    loss /= B;
    if (!grad)
        return loss;
#define GR(k) (grad + m->t[k].offset)
    const float *Wh = P(m, RK_PT_WH), *Wa = P(m, RK_PT_WA), *va = P(m, RK_PT_VA);
    const float *W1 = P(m, RK_PT_W1), *w2 = P(m, RK_PT_W2);

    /* Head. */
    cblas_sgemv(CblasRowMajor, CblasTrans, B, D, 1.0f, w->u, D, dout, 1, 0.0f, GR(RK_PT_W2), 1);
    float gb2 = 0.0f;
    for (int k = 0; k < B; k++)
        gb2 += dout[k];
    *GR(RK_PT_B2) = gb2;
    for (int k = 0; k < B; k++)
        for (int d = 0; d < D; d++) {
            float u = w->u[(size_t)k * D + d];
            w->du[(size_t)k * D + d] = dout[k] * w2[d] * (1.0f - u * u);
        }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 2 * H, D, B, 1.0f, w->z, 2 * H, w->du, D,
                0.0f, GR(RK_PT_W1), D);
    colsum(w->du, B, D, GR(RK_PT_B1));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, 2 * H, D, 1.0f, w->du, D, W1, D, 0.0f,
                w->dz, 2 * H);
    if (w->mask)
        for (int i = 0; i < B * 2 * H; i++)
            w->dz[i] *= w->mask[i];

    /* Attention: through the context into each h_t, and through the softmax into the scores. */
    const float *hs = w->h + (size_t)B * H;
    float *de = w->tmp;
    for (int k = 0; k < B; k++) {
        const float *dctx = w->dz + (size_t)k * 2 * H;
        float acc = 0.0f;
        for (int t = 0; t < T; t++) {
            size_t r = (size_t)t * B + k;
            const float *ht = hs + r * H;
            float *dht = w->dh + r * H, a = w->alpha[r], da = 0.0f;
            for (int j = 0; j < H; j++) {
                dht[j] = a * dctx[j];
                da += dctx[j] * ht[j];
            }
            de[r] = da;
            acc += a * da;
        }
        for (int t = 0; t < T; t++) {
            size_t r = (size_t)t * B + k;
            de[r] = w->alpha[r] * (de[r] - acc);
        }
        float *dhT = w->dh + ((size_t)(T - 1) * B + k) * H;
        for (int j = 0; j < H; j++)
            dhT[j] += dctx[H + j];
    }
    cblas_sgemv(CblasRowMajor, CblasTrans, T * B, A, 1.0f, w->s, A, de, 1, 0.0f, GR(RK_PT_VA), 1);
    for (int r = 0; r < T * B; r++)
        for (int a = 0; a < A; a++) {
            float s = w->s[(size_t)r * A + a];
            w->ds[(size_t)r * A + a] = de[r] * va[a] * (1.0f - s * s);
        }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, A, T * B, 1.0f, hs, H, w->ds, A, 0.0f,
                GR(RK_PT_WA), A);
    colsum(w->ds, T * B, A, GR(RK_PT_BA));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T * B, H, A, 1.0f, w->ds, A, Wa, A, 1.0f,
                w->dh, H);

    /* LSTM, backward through time. */
    memset(w->dhr, 0, (size_t)B * H * sizeof(float));
    memset(w->dcr, 0, (size_t)B * H * sizeof(float));
    for (int t = T - 1; t >= 0; t--) {
        const float *gt = w->gate + (size_t)t * B * G, *cp = w->c + (size_t)t * B * H;
        const float *tc = w->tc + (size_t)t * B * H, *dht = w->dh + (size_t)t * B * H;
        float *dg = w->dgate + (size_t)t * B * G;
        for (int k = 0; k < B; k++) {
            const float *g = gt + (size_t)k * G;
            float *d = dg + (size_t)k * G;
            for (int j = 0; j < H; j++) {
                size_t q = (size_t)k * H + j;
                float ig = g[j], fg = g[H + j], gg = g[2 * H + j], og = g[3 * H + j];
                float dh = dht[q] + w->dhr[q], tcv = tc[q];
                float dc = w->dcr[q] + dh * og * (1.0f - tcv * tcv);
                d[j] = dc * gg * ig * (1.0f - ig);
                d[H + j] = dc * cp[q] * fg * (1.0f - fg);
                d[2 * H + j] = dc * ig * (1.0f - gg * gg);
                d[3 * H + j] = dh * tcv * og * (1.0f - og);
                w->dcr[q] = dc * fg;
            }
        }
        if (t > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, G, 1.0f, dg, G, Wh, G, 0.0f,
                        w->dhr, H);
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, F, G, T * B, 1.0f, w->xn, F, w->dgate, G,
                0.0f, GR(RK_PT_WX), G);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, G, T * B, 1.0f, w->h, H, w->dgate, G,
                0.0f, GR(RK_PT_WH), G);
    colsum(w->dgate, T * B, G, GR(RK_PT_B));
#undef GR
    return loss;
}

/* ---- inference -------------------------------------------------------------------------- */

enum { PREDICT_CHUNK = 64 };

int rk_pred_predict(const rk_pred_model *m, const float *x, size_t n, float *out, rk_err *err)
{
    if (n == 0)
        return RK_OK;
    rk_pred_ws w;
    int bmax = n < PREDICT_CHUNK ? (int)n : PREDICT_CHUNK;
    int rc = rk_pred_ws_init(&w, &m->c, bmax, 0, err);
    if (rc)
        return rc;
    const size_t win = (size_t)m->c.window * m->c.features;
    for (size_t k0 = 0; k0 < n; k0 += (size_t)bmax) {
        int b = n - k0 < (size_t)bmax ? (int)(n - k0) : bmax;
        rk_pred_gather(m, &w, x + k0 * win, NULL, b);
        rk_pred_forward(m, &w);
        for (int k = 0; k < b; k++)
            out[k0 + k] =
                m->c.task == RK_PRED_REGRESS ? w.out[k] * m->y_std + m->y_mean : sigm(w.out[k]);
    }
    rk_pred_ws_free(&w);
    return RK_OK;
}

int rk_pred_loss(const rk_pred_model *m, const rk_pred_data *d, float pos_weight, double *loss,
                 rk_err *err)
{
    *loss = NAN;
    if (!d || d->n == 0)
        return rk_err_set(err, RK_EINVAL, "predictor: no windows to evaluate");
    rk_pred_ws w;
    int bmax = d->n < 256 ? (int)d->n : 256;
    int rc = rk_pred_ws_init(&w, &m->c, bmax, 0, err);
    if (rc)
        return rc;
    const size_t win = (size_t)m->c.window * m->c.features;
    double sum = 0.0, dd;
    for (size_t k0 = 0; k0 < d->n; k0 += (size_t)bmax) {
        int b = d->n - k0 < (size_t)bmax ? (int)(d->n - k0) : bmax;
        rk_pred_gather(m, &w, d->x + k0 * win, NULL, b);
        rk_pred_forward(m, &w);
        for (int k = 0; k < b; k++) {
            if (m->c.task == RK_PRED_REGRESS) {
                double e = (double)w.out[k] * m->y_std + m->y_mean - d->y[k0 + k];
                sum += e * e;
            } else {
                sum += rk_pred_unit_loss(m, w.out[k], d->y[k0 + k], pos_weight, &dd);
            }
        }
    }
    rk_pred_ws_free(&w);
    *loss = sum / (double)d->n;
    return RK_OK;
}
