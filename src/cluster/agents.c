/*
 * The node agents' processes (coord.h): each host's `rk agent` started through --rsh (ssh by
 * default; the job's secret on its stdin) or, in a Slurm allocation, srun; the wait for them
 * to join; an agent that is gone reaped and started again with backoff in a new generation;
 * and at the job's end, reaped or killed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/proc.h"
#include "cluster/coord.h"

/* `arg` as the next word of the remote shell's command line (ssh joins the words into one). */
#define MAX_WORDS 4096
#define RK_HOST_ARG_MAX 300 /* "--nodelist=" and a host name */
/* the agent's words as they are, for srun's argv (copies: some are a block's locals) */
static const char *words_raw[MAX_WORDS];
static char words_pool[65536];
static size_t pool_used;
static int nwords;

/* Append arg to the command line in buf, quoted for the remote shell, and keep it as a word
 * (a word that does not fit makes the line too long: the caller's check refuses it). */
static size_t put_word(char *buf, size_t used, size_t cap, const char *arg)
{
    size_t l = strlen(arg) + 1;
    if (nwords < MAX_WORDS && pool_used + l <= sizeof words_pool) {
        memcpy(words_pool + pool_used, arg, l);
        words_raw[nwords++] = words_pool + pool_used;
        pool_used += l;
    } else {
        used = cap; /* too long either way */
    }
    used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s", used ? " " : "");
    return rk_launch_quote(buf, used, cap, arg);
}

/* Start node k's agent: RSH HOST 'AGENT agent --coordinator ... -- WORKER...', the secret
 * on its stdin (under Slurm: srun ... AGENT agent ...). */
