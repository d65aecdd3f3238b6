/*
 * A job over many hosts (docs/cluster.md): rk run as the coordinator of one `rk agent` per
 * host, a backend of the supervisor's (supervisor/backend.h; its state private to the room:
 * coord.h, for cluster.c, facts.c and agents.c), and the plan that comes before it (plan.c:
 * the hosts, their slots as the devices, the coordinator's address, the launcher; under Slurm
 * through scontrol). The supervisor knows nothing of this room (scripts/layers.txt).
 */
#ifndef RK_CLUSTER_H
#define RK_CLUSTER_H

#include <stdint.h>

#include "cluster/hosts.h"
#include "cluster/nodes.h"
#include "cluster/slurm.h"
#include "supervisor/supervisor.h"

typedef struct sup_cluster sup_cluster;

/* Run the job over o->hosts (its agents started through o->rsh, or srun) to its end, as
 * rk_sup_run does on one host; *rep as rk_sup_run fills it. */
void rk_cluster_run(const rk_sup_opts *o, rk_sup_report *rep);

/* ---- plan.c ------------------------------------------------------------------------------ */

/* What rk run was asked for over many hosts: its flags, as given. */
typedef struct rk_cluster_ask {
    const char *list;   /* --hosts: a host list, or "slurm[:N]" (the allocation's nodes) */
    int slurm_slots;    /* N of "slurm:N" (1 for "slurm"), read by the caller */
    const char *file;   /* --hostfile */
    const char *spares; /* --spare-hosts */
    int devices_given;  /* --devices was given (not with hosts) */
    int health_given;   /* --health was given (else it is off over the hosts) */
    int nlargs;         /* --launcher-arg count */
} rk_cluster_ask;

/* What the plan's options point into (large: make it static). */
typedef struct rk_cluster_plan {
    rk_hosts hosts, spares;
    rk_sup_host host[RK_HOSTS_MAX];
    char devices[RK_SUP_MAX_DEVICES * (RK_HOST_NAME_MAX + 8)]; /* "h1:0,h1:1,h2:0" */
    char listen[RK_NODE_HOST_MAX + 8]; /* --listen defaulted under Slurm: this node's */
    char why[4400];                    /* why this launcher (auto) */
    char addr[RK_HOSTS_MAX][RK_NODE_HOST_MAX];
    char names[RK_HOSTS_MAX][RK_SLURM_NODE_MAX];
    char slurm_list[RK_HOSTS_MAX * (RK_SLURM_NODE_MAX + 8)];
} rk_cluster_plan;

/* The plan of a job over many hosts, into o: hosts, nhosts, listen (in a Slurm batch script
 * without --listen: this node's NodeAddr), launcher (auto: rk_launch_pick) and launcher_why,
 * health (off unless given), n (by default the slots of the hosts that are not spares); the
 * devices, each host's slots in order, as a --devices list in p->devices. RK_OK; else err
 * says why: RK_EINVAL bad usage (*usage 1: rk run's usage text goes with it), RK_EIO
 * scontrol's answer. */
int rk_cluster_plan_hosts(rk_sup_opts *o, const rk_cluster_ask *a, rk_cluster_plan *p, int *usage,
                          rk_err *err);
/* --listen ADDR:PORT: the host and port, refusing a wildcard address (rk run listens on exactly
 * the address the hosts reach it by). RK_EINVAL naming --listen. */
int rk_cluster_listen_parse(const char *listen, char *host, size_t cap, uint16_t *port,
                            rk_err *err);

#endif
