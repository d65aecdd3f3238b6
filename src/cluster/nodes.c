/*
 * The coordinator's table of nodes (cluster/nodes.h): one listening socket, a fixed array
 * of connections (nodes + RK_NODES_PENDING_MAX, each with a stream reader allocated while it
 * is open), one net/peer.h state per node for the life of the table. Every frame is opened
 * and checked through src/net; a refusal is one event (those of connections without a node
 * rate-limited by base/hush.h) and the connection closed. A caller that is full for the round
 * (on_msg) holds back the frames still to hand out: they wait in their reader (`held`), or in
 * the socket, and go first at the next poll, from a connection that turns each time. poll(2)
 * only, no thread; times from base/clock.h.
 */
#include "cluster/nodes.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "base/clock.h"
#include "base/hush.h"
#include "base/msg.h"
#include "net/peer.h"
#include "net/sock.h"
#include "net/stream.h"

typedef enum node_state { NODE_NEVER, NODE_UP, NODE_LOST, NODE_LEFT } node_state;

typedef struct conn {
    int fd;        /* -1: a free slot */
    int node;      /* -1 until an authenticated HELLO */
    double opened; /* when accepted */
    rk_net_reader *r;
    bool held; /* to read in this poll; past it, its frames wait for the next (caller full) */
    char from[RK_NET_ADDR_MAX];
} conn;

typedef struct node {
    rk_net_peer peer;
    node_state state;
    int conn;                  /* its connection's slot, -1 none */
    double last;               /* the last authenticated frame (rk_mono_s) */
    uint64_t probes, answered; /* PINGs sent to ask if it is alive; PONGs that answered */
    char host[RK_NODE_HOST_MAX];
    char boot_id[RK_NODE_BOOT_ID_LEN + 1];
    char snap[RK_NODE_VALUE_MAX + 1]; /* its HELLO's snapshot directory, "" none */
} nodeinfo;

struct rk_nodes {
    rk_nodes_opts o;
    rk_net_secret key;
    int lfd;
    uint16_t port;
    int nconns;
    conn *conns;
    nodeinfo *nodes;
    struct pollfd *pfd;
    int *pfd_conn;    /* the slot of each pfd entry after the listener */
    rk_hush refusals; /* REFUSED events of connections without a node: a few, then a count */
    double window_s;  /* ... a window */
    bool full;        /* on_msg said the caller takes no more this poll */
    int turn;         /* the held connection that goes first at the next poll */
};

static void emit(rk_nodes *t, rk_node_event_kind kind, int node, const char *from, double silent_s,
                 const char *host, const char *why)
{
    if (!t->o.on_event)
        return;
    rk_node_event e = {.kind = kind, .node = node, .silent_s = silent_s, .host = host, .why = why};
    rk_msg_show(e.from, sizeof e.from, from ? from : "?");
    t->o.on_event(t->o.ctx, &e);
}

static void conn_close(rk_nodes *t, int ci)
{
    conn *c = &t->conns[ci];
    if (c->fd >= 0)
        close(c->fd);
    free(c->r);
    if (c->node >= 0 && t->nodes[c->node].conn == ci)
        t->nodes[c->node].conn = -1;
    c->fd = -1;
    c->node = -1;
    c->r = NULL;
    c->held = false;
}

/* Node `k` is lost: one event, its connection closed. */
static void node_lose(rk_nodes *t, int k, const char *why)
{
    nodeinfo *n = &t->nodes[k];
    char from[RK_NET_ADDR_MAX] = "?";
    if (n->conn >= 0) {
        memcpy(from, t->conns[n->conn].from, sizeof from);
        conn_close(t, n->conn);
    }
    n->state = NODE_LOST;
    emit(t, RK_NODE_LOST, k, from, rk_mono_s() - n->last, n->host, why);
}

/* The refusals held back in a window that ended (`all`: in the current one too): one HUSHED
 * event with their count. */
