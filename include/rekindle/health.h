/*
 * The health layer (docs/design.md): GPU telemetry behind one interface, the signals
 * derived from it, and a 0-100 health score with findings. One node reads its GPUs through a
 * backend, a small table of function pointers per source, as nvtop does for its vendors:
 *
 *   "nvml"      the NVIDIA driver's NVML, loaded with dlopen at run time (no link against the
 *               driver; works, and says so, on machines without NVIDIA software)
 *   "sim"       a seeded fleet of simulated GPUs that age and fail (docs/sim.md); every
 *               GPU it reports is marked simulated
 *   "textfile"  not a backend of its own: sensors NVML cannot read (VRM ripple, fan
 *               vibration), read from node_exporter textfile-format files and merged into
 *               the samples of whichever backend is open (rk_telemetry_set_textfile_dir)
 *
 * Every field of a sample carries a valid bit: a card that cannot report a field (no ECC on a
 * GeForce card, no fan on a passive card) leaves it absent, never an error and never zero.
 *
 *     rk_telemetry *t;
 *     rk_telemetry_opts o = RK_TELEMETRY_OPTS_DEFAULT;
 *     o.sim_gpus = 8; o.seed = 1;
 *     if (rk_telemetry_open(&t, "sim", &o, &err)) return err.code;
 *     for (int i = 0; i < rk_telemetry_count(t); i++) {
 *         rk_gpu_sample s;
 *         rk_telemetry_read(t, i, &s, &err);
 *         if (rk_field_valid(&s, RK_F_TEMP)) printf("%.0f C\n", s.temp_c);
 *     }
 *     rk_telemetry_close(t);
 */
#ifndef REKINDLE_HEALTH_H
#define REKINDLE_HEALTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- samples ------------------------------------------------------------------------------ */

/* One bit per field of rk_gpu_sample (valid & (1ull << RK_F_x)). */
typedef enum rk_field {
    RK_F_TEMP,            /* temp_c: GPU core temperature, degrees Celsius */
    RK_F_FAN,             /* fan_pct: fan speed, percent of maximum */
    RK_F_POWER,           /* power_w: board power draw, watts */
    RK_F_POWER_LIMIT,     /* power_limit_w: enforced power limit, watts */
    RK_F_SM_CLOCK,        /* sm_mhz */
    RK_F_MEM_CLOCK,       /* mem_mhz */
    RK_F_CLOCK_REASONS,   /* clock_reasons: RK_CLOCK_* bits (NVML clock event reasons) */
    RK_F_UTIL,            /* util_pct: GPU utilisation, percent */
    RK_F_MEM_USED,        /* mem_used_bytes */
    RK_F_MEM_TOTAL,       /* mem_total_bytes */
    RK_F_ECC_CORRECTED,   /* ecc_corrected: corrected (single-bit) errors, lifetime total */
    RK_F_ECC_UNCORRECTED, /* ecc_uncorrected: uncorrected (double-bit) errors, lifetime total */
    RK_F_RETIRED,         /* retired_pages: pages retired (both causes) */
    RK_F_RETIRED_PENDING, /* retired_pending: 1 if a retirement waits for a reboot */
    RK_F_REMAPPED,        /* remapped_rows: rows remapped (Ampere and later) */
    RK_F_PCIE_GEN,        /* pcie_gen: current link generation */
    RK_F_PCIE_WIDTH,      /* pcie_width: current link width (lanes) */
    RK_F_PCIE_GEN_MAX,    /* pcie_gen_max: the most the card and slot can do */
    RK_F_PCIE_WIDTH_MAX,
    RK_F_PCIE_REPLAY, /* pcie_replay: PCIe replay counter, lifetime total */
    RK_F_ENERGY,      /* energy_j: energy since the driver loaded, joules */
    RK_F_XID,         /* xid_count, last_xid, xids[]: Xid events seen, the latest one's code */
    RK_F_VRM_RIPPLE,  /* vrm_ripple_mv: VRM output ripple, millivolts peak to peak */
    RK_F_FAN_VIB,     /* fan_vib_hz: dominant fan vibration frequency, hertz */
    RK_F_COUNT
} rk_field;

