/*
 * Frames out of a TCP byte stream (net/stream.h): a fixed buffer per connection, the header
 * checked as its bytes arrive (net/frame.c's peek), the tag before a frame is handed out.
 */
#include "net/stream.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/msg.h"

void rk_net_reader_init(rk_net_reader *r, const char *from)
{
    r->off = r->have = r->last = 0;
    r->failed = 0;
    rk_err_clear(&r->err);
    snprintf(r->from, sizeof r->from, "%s", from && *from ? from : "peer");
}

/* Record the reader's first failure (in r->err, from `e`) and return it to the caller. */
static int fail(rk_net_reader *r, const rk_err *e, rk_err *err)
{
    r->failed = e->code;
    r->err = *e;
    if (err)
        *err = *e;
    return e->code;
}

static int failed(const rk_net_reader *r, rk_err *err)
{
    if (err)
        *err = r->err;
    return r->failed;
}

/* Forget the frame handed out last, and move what is left to the buffer's start. */
static void compact(rk_net_reader *r)
{
    r->off += r->last;
    r->last = 0;
    if (r->off > 0) {
        memmove(r->buf, r->buf + r->off, r->have - r->off);
        r->have -= r->off;
        r->off = 0;
    }
}

int rk_net_reader_feed(rk_net_reader *r, const void *data, size_t n, rk_err *err)
{
    if (r->failed)
        return failed(r, err);
    compact(r);
    size_t room = sizeof r->buf - r->have;
    size_t take = n < room ? n : room;
    memcpy(r->buf + r->have, data, take);
    r->have += take;
    return (int)take;
}

int rk_net_reader_fill(rk_net_reader *r, int fd, rk_err *err)
{
    if (r->failed)
        return failed(r, err);
    compact(r);
    size_t room = sizeof r->buf - r->have;
    if (room == 0) /* a whole frame is waiting: the caller did not drain next() */
        return 0;
    for (;;) {
        ssize_t got = read(fd, r->buf + r->have, room);
        if (got > 0) {
            r->have += (size_t)got;
            return (int)got;
        }
        rk_err e;
        char es[128];
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (got < 0 && errno != ECONNRESET) {
            rk_err_set(&e, RK_EIO, "read from %s: %s", r->from,
                       rk_msg_strerror(errno, es, sizeof es));
            return fail(r, &e, err);
        }
        const char *how = got < 0 ? "reset" : "closed";
        if (r->have > r->off)
            rk_err_set(&e, RK_NET_ECLOSED, "%s %s the connection mid-frame (%zu bytes of a frame)",
                       r->from, how, r->have - r->off);
        else
            rk_err_set(&e, RK_NET_ECLOSED, "%s %s the connection", r->from, how);
        return fail(r, &e, err);
    }
}

int rk_net_reader_next(rk_net_reader *r, const rk_net_secret *key, rk_net_hdr *h,
                       const uint8_t **payload, rk_err *err)
{
    *payload = NULL;
    if (r->failed)
        return failed(r, err);
    r->off += r->last;
    r->last = 0;
    const uint8_t *at = r->buf + r->off;
    size_t avail = r->have - r->off, total;
    rk_err e;
    int rc = rk_net_frame_peek(at, avail, r->from, &total, &e);
    if (rc)
        return fail(r, &e, err);
    if (total == 0 || avail < total)
        return 0;
    rc = rk_net_frame_open(key, at, total, r->from, h, payload, &e);
    if (rc)
        return fail(r, &e, err);
    r->last = total;
    return 1;
}
