/*
 * Slurm from rekindle (docs/slurm.md): running scontrol and reading what it prints. scontrol
 * is run with an argv, never a shell, its stdout and stderr read bounded (RK_SLURM_OUT_MAX)
 * and within a time limit (it is killed past it: our own child). The parsers read text
 * scontrol printed and are fuzzed (fuzz/fuzz_slurm.c). Used by rk doctor --slurm and --gres
 * (cli/doctor_slurm.c) and by rk run inside an allocation (--hosts slurm:N, --slurm-drain).
 */
#ifndef RK_CLUSTER_SLURM_H
#define RK_CLUSTER_SLURM_H

#include <stdbool.h>
#include <stddef.h>

#include "base/proc.h"
#include "rekindle/error.h"

#define RK_SLURM_OUT_MAX (64 * 1024) /* `scontrol show node` prints about 1 KiB a node */
#define RK_SLURM_WAIT_S 30.0         /* above scontrol's own MessageTimeout (10 s default) */
#define RK_SLURM_NODE_MAX 64         /* a node name rekindle passes on: 1..63 bytes */

#define RK_SLURM_TOO_LONG RK_PROC_TOO_LONG /* rk_slurm_run: it printed more than cap-1 bytes */

/* rk_proc_run (base/proc.h) with stdout and stderr together into out: its exit status, 126/127
 * when it could not be run, 125 without a status, -1 past wait_s (its group killed),
 * RK_SLURM_TOO_LONG when it printed more than cap-1 bytes. */
int rk_slurm_run(char *const argv[], char *out, size_t cap, double wait_s);

/* The first line of what scontrol printed, trimmed, into out (for messages): out, or "no
 * message" when it is empty. */
const char *rk_slurm_first_line(const char *text, char *out, size_t cap);

/* 1 if s is a node name rekindle passes to scontrol and srun: 1..63 bytes of
 * [A-Za-z0-9._-], not starting with '-' (nothing scontrol's parser would read as another
 * field or a host list). */
int rk_slurm_node_name_ok(const char *s);

/* From `scontrol show node NAME` (one node, either layout: the default one or -o): whether
 * State= holds DRAIN, whether it is held otherwise (down: DOWN, or a FAIL, MAINT, REBOOT*,
 * POWER* or RESERVED flag), its Reason= text without the
 * " [user@time]" suffix ("" none), NodeAddr= ("" none). 0, or -1 when it names no node
 * (no NodeName= or no State=). Any of reason/addr may be NULL. */
int rk_slurm_parse_node(const char *text, bool *drained, bool *down, char *reason,
                        size_t reason_cap, char *addr, size_t addr_cap);

/* The lines of `scontrol show hostnames LIST` as names: into names[0..max), each
 * checked with rk_slurm_node_name_ok. The count, or -1 with a message in err (RK_EFORMAT). */
int rk_slurm_parse_hostnames(const char *text, char names[][RK_SLURM_NODE_MAX], int max,
                             rk_err *err);

/* The nodes of this allocation (SLURM_JOB_NODELIST, expanded by scontrol) into
 * names[0..max): the count, or -1 with a message (not in an allocation, scontrol fails). */
int rk_slurm_job_nodes(const char *scontrol, char names[][RK_SLURM_NODE_MAX], int max, rk_err *err);

/* A node's NodeAddr= (the address its slurmd is reached at) into addr: 0, or -1 with a
 * message. */
int rk_slurm_node_addr(const char *scontrol, const char *node, char *addr, size_t cap, rk_err *err);

/* Whether NODE is drained, down or held (rk_slurm_parse_node) already: 1 with its state
 * and reason in what ("drained: admin: fan"), 0 when not, -1 with a message when it cannot
 * be read. */
int rk_slurm_node_held(const char *scontrol, const char *node, char *what, size_t cap, rk_err *err);

/* scontrol update nodename=NODE state=drain reason=REASON: 0, or -1 with a message. */
int rk_slurm_drain(const char *scontrol, const char *node, const char *reason, rk_err *err);

#endif
