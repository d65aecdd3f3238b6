/*
 * libFuzzer target for loading predictor models (rk_pred_decode): any input must be rejected
 * cleanly or give a model that predicts a window without reading outside its tensors.
 */
#include <stdint.h>
#include <stdlib.h>

#include "predict/predict.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_pred_model *m;
    rk_err err = {0};
    if (rk_pred_decode(data, size, "fuzz", &m, &err) != RK_OK)
        return 0;
    const rk_pred_config *c = rk_pred_config_of(m);
    size_t n = (size_t)c->window * (size_t)c->features;
    if (n <= 65536 && rk_pred_num_params(m) <= (1u << 20)) {
        float *x = calloc(n, sizeof *x), out;
        if (x)
            rk_pred_predict(m, x, 1, &out, &err);
        free(x);
    }
    rk_pred_free(m);
    return 0;
}
