/*
 * Step guards: the checks a rank runs around each optimiser step to catch the faults that do
 * not crash a process — non-finite values, a loss spike, one rank's gradient far off the
 * others' (wrong arithmetic), one replica's parameters differing from the rest (a flipped bit
 * in memory). These are the decisions only, as pure functions over numbers every rank
 * already has (after an allgather), so every rank takes the same decision in lockstep. What
 * to do about a trip (redo the step, roll back to a snapshot, repair from a majority rank) is
 * the trainer's; see docs/guards.md.
 *
 *     rk_spike sp;
 *     rk_spike_init(&sp, 32, 6.0, &err);
 *     double z;
 *     if (rk_spike_test(&sp, loss, &z)) redo_the_step(); else rk_spike_push(&sp, loss);
 */
#ifndef REKINDLE_GUARD_H
#define REKINDLE_GUARD_H

#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_SPIKE_WINDOW_DEFAULT 32   /* losses the robust z-score looks back over */
#define RK_SPIKE_Z_DEFAULT 10.0      /* z above which a loss is a spike */
#define RK_GRAD_RATIO_DEFAULT 1000.0 /* a rank's gradient norm this many times the others' */

/* Loss spike detector: a robust z-score of a new loss against the last `window` accepted
 * losses, z = (loss - median) / (1.4826 * MAD), the MAD floored at 1% of the median so a
 * flat stretch does not make every wiggle a spike. */
typedef struct rk_spike {
    double *v; /* ring of accepted losses */
    double *tmp;
    int window, n, next;
    double z; /* threshold */
} rk_spike;

/* window >= 3, z > 0 and finite; RK_EINVAL otherwise, RK_ENOMEM. */
/* The median of v[0..n) (n >= 1; the mean of the middle two when n is even), sorting v in
 * place. The guards' statistic, and the snapshots' settled step time (worker_snap.c). */
RK_API double rk_median_sort(double *v, int n);

RK_API int rk_spike_init(rk_spike *s, int window, double z, rk_err *err);
RK_API void rk_spike_free(rk_spike *s);
/* 1 if `loss` is a spike: the window is full and loss > median with a z-score above the
 * threshold, or loss is not finite. *zscore (may be NULL) gets the z-score (0 until the
 * window is full). Does not add the loss. */
RK_API int rk_spike_test(const rk_spike *s, double loss, double *zscore);
/* Accept a loss into the window (non-finite losses are ignored). */
RK_API void rk_spike_push(rk_spike *s, double loss);
/* Forget every loss (after a rollback, the window would describe steps that are gone). */
RK_API void rk_spike_reset(rk_spike *s);

/* Which of n ranks have a gradient far off the others'. `norms` are per-rank gradient norms
 * already made comparable (each divided by the rank's share of the batch); a rank without
 * samples passes a negative value and is skipped. flags[i] = 1 for:
 * a non-finite norm; with 3 or more usable ranks, a norm above ratio x their median; with 2,
 * the larger when it is above ratio x the smaller. Returns how many are flagged. */
RK_API int rk_guard_outliers(const double *norms, int n, double ratio, unsigned char *flags);

/* Majority vote over replica hashes (one per rank). flags[i] = 1 for every rank whose hash
 * differs from the most common one; *root = the lowest rank holding the most common hash
 * (between equally common hashes, the one held by the lowest rank); *strict = 1 when that
 * hash is held by more than half the ranks.
 * Returns the number of flagged ranks (0: all agree). */
RK_API int rk_guard_vote(const uint64_t *hashes, int n, int *root, unsigned char *flags,
                         int *strict);

#ifdef __cplusplus
}
#endif
#endif
