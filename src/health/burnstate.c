/*
 * The burn-in state file (health/burnstate.h, docs/burn.md): its one reader and one writer,
 * on jansson, the bounded opener and the atomic write of rekindle/fileio.h, and flock(2) on
 * a lock file beside it. Never prints or exits.
 */
#include "health/burnstate.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/env.h"
#include "base/msg.h"
#include "rekindle/fileio.h"

#define SHOW_CAP 200 /* a path or key shown in a message */

struct rk_burn_state {
    rk_burn_record *v; /* sorted by key */
    int n;
};

const char *rk_burn_state_path(void)
{
    const char *p = rk_env_override(RK_BURN_STATE_ENV);
    return p && *p ? p : RK_BURN_STATE_DEFAULT;
}

void rk_burn_state_free(rk_burn_state *s)
{
    if (!s)
        return;
    free(s->v);
    free(s);
}

int rk_burn_state_count(const rk_burn_state *s)
{
    return s ? s->n : 0;
}

const rk_burn_record *rk_burn_state_at(const rk_burn_state *s, int i)
{
    return s && i >= 0 && i < s->n ? &s->v[i] : NULL;
}

static const rk_burn_record *find_key(const rk_burn_state *s, const char *key)
{
    if (!s || !key || !*key)
        return NULL;
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->v[i].key, key) == 0)
            return &s->v[i];
    return NULL;
}

const rk_burn_record *rk_burn_state_find(const rk_burn_state *s, const char *serial,
                                         const char *uuid)
{
    const rk_burn_record *r = find_key(s, serial);
    return r ? r : find_key(s, uuid);
}

/* ---- checks shared by the reader and the writer ----------------------------------------- */

/* A text field: UTF-8 without control characters, shorter than cap. */
static int text_fits(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    return n < cap && rk_text_ok(s, n);
}

int rk_burn_record_check(const rk_burn_record *r, const char *what, rk_err *err)
{
    if (!what)
        what = "burn record";
    if (!r)
        return rk_err_set(err, RK_EINVAL, "%s: no record", what);
    if (!text_fits(r->key, sizeof r->key) || !r->key[0])
        return rk_err_set(err, RK_EINVAL,
                          "%s: key: must be 1 to %zu bytes of UTF-8 without control characters",
                          what, sizeof r->key - 1);
    if (!text_fits(r->name, sizeof r->name))
        return rk_err_set(err, RK_EINVAL,
                          "%s: name: must be at most %zu bytes of UTF-8 without control "
                          "characters",
                          what, sizeof r->name - 1);
    if (!text_fits(r->failed, sizeof r->failed))
        return rk_err_set(err, RK_EINVAL,
                          "%s: failed: must be at most %zu bytes of UTF-8 without control "
                          "characters",
                          what, sizeof r->failed - 1);
    const struct {
        const char *name;
        double v;
    } nums[3] = {{"when", r->when}, {"duration_s", r->duration_s}, {"gflops", r->gflops}};
    for (int k = 0; k < 3; k++)
        if (!isfinite(nums[k].v) || nums[k].v < 0)
            return rk_err_set(err, RK_EINVAL, "%s: %s: must be a finite number >= 0", what,
                              nums[k].name);
    if (r->wrong_elements > (uint64_t)INT64_MAX)
        return rk_err_set(err, RK_EINVAL, "%s: wrong_elements: more than %lld", what,
                          (long long)INT64_MAX);
    if (r->bad_addresses > (uint64_t)INT64_MAX)
        return rk_err_set(err, RK_EINVAL, "%s: bad_addresses: more than %lld", what,
                          (long long)INT64_MAX);
    if (r->ok && r->failed[0])
        return rk_err_set(err, RK_EINVAL, "%s: failed: must be empty when ok is true", what);
    if (!r->ok && !r->failed[0])
        return rk_err_set(err, RK_EINVAL, "%s: failed: must say what failed when ok is false",
                          what);
    return RK_OK;
}

/* ---- the reader --------------------------------------------------------------------------- */

/* Copy a JSON string member into dst[cap]; 0, or -1 when absent, not a string or too long. */
static int get_text(json_t *o, const char *k, char *dst, size_t cap, const char **why)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        *why = "missing";
        return -1;
    }
    if (!json_is_string(v)) {
        *why = "not a string";
        return -1;
    }
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (n >= cap) {
        *why = "too long";
        return -1;
    }
    if (memchr(s, 0, n) || !rk_text_ok(s, n)) {
        *why = "holds control characters";
        return -1;
    }
    memcpy(dst, s, n + 1);
    return 0;
}

