/*
 * Inside rekindle: the burn-in behind `rk burn` (docs/burn.md). Per GPU, a worker thread loads
 * the kernels (gpu/kernels.h) through the driver (gpu/cuda.h) and, until the duration is over,
 * alternates two phases:
 *   - SGEMM: C = A * B computed into many result copies by the tuned kernel variant (autotuned
 *     on first use, cached per GPU model), every copy compared with copy 0 (gpu-burn's rule,
 *     gpu/ref_common.h); the GFLOP/s measured with events;
 *   - memory: one of the memory tests (address lines, own address, moving inversions, random)
 *     over the region the copies occupy, most of --memory of the free memory.
 * The caller's thread samples NVML (temperature, clocks, throttle reasons) once a second and
 * reports progress through a callback. The verdict and the state-file record come from the
 * counts alone (rk_burn_verdict, rk_burn_record_make: pure, unit-tested on the CPU).
 * Not public API.
 */
#ifndef RK_GPU_BURN_H
#define RK_GPU_BURN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda.h"
#include "health/burnstate.h"
#include "health/nvml.h"
#include "rekindle/error.h"
#include "rekindle/health.h"

#define RK_BURN_COPIES_MAX 256 /* result copies per SGEMM round, at most */

/* The memory tests, in the order a burn runs them (one per round, round-robin). */
enum { RK_MT_LINES, RK_MT_OWN, RK_MT_INVERSIONS, RK_MT_RANDOM, RK_MT_TESTS };
/* "address lines", "own address", "moving inversions", "random"; NULL out of range. */
const char *rk_burn_mt_name(int test);

typedef struct rk_burn_opts {
    double duration_s;    /* how long to burn each GPU (> 0) */
    double memory_frac;   /* of the free memory at the start, (0, 1) */
    uint32_t seed;        /* the inputs' and random patterns' seed */
    const char *tune_dir; /* the autotune cache directory, NULL: none (tune every time) */
} rk_burn_opts;

/* What the burn of one GPU found: the counts the verdict is made of. */
typedef struct rk_burn_result {
    bool ran; /* the burn started (setup worked); false: setup_error says why */
    char setup_error[RK_ERR_MSG_MAX]; /* not the card's fault: nothing is recorded */
    double duration_s;                /* of the burn itself, after setup and tuning */
    /* SGEMM */
    char variant[48];                       /* the kernel used */
    bool tuned_now;                         /* autotuned in this run (else from the cache) */
    int n;                                  /* matrix size n x n */
    int copies;                             /* result copies per round */
    uint64_t rounds;                        /* SGEMM rounds compared */
    double gflops;                          /* total flops / total kernel time */
    uint64_t wrong_elements;                /* elements differing from copy 0, all rounds */
    uint8_t copy_wrong[RK_BURN_COPIES_MAX]; /* 1: copy i was wrong at least once */
    /* memory */
    uint64_t mem_bytes;              /* bytes each memory test covers */
    uint64_t mt_passes[RK_MT_TESTS]; /* passes of each test */
    uint64_t mt_bad[RK_MT_TESTS];    /* words found wrong, per test */
    uint64_t mt_first[RK_MT_TESTS];  /* the lowest wrong word (UINT64_MAX none) */
    /* a driver error while running (an illegal address, an ECC error, a lost GPU): a fault */
    char run_error[RK_ERR_MSG_MAX]; /* "" none */
} rk_burn_result;

/* A result with nothing counted yet (mt_first UINT64_MAX). */
void rk_burn_result_init(rk_burn_result *r);

/* The verdict: true (OK) when the burn ran, completed at least one SGEMM round and found no
 * wrong element, no wrong word and no driver error. Otherwise false, and `failed` (cap bytes, cap
 * >= 16) says what failed, e.g. "sgemm: 12 elements wrong in copies 3,7; memory: moving inversions
 * 4 words wrong (first at word 1234)", cut with "..." when it does not fit; "" when OK. */
bool rk_burn_verdict(const rk_burn_result *r, char *failed, size_t cap);

/* The state-file record of a burn that ran: keyed by serial, else uuid (one must be non-empty:
 * RK_EINVAL otherwise), `name` the model, `when` its end (seconds since the epoch). The record
 * passes rk_burn_record_check. RK_EINVAL when the burn did not run. */
int rk_burn_record_make(const rk_burn_result *r, const char *serial, const char *uuid,
                        const char *name, double when, rk_burn_record *out, rk_err *err);

/* ---- the autotune cache (burn_tune.c) -------------------------------------------------------
 * One small text file per GPU model and compute capability in the cache directory:
 *   rekindle-sgemm-tune 1
 *   variant rk_sgemm_128x128x8_8x8
 *   gflops 7123.4
 * Read through the bounded opener (regular file, at most RK_BURN_TUNE_MAX bytes). */
