/*
 * The detectors file (predict/detectors.h): its writer and its one parser, on jansson
 * (predict/jsonfile.h) and the atomic writes of rekindle/fileio.h.
 */
#include "predict/detectors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "predict/jsonfile.h"
#include "predict/predict.h"
#include "predict/windows.h"
#include "rekindle/fileio.h"

#define FORMAT "rekindle-fleet-detectors"

char *rk_fleet_detectors_path(const char *model)
{
    size_t n = strlen(model) + 6;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s.json", model);
    return p;
}

static json_t *floats_json(const float *v, int n)
{
    json_t *a = json_array();
    for (int k = 0; k < n; k++)
        json_array_append_new(a, json_real(v[k]));
    return a;
}

json_t *rk_fleet_detectors_json(const rk_fleet_detectors *d)
{
    const rk_logreg *lr = &d->lr;
    const rk_fleet_training *t = &d->training;
    json_t *j = json_object();
    json_object_set_new(j, "format", json_string(FORMAT));
    json_object_set_new(j, "version", json_integer(1));
    json_object_set_new(j, "simulated", json_true());
    json_object_set_new(j, "window", json_integer(d->window));
    json_object_set_new(j, "horizon", json_integer(d->horizon));
    json_object_set_new(j, "min_lead", json_real(d->min_lead));
    json_t *jp = json_object(), *jl = json_object(), *jh = json_object(), *jt = json_object();
    json_object_set_new(jp, "threshold", json_real(d->threshold));
    json_object_set_new(jp, "val", rk_fleet_metrics_json(&d->val[RK_FLEET_DET_PREDICTOR]));
    json_object_set_new(j, "predictor", jp);
    json_t *names = json_array();
    for (int k = 0; k < lr->d && k < RK_FLEET_SUMMARY; k++) {
        char nm[48];
        rk_fleet_summary_name(k, nm, sizeof nm);
        json_array_append_new(names, json_string(nm));
    }
    json_object_set_new(jl, "threshold", json_real(d->lr_threshold));
    json_object_set_new(jl, "threshold_best_f1", json_real(d->lr_threshold_best_f1));
    json_object_set_new(jl, "inputs", names);
    json_object_set_new(jl, "mean", floats_json(lr->mean, lr->d));
    json_object_set_new(jl, "std", floats_json(lr->std, lr->d));
    json_object_set_new(jl, "w", floats_json(lr->w, lr->d));
    json_object_set_new(jl, "b", json_real(lr->b));
    json_object_set_new(jl, "val", rk_fleet_metrics_json(&d->val[RK_FLEET_DET_LOGREG]));
    json_object_set_new(jl, "val_best_f1",
                        rk_fleet_metrics_json(&d->val[RK_FLEET_DET_LOGREG_BEST_F1]));
    json_object_set_new(j, "logreg", jl);
    json_object_set_new(jh, "below", json_integer(d->health_below));
    json_object_set_new(jh, "val", rk_fleet_metrics_json(&d->val[RK_FLEET_DET_HEALTH]));
    json_object_set_new(j, "health_score", jh);
    if (t->dataset)
        json_object_set_new(jt, "dataset", json_string(t->dataset));
    json_object_set_new(jt, "seed", json_integer((json_int_t)t->seed));
    json_object_set_new(jt, "hidden", json_integer(t->hidden));
    json_object_set_new(jt, "attn", json_integer(t->attn));
    json_object_set_new(jt, "dense", json_integer(t->dense));
    json_object_set_new(jt, "near", json_integer(t->near));
    json_object_set_new(jt, "negatives", json_real(t->negatives));
    json_object_set_new(jt, "hard", json_real(t->hard));
    json_object_set_new(jt, "level_noise", json_real(t->level_noise));
    json_object_set_new(jt, "dropout", json_real(t->dropout));
    json_object_set_new(jt, "max_epochs", json_integer(t->max_epochs));
    json_object_set_new(jt, "patience", json_integer(t->patience));
    json_object_set_new(jt, "epochs", json_integer(t->epochs));
    json_object_set_new(jt, "best_epoch", json_integer(t->best_epoch));
    json_object_set_new(jt, "val_ap", json_real(t->val_ap));
    json_object_set_new(jt, "seconds", json_real(t->seconds));
    json_object_set_new(j, "training", jt);
    return j;
}

