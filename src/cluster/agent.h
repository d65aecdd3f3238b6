/*
 * The node agent's link to the coordinator (`rk agent`, docs/cluster.md): connect with a
 * timeout, HELLO, wait for WELCOME, PING every interval; when the link drops (closed, or no
 * answer for long enough), reconnect with backoff and HELLO again on the same net/peer.h
 * state, so the sequence numbers go on where they were (the coordinator keeps one peer per
 * node for the life of the job: a new process would start again at 1 and be refused as a
 * replay). A connection the coordinator closes before WELCOME is retried the same way (a
 * coordinator flooded with connections closes some before it reads them). Returns on the
 * coordinator's BYE, a refusal, giving up reconnecting (after reconnect_s without a link), or
 * the caller's stop flag (then it says BYE itself). It answers the coordinator's PING (the
 * coordinator asks whether the node is alive) with PONG.
 *
 * Poll-based, single-threaded. With a job (agent_job.h), the same loop polls the node's
 * ranks: LAUNCH, KILL, DATA and CLOSE go to it, its OPEN, DATA, CLOSE, LAUNCHED and EXITED go
 * out on the link, and a link that drops ends the node's ranks at once. With a health gate,
 * the node's GPUs are read and reported (HEALTH) on every welcomed link.
 */
#ifndef RK_CLUSTER_AGENT_H
#define RK_CLUSTER_AGENT_H

#include <signal.h>
#include <stdint.h>

#include "cluster/nodes.h"

typedef struct rk_agent_opts {
    const char *host; /* the coordinator's address */
    uint16_t port;
    uint32_t node; /* this node's index */
    uint8_t job[RK_NET_JOB_ID_LEN];
    uint32_t generation;         /* the launch generation the agent starts in (>= 1) */
    double ping_s;               /* PING this often (default 1 s) */
    double connect_timeout_s;    /* one connection attempt, and the wait for WELCOME (5 s) */
    double reconnect_s;          /* give up after this long without a link (60 s) */
    const char *boot_id_path;    /* NULL: /proc/sys/kernel/random/boot_id */
    volatile sig_atomic_t *stop; /* set (by a signal handler) to say BYE and return */
    struct rk_agent_job *ranks;  /* the node's ranks (agent_job.h); NULL: the link alone */
    /* the node's health gate (supervisor.h): sampled after each WELCOME and every health_s,
     * each device's reading sent as HEALTH; NULL: none */
    struct rk_gate *gate;
    int gate_first;  /* the gate's id of the node's device 0 (a simulated fleet spans hosts) */
    int gate_n;      /* the node's devices, 1..RK_NODES_MAX */
    double health_s; /* > 0 with a gate */
    void (*on_log)(void *ctx, const char *line); /* what happens, one line each */
    void *ctx;
} rk_agent_opts;

#define RK_AGENT_OPTS_DEFAULT                                                                      \
    {                                                                                              \
        .generation = 1, .ping_s = 1, .connect_timeout_s = 5, .reconnect_s = 60                    \
    }

typedef enum rk_agent_outcome {
    RK_AGENT_BYE,     /* the coordinator said BYE: done (exit 0) */
    RK_AGENT_STOPPED, /* the stop flag: BYE sent (exit 0) */
    RK_AGENT_REFUSED, /* REFUSED, with the coordinator's reason (exit 1) */
    RK_AGENT_CLOSED,  /* no WELCOME ever, the last try closed before it, for reconnect_s: a
                       * wrong secret, job id or launch (exit 1) */
    RK_AGENT_GAVE_UP  /* no link for reconnect_s (exit 1) */
} rk_agent_outcome;

/* Run the link until one of the outcomes above: RK_OK and *outcome, with err->msg the line
 * that says why (the coordinator's reason, the last connection error). An error before any
 * connection (no boot id, no host name): its code. */
int rk_agent_run(const rk_agent_opts *o, const rk_net_secret *key, rk_agent_outcome *outcome,
                 rk_err *err);

#endif
