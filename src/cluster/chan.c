/*
 * A rank's stream as a channel of the node link (cluster/chan.h): the framing both ends
 * share, on rk_node_data_format and rk_node_data_parse (jobmsg.c).
 */
#include "cluster/chan.h"

#include <errno.h>
#include <sys/socket.h>

#include "cluster/nodes.h"

int rk_node_chan_send(uint32_t chan, uint8_t type, const void *bytes, size_t n,
                      rk_node_send_fn send, void *ctx)
{
    uint8_t out[RK_NODE_DATA_MAX + 8];
    size_t len;
    rk_err e = {0};
    if (rk_node_data_format(chan, bytes, n, out, sizeof out, &len, &e) != RK_OK)
        return -1;
    return send(ctx, type, out, len) == 0 ? 0 : -1;
}

int rk_node_chan_forward(int fd, uint32_t chan, rk_node_send_fn send, void *ctx)
{
    uint8_t buf[RK_NODE_DATA_MAX];
    ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (r <= 0)
        return -1;
    rk_node_chan_send(chan, RK_NODE_MSG_DATA, buf, (size_t)r, send, ctx);
    return 1;
}

int rk_node_chan_take(uint8_t type, const void *payload, size_t len, uint32_t *chan,
                      const uint8_t **bytes, size_t *n, rk_err *err)
{
    int end = type == RK_NODE_MSG_CLOSE || type == RK_NODE_MSG_STACK_END;
    if (!end && type != RK_NODE_MSG_DATA && type != RK_NODE_MSG_STACK)
        return rk_err_set(err, RK_EINVAL, "%s is not a channel's message", rk_node_msg_name(type));
    int rc = rk_node_data_parse(payload, len, end, chan, bytes, n, err);
    return rc ? rc : end;
}
