/*
 * A fake libnvidia-ml for tests/test_nvml.c: the NVML entry points that src/health/nvml.c
 * resolves, with canned values, so that the real dlopen/dlsym path runs on machines without
 * NVIDIA software. Two GPUs: GPU 0 a passive GeForce GTX 1070 Ti (no fan, no ECC, no page
 * retirement: NVML_ERROR_NOT_SUPPORTED), GPU 1 fallen off the bus (NVML_ERROR_GPU_IS_LOST).
 * Where NVML has versions of an entry point both are exported with different answers, so a
 * test sees which one was called; built with FAKE_NVML_OLD it exports only the old ones.
 * Setters record their arguments. The test drives and reads it through fake_nvml_set/get.
 *
 * GPU 0 is a Pascal GeForce by default: it answers NOT_SUPPORTED to locked clocks, as the
 * GTX 10 series does, and has no clock offset unless "offsets" is set. The knob "arch" (NVML's
 * numbers: 4 Pascal, 7 Ampere) makes it an RTX 3090 that locks clocks. A process that cannot
 * call fake_nvml_set (rk run by a test script) chooses with FAKE_NVML_BOARD: "pascal" (the
 * default), "pascal-offsets" (a driver that offers offsets), "ampere".
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "../src/health/nvml_api.h"

#define FAKE_GPUS 2
#define XID_QUEUE 64

struct nvmlDevice_st {
    int index;
};
struct nvmlEventSet_st {
    int unused;
};

static struct nvmlDevice_st devs[FAKE_GPUS + 1] = {{0}, {1}, {2}};
static struct nvmlEventSet_st event_set;

/* Knobs (set by the test) and records (read by the test), all by name. */
static struct {
    long long init_rc, count, lost_gpu, geforce, events_supported, set_rc, temp_rc;
    long long init_v2_calls, init_v1_calls, shutdown_calls, wait_v2_calls, wait_v1_calls;
    long long lock_calls, lock_dev, lock_min, lock_max, reset_calls, reset_dev;
    long long limit_calls, limit_dev, limit_mw, persistence_calls, persistence[FAKE_GPUS];
    long long registered[FAKE_GPUS], event_sets;
    long long arch, brand, offsets, offset, offset_calls;
} st;

static struct {
    int dev;
    unsigned long long xid;
} xq[XID_QUEUE];
static int xq_head, xq_len;

static const struct {
    const char *name;
    long long *v;
} keys[] = {
    {"init_rc", &st.init_rc},
    {"count", &st.count},
    {"lost_gpu", &st.lost_gpu},
    {"geforce", &st.geforce},
    {"events_supported", &st.events_supported},
    {"set_rc", &st.set_rc},
    {"temp_rc", &st.temp_rc},
    {"init_v2_calls", &st.init_v2_calls},
    {"init_v1_calls", &st.init_v1_calls},
    {"shutdown_calls", &st.shutdown_calls},
    {"wait_v2_calls", &st.wait_v2_calls},
    {"wait_v1_calls", &st.wait_v1_calls},
    {"lock_calls", &st.lock_calls},
    {"lock_dev", &st.lock_dev},
    {"lock_min", &st.lock_min},
    {"lock_max", &st.lock_max},
    {"reset_calls", &st.reset_calls},
    {"reset_dev", &st.reset_dev},
    {"limit_calls", &st.limit_calls},
    {"limit_dev", &st.limit_dev},
    {"limit_mw", &st.limit_mw},
    {"persistence_calls", &st.persistence_calls},
    {"persistence0", &st.persistence[0]},
    {"persistence1", &st.persistence[1]},
    {"registered0", &st.registered[0]},
    {"registered1", &st.registered[1]},
    {"event_sets", &st.event_sets},
    {"arch", &st.arch},
    {"brand", &st.brand},
    {"offsets", &st.offsets},
    {"offset", &st.offset},
    {"offset_calls", &st.offset_calls},
};

void fake_nvml_reset(void);
int fake_nvml_set(const char *key, long long v);
long long fake_nvml_get(const char *key);
int fake_nvml_push_xid(int dev, unsigned long long xid);

