/*
 * The coordinator's side of the partner copies (coord.h; docs/recovery.md "Partner copies on
 * another host"). Each agent sends its ranks' pinned generations here (SNAP_BEGIN, SNAP_DATA,
 * SNAP_END, kind push); they are relayed, piece by piece as they come, to the node's partner:
 * the next node of the launch in the ring of node numbers. The partner's SNAP_HELD says it kept
 * one: the table `held` then names, for each rank, the node holding its newest copy. Before a
 * launch that puts a rank on another node than its last (its node lost, a spare in its place),
 * the holder is asked for the copy (SNAP_FETCH) and what it sends (kind fetch) is relayed to
 * the rank's new node, where it becomes the rank's own generation; the ranks then agree on
 * the restore step as always (worker_snap.c), the survivors from their pins of the same step.
 * Nothing here reads a snapshot: the agents' stores verify what they keep.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "cluster/coord.h"

#define LAG_PINS 3 /* a copy this many pin intervals behind the job is said to lag */

void coord_snap_init(sup_cluster *cl)
{
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++) {
        cl->held[r] = (struct held){.by = -1, .origin = -1, .step = {-1, -1}};
        cl->last_node[r] = -1;
    }
    cl->last_world = 0;
}

/* The node that keeps node k's copies: the next node of this launch after k (node numbers in
 * a ring) that is connected; -1 when k is alone. */
static int partner_of(const sup_cluster *cl, int k)
{
    for (int i = 1; i < cl->nnodes; i++) {
        int h = (k + i) % cl->nnodes;
        if (cl->used[h] && !cl->lost[h] && rk_nodes_connected(cl->t, h))
            return h;
    }
    return -1;
}

static relay *relay_in(sup_cluster *cl, int from, uint32_t in)
{
    for (int i = 0; i < RELAYS_MAX; i++)
        if (cl->relays[i].used && cl->relays[i].from == from && cl->relays[i].in == in)
            return &cl->relays[i];
    return NULL;
}

static relay *relay_new(sup_cluster *cl, int from, uint32_t in, int to, uint32_t out)
{
    relay *x = relay_in(cl, from, in); /* the same transfer begun again: the old one goes */
    for (int i = 0; !x && i < RELAYS_MAX; i++)
        if (!cl->relays[i].used)
            x = &cl->relays[i];
    if (x)
        *x = (relay){.used = 1, .from = from, .to = to, .in = in, .out = out};
    return x;
}

static int send_snap(sup_cluster *cl, relay *x, uint8_t type, rk_node_snap m);

/* A transfer number of ours: a fetch's with the high bit (an agent numbers its pushes below
 * it), so neither a relay's key (the sender, its number) nor a receiver's can be two
 * transfers at once. */
static uint32_t new_xfer(sup_cluster *cl, int fetch)
{
    cl->next_xfer = (cl->next_xfer + 1) & ~RK_NODE_SNAP_XFER_FETCH;
    if (cl->next_xfer == 0)
        cl->next_xfer = 1;
    return fetch ? cl->next_xfer | RK_NODE_SNAP_XFER_FETCH : cl->next_xfer;
}

/* Tell x's receiver that x will not end (an END that does not match its start: the agent
 * drops what it received), when it heard the start and its link has room for it now. */
static void abort_relay(sup_cluster *cl, relay *x)
{
    if (x->used && x->begun && rk_nodes_room(cl->t, x->to) >= RK_NODE_PAYLOAD_MAX) {
        rk_node_snap m = x->m;
        m.bytes = m.bytes == 1 ? 2 : m.bytes - 1;
        (void)send_snap(cl, x, RK_NODE_MSG_SNAP_END, m);
    }
    x->used = 0;
}

/* Send m (its xfer set to x->out) as `type` to x->to: 0, or -1 (the node is lost: said by the
 * table; the transfer is dropped). */
static int send_snap(sup_cluster *cl, relay *x, uint8_t type, rk_node_snap m)
{
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    m.xfer = x->out;
    if (rk_node_snap_format(&m, out, sizeof out, &len, &e) ||
        rk_nodes_send(cl->t, x->to, type, out, len, &e)) {
        x->used = 0;
        return -1;
    }
    return 0;
}

/* A push relayed whole to node `to`: remembered until its SNAP_HELD (the oldest forgotten
 * first when the ring is full). */
static void delivered_add(sup_cluster *cl, int to, const rk_node_snap *m)
{
    struct delivered *d = &cl->delivered[cl->next_delivered];
    cl->next_delivered = (cl->next_delivered + 1) % RELAYS_MAX;
    *d = (struct delivered){.used = 1, .to = to, .m = *m};
}

