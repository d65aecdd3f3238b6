/*
 * Textfile sensors (rekindle/health.h, docs/textfile.md): node_exporter textfiles (*.prom,
 * Prometheus text format 0.0.4) from sensors NVML cannot read. The whole file is checked the
 * way node_exporter's parser checks it; only rk_sensor_vrm_ripple_volts and
 * rk_sensor_fan_vibration_hertz are merged into the samples, and only when the file parsed
 * (the old input rk_gpu_vrm_ripple_millivolts is refused with its new name).
 * Relies on libc (strtod for decimal values) and the one bounded opener (rekindle/fileio.h).
 * Never prints or exits.
 */
#include "base/msg.h"
#include "rekindle/fileio.h"
#include "rekindle/health.h"
#include "rekindle/monitor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LINE_MAX_BYTES 65536         /* a line, without its newline */
#define LABELS_MAX 64                /* labels of one sample */
#define FILE_MAX_BYTES (1024 * 1024) /* a file merge_dir reads */
#define SHOW_CAP 56                  /* how a message names a metric or label */
#define SHOW_PATH_CAP 224            /* a path shown in a message */
#define UUID_MAX 128                 /* longer label values cannot name a GPU */

/* The metrics that matter: the sample field each one sets (slot 0 VRM ripple, 1 fan
 * vibration) and the factor to the field's unit (vrm_ripple_mv is millivolts). Input names
 * never equal an output name of rk exporter and carry the output's unit (docs/textfile.md):
 * rk_gpu_fan_vibration_hertz, once an input too, is the exporter's output and so is only
 * another metric here. */
static const struct {
    const char *name;
    int slot;
    double scale;
} sensors[] = {
    {"rk_sensor_vrm_ripple_volts", 0, 1e3},
    {"rk_sensor_fan_vibration_hertz", 1, 1},
};
/* The old VRM input, in millivolts: no exporter writes it, so a file that has it was written
 * for an older rekindle, and is refused with the new name rather than silently unread. */
#define OLD_VRM_NAME "rk_gpu_vrm_ripple_millivolts"
#define NSENSORS ((int)(sizeof sensors / sizeof sensors[0]))

/* ---- metric names seen (for the HELP and TYPE rules) ------------------------------------- */

enum { SEEN_HELP = 1, SEEN_TYPE = 2, SEEN_SAMPLE = 4 };

/* Metric types, in the order of `types` below; T_NONE until a TYPE line says. */
enum { T_NONE, T_COUNTER, T_GAUGE, T_HISTOGRAM, T_SUMMARY, T_UNTYPED, T_GAUGE_HISTOGRAM };
static const char *const types[] = {"",        "counter", "gauge",          "histogram",
                                    "summary", "untyped", "gauge_histogram"};

/* A metric family: a name with its HELP, TYPE and samples seen so far. */
typedef struct name_ent {
    const char *p; /* into the file's text; NULL: free slot */
    size_t len;
    unsigned flags; /* SEEN_* */
    int type;       /* T_* */
} name_ent;

typedef struct name_set {
    name_ent *v;
    size_t cap, used;
} name_set;

static uint64_t hash(const char *p, size_t len)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static name_ent *names_slot(name_ent *v, size_t cap, const char *p, size_t len)
{
    size_t i = (size_t)hash(p, len) & (cap - 1);
    while (v[i].p && !(v[i].len == len && memcmp(v[i].p, p, len) == 0))
        i = (i + 1) & (cap - 1);
    return &v[i];
}

static name_ent *names_find(name_set *t, const char *p, size_t len)
{
    if (!t->cap)
        return NULL;
    name_ent *e = names_slot(t->v, t->cap, p, len);
    return e->p ? e : NULL;
}

