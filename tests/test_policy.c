/*
 * Tests for the supervisor's decisions at a launch's end (src/supervisor/policy.h), each a
 * table of cases: the classification of a launch's end (a worker's exit status decides: 2
 * stops as bad usage, 3 is a communication failure and 5 a guard's, without any event; a
 * storage error stops the job and is never a device's; a rank that never said hello is
 * nobody's device; the rank blamed is the one that said it exits or vanished first, not a
 * victim the launcher killed after), the worker's words read into kinds, the stop of a job
 * that fails the same way twice, and, over many hosts, a failure held until every node says it
 * is alive (a node lost meanwhile is the cause). The decisions about devices, during a launch and
 * the launch's environment are in tests/test_policy_launch.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "rekindle/heartbeat.h"
#include "supervisor/policy.h"
#include "supervisor/supervisor.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
/* Rank fields in tables: R(k) is rank k, 0 is none (so that an unset field means none). */
#define R(k) ((k) + 1)
#define UNR(x) ((x)-1)

static void test_init_knows_nothing(void **state)
{
    (void)state;
    rk_sup_seen s;
    memset(&s, 0x33, sizeof s);
    rk_sup_seen_init(&s, 4);
    assert_int_equal(s.ranks, 4);
    assert_int_equal(s.hellos, 0);
    assert_int_equal(s.exited, 0);
    assert_int_equal(s.lost_rank, -1);
    assert_int_equal(s.crash_rank, -1);
    assert_int_equal(s.failed_rank, -1);
    assert_int_equal(s.exit_rank, -1);
    assert_int_equal(s.storage_rank, -1);
    assert_int_equal(s.hang_rank, -1);
    assert_int_equal(s.exit_kind, RK_SUP_KIND_NONE);
    assert_int_equal(s.exit_step, -1);
    assert_null(s.exit_detail);
    assert_int_equal(s.dup_rank, -1);
}

/* ---- kinds --------------------------------------------------------------------------------- */

static void test_worker_words_are_read_into_kinds(void **state)
{
    (void)state;
    static const struct {
        const char *word;
        rk_sup_kind kind;
        int counted; /* as an in-process event */
    } cases[] = {
        /* an exit event with these stops the job */
        {"usage", RK_SUP_KIND_USAGE, 1},
        {"storage", RK_SUP_KIND_STORAGE, 1},
        /* the data until proven otherwise: not the device's */
        {"loss_spike", RK_SUP_KIND_LOSS_SPIKE, 0},
        {"spike_kept", RK_SUP_KIND_SPIKE_KEPT, 0},
        {"grad_suspect", RK_SUP_KIND_GRAD_SUSPECT, 0},
        {"grad_kept", RK_SUP_KIND_GRAD_KEPT, 0},
        /* the job's own code raised an error: never a device's */
        {"exception", RK_SUP_KIND_EXCEPTION, 0},
        /* the job's own checkpoint rule refused its state: never a device's */
        {"ckpt_refused", RK_SUP_KIND_CKPT_REFUSED, 0},
        /* any other word is the worker's own, and counts */
        {"crash", RK_SUP_KIND_OTHER, 1},
        {"commfail", RK_SUP_KIND_OTHER, 1},
        {"guard_failed", RK_SUP_KIND_OTHER, 1},
        {"nan", RK_SUP_KIND_OTHER, 1},
        {"grad_outlier", RK_SUP_KIND_OTHER, 1},
        {"sdc", RK_SUP_KIND_OTHER, 1},
        {"Crash", RK_SUP_KIND_OTHER, 1},
        {"", RK_SUP_KIND_OTHER, 1},
        {NULL, RK_SUP_KIND_OTHER, 1},
    };
    for (size_t k = 0; k < N_OF(cases); k++) {
        rk_sup_kind got = rk_sup_kind_of(cases[k].word);
        if (got != cases[k].kind)
            fail_msg("case %zu (%s): kind %d, expected %d", k, cases[k].word, got, cases[k].kind);
        assert_int_equal(rk_sup_kind_counted(got), cases[k].counted);
        if (got != RK_SUP_KIND_OTHER)
            assert_string_equal(rk_sup_kind_name(got), cases[k].word);
    }
    static const struct {
        rk_sup_kind kind;
        const char *name;
    } names[] = {
        {RK_SUP_KIND_CRASH, "crash"},
        {RK_SUP_KIND_HANG, "hang"},
        {RK_SUP_KIND_COMMFAIL, "commfail"},
        {RK_SUP_KIND_GUARD_FAILED, "guard_failed"},
        {RK_SUP_KIND_USAGE, "usage"},
        {RK_SUP_KIND_STORAGE, "storage"},
        {RK_SUP_KIND_NEVER_CONNECTED, "never_connected"},
        {RK_SUP_KIND_LOSS_SPIKE, "loss_spike"},
        {RK_SUP_KIND_NODE_LOST, "node_lost"},
    };
    for (size_t k = 0; k < N_OF(names); k++) {
        assert_string_equal(rk_sup_kind_name(names[k].kind), names[k].name);
        assert_true(rk_sup_kind_counted(names[k].kind) ==
                    (names[k].kind != RK_SUP_KIND_LOSS_SPIKE));
    }
    assert_null(rk_sup_kind_name((rk_sup_kind)99));
    assert_null(rk_sup_kind_name(RK_SUP_KIND_NONE));
    assert_null(rk_sup_kind_name(RK_SUP_KIND_OTHER));
    assert_int_equal(rk_sup_kind_counted(RK_SUP_KIND_NONE), 0);
    assert_true(rk_sup_action_exits("exit"));
    assert_false(rk_sup_action_exits("redo"));
    assert_false(rk_sup_action_exits("exits"));
    assert_false(rk_sup_action_exits(NULL));
}

