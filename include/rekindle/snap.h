/*
 * The node's snapshot store: a rank's state in memory that outlives the rank's process. A
 * snapshot is a checkpoint of one rank (rekindle/ckpt.h: the same safetensors file, the same
 * per-tensor XXH64 checksums and manifest checksum, the same finite-values rule) kept in a
 * tmpfs (/dev/shm) instead of on disk, so a relaunched or surviving rank restores from memory.
 * See docs/recovery.md ("Snapshots in memory").
 *
 * Layout. A job's snapshot directory (rk_snap_dir_make: PARENT/rk-snap-XXXXXX, made with
 * mkdtemp, mode 0700, owned by the job's user) holds one subdirectory per rank, rank-<R>
 * (decimal, 0700), and in it at most two generations:
 *
 *   DIR/rank-3/snap-000000000120.safetensors     the newest complete generation
 *   DIR/rank-3/snap-000000000119.safetensors     the one before it
 *   DIR/rank-3/snap-000000000121.safetensors.tmp.<pid>.<n>   a copy in flight (or torn)
 *   DIR/rank-3/pin-000000000100.safetensors      a pinned generation (rk_snap_pin)
 *   DIR/held/rank-5/snap-000000000100.safetensors   another host's rank, held for it
 *
 * Pins. Besides its two rolling generations a rank keeps at most RK_SNAP_PINS pinned ones,
 * pin-<step>: a hard link to what was generation `step` (rk_snap_pin; no copy), so a step the
 * node's agent copies to a partner host (docs/recovery.md "Partner copies on another host")
 * stays held here after the generations rolled past it. A pin is a generation for every reader
 * (rk_snap_steps, rk_snap_get, rk_snap_agree: the same checks) and takes no memory of its own
 * while its generation is still there (rk_snap_bytes counts each file once). A generation is
 * written over in place only when it has no other link (retention below), so a pin's bytes
 * never change. DIR/held holds the copies this host keeps for another host's ranks, in the
 * same layout (rank-<R>/snap-<step>) and under the same rules (rk_snap_held_dir; the receive
 * calls below with dir = DIR/held).
 *
 * The caller that makes the directory (later: rk run or the node agent) owns it, passes it to
 * the ranks as RK_SNAP_DIR, and removes it (rk_snap_dir_remove) when the job ends. Every call
 * checks that the directory and the rank's directory are directories (not symbolic links),
 * mode 0700 and owned by this process's effective user: RK_EINVAL naming the path otherwise.
 *
 * Putting (rk_snap_put): the generation is written to a temporary file in the rank's
 * directory (O_EXCL, 0600, O_CLOEXEC; no fsync: it is memory) and renamed into place, so a
 * rank killed mid-copy leaves only a temporary file, never a generation. Double-buffered: the
 * previous generation stays complete until the new one is renamed. Retention keeps the new
 * generation and the newest one below it; every other generation of the rank is deleted
 * (before the copy, so that at most two generations of a rank ever take memory, a copy in
 * flight counted), those above the new step too: they belong to a timeline that was rolled
 * back. Pins above the new step go for the same reason; other pins stay. The dropped generation
 * is recycled (renamed to the copy's temporary file and written over) only when it has one
 * link; a pinned one is unlinked instead (its pin keeps the bytes) and the copy is a new file.
 * Temporary files of writers that died (their pid no longer exists on this host) are
 * removed. One writer per rank directory: the rank itself.
 *
 * Two generations suffice when ranks step together: a rank does not start the copy of step
 * s+1 before every rank has finished its copy of step s (true when the copy happens between a
 * step's collectives and the next step's), so at any moment the ranks share a complete step.
 *
 * Reading verifies everything (rk_ckpt_parse: structure, every checksum, finite values) and
 * that the step inside is the name's. A generation is opened without following a symbolic
 * link and must be a regular file; its size from fstat bounds the read. A generation that does
 * not verify is never returned: RK_EFORMAT naming the file and the tensor or field. Nothing
 * that reads deletes or changes anything.
 *
 * Errors: RK_EINVAL (bad argument; a directory that is not one, not 0700 or not ours; a
 * generation that is not a regular file), RK_ENOENT (no such directory or generation, no
 * agreed step), RK_EFORMAT (a generation does not verify), RK_ENONFINITE (a put refused a NaN
 * or an infinity in a model.* or optim.* item: nothing written), RK_ESTORAGE (the tmpfs is
 * full or refused), RK_EIO, RK_ENOMEM. Messages name the file. Thread-safety: calls on
 * different ranks' directories may run concurrently; one rank's puts are its own.
 */
