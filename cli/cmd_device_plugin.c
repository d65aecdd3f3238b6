/*
 * rk device-plugin: the Kubernetes device plugin that offers this node's GPUs to the kubelet
 * with their rekindle health (docs/device-plugin.md). Parses flags, then runs the plugin
 * (src/k8s/) until SIGINT or SIGTERM; what it does is printed to stderr as it happens.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "k8s/dp.h"
#include "rekindle/health.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk device-plugin [--plugin-dir DIR] [--socket NAME] [--resource NAME]\n"
    "                        [--interval DURATION] [--threshold T] [--hysteresis H]\n"
    "                        [--sim N [--seed S] [--age HOURS] [--sim-load idle|busy]\n"
    "                        [--sim-sensors]] [--textfile-dir DIR]\n"
    "\n"
    "Offer this node's GPUs to the kubelet as a Kubernetes device plugin (API v1beta1), each\n"
    "Healthy or Unhealthy by its rekindle health score: Unhealthy GPUs are not scheduled, and\n"
    "Allocate refuses them.\n"
    "\n"
    "  --plugin-dir DIR    the kubelet's device-plugin directory, holding kubelet.sock (default\n"
    "                      " RK_DP_DEFAULT_DIR ")\n"
    "  --socket NAME       the plugin's socket in that directory (default " RK_DP_DEFAULT_SOCKET
    ")\n"
    "  --resource NAME     the extended resource the GPUs are offered as (default\n"
    "                      " RK_DP_DEFAULT_RESOURCE ")\n"
    "  --interval D        read every GPU this often: 10s (default), 500ms, 1m, or bare seconds\n"
    "  --threshold T       a GPU scoring below T is Unhealthy (default 60)\n"
    "  --hysteresis H      an Unhealthy GPU is Healthy again only at T + H or above (default 10;\n"
    "                      T + H at most 100)\n"
    "  --sim N             a simulated fleet of N GPUs instead of NVML (marked as simulated)\n"
    "  --seed S            the simulated fleet's seed (default 1)\n"
    "  --age HOURS         hours of service the simulated GPUs start with (default 0)\n"
    "  --sim-load LOAD     what the simulated GPUs run: idle (the default: a node nobody\n"
    "                      uses) or busy (a job: 85% of 10-minute slots at 90-100%)\n"
    "  --sim-sensors       the simulated GPUs also report VRM ripple and fan vibration, as\n"
    "                      if a sensor kit were fitted (default: only what NVML reports)\n"
    "  --textfile-dir DIR  also read sensors NVML cannot (VRM ripple, fan vibration) from\n"
    "                      node_exporter textfiles in DIR\n"
    "  -h, --help          show this help\n"
    "\n"
    "Registers with the kubelet again whenever it restarts. Runs until SIGINT or SIGTERM, which\n"
    "remove the socket. Exit status: 0 stopped by a signal, 1 it could not start or had to stop\n"
    "(no NVML and no --sim, the socket cannot be served or another process serves it), 2 bad\n"
    "usage.\n";

#define usage_error(...) rk_cli_usage_error("device-plugin", usage_text, __VA_ARGS__)

static rk_args args = {.cmd = "device-plugin", .usage = usage_text};

static void print_event(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "rk device-plugin: %s\n", line);
    fflush(stderr);
}

static volatile sig_atomic_t stop_sig;

static void on_stop_signal(int sig)
{
    stop_sig = sig;
}

/* A handler rather than a blocked signal and sigwait: threads that libraries start before
 * main (OpenBLAS's pool) have the signals unblocked, and any thread may take them. */
static int should_stop(void *ctx)
{
    (void)ctx;
    return stop_sig != 0;
}

