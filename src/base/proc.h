/*
 * Inside librekindle: running a helper program (scontrol, journalctl) with an argv, never a
 * shell, its output read bounded and within a time limit. Moved down from the supervisor's
 * Slurm code so that the health layer can run journalctl too. Not part of the public API.
 */
#ifndef RK_BASE_PROC_H
#define RK_BASE_PROC_H

#include <stddef.h>
#include <sys/types.h>

#define RK_PROC_TOO_LONG 1000 /* rk_proc_run: it printed more than cap-1 bytes */

/* Flags of rk_proc_run. */
#define RK_PROC_STDERR_NULL 0x1 /* its stderr to /dev/null (default: into out with stdout) */

/* Run argv[0] (PATH lookup without a '/') in a process group of its own, its stdout (and its
 * stderr unless RK_PROC_STDERR_NULL) into out (NUL-ended, at most cap-1 bytes kept: the rest
 * is read and dropped, and the call returns RK_PROC_TOO_LONG). Returns its exit status (128+N
 * for a signal), 126/127 when it could not be run, 125 when no status could be had, -1 when
 * it did not end within wait_s (its group killed: our own child and what it started). */
int rk_proc_run(char *const argv[], char *out, size_t cap, double wait_s, int flags);

/* In a child about to exec a program (a rank, a launcher, a helper): every descriptor from
 * `lowfd` up becomes close-on-exec, so the program gets only those below (stdin, stdout and
 * stderr for lowfd 3), whatever this process holds: one that was opened without O_CLOEXEC
 * by mistake, a library's, or one this process inherited itself. A descriptor meant for the
 * program is placed below lowfd (dup2) or marked inheritable again after this call.
 * close_range(CLOSE_RANGE_CLOEXEC) (Linux 5.11), else rk_proc_cloexec_each. Async-signal-
 * safe: no allocation, no lock. */
void rk_proc_cloexec_from(int lowfd);
/* The fallback of rk_proc_cloexec_from, for kernels before 5.11 (and for tests): FD_CLOEXEC
 * set on each descriptor from lowfd up to the soft RLIMIT_NOFILE, one fcntl each. */
void rk_proc_cloexec_each(int lowfd);

/* The kernel's word on process `pid` (in this process's PID namespace) from /proc/PID/stat:
 * its state letter ('Z' a zombie), its parent and its start time (clock ticks after boot,
 * field 22), each into what is not NULL. 0, or -1 when it is gone or the line does not parse
 * (the command's name may hold spaces and parentheses: read after the last ')'). */
int rk_proc_stat(pid_t pid, char *state, pid_t *ppid, unsigned long long *start);

#endif
