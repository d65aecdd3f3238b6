/*
 * Batch policies: even, throughput and fault-aware splits of a fixed global batch (see
 * rekindle/batch.h for the formulas, the rounding rule and the state blob). Shares are
 * computed exactly with 128-bit integers on quantised weights; the state blob is checked with
 * XXH64 from libxxhash.
 */
#include "rekindle/batch.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

__extension__ typedef unsigned __int128 u128;

struct rk_batch_policy {
    rk_batch_kind kind;
    int n;
    int64_t b;
    rk_batch_rank_state *rank; /* n entries */
};

#define QUANT_BITS 62 /* weights are quantised to 2^-62 of the largest one */
#define STATE_MAGIC "RKBATCH"
#define STATE_HEADER 32
#define STATE_PER_RANK 24
#define STATE_TRAILER 8

static const char *const kind_names[] = {"even", "throughput", "fault-aware"};

static bool kind_valid(long k)
{
    return k >= RK_BATCH_EVEN && k <= RK_BATCH_FAULT_AWARE;
}

int rk_batch_kind_parse(const char *name, rk_batch_kind *out, rk_err *err)
{
    if (!name || !out)
        return rk_err_set(err, RK_EINVAL, "batch policy: NULL argument");
    for (int k = RK_BATCH_EVEN; k <= RK_BATCH_FAULT_AWARE; k++) {
        if (strcmp(name, kind_names[k]) == 0) {
            *out = (rk_batch_kind)k;
            return RK_OK;
        }
    }
    return rk_err_set(err, RK_EINVAL,
                      "batch policy: unknown policy '%.64s' (expected even, throughput or "
                      "fault-aware)",
                      name);
}

const char *rk_batch_kind_name(rk_batch_kind k)
{
    return kind_valid((long)k) ? kind_names[k] : "unknown";
}

static int check_shape(int nranks, int64_t global_batch, rk_err *err)
{
    if (nranks < 1 || nranks > RK_BATCH_MAX_RANKS)
        return rk_err_set(err, RK_EINVAL, "batch policy: nranks %d is outside 1..%d", nranks,
                          RK_BATCH_MAX_RANKS);
    if (global_batch < nranks)
        return rk_err_set(err, RK_EINVAL,
                          "batch policy: global batch %lld is smaller than nranks %d (every "
                          "rank needs at least one sample)",
                          (long long)global_batch, nranks);
    return RK_OK;
}

static rk_batch_policy *policy_new(rk_batch_kind kind, int nranks, int64_t global_batch)
{
    rk_batch_policy *p = malloc(sizeof *p);
    rk_batch_rank_state *r = calloc((size_t)nranks, sizeof *r);
    if (!p || !r) {
        free(p);
        free(r);
        return NULL;
    }
    p->kind = kind;
    p->n = nranks;
    p->b = global_batch;
    p->rank = r;
    return p;
}

int rk_batch_policy_create(rk_batch_policy **out, rk_batch_kind kind, int nranks,
                           int64_t global_batch, rk_err *err)
{
    if (!out)
        return rk_err_set(err, RK_EINVAL, "batch policy: NULL argument");
    *out = NULL;
    if (!kind_valid((long)kind))
        return rk_err_set(err, RK_EINVAL, "batch policy: unknown kind %d", (int)kind);
    int rc = check_shape(nranks, global_batch, err);
    if (rc < 0)
        return rc;
    *out = policy_new(kind, nranks, global_batch);
    if (!*out)
        return rk_err_set(err, RK_ENOMEM, "batch policy: out of memory for %d ranks", nranks);
    return RK_OK;
}

void rk_batch_policy_free(rk_batch_policy *p)
{
    if (p) {
        free(p->rank);
        free(p);
    }
}

rk_batch_kind rk_batch_policy_kind(const rk_batch_policy *p)
{
    return p->kind;
}
int rk_batch_policy_nranks(const rk_batch_policy *p)
{
    return p->n;
}
int64_t rk_batch_policy_global_batch(const rk_batch_policy *p)
{
    return p->b;
}

static int check_rank(const rk_batch_policy *p, int rank, rk_err *err)
{
    if (!p)
        return rk_err_set(err, RK_EINVAL, "batch policy: NULL policy");
    if (rank < 0 || rank >= p->n)
        return rk_err_set(err, RK_EINVAL, "batch policy: rank %d is outside 0..%d", rank, p->n - 1);
    return RK_OK;
}

