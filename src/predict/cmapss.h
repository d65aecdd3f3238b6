/*
 * The predictor's real-data check (docs/predict.md): NASA's C-MAPSS turbofan
 * degradation data, subset FD001, in regression mode (remaining useful life, RUL).
 *
 * Files (space-separated text, one row per engine and cycle, 26 columns: unit, cycle, three
 * operating settings, sensors s1..s21): train_FD001.txt (engines run to failure),
 * test_FD001.txt (engines cut off before failure), RUL_FD001.txt (one line per test engine:
 * its true RUL at its last row).
 *
 * The protocol (rk_cmapss_run), the common one in the literature:
 *   - missing values (the copy in ../shared/data has a few in train_FD001.txt, written NAN,
 *     'N/A', None) are filled by linear interpolation within the engine (rk_cmapss_impute);
 *   - features: the 14 sensors that vary in FD001 (s2 s3 s4 s7 s8 s9 s11 s12 s13 s14 s15 s17
 *     s20 s21), z-scored with statistics of the training windows only;
 *   - target: min(RUL, cap), cap 125 cycles (piece-wise linear degradation);
 *   - windows of T cycles (default 50) ending at every cycle from the 30th on (first_end),
 *     padded at the front by repeating the engine's first row where they would start before
 *     it (an engine shorter than 30 cycles gives one window, ending at its last cycle);
 *   - a validation split by engine (never by time inside an engine) drawn with the seed out of
 *     the training file only; it drives early stopping and every tuning decision;
 *   - the test file is scored once, on each engine's last cycle (padded as above), against
 *     RUL_FD001.txt: RMSE against the values as given, RMSE against the capped values (what
 *     most papers report) and the PHM08 score;
 *   - an ensemble of K models that differ only in their seeds (weights and batch order), their
 *     predictions averaged.
 */
#ifndef RK_PREDICT_CMAPSS_H
#define RK_PREDICT_CMAPSS_H

#include <stddef.h>
#include <stdint.h>

#include "predict/predict.h"
#include "rekindle/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_CMAPSS_COLS 26     /* unit, cycle, 3 settings, 21 sensors */
#define RK_CMAPSS_VALUES 24   /* per row after unit and cycle */
#define RK_CMAPSS_FEATURES 14 /* the sensors used */
#define RK_CMAPSS_MAX_MEMBERS 32
#define RK_CMAPSS_MAX_FILE (256u << 20) /* bytes: larger files are refused */

/* One C-MAPSS file: rows in file order, grouped by engine. */
typedef struct rk_cmapss_table {
    size_t rows;
    int *unit;      /* [rows] engine number as in the file */
    int *cycle;     /* [rows] 1, 2, ... within each engine */
    float *v;       /* [rows][24]: settings 1-3, sensors s1..s21; NaN where missing */
    size_t missing; /* values given as missing (NaN until rk_cmapss_impute) */
    int engines;    /* number of engines */
    size_t *first;  /* [engines + 1]: engine e has rows first[e] .. first[e+1]-1 */
} rk_cmapss_table;

/* Read and check a train_ or test_ file: 26 columns per line; within an engine the cycles
 * count 1, 2, 3, ...; an engine's rows are contiguous and engines appear in increasing order.
 * A value (not the unit or cycle) may be missing, written NaN, NA, N/A, None or null (any
 * case, optionally quoted): it is stored as NaN and counted in `missing`. Anything else that
 * is not a finite number is an error. RK_ENOENT if the file does not exist; RK_EFORMAT naming
 * the file, line, column and problem otherwise. */
int rk_cmapss_read(const char *path, rk_cmapss_table *out, rk_err *err);
/* The same from text in memory (need not be NUL-terminated); `name` labels messages. */
int rk_cmapss_parse(const char *buf, size_t len, const char *name, rk_cmapss_table *out,
                    rk_err *err);
void rk_cmapss_free(rk_cmapss_table *t);

/* Fill missing values: linearly between the nearest values before and after in the same
 * engine and column, or with the nearest one at an engine's start or end. RK_EFORMAT (naming
 * `name`, the unit and column) when an engine has no value at all in a column. */
int rk_cmapss_impute(rk_cmapss_table *t, const char *name, rk_err *err);

/* Read RUL_FD001.txt: exactly `engines` lines (blank lines aside), each a whole number >= 0,
 * into rul[engines]. RK_EFORMAT naming the file and line otherwise. */
int rk_cmapss_read_rul(const char *path, int engines, float *rul, rk_err *err);
int rk_cmapss_parse_rul(const char *buf, size_t len, const char *name, int engines, float *rul,
                        rk_err *err);

/* The sensor columns used (indices into a row's 24 values), in feature order. */
extern const int rk_cmapss_feature_cols[RK_CMAPSS_FEATURES];

typedef struct rk_cmapss_opts {
    const char *dir;      /* holds train_FD001.txt, test_FD001.txt, RUL_FD001.txt */
    int window;           /* T (default 50) */
    int first_end;        /* training and validation windows end at every cycle from this one on;
                             those that would start before the engine are padded (default 30;
                             0: T, no padding) */
    float rul_cap;        /* (default 125) */
    int val_engines;      /* training engines held out for validation (default 20) */
    uint64_t seed;        /* the split; member k uses seed + k for weights and batch order */
    int ensemble;         /* K models, 1..RK_CMAPSS_MAX_MEMBERS (default 5) */
    rk_pred_config model; /* hidden, attn, dense; task, window, features, seed are set */
    rk_pred_train_opts train; /* seed is set per member; on_epoch is passed through */
    int validate_only; /* tuning: train and validate, leave the test set unread (test_* NAN) */
    /* Called after each member is trained (NULL: not called). */
    void (*on_member)(int k, const rk_pred_report *r, double val_rmse, void *ctx);
    void *ctx;
} rk_cmapss_opts;

/* Defaults, chosen on the validation split (docs/predict.md): window 50 with windows ending
 * from cycle 30 on, cap 125, 20 validation engines, seed 1, 5 members, hidden 32, attn 32,
 * dense 32, batch 128, lr 1e-3, at most 30 epochs, patience 5, clip 1, no dropout, noise or
 * weight decay. */
void rk_cmapss_opts_default(rk_cmapss_opts *o);

typedef struct rk_cmapss_member {
    int epochs, best_epoch;
    double val_rmse; /* this member alone, on the validation windows */
    double seconds;
} rk_cmapss_member;

typedef struct rk_cmapss_result {
    int train_engines, val_engines, test_engines;
    size_t train_windows, val_windows;
    int members;
    rk_cmapss_member member[RK_CMAPSS_MAX_MEMBERS];
    double val_rmse;         /* the ensemble on every validation window (capped targets) */
    double test_rmse;        /* the ensemble, last cycle of each test engine, RUL as given */
    double test_rmse_capped; /* the same against min(RUL, cap) */
    double test_score;       /* PHM08: sum of exp(-d/13)-1 (early) or exp(d/10)-1 (late) */
    size_t missing_train, missing_test; /* values given as missing, imputed (see above) */
    int epochs;                         /* summed over members */
    double seconds;                     /* reading, training and scoring */
} rk_cmapss_result;

/* Run the protocol above. RK_ENOENT when a file is missing (the message names it), RK_EFORMAT
 * for a malformed file, RK_EINVAL for bad options; training errors as rk_pred_train. */
int rk_cmapss_run(const rk_cmapss_opts *o, rk_cmapss_result *r, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
