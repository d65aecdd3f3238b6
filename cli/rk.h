/* Shared by the rk subcommands: the exit statuses and the error-to-status mapping. */
#ifndef RK_CLI_H
#define RK_CLI_H

#include "args.h" /* the option-value parser and rk_cli_usage_error */
#include "rekindle/error.h"
#include "rekindle/heartbeat.h" /* RK_EXIT_*: a worker's exit statuses are part of the protocol */

/* Exit status for a library error: 2 for bad input or usage, 3 communication failure, 4
 * stopped on request, 5 a guard could not recover, 1 for everything else. */
int rk_cli_status(int code);

int rk_cmd_train(int argc, char **argv);
int rk_cmd_ckpt(int argc, char **argv);
int rk_cmd_run(int argc, char **argv);
int rk_cmd_report(int argc, char **argv);
/* rk's main: argv[1] names the command. rk _rank-env calls it in place of an exec of this
 * same binary (cmd_rank_env.c). */
int rk_dispatch(int argc, char **argv);
int rk_cmd_rank_env(int argc, char **argv); /* hidden: rk run's wrapper under mpirun, srun */
int rk_cmd_doctor(int argc, char **argv);
int rk_cmd_tune(int argc, char **argv);
int rk_cmd_burn(int argc, char **argv);
int rk_cmd_exporter(int argc, char **argv);
int rk_cmd_predict(int argc, char **argv);
int rk_cmd_plan(int argc, char **argv);
int rk_cmd_agent(int argc, char **argv);
int rk_cmd_device_plugin(int argc, char **argv);
int rk_cmd_coordinator(int argc, char **argv); /* hidden: the node table alone, for tests */

#endif