static void say_hushed(rk_nodes *t, bool all)
{
    double now = all ? t->refusals.since + t->window_s : rk_mono_s();
    int n = rk_hush_due(&t->refusals, now, t->window_s);
    if (n <= 0 || !t->o.on_event)
        return;
    rk_node_event e = {.kind = RK_NODE_HUSHED, .node = -1, .count = n};
    snprintf(e.from, sizeof e.from, "?");
    t->o.on_event(t->o.ctx, &e);
}

/* A refusal's event: one a connection of a node; those without one (anyone who reaches the
 * port can cause them) a few a window, then counted. */
static void emit_refused(rk_nodes *t, int k, const char *from, const char *why)
{
    say_hushed(t, false);
    if (k >= 0 || rk_hush_pass(&t->refusals, rk_mono_s(), RK_NODES_HUSH_N, t->window_s))
        emit(t, RK_NODE_REFUSED, k, from, 0, NULL, why);
}

/* A connection refused: one event naming the peer and why, the connection closed. A node it
 * was attached to is lost with it. */
static void conn_refuse(rk_nodes *t, int ci, const char *why)
{
    conn *c = &t->conns[ci];
    int k = c->node;
    emit_refused(t, k, c->from, why);
    if (k >= 0 && t->nodes[k].conn == ci)
        node_lose(t, k, "its connection was closed after a refused frame");
    else
        conn_close(t, ci);
}

/* Seal and send one message with `p`'s counters; false (and *err) when the link is gone. */
static bool send_msg(rk_nodes *t, rk_net_peer *p, int ci, uint8_t type, const char *payload,
                     size_t len, rk_err *err)
{
    return rk_net_peer_send(p, &t->key, t->conns[ci].fd, type, payload, len, t->conns[ci].from,
                            err) == RK_OK;
}

/* REFUSED with `reason` to a connection, then the refusal's event and close. `p` seals it
 * (a node's own peer, or a scratch one for a node index this job does not have). */
static void refuse_with(rk_nodes *t, rk_net_peer *p, int ci, const char *reason)
{
    rk_err e = {0};
    rk_node_send_reason(p, &t->key, t->conns[ci].fd, RK_NODE_MSG_REFUSED, reason, t->conns[ci].from,
                        &e);
    conn_refuse(t, ci, reason);
}

/* The first frame of a connection: it must be an authenticated HELLO of a node of this job. */
static void on_first(rk_nodes *t, int ci, const rk_net_hdr *h, const uint8_t *payload)
{
    conn *c = &t->conns[ci];
    char why[RK_ERR_MSG_MAX + 64];
    rk_err e = {0};
    if (memcmp(h->job, t->o.job, RK_NET_JOB_ID_LEN) != 0) {
        snprintf(why, sizeof why, "frame of another job from %s", c->from);
        conn_refuse(t, ci, why);
        return;
    }
    if (h->sender >= (uint32_t)t->o.nodes) {
        rk_net_peer scratch;
        rk_net_peer_init(&scratch, t->o.job, RK_NET_COORDINATOR, h->sender, t->o.generation, false);
        if (h->sender == RK_NET_COORDINATOR)
            snprintf(why, sizeof why, "a frame from %s claims to be from the coordinator", c->from);
        else
            snprintf(why, sizeof why, "node %u is not in this job (%d nodes: 0..%d)",
                     (unsigned)h->sender, t->o.nodes, t->o.nodes - 1);
        refuse_with(t, &scratch, ci, why);
        return;
    }
    int k = (int)h->sender;
    nodeinfo *n = &t->nodes[k];
    if (rk_net_peer_accept(&n->peer, h, c->from, &e)) {
        conn_refuse(t, ci, e.msg);
        return;
    }
    if (h->type != RK_NODE_MSG_HELLO) {
        snprintf(why, sizeof why, "the first frame from %s is %s, not HELLO", c->from,
                 rk_node_msg_name(h->type));
        conn_refuse(t, ci, why);
        return;
    }
    rk_node_hello hello;
    if (rk_node_hello_parse(payload, h->len, &hello, &e) || hello.node != h->sender) {
        if (!e.msg[0])
            snprintf(e.msg, sizeof e.msg, "hello: node %u in a frame from node %u",
                     (unsigned)hello.node, (unsigned)h->sender);
        refuse_with(t, &n->peer, ci, e.msg);
        return;
    }
    rk_node_event_kind kind = RK_NODE_JOINED;
    if (n->state == NODE_UP) {
        kind = RK_NODE_RECONNECT;
        if (n->conn >= 0)
            conn_close(t, n->conn);
    } else if (n->state == NODE_LOST || n->state == NODE_LEFT) {
        kind = rk_node_return_kind(n->boot_id, hello.boot_id);
    }
    c->node = k;
    n->conn = ci;
    n->state = NODE_UP;
    n->last = rk_mono_s();
    n->answered = n->probes; /* its agent spoke since: probes of an earlier connection too */
    memcpy(n->host, hello.host, sizeof n->host);
    memcpy(n->boot_id, hello.boot_id, sizeof n->boot_id);
    memcpy(n->snap, hello.snap, sizeof n->snap);
    rk_node_welcome w = {
        .node = (uint32_t)k, .generation = n->peer.generation, .timeout_s = t->o.timeout_s};
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    if (rk_node_welcome_format(&w, out, sizeof out, &len, &e) ||
        !send_msg(t, &n->peer, ci, RK_NODE_MSG_WELCOME, out, len, &e)) {
        emit(t, kind, k, c->from, 0, n->host, NULL);
        node_lose(t, k, e.msg);
        return;
    }
    emit(t, kind, k, c->from, 0, n->host, NULL);
}