static int start_agent(sup_cluster *cl, int k, const rk_net_secret *key, rk_err *err)
{
    const rk_sup_opts *o = cl->o;
    static char cmd[65536];
    char node[16], gen[16];
    snprintf(node, sizeof node, "%d", k);
    snprintf(gen, sizeof gen, "%u", (unsigned)rk_nodes_generation(cl->t, k));
    size_t used = 0;
    cmd[0] = 0;
    nwords = 0;
    pool_used = 0;
    used = put_word(cmd, used, sizeof cmd, o->agent_cmd ? o->agent_cmd : rk_launch_self_exe());
    const char *words[] = {"agent",    "--coordinator", cl->addr,       "--node", node,
                           "--job-id", cl->job_hex,     "--generation", gen};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        used = put_word(cmd, used, sizeof cmd, words[i]);
    if (o->health) { /* the agent reads its GPUs; a simulated fleet spans the hosts */
        char num[32];
        snprintf(num, sizeof num, "%d", o->hosts[k].slots);
        used = put_word(cmd, used, sizeof cmd, "--devices");
        used = put_word(cmd, used, sizeof cmd, num);
        used = put_word(cmd, used, sizeof cmd, "--health");
        used = put_word(cmd, used, sizeof cmd, o->health);
        snprintf(num, sizeof num, "%.17g", o->health_interval_s);
        used = put_word(cmd, used, sizeof cmd, "--health-interval");
        used = put_word(cmd, used, sizeof cmd, num);
        if (o->predictor) {
            used = put_word(cmd, used, sizeof cmd, "--predictor");
            used = put_word(cmd, used, sizeof cmd, o->predictor);
        }
        if (!strcmp(o->health, "sim")) {
            int first = 0;
            for (int d = 0; d < o->ndevices; d++)
                if (cl->dev_node[d] == k) {
                    first = d;
                    break;
                }
            /* every agent simulates the whole fleet (its GPUs' profiles are drawn in order)
             * and reads its own slots of it */
            const char *flag[] = {"--sim-first",
                                  "--sim-gpus",
                                  "--sim-seed",
                                  "--sim-age",
                                  o->sim_step_s > 0 ? "--sim-step-time" : "--sim-time-scale",
                                  "--sim-skip"};
            char val[6][32];
            snprintf(val[0], sizeof val[0], "%d", first);
            snprintf(val[1], sizeof val[1], "%d", o->ndevices);
            snprintf(val[2], sizeof val[2], "%llu", (unsigned long long)o->health_seed);
            snprintf(val[3], sizeof val[3], "%.17g", o->health_age_h);
            snprintf(val[4], sizeof val[4], "%.17g",
                     o->sim_step_s > 0 ? o->sim_step_s : o->health_time_scale);
            snprintf(val[5], sizeof val[5], "%.17g", o->sim_skip_h);
            for (int i = 0; i < 6; i++) {
                used = put_word(cmd, used, sizeof cmd, flag[i]);
                used = put_word(cmd, used, sizeof cmd, val[i]);
            }
            used = put_word(cmd, used, sizeof cmd, "--sim-load");
            used = put_word(cmd, used, sizeof cmd,
                            o->health_sim_load == RK_SIM_LOAD_BUSY ? "busy" : "idle");
            if (o->health_sim_sensors)
                used = put_word(cmd, used, sizeof cmd, "--sim-sensors");
        }
    }
    if (cl->watch) { /* no worker: mpirun starts the ranks, the agent watches them */
        used = put_word(cmd, used, sizeof cmd, "--watch");
        if (cl->srun) { /* the hosts may share one network namespace: a socket a node */
            used = put_word(cmd, used, sizeof cmd, "--socket-node");
            used = put_word(cmd, used, sizeof cmd, o->hosts[k].name);
        } else if (o->recovery == RK_SUP_RECOVERY_MEMORY && o->ckpt_dir) {
            /* each node keeps its ranks' snapshots (docs/recovery.md "Across hosts") */
            const char *parent = getenv("RK_SNAP_PARENT");
            used = put_word(cmd, used, sizeof cmd, "--snapshots");
            used = put_word(cmd, used, sizeof cmd, parent && *parent ? parent : "");
        }
        goto argv;
    }
    if (o->ckpt_dir) {
        used = put_word(cmd, used, sizeof cmd, "--ckpt-dir");
        used = put_word(cmd, used, sizeof cmd, o->ckpt_dir);
        if (cl->snaps) { /* the agent starts its ranks with its node's snapshot directory */
            const char *parent = getenv("RK_SNAP_PARENT");
            used = put_word(cmd, used, sizeof cmd, "--snapshots");
            used = put_word(cmd, used, sizeof cmd, parent && *parent ? parent : "");
        }
    }
    if (o->inject) {
        used = put_word(cmd, used, sizeof cmd, "--inject");
        used = put_word(cmd, used, sizeof cmd, o->inject);
    }
    if (o->no_pythonpath)
        used = put_word(cmd, used, sizeof cmd, "--no-pythonpath");
    used = put_word(cmd, used, sizeof cmd, "--");
    for (int i = 0; o->worker[i]; i++)
        used = put_word(cmd, used, sizeof cmd, o->worker[i]);
argv:
    if (used >= sizeof cmd)
        return rk_err_set(err, RK_EINVAL, "the agent's command line is too long");
    /* argv: the words of --rsh, the host, the command line; or srun's, then the words */
    char rsh[4096], nodearg[RK_HOST_ARG_MAX], namearg[RK_HOST_ARG_MAX];
    snprintf(rsh, sizeof rsh, "%s", o->rsh ? o->rsh : "ssh -o BatchMode=yes");
    static const char *argv[MAX_WORDS + 16];
    int a = 0;
    if (cl->srun) {
        /* one task on the node, sharing its CPUs with the ranks' step (--overlap), not ended
         * when another node of the allocation fails */
        snprintf(nodearg, sizeof nodearg, "--nodelist=%s", o->hosts[k].name);
        snprintf(namearg, sizeof namearg, "--job-name=rk-agent-%s", o->hosts[k].name);
        const char *sw[] = {"srun",   "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                            nodearg,  namearg,     "--overlap",  "--kill-on-bad-exit=0",
                            "--quiet"};
        for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
            argv[a++] = sw[i];
        for (int i = 0; i < nwords; i++)
            argv[a++] = words_raw[i];
    } else {
        for (char *save = NULL, *w = strtok_r(rsh, " \t", &save); w && a < 64;
             w = strtok_r(NULL, " \t", &save))
            argv[a++] = w;
        if (a == 0)
            return rk_err_set(err, RK_EINVAL, "--rsh is empty");
        argv[a++] = o->hosts[k].name;
        argv[a++] = cmd;
    }
    argv[a] = NULL;
    int in[2];
    if (pipe2(in, O_CLOEXEC) != 0)
        return rk_err_set(err, RK_EIO, "pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]);
        close(in[1]);
        return rk_err_set(err, RK_EIO, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        dup2(in[0], STDIN_FILENO);
        setpgid(0, 0); /* a terminal's ^C goes to rk run, which ends the job in order */
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* the agent goes with rk run */
        rk_proc_cloexec_from(3); /* the rsh and the agent get stdin (the secret), out, err */
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "rk run: cannot run %s%s: %s\n", cl->srun ? "" : "--rsh ", argv[0],
                strerror(errno));
        _exit(127);
    }
    close(in[0]);
    char hex[RK_NET_SECRET_HEX_LEN + 2];
    rk_net_secret_hex(key, hex);
    size_t hl = strlen(hex);
    ssize_t w = write(in[1], hex, hl);
    memset(hex, 0, sizeof hex);
    close(in[1]);
    if (w != (ssize_t)hl)
        sup_say(cl->s, "node %d (%s): could not hand the secret to the agent", k, o->hosts[k].name);
    cl->rsh[k] = pid;
    rk_launch_spare(pid); /* a launch's teardown leaves the agents be */
    return RK_OK;
}

