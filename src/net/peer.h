/*
 * Inside librekindle: one end of the link between the coordinator and one node, the state
 * that refuses what a good tag alone cannot (docs/cluster-protocol.md, "Replay and fencing").
 *
 * Each end keeps one rk_net_peer per other end (the coordinator one per node, an agent one
 * for the coordinator), for the life of the job rather than of a connection, so a frame
 * replayed on a new connection is refused as on the old one. A frame whose tag matched
 * (frame.h) is accepted only if, checked in this order:
 *   - its job id is this job's                               else RK_NET_EJOB
 *   - it is from this link's other end and addressed to us   else RK_NET_EPEER
 *   - its launch generation is the current one               else RK_NET_EFENCED
 *     (a newer one is followed instead where `follow` is set: an agent follows the
 *     coordinator into a new launch; the coordinator never follows)
 *   - its sequence number is above the last one accepted     else RK_NET_EREPLAY
 * Sequence numbers start at 1 in each generation, in each direction: moving to a new
 * generation resets both the send and the receive counter.
 *
 * rk_net_peer_send seals and writes a frame: each end's one way to send.
 *
 * Messages name the peer and the numbers: "replayed frame seq 17 <= 20 from ...", "frame of
 * launch 2 from ..., this is launch 3". A refused frame changes nothing. Not thread-safe: one
 * thread owns a peer.
 */
#ifndef RK_NET_PEER_H
#define RK_NET_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/frame.h"

typedef struct rk_net_peer {
    uint8_t job[RK_NET_JOB_ID_LEN];
    uint32_t self;       /* this end's id: a node index, or RK_NET_COORDINATOR */
    uint32_t other;      /* the other end's */
    uint32_t generation; /* the current launch generation */
    bool follow;         /* accept a newer generation from the other end, and move to it */
    uint64_t sent;       /* sequence number of the last frame sealed (0: none yet) */
    uint64_t received;   /* sequence number of the last frame accepted (0: none yet) */
} rk_net_peer;

/* A link of job `job` between `self` and `other` in launch `generation`, counters at 0. */
void rk_net_peer_init(rk_net_peer *p, const uint8_t job[RK_NET_JOB_ID_LEN], uint32_t self,
                      uint32_t other, uint32_t generation, bool follow);

/* Move to launch `generation` (the coordinator at a relaunch): both counters back to 0. */
void rk_net_peer_set_generation(rk_net_peer *p, uint32_t generation);

/* Seal a frame of `type`/`flags` with `len` bytes of `payload` to the other end, with the
 * next sequence number and the current generation, into `out` (`cap` bytes; RK_NET_FRAME_MAX
 * always suffices). Errors as rk_net_frame_seal; the counter advances only on success. */
int rk_net_peer_seal(rk_net_peer *p, const rk_net_secret *key, uint8_t type, uint8_t flags,
                     const void *payload, uint32_t len, uint8_t *out, size_t cap, size_t *out_len,
                     rk_err *err);

/* The framed send of both ends: seal as rk_net_peer_seal, then write the whole frame to the
 * non-blocking socket `fd` within RK_NET_SEND_TIMEOUT_S (rk_net_send_all; `to` names the peer
 * in messages). Errors as those two, RK_ENOMEM; the counter advances once sealed, so a frame
 * that could not be written is never sent again under its number. */
#define RK_NET_SEND_TIMEOUT_S                                                                      \
    1.0 /* a frame that cannot be written in this long: the link is gone */
int rk_net_peer_send(rk_net_peer *p, const rk_net_secret *key, int fd, uint8_t type,
                     const void *payload, size_t len, const char *to, rk_err *err);

/* Decide on header `h` of a frame that opened (its tag matched): RK_OK and the counter
 * advances (and the generation, where followed), or one of the refusals above. `from` names
 * the peer in messages. */
int rk_net_peer_accept(rk_net_peer *p, const rk_net_hdr *h, const char *from, rk_err *err);

#endif
