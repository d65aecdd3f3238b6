/*
 * The environment rk run gives every rank besides the heartbeat's (docs/run.md, "The ranks'
 * environment"): the torch variables common to all ranks (a free MASTER_PORT, the devices in
 * CUDA_VISIBLE_DEVICES), the rekindle Python package on PYTHONPATH, built once for rk run's
 * launcher and the node agent (rk_rank_env_build), and the per-rank mapping
 * of a launcher's variables to RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE that
 * `rk _rank-env` applies under mpirun and srun.
 */
#include "supervisor/supervisor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int rk_sup_private_socket(const char *prefix, char *dir, size_t dcap, char *sock, size_t scap,
                          int *fd, rk_err *err)
{
    const char *tmp = getenv("TMPDIR");
    *fd = -1;
    sock[0] = '\0';
    snprintf(dir, dcap, "%s/%s.XXXXXX", tmp && *tmp && strlen(tmp) < 32 ? tmp : "/tmp", prefix);
    if (!mkdtemp(dir)) {
        int e = errno;
        dir[0] = '\0';
        return rk_err_set(err, RK_EIO, "cannot create a directory for the heartbeat socket: %s",
                          strerror(e));
    }
    snprintf(sock, scap, "%s/hb.sock", dir);
    *fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
    /* the directory is 0700 (mkdtemp) and the socket 0600: only this user connects */
    if (*fd < 0 || chmod(dir, 0700) < 0 || bind(*fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        chmod(sock, 0600) < 0 || listen(*fd, 256) < 0)
        return rk_err_set(err, RK_EIO, "heartbeat socket %s: %s", sock, strerror(errno));
    return RK_OK;
}

int rk_env_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* 1 if dir/rekindle/__init__.py is a regular file. */
static int holds_package(const char *dir)
{
    char path[4200];
    struct stat st;
    return (size_t)snprintf(path, sizeof path, "%s/rekindle/__init__.py", dir) < sizeof path &&
           stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* 1 if `path` is owned by the effective uid or root and writable by neither group nor
 * others: nobody else can put code there that every rank would import. */
static int trusted(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && (st.st_uid == geteuid() || st.st_uid == 0) &&
           !(st.st_mode & (S_IWGRP | S_IWOTH));
}

/* 1 if `exe` lies inside directory `dir` (both absolute, no trailing '/'). */
static int inside(const char *exe, const char *dir)
{
    size_t n = strlen(dir);
    return n > 1 && strncmp(exe, dir, n) == 0 && exe[n] == '/';
}

/* buf as the package's directory if it holds the package and is trusted; else NULL, and why
 * in why[wcap] when it holds an untrusted one. */
static const char *use_dir(char *buf, char *why, size_t wcap)
{
    if (!holds_package(buf))
        return NULL;
    char pkg[4200];
    snprintf(pkg, sizeof pkg, "%s/rekindle", buf);
    if (trusted(buf) && trusted(pkg))
        return buf;
    if (why && wcap)
        snprintf(why, wcap,
                 "%.4000s is not on the ranks' PYTHONPATH: it (or its rekindle/) is writable by "
                 "others or owned by another user",
                 buf);
    return NULL;
}

const char *rk_env_python_dir(char *buf, size_t cap, char *why, size_t wcap)
{
#ifndef RK_PYTHON_RELDIR
#define RK_PYTHON_RELDIR "share/rekindle/python"
#endif
#ifndef RK_PYTHON_SRCDIR
#define RK_PYTHON_SRCDIR ""
#endif
#ifndef RK_BINARY_DIR
#define RK_BINARY_DIR ""
#endif
    if (why && wcap)
        why[0] = '\0';
    char exe[4096], real[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    /* the source tree's package only for an rk run from its own build tree */
    /* as arrays, not literals: clang refuses `&&` with a constant operand (-Werror) */
    static const char bindir[] = RK_BINARY_DIR, srcdir[] = RK_PYTHON_SRCDIR;
    int in_build = bindir[0] && n > 0 && realpath(bindir, real) && inside(exe, real);
    char *slash = strrchr(exe, '/');
    if (slash && slash != exe) {
        *slash = '\0'; /* <prefix>/bin */
        slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0'; /* <prefix> */
        if ((size_t)snprintf(buf, cap, "%s/%s", exe, RK_PYTHON_RELDIR) < cap &&
            use_dir(buf, why, wcap))
            return buf;
    }
    if (in_build && srcdir[0] && (size_t)snprintf(buf, cap, "%s", srcdir) < cap &&
        use_dir(buf, why, wcap))
        return buf;
    return NULL;
}

/* ---- rk _rank-env ------------------------------------------------------------------------ */

/* A decimal integer 0..max from the whole of `s`; -1 otherwise. */
int rk_rank_env_add(rk_rank_env *e, rk_err *err, const char *fmt, ...)
{
    if (e->n >= RK_RANK_ENV_MAX)
        return rk_err_set(err, RK_EINVAL, "more than %d variables for the ranks", RK_RANK_ENV_MAX);
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(e->buf + e->used, sizeof e->buf - e->used, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= sizeof e->buf - e->used) {
        e->buf[e->used] = '\0';
        return rk_err_set(err, RK_EINVAL, "the ranks' environment is longer than %zu bytes",
                          sizeof e->buf);
    }
    e->env[e->n++] = e->buf + e->used;
    e->env[e->n] = NULL;
    e->used += (size_t)w + 1;
    return RK_OK;
}

int rk_rank_env_build(rk_rank_env *e, const rk_rank_env_opts *o, rk_err *err)
{
    e->n = 0;
    e->used = 0;
    e->env[0] = NULL;
    e->why[0] = '\0';
    int rc = rk_rank_env_add(e, err, "RK_HEARTBEAT=%s", o->heartbeat);
    if (!rc)
        rc = rk_rank_env_add(e, err, "RK_DEVICES=%s", o->devices);
    if (!rc && o->by_host)
        rc = rk_rank_env_add(e, err, "RK_DEVICES_BY_HOST=1");
    if (!rc)
        rc = rk_rank_env_add(e, err, "RK_LAUNCH=%d", o->launch);
    /* what torch.distributed and torchrun's users read (RANK and LOCAL_RANK: per rank, set by
     * the keeper or by rk _rank-env; docs/run.md) */
    if (!rc)
        rc = rk_rank_env_add(e, err, "WORLD_SIZE=%d", o->world);
    if (!rc)
        rc = rk_rank_env_add(e, err, "LOCAL_WORLD_SIZE=%d", o->local_world);
    if (!rc && o->rank_base >= 0)
        rc = rk_rank_env_add(e, err, "RK_RANK_BASE=%d", o->rank_base);
    if (!rc && o->master_addr)
        rc = rk_rank_env_add(e, err, "MASTER_ADDR=%s", o->master_addr);
    if (!rc && o->master_port > 0)
        rc = rk_rank_env_add(e, err, "MASTER_PORT=%d", o->master_port);
    if (!rc && o->cuda_visible)
        rc = rk_rank_env_add(e, err, "CUDA_VISIBLE_DEVICES=%s", o->cuda_visible);
    if (!rc && !getenv("CUDA_DEVICE_ORDER")) /* CUDA's numbering is then NVML's, the ids' */
        rc = rk_rank_env_add(e, err, "CUDA_DEVICE_ORDER=PCI_BUS_ID");
    if (!rc && o->omp_one)
        rc = rk_rank_env_add(e, err, "OMP_NUM_THREADS=1");
    if (!rc)
        rc = rk_rank_env_add(e, err, "TORCHELASTIC_RESTART_COUNT=%d", o->launch);
    if (!rc && o->stack_dir)
        rc = rk_rank_env_add(e, err, "RK_STACK_DIR=%s", o->stack_dir);
    if (!rc && o->pythonpath) {
        char dir[4096];
        const char *old = getenv("PYTHONPATH");
        if (rk_env_python_dir(dir, sizeof dir, e->why, sizeof e->why)) {
            e->why[0] = '\0';  /* one found: no need to say why another was skipped */
            rk_err skip = {0}; /* too long: left as it is */
            (void)rk_rank_env_add(e, &skip, "PYTHONPATH=%s%s%s", dir, old && *old ? ":" : "",
                                  old ? old : "");
        }
    }
    if (!rc && o->ckpt_dir)
        rc = rk_rank_env_add(e, err, "RK_CKPT_DIR=%s", o->ckpt_dir);
    if (!rc && o->ckpt_dir)
        rc = rk_rank_env_add(e, err, "RK_RESUME=1");
    if (!rc && o->snap_dir)
        rc = rk_rank_env_add(e, err, "RK_SNAP_DIR=%s", o->snap_dir);
    if (!rc && o->snap_dirs)
        rc = rk_rank_env_add(e, err, "RK_SNAP_DIRS=%s", o->snap_dirs);
    if (!rc && o->ckpt_from_snap && o->snap_dir && o->ckpt_dir)
        rc = rk_rank_env_add(e, err, "RK_CKPT_FROM_SNAP=1");
    if (!rc && o->snap_pin_every == RK_SUP_PARTNER_AUTO)
        rc = rk_rank_env_add(e, err, "RK_SNAP_PIN_EVERY=auto");
    else if (!rc && o->snap_pin_every > 0)
        rc = rk_rank_env_add(e, err, "RK_SNAP_PIN_EVERY=%d", o->snap_pin_every);
    if (!rc && o->inject)
        rc = rk_rank_env_add(e, err, "RK_INJECT=%s", o->inject);
    if (!rc && o->inject && o->inject_done && o->inject_done[0])
        rc = rk_rank_env_add(e, err, "RK_INJECT_DONE=%s", o->inject_done);
    return rc;
}

static long whole_int(const char *s, long max)
{
    if (!s || !*s)
        return -1;
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v < 0 || v > max || (s[0] < '0' || s[0] > '9') ? -1 : v;
}

/* Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of 3 nodes, then 1) for node
 * `node`, at most `max`; -1 if it says nothing about it (or more). */
static long slurm_tasks_on(const char *spec, long node, long max)
{
    for (const char *p = spec; p && *p && node >= 0;) {
        char *end;
        long tasks = strtol(p, &end, 10), times = 1;
        if (end == p || tasks < 1 || tasks > max)
            return -1;
        p = end;
        if (strncmp(p, "(x", 2) == 0) {
            times = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || times < 1 || times > max)
                return -1;
            p = end + 1;
        }
        if (node < times)
            return tasks;
        node -= times;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return -1;
}

int rk_env_rank_map(const char *(*get)(const char *name), long out[4])
{
    static const char *const sets[][4] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
    };
    const long max = RK_HB_RANK_MAX + 1;
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        long rank = whole_int(get(sets[k][0]), max), world = whole_int(get(sets[k][1]), max);
        if (rank < 0 || world < 1 || rank >= world)
            continue;
        long lrank = whole_int(get(sets[k][2]), max), lworld = -1;
        if (sets[k][3])
            lworld = whole_int(get(sets[k][3]), max);
        else
            lworld = slurm_tasks_on(get("SLURM_TASKS_PER_NODE"),
                                    whole_int(get("SLURM_NODEID"), max), max);
        /* nothing (or nothing consistent) about the node: one node */
        if (lrank < 0 || lworld < 1 || lrank >= lworld || lworld > world) {
            lrank = rank;
            lworld = world;
        }
        out[0] = rank;
        out[1] = world;
        out[2] = lrank;
        out[3] = lworld;
        return 1;
    }
    return 0;
}
