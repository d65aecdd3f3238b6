/*
 * Tests for the device memory pool (gpu/pool.h) over a fake backend: an address range with a
 * settable capacity that hands out first-fit ranges and can refuse. They prove PyTorch's size
 * rules (rounding, pools, segment sizes, when a block is split), best fit, the merging of
 * free neighbours in every order, the statistics against a model after each step, the
 * out-of-memory path (cached segments released, one retry, then RK_ENOMEM naming the sizes),
 * that a bad free changes nothing, and a long random trace with rk_pool_check after every
 * operation. The pool's source is included so that the checker can be shown to catch
 * corruption planted in the pool's own structures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/pool.c" /* white-box: the checker's test reaches the structures */
#include "rekindle/rng.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define BASE ((uint64_t)0x7f0000000000)

/* ---- the fake backend: first fit over [BASE, BASE + 2^40), `capacity` bytes at most ---- */

#define FAKE_RANGES 4096

typedef struct fake {
    uint64_t start[FAKE_RANGES]; /* live ranges, sorted by start */
    size_t len[FAKE_RANGES];
    int n;
    size_t used, capacity;
    int allocs, frees, refusals;
    int fail_code;    /* when not RK_OK: every alloc fails with it */
    bool overlap_bug; /* hands out its first live range again */
} fake;

static int fake_alloc(void *ctx, size_t bytes, uint64_t *addr, rk_err *err)
{
    fake *f = ctx;
    if (f->fail_code != RK_OK)
        return rk_err_set(err, f->fail_code, "fake: told to fail");
    if (f->overlap_bug && f->n > 0) {
        *addr = f->start[0] + 512;
        return RK_OK;
    }
    if (bytes > f->capacity - f->used || f->n == FAKE_RANGES) {
        f->refusals++;
        return rk_err_set(err, RK_ENOMEM, "fake: %zu bytes asked, %zu of %zu in use", bytes,
                          f->used, f->capacity);
    }
    uint64_t at = BASE;
    int i = 0;
    for (; i < f->n; i++) {
        if (f->start[i] - at >= bytes)
            break;
        at = f->start[i] + f->len[i];
    }
    memmove(&f->start[i + 1], &f->start[i], (size_t)(f->n - i) * sizeof f->start[0]);
    memmove(&f->len[i + 1], &f->len[i], (size_t)(f->n - i) * sizeof f->len[0]);
    f->start[i] = at;
    f->len[i] = bytes;
    f->n++;
    f->used += bytes;
    f->allocs++;
    *addr = at;
    return RK_OK;
}

static void fake_free(void *ctx, uint64_t addr, size_t bytes)
{
    fake *f = ctx;
    for (int i = 0; i < f->n; i++) {
        if (f->start[i] == addr) {
            assert_int_equal(f->len[i], bytes); /* freed with the size it was given */
            memmove(&f->start[i], &f->start[i + 1], (size_t)(f->n - i - 1) * sizeof f->start[0]);
            memmove(&f->len[i], &f->len[i + 1], (size_t)(f->n - i - 1) * sizeof f->len[0]);
            f->n--;
            f->used -= bytes;
            f->frees++;
            return;
        }
    }
    if (f->overlap_bug)
        return; /* the range it handed out twice, given back */
    fail_msg("fake: free of 0x%" PRIx64 " that it never handed out", addr);
}

static fake *fake_new(size_t capacity)
{
    fake *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->capacity = capacity;
    return f;
}

static rk_pool *pool_new(fake *f, uint64_t limit)
{
    rk_pool_backend be = {f, fake_alloc, fake_free};
    rk_pool_opts o = {"GPU 7", limit};
    rk_pool *p;
    rk_err err;
    assert_int_equal(rk_pool_create(&p, &be, &o, &err), RK_OK);
    return p;
}

static void check_ok(const rk_pool *p)
{
    rk_err err = {0};
    int rc = rk_pool_check(p, &err);
    if (rc != RK_OK)
        fail_msg("rk_pool_check: %s", err.msg);
}