/* ---- a launch's end ------------------------------------------------------------------------ */

typedef struct classify_case {
    const char *what;
    /* seen (rank fields R(k) or 0 for none) */
    int ranks, hellos, done, exited, status, stop_sent, interrupted, hang, hang_rank, startup, lost,
        exit_rank, storage, crash, node, dup, failed;
    rk_sup_kind exit_kind;
    /* expected */
    rk_sup_next next;
    rk_sup_kind kind;
    int rank, counted;
    rk_sup_end end; /* checked unless a relaunch */
} classify_case;

#define ALL(n) .ranks = (n), .hellos = (n)
#define EXITED(st) .exited = 1, .status = (st)

static const classify_case k_classify[] = {
    /* finished */
    {"every rank done, exit 0", ALL(3), .done = 3, EXITED(0), .next = RK_SUP_FINISHED,
     .end = RK_SUP_END_FINISHED},
    /* every rank said bye done, then one was killed (SIGKILL, 137) or the launcher failed:
     * the work is done, a relaunch would redo nothing (it set off one of about 7 s before) */
    {"every rank done, then one killed", ALL(2), .done = 2, EXITED(128 + 9), .lost = R(1),
     .next = RK_SUP_FINISHED, .end = RK_SUP_END_FINISHED},
    {"every rank done, the launcher exits 1", ALL(4), .done = 4, EXITED(1), .next = RK_SUP_FINISHED,
     .end = RK_SUP_END_FINISHED},
    {"exit 0 but one rank never said bye done", ALL(3), .done = 2, EXITED(0), .lost = R(1),
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_CRASH, .rank = R(1), .counted = 1},
    /* the launcher killed rank 0 after rank 1's announced (injected) crash, and rank 0's end
     * was read first: rank 1 is the culprit (it was rank 0, a healthy device, before) */
    /* rank 3 was SIGKILLed; its connection stayed open in a child that held it (a torch
     * DataLoader worker), so rank 0's close, after the keeper killed it, was read first: the
     * keeper's word (rank 3's process ended first) names the culprit (it was rank 0 before) */
    {"the launcher saw rank 3 end first, rank 0's close read first", ALL(4), EXITED(128 + 9),
     .lost = R(0), .failed = R(3), .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_CRASH, .rank = R(3),
     .counted = 1},
    {"an announced crash read after another rank's end", ALL(2), EXITED(128 + 6), .lost = R(0),
     .crash = R(1), .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_CRASH, .rank = R(1), .counted = 1},
    {"a stop that found every rank finishing", ALL(3), .done = 3, EXITED(0), .stop_sent = 1,
     .next = RK_SUP_FINISHED, .end = RK_SUP_END_FINISHED},
    /* usage: stop, exit 2, nothing counted */
    {"exit 2 after hello", ALL(2), EXITED(RK_EXIT_USAGE), .lost = R(1), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_USAGE, .rank = R(1), .end = RK_SUP_END_USAGE},
    {"the launcher reports a killed rank's status, the rank said usage", ALL(2), EXITED(128 + 9),
     .exit_kind = RK_SUP_KIND_USAGE, .exit_rank = R(0), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_USAGE, .rank = R(0), .end = RK_SUP_END_USAGE},
    {"exit 2 before any hello", .ranks = 2, EXITED(RK_EXIT_USAGE), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_USAGE, .end = RK_SUP_END_USAGE},
    /* storage: stop, never counted */
    {"rank 0 said storage; rank 1 exited first with 1", ALL(2), EXITED(RK_EXIT_FAIL), .lost = R(1),
     .exit_kind = RK_SUP_KIND_STORAGE, .exit_rank = R(0), .storage = R(0), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_STORAGE, .rank = R(0), .end = RK_SUP_END_STORAGE},
    {"exit 6 alone", ALL(2), EXITED(RK_EXIT_STORAGE), .lost = R(0), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_STORAGE, .rank = R(0), .end = RK_SUP_END_STORAGE},
    {"exit 6 during a stop (a drain's checkpoint fills the disk)", ALL(2), EXITED(RK_EXIT_STORAGE),
     .stop_sent = 1, .next = RK_SUP_STOP, .kind = RK_SUP_KIND_STORAGE, .end = RK_SUP_END_STORAGE},
    {"torn down before the launcher exited: the event is enough", ALL(4),
     .exit_kind = RK_SUP_KIND_STORAGE, .exit_rank = R(0), .storage = R(0), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_STORAGE, .rank = R(0), .end = RK_SUP_END_STORAGE},
    {"a storage event after another exit event", ALL(2), EXITED(RK_EXIT_COMM),
     .exit_kind = RK_SUP_KIND_COMMFAIL, .exit_rank = R(1), .storage = R(0), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_STORAGE, .rank = R(0), .end = RK_SUP_END_STORAGE},
    {"storage beats usage", ALL(2), EXITED(RK_EXIT_USAGE), .storage = R(1), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_STORAGE, .rank = R(1), .end = RK_SUP_END_STORAGE},
    /* the exit status alone */
    {"exit 3", ALL(4), EXITED(RK_EXIT_COMM), .lost = R(3), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_COMMFAIL, .rank = R(3), .counted = 1},
    {"exit 5", ALL(4), EXITED(RK_EXIT_GUARD), .lost = R(3), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_GUARD_FAILED, .rank = R(3), .counted = 1},
    {"exit 1", ALL(4), EXITED(RK_EXIT_FAIL), .lost = R(3), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_CRASH, .rank = R(3), .counted = 1},
    {"killed by SIGKILL", ALL(4), EXITED(128 + 9), .lost = R(3), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_CRASH, .rank = R(3), .counted = 1},
    /* an exception in the job's code: relaunched, counted against no device (the status it
     * exits with, 1, would be a crash of that rank's device) */
    {"rank 1 raised an exception, exit 1", ALL(2), EXITED(RK_EXIT_FAIL), .lost = R(1),
     .exit_kind = RK_SUP_KIND_EXCEPTION, .exit_rank = R(1), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_EXCEPTION, .rank = R(1)},
    {"an exception, torn down before the launcher exited", ALL(4), .lost = R(0),
     .exit_kind = RK_SUP_KIND_EXCEPTION, .exit_rank = R(2), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_EXCEPTION, .rank = R(2)},
    {"an exception event but exit 3: a communication failure", ALL(2), EXITED(RK_EXIT_COMM),
     .exit_kind = RK_SUP_KIND_EXCEPTION, .exit_rank = R(0), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_COMMFAIL, .rank = R(0), .counted = 1},
    {"an exception during a stop", ALL(2), EXITED(RK_EXIT_FAIL), .stop_sent = 1,
     .exit_kind = RK_SUP_KIND_EXCEPTION, .exit_rank = R(1), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_EXCEPTION, .rank = R(1)},
    /* the job's own checkpoint rule refused its state (rekindle.torch: a parameter not
     * finite), then exit 5: not a guard that failed on a device (it quarantined two healthy
     * devices of a job with a mask of -inf) */
    {"a checkpoint refused by the job's rule, exit 5", ALL(2), EXITED(RK_EXIT_GUARD),
     .exit_kind = RK_SUP_KIND_CKPT_REFUSED, .exit_rank = R(0), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_CKPT_REFUSED, .rank = R(0)},
    {"a refused checkpoint, the launcher killed the rest (137)", ALL(3), EXITED(128 + 9),
     .lost = R(2), .exit_kind = RK_SUP_KIND_CKPT_REFUSED, .exit_rank = R(0),
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_CKPT_REFUSED, .rank = R(0)},
    /* blame */
    {"the rank that said it exits, not the first lost", ALL(4), EXITED(RK_EXIT_COMM), .lost = R(0),
     .exit_kind = RK_SUP_KIND_COMMFAIL, .exit_rank = R(2), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_COMMFAIL, .rank = R(2), .counted = 1},
    {"an exit event, a status that says nothing more: the event's kind", ALL(4), EXITED(128 + 15),
     .exit_kind = RK_SUP_KIND_GUARD_FAILED, .exit_rank = R(1), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_GUARD_FAILED, .rank = R(1), .counted = 1},
    {"an exit event with the worker's own word", ALL(4), EXITED(RK_EXIT_FAIL),
     .exit_kind = RK_SUP_KIND_OTHER, .exit_rank = R(3), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_OTHER, .rank = R(3), .counted = 1},
    {"nobody identified: nothing counted", ALL(4), EXITED(RK_EXIT_FAIL), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_CRASH},
    {"torn down after a rank vanished", ALL(2), .lost = R(1), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_CRASH, .rank = R(1), .counted = 1},
    /* never connected: nobody's device */
    {"startup timeout", .ranks = 2, .hellos = 1, .startup = 1, .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_NEVER_CONNECTED},
    {"the launcher exited before every hello; the rank lost is a victim", .ranks = 2, .hellos = 1,
     EXITED(RK_EXIT_FAIL), .lost = R(0), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_NEVER_CONNECTED},
    /* every rank exited 0 and none said hello: a plain program, a usage error (no relaunch) */
    {"exit 0 without a hello (rk run -- true)", .ranks = 1, EXITED(0), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_NEVER_CONNECTED, .end = RK_SUP_END_USAGE},
    {"two ranks exit 0, neither said hello", .ranks = 2, EXITED(0), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_NEVER_CONNECTED, .end = RK_SUP_END_USAGE},
    {"exit 0 with one hello of two: relaunched", .ranks = 2, .hellos = 1, EXITED(0),
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_NEVER_CONNECTED},
    {"a non-zero exit without a hello: relaunched", .ranks = 2, EXITED(RK_EXIT_FAIL),
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_NEVER_CONNECTED},
    {"killed by a signal without a hello: relaunched", .ranks = 2, EXITED(128 + 9),
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_NEVER_CONNECTED},
    {"a startup timeout without a hello: relaunched", .ranks = 2, .startup = 1,
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_NEVER_CONNECTED},
    {"a rank said it exits before the others connected: its failure", .ranks = 2, .hellos = 1,
     EXITED(RK_EXIT_COMM), .exit_kind = RK_SUP_KIND_COMMFAIL, .exit_rank = R(0),
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_COMMFAIL, .rank = R(0), .counted = 1},
    /* two processes said hello as one rank (a worker that reads Open MPI's rank under local):
     * stop, exit 2, nobody's device, whatever the launch did after it */
    {"two processes said hello as rank 0; torn down", .ranks = 2, .hellos = 1, .dup = R(0),
     .next = RK_SUP_STOP, .kind = RK_SUP_KIND_USAGE, .rank = R(0), .end = RK_SUP_END_USAGE},
    {"as rank 0 of 1, all exited 0, none believed (was: never_connected)", .ranks = 2, EXITED(0),
     .dup = R(0), .next = RK_SUP_STOP, .kind = RK_SUP_KIND_USAGE, .rank = R(0),
     .end = RK_SUP_END_USAGE},
    {"as rank 0, the second died of the closed socket", .ranks = 2, .hellos = 1,
     EXITED(RK_EXIT_FAIL), .lost = R(0), .dup = R(0), .next = RK_SUP_STOP,
     .kind = RK_SUP_KIND_USAGE, .rank = R(0), .end = RK_SUP_END_USAGE},
    {"as rank 1 of 4, with a hang seen meanwhile", .ranks = 4, .hellos = 3, .hang = 1, .dup = R(1),
     .next = RK_SUP_STOP, .kind = RK_SUP_KIND_USAGE, .rank = R(1), .end = RK_SUP_END_USAGE},
    {"interrupted beats a duplicate rank", .ranks = 2, .hellos = 1, .dup = R(0), .interrupted = 1,
     .next = RK_SUP_INTERRUPTED, .end = RK_SUP_END_INTERRUPTED},
    /* a node of a multi-host job lost: its own kind, counted against the node (cluster.c) */
    {"a node lost: node_lost of its first rank, no device counted", ALL(6), .node = R(1),
     .lost = R(2), .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_NODE_LOST, .rank = R(2)},
    {"a node lost beats the hang it caused", ALL(6), .node = R(2), .hang = 1, .hang_rank = R(0),
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_NODE_LOST, .rank = R(4)},
    /* hang */
    {"a hang of rank 2", ALL(4), .hang = 1, .hang_rank = R(2), .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_HANG, .rank = R(2), .counted = 1},
    {"all equally stuck: nobody's", ALL(4), .hang = 1, .next = RK_SUP_RELAUNCH,
     .kind = RK_SUP_KIND_HANG},
    {"a hang before every hello is still a hang", .ranks = 4, .hellos = 3, .hang = 1,
     .hang_rank = R(1), .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_HANG, .rank = R(1),
     .counted = 1},
    /* a stop the supervisor sent (drain, shrink), obeyed: relaunch, no incident */
    {"stopped on command, exit 4", ALL(3), EXITED(RK_EXIT_STOPPED), .stop_sent = 1,
     .next = RK_SUP_RELAUNCH},
    {"stopped on command, exit 0", ALL(3), EXITED(0), .stop_sent = 1, .next = RK_SUP_RELAUNCH},
    {"a stop, then a rank was killed: a crash after all", ALL(3), EXITED(128 + 9), .stop_sent = 1,
     .lost = R(2), .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_CRASH, .rank = R(2), .counted = 1},
    {"a stop, and a rank said it exits with a failure", ALL(3), EXITED(RK_EXIT_STOPPED),
     .stop_sent = 1, .exit_kind = RK_SUP_KIND_GUARD_FAILED, .exit_rank = R(0),
     .next = RK_SUP_RELAUNCH, .kind = RK_SUP_KIND_GUARD_FAILED, .rank = R(0), .counted = 1},
    /* interrupted beats everything */
    {"interrupted after a stop", ALL(2), EXITED(RK_EXIT_STOPPED), .stop_sent = 1, .interrupted = 1,
     .next = RK_SUP_INTERRUPTED, .end = RK_SUP_END_INTERRUPTED},
    {"interrupted with a rank lost", ALL(2), EXITED(RK_EXIT_FAIL), .lost = R(1), .interrupted = 1,
     .next = RK_SUP_INTERRUPTED, .end = RK_SUP_END_INTERRUPTED},
    {"interrupted with a storage error", ALL(2), EXITED(RK_EXIT_STORAGE), .interrupted = 1,
     .next = RK_SUP_INTERRUPTED, .end = RK_SUP_END_INTERRUPTED},
};

