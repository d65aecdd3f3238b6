/*
 * A job over many hosts (docs/cluster.md): rk run is the coordinator. It listens on --listen
 * for the node link (nodes.h), starts one `rk agent` per host through --rsh (ssh by default;
 * the job's secret on the agent's stdin), and runs each launch through the agents: LAUNCH to
 * every node in use (rank 0's node first: its agent picks MASTER_PORT), each rank's heartbeat
 * stream relayed as a channel that ends here in a socketpair, so the job reads a remote rank
 * as it reads a local one; the launch has ended when every node in use said EXITED or was
 * lost. The first node to end with a failure gets the others' ranks ended at once, as the
 * local keeper does. A node lost during a launch (silent for --node-timeout, its link or its
 * agent gone) fails the launch (kind node_lost), is counted towards its quarantine like a
 * device (--failure-threshold), and its devices stay out while it is not connected: the
 * spare hosts' devices take their place. A failure the ranks show (a rank's end, the
 * launcher's exit) is blamed on a device only once every node of the launch answered a PING
 * sent after it: a node lost meanwhile is the cause (policy.h, rk_sup_node_blame). It is a
 * backend of the supervisor (supervisor/backend.h): the job's loop calls its ops, and it
 * changes the job only through the services there. The node table's callbacks record what
 * they saw (state of the launch, and a bounded queue of facts: a channel opened, a rank's
 * bytes, a stack dump's, a line to say); act() acts on it once a round (tick), in order.
 */
#define _GNU_SOURCE
#include "cluster/cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/proc.h"
#include "cluster/chan.h"
#include "net/secret.h"
#include "supervisor/backend.h"

#define MAX_NODES 256
#define MAX_CHANS 1024       /* the ranks' streams of one launch (rk run's connections) */
#define LAUNCHED_WAIT_S 10.0 /* rank 0's agent answers LAUNCH within this */
#define AGENT_EXIT_WAIT_S 3.0
#define HEALTH_WAIT_S 10.0         /* the agents' first readings, before the first launch */
#define STACKS_RECV_MAX (64 << 10) /* bytes of one remote rank's stack dump */
/* The facts the callbacks record between two acts: past the FULL marks the node table hands
 * out no more messages that round (on_msg says it is full: the rest wait in their links); the
 * room above them is for the table's events (lines), which cannot wait. */
#define FACTS_MAX 1024
#define FACTS_FULL 512
#define FACT_BYTES_MAX (256 << 10)
#define FACT_BYTES_FULL (128 << 10)
#define FACT_LINE_MAX 1024 /* a line to say, with its NUL (>= RK_NODE_DATA_MAX) */

/* A rank's heartbeat stream relayed from its node: a socketpair whose other end the job reads
 * as a connection (sup_add_remote_conn). */
typedef struct chan {
    int node;    /* -1: a free entry */
    uint32_t id; /* the channel on the node's link */
    int relay;   /* our end, -1 once closed */
    int peer;    /* the job's end (its connection's fd) */
    /* its stacks asked of its agent (ask_stacks): the rank, bytes written so far, STACK_END */
    int stack_rank; /* -1: not asked */
    size_t stack_bytes;
    int stack_end;
} chan;

/* What a callback saw, for act(): take_facts acts on each, in the order they came. */
typedef enum fact_kind {
    FACT_SAY,      /* a line for the job's status (sup_say) */
    FACT_OPEN,     /* a rank's channel opened (open_chan) */
    FACT_DATA,     /* its bytes (relay_write) */
    FACT_CLOSE,    /* its stream ended */
    FACT_STACK,    /* bytes of its stack dump (sup_stack_append) */
    FACT_STACK_END /* the dump is complete */
} fact_kind;

typedef struct fact {
    fact_kind kind;
    int node;
    uint32_t chan;
    long pid;      /* OPEN: the rank's process */
    size_t off, n; /* DATA, STACK: the bytes in fact_bytes; SAY: the line, NUL included */
} fact;

/* The coordinator's state, all of it (the job's is the supervisor's: it reaches it only
 * through backend.h's services). The node table's callbacks (on_event, on_msg) record what
 * they saw here and call nothing outside it; act() acts on it once a round of the link, from
 * pump and the waits (and the ops that send, through take_facts). */
struct sup_cluster {
    const rk_sup_opts *o;
    struct sup *s; /* the job, from open on (NULL before) */
    rk_nodes *t;
    int watch; /* one mpirun (or srun) across the hosts starts the ranks; the agents watch */
    int srun;  /* in a Slurm allocation: srun starts the agents and the ranks */
    int nnodes;
    uint8_t job[RK_NET_JOB_ID_LEN];
    char job_hex[2 * RK_NET_JOB_ID_LEN + 1];
    char addr[RK_NODE_HOST_MAX + 16];  /* what the agents connect to */
    pid_t rsh[MAX_NODES];              /* the agent's rsh process, 0 none */
    double restart_at[MAX_NODES];      /* a node without an agent gets a new one then */
    double backoff[MAX_NODES];         /* ... and the wait after that one (doubling to 30 s) */
    rk_net_secret key;                 /* for the agents started later */
    rk_sup_dev node[MAX_NODES];        /* each node's failures and quarantine (policy.h) */
    int dev_node[RK_SUP_MAX_DEVICES];  /* device index -> node */
    int dev_local[RK_SUP_MAX_DEVICES]; /* ... its index on the node */
    /* this launch (start) */
    int launch_no, n;
    int dev[RK_SUP_MAX_DEVICES]; /* rank -> device index */
    int used[MAX_NODES];         /* the node runs ranks of this launch */
    int exited[MAX_NODES];       /* ... and said EXITED (or was lost) */
    int first_rank[MAX_NODES];
    int status;             /* the launch's status so far: the first failure's, else 0/4 */
    int ended;              /* every node in use ended: status is the launch's */
    int failed_rank;        /* the first EXITED's failed rank, -1 none; read once */
    int failure_seen;       /* a node ended with a failure: the others are being ended */
    int kill_due;           /* ... recorded by on_msg: act() ends the others' ranks */
    uint32_t launched_port; /* LAUNCHED from rank 0's node */
    int launched;
    chan chans[MAX_CHANS];
    int nchans;
    /* nodes of this launch lost: 1 recorded by on_event, 2 acted on by take_losses */
    int lost[MAX_NODES];
    double lost_silent[MAX_NODES]; /* ... seconds since its last frame */
    char lost_why[MAX_NODES][200]; /* ... and why, for the incident */
    int node_failed;               /* a node's loss is this launch's failure (sup_fail_node) */
    /* a failure of this launch weighed against the nodes (weigh_failure) */
    int probing; /* every node of the launch was asked (PING) at probed_at */
    double probed_at;
    uint64_t probe[MAX_NODES]; /* ... each node's probe number (rk_nodes_probe) */
    int decided;               /* the blame is known: a later loss changes no verdict */
    /* the agents' health readings (HEALTH), by device index; with --health only */
    struct dev_health {
        int have; /* a reading came */
        int sim;
        rk_sup_health h;
        char why[RK_NODE_VALUE_MAX + 1];
        int have_worst; /* the worst of the readings since the last look (health) */
        rk_sup_health worst;
        char worst_why[RK_NODE_VALUE_MAX + 1];
    } health[RK_SUP_MAX_DEVICES];
    /* the job's steps said to the agents (PROGRESS), for a fleet on the step clock */
    int64_t progress_sent;
    double progress_t;
    /* the facts the callbacks recorded, in order, acted on by take_facts (act's first and
     * last step); facts[fact_head..nfacts) not yet taken */
    fact facts[FACTS_MAX];
    int nfacts, fact_head;
    uint8_t fact_bytes[FACT_BYTES_MAX];
    size_t fact_used;
    int lines_dropped; /* lines that found no room: their count is said */
};

