/*
 * The caching device-memory pool (gpu/pool.h, docs/pool.md): segments from a backend, blocks
 * carved out of them, kept in two intrusive AVL trees (free blocks by size then address, one
 * tree per pool; every block by address), and PyTorch's statistics kept on every change.
 * Plain C over addresses: it relies on nothing but the backend table and base/'s errors.
 */
#include "gpu/pool.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- an intrusive AVL tree over (k1, k2) keys, unique in a tree ------------------------ */

typedef struct avl {
    struct avl *l, *r;
    uint64_t k1, k2;
    int h;
} avl;

static int avl_h(const avl *n)
{
    return n ? n->h : 0;
}

static void avl_fix(avl *n)
{
    int hl = avl_h(n->l), hr = avl_h(n->r);
    n->h = 1 + (hl > hr ? hl : hr);
}

static int avl_cmp(uint64_t a1, uint64_t a2, const avl *b)
{
    if (a1 != b->k1)
        return a1 < b->k1 ? -1 : 1;
    if (a2 != b->k2)
        return a2 < b->k2 ? -1 : 1;
    return 0;
}

static avl *avl_rot_right(avl *n)
{
    avl *l = n->l;
    n->l = l->r;
    l->r = n;
    avl_fix(n);
    avl_fix(l);
    return l;
}

static avl *avl_rot_left(avl *n)
{
    avl *r = n->r;
    n->r = r->l;
    r->l = n;
    avl_fix(n);
    avl_fix(r);
    return r;
}

static avl *avl_balance(avl *n)
{
    avl_fix(n);
    int d = avl_h(n->l) - avl_h(n->r);
    if (d > 1) {
        if (avl_h(n->l->l) < avl_h(n->l->r))
            n->l = avl_rot_left(n->l);
        return avl_rot_right(n);
    }
    if (d < -1) {
        if (avl_h(n->r->r) < avl_h(n->r->l))
            n->r = avl_rot_right(n->r);
        return avl_rot_left(n);
    }
    return n;
}

/* x's key must not be in the tree. */
static avl *avl_insert(avl *root, avl *x)
{
    if (!root) {
        x->l = x->r = NULL;
        x->h = 1;
        return x;
    }
    if (avl_cmp(x->k1, x->k2, root) < 0)
        root->l = avl_insert(root->l, x);
    else
        root->r = avl_insert(root->r, x);
    return avl_balance(root);
}

static avl *avl_unlink_min(avl *n, avl **min)
{
    if (!n->l) {
        *min = n;
        return n->r;
    }
    n->l = avl_unlink_min(n->l, min);
    return avl_balance(n);
}

/* Remove the node with key (k1, k2), which must be in the tree. */
static avl *avl_remove(avl *root, uint64_t k1, uint64_t k2)
{
    if (!root)
        return NULL;
    int c = avl_cmp(k1, k2, root);
    if (c < 0) {
        root->l = avl_remove(root->l, k1, k2);
    } else if (c > 0) {
        root->r = avl_remove(root->r, k1, k2);
    } else {
        avl *l = root->l, *r = root->r;
        if (!r)
            return l;
        avl *min;
        r = avl_unlink_min(r, &min);
        min->l = l;
        min->r = r;
        return avl_balance(min);
    }
    return avl_balance(root);
}

/* The smallest node with a key >= (k1, k2), or NULL. */
static avl *avl_ceil(avl *n, uint64_t k1, uint64_t k2)
{
    avl *best = NULL;
    while (n) {
        if (avl_cmp(k1, k2, n) <= 0) {
            best = n;
            n = n->l;
        } else {
            n = n->r;
        }
    }
    return best;
}

/* The largest node with k1 <= `k1` (k2 ignored), or NULL. */
static avl *avl_floor1(avl *n, uint64_t k1)
{
    avl *best = NULL;
    while (n) {
        if (n->k1 <= k1) {
            best = n;
            n = n->r;
        } else {
            n = n->l;
        }
    }
    return best;
}

/* ---- segments and blocks ---------------------------------------------------------------- */

typedef struct seg seg;