/* A frame on a node's connection. */
static void on_frame(rk_nodes *t, int ci, const rk_net_hdr *h, const uint8_t *payload)
{
    conn *c = &t->conns[ci];
    int k = c->node;
    nodeinfo *n = &t->nodes[k];
    rk_err e = {0};
    char why[RK_ERR_MSG_MAX + 64];
    if (rk_net_peer_accept(&n->peer, h, c->from, &e)) {
        conn_refuse(t, ci, e.msg);
        return;
    }
    n->last = rk_mono_s();
    switch (h->type) {
    case RK_NODE_MSG_PING:
        if (!send_msg(t, &n->peer, ci, RK_NODE_MSG_PONG, NULL, 0, &e))
            node_lose(t, k, e.msg);
        return;
    case RK_NODE_MSG_PONG: /* the answer to a probe (in order: one PONG a PING) */
        if (n->answered < n->probes)
            n->answered++;
        return;
    case RK_NODE_MSG_BYE: {
        rk_node_reason r;
        if (rk_node_reason_parse(payload, h->len, &r, &e))
            snprintf(r.reason, sizeof r.reason, "(no reason)");
        conn_close(t, ci);
        n->state = NODE_LEFT;
        emit(t, RK_NODE_LEFT, k, c->from, 0, n->host, r.reason);
        return;
    }
    case RK_NODE_MSG_LAUNCHED:
    case RK_NODE_MSG_OPEN:
    case RK_NODE_MSG_DATA:
    case RK_NODE_MSG_CLOSE:
    case RK_NODE_MSG_EXITED:
    case RK_NODE_MSG_HEALTH:
    case RK_NODE_MSG_STACK:
    case RK_NODE_MSG_STACK_END:
    case RK_NODE_MSG_SNAP_BEGIN:
    case RK_NODE_MSG_SNAP_DATA:
    case RK_NODE_MSG_SNAP_END:
    case RK_NODE_MSG_SNAP_HELD:
    case RK_NODE_MSG_SNAP_MEM:
        if (t->o.on_msg) { /* the job's messages: the caller's (cluster/cluster.c) */
            if (t->o.on_msg(t->o.ctx, k, h->type, payload, h->len))
                t->full = true; /* the caller takes no more this poll */
            return;
        }
        /* fall through */
    default:
        snprintf(why, sizeof why, "unexpected %s from node %d at %s", rk_node_msg_name(h->type), k,
                 c->from);
        conn_refuse(t, ci, why);
    }
}

