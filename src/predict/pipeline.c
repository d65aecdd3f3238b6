/*
 * The fleet pipelines (predict/pipeline.h): rk predict train's dataset -> windows -> predictor
 * and baseline -> thresholds -> model and detectors file, and rk predict eval's judging of
 * the four detectors. Only calls into the modules of src/predict; no I/O of its own.
 */
#include "predict/pipeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "predict/logreg.h"
#include "rekindle/health.h"

void rk_fleet_train_opts_default(rk_fleet_train_opts *o)
{
    const rk_pred_config cfg = RK_PRED_CONFIG_DEFAULT;
    const rk_pred_train_opts to = RK_PRED_TRAIN_OPTS_DEFAULT;
    const rk_fleet_sample_opts so = RK_FLEET_SAMPLE_OPTS_DEFAULT;
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->model = cfg;
    o->train = to;
    o->train.max_epochs = 15;
    o->train.patience = 3;
    o->train.dropout = 0.2f;
    o->train.level_noise = 0.5f;
    o->sample = so;
    o->sample.near = -1;
    o->hard = 1.0;
    o->min_lead = 35;
}

void rk_fleet_train_report_free(rk_fleet_train_report *r)
{
    if (!r)
        return;
    rk_fleet_detectors_free(&r->det);
    memset(r, 0, sizeof *r);
}

/* The predictor's epochs are judged by average precision on the validation windows: the
 * weighted loss keeps rising as the model grows sure of itself near the horizon's edge while
 * its ranking, which the alarms depend on, still improves. rk_pred_train minimises its
 * judge, so the judge is minus the average precision; val_ap is the sign turned back. */
typedef struct ap_judge {
    const rk_fleet_windows *va;
    float *p;
    const rk_fleet_train_opts *o;
} ap_judge;

static int ap_score(const rk_pred_model *m, void *ctx, double *score, rk_err *err)
{
    ap_judge *j = ctx;
    int rc = rk_pred_predict(m, j->va->x, j->va->n, j->p, err);
    if (rc)
        return rc;
    *score = -rk_fleet_average_precision(j->p, j->va->y, j->va->n);
    return RK_OK;
}

static void ap_epoch(const rk_pred_epoch *e, void *ctx)
{
    const ap_judge *j = ctx;
    const rk_fleet_epoch fe = {e->epoch, e->train_loss, -e->val_loss, e->best, e->seconds};
    j->o->on_epoch(&fe, j->o->ctx);
}

/* Hard negatives: the windows a first logistic regression on tr and va rates riskiest among
 * the other negatives (benign look-alikes, mostly), appended to both. */
static int mine_hard(const rk_fleet *fl, const rk_fleet_sample_opts *so,
                     const rk_fleet_sample_opts *vo, double hard, const rk_logreg_opts *lo,
                     rk_fleet_windows *tr, rk_fleet_windows *va, rk_err *err)
{
    const int T = so->window;
    rk_logreg lr = {0};
    float **risk[2] = {NULL, NULL};
    float *str = rk_fleet_summaries(tr, T), *sva = rk_fleet_summaries(va, T);
    int rc;
    if (!str || !sva)
        rc = rk_err_set(err, RK_ENOMEM, "out of memory for window summaries");
    else if (!(rc = rk_logreg_train(&lr, RK_FLEET_SUMMARY, str, tr->y, tr->n, sva, va->y, va->n, lo,
                                    err)) &&
             !(rc = rk_fleet_risk_logreg(fl, RK_FLEET_TRAIN, &lr, T, &risk[0], err)) &&
             !(rc = rk_fleet_mine(fl, RK_FLEET_TRAIN, so, risk[0],
                                  (size_t)llround(hard * (double)tr->positives), tr, err)) &&
             !(rc = rk_fleet_risk_logreg(fl, RK_FLEET_VAL, &lr, T, &risk[1], err)))
        rc = rk_fleet_mine(fl, RK_FLEET_VAL, vo, risk[1],
                           (size_t)llround(hard * (double)va->positives), va, err);
    for (int k = 0; k < 2; k++)
        rk_fleet_risk_free(fl, risk[k]);
    rk_logreg_free(&lr);
    free(str);
    free(sva);
    return rc;
}

