/*
 * The coordinator's side of the node link (coord.h): the node table's callbacks record what
 * they saw (the launch's state, and a bounded queue of facts), and coord_take_facts acts on
 * the facts once a round, in order: a rank's channel opened as the job's connection (a
 * socketpair), its bytes written into it, a stack dump's appended, a line said. The channels
 * back to the agents (the job's commands) are relayed here too (chan.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/chan.h"
#include "cluster/coord.h"

#define STACKS_RECV_MAX (64 << 10) /* bytes of one remote rank's stack dump */

/* ---- the facts recorded ------------------------------------------------------------------- */

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

/* A line to say when the loop acts (counted, not kept, when there is no room for it and one
 * message more: the table hands one out before it hears the queue is full). */
__attribute__((format(printf, 2, 3))) static void note(sup_cluster *cl, const char *fmt, ...)
{
    char line[FACT_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    fact *f =
        cl->nfacts + 1 < FACTS_MAX && len + 1 + FACT_LINE_MAX <= FACT_BYTES_MAX - cl->fact_used
            ? fact_add(cl, FACT_SAY, -1, len + 1)
            : NULL;
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
    if (!f) /* never: on_msg said full before the queue was, and lines leave room for one */
        return;
    f->chan = id;
    if (n)
        memcpy(cl->fact_bytes + f->off, bytes, n);
}

/* ---- the node table's callbacks: they record ----------------------------------------------- */

/* The node table's events: said, and recorded (a node of the launch lost, for take_losses). */
void coord_on_event(void *ctx, const rk_node_event *e)
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

chan *coord_chan_of(sup_cluster *cl, int node, uint32_t id, int live)
{
    for (int i = 0; i < cl->nchans; i++) {
        chan *x = &cl->chans[i];
        if (x->node == node && x->id == id && (!live || x->relay >= 0))
            return x;
    }
    return NULL;
}

void coord_close_chans(sup_cluster *cl)
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
    case RK_NODE_MSG_DATA: /* a rank's stream, or a stack dump: a channel's bytes or end */
    case RK_NODE_MSG_CLOSE:
    case RK_NODE_MSG_STACK:
    case RK_NODE_MSG_STACK_END: {
        uint32_t id;
        const uint8_t *bytes;
        size_t n;
        int end = rk_node_chan_take(type, payload, len, &id, &bytes, &n, &e);
        int stack = type == RK_NODE_MSG_STACK || type == RK_NODE_MSG_STACK_END;
        if (end < 0)
            note(cl, "node %d: %s", k, e.msg);
        else if (ours)
            note_bytes(cl,
                       stack ? (end ? FACT_STACK_END : FACT_STACK) : (end ? FACT_CLOSE : FACT_DATA),
                       k, id, bytes, n);
        return;
    }
    case RK_NODE_MSG_SNAP_BEGIN: /* partner copies: relayed in order (partners.c) */
    case RK_NODE_MSG_SNAP_DATA:
    case RK_NODE_MSG_SNAP_END:
    case RK_NODE_MSG_SNAP_HELD: {
        fact *f = cl->partner_every != 0 ? fact_add(cl, FACT_SNAP, k, len) : NULL;
        if (f) {
            f->chan = type;
            memcpy(cl->fact_bytes + f->off, payload, len);
        }
        return;
    }
    case RK_NODE_MSG_SNAP_MEM: { /* the node's snapshot memory (gauge.c reads it) */
        rk_node_snap_mem m;
        if (k < 0 || k >= MAX_NODES)
            return;
        if (rk_node_snap_mem_parse(payload, len, &m, &e)) {
            note(cl, "node %d: a bad SNAP_MEM: %s", k, e.msg);
            return;
        }
        struct node_mem *g = &cl->mem[k];
        g->have = 1;
        g->own = m.own;
        g->held = m.held;
        g->own_peak = m.own > g->own_peak ? m.own : g->own_peak;
        g->held_peak = m.held > g->held_peak ? m.held : g->held_peak;
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
int coord_on_msg(void *ctx, int k, uint8_t type, const uint8_t *payload, size_t len)
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
        if (!(x = coord_chan_of(cl, f->node, f->chan, 1)))
            return;
        if (f->kind == FACT_CLOSE || relay_write(cl, x, bytes, f->n) != 0) {
            close(x->relay); /* the job reads the end of the stream */
            x->relay = -1;
        }
        return;
    case FACT_SNAP: return; /* coord_take_facts */
    case FACT_STACK:
    case FACT_STACK_END:
        x = coord_chan_of(cl, f->node, f->chan, 0);
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

void coord_take_facts(sup_cluster *cl)
{
    uint8_t bytes[FACT_LINE_MAX];
    while (cl->fact_head < cl->nfacts) {
        fact f = cl->facts[cl->fact_head++];
        if (f.kind == FACT_SNAP) { /* up to a frame's bytes, read in place: what it adds to the
                                    * queue (a line) goes after them */
            coord_snap_take(cl, f.node, (uint8_t)f.chan, cl->fact_bytes + f.off, f.n);
            continue;
        }
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

void coord_relay_back(sup_cluster *cl)
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
