/*
 * Crash-safe file writes, and the one bounded opener every file reader uses.
 *
 * An atomic write never leaves a torn file at its target path: the bytes go to a temporary
 * file in the same directory (`<path>.tmp.<pid>.<n>`, created with O_EXCL, mode 0644), which
 * is fsync'ed, renamed over the target, and then the directory is fsync'ed so the rename
 * itself survives a power loss. Until the rename the target keeps its old content (or stays
 * absent); on any failure the temporary file is removed.
 *
 *     rk_afile *f;
 *     if (rk_afile_open(&f, "model.safetensors", &err) < 0) return err.code;
 *     if (rk_afile_write(f, hdr, hdr_len, &err) < 0 || rk_afile_write(f, data, n, &err) < 0) {
 *         rk_afile_abort(f);
 *         return err.code;
 *     }
 *     return rk_afile_commit(f, &err);   (frees f whatever happens)
 *
 * Errors: RK_EINVAL (bad argument), RK_ENOENT (the directory or file does not exist),
 * RK_EIO (open, write, fsync, close or rename failed), RK_ENOMEM, RK_EFORMAT (a file to read
 * is larger than the caller allows), RK_EINVAL (a file to read is not a regular file).
 * Messages name the path and the failing call.
 */
#ifndef REKINDLE_FILEIO_H
#define REKINDLE_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An atomic write in progress: an open temporary file beside its target path. */
typedef struct rk_afile rk_afile;

/* Create the temporary file for an atomic write of `path`. On success *out owns it and must
 * be finished with rk_afile_commit or rk_afile_abort. On failure *out is NULL and nothing
 * was created. A missing directory gives RK_ENOENT. */
RK_API int rk_afile_open(rk_afile **out, const char *path, rk_err *err);

/* Append `len` bytes (short writes and EINTR are retried). On Linux, writeback starts every
 * 4 MiB, and once more than 32 MiB are in flight the oldest pieces are waited for and dropped
 * from the page cache, so a large write reuses a bounded set of pages (a write-back error
 * found then fails this call). After a failure the file is marked failed: further writes and
 * rk_afile_commit fail; call rk_afile_abort. */
RK_API int rk_afile_write(rk_afile *f, const void *buf, size_t len, rk_err *err);

/* Overwrite `len` bytes at `offset` of what was already appended (a header written last, once
 * its checksums are known). The range must lie within the bytes written so far: RK_EINVAL
 * otherwise. Failures mark the file failed, as for rk_afile_write. */
RK_API int rk_afile_pwrite(rk_afile *f, const void *buf, size_t len, uint64_t offset, rk_err *err);

/* fsync and close the temporary file, rename it over the target, fsync the directory.
 * Always frees `f`. On failure before the rename the target is unchanged and the temporary
 * file is removed; if only the final directory fsync fails, the target already holds the new
 * content and RK_EIO says so. */
RK_API int rk_afile_commit(rk_afile *f, rk_err *err);

/* Close and remove the temporary file, leaving the target untouched; frees `f`. NULL-safe. */
RK_API void rk_afile_abort(rk_afile *f);

/* The target path of an atomic write in progress. */
RK_API const char *rk_afile_path(const rk_afile *f);

/* Atomically replace `path` with `len` bytes from `buf` (open + write + commit). */
RK_API int rk_file_write_atomic(const char *path, const void *buf, size_t len, rk_err *err);

/* ---- reading a file a user named -----------------------------------------------------------
 *
 * Every reader of a file opens it here, so that each one refuses the same things the same way:
 * the file is opened with O_NONBLOCK | O_NOCTTY | O_CLOEXEC (a FIFO without a writer does not
 * hang the open, a terminal is never adopted), and anything but a regular file (a FIFO, a
 * device such as /dev/zero, a directory, a socket) is RK_EINVAL, "<path>: is a FIFO, not a
 * regular file", before a byte is read. A file larger than the caller's `max_len` is
 * RK_EFORMAT, decided from fstat before reading. Messages name the path and never quote the
 * file's content. */

/* What a file of mode `m` is, for messages: "a directory", "a FIFO", "a character device",
 * ... ("a regular file" for one). Every "not a regular file" message uses it. */
RK_API const char *rk_file_kind_name(mode_t m);

/* Open `path` for reading as above. On success *fd is the open descriptor (close it) and
 * *size (may be NULL) the file's size from fstat. On failure *fd is -1: RK_ENOENT (missing),
 * RK_EINVAL (not a regular file), RK_EFORMAT (more than max_len bytes; SIZE_MAX: no limit),
 * RK_EIO (cannot open, e.g. permissions). */
RK_API int rk_file_open_read(const char *path, size_t max_len, int *fd, uint64_t *size,
                             rk_err *err);

/* The same for the entry `name` (no '/') of the directory open as `dirfd`, and never through
 * a symbolic link (O_NOFOLLOW: a link is RK_EINVAL, "is a symbolic link"). `label` (NULL:
 * name) is what messages call the file. */
RK_API int rk_file_openat_read(int dirfd, const char *name, const char *label, size_t max_len,
                               int *fd, uint64_t *size, rk_err *err);

/* rk_file_openat_read for a whole path: its directory is opened (following links, as any
 * path is) and its last component never through a symbolic link. For files that rekindle
 * also replaces by rename (a link there would be read but never written). `label` (NULL:
 * path) is what messages call the file. Errors as rk_file_openat_read's, and RK_EINVAL for a
 * path of PATH_MAX bytes or more. */
RK_API int rk_file_open_read_nofollow(const char *path, const char *label, size_t max_len, int *fd,
                                      uint64_t *size, rk_err *err);

/* Read exactly `n` bytes from `fd` (short reads and EINTR retried). A file that ends first is
 * RK_EFORMAT ("file ended after K of N bytes"), a failed read RK_EIO; `path` names it. */
RK_API int rk_file_read_exact(int fd, void *buf, size_t n, const char *path, rk_err *err);

/* Read the rest of `fd` (opened by rk_file_open_read, whose size is `size_hint`) into a new
 * buffer as rk_file_read_all does; the descriptor stays open. */
RK_API int rk_file_read_fd(int fd, const char *path, size_t max_len, uint64_t size_hint,
                           uint8_t **buf, size_t *len, rk_err *err);

/* Read a whole file (opened with rk_file_open_read) into a new buffer (*buf, free() it) of
 * *len bytes. The buffer has one extra NUL byte after the data (not counted in *len) so text
 * can be parsed in place. Errors as for rk_file_open_read, plus RK_EFORMAT if the file grows
 * past `max_len` while being read and RK_EIO if a read fails. On failure *buf is NULL and
 * *len is 0. */
RK_API int rk_file_read_all(const char *path, uint8_t **buf, size_t *len, size_t max_len,
                            rk_err *err);

/* fsync a directory so that creations and renames inside it are durable. Filesystems that
 * cannot fsync a directory (EINVAL) are accepted. RK_ENOENT if it does not exist. */
RK_API int rk_fsync_dir(const char *dir, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
