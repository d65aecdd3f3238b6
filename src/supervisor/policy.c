/*
 * The supervisor's decisions (policy.h): a launch's end, quarantine, relaunch, the shrink
 * onto the devices left, the drain, hangs, teardowns and interruptions. Pure: no I/O, no
 * clock, no globals. Relies only on rekindle/heartbeat.h's exit statuses.
 */
#include "supervisor/policy.h"

#include <stdio.h>
#include <string.h>

#include "rekindle/heartbeat.h"

/* ---- kinds --------------------------------------------------------------------------------- */

/* Every kind's word (the events file's "kind"). */
static const char *const k_names[] = {
    [RK_SUP_KIND_CRASH] = "crash",
    [RK_SUP_KIND_HANG] = "hang",
    [RK_SUP_KIND_COMMFAIL] = "commfail",
    [RK_SUP_KIND_GUARD_FAILED] = "guard_failed",
    [RK_SUP_KIND_USAGE] = "usage",
    [RK_SUP_KIND_STORAGE] = "storage",
    [RK_SUP_KIND_NEVER_CONNECTED] = "never_connected",
    [RK_SUP_KIND_LOSS_SPIKE] = "loss_spike",
    [RK_SUP_KIND_SPIKE_KEPT] = "spike_kept",
    [RK_SUP_KIND_GRAD_SUSPECT] = "grad_suspect",
    [RK_SUP_KIND_GRAD_KEPT] = "grad_kept",
    [RK_SUP_KIND_EXCEPTION] = "exception",
    [RK_SUP_KIND_CKPT_REFUSED] = "ckpt_refused",
    [RK_SUP_KIND_NODE_LOST] = "node_lost",
};

/* The words of a worker's event that change what rk run does (docs/protocol.md): an exit
 * event's usage or storage stops the job; the data's kinds count against no device. Any
 * other word (commfail, guard_failed, nan, ...) is the worker's own: recorded under it and
 * counted. */
static const struct {
    const char *word;
    rk_sup_kind kind;
    int counted; /* as an in-process event */
} k_worker[] = {
    {"usage", RK_SUP_KIND_USAGE, 1},
    {"storage", RK_SUP_KIND_STORAGE, 1},
    {"loss_spike", RK_SUP_KIND_LOSS_SPIKE, 0},
    {"spike_kept", RK_SUP_KIND_SPIKE_KEPT, 0},
    {"grad_suspect", RK_SUP_KIND_GRAD_SUSPECT, 0},
    {"grad_kept", RK_SUP_KIND_GRAD_KEPT, 0},
    {"exception", RK_SUP_KIND_EXCEPTION, 0},       /* the job's code: never a device's */
    {"ckpt_refused", RK_SUP_KIND_CKPT_REFUSED, 0}, /* the job's own checkpoint rule */
};
#define NWORKER (sizeof k_worker / sizeof k_worker[0])
#define NNAMES (sizeof k_names / sizeof k_names[0])

rk_sup_kind rk_sup_kind_of(const char *word)
{
    for (size_t i = 0; word && i < NWORKER; i++)
        if (strcmp(word, k_worker[i].word) == 0)
            return k_worker[i].kind;
    return RK_SUP_KIND_OTHER;
}

const char *rk_sup_kind_name(rk_sup_kind k)
{
    return (size_t)k < NNAMES ? k_names[k] : NULL;
}

int rk_sup_kind_counted(rk_sup_kind k)
{
    for (size_t i = 0; i < NWORKER; i++)
        if (k_worker[i].kind == k)
            return k_worker[i].counted;
    return k != RK_SUP_KIND_NONE;
}

int rk_sup_action_exits(const char *action)
{
    return action && strcmp(action, "exit") == 0;
}

/* ---- a launch's end ------------------------------------------------------------------------ */

void rk_sup_seen_init(rk_sup_seen *s, int ranks)
{
    memset(s, 0, sizeof *s);
    s->ranks = ranks;
    s->hang_rank = s->lost_rank = s->crash_rank = s->exit_rank = s->storage_rank = -1;
    s->failed_rank = -1;
    s->node_lost = s->node_rank = -1;
    s->exit_kind = RK_SUP_KIND_NONE;
    s->exit_step = -1;
    s->exit_detail = NULL;
    s->dup_rank = -1;
}