/* Per-Xid counts kept in a sample: the RK_XID_SLOTS most frequent codes. */
#define RK_XID_SLOTS 8

/* Clock event (throttle) reasons, the NVML bit values. */
#define RK_CLOCK_GPU_IDLE 0x1ull
#define RK_CLOCK_APP_SETTING 0x2ull
#define RK_CLOCK_SW_POWER_CAP 0x4ull
#define RK_CLOCK_HW_SLOWDOWN 0x8ull
#define RK_CLOCK_SYNC_BOOST 0x10ull
#define RK_CLOCK_SW_THERMAL 0x20ull
#define RK_CLOCK_HW_THERMAL 0x40ull
#define RK_CLOCK_HW_POWER_BRAKE 0x80ull

typedef struct rk_gpu_sample {
    double t;       /* when read: seconds since the epoch (sim: simulated time, same unit) */
    uint64_t valid; /* RK_F_* bits */
    double temp_c, fan_pct, power_w, power_limit_w, sm_mhz, mem_mhz, util_pct;
    uint64_t clock_reasons;
    uint64_t mem_used_bytes, mem_total_bytes;
    uint64_t ecc_corrected, ecc_uncorrected, retired_pages, retired_pending, remapped_rows;
    int pcie_gen, pcie_width, pcie_gen_max, pcie_width_max;
    uint64_t pcie_replay;
    double energy_j;
    /* Xids: with RK_F_XID, xid_count events in all and last_xid the latest one's code. NVML
     * counts the events since the backend opened; where the kernel log can be read
     * (docs/health.md, "Past Xids") the counts are those since boot, and xids[] holds the
     * count of each code for this GPU's bus id: nxids (0..RK_XID_SLOTS) entries, the most
     * frequent first, equal counts by code ascending. Codes beyond RK_XID_SLOTS are counted in
     * xid_count only. */
    uint64_t xid_count;
    int last_xid;
    struct {
        int xid;
        uint64_t count;
    } xids[RK_XID_SLOTS];
    int nxids;
    double vrm_ripple_mv, fan_vib_hz;
    bool lost; /* the GPU is gone (fallen off the bus, shut down): nothing else valid */
} rk_gpu_sample;

static inline bool rk_field_valid(const rk_gpu_sample *s, rk_field f)
{
    return (s->valid >> f) & 1u;
}
static inline void rk_field_set(rk_gpu_sample *s, rk_field f)
{
    s->valid |= 1ull << f;
}
/* "temp", "fan", ... (stable names, used in messages and JSON). */
RK_API const char *rk_field_name(rk_field f);

/* What a GPU is. */
/* The GPU's architecture, as NVML names it (nvmlDeviceGetArchitecture). */
typedef enum rk_gpu_arch {
    RK_ARCH_UNKNOWN = 0,
    RK_ARCH_KEPLER,
    RK_ARCH_MAXWELL,
    RK_ARCH_PASCAL,
    RK_ARCH_VOLTA,
    RK_ARCH_TURING,
    RK_ARCH_AMPERE,
    RK_ARCH_ADA,
    RK_ARCH_HOPPER,
    RK_ARCH_BLACKWELL,
} rk_gpu_arch;

/* "Pascal", ..., "unknown". */
RK_API const char *rk_gpu_arch_name(rk_gpu_arch a);

/* What `rk tune` can set on a card (rk_gpu_info.tune, docs/tune.md "Which cards can"). */
#define RK_TUNE_KNOWN 1u        /* the routes were probed: without it nothing is known */
#define RK_TUNE_LOCK_CLOCKS 2u  /* locked SM clocks (Volta and newer) */
#define RK_TUNE_POWER_LIMIT 4u  /* a power limit within the range the BIOS allows */
#define RK_TUNE_CLOCK_OFFSET 8u /* a clock/voltage curve offset, where the driver has it */

