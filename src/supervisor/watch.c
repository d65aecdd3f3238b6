/*
 * The supervisor's loop (supervisor.h): one listening Unix socket for heartbeats, one launch
 * at a time. Each launch is watched with poll() on the socket, the ranks' connections and a
 * 100 ms tick, until the job finishes, a failure is seen and the job is torn down, or the job
 * cannot go on. The loop only gathers what it saw (rk_sup_seen); what that means (crash, hang,
 * communication failure, storage, bad usage, ...) and what to do next is policy.c's.
 */
#define _GNU_SOURCE /* accept4, SO_PEERCRED */
#include "supervisor/supervisor.h"
#include "supervisor/policy.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rekindle/heartbeat.h"
#include "rekindle/inject.h"

#define MAX_CONNS 1024
#define TICK_MS 100
#define MAX_STRANGERS 64 /* open connections that have not said hello */
#define HELLO_WAIT_S 5.0 /* a connection that says no hello this long is closed */
#define ACCEPT_BATCH 256 /* connections accepted per turn of the loop */
#define SAY_PER_CONN 3   /* messages about one rank's connection, then a count */
#define SAY_STRANGERS 5  /* messages about unidentified peers per 10 s, then a count */
/* After a rank vanished (or said it exits), how long the launcher has to exit by itself with
 * the rank's status before the job is torn down: mpirun ends the other ranks and exits with
 * the first failed rank's status within about a second. */
#define EXIT_WAIT_S 5.0

typedef struct conn {
    int fd;
    int rank; /* -1 until hello */
    long pid; /* the peer's pid as the kernel gave it (SO_PEERCRED), in rk run's view */
    double since;     /* accepted */
    int said, hushed; /* messages about this connection: shown, suppressed */
    rk_hb_lines lines;
    double last; /* time of the last message */
    int64_t done; /* steps done */
    int64_t progress; /* 2 x steps done, +1 while in the step's collective */
    int bye;
    char status[16];
} conn;

typedef enum outcome { GO_ON, FINISHED, RELAUNCH, GIVE_UP, BAD_USAGE, INTERRUPTED, STOP } outcome;

typedef struct sup {
    const rk_sup_opts *o;
    rk_ledger g;
    rk_inject *spec;
    int listen_fd;
    char dir[64], sock[96];
    int fails[RK_SUP_MAX_DEVICES];
    int quarantined[RK_SUP_MAX_DEVICES];
    unsigned char *fired; /* fixed faults that already fired */
    /* this launch */
    int n, launch_no;
    int dev[RK_SUP_MAX_DEVICES]; /* rank -> index into o->devices */
    rk_launch l;
    double t_launch;
    conn c[MAX_CONNS];
    int nconn, hellos;
    int64_t start_step;  /* resume step of this launch (the least of its ranks' hellos) */
    int first_launch;    /* the launch whose hellos set g.first_step, -1 before */
    int64_t last_done;   /* most steps done by any rank, across launches */
    double loss;
    /* a failure seen in this launch, to classify once the launcher has exited */
    int failing;
    char fkind[32];
    int frank;
    double ftime;
    char fdetail[200];
    rk_sup_seen seen; /* what this launch's ranks and launcher did, for policy.c */
    rk_sup_verdict v; /* the verdict on the launch that ended */
    char vdetail[RK_HB_DETAIL_MAX + 64];       /* its incident's detail */
    char storage_detail[RK_HB_DETAIL_MAX + 1]; /* the first storage event's detail */
    int stop_sent;
    int quarantine_stop; /* stop sent to shrink the job */
    int stopping;        /* a signal was seen: the job has o->stop_grace_s from stop_t */
    double stop_t;
    /* incidents waiting for the job to be back at work (index into g.inc) */
    size_t pending[64];
    int npending;
    int64_t pending_last_done;
    int64_t pending_done[RK_SUP_MAX_DEVICES]; /* rank -> steps it had done at the failure */
    int64_t hello_step[RK_SUP_MAX_DEVICES];   /* rank -> its hello's step in this launch */
    double last_status;
    double strangers_t; /* start of the current 10 s window for messages about strangers */
    int strangers_said, strangers_hushed;
    int told_pidns;        /* said once why the job has no PID namespace */
    int told_loopback;     /* said once that Open MPI's listeners are not on loopback only */
    char jobdir[128];      /* the launcher's private temporary directory */
    rk_gate *gate;         /* the health gate, NULL without --health */
    double last_gate;      /* when the gate last read the GPUs */
    int drained[RK_SUP_MAX_DEVICES]; /* drained during a run: out for the rest of the job */
    int held[RK_SUP_MAX_DEVICES];    /* left out at a launch: back only with a margin */
} sup;

static volatile sig_atomic_t interrupted;
static void on_signal(int sig)
{
    (void)sig;
    interrupted++;
}