static int get_number(json_t *o, const char *k, double *out, const char **why)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        *why = "missing";
        return -1;
    }
    if (!json_is_number(v)) {
        *why = "not a number";
        return -1;
    }
    double d = json_number_value(v);
    if (!isfinite(d) || d < 0) {
        *why = "not a finite number >= 0";
        return -1;
    }
    *out = d;
    return 0;
}

static int get_count(json_t *o, const char *k, uint64_t *out, const char **why)
{
    json_t *v = json_object_get(o, k);
    if (!v) {
        *why = "missing";
        return -1;
    }
    if (!json_is_integer(v)) {
        *why = "not an integer";
        return -1;
    }
    json_int_t i = json_integer_value(v);
    if (i < 0) {
        *why = "negative";
        return -1;
    }
    *out = (uint64_t)i;
    return 0;
}

static const char *const record_fields[] = {"name",   "when",   "duration_s",     "ok",
                                            "failed", "gflops", "wrong_elements", "bad_addresses"};
#define NFIELDS (sizeof record_fields / sizeof record_fields[0])

/* One record (value v under key k, the i-th) into r. `file` is the shown path. */
static int parse_record(const char *file, int i, const char *k, json_t *v, rk_burn_record *r,
                        rk_err *err)
{
    char kshow[SHOW_CAP], label[SHOW_CAP + 64];
    size_t klen = strlen(k);
    memset(r, 0, sizeof *r);
    if (klen == 0 || klen >= sizeof r->key || !rk_text_ok(k, klen)) {
        return rk_err_set(err, RK_EFORMAT,
                          "%s: gpus: record %d: its key must be 1 to %zu bytes of UTF-8 without "
                          "control characters (the GPU's serial or UUID)",
                          file, i + 1, sizeof r->key - 1);
    }
    snprintf(label, sizeof label, "record %d (\"%s\")", i + 1, rk_msg_show(kshow, sizeof kshow, k));
    memcpy(r->key, k, klen + 1);
    if (!json_is_object(v))
        return rk_err_set(err, RK_EFORMAT, "%s: gpus: %s: not an object", file, label);
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x)
    {
        size_t f = 0;
        while (f < NFIELDS && strcmp(key, record_fields[f]) != 0)
            f++;
        if (f == NFIELDS) {
            char fshow[64];
            return rk_err_set(err, RK_EFORMAT, "%s: gpus: %s: unknown field \"%s\"", file, label,
                              rk_msg_show(fshow, sizeof fshow, key));
        }
    }
    const char *why = NULL, *field = NULL;
    json_t *ok = json_object_get(v, "ok");
    if (get_text(v, "name", r->name, sizeof r->name, &why))
        field = "name";
    else if (get_number(v, "when", &r->when, &why))
        field = "when";
    else if (get_number(v, "duration_s", &r->duration_s, &why))
        field = "duration_s";
    else if (!ok || !json_is_boolean(ok)) {
        field = "ok";
        why = ok ? "not true or false" : "missing";
    } else if (get_text(v, "failed", r->failed, sizeof r->failed, &why))
        field = "failed";
    else if (get_number(v, "gflops", &r->gflops, &why))
        field = "gflops";
    else if (get_count(v, "wrong_elements", &r->wrong_elements, &why))
        field = "wrong_elements";
    else if (get_count(v, "bad_addresses", &r->bad_addresses, &why))
        field = "bad_addresses";
    if (field)
        return rk_err_set(err, RK_EFORMAT, "%s: gpus: %s: %s: %s", file, label, field, why);
    r->ok = json_is_true(ok);
    if (r->ok && r->failed[0])
        return rk_err_set(err, RK_EFORMAT, "%s: gpus: %s: failed: must be \"\" when ok is true",
                          file, label);
    if (!r->ok && !r->failed[0])
        return rk_err_set(err, RK_EFORMAT,
                          "%s: gpus: %s: failed: must say what failed when ok is false", file,
                          label);
    return RK_OK;
}

static int cmp_record(const void *a, const void *b)
{
    return strcmp(((const rk_burn_record *)a)->key, ((const rk_burn_record *)b)->key);
}

