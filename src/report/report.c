/*
 * rk report (report.h): the page. Reads a run directory's files with the bounded readers of
 * rekindle/fileio.h into what read.c keeps of them, and renders one HTML page of bounded size
 * with inline SVG charts (loss by step with every incident marked, goodput over time, ranks
 * on devices across launches, each GPU's score and temperature, checkpoints) and the
 * incidents' table. Relies on open_memstream and base/text.h's cleaning of untrusted text.
 */
#include "report/report.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/text.h"
#include "rekindle/fileio.h"
#include "report/read.h"

/* ---- HTML and SVG ------------------------------------------------------------------------ */

/* Text from a file, escaped for an HTML text node or a quoted attribute. */
static void esc(FILE *f, const char *s)
{
    for (; *s; s++)
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
}

typedef struct chart {
    FILE *f;
    double x0, x1, y0, y1; /* data ranges */
    double W, H, L, R, T, B;
} chart;

static double cx(const chart *c, double x)
{
    double v = c->L + (x - c->x0) / (c->x1 - c->x0) * (c->W - c->L - c->R);
    return v < 0 ? 0 : v > c->W ? c->W : v;
}

static double cy(const chart *c, double y)
{
    double v = c->H - c->B - (y - c->y0) / (c->y1 - c->y0) * (c->H - c->T - c->B);
    return v < 0 ? 0 : v > c->H ? c->H : v;
}

/* A data range a chart can draw: finite, and at least 1e-12 of its magnitude wide (its ticks
 * are then hundreds of doubles apart: two steps near 2^52, or one loss of -1e17, still get
 * distinct ticks), widened about its middle. */
static void fix_range(double *lo, double *hi)
{
    if (!isfinite(*lo) || !isfinite(*hi) || *hi < *lo) {
        *lo = 0;
        *hi = 1;
    }
    if (!isfinite(*hi - *lo)) { /* both beyond +-8.9e307: no reader lets one through */
        *lo = -1e300;
        *hi = 1e300;
    }
    double min = fmax(1e-9, fmax(fabs(*lo), fabs(*hi)) * 1e-12);
    if (*hi - *lo < min) {
        *lo -= (min - (*hi - *lo)) / 2;
        *hi = *lo + min;
    }
}

/* A tick step of 1, 2 or 5 times a power of ten giving about `want` ticks over [lo, hi] (a
 * range fix_range made). */
