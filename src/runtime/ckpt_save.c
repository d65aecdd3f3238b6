/*
 * Saving into the checkpoint store (rekindle/ckpt.h, docs/checkpoint.md): the directory made,
 * the file streamed and hashed at once, `latest` moved, retention, a bad file of the same step
 * set aside; and the checkpoint interval (Young, Daly).
 */
#include "rekindle/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "base/msg.h"
#include "rekindle/fileio.h"
#include "runtime/ckpt_internal.h"

/* ---- saving ----------------------------------------------------------------------------- */

/* mkdir -p `dir`, fsync'ing each parent that gained an entry. */
int ckpt_make_dirs(const char *dir, rk_err *err)
{
    char eb[128];
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return rk_err_set_line(err, RK_EIO, "%s: exists and is not a directory", dir);
        return RK_OK;
    }
    size_t len = strlen(dir);
    char *p = malloc(len + 1);
    if (!p)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    memcpy(p, dir, len + 1);
    int rc = RK_OK;
    for (size_t i = 1; i <= len && !rc; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) == 0) {
            char *slash = strrchr(p, '/');
            if (slash && slash != p) {
                *slash = '\0';
                rk_fsync_dir(p, NULL);
                *slash = '/';
            } else {
                rk_fsync_dir(slash ? "/" : ".", NULL);
            }
        } else if (errno != EEXIST) {
            int e = errno;
            rc = rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot create directory %s: %s",
                                 dir, p, rk_msg_strerror(e, eb, sizeof eb));
        } else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = rk_err_set_line(err, RK_EIO, "%s: %s exists and is not a directory", dir, p);
        }
        p[i] = c;
    }
    free(p);
    return rc;
}

/* Checkpoints this process wrote and verified, identified by device, inode, size and
 * modification time: retention trusts them instead of reading every kept checkpoint again
 * after each save (for a 256 MiB state that re-read cost more than the write). A file
 * changed since (another size or mtime) is verified again. */
#define VERIFIED_MAX 64
static struct verified {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} verified[VERIFIED_MAX];
static size_t verified_next;
static pthread_mutex_t verified_lock = PTHREAD_MUTEX_INITIALIZER;

static bool same_file(const struct verified *v, const struct stat *st)
{
    return v->dev == st->st_dev && v->ino == st->st_ino && v->size == st->st_size &&
           v->mtime.tv_sec == st->st_mtim.tv_sec && v->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

static void verified_add(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return;
    pthread_mutex_lock(&verified_lock);
    verified[verified_next % VERIFIED_MAX] =
        (struct verified){st.st_dev, st.st_ino, st.st_size, st.st_mtim};
    verified_next++;
    pthread_mutex_unlock(&verified_lock);
}

/* Verified by this process and unchanged since, or verified now. */
static bool verify_cached(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return false;
    bool hit = false;
    pthread_mutex_lock(&verified_lock);
    for (size_t i = 0; i < VERIFIED_MAX && !hit; i++)
        hit = same_file(&verified[i], &st);
    pthread_mutex_unlock(&verified_lock);
    if (hit)
        return true;
    if (rk_ckpt_verify_file(path, NULL) != RK_OK)
        return false;
    verified_add(path);
    return true;
}

/* Retention after step `step` was saved and verified (see rekindle/ckpt.h), then stale
 * temporary files. Failures are left for the next save. */
static void retain(const char *dir, int64_t step, int keep)
{
    entry *v;
    size_t n;
    if (ckpt_scan_dir(dir, &v, &n, NULL, NULL) != RK_OK)
        return;
    int kept = 1, removed = 0; /* the new checkpoint */
    for (size_t i = 0; i < n; i++) {
        if (v[i].step >= step)
            continue; /* the new one, or a later timeline: never ours to remove */
        char *path = ckpt_join(dir, v[i].name);
        if (!path)
            break;
        if (verify_cached(path)) {
            if (kept < keep)
                kept++;
            else
                removed += unlink(path) == 0;
        } /* a checkpoint that does not verify is left for the operator */
        free(path);
    }
    free(v);

    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        long pid;
        while ((de = readdir(d))) {
            if (!ckpt_temp_pid(de->d_name, &pid) || pid == (long)getpid())
                continue;
            if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
                continue; /* alive (or not ours to signal): perhaps still writing */
            removed += unlinkat(dirfd(d), de->d_name, 0) == 0;
        }
        closedir(d);
    }
    if (removed)
        rk_fsync_dir(dir, NULL);
}