int rk_burn_state_parse(const char *file, const char *text, size_t len, rk_burn_state **out,
                        rk_err *err)
{
    if (!out)
        return rk_err_set(err, RK_EINVAL, "rk_burn_state_parse: out is NULL");
    *out = NULL;
    if (!file)
        file = "burn state";
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        char tb[JSON_ERROR_TEXT_LENGTH];
        return rk_err_set(err, RK_EFORMAT, "%s: line %d: %s", file, je.line,
                          rk_msg_parser_text(tb, sizeof tb, je.text));
    }
    int rc = RK_OK;
    rk_burn_state *s = NULL;
    json_t *fmt = json_object_get(j, "format"), *ver = json_object_get(j, "version");
    json_t *gpus = json_object_get(j, "gpus");
    if (!json_is_object(j)) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: not a JSON object", file);
        goto out;
    }
    const char *key;
    json_t *x;
    json_object_foreach(j, key, x)
    {
        if (strcmp(key, "format") && strcmp(key, "version") && strcmp(key, "gpus")) {
            char fshow[64];
            rc = rk_err_set(err, RK_EFORMAT,
                            "%s: unknown field \"%s\" (format, version and gpus are known)", file,
                            rk_msg_show(fshow, sizeof fshow, key));
            goto out;
        }
    }
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), RK_BURN_STATE_FORMAT) != 0) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: format: %s (want \"%s\")", file,
                        fmt ? "not this format" : "missing", RK_BURN_STATE_FORMAT);
        goto out;
    }
    if (!json_is_integer(ver) || json_integer_value(ver) != RK_BURN_STATE_VERSION) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: version: %s (this rekindle reads version %d)", file,
                        !ver                   ? "missing"
                        : json_is_integer(ver) ? "a version it does not know"
                                               : "not an integer",
                        RK_BURN_STATE_VERSION);
        goto out;
    }
    if (!json_is_object(gpus)) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: gpus: %s", file, gpus ? "not an object" : "missing");
        goto out;
    }
    size_t n = json_object_size(gpus);
    if (n > RK_BURN_STATE_RECORDS_MAX) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: gpus: %zu records, at most %d", file, n,
                        RK_BURN_STATE_RECORDS_MAX);
        goto out;
    }
    s = calloc(1, sizeof *s);
    if (s && n)
        s->v = calloc(n, sizeof *s->v);
    if (!s || (n && !s->v)) {
        rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory for %zu records", file, n);
        goto out;
    }
    json_object_foreach(gpus, key, x)
    {
        rc = parse_record(file, s->n, key, x, &s->v[s->n], err);
        if (rc)
            goto out;
        s->n++;
    }
    if (s->n > 1)
        qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_record);
out:
    json_decref(j);
    if (rc) {
        rk_burn_state_free(s);
        return rc;
    }
    *out = s;
    return RK_OK;
}

int rk_burn_state_load(const char *path, rk_burn_state **out, rk_err *err)
{
    if (!out)
        return rk_err_set(err, RK_EINVAL, "rk_burn_state_load: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return rk_err_set(err, RK_EINVAL, "rk_burn_state_load: no path");
    char shown[SHOW_CAP];
    rk_msg_show(shown, sizeof shown, path);
    int fd;
    uint64_t size;
    rk_err e2 = {0};
    int rc = rk_file_open_read_nofollow(path, shown, RK_BURN_STATE_MAX, &fd, &size, &e2);
    if (rc == RK_ENOENT) {
        rk_burn_state *s = calloc(1, sizeof *s);
        if (!s)
            return rk_err_set(err, RK_ENOMEM, "%s: out of memory", shown);
        *out = s;
        return RK_OK;
    }
    if (rc) {
        if (err)
            *err = e2;
        return rc;
    }
    uint8_t *buf;
    size_t len;
    rc = rk_file_read_fd(fd, shown, RK_BURN_STATE_MAX, size, &buf, &len, err);
    close(fd);
    if (rc)
        return rc;
    rc = rk_burn_state_parse(shown, (const char *)buf, len, out, err);
    free(buf);
    return rc;
}

/* ---- the writer --------------------------------------------------------------------------- */

static json_t *record_json(const rk_burn_record *r)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    int bad =
        json_object_set_new(o, "name", json_string(r->name)) ||
        json_object_set_new(o, "when", json_real(r->when)) ||
        json_object_set_new(o, "duration_s", json_real(r->duration_s)) ||
        json_object_set_new(o, "ok", json_boolean(r->ok)) ||
        json_object_set_new(o, "failed", json_string(r->failed)) ||
        json_object_set_new(o, "gflops", json_real(r->gflops)) ||
        json_object_set_new(o, "wrong_elements", json_integer((json_int_t)r->wrong_elements)) ||
        json_object_set_new(o, "bad_addresses", json_integer((json_int_t)r->bad_addresses));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The file's text for state s with r put in (r replaces the record with its key). */
static char *state_text(const rk_burn_state *s, const rk_burn_record *r)
{
    json_t *j = json_object(), *gpus = json_object();
    int bad = !j || !gpus;
    if (!bad)
        bad = json_object_set_new(j, "format", json_string(RK_BURN_STATE_FORMAT)) ||
              json_object_set_new(j, "version", json_integer(RK_BURN_STATE_VERSION));
    for (int i = 0; !bad && i < s->n; i++)
        if (strcmp(s->v[i].key, r->key) != 0)
            bad = json_object_set_new(gpus, s->v[i].key, record_json(&s->v[i]));
    if (!bad)
        bad = json_object_set_new(gpus, r->key, record_json(r));
    if (!bad) {
        bad = json_object_set_new(j, "gpus", gpus);
        gpus = NULL;
    }
    char *text =
        bad ? NULL : json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(gpus);
    json_decref(j);
    if (text) {
        size_t n = strlen(text);
        char *t2 = realloc(text, n + 2);
        if (!t2) {
            free(text);
            return NULL;
        }
        t2[n] = '\n';
        t2[n + 1] = 0;
        text = t2;
    }
    return text;
}

/* Make the directory of `path` when it is missing (one level). */
static int make_parent(const char *path, const char *shown, rk_err *err)
{
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path)
        return RK_OK;
    size_t n = (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (!dir)
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", shown);
    memcpy(dir, path, n);
    dir[n] = 0;
    int rc = RK_OK;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        char eb[128], dshow[SHOW_CAP];
        rc = rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot create its directory %s: %s",
                             shown, rk_msg_show(dshow, sizeof dshow, dir),
                             rk_msg_strerror(e, eb, sizeof eb));
    }
    free(dir);
    return rc;
}

