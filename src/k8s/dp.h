/*
 * rk device-plugin (docs/device-plugin.md): the Kubernetes device plugin that lets the kubelet
 * hand out only the GPUs rekindle trusts. It speaks the kubelet's v1beta1 device-plugin API
 * (third_party/deviceplugin/v1beta1/api.proto) with gRPC core's C API for the transport and
 * protobuf-c for the messages (generated at build time from a messages-only copy). Four parts:
 *
 *   policy.c   pure decisions: a device's health with hysteresis, the preferred allocation's
 *              order, Allocate's refusal, the PCIe switch a sysfs path names, device ids
 *   msg.c      every message the plugin parses (the kubelet's requests, Register's reply),
 *              unpacked with bounds and checked; a refusal is a gRPC status with a message
 *   devices.c  the node's GPUs: NVML or the simulator (rk_telemetry), scored by the health
 *              monitor (rk_monitor) with the textfile sensors merged; sysfs for the PCIe switch
 *              and NUMA node, /dev for the device nodes
 *   plugin.c   the gRPC server on DIR/SOCKET, the Register call on DIR/kubelet.sock, the watch
 *              on both sockets (re-registration after a kubelet restart) and the loop
 *
 * Library code: nothing here prints or exits; what happens goes to an event callback.
 * Not thread-safe: one thread runs a plugin (gRPC core keeps its own threads inside).
 */
#ifndef RK_K8S_DP_H
#define RK_K8S_DP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/health.h"

/* The v1beta1 API's constants (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go). */
#define RK_DP_API_VERSION "v1beta1"
#define RK_DP_HEALTHY "Healthy"
#define RK_DP_UNHEALTHY "Unhealthy"
#define RK_DP_KUBELET_SOCKET "kubelet.sock"
#define RK_DP_DEFAULT_DIR "/var/lib/kubelet/device-plugins"
#define RK_DP_DEFAULT_RESOURCE "rekindle.io/gpu"
#define RK_DP_DEFAULT_SOCKET "rekindle.sock"
#define RK_DP_DEFAULT_HYSTERESIS 10.0

/* Bounds on what the plugin accepts from the kubelet (msg.c). A device id is at most 63
 * bytes (the API's limit), printable ASCII without spaces. */
#define RK_DP_MAX_MSG (1u << 20) /* bytes of one request */
#define RK_DP_MAX_CONTAINERS 64  /* container requests in one request */
#define RK_DP_MAX_IDS 1024       /* device ids in one container request */
#define RK_DP_MAX_ID 63          /* bytes of one device id */
#define RK_DP_MAX_DEVICES 1024   /* GPUs one plugin serves */
#define RK_DP_NODE_PATH 256      /* bytes of a device node's path, NUL included */

/* gRPC status codes the plugin answers with (grpc/status.h's values, so that policy.c and
 * msg.c need no gRPC header). */
enum {
    RK_DP_OK = 0,
    RK_DP_INVALID_ARGUMENT = 3,
    RK_DP_NOT_FOUND = 5,
    RK_DP_RESOURCE_EXHAUSTED = 8,
    RK_DP_FAILED_PRECONDITION = 9,
    RK_DP_UNIMPLEMENTED = 12,
    RK_DP_INTERNAL = 13,
    RK_DP_UNAVAILABLE = 14
};

/* A gRPC status to answer with: code RK_DP_OK or one of the above, and a one-line message. */
typedef struct rk_dp_status {
    int code;
    char msg[512];
} rk_dp_status;

/* ---- the devices as the policy sees them (policy.c) ------------------------------------ */

typedef struct rk_dp_dev {
    char id[RK_DP_MAX_ID + 1]; /* what the kubelet calls it: the GPU's UUID (sim: its index) */
    char uuid[96];             /* NVML's "GPU-..." (sim: "SIM-<seed>-<index>") */
    char bus_id[32];           /* PCI bus id, "" unknown */
    char sw[128];              /* the PCIe switch it sits under (rk_dp_switch_key), "" unknown */
    int index;                 /* 0.. in the backend's order */
    int numa;                  /* NUMA node, -1 unknown */
    int minor;                 /* /dev/nvidiaN's N, -1 unknown */
    bool simulated;
    bool has_score;   /* false until a reading succeeded */
    int score;        /* 0..100 (the health monitor's) */
    bool healthy;     /* by rk_dp_health_next */
    int failed_reads; /* readings failed in a row (the monitor's) */
    bool changed;     /* the last rk_dp_fleet_sample gave it its first health or changed it */
    char why[200];    /* the worst finding, "" none */
} rk_dp_dev;