static void say(const sup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const sup *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rk run: [%6.1f s] ", rk_ledger_now(&s->g));
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

/* A message about a connection, rate-limited: per rank, the first few and then a count at
 * close; for peers that have not said who they are (a flood), a few per 10 s in all. */
static void note(sup *s, conn *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(sup *s, conn *c, const char *fmt, ...)
{
    double now = rk_ledger_now(&s->g);
    if (c && c->rank >= 0) {
        if (c->said >= SAY_PER_CONN) {
            c->hushed++;
            return;
        }
        c->said++;
    } else {
        if (now - s->strangers_t >= 10.0) {
            if (s->strangers_hushed)
                say(s,
                    "%d more messages about heartbeat connections that said no valid hello "
                    "were suppressed",
                    s->strangers_hushed);
            s->strangers_t = now;
            s->strangers_said = s->strangers_hushed = 0;
        }
        if (s->strangers_said >= SAY_STRANGERS) {
            s->strangers_hushed++;
            return;
        }
        s->strangers_said++;
    }
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    say(s, "%s", msg);
}

static const char *devname(const sup *s, int rank)
{
    if (rank < 0 || rank >= s->n)
        return "";
    return s->o->devices[s->dev[rank]];
}

/* ---- incidents ----------------------------------------------------------------------------- */

static void count_failure(sup *s, int rank, const char *why);
static void gate_tick(sup *s);

/* An incident whose recovery is measured when the job next applies a step. */
static void pend(sup *s, rk_incident *i)
{
    if (!i)
        return;
    size_t idx = (size_t)(i - s->g.inc);
    if (s->npending < 64)
        s->pending[s->npending++] = idx;
    else
        rk_ledger_write(&s->g, i);
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

/* The job is back at work (all its ranks said hello and one applied a step, or the relaunch
 * finished): recovered. */
static void resolve_pending(sup *s, int64_t resumed_from)
{
    double now = rk_ledger_now(&s->g);
    for (int k = 0; k < s->npending; k++) {
        rk_incident *i = &s->g.inc[s->pending[k]];
        i->recovery_s = now - i->t;
        set_lost(s, i, resumed_from);
        rk_ledger_write(&s->g, i);
    }
    s->npending = 0;
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++)
        s->pending_done[r] = -1;
}

/* The job ends without having recovered: no recovery time; lost steps if a relaunch said
 * where it resumed. */
static void flush_pending(sup *s)
{
    for (int k = 0; k < s->npending; k++) {
        rk_incident *i = &s->g.inc[s->pending[k]];
        set_lost(s, i, s->start_step);
        rk_ledger_write(&s->g, i);
    }
    s->npending = 0;
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++)
        s->pending_done[r] = -1;
}

static void send_all(sup *s, const char *line)
{
    for (int k = 0; k < s->nconn; k++)
        if (s->c[k].fd >= 0 && !s->c[k].bye)
            (void)send(s->c[k].fd, line, strlen(line), MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void count_failure(sup *s, int rank, const char *why)
{
    if (rank < 0 || rank >= s->n)
        return;
    int d = s->dev[rank];
    s->fails[d]++;
    if (s->fails[d] < s->o->failure_threshold || s->quarantined[d])
        return;
    s->quarantined[d] = 1;
    s->g.quarantined++;
    rk_incident *i = rk_ledger_add(&s->g, "quarantine", rank, s->o->devices[d], "quarantine",
                                   "device %s failed %d times (last: %s); set aside",
                                   s->o->devices[d], s->fails[d], why);
    if (i) {
        i->lost_steps = 0;
        rk_ledger_write(&s->g, i);
    }
    say(s, "device %s quarantined after %d failures (last: %s)", s->o->devices[d], s->fails[d],
        why);
    if (!s->failing && !s->stop_sent) { /* the job is healthy: stop it cleanly to shrink */
        send_all(s, "{\"cmd\":\"stop\"}\n");
        s->stop_sent = 1;
        s->quarantine_stop = 1;
    }
}

static void fail(sup *s, const char *kind, int rank, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(sup *s, const char *kind, int rank, const char *fmt, ...)
{
    if (s->failing)
        return;
    s->failing = 1;
    snprintf(s->fkind, sizeof s->fkind, "%s", kind);
    s->frank = rank;
    s->ftime = rk_ledger_now(&s->g);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->fdetail, sizeof s->fdetail, fmt, ap);
    va_end(ap);
}

/* ---- messages ------------------------------------------------------------------------------ */

static conn *by_rank(sup *s, int rank)
{
    for (int k = 0; k < s->nconn; k++)
        if (s->c[k].rank == rank)
            return &s->c[k];
    return NULL;
}

/* A rank says it is leaving with this failure (optional: its exit status says it too).
 * Recorded even after another failure was seen: ranks leave together, in any order. */
static void on_exit_event(sup *s, const rk_hb_msg *m)
{
    if (!s->seen.exit_kind[0]) {
        snprintf(s->seen.exit_kind, sizeof s->seen.exit_kind, "%s", m->kind);
        s->seen.exit_rank = m->rank;
    }
    if (strcmp(m->kind, "storage") == 0 && s->seen.storage_rank < 0) {
        s->seen.storage_rank = m->rank;
        snprintf(s->storage_detail, sizeof s->storage_detail, "%s", m->detail);
    }
    if (s->seen.exit_rank != m->rank || strcmp(s->seen.exit_kind, m->kind) != 0)
        return; /* the first exit event tells the failure; later ones only follow it */
    /* what a rank says beats what was inferred from a connection that closed before it was
     * read; the failure keeps the time it was first seen */
    double seen_at = s->failing ? s->ftime : rk_ledger_now(&s->g);
    s->failing = 0;
    fail(s, m->kind, m->rank, "rank %d (device %s) exits at step %lld: %s", m->rank,
         devname(s, m->rank), (long long)m->step, m->detail);
    s->ftime = seen_at;
}

static void on_event(sup *s, const rk_hb_msg *m)
{
    int blame = m->blame >= 0 && m->blame < s->n ? m->blame : -1;
    /* loss spikes and kept outliers are the data until proven otherwise; not the device's */
    int counted = strcmp(m->kind, "spike_kept") != 0 && strcmp(m->kind, "loss_spike") != 0 &&
                  strcmp(m->kind, "grad_kept") != 0 && strcmp(m->kind, "grad_suspect") != 0;
    rk_incident *i = rk_ledger_add(&s->g, m->kind, blame, devname(s, blame), m->action,
                                   "step %lld: %s", (long long)m->step, m->detail);
    if (i)
        i->lost_steps = m->lost_steps;
    if (blame >= 0)
        say(s, "step %lld: %s on rank %d device %s -> %s (in-process, no restart)",
            (long long)m->step, m->kind, blame, devname(s, blame), m->action);
    else
        say(s, "step %lld: %s -> %s (in-process, no restart)", (long long)m->step, m->kind,
            m->action);
    pend(s, i);
    if (counted && blame >= 0)
        count_failure(s, blame, m->kind);
}

static void on_inject(sup *s, const rk_hb_msg *m)
{
    s->g.injected++;
    size_t idx = (size_t)m->index;
    if (s->spec && idx < rk_inject_count(s->spec) && rk_inject_get(s->spec, idx)->mtbf_s <= 0)
        s->fired[idx] = 1;
    rk_incident *i = rk_ledger_add(&s->g, "inject", m->rank, devname(s, m->rank), "none",
                                   "injected fault %d (%s) at step %lld (simulated)", m->index,
                                   m->kind, (long long)m->step);
    if (i) {
        i->lost_steps = 0;
        rk_ledger_write(&s->g, i);
    }
}

#define REFUSE 1 /* on_line: close this connection (a peer that is not a rank of the job) */

/* A hello is believed only from a process of this launch whose pid it names: the kernel's
 * credentials of the peer (SO_PEERCRED, taken at connect) must be a descendant of the keeper,
 * and the hello's pid that process's own pid in its namespace. (srun's ranks are children of
 * Slurm's daemons, not of the keeper: there only the pid is checked.) */
static int hello_trusted(sup *s, const conn *c, const rk_hb_msg *m, char *why, size_t cap)
{
    long own = c->pid > 0 ? rk_proc_nspid((pid_t)c->pid) : -1;
    if (c->pid <= 0 || own < 0)
        snprintf(why, cap, "the peer's process is unknown or gone");
    else if (own != m->pid)
        snprintf(why, cap, "it names pid %ld but comes from pid %ld", m->pid, own);
    else if (s->o->launcher != RK_LAUNCH_SRUN && !rk_launch_owns(&s->l, (pid_t)c->pid))
        snprintf(why, cap, "pid %ld is not a process of this launch", c->pid);
    else
        return 1;
    return 0;
}

static int on_line(void *ctx, const char *line, size_t len)
{
    void **pair = ctx;
    sup *s = pair[0];
    conn *c = pair[1];
    rk_hb_msg m;
    rk_err err = {0};
    if (rk_hb_msg_parse(line, len, &m, &err)) {
        note(s, c, "%s a bad heartbeat message%s: %s", c->rank >= 0 ? "ignored" : "refused",
             c->rank >= 0 ? " from a rank" : " from a connection that said no hello", err.msg);
        return c->rank >= 0 ? 0 : REFUSE; /* a rank says hello first */
    }
    double now = rk_ledger_now(&s->g);
    if (m.type == RK_HB_HELLO) {
        if (c->rank >= 0 || m.rank >= s->n || m.world != s->n || by_rank(s, m.rank)) {
            note(s, c, "ignored a hello for rank %d of %d (this launch has %d ranks)", m.rank,
                 m.world, s->n);
            return 0;
        }
        char why[160];
        if (!hello_trusted(s, c, &m, why, sizeof why)) {
            note(s, c, "refused a hello for rank %d: %s", m.rank, why);
            return REFUSE;
        }
        c->rank = m.rank;
        c->last = now;
        c->done = m.step;
        c->progress = 2 * m.step;
        s->hellos++;
        if (s->start_step < 0 || m.step < s->start_step)
            s->start_step = m.step;
        s->hello_step[m.rank] = m.step;
        if (s->g.first_step < 0 || (s->first_launch == s->launch_no && m.step < s->g.first_step)) {
            s->g.first_step = m.step; /* the step the job began from: its first launch's */
            s->first_launch = s->launch_no;
        }
        if (s->stop_sent) /* a stop went out before this rank connected: it must hear it */
            (void)send(c->fd, "{\"cmd\":\"stop\"}\n", 15, MSG_NOSIGNAL | MSG_DONTWAIT);
        return 0;
    }
    if (c->rank < 0 || m.rank != c->rank) {
        note(s, c, "%s a %s message before hello or from another rank",
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
        }
        /* the job is back at work when all its ranks are back and any of them applies a
         * step (ranks of a data-parallel job step together; independent ones need not) */
        if (s->npending && s->hellos == s->n)
            resolve_pending(s, s->start_step);
        break;
    case RK_HB_COMM: c->progress = 2 * m.step + 1; break;
    case RK_HB_EVENT:
        if (strcmp(m.action, "exit") == 0)
            on_exit_event(s, &m);
        else if (!s->failing)
            on_event(s, &m);
        break;
    case RK_HB_INJECT: on_inject(s, &m); break;
    case RK_HB_CKPT: break;
    case RK_HB_BYE:
        c->bye = 1;
        snprintf(c->status, sizeof c->status, "%s", m.status);
        break;
    case RK_HB_HELLO: break;
    }
    return 0;
}

static void drop_conn(sup *s, conn *c, const char *why)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    if (c->hushed)
        say(s, "%d more messages about rank %d's connection were suppressed", c->hushed, c->rank);
    c->hushed = 0;
    if (c->rank >= 0 && !c->bye && s->seen.lost_rank < 0)
        s->seen.lost_rank = c->rank;
    if (c->rank >= 0 && !c->bye && !s->failing && !s->stop_sent)
        fail(s, "crash", c->rank, "rank %d (device %s, pid %ld) %s at step %lld", c->rank,
             devname(s, c->rank), c->pid, why, (long long)c->done);
}

/* Read what is there; 1 if bytes were read (more may follow), 0 if none or closed. */
static int read_conn(sup *s, conn *c)
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
        note(s, c, "closing a heartbeat connection: %s", err.msg);
    if (rc == RK_EFORMAT || rc == REFUSE) {
        drop_conn(s, c, "broke the heartbeat protocol");
        return 0;
    }
    return 1;
}

/* ---- one launch ---------------------------------------------------------------------------- */

static int start_launch(sup *s, rk_err *err)
{
    memset(&s->l, 0, sizeof s->l);
    s->l.life = -1;
    for (int k = 0; k < s->nconn; k++)
        if (s->c[k].fd >= 0)
            close(s->c[k].fd);
    s->nconn = s->hellos = 0;
    s->failing = s->stop_sent = s->quarantine_stop = 0;
    s->start_step = -1;
    rk_sup_seen_init(&s->seen, s->n);
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++)
        s->hello_step[r] = -1;
    memset(&s->v, 0, sizeof s->v);
    s->v.next = RK_SUP_RELAUNCH;
    s->v.rank = -1;
    s->vdetail[0] = s->storage_detail[0] = '\0';
    static char env_hb[160], env_dev[4096], env_launch[32], env_dir[4200], env_inj[4200],
        env_done[8192], env_tmp[3][200];
    const char *env[14];
    int e = 0;
    /* Open MPI's session directory and shared-memory files in a directory of this launch:
     * in a PID namespace every job's mpirun has the same pid, from which Open MPI derives
     * the names it shares between jobs */
    snprintf(s->jobdir, sizeof s->jobdir, "%s/job%d", s->dir, s->launch_no);
    if (mkdir(s->jobdir, 0700) != 0 && errno != EEXIST)
        return rk_err_set(err, RK_EIO, "cannot create %s: %s", s->jobdir, strerror(errno));
    static const char *const tmpvars[3] = {"OMPI_MCA_orte_tmpdir_base",
                                           "OMPI_MCA_btl_vader_backing_directory",
                                           "OMPI_MCA_shmem_mmap_backing_file_base_dir"};
    for (int k = 0; k < 3 && s->o->launcher == RK_LAUNCH_MPIRUN; k++) {
        snprintf(env_tmp[k], sizeof env_tmp[k], "%s=%s", tmpvars[k], s->jobdir);
        env[e++] = env_tmp[k];
    }
    snprintf(env_hb, sizeof env_hb, "RK_HEARTBEAT=%s", s->sock);
    env[e++] = env_hb;
    size_t used = (size_t)snprintf(env_dev, sizeof env_dev, "RK_DEVICES=");
    for (int r = 0; r < s->n && used < sizeof env_dev; r++)
        used += (size_t)snprintf(env_dev + used, sizeof env_dev - used, r ? ",%s" : "%s",
                                 s->o->devices[s->dev[r]]);
    env[e++] = env_dev;
    snprintf(env_launch, sizeof env_launch, "RK_LAUNCH=%d", s->launch_no);
    env[e++] = env_launch;
    if (s->o->ckpt_dir) {
        snprintf(env_dir, sizeof env_dir, "RK_CKPT_DIR=%s", s->o->ckpt_dir);
        env[e++] = env_dir;
        env[e++] = "RK_RESUME=1";
    }
    if (s->o->inject) {
        snprintf(env_inj, sizeof env_inj, "RK_INJECT=%s", s->o->inject);
        env[e++] = env_inj;
        used = (size_t)snprintf(env_done, sizeof env_done, "RK_INJECT_DONE=");
        int any = 0;
        for (size_t i = 0; i < rk_inject_count(s->spec) && used + 24 < sizeof env_done; i++)
            if (s->fired[i]) {
                used += (size_t)snprintf(env_done + used, sizeof env_done - used,
                                         any ? ",%zu" : "%zu", i);
                any = 1;
            }
        if (any)
            env[e++] = env_done;
    }
    /* mpirun ends the other ranks when one fails and exits with that rank's status, which
     * says what the failure was; by default it waits 1 s after its SIGTERM to them before
     * SIGKILL, and the relaunch waits for it (unless the user chose otherwise) */
    if (s->o->launcher == RK_LAUNCH_MPIRUN && !getenv("OMPI_MCA_odls_base_sigkill_timeout"))
        env[e++] = "OMPI_MCA_odls_base_sigkill_timeout=0";
    env[e] = NULL;
    s->t_launch = rk_ledger_now(&s->g);
    const char *ns = getenv("RK_RUN_PIDNS"); /* "0": the subreaper fallback (tests) */
    int rc = rk_launch_start(&s->l, s->o->launcher, s->o->launcher_args, s->n, s->o->worker,
                             (char *const *)env, !(ns && strcmp(ns, "0") == 0), err);
    if (!rc && !s->l.pidns && !s->told_pidns) {
        s->told_pidns = 1;
        say(s,
            "no PID namespace for the job (%s): it is tracked as rk run's descendants, and "
            "a process that leaves that tree survives a SIGKILL of rk run",
            s->l.ns_errno ? strerror(s->l.ns_errno) : "RK_RUN_PIDNS=0");
    }
    if (!rc && !s->l.loopback && !s->told_loopback && s->o->launcher == RK_LAUNCH_MPIRUN) {
        s->told_loopback = 1; /* a multi-node job, or the library is missing */
        say(s, "Open MPI's listeners bind every address (not a single-node job, "
               "RK_RUN_LOOPBACK=0, a sanitiser build, or no librkloopback.so beside rk or in "
               "its library directory)");
    }
    return rc;
}

