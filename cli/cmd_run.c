/*
 * rk run: the supervisor command. Parses flags, checks them (a bad fault spec is refused with
 * its position), hands the job to src/supervisor (supervisor.h: rk_sup_run) or, over many
 * hosts, to src/cluster (cluster.h: rk_cluster_plan_hosts plans the hosts, --listen and the
 * launcher, rk_cluster_run runs it), prints its report and maps how the job ended to rk run's
 * exit status.
 */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "base/phase.h"
#include "cluster/cluster.h"
#include "predict/detectors.h"
#include "predict/predict.h"
#include "rekindle/ckpt.h"
#include "rekindle/health.h"
#include "rekindle/inject.h"
#include "rk.h"
#include "supervisor/supervisor.h"

/* rk run's exit status for how the job ended (the usage text's list). */
static int exit_status(rk_sup_end end)
{
    switch (end) {
    case RK_SUP_END_FINISHED: return RK_EXIT_OK;
    case RK_SUP_END_USAGE:
    case RK_SUP_END_BAD_INPUT: return RK_EXIT_USAGE;
    case RK_SUP_END_INTERRUPTED: return 130;
    case RK_SUP_END_FAILED:
    case RK_SUP_END_OUT_OF_RESTARTS:
    case RK_SUP_END_TOO_FEW_DEVICES:
    case RK_SUP_END_STORAGE: break;
    }
    return RK_EXIT_FAIL;
}

/* --stack-dir: made if missing (mkdir -p, new parts 0700), then checked as a home for the
 * job's private stack directory (rk_sup_dir_safe). 0, else one line and -1. */
static int make_stack_dir(const char *dir)
{
    char p[4096], why[160];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) {
        fprintf(stderr, "rk run: --stack-dir %s: path too long\n", dir);
        return -1;
    }
    size_t len = strlen(p);
    for (size_t i = 1; i <= len; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "rk run: --stack-dir %s: cannot create %s: %s\n", dir, p,
                    strerror(errno));
            return -1;
        }
        p[i] = c;
    }
    if (rk_sup_dir_safe(dir, why, sizeof why) != 0) {
        fprintf(stderr, "rk run: --stack-dir %s: %s\n", dir, why);
        return -1;
    }
    return 0;
}

/* The closing summary on stderr: why it could not start or go on, then the job's numbers. */
static void print_report(const rk_sup_report *r)
{
    if (r->err.msg[0])
        fprintf(stderr, "rk run: %s\n", r->err.msg);
    if (!r->summary)
        return;
    fprintf(stderr,
            "rk run: %s: %lld steps on %d rank%s in %.1f s; goodput %.3f (%.1f s productive)\n",
            r->outcome, (long long)r->steps, r->final_ranks, r->final_ranks == 1 ? "" : "s",
            r->wall_s, r->goodput, r->productive_s);
    fprintf(stderr, "rk run: %d restart%s, %d device%s quarantined, %d fault%s injected",
            r->restarts, r->restarts == 1 ? "" : "s", r->quarantined,
            r->quarantined == 1 ? "" : "s", r->injected, r->injected == 1 ? "" : "s");
    if (r->recovery_median_s >= 0)
        fprintf(stderr, ", recovery median %.2f s max %.2f s", r->recovery_median_s,
                r->recovery_max_s);
    fprintf(stderr, "\n");
    for (size_t q = 0; q < r->nkinds; q++)
        fprintf(stderr, "%s%s %d%s", q ? ", " : "rk run: incidents: ", r->incidents[q].kind,
                r->incidents[q].count, q + 1 == r->nkinds ? "\n" : "");
    if (r->snap_peak > 0) {
        char held[64] = "";
        if (r->held_peak > 0) /* across hosts */
            snprintf(held, sizeof held, " (partner copies %.1f MiB)",
                     (double)r->held_peak / (1024.0 * 1024.0));
        fprintf(stderr,
                "rk run: snapshots in memory %s, peak %.1f MiB%s; relaunches restored from "
                "memory %d, from disk %d; ranks replaced in place %d\n",
                r->snapshots, (double)r->snap_peak / (1024.0 * 1024.0), held, r->from_memory,
                r->from_disk, r->in_place);
    }
    if (r->summary_err.msg[0])
        fprintf(stderr, "rk run: %s\n", r->summary_err.msg);
}

