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

static void self_close(rk_comm *c)
{
    (void)c;
}

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

/* one rank: its own piece is the whole result */
static int self_pieces(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err)
{
    (void)c, (void)err;
    if (recv != send)
        memmove(recv, send, bytes);
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
    .allgather = self_pieces,
    .alltoall = self_pieces,
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

int rk_comm_rank(const rk_comm *c)
{
    return c->rank;
}
int rk_comm_size(const rk_comm *c)
{
    return c->size;
}
int rk_comm_local_size(const rk_comm *c)
{
    return c->local_size;
}
const char *rk_comm_backend(const rk_comm *c)
{
    return c->ops->name;
}

/* Count one call of `op` that sends `bytes` from this rank. */
static void count(rk_comm *c, rk_comm_op op, double bytes)
{
    c->stats.calls[op]++;
    c->stats.bytes[op] += (uint64_t)(bytes + 0.5);
}

static double ring_bytes(const rk_comm *c, size_t bytes)
{
    return 2.0 * (c->size - 1) / c->size * (double)bytes;
}

int rk_comm_allreduce_sum_f32(rk_comm *c, float *buf, size_t n, rk_err *err)
{
    count(c, RK_COMM_ALLREDUCE, ring_bytes(c, n * sizeof *buf));
    return c->ops->allreduce_f32(c, buf, n, err);
}

int rk_comm_allreduce_mean_f32(rk_comm *c, float *buf, size_t n, rk_err *err)
{
    int rc = rk_comm_allreduce_sum_f32(c, buf, n, err);
    if (rc || c->size == 1)
        return rc;
    float inv = 1.0f / (float)c->size;
    for (size_t i = 0; i < n; i++)
        buf[i] *= inv;
    return RK_OK;
}

int rk_comm_allreduce_sum_f64(rk_comm *c, double *buf, size_t n, rk_err *err)
{
    count(c, RK_COMM_ALLREDUCE, ring_bytes(c, n * sizeof *buf));
    return c->ops->allreduce_f64(c, buf, n, err);
}

int rk_comm_allgather(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err)
{
    count(c, RK_COMM_ALLGATHER, (double)(c->size - 1) * (double)bytes);
    return c->ops->allgather(c, send, bytes, recv, err);
}

int rk_comm_allgather_u64(rk_comm *c, uint64_t mine, uint64_t *all, rk_err *err)
{
    return rk_comm_allgather(c, &mine, sizeof mine, all, err);
}

int rk_comm_alltoall(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err)
{
    count(c, RK_COMM_ALLTOALL, (double)(c->size - 1) * (double)bytes);
    return c->ops->alltoall(c, send, bytes, recv, err);
}

int rk_comm_bcast(rk_comm *c, void *buf, size_t bytes, int root, rk_err *err)
{
    if (root < 0 || root >= c->size)
        return rk_err_set(err, RK_EINVAL, "comm: broadcast root %d outside 0..%d", root,
                          c->size - 1);
    count(c, RK_COMM_BCAST, c->rank == root ? (double)(c->size - 1) * (double)bytes : 0.0);
    return c->ops->bcast(c, buf, bytes, root, err);
}

int rk_comm_barrier(rk_comm *c, rk_err *err)
{
    count(c, RK_COMM_BARRIER, 0.0);
    return c->ops->barrier(c, err);
}

int rk_comm_share_status(rk_comm *c, int status, int64_t *data, size_t n, int *learned, rk_err *err)
{
    if (learned)
        *learned = 0;
    if (!c || c->size <= 1)
        return status;
    if (n > RK_COMM_STATUS_DATA_MAX)
        return rk_err_set(err, RK_EINVAL, "comm: %zu status values, at most %d", n,
                          RK_COMM_STATUS_DATA_MAX);
    int64_t buf[1 + RK_COMM_STATUS_DATA_MAX] = {0};
    int root = c->rank == 0;
    if (root) {
        buf[0] = status;
        if (n)
            memcpy(buf + 1, data, n * sizeof *data);
    }
    int rc = rk_comm_bcast(c, buf, (n + 1) * sizeof *buf, 0, root && status ? NULL : err);
    if (rc)
        return rc;
    if (root)
        return status;
    if (n)
        memcpy(data, buf + 1, n * sizeof *data);
    if (buf[0] == RK_OK)
        return RK_OK;
    if (learned)
        *learned = 1;
    return rk_err_set(err, (int)buf[0], "rank 0 failed: %s", rk_strerror((int)buf[0]));
}

const char *rk_comm_op_name(rk_comm_op op)
{
    static const char *const names[RK_COMM_NOPS] = {"allreduce", "allgather", "alltoall", "bcast",
                                                    "barrier"};
    return op >= 0 && op < RK_COMM_NOPS ? names[op] : "?";
}

void rk_comm_stats_get(const rk_comm *c, rk_comm_stats *out)
{
    *out = c->stats;
}

void rk_comm_stats_reset(rk_comm *c)
{
    memset(&c->stats, 0, sizeof c->stats);
}

uint64_t rk_comm_bytes_sent(const rk_comm *c)
{
    uint64_t total = 0;
    for (int op = 0; op < RK_COMM_NOPS; op++)
        total += c->stats.bytes[op];
    return total;
}
