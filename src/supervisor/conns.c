/*
 * The ranks' heartbeat connections (sup.h): accept on the job's Unix socket, believe a hello
 * only from a process of this launch, read each rank's messages (docs/protocol.md) into what
 * the loop saw, and send the supervisor's commands (formatted by rekindle/heartbeat.h).
 */
#define _GNU_SOURCE /* accept4, SO_PEERCRED */
#include "supervisor/sup.h"

#include "base/phase.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_STRANGERS 64 /* open connections that have not said hello */
#define HELLO_WAIT_S 5.0 /* a connection that says no hello this long is closed */
#define ACCEPT_BATCH 256 /* connections accepted per turn of the loop */
#define SAY_PER_CONN 3   /* messages about one rank's connection, then a count */
#define SAY_STRANGERS 5  /* messages about unidentified peers a window, then a count */
#define STRANGERS_WINDOW_S 10.0

/* The count of messages about strangers held back in a window that has ended (base/hush.h). */
static void say_strangers_held(sup *s, double now)
{
    int n = rk_hush_due(&s->strangers, now, STRANGERS_WINDOW_S);
    if (n)
        sup_say(s,
                "%d more messages about heartbeat connections that said no valid hello were "
                "suppressed",
                n);
}

/* A message about a connection, rate-limited: per rank, the first few and then a count at
 * close; for peers that have not said who they are (a flood), a few per 10 s in all. */
void sup_note(sup *s, rk_sup_conn *c, const char *fmt, ...)
{
    double now = rk_ledger_now(&s->g);
    if (c && c->rank >= 0) {
        if (c->said >= SAY_PER_CONN) {
            c->hushed++;
            return;
        }
        c->said++;
    } else {
        say_strangers_held(s, now);
        if (!rk_hush_pass(&s->strangers, now, SAY_STRANGERS, STRANGERS_WINDOW_S))
            return;
    }
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sup_say(s, "%s", msg);
}

/* ---- messages ------------------------------------------------------------------------------ */

/* A rank says it is leaving with this failure (optional: its exit status says it too).
 * Recorded even after another failure was seen: ranks leave together, in any order. */
static void on_exit_event(sup *s, const rk_hb_msg *m)
{
    rk_sup_kind kind = rk_sup_kind_of(m->kind);
    if (strcmp(m->kind, "commfail") == 0 && sup_inplace_may(s, m->rank)) {
        /* the keeper's word on its end decides (inplace.c); its words name the incident */
        snprintf(s->exit_detail, sizeof s->exit_detail, "%s", m->detail);
        return;
    }
    if (s->seen.exit_kind == RK_SUP_KIND_NONE) {
        s->seen.exit_kind = kind;
        s->seen.exit_rank = m->rank;
        snprintf(s->exit_word, sizeof s->exit_word, "%s", m->kind);
        snprintf(s->exit_detail, sizeof s->exit_detail, "%s", m->detail);
        s->seen.exit_step = m->step;
        s->seen.exit_detail = s->exit_detail;
    }
    if (kind == RK_SUP_KIND_STORAGE && s->seen.storage_rank < 0) {
        s->seen.storage_rank = m->rank;
        snprintf(s->storage_detail, sizeof s->storage_detail, "%s", m->detail);
    }
    if (s->seen.exit_rank != m->rank || s->seen.exit_kind != kind ||
        (kind == RK_SUP_KIND_OTHER && strcmp(s->exit_word, m->kind) != 0))
        return; /* the first exit event tells the failure; later ones only follow it */
    /* what a rank says beats what was inferred from a connection that closed before it was
     * read; the failure keeps the time it was first seen */
    sup_fail_said(s, "rank %d (device %s) exits at step %lld: %s", m->rank, sup_devname(s, m->rank),
                  (long long)m->step, m->detail);
}

