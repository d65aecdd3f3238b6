/*
 * The node's snapshot store (rekindle/snap.h, docs/recovery.md): one rank's state as a
 * checkpoint file of the store's format, kept in a tmpfs in a 0700 directory of the job,
 * written to a temporary file and renamed, two generations per rank and up to two pins (hard
 * links to generations), DIR/held for another host's ranks. Relies on the checkpoint
 * store's format (ckpt.c: the plan, the names, rk_ckpt_parse) and on fileio's bounded opener.
 * Every path is opened relative to a checked directory descriptor, never through a link.
 */
#include "rekindle/snap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/env.h"
#include "base/msg.h"
#include "base/proc.h"
#include "rekindle/fileio.h"
#include "runtime/ckpt_internal.h"

#define SNAP_PREFIX "snap-"
#define PIN_PREFIX "pin-"
#define RANK_PREFIX "rank-"
#define LABEL_MAX (RK_SNAP_PATH_MAX + 128) /* a path in a message: DIR/rank-R/<name> */

static atomic_ulong tmp_counter;

/* ---- names ------------------------------------------------------------------------------ */

int rk_snap_file_name(int64_t step, char *buf, size_t cap)
{
    return ckpt_step_name(SNAP_PREFIX, step, buf, cap);
}

int rk_snap_name_step(const char *name, int64_t *step)
{
    return ckpt_step_of_name(SNAP_PREFIX, name, step);
}

int rk_snap_pin_name(int64_t step, char *buf, size_t cap)
{
    return ckpt_step_name(PIN_PREFIX, step, buf, cap);
}

int rk_snap_pin_name_step(const char *name, int64_t *step)
{
    return ckpt_step_of_name(PIN_PREFIX, name, step);
}

/* What a listing of a rank directory takes: generations, pins, or both. */
enum { SCAN_GENS = 1, SCAN_PINS = 2 };

/* 1 and *step (may be NULL) if `name` is a generation's (SCAN_GENS in kinds) or a pin's
 * (SCAN_PINS) name. */
static bool held_name_step(const char *name, int kinds, int64_t *step)
{
    return ((kinds & SCAN_GENS) && rk_snap_name_step(name, step)) ||
           ((kinds & SCAN_PINS) && rk_snap_pin_name_step(name, step));
}

/* Whether `name` is a temporary file of the store's writers: "<generation or pin>.tmp.<pid>.<n>";
 * the writer's pid into *pid (may be NULL). */
static bool temp_of_held(const char *name, long *pid)
{
    char base[RK_CKPT_NAME_MAX];
    long p;
    if (!ckpt_temp_split(name, base, &p) || !held_name_step(base, SCAN_GENS | SCAN_PINS, NULL))
        return false;
    if (pid)
        *pid = p;
    return true;
}

/* 1 and the rank if `name` is exactly "rank-<R>" as rank_name writes it. */
static bool rank_of_name(const char *name, int *rank)
{
    size_t lp = sizeof RANK_PREFIX - 1;
    int64_t v;
    if (strncmp(name, RANK_PREFIX, lp) != 0 || !ckpt_parse_u63(name + lp, strlen(name + lp), &v) ||
        v > INT_MAX)
        return false;
    *rank = (int)v;
    return true;
}

/* "<dir>/<a>" or "<dir>/<a>/<b>" for messages (b may be NULL); cut if ever too long. */
static const char *label(char *buf, const char *dir, const char *a, const char *b)
{
    if (b)
        snprintf(buf, LABEL_MAX, "%s/%s/%s", dir, a, b);
    else
        snprintf(buf, LABEL_MAX, "%s/%s", dir, a);
    return buf;
}

/* ---- checked directories ---------------------------------------------------------------- */

/* Open the directory `name` (relative to `at`, or a path with AT_FDCWD) without following a
 * symbolic link, and check it is ours and 0700. `what` labels messages. */