typedef struct blk {
    avl by_addr;      /* in p->addr_tree: (addr, 0), every block */
    avl by_size;      /* in p->free_tree[kind]: (size, addr), free blocks only */
    uint64_t addr;    /* first byte */
    size_t size;      /* bytes, a multiple of RK_POOL_MIN_BLOCK */
    size_t requested; /* what the caller asked for, while allocated */
    struct blk *prev; /* neighbours in the segment, in address order */
    struct blk *next; /* (also links the spare list) */
    seg *seg;         /* the segment that holds it */
    bool allocated;
} blk;

struct seg {
    uint64_t addr;
    size_t size;
    int kind; /* RK_POOL_SMALL or RK_POOL_LARGE */
    blk *first;
    seg *prev, *next; /* p->segs, in the order they were made */
};

struct rk_pool {
    rk_pool_backend be;
    char name[64];
    uint64_t limit;
    avl *addr_tree;
    avl *free_tree[RK_POOL_KINDS]; /* [RK_POOL_SMALL], [RK_POOL_LARGE]; [RK_POOL_ALL] unused */
    seg *segs;
    blk *spare; /* block structs kept for reuse, linked by next */
    rk_pool_stats st;
};

#define BLK_OF(node, field) ((blk *)((char *)(node)-offsetof(blk, field)))

/* ---- the rules ------------------------------------------------------------------------ */

size_t rk_pool_round_size(size_t size)
{
    if (size < RK_POOL_MIN_BLOCK)
        return RK_POOL_MIN_BLOCK;
    return (size + RK_POOL_MIN_BLOCK - 1) / RK_POOL_MIN_BLOCK * RK_POOL_MIN_BLOCK;
}

int rk_pool_kind_of(size_t rounded)
{
    return rounded <= RK_POOL_SMALL_SIZE ? RK_POOL_SMALL : RK_POOL_LARGE;
}

size_t rk_pool_segment_size(size_t rounded)
{
    if (rounded <= RK_POOL_SMALL_SIZE)
        return RK_POOL_SMALL_BUFFER;
    if (rounded < RK_POOL_MIN_LARGE_ALLOC)
        return RK_POOL_LARGE_BUFFER;
    return (rounded + RK_POOL_ROUND_LARGE - 1) / RK_POOL_ROUND_LARGE * RK_POOL_ROUND_LARGE;
}

/* Split a block of `size` serving a request rounded to `rounded` when the rest is worth
 * keeping: PyTorch's should_split. */
static bool should_split(int kind, size_t size, size_t rounded)
{
    size_t rest = size - rounded;
    return kind == RK_POOL_SMALL ? rest >= RK_POOL_MIN_BLOCK : rest > RK_POOL_SMALL_SIZE;
}

/* ---- statistics ------------------------------------------------------------------------ */

static void stat_one(rk_pool_stat *s, int64_t delta)
{
    if (delta >= 0) {
        s->current += (uint64_t)delta;
        s->allocated += (uint64_t)delta;
        if (s->current > s->peak)
            s->peak = s->current;
    } else {
        s->current -= (uint64_t)-delta;
        s->freed += (uint64_t)-delta;
    }
}

static void stat_add(rk_pool_stat *arr, int kind, int64_t delta)
{
    stat_one(&arr[RK_POOL_ALL], delta);
    stat_one(&arr[kind], delta);
}

static bool is_split(const blk *b)
{
    return b->prev || b->next;
}

/* Count (sign +1) or uncount (-1) a block in inactive_split if it is one. */
static void stat_inactive(rk_pool *p, const blk *b, int sign)
{
    if (b->allocated || !is_split(b))
        return;
    stat_add(p->st.inactive_split, b->seg->kind, sign);
    stat_add(p->st.inactive_split_bytes, b->seg->kind, sign * (int64_t)b->size);
}

/* ---- block structs ----------------------------------------------------------------------- */

/* Make sure `n` spare block structs exist, so that the change that follows cannot fail
 * halfway. */
static int spare_reserve(rk_pool *p, int n, size_t size, rk_err *err)
{
    int have = 0;
    for (blk *b = p->spare; b && have < n; b = b->next)
        have++;
    for (; have < n; have++) {
        blk *b = malloc(sizeof *b);
        if (!b)
            return rk_err_set(err, RK_ENOMEM,
                              "%s: out of host memory for the bookkeeping of a %zu-byte block",
                              p->name, size);
        b->next = p->spare;
        p->spare = b;
    }
    return RK_OK;
}

