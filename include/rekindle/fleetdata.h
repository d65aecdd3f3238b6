/*
 * Training data for the failure predictor from the simulated fleet (issue 7, docs/predict.md):
 * per-minute histories of every simulated GPU's signals, with the ground-truth failure the
 * simulator logged, split into training, validation and test sets by device (never by time
 * inside a device). Everything it writes says simulated.
 *
 * A dataset directory holds:
 *
 *   fleet.json              the manifest: seed, fleet size, hours, start age, span, step
 *                           (60 s), the feature names, and per GPU its index, uuid, profile,
 *                           split, start_minute, number of steps, and failure (minute, event
 *                           and precursor_minute, or null)
 *   gpu-NNNN.safetensors    one per GPU: "x" F32 [steps, F] (0 where absent), "valid" U8
 *                           [steps, F] (1 where the card reported the field) and "score" F32
 *                           [steps]; metadata format "rekindle-fleet-history", version,
 *                           simulated, uuid, profile, step_s, start_minute, failure_minute
 *                           (-1: none), failure_event, precursor_minute (-1: none)
 *   events.jsonl            the simulator's ground-truth log within each history's minutes,
 *                           each GPU's lines in time order (docs/sim.md: off_bus,
 *                           thermal_shutdown, dbe, sdc_start, sdc_end, precursor,
 *                           episode_start, episode_end)
 *
 * Step m (0-based) is the reading at simulated minute s + m + 1 after the fleet opened, where
 * s is the history's start_minute (0 unless the dataset was taken from a longer span: see
 * span_h). A GPU's history ends at its last reading before it was lost (off the bus, thermal
 * shutdown) or at the end. Its failure is the first off_bus, thermal_shutdown or dbe event:
 * `minute` is the step at whose reading the event had happened (an event at simulated second
 * t falls in step ceil(t / 60) - 1 - s). A dbe leaves the GPU running, so its history goes on
 * after the failure. `precursor_minute` is the step by which its warning signs had begun
 * (docs/sim.md; -1 or null: it came silently). Each file also holds "score" F32 [steps]: the
 * health score of each minute's reading as the health monitor gives it (rekindle/monitor.h),
 * with signals over the last six readings, for the health-score baseline of rk predict eval.
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
    const char *dir;            /* created if absent; existing dataset files in it are replaced */
    int gpus;                   /* fleet size, 1..1024 */
    double hours;               /* simulated hours per GPU, > 0 and at most 100,000 */
    uint64_t seed;              /* the fleet (as rk doctor --sim --seed) and the split */
    double start_age_h;         /* hours of service before the first minute (default 20,000: worn
                                   cards, so that failures happen within months) */
    double val_frac, test_frac; /* shares of the devices (defaults 0.2 and 0.2), drawn
                                   separately among GPUs that fail and those that do not */
    double span_h; /* the fleet's life the histories are taken from (0 or `hours`: every
                      history starts at the open). Longer: each GPU's `hours` of history are a
                      stretch of it, the stretch that holds its first failure when it fails
                      within the span (at a seeded place at least 6 hours in, or half the
                      history when it is shorter than 12 hours), else a
                      seeded stretch: failures are kept, quiet time is sampled, so the
                      dataset holds far more failures per GPU-hour than the fleet does */
    /* Called after each GPU (NULL: not called). */
    void (*progress)(int gpu, int gpus, void *ctx);
    void *ctx;
} rk_fleet_data_opts;

void rk_fleet_data_opts_default(rk_fleet_data_opts *o);

struct rk_gpu_sample;
/* One minute's feature row (x[RK_FLEET_FEATURES], 0 where absent, and valid[...]) from a reading
 * and the previous minute's (NULL for the first: counters then give 0): what the dataset stores and
 * what live readings must be turned into for the model (rekindle/predict_online.h). */
void rk_fleet_features(const struct rk_gpu_sample *s, const struct rk_gpu_sample *prev, float *x,
                       uint8_t *valid);

/* The model's input for minute m: the window of a GPU's feature rows ending at m. `rows` holds
 * `steps` rows of RK_FLEET_FEATURES floats, oldest first, exactly as the dataset stores them
 * ("x", made by rk_fleet_features: absent fields 0). out (T x RK_FLEET_FEATURES floats) gets
 * rows m - T + 1 .. m, oldest first, unchanged: out[k * F + j] = rows[(m - T + 1 + k) * F + j].
 * There is no window before T rows exist: RK_EINVAL when m + 1 < T, m >= steps, T < 1 or a
 * pointer is NULL (out untouched). Training, evaluation (rk predict train / eval) and live
 * prediction (a ring of the last T rows unrolled into `rows`, m = T - 1) all build their
 * windows with it or exactly as it does; its label in a dataset: the GPU's failure minute f
 * satisfies m < f <= m + horizon. */
int rk_fleet_window(const float *rows, size_t steps, size_t m, int T, float *out);

/* Readings kept for the "score" of a dataset (its signals' window): six, one a minute. */
#define RK_FLEET_SCORE_HISTORY 6

struct rk_telemetry;
/* One GPU's history as the dataset stores it: GPU `gpu` of `t` read `minutes` times, at
 * t0_s + 60 (m + 1) seconds for m = 0.. (a simulator's clock is pinned there; another
 * backend is read as it comes), each reading fed to a health monitor of
 * RK_FLEET_SCORE_HISTORY readings (rekindle/monitor.h). Each good reading adds a row: its
 * features (x, valid: rk_fleet_features against the previous row's reading) and its score
 * (the monitor's). By the monitor's rule a failed reading adds no row; a lost one ends the
 * history (*lost = 1). x and valid hold minutes * RK_FLEET_FEATURES, score minutes entries;
 * *steps gets the rows written. Errors: the backend's and the monitor's (the rows before it
 * are kept). */
int rk_fleet_record(struct rk_telemetry *t, int gpu, double t0_s, size_t minutes, float *x,
                    uint8_t *valid, float *score, size_t *steps, int *lost, rk_err *err);

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
