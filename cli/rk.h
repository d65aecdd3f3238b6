/* Shared by the rk subcommands: the exit statuses and the error-to-status mapping. */
#ifndef RK_CLI_H
#define RK_CLI_H

#include "rekindle/error.h"

enum { RK_EXIT_OK = 0, RK_EXIT_FAIL = 1, RK_EXIT_USAGE = 2 };

/* Exit status for a library error: 2 for bad input or usage, 1 for everything else. */
int rk_cli_status(int code);

int rk_cmd_train(int argc, char **argv);
int rk_cmd_ckpt(int argc, char **argv);

#endif