static const char usage_a[] =
    "usage: rk run -n N [OPTIONS] -- WORKER [ARGS...]\n"
    "       rk run --hosts LIST --listen ADDR:PORT [-n N] [OPTIONS] -- WORKER [ARGS...]\n"
    "\n"
    "Run a training job of N ranks and keep it going through crashes, hangs, communication\n"
    "failures, NaNs and silent data corruption: relaunch from the latest good checkpoint,\n"
    "quarantine devices that keep failing and carry on with the rest (docs/run.md).\n"
    "\n"
    "  -n N                    ranks to start with\n"
    "  --devices LIST          device ids, comma-separated, one per rank and spares\n"
    "                          (default 0..N-1); rank i of a launch uses the i-th healthy one\n"
    "  --ckpt-dir DIR          the job's checkpoint directory (RK_CKPT_DIR for the workers;\n"
    "                          every launch resumes from its latest good checkpoint)\n"
    "  --recovery WHERE        memory (default): with --ckpt-dir and every rank on this host,\n"
    "                          the ranks also keep snapshots in /dev/shm and a relaunch\n"
    "                          restores from them when they are at least as new as the disk's\n"
    "                          (docs/recovery.md); a PyTorch job's disk checkpoints are then\n"
    "                          written by rk run from the snapshots (RK_CKPT_FROM_SNAP=0 in\n"
    "                          rk run's environment: by rank 0); disk: checkpoints on disk only;\n"
    "                          inplace: memory, and a PyTorch job's failed rank is replaced\n"
    "                          while the others keep running (--launcher local, --ckpt-dir),\n"
    "                          by a warm spare that ran the script ahead until it asked for\n"
    "                          its rank (RK_SPARE=0: no spare; RK_SPARE_AHEAD=0: the spare's\n"
    "                          script starts once it has its rank)\n"
    "  --heartbeat-timeout S   a rank silent this many seconds is hung (default 30)\n"
    "  --startup-timeout S     seconds for every rank to say hello (default 120)\n"
    "  --stop-grace S          after SIGINT, SIGTERM or SIGHUP, seconds for the ranks to\n"
    "                          checkpoint and stop before the job is torn down (default 30;\n"
    "                          0: at once)\n"
    "  --failure-threshold K   failures that quarantine a device (default 2)\n"
    "  --max-restarts R        relaunches before giving up (default 10)\n"
    "  --min-ranks M           fewest ranks worth running on (default 1)\n"
    "  --inject SPEC           faults to inject (simulated; docs/inject.md), e.g.\n"
    "                          crash@step=120:rank=2,hang@step=300:rank=1,crash@mtbf=120s\n"
    "                          (default: $RK_INJECT)\n"
    "  --events FILE           append one JSON line per incident\n"
    "  --summary-json FILE     write the run's summary (goodput, restarts, incidents)\n"
    "  --steps FILE            append each launch's devices, rank 0's steps (loss, time) and\n"
    "                          its checkpoints, one JSON line each (for rk report)\n"
    "  --gate-log FILE         append every GPU's score and temperature at each reading of\n"
    "                          the health gate, one JSON line each (for rk report)\n"
    "  --metrics-file FILE     keep FILE (Prometheus text, replaced atomically at most once\n"
    "                          a second) with the job's metrics for node_exporter's textfile\n"
    "                          collector: snapshot memory, relaunches by source, step\n"
    "  --launcher NAME         auto (default), local (rk run forks the ranks: no MPI),\n"
    "                          mpirun, srun. auto: mpirun for a worker that needs\n"
    "                          libmpi.so, libmpich or librekindle.so (rk train), or with\n"
    "                          --launcher-arg; else local (python3, bash, ...)\n"
    "  --launcher-arg ARG      pass ARG to the launcher (repeat as needed)\n"
    "  --stack-dir DIR         hung ranks' stack dumps, in a private directory made in DIR\n"
    "                          (made if missing, this user's or root's; default: the --events\n"
    "                          directory, else one removed at the end)\n"
    "  --no-pythonpath         no rekindle Python package on the ranks' PYTHONPATH\n";
/* in three parts: C99 promises string literals of 4095 bytes only */
static const char usage_b[] =
    "  --hosts LIST            run across hosts (docs/cluster.md): h1:4,h2:4 (HOST:SLOTS;\n"
    "                          a host's devices are 0..SLOTS-1, named HOST:I); one agent a\n"
    "                          host, started through --rsh; -n defaults to the slots\n"
    "  --hostfile FILE         the hosts from an Open MPI hostfile (HOST slots=N a line)\n"
    "  --spare-hosts LIST      hosts used only when others are lost or quarantined\n"
    "  --listen ADDR:PORT      the address the agents connect to (this host's, as the\n"
    "                          others reach it; port 0: any free one); nothing else listens\n"
    "  --rsh CMD               how an agent is started: CMD HOST COMMAND (default\n"
    "                          'ssh -o BatchMode=yes'); the job's secret goes on its stdin\n"
    "  --node-timeout S        a host silent this long is lost (default 10)\n"
    "  --partner-every N|auto  across hosts with snapshots in memory: pin every Nth step's\n"
    "                          and copy it to the next host (auto, the default: about\n"
    "                          every 30 s of steps; 0: no partner copies)\n"
    "  --agent-cmd PATH        rk on the hosts (default: this executable's path)\n"
    "  Under Slurm (docs/slurm.md), --launcher srun with hosts: srun starts the agents, one\n"
    "  task a node, and each launch's ranks in the allocation, leaving out (--exclude) the\n"
    "  nodes lost or quarantined\n"
    "  --hosts slurm:N         the allocation's nodes (SLURM_JOB_NODELIST), N slots each;\n"
    "                          the ones named in --spare-hosts are its spares; --listen\n"
    "                          defaults to this node's NodeAddr in a batch script\n"
    "  --slurm-drain           drain a quarantined node in Slurm (scontrol update\n"
    "                          state=drain), the reason starting \"rk run: \"\n"
    "  --quiet                 no periodic status lines\n";
