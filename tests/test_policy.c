/*
 * Tests for the supervisor's failure classification (src/supervisor/policy.h): each rule on
 * its own and where rules meet. A worker's exit status decides (2 stops with exit 2, 3 is a
 * communication failure and 5 a guard's, without any event), a storage error stops the job
 * and is never a device's, a rank that never said hello is nobody's device, the rank blamed
 * is the one that said it exits or vanished first (not a victim the launcher killed after).
 * And the errno classes a storage error rests on (rk_err_code_errno: RK_ESTORAGE, which rk
 * train turns into exit status 6).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/msg.h"
#include "rekindle/heartbeat.h"
#include "supervisor/policy.h"

/* A launch of `ranks` ranks that all said hello, then the launcher exited with `status`. */
static rk_sup_seen exited(int ranks, int status)
{
    rk_sup_seen s;
    rk_sup_seen_init(&s, ranks);
    s.hellos = ranks;
    s.exited = 1;
    s.status = status;
    return s;
}

static rk_sup_verdict judge(const rk_sup_seen *s)
{
    rk_sup_verdict v;
    memset(&v, 0x5a, sizeof v);
    rk_sup_classify(s, &v);
    return v;
}

static void exit_event(rk_sup_seen *s, int rank, const char *kind)
{
    snprintf(s->exit_kind, sizeof s->exit_kind, "%s", kind);
    s->exit_rank = rank;
    if (strcmp(kind, "storage") == 0)
        s->storage_rank = rank;
}

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
    assert_int_equal(s.exit_rank, -1);
    assert_int_equal(s.storage_rank, -1);
    assert_int_equal(s.hang_rank, -1);
    assert_string_equal(s.exit_kind, "");
}

static void test_finished(void **state)
{
    (void)state;
    rk_sup_seen s = exited(3, 0);
    s.done = 3;
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.next, RK_SUP_FINISHED);
    assert_null(v.kind);
    assert_int_equal(v.status, 0);
    /* exit 0, but one rank never said bye "done": not finished */
    s.done = 2;
    s.lost_rank = 1;
    v = judge(&s);
    assert_int_equal(v.next, RK_SUP_RELAUNCH);
    assert_string_equal(v.kind, "crash");
    assert_int_equal(v.rank, 1);
}

/* Exit 2 after hello: stop with exit 2, no relaunch, nothing counted against the device. */
static void test_usage_after_hello_stops(void **state)
{
    (void)state;
    rk_sup_seen s = exited(2, RK_EXIT_USAGE);
    s.lost_rank = 1;
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.next, RK_SUP_STOP);
    assert_int_equal(v.status, 2);
    assert_string_equal(v.kind, "usage");
    assert_int_equal(v.rank, 1);
    assert_false(v.counted);
    /* the launcher reports a killed rank's status (srun: the highest), the rank said usage */
    s = exited(2, 128 + 9);
    exit_event(&s, 0, "usage");
    v = judge(&s);
    assert_int_equal(v.next, RK_SUP_STOP);
    assert_int_equal(v.status, 2);
    assert_string_equal(v.kind, "usage");
    assert_int_equal(v.rank, 0);
    assert_false(v.counted);
    /* before any hello, the same */
    s = exited(2, RK_EXIT_USAGE);
    s.hellos = 0;
    v = judge(&s);
    assert_int_equal(v.next, RK_SUP_STOP);
    assert_int_equal(v.status, 2);
    assert_false(v.counted);
}

/* A storage error stops the job (exit 1) and is never counted, whichever rank's exit status
 * the launcher reports and whatever else was going on. */
