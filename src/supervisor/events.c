/*
 * The events file's line (events.h): one table of fields, walked by the writer and by the
 * reader, so each field's name, type, bounds and unknown value are written down once.
 * Relies on jansson and base/text.h's cleaning of untrusted text.
 */
#include "supervisor/events.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/text.h"
#include "supervisor/runlog.h"

typedef enum ftype {
    F_TEXT,    /* char[cap] */
    F_SECONDS, /* double, 0 to 1e10, written to the millisecond; NAN unknown */
    F_INT,     /* int or int64_t (size), lo to hi; -1 unknown */
    F_PATHS    /* char[cap], one item a line: a list of strings */
} ftype;

enum {
    REQUIRED = 1,  /* the reader refuses a line without it (a text: empty too) */
    EMPTY_NULL = 2 /* a text: "" is written as null (else as "") */
};

typedef struct field {
    const char *name;
    ftype type;
    size_t off, size; /* where in rk_event, and its size (a text's capacity) */
    int64_t lo, hi;   /* F_INT's bounds */
    unsigned flags;
    const char *want; /* what the reader says of a bad value */
} field;

#define AT(m) offsetof(rk_event, m), sizeof(((rk_event *)0)->m)
#define SECONDS_WANT "not a number of seconds"

/* The line, in the order it is written (docs/run.md, "Accounting"). */
static const field k_fields[] = {
    {"time", F_TEXT, AT(time), 0, 0, 0, NULL},
    {"t", F_SECONDS, AT(t), 0, 0, REQUIRED, "missing, or " SECONDS_WANT " from 0 to 1e10"},
    {"kind", F_TEXT, AT(kind), 0, 0, REQUIRED, NULL},
    {"rank", F_INT, AT(rank), 0, 65535, 0, "not a rank from 0 to 65535 or null"},
    {"device", F_TEXT, AT(device), 0, 0, EMPTY_NULL, NULL},
    {"action", F_TEXT, AT(action), 0, 0, 0, NULL},
    {"step", F_INT, AT(step), 0, RK_RUNLOG_MAX_STEP, 0, "not a step from 0 to 2^53 or null"},
    {"lost_steps", F_INT, AT(lost_steps), 0, INT64_MAX, 0, "not a count of steps or null"},
    {"recovery_s", F_SECONDS, AT(recovery_s), 0, 0, 0, SECONDS_WANT " or null"},
    {"detail", F_TEXT, AT(detail), 0, 0, 0, NULL},
    {"stacks", F_PATHS, AT(stacks), 0, 0, 0, "not a list of file names"},
};
#define NFIELDS (sizeof k_fields / sizeof k_fields[0])

#define MAX_SECONDS 1e10

int rk_event_is_note(const char *kind)
{
    static const char *const notes[] = {"snapshot_on", "snapshot_held", "snapshot_peak"};
    for (size_t i = 0; i < sizeof notes / sizeof notes[0]; i++)
        if (strcmp(kind, notes[i]) == 0)
            return 1;
    return 0;
}

void rk_event_init(rk_event *e)
{
    memset(e, 0, sizeof *e);
    e->rank = -1;
    e->step = -1;
    e->lost_steps = -1;
    e->recovery_s = NAN;
}