static double tick_step(double lo, double hi, int want)
{
    double raw = (hi - lo) / want, p = pow(10, floor(log10(raw))), m = raw / p;
    double step = (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
    return isfinite(step) && step > 0 ? step : hi - lo;
}

/* The ticks of [lo, hi] at multiples of step, counted as integers: at most max of them,
 * whatever the doubles do. Sets *k0 (the first multiple) and returns how many. */
static int tick_count(double lo, double hi, double step, int max, double *k0)
{
    double a = ceil(lo / step), b = floor(hi / step + 1e-9);
    *k0 = a;
    if (!(b >= a) || !isfinite(a) || !isfinite(b))
        return 0;
    return b - a + 1 > max ? max : (int)(b - a) + 1;
}

static void fmt_tick(char *b, size_t cap, double v, double step)
{
    if (fabs(v) < step * 1e-6)
        v = 0;
    if (fabs(v) < 1e9 && step >= 1e-6) {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(b, cap, "%.*f", dec > 6 ? 6 : dec, v);
        return;
    }
    /* large or fine: the significant digits that tell one tick from the next */
    int digits = (int)ceil(log10(fmax(fabs(v), step))) - (int)floor(log10(step)) + 1;
    snprintf(b, cap, "%.*g", digits < 1 ? 1 : digits > 17 ? 17 : digits, v);
}

/* One axis's ticks: about `want` of them at round values (at most 4 want + 2), each labelled.
 * y: a grid line across the plot, the label left of the axis; x: a short mark below the
 * axis, the label under it. */
enum axis { AXIS_X, AXIS_Y };

static void chart_ticks(const chart *c, enum axis axis, int want)
{
    double lo = axis == AXIS_Y ? c->y0 : c->x0, hi = axis == AXIS_Y ? c->y1 : c->x1;
    double step = tick_step(lo, hi, want), k0;
    int nt = tick_count(lo, hi, step, 4 * want + 2, &k0);
    for (int i = 0; i < nt; i++) {
        double v = (k0 + i) * step;
        char b[32];
        fmt_tick(b, sizeof b, v, step);
        if (axis == AXIS_Y)
            fprintf(c->f,
                    "<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                    "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>",
                    c->L, c->W - c->R, cy(c, v), cy(c, v), c->L - 6, cy(c, v) + 4, b);
        else
            fprintf(c->f,
                    "<line class=\"xtick\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                    "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>",
                    cx(c, v), cx(c, v), c->H - c->B, c->H - c->B + 5, cx(c, v), c->H - c->B + 18,
                    b);
    }
}

/* Open a figure: caption, the SVG, its grid, axes and tick labels. */
static void chart_begin(chart *c, FILE *f, const char *id, const char *title, const char *note,
                        const char *xlabel, const char *ylabel, double H, int yticks)
{
    c->f = f;
    c->W = 1180;
    c->H = H;
    c->L = 64;
    c->R = 24;
    c->T = 14;
    c->B = 42;
    fix_range(&c->x0, &c->x1);
    fix_range(&c->y0, &c->y1);
    fprintf(f, "<figure class=\"chart\" id=\"%s\"><figcaption><h2>%s</h2>", id, title);
    if (note && note[0])
        fprintf(f, "<p class=\"note\">%s</p>", note);
    fprintf(f,
            "</figcaption>\n<svg class=\"plot\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" "
            "aria-label=\"%s\" xmlns=\"http://www.w3.org/2000/svg\">\n",
            c->W, c->H, title);
    fprintf(f, "<g class=\"axes\">");
    if (yticks > 0)
        chart_ticks(c, AXIS_Y, yticks);
    chart_ticks(c, AXIS_X, 10);
    fprintf(f,
            "<line class=\"axis\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
            "<line class=\"axis\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>",
            c->L, c->W - c->R, c->H - c->B, c->H - c->B, c->L, c->L, c->T, c->H - c->B);
    fprintf(f, "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>",
            (c->L + c->W - c->R) / 2, c->H - 6, xlabel);
    if (ylabel)
        fprintf(f,
                "<text class=\"label\" transform=\"translate(14 %.1f) rotate(-90)\" "
                "text-anchor=\"middle\">%s</text>",
                (c->T + c->H - c->B) / 2, ylabel);
    fprintf(f, "</g>\n");
}

static void chart_end(chart *c)
{
    fprintf(c->f, "</svg></figure>\n");
}

static void chart_empty(FILE *f, const char *id, const char *title, const char *why)
{
    fprintf(f,
            "<figure class=\"chart empty\" id=\"%s\"><figcaption><h2>%s</h2></figcaption>"
            "<p class=\"none\">%s</p></figure>\n",
            id, title, why);
}

/* Eight colours that stay apart on screen, with a dash pattern each for paper. */
static const char *const k_colour[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                       "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
static const char *const k_dash[] = {"", "6 3", "2 2", "8 3 2 3", "1 3", "10 4", "4 4", "6 2 1 2"};

/* The incident's family: its colour and its marker's shape. */
typedef enum { FAM_FAILURE, FAM_HEALTH, FAM_NUMERIC, FAM_QUARANTINE, FAM_OTHER } family;

static family family_of(const char *kind)
{
    static const char *const fail[] = {"crash",   "hang",        "commfail",     "node_lost",
                                       "storage", "exception",   "ckpt_refused", "never_connected",
                                       "usage",   "guard_failed"};
    static const char *const health[] = {"health_drain", "health_gate", "predicted_failure"};
    static const char *const num[] = {"nan",       "grad_suspect",     "grad_outlier",
                                      "grad_kept", "replica_mismatch", "loss_spike",
                                      "spike_kept"};
    for (size_t i = 0; i < sizeof fail / sizeof *fail; i++)
        if (strcmp(kind, fail[i]) == 0)
            return FAM_FAILURE;
    for (size_t i = 0; i < sizeof health / sizeof *health; i++)
        if (strcmp(kind, health[i]) == 0)
            return FAM_HEALTH;
    for (size_t i = 0; i < sizeof num / sizeof *num; i++)
        if (strcmp(kind, num[i]) == 0)
            return FAM_NUMERIC;
    return strcmp(kind, "quarantine") == 0 ? FAM_QUARANTINE : FAM_OTHER;
}

static const char *const k_fam_class[] = {"fam-failure", "fam-health", "fam-numeric",
                                          "fam-quarantine", "fam-other"};

/* A marker's shape centred at (x, y): circle, triangle, square, diamond, circle. */
static void shape(FILE *f, family fam, double x, double y)
{
    switch (fam) {
    case FAM_HEALTH:
        fprintf(f, "<path class=\"mk\" d=\"M%.1f %.1fl6 10.4h-12z\"/>", x, y - 6.9);
        break;
    case FAM_NUMERIC:
        fprintf(f, "<rect class=\"mk\" x=\"%.1f\" y=\"%.1f\" width=\"11\" height=\"11\"/>", x - 5.5,
                y - 5.5);
        break;
    case FAM_QUARANTINE:
        fprintf(f, "<path class=\"mk\" d=\"M%.1f %.1fl7 7l-7 7l-7 -7z\"/>", x, y - 7);
        break;
    case FAM_FAILURE:
    case FAM_OTHER: fprintf(f, "<circle class=\"mk\" cx=\"%.1f\" cy=\"%.1f\" r=\"6\"/>", x, y);
    }
}

/* The step the job had reached at time t: the last step record kept at or before t (the file
 * is in time order); 0 before the first. */
static int64_t step_at(const data *d, double t)
{
    if (d->untimed) /* loss.log has no times */
        return 0;
    size_t lo = 0, hi = d->st.n; /* first record with .t > t */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ST(d)[mid].t <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo ? ST(d)[lo - 1].step : 0;
}

/* The step an incident is marked at: its own (rk run writes it), else where the job was. */
static int64_t event_step(const data *d, const rk_event *e)
{
    return e->step >= 0 ? e->step : step_at(d, e->t);
}

static double end_time(const data *d, const nums *n)
{
    double end = fmax(isfinite(n->wall_s) ? n->wall_s : 0, d->t_end);
    return end > 0 ? end : 1;
}

static const ev_pt *ev_at(const keeper *k, size_t i)
{
    return keeper_get(k, i);
}

static const launch_pt *la_at(const data *d, size_t i)
{
    return keeper_get(&d->la, i);
}

/* Points drawn: of the loss by step (all its lines together), of the goodput, of each GPU
 * chart (all its lines together). */
#define LOSS_POINTS 4000
#define GOODPUT_POINTS 2000
#define GATE_POINTS 8000

/* ceil(n / max): the stride that draws at most max of n things (1: all of them). */
static uint64_t stride_for(uint64_t n, uint64_t max)
{
    return n > max ? (n + max - 1) / max : 1;
}

/* A polyline through every stride-th of the n points (x, y pairs) and the last. */
static void polyline(FILE *f, const chart *c, const double *xy, size_t n, size_t stride,
                     const char *cls, const char *attrs)
{
    if (!n)
        return;
    fprintf(f, "<polyline class=\"%s\" %s points=\"", cls, attrs);
    for (size_t i = 0; i < n; i += stride)
        fprintf(f, "%.1f,%.1f ", cx(c, xy[2 * i]), cy(c, xy[2 * i + 1]));
    if ((n - 1) % stride)
        fprintf(f, "%.1f,%.1f", cx(c, xy[2 * (n - 1)]), cy(c, xy[2 * (n - 1) + 1]));
    fprintf(f, "\"/>\n");
}

/* Where the piece of the loss line that starts at kept step i (a finite loss) ends: the
 * launch changes, a loss is not finite, or the step does not advance (a rollback replays). */
static size_t piece_end(const data *d, size_t i)
{
    const step_pt *st = ST(d);
    size_t j = i + 1;
    while (j < d->st.n && st[j].launch == st[i].launch && isfinite(st[j].loss) &&
           st[j].step > st[j - 1].step)
        j++;
    return j;
}

/* What the page draws of what was kept, decided before it is drawn so that its top can say
 * what it leaves out. */
typedef struct plan {
    size_t loss_stride;            /* every loss_stride-th point of each piece of the loss line */
    long pieces, pieces_left;      /* pieces of the loss line: drawn (the first ones), left out */
    uint64_t nan_kept, nan_stride; /* kept non-finite steps; every nan_stride-th gets a cross */
    size_t bar_head, bar_tail;     /* the launches kept [0, bar_head) and [bar_tail, n) have bars */
    int *gate_n;                   /* readings of each device in gate.jsonl */
    int gpus;                      /* devices read by the gate */
    int series;                    /* ... the first `series` of them have lines (in table order) */
    size_t ck_stride;              /* every ck_stride-th checkpoint kept has a mark */
} plan;

static int make_plan(const data *d, plan *p)
{
    memset(p, 0, sizeof *p);
    p->loss_stride = (size_t)stride_for(d->st.n, LOSS_POINTS);
    for (size_t i = 0; i < d->st.n;) {
        if (!isfinite(ST(d)[i].loss)) {
            p->nan_kept++;
            i++;
            continue;
        }
        if (p->pieces < RK_REPORT_MAX_MARKS)
            p->pieces++;
        else
            p->pieces_left++;
        i = piece_end(d, i);
    }
    p->nan_stride = stride_for(p->nan_kept, RK_REPORT_MAX_MARKS);
    size_t nla = keeper_n(&d->la);
    long bars = 0;
    for (size_t i = 0; i < nla; i++)
        bars += la_at(d, i)->n;
    p->bar_head = p->bar_tail = nla;
    if (bars > RK_REPORT_MAX_BARS) { /* the first launches and the last, half the bars each */
        long head = 0, tail = 0;
        size_t h = 0, t = nla;
        while (h < nla && head + la_at(d, h)->n <= RK_REPORT_MAX_BARS / 2)
            head += la_at(d, h++)->n;
        while (t > h && tail + la_at(d, t - 1)->n <= RK_REPORT_MAX_BARS / 2)
            tail += la_at(d, --t)->n;
        p->bar_head = h;
        p->bar_tail = t;
    }
    p->gate_n = calloc((size_t)(d->ndev ? d->ndev : 1), sizeof *p->gate_n);
    if (!p->gate_n)
        return RK_ENOMEM;
    for (size_t i = 0; i < d->ngt; i++)
        p->gate_n[d->gt[i].dev]++;
    for (int k = 0; k < d->ndev; k++)
        if (p->gate_n[k])
            p->series += p->gpus++ < RK_REPORT_MAX_SERIES;
    p->ck_stride = (size_t)stride_for(d->ck.n, RK_REPORT_MAX_MARKS);
    return RK_OK;
}

/* A device that has a line in the GPU charts. */
static int has_series(const plan *p, int k, int *seen)
{
    if (!p->gate_n[k])
        return 0;
    return (*seen)++ < p->series;
}

/* The page's note of what it left out (nothing when it left nothing out): 1 if it wrote one. */
static int left_out_note(FILE *f, const data *d, const plan *p)
{
    char items[10][240];
    int n = 0;
    const keeper *ks[2] = {&d->inc, &d->inj};
    for (int i = 0; i < 2; i++)
        if (keeper_left(ks[i]))
            snprintf(items[n++], sizeof items[0],
                     "%llu of the %llu %s in events.jsonl (#%llu to #%llu; the first %d and the "
                     "last %d are shown)",
                     (unsigned long long)keeper_left(ks[i]), (unsigned long long)ks[i]->seen,
                     i ? "injections" : "incidents", (unsigned long long)(ks[i]->cap / 2 + 1),
                     (unsigned long long)(ks[i]->cap / 2 + keeper_left(ks[i])),
                     (int)(ks[i]->cap / 2), (int)(ks[i]->cap - ks[i]->cap / 2));
    if (d->st.seen > d->st.n)
        snprintf(items[n++], sizeof items[0],
                 "%llu of the %llu step records of %s (one in %llu is drawn, and the last)",
                 (unsigned long long)(d->st.seen - d->st.n), (unsigned long long)d->st.seen,
                 d->untimed ? RK_REPORT_LOSS : RK_REPORT_STEPS, (unsigned long long)d->st.stride);
    if (d->ck.seen > d->ck.n)
        snprintf(items[n++], sizeof items[0],
                 "%llu of the %llu checkpoint records (one in %llu is kept, and the last)",
                 (unsigned long long)(d->ck.seen - d->ck.n), (unsigned long long)d->ck.seen,
                 (unsigned long long)d->ck.stride);
    if (keeper_left(&d->la))
        snprintf(items[n++], sizeof items[0],
                 "%llu of the %llu launch records (the first %d and the last %d are kept)",
                 (unsigned long long)keeper_left(&d->la), (unsigned long long)d->la.seen,
                 (int)(d->la.cap / 2), (int)(d->la.cap - d->la.cap / 2));
    if (p->bar_tail > p->bar_head)
        snprintf(items[n++], sizeof items[0],
                 "the bars of %zu of the %zu launches kept (at most %d bars are drawn: the "
                 "first launches' and the last ones')",
                 p->bar_tail - p->bar_head, keeper_n(&d->la), RK_REPORT_MAX_BARS);
    if (p->pieces_left)
        snprintf(items[n++], sizeof items[0],
                 "%ld pieces of the loss line after the first %d (a launch, a rollback or a "
                 "non-finite loss starts one)",
                 p->pieces_left, RK_REPORT_MAX_MARKS);
    if (p->nan_stride > 1)
        snprintf(items[n++], sizeof items[0],
                 "the cross of all but one in %llu of the %llu non-finite steps kept",
                 (unsigned long long)p->nan_stride, (unsigned long long)p->nan_kept);
    if (p->gpus > p->series)
        snprintf(items[n++], sizeof items[0],
                 "the lines of %d of the %d devices in gate.jsonl (the first %d are drawn)",
                 p->gpus - p->series, p->gpus, RK_REPORT_MAX_SERIES);
    if (p->ck_stride > 1)
        snprintf(items[n++], sizeof items[0],
                 "the marks of all but one in %zu of the %zu checkpoints kept", p->ck_stride,
                 d->ck.n);
    if (!n)
        return 0;
    fprintf(f, "<p class=\"warn left-out\">Left out of this page, to keep it within its bounds "
               "(docs/report.md, &#8220;Limits&#8221;): ");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%s", items[i], i + 1 < n ? "; " : ".</p>\n");
    return 1;
}

static void loss_chart(FILE *f, const data *d, const nums *nm, const plan *p)
{
    const step_pt *st = ST(d);
    size_t nst = d->st.n, ninc = keeper_n(&d->inc), ninj = keeper_n(&d->inj);
    if (!nst && !ninc) {
        chart_empty(f, "loss", "Loss by step",
                    "No steps recorded (no steps.jsonl: give rk run --steps) and no incidents.");
        return;
    }
    chart c = {.x0 = INFINITY, .x1 = -INFINITY, .y0 = 0, .y1 = -INFINITY};
    for (size_t i = 0; i < nst; i++) {
        c.x0 = fmin(c.x0, (double)st[i].step - 1);
        c.x1 = fmax(c.x1, (double)st[i].step);
        if (isfinite(st[i].loss))
            c.y1 = fmax(c.y1, st[i].loss), c.y0 = fmin(c.y0, st[i].loss);
    }
    int by_time = !nst; /* no steps: the incidents over time */
    const keeper *ks[2] = {&d->inc, &d->inj};
    for (int w = 0; w < 2 && !by_time; w++) /* the incidents' steps are on it too */
        for (size_t i = 0; i < keeper_n(ks[w]); i++) {
            double k = (double)event_step(d, &ev_at(ks[w], i)->e);
            c.x0 = fmin(c.x0, k);
            c.x1 = fmax(c.x1, k);
        }
    if (by_time)
        c.x0 = 0, c.x1 = end_time(d, nm), c.y0 = 0, c.y1 = 1;
    if (!(c.x1 > c.x0))
        c.x1 = c.x0 + 1;
    if (c.y1 > 0)
        c.y1 *= 1.08;
    double H = 360;
    chart_begin(&c, f, "loss", by_time ? "Incidents over time" : "Loss by step",
                d->untimed ? "The loss at every step, from rk train's loss.log (--loss-log)."
                : nst      ? "Rank 0's loss at every step it applied, one line per launch (a "
                             "relaunch replays from its checkpoint). Each incident is marked at "
                             "its step (a rank's event: the step it computed; else the last step "
                             "rank 0 applied before it was seen); the numbers are the table's."
                           : "No steps recorded (no steps.jsonl: give rk run --steps): no loss "
                             "curve, the incidents at their times.",
                by_time ? "seconds since rk run started" : "step", by_time ? NULL : "loss", H,
                by_time ? 0 : 6);
    /* one line per launch, broken at non-finite losses and where a rollback replays */
    double *xy = malloc((nst ? nst : 1) * 2 * sizeof *xy);
    long pieces = 0;
    uint64_t nans = 0;
    for (size_t i = 0; xy && i < nst;) {
        if (!isfinite(st[i].loss)) { /* a NaN step: a cross on the axis */
            if (nans++ % p->nan_stride == 0)
                fprintf(f,
                        "<text class=\"nan-step\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">"
                        "&#215;</text>",
                        cx(&c, (double)st[i].step), c.H - c.B - 3);
            i++;
            continue;
        }
        size_t j = piece_end(d, i), n = 0;
        if (pieces++ < p->pieces) {
            for (size_t k = i; k < j; k++, n++) {
                xy[2 * n] = (double)st[k].step;
                xy[2 * n + 1] = st[k].loss;
            }
            char attrs[96];
            snprintf(attrs, sizeof attrs, "data-launch=\"%d\" style=\"stroke:%s\"", st[i].launch,
                     k_colour[st[i].launch % 8]);
            polyline(f, &c, xy, n, p->loss_stride, "loss-line", attrs);
        }
        i = j;
    }
    free(xy);
    /* incidents: a dashed line at the step and a numbered shape on top, staggered */
    for (size_t i = 0; i < ninc; i++) {
        const ev_pt *ep = ev_at(&d->inc, i);
        const rk_event *e = &ep->e;
        long no = (long)ep->no;
        int64_t s = event_step(d, e);
        double x = cx(&c, by_time ? e->t : (double)s), y = c.T + 10 + (double)((no - 1) % 4) * 16;
        family fam = family_of(e->kind);
        char detail[200]; /* a tooltip: the table has all of it */
        fprintf(f, "<g class=\"incident-marker %s\" data-kind=\"", k_fam_class[fam]);
        esc(f, e->kind);
        fprintf(f, "\" data-step=\"%lld\" data-n=\"%ld\"><title>#%ld ", (long long)s, no, no);
        esc(f, e->kind);
        fprintf(f, " at %.1f s, step %lld: ", e->t, (long long)s);
        esc(f, rk_msg_show(detail, sizeof detail, e->detail));
        fprintf(f, "</title><line class=\"stem\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>",
                x, x, y, c.H - c.B);
        shape(f, fam, x, y);
        fprintf(f, "<text class=\"mk-no\" x=\"%.1f\" y=\"%.1f\">%ld</text></g>\n", x + 8, y + 4,
                no);
    }
    /* injections: a small grey tick below the axis */
    for (size_t i = 0; i < ninj; i++) {
        const rk_event *e = &ev_at(&d->inj, i)->e;
        char detail[200];
        double x = cx(&c, by_time ? e->t : (double)event_step(d, e));
        fprintf(f, "<path class=\"inject-marker\" d=\"M%.1f %.1fl-4 7h8z\"><title>", x,
                c.H - c.B + 1);
        esc(f, rk_msg_show(detail, sizeof detail, e->detail));
        fprintf(f, "</title></path>\n");
    }
    chart_end(&c);
    fprintf(f, "<p class=\"legend\"><span class=\"key fam-failure\">&#9679; crash, hang, "
               "communication</span> <span class=\"key fam-health\">&#9650; health drain or "
               "gate</span> <span class=\"key fam-numeric\">&#9632; NaN, gradient, replica "
               "(redo, rollback)</span> <span class=\"key fam-quarantine\">&#9670; "
               "quarantine</span> <span class=\"key inject\">&#9652; fault injected "
               "(simulated)</span></p>\n");
}

/* Goodput so far at each step record: the time of the steps that are in the model at that
 * moment (rank 0's dt; a replayed step counts once, its latest time), over the time since
 * the start. A replay drops the steps it redoes until they are done again. Thinned (or
 * sampled) records stand for the steps since the previous one. */
static void goodput_chart(FILE *f, const data *d, const nums *n)
{
    size_t nst = d->st.n;
    if (!nst || d->untimed) {
        chart_empty(f, "goodput", "Goodput over time",
                    d->untimed ? "rk train's loss.log has no times: goodput needs rk run --steps."
                               : "No steps recorded (no steps.jsonl: give rk run --steps).");
        return;
    }
    typedef struct {
        int64_t step;
        double c;
    } held;
    held *stack = malloc(nst * sizeof *stack);
    double *xy = malloc(nst * 2 * sizeof *xy);
    if (!stack || !xy) {
        free(stack);
        free(xy);
        return;
    }
    size_t top = 0, np = 0;
    double prod = 0;
    for (size_t i = 0; i < nst; i++) {
        const step_pt *p = &ST(d)[i];
        while (top && stack[top - 1].step >= p->step)
            prod -= stack[--top].c;
        int64_t prev = top ? stack[top - 1].step : p->step - 1;
        double c = p->dt * (double)(p->step - prev);
        stack[top++] = (held){p->step, c};
        prod += c;
        if (p->t > 0) {
            xy[2 * np] = p->t;
            xy[2 * np + 1] = fmin(1.0, fmax(0.0, prod / p->t));
            np++;
        }
    }
    free(stack);
    chart c = {.x0 = 0, .x1 = end_time(d, n), .y0 = 0, .y1 = 1};
    char note[200];
    if (isfinite(n->goodput))
        snprintf(note, sizeof note,
                 "Productive time so far over time since the start; the summary's goodput at "
                 "the end: %.3f (dashed).",
                 n->goodput);
    else
        snprintf(note, sizeof note, "Productive time so far over time since the start.");
    chart_begin(&c, f, "goodput", "Goodput over time", note, "seconds since rk run started",
                "goodput", 260, 5);
    for (size_t i = 0; i < keeper_n(&d->la); i++) {
        const launch_pt *la = la_at(d, i);
        fprintf(f,
                "<line class=\"launch-line\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                "<text class=\"launch-label\" x=\"%.1f\" y=\"%.1f\">launch %d</text>\n",
                cx(&c, la->t), cx(&c, la->t), c.T, c.H - c.B, cx(&c, la->t) + 3, c.T + 10,
                la->launch);
    }
    if (isfinite(n->goodput))
        fprintf(f,
                "<line class=\"goodput-final\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" "
                "y2=\"%.1f\"/>\n",
                c.L, c.W - c.R, cy(&c, n->goodput), cy(&c, n->goodput));
    polyline(f, &c, xy, np, (size_t)stride_for(np, GOODPUT_POINTS), "goodput-line", "");
    free(xy);
    chart_end(&c);
}

/* Rows: devices; a bar for each rank of each launch drawn, from its start to the next
 * launch. */
static void devices_chart(FILE *f, const data *d, const nums *n, const plan *p)
{
    size_t nla = keeper_n(&d->la);
    if (!nla) {
        chart_empty(f, "devices", "Ranks on devices, launch by launch",
                    "No launches recorded (no steps.jsonl: give rk run --steps).");
        return;
    }
    /* the devices used by a launch drawn, in order of first appearance */
    int *row = malloc((size_t)(d->ndev ? d->ndev : 1) * sizeof *row);
    if (!row)
        return;
    int rows = 0;
    for (int k = 0; k < d->ndev; k++)
        row[k] = -1;
    for (size_t i = 0; i < nla; i++) {
        if (i == p->bar_head)
            i = p->bar_tail;
        if (i >= nla)
            break;
        const launch_pt *la = la_at(d, i);
        for (int r = 0; r < la->n; r++)
            if (row[la->dev[r]] < 0)
                row[la->dev[r]] = rows++;
    }
    double end = end_time(d, n);
    chart c = {.x0 = 0, .x1 = end, .y0 = 0, .y1 = rows};
    double H = 14 + 42 + 30.0 * rows;
    chart_begin(&c, f, "devices", "Ranks on devices, launch by launch",
                "Which rank ran on which device in each launch (rk run --devices); a device "
                "left out, drained or quarantined has no bar.",
                "seconds since rk run started", NULL, H, 0);
    for (int k = 0; k < d->ndev; k++)
        if (row[k] >= 0) {
            fprintf(f, "<text class=\"tick dev-name\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">",
                    c.L - 6, cy(&c, rows - row[k] - 0.5) + 4);
            esc(f, d->dev[k]);
            fprintf(f, "</text>\n");
        }
    for (size_t i = 0; i < nla; i++) {
        if (i == p->bar_head)
            i = p->bar_tail;
        if (i >= nla)
            break;
        const launch_pt *la = la_at(d, i);
        double t1 = isfinite(la->t_next) ? la->t_next : end;
        double x0 = cx(&c, la->t), x1 = cx(&c, fmax(t1, la->t));
        for (int r = 0; r < la->n; r++) {
            int k = la->dev[r];
            double y = cy(&c, rows - row[k]);
            fprintf(f,
                    "<g class=\"launch-bar\" data-launch=\"%d\" data-rank=\"%d\" "
                    "data-device=\"",
                    la->launch, r);
            esc(f, d->dev[k]);
            fprintf(f, "\"><title>launch %d: rank %d on device ", la->launch, r);
            esc(f, d->dev[k]);
            fprintf(f,
                    "</title><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"22\" "
                    "style=\"fill:%s\"/>",
                    x0 + 0.5, y + 4, fmax(x1 - x0 - 1, 1), k_colour[r % 8]);
            if (x1 - x0 > 30)
                fprintf(f, "<text class=\"bar-label\" x=\"%.1f\" y=\"%.1f\">r%d</text>", x0 + 4,
                        y + 19, r);
            fprintf(f, "</g>\n");
        }
    }
    free(row);
    chart_end(&c);
}

/* One line per device: score (with the threshold) or temperature, over time. */
static void gate_chart(FILE *f, const data *d, const nums *n, const plan *p, int temp)
{
    const char *id = temp ? "temperature" : "score";
    const char *title = temp ? "GPU temperature" : "GPU health score";
    if (!d->ngt) {
        chart_empty(f, id, title,
                    "No readings of the health gate recorded (no gate.jsonl: give rk run "
                    "--gate-log, with --health).");
        return;
    }
    chart c = {.x0 = 0, .x1 = end_time(d, n), .y0 = 0, .y1 = 100};
    if (temp) {
        c.y0 = INFINITY, c.y1 = -INFINITY;
        for (size_t i = 0; i < d->ngt; i++)
            if (isfinite(d->gt[i].temp))
                c.y0 = fmin(c.y0, d->gt[i].temp), c.y1 = fmax(c.y1, d->gt[i].temp);
        if (!isfinite(c.y0)) {
            chart_empty(f, id, title, "The GPUs reported no temperature.");
            return;
        }
        /* a degree of room at both ends: a line on a multiple of 10 does not lie on the axis */
        c.y0 = floor((c.y0 - 1) / 10) * 10;
        c.y1 = ceil((c.y1 + 1) / 10) * 10;
    }
    char note[240];
    snprintf(note, sizeof note, "%s of every GPU at each reading of rk run's health gate%s%s.",
             temp ? "Core temperature (&#176;C)" : "The 0-100 score (docs/health.md)",
             temp ? "" : "; dashed: the threshold below which a device is left out or drained",
             d->simulated ? "; the GPUs are simulated" : "");
    chart_begin(&c, f, id, title, note, "seconds since rk run started",
                temp ? "temperature (\xc2\xb0"
                       "C)"
                     : "score",
                260, 5);
    if (!temp && d->threshold >= 0)
        fprintf(f, "<line class=\"threshold\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>\n",
                c.L, c.W - c.R, cy(&c, d->threshold), cy(&c, d->threshold));
    /* the devices' points, device after device (a counting sort of the readings) */
    size_t *at = calloc((size_t)d->ndev + 1, sizeof *at);
    size_t *cnt = calloc((size_t)d->ndev + 1, sizeof *cnt);
    char *drawn_dev = calloc((size_t)d->ndev + 1, 1);
    double *xy = malloc((d->ngt ? d->ngt : 1) * 2 * sizeof *xy);
    int seen = 0;
    if (at && cnt && drawn_dev && xy) {
        for (int k = 0; k < d->ndev; k++)
            drawn_dev[k] = (char)has_series(p, k, &seen);
        for (size_t i = 0; i < d->ngt; i++) {
            const gate_pt *g = &d->gt[i];
            cnt[g->dev] += drawn_dev[g->dev] && (!temp || isfinite(g->temp));
        }
        for (int k = 0; k < d->ndev; k++)
            at[k + 1] = at[k] + cnt[k];
        size_t drawn = at[d->ndev];
        memset(cnt, 0, ((size_t)d->ndev + 1) * sizeof *cnt);
        for (size_t i = 0; i < d->ngt; i++) {
            const gate_pt *g = &d->gt[i];
            if (!drawn_dev[g->dev] || (temp && !isfinite(g->temp)))
                continue;
            size_t j = at[g->dev] + cnt[g->dev]++;
            xy[2 * j] = g->t;
            xy[2 * j + 1] = temp ? g->temp : g->score;
        }
        size_t stride = (size_t)stride_for(drawn, GATE_POINTS);
        for (int k = 0; k < d->ndev; k++) {
            size_t np = at[k + 1] - at[k];
            if (!np)
                continue;
            char attrs[128];
            snprintf(attrs, sizeof attrs, "style=\"stroke:%s;stroke-dasharray:%s\"",
                     k_colour[k % 8], k_dash[(k / 8) % 8][0] ? k_dash[(k / 8) % 8] : "none");
            fprintf(f, "<g class=\"device-series\" data-device=\"");
            esc(f, d->dev[k]);
            fprintf(f, "\"><title>device ");
            esc(f, d->dev[k]);
            fprintf(f, "</title>");
            polyline(f, &c, xy + 2 * at[k], np, stride, temp ? "temp-line" : "score-line", attrs);
            fprintf(f, "</g>\n");
        }
    }
    free(at);
    free(cnt);
    free(drawn_dev);
    free(xy);
    chart_end(&c);
    fprintf(f, "<p class=\"legend\">");
    seen = 0;
    for (int k = 0; k < d->ndev; k++) {
        if (!has_series(p, k, &seen))
            continue;
        fprintf(f, "<span class=\"key\" style=\"color:%s\">&#9644; device ", k_colour[k % 8]);
        esc(f, d->dev[k]);
        fprintf(f, "</span> ");
    }
    fprintf(f, "</p>\n");
}

static void ckpt_chart(FILE *f, const data *d, const nums *n, const plan *p)
{
    size_t nck = d->ck.n;
    if (!nck) {
        chart_empty(f, "checkpoints", "Checkpoints",
                    "No checkpoints recorded (no steps.jsonl, or the job wrote none).");
        return;
    }
    chart c = {.x0 = 0, .x1 = end_time(d, n), .y0 = 0, .y1 = 0};
    for (size_t i = 0; i < nck; i++)
        c.y1 = fmax(c.y1, CK(d)[i].seconds);
    c.y1 = c.y1 > 0 ? c.y1 * 1.15 : 1;
    chart_begin(&c, f, "checkpoints", "Checkpoints",
                "When each checkpoint became durable, and how long rank 0 said its save took.",
                "seconds since rk run started", "save (s)", 200, 4);
    for (size_t i = 0; i < nck; i += p->ck_stride) {
        const ckpt_pt *k = &CK(d)[i];
        double x = cx(&c, k->t), y = cy(&c, k->seconds);
        fprintf(f,
                "<g class=\"ckpt-mark\" data-step=\"%lld\"><title>step %lld at %.1f s, saved in "
                "%.3f s</title><line class=\"stem\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" "
                "y2=\"%.1f\"/><circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\"/></g>\n",
                (long long)k->step, (long long)k->step, k->t, k->seconds, x, x, y, c.H - c.B, x, y);
    }
    chart_end(&c);
}

static void cell_num(FILE *f, double v, const char *fmt)
{
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("&#8212;", f);
}

static void event_row(FILE *f, const data *d, const ev_pt *ep, int inject)
{
    const rk_event *e = &ep->e;
    fprintf(f, "<tr class=\"%s\">", k_fam_class[family_of(e->kind)]);
    if (!inject)
        fprintf(f, "<td>%llu</td>", (unsigned long long)ep->no);
    fprintf(f, "<td>%.1f</td><td class=\"time\">", e->t);
    esc(f, e->time);
    fprintf(f, "</td><td>");
    if (e->step >= 0 || d->st.n)
        fprintf(f, "%lld", (long long)event_step(d, e));
    fprintf(f, "</td><td class=\"kind\">");
    esc(f, e->kind);
    fprintf(f, "</td><td>");
    if (e->rank >= 0)
        fprintf(f, "%d", e->rank);
    fprintf(f, "</td><td>");
    esc(f, e->device);
    fprintf(f, "</td><td>");
    esc(f, e->action);
    fprintf(f, "</td>");
    if (!inject) {
        fprintf(f, "<td>");
        if (e->lost_steps >= 0)
            fprintf(f, "%lld", (long long)e->lost_steps);
        fprintf(f, "</td><td>");
        cell_num(f, e->recovery_s, "%.2f");
        fprintf(f, "</td>");
    }
    fprintf(f, "<td class=\"detail\">");
    esc(f, e->detail);
    fprintf(f, "</td></tr>\n");
}

static void event_table(FILE *f, const data *d, int inject)
{
    const keeper *k = inject ? &d->inj : &d->inc;
    fprintf(f, "<section class=\"%s\"><h2>%s (%llu)</h2>\n", inject ? "injections" : "incidents",
            inject ? "Injected faults (simulated)" : "Incidents", (unsigned long long)k->seen);
    if (!k->seen) {
        fprintf(f, "<p class=\"none\">None.</p></section>\n");
        return;
    }
    fprintf(f,
            "<table class=\"%s\"><thead><tr>%s<th>t (s)</th><th>time (UTC)</th><th>step</th>"
            "<th>kind</th><th>rank</th><th>device</th><th>action</th>%s<th>detail</th>"
            "</tr></thead><tbody>\n",
            inject ? "inject-table" : "incident-table", inject ? "" : "<th>#</th>",
            inject ? "" : "<th>lost steps</th><th>recovery (s)</th>");
    for (size_t i = 0; i < keeper_n(k); i++) {
        if (i == k->cap / 2 && keeper_left(k))
            fprintf(f,
                    "<tr class=\"left-out\"><td colspan=\"%d\">&#8230; %llu more left out "
                    "(the first %zu and the last %zu are shown) &#8230;</td></tr>\n",
                    inject ? 8 : 11, (unsigned long long)keeper_left(k), k->cap / 2,
                    k->cap - k->cap / 2);
        event_row(f, d, ev_at(k, i), inject);
    }
    fprintf(f, "</tbody></table></section>\n");
}

static const char k_style[] =
    "*{box-sizing:border-box}"
    "body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;"
    "color:#1b1b1b;background:#fff;margin:0 auto;padding:16px 24px;max-width:1280px}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:0 0 2px}"
    ".sub{color:#555;margin:0 0 12px}"
    "dl.facts{display:grid;grid-template-columns:repeat(6,1fr);gap:6px 16px;margin:0 0 16px;"
    "padding:10px 12px;background:#f4f6f8;border:1px solid #dde2e6;border-radius:4px}"
    "dl.facts div{min-width:0}dt{color:#555;font-size:12px}dd{margin:0;font-size:17px;"
    "font-weight:600}"
    ".chart{margin:0 0 18px;break-inside:avoid}.note{color:#555;margin:0 0 4px;font-size:13px}"
    "svg.plot{width:100%;height:auto;display:block;border:1px solid #e3e6e9;background:#fff}"
    ".grid{stroke:#eceff1}.xtick,.axis{stroke:#888}.tick{font-size:11px;fill:#444}"
    ".label{font-size:12px;fill:#333}"
    ".loss-line,.goodput-line,.score-line,.temp-line{fill:none;stroke-width:1.6;"
    "stroke-linejoin:round}"
    ".goodput-line{stroke:#1f77b4;stroke-width:2}"
    ".goodput-final{stroke:#1f77b4;stroke-dasharray:6 4;opacity:.7}"
    ".threshold{stroke:#c0392b;stroke-dasharray:6 4}"
    ".launch-line{stroke:#999;stroke-dasharray:2 3}.launch-label{font-size:10px;fill:#777}"
    ".incident-marker .stem{stroke-dasharray:3 3;stroke-width:1}"
    ".incident-marker .mk{stroke:#fff;stroke-width:1}.mk-no{font-size:11px;font-weight:600}"
    ".fam-failure .stem,.fam-failure .mk-no{stroke:none;fill:#c0392b}"
    ".fam-failure .stem{stroke:#c0392b}.fam-failure .mk{fill:#c0392b}"
    ".fam-health .stem{stroke:#d35400}.fam-health .mk,.fam-health .mk-no{fill:#d35400}"
    ".fam-numeric .stem{stroke:#8e44ad}.fam-numeric .mk,.fam-numeric .mk-no{fill:#8e44ad}"
    ".fam-quarantine .stem{stroke:#000}.fam-quarantine .mk,.fam-quarantine .mk-no{fill:#000}"
    ".fam-other .stem{stroke:#666}.fam-other .mk,.fam-other .mk-no{fill:#666}"
    ".inject-marker{fill:#888}.nan-step{fill:#8e44ad;font-size:14px}"
    ".launch-bar rect{opacity:.85}.bar-label{font-size:11px;fill:#fff;font-weight:600}"
    ".ckpt-mark .stem{stroke:#2ca02c}.ckpt-mark circle{fill:#2ca02c}"
    ".legend{font-size:12px;margin:2px 0 14px}.key{margin-right:14px;white-space:nowrap}"
    "span.fam-failure{color:#c0392b}span.fam-health{color:#d35400}"
    "span.fam-numeric{color:#8e44ad}span.fam-quarantine{color:#000}span.inject{color:#888}"
    ".none{color:#666;font-style:italic;margin:0 0 14px}"
    "table{border-collapse:collapse;width:100%;font-size:12.5px;margin:4px 0 18px}"
    "th,td{border-bottom:1px solid #e3e6e9;padding:3px 6px;text-align:left;vertical-align:top}"
    "th{background:#f4f6f8}td.time{white-space:nowrap}td.detail{word-break:break-word}td.kind{font-"
    "weight:600}"
    "tr.fam-failure td.kind{color:#c0392b}tr.fam-health td.kind{color:#d35400}"
    "tr.fam-numeric td.kind{color:#8e44ad}"
    ".warn{color:#8a4b00;background:#fff4e0;padding:6px 10px;border-radius:4px}"
    "footer{color:#777;font-size:12px;margin-top:10px}"
    "@media print{@page{size:A4 landscape;margin:12mm}"
    "body{max-width:none;padding:0;font-size:10pt;color:#000}"
    "dl.facts{background:none;border:1px solid #999}"
    "svg.plot{border:none}.chart,section,tr{break-inside:avoid}"
    "h2{break-after:avoid}table{font-size:9pt}th{background:none;border-bottom:2px solid #000}"
    "a{color:#000;text-decoration:none}}";

static void fact(FILE *f, const char *name, const char *value)
{
    fprintf(f, "<div><dt>%s</dt><dd>%s</dd></div>", name, value);
}

static void facts(FILE *f, const data *d, const nums *n)
{
    char b[64];
    fprintf(f, "<dl class=\"facts\">");
    if (n->outcome[0]) {
        fprintf(f, "<div><dt>outcome</dt><dd>");
        esc(f, n->outcome);
        fprintf(f, "</dd></div>");
    } else {
        fact(f, "outcome", "&#8212;");
    }
    int64_t steps = n->steps;
    if (steps < 0 && d->st.n) /* the sample ends with the last record */
        steps = ST(d)[d->st.n - 1].step;
    if (steps >= 0)
        snprintf(b, sizeof b, "%lld", (long long)steps);
    fact(f, "steps", steps >= 0 ? b : "&#8212;");
    snprintf(b, sizeof b, "%.1f s", n->wall_s);
    fact(f, "wall time", isfinite(n->wall_s) ? b : "&#8212;");
    snprintf(b, sizeof b, "%.3f", n->goodput);
    fact(f, "goodput", isfinite(n->goodput) ? b : "&#8212;");
    snprintf(b, sizeof b, "%lld", (long long)n->restarts);
    fact(f, "restarts", n->restarts >= 0 ? b : "&#8212;");
    snprintf(b, sizeof b, "%lld", (long long)n->quarantined);
    fact(f, "quarantined", n->quarantined >= 0 ? b : "&#8212;");
    snprintf(b, sizeof b, "%llu", (unsigned long long)d->inc.seen);
    fact(f, "incidents", b);
    snprintf(b, sizeof b, "%llu", (unsigned long long)d->inj.seen);
    fact(f, "faults injected", b);
    snprintf(b, sizeof b, "%.2f s / %.2f s", n->recovery_median_s, n->recovery_max_s);
    fact(f, "recovery median / max", isfinite(n->recovery_median_s) ? b : "&#8212;");
    if (n->recovery[0]) { /* "memory (snapshots on)", "disk" */
        fprintf(f, "<div><dt>recovery</dt><dd>");
        esc(f, n->recovery);
        if (n->snapshots[0] && strcmp(n->recovery, "disk") != 0) {
            fprintf(f, " (snapshots ");
            esc(f, n->snapshots);
            fprintf(f, ")");
        }
        fprintf(f, "</dd></div>");
    } else {
        fact(f, "recovery", "&#8212;");
    }
    snprintf(b, sizeof b, "%.1f MiB", (double)n->snap_peak / (1024.0 * 1024.0));
    fact(f, "snapshot memory peak", n->snap_peak >= 0 ? b : "&#8212;");
    if (n->held_peak > 0) { /* across hosts: the partner copies the nodes kept */
        snprintf(b, sizeof b, "%.1f MiB", (double)n->held_peak / (1024.0 * 1024.0));
        fact(f, "partner copies peak", b);
    }
    snprintf(b, sizeof b, "%lld / %lld", (long long)n->from_memory, (long long)n->from_disk);
    fact(f, "restores memory / disk", n->from_memory >= 0 && n->from_disk >= 0 ? b : "&#8212;");
    snprintf(b, sizeof b, "%lld", (long long)n->final_ranks);
    fact(f, "final ranks", n->final_ranks >= 0 ? b : "&#8212;");
    snprintf(b, sizeof b, "%.4f", n->test_accuracy);
    fact(f, "test accuracy", isfinite(n->test_accuracy) ? b : "&#8212;");
    if (n->model[0]) {
        fprintf(f, "<div><dt>model</dt><dd>");
        esc(f, n->model);
        fprintf(f, "</dd></div>");
    } else {
        fact(f, "model", "&#8212;");
    }
    fprintf(f, "</dl>\n");
}

static int render(const source *src, const char *run_name, char **html, size_t *len,
                  rk_report_stats *st, rk_err *err)
{
    *html = NULL;
    *len = 0;
    memset(st, 0, sizeof *st);
    data *d = rk_report_data_new();
    if (!d)
        return rk_err_set(err, RK_ENOMEM, "out of memory");
    nums n;
    plan p = {0};
    int rc = rk_report_load(d, &n, src, err);
    if (rc)
        goto out;
    if (make_plan(d, &p)) {
        rc = rk_err_set(err, RK_ENOMEM, "out of memory");
        goto out;
    }
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f) {
        rc = rk_err_set(err, RK_ENOMEM, "cannot render: %s", strerror(errno));
        goto out;
    }
    char name[256];
    rk_text_clean(name, sizeof name, run_name ? run_name : "run");
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
               "style-src 'unsafe-inline'\">\n"
               "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
               "<title>rk report: ");
    esc(f, name);
    fprintf(f, "</title>\n<style>%s</style></head><body>\n<header><h1>rk report: ", k_style);
    esc(f, name);
    fprintf(f, "</h1><p class=\"sub\">A run of <code>rk run</code> at a glance");
    if (d->inj.seen)
        fprintf(f, "; the faults were injected (simulated)");
    if (d->simulated)
        fprintf(f, "; the GPUs are simulated");
    fprintf(f, ".</p></header>\n");
    facts(f, d, &n);
    if (d->torn)
        fprintf(f,
                "<p class=\"warn\">%d file%s ended in a cut line (the writer was stopped "
                "mid-line); it was left out.</p>\n",
                d->torn, d->torn == 1 ? "" : "s");
    st->left_out = left_out_note(f, d, &p);
    loss_chart(f, d, &n, &p);
    goodput_chart(f, d, &n);
    devices_chart(f, d, &n, &p);
    gate_chart(f, d, &n, &p, 0);
    gate_chart(f, d, &n, &p, 1);
    ckpt_chart(f, d, &n, &p);
    event_table(f, d, 0);
    event_table(f, d, 1);
    fprintf(f,
            "<footer>Written by rk report from %s%s%s%s%s. Times are seconds since rk run "
            "started.</footer>\n</body></html>\n",
            present(&src[S_EVENTS]) ? RK_REPORT_EVENTS " " : "",
            present(&src[S_SUMMARY]) ? RK_REPORT_SUMMARY " " : "",
            present(&src[S_STEPS]) ? RK_REPORT_STEPS " "
            : d->untimed           ? RK_REPORT_LOSS " "
                                   : "",
            present(&src[S_GATE]) ? RK_REPORT_GATE " " : "",
            present(&src[S_METRICS]) ? RK_REPORT_METRICS : "");
    if (fclose(f) != 0 || !buf) {
        free(buf);
        rc = rk_err_set(err, RK_ENOMEM, "cannot render: out of memory");
        goto out;
    }
    if (blen > RK_REPORT_MAX_PAGE) { /* the limits above make this impossible: a bug */
        free(buf);
        rc = rk_err_set(err, RK_EINVAL, "the page came to %zu bytes, over its bound of %zu", blen,
                        RK_REPORT_MAX_PAGE);
        goto out;
    }
    *html = buf;
    *len = blen;
    st->incidents = (long)d->inc.seen;
    st->injections = (long)d->inj.seen;
    st->steps = (long)d->st.seen;
    st->launches = (long)d->la.seen;
    st->ckpts = (long)d->ck.seen;
    st->gate_lines = (long)d->ngt;
    st->gpus = p.gpus;
    st->torn = d->torn;
    st->simulated = d->simulated;
out:
    free(p.gate_n);
    rk_report_data_free(d);
    return rc;
}

