/*
 * The checkpoint store's directory (rekindle/ckpt.h, docs/checkpoint.md): the checkpoints of a
 * directory, the newest valid one with fallback, listing, files set aside, and the writer's lock.
 */
#include "rekindle/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "base/msg.h"
#include "rekindle/fileio.h"
#include "runtime/ckpt_internal.h"

/* ---- the directory ---------------------------------------------------------------------- */

static int entry_desc(const void *a, const void *b)
{
    int64_t x = ((const entry *)a)->step, y = ((const entry *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The checkpoint files of `dir`, highest step first; *ntemp counts temporary files. */
int ckpt_scan_dir(const char *dir, entry **out, size_t *n, size_t *ntemp, rk_err *err)
{
    char eb[128];
    *out = NULL;
    *n = 0;
    if (ntemp)
        *ntemp = 0;
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot open checkpoint directory: %s", dir,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    size_t cap = 0;
    entry *v = NULL;
    struct dirent *de;
    int rc = RK_OK;
    errno = 0;
    while ((de = readdir(d))) {
        int64_t step;
        long pid;
        if (rk_ckpt_name_step(de->d_name, &step)) {
            if (*n == cap) {
                size_t nc = cap ? 2 * cap : 16;
                entry *nv = realloc(v, nc * sizeof *nv);
                if (!nv) {
                    rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
                    break;
                }
                v = nv;
                cap = nc;
            }
            memcpy(v[*n].name, de->d_name, strlen(de->d_name) + 1); /* < 64: a checkpoint name */
            v[(*n)++].step = step;
        } else if (ntemp && ckpt_temp_pid(de->d_name, &pid)) {
            (*ntemp)++;
        }
        errno = 0;
    }
    if (!rc && errno)
        rc = rk_err_set_line(err, RK_EIO, "%s: cannot read directory: %s", dir,
                             rk_msg_strerror(errno, eb, sizeof eb));
    closedir(d);
    if (rc) {
        free(v);
        *n = 0;
        return rc;
    }
    if (*n > 1)
        qsort(v, *n, sizeof *v, entry_desc);
    *out = v;
    return RK_OK;
}

int rk_ckpt_read_latest(const char *dir, char *name, size_t cap, rk_err *err)
{
    if (!dir || !name || cap == 0)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_read_latest: bad argument");
    name[0] = '\0';
    char *path = ckpt_join(dir, LATEST);
    if (!path)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    uint8_t *buf;
    size_t len;
    rk_err e2;
    int rc = rk_file_read_all(path, &buf, &len, LATEST_MAX, &e2);
    if (rc == RK_ENOENT)
        rc = rk_err_set_line(err, RK_ENOENT, "%s: missing", path);
    else if (rc)
        rc = rk_err_set_line(err, rc, "%s", e2.msg);
    if (rc) {
        free(path);
        return rc;
    }
    if (len > 0 && buf[len - 1] == '\n')
        buf[--len] = '\0';
    if (len == 0)
        rc = rk_err_set_line(err, RK_EFORMAT, "%s: is empty", path);
    else if (memchr(buf, '\0', len))
        rc = rk_err_set_line(err, RK_EFORMAT, "%s: holds a NUL byte, not a checkpoint file name",
                             path);
    else if (!rk_ckpt_name_step((const char *)buf, NULL))
        rc = rk_err_set_line(err, RK_EFORMAT,
                             "%s: does not hold a checkpoint file name (ckpt-<step>.safetensors)",
                             path); /* never its bytes: `latest` may be a link to any file */
    else if (len >= cap)
        rc = rk_err_set_line(err, RK_EINVAL, "%s: name does not fit in %zu bytes", path, cap);
    else
        memcpy(name, buf, len + 1);
    free(buf);
    free(path);
    return rc;
}

/* Append one line to the report, cut to fit (the buffer stays NUL-terminated). */
__attribute__((format(printf, 3, 4))) static void report_add(char *r, size_t cap, const char *fmt,
                                                             ...)
{
    if (!r || cap == 0)
        return;
    size_t used = strnlen(r, cap - 1);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r + used, cap - used, fmt, ap);
    va_end(ap);
    used = strnlen(r, cap - 1);
    if (used + 1 < cap) {
        r[used] = '\n';
        r[used + 1] = '\0';
    }
}

/* Whether a load's error says the file could not be read at all (permissions, an I/O error,
 * no memory), rather than read and found to be no usable checkpoint (RK_EFORMAT,
 * RK_EMISMATCH) or gone (RK_ENOENT). Loads never fall back past such a file. */
static bool unreadable(int rc)
{
    return rc != RK_OK && rc != RK_EFORMAT && rc != RK_EMISMATCH && rc != RK_ENOENT;
}

/* The error of a load that met a file it cannot read: no fallback. */
static int refuse_unreadable(const char *dir, const rk_err *why, rk_err *err)
{
    return rk_err_set_line(err, why->code,
                           "%s; a checkpoint that exists but cannot be read is not skipped: fix "
                           "it (permissions, disk) or move it out of %s",
                           why->msg, dir);
}

/* Load and verify dir/name and check it against `e`. */
static int try_load(const char *dir, const char *name, const rk_ckpt_expect *e, rk_ckpt **out,
                    rk_err *err)
{
    char *path = ckpt_join(dir, name);
    if (!path)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    int rc = rk_ckpt_load_file(path, out, err);
    if (rc == RK_ENOENT)
        rc = rk_err_set_line(err, RK_ENOENT, "%s: does not exist", path);
    free(path);
    if (!rc && e && (rc = rk_ckpt_check(*out, e, err))) {
        rk_ckpt_free(*out);
        *out = NULL;
    }
    return rc;
}

int rk_ckpt_load_latest(const char *dir, const rk_ckpt_expect *expect, rk_ckpt **out, char *report,
                        size_t report_len, rk_err *err)
{
    if (report && report_len)
        report[0] = '\0';
    if (!out)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_latest: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_latest: empty directory");
    entry *v;
    size_t n;
    int rc = ckpt_scan_dir(dir, &v, &n, NULL, err);
    if (rc)
        return rc;
    char lname[RK_CKPT_NAME_MAX] = "";
    rk_err e2;
    size_t skipped = 0;
    rc = rk_ckpt_read_latest(dir, lname, sizeof lname, &e2);
    if (unreadable(rc)) {
        free(v);
        return refuse_unreadable(dir, &e2, err);
    }
    if (rc == RK_OK) {
        rc = try_load(dir, lname, expect, out, &e2);
        if (unreadable(rc)) {
            free(v);
            return refuse_unreadable(dir, &e2, err);
        }
        if (rc == RK_OK) {
            int64_t ls = (*out)->meta.step;
            for (size_t i = 0; i < n && v[i].step > ls; i++)
                report_add(report, report_len,
                           "%s/%s: newer than the checkpoint 'latest' names "
                           "(%s); not used",
                           dir, v[i].name, lname);
            free(v);
            return RK_OK;
        }
        report_add(report, report_len, "%s", e2.msg);
        skipped++;
    } else if (rc != RK_ENOENT || n > 0) {
        report_add(report, report_len, "%s", e2.msg);
        lname[0] = '\0';
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(v[i].name, lname) == 0)
            continue;
        rc = try_load(dir, v[i].name, expect, out, &e2);
        if (rc == RK_OK) {
            free(v);
            return RK_OK;
        }
        if (unreadable(rc)) {
            free(v);
            return refuse_unreadable(dir, &e2, err);
        }
        report_add(report, report_len, "%s", e2.msg);
        skipped++;
    }
    free(v);
    if (skipped == 0)
        return rk_err_set_line(err, RK_ENOENT, "%s: no checkpoint", dir);
    return rk_err_set_line(err, RK_ENOENT,
                           "%s: no usable checkpoint (%zu file%s skipped, last: %s)", dir, skipped,
                           skipped == 1 ? "" : "s", e2.msg);
}

int rk_ckpt_load_step(const char *dir, int64_t step, rk_ckpt **out, rk_err *err)
{
    if (!out)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_step: out is NULL");
    *out = NULL;
    char name[RK_CKPT_NAME_MAX];
    if (!dir || !*dir || rk_ckpt_file_name(step, name, sizeof name) != RK_OK)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_step: bad directory or step %" PRId64,
                               step);
    char *path = ckpt_join(dir, name);
    if (!path)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    int rc = rk_ckpt_load_file(path, out, err);
    if (rc == RK_ENOENT)
        rc = rk_err_set_line(err, RK_ENOENT, "%s: no checkpoint of step %" PRId64, path, step);
    free(path);
    return rc;
}

