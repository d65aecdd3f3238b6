/*
 * The plan of a job over many hosts (cluster.h): from rk run's --hosts (or the Slurm
 * allocation's nodes), --hostfile, --spare-hosts and --listen, the hosts, their slots as the
 * devices, the coordinator's address and the launcher, before the job starts. Asks scontrol
 * under Slurm (slurm.h); reads the host lists with hosts.h.
 */
#define _GNU_SOURCE
#include "cluster/cluster.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

/* A bad usage: the message (err) goes with rk run's usage text. */
__attribute__((format(printf, 3, 4))) static int usage(int *show, rk_err *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = RK_EINVAL;
    *show = 1;
    return RK_EINVAL;
}

int rk_cluster_listen_parse(const char *listen, char *host, size_t cap, uint16_t *port, rk_err *err)
{
    rk_err e = {0};
    if (rk_node_hostport_parse(listen, host, cap, port, &e))
        return rk_err_set(err, RK_EINVAL, "--listen: %s", e.msg);
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !host[0])
        return rk_err_set(err, RK_EINVAL,
                          "--listen %s: give the address the hosts reach this one by, not a "
                          "wildcard (rk run listens on exactly that address)",
                          listen);
    return RK_OK;
}

/* 1 if name is, or resolves to, a loopback address (Debian's /etc/hosts maps the host's own
 * name to 127.0.1.1). */