int64_t rk_nodes_room(const rk_nodes *t, int k)
{
    if (k < 0 || k >= t->o.nodes || t->nodes[k].state != NODE_UP || t->nodes[k].conn < 0)
        return 0;
    int fd = t->conns[t->nodes[k].conn].fd, queued = 0, buf = 0;
    socklen_t len = sizeof buf;
    if (ioctl(fd, SIOCOUTQ, &queued) != 0 || getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, &len) != 0)
        return 0;
    return buf / 2 > queued ? (int64_t)buf / 2 - queued : 0; /* the kernel doubles SO_SNDBUF for its
                                                              * bookkeeping: half is for data */
}

uint64_t rk_nodes_probe(rk_nodes *t, int k)
{
    rk_err e = {0};
    if (rk_nodes_send(t, k, RK_NODE_MSG_PING, NULL, 0, &e))
        return 0;
    return ++t->nodes[k].probes;
}

uint64_t rk_nodes_answered(const rk_nodes *t, int k)
{
    return k >= 0 && k < t->o.nodes ? t->nodes[k].answered : 0;
}

int rk_nodes_send(rk_nodes *t, int k, uint8_t type, const void *payload, size_t len, rk_err *err)
{
    if (k < 0 || k >= t->o.nodes || t->nodes[k].state != NODE_UP || t->nodes[k].conn < 0)
        return rk_err_set(err, RK_ECOMM, "node %d is not connected", k);
    nodeinfo *n = &t->nodes[k];
    if (!send_msg(t, &n->peer, n->conn, type, payload, len, err)) {
        char why[RK_ERR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err->msg);
        node_lose(t, k, why);
        return RK_ECOMM;
    }
    return RK_OK;
}

void rk_nodes_renew(rk_nodes *t, int k, uint32_t generation)
{
    if (k < 0 || k >= t->o.nodes || generation <= t->nodes[k].peer.generation)
        return;
    nodeinfo *n = &t->nodes[k];
    if (n->conn >= 0) /* the earlier process's connection, if any, goes with its generation */
        conn_close(t, n->conn);
    rk_net_peer_set_generation(&n->peer, generation);
}

uint32_t rk_nodes_generation(const rk_nodes *t, int k)
{
    return k >= 0 && k < t->o.nodes ? t->nodes[k].peer.generation : 0;
}

const char *rk_nodes_snap(const rk_nodes *t, int k)
{
    return k >= 0 && k < t->o.nodes && t->nodes[k].state != NODE_NEVER && t->nodes[k].snap[0]
               ? t->nodes[k].snap
               : NULL;
}

const char *rk_nodes_host(const rk_nodes *t, int k)
{
    return k >= 0 && k < t->o.nodes && t->nodes[k].state != NODE_NEVER ? t->nodes[k].host : NULL;
}

/* Hand out the whole frames connection ci's reader holds while the caller takes them: 0 once
 * it needs more bytes, 1 when the caller is full, or the reader's failure. */
static int hand_out(rk_nodes *t, int ci, rk_err *err)
{
    conn *c = &t->conns[ci];
    rk_net_hdr h;
    const uint8_t *payload;
    int rc = 0;
    while (c->fd >= 0 && !t->full &&
           (rc = rk_net_reader_next(c->r, &t->key, &h, &payload, err)) == 1) {
        if (c->node < 0)
            on_first(t, ci, &h, payload);
        else
            on_frame(t, ci, &h, payload);
    }
    return rc;
}

/* Hand out what a connection's reader holds from the last poll, then read its socket and hand
 * out what came; once the caller is full, what is left waits (held, in the reader or the
 * socket) for the next poll. */
static void on_readable(rk_nodes *t, int ci)
{
    conn *c = &t->conns[ci];
    rk_err e = {0};
    if (t->full) {
        c->held = true;
        return;
    }
    c->held = false;
    int rc = hand_out(t, ci, &e); /* a peer that closed after them: its last frames go first */
    if (rc == 0 && c->fd >= 0 && !t->full) {
        rc = rk_net_reader_fill(c->r, c->fd, &e);
        if (rc >= 0)
            rc = hand_out(t, ci, &e);
    }
    if (c->fd < 0)
        return;
    if (rc >= 0) {
        c->held = t->full;
        return;
    }
    /* the reader failed: closed, garbage, too big, or a wrong tag */
    if (c->node >= 0 && rc == RK_NET_ECLOSED)
        node_lose(t, c->node, e.msg);
    else
        conn_refuse(t, ci, e.msg);
}

