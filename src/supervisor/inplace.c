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

#include <errno.h>
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

/* While replacing, or about to: 1 if the ranks of `out` (and those of ip_set) may be replaced
 * in place: every other rank said hello with "rejoin" and has not said bye, and one does. */
static int others_can_rejoin(sup *s, const unsigned char *out)
{
    int kept = 0;
    for (int r = 0; r < s->n; r++) {
        if (out[r] || s->ip_set[r])
            continue;
        const rk_sup_conn *c = sup_by_rank(s, r);
        if (!s->rejoin[r] || !c || sup_conn_left(c))
            return 0;
        kept++;
    }
    return kept > 0;
}

/* IP_READY (ip_set empty): 1 if every rank of the launch said hello with "rejoin" and none
 * said bye. */
static int all_can_rejoin(sup *s)
{
    static const unsigned char none[RK_SUP_MAX_DEVICES];
    return s->ip_state == IP_READY && sup_hellos(s) >= s->n && others_can_rejoin(s, none);
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

/* Rank r's connection and claim forgotten (a failure's, or a stale one of a replacement killed
 * by order): the next process's hello claims the rank. */
static void forget_rank(sup *s, int r)
{
    rk_sup_conn *c = sup_by_rank(s, r);
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
}

/* Rank r ended with status `code` (128 + signal, or 3): its incident (of the rendezvous of
 * s->ip_epoch, s->ip_port), its connection forgotten, its device counted; it joins ip_set. */
static void fail_rank(sup *s, int r, int code, int again)
{
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
        "rank %d (device %s, %s %ld) %s at step %lld%s%s%s; replaced in place, ranks kept: %s "
        "(rendezvous epoch %d, port %d)",
        r, sup_devname(s, r), pid > 0 ? "pid" : "a replacement not rejoined yet, pid", pid, how,
        (long long)at, s->exit_detail[0] ? ": " : "", s->exit_detail,
        again ? " during the recovery of an earlier failure" : "", kept, s->ip_epoch, s->ip_port);
    if (s->seen.exit_kind == RK_SUP_KIND_NONE)
        s->exit_detail[0] = '\0'; /* kept for this incident only (conns.c's on_exit_event) */
    forget_rank(s, r);  /* the old connection is gone: the replacement's hello claims the rank */
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
    s->g.in_place++;
    sup_say(s,
            "%s: rank %d %s at step %lld; replacing it in place (the other ranks rejoin: epoch "
            "%d, port %d)%s",
            kind, r, how, (long long)at, s->ip_epoch, s->ip_port,
            again ? "; a recovery was under way: it starts again with this rank" : "");
    rk_phase_mark("sup.inplace", s->launch_no, r); /* RK_TRACE_LAUNCH (base/phase.h) */
}

/* One recovery's rendezvous (IP_READY -> IP_REPLACING, or IP_REPLACING again): the ranks
 * `failed` (nf of them, with their statuses) ended in this tick; `dead` marks every rank whose
 * process is known ended and is to be started now (those, and replacements killed by order
 * whose end the keeper reported). A new epoch and port; a replacement still waiting in a void
 * rendezvous (in ip_set, no hello, alive) is killed by the keeper, and started again once its
 * end is reported (sup_inplace_tick); every rank connected is told to rejoin; the dead ones
 * are started (the first takes the keeper's warm spare, if it has one). */
