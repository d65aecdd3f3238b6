/*
 * rk report's reading of a run directory (read.h): each file line by line through the
 * supervisor's line formats (events.h, runlog.h), a piece at a time so the memory used does
 * not grow with the files, into what is kept of them. Relies on jansson and base/text.h's
 * cleaning of untrusted text.
 */
#include "report/read.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/text.h"

/* Offer one item: copied into its place (the oldest of the last ones gives way). */
static int keeper_add(keeper *k, const void *item)
{
    size_t head = k->cap / 2, ring = k->cap - head, at;
    if (k->seen < k->cap) {
        at = (size_t)k->seen;
        if (at == k->alloc) {
            size_t c = k->alloc ? 2 * k->alloc : 16;
            c = c < k->cap ? c : k->cap;
            void *q = realloc(k->a, c * k->size);
            if (!q)
                return RK_ENOMEM;
            k->a = q;
            k->alloc = c;
        }
    } else {
        at = head + (size_t)((k->seen - head) % ring);
    }
    memcpy(k->a + at * k->size, item, k->size);
    k->seen++;
    return RK_OK;
}

static int sampler_add(sampler *s, const void *item)
{
    if (!s->last && !(s->last = malloc(s->size)))
        return RK_ENOMEM;
    memcpy(s->last, item, s->size);
    uint64_t k = s->seen++;
    if (!s->stride)
        s->stride = 1;
    s->last_kept = 0;
    if (k % s->stride)
        return RK_OK;
    if (s->n == s->cap) { /* keep items 0, 2, 4, ...: those at multiples of twice the stride */
        for (size_t i = 0; 2 * i < s->n; i++)
            memmove(s->a + i * s->size, s->a + 2 * i * s->size, s->size);
        s->n = (s->n + 1) / 2;
        s->stride *= 2;
        if (k % s->stride)
            return RK_OK;
    }
    if (s->n == s->alloc) {
        size_t c = s->alloc ? 2 * s->alloc : 64;
        c = c < s->cap + 1 ? c : s->cap + 1;
        void *q = realloc(s->a, c * s->size);
        if (!q)
            return RK_ENOMEM;
        s->a = q;
        s->alloc = c;
    }
    memcpy(s->a + s->n++ * s->size, item, s->size);
    s->last_kept = 1;
    return RK_OK;
}

/* The sample, with the last item at its end. */
static int sampler_finish(sampler *s)
{
    if (!s->seen || s->last_kept)
        return RK_OK;
    if (s->n == s->alloc) {
        void *q = realloc(s->a, (s->n + 1) * s->size);
        if (!q)
            return RK_ENOMEM;
        s->a = q;
        s->alloc = s->n + 1;
    }
    memcpy(s->a + s->n++ * s->size, s->last, s->size);
    s->last_kept = 1;
    return RK_OK;
}

data *rk_report_data_new(void)
{
    data *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->inc.size = d->inj.size = sizeof(ev_pt);
    d->inc.cap = d->inj.cap = RK_REPORT_KEEP_EVENTS;
    d->la.size = sizeof(launch_pt);
    d->la.cap = RK_REPORT_KEEP_LAUNCHES;
    d->st.size = sizeof(step_pt);
    d->st.cap = RK_REPORT_KEEP_STEPS;
    d->ck.size = sizeof(ckpt_pt);
    d->ck.cap = RK_REPORT_KEEP_STEPS;
    d->threshold = -1;
    return d;
}

void rk_report_data_free(data *d)
{
    if (!d)
        return;
    free(d->inc.a);
    free(d->inj.a);
    free(d->la.a);
    free(d->st.a);
    free(d->st.last);
    free(d->ck.a);
    free(d->ck.last);
    free(d->gt);
    free(d->dev);
    free(d);
}

static int grow(void **p, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return RK_OK;
    size_t c = *cap ? 2 * *cap : 64;
    void *q = realloc(*p, c * size);
    if (!q)
        return RK_ENOMEM;
    *p = q;
    *cap = c;
    return RK_OK;
}

