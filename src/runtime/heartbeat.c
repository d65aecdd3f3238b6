/*
 * The heartbeat protocol (rekindle/heartbeat.h, docs/protocol.md): the supervisor's message
 * and command parsers and line splitter, one formatter that writes every worker line, and the
 * worker's client over a Unix stream socket. Reads JSON with jansson; writes it by hand (the
 * lines are flat). Never prints or exits.
 */
#include "rekindle/heartbeat.h"
#include "base/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MSG "heartbeat message: "
#define CMD "heartbeat command: "
#define SHOW_MAX 64   /* bytes of an untrusted string shown in a message */
#define PATH_SHOW 128 /* room for any Unix socket path (108 bytes) */

/* ---- messages --------------------------------------------------------------------------- */

/* ---- text ------------------------------------------------------------------------------- */

/* [a-z_]{1,} */
static bool word_ok(const char *s, size_t len)
{
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || s[i] == '_'))
            return false;
    return true;
}

/* ---- the rules, shared by the parser and the formatter ---------------------------------- */

typedef struct ispec {
    const char *key;
    int64_t lo, hi;
    const char *want;
} ispec;

static const ispec I_VERSION = {"v", 1, INT_MAX, "an integer >= 1"};
static const ispec I_RANK = {"rank", 0, RK_HB_RANK_MAX, "an integer 0..65535"};
static const ispec I_WORLD = {"world", 1, RK_HB_RANK_MAX + 1, "an integer 1..65536"};
static const ispec I_PID = {"pid", 1, INT_MAX, "an integer >= 1"};
static const ispec I_STEP = {"step", 0, RK_HB_STEP_MAX, "an integer 0..2^53"};
static const ispec I_LOST = {"lost_steps", 0, RK_HB_STEP_MAX, "an integer 0..2^53"};
static const ispec I_BLAME = {"blame", -1, RK_HB_RANK_MAX, "an integer -1..65535"};
static const ispec I_INDEX = {"index", 0, INT_MAX, "an integer >= 0"};
static const ispec I_KEEP = {"keep", 1, 1000, "an integer 1..1000"};

enum { TEXT, WORD, STATUS };

typedef struct sspec {
    const char *key;
    size_t cap; /* the field's buffer, NUL included */
    int kind;
    const char *want;
} sspec;

static const sspec S_DEVICE = {"device", 64, TEXT,
                               "a string of at most 63 bytes without control characters"};
static const sspec S_KIND = {"kind", 32, WORD, "a word of 1 to 31 characters a-z or _"};
static const sspec S_ACTION = {"action", 32, WORD, "a word of 1 to 31 characters a-z or _"};
static const sspec S_STATUS = {"status", 16, STATUS, "\"done\" or \"stopped\""};
static const sspec S_DETAIL = {"detail", RK_HB_DETAIL_MAX + 1, TEXT,
                               "a string of at most 512 bytes without control characters"};

static const char *const k_types[] = {"hello", "step",   "comm", "event",
                                      "ckpt",  "inject", "bye",  "save"};
#define NTYPES (sizeof k_types / sizeof k_types[0])

const char *rk_hb_type_name(rk_hb_type t)
{
    return (unsigned)t < NTYPES ? k_types[t] : "?";
}

/* hello's "restore", by rk_hb_restore (UNSAID: the field is absent). */
static const char *const k_restores[] = {"", "none", "disk", "memory", "peer"};
#define NRESTORES (sizeof k_restores / sizeof k_restores[0])
#define RESTORE_WANT "\"memory\", \"peer\", \"disk\" or \"none\""

const char *rk_hb_restore_name(rk_hb_restore r)
{
    return (unsigned)r < NRESTORES ? k_restores[r] : "?";
}

static int expected(rk_err *err, int code, const char *key, const char *want)
{
    return rk_err_set_line(err, code, MSG "field \"%s\": expected %s", key, want);
}

static int check_int(const ispec *s, int64_t v, int code, rk_err *err)
{
    return v < s->lo || v > s->hi ? expected(err, code, s->key, s->want) : RK_OK;
}

/* `v` lies in a buffer of s->cap bytes; it must end inside it. */
static int check_str(const sspec *s, const char *v, int code, rk_err *err)
{
    size_t n = strnlen(v, s->cap);
    bool ok = n < s->cap;
    if (ok && s->kind == TEXT)
        ok = rk_text_ok(v, n);
    else if (ok && s->kind == WORD)
        ok = word_ok(v, n);
    else if (ok)
        ok = strcmp(v, "done") == 0 || strcmp(v, "stopped") == 0;
    return ok ? RK_OK : expected(err, code, s->key, s->want);
}

