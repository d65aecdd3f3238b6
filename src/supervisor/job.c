/*
 * The job's few shared acts (sup.h), each file of the loop's to call: the status line, a
 * rank's device and connection, a command to every rank (the stop), a failure seen in this
 * launch. It calls no other file of the loop: the bottom of the supervisor's call graph, so
 * that conns.c, drain.c, watch.c and a backend (backend.h) can all say, stop and fail
 * without calling each other.
 */
#include "supervisor/sup.h"

#include "base/phase.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

void sup_say(const sup *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rk run: [%6.1f s] ", rk_ledger_now(&s->g));
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

const char *sup_devname(const sup *s, int rank)
{
    if (rank < 0 || rank >= s->n)
        return "";
    return s->o->devices[s->dev[rank]];
}

rk_sup_conn *sup_by_rank(sup *s, int rank)
{
    for (int k = 0; k < s->nconn; k++)
        if (s->c[k].rank == rank)
            return &s->c[k];
    return NULL;
}

/* One command to one rank, never blocking (a rank that does not read loses it). */
void sup_send_cmd(const rk_sup_conn *c, rk_hb_cmd cmd)
{
    char line[RK_HB_CMD_LINE_MAX];
    size_t len;
    if (c->fd >= 0 && rk_hb_cmd_format(cmd, line, sizeof line, &len, NULL) == RK_OK)
        (void)send(c->fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void sup_send_all(sup *s, rk_hb_cmd cmd)
{
    for (int k = 0; k < s->nconn; k++)
        if (s->c[k].fd >= 0 && !sup_conn_left(&s->c[k]))
            sup_send_cmd(&s->c[k], cmd);
}

int sup_conn_left(const rk_sup_conn *c)
{
    return c->st == SUP_CONN_LEFT || c->st == SUP_CONN_DONE;
}

int sup_hellos(const sup *s)
{
    int n = 0;
    for (int k = 0; k < s->nconn; k++)
        n += s->c[k].st >= SUP_CONN_RANK;
    return n;
}

/* The launch's transitions (sup.h lists them). */
int sup_stop_sent(const sup *s)
{
    return s->ls == SUP_LAUNCH_STOPPING || s->ls == SUP_LAUNCH_STOPPED_FAILING;
}

int sup_failing(const sup *s)
{
    return s->ls == SUP_LAUNCH_FAILING || s->ls == SUP_LAUNCH_STOPPED_FAILING;
}

void sup_stop_job(sup *s)
{
    if (sup_stop_sent(s))
        return;
    sup_send_all(s, RK_HB_CMD_STOP);
    s->ls = s->ls == SUP_LAUNCH_FAILING ? SUP_LAUNCH_STOPPED_FAILING : SUP_LAUNCH_STOPPING;
}

/* RUNNING -> FAILING, STOPPING -> STOPPED_FAILING, from now. */
static void to_failing(sup *s)
{
    s->ls = s->ls == SUP_LAUNCH_STOPPING ? SUP_LAUNCH_STOPPED_FAILING : SUP_LAUNCH_FAILING;
    s->ftime = rk_ledger_now(&s->g);
    rk_phase_mark("sup.fail", s->launch_no, -1); /* RK_TRACE_LAUNCH (base/phase.h) */
}

void sup_fail(sup *s, const char *fmt, ...)
{
    if (sup_failing(s))
        return;
    to_failing(s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->fdetail, sizeof s->fdetail, fmt, ap);
    va_end(ap);
}

void sup_fail_said(sup *s, const char *fmt, ...)
{
    if (!sup_failing(s))
        to_failing(s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->fdetail, sizeof s->fdetail, fmt, ap);
    va_end(ap);
}

void sup_fail_node(sup *s, int node, int rank, const char *name, const char *what)
{
    if (sup_failing(s)) { /* a failure the ranks showed first is its effect */
        sup_say(s,
                "node %d (%s) was lost with the failure seen just before (%s): the node's "
                "loss is its cause",
                node, name, s->fdetail);
        snprintf(s->fdetail, sizeof s->fdetail, "%.*s", (int)sizeof s->fdetail - 1, what);
    } else {
        sup_fail(s, "%s", what);
    }
    s->seen.node_lost = node;
    s->seen.node_rank = rank;
}