void rk_event_stamp(rk_event *e, double epoch_s)
{
    time_t wall = (time_t)epoch_s;
    char frac[8];
    struct tm tm;
    gmtime_r(&wall, &tm);
    strftime(e->time, 24, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(frac, sizeof frac, ".%03dZ", (int)((epoch_s - (double)wall) * 1000) % 1000);
    strcat(e->time, frac);
}

static int64_t get_int(const field *f, const void *p)
{
    return f->size == sizeof(int) ? *(const int *)p : *(const int64_t *)p;
}

static void set_int(const field *f, void *p, int64_t v)
{
    if (f->size == sizeof(int))
        *(int *)p = (int)v;
    else
        *(int64_t *)p = v;
}

static int seconds_ok(double v)
{
    return v >= 0 && v <= MAX_SECONDS;
}

/* ---- the writer --------------------------------------------------------------------------- */

/* s[0..n) (n below a text field's size) as a JSON string; cleaned when it is not UTF-8
 * (jansson takes UTF-8 only). */
static json_t *text_json(const char *s, size_t n)
{
    char one[sizeof(((rk_event *)0)->stacks)], clean[sizeof one];
    snprintf(one, sizeof one, "%.*s", (int)n, s);
    json_t *j = json_string(one);
    if (j)
        return j;
    rk_text_clean(clean, sizeof clean, one);
    return json_string(clean);
}

static json_t *field_json(const field *f, const void *p)
{
    switch (f->type) {
    case F_TEXT: {
        const char *s = p;
        return !s[0] && (f->flags & EMPTY_NULL) ? json_null() : text_json(s, strnlen(s, f->size));
    }
    case F_SECONDS: {
        double v = *(const double *)p;
        return seconds_ok(v) ? json_real(round(v * 1000) / 1000) : json_null();
    }
    case F_INT: {
        int64_t v = get_int(f, p);
        return v >= f->lo && v <= f->hi ? json_integer(v) : json_null();
    }
    case F_PATHS: {
        json_t *a = json_array();
        for (const char *s = p; *s;) {
            const char *nl = strchr(s, '\n');
            size_t len = nl ? (size_t)(nl - s) : strlen(s);
            if (len) /* a file has a name */
                json_array_append_new(a, text_json(s, len));
            s += len + (nl ? 1 : 0);
        }
        return a;
    }
    }
    return NULL;
}

long rk_event_format(const rk_event *e, char *buf, size_t cap)
{
    if (!seconds_ok(e->t) || !e->kind[0])
        return -1;
    json_t *j = json_object();
    for (size_t k = 0; k < NFIELDS; k++) {
        const field *f = &k_fields[k];
        const char *p = (const char *)e + f->off;
        if (f->type == F_PATHS && !p[0])
            continue; /* no stacks: the field is absent */
        json_object_set_new(j, f->name, field_json(f, p));
    }
    size_t n = json_dumpb(j, buf, cap, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(j);
    if (n == 0 || n >= cap || n > RK_EVENT_MAX_LINE)
        return -1; /* jansson's error, or it does not fit */
    buf[n] = '\0';
    return (long)n;
}

/* ---- the reader --------------------------------------------------------------------------- */

static int bad(rk_err *err, const char *name, const char *what)
{
    return rk_err_set(err, RK_EFORMAT, "field \"%s\": %s", name, what);
}

static int read_paths(const field *f, json_t *x, char *out, rk_err *err)
{
    if (!json_is_array(x))
        return bad(err, f->name, f->want);
    size_t used = 0;
    int full = 0;
    for (size_t i = 0; i < json_array_size(x); i++) {
        json_t *y = json_array_get(x, i);
        if (!json_is_string(y))
            return bad(err, f->name, f->want);
        char one[sizeof(((rk_event *)0)->stacks)];
        size_t all = strlen(json_string_value(y));
        size_t took = rk_text_clean(one, sizeof one, json_string_value(y));
        size_t n = strlen(one);
        if (!n)
            continue; /* a file has a name */
        if (full || took < all || used + (used ? 1 : 0) + n >= f->size) {
            full = 1; /* the files that fit whole are kept */
            continue;
        }
        if (used)
            out[used++] = '\n';
        memcpy(out + used, one, n + 1);
        used += n;
    }
    return RK_OK;
}

static int read_field(const field *f, json_t *x, void *p, rk_err *err)
{
    int given = x && !json_is_null(x);
    switch (f->type) {
    case F_TEXT: {
        char *out = p;
        if (!given)
            return f->flags & REQUIRED ? bad(err, f->name, "missing") : RK_OK;
        if (!json_is_string(x))
            return bad(err, f->name, "not a string");
        rk_text_clean(out, f->size, json_string_value(x));
        if ((f->flags & REQUIRED) && !out[0])
            return bad(err, f->name, "empty");
        return RK_OK;
    }
    case F_SECONDS:
        if (!given && !(f->flags & REQUIRED))
            return RK_OK;
        if (!json_is_number(x) || !seconds_ok(json_number_value(x)))
            return bad(err, f->name, f->want);
        *(double *)p = json_number_value(x);
        return RK_OK;
    case F_INT:
        if (!given)
            return RK_OK;
        if (!json_is_integer(x) || json_integer_value(x) < f->lo || json_integer_value(x) > f->hi)
            return bad(err, f->name, f->want);
        set_int(f, p, json_integer_value(x));
        return RK_OK;
    case F_PATHS: return given ? read_paths(f, x, p, err) : RK_OK;
    }
    return RK_OK;
}

int rk_event_parse(const char *line, size_t len, rk_event *e, rk_err *err)
{
    rk_event_init(e);
    if (len > RK_EVENT_MAX_LINE)
        return rk_err_set(err, RK_EFORMAT, "a line longer than %d bytes", RK_EVENT_MAX_LINE);
    json_error_t je;
    json_t *o = json_loadb(len ? line : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return rk_err_set(err, RK_EFORMAT, "not JSON: %s", je.text);
    int rc = json_is_object(o) ? RK_OK : rk_err_set(err, RK_EFORMAT, "not a JSON object");
    for (size_t k = 0; !rc && k < NFIELDS; k++)
        rc = read_field(&k_fields[k], json_object_get(o, k_fields[k].name),
                        (char *)e + k_fields[k].off, err);
    json_decref(o);
    return rc;
}