/* 1 (and forgotten) if a push of m's origin, rank, step and size was relayed whole to k. */
static int delivered_take(sup_cluster *cl, int k, const rk_node_snap *m)
{
    for (int i = 0; i < RELAYS_MAX; i++) {
        struct delivered *d = &cl->delivered[i];
        if (d->used && d->to == k && d->m.node == m->node && d->m.rank == m->rank &&
            d->m.step == m->step && d->m.bytes == m->bytes) {
            d->used = 0;
            return 1;
        }
    }
    return 0;
}

/* A copy kept by node k (SNAP_HELD): the table, or a fetch done. Only what was sent to k
 * counts: a fetch asked of k's rank, a push relayed whole to k (the link is authenticated,
 * but an agent's word on what it holds is checked against what it was given). */
static void on_held(sup_cluster *cl, int k, const rk_node_snap *m)
{
    if (m->rank >= RK_SUP_MAX_DEVICES)
        return; /* no rank of a job (rank is any 32-bit number on the link) */
    int r = (int)m->rank;
    if (m->kind == RK_NODE_SNAP_FETCH) {
        if (cl->fetch[r] == 1 && cl->fetch_step[r] == m->step && node_of_rank(cl, r) == k)
            cl->fetch[r] = 2;
        return;
    }
    if (!delivered_take(cl, k, m)) {
        if (!cl->held_unasked++)
            sup_say(cl->s,
                    "node %d (%s) said it holds step %" PRId64 " of rank %d, which was never "
                    "relayed to it: ignored (said once; counted at the end)",
                    k, node_name(cl, k), m->step, r);
        return;
    }
    struct held *h = &cl->held[r];
    if (h->by != k || h->origin != (int)m->node) /* a new holder, or the rank's new node */
        *h = (struct held){.by = k, .origin = (int)m->node, .step = {-1, -1}, .lag = h->lag};
    if (m->step == h->step[0])
        return;               /* the same again */
    if (m->step < h->step[0]) /* an older step: the job was rolled back; the holder's newer */
        h->step[0] = h->step[1] = -1; /* copies went with that timeline (its retention) */
    h->step[1] = h->step[0];
    h->bytes[1] = h->bytes[0];
    h->step[0] = m->step;
    h->bytes[0] = m->bytes;
    /* how far behind the job: said once when it passes LAG_PINS pin intervals (--partner-every,
     * or under auto the steps between the two copies held), and when it is back within one */
    int64_t every = cl->partner_every > 0                        ? cl->partner_every
                    : h->step[1] >= 0 && h->step[0] > h->step[1] ? h->step[0] - h->step[1]
                                                                 : 0;
    int64_t now = sup_step_now(cl->s);
    int64_t behind = now > m->step ? now - m->step : 0;
    if (every > 0 && !h->lag && behind > LAG_PINS * every) {
        h->lag = 1;
        sup_record(cl->s, "partner_lag", r, node_name(cl, k), "partner",
                   "the partner copy of rank %d lags by %" PRId64 " steps (step %" PRId64
                   " held by node %d (%s), the job at step %" PRId64
                   "): the link cannot keep up with a pin every %" PRId64 " steps",
                   r, behind, m->step, k, node_name(cl, k), now, every);
    } else if (h->lag && behind <= every) {
        h->lag = 0;
        sup_say(cl->s,
                "the partner copy of rank %d caught up (step %" PRId64 ", %" PRId64
                " steps behind)",
                r, m->step, behind);
    }
}

