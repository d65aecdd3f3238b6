/*
 * Batch policies: even, throughput and fault-aware splits of a fixed global batch (see
 * rekindle/batch.h for the formulas, the rounding rule and the checkpoint tensors). Shares
 * are computed exactly with 128-bit integers on quantised weights.
 */
#include "rekindle/batch.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"

__extension__ typedef unsigned __int128 u128;

struct rk_batch_policy {
    rk_batch_kind kind;
    int n;
    int64_t b;
    rk_batch_rank_state *rank; /* n entries */
};

#define QUANT_BITS 62 /* weights are quantised to 2^-62 of the largest one */

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

/* ---- state: one rank, and the checkpoint tensors ---- */

/* The invariants of a rank's state; `code` is RK_EINVAL for a caller's value, RK_EFORMAT for
 * one read from a file; `what` starts the message. */
static int check_rank_state(const rk_batch_rank_state *r, int i, int code, const char *what,
                            rk_err *err)
{
    if (r->observations == 0 && (r->throughput != 0.0 || signbit(r->throughput)))
        return rk_err_set(err, code, "%s: rank %d: throughput %g with no observations (must be 0)",
                          what, i, r->throughput);
    if (r->observations > 0 && !(r->throughput > 0.0 && r->throughput <= RK_BATCH_MAX_RATE))
        return rk_err_set(err, code, "%s: rank %d: throughput %g is not in (0, %g]", what, i,
                          r->throughput, RK_BATCH_MAX_RATE);
    if (!(r->fault_rate >= 0.0 && r->fault_rate <= RK_BATCH_MAX_RATE))
        return rk_err_set(err, code, "%s: rank %d: fault rate %g is not in [0, %g]", what, i,
                          r->fault_rate, RK_BATCH_MAX_RATE);
    return RK_OK;
}

int rk_batch_rank_set(rk_batch_policy *p, int rank, const rk_batch_rank_state *st, rk_err *err)
{
    if (!st)
        return rk_err_set(err, RK_EINVAL, "batch policy: NULL argument");
    int rc = check_rank(p, rank, err);
    if (rc < 0)
        return rc;
    if ((rc = check_rank_state(st, rank, RK_EINVAL, "batch policy", err)) < 0)
        return rc;
    p->rank[rank] = *st;
    return RK_OK;
}

int rk_batch_items_fill(const rk_batch_policy *p, rk_batch_items *out, rk_err *err)
{
    if (!p || !out)
        return rk_err_set(err, RK_EINVAL, "batch state: NULL argument");
    memset(out, 0, sizeof *out);
    size_t n = (size_t)p->n;
    out->throughput = malloc(n * sizeof(double));
    out->fault_rate = malloc(n * sizeof(double));
    out->observations = malloc(n * sizeof(int64_t));
    if (!out->throughput || !out->fault_rate || !out->observations) {
        rk_batch_items_free(out);
        return rk_err_set(err, RK_ENOMEM, "batch state: out of memory for %d ranks", p->n);
    }
    for (size_t i = 0; i < n; i++) {
        out->throughput[i] = p->rank[i].throughput;
        out->fault_rate[i] = p->rank[i].fault_rate;
        out->observations[i] = p->rank[i].observations > (uint64_t)INT64_MAX
                                   ? INT64_MAX
                                   : (int64_t)p->rank[i].observations;
    }
    out->kind = p->kind;
    out->global_batch = p->b;
    out->shape[0] = p->n;
    out->item[0] = (rk_ckpt_item){.name = "batch.kind", .dtype = "I64", .data = &out->kind};
    out->item[1] =
        (rk_ckpt_item){.name = "batch.global_batch", .dtype = "I64", .data = &out->global_batch};
    out->item[2] = (rk_ckpt_item){.name = "batch.throughput",
                                  .dtype = "F64",
                                  .ndim = 1,
                                  .shape = out->shape,
                                  .data = out->throughput};
    out->item[3] = (rk_ckpt_item){.name = "batch.observations",
                                  .dtype = "I64",
                                  .ndim = 1,
                                  .shape = out->shape,
                                  .data = out->observations};
    out->item[4] = (rk_ckpt_item){.name = "batch.fault_rate",
                                  .dtype = "F64",
                                  .ndim = 1,
                                  .shape = out->shape,
                                  .data = out->fault_rate};
    return RK_OK;
}