static int info_asc(const void *a, const void *b)
{
    int64_t x = ((const rk_ckpt_info *)a)->step, y = ((const rk_ckpt_info *)b)->step;
    return x < y ? -1 : x > y ? 1 : 0;
}

int rk_ckpt_list(const char *dir, rk_ckpt_info **items, size_t *n, size_t *ntemp, rk_err *err)
{
    if (!items || !n)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_list: items or n is NULL");
    *items = NULL;
    *n = 0;
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_list: empty directory");
    entry *v;
    size_t m;
    int rc = ckpt_scan_dir(dir, &v, &m, ntemp, err);
    if (rc)
        return rc;
    rk_ckpt_info *info = calloc(m ? m : 1, sizeof *info);
    if (!info) {
        free(v);
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    }
    char lname[RK_CKPT_NAME_MAX] = "";
    if (rk_ckpt_read_latest(dir, lname, sizeof lname, NULL) != RK_OK)
        lname[0] = '\0';
    for (size_t i = 0; i < m; i++) {
        rk_ckpt_info *f = &info[i];
        snprintf(f->file, sizeof f->file, "%s", v[i].name);
        f->step = v[i].step;
        f->epoch = f->cursor = -1;
        f->latest = strcmp(v[i].name, lname) == 0;
        char *path = ckpt_join(dir, v[i].name);
        struct stat st;
        if (path && stat(path, &st) == 0)
            f->bytes = (uint64_t)st.st_size;
        rk_ckpt *c = NULL;
        rk_err e2;
        if (!path)
            rk_err_set(&e2, RK_ENOMEM, "%s: out of memory", dir);
        int lrc = path ? rk_ckpt_load_file(path, &c, &e2) : RK_ENOMEM;
        if (lrc == RK_OK) {
            f->valid = 1;
            f->epoch = c->meta.epoch;
            f->cursor = c->meta.cursor;
            f->world_size = c->meta.world_size;
            rk_ckpt_free(c);
        } else {
            f->unreadable = unreadable(lrc);
            snprintf(f->problem, sizeof f->problem, "%s", e2.msg);
        }
        free(path);
    }
    free(v);
    qsort(info, m, sizeof *info, info_asc);
    *items = info;
    *n = m;
    return RK_OK;
}

