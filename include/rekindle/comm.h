/*
 * Communicator: the collectives a data-parallel rank needs, behind one small table of
 * function pointers per backend (nvtop's vendor table is the model). Backends: "mpi" (Open
 * MPI; errors are returned, never fatal) and "self" (one process, no library). NCCL plugs in
 * the same way later. Every call is collective: all ranks call it in the same order.
 *
 * rk_comm_open("auto") picks MPI when the process was started by an MPI launcher (mpirun
 * sets OMPI_COMM_WORLD_SIZE or PMI_SIZE) and "self" otherwise, so one binary runs alone or
 * under mpirun without flags.
 */
#ifndef REKINDLE_COMM_H
#define REKINDLE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rk_comm rk_comm;

/* backend: "auto", "mpi" or "self". RK_ENOTSUP if the backend is not in this build. */
int rk_comm_open(rk_comm **out, const char *backend, rk_err *err);
/* Finalise (MPI_Finalize for mpi). NULL-safe. */
void rk_comm_close(rk_comm *c);

int rk_comm_rank(const rk_comm *c);
int rk_comm_size(const rk_comm *c);
/* Ranks of this job on this node (1 for self): used to share the CPU cores among them. */
int rk_comm_local_size(const rk_comm *c);
const char *rk_comm_backend(const rk_comm *c);

/* In-place sums over all ranks. Every rank ends with the same bits. */
int rk_comm_allreduce_sum_f32(rk_comm *c, float *buf, size_t n, rk_err *err);
int rk_comm_allreduce_sum_f64(rk_comm *c, double *buf, size_t n, rk_err *err);
/* all[i] = rank i's `mine` (all has rk_comm_size entries). */
int rk_comm_allgather_u64(rk_comm *c, uint64_t mine, uint64_t *all, rk_err *err);
/* Root's bytes to every rank. */
int rk_comm_bcast(rk_comm *c, void *buf, size_t bytes, int root, rk_err *err);
int rk_comm_barrier(rk_comm *c, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
