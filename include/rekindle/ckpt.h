/*
 * The checkpoint store: everything a run needs to continue exactly (step, epoch, data cursor,
 * RNG states, model, optimiser and policy state, and whatever comes later), kept crash-safe in
 * one directory. The store is generic: callers hand it named tensors and byte blobs and a
 * config string; it does not know what a model is. See docs/checkpoint.md.
 *
 * Layout. One checkpoint is one safetensors file, DIR/ckpt-<step, 12 digits>.safetensors
 * (more digits past 10^12 steps), holding every item as a tensor (F32 for tensors, U8 1-D for
 * byte blobs; any safetensors dtype is accepted) and a manifest in "__metadata__":
 *
 *   format      "rekindle-ckpt-1"
 *   step epoch cursor world_size    decimal integers (cursor: samples into the epoch)
 *   config      the caller's JSON text (model name, batch, optimiser, ...)
 *   xxh64.NAME  XXH64 (seed 0) of tensor NAME's bytes, 16 lowercase hex digits
 *   xxh64.__manifest__  XXH64 over every other metadata entry and the tensor table, so a
 *               flipped byte anywhere in the header is caught too
 *
 * DIR/latest is a one-line text file naming the newest verified checkpoint file. DIR/.lock is
 * the writer's lock (rk_ckpt_lock): one job writes to a directory at a time.
 *
 * Finite values. Floating-point items (F16, BF16, F32, F64) named with a prefix of
 * rk_ckpt_finite_prefixes ("model." and "optim.": the weights and the optimiser state, by the
 * naming convention of docs/checkpoint.md) must hold only finite values. A save refuses a NaN
 * or an infinity there (RK_EINVAL naming the item and the element; nothing is written), and
 * every load checks it like a checksum (RK_EFORMAT), so a checkpoint with one is never loaded,
 * never counted as valid by retention, and skipped by the fallback. The scan shares the pass
 * over the memory with the checksum.
 *
 * Saving (rk_ckpt_save): the file is written to a temporary name, fsync'ed, renamed into
 * place and the directory fsync'ed (rekindle/fileio.h); only then is `latest` replaced the
 * same way; then retention runs. Checksums are computed from the memory the bytes are
 * streamed from; the file is not read back (that would read the page cache, not the disk).
 * A crash at any moment leaves `latest` naming a complete checkpoint (or absent before the
 * first); every load verifies every checksum.
 *
 * Saving a step again (after a resume fell back past a bad checkpoint of that step): a file
 * already at the new checkpoint's name that does not verify (or cannot be read) is evidence,
 * never replaced: just before the rename it is renamed to
 * "<name>" RK_CKPT_ASIDE_TAG "<unix seconds>" ("-<k>" appended if taken) and the directory
 * fsync'ed. Loads, retention and the temporary-file cleanup never touch such a file;
 * rk_ckpt_list_aside (`rk ckpt ls`) lists it. If it cannot be moved, the save fails
 * (RK_ESTORAGE or RK_EIO) and leaves it and `latest` as they were. A file there that verifies
 * is replaced: without a read if this process wrote or verified it and it is unchanged since
 * (same inode, size, mtime), else after one verifying read. No file there costs one lstat.
 * The asynchronous writer saves the same way.
 *
 * Retention (keep K >= 1): checkpoints with a step below the new one are verified newest
 * first; the first K-1 that verify are kept with the new one, older ones that verify are
 * deleted. A checkpoint that does not verify (nor a save over it: see Saving), a file whose
 * name is not a checkpoint name, and any checkpoint with a higher step than the new one are
 * never deleted. Temporary files left by writers that died (their pid no longer exists on
 * this host) are removed. Neither touches the lock file. One writer per directory: callers that
 * write hold rk_ckpt_lock.
 *
 * Loading verifies everything: safetensors structure, format, fields, the name's step, the
 * manifest checksum, every tensor checksum and the finite values. rk_ckpt_load_latest falls
 * back: it tries the file `latest` names, then every checkpoint from the highest step down, and
 * describes each file it skipped (file, tensor or field, why). A file that exists but cannot
 * be read (permissions, an I/O error) is not skipped: the load fails with that error, since
 * falling back past it would silently throw its steps away. Nothing that reads ever deletes
 * or rewrites.
 *
 * Errors: RK_EINVAL (bad argument), RK_ENOENT (no such directory, file or valid checkpoint),
 * RK_EFORMAT (a file is not a valid checkpoint), RK_EMISMATCH (valid, but not what the caller
 * expects: another model), RK_ESTORAGE (the storage refused: no space, read-only, permission
 * denied, an I/O error), RK_EIO (another failure to read or write), RK_ENOMEM, RK_EBUSY (another
 * job holds the directory's lock). Messages name the file, tensor or field.
 */