/* The thresholds, chosen by event-level F1 on every minute of the val split, into d. */
static int pick_thresholds(const rk_fleet *fl, const rk_pred_model *m, rk_fleet_detectors *d,
                           rk_err *err)
{
    float **risk[3] = {NULL, NULL, NULL};
    double pc[RK_FLEET_PROB_CANDS];
    rk_fleet_prob_candidates(pc);
    const int T = d->window, H = d->horizon, V = RK_FLEET_VAL;
    rk_fleet_metrics *best = d->val;
    int rc;
    if (!(rc = rk_fleet_risk_model(fl, V, m, &risk[0], err)) &&
        !(rc = rk_fleet_risk_logreg(fl, V, &d->lr, T, &risk[1], err)) &&
        !(rc = rk_fleet_risk_score(fl, V, T, &risk[2], err)) &&
        !(rc = rk_fleet_pick_threshold(fl, V, risk[0], T, H, pc, RK_FLEET_PROB_CANDS, d->min_lead,
                                       &best[RK_FLEET_DET_PREDICTOR], err)) &&
        !(rc = rk_fleet_pick_threshold(fl, V, risk[1], T, H, pc, RK_FLEET_PROB_CANDS, d->min_lead,
                                       &best[RK_FLEET_DET_LOGREG], err)) &&
        !(rc = rk_fleet_pick_threshold(fl, V, risk[1], T, H, pc, RK_FLEET_PROB_CANDS, 0,
                                       &best[RK_FLEET_DET_LOGREG_BEST_F1], err)))
        rc = rk_fleet_evaluate(fl, V, risk[2], T, H, rk_fleet_score_threshold(d->health_below),
                               &best[RK_FLEET_DET_HEALTH], err);
    for (int k = 0; k < 3; k++)
        rk_fleet_risk_free(fl, risk[k]);
    d->threshold = best[RK_FLEET_DET_PREDICTOR].threshold;
    d->lr_threshold = best[RK_FLEET_DET_LOGREG].threshold;
    d->lr_threshold_best_f1 = best[RK_FLEET_DET_LOGREG_BEST_F1].threshold;
    return rc;
}

int rk_fleet_train(const rk_fleet_train_opts *o, rk_fleet_train_report *r, rk_err *err)
{
    memset(r, 0, sizeof *r);
    rk_pred_config cfg = o->model;
    rk_pred_train_opts to = o->train;
    rk_fleet_sample_opts so = o->sample;
    cfg.features = RK_FLEET_FEATURES;
    cfg.task = RK_PRED_CLASSIFY;
    cfg.seed = o->seed;
    cfg.horizon_min = so.horizon; /* recorded in the model file */
    to.seed = o->seed;
    so.window = cfg.window;
    so.seed = o->seed;
    if (so.near < 0)
        so.near = 2 * so.horizon;
    rk_fleet_detectors *d = &r->det;
    d->window = cfg.window;
    d->horizon = so.horizon;
    d->min_lead = o->min_lead;
    d->health_below = RK_HEALTH_THRESHOLD_DEFAULT;

    rk_fleet fl;
    rk_fleet_windows tr = {0}, va = {0};
    rk_pred_model *m = NULL;
    rk_pred_report rep = {0};
    char *side = NULL;
    float *str = NULL, *sva = NULL;
    int rc = rk_fleet_load(&fl, o->dir, 1u << RK_FLEET_TRAIN | 1u << RK_FLEET_VAL, err);
    if (rc)
        return rc;
    const double t0 = rk_mono_s();
    rk_fleet_sample_opts vo = so;
    vo.seed = o->seed + 1;
    rk_logreg_opts lo = RK_LOGREG_OPTS_DEFAULT;
    lo.seed = o->seed;
    if ((rc = rk_fleet_sample(&fl, RK_FLEET_TRAIN, &so, &tr, err)) ||
        (rc = rk_fleet_sample(&fl, RK_FLEET_VAL, &vo, &va, err)) ||
        (o->hard > 0 && (rc = mine_hard(&fl, &so, &vo, o->hard, &lo, &tr, &va, err))))
        goto out;
    r->train_windows = tr.n;
    r->train_positives = tr.positives;
    r->val_windows = va.n;
    r->val_positives = va.positives;
    r->windows_seconds = rk_mono_s() - t0;
    if (o->on_stage)
        o->on_stage(RK_FLEET_STAGE_WINDOWS, r, o->ctx);

    if ((rc = rk_pred_create(&m, &cfg, err)))
        goto out;
    ap_judge judge = {&va, malloc((va.n ? va.n : 1) * sizeof(float)), o};
    if (!judge.p) {
        rc = rk_err_set(err, RK_ENOMEM, "out of memory");
        goto out;
    }
    to.val_score = ap_score;
    to.on_epoch = o->on_epoch ? ap_epoch : NULL;
    to.ctx = &judge;
    rk_pred_data dtr = {tr.n, tr.x, tr.y}, dva = {va.n, va.x, va.y};
    rc = rk_pred_train(m, &dtr, &dva, &to, &rep, err);
    free(judge.p);
    if (rc)
        goto out;
    rk_fleet_training *t = &d->training;
    *t = (rk_fleet_training){.dataset = o->dir,
                             .seed = o->seed,
                             .hidden = cfg.hidden,
                             .attn = cfg.attn,
                             .dense = cfg.dense,
                             .near = so.near,
                             .max_epochs = to.max_epochs,
                             .patience = to.patience,
                             .negatives = so.neg_ratio,
                             .hard = o->hard,
                             .level_noise = to.level_noise,
                             .dropout = to.dropout,
                             .epochs = rep.epochs,
                             .best_epoch = rep.best_epoch,
                             .val_ap = -rep.best_val_loss};
    r->predictor_seconds = rep.seconds;
    if (o->on_stage)
        o->on_stage(RK_FLEET_STAGE_PREDICTOR, r, o->ctx);

    /* the baseline on the same windows */
    str = rk_fleet_summaries(&tr, cfg.window);
    sva = rk_fleet_summaries(&va, cfg.window);
    if (!str || !sva) {
        rc = rk_err_set(err, RK_ENOMEM, "out of memory for window summaries");
        goto out;
    }
    if ((rc =
             rk_logreg_train(&d->lr, RK_FLEET_SUMMARY, str, tr.y, tr.n, sva, va.y, va.n, &lo, err)))
        goto out;
    rk_fleet_windows_free(&tr);
    rk_fleet_windows_free(&va);
    if ((rc = pick_thresholds(&fl, m, d, err)) || (rc = rk_pred_save(m, o->out, err)))
        goto out;
    side = rk_fleet_detectors_path(o->out);
    if (!side) {
        rc = rk_err_set(err, RK_ENOMEM, "out of memory");
        goto out;
    }
    t->seconds = rk_mono_s() - t0;
    rc = rk_fleet_detectors_save(d, side, err);
out:
    free(side);
    free(str);
    free(sva);
    rk_pred_free(m);
    rk_fleet_windows_free(&tr);
    rk_fleet_windows_free(&va);
    rk_fleet_free(&fl);
    if (rc)
        rk_fleet_train_report_free(r);
    return rc;
}

