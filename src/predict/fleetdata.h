/*
 * The fleet dataset (docs/predict.md): training data for the failure predictor from the
 * simulated fleet: per-minute histories of every simulated GPU's signals, with the
 * ground-truth failure the simulator logged, split into training, validation and test sets by
 * device (never by time inside a device). Everything it writes says simulated. Written by
 * rk_fleet_data_write (fleetdata.c), read back by rk_fleet_load (fleetload.c). A header of
 * the predictor library (rkpredict), not of the installed API.
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
 * test_fleetdata.c checks it), one GPU in memory at a time. The fleet runs busy
 * (RK_SIM_LOAD_BUSY: GPUs in a job) with the VRM and fan sensors fitted (sim_sensors), not
 * the simulator's idle, NVML-only defaults.
 */
#ifndef RK_PREDICT_FLEETDATA_H
#define RK_PREDICT_FLEETDATA_H

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
 * what live readings must be turned into for the model (predict/predict_online.h). */
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

/* ---- reading a dataset -------------------------------------------------------------------- */

enum { RK_FLEET_TRAIN = 0, RK_FLEET_VAL = 1, RK_FLEET_TEST = 2 };

typedef struct rk_fleet_gpu {
    int index, split; /* split: RK_FLEET_* */
    char uuid[96], profile[32], event[24];
    char file[64]; /* its history's file name in the dataset directory */
    size_t steps;
    long start_minute;
    long failure;   /* the step of its failure, -1: none */
    long precursor; /* the step by which its warning signs had begun, -1: none or silent */
    float *x;       /* steps x RK_FLEET_FEATURES, NULL when its split was not loaded */
    float *score;   /* steps health scores, NULL when not loaded */
} rk_fleet_gpu;

typedef struct rk_fleet {
    uint64_t seed;
    int gpus;
    double hours, span_h, start_age_h;
    rk_fleet_gpu *gpu; /* gpus entries, by index */
} rk_fleet;

/* Read DIR/fleet.json and the histories of the GPUs whose split is in `splits` (a mask of
 * 1 << RK_FLEET_*). RK_ENOENT naming the file when a file is missing; RK_EFORMAT naming the
 * file and problem for anything malformed (another format, a shape that disagrees with the
 * manifest, a non-finite value, a failure outside the history). On failure *f is empty. */
int rk_fleet_load(rk_fleet *f, const char *dir, unsigned splits, rk_err *err);
/* The manifest alone (len bytes of fleet.json's text, `name` for errors): every GPU's metadata,
 * no history. The same checks and errors as rk_fleet_load. */
int rk_fleet_parse_manifest(rk_fleet *f, const char *text, size_t len, const char *name,
                            rk_err *err);
void rk_fleet_free(rk_fleet *f);
/* "train", "val" or "test". */
const char *rk_fleet_split_name(int split);

#ifdef __cplusplus
}
#endif
#endif
