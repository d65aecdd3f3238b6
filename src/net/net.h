/*
 * Inside librekindle: what every part of the node link (src/net/) shares, the authenticated
 * TCP link between `rk run` (the job coordinator) and one node agent per host. The frame
 * layout and the rules are in docs/cluster-protocol.md. Not part of the public API.
 *
 * Errors are the library's (rekindle/error.h) plus the codes below, one per refusal, so a
 * caller can tell a wrong secret from a replay from a fenced launch and log one line; each
 * comes with a message that names the peer and the numbers. rk_net_strerror() names any of
 * them (and falls back to rk_strerror()).
 */
#ifndef RK_NET_NET_H
#define RK_NET_NET_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

enum {
    RK_NET_EAUTH = -64,   /* the tag does not match: wrong secret or a tampered frame */
    RK_NET_EREPLAY = -65, /* sequence number not above the last one accepted from that peer */
    RK_NET_EFENCED = -66, /* a frame of another launch generation than the current one */
    RK_NET_EJOB = -67,    /* a frame of another job (job id differs) */
    RK_NET_EPEER = -68,   /* sent by, or addressed to, another node than this link's */
    RK_NET_ETOOBIG = -69, /* payload length over RK_NET_PAYLOAD_MAX (refused from the header) */
    RK_NET_ECLOSED = -70  /* the peer closed the connection (or it was reset) */
};

#define RK_NET_SECRET_LEN 32      /* bytes of a job's secret (HMAC-SHA256 key) */
#define RK_NET_JOB_ID_LEN 16      /* bytes of a job id */
#define RK_NET_HDR_LEN 48         /* the fixed header */
#define RK_NET_TAG_LEN 32         /* HMAC-SHA256 over header + payload */
#define RK_NET_PAYLOAD_MAX 65536u /* most payload bytes one frame may carry */
#define RK_NET_FRAME_MAX (RK_NET_HDR_LEN + RK_NET_PAYLOAD_MAX + RK_NET_TAG_LEN)
#define RK_NET_MAGIC "RKNL"            /* the first 4 bytes of every frame */
#define RK_NET_VERSION 1               /* the header's version byte */
#define RK_NET_COORDINATOR 0xFFFFFFFFu /* the sender/receiver id of the coordinator */
#define RK_NET_ADDR_MAX 64             /* "[v6 address]:port" with its NUL */

/* A static description of an RK_NET_E* code, or rk_strerror(code) for the library's own. */
const char *rk_net_strerror(int code);

#endif
