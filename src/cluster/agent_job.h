/*
 * The node agent's ranks (docs/cluster.md): on the coordinator's LAUNCH it starts this node's
 * ranks under a keeper of launch.c (the local launcher: RANK from the launch's base rank,
 * LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, CUDA_VISIBLE_DEVICES, the
 * checkpoint directory and the restart counter), listens on a Unix socket of its own for
 * their heartbeats (docs/protocol.md, unchanged), and relays each rank's stream over the node
 * link as a channel (OPEN, DATA, CLOSE), after the kernel's word that the peer is one of the
 * launch's processes (SO_PEERCRED and the keeper's process tree). It reports the node's end
 * (EXITED) and ends its ranks on KILL or when the link is gone. With an abstract socket
 * (opts.abstract) it also watches ranks another launcher started (a LAUNCH with watch=1:
 * one mpirun across the hosts): those are relayed the same way and, on KILL or a lost
 * link, ended through the pidfd taken when they connected. Poll-based: the agent's loop
 * (agent.c) polls its descriptors and calls in.
 */
#ifndef RK_CLUSTER_AGENT_JOB_H
#define RK_CLUSTER_AGENT_JOB_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/chan.h"
#include "rekindle/error.h"

typedef struct rk_agent_job_opts {
    char *const *worker;  /* WORKER ARGS..., NULL-terminated */
    const char *ckpt_dir; /* RK_CKPT_DIR for the ranks (with RK_RESUME=1); NULL: none */
    const char *inject;   /* RK_INJECT; NULL: none */
    int no_pythonpath;    /* 1: leave PYTHONPATH as it is */
    /* the abstract socket's name (without the '@') on which ranks that another launcher
     * (one mpirun across the hosts) starts connect; NULL: none. A peer is taken when the
     * kernel says it runs as this agent's user; it is held by a pidfd from then on. */
    const char *abstract;
    /* where to make the job's snapshot directory on this node (rekindle/snap.h:
     * rk_snap_dir_make, "" for /dev/shm or RK_SNAP_PARENT; docs/recovery.md "Across hosts");
     * NULL: no snapshots in memory. The directory is removed with the job, or on a LAUNCH
     * with snap_off. */
    const char *snap_parent;
    void (*on_log)(void *ctx, const char *line);
    void *ctx;
} rk_agent_job_opts;

typedef struct rk_agent_job rk_agent_job;

/* The job side of an agent: a private directory and the heartbeat socket in it. */
int rk_agent_job_new(rk_agent_job **out, const rk_agent_job_opts *o, rk_err *err);
/* Ends the ranks (if any), removes the socket and directory. NULL-safe. */
void rk_agent_job_free(rk_agent_job *j);
/* Its descriptors to poll into p[0..cap): how many. */
int rk_agent_job_pollfds(const rk_agent_job *j, struct pollfd *p, int cap);
/* After poll: the entries rk_agent_job_pollfds gave, with their revents. Accepts and checks
 * rank connections, relays what they say. Also reaps the keeper: EXITED once it is gone. */
void rk_agent_job_ready(rk_agent_job *j, const struct pollfd *p, int n, rk_node_send_fn send,
                        void *ctx);
/* A LAUNCH, DATA, CLOSE or KILL from the coordinator; 0, or -1 for a message that does not
 * parse (the caller drops the link: the coordinator broke the protocol). */
int rk_agent_job_msg(rk_agent_job *j, uint8_t type, const uint8_t *payload, size_t len,
                     rk_node_send_fn send, void *ctx);
/* The link is gone: end the ranks now (no rank is left waiting in a collective for a node
 * the coordinator will call lost), close their channels; EXITED is sent on the next link. */
void rk_agent_job_link_lost(rk_agent_job *j);
/* The job's snapshot directory on this node (said in the agent's HELLO), NULL if none. */
const char *rk_agent_job_snap_dir(const rk_agent_job *j);
/* 1 while this node's ranks run. */
int rk_agent_job_running(const rk_agent_job *j);

#endif