static void kill_ranks(sup_cluster *cl, double grace_s);
static int start_agent(sup_cluster *cl, int k, const rk_net_secret *key, rk_err *err);

/* ---- the facts recorded -----------------------------------------------------------------------
 */

/* Room for one more fact of n bytes: its entry, or NULL. */
static fact *fact_add(sup_cluster *cl, fact_kind kind, int k, size_t n)
{
    if (cl->nfacts >= FACTS_MAX || n > FACT_BYTES_MAX - cl->fact_used)
        return NULL;
    fact *f = &cl->facts[cl->nfacts++];
    *f = (fact){.kind = kind, .node = k, .off = cl->fact_used, .n = n};
    cl->fact_used += n;
    return f;
}

/* 1 when the messages of this round fill the queue: the node table holds back the rest. */
static int facts_full(const sup_cluster *cl)
{
    return cl->nfacts >= FACTS_FULL || cl->fact_used >= FACT_BYTES_FULL;
}

/* A line to say when the loop acts (counted, not kept, when there is no room for it). */
__attribute__((format(printf, 2, 3))) static void note(sup_cluster *cl, const char *fmt, ...)
{
    char line[FACT_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    fact *f = fact_add(cl, FACT_SAY, -1, len + 1);
    if (!f) {
        cl->lines_dropped++;
        return;
    }
    memcpy(cl->fact_bytes + f->off, line, len);
    cl->fact_bytes[f->off + len] = 0;
}

/* A channel's bytes (or its end, n = 0) from node k, to be relayed (FACT_DATA, FACT_STACK). */
static void note_bytes(sup_cluster *cl, fact_kind kind, int k, uint32_t id, const uint8_t *bytes,
                       size_t n)
{
    fact *f = fact_add(cl, kind, k, n);
    if (!f) /* never: on_msg said full before the queue was */
        return;
    f->chan = id;
    if (n)
        memcpy(cl->fact_bytes + f->off, bytes, n);
}

/* ---- the node table's callbacks: they record ----------------------------------------------- */

static int node_of_rank(const sup_cluster *cl, int r)
{
    return r >= 0 && r < cl->n ? cl->dev_node[cl->dev[r]] : -1;
}

static const char *node_name(const sup_cluster *cl, int k)
{
    return k >= 0 && k < cl->o->nhosts ? cl->o->hosts[k].name : "?";
}

/* The node table's events: said, and recorded (a node of the launch lost, for take_losses). */
static void on_event(void *ctx, const rk_node_event *e)
{
    sup_cluster *cl = ctx;
    int k = e->node;
    if (k >= 0 && k < cl->nnodes && e->kind != RK_NODE_JOINED && e->kind != RK_NODE_REFUSED &&
        e->kind != RK_NODE_HUSHED)
        for (int d = 0; d < cl->o->ndevices; d++) /* no reading from before counts again */
            if (cl->dev_node[d] == k)
                cl->health[d].have = 0;
    switch (e->kind) {
    case RK_NODE_JOINED:
    case RK_NODE_REJOINED:
    case RK_NODE_REBOOTED:
        note(cl, "node %d (%s) %s from %s", k, node_name(cl, k), rk_node_event_name(e->kind),
             e->from);
        return;
    case RK_NODE_RECONNECT: return;
    case RK_NODE_REFUSED:
        note(cl, "refused a node link from %s: %s", e->from, e->why ? e->why : "");
        return;
    case RK_NODE_HUSHED:
        note(cl,
             "refused %d more node-link connection%s that sent no HELLO in %g s (not logged one "
             "by one)",
             e->count, e->count == 1 ? "" : "s", RK_NODES_HUSH_S);
        return;
    case RK_NODE_LEFT:
    case RK_NODE_LOST: break;
    }
    note(cl, "node %d (%s) %s: %s", k, node_name(cl, k), rk_node_event_name(e->kind),
         e->why ? e->why : "");
    if (k < 0 || k >= cl->nnodes || !cl->used[k] || cl->lost[k])
        return;
    cl->lost[k] = 1;
    cl->lost_silent[k] = e->silent_s;
    snprintf(cl->lost_why[k], sizeof cl->lost_why[k], "%s", e->why ? e->why : "");
}

/* A HEALTH came for device d: fold it into the worst since the last look (an agent may send
 * two between two looks of the drain, and a dip in the first counts). */
static void note_worst(sup_cluster *cl, int d)
{
    struct dev_health *x = &cl->health[d];
    if (!x->have_worst) {
        x->worst = x->h;
        memcpy(x->worst_why, x->why, sizeof x->worst_why); /* both NUL-terminated */
        x->have_worst = 1;
        return;
    }
    x->worst.lost |= x->h.lost;
    if (x->h.prob > x->worst.prob)
        x->worst.prob = x->h.prob;
    if (x->h.score < x->worst.score) {
        x->worst.score = x->h.score;
        memcpy(x->worst_why, x->why, sizeof x->worst_why); /* both NUL-terminated */
    }
}

/* The channel (node, id) of this launch, its stream ended or not; `live`: only while open. */
static chan *chan_of(sup_cluster *cl, int node, uint32_t id, int live)
{
    for (int i = 0; i < cl->nchans; i++) {
        chan *x = &cl->chans[i];
        if (x->node == node && x->id == id && (!live || x->relay >= 0))
            return x;
    }
    return NULL;
}

/* Every channel closed (a new launch, or the launch's teardown): the job closes its ends. */
static void close_chans(sup_cluster *cl)
{
    for (int i = 0; i < cl->nchans; i++)
        if (cl->chans[i].relay >= 0) {
            close(cl->chans[i].relay);
            cl->chans[i].relay = -1;
        }
}

/* A rank's channel opened (an OPEN of this launch): a socketpair whose one end the job reads
 * as a connection. The agent checked the rank's process (SO_PEERCRED, its keeper's tree); the
 * link is authenticated, so its pid is believed. */
static void open_chan(sup_cluster *cl, int k, uint32_t id, long pid)
{
    chan *x = cl->nchans < MAX_CHANS ? &cl->chans[cl->nchans] : NULL;
    for (int i = 0; !x && i < cl->nchans; i++) /* full: one that ended, no stacks asked */
        if (cl->chans[i].relay < 0 && cl->chans[i].stack_rank < 0)
            x = &cl->chans[i];
    if (!x)
        return; /* as the job's table when it is full of ranks */
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sp) != 0) {
        sup_say(cl->s, "node %d: cannot relay a rank's heartbeats: %s", k, strerror(errno));
        return;
    }
    if (sup_add_remote_conn(cl->s, sp[0], k, id, pid) != 0) {
        close(sp[1]); /* sp[0] closed by the job */
        return;
    }
    if (x == &cl->chans[cl->nchans])
        cl->nchans++;
    *x = (chan){.node = k, .id = id, .relay = sp[1], .peer = sp[0], .stack_rank = -1};
}

/* Feed a remote rank's bytes to its socketpair (act: take_fact). The reader is the job's, in
 * this thread: when the pair is full, it reads that connection now (as a round would) and this
 * goes on, so a burst of lines is never cut into a closed stream. -1 only if the connection is
 * gone. */
static int relay_write(sup_cluster *cl, chan *x, const uint8_t *bytes, size_t n)
{
    for (int tries = 0; n > 0 && tries < 64; tries++) {
        ssize_t w = send(x->relay, bytes, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            bytes += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR) &&
                   sup_drain_conn(cl->s, x->peer) == 0) {
            continue; /* the pair's other end is open: its fd is still the connection's */
        } else {
            return -1;
        }
    }
    return n == 0 ? 0 : -1;
}