/* The device table's index of `raw` (an id as read: cleaned of control characters first, as
 * every string the page shows), added when new. -1: more than RK_REPORT_MAX_DEVICES ids, or
 * out of memory (err says which). */
static int dev_index(data *d, const char *raw, rk_err *err)
{
    char id[RK_RUNLOG_ID_LEN];
    rk_text_clean(id, sizeof id, raw);
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 16777619u;
    size_t at = h & (DEV_SLOTS - 1);
    for (; d->devslot[at]; at = (at + 1) & (DEV_SLOTS - 1))
        if (strcmp(d->dev[d->devslot[at] - 1], id) == 0)
            return d->devslot[at] - 1;
    if (d->ndev >= RK_REPORT_MAX_DEVICES)
        return rk_err_set(err, RK_EFORMAT, "more than %d device ids", RK_REPORT_MAX_DEVICES), -1;
    if (d->ndev == d->capdev) {
        int c = d->capdev ? 2 * d->capdev : 16;
        void *q = realloc(d->dev, (size_t)c * sizeof *d->dev);
        if (!q)
            return rk_err_set(err, RK_ENOMEM, "out of memory"), -1;
        d->dev = q;
        d->capdev = c;
    }
    memcpy(d->dev[d->ndev], id, sizeof id);
    d->devslot[at] = (uint16_t)(d->ndev + 1);
    return d->ndev++;
}

typedef int (*line_fn)(data *d, const char *line, size_t len, rk_err *err);

static int on_event_line(data *d, const char *line, size_t len, rk_err *err)
{
    if (rk_event_parse(line, len, &d->ev.e, err))
        return RK_EFORMAT;
    d->t_end = fmax(d->t_end, d->ev.e.t);
    if (rk_event_is_note(d->ev.e.kind)) /* not an incident: the facts say it (summary.json) */
        return RK_OK;
    keeper *k = strcmp(d->ev.e.kind, "inject") == 0 ? &d->inj : &d->inc;
    d->ev.no = k->seen + 1;
    return keeper_add(k, &d->ev) ? rk_err_set(err, RK_ENOMEM, "out of memory") : RK_OK;
}

static int on_record_line(data *d, const char *line, size_t len, rk_err *err)
{
    rk_runlog_rec *r = &d->rec;
    if (rk_runlog_parse(line, len, r, err))
        return RK_EFORMAT;
    d->t_end = fmax(d->t_end, r->t);
    int rc = RK_OK;
    switch (r->type) {
    case RK_RUNLOG_LAUNCH: {
        launch_pt *la = &d->lrec;
        *la = (launch_pt){.t = r->t, .t_next = NAN, .launch = r->launch, .n = r->ndevices};
        for (int i = 0; i < r->ndevices; i++) {
            int k = dev_index(d, r->devices[i], err);
            if (k < 0)
                return err->code;
            la->dev[i] = (uint16_t)k;
        }
        if (keeper_n(&d->la)) /* the launch before (always kept: it is the newest) ends here */
            ((launch_pt *)keeper_get(&d->la, keeper_n(&d->la) - 1))->t_next = r->t;
        rc = keeper_add(&d->la, la);
        break;
    }
    case RK_RUNLOG_STEP: {
        step_pt p = {.t = r->t, .loss = r->loss, .dt = r->dt, .step = r->step, .launch = r->launch};
        rc = sampler_add(&d->st, &p);
        break;
    }
    case RK_RUNLOG_CKPT: {
        ckpt_pt p = {.t = r->t, .seconds = r->seconds, .step = r->step};
        rc = sampler_add(&d->ck, &p);
        break;
    }
    case RK_RUNLOG_GATE: {
        if (d->ngt >= RK_REPORT_MAX_GATE_RECORDS)
            return rk_err_set(err, RK_EFORMAT, "more than %d gate records (rk run writes no more)",
                              RK_REPORT_MAX_GATE_RECORDS);
        int k = dev_index(d, r->device, err);
        if (k < 0)
            return err->code;
        if (grow((void **)&d->gt, &d->capgt, d->ngt, sizeof *d->gt))
            return rk_err_set(err, RK_ENOMEM, "out of memory");
        d->gt[d->ngt++] = (gate_pt){
            .t = r->t, .temp = r->temperature_c, .dev = k, .score = r->score, .lost = r->lost};
        d->threshold = r->threshold;
        d->simulated |= r->simulated;
        break;
    }
    }
    return rc ? rk_err_set(err, RK_ENOMEM, "out of memory") : RK_OK;
}