void fake_nvml_reset(void)
{
    memset(&st, 0, sizeof st);
    st.count = FAKE_GPUS;
    st.lost_gpu = 1;
    st.geforce = 1;
    st.events_supported = 1;
    st.lock_dev = st.reset_dev = st.limit_dev = -1;
    st.arch = 4;  /* NVML_DEVICE_ARCH_PASCAL */
    st.brand = 5; /* NVML_BRAND_GEFORCE */
    xq_head = xq_len = 0;
    const char *board = getenv("FAKE_NVML_BOARD");
    if (board && strcmp(board, "ampere") == 0) {
        st.arch = 7;   /* NVML_DEVICE_ARCH_AMPERE */
        st.brand = 15; /* NVML_BRAND_GEFORCE_RTX */
        st.offsets = 1;
    } else if (board && strcmp(board, "pascal-offsets") == 0) {
        st.offsets = 1;
    }
}

int fake_nvml_set(const char *key, long long v)
{
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(keys[i].name, key) == 0) {
            *keys[i].v = v;
            return 0;
        }
    return -1;
}

long long fake_nvml_get(const char *key)
{
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(keys[i].name, key) == 0)
            return *keys[i].v;
    return -999999;
}

int fake_nvml_push_xid(int dev, unsigned long long xid)
{
    if (xq_len == XID_QUEUE)
        return -1;
    xq[(xq_head + xq_len) % XID_QUEUE].dev = dev;
    xq[(xq_head + xq_len) % XID_QUEUE].xid = xid;
    xq_len++;
    return 0;
}

__attribute__((constructor)) static void fake_init(void)
{
    fake_nvml_reset();
}

/* ---- NVML ----------------------------------------------------------------------------------- */

/* NOT_SUPPORTED for a query of the passive GeForce card; GPU_IS_LOST for the lost one. */
#define DEV_CHECK(d)                                                                               \
    do {                                                                                           \
        if (!(d) || (d)->index < 0 || (d)->index >= FAKE_GPUS)                                     \
            return NVML_ERROR_INVALID_ARGUMENT;                                                    \
        if ((d)->index == st.lost_gpu)                                                             \
            return NVML_ERROR_GPU_IS_LOST;                                                         \
    } while (0)
#define GEFORCE_CANNOT()                                                                           \
    do {                                                                                           \
        if (st.geforce)                                                                            \
            return NVML_ERROR_NOT_SUPPORTED;                                                       \
    } while (0)

nvmlInit_fn nvmlInit, nvmlInit_v2;
nvmlReturn_t nvmlInit(void)
{
    st.init_v1_calls++;
    return (nvmlReturn_t)st.init_rc;
}

nvmlShutdown_fn nvmlShutdown;
nvmlReturn_t nvmlShutdown(void)
{
    st.shutdown_calls++;
    return NVML_SUCCESS;
}

nvmlErrorString_fn nvmlErrorString;
const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    default: return "Unknown Error";
    }
}

nvmlDeviceGetCount_fn nvmlDeviceGetCount;
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n)
{
#ifdef FAKE_NVML_OLD
    *n = (unsigned)st.count;
#else
    *n = (unsigned)st.count + 1; /* a caller that took this over _v2 sees a GPU too many */
#endif
    return NVML_SUCCESS;
}

nvmlDeviceGetHandleByIndex_fn nvmlDeviceGetHandleByIndex;
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d)
{
    if (i > FAKE_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[i];
    return NVML_SUCCESS;
}

nvmlDeviceGetString_fn nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetSerial;
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len)
{
    DEV_CHECK(d);
    if (len < 27)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, st.arch >= 7 ? "NVIDIA GeForce RTX 3090" : "NVIDIA GeForce GTX 1070 Ti");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len)
{
    DEV_CHECK(d);
    if (len < 41)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, d->index == 0 ? "GPU-00000000-1070-0000-0000-000000000000"
                              : "GPU-11111111-1070-0000-0000-000000000000");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *buf, unsigned int len)
{
    (void)buf;
    (void)len;
    DEV_CHECK(d);
    return NVML_ERROR_NOT_SUPPORTED; /* GeForce cards have no serial number */
}

nvmlDeviceGetPciInfo_fn nvmlDeviceGetPciInfo;
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    DEV_CHECK(d);
    /* The first version's smaller struct: a 16-byte busId first, then numbers, reserved. */
    memset(p, 0, offsetof(nvmlPciInfo_t, busId) + 16);
    strcpy(p->busIdLegacy, "0000:03:00.0");
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD
nvmlReturn_t nvmlInit_v2(void)
{
    st.init_v2_calls++;
    return (nvmlReturn_t)st.init_rc;
}