/* The connections without a node yet: their count; a free slot into *free_slot (-1 none) and
 * the one to close when there are too many into *victim: the oldest of those that sent
 * nothing, else the oldest. */
static int count_pending(const rk_nodes *t, int *free_slot, int *victim)
{
    int pending = 0, oldest = -1, oldest_silent = -1;
    *free_slot = -1;
    for (int i = 0; i < t->nconns; i++) {
        const conn *c = &t->conns[i];
        if (c->fd < 0) {
            if (*free_slot < 0)
                *free_slot = i;
        } else if (c->node < 0) {
            pending++;
            if (oldest < 0 || c->opened < t->conns[oldest].opened)
                oldest = i;
            if (c->r->have == 0 &&
                (oldest_silent < 0 || c->opened < t->conns[oldest_silent].opened))
                oldest_silent = i;
        }
    }
    *victim = oldest_silent >= 0 ? oldest_silent : oldest;
    return pending;
}

static void accept_all(rk_nodes *t)
{
    for (;;) {
        int fd;
        char from[RK_NET_ADDR_MAX];
        rk_err e = {0};
        int rc = rk_net_accept(t->lfd, &fd, from, &e);
        if (rc <= 0)
            return; /* none waiting, or a failed accept (EMFILE...): tried again next poll */
        int free_slot, victim;
        if (count_pending(t, &free_slot, &victim) >= RK_NODES_PENDING_MAX) {
            /* one too many: first read what the pending ones sent (an agent's HELLO that has
             * arrived makes it a node; a connection closed meanwhile frees its slot) */
            for (int i = 0; i < t->nconns; i++)
                if (t->conns[i].fd >= 0 && t->conns[i].node < 0)
                    on_readable(t, i);
            if (count_pending(t, &free_slot, &victim) >= RK_NODES_PENDING_MAX) {
                conn_refuse(t, victim,
                            t->conns[victim].r->have == 0
                                ? "too many connections without a HELLO: the oldest silent one "
                                  "closed"
                                : "too many connections without a HELLO: the oldest closed");
                free_slot = victim;
            }
        }
        rk_net_reader *r = free_slot >= 0 ? malloc(sizeof *r) : NULL;
        if (!r) {
            close(fd);
            emit_refused(t, -1, from, "no room for another connection");
            continue;
        }
        rk_net_reader_init(r, from);
        /* a bounded receive queue: what an agent sends (partner copies among its ranks'
         * heartbeats) waits in its own socket, where it stops sending copies, not here */
        int rb = RK_NODES_RCVBUF, sb = RK_NODES_SNDBUF;
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rb, sizeof rb);
        /* a fixed send buffer (not grown by the kernel as it goes): what rk_nodes_room says
         * is what a send takes without waiting */
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
        conn *c = &t->conns[free_slot];
        c->fd = fd;
        c->node = -1;
        c->opened = rk_mono_s();
        c->r = r;
        memcpy(c->from, from, sizeof c->from);
    }
}

/* Lost nodes (silent for the timeout), pending connections past the HELLO timeout, and the
 * count of the refusals held back when their window ends. A connection whose frames are held
 * back is not silent: they are here, and go first at the next poll. */
static void check_times(rk_nodes *t)
{
    double now = rk_mono_s();
    char why[96];
    say_hushed(t, false);
    for (int k = 0; k < t->o.nodes; k++) {
        nodeinfo *n = &t->nodes[k];
        if (n->state == NODE_UP && !(n->conn >= 0 && t->conns[n->conn].held) &&
            now - n->last >= t->o.timeout_s) {
            snprintf(why, sizeof why, "silent for %.1f s (the node timeout is %g s)", now - n->last,
                     t->o.timeout_s);
            node_lose(t, k, why);
        }
    }
    for (int i = 0; i < t->nconns; i++)
        if (t->conns[i].fd >= 0 && t->conns[i].node < 0 && !t->conns[i].held &&
            now - t->conns[i].opened >= RK_NODES_HELLO_TIMEOUT_S) {
            snprintf(why, sizeof why, "no HELLO from %s within %g s", t->conns[i].from,
                     RK_NODES_HELLO_TIMEOUT_S);
            conn_refuse(t, i, why);
        }
}

