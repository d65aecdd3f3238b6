/*
 * rk plan's simulator (docs/plan.md): a discrete-event simulation of one training job on a
 * fleet of GPUs on hosts through failures, detection, recovery, saves, spares and repairs.
 *
 * The model. The job runs on `hosts` hosts of `gpus_per_host` GPUs each; `spare_hosts` more
 * hosts wait idle. Failures come from per-GPU and per-host processes (exponential or Weibull
 * renewals, each unit drawing its next failure when the last one fires) or from a replayed
 * trace of node faults. A GPU failure is a crash, a hang or a fail-slow (by `mix`); a host
 * failure takes the host out until it is repaired. Every failure is seen after its kind's
 * detection time; then the job restarts by its recovery mode (disk: from the last checkpoint;
 * memory: from the newer of the last snapshot and checkpoint, but a lost host's snapshots are
 * gone, so from the checkpoint; in place: only the current step is lost), paying the mode's
 * restart cost. A failure during a restart starts the restart again; one during a save loses
 * that save. A lost host is replaced by a spare when one is idle; else the job shrinks (runs
 * on the hosts left, if at least `min_hosts`) or waits for a repair. A repaired host returns
 * to the spares, or, if the job runs short, rejoins it at its next save (one more restart).
 * A fail-slow GPU slows the whole (synchronous) job by `slow_factor` until it is detected;
 * then its host is drained (a checkpoint, a restart without it) and repaired.
 *
 * Units: seconds of wall time. Work is counted in seconds of the whole job at full speed, so
 * goodput = work done / wall time (1.0: no failure, no save ever cost anything).
 *
 * Memory: linear in the fleet (one heap entry per GPU and per host). No globals: every
 * function works on its arguments only; the same config and seed give the same result bits.
 * Library code: never prints, never exits; errors are RK_E* codes with a message in `err`.
 */
#ifndef RK_PLAN_H
#define RK_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

/* What a failure does. */
typedef enum rk_plan_kind {
    RK_PLAN_CRASH = 0, /* a rank's process dies: seen at once, restart on the same hardware */
    RK_PLAN_HANG,      /* a rank stops making progress: seen after the heartbeat timeout */
    RK_PLAN_HOST,      /* a host is lost (or a GPU breaks for good): out until repaired */
    RK_PLAN_SLOW,      /* a GPU runs slow: the job with it, until detected and drained */
    RK_PLAN_KINDS
} rk_plan_kind;

/* How the job recovers from a crash or a hang (host losses restart from the checkpoint in
 * every mode but in place, which refills a lost host's state from its peers). */
typedef enum rk_plan_mode {
    RK_PLAN_DISK = 0, /* relaunch from the last checkpoint on disk */
    RK_PLAN_MEMORY,   /* relaunch from the newest snapshot in the nodes' memory */
    RK_PLAN_INPLACE,  /* the ranks stay up and redo the current step */
    RK_PLAN_MODES
} rk_plan_mode;

/* A time-to-failure distribution of one unit (a GPU or a host). */
typedef enum rk_plan_dist {
    RK_PLAN_NONE = 0,    /* never fails */
    RK_PLAN_EXPONENTIAL, /* mean `mtbf_s` */
    RK_PLAN_WEIBULL      /* S(t) = exp(-(t / scale_s)^shape), renewed after each failure */
} rk_plan_dist;

typedef struct rk_plan_law {
    rk_plan_dist dist;
    double mtbf_s;  /* exponential: mean time between failures of one unit, > 0 */
    double shape;   /* Weibull shape k > 0 */
    double scale_s; /* Weibull scale > 0 */
    double age_s;   /* Weibull: every unit starts at this age (its first failure is drawn
                     * given that it survived so far); >= 0 */
} rk_plan_law;

/* One fault of a replayed trace: host `host` (0-based, below hosts + spare_hosts) is out
 * from start_s to end_s (wall seconds from the start of the job). */
typedef struct rk_plan_fault {
    uint32_t host;
    double start_s, end_s;
} rk_plan_fault;

typedef struct rk_plan_config {
    /* fleet */
    uint32_t hosts;         /* hosts the job runs on at full size, >= 1 */
    uint32_t gpus_per_host; /* >= 1 */
    uint32_t spare_hosts;   /* idle hosts that replace lost ones */
    uint32_t min_hosts;     /* the job shrinks down to this many, then waits; 0: = hosts
                             * (never shrinks: waits for a spare or a repair) */
    /* failures */
    rk_plan_law gpu;            /* each GPU's failures (crash, hang or slow by mix) */
    double mix[3];              /* shares of GPU failures: crash, hang, slow (sum > 0) */
    rk_plan_law host;           /* each host's losses */
    const rk_plan_fault *trace; /* replayed host faults (sorted by start_s), or NULL */
    size_t trace_len;
    /* detection, seconds after the failure, by kind */
    double detect_s[RK_PLAN_KINDS];
    double slow_factor; /* a job with a slow GPU runs at this share of its speed, (0, 1] */
    /* repairs: log-normal time to repair a lost host (median, and mean >= median) */
    double repair_median_s, repair_mean_s;
    /* recovery and saves */
    rk_plan_mode mode;
    double restart_s[RK_PLAN_MODES]; /* restart cost by mode, after detection */
    double host_restart_s;           /* restart cost after a host is lost or drained */
    double ckpt_every_s;             /* compute time between checkpoints, > 0 */
    double ckpt_cost_s;              /* wall time one checkpoint stops the job */
    double snap_every_s;             /* memory mode: compute time between snapshots, > 0 */
    double snap_cost_s;
    double step_s; /* in place: the work of one step is lost, > 0 */
    /* the run: until `work_s` of work is done or `horizon_s` of wall time has passed */
    double work_s;    /* 0: run to the horizon */
    double horizon_s; /* > 0 */
} rk_plan_config;