nvmlDeviceGetCount_fn nvmlDeviceGetCount_v2;
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    *n = (unsigned)st.count;
    return NVML_SUCCESS;
}

nvmlDeviceGetHandleByIndex_fn nvmlDeviceGetHandleByIndex_v2;
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    if (i >= (unsigned)st.count || i >= FAKE_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devs[i];
    return NVML_SUCCESS;
}

nvmlDeviceGetPciInfo_fn nvmlDeviceGetPciInfo_v2, nvmlDeviceGetPciInfo_v3;
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    DEV_CHECK(d);
    memset(p, 0, sizeof *p);
    strcpy(p->busIdLegacy, "0000:02:00.0");
    strcpy(p->busId, "00000000:02:00.0");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    DEV_CHECK(d);
    memset(p, 0, sizeof *p);
    strcpy(p->busIdLegacy, "0000:01:00.0");
    strcpy(p->busId, "00000000:01:00.0");
    return NVML_SUCCESS;
}

nvmlDeviceGetUll_fn nvmlDeviceGetCurrentClocksEventReasons;
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *v)
{
    DEV_CHECK(d);
    *v = 0x4 | 0x20; /* software power cap, software thermal slowdown */
    return NVML_SUCCESS;
}

nvmlDeviceGetRetiredPages_v2_fn nvmlDeviceGetRetiredPages_v2;
nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, nvmlPageRetirementCause_t cause,
                                          unsigned int *count, unsigned long long *addresses,
                                          unsigned long long *timestamps)
{
    (void)addresses;
    (void)timestamps;
    DEV_CHECK(d);
    GEFORCE_CANNOT();
    unsigned have = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ? 1 : 2;
    nvmlReturn_t r = *count < have ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = have;
    return r;
}

nvmlEventSetWait_fn nvmlEventSetWait_v2;
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms)
{
    (void)ms;
    st.wait_v2_calls++;
    if (set != &event_set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (xq_len == 0)
        return NVML_ERROR_TIMEOUT;
    memset(data, 0, sizeof *data);
    data->device = &devs[xq[xq_head].dev];
    data->eventType = nvmlEventTypeXidCriticalError;
    data->eventData = xq[xq_head].xid;
    data->gpuInstanceId = data->computeInstanceId = 0xffffffffu;
    xq_head = (xq_head + 1) % XID_QUEUE;
    xq_len--;
    return NVML_SUCCESS;
}
#endif

nvmlDeviceGetRetiredPages_fn nvmlDeviceGetRetiredPages;
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, nvmlPageRetirementCause_t cause,
                                       unsigned int *count, unsigned long long *addresses)
{
    (void)addresses;
    DEV_CHECK(d);
    GEFORCE_CANNOT();
    unsigned have = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ? 1 : 2;
    nvmlReturn_t r = *count < have ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = have;
    return r;
}

nvmlDeviceGetUll_fn nvmlDeviceGetCurrentClocksThrottleReasons;
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *v)
{
    DEV_CHECK(d);
    *v = 0x40 | 0x100; /* hardware thermal slowdown, display clock setting (not an RK bit) */
    return NVML_SUCCESS;
}

nvmlEventSetWait_fn nvmlEventSetWait;
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms)
{
    (void)ms;
    st.wait_v1_calls++;
    if (set != &event_set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (xq_len == 0)
        return NVML_ERROR_TIMEOUT;
    /* The first version's struct ends after eventData. */
    data->device = &devs[xq[xq_head].dev];
    data->eventType = nvmlEventTypeXidCriticalError;
    data->eventData = xq[xq_head].xid;
    xq_head = (xq_head + 1) % XID_QUEUE;
    xq_len--;
    return NVML_SUCCESS;
}

nvmlDeviceGetTemperature_fn nvmlDeviceGetTemperature;
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t s, unsigned int *t)
{
    DEV_CHECK(d);
    if (s != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (st.temp_rc)
        return (nvmlReturn_t)st.temp_rc;
    *t = 67;
    return NVML_SUCCESS;
}

nvmlDeviceGetUint_fn nvmlDeviceGetFanSpeed, nvmlDeviceGetPowerUsage,
    nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetPowerManagementLimit,
    nvmlDeviceGetPowerManagementDefaultLimit, nvmlDeviceGetCurrPcieLinkGeneration,
    nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkGeneration,
    nvmlDeviceGetMaxPcieLinkWidth, nvmlDeviceGetPcieReplayCounter;

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    GEFORCE_CANNOT(); /* a passive (blower-less) card */
    *v = 55;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = 151234;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = st.limit_calls ? (unsigned)st.limit_mw : 180000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = st.limit_calls ? (unsigned)st.limit_mw : 180000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = 180000;
    return NVML_SUCCESS;
}