#ifndef REKINDLE_CKPT_H
#define REKINDLE_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/export.h"
#include "rekindle/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_CKPT_FORMAT "rekindle-ckpt-1"
#define RK_CKPT_KEEP_DEFAULT 3    /* --keep */
#define RK_CKPT_EVERY_DEFAULT 500 /* --ckpt-every, in steps */
#define RK_CKPT_NAME_MAX 64       /* room for any checkpoint file name */
#define RK_CKPT_LOCK_FILE ".lock" /* DIR/.lock: the writer's lock */
#define RK_CKPT_ASIDE_TAG ".bad-" /* a bad checkpoint moved aside: "<name>.bad-<seconds>" */

/* Name prefixes of the items whose floating-point values must be finite: {"model.", "optim.",
 * NULL}. */
RK_API extern const char *const rk_ckpt_finite_prefixes[];

/* One item to save. `dtype` NULL means "F32"; blobs are "U8" with ndim 1. `shape` may be
 * NULL when ndim is 0 (a scalar). `data` holds the product of shape times the dtype size
 * bytes, little-endian. Names are unique, non-empty UTF-8, neither "__metadata__" nor
 * "__manifest__". Store model and optimiser tensors whole (gathered), so a checkpoint from
 * 4 ranks resumes on 3. */
typedef struct rk_ckpt_item {
    const char *name;
    const char *dtype;
    int ndim;
    const int64_t *shape;
    const void *data;
} rk_ckpt_item;

/* The scalar state. step, epoch and cursor are >= 0, world_size >= 1 (informational).
 * config_json is JSON text (NULL means "{}") the store keeps verbatim; by convention an
 * object with at least "model". */
typedef struct rk_ckpt_meta {
    int64_t step, epoch, cursor;
    int world_size;
    const char *config_json;
} rk_ckpt_meta;

/* What a loader requires of a checkpoint beyond being valid. Either part may be empty. */
typedef struct rk_ckpt_expect {
    const char *config_json;   /* NULL or a JSON object: each of its keys must be in the
                                  checkpoint's config with an equal value ({"model":"mlp"}) */
    const rk_ckpt_item *items; /* each must be present with this dtype and shape; data unused */
    size_t nitems;
} rk_ckpt_expect;

/* A loaded, verified checkpoint. */
typedef struct rk_ckpt rk_ckpt;

/* ---- names ------------------------------------------------------------------------------ */

/* The file name of step `step` ("ckpt-000000000500.safetensors") into buf; RK_EINVAL if
 * step < 0 or cap is too small (RK_CKPT_NAME_MAX always suffices). */
RK_API int rk_ckpt_file_name(int64_t step, char *buf, size_t cap);

/* 1 and *step if `name` (a base name) is exactly a checkpoint file name as written by
 * rk_ckpt_file_name, else 0 (temporary files, "ckpt-5.safetensors", anything else). */
RK_API int rk_ckpt_name_step(const char *name, int64_t *step);

/* 1, the step and the unix seconds if `name` is the name a save moved a bad checkpoint aside
 * to: "<checkpoint file name>" RK_CKPT_ASIDE_TAG "<unix seconds>", optionally "-<k>" when
 * that name was taken ("ckpt-000000000006.safetensors.bad-1764590000"). Such a name is
 * neither a checkpoint name nor a temporary file's: retention and loads never touch it. */
RK_API int rk_ckpt_aside_step(const char *name, int64_t *step, int64_t *when);

/* ---- saving ----------------------------------------------------------------------------- */

/* Save `n` items and `meta` as DIR/ckpt-<step>.safetensors (creating DIR and its parents if
 * missing), point `latest` at it and apply retention with `keep` >= 1 (see above). Bad
 * arguments are RK_EINVAL, a non-finite value in a model.* or optim.* item RK_ENONFINITE
 * (the numbers went wrong: `rk train` exits as for a guard that could not recover, and `rk
 * run` relaunches from the latest good checkpoint); either changes nothing on disk; a failed write
 * (RK_EIO) leaves no file and does not move `latest`. Files retention cannot remove are retried
 * next time. Does not take the lock: the caller holds it (rk_ckpt_lock). */
RK_API int rk_ckpt_save(const char *dir, const rk_ckpt_meta *meta, const rk_ckpt_item *items,
                        size_t n, int keep, rk_err *err);

/* The exact bytes rk_ckpt_save writes, in memory: *out (free() it) of *out_len bytes. */
RK_API int rk_ckpt_encode(const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n,
                          uint8_t **out, size_t *out_len, rk_err *err);

/* ---- loading ---------------------------------------------------------------------------- */

