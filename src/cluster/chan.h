/*
 * A rank's heartbeat stream carried over the node link as a channel (docs/cluster-protocol.md,
 * "Launching the ranks"): DATA frames of its bytes and one CLOSE, or a stack dump's STACK
 * frames and one STACK_END, each a channel number and raw bytes (jobmsg.c). Both ends of the
 * link carry streams this way: the agent its ranks' (agent_job.c), the coordinator the job's
 * commands back to them (cluster.c). How each end writes the bytes it receives is its own
 * (the agent into a rank's socket, the coordinator into the job's connection).
 */
#ifndef RK_CLUSTER_CHAN_H
#define RK_CLUSTER_CHAN_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

/* Sends one message on the link: 0, or -1 when the link is gone. */
typedef int (*rk_node_send_fn)(void *ctx, uint8_t type, const void *payload, size_t len);

/* Send `n` bytes (1..RK_NODE_DATA_MAX) of channel `chan` as one DATA or STACK (`type`), or
 * with n = 0 its end, a CLOSE or STACK_END: 0, or -1 (the send failed, or a bad argument). */
int rk_node_chan_send(uint32_t chan, uint8_t type, const void *bytes, size_t n,
                      rk_node_send_fn send, void *ctx);

/* One read of what `fd` has now (non-blocking, at most RK_NODE_DATA_MAX bytes) sent as one
 * DATA of channel `chan`: 1 if bytes went, 0 if none were waiting, -1 if the stream ended
 * (closed, or the read failed): nothing is sent then, and the caller ends the channel with
 * rk_node_chan_send(chan, RK_NODE_MSG_CLOSE, NULL, 0, ...) once what must go first went. */
int rk_node_chan_forward(int fd, uint32_t chan, rk_node_send_fn send, void *ctx);

/* A DATA, CLOSE, STACK or STACK_END received: its channel into *chan and its bytes into
 * *bytes, *n (into the payload; none for an end). 1 for an end (CLOSE, STACK_END), 0 for
 * bytes, or RK_EFORMAT naming the problem (rk_node_data_parse; RK_EINVAL another type). */
int rk_node_chan_take(uint8_t type, const void *payload, size_t len, uint32_t *chan,
                      const uint8_t **bytes, size_t *n, rk_err *err);

#endif