static int check_nonneg(const char *key, double v, int code, rk_err *err)
{
    return isfinite(v) && v >= 0 ? RK_OK : expected(err, code, key, "a number >= 0");
}

/* Every rule of rekindle/heartbeat.h on *m. */
static int check_msg(const rk_hb_msg *m, int code, rk_err *err)
{
    if ((unsigned)m->type >= NTYPES)
        return rk_err_set_line(err, code, MSG "field \"type\": unknown message type %d",
                               (int)m->type);
    int rc = check_int(&I_RANK, m->rank, code, err);
    if (!rc)
        rc = check_int(&I_STEP, m->step, code, err);
    if (rc)
        return rc;
    switch (m->type) {
    case RK_HB_HELLO:
        if (!(rc = check_int(&I_VERSION, m->version, code, err)) &&
            !(rc = check_int(&I_WORLD, m->world, code, err)) &&
            !(rc = check_int(&I_PID, m->pid, code, err)))
            rc = check_str(&S_DEVICE, m->device, code, err);
        if (!rc && (unsigned)m->restore >= NRESTORES)
            rc = expected(err, code, "restore", RESTORE_WANT);
        if (!rc && m->rank >= m->world)
            rc = rk_err_set_line(err, code,
                                 MSG "field \"rank\": expected an integer 0..world-1 (world is %d)",
                                 m->world);
        return rc;
    case RK_HB_STEP:
        if (m->loss_finite && !isfinite(m->loss))
            return expected(err, code, "loss", "a number or null");
        return check_nonneg("dt", m->dt, code, err);
    case RK_HB_COMM: return RK_OK;
    case RK_HB_EVENT:
        if (!(rc = check_str(&S_KIND, m->kind, code, err)) &&
            !(rc = check_int(&I_BLAME, m->blame, code, err)) &&
            !(rc = check_str(&S_ACTION, m->action, code, err)) &&
            !(rc = check_int(&I_LOST, m->lost_steps, code, err)))
            rc = check_str(&S_DETAIL, m->detail, code, err);
        return rc;
    case RK_HB_CKPT: return check_nonneg("seconds", m->seconds, code, err);
    case RK_HB_INJECT:
        if (!(rc = check_int(&I_INDEX, m->index, code, err)))
            rc = check_str(&S_KIND, m->kind, code, err);
        return rc;
    case RK_HB_BYE: return check_str(&S_STATUS, m->status, code, err);
    case RK_HB_SAVE: return check_int(&I_KEEP, m->keep, code, err);
    }
    return RK_OK;
}

/* ---- parsing ---------------------------------------------------------------------------- */

static json_t *field(json_t *o, const char *key, const char *want, rk_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        rk_err_set_line(err, RK_EFORMAT, MSG "field \"%s\": missing (expected %s)", key, want);
    return v;
}

static int get_int(json_t *o, const ispec *s, int64_t *out, rk_err *err)
{
    json_t *v = field(o, s->key, s->want, err);
    if (!v)
        return RK_EFORMAT;
    if (!json_is_integer(v))
        return expected(err, RK_EFORMAT, s->key, s->want);
    int64_t x = (int64_t)json_integer_value(v);
    int rc = check_int(s, x, RK_EFORMAT, err);
    if (!rc)
        *out = x;
    return rc;
}

/* get_int into an int (every int field's range fits one). */
static int get_i(json_t *o, const ispec *s, int *out, rk_err *err)
{
    int64_t x = 0;
    int rc = get_int(o, s, &x, err);
    *out = (int)x;
    return rc;
}

static int get_nonneg(json_t *o, const char *key, double *out, rk_err *err)
{
    json_t *v = field(o, key, "a number >= 0", err);
    if (!v)
        return RK_EFORMAT;
    if (!json_is_number(v))
        return expected(err, RK_EFORMAT, key, "a number >= 0");
    *out = json_number_value(v);
    return check_nonneg(key, *out, RK_EFORMAT, err);
}

/* A string field into dst[s->cap]. An absent optional field is "". */
static int get_str(json_t *o, const sspec *s, bool optional, char *dst, rk_err *err)
{
    json_t *v = json_object_get(o, s->key);
    if (!v && optional) {
        dst[0] = '\0';
        return RK_OK;
    }
    if (!v)
        return rk_err_set_line(err, RK_EFORMAT, MSG "field \"%s\": missing (expected %s)", s->key,
                               s->want);
    if (!json_is_string(v) || json_string_length(v) >= s->cap)
        return expected(err, RK_EFORMAT, s->key, s->want);
    memcpy(dst, json_string_value(v), json_string_length(v) + 1);
    return check_str(s, dst, RK_EFORMAT, err);
}

