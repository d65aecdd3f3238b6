/*
 * librkloopback.so: preloaded into a single-node job's launcher (and so into its ranks) by
 * `rk run` (launch.c), so that Open MPI's listeners bind loopback only. Open MPI 4.1 binds
 * its out-of-band and TCP BTL listeners to INADDR_ANY and in6addr_any whatever its interface
 * lists (create_listen in orte/mca/oob/tcp/oob_tcp_listener.c). Here a bind() to a wildcard
 * address made by Open MPI's code (the caller's shared object, caller.c) becomes a bind() to
 * 127.0.0.1 or ::1; every other bind(), the user's code included, is passed on unchanged.
 */
#define _POSIX_C_SOURCE 200809L /* not _GNU_SOURCE: its bind() takes a transparent union */
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "preload/caller.h"

#ifndef RTLD_NEXT
#define RTLD_NEXT ((void *)-1l) /* glibc's value; declared only with _GNU_SOURCE */
#endif

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    static bind_fn real;
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "bind"); /* POSIX's way to a function pointer */
    if (!real)
        return -1;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    if (!addr || !rk_caller_is_openmpi(__builtin_return_address(0)))
        return real(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= sizeof in4) {
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real(fd, (const struct sockaddr *)&in4, sizeof in4);
        }
    } else if (addr->sa_family == AF_INET6 && len >= sizeof in6) {
        memcpy(&in6, addr, sizeof in6);
        if (memcmp(&in6.sin6_addr, &in6addr_any, sizeof in6.sin6_addr) == 0) {
            in6.sin6_addr = in6addr_loopback;
            return real(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real(fd, addr, len);
}