int coord_start_agents(sup_cluster *cl, const rk_net_secret *key, rk_err *err)
{
    const rk_sup_opts *o = cl->o;
    int rc;
    for (int k = 0; k < o->nhosts; k++)
        if ((rc = start_agent(cl, k, key, err)))
            return rc;
    /* every agent joins, or its --rsh ends first, or the startup timeout passes (the missing
     * ones are down) */
    double until = rk_mono_s() + o->startup_timeout_s;
    int rsh_status[MAX_NODES], missing = 0, unrunnable = 0;
    for (int k = 0; k < o->nhosts; k++)
        rsh_status[k] = -1;
    for (;;) {
        int waiting = 0;
        for (int k = 0; k < o->nhosts; k++) {
            int st;
            if (cl->rsh[k] > 0 && !rk_nodes_connected(cl->t, k) &&
                waitpid(cl->rsh[k], &st, WNOHANG) == cl->rsh[k]) {
                cl->rsh[k] = 0;
                rsh_status[k] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            }
            waiting += !rk_nodes_connected(cl->t, k) && cl->rsh[k] > 0;
        }
        if (!waiting || rk_mono_s() >= until || rk_sup_interrupted)
            break;
        rc = rk_nodes_poll(cl->t, 0.1, err);
        coord_take_facts(cl); /* no launch yet: what the nodes said */
        if (rc)
            return rc;
    }
    if (rk_sup_interrupted)
        return RK_OK;
    for (int k = 0; k < o->nhosts; k++) {
        if (rk_nodes_connected(cl->t, k))
            continue;
        missing++;
        if (rsh_status[k] >= 0) {
            unrunnable += rsh_status[k] == 127;
            sup_say(cl->s,
                    "node %d (%s): its agent did not start: the --rsh command exited with "
                    "status %d (its words are above); its devices are left out",
                    k, o->hosts[k].name, rsh_status[k]);
        } else {
            sup_say(cl->s,
                    "node %d (%s): no agent joined within %g s (--startup-timeout); its devices "
                    "are left out",
                    k, o->hosts[k].name, o->startup_timeout_s);
        }
    }
    if (missing == o->nhosts && unrunnable == o->nhosts)
        return rk_err_set(err, RK_ENOENT,
                          "--rsh '%s' cannot be run (exit status 127 on every host)",
                          o->rsh ? o->rsh : "ssh -o BatchMode=yes");
    return RK_OK;
}

/* Reap agents' rsh processes that ended (an agent that exits is a node gone), and start a
 * new agent for a node that has none and is not connected (its host rebooted, its agent
 * died), with backoff: a new generation for the node, so the new process's frames count
 * from 1 and the old one's are refused. It may run ranks again from the next launch. */
void coord_tend_agents(sup_cluster *cl)
{
    double now = rk_mono_s();
    for (int k = 0; k < cl->nnodes; k++) {
        int st;
        if (cl->rsh[k] > 0) {
            pid_t r = waitpid(cl->rsh[k], &st, WNOHANG);
            if (r == cl->rsh[k] || (r < 0 && errno == ECHILD)) {
                cl->rsh[k] = 0;
                if (cl->backoff[k] < 1)
                    cl->backoff[k] = 1;
                cl->restart_at[k] = now + cl->backoff[k];
            }
            continue;
        }
        if (cl->node[k].quarantined || rk_nodes_connected(cl->t, k) || now < cl->restart_at[k] ||
            rk_sup_interrupted || !rk_nodes_host(cl->t, k)) /* never joined: never up */
            continue;
        rk_nodes_renew(cl->t, k, rk_nodes_generation(cl->t, k) + 1);
        rk_err e = {0};
        if (start_agent(cl, k, &cl->key, &e))
            sup_say(cl->s, "node %d (%s): cannot start a new agent: %s", k, node_name(cl, k),
                    e.msg);
        else
            sup_say(cl->s, "node %d (%s): its agent is gone; started a new one (generation %u)", k,
                    node_name(cl, k), (unsigned)rk_nodes_generation(cl->t, k));
        cl->backoff[k] = cl->backoff[k] * 2 > 30 ? 30 : cl->backoff[k] * 2;
        cl->restart_at[k] = now + cl->backoff[k];
    }
}

void coord_end_agents(sup_cluster *cl)
{
    double until = rk_mono_s() + AGENT_EXIT_WAIT_S;
    for (int k = 0; k < cl->nnodes; k++) {
        while (cl->rsh[k] > 0) {
            int st;
            pid_t r = waitpid(cl->rsh[k], &st, WNOHANG);
            if (r == cl->rsh[k] || (r < 0 && errno == ECHILD)) {
                cl->rsh[k] = 0;
                break;
            }
            if (rk_mono_s() > until) { /* our own child, by the pid fork gave us */
                kill(cl->rsh[k], SIGKILL);
                waitpid(cl->rsh[k], &st, 0);
                cl->rsh[k] = 0;
                break;
            }
            poll(NULL, 0, 20);
        }
    }
}
