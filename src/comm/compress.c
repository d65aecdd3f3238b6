/*
 * Compressed allreduce (rekindle/comm.h, docs/compression.md): 1-bit signs with error
 * feedback in DeepSpeed's two-phase scheme, and half-precision pieces, built on the
 * communicator's alltoall and allgather. The pack/unpack loops work one block of 256 values
 * at a time, in L1, and are compiled for AVX2 and AVX-512 beside the baseline.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "rekindle/half.h"

#ifdef __SSE2__
#include <immintrin.h>
#endif

#define B RK_COMPRESS_BLOCK

/* not under the sanitizers: their instrumented ifunc resolvers run before the runtime starts */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HOT
#endif

struct rk_compressor {
    rk_comm *comm;
    rk_compress kind;
    int p, rank, ef;
    size_t n, cs, nb, piece, state_len; /* cs: chunk values (nb blocks); piece: bytes */
    float *state[2];                    /* residuals: committed, staged */
    int cur;
    uint8_t *send, *recv, *out;
    float *acc;
};

int rk_compress_parse(const char *s, rk_compress *out, rk_err *err)
{
    static const char *const names[] = {"none", "fp16", "bf16", "onebit", "onebit-noef"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (rk_compress)i;
            return RK_OK;
        }
    return rk_err_set(err, RK_EINVAL,
                      "unknown compression '%s' (none, fp16, bf16, onebit or onebit-noef)", s);
}

const char *rk_compress_name(rk_compress kind)
{
    switch (kind) {
    case RK_COMPRESS_NONE: return "none";
    case RK_COMPRESS_FP16: return "fp16";
    case RK_COMPRESS_BF16: return "bf16";
    case RK_COMPRESS_ONEBIT: return "onebit";
    case RK_COMPRESS_ONEBIT_NOEF: return "onebit-noef";
    }
    return "?";
}

static int is_onebit(rk_compress k)
{
    return k == RK_COMPRESS_ONEBIT || k == RK_COMPRESS_ONEBIT_NOEF;
}

int rk_compressor_create(rk_compressor **out, rk_comm *c, rk_compress kind, size_t n, rk_err *err)
{
    *out = NULL;
    if (kind < RK_COMPRESS_NONE || kind > RK_COMPRESS_ONEBIT_NOEF)
        return rk_err_set(err, RK_EINVAL, "compressor: unknown kind %d", (int)kind);
    rk_compressor *z = calloc(1, sizeof *z);
    if (!z)
        return rk_err_set(err, RK_ENOMEM, "compressor: out of memory");
    z->comm = c;
    z->kind = kind;
    z->n = n;
    z->p = rk_comm_size(c);
    z->rank = rk_comm_rank(c);
    if (kind == RK_COMPRESS_NONE) {
        *out = z;
        return RK_OK;
    }
    size_t per = (n + (size_t)z->p - 1) / (size_t)z->p;
    z->nb = (per + B - 1) / B;
    if (z->nb == 0)
        z->nb = 1;
    z->cs = z->nb * B;
    z->piece = z->nb * sizeof(float) + (is_onebit(kind) ? z->cs / 8 : z->cs * 2);
    z->ef = kind == RK_COMPRESS_ONEBIT;
    size_t pieces = (size_t)z->p * z->piece;
    z->send = malloc(pieces);
    z->recv = malloc(pieces);
    z->out = malloc(z->piece);
    z->acc = malloc(z->cs * sizeof(float));
    int ok = z->send && z->recv && z->out && z->acc;
    if (z->ef) {
        z->state_len = (size_t)z->p * z->cs + z->cs;
        z->state[0] = calloc(z->state_len, sizeof(float));
        z->state[1] = calloc(z->state_len, sizeof(float));
        ok = ok && z->state[0] && z->state[1];
    }
    if (!ok) {
        rk_compressor_free(z);
        return rk_err_set(err, RK_ENOMEM, "compressor: out of memory for %zu values", n);
    }
    *out = z;
    return RK_OK;
}

void rk_compressor_free(rk_compressor *z)
{
    if (!z)
        return;
    free(z->send);
    free(z->recv);
    free(z->out);
    free(z->acc);
    free(z->state[0]);
    free(z->state[1]);
    free(z);
}

rk_compress rk_compressor_kind(const rk_compressor *z)
{
    return z->kind;
}
size_t rk_compressor_state_len(const rk_compressor *z)
{
    return z->state_len;
}
float *rk_compressor_state(rk_compressor *z)
{
    return z->state[z->cur];
}

void rk_compressor_commit(rk_compressor *z)
{
    if (z->ef)
        z->cur ^= 1;
}

uint64_t rk_compressor_bytes_per_call(const rk_compressor *z)
{
    if (z->kind == RK_COMPRESS_NONE)
        return (uint64_t)(2.0 * (z->p - 1) / z->p * (double)(z->n * sizeof(float)) + 0.5);
    return 2 * (uint64_t)(z->p - 1) * z->piece;
}

