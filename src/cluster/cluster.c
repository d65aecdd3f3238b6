/*
 * A job over many hosts (docs/cluster.md): rk run is the coordinator. It listens on --listen
 * for the node link (nodes.h), starts one `rk agent` per host through --rsh (ssh by default;
 * the job's secret on the agent's stdin), and runs each launch through the agents: LAUNCH to
 * every node in use (rank 0's node first: its agent picks MASTER_PORT), each rank's heartbeat
 * stream relayed as a channel that ends here in a socketpair, so the job reads a remote rank
 * as it reads a local one; the launch has ended when every node in use said EXITED or was
 * lost. The first node to end with a failure gets the others' ranks ended at once, as the
 * local keeper does. A node lost during a launch (silent for --node-timeout, its link or its
 * agent gone) fails the launch (kind node_lost), is counted towards its quarantine like a
 * device (--failure-threshold), and its devices stay out while it is not connected: the
 * spare hosts' devices take their place. A failure the ranks show (a rank's end, the
 * launcher's exit) is blamed on a device only once every node of the launch answered a PING
 * sent after it: a node lost meanwhile is the cause (policy.h, rk_sup_node_blame). It is a
 * backend of the supervisor (supervisor/backend.h): the job's loop calls its ops, and it
 * changes the job only through the services there. The node table's callbacks (facts.c)
 * record what they saw (state of the launch, and a bounded queue of facts: a channel opened,
 * a rank's bytes, a stack dump's, a line to say); act() acts on it once a round (tick), in
 * order. The agents' processes are agents.c's; the state all share is coord.h's.
 */
#define _GNU_SOURCE
#include "cluster/coord.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/proc.h"
#include "net/secret.h"
#include "supervisor/backend.h"

#define LAUNCHED_WAIT_S 10.0 /* rank 0's agent answers LAUNCH within this */
#define HEALTH_WAIT_S 10.0   /* the agents' first readings, before the first launch */
#define FETCH_WAIT_S 30.0    /* the partner copies of the ranks that move, before a launch */
#define RELAY_BUDGET_S 0.02  /* of a 50 ms round of the job's loop, for relaying copies */

static void kill_ranks(sup_cluster *cl, double grace_s);

/* --slurm-drain: the quarantined node drained in Slurm, with the reason (its mark "rk run: "
 * is not rk doctor --slurm's, which therefore never resumes it: docs/slurm.md). */
static void drain_node(sup_cluster *cl, int k, const char *why)
{
    char reason[256];
    const char *sj = getenv("SLURM_JOB_ID"); /* the id an administrator can look up */
    snprintf(reason, sizeof reason, "rk run: node lost %d time%s in %s %.20s: %.150s",
             cl->node[k].fails, cl->node[k].fails == 1 ? "" : "s", sj ? "Slurm job" : "job",
             sj ? sj : cl->job_hex, why && why[0] ? why : "no reason given");
    rk_err e = {0};
    const char *exe = cl->o->scontrol ? cl->o->scontrol : "scontrol";
    char held[256];
    int st = rk_slurm_node_held(exe, node_name(cl, k), held, sizeof held, &e);
    if (st == 1) { /* an administrator's drain (or Slurm's own hold) is not overwritten */
        sup_say(cl->s, "node %d (%s): --slurm-drain: already %s: left as it is", k,
                node_name(cl, k), held);
        return;
    }
    if (st < 0 || rk_slurm_drain(exe, node_name(cl, k), reason, &e))
        sup_say(cl->s, "node %d (%s): --slurm-drain: %s", k, node_name(cl, k), e.msg);
    else
        sup_say(cl->s, "node %d (%s) drained in Slurm: %s", k, node_name(cl, k), reason);
}

/* Node k's loss is the launch's failure (the first of the launch, its blame not yet known):
 * node_lost, counted towards the node's quarantine (policy.h's rule, as a device's). */
