/*
 * The fault-injection spec (see rekindle/inject.h): a one-pass parser whose messages carry the
 * byte position, the canonical formatter, and the per-rank runtime that decides when faults
 * fire. Random arrivals come from rekindle/rng.h streams; durations are converted with strtod
 * on a decimal-point-free copy ("1205e-1"), so the result does not depend on the locale.
 */
#include "rekindle/inject.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "rekindle/rng.h"

typedef struct fault_state {
    rk_rng rng;  /* arrival stream of a random fault for the armed rank */
    double next; /* its next arrival, seconds since arm; INFINITY when it does not apply */
    bool fired;  /* a fixed fault returned by rk_inject_due since arm */
    bool listed; /* in the done list given to arm */
    bool done;   /* rk_inject_mark_done */
} fault_state;

struct rk_inject {
    size_t n;
    rk_fault *f;     /* n faults */
    fault_state *st; /* n states */
    int rank;        /* armed rank; -1 before rk_inject_arm */
    uint64_t launch;
};

static const char *const kind_names[] = {"crash",    "hang", "nan",     "bitflip",
                                         "gradflip", "slow", "commfail"};
#define NKINDS (sizeof kind_names / sizeof kind_names[0])
#define KINDS_EXPECTED "crash, hang, nan, bitflip, gradflip, slow, commfail"

enum { KEY_STEP, KEY_RANK, KEY_MTBF, KEY_SEED, KEY_MS, KEY_FOR, NKEYS };
static const char *const key_names[NKEYS] = {"step", "rank", "mtbf", "seed", "ms", "for"};
#define KEYS_EXPECTED "step, rank, mtbf, seed, ms, for"

const char *rk_fault_kind_name(rk_fault_kind k)
{
    return (unsigned)k < NKINDS ? kind_names[k] : "unknown";
}

/* ---- quoting untrusted text ---- */

#define QUOTE_BYTES 40
#define QUOTE_CAP (QUOTE_BYTES * 4 + 4)

/* s[0..len) for a message: printable ASCII as is, '\'' and '\\' escaped, other bytes as \xNN,
 * at most QUOTE_BYTES input bytes, then "...". */
static const char *quote(char out[QUOTE_CAP], const char *s, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len && i < QUOTE_BYTES; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\'' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c >= 0x20 && c < 0x7f) {
            out[o++] = (char)c;
        } else {
            snprintf(out + o, 5, "\\x%02x", c);
            o += 4;
        }
    }
    if (len > QUOTE_BYTES) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

/* ---- numbers ---- */

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Decimal digits s[0..len) into *v; 0 if there is no digit or a non-digit, -1 if the value
 * exceeds UINT64_MAX, 1 if it fits. */
static int digits_value(const char *s, size_t len, uint64_t *v)
{
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!is_digit(s[i]))
            return 0;
    uint64_t x = 0;
    bool over = false;
    for (size_t i = 0; i < len; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            over = true;
        else
            x = x * 10 + d;
    }
    *v = x;
    return over ? -1 : 1;
}

enum { UNIT_S, UNIT_M, UNIT_H, UNIT_MS, NUNITS };
static const char *const unit_suffix[NUNITS] = {"", "m", "h", "ms"};

/* Seconds of x in `unit`; the parser and the formatter both go through here. */
static double dur_seconds(double x, int unit)
{
    switch (unit) {
    case UNIT_M: return x * 60.0;
    case UNIT_H: return x * 3600.0;
    case UNIT_MS: return x / 1000.0;
    default: return x;
    }
}

/* The double nearest the decimal s[0..len), which is digits with an optional '.' and digits
 * (already checked, len <= RK_INJECT_SPEC_MAX). */
static double decimal_value(const char *s, size_t len)
{
    char buf[RK_INJECT_SPEC_MAX + 32];
    size_t o = 0, frac = 0;
    bool after_dot = false;
    for (size_t i = 0; i < len && o < RK_INJECT_SPEC_MAX; i++) {
        if (s[i] == '.') {
            after_dot = true;
            continue;
        }
        buf[o++] = s[i];
        frac += after_dot;
    }
    snprintf(buf + o, sizeof buf - o, "e-%zu", frac);
    return strtod(buf, NULL);
}

/* ---- the parser ---- */

typedef struct parser {
    const char *s; /* the whole spec, for positions */
    rk_err *err;
} parser;