static blk *spare_take(rk_pool *p)
{
    blk *b = p->spare;
    p->spare = b->next;
    memset(b, 0, sizeof *b);
    return b;
}

static void spare_put(rk_pool *p, blk *b)
{
    b->next = p->spare;
    p->spare = b;
}

static void free_tree_insert(rk_pool *p, blk *b)
{
    b->by_size.k1 = b->size;
    b->by_size.k2 = b->addr;
    int k = b->seg->kind;
    p->free_tree[k] = avl_insert(p->free_tree[k], &b->by_size);
}

static void free_tree_remove(rk_pool *p, blk *b)
{
    int k = b->seg->kind;
    p->free_tree[k] = avl_remove(p->free_tree[k], b->size, b->addr);
}

static void addr_tree_insert(rk_pool *p, blk *b)
{
    b->by_addr.k1 = b->addr;
    b->by_addr.k2 = 0;
    p->addr_tree = avl_insert(p->addr_tree, &b->by_addr);
}

static void addr_tree_remove(rk_pool *p, blk *b)
{
    p->addr_tree = avl_remove(p->addr_tree, b->addr, 0);
}

/* ---- create, destroy ------------------------------------------------------------------ */

int rk_pool_create(rk_pool **out, const rk_pool_backend *be, const rk_pool_opts *o, rk_err *err)
{
    *out = NULL;
    if (!be || !be->alloc || !be->free)
        return rk_err_set(err, RK_EINVAL, "pool: the backend needs an alloc and a free");
    rk_pool *p = calloc(1, sizeof *p);
    if (!p)
        return rk_err_set(err, RK_ENOMEM, "pool: out of host memory");
    p->be = *be;
    snprintf(p->name, sizeof p->name, "%s", o && o->name && o->name[0] ? o->name : "pool");
    p->limit = o ? o->limit_bytes : 0;
    *out = p;
    return RK_OK;
}

static void seg_release(rk_pool *p, seg *s)
{
    for (blk *b = s->first, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    p->be.free(p->be.ctx, s->addr, s->size);
    if (s->prev)
        s->prev->next = s->next;
    else
        p->segs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s);
}

