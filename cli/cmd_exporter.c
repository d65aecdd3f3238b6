/*
 * rk exporter: serve this node's GPU health to Prometheus (docs/exporter.md; the metrics are
 * docs/metrics.md). Parses flags, loads the failure predictor when asked (predict/predict.h),
 * starts the exporter (src/exporter/), prints where it listens, then waits for SIGINT or
 * SIGTERM and stops it cleanly. What the collector notices (a GPU below the threshold, lost,
 * collection failing) is printed to stderr as it happens.
 */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "exporter/exporter.h"
#include "predict/predict.h"
#include "predict/predict_online.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk exporter [--listen ADDR:PORT] [--interval DURATION] [--sim N [--seed S]\n"
    "                   [--age HOURS] [--time-scale X] [--sim-load idle|busy]\n"
    "                   [--sim-sensors]]\n"
    "                   [--textfile-dir DIR] [--threshold T] [--predictor MODEL]\n"
    "\n"
    "Serve this node's GPU health to Prometheus: /metrics (docs/metrics.md), /healthz, /.\n"
    "\n"
    "  --listen ADDR:PORT  where to listen (default " RK_EXPORTER_DEFAULT_LISTEN ": this machine\n"
    "                      only, because the exporter has no authentication and describes the\n"
    "                      node's hardware; 0.0.0.0:9258 exposes it on every interface, "
    "[::1]:PORT\n"
    "                      for IPv6; port 0 picks a free one)\n"
    "  --interval D        read every GPU this often: 5s (default), 500ms, 1m, or bare seconds\n"
    "  --sim N             a simulated fleet of N GPUs instead of NVML (marked as simulated)\n"
    "  --seed S            the simulated fleet's seed (default 1)\n"
    "  --age HOURS         hours of service the simulated GPUs start with (default 0)\n"
    "  --time-scale X      simulated seconds per real second (default 1)\n"
    "  --sim-load LOAD     what the simulated GPUs run: idle (the default: a node nobody\n"
    "                      uses) or busy (a job: 85% of 10-minute slots at 90-100%)\n"
    "  --sim-sensors       the simulated GPUs also report VRM ripple and fan vibration, as\n"
    "                      if a sensor kit were fitted (default: only what NVML reports)\n"
    "  --textfile-dir DIR  also read sensors NVML cannot (VRM ripple, fan vibration) from\n"
    "                      node_exporter textfiles in DIR\n"
    "  --threshold T       report on stderr when a GPU scores below T (default 60)\n"
    "  --predictor MODEL   serve rk_gpu_failure_probability from this failure predictor (a\n"
    "                      classification model of rk predict; docs/predict.md) and let the\n"
    "                      score take it into account; a GPU's probability (of failing within\n"
    "                      the horizon the model records) appears once it has a full window\n"
    "                      of minutes (the model's window, 60 by default)\n"
    "  -h, --help          show this help\n"
    "\n"
    "Runs until SIGINT or SIGTERM. Exit status: 0 stopped by a signal, 1 it could not start (no\n"
    "NVML and no --sim, the address in use), 2 bad usage or a model file it cannot use.\n";

#define usage_error(...) rk_cli_usage_error("exporter", usage_text, __VA_ARGS__)

static rk_args args = {.cmd = "exporter", .usage = usage_text};

static void print_event(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "rk exporter: %s\n", line);
    fflush(stderr);
}

/* Load the failure predictor and check that live readings can feed it. Exit status 2 naming
 * the file when it cannot be used. */
static int load_predictor(const char *path, rk_pred_model **out)
{
    rk_err err = {0};
    *out = NULL;
    int rc = rk_pred_load(out, path, &err);
    if (rc == RK_ENOENT) {
        fprintf(stderr, "rk exporter: --predictor %s: no such file\n", path);
        return RK_EXIT_USAGE;
    }
    if (rc) {
        /* rk_pred_load's messages name the file */
        fprintf(stderr, "rk exporter: --predictor: %s\n", err.msg[0] ? err.msg : rk_strerror(rc));
        return RK_EXIT_USAGE;
    }
    rk_pred_online *probe = NULL;
    if ((rc = rk_pred_online_create(&probe, *out, 1, &err))) {
        fprintf(stderr, "rk exporter: --predictor %s: %s\n", path, err.msg);
        rk_pred_free(*out);
        *out = NULL;
        return RK_EXIT_USAGE;
    }
    rk_pred_online_free(probe);
    /* One BLAS thread unless the user says otherwise: one window at a time is a small product,
     * and the collector should not spin up a thread pool for it. */
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    return RK_EXIT_OK;
}

/* The predictor reads one row a minute: say so when a collection cycle spans more (its rows
 * are then further apart than the model was trained on). */
static void warn_minutes(const rk_exporter_opts *o, int sim)
{
    double per_cycle = o->interval_s * (sim ? o->telemetry.time_scale : 1);
    if (per_cycle > 60)
        fprintf(stderr,
                "rk exporter: warning: a collection cycle spans %g %sseconds, more than the "
                "predictor's minute: its rows will be that far apart (lower --interval%s)\n",
                per_cycle, sim ? "simulated " : "", sim ? " or --time-scale" : "");
}

