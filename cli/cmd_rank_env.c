/*
 * rk _rank-env -- WORKER [ARGS...]: the hidden wrapper rk run puts in front of the worker
 * under mpirun and srun. Sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from the
 * launcher's variables (src/supervisor/env.c), this host's RK_SNAP_DIR from RK_SNAP_DIRS
 * across hosts, and execs the worker in place: the same pid,
 * so the heartbeat's hello check against the kernel holds (docs/run.md). A worker that is this
 * same rk binary (rk train) is not exec'd again: its command runs in this process. No launcher's
 * variables to read, or a worker that cannot be executed: one line and exit status 2.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/phase.h"
#include "base/text.h"
#include "cluster/slurm.h"
#include "rk.h"
#include "supervisor/supervisor.h"

static const char *get(const char *name)
{
    return getenv(name);
}

/* From RK_DEVICES "h1:0,h1:2,h2:0" (HOST:INDEX ids: rk run sets RK_DEVICES_BY_HOST=1 with
 * them) and a rank: the device indices of that rank's host in order ("0,2" for rank 0 or 1)
 * into out. Where the launcher gave the node's GPUs already (Slurm's CUDA_VISIBLE_DEVICES of
 * the step, "5,6"), index i is its item i. 1 when out is set; 0 with a message in why. */
static int host_devices(const char *list, long rank, char *out, size_t cap, char *why, size_t wcap)
{
    char mine[300], id[300];
    if (!rk_text_list_item(list, rank, id, sizeof id)) {
        snprintf(why, wcap, "RK_DEVICES has no item %ld", rank);
        return 0;
    }
    const char *c = strrchr(id, ':');
    if (!c || c == id) {
        snprintf(why, wcap, "RK_DEVICES item %ld is not HOST:INDEX", rank);
        return 0;
    }
    snprintf(mine, sizeof mine, "%.*s", (int)(c - id), id);
    const char *given = getenv("CUDA_VISIBLE_DEVICES");
    size_t used = 0, ml = strlen(mine);
    out[0] = '\0';
    for (long k = 0; rk_text_list_item(list, k, id, sizeof id); k++) {
        c = strrchr(id, ':');
        if (!c || (size_t)(c - id) != ml || strncmp(id, mine, ml) != 0)
            continue;
        char *end;
        errno = 0;
        long idx = strtol(c + 1, &end, 10);
        if (!c[1] || *end || errno || idx < 0 || idx > 4095 || (c[1] == '0' && c[2])) {
            snprintf(why, wcap, "RK_DEVICES item %ld: '%.20s' is not a device index", k, c + 1);
            return 0;
        }
        char dev[64];
        if (given && *given && !rk_text_list_item(given, idx, dev, sizeof dev)) {
            snprintf(why, wcap,
                     "device %s:%ld: the launcher's CUDA_VISIBLE_DEVICES (%.100s) has "
                     "no item %ld",
                     mine, idx, given, idx);
            return 0;
        }
        if (!(given && *given))
            snprintf(dev, sizeof dev, "%ld", idx);
        int w = snprintf(out + used, cap - used, "%s%s", used ? "," : "", dev);
        if (w < 0 || (size_t)w >= cap - used) {
            snprintf(why, wcap, "this host's devices do not fit CUDA_VISIBLE_DEVICES");
            return 0;
        }
        used += (size_t)w;
    }
    return 1;
}

/* From RK_SNAP_DIRS "h1=/dev/shm/rk-snap-a,h2=/dev/shm/rk-snap-b" (one mpirun across the
 * hosts: each node's agent keeps its ranks' snapshots, docs/recovery.md) and the rank's host
 * (RK_DEVICES item RANK, HOST:INDEX): that host's directory into out. 1 when set; 0 with a
 * message in why (every rank snapshots or none: a rank without its host's is refused). */
static int host_snap_dir(const char *dirs, const char *devices, long rank, char *out, size_t cap,
                         char *why, size_t wcap)
{
    char id[300], item[4200];
    const char *c;
    if (!devices || !rk_text_list_item(devices, rank, id, sizeof id) || !(c = strrchr(id, ':'))) {
        snprintf(why, wcap, "RK_SNAP_DIRS without a HOST:INDEX item %ld in RK_DEVICES", rank);
        return 0;
    }
    size_t hl = (size_t)(c - id);
    for (long k = 0; rk_text_list_item(dirs, k, item, sizeof item); k++)
        if (strncmp(item, id, hl) == 0 && item[hl] == '=' && item[hl + 1] == '/' &&
            strlen(item + hl + 1) < cap) {
            snprintf(out, cap, "%s", item + hl + 1);
            return 1;
        }
    snprintf(why, wcap, "RK_SNAP_DIRS names no snapshot directory for host %.*s", (int)hl, id);
    return 0;
}