/* A device's health after a new score (policy, docs/device-plugin.md): a device is Unhealthy
 * when it scores below `threshold` and Healthy again only at `threshold + hysteresis` or
 * above; a score in between keeps its state. The first score (`first`) is judged against the
 * threshold alone. A device without a score (never read) is Unhealthy. */
bool rk_dp_health_next(bool healthy, bool first, bool has_score, int score, double threshold,
                       double hysteresis);

/* Readings failed in a row that make a device Unhealthy ("no reading for N intervals"). */
#define RK_DP_STALE_READS 3

/* A device after one health reading (the monitor's has_score, score and failed_reads; why:
 * its worst finding, NULL none): RK_DP_STALE_READS or more failed readings in a row make it
 * Unhealthy with why "no reading for N intervals", whatever its last score; otherwise its
 * health is rk_dp_health_next's (so a device back from failed readings needs threshold +
 * hysteresis). True when its health changed. */
bool rk_dp_dev_update(rk_dp_dev *d, bool has_score, int score, int failed_reads, const char *why,
                      double threshold, double hysteresis);

/* The index of the device whose id is `id` (exact match), or -1. */
int rk_dp_find(const rk_dp_dev *devs, int n, const char *id);

/* A preferred allocation (GetPreferredAllocation): `size` device indexes into out[] (room for
 * `size`) chosen from avail[] (navail indexes), with every one of must[] (nmust indexes, all in
 * avail) first, in their order. The rest, in this order:
 *   1. Healthy devices before Unhealthy ones (the kubelet offers only Healthy ones; an
 *      Unhealthy one offered all the same comes last, only when nothing else is left);
 *   2. devices under the anchor PCIe switch first: the switch of must[0], or without must[],
 *      the switch that holds the most Healthy available devices (ties: the higher best score,
 *      then the lower index); a device whose switch is unknown is under none;
 *   3. the higher score first, then the lower index.
 * Duplicates in avail or must count once. RK_DP_OK, or RK_DP_INVALID_ARGUMENT with a message
 * when size is negative, smaller than must's or larger than the distinct available devices. */
int rk_dp_prefer(const rk_dp_dev *devs, int n, const int *avail, int navail, const int *must,
                 int nmust, int size, int *out, rk_dp_status *st);

/* Allocate's check of one container's devices (ids[], nids): RK_DP_OK when every id names a
 * known device that is Healthy, each once; RK_DP_NOT_FOUND naming an unknown id,
 * RK_DP_INVALID_ARGUMENT naming one asked for twice, or RK_DP_FAILED_PRECONDITION naming the
 * first device that is Unhealthy, its score and why. */
int rk_dp_allocate_check(const rk_dp_dev *devs, int n, char *const *ids, size_t nids,
                         double threshold, double hysteresis, rk_dp_status *st);

/* The PCIe switch a GPU sits under, from its resolved sysfs device path
 * ("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0"): the
 * device two levels above the GPU (the GPU's parent is a switch's downstream port, the one
 * above it the switch's upstream port), as that path ("/sys/devices/pci0000:00/0000:00:01.0/
 * 0000:01:00.0"). A GPU on a root port gets its root complex ("/sys/devices/pci0000:00").
 * RK_EINVAL when the path has fewer components than that. */
int rk_dp_switch_key(const char *path, char *out, size_t cap);

/* An extended resource name: DOMAIN/NAME, DOMAIN of lower-case letters, digits, '.' and '-'
 * (at most 253), NAME of letters, digits, '.', '_' and '-' (1..63), as "rekindle.io/gpu". */
bool rk_dp_resource_ok(const char *s);

/* A device id the API allows: 1..63 bytes of printable ASCII, no spaces. */
bool rk_dp_id_ok(const char *s, size_t len);

/* ---- the messages the plugin parses (msg.c) -------------------------------------------- */

/* A parsed request: every id checked (rk_dp_id_ok), counts within the bounds above. The
 * strings point into `pb`, the unpacked protobuf-c message, freed by rk_dp_request_free. */
typedef struct rk_dp_container {
    char **ids; /* AllocateRequest, PreStartContainerRequest: the devices; Preferred: available */
    size_t nids;
    char **must; /* PreferredAllocationRequest only */
    size_t nmust;
    int size; /* PreferredAllocationRequest only: allocation_size */
} rk_dp_container;