static void test_storage_stops_uncounted(void **state)
{
    (void)state;
    /* rank 0 said so; rank 1 exited first with 1 and the launcher reported that */
    rk_sup_seen s = exited(2, RK_EXIT_FAIL);
    s.lost_rank = 1;
    exit_event(&s, 0, "storage");
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.next, RK_SUP_STOP);
    assert_int_equal(v.status, 1);
    assert_string_equal(v.kind, "storage");
    assert_int_equal(v.rank, 0);
    assert_false(v.counted);
    /* the exit status alone (a worker that sends no event) */
    s = exited(2, RK_EXIT_STORAGE);
    s.lost_rank = 0;
    v = judge(&s);
    assert_int_equal(v.next, RK_SUP_STOP);
    assert_string_equal(v.kind, "storage");
    assert_false(v.counted);
    /* during a stop (a drain's checkpoint fills the disk) */
    s = exited(2, RK_EXIT_STORAGE);
    s.stop_sent = 1;
    v = judge(&s);
    assert_int_equal(v.next, RK_SUP_STOP);
    assert_string_equal(v.kind, "storage");
    /* torn down before the launcher exited: the event is enough */
    rk_sup_seen_init(&s, 4);
    s.hellos = 4;
    exit_event(&s, 0, "storage");
    v = judge(&s);
    assert_int_equal(v.next, RK_SUP_STOP);
    assert_false(v.counted);
    /* a storage event after another exit event still stops */
    s = exited(2, RK_EXIT_COMM);
    exit_event(&s, 1, "commfail");
    s.storage_rank = 0;
    v = judge(&s);
    assert_string_equal(v.kind, "storage");
    assert_int_equal(v.rank, 0);
}

/* Exit 3 and 5 are classified from the status alone: no exit event needed. */
static void test_status_alone_classifies(void **state)
{
    (void)state;
    rk_sup_seen s = exited(4, RK_EXIT_COMM);
    s.lost_rank = 3;
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.next, RK_SUP_RELAUNCH);
    assert_string_equal(v.kind, "commfail");
    assert_int_equal(v.rank, 3);
    assert_true(v.counted);
    s.status = RK_EXIT_GUARD;
    v = judge(&s);
    assert_string_equal(v.kind, "guard_failed");
    assert_int_equal(v.rank, 3);
    assert_true(v.counted);
    s.status = RK_EXIT_FAIL;
    v = judge(&s);
    assert_string_equal(v.kind, "crash");
    s.status = 128 + 9;
    v = judge(&s);
    assert_string_equal(v.kind, "crash");
    assert_true(v.counted);
}

/* The rank blamed: the one that said it exits, else the first one lost. */
static void test_blame(void **state)
{
    (void)state;
    rk_sup_seen s = exited(4, RK_EXIT_COMM);
    s.lost_rank = 0;
    exit_event(&s, 2, "commfail");
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.rank, 2);
    /* an exit event of another kind, a status that says nothing more: the event's kind */
    s = exited(4, 128 + 15);
    exit_event(&s, 1, "guard_failed");
    v = judge(&s);
    assert_string_equal(v.kind, "guard_failed");
    assert_int_equal(v.rank, 1);
    /* nobody identified: nothing counted */
    s = exited(4, RK_EXIT_FAIL);
    v = judge(&s);
    assert_string_equal(v.kind, "crash");
    assert_int_equal(v.rank, -1);
    assert_false(v.counted);
    /* torn down (the launcher did not exit in time) after a rank vanished */
    rk_sup_seen_init(&s, 2);
    s.hellos = 2;
    s.lost_rank = 1;
    v = judge(&s);
    assert_string_equal(v.kind, "crash");
    assert_int_equal(v.rank, 1);
    assert_true(v.counted);
}

/* A worker that never said hello is "never connected", not a hang, and nobody's device. */
static void test_never_connected(void **state)
{
    (void)state;
    rk_sup_seen s;
    rk_sup_seen_init(&s, 2);
    s.hellos = 1;
    s.startup_timeout = 1;
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.next, RK_SUP_RELAUNCH);
    assert_string_equal(v.kind, "never_connected");
    assert_int_equal(v.rank, -1);
    assert_false(v.counted);
    /* the launcher exited before every rank said hello (`rk run -- false`); the rank that
     * did connect and was lost is the launcher's victim, not the culprit */
    s = exited(2, RK_EXIT_FAIL);
    s.hellos = 1;
    s.lost_rank = 0;
    v = judge(&s);
    assert_string_equal(v.kind, "never_connected");
    assert_false(v.counted);
    s = exited(1, 0);
    s.hellos = 0;
    v = judge(&s);
    assert_string_equal(v.kind, "never_connected");
    /* a rank that said it exits with a failure before the others connected: its failure */
    s = exited(2, RK_EXIT_COMM);
    s.hellos = 1;
    exit_event(&s, 0, "commfail");
    v = judge(&s);
    assert_string_equal(v.kind, "commfail");
    assert_int_equal(v.rank, 0);
}