static void node_failure(sup_cluster *cl, int k)
{
    if (cl->decided || cl->node_failed)
        return;
    char what[512];
    snprintf(what, sizeof what, "node %d (%s) lost after %.1f s of silence: %s", k,
             node_name(cl, k), cl->lost_silent[k], cl->lost_why[k]);
    sup_fail_node(cl->s, k, cl->first_rank[k], node_name(cl, k), what);
    cl->node_failed = 1;
    cl->decided = 1;
    if (!rk_sup_count_failure(&cl->node[k], cl->o->failure_threshold))
        return;
    for (int d = 0; d < cl->o->ndevices; d++) /* a node's devices go with it */
        if (cl->dev_node[d] == k)
            sup_quarantine_device(cl->s, d);
    sup_record(cl->s, "quarantine", -1, node_name(cl, k), "quarantine",
               "node %d (%s) quarantined after %d failure%s", k, node_name(cl, k),
               cl->node[k].fails, cl->node[k].fails == 1 ? "" : "s");
    sup_say(cl->s, "node %d (%s) quarantined after %d failure%s", k, node_name(cl, k),
            cl->node[k].fails, cl->node[k].fails == 1 ? "" : "s");
    if (cl->o->slurm_drain)
        drain_node(cl, k, cl->lost_why[k]);
}

/* The nodes of the launch that on_event saw lost: their ranks are gone, so the others' ranks,
 * waiting in a collective for them, are ended now (their EXITED ends the launch); the first
 * loss whose launch's blame is not known yet is the launch's failure. */
static void take_losses(sup_cluster *cl)
{
    for (int k = 0; k < cl->nnodes; k++) {
        if (cl->lost[k] != 1)
            continue;
        cl->lost[k] = 2;
        coord_snap_node_lost(cl, k); /* the partner copies it held are gone with it */
        if (!cl->exited[k]) {
            cl->exited[k] = 1;
            kill_ranks(cl, 0);
        }
        node_failure(cl, k);
    }
}

/* Once the nodes were asked (probe_nodes), their answers are weighed (rk_sup_node_blame)
 * until the blame is known. */
static void weigh_failure(sup_cluster *cl)
{
    if (cl->decided || !cl->probing)
        return;
    if (cl->node_failed) { /* a node's loss is the failure itself */
        cl->decided = 1;
        return;
    }
    rk_sup_link link[MAX_NODES];
    for (int k = 0; k < cl->nnodes; k++) {
        if (!cl->used[k])
            link[k] = RK_SUP_LINK_OUT;
        else if (cl->lost[k] || !rk_nodes_connected(cl->t, k))
            link[k] = RK_SUP_LINK_LOST;
        else if (cl->probe[k] > 0 && rk_nodes_answered(cl->t, k) >= cl->probe[k])
            link[k] = RK_SUP_LINK_ALIVE;
        else
            link[k] = RK_SUP_LINK_ASKED;
    }
    int node;
    rk_sup_blame b = rk_sup_node_blame(cl->nnodes, link, rk_mono_s(), cl->probed_at,
                                       cl->o->node_timeout_s + 1.0, &node);
    if (b == RK_SUP_BLAME_NODE) {
        if (!cl->lost[node]) { /* not connected, and no event said so (never in practice) */
            cl->lost[node] = 2;
            snprintf(cl->lost_why[node], sizeof cl->lost_why[node], "its link is gone");
        }
        node_failure(cl, node);
    }
    if (b != RK_SUP_BLAME_WAIT)
        cl->decided = 1;
}

/* Ask every node of the launch whether it is alive (once a failure was seen). */
static void probe_nodes(sup_cluster *cl)
{
    if (cl->probing || cl->decided || cl->node_failed)
        return;
    cl->probing = 1;
    cl->probed_at = rk_mono_s();
    for (int k = 0; k < cl->nnodes; k++)
        if (cl->used[k] && !cl->lost[k])
            cl->probe[k] = rk_nodes_probe(cl->t, k); /* 0: not connected, lost (recorded) */
}