/* Kill whatever is left of this launch: every process the keeper holds (launch.c), found
 * by the kernel, never by the pids workers reported; ranks that never said hello too. */
static void teardown(sup *s, double grace)
{
    rk_launch_kill(&s->l, grace);
    for (int k = 0; k < s->nconn; k++) {
        if (s->c[k].fd >= 0)
            close(s->c[k].fd);
        s->c[k].fd = -1;
    }
}

/* Ranks that made the least progress (a hang's suspects); the first into *rank. */
static int stuck_ranks(sup *s, int *rank, char *who, size_t cap)
{
    int64_t least = INT64_MAX, most = -1;
    for (int k = 0; k < s->nconn; k++)
        if (s->c[k].rank >= 0) {
            if (s->c[k].progress < least)
                least = s->c[k].progress;
            if (s->c[k].progress > most)
                most = s->c[k].progress;
        }
    *rank = -1;
    size_t used = 0;
    who[0] = '\0';
    int count = 0;
    for (int r = 0; r < s->n; r++) {
        conn *c = by_rank(s, r);
        if (!c || (c->progress == least && least < most)) {
            if (*rank < 0)
                *rank = r;
            count++;
            if (used + 16 < cap)
                used += (size_t)snprintf(who + used, cap - used, used ? ",%d" : "%d", r);
        }
    }
    return count;
}