#ifndef REKINDLE_SNAP_H
#define REKINDLE_SNAP_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/ckpt.h"
#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_SNAP_PARENT_DEFAULT "/dev/shm"       /* where rk_snap_dir_make makes the directory */
#define RK_SNAP_DIR_ENV "RK_SNAP_DIR"           /* how a rank is told its job's directory */
#define RK_SNAP_DIR_PREFIX "rk-snap-"           /* PARENT/rk-snap-XXXXXX */
#define RK_SNAP_KEEP 2                          /* generations per rank */
#define RK_SNAP_PINS 2                          /* pinned generations per rank (rk_snap_pin) */
#define RK_SNAP_HELD_NAME "held"                /* DIR/held: copies kept for another host */
#define RK_SNAP_PATH_MAX 4096                   /* room for any directory rk_snap_dir_make makes */
#define RK_SNAP_MARGIN_MIN ((uint64_t)64 << 20) /* rk_snap_room: at least 64 MiB left free */
#define RK_SNAP_MARGIN_DIV 10                   /* ... and at least a tenth of the tmpfs */
/* The steps a rank may hold in all: its generations and its pins. */
#define RK_SNAP_HELD_MAX (RK_SNAP_KEEP + RK_SNAP_PINS)
/* RK_SNAP_PIN_EVERY=M: the worker runtime pins the first put at or past each multiple of M
 * (0 or unset: no pins). */
#define RK_SNAP_PIN_EVERY_ENV "RK_SNAP_PIN_EVERY"
/* For tests only: rk_snap_room takes this many bytes (decimal) as /proc/meminfo's MemAvailable,
 * so a test can make RAM short without filling it. */
#define RK_SNAP_MEMAVAIL_ENV "RK_SNAP_MEMAVAIL_BYTES"

/* ---- names ------------------------------------------------------------------------------ */

/* The file name of generation `step` ("snap-000000000120.safetensors", the store's layout of
 * ckpt-<step>.safetensors) into buf; RK_EINVAL if step < 0 or cap is too small
 * (RK_CKPT_NAME_MAX always suffices). */
RK_API int rk_snap_file_name(int64_t step, char *buf, size_t cap);

/* 1 and *step (may be NULL) if `name` is exactly a generation's name as rk_snap_file_name
 * writes it, else 0 (temporary files, "snap-5.safetensors", checkpoint names, anything else). */
RK_API int rk_snap_name_step(const char *name, int64_t *step);

/* The same for a pinned generation: "pin-000000000120.safetensors" (rk_snap_pin). */
RK_API int rk_snap_pin_name(int64_t step, char *buf, size_t cap);
RK_API int rk_snap_pin_name_step(const char *name, int64_t *step);

/* ---- the job's directory ---------------------------------------------------------------- */

/* Make a job's snapshot directory PARENT/rk-snap-XXXXXX with mkdtemp (mode 0700) and put its
 * path in out[cap]. `parent` NULL means RK_SNAP_PARENT_DEFAULT; it must exist and be a
 * directory (RK_ENOENT, RK_EINVAL). The new directory is checked as every call checks it
 * (lstat: a directory, 0700, ours; a umask that took the owner's bits away fails here and the
 * directory is removed again). The caller owns it. */
RK_API int rk_snap_dir_make(const char *parent, char *out, size_t cap, rk_err *err);