static int open_checked(int at, const char *name, const char *what, int *fd, rk_err *err)
{
    char eb[128];
    *fd = -1;
    int f;
    do {
        f = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    } while (f < 0 && errno == EINTR);
    if (f < 0) {
        int e = errno;
        struct stat st;
        if (e == ENOENT)
            return rk_err_set_line(err, RK_ENOENT, "%s: does not exist", what);
        if ((e == ELOOP || e == ENOTDIR) && fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
            return rk_err_set_line(
                err, RK_EINVAL,
                "%s: is %s, not a directory (a snapshot directory is a real "
                "directory, mode 0700)",
                what, S_ISLNK(st.st_mode) ? "a symbolic link" : rk_file_kind_name(st.st_mode));
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot open: %s", what,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    struct stat st;
    int rc = RK_OK;
    if (fstat(f, &st) != 0)
        rc = rk_err_set_line(err, RK_EIO, "%s: cannot stat: %s", what,
                             rk_msg_strerror(errno, eb, sizeof eb));
    else if (st.st_uid != geteuid())
        rc = rk_err_set_line(err, RK_EINVAL,
                             "%s: is owned by uid %ld, not by this user (uid %ld): snapshots are "
                             "readable only by the job's user",
                             what, (long)st.st_uid, (long)geteuid());
    else if ((st.st_mode & 07777) != 0700)
        rc = rk_err_set_line(err, RK_EINVAL,
                             "%s: has mode %04o, not 0700: snapshots are readable only by the "
                             "job's user",
                             what, (unsigned)(st.st_mode & 07777));
    if (rc) {
        close(f);
        return rc;
    }
    *fd = f;
    return RK_OK;
}

static int check_dir_arg(const char *dir, const char *fn, rk_err *err)
{
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "%s: empty snapshot directory", fn);
    if (strlen(dir) >= RK_SNAP_PATH_MAX)
        return rk_err_set_line(err, RK_EINVAL, "%s: snapshot directory path is %zu bytes, over %d",
                               fn, strlen(dir), RK_SNAP_PATH_MAX - 1);
    return RK_OK;
}

/* The rank's directory, checked, as *rfd; made (0700) first when `make`. RK_ENOENT if it (or
 * DIR) does not exist. */
static int open_rank(const char *dir, int rank, bool make, int *rfd, rk_err *err)
{
    char eb[128], rname[32], lb[LABEL_MAX];
    *rfd = -1;
    int jfd;
    int rc = open_checked(AT_FDCWD, dir, dir, &jfd, err);
    if (rc)
        return rc;
    snprintf(rname, sizeof rname, RANK_PREFIX "%d", rank);
    label(lb, dir, rname, NULL);
    if (make && mkdirat(jfd, rname, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        close(jfd);
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot create: %s", lb,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    rc = open_checked(jfd, rname, lb, rfd, err);
    close(jfd);
    return rc;
}

#define CACHE_NAME "cache"

/* The job directory's subdirectory `name` (0700, made if missing; its path into out[cap]):
 * the cache, or DIR/held. `fn` names the caller in messages. */
static int sub_dir(const char *dir, const char *name, const char *fn, char *out, size_t cap,
                   rk_err *err)
{
    char eb[128], lb[LABEL_MAX];
    if (out && cap)
        out[0] = '\0';
    int rc = check_dir_arg(dir, fn, err);
    if (rc)
        return rc;
    if (!out || snprintf(out, cap, "%s/%s", dir, name) >= (int)cap) {
        if (out && cap)
            out[0] = '\0';
        return rk_err_set_line(err, RK_EINVAL, "%s: %s: no room for the path", dir, fn);
    }
    int jfd, cfd;
    rc = open_checked(AT_FDCWD, dir, dir, &jfd, err);
    if (rc) {
        out[0] = '\0';
        return rc;
    }
    label(lb, dir, name, NULL);
    if (mkdirat(jfd, name, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        close(jfd);
        out[0] = '\0';
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot create: %s", lb,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    rc = open_checked(jfd, name, lb, &cfd, err); /* 0700, ours, not a link */
    close(jfd);
    if (rc)
        out[0] = '\0';
    else
        close(cfd);
    return rc;
}

int rk_snap_cache_dir(const char *dir, char *out, size_t cap, rk_err *err)
{
    return sub_dir(dir, CACHE_NAME, "rk_snap_cache_dir", out, cap, err);
}

int rk_snap_held_dir(const char *dir, char *out, size_t cap, rk_err *err)
{
    return sub_dir(dir, RK_SNAP_HELD_NAME, "rk_snap_held_dir", out, cap, err);
}

/* ---- one rank's directory --------------------------------------------------------------- */

static int step_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of the complete generations and/or pins (`kinds`: regular files with such a name)
 * in the rank directory `rfd`, newest first, each step once: *out (free() it) of *n. */
static int scan_rank(int rfd, const char *what, int kinds, int64_t **out, size_t *n, rk_err *err)
{
    char eb[128];
    *out = NULL;
    *n = 0;
    int d2 = fcntl(rfd, F_DUPFD_CLOEXEC, 0);
    /* rk-fd: d2 is close-on-exec (F_DUPFD_CLOEXEC above) */
    DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
    if (!d) {
        int e = errno;
        if (d2 >= 0)
            close(d2);
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot list: %s", what,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    rewinddir(d); /* the duplicate shares the offset of earlier listings */
    int64_t *v = NULL;
    size_t cap = 0;
    int rc = RK_OK;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d))) {
        int64_t s;
        struct stat st;
        if (!held_name_step(de->d_name, kinds, &s) ||
            fstatat(rfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
            errno = 0;
            continue;
        }
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 4;
            int64_t *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", what);
                break;
            }
            v = nv;
            cap = nc;
        }
        v[(*n)++] = s;
        errno = 0;
    }
    if (!rc && errno)
        rc = rk_err_set_line(err, RK_EIO, "%s: cannot read directory: %s", what,
                             rk_msg_strerror(errno, eb, sizeof eb));
    closedir(d);
    if (rc) {
        free(v);
        *n = 0;
        return rc;
    }
    if (*n > 1)
        qsort(v, *n, sizeof *v, step_desc);
    size_t u = 0; /* a generation and a pin of one step: the step once */
    for (size_t i = 0; i < *n; i++)
        if (u == 0 || v[u - 1] != v[i])
            v[u++] = v[i];
    *n = u;
    *out = v;
    return RK_OK;
}

/* Retention before the copy of generation `step` (rekindle/snap.h): every generation but
 * `step` itself and the newest below it is deleted, every pin above `step`, and anything else
 * under a generation's or a pin's name (a link, a FIFO: never a generation; unlinking a link
 * leaves what it points to), and the temporary files of writers that died. Failures are left
 * for the next put. */
static void retain(int rfd, const char *what, int64_t step, const char *recycle, bool *recycled)
{
    int64_t *v;
    size_t n;
    *recycled = false;
    if (scan_rank(rfd, what, SCAN_PINS, &v, &n, NULL) != RK_OK)
        return;
    for (size_t i = 0; i < n && v[i] > step; i++) { /* newest first: a rolled-back timeline's */
        char name[RK_CKPT_NAME_MAX];
        if (rk_snap_pin_name(v[i], name, sizeof name) == RK_OK)
            unlinkat(rfd, name, 0);
    }
    free(v);
    if (scan_rank(rfd, what, SCAN_GENS, &v, &n, NULL) != RK_OK)
        return;
    bool below_kept = false;
    for (size_t i = 0; i < n; i++) { /* newest first */
        if (v[i] == step)
            continue;
        if (v[i] < step && !below_kept) {
            below_kept = true;
            continue;
        }
        char name[RK_CKPT_NAME_MAX];
        if (rk_snap_file_name(v[i], name, sizeof name) != RK_OK)
            continue;
        /* the first generation to go becomes the copy's temporary file: renamed away in one
         * step (never a generation with other contents), its pages written over in place
         * unless a pin links to it (open_recycled: one link only) */
        if (!*recycled && recycle && renameat(rfd, name, rfd, recycle) == 0)
            *recycled = true;
        else
            unlinkat(rfd, name, 0);
    }
    free(v);

    int d2 = fcntl(rfd, F_DUPFD_CLOEXEC, 0);
    /* rk-fd: d2 is close-on-exec (F_DUPFD_CLOEXEC above) */
    DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
    if (!d) {
        if (d2 >= 0)
            close(d2);
        return;
    }
    rewinddir(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        long pid;
        struct stat st;
        if (held_name_step(de->d_name, SCAN_GENS | SCAN_PINS, NULL)) {
            if (fstatat(rfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode) &&
                !S_ISDIR(st.st_mode))
                unlinkat(rfd, de->d_name, 0);
            continue;
        }
        if (!temp_of_held(de->d_name, &pid) || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive (or not ours to signal): perhaps still writing */
        unlinkat(rfd, de->d_name, 0);
    }
    closedir(d);
}

/* write(2) all of buf (short writes and EINTR retried); 0 or errno. */
static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        size_t chunk = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return errno;
        if (w == 0)
            return EIO;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* An old generation renamed to `tmp` (retain), opened to be written over: a regular file of
 * ours with one link, else -1 (the caller removes it and makes a new one). */
static int open_recycled(int rfd, const char *tmp)
{
    int fd;
    do {
        fd = openat(rfd, tmp, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    } while (fd < 0 && errno == EINTR);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
                    st.st_nlink != 1)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The copy: header and tensors into the temporary file `tmp` in `rfd` (a new one, or an old
 * generation `recycled` by retain: written over from its start and cut to the new length, so
 * the tmpfs neither frees its pages nor allocates new ones), renamed to `name`. */
static int copy_in(int rfd, const char *lb, const char *name, const char *tmp, bool recycled,
                   const uint8_t *hdr, size_t hlen, const plan *p, rk_err *err)
{
    char eb[128];
    int fd = recycled ? open_recycled(rfd, tmp) : -1;
    if (recycled && fd < 0)
        unlinkat(rfd, tmp, 0);
    recycled = fd >= 0;
    if (fd < 0)
        do {
            fd = openat(rfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot create %s: %s", lb, tmp,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    int e = write_all(fd, hdr, hlen);
    off_t total = (off_t)hlen;
    for (size_t i = 0; i < p->n && !e; i++) {
        e = write_all(fd, p->e[i].data, p->nbytes[i]);
        total += (off_t)p->nbytes[i];
    }
    if (!e && recycled && ftruncate(fd, total) != 0)
        e = errno;
    if (close(fd) != 0 && !e && errno != EINTR)
        e = errno;
    const char *what = "cannot write the snapshot";
    if (!e && renameat(rfd, tmp, rfd, name) != 0) {
        e = errno;
        what = "cannot rename the snapshot into place";
    }
    if (e) {
        unlinkat(rfd, tmp, 0);
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: %s: %s", lb, what,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    return RK_OK;
}

int rk_snap_put(const char *dir, int rank, const rk_ckpt_meta *meta, const rk_ckpt_item *items,
                size_t n, rk_err *err)
{
    int rc = check_dir_arg(dir, "rk_snap_put", err);
    if (rc)
        return rc;
    char name[RK_CKPT_NAME_MAX], rname[32], lb[LABEL_MAX];
    if (rank < 0)
        return rk_err_set_line(err, RK_EINVAL, "%s: rank %d is negative", dir, rank);
    if (!meta || rk_snap_file_name(meta->step, name, sizeof name) != RK_OK)
        return rk_err_set_line(err, RK_EINVAL, "%s: meta is NULL or its step is negative", dir);
    snprintf(rname, sizeof rname, RANK_PREFIX "%d", rank);
    label(lb, dir, rname, name);

    /* Check and hash first: bad items or a non-finite value change nothing. */
    plan p;
    rc = ckpt_plan_build(lb, meta, items, n, true, &p, err);
    if (rc)
        return rc;
    uint8_t *hdr = NULL;
    size_t hlen, dlen;
    rc = rk_st_header(p.e, p.n, (const char *const *)p.meta, &hdr, &hlen, &dlen, err);
    int rfd = -1;
    if (!rc)
        rc = open_rank(dir, rank, true, &rfd, err);
    if (!rc) {
        char rl[LABEL_MAX], tmp[RK_CKPT_NAME_MAX + 64];
        label(rl, dir, rname, NULL);
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%lu", name, (long)getpid(),
                 atomic_fetch_add(&tmp_counter, 1));
        bool recycled;
        retain(rfd, rl, meta->step, tmp, &recycled);
        rc = copy_in(rfd, rl, name, tmp, recycled, hdr, hlen, &p, err);
        close(rfd);
    }
    free(hdr);
    ckpt_plan_free(&p);
    return rc;
}

/* ---- partner copies ----------------------------------------------------------------------- */

struct rk_snap_recv {
    int rfd, fd;
    int64_t step;
    uint64_t bytes, filled; /* filled: the contiguous prefix written (pieces come in order) */
    char name[RK_CKPT_NAME_MAX], tmp[RK_CKPT_NAME_MAX + 64], rl[LABEL_MAX];
};

int rk_snap_recv_begin(const char *dir, int rank, int64_t step, uint64_t bytes, rk_snap_recv **out,
                       rk_err *err)
{
    *out = NULL;
    int rc = check_dir_arg(dir, "rk_snap_recv_begin", err);
    if (rc)
        return rc;
    if (rank < 0 || step < 0 || bytes < 1 || bytes > RK_SNAP_RECV_MAX)
        return rk_err_set_line(err, RK_EINVAL,
                               "%s: rank %d, step %" PRId64 ", %" PRIu64 " bytes: out of range",
                               dir, rank, step, bytes);
    rk_snap_recv *r = calloc(1, sizeof *r);
    if (!r)
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", dir);
    r->fd = -1;
    r->step = step;
    r->bytes = bytes;
    char rname[32];
    snprintf(rname, sizeof rname, RANK_PREFIX "%d", rank);
    label(r->rl, dir, rname, NULL);
    rk_snap_file_name(step, r->name, sizeof r->name);
    snprintf(r->tmp, sizeof r->tmp, "%s.tmp.%ld.%lu", r->name, (long)getpid(),
             atomic_fetch_add(&tmp_counter, 1));
    if ((rc = open_rank(dir, rank, true, &r->rfd, err))) {
        free(r);
        return rc;
    }
    do {
        r->fd = openat(r->rfd, r->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    } while (r->fd < 0 && errno == EINTR);
    if (r->fd < 0) {
        char eb[128];
        int e = errno;
        close(r->rfd);
        free(r);
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot create a temporary file: %s",
                               dir, rk_msg_strerror(e, eb, sizeof eb));
    }
    *out = r;
    return RK_OK;
}

int rk_snap_recv_write(rk_snap_recv *r, uint64_t off, const void *p, size_t n, rk_err *err)
{
    if (off != r->filled || n == 0 || n > r->bytes - r->filled)
        return rk_err_set_line(err, RK_EFORMAT,
                               "%s/%s: a piece of %zu bytes at %" PRIu64 " (have %" PRIu64
                               " of %" PRIu64 ")",
                               r->rl, r->name, n, off, r->filled, r->bytes);
    int e = write_all(r->fd, p, n);
    if (e) {
        char eb[128];
        return rk_err_set_line(err, rk_err_code_errno(e), "%s/%s: %s", r->rl, r->tmp,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    r->filled += n;
    return RK_OK;
}

void rk_snap_recv_abort(rk_snap_recv *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    unlinkat(r->rfd, r->tmp, 0);
    close(r->rfd);
    free(r);
}

int rk_snap_recv_commit(rk_snap_recv *r, rk_err *err)
{
    int rc = RK_OK;
    if (r->filled != r->bytes)
        rc = rk_err_set_line(err, RK_EFORMAT, "%s/%s: %" PRIu64 " of %" PRIu64 " bytes came", r->rl,
                             r->name, r->filled, r->bytes);
    if (!rc && close(r->fd) != 0 && errno != EINTR) {
        char eb[128];
        rc = rk_err_set_line(err, rk_err_code_errno(errno), "%s/%s: %s", r->rl, r->tmp,
                             rk_msg_strerror(errno, eb, sizeof eb));
    }
    if (!rc)
        r->fd = -1;
    char lb[LABEL_MAX + RK_CKPT_NAME_MAX + 64];
    snprintf(lb, sizeof lb, "%s/%s", r->rl, r->tmp);
    int fd = -1;
    uint64_t size = 0;
    if (!rc) /* verified in full before it gets a generation's name */
        rc = rk_file_openat_read(r->rfd, r->tmp, lb, SIZE_MAX, &fd, &size, err);
    rk_ckpt *c = NULL;
    if (!rc) {
        rc = size == r->bytes
                 ? rk_ckpt_read_fd(fd, lb, size, &c, err)
                 : rk_err_set_line(err, RK_EFORMAT, "%s: %" PRIu64 " bytes, not %" PRIu64, lb, size,
                                   r->bytes);
        close(fd);
    }
    if (!rc && rk_ckpt_meta_of(c)->step != r->step)
        rc = rk_err_set_line(err, RK_EFORMAT, "%s: field 'step' is %" PRId64 ", not %" PRId64, lb,
                             rk_ckpt_meta_of(c)->step, r->step);
    rk_ckpt_free(c);
    if (!rc) {
        bool recycled;
        retain(r->rfd, r->rl, r->step, NULL, &recycled);
        if (renameat(r->rfd, r->tmp, r->rfd, r->name) != 0) {
            char eb[128];
            rc = rk_err_set_line(err, rk_err_code_errno(errno), "%s: cannot rename into place: %s",
                                 lb, rk_msg_strerror(errno, eb, sizeof eb));
        } else {
            close(r->rfd);
            free(r);
            return RK_OK;
        }
    }
    rk_snap_recv_abort(r);
    return rc;
}

/* Read and verify generation `step` from the open rank directory: snap-<step>, or when there is
 * none pin-<step>. */
static int get_at(int rfd, const char *rl, int64_t step, rk_ckpt **out, rk_err *err)
{
    char name[RK_CKPT_NAME_MAX], lb[LABEL_MAX + RK_CKPT_NAME_MAX];
    if (rk_snap_file_name(step, name, sizeof name) != RK_OK)
        return rk_err_set_line(err, RK_EINVAL, "%s: step %" PRId64 " is negative", rl, step);
    snprintf(lb, sizeof lb, "%s/%s", rl, name);
    int fd;
    uint64_t size;
    int rc = rk_file_openat_read(rfd, name, lb, SIZE_MAX, &fd, &size, err);
    if (rc == RK_ENOENT) {
        char pin[RK_CKPT_NAME_MAX], pl[LABEL_MAX + RK_CKPT_NAME_MAX];
        rk_snap_pin_name(step, pin, sizeof pin);
        snprintf(pl, sizeof pl, "%s/%s", rl, pin);
        rc = rk_file_openat_read(rfd, pin, pl, SIZE_MAX, &fd, &size, err);
        if (rc != RK_ENOENT)
            memcpy(lb, pl, sizeof lb);
    }
    if (rc == RK_ENOENT)
        return rk_err_set_line(err, RK_ENOENT, "%s: no snapshot of step %" PRId64, lb, step);
    if (rc)
        return rc;
    rk_ckpt *c = NULL;
    rc = rk_ckpt_read_fd(fd, lb, size, &c, err); /* one copy: the file into the kept buffer */
    close(fd);
    if (!rc && rk_ckpt_meta_of(c)->step != step)
        rc = rk_err_set_line(err, RK_EFORMAT,
                             "%s: field 'step' is %" PRId64 " but the file name says %" PRId64, lb,
                             rk_ckpt_meta_of(c)->step, step);
    if (rc || !out)
        rk_ckpt_free(c);
    else
        *out = c;
    return rc;
}

int rk_snap_get(const char *dir, int rank, int64_t step, rk_ckpt **out, rk_err *err)
{
    if (out)
        *out = NULL;
    int rc = check_dir_arg(dir, "rk_snap_get", err);
    if (rc)
        return rc;
    if (rank < 0)
        return rk_err_set_line(err, RK_EINVAL, "%s: rank %d is negative", dir, rank);
    int rfd;
    rc = open_rank(dir, rank, false, &rfd, err);
    if (rc)
        return rc;
    char rname[32], rl[LABEL_MAX];
    snprintf(rname, sizeof rname, RANK_PREFIX "%d", rank);
    rc = get_at(rfd, label(rl, dir, rname, NULL), step, out, err);
    close(rfd);
    return rc;
}

/* Every complete generation and pin of a rank, each step once, newest first (*v: free() it);
 * none if the rank has no directory yet. */
static int rank_steps(const char *dir, int rank, int *rfd, int64_t **v, size_t *n, rk_err *err)
{
    *v = NULL;
    *n = 0;
    int rc = open_rank(dir, rank, false, rfd, err);
    if (rc == RK_ENOENT) {
        /* DIR itself missing is an error; only the rank's directory may be absent */
        int jfd;
        rc = open_checked(AT_FDCWD, dir, dir, &jfd, err);
        if (rc)
            return rc;
        close(jfd);
        *rfd = -1;
        return RK_OK;
    }
    if (rc)
        return rc;
    char rname[32], rl[LABEL_MAX];
    snprintf(rname, sizeof rname, RANK_PREFIX "%d", rank);
    rc = scan_rank(*rfd, label(rl, dir, rname, NULL), SCAN_GENS | SCAN_PINS, v, n, err);
    if (rc) {
        close(*rfd);
        *rfd = -1;
    }
    return rc;
}

int rk_snap_steps(const char *dir, int rank, int64_t *steps, size_t cap, size_t *n, rk_err *err)
{
    if (!n || (cap > 0 && !steps))
        return rk_err_set_line(err, RK_EINVAL, "rk_snap_steps: steps or n is NULL");
    *n = 0;
    int rc = check_dir_arg(dir, "rk_snap_steps", err);
    if (rc)
        return rc;
    if (rank < 0)
        return rk_err_set_line(err, RK_EINVAL, "%s: rank %d is negative", dir, rank);
    int rfd;
    int64_t *v;
    rc = rank_steps(dir, rank, &rfd, &v, n, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < *n && i < cap; i++)
        steps[i] = v[i];
    free(v);
    if (rfd >= 0)
        close(rfd);
    return RK_OK;
}

/* Keep pin `step` and the newest other pins, RK_SNAP_PINS in all; remove the rest. */
static void retain_pins(int rfd, const char *rl, int64_t step)
{
    int64_t *v;
    size_t n, kept = 1; /* `step` itself */
    if (scan_rank(rfd, rl, SCAN_PINS, &v, &n, NULL) != RK_OK)
        return;
    for (size_t i = 0; i < n; i++) { /* newest first */
        char name[RK_CKPT_NAME_MAX];
        if (v[i] == step)
            continue;
        if (kept < RK_SNAP_PINS) {
            kept++;
            continue;
        }
        if (rk_snap_pin_name(v[i], name, sizeof name) == RK_OK)
            unlinkat(rfd, name, 0);
    }
    free(v);
}

int rk_snap_pin(const char *dir, int rank, int64_t step, rk_err *err)
{
    char eb[128], rname[32], rl[LABEL_MAX], gen[RK_CKPT_NAME_MAX], pin[RK_CKPT_NAME_MAX];
    int rc = check_dir_arg(dir, "rk_snap_pin", err);
    if (rc)
        return rc;
    if (rank < 0 || rk_snap_file_name(step, gen, sizeof gen) != RK_OK)
        return rk_err_set_line(err, RK_EINVAL, "%s: rank %d, step %" PRId64 ": negative", dir, rank,
                               step);
    rk_snap_pin_name(step, pin, sizeof pin);
    snprintf(rname, sizeof rname, RANK_PREFIX "%d", rank);
    label(rl, dir, rname, NULL);
    int rfd;
    rc = open_rank(dir, rank, false, &rfd, err);
    if (rc == RK_ENOENT)
        return rk_err_set_line(err, RK_ENOENT, "%s/%s: no snapshot of step %" PRId64 " to pin", rl,
                               gen, step);
    if (rc)
        return rc;
    struct stat gs, ps;
    if (fstatat(rfd, gen, &gs, AT_SYMLINK_NOFOLLOW) != 0) {
        int e = errno;
        close(rfd);
        return e == ENOENT
                   ? rk_err_set_line(err, RK_ENOENT,
                                     "%s/%s: no snapshot of step %" PRId64 " to pin", rl, gen, step)
                   : rk_err_set_line(err, rk_err_code_errno(e), "%s/%s: cannot stat: %s", rl, gen,
                                     rk_msg_strerror(e, eb, sizeof eb));
    }
    if (!S_ISREG(gs.st_mode)) {
        close(rfd);
        return rk_err_set_line(err, RK_EINVAL, "%s/%s: is %s, not a regular file: not pinned", rl,
                               gen, rk_file_kind_name(gs.st_mode));
    }
    /* already this generation's pin: nothing to link (renaming a link onto another link of
     * the same file would leave the temporary name) */
    bool linked = fstatat(rfd, pin, &ps, AT_SYMLINK_NOFOLLOW) == 0 && ps.st_ino == gs.st_ino &&
                  ps.st_dev == gs.st_dev;
    if (!linked) {
        char tmp[RK_CKPT_NAME_MAX + 64];
        const char *what = "cannot link";
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%lu", pin, (long)getpid(),
                 atomic_fetch_add(&tmp_counter, 1));
        int e = linkat(rfd, gen, rfd, tmp, 0) != 0 ? errno : 0;
        if (!e && renameat(rfd, tmp, rfd, pin) != 0) {
            e = errno;
            what = "cannot rename the pin into place";
        }
        if (e) {
            unlinkat(rfd, tmp, 0);
            close(rfd);
            return rk_err_set_line(err, rk_err_code_errno(e), "%s/%s: %s: %s", rl, pin, what,
                                   rk_msg_strerror(e, eb, sizeof eb));
        }
    }
    retain_pins(rfd, rl, step);
    close(rfd);
    return RK_OK;
}

/* Remove rank `rank`'s pins of the steps in [lo, hi) but `spare`'s (-1: none); `fn` names the
 * caller. No rank directory: nothing to remove. The first pin that cannot be removed is the
 * error (the others are still tried). */
static int unpin_range(const char *dir, int rank, int64_t lo, int64_t hi, int64_t spare,
                       const char *fn, rk_err *err)
{
    char eb[128], rname[32], rl[LABEL_MAX];
    int rc = check_dir_arg(dir, fn, err);
    if (rc)
        return rc;
    if (rank < 0 || lo < 0)
        return rk_err_set_line(err, RK_EINVAL, "%s: rank %d, step %" PRId64 ": negative", dir, rank,
                               lo);
    snprintf(rname, sizeof rname, RANK_PREFIX "%d", rank);
    label(rl, dir, rname, NULL);
    int rfd;
    rc = open_rank(dir, rank, false, &rfd, err);
    if (rc == RK_ENOENT)
        return RK_OK;
    if (rc)
        return rc;
    int64_t *v;
    size_t n;
    int bad = RK_OK;
    rc = scan_rank(rfd, rl, SCAN_PINS, &v, &n, err);
    for (size_t i = 0; !rc && i < n; i++) {
        char name[RK_CKPT_NAME_MAX];
        if (v[i] < lo || v[i] >= hi || v[i] == spare ||
            rk_snap_pin_name(v[i], name, sizeof name) != RK_OK || unlinkat(rfd, name, 0) == 0 ||
            errno == ENOENT)
            continue;
        int e = errno;
        if (!bad) /* the first failure is the answer; the rest are still tried */
            bad = rk_err_set_line(err, rk_err_code_errno(e), "%s/%s: cannot remove the pin: %s", rl,
                                  name, rk_msg_strerror(e, eb, sizeof eb));
    }
    free(v);
    close(rfd);
    return rc ? rc : bad;
}

int rk_snap_unpin(const char *dir, int rank, int64_t step, rk_err *err)
{
    return unpin_range(dir, rank, step, step + 1, -1, "rk_snap_unpin", err);
}

int rk_snap_unpin_below(const char *dir, int rank, int64_t step, int64_t spare, rk_err *err)
{
    return unpin_range(dir, rank, 0, step, spare, "rk_snap_unpin_below", err);
}

/* Append one line to the report, cut to fit (the buffer stays NUL-terminated). */
static void report_add(char *r, size_t cap, const char *line)
{
    if (!r || cap == 0)
        return;
    size_t used = strnlen(r, cap - 1);
    snprintf(r + used, cap - used, "%s\n", line);
}

static bool has_step(const int64_t *v, size_t n, int64_t s)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == s)
            return true;
    return false;
}

int rk_snap_agree(const char *dir, int world, int64_t *step, char *report, size_t report_len,
                  rk_err *err)
{
    if (report && report_len)
        report[0] = '\0';
    if (!step)
        return rk_err_set_line(err, RK_EINVAL, "rk_snap_agree: step is NULL");
    *step = -1;
    int rc = check_dir_arg(dir, "rk_snap_agree", err);
    if (rc)
        return rc;
    if (world < 1)
        return rk_err_set_line(err, RK_EINVAL, "%s: world size %d is not at least 1", dir, world);
    int *fds = malloc((size_t)world * sizeof *fds);
    int64_t **steps = calloc((size_t)world, sizeof *steps);
    size_t *ns = calloc((size_t)world, sizeof *ns);
    if (!fds || !steps || !ns) {
        free(fds);
        free(steps);
        free(ns);
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    }
    int opened = 0;
    for (; opened < world && !rc; opened++)
        rc = rank_steps(dir, opened, &fds[opened], &steps[opened], &ns[opened], err);
    if (rc)
        opened--; /* the failed one holds nothing */
    int missing = -1;
    for (int r = 0; r < opened && !rc && missing < 0; r++)
        if (ns[r] == 0)
            missing = r;
    bool found = false;
    size_t skipped = 0;
    char last[RK_ERR_MSG_MAX] = "";
    /* candidates: rank 0's steps, newest first; a step is taken when every rank has it and
     * every one of those generations verifies */
    for (size_t i = 0; !rc && missing < 0 && !found && i < ns[0]; i++) {
        int64_t s = steps[0][i];
        bool all = true;
        for (int r = 1; r < world && all; r++)
            all = has_step(steps[r], ns[r], s);
        for (int r = 0; r < world && all; r++) {
            char rname[32], rl[LABEL_MAX];
            snprintf(rname, sizeof rname, RANK_PREFIX "%d", r);
            rk_err e2;
            int grc = get_at(fds[r], label(rl, dir, rname, NULL), s, NULL, &e2);
            if (grc == RK_ENOMEM) {
                rc = rk_err_set_line(err, RK_ENOMEM, "%s", e2.msg);
                all = false;
            } else if (grc) {
                report_add(report, report_len, e2.msg);
                snprintf(last, sizeof last, "%s", e2.msg);
                skipped++;
                all = false;
            }
        }
        if (all && !rc) {
            *step = s;
            found = true;
        }
    }
    for (int r = 0; r < opened; r++) {
        if (fds[r] >= 0)
            close(fds[r]);
        free(steps[r]);
    }
    free(fds);
    free(steps);
    free(ns);
    if (rc || found)
        return rc;
    if (missing >= 0)
        return rk_err_set_line(err, RK_ENOENT, "%s: rank %d has no snapshot", dir, missing);
    if (skipped == 0)
        return rk_err_set_line(err, RK_ENOENT, "%s: the %d ranks have no snapshot step in common",
                               dir, world);
    return rk_err_set_line(err, RK_ENOENT,
                           "%s: no snapshot step that every rank has and that verifies (%zu "
                           "generation%s skipped, last: %s)",
                           dir, skipped, skipped == 1 ? "" : "s", last);
}

/* ---- the job's directory ---------------------------------------------------------------- */

int rk_snap_agree_held(const int64_t *held, int world, int keep, int64_t *step, rk_err *err)
{
    *step = -1;
    if (!held || world < 1 || keep < 1)
        return rk_err_set(err, RK_EINVAL, "rk_snap_agree_held: no steps, world %d, keep %d", world,
                          keep);
    for (int k = 0; k < keep; k++) { /* rank 0's, newest first */
        int64_t cand = held[k];
        if (cand < 0)
            continue;
        int everyone = 1;
        for (int r = 1; r < world && everyone; r++) {
            int has = 0;
            for (int q = 0; q < keep; q++)
                has |= held[(size_t)r * (size_t)keep + (size_t)q] == cand;
            everyone = has;
        }
        if (everyone && cand > *step)
            *step = cand;
    }
    return *step >= 0
               ? RK_OK
               : rk_err_set(err, RK_ENOENT, "no step that every one of %d ranks holds", world);
}

int rk_snap_dir_check(const char *dir, rk_err *err)
{
    int rc = check_dir_arg(dir, "rk_snap_dir_check", err);
    if (rc)
        return rc;
    int fd;
    rc = open_checked(AT_FDCWD, dir, dir, &fd, err);
    if (!rc)
        close(fd);
    return rc;
}

/* Process `pid`'s start time (clock ticks after boot); 0 if it cannot be read (gone). */
static unsigned long long start_time_of(long pid)
{
    unsigned long long t = 0;
    return rk_proc_stat((pid_t)pid, NULL, NULL, &t) == 0 ? t : 0;
}

/* This process's PID namespace's inode (0 if unknown). */
static unsigned long long pidns_of_self(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

#define OWNER_MAX 256 /* bytes of a .owner file */

/* DIR/.owner for the directory just made (O_EXCL, 0600, no link followed). */
static int write_owner(const char *dir, rk_err *err)
{
    char path[RK_SNAP_PATH_MAX + 16], line[OWNER_MAX], eb[128];
    long pid = (long)getpid();
    int n = snprintf(line, sizeof line, "rk-snap-owner pid=%ld start=%llu pidns=%llu\n", pid,
                     start_time_of(pid), pidns_of_self());
    snprintf(path, sizeof path, "%s/" RK_SNAP_OWNER_NAME, dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, line, (size_t)n) != n) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot write: %s", path,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    close(fd);
    return RK_OK;
}

int rk_snap_dir_make(const char *parent, char *out, size_t cap, rk_err *err)
{
    char eb[128];
    if (!out || cap == 0)
        return rk_err_set_line(err, RK_EINVAL, "rk_snap_dir_make: out is NULL");
    out[0] = '\0';
    if (!parent)
        parent = RK_SNAP_PARENT_DEFAULT;
    if (!*parent)
        return rk_err_set_line(err, RK_EINVAL, "rk_snap_dir_make: empty parent directory");
    struct stat st;
    if (stat(parent, &st) != 0) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot use as the parent of "
                               "snapshots: %s",
                               parent, rk_msg_strerror(e, eb, sizeof eb));
    }
    if (!S_ISDIR(st.st_mode))
        return rk_err_set_line(err, RK_EINVAL, "%s: is %s, not a directory", parent,
                               rk_file_kind_name(st.st_mode));
    size_t pl = strlen(parent);
    const char *sep = pl > 0 && parent[pl - 1] == '/' ? "" : "/";
    char tmpl[RK_SNAP_PATH_MAX];
    int w = snprintf(tmpl, sizeof tmpl, "%s%s" RK_SNAP_DIR_PREFIX "XXXXXX", parent, sep);
    if (w < 0 || (size_t)w >= sizeof tmpl || (size_t)w >= cap)
        return rk_err_set_line(err, RK_EINVAL, "%s: path too long for a snapshot directory",
                               parent);
    if (!mkdtemp(tmpl)) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot make a snapshot directory: %s", parent,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    int rc = rk_snap_dir_check(tmpl, err);
    if (!rc)
        rc = write_owner(tmpl, err);
    if (rc) {
        rmdir(tmpl);
        return rc;
    }
    memcpy(out, tmpl, (size_t)w + 1);
    return RK_OK;
}

/* Whether entry `name` of a rank directory is the store's: a generation, a pin or a temporary
 * one. */
static bool rank_entry_ours(int dfd, const char *name)
{
    (void)dfd;
    return held_name_step(name, SCAN_GENS | SCAN_PINS, NULL) || temp_of_held(name, NULL);
}

/* Whether entry `name` of the cache goes with it: anything but a directory (a link: the link
 * itself, never what it points to). */
static bool cache_entry_ours(int dfd, const char *name)
{
    struct stat st;
    return strcmp(name, ".") && strcmp(name, "..") &&
           fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode);
}

/* Remove what subdirectory `name` of the job directory holds that `ours` says is the store's,
 * then it (a rank directory, or the cache); `sl` names it in messages. */
static int remove_subdir(int jfd, const char *name, const char *sl,
                         bool (*ours)(int dfd, const char *name), rk_err *err)
{
    char eb[128];
    int sfd;
    int rc = open_checked(jfd, name, sl, &sfd, err);
    if (rc)
        return rc;
    /* rk-fd: sfd is O_CLOEXEC (open_checked) */
    DIR *d = fdopendir(sfd);
    if (!d) {
        close(sfd);
        return rk_err_set_line(err, RK_EIO, "%s: cannot list", sl);
    }
    struct dirent *de;
    while ((de = readdir(d)))
        if (ours(dirfd(d), de->d_name))
            unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
    if (unlinkat(jfd, name, AT_REMOVEDIR) != 0) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot remove: %s (a file not made by the snapshot store "
                               "is left)",
                               sl, rk_msg_strerror(e, eb, sizeof eb));
    }
    return RK_OK;
}

/* The job directory `dir` (relative to `at`; `dl` names it), checked and opened (*jfd), and a
 * listing of it (*d, on its own descriptor): the caller closes both. */
static int open_listing_at(int at, const char *dir, const char *dl, int *jfd, DIR **d, rk_err *err)
{
    int rc = open_checked(at, dir, dl, jfd, err);
    if (rc)
        return rc;
    int j2 = fcntl(*jfd, F_DUPFD_CLOEXEC, 0);
    /* rk-fd: j2 is close-on-exec (F_DUPFD_CLOEXEC above) */
    *d = j2 >= 0 ? fdopendir(j2) : NULL;
    if (!*d) {
        if (j2 >= 0)
            close(j2);
        close(*jfd);
        *jfd = -1;
        return rk_err_set_line(err, RK_EIO, "%s: cannot list", dl);
    }
    return RK_OK;
}

static int open_listing(const char *dir, int *jfd, DIR **d, rk_err *err)
{
    return open_listing_at(AT_FDCWD, dir, dir, jfd, d, err);
}

/* Remove the job directory `dir` (relative to `at`; `dl` names it): its rank directories, and
 * when `top` its cache and DIR/held (the same way, without a cache or a held of its own), then
 * it. */
static int remove_job_at(int at, const char *dir, const char *dl, bool top, rk_err *err)
{
    char eb[128];
    int jfd;
    DIR *d;
    int rc = open_listing_at(at, dir, dl, &jfd, &d, err);
    if (rc)
        return rc;
    struct dirent *de;
    while ((de = readdir(d))) {
        int r;
        bool cache = top && !strcmp(de->d_name, CACHE_NAME);
        bool held = top && !strcmp(de->d_name, RK_SNAP_HELD_NAME);
        if (!cache && !held && !rank_of_name(de->d_name, &r))
            continue;
        char rl[LABEL_MAX];
        rk_err e2;
        label(rl, dl, de->d_name, NULL);
        int rrc = held ? remove_job_at(jfd, de->d_name, rl, false, &e2)
                       : remove_subdir(jfd, de->d_name, rl,
                                       cache ? cache_entry_ours : rank_entry_ours, &e2);
        if (rrc && !rc)
            rc = rk_err_set_line(err, rrc, "%s", e2.msg);
    }
    closedir(d);
    struct stat ost;
    if (top && fstatat(jfd, RK_SNAP_OWNER_NAME, &ost, AT_SYMLINK_NOFOLLOW) == 0 &&
        (S_ISREG(ost.st_mode) || S_ISLNK(ost.st_mode))) /* a link: the link, not its target */
        unlinkat(jfd, RK_SNAP_OWNER_NAME, 0);
    close(jfd);
    if (!rc && unlinkat(at, dir, AT_REMOVEDIR) != 0) {
        int e = errno;
        rc = rk_err_set_line(err, rk_err_code_errno(e),
                             "%s: cannot remove: %s (a file not made by the snapshot store is "
                             "left)",
                             dl, rk_msg_strerror(e, eb, sizeof eb));
    }
    return rc;
}

int rk_snap_dir_remove(const char *dir, rk_err *err)
{
    int rc = check_dir_arg(dir, "rk_snap_dir_remove", err);
    return rc ? rc : remove_job_at(AT_FDCWD, dir, dir, true, err);
}

/* 1 if job directory `dir`'s .owner names a process of this PID namespace that is gone. */
static int owner_gone(const char *dir)
{
    char path[RK_SNAP_PATH_MAX + 16], buf[OWNER_MAX + 1];
    snprintf(path, sizeof path, "%s/" RK_SNAP_OWNER_NAME, dir);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > OWNER_MAX ||
        st.st_uid != geteuid()) {
        close(fd);
        return 0;
    }
    ssize_t n = read(fd, buf, OWNER_MAX);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    long pid;
    unsigned long long start, ns;
    if (sscanf(buf, "rk-snap-owner pid=%ld start=%llu pidns=%llu", &pid, &start, &ns) != 3 ||
        pid <= 0 || ns == 0 || ns != pidns_of_self())
        return 0; /* another namespace's pids mean nothing here */
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 1;
    unsigned long long now = start_time_of(pid);
    return now != 0 && start != 0 && now != start; /* the pid was taken again */
}

