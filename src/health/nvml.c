/*
 * The "nvml" telemetry backend (rekindle/health.h) and the setters behind `rk tune`
 * (health/nvml.h, docs/tune.md). NVML is loaded with dlopen at open, never linked: each entry
 * point is looked up with dlsym, the newest version first, as nvtop does, and declared with our
 * own few prototypes (health/nvml_api.h). A field the card cannot report stays invalid, never
 * zero. Relies on libdl and nothing of NVIDIA's at build time. Never prints or exits.
 */
#include "health/nvml.h"
#include "base/env.h"
#include "base/msg.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "health/nvml_api.h"

_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "dlsym results fit a function pointer");

#define XID_DRAIN_MAX 1024 /* events taken from the queue per read, at most */

/* Every NVML entry point we use; NULL when this NVML lacks it (required ones fail the open). */
typedef struct nvml_fns {
    nvmlInit_fn *init;
    nvmlShutdown_fn *shutdown;
    nvmlErrorString_fn *error_string;
    nvmlDeviceGetCount_fn *count;
    nvmlDeviceGetHandleByIndex_fn *handle;
    nvmlDeviceGetString_fn *name, *uuid, *serial;
    nvmlDeviceGetPciInfo_fn *pci, *pci_v1;
    nvmlDeviceGetTemperature_fn *temp;
    nvmlDeviceGetUint_fn *fan, *power, *enforced_limit, *limit, *default_limit;
    nvmlDeviceGetPowerManagementLimitConstraints_fn *limit_constraints;
    nvmlDeviceGetClockInfo_fn *clock, *max_clock;
    nvmlDeviceGetUll_fn *clock_reasons, *energy, *supported_events;
    nvmlDeviceGetUtilizationRates_fn *util;
    nvmlDeviceGetMemoryInfo_fn *memory;
    nvmlDeviceGetTotalEccErrors_fn *ecc;
    nvmlDeviceGetRetiredPages_v2_fn *retired_v2;
    nvmlDeviceGetRetiredPages_fn *retired;
    nvmlDeviceGetEnable_fn *retired_pending, *persistence;
    nvmlDeviceGetRemappedRows_fn *remapped;
    nvmlDeviceGetUint_fn *pcie_gen, *pcie_width, *pcie_gen_max, *pcie_width_max, *pcie_replay;
    nvmlEventSetCreate_fn *event_set_create;
    nvmlDeviceRegisterEvents_fn *register_events;
    nvmlEventSetWait_fn *event_wait;
    nvmlEventSetFree_fn *event_set_free;
    nvmlDeviceSetGpuLockedClocks_fn *lock_clocks;
    nvmlDeviceResetGpuLockedClocks_fn *reset_clocks;
    nvmlDeviceSetPowerManagementLimit_fn *set_limit;
    nvmlDeviceSetPersistenceMode_fn *set_persistence;
    nvmlDeviceGetArchitecture_fn *arch;
    nvmlDeviceGetBrand_fn *brand;
    nvmlDeviceGetGpcClkVfOffset_fn *get_offset;
    nvmlDeviceSetGpcClkVfOffset_fn *set_offset;
    nvmlDeviceGetGpcClkMinMaxVfOffset_fn *offset_range;
} nvml_fns;

/* Where each pointer comes from: the names to try, newest first. */
typedef struct sym_spec {
    size_t off;
    bool required;
    const char *names[4];
} sym_spec;

#define SYM(field, req, ...)                                                                       \
    {                                                                                              \
        offsetof(nvml_fns, field), req,                                                            \
        {                                                                                          \
            __VA_ARGS__, NULL                                                                      \
        }                                                                                          \
    }