/* ---- one block ---------------------------------------------------------------------- */

/* mean |x| over len values: 32 interleaved partial sums (lane j takes x[i] with i % 32 == j,
 * in order), added lane 0 to 31, divided by len. The order is part of the format (tests
 * rebuild it); 32 lanes let four 8-wide (or two 16-wide) accumulators run side by side. */
#define LANES 32
HOT static float block_mean_abs(const float *x, int len)
{
    float part[LANES] = {0};
    int i = 0;
    for (; i + LANES <= len; i += LANES)
        for (int j = 0; j < LANES; j++)
            part[j] += fabsf(x[i + j]);
    for (; i < len; i++)
        part[i % LANES] += fabsf(x[i]);
    float s = 0.0f;
    for (int j = 0; j < LANES; j++)
        s += part[j];
    return len > 0 ? s / (float)len : 0.0f;
}

/* the sign bits of 8 floats, x[j]'s in bit j */
static inline unsigned signs8(const float *x)
{
#ifdef __SSE2__
    return (unsigned)_mm_movemask_ps(_mm_loadu_ps(x)) |
           (unsigned)_mm_movemask_ps(_mm_loadu_ps(x + 4)) << 4;
#else
    unsigned b = 0;
    for (int j = 0; j < 8; j++) {
        uint32_t u;
        memcpy(&u, x + j, 4);
        b |= (u >> 31) << j;
    }
    return b;
#endif
}

/* x: B values, zero beyond len. Sign bits into bits (bit j of byte k: x[8k + j] has its sign
 * bit set), scale to *scale; the residual x - decompressed into resid when not NULL (0 beyond
 * len). */
HOT static void onebit_pack(const float *x, int len, float *scale, uint8_t *bits, float *resid)
{
    float s = block_mean_abs(x, len);
    *scale = s;
    for (int k = 0; k < B / 8; k++)
        bits[k] = (uint8_t)signs8(x + 8 * k);
    if (resid) {
        for (int i = 0; i < B; i++)
            resid[i] = x[i] - copysignf(s, x[i]);
        for (int i = len; i < B; i++)
            resid[i] = 0.0f;
    }
}

/* y[i] = (y[i] +) +-scale for the B values of a block (bit set: -scale) */
HOT static void onebit_unpack(float scale, const uint8_t *bits, float *y, int add)
{
#ifdef __SSE2__
    const __m128i lo = _mm_set_epi32(8, 4, 2, 1), hi = _mm_set_epi32(128, 64, 32, 16);
    const __m128i sign = _mm_set1_epi32((int)0x80000000u);
    const __m128 s = _mm_set1_ps(scale);
    for (int k = 0; k < B / 8; k++) {
        __m128i b = _mm_set1_epi32(bits[k]);
        __m128i ml = _mm_and_si128(_mm_cmpeq_epi32(_mm_and_si128(b, lo), lo), sign);
        __m128i mh = _mm_and_si128(_mm_cmpeq_epi32(_mm_and_si128(b, hi), hi), sign);
        __m128 vl = _mm_xor_ps(s, _mm_castsi128_ps(ml));
        __m128 vh = _mm_xor_ps(s, _mm_castsi128_ps(mh));
        if (add) {
            vl = _mm_add_ps(_mm_loadu_ps(y + 8 * k), vl);
            vh = _mm_add_ps(_mm_loadu_ps(y + 8 * k + 4), vh);
        }
        _mm_storeu_ps(y + 8 * k, vl);
        _mm_storeu_ps(y + 8 * k + 4, vh);
    }
#else
    for (int i = 0; i < B; i++) {
        float v = (bits[i >> 3] >> (i & 7)) & 1 ? -scale : scale;
        y[i] = add ? y[i] + v : v;
    }
#endif
}

/* half: fp16 values carry a power-of-two scale so that max |x| lands in [2^14, 2^15);
 * *inv gets the factor that undoes it (exact). bf16: no scale. x: B values, 0 beyond len. */
HOT static void half_pack(rk_compress kind, const float *x, int len, float *inv, uint16_t *h)
{
    float tmp[B];
    float k = 1.0f;
    if (kind == RK_COMPRESS_FP16) {
        float m = 0.0f;
        for (int i = 0; i < len; i++) {
            float a = fabsf(x[i]);
            m = a > m ? a : m; /* (fmaxf is a library call here) NaN: skipped, inf: kept */
        }
        if (m > 0.0f && isfinite(m)) {
            int e;
            frexpf(m, &e); /* m = f 2^e, f in [0.5, 1) */
            k = ldexpf(1.0f, 15 - e > 127 ? 127 : 15 - e);
        }
    }
    *inv = 1.0f / k;
    if (k == 1.0f) {
        if (kind == RK_COMPRESS_FP16)
            rk_f32_to_f16_n(x, h, B);
        else
            rk_f32_to_bf16_n(x, h, B);
        return;
    }
    for (int i = 0; i < B; i++)
        tmp[i] = x[i] * k;
    rk_f32_to_f16_n(tmp, h, B);
}