/* The job's steps to every connected agent whose simulated fleet ages with them
 * (--sim-step-time): when they changed, at most 10 times a second, and every second anyway
 * (an agent that came back hears it). */
static void send_progress(sup_cluster *cl)
{
    const rk_sup_opts *o = cl->o;
    if (!o->health || strcmp(o->health, "sim") != 0 || !(o->sim_step_s > 0))
        return;
    int64_t steps = sup_steps_done(cl->s);
    double now = rk_mono_s();
    if (now - cl->progress_t < (steps > cl->progress_sent ? 0.1 : 1.0))
        return;
    rk_node_progress m = {.steps = steps};
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    if (rk_node_progress_format(&m, out, sizeof out, &len, &e))
        return;
    for (int k = 0; k < cl->nnodes; k++)
        if (rk_nodes_connected(cl->t, k))
            (void)rk_nodes_send(cl->t, k, RK_NODE_MSG_PROGRESS, out, len,
                                &e); /* a failed
                                      * send is the node's loss, seen there */
    cl->progress_sent = steps;
    cl->progress_t = now;
}

/* What the callbacks recorded, acted on once a round: the facts (lines, channels, bytes), the
 * first failure's end of the other nodes' ranks, the nodes lost, the blame. */
static void act(sup_cluster *cl)
{
    coord_take_facts(cl);
    if (cl->kill_due) { /* as the local keeper: the first failure ends every other rank */
        cl->kill_due = 0;
        kill_ranks(cl, 0);
    }
    send_progress(cl);
    coord_relay_back(cl);
    coord_tend_agents(cl);
    take_losses(cl);
    if (sup_failing(cl->s))
        probe_nodes(cl);
    take_losses(cl); /* a probe that could not be sent: its node is lost */
    weigh_failure(cl);
    coord_take_facts(cl); /* what the sends above saw (a node lost): said now */
}

/* One round of the link: read it (waiting up to wait_s; the callbacks record), then act. */
static void tick(sup_cluster *cl, double wait_s)
{
    rk_err e = {0};
    if (rk_nodes_poll(cl->t, wait_s, &e))
        sup_say(cl->s, "node link: %s", e.msg);
    act(cl);
}

/* ---- a launch ---------------------------------------------------------------------------- */

static int send_launch(sup_cluster *cl, int k, uint32_t port, const char *done, rk_err *err)
{
    rk_node_launch m = {.launch = (uint32_t)cl->launch_no + 1,
                        .world = (uint32_t)cl->n,
                        .base = (uint32_t)cl->first_rank[k],
                        .port = port,
                        .watch = (uint32_t)cl->watch,
                        .snap_off = (uint32_t)(sup_snapshots_off(cl->s) != 0)};
    int nr = 0;
    size_t used = 0;
    for (int r = 0; r < cl->n; r++)
        if (node_of_rank(cl, r) == k) {
            used += (size_t)snprintf(m.devices + used,
                                     used < sizeof m.devices ? sizeof m.devices - used : 0,
                                     nr ? ",%d" : "%d", cl->dev_local[cl->dev[r]]);
            nr++;
        }
    m.ranks = (uint32_t)nr;
    snprintf(m.master, sizeof m.master, "%s", node_name(cl, node_of_rank(cl, 0)));
    snprintf(m.done, sizeof m.done, "%s", done);
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    int rc = rk_node_launch_format(&m, out, sizeof out, &len, err);
    if (!rc)
        rc = rk_nodes_send(cl->t, k, RK_NODE_MSG_LAUNCH, out, len, err);
    return rc;
}

/* LAUNCH to every node in use (rank 0's first: its agent picks MASTER_PORT, said in
 * LAUNCHED); with one mpirun or srun across the hosts, the agents watch and the launcher of
 * this host starts the ranks. */