static uint64_t alloc_ok(rk_pool *p, size_t size)
{
    uint64_t a = 0;
    rk_err err = {0};
    int rc = rk_pool_alloc(p, size, &a, &err);
    if (rc != RK_OK)
        fail_msg("alloc %zu: %s", size, err.msg);
    check_ok(p);
    return a;
}

static void free_ok(rk_pool *p, uint64_t a)
{
    rk_err err = {0};
    int rc = rk_pool_free(p, a, &err);
    if (rc != RK_OK)
        fail_msg("free 0x%" PRIx64 ": %s", a, err.msg);
    check_ok(p);
}

static rk_pool_stats stats(const rk_pool *p)
{
    rk_pool_stats s;
    rk_pool_stats_get(p, &s);
    return s;
}

/* ---- the size rules ------------------------------------------------------------------- */

static void test_rules(void **state)
{
    (void)state;
    assert_int_equal(rk_pool_round_size(1), 512);
    assert_int_equal(rk_pool_round_size(512), 512);
    assert_int_equal(rk_pool_round_size(513), 1024);
    assert_int_equal(rk_pool_round_size(1000), 1024);
    assert_int_equal(rk_pool_kind_of(MiB), RK_POOL_SMALL);
    assert_int_equal(rk_pool_kind_of(MiB + 512), RK_POOL_LARGE);
    assert_int_equal(rk_pool_segment_size(512), 2 * MiB);
    assert_int_equal(rk_pool_segment_size(MiB), 2 * MiB);
    assert_int_equal(rk_pool_segment_size(MiB + 512), 20 * MiB);
    assert_int_equal(rk_pool_segment_size(10 * MiB - 512), 20 * MiB);
    assert_int_equal(rk_pool_segment_size(10 * MiB), 10 * MiB);
    assert_int_equal(rk_pool_segment_size(11 * MiB), 12 * MiB);
    assert_int_equal(rk_pool_segment_size(12 * MiB + 512), 14 * MiB);
}

/* A small request: a 2 MiB segment split into the block and the cached rest; the next small
 * request is carved from that rest. */
static void test_small_split(void **state)
{
    (void)state;
    fake *f = fake_new(1ull << 34);
    rk_pool *p = pool_new(f, 0);
    uint64_t a = alloc_ok(p, 1000);
    assert_int_equal(a, BASE);
    rk_pool_stats s = stats(p);
    assert_int_equal(s.segment[RK_POOL_ALL].current, 1);
    assert_int_equal(s.segment[RK_POOL_SMALL].current, 1);
    assert_int_equal(s.segment[RK_POOL_LARGE].current, 0);
    assert_int_equal(s.reserved_bytes[RK_POOL_SMALL].current, 2 * MiB);
    assert_int_equal(s.allocated_bytes[RK_POOL_SMALL].current, 1024);
    assert_int_equal(s.requested_bytes[RK_POOL_SMALL].current, 1000);
    assert_int_equal(s.inactive_split[RK_POOL_SMALL].current, 1);
    assert_int_equal(s.inactive_split_bytes[RK_POOL_SMALL].current, 2 * MiB - 1024);
    uint64_t b = alloc_ok(p, 1);
    assert_int_equal(b, BASE + 1024);
    s = stats(p);
    assert_int_equal(s.num_device_alloc, 1);
    assert_int_equal(s.allocated_bytes[RK_POOL_ALL].current, 1536);
    assert_int_equal(s.inactive_split_bytes[RK_POOL_ALL].current, 2 * MiB - 1536);
    /* two 1 MiB blocks: the second takes a rest of exactly 1 MiB, not split further */
    size_t sz;
    free_ok(p, a);
    free_ok(p, b);
    assert_int_equal(stats(p).inactive_split[RK_POOL_ALL].current, 0); /* one whole block */
    uint64_t c = alloc_ok(p, MiB), d = alloc_ok(p, MiB);
    assert_int_equal(c, BASE);
    assert_int_equal(d, BASE + MiB);
    assert_int_equal(rk_pool_block_size(p, d, &sz, NULL), RK_OK);
    assert_int_equal(sz, MiB);
    assert_int_equal(stats(p).inactive_split[RK_POOL_ALL].current, 0);
    assert_int_equal(stats(p).segment[RK_POOL_ALL].current, 1);
    rk_pool_destroy(p);
    assert_int_equal(f->used, 0);
    free(f);
}

