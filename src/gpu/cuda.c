/*
 * The CUDA driver API behind gpu/cuda.h: libcuda.so.1 opened with dlopen, each entry point
 * looked up with dlsym (the _v2 names the toolkit's cuda.h maps to, newest first), declared
 * with our own prototypes checked against /usr/local/cuda/include/cuda.h. Errors carry the
 * driver's cuGetErrorName and cuGetErrorString. Relies on libdl; never prints or exits.
 */
#include "gpu/cuda.h"
#include "base/env.h"
#include "base/text.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "dlsym results fit a function pointer");

/* ---- our own declarations of the driver API (cuda.h's types, by value) ----------------- */

typedef int CUresult;                   /* CUDA_SUCCESS = 0 */
typedef int CUdevice;                   /* an ordinal */
typedef unsigned long long CUdeviceptr; /* 64-bit device address */
typedef void *CUcontext, *CUmodule, *CUfunction, *CUevent, *CUstream;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NO_DEVICE 100
/* CUdevice_attribute */
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
/* CUjit_option */
#define CU_JIT_INFO_LOG_BUFFER 3
#define CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES 4
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6
#define CU_EVENT_DEFAULT 0

typedef struct cuda_fns {
    CUresult (*init)(unsigned flags);
    CUresult (*driver_version)(int *v);
    CUresult (*error_name)(CUresult e, const char **s);
    CUresult (*error_string)(CUresult e, const char **s);
    CUresult (*device_get)(CUdevice *d, int ordinal);
    CUresult (*device_count)(int *n);
    CUresult (*device_name)(char *name, int len, CUdevice d);
    CUresult (*device_attr)(int *v, int attrib, CUdevice d);
    CUresult (*device_total_mem)(size_t *bytes, CUdevice d);
    CUresult (*device_bus_id)(char *bus, int len, CUdevice d);
    CUresult (*primary_retain)(CUcontext *ctx, CUdevice d);
    CUresult (*primary_release)(CUdevice d);
    CUresult (*ctx_set_current)(CUcontext ctx);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
    CUresult (*mem_alloc)(CUdeviceptr *p, size_t bytes);
    CUresult (*mem_free)(CUdeviceptr p);
    CUresult (*htod)(CUdeviceptr dst, const void *src, size_t bytes);
    CUresult (*dtoh)(void *dst, CUdeviceptr src, size_t bytes);
    CUresult (*memset32)(CUdeviceptr dst, unsigned value, size_t n);
    CUresult (*module_load)(CUmodule *m, const void *image, unsigned nopt, int *opts, void **vals);
    CUresult (*module_unload)(CUmodule m);
    CUresult (*module_function)(CUfunction *f, CUmodule m, const char *name);
    CUresult (*launch)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shared, CUstream s, void **params,
                       void **extra);
    CUresult (*event_create)(CUevent *e, unsigned flags);
    CUresult (*event_record)(CUevent e, CUstream s);
    CUresult (*event_synchronize)(CUevent e);
    CUresult (*event_elapsed)(float *ms, CUevent start, CUevent end);
    CUresult (*event_destroy)(CUevent e);
} cuda_fns;

typedef struct sym_spec {
    size_t off;
    const char *names[3]; /* newest first; every entry point here is required */
} sym_spec;

#define SYM(field, ...)                                                                            \
    {                                                                                              \
        offsetof(cuda_fns, field),                                                                 \
        {                                                                                          \
            __VA_ARGS__, NULL                                                                      \
        }                                                                                          \
    }
