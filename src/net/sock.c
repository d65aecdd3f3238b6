/*
 * TCP sockets of the node link (net/sock.h): bind one address only, connect with a deadline
 * (non-blocking connect + poll on base/clock.h's monotonic clock), close-on-exec, no delay,
 * keepalive, and no SIGPIPE.
 */
#define _GNU_SOURCE /* accept4 */
#include "net/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/msg.h"

const char *rk_net_addr_text(const struct sockaddr *sa, socklen_t len, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(out, cap, "%s:%u", host, (unsigned)ntohs(a->sin_port));
    } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        snprintf(out, cap, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
    } else {
        snprintf(out, cap, "?");
    }
    return out;
}

/* getaddrinfo for a TCP `host`:`port`; the error as a message. */
static int resolve(const char *host, uint16_t port, struct addrinfo **res, rk_err *err)
{
    char shown[256], serv[8];
    rk_msg_show(shown, sizeof shown, host ? host : "");
    if (!host || !*host)
        return rk_err_set(err, RK_EINVAL, "an address is needed (an IPv4 or IPv6 literal)");
    snprintf(serv, sizeof serv, "%u", (unsigned)port);
    struct addrinfo hints = {
        .ai_socktype = SOCK_STREAM, .ai_protocol = IPPROTO_TCP, .ai_flags = AI_NUMERICSERV};
    int g = getaddrinfo(host, serv, &hints, res);
    if (g == 0)
        return RK_OK;
    *res = NULL;
    if (g == EAI_NONAME || g == EAI_NODATA || g == EAI_FAMILY)
        return rk_err_set(err, RK_ENOENT, "%s: no such host or address", shown);
    return rk_err_set(err, RK_EIO, "%s: cannot resolve: %s", shown, gai_strerror(g));
}

int rk_net_resolve_one(const char *host, uint16_t port, struct sockaddr_storage *ss, socklen_t *len,
                       rk_err *err)
{
    struct addrinfo *res;
    int rc = resolve(host, port, &res, err);
    if (rc)
        return rc;
    char list[256] = "", one[RK_NET_ADDR_MAX];
    int n = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        bool dup = false;
        for (struct addrinfo *b = res; b != a; b = b->ai_next)
            dup = dup || (b->ai_addrlen == a->ai_addrlen &&
                          memcmp(b->ai_addr, a->ai_addr, a->ai_addrlen) == 0);
        if (dup || a->ai_addrlen > sizeof *ss)
            continue;
        if (n++ == 0) {
            memcpy(ss, a->ai_addr, a->ai_addrlen);
            *len = a->ai_addrlen;
        }
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "",
                 rk_net_addr_text(a->ai_addr, a->ai_addrlen, one, sizeof one));
    }
    freeaddrinfo(res);
    char shown[256];
    rk_msg_show(shown, sizeof shown, host);
    if (n == 0)
        return rk_err_set(err, RK_ENOENT, "%s: no IPv4 or IPv6 address", shown);
    if (n > 1)
        return rk_err_set(err, RK_EINVAL,
                          "%s: resolves to %d addresses (%s); give the one to use as a literal",
                          shown, n, list);
    return RK_OK;
}

/* TCP_NODELAY and SO_KEEPALIVE on a connected socket. */
static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

int rk_net_listen(const char *addr, uint16_t port, int *fd, rk_err *err)
{
    *fd = -1;
    struct sockaddr_storage ss;
    socklen_t len;
    int rc = rk_net_resolve_one(addr, port, &ss, &len, err);
    if (rc)
        return rc;
    char at[RK_NET_ADDR_MAX], e[128];
    rk_net_addr_text((struct sockaddr *)&ss, len, at, sizeof at);
    int s = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return rk_err_set(err, RK_EIO, "listen on %s: socket: %s", at,
                          rk_msg_strerror(errno, e, sizeof e));
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6)
        setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    const char *what = NULL;
    if (bind(s, (struct sockaddr *)&ss, len) != 0)
        what = "bind";
    else if (listen(s, 256) != 0)
        what = "listen";
    if (what) {
        int en = errno;
        close(s);
        return rk_err_set(err, RK_EIO, "listen on %s: %s: %s", at, what,
                          rk_msg_strerror(en, e, sizeof e));
    }
    *fd = s;
    return RK_OK;
}