void coord_snap_take(sup_cluster *cl, int k, uint8_t type, const uint8_t *payload, size_t len)
{
    rk_err e = {0};
    if (type == RK_NODE_MSG_SNAP_DATA) {
        uint32_t xfer;
        uint64_t off;
        const uint8_t *bytes;
        size_t n;
        if (rk_node_snap_data_parse(payload, len, &xfer, &off, &bytes, &n, &e)) {
            sup_say(cl->s, "node %d: a bad SNAP_DATA: %s", k, e.msg);
            return;
        }
        relay *x = relay_in(cl, k, xfer);
        if (!x)
            return; /* a transfer dropped (its node lost, no partner) */
        /* never wait on the receiver (a send that cannot be written in a second is its
         * node's loss): a copy its link has no room for now is dropped, and the next pin
         * goes whole later */
        if (rk_nodes_room(cl->t, x->to) < (int64_t)(RK_NODE_SNAP_DATA_HDR + n + 64)) {
            abort_relay(cl, x);
            cl->partner_dropped++;
            return;
        }
        static uint8_t piece[RK_NODE_SNAP_DATA_HDR + RK_NODE_SNAP_CHUNK];
        rk_node_snap_data_header(x->out, off, piece);
        memcpy(piece + RK_NODE_SNAP_DATA_HDR, bytes, n);
        if (rk_nodes_send(cl->t, x->to, RK_NODE_MSG_SNAP_DATA, piece, RK_NODE_SNAP_DATA_HDR + n,
                          &e))
            x->used = 0;
        else
            cl->snap_relayed += n;
        return;
    }
    rk_node_snap m;
    if (rk_node_snap_parse(payload, len, &m, &e)) {
        sup_say(cl->s, "node %d: a bad %s: %s", k, rk_node_msg_name(type), e.msg);
        return;
    }
    if (type == RK_NODE_MSG_SNAP_HELD) {
        on_held(cl, k, &m);
        return;
    }
    relay *x = relay_in(cl, k, m.xfer);
    if (type == RK_NODE_MSG_SNAP_BEGIN) {
        if (m.kind == RK_NODE_SNAP_PUSH) {
            /* a node's own rank only: node k says it of itself (the link is authenticated) */
            int to = partner_of(cl, k);
            if (m.node != (uint32_t)k || to < 0)
                return;
            if (m.xfer & RK_NODE_SNAP_XFER_FETCH)
                return; /* a push is numbered below the fetches' bit */
            x = relay_new(cl, k, m.xfer, to, new_xfer(cl, 0));
        } else if (!x || x->m.rank != m.rank || x->m.step != m.step || x->m.bytes != m.bytes)
            return; /* a fetch not asked for (or asked of another) */
        if (!x)
            return;
        x->m = m;
        x->begun = 1;
        x->t0 = rk_mono_s();
        (void)send_snap(cl, x, type, m);
        return;
    }
    if (type == RK_NODE_MSG_SNAP_END && x) {
        rk_node_snap want = x->m;
        want.xfer = m.xfer;
        int whole = memcmp(&want, &m, sizeof m) == 0; /* else the sender gave it up */
        if (x->m.kind == RK_NODE_SNAP_FETCH && !x->begun) {
            /* an end without a start: the holder cannot send it (gone, or it does not verify) */
            if ((int)x->m.rank < cl->n && cl->fetch[x->m.rank] == 1)
                cl->fetch[x->m.rank] = -2;
        } else if (!whole && x->m.kind == RK_NODE_SNAP_FETCH) {
            /* the holder gave it up midway (its copy could not be read whole) */
            (void)send_snap(cl, x, type, m); /* its receiver drops what it has */
            if ((int)x->m.rank < cl->n && cl->fetch[x->m.rank] == 1)
                cl->fetch[x->m.rank] = -2;
        } else if (send_snap(cl, x, type, m) == 0 && whole && x->m.kind == RK_NODE_SNAP_PUSH) {
            delivered_add(cl, x->to, &x->m);
            cl->partner_n++;
            cl->partner_bytes += x->m.bytes;
            cl->partner_s += rk_mono_s() - x->t0;
        }
        x->used = 0;
    }
}

void coord_snap_node_lost(sup_cluster *cl, int k)
{
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++)
        if (cl->held[r].by == k)
            cl->held[r].by = -1;
    for (int i = 0; i < RELAYS_MAX; i++) {
        relay *x = &cl->relays[i];
        if (!x->used || (x->from != k && x->to != k))
            continue;
        if (x->m.kind == RK_NODE_SNAP_FETCH && (int)x->m.rank < cl->n && cl->fetch[x->m.rank] == 1)
            cl->fetch[x->m.rank] = -2; /* its holder or its new node is gone */
        if (x->to != k)
            abort_relay(cl, x); /* the receiver drops what it has of it */
        x->used = 0;
    }
}

/* 1 if rank r's holder has a copy of `step` (its size into *bytes). */
static int holds(const struct held *h, int64_t step, uint64_t *bytes)
{
    for (int i = 0; i < 2; i++)
        if (h->step[i] >= 0 && h->step[i] == step) {
            *bytes = h->bytes[i];
            return 1;
        }
    return 0;
}