static int start(void *ctx, const rk_sup_launch *l, rk_err *err)
{
    sup_cluster *cl = ctx;
    cl->launch_no = l->no;
    cl->n = l->n < RK_SUP_MAX_DEVICES ? l->n : RK_SUP_MAX_DEVICES;
    memcpy(cl->dev, l->dev, (size_t)cl->n * sizeof cl->dev[0]);
    coord_close_chans(cl);
    cl->nchans = 0;
    memset(cl->used, 0, sizeof cl->used);
    memset(cl->exited, 0, sizeof cl->exited);
    cl->status = RK_EXIT_OK;
    cl->ended = 0;
    cl->failed_rank = -1;
    cl->failure_seen = cl->kill_due = 0;
    cl->launched = 0;
    memset(cl->lost, 0, sizeof cl->lost);
    memset(cl->probe, 0, sizeof cl->probe);
    cl->probing = cl->decided = cl->node_failed = 0;
    for (int r = cl->n - 1; r >= 0; r--) { /* ranks of a node are consecutive (the pick's order) */
        int k = node_of_rank(cl, r);
        cl->used[k] = 1;
        cl->first_rank[k] = r;
    }
    /* every rank snapshots or none (the puts and the resume are collective): a node of the
     * launch without a directory (its agent could not make one) turns them off for the job */
    for (int k = 0; cl->snaps && k < cl->nnodes && !sup_snapshots_off(cl->s); k++)
        if (cl->used[k] && !rk_nodes_snap(cl->t, k)) {
            char why[200];
            snprintf(why, sizeof why,
                     "node %d (%s) has no snapshot directory (its agent's log says why)", k,
                     node_name(cl, k));
            sup_snapshots_stop(cl->s, sup_step_now(cl->s), "disk_only", why);
        }
    /* ranks that move to another node (a spare in place of a node lost) get their partner
     * copies there first (partners.c); each that did not is said, and restores from disk */
    if (coord_snap_fetch(cl) > 0) {
        double until = rk_mono_s() + FETCH_WAIT_S;
        while (coord_snap_fetching(cl) && rk_mono_s() < until)
            tick(cl, 0.05);
    }
    coord_snap_fetched(cl);
    int k0 = node_of_rank(cl, 0);
    if (cl->watch) { /* the agents watch; the launcher here starts the ranks across the hosts */
        int rc = RK_OK;
        for (int k = 0; !rc && k < cl->nnodes; k++)
            if (cl->used[k])
                rc = send_launch(cl, k, 0, l->done, err);
        coord_take_facts(cl); /* a node lost on a send says so */
        return rc ? rc : sup_launcher_start(cl->s, err);
    }
    int rc = send_launch(cl, k0, 0, l->done, err);
    double until = rk_mono_s() + LAUNCHED_WAIT_S;
    while (!rc && !cl->launched && !cl->exited[k0] && rk_mono_s() < until)
        tick(cl, 0.05);
    if (!rc && !cl->launched) /* the launch fails, and is judged as one (its EXITED, a loss) */
        sup_fail(cl->s, "node %d (%s) did not start rank 0 within %g s", k0, node_name(cl, k0),
                 LAUNCHED_WAIT_S);
    for (int k = 0; !rc && k < cl->nnodes; k++)
        if (cl->used[k] && k != k0)
            rc = send_launch(cl, k, cl->launched_port, l->done, err);
    coord_take_facts(cl);
    return rc;
}

/* 1 once every node in use said EXITED or was lost: cl->status is then the launch's. */
static int nodes_ended(sup_cluster *cl)
{
    if (cl->ended)
        return 1;
    for (int k = 0; k < cl->nnodes; k++)
        if (cl->used[k] && !cl->exited[k])
            return 0;
    cl->ended = 1;
    return 1;
}

static int poll_launch(void *ctx, int *code)
{
    sup_cluster *cl = ctx;
    if (cl->watch) /* mpirun's (srun's) end is the launch's */
        return sup_launcher_poll(cl->s, code);
    if (!nodes_ended(cl))
        return 0;
    *code = cl->status & 0xff;
    return 1;
}

