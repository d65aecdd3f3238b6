/*
 * The two ends of a node link (net/peer.h): sequence numbers against replays, the launch
 * generation that fences off an earlier launch's agents, the job id and the two ends' ids.
 * Pure decisions on an opened header; the frame itself is net/frame.c's.
 */
#include "net/peer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "net/sock.h"

#define SEND_STACK_PAYLOAD                                                                         \
    4096 /* payloads up to this are sealed on the stack (node messages                             \
          * are at most 1 KiB), larger ones in a heap buffer */

void rk_net_peer_init(rk_net_peer *p, const uint8_t job[RK_NET_JOB_ID_LEN], uint32_t self,
                      uint32_t other, uint32_t generation, bool follow)
{
    memset(p, 0, sizeof *p);
    memcpy(p->job, job, RK_NET_JOB_ID_LEN);
    p->self = self;
    p->other = other;
    p->generation = generation;
    p->follow = follow;
}

void rk_net_peer_set_generation(rk_net_peer *p, uint32_t generation)
{
    p->generation = generation;
    p->sent = 0;
    p->received = 0;
}

int rk_net_peer_seal(rk_net_peer *p, const rk_net_secret *key, uint8_t type, uint8_t flags,
                     const void *payload, uint32_t len, uint8_t *out, size_t cap, size_t *out_len,
                     rk_err *err)
{
    if (p->sent == UINT64_MAX)
        return rk_err_set(err, RK_EINVAL, "link to %u: sequence numbers exhausted",
                          (unsigned)p->other);
    rk_net_hdr h = {.type = type,
                    .flags = flags,
                    .sender = p->self,
                    .receiver = p->other,
                    .generation = p->generation,
                    .seq = p->sent + 1,
                    .len = len};
    memcpy(h.job, p->job, RK_NET_JOB_ID_LEN);
    int rc = rk_net_frame_seal(key, &h, payload, out, cap, out_len, err);
    if (rc == RK_OK)
        p->sent++;
    return rc;
}

/* "node 3" or "the coordinator" into buf. */
static const char *end_name(uint32_t id, char *buf, size_t cap)
{
    if (id == RK_NET_COORDINATOR)
        snprintf(buf, cap, "the coordinator");
    else
        snprintf(buf, cap, "node %u", (unsigned)id);
    return buf;
}

int rk_net_peer_accept(rk_net_peer *p, const rk_net_hdr *h, const char *from, rk_err *err)
{
    char shown[RK_NET_ADDR_MAX + 16], a[32], b[32];
    rk_msg_show(shown, sizeof shown, from && *from ? from : "peer");
    if (memcmp(h->job, p->job, RK_NET_JOB_ID_LEN) != 0)
        return rk_err_set(err, RK_NET_EJOB, "frame of another job from %s", shown);
    if (h->sender != p->other)
        return rk_err_set(err, RK_NET_EPEER, "frame from %s claims to be from %s, expected %s",
                          shown, end_name(h->sender, a, sizeof a), end_name(p->other, b, sizeof b));
    if (h->receiver != p->self)
        return rk_err_set(err, RK_NET_EPEER, "frame from %s is addressed to %s, this is %s", shown,
                          end_name(h->receiver, a, sizeof a), end_name(p->self, b, sizeof b));
    if (h->generation < p->generation || (h->generation > p->generation && !p->follow))
        return rk_err_set(err, RK_NET_EFENCED, "frame of launch %u from %s, this is launch %u",
                          (unsigned)h->generation, shown, (unsigned)p->generation);
    uint64_t last = h->generation > p->generation ? 0 : p->received;
    if (h->seq <= last)
        return rk_err_set(err, RK_NET_EREPLAY, "replayed frame seq %llu <= %llu from %s",
                          (unsigned long long)h->seq, (unsigned long long)last, shown);
    if (h->generation > p->generation)
        rk_net_peer_set_generation(p, h->generation);
    p->received = h->seq;
    return RK_OK;
}

int rk_net_peer_send(rk_net_peer *p, const rk_net_secret *key, int fd, uint8_t type,
                     const void *payload, size_t len, const char *to, rk_err *err)
{
    uint8_t small[RK_NET_HDR_LEN + SEND_STACK_PAYLOAD + RK_NET_TAG_LEN];
    if (len > RK_NET_PAYLOAD_MAX)
        return rk_err_set(err, RK_NET_ETOOBIG, "a frame of %zu payload bytes to %s: at most %u",
                          len, to ? to : "peer", RK_NET_PAYLOAD_MAX);
    size_t cap = RK_NET_HDR_LEN + len + RK_NET_TAG_LEN, n;
    uint8_t *frame = len <= SEND_STACK_PAYLOAD ? small : malloc(cap);
    if (!frame)
        return rk_err_set(err, RK_ENOMEM, "a frame to %s: out of memory", to ? to : "peer");
    int rc = rk_net_peer_seal(p, key, type, 0, payload, (uint32_t)len, frame, cap, &n, err);
    if (!rc)
        rc = rk_net_send_all(fd, frame, n, RK_NET_SEND_TIMEOUT_S, to, err);
    if (frame != small)
        free(frame);
    return rc;
}
