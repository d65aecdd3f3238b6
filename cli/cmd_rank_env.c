/*
 * rk _rank-env -- WORKER [ARGS...]: the hidden wrapper rk run puts in front of the worker
 * under mpirun and srun. Sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE from the
 * launcher's variables (src/supervisor/env.c) and execs the worker in place: the same pid,
 * so the heartbeat's hello check against the kernel holds (docs/run.md). No launcher's
 * variables to read, or a worker that cannot be executed: one line and exit status 2.
 */
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
