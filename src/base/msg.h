/*
 * Inside librekindle: the helpers every module uses to build its one-line error messages
 * (rekindle/error.h) from untrusted text. Not part of the public API.
 */
#ifndef RK_BASE_MSG_H
#define RK_BASE_MSG_H

#include <stddef.h>

#include "base/text.h" /* rk_msg_show, the message sanitiser */
#include "rekindle/error.h"

/* rk_err_set with the message cleaned as rk_text_clean (control characters and bytes that are
 * not UTF-8 become '?'), so it stays one line even when a path or a library's message holds a
 * newline. */
__attribute__((format(printf, 3, 4))) int rk_err_set_line(rk_err *err, int code, const char *fmt,
                                                          ...);

/* A parser's own error text (jansson's json_error_t.text) for a message, without the part
 * that quotes the input it stopped at (" near '<bytes>'"): a message names where and what,
 * never the content of a file the process read. Returns dst. */
const char *rk_msg_parser_text(char *dst, size_t cap, const char *text);

/* The RK_E* code for a failed call's errno `e`: ENOENT, ENOTDIR -> RK_ENOENT; ENOMEM ->
 * RK_ENOMEM; ENOSPC, EDQUOT, EROFS, EACCES, EPERM, EIO (the storage refused) -> RK_ESTORAGE;
 * anything else -> RK_EIO. */
int rk_err_code_errno(int e);

/* strerror(e) into buf[cap], thread-safe ("errno N" if unknown). Returns buf. */
const char *rk_msg_strerror(int e, char *buf, size_t cap);

#endif
