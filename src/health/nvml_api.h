/*
 * The few types, constants and function types of the NVIDIA Management Library (NVML) C API
 * that rekindle uses, copied from the public nvml.h so that nothing builds against the CUDA
 * toolkit or links against the driver. nvml.c resolves every function at run time with dlsym
 * into pointers of these types; tests/fake_nvml.c implements them for the tests. Names follow
 * NVML's own so that they can be checked against its documentation.
 */
#ifndef RK_HEALTH_NVML_API_H
#define RK_HEALTH_NVML_API_H

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef enum nvmlEnableState_enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;
typedef enum nvmlTemperatureSensors_enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;
typedef enum nvmlClockType_enum {
    NVML_CLOCK_GRAPHICS = 0,
    NVML_CLOCK_SM = 1,
    NVML_CLOCK_MEM = 2,
    NVML_CLOCK_VIDEO = 3
} nvmlClockType_t;
typedef enum nvmlMemoryErrorType_enum {
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
} nvmlMemoryErrorType_t;
typedef enum nvmlEccCounterType_enum {
    NVML_VOLATILE_ECC = 0,
    NVML_AGGREGATE_ECC = 1
} nvmlEccCounterType_t;
typedef enum nvmlPageRetirementCause_enum {
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0,
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
} nvmlPageRetirementCause_t;

#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_SERIAL_BUFFER_SIZE 30
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16

/* The layout of nvmlDeviceGetPciInfo_v2 and _v3. The first version wrote a 16-byte busId
 * where busIdLegacy is, then the same numbers and 16 reserved bytes (a smaller struct). */
typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct nvmlUtilization_st {
    unsigned int gpu;    /* percent of time a kernel ran over the last sample period */
    unsigned int memory; /* percent of time device memory was read or written */
} nvmlUtilization_t;

typedef struct nvmlMemory_st {
    unsigned long long total, free, used; /* bytes */
} nvmlMemory_t;

/* nvmlEventSetWait_v2's layout; the first version writes only the first three fields. */
typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData; /* the Xid for nvmlEventTypeXidCriticalError (999: unknown) */
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL

/* Function types, one per NVML entry point (versions with the same signature share one). */
typedef nvmlReturn_t nvmlInit_fn(void);
typedef nvmlReturn_t nvmlShutdown_fn(void);
typedef const char *nvmlErrorString_fn(nvmlReturn_t result);
typedef nvmlReturn_t nvmlDeviceGetCount_fn(unsigned int *deviceCount);
typedef nvmlReturn_t nvmlDeviceGetHandleByIndex_fn(unsigned int index, nvmlDevice_t *device);
/* nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetSerial */
typedef nvmlReturn_t nvmlDeviceGetString_fn(nvmlDevice_t device, char *buf, unsigned int length);
typedef nvmlReturn_t nvmlDeviceGetPciInfo_fn(nvmlDevice_t device, nvmlPciInfo_t *pci);
typedef nvmlReturn_t nvmlDeviceGetTemperature_fn(nvmlDevice_t device,
                                                 nvmlTemperatureSensors_t sensorType,
                                                 unsigned int *temp);
/* nvmlDeviceGetFanSpeed (percent), nvmlDeviceGetPowerUsage (mW),
 * nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetPowerManagementLimit,
 * nvmlDeviceGetPowerManagementDefaultLimit (mW), nvmlDeviceGetCurrPcieLinkGeneration,
 * nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkGeneration,
 * nvmlDeviceGetMaxPcieLinkWidth, nvmlDeviceGetPcieReplayCounter */
typedef nvmlReturn_t nvmlDeviceGetUint_fn(nvmlDevice_t device, unsigned int *value);
/* nvmlDeviceGetCurrentClocksEventReasons (ThrottleReasons before r535),
 * nvmlDeviceGetTotalEnergyConsumption (mJ), nvmlDeviceGetSupportedEventTypes */
typedef nvmlReturn_t nvmlDeviceGetUll_fn(nvmlDevice_t device, unsigned long long *value);
typedef nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints_fn(nvmlDevice_t device,
                                                                     unsigned int *minLimit,
                                                                     unsigned int *maxLimit);