/* Large requests: a 20 MiB segment under 10 MiB, split only when more than 1 MiB is left; a
 * segment of the size rounded to 2 MiB from 10 MiB on; small and large never share. */
static void test_large_split(void **state)
{
    (void)state;
    fake *f = fake_new(1ull << 34);
    rk_pool *p = pool_new(f, 0);
    uint64_t a = alloc_ok(p, 3 * MiB / 2);
    size_t sz;
    assert_int_equal(rk_pool_block_size(p, a, &sz, NULL), RK_OK);
    assert_int_equal(sz, 3 * MiB / 2);
    rk_pool_stats s = stats(p);
    assert_int_equal(s.reserved_bytes[RK_POOL_LARGE].current, 20 * MiB);
    assert_int_equal(s.inactive_split_bytes[RK_POOL_LARGE].current, 20 * MiB - 3 * MiB / 2);
    /* 18.5 MiB left: a request that leaves exactly 1 MiB takes the whole rest */
    uint64_t b = alloc_ok(p, 35 * MiB / 2);
    assert_int_equal(b, a + 3 * MiB / 2);
    assert_int_equal(rk_pool_block_size(p, b, &sz, NULL), RK_OK);
    assert_int_equal(sz, 37 * MiB / 2);
    assert_int_equal(stats(p).inactive_split[RK_POOL_LARGE].current, 0);
    /* 19.5 MiB: a segment of 20 MiB (rounded to 2 MiB), the 0.5 MiB rest not split off */
    uint64_t c = alloc_ok(p, 39 * MiB / 2);
    assert_int_equal(rk_pool_block_size(p, c, &sz, NULL), RK_OK);
    assert_int_equal(sz, 20 * MiB);
    assert_int_equal(stats(p).segment[RK_POOL_LARGE].current, 2);
    assert_int_equal(stats(p).requested_bytes[RK_POOL_LARGE].current,
                     3 * MiB / 2 + 35 * MiB / 2 + 39 * MiB / 2);
    /* a large free block is never used for a small request */
    free_ok(p, c);
    uint64_t d = alloc_ok(p, 4096);
    s = stats(p);
    assert_int_equal(s.segment[RK_POOL_SMALL].current, 1);
    assert_int_equal(s.segment[RK_POOL_ALL].current, 3);
    assert_true(d < c || d >= c + 20 * MiB);
    /* ... and a small free block never for a large one */
    free_ok(p, d);
    uint64_t e = alloc_ok(p, MiB + 1);
    assert_int_equal(e, c); /* the cached 20 MiB block, split */
    assert_int_equal(stats(p).segment[RK_POOL_ALL].current, 3);
    assert_int_equal(stats(p).num_device_alloc, 3);
    rk_pool_destroy(p);
    assert_int_equal(f->used, 0);
    free(f);
}

/* Three neighbours A, B, C freed in each of the 6 orders become one block with the rest of
 * their segment: after the last free no split is left and the segment is released whole. */