void rk_fleet_eval_opts_default(rk_fleet_eval_opts *o)
{
    memset(o, 0, sizeof *o);
    o->split = RK_FLEET_TEST;
    o->threshold = -1;
}

int rk_fleet_eval(const rk_fleet_eval_opts *o, rk_fleet_eval_report *r, rk_err *err)
{
    memset(r, 0, sizeof *r);
    rk_pred_model *m = NULL;
    rk_fleet fl = {0};
    float **risk[3] = {NULL, NULL, NULL};
    const double t0 = rk_mono_s();
    rk_fleet_detectors det = {0};
    char *side = rk_fleet_detectors_path(o->model);
    int rc = side ? rk_fleet_detectors_load(&det, side, err)
                  : rk_err_set(err, RK_ENOMEM, "out of memory");
    free(side);
    if (rc)
        return rc;
    const int window = det.window, horizon = det.horizon, split = o->split;
    double th[RK_FLEET_DETECTORS];
    th[RK_FLEET_DET_PREDICTOR] = o->threshold >= 0 ? o->threshold : det.threshold;
    th[RK_FLEET_DET_LOGREG] = det.lr_threshold;
    th[RK_FLEET_DET_HEALTH] = rk_fleet_score_threshold(RK_HEALTH_THRESHOLD_DEFAULT);
    th[RK_FLEET_DET_LOGREG_BEST_F1] = det.lr_threshold_best_f1;
    if ((rc = rk_pred_load(&m, o->model, err)))
        goto out;
    if (rk_pred_config_of(m)->window != window) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: a window of %d minutes, its detectors file says %d",
                        o->model, rk_pred_config_of(m)->window, window);
        goto out;
    }
    if ((rc = rk_fleet_load(&fl, o->dir, 1u << split, err)) ||
        (rc = rk_fleet_risk_model(&fl, split, m, &risk[0], err)) ||
        (rc = rk_fleet_risk_logreg(&fl, split, &det.lr, window, &risk[1], err)) ||
        (rc = rk_fleet_risk_score(&fl, split, window, &risk[2], err)))
        goto out;
    /* the logistic regression at the same operating rule as the predictor (the best val F1 with
     * the required mean lead) and at its own best val F1 whatever the lead */
    for (int k = 0; k < RK_FLEET_DETECTORS && !rc; k++)
        rc = rk_fleet_evaluate(&fl, split, risk[k == RK_FLEET_DET_LOGREG_BEST_F1 ? 1 : k], window,
                               horizon, th[k], &r->m[k], err);
    r->window = window;
    r->horizon = horizon;
    r->seconds = rk_mono_s() - t0;
out:
    for (int k = 0; k < 3; k++)
        rk_fleet_risk_free(&fl, risk[k]);
    rk_fleet_free(&fl);
    rk_pred_free(m);
    rk_fleet_detectors_free(&det);
    return rc;
}