int rk_snap_dir_sweep(const char *parent, int *removed, uint64_t *bytes, char *names, size_t cap,
                      rk_err *err)
{
    char eb[128];
    if (removed)
        *removed = 0;
    if (bytes)
        *bytes = 0;
    if (names && cap)
        names[0] = '\0';
    if (!parent)
        parent = RK_SNAP_PARENT_DEFAULT;
    DIR *d = opendir(parent);
    /* rk-fd: opendir opens its descriptor close-on-exec (glibc: O_CLOEXEC) */
    if (!d) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot list: %s", parent,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    size_t used = 0, pl = strlen(parent);
    const char *sep = pl > 0 && parent[pl - 1] == '/' ? "" : "/";
    for (struct dirent *de; (de = readdir(d));) {
        if (strncmp(de->d_name, RK_SNAP_DIR_PREFIX, strlen(RK_SNAP_DIR_PREFIX)) != 0)
            continue;
        char dir[RK_SNAP_PATH_MAX];
        int w = snprintf(dir, sizeof dir, "%s%s%s", parent, sep, de->d_name);
        rk_err e = {0};
        if (w < 0 || (size_t)w >= sizeof dir || rk_snap_dir_check(dir, &e) != RK_OK ||
            !owner_gone(dir))
            continue; /* not ours, not a directory we made, or in use */
        uint64_t b = 0;
        if (rk_snap_bytes(dir, &b, &e) != RK_OK)
            b = 0;
        if (rk_snap_dir_remove(dir, &e) != RK_OK)
            continue;
        if (removed)
            ++*removed;
        if (bytes)
            *bytes += b;
        if (names && used + 1 < cap) {
            int k = snprintf(names + used, cap - used, "%s%s", used ? ", " : "", dir);
            used += k < 0 ? 0 : (size_t)k < cap - used ? (size_t)k : cap - used - 1;
        }
    }
    closedir(d);
    return RK_OK;
}

