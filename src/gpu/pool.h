/*
 * Inside rekindle: a caching device-memory pool, PyTorch's CUDA caching allocator's ideas in
 * plain C (docs/pool.md). Not public API.
 *
 * The pool asks a backend for big segments (cuMemAlloc in src/gpu/, malloc or an address
 * range in the tests and benches), carves blocks out of them and keeps freed blocks cached
 * for the next request instead of returning them to the device. It only does bookkeeping
 * over addresses: it never reads or writes the memory, so every rule here is tested on a CPU.
 *
 * Rules (PyTorch's, constants below):
 * - A request is rounded up to a multiple of 512 bytes. Requests up to 1 MiB are "small" and
 *   are served from 2 MiB segments; larger ones are "large", from 20 MiB segments when under
 *   10 MiB, else from a segment of the request rounded up to 2 MiB. Small and large blocks
 *   never share a segment.
 * - Best fit: the smallest cached free block of the request's pool that is big enough (an
 *   AVL tree ordered by size then address: O(log n)). A block bigger than needed is split
 *   when the rest is worth keeping (small pool: at least 512 bytes; large pool: more than
 *   1 MiB), and the rest stays cached.
 * - A freed block merges with its free neighbours in the same segment, so a segment whose
 *   blocks are all free is one block again.
 * - When the backend is out of memory (its alloc returns RK_ENOMEM, or the pool's limit is
 *   reached) the pool returns every fully free cached segment to the backend and tries once
 *   more; if that fails too, the request fails with RK_ENOMEM and a message naming the size
 *   asked, the bytes reserved and allocated.
 *
 * Errors: RK_EINVAL for a bad argument (size 0, a size past RK_POOL_MAX_REQUEST, a free of
 * an address this pool did not hand out or has already taken back); RK_ENOMEM when the
 * device or the host is out of memory; a backend's own code for its other failures. A failed
 * call changes nothing but the statistics' failure counters.
 *
 * Threads: a pool is not locked. One thread at a time may call into a pool (a GPU's pool is
 * used by the thread bound to its context); callers sharing a pool serialise themselves.
 */
#ifndef RK_GPU_POOL_H
#define RK_GPU_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

/* PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp), same names without the k. */
#define RK_POOL_MIN_BLOCK ((size_t)512)            /* every size is a multiple of this */
#define RK_POOL_SMALL_SIZE ((size_t)1 << 20)       /* largest "small" request: 1 MiB */
#define RK_POOL_SMALL_BUFFER ((size_t)2 << 20)     /* a small-pool segment: 2 MiB */
#define RK_POOL_MIN_LARGE_ALLOC ((size_t)10 << 20) /* large requests under this ... */
#define RK_POOL_LARGE_BUFFER ((size_t)20 << 20)    /* ... get a 20 MiB segment */
#define RK_POOL_ROUND_LARGE ((size_t)2 << 20)      /* bigger ones: rounded up to 2 MiB */
#define RK_POOL_MAX_REQUEST ((size_t)1 << 48)      /* past this a request is refused */

/* Where the memory comes from. alloc reserves `bytes` (a segment size as above) and puts its
 * first address in *addr; it returns RK_OK, RK_ENOMEM when the device is out of memory (the
 * pool then releases its cached segments and retries once), or another RK_E* code for any
 * other failure (passed on as it is), filling err. free gives back a range alloc returned,
 * with the same size; it cannot fail. Two live ranges must not overlap (a backend that
 * returns an overlapping range is refused with RK_EBACKEND). */
typedef struct rk_pool_backend {
    void *ctx;
    int (*alloc)(void *ctx, size_t bytes, uint64_t *addr, rk_err *err);
    void (*free)(void *ctx, uint64_t addr, size_t bytes);
} rk_pool_backend;

typedef struct rk_pool_opts {
    const char *name;     /* names the pool in messages ("GPU 0"); NULL: "pool" */
    uint64_t limit_bytes; /* most bytes the pool may reserve (PyTorch's memory fraction); an
                           * alloc past it is treated as the backend's out-of-memory; 0: none */
} rk_pool_opts;

/* One statistic, PyTorch's Stat: current value, its peak since the pool was made, and the
 * sums of every increase ("allocated") and every decrease ("freed"): allocated - freed ==
 * current. */
typedef struct rk_pool_stat {
    uint64_t current;
    uint64_t peak;
    uint64_t allocated;
    uint64_t freed;
} rk_pool_stat;