static void check_timeouts(sup *s)
{
    double now = rk_ledger_now(&s->g);
    if (s->failing)
        return;
    if (s->hellos < s->n) {
        if (now - s->t_launch > s->o->startup_timeout_s) {
            int r;
            char who[256];
            stuck_ranks(s, &r, who, sizeof who);
            s->seen.startup_timeout = 1;
            fail(s, "never_connected", -1,
                 "rank %s never connected to %s within %.0f s (does the worker speak "
                 "docs/protocol.md?)",
                 who, RK_HB_ENV, s->o->startup_timeout_s);
        }
        return;
    }
    for (int k = 0; k < s->nconn; k++) {
        conn *c = &s->c[k];
        if (c->rank < 0 || c->bye || now - c->last <= s->o->hb_timeout_s)
            continue;
        int r;
        char who[256];
        int nstuck = stuck_ranks(s, &r, who, sizeof who);
        conn *sc = r >= 0 ? by_rank(s, r) : c;
        if (nstuck == 0 || r < 0) {
            r = c->rank;
            snprintf(who, sizeof who, "%d", r);
        }
        s->seen.hang = 1;
        s->seen.hang_rank = nstuck == s->n ? -1 : r;
        fail(s, "hang", nstuck == s->n ? -1 : r,
             "rank %s (device %s) made no progress for %.1f s at step %lld%s", who,
             devname(s, r), now - (sc ? sc->last : c->last), (long long)(sc ? sc->done : c->done),
             nstuck < s->n ? "; the other ranks wait for it" : "");
        return;
    }
}

