/*
 * Recovery in place (sup.h, docs/recovery.md "In place"): under --recovery inplace and the
 * local launcher, a rank of a PyTorch job (every hello said "rejoin") that dies or exits with a
 * communication failure is started again by the keeper (launch.c, rk_launch_start_inplace)
 * while the other ranks keep their processes: they are told to rejoin a new rendezvous (a
 * new MASTER_PORT and epoch), and every rank restores the agreed step from the node's
 * snapshot. A failure while a replacement is under way (another rank, or the replacement
 * itself) voids that rendezvous: a new epoch, every rank of the recovery started again (the
 * keeper kills a replacement that has not rejoined, and reports its end), the others told to
 * rejoin it. Anything else (a failure of another kind, no rank kept, a rank that said bye) is
 * given up on: the keeper ends the job and the launch ends as it would have.
 */
#include "supervisor/sup.h"

#include "base/phase.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void sup_inplace_reset(sup *s)
{
    s->ip_state = s->o->recovery == RK_SUP_RECOVERY_INPLACE && s->o->launcher == RK_LAUNCH_LOCAL &&
                          s->snap_dir[0] && !s->snap_off && s->b.ops == &rk_sup_launcher_ops
                      ? IP_READY
                      : IP_OFF;
    s->ip_rank = -1;
    s->ip_port = 0;
    s->ip_hung = -1;
    s->ip_hang[0] = '\0';
    s->ip_t = s->ip_te = 0;
    memset(s->ip_set, 0, sizeof s->ip_set);
    memset(s->ip_killed, 0, sizeof s->ip_killed);
    const char *sp = getenv("RK_SPARE"); /* "0": no warm spare (A/B benches) */
    s->ip_spare = sp && strcmp(sp, "0") == 0 ? -1 : 0;
    memset(s->rejoin, 0, sizeof s->rejoin);
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++)
        s->lost_t[r] = 0;
}

/* 1 if every rank of the launch said hello with "rejoin" and none said bye. */
static int all_can_rejoin(sup *s)
{
    if (sup_hellos(s) < s->n)
        return 0;
    for (int r = 0; r < s->n; r++) {
        const rk_sup_conn *c = sup_by_rank(s, r);
        if (!s->rejoin[r] || !c || sup_conn_left(c))
            return 0;
    }
    return 1;
}

/* While replacing: 1 if rank q's failure can be recovered in place too: every rank neither
 * being replaced nor q said hello with "rejoin" and has not said bye, and there is one. */
static int kept_can_rejoin(sup *s, int q)
{
    int kept = 0;
    for (int r = 0; r < s->n; r++) {
        if (r == q || s->ip_set[r])
            continue;
        const rk_sup_conn *c = sup_by_rank(s, r);
        if (!s->rejoin[r] || !c || sup_conn_left(c))
            return 0;
        kept++;
    }
    return kept > 0;
}

/* A replacement's environment over the launch's: the epoch's rendezvous and the faults fired
 * so far (a warm spare's script, run ahead, waits at its first read of one of these:
 * _RANK_NAMES in python/rekindle/torch/_spare.py). NULL-ended, in static storage. */
static char **order_env(sup *s)
{
    static char env[3][RK_SUP_DONE_MAX + 32];
    static char *extra[4];
    int ne = 0;
    snprintf(env[0], sizeof env[0], "MASTER_PORT=%d", s->ip_port);
    snprintf(env[1], sizeof env[1], "RK_REJOIN_EPOCH=%d", s->ip_epoch);
    extra[ne++] = env[0];
    extra[ne++] = env[1];
    if (s->o->inject) {
        size_t w = (size_t)snprintf(env[2], sizeof env[2], "RK_INJECT_DONE=");
        size_t base = w;
        for (size_t k = 0; k < rk_inject_count(s->spec) && w + 24 < sizeof env[2]; k++)
            if (s->fired[k])
                w += (size_t)snprintf(env[2] + w, sizeof env[2] - w, w > base ? ",%zu" : "%zu", k);
        if (w > base)
            extra[ne++] = env[2];
    }
    extra[ne] = NULL;
    return extra;
}

