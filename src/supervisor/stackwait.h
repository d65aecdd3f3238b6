/*
 * Waiting for a hung rank's stack dump, the one rule of rk run (stacks.c, a rank on this
 * host) and of a node's agent (agent_job.c, a rank on its host): the rank was sent SIGUSR1
 * and appends its stacks to a file; the dump is complete once the file's size changed and
 * then stayed the same for RK_STACKS_STILL_S, and is given up RK_STACKS_WAIT_S after the
 * signal (what is there then, maybe nothing, is the dump). The caller keeps the clock: `now`
 * is its monotonic seconds, the same clock in every call for one wait.
 */
#ifndef RK_SUPERVISOR_STACKWAIT_H
#define RK_SUPERVISOR_STACKWAIT_H

#include <sys/types.h>

#define RK_STACKS_WAIT_S 2.0  /* after the signal, for the dump to appear and be complete */
#define RK_STACKS_STILL_S 0.2 /* unchanged this long: the dump is complete */

typedef struct rk_stack_wait {
    off_t from;     /* the file's size before the signal (0: none): the dump is what follows */
    off_t size;     /* its size when last looked at */
    double asked;   /* when the wait began (the signal) */
    double changed; /* when its size last changed */
    int grew;       /* its size changed since the wait began: something was dumped */
} rk_stack_wait;

/* Begin waiting for the dump into the file at `path`, right before the signal. */
void rk_stack_wait_begin(rk_stack_wait *w, const char *path, double now);

/* Look at the file again: 1 when the dump is complete, 0 while it may still be coming. */
int rk_stack_wait_complete(rk_stack_wait *w, const char *path, double now);

/* 1 when the wait is over: the dump is complete or RK_STACKS_WAIT_S passed since it began. */
int rk_stack_wait_over(rk_stack_wait *w, const char *path, double now);

#endif
