/*
 * The health monitor: the one pipeline from a GPU's readings to what rekindle says about it,
 * for N GPUs (docs/health.md, "The monitor"). For each GPU it keeps
 *
 *   the history    the last `history` readings (rk_gpu_history), for rates and dT/dt
 *   the signals    rk_signals_compute over that history
 *   a probability  optional: a failure predictor's probability that the GPU fails within
 *                  the predictor's horizon (read from the model file, never assumed here)
 *   the score      rk_health_score of the latest reading with those signals, and its findings
 *   a burn verdict the GPU's last burn-in (docs/burn.md), from the state file at
 *                  rk_burn_state's path (RK_BURN_STATE, else /var/lib/rekindle/burn.json),
 *                  by serial, else UUID; looked at by every rk_monitor_read, loaded again
 *                  when it changed; in rk_monitor_gpu.sig.burn_*
 *
 * rk doctor, rk exporter, rk run's health gate and the predictor's dataset builder all feed
 * their readings here, so the same readings score the same in every tool.
 *
 * The rule for readings that fail. A reading is good (some field valid), lost (the GPU is
 * gone: rk_gpu_sample.lost) or failed (not lost and nothing valid: the backend could not
 * read the GPU this time). A failed reading is no reading: it does not enter the history nor
 * the predictor's window, and it changes neither the signals, the score, the findings nor the
 * probability, which stay those of the last good or lost reading; the GPU is marked not
 * `current` and its consecutive failures are counted. A GPU that has never been read has no
 * score (has_score false). A lost reading is a reading: it enters the history (the signals
 * skip it), the predictor's window starts afresh, and the GPU scores 0 (gpu_lost).
 *
 * Probabilities. Whatever the predictor returns is checked here, in one place: a finite value
 * in [0, 1] is the GPU's probability; anything else (negative: the window is not full yet;
 * above 1, NaN) is none, and the score does not count it.
 *
 * Layering: the monitor is part of librekindle and knows no model. A predictor reaches it
 * through rk_monitor_predictor, a small table the predict layer fills
 * (rk_pred_online_monitor in rk's own predictor, not installed) from a loaded model, horizon
 * included; a program of its own fills the table itself.
 *
 *     rk_monitor_opts o = RK_MONITOR_OPTS_DEFAULT;
 *     rk_monitor *m;
 *     if (rk_monitor_create(&m, rk_telemetry_count(t), &o, &err)) return err.code;
 *     rk_monitor_read(m, t, &err);              // each cycle: read every GPU, rescore
 *     const rk_monitor_gpu *g = rk_monitor_gpu_state(m, 0);
 *     if (g->has_score) printf("%d\n", g->score);
 *     rk_monitor_free(m);
 *
 * Not thread-safe: one caller feeds and reads a monitor.
 */
#ifndef REKINDLE_MONITOR_H
#define REKINDLE_MONITOR_H

#include <stdbool.h>

#include "rekindle/error.h"
#include "rekindle/export.h"
#include "rekindle/health.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A failure predictor as the monitor sees it. push is called with every good or lost reading
 * of GPU `gpu` (never a failed one), taken at t_s seconds of the backend's clock
 * (rk_telemetry_now), and sets *prob to the GPU's probability of failing within horizon_min
 * minutes, or to a negative value while it has none. It returns RK_OK or an error (which the
 * monitor returns; the probability is still what push set, checked as below). */
typedef struct rk_monitor_predictor {
    int (*push)(void *ctx, int gpu, double t_s, const rk_gpu_sample *s, double *prob, rk_err *err);
    void *ctx;
    double horizon_min; /* what the probability is about, from the model; 0: unstated */
} rk_monitor_predictor;

typedef struct rk_monitor_opts {
    int history; /* readings kept per GPU for the signals, 2 .. 1048576 */
    /* NULL: no predictor. Copied; its ctx must outlive the monitor. */
    const rk_monitor_predictor *predictor;
} rk_monitor_opts;

#define RK_MONITOR_OPTS_DEFAULT                                                                    \
    {                                                                                              \
        12, NULL                                                                                   \
    }

/* What the monitor says about one GPU. */
typedef struct rk_monitor_gpu {
    bool read;            /* it has had a good or lost reading */
    bool current;         /* the latest reading was good or lost (false: it failed, or none yet) */
    int failed_reads;     /* failed readings since the last good or lost one */
    long readings;        /* good and lost readings so far */
    rk_gpu_sample latest; /* the last good or lost reading (all zero before the first) */
    rk_gpu_signals sig;   /* over the history, with the probability in fail_prob_* */
    double prob;          /* the predictor's probability in [0, 1]; -1: none */
    double horizon_min;   /* the predictor's horizon, minutes (0 without one or unstated) */
    bool has_score;       /* false until the first good or lost reading */
    int score;            /* 0 .. 100 (rk_health_score) */
    int nfindings;
    rk_finding findings[RK_MAX_FINDINGS]; /* worst first */
} rk_monitor_gpu;

typedef struct rk_monitor rk_monitor;

/* A monitor of `gpus` GPUs (0 .. 1024). RK_EINVAL naming the option; RK_ENOMEM. */
RK_API int rk_monitor_create(rk_monitor **out, int gpus, const rk_monitor_opts *o, rk_err *err);
/* NULL is a no-op. */
RK_API void rk_monitor_free(rk_monitor *m);
RK_API int rk_monitor_gpus(const rk_monitor *m);

/* 1 when a reading failed by the rule above (not lost, nothing valid). */
RK_API bool rk_monitor_read_failed(const rk_gpu_sample *s);

/* Feed GPU `gpu`'s reading taken at t_s seconds (the backend's clock: what the predictor
 * counts its minutes by) and rescore it. RK_EINVAL for a bad index; the predictor's error
 * (the reading is in the history and scored all the same). */
RK_API int rk_monitor_push(rk_monitor *m, int gpu, double t_s, const rk_gpu_sample *s, rk_err *err);

/* One cycle: read every GPU of `t` (rk_telemetry_read_all, textfile sensors and the kernel
 * log's Xids merged) at the backend's clock (rk_telemetry_now), give each GPU its burn verdict
 * and push each reading. Every GPU is read and pushed even when some fail; the first error
 * (of the backend, a textfile, the kernel log file, the predictor) is returned. A burn state
 * file that does not load counts as no verdicts and is reported once per version of the file
 * ("warning: burn verdicts not used: ...", its RK_EFORMAT or RK_EINVAL).
 * RK_EINVAL when t has another number of GPUs than the monitor. */
RK_API int rk_monitor_read(rk_monitor *m, rk_telemetry *t, rk_err *err);

/* rk doctor's check: `k` cycles of rk_monitor_read, `interval_s` seconds apart (the first at
 * once). Returns the first error; every cycle runs. */
RK_API int rk_monitor_sample(rk_monitor *m, rk_telemetry *t, int k, double interval_s, rk_err *err);

/* GPU `gpu`'s state (valid until the next push or read); NULL for a bad index. */
RK_API const rk_monitor_gpu *rk_monitor_gpu_state(const rk_monitor *m, int gpu);
/* What the last rk_monitor_read learned of GPU `gpu` (all zero before one); NULL for a bad
 * index. */
RK_API const rk_gpu_info *rk_monitor_info(const rk_monitor *m, int gpu);

#ifdef __cplusplus
}
#endif
#endif
