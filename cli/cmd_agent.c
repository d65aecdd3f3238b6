/*
 * rk agent: a node's agent, linked to the job's coordinator over the authenticated node link
 * (cluster/agent.h, docs/cluster.md). Parses flags, reads the secret from stdin or a 0600
 * file (net/secret.h), runs the link until BYE, a refusal or SIGINT/SIGTERM.
 * Also rk _coordinator, the hidden stand-in for rk run's side (cluster/nodes.h): it listens,
 * keeps the table of nodes and prints one line per node event.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "base/clock.h"
#include "cluster/agent.h"
#include "cluster/agent_job.h"
#include "cluster/nodes.h"
#include "cluster/slurm.h"
#include "net/secret.h"
#include "rekindle/health.h"
#include "rk.h"
#include "supervisor/supervisor.h"

static volatile sig_atomic_t stop_flag;

static void on_stop(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* SIGINT and SIGTERM set the flag and interrupt poll (no SA_RESTART). */
static void catch_stop(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* ---- rk agent ---------------------------------------------------------------------------- */

static const char agent_usage[] =
    "usage: rk agent --coordinator HOST:PORT --node K --job-id HEX [--secret-file F]\n"
    "                [--generation G] [--ping-interval D] [--connect-timeout D]\n"
    "                [--reconnect-for D] [--boot-id-file F]\n"
    "                [--ckpt-dir DIR] [--inject SPEC] [--no-pythonpath] [--watch]\n"
    "                [--socket-node NAME]\n"
    "                [--devices N --health nvml|sim [--health-interval S] [--predictor M]\n"
    "                 [--sim-first I --sim-gpus N --sim-seed S --sim-age H --sim-skip H\n"
    "                  --sim-step-time D|--sim-time-scale X --sim-load idle|busy --sim-sensors]]\n"
    "                [-- WORKER ARGS...]\n"
    "\n"
    "Run this host's node agent: connect to the job's coordinator over the authenticated node\n"
    "link (docs/cluster-protocol.md), say who this node is (index, host name, pid, boot id),\n"
    "and keep the link alive with a ping every interval; reconnect with backoff when it drops.\n"
    "With a WORKER, the agent starts this node's ranks of it when the coordinator says so,\n"
    "relays their heartbeats and reports their end (docs/cluster.md); `rk run --hosts` starts\n"
    "the agents itself.\n"
    "\n"
    "  --coordinator HOST:PORT  the coordinator's address ([V6]:PORT for IPv6)\n"
    "  --node K                 this node's index in the job (0, 1, ...)\n"
    "  --job-id HEX             the job's id: 32 hexadecimal digits\n"
    "  --secret-file F          read the job's secret from F (0600, owned by this user) instead\n"
    "                           of stdin; never give the secret on the command line\n"
    "  --generation G           the generation of this node's link to start in (default 1;\n"
    "                           rk run gives an agent it starts again a newer one, and the\n"
    "                           agent follows the coordinator into newer ones)\n"
    "  --ping-interval D        ping this often: 1s (default), 500ms, ...\n"
    "  --connect-timeout D      one connection attempt, and the wait for the coordinator's\n"
    "                           answer (default 5s)\n"
    "  --reconnect-for D        give up after this long without a link (default 60s)\n"
    "  --boot-id-file F         where the host's boot id is read (default\n"
    "                           /proc/sys/kernel/random/boot_id)\n"
    "  --ckpt-dir DIR           RK_CKPT_DIR for the ranks (a directory every host sees)\n"
    "  --inject SPEC            RK_INJECT for the ranks (fault injection, docs/run.md)\n"
    "  --no-pythonpath          leave PYTHONPATH as it is (else the rekindle package is on it)\n"
    "  --watch                  ranks another launcher starts (one mpirun across the hosts)\n"
    "                           connect to the abstract socket @rk-JOBID: relay them\n"
    "  --socket-node NAME       with --watch: the socket is @rk-JOBID-NAME (srun's ranks on\n"
    "                           Slurm node NAME: nodes may share a network namespace)\n"
    "  --devices N              this node's GPUs, 0..N-1 (with --health)\n"
    "  --health MODE            read them and report each one's score to the coordinator\n"
    "                           (HEALTH): nvml, or sim (a simulated fleet: docs/cluster.md)\n"
    "  --health-interval S      seconds between readings (default 5)\n"
    "  --predictor MODEL        the failure model of rk run --predictor (a path on this host)\n"
    "  --sim-first I            sim: this node's device 0 is the fleet's GPU I (default 0)\n"
    "  --sim-gpus N             sim: the whole fleet's size (default: I + --devices)\n"
    "  --sim-seed S, --sim-time-scale X, --sim-age H, --sim-skip H\n"
    "                           sim: as rk run's (defaults 1, 60, 0, 0)\n"
    "  --sim-step-time D        sim: ages D a step of the job (its PROGRESS), not by the clock\n"
    "  --sim-load LOAD, --sim-sensors\n"
    "                           sim: as rk run's (default idle, no sensors)\n"
    "  -h, --help               show this help\n"
    "\n"
    "The secret is read from stdin by default: 64 hexadecimal characters and a newline.\n"
    "Exit status: 0 the coordinator said BYE (or SIGINT/SIGTERM: the agent says BYE), 1 the\n"
    "coordinator refused this node, or no link came for --reconnect-for (unreachable, or the\n"
    "link closed before the coordinator accepted it: a wrong secret or job id), or --health\n"
    "cannot read the GPUs (no NVML, fewer GPUs than --devices), 2 bad usage (a --predictor\n"
    "model it cannot use too).\n";

static rk_args agent_args = {.cmd = "agent", .usage = agent_usage};

static void print_log(void *ctx, const char *line)
{
    fprintf(stderr, "rk %s: %s\n", (const char *)ctx, line);
    fflush(stderr);
}

/* The secret from --secret-file or stdin; 0, or an exit status after one line. */
static int read_secret(const char *cmd, const char *path, rk_net_secret *key)
{
    rk_err err = {0};
    int rc = path ? rk_net_secret_load(key, path, &err)
                  : rk_net_secret_read_fd(key, STDIN_FILENO, "stdin", &err);
    if (rc) {
        fprintf(stderr, "rk %s: %s\n", cmd, err.msg);
        return RK_EXIT_USAGE;
    }
    return 0;
}

int rk_cmd_agent(int argc, char **argv)
{
    static const struct option longs[] = {{"coordinator", required_argument, 0, 'c'},
                                          {"node", required_argument, 0, 'n'},
                                          {"job-id", required_argument, 0, 'j'},
                                          {"secret-file", required_argument, 0, 's'},
                                          {"generation", required_argument, 0, 'g'},
                                          {"ping-interval", required_argument, 0, 'p'},
                                          {"connect-timeout", required_argument, 0, 't'},
                                          {"reconnect-for", required_argument, 0, 'r'},
                                          {"boot-id-file", required_argument, 0, 'b'},
                                          {"ckpt-dir", required_argument, 0, 'C'},
                                          {"inject", required_argument, 0, 'I'},
                                          {"no-pythonpath", no_argument, 0, 'P'},
                                          {"watch", no_argument, 0, 'W'},
                                          {"socket-node", required_argument, 0, 'O'},
                                          /* rk run's own (docs/recovery.md), not in the usage:
                                           * the ranks' snapshot directory on this node */
                                          {"snapshots", required_argument, 0, 'Z'},
                                          {"devices", required_argument, 0, 'D'},
                                          {"health", required_argument, 0, 'H'},
                                          {"health-interval", required_argument, 0, 'i'},
                                          {"predictor", required_argument, 0, 'M'},
                                          {"sim-first", required_argument, 0, 'f'},
                                          {"sim-seed", required_argument, 0, 'S'},
                                          {"sim-gpus", required_argument, 0, 'F'},
                                          {"sim-time-scale", required_argument, 0, 'x'},
                                          {"sim-step-time", required_argument, 0, 'y'},
                                          {"sim-age", required_argument, 0, 'a'},
                                          {"sim-skip", required_argument, 0, 'k'},
                                          {"sim-load", required_argument, 0, 'L'},
                                          {"sim-sensors", no_argument, 0, 'E'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_agent_opts o = RK_AGENT_OPTS_DEFAULT;
    rk_agent_job_opts jo = {0};
    const char *coord = NULL, *job = NULL, *secret_file = NULL, *socket_node = NULL;
    int node = -1, gen = 1, watch = 0, ndev = 0, first = 0, fleet = 0, sim_given = 0,
        scale_given = 0;
    rk_sup_opts ho = {.health_seed = 1,
                      .health_time_scale = 60,
                      .health_interval_s = 5,
                      .health_threshold = RK_HEALTH_THRESHOLD_DEFAULT};
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "+h", longs, NULL)) != -1) {
        switch (c) {
        case 'c': coord = optarg; break;
        case 'C': jo.ckpt_dir = optarg; break;
        case 'I': jo.inject = optarg; break;
        case 'P': jo.no_pythonpath = 1; break;
        case 'W': watch = 1; break;
        case 'Z': jo.snap_parent = optarg; break;
        case 'O':
            if (!rk_slurm_node_name_ok(optarg)) {
                fprintf(stderr,
                        "rk agent: --socket-node '%.64s': not a node name (1 to 63 of "
                        "A-Z a-z 0-9 . _ -)\n",
                        optarg);
                return RK_EXIT_USAGE;
            }
            socket_node = optarg;
            break;
        case 'n':
            if (rk_arg_count(&agent_args, "--node", optarg, 0, RK_NODES_MAX - 1, &node))
                return RK_EXIT_USAGE;
            break;
        case 'j': job = optarg; break;
        case 's': secret_file = optarg; break;
        case 'g':
            if (rk_arg_count(&agent_args, "--generation", optarg, 1, 1 << 30, &gen))
                return RK_EXIT_USAGE;
            break;
        case 'p':
            if (rk_arg_seconds(&agent_args, "--ping-interval", optarg, 0.01, 3600, &o.ping_s))
                return RK_EXIT_USAGE;
            break;
        case 't':
            if (rk_arg_seconds(&agent_args, "--connect-timeout", optarg, 0.01, 3600,
                               &o.connect_timeout_s))
                return RK_EXIT_USAGE;
            break;
        case 'r':
            if (rk_arg_seconds(&agent_args, "--reconnect-for", optarg, 0, RK_ARG_SECONDS_MAX,
                               &o.reconnect_s))
                return RK_EXIT_USAGE;
            break;
        case 'b': o.boot_id_path = optarg; break;
        case 'D':
            if (rk_arg_count(&agent_args, "--devices", optarg, 1, RK_NODES_MAX, &ndev))
                return RK_EXIT_USAGE;
            break;
        case 'H':
            if (strcmp(optarg, "nvml") != 0 && strcmp(optarg, "sim") != 0)
                return rk_cli_usage_error("agent", agent_usage, "--health '%s' is not nvml or sim",
                                          optarg);
            ho.health = optarg;
            break;
        case 'i':
            if (rk_arg_seconds(&agent_args, "--health-interval", optarg, 0.1, RK_ARG_SECONDS_MAX,
                               &ho.health_interval_s))
                return RK_EXIT_USAGE;
            break;
        case 'M': ho.predictor = optarg; break;
        case 'f':
            sim_given = 1;
            if (rk_arg_count(&agent_args, "--sim-first", optarg, 0, 1023, &first))
                return RK_EXIT_USAGE;
            break;
        case 'F':
            sim_given = 1;
            if (rk_arg_count(&agent_args, "--sim-gpus", optarg, 1, 1024, &fleet))
                return RK_EXIT_USAGE;
            break;
        case 'S':
            sim_given = 1;
            if (rk_arg_seed(&agent_args, "--sim-seed", optarg, &ho.health_seed))
                return RK_EXIT_USAGE;
            break;
        case 'x':
            sim_given = 1;
            if (rk_arg_real(&agent_args, "--sim-time-scale", optarg, 1e-3, 1e9,
                            &ho.health_time_scale))
                return RK_EXIT_USAGE;
            scale_given = 1;
            break;
        case 'y':
            sim_given = 1;
            if (rk_arg_seconds(&agent_args, "--sim-step-time", optarg, 1e-3, 3.6e6, &ho.sim_step_s))
                return RK_EXIT_USAGE;
            break;
        case 'a':
            sim_given = 1;
            if (rk_arg_hours(&agent_args, "--sim-age", optarg, &ho.health_age_h))
                return RK_EXIT_USAGE;
            break;
        case 'k':
            sim_given = 1;
            if (rk_arg_hours(&agent_args, "--sim-skip", optarg, &ho.sim_skip_h))
                return RK_EXIT_USAGE;
            break;
        case 'L':
            sim_given = 1;
            if (rk_arg_sim_load(&agent_args, "--sim-load", optarg, &ho.health_sim_load))
                return RK_EXIT_USAGE;
            break;
        case 'E':
            sim_given = 1;
            ho.health_sim_sensors = true;
            break;
        case 'h': fputs(agent_usage, stdout); return RK_EXIT_OK;
        default:
            return rk_cli_usage_error("agent", agent_usage, "unknown option or missing value: '%s'",
                                      argv[optind - 1]);
        }
    }
    if (optind < argc)
        jo.worker = argv + optind; /* the node's ranks run this */
    if (watch && jo.worker)
        return rk_cli_usage_error("agent", agent_usage,
                                  "--watch is for ranks another launcher starts: no WORKER");
    if (socket_node && !watch)
        return rk_cli_usage_error("agent", agent_usage, "--socket-node goes with --watch");
    if (!jo.worker && (jo.ckpt_dir || jo.inject))
        return rk_cli_usage_error("agent", agent_usage,
                                  "--ckpt-dir and --inject are for the ranks: give -- WORKER ARGS");
    if (ho.health && !ndev)
        return rk_cli_usage_error("agent", agent_usage, "--health needs --devices N");
    if (!ho.health && (ndev || ho.predictor || sim_given))
        return rk_cli_usage_error("agent", agent_usage,
                                  "--devices, --predictor and --sim-* are for --health");
    if (sim_given && strcmp(ho.health, "sim") != 0)
        return rk_cli_usage_error("agent", agent_usage, "--sim-* options need --health sim");
    if (scale_given && ho.sim_step_s > 0)
        return rk_cli_usage_error("agent", agent_usage,
                                  "--sim-step-time and --sim-time-scale are two clocks: give one");
    if (ho.health && fleet && first + ndev > fleet)
        return rk_cli_usage_error("agent", agent_usage,
                                  "--sim-gpus %d: the fleet has no GPU %d (--sim-first %d, "
                                  "--devices %d)",
                                  fleet, first + ndev - 1, first, ndev);
    if (ho.health && first + ndev > 1024)
        return rk_cli_usage_error("agent", agent_usage,
                                  "--sim-first %d with --devices %d: past the fleet's GPU 1023",
                                  first, ndev);
    if (ho.predictor && rk_arg_path(&agent_args, "--predictor", ho.predictor, RK_PATH_FILE))
        return RK_EXIT_USAGE;
    if (!coord || node < 0 || !job)
        return rk_cli_usage_error("agent", agent_usage,
                                  "--coordinator, --node and --job-id are required");
    rk_err err = {0};
    char host[RK_NODE_HOST_MAX];
    if (rk_node_hostport_parse(coord, host, sizeof host, &o.port, &err))
        return rk_cli_usage_error("agent", agent_usage, "--coordinator %s", err.msg);
    if (o.port == 0)
        return rk_cli_usage_error("agent", agent_usage, "--coordinator: port 0 is no address");
    if (rk_node_job_parse(job, o.job, &err))
        return rk_cli_usage_error("agent", agent_usage, "--job-id: %s", err.msg);
    if ((secret_file && rk_arg_path(&agent_args, "--secret-file", secret_file, RK_PATH_FILE)) ||
        (o.boot_id_path &&
         rk_arg_path(&agent_args, "--boot-id-file", o.boot_id_path, RK_PATH_FILE)))
        return RK_EXIT_USAGE;
    o.host = host;
    o.node = (uint32_t)node;
    o.generation = (uint32_t)gen;
    rk_net_secret key;
    int st = read_secret("agent", secret_file, &key);
    if (st)
        return st;
    catch_stop();
    o.stop = &stop_flag;
    static char who[64];
    snprintf(who, sizeof who, "agent (node %d)", node);
    o.on_log = print_log;
    o.ctx = who;
    rk_agent_job *aj = NULL;
    char abstract[128];
    if (watch) { /* the ranks connect to @rk-JOBID[-NODE] (docs/cluster.md, slurm.md) */
        snprintf(abstract, sizeof abstract, "rk-%s", job);
        for (char *p = abstract; *p; p++) /* the job id's hex digits, not the node's name */
            *p = (char)(*p >= 'A' && *p <= 'F' ? *p - 'A' + 'a' : *p);
        if (socket_node)
            snprintf(abstract + strlen(abstract), sizeof abstract - strlen(abstract), "-%s",
                     socket_node);
        jo.abstract = abstract;
    }
    if (jo.worker || watch) {
        jo.on_log = print_log;
        jo.ctx = who;
        prctl(PR_SET_CHILD_SUBREAPER, 1); /* whatever escapes a keeper is reparented here */
        if (rk_agent_job_new(&aj, &jo, &err)) {
            rk_net_secret_wipe(&key);
            fprintf(stderr, "rk agent: %s\n", err.msg);
            return RK_EXIT_FAIL;
        }
        o.ranks = aj;
    }
    rk_gate *gate = NULL;
    if (ho.health) { /* the node's GPUs: ids 0..N-1, or the fleet's first..first+N-1 */
        int sim = strcmp(ho.health, "sim") == 0;
        if (!sim)
            first = 0;
        ho.health_sim_gpus = fleet > first + ndev ? fleet : first + ndev;
        if (rk_gate_open(&gate, &ho, &err)) {
            rk_agent_job_free(aj);
            rk_net_secret_wipe(&key);
            fprintf(stderr, "rk agent: health gate: %s\n", err.msg);
            /* a broken --predictor is bad input; no NVML here is not */
            return err.code == RK_EFORMAT || err.code == RK_EINVAL ? RK_EXIT_USAGE : RK_EXIT_FAIL;
        }
        char id[16];
        snprintf(id, sizeof id, "%d", first + ndev - 1);
        if (!rk_gate_knows(gate, id)) {
            fprintf(stderr, "rk agent: health gate: %d GPUs asked for, the %s backend has fewer\n",
                    ndev, rk_gate_backend(gate));
            rk_gate_close(gate);
            rk_agent_job_free(aj);
            rk_net_secret_wipe(&key);
            return RK_EXIT_FAIL;
        }
        fprintf(stderr, "rk %s: health gate: %d %s GPU%s%s, read every %.1f s\n", who, ndev,
                rk_gate_backend(gate), ndev == 1 ? "" : "s", sim ? " (simulated)" : "",
                ho.health_interval_s);
        o.gate = gate;
        o.gate_first = first;
        o.gate_n = ndev;
        o.health_s = ho.health_interval_s;
    }
    rk_agent_outcome outcome;
    int rc = rk_agent_run(&o, &key, &outcome, &err);
    rk_gate_close(gate);
    rk_agent_job_free(aj);
    rk_net_secret_wipe(&key);
    if (rc) {
        fprintf(stderr, "rk agent: %s\n", err.msg);
        return rc == RK_EINVAL || rc == RK_EFORMAT ? RK_EXIT_USAGE : RK_EXIT_FAIL;
    }
    fprintf(stderr, "rk agent: %s\n", err.msg);
    return outcome == RK_AGENT_BYE || outcome == RK_AGENT_STOPPED ? RK_EXIT_OK : RK_EXIT_FAIL;
}