static void test_coalesce_every_order(void **state)
{
    (void)state;
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                     {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int full = 0; full < 2; full++) {
        for (int o = 0; o < 6; o++) {
            fake *f = fake_new(1ull << 34);
            rk_pool *p = pool_new(f, 0);
            /* full: A, B, C fill the 2 MiB segment; else a free rest follows C */
            size_t sizes[3] = {full ? 512 * KiB : 4 * KiB, full ? 512 * KiB : 8 * KiB,
                               full ? MiB : 12 * KiB};
            uint64_t at[3];
            for (int i = 0; i < 3; i++)
                at[i] = alloc_ok(p, sizes[i]);
            assert_int_equal(at[1], at[0] + sizes[0]);
            assert_int_equal(at[2], at[1] + sizes[1]);
            assert_int_equal(stats(p).inactive_split[RK_POOL_ALL].current, full ? 0 : 1);
            for (int i = 0; i < 3; i++) {
                free_ok(p, at[orders[o][i]]);
                rk_pool_stats s = stats(p);
                /* free blocks so far, merged with each other and with the rest */
                int runs = 0;
                bool was_free = false;
                for (int j = 0; j < 4; j++) {
                    bool fr = j == 3 ? !full : false;
                    for (int k = 0; k <= i && j < 3; k++)
                        fr = fr || orders[o][k] == j;
                    runs += fr && !was_free;
                    was_free = fr;
                }
                if (i == 2)
                    assert_int_equal(s.inactive_split[RK_POOL_ALL].current, 0);
                else
                    assert_int_equal(s.inactive_split[RK_POOL_ALL].current, runs);
            }
            assert_int_equal(stats(p).allocated_bytes[RK_POOL_ALL].current, 0);
            assert_int_equal(rk_pool_release_cached(p), 2 * MiB);
            assert_int_equal(f->used, 0);
            check_ok(p);
            rk_pool_destroy(p);
            free(f);
        }
    }
}

/* Best fit: of the free holes 8, 4 and 16 KiB (kept apart by allocated guards) a 3 KiB
 * request takes the 4 KiB hole, 5 KiB the 8 KiB one, 12 KiB the 16 KiB one, and 20 KiB the
 * rest of the segment; each split leaves its remainder cached. */
static void test_best_fit(void **state)
{
    (void)state;
    fake *f = fake_new(1ull << 34);
    rk_pool *p = pool_new(f, 0);
    uint64_t h1 = alloc_ok(p, 8 * KiB), g1 = alloc_ok(p, 512);
    uint64_t h2 = alloc_ok(p, 4 * KiB), g2 = alloc_ok(p, 512);
    uint64_t h3 = alloc_ok(p, 16 * KiB), g3 = alloc_ok(p, 512);
    (void)g1;
    (void)g2;
    free_ok(p, h1);
    free_ok(p, h3);
    free_ok(p, h2);
    assert_int_equal(stats(p).inactive_split[RK_POOL_ALL].current, 4);
    assert_int_equal(alloc_ok(p, 3 * KiB), h2);
    assert_int_equal(stats(p).inactive_split[RK_POOL_ALL].current, 4); /* 1 KiB rest of h2 */
    assert_int_equal(alloc_ok(p, 5 * KiB), h1);
    assert_int_equal(alloc_ok(p, 12 * KiB), h3);
    assert_int_equal(alloc_ok(p, 1 * KiB), h2 + 3 * KiB); /* the 1 KiB rest, exactly */
    assert_int_equal(alloc_ok(p, 20 * KiB), g3 + 512);
    assert_int_equal(alloc_ok(p, 3 * KiB), h1 + 5 * KiB); /* 3 KiB rest of h1 */
    rk_pool_stats s = stats(p);
    assert_int_equal(s.segment[RK_POOL_ALL].current, 1);
    /* left free: 4 KiB of h3 and the segment's tail */
    assert_int_equal(s.inactive_split[RK_POOL_ALL].current, 2);
    assert_int_equal(s.inactive_split_bytes[RK_POOL_ALL].current,
                     2 * MiB - (8 + 4 + 12 + 20) * KiB - 3 * 512);
    rk_pool_destroy(p);
    free(f);
}

/* The statistics against a model kept by the test, after every step, peaks included. */
typedef struct model {
    uint64_t n_alloc, b_alloc, b_req, n_seg, b_res;
    uint64_t peak_alloc, peak_res;
} model;

static void model_check(const rk_pool *p, const model *m)
{
    rk_pool_stats s = stats(p);
    assert_int_equal(s.allocation[RK_POOL_ALL].current, m->n_alloc);
    assert_int_equal(s.active[RK_POOL_ALL].current, m->n_alloc);
    assert_int_equal(s.allocated_bytes[RK_POOL_ALL].current, m->b_alloc);
    assert_int_equal(s.active_bytes[RK_POOL_ALL].current, m->b_alloc);
    assert_int_equal(s.requested_bytes[RK_POOL_ALL].current, m->b_req);
    assert_int_equal(s.segment[RK_POOL_ALL].current, m->n_seg);
    assert_int_equal(s.reserved_bytes[RK_POOL_ALL].current, m->b_res);
    assert_int_equal(s.allocated_bytes[RK_POOL_ALL].peak, m->peak_alloc);
    assert_int_equal(s.reserved_bytes[RK_POOL_ALL].peak, m->peak_res);
}