typedef struct rk_gpu_info {
    int index;        /* 0.. in the backend's order */
    char name[96];    /* "NVIDIA GeForce GTX 1070 Ti" */
    char uuid[96];    /* "GPU-..." (sim: "SIM-<seed>-<index>") */
    char serial[32];  /* "" when the card has none */
    char bus_id[32];  /* PCI bus id, "" unknown */
    char profile[32]; /* sim: the profile it was drawn from ("1070ti-mining", ...); "" */
    bool simulated;
    const char *backend; /* "nvml", "sim" */
    rk_gpu_arch arch;    /* RK_ARCH_UNKNOWN when the driver does not say */
    bool geforce;        /* a consumer board (NVML brand GeForce or TITAN) */
    unsigned tune;       /* RK_TUNE_* bits; 0 when not probed */
} rk_gpu_info;

/* ---- backends ----------------------------------------------------------------------------- */

/* The load a simulated fleet runs (docs/sim.md, "Load"). */
typedef enum rk_sim_load {
    RK_SIM_LOAD_IDLE, /* every GPU idle (0-3%, idle clocks): a card nobody is using */
    RK_SIM_LOAD_BUSY  /* a job: 85% of 10-minute slots busy at 90-100%, the rest idle */
} rk_sim_load;

typedef struct rk_telemetry_opts {
    int sim_gpus;             /* sim: fleet size (1..1024) */
    uint64_t seed;            /* sim: fleet seed */
    double time_scale;        /* sim: simulated seconds per real second (1 = real time) */
    double start_age_h;       /* sim: hours of service before the first sample (ex-mining cards
                               * arrive worn: profiles add their own prior wear on top) */
    const char *events_path;  /* sim: ground-truth failure log (JSON lines), NULL for none */
    const char *textfile_dir; /* textfile sensors merged into every sample; NULL for none */
    rk_sim_load sim_load;     /* sim: RK_SIM_LOAD_IDLE (the default) or RK_SIM_LOAD_BUSY */
    bool sim_sensors;         /* sim: report VRM ripple and fan vibration as if a sensor kit
                               * were fitted; false (the default): only what NVML reports
                               * (textfile sensors are merged either way) */
} rk_telemetry_opts;

#define RK_TELEMETRY_OPTS_DEFAULT                                                                  \
    {                                                                                              \
        8, 1, 1.0, 0.0, NULL, NULL, RK_SIM_LOAD_IDLE, false                                        \
    }

typedef struct rk_telemetry rk_telemetry;

/* Backend operations (one static table per backend, in src/health/<name>.c). */
typedef struct rk_telemetry_ops {
    const char *name;
    int (*open)(void **state, const rk_telemetry_opts *o, rk_err *err);
    int (*count)(void *state);
    int (*info)(void *state, int i, rk_gpu_info *out);
    int (*read)(void *state, int i, rk_gpu_sample *out, rk_err *err);
    void (*close)(void *state);
    /* The backend's clock, in the unit of rk_gpu_sample.t's differences: seconds (the
     * simulator's simulated seconds). NULL: the monotonic clock (rk_telemetry_now). */
    double (*now)(void *state);
} rk_telemetry_ops;

RK_API extern const rk_telemetry_ops rk_telemetry_nvml;
RK_API extern const rk_telemetry_ops rk_telemetry_sim;

/* Open "nvml", "sim" or "auto" (nvml when it loads and sees at least one GPU, else an error
 * naming why). RK_ENOTSUP when NVML is absent (libnvidia-ml.so.1 not found) with a message
 * saying so; RK_EINVAL for bad options. */
RK_API int rk_telemetry_open(rk_telemetry **out, const char *backend, const rk_telemetry_opts *o,
                             rk_err *err);
RK_API void rk_telemetry_close(rk_telemetry *t);
RK_API int rk_telemetry_count(const rk_telemetry *t);
RK_API const char *rk_telemetry_backend(const rk_telemetry *t);
/* Open a backend of the caller's own (a replay of recorded samples, a test's fake): the
 * same checks and textfile merging as rk_telemetry_open. The table must outlive the
 * telemetry. RK_EINVAL for bad options or a table without open, count, info, read or close. */
