/* Communicator dispatch (rekindle/comm.h) and the single-process "self" backend. */
#include "comm/comm.h"

#include <stdlib.h>
#include <string.h>

static int self_open(rk_comm *c, rk_err *err)
{
    (void)err;
    c->rank = 0;
    c->size = 1;
    c->local_size = 1;
    return RK_OK;
}

static void self_close(rk_comm *c) { (void)c; }

static int self_f32(rk_comm *c, float *buf, size_t n, rk_err *err)
{
    (void)c, (void)buf, (void)n, (void)err;
    return RK_OK;
}

static int self_f64(rk_comm *c, double *buf, size_t n, rk_err *err)
{
    (void)c, (void)buf, (void)n, (void)err;
    return RK_OK;
}

static int self_allgather(rk_comm *c, uint64_t mine, uint64_t *all, rk_err *err)
{
    (void)c, (void)err;
    all[0] = mine;
    return RK_OK;
}

static int self_bcast(rk_comm *c, void *buf, size_t bytes, int root, rk_err *err)
{
    (void)c, (void)buf, (void)bytes;
    if (root != 0)
        return rk_err_set(err, RK_EINVAL, "comm: broadcast root %d of a 1-rank job", root);
    return RK_OK;
}

static int self_barrier(rk_comm *c, rk_err *err)
{
    (void)c, (void)err;
    return RK_OK;
}

const rk_comm_ops rk_comm_self_ops = {
    .name = "self",
    .open = self_open,
    .close = self_close,
    .allreduce_f32 = self_f32,
    .allreduce_f64 = self_f64,
    .allgather_u64 = self_allgather,
    .bcast = self_bcast,
    .barrier = self_barrier,
};

static int launched_by_mpi(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int rk_comm_open(rk_comm **out, const char *backend, rk_err *err)
{
    *out = NULL;
    const rk_comm_ops *ops;
    if (strcmp(backend, "self") == 0)
        ops = &rk_comm_self_ops;
    else if (strcmp(backend, "mpi") == 0)
        ops = &rk_comm_mpi_ops;
    else if (strcmp(backend, "auto") == 0)
        ops = launched_by_mpi() ? &rk_comm_mpi_ops : &rk_comm_self_ops;
    else
        return rk_err_set(err, RK_EINVAL, "comm: unknown backend '%s' (auto, mpi or self)",
                          backend);
    rk_comm *c = calloc(1, sizeof *c);
    if (!c)
        return rk_err_set(err, RK_ENOMEM, "comm: out of memory");
    c->ops = ops;
    int rc = ops->open(c, err);
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return RK_OK;
}

void rk_comm_close(rk_comm *c)
{
    if (!c)
        return;
    c->ops->close(c);
    free(c);
}

int rk_comm_rank(const rk_comm *c) { return c->rank; }
int rk_comm_size(const rk_comm *c) { return c->size; }
int rk_comm_local_size(const rk_comm *c) { return c->local_size; }
const char *rk_comm_backend(const rk_comm *c) { return c->ops->name; }

int rk_comm_allreduce_sum_f32(rk_comm *c, float *buf, size_t n, rk_err *err)
{
    return c->ops->allreduce_f32(c, buf, n, err);
}

int rk_comm_allreduce_sum_f64(rk_comm *c, double *buf, size_t n, rk_err *err)
{
    return c->ops->allreduce_f64(c, buf, n, err);
}

int rk_comm_allgather_u64(rk_comm *c, uint64_t mine, uint64_t *all, rk_err *err)
{
    return c->ops->allgather_u64(c, mine, all, err);
}

int rk_comm_bcast(rk_comm *c, void *buf, size_t bytes, int root, rk_err *err)
{
    if (root < 0 || root >= c->size)
        return rk_err_set(err, RK_EINVAL, "comm: broadcast root %d outside 0..%d", root,
                          c->size - 1);
    return c->ops->bcast(c, buf, bytes, root, err);
}

int rk_comm_barrier(rk_comm *c, rk_err *err) { return c->ops->barrier(c, err); }
