/*
 * rk plan's fleet file, failure models by name and the question it answers (plan/fleet.h,
 * docs/plan.md). The fleet reader bounds the file and every line before it reads them; the
 * answer is the simulator's estimates and sweeps (sim.c) and the arithmetic of money.
 */
#include "plan/fleet.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "rekindle/fileio.h"

/* A number: digits, an optional fraction and exponent, finite, in [lo, hi]. No hex, no inf,
 * no leading '+' or spaces. */
static int number(const char *s, double lo, double hi, double *out)
{
    if (!*s || strspn(s, "0123456789.eE-+") != strlen(s) ||
        !(isdigit((unsigned char)s[0]) || s[0] == '.'))
        return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !isfinite(v) || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

static int fleet_field(rk_plan_card *k, const char *key, const char *val, const char *name,
                       int line, int *seen, rk_err *err)
{
    static const struct {
        const char *key;
        double lo, hi;
        size_t off;
    } fields[] = {
        {"hours", 0, 1e6, offsetof(rk_plan_card, hours)},
        {"score", 0, 100, offsetof(rk_plan_card, score)},
        {"watts", 0, 1e5, offsetof(rk_plan_card, watts)},
        {"price", 0, 1e9, offsetof(rk_plan_card, price)},
        {"tflops", 1e-6, 1e6, offsetof(rk_plan_card, tflops)},
    };
    if (!strcmp(key, "model")) {
        size_t n = strlen(val);
        if (n == 0 || n > RK_PLAN_MODEL_MAX ||
            strspn(val, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+-") != n)
            return rk_err_set(err, RK_EFORMAT,
                              "%s:%d: model must be 1 to %d of A-Z a-z 0-9 . _ + -", name, line,
                              RK_PLAN_MODEL_MAX);
        memcpy(k->model, val, n + 1);
        *seen |= 1;
        return RK_OK;
    }
    if (!strcmp(key, "count")) {
        double v;
        if (!number(val, 1, 1e6, &v) || v != floor(v))
            return rk_err_set(err, RK_EFORMAT, "%s:%d: count must be a whole number in [1, 1e6]",
                              name, line);
        k->count = (unsigned)v;
        *seen |= 2;
        return RK_OK;
    }
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!strcmp(key, fields[i].key)) {
            double *dst = (double *)((char *)k + fields[i].off);
            if (!number(val, fields[i].lo, fields[i].hi, dst))
                return rk_err_set(err, RK_EFORMAT, "%s:%d: %s must be a number in [%g, %g]", name,
                                  line, key, fields[i].lo, fields[i].hi);
            return RK_OK;
        }
    return rk_err_set(err, RK_EFORMAT,
                      "%s:%d: unknown field (model, count, hours, score, watts, price, tflops)",
                      name, line);
}

int rk_plan_fleet_parse(const char *text, size_t len, const char *name, rk_plan_fleet *out,
                        rk_err *err)
{
    memset(out, 0, sizeof *out);
    char buf[RK_PLAN_FLEET_LINE_MAX + 1];
    size_t pos = 0;
    int line = 0, hosts_seen = 0;
    if (len > RK_PLAN_FLEET_MAX_BYTES)
        return rk_err_set(err, RK_EFORMAT, "%s: larger than %d bytes", name,
                          RK_PLAN_FLEET_MAX_BYTES);
    if (memchr(text, 0, len))
        return rk_err_set(err, RK_EFORMAT, "%s: holds a NUL byte (not a text file)", name);
    while (pos < len) {
        line++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
        if (n > RK_PLAN_FLEET_LINE_MAX)
            return rk_err_set(err, RK_EFORMAT, "%s:%d: line longer than %d bytes", name, line,
                              RK_PLAN_FLEET_LINE_MAX);
        memcpy(buf, text + pos, n);
        buf[n] = 0;
        pos += n + (nl != NULL);
        if (n && buf[n - 1] == '\r')
            buf[--n] = 0;
        char *hash = strchr(buf, '#');
        if (hash)
            *hash = 0;
        char *save = NULL, *word = strtok_r(buf, " \t", &save);
        if (!word)
            continue;
        if (!strcmp(word, "hosts")) {
            char *v = strtok_r(NULL, " \t", &save);
            double h;
            if (hosts_seen)
                return rk_err_set(err, RK_EFORMAT, "%s:%d: a second hosts line", name, line);
            if (!v || strtok_r(NULL, " \t", &save) || !number(v, 1, 1e6, &h) || h != floor(h))
                return rk_err_set(err, RK_EFORMAT,
                                  "%s:%d: hosts needs one whole number in [1, 1e6]", name, line);
            out->hosts = (unsigned)h;
            hosts_seen = 1;
            continue;
        }
        if (strcmp(word, "card"))
            return rk_err_set(err, RK_EFORMAT, "%s:%d: a line starts with hosts or card", name,
                              line);
        if (out->n == RK_PLAN_FLEET_MAX_CARDS)
            return rk_err_set(err, RK_EFORMAT, "%s:%d: more than %d card lines", name, line,
                              RK_PLAN_FLEET_MAX_CARDS);
        rk_plan_card *k = &out->cards[out->n];
        *k = (rk_plan_card){.score = 100, .tflops = 1};
        int seen = 0, r;
        while ((word = strtok_r(NULL, " \t", &save))) {
            char *eq = strchr(word, '=');
            if (!eq)
                return rk_err_set(err, RK_EFORMAT, "%s:%d: a card's fields are key=value", name,
                                  line);
            *eq = 0;
            if ((r = fleet_field(k, word, eq + 1, name, line, &seen, err)))
                return r;
        }
        if (seen != 3)
            return rk_err_set(err, RK_EFORMAT, "%s:%d: a card needs model= and count=", name, line);
        out->n++;
    }
    if (!hosts_seen || out->n == 0)
        return rk_err_set(err, RK_EFORMAT, "%s: needs a hosts line and at least one card line",
                          name);
    double gpus = 0;
    for (size_t i = 0; i < out->n; i++) {
        const rk_plan_card *k = &out->cards[i];
        gpus += k->count;
        out->tflops += k->count * k->tflops;
        out->watts += k->count * k->watts;
        out->price += k->count * k->price;
        out->hours_mean += k->count * k->hours;
        out->score_mean += k->count * k->score;
    }
    if (gpus > 1e7)
        return rk_err_set(err, RK_EFORMAT, "%s: more than 10,000,000 cards", name);
    out->gpus = (unsigned)gpus;
    out->hours_mean /= gpus;
    out->score_mean /= gpus;
    if (out->gpus % out->hosts)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: %u cards do not divide evenly among %u hosts (the simulator "
                          "gives every host as many)",
                          name, out->gpus, out->hosts);
    return RK_OK;
}

int rk_plan_fleet_load(const char *path, rk_plan_fleet *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    uint8_t *buf;
    size_t len;
    int r = rk_file_read_all(path, &buf, &len, RK_PLAN_FLEET_MAX_BYTES, err);
    if (r)
        return r;
    r = rk_plan_fleet_parse((const char *)buf, len, path, out, err);
    free(buf);
    return r;
}

/* ---- an rk run summary ------------------------------------------------------------------------
 */

static int json_num(json_t *o, const char *key, double lo, double hi, double *out, int required,
                    const char *name, rk_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return rk_err_set(err, RK_EFORMAT, "%s: no %s (an rk run --summary-json file?)", name,
                              key);
        return 1;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < lo ||
        json_number_value(v) > hi)
        return rk_err_set(err, RK_EFORMAT, "%s: %s must be a number in [%g, %g]", name, key, lo,
                          hi);
    *out = json_number_value(v);
    return 0;
}

int rk_plan_summary_parse(const char *text, size_t len, const char *name, double detect_s,
                          rk_plan_measured *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        char tb[JSON_ERROR_TEXT_LENGTH];
        return rk_err_set(err, RK_EFORMAT, "%s: line %d: %s", name, je.line,
                          rk_msg_parser_text(tb, sizeof tb, je.text));
    }
    int r = RK_OK;
    double prod = 0, steps = 0, rec = 0, peak = 0, ranks = 0;
    if (!json_is_object(o)) {
        r = rk_err_set(err, RK_EFORMAT, "%s: not a JSON object", name);
        goto done;
    }
    if ((r = json_num(o, "productive_s", 0, 1e10, &prod, 1, name, err)) ||
        (r = json_num(o, "steps", 0, 1e15, &steps, 1, name, err)))
        goto done;
    if (!(prod > 0) || !(steps > 0)) {
        r = rk_err_set(err, RK_EFORMAT, "%s: no productive steps to time a step by", name);
        goto done;
    }
    out->step_s = prod / steps;
    int miss = json_num(o, "recovery_median_s", 0, 1e6, &rec, 0, name, err);
    if (miss < 0) {
        r = miss;
        goto done;
    }
    if (!miss) {
        out->restart_s = rec > detect_s ? rec - detect_s : 0;
        out->has_restart = 1;
    }
    json_t *mode = json_object_get(o, "recovery");
    out->mode = RK_PLAN_DISK;
    if (mode && !json_is_null(mode)) {
        const char *m = json_is_string(mode) ? json_string_value(mode) : "";
        if (!strcmp(m, "memory"))
            out->mode = RK_PLAN_MEMORY;
        else if (strcmp(m, "disk")) {
            r = rk_err_set(err, RK_EFORMAT, "%s: recovery must be \"memory\" or \"disk\"", name);
            goto done;
        }
    }
    int m1 = json_num(o, "snapshot_bytes_peak", 0, 1e15, &peak, 0, name, err);
    int m2 = json_num(o, "final_ranks", 1, 1e7, &ranks, 0, name, err);
    if (m1 < 0 || m2 < 0) {
        r = m1 < 0 ? m1 : m2;
        goto done;
    }
    if (!m1 && !m2 && peak > 0) {
        out->state_bytes = peak / (2 * ranks);
        out->has_state = 1;
    }
done:
    json_decref(o);
    return r;
}