/* A line of rk train's --loss-log (src/nn/train.c writes "%lld %.9g"): "STEP LOSS", the step
 * counted from 0 (steps done before it: drawn as step + 1, as steps.jsonl counts), the loss a
 * number, nan or inf. */
static int on_loss_line(data *d, const char *line, size_t len, rk_err *err)
{
    char buf[128];
    if (len >= sizeof buf)
        return rk_err_set(err, RK_EFORMAT, "not \"STEP LOSS\": longer than %zu bytes",
                          sizeof buf - 1);
    memcpy(buf, line, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    long long k = buf[0] >= '0' && buf[0] <= '9' ? strtoll(buf, &end, 10) : -1;
    if (k < 0 || errno || *end != ' ' || k >= RK_RUNLOG_MAX_STEP)
        return rk_err_set(err, RK_EFORMAT,
                          "not \"STEP LOSS\": the step is not a whole number "
                          "from 0 to 2^53");
    const char *l = end + 1;
    double loss = strtod(l, &end);
    if (end == l || *end || *l == ' ')
        return rk_err_set(err, RK_EFORMAT, "not \"STEP LOSS\": the loss is not a number");
    step_pt p = {.t = NAN,
                 .loss = isfinite(loss) && fabs(loss) < 1e300 ? loss : NAN,
                 .dt = 0,
                 .step = k + 1,
                 .launch = 0};
    return sampler_add(&d->st, &p) ? rk_err_set(err, RK_ENOMEM, "out of memory") : RK_OK;
}

/* The lines of one file, as they come: an error names the file and the line. A last line
 * without its newline that does not parse is a torn write: left out, counted. Empty lines are
 * skipped. */
typedef struct lines {
    data *d;
    const char *file;
    line_fn fn;
    long no;
} lines;

static int take_line(lines *ls, const char *p, size_t n, int last, rk_err *err)
{
    ls->no++;
    if (!n)
        return RK_OK;
    rk_err e = {0};
    if (ls->fn(ls->d, p, n, &e) == RK_OK)
        return RK_OK;
    if (last && e.code == RK_EFORMAT) { /* the writer died mid-line */
        ls->d->torn++;
        return RK_OK;
    }
    return rk_err_set(err, e.code, "%s line %ld: %s", ls->file, ls->no, e.msg);
}

/* Every line of text[0..len). */
static int each_line(lines *ls, const char *text, size_t len, rk_err *err)
{
    size_t at = 0;
    while (at < len) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
        int rc = take_line(ls, text + at, n, !nl, err);
        if (rc)
            return rc;
        at += n + (nl ? 1 : 0);
    }
    return RK_OK;
}

/* Every line of the file open as fd (opened by rk_file_open_read with max), read a piece at
 * a time: the memory used is the piece, whatever the file's size. A line longer than the
 * piece is longer than every reader takes: the reader's error, or torn if it is the last. */
#define READ_PIECE ((size_t)1 << 20)
_Static_assert(READ_PIECE > RK_RUNLOG_MAX_LINE && READ_PIECE > RK_EVENT_MAX_LINE,
               "a piece holds the longest line a reader takes");