nvmlDeviceGetPowerManagementLimitConstraints_fn nvmlDeviceGetPowerManagementLimitConstraints;
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t d, unsigned int *lo,
                                                          unsigned int *hi)
{
    DEV_CHECK(d);
    *lo = 90000;
    *hi = 217000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = 3;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = 8; /* an x16 card running x8 */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = 3;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = 16;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *v)
{
    DEV_CHECK(d);
    *v = 12;
    return NVML_SUCCESS;
}

nvmlDeviceGetClockInfo_fn nvmlDeviceGetClockInfo, nvmlDeviceGetMaxClockInfo;
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, nvmlClockType_t t, unsigned int *v)
{
    DEV_CHECK(d);
    if (t == NVML_CLOCK_SM)
        *v = st.lock_calls ? (unsigned)st.lock_max : 1607;
    else if (t == NVML_CLOCK_MEM)
        *v = 4006;
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, nvmlClockType_t t, unsigned int *v)
{
    DEV_CHECK(d);
    if (t != NVML_CLOCK_SM)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = 1911;
    return NVML_SUCCESS;
}

nvmlDeviceGetUtilizationRates_fn nvmlDeviceGetUtilizationRates;
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    DEV_CHECK(d);
    u->gpu = 97;
    u->memory = 40;
    return NVML_SUCCESS;
}

nvmlDeviceGetMemoryInfo_fn nvmlDeviceGetMemoryInfo;
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    DEV_CHECK(d);
    m->total = 8ULL << 30;
    m->used = 2ULL << 30;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlDeviceGetTotalEccErrors_fn nvmlDeviceGetTotalEccErrors;
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, nvmlMemoryErrorType_t e,
                                         nvmlEccCounterType_t c, unsigned long long *v)
{
    DEV_CHECK(d);
    GEFORCE_CANNOT();
    if (c != NVML_AGGREGATE_ECC)
        *v = 999; /* the volatile counter would be the wrong one */
    else
        *v = e == NVML_MEMORY_ERROR_TYPE_CORRECTED ? 5 : 1;
    return NVML_SUCCESS;
}

nvmlDeviceGetEnable_fn nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetPersistenceMode;
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, nvmlEnableState_t *v)
{
    DEV_CHECK(d);
    GEFORCE_CANNOT();
    *v = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *v)
{
    DEV_CHECK(d);
    *v = st.persistence[d->index] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

nvmlDeviceGetRemappedRows_fn nvmlDeviceGetRemappedRows;
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failed)
{
    DEV_CHECK(d);
    GEFORCE_CANNOT(); /* row remapping is Ampere and later */
    *corr = 3;
    *unc = 1;
    *pending = 0;
    *failed = 0;
    return NVML_SUCCESS;
}

nvmlDeviceGetUll_fn nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetSupportedEventTypes;
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *v)
{
    DEV_CHECK(d);
    *v = 123456789ULL; /* mJ */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *v)
{
    DEV_CHECK(d);
    if (!st.events_supported)
        return NVML_ERROR_NOT_SUPPORTED;
    *v = 0x1 | 0x2 | 0x4 | nvmlEventTypeXidCriticalError;
    return NVML_SUCCESS;
}

nvmlEventSetCreate_fn nvmlEventSetCreate;
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    st.event_sets++;
    *set = &event_set;
    return NVML_SUCCESS;
}

nvmlDeviceRegisterEvents_fn nvmlDeviceRegisterEvents;
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set)
{
    DEV_CHECK(d);
    if (set != &event_set || types != nvmlEventTypeXidCriticalError)
        return NVML_ERROR_INVALID_ARGUMENT;
    st.registered[d->index] = 1;
    return NVML_SUCCESS;
}