/* Before a save renames its file over `path`: a file already there that does not verify (a
 * corrupt checkpoint of the same step, left by an earlier timeline; see rekindle/ckpt.h) is
 * evidence, so it is renamed to "<name>.bad-<unix seconds>[-<k>]", a name neither retention,
 * the temporary-file cleanup nor a load touches, and the directory fsync'ed. A file that
 * verifies (cheaply, when this process wrote or verified it) is simply replaced. Nothing there
 * (the usual case) costs one lstat. Fails, and the save with it, if the file cannot be moved:
 * it is never overwritten. */
static int set_aside(const char *dir, const char *path, rk_err *err)
{
    char eb[128];
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return RK_OK;
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot check the file to replace: %s", path,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    if (S_ISREG(st.st_mode) && verify_cached(path))
        return RK_OK;
    size_t plen = strlen(path);
    size_t cap = plen + sizeof RK_CKPT_ASIDE_TAG + 32;
    char *to = malloc(cap);
    if (!to)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", path);
    long long now = (long long)time(NULL);
    if (now < 0)
        now = 0;
    for (int k = 0; k < 1000; k++) {
        if (k == 0)
            snprintf(to, cap, "%s" RK_CKPT_ASIDE_TAG "%lld", path, now);
        else
            snprintf(to, cap, "%s" RK_CKPT_ASIDE_TAG "%lld-%d", path, now, k);
        struct stat st2;
        if (lstat(to, &st2) == 0)
            continue; /* taken (one writer per directory: nobody races us for a name) */
        int rc = RK_OK;
        if (rename(path, to) != 0) {
            int e = errno;
            rc = rk_err_set_line(err, rk_err_code_errno(e),
                                 "%s: does not verify and cannot be moved aside to %s (it is "
                                 "kept; the new checkpoint is not written): %s",
                                 path, ckpt_base_name(to), rk_msg_strerror(e, eb, sizeof eb));
        } else {
            rc = rk_fsync_dir(dir, err);
        }
        free(to);
        return rc;
    }
    free(to);
    return rk_err_set_line(err, RK_EIO,
                           "%s: does not verify and every name to move it aside to is taken", path);
}

/* The hashing half of a save, run beside the writing half. */
static void *hash_all(void *arg)
{
    plan *p = arg;
    for (size_t i = 0; i < p->n; i++)
        ckpt_plan_hash(p, i);
    return NULL;
}

/* Stream a plan built without checksums into an atomic file at `path`: a header with
 * placeholder checksums (the same length as the final one), then the tensors straight from
 * the caller's memory while a second thread hashes that same memory, then the final header
 * over the placeholder, fsync, rename. A crash at any point leaves only a temporary file. */
static int plan_write(const char *dir, const char *path, plan *p, bool beside, rk_err *err)
{
    uint8_t *hdr = NULL;
    size_t hlen, dlen;
    int rc = rk_st_header(p->e, p->n, (const char *const *)p->meta, &hdr, &hlen, &dlen, err);
    if (rc)
        return rc;
    rk_afile *f = NULL;
    rc = rk_afile_open(&f, path, err);
    if (rc) {
        free(hdr);
        return rc;
    }
    pthread_t th;
    bool threaded = beside && pthread_create(&th, NULL, hash_all, p) == 0;
    rc = rk_afile_write(f, hdr, hlen, err);
    for (size_t i = 0; i < p->n && !rc; i++)
        rc = rk_afile_write(f, p->e[i].data, p->nbytes[i], err);
    if (threaded)
        pthread_join(th, NULL);
    else
        hash_all(p);
    free(hdr);
    hdr = NULL;
    size_t hlen2 = 0;
    if (!rc)
        rc = ckpt_plan_check_finite(path, p, err);
    if (!rc && ckpt_plan_seal(p) != RK_OK)
        rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", path);
    if (!rc)
        rc = rk_st_header(p->e, p->n, (const char *const *)p->meta, &hdr, &hlen2, &dlen, err);
    if (!rc && hlen2 != hlen)
        rc = rk_err_set_line(err, RK_EINVAL, "%s: header changed length (%zu -> %zu bytes)", path,
                             hlen, hlen2);
    if (!rc)
        rc = rk_afile_pwrite(f, hdr, hlen, 0, err);
    free(hdr);
    if (!rc)
        rc = set_aside(dir, path, err);
    if (rc) {
        rk_afile_abort(f);
        return rc;
    }
    return rk_afile_commit(f, err);
}

