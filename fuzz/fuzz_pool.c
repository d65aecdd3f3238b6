/*
 * libFuzzer target for the device memory pool (gpu/pool.h): the input is a script of
 * operations on a pool over a fake device (an address cursor with a capacity the script's
 * first byte sets), and after every operation rk_pool_check must hold. Script: byte 0 sets
 * the capacity ((1 + b) * 4 MiB); then 4-byte ops [op, a, b, c]:
 *   op % 8 in 0..3  alloc 1 + ((a << 8 | b) << (c % 25)) / 256 bytes (1 byte to 4 GiB) into
 *                   the first empty slot of 64 (a full table skips the op)
 *   4, 5            free slot a % 64; an empty slot frees a stray address instead (one that
 *                   no live block starts at), which must be refused with RK_EINVAL and change
 *                   nothing
 *   6               release the cached segments (empty_cache)
 *   7               the device's next alloc fails with RK_EBACKEND (not an out-of-memory)
 * Checked as well: a live block is at least what was asked, the device never holds more than
 * its capacity, an out-of-memory counts in num_ooms, and after destroy the device holds
 * nothing. Ops past the 128th are ignored.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "gpu/pool.h"

#define SLOTS 64
#define OPS_MAX 128

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

typedef struct dev {
    uint64_t cursor;
    size_t used, capacity;
    long live;
    bool fail_next;
} dev;

static int dev_alloc(void *ctx, size_t bytes, uint64_t *addr, rk_err *err)
{
    dev *d = ctx;
    if (d->fail_next) {
        d->fail_next = false;
        return rk_err_set(err, RK_EBACKEND, "fuzz device: told to fail");
    }
    if (bytes > d->capacity - d->used)
        return rk_err_set(err, RK_ENOMEM, "fuzz device: out of memory");
    *addr = d->cursor;
    d->cursor += bytes + 4096; /* never reused: a stale address is foreign for good */
    d->used += bytes;
    d->live++;
    return RK_OK;
}

static void dev_free(void *ctx, uint64_t addr, size_t bytes)
{
    dev *d = ctx;
    check(addr >= 0x10000 && addr < d->cursor && bytes <= d->used && d->live > 0);
    d->used -= bytes;
    d->live--;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    dev d = {.cursor = 0x10000, .capacity = ((size_t)data[0] + 1) << 22};
    rk_pool_backend be = {&d, dev_alloc, dev_free};
    rk_pool *p;
    rk_err err = {0};
    check(rk_pool_create(&p, &be, NULL, &err) == RK_OK);
    uint64_t addr[SLOTS];
    size_t asked[SLOTS] = {0};
    uint64_t ooms = 0;
    /* at most OPS_MAX operations: longer scripts find nothing more, only run slower */
    for (size_t i = 1; i + 4 <= size && i < 1 + 4 * OPS_MAX; i += 4) {
        uint8_t op = data[i] % 8, a = data[i + 1], b = data[i + 2], c = data[i + 3];
        if (op <= 3) {
            size_t want = 1 + ((((size_t)a << 8) | b) << (c % 25)) / 256;
            int s = 0;
            while (s < SLOTS && asked[s])
                s++;
            if (s == SLOTS)
                continue;
            int rc = rk_pool_alloc(p, want, &addr[s], &err);
            if (rc == RK_OK) {
                size_t got;
                check(rk_pool_block_size(p, addr[s], &got, &err) == RK_OK && got >= want);
                asked[s] = want;
            } else {
                check(rc == RK_ENOMEM || rc == RK_EBACKEND);
                check(err.code == rc && err.msg[0]);
                ooms += rc == RK_ENOMEM;
            }
        } else if (op <= 5) {
            int s = a % SLOTS;
            if (asked[s]) {
                check(rk_pool_free(p, addr[s], &err) == RK_OK);
                asked[s] = 0;
            } else {
                rk_pool_stats before, after;
                rk_pool_stats_get(p, &before);
                uint64_t stray = 0x10000 + ((((uint64_t)b << 8) | c) << (a % 17));
                bool live = false;
                for (int k = 0; k < SLOTS; k++)
                    live = live || (asked[k] && addr[k] == stray);
                if (live)
                    continue;
                check(rk_pool_free(p, stray, &err) == RK_EINVAL);
                rk_pool_stats_get(p, &after);
                check(memcmp(&before, &after, sizeof before) == 0);
            }
        } else if (op == 6) {
            rk_pool_release_cached(p);
        } else {
            d.fail_next = true;
        }
        if (rk_pool_check(p, &err) != RK_OK)
            __builtin_trap();
        check(d.used <= d.capacity);
        rk_pool_stats st;
        rk_pool_stats_get(p, &st);
        check(st.num_ooms == ooms);
        check(st.reserved_bytes[RK_POOL_ALL].current == d.used);
    }
    rk_pool_destroy(p);
    check(d.used == 0 && d.live == 0);
    return 0;
}