HOT static void half_unpack(rk_compress kind, float inv, const uint16_t *h, float *y, int add)
{
    float tmp[B];
    if (kind == RK_COMPRESS_FP16)
        rk_f16_to_f32_n(h, tmp, B);
    else
        rk_bf16_to_f32_n(h, tmp, B);
    if (add)
        for (int i = 0; i < B; i++)
            y[i] += tmp[i] * inv;
    else
        for (int i = 0; i < B; i++)
            y[i] = tmp[i] * inv;
}

/* ---- pieces ------------------------------------------------------------------------- */

/* values of block b of chunk c that lie inside the caller's n */
static int block_len(const rk_compressor *z, size_t c, size_t b)
{
    size_t start = c * z->cs + b * B;
    if (start >= z->n)
        return 0;
    return z->n - start < B ? (int)(z->n - start) : B;
}

/* block b of a piece: compress x (B values, 0 beyond len) into it */
static void pack_block(const rk_compressor *z, uint8_t *piece, size_t b, const float *x, int len,
                       float *resid)
{
    float *scales = (float *)piece;
    uint8_t *payload = piece + z->nb * sizeof(float);
    if (is_onebit(z->kind))
        onebit_pack(x, len, &scales[b], payload + b * (B / 8), resid);
    else
        half_pack(z->kind, x, len, &scales[b], (uint16_t *)payload + b * B);
}

/* block b of a piece, decompressed into y (B values) */
static void unpack_block(const rk_compressor *z, const uint8_t *piece, size_t b, float *y, int add)
{
    const float *scales = (const float *)piece;
    const uint8_t *payload = piece + z->nb * sizeof(float);
    if (is_onebit(z->kind))
        onebit_unpack(scales[b], payload + b * (B / 8), y, add);
    else
        half_unpack(z->kind, scales[b], (const uint16_t *)payload + b * B, y, add);
}

int rk_compressor_allreduce(rk_compressor *z, float *buf, int mean, rk_err *err)
{
    if (z->kind == RK_COMPRESS_NONE)
        return mean ? rk_comm_allreduce_mean_f32(z->comm, buf, z->n, err)
                    : rk_comm_allreduce_sum_f32(z->comm, buf, z->n, err);
    const float *ew = z->ef ? z->state[z->cur] : NULL;   /* worker residual, committed */
    float *ew_new = z->ef ? z->state[z->cur ^ 1] : NULL; /* staged */
    size_t wlen = (size_t)z->p * z->cs;
    float x[B];
    /* phase 1: every chunk of (input + residual), compressed, one piece per rank */
    for (size_t c = 0; c < (size_t)z->p; c++) {
        for (size_t b = 0; b < z->nb; b++) {
            int len = block_len(z, c, b);
            size_t at = c * z->cs + b * B;
            if (ew)
                for (int i = 0; i < len; i++)
                    x[i] = buf[at + i] + ew[at + i];
            else
                memcpy(x, buf + at, (size_t)len * sizeof(float));
            for (int i = len; i < B; i++)
                x[i] = 0.0f;
            pack_block(z, z->send + c * z->piece, b, x, len, ew_new ? ew_new + at : NULL);
        }
    }
    int rc = rk_comm_alltoall(z->comm, z->send, z->piece, z->recv, err);
    if (rc)
        return rc;
    /* phase 2, block by block of this rank's chunk: the sum of every rank's piece (in rank
     * order), the mean if asked, plus the server residual, compressed again */
    size_t mine = (size_t)z->rank;
    const float *es = z->ef ? ew + wlen : NULL;
    float *es_new = z->ef ? ew_new + wlen : NULL;
    for (size_t b = 0; b < z->nb; b++) {
        int len = block_len(z, mine, b);
        for (int r = 0; r < z->p; r++)
            unpack_block(z, z->recv + (size_t)r * z->piece, b, x, r > 0);
        if (mean)
            for (int i = 0; i < B; i++)
                x[i] /= (float)z->p;
        if (es)
            for (int i = 0; i < B; i++)
                x[i] += es[b * B + i];
        for (int i = len; i < B; i++)
            x[i] = 0.0f;
        pack_block(z, z->out, b, x, len, es_new ? es_new + b * B : NULL);
    }
    if ((rc = rk_comm_allgather(z->comm, z->out, z->piece, z->recv, err)))
        return rc;
    for (size_t c = 0; c < (size_t)z->p; c++) {
        for (size_t b = 0; b < z->nb; b++) {
            int len = block_len(z, c, b);
            if (len == 0)
                break;
            size_t at = c * z->cs + b * B;
            if (len == B) {
                unpack_block(z, z->recv + c * z->piece, b, buf + at, 0);
            } else {
                unpack_block(z, z->recv + c * z->piece, b, x, 0);
                memcpy(buf + at, x, (size_t)len * sizeof(float));
            }
        }
    }
    return RK_OK;
}