static const sym_spec syms[] = {
    SYM(init, true, "nvmlInit_v2", "nvmlInit"),
    SYM(shutdown, true, "nvmlShutdown"),
    SYM(error_string, true, "nvmlErrorString"),
    SYM(count, true, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"),
    SYM(handle, true, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"),
    SYM(name, false, "nvmlDeviceGetName"),
    SYM(uuid, false, "nvmlDeviceGetUUID"),
    SYM(serial, false, "nvmlDeviceGetSerial"),
    SYM(pci, false, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"),
    SYM(pci_v1, false, "nvmlDeviceGetPciInfo"),
    SYM(temp, false, "nvmlDeviceGetTemperature"),
    SYM(fan, false, "nvmlDeviceGetFanSpeed"),
    SYM(power, false, "nvmlDeviceGetPowerUsage"),
    SYM(enforced_limit, false, "nvmlDeviceGetEnforcedPowerLimit"),
    SYM(limit, false, "nvmlDeviceGetPowerManagementLimit"),
    SYM(default_limit, false, "nvmlDeviceGetPowerManagementDefaultLimit"),
    SYM(limit_constraints, false, "nvmlDeviceGetPowerManagementLimitConstraints"),
    SYM(clock, false, "nvmlDeviceGetClockInfo"),
    SYM(max_clock, false, "nvmlDeviceGetMaxClockInfo"),
    SYM(clock_reasons, false, "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons"),
    SYM(energy, false, "nvmlDeviceGetTotalEnergyConsumption"),
    SYM(supported_events, false, "nvmlDeviceGetSupportedEventTypes"),
    SYM(util, false, "nvmlDeviceGetUtilizationRates"),
    SYM(memory, false, "nvmlDeviceGetMemoryInfo"),
    SYM(ecc, false, "nvmlDeviceGetTotalEccErrors"),
    SYM(retired_v2, false, "nvmlDeviceGetRetiredPages_v2"),
    SYM(retired, false, "nvmlDeviceGetRetiredPages"),
    SYM(retired_pending, false, "nvmlDeviceGetRetiredPagesPendingStatus"),
    SYM(persistence, false, "nvmlDeviceGetPersistenceMode"),
    SYM(remapped, false, "nvmlDeviceGetRemappedRows"),
    SYM(pcie_gen, false, "nvmlDeviceGetCurrPcieLinkGeneration"),
    SYM(pcie_width, false, "nvmlDeviceGetCurrPcieLinkWidth"),
    SYM(pcie_gen_max, false, "nvmlDeviceGetMaxPcieLinkGeneration"),
    SYM(pcie_width_max, false, "nvmlDeviceGetMaxPcieLinkWidth"),
    SYM(pcie_replay, false, "nvmlDeviceGetPcieReplayCounter"),
    SYM(event_set_create, false, "nvmlEventSetCreate"),
    SYM(register_events, false, "nvmlDeviceRegisterEvents"),
    SYM(event_wait, false, "nvmlEventSetWait_v2", "nvmlEventSetWait"),
    SYM(event_set_free, false, "nvmlEventSetFree"),
    SYM(lock_clocks, false, "nvmlDeviceSetGpuLockedClocks"),
    SYM(reset_clocks, false, "nvmlDeviceResetGpuLockedClocks"),
    SYM(set_limit, false, "nvmlDeviceSetPowerManagementLimit"),
    SYM(set_persistence, false, "nvmlDeviceSetPersistenceMode"),
    SYM(arch, false, "nvmlDeviceGetArchitecture"),
    SYM(brand, false, "nvmlDeviceGetBrand"),
    SYM(get_offset, false, "nvmlDeviceGetGpcClkVfOffset"),
    SYM(set_offset, false, "nvmlDeviceSetGpcClkVfOffset"),
    SYM(offset_range, false, "nvmlDeviceGetGpcClkMinMaxVfOffset"),
};
#undef SYM

typedef struct gpu {
    nvmlDevice_t h;         /* NULL when NVML gave no handle */
    nvmlReturn_t handle_rc; /* why not */
    rk_gpu_info info;
    bool xid_registered; /* Xid events of this GPU arrive in the event set */
    uint64_t xid_count;
    int last_xid;
} gpu;

struct rk_nvml {
    void *lib;
    nvml_fns f;
    bool inited;           /* nvmlInit succeeded: close shuts NVML down */
    nvmlEventSet_t events; /* NULL when no GPU could register */
    int n;
    gpu *gpus;
};

/* ---- messages ----------------------------------------------------------------------------- */

static const char *nverr(const rk_nvml *n, nvmlReturn_t rc)
{
    const char *s = n->f.error_string ? n->f.error_string(rc) : NULL;
    return s && *s ? s : "unknown NVML error";
}

/* A fixed-size string from NVML into dst: always terminated, cleaned (rk_text_clean). */
static void copy_str(char *dst, size_t cap, const char *src, size_t src_cap)
{
    char tmp[256];
    size_t n = strnlen(src, src_cap < sizeof tmp ? src_cap : sizeof tmp - 1);
    memcpy(tmp, src, n);
    tmp[n] = '\0';
    rk_text_clean(dst, cap, tmp);
}

/* ---- open, close, info -------------------------------------------------------------------- */

static void resolve(rk_nvml *n)
{
    for (size_t k = 0; k < sizeof syms / sizeof syms[0]; k++) {
        void *p = NULL;
        for (int j = 0; !p && syms[k].names[j]; j++)
            p = dlsym(n->lib, syms[k].names[j]);
        memcpy((char *)&n->f + syms[k].off, &p, sizeof p);
    }
}

static const char *missing_required(const rk_nvml *n)
{
    for (size_t k = 0; k < sizeof syms / sizeof syms[0]; k++) {
        void *p;
        memcpy(&p, (const char *)&n->f + syms[k].off, sizeof p);
        if (syms[k].required && !p)
            return syms[k].names[0];
    }
    return NULL;
}

/* NVML_DEVICE_ARCH_* (2 Kepler ... 10 Blackwell) into ours. */
static rk_gpu_arch arch_of(unsigned a)
{
    return a >= 2 && a <= 10 ? (rk_gpu_arch)(a - 2 + RK_ARCH_KEPLER) : RK_ARCH_UNKNOWN;
}

/* Architecture, brand and what rk tune can set (docs/tune.md, "Which cards can"): locked
 * clocks on Volta and newer (NVML's documented rule; on an unknown architecture the driver
 * decides when asked), a power limit where the card reports a range with room in it, a clock
 * offset where the driver answers for its range. Reads only. */
static void read_routes(rk_nvml *n, gpu *g)
{
    rk_gpu_info *in = &g->info;
    unsigned v = 0;
    nvmlReturn_t rc = n->f.arch ? n->f.arch(g->h, &v) : NVML_ERROR_FUNCTION_NOT_FOUND;
    if (rc == NVML_ERROR_GPU_IS_LOST)
        return; /* a card off the bus: nothing known */
    if (rc == NVML_SUCCESS)
        in->arch = arch_of(v);
    if (n->f.brand && n->f.brand(g->h, &v) == NVML_SUCCESS)
        in->geforce = v == NVML_BRAND_GEFORCE || v == NVML_BRAND_TITAN ||
                      v == NVML_BRAND_GEFORCE_RTX || v == NVML_BRAND_TITAN_RTX;
    in->tune = RK_TUNE_KNOWN;
    if (n->f.lock_clocks && (in->arch == RK_ARCH_UNKNOWN || in->arch >= RK_ARCH_VOLTA))
        in->tune |= RK_TUNE_LOCK_CLOCKS;
    unsigned lo = 0, hi = 0;
    if (n->f.set_limit && n->f.limit_constraints &&
        n->f.limit_constraints(g->h, &lo, &hi) == NVML_SUCCESS && lo < hi)
        in->tune |= RK_TUNE_POWER_LIMIT;
    int omin = 0, omax = 0;
    if (n->f.set_offset && n->f.offset_range &&
        n->f.offset_range(g->h, &omin, &omax) == NVML_SUCCESS && omin < 0)
        in->tune |= RK_TUNE_CLOCK_OFFSET; /* a negative offset is the one a worn card wants */
}

static void read_info(rk_nvml *n, int i)
{
    gpu *g = &n->gpus[i];
    rk_gpu_info *in = &g->info;
    in->index = i;
    in->backend = "nvml";
    if (!g->h)
        return;
    char buf[NVML_DEVICE_UUID_V2_BUFFER_SIZE + 1];
    if (n->f.name && n->f.name(g->h, buf, NVML_DEVICE_NAME_V2_BUFFER_SIZE) == NVML_SUCCESS)
        copy_str(in->name, sizeof in->name, buf, NVML_DEVICE_NAME_V2_BUFFER_SIZE);
    if (n->f.uuid && n->f.uuid(g->h, buf, NVML_DEVICE_UUID_V2_BUFFER_SIZE) == NVML_SUCCESS)
        copy_str(in->uuid, sizeof in->uuid, buf, NVML_DEVICE_UUID_V2_BUFFER_SIZE);
    if (n->f.serial && n->f.serial(g->h, buf, NVML_DEVICE_SERIAL_BUFFER_SIZE) == NVML_SUCCESS)
        copy_str(in->serial, sizeof in->serial, buf, NVML_DEVICE_SERIAL_BUFFER_SIZE);
    nvmlPciInfo_t pci;
    memset(&pci, 0, sizeof pci);
    if (n->f.pci && n->f.pci(g->h, &pci) == NVML_SUCCESS)
        copy_str(in->bus_id, sizeof in->bus_id, pci.busId, sizeof pci.busId);
    else if (n->f.pci_v1 && n->f.pci_v1(g->h, &pci) == NVML_SUCCESS)
        copy_str(in->bus_id, sizeof in->bus_id, pci.busIdLegacy, sizeof pci.busIdLegacy);
    read_routes(n, g);
}

/* Ask for critical Xid events of every GPU that can send them, into one event set. */
static void register_xid(rk_nvml *n)
{
    if (!n->f.event_set_create || !n->f.register_events || !n->f.event_wait || !n->f.event_set_free)
        return;
    for (int i = 0; i < n->n; i++) {
        gpu *g = &n->gpus[i];
        unsigned long long types = 0;
        if (!g->h)
            continue;
        if (n->f.supported_events && (n->f.supported_events(g->h, &types) != NVML_SUCCESS ||
                                      !(types & nvmlEventTypeXidCriticalError)))
            continue;
        if (!n->events && n->f.event_set_create(&n->events) != NVML_SUCCESS) {
            n->events = NULL;
            return;
        }
        g->xid_registered =
            n->f.register_events(g->h, nvmlEventTypeXidCriticalError, n->events) == NVML_SUCCESS;
    }
}

void rk_nvml_close(rk_nvml *n)
{
    if (!n)
        return;
    if (n->events)
        n->f.event_set_free(n->events);
    if (n->inited)
        n->f.shutdown();
    free(n->gpus);
    if (n->lib)
        dlclose(n->lib);
    free(n);
}

/* Failures of nvmlInit that mean "no usable NVIDIA driver here" rather than "it broke". */
static bool init_absent(nvmlReturn_t rc)
{
    return rc == NVML_ERROR_DRIVER_NOT_LOADED || rc == NVML_ERROR_LIBRARY_NOT_FOUND ||
           rc == NVML_ERROR_NO_PERMISSION || rc == NVML_ERROR_NOT_SUPPORTED ||
           rc == NVML_ERROR_GPU_NOT_FOUND;
}

int rk_nvml_open(rk_nvml **out, rk_err *err)
{
    *out = NULL;
    /* ignored when privileged: whoever started a set-user-ID rk must not choose its code */
    const char *path = rk_env_override(RK_NVML_LIB_ENV);
    if (!path || !*path)
        path = RK_NVML_LIB_DEFAULT;
    rk_nvml *n = calloc(1, sizeof *n);
    if (!n)
        return rk_err_set(err, RK_ENOMEM, "nvml: out of memory");
    dlerror();
    n->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        const char *why = dlerror();
        size_t lp = strlen(path);
        if (!why)
            why = "cannot be loaded";
        else if (strncmp(why, path, lp) == 0 && strncmp(why + lp, ": ", 2) == 0)
            why += lp + 2; /* dlerror starts with the path: say it once */
        free(n);
        return rk_err_set_line(err, RK_ENOTSUP, "NVML not available: %.200s: %s", path, why);
    }
    resolve(n);
    const char *missing = missing_required(n);
    if (missing) {
        rk_nvml_close(n);
        return rk_err_set_line(err, RK_ENOTSUP, "NVML not available: %.200s has no %s", path,
                               missing);
    }
    nvmlReturn_t rc = n->f.init();
    if (rc != NVML_SUCCESS) {
        int code = init_absent(rc) ? RK_ENOTSUP : RK_EIO;
        rk_err_set_line(err, code, "NVML not available: %.200s: initialising failed: %s", path,
                        nverr(n, rc));
        rk_nvml_close(n);
        return code;
    }
    n->inited = true;
    unsigned count = 0;
    rc = n->f.count(&count);
    if (rc != NVML_SUCCESS) {
        rk_err_set_line(err, RK_EIO, "NVML: counting GPUs failed: %s", nverr(n, rc));
        rk_nvml_close(n);
        return RK_EIO;
    }
    if (count == 0 || count > 4096) {
        if (count == 0)
            rk_err_set_line(err, RK_ENOTSUP, "NVML not available: it sees no GPU");
        else
            rk_err_set_line(err, RK_EIO, "NVML: it reports %u GPUs (more than 4096)", count);
        rk_nvml_close(n);
        return count == 0 ? RK_ENOTSUP : RK_EIO;
    }
    n->gpus = calloc(count, sizeof *n->gpus);
    if (!n->gpus) {
        rk_nvml_close(n);
        return rk_err_set(err, RK_ENOMEM, "nvml: out of memory");
    }
    n->n = (int)count;
    for (int i = 0; i < n->n; i++) {
        gpu *g = &n->gpus[i];
        g->handle_rc = n->f.handle((unsigned)i, &g->h);
        if (g->handle_rc != NVML_SUCCESS)
            g->h = NULL;
        read_info(n, i);
    }
    register_xid(n);
    *out = n;
    return RK_OK;
}

int rk_nvml_count(const rk_nvml *n)
{
    return n ? n->n : 0;
}

int rk_nvml_info(const rk_nvml *n, int i, rk_gpu_info *out)
{
    if (!n || i < 0 || i >= n->n)
        return RK_EINVAL;
    *out = n->gpus[i].info;
    return RK_OK;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* Take every event waiting in the set (0 ms timeout) and count the Xids per GPU. */
static void drain_events(rk_nvml *n)
{
    if (!n->events)
        return;
    for (int k = 0; k < XID_DRAIN_MAX; k++) {
        nvmlEventData_t d;
        memset(&d, 0, sizeof d);
        if (n->f.event_wait(n->events, &d, 0) != NVML_SUCCESS)
            return; /* NVML_ERROR_TIMEOUT: the queue is empty */
        if (!(d.eventType & nvmlEventTypeXidCriticalError))
            continue;
        for (int i = 0; i < n->n; i++)
            if (n->gpus[i].h && n->gpus[i].h == d.device) {
                n->gpus[i].xid_count++;
                n->gpus[i].last_xid = d.eventData > 0x7fffffffULL ? 999 : (int)d.eventData;
                break;
            }
    }
}

/* Errors that say NVML or the GPU as a whole is broken: the read fails. Every other error of
 * one query (not supported, no permission, no data, an infoROM that cannot be read, ...)
 * only leaves that field invalid. */
static bool read_fatal(nvmlReturn_t rc)
{
    return rc == NVML_ERROR_UNINITIALIZED || rc == NVML_ERROR_DRIVER_NOT_LOADED ||
           rc == NVML_ERROR_LIB_RM_VERSION_MISMATCH || rc == NVML_ERROR_RESET_REQUIRED ||
           rc == NVML_ERROR_GPU_NOT_FOUND;
}

typedef struct reader {
    rk_nvml *n;
    nvmlDevice_t h;
    bool lost;
    nvmlReturn_t fatal;
    const char *fatal_what;
} reader;

/* True when a query succeeded; otherwise notes a lost GPU or a fatal error. */
static bool took(reader *r, nvmlReturn_t rc, const char *what)
{
    if (rc == NVML_SUCCESS)
        return true;
    if (rc == NVML_ERROR_GPU_IS_LOST)
        r->lost = true;
    else if (read_fatal(rc) && !r->fatal) {
        r->fatal = rc;
        r->fatal_what = what;
    }
    return false;
}

static bool live(const reader *r)
{
    return !r->lost && !r->fatal;
}

static bool get_u(reader *r, nvmlDeviceGetUint_fn *fn, const char *what, unsigned *v)
{
    return fn && live(r) && took(r, fn(r->h, v), what);
}

static bool get_ull(reader *r, nvmlDeviceGetUll_fn *fn, const char *what, unsigned long long *v)
{
    return fn && live(r) && took(r, fn(r->h, v), what);
}

static unsigned retired_count(reader *r, nvmlPageRetirementCause_t cause, bool *ok)
{
    const nvml_fns *f = &r->n->f;
    unsigned count = 0;
    nvmlReturn_t rc;
    if (!live(r) || (!f->retired_v2 && !f->retired)) {
        *ok = false;
        return 0;
    }
    /* A zero-sized buffer asks for the count: NVML says INSUFFICIENT_SIZE when pages exist. */
    rc = f->retired_v2 ? f->retired_v2(r->h, cause, &count, NULL, NULL)
                       : f->retired(r->h, cause, &count, NULL);
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE)
        rc = NVML_SUCCESS;
    *ok = *ok && took(r, rc, "retired pages");
    return count;
}

static void read_fields(reader *r, rk_gpu_sample *s)
{
    const nvml_fns *f = &r->n->f;
    unsigned u, u2, u3, u4;
    unsigned long long ull;
    if (f->temp && live(r) && took(r, f->temp(r->h, NVML_TEMPERATURE_GPU, &u), "temperature")) {
        s->temp_c = u;
        rk_field_set(s, RK_F_TEMP);
    }
    if (get_u(r, f->fan, "fan speed", &u)) {
        s->fan_pct = u;
        rk_field_set(s, RK_F_FAN);
    }
    if (get_u(r, f->power, "power usage", &u)) {
        s->power_w = u / 1000.0;
        rk_field_set(s, RK_F_POWER);
    }
    if (get_u(r, f->enforced_limit ? f->enforced_limit : f->limit, "power limit", &u)) {
        s->power_limit_w = u / 1000.0;
        rk_field_set(s, RK_F_POWER_LIMIT);
    }
    if (f->clock && live(r) && took(r, f->clock(r->h, NVML_CLOCK_SM, &u), "SM clock")) {
        s->sm_mhz = u;
        rk_field_set(s, RK_F_SM_CLOCK);
    }
    if (f->clock && live(r) && took(r, f->clock(r->h, NVML_CLOCK_MEM, &u), "memory clock")) {
        s->mem_mhz = u;
        rk_field_set(s, RK_F_MEM_CLOCK);
    }
    if (get_ull(r, f->clock_reasons, "clock event reasons", &ull)) {
        s->clock_reasons = ull & 0xffULL; /* the RK_CLOCK_* bits */
        rk_field_set(s, RK_F_CLOCK_REASONS);
    }
    nvmlUtilization_t ut;
    if (f->util && live(r) && took(r, f->util(r->h, &ut), "utilisation")) {
        s->util_pct = ut.gpu;
        rk_field_set(s, RK_F_UTIL);
    }
    nvmlMemory_t mem;
    if (f->memory && live(r) && took(r, f->memory(r->h, &mem), "memory")) {
        s->mem_used_bytes = mem.used;
        s->mem_total_bytes = mem.total;
        rk_field_set(s, RK_F_MEM_USED);
        rk_field_set(s, RK_F_MEM_TOTAL);
    }
    if (f->ecc && live(r) &&
        took(r, f->ecc(r->h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, &ull),
             "ECC corrected")) {
        s->ecc_corrected = ull;
        rk_field_set(s, RK_F_ECC_CORRECTED);
    }
    if (f->ecc && live(r) &&
        took(r, f->ecc(r->h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, &ull),
             "ECC uncorrected")) {
        s->ecc_uncorrected = ull;
        rk_field_set(s, RK_F_ECC_UNCORRECTED);
    }
    bool ok = true;
    unsigned sbe = retired_count(r, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, &ok);
    unsigned dbe = retired_count(r, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, &ok);
    if (ok) {
        s->retired_pages = (uint64_t)sbe + dbe;
        rk_field_set(s, RK_F_RETIRED);
    }
    nvmlEnableState_t pending;
    if (f->retired_pending && live(r) &&
        took(r, f->retired_pending(r->h, &pending), "retired pages pending")) {
        s->retired_pending = pending == NVML_FEATURE_ENABLED;
        rk_field_set(s, RK_F_RETIRED_PENDING);
    }
    if (f->remapped && live(r) && took(r, f->remapped(r->h, &u, &u2, &u3, &u4), "remapped rows")) {
        s->remapped_rows = (uint64_t)u + u2;
        rk_field_set(s, RK_F_REMAPPED);
    }
    if (get_u(r, f->pcie_gen, "PCIe generation", &u)) {
        s->pcie_gen = (int)u;
        rk_field_set(s, RK_F_PCIE_GEN);
    }
    if (get_u(r, f->pcie_width, "PCIe width", &u)) {
        s->pcie_width = (int)u;
        rk_field_set(s, RK_F_PCIE_WIDTH);
    }
    if (get_u(r, f->pcie_gen_max, "PCIe max generation", &u)) {
        s->pcie_gen_max = (int)u;
        rk_field_set(s, RK_F_PCIE_GEN_MAX);
    }
    if (get_u(r, f->pcie_width_max, "PCIe max width", &u)) {
        s->pcie_width_max = (int)u;
        rk_field_set(s, RK_F_PCIE_WIDTH_MAX);
    }
    if (get_u(r, f->pcie_replay, "PCIe replay counter", &u)) {
        s->pcie_replay = u;
        rk_field_set(s, RK_F_PCIE_REPLAY);
    }
    if (get_ull(r, f->energy, "energy", &ull)) {
        s->energy_j = (double)ull / 1000.0;
        rk_field_set(s, RK_F_ENERGY);
    }
}

int rk_nvml_read(rk_nvml *n, int i, rk_gpu_sample *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    if (!n || i < 0 || i >= n->n)
        return rk_err_set(err, RK_EINVAL, "nvml: GPU %d out of range (0..%d)", i,
                          n ? n->n - 1 : -1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    out->t = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    gpu *g = &n->gpus[i];
    if (!g->h) {
        if (g->handle_rc == NVML_ERROR_GPU_IS_LOST) {
            out->lost = true;
            return RK_OK;
        }
        return rk_err_set_line(err, RK_EIO, "nvml: GPU %d: no handle: %s", i,
                               nverr(n, g->handle_rc));
    }
    reader r = {n, g->h, false, NVML_SUCCESS, NULL};
    read_fields(&r, out);
    if (r.lost || r.fatal) {
        double t = out->t;
        memset(out, 0, sizeof *out);
        out->t = t;
        if (r.lost) {
            out->lost = true;
            return RK_OK;
        }
        return rk_err_set_line(err, RK_EIO, "nvml: GPU %d (%s): %s: %s", i, g->info.name,
                               r.fatal_what, nverr(n, r.fatal));
    }
    drain_events(n);
    if (g->xid_registered) {
        out->xid_count = g->xid_count;
        out->last_xid = g->last_xid;
        rk_field_set(out, RK_F_XID);
    }
    return RK_OK;
}

/* ---- rk tune: getters and setters --------------------------------------------------------- */

static int handle_of(rk_nvml *n, int i, nvmlDevice_t *h, rk_err *err)
{
    if (!n || i < 0 || i >= n->n)
        return rk_err_set(err, RK_EINVAL, "nvml: GPU %d out of range (0..%d)", i,
                          n ? n->n - 1 : -1);
    if (!n->gpus[i].h)
        return rk_err_set_line(err, RK_EIO, "GPU %d: %s", i,
                               n->gpus[i].handle_rc == NVML_ERROR_GPU_IS_LOST
                                   ? "the GPU is lost (fallen off the bus)"
                                   : nverr(n, n->gpus[i].handle_rc));
    *h = n->gpus[i].h;
    return RK_OK;
}

/* A setter's failure as RK_ENOTSUP (this card or driver cannot) or RK_EIO, with NVML's words
 * and a hint. */
static int set_failed(rk_nvml *n, int i, const char *what, nvmlReturn_t rc, const char *unsup,
                      rk_err *err)
{
    const char *why = nverr(n, rc);
    switch (rc) {
    case NVML_ERROR_NOT_SUPPORTED:
    case NVML_ERROR_FUNCTION_NOT_FOUND:
        return rk_err_set_line(err, RK_ENOTSUP, "GPU %d: %s: NVML: %s (%s)", i, what, why, unsup);
    case NVML_ERROR_NO_PERMISSION:
        return rk_err_set_line(err, RK_EIO, "GPU %d: %s: NVML: %s (needs root)", i, what, why);
    case NVML_ERROR_GPU_IS_LOST:
        return rk_err_set_line(err, RK_EIO, "GPU %d: %s: NVML: %s (the GPU has fallen off the bus)",
                               i, what, why);
    default: return rk_err_set_line(err, RK_EIO, "GPU %d: %s: NVML: %s", i, what, why);
    }
}

int rk_nvml_settings_get(rk_nvml *n, int i, rk_nvml_settings *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    nvmlDevice_t h;
    int rc = handle_of(n, i, &h, err);
    if (rc)
        return rc;
    const nvml_fns *f = &n->f;
    reader r = {n, h, false, NVML_SUCCESS, NULL};
    unsigned a, b;
    nvmlEnableState_t e;
    if (f->clock && took(&r, f->clock(h, NVML_CLOCK_SM, &a), "SM clock")) {
        out->sm_valid = true;
        out->sm_mhz = a;
    }
    if (f->max_clock && live(&r) && took(&r, f->max_clock(h, NVML_CLOCK_SM, &a), "max SM clock")) {
        out->sm_max_valid = true;
        out->sm_max_mhz = a;
    }
    if (get_u(&r, f->limit ? f->limit : f->enforced_limit, "power limit", &a)) {
        out->power_valid = true;
        out->power_limit_mw = a;
    }
    if (f->limit_constraints && live(&r) &&
        took(&r, f->limit_constraints(h, &a, &b), "power limit constraints") && a <= b) {
        out->power_range_valid = true;
        out->power_min_mw = a;
        out->power_max_mw = b;
    }
    if (get_u(&r, f->default_limit, "default power limit", &a)) {
        out->power_default_valid = true;
        out->power_default_mw = a;
    }
    if (f->persistence && live(&r) && took(&r, f->persistence(h, &e), "persistence mode")) {
        out->persistence_valid = true;
        out->persistence_on = e == NVML_FEATURE_ENABLED;
    }
    int o, omin, omax;
    if (f->get_offset && live(&r) && took(&r, f->get_offset(h, &o), "clock offset")) {
        out->offset_valid = true;
        out->offset_mhz = o;
    }
    if (f->offset_range && live(&r) &&
        took(&r, f->offset_range(h, &omin, &omax), "clock offset range") && omin <= omax) {
        out->offset_range_valid = true;
        out->offset_min_mhz = omin;
        out->offset_max_mhz = omax;
    }
    if (r.lost)
        return rk_err_set_line(err, RK_EIO, "GPU %d: the GPU is lost (fallen off the bus)", i);
    if (r.fatal)
        return rk_err_set_line(err, RK_EIO, "GPU %d: %s: NVML: %s", i, r.fatal_what,
                               nverr(n, r.fatal));
    return RK_OK;
}

int rk_nvml_clocks_lock(rk_nvml *n, int i, unsigned mhz, rk_err *err)
{
    nvmlDevice_t h;
    int rc = handle_of(n, i, &h, err);
    if (rc)
        return rc;
    if (mhz == 0)
        return rk_err_set(err, RK_EINVAL, "GPU %d: lock clocks: 0 MHz", i);
    unsigned max = 0;
    if (n->f.max_clock && n->f.max_clock(h, NVML_CLOCK_SM, &max) == NVML_SUCCESS && max > 0 &&
        mhz > max)
        return rk_err_set(err, RK_EINVAL,
                          "GPU %d: lock clocks: %u MHz is above the card's maximum SM clock %u MHz",
                          i, mhz, max);
    if (!n->f.lock_clocks)
        return set_failed(n, i, "lock clocks", NVML_ERROR_FUNCTION_NOT_FOUND,
                          "this NVML has no nvmlDeviceSetGpuLockedClocks", err);
    nvmlReturn_t r = n->f.lock_clocks(h, mhz, mhz);
    return r == NVML_SUCCESS
               ? RK_OK
               : set_failed(n, i, "lock clocks", r, "NVML locks clocks on Volta and newer", err);
}

int rk_nvml_clocks_reset(rk_nvml *n, int i, rk_err *err)
{
    nvmlDevice_t h;
    int rc = handle_of(n, i, &h, err);
    if (rc)
        return rc;
    if (!n->f.reset_clocks)
        return set_failed(n, i, "reset clocks", NVML_ERROR_FUNCTION_NOT_FOUND,
                          "this NVML has no nvmlDeviceResetGpuLockedClocks", err);
    nvmlReturn_t r = n->f.reset_clocks(h);
    return r == NVML_SUCCESS
               ? RK_OK
               : set_failed(n, i, "reset clocks", r, "NVML locks clocks on Volta and newer", err);
}

int rk_nvml_power_limit_set(rk_nvml *n, int i, unsigned mw, rk_err *err)
{
    nvmlDevice_t h;
    int rc = handle_of(n, i, &h, err);
    if (rc)
        return rc;
    unsigned lo = 0, hi = 0;
    if (mw == 0)
        return rk_err_set(err, RK_EINVAL, "GPU %d: power limit: 0 W", i);
    if (n->f.limit_constraints && n->f.limit_constraints(h, &lo, &hi) == NVML_SUCCESS && lo <= hi &&
        (mw < lo || mw > hi))
        return rk_err_set(err, RK_EINVAL,
                          "GPU %d: power limit: %.1f W is outside what the card allows "
                          "(%.1f-%.1f W)",
                          i, mw / 1000.0, lo / 1000.0, hi / 1000.0);
    if (!n->f.set_limit)
        return set_failed(n, i, "power limit", NVML_ERROR_FUNCTION_NOT_FOUND,
                          "this NVML has no nvmlDeviceSetPowerManagementLimit", err);
    nvmlReturn_t r = n->f.set_limit(h, mw);
    return r == NVML_SUCCESS
               ? RK_OK
               : set_failed(n, i, "power limit", r, "this card's power limit cannot be set", err);
}

int rk_nvml_clock_offset_set(rk_nvml *n, int i, int mhz, rk_err *err)
{
    nvmlDevice_t h;
    int rc = handle_of(n, i, &h, err);
    if (rc)
        return rc;
    int lo = 0, hi = 0;
    if (n->f.offset_range && n->f.offset_range(h, &lo, &hi) == NVML_SUCCESS && lo <= hi &&
        (mhz < lo || mhz > hi))
        return rk_err_set(err, RK_EINVAL,
                          "GPU %d: clock offset: %+d MHz is outside what the driver allows "
                          "(%+d..%+d MHz)",
                          i, mhz, lo, hi);
    if (!n->f.set_offset)
        return set_failed(n, i, "clock offset", NVML_ERROR_FUNCTION_NOT_FOUND,
                          "this NVML has no nvmlDeviceSetGpcClkVfOffset", err);
    nvmlReturn_t r = n->f.set_offset(h, mhz);
    return r == NVML_SUCCESS ? RK_OK
                             : set_failed(n, i, "clock offset", r,
                                          "this driver offers no clock offset for this card", err);
}

int rk_nvml_persistence_set(rk_nvml *n, int i, bool on, rk_err *err)
{
    nvmlDevice_t h;
    int rc = handle_of(n, i, &h, err);
    if (rc)
        return rc;
    if (!n->f.set_persistence)
        return set_failed(n, i, "persistence mode", NVML_ERROR_FUNCTION_NOT_FOUND,
                          "this NVML has no nvmlDeviceSetPersistenceMode", err);
    nvmlReturn_t r = n->f.set_persistence(h, on ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED);
    return r == NVML_SUCCESS ? RK_OK
                             : set_failed(n, i, "persistence mode", r,
                                          "persistence mode is a Linux feature", err);
}

/* ---- the telemetry backend ---------------------------------------------------------------- */

static int backend_open(void **state, const rk_telemetry_opts *o, rk_err *err)
{
    (void)o;
    rk_nvml *n;
    int rc = rk_nvml_open(&n, err);
    *state = n;
    return rc;
}

static int backend_count(void *state)
{
    return rk_nvml_count(state);
}

static int backend_info(void *state, int i, rk_gpu_info *out)
{
    return rk_nvml_info(state, i, out);
}

static int backend_read(void *state, int i, rk_gpu_sample *out, rk_err *err)
{
    return rk_nvml_read(state, i, out, err);
}

static void backend_close(void *state)
{
    rk_nvml_close(state);
}

/* no clock of its own: the monotonic one (rk_telemetry_now) */
const rk_telemetry_ops rk_telemetry_nvml = {
    "nvml", backend_open, backend_count, backend_info, backend_read, backend_close, NULL};