static int stream_lines(lines *ls, int fd, const char *path, size_t max, rk_err *err)
{
    char *buf = malloc(READ_PIECE);
    if (!buf)
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", path);
    size_t have = 0;
    uint64_t total = 0;
    int rc = RK_OK, skipping = 0; /* in a line longer than a piece: its error in e */
    rk_err e = {0};
    for (;;) {
        ssize_t r = read(fd, buf + have, READ_PIECE - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = rk_err_set(err, RK_EIO, "%s: read: %s", path, strerror(errno));
            break;
        }
        total += (uint64_t)r;
        if (total > max) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: file is more than the limit of %zu bytes", path,
                            max);
            break;
        }
        if (r == 0) { /* the end: a last line without its newline */
            if (skipping)
                ls->d->torn++;
            else if (have)
                rc = take_line(ls, buf, have, 1, err);
            break;
        }
        have += (size_t)r;
        size_t at = 0;
        const char *nl;
        while (rc == RK_OK && (nl = memchr(buf + at, '\n', have - at))) {
            size_t n = (size_t)(nl - (buf + at));
            if (skipping) /* the over-long line ended before the file did */
                rc = rk_err_set(err, e.code, "%s line %ld: %s", ls->file, ls->no, e.msg);
            else
                rc = take_line(ls, buf + at, n, 0, err);
            skipping = 0;
            at += n + 1;
        }
        if (rc)
            break;
        memmove(buf, buf + at, have - at);
        have -= at;
        if (have == READ_PIECE) { /* no newline in a whole piece */
            if (!skipping) {
                ls->no++;
                e = (rk_err){0};
                if (ls->fn(ls->d, buf, have, &e) == RK_OK) /* no reader takes a line this long */
                    rk_err_set(&e, RK_EFORMAT, "a line longer than %zu bytes", READ_PIECE);
            }
            skipping = 1;
            have = 0;
        }
    }
    free(buf);
    return rc;
}

static int json_num(json_t *o, const char *k, double *v, const char *file, rk_err *err)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x))
        return RK_OK;
    if (!json_is_number(x) || !isfinite(json_number_value(x)))
        return rk_err_set(err, RK_EFORMAT, "%s: field \"%s\": not a number", file, k);
    *v = json_number_value(x);
    return RK_OK;
}

static int json_int(json_t *o, const char *k, int64_t *v, const char *file, rk_err *err)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x))
        return RK_OK;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return rk_err_set(err, RK_EFORMAT, "%s: field \"%s\": not a count", file, k);
    *v = json_integer_value(x);
    return RK_OK;
}

static int json_text(json_t *o, const char *k, char *out, size_t cap, const char *file, rk_err *err)
{
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x))
        return RK_OK;
    if (!json_is_string(x))
        return rk_err_set(err, RK_EFORMAT, "%s: field \"%s\": not a string", file, k);
    rk_text_clean(out, cap, json_string_value(x));
    return RK_OK;
}

static json_t *load_object(const char *text, size_t len, const char *file, rk_err *err)
{
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        rk_err_set(err, RK_EFORMAT, "%s: not JSON: %s (line %d)", file, je.text, je.line);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        rk_err_set(err, RK_EFORMAT, "%s: not a JSON object", file);
        return NULL;
    }
    return o;
}