/* A message of the job from node k: the launch's state recorded (LAUNCHED, EXITED, HEALTH),
 * the rest a fact for act(). */
static void record(sup_cluster *cl, int k, uint8_t type, const uint8_t *payload, size_t len)
{
    rk_err e = {0};
    int ours = k >= 0 && k < cl->nnodes && cl->used[k]; /* a node of this launch */
    switch (type) {
    case RK_NODE_MSG_LAUNCHED: {
        rk_node_launched m;
        if (rk_node_launched_parse(payload, len, &m, &e) == RK_OK &&
            (int)m.launch == cl->launch_no + 1 && k == node_of_rank(cl, 0)) {
            cl->launched = 1;
            cl->launched_port = m.port;
        }
        return;
    }
    case RK_NODE_MSG_OPEN: {
        rk_node_open m;
        fact *f;
        if (rk_node_open_parse(payload, len, &m, &e) != RK_OK)
            note(cl, "node %d: a bad OPEN: %s", k, e.msg);
        else if ((int)m.launch == cl->launch_no + 1 && ours && /* not an earlier launch's */
                 (f = fact_add(cl, FACT_OPEN, k, 0))) {
            f->chan = m.chan;
            f->pid = (long)m.pid;
        }
        return;
    }
    case RK_NODE_MSG_DATA:
    case RK_NODE_MSG_CLOSE: {
        uint32_t id;
        const uint8_t *bytes;
        size_t n;
        int end = rk_node_chan_take(type, payload, len, &id, &bytes, &n, &e);
        if (end < 0)
            note(cl, "node %d: %s", k, e.msg);
        else if (ours)
            note_bytes(cl, end ? FACT_CLOSE : FACT_DATA, k, id, bytes, n);
        return;
    }
    case RK_NODE_MSG_STACK:
    case RK_NODE_MSG_STACK_END: {
        uint32_t id;
        const uint8_t *bytes;
        size_t n;
        int end = rk_node_chan_take(type, payload, len, &id, &bytes, &n, &e);
        if (end < 0)
            note(cl, "node %d: %s", k, e.msg);
        else if (ours)
            note_bytes(cl, end ? FACT_STACK_END : FACT_STACK, k, id, bytes, n);
        return;
    }
    case RK_NODE_MSG_HEALTH: {
        rk_node_health m;
        if (!cl->o->health)
            return; /* not asked for */
        if (rk_node_health_parse(payload, len, &m, &e)) {
            note(cl, "node %d: a bad HEALTH: %s", k, e.msg);
            return;
        }
        for (int d = 0; d < cl->o->ndevices; d++)
            if (cl->dev_node[d] == k && cl->dev_local[d] == (int)m.device) {
                cl->health[d].have = 1;
                cl->health[d].sim = (int)m.sim;
                cl->health[d].h =
                    (rk_sup_health){.lost = (int)m.lost,
                                    .score = (int)m.score,
                                    .prob = m.prob_ppm < 0 ? -1.0 : (double)m.prob_ppm / 1e6};
                snprintf(cl->health[d].why, sizeof cl->health[d].why, "%s", m.why);
                note_worst(cl, d);
                return;
            }
        note(cl, "node %d: a HEALTH for device %u, which the node does not have", k,
             (unsigned)m.device);
        return;
    }
    case RK_NODE_MSG_EXITED: {
        rk_node_exited m;
        if (rk_node_exited_parse(payload, len, &m, &e) || (int)m.launch != cl->launch_no + 1 ||
            k >= cl->nnodes || !cl->used[k] || cl->exited[k])
            return;
        cl->exited[k] = 1;
        int bad = m.status != RK_EXIT_OK && m.status != RK_EXIT_STOPPED;
        if (bad && !cl->failure_seen) {
            cl->failure_seen = 1;
            cl->status = (int)m.status;
            cl->failed_rank = (int)m.failed;
            cl->kill_due = 1; /* as the local keeper: the first failure ends every other rank */
        } else if (!cl->failure_seen && m.status == RK_EXIT_STOPPED) {
            cl->status = RK_EXIT_STOPPED;
        }
        return;
    }
    default: return;
    }
}

/* The node table's messages: recorded; full once this round's are as many as the queue takes
 * (the table then holds the rest back until the next round: nodes.h). */
static int on_msg(void *ctx, int k, uint8_t type, const uint8_t *payload, size_t len)
{
    sup_cluster *cl = ctx;
    record(cl, k, type, payload, len);
    return facts_full(cl);
}

/* ---- what the loop does with it: act ------------------------------------------------------ */

/* Act on one fact (its bytes copied out of the queue: the job's read inside relay_write may
 * take the queue on). */
static void take_fact(sup_cluster *cl, const fact *f, const uint8_t *bytes)
{
    chan *x;
    switch (f->kind) {
    case FACT_SAY: sup_say(cl->s, "%s", (const char *)bytes); return;
    case FACT_OPEN:
        if (cl->used[f->node]) /* still this launch's (a new one closed the channels) */
            open_chan(cl, f->node, f->chan, f->pid);
        return;
    case FACT_DATA:
    case FACT_CLOSE:
        if (!(x = chan_of(cl, f->node, f->chan, 1)))
            return;
        if (f->kind == FACT_CLOSE || relay_write(cl, x, bytes, f->n) != 0) {
            close(x->relay); /* the job reads the end of the stream */
            x->relay = -1;
        }
        return;
    case FACT_STACK:
    case FACT_STACK_END:
        x = chan_of(cl, f->node, f->chan, 0);
        if (!x || x->stack_rank < 0 || x->stack_end)
            return; /* not asked for, or done */
        if (f->kind == FACT_STACK_END) {
            x->stack_end = 1;
            return;
        }
        if (x->stack_bytes + f->n > STACKS_RECV_MAX)
            return;
        long w = sup_stack_append(cl->s, x->stack_rank, bytes, f->n);
        if (w > 0)
            x->stack_bytes += (size_t)w;
        return;
    }
}

/* Act on the facts recorded, in the order they came, and empty the queue. */
static void take_facts(sup_cluster *cl)
{
    uint8_t bytes[FACT_LINE_MAX];
    while (cl->fact_head < cl->nfacts) {
        fact f = cl->facts[cl->fact_head++];
        memcpy(bytes, cl->fact_bytes + f.off, f.n); /* f.n <= FACT_LINE_MAX */
        take_fact(cl, &f, bytes);
    }
    cl->nfacts = cl->fact_head = 0;
    cl->fact_used = 0;
    if (cl->lines_dropped) {
        sup_say(cl->s, "%d more node-link line%s not shown (more than fit in one round)",
                cl->lines_dropped, cl->lines_dropped == 1 ? "" : "s");
        cl->lines_dropped = 0;
    }
}

/* --slurm-drain: the quarantined node drained in Slurm, with the reason (its mark "rk run: "
 * is not rk doctor --slurm's, which therefore never resumes it: docs/slurm.md). */
static void drain_node(sup_cluster *cl, int k, const char *why)
{
    char reason[256];
    const char *sj = getenv("SLURM_JOB_ID"); /* the id an administrator can look up */
    snprintf(reason, sizeof reason, "rk run: node lost %d time%s in %s %.20s: %.150s",
             cl->node[k].fails, cl->node[k].fails == 1 ? "" : "s", sj ? "Slurm job" : "job",
             sj ? sj : cl->job_hex, why && why[0] ? why : "no reason given");
    rk_err e = {0};
    const char *exe = cl->o->scontrol ? cl->o->scontrol : "scontrol";
    char held[256];
    int st = rk_slurm_node_held(exe, node_name(cl, k), held, sizeof held, &e);
    if (st == 1) { /* an administrator's drain (or Slurm's own hold) is not overwritten */
        sup_say(cl->s, "node %d (%s): --slurm-drain: already %s: left as it is", k,
                node_name(cl, k), held);
        return;
    }
    if (st < 0 || rk_slurm_drain(exe, node_name(cl, k), reason, &e))
        sup_say(cl->s, "node %d (%s): --slurm-drain: %s", k, node_name(cl, k), e.msg);
    else
        sup_say(cl->s, "node %d (%s) drained in Slurm: %s", k, node_name(cl, k), reason);
}

