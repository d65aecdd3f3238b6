/*
 * Deterministic random numbers: xoshiro256** seeded through splitmix64.
 *
 * Every random choice in rekindle takes an rk_rng seeded from the user's seed, so the same
 * seed gives the same bits on every machine. The state is four 64-bit words and may be saved
 * and restored verbatim (checkpoints store it). rk_rng_derive() makes an independent stream
 * from a seed and a few tags (epoch, step, layer) without touching any other stream.
 */
#ifndef REKINDLE_RNG_H
#define REKINDLE_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rk_rng {
    uint64_t s[4];
} rk_rng;

RK_API void rk_rng_seed(rk_rng *r, uint64_t seed);
/* A stream that depends only on (seed, a, b): for per-epoch or per-step randomness. */
RK_API void rk_rng_derive(rk_rng *r, uint64_t seed, uint64_t a, uint64_t b);
RK_API uint64_t rk_rng_next(rk_rng *r);
/* Uniform in [0, 1) with 24 random bits. */
RK_API float rk_rng_uniform(rk_rng *r);
/* Uniform integer in [0, n), unbiased (n > 0). */
RK_API uint64_t rk_rng_below(rk_rng *r, uint64_t n);
/* Standard normal (Box-Muller, one value per call). */
RK_API float rk_rng_normal(rk_rng *r);
/* Fill idx[0..n) with a uniformly random permutation of 0..n-1 (Fisher-Yates). */
RK_API void rk_rng_permutation(rk_rng *r, uint32_t *idx, size_t n);

#ifdef __cplusplus
}
#endif
#endif