/* Verify a checkpoint held in memory (copied). `name` labels messages and, when its base
 * name is a checkpoint file name, must agree with the step inside. On success *out (if not
 * NULL) holds the checkpoint; free it with rk_ckpt_free. RK_EFORMAT for any defect. */
RK_API int rk_ckpt_parse(const uint8_t *buf, size_t len, const char *name, rk_ckpt **out,
                         rk_err *err);

/* Read and verify one checkpoint file (rk_ckpt_parse on its bytes). RK_ENOENT if absent. */
RK_API int rk_ckpt_load_file(const char *path, rk_ckpt **out, rk_err *err);

/* rk_ckpt_load_file without keeping the result: 0 only if every check passes. */
RK_API int rk_ckpt_verify_file(const char *path, rk_err *err);

/* Load DIR's checkpoint of exactly `step` (no fallback). */
RK_API int rk_ckpt_load_step(const char *dir, int64_t step, rk_ckpt **out, rk_err *err);

/* Load the newest usable checkpoint of DIR: the one `latest` names, else (latest missing,
 * malformed, naming a bad or absent file) the highest step that verifies. With `expect`
 * (may be NULL), a checkpoint that does not meet it is skipped too. Each skipped file, and
 * each problem with `latest`, is one line in `report` (NUL-terminated, cut to report_len;
 * may be NULL): "<path>: <why>", naming the tensor or field. RK_ENOENT if DIR is missing or
 * holds no usable checkpoint. A checkpoint or `latest` that exists but cannot be read
 * (RK_ESTORAGE: permissions, an I/O error; RK_EIO; RK_ENOMEM) ends the search with that error: it
 * is never treated as absent. Never deletes or changes anything. */
RK_API int rk_ckpt_load_latest(const char *dir, const rk_ckpt_expect *expect, rk_ckpt **out,
                               char *report, size_t report_len, rk_err *err);

/* RK_EMISMATCH with a message naming the config key or tensor if `c` does not meet `e`. */
RK_API int rk_ckpt_check(const rk_ckpt *c, const rk_ckpt_expect *e, rk_err *err);

RK_API const rk_ckpt_meta *rk_ckpt_meta_of(const rk_ckpt *c);
RK_API const char *rk_ckpt_path(const rk_ckpt *c); /* the name it was loaded or parsed under */
/* The tensor called `name`, or NULL. Tensors lie back to back, so `data` may be unaligned
 * for its dtype: copy it with memcpy or rk_st_load_f32(rk_ckpt_file(c), ...). */
RK_API const rk_st_tensor *rk_ckpt_find(const rk_ckpt *c, const char *name);
/* Every tensor, in the order saved, with the manifest as metadata. */
RK_API const rk_st_file *rk_ckpt_file(const rk_ckpt *c);
RK_API void rk_ckpt_free(rk_ckpt *c); /* NULL-safe */

/* ---- the directory ---------------------------------------------------------------------- */

/* The file name `latest` points to, into name[cap]. RK_ENOENT if there is no `latest`,
 * RK_EFORMAT if it is empty or not one checkpoint file name. Does not check that file. */
RK_API int rk_ckpt_read_latest(const char *dir, char *name, size_t cap, rk_err *err);

typedef struct rk_ckpt_info {
    char file[RK_CKPT_NAME_MAX];  /* base name */
    int64_t step;                 /* from the name */
    int64_t epoch, cursor;        /* from the manifest; -1 when not valid */
    int world_size;               /* 0 when not valid */
    int valid;                    /* every check passed */
    int unreadable;               /* exists but cannot be read (permissions, I/O): not a
                                     checkpoint a load skips (see rk_ckpt_load_latest) */
    int latest;                   /* `latest` names this file */
    char problem[RK_ERR_MSG_MAX]; /* why not valid; "" when valid */
    uint64_t bytes;
} rk_ckpt_info;

/* Every checkpoint file of DIR, ascending by step, each fully verified: *items (free() it)
 * of *n. *ntemp (may be NULL) counts leftover temporary files, which are not checkpoints.
 * RK_ENOENT if DIR does not exist. */
RK_API int rk_ckpt_list(const char *dir, rk_ckpt_info **items, size_t *n, size_t *ntemp,
                        rk_err *err);

/* A bad checkpoint a save moved aside (see Saving above). */
typedef struct rk_ckpt_aside {
    char file[RK_CKPT_NAME_MAX + 32]; /* base name, "ckpt-<step>.safetensors.bad-<seconds>" */
    int64_t step;                     /* of the checkpoint it was */
    int64_t when;                     /* unix seconds it was moved aside */
    uint64_t bytes;
} rk_ckpt_aside;

/* Every file of DIR a save moved aside, ascending by step then name: *items (free() it) of
 * *n. Not verified (they did not verify when moved). RK_ENOENT if DIR does not exist. */