int rk_plan_summary_load(const char *path, double detect_s, rk_plan_measured *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    uint8_t *buf;
    size_t len;
    int r = rk_file_read_all(path, &buf, &len, RK_PLAN_SUMMARY_MAX_BYTES, err);
    if (r)
        return r;
    r = rk_plan_summary_parse((const char *)buf, len, path, detect_s, out, err);
    free(buf);
    return r;
}

/* ---- failure models by name ------------------------------------------------------------------ */

/* The share of interruptions that take a host out (hardware), the rest crashes: Llama 3's 78 %
 * (A. Grattafiori et al., "The Llama 3 Herd of Models", 2024, sec. 3.3.4). */
#define HW_SHARE 0.78

/* GPU failures at rate_per_gpu (per second), split: hardware -> host losses, the rest crashes. */
static void split_rate(rk_plan_config *c, double rate_per_gpu)
{
    c->gpu =
        (rk_plan_law){.dist = RK_PLAN_EXPONENTIAL, .mtbf_s = 1 / (rate_per_gpu * (1 - HW_SHARE))};
    c->mix[0] = 1, c->mix[1] = 0, c->mix[2] = 0;
    c->host = (rk_plan_law){.dist = RK_PLAN_EXPONENTIAL,
                            .mtbf_s = 1 / (rate_per_gpu * HW_SHARE * c->gpus_per_host)};
}

