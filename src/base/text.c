/*
 * UTF-8 and untrusted text (base/text.h): one decoder, one cleaning rule. Relies on nothing
 * but the C library.
 */
#include "base/text.h"

#include <string.h>

size_t rk_utf8_next(const void *s, size_t avail, uint32_t *cp)
{
    const unsigned char *p = s;
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* the allowed range of the second byte */
    if (c < 0x80) {
        if (cp)
            *cp = c;
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong below U+0800 */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90; /* overlong below U+10000 */
        else if (c == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (avail < n || p[1] < lo || p[1] > hi)
        return 0;
    uint32_t v = c & (0x7fu >> n);
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (p[i] & 0x3fu);
    }
    if (cp)
        *cp = v;
    return n;
}

size_t rk_utf8_bad_at(const void *s, size_t len)
{
    const unsigned char *p = s;
    size_t i = 0;
    while (i < len) {
        size_t n = rk_utf8_next(p + i, len - i, NULL);
        if (n == 0)
            return i;
        i += n;
    }
    return len;
}

bool rk_utf8_valid(const void *s, size_t len)
{
    return rk_utf8_bad_at(s, len) == len;
}

bool rk_text_is_control(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
}

bool rk_text_ok(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = rk_utf8_next(p + i, len - i, &cp);
        if (n == 0 || rk_text_is_control(cp))
            return false;
        i += n;
    }
    return true;
}

size_t rk_text_clean(char *dst, size_t cap, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t len = strlen(s), i = 0, j = 0;
    while (i < len) {
        uint32_t cp;
        size_t n = rk_utf8_next(p + i, len - i, &cp);
        if (n == 0 || rk_text_is_control(cp)) {
            if (j + 1 >= cap)
                break;
            dst[j++] = '?';
            i += n ? n : 1;
            continue;
        }
        if (j + n >= cap)
            break;
        memcpy(dst + j, p + i, n);
        i += n;
        j += n;
    }
    dst[j] = '\0';
    return i;
}

const char *rk_msg_show(char *dst, size_t cap, const char *s)
{
    if (rk_text_clean(dst, cap, s) == strlen(s) || cap < 4) /* all of it, or no room for "..." */
        return dst;
    rk_text_clean(dst, cap - 3, s); /* room for "..." and the NUL */
    memcpy(dst + strlen(dst), "...", 4);
    return dst;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

long rk_hex_decode(const char *hex, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0)
            return (long)(2 * i);
        if (lo < 0)
            return (long)(2 * i + 1);
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return -1;
}

int rk_text_list_item(const char *list, long k, char *out, size_t cap)
{
    if (cap)
        out[0] = '\0';
    for (long i = 0; list && *list && i <= k; i++) {
        size_t l = strcspn(list, ",");
        if (i == k) {
            if (l == 0 || l >= cap)
                return 0;
            memcpy(out, list, l);
            out[l] = '\0';
            return 1;
        }
        if (!list[l])
            break;
        list += l + 1;
    }
    return 0;
}
