/*
 * Batch policies: how a fixed global mini-batch of B samples is split across N data-parallel
 * ranks, so that slow or flaky GPUs get less work while the optimiser still sees B samples a
 * step. See docs/batch.md for worked examples.
 *
 * Every policy turns its state into one weight w_i >= 0 per rank; the shares are then
 *
 *     t_i = B * w_i / sum_j w_j          (real-valued targets)
 *
 * rounded so that they are integers, each at least 1, summing exactly to B:
 *
 *   1. floor every t_i;
 *   2. give the units still missing (fewer than N) one each to the ranks with the largest
 *      fractional remainder t_i - floor(t_i), ties to the lower rank index;
 *   3. raise every share still 0 to 1, each time taking one unit from the currently largest
 *      share, ties to the lower rank index (possible because B >= N).
 *
 * The weights are doubles; each w_i / max_j w_j is rounded to a multiple of 2^-62 and from
 * there the targets, floors and remainders are exact 128-bit integer arithmetic, so remainders
 * compare exactly and ties really are ties (an even split of 10 over 4 ranks is always
 * 3 3 2 2). The same state always gives the same shares.
 *
 * The policies (RK_BATCH_*):
 *
 *   even         w_i = 1: B / N each, the remainder B mod N one each to the lowest ranks.
 *   throughput   w_i = s_i, the rank's smoothed throughput in samples/s. The first
 *                observation sets s_i; each later one x moves it by
 *                s_i <- s_i + RK_BATCH_SMOOTHING * (x - s_i), an exponential moving average
 *                with alpha = 0.3. A rank with no observation yet counts as the mean of the
 *                observed ranks; with none observed at all the split is even.
 *   fault-aware  w_i = max(0, 1 + 0.5 * (1 - f_i / f_mean)), f_i the rank's device fault rate
 *                (faults per hour) and f_mean the mean over all N ranks: the formula
 *                b_i = b * (1 + 0.5 * (1 - f_i / f_mean)) normalised to sum to B (b cancels).
 *                A rank at the mean keeps its even share, a fault-free rank gets up to 1.5x,
 *                a rank above 3x the mean would go negative and is clamped to 0 (its share
 *                then becomes the minimum, 1). With no faults anywhere (f_mean = 0) the split
 *                is even. Unset fault rates are 0.
 *
 * Throughput observations and fault rates are recorded whatever the policy's kind; only the
 * kind's own input changes the shares.
 *
 * State and checkpoints. A policy's whole state is its kind, N, B, and per rank the smoothed
 * throughput, the number of throughput observations and the fault rate. In a checkpoint
 * (rekindle/ckpt.h) it is five ordinary tensors, covered by the checkpoint's checksums:
 *
 *     batch.kind          I64 scalar  0 even, 1 throughput, 2 fault-aware
 *     batch.global_batch  I64 scalar  B, N..INT64_MAX
 *     batch.throughput    F64 [N]     smoothed samples/s, 0 when never observed
 *     batch.observations  I64 [N]     throughput observations
 *     batch.fault_rate    F64 [N]     faults per hour
 *
 * rk_batch_load checks every one (present, dtype, shape, N in 1..RK_BATCH_MAX_RANKS, B >= N,
 * finite values in range, throughput 0 exactly when there is no observation) and answers
 * RK_EFORMAT with a one-line message naming the file, tensor and rank on any violation; a
 * loaded policy gives bit-for-bit the shares of the saved one and smooths later observations
 * the same way.
 *
 * Errors: RK_EINVAL for bad arguments (N < 1 or > RK_BATCH_MAX_RANKS, B < N, a rank out of
 * range, a throughput outside (0, RK_BATCH_MAX_RATE] or a fault rate outside
 * [0, RK_BATCH_MAX_RATE], NaN and infinities included, an unknown kind name, NULL), RK_ENOMEM,
 * and RK_EFORMAT for bad checkpoint tensors. A failing call changes nothing.
 */
#ifndef REKINDLE_BATCH_H
#define REKINDLE_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/ckpt.h"
#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_BATCH_MAX_RANKS 65536
#define RK_BATCH_MAX_RATE 1e15 /* largest accepted samples/s or faults/hour */
#define RK_BATCH_SMOOTHING 0.3 /* alpha of the throughput moving average */

typedef enum rk_batch_kind {
    RK_BATCH_EVEN = 0,
    RK_BATCH_THROUGHPUT = 1,
    RK_BATCH_FAULT_AWARE = 2
} rk_batch_kind;

/* "even", "throughput" or "fault-aware" (exact, lower case); anything else is RK_EINVAL. */
RK_API int rk_batch_kind_parse(const char *name, rk_batch_kind *out, rk_err *err);

