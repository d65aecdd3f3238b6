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
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rk_comm rk_comm;

/* backend: "auto", "mpi" or "self". RK_ENOTSUP if the backend is not in this build. */
RK_API int rk_comm_open(rk_comm **out, const char *backend, rk_err *err);
/* Finalise (MPI_Finalize for mpi). NULL-safe. */
RK_API void rk_comm_close(rk_comm *c);

RK_API int rk_comm_rank(const rk_comm *c);
RK_API int rk_comm_size(const rk_comm *c);
/* Ranks of this job on this node (1 for self): used to share the CPU cores among them. */
RK_API int rk_comm_local_size(const rk_comm *c);
RK_API const char *rk_comm_backend(const rk_comm *c);

/* In-place sums (or means) over all ranks. Every rank ends with the same bits. */
RK_API int rk_comm_allreduce_sum_f32(rk_comm *c, float *buf, size_t n, rk_err *err);
RK_API int rk_comm_allreduce_mean_f32(rk_comm *c, float *buf, size_t n, rk_err *err);
RK_API int rk_comm_allreduce_sum_f64(rk_comm *c, double *buf, size_t n, rk_err *err);
/* all[i] = rank i's `mine` (all has rk_comm_size entries). */
RK_API int rk_comm_allgather_u64(rk_comm *c, uint64_t mine, uint64_t *all, rk_err *err);
/* recv[i * bytes .. (i + 1) * bytes) = rank i's `send` (bytes each; recv holds size * bytes). */
RK_API int rk_comm_allgather(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err);
/* send holds size pieces of `bytes` each: piece j goes to rank j; recv[i * bytes ..) is the
 * piece rank i sent to this rank. */
RK_API int rk_comm_alltoall(rk_comm *c, const void *send, size_t bytes, void *recv, rk_err *err);
/* Root's bytes to every rank. */
RK_API int rk_comm_bcast(rk_comm *c, void *buf, size_t bytes, int root, rk_err *err);
RK_API int rk_comm_barrier(rk_comm *c, rk_err *err);

/*
 * Rank 0 acts, every rank learns its status: the collective after work one rank does for all
 * (writing a checkpoint, reading one, taking a lock), so that no rank goes on alone after it
 * failed. Rank 0 passes `status`, the RK_* code of what it did, and in `data` n (at most
 * RK_COMM_STATUS_DATA_MAX) int64 values it found; the other ranks pass any status and
 * receive rank 0's data. Returns rank 0's status on every rank, or this call's own error.
 * A NULL communicator or a 1-rank world sends nothing and returns `status`.
 *
 * err: rank 0's keeps what its own action said (the broadcast's error goes there only when
 * the action succeeded). On another rank, when rank 0 failed, *learned (may be NULL) is 1 and
 * err says "rank 0 failed: <what the code means>", for the caller to reword with what rank 0
 * could not do; *learned is 0 otherwise.
 */
#define RK_COMM_STATUS_DATA_MAX 8
RK_API int rk_comm_share_status(rk_comm *c, int status, int64_t *data, size_t n, int *learned,
                                rk_err *err);

/*
 * Traffic accounting, per operation, for this rank since open (or the last reset): calls
 * and the bytes this rank sends under the bandwidth-optimal algorithm of each operation, so
 * that the numbers compare across backends and algorithms: allreduce of n bytes 2(p-1)/p n
 * (ring), allgather and alltoall (p-1) x the piece (what leaves for the other ranks), bcast
 * (p-1) x n on the root and 0 elsewhere. A 1-rank world sends nothing.
 */
typedef enum rk_comm_op {
    RK_COMM_ALLREDUCE,
    RK_COMM_ALLGATHER,
    RK_COMM_ALLTOALL,
    RK_COMM_BCAST,
    RK_COMM_BARRIER,
    RK_COMM_NOPS
} rk_comm_op;