/* The entry of a name, added if new; NULL when out of memory. */
static name_ent *names_get(name_set *t, const char *p, size_t len)
{
    if (2 * (t->used + 1) > t->cap) {
        size_t nc = t->cap ? 2 * t->cap : 64;
        name_ent *nv = calloc(nc, sizeof *nv);
        if (!nv)
            return NULL;
        for (size_t i = 0; i < t->cap; i++)
            if (t->v[i].p)
                *names_slot(nv, nc, t->v[i].p, t->v[i].len) = t->v[i];
        free(t->v);
        t->v = nv;
        t->cap = nc;
    }
    name_ent *e = names_slot(t->v, t->cap, p, len);
    if (!e->p) {
        *e = (name_ent){p, len, 0, T_NONE};
        t->used++;
    }
    return e;
}

/* ---- the parser ------------------------------------------------------------------------- */

typedef struct pending {
    double v;
    int line; /* where it was given; 0: not given */
} pending;

typedef struct parser {
    char path[SHOW_PATH_CAP]; /* shown in messages */
    int line;
    rk_err *err;
    name_set names;
    const rk_gpu_info *infos;
    int n;
    pending *pend; /* pend[2 * gpu + sensor] */
} parser;

typedef struct span {
    const char *p;
    size_t len;
} span;

/* RK_EFORMAT, "<path>:<line>: <problem>". `fmt`'s arguments never hold the file's bytes:
 * columns, numbers, and names rekindle knows (metric_label, label_label). */
__attribute__((format(printf, 2, 3))) static int bad(parser *P, const char *fmt, ...)
{
    char buf[RK_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return rk_err_set(P->err, RK_EFORMAT, "%s:%d: %s", P->path, P->line, buf);
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t';
}
static int name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
static int name_char(char c)
{
    return name_start(c) || (c >= '0' && c <= '9');
}
static int label_start(char c)
{
    return name_start(c) && c != ':';
}
static int label_char(char c)
{
    return name_char(c) && c != ':';
}

static size_t skip_blank(const char *s, size_t n, size_t i)
{
    while (i < n && is_blank(s[i]))
        i++;
    return i;
}

/* The end of the token at i: the first byte of `stop` (or the line's end). */
static size_t token_end(const char *s, size_t n, size_t i, const char *stop)
{
    while (i < n && (s[i] == '\0' || !strchr(stop, s[i])))
        i++;
    return i;
}

static int span_is(span a, const char *s)
{
    return a.len == strlen(s) && memcmp(a.p, s, a.len) == 0;
}

/* a ends in `suffix`: *base is the rest */
static int span_cut(span a, const char *suffix, span *base)
{
    size_t k = strlen(suffix);
    if (a.len <= k || memcmp(a.p + a.len - k, suffix, k) != 0)
        return 0;
    *base = (span){a.p, a.len - k};
    return 1;
}

static int span_eq(span a, span b)
{
    return a.len == b.len && memcmp(a.p, b.p, a.len) == 0;
}

static int ieq(const char *s, size_t n, const char *lower)
{
    if (n != strlen(lower))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i] >= 'A' && s[i] <= 'Z' ? (char)(s[i] - 'A' + 'a') : s[i];
        if (c != lower[i])
            return 0;
    }
    return 1;
}

/* A value as Go's strconv.ParseFloat reads it, less hex floats and underscores (the format's
 * parser refuses 'p' and '_'): NaN, [+-]Inf, [+-]Infinity (any case), or a decimal with an
 * optional exponent. 1: *out set; 0: not a number; -1: out of range (beyond +-1.8e308);
 * -2: out of memory. */
static int parse_float(const char *s, size_t n, double *out)
{
    size_t i = 0, digits = 0;
    int neg = n > 0 && s[0] == '-';
    if (n > 0 && (s[0] == '+' || s[0] == '-'))
        i = 1;
    if (ieq(s + i, n - i, "inf") || ieq(s + i, n - i, "infinity")) {
        *out = neg ? -INFINITY : INFINITY;
        return 1;
    }
    if (i == 0 && ieq(s, n, "nan")) {
        *out = NAN;
        return 1;
    }
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        digits++;
    if (i < n && s[i] == '.')
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            digits++;
    if (digits == 0)
        return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t e = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            e++;
        if (e == 0)
            return 0;
    }
    if (i != n)
        return 0;
    /* The syntax is checked: strtod (the C locale's '.') only converts. */
    char small[128], *buf = n < sizeof small ? small : malloc(n + 1);
    if (!buf)
        return -2;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    int range = errno == ERANGE && isinf(v); /* underflow to 0 is fine, as in Go */
    if (buf != small)
        free(buf);
    if (range)
        return -1;
    *out = v;
    return 1;
}

