/*
 * The node agent's ranks (cluster/agent_job.h): a keeper of launch.c for the node's ranks,
 * a private Unix socket for their heartbeats, and one channel of the node link per rank
 * connection. The agent trusts a connection only when the kernel says its peer is a process
 * of the keeper's tree (SO_PEERCRED, /proc), as rk run does on one host (conns.c); the
 * coordinator then believes the channel's pid because the link is authenticated. The lines
 * about connections it closes (any local user can connect to the abstract socket) are
 * rate-limited by base/hush.h, as the heartbeat socket's.
 */
#define _GNU_SOURCE
#include "cluster/agent_job.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/hush.h"
#include "cluster/nodes.h"
#include "net/sock.h"
#include "rekindle/snap.h"
#include "supervisor/stackwait.h"
#include "supervisor/supervisor.h"

#define MAX_CHANS 64
#define WRITE_TIMEOUT_S 1.0
#define STACKS_SEND_MAX (64 << 10) /* bytes of one dump sent to the coordinator */
#define SAY_CLOSED 5               /* lines about connections closed a window, then a count */
#define SAY_CLOSED_WINDOW_S 10.0

typedef struct chan {
    int fd; /* -1: free */
    uint32_t id;
    int pidfd; /* a watched rank's process (abstract socket), -1 none */
    pid_t pid; /* the rank's process in the agent's view (SO_PEERCRED) */
    /* a stack dump asked for (STACKS): its file, and how it grows */
    int dumping;
    char dump[160];
    rk_stack_wait w;
} chan;

struct rk_agent_job {
    rk_agent_job_opts o;
    char dir[64], sock[96], stacks[96];
    int lfd;
    int afd;      /* the abstract socket, -1 none */
    int watching; /* a LAUNCH with watch=1: ranks of another launcher connect to afd */
    rk_launch l;
    int running;        /* the keeper of `launch` runs */
    int exited_pending; /* its EXITED is still to be sent */
    rk_node_exited exited;
    uint32_t launch, base;
    uint32_t next_chan;
    chan ch[MAX_CHANS];
    rk_hush closed; /* the lines about connections closed: a few a window, then a count */
    char snap[RK_SNAP_PATH_MAX]; /* the job's snapshot directory on this node, "" none */
};

__attribute__((format(printf, 2, 3))) static void say(rk_agent_job *j, const char *fmt, ...)
{
    if (!j->o.on_log)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    j->o.on_log(j->o.ctx, line);
}

/* The count of the lines about closed connections held back in a window that ended (`all`:
 * in the current one too). */
static void say_hushed(rk_agent_job *j, int all)
{
    double now = all ? j->closed.since + SAY_CLOSED_WINDOW_S : rk_mono_s();
    int n = rk_hush_due(&j->closed, now, SAY_CLOSED_WINDOW_S);
    if (n > 0)
        say(j, "closed %d more heartbeat connection%s in %g s (not logged one by one)", n,
            n == 1 ? "" : "s", SAY_CLOSED_WINDOW_S);
}

