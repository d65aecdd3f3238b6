/*
 * Watching one launch (sup.h): poll() on the heartbeat socket, the ranks' connections and a
 * 100 ms tick, until the job finishes, a failure is seen and the job is torn down, or rk run
 * is interrupted. The loop only gathers what it saw (rk_sup_seen); what that means (crash,
 * hang, communication failure, storage, bad usage, ...) and what to do next is policy.h's.
 */
#include "supervisor/sup.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/clock.h"
#include "base/phase.h"

#define TICK_MS 100
/* At most one round of reading every PACE_S: a busy job's ranks send a few lines a step each,
 * and a round per line woke rk run hundreds of times a second (poll, recv, the keeper's pipe,
 * waitpid: 8 system calls a round with 2 ranks), CPU its ranks lost on a machine they fill: a
 * round cost 87 us of CPU on the 2-core test machine, 4.4% of a core at 2 ms, 0.9% at 10 ms,
 * 0.2% at 50 ms. Lines wait in the socket buffers meanwhile (a few kB) and are read together,
 * up to READ_ROUNDS buffers of 8 KiB a connection a round; what rk run sees is 50 ms late at
 * most, against timeouts of seconds. Between rounds it still wakes at once for a new
 * connection and for what a connection says before its hello is read (pace): a hello is
 * believed from the process the kernel named at accept, read from /proc then (conns.c), so a
 * rank that connects, speaks and exits within one pace is heard (at a 50 ms pace that only
 * read at the rounds, it_classify's rank that only says bye was not). */
#define PACE_S 0.050
#define READ_ROUNDS 16

const char *sup_verdict_kind(const sup *s)
{
    if (s->v.kind == RK_SUP_KIND_OTHER)
        return s->exit_word;
    const char *name = rk_sup_kind_name(s->v.kind);
    return name ? name : "";
}

/* Kill whatever is left of this launch: every process the keeper holds (launch.c), found
 * by the kernel, never by the pids workers reported; ranks that never said hello too. */
static void teardown(sup *s, double grace)
{
    rk_phase_mark("sup.teardown", s->launch_no, -1);
    s->b.ops->kill(s->b.ctx, grace);
    sup_close_conns(s);
    rk_phase_mark("sup.torn", s->launch_no, -1);
}

/* Ranks that made the least progress (a hang's suspects, policy.h), as "1,3" into who[cap],
 * flagged in stuck[] (NULL: not wanted); the first into *rank. */
static int stuck_ranks(sup *s, int *rank, char *who, size_t cap, int *stuck_out)
{
    int64_t progress[RK_SUP_MAX_DEVICES];
    static int mine[RK_SUP_MAX_DEVICES];
    int *stuck = stuck_out ? stuck_out : mine;
    for (int r = 0; r < s->n; r++) {
        const rk_sup_conn *c = sup_by_rank(s, r);
        progress[r] = c ? c->progress : -1;
    }
    int count = rk_sup_stuck_ranks(s->n, progress, stuck, rank);
    size_t used = 0;
    who[0] = '\0';
    for (int r = 0; r < s->n; r++)
        if (stuck[r] && used + 16 < cap)
            used += (size_t)snprintf(who + used, cap - used, used ? ",%d" : "%d", r);
    return count;
}

