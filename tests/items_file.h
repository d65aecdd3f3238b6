/* A test helper (include it after cmocka.h): checkpoint items written as a safetensors file
 * and parsed back, the way a state reader (rk_batch_load, rk_loss_scaler_load) meets them in
 * a loaded checkpoint. */
#ifndef RK_TEST_ITEMS_FILE_H
#define RK_TEST_ITEMS_FILE_H

#include <stdlib.h>

#include "rekindle/ckpt.h"
#include "rekindle/safetensors.h"

/* items[0..n) as a parsed file *f (rk_st_free it); `skip` (or -1) leaves item `skip` out,
 * `extra` (or NULL) is added at the end. Fails the test if encoding or parsing fails. */
static inline void items_file(const rk_ckpt_item *items, int n, int skip, const rk_st_entry *extra,
                              rk_st_file *f)
{
    rk_st_entry e[32];
    size_t k = 0;
    for (int i = 0; i < n && k < 31; i++)
        if (i != skip)
            e[k++] = (rk_st_entry){.name = items[i].name,
                                   .data = items[i].data,
                                   .ndim = items[i].ndim,
                                   .shape = items[i].shape,
                                   .dtype = items[i].dtype};
    if (extra)
        e[k++] = *extra;
    uint8_t *buf;
    size_t len;
    rk_err err;
    if (rk_st_encode(e, k, NULL, &buf, &len, &err) != RK_OK)
        fail_msg("encode: %s", err.msg);
    if (rk_st_parse(buf, len, "ck.safetensors", f, &err) != RK_OK)
        fail_msg("parse: %s", err.msg);
    free(buf);
}

#endif