int rk_batch_observe_throughput(rk_batch_policy *p, int rank, double samples_per_s, rk_err *err)
{
    int rc = check_rank(p, rank, err);
    if (rc < 0)
        return rc;
    if (!(samples_per_s > 0.0 && samples_per_s <= RK_BATCH_MAX_RATE))
        return rk_err_set(err, RK_EINVAL,
                          "batch policy: rank %d: throughput %g samples/s is not in (0, %g]", rank,
                          samples_per_s, RK_BATCH_MAX_RATE);
    rk_batch_rank_state *r = &p->rank[rank];
    if (r->observations == 0)
        r->throughput = samples_per_s;
    else
        r->throughput += RK_BATCH_SMOOTHING * (samples_per_s - r->throughput);
    if (r->observations < UINT64_MAX)
        r->observations++;
    return RK_OK;
}

int rk_batch_set_fault_rate(rk_batch_policy *p, int rank, double faults_per_hour, rk_err *err)
{
    int rc = check_rank(p, rank, err);
    if (rc < 0)
        return rc;
    if (!(faults_per_hour >= 0.0 && faults_per_hour <= RK_BATCH_MAX_RATE))
        return rk_err_set(err, RK_EINVAL,
                          "batch policy: rank %d: fault rate %g per hour is not in [0, %g]", rank,
                          faults_per_hour, RK_BATCH_MAX_RATE);
    p->rank[rank].fault_rate = faults_per_hour;
    return RK_OK;
}

int rk_batch_rank_get(const rk_batch_policy *p, int rank, rk_batch_rank_state *out, rk_err *err)
{
    int rc = check_rank(p, rank, err);
    if (rc < 0)
        return rc;
    if (!out)
        return rk_err_set(err, RK_EINVAL, "batch policy: NULL argument");
    *out = p->rank[rank];
    return RK_OK;
}

/* ---- shares ---- */

/* The policy's weight per rank, all >= 0 and at least one > 0. */
static void policy_weights(const rk_batch_policy *p, double *w)
{
    int n = p->n;
    for (int i = 0; i < n; i++)
        w[i] = 1.0;
    if (p->kind == RK_BATCH_THROUGHPUT) {
        double sum = 0.0;
        int seen = 0;
        for (int i = 0; i < n; i++) {
            if (p->rank[i].observations > 0) {
                sum += p->rank[i].throughput;
                seen++;
            }
        }
        if (seen == 0)
            return;
        double mean = sum / seen;
        for (int i = 0; i < n; i++)
            w[i] = p->rank[i].observations > 0 ? p->rank[i].throughput : mean;
    } else if (p->kind == RK_BATCH_FAULT_AWARE) {
        double sum = 0.0;
        for (int i = 0; i < n; i++)
            sum += p->rank[i].fault_rate;
        if (sum <= 0.0)
            return; /* f_mean = 0: even */
        for (int i = 0; i < n; i++) {
            double ratio = p->rank[i].fault_rate * n / sum; /* f_i / f_mean */
            double wi = 1.0 + 0.5 * (1.0 - ratio);
            w[i] = wi > 0.0 ? wi : 0.0;
        }
    }
}

typedef struct rank_rem {
    u128 rem;
    int idx;
} rank_rem;

/* Larger remainder first, then lower rank index: a total order, so qsort is deterministic. */
static int remainder_cmp(const void *a, const void *b)
{
    const rank_rem *x = a, *y = b;
    if (x->rem != y->rem)
        return x->rem > y->rem ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Units taken when every share above `level` is cut down to it. */
static int64_t cost_to_level(const int64_t *s, int n, int64_t level)
{
    int64_t c = 0;
    for (int i = 0; i < n; i++)
        if (s[i] > level)
            c += s[i] - level;
    return c;
}

/* Step 3 of the rounding rule: raise the k zero shares to 1, taking k units one at a time
 * from the currently largest share (ties to the lower index). Taking from the maximum k times
 * cuts every share down to a level L and then takes the r units left over from the shares at
 * L, lowest index first: L is the smallest level whose cost is at most k. */
static void raise_zeros(int64_t *s, int n, int64_t k)
{
    int64_t lo = 1, hi = 1;
    for (int i = 0; i < n; i++)
        if (s[i] > hi)
            hi = s[i];
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (cost_to_level(s, n, mid) <= k)
            hi = mid;
        else
            lo = mid + 1;
    }
    int64_t level = lo, r = k - cost_to_level(s, n, level);
    for (int i = 0; i < n; i++) {
        if (s[i] > level)
            s[i] = level;
    }
    for (int i = 0; i < n && r > 0; i++) {
        if (s[i] == level) {
            s[i]--;
            r--;
        }
    }
    for (int i = 0; i < n; i++)
        if (s[i] == 0)
            s[i] = 1;
}

