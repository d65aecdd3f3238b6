/*
 * rk report (docs/report.md): a run at a glance. Reads what `rk run` and `rk train` leave in
 * a run directory (events.jsonl, summary.json, steps.jsonl, gate.jsonl, metrics.json, and
 * rk train's loss.log when there is no steps.jsonl; every one optional but events.jsonl,
 * steps.jsonl or loss.log needed) and renders one self-contained HTML
 * page: inline SVG charts, a stylesheet for the screen and for paper, no script, nothing
 * fetched. Every string from the files is escaped. Library code: it prints nothing.
 */
#ifndef RK_REPORT_REPORT_H
#define RK_REPORT_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

/* Limits (docs/report.md, "Limits"). What is read: a file larger than its bound is refused
 * before a byte is read; more records than a record bound, or a line longer than a line
 * bound (the supervisor's line formats: RK_EVENT_MAX_LINE, RK_RUNLOG_MAX_LINE), is refused
 * when it is read (RK_EFORMAT naming the file). */
#define RK_REPORT_MAX_LOG ((size_t)256 << 20)   /* steps.jsonl, gate.jsonl, loss.log */
#define RK_REPORT_MAX_EVENTS ((size_t)64 << 20) /* events.jsonl */
#define RK_REPORT_MAX_JSON ((size_t)1 << 20)    /* summary.json, metrics.json */
#define RK_REPORT_MAX_GATE_RECORDS 400256       /* what rk run writes at most (runlog.h's bound) */
#define RK_REPORT_MAX_DEVICES 4096              /* device ids in steps.jsonl and gate.jsonl */

/* What is kept (memory) and drawn (the page's size), whatever the files hold: beyond these
 * the report samples or caps, and the page says what it left out. */
#define RK_REPORT_KEEP_EVENTS 500    /* incidents: the first 250 and the last 250; injections too */
#define RK_REPORT_KEEP_STEPS 400000  /* step records, and checkpoints: beyond, one in 2, 4, ... */
#define RK_REPORT_KEEP_LAUNCHES 1000 /* launch records: the first 500 and the last 500 */
#define RK_REPORT_MAX_BARS 2048      /* launch bars (ranks on devices) */
#define RK_REPORT_MAX_SERIES 256     /* device lines in each GPU chart */
#define RK_REPORT_MAX_MARKS 1000     /* loss-line pieces, NaN crosses, checkpoint marks */
#define RK_REPORT_MAX_PAGE ((size_t)16 << 20)    /* the page's bytes */
#define RK_REPORT_MAX_MEMORY ((size_t)256 << 20) /* rk report's peak memory (tested) */

/* The files' names in a run directory. */
#define RK_REPORT_EVENTS "events.jsonl"
#define RK_REPORT_SUMMARY "summary.json"
#define RK_REPORT_STEPS "steps.jsonl"
#define RK_REPORT_GATE "gate.jsonl"
#define RK_REPORT_METRICS "metrics.json"
#define RK_REPORT_LOSS                                                                             \
    "loss.log" /* rk train --loss-log: "STEP LOSS" a line, read without steps.jsonl */

/* The files' contents (NULL: the file is absent); `name` is what the page calls the run. */
typedef struct rk_report_in {
    const char *name;
    const char *events, *summary, *steps, *gate, *metrics, *loss;
    size_t events_len, summary_len, steps_len, gate_len, metrics_len, loss_len;
} rk_report_in;

/* What the page shows, counted (for the CLI's line and the tests). */
typedef struct rk_report_stats {
    long incidents;  /* events that are not injections: one marker each on the loss chart */
    long injections; /* inject events */
    long steps;      /* step records */
    long launches;   /* launch records */
    long ckpts;      /* checkpoint records */
    long gate_lines; /* gate records */
    long gpus;       /* devices in the gate records */
    int torn;        /* files whose last line was cut (a crash mid-write): left out */
    int left_out;    /* the page leaves records out (sampled or capped): it says which */
    int simulated;   /* the gate's GPUs were simulated */
} rk_report_stats;

/* Render the page into a new buffer (*html, free() it; *len bytes, NUL-terminated, at most
 * RK_REPORT_MAX_PAGE). Bad content is RK_EFORMAT naming the file, line and field. A last line
 * without a newline that does not parse (the writer was killed mid-line) is left out and
 * counted in st->torn. */
int rk_report_render(const rk_report_in *in, char **html, size_t *len, rk_report_stats *st,
                     rk_err *err);

/* Read run_dir's files (bounded, regular files only, rekindle/fileio.h; line by line, so the
 * memory used does not grow with the files) and write the page to out_path atomically: on
 * any error nothing is written. RK_EINVAL for a run_dir that is
 * not a directory or holds none of events.jsonl, steps.jsonl, loss.log; the readers' errors
 * otherwise (RK_EFORMAT, RK_EINVAL: not a regular file), each naming the file. */
int rk_report_write(const char *run_dir, const char *out_path, rk_report_stats *st, rk_err *err);

#endif
