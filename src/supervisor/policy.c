/*
 * The supervisor's failure classification (policy.h): from what one launch's ranks said and
 * the launcher's exit status to what rk run does next. Pure: no I/O, no clock, no globals.
 */
#include "supervisor/policy.h"

#include <string.h>

#include "rekindle/heartbeat.h"

void rk_sup_seen_init(rk_sup_seen *s, int ranks)
{
    memset(s, 0, sizeof *s);
    s->ranks = ranks;
    s->hang_rank = s->lost_rank = s->exit_rank = s->storage_rank = -1;
}

static void set(rk_sup_verdict *v, rk_sup_next next, const char *kind, int rank, int counted,
                int status, const char *why)
{
    v->next = next;
    v->kind = kind;
    v->rank = rank;
    v->counted = counted && rank >= 0;
    v->status = status;
    v->why = why;
}

void rk_sup_classify(const rk_sup_seen *s, rk_sup_verdict *v)
{
    int st = s->exited ? s->status : -1;
    int culprit = s->exit_kind[0] ? s->exit_rank : s->lost_rank;
    if (s->interrupted) {
        set(v, RK_SUP_INTERRUPTED, NULL, -1, 0, 130, "rk run was interrupted");
        return;
    }
    if (st == 0 && s->ranks > 0 && s->hellos == s->ranks && s->done == s->ranks) {
        set(v, RK_SUP_FINISHED, NULL, -1, 0, 0, "every rank said bye done and exited 0");
        return;
    }
    /* a full, read-only or failing disk is nobody's device: stop, count nothing */
    if (s->storage_rank >= 0 || st == RK_EXIT_STORAGE) {
        set(v, RK_SUP_STOP, "storage", s->storage_rank >= 0 ? s->storage_rank : culprit, 0, 1,
            "the worker cannot write its checkpoint directory (a storage error: exit status 6 "
            "or a storage event); relaunching on other devices cannot help");
        return;
    }
    /* srun reports the highest status of its tasks (137 for the ones it killed), so a rank's
     * "usage" exit event counts as its exit status 2 */
    if (st == RK_EXIT_USAGE || strcmp(s->exit_kind, "usage") == 0) {
        set(v, RK_SUP_STOP, "usage", culprit, 0, 2,
            "the worker rejected its arguments or input (exit status 2); relaunching cannot "
            "help");
        return;
    }
    if (s->stop_sent && !s->exit_kind[0] && (st == RK_EXIT_STOPPED || st == RK_EXIT_OK)) {
        set(v, RK_SUP_RELAUNCH, NULL, -1, 0, 0, "the ranks stopped on command");
        return;
    }
    if (s->hang) {
        set(v, RK_SUP_RELAUNCH, "hang", s->hang_rank, 1, 0,
            "no progress for the heartbeat timeout");
        return;
    }
    /* a rank that never said hello: the worker did not start, or does not speak the
     * protocol; which rank failed is unknown (a rank that did connect may be only a victim),
     * and nothing says its device is to blame */
    if (!s->exit_kind[0] && s->hellos < s->ranks && (s->startup_timeout || s->exited)) {
        set(v, RK_SUP_RELAUNCH, "never_connected", -1, 0, 0, "never connected to RK_HEARTBEAT");
        return;
    }
    if (st == RK_EXIT_COMM) {
        set(v, RK_SUP_RELAUNCH, "commfail", culprit, 1, 0,
            "exit status 3: a communication failure");
        return;
    }
    if (st == RK_EXIT_GUARD) {
        set(v, RK_SUP_RELAUNCH, "guard_failed", culprit, 1, 0,
            "exit status 5: a guard could not recover in-process");
        return;
    }
    if (s->exit_kind[0]) {
        set(v, RK_SUP_RELAUNCH, s->exit_kind, culprit, 1, 0, "the rank said it exits with it");
        return;
    }
    set(v, RK_SUP_RELAUNCH, "crash", culprit, 1, 0,
        s->lost_rank >= 0 ? "its connection closed without bye"
                          : "the launcher exited without every rank saying bye done");
}
