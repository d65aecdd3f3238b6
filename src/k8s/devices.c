/*
 * The device plugin's GPUs (dp.h): NVML or the simulated fleet through rk_telemetry, scored
 * by the health monitor (rekindle/monitor.h) with the textfile sensors merged, as rk exporter
 * and rk run's gate read them. sysfs gives each GPU's PCIe switch and NUMA node,
 * /proc/driver/nvidia its minor number (/dev/nvidiaN).
 */
#include "k8s/dp.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rekindle/health.h"
#include "rekindle/monitor.h"

struct rk_dp_fleet {
    rk_telemetry *t;
    rk_monitor *mon;
    int n;
    rk_dp_dev *devs;
    bool *seen; /* its health has been given once */
    double threshold, hysteresis;
    bool simulated;
    char devdir[PATH_MAX];
};

void rk_dp_fleet_close(rk_dp_fleet *f)
{
    if (!f)
        return;
    rk_monitor_free(f->mon);
    rk_telemetry_close(f->t);
    free(f->devs);
    free(f->seen);
    free(f);
}

/* NVML's "00000000:03:00.0" as sysfs names it: "0000:03:00.0". False when it is not one. */
static bool sysfs_bdf(const char *bus_id, char *out, size_t cap)
{
    unsigned dom, bus, dev, fn;
    char tail;
    if (sscanf(bus_id, "%x:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4 || dom > 0xffff ||
        bus > 0xff || dev > 0x1f || fn > 7)
        return false;
    return snprintf(out, cap, "%04x:%02x:%02x.%x", dom, bus, dev, fn) < (int)cap;
}

/* A small text file's first line (at most cap-1 bytes); false when it cannot be read. */
static bool read_small(const char *path, char *buf, size_t cap)
{
    FILE *fp = fopen(path, "re");
    if (!fp)
        return false;
    size_t n = fread(buf, 1, cap - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    return n > 0;
}

/* The PCIe switch, NUMA node and minor number of a real GPU (each left unknown when its file
 * is absent). */
static void locate(rk_dp_dev *d, const rk_dp_fleet_opts *o)
{
    char bdf[32], path[PATH_MAX], real[PATH_MAX], text[4096];
    if (!d->bus_id[0] || !sysfs_bdf(d->bus_id, bdf, sizeof bdf))
        return;
    const char *sys = o->sysfs ? o->sysfs : "/sys";
    if (snprintf(path, sizeof path, "%s/bus/pci/devices/%s", sys, bdf) < (int)sizeof path &&
        realpath(path, real))
        rk_dp_switch_key(real, d->sw, sizeof d->sw);
    if (snprintf(path, sizeof path, "%s/bus/pci/devices/%s/numa_node", sys, bdf) <
            (int)sizeof path &&
        read_small(path, text, sizeof text)) {
        long v = strtol(text, NULL, 10);
        d->numa = v >= 0 && v < 1024 ? (int)v : -1;
    }
    const char *proc = o->procdir ? o->procdir : "/proc";
    if (snprintf(path, sizeof path, "%s/driver/nvidia/gpus/%s/information", proc, bdf) <
            (int)sizeof path &&
        read_small(path, text, sizeof text)) {
        const char *m = strstr(text, "Device Minor:");
        if (m) {
            long v = strtol(m + strlen("Device Minor:"), NULL, 10);
            d->minor = v >= 0 && v < 256 ? (int)v : -1;
        }
    }
}

int rk_dp_fleet_open(rk_dp_fleet **out, const rk_dp_fleet_opts *o, rk_err *err)
{
    *out = NULL;
    rk_dp_fleet *f = calloc(1, sizeof *f);
    if (!f)
        return rk_err_set(err, RK_ENOMEM, "device plugin: out of memory");
    rk_telemetry_opts to = RK_TELEMETRY_OPTS_DEFAULT;
    to.textfile_dir = o->textfile_dir;
    if (o->sim_gpus > 0) {
        to.sim_gpus = o->sim_gpus;
        to.seed = o->seed;
        to.start_age_h = o->age_h;
        to.sim_load = o->load;
        to.sim_sensors = o->sensors;
    }
    int rc = rk_telemetry_open(&f->t, o->sim_gpus > 0 ? "sim" : "nvml", &to, err);
    if (rc) {
        free(f);
        return rc;
    }
    f->n = rk_telemetry_count(f->t);
    f->threshold = o->threshold;
    f->hysteresis = o->hysteresis;
    f->simulated = o->sim_gpus > 0;
    snprintf(f->devdir, sizeof f->devdir, "%s", o->devdir ? o->devdir : "/dev");
    if (f->n <= 0 || f->n > RK_DP_MAX_DEVICES) {
        rk_err_set(err, RK_ENOTSUP, "device plugin: %d GPUs through %s (1..%d served)", f->n,
                   rk_telemetry_backend(f->t), RK_DP_MAX_DEVICES);
        rk_dp_fleet_close(f);
        return RK_ENOTSUP;
    }
    rk_monitor_opts mo = RK_MONITOR_OPTS_DEFAULT;
    f->devs = calloc((size_t)f->n, sizeof *f->devs);
    f->seen = calloc((size_t)f->n, sizeof *f->seen);
    if (!f->devs || !f->seen) {
        rk_dp_fleet_close(f);
        return rk_err_set(err, RK_ENOMEM, "device plugin: out of memory");
    }
    if ((rc = rk_monitor_create(&f->mon, f->n, &mo, err))) {
        rk_dp_fleet_close(f);
        return rc;
    }
    for (int i = 0; i < f->n; i++) {
        rk_dp_dev *d = &f->devs[i];
        rk_gpu_info info;
        memset(&info, 0, sizeof info);
        rk_telemetry_info(f->t, i, &info);
        d->index = i;
        d->numa = -1;
        d->minor = -1;
        d->simulated = info.simulated || f->simulated;
        snprintf(d->uuid, sizeof d->uuid, "%s", info.uuid);
        snprintf(d->bus_id, sizeof d->bus_id, "%s", info.bus_id);
        /* the id: the UUID of a real GPU; a simulated one's index (what its textfile label
         * gpu="N" names) */
        if (!d->simulated && rk_dp_id_ok(d->uuid, strlen(d->uuid)))
            snprintf(d->id, sizeof d->id, "%.*s", RK_DP_MAX_ID, d->uuid); /* id_ok: fits */
        else
            snprintf(d->id, sizeof d->id, "%d", i);
        if (d->simulated) /* two simulated GPUs to a simulated switch */
            snprintf(d->sw, sizeof d->sw, "sim-switch-%d", i / 2);
        else
            locate(d, o);
    }
    *out = f;
    return RK_OK;
}

int rk_dp_fleet_sample(rk_dp_fleet *f, int *changed, rk_err *err)
{
    *changed = 0;
    int rc = rk_monitor_read(f->mon, f->t, err);
    for (int i = 0; i < f->n; i++) {
        const rk_monitor_gpu *g = rk_monitor_gpu_state(f->mon, i);
        rk_dp_dev *d = &f->devs[i];
        d->changed = false;
        /* a failed reading of a GPU that has a score keeps its score (the monitor's rule), but
         * RK_DP_STALE_READS of them in a row make it Unhealthy (policy.c) */
        bool announced = f->seen[i];
        char why[sizeof d->why] = "";
        if (g->has_score && g->nfindings)
            snprintf(why, sizeof why, "%s: %s", g->findings[0].code, g->findings[0].message);
        bool flipped = rk_dp_dev_update(d, g->has_score, g->score, g->failed_reads, why,
                                        f->threshold, f->hysteresis);
        if (!announced || flipped) {
            d->changed = true;
            (*changed)++;
        }
        f->seen[i] = true;
    }
    return rc;
}

int rk_dp_fleet_count(const rk_dp_fleet *f)
{
    return f->n;
}

const rk_dp_dev *rk_dp_fleet_devs(const rk_dp_fleet *f)
{
    return f->devs;
}

bool rk_dp_fleet_simulated(const rk_dp_fleet *f)
{
    return f->simulated;
}

const char *rk_dp_fleet_backend(const rk_dp_fleet *f)
{
    return rk_telemetry_backend(f->t);
}

static bool is_chardev(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

int rk_dp_fleet_nodes(const rk_dp_fleet *f, const int *idx, int n, char (*paths)[RK_DP_NODE_PATH],
                      int cap)
{
    int k = 0;
    if (f->simulated)
        return 0;
    for (int j = 0; j < n && k < cap; j++) {
        const rk_dp_dev *d = &f->devs[idx[j]];
        if (d->minor <
            0) /* the NVML index need not be the minor: no node rather than another GPU's */
            continue;
        if (snprintf(paths[k], RK_DP_NODE_PATH, "%s/nvidia%d", f->devdir, d->minor) <
                RK_DP_NODE_PATH &&
            is_chardev(paths[k]))
            k++;
    }
    static const char *const shared[] = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                                         "nvidia-modeset"};
    for (size_t s = 0; s < sizeof shared / sizeof shared[0] && k < cap; s++)
        if (snprintf(paths[k], RK_DP_NODE_PATH, "%s/%s", f->devdir, shared[s]) < RK_DP_NODE_PATH &&
            is_chardev(paths[k]))
            k++;
    return k;
}
