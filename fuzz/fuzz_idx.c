/*
 * libFuzzer target for the IDX parser (src/nn/idx.c, rk_idx_parse on bytes in memory).
 * Besides crashes, leaks and undefined behaviour, it checks the parser's promises: success
 * means the dims multiply to nbytes and the data is the rest of the input; failure means a
 * zeroed output and a one-line message that names the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nn/idx.h"

#define NAME "fuzz-input"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_idx x;
    rk_err err;
    rk_err_clear(&err);
    int rc = rk_idx_parse(data, size, NAME, &x, &err);
    if (rc == RK_OK) {
        size_t n = 1;
        if (x.ndim < 1 || x.ndim > RK_IDX_MAX_DIMS || x.dtype != RK_IDX_UBYTE || !x.data)
            abort();
        for (int i = 0; i < x.ndim; i++)
            n *= x.dims[i];
        size_t hdr = 4 + 4 * (size_t)x.ndim;
        if (n != x.nbytes || hdr + n != size || memcmp(x.data, data + hdr, n) != 0)
            abort();
        rk_idx_free(&x);
        if (x.data || x.nbytes)
            abort();
    } else {
        if (rc != err.code || (rc != RK_EFORMAT && rc != RK_ENOMEM))
            abort();
        if (x.data || x.nbytes || x.ndim || !strstr(err.msg, NAME) || strchr(err.msg, '\n'))
            abort();
    }
    return 0;
}
