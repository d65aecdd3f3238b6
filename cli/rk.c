/* rk: the rekindle command. Dispatches to one file per subcommand (cmd_*.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"

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
    {"doctor", rk_cmd_doctor, "score this node's GPUs 0-100 and say what to fix"},
    {"tune", rk_cmd_tune,
     "apply stability settings to GPUs through NVML (clocks, power, persistence)"},
    {"exporter", rk_cmd_exporter, "serve GPU health metrics to Prometheus"},
    {"predict", rk_cmd_predict, "failure predictor: C-MAPSS check, simulated fleet datasets"},
};

int rk_cli_status(int code)
{
    switch (code) {
    case RK_OK: return RK_EXIT_OK;
    case RK_EINVAL:
    case RK_EFORMAT:
    case RK_ENOENT:
    case RK_EMISMATCH:
    case RK_EBUSY: return RK_EXIT_USAGE;
    case RK_ECOMM: return RK_EXIT_COMM;
    case RK_ESTOPPED: return RK_EXIT_STOPPED;
    case RK_EGUARD:
    case RK_ENONFINITE: return RK_EXIT_GUARD; /* wrong numbers: back to the last good state */
    default: return RK_EXIT_FAIL;
    }
}

static void usage(FILE *out)
{
    fprintf(out, "usage: rk COMMAND [OPTIONS]\n\n"
                 "rekindle: a training cluster you can trust, built from unreliable GPUs.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'rk COMMAND --help' describes a command's options.\n");
}

int main(int argc, char **argv)
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
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "rk: unknown command '%s'\n", name);
    usage(stderr);
    return RK_EXIT_USAGE;
}
