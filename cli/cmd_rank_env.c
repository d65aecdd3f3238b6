/*
 * rk _rank-env -- WORKER [ARGS...]: the hidden wrapper rk run puts in front of the worker
 * under mpirun and srun. Sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from the
 * launcher's variables (src/supervisor/env.c) and execs the worker in place: the same pid,
 * so the heartbeat's hello check against the kernel holds (docs/run.md). No launcher's
 * variables to read, or a worker that cannot be executed: one line and exit status 2.
 */
#define _GNU_SOURCE /* memrchr */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "supervisor/slurm.h"
#include "supervisor/supervisor.h"

static const char *get(const char *name)
{
    return getenv(name);
}

/* From RK_DEVICES "h1:0,h1:2,h2:0" and a rank: the device indices of that rank's host in
 * order ("0,2" for rank 0 or 1) into out. 0 when the list is not HOST:INDEX ids (one host:
 * rk run set CUDA_VISIBLE_DEVICES itself) or names no such rank. */
static int host_devices(const char *list, long rank, char *out, size_t cap)
{
    if (!list || !*list || cap < 2)
        return 0;
    char mine[300] = "";
    long r = 0;
    for (const char *p = list; *p; r++) { /* this rank's host */
        size_t l = strcspn(p, ",");
        const char *c = memrchr(p, ':', l);
        if (!c)
            return 0;
        if (r == rank && (size_t)(c - p) < sizeof mine)
            memcpy(mine, p, (size_t)(c - p)), mine[c - p] = '\0';
        p += l + (p[l] == ',');
    }
    if (!mine[0])
        return 0;
    size_t used = 0, ml = strlen(mine);
    out[0] = '\0';
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        const char *c = memrchr(p, ':', l);
        size_t il = l - (size_t)(c - p) - 1;
        if ((size_t)(c - p) == ml && !strncmp(p, mine, ml) && il > 0 && used + il + 2 < cap) {
            used +=
                (size_t)snprintf(out + used, cap - used, "%s%.*s", used ? "," : "", (int)il, c + 1);
        }
        p += l + (p[l] == ',');
    }
    return used > 0;
}

int rk_cmd_rank_env(int argc, char **argv)
{
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
    char cvd[1024];
    if (host_devices(getenv("RK_DEVICES"), v[0], cvd, sizeof cvd))
        setenv("CUDA_VISIBLE_DEVICES", cvd, 1);
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
    execvp(argv[i], argv + i);
    /* bad input, as under the local launcher: rk run stops (exit 2) instead of relaunching */
    fprintf(stderr, "rk _rank-env: cannot run the worker %s: %s\n", argv[i], strerror(errno));
    return RK_EXIT_USAGE;
}