static int parse_fields(json_t *o, rk_hb_msg *m, rk_err *err)
{
    json_t *t = json_object_get(o, "type");
    if (!t)
        return rk_err_set_line(err, RK_EFORMAT, MSG "field \"type\": missing (expected a string)");
    if (!json_is_string(t))
        return expected(err, RK_EFORMAT, "type", "a string");
    size_t k = 0;
    while (k < NTYPES && strcmp(json_string_value(t), k_types[k]) != 0)
        k++;
    if (k == NTYPES) {
        char sb[SHOW_MAX];
        return rk_err_set_line(err, RK_EFORMAT, MSG "field \"type\": unknown message type \"%s\"",
                               rk_msg_show(sb, sizeof sb, json_string_value(t)));
    }
    m->type = (rk_hb_type)k;
    int rc = get_i(o, &I_RANK, &m->rank, err);
    if (rc)
        return rc;
    if (m->type == RK_HB_HELLO) { /* the fields in the documented order */
        int64_t pid = 0;
        if ((rc = get_i(o, &I_VERSION, &m->version, err)) ||
            (rc = get_i(o, &I_WORLD, &m->world, err)) || (rc = get_int(o, &I_PID, &pid, err)) ||
            (rc = get_str(o, &S_DEVICE, false, m->device, err)))
            return rc;
        m->pid = (long)pid;
        json_t *st = json_object_get(o, "stacks"); /* optional */
        if (st && !json_is_boolean(st))
            return expected(err, RK_EFORMAT, "stacks", "true or false");
        m->stacks = st && json_is_true(st);
        json_t *re = json_object_get(o, "restore"); /* optional */
        if (re) {
            size_t j = 1; /* "" (UNSAID) is never written */
            while (json_is_string(re) && j < NRESTORES &&
                   strcmp(json_string_value(re), k_restores[j]) != 0)
                j++;
            if (!json_is_string(re) || j == NRESTORES)
                return expected(err, RK_EFORMAT, "restore", RESTORE_WANT);
            m->restore = (rk_hb_restore)j;
        }
        json_t *rj = json_object_get(o, "rejoin"); /* optional */
        if (rj && !json_is_boolean(rj))
            return expected(err, RK_EFORMAT, "rejoin", "true or false");
        m->rejoin = rj && json_is_true(rj);
    }
    if ((rc = get_int(o, &I_STEP, &m->step, err)))
        return rc;
    switch (m->type) {
    case RK_HB_HELLO:
    case RK_HB_COMM: break;
    case RK_HB_STEP: {
        json_t *v = field(o, "loss", "a number or null", err);
        if (!v)
            return RK_EFORMAT;
        if (json_is_null(v)) {
            m->loss = NAN;
            m->loss_finite = false;
        } else if (json_is_number(v)) {
            m->loss = json_number_value(v);
            m->loss_finite = true;
        } else {
            return expected(err, RK_EFORMAT, "loss", "a number or null");
        }
        rc = get_nonneg(o, "dt", &m->dt, err);
        break;
    }
    case RK_HB_EVENT:
        if (!(rc = get_str(o, &S_KIND, false, m->kind, err)) &&
            !(rc = get_i(o, &I_BLAME, &m->blame, err)) &&
            !(rc = get_str(o, &S_ACTION, false, m->action, err)) &&
            !(rc = get_int(o, &I_LOST, &m->lost_steps, err)))
            rc = get_str(o, &S_DETAIL, true, m->detail, err);
        break;
    case RK_HB_CKPT: rc = get_nonneg(o, "seconds", &m->seconds, err); break;
    case RK_HB_INJECT:
        if (!(rc = get_i(o, &I_INDEX, &m->index, err)))
            rc = get_str(o, &S_KIND, false, m->kind, err);
        break;
    case RK_HB_BYE: rc = get_str(o, &S_STATUS, false, m->status, err); break;
    case RK_HB_SAVE: rc = get_i(o, &I_KEEP, &m->keep, err); break;
    }
    return rc ? rc : check_msg(m, RK_EFORMAT, err); /* what is left: rank < world */
}

