/* Backend dispatch: the one place that maps a device to its op table (see backend.h). */
#include "nn/backend.h"

#include <stddef.h>

const char *rk_device_name(rk_device d)
{
    switch (d) {
    case RK_DEVICE_CPU: return "cpu";
    case RK_DEVICE_CUDA: return "cuda";
    }
    return "unknown";
}

const rk_backend *rk_backend_get(rk_device device, rk_err *err)
{
    switch (device) {
    case RK_DEVICE_CPU: return &rk_backend_cpu;
    case RK_DEVICE_CUDA: break;
    }
    rk_err_set(err, RK_ENOTSUP, "device %s: no backend in this build", rk_device_name(device));
    return NULL;
}