/* Once every rank can rejoin, and again after each replacement: the keeper starts a warm
 * spare (a process that has imported torch and the script's imports, waiting for a rank), so a
 * replacement does not start Python and import torch on the recovery path. */
static void ask_spare(sup *s)
{
    if (s->ip_state == IP_READY && s->ip_spare == 0 && all_can_rejoin(s) &&
        rk_launch_respawn(&s->l, RK_LAUNCH_ORDER_SPARE, NULL) == RK_OK)
        s->ip_spare = 1;
}

int sup_inplace_may(const sup *s, int rank)
{
    return (s->ip_state == IP_READY || s->ip_state == IP_REPLACING) && rank >= 0 && rank < s->n &&
           s->rejoin[rank];
}

/* The keeper is told to end the job: the launch ends as without recovery in place. */
static void give_up(sup *s, int rank)
{
    if (s->seen.failed_rank < 0)
        s->seen.failed_rank = rank;
    s->ip_state = IP_OFF;
    (void)rk_launch_respawn(&s->l, -1, NULL);
}

/* IP_READY -> IP_REPLACING, or IP_REPLACING again: rank r ended with status `code` (128 +
 * signal, or 3). */
static void replace(sup *s, int r, int code)
{
    int again = s->ip_state == IP_REPLACING; /* the rendezvous under way is void */
    rk_sup_conn *c = sup_by_rank(s, r);
    int64_t at = c ? c->done : s->last_done;
    long pid = c ? c->pid : -1;
    int hung = r == s->ip_hung;
    const char *kind = hung ? "hang" : code >= 128 ? "crash" : "commfail";
    char how[RK_HB_DETAIL_MAX + 128];
    if (hung)
        snprintf(how, sizeof how, "hung (%s), its stack dumped, killed", s->ip_hang);
    else if (code >= 128)
        snprintf(how, sizeof how, "died by signal %d", code - 128);
    else
        snprintf(how, sizeof how, "exited with status %d", code);
    int epoch = ++s->ip_epoch;
    int port = s->ip_port = rk_env_free_port();
    char kept[256]; /* the ranks kept, with their pids as the kernel named them (SO_PEERCRED) */
    size_t u = 0;
    kept[0] = '\0';
    for (int q = 0; q < s->n && u + 40 < sizeof kept; q++) {
        const rk_sup_conn *k = q == r ? NULL : sup_by_rank(s, q);
        if (k)
            u += (size_t)snprintf(kept + u, sizeof kept - u, "%s%d (pid %ld)", u ? ", " : "", q,
                                  k->pid);
    }
    rk_incident *i = rk_ledger_add(
        &s->g, kind, r, sup_devname(s, r), "in_place",
        "rank %d (device %s, pid %ld) %s at step %lld%s%s%s; replaced in place, ranks kept: %s "
        "(rendezvous epoch %d, port %d)",
        r, sup_devname(s, r), pid, how, (long long)at, s->exit_detail[0] ? ": " : "",
        s->exit_detail, again ? " during the recovery of an earlier failure" : "", kept, epoch,
        port);
    if (s->seen.exit_kind == RK_SUP_KIND_NONE)
        s->exit_detail[0] = '\0'; /* kept for this incident only (conns.c's on_exit_event) */
    /* the old connection is gone: the replacement's hello claims the rank */
    if (c) {
        if (c->fd >= 0)
            close(c->fd);
        memset(c, 0, sizeof *c); /* STRANGER, closed: free_slot may take it */
        c->fd = -1;
        c->rank = -1;
        c->node = -1;
    }
    s->claim_pid[r] = 0;
    s->lost_t[r] = 0;
    s->rejoin[r] = 0;
    if (s->seen.crash_rank == r)
        s->seen.crash_rank = -1;
    if (s->seen.lost_rank == r)
        s->seen.lost_rank = -1;
    if (s->seen.exit_rank == r) { /* its exit event was this failure's */
        s->seen.exit_kind = RK_SUP_KIND_NONE;
        s->seen.exit_rank = -1;
        s->exit_word[0] = s->exit_detail[0] = '\0';
        s->seen.exit_detail = NULL;
    }
    s->start_step = -1; /* the replacement's hello says the step every rank restored */
    s->restore = RK_HB_RESTORE_UNSAID;
    s->restore_said = 0;
    if (i && hung)
        snprintf(i->stacks, sizeof i->stacks, "%s", s->stacks);
    s->ip_hung = -1;
    s->stacks[0] = '\0';
    if (i) {
        i->step = at;
        sup_pend_relaunch(s, i); /* recovered when every rank steps again; its lost steps */
    }
    s->to_count[r]++; /* a failure of its device, counted by the loop (drain.c) */
    snprintf(s->count_kind[r], sizeof s->count_kind[r], "%s", kind);
    s->ip_set[r] = 1;
    int nkill = 0;
    if (again) /* a replacement that has not rejoined waits in a void rendezvous: the keeper
                * kills it and reports its end (sup_inplace_tick starts it again, this epoch) */
        for (int k = 0; k < s->n; k++)
            if (k != r && s->ip_set[k] && !sup_by_rank(s, k) && !s->ip_killed[k] &&
                rk_launch_respawn(&s->l, RK_LAUNCH_ORDER_KILL(k), NULL) == RK_OK) {
                s->ip_killed[k] = 1;
                nkill++;
            }
    char line[RK_HB_REJOIN_LINE_MAX];
    size_t len;
    if (rk_hb_rejoin_format(epoch, port, line, sizeof line, &len, NULL) == RK_OK)
        for (int k = 0; k < s->nconn; k++)
            if (s->c[k].fd >= 0 && s->c[k].st == SUP_CONN_RANK)
                (void)send(s->c[k].fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    s->ip_state = IP_REPLACING;
    if (s->ip_spare > 0)
        s->ip_spare = 0; /* the keeper's spare (if it has one) becomes rank r */
    s->ip_te = rk_ledger_now(&s->g);
    if (!again) {
        s->ip_rank = r;
        s->ip_t = s->ip_te;
    }
    s->g.in_place++;
    sup_say(s,
            "%s: rank %d %s at step %lld; replacing it in place (the other ranks rejoin: epoch "
            "%d, port %d)%s",
            kind, r, how, (long long)at, epoch, port,
            !again  ? ""
            : nkill ? "; a recovery was under way: its replacements not rejoined yet start again"
                    : "; a recovery was under way");
    rk_phase_mark("sup.inplace", s->launch_no, r); /* RK_TRACE_LAUNCH (base/phase.h) */
    if (rk_launch_respawn(&s->l, r, order_env(s)) != RK_OK) {
        sup_fail(s, "rank %d could not be started again in place", r);
        give_up(s, r);
    }
}

void sup_inplace_tick(sup *s)
{
    if (!s->l.inplace)
        return;
    int code, r;
    while ((r = rk_launch_failed(&s->l, &code)) >= 0) {
        if (s->ip_state == IP_REPLACING && r < s->n && s->ip_killed[r]) {
            /* killed by order (replace): started again in this epoch's rendezvous */
            s->ip_killed[r] = 0;
            if (rk_launch_respawn(&s->l, r, order_env(s)) != RK_OK) {
                sup_fail(s, "rank %d could not be started again in place", r);
                give_up(s, r);
            }
            continue;
        }
        int ok = !sup_failing(s) && !sup_stop_sent(s) && r < s->n &&
                 (code >= 128 || code == RK_EXIT_COMM) &&
                 (s->ip_state == IP_READY       ? all_can_rejoin(s)
                  : s->ip_state == IP_REPLACING ? kept_can_rejoin(s, r)
                                                : 0);
        if (ok && rk_sup_would_quarantine(&s->devs[s->dev[r]], s->o->failure_threshold)) {
            /* this failure sets its device aside: the job is relaunched on the devices left,
             * as without recovery in place, rather than replaced and then stopped to shrink */
            sup_say(s,
                    "rank %d's device %s reaches its failure threshold (%d) with this "
                    "failure: not replaced in place; the job goes on without it",
                    r, sup_devname(s, r), s->o->failure_threshold);
            ok = 0;
        }
        if (ok)
            replace(s, r, code);
        else
            give_up(s, r);
    }
    double now = rk_ledger_now(&s->g);
    for (int q = 0; q < s->n && s->ip_state != IP_OFF; q++)
        if (s->lost_t[q] > 0 && now - s->lost_t[q] > RK_SUP_EXIT_WAIT_S) {
            /* its connection closed, its process did not end: as without recovery in place */
            s->lost_t[q] = 0;
            s->ip_state = IP_OFF;
            if (!sup_failing(s))
                sup_fail(s, "rank %d (device %s) closed its heartbeat connection at step %lld", q,
                         sup_devname(s, q), (long long)s->last_done);
            give_up(s, q);
        }
    if (s->ip_state == IP_REPLACING && now - s->ip_te > s->o->startup_timeout_s &&
        !sup_failing(s)) {
        s->seen.startup_timeout = 1;
        sup_fail(s, "rank %d's replacement did not rejoin within %.0f s", s->ip_rank,
                 s->o->startup_timeout_s);
        give_up(s, s->ip_rank);
    }
}

int sup_inplace_hang(sup *s, int rank, const char *detail)
{
    rk_sup_conn *c = sup_by_rank(s, rank);
    if (!sup_inplace_may(s, rank) || !all_can_rejoin(s) || !c || c->pid <= 0 || c->node >= 0 ||
        !rk_launch_owns(&s->l, (pid_t)c->pid))
        return 0;
    if (kill((pid_t)c->pid, SIGKILL) != 0)
        return 0;
    s->ip_hung = rank;
    snprintf(s->ip_hang, sizeof s->ip_hang, "%s", detail);
    sup_say(s, "hang: %s; killing it to replace it in place", detail);
    return 1;
}

void sup_inplace_hello(sup *s, const rk_hb_msg *m)
{
    if (m->rank < 0 || m->rank >= RK_SUP_MAX_DEVICES)
        return;
    s->rejoin[m->rank] = m->rejoin;
    ask_spare(s);
    if (s->ip_state != IP_REPLACING || !s->ip_set[m->rank])
        return;
    for (int r = 0; r < s->n; r++) /* every rank restored the step the replacement says */
        s->hello_step[r] = m->step;
}

void sup_inplace_step(sup *s)
{
    if (s->ip_state == IP_READY)
        ask_spare(s); /* once every rank said hello (a hello may come before its rank is set) */
    if (s->ip_state != IP_REPLACING)
        return;
    double now = rk_ledger_now(&s->g);
    char who[256]; /* the ranks replaced, each with its pid now */
    size_t u = 0;
    int nset = 0, one = -1;
    who[0] = '\0';
    for (int r = 0; r < s->n && u + 48 < sizeof who; r++)
        if (s->ip_set[r]) {
            const rk_sup_conn *c = sup_by_rank(s, r);
            u += (size_t)snprintf(who + u, sizeof who - u, "%s%d (now pid %ld)", u ? ", " : "", r,
                                  c ? c->pid : -1L);
            nset++;
            one = r;
        }
    if (nset == 1) {
        const rk_sup_conn *c = sup_by_rank(s, one);
        sup_say(s,
                "in place: every rank is stepping again, %.2f s after rank %d was replaced (now "
                "pid %ld)",
                now - s->ip_t, one, c ? c->pid : -1L);
    } else
        sup_say(s, "in place: every rank is stepping again, %.2f s after ranks %s were replaced",
                now - s->ip_t, who);
    s->ip_state = IP_READY;
    s->ip_rank = -1;
    memset(s->ip_set, 0, sizeof s->ip_set);
    ask_spare(s); /* the next replacement's, started now the job is back at work */
}