/* The bytes and the number of the complete generations and pins in the open rank directory
 * `rfd`, each file once (a pin linked to a generation is the generation's memory). */
static int rank_dir_bytes(int rfd, const char *rl, uint64_t *bytes, int *gens, rk_err *err)
{
    *bytes = 0;
    *gens = 0;
    int64_t *v = NULL;
    size_t n = 0;
    int rc = scan_rank(rfd, rl, SCAN_GENS | SCAN_PINS, &v, &n, err);
    ino_t *seen = rc || n == 0 ? NULL : malloc(2 * n * sizeof *seen);
    if (!rc && n > 0 && !seen)
        rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", rl);
    size_t ns = 0;
    for (size_t i = 0; !rc && i < 2 * n; i++) {
        char name[RK_CKPT_NAME_MAX];
        struct stat st;
        int nrc = i % 2 ? rk_snap_pin_name(v[i / 2], name, sizeof name)
                        : rk_snap_file_name(v[i / 2], name, sizeof name);
        if (nrc != RK_OK || fstatat(rfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode))
            continue;
        bool dup = false; /* one directory: one device */
        for (size_t k = 0; k < ns && !dup; k++)
            dup = seen[k] == st.st_ino;
        if (dup)
            continue;
        seen[ns++] = st.st_ino;
        *bytes += (uint64_t)st.st_size;
        ++*gens;
    }
    free(seen);
    free(v);
    return rc;
}

