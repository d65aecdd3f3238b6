/*
 * A deterministic mixed allocation trace, shaped like a few training steps, for timing an
 * allocator against a peer on the same operations: bench/pool_bench.c (the pool over malloc
 * against malloc/free, CPU) and the GPU bench (the pool over cuMemAlloc against
 * cuMemAlloc/cuMemFree). Header-only; it needs rekindle/rng.h (link rekindle or
 * rekindle_internal).
 *
 * The trace: the weights (a few large tensors of 4-16 MiB, many small ones of 2-512 KiB) and
 * two optimiser states of the same sizes are allocated first and live to the end; then
 * RK_TRACE_STEPS steps, each a forward pass (per layer an activation of 64 KiB-4 MiB kept
 * for the backward pass, two short-lived temporaries of 512 B-256 KiB freed in random order,
 * now and then a 8-32 MiB workspace freed at once), a backward pass (layers in reverse with
 * some neighbours swapped: LIFO-ish; per layer a gradient temporary freed with the
 * activation; the weights' gradients allocated on first use) and the optimiser step (the
 * gradients freed in random order); at the end everything is freed. Sizes are log-uniform in
 * their ranges, from a fixed seed: the same trace on every machine.
 *
 * Use: for i in 0 .. rk_trace_len() - 1, rk_trace_op(i, &is_free, &bytes, &slot): when
 * is_free is 0, allocate `bytes` and keep the address in slots[slot] (that slot is empty);
 * else free slots[slot] (it holds a block of `bytes`, for APIs that want the size). slot <
 * rk_trace_slots(). Every block is freed by the end, so the trace may be run again and again
 * over the same allocator. rk_trace_peak_bytes() is the most bytes live at once (asked, not
 * rounded). The table is built on the first call (not thread-safe until then).
 */
#ifndef RK_BENCH_POOL_TRACE_H
#define RK_BENCH_POOL_TRACE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "rekindle/rng.h"

#define RK_TRACE_SEED 18
#define RK_TRACE_STEPS 20
#define RK_TRACE_LAYERS 24
#define RK_TRACE_WEIGHTS 48
#define RK_TRACE_MAX_OPS 16384
#define RK_TRACE_MAX_SLOTS 1024

typedef struct rk_trace_entry {
    uint64_t bytes;
    uint32_t slot;
    uint8_t is_free;
} rk_trace_entry;

typedef struct rk_trace_table {
    rk_trace_entry op[RK_TRACE_MAX_OPS];
    size_t n;
    size_t slots;  /* slot numbers used: 0 .. slots - 1 */
    uint64_t live; /* bytes live now, while building */
    uint64_t peak; /* most bytes live at once */
    uint64_t size_of[RK_TRACE_MAX_SLOTS];
    uint32_t free_slot[RK_TRACE_MAX_SLOTS]; /* a stack of empty slots */
    size_t n_free;
    int built;
} rk_trace_table;

static rk_trace_table rk_trace_tab;

static uint64_t rk_trace_size(rk_rng *r, double lo, double hi)
{
    double l = log2(lo), h = log2(hi);
    return (uint64_t)exp2(l + (h - l) * (double)rk_rng_uniform(r));
}

static uint32_t rk_trace_alloc(uint64_t bytes)
{
    rk_trace_table *t = &rk_trace_tab;
    uint32_t s = t->free_slot[--t->n_free];
    if (s + 1 > t->slots)
        t->slots = s + 1;
    t->size_of[s] = bytes;
    t->op[t->n++] = (rk_trace_entry){bytes, s, 0};
    t->live += bytes;
    if (t->live > t->peak)
        t->peak = t->live;
    return s;
}

static void rk_trace_free(uint32_t s)
{
    rk_trace_table *t = &rk_trace_tab;
    t->op[t->n++] = (rk_trace_entry){t->size_of[s], s, 1};
    t->live -= t->size_of[s];
    t->free_slot[t->n_free++] = s;
}