int rk_cmd_device_plugin(int argc, char **argv)
{
    static const struct option longs[] = {{"plugin-dir", required_argument, 0, 'd'},
                                          {"socket", required_argument, 0, 'k'},
                                          {"resource", required_argument, 0, 'r'},
                                          {"interval", required_argument, 0, 'i'},
                                          {"threshold", required_argument, 0, 't'},
                                          {"hysteresis", required_argument, 0, 'y'},
                                          {"sim", required_argument, 0, 'S'},
                                          {"seed", required_argument, 0, 's'},
                                          {"age", required_argument, 0, 'a'},
                                          {"sim-load", required_argument, 0, 'W'},
                                          {"sim-sensors", no_argument, 0, 'E'},
                                          {"textfile-dir", required_argument, 0, 'x'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_dp_opts o = {.dir = RK_DP_DEFAULT_DIR,
                    .socket = RK_DP_DEFAULT_SOCKET,
                    .resource = RK_DP_DEFAULT_RESOURCE,
                    .interval_s = 10.0,
                    .threshold = RK_HEALTH_THRESHOLD_DEFAULT,
                    .hysteresis = RK_DP_DEFAULT_HYSTERESIS,
                    .fleet = {.seed = 1}};
    int seeded = 0;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'd': o.dir = optarg; break;
        case 'k': o.socket = optarg; break;
        case 'r': o.resource = optarg; break;
        case 'i':
            if (rk_arg_seconds(&args, "--interval", optarg, 0.1, RK_ARG_SECONDS_MAX, &o.interval_s))
                return RK_EXIT_USAGE;
            break;
        case 't':
            if (rk_arg_score(&args, "--threshold", optarg, &o.threshold))
                return RK_EXIT_USAGE;
            break;
        case 'y':
            if (rk_arg_real(&args, "--hysteresis", optarg, 0, 100, &o.hysteresis))
                return RK_EXIT_USAGE;
            break;
        case 'S':
            if (rk_arg_count(&args, "--sim", optarg, 1, RK_DP_MAX_DEVICES, &o.fleet.sim_gpus))
                return RK_EXIT_USAGE;
            break;
        case 's':
            if (rk_arg_seed(&args, "--seed", optarg, &o.fleet.seed))
                return RK_EXIT_USAGE;
            seeded = 1;
            break;
        case 'a':
            if (rk_arg_hours(&args, "--age", optarg, &o.fleet.age_h))
                return RK_EXIT_USAGE;
            seeded = 1;
            break;
        case 'W':
            if (rk_arg_sim_load(&args, "--sim-load", optarg, &o.fleet.load))
                return RK_EXIT_USAGE;
            seeded = 1;
            break;
        case 'E':
            o.fleet.sensors = true;
            seeded = 1;
            break;
        case 'x': o.fleet.textfile_dir = optarg; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (seeded && !o.fleet.sim_gpus)
        return usage_error("--seed, --age, --sim-load and --sim-sensors need --sim N");
    if (!rk_dp_resource_ok(o.resource))
        return usage_error("--resource '%s' is not DOMAIN/NAME (as %s)", o.resource,
                           RK_DP_DEFAULT_RESOURCE);
    if (o.threshold + o.hysteresis > 100)
        return usage_error("--threshold %g + --hysteresis %g is over 100: an Unhealthy GPU could "
                           "never be Healthy again",
                           o.threshold, o.hysteresis);
    if (rk_arg_path(&args, "--plugin-dir", o.dir, RK_PATH_DIR) ||
        (o.fleet.textfile_dir &&
         rk_arg_path(&args, "--textfile-dir", o.fleet.textfile_dir, RK_PATH_DIR)))
        return RK_EXIT_USAGE;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    o.on_event = print_event;
    o.should_stop = should_stop;

    rk_err err = {0};
    int rc = rk_dp_run(&o, &err);
    if (rc) {
        if (rc == RK_ENOTSUP && !o.fleet.sim_gpus)
            fprintf(stderr,
                    "rk device-plugin: %s; no GPU to offer (--sim N offers a simulated fleet)\n",
                    err.msg);
        else
            fprintf(stderr, "rk device-plugin: %s\n", err.msg);
        return rc == RK_EINVAL ? RK_EXIT_USAGE : RK_EXIT_FAIL;
    }
    fprintf(stderr, "rk device-plugin: %s%s, stopped\n", o.fleet.sim_gpus ? "[simulated] " : "",
            stop_sig == SIGINT ? "SIGINT" : "SIGTERM");
    return RK_EXIT_OK;
}