int rk_report_render(const rk_report_in *in, char **html, size_t *len, rk_report_stats *st,
                     rk_err *err)
{
    source src[S_N] = {
        [S_EVENTS] = {.buf = in->events, .len = in->events_len, .fd = -1},
        [S_SUMMARY] = {.buf = in->summary, .len = in->summary_len, .fd = -1},
        [S_STEPS] = {.buf = in->steps, .len = in->steps_len, .fd = -1},
        [S_GATE] = {.buf = in->gate, .len = in->gate_len, .fd = -1},
        [S_METRICS] = {.buf = in->metrics, .len = in->metrics_len, .fd = -1},
        [S_LOSS] = {.buf = in->loss, .len = in->loss_len, .fd = -1},
    };
    return render(src, in->name, html, len, st, err);
}

/* ---- the files ---------------------------------------------------------------------------- */

static const char *const k_file[S_N] = {RK_REPORT_EVENTS, RK_REPORT_SUMMARY, RK_REPORT_STEPS,
                                        RK_REPORT_GATE,   RK_REPORT_METRICS, RK_REPORT_LOSS};
static const size_t k_max[S_N] = {RK_REPORT_MAX_EVENTS, RK_REPORT_MAX_JSON, RK_REPORT_MAX_LOG,
                                  RK_REPORT_MAX_LOG,    RK_REPORT_MAX_JSON, RK_REPORT_MAX_LOG};