/* summary.json (sum, NULL: absent) and metrics.json (met) into n. */
static int read_nums(const char *sum, size_t sum_len, const char *met, size_t met_len, nums *n,
                     rk_err *err)
{
    memset(n, 0, sizeof *n);
    n->wall_s = n->productive_s = n->goodput = NAN;
    n->recovery_median_s = n->recovery_max_s = NAN;
    n->test_accuracy = n->final_train_loss = NAN;
    n->steps = n->restarts = n->quarantined = n->final_ranks = n->injected = -1;
    n->snap_peak = n->held_peak = n->from_memory = n->from_disk = -1;
    int rc = RK_OK;
    if (sum) {
        const char *f = RK_REPORT_SUMMARY;
        json_t *o = load_object(sum, sum_len, f, err);
        if (!o)
            return RK_EFORMAT;
        n->have_summary = 1;
        rc = json_text(o, "outcome", n->outcome, sizeof n->outcome, f, err) ||
                     json_num(o, "wall_s", &n->wall_s, f, err) ||
                     json_num(o, "productive_s", &n->productive_s, f, err) ||
                     json_num(o, "goodput", &n->goodput, f, err) ||
                     json_int(o, "steps", &n->steps, f, err) ||
                     json_int(o, "restarts", &n->restarts, f, err) ||
                     json_int(o, "quarantined", &n->quarantined, f, err) ||
                     json_int(o, "final_ranks", &n->final_ranks, f, err) ||
                     json_int(o, "injected_faults", &n->injected, f, err) ||
                     json_num(o, "recovery_median_s", &n->recovery_median_s, f, err) ||
                     json_num(o, "recovery_max_s", &n->recovery_max_s, f, err) ||
                     json_text(o, "recovery", n->recovery, sizeof n->recovery, f, err) ||
                     json_text(o, "snapshots", n->snapshots, sizeof n->snapshots, f, err) ||
                     json_int(o, "snapshot_bytes_peak", &n->snap_peak, f, err) ||
                     json_int(o, "snapshot_held_bytes_peak", &n->held_peak, f, err)
                 ? RK_EFORMAT
                 : RK_OK;
        json_t *r = json_object_get(o, "restores"); /* {"memory": N, "disk": N} */
        if (!rc && r && !json_is_null(r) && !json_is_object(r))
            rc = rk_err_set(err, RK_EFORMAT, "%s: field \"restores\": not an object", f);
        else if (!rc && r && json_is_object(r) &&
                 (json_int(r, "memory", &n->from_memory, "summary.json: restores", err) ||
                  json_int(r, "disk", &n->from_disk, "summary.json: restores", err)))
            rc = RK_EFORMAT;
        json_decref(o);
        if (rc)
            return rc;
        if (!(n->wall_s >= 0) || n->wall_s > 1e10)
            n->wall_s = NAN;
    }
    if (met) {
        const char *f = RK_REPORT_METRICS;
        json_t *o = load_object(met, met_len, f, err);
        if (!o)
            return RK_EFORMAT;
        n->have_metrics = 1;
        rc = json_text(o, "model", n->model, sizeof n->model, f, err) ||
                     json_num(o, "test_accuracy", &n->test_accuracy, f, err) ||
                     json_num(o, "final_train_loss", &n->final_train_loss, f, err)
                 ? RK_EFORMAT
                 : RK_OK;
        json_decref(o);
    }
    return rc;
}

static int feed(data *d, const char *file, const source *s, line_fn fn, rk_err *err)
{
    lines ls = {.d = d, .file = file, .fn = fn};
    return s->buf ? each_line(&ls, s->buf, s->len, err)
                  : stream_lines(&ls, s->fd, s->path, s->max, err);
}

/* Every file into d and n, in the order the checks need (summary.json and metrics.json are
 * read whole: they are small). */
int rk_report_load(data *d, nums *n, const source *src, rk_err *err)
{
    int rc;
    if ((rc = read_nums(src[S_SUMMARY].buf, src[S_SUMMARY].len, src[S_METRICS].buf,
                        src[S_METRICS].len, n, err)))
        return rc;
    if (present(&src[S_EVENTS]) &&
        (rc = feed(d, RK_REPORT_EVENTS, &src[S_EVENTS], on_event_line, err)))
        return rc;
    if (present(&src[S_STEPS]) &&
        (rc = feed(d, RK_REPORT_STEPS, &src[S_STEPS], on_record_line, err)))
        return rc;
    if (d->ngt) /* steps.jsonl holds no gate records */
        return rk_err_set(err, RK_EFORMAT, "%s: holds gate records (those go in %s)",
                          RK_REPORT_STEPS, RK_REPORT_GATE);
    if (!present(&src[S_STEPS]) && present(&src[S_LOSS])) { /* a run of rk train alone */
        if ((rc = feed(d, RK_REPORT_LOSS, &src[S_LOSS], on_loss_line, err)))
            return rc;
        d->untimed = 1;
    }
    uint64_t nst = d->st.seen, nla = d->la.seen, nck = d->ck.seen;
    if (present(&src[S_GATE]) && (rc = feed(d, RK_REPORT_GATE, &src[S_GATE], on_record_line, err)))
        return rc;
    if (d->st.seen != nst || d->la.seen != nla || d->ck.seen != nck)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: holds step, launch or checkpoint records (those go "
                          "in %s)",
                          RK_REPORT_GATE, RK_REPORT_STEPS);
    if (sampler_finish(&d->st) || sampler_finish(&d->ck))
        return rk_err_set(err, RK_ENOMEM, "out of memory");
    return RK_OK;
}
