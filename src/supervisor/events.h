/*
 * The events file's line (docs/run.md, "Accounting"): one incident of rk run as one JSON
 * object. The writer is the ledger (ledger.c, `rk run --events`), the reader is rk report
 * (src/report/); both go through the one table of fields in events.c, which names each field,
 * its type, its bounds and how an unknown value is written, so the two cannot drift apart.
 */
#ifndef RK_SUPERVISOR_EVENTS_H
#define RK_SUPERVISOR_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

#define RK_EVENT_MAX_LINE 65536 /* bytes of one line, its newline excluded */

/* One line, in the order its fields are written. A text field the reader takes is cleaned of
 * control characters and bytes that are not UTF-8 (base/text.h: rk_text_clean) and cut to fit
 * on a character boundary; a value outside its field's bounds is written as unknown. */
typedef struct rk_event {
    char time[40];      /* "time": UTC, ISO 8601 to the millisecond (rk_event_stamp); "" absent */
    double t;           /* "t": seconds since rk run started, 0 to 1e10 (to the millisecond) */
    char kind[64];      /* "kind": crash, hang, ..., inject; never empty */
    int rank;           /* "rank": 0 to 65535; -1 unknown (null) */
    char device[64];    /* "device": "" none (null) */
    char action[32];    /* "action": relaunch, stop, ... ("" when absent) */
    int64_t step;       /* "step": 0 to 2^53; -1 unknown (null; an older rk run: absent) */
    int64_t lost_steps; /* "lost_steps": >= 0; -1 unknown (null) */
    double recovery_s;  /* "recovery_s": 0 to 1e10 (to the millisecond); NAN unknown (null) */
    char detail[1024];  /* "detail" */
    char stacks[2048];  /* "stacks": a hang's stack dumps, one file a line ("": the field is
                         * absent); empty names are left out, and the reader keeps the files
                         * that fit whole */
} rk_event;

/* 1 if an event of this kind is a note, not an incident: what rk run measured of the job's
 * snapshots in memory ("snapshot_on", "snapshot_held", "snapshot_peak": docs/run.md). The
 * summary does not count notes among the incidents, and rk report draws no marker for them. */
int rk_event_is_note(const char *kind);

/* Clear e: every field unknown or empty. */
void rk_event_init(rk_event *e);

/* e->time from `epoch_s`, seconds since the epoch ("2026-12-06T08:16:03.125Z"). */
void rk_event_stamp(rk_event *e, double epoch_s);

/* The event as one line (no newline) into buf[cap]: its length, or -1 when it is not one the
 * reader takes (t outside its bounds, kind empty) or does not fit. A text field that is not
 * UTF-8 is written cleaned (rk_text_clean), never left out. */
long rk_event_format(const rk_event *e, char *buf, size_t cap);

/* Parse one line (len bytes, no newline; need not be NUL-terminated) into e. Unknown fields
 * are ignored (a later version only adds fields). RK_EFORMAT with the field and the problem
 * in err otherwise. */
int rk_event_parse(const char *line, size_t len, rk_event *e, rk_err *err);

#endif