#define RK_BURN_TUNE_MAX 4096
/* The cache directory: $XDG_CACHE_HOME/rekindle (when set, not empty, not privileged), else
 * /var/cache/rekindle for root, else $HOME/.cache/rekindle; "" (false) when none applies. */
bool rk_burn_tune_dir(char *dir, size_t cap);
/* The file for a model: DIR/sgemm-<model, [A-Za-z0-9.-] kept, others '_'>-sm<MAJ><MIN>.tune. */
void rk_burn_tune_path(char *path, size_t cap, const char *dir, const char *model, int cc_major,
                       int cc_minor);
/* Parse a cache file's text: *variant its index in rk_sgemm_variants, *gflops >= 0. RK_EFORMAT
 * naming `file` and the line otherwise. What fuzz_gpu_tune drives. */
int rk_burn_tune_parse(const char *file, const char *text, size_t len, int *variant, double *gflops,
                       rk_err *err);
/* Read the file at path: RK_ENOENT when missing, the opener's and the parser's errors. */
int rk_burn_tune_load(const char *path, int *variant, double *gflops, rk_err *err);
/* Write it atomically, making the directory (and its parent) when missing. */
int rk_burn_tune_save(const char *path, int variant, double gflops, rk_err *err);

/* ---- running a burn (burn.c) --------------------------------------------------------------- */

/* The sizes of a burn with `budget` bytes of device memory: n the largest of 4096, 2048, 1024,
 * 512 for which A, B (n x n floats each) and two result copies fit with 4 KiB to spare; copies
 * as many as fit beside A and B, at most RK_BURN_COPIES_MAX; region the bytes beside A and B
 * (a multiple of 256, holding the copies; the memory tests cover all of it). false when even
 * n = 512 does not fit. Pure. */
bool rk_burn_plan(uint64_t budget, int *n, int *copies, uint64_t *region);

/* One sample of a GPU's telemetry, kept over the burn (every RK_BURN_SERIES_S seconds). */
#define RK_BURN_SERIES_S 5.0
typedef struct rk_burn_point {
    double t;                                /* seconds since the start */
    double temp_c, sm_mhz, mem_mhz, power_w; /* NaN when the card does not report it */
    uint64_t clock_reasons;                  /* NVML's clocks-event reasons bit mask */
} rk_burn_point;

/* One GPU's burn as the caller sees it: who it is, how far it is, what it found. */
typedef struct rk_burn_gpu {
    int ordinal; /* CUDA's index */
    rk_cuda_device dev;
    int nvml_index;   /* NVML's index of the same card (matched by bus id), -1 none */
    rk_gpu_info info; /* NVML's identity (serial, UUID), when matched */
    /* live, updated by the worker (read them in the progress callback with __atomic_load) */
    double progress;   /* 0..1 */
    const char *phase; /* "starting", "tuning", "sgemm", "memory", "done" */
    double gflops_now; /* the last round's rate, 0 before the first */
    bool done;
    /* telemetry, sampled by the caller's thread */
    bool have_sample;
    rk_gpu_sample last;
    double temp_max_c, sm_min_mhz, sm_max_mhz; /* NaN when never reported */
    uint64_t clock_reasons_seen;               /* every reason seen, OR-ed */
    rk_burn_point *series;                     /* every RK_BURN_SERIES_S seconds */
    int series_len, series_cap;
    rk_burn_result result;
} rk_burn_gpu;

typedef void (*rk_burn_progress_fn)(void *ctx, const rk_burn_gpu *gpus, int n, double elapsed_s);

/* Burn the n GPUs of `ordinals` at once (one thread each) as `o` says; nvml (NULL: no
 * telemetry) is sampled once a second on the calling thread, which then calls progress (may
 * be NULL). gpus[n] is filled (free its series with rk_burn_gpus_free). RK_OK when every worker
 * finished, whatever it found (see each result); RK_EINVAL for bad options; RK_ENOMEM. */
int rk_burn_run(rk_cuda *c, rk_nvml *nvml, const rk_burn_opts *o, const int *ordinals, int n,
                rk_burn_progress_fn progress, void *ctx, rk_burn_gpu *gpus, rk_err *err);
void rk_burn_gpus_free(rk_burn_gpu *gpus, int n);

/* NVML's throttle (clocks-event) reasons in words: "none", or "sw_power_cap,hw_slowdown". */
const char *rk_burn_reasons_str(uint64_t reasons, char *buf, size_t cap);

#endif