static void model_alloc(model *m, size_t asked, size_t rounded, size_t new_seg)
{
    m->n_alloc++;
    m->b_alloc += rounded;
    m->b_req += asked;
    if (m->b_alloc > m->peak_alloc)
        m->peak_alloc = m->b_alloc;
    if (new_seg) {
        m->n_seg++;
        m->b_res += new_seg;
        if (m->b_res > m->peak_res)
            m->peak_res = m->b_res;
    }
}

static void test_stats_model(void **state)
{
    (void)state;
    fake *f = fake_new(1ull << 34);
    rk_pool *p = pool_new(f, 0);
    model m = {0};
    model_check(p, &m);
    uint64_t a = alloc_ok(p, 100); /* new 2 MiB segment */
    model_alloc(&m, 100, 512, 2 * MiB);
    model_check(p, &m);
    uint64_t b = alloc_ok(p, 5 * MiB); /* new 20 MiB segment */
    model_alloc(&m, 5 * MiB, 5 * MiB, 20 * MiB);
    model_check(p, &m);
    uint64_t c = alloc_ok(p, 12 * MiB + 1); /* 12.5 MiB from the 15 MiB rest */
    model_alloc(&m, 12 * MiB + 1, 12 * MiB + 512, 0);
    model_check(p, &m);
    uint64_t d = alloc_ok(p, 33 * MiB); /* a 34 MiB segment, the 1 MiB rest not split off */
    model_alloc(&m, 33 * MiB, 34 * MiB, 34 * MiB);
    model_check(p, &m);
    free_ok(p, b);
    m.n_alloc--, m.b_alloc -= 5 * MiB, m.b_req -= 5 * MiB;
    model_check(p, &m);
    free_ok(p, d);
    m.n_alloc--, m.b_alloc -= 34 * MiB, m.b_req -= 33 * MiB;
    model_check(p, &m);
    assert_int_equal(rk_pool_release_cached(p), 34 * MiB); /* only d's segment is whole */
    m.n_seg--, m.b_res -= 34 * MiB;
    model_check(p, &m);
    free_ok(p, c);
    m.n_alloc--, m.b_alloc -= 12 * MiB + 512, m.b_req -= 12 * MiB + 1;
    free_ok(p, a);
    m.n_alloc--, m.b_alloc -= 512, m.b_req -= 100;
    model_check(p, &m);
    assert_int_equal(rk_pool_release_cached(p), 22 * MiB);
    m.n_seg -= 2, m.b_res -= 22 * MiB;
    model_check(p, &m);
    rk_pool_stats s = stats(p);
    assert_int_equal(s.allocation[RK_POOL_ALL].allocated, 4);
    assert_int_equal(s.allocation[RK_POOL_ALL].freed, 4);
    assert_int_equal(s.allocation[RK_POOL_SMALL].allocated, 1);
    assert_int_equal(s.num_device_alloc, 3);
    assert_int_equal(s.num_device_free, 3);
    assert_int_equal(s.num_alloc_retries, 0);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(f->used, 0);
    rk_pool_destroy(p);
    free(f);
}

/* Out of memory: the backend refuses; the pool gives back its fully free cached segments
 * and retries once. When even that fails: RK_ENOMEM naming the size, reserved and allocated
 * bytes, nothing else changed. */
