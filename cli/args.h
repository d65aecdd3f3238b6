/*
 * The one parser of command-line values for every rk subcommand. Each kind of value has one
 * syntax and one range, the same in every subcommand:
 *
 *   whole numbers  decimal digits only, an optional '-' where the range allows it: no '+',
 *                  no spaces, no leading zeros ("010"), no fractions ("1.5"), exponents
 *                  ("1e3") or hex ("0x10"); the range is the flag's own (counts) or the
 *                  kind's (seeds 0..2^63-1, steps up to 2^63-1, MHz 1..100000)
 *   numbers        a whole number's digits, then an optional fraction (".5", "0.25") and
 *                  exponent ("1e-4"); finite (no inf, nan, hex floats), in the flag's range
 *                  or the kind's (probability [0, 1], health score [0, 100], watts
 *                  [1, 100000], hours of service [0, 1e6])
 *   durations      a number with an optional unit: 500ms, 5s, 1m, 2h, or bare seconds
 *   paths          only their kind is checked (stat), before any work starts: see rk_path_kind
 *
 * The rk_args_* functions only parse (true when `s` is valid and in range); the rk_arg_*
 * functions parse the value of one flag and, when it is refused, say so — "rk CMD: FLAG 'VALUE'
 * is not ... in RANGE", a blank line and the command's usage on stderr — and return
 * RK_EXIT_USAGE (2); 0 when the value is good.
 */
#ifndef RK_CLI_ARGS_H
#define RK_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "rekindle/health.h"

#define RK_ARG_MHZ_MAX 100000      /* --lock-clocks */
#define RK_ARG_WATTS_MAX 100000.0  /* --power-limit: from 1 W */
#define RK_ARG_HOURS_MAX 1e6       /* --age, --sim-age, --sim-skip: hours of service */
#define RK_ARG_SECONDS_MAX 86400.0 /* a day: intervals and timeouts */

/* The command whose options are parsed: messages start "rk CMD: " and end with its usage. */
typedef struct rk_args {
    const char *cmd;   /* "train", "ckpt export" */
    const char *usage; /* printed after a refusal */
    int quiet;         /* tests: print nothing, keep the message in msg */
    char msg[512];     /* the last refusal, without "rk CMD: " */
} rk_args;

/* ---- parsing only ------------------------------------------------------------------------ */

/* A whole number in [lo, hi]. */
bool rk_args_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* A list of GPU indices, "0,2,5-7", each below max, into idx (room for max; duplicates kept
 * out, the order as given). False for anything else: rk burn and rk tune's --gpu(s). */
bool rk_args_gpu_list(const char *s, int max, int *idx, int *n);
/* A whole number in [0, UINT64_MAX] (a seed). */
bool rk_args_u64(const char *s, uint64_t *out);
/* A finite number in [lo, hi]. */
bool rk_args_real(const char *s, double lo, double hi, double *out);
/* A duration (500ms, 5s, 1m, 2h, bare seconds) in [lo, hi] seconds. */
bool rk_args_seconds(const char *s, double lo, double hi, double *out);

/* ---- one flag's value: 0, or RK_EXIT_USAGE after saying why ------------------------------ */

/* A count, size or index: a whole number in [lo, hi]. */
int rk_arg_count(rk_args *a, const char *flag, const char *s, int lo, int hi, int *out);
/* A number of optimiser steps in [lo, INT64_MAX]. */
int rk_arg_step(rk_args *a, const char *flag, const char *s, int64_t lo, int64_t *out);
/* A seed: a whole number in [0, INT64_MAX] (it is written into JSON, read back as int64). */
int rk_arg_seed(rk_args *a, const char *flag, const char *s, uint64_t *out);
/* A finite number in [lo, hi]. */
int rk_arg_real(rk_args *a, const char *flag, const char *s, double lo, double hi, double *out);
/* rk_arg_real for a command without an rk_args (the older form). */
int rk_cli_number(const char *cmd, const char *usage, const char *flag, const char *s, double lo,
                  double hi, double *out);
/* A probability in [0, 1]. */
int rk_arg_probability(rk_args *a, const char *flag, const char *s, double *out);
/* A health score threshold, in percent: [0, 100]. */
int rk_arg_score(rk_args *a, const char *flag, const char *s, double *out);
/* Hours of service: [0, RK_ARG_HOURS_MAX]. */
int rk_arg_hours(rk_args *a, const char *flag, const char *s, double *out);
/* A duration in [lo, hi] seconds (units as rk_args_seconds). */
int rk_arg_seconds(rk_args *a, const char *flag, const char *s, double lo, double hi, double *out);
/* A clock in MHz: a whole number in [1, RK_ARG_MHZ_MAX]. */
int rk_arg_mhz(rk_args *a, const char *flag, const char *s, unsigned *out);
/* A power in watts: a number in [1, RK_ARG_WATTS_MAX]. */
int rk_arg_watts(rk_args *a, const char *flag, const char *s, double *out);
/* A simulated fleet's load (--sim-load): "idle" or "busy" (docs/sim.md, "Load"). */
int rk_arg_sim_load(rk_args *a, const char *flag, const char *s, rk_sim_load *out);

/* What a path flag needs to find before any work starts. Only the kind is checked (stat); a
 * file's content is its reader's business. */
typedef enum rk_path_kind {
    RK_PATH_DIR,        /* an existing directory: data to read (--data, --textfile-dir) */
    RK_PATH_DIR_OR_NEW, /* a directory, or nothing yet: it is created (mkdir -p), so the
                           nearest part of the path that exists must be a directory
                           (--ckpt-dir, rk predict dataset -o) */
    RK_PATH_FILE,       /* an existing regular file to read (--init, --predictor, --model) */
    RK_PATH_OUTPUT      /* a file to write: a regular file or nothing yet, in an existing,
                           writable directory (--save, --events, --summary-json, -o) */
} rk_path_kind;

/* 0 when `path` is of `kind`; otherwise RK_EXIT_USAGE after one line "rk CMD: FLAG PATH:
 * problem" (no usage: the flag was used right). */
int rk_arg_path(rk_args *a, const char *flag, const char *path, rk_path_kind kind);

/* "rk CMD: <message>", a blank line and the command's usage on stderr; returns
 * RK_EXIT_USAGE. */
__attribute__((format(printf, 3, 4))) int rk_cli_usage_error(const char *cmd, const char *usage,
                                                             const char *fmt, ...);
/* The same for `a` (quiet: only into a->msg). */
__attribute__((format(printf, 2, 3))) int rk_arg_error(rk_args *a, const char *fmt, ...);

#endif