static void set(rk_sup_verdict *v, rk_sup_next next, rk_sup_kind kind, int rank, int counted,
                rk_sup_end end, const char *why)
{
    v->next = next;
    v->kind = kind;
    v->rank = rank;
    v->counted = counted && rank >= 0;
    v->end = end;
    v->why = why;
}

void rk_sup_classify(const rk_sup_seen *s, rk_sup_verdict *v)
{
    int st = s->exited ? s->status : -1;
    int has_exit = s->exit_kind != RK_SUP_KIND_NONE;
    /* a rank whose connection closed without bye: when one announced an injected crash, it;
     * else the one whose process the launcher saw end first (the kernel's word: its own
     * connection may close after the others', held open by a child of it); else the first
     * closing read (the launcher kills the others after the first death) */
    int culprit = has_exit              ? s->exit_rank
                  : s->crash_rank >= 0  ? s->crash_rank
                  : s->failed_rank >= 0 ? s->failed_rank
                                        : s->lost_rank;
    const rk_sup_end go_on = RK_SUP_END_FAILED; /* unused for a relaunch */
    if (s->interrupted) {
        set(v, RK_SUP_INTERRUPTED, RK_SUP_KIND_NONE, -1, 0, RK_SUP_END_INTERRUPTED,
            "rk run was interrupted");
        return;
    }
    /* two processes of the launch said hello as one rank: the worker takes its rank from
     * somewhere the launcher does not set it (Open MPI's variables under local), and so would
     * every relaunch; whatever ended the launch after it follows from it */
    if (s->dup_rank >= 0) {
        set(v, RK_SUP_STOP, RK_SUP_KIND_USAGE, s->dup_rank, 0, RK_SUP_END_USAGE,
            "every launch of this worker would do the same");
        return;
    }
    /* every rank said bye done: the work is done (the last checkpoint written), whatever a
     * rank's process did after it; a relaunch would only redo nothing */
    if (s->ranks > 0 && s->hellos == s->ranks && s->done == s->ranks) {
        set(v, RK_SUP_FINISHED, RK_SUP_KIND_NONE, -1, 0, RK_SUP_END_FINISHED,
            st == 0 ? "every rank said bye done and exited 0"
                    : "every rank said bye done (a process then ended with a failure: the "
                      "job's work was done, nothing to relaunch)");
        return;
    }
    /* a full, read-only or failing disk is nobody's device: stop, count nothing */
    if (s->storage_rank >= 0 || st == RK_EXIT_STORAGE) {
        set(v, RK_SUP_STOP, RK_SUP_KIND_STORAGE, s->storage_rank >= 0 ? s->storage_rank : culprit,
            0, RK_SUP_END_STORAGE,
            "the worker cannot write its checkpoint directory (a storage error: exit status 6 "
            "or a storage event); relaunching on other devices cannot help");
        return;
    }
    /* srun reports the highest status of its tasks (137 for the ones it killed), so a rank's
     * "usage" exit event counts as its exit status 2 */
    if (st == RK_EXIT_USAGE || s->exit_kind == RK_SUP_KIND_USAGE) {
        set(v, RK_SUP_STOP, RK_SUP_KIND_USAGE, culprit, 0, RK_SUP_END_USAGE,
            "the worker rejected its arguments or input (exit status 2); relaunching cannot "
            "help");
        return;
    }
    /* every rank ran to its end, fine, and none said hello: a program that does not speak
     * the protocol, which a relaunch would only run again */
    if (st == RK_EXIT_OK && !has_exit && !s->stop_sent && s->ranks > 0 && s->hellos == 0) {
        set(v, RK_SUP_STOP, RK_SUP_KIND_NEVER_CONNECTED, -1, 0, RK_SUP_END_USAGE,
            "every rank exited 0 without a hello: the worker does not speak rk run's heartbeat "
            "protocol (make it a rekindle.Worker: docs/python.md, docs/pytorch.md; or see "
            "docs/protocol.md)");
        return;
    }
    if (s->stop_sent && !has_exit && (st == RK_EXIT_STOPPED || st == RK_EXIT_OK)) {
        set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_NONE, -1, 0, go_on, "the ranks stopped on command");
        return;
    }
    if (s->node_lost >= 0) {
        set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_NODE_LOST, s->node_rank, 0, go_on,
            "a node of the job was lost");
        return;
    }
    if (s->hang) {
        set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_HANG, s->hang_rank, 1, go_on,
            "no progress for the heartbeat timeout");
        return;
    }
    /* a rank that never said hello: the worker did not start, or does not speak the
     * protocol; which rank failed is unknown (a rank that did connect may be only a victim),
     * and nothing says its device is to blame */
    if (!has_exit && s->hellos < s->ranks && (s->startup_timeout || s->exited)) {
        set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_NEVER_CONNECTED, -1, 0, go_on,
            "never connected to RK_HEARTBEAT");
        return;
    }
    /* the job's own checkpoint rule refused its state: the job's, whichever device it ran on
     * (it exits 5, which alone would read as a guard that failed) */
    if (s->exit_kind == RK_SUP_KIND_CKPT_REFUSED) {
        set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_CKPT_REFUSED, culprit, 0, go_on,
            "the job's own rule refused its checkpoint (a value that is not finite): not a "
            "device's fault");
        return;
    }
    if (st == RK_EXIT_COMM) {
        set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_COMMFAIL, culprit, 1, go_on,
            "exit status 3: a communication failure");
        return;
    }
    if (st == RK_EXIT_GUARD) {
        set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_GUARD_FAILED, culprit, 1, go_on,
            "exit status 5: a guard could not recover in-process");
        return;
    }
    /* a bug in the job's code (it may be transient: relaunched; rk_sup_repeat stops a
     * repeat): whichever device it ran on is not to blame */
    if (s->exit_kind == RK_SUP_KIND_EXCEPTION) {
        set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_EXCEPTION, culprit, 0, go_on,
            "the worker raised an exception that is not a device or communication error");
        return;
    }
    if (has_exit) {
        set(v, RK_SUP_RELAUNCH, s->exit_kind, culprit, 1, go_on, "the rank said it exits with it");
        return;
    }
    set(v, RK_SUP_RELAUNCH, RK_SUP_KIND_CRASH, culprit, 1, go_on,
        s->lost_rank >= 0 ? "its connection closed without bye"
                          : "the launcher exited without every rank saying bye done");
}