int rk_agent_job_new(rk_agent_job **out, const rk_agent_job_opts *o, rk_err *err)
{
    *out = NULL;
    rk_agent_job *j = calloc(1, sizeof *j);
    if (!j)
        return rk_err_set(err, RK_ENOMEM, "agent: out of memory");
    j->o = *o;
    j->lfd = j->afd = -1;
    j->l.life = j->l.failed = -1;
    j->next_chan = 1;
    for (int i = 0; i < MAX_CHANS; i++)
        j->ch[i].fd = j->ch[i].pidfd = -1;
    int rc = rk_sup_private_socket("rk-agent", j->dir, sizeof j->dir, j->sock, sizeof j->sock,
                                   &j->lfd, err);
    snprintf(j->stacks, sizeof j->stacks, "%s/stacks", j->dir);
    if (!rc && mkdir(j->stacks, 0700) < 0)
        rc = rk_err_set(err, RK_EIO, "agent: %s: %s", j->stacks, strerror(errno));
    if (rc) {
        rk_agent_job_free(j);
        return rc;
    }
    if (o->snap_parent) { /* no directory is no error: the job restores from disk */
        rk_err e = {0};
        const char *parent = o->snap_parent[0] ? o->snap_parent : getenv("RK_SNAP_PARENT");
        int swept = 0;
        uint64_t sb = 0;
        char names[600];
        /* what killed jobs left on this node (their maker gone): removed, said */
        if (rk_snap_dir_sweep(parent && *parent ? parent : NULL, &swept, &sb, names, sizeof names,
                              &e) == RK_OK &&
            swept > 0)
            say(j, "removed %d snapshot director%s left by jobs that were killed (%.1f MiB): %s",
                swept, swept == 1 ? "y" : "ies", (double)sb / (1024.0 * 1024.0), names);
        e = (rk_err){0};
        if (rk_snap_dir_make(parent, j->snap, sizeof j->snap, &e) ||
            !rk_node_snap_ok(j->snap, strlen(j->snap))) {
            say(j, "no snapshots in memory on this node: %s",
                e.msg[0] ? e.msg : "its path is not one a HELLO can carry");
            if (!e.msg[0])
                rk_snap_dir_remove(j->snap, &e);
            j->snap[0] = '\0';
        } else
            say(j, "the ranks' snapshots in memory on this node: %s", j->snap);
    }
    if (o->abstract) {
        struct sockaddr_un b = {.sun_family = AF_UNIX};
        size_t n = strlen(o->abstract);
        if (n + 1 >= sizeof b.sun_path) {
            rk_agent_job_free(j);
            return rk_err_set(err, RK_EINVAL, "agent: the abstract socket's name is too long");
        }
        memcpy(b.sun_path + 1, o->abstract, n);
        j->afd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (j->afd < 0 ||
            bind(j->afd, (struct sockaddr *)&b,
                 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) < 0 ||
            listen(j->afd, 64) < 0) {
            int e = errno;
            rk_agent_job_free(j);
            return rk_err_set(err, RK_EIO, "agent: abstract socket @%s: %s", o->abstract,
                              strerror(e));
        }
    }
    *out = j;
    return RK_OK;
}

/* The snapshot directory goes (the job's end, or snapshots turned off). */
static void remove_snap(rk_agent_job *j, const char *why)
{
    if (!j->snap[0])
        return;
    rk_err e = {0};
    if (rk_snap_dir_remove(j->snap, &e) && e.code != RK_ENOENT)
        say(j, "snapshots: %s", e.msg);
    else
        say(j, "removed the snapshot directory %s (%s)", j->snap, why);
    j->snap[0] = '\0';
}

const char *rk_agent_job_snap_dir(const rk_agent_job *j)
{
    return j && j->snap[0] ? j->snap : NULL;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(path);
    return 0;
}

static void close_chan(chan *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->pidfd >= 0)
        close(c->pidfd);
    c->fd = c->pidfd = -1;
    c->dumping = 0;
}

/* Send what the rank dumped since the signal (at most STACKS_SEND_MAX bytes of the regular
 * file, opened without following a link) as STACK frames, then STACK_END. */
static void send_dump(rk_agent_job *j, chan *c, rk_node_send_fn send, void *ctx)
{
    uint8_t buf[RK_NODE_DATA_MAX];
    size_t sent = 0;
    int fd = open(c->dump, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        off_t at = st.st_size < c->w.from ? 0 : c->w.from;
        while (sent < STACKS_SEND_MAX) {
            size_t want = STACKS_SEND_MAX - sent < sizeof buf ? STACKS_SEND_MAX - sent : sizeof buf;
            ssize_t n = pread(fd, buf, want, at);
            if (n <= 0)
                break;
            if (rk_node_chan_send(c->id, RK_NODE_MSG_STACK, buf, (size_t)n, send, ctx) != 0)
                break;
            at += n;
            sent += (size_t)n;
        }
    }
    if (fd >= 0)
        close(fd);
    rk_node_chan_send(c->id, RK_NODE_MSG_STACK_END, NULL, 0, send, ctx);
    say(j, "sent the stacks of the rank on channel %u: %zu bytes of %s", (unsigned)c->id, sent,
        c->dump);
    c->dumping = 0;
}