static int failed_rank(void *ctx)
{
    sup_cluster *cl = ctx;
    if (cl->watch)
        return sup_launcher_failed_rank(cl->s);
    int r = cl->failed_rank;
    cl->failed_rank = -1;
    return r;
}

/* KILL to every node in use that has not ended, without waiting. */
static void kill_ranks(sup_cluster *cl, double grace_s)
{
    if (!cl->t)
        return;
    rk_node_kill m = {.launch = (uint32_t)cl->launch_no + 1, .grace_s = grace_s};
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    if (rk_node_kill_format(&m, out, sizeof out, &len, &e))
        return;
    for (int k = 0; k < cl->nnodes; k++)
        if (cl->used[k] && !cl->exited[k] &&
            rk_nodes_send(cl->t, k, RK_NODE_MSG_KILL, out, len, &e))
            cl->exited[k] = 1; /* not connected: its ranks end with its link (agent.c) */
}

/* KILL to every node in use, then wait up to grace_s + a few seconds for their EXITED; with
 * the launcher here, the agents end what they watch at once and the launcher is killed. */
static void kill_launch(void *ctx, double grace_s)
{
    sup_cluster *cl = ctx;
    if (!cl->s || !cl->t)
        return; /* not open */
    if (cl->watch) {
        kill_ranks(cl, 0);
        coord_take_facts(cl);
        sup_launcher_kill(cl->s, grace_s);
        coord_close_chans(cl);
        return;
    }
    kill_ranks(cl, grace_s);
    double until = rk_mono_s() + grace_s + AGENT_EXIT_WAIT_S;
    while (!nodes_ended(cl) && rk_mono_s() < until)
        tick(cl, 0.05);
    for (int k = 0; k < cl->nnodes; k++)
        if (cl->used[k] && !cl->exited[k]) {
            sup_say(cl->s, "node %d (%s): its ranks did not end within %g s of KILL", k,
                    node_name(cl, k), grace_s + AGENT_EXIT_WAIT_S);
            cl->exited[k] = 1;
        }
    nodes_ended(cl);
    coord_take_facts(cl);
    coord_close_chans(cl);
}

/* A round of the link; while partner copies are being relayed, more rounds, up to
 * RELAY_BUDGET_S: the job's loop comes every 50 ms, and one round takes about two pieces. */
static void pump(void *ctx, double wait_s)
{
    sup_cluster *cl = ctx;
    double until = rk_mono_s() + RELAY_BUDGET_S;
    for (;;) {
        uint64_t before = cl->snap_relayed;
        tick(cl, wait_s);
        wait_s = 0;
        if (cl->snap_relayed == before || rk_mono_s() >= until)
            break;
    }
}

/* Before the launch's failure is blamed on a device: wait until every node of the launch
 * answered after it, or one is lost (then the cause: sup_fail_node), at most the node timeout
 * and a second. */
static void blame(void *ctx)
{
    sup_cluster *cl = ctx;
    take_losses(cl);
    probe_nodes(cl); /* already done if a failure was seen; else from the launcher's exit */
    take_losses(cl);
    weigh_failure(cl);
    coord_take_facts(cl);
    while (!cl->decided && !cl->node_failed && !rk_sup_interrupted)
        tick(cl, 0.05);
}

static int ask_stacks(void *ctx, int node, uint32_t id, int rank)
{
    sup_cluster *cl = ctx;
    chan *x = coord_chan_of(cl, node, id, 0);
    if (cl->watch || !x || rank < 0) /* one mpirun's ranks are not the agents' to signal */
        return -1;
    rk_node_stacks m = {.launch = (uint32_t)cl->launch_no + 1, .chan = id, .rank = (uint32_t)rank};
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    if (rk_node_stacks_format(&m, out, sizeof out, &len, &e) ||
        rk_nodes_send(cl->t, node, RK_NODE_MSG_STACKS, out, len, &e)) {
        coord_take_facts(cl); /* the node lost on the send says so */
        return -1;
    }
    x->stack_rank = rank;
    x->stack_bytes = 0;
    x->stack_end = 0;
    return 0;
}