static void test_oom_retry(void **state)
{
    (void)state;
    fake *f = fake_new(20 * MiB);
    rk_pool *p = pool_new(f, 0);
    uint64_t a = alloc_ok(p, 4096);
    free_ok(p, a);                      /* a 2 MiB segment cached, fully free */
    uint64_t b = alloc_ok(p, 19 * MiB); /* needs 20 MiB: refused, released, retried */
    rk_pool_stats s = stats(p);
    assert_int_equal(f->refusals, 1);
    assert_int_equal(s.num_alloc_retries, 1);
    assert_int_equal(s.num_ooms, 0);
    assert_int_equal(s.num_device_free, 1);
    assert_int_equal(s.segment[RK_POOL_ALL].current, 1);
    assert_int_equal(s.reserved_bytes[RK_POOL_ALL].current, 20 * MiB);
    /* all 20 MiB allocated (the 1 MiB rest not split off): a small request cannot be met */
    uint64_t x = 42;
    rk_err err = {0};
    rk_pool_stats before = stats(p);
    assert_int_equal(rk_pool_alloc(p, 4096, &x, &err), RK_ENOMEM);
    assert_int_equal(err.code, RK_ENOMEM);
    assert_int_equal(x, 42);
    assert_non_null(strstr(err.msg, "GPU 7: out of memory: asked for 4096 bytes"));
    assert_non_null(strstr(err.msg, "20971520 bytes reserved, 20971520 allocated"));
    assert_non_null(strstr(err.msg, "fake: 2097152 bytes asked")); /* the backend's own */
    check_ok(p);
    s = stats(p);
    assert_int_equal(f->refusals, 3);
    assert_int_equal(s.num_alloc_retries, 2);
    assert_int_equal(s.num_ooms, 1);
    before.num_alloc_retries = s.num_alloc_retries;
    before.num_ooms = s.num_ooms;
    assert_memory_equal(&before, &s, sizeof s); /* only the counters moved */
    /* a segment with an allocated block is not released: still out of memory */
    free_ok(p, b);
    uint64_t c = alloc_ok(p, 2 * MiB); /* from the cached 20 MiB segment, split */
    (void)c;
    assert_int_equal(rk_pool_alloc(p, 20 * MiB, &x, &err), RK_ENOMEM);
    assert_int_equal(stats(p).segment[RK_POOL_ALL].current, 1);
    assert_int_equal(stats(p).num_ooms, 2);
    check_ok(p);
    rk_pool_destroy(p);
    assert_int_equal(f->used, 0);
    free(f);
}

/* The pool's own limit is an out-of-memory as the backend's is, retried the same way. */
static void test_limit(void **state)
{
    (void)state;
    fake *f = fake_new(1ull << 34);
    rk_pool *p = pool_new(f, 4 * MiB);
    uint64_t a = alloc_ok(p, MiB);
    for (int i = 0; i < 3; i++)
        alloc_ok(p, MiB); /* two 2 MiB segments, full */
    uint64_t x;
    rk_err err = {0};
    assert_int_equal(rk_pool_alloc(p, MiB, &x, &err), RK_ENOMEM);
    assert_non_null(strstr(err.msg, "limit of 4194304 bytes"));
    assert_int_equal(f->refusals, 0); /* the backend was never asked */
    free_ok(p, a);
    assert_int_equal(alloc_ok(p, MiB), a); /* from the cache */
    assert_int_equal(stats(p).num_ooms, 1);
    assert_int_equal(stats(p).num_alloc_retries, 1);
    rk_pool_destroy(p);
    free(f);
}