/* ---- rk _coordinator --------------------------------------------------------------------- */

static const char coord_usage[] =
    "usage: rk _coordinator --listen ADDR:PORT --nodes N --secret-file F --job-id HEX\n"
    "                       [--generation G] [--node-timeout D] [--for D]\n"
    "\n"
    "The coordinator's side of the node link on its own (rk run's part, to try the agents):\n"
    "listen on ADDR:PORT (port 0 picks one), accept the agents of nodes 0..N-1 and print one\n"
    "line per node event: joined, lost, rejoined, rebooted, reconnected, left, refused (the\n"
    "refusals of connections that sent no HELLO: 5 lines in 10 s, then their count).\n"
    "After --for (default: until SIGINT/SIGTERM) it says BYE to every agent and exits 0.\n";

static void print_event(void *ctx, const rk_node_event *e)
{
    (void)ctx;
    const char *name = rk_node_event_name(e->kind);
    switch (e->kind) {
    case RK_NODE_LOST:
        printf("node %d lost after %.1f s: %s\n", e->node, e->silent_s, e->why);
        break;
    case RK_NODE_REFUSED:
        if (e->node >= 0)
            printf("refused %s (node %d): %s\n", e->from, e->node, e->why);
        else
            printf("refused %s: %s\n", e->from, e->why);
        break;
    case RK_NODE_LEFT: printf("node %d left: %s\n", e->node, e->why); break;
    case RK_NODE_HUSHED:
        printf("refused %d more connection%s in %g s (not logged one by one)\n", e->count,
               e->count == 1 ? "" : "s", RK_NODES_HUSH_S);
        break;
    default: printf("node %d %s: host %s from %s\n", e->node, name, e->host, e->from); break;
    }
    fflush(stdout);
}