int rk_plan_failures_set(rk_plan_config *c, const char *spec, double age_s, rk_err *err)
{
    c->gpu = c->host = (rk_plan_law){0};
    if (!strcmp(spec, "none"))
        return RK_OK;
    if (!strcmp(spec, "llama3")) { /* 419 unexpected interruptions, 54 days, 16,384 GPUs */
        split_rate(c, 419.0 / (16384 * 54 * 86400.0));
        return RK_OK;
    }
    if (!strcmp(spec, "meta-rsc")) { /* MTTF 7.9 h at 1,024 GPUs (Kokolis et al., 2024) */
        split_rate(c, 1.0 / (7.9 * 3600 * 1024));
        return RK_OK;
    }
    if (!strcmp(spec, "stepfun")) { /* one fault per ~238 node-days; repairs as the trace's */
        c->host = (rk_plan_law){.dist = RK_PLAN_EXPONENTIAL, .mtbf_s = 238 * 86400.0};
        return RK_OK;
    }
    double a, b;
    char tail[64];
    if (!strncmp(spec, "exp:", 4) && number(spec + 4, 1e-3, 1e12, &a)) {
        c->gpu = (rk_plan_law){.dist = RK_PLAN_EXPONENTIAL, .mtbf_s = a};
        return RK_OK;
    }
    if (!strncmp(spec, "weibull:", 8) && strlen(spec + 8) < sizeof tail) {
        strcpy(tail, spec + 8);
        char *comma = strchr(tail, ',');
        if (comma) {
            *comma = 0;
            if (number(tail, 1e-3, 100, &a) && number(comma + 1, 1e-3, 1e12, &b)) {
                c->gpu = (rk_plan_law){
                    .dist = RK_PLAN_WEIBULL, .shape = a, .scale_s = b, .age_s = age_s};
                return RK_OK;
            }
        }
    }
    return rk_err_set(err, RK_EINVAL,
                      "failure model '%.64s' is none of llama3, meta-rsc, stepfun, "
                      "stepfun-trace, exp:SECONDS, weibull:SHAPE,SCALE_SECONDS, none",
                      spec);
}