/* Each statistic is kept for both pools together and for each pool (PyTorch's StatArray). */
enum { RK_POOL_ALL = 0, RK_POOL_SMALL = 1, RK_POOL_LARGE = 2, RK_POOL_KINDS = 3 };

typedef struct rk_pool_stats {
    rk_pool_stat allocation[RK_POOL_KINDS];      /* blocks handed out and not yet freed */
    rk_pool_stat segment[RK_POOL_KINDS];         /* segments held from the backend */
    rk_pool_stat active[RK_POOL_KINDS];          /* blocks in use (== allocation: no streams) */
    rk_pool_stat inactive_split[RK_POOL_KINDS];  /* free blocks in segments that are split */
    rk_pool_stat allocated_bytes[RK_POOL_KINDS]; /* bytes of blocks handed out (rounded) */
    rk_pool_stat reserved_bytes[RK_POOL_KINDS];  /* bytes of segments held */
    rk_pool_stat active_bytes[RK_POOL_KINDS];    /* == allocated_bytes: no streams */
    rk_pool_stat inactive_split_bytes[RK_POOL_KINDS]; /* bytes of those free blocks */
    rk_pool_stat requested_bytes[RK_POOL_KINDS];      /* bytes callers asked for (unrounded) */
    uint64_t num_alloc_retries; /* backend allocs retried after releasing cached segments */
    uint64_t num_ooms;          /* requests that failed for lack of device memory */
    uint64_t num_device_alloc;  /* segments obtained from the backend (cudaMalloc calls) */
    uint64_t num_device_free;   /* segments given back to it (cudaFree calls) */
} rk_pool_stats;

typedef struct rk_pool rk_pool;

/* Make a pool over `be` (copied; be->ctx must outlive the pool). `o` may be NULL. Reserves
 * nothing until the first alloc. RK_EINVAL for a backend without alloc or free, RK_ENOMEM
 * when the host is out of memory. */
int rk_pool_create(rk_pool **out, const rk_pool_backend *be, const rk_pool_opts *o, rk_err *err);

/* Return every segment to the backend and free the pool (NULL: nothing). Blocks still
 * allocated are given back with their segments: their addresses are invalid afterwards. */
void rk_pool_destroy(rk_pool *p);

/* Hand out a block of at least `size` bytes (1 .. RK_POOL_MAX_REQUEST) and put its address in
 * *addr, a multiple of 512 bytes past its segment's start. RK_ENOMEM after the release and
 * the retry: "GPU 0: out of memory: asked for 3145728 bytes (a 20971520-byte segment) with
 * 62914560 bytes reserved, 41943040 allocated; cached segments released and retried once:
 * <the backend's message>". */
int rk_pool_alloc(rk_pool *p, size_t size, uint64_t *addr, rk_err *err);

/* Take back the block that rk_pool_alloc handed out at `addr`; it stays cached. RK_EINVAL,
 * changing nothing, for an address that is not the start of a block this pool handed out
 * (never handed out, inside a block, or already freed: the message says which). */
int rk_pool_free(rk_pool *p, uint64_t addr, rk_err *err);

/* Give every fully free cached segment back to the backend (PyTorch's empty_cache). Returns
 * the bytes given back. Allocated blocks, and the free blocks of their segments, stay. */
uint64_t rk_pool_release_cached(rk_pool *p);

/* A copy of the statistics. */
void rk_pool_stats_get(const rk_pool *p, rk_pool_stats *out);

/* The rounded size of the block handed out at `addr` in *size; RK_EINVAL as rk_pool_free
 * when `addr` is not an allocated block's start. */
int rk_pool_block_size(const rk_pool *p, uint64_t addr, size_t *size, rk_err *err);

/* Walk every segment and check the pool's invariants: the blocks of a segment tile it
 * exactly, in address order, each a positive multiple of 512 bytes; no two neighbours are
 * both free; every free block is in its pool's size tree and every block in the address
 * tree, and nothing else is; the trees are ordered and balanced; segments do not overlap;
 * each statistic's current value equals the walk's sum, its peak is not below it and
 * allocated - freed == current. RK_OK, or RK_EFORMAT with the first broken rule. For tests
 * and fuzzers: O(n log n). */
int rk_pool_check(const rk_pool *p, rk_err *err);

/* The size a request is rounded to, its pool (RK_POOL_SMALL or RK_POOL_LARGE) and the
 * segment the backend is asked for when no cached block fits (the rules above). */
size_t rk_pool_round_size(size_t size);
int rk_pool_kind_of(size_t rounded);
size_t rk_pool_segment_size(size_t rounded);

#endif