/* Node k's loss is the launch's failure (the first of the launch, its blame not yet known):
 * node_lost, counted towards the node's quarantine (policy.h's rule, as a device's). */
static void node_failure(sup_cluster *cl, int k)
{
    if (cl->decided || cl->node_failed)
        return;
    char what[512];
    snprintf(what, sizeof what, "node %d (%s) lost after %.1f s of silence: %s", k,
             node_name(cl, k), cl->lost_silent[k], cl->lost_why[k]);
    sup_fail_node(cl->s, k, cl->first_rank[k], node_name(cl, k), what);
    cl->node_failed = 1;
    cl->decided = 1;
    if (!rk_sup_count_failure(&cl->node[k], cl->o->failure_threshold))
        return;
    for (int d = 0; d < cl->o->ndevices; d++) /* a node's devices go with it */
        if (cl->dev_node[d] == k)
            sup_quarantine_device(cl->s, d);
    sup_record(cl->s, "quarantine", -1, node_name(cl, k), "quarantine",
               "node %d (%s) quarantined after %d failure%s", k, node_name(cl, k),
               cl->node[k].fails, cl->node[k].fails == 1 ? "" : "s");
    sup_say(cl->s, "node %d (%s) quarantined after %d failure%s", k, node_name(cl, k),
            cl->node[k].fails, cl->node[k].fails == 1 ? "" : "s");
    if (cl->o->slurm_drain)
        drain_node(cl, k, cl->lost_why[k]);
}

/* The nodes of the launch that on_event saw lost: their ranks are gone, so the others' ranks,
 * waiting in a collective for them, are ended now (their EXITED ends the launch); the first
 * loss whose launch's blame is not known yet is the launch's failure. */
static void take_losses(sup_cluster *cl)
{
    for (int k = 0; k < cl->nnodes; k++) {
        if (cl->lost[k] != 1)
            continue;
        cl->lost[k] = 2;
        if (!cl->exited[k]) {
            cl->exited[k] = 1;
            kill_ranks(cl, 0);
        }
        node_failure(cl, k);
    }
}

/* Once the nodes were asked (probe_nodes), their answers are weighed (rk_sup_node_blame)
 * until the blame is known. */
static void weigh_failure(sup_cluster *cl)
{
    if (cl->decided || !cl->probing)
        return;
    if (cl->node_failed) { /* a node's loss is the failure itself */
        cl->decided = 1;
        return;
    }
    rk_sup_link link[MAX_NODES];
    for (int k = 0; k < cl->nnodes; k++) {
        if (!cl->used[k])
            link[k] = RK_SUP_LINK_OUT;
        else if (cl->lost[k] || !rk_nodes_connected(cl->t, k))
            link[k] = RK_SUP_LINK_LOST;
        else if (cl->probe[k] > 0 && rk_nodes_answered(cl->t, k) >= cl->probe[k])
            link[k] = RK_SUP_LINK_ALIVE;
        else
            link[k] = RK_SUP_LINK_ASKED;
    }
    int node;
    rk_sup_blame b = rk_sup_node_blame(cl->nnodes, link, rk_mono_s(), cl->probed_at,
                                       cl->o->node_timeout_s + 1.0, &node);
    if (b == RK_SUP_BLAME_NODE) {
        if (!cl->lost[node]) { /* not connected, and no event said so (never in practice) */
            cl->lost[node] = 2;
            snprintf(cl->lost_why[node], sizeof cl->lost_why[node], "its link is gone");
        }
        node_failure(cl, node);
    }
    if (b != RK_SUP_BLAME_WAIT)
        cl->decided = 1;
}

/* Ask every node of the launch whether it is alive (once a failure was seen). */
static void probe_nodes(sup_cluster *cl)
{
    if (cl->probing || cl->decided || cl->node_failed)
        return;
    cl->probing = 1;
    cl->probed_at = rk_mono_s();
    for (int k = 0; k < cl->nnodes; k++)
        if (cl->used[k] && !cl->lost[k])
            cl->probe[k] = rk_nodes_probe(cl->t, k); /* 0: not connected, lost (recorded) */
}

/* Reap agents' rsh processes that ended (an agent that exits is a node gone), and start a
 * new agent for a node that has none and is not connected (its host rebooted, its agent
 * died), with backoff: a new generation for the node, so the new process's frames count
 * from 1 and the old one's are refused. It may run ranks again from the next launch. */
static void reap_agents(sup_cluster *cl)
{
    double now = rk_mono_s();
    for (int k = 0; k < cl->nnodes; k++) {
        int st;
        if (cl->rsh[k] > 0) {
            pid_t r = waitpid(cl->rsh[k], &st, WNOHANG);
            if (r == cl->rsh[k] || (r < 0 && errno == ECHILD)) {
                cl->rsh[k] = 0;
                if (cl->backoff[k] < 1)
                    cl->backoff[k] = 1;
                cl->restart_at[k] = now + cl->backoff[k];
            }
            continue;
        }
        if (cl->node[k].quarantined || rk_nodes_connected(cl->t, k) || now < cl->restart_at[k] ||
            rk_sup_interrupted || !rk_nodes_host(cl->t, k)) /* never joined: never up */
            continue;
        rk_nodes_renew(cl->t, k, rk_nodes_generation(cl->t, k) + 1);
        rk_err e = {0};
        if (start_agent(cl, k, &cl->key, &e))
            sup_say(cl->s, "node %d (%s): cannot start a new agent: %s", k, node_name(cl, k),
                    e.msg);
        else
            sup_say(cl->s, "node %d (%s): its agent is gone; started a new one (generation %u)", k,
                    node_name(cl, k), (unsigned)rk_nodes_generation(cl->t, k));
        cl->backoff[k] = cl->backoff[k] * 2 > 30 ? 30 : cl->backoff[k] * 2;
        cl->restart_at[k] = now + cl->backoff[k];
    }
}

/* A channel's sends to its node (chan.h's rk_node_send_fn). */
typedef struct to_node {
    sup_cluster *cl;
    int k;
} to_node;

static int send_to_node(void *ctx, uint8_t type, const void *payload, size_t len)
{
    const to_node *to = ctx;
    rk_err e = {0};
    return rk_nodes_send(to->cl->t, to->k, type, payload, len, &e) == RK_OK ? 0 : -1;
}

/* Relay what the job wrote to remote ranks (commands) to their agents; a stream the job
 * closed ends its channel. */
static void relay_back(sup_cluster *cl)
{
    for (int i = 0; i < cl->nchans; i++) {
        chan *x = &cl->chans[i];
        to_node to = {cl, x->node};
        for (int k = 0; k < 8 && x->relay >= 0; k++) {
            int r = rk_node_chan_forward(x->relay, x->id, send_to_node, &to);
            if (r == 0)
                break;
            if (r < 0) { /* the job closed it: the channel ends */
                rk_node_chan_send(x->id, RK_NODE_MSG_CLOSE, NULL, 0, send_to_node, &to);
                close(x->relay);
                x->relay = -1;
            }
        }
    }
}

/* The job's steps to every connected agent whose simulated fleet ages with them
 * (--sim-step-time): when they changed, at most 10 times a second, and every second anyway
 * (an agent that came back hears it). */