static void status_line(sup *s)
{
    double now = rk_ledger_now(&s->g);
    if (s->o->quiet || now - s->last_status < 10.0)
        return;
    s->last_status = now;
    say(s, "%.0f s: step %lld, loss %.4f, %d rank%s, %d restart%s", now,
        (long long)s->last_done, s->loss, s->n, s->n == 1 ? "" : "s", s->g.restarts,
        s->g.restarts == 1 ? "" : "s");
}

/* A slot for a new connection, cleared: a closed one that never said hello, a new one, or
 * (too many strangers open, or the table full) the oldest stranger's, closed. NULL if the
 * table is full of ranks. */
static conn *free_slot(sup *s)
{
    conn *c = NULL, *oldest = NULL;
    int strangers = 0;
    for (int k = 0; k < s->nconn && !c; k++) {
        conn *x = &s->c[k];
        if (x->fd < 0 && x->rank < 0)
            c = x;
        else if (x->fd >= 0 && x->rank < 0) {
            strangers++;
            if (!oldest || x->since < oldest->since)
                oldest = x;
        }
    }
    if (!c && strangers < MAX_STRANGERS && s->nconn < MAX_CONNS)
        c = &s->c[s->nconn++];
    if (!c && oldest) {
        note(s, NULL, "too many heartbeat connections without a hello (%d): closing the oldest",
             strangers);
        drop_conn(s, oldest, "");
        c = oldest;
    }
    if (c) {
        memset(c, 0, sizeof *c);
        c->fd = -1;
        c->rank = -1;
    }
    return c;
}

/* Accept what is waiting (a bounded batch) and read each at once: a rank's hello is already
 * there, so a flood of other connections cannot keep it waiting. */
static void accept_conns(sup *s)
{
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        conn *c = free_slot(s);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->since = c->last = rk_ledger_now(&s->g);
        struct ucred cr;
        socklen_t len = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0)
            c->pid = cr.pid; /* the kernel's word, in our namespace */
        read_conn(s, c);
    }
}

/* Close connections that said no hello within HELLO_WAIT_S. */
static void expire_strangers(sup *s)
{
    double now = rk_ledger_now(&s->g);
    for (int k = 0; k < s->nconn; k++) {
        conn *c = &s->c[k];
        if (c->fd >= 0 && c->rank < 0 && now - c->since > HELLO_WAIT_S) {
            note(s, c, "closed a heartbeat connection that said no hello within %.0f s",
                 HELLO_WAIT_S);
            drop_conn(s, c, "");
        }
    }
}

/* The ranks of this launch that never said hello, as "1,3", into who[cap]. */
static void ranks_without_hello(sup *s, char *who, size_t cap)
{
    size_t used = 0;
    who[0] = '\0';
    for (int r = 0; r < s->n && used + 16 < cap; r++)
        if (!by_rank(s, r))
            used += (size_t)snprintf(who + used, cap - used, used ? ",%d" : "%d", r);
}

/* The launch has ended (exited: by itself, with exit status `code`; else torn down): what
 * the loop saw goes to policy.c; the verdict and its incident's detail into s->v, s->vdetail. */
static outcome judge(sup *s, int exited, int code)
{
    rk_sup_seen *e = &s->seen;
    e->ranks = s->n;
    e->hellos = s->hellos;
    e->done = 0;
    for (int k = 0; k < s->nconn; k++)
        if (s->c[k].rank >= 0 && s->c[k].bye && strcmp(s->c[k].status, "done") == 0)
            e->done++;
    e->exited = exited;
    e->status = exited ? code : -1;
    e->stop_sent = s->stop_sent;
    e->interrupted = interrupted != 0;
    rk_sup_classify(e, &s->v);
    const char *kind = s->v.kind ? s->v.kind : "";
    char who[256];
    ranks_without_hello(s, who, sizeof who);
    if (strcmp(kind, "never_connected") == 0 && !e->startup_timeout)
        snprintf(s->vdetail, sizeof s->vdetail,
                 "rank %s never connected to %s: the launcher exited with status %d first", who,
                 RK_HB_ENV, code);
    else if (strcmp(kind, "storage") == 0)
        snprintf(s->vdetail, sizeof s->vdetail, "%s",
                 s->storage_detail[0] ? s->storage_detail
                                      : "a rank exited with status 6 (RK_EXIT_STORAGE)");
    else if (s->failing && exited)
        snprintf(s->vdetail, sizeof s->vdetail, "%s; launcher exit status %d", s->fdetail, code);
    else if (s->failing)
        snprintf(s->vdetail, sizeof s->vdetail, "%s", s->fdetail);
    else
        snprintf(s->vdetail, sizeof s->vdetail, "the launcher exited with status %d at step %lld",
                 code, (long long)s->last_done);
    switch (s->v.next) {
    case RK_SUP_FINISHED: return FINISHED;
    case RK_SUP_INTERRUPTED: return INTERRUPTED;
    case RK_SUP_STOP:
        if (strcmp(kind, "storage") == 0 && !s->o->ckpt_dir) /* the worker's own files */
            say(s,
                "storage error: %s; stopping: a full, read-only or failing disk is not a "
                "device's fault and relaunching cannot fix it",
                s->vdetail);
        else if (strcmp(kind, "storage") == 0)
            say(s,
                "storage error on the checkpoint directory %s: %s; stopping: a full, "
                "read-only or failing disk is not a device's fault and relaunching cannot fix it "
                "(fix the directory and run again: the job resumes from its latest good "
                "checkpoint)",
                s->o->ckpt_dir, s->vdetail);
        else if (strcmp(kind, "usage") == 0)
            say(s, "%s: %s; stopping", s->vdetail, s->v.why);
        else
            say(s, "%s: %s; stopping: %s", kind, s->vdetail, s->v.why);
        return STOP;
    case RK_SUP_RELAUNCH: break;
    }
    return RELAUNCH;
}

