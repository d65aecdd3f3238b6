/*
 * The incidents waiting for the job to be back at work (sup.h): a relaunch's, or an event a
 * rank handled in-process, is written to the ledger once its recovery is known (the job
 * applies a step with all its ranks back), with its recovery time and the steps it cost, or
 * without them when the job ends first. It calls only the ledger: conns.c (a rank's step, an
 * in-process event) and run.c (a relaunch, the job's end) both record here, calling neither
 * each other nor the watch loop.
 */
#include "supervisor/sup.h"

#include "base/phase.h"

#include <stdio.h>
#include <string.h>

void sup_pend(sup *s, rk_incident *i)
{
    if (!i)
        return;
    size_t idx = (size_t)(i - s->g.inc);
    if (s->npending < (int)(sizeof s->pending / sizeof s->pending[0]))
        s->pending[s->npending++] = idx;
    else
        rk_ledger_write(&s->g, i);
}

void sup_pend_relaunch(sup *s, rk_incident *i)
{
    s->pending_last_done = s->last_done;
    for (int k = 0; k < s->nconn; k++) { /* the most each rank had done, over pending ones */
        int cr = s->c[k].rank;
        if (cr >= 0 && cr < RK_SUP_MAX_DEVICES && s->c[k].done > s->pending_done[cr])
            s->pending_done[cr] = s->c[k].done;
    }
    sup_pend(s, i);
}

/* A relaunch's lost steps, from every rank: the most any rank has to do again (the steps it
 * had done at the failure less the step its hello in the relaunch resumed from). Ranks
 * without both numbers: the most done by any rank less the step the relaunch resumed from. */
static void set_lost(sup *s, rk_incident *i, int64_t resumed_from)
{
    if (i->lost_steps >= 0 || resumed_from < 0)
        return;
    int64_t lost = -1;
    for (int r = 0; r < s->n; r++)
        if (s->pending_done[r] >= 0 && s->hello_step[r] >= 0) {
            int64_t d = s->pending_done[r] - s->hello_step[r];
            lost = d > lost ? d : lost;
        }
    if (lost < 0)
        lost = s->pending_last_done - resumed_from;
    i->lost_steps = lost > 0 ? lost : 0;
}

/* A relaunch's detail ends with where its ranks' state came from, as their hellos said. */
static void say_restore(const sup *s, rk_incident *i, int64_t resumed_from)
{
    const char *from = s->restore == RK_HB_RESTORE_MEMORY ? "node memory"
                       : s->restore == RK_HB_RESTORE_DISK ? "disk checkpoint"
                       : s->restore == RK_HB_RESTORE_NONE ? "nothing (a fresh start)"
                                                          : NULL;
    size_t n = strlen(i->detail);
    if (s->restore == RK_HB_RESTORE_PEER && n < sizeof i->detail)
        snprintf(i->detail + n, sizeof i->detail - n,
                 "; healed at step %lld: the ranks kept their state in memory and the "
                 "replacement took theirs (only the step in flight lost)",
                 (long long)resumed_from);
    else if (from && n < sizeof i->detail && strcmp(i->action, "in_place") == 0)
        snprintf(i->detail + n, sizeof i->detail - n,
                 "; every rank (the replacement and the ranks kept) resumed from %s at step %lld",
                 from, (long long)resumed_from);
    else if (from && n < sizeof i->detail)
        snprintf(i->detail + n, sizeof i->detail - n, "; resumed from %s at step %lld", from,
                 (long long)resumed_from);
}

/* The incidents waiting for their recovery, written to the ledger, the one path of both ends
 * of the wait: recovered (the job is back at work: all its ranks said hello and one applied a
 * step, or the relaunch finished), their recovery time is now; not (the job ends without
 * having recovered), none. Lost steps if a relaunch said where it resumed. */
static void write_pending(sup *s, int recovered, int64_t resumed_from)
{
    double now = rk_ledger_now(&s->g);
    if (recovered && s->npending > 0)
        rk_phase_mark("sup.resumed", s->launch_no, -1); /* RK_TRACE_LAUNCH (base/phase.h) */
    for (int k = 0; k < s->npending; k++) {
        rk_incident *i = &s->g.inc[s->pending[k]];
        if (recovered)
            i->recovery_s = now - i->t;
        set_lost(s, i, resumed_from);
        if (recovered && resumed_from >= 0 &&
            (strcmp(i->action, "relaunch") == 0 || strcmp(i->action, "in_place") == 0))
            say_restore(s, i, resumed_from);
        rk_ledger_write(&s->g, i);
    }
    s->npending = 0;
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++)
        s->pending_done[r] = -1;
}

void sup_resolve_pending(sup *s, int64_t resumed_from)
{
    write_pending(s, 1, resumed_from);
}

void sup_flush_pending(sup *s)
{
    write_pending(s, 0, s->start_step);
}