/* A bad free (never handed out, inside a block, twice) is RK_EINVAL and changes nothing. */
static void test_bad_free(void **state)
{
    (void)state;
    fake *f = fake_new(1ull << 34);
    rk_pool *p = pool_new(f, 0);
    rk_err err = {0};
    assert_int_equal(rk_pool_free(p, BASE, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "not an address this pool handed out"));
    uint64_t a = alloc_ok(p, 4096), b = alloc_ok(p, 4096);
    rk_pool_stats before = stats(p);
    assert_int_equal(rk_pool_free(p, a + 512, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "512 bytes inside the block handed out at"));
    assert_int_equal(rk_pool_free(p, BASE - 1, &err), RK_EINVAL);
    assert_int_equal(rk_pool_free(p, BASE + 2 * MiB, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "not an address this pool handed out"));
    assert_int_equal(rk_pool_free(p, BASE + MiB, &err), RK_EINVAL); /* in the cached rest */
    assert_non_null(strstr(err.msg, "already freed"));
    rk_pool_stats s = stats(p);
    assert_memory_equal(&before, &s, sizeof s);
    check_ok(p);
    free_ok(p, a);
    before = stats(p);
    assert_int_equal(rk_pool_free(p, a, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "GPU 7: free of 0x7f0000000000: it lies in a free block"));
    assert_non_null(strstr(err.msg, "already freed"));
    free_ok(p, b);
    assert_int_equal(rk_pool_free(p, b, &err), RK_EINVAL); /* merged into one free block */
    assert_non_null(strstr(err.msg, "already freed"));
    size_t sz;
    assert_int_equal(rk_pool_block_size(p, b, &sz, &err), RK_EINVAL);
    check_ok(p);
    rk_pool_destroy(p);
    free(f);
}

/* Sizes outside 1 .. RK_POOL_MAX_REQUEST, a backend that fails another way, one that hands
 * out overlapping ranges, and a table without functions are refused. */
static void test_bad_args_and_backends(void **state)
{
    (void)state;
    fake *f = fake_new(1ull << 34);
    rk_pool *p = pool_new(f, 0);
    uint64_t x;
    rk_err err = {0};
    assert_int_equal(rk_pool_alloc(p, 0, &x, &err), RK_EINVAL);
    assert_int_equal(rk_pool_alloc(p, RK_POOL_MAX_REQUEST + 1, &x, &err), RK_EINVAL);
    assert_int_equal(rk_pool_alloc(p, SIZE_MAX, &x, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "cannot allocate"));
    f->fail_code = RK_EBACKEND;
    assert_int_equal(rk_pool_alloc(p, 10, &x, &err), RK_EBACKEND);
    assert_non_null(strstr(err.msg, "GPU 7: the backend failed to allocate 2097152 bytes: fake"));
    assert_int_equal(stats(p).num_ooms, 0);
    assert_int_equal(stats(p).num_alloc_retries, 0);
    f->fail_code = RK_OK;
    alloc_ok(p, 2 * MiB);
    f->overlap_bug = true;
    assert_int_equal(rk_pool_alloc(p, 19 * MiB, &x, &err), RK_EBACKEND);
    assert_non_null(strstr(err.msg, "overlaps"));
    f->overlap_bug = false;
    assert_int_equal(stats(p).segment[RK_POOL_ALL].current, 1);
    check_ok(p);
    rk_pool_destroy(p);
    rk_pool_backend none = {f, NULL, fake_free};
    assert_int_equal(rk_pool_create(&p, &none, NULL, &err), RK_EINVAL);
    assert_null(p);
    free(f);
}

/* The checker is not blind: corruption planted in each kind of structure is found. */
static void test_checker_catches(void **state)
{
    (void)state;
    fake *f = fake_new(1ull << 34);
    rk_pool *p = pool_new(f, 0);
    uint64_t a = alloc_ok(p, 4096), b = alloc_ok(p, 8192);
    alloc_ok(p, 3 * MiB);
    free_ok(p, a);
    (void)b;
    rk_err err = {0};
    blk *first = BLK_OF(avl_floor1(p->addr_tree, a), by_addr);
    /* a statistic off by one */
    p->st.allocated_bytes[RK_POOL_SMALL].current++;
    assert_int_equal(rk_pool_check(p, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "allocated_bytes[small]"));
    p->st.allocated_bytes[RK_POOL_SMALL].current--;
    /* a peak below its current */
    uint64_t peak = p->st.reserved_bytes[RK_POOL_ALL].peak;
    p->st.reserved_bytes[RK_POOL_ALL].peak = 1;
    assert_int_equal(rk_pool_check(p, &err), RK_EFORMAT);
    p->st.reserved_bytes[RK_POOL_ALL].peak = peak;
    /* a block that does not tile its segment */
    blk *second = first->next;
    second->size += 512;
    assert_int_equal(rk_pool_check(p, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "tile"));
    second->size -= 512;
    /* two free neighbours */
    second->allocated = false;
    assert_int_equal(rk_pool_check(p, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "neighbours"));
    second->allocated = true;
    /* a free block missing from its size tree */
    p->free_tree[RK_POOL_SMALL] = avl_remove(p->free_tree[RK_POOL_SMALL], first->size, first->addr);
    assert_int_equal(rk_pool_check(p, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "size tree"));
    free_tree_insert(p, first);
    /* an unbalanced tree: a height lie */
    p->addr_tree->h += 1;
    assert_int_equal(rk_pool_check(p, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "address tree"));
    p->addr_tree->h -= 1;
    check_ok(p);
    rk_pool_destroy(p);
    free(f);
}