void rk_batch_items_free(rk_batch_items *it)
{
    if (!it)
        return;
    free(it->throughput);
    free(it->fault_rate);
    free(it->observations);
    it->throughput = it->fault_rate = NULL;
    it->observations = NULL;
}

/* rk_st_load, with a missing or mistyped tensor as RK_EFORMAT: the state is incomplete. */
static int load_part(const rk_st_file *f, const char *name, const char *dtype, int ndim,
                     const int64_t *shape, void *dst, rk_err *err)
{
    int rc = rk_st_load(f, name, dtype, ndim, shape, dst, err);
    if (rc == RK_ENOENT || rc == RK_EMISMATCH)
        return err ? (err->code = RK_EFORMAT) : RK_EFORMAT;
    return rc;
}

int rk_batch_load(rk_batch_policy **out, const rk_st_file *f, rk_err *err)
{
    if (!out || !f)
        return rk_err_set(err, RK_EINVAL, "batch state: NULL argument");
    *out = NULL;
    char lb[256], what[300];
    const char *L = rk_msg_show(lb, sizeof lb, f->name ? f->name : "<memory>");
    snprintf(what, sizeof what, "%s: batch state", L);
    const rk_st_tensor *tt = rk_st_find(f, "batch.throughput");
    if (!rk_st_find(f, "batch.kind")) {
        if (rk_st_find(f, "policy"))
            return rk_err_set(err, RK_EFORMAT,
                              "%s: tensor 'policy' holds the batch policy in the binary layout "
                              "of earlier versions, which this version does not read (resume "
                              "from a newer checkpoint, or start afresh)",
                              L);
        return rk_err_set(err, RK_ENOENT, "%s: no batch policy state (no tensor 'batch.kind')", L);
    }
    int64_t kind, b;
    int rc = load_part(f, "batch.kind", "I64", 0, NULL, &kind, err);
    if (!rc)
        rc = load_part(f, "batch.global_batch", "I64", 0, NULL, &b, err);
    if (rc)
        return rc;
    if (!kind_valid((long)kind))
        return rk_err_set(err, RK_EFORMAT, "%s: batch.kind %lld is not 0, 1 or 2", what,
                          (long long)kind);
    if (!tt || tt->ndim != 1)
        return rk_err_set(err, RK_EFORMAT, "%s: batch.throughput is %s", what,
                          tt ? "not 1-D" : "missing");
    int64_t n = tt->shape[0];
    if (n < 1 || n > RK_BATCH_MAX_RANKS)
        return rk_err_set(err, RK_EFORMAT, "%s: %lld ranks is outside 1..%d", what, (long long)n,
                          RK_BATCH_MAX_RANKS);
    if (b < n)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: batch.global_batch %lld is smaller than the %lld ranks", what,
                          (long long)b, (long long)n);
    rk_batch_policy *p = policy_new((rk_batch_kind)kind, (int)n, b);
    double *thr = malloc((size_t)n * sizeof(double)), *fr = malloc((size_t)n * sizeof(double));
    int64_t *obs = malloc((size_t)n * sizeof(int64_t));
    if (!p || !thr || !fr || !obs)
        rc = rk_err_set(err, RK_ENOMEM, "batch state: out of memory for %lld ranks", (long long)n);
    const int64_t shape[1] = {n};
    if (!rc)
        rc = load_part(f, "batch.throughput", "F64", 1, shape, thr, err);
    if (!rc)
        rc = load_part(f, "batch.observations", "I64", 1, shape, obs, err);
    if (!rc)
        rc = load_part(f, "batch.fault_rate", "F64", 1, shape, fr, err);
    for (int64_t i = 0; !rc && i < n; i++) {
        if (obs[i] < 0) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: rank %lld: observations %lld is negative", what,
                            (long long)i, (long long)obs[i]);
            break;
        }
        p->rank[i] = (rk_batch_rank_state){thr[i], (uint64_t)obs[i], fr[i]};
        rc = check_rank_state(&p->rank[i], (int)i, RK_EFORMAT, what, err);
    }
    free(thr);
    free(fr);
    free(obs);
    if (rc) {
        rk_batch_policy_free(p);
        return rc;
    }
    *out = p;
    return RK_OK;
}
