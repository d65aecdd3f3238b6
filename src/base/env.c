/* Environment overrides that must not reach a privileged process (base/env.h). Relies on
 * getauxval(AT_SECURE) on Linux, on the real and effective ids elsewhere. */
#define _GNU_SOURCE /* secure_getenv */

#include "base/env.h"

#include <stdlib.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

bool rk_env_privileged(void)
{
#if defined(__linux__) && defined(AT_SECURE)
    if (getauxval(AT_SECURE))
        return true;
#endif
    return getuid() != geteuid() || getgid() != getegid();
}

const char *rk_env_override(const char *name)
{
    if (rk_env_privileged())
        return NULL;
#if defined(__GLIBC__)
    return secure_getenv(name);
#else
    return getenv(name);
#endif
}