/* One JSON object from a line, or NULL and an error prefixed with `what`. */
static json_t *load_object(const char *line, size_t len, const char *what, rk_err *err)
{
    if (len >= RK_HB_LINE_MAX) {
        rk_err_set_line(err, RK_EFORMAT, "%sthe line is %zu bytes, more than %d", what, len,
                        RK_HB_LINE_MAX - 1);
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loadb(len ? line : "", len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!o) {
        char sb[SHOW_MAX * 2];
        rk_err_set_line(err, RK_EFORMAT, "%snot JSON: %s (byte %d)", what,
                        rk_msg_show(sb, sizeof sb, je.text), je.position);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        rk_err_set_line(err, RK_EFORMAT, "%snot a JSON object", what);
        return NULL;
    }
    return o;
}

int rk_hb_msg_parse(const char *line, size_t len, rk_hb_msg *m, rk_err *err)
{
    if (!m || (!line && len))
        return rk_err_set_line(err, RK_EINVAL, MSG "no line or no message to fill");
    memset(m, 0, sizeof *m);
    json_t *o = load_object(line, len, MSG, err);
    if (!o)
        return RK_EFORMAT;
    int rc = parse_fields(o, m, err);
    json_decref(o);
    if (!rc)
        rk_err_clear(err);
    return rc;
}

int rk_hb_cmd_parse(const char *line, size_t len, rk_hb_cmd *cmd, rk_err *err)
{
    if (!cmd || (!line && len))
        return rk_err_set_line(err, RK_EINVAL, CMD "no line or no command to fill");
    *cmd = RK_HB_CMD_NONE;
    json_t *o = load_object(line, len, CMD, err);
    if (!o)
        return RK_EFORMAT;
    json_t *c = json_object_get(o, "cmd");
    int rc = RK_OK;
    if (!c) {
        rc = rk_err_set_line(err, RK_EFORMAT,
                             CMD "field \"cmd\": missing (expected \"checkpoint\" or \"stop\")");
    } else if (!json_is_string(c)) {
        rc = rk_err_set_line(err, RK_EFORMAT,
                             CMD "field \"cmd\": expected \"checkpoint\" or \"stop\"");
    } else if (strcmp(json_string_value(c), "checkpoint") == 0) {
        *cmd = RK_HB_CMD_CHECKPOINT;
    } else if (strcmp(json_string_value(c), "stop") == 0) {
        *cmd = RK_HB_CMD_STOP;
    } else {
        char sb[SHOW_MAX];
        rc = rk_err_set_line(err, RK_EFORMAT, CMD "field \"cmd\": unknown command \"%s\"",
                             rk_msg_show(sb, sizeof sb, json_string_value(c)));
    }
    json_decref(o);
    if (!rc)
        rk_err_clear(err);
    return rc;
}

/* ---- formatting ------------------------------------------------------------------------- */

/* Numbers are written in the "C" locale whatever the process set (a decimal comma is not
 * JSON). */
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static locale_t c_locale;

static void c_locale_init(void)
{
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

typedef struct outbuf {
    char *p;
    size_t cap, n;
    bool over;
} outbuf;

__attribute__((format(printf, 2, 3))) static void put(outbuf *o, const char *fmt, ...)
{
    if (o->over)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= o->cap - o->n)
        o->over = true;
    else
        o->n += (size_t)k;
}

/* ,"key":"value" with '"' and '\' escaped (the rules allow nothing else that needs it). */
static void put_str(outbuf *o, const char *key, const char *s)
{
    put(o, ",\"%s\":\"", key);
    for (; *s && !o->over; s++) {
        if (o->n + 3 > o->cap) {
            o->over = true;
            break;
        }
        if (*s == '"' || *s == '\\')
            o->p[o->n++] = '\\';
        o->p[o->n++] = *s;
        o->p[o->n] = '\0';
    }
    put(o, "\"");
}

/* ,"key":v in the shortest form that reads back to the same double (a JSON number: finite,
 * checked). -0 is written -0.0 so that it reads back as a real with its sign. */
static void put_num(outbuf *o, const char *key, double v)
{
    char b[32];
    if (v == 0) {
        snprintf(b, sizeof b, "%s", signbit(v) ? "-0.0" : "0");
    } else {
        locale_t old = uselocale(c_locale);
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(b, sizeof b, "%.*g", prec, v);
            if (strtod(b, NULL) == v)
                break;
        }
        uselocale(old);
    }
    put(o, ",\"%s\":%s", key, b);
}

