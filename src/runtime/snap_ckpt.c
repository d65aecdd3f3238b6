/*
 * A disk checkpoint from the node's snapshots (rekindle/snap.h: rk_snap_to_ckpt,
 * docs/recovery.md "Disk checkpoints from the snapshots"): the job's ranks put and pin their
 * generations of a checkpoint step without touching the disk; rk run reads them here, checks
 * them and writes the checkpoint the job's rank 0 would have written, so that no rank stalls
 * on the disk. Relies on the snapshot store's reader (verified generations) and the
 * checkpoint store's writer.
 */
#include "rekindle/ckpt.h"
#include "rekindle/safetensors.h"
#include "rekindle/snap.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/msg.h"

/* The generation's replica hash (8 bytes), or NULL if it has none. */
static const uint8_t *hash_of(const rk_ckpt *c)
{
    const rk_st_tensor *t = rk_ckpt_find(c, RK_SNAP_HASH_ITEM);
    return t && t->nbytes == 8 ? t->data : NULL;
}

static void add_item(rk_ckpt_item *v, size_t *n, const rk_st_tensor *t)
{
    v[(*n)++] = (rk_ckpt_item){.name = t->name,
                               .dtype = t->dtype,
                               .ndim = t->ndim,
                               .shape = t->ndim ? t->shape : NULL,
                               .data = t->data};
}

/* Rank r's items after rank 0's: all but the hash. */
static void add_rank(rk_ckpt_item *v, size_t *n, const rk_st_file *f)
{
    for (size_t i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, RK_SNAP_HASH_ITEM) != 0)
            add_item(v, n, &f->tensors[i]);
}

int rk_snap_to_ckpt(const char *dir, int world, int64_t step, const char *ckpt_dir, int keep,
                    double *seconds, rk_err *err)
{
    double t0 = rk_mono_s();
    if (seconds)
        *seconds = 0;
    if (!dir || !ckpt_dir || !*ckpt_dir || world < 1 || world > 65536 || step < 0 || keep < 1)
        return rk_err_set_line(
            err, RK_EINVAL, "rk_snap_to_ckpt: bad argument (world %d, step %" PRId64 ", keep %d)",
            world, step, keep);
    rk_ckpt **g = calloc((size_t)world, sizeof *g);
    if (!g)
        return rk_err_set_line(err, RK_ENOMEM, "rk_snap_to_ckpt: out of memory");
    int rc = RK_OK;
    size_t total = 0;
    const uint8_t *h0 = NULL;
    for (int r = 0; r < world && !rc; r++) {
        rk_err e = {0};
        rc = rk_snap_get(dir, r, step, &g[r], &e);
        if (rc == RK_ENOENT) {
            rc = rk_err_set_line(err, RK_ENOENT, "rank %d has no snapshot of step %" PRId64 ": %s",
                                 r, step, e.msg);
            break;
        }
        if (rc) {
            rc = rk_err_set_line(err, rc, "rank %d's snapshot of step %" PRId64 ": %s", r, step,
                                 e.msg);
            break;
        }
        const uint8_t *h = hash_of(g[r]);
        if (r == 0)
            h0 = h;
        else if ((h0 == NULL) != (h == NULL) || (h && memcmp(h, h0, 8) != 0)) {
            rc = rk_err_set_line(err, RK_EFORMAT,
                                 "the replica hash of rank %d's snapshot of step %" PRId64
                                 " differs from rank 0's: the replicas disagree, not saved",
                                 r, step);
            break;
        }
        total += rk_ckpt_file(g[r])->ntensors;
    }
    rk_ckpt_item *v = rc ? NULL : calloc(total ? total : 1, sizeof *v);
    if (!rc && !v)
        rc = rk_err_set_line(err, RK_ENOMEM, "rk_snap_to_ckpt: out of memory");
    if (!rc) {
        const rk_st_file *f0 = rk_ckpt_file(g[0]);
        size_t n = 0, after = f0->ntensors; /* the others' items go after rank 0's last rng.* */
        for (size_t i = 0; i < f0->ntensors; i++)
            if (strncmp(f0->tensors[i].name, "rng.", 4) == 0)
                after = i + 1;
        for (size_t i = 0; i <= f0->ntensors; i++) {
            if (i == after)
                for (int r = 1; r < world; r++)
                    add_rank(v, &n, rk_ckpt_file(g[r]));
            if (i < f0->ntensors && strcmp(f0->tensors[i].name, RK_SNAP_HASH_ITEM) != 0)
                add_item(v, &n, &f0->tensors[i]);
        }
        const rk_ckpt_meta *m = rk_ckpt_meta_of(g[0]);
        rk_err e = {0};
        rc = rk_ckpt_save(ckpt_dir, m, v, n, keep, &e);
        if (rc)
            rk_err_set_line(err, rc, "checkpoint of step %" PRId64 " from the snapshots: %s", step,
                            e.msg);
    }
    free(v);
    for (int r = 0; r < world; r++)
        rk_ckpt_free(g[r]);
    free(g);
    if (seconds)
        *seconds = rk_mono_s() - t0;
    return rc;
}