typedef struct rk_comm_stats {
    uint64_t calls[RK_COMM_NOPS];
    uint64_t bytes[RK_COMM_NOPS];
} rk_comm_stats;

RK_API const char *rk_comm_op_name(rk_comm_op op);
RK_API void rk_comm_stats_get(const rk_comm *c, rk_comm_stats *out);
RK_API void rk_comm_stats_reset(rk_comm *c);
/* Sum of bytes over every operation. */
RK_API uint64_t rk_comm_bytes_sent(const rk_comm *c);

/*
 * Compressed allreduce (docs/compression.md), for gradients over thin links. Built only on
 * the collectives above, so it runs on every backend:
 *
 *   none        a plain allreduce (rk_comm_allreduce_sum_f32)
 *   fp16, bf16  half-precision pieces: a reduce-scatter by alltoall, each rank sums its chunk
 *               in fp32, an allgather of the half-precision result (half the bytes of a ring
 *               allreduce). fp16 pieces carry a power-of-two scale per block of 256 values, so
 *               small gradients do not flush to zero and large ones do not overflow.
 *   onebit      1-bit signs with error feedback, the two-phase scheme of DeepSpeed's 1-bit
 *               Adam: each rank adds its residual to the input, sends signs (8 per byte) and a
 *               scale per block of 256 values, keeps what the signs missed; an alltoall gives
 *               chunk i to rank i; rank i sums the decompressed pieces, adds its own server-side
 *               residual, compresses again, keeps that residual; an allgather returns the
 *               result. scale = mean |x| over the block (EF-SignSGD), the scale that minimises
 *               the residual; a block of zeros has scale 0 and decompresses to exact zeros.
 *   onebit-noef the same without either residual (sign x mean |x|), kept to show why error
 *               feedback matters.
 *
 * Residuals (error feedback) are per rank. A call leaves the new residuals staged; commit
 * makes them current once the step is applied, so a step that a guard throws away leaves no
 * trace. The committed residuals are one block of rk_compressor_state_len floats (the
 * worker's n, padded, then the server's chunk), which checkpoints and snapshots save and
 * restore; a different world size needs a fresh (zero) state.
 */
typedef enum rk_compress {
    RK_COMPRESS_NONE,
    RK_COMPRESS_FP16,
    RK_COMPRESS_BF16,
    RK_COMPRESS_ONEBIT,
    RK_COMPRESS_ONEBIT_NOEF
} rk_compress;

#define RK_COMPRESS_BLOCK 256 /* values per scale */

/* "none", "fp16", "bf16", "onebit", "onebit-noef"; RK_EINVAL naming the word otherwise. */
RK_API int rk_compress_parse(const char *s, rk_compress *out, rk_err *err);
RK_API const char *rk_compress_name(rk_compress kind);

typedef struct rk_compressor rk_compressor;

/* A compressor for buffers of n floats on this communicator's world. */
RK_API int rk_compressor_create(rk_compressor **out, rk_comm *c, rk_compress kind, size_t n,
                                rk_err *err);
RK_API void rk_compressor_free(rk_compressor *z);
RK_API rk_compress rk_compressor_kind(const rk_compressor *z);
/* In place over all ranks: the (compressed) sum, or the mean when mean != 0. Every rank ends
 * with the same bits. */
RK_API int rk_compressor_allreduce(rk_compressor *z, float *buf, int mean, rk_err *err);
/* Make the residuals of the last allreduce current (no-op without error feedback). */
RK_API void rk_compressor_commit(rk_compressor *z);
/* The committed residuals: rk_compressor_state_len floats, 0 without error feedback. */
RK_API size_t rk_compressor_state_len(const rk_compressor *z);
RK_API float *rk_compressor_state(rk_compressor *z);
/* Bytes one allreduce of this compressor sends from this rank (as rk_comm_stats counts). */
RK_API uint64_t rk_compressor_bytes_per_call(const rk_compressor *z);

#ifdef __cplusplus
}
#endif
#endif