int rk_hb_msg_format(const rk_hb_msg *m, char *line, size_t cap, size_t *len, rk_err *err)
{
    if (!m || !line || cap == 0)
        return rk_err_set_line(err, RK_EINVAL, MSG "no message or no room to write it");
    line[0] = '\0';
    int rc = check_msg(m, RK_EINVAL, err);
    if (rc)
        return rc;
    pthread_once(&c_locale_once, c_locale_init);
    if (!c_locale)
        return rk_err_set_line(err, RK_ENOMEM, MSG "out of memory (no C locale)");
    outbuf o = {line, cap, 0, false};
    put(&o, "{\"type\":\"%s\"", k_types[m->type]);
    if (m->type == RK_HB_HELLO)
        put(&o, ",\"v\":%d", m->version);
    put(&o, ",\"rank\":%d", m->rank);
    if (m->type == RK_HB_HELLO) {
        put(&o, ",\"world\":%d,\"pid\":%ld", m->world, m->pid);
        put_str(&o, "device", m->device);
    }
    put(&o, ",\"step\":%" PRId64, m->step);
    if (m->type == RK_HB_HELLO && m->stacks)
        put(&o, ",\"stacks\":true");
    if (m->type == RK_HB_HELLO && m->restore != RK_HB_RESTORE_UNSAID)
        put_str(&o, "restore", k_restores[m->restore]);
    if (m->type == RK_HB_HELLO && m->rejoin)
        put(&o, ",\"rejoin\":true");
    switch (m->type) {
    case RK_HB_HELLO:
    case RK_HB_COMM: break;
    case RK_HB_STEP:
        if (m->loss_finite)
            put_num(&o, "loss", m->loss);
        else
            put(&o, ",\"loss\":null");
        put_num(&o, "dt", m->dt);
        break;
    case RK_HB_EVENT:
        put_str(&o, "kind", m->kind);
        put(&o, ",\"blame\":%d", m->blame);
        put_str(&o, "action", m->action);
        put(&o, ",\"lost_steps\":%" PRId64, m->lost_steps);
        put_str(&o, "detail", m->detail);
        break;
    case RK_HB_CKPT: put_num(&o, "seconds", m->seconds); break;
    case RK_HB_INJECT:
        put(&o, ",\"index\":%d", m->index);
        put_str(&o, "kind", m->kind);
        break;
    case RK_HB_BYE: put_str(&o, "status", m->status); break;
    case RK_HB_SAVE: put(&o, ",\"keep\":%d", m->keep); break;
    }
    put(&o, "}\n");
    if (o.over) {
        line[0] = '\0';
        return rk_err_set_line(err, RK_EINVAL, MSG "a %s line does not fit in %zu bytes",
                               k_types[m->type], cap);
    }
    if (len)
        *len = o.n;
    rk_err_clear(err);
    return RK_OK;
}

int rk_hb_rejoin_format(int epoch, int port, char *line, size_t cap, size_t *len, rk_err *err)
{
    if (!line || cap == 0)
        return rk_err_set_line(err, RK_EINVAL, CMD "no room to write it");
    line[0] = '\0';
    if (epoch < 1 || port < 1 || port > 65535)
        return rk_err_set_line(err, RK_EINVAL, CMD "rejoin: epoch %d or port %d out of range",
                               epoch, port);
    outbuf o = {line, cap, 0, false};
    put(&o, "{\"cmd\":\"rejoin\",\"epoch\":%d,\"port\":%d}\n", epoch, port);
    if (o.over) {
        line[0] = '\0';
        return rk_err_set_line(err, RK_EINVAL, CMD "a rejoin line does not fit in %zu bytes", cap);
    }
    if (len)
        *len = o.n;
    rk_err_clear(err);
    return RK_OK;
}

int rk_hb_cmd_format(rk_hb_cmd cmd, char *line, size_t cap, size_t *len, rk_err *err)
{
    if (!line || cap == 0)
        return rk_err_set_line(err, RK_EINVAL, CMD "no room to write it");
    line[0] = '\0';
    const char *name = cmd == RK_HB_CMD_STOP         ? "stop"
                       : cmd == RK_HB_CMD_CHECKPOINT ? "checkpoint"
                                                     : NULL;
    if (!name)
        return rk_err_set_line(err, RK_EINVAL, CMD "no command to write (%d)", (int)cmd);
    outbuf o = {line, cap, 0, false};
    put(&o, "{\"cmd\":\"%s\"}\n", name);
    if (o.over) {
        line[0] = '\0';
        return rk_err_set_line(err, RK_EINVAL, CMD "a %s line does not fit in %zu bytes", name,
                               cap);
    }
    if (len)
        *len = o.n;
    rk_err_clear(err);
    return RK_OK;
}