/* Free the n slots of s[] in a random order. */
static void rk_trace_free_shuffled(rk_rng *r, uint32_t *s, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rk_rng_below(r, i);
        uint32_t x = s[i - 1];
        s[i - 1] = s[j];
        s[j] = x;
    }
    for (size_t i = 0; i < n; i++)
        rk_trace_free(s[i]);
}

static void rk_trace_build(void)
{
    rk_trace_table *t = &rk_trace_tab;
    rk_rng r;
    rk_rng_seed(&r, RK_TRACE_SEED);
    t->n = t->slots = t->live = t->peak = 0;
    t->n_free = RK_TRACE_MAX_SLOTS;
    for (size_t i = 0; i < RK_TRACE_MAX_SLOTS; i++)
        t->free_slot[i] = (uint32_t)(RK_TRACE_MAX_SLOTS - 1 - i); /* slot 0 on top */
    uint64_t wsize[RK_TRACE_WEIGHTS];
    uint32_t keep[3 * RK_TRACE_WEIGHTS];
    size_t nkeep = 0;
    for (int w = 0; w < RK_TRACE_WEIGHTS; w++)
        wsize[w] = w % 6 == 0 ? rk_trace_size(&r, 4 << 20, 16 << 20)
                              : rk_trace_size(&r, 2 << 10, 512 << 10);
    for (int k = 0; k < 3; k++) /* weights, then the optimiser's two states */
        for (int w = 0; w < RK_TRACE_WEIGHTS; w++)
            keep[nkeep++] = rk_trace_alloc(wsize[w]);
    for (int step = 0; step < RK_TRACE_STEPS; step++) {
        uint32_t act[RK_TRACE_LAYERS], grad[RK_TRACE_WEIGHTS];
        int order[RK_TRACE_LAYERS];
        for (int l = 0; l < RK_TRACE_LAYERS; l++) {
            act[l] = rk_trace_alloc(rk_trace_size(&r, 64 << 10, 4 << 20));
            uint32_t tmp[2] = {rk_trace_alloc(rk_trace_size(&r, 512, 256 << 10)),
                               rk_trace_alloc(rk_trace_size(&r, 512, 256 << 10))};
            rk_trace_free_shuffled(&r, tmp, 2);
            if (rk_rng_below(&r, 8) == 0)
                rk_trace_free(rk_trace_alloc(rk_trace_size(&r, 8 << 20, 32 << 20)));
            order[l] = RK_TRACE_LAYERS - 1 - l;
        }
        for (int l = 0; l + 1 < RK_TRACE_LAYERS; l++) /* LIFO-ish: some neighbours swapped */
            if (rk_rng_below(&r, 5) == 0) {
                int x = order[l];
                order[l] = order[l + 1];
                order[l + 1] = x;
            }
        int ngrad = 0;
        for (int i = 0; i < RK_TRACE_LAYERS; i++) {
            int l = order[i];
            uint32_t g = rk_trace_alloc(rk_trace_size(&r, 64 << 10, 4 << 20));
            /* the layer's weights get their gradients (two weights a layer) */
            for (int w = 2 * l; w < 2 * l + 2 && w < RK_TRACE_WEIGHTS; w++)
                grad[ngrad++] = rk_trace_alloc(wsize[w]);
            rk_trace_free(act[l]);
            rk_trace_free(g);
        }
        rk_trace_free_shuffled(&r, grad, (size_t)ngrad); /* optimizer.zero_grad(set_to_none) */
    }
    rk_trace_free_shuffled(&r, keep, nkeep);
    t->built = 1;
}

static inline size_t rk_trace_len(void)
{
    if (!rk_trace_tab.built)
        rk_trace_build();
    return rk_trace_tab.n;
}

static inline size_t rk_trace_slots(void)
{
    rk_trace_len();
    return rk_trace_tab.slots;
}

static inline uint64_t rk_trace_peak_bytes(void)
{
    rk_trace_len();
    return rk_trace_tab.peak;
}

static inline void rk_trace_op(size_t i, int *is_free, size_t *bytes, size_t *slot)
{
    rk_trace_len();
    const rk_trace_entry *e = &rk_trace_tab.op[i];
    *is_free = e->is_free;
    *bytes = (size_t)e->bytes;
    *slot = e->slot;
}

#endif