typedef enum rk_dp_kind {
    RK_DP_MSG_EMPTY,     /* GetDevicePluginOptions, ListAndWatch; Register's reply */
    RK_DP_MSG_ALLOCATE,  /* AllocateRequest */
    RK_DP_MSG_PREFERRED, /* PreferredAllocationRequest */
    RK_DP_MSG_PRESTART,  /* PreStartContainerRequest */
    RK_DP_MSG_KINDS
} rk_dp_kind;

typedef struct rk_dp_request {
    rk_dp_kind kind;
    size_t n; /* containers (1 for PreStartContainerRequest, 0 for Empty) */
    rk_dp_container c[RK_DP_MAX_CONTAINERS];
    void *pb; /* the unpacked message */
} rk_dp_request;

/* Unpack `len` bytes as a message of `kind` and check it. RK_DP_OK; or the status to answer
 * with (RK_DP_RESOURCE_EXHAUSTED over RK_DP_MAX_MSG, RK_DP_INVALID_ARGUMENT naming the field
 * and problem), with nothing to free. */
int rk_dp_request_parse(rk_dp_kind kind, const uint8_t *buf, size_t len, rk_dp_request *out,
                        rk_dp_status *st);
void rk_dp_request_free(rk_dp_request *r);
const char *rk_dp_kind_name(rk_dp_kind kind);

/* ---- the node's GPUs (devices.c) -------------------------------------------------------- */

typedef struct rk_dp_fleet rk_dp_fleet;

typedef struct rk_dp_fleet_opts {
    int sim_gpus; /* > 0: a simulated fleet of that many GPUs instead of NVML */
    uint64_t seed;
    double age_h;
    rk_sim_load load;         /* sim: idle (the default) or busy */
    bool sensors;             /* sim: VRM ripple and fan vibration reported too */
    const char *textfile_dir; /* NULL: none */
    double threshold, hysteresis;
    const char *sysfs;   /* "/sys" (tests: another root) */
    const char *devdir;  /* "/dev" */
    const char *procdir; /* "/proc" */
} rk_dp_fleet_opts;

int rk_dp_fleet_open(rk_dp_fleet **out, const rk_dp_fleet_opts *o, rk_err *err);
void rk_dp_fleet_close(rk_dp_fleet *f);
/* Read every GPU, rescore it and update its health. *changed: how many devices changed
 * health (the first reading counts every device). A failed reading keeps the last state. */
int rk_dp_fleet_sample(rk_dp_fleet *f, int *changed, rk_err *err);
int rk_dp_fleet_count(const rk_dp_fleet *f);
const rk_dp_dev *rk_dp_fleet_devs(const rk_dp_fleet *f);
bool rk_dp_fleet_simulated(const rk_dp_fleet *f);
const char *rk_dp_fleet_backend(const rk_dp_fleet *f);
/* The device nodes that exist for a container holding devs[idx[0..n-1]]: /dev/nvidiaN of each
 * by its minor number (none for a GPU whose minor is unknown) and the shared ones (/dev/nvidiactl,
 * /dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia-modeset). None for simulated GPUs. paths[]
 * has room for `cap`; returns how many. */
int rk_dp_fleet_nodes(const rk_dp_fleet *f, const int *idx, int n, char (*paths)[RK_DP_NODE_PATH],
                      int cap);

/* ---- the plugin (plugin.c) ------------------------------------------------------------- */

typedef struct rk_dp_opts {
    const char *dir;      /* the kubelet's device-plugin directory */
    const char *socket;   /* our socket's name in dir */
    const char *resource; /* "rekindle.io/gpu" */
    double interval_s;    /* health readings this often */
    double threshold, hysteresis;
    rk_dp_fleet_opts fleet;
    /* What happens (registered, a device changed health, the kubelet is gone): one line each,
     * without a prefix. NULL: nothing. */
    void (*on_event)(void *ctx, const char *line);
    void *event_ctx;
    /* Polled every loop turn (at least every 100 ms): nonzero stops the plugin. */
    int (*should_stop)(void *ctx);
    void *stop_ctx;
} rk_dp_opts;

/* Serve until should_stop says so: open the fleet, bind DIR/SOCKET, register, watch. Returns
 * RK_OK after a requested stop (the socket removed), or an error before serving (RK_EINVAL a
 * bad option, the fleet's, RK_EIO the socket cannot be bound or a file that is not a socket is
 * there, RK_EBUSY another process answers on it) with a message; RK_EBUSY also while serving,
 * when another process's socket took ours over (ours is then left to the process's exit, with
 * gRPC's state: a caller should exit). The kubelet being absent or
 * refusing is no error: it is reported and retried with a backoff (1 s doubling to 30 s). */
int rk_dp_run(const rk_dp_opts *o, rk_err *err);

#endif