/* The dumps asked for: sent once the wait is over (supervisor/stackwait.h: complete, or
 * what is there after RK_STACKS_WAIT_S, maybe nothing). */
static void pump_dumps(rk_agent_job *j, rk_node_send_fn send, void *ctx)
{
    double now = rk_mono_s();
    for (int i = 0; i < MAX_CHANS; i++) {
        chan *c = &j->ch[i];
        if (c->dumping && rk_stack_wait_over(&c->w, c->dump, now))
            send_dump(j, c, send, ctx);
    }
}

/* Send every dump under way now, as far as it got. */
static void flush_dumps(rk_agent_job *j, rk_node_send_fn send, void *ctx)
{
    for (int i = 0; i < MAX_CHANS; i++)
        if (j->ch[i].dumping)
            send_dump(j, &j->ch[i], send, ctx);
}

/* STACKS: SIGUSR1 to the rank of that channel (a process the kernel named at accept: of the
 * keeper's tree, checked again now, or through the pidfd of a watched one), its dump file
 * watched from now. */
static void on_stacks(rk_agent_job *j, const rk_node_stacks *m, rk_node_send_fn send, void *ctx)
{
    chan *c = NULL;
    for (int i = 0; i < MAX_CHANS && !c; i++)
        if (j->ch[i].fd >= 0 && j->ch[i].id == m->chan)
            c = &j->ch[i];
    if (c && c->dumping)
        return;                         /* the dump under way sends its own end */
    if (!c || m->launch != j->launch) { /* nothing to dump: say so at once */
        rk_node_chan_send(m->chan, RK_NODE_MSG_STACK_END, NULL, 0, send, ctx);
        return;
    }
    int sig = -1;
    if (j->running && c->pidfd < 0 && c->pid > 0 && rk_launch_owns(&j->l, c->pid)) {
        /* the file the rank writes: $RK_STACK_DIR (this agent's) with its global rank and
         * RK_LAUNCH (launch - 1) in the name */
        snprintf(c->dump, sizeof c->dump, "%s/stacks-rank%u-launch%u.txt", j->stacks,
                 (unsigned)m->rank, (unsigned)(m->launch - 1));
        rk_stack_wait_begin(&c->w, c->dump, rk_mono_s());
        sig = kill(c->pid, SIGUSR1);
    }
    if (sig != 0) { /* nothing to ask (a watched rank's dump is in its own directory) */
        rk_node_chan_send(c->id, RK_NODE_MSG_STACK_END, NULL, 0, send, ctx);
        return;
    }
    c->dumping = 1;
    say(j, "asked rank %u (pid %ld) for its stacks (SIGUSR1)", (unsigned)m->rank, (long)c->pid);
}

static void close_chans(rk_agent_job *j)
{
    for (int i = 0; i < MAX_CHANS; i++)
        close_chan(&j->ch[i]);
}

/* The watched ranks (another launcher's) ended: SIGKILL through the pidfds the kernel gave
 * when they connected, so a pid reused since is never hit. */
static void end_watched(rk_agent_job *j)
{
    if (!j->watching)
        return;
    for (int i = 0; i < MAX_CHANS; i++)
        if (j->ch[i].pidfd >= 0)
            syscall(SYS_pidfd_send_signal, j->ch[i].pidfd, SIGKILL, NULL, 0);
    j->watching = 0;
}

/* The keeper is gone: its EXITED, waiting to be sent. */
static void reaped(rk_agent_job *j)
{
    int st = j->l.status;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    int failed = rk_launch_failed_rank(&j->l);
    j->exited = (rk_node_exited){.launch = j->launch,
                                 .status = (uint32_t)(code & 0xff),
                                 .failed = failed >= 0 ? (int64_t)j->base + failed : -1};
    j->exited_pending = 1;
    j->running = 0;
    say(j, "the ranks of launch %u ended: status %d%s", (unsigned)j->launch, code,
        failed >= 0 ? "" : "");
}

