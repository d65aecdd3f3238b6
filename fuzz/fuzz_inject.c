/* libFuzzer target for the fault-injection spec parser (rk_inject_parse): arbitrary bytes (up
 * to the first NUL) must parse or be rejected with RK_EINVAL and a one-line positioned
 * message; a parsed list must format into RK_INJECT_SPEC_MAX + 1 bytes, no longer than the
 * input, parse back to the same list and format to the same text again; arming and asking
 * for due faults must only return valid indices in increasing order. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/inject.h"

static void same_lists(const rk_inject *a, const rk_inject *b)
{
    if (rk_inject_count(a) != rk_inject_count(b))
        abort();
    for (size_t i = 0; i < rk_inject_count(a); i++) {
        const rk_fault *x = rk_inject_get(a, i), *y = rk_inject_get(b, i);
        if (x->kind != y->kind || x->step != y->step || x->rank != y->rank ||
            x->mtbf_s != y->mtbf_s || x->seed != y->seed || x->ms != y->ms || x->steps != y->steps)
            abort();
    }
}

static void exercise_runtime(rk_inject *inj, int rank)
{
    if (rk_inject_arm(inj, rank, 1, NULL, NULL) != RK_OK)
        abort();
    size_t n = rk_inject_count(inj), idx[8];
    for (size_t i = 0; i < n; i++) {
        const rk_fault *f = rk_inject_get(inj, i);
        size_t got = rk_inject_due(inj, f->step, 1e3, idx, 8);
        for (size_t k = 0; k < got; k++)
            if (idx[k] >= n || (k > 0 && idx[k] <= idx[k - 1]))
                abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *spec = malloc(size + 1);
    if (!spec)
        return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    rk_inject *a = NULL;
    rk_err err = {0};
    int rc = rk_inject_parse(spec, &a, &err);
    if (rc != RK_OK) {
        if ((rc != RK_EINVAL && rc != RK_ENOMEM) || a || strchr(err.msg, '\n'))
            abort();
        if (rc == RK_EINVAL && strncmp(err.msg, "fault spec: position ", 21) != 0)
            abort();
        free(spec);
        return 0;
    }
    static char text[RK_INJECT_SPEC_MAX + 1], again[RK_INJECT_SPEC_MAX + 1];
    if (rk_inject_format(a, text, sizeof text) != RK_OK || strlen(text) > strlen(spec))
        abort();
    rk_inject *b = NULL;
    if (rk_inject_parse(text, &b, &err) != RK_OK)
        abort();
    same_lists(a, b);
    if (rk_inject_format(b, again, sizeof again) != RK_OK || strcmp(text, again) != 0)
        abort();
    exercise_runtime(a, size > 0 ? data[0] % 4 : 0);
    rk_inject_free(a);
    rk_inject_free(b);
    free(spec);
    return 0;
}