void sup_snapshots_stop(sup *s, int64_t step, const char *action, const char *why)
{
    rk_incident *i =
        rk_ledger_add(&s->g, "snapshot_off", -1, "", action, "step %lld: %s", (long long)step, why);
    if (i) {
        i->lost_steps = 0;
        i->step = step;
        rk_ledger_write(&s->g, i);
    }
    sup_say(s, "step %lld: snapshots in memory off, checkpoints on disk only: %s", (long long)step,
            why);
    s->snap_off = 1; /* run.c removes the directory before the next launch */
    s->g.snapshots = "off";
}

/* An event the worker handled in-process: logged, pending until the job is back at work,
 * recorded to be counted against the blamed rank's device unless its kind is the data's
 * (policy.h; the loop counts it: sup_count_recorded). */
static void on_event(sup *s, const rk_hb_msg *m)
{
    if (strcmp(m->kind, "snapshot_off") == 0) { /* not a failure: memory short, disk goes on */
        sup_snapshots_stop(s, m->step, m->action, m->detail);
        return;
    }
    int blame = m->blame >= 0 && m->blame < s->n ? m->blame : -1;
    rk_incident *i = rk_ledger_add(&s->g, m->kind, blame, sup_devname(s, blame), m->action,
                                   "step %lld: %s", (long long)m->step, m->detail);
    if (i) {
        i->lost_steps = m->lost_steps;
        i->step = m->step; /* the step the rank was computing */
    }
    if (blame >= 0)
        sup_say(s, "step %lld: %s on rank %d device %s -> %s (in-process, no restart)",
                (long long)m->step, m->kind, blame, sup_devname(s, blame), m->action);
    else
        sup_say(s, "step %lld: %s -> %s (in-process, no restart)", (long long)m->step, m->kind,
                m->action);
    sup_pend(s, i);
    if (rk_sup_kind_counted(rk_sup_kind_of(m->kind)) && blame >= 0) { /* the loop counts it */
        s->to_count[blame]++;
        snprintf(s->count_kind[blame], sizeof s->count_kind[blame], "%s", m->kind);
    }
}

static void on_inject(sup *s, const rk_hb_msg *m)
{
    s->g.injected++;
    if (strcmp(m->kind, "crash") == 0 && s->seen.crash_rank < 0)
        s->seen.crash_rank = m->rank;
    size_t idx = (size_t)m->index;
    if (s->spec && idx < rk_inject_count(s->spec) && rk_inject_get(s->spec, idx)->mtbf_s <= 0)
        s->fired[idx] = 1;
    rk_incident *i = rk_ledger_add(&s->g, "inject", m->rank, sup_devname(s, m->rank), "none",
                                   "injected fault %d (%s) at step %lld (simulated)", m->index,
                                   m->kind, (long long)m->step);
    if (i) {
        i->lost_steps = 0;
        i->step = m->step;
        rk_ledger_write(&s->g, i);
    }
}

#define REFUSE 1 /* on_line: close this connection (a peer that is not a rank of the job) */

/* A hello is believed only from a process of this launch whose pid it names: the kernel's
 * credentials of the peer (SO_PEERCRED, taken at connect) must be a descendant of the keeper,
 * and the hello's pid that process's own pid in its namespace. Both are read from /proc when
 * the connection is accepted (sup_accept), which the watch loop does as soon as a connection
 * waits, so a rank that connects, speaks and exits at once is still believed. (srun's ranks
 * are children of Slurm's daemons, not of the keeper: there only the pid is checked.) */
static int hello_trusted(sup *s, const rk_sup_conn *c, const rk_hb_msg *m, char *why, size_t cap)
{
    if (c->pid <= 0 || c->nspid < 0)
        snprintf(why, cap, "the peer's process is unknown or was gone when it was accepted");
    else if (c->nspid != m->pid)
        snprintf(why, cap, "it names pid %ld but comes from pid %ld", m->pid, c->nspid);
    else if (s->o->launcher != RK_LAUNCH_SRUN && !c->owned)
        snprintf(why, cap, "pid %ld is not a process of this launch", c->pid);
    else
        return 1;
    return 0;
}

