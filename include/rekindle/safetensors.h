/*
 * The safetensors layout: how rekindle stores model weights (and checkpoint tensors) so that
 * Python's `safetensors` package reads them unchanged. See docs/safetensors.md.
 *
 *   u64 little-endian N | N bytes of JSON header, space-padded | data section
 *
 * The header maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}
 * (offsets relative to the data section) plus an optional "__metadata__": {string: string}.
 * Tensors are little-endian, C order, contiguous, in the order given, with no holes. Writers
 * pad N to a multiple of 8 so the data section starts 8-byte aligned.
 *
 * Writing goes through the atomic writer (rekindle/fileio.h): a crash never leaves a torn file
 * at the target path. Reading validates every field strictly; a bad file gives RK_EFORMAT and
 * a one-line message naming the file, the tensor or field, and the problem.
 */
#ifndef REKINDLE_SAFETENSORS_H
#define REKINDLE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_ST_MAX_DIMS 8
#define RK_ST_MAX_HEADER 100000000u /* bytes of JSON header, as in the Python package */

/* One tensor to write. `dtype` NULL means "F32"; other names: F64 F16 BF16 I64 I32 I16 I8
 * U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2. `data` holds numel * dtype-size bytes in host order
 * (little-endian hosts only) and may be NULL when numel is 0. `shape` may be NULL when
 * ndim is 0 (a scalar, one element). Names are UTF-8, unique and not "__metadata__". */
typedef struct rk_st_entry {
    const char *name;
    const void *data;
    int ndim;
    const int64_t *shape;
    const char *dtype;
} rk_st_entry;

/* Atomically write `n` tensors, in order, to `path`. `meta` is NULL or a NULL-terminated
 * list of key, value strings stored in "__metadata__" (keys unique). RK_EINVAL for bad
 * entries (nothing is written then); I/O errors as in rekindle/fileio.h. */
RK_API int rk_st_write(const char *path, const rk_st_entry *t, size_t n, const char *const *meta,
                       rk_err *err);

/* Only the file's first part: the 8-byte length and the padded JSON header that rk_st_write
 * would write for these entries; the tensors' bytes follow it in entry order. *hdr (free()
 * it) has *hdr_len bytes; *data_len is the size of the data section. For writers that stream
 * the data themselves. */
RK_API int rk_st_header(const rk_st_entry *t, size_t n, const char *const *meta, uint8_t **hdr,
                        size_t *hdr_len, size_t *data_len, rk_err *err);

/* The same file as rk_st_write, built in memory: *out (free() it) of *out_len bytes. */
RK_API int rk_st_encode(const rk_st_entry *t, size_t n, const char *const *meta, uint8_t **out,
                        size_t *out_len, rk_err *err);

typedef struct rk_st_tensor {
    char *name;
    char dtype[8]; /* "F32", ... NUL-terminated */
    int ndim;
    int64_t shape[RK_ST_MAX_DIMS];
    size_t numel;        /* product of shape (1 for a scalar) */
    size_t nbytes;       /* numel * dtype size */
    size_t offset;       /* begin, relative to the data section */
    const uint8_t *data; /* points into rk_st_file.buf; may be unaligned for other writers'
                            files: copy with memcpy or rk_st_load_f32 */
} rk_st_tensor;

typedef struct rk_st_file {
    char *name;   /* file name used in messages */
    uint8_t *buf; /* the whole file (owned) */
    size_t len;
    size_t data_start;     /* 8 + header length */
    rk_st_tensor *tensors; /* in data-section order, which is the order they were written */
    size_t ntensors;
    char **meta_keys; /* "__metadata__", in header order */
    char **meta_vals;
    size_t nmeta;
} rk_st_file;

/* Parse and validate a safetensors file held in memory (copied; `buf` is not kept). `name`
 * labels messages (NULL: "<memory>"). On failure *out is zeroed and needs no rk_st_free. */
RK_API int rk_st_parse(const uint8_t *buf, size_t len, const char *name, rk_st_file *out,
                       rk_err *err);

/* Read and validate `path`. RK_ENOENT if it does not exist, RK_EFORMAT if malformed. */
RK_API int rk_st_read(const char *path, rk_st_file *out, rk_err *err);

/* rk_st_read of an open descriptor `fd` of a regular file of `size` bytes (fstat's, checked by
 * the caller's bounded open: rk_file_open_read, rk_file_openat_read), read from its current
 * offset, header first, the data straight into the one buffer kept. `name` labels messages.
 * The descriptor stays open. */
RK_API int rk_st_read_fd(int fd, const char *name, uint64_t size, rk_st_file *out, rk_err *err);

/* The tensor called `name`, or NULL. */
RK_API const rk_st_tensor *rk_st_find(const rk_st_file *f, const char *name);

/* The metadata value for `key`, or NULL. */
RK_API const char *rk_st_meta(const rk_st_file *f, const char *key);

/* The index of the first element of `nbytes` bytes of `dtype` data (little-endian, possibly
 * unaligned) that is NaN or infinite, or SIZE_MAX when every element is finite or the dtype is
 * not floating point (only F16, BF16, F32 and F64 are scanned). Reads at memory speed. */
RK_API size_t rk_st_find_nonfinite(const char *dtype, const void *data, size_t nbytes);

/* "NaN", "+inf" or "-inf" for that element (what rk_st_find_nonfinite found). */
RK_API const char *rk_st_nonfinite_name(const char *dtype, const void *data, size_t index);

/* Copy the tensor `name` into `dst` (room for the product of `shape` times the dtype's size)
 * after checking that it exists (RK_ENOENT), has dtype `dtype` ("F64", "I64", ...) and
 * exactly this shape (RK_EMISMATCH; ndim 0 is a scalar, shape may then be NULL). */
RK_API int rk_st_load(const rk_st_file *f, const char *name, const char *dtype, int ndim,
                      const int64_t *shape, void *dst, rk_err *err);

/* rk_st_load of an F32 tensor. */
RK_API int rk_st_load_f32(const rk_st_file *f, const char *name, int ndim, const int64_t *shape,
                          float *dst, rk_err *err);

/* Free everything a successful parse or read allocated and zero *f. NULL-safe. */
RK_API void rk_st_free(rk_st_file *f);

/* Bytes per element of a dtype name, or 0 if rekindle does not know it. */
RK_API size_t rk_st_dtype_size(const char *dtype);

#ifdef __cplusplus
}
#endif
#endif
