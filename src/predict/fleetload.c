/*
 * Reading a fleet dataset (predict/fleetdata.h): the manifest with jansson
 * (predict/jsonfile.h), the histories with safetensors. The writer is fleetdata.c.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "predict/fleetdata.h"
#include "predict/jsonfile.h"
#include "rekindle/safetensors.h"

#define F RK_FLEET_FEATURES

void rk_fleet_free(rk_fleet *f)
{
    if (!f)
        return;
    for (int i = 0; f->gpu && i < f->gpus; i++) {
        free(f->gpu[i].x);
        free(f->gpu[i].score);
    }
    free(f->gpu);
    memset(f, 0, sizeof *f);
}

static int load_history(rk_fleet_gpu *g, const char *path, rk_err *err)
{
    rk_st_file st;
    int rc = rk_st_read(path, &st, err);
    if (rc)
        return rc;
    const char *fmt = rk_st_meta(&st, "format");
    const int64_t shape[2] = {(int64_t)g->steps, F}, shape1[1] = {(int64_t)g->steps};
    if (!fmt || strcmp(fmt, "rekindle-fleet-history") != 0) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: not a rekindle fleet history", path);
        goto out;
    }
    g->x = malloc((g->steps ? g->steps : 1) * F * sizeof *g->x);
    if (!g->x) {
        rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if ((rc = rk_st_load_f32(&st, "x", 2, shape, g->x, err))) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: %s (the manifest says %zu steps)", path, err->msg,
                        g->steps);
        goto out;
    }
    for (size_t k = 0; k < g->steps * F; k++)
        if (!isfinite(g->x[k])) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: x at step %zu, feature %s is not finite", path,
                            k / F, rk_fleet_feature_names[k % F]);
            goto out;
        }
    if (rk_st_find(&st, "score")) {
        g->score = malloc((g->steps ? g->steps : 1) * sizeof *g->score);
        if (!g->score) {
            rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
            goto out;
        }
        if ((rc = rk_st_load_f32(&st, "score", 1, shape1, g->score, err))) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: %s", path, err->msg);
            goto out;
        }
    }
out:
    rk_st_free(&st);
    return rc;
}

static int want_int(json_t *o, const char *key, const char *file, int idx, long lo, long hi,
                    long *out, rk_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return rk_err_set(err, RK_EFORMAT, "%s: device %d: \"%s\" is missing or out of range", file,
                          idx, key);
    *out = (long)json_integer_value(v);
    return RK_OK;
}

/* The manifest's fields into f (every GPU's metadata, no history); `path` names it in errors. */
static int parse_manifest(rk_fleet *f, json_t *j, const char *path, rk_err *err)
{
    int rc = RK_OK;
    json_t *fmt = json_object_get(j, "format"), *devs = json_object_get(j, "devices");
    json_t *hours = json_object_get(j, "hours"), *seed = json_object_get(j, "seed");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "rekindle-fleet-dataset") != 0)
        return rk_err_set(err, RK_EFORMAT, "%s: not a rekindle fleet dataset", path);
    if (!json_is_array(devs) || json_array_size(devs) < 1 || json_array_size(devs) > 1024 ||
        !json_is_number(hours) || !json_is_integer(seed))
        return rk_err_set(err, RK_EFORMAT, "%s: devices, hours or seed missing or malformed", path);
    json_t *feat = json_object_get(j, "features");
    if (!json_is_array(feat) || json_array_size(feat) != F)
        return rk_err_set(err, RK_EFORMAT, "%s: %zu features, expected %d", path,
                          json_array_size(feat), F);
    for (int k = 0; k < F; k++) {
        json_t *nm = json_array_get(feat, (size_t)k);
        if (!json_is_string(nm) || strcmp(json_string_value(nm), rk_fleet_feature_names[k]))
            return rk_err_set(err, RK_EFORMAT, "%s: feature %d is not \"%s\"", path, k,
                              rk_fleet_feature_names[k]);
    }
    f->seed = (uint64_t)json_integer_value(seed);
    f->hours = json_number_value(hours);
    json_t *span = json_object_get(j, "span_h"), *age = json_object_get(j, "start_age_h");
    f->span_h = json_is_number(span) ? json_number_value(span) : f->hours;
    f->start_age_h = json_is_number(age) ? json_number_value(age) : 0;
    f->gpus = (int)json_array_size(devs);
    f->gpu = calloc((size_t)f->gpus, sizeof *f->gpu);
    if (!f->gpu)
        return rk_err_set(err, RK_ENOMEM, "dataset: out of memory");
    for (int i = 0; i < f->gpus && !rc; i++) {
        json_t *d = json_array_get(devs, (size_t)i);
        rk_fleet_gpu *g = &f->gpu[i];
        g->failure = g->precursor = -1;
        long idx, steps, start = 0;
        const char *split = json_string_value(json_object_get(d, "split"));
        const char *file = json_string_value(json_object_get(d, "file"));
        const char *uuid = json_string_value(json_object_get(d, "uuid"));
        const char *prof = json_string_value(json_object_get(d, "profile"));
        if ((rc = want_int(d, "index", path, i, i, i, &idx, err)) ||
            (rc = want_int(d, "steps", path, i, 0, 100000L * 60, &steps, err)))
            break;
        if (json_object_get(d, "start_minute") &&
            (rc = want_int(d, "start_minute", path, i, 0, 200000L * 60, &start, err)))
            break;
        g->index = i;
        g->steps = (size_t)steps;
        g->start_minute = start;
        g->split = !split                        ? -1
                   : strcmp(split, "train") == 0 ? RK_FLEET_TRAIN
                   : strcmp(split, "val") == 0   ? RK_FLEET_VAL
                   : strcmp(split, "test") == 0  ? RK_FLEET_TEST
                                                 : -1;
        if (g->split < 0 || !file || !uuid || !prof || strchr(file, '/') || file[0] == '.' ||
            strlen(file) >= sizeof g->file) {
            rc = rk_err_set(err, RK_EFORMAT,
                            "%s: device %d: split, file, uuid or profile missing or malformed",
                            path, i);
            break;
        }
        snprintf(g->file, sizeof g->file, "%s", file);
        snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
        snprintf(g->profile, sizeof g->profile, "%s", prof);
        json_t *fl = json_object_get(d, "failure");
        if (fl && !json_is_null(fl)) {
            const char *ev = json_string_value(json_object_get(fl, "event"));
            if ((rc = want_int(fl, "minute", path, i, 0, steps, &g->failure, err)))
                break;
            if (!ev) {
                rc =
                    rk_err_set(err, RK_EFORMAT, "%s: device %d: failure without an event", path, i);
                break;
            }
            snprintf(g->event, sizeof g->event, "%s", ev);
            json_t *pm = json_object_get(fl, "precursor_minute");
            if (pm && !json_is_null(pm) &&
                (rc = want_int(fl, "precursor_minute", path, i, 0, g->failure, &g->precursor, err)))
                break;
        }
    }
    return rc;
}