static const char usage_c[] =
    "  --health MODE           the health gate (docs/health.md): auto (NVML when present,\n"
    "                          default), nvml, sim (a simulated fleet: device ids are its GPU\n"
    "                          indices), off. GPUs scoring below --health-threshold are left\n"
    "                          out before each launch and drained during a run. With\n"
    "                          --hosts: nvml or sim, read by each host's agent (default off;\n"
    "                          sim: one fleet over the hosts' slots in order)\n"
    "  --health-threshold T    default 60\n"
    "  --health-interval S     seconds between readings during a run (default 5)\n"
    "  --sim-seed S            the simulated fleet's seed (default 1)\n"
    "  --sim-step-time D       each step the job does ages the simulated GPUs D (default 1m;\n"
    "                          units s, m, h): the same seed tells the same story on any\n"
    "                          machine, however fast it runs the job\n"
    "  --sim-time-scale X      instead, the GPUs age with the wall clock: X simulated seconds\n"
    "                          per real second\n"
    "  --sim-age HOURS         hours of service the simulated GPUs start with (default 0)\n"
    "  --sim-skip HOURS        start the simulated clock HOURS in, the GPUs aged (default 0)\n"
    "  --sim-load LOAD         what the simulated GPUs run: idle (default, as rk doctor's) or\n"
    "                          busy (a job: 85% of 10-minute slots at 90-100%)\n"
    "  --sim-sensors           the simulated GPUs also report VRM ripple and fan vibration\n"
    "                          (default: only what NVML reports)\n"
    "  --predictor MODEL       a failure model (rk predict train; docs/predict.md): drain a GPU,\n"
    "                          or leave it out of a launch, at --drain-probability of failing\n"
    "                          in its horizon (--health nvml or sim; read each GPU minute)\n"
    "  --drain-probability P   default: the threshold rk predict train chose for the model\n"
    "                          (MODEL.json beside it), or 0.5 without that file\n"
    "  -h, --help              show this help\n"
    "\n"
    "Exit status: 0 the job finished; 1 it could not (out of restarts, too few devices, a\n"
    "storage error on the checkpoint directory: a worker exited 6, or rk run could not write\n"
    "a checkpoint from the snapshots); 2 bad usage, or the worker rejected its arguments\n"
    "(exited 2) or speaks no heartbeat (every rank exited 0 without a hello:\n"
    "docs/protocol.md), or a --predictor that cannot be read as a model;\n"
    "130 interrupted (the ranks were asked to checkpoint and stop; torn down after\n"
    "--stop-grace or a second signal).\n";

static char usage_text[sizeof usage_a + sizeof usage_b + sizeof usage_c];

/* --sim-step-time: the default (a simulated minute a step: one reading a step, the
 * predictor's pace) and the most (1000 hours a step) */
#define SIM_STEP_DEFAULT_S 60.0
#define SIM_STEP_MAX_S 3.6e6
#define usage_error(...) rk_cli_usage_error("run", usage_text, __VA_ARGS__)

/* --drain-probability's default: the threshold rk predict train chose on its validation split,
 * from MODEL.json beside the model; 0.5 when there is no such file. 1 (said) when the file is
 * there but broken. */
static int drain_default(rk_sup_opts *o)
{
    char *side = rk_fleet_detectors_path(o->predictor);
    if (!side) {
        fprintf(stderr, "rk run: out of memory\n");
        return 1;
    }
    rk_fleet_detectors d;
    rk_err err = {0};
    int rc = rk_fleet_detectors_load(&d, side, &err);
    free(side);
    if (rc == RK_ENOENT)
        return 0;
    if (rc) {
        fprintf(stderr, "rk run: --predictor: %s (or give --drain-probability)\n", err.msg);
        return 1;
    }
    o->drain_probability = d.threshold < 0 ? 0 : d.threshold > 1 ? 1 : d.threshold;
    rk_fleet_detectors_free(&d);
    return 0;
}

static rk_args args = {.cmd = "run", .usage = usage_text};

static int num(const char *flag, const char *s, double lo, double hi, double *out)
{
    return rk_arg_real(&args, flag, s, lo, hi, out);
}