void rk_sup_mark_of(const rk_sup_seen *s, const rk_sup_verdict *v, rk_sup_mark *m)
{
    memset(m, 0, sizeof *m);
    m->kind = RK_SUP_KIND_NONE;
    m->step = -1;
    m->status = -1;
    if (v->next != RK_SUP_RELAUNCH)
        return;
    if (v->kind == RK_SUP_KIND_EXCEPTION || v->kind == RK_SUP_KIND_CKPT_REFUSED) {
        m->kind = v->kind;
        m->step = s->exit_step;
        snprintf(m->detail, sizeof m->detail, "%s", s->exit_detail ? s->exit_detail : "");
    } else if (v->kind == RK_SUP_KIND_NEVER_CONNECTED && s->hellos == 0 && s->exited &&
               s->status != 0 && !s->startup_timeout) {
        m->kind = RK_SUP_KIND_NEVER_CONNECTED;
        m->status = s->status;
    }
}

int rk_sup_repeat(const rk_sup_mark *prev, const rk_sup_mark *cur, rk_sup_verdict *v, char *why,
                  size_t cap)
{
    if (!prev || prev->kind == RK_SUP_KIND_NONE || prev->kind != cur->kind)
        return 0;
    if (cur->kind == RK_SUP_KIND_EXCEPTION && prev->step == cur->step &&
        strcmp(prev->detail, cur->detail) == 0)
        snprintf(why, cap,
                 "the same exception at step %lld in two launches in a row: an error in the job, "
                 "not a device; see the traceback above",
                 (long long)cur->step);
    else if (cur->kind == RK_SUP_KIND_CKPT_REFUSED && prev->step == cur->step &&
             strcmp(prev->detail, cur->detail) == 0)
        snprintf(why, cap,
                 "the job's own rule refused its checkpoint at step %lld in two launches in a "
                 "row: its state is not finite there however it runs (the detail names the "
                 "item), not a device's fault",
                 (long long)cur->step);
    else if (cur->kind == RK_SUP_KIND_NEVER_CONNECTED && prev->status == cur->status)
        snprintf(why, cap,
                 "the worker exits with status %d before it connects, twice in a row: it cannot "
                 "start (its output is above)",
                 cur->status);
    else
        return 0;
    v->next = RK_SUP_STOP;
    v->end = RK_SUP_END_FAILED;
    v->why = why;
    return 1;
}