int rk_fleet_detectors_save(const rk_fleet_detectors *d, const char *path, rk_err *err)
{
    if (d->lr.d != RK_FLEET_SUMMARY || !d->lr.w || !d->lr.mean || !d->lr.std)
        return rk_err_set(err, RK_EINVAL, "%s: the baseline has %d inputs, expected %d", path,
                          d->lr.d, RK_FLEET_SUMMARY);
    json_t *j = rk_fleet_detectors_json(d);
    char *text = j ? json_dumps(j, JSON_INDENT(1) | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!text)
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
    int rc = rk_file_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

void rk_fleet_detectors_free(rk_fleet_detectors *d)
{
    if (d)
        rk_logreg_free(&d->lr);
}

static int parse_detectors(rk_fleet_detectors *d, json_t *j, const char *path, rk_err *err)
{
    json_t *fmt = json_object_get(j, "format"), *jl = json_object_get(j, "logreg");
    json_t *jp = json_object_get(j, "predictor");
    json_t *w = json_object_get(jl, "w"), *mu = json_object_get(jl, "mean"),
           *sd = json_object_get(jl, "std");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), FORMAT) ||
        !json_is_integer(json_object_get(j, "window")) ||
        !json_is_integer(json_object_get(j, "horizon")) ||
        !json_is_number(json_object_get(jp, "threshold")) ||
        !json_is_number(json_object_get(jl, "threshold")) ||
        !json_is_number(json_object_get(jl, "threshold_best_f1")) ||
        !json_is_number(json_object_get(jl, "b")) || json_array_size(w) != RK_FLEET_SUMMARY ||
        json_array_size(mu) != RK_FLEET_SUMMARY || json_array_size(sd) != RK_FLEET_SUMMARY)
        return rk_err_set(err, RK_EFORMAT, "%s: not the detectors file of rk predict train", path);
    json_int_t win = json_integer_value(json_object_get(j, "window"));
    json_int_t hor = json_integer_value(json_object_get(j, "horizon"));
    if (win < 1 || win > RK_PRED_MAX_WINDOW || hor < 1 || hor > 1440)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: window %lld or horizon %lld out of range "
                          "(1..%d, 1..1440)",
                          path, (long long)win, (long long)hor, RK_PRED_MAX_WINDOW);
    d->window = (int)win;
    d->horizon = (int)hor;
    d->threshold = json_number_value(json_object_get(jp, "threshold"));
    d->lr_threshold = json_number_value(json_object_get(jl, "threshold"));
    d->lr_threshold_best_f1 = json_number_value(json_object_get(jl, "threshold_best_f1"));
    rk_logreg *lr = &d->lr;
    lr->d = RK_FLEET_SUMMARY;
    lr->w = malloc(RK_FLEET_SUMMARY * sizeof *lr->w);
    lr->mean = malloc(RK_FLEET_SUMMARY * sizeof *lr->mean);
    lr->std = malloc(RK_FLEET_SUMMARY * sizeof *lr->std);
    if (!lr->w || !lr->mean || !lr->std)
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
    lr->b = (float)json_number_value(json_object_get(jl, "b"));
    if (!isfinite(lr->b))
        return rk_err_set(err, RK_EFORMAT, "%s: logreg b is not a finite float", path);
    for (int k = 0; k < RK_FLEET_SUMMARY; k++) {
        json_t *a = json_array_get(w, (size_t)k), *b = json_array_get(mu, (size_t)k),
               *s = json_array_get(sd, (size_t)k);
        if (!json_is_number(a) || !json_is_number(b) || !json_is_number(s))
            return rk_err_set(err, RK_EFORMAT, "%s: logreg value %d is not a number", path, k);
        lr->w[k] = (float)json_number_value(a);
        lr->mean[k] = (float)json_number_value(b);
        lr->std[k] = (float)json_number_value(s);
        if (!isfinite(lr->w[k]) || !isfinite(lr->mean[k]) || !(lr->std[k] > 0) ||
            !isfinite(lr->std[k]))
            return rk_err_set(err, RK_EFORMAT,
                              "%s: logreg value %d is not a finite float (std > 0)", path, k);
    }
    return RK_OK;
}

int rk_fleet_detectors_parse(rk_fleet_detectors *d, const char *text, size_t len, const char *name,
                             rk_err *err)
{
    memset(d, 0, sizeof *d);
    int rc = RK_OK;
    json_t *j = rk_pred_json_text(text, len, name, &rc, err);
    if (!j)
        return rc;
    rc = parse_detectors(d, j, name, err);
    json_decref(j);
    if (rc)
        rk_fleet_detectors_free(d);
    return rc;
}

int rk_fleet_detectors_load(rk_fleet_detectors *d, const char *path, rk_err *err)
{
    memset(d, 0, sizeof *d);
    int rc = RK_OK;
    json_t *j = rk_pred_json_file(path, "rk predict train writes it beside the model", &rc, err);
    if (!j)
        return rc;
    rc = parse_detectors(d, j, path, err);
    json_decref(j);
    if (rc)
        rk_fleet_detectors_free(d);
    return rc;
}