/* An int64 in decimal with an optional sign (Go's strconv.ParseInt(s, 10, 64)). */
static int parse_i64(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    size_t i = s[0] == '+' || s[0] == '-' ? 1 : 0;
    uint64_t v = 0, lim = s[0] == '-' ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (i == n)
        return 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (lim - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    return 1;
}

/* A label value with its escapes (\\, \", \n) undone into buf (cap bytes, NUL added; the
 * value itself may hold NUL bytes): its length, or SIZE_MAX if it does not fit. */
static size_t unescape(span raw, char *buf, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; i < raw.len; i++) {
        char c = raw.p[i];
        if (c == '\\') {
            c = raw.p[++i];
            if (c == 'n')
                c = '\n';
        }
        if (j + 1 >= cap)
            return SIZE_MAX;
        buf[j++] = c;
    }
    buf[j] = '\0';
    return j;
}

/* The family a metric name belongs to, as node_exporter's parser files it: the name's own if
 * it has one; foo_sum or foo_count of a summary foo; foo_sum, foo_count or foo_bucket of a
 * histogram foo; else a new family. NULL when out of memory. */
static name_ent *family(parser *P, span name)
{
    name_ent *e = names_find(&P->names, name.p, name.len);
    span base;
    if (e)
        return e;
    if ((span_cut(name, "_sum", &base) || span_cut(name, "_count", &base)) &&
        (e = names_find(&P->names, base.p, base.len)) &&
        (e->type == T_SUMMARY || e->type == T_HISTOGRAM))
        return e;
    if (span_cut(name, "_bucket", &base) && (e = names_find(&P->names, base.p, base.len)) &&
        e->type == T_HISTOGRAM)
        return e;
    return names_get(&P->names, name.p, name.len);
}

/* How messages name things from the file without quoting it: a metric by name only when it is
 * one of the sensors (a name rekindle knows, not the file's bytes), a label by name only
 * when it is one the reader knows (gpu, uuid, le, quantile), else by its column. */
static const char *metric_label(char *dst, size_t cap, span name)
{
    for (int k = 0; k < NSENSORS; k++)
        if (span_is(name, sensors[k].name)) {
            snprintf(dst, cap, "\"%s\"", sensors[k].name);
            return dst;
        }
    snprintf(dst, cap, "this metric");
    return dst;
}

static const char *label_label(char *dst, size_t cap, span name, size_t at)
{
    static const char *const known[] = {"gpu", "uuid", "le", "quantile"};
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        if (span_is(name, known[k])) {
            snprintf(dst, cap, "label %s", known[k]);
            return dst;
        }
    snprintf(dst, cap, "the label at column %zu", at + 1);
    return dst;
}

