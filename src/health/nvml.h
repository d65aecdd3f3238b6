/*
 * The NVML backend's own interface (src/health/nvml.c): the session behind the "nvml"
 * telemetry backend, plus the getters and setters `rk tune` uses (docs/tune.md). NVML is
 * loaded with dlopen from libnvidia-ml.so.1, or from $RK_NVML_LIB when set (tests point it at a
 * fake library) and the process is not privileged (set-user-ID: base/env.h ignores it).
 * Internal to rekindle: the public face of this backend is rk_telemetry_nvml.
 *
 * Errors: RK_ENOTSUP when NVML or the operation is not there (no driver, an old card, an old
 * driver), RK_EIO when NVML refuses or fails (the message carries NVML's own error string, with
 * "needs root" when it was a permission), RK_EINVAL for a bad index or value.
 */
#ifndef RK_HEALTH_NVML_H
#define RK_HEALTH_NVML_H

#include <stdbool.h>

#include "rekindle/health.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The environment variable that overrides the library path (default libnvidia-ml.so.1). */
#define RK_NVML_LIB_ENV "RK_NVML_LIB"
#define RK_NVML_LIB_DEFAULT "libnvidia-ml.so.1"

typedef struct rk_nvml rk_nvml;

/* Load NVML, initialise it, enumerate the GPUs and register for their Xid events.
 * RK_ENOTSUP with "NVML not available: libnvidia-ml.so.1: <why>" when the library does not
 * load, is not NVML, finds no driver (nvmlInit: "Driver Not Loaded") or sees no GPU; RK_EIO
 * when NVML fails otherwise. */
int rk_nvml_open(rk_nvml **out, rk_err *err);
void rk_nvml_close(rk_nvml *n);
int rk_nvml_count(const rk_nvml *n);
/* Name, UUID, serial and PCI bus id, read when opened. RK_EINVAL if i is out of range. */
int rk_nvml_info(const rk_nvml *n, int i, rk_gpu_info *out);
/* One sample of GPU i (rekindle/health.h): every field NVML can give; what the card cannot
 * report stays invalid; a lost GPU gives out->lost and RK_OK. Xid events that arrived since
 * the last read are counted into the GPU's running xid_count. */
int rk_nvml_read(rk_nvml *n, int i, rk_gpu_sample *out, rk_err *err);

/* What rk tune shows before it changes anything. Each value has its valid flag. */
typedef struct rk_nvml_settings {
    bool sm_valid;
    unsigned sm_mhz; /* current SM clock */
    bool sm_max_valid;
    unsigned sm_max_mhz; /* the most the card boosts to */
    bool power_valid;
    unsigned power_limit_mw; /* the power limit set now */
    bool power_range_valid;
    unsigned power_min_mw, power_max_mw; /* what may be set */
    bool power_default_valid;
    unsigned power_default_mw;
    bool persistence_valid;
    bool persistence_on;
    bool offset_valid;
    int offset_mhz; /* the graphics clock's offset on its clock/voltage curve now */
    bool offset_range_valid;
    int offset_min_mhz, offset_max_mhz; /* what may be set */
} rk_nvml_settings;

/* Current settings of GPU i (fields the card cannot report stay invalid). RK_EIO when the GPU
 * is lost. */
int rk_nvml_settings_get(rk_nvml *n, int i, rk_nvml_settings *out, rk_err *err);
/* Lock the SM (graphics) clock at mhz (nvmlDeviceSetGpuLockedClocks with min = max = mhz;
 * NVML documents it for Volta and newer). RK_EINVAL when mhz is 0 or above the card's maximum. */
int rk_nvml_clocks_lock(rk_nvml *n, int i, unsigned mhz, rk_err *err);
/* Undo a lock (nvmlDeviceResetGpuLockedClocks). */
int rk_nvml_clocks_reset(rk_nvml *n, int i, rk_err *err);
/* Set the power limit in milliwatts; RK_EINVAL outside the card's constraints. */
int rk_nvml_power_limit_set(rk_nvml *n, int i, unsigned mw, rk_err *err);
/* Shift the graphics clock's clock/voltage curve by mhz (negative: lower clocks at each
 * voltage; nvmlDeviceSetGpcClkVfOffset), where the driver offers it. RK_EINVAL outside the
 * range the driver reports. */
int rk_nvml_clock_offset_set(rk_nvml *n, int i, int mhz, rk_err *err);
/* Persistence mode on or off (the driver stays loaded with no client, so settings stay). */
int rk_nvml_persistence_set(rk_nvml *n, int i, bool on, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