static int stacks_done(void *ctx, int node, uint32_t id)
{
    chan *x = coord_chan_of(ctx, node, id, 0);
    return !x || x->stack_end;
}

/* ---- where the ranks go ------------------------------------------------------------------ */

static const char *socket_name(void *ctx, char *buf, size_t cap)
{
    sup_cluster *cl = ctx;
    snprintf(buf, cap, "@rk-%s%s", cl->job_hex, cl->srun ? "-{node}" : "");
    return buf;
}

static const char *host_list(void *ctx, char *buf, size_t cap)
{
    sup_cluster *cl = ctx;
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < cl->n;) {
        int k = node_of_rank(cl, r), n = 0;
        while (r < cl->n && node_of_rank(cl, r) == k)
            r++, n++;
        used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s%s:%d",
                                 used ? "," : "", node_name(cl, k), n);
    }
    return buf;
}

/* Every host of the launch with its node's snapshot directory (its agent's HELLO), "h1=DIR,
 * h2=DIR"; NULL when one has none or the list does not fit: then no rank snapshots. */
static const char *snap_dirs(void *ctx, char *buf, size_t cap)
{
    sup_cluster *cl = ctx;
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < cl->n;) {
        int k = node_of_rank(cl, r);
        while (r < cl->n && node_of_rank(cl, r) == k)
            r++;
        const char *d = rk_nodes_snap(cl->t, k);
        if (!d)
            return NULL;
        used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s%s=%s",
                                 used ? "," : "", node_name(cl, k), d);
        if (used >= cap)
            return NULL;
    }
    return buf;
}

static int snap_mem(void *ctx, int k, rk_sup_snap_mem *m)
{
    sup_cluster *cl = ctx;
    if (k < 0 || k >= cl->o->nhosts || k >= MAX_NODES)
        return 0;
    const struct node_mem *g = &cl->mem[k];
    *m = (rk_sup_snap_mem){.name = node_name(cl, k),
                           .have = g->have,
                           .own = (uint64_t)g->own,
                           .held = (uint64_t)g->held,
                           .own_peak = (uint64_t)g->own_peak,
                           .held_peak = (uint64_t)g->held_peak};
    return 1;
}

static const char *master(void *ctx)
{
    sup_cluster *cl = ctx;
    int k = node_of_rank(cl, 0);
    return k >= 0 && k < cl->o->nhosts && cl->o->hosts[k].addr ? cl->o->hosts[k].addr
                                                               : node_name(cl, k);
}

static int srun_hosts(void *ctx, const char *hostfile, char *excl, size_t cap, rk_err *err)
{
    sup_cluster *cl = ctx;
    FILE *f = fopen(hostfile, "we");
    if (!f)
        return rk_err_set(err, RK_EIO, "cannot create %s: %s", hostfile, strerror(errno));
    for (int r = 0; r < cl->n; r++) /* rank r on the r-th line: srun's arbitrary distribution */
        fprintf(f, "%s\n", node_name(cl, node_of_rank(cl, r)));
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return rk_err_set(err, RK_EIO, "cannot write %s", hostfile);
    size_t xu = 0;
    int nn = 0;
    excl[0] = '\0';
    for (int k = 0; k < cl->nnodes; k++) {
        /* a node out of this launch that is lost or quarantined: left out by name too */
        int out = cl->node[k].quarantined || !rk_nodes_connected(cl->t, k);
        if (cl->used[k])
            nn++;
        else if (out && xu < cap)
            xu += (size_t)snprintf(excl + xu, cap - xu, "%s%s", xu ? "," : "", node_name(cl, k));
    }
    if (xu >= cap)
        return rk_err_set(err, RK_EINVAL, "the list of nodes left out is too long");
    return nn;
}

/* ---- the devices' hosts ------------------------------------------------------------------ */