int rk_net_accept(int lfd, int *fd, char *from, rk_err *err)
{
    *fd = -1;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int c = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c >= 0) {
            tune(c);
            rk_net_addr_text((struct sockaddr *)&ss, len, from, RK_NET_ADDR_MAX);
            *fd = c;
            return 1;
        }
        /* a connection that died while queued, or a transient network error: try the next */
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        char e[128];
        return rk_err_set(err, RK_EIO, "accept: %s", rk_msg_strerror(errno, e, sizeof e));
    }
}

/* Wait for `fd` to become ready for `events` until `deadline` (rk_mono_s): 1 ready, 0 timed
 * out, -1 poll failed (errno). */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - rk_mono_s();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > 3600 ? 3600 * 1000 : (int)(left * 1000.0) + 1);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* One connect attempt to `sa` by `deadline`: the socket, or -1 with errno (ETIMEDOUT). */
static int connect_one(const struct addrinfo *a, double deadline)
{
    int s = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    int en = 0;
    if (connect(s, a->ai_addr, a->ai_addrlen) != 0) {
        en = errno;
        if (en == EINPROGRESS || en == EINTR) {
            int w = wait_fd(s, POLLOUT, deadline);
            socklen_t elen = sizeof en;
            if (w == 0)
                en = ETIMEDOUT;
            else if (w < 0)
                en = errno;
            else if (getsockopt(s, SOL_SOCKET, SO_ERROR, &en, &elen) != 0)
                en = errno;
        }
    }
    if (en) {
        close(s);
        errno = en;
        return -1;
    }
    tune(s);
    return s;
}

int rk_net_connect(const char *host, uint16_t port, double timeout_s, int *fd, rk_err *err)
{
    *fd = -1;
    double deadline = rk_mono_s() + (timeout_s > 0 ? timeout_s : 0);
    struct addrinfo *res;
    int rc = resolve(host, port, &res, err);
    if (rc)
        return rc;
    char at[RK_NET_ADDR_MAX] = "?", e[128];
    int en = ETIMEDOUT;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        rk_net_addr_text(a->ai_addr, a->ai_addrlen, at, sizeof at);
        int s = connect_one(a, deadline);
        if (s >= 0) {
            freeaddrinfo(res);
            *fd = s;
            return RK_OK;
        }
        en = errno;
        if (en == ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    if (en == ETIMEDOUT)
        return rk_err_set(err, RK_ECOMM, "connect to %s: no answer within %.1f s", at, timeout_s);
    bool net = en == ECONNREFUSED || en == ENETUNREACH || en == EHOSTUNREACH || en == ECONNRESET ||
               en == EADDRNOTAVAIL;
    return rk_err_set(err, net ? RK_ECOMM : RK_EIO, "connect to %s: %s", at,
                      rk_msg_strerror(en, e, sizeof e));
}

int rk_net_send_all(int fd, const void *buf, size_t len, double timeout_s, const char *to,
                    rk_err *err)
{
    const uint8_t *p = buf;
    double deadline = rk_mono_s() + timeout_s;
    char shown[RK_NET_ADDR_MAX + 16], e[128];
    rk_msg_show(shown, sizeof shown, to && *to ? to : "peer");
    while (len > 0) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = wait_fd(fd, POLLOUT, deadline);
            if (r == 0)
                return rk_err_set(err, RK_ECOMM,
                                  "send to %s: no room within %.1f s (%zu bytes "
                                  "unsent)",
                                  shown, timeout_s, len);
            if (r < 0)
                return rk_err_set(err, RK_EIO, "send to %s: poll: %s", shown,
                                  rk_msg_strerror(errno, e, sizeof e));
            continue;
        }
        int en = w < 0 ? errno : EPIPE;
        if (en == EPIPE || en == ECONNRESET)
            return rk_err_set(err, RK_NET_ECLOSED, "send to %s: the connection is closed", shown);
        return rk_err_set(err, RK_EIO, "send to %s: %s", shown, rk_msg_strerror(en, e, sizeof e));
    }
    return RK_OK;
}

const char *rk_net_local_text(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        snprintf(out, cap, "?");
        return out;
    }
    return rk_net_addr_text((struct sockaddr *)&ss, len, out, cap);
}

const char *rk_net_peer_text(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) {
        snprintf(out, cap, "?");
        return out;
    }
    return rk_net_addr_text((struct sockaddr *)&ss, len, out, cap);
}

uint16_t rk_net_local_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}