/* A trusted hello for rank m->rank (below the launch's rank count, whatever world it says):
 * the first process to name the rank in this launch claims it. Another one that is not the
 * same process (reconnecting) nor one the claimant started (a child that ran the worker's
 * setup again: ignored, as before) makes the rank a duplicate: the launch stops, the job
 * with it (policy.h), with a sentence that names both and the fix. 1 if a duplicate. */
static int claim_rank(sup *s, const rk_sup_conn *c, const rk_hb_msg *m)
{
    int r = (int)m->rank;
    long first = s->claim_pid[r];
    int node = s->claim_node[r];
    if (first == 0) {
        s->claim_pid[r] = c->pid;
        s->claim_node[r] = c->node;
        return 0;
    }
    if (node == c->node &&
        (first == c->pid || (c->node < 0 && rk_proc_descends((pid_t)c->pid, (pid_t)first))))
        return 0;
    if (s->seen.dup_rank >= 0)
        return 1; /* the first duplicate is the one told */
    s->seen.dup_rank = r;
    char where[2][24] = {"", ""}, worlds[96] = "";
    if (node >= 0)
        snprintf(where[0], sizeof where[0], " on node %d", node);
    if (c->node >= 0)
        snprintf(where[1], sizeof where[1], " on node %d", c->node);
    if (m->world != s->n)
        snprintf(worlds, sizeof worlds, " (the second says rank %d of %d; the launch has %d ranks)",
                 r, m->world, s->n);
    snprintf(s->dup_detail, sizeof s->dup_detail,
             "two processes of the launch said hello as rank %d, pid %ld%s and pid %ld%s%s: %s", r,
             first, where[0], c->pid, where[1], worlds,
             s->o->launcher == RK_LAUNCH_LOCAL
                 ? "under --launcher local rk run forks the ranks itself: each finds its rank in "
                   "RANK and the rank count in WORLD_SIZE, and Open MPI's OMPI_COMM_WORLD_RANK "
                   "and _SIZE are not set (a worker that reads them is rank 0 in every process): "
                   "read RANK and WORLD_SIZE (docs/run.md), or give --launcher mpirun"
                 : "rk run gives every rank its own RANK and WORLD_SIZE (docs/run.md): the "
                   "worker must say the rank it was given");
    sup_fail(s, "%s", s->dup_detail);
    return 1;
}

/* STRANGER -> RANK: connection c is rank m->rank from now on (its hello believed). */
static void rank_hello(sup *s, rk_sup_conn *c, const rk_hb_msg *m, double now)
{
    rk_phase_mark("sup.hello", s->launch_no, m->rank); /* RK_TRACE_LAUNCH: believed */
    sup_inplace_hello(s, m);
    c->st = SUP_CONN_RANK;
    c->rank = m->rank;
    c->stacks = m->stacks;
    c->last = now;
    c->done = m->step;
    c->progress = 2 * m->step;
    if (s->start_step < 0 || m->step < s->start_step)
        s->start_step = m->step;
    s->hello_step[m->rank] = m->step;
    if (!s->restore_said++)
        s->restore = (int)m->restore;
    else if (s->restore != (int)m->restore)
        s->restore = -1; /* the ranks disagree: said as nothing */
    if (sup_hellos(s) == s->n && s->start_step > 0 && s->ip_state != IP_REPLACING &&
        (s->restore == RK_HB_RESTORE_MEMORY || s->restore == RK_HB_RESTORE_DISK)) {
        sup_say(s, "launch %d: resumed from %s at step %lld", s->launch_no,
                s->restore == RK_HB_RESTORE_MEMORY ? "node memory" : "disk checkpoint",
                (long long)s->start_step);
        if (s->launch_no > 0) /* a relaunch's restore, by where from (summary, metrics) */
            ++*(s->restore == RK_HB_RESTORE_MEMORY ? &s->g.from_memory : &s->g.from_disk);
    }
    if (s->g.first_step < 0 || (s->first_launch == s->launch_no && m->step < s->g.first_step)) {
        s->g.first_step = m->step; /* the step the job began from: its first launch's */
        s->first_launch = s->launch_no;
    }
    if (sup_stop_sent(s)) /* a stop went out before this rank connected: it must hear it */
        sup_send_cmd(c, RK_HB_CMD_STOP);
}