__attribute__((format(printf, 3, 4))) static int fail(const parser *ps, const char *at,
                                                      const char *fmt, ...)
{
    char what[RK_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return rk_err_set(ps->err, RK_EINVAL, "fault spec: position %zu: %s", (size_t)(at - ps->s) + 1,
                      what);
}

/* An INT or UINT64 value of `key` in [min, max]. */
static int parse_int(const parser *ps, const char *at, size_t len, int key, uint64_t min,
                     uint64_t max, uint64_t *out)
{
    char q[QUOTE_CAP];
    uint64_t v = 0;
    int r = digits_value(at, len, &v);
    if (r == 0)
        return fail(ps, at, "bad value '%s' for %s (expected a decimal integer %llu..%llu)",
                    quote(q, at, len), key_names[key], (unsigned long long)min,
                    (unsigned long long)max);
    if (r < 0 || v < min || v > max)
        return fail(ps, at, "%s=%s is out of range (%llu..%llu)", key_names[key], quote(q, at, len),
                    (unsigned long long)min, (unsigned long long)max);
    *out = v;
    return RK_OK;
}

/* A DUR value of mtbf into seconds. */
static int parse_dur(const parser *ps, const char *at, size_t len, double *out)
{
    char q[QUOTE_CAP];
    size_t i = 0;
    while (i < len && is_digit(at[i]))
        i++;
    bool ok = i > 0;
    if (ok && i < len && at[i] == '.') {
        size_t f = ++i;
        while (i < len && is_digit(at[i]))
            i++;
        ok = i > f;
    }
    size_t num = i;
    int unit = -1;
    for (int u = 0; ok && u < NUNITS; u++)
        if (strlen(unit_suffix[u]) == len - num && memcmp(at + num, unit_suffix[u], len - num) == 0)
            unit = u;
    if (ok && unit < 0 && len - num == 1 && at[num] == 's')
        unit = UNIT_S;
    if (!ok || unit < 0)
        return fail(ps, at,
                    "bad value '%s' for mtbf (expected a number with optional unit ms, s, m or h, "
                    "as in mtbf=120s)",
                    quote(q, at, len));
    double v = dur_seconds(decimal_value(at, num), unit);
    if (!(v > 0.0 && v <= RK_INJECT_MAX_MTBF_S))
        return fail(ps, at, "mtbf=%s is out of range (above 0, at most 1e9 seconds)",
                    quote(q, at, len));
    *out = v;
    return RK_OK;
}

/* One fault at *pp; on success *pp is at the ',' or NUL that ends it. */
static int parse_fault(const parser *ps, const char **pp, rk_fault *f)
{
    char q[QUOTE_CAP];
    const char *p = *pp, *start = p;
    size_t klen = strcspn(p, "@,:=");
    if (klen == 0)
        return fail(ps, p, "missing fault kind (expected %s)", KINDS_EXPECTED);
    int kind = -1;
    for (size_t k = 0; k < NKINDS; k++)
        if (strlen(kind_names[k]) == klen && memcmp(p, kind_names[k], klen) == 0)
            kind = (int)k;
    if (kind < 0)
        return fail(ps, p, "unknown fault kind '%s' (expected %s)", quote(q, p, klen),
                    KINDS_EXPECTED);
    p += klen;
    if (*p != '@')
        return fail(ps, p, "expected '@' after '%s' (as in %s@step=100)", kind_names[kind],
                    kind_names[kind]);
    p++;

    bool seen[NKEYS] = {false};
    const char *key_at[NKEYS] = {NULL};
    uint64_t val[NKEYS] = {0};
    double mtbf = 0.0;
    for (;;) {
        const char *kat = p;
        size_t n = strcspn(p, "=:,");
        if (n == 0)
            return fail(ps, p, "missing key (expected %s)", KEYS_EXPECTED);
        int key = -1;
        for (int k = 0; k < NKEYS; k++)
            if (strlen(key_names[k]) == n && memcmp(p, key_names[k], n) == 0)
                key = k;
        if (key < 0)
            return fail(ps, p, "unknown key '%s' (expected %s)", quote(q, p, n), KEYS_EXPECTED);
        p += n;
        if (*p != '=')
            return fail(ps, p, "expected '=' after '%s'", key_names[key]);
        if (seen[key])
            return fail(ps, kat, "duplicate key '%s'", key_names[key]);
        if ((key == KEY_MS || key == KEY_FOR) && kind != RK_FAULT_SLOW)
            return fail(ps, kat, "key '%s' is only allowed for slow, not %s", key_names[key],
                        kind_names[kind]);
        if ((key == KEY_STEP && seen[KEY_MTBF]) || (key == KEY_MTBF && seen[KEY_STEP]))
            return fail(ps, kat,
                        "step= and mtbf= exclude each other (a fault is either at a step "
                        "or random)");
        seen[key] = true;
        key_at[key] = kat;
        p++;
        size_t vlen = strcspn(p, ":,");
        if (vlen == 0)
            return fail(ps, p, "empty value for '%s'", key_names[key]);
        int rc = RK_OK;
        switch (key) {
        case KEY_STEP: rc = parse_int(ps, p, vlen, key, 0, RK_INJECT_MAX_STEP, &val[key]); break;
        case KEY_RANK: rc = parse_int(ps, p, vlen, key, 0, RK_INJECT_MAX_RANK, &val[key]); break;
        case KEY_SEED: rc = parse_int(ps, p, vlen, key, 0, UINT64_MAX, &val[key]); break;
        case KEY_MS: rc = parse_int(ps, p, vlen, key, 1, RK_INJECT_SLOW_MS_MAX, &val[key]); break;
        case KEY_FOR: rc = parse_int(ps, p, vlen, key, 1, RK_INJECT_MAX_STEP, &val[key]); break;
        default: rc = parse_dur(ps, p, vlen, &mtbf); break;
        }
        if (rc < 0)
            return rc;
        p += vlen;
        if (*p != ':')
            break;
        p++;
    }
    if (!seen[KEY_STEP] && !seen[KEY_MTBF])
        return fail(ps, start, "%s fault needs step= or mtbf=", kind_names[kind]);
    if (seen[KEY_SEED] && !seen[KEY_MTBF])
        return fail(ps, key_at[KEY_SEED],
                    "seed= is only allowed with mtbf= (a step= fault is "
                    "not random)");

    bool is_random = seen[KEY_MTBF];
    f->kind = (rk_fault_kind)kind;
    f->step = is_random ? -1 : (int64_t)val[KEY_STEP];
    f->rank = seen[KEY_RANK] ? (int)val[KEY_RANK] : is_random ? -1 : 0;
    f->mtbf_s = is_random ? mtbf : 0.0;
    f->seed = !is_random ? 0 : seen[KEY_SEED] ? val[KEY_SEED] : RK_INJECT_SEED_DEFAULT;
    f->ms = kind != RK_FAULT_SLOW ? 0 : seen[KEY_MS] ? (int)val[KEY_MS] : RK_INJECT_SLOW_MS_DEFAULT;
    f->steps = seen[KEY_FOR] ? (int64_t)val[KEY_FOR] : 0;
    *pp = p;
    return RK_OK;
}

static rk_inject *inject_new(size_t n)
{
    rk_inject *inj = calloc(1, sizeof *inj);
    rk_fault *f = calloc(n ? n : 1, sizeof *f);
    fault_state *st = calloc(n ? n : 1, sizeof *st);
    if (!inj || !f || !st) {
        free(inj);
        free(f);
        free(st);
        return NULL;
    }
    inj->n = n;
    inj->f = f;
    inj->st = st;
    inj->rank = -1;
    return inj;
}

int rk_inject_parse(const char *spec, rk_inject **out, rk_err *err)
{
    if (!out)
        return rk_err_set(err, RK_EINVAL, "fault spec: NULL argument");
    *out = NULL;
    parser ps = {spec, err};
    size_t n = 0;
    rk_fault *tmp = NULL;
    if (spec && *spec) {
        if (strnlen(spec, RK_INJECT_SPEC_MAX + 1) > RK_INJECT_SPEC_MAX)
            return fail(&ps, spec + RK_INJECT_SPEC_MAX, "spec is longer than %d bytes",
                        RK_INJECT_SPEC_MAX);
        tmp = malloc(RK_INJECT_MAX_FAULTS * sizeof *tmp);
        if (!tmp)
            return rk_err_set(err, RK_ENOMEM, "fault spec: out of memory");
        const char *p = spec;
        for (;;) {
            int rc = n < RK_INJECT_MAX_FAULTS
                         ? parse_fault(&ps, &p, &tmp[n])
                         : fail(&ps, p, "more than %d faults", RK_INJECT_MAX_FAULTS);
            if (rc < 0) {
                free(tmp);
                return rc;
            }
            n++;
            if (*p == '\0')
                break;
            p++; /* the ',' */
            while (*p == ' ')
                p++;
        }
    }
    rk_inject *inj = inject_new(n);
    if (!inj) {
        free(tmp);
        return rk_err_set(err, RK_ENOMEM, "fault spec: out of memory for %zu faults", n);
    }
    if (n > 0)
        memcpy(inj->f, tmp, n * sizeof *tmp);
    free(tmp);
    *out = inj;
    return RK_OK;
}

void rk_inject_free(rk_inject *inj)
{
    if (inj) {
        free(inj->f);
        free(inj->st);
        free(inj);
    }
}

size_t rk_inject_count(const rk_inject *inj)
{
    return inj ? inj->n : 0;
}

const rk_fault *rk_inject_get(const rk_inject *inj, size_t i)
{
    return inj && i < inj->n ? &inj->f[i] : NULL;
}

/* ---- the formatter ---- */

#define DUR_TEXT_MAX 400 /* fixed-point text of any double >= 2^-1074 and <= 1e13, plus unit */

/* A decimal d[0].d[1..p) x 10^e with d[0] != '0'. */
typedef struct decimal {
    char d[24];
    int p, e;
} decimal;

/* x (> 0, finite) rounded to p significant digits. */
static void decimal_of(double x, int p, decimal *out)
{
    char t[48];
    snprintf(t, sizeof t, "%.*e", p - 1, x);
    const char *c = t;
    out->p = 0;
    for (; *c && *c != 'e'; c++)
        if (is_digit(*c) && out->p < (int)sizeof out->d)
            out->d[out->p++] = *c;
    out->e = *c == 'e' ? (int)strtol(c + 1, NULL, 10) : 0;
}

/* Move x one unit in its last digit up (dir > 0) or down; false if it left its decade
 * downwards (those are found by a shorter p or not needed). */
static bool decimal_step(decimal *x, int dir)
{
    int i = x->p - 1;
    if (dir > 0) {
        while (i >= 0 && x->d[i] == '9')
            x->d[i--] = '0';
        if (i < 0) {
            x->d[0] = '1';
            x->e++;
        } else {
            x->d[i]++;
        }
        return true;
    }
    while (i >= 0 && x->d[i] == '0')
        x->d[i--] = '9';
    if (i < 0)
        return false;
    x->d[i]--;
    return x->d[0] != '0';
}

/* x as digits with an optional fraction, no exponent, no trailing zeros in the fraction, into
 * out[DUR_TEXT_MAX]; its length, or 0 if the exponent is out of the range we need. */
static size_t decimal_text(const decimal *x, char *out)
{
    int p = x->p;
    while (p > 1 && x->d[p - 1] == '0')
        p--;
    if (x->e < -360 || x->e > 20)
        return 0;
    size_t o = 0;
    if (x->e < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -x->e - 1; i++)
            out[o++] = '0';
        for (int i = 0; i < p; i++)
            out[o++] = x->d[i];
    } else {
        for (int i = 0; i <= x->e; i++)
            out[o++] = i < p ? x->d[i] : '0';
        if (p > x->e + 1) {
            out[o++] = '.';
            for (int i = x->e + 1; i < p; i++)
                out[o++] = x->d[i];
        }
    }
    out[o] = '\0';
    return o;
}

