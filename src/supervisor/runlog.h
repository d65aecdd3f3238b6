/*
 * The run's records beside its events file (docs/run.md, "The run's records"): the steps
 * file (`rk run --steps FILE`: each launch's devices, rank 0's applied steps with their
 * loss, each checkpoint) and the gate file (`rk run --gate-log FILE`: every GPU's score and
 * temperature at each reading of the health gate). One JSON object a line. The writer is the
 * ledger (ledger.c), the reader is `rk report` (report.c); both use the one line format and
 * its checks here, and the thinning rule that bounds the files.
 */
#ifndef RK_SUPERVISOR_RUNLOG_H
#define RK_SUPERVISOR_RUNLOG_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

#define RK_RUNLOG_MAX_LINE 65536  /* bytes of one line, its newline excluded */
#define RK_RUNLOG_MAX_DEVICES 256 /* devices of one launch record (RK_SUP_MAX_DEVICES) */
#define RK_RUNLOG_ID_LEN 64       /* a device id: at most 63 bytes */
#define RK_RUNLOG_MAX_STEP ((int64_t)1 << 53)
#define RK_RUNLOG_MAX_LAUNCH 1000000
/* The thinning: every record of a kind while fewer than RK_RUNLOG_THIN_EVERY were written,
 * then one in 2, one in 4, ... (the stride doubles after each further RK_RUNLOG_THIN_EVERY
 * lines), and none past RK_RUNLOG_MAX_LINES. */
#define RK_RUNLOG_THIN_EVERY 20000
#define RK_RUNLOG_MAX_LINES 400000

typedef enum rk_runlog_type {
    RK_RUNLOG_LAUNCH, /* a launch began: t, launch, devices (rank i on devices[i]) */
    RK_RUNLOG_STEP,   /* rank 0 applied a step: t, launch, rank, step, loss, dt */
    RK_RUNLOG_CKPT,   /* rank 0 wrote a checkpoint: t, launch, rank, step, seconds */
    RK_RUNLOG_GATE    /* the gate read a GPU: t, device, score, temperature_c, lost, ... */
} rk_runlog_type;

typedef struct rk_runlog_rec {
    rk_runlog_type type;
    double t;       /* seconds since rk run started (the events file's clock) */
    int launch;     /* launch, step, ckpt: the launch number (RK_LAUNCH) */
    int rank;       /* step, ckpt */
    int64_t step;   /* step: steps applied, this one included; ckpt: the checkpoint's step */
    double loss;    /* step: NAN when it was not finite (null in the file) */
    double dt;      /* step: seconds the step took (>= 0) */
    double seconds; /* ckpt: what the rank reported the write took (>= 0) */
    int ndevices;   /* launch: 1..RK_RUNLOG_MAX_DEVICES */
    char devices[RK_RUNLOG_MAX_DEVICES][RK_RUNLOG_ID_LEN]; /* launch: rank i's device */
    char device[RK_RUNLOG_ID_LEN];                         /* gate */
    int score;                                             /* gate: 0-100 */
    double temperature_c; /* gate: NAN when the GPU did not report it */
    int lost;             /* gate: the GPU is gone (off the bus) */
    int simulated;        /* gate: a simulated GPU */
    double threshold;     /* gate: --health-threshold */
} rk_runlog_rec;

/* Clear r for a record of `type` (loss and temperature NAN). */
void rk_runlog_init(rk_runlog_rec *r, rk_runlog_type type);

/* The record as one line (no newline) into buf[cap]: its length, or -1 when it is not a
 * valid record or does not fit. */
long rk_runlog_format(const rk_runlog_rec *r, char *buf, size_t cap);

/* Parse one line (len bytes, no newline; need not be NUL-terminated) into r. Unknown fields
 * are ignored (a later version only adds fields). RK_EFORMAT with the field and the problem
 * in err otherwise. */
int rk_runlog_parse(const char *line, size_t len, rk_runlog_rec *r, rk_err *err);

/* The thinning of one kind of record: call rk_runlog_thin_keep for each record offered;
 * it says whether to write it. */
typedef struct rk_runlog_thin {
    int64_t seen, written;
} rk_runlog_thin;
int rk_runlog_thin_keep(rk_runlog_thin *th);

#endif