static const sym_spec syms[] = {
    SYM(init, "cuInit"),
    SYM(driver_version, "cuDriverGetVersion"),
    SYM(error_name, "cuGetErrorName"),
    SYM(error_string, "cuGetErrorString"),
    SYM(device_get, "cuDeviceGet"),
    SYM(device_count, "cuDeviceGetCount"),
    SYM(device_name, "cuDeviceGetName"),
    SYM(device_attr, "cuDeviceGetAttribute"),
    SYM(device_total_mem, "cuDeviceTotalMem_v2"),
    SYM(device_bus_id, "cuDeviceGetPCIBusId"),
    SYM(primary_retain, "cuDevicePrimaryCtxRetain"),
    SYM(primary_release, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
    SYM(ctx_set_current, "cuCtxSetCurrent"),
    SYM(ctx_synchronize, "cuCtxSynchronize"),
    SYM(mem_get_info, "cuMemGetInfo_v2"),
    SYM(mem_alloc, "cuMemAlloc_v2"),
    SYM(mem_free, "cuMemFree_v2"),
    SYM(htod, "cuMemcpyHtoD_v2"),
    SYM(dtoh, "cuMemcpyDtoH_v2"),
    SYM(memset32, "cuMemsetD32_v2"),
    SYM(module_load, "cuModuleLoadDataEx"),
    SYM(module_unload, "cuModuleUnload"),
    SYM(module_function, "cuModuleGetFunction"),
    SYM(launch, "cuLaunchKernel"),
    SYM(event_create, "cuEventCreate"),
    SYM(event_record, "cuEventRecord"),
    SYM(event_synchronize, "cuEventSynchronize"),
    SYM(event_elapsed, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    SYM(event_destroy, "cuEventDestroy_v2", "cuEventDestroy"),
};
#undef SYM

struct rk_cuda {
    void *lib;
    cuda_fns f;
    int version;
};

struct rk_cuda_ctx {
    rk_cuda *c;
    CUdevice dev;
    CUcontext ctx;
};

struct rk_cuda_module {
    rk_cuda *c;
    CUmodule mod;
};

/* ---- errors -------------------------------------------------------------------------------- */

/* "what: CUDA_ERROR_X: text" into err; RK_ENOMEM for out of memory, else RK_EBACKEND. */
static int cu_fail(const rk_cuda *c, CUresult rc, rk_err *err, const char *what)
{
    const char *name = NULL, *text = NULL;
    if (c->f.error_name(rc, &name) != CUDA_SUCCESS || !name)
        name = "CUDA_ERROR_UNKNOWN";
    if (c->f.error_string(rc, &text) != CUDA_SUCCESS || !text)
        text = "unknown error";
    return rk_err_set(err, rc == CUDA_ERROR_OUT_OF_MEMORY ? RK_ENOMEM : RK_EBACKEND,
                      "%s: %s: %s (%d)", what, name, text, rc);
}

#define CU(c, call, err, what)                                                                     \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS)                                                                   \
            return cu_fail((c), rc_, (err), (what));                                               \
    } while (0)

/* ---- open, devices ------------------------------------------------------------------------- */

int rk_cuda_open(rk_cuda **out, rk_err *err)
{
    *out = NULL;
    const char *path = rk_env_override(RK_CUDA_LIB_ENV);
    if (!path || !*path)
        path = RK_CUDA_LIB_DEFAULT;
    rk_cuda *c = calloc(1, sizeof *c);
    if (!c)
        return rk_err_set(err, RK_ENOMEM, "out of memory");
    dlerror();
    c->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!c->lib) {
        const char *why = dlerror();
        char shown[256];
        rk_text_clean(shown, sizeof shown, why ? why : "dlopen failed");
        free(c);
        return rk_err_set(err, RK_ENOTSUP, "no CUDA driver (%s not found): %s", path, shown);
    }
    for (size_t k = 0; k < sizeof syms / sizeof syms[0]; k++) {
        void *p = NULL;
        for (int j = 0; !p && syms[k].names[j]; j++)
            p = dlsym(c->lib, syms[k].names[j]);
        if (!p) {
            int rc = rk_err_set(err, RK_ENOTSUP, "no CUDA driver: %s has no %s (driver too old?)",
                                path, syms[k].names[0]);
            rk_cuda_close(c);
            return rc;
        }
        memcpy((char *)&c->f + syms[k].off, &p, sizeof p);
    }
    CUresult rc = c->f.init(0);
    if (rc != CUDA_SUCCESS) {
        rk_err e;
        int code = cu_fail(c, rc, &e, "cuInit");
        if (rc == CUDA_ERROR_NO_DEVICE || rc == 35 /* INSUFFICIENT_DRIVER */ ||
            rc == 999 /* UNKNOWN: no kernel module */)
            code = RK_ENOTSUP;
        rk_err_set(err, code, "no usable CUDA driver: %s", e.msg);
        rk_cuda_close(c);
        return code;
    }
    if (c->f.driver_version(&c->version) != CUDA_SUCCESS)
        c->version = 0;
    *out = c;
    return RK_OK;
}

void rk_cuda_close(rk_cuda *c)
{
    if (!c)
        return;
    if (c->lib)
        dlclose(c->lib);
    free(c);
}

int rk_cuda_driver_version(const rk_cuda *c)
{
    return c ? c->version : 0;
}

int rk_cuda_device_count(rk_cuda *c, int *n, rk_err *err)
{
    *n = 0;
    CUresult rc = c->f.device_count(n);
    if (rc == CUDA_ERROR_NO_DEVICE) {
        *n = 0;
        return RK_OK;
    }
    if (rc != CUDA_SUCCESS)
        return cu_fail(c, rc, err, "cuDeviceGetCount");
    return RK_OK;
}