static void test_classify(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_OF(k_classify); k++) {
        const classify_case *c = &k_classify[k];
        rk_sup_seen s;
        rk_sup_seen_init(&s, c->ranks);
        s.hellos = c->hellos;
        s.done = c->done;
        s.exited = c->exited;
        s.status = c->status;
        s.stop_sent = c->stop_sent;
        s.interrupted = c->interrupted;
        s.hang = c->hang;
        s.hang_rank = UNR(c->hang_rank);
        s.startup_timeout = c->startup;
        s.lost_rank = UNR(c->lost);
        s.crash_rank = UNR(c->crash);
        s.failed_rank = UNR(c->failed);
        s.exit_kind = c->exit_kind;
        s.exit_rank = UNR(c->exit_rank);
        s.storage_rank = UNR(c->storage);
        s.node_lost = UNR(c->node);
        /* the node's first rank: node k holds ranks 2k, 2k+1 in these cases */
        s.node_rank = s.node_lost >= 0 ? 2 * s.node_lost : -1;
        s.dup_rank = UNR(c->dup);
        rk_sup_verdict v;
        memset(&v, 0x5a, sizeof v);
        rk_sup_classify(&s, &v);
        if (v.next != c->next || v.kind != c->kind || v.rank != UNR(c->rank) ||
            v.counted != c->counted || (c->next != RK_SUP_RELAUNCH && v.end != c->end) || !v.why ||
            !v.why[0])
            fail_msg("case %zu (%s): next %d kind %d rank %d counted %d end %d; expected "
                     "next %d kind %d rank %d counted %d end %d",
                     k, c->what, v.next, v.kind, v.rank, v.counted, v.end, c->next, c->kind,
                     UNR(c->rank), c->counted, c->end);
    }
}