/* nvmlDeviceGetClockInfo (current), nvmlDeviceGetMaxClockInfo (MHz) */
typedef nvmlReturn_t nvmlDeviceGetClockInfo_fn(nvmlDevice_t device, nvmlClockType_t type,
                                               unsigned int *clock);
typedef nvmlReturn_t nvmlDeviceGetUtilizationRates_fn(nvmlDevice_t device,
                                                      nvmlUtilization_t *utilization);
typedef nvmlReturn_t nvmlDeviceGetMemoryInfo_fn(nvmlDevice_t device, nvmlMemory_t *memory);
typedef nvmlReturn_t nvmlDeviceGetTotalEccErrors_fn(nvmlDevice_t device,
                                                    nvmlMemoryErrorType_t errorType,
                                                    nvmlEccCounterType_t counterType,
                                                    unsigned long long *eccCounts);
typedef nvmlReturn_t nvmlDeviceGetRetiredPages_fn(nvmlDevice_t device,
                                                  nvmlPageRetirementCause_t cause,
                                                  unsigned int *pageCount,
                                                  unsigned long long *addresses);
typedef nvmlReturn_t nvmlDeviceGetRetiredPages_v2_fn(nvmlDevice_t device,
                                                     nvmlPageRetirementCause_t cause,
                                                     unsigned int *pageCount,
                                                     unsigned long long *addresses,
                                                     unsigned long long *timestamps);
/* nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetPersistenceMode */
typedef nvmlReturn_t nvmlDeviceGetEnable_fn(nvmlDevice_t device, nvmlEnableState_t *state);
typedef nvmlReturn_t nvmlDeviceGetRemappedRows_fn(nvmlDevice_t device, unsigned int *corrRows,
                                                  unsigned int *uncRows, unsigned int *isPending,
                                                  unsigned int *failureOccurred);
typedef nvmlReturn_t nvmlEventSetCreate_fn(nvmlEventSet_t *set);
typedef nvmlReturn_t nvmlDeviceRegisterEvents_fn(nvmlDevice_t device, unsigned long long eventTypes,
                                                 nvmlEventSet_t set);
/* nvmlEventSetWait_v2 and nvmlEventSetWait */
typedef nvmlReturn_t nvmlEventSetWait_fn(nvmlEventSet_t set, nvmlEventData_t *data,
                                         unsigned int timeoutms);
typedef nvmlReturn_t nvmlEventSetFree_fn(nvmlEventSet_t set);
typedef nvmlReturn_t nvmlDeviceSetGpuLockedClocks_fn(nvmlDevice_t device,
                                                     unsigned int minGpuClockMHz,
                                                     unsigned int maxGpuClockMHz);
typedef nvmlReturn_t nvmlDeviceResetGpuLockedClocks_fn(nvmlDevice_t device);
typedef nvmlReturn_t nvmlDeviceSetPowerManagementLimit_fn(nvmlDevice_t device, unsigned int limit);
typedef nvmlReturn_t nvmlDeviceSetPersistenceMode_fn(nvmlDevice_t device, nvmlEnableState_t mode);
/* Architecture (NVML_DEVICE_ARCH_*: Kepler 2 ... Blackwell 10) and brand (NVML_BRAND_*). */
typedef nvmlReturn_t nvmlDeviceGetArchitecture_fn(nvmlDevice_t device, unsigned int *arch);
typedef nvmlReturn_t nvmlDeviceGetBrand_fn(nvmlDevice_t device, unsigned int *brand);
#define NVML_BRAND_GEFORCE 5
#define NVML_BRAND_TITAN 6
#define NVML_BRAND_GEFORCE_RTX 15
#define NVML_BRAND_TITAN_RTX 16
/* The graphics clock's offset on its clock/voltage curve, MHz (Maxwell and newer where the
 * driver offers it), and the range it may take. */
typedef nvmlReturn_t nvmlDeviceGetGpcClkVfOffset_fn(nvmlDevice_t device, int *offset);
typedef nvmlReturn_t nvmlDeviceSetGpcClkVfOffset_fn(nvmlDevice_t device, int offset);
typedef nvmlReturn_t nvmlDeviceGetGpcClkMinMaxVfOffset_fn(nvmlDevice_t device, int *minOffset,
                                                          int *maxOffset);

#endif
