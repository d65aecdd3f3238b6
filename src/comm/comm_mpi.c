/* The MPI backend of the communicator (rekindle/comm.h), on Open MPI. Errors are returned
 * (MPI_ERRORS_RETURN), named with MPI_Error_string, never fatal; buffers larger than an int
 * count are sent in chunks. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

#include "comm/comm.h"

typedef struct mpi_state {
    int we_initialised;
} mpi_state;

static int mpi_fail(rk_err *err, const char *what, int code)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS)
        len = 0;
    msg[len] = '\0';
    return rk_err_set(err, RK_ECOMM, "comm (mpi): %s failed: %s", what,
                      len ? msg : "unknown error");
}

#define MPI_TRY(what, call)                                                                        \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS)                                                                \
            return mpi_fail(err, what, mpi_rc_);                                                   \
    } while (0)

static int mpi_open(rk_comm *c, rk_err *err)
{
    mpi_state *st = calloc(1, sizeof *st);
    if (!st)
        return rk_err_set(err, RK_ENOMEM, "comm (mpi): out of memory");
    c->impl = st;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
            free(st);
            c->impl = NULL;
            return rk_err_set(err, RK_EIO, "comm (mpi): MPI_Init failed");
        }
        st->we_initialised = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_TRY("MPI_Comm_rank", MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
    MPI_TRY("MPI_Comm_size", MPI_Comm_size(MPI_COMM_WORLD, &c->size));
    MPI_Comm node;
    MPI_TRY("MPI_Comm_split_type", MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED,
                                                       c->rank, MPI_INFO_NULL, &node));
    MPI_Comm_size(node, &c->local_size);
    MPI_Comm_free(&node);
    return RK_OK;
}

static void mpi_close(rk_comm *c)
{
    mpi_state *st = c->impl;
    if (st && st->we_initialised) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized)
            MPI_Finalize();
    }
    free(st);
    c->impl = NULL;
}

static int mpi_allreduce(void *buf, size_t n, size_t elem, MPI_Datatype type, rk_err *err)
{
    char *p = buf;
    while (n > 0) {
        int count = n > INT_MAX ? INT_MAX : (int)n;
        MPI_TRY("MPI_Allreduce",
                MPI_Allreduce(MPI_IN_PLACE, p, count, type, MPI_SUM, MPI_COMM_WORLD));
        p += (size_t)count * elem;
        n -= (size_t)count;
    }
    return RK_OK;
}

static int mpi_f32(rk_comm *c, float *buf, size_t n, rk_err *err)
{
    (void)c;
    return mpi_allreduce(buf, n, sizeof(float), MPI_FLOAT, err);
}

static int mpi_f64(rk_comm *c, double *buf, size_t n, rk_err *err)
{
    (void)c;
    return mpi_allreduce(buf, n, sizeof(double), MPI_DOUBLE, err);
}

/* A datatype of `bytes` bytes, so counts stay within an int however large a piece is. */
static int piece_type(size_t bytes, MPI_Datatype *t, rk_err *err)
{
    if (bytes <= INT_MAX) {
        *t = MPI_BYTE;
        return RK_OK;
    }
    if (bytes % 4096)
        return rk_err_set(err, RK_EINVAL,
                          "comm (mpi): a piece of %zu bytes is over 2 GiB and "
                          "not a multiple of 4 KiB",
                          bytes);
    MPI_Datatype page;
    MPI_TRY("MPI_Type_contiguous", MPI_Type_contiguous(4096, MPI_BYTE, &page));
    int rc = MPI_Type_contiguous((int)(bytes / 4096), page, t);
    MPI_Type_free(&page);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, "MPI_Type_contiguous", rc);
    MPI_TRY("MPI_Type_commit", MPI_Type_commit(t));
    return RK_OK;
}

/* MPI_Allgather and MPI_Alltoall take the same arguments: one piece of `bytes` per rank. */
typedef int (*piece_coll)(const void *, int, MPI_Datatype, void *, int, MPI_Datatype, MPI_Comm);

static int pieces(piece_coll coll, const char *what, const void *send, size_t bytes, void *recv,
                  rk_err *err)
{
    MPI_Datatype t;
    int rc = piece_type(bytes, &t, err);
    if (rc)
        return rc;
    int cnt = bytes <= INT_MAX ? (int)bytes : 1;
    int mrc = coll(send, cnt, t, recv, cnt, t, MPI_COMM_WORLD);
    if (t != MPI_BYTE)
        MPI_Type_free(&t);
    return mrc == MPI_SUCCESS ? RK_OK : mpi_fail(err, what, mrc);
}

static int mpi_allgather(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err)
{
    (void)c;
    return pieces(MPI_Allgather, "MPI_Allgather", send, bytes, recv, err);
}

static int mpi_alltoall(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err)
{
    (void)c;
    return pieces(MPI_Alltoall, "MPI_Alltoall", send, bytes, recv, err);
}

static int mpi_bcast(rk_comm *c, void *buf, size_t bytes, int root, rk_err *err)
{
    (void)c;
    char *p = buf;
    while (bytes > 0) {
        int count = bytes > INT_MAX ? INT_MAX : (int)bytes;
        MPI_TRY("MPI_Bcast", MPI_Bcast(p, count, MPI_BYTE, root, MPI_COMM_WORLD));
        p += count;
        bytes -= (size_t)count;
    }
    return RK_OK;
}

static int mpi_barrier(rk_comm *c, rk_err *err)
{
    (void)c;
    MPI_TRY("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD));
    return RK_OK;
}

const rk_comm_ops rk_comm_mpi_ops = {
    .name = "mpi",
    .open = mpi_open,
    .close = mpi_close,
    .allreduce_f32 = mpi_f32,
    .allreduce_f64 = mpi_f64,
    .allgather = mpi_allgather,
    .alltoall = mpi_alltoall,
    .bcast = mpi_bcast,
    .barrier = mpi_barrier,
};