/* ---- repeat stops -------------------------------------------------------------------------- */

typedef struct repeat_launch {
    int hellos, exited, status, startup;
    rk_sup_kind exit_kind;
    int64_t step;
    const char *detail;
} repeat_launch;

/* Classify one 2-rank launch and take its mark. */
static void mark_launch(const repeat_launch *l, rk_sup_verdict *v, rk_sup_mark *m)
{
    rk_sup_seen s;
    rk_sup_seen_init(&s, 2);
    s.hellos = l->hellos;
    s.exited = l->exited;
    s.status = l->status;
    s.startup_timeout = l->startup;
    if (l->exit_kind != RK_SUP_KIND_NONE) {
        s.exit_kind = l->exit_kind;
        s.exit_rank = 1;
        s.exit_step = l->step;
        s.exit_detail = l->detail;
    }
    rk_sup_classify(&s, v);
    rk_sup_mark_of(&s, v, m);
}

static void test_repeat(void **state)
{
    (void)state;
#define EXC(st, d)                                                                                 \
    {                                                                                              \
        .hellos = 2, .exited = 1, .status = 1, .exit_kind = RK_SUP_KIND_EXCEPTION, .step = (st),   \
        .detail = (d)                                                                              \
    }
#define REF(st, d)                                                                                 \
    {                                                                                              \
        .hellos = 2, .exited = 1, .status = RK_EXIT_GUARD, .exit_kind = RK_SUP_KIND_CKPT_REFUSED,  \
        .step = (st), .detail = (d)                                                                \
    }
#define NOHELLO(code)                                                                              \
    {                                                                                              \
        .exited = 1, .status = (code)                                                              \
    }
    static const struct {
        const char *what;
        repeat_launch prev, cur;
        int prev_set; /* 0: cur is the first launch */
        int stop;
        const char *says; /* in the why of a stop */
    } cases[] = {
        {"the same exception at the same step", EXC(5, "ValueError: bad (t.py:12)"),
         EXC(5, "ValueError: bad (t.py:12)"), 1, 1, "the same exception at step 5 in two launches"},
        {"the first exception", {0}, EXC(5, "ValueError: bad (t.py:12)"), 0, 0, NULL},
        {"an exception at another step", EXC(5, "ValueError: bad (t.py:12)"),
         EXC(7, "ValueError: bad (t.py:12)"), 1, 0, NULL},
        {"another exception at the same step", EXC(5, "ValueError: bad (t.py:12)"),
         EXC(5, "KeyError: 'x' (t.py:30)"), 1, 0, NULL},
        {"an exception after a crash",
         {.hellos = 2, .exited = 1, .status = 137},
         EXC(5, "ValueError: bad (t.py:12)"),
         1,
         0,
         NULL},
        {"the job's rule refused its checkpoint at the same step twice",
         REF(40, "item 'model.w': element 3 is inf"), REF(40, "item 'model.w': element 3 is inf"),
         1, 1, "refused its checkpoint at step 40 in two launches in a row"},
        {"a refused checkpoint the first time",
         {0},
         REF(40, "item 'model.w': element 3 is inf"),
         0,
         0,
         NULL},
        {"a refused checkpoint after an exception at that step", EXC(40, "ValueError: bad"),
         REF(40, "ValueError: bad"), 1, 0, NULL},
        {"no hello, exit 1, twice", NOHELLO(1), NOHELLO(1), 1, 1,
         "exits with status 1 before it connects, twice in a row"},
        {"no hello, the first time", {0}, NOHELLO(1), 0, 0, NULL},
        {"no hello, another exit status", NOHELLO(1), NOHELLO(2 + 128), 1, 0, NULL},
        {"killed by the same signal before any hello, twice", NOHELLO(128 + 9), NOHELLO(128 + 9), 1,
         1, "status 137"},
        {"a startup timeout twice: relaunched as before",
         {.startup = 1},
         {.startup = 1},
         1,
         0,
         NULL},
        {"no hello after a startup timeout", {.startup = 1}, NOHELLO(1), 1, 0, NULL},
        {"one rank of two said hello, twice",
         {.hellos = 1, .exited = 1, .status = 1},
         {.hellos = 1, .exited = 1, .status = 1},
         1,
         0,
         NULL},
        {"no hello after an exception", EXC(0, "ValueError: x"), NOHELLO(1), 1, 0, NULL},
        {"the same plain crash twice: relaunched",
         {.hellos = 2, .exited = 1, .status = 1},
         {.hellos = 2, .exited = 1, .status = 1},
         1,
         0,
         NULL},
    };
#undef EXC
#undef NOHELLO
    for (size_t k = 0; k < N_OF(cases); k++) {
        rk_sup_verdict pv, v;
        rk_sup_mark pm, m;
        mark_launch(&cases[k].prev, &pv, &pm);
        mark_launch(&cases[k].cur, &v, &m);
        assert_int_equal(v.next, RK_SUP_RELAUNCH);
        char why[256] = "";
        int stop = rk_sup_repeat(cases[k].prev_set ? &pm : NULL, &m, &v, why, sizeof why);
        if (stop != cases[k].stop)
            fail_msg("case %zu (%s): stop %d, expected %d", k, cases[k].what, stop, cases[k].stop);
        if (stop) {
            assert_int_equal(v.next, RK_SUP_STOP);
            assert_int_equal(v.end, RK_SUP_END_FAILED);
            assert_ptr_equal(v.why, why);
            if (!strstr(why, cases[k].says))
                fail_msg("case %zu (%s): why '%s' lacks '%s'", k, cases[k].what, why,
                         cases[k].says);
        } else
            assert_int_equal(v.next, RK_SUP_RELAUNCH);
    }
    /* a stop is no mark: nothing to repeat */
    rk_sup_verdict v = {.next = RK_SUP_STOP, .kind = RK_SUP_KIND_NEVER_CONNECTED};
    rk_sup_seen s;
    rk_sup_seen_init(&s, 1);
    s.exited = 1;
    rk_sup_mark m;
    rk_sup_mark_of(&s, &v, &m);
    assert_int_equal(m.kind, RK_SUP_KIND_NONE);
}

