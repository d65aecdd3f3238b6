/*
 * rk burn's runner (gpu/burn.h): one worker thread per GPU drives the kernels of
 * gpu/kernels.cu through the driver (gpu/cuda.h) — SGEMM into many copies compared with copy
 * 0, then one memory test per round — while the calling thread samples NVML. What the counts
 * mean is decided in burn_verdict.c.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "gpu/burn.h"
#include "gpu/kernels.h"
#include "gpu/ref.h"

#define MT_BLOCK 256u   /* threads per block of the memory and compare kernels */
#define TUNE_REPS 3     /* timed launches per variant when autotuning */
#define BURN_ALIGN 256u /* the copies region's memory-test words start aligned */

/* The live fields are written by the worker and read by the caller's thread: atomically. */
static void set_phase(rk_burn_gpu *g, const char *phase)
{
    __atomic_store_n(&g->phase, phase, __ATOMIC_RELAXED);
}
static void set_progress(rk_burn_gpu *g, double p)
{
    __atomic_store(&g->progress, &p, __ATOMIC_RELAXED);
}

typedef struct worker {
    rk_burn_gpu *g;
    rk_cuda *c;
    const rk_burn_opts *o;
    pthread_t th;
    bool started;
} worker;

typedef struct kern {
    rk_cuda_module *mod;
    rk_cuda_fn fill, compare, sgemm[8];
    rk_cuda_fn lines_w, lines_c, own_w, own_c, mt_fill, mt_check_inv, mt_check, rnd_w, rnd_c;
} kern;

