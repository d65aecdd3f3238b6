/* The communicator's backend table (internal): one per backend file, chosen in comm.c. */
#ifndef RK_COMM_INTERNAL_H
#define RK_COMM_INTERNAL_H

#include "rekindle/comm.h"

typedef struct rk_comm_ops {
    const char *name;
    int (*open)(rk_comm *c, rk_err *err);
    void (*close)(rk_comm *c);
    int (*allreduce_f32)(rk_comm *c, float *buf, size_t n, rk_err *err);
    int (*allreduce_f64)(rk_comm *c, double *buf, size_t n, rk_err *err);
    /* byte pieces: see rk_comm_allgather / rk_comm_alltoall */
    int (*allgather)(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err);
    int (*alltoall)(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err);
    int (*bcast)(rk_comm *c, void *buf, size_t bytes, int root, rk_err *err);
    int (*barrier)(rk_comm *c, rk_err *err);
} rk_comm_ops;

struct rk_comm {
    const rk_comm_ops *ops;
    int rank, size, local_size;
    rk_comm_stats stats;
    void *impl; /* backend state */
};

extern const rk_comm_ops rk_comm_self_ops;
extern const rk_comm_ops rk_comm_mpi_ops;

#endif
