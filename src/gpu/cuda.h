/*
 * Inside rekindle: the CUDA driver API, loaded with dlopen("libcuda.so.1") and declared with
 * our own few prototypes (no toolkit header, no link dependency on NVIDIA libraries), as
 * health/nvml.c does for NVML. rk burn and the GPU benches use it (docs/gpu.md). Not public API.
 *
 * The library path is libcuda.so.1, or $RK_CUDA_LIB when it is set and the process is not
 * privileged (base/env.h): tests point it at a path that does not exist.
 *
 * Errors carry the driver's own name and text: "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY: out
 * of memory" (RK_ENOMEM for that one, RK_EBACKEND for every other driver error). Without a
 * driver rk_cuda_open gives RK_ENOTSUP and one line: "no CUDA driver (libcuda.so.1 not found):
 * <dlerror>".
 *
 * Threads: one rk_cuda may be shared by every thread; a rk_cuda_ctx (a device's primary
 * context) is used by one thread at a time, which calls rk_cuda_ctx_bind first. Device
 * pointers are uint64_t (CUdeviceptr).
 */
#ifndef RK_GPU_CUDA_H
#define RK_GPU_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"

#define RK_CUDA_LIB_ENV "RK_CUDA_LIB"
#define RK_CUDA_LIB_DEFAULT "libcuda.so.1"

typedef struct rk_cuda rk_cuda;
typedef struct rk_cuda_ctx rk_cuda_ctx;
typedef struct rk_cuda_module rk_cuda_module;
typedef void *rk_cuda_fn;    /* a kernel (CUfunction), valid while its module is loaded */
typedef void *rk_cuda_event; /* CUevent */

/* What a device is (cuDeviceGet*). */
typedef struct rk_cuda_device {
    int ordinal;     /* the driver's index */
    char name[96];   /* "NVIDIA GeForce GTX 1070 Ti" */
    char bus_id[32]; /* "0000:01:00.0" as cuDeviceGetPCIBusId writes it; "" unknown */
    int cc_major;    /* compute capability: 6.1 Pascal, 8.0 A100, 9.0 H100 */
    int cc_minor;
    int sm_count;       /* multiprocessors */
    uint64_t total_mem; /* bytes */
} rk_cuda_device;

/* Load the driver and cuInit(0) it. RK_ENOTSUP when libcuda.so.1 does not load ("no CUDA
 * driver (libcuda.so.1 not found): ..."), lacks an entry point we need, or cuInit finds no
 * device or driver; RK_EBACKEND for another cuInit failure. */
int rk_cuda_open(rk_cuda **out, rk_err *err);
void rk_cuda_close(rk_cuda *c); /* NULL-safe; every context must be closed first */

/* The driver's version (e.g. 12040 for 12.4), 0 unknown. */
int rk_cuda_driver_version(const rk_cuda *c);
/* Devices the driver sees (0 possible). */
int rk_cuda_device_count(rk_cuda *c, int *n, rk_err *err);
int rk_cuda_device_get(rk_cuda *c, int ordinal, rk_cuda_device *out, rk_err *err);

/* Whether two PCI bus ids name the same function: "0000:01:00.0" (CUDA) and
 * "00000000:01:00.0" (NVML) do. Hex, case-insensitive; a missing domain is 0. False when
 * either does not parse. Pure: how burn results are matched to NVML's serials. */
bool rk_cuda_bus_id_equal(const char *a, const char *b);

/* Retain device `ordinal`'s primary context and make it current on the calling thread. */
int rk_cuda_ctx_open(rk_cuda *c, int ordinal, rk_cuda_ctx **out, rk_err *err);
/* Make the context current on the calling thread (a worker thread calls this first). */
int rk_cuda_ctx_bind(rk_cuda_ctx *x, rk_err *err);
void rk_cuda_ctx_close(rk_cuda_ctx *x);        /* releases the primary context; NULL-safe */
int rk_cuda_sync(rk_cuda_ctx *x, rk_err *err); /* cuCtxSynchronize: errors of earlier launches */

/* Memory of the current context's device. */
int rk_cuda_mem_info(rk_cuda_ctx *x, uint64_t *free_bytes, uint64_t *total_bytes, rk_err *err);
int rk_cuda_alloc(rk_cuda_ctx *x, size_t bytes, uint64_t *dptr, rk_err *err);
int rk_cuda_free(rk_cuda_ctx *x, uint64_t dptr, rk_err *err);
int rk_cuda_htod(rk_cuda_ctx *x, uint64_t dst, const void *src, size_t bytes, rk_err *err);
int rk_cuda_dtoh(rk_cuda_ctx *x, void *dst, uint64_t src, size_t bytes, rk_err *err);
int rk_cuda_memset32(rk_cuda_ctx *x, uint64_t dst, uint32_t value, size_t words, rk_err *err);

/* JIT-load PTX text (NUL-terminated). A JIT failure's message carries the driver's error log
 * (the first line of it that fits). */
int rk_cuda_module_load(rk_cuda_ctx *x, const char *ptx, rk_cuda_module **out, rk_err *err);
void rk_cuda_module_unload(rk_cuda_module *m); /* NULL-safe */
/* The kernel `name` (extern "C" in kernels.cu). RK_ENOENT when the module has none. */
int rk_cuda_kernel(rk_cuda_module *m, const char *name, rk_cuda_fn *out, rk_err *err);
/* Launch on the default stream; args as cuLaunchKernel's kernelParams (pointers to each
 * argument). Asynchronous: a fault inside shows at the next sync. */
int rk_cuda_launch(rk_cuda_ctx *x, rk_cuda_fn f, const unsigned grid[3], const unsigned block[3],
                   unsigned shared_bytes, void **args, rk_err *err);

/* Events on the default stream, for timing kernels. */
int rk_cuda_event_create(rk_cuda_ctx *x, rk_cuda_event *out, rk_err *err);
int rk_cuda_event_record(rk_cuda_ctx *x, rk_cuda_event e, rk_err *err);
int rk_cuda_event_sync(rk_cuda_ctx *x, rk_cuda_event e, rk_err *err);
int rk_cuda_event_elapsed_ms(rk_cuda_ctx *x, rk_cuda_event start, rk_cuda_event end, float *ms,
                             rk_err *err);
void rk_cuda_event_destroy(rk_cuda_ctx *x, rk_cuda_event e); /* NULL-safe */

#endif
