/*
 * Inside librekindle: the node link's TCP sockets. Every descriptor made here is close-on-exec
 * (a rank launched by an agent inherits none) and non-blocking; connected ones have
 * TCP_NODELAY (frames are small and latency matters: a stop must reach every node within
 * seconds) and SO_KEEPALIVE. Writes never raise SIGPIPE (MSG_NOSIGNAL).
 *
 * Addresses are IPv4 or IPv6 literals ("198.18.0.3", "::1", "fe80::1%eth0"), or a host name
 * that resolves to exactly one address (a listener binds that one address and no other: a
 * name with several, such as "localhost" with 127.0.0.1 and ::1, is refused with the list).
 * Peers are shown as "198.18.0.3:41234" or "[::1]:41234" (rk_net_addr_text) in messages.
 */
#ifndef RK_NET_SOCK_H
#define RK_NET_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "net/net.h"

/* `sa` as "a.b.c.d:port" or "[v6]:port" into out (RK_NET_ADDR_MAX bytes suffice); "?" for
 * a family other than IPv4/IPv6. Returns out. */
const char *rk_net_addr_text(const struct sockaddr *sa, socklen_t len, char *out, size_t cap);

/* Resolve `host` (a literal or a name with exactly one address) and `port` into *ss. RK_EINVAL
 * with the addresses listed if there are several, RK_ENOENT if none. */
int rk_net_resolve_one(const char *host, uint16_t port, struct sockaddr_storage *ss, socklen_t *len,
                       rk_err *err);

/* A listening socket bound to `addr`:`port` only (port 0: the kernel picks; see
 * rk_net_local_text). IPv6 sockets are IPV6_V6ONLY. On success *fd is it. RK_EINVAL (bad or
 * ambiguous address), RK_ENOENT (does not resolve), RK_EIO (socket, bind or listen failed:
 * the message names the errno, e.g. the address in use or not on this host). */
int rk_net_listen(const char *addr, uint16_t port, int *fd, rk_err *err);

/* Accept one connection from listener `lfd`: 1 with *fd (non-blocking, CLOEXEC, NODELAY,
 * KEEPALIVE) and the peer's address in from[RK_NET_ADDR_MAX]; 0 if none is waiting; RK_EIO. */
int rk_net_accept(int lfd, int *fd, char *from, rk_err *err);

/* Connect to `host`:`port` (every address the name resolves to, in turn) within `timeout_s`
 * seconds in all (> 0; even loopback needs a moment). On success *fd is the connected, non-blocking
 * socket. RK_ENOENT (no such host), RK_ECOMM (refused, unreachable, or the timeout passed: the
 * message says which, naming the address), RK_EIO. */
int rk_net_connect(const char *host, uint16_t port, double timeout_s, int *fd, rk_err *err);

/* Write all `len` bytes to the non-blocking socket `fd`, waiting for room up to `timeout_s`
 * seconds in all. `to` names the peer in messages. RK_NET_ECLOSED (the peer is gone:
 * EPIPE, ECONNRESET), RK_ECOMM (timed out), RK_EIO. */
int rk_net_send_all(int fd, const void *buf, size_t len, double timeout_s, const char *to,
                    rk_err *err);

/* The local address of `fd` (a listener's, with the port the kernel picked) as text. */
const char *rk_net_local_text(int fd, char *out, size_t cap);

/* The other end of connected `fd` as text ("?" if unknown). */
const char *rk_net_peer_text(int fd, char *out, size_t cap);

/* The local port of `fd` (0 on failure). */
uint16_t rk_net_local_port(int fd);

#endif