/* The directory's maker is written into DIR/.owner (0600): "rk-snap-owner pid=P start=T
 * pidns=N\n", its pid, its start time (clock ticks after boot, /proc/P/stat) and its PID
 * namespace's inode, so that a directory whose maker died without removing it (SIGKILL, the
 * OOM killer) can be told from one in use (rk_snap_dir_sweep). */
#define RK_SNAP_OWNER_NAME ".owner"

/* Remove the snapshot directories under `parent` (NULL: RK_SNAP_PARENT_DEFAULT) that are
 * stale: PARENT/rk-snap-XXXXXX, a directory of this effective user, mode 0700, whose .owner
 * names a process of this PID namespace that no longer runs (no such pid, or one started at
 * another time). A directory without a readable .owner, of another user or of another PID
 * namespace is left alone; nothing but a stale job's store files is removed (as
 * rk_snap_dir_remove). *removed gets the count, *bytes their snapshots' bytes (either may
 * be NULL), names[cap] their paths ", "-separated (cut when full; may be NULL). RK_OK even
 * when one could not be removed (it is not counted); RK_ENOENT/RK_EINVAL for the parent. */
RK_API int rk_snap_dir_sweep(const char *parent, int *removed, uint64_t *bytes, char *names,
                             size_t cap, rk_err *err);

/* 0 if `dir` is a usable snapshot directory: a directory, not a symbolic link, mode 0700,
 * owned by this process's effective user. RK_ENOENT if missing, RK_EINVAL naming the problem. */
RK_API int rk_snap_dir_check(const char *dir, rk_err *err);

/* The job's cache, DIR/cache (0700, made if missing; its path into out[cap]): files a rank
 * keeps for the job's next launches under names of its own, not snapshots (rk train: its
 * decoded dataset, nn/idx.h's rk_idx_load_cached). rk_snap_dir_remove removes its files
 * (a link: the link, never its target) and it. The store's other calls ignore it. RK_EINVAL
 * when it is a link, not a directory, not 0700 or not ours. */
RK_API int rk_snap_cache_dir(const char *dir, char *out, size_t cap, rk_err *err);

/* DIR/held (0700, made if missing; its path into out[cap]): the directory of the copies this
 * host holds for another host's ranks, laid out as a job directory's ranks are (pass it as
 * `dir` to the store's calls). The same checks as rk_snap_cache_dir. */
RK_API int rk_snap_held_dir(const char *dir, char *out, size_t cap, rk_err *err);

/* Remove a job's snapshot directory: every rank's generations, pins and temporary files, the
 * rank directories, the cache (rk_snap_cache_dir), DIR/held (its ranks' the same way), its
 * .owner and the directory itself. A file it did not make (another name) is left, and then the
 * directory too: RK_EIO naming it. RK_ENOENT if `dir` does not exist. */
RK_API int rk_snap_dir_remove(const char *dir, rk_err *err);

/* ---- one rank's generations ------------------------------------------------------------- */

/* Put rank `rank`'s state (the items and meta of rk_ckpt_save; rank >= 0) as generation
 * meta->step of DIR/rank-<rank>, making that directory (0700) if missing, then apply retention
 * (above). Bad arguments are RK_EINVAL and a non-finite value RK_ENONFINITE: nothing is
 * written. A failed copy (RK_ESTORAGE when the tmpfs is full) removes its temporary file and
 * leaves the rank's previous generation as it was. The bytes are rk_ckpt_encode's. */
RK_API int rk_snap_put(const char *dir, int rank, const rk_ckpt_meta *meta,
                       const rk_ckpt_item *items, size_t n, rk_err *err);

/* Read and verify generation `step` of rank `rank`: snap-<step>, or when there is none
 * pin-<step>. On success *out (if not NULL) holds it; free it with rk_ckpt_free. RK_ENOENT if
 * there is no such generation or pin, RK_EFORMAT if it does not verify, RK_EINVAL if it is not
 * a regular file (a symbolic link, a FIFO, ...). */
RK_API int rk_snap_get(const char *dir, int rank, int64_t step, rk_ckpt **out, rk_err *err);