static int aside_asc(const void *a, const void *b)
{
    const rk_ckpt_aside *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->file, y->file);
}

int rk_ckpt_list_aside(const char *dir, rk_ckpt_aside **items, size_t *n, rk_err *err)
{
    char eb[128];
    if (!items || !n)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_list_aside: items or n is NULL");
    *items = NULL;
    *n = 0;
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_list_aside: empty directory");
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot open checkpoint directory: %s", dir,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    rk_ckpt_aside *v = NULL;
    size_t m = 0, cap = 0;
    int rc = RK_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        rk_ckpt_aside a = {0};
        size_t len = strlen(de->d_name);
        if (len >= sizeof a.file || !rk_ckpt_aside_step(de->d_name, &a.step, &a.when))
            continue;
        if (m == cap) {
            size_t nc = cap ? 2 * cap : 8;
            rk_ckpt_aside *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
                break;
            }
            v = nv;
            cap = nc;
        }
        memcpy(a.file, de->d_name, len + 1);
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
            a.bytes = (uint64_t)st.st_size;
        v[m++] = a;
    }
    closedir(d);
    if (rc) {
        free(v);
        return rc;
    }
    if (m > 1)
        qsort(v, m, sizeof *v, aside_asc);
    *items = v;
    *n = m;
    return RK_OK;
}