static void check_timeouts(sup *s)
{
    double now = rk_ledger_now(&s->g);
    /* inplace.c bounds a replacement, and a hung rank it killed is its to replace */
    if (sup_failing(s) || s->ip_state == IP_REPLACING || s->ip_hung >= 0)
        return;
    if (sup_hellos(s) < s->n) {
        if (now - s->t_launch > s->o->startup_timeout_s) {
            int r;
            char who[256];
            stuck_ranks(s, &r, who, sizeof who, NULL);
            s->seen.startup_timeout = 1;
            sup_fail(s,
                     "rank %s never connected to %s within %.0f s (does the worker speak "
                     "docs/protocol.md?)",
                     who, RK_HB_ENV, s->o->startup_timeout_s);
        }
        return;
    }
    for (int k = 0; k < s->nconn; k++) {
        rk_sup_conn *c = &s->c[k];
        if (c->rank < 0 || sup_conn_left(c) || now - c->last <= s->o->hb_timeout_s ||
            (c->st == SUP_CONN_LOST && s->lost_t[c->rank] > 0)) /* the keeper's word decides */
            continue;
        int r;
        char who[256];
        int stuck[RK_SUP_MAX_DEVICES];
        int nstuck = stuck_ranks(s, &r, who, sizeof who, stuck);
        rk_sup_conn *sc = r >= 0 ? sup_by_rank(s, r) : c;
        if (nstuck == 0 || r < 0) {
            r = c->rank;
            snprintf(who, sizeof who, "%d", r);
            memset(stuck, 0, sizeof stuck);
            stuck[r] = 1;
        }
        char detail[RK_HB_DETAIL_MAX + 64];
        snprintf(detail, sizeof detail,
                 "rank %s (device %s) made no progress for %.1f s at step %lld%s", who,
                 sup_devname(s, r), now - (sc ? sc->last : c->last),
                 (long long)(sc ? sc->done : c->done),
                 nstuck < s->n ? "; the other ranks wait for it" : "");
        if (nstuck == 1 && sup_inplace_may(s, r)) { /* one rank hung: in place, if it can */
            sup_dump_stacks(s, stuck);              /* where it is stuck, then it is killed */
            if (sup_inplace_hang(s, r, detail))
                return;
            s->seen.hang = 1;
            s->seen.hang_rank = r;
            sup_fail(s, "%s", detail);
            return;
        }
        s->seen.hang = 1;
        s->seen.hang_rank = nstuck == s->n ? -1 : r;
        sup_fail(s, "%s", detail);
        sup_dump_stacks(s, stuck); /* before the teardown: where each hung rank is stuck */
        return;
    }
}

static void status_line(sup *s)
{
    double now = rk_ledger_now(&s->g);
    if (s->o->quiet || now - s->last_status < 10.0)
        return;
    s->last_status = now;
    sup_say(s, "%.0f s: step %lld, loss %.4f, %d rank%s, %d restart%s", now,
            (long long)s->last_done, s->loss, s->n, s->n == 1 ? "" : "s", s->g.restarts,
            s->g.restarts == 1 ? "" : "s");
}

/* The ranks of this launch that never said hello, as "1,3", into who[cap]. */
static void ranks_without_hello(sup *s, char *who, size_t cap)
{
    size_t used = 0;
    who[0] = '\0';
    for (int r = 0; r < s->n && used + 16 < cap; r++)
        if (!sup_by_rank(s, r))
            used += (size_t)snprintf(who + used, cap - used, used ? ",%d" : "%d", r);
}

/* The launch has ended (exited: by itself, with exit status `code`; else torn down): what
 * the loop saw goes to policy.c; the verdict and its incident's detail into s->v, s->vdetail. */