/* The steps of rank `rank`'s complete generations and pins (regular files with a generation's
 * or a pin's name; not verified; a step that is both counted once), newest first: at most
 * `cap` into steps, how many there are in *n (which may exceed cap; normally at most
 * RK_SNAP_HELD_MAX). A rank without a directory has none (*n = 0). */
RK_API int rk_snap_steps(const char *dir, int rank, int64_t *steps, size_t cap, size_t *n,
                         rk_err *err);

/* Pin generation `step` of rank `rank`: pin-<step> becomes a hard link to snap-<step> (made
 * under a temporary name and renamed into place: atomic; no copy; an older pin of that step is
 * replaced), then the rank keeps the new pin and its newest other pins, RK_SNAP_PINS in all,
 * and the others are removed. RK_ENOENT if there is no such generation (a pin is not
 * re-pinned), RK_EINVAL if it is not a regular file or for a bad argument, RK_ESTORAGE or RK_EIO
 * if the link cannot be made (nothing changed). The rank's writer calls it (between puts). */
RK_API int rk_snap_pin(const char *dir, int rank, int64_t step, rk_err *err);

/* Remove rank `rank`'s pin of `step` (pin-<step>; its generation, if any, stays). No pin, or no
 * rank directory: RK_OK. RK_EINVAL for a bad argument or a directory that fails the checks. */
RK_API int rk_snap_unpin(const char *dir, int rank, int64_t step, rk_err *err);
/* Remove every pin of rank `rank` of a step below `step` but `spare`'s (-1: none): the pins a
 * reader no longer needs (rk run, once it wrote the checkpoint of step-1 from them). A pin that
 * cannot be removed is the error (the first; the others are still tried). */
RK_API int rk_snap_unpin_below(const char *dir, int rank, int64_t step, int64_t spare, rk_err *err);

/* ---- the job ---------------------------------------------------------------------------- */

/* The newest step for which every rank 0..world-1 has a generation or a pin that verifies
 * (rk_snap_get's): *step. Never a mix of steps. Each generation skipped because it does not verify
 * (or cannot be read) is one line "<path>: <why>" in `report` (NUL-terminated, cut to report_len;
 * may be NULL). RK_ENOENT when there is no such step (a rank has none, or none in common verifies).
 * Reads every generation it considers in full; deletes nothing. */
RK_API int rk_snap_agree(const char *dir, int world, int64_t *step, char *report, size_t report_len,
                         rk_err *err);

/* The agreed step from what each rank verified on its own (the ranks of several hosts, each
 * host's in its own directory: rk_snap_agree's rule without one directory to read): held[r *
 * keep + k] is rank r's k-th verified step, newest first, -1 for none (world x keep entries).
 * *step is the newest of rank 0's steps that every rank holds; RK_ENOENT when there is none
 * (RK_EINVAL for a bad argument). Pure: no I/O. */
RK_API int rk_snap_agree_held(const int64_t *held, int world, int keep, int64_t *step, rk_err *err);

/* Bytes held by DIR: the sum of the sizes of every rank's complete generations and pins, each
 * file once (a pin linked to a generation adds nothing; temporary files and DIR/held not
 * counted). */
RK_API int rk_snap_bytes(const char *dir, uint64_t *bytes, rk_err *err);

/* Bytes held by rank `rank` of DIR (the sizes of its complete generations and pins, each file
 * once, temporary files not counted) and how many files that is: 0 and 0 for a rank without a
 * directory. */
RK_API int rk_snap_rank_bytes(const char *dir, int rank, uint64_t *bytes, int *gens, rk_err *err);