int coord_snap_fetch(sup_cluster *cl)
{
    int asked = 0;
    memset(cl->fetch, 0, sizeof cl->fetch);
    if (cl->partner_every == 0 || cl->n != cl->last_world || sup_snapshots_off(cl->s))
        return 0; /* none made, or another world: no snapshot fits it */
    /* the ranks that move, and whose copies are left (their holder connected) */
    int moving[RK_SUP_MAX_DEVICES], nm = 0;
    for (int r = 0; r < cl->n; r++) {
        int k = node_of_rank(cl, r), was = cl->last_node[r];
        const struct held *h = &cl->held[r];
        if (was < 0 || was == k)
            continue;
        cl->fetch[r] = -1; /* wanted; none left unless a holder is there */
        if (h->by >= 0 && h->origin == was && !cl->lost[h->by] && rk_nodes_connected(cl->t, h->by))
            moving[nm++] = r;
    }
    /* one step for all of them (the survivors pinned the same steps): the newest that every
     * holder has, else each rank's newest (the ranks then agree on what they can) */
    int64_t common = -1;
    uint64_t b;
    for (int i = 0; nm > 0 && i < 2 && common < 0; i++) {
        int64_t s = cl->held[moving[0]].step[i];
        int all = s >= 0;
        for (int j = 1; all && j < nm; j++)
            all = holds(&cl->held[moving[j]], s, &b);
        if (all)
            common = s;
    }
    for (int j = 0; j < nm && common < 0; j++)
        cl->fetch[moving[j]] = -3; /* copies of no one step: the ranks could not agree on it */
    for (int j = 0; j < nm && common >= 0; j++) {
        int r = moving[j], k = node_of_rank(cl, r);
        const struct held *h = &cl->held[r];
        int64_t step = common;
        uint64_t bytes = 0;
        if (!holds(h, step, &bytes))
            continue;
        relay *x = relay_new(cl, h->by, new_xfer(cl, 1), k, 0);
        if (!x)
            continue;
        x->out = x->in; /* the holder answers under our number; relayed under it too */
        x->m = (rk_node_snap){.xfer = x->in,
                              .kind = RK_NODE_SNAP_FETCH,
                              .node = (uint32_t)h->origin,
                              .rank = (uint32_t)r,
                              .step = step,
                              .bytes = bytes};
        char out[RK_NODE_PAYLOAD_MAX];
        size_t len;
        rk_err e = {0};
        if (rk_node_snap_format(&x->m, out, sizeof out, &len, &e) ||
            rk_nodes_send(cl->t, h->by, RK_NODE_MSG_SNAP_FETCH, out, len, &e)) {
            x->used = 0;
            continue;
        }
        cl->fetch[r] = 1;
        cl->fetch_step[r] = step;
        asked++;
    }
    return asked;
}

int coord_snap_fetching(const sup_cluster *cl)
{
    int n = 0;
    for (int r = 0; r < cl->n; r++)
        n += cl->fetch[r] == 1;
    return n;
}

void coord_snap_fetched(sup_cluster *cl)
{
    for (int r = 0; r < cl->n; r++) {
        int k = node_of_rank(cl, r), was = cl->last_node[r];
        if (cl->fetch[r] == 2)
            sup_record(cl->s, "snapshot_fetch", r, node_name(cl, k), "partner",
                       "rank %d moves from node %d (%s) to node %d (%s): its snapshot of step "
                       "%" PRId64 " was fetched from the partner copy on node %d (%s)",
                       r, was, node_name(cl, was), k, node_name(cl, k), cl->fetch_step[r],
                       cl->held[r].by, node_name(cl, cl->held[r].by));
        else if (cl->fetch[r])
            sup_record(cl->s, "snapshot_fetch", r, node_name(cl, k), "disk",
                       "rank %d moves from node %d (%s) to node %d (%s): %s: the launch restores "
                       "from disk",
                       r, was, node_name(cl, was), k, node_name(cl, k),
                       cl->fetch[r] == 1    ? "its partner copy did not arrive in time"
                       : cl->fetch[r] == -2 ? "its partner copy could not be sent (gone, or it "
                                              "does not verify)"
                       : cl->fetch[r] == -3 ? "the partner copies of the ranks that move share no "
                                              "step"
                                            : "no partner copy of its snapshot is left");
    }
    for (int i = 0; i < RELAYS_MAX; i++) /* fetches that did not end are dropped */
        if (cl->relays[i].used && cl->relays[i].m.kind == RK_NODE_SNAP_FETCH)
            abort_relay(cl, &cl->relays[i]);
    for (int r = 0; r < cl->n; r++)
        cl->last_node[r] = node_of_rank(cl, r);
    cl->last_world = cl->n;
}

void coord_snap_said(sup_cluster *cl)
{
    if (cl->partner_n < 1)
        return;
    double mb = (double)cl->partner_bytes / 1e6;
    sup_say(cl->s,
            "partner copies: %d relayed to the partners, %.1f MB, at %.1f MB/s a copy from its "
            "first byte to its last (%.2f s a copy on average); %d dropped for want of room on "
            "a partner's link",
            cl->partner_n, mb, cl->partner_s > 0 ? mb / cl->partner_s : 0.0,
            cl->partner_s / cl->partner_n, cl->partner_dropped);
    if (cl->held_unasked > 0)
        sup_say(cl->s,
                "partner copies: %d SNAP_HELD of copies never relayed to their sender "
                "ignored",
                cl->held_unasked);
}