static int load_kernels(rk_cuda_ctx *x, const char *ptx, kern *k, rk_err *err)
{
    int rc = rk_cuda_module_load(x, ptx, &k->mod, err);
    if (rc < 0)
        return rc;
    struct {
        const char *name;
        rk_cuda_fn *fn;
    } t[] = {
        {"rk_fill_input", &k->fill},        {"rk_compare", &k->compare},
        {"rk_mt_lines_write", &k->lines_w}, {"rk_mt_lines_check", &k->lines_c},
        {"rk_mt_own_write", &k->own_w},     {"rk_mt_own_check", &k->own_c},
        {"rk_mt_fill", &k->mt_fill},        {"rk_mt_check_invert", &k->mt_check_inv},
        {"rk_mt_check", &k->mt_check},      {"rk_mt_random_write", &k->rnd_w},
        {"rk_mt_random_check", &k->rnd_c},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if ((rc = rk_cuda_kernel(k->mod, t[i].name, t[i].fn, err)) < 0)
            return rc;
    for (int v = 0; v < rk_sgemm_variant_count && v < 8; v++)
        if ((rc = rk_cuda_kernel(k->mod, rk_sgemm_variants[v].name, &k->sgemm[v], err)) < 0)
            return rc;
    return RK_OK;
}

/* The burn's device buffers. */
typedef struct bufs {
    uint64_t a, b;   /* inputs, n x n */
    uint64_t region; /* the copies, then the rest the memory tests cover */
    uint64_t words;  /* 32-bit words of region */
    uint64_t counts; /* RK_BURN_COPIES_MAX u64: the compare kernel's counts */
    uint64_t res;    /* 2 u64: a memory test's {count, first} */
    rk_cuda_event e0, e1;
} bufs;

static int launch_sgemm(rk_cuda_ctx *x, const kern *k, int v, const bufs *bf, uint64_t c, int n,
                        rk_err *err)
{
    const rk_sgemm_variant *sv = &rk_sgemm_variants[v];
    unsigned grid[3] = {(unsigned)(n / sv->bn), (unsigned)(n / sv->bm), 1};
    unsigned block[3] = {(unsigned)rk_sgemm_variant_threads(sv), 1, 1};
    uint64_t a = bf->a, b = bf->b;
    int m = n, nn = n, kk = n;
    void *args[] = {&a, &b, &c, &m, &nn, &kk};
    return rk_cuda_launch(x, k->sgemm[v], grid, block, 0, args, err);
}

/* Time `reps` launches of variant v into copy 0: ms. */
static int time_variant(rk_cuda_ctx *x, const kern *k, int v, const bufs *bf, int n, int reps,
                        float *ms, rk_err *err)
{
    int rc;
    if ((rc = launch_sgemm(x, k, v, bf, bf->region, n, err)) < 0) /* warm-up */
        return rc;
    if ((rc = rk_cuda_event_record(x, bf->e0, err)) < 0)
        return rc;
    for (int r = 0; r < reps; r++)
        if ((rc = launch_sgemm(x, k, v, bf, bf->region, n, err)) < 0)
            return rc;
    if ((rc = rk_cuda_event_record(x, bf->e1, err)) < 0 ||
        (rc = rk_cuda_event_sync(x, bf->e1, err)) < 0)
        return rc;
    return rk_cuda_event_elapsed_ms(x, bf->e0, bf->e1, ms, err);
}

static int mt_grid(const rk_burn_gpu *g)
{
    return (g->dev.sm_count > 0 ? g->dev.sm_count : 16) * 8;
}

/* Reset a memory test's {count, first} pair: count 0, first all ones. */
static int res_reset(rk_cuda_ctx *x, const bufs *bf, rk_err *err)
{
    int rc = rk_cuda_memset32(x, bf->res, 0, 2, err);
    if (rc == RK_OK)
        rc = rk_cuda_memset32(x, bf->res + 8, 0xffffffffu, 2, err);
    return rc;
}

static int res_add(rk_cuda_ctx *x, const bufs *bf, rk_burn_result *r, int test, rk_err *err)
{
    uint64_t res[2];
    int rc = rk_cuda_dtoh(x, res, bf->res, sizeof res, err);
    if (rc < 0)
        return rc;
    r->mt_bad[test] += res[0];
    if (res[0] && res[1] < r->mt_first[test])
        r->mt_first[test] = res[1];
    return RK_OK;
}

/* One pass of memory test `test` over the region. */
static int memtest(rk_cuda_ctx *x, const kern *k, const rk_burn_gpu *g, const bufs *bf, int test,
                   uint32_t seed, rk_burn_result *r, rk_err *err)
{
    unsigned grid[3] = {(unsigned)mt_grid(g), 1, 1}, block[3] = {MT_BLOCK, 1, 1};
    uint64_t p = bf->region, n = bf->words, base = bf->region, res = bf->res;
    int rc = res_reset(x, bf, err);
    if (rc < 0)
        return rc;
    switch (test) {
    case RK_MT_LINES: {
        void *wa[] = {&p, &n}, *ca[] = {&p, &n, &res};
        if ((rc = rk_cuda_launch(x, k->lines_w, grid, block, 0, wa, err)) < 0 ||
            (rc = rk_cuda_launch(x, k->lines_c, grid, block, 0, ca, err)) < 0)
            return rc;
        break;
    }
    case RK_MT_OWN: {
        void *wa[] = {&p, &n, &base}, *ca[] = {&p, &n, &base, &res};
        if ((rc = rk_cuda_launch(x, k->own_w, grid, block, 0, wa, err)) < 0 ||
            (rc = rk_cuda_launch(x, k->own_c, grid, block, 0, ca, err)) < 0)
            return rc;
        break;
    }
    case RK_MT_INVERSIONS:
        for (int i = 0; i < RK_MT_INVERSION_PATTERNS; i++) {
            uint32_t pat = rk_mt_inversion_pattern(i), inv = ~pat;
            void *fa[] = {&p, &n, &pat}, *ia[] = {&p, &n, &pat, &res}, *ca[] = {&p, &n, &inv, &res};
            if ((rc = rk_cuda_launch(x, k->mt_fill, grid, block, 0, fa, err)) < 0 ||
                (rc = rk_cuda_launch(x, k->mt_check_inv, grid, block, 0, ia, err)) < 0 ||
                (rc = rk_cuda_launch(x, k->mt_check, grid, block, 0, ca, err)) < 0)
                return rc;
        }
        break;
    default: {
        void *wa[] = {&p, &n, &seed}, *ca[] = {&p, &n, &seed, &res};
        if ((rc = rk_cuda_launch(x, k->rnd_w, grid, block, 0, wa, err)) < 0 ||
            (rc = rk_cuda_launch(x, k->rnd_c, grid, block, 0, ca, err)) < 0)
            return rc;
        break;
    }
    }
    if ((rc = res_add(x, bf, r, test, err)) < 0)
        return rc;
    r->mt_passes[test]++;
    return RK_OK;
}

/* One SGEMM round: every copy computed, then compared with copy 0. */
static int sgemm_round(rk_cuda_ctx *x, const kern *k, rk_burn_gpu *g, const bufs *bf, int v,
                       double *flops, double *ms_total, rk_err *err)
{
    rk_burn_result *r = &g->result;
    int n = r->n, rc;
    uint64_t nn = (uint64_t)n * (uint64_t)n;
    if ((rc = rk_cuda_event_record(x, bf->e0, err)) < 0)
        return rc;
    for (int c = 0; c < r->copies; c++)
        if ((rc = launch_sgemm(x, k, v, bf, bf->region + (uint64_t)c * nn * 4, n, err)) < 0)
            return rc;
    float ms = 0;
    if ((rc = rk_cuda_event_record(x, bf->e1, err)) < 0 ||
        (rc = rk_cuda_event_sync(x, bf->e1, err)) < 0 ||
        (rc = rk_cuda_event_elapsed_ms(x, bf->e0, bf->e1, &ms, err)) < 0)
        return rc;
    double f = 2.0 * n * (double)n * n * r->copies;
    *flops += f;
    *ms_total += ms;
    double now = ms > 0 ? f / (ms * 1e6) : 0;
    __atomic_store(&g->gflops_now, &now, __ATOMIC_RELAXED);
    if ((rc = rk_cuda_memset32(x, bf->counts, 0, 2 * RK_BURN_COPIES_MAX, err)) < 0)
        return rc;
    unsigned grid[3] = {(unsigned)mt_grid(g), 1, 1}, block[3] = {MT_BLOCK, 1, 1};
    uint64_t cp = bf->region, cn = nn, counts = bf->counts;
    int copies = r->copies;
    float tol = RK_CMP_TOLERANCE;
    void *args[] = {&cp, &cn, &copies, &tol, &counts};
    if ((rc = rk_cuda_launch(x, k->compare, grid, block, 0, args, err)) < 0)
        return rc;
    uint64_t bad[RK_BURN_COPIES_MAX];
    if ((rc = rk_cuda_dtoh(x, bad, bf->counts, sizeof(uint64_t) * (size_t)copies, err)) < 0)
        return rc;
    for (int c = 1; c < copies; c++)
        if (bad[c]) {
            r->wrong_elements += bad[c];
            r->copy_wrong[c] = 1;
        }
    r->rounds++;
    return RK_OK;
}

/* Pick the variant: from the cache, else the fastest of those that fit n (saved). */
static int pick_variant(rk_cuda_ctx *x, const kern *k, rk_burn_gpu *g, const bufs *bf,
                        const rk_burn_opts *o, int *variant, rk_err *err)
{
    rk_burn_result *r = &g->result;
    char path[1024] = "";
    if (o->tune_dir && o->tune_dir[0]) {
        rk_burn_tune_path(path, sizeof path, o->tune_dir, g->dev.name, g->dev.cc_major,
                          g->dev.cc_minor);
        double gf;
        rk_err e2 = {0};
        if (rk_burn_tune_load(path, variant, &gf, &e2) == RK_OK &&
            rk_sgemm_variant_fits(&rk_sgemm_variants[*variant], r->n, r->n, r->n))
            return RK_OK;
    }
    set_phase(g, "tuning");
    int best = -1;
    double best_gf = 0;
    for (int v = 0; v < rk_sgemm_variant_count && v < 8; v++) {
        if (!rk_sgemm_variant_fits(&rk_sgemm_variants[v], r->n, r->n, r->n))
            continue;
        float ms = 0;
        int rc = time_variant(x, k, v, bf, r->n, TUNE_REPS, &ms, err);
        if (rc < 0)
            return rc;
        double gf = ms > 0 ? 2.0 * r->n * (double)r->n * r->n * TUNE_REPS / (ms * 1e6) : 0;
        if (best < 0 || gf > best_gf) {
            best = v;
            best_gf = gf;
        }
    }
    if (best < 0)
        return rk_err_set(err, RK_EINVAL, "no SGEMM variant fits n = %d", r->n);
    *variant = best;
    r->tuned_now = true;
    if (path[0]) {
        rk_err e2 = {0};
        (void)rk_burn_tune_save(path, best, best_gf, &e2); /* a cache that cannot be written
                                                              only costs the next run a tune */
    }
    return RK_OK;
}

bool rk_burn_plan(uint64_t budget, int *n, int *copies, uint64_t *region)
{
    static const int sizes[] = {4096, 2048, 1024, 512};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t mat = (uint64_t)sizes[i] * sizes[i] * 4;
        if (budget < 4 * mat + 4096)
            continue;
        uint64_t rest = budget - 2 * mat - 4096;
        uint64_t c = rest / mat;
        *n = sizes[i];
        *copies = c > RK_BURN_COPIES_MAX ? RK_BURN_COPIES_MAX : (int)c;
        *region = rest & ~(uint64_t)(BURN_ALIGN - 1);
        return true;
    }
    return false;
}