/* A failure in a launch over many hosts is blamed as seen only once every node of the launch
 * said it is alive; a node lost before that is the cause, however the ends were read. */
static void test_node_blame(void **state)
{
    (void)state;
    const rk_sup_link O = RK_SUP_LINK_OUT, Q = RK_SUP_LINK_ASKED, A = RK_SUP_LINK_ALIVE,
                      L = RK_SUP_LINK_LOST;
    const struct {
        const char *what;
        rk_sup_link link[4];
        double now; /* the failure seen at 10, waiting at most 4 s */
        rk_sup_blame want;
        int node;
    } cases[] = {
        {"every node alive: the failure as seen", {A, A, A, O}, 10.01, RK_SUP_BLAME_AS_SEEN, -1},
        {"no node in the launch asked: as seen", {O, O, O, O}, 10, RK_SUP_BLAME_AS_SEEN, -1},
        /* the case: mpirun's kill of a sound host's rank read before host 2's link
         * closed; host 2 has not answered yet: hold */
        {"host 2 not answered yet: wait", {A, Q, A, O}, 10.01, RK_SUP_BLAME_WAIT, -1},
        {"... its link closes: host 2 is the cause", {A, L, A, O}, 10.02, RK_SUP_BLAME_NODE, 1},
        {"a loss beats the others' answers still due", {Q, Q, L, O}, 10, RK_SUP_BLAME_NODE, 2},
        {"the first lost in node order", {O, L, L, Q}, 12, RK_SUP_BLAME_NODE, 1},
        {"a loss after the wait still counts", {A, L, A, O}, 99, RK_SUP_BLAME_NODE, 1},
        {"a node silent just under the wait: still waiting",
         {A, Q, A, A},
         13.99,
         RK_SUP_BLAME_WAIT,
         -1},
        {"no answer and no loss for the whole wait: as seen",
         {A, Q, A, A},
         14,
         RK_SUP_BLAME_AS_SEEN,
         -1},
    };
    for (size_t k = 0; k < N_OF(cases); k++) {
        int node = 77;
        rk_sup_blame b = rk_sup_node_blame(4, cases[k].link, cases[k].now, 10.0, 4.0, &node);
        if (b != cases[k].want || node != cases[k].node)
            fail_msg("case %zu (%s): blame %d node %d, want %d node %d", k, cases[k].what, (int)b,
                     node, (int)cases[k].want, cases[k].node);
    }
    /* the loop's whole decision, from the crash to the verdict: the crash on a sound host
     * (rank 1, h1:1) is held; once host 2 (ranks 2, 3) is lost the verdict is node_lost of
     * its first rank, and no device is counted */
    rk_sup_seen s;
    rk_sup_seen_init(&s, 6);
    s.hellos = 6;
    s.exited = 1;
    s.status = 137;
    s.lost_rank = 1;
    rk_sup_verdict v;
    rk_sup_classify(&s, &v);
    assert_int_equal(v.kind, RK_SUP_KIND_CRASH); /* what the ranks showed */
    rk_sup_link link[3] = {A, Q, A};
    int node;
    assert_int_equal(rk_sup_node_blame(3, link, 10.1, 10, 4, &node), RK_SUP_BLAME_WAIT);
    link[1] = L;
    assert_int_equal(rk_sup_node_blame(3, link, 10.2, 10, 4, &node), RK_SUP_BLAME_NODE);
    s.node_lost = node;
    s.node_rank = 2;
    rk_sup_classify(&s, &v);
    assert_int_equal(v.kind, RK_SUP_KIND_NODE_LOST);
    assert_int_equal(v.rank, 2);
    assert_int_equal(v.counted, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_knows_nothing),
        cmocka_unit_test(test_worker_words_are_read_into_kinds),
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_repeat),
        cmocka_unit_test(test_node_blame),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