static rk_sup_next judge(sup *s, int exited, int code)
{
    rk_sup_seen *e = &s->seen;
    e->ranks = s->n;
    e->hellos = sup_hellos(s);
    e->done = 0;
    for (int k = 0; k < s->nconn; k++)
        e->done += s->c[k].st == SUP_CONN_DONE;
    e->exited = exited;
    e->status = exited ? code : -1;
    e->stop_sent = sup_stop_sent(s);
    e->interrupted = rk_sup_interrupted != 0;
    rk_sup_classify(e, &s->v);
    if (s->b.ops->blame && s->v.next == RK_SUP_RELAUNCH && s->v.kind != RK_SUP_KIND_NONE &&
        s->v.kind != RK_SUP_KIND_NODE_LOST) {
        /* many hosts: a failure that a node's loss would explain is judged only once every
         * node of the launch says it is alive; a node lost with it is its cause (the backend,
         * policy.h) */
        s->b.ops->blame(s->b.ctx);
        if (e->node_lost >= 0)
            rk_sup_classify(e, &s->v);
    }
    const char *kind = sup_verdict_kind(s);
    char who[256];
    ranks_without_hello(s, who, sizeof who);
    if (e->dup_rank >= 0) /* what the launch did after it follows from it */
        snprintf(s->vdetail, sizeof s->vdetail, "%s", s->dup_detail);
    else if (s->v.kind == RK_SUP_KIND_NEVER_CONNECTED && !e->startup_timeout)
        snprintf(s->vdetail, sizeof s->vdetail,
                 "rank %s never connected to %s: the launcher exited with status %d first", who,
                 RK_HB_ENV, code);
    else if (s->v.kind == RK_SUP_KIND_STORAGE)
        snprintf(s->vdetail, sizeof s->vdetail, "%s",
                 s->storage_detail[0] ? s->storage_detail
                                      : "a rank exited with status 6 (RK_EXIT_STORAGE)");
    else if (sup_failing(s) && exited)
        snprintf(s->vdetail, sizeof s->vdetail, "%s; launcher exit status %d", s->fdetail, code);
    else if (sup_failing(s))
        snprintf(s->vdetail, sizeof s->vdetail, "%s", s->fdetail);
    else
        snprintf(s->vdetail, sizeof s->vdetail, "the launcher exited with status %d at step %lld",
                 code, (long long)s->last_done);
    if (s->v.kind == RK_SUP_KIND_HANG && s->stacks[0]) { /* the dumps, named on one line */
        char files[sizeof s->stacks];
        snprintf(files, sizeof files, "%s", s->stacks);
        for (char *p = files; (p = strchr(p, '\n'));)
            *p = ' ';
        size_t used = strlen(s->vdetail);
        snprintf(s->vdetail + used, sizeof s->vdetail - used, "; stacks in %s", files);
    }
    if (s->v.next == RK_SUP_STOP) {
        if (s->v.kind == RK_SUP_KIND_STORAGE && !s->o->ckpt_dir) /* the worker's own files */
            sup_say(s,
                    "storage error: %s; stopping: a full, read-only or failing disk is not a "
                    "device's fault and relaunching cannot fix it",
                    s->vdetail);
        else if (s->v.kind == RK_SUP_KIND_STORAGE)
            sup_say(s,
                    "storage error on the checkpoint directory %s: %s; stopping: a full, "
                    "read-only or failing disk is not a device's fault and relaunching cannot "
                    "fix it (fix the directory and run again: the job resumes from its latest "
                    "good checkpoint)",
                    s->o->ckpt_dir, s->vdetail);
        else if (e->dup_rank >= 0)
            sup_say(s, "%s; stopping: %s", s->vdetail, s->v.why);
        else if (s->v.kind == RK_SUP_KIND_USAGE)
            sup_say(s, "%s: %s; stopping", s->vdetail, s->v.why);
        else
            sup_say(s, "%s: %s; stopping: %s", kind, s->vdetail, s->v.why);
    }
    return s->v.next;
}

/* An interruption (SIGINT, SIGTERM, SIGHUP): ask the ranks to checkpoint and stop within
 * --stop-grace, then tear the job down (policy.h). 1 if the launch is over. */
static int on_interrupt(sup *s)
{
    double now = rk_ledger_now(&s->g);
    if (rk_sup_interrupted && s->intr_t < 0) /* the grace runs from the first signal seen */
        s->intr_t = now;
    rk_sup_intr what =
        rk_sup_interrupt(rk_sup_interrupted, sup_stop_sent(s), now, s->intr_t, s->o->stop_grace_s);
    if (what == RK_SUP_INTR_SEND_STOP) {
        sup_say(s, "interrupted: asking the ranks to checkpoint and stop (within %g s)",
                s->o->stop_grace_s);
        sup_stop_job(s);
        what = rk_sup_interrupt(rk_sup_interrupted, sup_stop_sent(s), now, s->intr_t,
                                s->o->stop_grace_s);
    }
    if (what == RK_SUP_INTR_NONE)
        return 0;
    if (what == RK_SUP_INTR_TEAR_DOWN && s->o->stop_grace_s > 0)
        sup_say(s,
                "interrupted: the ranks did not stop within --stop-grace %g s; tearing the job "
                "down",
                s->o->stop_grace_s);
    else if (what == RK_SUP_INTR_TEAR_DOWN)
        sup_say(s, "interrupted: tearing the job down at once (--stop-grace 0)");
    teardown(s, 0);
    return 1;
}

/* Waits out what is left of PACE_S since the last round began (a signal cuts it short),
 * accepting new connections and reading those that said no hello yet as soon as they are
 * ready: the kernel's word on who connected is read while the process is surely alive. */
static void pace(sup *s, double *last)
{
    for (;;) {
        double wait = *last + PACE_S - rk_mono_s();
        if (wait <= 0 || wait > PACE_S)
            break;
        struct pollfd p[RK_SUP_MAX_CONNS + 1];
        int map[RK_SUP_MAX_CONNS];
        int np = 0;
        p[np++] = (struct pollfd){s->listen_fd, POLLIN, 0};
        for (int k = 0; k < s->nconn; k++)
            if (s->c[k].fd >= 0 && s->c[k].st == SUP_CONN_STRANGER) {
                map[np - 1] = k;
                p[np++] = (struct pollfd){s->c[k].fd, POLLIN, 0};
            }
        int ms = (int)(wait * 1000.0) + 1;
        int r = poll(p, (nfds_t)np, ms);
        if (r < 0 && errno == EINTR)
            break;
        if (r <= 0)
            continue;
        for (int q = 1; q < np; q++)
            if (p[q].revents)
                sup_read_conn(s, &s->c[map[q - 1]]);
        if (p[0].revents & POLLIN)
            sup_accept(s);
    }
    *last = rk_mono_s();
}

