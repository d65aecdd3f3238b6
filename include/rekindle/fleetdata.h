/*
 * Training data for the failure predictor from the simulated fleet (issue 7, docs/predict.md):
 * per-minute histories of every simulated GPU's signals, with the ground-truth failure the
 * simulator logged, split into training, validation and test sets by device (never by time
 * inside a device). Everything it writes says simulated.
 *
 * A dataset directory holds:
 *
 *   fleet.json              the manifest: seed, fleet size, hours, start age, step (60 s), the
 *                           feature names, and per GPU its index, uuid, profile, split,
 *                           number of steps, and failure (minute and event, or null)
 *   gpu-NNNN.safetensors    one per GPU: "x" F32 [steps, F] (0 where absent) and "valid" U8
 *                           [steps, F] (1 where the card reported the field); metadata
 *                           format "rekindle-fleet-history", version, simulated, uuid,
 *                           profile, step_s, failure_minute (-1: none), failure_event
 *   events.jsonl            the simulator's ground-truth log, each GPU's lines in time order
 *                           (docs/sim.md: off_bus, thermal_shutdown, dbe, sdc_start, sdc_end)
 *
 * Step m (0-based) is the reading at simulated minute m + 1 after the fleet opened. A GPU's
 * history ends at its last reading before it was lost (off the bus, thermal shutdown) or at
 * the end. Its failure is the first off_bus, thermal_shutdown or dbe event: `minute` is the
 * step at whose reading the event had happened (an event at simulated second t falls in
 * minute ceil(t / 60) - 1 in step terms). A dbe leaves the GPU running, so its history goes
 * on after the failure.
 *
 * Features, one row a minute (RK_FLEET_FEATURES): temp (C), fan (%), power (W), sm_clock
 * (MHz), util (%), throttle (1 when a thermal or hardware slowdown reason is active),
 * ecc_corrected, ecc_uncorrected, pcie_replay and xid (increments since the previous minute),
 * vrm_ripple (mV), fan_vibration (Hz). Each GPU is simulated alone in a fleet of the same seed
 * and size, which gives it exactly the samples it has in the whole fleet (tests/
 * test_fleetdata.c checks it), one GPU in memory at a time.
 */
#ifndef REKINDLE_FLEETDATA_H
#define REKINDLE_FLEETDATA_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_FLEET_FEATURES 12

/* The feature names, in column order ("temp", "fan", ...). */
extern const char *const rk_fleet_feature_names[RK_FLEET_FEATURES];

typedef struct rk_fleet_data_opts {
    const char *dir;    /* created if absent; existing dataset files in it are replaced */
    int gpus;           /* fleet size, 1..1024 */
    double hours;       /* simulated hours per GPU, > 0 and at most 100,000 */
    uint64_t seed;      /* the fleet (as rk doctor --sim --seed) and the split */
    double start_age_h; /* hours of service before the first minute (default 20,000: worn
                           cards, so that failures happen within months) */
    double val_frac, test_frac; /* shares of the devices (defaults 0.2 and 0.2), drawn
                                   separately among GPUs that fail and those that do not */
    /* Called after each GPU (NULL: not called). */
    void (*progress)(int gpu, int gpus, void *ctx);
    void *ctx;
} rk_fleet_data_opts;

void rk_fleet_data_opts_default(rk_fleet_data_opts *o);

struct rk_gpu_sample;
/* One minute's feature row (x[RK_FLEET_FEATURES], 0 where absent, and valid[...]) from a
 * reading and the previous minute's (NULL for the first: counters then give 0): what the
 * dataset stores and what live readings must be turned into for the model
 * (rekindle/predict_online.h). */
void rk_fleet_features(const struct rk_gpu_sample *s, const struct rk_gpu_sample *prev,
                       float *x, uint8_t *valid);

typedef struct rk_fleet_data_report {
    int gpus;
    int failed[3];  /* GPUs with a failure, in train, val, test */
    int devices[3]; /* GPUs in train, val, test */
    int lost;       /* GPUs whose history ends early (off the bus, thermal shutdown) */
    size_t steps;   /* minutes of history written, all GPUs */
    double seconds;
} rk_fleet_data_report;

/* Simulate and write the dataset. RK_EINVAL for bad options; RK_EIO naming the path for a
 * directory or file that cannot be written; errors of the simulator as it reports them. */
int rk_fleet_data_write(const rk_fleet_data_opts *o, rk_fleet_data_report *r, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
