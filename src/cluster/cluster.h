/*
 * A job over many hosts (docs/cluster.md): rk run as the coordinator of one `rk agent` per
 * host, a backend of the supervisor (supervisor/backend.h). Its state is private to
 * cluster.c.
 */
#ifndef RK_CLUSTER_H
#define RK_CLUSTER_H

#include "supervisor/supervisor.h"

typedef struct sup_cluster sup_cluster;

/* Run the job over o->hosts (its agents started through o->rsh, or srun) to its end, as
 * rk_sup_run does on one host; *rep as rk_sup_run fills it. */
void rk_cluster_run(const rk_sup_opts *o, rk_sup_report *rep);

#endif