int rk_report_write(const char *run_dir, const char *out_path, rk_report_stats *st, rk_err *err)
{
    memset(st, 0, sizeof *st);
    struct stat sb;
    if (stat(run_dir, &sb) != 0)
        return rk_err_set(err, errno == ENOENT ? RK_ENOENT : RK_EIO, "%s: %s", run_dir,
                          strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return rk_err_set(err, RK_EINVAL, "%s: is %s, not a run directory", run_dir,
                          rk_file_kind_name(sb.st_mode));
    source src[S_N];
    char path[S_N][4200];
    uint8_t *whole[S_N] = {0}; /* summary.json and metrics.json, read whole */
    int rc = RK_OK;
    for (int i = 0; i < S_N; i++)
        src[i] = (source){.fd = -1, .path = path[i], .max = k_max[i]};
    for (int i = 0; i < S_N && rc == RK_OK; i++) {
        if (i == S_LOSS && present(&src[S_STEPS])) /* loss.log: only without steps.jsonl */
            break;
        if ((size_t)snprintf(path[i], sizeof path[i], "%s/%s", run_dir, k_file[i]) >=
            sizeof path[i]) {
            rc = rk_err_set(err, RK_EINVAL, "%s: the path is too long", run_dir);
            break;
        }
        rk_err e = {0};
        uint64_t size = 0;
        rc = rk_file_open_read(path[i], k_max[i], &src[i].fd, &size, &e);
        if (rc == RK_ENOENT) {
            rc = RK_OK;
            continue;
        }
        if (rc) {
            rc = rk_err_set(err, rc, "%s", e.msg);
            break;
        }
        if (i == S_SUMMARY || i == S_METRICS) {
            size_t n = 0;
            if ((rc = rk_file_read_fd(src[i].fd, path[i], k_max[i], size, &whole[i], &n, &e))) {
                rc = rk_err_set(err, rc, "%s", e.msg);
                break;
            }
            src[i].buf = (const char *)whole[i];
            src[i].len = n;
        }
    }
    if (rc == RK_OK && !present(&src[S_EVENTS]) && !present(&src[S_STEPS]) &&
        !present(&src[S_LOSS]))
        rc = rk_err_set(err, RK_EINVAL,
                        "%s: holds none of %s, %s, %s (give rk run --events DIR/%s --steps "
                        "DIR/%s, or rk train --loss-log DIR/%s)",
                        run_dir, RK_REPORT_EVENTS, RK_REPORT_STEPS, RK_REPORT_LOSS,
                        RK_REPORT_EVENTS, RK_REPORT_STEPS, RK_REPORT_LOSS);
    if (rc == RK_OK) {
        /* the page calls the run by its directory's last name ("." and ".." resolved) */
        char name[256], *real = realpath(run_dir, NULL);
        const char *dn = real ? real : run_dir;
        size_t dl = strlen(dn);
        while (dl > 1 && dn[dl - 1] == '/')
            dl--;
        size_t from = dl;
        while (from > 0 && dn[from - 1] != '/')
            from--;
        snprintf(name, sizeof name, "%.*s", (int)(dl - from), dn + from);
        free(real);
        char *html = NULL;
        size_t hlen = 0;
        if ((rc = render(src, name, &html, &hlen, st, err)) == RK_OK)
            rc = rk_file_write_atomic(out_path, html, hlen, err);
        free(html);
    }
    for (int i = 0; i < S_N; i++) {
        if (src[i].fd >= 0)
            close(src[i].fd);
        free(whole[i]);
    }
    return rc;
}