void rk_pool_destroy(rk_pool *p)
{
    if (!p)
        return;
    while (p->segs)
        seg_release(p, p->segs);
    for (blk *b = p->spare, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(p);
}

/* ---- release -------------------------------------------------------------------------- */

uint64_t rk_pool_release_cached(rk_pool *p)
{
    uint64_t released = 0;
    for (seg *s = p->segs, *n; s; s = n) {
        n = s->next;
        blk *b = s->first;
        if (b->allocated || b->next)
            continue;
        free_tree_remove(p, b);
        addr_tree_remove(p, b);
        stat_add(p->st.segment, s->kind, -1);
        stat_add(p->st.reserved_bytes, s->kind, -(int64_t)s->size);
        p->st.num_device_free++;
        released += s->size;
        seg_release(p, s);
    }
    return released;
}

/* ---- alloc ----------------------------------------------------------------------------- */

/* Does [addr, addr + size) overlap a block of the pool? */
static bool overlaps(const rk_pool *p, uint64_t addr, size_t size)
{
    avl *below = avl_floor1(p->addr_tree, addr + size - 1);
    if (!below)
        return false;
    const blk *b = BLK_OF(below, by_addr);
    return b->addr + b->size > addr;
}

/* One try at a new segment: the pool's limit, then the backend. */
static int seg_try(rk_pool *p, size_t size, uint64_t *addr, rk_err *err)
{
    uint64_t reserved = p->st.reserved_bytes[RK_POOL_ALL].current;
    if (p->limit && (reserved > p->limit || size > p->limit - reserved))
        return rk_err_set(err, RK_ENOMEM, "the pool's limit of %" PRIu64 " bytes is reached",
                          p->limit);
    return p->be.alloc(p->be.ctx, size, addr, err);
}

/* A new segment of `size` for a request of `asked` (rounded to `rounded`), with its one free
 * block (not in the free tree): releases the cached segments and retries once when the
 * device is out of memory. */
static int seg_new(rk_pool *p, size_t asked, size_t rounded, blk **out, rk_err *err)
{
    size_t size = rk_pool_segment_size(rounded);
    int kind = rk_pool_kind_of(rounded);
    seg *s = calloc(1, sizeof *s);
    if (!s)
        return rk_err_set(err, RK_ENOMEM, "%s: out of host memory for a %zu-byte segment", p->name,
                          size);
    uint64_t addr = 0;
    rk_err be_err = {0};
    int rc = seg_try(p, size, &addr, &be_err);
    if (rc == RK_ENOMEM) {
        rk_pool_release_cached(p);
        p->st.num_alloc_retries++;
        rk_err_clear(&be_err);
        rc = seg_try(p, size, &addr, &be_err);
    }
    if (rc != RK_OK) {
        free(s);
        if (rc == RK_ENOMEM) {
            p->st.num_ooms++;
            return rk_err_set(err, RK_ENOMEM,
                              "%s: out of memory: asked for %zu bytes (a %zu-byte segment) with "
                              "%" PRIu64 " bytes reserved, %" PRIu64
                              " allocated; cached segments released and retried once: %s",
                              p->name, asked, size, p->st.reserved_bytes[RK_POOL_ALL].current,
                              p->st.allocated_bytes[RK_POOL_ALL].current,
                              be_err.msg[0] ? be_err.msg : rk_strerror(rc));
        }
        return rk_err_set(err, rc, "%s: the backend failed to allocate %zu bytes: %s", p->name,
                          size, be_err.msg[0] ? be_err.msg : rk_strerror(rc));
    }
    if (addr > UINT64_MAX - size || overlaps(p, addr, size)) {
        p->be.free(p->be.ctx, addr, size);
        free(s);
        return rk_err_set(err, RK_EBACKEND,
                          "%s: the backend returned a %zu-byte range at 0x%" PRIx64
                          " that wraps around or overlaps a segment it gave before",
                          p->name, size, addr);
    }
    blk *b = spare_take(p);
    b->addr = addr;
    b->size = size;
    b->seg = s;
    s->addr = addr;
    s->size = size;
    s->kind = kind;
    s->first = b;
    s->next = p->segs;
    if (p->segs)
        p->segs->prev = s;
    p->segs = s;
    addr_tree_insert(p, b);
    stat_add(p->st.segment, kind, 1);
    stat_add(p->st.reserved_bytes, kind, (int64_t)size);
    p->st.num_device_alloc++;
    *out = b;
    return RK_OK;
}

int rk_pool_alloc(rk_pool *p, size_t size, uint64_t *addr, rk_err *err)
{
    if (size == 0 || size > RK_POOL_MAX_REQUEST)
        return rk_err_set(err, RK_EINVAL, "%s: cannot allocate %zu bytes (1 to %zu)", p->name, size,
                          RK_POOL_MAX_REQUEST);
    size_t rounded = rk_pool_round_size(size);
    int kind = rk_pool_kind_of(rounded);
    /* the new segment's block and a split's rest: nothing can fail past this point but the
     * backend, before anything changed */
    int rc = spare_reserve(p, 2, size, err);
    if (rc != RK_OK)
        return rc;
    blk *b;
    avl *fit = avl_ceil(p->free_tree[kind], rounded, 0);
    if (fit) {
        b = BLK_OF(fit, by_size);
        free_tree_remove(p, b);
        stat_inactive(p, b, -1);
    } else {
        rc = seg_new(p, size, rounded, &b, err);
        if (rc != RK_OK)
            return rc;
    }
    if (should_split(kind, b->size, rounded)) {
        blk *rest = spare_take(p);
        rest->addr = b->addr + rounded;
        rest->size = b->size - rounded;
        rest->seg = b->seg;
        rest->prev = b;
        rest->next = b->next;
        if (b->next)
            b->next->prev = rest;
        b->next = rest;
        b->size = rounded;
        addr_tree_insert(p, rest);
        free_tree_insert(p, rest);
        stat_inactive(p, rest, 1);
    }
    b->allocated = true;
    b->requested = size;
    stat_add(p->st.allocation, kind, 1);
    stat_add(p->st.active, kind, 1);
    stat_add(p->st.allocated_bytes, kind, (int64_t)b->size);
    stat_add(p->st.active_bytes, kind, (int64_t)b->size);
    stat_add(p->st.requested_bytes, kind, (int64_t)size);
    *addr = b->addr;
    return RK_OK;
}

/* ---- free ------------------------------------------------------------------------------ */

/* The allocated block that starts at addr, or NULL with RK_EINVAL saying what addr is. */
static blk *find_allocated(const rk_pool *p, uint64_t addr, const char *what, rk_err *err)
{
    avl *n = avl_floor1(p->addr_tree, addr);
    blk *b = n ? BLK_OF(n, by_addr) : NULL;
    if (!b || addr >= b->addr + b->size) {
        rk_err_set(err, RK_EINVAL, "%s: %s 0x%" PRIx64 ": not an address this pool handed out",
                   p->name, what, addr);
        return NULL;
    }
    if (!b->allocated) {
        rk_err_set(err, RK_EINVAL,
                   "%s: %s 0x%" PRIx64 ": it lies in a free block (0x%" PRIx64
                   ", %zu bytes): not allocated, or already freed",
                   p->name, what, addr, b->addr, b->size);
        return NULL;
    }
    if (b->addr != addr) {
        rk_err_set(err, RK_EINVAL,
                   "%s: %s 0x%" PRIx64 ": it lies %" PRIu64
                   " bytes inside the block handed out at 0x%" PRIx64 ", not at its start",
                   p->name, what, addr, addr - b->addr, b->addr);
        return NULL;
    }
    return b;
}

int rk_pool_free(rk_pool *p, uint64_t addr, rk_err *err)
{
    blk *b = find_allocated(p, addr, "free of", err);
    if (!b)
        return RK_EINVAL;
    int kind = b->seg->kind;
    stat_add(p->st.allocation, kind, -1);
    stat_add(p->st.active, kind, -1);
    stat_add(p->st.allocated_bytes, kind, -(int64_t)b->size);
    stat_add(p->st.active_bytes, kind, -(int64_t)b->size);
    stat_add(p->st.requested_bytes, kind, -(int64_t)b->requested);
    b->allocated = false;
    b->requested = 0;
    blk *n = b->next;
    if (n && !n->allocated) { /* b absorbs its next neighbour: b's address stays */
        stat_inactive(p, n, -1);
        free_tree_remove(p, n);
        addr_tree_remove(p, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next)
            n->next->prev = b;
        spare_put(p, n);
    }
    blk *v = b->prev;
    if (v && !v->allocated) { /* its previous neighbour absorbs b */
        stat_inactive(p, v, -1);
        free_tree_remove(p, v);
        addr_tree_remove(p, b);
        v->size += b->size;
        v->next = b->next;
        if (b->next)
            b->next->prev = v;
        spare_put(p, b);
        b = v;
    }
    free_tree_insert(p, b);
    stat_inactive(p, b, 1);
    return RK_OK;
}

int rk_pool_block_size(const rk_pool *p, uint64_t addr, size_t *size, rk_err *err)
{
    const blk *b = find_allocated(p, addr, "size of", err);
    if (!b)
        return RK_EINVAL;
    *size = b->size;
    return RK_OK;
}

void rk_pool_stats_get(const rk_pool *p, rk_pool_stats *out)
{
    *out = p->st;
}

/* ---- the invariant checker ---------------------------------------------------------------- */

/* Check a subtree's order (keys strictly between lo and hi, exclusive when the bound is
 * given), heights and balance; count its nodes. Returns false when broken. */
static bool avl_valid(const avl *n, const avl *lo, const avl *hi, size_t *count, int *height)
{
    if (!n) {
        *height = 0;
        return true;
    }
    if (lo && avl_cmp(n->k1, n->k2, lo) <= 0)
        return false;
    if (hi && avl_cmp(n->k1, n->k2, hi) >= 0)
        return false;
    int hl, hr;
    if (!avl_valid(n->l, lo, n, count, &hl) || !avl_valid(n->r, n, hi, count, &hr))
        return false;
    if (hl - hr > 1 || hr - hl > 1 || n->h != 1 + (hl > hr ? hl : hr))
        return false;
    (*count)++;
    *height = n->h;
    return true;
}

/* Walk the address tree in order; the first block that starts before the end of the one
 * before it, or NULL. */
static const avl *overlap_walk(const avl *n, uint64_t *end, bool *first)
{
    if (!n)
        return NULL;
    const avl *bad = overlap_walk(n->l, end, first);
    if (bad)
        return bad;
    const blk *b = BLK_OF(n, by_addr);
    if (!*first && b->addr < *end)
        return n;
    *first = false;
    *end = b->addr + b->size; /* no wrap: seg_new refuses a range that reaches 2^64 */
    return overlap_walk(n->r, end, first);
}

/* Is node x (by its key) in the tree? */
static bool avl_has(const avl *n, const avl *x)
{
    while (n) {
        int c = avl_cmp(x->k1, x->k2, n);
        if (c == 0)
            return n == x;
        n = c < 0 ? n->l : n->r;
    }
    return false;
}

static int check_stat(const rk_pool *p, const char *name, const rk_pool_stat *arr,
                      const uint64_t want[RK_POOL_KINDS], rk_err *err)
{
    static const char *kinds[RK_POOL_KINDS] = {"all", "small", "large"};
    for (int k = 0; k < RK_POOL_KINDS; k++) {
        const rk_pool_stat *s = &arr[k];
        if (s->current != want[k])
            return rk_err_set(err, RK_EFORMAT,
                              "%s: %s[%s] is %" PRIu64 " but the segments hold %" PRIu64, p->name,
                              name, kinds[k], s->current, want[k]);
        if (s->peak < s->current || s->allocated - s->freed != s->current)
            return rk_err_set(err, RK_EFORMAT,
                              "%s: %s[%s]: current %" PRIu64 ", peak %" PRIu64
                              ", allocated %" PRIu64 ", freed %" PRIu64 " do not agree",
                              p->name, name, kinds[k], s->current, s->peak, s->allocated, s->freed);
    }
    return RK_OK;
}

int rk_pool_check(const rk_pool *p, rk_err *err)
{
    enum { N_SEG, N_ALLOC, N_SPLIT, B_ALLOC, B_RES, B_SPLIT, B_REQ, N_SUMS };
    uint64_t sum[N_SUMS][RK_POOL_KINDS];
    memset(sum, 0, sizeof sum);
    size_t blocks = 0, free_blocks[RK_POOL_KINDS] = {0};
    for (const seg *s = p->segs; s; s = s->next) {
        if (s->kind != RK_POOL_SMALL && s->kind != RK_POOL_LARGE)
            return rk_err_set(err, RK_EFORMAT, "%s: segment 0x%" PRIx64 " has no pool", p->name,
                              s->addr);
        if (s->next && s->next->prev != s)
            return rk_err_set(err, RK_EFORMAT, "%s: the segment list is broken at 0x%" PRIx64,
                              p->name, s->addr);
        if (!s->first || s->first->prev)
            return rk_err_set(err, RK_EFORMAT,
                              "%s: segment 0x%" PRIx64 " does not start with a first block",
                              p->name, s->addr);
        uint64_t at = s->addr;
        for (const blk *b = s->first; b; b = b->next) {
            if (b->seg != s || (b->next && b->next->prev != b))
                return rk_err_set(err, RK_EFORMAT,
                                  "%s: block 0x%" PRIx64 " is linked into the wrong place", p->name,
                                  b->addr);
            if (b->addr != at || b->size == 0 || b->size % RK_POOL_MIN_BLOCK != 0 ||
                b->size > s->size - (at - s->addr))
                return rk_err_set(err, RK_EFORMAT,
                                  "%s: block 0x%" PRIx64 " (%zu bytes) does not tile segment "
                                  "0x%" PRIx64 " (%zu bytes) at 0x%" PRIx64,
                                  p->name, b->addr, b->size, s->addr, s->size, at);
            if (!b->allocated && b->next && !b->next->allocated)
                return rk_err_set(err, RK_EFORMAT,
                                  "%s: free blocks 0x%" PRIx64 " and 0x%" PRIx64
                                  " are neighbours (not merged)",
                                  p->name, b->addr, b->next->addr);
            if (!avl_has(p->addr_tree, &b->by_addr) || b->by_addr.k1 != b->addr)
                return rk_err_set(err, RK_EFORMAT,
                                  "%s: block 0x%" PRIx64 " is missing from the address tree",
                                  p->name, b->addr);
            if (b->allocated) {
                if (b->requested == 0 || rk_pool_round_size(b->requested) > b->size)
                    return rk_err_set(err, RK_EFORMAT,
                                      "%s: block 0x%" PRIx64 " (%zu bytes) was asked for %zu",
                                      p->name, b->addr, b->size, b->requested);
            } else if (!avl_has(p->free_tree[s->kind], &b->by_size) || b->by_size.k1 != b->size ||
                       b->by_size.k2 != b->addr) {
                return rk_err_set(err, RK_EFORMAT,
                                  "%s: free block 0x%" PRIx64 " is missing from its size tree",
                                  p->name, b->addr);
            }
            int ks[2] = {RK_POOL_ALL, s->kind};
            for (int i = 0; i < 2; i++) {
                int k = ks[i];
                if (b->allocated) {
                    sum[N_ALLOC][k]++;
                    sum[B_ALLOC][k] += b->size;
                    sum[B_REQ][k] += b->requested;
                } else if (is_split(b)) {
                    sum[N_SPLIT][k]++;
                    sum[B_SPLIT][k] += b->size;
                }
            }
            blocks++;
            if (!b->allocated)
                free_blocks[s->kind]++;
            at += b->size;
        }
        if (at != s->addr + s->size)
            return rk_err_set(err, RK_EFORMAT,
                              "%s: the blocks of segment 0x%" PRIx64 " cover %" PRIu64
                              " of its %zu bytes",
                              p->name, s->addr, at - s->addr, s->size);
        int ks[2] = {RK_POOL_ALL, s->kind};
        for (int i = 0; i < 2; i++) {
            sum[N_SEG][ks[i]]++;
            sum[B_RES][ks[i]] += s->size;
        }
    }
    /* the trees hold exactly those blocks, ordered and balanced */
    size_t n = 0;
    int h;
    if (!avl_valid(p->addr_tree, NULL, NULL, &n, &h) || n != blocks)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: the address tree is out of order, unbalanced or holds %zu nodes "
                          "for %zu blocks",
                          p->name, n, blocks);
    for (int k = RK_POOL_SMALL; k <= RK_POOL_LARGE; k++) {
        n = 0;
        if (!avl_valid(p->free_tree[k], NULL, NULL, &n, &h) || n != free_blocks[k])
            return rk_err_set(err, RK_EFORMAT,
                              "%s: a size tree is out of order, unbalanced or holds %zu nodes "
                              "for %zu free blocks",
                              p->name, n, free_blocks[k]);
    }
    if (p->free_tree[RK_POOL_ALL])
        return rk_err_set(err, RK_EFORMAT, "%s: a free block is in no pool", p->name);
    /* blocks (hence segments) do not overlap: the address tree's in-order walk */
    uint64_t end = 0;
    bool first = true;
    const avl *bad = overlap_walk(p->addr_tree, &end, &first);
    if (bad)
        return rk_err_set(err, RK_EFORMAT, "%s: block 0x%" PRIx64 " overlaps the one before",
                          p->name, bad->k1);
    const rk_pool_stats *st = &p->st;
    int rc;
    if ((rc = check_stat(p, "segment", st->segment, sum[N_SEG], err)) ||
        (rc = check_stat(p, "reserved_bytes", st->reserved_bytes, sum[B_RES], err)) ||
        (rc = check_stat(p, "allocation", st->allocation, sum[N_ALLOC], err)) ||
        (rc = check_stat(p, "active", st->active, sum[N_ALLOC], err)) ||
        (rc = check_stat(p, "allocated_bytes", st->allocated_bytes, sum[B_ALLOC], err)) ||
        (rc = check_stat(p, "active_bytes", st->active_bytes, sum[B_ALLOC], err)) ||
        (rc = check_stat(p, "requested_bytes", st->requested_bytes, sum[B_REQ], err)) ||
        (rc = check_stat(p, "inactive_split", st->inactive_split, sum[N_SPLIT], err)) ||
        (rc = check_stat(p, "inactive_split_bytes", st->inactive_split_bytes, sum[B_SPLIT], err)))
        return rc;
    if (st->num_device_alloc - st->num_device_free != st->segment[RK_POOL_ALL].current)
        return rk_err_set(
            err, RK_EFORMAT,
            "%s: %" PRIu64 " device allocs and %" PRIu64 " frees for %" PRIu64 " segments", p->name,
            st->num_device_alloc, st->num_device_free, st->segment[RK_POOL_ALL].current);
    if (p->limit && st->reserved_bytes[RK_POOL_ALL].current > p->limit)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: %" PRIu64 " bytes reserved past the limit of %" PRIu64, p->name,
                          st->reserved_bytes[RK_POOL_ALL].current, p->limit);
    return RK_OK;
}
