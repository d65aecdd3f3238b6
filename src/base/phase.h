/*
 * Inside librekindle: the launch trace (docs/run.md, "Where a relaunch's time goes"). With
 * RK_TRACE_LAUNCH=FILE (an absolute path) rk run, its keeper, rk _rank-env, the worker runtime
 * and rk train append one line to FILE at each phase boundary of a launch:
 *
 *     PHASE T PID LAUNCH RANK
 *
 * PHASE a word (sup.fail, keeper.start, worker.hello, ...: docs/run.md lists them), T the
 * CLOCK_MONOTONIC time in seconds with 9 decimals (one clock for every process of the host,
 * PID namespaces included), PID getpid() (inside the job's PID namespace: that namespace's),
 * LAUNCH and RANK -1 when unknown. Each line is one write(2) to a descriptor opened with
 * O_APPEND, so lines of concurrent processes never interleave.
 *
 * Off (no file named, or a set-user-ID process: rk_env_override) it costs one getenv at the
 * first call and a branch after. Best effort: a file that cannot be opened or written leaves
 * the trace out and changes nothing else. Async-signal-safe after the first call (no
 * allocation, no stdio, no lock): the keeper's children call it between fork and exec.
 * Not part of the public API.
 */
#ifndef RK_BASE_PHASE_H
#define RK_BASE_PHASE_H

#define RK_PHASE_ENV "RK_TRACE_LAUNCH"

/* One line for `phase` with this launch and rank (-1: unknown). */
void rk_phase_mark(const char *phase, int launch, int rank);
/* The same, the launch and rank read from the process's RK_LAUNCH and RANK (a rank's
 * environment, docs/run.md), -1 where unset. */
void rk_phase_mark_env(const char *phase);

#endif
