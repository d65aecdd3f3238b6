/*
 * The asynchronous checkpoint writer (rekindle/ckpt.h): submit() copies the caller's items
 * into owned memory at a step boundary and runs rk_ckpt_save in a POSIX thread, one write in
 * flight at a time. pthread comes with glibc's libc (2.34 and later); no extra link needed.
 */
#include "base/clock.h"
#include "rekindle/ckpt.h"
#include "runtime/ckpt_internal.h"

#include <pthread.h>
#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The snapshot one write works from. */
typedef struct snapshot {
    rk_ckpt_meta meta;
    char *config;
    rk_ckpt_item *items;
    int64_t (*shapes)[RK_ST_MAX_DIMS];
    char (*dtypes)[16];
    char **names;
    void **data;
    size_t n;
} snapshot;

struct rk_ckpt_writer {
    char *dir;
    int keep;
    pthread_t thread;
    int running;     /* a thread was started and not yet joined */
    atomic_int done; /* the running thread has finished its write */
    snapshot snap;   /* owned by the thread while running */
    int rc;          /* result of the last finished write, until consumed */
    rk_err err;      /* its message */
    double seconds;  /* how long the last finished write took */
};

static void snap_free(snapshot *s)
{
    for (size_t i = 0; i < s->n; i++) {
        if (s->names)
            free(s->names[i]);
        if (s->data)
            free(s->data[i]);
    }
    free(s->names);
    free(s->data);
    free(s->shapes);
    free(s->dtypes);
    free(s->items);
    free(s->config);
    memset(s, 0, sizeof *s);
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* Copy meta and items. Items are checked by rk_ckpt_save later; only what the copy itself
 * needs (names, shapes, sizes) is checked here. */
static int snap_take(snapshot *s, const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n,
                     rk_err *err)
{
    memset(s, 0, sizeof *s);
    if (!meta)
        return rk_err_set(err, RK_EINVAL, "checkpoint writer: meta is NULL");
    if (n > 0 && !items)
        return rk_err_set(err, RK_EINVAL, "checkpoint writer: %zu items but the list is NULL", n);
    s->meta = *meta;
    s->config = meta->config_json ? dup_str(meta->config_json) : NULL;
    s->meta.config_json = s->config;
    size_t m = n ? n : 1;
    s->items = calloc(m, sizeof *s->items);
    s->shapes = calloc(m, sizeof *s->shapes);
    s->dtypes = calloc(m, sizeof *s->dtypes);
    s->names = calloc(m, sizeof *s->names);
    s->data = calloc(m, sizeof *s->data);
    if ((meta->config_json && !s->config) || !s->items || !s->shapes || !s->dtypes || !s->names ||
        !s->data) {
        snap_free(s);
        return rk_err_set(err, RK_ENOMEM, "checkpoint writer: out of memory");
    }
    s->n = n;
    for (size_t i = 0; i < n; i++) {
        const rk_ckpt_item *it = &items[i];
        const char *dt = it->dtype ? it->dtype : "F32";
        size_t es = rk_st_dtype_size(dt);
        if (!it->name || es == 0 || it->ndim < 0 || it->ndim > RK_ST_MAX_DIMS ||
            (it->ndim > 0 && !it->shape)) {
            snap_free(s);
            return rk_err_set(err, RK_EINVAL,
                              "checkpoint writer: item #%zu: bad name, dtype, "
                              "ndim or shape",
                              i);
        }
        size_t numel = 1;
        for (int d = 0; d < it->ndim; d++) {
            size_t v = (size_t)it->shape[d];
            if (it->shape[d] < 0 || (v && numel > SIZE_MAX / v)) {
                snap_free(s);
                return rk_err_set(err, RK_EINVAL, "checkpoint writer: item #%zu: bad shape", i);
            }
            numel *= v;
            s->shapes[i][d] = it->shape[d];
        }
        if (numel > SIZE_MAX / es || (numel && !it->data)) {
            snap_free(s);
            return rk_err_set(err, RK_EINVAL, "checkpoint writer: item #%zu: bad size or data", i);
        }
        size_t nb = numel * es;
        s->names[i] = dup_str(it->name);
        s->data[i] = malloc(nb ? nb : 1);
        if (!s->names[i] || !s->data[i]) {
            snap_free(s);
            return rk_err_set(err, RK_ENOMEM,
                              "checkpoint writer: out of memory for a %zu-byte "
                              "snapshot of item #%zu",
                              nb, i);
        }
        if (nb)
            memcpy(s->data[i], it->data, nb);
        memcpy(s->dtypes[i], dt, strlen(dt) + 1); /* a known dtype: at most 7 bytes */
        s->items[i] = (rk_ckpt_item){s->names[i], s->dtypes[i], it->ndim, s->shapes[i], s->data[i]};
    }
    return RK_OK;
}

static void *write_main(void *arg)
{
    rk_ckpt_writer *w = arg;
#if defined(__linux__) && defined(SYS_gettid)
    /* Lowest CPU priority for this thread only (Linux nice values are per thread): training
     * keeps its cores and the write fills the gaps. The disk does not care about nice. */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
#endif
    double t0 = rk_mono_s();
    w->rc =
        rk_ckpt_save_in(w->dir, &w->snap.meta, w->snap.items, w->snap.n, w->keep, false, &w->err);
    w->seconds = rk_mono_s() - t0;
    atomic_store(&w->done, 1);
    return NULL;
}

/* Join the running thread, if any; its result stays in w->rc until consumed. */
static void join(rk_ckpt_writer *w)
{
    if (!w->running)
        return;
    pthread_join(w->thread, NULL);
    w->running = 0;
    snap_free(&w->snap);
}

/* Hand the last result to the caller and forget it. */
static int consume(rk_ckpt_writer *w, rk_err *err)
{
    int rc = w->rc;
    if (rc && err)
        *err = w->err;
    w->rc = RK_OK;
    return rc;
}

int rk_ckpt_writer_create(rk_ckpt_writer **out, const char *dir, int keep, rk_err *err)
{
    if (!out)
        return rk_err_set(err, RK_EINVAL, "rk_ckpt_writer_create: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return rk_err_set(err, RK_EINVAL, "rk_ckpt_writer_create: empty directory");
    if (keep < 1)
        return rk_err_set(err, RK_EINVAL, "%s: keep %d is not at least 1", dir, keep);
    rk_ckpt_writer *w = calloc(1, sizeof *w);
    char *d = dup_str(dir);
    if (!w || !d) {
        free(w);
        free(d);
        return rk_err_set(err, RK_ENOMEM, "%s: out of memory", dir);
    }
    w->dir = d;
    w->keep = keep;
    atomic_init(&w->done, 0);
    *out = w;
    return RK_OK;
}

int rk_ckpt_writer_submit(rk_ckpt_writer *w, const rk_ckpt_meta *meta, const rk_ckpt_item *items,
                          size_t n, rk_err *err)
{
    if (!w)
        return rk_err_set(err, RK_EINVAL, "rk_ckpt_writer_submit: writer is NULL");
    join(w);
    int rc = consume(w, err);
    if (rc)
        return rc;
    rc = snap_take(&w->snap, meta, items, n, err);
    if (rc)
        return rc;
    atomic_store(&w->done, 0);
    int e = pthread_create(&w->thread, NULL, write_main, w);
    if (e) {
        snap_free(&w->snap);
        return rk_err_set(err, RK_EIO, "%s: cannot start the checkpoint writer thread (error %d)",
                          w->dir, e);
    }
    w->running = 1;
    return RK_OK;
}

int rk_ckpt_writer_wait(rk_ckpt_writer *w, double *last_save_seconds, rk_err *err)
{
    if (!w)
        return rk_err_set(err, RK_EINVAL, "rk_ckpt_writer_wait: writer is NULL");
    join(w);
    if (last_save_seconds)
        *last_save_seconds = w->seconds;
    return consume(w, err);
}

int rk_ckpt_writer_busy(rk_ckpt_writer *w)
{
    return w && w->running && !atomic_load(&w->done);
}

void rk_ckpt_writer_free(rk_ckpt_writer *w)
{
    if (!w)
        return;
    join(w);
    free(w->dir);
    free(w);
}