static void burn_one(worker *w, rk_err *err)
{
    rk_burn_gpu *g = w->g;
    rk_burn_result *r = &g->result;
    const rk_burn_opts *o = w->o;
    rk_cuda_ctx *x = NULL;
    kern k = {0};
    bufs bf = {0};
    double t0 = rk_mono_s();
    int rc, variant = 0;
    const char *ptx = rk_gpu_ptx_for(g->dev.cc_major, g->dev.cc_minor);
    if (!rk_gpu_kernels_built) {
        snprintf(r->setup_error, sizeof r->setup_error, "built without GPU kernels");
        return;
    }
    if (!ptx) {
        snprintf(r->setup_error, sizeof r->setup_error,
                 "compute capability %d.%d is older than the kernels' 6.1", g->dev.cc_major,
                 g->dev.cc_minor);
        return;
    }
    if ((rc = rk_cuda_ctx_open(w->c, g->ordinal, &x, err)) < 0 ||
        (rc = load_kernels(x, ptx, &k, err)) < 0)
        goto setup_failed;
    uint64_t free_b = 0, total_b = 0;
    if ((rc = rk_cuda_mem_info(x, &free_b, &total_b, err)) < 0)
        goto setup_failed;
    uint64_t region = 0;
    if (!rk_burn_plan((uint64_t)((double)free_b * o->memory_frac), &r->n, &r->copies, &region)) {
        rk_err_set(err, RK_ENOMEM, "%.0f%% of the free %llu MiB is too little to burn",
                   o->memory_frac * 100, (unsigned long long)(free_b >> 20));
        goto setup_failed;
    }
    uint64_t mat = (uint64_t)r->n * (uint64_t)r->n * 4;
    if ((rc = rk_cuda_alloc(x, mat, &bf.a, err)) < 0 ||
        (rc = rk_cuda_alloc(x, mat, &bf.b, err)) < 0 ||
        (rc = rk_cuda_alloc(x, region, &bf.region, err)) < 0 ||
        (rc = rk_cuda_alloc(x, 8 * RK_BURN_COPIES_MAX, &bf.counts, err)) < 0 ||
        (rc = rk_cuda_alloc(x, 16, &bf.res, err)) < 0 ||
        (rc = rk_cuda_event_create(x, &bf.e0, err)) < 0 ||
        (rc = rk_cuda_event_create(x, &bf.e1, err)) < 0)
        goto setup_failed;
    bf.words = region / 4;
    r->mem_bytes = region;
    {
        unsigned grid[3] = {(unsigned)mt_grid(g), 1, 1}, block[3] = {MT_BLOCK, 1, 1};
        uint64_t nn = (uint64_t)r->n * r->n;
        uint32_t sa = o->seed, sb = o->seed ^ 0x9e3779b9u;
        void *aa[] = {&bf.a, &nn, &sa}, *ba[] = {&bf.b, &nn, &sb};
        if ((rc = rk_cuda_launch(x, k.fill, grid, block, 0, aa, err)) < 0 ||
            (rc = rk_cuda_launch(x, k.fill, grid, block, 0, ba, err)) < 0 ||
            (rc = rk_cuda_sync(x, err)) < 0)
            goto setup_failed;
    }
    if ((rc = pick_variant(x, &k, g, &bf, o, &variant, err)) < 0)
        goto run_failed; /* a kernel that faults while tuning is the card's fault */
    snprintf(r->variant, sizeof r->variant, "%s", rk_sgemm_variants[variant].name);
    r->ran = true;
    t0 = rk_mono_s(); /* the duration is the burn's: setup and tuning come before it */
    {
        double flops = 0, ms = 0;
        int test = 0;
        uint32_t seed = o->seed;
        while (rk_mono_s() - t0 < o->duration_s) {
            set_phase(g, "sgemm");
            if ((rc = sgemm_round(x, &k, g, &bf, variant, &flops, &ms, err)) < 0)
                goto run_failed;
            r->gflops = ms > 0 ? flops / (ms * 1e6) : 0;
            set_progress(g, fmin(1.0, (rk_mono_s() - t0) / o->duration_s));
            set_phase(g, "memory"); /* every round has both halves: at least one of each */
            if ((rc = memtest(x, &k, g, &bf, test, seed++, r, err)) < 0)
                goto run_failed;
            test = (test + 1) % RK_MT_TESTS;
            set_progress(g, fmin(1.0, (rk_mono_s() - t0) / o->duration_s));
        }
        if ((rc = rk_cuda_sync(x, err)) < 0)
            goto run_failed;
    }
    goto done;
setup_failed:
    snprintf(r->setup_error, sizeof r->setup_error, "%s", err->msg);
    goto done;
run_failed:
    r->ran = true;
    snprintf(r->run_error, sizeof r->run_error, "%s", err->msg);
done:
    if (x) {
        rk_err e2 = {0};
        rk_cuda_event_destroy(x, bf.e0);
        rk_cuda_event_destroy(x, bf.e1);
        uint64_t ptrs[] = {bf.a, bf.b, bf.region, bf.counts, bf.res};
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
            if (ptrs[i])
                (void)rk_cuda_free(x, ptrs[i], &e2);
        rk_cuda_module_unload(k.mod);
        rk_cuda_ctx_close(x);
    }
    r->duration_s = rk_mono_s() - t0;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    rk_err err = {0};
    set_phase(w->g, "starting");
    burn_one(w, &err);
    set_phase(w->g, "done");
    set_progress(w->g, 1.0);
    __atomic_store_n(&w->g->done, true, __ATOMIC_RELEASE);
    return NULL;
}