static void send_progress(sup_cluster *cl)
{
    const rk_sup_opts *o = cl->o;
    if (!o->health || strcmp(o->health, "sim") != 0 || !(o->sim_step_s > 0))
        return;
    int64_t steps = sup_steps_done(cl->s);
    double now = rk_mono_s();
    if (now - cl->progress_t < (steps > cl->progress_sent ? 0.1 : 1.0))
        return;
    rk_node_progress m = {.steps = steps};
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    if (rk_node_progress_format(&m, out, sizeof out, &len, &e))
        return;
    for (int k = 0; k < cl->nnodes; k++)
        if (rk_nodes_connected(cl->t, k))
            (void)rk_nodes_send(cl->t, k, RK_NODE_MSG_PROGRESS, out, len,
                                &e); /* a failed
                                      * send is the node's loss, seen there */
    cl->progress_sent = steps;
    cl->progress_t = now;
}

/* What the callbacks recorded, acted on once a round: the facts (lines, channels, bytes), the
 * first failure's end of the other nodes' ranks, the nodes lost, the blame. */
static void act(sup_cluster *cl)
{
    take_facts(cl);
    if (cl->kill_due) { /* as the local keeper: the first failure ends every other rank */
        cl->kill_due = 0;
        kill_ranks(cl, 0);
    }
    send_progress(cl);
    relay_back(cl);
    reap_agents(cl);
    take_losses(cl);
    if (sup_failing(cl->s))
        probe_nodes(cl);
    take_losses(cl); /* a probe that could not be sent: its node is lost */
    weigh_failure(cl);
    take_facts(cl); /* what the sends above saw (a node lost): said now */
}

/* One round of the link: read it (waiting up to wait_s; the callbacks record), then act. */
static void tick(sup_cluster *cl, double wait_s)
{
    rk_err e = {0};
    if (rk_nodes_poll(cl->t, wait_s, &e))
        sup_say(cl->s, "node link: %s", e.msg);
    act(cl);
}

/* ---- a launch ---------------------------------------------------------------------------- */

static int send_launch(sup_cluster *cl, int k, uint32_t port, const char *done, rk_err *err)
{
    rk_node_launch m = {.launch = (uint32_t)cl->launch_no + 1,
                        .world = (uint32_t)cl->n,
                        .base = (uint32_t)cl->first_rank[k],
                        .port = port,
                        .watch = (uint32_t)cl->watch};
    int nr = 0;
    size_t used = 0;
    for (int r = 0; r < cl->n; r++)
        if (node_of_rank(cl, r) == k) {
            used += (size_t)snprintf(m.devices + used,
                                     used < sizeof m.devices ? sizeof m.devices - used : 0,
                                     nr ? ",%d" : "%d", cl->dev_local[cl->dev[r]]);
            nr++;
        }
    m.ranks = (uint32_t)nr;
    snprintf(m.master, sizeof m.master, "%s", node_name(cl, node_of_rank(cl, 0)));
    snprintf(m.done, sizeof m.done, "%s", done);
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    int rc = rk_node_launch_format(&m, out, sizeof out, &len, err);
    if (!rc)
        rc = rk_nodes_send(cl->t, k, RK_NODE_MSG_LAUNCH, out, len, err);
    return rc;
}

/* LAUNCH to every node in use (rank 0's first: its agent picks MASTER_PORT, said in
 * LAUNCHED); with one mpirun or srun across the hosts, the agents watch and the launcher of
 * this host starts the ranks. */
static int start(void *ctx, const rk_sup_launch *l, rk_err *err)
{
    sup_cluster *cl = ctx;
    cl->launch_no = l->no;
    cl->n = l->n < RK_SUP_MAX_DEVICES ? l->n : RK_SUP_MAX_DEVICES;
    memcpy(cl->dev, l->dev, (size_t)cl->n * sizeof cl->dev[0]);
    close_chans(cl);
    cl->nchans = 0;
    memset(cl->used, 0, sizeof cl->used);
    memset(cl->exited, 0, sizeof cl->exited);
    cl->status = RK_EXIT_OK;
    cl->ended = 0;
    cl->failed_rank = -1;
    cl->failure_seen = cl->kill_due = 0;
    cl->launched = 0;
    memset(cl->lost, 0, sizeof cl->lost);
    memset(cl->probe, 0, sizeof cl->probe);
    cl->probing = cl->decided = cl->node_failed = 0;
    for (int r = cl->n - 1; r >= 0; r--) { /* ranks of a node are consecutive (the pick's order) */
        int k = node_of_rank(cl, r);
        cl->used[k] = 1;
        cl->first_rank[k] = r;
    }
    int k0 = node_of_rank(cl, 0);
    if (cl->watch) { /* the agents watch; the launcher here starts the ranks across the hosts */
        int rc = RK_OK;
        for (int k = 0; !rc && k < cl->nnodes; k++)
            if (cl->used[k])
                rc = send_launch(cl, k, 0, l->done, err);
        take_facts(cl); /* a node lost on a send says so */
        return rc ? rc : sup_launcher_start(cl->s, err);
    }
    int rc = send_launch(cl, k0, 0, l->done, err);
    double until = rk_mono_s() + LAUNCHED_WAIT_S;
    while (!rc && !cl->launched && !cl->exited[k0] && rk_mono_s() < until)
        tick(cl, 0.05);
    if (!rc && !cl->launched) /* the launch fails, and is judged as one (its EXITED, a loss) */
        sup_fail(cl->s, "node %d (%s) did not start rank 0 within %g s", k0, node_name(cl, k0),
                 LAUNCHED_WAIT_S);
    for (int k = 0; !rc && k < cl->nnodes; k++)
        if (cl->used[k] && k != k0)
            rc = send_launch(cl, k, cl->launched_port, l->done, err);
    take_facts(cl);
    return rc;
}

/* 1 once every node in use said EXITED or was lost: cl->status is then the launch's. */
static int nodes_ended(sup_cluster *cl)
{
    if (cl->ended)
        return 1;
    for (int k = 0; k < cl->nnodes; k++)
        if (cl->used[k] && !cl->exited[k])
            return 0;
    cl->ended = 1;
    return 1;
}

static int poll_launch(void *ctx, int *code)
{
    sup_cluster *cl = ctx;
    if (cl->watch) /* mpirun's (srun's) end is the launch's */
        return sup_launcher_poll(cl->s, code);
    if (!nodes_ended(cl))
        return 0;
    *code = cl->status & 0xff;
    return 1;
}

static int failed_rank(void *ctx)
{
    sup_cluster *cl = ctx;
    if (cl->watch)
        return sup_launcher_failed_rank(cl->s);
    int r = cl->failed_rank;
    cl->failed_rank = -1;
    return r;
}

/* KILL to every node in use that has not ended, without waiting. */
static void kill_ranks(sup_cluster *cl, double grace_s)
{
    if (!cl->t)
        return;
    rk_node_kill m = {.launch = (uint32_t)cl->launch_no + 1, .grace_s = grace_s};
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    if (rk_node_kill_format(&m, out, sizeof out, &len, &e))
        return;
    for (int k = 0; k < cl->nnodes; k++)
        if (cl->used[k] && !cl->exited[k] &&
            rk_nodes_send(cl->t, k, RK_NODE_MSG_KILL, out, len, &e))
            cl->exited[k] = 1; /* not connected: its ranks end with its link (agent.c) */
}

/* KILL to every node in use, then wait up to grace_s + a few seconds for their EXITED; with
 * the launcher here, the agents end what they watch at once and the launcher is killed. */