/* Whether `path` (a path with a slash: execvp would not search PATH for it) is the file this
 * process runs, by the kernel's device and inode of /proc/self/exe. */
static int same_executable(const char *path)
{
    struct stat a, b;
    return strchr(path, '/') && stat(path, &a) == 0 && stat("/proc/self/exe", &b) == 0 &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int rk_cmd_rank_env(int argc, char **argv)
{
    rk_phase_mark_env("rankenv.main"); /* RK_TRACE_LAUNCH (base/phase.h): the rank's RANK unset */
    int i = 1;
    if (i < argc && strcmp(argv[i], "--") == 0)
        i++;
    if (i >= argc) {
        fprintf(stderr, "usage: rk _rank-env -- WORKER [ARGS...] (used by rk run)\n");
        return RK_EXIT_USAGE;
    }
    long v[4];
    if (!rk_env_rank_map(get, v)) { /* else an inherited RANK would pass for this rank's */
        fprintf(stderr,
                "rk _rank-env: no rank from the launcher: none of OMPI_COMM_WORLD_RANK and "
                "_SIZE, PMI_RANK and PMI_SIZE, SLURM_PROCID and SLURM_NTASKS is set to a rank "
                "below its size\n");
        return RK_EXIT_USAGE;
    }
    static const char *const names[4] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
    for (int k = 0; k < 4; k++) {
        char num[24];
        snprintf(num, sizeof num, "%ld", v[k]);
        setenv(names[k], num, 1);
    }
    /* across hosts (RK_DEVICES of HOST:INDEX ids, item RANK this rank's): this host's
     * devices of the launch in rank order, so that cuda:LOCAL_RANK is the rank's device and a
     * quarantined or drained one is not seen, as on one host (docs/cluster.md) */
    const char *by_host = getenv("RK_DEVICES_BY_HOST");
    if (by_host && strcmp(by_host, "1") == 0) {
        char cvd[4096], why[256];
        if (!host_devices(getenv("RK_DEVICES"), v[0], cvd, sizeof cvd, why, sizeof why)) {
            fprintf(stderr, "rk _rank-env: %s\n", why);
            return RK_EXIT_USAGE;
        }
        setenv("CUDA_VISIBLE_DEVICES", cvd, 1);
    }
    const char *sdirs = getenv("RK_SNAP_DIRS");
    if (sdirs && *sdirs) {
        char dir[4096], why[256];
        if (!host_snap_dir(sdirs, getenv("RK_DEVICES"), v[0], dir, sizeof dir, why, sizeof why)) {
            fprintf(stderr, "rk _rank-env: %s\n", why);
            return RK_EXIT_USAGE;
        }
        setenv("RK_SNAP_DIR", dir, 1);
        unsetenv("RK_SNAP_DIRS");
    }
    /* under srun across nodes that may share one network namespace, each node's agent has a
     * socket of its own: "@rk-JOBID-{node}" ends with this node's name (docs/slurm.md) */
    const char *hb = getenv("RK_HEARTBEAT");
    static const char tail[] = "{node}";
    size_t hl = hb ? strlen(hb) : 0, tl = sizeof tail - 1;
    if (hl >= tl && strcmp(hb + hl - tl, tail) == 0) {
        const char *node = getenv("SLURMD_NODENAME");
        if (!node || !rk_slurm_node_name_ok(node)) {
            fprintf(stderr,
                    "rk _rank-env: RK_HEARTBEAT ends in {node}, and SLURMD_NODENAME is "
                    "%s: not a rank srun started on a node\n",
                    node ? "not a node name" : "not set");
            return RK_EXIT_USAGE;
        }
        char sock[256];
        if (snprintf(sock, sizeof sock, "%.*s%s", (int)(hl - tl), hb, node) >= (int)sizeof sock) {
            fprintf(stderr, "rk _rank-env: RK_HEARTBEAT with the node's name is too long\n");
            return RK_EXIT_USAGE;
        }
        setenv("RK_HEARTBEAT", sock, 1);
    }
    rk_phase_mark_env("rankenv.exec");
    /* the worker is this same rk (rk train, a C trainer's rk command): its command runs here,
     * without a second exec and dynamic loading of rk's libraries (0.12 s of a relaunch,
     * bench/RESULTS.md); the process is the one exec would have kept, pid and all */
    if (i + 1 < argc && strcmp(argv[i + 1], "_rank-env") != 0 && same_executable(argv[i]))
        return rk_dispatch(argc - i, argv + i);
    execvp(argv[i], argv + i);
    /* bad input, as under the local launcher: rk run stops (exit 2) instead of relaunching */
    fprintf(stderr, "rk _rank-env: cannot run the worker %s: %s\n", argv[i], strerror(errno));
    return RK_EXIT_USAGE;
}