/* ---- line splitter ---------------------------------------------------------------------- */

int rk_hb_lines_feed(rk_hb_lines *b, const char *data, size_t n,
                     int (*on_line)(void *ctx, const char *line, size_t len), void *ctx,
                     rk_err *err)
{
    if (!b || (!data && n) || !on_line || b->used >= sizeof b->buf)
        return rk_err_set_line(err, RK_EINVAL, "heartbeat: bad arguments to the line splitter");
    size_t i = 0;
    while (i < n) {
        const char *nl = memchr(data + i, '\n', n - i);
        size_t take = nl ? (size_t)(nl - (data + i)) : n - i;
        if (take > sizeof b->buf - 1 - b->used) {
            b->used = 0;
            return rk_err_set_line(err, RK_EFORMAT, "heartbeat: a line is longer than %d bytes",
                                   RK_HB_LINE_MAX);
        }
        memcpy(b->buf + b->used, data + i, take);
        b->used += take;
        if (!nl)
            break;
        i += take + 1;
        size_t len = b->used;
        b->buf[len] = '\0';
        b->used = 0;
        int rc = on_line(ctx, b->buf, len);
        if (rc)
            return rc;
    }
    return RK_OK;
}

/* ---- client ----------------------------------------------------------------------------- */

struct rk_hb {
    pthread_mutex_t mu; /* everything below */
    int fd;             /* -1 once dead */
    int rank;
    bool dead, told;           /* gone; RK_EIO already returned for it */
    bool want_stop, want_ckpt; /* commands read, not yet returned */
    bool bad_cmd;              /* a line the current poll could not read */
    rk_hb_lines in;
    rk_err last;     /* what rk_hb_error reports */
    rk_err dead_err; /* why it died */
    rk_err cmd_err;  /* the first bad line of the current poll */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* Send all of line[n] (retrying EINTR and short writes); 0 or an errno. */
static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd pf = {fd, POLLOUT, 0};
                poll(&pf, 1, -1);
                continue;
            }
            return errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The supervisor has gone: close, remember why. Called with the lock held. */
static void go_dead(rk_hb *h, const char *why)
{
    char pb[PATH_SHOW];
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
    h->dead = true;
    rk_err_set_line(&h->dead_err, RK_EIO,
                    "heartbeat: the supervisor at %s has gone (%s); no heartbeat from now on",
                    rk_msg_show(pb, sizeof pb, h->path), why);
}

/* RK_EIO the first time after the handle died, RK_OK after that; 1 while alive. With the
 * lock held. */
static int dead_result(rk_hb *h)
{
    if (!h->dead)
        return 1;
    if (h->told)
        return RK_OK;
    h->told = true;
    h->last = h->dead_err;
    return RK_EIO;
}

static int hb_send(rk_hb *h, const rk_hb_msg *m)
{
    char line[RK_HB_LINE_MAX];
    size_t len = 0;
    rk_err e;
    int frc = rk_hb_msg_format(m, line, sizeof line, &len, &e);
    pthread_mutex_lock(&h->mu);
    int rc = dead_result(h);
    if (rc <= 0) {
        pthread_mutex_unlock(&h->mu);
        return rc;
    }
    if (frc) {
        h->last = e;
        pthread_mutex_unlock(&h->mu);
        return frc;
    }
    int se = send_all(h->fd, line, len);
    rc = RK_OK;
    if (se) {
        char eb[128];
        go_dead(h, rk_msg_strerror(se, eb, sizeof eb));
        rc = dead_result(h);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* Connect fd to path, waiting out EINTR; 0 or an errno. A path that starts with '@' names
 * an abstract socket (Linux: no file, one name space per network namespace), the name
 * after the '@': a multi-host job's agent listens on one (docs/cluster.md). */
static int connect_to(int fd, const char *path)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    socklen_t len = sizeof a;
    if (path[0] == '@') {
        size_t n = strlen(path + 1);
        memcpy(a.sun_path + 1, path + 1, n);
        len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    } else {
        memcpy(a.sun_path, path, strlen(path) + 1);
    }
    if (connect(fd, (struct sockaddr *)&a, len) == 0)
        return 0;
    int e = errno;
    if (e == EINTR || e == EINPROGRESS) { /* the connection goes on: wait for it */
        struct pollfd pf = {fd, POLLOUT, 0};
        while (poll(&pf, 1, -1) < 0 && errno == EINTR)
            ;
        socklen_t sl = sizeof e;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) != 0)
            e = errno;
    }
    return e;
}