static void kill_launch(void *ctx, double grace_s)
{
    sup_cluster *cl = ctx;
    if (!cl->s || !cl->t)
        return; /* not open */
    if (cl->watch) {
        kill_ranks(cl, 0);
        take_facts(cl);
        sup_launcher_kill(cl->s, grace_s);
        close_chans(cl);
        return;
    }
    kill_ranks(cl, grace_s);
    double until = rk_mono_s() + grace_s + AGENT_EXIT_WAIT_S;
    while (!nodes_ended(cl) && rk_mono_s() < until)
        tick(cl, 0.05);
    for (int k = 0; k < cl->nnodes; k++)
        if (cl->used[k] && !cl->exited[k]) {
            sup_say(cl->s, "node %d (%s): its ranks did not end within %g s of KILL", k,
                    node_name(cl, k), grace_s + AGENT_EXIT_WAIT_S);
            cl->exited[k] = 1;
        }
    nodes_ended(cl);
    take_facts(cl);
    close_chans(cl);
}

static void pump(void *ctx, double wait_s)
{
    tick(ctx, wait_s);
}

/* Before the launch's failure is blamed on a device: wait until every node of the launch
 * answered after it, or one is lost (then the cause: sup_fail_node), at most the node timeout
 * and a second. */
static void blame(void *ctx)
{
    sup_cluster *cl = ctx;
    take_losses(cl);
    probe_nodes(cl); /* already done if a failure was seen; else from the launcher's exit */
    take_losses(cl);
    weigh_failure(cl);
    take_facts(cl);
    while (!cl->decided && !cl->node_failed && !rk_sup_interrupted)
        tick(cl, 0.05);
}

static int ask_stacks(void *ctx, int node, uint32_t id, int rank)
{
    sup_cluster *cl = ctx;
    chan *x = chan_of(cl, node, id, 0);
    if (cl->watch || !x || rank < 0) /* one mpirun's ranks are not the agents' to signal */
        return -1;
    rk_node_stacks m = {.launch = (uint32_t)cl->launch_no + 1, .chan = id, .rank = (uint32_t)rank};
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    if (rk_node_stacks_format(&m, out, sizeof out, &len, &e) ||
        rk_nodes_send(cl->t, node, RK_NODE_MSG_STACKS, out, len, &e)) {
        take_facts(cl); /* the node lost on the send says so */
        return -1;
    }
    x->stack_rank = rank;
    x->stack_bytes = 0;
    x->stack_end = 0;
    return 0;
}

static int stacks_done(void *ctx, int node, uint32_t id)
{
    chan *x = chan_of(ctx, node, id, 0);
    return !x || x->stack_end;
}

/* ---- where the ranks go ------------------------------------------------------------------ */

static const char *socket_name(void *ctx, char *buf, size_t cap)
{
    sup_cluster *cl = ctx;
    snprintf(buf, cap, "@rk-%s%s", cl->job_hex, cl->srun ? "-{node}" : "");
    return buf;
}

static const char *host_list(void *ctx, char *buf, size_t cap)
{
    sup_cluster *cl = ctx;
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < cl->n;) {
        int k = node_of_rank(cl, r), n = 0;
        while (r < cl->n && node_of_rank(cl, r) == k)
            r++, n++;
        used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s%s:%d",
                                 used ? "," : "", node_name(cl, k), n);
    }
    return buf;
}

static const char *master(void *ctx)
{
    sup_cluster *cl = ctx;
    int k = node_of_rank(cl, 0);
    return k >= 0 && k < cl->o->nhosts && cl->o->hosts[k].addr ? cl->o->hosts[k].addr
                                                               : node_name(cl, k);
}

static int srun_hosts(void *ctx, const char *hostfile, char *excl, size_t cap, rk_err *err)
{
    sup_cluster *cl = ctx;
    FILE *f = fopen(hostfile, "we");
    if (!f)
        return rk_err_set(err, RK_EIO, "cannot create %s: %s", hostfile, strerror(errno));
    for (int r = 0; r < cl->n; r++) /* rank r on the r-th line: srun's arbitrary distribution */
        fprintf(f, "%s\n", node_name(cl, node_of_rank(cl, r)));
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return rk_err_set(err, RK_EIO, "cannot write %s", hostfile);
    size_t xu = 0;
    int nn = 0;
    excl[0] = '\0';
    for (int k = 0; k < cl->nnodes; k++) {
        /* a node out of this launch that is lost or quarantined: left out by name too */
        int out = cl->node[k].quarantined || !rk_nodes_connected(cl->t, k);
        if (cl->used[k])
            nn++;
        else if (out && xu < cap)
            xu += (size_t)snprintf(excl + xu, cap - xu, "%s%s", xu ? "," : "", node_name(cl, k));
    }
    if (xu >= cap)
        return rk_err_set(err, RK_EINVAL, "the list of nodes left out is too long");
    return nn;
}

/* ---- the devices' hosts ------------------------------------------------------------------ */

static int node_up(void *ctx, int d)
{
    sup_cluster *cl = ctx;
    int k = cl->dev_node[d];
    return rk_nodes_connected(cl->t, k) && !cl->node[k].quarantined;
}

static const char *dev_node_name(void *ctx, int d)
{
    sup_cluster *cl = ctx;
    return node_name(cl, cl->dev_node[d]);
}

static int health(void *ctx, int d, int worst, rk_sup_health *h, char *why, size_t cap)
{
    sup_cluster *cl = ctx;
    if (!cl->o->health)
        return 0;
    *h = (rk_sup_health){.score = 100, .prob = -1.0};
    why[0] = 0;
    if (worst && cl->health[d].have_worst) {
        *h = cl->health[d].worst;
        snprintf(why, cap, "%s", cl->health[d].worst_why);
    } else if (cl->health[d].have) {
        *h = cl->health[d].h;
        snprintf(why, cap, "%s", cl->health[d].why);
    }
    if (worst)
        cl->health[d].have_worst = 0;
    return 1;
}

static int health_sim(void *ctx, int d)
{
    sup_cluster *cl = ctx;
    return cl->health[d].have && cl->health[d].sim;
}

/* ---- starting the agents, the cluster's life --------------------------------------------- */

/* `arg` as the next word of the remote shell's command line (ssh joins the words into one). */
#define MAX_WORDS 4096
#define RK_HOST_ARG_MAX 300 /* "--nodelist=" and a host name */
/* the agent's words as they are, for srun's argv (copies: some are a block's locals) */
static const char *words_raw[MAX_WORDS];
static char words_pool[65536];
static size_t pool_used;
static int nwords;

/* Append arg to the command line in buf, quoted for the remote shell, and keep it as a word
 * (a word that does not fit makes the line too long: the caller's check refuses it). */
static size_t put_word(char *buf, size_t used, size_t cap, const char *arg)
{
    size_t l = strlen(arg) + 1;
    if (nwords < MAX_WORDS && pool_used + l <= sizeof words_pool) {
        memcpy(words_pool + pool_used, arg, l);
        words_raw[nwords++] = words_pool + pool_used;
        pool_used += l;
    } else {
        used = cap; /* too long either way */
    }
    used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s", used ? " " : "");
    return rk_launch_quote(buf, used, cap, arg);
}

/* Start node k's agent: RSH HOST 'AGENT agent --coordinator ... -- WORKER...', the secret
 * on its stdin (under Slurm: srun ... AGENT agent ...). */
