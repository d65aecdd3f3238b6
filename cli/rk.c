/* rk: the rekindle command. Dispatches to one file per subcommand (cmd_*.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"

#include "rekindle/worker.h"

#ifndef RK_VERSION
#define RK_VERSION "unknown"
#endif

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"train", rk_cmd_train, "train a Fashion-MNIST model (mlp, cnn, cnn-small) on the CPU"},
    {"ckpt", rk_cmd_ckpt, "list, verify and export checkpoints"},
    {"run", rk_cmd_run, "supervise a training job through crashes, hangs and corruption"},
    {"report", rk_cmd_report, "write one HTML page showing a run: loss, incidents, GPUs"},
    {"doctor", rk_cmd_doctor, "score this node's GPUs 0-100 and say what to fix"},
    {"burn", rk_cmd_burn, "burn in GPUs: SGEMM compared across copies, memory tests, a verdict"},
    {"tune", rk_cmd_tune,
     "apply stability settings to GPUs through NVML (clocks, power, persistence)"},
    {"exporter", rk_cmd_exporter, "serve GPU health metrics to Prometheus"},
    {"plan", rk_cmd_plan, "simulate a job on a fleet: goodput, intervals, spares, cost"},
    {"predict", rk_cmd_predict, "failure predictor: C-MAPSS check, simulated fleet datasets"},
    {"device-plugin", rk_cmd_device_plugin,
     "offer this node's GPUs to Kubernetes with their health (a device plugin)"},
    {"agent", rk_cmd_agent, "a node's agent: the link to the job's coordinator on many hosts"},
};

int rk_cli_status(int code)
{
    /* the worker runtime's mapping, but for a storage error: a tool (not a rank under rk run)
     * reports it as a plain failure, exit 1 (docs/cli.md) */
    int st = rk_worker_exit_status(code);
    return st == RK_EXIT_STORAGE ? RK_EXIT_FAIL : st;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: rk COMMAND [OPTIONS]\n\n"
                 "rekindle: a training cluster you can trust, built from unreliable GPUs.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-13s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'rk COMMAND --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
    return rk_dispatch(argc, argv);
}

int rk_dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return RK_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        usage(stdout);
        return RK_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("rk %s\n", RK_VERSION);
        return RK_EXIT_OK;
    }
    if (strcmp(name, "_rank-env") == 0) /* not in the list: rk run's own (docs/run.md) */
        return rk_cmd_rank_env(argc - 1, argv + 1);
    if (strcmp(name, "_coordinator") == 0) /* not in the list: the node table alone, for tests */
        return rk_cmd_coordinator(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "rk: unknown command '%s'\n", name);
    usage(stderr);
    return RK_EXIT_USAGE;
}