int rk_snap_bytes(const char *dir, uint64_t *bytes, rk_err *err)
{
    if (!bytes)
        return rk_err_set_line(err, RK_EINVAL, "rk_snap_bytes: bytes is NULL");
    *bytes = 0;
    int rc = check_dir_arg(dir, "rk_snap_bytes", err);
    if (rc)
        return rc;
    int jfd;
    DIR *d;
    rc = open_listing(dir, &jfd, &d, err);
    if (rc)
        return rc;
    uint64_t sum = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        int r, rfd, gens;
        if (!rank_of_name(de->d_name, &r))
            continue;
        char rl[LABEL_MAX];
        uint64_t b = 0;
        label(rl, dir, de->d_name, NULL);
        rc = open_checked(jfd, de->d_name, rl, &rfd, err);
        if (!rc)
            rc = rank_dir_bytes(rfd, rl, &b, &gens, err);
        sum += b;
        if (rfd >= 0)
            close(rfd);
    }
    closedir(d);
    close(jfd);
    if (!rc)
        *bytes = sum;
    return rc;
}

int rk_snap_rank_bytes(const char *dir, int rank, uint64_t *bytes, int *gens, rk_err *err)
{
    if (!bytes || !gens)
        return rk_err_set_line(err, RK_EINVAL, "rk_snap_rank_bytes: bytes or gens is NULL");
    *bytes = 0;
    *gens = 0;
    int rc = check_dir_arg(dir, "rk_snap_rank_bytes", err);
    if (rc)
        return rc;
    if (rank < 0)
        return rk_err_set_line(err, RK_EINVAL, "%s: rank %d is negative", dir, rank);
    int rfd;
    int64_t *v;
    size_t n;
    rc = rank_steps(dir, rank, &rfd, &v, &n, err); /* checks DIR; no rank directory: none */
    free(v);
    if (rc || rfd < 0)
        return rc;
    char rname[32], rl[LABEL_MAX];
    snprintf(rname, sizeof rname, RANK_PREFIX "%d", rank);
    rc = rank_dir_bytes(rfd, label(rl, dir, rname, NULL), bytes, gens, err);
    close(rfd);
    return rc;
}

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* /proc/meminfo's MemAvailable and MemTotal in bytes (*have 0: the kernel says no
 * MemAvailable, or the file cannot be read: the RAM half of the rule is skipped), MemAvailable
 * replaced by RK_SNAP_MEMAVAIL_ENV when set. The file is read once, at most 16 KiB. */