const char *rk_fleet_split_name(int split)
{
    return split == RK_FLEET_TRAIN ? "train" : split == RK_FLEET_VAL ? "val" : "test";
}

int rk_fleet_parse_manifest(rk_fleet *f, const char *text, size_t len, const char *name,
                            rk_err *err)
{
    memset(f, 0, sizeof *f);
    int rc = RK_OK;
    json_t *j = rk_pred_json_text(text, len, name, &rc, err);
    if (!j)
        return rc;
    rc = parse_manifest(f, j, name, err);
    json_decref(j);
    if (rc)
        rk_fleet_free(f);
    return rc;
}

int rk_fleet_load(rk_fleet *f, const char *dir, unsigned splits, rk_err *err)
{
    memset(f, 0, sizeof *f);
    size_t plen = strlen(dir) + 64;
    char *path = malloc(plen);
    if (!path)
        return rk_err_set(err, RK_ENOMEM, "dataset: out of memory");
    snprintf(path, plen, "%s/fleet.json", dir);
    int rc = RK_OK;
    json_t *j = rk_pred_json_file(path, "not a dataset of rk predict dataset", &rc, err);
    if (!j) {
        free(path);
        return rc;
    }
    rc = parse_manifest(f, j, path, err);
    for (int i = 0; i < f->gpus && !rc; i++) {
        rk_fleet_gpu *g = &f->gpu[i];
        if (!((splits >> g->split) & 1u))
            continue;
        char *hp = malloc(strlen(dir) + strlen(g->file) + 2);
        if (!hp) {
            rc = rk_err_set(err, RK_ENOMEM, "dataset: out of memory");
            break;
        }
        sprintf(hp, "%s/%s", dir, g->file);
        rc = load_history(g, hp, err);
        free(hp);
    }
    json_decref(j);
    free(path);
    if (rc)
        rk_fleet_free(f);
    return rc;
}