nvmlEventSetFree_fn nvmlEventSetFree;
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (set != &event_set)
        return NVML_ERROR_INVALID_ARGUMENT;
    st.event_sets--;
    return NVML_SUCCESS;
}

/* Locked clocks: Volta (5) and newer only, as NVML documents. */
nvmlDeviceSetGpuLockedClocks_fn nvmlDeviceSetGpuLockedClocks;
nvmlReturn_t nvmlDeviceSetGpuLockedClocks(nvmlDevice_t d, unsigned int lo, unsigned int hi)
{
    DEV_CHECK(d);
    if (st.set_rc)
        return (nvmlReturn_t)st.set_rc;
    if (st.arch < 5)
        return NVML_ERROR_NOT_SUPPORTED;
    st.lock_calls++;
    st.lock_dev = d->index;
    st.lock_min = lo;
    st.lock_max = hi;
    return NVML_SUCCESS;
}

nvmlDeviceResetGpuLockedClocks_fn nvmlDeviceResetGpuLockedClocks;
nvmlReturn_t nvmlDeviceResetGpuLockedClocks(nvmlDevice_t d)
{
    DEV_CHECK(d);
    if (st.set_rc)
        return (nvmlReturn_t)st.set_rc;
    if (st.arch < 5)
        return NVML_ERROR_NOT_SUPPORTED;
    st.reset_calls++;
    st.reset_dev = d->index;
    return NVML_SUCCESS;
}

nvmlDeviceSetPowerManagementLimit_fn nvmlDeviceSetPowerManagementLimit;
nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t d, unsigned int mw)
{
    DEV_CHECK(d);
    if (st.set_rc)
        return (nvmlReturn_t)st.set_rc;
    if (mw < 90000 || mw > 217000)
        return NVML_ERROR_INVALID_ARGUMENT;
    st.limit_calls++;
    st.limit_dev = d->index;
    st.limit_mw = mw;
    return NVML_SUCCESS;
}

nvmlDeviceSetPersistenceMode_fn nvmlDeviceSetPersistenceMode;
nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t mode)
{
    DEV_CHECK(d);
    if (st.set_rc)
        return (nvmlReturn_t)st.set_rc;
    st.persistence_calls++;
    st.persistence[d->index] = mode == NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OLD
nvmlDeviceGetArchitecture_fn nvmlDeviceGetArchitecture;
nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch)
{
    DEV_CHECK(d);
    *arch = (unsigned)st.arch;
    return NVML_SUCCESS;
}

nvmlDeviceGetBrand_fn nvmlDeviceGetBrand;
nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, unsigned int *brand)
{
    DEV_CHECK(d);
    *brand = (unsigned)st.brand;
    return NVML_SUCCESS;
}

/* Clock offsets: -500..+1000 MHz when "offsets" is set, else NOT_SUPPORTED. */
nvmlDeviceGetGpcClkVfOffset_fn nvmlDeviceGetGpcClkVfOffset;
nvmlReturn_t nvmlDeviceGetGpcClkVfOffset(nvmlDevice_t d, int *offset)
{
    DEV_CHECK(d);
    if (!st.offsets)
        return NVML_ERROR_NOT_SUPPORTED;
    *offset = (int)st.offset;
    return NVML_SUCCESS;
}

nvmlDeviceGetGpcClkMinMaxVfOffset_fn nvmlDeviceGetGpcClkMinMaxVfOffset;
nvmlReturn_t nvmlDeviceGetGpcClkMinMaxVfOffset(nvmlDevice_t d, int *lo, int *hi)
{
    DEV_CHECK(d);
    if (!st.offsets)
        return NVML_ERROR_NOT_SUPPORTED;
    *lo = -500;
    *hi = 1000;
    return NVML_SUCCESS;
}

nvmlDeviceSetGpcClkVfOffset_fn nvmlDeviceSetGpcClkVfOffset;
nvmlReturn_t nvmlDeviceSetGpcClkVfOffset(nvmlDevice_t d, int offset)
{
    DEV_CHECK(d);
    if (st.set_rc)
        return (nvmlReturn_t)st.set_rc;
    if (!st.offsets)
        return NVML_ERROR_NOT_SUPPORTED;
    if (offset < -500 || offset > 1000)
        return NVML_ERROR_INVALID_ARGUMENT;
    st.offset_calls++;
    st.offset = offset;
    return NVML_SUCCESS;
}
#endif