/* Watch one launch until it ends; returns what to do next. */
static outcome watch(sup *s)
{
    for (;;) {
        if (interrupted && !s->stopping) { /* the grace runs from the first signal seen */
            s->stopping = 1;
            s->stop_t = rk_ledger_now(&s->g);
        }
        if (interrupted && !s->stop_sent && s->o->stop_grace_s > 0) {
            say(s, "interrupted: asking the ranks to checkpoint and stop (within %g s)",
                s->o->stop_grace_s);
            send_all(s, "{\"cmd\":\"stop\"}\n");
            s->stop_sent = 1;
        }
        if (interrupted > 1) {
            teardown(s, 0);
            return INTERRUPTED;
        }
        if (s->stopping && rk_ledger_now(&s->g) - s->stop_t >= s->o->stop_grace_s) {
            if (s->o->stop_grace_s > 0)
                say(s,
                    "interrupted: the ranks did not stop within --stop-grace %g s; tearing "
                    "the job down",
                    s->o->stop_grace_s);
            else
                say(s, "interrupted: tearing the job down at once (--stop-grace 0)");
            teardown(s, 0);
            return INTERRUPTED;
        }
        struct pollfd p[MAX_CONNS + 1];
        int np = 0;
        p[np++] = (struct pollfd){s->listen_fd, POLLIN, 0};
        int map[MAX_CONNS];
        for (int k = 0; k < s->nconn; k++)
            if (s->c[k].fd >= 0) {
                map[np - 1] = k;
                p[np++] = (struct pollfd){s->c[k].fd, POLLIN, 0};
            }
        int r = poll(p, (nfds_t)np, TICK_MS);
        if (r > 0) {
            for (int q = 1; q < np; q++)
                if (p[q].revents & (POLLIN | POLLHUP | POLLERR))
                    read_conn(s, &s->c[map[q - 1]]);
            if (p[0].revents & POLLIN)
                accept_conns(s);
        }
        expire_strangers(s);
        check_timeouts(s);
        gate_tick(s);
        status_line(s);
        int exited = rk_launch_poll(&s->l);
        if (exited) {
            /* read what the ranks said last before judging */
            for (int k = 0; k < s->nconn; k++)
                while (s->c[k].fd >= 0 && read_conn(s, &s->c[k]))
                    ;
            int st = s->l.status;
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            teardown(s, 0.5);
            return judge(s, 1, code);
        }
        /* A failure seen: the rest of the job is lost work waiting in a collective. A hang or
         * a rank that never connected: tear it down now. A rank that vanished or said it
         * exits: the launcher's exit status says what the failure was, so give it
         * EXIT_WAIT_S to exit by itself (it ends the other ranks); then tear down. */
        if (s->failing && (s->seen.hang || s->seen.startup_timeout ||
                           rk_ledger_now(&s->g) - s->ftime > EXIT_WAIT_S)) {
            teardown(s, 0);
            return judge(s, 0, -1);
        }
    }
}

/* ---- the job ------------------------------------------------------------------------------- */

static int open_socket(sup *s, rk_err *err)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof s->dir, "%s/rk-run.XXXXXX",
             tmp && *tmp && strlen(tmp) < 32 ? tmp : "/tmp");
    if (!mkdtemp(s->dir))
        return rk_err_set(err, RK_EIO, "cannot create a directory for the heartbeat socket: %s",
                          strerror(errno));
    snprintf(s->sock, sizeof s->sock, "%s/hb.sock", s->dir);
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", s->sock);
    /* the directory is 0700 (mkdtemp) and the socket 0600: only this user connects */
    if (s->listen_fd < 0 || chmod(s->dir, 0700) < 0 ||
        bind(s->listen_fd, (struct sockaddr *)&a, sizeof a) < 0 || chmod(s->sock, 0600) < 0 ||
        listen(s->listen_fd, 256) < 0)
        return rk_err_set(err, RK_EIO, "heartbeat socket %s: %s", s->sock, strerror(errno));
    return RK_OK;
}

/* Pick the devices of the next launch: the first n that are not quarantined and, with the
 * health gate, score at least the threshold now (a GPU left out may come back later). */