/* "# HELP name text", "# TYPE name type" or any other comment. */
static int parse_comment(parser *P, const char *s, size_t n, size_t i)
{
    char a[SHOW_CAP];
    i = skip_blank(s, n, i + 1);
    size_t kb = i;
    i = token_end(s, n, i, " \t");
    span kw = {s + kb, i - kb};
    int help = span_is(kw, "HELP");
    if (i == n || (!help && !span_is(kw, "TYPE")))
        return RK_OK; /* a plain comment */
    i = skip_blank(s, n, i);
    if (i == n)
        return RK_OK;
    size_t nb = i;
    if (name_start(s[i]))
        while (i < n && name_char(s[i]))
            i++;
    if (i == nb || (i < n && !is_blank(s[i]))) {
        size_t e = token_end(s, n, nb, " \t");
        (void)e;
        return bad(P, "invalid metric name in a %s line (column %zu)", help ? "HELP" : "TYPE",
                   nb + 1);
    }
    span name = {s + nb, i - nb};
    if (i == n)
        return RK_OK; /* "# HELP name" alone says nothing */
    name_ent *e = family(P, name);
    if (!e)
        return rk_err_set(P->err, RK_ENOMEM, "%s: out of memory", P->path);
    metric_label(a, sizeof a, (span){e->p, e->len});
    i = skip_blank(s, n, i);
    if (i == n)
        return RK_OK;
    if (help) {
        for (; i < n; i++)
            if (s[i] == '\\') {
                if (i + 1 == n || (s[i + 1] != '\\' && s[i + 1] != 'n'))
                    return bad(P,
                               "invalid escape in the HELP text of %s (column %zu; only \\\\ and "
                               "\\n)",
                               a, i + 1);
                i++;
            }
        if (e->flags & SEEN_HELP)
            return bad(P, "second HELP line for %s", a);
        e->flags |= SEEN_HELP;
        return RK_OK;
    }
    int type = T_NONE;
    for (int k = T_COUNTER; k <= T_GAUGE_HISTOGRAM; k++)
        if (ieq(s + i, n - i, types[k]))
            type = k;
    if (type == T_NONE)
        return bad(P,
                   "unknown metric type for %s (column %zu; counter, gauge, histogram, summary "
                   "or untyped)",
                   a, i + 1);
    if (e->flags & SEEN_TYPE)
        return bad(P, "second TYPE line for %s", a);
    if (e->flags & SEEN_SAMPLE)
        return bad(P, "TYPE line for %s after its samples", a);
    e->flags |= SEEN_TYPE;
    e->type = type;
    return RK_OK;
}

/* The label set at s[*pi] == '{' of a sample of a family of type `type`; the values of gpu
 * and uuid, if present, into *gpu and *uuid (escaped, as in the file). */
static int parse_labels(parser *P, int type, const char *s, size_t n, size_t *pi, span *gpu,
                        span *uuid)
{
    char a[SHOW_CAP];
    span labels[LABELS_MAX];
    int nl = 0;
    size_t i = *pi + 1;
    for (;;) {
        i = skip_blank(s, n, i);
        if (i == n)
            return bad(P, "missing '}' at the end of the labels");
        if (s[i] == '}')
            break;
        size_t nb = i;
        if (label_start(s[i]))
            while (i < n && label_char(s[i]))
                i++;
        if (i == nb || (i < n && !is_blank(s[i]) && s[i] != '=')) {
            size_t e = token_end(s, n, nb, " \t=,}");
            if (e == nb)
                return bad(P, "missing label name");
            return bad(P, "invalid label name (column %zu)", nb + 1);
        }
        span name = {s + nb, i - nb};
        label_label(a, sizeof a, name, nb);
        if (nl == LABELS_MAX)
            return bad(P, "more than %d labels", LABELS_MAX);
        if (span_is(name, "__name__"))
            return bad(P, "label name \"__name__\" is reserved");
        for (int k = 0; k < nl; k++)
            if (span_eq(labels[k], name))
                return bad(P, "%s is given twice", a);
        labels[nl++] = name;
        i = skip_blank(s, n, i);
        if (i == n || s[i] != '=')
            return bad(P, "expected '=' after %s", a);
        i = skip_blank(s, n, i + 1);
        if (i == n || s[i] != '"')
            return bad(P, "the value of %s is not in double quotes", a);
        size_t vb = ++i;
        for (;;) {
            if (i == n)
                return bad(P, "unterminated value of %s (no closing '\"')", a);
            unsigned char c = (unsigned char)s[i];
            if (c == '"')
                break;
            if (c == '\\') {
                if (i + 1 == n || (s[i + 1] != '\\' && s[i + 1] != '"' && s[i + 1] != 'n'))
                    return bad(P,
                               "invalid escape in the value of %s (column %zu; only \\\\, "
                               "\\\" and \\n)",
                               a, i + 1);
                i += 2;
            } else if (c >= 0x80) {
                size_t k = rk_utf8_next(s + i, n - i, NULL);
                if (!k)
                    return bad(P, "the value of %s is not valid UTF-8", a);
                i += k;
            } else {
                i++;
            }
        }
        span value = {s + vb, i - vb};
        if ((type == T_SUMMARY && span_is(name, "quantile")) ||
            (type == T_HISTOGRAM && span_is(name, "le"))) {
            double bound; /* an escape in the value makes it no number, as in Go */
            int fr = parse_float(value.p, value.len, &bound);
            if (fr == -2)
                return rk_err_set(P->err, RK_ENOMEM, "%s: out of memory", P->path);
            if (fr != 1)
                return bad(P, "the value of %s is not a number", a);
        }
        if (span_is(name, "gpu"))
            *gpu = value;
        else if (span_is(name, "uuid"))
            *uuid = value;
        i = skip_blank(s, n, i + 1);
        if (i < n && s[i] == ',') {
            i++;
            continue;
        }
        if (i < n && s[i] == '}')
            break;
        if (i == n)
            return bad(P, "missing '}' at the end of the labels");
        return bad(P, "expected ',' or '}' after the value of %s", a);
    }
    *pi = i + 1;
    return RK_OK;
}