static int integer(const char *flag, const char *s, int lo, int hi, int *out)
{
    return rk_arg_count(&args, flag, s, lo, hi, out);
}

/* --devices "a,b,c": ids of 1..63 printable characters other than ',' and space. */
static int parse_devices(char *list, rk_sup_opts *o)
{
    o->ndevices = 0;
    size_t len = strlen(list);
    /* strtok would skip empty items: "0,,1", ",0" and "0," are mistakes, not two devices */
    if (len == 0 || list[0] == ',' || list[len - 1] == ',' || strstr(list, ",,"))
        return usage_error("--devices: '%s' has an empty item (ids are comma-separated)", list);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        size_t n = strlen(t);
        int ok = n >= 1 && n <= 63;
        for (size_t i = 0; i < n && ok; i++)
            ok = t[i] > ' ' && t[i] < 127;
        if (!ok)
            return usage_error("--devices: '%s' is not a device id (1-63 printable characters)", t);
        for (int d = 0; d < o->ndevices; d++)
            if (strcmp(o->devices[d], t) == 0)
                return usage_error("--devices: '%s' appears twice", t);
        if (o->ndevices == RK_SUP_MAX_DEVICES)
            return usage_error("--devices: more than %d devices", RK_SUP_MAX_DEVICES);
        o->devices[o->ndevices++] = t;
    }
    return 0;
}

enum {
    OPT_DEVICES = 256,
    OPT_CKPT_DIR,
    OPT_HB,
    OPT_STARTUP,
    OPT_STOP_GRACE,
    OPT_THRESHOLD,
    OPT_RESTARTS,
    OPT_MIN_RANKS,
    OPT_INJECT,
    OPT_EVENTS,
    OPT_SUMMARY,
    OPT_STEPS,
    OPT_GATE_LOG,
    OPT_METRICS_FILE,
    OPT_LAUNCHER,
    OPT_LAUNCHER_ARG,
    OPT_QUIET,
    OPT_HEALTH,
    OPT_HEALTH_THRESHOLD,
    OPT_HEALTH_INTERVAL,
    OPT_SIM_SEED,
    OPT_SIM_SCALE,
    OPT_SIM_STEP,
    OPT_SIM_AGE,
    OPT_SIM_SKIP,
    OPT_SIM_LOAD,
    OPT_SIM_SENSORS,
    OPT_PREDICTOR,
    OPT_DRAIN_PROB,
    OPT_STACK_DIR,
    OPT_NO_PYTHONPATH,
    OPT_RECOVERY,
    OPT_HOSTS,
    OPT_HOSTFILE,
    OPT_SPARE_HOSTS,
    OPT_RSH,
    OPT_LISTEN,
    OPT_NODE_TIMEOUT,
    OPT_PARTNER_EVERY,
    OPT_AGENT_CMD,
    OPT_SLURM_DRAIN
};