static int pick_devices(sup *s)
{
    rk_err err = {0};
    if (s->gate && rk_gate_sample(s->gate, &err))
        say(s, "health gate: %s", err.msg);
    s->last_gate = rk_ledger_now(&s->g);
    int k = 0;
    for (int d = 0; d < s->o->ndevices && k < s->o->n; d++) {
        if (s->quarantined[d] || s->drained[d])
            continue;
        if (s->gate && rk_gate_lost(s->gate, s->o->devices[d])) { /* gone, whatever the threshold */
            s->held[d] = 1;
            say(s, "health gate: device %s left out of this launch: the GPU is gone%s",
                s->o->devices[d],
                strcmp(rk_gate_backend(s->gate), "sim") == 0 ? " (simulated)" : "");
            continue;
        }
        char why[200];
        int score = s->gate ? rk_gate_score(s->gate, s->o->devices[d], why, sizeof why) : 100;
        /* a device left out before comes back only 10 points above the threshold, so a
         * score hovering at the threshold does not flap in and out of the job */
        double need = s->o->health_threshold + (s->held[d] ? 10 : 0);
        if (score < need) {
            s->held[d] = 1;
            rk_incident *i = rk_ledger_add(&s->g, "health_gate", -1, s->o->devices[d], "left_out",
                                           "score %d below %.0f: %s", score, need,
                                           why[0] ? why : "below the margin to come back");
            if (i) {
                i->lost_steps = 0;
                rk_ledger_write(&s->g, i);
            }
            say(s, "health gate: device %s left out of this launch: score %d (%s)",
                s->o->devices[d], score, why[0] ? why : "below the margin to come back");
            continue;
        }
        double prob = s->gate ? rk_gate_prob(s->gate, s->o->devices[d]) : -1.0;
        if (s->o->predictor && prob >= s->o->drain_probability) {
            s->held[d] = 1;
            rk_incident *i = rk_ledger_add(&s->g, "predicted_failure", -1, s->o->devices[d],
                                           "left_out", "the predictor gives p=%.2f of failing "
                                           "within its horizon", prob);
            if (i) {
                i->lost_steps = 0;
                rk_ledger_write(&s->g, i);
            }
            say(s, "health gate: device %s left out of this launch: predicted to fail (p=%.2f)",
                s->o->devices[d], prob);
            continue;
        }
        s->held[d] = 0;
        s->dev[k++] = d;
    }
    s->n = k;
    return k;
}

/* During a run: read the GPUs every --health-interval; drain a device of this launch whose
 * score fell below the threshold (checkpoint and stop, then relaunch without it). */
static void gate_tick(sup *s)
{
    double now = rk_ledger_now(&s->g);
    /* a drain needs every rank to hear the stop: wait until all said hello */
    if (!s->gate || s->failing || s->stop_sent || s->hellos < s->n ||
        now - s->last_gate < s->o->health_interval_s)
        return;
    s->last_gate = now;
    rk_err err = {0};
    if (rk_gate_sample(s->gate, &err))
        say(s, "health gate: %s", err.msg);
    /* A simulated GPU that fails (off the bus, an uncorrectable ECC error) takes its rank
     * down, as a real one would (a real GPU's failure reaches its process without our help). */
    if (strcmp(rk_gate_backend(s->gate), "sim") == 0) {
        int killed = 0;
        for (int r = 0; r < s->n; r++) {
            if (!rk_gate_take_fatal(s->gate, devname(s, r)))
                continue;
            for (int k = 0; k < s->nconn; k++)
                if (s->c[k].rank == r && s->c[k].pid > 1 && !s->c[k].bye &&
                    rk_launch_owns(&s->l, (pid_t)s->c[k].pid)) { /* only a rank of ours */
                    say(s, "simulated GPU %s failed (%s): killing rank %d (pid %ld), as the "
                        "failure would", devname(s, r),
                        rk_gate_lost(s->gate, devname(s, r)) ? "off the bus"
                                                             : "uncorrectable ECC error",
                        r, s->c[k].pid);
                    kill((pid_t)s->c[k].pid, SIGKILL);
                    killed = 1;
                }
        }
        if (killed)
            return; /* the crash is classified by the watch loop */
    }
    for (int r = 0; r < s->n && s->o->predictor; r++) {
        double prob = rk_gate_prob(s->gate, devname(s, r));
        if (prob < s->o->drain_probability)
            continue;
        rk_incident *i = rk_ledger_add(&s->g, "predicted_failure", r, devname(s, r), "drain",
                                       "the predictor gives p=%.2f of failing within its horizon "
                                       "at step %lld: checkpoint, relaunch without it", prob,
                                       (long long)s->last_done);
        if (i) {
            i->lost_steps = 0;
            rk_ledger_write(&s->g, i);
        }
        say(s, "health gate: draining device %s (rank %d): predicted to fail (p=%.2f)",
            devname(s, r), r, prob);
        s->drained[s->dev[r]] = 1;
        send_all(s, "{\"cmd\":\"stop\"}\n");
        s->stop_sent = 1;
        return;
    }
    for (int r = 0; r < s->n; r++) {
        char why[200];
        int score = rk_gate_score(s->gate, devname(s, r), why, sizeof why);
        if (score >= s->o->health_threshold)
            continue;
        rk_incident *i = rk_ledger_add(&s->g, "health_drain", r, devname(s, r), "drain",
                                       "score %d fell below %.0f at step %lld: %s", score,
                                       s->o->health_threshold, (long long)s->last_done, why);
        if (i) {
            i->lost_steps = 0;
            rk_ledger_write(&s->g, i);
        }
        say(s, "health gate: draining device %s (rank %d): score %d (%s)", devname(s, r), r,
            score, why);
        s->drained[s->dev[r]] = 1;
        send_all(s, "{\"cmd\":\"stop\"}\n");
        s->stop_sent = 1;
        return;
    }
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(path);
    return 0;
}

/* The incident for the verdict on the launch that ended (none for a clean stop): a relaunch
 * is pending until the job is back at work (its recovery is measured then), a stop is final.
 * Returns its index in the ledger, SIZE_MAX if none. */
static size_t record_verdict(sup *s, const char *action)
{
    if (!s->v.kind)
        return SIZE_MAX;
    int r = s->v.rank;
    /* the device is named only when it is blamed */
    rk_incident *i = rk_ledger_add(&s->g, s->v.kind, r, s->v.counted ? devname(s, r) : "",
                                   action, "%s", s->vdetail);
    if (!i)
        return SIZE_MAX;
    if (s->failing)
        i->t = s->ftime; /* when it was seen, not when the teardown ended */
    size_t at = (size_t)(i - s->g.inc);
    if (strcmp(action, "stop") == 0) {
        rk_ledger_write(&s->g, i);
        return at;
    }
    say(s, "%s: %s", s->v.kind, s->vdetail);
    s->pending_last_done = s->last_done;
    for (int k = 0; k < s->nconn; k++) { /* the most each rank had done, over pending ones */
        int cr = s->c[k].rank;
        if (cr >= 0 && cr < RK_SUP_MAX_DEVICES && s->c[k].done > s->pending_done[cr])
            s->pending_done[cr] = s->c[k].done;
    }
    pend(s, i);
    if (s->v.counted)
        count_failure(s, r, s->v.kind);
    return at;
}