/* The shortest decimal text near x (a number of `unit`) that converts back to exactly v
 * seconds, into out[DUR_TEXT_MAX]: for p = 1, 2, ... significant digits, x rounded to p digits
 * and its two neighbours at p digits. Its length; 0 if x is no candidate. */
static size_t dur_candidate(double v, double x, int unit, char *out)
{
    if (!(x > 0.0) || !isfinite(x) || dur_seconds(x, unit) != v)
        return 0;
    for (int p = 1; p <= 17; p++) {
        decimal base;
        decimal_of(x, p, &base);
        for (int k = 0; k < 3; k++) {
            decimal d = base;
            if (k > 0 && !decimal_step(&d, k == 1 ? 1 : -1))
                continue;
            size_t len = decimal_text(&d, out);
            if (len > 0 && dur_seconds(decimal_value(out, len), unit) == v)
                return len;
        }
    }
    return 0;
}

/* The shortest DUR text for v seconds (v as parsed: > 0, finite) into out[DUR_TEXT_MAX]. */
static void dur_format(double v, char *out)
{
    size_t best = SIZE_MAX;
    out[0] = '\0';
    for (int u = 0; u < NUNITS; u++) {
        double x0 = u == UNIT_M    ? v / 60.0
                    : u == UNIT_H  ? v / 3600.0
                    : u == UNIT_MS ? v * 1000.0
                                   : v;
        double x = x0;
        for (int k = 0; k < 3 && x > 0.0; k++)
            x = nextafter(x, 0.0);
        for (int k = 0; k < 7; k++, x = nextafter(x, INFINITY)) {
            char text[DUR_TEXT_MAX];
            size_t len = dur_candidate(v, x, u, text);
            size_t total = len + strlen(unit_suffix[u]);
            if (len > 0 && total < best && total < DUR_TEXT_MAX) {
                best = total;
                snprintf(out, DUR_TEXT_MAX, "%s%s", text, unit_suffix[u]);
            }
        }
    }
}

