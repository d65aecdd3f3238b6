/*
 * libFuzzer target for the detectors file rk predict train writes beside a model (MODEL.json,
 * rk_fleet_detectors_parse): any input is rejected with an error or gives a window and
 * horizon in range and a baseline whose probability is a number in [0, 1].
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "predict/detectors.h"
#include "predict/windows.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_fleet_detectors d;
    rk_err err = {0};
    if (rk_fleet_detectors_parse(&d, (const char *)data, size, "fuzz", &err) != RK_OK) {
        if (!err.msg[0])
            abort();
        return 0;
    }
    if (d.window < 1 || d.window > RK_PRED_MAX_WINDOW || d.horizon < 1 || d.horizon > 1440 ||
        d.lr.d != RK_FLEET_SUMMARY)
        abort();
    float x[RK_FLEET_SUMMARY] = {0};
    double p = rk_logreg_prob(&d.lr, x);
    if (isnan(p) || p < 0 || p > 1)
        abort();
    rk_fleet_detectors_free(&d);
    return 0;
}