/* No relaunch after all (out of restarts, too few devices): the incident at `at` says stop. */
static void no_relaunch(sup *s, size_t at)
{
    if (at < s->g.ninc && !s->g.inc[at].written)
        snprintf(s->g.inc[at].action, sizeof s->g.inc[at].action, "stop");
    flush_pending(s);
}

int rk_sup_run(const rk_sup_opts *o)
{
    sup *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, "rk run: out of memory\n");
        return RK_EXIT_FAIL;
    }
    s->o = o;
    s->listen_fd = -1;
    s->l.life = -1;
    s->first_launch = -1;
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++)
        s->pending_done[r] = -1;
    rk_err err = {0};
    int status = RK_EXIT_FAIL;
    const char *result = "failed";
    if (rk_ledger_open(&s->g, o->events_path, &err) || rk_inject_parse(o->inject, &s->spec, &err) ||
        !(s->fired = calloc(rk_inject_count(s->spec) + 1, 1)) || open_socket(s, &err)) {
        fprintf(stderr, "rk run: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto out;
    }
    int gate_auto = o->health && strcmp(o->health, "auto") == 0;
    int rc = o->health ? rk_gate_open(&s->gate, o, &err) : RK_OK;
    if (rc) {
        if (!gate_auto) {
            fprintf(stderr, "rk run: health gate: %s\n", err.msg);
            /* bad input (a broken --predictor): exit 2, as rk exporter and rk doctor */
            if (rc == RK_EFORMAT || rc == RK_EINVAL || rc == RK_EMISMATCH || rc == RK_ENOENT)
                status = RK_EXIT_USAGE;
            goto out;
        }
        say(s, "health gate off: %s", err.msg); /* no NVML here: run without it */
        s->gate = NULL;
    }
    if (s->gate) {
        for (int d = 0; d < o->ndevices; d++)
            if (!rk_gate_knows(s->gate, o->devices[d])) {
                fprintf(stderr, "rk run: health gate: device '%s' is not a GPU index of the %s "
                                "backend\n", o->devices[d], rk_gate_backend(s->gate));
                goto out;
            }
        say(s, "health gate: %s GPUs%s, threshold %.0f, read every %.1f s", rk_gate_backend(s->gate),
            strcmp(rk_gate_backend(s->gate), "sim") == 0 ? " (simulated)" : "",
            o->health_threshold, o->health_interval_s);
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* a closed terminal: checkpoint and stop, like TERM */
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* whatever escapes a keeper is reparented to us */
    if (pick_devices(s) < o->min_ranks || s->n < 1) {
        say(s, "cannot start: %d healthy device%s, below --min-ranks %d", s->n,
            s->n == 1 ? "" : "s", o->min_ranks);
        goto out;
    }
    char desc[1024];
    say(s, "%s", rk_launch_describe(o->launcher, s->n, o->launcher_args, o->worker, desc,
                                    sizeof desc));
    char devs[512];
    size_t used = 0;
    devs[0] = '\0';
    for (int r = 0; r < s->n && used + 2 < sizeof devs; r++)
        used += (size_t)snprintf(devs + used, sizeof devs - used, r ? ",%s" : "%s",
                                 o->devices[s->dev[r]]);
    say(s, "%d ranks on devices %s; heartbeat timeout %.0f s, quarantine after %d failures",
        s->n, devs, o->hb_timeout_s, o->failure_threshold);
    if (o->inject)
        say(s, "injecting faults (simulated): %s", o->inject);
    for (;;) {
        if (start_launch(s, &err)) {
            say(s, "%s", err.msg);
            if (err.code == RK_ENOENT) /* the launcher cannot be executed: no relaunch */
                status = RK_EXIT_USAGE;
            break;
        }
        outcome oc = watch(s);
        if (oc == FINISHED) {
            resolve_pending(s, s->start_step);
            status = RK_EXIT_OK;
            result = "finished";
            break;
        }
        if (oc == BAD_USAGE || oc == STOP) { /* relaunching cannot help */
            record_verdict(s, "stop");
            flush_pending(s);
            status = oc == STOP ? s->v.status : RK_EXIT_USAGE;
            break;
        }
        if (oc == INTERRUPTED) {
            flush_pending(s);
            status = 130;
            result = "interrupted";
            break;
        }
        /* a failure (or a stop to drain or shrink the job): account, then relaunch */
        size_t at = record_verdict(s, "relaunch");
        if (s->g.restarts >= o->max_restarts) {
            no_relaunch(s, at);
            say(s, "giving up: the job failed again after %d relaunch%s (--max-restarts %d)",
                s->g.restarts, s->g.restarts == 1 ? "" : "es", o->max_restarts);
            break;
        }
        int n = pick_devices(s);
        if (n < o->min_ranks || n < 1) {
            no_relaunch(s, at);
            say(s, "giving up: %d device%s left, below --min-ranks %d", n, n == 1 ? "" : "s",
                o->min_ranks);
            break;
        }
        s->g.restarts++; /* relaunches done */
        s->launch_no++;
        char list[512];
        size_t len = 0;
        list[0] = '\0';
        for (int r = 0; r < n && len + 2 < sizeof list; r++)
            len += (size_t)snprintf(list + len, sizeof list - len, r ? ",%s" : "%s",
                                    o->devices[s->dev[r]]);
        say(s, "relaunch %d on %d rank%s (devices %s) from the latest good checkpoint",
            s->launch_no, n, n == 1 ? "" : "s", list);
    }
out:
    if (s->l.pid > 0)
        rk_launch_kill(&s->l, 0); /* nothing of the job outlives rk run */
    if (s->g.t0 > 0 && rk_ledger_summary(&s->g, o->summary_path, stderr, s->last_done, s->n,
                                         result, &err))
        fprintf(stderr, "rk run: %s\n", err.msg);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->sock[0])
        unlink(s->sock);
    if (s->dir[0])
        nftw(s->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); /* with the launchers' files */
    rk_inject_free(s->spec);
    rk_gate_close(s->gate);
    free(s->fired);
    rk_ledger_close(&s->g);
    free(s);
    return status;
}