/* Append printf text to buf[cap] at *used; false if it does not fit. */
__attribute__((format(printf, 4, 5))) static bool append(char *buf, size_t cap, size_t *used,
                                                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, cap - *used, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *used)
        return false;
    *used += (size_t)n;
    return true;
}

static bool format_fault(const rk_fault *f, char *buf, size_t cap, size_t *used)
{
    bool ok = append(buf, cap, used, "%s@", rk_fault_kind_name(f->kind));
    bool is_random = f->step < 0;
    if (is_random) {
        char dur[DUR_TEXT_MAX];
        dur_format(f->mtbf_s, dur);
        ok = ok && append(buf, cap, used, "mtbf=%s", dur);
        if (f->rank >= 0)
            ok = ok && append(buf, cap, used, ":rank=%d", f->rank);
        if (f->seed != RK_INJECT_SEED_DEFAULT)
            ok = ok && append(buf, cap, used, ":seed=%llu", (unsigned long long)f->seed);
    } else {
        ok = ok && append(buf, cap, used, "step=%lld", (long long)f->step);
        if (f->rank != 0)
            ok = ok && append(buf, cap, used, ":rank=%d", f->rank);
    }
    if (f->kind == RK_FAULT_SLOW && f->ms != RK_INJECT_SLOW_MS_DEFAULT)
        ok = ok && append(buf, cap, used, ":ms=%d", f->ms);
    if (f->steps > 0)
        ok = ok && append(buf, cap, used, ":for=%lld", (long long)f->steps);
    return ok;
}