/* The GPU a sample of a sensor metric is about: *pos its entry in infos, -1 if not one of
 * this node's GPUs. */
static int select_gpu(parser *P, const char *metric, span gpu, span uuid, int *pos)
{
    char buf[UUID_MAX];
    int pg = -1, pu = -1;
    *pos = -1;
    if (!gpu.p && !uuid.p)
        return bad(P, "%s needs a label gpu=\"<index>\" or uuid=\"<uuid>\"", metric);
    if (gpu.p) {
        size_t len = unescape(gpu, buf, 16);
        int ok = len >= 1 && len <= 9 && (buf[0] != '0' || len == 1);
        for (size_t k = 0; ok && k < len; k++)
            ok = buf[k] >= '0' && buf[k] <= '9';
        if (!ok)
            return bad(P, "label gpu is not a GPU index (0, 1, ...)");
        int idx = atoi(buf);
        for (int k = 0; k < P->n && pg < 0; k++)
            if (P->infos[k].index == idx)
                pg = k;
        if (pg < 0)
            return RK_OK; /* not a GPU of this node */
    }
    if (uuid.p) {
        size_t len = unescape(uuid, buf, sizeof buf);
        for (int k = 0; len != SIZE_MAX && k < P->n && pu < 0; k++) {
            const char *u = P->infos[k].uuid;
            if (strnlen(u, sizeof P->infos[k].uuid) == len && memcmp(u, buf, len) == 0)
                pu = k;
        }
        if (pu < 0)
            return RK_OK;
    }
    if (gpu.p && uuid.p && pg != pu)
        return bad(P, "labels gpu and uuid name different GPUs");
    *pos = gpu.p ? pg : pu;
    return RK_OK;
}

