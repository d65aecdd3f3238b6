/*
 * libFuzzer target for the checkpoint reader (rk_ckpt_parse). Any input must be rejected with
 * a one-line message naming the file, or verify completely: then every tensor's checksum is
 * recomputed here, the checkpoint meets an expectation built from itself, and re-encoding it
 * with rk_ckpt_encode gives a checkpoint that parses back to the same meta and tensors.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "rekindle/ckpt.h"

#define NAME "fuzz/ckpt-000000000007.safetensors"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void same(const rk_ckpt *a, const rk_ckpt *b)
{
    const rk_ckpt_meta *ma = rk_ckpt_meta_of(a), *mb = rk_ckpt_meta_of(b);
    check(ma->step == mb->step && ma->epoch == mb->epoch && ma->cursor == mb->cursor);
    check(ma->world_size == mb->world_size && strcmp(ma->config_json, mb->config_json) == 0);
    const rk_st_file *fa = rk_ckpt_file(a), *fb = rk_ckpt_file(b);
    check(fa->ntensors == fb->ntensors);
    for (size_t i = 0; i < fa->ntensors; i++) {
        const rk_st_tensor *x = &fa->tensors[i], *y = &fb->tensors[i];
        check(strcmp(x->name, y->name) == 0 && strcmp(x->dtype, y->dtype) == 0);
        check(x->ndim == y->ndim && x->nbytes == y->nbytes);
        check(memcmp(x->shape, y->shape, sizeof x->shape[0] * (size_t)x->ndim) == 0);
        check(x->nbytes == 0 || memcmp(x->data, y->data, x->nbytes) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_ckpt *c = NULL;
    rk_err err;
    int rc = rk_ckpt_parse(data, size, NAME, &c, &err);
    if (rc < 0) {
        check(rc == RK_EFORMAT || rc == RK_ENOMEM);
        check(c == NULL);
        check(strchr(err.msg, '\n') == NULL);
        check(strstr(err.msg, NAME) != NULL);
        return 0;
    }
    check(rk_ckpt_parse(data, size, NAME, NULL, &err) == RK_OK); /* verify-only agrees */
    const rk_ckpt_meta *m = rk_ckpt_meta_of(c);
    const rk_st_file *f = rk_ckpt_file(c);
    check(m->step == 7 && m->epoch >= 0 && m->cursor >= 0 && m->world_size >= 1);
    check(strcmp(rk_st_meta(f, "format"), RK_CKPT_FORMAT) == 0);

    rk_ckpt_item *items = calloc(f->ntensors ? f->ntensors : 1, sizeof *items);
    check(items != NULL);
    for (size_t i = 0; i < f->ntensors; i++) {
        const rk_st_tensor *t = &f->tensors[i];
        char key[4096], want[17];
        if (snprintf(key, sizeof key, "xxh64.%s", t->name) < (int)sizeof key) {
            snprintf(want, sizeof want, "%016" PRIx64,
                     XXH64(t->nbytes ? (const void *)t->data : "", t->nbytes, 0));
            check(strcmp(rk_st_meta(f, key), want) == 0);
        }
        check(rk_ckpt_find(c, t->name) == t);
        items[i] = (rk_ckpt_item){t->name, t->dtype, t->ndim, t->shape, t->data};
    }
    rk_ckpt_expect self = {"{}", items, f->ntensors};
    check(rk_ckpt_check(c, &self, &err) == RK_OK);

    uint8_t *buf;
    size_t len;
    rk_ckpt_meta meta = *m;
    check(rk_ckpt_encode(&meta, items, f->ntensors, &buf, &len, &err) == RK_OK);
    rk_ckpt *d = NULL;
    check(rk_ckpt_parse(buf, len, NAME, &d, &err) == RK_OK);
    same(c, d);
    rk_ckpt_free(d);
    free(buf);
    free(items);
    rk_ckpt_free(c);
    return 0;
}