int rk_inject_format(const rk_inject *inj, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return RK_EINVAL;
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; inj && i < inj->n; i++) {
        if ((i > 0 && !append(buf, cap, &used, ",")) ||
            !format_fault(&inj->f[i], buf, cap, &used)) {
            buf[0] = '\0';
            return RK_EINVAL;
        }
    }
    return RK_OK;
}

/* ---- runtime ---- */

static bool applies(const rk_fault *f, int rank)
{
    return f->rank == rank || (f->step < 0 && f->rank == -1);
}

/* An exponential draw with mean `mean` from 53 random bits: in [0, 37 * mean]. */
static double draw_exponential(rk_rng *r, double mean)
{
    double u = (double)(rk_rng_next(r) >> 11) * 0x1p-53; /* [0, 1) */
    return -mean * log1p(-u);
}

/* The done list into listed[0..n); RK_EINVAL naming the list. */
static int parse_done(const char *done, size_t n, bool *listed, rk_err *err)
{
    char q[QUOTE_CAP], qi[QUOTE_CAP];
    for (size_t i = 0; i < n; i++)
        listed[i] = false;
    if (!done || !*done)
        return RK_OK;
    const char *p = done;
    for (;;) {
        size_t len = strcspn(p, ",");
        uint64_t v = 0;
        if (digits_value(p, len, &v) != 1 || v >= n) {
            const char *what = len == 0 ? "missing fault index" : "bad fault index";
            if (n == 0)
                return rk_err_set(err, RK_EINVAL,
                                  "fault done list '%s': position %zu: %s '%s' (the spec has no "
                                  "faults)",
                                  quote(q, done, strlen(done)), (size_t)(p - done) + 1, what,
                                  quote(qi, p, len));
            return rk_err_set(err, RK_EINVAL,
                              "fault done list '%s': position %zu: %s '%s' (expected 0..%zu)",
                              quote(q, done, strlen(done)), (size_t)(p - done) + 1, what,
                              quote(qi, p, len), n - 1);
        }
        listed[v] = true;
        p += len;
        if (*p == '\0')
            return RK_OK;
        p++;
        while (*p == ' ')
            p++;
    }
}