/* Whether snapshots of `ranks_here` local ranks of `bytes_per_gen` bytes each fit in the tmpfs
 * that holds DIR and in the node's RAM (tmpfs pages are RAM: a /dev/shm of half the RAM can
 * still take the RAM the ranks need). The rule (docs/recovery.md), with the need N =
 * RK_SNAP_KEEP x ranks_here x bytes_per_gen and H what DIR holds now (rk_snap_bytes: its
 * generations are replaced, not added to):
 *   the tmpfs: N + M <= A + H, with A the bytes free to this user there (statvfs: f_bavail x
 *     f_frsize), T the tmpfs's size and M = max(RK_SNAP_MARGIN_MIN, T / RK_SNAP_MARGIN_DIV);
 *   the RAM: N + Mr <= R + H, with R /proc/meminfo's MemAvailable (RK_SNAP_MEMAVAIL_ENV
 *     replaces it, for tests) and Mr = max(RK_SNAP_MARGIN_MIN, MemTotal / RK_SNAP_MARGIN_DIV);
 *     a kernel whose /proc/meminfo has no MemAvailable (and no override) skips this half.
 * *ok is 1 when both hold, else 0 and `why` (why_len; may be NULL) says which does not and by
 * how much ("... of RAM ..." for the second); the caller then falls back to disk-only
 * checkpoints. The margins leave room for the other users of /dev/shm (NCCL, data loader
 * workers) and of the RAM. An override that is not a decimal count is RK_EINVAL naming it. */
RK_API int rk_snap_room(const char *dir, uint64_t bytes_per_gen, int ranks_here, int *ok, char *why,
                        size_t why_len, rk_err *err);

/* ---- partner copies: a generation received from another node -------------------------- */

/* A generation of rank `rank` arriving in pieces (docs/recovery.md "Partner copies": the node
 * link's SNAP_DATA), written into DIR/rank-<rank> as a put writes: a temporary file
 * (O_EXCL, 0600) that becomes generation `step` only once every byte came and the whole file
 * verifies (rk_ckpt_parse: every checksum, and the step inside is `step`), then retention as
 * for a put (RK_SNAP_KEEP generations). `bytes` (1..RK_SNAP_RECV_MAX) bounds what is taken:
 * a piece past it is RK_EFORMAT. Abort (or a failed commit) removes the temporary file and
 * leaves the rank's generations as they were. One receiver per rank directory at a time. */
#define RK_SNAP_RECV_MAX ((uint64_t)1 << 40)
typedef struct rk_snap_recv rk_snap_recv;
RK_API int rk_snap_recv_begin(const char *dir, int rank, int64_t step, uint64_t bytes,
                              rk_snap_recv **out, rk_err *err);
RK_API int rk_snap_recv_write(rk_snap_recv *r, uint64_t off, const void *p, size_t n, rk_err *err);
/* Every byte 0..bytes-1 written (RK_EFORMAT naming the first missing one otherwise), the file
 * verified, renamed into place: RK_OK. Frees r either way. */
RK_API int rk_snap_recv_commit(rk_snap_recv *r, rk_err *err);
RK_API void rk_snap_recv_abort(rk_snap_recv *r);

/* ---- a disk checkpoint from the snapshots ------------------------------------------------- */

/* Write the checkpoint of `step` into the checkpoint store `ckpt_dir` (rk_ckpt_save, `keep`
 * newest kept) from the generations (or pins) of `step` of ranks 0..world-1 in DIR, laid out as
 * rekindle.torch puts them: rank 0's holds the replicated state and its own per-rank items,
 * every other rank's only its own per-rank items (names unique across the ranks). Every
 * generation is read and verified (rk_snap_get) and the replica hashes (the I64 item
 * RK_SNAP_HASH_ITEM, where present) must all be equal. The checkpoint's items are rank 0's in
 * its order without the hash, with every other rank's, in rank order, after rank 0's last
 * "rng." item (at the end when it has none); its metadata rank 0's. So the file is byte for
 * byte the one the job's rank 0 writes when it gathers the other ranks' items itself.
 * RK_ENOENT naming the rank when one has no generation of `step`; RK_EFORMAT when one does not
 * verify or the hashes differ (nothing written); the store's errors otherwise (RK_ESTORAGE,
 * RK_EIO: the disk; RK_ENONFINITE). *seconds (may be NULL): how long it took. */
#define RK_SNAP_HASH_ITEM "guard.state_hash"
RK_API int rk_snap_to_ckpt(const char *dir, int world, int64_t step, const char *ckpt_dir, int keep,
                           double *seconds, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
