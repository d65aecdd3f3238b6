/* libFuzzer target for the loss scaler's checkpoint blob (rk_loss_scaler_unpack): arbitrary
 * bytes must unpack or be rejected with RK_EFORMAT and a message, leaving the struct as it
 * was; an accepted state must pack back to the same bytes and keep the scaler's invariants
 * through updates (scale within [min, max], counters in range). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/amp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_loss_scaler s, before;
    if (rk_loss_scaler_init(&s, NULL, NULL) != RK_OK)
        abort();
    before = s;
    rk_err err = {0};
    int rc = rk_loss_scaler_unpack(&s, data, size, &err);
    if (rc != RK_OK) {
        if (rc != RK_EFORMAT || !err.msg[0] || memcmp(&s, &before, sizeof s) != 0)
            abort();
        return 0;
    }
    uint8_t out[RK_LOSS_SCALER_BYTES];
    if (rk_loss_scaler_pack(&s, out) != RK_OK || size != sizeof out || memcmp(out, data, size))
        abort();
    for (int i = 0; i < 64; i++) {
        rk_loss_scaler_update(&s, (data[i % size] >> (i % 8)) & 1);
        if (!(s.scale >= s.min_scale && s.scale <= s.max_scale) || s.good_steps < 0 ||
            s.good_steps >= s.growth_interval || s.hysteresis_left < 1 ||
            s.hysteresis_left > s.hysteresis)
            abort();
    }
    return 0;
}