/* Split b over n ranks by the weights w (>= 0, finite, not all 0), per the rounding rule. */
static int split(int64_t b, int n, const double *w, int64_t *s, rk_err *err)
{
    rank_rem *rem = malloc((size_t)n * sizeof *rem);
    uint64_t *q = malloc((size_t)n * sizeof *q);
    if (!rem || !q) {
        free(rem);
        free(q);
        return rk_err_set(err, RK_ENOMEM, "batch policy: out of memory for %d ranks", n);
    }
    double wmax = 0.0;
    for (int i = 0; i < n; i++)
        if (w[i] > wmax)
            wmax = w[i];
    u128 total = 0;
    for (int i = 0; i < n; i++) {
        /* w[i] / wmax is in [0, 1], so q[i] is in [0, 2^62] and the largest is exactly 2^62:
         * the sum is below 2^78 and b * q[i] below 2^125. */
        q[i] = wmax > 0.0 && isfinite(wmax) ? (uint64_t)floor(ldexp(w[i] / wmax, QUANT_BITS) + 0.5)
                                            : (uint64_t)1 << QUANT_BITS;
        total += q[i];
    }
    int64_t given = 0;
    for (int i = 0; i < n; i++) {
        u128 num = (u128)(uint64_t)b * q[i];
        s[i] = (int64_t)(num / total);
        rem[i].rem = num % total;
        rem[i].idx = i;
        given += s[i];
    }
    int64_t missing = b - given; /* 0 <= missing < n: each floor lost less than one unit */
    if (missing > 0) {
        qsort(rem, (size_t)n, sizeof *rem, remainder_cmp);
        for (int64_t j = 0; j < missing; j++)
            s[rem[j].idx]++;
    }
    int64_t zeros = 0;
    for (int i = 0; i < n; i++)
        zeros += s[i] == 0;
    if (zeros > 0)
        raise_zeros(s, n, zeros);
    free(rem);
    free(q);
    return RK_OK;
}

int rk_batch_shares(const rk_batch_policy *p, int64_t *shares, rk_err *err)
{
    if (!p || !shares)
        return rk_err_set(err, RK_EINVAL, "batch policy: NULL argument");
    double *w = malloc((size_t)p->n * sizeof *w);
    if (!w)
        return rk_err_set(err, RK_ENOMEM, "batch policy: out of memory for %d ranks", p->n);
    policy_weights(p, w);
    int rc = split(p->b, p->n, w, shares, err);
    free(w);
    return rc;
}

/* ---- resize ---- */

int rk_batch_policy_resize(rk_batch_policy *p, const int *keep, int nkeep, rk_err *err)
{
    if (!p || !keep)
        return rk_err_set(err, RK_EINVAL, "batch policy: NULL argument");
    int rc = check_shape(nkeep, p->b, err);
    if (rc < 0)
        return rc;
    bool *seen = calloc((size_t)p->n, sizeof *seen);
    rk_batch_rank_state *r = calloc((size_t)nkeep, sizeof *r);
    if (!seen || !r) {
        free(seen);
        free(r);
        return rk_err_set(err, RK_ENOMEM, "batch policy: out of memory for %d ranks", nkeep);
    }
    for (int i = 0; i < nkeep; i++) {
        int old = keep[i];
        if (old == -1)
            continue; /* a new rank: zero state */
        if (old < 0 || old >= p->n) {
            rc = rk_err_set(err, RK_EINVAL,
                            "batch policy: keep[%d] = %d is neither -1 nor an old rank 0..%d", i,
                            old, p->n - 1);
            break;
        }
        if (seen[old]) {
            rc = rk_err_set(err, RK_EINVAL, "batch policy: keep[%d] repeats old rank %d", i, old);
            break;
        }
        seen[old] = true;
        r[i] = p->rank[old];
    }
    free(seen);
    if (rc < 0) {
        free(r);
        return rc;
    }
    free(p->rank);
    p->rank = r;
    p->n = nkeep;
    return RK_OK;
}

/* ---- state blob ---- */

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