int rk_cmd_coordinator(int argc, char **argv)
{
    static const struct option longs[] = {{"listen", required_argument, 0, 'l'},
                                          {"nodes", required_argument, 0, 'n'},
                                          {"secret-file", required_argument, 0, 's'},
                                          {"job-id", required_argument, 0, 'j'},
                                          {"generation", required_argument, 0, 'g'},
                                          {"node-timeout", required_argument, 0, 't'},
                                          {"for", required_argument, 0, 'f'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_args args = {.cmd = "_coordinator", .usage = coord_usage};
    rk_nodes_opts o = {.generation = 1, .timeout_s = 10};
    const char *listen = NULL, *job = NULL, *secret_file = NULL;
    int gen = 1;
    double for_s = -1;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'l': listen = optarg; break;
        case 'n':
            if (rk_arg_count(&args, "--nodes", optarg, 1, RK_NODES_MAX, &o.nodes))
                return RK_EXIT_USAGE;
            break;
        case 's': secret_file = optarg; break;
        case 'j': job = optarg; break;
        case 'g':
            if (rk_arg_count(&args, "--generation", optarg, 1, 1 << 30, &gen))
                return RK_EXIT_USAGE;
            break;
        case 't':
            if (rk_arg_seconds(&args, "--node-timeout", optarg, 0.05, RK_ARG_SECONDS_MAX,
                               &o.timeout_s))
                return RK_EXIT_USAGE;
            break;
        case 'f':
            if (rk_arg_seconds(&args, "--for", optarg, 0, RK_ARG_SECONDS_MAX, &for_s))
                return RK_EXIT_USAGE;
            break;
        case 'h': fputs(coord_usage, stdout); return RK_EXIT_OK;
        default:
            return rk_cli_usage_error("_coordinator", coord_usage,
                                      "unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return rk_cli_usage_error("_coordinator", coord_usage, "unexpected argument '%s'",
                                  argv[optind]);
    if (!listen || !o.nodes || !job || !secret_file)
        return rk_cli_usage_error("_coordinator", coord_usage,
                                  "--listen, --nodes, --secret-file and --job-id are required");
    rk_err err = {0};
    char host[RK_NODE_HOST_MAX];
    if (rk_node_hostport_parse(listen, host, sizeof host, &o.listen_port, &err))
        return rk_cli_usage_error("_coordinator", coord_usage, "--listen %s", err.msg);
    if (rk_node_job_parse(job, o.job, &err))
        return rk_cli_usage_error("_coordinator", coord_usage, "--job-id: %s", err.msg);
    if (rk_arg_path(&args, "--secret-file", secret_file, RK_PATH_FILE))
        return RK_EXIT_USAGE;
    o.listen_host = host;
    o.generation = (uint32_t)gen;
    o.on_event = print_event;
    rk_net_secret key;
    int st = read_secret("_coordinator", secret_file, &key);
    if (st)
        return st;
    rk_nodes *t = NULL;
    int rc = rk_nodes_open(&t, &o, &key, &err);
    rk_net_secret_wipe(&key);
    if (rc) {
        fprintf(stderr, "rk _coordinator: %s\n", err.msg);
        return rc == RK_EINVAL ? RK_EXIT_USAGE : RK_EXIT_FAIL;
    }
    catch_stop();
    printf("rk _coordinator: listening on %s port %u for %d node%s, launch %u\n", host,
           (unsigned)rk_nodes_port(t), o.nodes, o.nodes == 1 ? "" : "s", o.generation);
    fflush(stdout);
    double end = for_s >= 0 ? rk_mono_s() + for_s : -1;
    while (!stop_flag && (end < 0 || rk_mono_s() < end)) {
        double wait = end < 0 ? 0.5 : end - rk_mono_s();
        if (rk_nodes_poll(t, wait > 0.5 ? 0.5 : wait, &err)) {
            fprintf(stderr, "rk _coordinator: %s\n", err.msg);
            rk_nodes_free(t);
            return RK_EXIT_FAIL;
        }
    }
    rk_nodes_bye(t, stop_flag ? "the coordinator was stopped" : "done");
    rk_nodes_free(t);
    printf("rk _coordinator: done\n");
    return RK_EXIT_OK;
}