RK_API int rk_telemetry_open_ops(rk_telemetry **out, const rk_telemetry_ops *ops,
                                 const rk_telemetry_opts *o, rk_err *err);
/* The backend's clock now, seconds: simulated seconds for "sim" (its pinned or scaled clock),
 * the monotonic clock for NVML. What the failure predictor counts its minutes by. */
RK_API double rk_telemetry_now(rk_telemetry *t);
RK_API int rk_telemetry_info(const rk_telemetry *t, int i, rk_gpu_info *out);
/* Read GPU i now (the backend only). A GPU that is gone gives lost = true and RK_OK.
 * Errors: RK_EINVAL (i out of range), RK_EIO (the backend failed; message says how). */
RK_API int rk_telemetry_read(rk_telemetry *t, int i, rk_gpu_sample *out, rk_err *err);
/* Read every GPU (infos and samples have rk_telemetry_count entries) and merge the textfile
 * sensors of opts.textfile_dir. A GPU whose read fails keeps an empty sample (valid 0) and
 * the first error is returned after all were read; a textfile that does not parse is
 * reported the same way while the others are still merged. */
RK_API int rk_telemetry_read_all(rk_telemetry *t, rk_gpu_info *infos, rk_gpu_sample *samples,
                                 rk_err *err);

/* ---- textfile sensors ----------------------------------------------------------------------- */

/* Parse one node_exporter textfile (*.prom) and merge what it says about the GPUs into
 * samples: metrics rk_sensor_vrm_ripple_volts (volts; stored as vrm_ripple_mv, millivolts) and
 * rk_sensor_fan_vibration_hertz with a label gpu="<index>" or uuid="<uuid>"; other metrics are
 * ignored, rk exporter's outputs (rk_gpu_fan_vibration_hertz, ...) included. `infos`/`samples`
 * have n entries. A malformed line is RK_EFORMAT naming the file, line, column and problem
 * (never the file's bytes), as is a sample of the old input rk_gpu_vrm_ripple_millivolts
 * (the message names rk_sensor_vrm_ripple_volts); nothing is merged from that file then. */
RK_API int rk_textfile_merge(const char *path, const char *text, size_t len,
                             const rk_gpu_info *infos, rk_gpu_sample *samples, int n, rk_err *err);
/* Every regular *.prom file in `dir` (sorted by name, at most 1 MiB each, dot-files,
 * directories, FIFOs and devices skipped), merged with rk_textfile_merge. A symbolic link is
 * followed only to a regular file named by a plain name in the same directory; any other link
 * is reported (RK_EINVAL) and not read (docs/textfile.md). A file that does not parse is
 * reported (the first problem, RK_EFORMAT) but does not stop the others. */
RK_API int rk_textfile_merge_dir(const char *dir, const rk_gpu_info *infos, rk_gpu_sample *samples,
                                 int n, rk_err *err);

/* ---- signals, score, findings ------------------------------------------------------------- */

/* A window of one GPU's samples, for derived signals. */
typedef struct rk_gpu_history {
    rk_gpu_sample *s; /* ring of samples */
    int cap, n, next;
} rk_gpu_history;

RK_API int rk_history_init(rk_gpu_history *h, int cap, rk_err *err);
RK_API void rk_history_free(rk_gpu_history *h);
RK_API void rk_history_push(rk_gpu_history *h, const rk_gpu_sample *s);

