/*
 * The shared object of a code address (dladdr, a GNU extension: this file is apart from
 * loopback.c, whose bind() must see the POSIX prototype). For librkloopback.so.
 */
#define _GNU_SOURCE
#include "preload/caller.h"

#include <dlfcn.h>
#include <string.h>

int rk_caller_is_openmpi(const void *addr)
{
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname)
        return 0;
    const char *path = info.dli_fname, *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strstr(path, "/openmpi/") || strncmp(base, "libmpi", 6) == 0 ||
           strncmp(base, "libopen-", 8) == 0 || strncmp(base, "libpmix", 7) == 0 ||
           strncmp(base, "mca_", 4) == 0;
}