/* RANK -> LEFT or DONE: the rank said bye (a second bye changes nothing). */
static void rank_bye(rk_sup_conn *c, const rk_hb_msg *m)
{
    if (c->st == SUP_CONN_RANK)
        c->st = strcmp(m->status, "done") == 0 ? SUP_CONN_DONE : SUP_CONN_LEFT;
}

static int on_line(void *ctx, const char *line, size_t len)
{
    void **pair = ctx;
    sup *s = pair[0];
    rk_sup_conn *c = pair[1];
    rk_hb_msg m;
    rk_err err = {0};
    if (rk_hb_msg_parse(line, len, &m, &err)) {
        sup_note(s, c, "%s a bad heartbeat message%s: %s", c->rank >= 0 ? "ignored" : "refused",
                 c->rank >= 0 ? " from a rank" : " from a connection that said no hello", err.msg);
        return c->rank >= 0 ? 0 : REFUSE; /* a rank says hello first */
    }
    double now = rk_ledger_now(&s->g);
    if (m.type == RK_HB_HELLO) {
        char why[160];
        int trusted = c->rank < 0 && hello_trusted(s, c, &m, why, sizeof why);
        if (trusted && sup_inplace_stale(s, c, (int)m.rank)) {
            c->st = SUP_CONN_IGNORED;
            sup_note(s, c,
                     "ignored a hello for rank %d from pid %ld: a replacement killed by order "
                     "(a failure during its recovery), started again",
                     m.rank, c->pid);
            return 0;
        }
        if (trusted && m.rank < s->n && claim_rank(s, c, &m))
            return REFUSE; /* a second process says it is this rank */
        if (c->rank >= 0 || m.rank >= s->n || m.world != s->n || sup_by_rank(s, m.rank)) {
            int lone = s->o->launcher == RK_LAUNCH_LOCAL && m.world == 1 && s->n > 1;
            if (trusted)
                c->st = SUP_CONN_IGNORED;
            sup_note(s, c, "ignored a hello for rank %d of %d (this launch has %d ranks)%s", m.rank,
                     m.world, s->n,
                     lone ? "; an MPI program that rk run forks itself sees a world of 1: give "
                            "--launcher mpirun"
                          : "");
            return 0;
        }
        if (!trusted) {
            sup_note(s, c, "refused a hello for rank %d: %s", m.rank, why);
            return REFUSE;
        }
        rank_hello(s, c, &m, now);
        return 0;
    }
    if (c->st == SUP_CONN_IGNORED)
        return 0; /* its hello was ignored: so is the rest */
    if (c->rank < 0 || m.rank != c->rank) {
        sup_note(s, c, "%s a %s message before hello or from another rank",
                 c->rank < 0 ? "refused" : "ignored", rk_hb_type_name(m.type));
        return c->rank >= 0 ? 0 : REFUSE;
    }
    c->last = now;
    switch (m.type) {
    case RK_HB_STEP:
        c->done = m.step;
        c->progress = 2 * m.step;
        if (m.step > s->last_done)
            s->last_done = m.step;
        if (c->rank == 0) {
            rk_ledger_step(&s->g, m.step, m.dt);
            s->loss = m.loss_finite ? m.loss : NAN;
            rk_ledger_step_rec(&s->g, s->launch_no, 0, m.step, s->loss, m.dt);
        }
        /* the job is back at work when all its ranks are back and any of them applies a
         * step (ranks of a data-parallel job step together; independent ones need not) */
        if (sup_hellos(s) == s->n)
            sup_inplace_step(s); /* a rank replaced in place: every rank is back */
        if (s->npending && sup_hellos(s) == s->n)
            sup_resolve_pending(s, s->start_step);
        break;
    case RK_HB_COMM: c->progress = 2 * m.step + 1; break;
    case RK_HB_EVENT:
        if (rk_sup_action_exits(m.action))
            on_exit_event(s, &m);
        else /* handled in the process: it happened, even when read after another rank's
              * failure (said before it, on another connection: it_late_words) */
            on_event(s, &m);
        break;
    case RK_HB_INJECT: on_inject(s, &m); break;
    case RK_HB_CKPT:
        if (c->rank == 0) /* every rank writes its part of one checkpoint: rank 0 speaks */
            rk_ledger_ckpt_rec(&s->g, s->launch_no, 0, m.step, m.seconds);
        break;
    case RK_HB_BYE: rank_bye(c, &m); break;
    case RK_HB_SAVE:
        if (c->rank == 0) /* rank 0 speaks for the job: every rank pinned the step */
            sup_snapsave_request(s, m.step, m.keep);
        break;
    case RK_HB_HELLO: break;
    }
    return 0;
}