/* ---- devices ------------------------------------------------------------------------------- */

int rk_sup_count_failure(rk_sup_dev *d, int threshold)
{
    d->fails++;
    if (d->fails < threshold || d->quarantined)
        return 0;
    d->quarantined = 1;
    return 1;
}

int rk_sup_would_quarantine(const rk_sup_dev *d, int threshold)
{
    return !d->quarantined && d->fails + 1 >= threshold;
}

int rk_sup_shrink_now(int failing, int stop_sent)
{
    return !failing && !stop_sent;
}

/* Device d's reason to be in or out of the next launch (its pick, its held flag set). */
static rk_sup_why judge(const rk_sup_rules *r, const rk_sup_health *h, rk_sup_dev *st, int d,
                        rk_sup_pick *p)
{
    p->need = r->threshold + (st[d].held ? r->margin : 0);
    if (st[d].quarantined)
        p->why = RK_SUP_OUT_QUARANTINED;
    else if (st[d].drained)
        p->why = RK_SUP_OUT_DRAINED;
    else if (h[d].lost) /* gone, whatever the threshold */
        p->why = RK_SUP_OUT_LOST;
    else if (h[d].score < p->need)
        p->why = RK_SUP_OUT_SCORE;
    else if (r->predictor && h[d].prob >= r->drain_probability)
        p->why = RK_SUP_OUT_PREDICTED;
    else
        p->why = RK_SUP_IN;
    if (p->why == RK_SUP_OUT_LOST || p->why == RK_SUP_OUT_SCORE || p->why == RK_SUP_OUT_PREDICTED)
        st[d].held = 1;
    else if (p->why == RK_SUP_IN)
        st[d].held = 0;
    return p->why;
}

/* 1 if every group's ranks are consecutive in dev[n] (a node's ranks, as the launchers
 * across hosts place them). */
static int groups_consecutive(const int *group, const int *dev, int n)
{
    for (int i = 1; i < n; i++)
        if (group[dev[i]] != group[dev[i - 1]])
            for (int j = 0; j < i - 1; j++)
                if (group[dev[j]] == group[dev[i]])
                    return 0;
    return 1;
}

int rk_sup_pick_devices(const rk_sup_rules *r, int ndev, const rk_sup_health *h, rk_sup_dev *st,
                        int want, const int *prev, int nprev, const int *group, int *dev,
                        rk_sup_pick *pick)
{
    unsigned char seen[RK_SUP_MAX_DEVICES] = {0}, used[RK_SUP_MAX_DEVICES] = {0};
    if (ndev > RK_SUP_MAX_DEVICES)
        ndev = RK_SUP_MAX_DEVICES;
    for (int d = 0; d < ndev; d++)
        pick[d] = (rk_sup_pick){.why = RK_SUP_NOT_NEEDED};
    for (int i = 0; i < want; i++)
        dev[i] = -1;
    /* a rank stays on its device while that device may stay in */
    int k = 0;
    for (int i = 0; i < want && i < nprev; i++) {
        int d = prev[i];
        if (d < 0 || d >= ndev || seen[d])
            continue;
        seen[d] = 1;
        if (judge(r, h, st, d, &pick[d]) == RK_SUP_IN) {
            dev[i] = d;
            used[d] = 1;
            k++;
        }
    }
    /* the other ranks take the first devices in order that may go in */
    int next = 0;
    for (int d = 0; d < ndev && k < want; d++) {
        if (used[d] || (seen[d] && pick[d].why != RK_SUP_IN))
            continue;
        if (!seen[d]) {
            seen[d] = 1;
            if (judge(r, h, st, d, &pick[d]) != RK_SUP_IN)
                continue;
        }
        while (next < want && dev[next] >= 0)
            next++;
        dev[next] = d;
        used[d] = 1;
        k++;
    }
    /* fewer than wanted (the job shrinks: ranks are numbered afresh), or a node's ranks
     * would not be consecutive: the devices picked, in device order */
    if (k < want || (group && !groups_consecutive(group, dev, k))) {
        int n = 0;
        for (int d = 0; d < ndev; d++)
            if (used[d])
                dev[n++] = d;
    }
    return k;
}