static int mem_info(uint64_t *avail, uint64_t *total, int *have, rk_err *err)
{
    *avail = *total = 0;
    *have = 0;
    char buf[16384];
    size_t len = 0;
    int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && len < sizeof buf - 1) {
        ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    if (fd >= 0)
        close(fd);
    buf[len] = '\0';
    static const char *const keys[2] = {"MemAvailable:", "MemTotal:"};
    uint64_t *out[2] = {avail, total};
    for (int k = 0; k < 2; k++) {
        size_t kl = strlen(keys[k]);
        for (const char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
            if (strncmp(p, keys[k], kl) != 0)
                continue;
            const char *q = p + kl;
            while (*q == ' ')
                q++;
            size_t nd = strspn(q, "0123456789");
            int64_t kib;
            if (nd > 0 && strncmp(q + nd, " kB", 3) == 0 && ckpt_parse_u63(q, nd, &kib) &&
                !__builtin_mul_overflow((uint64_t)kib, (uint64_t)1024, out[k]) && k == 0)
                *have = 1;
            break;
        }
    }
    const char *o = rk_env_override(RK_SNAP_MEMAVAIL_ENV);
    if (o && *o) {
        int64_t v;
        if (!ckpt_parse_u63(o, strlen(o), &v))
            return rk_err_set_line(
                err, RK_EINVAL, RK_SNAP_MEMAVAIL_ENV "='%.64s': not a count of bytes (decimal)", o);
        *avail = (uint64_t)v;
        *have = 1;
    }
    return RK_OK;
}