static int node_up(void *ctx, int d)
{
    sup_cluster *cl = ctx;
    int k = cl->dev_node[d];
    return rk_nodes_connected(cl->t, k) && !cl->node[k].quarantined;
}

static const char *dev_node_name(void *ctx, int d)
{
    sup_cluster *cl = ctx;
    return node_name(cl, cl->dev_node[d]);
}

static int health(void *ctx, int d, int worst, rk_sup_health *h, char *why, size_t cap)
{
    sup_cluster *cl = ctx;
    if (!cl->o->health)
        return 0;
    *h = (rk_sup_health){.score = 100, .prob = -1.0};
    why[0] = 0;
    if (worst && cl->health[d].have_worst) {
        *h = cl->health[d].worst;
        snprintf(why, cap, "%s", cl->health[d].worst_why);
    } else if (cl->health[d].have) {
        *h = cl->health[d].h;
        snprintf(why, cap, "%s", cl->health[d].why);
    }
    if (worst)
        cl->health[d].have_worst = 0;
    return 1;
}

static int health_sim(void *ctx, int d)
{
    sup_cluster *cl = ctx;
    return cl->health[d].have && cl->health[d].sim;
}

static int open_cluster(void *ctx, struct sup *s, rk_err *err)
{
    sup_cluster *cl = ctx;
    const rk_sup_opts *o = cl->o;
    cl->s = s;
    if (o->nhosts < 1 || o->nhosts > MAX_NODES)
        return rk_err_set(err, RK_EINVAL, "1 to %d hosts", MAX_NODES);
    cl->nnodes = o->nhosts;
    cl->srun = o->launcher == RK_LAUNCH_SRUN;
    cl->watch = o->launcher == RK_LAUNCH_MPIRUN || cl->srun;
    /* partner copies where the nodes keep snapshots (agents.c: --snapshots) */
    cl->partner_every = cl->watch && !cl->srun && o->recovery == RK_SUP_RECOVERY_MEMORY &&
                                o->ckpt_dir && o->nhosts > 1
                            ? o->partner_every
                            : 0;
    cl->snaps = !cl->watch && o->recovery != RK_SUP_RECOVERY_DISK && o->ckpt_dir;
    coord_snap_init(cl);
    /* the devices are the hosts' slots in order ("h1:0", "h1:1", "h2:0", ...) */
    int d = 0;
    for (int k = 0; k < o->nhosts; k++)
        for (int i = 0; i < o->hosts[k].slots && d < RK_SUP_MAX_DEVICES; i++, d++) {
            cl->dev_node[d] = k;
            cl->dev_local[d] = i;
        }
    if (d != o->ndevices)
        return rk_err_set(err, RK_EINVAL, "the devices are not the hosts' slots");
    rk_net_secret key;
    int rc = rk_net_secret_generate(&key, err);
    if (rc)
        return rc;
    rk_net_secret job;
    if ((rc = rk_net_secret_generate(&job, err))) /* 32 random bytes: the job id is 16 */
        return rc;
    memcpy(cl->job, job.key, RK_NET_JOB_ID_LEN);
    rk_net_secret_wipe(&job);
    for (int i = 0; i < RK_NET_JOB_ID_LEN; i++)
        snprintf(cl->job_hex + 2 * i, 3, "%02x", cl->job[i]);
    char host[RK_NODE_HOST_MAX];
    uint16_t port;
    if ((rc = rk_cluster_listen_parse(o->listen, host, sizeof host, &port, err)))
        goto out;
    rk_nodes_opts no = {.listen_host = host,
                        .listen_port = port,
                        .nodes = o->nhosts,
                        .generation = 1,
                        .timeout_s = o->node_timeout_s,
                        .on_event = coord_on_event,
                        .on_msg = coord_on_msg,
                        .ctx = cl};
    memcpy(no.job, cl->job, sizeof no.job);
    if ((rc = rk_nodes_open(&cl->t, &no, &key, err))) {
        if (strstr(err->msg, "assign requested address")) /* not an address of this host */
            rc = rk_err_set(err, RK_EINVAL, "--listen %s: not an address of this host", o->listen);
        goto out;
    }
    cl->key = key;
    if (strchr(host, ':'))
        snprintf(cl->addr, sizeof cl->addr, "[%s]:%u", host, (unsigned)rk_nodes_port(cl->t));
    else
        snprintf(cl->addr, sizeof cl->addr, "%s:%u", host, (unsigned)rk_nodes_port(cl->t));
    sup_say(cl->s, "coordinator listening on %s for %d host%s (node timeout %g s)", cl->addr,
            o->nhosts, o->nhosts == 1 ? "" : "s", o->node_timeout_s);
    if ((rc = coord_start_agents(cl, &key, err)) || rk_sup_interrupted)
        goto out;
    if (o->health) { /* the first launch is picked on readings: wait for the nodes' first */
        sup_say(cl->s,
                "health gate: each host's agent reads its GPUs (%s%s), threshold %.0f, every "
                "%.1f s",
                o->health, !strcmp(o->health, "sim") ? ", simulated" : "", o->health_threshold,
                o->health_interval_s);
        double health_until = rk_mono_s() + HEALTH_WAIT_S;
        while (rk_mono_s() < health_until && !rk_sup_interrupted) {
            int waiting = 0;
            for (int e = 0; e < o->ndevices; e++)
                waiting += rk_nodes_connected(cl->t, cl->dev_node[e]) && !cl->health[e].have;
            if (!waiting)
                break;
            rc = rk_nodes_poll(cl->t, 0.1, err);
            coord_take_facts(cl);
            if (rc)
                goto out;
        }
        for (int e = 0; e < o->ndevices; e++)
            if (rk_nodes_connected(cl->t, cl->dev_node[e]) && !cl->health[e].have)
                sup_say(cl->s,
                        "health gate: no reading of device %s within %g s (its agent's "
                        "words are above); taken as sound until one comes",
                        o->devices[e], HEALTH_WAIT_S);
    }
out:
    rk_net_secret_wipe(&key);
    return rc;
}
static void close_cluster(void *ctx)
{
    sup_cluster *cl = ctx;
    coord_close_chans(cl);
    coord_snap_said(cl);
    if (cl->t)
        rk_nodes_bye(cl->t, "the job is over");
    coord_take_facts(cl); /* the refusals' count said at the end */
    coord_end_agents(cl);
    rk_nodes_free(cl->t);
    cl->t = NULL;
    rk_net_secret_wipe(&cl->key);
}