static void sample(rk_nvml *nvml, rk_burn_gpu *g, double elapsed)
{
    rk_err err = {0};
    rk_gpu_sample s;
    if (!nvml || g->nvml_index < 0 || rk_nvml_read(nvml, g->nvml_index, &s, &err) < 0 || s.lost)
        return;
    g->last = s;
    g->have_sample = true;
    if (rk_field_valid(&s, RK_F_TEMP))
        g->temp_max_c = isnan(g->temp_max_c) ? s.temp_c : fmax(g->temp_max_c, s.temp_c);
    const char *phase = __atomic_load_n(&g->phase, __ATOMIC_RELAXED);
    if (rk_field_valid(&s, RK_F_SM_CLOCK) && phase && strcmp(phase, "starting") != 0) {
        g->sm_min_mhz = isnan(g->sm_min_mhz) ? s.sm_mhz : fmin(g->sm_min_mhz, s.sm_mhz);
        g->sm_max_mhz = isnan(g->sm_max_mhz) ? s.sm_mhz : fmax(g->sm_max_mhz, s.sm_mhz);
    }
    if (rk_field_valid(&s, RK_F_CLOCK_REASONS))
        g->clock_reasons_seen |= s.clock_reasons & ~RK_CLOCK_GPU_IDLE;
    double next = g->series_len ? g->series[g->series_len - 1].t + RK_BURN_SERIES_S : 0;
    if (elapsed + 1e-9 < next)
        return;
    if (g->series_len == g->series_cap) {
        int cap = g->series_cap ? 2 * g->series_cap : 64;
        rk_burn_point *p = realloc(g->series, sizeof *p * (size_t)cap);
        if (!p)
            return;
        g->series = p;
        g->series_cap = cap;
    }
    rk_burn_point *p = &g->series[g->series_len++];
    p->t = elapsed;
    p->temp_c = rk_field_valid(&s, RK_F_TEMP) ? s.temp_c : NAN;
    p->sm_mhz = rk_field_valid(&s, RK_F_SM_CLOCK) ? s.sm_mhz : NAN;
    p->mem_mhz = rk_field_valid(&s, RK_F_MEM_CLOCK) ? s.mem_mhz : NAN;
    p->power_w = rk_field_valid(&s, RK_F_POWER) ? s.power_w : NAN;
    p->clock_reasons = rk_field_valid(&s, RK_F_CLOCK_REASONS) ? s.clock_reasons : 0;
}