/* Seconds until the next deadline of check_times (at most `cap`). */
static double next_deadline(const rk_nodes *t, double cap)
{
    double now = rk_mono_s(), wait = cap;
    for (int k = 0; k < t->o.nodes; k++)
        if (t->nodes[k].state == NODE_UP && t->nodes[k].last + t->o.timeout_s - now < wait)
            wait = t->nodes[k].last + t->o.timeout_s - now;
    for (int i = 0; i < t->nconns; i++)
        if (t->conns[i].fd >= 0 && t->conns[i].node < 0 &&
            t->conns[i].opened + RK_NODES_HELLO_TIMEOUT_S - now < wait)
            wait = t->conns[i].opened + RK_NODES_HELLO_TIMEOUT_S - now;
    double hushed = rk_hush_wait(&t->refusals, now, t->window_s);
    if (hushed >= 0 && hushed < wait)
        wait = hushed;
    return wait > 0 ? wait : 0;
}

int rk_nodes_poll(rk_nodes *t, double timeout_s, rk_err *err)
{
    t->full = false; /* the caller acted on what it took */
    bool held = false;
    int np = 0;
    t->pfd[np++] = (struct pollfd){.fd = t->lfd, .events = POLLIN};
    for (int i = 0; i < t->nconns; i++)
        if (t->conns[i].fd >= 0) {
            t->pfd_conn[np] = i;
            t->pfd[np++] = (struct pollfd){.fd = t->conns[i].fd, .events = POLLIN};
            held |= t->conns[i].held;
        }
    double wait = held ? 0 : next_deadline(t, timeout_s > 0 ? timeout_s : 0);
    int rc = poll(t->pfd, (nfds_t)np, (int)(wait * 1000 + 0.999));
    if (rc < 0 && errno != EINTR) {
        char e[96];
        return rk_err_set(err, RK_EIO, "poll: %s", rk_msg_strerror(errno, e, sizeof e));
    }
    for (int j = 1; rc > 0 && j < np; j++)
        if (t->pfd[j].revents && t->conns[t->pfd_conn[j]].fd == t->pfd[j].fd)
            t->conns[t->pfd_conn[j]].held = true; /* to read */
    /* every connection with something to read or hand out, from one that turns: after one
     * that filled the caller, the next goes first, so no node's flood keeps another waiting */
    int cut = -1;
    for (int j = 0; j < t->nconns; j++) {
        int i = (t->turn + j) % t->nconns;
        if (t->conns[i].fd < 0 || !t->conns[i].held)
            continue;
        bool was_full = t->full;
        on_readable(t, i);
        if (!was_full && t->full)
            cut = i;
    }
    if (cut >= 0)
        t->turn = (cut + 1) % t->nconns;
    if (rc > 0 && (t->pfd[0].revents & POLLIN))
        accept_all(t);
    check_times(t);
    return RK_OK;
}

int rk_nodes_open(rk_nodes **out, const rk_nodes_opts *o, const rk_net_secret *key, rk_err *err)
{
    *out = NULL;
    if (o->nodes < 1 || o->nodes > RK_NODES_MAX || o->generation < 1 || !(o->timeout_s > 0))
        return rk_err_set(err, RK_EINVAL, "nodes: 1..%d nodes, a generation >= 1 and a timeout",
                          RK_NODES_MAX);
    rk_nodes *t = calloc(1, sizeof *t);
    if (!t)
        return rk_err_set(err, RK_ENOMEM, "nodes: out of memory");
    t->o = *o;
    t->key = *key;
    t->lfd = -1;
    t->window_s = o->refusals_window_s > 0 ? o->refusals_window_s : RK_NODES_HUSH_S;
    t->nconns = o->nodes + RK_NODES_PENDING_MAX;
    t->conns = calloc((size_t)t->nconns, sizeof *t->conns);
    t->nodes = calloc((size_t)o->nodes, sizeof *t->nodes);
    t->pfd = calloc((size_t)t->nconns + 1, sizeof *t->pfd);
    t->pfd_conn = calloc((size_t)t->nconns + 1, sizeof *t->pfd_conn);
    if (!t->conns || !t->nodes || !t->pfd || !t->pfd_conn) {
        rk_nodes_free(t);
        return rk_err_set(err, RK_ENOMEM, "nodes: out of memory");
    }
    for (int i = 0; i < t->nconns; i++) {
        t->conns[i].fd = -1;
        t->conns[i].node = -1;
    }
    for (int k = 0; k < o->nodes; k++) {
        rk_net_peer_init(&t->nodes[k].peer, o->job, RK_NET_COORDINATOR, (uint32_t)k, o->generation,
                         false);
        t->nodes[k].conn = -1;
    }
    int rc = rk_net_listen(o->listen_host, o->listen_port, &t->lfd, err);
    if (rc) {
        rk_nodes_free(t);
        return rc;
    }
    t->port = rk_net_local_port(t->lfd);
    *out = t;
    return RK_OK;
}