int rk_cmd_run(int argc, char **argv)
{
    snprintf(usage_text, sizeof usage_text, "%s%s%s", usage_a, usage_b, usage_c);
    static const struct option longs[] = {
        {"devices", required_argument, 0, OPT_DEVICES},
        {"ckpt-dir", required_argument, 0, OPT_CKPT_DIR},
        {"heartbeat-timeout", required_argument, 0, OPT_HB},
        {"startup-timeout", required_argument, 0, OPT_STARTUP},
        {"stop-grace", required_argument, 0, OPT_STOP_GRACE},
        {"failure-threshold", required_argument, 0, OPT_THRESHOLD},
        {"max-restarts", required_argument, 0, OPT_RESTARTS},
        {"min-ranks", required_argument, 0, OPT_MIN_RANKS},
        {"inject", required_argument, 0, OPT_INJECT},
        {"events", required_argument, 0, OPT_EVENTS},
        {"summary-json", required_argument, 0, OPT_SUMMARY},
        {"steps", required_argument, 0, OPT_STEPS},
        {"gate-log", required_argument, 0, OPT_GATE_LOG},
        {"metrics-file", required_argument, 0, OPT_METRICS_FILE},
        {"launcher", required_argument, 0, OPT_LAUNCHER},
        {"launcher-arg", required_argument, 0, OPT_LAUNCHER_ARG},
        {"quiet", no_argument, 0, OPT_QUIET},
        {"health", required_argument, 0, OPT_HEALTH},
        {"health-threshold", required_argument, 0, OPT_HEALTH_THRESHOLD},
        {"health-interval", required_argument, 0, OPT_HEALTH_INTERVAL},
        {"sim-seed", required_argument, 0, OPT_SIM_SEED},
        {"sim-time-scale", required_argument, 0, OPT_SIM_SCALE},
        {"sim-step-time", required_argument, 0, OPT_SIM_STEP},
        {"sim-age", required_argument, 0, OPT_SIM_AGE},
        {"sim-skip", required_argument, 0, OPT_SIM_SKIP},
        {"sim-load", required_argument, 0, OPT_SIM_LOAD},
        {"sim-sensors", no_argument, 0, OPT_SIM_SENSORS},
        {"predictor", required_argument, 0, OPT_PREDICTOR},
        {"drain-probability", required_argument, 0, OPT_DRAIN_PROB},
        {"stack-dir", required_argument, 0, OPT_STACK_DIR},
        {"no-pythonpath", no_argument, 0, OPT_NO_PYTHONPATH},
        {"recovery", required_argument, 0, OPT_RECOVERY},
        {"hosts", required_argument, 0, OPT_HOSTS},
        {"hostfile", required_argument, 0, OPT_HOSTFILE},
        {"spare-hosts", required_argument, 0, OPT_SPARE_HOSTS},
        {"rsh", required_argument, 0, OPT_RSH},
        {"listen", required_argument, 0, OPT_LISTEN},
        {"node-timeout", required_argument, 0, OPT_NODE_TIMEOUT},
        {"partner-every", required_argument, 0, OPT_PARTNER_EVERY},
        {"agent-cmd", required_argument, 0, OPT_AGENT_CMD},
        {"slurm-drain", no_argument, 0, OPT_SLURM_DRAIN},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    rk_sup_opts o = {.n = 0,
                     .hb_timeout_s = 30,
                     .startup_timeout_s = 120,
                     .stop_grace_s = 30,
                     .failure_threshold = 2,
                     .max_restarts = 10,
                     .min_ranks = 1,
                     .launcher = RK_LAUNCH_AUTO,
                     .health = "auto",
                     .health_seed = 1,
                     .health_time_scale = 60,
                     .health_threshold = RK_HEALTH_THRESHOLD_DEFAULT,
                     .health_interval_s = 5,
                     .drain_probability = 0.5,
                     .node_timeout_s = 10,
                     .partner_every = RK_SUP_PARTNER_AUTO};
    const char *hosts_list = NULL, *hostfile = NULL, *spare_list = NULL;
    int health_given = 0;
    static char *largs[64];
    int nlargs = 0, drain_given = 0, sim_opts = 0, scale_given = 0, step_given = 0;
    char *devices = NULL;
    opterr = 0;
    optind = 1;
    int c;
    /* "+": stop at the first non-option, so the worker's own flags are never ours */
    while ((c = getopt_long(argc, argv, "+hn:", longs, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (integer("-n", optarg, 1, RK_SUP_MAX_DEVICES, &o.n))
                return RK_EXIT_USAGE;
            break;
        case OPT_DEVICES: devices = optarg; break;
        case OPT_CKPT_DIR: o.ckpt_dir = optarg; break;
        case OPT_HB:
            if (rk_arg_seconds(&args, "--heartbeat-timeout", optarg, 0.1, RK_ARG_SECONDS_MAX,
                               &o.hb_timeout_s))
                return RK_EXIT_USAGE;
            break;
        case OPT_STARTUP:
            if (rk_arg_seconds(&args, "--startup-timeout", optarg, 0.1, RK_ARG_SECONDS_MAX,
                               &o.startup_timeout_s))
                return RK_EXIT_USAGE;
            break;
        case OPT_STOP_GRACE:
            if (rk_arg_seconds(&args, "--stop-grace", optarg, 0, RK_ARG_SECONDS_MAX,
                               &o.stop_grace_s))
                return RK_EXIT_USAGE;
            break;
        case OPT_THRESHOLD:
            if (integer("--failure-threshold", optarg, 1, 1000000, &o.failure_threshold))
                return RK_EXIT_USAGE;
            break;
        case OPT_RESTARTS:
            if (integer("--max-restarts", optarg, 0, 1000000, &o.max_restarts))
                return RK_EXIT_USAGE;
            break;
        case OPT_MIN_RANKS:
            if (integer("--min-ranks", optarg, 1, RK_SUP_MAX_DEVICES, &o.min_ranks))
                return RK_EXIT_USAGE;
            break;
        case OPT_INJECT: o.inject = optarg; break;
        case OPT_EVENTS: o.events_path = optarg; break;
        case OPT_SUMMARY: o.summary_path = optarg; break;
        case OPT_STEPS: o.steps_path = optarg; break;
        case OPT_GATE_LOG: o.gate_path = optarg; break;
        case OPT_METRICS_FILE: o.metrics_path = optarg; break;
        case OPT_LAUNCHER:
            if (strcmp(optarg, "mpirun") == 0)
                o.launcher = RK_LAUNCH_MPIRUN;
            else if (strcmp(optarg, "srun") == 0)
                o.launcher = RK_LAUNCH_SRUN;
            else if (strcmp(optarg, "local") == 0)
                o.launcher = RK_LAUNCH_LOCAL;
            else if (strcmp(optarg, "auto") == 0)
                o.launcher = RK_LAUNCH_AUTO;
            else
                return usage_error("--launcher '%s' is not auto, local, mpirun or srun", optarg);
            break;
        case OPT_STACK_DIR: o.stack_dir = optarg; break;
        case OPT_NO_PYTHONPATH: o.no_pythonpath = 1; break;
        case OPT_RECOVERY:
            if (strcmp(optarg, "memory") == 0)
                o.recovery = RK_SUP_RECOVERY_MEMORY;
            else if (strcmp(optarg, "disk") == 0)
                o.recovery = RK_SUP_RECOVERY_DISK;
            else if (strcmp(optarg, "inplace") == 0)
                o.recovery = RK_SUP_RECOVERY_INPLACE;
            else
                return usage_error("--recovery '%s' is not memory, disk or inplace", optarg);
            break;
        case OPT_LAUNCHER_ARG:
            if (nlargs == 62)
                return usage_error("more than 62 --launcher-arg");
            largs[nlargs++] = optarg;
            break;
        case OPT_QUIET: o.quiet = 1; break;
        case OPT_HOSTS: hosts_list = optarg; break;
        case OPT_HOSTFILE: hostfile = optarg; break;
        case OPT_SPARE_HOSTS: spare_list = optarg; break;
        case OPT_RSH: o.rsh = optarg; break;
        case OPT_LISTEN: o.listen = optarg; break;
        case OPT_AGENT_CMD: o.agent_cmd = optarg; break;
        case OPT_SLURM_DRAIN: o.slurm_drain = 1; break;
        case OPT_PARTNER_EVERY:
            if (strcmp(optarg, "auto") == 0)
                o.partner_every = RK_SUP_PARTNER_AUTO;
            else if (integer("--partner-every", optarg, 0, 1000000, &o.partner_every))
                return RK_EXIT_USAGE;
            break;
        case OPT_NODE_TIMEOUT:
            if (rk_arg_seconds(&args, "--node-timeout", optarg, 0.1, RK_ARG_SECONDS_MAX,
                               &o.node_timeout_s))
                return RK_EXIT_USAGE;
            break;
        case OPT_HEALTH:
            health_given = 1;
            if (strcmp(optarg, "off") == 0)
                o.health = NULL;
            else if (!strcmp(optarg, "auto") || !strcmp(optarg, "nvml") || !strcmp(optarg, "sim"))
                o.health = optarg;
            else
                return usage_error("--health '%s' is not auto, nvml, sim or off", optarg);
            break;
        case OPT_HEALTH_THRESHOLD:
            if (rk_arg_score(&args, "--health-threshold", optarg, &o.health_threshold))
                return RK_EXIT_USAGE;
            break;
        case OPT_HEALTH_INTERVAL:
            if (rk_arg_seconds(&args, "--health-interval", optarg, 0.1, RK_ARG_SECONDS_MAX,
                               &o.health_interval_s))
                return RK_EXIT_USAGE;
            break;
        case OPT_SIM_SEED:
            if (rk_arg_seed(&args, "--sim-seed", optarg, &o.health_seed))
                return RK_EXIT_USAGE;
            break;
        case OPT_SIM_SCALE:
            if (num("--sim-time-scale", optarg, 1e-3, 1e9, &o.health_time_scale))
                return RK_EXIT_USAGE;
            scale_given = 1;
            break;
        case OPT_SIM_STEP:
            if (rk_arg_seconds(&args, "--sim-step-time", optarg, 1e-3, SIM_STEP_MAX_S,
                               &o.sim_step_s))
                return RK_EXIT_USAGE;
            step_given = 1;
            break;
        case OPT_SIM_AGE:
            if (rk_arg_hours(&args, "--sim-age", optarg, &o.health_age_h))
                return RK_EXIT_USAGE;
            break;
        case OPT_SIM_SKIP:
            if (rk_arg_hours(&args, "--sim-skip", optarg, &o.sim_skip_h))
                return RK_EXIT_USAGE;
            break;
        case OPT_SIM_LOAD:
            if (rk_arg_sim_load(&args, "--sim-load", optarg, &o.health_sim_load))
                return RK_EXIT_USAGE;
            sim_opts = 1;
            break;
        case OPT_SIM_SENSORS:
            o.health_sim_sensors = true;
            sim_opts = 1;
            break;
        case OPT_PREDICTOR: o.predictor = optarg; break;
        case OPT_DRAIN_PROB:
            if (rk_arg_probability(&args, "--drain-probability", optarg, &o.drain_probability))
                return RK_EXIT_USAGE;
            drain_given = 1;
            break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc && strcmp(argv[optind], "--") == 0)
        optind++;
    if (optind >= argc)
        return usage_error("no worker command after --");
    o.worker = argv + optind;
    if (hosts_list || hostfile || spare_list) { /* the hosts, their slots, --listen, launcher */
        static rk_cluster_plan plan;
        rk_cluster_ask ask = {.list = hosts_list,
                              .slurm_slots = 1,
                              .file = hostfile,
                              .spares = spare_list,
                              .devices_given = devices != NULL,
                              .health_given = health_given,
                              .nlargs = nlargs};
        if (hosts_list && !strncmp(hosts_list, "slurm:", 6) &&
            rk_arg_count(&args, "--hosts slurm:N", hosts_list + 6, 1, RK_HOST_SLOTS_MAX,
                         &ask.slurm_slots))
            return RK_EXIT_USAGE;
        int show = 0;
        rk_err err = {0};
        if (rk_cluster_plan_hosts(&o, &ask, &plan, &show, &err)) {
            if (show)
                return usage_error("%s", err.msg);
            fprintf(stderr, "rk run: %s\n", err.msg);
            return rk_cli_status(err.code);
        }
        devices = plan.devices;
    }
    if (o.slurm_drain && !(o.hosts && o.launcher == RK_LAUNCH_SRUN))
        return usage_error("--slurm-drain goes with --launcher srun and --hosts (a job over "
                           "the nodes of a Slurm allocation)");
    if (o.n < 1)
        return usage_error("-n N is required");
    /* the launch trace (docs/run.md): every process of the job appends to the file, from
     * whatever directory it runs in */
    const char *trace = getenv(RK_PHASE_ENV);
    if (trace && *trace) {
        char dir[PATH_MAX];
        struct stat st;
        snprintf(dir, sizeof dir, "%s", trace);
        if (trace[0] != '/')
            return usage_error("%s=%s: not an absolute path (the ranks may run elsewhere)",
                               RK_PHASE_ENV, trace);
        if (stat(dirname(dir), &st) != 0 || !S_ISDIR(st.st_mode))
            return usage_error("%s=%s: its directory %s is not a directory", RK_PHASE_ENV, trace,
                               dir);
    }
    /* the metrics file is replaced by a rename beside it: its directory must exist */
    if (o.metrics_path) {
        char dir[PATH_MAX];
        struct stat st;
        if (!*o.metrics_path || strlen(o.metrics_path) >= sizeof dir)
            return usage_error("--metrics-file '%s': not a file name", o.metrics_path);
        snprintf(dir, sizeof dir, "%s", o.metrics_path);
        int found = stat(dirname(dir), &st) == 0;
        if (!found || !S_ISDIR(st.st_mode))
            return usage_error("--metrics-file %s: its directory %s %s", o.metrics_path, dir,
                               found ? "is not a directory" : "does not exist");
        if (stat(o.metrics_path, &st) == 0 && !S_ISREG(st.st_mode))
            return usage_error("--metrics-file %s: is not a regular file", o.metrics_path);
    }
    o.worker = argv + optind;
    o.launcher_args = nlargs ? largs : NULL;
    static char launcher_why[4400];
    if (o.launcher == RK_LAUNCH_AUTO) {
        o.launcher = rk_launch_pick(o.worker, nlargs > 0, launcher_why, sizeof launcher_why);
        o.launcher_why = launcher_why;
    }
    const char *jn = getenv("SLURM_JOB_NUM_NODES");
    if (o.launcher == RK_LAUNCH_SRUN && !o.hosts && jn && strcmp(jn, "1") != 0 && jn[0] != '0')
        fprintf(stderr,
                "rk run: this allocation has %.8s nodes, and without --hosts the ranks "
                "report to this node's Unix socket: ranks on the others cannot reach it. "
                "For a job across the nodes: --hosts slurm:N (docs/slurm.md)\n",
                jn);
    if (o.launcher == RK_LAUNCH_LOCAL && nlargs)
        return usage_error("--launcher-arg: --launcher local has no launcher to pass it to");
    static char default_devices[RK_SUP_MAX_DEVICES * 4];
    if (!devices) {
        size_t used = 0;
        for (int r = 0; r < o.n; r++)
            used += (size_t)snprintf(default_devices + used, sizeof default_devices - used,
                                     r ? ",%d" : "%d", r);
        devices = default_devices;
    }
    if (parse_devices(devices, &o))
        return RK_EXIT_USAGE;
    if (o.ndevices < o.n)
        return usage_error("--devices lists %d device%s for -n %d", o.ndevices,
                           o.ndevices == 1 ? "" : "s", o.n);
    if (o.min_ranks > o.n)
        return usage_error("--min-ranks %d is more than -n %d", o.min_ranks, o.n);
    if (o.predictor && (!o.health || strcmp(o.health, "auto") == 0))
        return usage_error("--predictor needs the health gate (--health nvml or sim)");
    if (o.sim_skip_h > 0 && !(o.health && strcmp(o.health, "sim") == 0))
        return usage_error("--sim-skip needs --health sim");
    if (sim_opts && !(o.health && strcmp(o.health, "sim") == 0))
        return usage_error("--sim-load and --sim-sensors need --health sim");
    if ((scale_given || step_given) && !(o.health && strcmp(o.health, "sim") == 0))
        return usage_error("--sim-%s needs --health sim", step_given ? "step-time" : "time-scale");
    if (scale_given && step_given)
        return usage_error("--sim-step-time and --sim-time-scale are two clocks: give one");
    if (o.health && strcmp(o.health, "sim") == 0 && !scale_given && !step_given)
        o.sim_step_s = SIM_STEP_DEFAULT_S; /* the default clock: the job's steps */
    if (o.predictor && rk_arg_path(&args, "--predictor", o.predictor, RK_PATH_FILE))
        return RK_EXIT_USAGE;
    if (o.predictor && access(o.predictor, R_OK) != 0)
        return usage_error("--predictor %s: %s", o.predictor, strerror(errno));
    if (o.predictor && !drain_given && drain_default(&o))
        return RK_EXIT_USAGE;
    static char predictor_abs[PATH_MAX];
    if (o.predictor && o.hosts) {
        /* the agents load it on their hosts: a model that cannot be read is bad input here,
         * and the path must not depend on the remote shell's working directory */
        rk_pred_model *m = NULL;
        rk_err err = {0};
        if (rk_pred_load(&m, o.predictor, &err))
            return usage_error("--predictor %s: %s", o.predictor, err.msg);
        rk_pred_free(m);
        if (!realpath(o.predictor, predictor_abs))
            return usage_error("--predictor %s: %s", o.predictor, strerror(errno));
        o.predictor = predictor_abs;
    }
    if (o.health && strcmp(o.health, "sim") == 0 && !o.hosts) {
        /* the fleet covers every device index (over the hosts: every slot, in order) */
        o.health_sim_gpus = 1;
        for (int d = 0; d < o.ndevices; d++) {
            int64_t v;
            if (!rk_args_int(o.devices[d], 0, 1023, &v))
                return usage_error("--health sim: device '%s' is not a GPU index 0..1023",
                                   o.devices[d]);
            if (v + 1 > o.health_sim_gpus)
                o.health_sim_gpus = (int)v + 1;
        }
    } else {
        o.health_sim_gpus = 1;
    }
    if (!o.inject) {
        /* ignored when privileged, as the workers' own reading of it is (base/env.h) */
        const char *env = rk_env_override("RK_INJECT");
        if (env && *env)
            o.inject = env;
    }
    if (o.inject) {
        rk_inject *spec = NULL;
        rk_err err = {0};
        if (rk_inject_parse(o.inject, &spec, &err)) {
            fprintf(stderr, "rk run: --inject: %s\n", err.msg);
            return RK_EXIT_USAGE;
        }
        rk_inject_free(spec);
    }
    if ((o.ckpt_dir && rk_arg_path(&args, "--ckpt-dir", o.ckpt_dir, RK_PATH_DIR_OR_NEW)) ||
        (o.events_path && rk_arg_path(&args, "--events", o.events_path, RK_PATH_OUTPUT)) ||
        (o.summary_path && rk_arg_path(&args, "--summary-json", o.summary_path, RK_PATH_OUTPUT)) ||
        (o.steps_path && rk_arg_path(&args, "--steps", o.steps_path, RK_PATH_OUTPUT)) ||
        (o.gate_path && rk_arg_path(&args, "--gate-log", o.gate_path, RK_PATH_OUTPUT)) ||
        (o.stack_dir && rk_arg_path(&args, "--stack-dir", o.stack_dir, RK_PATH_DIR_OR_NEW)) ||
        (o.stack_dir && make_stack_dir(o.stack_dir)))
        return RK_EXIT_USAGE;
    /* one writer per checkpoint directory: this job, for as long as it runs (the workers do
     * not inherit the descriptor, and the kernel drops the lock when rk run dies) */
    rk_ckpt_lockfile *lock = NULL;
    if (o.ckpt_dir) {
        rk_err err = {0};
        int rc = rk_ckpt_lock(o.ckpt_dir, &lock, NULL, &err);
        if (rc == RK_ESTORAGE) { /* the disk, not the job: the same words as during a run */
            fprintf(stderr,
                    "rk run: storage error on the checkpoint directory %s: %s; not "
                    "starting\n",
                    o.ckpt_dir, err.msg);
            return RK_EXIT_FAIL;
        }
        if (rc) {
            fprintf(stderr, "rk run: --ckpt-dir %s\n", err.msg);
            return rk_cli_status(rc);
        }
    }
    rk_sup_report rep;
    if (o.hosts)
        rk_cluster_run(&o, &rep);
    else
        rk_sup_run(&o, &rep);
    rk_ckpt_unlock(lock);
    print_report(&rep);
    int status = exit_status(rep.end);
    rk_sup_report_free(&rep);
    return status;
}
