/*
 * Inside librekindle: the burn-in state file (docs/burn.md, "The state file"). `rk burn`
 * writes one record per GPU, keyed by the card's serial (its UUID when it reports no
 * serial); the health layer reads it back so that rk doctor, rk exporter and rk run's gate
 * see the last verdict of every card. Not part of the public API.
 *
 * The file is JSON: {"format": "rekindle-burn-state", "version": 1, "gpus": {KEY: RECORD}}.
 * Its one reader and one writer are here:
 *
 *   - rk_burn_state_load reads it through the bounded opener (rekindle/fileio.h): a regular
 *     file, never through a symbolic link at its own name (the writer replaces the link, not
 *     what it points to, so a link would be read but never written), at most
 *     RK_BURN_STATE_MAX bytes, every field checked; a file that is missing is an empty state.
 *     Bad files are RK_EFORMAT (or the opener's RK_EINVAL for a non-regular file or a link)
 *     with a message that names the file, the record and the field.
 *   - rk_burn_state_put takes a lock (flock on PATH.lock, beside the file), reads the file as
 *     the reader does, replaces or adds the record with the same key and writes the whole
 *     file again atomically (rk_file_write_atomic: temporary file, fsync, rename, directory
 *     fsync). An existing file that does not load is never overwritten: the reader's error is
 *     returned with the file named, and the file stays as it was.
 *
 * Thread-safety: a loaded state is read-only and may be shared; rk_burn_state_put may be
 * called from any number of threads and processes at once (each holds the lock in turn).
 */
#ifndef RK_HEALTH_BURNSTATE_H
#define RK_HEALTH_BURNSTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

typedef struct rk_burn_record {
    char key[96];  /* the GPU's serial, or its UUID when it has no serial */
    char name[96]; /* model name */
    double when;   /* seconds since the epoch, end of the burn */
    double duration_s;
    bool ok;          /* verdict */
    char failed[160]; /* what failed, "" when ok: "sgemm: 12 elements wrong in copies 3,7" */
    double gflops;    /* measured SGEMM rate, 0 unknown */
    uint64_t wrong_elements, bad_addresses;
} rk_burn_record;

typedef struct rk_burn_state rk_burn_state;

#define RK_BURN_STATE_ENV "RK_BURN_STATE" /* override of the path */
#define RK_BURN_STATE_DEFAULT "/var/lib/rekindle/burn.json"
#define RK_BURN_STATE_FORMAT "rekindle-burn-state" /* the file's "format" */
#define RK_BURN_STATE_VERSION 1                    /* the file's "version" */
#define RK_BURN_STATE_MAX ((size_t)1 << 20)        /* largest file read: 1 MiB */
#define RK_BURN_STATE_RECORDS_MAX 4096             /* most records in one file */
/* How long rk_burn_state_put waits for another writer's lock before RK_EBUSY. */
#define RK_BURN_STATE_LOCK_WAIT_S 30.0

/* The state file's path: the RK_BURN_STATE environment variable when set and not empty (and
 * the process is not privileged: base/env.h), else RK_BURN_STATE_DEFAULT. */
const char *rk_burn_state_path(void);

/* Read the state file at `path` into *out (free with rk_burn_state_free). A file that does
 * not exist is an empty state and RK_OK (a missing directory too). Errors (*out NULL):
 * RK_EINVAL (no path; not a regular file; a symbolic link), RK_EFORMAT (more than
 * RK_BURN_STATE_MAX bytes, not JSON, a field missing, of the wrong type or out of range, a
 * key twice, an unknown field, another format or version), RK_EIO (cannot be read),
 * RK_ENOMEM. */
int rk_burn_state_load(const char *path, rk_burn_state **out, rk_err *err);

/* The same from len bytes of text, `file` naming it in messages (NULL: "burn state"); the
 * reader's checks after the opener's. What fuzz_burnstate drives. */
int rk_burn_state_parse(const char *file, const char *text, size_t len, rk_burn_state **out,
                        rk_err *err);

/* NULL-safe. */
void rk_burn_state_free(rk_burn_state *s);

/* The record of the GPU with this serial, else the one keyed by its UUID; NULL when neither
 * is there (or s is NULL). serial or uuid may be NULL or "" (not looked up then). The
 * record lives as long as s. */
const rk_burn_record *rk_burn_state_find(const rk_burn_state *s, const char *serial,
                                         const char *uuid);

/* The number of records, and record i (0 <= i < count; NULL otherwise) in key order. */
int rk_burn_state_count(const rk_burn_state *s);
const rk_burn_record *rk_burn_state_at(const rk_burn_state *s, int i);

/* Check a record as the reader checks one: key 1..95 bytes, name and failed fit their
 * arrays, all three UTF-8 without control characters; when, duration_s and gflops finite and
 * >= 0; counts at most INT64_MAX; ok with failed "", not ok with failed saying what. RK_EINVAL
 * naming the field otherwise (`what` heads the message; NULL: "burn record"). */
int rk_burn_record_check(const rk_burn_record *r, const char *what, rk_err *err);

/* Write record r into the state file at `path`, replacing the record with the same key, as
 * the header says (locked, read-modify-write, atomic replace). The directory of path is
 * created (one level, mode 0755) when it is missing. Errors: RK_EINVAL (a bad record or
 * path), the reader's errors for an existing file that does not load (nothing is written
 * then), RK_EBUSY (another writer held the lock for RK_BURN_STATE_LOCK_WAIT_S), RK_EIO or
 * RK_ESTORAGE (the lock, the write or the rename failed; the old file stays), RK_ENOMEM. */
int rk_burn_state_put(const char *path, const rk_burn_record *r, rk_err *err);

#endif