int rk_cmd_exporter(int argc, char **argv)
{
    static const struct option longs[] = {{"listen", required_argument, 0, 'l'},
                                          {"interval", required_argument, 0, 'i'},
                                          {"sim", required_argument, 0, 'S'},
                                          {"seed", required_argument, 0, 's'},
                                          {"age", required_argument, 0, 'a'},
                                          {"time-scale", required_argument, 0, 'T'},
                                          {"sim-load", required_argument, 0, 'W'},
                                          {"sim-sensors", no_argument, 0, 'E'},
                                          {"textfile-dir", required_argument, 0, 'x'},
                                          {"threshold", required_argument, 0, 't'},
                                          {"predictor", required_argument, 0, 'P'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_exporter_opts o = RK_EXPORTER_OPTS_DEFAULT;
    int sim = 0, seeded = 0;
    const char *model_path = NULL;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'l': o.listen = optarg; break;
        case 'i':
            if (rk_arg_seconds(&args, "--interval", optarg, 0.1, RK_ARG_SECONDS_MAX, &o.interval_s))
                return RK_EXIT_USAGE;
            break;
        case 'S':
            if (rk_arg_count(&args, "--sim", optarg, 1, 1024, &sim))
                return RK_EXIT_USAGE;
            break;
        case 's':
            if (rk_arg_seed(&args, "--seed", optarg, &o.telemetry.seed))
                return RK_EXIT_USAGE;
            seeded = 1;
            break;
        case 'a':
            if (rk_arg_hours(&args, "--age", optarg, &o.telemetry.start_age_h))
                return RK_EXIT_USAGE;
            seeded = 1;
            break;
        case 'T':
            if (rk_arg_real(&args, "--time-scale", optarg, 1e-3, 1e9, &o.telemetry.time_scale))
                return RK_EXIT_USAGE;
            seeded = 1;
            break;
        case 'W':
            if (rk_arg_sim_load(&args, "--sim-load", optarg, &o.telemetry.sim_load))
                return RK_EXIT_USAGE;
            seeded = 1;
            break;
        case 'E':
            o.telemetry.sim_sensors = true;
            seeded = 1;
            break;
        case 'x': o.telemetry.textfile_dir = optarg; break;
        case 't':
            if (rk_arg_score(&args, "--threshold", optarg, &o.threshold))
                return RK_EXIT_USAGE;
            break;
        case 'P': model_path = optarg; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (seeded && !sim)
        return usage_error(
            "--seed, --age, --time-scale, --sim-load and --sim-sensors need --sim N");
    if ((o.telemetry.textfile_dir &&
         rk_arg_path(&args, "--textfile-dir", o.telemetry.textfile_dir, RK_PATH_DIR)) ||
        (model_path && rk_arg_path(&args, "--predictor", model_path, RK_PATH_FILE)))
        return RK_EXIT_USAGE;
    rk_err err = {0};
    struct sockaddr_storage ss;
    unsigned sslen;
    if (rk_exporter_parse_listen(o.listen, &ss, &sslen, &err))
        return usage_error("--listen: %s", err.msg);
    int64_t port; /* the port by the one rule for whole numbers: no "09258" */
    if (!rk_args_int(strrchr(o.listen, ':') + 1, 0, 65535, &port))
        return usage_error("--listen '%s': the port is not a whole number in 0..65535", o.listen);
    if (sim) {
        o.backend = "sim";
        o.telemetry.sim_gpus = sim;
    }
    o.on_event = print_event;

    rk_pred_model *model = NULL;
    int rc;
    if (model_path) {
        rc = load_predictor(model_path, &model);
        if (rc)
            return rc;
        o.predictor = model;
        warn_minutes(&o, sim);
    }

    /* SIGINT and SIGTERM are taken with sigwait below: block them before any thread starts so
     * that every thread inherits the mask and none of them is interrupted. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    rk_exporter *x = NULL;
    rc = rk_exporter_start(&x, &o, &err);
    if (rc) {
        if (rc == RK_ENOTSUP && !sim)
            fprintf(stderr,
                    "rk exporter: %s; no GPU to watch (--sim N serves a simulated "
                    "fleet)\n",
                    err.msg);
        else
            fprintf(stderr, "rk exporter: %s\n", err.msg);
        pthread_sigmask(SIG_UNBLOCK, &stop, NULL);
        rk_pred_free(model);
        return rc == RK_EINVAL ? RK_EXIT_USAGE : RK_EXIT_FAIL;
    }
    int n = rk_exporter_gpus(x);
    printf("rk exporter: serving http://%s/metrics: %d %sGPU%s (%s backend), read every %g s\n",
           rk_exporter_address(x), n, rk_exporter_simulated(x) ? "simulated " : "",
           n == 1 ? "" : "s", rk_exporter_backend(x), o.interval_s);
    if (model)
        printf("rk exporter: failure predictor %s: rk_gpu_failure_probability (within %g min) "
               "once a GPU has %d minutes of readings%s\n",
               model_path, (double)rk_pred_config_of(model)->horizon_min,
               rk_pred_config_of(model)->window, sim ? " (simulated minutes)" : "");
    fflush(stdout);

    int sig = 0;
    while (sigwait(&stop, &sig) != 0)
        ;
    fprintf(stderr, "rk exporter: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rk_exporter_stop(x);
    rk_pred_free(model);
    return RK_EXIT_OK;
}