static void recover(sup *s, const int *failed, const int *codes, int nf, const unsigned char *dead)
{
    int again = s->ip_state == IP_REPLACING; /* the rendezvous under way is void */
    s->ip_epoch++;
    s->ip_port = rk_env_free_port();
    for (int k = 0; k < nf; k++)
        fail_rank(s, failed[k], codes[k], again || k > 0);
    if (again) /* a replacement that has not rejoined waits in the void rendezvous */
        for (int k = 0; k < s->n; k++)
            if (s->ip_set[k] && !dead[k] && !sup_by_rank(s, k) && !s->ip_killed[k] &&
                rk_launch_respawn(&s->l, RK_LAUNCH_ORDER_KILL(k), NULL) == RK_OK)
                s->ip_killed[k] = 1;
    char line[RK_HB_REJOIN_LINE_MAX];
    size_t len;
    if (rk_hb_rejoin_format(s->ip_epoch, s->ip_port, line, sizeof line, &len, NULL) == RK_OK)
        for (int k = 0; k < s->nconn; k++)
            if (s->c[k].fd >= 0 && s->c[k].st == SUP_CONN_RANK)
                (void)send(s->c[k].fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    s->ip_state = IP_REPLACING;
    s->ip_te = rk_ledger_now(&s->g);
    if (!again) {
        s->ip_rank = failed[0];
        s->ip_t = s->ip_te;
    }
    for (int r = 0; r < s->n; r++) {
        if (!dead[r])
            continue;
        if (rk_launch_respawn(&s->l, r, order_env(s)) != RK_OK) {
            sup_fail(s, "rank %d could not be started again in place", r);
            give_up(s, r);
            return;
        }
        if (s->ip_spare > 0)
            s->ip_spare = 0; /* the keeper's spare (if it had one) became this rank */
    }
}

void sup_inplace_tick(sup *s)
{
    if (!s->l.inplace)
        return;
    /* every end the keeper reported, first: two ranks dying at one step are one recovery */
    int failed[RK_SUP_MAX_DEVICES], codes[RK_SUP_MAX_DEVICES], nf = 0, ok = 1, blame = -1;
    unsigned char dead[RK_SUP_MAX_DEVICES], out[RK_SUP_MAX_DEVICES];
    memset(dead, 0, sizeof dead);
    memset(out, 0, sizeof out);
    int code, r, nkilled = 0;
    while ((r = rk_launch_failed(&s->l, &code)) >= 0) {
        if (r >= s->n || r >= RK_SUP_MAX_DEVICES) {
            ok = 0;
            blame = blame < 0 ? r : blame;
            continue;
        }
        if (s->ip_state == IP_REPLACING && s->ip_killed[r]) {
            /* killed by order (recover): started again in the rendezvous now asked for */
            s->ip_killed[r] = 0;
            forget_rank(s, r); /* a hello it sent before it died claims nothing */
            dead[r] = 1;
            nkilled++;
            continue;
        }
        if (dead[r]) /* (cannot be: one end a process) */
            continue;
        int may = !sup_failing(s) && !sup_stop_sent(s) && (code >= 128 || code == RK_EXIT_COMM) &&
                  (s->ip_state == IP_READY || s->ip_state == IP_REPLACING) &&
                  (s->ip_state != IP_READY || all_can_rejoin(s));
        if (may && rk_sup_would_quarantine(&s->devs[s->dev[r]], s->o->failure_threshold)) {
            /* this failure sets its device aside: the job is relaunched on the devices left,
             * as without recovery in place, rather than replaced and then stopped to shrink */
            sup_say(s,
                    "rank %d's device %s reaches its failure threshold (%d) with this "
                    "failure: not replaced in place; the job goes on without it",
                    r, sup_devname(s, r), s->o->failure_threshold);
            may = 0;
        }
        if (!may) {
            ok = 0;
            blame = blame < 0 ? r : blame;
            continue;
        }
        failed[nf] = r;
        codes[nf++] = code;
        dead[r] = out[r] = 1;
    }
    if (!ok || (nf > 0 && !others_can_rejoin(s, out)))
        give_up(s, blame >= 0 ? blame : failed[0]); /* the keeper waits for a word: this one */
    else if (nf > 0)
        recover(s, failed, codes, nf, dead);
    else if (nkilled > 0 && s->ip_state == IP_REPLACING) {
        if (sup_failing(s) || sup_stop_sent(s))
            give_up(s, s->ip_rank);
        else
            for (r = 0; r < s->n; r++)
                if (dead[r] && rk_launch_respawn(&s->l, r, order_env(s)) != RK_OK) {
                    sup_fail(s, "rank %d could not be started again in place", r);
                    give_up(s, r);
                    break;
                }
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

int sup_inplace_stale(const sup *s, const rk_sup_conn *c, int rank)
{
    if (s->ip_state != IP_REPLACING || rank < 0 || rank >= s->n || !s->ip_set[rank])
        return 0;
    if (s->ip_killed[rank])
        return 1; /* its process was ordered killed: a hello for the rank now is that one's */
    /* its end already reported, its hello read after: the process is gone */
    return c->pid > 0 && kill((pid_t)c->pid, 0) != 0 && errno == ESRCH;
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