int rk_cuda_device_get(rk_cuda *c, int ordinal, rk_cuda_device *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    CUdevice d;
    CU(c, c->f.device_get(&d, ordinal), err, "cuDeviceGet");
    out->ordinal = ordinal;
    char buf[256] = "";
    CU(c, c->f.device_name(buf, (int)sizeof buf - 1, d), err, "cuDeviceGetName");
    rk_text_clean(out->name, sizeof out->name, buf);
    buf[0] = '\0';
    if (c->f.device_bus_id(buf, (int)sizeof buf - 1, d) == CUDA_SUCCESS)
        rk_text_clean(out->bus_id, sizeof out->bus_id, buf);
    CU(c, c->f.device_attr(&out->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d), err,
       "cuDeviceGetAttribute");
    CU(c, c->f.device_attr(&out->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d), err,
       "cuDeviceGetAttribute");
    CU(c, c->f.device_attr(&out->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d), err,
       "cuDeviceGetAttribute");
    size_t total = 0;
    CU(c, c->f.device_total_mem(&total, d), err, "cuDeviceTotalMem_v2");
    out->total_mem = total;
    return RK_OK;
}

/* 1..max hex digits at *p into *v, *p moved past them; false when there are none or more. */
static bool hex_field(const char **p, int max, unsigned long *v)
{
    int digits = 0;
    *v = 0;
    while (isxdigit((unsigned char)**p)) {
        if (++digits > max)
            return false;
        int ch = tolower((unsigned char)*(*p)++);
        *v = *v * 16 + (unsigned long)(ch <= '9' ? ch - '0' : ch - 'a' + 10);
    }
    return digits > 0;
}

/* "[domain:]bus:device.function" (hex: domain up to 8 digits, bus and device up to 2, the
 * function 1) into v[4]. */
static bool parse_bus_id(const char *s, unsigned long v[4])
{
    if (!s)
        return false;
    const char *p = s;
    unsigned long x, y;
    if (!hex_field(&p, 8, &x) || *p++ != ':' || !hex_field(&p, 2, &y))
        return false;
    if (*p == ':') { /* domain:bus:device.function */
        p++;
        v[0] = x, v[1] = y;
        if (!hex_field(&p, 2, &v[2]))
            return false;
    } else { /* bus:device.function */
        if (x > 0xff)
            return false;
        v[0] = 0, v[1] = x, v[2] = y;
    }
    return *p++ == '.' && hex_field(&p, 1, &v[3]) && *p == '\0';
}

bool rk_cuda_bus_id_equal(const char *a, const char *b)
{
    unsigned long x[4], y[4];
    if (!parse_bus_id(a, x) || !parse_bus_id(b, y))
        return false;
    return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

/* ---- contexts and memory ------------------------------------------------------------------- */

int rk_cuda_ctx_open(rk_cuda *c, int ordinal, rk_cuda_ctx **out, rk_err *err)
{
    *out = NULL;
    rk_cuda_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return rk_err_set(err, RK_ENOMEM, "out of memory");
    x->c = c;
    CUresult rc = c->f.device_get(&x->dev, ordinal);
    if (rc == CUDA_SUCCESS)
        rc = c->f.primary_retain(&x->ctx, x->dev);
    if (rc != CUDA_SUCCESS) {
        free(x);
        return cu_fail(c, rc, err, "cuDevicePrimaryCtxRetain");
    }
    int st = rk_cuda_ctx_bind(x, err);
    if (st != RK_OK) {
        rk_cuda_ctx_close(x);
        return st;
    }
    *out = x;
    return RK_OK;
}

int rk_cuda_ctx_bind(rk_cuda_ctx *x, rk_err *err)
{
    CU(x->c, x->c->f.ctx_set_current(x->ctx), err, "cuCtxSetCurrent");
    return RK_OK;
}

void rk_cuda_ctx_close(rk_cuda_ctx *x)
{
    if (!x)
        return;
    x->c->f.ctx_set_current(NULL);
    x->c->f.primary_release(x->dev);
    free(x);
}

int rk_cuda_sync(rk_cuda_ctx *x, rk_err *err)
{
    CU(x->c, x->c->f.ctx_synchronize(), err, "cuCtxSynchronize");
    return RK_OK;
}

int rk_cuda_mem_info(rk_cuda_ctx *x, uint64_t *free_bytes, uint64_t *total_bytes, rk_err *err)
{
    size_t f = 0, t = 0;
    CU(x->c, x->c->f.mem_get_info(&f, &t), err, "cuMemGetInfo_v2");
    *free_bytes = f;
    *total_bytes = t;
    return RK_OK;
}

int rk_cuda_alloc(rk_cuda_ctx *x, size_t bytes, uint64_t *dptr, rk_err *err)
{
    CUdeviceptr p = 0;
    CUresult rc = x->c->f.mem_alloc(&p, bytes);
    if (rc != CUDA_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "cuMemAlloc_v2 of %zu bytes", bytes);
        return cu_fail(x->c, rc, err, what);
    }
    *dptr = p;
    return RK_OK;
}