static double law_mean(const rk_plan_law *l)
{
    switch (l->dist) {
    case RK_PLAN_EXPONENTIAL: return l->mtbf_s;
    case RK_PLAN_WEIBULL: return l->scale_s * tgamma(1 + 1 / l->shape);
    default: return INFINITY;
    }
}

double rk_plan_job_mtbf(const rk_plan_config *c)
{
    double rate = (double)c->hosts * c->gpus_per_host / law_mean(&c->gpu) +
                  (double)c->hosts / law_mean(&c->host);
    if (c->trace_len && c->trace) {
        double span = c->trace[c->trace_len - 1].start_s;
        if (span > 0)
            rate += c->trace_len / span;
    }
    return rate > 0 ? 1 / rate : INFINITY;
}

/* ---- the answer --------------------------------------------------------------------------------
 */

static double cost_per_msample(const rk_plan_money *m, const rk_plan_stats *st)
{
    double wall = st->wall_mean_s;
    double samples = st->goodput_mean * wall * m->samples_per_s;
    if (!(samples > 0))
        return INFINITY;
    double dollars = m->price * wall / (m->years * 365.25 * 86400) +
                     m->watts / 1000 * wall / 3600 * m->kwh_price;
    return dollars / samples * 1e6;
}

static int money_check(const rk_plan_money *m, rk_err *err)
{
    if (!(m->years > 0) || !isfinite(m->years) || !(m->kwh_price >= 0) || !isfinite(m->kwh_price) ||
        !(m->samples_per_s > 0) || !isfinite(m->samples_per_s) || !(m->price >= 0) ||
        !(m->watts >= 0))
        return rk_err_set(err, RK_EINVAL,
                          "plan: years and samples/s must be > 0, prices and power >= 0");
    return RK_OK;
}

int rk_plan_answer_query(const rk_plan_query *q, rk_plan_answer *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    if (q->runs < 1 || q->runs > 10000)
        return rk_err_set(err, RK_EINVAL, "plan: runs must be in [1, 10000]");
    if (q->spares_max > RK_PLAN_SPARES_MAX)
        return rk_err_set(err, RK_EINVAL, "plan: at most %d spare hosts swept", RK_PLAN_SPARES_MAX);
    int r = money_check(&q->money, err);
    if (r || (q->has_new && (r = money_check(&q->new_money, err))))
        return r;
    const rk_plan_config *c = &q->config;
    if ((r = rk_plan_estimate(c, q->seed, q->runs, &out->stats, err)))
        return r;
    out->mtbf_s = rk_plan_job_mtbf(c);
    out->cost_per_msample = cost_per_msample(&q->money, &out->stats);
    if (q->sweep_ckpt) {
        double mid = c->ckpt_every_s;
        if ((r = rk_plan_best_interval(c, 0, mid / 4, mid * 4, 13, q->seed, q->runs, NULL, NULL,
                                       &out->ckpt, err)))
            return r;
    }
    if (q->sweep_snap) {
        double mid = c->snap_every_s;
        if ((r = rk_plan_best_interval(c, 1, mid / 4, mid * 4, 13, q->seed, q->runs, NULL, NULL,
                                       &out->snap, err)))
            return r;
    }
    if (q->spares_max) {
        rk_plan_config k = *c;
        for (unsigned s = 0; s <= q->spares_max; s++) {
            rk_plan_stats st;
            k.spare_hosts = s;
            if ((r = rk_plan_estimate(&k, q->seed, q->runs, &st, err)))
                return r;
            out->spares_goodput[s] = st.goodput_mean;
        }
        out->spares_n = q->spares_max + 1;
    }
    if (q->has_new) {
        if ((r = rk_plan_estimate(&q->new_config, q->seed, q->runs, &out->new_stats, err)))
            return r;
        out->new_cost_per_msample = cost_per_msample(&q->new_money, &out->new_stats);
    }
    return RK_OK;
}
