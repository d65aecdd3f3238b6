/* libFuzzer target for the batch policy state reader (rk_batch_state_load): arbitrary bytes
 * must load cleanly or be rejected with RK_EFORMAT; a loaded state must give shares summing to
 * the global batch, and saving it must reproduce the input bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/batch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_batch_policy *p = NULL;
    rk_err err = {0};
    int rc = rk_batch_state_load(&p, data, size, &err);
    if (rc != RK_OK) {
        if (rc != RK_EFORMAT && rc != RK_ENOMEM)
            abort();
        if (p || strchr(err.msg, '\n'))
            abort();
        return 0;
    }
    int n = rk_batch_policy_nranks(p);
    if (n <= 4096) { /* keep each input cheap */
        int64_t *shares = malloc((size_t)n * sizeof *shares);
        if (shares && rk_batch_shares(p, shares, &err) == RK_OK) {
            int64_t sum = 0;
            for (int i = 0; i < n; i++) {
                if (shares[i] < 1)
                    abort();
                sum += shares[i];
            }
            if (sum != rk_batch_policy_global_batch(p))
                abort();
        }
        free(shares);
    }
    uint8_t *blob = NULL;
    size_t len = 0;
    if (rk_batch_state_save(p, &blob, &len, &err) == RK_OK &&
        (len != size || memcmp(blob, data, size) != 0))
        abort();
    free(blob);
    rk_batch_policy_free(p);
    return 0;
}