int rk_ckpt_save(const char *dir, const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n,
                 int keep, rk_err *err)
{
    return rk_ckpt_save_in(dir, meta, items, n, keep, true, err);
}

int rk_ckpt_save_in(const char *dir, const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n,
                    int keep, bool hash_beside, rk_err *err)
{
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_save: empty directory");
    if (keep < 1)
        return rk_err_set_line(err, RK_EINVAL, "%s: keep %d is not at least 1", dir, keep);
    char name[RK_CKPT_NAME_MAX];
    if (!meta || rk_ckpt_file_name(meta->step, name, sizeof name) != RK_OK)
        return rk_err_set_line(err, RK_EINVAL, "%s: meta is NULL or its step is negative", dir);
    char *path = ckpt_join(dir, name);
    char *lpath = ckpt_join(dir, LATEST);
    plan p;
    memset(&p, 0, sizeof p);
    int rc = path && lpath ? RK_OK : rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    if (!rc)
        rc = ckpt_plan_build(path, meta, items, n, false, &p, err);
    /* Stream the tensors from the caller's memory into the atomic file (the checksums come
     * from the same memory). The file is not read back: after fsync that would only read the
     * page cache, not the disk, and it cost more than the write (measured: 0.37x of dd
     * conv=fsync for 256 MiB with the read-back). Every load verifies every checksum. */
    if (!rc)
        rc = ckpt_make_dirs(dir, err);
    if (!rc)
        rc = plan_write(dir, path, &p, hash_beside, err);
    ckpt_plan_free(&p);
    if (!rc)
        verified_add(path);
    if (!rc) {
        char line[RK_CKPT_NAME_MAX + 1];
        int llen = snprintf(line, sizeof line, "%s\n", name);
        rc = rk_file_write_atomic(lpath, line, (size_t)llen, err);
    }
    if (!rc)
        retain(dir, meta->step, keep);
    free(path);
    free(lpath);
    return rc;
}

/* ---- interval --------------------------------------------------------------------------- */

static bool pos_finite(double x)
{
    return isfinite(x) && x > 0;
}

double rk_ckpt_interval_young(double save_cost_s, double mtbf_s)
{
    if (!pos_finite(save_cost_s) || !pos_finite(mtbf_s))
        return NAN;
    return sqrt(2.0 * save_cost_s * mtbf_s);
}

double rk_ckpt_interval_daly(double save_cost_s, double mtbf_s)
{
    if (!pos_finite(save_cost_s) || !pos_finite(mtbf_s))
        return NAN;
    double c = save_cost_s, m = mtbf_s;
    if (c >= 2.0 * m)
        return m;
    double r = c / (2.0 * m);
    return sqrt(2.0 * c * m) * (1.0 + sqrt(r) / 3.0 + r / 9.0) - c;
}

int64_t rk_ckpt_auto_steps(double save_cost_s, double mtbf_s, double step_s)
{
    double t = rk_ckpt_interval_daly(save_cost_s, mtbf_s);
    if (!isfinite(t) || !pos_finite(step_s))
        return 0;
    double s = floor(t / step_s + 0.5);
    if (!(s >= 1.0))
        return 1;
    if (s >= 9.2e18)
        return INT64_MAX;
    return (int64_t)s;
}

int rk_ckpt_every_parse(const char *text, int64_t *steps, rk_err *err)
{
    if (!text || !steps)
        return rk_err_set_line(err, RK_EINVAL, "--ckpt-every: no value");
    if (strcmp(text, "auto") == 0) {
        *steps = 0;
        return RK_OK;
    }
    int64_t v;
    char vb[SHOW_MAX];
    if (!ckpt_parse_u63(text, strlen(text), &v) || v < 1)
        return rk_err_set_line(err, RK_EINVAL,
                               "--ckpt-every '%s' is not a step count >= 1 or 'auto'",
                               rk_msg_show(vb, sizeof vb, text));
    *steps = v;
    return RK_OK;
}
