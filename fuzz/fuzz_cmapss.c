/*
 * libFuzzer target for the C-MAPSS reader (rk_cmapss_parse, rk_cmapss_parse_rul,
 * rk_cmapss_impute). Any input must be rejected cleanly or give a table whose engines are
 * contiguous blocks with cycles 1, 2, 3, ...; imputation must then leave no NaN or fail
 * naming the engine; the RUL reader must fill exactly its count or fail.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "predict/cmapss.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_cmapss_table t;
    rk_err err = {0};
    if (rk_cmapss_parse((const char *)data, size, "fuzz", &t, &err) == RK_OK) {
        check(t.rows > 0 && t.engines > 0 && t.first[0] == 0 && t.first[t.engines] == t.rows);
        for (int e = 0; e < t.engines; e++) {
            check(t.first[e] < t.first[e + 1]);
            for (size_t r = t.first[e]; r < t.first[e + 1]; r++) {
                check(t.unit[r] == t.unit[t.first[e]]);
                check(t.cycle[r] == (int)(r - t.first[e]) + 1);
            }
        }
        size_t nan = 0;
        for (size_t i = 0; i < t.rows * RK_CMAPSS_VALUES; i++)
            nan += isnan(t.v[i]) != 0;
        check(nan == t.missing);
        if (rk_cmapss_impute(&t, "fuzz", &err) == RK_OK)
            for (size_t i = 0; i < t.rows * RK_CMAPSS_VALUES; i++)
                check(isfinite(t.v[i]));
        rk_cmapss_free(&t);
    }
    float rul[8];
    rk_cmapss_parse_rul((const char *)data, size, "fuzz", 8, rul, &err);
    return 0;
}