/* A long random trace over 512 slots, sizes from 1 byte to 48 MiB (log-uniform), a device of
 * 1 GiB so that out-of-memory happens, empty_cache now and then: rk_pool_check after every
 * operation, every live block at least its request and apart from every other (the
 * checker's tiling), the allocated bytes equal to the test's sum, and at the end nothing
 * left. Seeded: the same trace every run. */
static void test_random_trace(void **state)
{
    (void)state;
    enum { SLOTS = 512, OPS = 20000 };
    fake *f = fake_new(1ull << 30);
    rk_pool *p = pool_new(f, 0);
    static uint64_t addr[SLOTS];
    static size_t asked[SLOTS];
    memset(asked, 0, sizeof asked);
    rk_rng r;
    rk_rng_seed(&r, 18);
    uint64_t live_req = 0, ooms = 0;
    for (int op = 0; op < OPS; op++) {
        uint64_t pick = rk_rng_below(&r, 100);
        size_t i = (size_t)rk_rng_below(&r, SLOTS);
        rk_err err = {0};
        if (pick == 0) {
            rk_pool_release_cached(p);
        } else if (asked[i]) {
            assert_int_equal(rk_pool_free(p, addr[i], &err), RK_OK);
            live_req -= asked[i];
            asked[i] = 0;
        } else {
            double lg = rk_rng_uniform(&r) * 25.6; /* 2^0 .. 2^25.6 = 48 MiB */
            size_t size = (size_t)(1.0 + exp2(lg));
            int rc = rk_pool_alloc(p, size, &addr[i], &err);
            if (rc == RK_ENOMEM) {
                ooms++;
                assert_non_null(strstr(err.msg, "out of memory"));
            } else {
                assert_int_equal(rc, RK_OK);
                size_t sz;
                assert_int_equal(rk_pool_block_size(p, addr[i], &sz, NULL), RK_OK);
                assert_true(sz >= size);
                asked[i] = size;
                live_req += size;
            }
        }
        check_ok(p);
        assert_int_equal(stats(p).requested_bytes[RK_POOL_ALL].current, live_req);
        assert_true(f->used <= f->capacity);
    }
    rk_pool_stats s = stats(p);
    assert_int_equal(s.num_ooms, ooms);
    assert_true(ooms > 0);                    /* the trace reaches the device's end */
    assert_true(s.num_alloc_retries >= ooms); /* each OOM was retried first */
    for (size_t i = 0; i < SLOTS; i++)
        if (asked[i])
            free_ok(p, addr[i]);
    assert_int_equal(rk_pool_release_cached(p), s.reserved_bytes[RK_POOL_ALL].current);
    check_ok(p);
    assert_int_equal(f->used, 0);
    assert_int_equal(f->n, 0);
    rk_pool_destroy(p);
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules),           cmocka_unit_test(test_small_split),
        cmocka_unit_test(test_large_split),     cmocka_unit_test(test_coalesce_every_order),
        cmocka_unit_test(test_best_fit),        cmocka_unit_test(test_stats_model),
        cmocka_unit_test(test_oom_retry),       cmocka_unit_test(test_limit),
        cmocka_unit_test(test_bad_free),        cmocka_unit_test(test_bad_args_and_backends),
        cmocka_unit_test(test_checker_catches), cmocka_unit_test(test_random_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