static int start_agent(sup_cluster *cl, int k, const rk_net_secret *key, rk_err *err)
{
    const rk_sup_opts *o = cl->o;
    static char cmd[65536];
    char node[16], gen[16];
    snprintf(node, sizeof node, "%d", k);
    snprintf(gen, sizeof gen, "%u", (unsigned)rk_nodes_generation(cl->t, k));
    size_t used = 0;
    cmd[0] = 0;
    nwords = 0;
    pool_used = 0;
    used = put_word(cmd, used, sizeof cmd, o->agent_cmd ? o->agent_cmd : rk_launch_self_exe());
    const char *words[] = {"agent",    "--coordinator", cl->addr,       "--node", node,
                           "--job-id", cl->job_hex,     "--generation", gen};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        used = put_word(cmd, used, sizeof cmd, words[i]);
    if (o->health) { /* the agent reads its GPUs; a simulated fleet spans the hosts */
        char num[32];
        snprintf(num, sizeof num, "%d", o->hosts[k].slots);
        used = put_word(cmd, used, sizeof cmd, "--devices");
        used = put_word(cmd, used, sizeof cmd, num);
        used = put_word(cmd, used, sizeof cmd, "--health");
        used = put_word(cmd, used, sizeof cmd, o->health);
        snprintf(num, sizeof num, "%.17g", o->health_interval_s);
        used = put_word(cmd, used, sizeof cmd, "--health-interval");
        used = put_word(cmd, used, sizeof cmd, num);
        if (o->predictor) {
            used = put_word(cmd, used, sizeof cmd, "--predictor");
            used = put_word(cmd, used, sizeof cmd, o->predictor);
        }
        if (!strcmp(o->health, "sim")) {
            int first = 0;
            for (int d = 0; d < o->ndevices; d++)
                if (cl->dev_node[d] == k) {
                    first = d;
                    break;
                }
            /* every agent simulates the whole fleet (its GPUs' profiles are drawn in order)
             * and reads its own slots of it */
            const char *flag[] = {"--sim-first",
                                  "--sim-gpus",
                                  "--sim-seed",
                                  "--sim-age",
                                  o->sim_step_s > 0 ? "--sim-step-time" : "--sim-time-scale",
                                  "--sim-skip"};
            char val[6][32];
            snprintf(val[0], sizeof val[0], "%d", first);
            snprintf(val[1], sizeof val[1], "%d", o->ndevices);
            snprintf(val[2], sizeof val[2], "%llu", (unsigned long long)o->health_seed);
            snprintf(val[3], sizeof val[3], "%.17g", o->health_age_h);
            snprintf(val[4], sizeof val[4], "%.17g",
                     o->sim_step_s > 0 ? o->sim_step_s : o->health_time_scale);
            snprintf(val[5], sizeof val[5], "%.17g", o->sim_skip_h);
            for (int i = 0; i < 6; i++) {
                used = put_word(cmd, used, sizeof cmd, flag[i]);
                used = put_word(cmd, used, sizeof cmd, val[i]);
            }
            used = put_word(cmd, used, sizeof cmd, "--sim-load");
            used = put_word(cmd, used, sizeof cmd,
                            o->health_sim_load == RK_SIM_LOAD_BUSY ? "busy" : "idle");
            if (o->health_sim_sensors)
                used = put_word(cmd, used, sizeof cmd, "--sim-sensors");
        }
    }
    if (cl->watch) { /* no worker: mpirun starts the ranks, the agent watches them */
        used = put_word(cmd, used, sizeof cmd, "--watch");
        if (cl->srun) { /* the hosts may share one network namespace: a socket a node */
            used = put_word(cmd, used, sizeof cmd, "--socket-node");
            used = put_word(cmd, used, sizeof cmd, o->hosts[k].name);
        }
        goto argv;
    }
    if (o->ckpt_dir) {
        used = put_word(cmd, used, sizeof cmd, "--ckpt-dir");
        used = put_word(cmd, used, sizeof cmd, o->ckpt_dir);
    }
    if (o->inject) {
        used = put_word(cmd, used, sizeof cmd, "--inject");
        used = put_word(cmd, used, sizeof cmd, o->inject);
    }
    if (o->no_pythonpath)
        used = put_word(cmd, used, sizeof cmd, "--no-pythonpath");
    used = put_word(cmd, used, sizeof cmd, "--");
    for (int i = 0; o->worker[i]; i++)
        used = put_word(cmd, used, sizeof cmd, o->worker[i]);
argv:
    if (used >= sizeof cmd)
        return rk_err_set(err, RK_EINVAL, "the agent's command line is too long");
    /* argv: the words of --rsh, the host, the command line; or srun's, then the words */
    char rsh[4096], nodearg[RK_HOST_ARG_MAX], namearg[RK_HOST_ARG_MAX];
    snprintf(rsh, sizeof rsh, "%s", o->rsh ? o->rsh : "ssh -o BatchMode=yes");
    static const char *argv[MAX_WORDS + 16];
    int a = 0;
    if (cl->srun) {
        /* one task on the node, sharing its CPUs with the ranks' step (--overlap), not ended
         * when another node of the allocation fails */
        snprintf(nodearg, sizeof nodearg, "--nodelist=%s", o->hosts[k].name);
        snprintf(namearg, sizeof namearg, "--job-name=rk-agent-%s", o->hosts[k].name);
        const char *sw[] = {"srun",   "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                            nodearg,  namearg,     "--overlap",  "--kill-on-bad-exit=0",
                            "--quiet"};
        for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
            argv[a++] = sw[i];
        for (int i = 0; i < nwords; i++)
            argv[a++] = words_raw[i];
    } else {
        for (char *save = NULL, *w = strtok_r(rsh, " \t", &save); w && a < 64;
             w = strtok_r(NULL, " \t", &save))
            argv[a++] = w;
        if (a == 0)
            return rk_err_set(err, RK_EINVAL, "--rsh is empty");
        argv[a++] = o->hosts[k].name;
        argv[a++] = cmd;
    }
    argv[a] = NULL;
    int in[2];
    if (pipe2(in, O_CLOEXEC) != 0)
        return rk_err_set(err, RK_EIO, "pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]);
        close(in[1]);
        return rk_err_set(err, RK_EIO, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        dup2(in[0], STDIN_FILENO);
        setpgid(0, 0); /* a terminal's ^C goes to rk run, which ends the job in order */
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* the agent goes with rk run */
        rk_proc_cloexec_from(3); /* the rsh and the agent get stdin (the secret), out, err */
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "rk run: cannot run %s%s: %s\n", cl->srun ? "" : "--rsh ", argv[0],
                strerror(errno));
        _exit(127);
    }
    close(in[0]);
    char hex[RK_NET_SECRET_HEX_LEN + 2];
    rk_net_secret_hex(key, hex);
    size_t hl = strlen(hex);
    ssize_t w = write(in[1], hex, hl);
    memset(hex, 0, sizeof hex);
    close(in[1]);
    if (w != (ssize_t)hl)
        sup_say(cl->s, "node %d (%s): could not hand the secret to the agent", k, o->hosts[k].name);
    cl->rsh[k] = pid;
    rk_launch_spare(pid); /* a launch's teardown leaves the agents be */
    return RK_OK;
}

