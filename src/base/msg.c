/* One-line error messages from untrusted text (base/msg.h), shared by every module. */
#define _POSIX_C_SOURCE 200809L

#include "base/msg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *rk_msg_show(char *dst, size_t cap, const char *s)
{
    size_t len = strlen(s), j = 0, i = 0;
    for (; i < len && j + 4 < cap; i++, j++)
        dst[j] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    if (i < len) {
        while (j > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
            i--, j--; /* the cut falls inside a character: cut before its lead byte */
        memcpy(dst + j, "...", 3);
        j += 3;
    }
    dst[j] = '\0';
    return dst;
}

int rk_err_set_line(rk_err *err, int code, const char *fmt, ...)
{
    char buf[RK_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (char *p = buf; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return rk_err_set(err, code, "%s", buf);
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
