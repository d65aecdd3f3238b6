/*
 * What rk run measures as the job goes (sup.h): the snapshot memory (rk_snap_bytes of the
 * job's snapshot directory, or across hosts what each node's agent says of its own and of the
 * partner copies it keeps, at most once a second, at each relaunch and at the end), its
 * notes in the events file (snapshot_on, snapshot_held, snapshot_peak: docs/run.md), and the
 * metrics file for node_exporter's textfile collector (--metrics-file, docs/metrics.md).
 * Relies on the snapshot store (rekindle/snap.h) and the atomic writer (rekindle/fileio.h).
 */
#include "supervisor/sup.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "rekindle/fileio.h"

#define GAUGE_EVERY_S 1.0 /* the least time between two measurements, two metrics files */

long rk_sup_metrics_format(const rk_sup_metrics *m, char *buf, size_t cap)
{
    const char *rec = m->recovery ? m->recovery : "disk";
    const char *snaps = m->snapshots ? m->snapshots : "none";
    int n = snprintf(
        buf, cap,
        "# HELP rk_run_info The job under rk run: its recovery mode (--recovery) and whether "
        "its snapshots in memory are on, off (turned off for want of room) or none.\n"
        "# TYPE rk_run_info gauge\n"
        "rk_run_info{recovery=\"%s\",snapshots=\"%s\"} 1\n"
        "# HELP rk_run_snapshot_bytes Bytes of the job's snapshots in memory (tmpfs) on its "
        "nodes (this host's, or every host's across hosts), as last measured.\n"
        "# TYPE rk_run_snapshot_bytes gauge\n"
        "rk_run_snapshot_bytes %" PRIu64 "\n"
        "# HELP rk_run_snapshot_bytes_peak The most bytes of the job's snapshots its nodes' "
        "memory held.\n"
        "# TYPE rk_run_snapshot_bytes_peak gauge\n"
        "rk_run_snapshot_bytes_peak %" PRIu64 "\n"
        "# HELP rk_run_snapshot_held_bytes Bytes of partner copies (other nodes' ranks' "
        "snapshots) the job's nodes hold in memory, as last measured.\n"
        "# TYPE rk_run_snapshot_held_bytes gauge\n"
        "rk_run_snapshot_held_bytes %" PRIu64 "\n"
        "# HELP rk_run_snapshot_held_bytes_peak The most bytes of partner copies the job's "
        "nodes held.\n"
        "# TYPE rk_run_snapshot_held_bytes_peak gauge\n"
        "rk_run_snapshot_held_bytes_peak %" PRIu64 "\n"
        "# HELP rk_run_relaunches_total Relaunches whose ranks all restored their state from "
        "the node's memory or from disk.\n"
        "# TYPE rk_run_relaunches_total counter\n"
        "rk_run_relaunches_total{source=\"memory\"} %d\n"
        "rk_run_relaunches_total{source=\"disk\"} %d\n"
        "# HELP rk_run_restarts_total Relaunches of the job.\n"
        "# TYPE rk_run_restarts_total counter\n"
        "rk_run_restarts_total %d\n"
        "# HELP rk_run_step The most steps done by any rank.\n"
        "# TYPE rk_run_step gauge\n"
        "rk_run_step %" PRId64 "\n",
        rec, snaps, m->snap_bytes, m->snap_peak, m->held_bytes, m->held_peak, m->from_memory,
        m->from_disk, m->restarts, m->step < 0 ? 0 : m->step);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* ", rank 0: 2 x 1.05 MiB, rank 1: ..." for the ranks of this launch into buf[cap] (cut when
 * full). */
static void per_rank(const sup *s, char *buf, size_t cap)
{
    size_t u = 0;
    buf[0] = '\0';
    for (int r = 0; r < s->n && u + 1 < cap; r++) {
        uint64_t b;
        int gens;
        rk_err e = {0};
        if (rk_snap_rank_bytes(s->snap_dir, r, &b, &gens, &e) != RK_OK)
            continue;
        int w = gens ? snprintf(buf + u, cap - u, "%srank %d: %d x %.2f MiB", r ? ", " : "", r,
                                gens, mib(b / (uint64_t)gens))
                     : snprintf(buf + u, cap - u, "%srank %d: none", r ? ", " : "", r);
        if (w < 0)
            break;
        u += (size_t)w < cap - u ? (size_t)w : cap - u - 1;
    }
}

/* Across hosts: "h1 3.40 MiB (partner copies 1.70 MiB), h2 ..." for every node whose agent
 * said its memory (the backend's snap_mem) into buf[cap] (cut when full). */
static void per_node(const sup *s, char *buf, size_t cap)
{
    size_t u = 0;
    rk_sup_snap_mem m;
    buf[0] = '\0';
    for (int k = 0; u + 1 < cap && s->b.ops->snap_mem(s->b.ctx, k, &m); k++) {
        if (!m.have)
            continue;
        int w = snprintf(buf + u, cap - u, "%s%s %.2f MiB (partner copies %.2f MiB)", u ? ", " : "",
                         m.name, mib(m.own), mib(m.held));
        if (w < 0)
            break;
        u += (size_t)w < cap - u ? (size_t)w : cap - u - 1;
    }
}

/* Where the bytes are, for the notes: each rank's generations on this host, or each node's
 * memory across hosts. */
static void where(const sup *s, char *buf, size_t cap)
{
    if (s->b.ops->snap_mem)
        per_node(s, buf, cap);
    else
        per_rank(s, buf, cap);
}

/* Measure the snapshot memory now: the bytes held (0 once it is gone) and the peak, the
 * partner copies held across hosts too; the first time any are held, the snapshot_on note.
 * This host's directory is read (one that cannot be read keeps the last measure); across
 * hosts the agents' word is summed (SNAP_MEM, once a second at most). */
static void measure(sup *s)
{
    s->gauge_t = rk_ledger_now(&s->g);
    uint64_t b = 0, held = 0;
    if (s->b.ops->snap_mem) {
        rk_sup_snap_mem m;
        for (int k = 0; s->b.ops->snap_mem(s->b.ctx, k, &m); k++) {
            b += m.own;
            held += m.held;
        }
    } else if (s->snap_dir[0]) {
        rk_err e = {0};
        if (rk_snap_bytes(s->snap_dir, &b, &e) != RK_OK)
            return;
    } /* else none, or removed after a snapshot_off: nothing held */
    s->g.snap_bytes = b;
    s->g.held_bytes = held;
    if (b > s->g.snap_peak)
        s->g.snap_peak = b;
    if (held > s->g.held_peak)
        s->g.held_peak = held;
    if (b > 0 && !s->snap_told) {
        char at[600];
        where(s, at, sizeof at);
        if (s->b.ops->snap_mem)
            sup_record(s, "snapshot_on", -1, "", "none",
                       "snapshots in memory: %" PRIu64 " bytes (%.2f MiB) on the job's nodes; %s",
                       b, mib(b), at);
        else
            sup_record(s, "snapshot_on", -1, "", "none",
                       "snapshots in memory: %" PRIu64 " bytes (%.2f MiB) in %s; %s", b, mib(b),
                       s->snap_dir, at);
        s->snap_told = 1;
    }
}

/* The metrics file now (atomic); a failure said once, the job goes on. */
static void write_metrics(sup *s)
{
    if (!s->o->metrics_path)
        return;
    s->metrics_t = rk_ledger_now(&s->g);
    rk_sup_metrics m = {.snap_bytes = s->g.snap_bytes,
                        .snap_peak = s->g.snap_peak,
                        .held_bytes = s->g.held_bytes,
                        .held_peak = s->g.held_peak,
                        .from_memory = s->g.from_memory,
                        .from_disk = s->g.from_disk,
                        .restarts = s->g.restarts,
                        .step = s->last_done,
                        .recovery = s->g.recovery,
                        .snapshots = s->g.snapshots};
    char text[RK_SUP_METRICS_MAX];
    long n = rk_sup_metrics_format(&m, text, sizeof text);
    rk_err e = {0};
    if (n >= 0 && rk_file_write_atomic(s->o->metrics_path, text, (size_t)n, &e) == RK_OK) {
        s->metrics_told = 0;
        return;
    }
    if (!s->metrics_told++)
        sup_say(s, "--metrics-file: %s", n < 0 ? "the metrics do not fit" : e.msg);
}

void sup_gauge_tick(sup *s)
{
    double now = rk_ledger_now(&s->g);
    if (s->gauge_t < 0 || now - s->gauge_t >= GAUGE_EVERY_S)
        measure(s);
    if (s->o->metrics_path && (s->metrics_t < 0 || now - s->metrics_t >= GAUGE_EVERY_S))
        write_metrics(s);
}

void sup_gauge_relaunch(sup *s)
{
    measure(s);
    if ((s->snap_dir[0] || s->b.ops->snap_mem) && s->snap_told) {
        char at[600], held[96] = "";
        where(s, at, sizeof at);
        if (s->g.held_bytes > 0)
            snprintf(held, sizeof held, " and %" PRIu64 " bytes (%.2f MiB) of partner copies",
                     s->g.held_bytes, mib(s->g.held_bytes));
        sup_record(s, "snapshot_held", -1, "", "none",
                   "launch %d ended holding %" PRIu64
                   " bytes (%.2f MiB) of snapshots in memory%s%s; %s",
                   s->launch_no, s->g.snap_bytes, mib(s->g.snap_bytes), held,
                   s->snap_off ? " (turned off: removed before the relaunch)" : "", at);
    }
}

void sup_gauge_end(sup *s)
{
    measure(s);
    if (s->snap_told) {
        char held[160] = "";
        if (s->g.held_peak > 0)
            snprintf(held, sizeof held,
                     "; partner copies on other nodes peaked at %" PRIu64 " bytes (%.2f MiB)",
                     s->g.held_peak, mib(s->g.held_peak));
        sup_record(s, "snapshot_peak", -1, "", "none",
                   "the job's snapshots in memory peaked at %" PRIu64 " bytes (%.2f MiB); %" PRIu64
                   " bytes held at the end%s; relaunches restored from memory %d, from disk %d",
                   s->g.snap_peak, mib(s->g.snap_peak), s->g.snap_bytes, held, s->g.from_memory,
                   s->g.from_disk);
    }
    write_metrics(s);
}
