/*
 * Inside librekindle: reading an environment variable that chooses code to load or what the
 * process does on purpose (RK_NVML_LIB, RK_INJECT, RK_INJECT_DONE). Not part of the public API.
 */
#ifndef RK_BASE_ENV_H
#define RK_BASE_ENV_H

#include <stdbool.h>

/* True when the process runs with raised privileges: set-user-ID or set-group-ID, or with file
 * capabilities (the kernel's AT_SECURE; where that is unknown, real and effective ids differ).
 * Whoever started such a process does not own it, so their environment must not choose what
 * it loads or does. */
bool rk_env_privileged(void);

/* getenv(name), or NULL when rk_env_privileged() (glibc's secure_getenv rule): the override is
 * ignored and the caller uses its default. */
const char *rk_env_override(const char *name);

#endif