static int open_cluster(void *ctx, struct sup *s, rk_err *err)
{
    sup_cluster *cl = ctx;
    const rk_sup_opts *o = cl->o;
    cl->s = s;
    if (o->nhosts < 1 || o->nhosts > MAX_NODES)
        return rk_err_set(err, RK_EINVAL, "1 to %d hosts", MAX_NODES);
    cl->nnodes = o->nhosts;
    cl->srun = o->launcher == RK_LAUNCH_SRUN;
    cl->watch = o->launcher == RK_LAUNCH_MPIRUN || cl->srun;
    /* the devices are the hosts' slots in order ("h1:0", "h1:1", "h2:0", ...) */
    int d = 0;
    for (int k = 0; k < o->nhosts; k++)
        for (int i = 0; i < o->hosts[k].slots && d < RK_SUP_MAX_DEVICES; i++, d++) {
            cl->dev_node[d] = k;
            cl->dev_local[d] = i;
        }
    if (d != o->ndevices)
        return rk_err_set(err, RK_EINVAL, "the devices are not the hosts' slots");
    rk_net_secret key;
    int rc = rk_net_secret_generate(&key, err);
    if (rc)
        return rc;
    rk_net_secret job;
    if ((rc = rk_net_secret_generate(&job, err))) /* 32 random bytes: the job id is 16 */
        return rc;
    memcpy(cl->job, job.key, RK_NET_JOB_ID_LEN);
    rk_net_secret_wipe(&job);
    for (int i = 0; i < RK_NET_JOB_ID_LEN; i++)
        snprintf(cl->job_hex + 2 * i, 3, "%02x", cl->job[i]);
    char host[RK_NODE_HOST_MAX];
    uint16_t port;
    if ((rc = rk_cluster_listen_parse(o->listen, host, sizeof host, &port, err)))
        goto out;
    rk_nodes_opts no = {.listen_host = host,
                        .listen_port = port,
                        .nodes = o->nhosts,
                        .generation = 1,
                        .timeout_s = o->node_timeout_s,
                        .on_event = on_event,
                        .on_msg = on_msg,
                        .ctx = cl};
    memcpy(no.job, cl->job, sizeof no.job);
    if ((rc = rk_nodes_open(&cl->t, &no, &key, err))) {
        if (strstr(err->msg, "assign requested address")) /* not an address of this host */
            rc = rk_err_set(err, RK_EINVAL, "--listen %s: not an address of this host", o->listen);
        goto out;
    }
    cl->key = key;
    if (strchr(host, ':'))
        snprintf(cl->addr, sizeof cl->addr, "[%s]:%u", host, (unsigned)rk_nodes_port(cl->t));
    else
        snprintf(cl->addr, sizeof cl->addr, "%s:%u", host, (unsigned)rk_nodes_port(cl->t));
    sup_say(cl->s, "coordinator listening on %s for %d host%s (node timeout %g s)", cl->addr,
            o->nhosts, o->nhosts == 1 ? "" : "s", o->node_timeout_s);
    for (int k = 0; k < o->nhosts; k++)
        if ((rc = start_agent(cl, k, &key, err)))
            goto out;
    /* every agent joins, or its --rsh ends first, or the startup timeout passes (the missing
     * ones are down) */
    double until = rk_mono_s() + o->startup_timeout_s;
    int rsh_status[MAX_NODES], missing = 0, unrunnable = 0;
    for (int k = 0; k < o->nhosts; k++)
        rsh_status[k] = -1;
    for (;;) {
        int waiting = 0;
        for (int k = 0; k < o->nhosts; k++) {
            int st;
            if (cl->rsh[k] > 0 && !rk_nodes_connected(cl->t, k) &&
                waitpid(cl->rsh[k], &st, WNOHANG) == cl->rsh[k]) {
                cl->rsh[k] = 0;
                rsh_status[k] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            }
            waiting += !rk_nodes_connected(cl->t, k) && cl->rsh[k] > 0;
        }
        if (!waiting || rk_mono_s() >= until || rk_sup_interrupted)
            break;
        rc = rk_nodes_poll(cl->t, 0.1, err);
        take_facts(cl); /* no launch yet: what the nodes said */
        if (rc)
            goto out;
    }
    if (rk_sup_interrupted)
        goto out;
    for (int k = 0; k < o->nhosts; k++) {
        if (rk_nodes_connected(cl->t, k))
            continue;
        missing++;
        if (rsh_status[k] >= 0) {
            unrunnable += rsh_status[k] == 127;
            sup_say(cl->s,
                    "node %d (%s): its agent did not start: the --rsh command exited with "
                    "status %d (its words are above); its devices are left out",
                    k, o->hosts[k].name, rsh_status[k]);
        } else {
            sup_say(cl->s,
                    "node %d (%s): no agent joined within %g s (--startup-timeout); its devices "
                    "are left out",
                    k, o->hosts[k].name, o->startup_timeout_s);
        }
    }
    if (missing == o->nhosts && unrunnable == o->nhosts) {
        rc = rk_err_set(err, RK_ENOENT, "--rsh '%s' cannot be run (exit status 127 on every host)",
                        o->rsh ? o->rsh : "ssh -o BatchMode=yes");
        goto out;
    }
    if (o->health) { /* the first launch is picked on readings: wait for the nodes' first */
        sup_say(cl->s,
                "health gate: each host's agent reads its GPUs (%s%s), threshold %.0f, every "
                "%.1f s",
                o->health, !strcmp(o->health, "sim") ? ", simulated" : "", o->health_threshold,
                o->health_interval_s);
        double health_until = rk_mono_s() + HEALTH_WAIT_S;
        while (rk_mono_s() < health_until && !rk_sup_interrupted) {
            int waiting = 0;
            for (int e = 0; e < o->ndevices; e++)
                waiting += rk_nodes_connected(cl->t, cl->dev_node[e]) && !cl->health[e].have;
            if (!waiting)
                break;
            rc = rk_nodes_poll(cl->t, 0.1, err);
            take_facts(cl);
            if (rc)
                goto out;
        }
        for (int e = 0; e < o->ndevices; e++)
            if (rk_nodes_connected(cl->t, cl->dev_node[e]) && !cl->health[e].have)
                sup_say(cl->s,
                        "health gate: no reading of device %s within %g s (its agent's "
                        "words are above); taken as sound until one comes",
                        o->devices[e], HEALTH_WAIT_S);
    }
out:
    rk_net_secret_wipe(&key);
    return rc;
}
static void close_cluster(void *ctx)
{
    sup_cluster *cl = ctx;
    close_chans(cl);
    if (cl->t)
        rk_nodes_bye(cl->t, "the job is over");
    take_facts(cl); /* the refusals' count said at the end */
    double until = rk_mono_s() + AGENT_EXIT_WAIT_S;
    for (int k = 0; k < cl->nnodes; k++) {
        while (cl->rsh[k] > 0) {
            int st;
            pid_t r = waitpid(cl->rsh[k], &st, WNOHANG);
            if (r == cl->rsh[k] || (r < 0 && errno == ECHILD)) {
                cl->rsh[k] = 0;
                break;
            }
            if (rk_mono_s() > until) { /* our own child, by the pid fork gave us */
                kill(cl->rsh[k], SIGKILL);
                waitpid(cl->rsh[k], &st, 0);
                cl->rsh[k] = 0;
                break;
            }
            poll(NULL, 0, 20);
        }
    }
    rk_nodes_free(cl->t);
    cl->t = NULL;
    rk_net_secret_wipe(&cl->key);
}

static const rk_sup_backend_ops cluster_ops = {.name = "cluster",
                                               .open = open_cluster,
                                               .close = close_cluster,
                                               .start = start,
                                               .poll = poll_launch,
                                               .failed_rank = failed_rank,
                                               .kill = kill_launch,
                                               .pump = pump,
                                               .blame = blame,
                                               .ask_stacks = ask_stacks,
                                               .stacks_done = stacks_done,
                                               .socket = socket_name,
                                               .host_list = host_list,
                                               .master = master,
                                               .srun_hosts = srun_hosts,
                                               .node_up = node_up,
                                               .node_name = dev_node_name,
                                               .health = health,
                                               .health_sim = health_sim};

void rk_cluster_run(const rk_sup_opts *o, rk_sup_report *rep)
{
    sup_cluster *cl = calloc(1, sizeof *cl);
    if (!cl) {
        memset(rep, 0, sizeof *rep);
        rep->end = RK_SUP_END_FAILED;
        rk_err_set(&rep->err, RK_ENOMEM, "out of memory");
        rep->outcome = "failed";
        return;
    }
    cl->o = o;
    rk_sup_backend b = {&cluster_ops, cl};
    rk_sup_run_with(o, &b, rep);
    free(cl);
}
