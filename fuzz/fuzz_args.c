/*
 * libFuzzer target for rk's command-line value parser (cli/args.h): any bytes, as one value,
 * through every kind. Whatever is accepted is canonical (a whole number prints back as the
 * same text), finite and in range; nothing is read past the string's end. Paths are not
 * fuzzed (they touch the file system).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    char back[32];
    int64_t i;
    if (rk_args_int(s, INT64_MIN, INT64_MAX, &i)) {
        snprintf(back, sizeof back, "%lld", (long long)i);
        if (strcmp(back, s) != 0)
            abort();
    }
    if (rk_args_int(s, -5, 5, &i) && (i < -5 || i > 5))
        abort();
    uint64_t u;
    if (rk_args_u64(s, &u)) {
        snprintf(back, sizeof back, "%llu", (unsigned long long)u);
        if (strcmp(back, s) != 0)
            abort();
    }
    double v;
    if (rk_args_real(s, -HUGE_VAL, HUGE_VAL, &v) && !isfinite(v))
        abort();
    if (rk_args_real(s, 0, 1, &v) && !(v >= 0 && v <= 1))
        abort();
    if (rk_args_seconds(s, 0.1, 86400, &v) && !(v >= 0.1 && v <= 86400))
        abort();
    rk_args a = {.cmd = "fuzz", .usage = "", .quiet = 1};
    int n;
    unsigned mhz;
    rk_arg_count(&a, "--n", s, 1, 10, &n);
    rk_arg_seed(&a, "--seed", s, &u);
    rk_arg_mhz(&a, "--mhz", s, &mhz);
    rk_arg_watts(&a, "--w", s, &v);
    if (strlen(a.msg) >= sizeof a.msg || strchr(a.msg, '\n'))
        abort();
    free(s);
    return 0;
}
