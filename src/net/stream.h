/*
 * Inside librekindle: the node link's frames out of a TCP byte stream (non-blocking sockets).
 *
 * A reader holds one connection's bytes in a fixed buffer of RK_NET_FRAME_MAX bytes (about
 * 64 KiB; nothing is allocated: allocate the reader itself, or make it static, rather than
 * putting it on a thread's stack). It looks at the header as it arrives: a wrong magic or
 * version fails as soon as those bytes are in, and a payload length over the bound fails as
 * soon as the length field is, before any payload is awaited. A complete frame is opened
 * (frame.h: the tag is checked) and only then handed out. The first failure is final: every
 * later call returns the same code, and the caller logs the reader's message once and
 * closes the connection.
 *
 *     rk_net_reader r;  rk_net_reader_init(&r, "198.18.0.3:41234");
 *     on POLLIN:
 *         rc = rk_net_reader_fill(&r, fd, &err);          (<0: close, log err.msg)
 *         while ((rc = rk_net_reader_next(&r, key, &h, &payload, &err)) == 1)
 *             ... rk_net_peer_accept(&peer, &h, r.from, &err), use payload ...
 *         (rc < 0: close, log err.msg)
 *
 * Drain with rk_net_reader_next until it returns 0 after each fill: then the buffer always
 * has room for the next read. A payload handed out stays valid until the next call on the
 * reader. Not thread-safe: one thread owns a reader.
 */
#ifndef RK_NET_STREAM_H
#define RK_NET_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "net/frame.h"

typedef struct rk_net_reader {
    char from[RK_NET_ADDR_MAX]; /* the peer, for messages */
    size_t off;                 /* start of the bytes not yet handed out */
    size_t have;                /* end of the bytes received */
    size_t last;                /* size of the frame last handed out (consumed at next call) */
    int failed;                 /* the first failure's code, 0 while sound */
    rk_err err;                 /* and its message, repeated by every later call */
    uint8_t buf[RK_NET_FRAME_MAX];
} rk_net_reader;

/* An empty reader for the peer named `from` (copied; NULL: "peer"). */
void rk_net_reader_init(rk_net_reader *r, const char *from);

/* Read what `fd` has (one read(2), non-blocking): the number of bytes read, 0 if none were
 * waiting (EAGAIN), or a failure: RK_NET_ECLOSED when the peer closed the connection or
 * reset it ("... closed the connection", with "mid-frame" and the count when a frame was
 * incomplete), RK_EIO if the read failed. A failure is final as above. */
int rk_net_reader_fill(rk_net_reader *r, int fd, rk_err *err);

/* Append up to `n` bytes from memory instead of a socket (tests, fuzzing): how many were
 * taken (fewer than `n` when the buffer is full: drain it with next), or the final failure. */
int rk_net_reader_feed(rk_net_reader *r, const void *data, size_t n, rk_err *err);

/* The next complete frame: 1 with *h and *payload (into the reader's buffer), 0 when more
 * bytes are needed, or a final failure: RK_EFORMAT (garbage), RK_NET_ETOOBIG (the header's
 * length is over the bound), RK_NET_EAUTH (wrong secret or tampered frame). */
int rk_net_reader_next(rk_net_reader *r, const rk_net_secret *key, rk_net_hdr *h,
                       const uint8_t **payload, rk_err *err);

/* Bytes received and not yet handed out as frames. */
static inline size_t rk_net_reader_pending(const rk_net_reader *r)
{
    return r->have - r->off - r->last;
}

#endif