static void put_f64(uint8_t *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    put_u64(b, u);
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

static double get_f64(const uint8_t *b)
{
    uint64_t u = get_u64(b);
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static size_t state_len(uint32_t nranks)
{
    return STATE_HEADER + (size_t)nranks * STATE_PER_RANK + STATE_TRAILER;
}

int rk_batch_state_save(const rk_batch_policy *p, uint8_t **blob, size_t *len, rk_err *err)
{
    if (!p || !blob || !len)
        return rk_err_set(err, RK_EINVAL, "batch state: NULL argument");
    *blob = NULL;
    *len = 0;
    size_t n = state_len((uint32_t)p->n);
    uint8_t *b = malloc(n);
    if (!b)
        return rk_err_set(err, RK_ENOMEM, "batch state: out of memory for %zu bytes", n);
    memcpy(b, STATE_MAGIC, 8); /* with its NUL */
    put_u32(b + 8, RK_BATCH_STATE_VERSION);
    put_u32(b + 12, (uint32_t)p->kind);
    put_u32(b + 16, (uint32_t)p->n);
    put_u32(b + 20, 0);
    put_u64(b + 24, (uint64_t)p->b);
    for (int i = 0; i < p->n; i++) {
        uint8_t *e = b + STATE_HEADER + (size_t)i * STATE_PER_RANK;
        put_f64(e, p->rank[i].throughput);
        put_u64(e + 8, p->rank[i].observations);
        put_f64(e + 16, p->rank[i].fault_rate);
    }
    put_u64(b + n - STATE_TRAILER, XXH64(b, n - STATE_TRAILER, 0));
    *blob = b;
    *len = n;
    return RK_OK;
}

static int check_rank_state(const rk_batch_rank_state *r, int i, rk_err *err)
{
    if (r->observations == 0 && (r->throughput != 0.0 || signbit(r->throughput)))
        return rk_err_set(err, RK_EFORMAT,
                          "batch state: rank %d: throughput %g with no observations (must be 0)", i,
                          r->throughput);
    if (r->observations > 0 && !(r->throughput > 0.0 && r->throughput <= RK_BATCH_MAX_RATE))
        return rk_err_set(err, RK_EFORMAT, "batch state: rank %d: throughput %g is not in (0, %g]",
                          i, r->throughput, RK_BATCH_MAX_RATE);
    if (!(r->fault_rate >= 0.0 && r->fault_rate <= RK_BATCH_MAX_RATE))
        return rk_err_set(err, RK_EFORMAT, "batch state: rank %d: fault rate %g is not in [0, %g]",
                          i, r->fault_rate, RK_BATCH_MAX_RATE);
    return RK_OK;
}

int rk_batch_state_load(rk_batch_policy **out, const uint8_t *blob, size_t len, rk_err *err)
{
    if (!out || (!blob && len > 0))
        return rk_err_set(err, RK_EINVAL, "batch state: NULL argument");
    *out = NULL;
    if (len < STATE_HEADER)
        return rk_err_set(err, RK_EFORMAT,
                          "batch state: blob is %zu bytes, shorter than the %d-byte header", len,
                          STATE_HEADER);
    if (memcmp(blob, STATE_MAGIC, 8) != 0)
        return rk_err_set(err, RK_EFORMAT,
                          "batch state: bad magic (not a batch policy state blob)");
    uint32_t version = get_u32(blob + 8), kind = get_u32(blob + 12), n = get_u32(blob + 16);
    uint32_t reserved = get_u32(blob + 20);
    int64_t b = (int64_t)get_u64(blob + 24);
    if (version != RK_BATCH_STATE_VERSION)
        return rk_err_set(err, RK_EFORMAT,
                          "batch state: version %u is not supported (this build reads %u)", version,
                          RK_BATCH_STATE_VERSION);
    if (!kind_valid((long)kind))
        return rk_err_set(err, RK_EFORMAT, "batch state: unknown kind %u", kind);
    if (n < 1 || n > RK_BATCH_MAX_RANKS)
        return rk_err_set(err, RK_EFORMAT, "batch state: nranks %u is outside 1..%d", n,
                          RK_BATCH_MAX_RANKS);
    if (reserved != 0)
        return rk_err_set(err, RK_EFORMAT, "batch state: reserved field is %u, not 0", reserved);
    if (b < (int64_t)n)
        return rk_err_set(err, RK_EFORMAT,
                          "batch state: global batch %lld is smaller than nranks %u", (long long)b,
                          n);
    if (len != state_len(n))
        return rk_err_set(err, RK_EFORMAT,
                          "batch state: blob is %zu bytes, expected %zu for %u ranks", len,
                          state_len(n), n);
    uint64_t stored = get_u64(blob + len - STATE_TRAILER);
    uint64_t computed = XXH64(blob, len - STATE_TRAILER, 0);
    if (stored != computed)
        return rk_err_set(err, RK_EFORMAT,
                          "batch state: checksum mismatch (stored %016llx, computed %016llx): "
                          "the blob is corrupt",
                          (unsigned long long)stored, (unsigned long long)computed);
    rk_batch_policy *p = policy_new((rk_batch_kind)kind, (int)n, b);
    if (!p)
        return rk_err_set(err, RK_ENOMEM, "batch state: out of memory for %u ranks", n);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = blob + STATE_HEADER + (size_t)i * STATE_PER_RANK;
        rk_batch_rank_state *r = &p->rank[i];
        r->throughput = get_f64(e);
        r->observations = get_u64(e + 8);
        r->fault_rate = get_f64(e + 16);
        int rc = check_rank_state(r, (int)i, err);
        if (rc < 0) {
            rk_batch_policy_free(p);
            return rc;
        }
    }
    *out = p;
    return RK_OK;
}