rk_sup_next sup_watch(sup *s)
{
    double last = 0;
    for (;;) {
        pace(s, &last);
        if (s->b.ops->pump) /* the backend's link: the remote ranks' streams, its nodes */
            s->b.ops->pump(s->b.ctx, 0);
        sup_count_recorded(s); /* what the handlers recorded, acted on once a round */
        if (on_interrupt(s))
            return RK_SUP_INTERRUPTED;
        struct pollfd p[RK_SUP_MAX_CONNS + 1];
        int map[RK_SUP_MAX_CONNS];
        int np = 0;
        p[np++] = (struct pollfd){s->listen_fd, POLLIN, 0};
        for (int k = 0; k < s->nconn; k++)
            if (s->c[k].fd >= 0) {
                map[np - 1] = k;
                p[np++] = (struct pollfd){s->c[k].fd, POLLIN, 0};
            }
        int r = poll(p, (nfds_t)np, s->b.ops->pump ? 0 : TICK_MS);
        /* local: the rank that failed first, as the keeper saw it, is read before the ranks
         * it killed for it (their connections may close in the same round) */
        int failed = s->b.ops->failed_rank(s->b.ctx);
        if (failed >= 0 && s->seen.failed_rank < 0)
            s->seen.failed_rank = failed;
        rk_sup_conn *first = failed >= 0 ? sup_by_rank(s, failed) : NULL;
        while (first && first->fd >= 0 && sup_read_conn(s, first))
            ;
        if (r > 0) {
            /* what the ranks said first, closings after: a rank's last words (an injected
             * crash it announces) come before another rank's end read in the same round */
            unsigned char closing[RK_SUP_MAX_CONNS + 1] = {0};
            for (int q = 1; q < np; q++) { /* a ready connection with no bytes is closing */
                char b;
                if (!(p[q].revents & (POLLIN | POLLHUP | POLLERR)))
                    continue;
                closing[q] = recv(p[q].fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
                for (int k = 0; !closing[q] && k < READ_ROUNDS; k++)
                    if (sup_read_conn(s, &s->c[map[q - 1]]) != 2)
                        break; /* a full buffer: there may be more */
            }
            for (int q = 1; q < np; q++)
                if (closing[q] && s->c[map[q - 1]].fd >= 0)
                    sup_read_conn(s, &s->c[map[q - 1]]);
            if (p[0].revents & POLLIN)
                sup_accept(s);
        }
        sup_inplace_tick(s); /* a rank the keeper saw end: replaced in place, or not */
        sup_count_recorded(s);
        sup_expire_strangers(s);
        check_timeouts(s);
        sup_gate_tick(s);
        sup_gauge_tick(s);    /* the snapshot memory and the metrics file, once a second */
        sup_snapsave_tick(s); /* a checkpoint written from the snapshots */
        status_line(s);
        int code;
        if (s->b.ops->poll(s->b.ctx, &code)) {
            rk_phase_mark("sup.exited", s->launch_no, -1); /* the launcher ended by itself */
            /* read what the ranks said last before judging: a rank that connected, spoke and
             * exited within one pace still waits in the listen backlog, not yet accepted */
            sup_accept(s);
            for (int k = 0; k < s->nconn; k++)
                while (s->c[k].fd >= 0 && sup_read_conn(s, &s->c[k]))
                    ;
            sup_count_recorded(s);
            teardown(s, 0.5);
            return judge(s, 1, code);
        }
        /* A failure seen: the rest of the job is lost work waiting in a collective. A hang, a
         * rank that never connected, two processes that said the same rank: tear it down now.
         * A rank that vanished or said it exits: the launcher's exit status says what the
         * failure was, so give it a few seconds to exit by itself (it ends the other ranks);
         * then tear down. */
        if (sup_failing(s) &&
            rk_sup_teardown_due(&s->seen, rk_ledger_now(&s->g), s->ftime, RK_SUP_EXIT_WAIT_S)) {
            teardown(s, 0);
            return judge(s, 0, -1);
        }
    }
}