/* The name rk_batch_kind_parse accepts; "unknown" for a value outside the enum. */
RK_API const char *rk_batch_kind_name(rk_batch_kind k);

typedef struct rk_batch_policy rk_batch_policy;

/* A policy of `kind` for `nranks` ranks (1..RK_BATCH_MAX_RANKS) sharing `global_batch`
 * samples (>= nranks, so every rank gets at least one). No observations, fault rates 0.
 * On failure *out is NULL. Free with rk_batch_policy_free. */
RK_API int rk_batch_policy_create(rk_batch_policy **out, rk_batch_kind kind, int nranks,
                                  int64_t global_batch, rk_err *err);

/* NULL-safe. */
RK_API void rk_batch_policy_free(rk_batch_policy *p);

/* The policy's kind, rank count N and global batch B (p must not be NULL). */
RK_API rk_batch_kind rk_batch_policy_kind(const rk_batch_policy *p);
RK_API int rk_batch_policy_nranks(const rk_batch_policy *p);
RK_API int64_t rk_batch_policy_global_batch(const rk_batch_policy *p);

/* Feed one measured throughput of `rank` (samples/s, finite, in (0, RK_BATCH_MAX_RATE]) into
 * its moving average (see above). */
RK_API int rk_batch_observe_throughput(rk_batch_policy *p, int rank, double samples_per_s,
                                       rk_err *err);

/* Set the device fault rate of `rank` (faults per hour, finite, in [0, RK_BATCH_MAX_RATE]).
 * It replaces the previous value; the caller (the supervisor) decides the window. */
RK_API int rk_batch_set_fault_rate(rk_batch_policy *p, int rank, double faults_per_hour,
                                   rk_err *err);

/* What the policy knows about one rank. */
typedef struct rk_batch_rank_state {
    double throughput;     /* smoothed samples/s; 0 when observations == 0 */
    uint64_t observations; /* throughput observations so far */
    double fault_rate;     /* faults per hour */
} rk_batch_rank_state;

/* Copy the recorded state of `rank` into *out. */
RK_API int rk_batch_rank_get(const rk_batch_policy *p, int rank, rk_batch_rank_state *out,
                             rk_err *err);

/* The shares: shares[0..N) (the caller's array of N values), each >= 1, summing exactly to B.
 * Deterministic: the same state gives the same shares. RK_ENOMEM is the only failure besides
 * NULL arguments. */
RK_API int rk_batch_shares(const rk_batch_policy *p, int64_t *shares, rk_err *err);

/* Rebuild the policy for a new set of ranks (elastic shrink or grow), keeping B and the kind:
 * new rank i takes the state of old rank keep[i], or starts fresh (no observation, fault rate
 * 0) when keep[i] is -1. Old ranks not listed are dropped. nkeep must be in
 * 1..RK_BATCH_MAX_RANKS and <= B; old rank ids must be in range and not repeated. On failure
 * the policy is unchanged. */
RK_API int rk_batch_policy_resize(rk_batch_policy *p, const int *keep, int nkeep, rk_err *err);

/* Replace the recorded state of `rank` (a checkpoint's, say) with *st: RK_EINVAL, and nothing
 * changed, for values the policy could not have recorded (a throughput outside
 * (0, RK_BATCH_MAX_RATE] with observations, a throughput other than +0 without, a fault rate
 * outside [0, RK_BATCH_MAX_RATE]). */
RK_API int rk_batch_rank_set(rk_batch_policy *p, int rank, const rk_batch_rank_state *st,
                             rk_err *err);

/* The state as the checkpoint items above: rk_batch_items_fill puts RK_BATCH_NITEMS items in
 * out->item, pointing into *out (arrays it allocates: rk_batch_items_free them after the save
 * has taken them; free is safe after a failed fill). */
#define RK_BATCH_NITEMS 5

typedef struct rk_batch_items {
    rk_ckpt_item item[RK_BATCH_NITEMS];
    int64_t kind, global_batch, shape[1];
    double *throughput, *fault_rate;
    int64_t *observations;
} rk_batch_items;

RK_API int rk_batch_items_fill(const rk_batch_policy *p, rk_batch_items *out, rk_err *err);
RK_API void rk_batch_items_free(rk_batch_items *it);

/* A new policy from the batch.* tensors of a file (rk_ckpt_file). RK_ENOENT when it has no
 * batch.kind (no policy was saved); RK_EFORMAT, naming the tensor, for bad or partial state,
 * and for a checkpoint holding "policy", the binary layout of earlier versions, which is no
 * longer read. *out is NULL on failure. */
RK_API int rk_batch_load(rk_batch_policy **out, const rk_st_file *f, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
