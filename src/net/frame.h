/*
 * Inside librekindle: one frame of the node link, sealed and opened (docs/cluster-protocol.md
 * has the layout). A frame is a fixed 48-byte header, a payload of at most 64 KiB and an
 * HMAC-SHA256 tag (OpenSSL) keyed with the job's secret over header and payload; every
 * integer is little-endian (base/bytes.h).
 *
 * Opening checks in this order and stops at the first failure: enough bytes for a header,
 * magic, version, reserved bits zero, payload length within RK_NET_PAYLOAD_MAX (decided
 * from the header, before any payload is looked at), the frame's exact length, and then the
 * tag, compared in constant time (CRYPTO_memcmp). Only a frame whose tag matches has its
 * header and payload handed out. Job id, sender, receiver, launch generation and sequence
 * number are then the link's business (peer.h), not this file's.
 *
 * Nothing here allocates or keeps state; every function is thread-safe.
 */
#ifndef RK_NET_FRAME_H
#define RK_NET_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "net/net.h"
#include "net/secret.h"

/* A frame's header, decoded. `len` is the payload's length. */
typedef struct rk_net_hdr {
    uint8_t type;        /* what the payload is; the link's users define the values */
    uint8_t flags;       /* the users' too; carried and authenticated, never read here */
    uint32_t sender;     /* node index, or RK_NET_COORDINATOR */
    uint32_t receiver;   /* node index, or RK_NET_COORDINATOR */
    uint32_t generation; /* launch generation the sender is in */
    uint64_t seq;        /* sender's sequence number on this link, from 1 */
    uint32_t len;        /* payload bytes, 0..RK_NET_PAYLOAD_MAX */
    uint8_t job[RK_NET_JOB_ID_LEN];
} rk_net_hdr;

/* The whole frame's size for a payload of `len` bytes. */
static inline size_t rk_net_frame_size(uint32_t len)
{
    return RK_NET_HDR_LEN + (size_t)len + RK_NET_TAG_LEN;
}

/* Seal header `h` (its `len` bytes of payload at `payload`) into `out`, `cap` bytes: header,
 * payload, tag. *out_len gets the frame's size. RK_NET_ETOOBIG if h->len is over the bound,
 * RK_EINVAL if `cap` is too small (nothing is written then). */
int rk_net_frame_seal(const rk_net_secret *key, const rk_net_hdr *h, const void *payload,
                      uint8_t *out, size_t cap, size_t *out_len, rk_err *err);

/* Look at the first `avail` bytes of a frame (a header, possibly incomplete): 0 and *total =
 * the whole frame's size once the header is complete and sound (magic, version, reserved
 * bits, length bound); 0 and *total = 0 while the bytes so far could still begin a frame
 * (the magic and version are checked as soon as they arrive); RK_EFORMAT (garbage: bad
 * magic, version or reserved bits) or RK_NET_ETOOBIG otherwise. `from` names the peer in
 * messages ("198.18.0.3:41234"). */
int rk_net_frame_peek(const uint8_t *buf, size_t avail, const char *from, size_t *total,
                      rk_err *err);

/* Open the frame of exactly `len` bytes at `buf`: checks as above; on success *h is its
 * header and *payload points into `buf` at h->len bytes. On failure *h is zeroed and
 * *payload NULL: RK_EFORMAT (garbage, truncated, trailing bytes), RK_NET_ETOOBIG,
 * RK_NET_EAUTH ("wrong secret or tampered frame from <from>"). */
int rk_net_frame_open(const rk_net_secret *key, const uint8_t *buf, size_t len, const char *from,
                      rk_net_hdr *h, const uint8_t **payload, rk_err *err);

#endif
