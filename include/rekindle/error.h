/*
 * rekindle error codes and messages.
 *
 * Every library function that can fail returns an int: 0 (RK_OK) on success or a negative
 * RK_E* code. Functions that can say more take an `rk_err *` (which may be NULL) and fill it
 * with a one-line message naming the file, field and problem. Library code never prints and
 * never exits; the caller decides what to show. rk_strerror() names a bare code.
 */
#ifndef REKINDLE_ERROR_H
#define REKINDLE_ERROR_H

#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    RK_OK = 0,
    RK_EINVAL = -1,     /* bad argument or usage */
    RK_EIO = -2,        /* a read, write, fsync or rename failed */
    RK_ENOMEM = -3,     /* allocation failed */
    RK_EFORMAT = -4,    /* input data is malformed (bad magic, truncated, wrong shape) */
    RK_EBACKEND = -5,   /* a compute backend (oneDNN, BLAS, CUDA) reported a failure */
    RK_ENOTSUP = -6,    /* not supported on this build or device */
    RK_ENOENT = -7,     /* a file or item does not exist */
    RK_EMISMATCH = -8,  /* data is valid but does not fit (another model, other shapes) */
    RK_ECOMM = -9,      /* a collective or the link under it failed */
    RK_ESTOPPED = -10,  /* stopped on request (a supervisor's stop command); state was saved */
    RK_EGUARD = -11,    /* a step guard found a fault it could not recover from in-process */
    RK_ESTORAGE = -12,  /* the storage refused: no space or quota left, read-only, permission
                         * denied, or the disk reported an I/O error (ENOSPC, EDQUOT, EROFS,
                         * EACCES, EPERM, EIO); a kind of RK_EIO that no retry elsewhere fixes */
    RK_EBUSY = -13,     /* held by another process (a checkpoint directory's writer lock) */
    RK_ENONFINITE = -14 /* weights or optimiser state hold NaN or infinity: the numbers went
                         * wrong (a fault), the store refused to keep them */
};

#define RK_ERR_MSG_MAX 512

typedef struct rk_err {
    int code;                 /* last RK_E* code, RK_OK if none */
    char msg[RK_ERR_MSG_MAX]; /* one line, no trailing newline */
} rk_err;

/* A short, static description of a code ("malformed input", ...). */
RK_API const char *rk_strerror(int code);

/* Fill `err` (if not NULL) with code and a printf-style message; returns `code`. */
RK_API int rk_err_set(rk_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clear `err` to RK_OK with an empty message. */
RK_API void rk_err_clear(rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