int rk_inject_arm(rk_inject *inj, int rank, uint64_t launch, const char *done, rk_err *err)
{
    if (!inj)
        return rk_err_set(err, RK_EINVAL, "fault injection: NULL list");
    if (rank < 0 || rank > RK_INJECT_MAX_RANK)
        return rk_err_set(err, RK_EINVAL, "fault injection: rank %d is outside 0..%d", rank,
                          RK_INJECT_MAX_RANK);
    bool listed[RK_INJECT_MAX_FAULTS];
    int rc = parse_done(done, inj->n, listed, err);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < inj->n; i++) {
        const rk_fault *f = &inj->f[i];
        fault_state *st = &inj->st[i];
        st->fired = false;
        st->listed = listed[i];
        st->next = INFINITY;
        if (f->step < 0 && applies(f, rank)) {
            rk_rng_derive(&st->rng, f->seed, ((uint64_t)i << 32) | (uint64_t)rank, launch);
            st->next = draw_exponential(&st->rng, f->mtbf_s);
        }
    }
    inj->rank = rank;
    inj->launch = launch;
    return RK_OK;
}

size_t rk_inject_due(rk_inject *inj, int64_t step, double elapsed_s, size_t *idx, size_t cap)
{
    if (!inj || inj->rank < 0 || !idx)
        return 0;
    size_t k = 0;
    for (size_t i = 0; i < inj->n && k < cap; i++) {
        const rk_fault *f = &inj->f[i];
        fault_state *st = &inj->st[i];
        if (st->listed || st->done || !applies(f, inj->rank))
            continue;
        if (f->step >= 0) {
            if (f->step == step && !st->fired) {
                st->fired = true;
                idx[k++] = i;
            }
        } else if (st->next <= elapsed_s) {
            st->next += draw_exponential(&st->rng, f->mtbf_s);
            idx[k++] = i;
        }
    }
    return k;
}

void rk_inject_mark_done(rk_inject *inj, size_t i)
{
    if (inj && i < inj->n)
        inj->st[i].done = true;
}

double rk_inject_next_arrival(const rk_inject *inj, size_t i)
{
    if (!inj || i >= inj->n || inj->rank < 0 || inj->f[i].step >= 0 || inj->st[i].listed ||
        inj->st[i].done)
        return INFINITY;
    return inj->st[i].next;
}

int rk_inject_from_env(rk_inject **out, int rank, rk_err *err)
{
    char q[QUOTE_CAP];
    if (!out)
        return rk_err_set(err, RK_EINVAL, "fault injection: NULL argument");
    *out = NULL;
    /* a privileged process takes no faults from the environment of whoever started it */
    const char *spec = rk_env_override("RK_INJECT");
    if (!spec)
        return RK_OK;
    const char *ltext = getenv("RK_LAUNCH");
    uint64_t launch = 0;
    if (ltext && digits_value(ltext, strlen(ltext), &launch) != 1)
        return rk_err_set(err, RK_EINVAL, "RK_LAUNCH: '%s' is not a decimal launch number",
                          quote(q, ltext, strlen(ltext)));
    if (rank < 0 || rank > RK_INJECT_MAX_RANK)
        return rk_err_set(err, RK_EINVAL, "fault injection: rank %d is outside 0..%d", rank,
                          RK_INJECT_MAX_RANK);
    rk_err e = {0};
    rk_inject *inj = NULL;
    int rc = rk_inject_parse(spec, &inj, &e);
    if (rc < 0)
        return rk_err_set(err, rc, "RK_INJECT: %s", e.msg);
    rc = rk_inject_arm(inj, rank, launch, rk_env_override("RK_INJECT_DONE"), &e);
    if (rc < 0) {
        rk_inject_free(inj);
        return rk_err_set(err, rc, "RK_INJECT_DONE: %s", e.msg);
    }
    *out = inj;
    return RK_OK;
}