/* name{label="value",...} value [timestamp] */
static int parse_sample(parser *P, const char *s, size_t n, size_t i)
{
    size_t nb = i;
    if (name_start(s[i]))
        while (i < n && name_char(s[i]))
            i++;
    if (i == nb || (i < n && !is_blank(s[i]) && s[i] != '{')) {
        size_t e = token_end(s, n, nb, " \t{");
        if (e == nb)
            return bad(P, "missing metric name before '{'");
        return bad(P, "invalid metric name (column %zu)", nb + 1);
    }
    span name = {s + nb, i - nb};
    span gpu = {NULL, 0}, uuid = {NULL, 0};
    name_ent *e = family(P, name);
    if (!e)
        return rk_err_set(P->err, RK_ENOMEM, "%s: out of memory", P->path);
    int rc;
    i = skip_blank(s, n, i);
    if (i < n && s[i] == '{' && (rc = parse_labels(P, e->type, s, n, &i, &gpu, &uuid)))
        return rc;
    i = skip_blank(s, n, i);
    size_t vb = i;
    i = token_end(s, n, i, " \t");
    span vtok = {s + vb, i - vb};
    double v = 0;
    if (vtok.len == 0)
        return bad(P, "missing value");
    rc = parse_float(vtok.p, vtok.len, &v);
    if (rc == -2)
        return rk_err_set(P->err, RK_ENOMEM, "%s: out of memory", P->path);
    if (rc <= 0)
        return bad(P, "invalid value (column %zu%s)", vb + 1, rc < 0 ? ", out of range" : "");
    /* node_exporter's parser refuses blanks at the end of a sample line */
    size_t end = i;
    if ((i = skip_blank(s, n, i)) == n && i > end)
        return bad(P, "space or tab at the end of the line");
    if (i < n) {
        size_t tb = i;
        i = token_end(s, n, i, " \t");
        if (!parse_i64(s + tb, i - tb))
            return bad(P,
                       "invalid timestamp (column %zu; an integer, milliseconds since the epoch)",
                       tb + 1);
        end = i;
        if ((i = skip_blank(s, n, i)) == n && i > end)
            return bad(P, "space or tab at the end of the line");
        if (i < n)
            return bad(P, "unexpected text after the timestamp (column %zu)", i + 1);
    }
    e->flags |= SEEN_SAMPLE;

    int k = -1;
    for (int q = 0; q < NSENSORS && k < 0; q++)
        if (span_is(name, sensors[q].name))
            k = q;
    if (k < 0 && span_is(name, OLD_VRM_NAME))
        return bad(P,
                   "%s is no longer read: give rk_sensor_vrm_ripple_volts, in volts "
                   "(docs/textfile.md)",
                   OLD_VRM_NAME);
    if (k < 0)
        return RK_OK; /* another metric: checked, not used */
    if (!isfinite(v) || v < 0 || !isfinite(v * sensors[k].scale))
        return bad(P, "%s must be a finite number >= 0 (column %zu)", sensors[k].name, vb + 1);
    int pos;
    if ((rc = select_gpu(P, sensors[k].name, gpu, uuid, &pos)) || pos < 0)
        return rc;
    pending *p = &P->pend[2 * pos + sensors[k].slot];
    if (p->line)
        return bad(P, "%s for GPU %d already given on line %d", sensors[k].name,
                   P->infos[pos].index, p->line);
    p->v = v * sensors[k].scale + 0.0; /* -0 becomes 0 */
    p->line = P->line;
    return RK_OK;
}

int rk_textfile_merge(const char *path, const char *text, size_t len, const rk_gpu_info *infos,
                      rk_gpu_sample *samples, int n, rk_err *err)
{
    parser P = {.err = err, .infos = infos, .n = n};
    rk_msg_show(P.path, sizeof P.path, path ? path : "(textfile)");
    if (n < 0 || (n > 0 && (!infos || !samples)) || (!text && len))
        return rk_err_set(err, RK_EINVAL, "%s: rk_textfile_merge: bad arguments", P.path);
    if (n > 0 && !(P.pend = calloc(2 * (size_t)n, sizeof *P.pend)))
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", P.path);
    int rc = RK_OK;
    size_t off = 0;
    while (!rc && off < len) {
        const char *s = text + off, *nl = memchr(s, '\n', len - off);
        size_t ln = nl ? (size_t)(nl - s) : len - off;
        P.line++;
        if (ln > LINE_MAX_BYTES)
            rc = bad(&P, "line longer than %d bytes", LINE_MAX_BYTES);
        else {
            size_t i = skip_blank(s, ln, 0);
            if (i < ln && !nl) /* blanks alone may end a file without a newline, as in Go */
                rc = bad(&P, "no newline at the end of the file (cut off while being written?)");
            else if (i < ln)
                rc = s[i] == '#' ? parse_comment(&P, s, ln, i) : parse_sample(&P, s, ln, i);
        }
        off += ln + 1;
    }
    for (int g = 0; !rc && g < n; g++)
        for (int k = 0; k < 2; k++)
            /* nothing for a lost GPU, nor for a failed reading (nothing valid): textfile
             * values would turn it into a good, nearly empty one (rk_monitor_read_failed) */
            if (P.pend[2 * g + k].line && !samples[g].lost &&
                !rk_monitor_read_failed(&samples[g])) {
                if (k == 0)
                    samples[g].vrm_ripple_mv = P.pend[2 * g + k].v;
                else
                    samples[g].fan_vib_hz = P.pend[2 * g + k].v;
                rk_field_set(&samples[g], k == 0 ? RK_F_VRM_RIPPLE : RK_F_FAN_VIB);
            }
    free(P.pend);
    free(P.names.v);
    return rc;
}