rk_sup_next rk_sup_relaunch(int restarts, int max_restarts, int picked, int min_ranks,
                            rk_sup_end *end)
{
    if (restarts >= max_restarts) {
        *end = RK_SUP_END_OUT_OF_RESTARTS;
        return RK_SUP_STOP;
    }
    if (picked >= 0 && (picked < min_ranks || picked < 1)) {
        *end = RK_SUP_END_TOO_FEW_DEVICES;
        return RK_SUP_STOP;
    }
    return RK_SUP_RELAUNCH;
}

/* ---- during a launch ----------------------------------------------------------------------- */

int rk_sup_gate_due(int gate, int failing, int stop_sent, int hellos, int ranks, double now,
                    double last, double interval_s)
{
    return gate && !failing && !stop_sent && hellos >= ranks && now - last >= interval_s;
}

int rk_sup_drain_rank(const rk_sup_rules *r, int n, const rk_sup_health *h, rk_sup_why *why)
{
    for (int k = 0; k < n && r->predictor; k++)
        if (h[k].prob >= r->drain_probability) {
            *why = RK_SUP_OUT_PREDICTED;
            return k;
        }
    for (int k = 0; k < n; k++)
        if (h[k].score < r->threshold) {
            *why = RK_SUP_OUT_SCORE;
            return k;
        }
    *why = RK_SUP_IN;
    return -1;
}

int rk_sup_stuck_ranks(int n, const int64_t *progress, int *stuck, int *first)
{
    int64_t least = INT64_MAX, most = -1;
    for (int r = 0; r < n; r++)
        if (progress[r] >= 0) {
            least = progress[r] < least ? progress[r] : least;
            most = progress[r] > most ? progress[r] : most;
        }
    int count = 0;
    *first = -1;
    for (int r = 0; r < n; r++) {
        stuck[r] = progress[r] < 0 || (progress[r] == least && least < most);
        if (stuck[r]) {
            if (*first < 0)
                *first = r;
            count++;
        }
    }
    return count;
}

int rk_sup_teardown_due(const rk_sup_seen *seen, double now, double since, double wait_s)
{
    return seen->hang || seen->startup_timeout || seen->dup_rank >= 0 || seen->ckpt_failed ||
           now - since > wait_s;
}

rk_sup_intr rk_sup_interrupt(int signals, int stop_sent, double now, double since, double grace_s)
{
    if (signals <= 0)
        return RK_SUP_INTR_NONE;
    if (!stop_sent && grace_s > 0)
        return RK_SUP_INTR_SEND_STOP;
    if (signals > 1)
        return RK_SUP_INTR_AGAIN;
    if (now - since >= grace_s)
        return RK_SUP_INTR_TEAR_DOWN;
    return RK_SUP_INTR_NONE;
}

/* ---- a launch over many hosts ------------------------------------------------------------- */

rk_sup_blame rk_sup_node_blame(int n, const rk_sup_link *link, double now, double since,
                               double wait_s, int *node)
{
    int asked = 0;
    *node = -1;
    for (int k = 0; k < n; k++) {
        if (link[k] == RK_SUP_LINK_LOST) {
            *node = k;
            return RK_SUP_BLAME_NODE;
        }
        asked += link[k] == RK_SUP_LINK_ASKED;
    }
    if (asked && now - since < wait_s)
        return RK_SUP_BLAME_WAIT;
    return RK_SUP_BLAME_AS_SEEN;
}
