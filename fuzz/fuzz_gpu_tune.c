/*
 * libFuzzer target for rk burn's autotune cache parser (rk_burn_tune_parse): arbitrary bytes
 * never crash; a rejected file is RK_EFORMAT with a message naming the file; an accepted one
 * names an existing SGEMM variant and a finite rate >= 0.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gpu/burn.h"
#include "gpu/ref.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int v = -7;
    double g = -7;
    rk_err err = {0};
    int rc = rk_burn_tune_parse("fuzz.tune", (const char *)data, size, &v, &g, &err);
    if (rc == RK_OK) {
        check(v >= 0 && v < rk_sgemm_variant_count);
        check(isfinite(g) && g >= 0);
    } else {
        check(rc == RK_EFORMAT);
        check(strncmp(err.msg, "fuzz.tune", 9) == 0);
        check(v == -7 && g == -7);
    }
    return 0;
}