uint16_t rk_nodes_port(const rk_nodes *t)
{
    return t->port;
}

bool rk_nodes_connected(const rk_nodes *t, int i)
{
    return i >= 0 && i < t->o.nodes && t->nodes[i].state == NODE_UP;
}

double rk_nodes_silent_s(const rk_nodes *t, int i)
{
    if (i < 0 || i >= t->o.nodes || t->nodes[i].state == NODE_NEVER)
        return -1;
    return rk_mono_s() - t->nodes[i].last;
}

int rk_nodes_count_connected(const rk_nodes *t)
{
    int n = 0;
    for (int k = 0; k < t->o.nodes; k++)
        n += t->nodes[k].state == NODE_UP;
    return n;
}

void rk_nodes_bye(rk_nodes *t, const char *reason)
{
    rk_err e = {0};
    say_hushed(t, true); /* the job ends: the count of what was held back, now */
    /* BYE, then our end shut for writing, then what the agents still send (partner copies in
     * flight) read and dropped until each closes, at most RK_NODES_BYE_WAIT_S: a socket
     * closed with unread bytes resets the connection, and the reset would throw away the BYE
     * still on its way (the agent would not hear that the job is over) */
    int ci[RK_NODES_MAX], n = 0;
    for (int k = 0; k < t->o.nodes; k++) {
        nodeinfo *x = &t->nodes[k];
        if (x->state != NODE_UP || x->conn < 0)
            continue;
        int fd = t->conns[x->conn].fd;
        if (rk_node_send_reason(&x->peer, &t->key, fd, RK_NODE_MSG_BYE, reason ? reason : "done",
                                t->conns[x->conn].from, &e) == RK_OK &&
            shutdown(fd, SHUT_WR) == 0)
            ci[n++] = x->conn;
        else
            conn_close(t, x->conn);
        x->state = NODE_LEFT;
    }
    double until = rk_mono_s() + RK_NODES_BYE_WAIT_S;
    while (n > 0 && rk_mono_s() < until) {
        struct pollfd p[RK_NODES_MAX];
        for (int i = 0; i < n; i++)
            p[i] = (struct pollfd){.fd = t->conns[ci[i]].fd, .events = POLLIN};
        if (poll(p, (nfds_t)n, 50) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            if (!p[i].revents)
                continue;
            char drop[16384];
            ssize_t r = recv(p[i].fd, drop, sizeof drop, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                conn_close(t, ci[i]);
                ci[i--] = ci[--n];
                p[i + 1] = p[n]; /* keep p in step with ci for the rest of this pass */
            }
        }
    }
    for (int i = 0; i < n; i++)
        conn_close(t, ci[i]);
}

void rk_nodes_free(rk_nodes *t)
{
    if (!t)
        return;
    if (t->conns)
        for (int i = 0; i < t->nconns; i++)
            if (t->conns[i].fd >= 0)
                conn_close(t, i);
    if (t->lfd >= 0)
        close(t->lfd);
    rk_net_secret_wipe(&t->key);
    free(t->conns);
    free(t->nodes);
    free(t->pfd);
    free(t->pfd_conn);
    free(t);
}