RK_API int rk_ckpt_list_aside(const char *dir, rk_ckpt_aside **items, size_t *n, rk_err *err);

/* ---- the writer's lock ------------------------------------------------------------------ */

/* One writer per directory. rk_ckpt_lock creates DIR (and its parents) if missing, opens
 * DIR/.lock (created 0644, O_CLOEXEC: no child process inherits it) and takes an exclusive
 * flock on it without waiting; then writes this process's pid into the file for messages.
 * The kernel releases the lock when the holder closes it or dies in any way (SIGKILL
 * included), so a stale lock file never blocks the next job. Another holder: RK_EBUSY, a
 * message naming its pid, and the pid in *holder (may be NULL; 0 when not written yet).
 * Other errors: RK_EIO (cannot create or lock the file), RK_ENOENT, RK_ENOMEM.
 *
 * Who holds it: `rk run` for its whole job (its workers, which see RK_HEARTBEAT, do not), a
 * standalone `rk train --ckpt-dir` (rank 0). Reading (rk_ckpt_load_*, rk_ckpt_list, `rk ckpt`)
 * needs no lock. Locks are per open file: a second rk_ckpt_lock of the same directory in the
 * same process is refused too. Not thread-safe against itself for one handle. */
typedef struct rk_ckpt_lockfile rk_ckpt_lockfile;

RK_API int rk_ckpt_lock(const char *dir, rk_ckpt_lockfile **out, long *holder, rk_err *err);

/* Release the lock (closes the file; the lock file stays in DIR). NULL-safe. */
RK_API void rk_ckpt_unlock(rk_ckpt_lockfile *l);

/* 1 if DIR looks like a checkpoint store: it holds `latest`, the lock file or a file with a
 * checkpoint name (or its temporary file, or a moved-aside one). 0 otherwise, or if DIR
 * cannot be listed. */
RK_API int rk_ckpt_is_store(const char *dir);

/* ---- interval --------------------------------------------------------------------------- */

/* Optimum compute time between checkpoints, in seconds, for a save cost C and a mean time
 * between failures M (seconds, both > 0 and finite; otherwise NAN).
 *   Young (1974):  T = sqrt(2 C M)
 *   Daly (2006):   T = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C   if C < 2M
 *                  T = M                                                       if C >= 2M
 * `--ckpt-every auto` uses Daly's. */
RK_API double rk_ckpt_interval_young(double save_cost_s, double mtbf_s);
RK_API double rk_ckpt_interval_daly(double save_cost_s, double mtbf_s);

/* Daly's interval in steps of `step_s` seconds, rounded to nearest, at least 1; 0 if an
 * argument is not positive and finite (keep the current interval then). */
RK_API int64_t rk_ckpt_auto_steps(double save_cost_s, double mtbf_s, double step_s);

/* Parse a --ckpt-every value: a step count >= 1, or "auto" (*steps = 0). RK_EINVAL else. */
RK_API int rk_ckpt_every_parse(const char *text, int64_t *steps, rk_err *err);

/* ---- asynchronous writer ---------------------------------------------------------------- */

/* Saves in a background thread. submit() copies the items at a step boundary (the caller may
 * change its buffers as soon as it returns) and starts rk_ckpt_save in a thread; at most one
 * write is in flight: submit() first waits for the previous one. */
typedef struct rk_ckpt_writer rk_ckpt_writer;

RK_API int rk_ckpt_writer_create(rk_ckpt_writer **out, const char *dir, int keep, rk_err *err);

/* If the previous write failed, returns its error (consumed: the next submit proceeds) and
 * takes no snapshot. Otherwise snapshots and starts the write; RK_ENOMEM if the copy does
 * not fit, RK_EIO if no thread can be started (nothing is written then). */
RK_API int rk_ckpt_writer_submit(rk_ckpt_writer *w, const rk_ckpt_meta *meta,
                                 const rk_ckpt_item *items, size_t n, rk_err *err);

/* Wait for the write in flight (if any) and return its result (consumed). The seconds the
 * last finished write took, snapshot excluded, go to *last_save_seconds (may be NULL; 0 if
 * none finished yet): the save cost for rk_ckpt_auto_steps. */
RK_API int rk_ckpt_writer_wait(rk_ckpt_writer *w, double *last_save_seconds, rk_err *err);

/* 1 while a write is in flight (never blocks). */
RK_API int rk_ckpt_writer_busy(rk_ckpt_writer *w);

/* Wait for the write in flight (its error is dropped: call wait first to see it) and free. */
RK_API void rk_ckpt_writer_free(rk_ckpt_writer *w);

#ifdef __cplusplus
}
#endif
#endif