/* Derived signals; each has a valid flag. */
typedef struct rk_gpu_signals {
    bool dtdt_valid;
    double dtdt_c_per_min; /* least squares over the window */
    bool ecc_rate_valid;
    double ecc_corrected_per_h; /* corrected errors per hour */
    bool replay_rate_valid;
    double replay_per_min;       /* PCIe replays per minute */
    double replay_limit_per_min; /* the rate judged bad for this generation and width */
    bool downtrained;            /* link below its max generation or width */
    bool throttled_thermal, throttled_power, hw_slowdown;
    /* The failure predictor's probability (predict/predict_online.h) that the GPU fails
     * within fail_horizon_min minutes (0: not stated). Not derived from the window:
     * rk_signals_compute leaves it invalid, and a caller with a model and a full window of
     * minutes sets it. Invalid, or a value outside [0, 1], changes nothing in the score. */
    bool fail_prob_valid;
    double fail_prob;
    double fail_horizon_min;
    /* The last burn-in's verdict (rk burn, docs/burn.md), from its state file. Caller-set like
     * fail_prob: rk_signals_compute leaves it invalid; the monitor sets it from the record of
     * the GPU's serial, else its UUID. burn_when: seconds since the epoch, the burn's end;
     * burn_failed: what failed ("" when ok). A failed burn is the finding burn_failed. */
    bool burn_valid;
    bool burn_ok;
    double burn_when;
    char burn_failed[160];
} rk_gpu_signals;

RK_API void rk_signals_compute(const rk_gpu_history *h, rk_gpu_signals *out);

typedef enum rk_severity { RK_SEV_INFO, RK_SEV_WARN, RK_SEV_CRIT } rk_severity;

typedef struct rk_finding {
    char code[32]; /* stable: "thermal_paste", "fan_bearing", "pcie_downtrained", ... */
    rk_severity severity;
    int penalty;       /* points taken off the score */
    char message[160]; /* what was seen, with numbers */
    char action[160];  /* what to do: "clean and repaste", "replace the fan", ... */
} rk_finding;

#define RK_HEALTH_THRESHOLD_DEFAULT 60
/* Core temperature limits, degrees Celsius: thermal_high (warn) at or above WARN,
 * thermal_critical at or above CRIT. The alert rule RekindleGpuTemperatureHigh
 * (deploy/prometheus/rekindle.rules.yml) and the dashboard's Temperature panel
 * (deploy/grafana/rekindle.json) use the same numbers; tests/test_thresholds.c holds them
 * to these. */
#define RK_HEALTH_TEMP_WARN_C 83
#define RK_HEALTH_TEMP_CRIT_C 90
/* A predicted failure probability at or above this takes the score below the default
 * threshold (finding failure_predicted, docs/health.md). */
#define RK_HEALTH_FAIL_PROB_PREDICTED 0.5
/* Points a critical Xid (the table in docs/health.md, "Xids") takes off: below the default
 * threshold on its own. A memory Xid that is a warning takes RK_HEALTH_XID_WARN_PENALTY. */
#define RK_HEALTH_XID_CRIT_PENALTY 45
#define RK_HEALTH_XID_WARN_PENALTY 10
/* Points a failed burn-in takes off (finding burn_failed): below the default threshold. */
#define RK_HEALTH_BURN_FAILED_PENALTY 50
/* What the score makes of an Xid code: RK_SEV_CRIT, RK_SEV_WARN, RK_SEV_INFO (an
 * application's error: ignored) or -1 (not in the table: ignored), and its meaning in *what
 * (may be NULL; "" for codes not in the table). One table for the score, docs/health.md and
 * the alert rules (tests/test_thresholds.c holds them together). */
RK_API int rk_health_xid_class(int xid, const char **what);
#define RK_MAX_FINDINGS 16

/* Score 0..100 (100 healthy) from the latest sample and the signals, with the findings that
 * took points off, worst first (docs/health.md lists every rule and penalty). A lost GPU
 * scores 0. */
RK_API int rk_health_score(const rk_gpu_sample *latest, const rk_gpu_signals *sig,
                           rk_finding *findings, int *nfindings);
/* The same score, with advice fitted to what the card allows (info->tune: a Pascal GeForce
 * that cannot lock clocks is told to lower its power limit). info may be NULL: then the
 * advice names every route, as rk_health_score does. */
RK_API int rk_health_score_gpu(const rk_gpu_info *info, const rk_gpu_sample *latest,
                               const rk_gpu_signals *sig, rk_finding *findings, int *nfindings);

RK_API const char *rk_severity_name(rk_severity s);

#ifdef __cplusplus
}
#endif
#endif
