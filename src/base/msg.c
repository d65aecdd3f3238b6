/* One-line error messages from untrusted text (base/msg.h), shared by every module. */
#define _POSIX_C_SOURCE 200809L

#include "base/msg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int rk_err_set_line(rk_err *err, int code, const char *fmt, ...)
{
    char buf[RK_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char clean[RK_ERR_MSG_MAX];
    rk_text_clean(clean, sizeof clean, buf);
    return rk_err_set(err, code, "%s", clean);
}

const char *rk_msg_strerror(int e, char *buf, size_t cap)
{
    if (strerror_r(e, buf, cap) != 0)
        snprintf(buf, cap, "errno %d", e);
    return buf;
}

const char *rk_msg_parser_text(char *dst, size_t cap, const char *text)
{
    /* jansson's messages end in " near '<token>'" (the bytes it stopped at): cut there */
    const char *near = strstr(text, " near '");
    size_t n = near ? (size_t)(near - text) : strlen(text);
    char tmp[256];
    if (n >= sizeof tmp)
        n = sizeof tmp - 1;
    memcpy(tmp, text, n);
    tmp[n] = '\0';
    return rk_msg_show(dst, cap, tmp);
}

int rk_err_code_errno(int e)
{
    switch (e) {
    case ENOENT:
    case ENOTDIR: return RK_ENOENT;
    case ENOMEM: return RK_ENOMEM;
    case ENOSPC:
#if defined(EDQUOT) && EDQUOT != ENOSPC
    case EDQUOT:
#endif
    case EROFS:
    case EACCES:
    case EPERM:
    case EIO: return RK_ESTORAGE;
    default: return RK_EIO;
    }
}