int rk_burn_run(rk_cuda *c, rk_nvml *nvml, const rk_burn_opts *o, const int *ordinals, int n,
                rk_burn_progress_fn progress, void *ctx, rk_burn_gpu *gpus, rk_err *err)
{
    if (!c || !o || !ordinals || !gpus || n <= 0 || !(o->duration_s > 0) ||
        !(o->memory_frac > 0 && o->memory_frac < 1))
        return rk_err_set(err, RK_EINVAL, "rk_burn_run: bad options");
    memset(gpus, 0, sizeof *gpus * (size_t)n);
    worker *w = calloc((size_t)n, sizeof *w);
    if (!w)
        return rk_err_set(err, RK_ENOMEM, "rk_burn_run: out of memory");
    int nv = nvml ? rk_nvml_count(nvml) : 0;
    for (int i = 0; i < n; i++) {
        rk_burn_gpu *g = &gpus[i];
        g->ordinal = ordinals[i];
        g->nvml_index = -1;
        g->phase = "starting";
        g->temp_max_c = g->sm_min_mhz = g->sm_max_mhz = NAN;
        rk_burn_result_init(&g->result);
        int rc = rk_cuda_device_get(c, ordinals[i], &g->dev, err);
        if (rc < 0) {
            free(w);
            return rc;
        }
        for (int j = 0; j < nv; j++) {
            rk_gpu_info info;
            if (rk_nvml_info(nvml, j, &info) == RK_OK &&
                rk_cuda_bus_id_equal(g->dev.bus_id, info.bus_id)) {
                g->nvml_index = j;
                g->info = info;
                break;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        w[i] = (worker){.g = &gpus[i], .c = c, .o = o};
        if (pthread_create(&w[i].th, NULL, worker_main, &w[i]) == 0) {
            w[i].started = true;
        } else {
            snprintf(gpus[i].result.setup_error, sizeof gpus[i].result.setup_error,
                     "cannot start a worker thread");
            gpus[i].done = true;
        }
    }
    double t0 = rk_mono_s();
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; i++)
            all &= __atomic_load_n(&gpus[i].done, __ATOMIC_ACQUIRE);
        double el = rk_mono_s() - t0;
        for (int i = 0; i < n; i++)
            sample(nvml, &gpus[i], el);
        if (progress)
            progress(ctx, gpus, n, el);
        if (all)
            break;
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < n; i++)
        if (w[i].started)
            pthread_join(w[i].th, NULL);
    free(w);
    return RK_OK;
}

void rk_burn_gpus_free(rk_burn_gpu *gpus, int n)
{
    for (int i = 0; gpus && i < n; i++) {
        free(gpus[i].series);
        gpus[i].series = NULL;
        gpus[i].series_len = gpus[i].series_cap = 0;
    }
}
