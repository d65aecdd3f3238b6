/*
 * rk report's reading of a run directory (read.c), private to src/report/: what is kept of
 * the files, bounded whatever they hold (report.h's limits: the first and last incidents and
 * launches, a sample of the steps), and the few numbers of summary.json and metrics.json.
 * report.c opens the files (or takes their bytes), has them read here and draws the page from
 * what is kept.
 */
#ifndef RK_REPORT_READ_H
#define RK_REPORT_READ_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "report/report.h"
#include "supervisor/events.h"
#include "supervisor/runlog.h"

/* The first cap/2 items offered and the last cap - cap/2 (a ring), in file order; the ones
 * between are counted, not kept. The array grows as items come, up to cap. */
typedef struct keeper {
    char *a;
    size_t size, cap, alloc;
    uint64_t seen;
} keeper;

static inline size_t keeper_n(const keeper *k)
{
    return k->seen < k->cap ? (size_t)k->seen : k->cap;
}

/* Items offered but not kept: they were between the first cap/2 and the last ones. */
static inline uint64_t keeper_left(const keeper *k)
{
    return k->seen - keeper_n(k);
}

/* The i-th kept item (0 <= i < keeper_n), in file order. */
static inline void *keeper_get(const keeper *k, size_t i)
{
    size_t head = k->cap / 2, ring = k->cap - head;
    if (k->seen <= k->cap || i < head)
        return k->a + i * k->size;
    uint64_t item = k->seen - ring + (i - head); /* the item's number in the file */
    return k->a + (head + (size_t)((item - head) % ring)) * k->size;
}

/* Every item while fewer than cap came; then one in 2, one in 4, ...: when the array is full
 * every other kept item goes and the stride doubles, so what is kept spreads over the whole
 * file. The last item offered is kept too (after the sample, when the sample missed it). */
typedef struct sampler {
    char *a; /* cap + 1 items */
    size_t size, cap, n, alloc;
    uint64_t seen, stride;
    char *last;    /* a copy of the last item offered */
    int last_kept; /* ... and it is a[n - 1] */
} sampler;

typedef struct step_pt {
    double t, loss, dt;
    int64_t step;
    int launch;
} step_pt;

typedef struct launch_pt {
    double t, t_next; /* its start, and the next launch's (NAN: none; the bar runs to the end) */
    int launch, n;
    uint16_t dev[RK_RUNLOG_MAX_DEVICES]; /* rank i's device: an index into the device table */
} launch_pt;

typedef struct ckpt_pt {
    double t, seconds;
    int64_t step;
} ckpt_pt;

typedef struct gate_pt {
    double t, temp;
    int dev, score, lost;
} gate_pt;

/* An incident or an injection kept, with its number among its kind in the file (from 1). */
typedef struct ev_pt {
    rk_event e;
    uint64_t no;
} ev_pt;

#define DEV_SLOTS 8192 /* the device table's hash: twice RK_REPORT_MAX_DEVICES */
_Static_assert(DEV_SLOTS >= 2 * RK_REPORT_MAX_DEVICES && RK_REPORT_MAX_DEVICES < 65535,
               "the hash has room, and an index fits a uint16_t");
_Static_assert(RK_REPORT_MAX_GATE_RECORDS == RK_RUNLOG_MAX_LINES + RK_RUNLOG_MAX_DEVICES &&
                   RK_REPORT_KEEP_STEPS == RK_RUNLOG_MAX_LINES,
               "report.h's record limits are what rk run writes at most (runlog.h)");

typedef struct data {
    keeper inc, inj; /* ev_pt: incidents, injections */
    sampler st;      /* step_pt */
    sampler ck;      /* ckpt_pt */
    keeper la;       /* launch_pt */
    gate_pt *gt;
    size_t ngt, capgt;
    char (*dev)[RK_RUNLOG_ID_LEN]; /* every device named (cleaned), in order of first appearance */
    int ndev, capdev;
    uint16_t devslot[DEV_SLOTS]; /* 0: empty; else 1 + an index into dev */
    double threshold;            /* the gate's threshold, -1 unknown */
    double t_end;                /* the latest time of any record read, kept or not */
    int untimed; /* the steps came from rk train's loss.log: no times, no launches */
    int simulated;
    int torn;
    rk_runlog_rec rec; /* the record being read (16 KiB of device ids) */
    ev_pt ev;          /* the event being read */
    launch_pt lrec;    /* the launch being read */
} data;

/* The kept steps and checkpoints (the samples' arrays). */
#define ST(d) ((const step_pt *)(d)->st.a)
#define CK(d) ((const ckpt_pt *)(d)->ck.a)

/* summary.json and metrics.json: the few numbers the page shows. */
typedef struct nums {
    int have_summary, have_metrics;
    char outcome[32];
    double wall_s, productive_s, goodput;
    int64_t steps, restarts, quarantined, final_ranks, injected;
    double recovery_median_s, recovery_max_s;
    char recovery[16], snapshots[16];          /* "" unknown (an older rk run) */
    int64_t snap_peak, from_memory, from_disk; /* -1 unknown */
    int64_t held_peak; /* partner copies' bytes at their peak (across hosts); -1 unknown */
    char model[64];
    double test_accuracy, final_train_loss;
} nums;

/* One of the run directory's files: its bytes (rk_report_render) or its open descriptor
 * (rk_report_write, which reads it line by line); absent when neither. */
typedef struct source {
    const char *buf;
    size_t len;
    int fd;
    const char *path;
    size_t max;
} source;

enum { S_EVENTS, S_SUMMARY, S_STEPS, S_GATE, S_METRICS, S_LOSS, S_N };

static inline int present(const source *s)
{
    return s->buf || s->fd >= 0;
}

/* A new, empty d (NULL: out of memory); rk_report_data_free frees it (NULL too). */
data *rk_report_data_new(void);
void rk_report_data_free(data *d);

/* Every present file of src into d and n, in the order the checks need. Bad content is
 * RK_EFORMAT naming the file, line and field; a torn last line is counted in d->torn. */
int rk_report_load(data *d, nums *n, const source *src, rk_err *err);

#endif