int rk_snap_room(const char *dir, uint64_t bytes_per_gen, int ranks_here, int *ok, char *why,
                 size_t why_len, rk_err *err)
{
    char eb[128];
    if (why && why_len)
        why[0] = '\0';
    if (!ok)
        return rk_err_set_line(err, RK_EINVAL, "rk_snap_room: ok is NULL");
    *ok = 0;
    if (ranks_here < 1)
        return rk_err_set_line(err, RK_EINVAL, "rk_snap_room: %d local ranks", ranks_here);
    uint64_t held;
    int rc = rk_snap_bytes(dir, &held, err);
    if (rc)
        return rc;
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e), "%s: statvfs failed: %s", dir,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    uint64_t ram_avail, ram_total;
    int have_ram;
    rc = mem_info(&ram_avail, &ram_total, &have_ram, err);
    if (rc)
        return rc;
    uint64_t frsize = sv.f_frsize ? (uint64_t)sv.f_frsize : (uint64_t)sv.f_bsize;
    uint64_t total = 0, avail = 0, need = 0, margin, ram_margin;
    bool over = __builtin_mul_overflow((uint64_t)sv.f_blocks, frsize, &total) ||
                __builtin_mul_overflow((uint64_t)sv.f_bavail, frsize, &avail) ||
                __builtin_mul_overflow(bytes_per_gen, (uint64_t)ranks_here, &need) ||
                __builtin_mul_overflow(need, (uint64_t)RK_SNAP_KEEP, &need);
    margin = total / RK_SNAP_MARGIN_DIV;
    if (margin < RK_SNAP_MARGIN_MIN)
        margin = RK_SNAP_MARGIN_MIN;
    ram_margin = ram_total / RK_SNAP_MARGIN_DIV;
    if (ram_margin < RK_SNAP_MARGIN_MIN)
        ram_margin = RK_SNAP_MARGIN_MIN;
    uint64_t have = avail + held < avail ? UINT64_MAX : avail + held;
    uint64_t want = over || need + margin < need ? UINT64_MAX : need + margin;
    uint64_t ram_have = ram_avail + held < ram_avail ? UINT64_MAX : ram_avail + held;
    uint64_t ram_want = over || need + ram_margin < need ? UINT64_MAX : need + ram_margin;
    bool tmpfs_fits = want <= have, ram_fits = !have_ram || ram_want <= ram_have;
    if (tmpfs_fits && ram_fits) {
        *ok = 1;
        return RK_OK;
    }
    if (why && why_len && !tmpfs_fits)
        snprintf(why, why_len,
                 "%s: snapshots need %.1f MiB (%d generations x %d ranks x %.1f MiB) and a "
                 "margin of %.1f MiB; the tmpfs there has %.1f MiB free and this job holds %.1f "
                 "MiB: %.1f MiB short",
                 dir, mib(over ? UINT64_MAX : need), RK_SNAP_KEEP, ranks_here, mib(bytes_per_gen),
                 mib(margin), mib(avail), mib(held), mib(want - have));
    else if (why && why_len) {
        const char *ov = rk_env_override(RK_SNAP_MEMAVAIL_ENV);
        snprintf(why, why_len,
                 "%s: snapshots need %.1f MiB of RAM (%d generations x %d ranks x %.1f MiB; tmpfs "
                 "pages are RAM) and a margin of %.1f MiB; the node has %.1f MiB of RAM available "
                 "(MemAvailable%s) and this job holds %.1f MiB: %.1f MiB short",
                 dir, mib(over ? UINT64_MAX : need), RK_SNAP_KEEP, ranks_here, mib(bytes_per_gen),
                 mib(ram_margin), mib(ram_avail), ov && *ov ? ", from " RK_SNAP_MEMAVAIL_ENV : "",
                 mib(held), mib(ram_want - ram_have));
    }
    return RK_OK;
}