static void end_ranks(rk_agent_job *j, double grace)
{
    if (!j->running)
        return;
    rk_launch_kill(&j->l, grace);
    rk_launch_poll(&j->l);
    reaped(j);
}

void rk_agent_job_free(rk_agent_job *j)
{
    if (!j)
        return;
    say_hushed(j, 1);
    end_ranks(j, 0);
    end_watched(j);
    close_chans(j);
    if (j->lfd >= 0)
        close(j->lfd);
    if (j->afd >= 0)
        close(j->afd);
    if (j->dir[0])
        nftw(j->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    remove_snap(j, "the job is over");
    free(j);
}

int rk_agent_job_running(const rk_agent_job *j)
{
    return j->running;
}

int rk_agent_job_pollfds(const rk_agent_job *j, struct pollfd *p, int cap)
{
    int n = 0;
    if (n < cap)
        p[n++] = (struct pollfd){j->lfd, POLLIN, 0};
    if (n < cap)
        p[n++] = (struct pollfd){j->afd, j->afd >= 0 ? POLLIN : 0, 0};
    for (int i = 0; i < MAX_CHANS && n < cap; i++)
        if (j->ch[i].fd >= 0)
            p[n++] = (struct pollfd){j->ch[i].fd, POLLIN, 0};
    return n;
}

/* Relay what a rank said: 1 if bytes went, 0 if none waited, -1 once it closed (what it
 * dumped goes before the CLOSE). */
static int relay(rk_agent_job *j, chan *c, rk_node_send_fn send, void *ctx)
{
    int r = rk_node_chan_forward(c->fd, c->id, send, ctx);
    if (r < 0) {
        if (c->dumping)
            send_dump(j, c, send, ctx);
        rk_node_chan_send(c->id, RK_NODE_MSG_CLOSE, NULL, 0, send, ctx);
        close_chan(c);
    }
    return r;
}

/* Accept on the private socket (ranks of this agent's keeper) or, `abstract`, on the
 * abstract one (ranks another launcher started: this user's processes). */
static void accept_ranks(rk_agent_job *j, int abstract, rk_node_send_fn send, void *ctx)
{
    for (int k = 0; k < 16; k++) {
        int fd = accept4(abstract ? j->afd : j->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        struct ucred cr;
        socklen_t len = sizeof cr;
        long nspid = -1;
        int owned = 0, pidfd = -1;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.pid > 0) {
            nspid = rk_proc_nspid((pid_t)cr.pid);
            if (abstract) {
                pidfd = (int)syscall(SYS_pidfd_open, cr.pid, 0);
                owned = j->watching && nspid > 0 && cr.uid == geteuid() && pidfd >= 0;
            } else {
                owned = j->running && nspid > 0 && rk_launch_owns(&j->l, (pid_t)cr.pid);
            }
        }
        chan *c = NULL;
        for (int i = 0; i < MAX_CHANS && !c; i++)
            if (j->ch[i].fd < 0)
                c = &j->ch[i];
        if (!owned || !c) {
            say_hushed(j, 0);
            if (rk_hush_pass(&j->closed, rk_mono_s(), SAY_CLOSED, SAY_CLOSED_WINDOW_S))
                say(j, "closed a heartbeat connection from pid %ld: %s",
                    (long)(nspid > 0 ? cr.pid : -1),
                    !c                         ? "too many connections"
                    : abstract && !j->watching ? "no launch of another launcher is watched"
                    : abstract                 ? "not this user's process"
                                               : "not a process of this node's launch");
            close(fd);
            if (pidfd >= 0)
                close(pidfd);
            continue;
        }
        c->fd = fd;
        c->pidfd = pidfd;
        c->pid = cr.pid;
        c->dumping = 0;
        c->id = j->next_chan++;
        rk_node_open m = {.launch = j->launch, .chan = c->id, .pid = nspid};
        char out[RK_NODE_PAYLOAD_MAX];
        size_t n;
        rk_err e = {0};
        if (rk_node_open_format(&m, out, sizeof out, &n, &e) == RK_OK)
            send(ctx, RK_NODE_MSG_OPEN, out, n);
        relay(j, c, send, ctx);
    }
}

static void send_exited(rk_agent_job *j, rk_node_send_fn send, void *ctx)
{
    char out[RK_NODE_PAYLOAD_MAX];
    size_t n;
    rk_err e = {0};
    if (rk_node_exited_format(&j->exited, out, sizeof out, &n, &e) != RK_OK ||
        send(ctx, RK_NODE_MSG_EXITED, out, n) == 0)
        j->exited_pending = 0;
}

void rk_agent_job_ready(rk_agent_job *j, const struct pollfd *p, int n, rk_node_send_fn send,
                        void *ctx)
{
    for (int q = 2; q < n; q++) {
        if (!p[q].revents)
            continue;
        for (int i = 0; i < MAX_CHANS; i++)
            if (j->ch[i].fd == p[q].fd) {
                for (int k = 0; k < 16 && relay(j, &j->ch[i], send, ctx) == 1; k++)
                    ;
                break;
            }
    }
    if (n > 0 && (p[0].revents & POLLIN))
        accept_ranks(j, 0, send, ctx);
    if (n > 1 && (p[1].revents & POLLIN))
        accept_ranks(j, 1, send, ctx);
    if (j->running && rk_launch_poll(&j->l)) {
        /* the ranks' last words before the node's end */
        for (int i = 0; i < MAX_CHANS; i++)
            while (j->ch[i].fd >= 0 && relay(j, &j->ch[i], send, ctx) == 1)
                ;
        reaped(j);
    }
    pump_dumps(j, send, ctx);
    if (j->exited_pending)
        send_exited(j, send, ctx);
    say_hushed(j, 0);
}

void rk_agent_job_link_lost(rk_agent_job *j)
{
    if (j->running)
        say(j, "ending the ranks of launch %u: the link to the coordinator is gone",
            (unsigned)j->launch);
    end_ranks(j, 0);
    end_watched(j);
    close_chans(j);
}

/* ---- LAUNCH ---------------------------------------------------------------------------- */

static int start(rk_agent_job *j, const rk_node_launch *m, uint32_t port, rk_err *err)
{
    /* RK_DEVICES is indexed by the global rank: other nodes' ranks hold a "-" */
    static char devs[1200];
    size_t used = 0;
    devs[0] = '\0';
    for (uint32_t r = 0; r < m->base && used < sizeof devs; r++)
        used += (size_t)snprintf(devs + used, sizeof devs - used, r ? ",-" : "-");
    if (used < sizeof devs)
        snprintf(devs + used, sizeof devs - used, "%s%s", m->base ? "," : "", m->devices);
    rk_rank_env_opts eo = {.heartbeat = j->sock,
                           .devices = devs,
                           .launch = (int)m->launch - 1,
                           .world = (int)m->world,
                           .local_world = (int)m->ranks,
                           .rank_base = (int)m->base,
                           .master_addr = m->master,
                           .master_port = (int)port,
                           .cuda_visible = m->devices,
                           .stack_dir = j->stacks,
                           .pythonpath = !j->o.no_pythonpath,
                           .ckpt_dir = j->o.ckpt_dir,
                           .snap_dir = j->snap[0] ? j->snap : NULL,
                           .inject = j->o.inject,
                           .inject_done = m->done};
    static rk_rank_env re;
    int rc = rk_rank_env_build(&re, &eo, err);
    if (rc)
        return rc;
    const char *const *env = re.env;
    const char *ns = getenv("RK_RUN_PIDNS");
    return rk_launch_start(&j->l, RK_LAUNCH_LOCAL, NULL, (int)m->ranks, j->o.worker,
                           (char *const *)env, !(ns && strcmp(ns, "0") == 0), err);
}

static int on_launch(rk_agent_job *j, const rk_node_launch *m, rk_node_send_fn send, void *ctx)
{
    flush_dumps(j, send, ctx);
    end_ranks(j, 0); /* a launch replaces the one before (its EXITED goes first) */
    end_watched(j);
    close_chans(j);
    if (j->exited_pending)
        send_exited(j, send, ctx);
    if (m->snap_off)
        remove_snap(j, "snapshots in memory are off for this job");
    if (m->watch) { /* another launcher starts them: watch who connects */
        if (!j->o.abstract) {
            say(j, "launch %u: asked to watch ranks, but this agent has no abstract socket",
                (unsigned)m->launch);
            return -1;
        }
        j->launch = m->launch;
        j->base = m->base;
        j->watching = 1;
        say(j, "launch %u: watching ranks %u..%u of %u on @%s", (unsigned)m->launch,
            (unsigned)m->base, (unsigned)(m->base + m->ranks - 1), (unsigned)m->world,
            j->o.abstract);
        return 0;
    }
    uint32_t port = m->port;
    if (port == 0) {
        int p = rk_env_free_port();
        port = p > 0 ? (uint32_t)p : 29500;
    }
    j->launch = m->launch;
    j->base = m->base;
    rk_err e = {0};
    if (start(j, m, port, &e)) {
        say(j, "launch %u: %s", (unsigned)m->launch, e.msg);
        j->exited = (rk_node_exited){.launch = m->launch, .status = 127, .failed = m->base};
        j->exited_pending = 1;
        send_exited(j, send, ctx);
        return 0;
    }
    j->running = 1;
    say(j, "launch %u: started ranks %u..%u of %u (MASTER_ADDR %s, port %u)", (unsigned)m->launch,
        (unsigned)m->base, (unsigned)(m->base + m->ranks - 1), (unsigned)m->world, m->master,
        (unsigned)port);
    rk_node_launched a = {.launch = m->launch, .port = m->port == 0 ? port : 0};
    char out[RK_NODE_PAYLOAD_MAX];
    size_t n;
    if (rk_node_launched_format(&a, out, sizeof out, &n, &e) == RK_OK)
        send(ctx, RK_NODE_MSG_LAUNCHED, out, n);
    return 0;
}

int rk_agent_job_msg(rk_agent_job *j, uint8_t type, const uint8_t *payload, size_t len,
                     rk_node_send_fn send, void *ctx)
{
    rk_err e = {0};
    switch (type) {
    case RK_NODE_MSG_LAUNCH: {
        rk_node_launch m;
        if (rk_node_launch_parse(payload, len, &m, &e)) {
            say(j, "a bad LAUNCH: %s", e.msg);
            return -1;
        }
        return on_launch(j, &m, send, ctx);
    }
    case RK_NODE_MSG_KILL: {
        rk_node_kill m;
        if (rk_node_kill_parse(payload, len, &m, &e)) {
            say(j, "a bad KILL: %s", e.msg);
            return -1;
        }
        if (m.launch == j->launch)
            flush_dumps(j, send, ctx); /* what the ranks dumped before they are ended */
        if (m.launch == j->launch && j->running) {
            end_ranks(j, m.grace_s);
            send_exited(j, send, ctx);
        }
        if (m.launch == j->launch && j->watching) {
            end_watched(j);
            close_chans(j);
        }
        return 0;
    }
    case RK_NODE_MSG_STACKS: {
        rk_node_stacks m;
        if (rk_node_stacks_parse(payload, len, &m, &e)) {
            say(j, "a bad STACKS: %s", e.msg);
            return -1;
        }
        on_stacks(j, &m, send, ctx);
        return 0;
    }
    case RK_NODE_MSG_DATA:
    case RK_NODE_MSG_CLOSE: {
        uint32_t id;
        const uint8_t *bytes;
        size_t n;
        int end = rk_node_chan_take(type, payload, len, &id, &bytes, &n, &e);
        if (end < 0) {
            say(j, "a bad %s: %s", rk_node_msg_name(type), e.msg);
            return -1;
        }
        for (int i = 0; i < MAX_CHANS; i++) {
            chan *c = &j->ch[i];
            if (c->fd < 0 || c->id != id)
                continue;
            if (end || rk_net_send_all(c->fd, bytes, n, WRITE_TIMEOUT_S, "a rank", &e) != RK_OK)
                close_chan(c);
            break;
        }
        return 0;
    }
    default: return -1;
    }
}