/* Fill `c` with the defaults (docs/plan.md names each one's source): one host of one GPU,
 * no failures, disk recovery, rekindle's measured detection and restart costs. */
void rk_plan_config_default(rk_plan_config *c);

/* Check every field; RK_EINVAL with a message naming the field otherwise. */
int rk_plan_config_check(const rk_plan_config *c, rk_err *err);

/* What one simulated run gives. */
typedef struct rk_plan_result {
    double wall_s;                    /* time simulated: to the end of the work, else the horizon */
    double work_s;                    /* work done and kept (full-speed job seconds) */
    double goodput;                   /* work_s / wall_s */
    int finished;                     /* 1 when work_s reached the config's work_s */
    uint64_t failures[RK_PLAN_KINDS]; /* failures that hit the job (by kind) */
    uint64_t trace_faults;            /* faults of the replayed trace that started before the end */
    uint64_t restarts;     /* restarts begun (a failure during a restart begins another) */
    uint64_t ckpts, snaps; /* saves completed */
    double lost_work_s;    /* work thrown away by failures */
    double down_s;         /* wall time in detection and restarts */
    double wait_s;         /* wall time waiting for hosts (no spare, below min_hosts) */
    double save_s;         /* wall time in checkpoints and snapshots */
    double host_down_s;    /* sum over hosts of the time each was out (overlaps counted
                            * once per host), up to the end */
    uint64_t spares_used;  /* lost hosts replaced by a spare */
} rk_plan_result;

/* One run with `seed`. RK_EINVAL for a bad config, RK_ENOMEM. */
int rk_plan_run(const rk_plan_config *c, uint64_t seed, rk_plan_result *out, rk_err *err);

/* Many runs: seeds seed, seed+1, ... seed+runs-1. */
typedef struct rk_plan_stats {
    int runs;
    double goodput_mean, goodput_sd, goodput_min, goodput_max;
    double wall_mean_s;   /* mean wall time (to finish when work_s is set) */
    int finished;         /* runs that finished their work */
    double failures_mean; /* failures of every kind per run */
    double lost_work_mean_s;
} rk_plan_stats;
int rk_plan_estimate(const rk_plan_config *c, uint64_t seed, int runs, rk_plan_stats *out,
                     rk_err *err);

/* The best interval of saves: goodput at `n` intervals spaced evenly in log between lo_s and
 * hi_s (common random numbers: the same seeds at each), then the vertex of a parabola in
 * log(interval) fitted to the best point and its neighbours (least squares over the five
 * nearest, or three at an end). `snap`: sweep snap_every_s, else ckpt_every_s. goodput[] and
 * interval[] (room for n each, may be NULL) receive the curve. */
typedef struct rk_plan_best {
    double interval_s; /* the fitted optimum */
    double goodput;    /* the mean goodput at the best grid point */
    int index;         /* the best grid point */
} rk_plan_best;
int rk_plan_best_interval(const rk_plan_config *c, int snap, double lo_s, double hi_s, int n,
                          uint64_t seed, int runs, double *interval, double *goodput,
                          rk_plan_best *out, rk_err *err);

/* ---- closed forms the simulator is checked against ----------------------------------------- */

/* Daly's expected goodput for exponential failures of mean mtbf_s, compute tau_s between
 * checkpoints of cost c_s, restart r_s (failures strike anywhere, restarts included):
 * tau / (M e^(R/M) (e^((tau+C)/M) - 1)) (J. T. Daly, FGCS 22 (2006), eq. 20). */
double rk_plan_daly_goodput(double tau_s, double c_s, double r_s, double mtbf_s);
/* Young's first-order optimum sqrt(2 C M) (J. W. Young, CACM 17 (1974)). */
double rk_plan_young_interval(double c_s, double mtbf_s);
/* Daly's higher-order optimum: sqrt(2CM) (1 + sqrt(C/2M)/3 + C/18M) - C for C < 2M, else M
 * (Daly 2006, eq. 37). */
double rk_plan_daly_interval(double c_s, double mtbf_s);

/* ---- a trace of node faults (InfiniteHBD's fault_trace.json format) ------------------------ */

/* What a trace holds: faults with their hosts numbered by first appearance. */
typedef struct rk_plan_trace {
    rk_plan_fault *faults; /* sorted by start_s */
    size_t n;
    uint32_t nodes;   /* distinct node ids */
    double span_s;    /* the last event's time */
    double unavail_s; /* sum over nodes of the union of their fault intervals */
} rk_plan_trace;

#define RK_PLAN_TRACE_MAX_BYTES (64u << 20) /* a trace file larger than this is refused */
#define RK_PLAN_TRACE_MAX_EVENTS 2000000

/* Parse a JSON array of {node_id, event_time (days), event_type fault_start|fault_end, ...}
 * in time order; each fault_end closes the oldest open fault of its node with the same
 * fault_type (else the oldest). `name` labels messages. RK_EFORMAT naming the event and field
 * for anything else (an end without a start, a fault left open, times going backwards). */
int rk_plan_trace_parse(const char *text, size_t len, const char *name, rk_plan_trace *out,
                        rk_err *err);
/* The same from a file (bounded by RK_PLAN_TRACE_MAX_BYTES). */
int rk_plan_trace_load(const char *path, rk_plan_trace *out, rk_err *err);
void rk_plan_trace_free(rk_plan_trace *t);

#endif