static void test_hang(void **state)
{
    (void)state;
    rk_sup_seen s;
    rk_sup_seen_init(&s, 4);
    s.hellos = 4;
    s.hang = 1;
    s.hang_rank = 2;
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.next, RK_SUP_RELAUNCH);
    assert_string_equal(v.kind, "hang");
    assert_int_equal(v.rank, 2);
    assert_true(v.counted);
    s.hang_rank = -1; /* all equally stuck: nobody's */
    v = judge(&s);
    assert_string_equal(v.kind, "hang");
    assert_false(v.counted);
}

/* A stop the supervisor sent (drain, shrink) that the ranks obeyed: relaunch, no incident. */
static void test_clean_stop(void **state)
{
    (void)state;
    rk_sup_seen s = exited(3, RK_EXIT_STOPPED);
    s.stop_sent = 1;
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.next, RK_SUP_RELAUNCH);
    assert_null(v.kind);
    assert_false(v.counted);
    s.status = 0;
    v = judge(&s);
    assert_null(v.kind);
    /* a stop, and then a rank was killed: a crash after all */
    s.status = 128 + 9;
    s.lost_rank = 2;
    v = judge(&s);
    assert_string_equal(v.kind, "crash");
    assert_int_equal(v.rank, 2);
    /* a stop that found every rank finishing: finished */
    s = exited(3, 0);
    s.stop_sent = 1;
    s.done = 3;
    v = judge(&s);
    assert_int_equal(v.next, RK_SUP_FINISHED);
}

static void test_interrupted(void **state)
{
    (void)state;
    rk_sup_seen s = exited(2, RK_EXIT_STOPPED);
    s.stop_sent = 1;
    s.interrupted = 1;
    rk_sup_verdict v = judge(&s);
    assert_int_equal(v.next, RK_SUP_INTERRUPTED);
    assert_int_equal(v.status, 130);
    assert_null(v.kind);
    s.status = RK_EXIT_FAIL;
    s.lost_rank = 1;
    v = judge(&s);
    assert_int_equal(v.next, RK_SUP_INTERRUPTED);
}

/* The storage refusals are RK_ESTORAGE; other failures keep their codes. */
static void test_storage_errnos(void **state)
{
    (void)state;
    const int storage[] = {ENOSPC, EDQUOT, EROFS, EACCES, EPERM, EIO};
    for (size_t k = 0; k < sizeof storage / sizeof storage[0]; k++)
        assert_int_equal(rk_err_code_errno(storage[k]), RK_ESTORAGE);
    assert_int_equal(rk_err_code_errno(ENOENT), RK_ENOENT);
    assert_int_equal(rk_err_code_errno(ENOTDIR), RK_ENOENT);
    assert_int_equal(rk_err_code_errno(ENOMEM), RK_ENOMEM);
    assert_int_equal(rk_err_code_errno(EISDIR), RK_EIO);
    assert_int_equal(rk_err_code_errno(EFBIG), RK_EIO);
    assert_int_equal(rk_err_code_errno(EBADF), RK_EIO);
    assert_string_not_equal(rk_strerror(RK_ESTORAGE), rk_strerror(-1000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_knows_nothing),
        cmocka_unit_test(test_finished),
        cmocka_unit_test(test_usage_after_hello_stops),
        cmocka_unit_test(test_storage_stops_uncounted),
        cmocka_unit_test(test_status_alone_classifies),
        cmocka_unit_test(test_blame),
        cmocka_unit_test(test_never_connected),
        cmocka_unit_test(test_hang),
        cmocka_unit_test(test_clean_stop),
        cmocka_unit_test(test_interrupted),
        cmocka_unit_test(test_storage_errnos),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
