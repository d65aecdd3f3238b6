/*
 * The run's record lines (runlog.h): one format, written by the ledger and read by rk report,
 * with the same checks both ways. Relies on jansson.
 */
#include "supervisor/runlog.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_types[] = {"launch", "step", "ckpt", "gate"};

void rk_runlog_init(rk_runlog_rec *r, rk_runlog_type type)
{
    memset(r, 0, sizeof *r);
    r->type = type;
    r->loss = NAN;
    r->temperature_c = NAN;
}

int rk_runlog_thin_keep(rk_runlog_thin *th)
{
    int64_t k = th->seen++;
    if (th->written >= RK_RUNLOG_MAX_LINES)
        return 0;
    int64_t level = th->written / RK_RUNLOG_THIN_EVERY;
    int64_t stride = (int64_t)1 << (level < 40 ? level : 40);
    if (k % stride)
        return 0;
    th->written++;
    return 1;
}

/* ---- checks shared by the writer and the reader ----------------------------------------- */

static int bad(rk_err *err, const char *field, const char *what)
{
    return rk_err_set(err, RK_EFORMAT, "field \"%s\": %s", field, what);
}

static int check_id(const char *id, const char *field, rk_err *err)
{
    size_t n = strlen(id);
    if (n == 0 || n >= RK_RUNLOG_ID_LEN)
        return bad(err, field, "a device id of 1 to 63 bytes");
    return RK_OK;
}

static int check(const rk_runlog_rec *r, rk_err *err)
{
    if (!(r->t >= 0) || !isfinite(r->t) || r->t > 1e10)
        return bad(err, "t", "seconds since the start: a number from 0 to 1e10");
    if (r->type != RK_RUNLOG_GATE && (r->launch < 0 || r->launch > RK_RUNLOG_MAX_LAUNCH))
        return bad(err, "launch", "a launch number from 0 to 1000000");
    switch (r->type) {
    case RK_RUNLOG_LAUNCH:
        if (r->ndevices < 1 || r->ndevices > RK_RUNLOG_MAX_DEVICES)
            return bad(err, "devices", "a list of 1 to 256 device ids");
        for (int i = 0; i < r->ndevices; i++)
            if (check_id(r->devices[i], "devices", err))
                return RK_EFORMAT;
        return RK_OK;
    case RK_RUNLOG_STEP:
    case RK_RUNLOG_CKPT:
        if (r->rank < 0 || r->rank >= 65536)
            return bad(err, "rank", "a rank from 0 to 65535");
        if (r->step < (r->type == RK_RUNLOG_STEP ? 1 : 0) || r->step > RK_RUNLOG_MAX_STEP)
            return bad(err, "step", "a step from 1 (a checkpoint: 0) to 2^53");
        if (r->type == RK_RUNLOG_STEP && (!(r->dt >= 0) || !isfinite(r->dt) || r->dt > 1e9))
            return bad(err, "dt", "seconds from 0 to 1e9");
        if (r->type == RK_RUNLOG_STEP && isfinite(r->loss) && fabs(r->loss) > 1e300)
            return bad(err, "loss", "a finite number or null");
        if (r->type == RK_RUNLOG_CKPT &&
            (!(r->seconds >= 0) || !isfinite(r->seconds) || r->seconds > 1e9))
            return bad(err, "seconds", "seconds from 0 to 1e9");
        return RK_OK;
    case RK_RUNLOG_GATE:
        if (check_id(r->device, "device", err))
            return RK_EFORMAT;
        if (r->score < 0 || r->score > 100)
            return bad(err, "score", "an integer from 0 to 100");
        if (isfinite(r->temperature_c) && (r->temperature_c < -100 || r->temperature_c > 300))
            return bad(err, "temperature_c", "degrees Celsius from -100 to 300, or null");
        if (!(r->threshold >= 0) || r->threshold > 100)
            return bad(err, "threshold", "a score from 0 to 100");
        return RK_OK;
    }
    return rk_err_set(err, RK_EFORMAT, "field \"type\": unknown record type");
}

/* ---- the writer --------------------------------------------------------------------------- */

static json_t *num_or_null(double v)
{
    return isfinite(v) ? json_real(round(v * 1e6) / 1e6) : json_null();
}

long rk_runlog_format(const rk_runlog_rec *r, char *buf, size_t cap)
{
    rk_err err = {0};
    if ((unsigned)r->type > RK_RUNLOG_GATE || check(r, &err))
        return -1;
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string(k_types[r->type]));
    json_object_set_new(j, "t", json_real(round(r->t * 1000) / 1000));
    if (r->type != RK_RUNLOG_GATE)
        json_object_set_new(j, "launch", json_integer(r->launch));
    switch (r->type) {
    case RK_RUNLOG_LAUNCH: {
        json_t *a = json_array();
        for (int i = 0; i < r->ndevices; i++)
            json_array_append_new(a, json_string(r->devices[i]));
        json_object_set_new(j, "devices", a);
        break;
    }
    case RK_RUNLOG_STEP:
        json_object_set_new(j, "rank", json_integer(r->rank));
        json_object_set_new(j, "step", json_integer(r->step));
        json_object_set_new(j, "loss", num_or_null(r->loss));
        json_object_set_new(j, "dt", num_or_null(r->dt));
        break;
    case RK_RUNLOG_CKPT:
        json_object_set_new(j, "rank", json_integer(r->rank));
        json_object_set_new(j, "step", json_integer(r->step));
        json_object_set_new(j, "seconds", num_or_null(r->seconds));
        break;
    case RK_RUNLOG_GATE:
        json_object_set_new(j, "device", json_string(r->device));
        json_object_set_new(j, "score", json_integer(r->score));
        json_object_set_new(j, "temperature_c", num_or_null(r->temperature_c));
        json_object_set_new(j, "lost", json_boolean(r->lost));
        json_object_set_new(j, "simulated", json_boolean(r->simulated));
        json_object_set_new(j, "threshold", num_or_null(r->threshold));
        break;
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(j);
    if (!s)
        return -1;
    size_t n = strlen(s);
    long out = -1;
    if (n < cap && n <= RK_RUNLOG_MAX_LINE) {
        memcpy(buf, s, n + 1);
        out = (long)n;
    }
    free(s);
    return out;
}

