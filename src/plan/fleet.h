/*
 * rk plan's inputs beside the simulator's config (docs/plan.md): a fleet file (the cards a
 * rack holds), the failure models by name, and the question rk plan answers about a fleet,
 * a job and a failure model (goodput, time to finish, best intervals, spares, cost per
 * million samples against a new-card alternative). Library code: never prints or exits.
 */
#ifndef RK_PLAN_FLEET_H
#define RK_PLAN_FLEET_H

#include <stddef.h>

#include "plan/plan.h"
#include "rekindle/error.h"

#define RK_PLAN_FLEET_MAX_BYTES 65536 /* a fleet file larger than this is refused */
#define RK_PLAN_FLEET_MAX_CARDS 64    /* card lines */
#define RK_PLAN_FLEET_LINE_MAX 512    /* bytes of a line */
#define RK_PLAN_MODEL_MAX 63          /* bytes of a card's model name */

/* One `card` line: `count` cards of one model. */
typedef struct rk_plan_card {
    char model[RK_PLAN_MODEL_MAX + 1]; /* [A-Za-z0-9._+-], 1 to 63 bytes */
    unsigned count;                    /* 1 .. 1,000,000 */
    double hours;                      /* hours of service so far, [0, 1e6] (default 0) */
    double score;                      /* health score, [0, 100] (default 100) */
    double watts;                      /* power drawn under load, [0, 100000] (default 0) */
    double price;                      /* price of one card, [0, 1e9] (default 0) */
    double tflops;                     /* throughput of one card, (0, 1e6] (default 1) */
} rk_plan_card;

typedef struct rk_plan_fleet {
    unsigned hosts; /* the `hosts` line (required), 1 .. 1,000,000, dividing the cards */
    rk_plan_card cards[RK_PLAN_FLEET_MAX_CARDS];
    size_t n;
    /* totals over the cards */
    unsigned gpus;
    double tflops, watts, price, hours_mean, score_mean;
} rk_plan_fleet;

/* Parse a fleet file's text (lines: `# comment`, `hosts N`, `card model=M count=N [hours=H]
 * [score=S] [watts=W] [price=P] [tflops=T]`). RK_EFORMAT naming `name`, the line and the
 * field for anything else; totals filled on success. */
int rk_plan_fleet_parse(const char *text, size_t len, const char *name, rk_plan_fleet *out,
                        rk_err *err);
/* The same from a file (bounded by RK_PLAN_FLEET_MAX_BYTES). */
int rk_plan_fleet_load(const char *path, rk_plan_fleet *out, rk_err *err);

/* What a run of rk run measured (its --summary-json, docs/run.md): the job's costs. */
typedef struct rk_plan_measured {
    double step_s;    /* productive_s / steps */
    double restart_s; /* recovery_median_s less the crash detection (0 when absent) */
    int has_restart;
    int mode;           /* RK_PLAN_DISK or RK_PLAN_MEMORY, from `recovery` (disk if absent) */
    double state_bytes; /* a rank's: snapshot_bytes_peak / (2 generations x final_ranks) */
    int has_state;
} rk_plan_measured;

#define RK_PLAN_SUMMARY_MAX_BYTES 1048576

/* Read the fields above from a summary's text; RK_EFORMAT naming `name` and the field. */
int rk_plan_summary_parse(const char *text, size_t len, const char *name, double detect_s,
                          rk_plan_measured *out, rk_err *err);
int rk_plan_summary_load(const char *path, double detect_s, rk_plan_measured *out, rk_err *err);

/* Set c's failure model from a name or parameters, for a fleet of c->gpus_per_host GPUs a
 * host: "llama3", "meta-rsc", "stepfun" (docs/plan.md: the rates, the split between
 * crashes and host losses, and their sources), "exp:SECONDS" (each GPU's MTBF, every failure
 * a crash), "weibull:SHAPE,SCALE_SECONDS" (each GPU, aged `age_s`), "none". RK_EINVAL naming
 * the spec otherwise. "stepfun-trace" is a replay: the caller loads the trace. */
int rk_plan_failures_set(rk_plan_config *c, const char *spec, double age_s, rk_err *err);

/* The job's mean time between failures under c's failure model, with no spare and no
 * repair (exponential rates summed; a Weibull unit counted at its mean life): for the
 * default interval (Daly's at this MTBF). INFINITY without failures. */
double rk_plan_job_mtbf(const rk_plan_config *c);

/* What it costs to run a fleet. */
typedef struct rk_plan_money {
    double price;         /* all cards, once */
    double years;         /* the price is spread over this many years, > 0 */
    double watts;         /* all cards */
    double kwh_price;     /* per kWh, >= 0 */
    double samples_per_s; /* the whole job at full speed, > 0 */
} rk_plan_money;

/* The question: a config, how to sample it, what to sweep, and the money. */
typedef struct rk_plan_query {
    rk_plan_config config;
    uint64_t seed;
    int runs;            /* seeds per estimate, 1 .. 10000 */
    int sweep_ckpt;      /* find the best checkpoint interval */
    int sweep_snap;      /* find the best snapshot interval (memory mode) */
    unsigned spares_max; /* goodput with 0 .. spares_max spare hosts (0: no sweep) */
    rk_plan_money money;
    /* the alternative of new cards: its config (fleet and failures; the job's step time
     * scaled by throughput) and money; has_new 0: none */
    int has_new;
    rk_plan_config new_config;
    rk_plan_money new_money;
} rk_plan_query;

#define RK_PLAN_SPARES_MAX 64

typedef struct rk_plan_answer {
    rk_plan_stats stats;     /* at the config as given */
    double mtbf_s;           /* the job's, as rk_plan_job_mtbf */
    double cost_per_msample; /* per million samples kept */
    rk_plan_best ckpt, snap; /* when swept */
    double spares_goodput[RK_PLAN_SPARES_MAX + 1];
    unsigned spares_n;       /* entries filled: spares_max + 1, or 0 */
    rk_plan_stats new_stats; /* the alternative, when has_new */
    double new_cost_per_msample;
} rk_plan_answer;

/* Answer q: the estimate, the sweeps, the costs. RK_EINVAL for a bad query. */
int rk_plan_answer_query(const rk_plan_query *q, rk_plan_answer *out, rk_err *err);

#endif