int rk_hb_open(rk_hb **out, int rank, int world, const char *device, int64_t start_step,
               rk_err *err)
{
    return rk_hb_open_restored(out, rank, world, device, start_step, RK_HB_RESTORE_UNSAID, err);
}

int rk_hb_open_restored(rk_hb **out, int rank, int world, const char *device, int64_t start_step,
                        rk_hb_restore restore, rk_err *err)
{
    if (!out)
        return rk_err_set_line(err, RK_EINVAL, "heartbeat: rk_hb_open: out is NULL");
    *out = NULL;
    const char *path = getenv(RK_HB_ENV);
    if (!path || !*path) {
        rk_err_clear(err);
        return RK_OK;
    }
    char pb[PATH_SHOW], db[SHOW_MAX];
    rk_hb_msg m;
    memset(&m, 0, sizeof m);
    m.type = RK_HB_HELLO;
    m.version = RK_HB_VERSION;
    m.rank = rank;
    m.world = world;
    m.pid = (long)getpid();
    m.step = start_step;
    m.restore = restore;
    if (device && strlen(device) >= sizeof m.device)
        return rk_err_set_line(err, RK_EINVAL, "heartbeat: device \"%s\" is longer than %zu bytes",
                               rk_msg_show(db, sizeof db, device), sizeof m.device - 1);
    if (device)
        memcpy(m.device, device, strlen(device) + 1);
    char line[RK_HB_LINE_MAX];
    size_t len = 0;
    int rc = rk_hb_msg_format(&m, line, sizeof line, &len, err);
    if (rc)
        return rc;
    rk_hb *h = calloc(1, sizeof *h);
    if (!h)
        return rk_err_set_line(err, RK_ENOMEM, "heartbeat: out of memory");
    if (strlen(path) >= sizeof h->path) {
        free(h);
        return rk_err_set_line(err, RK_EINVAL,
                               "heartbeat: %s=%s is longer than %zu bytes, too long for a "
                               "Unix socket",
                               RK_HB_ENV, rk_msg_show(pb, sizeof pb, path), sizeof h->path - 1);
    }
    memcpy(h->path, path, strlen(path) + 1);
    h->rank = rank;
    h->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char eb[128];
    if (h->fd < 0) {
        rc = rk_err_set_line(err, RK_EIO, "heartbeat: no socket for %s: %s",
                             rk_msg_show(pb, sizeof pb, path),
                             rk_msg_strerror(errno, eb, sizeof eb));
        free(h);
        return rc;
    }
    int e = connect_to(h->fd, path);
    if (e)
        rc = rk_err_set_line(
            err, RK_EIO, "heartbeat: cannot connect to the supervisor at %s (%s): %s",
            rk_msg_show(pb, sizeof pb, path), RK_HB_ENV, rk_msg_strerror(e, eb, sizeof eb));
    else if ((e = send_all(h->fd, line, len)))
        rc =
            rk_err_set_line(err, RK_EIO, "heartbeat: cannot send hello to the supervisor at %s: %s",
                            rk_msg_show(pb, sizeof pb, path), rk_msg_strerror(e, eb, sizeof eb));
    if (rc || pthread_mutex_init(&h->mu, NULL) != 0) {
        if (!rc)
            rc = rk_err_set_line(err, RK_ENOMEM, "heartbeat: no mutex");
        close(h->fd);
        free(h);
        return rc;
    }
    *out = h;
    rk_err_clear(err);
    return RK_OK;
}

int rk_hb_step(rk_hb *h, int64_t step, double loss, double dt_s)
{
    if (!h)
        return RK_OK;
    rk_hb_msg m = {.type = RK_HB_STEP, .rank = h->rank, .step = step, .dt = dt_s};
    m.loss_finite = isfinite(loss);
    m.loss = m.loss_finite ? loss : NAN;
    return hb_send(h, &m);
}

int rk_hb_comm(rk_hb *h, int64_t step)
{
    if (!h)
        return RK_OK;
    rk_hb_msg m = {.type = RK_HB_COMM, .rank = h->rank, .step = step};
    return hb_send(h, &m);
}

/* A caller's word into a field; "" (invalid) if it does not fit, so the check names it. */
static void copy_word(char *dst, size_t cap, const char *s)
{
    dst[0] = '\0';
    if (s && strlen(s) < cap)
        memcpy(dst, s, strlen(s) + 1);
}