/* ---- the reader --------------------------------------------------------------------------- */

static int get_num(json_t *o, const char *k, int nullable, double *v, rk_err *err)
{
    json_t *x = json_object_get(o, k);
    if (!x)
        return bad(err, k, "missing");
    if (json_is_null(x) && nullable) {
        *v = NAN;
        return RK_OK;
    }
    if (!json_is_number(x))
        return bad(err, k, nullable ? "not a number or null" : "not a number");
    *v = json_number_value(x);
    return RK_OK;
}

static int get_int(json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *v, rk_err *err)
{
    json_t *x = json_object_get(o, k);
    if (!x)
        return bad(err, k, "missing");
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
        return bad(err, k, "not an integer in range");
    *v = json_integer_value(x);
    return RK_OK;
}

static int get_bool(json_t *o, const char *k, int *v, rk_err *err)
{
    json_t *x = json_object_get(o, k);
    if (!x)
        return bad(err, k, "missing");
    if (!json_is_boolean(x))
        return bad(err, k, "not true or false");
    *v = json_is_true(x);
    return RK_OK;
}

static int get_id(json_t *x, const char *k, char *out, rk_err *err)
{
    if (!json_is_string(x) || json_string_length(x) == 0 ||
        json_string_length(x) >= RK_RUNLOG_ID_LEN)
        return bad(err, k, "a device id of 1 to 63 bytes");
    memcpy(out, json_string_value(x), json_string_length(x) + 1);
    return RK_OK;
}

static int parse_body(json_t *o, rk_runlog_rec *r, rk_err *err)
{
    json_t *ty = json_object_get(o, "type");
    if (!json_is_string(ty))
        return bad(err, "type", "missing or not a string");
    int type = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(json_string_value(ty), k_types[i]) == 0)
            type = i;
    if (type < 0)
        return bad(err, "type", "not launch, step, ckpt or gate");
    rk_runlog_init(r, (rk_runlog_type)type);
    int64_t v;
    if (get_num(o, "t", 0, &r->t, err))
        return RK_EFORMAT;
    if (type != RK_RUNLOG_GATE) {
        if (get_int(o, "launch", 0, RK_RUNLOG_MAX_LAUNCH, &v, err))
            return RK_EFORMAT;
        r->launch = (int)v;
    }
    switch (r->type) {
    case RK_RUNLOG_LAUNCH: {
        json_t *a = json_object_get(o, "devices");
        if (!json_is_array(a) || json_array_size(a) < 1 ||
            json_array_size(a) > RK_RUNLOG_MAX_DEVICES)
            return bad(err, "devices", "a list of 1 to 256 device ids");
        r->ndevices = (int)json_array_size(a);
        for (int i = 0; i < r->ndevices; i++)
            if (get_id(json_array_get(a, (size_t)i), "devices", r->devices[i], err))
                return RK_EFORMAT;
        break;
    }
    case RK_RUNLOG_STEP:
    case RK_RUNLOG_CKPT:
        if (get_int(o, "rank", 0, 65535, &v, err))
            return RK_EFORMAT;
        r->rank = (int)v;
        if (get_int(o, "step", 0, RK_RUNLOG_MAX_STEP, &r->step, err))
            return RK_EFORMAT;
        if (r->type == RK_RUNLOG_STEP &&
            (get_num(o, "loss", 1, &r->loss, err) || get_num(o, "dt", 0, &r->dt, err)))
            return RK_EFORMAT;
        if (r->type == RK_RUNLOG_CKPT && get_num(o, "seconds", 0, &r->seconds, err))
            return RK_EFORMAT;
        break;
    case RK_RUNLOG_GATE:
        if (get_id(json_object_get(o, "device"), "device", r->device, err) ||
            get_int(o, "score", 0, 100, &v, err))
            return RK_EFORMAT;
        r->score = (int)v;
        if (get_num(o, "temperature_c", 1, &r->temperature_c, err) ||
            get_bool(o, "lost", &r->lost, err) || get_bool(o, "simulated", &r->simulated, err) ||
            get_num(o, "threshold", 0, &r->threshold, err))
            return RK_EFORMAT;
        break;
    }
    return check(r, err);
}

int rk_runlog_parse(const char *line, size_t len, rk_runlog_rec *r, rk_err *err)
{
    if (len > RK_RUNLOG_MAX_LINE)
        return rk_err_set(err, RK_EFORMAT, "a line longer than %d bytes", RK_RUNLOG_MAX_LINE);
    json_error_t je;
    json_t *o = json_loadb(len ? line : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return rk_err_set(err, RK_EFORMAT, "not JSON: %s", je.text);
    int rc = json_is_object(o) ? parse_body(o, r, err)
                               : rk_err_set(err, RK_EFORMAT, "not a JSON object");
    json_decref(o);
    return rc;
}
