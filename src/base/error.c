/* Error codes and message buffers shared by every rekindle module (see rekindle/error.h). */
#include "rekindle/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *rk_strerror(int code)
{
    switch (code) {
    case RK_OK: return "success";
    case RK_EINVAL: return "invalid argument";
    case RK_EIO: return "input/output error";
    case RK_ENOMEM: return "out of memory";
    case RK_EFORMAT: return "malformed input";
    case RK_EBACKEND: return "compute backend failure";
    case RK_ENOTSUP: return "not supported";
    case RK_ENOENT: return "not found";
    case RK_EMISMATCH: return "does not match";
    case RK_ECOMM: return "communication failure";
    case RK_ESTOPPED: return "stopped on request";
    case RK_EGUARD: return "unrecoverable fault";
    case RK_ESTORAGE: return "storage refused (full, read-only, permission or disk error)";
    case RK_EBUSY: return "in use by another process";
    case RK_ENONFINITE: return "values are not finite";
    default: return "unknown error";
    }
}

int rk_err_set(rk_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void rk_err_clear(rk_err *err)
{
    if (err) {
        err->code = RK_OK;
        err->msg[0] = '\0';
    }
}
