/*
 * A node agent's side of the partner copies (docs/recovery.md "Partner copies on another
 * host", docs/cluster-protocol.md "Partner copies"). The ranks of this node pin a generation
 * of their snapshot every few steps (rekindle/snap.h: DIR/rank-R/pin-<step>); the agent sends
 * each rank's newest pin it has not sent yet to the coordinator (SNAP_BEGIN, SNAP_DATA pieces,
 * SNAP_END, kind push), which relays it to the node's partner. As a partner it keeps what
 * the coordinator relays to it under DIR/held/rank-R (the store's receive side: a temporary
 * file verified in full before it becomes a generation, two generations a rank) and says
 * SNAP_HELD; on SNAP_FETCH it sends a held generation back (kind fetch), and a generation of
 * kind fetch that reaches it becomes the rank's own generation in DIR/rank-R, for a rank that
 * is about to run on this node. Bounded: one generation in flight out (read from its open
 * file a piece at a time), at most RK_PARTNER_RECV_MAX in. Poll-based: agent.c calls in from
 * its loop.
 */
#ifndef RK_CLUSTER_PARTNER_H
#define RK_CLUSTER_PARTNER_H

#include <stddef.h>
#include <stdint.h>

#include "cluster/chan.h"
#include "rekindle/error.h"

#define RK_PARTNER_RECV_MAX 8   /* generations being received at once */
#define RK_PARTNER_SCAN_S 0.2   /* how often the ranks' pins are looked for */
#define RK_PARTNER_STALE_S 30.0 /* a generation being received, silent this long, is dropped */
#define RK_PARTNER_WINDOW (256 << 10) /* bytes of the link's send queue a copy may fill */
#define RK_PARTNER_MEM_S 1.0          /* how often the node's snapshot memory is measured */

typedef struct rk_partner rk_partner;

/* The partner side of node `node`'s agent, over the job's snapshot directory `dir` on this
 * node (which the agent's job owns and may remove: every call then finds nothing). */
int rk_partner_new(rk_partner **out, const char *dir, uint32_t node,
                   void (*on_log)(void *ctx, const char *line), void *ctx, rk_err *err);
void rk_partner_free(rk_partner *p);
/* 1 while a generation is being sent (the agent's loop should not sleep). */
int rk_partner_sending(const rk_partner *p);
/* One turn: drop what is being received and went silent; say the node's snapshot memory
 * (SNAP_MEM, when it changed, measured every RK_PARTNER_MEM_S); look for new pins (every
 * RK_PARTNER_SCAN_S); a fetch asked for goes before a push in flight; send up to `pieces` of the
 * generation in flight (the caller's room on the link: the agent never blocks on a copy, so
 * that it goes on reading what the coordinator relays to it). 0, or -1 when a send failed
 * (the link is gone). */
int rk_partner_pump(rk_partner *p, int pieces, rk_node_send_fn send, void *ctx);
/* SNAP_BEGIN, SNAP_DATA, SNAP_END or SNAP_FETCH from the coordinator: 0, or -1 for a message
 * that does not parse (the caller drops the link). A generation that cannot be kept is said
 * in the log and not acknowledged. */
int rk_partner_msg(rk_partner *p, uint8_t type, const uint8_t *payload, size_t len,
                   rk_node_send_fn send, void *ctx);
/* The link dropped: generations half received are removed, the one half sent starts again. */
void rk_partner_link_lost(rk_partner *p);

#endif