int rk_hb_event(rk_hb *h, int64_t step, const char *kind, int blame, const char *action,
                int64_t lost_steps, const char *detail)
{
    if (!h)
        return RK_OK;
    rk_hb_msg m = {.type = RK_HB_EVENT,
                   .rank = h->rank,
                   .step = step,
                   .blame = blame,
                   .lost_steps = lost_steps};
    copy_word(m.kind, sizeof m.kind, kind);
    copy_word(m.action, sizeof m.action, action);
    rk_text_clean(m.detail, sizeof m.detail, detail ? detail : "");
    return hb_send(h, &m);
}

int rk_hb_ckpt(rk_hb *h, int64_t step, double seconds)
{
    if (!h)
        return RK_OK;
    rk_hb_msg m = {.type = RK_HB_CKPT, .rank = h->rank, .step = step, .seconds = seconds};
    return hb_send(h, &m);
}

int rk_hb_inject(rk_hb *h, int64_t step, int index, const char *kind)
{
    if (!h)
        return RK_OK;
    rk_hb_msg m = {.type = RK_HB_INJECT, .rank = h->rank, .step = step, .index = index};
    copy_word(m.kind, sizeof m.kind, kind);
    return hb_send(h, &m);
}

int rk_hb_bye(rk_hb *h, int64_t step, const char *status)
{
    if (!h)
        return RK_OK;
    rk_hb_msg m = {.type = RK_HB_BYE, .rank = h->rank, .step = step};
    copy_word(m.status, sizeof m.status, status);
    return hb_send(h, &m);
}

/* One command line read by rk_hb_poll. Lines that are not commands are remembered (the first
 * one's message is kept) and skipped. */
static int on_cmd_line(void *ctx, const char *line, size_t len)
{
    rk_hb *h = ctx;
    rk_hb_cmd c;
    rk_err e;
    if (rk_hb_cmd_parse(line, len, &c, &e) != RK_OK) {
        if (!h->bad_cmd)
            h->cmd_err = e;
        h->bad_cmd = true;
    } else if (c == RK_HB_CMD_STOP) {
        h->want_stop = true;
    } else if (c == RK_HB_CMD_CHECKPOINT) {
        h->want_ckpt = true;
    }
    return 0;
}

/* Read whatever arrived, without blocking: commands become pending, end of file turns the
 * handle dead. With the lock held. */
static void take_input(rk_hb *h)
{
    while (!h->dead) {
        char buf[RK_HB_LINE_MAX];
        ssize_t r = recv(h->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r > 0) {
            rk_err e;
            if (rk_hb_lines_feed(&h->in, buf, (size_t)r, on_cmd_line, h, &e) != RK_OK) {
                if (!h->bad_cmd)
                    h->cmd_err = e;
                h->bad_cmd = true;
            }
        } else if (r == 0) {
            go_dead(h, "it closed the connection");
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
        } else if (errno != EINTR) {
            char eb[128];
            go_dead(h, rk_msg_strerror(errno, eb, sizeof eb));
        }
    }
}

int rk_hb_poll(rk_hb *h, rk_hb_cmd *cmd)
{
    if (cmd)
        *cmd = RK_HB_CMD_NONE;
    if (!h)
        return RK_OK;
    pthread_mutex_lock(&h->mu);
    if (!cmd) {
        int rc = rk_err_set_line(&h->last, RK_EINVAL, "heartbeat: rk_hb_poll: cmd is NULL");
        pthread_mutex_unlock(&h->mu);
        return rc;
    }
    take_input(h);
    int rc = RK_OK;
    if (h->bad_cmd) {
        h->last = h->cmd_err;
        h->bad_cmd = false;
        rc = RK_EFORMAT;
    } else if (h->want_stop) {
        *cmd = RK_HB_CMD_STOP;
        h->want_stop = h->want_ckpt = false;
    } else if (h->want_ckpt) {
        *cmd = RK_HB_CMD_CHECKPOINT;
        h->want_ckpt = false;
    } else {
        rc = dead_result(h);
        if (rc > 0)
            rc = RK_OK;
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

int rk_hb_alive(rk_hb *h)
{
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    take_input(h); /* a supervisor that died left an end of file: see it now */
    int alive = !h->dead;
    pthread_mutex_unlock(&h->mu);
    return alive;
}

int rk_hb_error(rk_hb *h, rk_err *err)
{
    if (!h) {
        rk_err_clear(err);
        return RK_OK;
    }
    pthread_mutex_lock(&h->mu);
    int code = h->last.code;
    if (err)
        *err = h->last;
    pthread_mutex_unlock(&h->mu);
    return code;
}

void rk_hb_close(rk_hb *h)
{
    if (!h)
        return;
    if (h->fd >= 0)
        close(h->fd);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