/* ---- a directory of textfiles ----------------------------------------------------------- */

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int wanted(const char *name)
{
    size_t len = strlen(name);
    return name[0] != '.' && len > 5 && strcmp(name + len - 5, ".prom") == 0;
}

/* Which entry of the directory to read for `name`: the name itself for a regular file; for a
 * symbolic link, its target when that is a plain name in the same directory (one hop, no '/');
 * NULL (and *rc RK_OK) to skip something that is not a textfile (a directory, FIFO, device or a
 * file gone since readdir). A link to anywhere else is not followed: *rc says so. */
static const char *entry_to_read(int dfd, const char *name, const char *label, char *tgt,
                                 size_t cap, int *rc, rk_err *err)
{
    char eb[128];
    struct stat st;
    *rc = RK_OK;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        int e = errno;
        if (e != ENOENT)
            *rc = rk_err_set(err, RK_EIO, "%s: cannot stat: %s", label,
                             rk_msg_strerror(e, eb, sizeof eb));
        return NULL;
    }
    if (S_ISREG(st.st_mode))
        return name;
    if (!S_ISLNK(st.st_mode))
        return NULL;
    ssize_t k = readlinkat(dfd, name, tgt, cap - 1);
    if (k < 0)
        return NULL; /* gone meanwhile */
    tgt[k] = '\0';
    if (k == 0 || (size_t)k == cap - 1 || memchr(tgt, '/', (size_t)k) || !strcmp(tgt, ".") ||
        !strcmp(tgt, "..")) {
        *rc = rk_err_set(err, RK_EINVAL,
                         "%s: is a symbolic link out of the textfile directory; not followed "
                         "(only a link to a file in the same directory is read)",
                         label);
        return NULL;
    }
    if (fstatat(dfd, tgt, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return NULL;           /* dangling: not a textfile */
    if (S_ISLNK(st.st_mode)) { /* the next hop could lead anywhere: said, as a link out is */
        *rc = rk_err_set(err, RK_EINVAL,
                         "%s: is a symbolic link to a symbolic link; not followed (only a link "
                         "to a file in the same directory is read)",
                         label);
        return NULL;
    }
    if (!S_ISREG(st.st_mode))
        return NULL; /* a directory, a FIFO, a device: not a textfile */
    return tgt;
}

/* Read and merge the entry `name` of the directory open as `dfd` (`path` names it in
 * messages). RK_OK also when it is not a textfile to read (see entry_to_read). */
static int merge_file(int dfd, const char *name, const char *path, char *buf,
                      const rk_gpu_info *infos, rk_gpu_sample *samples, int n, rk_err *err)
{
    char sp[SHOW_PATH_CAP], eb[128], tgt[256];
    rk_msg_show(sp, sizeof sp, path);
    int rc;
    const char *what = entry_to_read(dfd, name, sp, tgt, sizeof tgt, &rc, err);
    if (!what)
        return rc;
    int fd;
    uint64_t size;
    /* the one opener: O_NONBLOCK (a FIFO put there meanwhile cannot hang us), O_NOFOLLOW (a
     * link put there meanwhile is refused), a regular file of at most FILE_MAX_BYTES */
    if ((rc = rk_file_openat_read(dfd, what, sp, FILE_MAX_BYTES, &fd, &size, err)) < 0)
        return rc == RK_ENOENT ? RK_OK : rc;
    size_t used = 0;
    while (!rc && used <= FILE_MAX_BYTES) { /* the file may have grown since fstat */
        ssize_t r = read(fd, buf + used, FILE_MAX_BYTES + 1 - used);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            rc = rk_err_set(err, RK_EIO, "%s: cannot read: %s", sp,
                            rk_msg_strerror(e, eb, sizeof eb));
        } else if (r == 0)
            break;
        else
            used += (size_t)r;
    }
    if (!rc && used > FILE_MAX_BYTES)
        rc = rk_err_set(err, RK_EFORMAT, "%s: file is more than the limit of %d bytes", sp,
                        FILE_MAX_BYTES);
    if (!rc)
        rc = rk_textfile_merge(path, buf, used, infos, samples, n, err);
    close(fd);
    return rc;
}