static int loopback_name(const char *name)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(name, NULL, &hints, &res) != 0)
        return 0;
    int lo = 0;
    for (struct addrinfo *a = res; a && !lo; a = a->ai_next) {
        if (a->ai_family == AF_INET)
            lo = (ntohl(((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (a->ai_family == AF_INET6)
            lo = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
    }
    freeaddrinfo(res);
    return lo;
}

/* --hosts slurm[:N]: the allocation's nodes as a host list "node1:N,node2:N" into
 * p->slurm_list, those named in the spare list left out (they are its spares). */
static int slurm_hosts(const rk_cluster_ask *a, rk_cluster_plan *p, rk_err *err)
{
    size_t cap = sizeof p->slurm_list;
    char *buf = p->slurm_list;
    rk_err e = {0};
    int n = rk_slurm_job_nodes("scontrol", p->names, RK_HOSTS_MAX, &e);
    if (n < 0) /* outside an allocation: bad usage; scontrol failing: not */
        return rk_err_set(err, e.code == RK_EINVAL ? RK_EINVAL : RK_EIO, "--hosts %s: %s", a->list,
                          e.msg);
    /* the spares as the host list parser reads them (the same rules as below) */
    memset(&p->spares, 0, sizeof p->spares);
    if (a->spares && rk_hosts_parse_list(&p->spares, a->spares, 1, &e))
        return rk_err_set(err, RK_EINVAL, "%s", e.msg);
    size_t used = 0;
    int kept = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        int spare = 0;
        for (int k = 0; k < p->spares.n && !spare; k++) /* one host, as hosts.h says, ignoring
                                                         * case */
            spare = strcasecmp(p->spares.h[k].name, p->names[i]) == 0;
        if (spare)
            continue;
        used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s%s:%d",
                                 kept++ ? "," : "", p->names[i], a->slurm_slots);
    }
    if (used >= cap || kept == 0)
        return rk_err_set(err, RK_EINVAL, "--hosts %s: %s", a->list,
                          kept ? "too many nodes" : "every node of the allocation is a spare");
    return RK_OK;
}

int rk_cluster_plan_hosts(rk_sup_opts *o, const rk_cluster_ask *a, rk_cluster_plan *p, int *show,
                          rk_err *err)
{
    rk_err e = {0};
    const char *list = a->list;
    *show = 0;
    if (!list && !a->file)
        return usage(show, err, "--spare-hosts needs --hosts or --hostfile");
    if (a->devices_given)
        return usage(show, err,
                     "--devices with --hosts: a host's devices are its slots, 0..N-1 "
                     "(HOST:N)");
    int listen_defaulted = 0;
    const char *here = getenv("SLURMD_NODENAME");
    if (!o->listen && list && !strncmp(list, "slurm", 5) && here && rk_slurm_node_name_ok(here)) {
        /* in a batch script: this node's NodeAddr, as Slurm reaches it */
        char addr[RK_NODE_HOST_MAX];
        if (rk_slurm_node_addr("scontrol", here, addr, sizeof addr, &e))
            return rk_err_set(err, RK_EIO, "--listen not given, and this node's address: %s",
                              e.msg);
        snprintf(p->listen, sizeof p->listen, strchr(addr, ':') ? "[%s]:0" : "%s:0", addr);
        o->listen = p->listen;
        listen_defaulted = 1;
    }
    if (!o->listen)
        return usage(show, err,
                     "--hosts needs --listen ADDR:PORT, the address the hosts reach this one "
                     "by (port 0: any free port)");
    char lhost[RK_NODE_HOST_MAX];
    uint16_t lport;
    if (rk_cluster_listen_parse(o->listen, lhost, sizeof lhost, &lport, &e))
        return usage(show, err, "%s", e.msg);
    if (list && !strncmp(list, "slurm", 5) && (list[5] == '\0' || list[5] == ':')) {
        int rc = slurm_hosts(a, p, err);
        if (rc)
            return rc;
        list = p->slurm_list;
    }
    rk_hosts *hs = &p->hosts;
    if ((list && rk_hosts_parse_list(hs, list, 0, &e)) ||
        (a->file && rk_hosts_load_file(hs, a->file, &e)) ||
        (a->spares && rk_hosts_parse_list(hs, a->spares, 1, &e)))
        return rk_err_set(err, RK_EINVAL, "%s", e.msg);
    /* auto: mpirun across the hosts for an MPI program (rk train), else the agents fork */
    if (o->launcher == RK_LAUNCH_AUTO) {
        o->launcher = rk_launch_pick(o->worker, a->nlargs > 0, p->why, sizeof p->why);
        o->launcher_why = p->why;
    }
    if (o->launcher == RK_LAUNCH_SRUN && o->rsh)
        return usage(show, err, "--rsh with --launcher srun: srun starts the agents");
    if (o->launcher == RK_LAUNCH_LOCAL && a->nlargs)
        return usage(show, err,
                     "--launcher-arg with --hosts and --launcher local: the agents start the "
                     "ranks");
    if (!o->launcher_why)
        o->launcher_why = o->launcher == RK_LAUNCH_LOCAL
                              ? "--hosts: each host's agent starts its ranks"
                          : o->launcher == RK_LAUNCH_SRUN
                              ? "--hosts: srun starts an agent a node and the ranks, the "
                                "agents watch"
                              : "--hosts: one mpirun across the hosts, the agents watch";
    if (!a->health_given)
        o->health = NULL; /* off unless asked for: each host's agent needs its NVML */
    else if (o->health && !strcmp(o->health, "auto"))
        return usage(show, err,
                     "--health auto with --hosts: give nvml or sim (each host's agent reads its "
                     "GPUs) or off");
    int ndev = 0, primary = 0;
    size_t used = 0, cap = sizeof p->devices;
    char *dev = p->devices;
    dev[0] = '\0';
    for (int k = 0; k < hs->n; k++) {
        p->host[k] =
            (rk_sup_host){.name = hs->h[k].name, .slots = hs->h[k].slots, .spare = hs->h[k].spare};
        if (o->launcher == RK_LAUNCH_SRUN) { /* MASTER_ADDR: where Slurm reaches the node */
            if (!rk_slurm_node_name_ok(hs->h[k].name))
                return usage(show, err, "--launcher srun: host %s is not a Slurm node name",
                             hs->h[k].name);
            if (rk_slurm_node_addr("scontrol", hs->h[k].name, p->addr[k], sizeof p->addr[k], &e))
                return rk_err_set(err, RK_EIO, "%s node %s: %s", /* Slurm's answer */
                                  hs->h[k].spare ? "--spare-hosts" : "--hosts", hs->h[k].name,
                                  e.msg);
            p->host[k].addr = p->addr[k];
        }
        if (!hs->h[k].spare)
            primary += hs->h[k].slots;
        for (int i = 0; i < hs->h[k].slots; i++, ndev++) {
            if (ndev >= RK_SUP_MAX_DEVICES)
                return usage(show, err, "the hosts have more than %d slots", RK_SUP_MAX_DEVICES);
            used += (size_t)snprintf(dev + used, used < cap ? cap - used : 0, "%s%s:%d",
                                     ndev ? "," : "", hs->h[k].name, i);
        }
    }
    if (used >= cap)
        return usage(show, err, "the hosts' names are too long");
    /* a loopback --listen reaches no other host: only hosts named by loopback addresses */
    /* (a name that resolves to one too: Debian's /etc/hosts maps the host's own name to
     * 127.0.1.1, and a Slurm NodeAddr may be that name) */
    int lo_listen = loopback_name(lhost);
    for (int k = 0; lo_listen && k < hs->n; k++) {
        const char *ad = p->host[k].addr ? p->host[k].addr : hs->h[k].name;
        if (!loopback_name(ad))
            return usage(show, err,
                         "--listen %s is a loopback address%s: host %s cannot reach it; give "
                         "this host's address on the hosts' network",
                         o->listen, listen_defaulted ? " (this node's NodeAddr)" : "",
                         hs->h[k].name);
    }
    o->hosts = p->host;
    o->nhosts = hs->n;
    if (o->n == 0)
        o->n = primary;
    if (o->n < 1)
        return usage(show, err, "--hosts: no slots");
    if (o->n > ndev)
        return usage(show, err, "-n %d: the hosts have %d slot%s, spares included", o->n, ndev,
                     ndev == 1 ? "" : "s");
    return RK_OK;
}