/* ---- the writer's lock ------------------------------------------------------------------ */

struct rk_ckpt_lockfile {
    int fd; /* DIR/.lock, flock'ed; closing it (or dying) releases the lock */
};

/* The pid written in an open lock file, 0 if none is (yet). */
static long lock_holder(int fd)
{
    char buf[LOCK_MAX + 1];
    ssize_t n;
    do {
        n = pread(fd, buf, LOCK_MAX, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    size_t len = strcspn(buf, "\n");
    int64_t v;
    return ckpt_parse_u63(buf, len, &v) && v > 0 && v <= INT_MAX ? (long)v : 0;
}

int rk_ckpt_lock(const char *dir, rk_ckpt_lockfile **out, long *holder, rk_err *err)
{
    char eb[128];
    if (holder)
        *holder = 0;
    if (!out)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_lock: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_lock: empty directory");
    int rc = ckpt_make_dirs(dir, err);
    if (rc)
        return rc;
    char *path = ckpt_join(dir, LOCK_NAME);
    rk_ckpt_lockfile *l = malloc(sizeof *l);
    if (!path || !l) {
        free(path);
        free(l);
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    }
    int fd;
    do {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    } while (fd < 0 && errno == EINTR);
    struct stat st;
    if (fd < 0) {
        int e = errno;
        rc = rk_err_set_line(err, e == ENOENT || e == ENOTDIR ? RK_ENOENT : RK_EIO,
                             "%s: cannot open the lock file: %s", path,
                             rk_msg_strerror(e, eb, sizeof eb));
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = rk_err_set_line(err, RK_EIO, "%s: the lock file is not a regular file", path);
    } else {
        int r;
        do {
            r = flock(fd, LOCK_EX | LOCK_NB);
        } while (r < 0 && errno == EINTR);
        if (r < 0 && errno == EWOULDBLOCK) {
            long pid = lock_holder(fd);
            if (holder)
                *holder = pid;
            if (pid > 0)
                rc = rk_err_set_line(err, RK_EBUSY,
                                     "%s: another job writes to this checkpoint directory "
                                     "(pid %ld holds %s); one writer per directory",
                                     dir, pid, path);
            else
                rc = rk_err_set_line(err, RK_EBUSY,
                                     "%s: another job writes to this checkpoint directory "
                                     "(it holds %s, its pid not written yet); one writer per "
                                     "directory",
                                     dir, path);
        } else if (r < 0) {
            rc = rk_err_set_line(err, RK_EIO, "%s: cannot lock: %s", path,
                                 rk_msg_strerror(errno, eb, sizeof eb));
        } else {
            /* ours: say who holds it (only a message reads this; the lock is the flock) */
            char line[32];
            int len = snprintf(line, sizeof line, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len)
                rc = rk_err_set_line(err, RK_EIO, "%s: cannot write the pid: %s", path,
                                     rk_msg_strerror(errno, eb, sizeof eb));
        }
    }
    free(path);
    if (rc) {
        if (fd >= 0)
            close(fd); /* releases the lock if it was taken */
        free(l);
        return rc;
    }
    l->fd = fd;
    *out = l;
    return RK_OK;
}

void rk_ckpt_unlock(rk_ckpt_lockfile *l)
{
    if (!l)
        return;
    close(l->fd); /* the file stays: removing it would race with the next job's open */
    free(l);
}

int rk_ckpt_is_store(const char *dir)
{
    DIR *d = dir && *dir ? opendir(dir) : NULL;
    if (!d)
        return 0;
    int found = 0;
    struct dirent *de;
    long pid;
    while (!found && (de = readdir(d)))
        found = strcmp(de->d_name, LATEST) == 0 || strcmp(de->d_name, LOCK_NAME) == 0 ||
                rk_ckpt_name_step(de->d_name, NULL) || ckpt_temp_pid(de->d_name, &pid) ||
                rk_ckpt_aside_step(de->d_name, NULL, NULL);
    closedir(d);
    return found;
}