int rk_textfile_merge_dir(const char *dir, const rk_gpu_info *infos, rk_gpu_sample *samples, int n,
                          rk_err *err)
{
    char sd[SHOW_PATH_CAP], eb[128];
    if (!dir || !*dir || n < 0 || (n > 0 && (!infos || !samples)))
        return rk_err_set(err, RK_EINVAL, "rk_textfile_merge_dir: bad arguments");
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return rk_err_set(err, e == ENOENT || e == ENOTDIR ? RK_ENOENT : RK_EIO,
                          "%s: cannot open the textfile directory: %s",
                          rk_msg_show(sd, sizeof sd, dir), rk_msg_strerror(e, eb, sizeof eb));
    }
    char **names = NULL, *buf = NULL;
    size_t cnt = 0, cap = 0;
    int first = RK_OK;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d))) {
        if (!wanted(de->d_name)) {
            errno = 0;
            continue;
        }
        if (cnt == cap) {
            size_t nc = cap ? 2 * cap : 16;
            char **nv = realloc(names, nc * sizeof *nv);
            if (!nv)
                break;
            names = nv;
            cap = nc;
        }
        char *p = strdup(de->d_name);
        if (!p)
            break;
        names[cnt++] = p;
        errno = 0;
    }
    int e = errno;
    if (de) /* the loop stopped early: out of memory */
        first = rk_err_set(err, RK_ENOMEM, "%s: out of memory", rk_msg_show(sd, sizeof sd, dir));
    else if (e)
        first = rk_err_set(err, RK_EIO, "%s: cannot read the textfile directory: %s",
                           rk_msg_show(sd, sizeof sd, dir), rk_msg_strerror(e, eb, sizeof eb));
    if (!first && cnt && !(buf = malloc(FILE_MAX_BYTES + 1)))
        first = rk_err_set(err, RK_ENOMEM, "%s: out of memory", rk_msg_show(sd, sizeof sd, dir));
    if (!first && cnt) {
        qsort(names, cnt, sizeof *names, by_name);
        rk_err fe;
        size_t a = strlen(dir);
        int slash = dir[a - 1] != '/';
        for (size_t i = 0; i < cnt; i++) {
            char path[SHOW_PATH_CAP + 256 + 2];
            snprintf(path, sizeof path, "%.*s%s%s", SHOW_PATH_CAP, dir, slash ? "/" : "", names[i]);
            int rc = merge_file(dirfd(d), names[i], path, buf, infos, samples, n, &fe);
            if (rc && !first) {
                first = rc;
                if (err)
                    *err = fe;
            }
        }
    }
    closedir(d);
    for (size_t i = 0; i < cnt; i++)
        free(names[i]);
    free(names);
    free(buf);
    return first;
}