static const rk_sup_backend_ops cluster_ops = {.name = "cluster",
                                               .open = open_cluster,
                                               .close = close_cluster,
                                               .start = start,
                                               .poll = poll_launch,
                                               .failed_rank = failed_rank,
                                               .kill = kill_launch,
                                               .pump = pump,
                                               .blame = blame,
                                               .ask_stacks = ask_stacks,
                                               .stacks_done = stacks_done,
                                               .socket = socket_name,
                                               .host_list = host_list,
                                               .master = master,
                                               .snap_dirs = snap_dirs,
                                               .snap_mem = snap_mem,
                                               .srun_hosts = srun_hosts,
                                               .node_up = node_up,
                                               .node_name = dev_node_name,
                                               .health = health,
                                               .health_sim = health_sim};

void rk_cluster_run(const rk_sup_opts *o, rk_sup_report *rep)
{
    sup_cluster *cl = calloc(1, sizeof *cl);
    if (!cl) {
        memset(rep, 0, sizeof *rep);
        rep->end = RK_SUP_END_FAILED;
        rk_err_set(&rep->err, RK_ENOMEM, "out of memory");
        rep->outcome = "failed";
        return;
    }
    cl->o = o;
    rk_sup_backend b = {&cluster_ops, cl};
    rk_sup_run_with(o, &b, rep);
    free(cl);
}