/* Open and flock PATH.lock (created beside the file), waiting for another writer at most
 * RK_BURN_STATE_LOCK_WAIT_S. The lock is released by closing *fd. */
static int lock_file(const char *path, const char *shown, int *fd, rk_err *err)
{
    size_t n = strlen(path);
    char *lp = malloc(n + 6);
    if (!lp)
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", shown);
    memcpy(lp, path, n);
    memcpy(lp + n, ".lock", 6);
    char eb[128];
    int f, rc = RK_OK;
    do {
        f = open(lp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
    } while (f < 0 && errno == EINTR);
    struct stat st;
    if (f < 0) {
        int e = errno;
        rc = rk_err_set_line(err, e == ELOOP ? RK_EINVAL : rk_err_code_errno(e),
                             "%s: cannot open its lock file %s.lock: %s", shown, shown,
                             e == ELOOP ? "it is a symbolic link"
                                        : rk_msg_strerror(e, eb, sizeof eb));
    } else if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = rk_err_set_line(err, RK_EINVAL, "%s: its lock file %s.lock is not a regular file",
                             shown, shown);
    } else {
        double deadline = rk_mono_s() + RK_BURN_STATE_LOCK_WAIT_S;
        for (;;) {
            if (flock(f, LOCK_EX | LOCK_NB) == 0)
                break;
            if (errno == EINTR)
                continue;
            if (errno != EWOULDBLOCK) {
                rc = rk_err_set_line(err, RK_EIO, "%s: cannot lock %s.lock: %s", shown, shown,
                                     rk_msg_strerror(errno, eb, sizeof eb));
                break;
            }
            if (rk_mono_s() >= deadline) {
                rc = rk_err_set_line(err, RK_EBUSY,
                                     "%s: another writer has held %s.lock for %.0f s; not "
                                     "written",
                                     shown, shown, RK_BURN_STATE_LOCK_WAIT_S);
                break;
            }
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    free(lp);
    if (rc) {
        if (f >= 0)
            close(f);
        return rc;
    }
    *fd = f;
    return RK_OK;
}

int rk_burn_state_put(const char *path, const rk_burn_record *r, rk_err *err)
{
    if (!path || !*path)
        return rk_err_set(err, RK_EINVAL, "rk_burn_state_put: no path");
    char shown[SHOW_CAP];
    rk_msg_show(shown, sizeof shown, path);
    int rc = rk_burn_record_check(r, shown, err);
    if (rc)
        return rc;
    rc = make_parent(path, shown, err);
    if (rc)
        return rc;
    int lfd = -1;
    rc = lock_file(path, shown, &lfd, err);
    if (rc)
        return rc;
    rk_burn_state *s = NULL;
    rk_err le = {0};
    rc = rk_burn_state_load(path, &s, &le);
    if (rc) {
        /* never replace what we could not read: say so, with the reader's words */
        rk_err_set(err, rc, "%s (not overwritten: move it aside to start afresh)", le.msg);
    } else {
        char *text = state_text(s, r);
        if (!text)
            rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", shown);
        else if (strlen(text) > RK_BURN_STATE_MAX ||
                 (s->n >= RK_BURN_STATE_RECORDS_MAX && !find_key(s, r->key)))
            rc = rk_err_set(err, RK_EINVAL, "%s: full (%d records, at most %zu bytes); not written",
                            shown, s->n, RK_BURN_STATE_MAX);
        else
            rc = rk_file_write_atomic(path, text, strlen(text), err);
        free(text);
    }
    rk_burn_state_free(s);
    close(lfd); /* releases the lock; the lock file stays (removing it would race) */
    return rc;
}
