/*
 * Inside librekindle: UTF-8 and untrusted text, once for every module. The decoder follows
 * the Unicode standard's well-formed table (Go's and Python's rules): no overlong forms, no
 * surrogates, nothing above U+10FFFF. The message sanitiser keeps what a process read (a
 * path, a peer's string, a parser's message) from breaking a one-line message or a terminal.
 * Not part of the public API.
 */
#ifndef RK_BASE_TEXT_H
#define RK_BASE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the well-formed UTF-8 character at p, with at most `avail` bytes there
 * (avail >= 1), and its code point in *cp (cp may be NULL); 0 if the bytes there are not one.
 * It stops at the first byte that is not a continuation byte, so for a NUL-terminated string
 * avail may be 4 whatever its length. */
size_t rk_utf8_next(const void *p, size_t avail, uint32_t *cp);

/* Offset of the first byte of s[0..len) that is not part of a well-formed UTF-8 character,
 * or len if all of it is UTF-8. */
size_t rk_utf8_bad_at(const void *s, size_t len);

/* s[0..len) is well-formed UTF-8. */
bool rk_utf8_valid(const void *s, size_t len);

/* A control character: C0 (below U+0020), DEL (U+007F) or C1 (U+0080..U+009F). */
bool rk_text_is_control(uint32_t cp);

/* s[0..len) is well-formed UTF-8 without control characters. */
bool rk_text_ok(const char *s, size_t len);

/* The cleaning rule of every message and free-text field: `s` copied into dst[cap] (cap >= 1)
 * with each control character and each byte that is not part of a UTF-8 character replaced
 * by '?', cut on a character boundary where it does not fit. Returns how many bytes of s were
 * taken (strlen(s) when all of it fit). */
size_t rk_text_clean(char *dst, size_t cap, const char *s);

/* `s` for a one-line message into dst[cap] (cap >= 4): cleaned as rk_text_clean, and a string
 * that does not fit ends in "..." (cut on a character boundary). Returns dst. */
const char *rk_msg_show(char *dst, size_t cap, const char *s);

/* Item k (0-based) of a comma-separated list ("0,2,h1:3") into out[cap]: 1, or 0 when the
 * list has no item k, it is empty, or it does not fit (out is then ""). */
int rk_text_list_item(const char *list, long k, char *out, size_t cap);

/* The 2*n hexadecimal digits (either case) at hex as n bytes into out. Returns -1 when all are
 * digits, else the index of the first character that is not one (out then unspecified). */
long rk_hex_decode(const char *hex, size_t n, uint8_t *out);

#endif
