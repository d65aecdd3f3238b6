/*
 * Inside the checkpoint store: what its files (ckpt.c, ckpt_store.c, ckpt_save.c,
 * ckpt_writer.c) share and no one else sees.
 */
#ifndef RK_RUNTIME_CKPT_INTERNAL_H
#define RK_RUNTIME_CKPT_INTERNAL_H

#include <stdbool.h>

#include "rekindle/ckpt.h"

/* rk_ckpt_save, choosing whether the checksums are computed by a second thread beside the
 * writing one (true: a synchronous save, the caller waits) or by the writing thread itself
 * (false: the background writer, already off the training thread, which must not take a
 * second core from training). */
int rk_ckpt_save_in(const char *dir, const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n,
                    int keep, bool hash_beside, rk_err *err);

/* rk_ckpt_load_file of an open regular file of `size` bytes (the caller's bounded open), read
 * straight into the one buffer the checkpoint keeps: the snapshot store's restore (snap.c),
 * which opens its generations relative to a checked directory. `name` labels messages. */
int rk_ckpt_read_fd(int fd, const char *name, uint64_t size, rk_ckpt **out, rk_err *err);

/* ---- shared by the store's files: ckpt.c (names, the format: building and verifying),
 * ckpt_store.c (the directory: listing, loading, the lock), ckpt_save.c (saving, retention,
 * the interval) ---------------------------------------------------------------------- */

#include <stddef.h>
#include <stdint.h>

#include "rekindle/safetensors.h"

#define KEY_PREFIX "xxh64."
#define KEY_PREFIX_LEN 6
#define MANIFEST_NAME "__manifest__"
#define MANIFEST_KEY KEY_PREFIX MANIFEST_NAME
#define LATEST "latest"
#define LOCK_NAME RK_CKPT_LOCK_FILE
#define LOCK_MAX 32                    /* bytes of the lock file read for the holder's pid */
#define SCAN_CHUNK ((size_t)256 << 10) /* bytes hashed, then scanned while in cache */
#define LATEST_MAX 4096                /* bytes a `latest` file may have */
#define SHOW_MAX 96                    /* bytes of an untrusted name shown in a message */

struct rk_ckpt {
    rk_st_file f;
    rk_ckpt_meta meta; /* config_json points into f's metadata */
};

/* One tensor as the manifest checksum sees it. */
typedef struct tdesc {
    const char *name, *dtype;
    int ndim;
    const int64_t *shape;
    uint64_t begin, end; /* data-section offsets */
} tdesc;

typedef struct kv {
    const char *k, *v;
} kv;

/* The safetensors entries and metadata list for one save; strings owned here. */
typedef struct plan {
    rk_st_entry *e;
    size_t n;
    const char **meta; /* NULL-terminated key, value list */
    char *strs;        /* keys "xxh64.<name>" and values, one block */
    char **sums;       /* per item: its 16-hex-digit checksum inside strs */
    size_t *nbytes;    /* per item: its byte size */
    size_t *bad;       /* per item: its first non-finite element, SIZE_MAX if none */
    tdesc *td;         /* per item, for the manifest checksum */
    kv *sorted;        /* metadata pairs, for the manifest checksum */
    size_t npairs;     /* metadata pairs before the manifest's own */
    char nums[4][24];  /* step, epoch, cursor, world_size */
    char manifest[17];
} plan;

typedef struct entry {
    char name[RK_CKPT_NAME_MAX];
    int64_t step;
} entry;

const char *ckpt_base_name(const char *path);
/* "<prefix><step, 12 digits>.safetensors" (more digits past 10^12) into buf[cap]: the file
 * names of the store ("ckpt-") and of the node's snapshots ("snap-", rekindle/snap.h).
 * RK_EINVAL if step < 0 or it does not fit. */
int ckpt_step_name(const char *prefix, int64_t step, char *buf, size_t cap);
/* 1 and the step if `name` is exactly such a name as ckpt_step_name writes it, else 0. */
int ckpt_step_of_name(const char *prefix, const char *name, int64_t *step);
/* 1, the target's name (base[RK_CKPT_NAME_MAX]) and the writer's pid if `name` is a temporary
 * file's name "<target>.tmp.<pid>.<n>" (rekindle/fileio.h) with a target shorter than
 * RK_CKPT_NAME_MAX, else 0. The caller decides whether the target is one of its names. */
int ckpt_temp_split(const char *name, char *base, long *pid);
char *ckpt_join(const char *dir, const char *name);
bool ckpt_parse_u63(const char *s, size_t len, int64_t *v);
int ckpt_plan_build(const char *label, const rk_ckpt_meta *m, const rk_ckpt_item *items, size_t n,
                    bool hash, plan *p, rk_err *err);
int ckpt_plan_check_finite(const char *label, const plan *p, rk_err *err);
void ckpt_plan_free(plan *p);
void ckpt_plan_hash(plan *p, size_t i);
int ckpt_plan_seal(plan *p);
int ckpt_temp_pid(const char *name, long *pid);
int ckpt_scan_dir(const char *dir, entry **out, size_t *n, size_t *ntemp, rk_err *err);
int ckpt_make_dirs(const char *dir, rk_err *err);

#endif