static void drop_conn(sup *s, rk_sup_conn *c, const char *why)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1; /* a remote rank's stream ends when its backend reads this end's close */
    if (c->hushed)
        sup_say(s, "%d more messages about rank %d's connection were suppressed", c->hushed,
                c->rank);
    c->hushed = 0;
    if (c->st != SUP_CONN_RANK)
        return;            /* a stranger, or a rank that said bye: nothing lost */
    c->st = SUP_CONN_LOST; /* RANK -> LOST */
    if (sup_inplace_may(s, c->rank) && !sup_failing(s) && !sup_stop_sent(s)) {
        s->lost_t[c->rank] = rk_ledger_now(&s->g); /* the keeper's word decides (inplace.c) */
        return;
    }
    if (s->seen.lost_rank < 0)
        s->seen.lost_rank = c->rank;
    if (sup_failing(s) || sup_stop_sent(s))
        return; /* explained already, or asked to stop */
    int crashed = s->seen.crash_rank, failed = s->seen.failed_rank;
    if (crashed >= 0 &&
        crashed != c->rank) /* the launcher's kill of the others may be read first */
        sup_fail(s,
                 "rank %d (device %s) crashed as it announced (an injected crash); rank %d's "
                 "connection closed at step %lld",
                 crashed, sup_devname(s, crashed), c->rank, (long long)c->done);
    else if (failed >= 0 && failed != c->rank) /* its connection may still be open in a child */
        sup_fail(s,
                 "rank %d (device %s)'s process ended first, as the launcher saw it; rank %d's "
                 "connection closed at step %lld",
                 failed, sup_devname(s, failed), c->rank, (long long)c->done);
    else
        sup_fail(s, "rank %d (device %s, pid %ld%s) %s at step %lld", c->rank,
                 sup_devname(s, c->rank), c->pid, c->node >= 0 ? " on its host" : "", why,
                 (long long)c->done);
}

/* Read what is there; 1 if bytes were read (more may follow), 0 if none or closed. */
int sup_read_conn(sup *s, rk_sup_conn *c)
{
    char buf[8192];
    ssize_t r = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (r <= 0) {
        drop_conn(s, c, "vanished without saying bye");
        return 0;
    }
    void *pair[2] = {s, c};
    rk_err err = {0};
    int rc = rk_hb_lines_feed(&c->lines, buf, (size_t)r, on_line, pair, &err);
    if (rc == RK_EFORMAT)
        sup_note(s, c, "closing a heartbeat connection: %s", err.msg);
    if (rc == RK_EFORMAT || rc == REFUSE) {
        drop_conn(s, c, "broke the heartbeat protocol");
        return 0;
    }
    return (size_t)r == sizeof buf ? 2 : 1;
}

