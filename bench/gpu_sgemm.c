/*
 * gpu_sgemm: rk burn's SGEMM kernels (src/gpu/kernels.cu, through gpu/cuda.h) against cuBLAS's
 * cublasSgemm_v2 on the same device buffers, same sizes, in the same run (scripts/gpu-check.sh
 * runs it; the goal is ours/cuBLAS >= 0.7). cuBLAS is dlopen'ed (libcublas.so.13/.12/.11/
 * libcublas.so, from the system or /usr/local/cuda/lib64); without it the ratio is skipped.
 * First it checks one variant's result at n = 256 against the host reference (gpu/ref.c,
 * the same fmaf chain: the elements must match exactly) and ours against cuBLAS at every
 * size (max relative difference printed).
 *
 * usage: gpu_sgemm [--device N] [--sizes 1024,2048,4096] [--reps R]
 * Prints a markdown table on stdout; exit 0 done, 1 no GPU or a check failed, 2 bad usage.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda.h"
#include "gpu/kernels.h"
#include "gpu/ref.h"

typedef int (*cublas_create_fn)(void **h);
typedef int (*cublas_destroy_fn)(void *h);
typedef int (*cublas_sgemm_fn)(void *h, int ta, int tb, int m, int n, int k, const float *alpha,
                               const float *a, int lda, const float *b, int ldb, const float *beta,
                               float *c, int ldc);

typedef struct cublas {
    void *lib, *h;
    cublas_create_fn create;
    cublas_destroy_fn destroy;
    cublas_sgemm_fn sgemm;
    char name[128];
} cublas;

static bool cublas_open(cublas *b)
{
    static const char *const libs[] = {
        "libcublas.so.13",
        "libcublas.so.12",
        "libcublas.so.11",
        "libcublas.so",
        "/usr/local/cuda/lib64/libcublas.so.13",
        "/usr/local/cuda/lib64/libcublas.so.12",
        "/usr/local/cuda/lib64/libcublas.so",
    };
    for (size_t i = 0; i < sizeof libs / sizeof libs[0] && !b->lib; i++)
        if ((b->lib = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL)))
            snprintf(b->name, sizeof b->name, "%s", libs[i]);
    if (!b->lib)
        return false;
    void *p = dlsym(b->lib, "cublasCreate_v2"); /* memcpy: ISO C has no object-to-function cast */
    memcpy(&b->create, &p, sizeof p);
    p = dlsym(b->lib, "cublasDestroy_v2");
    memcpy(&b->destroy, &p, sizeof p);
    p = dlsym(b->lib, "cublasSgemm_v2");
    memcpy(&b->sgemm, &p, sizeof p);
    if (!b->create || !b->destroy || !b->sgemm || b->create(&b->h) != 0) {
        fprintf(stderr, "gpu_sgemm: %s: no usable cublasCreate_v2/cublasSgemm_v2\n", b->name);
        dlclose(b->lib);
        b->lib = NULL;
        return false;
    }
    return true;
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        if ((call) < 0) {                                                                          \
            fprintf(stderr, "gpu_sgemm: %s:%d: %s\n", __FILE__, __LINE__, err.msg);                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static rk_err err;
static rk_cuda_ctx *x;
static rk_cuda_event e0, e1;

static void launch(rk_cuda_fn f, int v, uint64_t a, uint64_t b, uint64_t c, int n)
{
    const rk_sgemm_variant *sv = &rk_sgemm_variants[v];
    unsigned grid[3] = {(unsigned)(n / sv->bn), (unsigned)(n / sv->bm), 1};
    unsigned block[3] = {(unsigned)rk_sgemm_variant_threads(sv), 1, 1};
    int m = n, nn = n, k = n;
    void *args[] = {&a, &b, &c, &m, &nn, &k};
    CK(rk_cuda_launch(x, f, grid, block, 0, args, &err));
}

/* Best ms of `reps` timed calls (one untimed first). */
static double time_ours(rk_cuda_fn f, int v, uint64_t a, uint64_t b, uint64_t c, int n, int reps)
{
    double best = INFINITY;
    launch(f, v, a, b, c, n);
    for (int r = 0; r < reps; r++) {
        float ms;
        CK(rk_cuda_event_record(x, e0, &err));
        launch(f, v, a, b, c, n);
        CK(rk_cuda_event_record(x, e1, &err));
        CK(rk_cuda_event_sync(x, e1, &err));
        CK(rk_cuda_event_elapsed_ms(x, e0, e1, &ms, &err));
        best = fmin(best, ms);
    }
    return best;
}

static double time_cublas(cublas *cb, uint64_t a, uint64_t b, uint64_t c, int n, int reps)
{
    const float one = 1, zero = 0;
    double best = INFINITY;
    /* row-major C = A B is column-major C^T = B^T A^T */
    for (int r = 0; r <= reps; r++) {
        float ms;
        CK(rk_cuda_event_record(x, e0, &err));
        if (cb->sgemm(cb->h, 0, 0, n, n, n, &one, (const float *)(uintptr_t)b, n,
                      (const float *)(uintptr_t)a, n, &zero, (float *)(uintptr_t)c, n) != 0) {
            fprintf(stderr, "gpu_sgemm: cublasSgemm_v2 failed at n = %d\n", n);
            exit(1);
        }
        CK(rk_cuda_event_record(x, e1, &err));
        CK(rk_cuda_event_sync(x, e1, &err));
        CK(rk_cuda_event_elapsed_ms(x, e0, e1, &ms, &err));
        if (r > 0)
            best = fmin(best, ms);
    }
    return best;
}

int main(int argc, char **argv)
{
    int dev = 0, reps = 5, sizes[16], nsizes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            dev = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            for (char *p = strtok(argv[++i], ","); p && nsizes < 16; p = strtok(NULL, ","))
                sizes[nsizes++] = atoi(p);
        } else {
            fprintf(stderr, "usage: gpu_sgemm [--device N] [--sizes 1024,2048,4096] [--reps R]\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (!nsizes) {
        sizes[0] = 1024, sizes[1] = 2048, sizes[2] = 4096, sizes[3] = 8192;
        nsizes = 4;
    }
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] < 128 || sizes[i] % 128 || sizes[i] > 16384) {
            fprintf(stderr, "gpu_sgemm: size %d is not a multiple of 128 in 128..16384\n",
                    sizes[i]);
            return 2;
        }
    if (reps < 1 || reps > 1000)
        return 2;
    rk_cuda *c;
    if (rk_cuda_open(&c, &err) < 0) {
        fprintf(stderr, "gpu_sgemm: %s\n", err.msg);
        return 1;
    }
    rk_cuda_device d;
    CK(rk_cuda_device_get(c, dev, &d, &err));
    const char *ptx = rk_gpu_ptx_for(d.cc_major, d.cc_minor);
    if (!ptx) {
        fprintf(stderr, "gpu_sgemm: no kernels for %s (built without them, or cc < 6.1)\n", d.name);
        return 1;
    }
    CK(rk_cuda_ctx_open(c, dev, &x, &err));
    rk_cuda_module *mod;
    CK(rk_cuda_module_load(x, ptx, &mod, &err));
    rk_cuda_fn fill, fn[16];
    CK(rk_cuda_kernel(mod, "rk_fill_input", &fill, &err));
    for (int v = 0; v < rk_sgemm_variant_count && v < 16; v++)
        CK(rk_cuda_kernel(mod, rk_sgemm_variants[v].name, &fn[v], &err));
    CK(rk_cuda_event_create(x, &e0, &err));
    CK(rk_cuda_event_create(x, &e1, &err));
    cublas cb = {0};
    bool have_cublas = cublas_open(&cb);
    int nmax = 0;
    for (int i = 0; i < nsizes; i++)
        nmax = sizes[i] > nmax ? sizes[i] : nmax;
    size_t bytes = (size_t)nmax * nmax * 4;
    uint64_t a, b, co, cc;
    CK(rk_cuda_alloc(x, bytes, &a, &err));
    CK(rk_cuda_alloc(x, bytes, &b, &err));
    CK(rk_cuda_alloc(x, bytes, &co, &err));
    CK(rk_cuda_alloc(x, bytes, &cc, &err));
    int status = 0;
    printf("device: %s (sm_%d%d, %d SMs), cuBLAS: %s\n\n", d.name, d.cc_major, d.cc_minor,
           d.sm_count, have_cublas ? cb.name : "not found (ratio skipped)");

    /* correctness at n = 256: every variant, exact against the host's fmaf chain */
    {
        const int n = 256;
        size_t nn = (size_t)n * n;
        float *ha = malloc(nn * 4), *hb = malloc(nn * 4), *hr = malloc(nn * 4),
              *hg = malloc(nn * 4);
        if (!ha || !hb || !hr || !hg)
            return 1;
        rk_ref_fill_input(ha, nn, 1);
        rk_ref_fill_input(hb, nn, 2);
        rk_ref_sgemm_fma(ha, hb, hr, n, n, n);
        CK(rk_cuda_htod(x, a, ha, nn * 4, &err));
        CK(rk_cuda_htod(x, b, hb, nn * 4, &err));
        for (int v = 0; v < rk_sgemm_variant_count; v++) {
            launch(fn[v], v, a, b, co, n);
            CK(rk_cuda_dtoh(x, hg, co, nn * 4, &err));
            size_t diff = 0;
            for (size_t i = 0; i < nn; i++)
                diff += memcmp(&hg[i], &hr[i], 4) != 0;
            printf("check n=256 %s vs host fmaf chain: %zu of %zu elements differ%s\n",
                   rk_sgemm_variants[v].name, diff, nn, diff ? "  FAIL" : "");
            if (diff)
                status = 1;
        }
        free(ha), free(hb), free(hr), free(hg);
    }
    printf("\n| n | best variant | ours GFLOP/s | cuBLAS GFLOP/s | ours/cuBLAS | max rel diff |\n"
           "|---|---|---|---|---|---|\n");
    uint32_t sa = 1, sb = 2;
    for (int i = 0; i < nsizes; i++) {
        int n = sizes[i];
        uint64_t nn = (uint64_t)n * n;
        unsigned grid[3] = {(unsigned)d.sm_count * 8, 1, 1}, block[3] = {256, 1, 1};
        void *aa[] = {&a, &nn, &sa}, *ba[] = {&b, &nn, &sb};
        CK(rk_cuda_launch(x, fill, grid, block, 0, aa, &err));
        CK(rk_cuda_launch(x, fill, grid, block, 0, ba, &err));
        int best = -1;
        double best_ms = INFINITY;
        for (int v = 0; v < rk_sgemm_variant_count; v++) {
            if (!rk_sgemm_variant_fits(&rk_sgemm_variants[v], n, n, n))
                continue;
            double ms = time_ours(fn[v], v, a, b, co, n, reps);
            if (ms < best_ms)
                best_ms = ms, best = v;
        }
        launch(fn[best], best, a, b, co, n);
        double flop = 2.0 * n * (double)n * n, ours = flop / (best_ms * 1e6);
        if (have_cublas) {
            double ms = time_cublas(&cb, a, b, cc, n, reps), theirs = flop / (ms * 1e6);
            /* max relative difference over a sample of rows */
            float *r1 = malloc((size_t)n * 4 * 8), *r2 = malloc((size_t)n * 4 * 8);
            double md = 0;
            for (int row = 0; r1 && r2 && row < 8; row++) {
                uint64_t off = (uint64_t)(row * (n / 8)) * n * 4;
                CK(rk_cuda_dtoh(x, r1 + (size_t)row * n, co + off, (size_t)n * 4, &err));
                CK(rk_cuda_dtoh(x, r2 + (size_t)row * n, cc + off, (size_t)n * 4, &err));
            }
            for (size_t j = 0; r1 && r2 && j < (size_t)n * 8; j++)
                md = fmax(md, fabs((double)r1[j] - r2[j]) / fmax(fabs((double)r2[j]), 1e-30));
            free(r1), free(r2);
            printf("| %d | %s | %.0f | %.0f | %.2f | %.1e |\n", n, rk_sgemm_variants[best].name,
                   ours, theirs, ours / theirs, md);
            if (!(md < 1e-3))
                status = 1;
        } else {
            printf("| %d | %s | %.0f | - | - | - |\n", n, rk_sgemm_variants[best].name, ours);
        }
        fflush(stdout);
    }
    if (have_cublas)
        cb.destroy(cb.h);
    rk_cuda_module_unload(mod);
    rk_cuda_ctx_close(x);
    rk_cuda_close(c);
    return status;
}