int rk_cuda_free(rk_cuda_ctx *x, uint64_t dptr, rk_err *err)
{
    CU(x->c, x->c->f.mem_free(dptr), err, "cuMemFree_v2");
    return RK_OK;
}

int rk_cuda_htod(rk_cuda_ctx *x, uint64_t dst, const void *src, size_t bytes, rk_err *err)
{
    CU(x->c, x->c->f.htod(dst, src, bytes), err, "cuMemcpyHtoD_v2");
    return RK_OK;
}

int rk_cuda_dtoh(rk_cuda_ctx *x, void *dst, uint64_t src, size_t bytes, rk_err *err)
{
    CU(x->c, x->c->f.dtoh(dst, src, bytes), err, "cuMemcpyDtoH_v2");
    return RK_OK;
}

int rk_cuda_memset32(rk_cuda_ctx *x, uint64_t dst, uint32_t value, size_t words, rk_err *err)
{
    CU(x->c, x->c->f.memset32(dst, value, words), err, "cuMemsetD32_v2");
    return RK_OK;
}

/* ---- modules and launches ------------------------------------------------------------------ */

int rk_cuda_module_load(rk_cuda_ctx *x, const char *ptx, rk_cuda_module **out, rk_err *err)
{
    *out = NULL;
    rk_cuda_module *m = calloc(1, sizeof *m);
    if (!m)
        return rk_err_set(err, RK_ENOMEM, "out of memory");
    m->c = x->c;
    char log[4096] = "";
    int opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {log, (void *)(uintptr_t)(sizeof log - 1)};
    CUresult rc = x->c->f.module_load(&m->mod, ptx, 2, opts, vals);
    if (rc != CUDA_SUCCESS) {
        free(m);
        rk_err e;
        int code = cu_fail(x->c, rc, &e, "cuModuleLoadDataEx");
        log[sizeof log - 1] = '\0';
        char first[200];
        log[strcspn(log, "\n")] = '\0';
        rk_text_clean(first, sizeof first, log);
        return rk_err_set(err, code, "%s%s%s", e.msg, first[0] ? "; JIT log: " : "", first);
    }
    *out = m;
    return RK_OK;
}

void rk_cuda_module_unload(rk_cuda_module *m)
{
    if (!m)
        return;
    m->c->f.module_unload(m->mod);
    free(m);
}

int rk_cuda_kernel(rk_cuda_module *m, const char *name, rk_cuda_fn *out, rk_err *err)
{
    CUfunction f = NULL;
    CUresult rc = m->c->f.module_function(&f, m->mod, name);
    if (rc != CUDA_SUCCESS) {
        if (rc == 500 /* CUDA_ERROR_NOT_FOUND */)
            return rk_err_set(err, RK_ENOENT, "the GPU kernels have no kernel %.64s", name);
        char what[128];
        snprintf(what, sizeof what, "cuModuleGetFunction %.64s", name);
        return cu_fail(m->c, rc, err, what);
    }
    *out = f;
    return RK_OK;
}

int rk_cuda_launch(rk_cuda_ctx *x, rk_cuda_fn f, const unsigned grid[3], const unsigned block[3],
                   unsigned shared_bytes, void **args, rk_err *err)
{
    CU(x->c,
       x->c->f.launch(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes,
                      NULL, args, NULL),
       err, "cuLaunchKernel");
    return RK_OK;
}

/* ---- events -------------------------------------------------------------------------------- */

int rk_cuda_event_create(rk_cuda_ctx *x, rk_cuda_event *out, rk_err *err)
{
    CU(x->c, x->c->f.event_create(out, CU_EVENT_DEFAULT), err, "cuEventCreate");
    return RK_OK;
}

int rk_cuda_event_record(rk_cuda_ctx *x, rk_cuda_event e, rk_err *err)
{
    CU(x->c, x->c->f.event_record(e, NULL), err, "cuEventRecord");
    return RK_OK;
}

int rk_cuda_event_sync(rk_cuda_ctx *x, rk_cuda_event e, rk_err *err)
{
    CU(x->c, x->c->f.event_synchronize(e), err, "cuEventSynchronize");
    return RK_OK;
}

int rk_cuda_event_elapsed_ms(rk_cuda_ctx *x, rk_cuda_event start, rk_cuda_event end, float *ms,
                             rk_err *err)
{
    CU(x->c, x->c->f.event_elapsed(ms, start, end), err, "cuEventElapsedTime");
    return RK_OK;
}

void rk_cuda_event_destroy(rk_cuda_ctx *x, rk_cuda_event e)
{
    if (e)
        x->c->f.event_destroy(e);
}