/* A slot for a new connection, cleared: a closed one that never said hello, a new one, or
 * (too many strangers open, or the table full) the oldest stranger's, closed. NULL if the
 * table is full of ranks. */
static rk_sup_conn *free_slot(sup *s)
{
    rk_sup_conn *c = NULL, *oldest = NULL;
    int strangers = 0;
    for (int k = 0; k < s->nconn && !c; k++) {
        rk_sup_conn *x = &s->c[k];
        if (x->fd < 0 && x->rank < 0)
            c = x;
        else if (x->fd >= 0 && x->rank < 0) {
            strangers++;
            if (!oldest || x->since < oldest->since)
                oldest = x;
        }
    }
    if (!c && strangers < MAX_STRANGERS && s->nconn < RK_SUP_MAX_CONNS)
        c = &s->c[s->nconn++];
    if (!c && oldest) {
        sup_note(s, NULL, "too many heartbeat connections without a hello (%d): closing the oldest",
                 strangers);
        drop_conn(s, oldest, "");
        c = oldest;
    }
    if (c) {
        memset(c, 0, sizeof *c); /* st STRANGER */
        c->fd = -1;
        c->rank = -1;
        c->node = -1;
    }
    return c;
}

int sup_add_remote_conn(sup *s, int fd, int node, uint32_t chan, long pid)
{
    rk_sup_conn *c = free_slot(s);
    if (!c) {
        close(fd);
        return -1;
    }
    c->fd = fd;
    c->node = node;
    c->chan = chan;
    c->pid = c->nspid = pid; /* the backend checked the process there (its keeper's tree) */
    c->owned = 1;
    c->since = c->last = rk_ledger_now(&s->g);
    return 0;
}

int sup_drain_conn(sup *s, int fd)
{
    for (int k = 0; k < s->nconn; k++)
        if (s->c[k].fd == fd && fd >= 0) {
            sup_read_conn(s, &s->c[k]);
            return 0;
        }
    return -1;
}

/* Accept what is waiting (a bounded batch) and read each at once: a rank's hello is already
 * there, so a flood of other connections cannot keep it waiting. */
void sup_accept(sup *s)
{
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        rk_sup_conn *c = free_slot(s);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->since = c->last = rk_ledger_now(&s->g);
        struct ucred cr;
        socklen_t len = sizeof cr;
        c->nspid = -1;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.pid > 0) {
            c->pid = cr.pid; /* the kernel's word, in our namespace */
            c->nspid = rk_proc_nspid((pid_t)cr.pid);
            c->owned = c->nspid >= 0 && rk_launch_owns(&s->l, (pid_t)cr.pid);
        }
        sup_read_conn(s, c);
    }
}

/* Close connections that said no hello within HELLO_WAIT_S (an ignored one did). */
void sup_expire_strangers(sup *s)
{
    double now = rk_ledger_now(&s->g);
    say_strangers_held(s, now); /* a flood's count once its window ended, not at the next one */
    for (int k = 0; k < s->nconn; k++) {
        rk_sup_conn *c = &s->c[k];
        if (c->fd >= 0 && c->st == SUP_CONN_STRANGER && now - c->since > HELLO_WAIT_S) {
            sup_note(s, c, "closed a heartbeat connection that said no hello within %.0f s",
                     HELLO_WAIT_S);
            drop_conn(s, c, "");
        }
    }
}

void sup_close_conns(sup *s)
{
    /* the count of a window still under way, said before the end rather than never */
    say_strangers_held(s, rk_ledger_now(&s->g) + STRANGERS_WINDOW_S);
    for (int k = 0; k < s->nconn; k++) {
        if (s->c[k].fd >= 0)
            close(s->c[k].fd);
        s->c[k].fd = -1;
    }
}
