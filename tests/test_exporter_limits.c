/*
 * Tests for the exporter's connection-cap policy (rk_exporter_pick_victim, src/exporter/http.c;
 * docs/exporter.md, "Limits"): nothing is closed at or under the cap; over it, the oldest
 * waiting connection that never completed a request goes first, then the oldest idle
 * kept-alive one, never one being answered, and the new connection itself only when every
 * other one is being answered; connections already closing do not count. The timing side
 * (the deadline, the flood) is tests/it_exporter_slow.sh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "exporter/exporter.h"

#define N 6

/* pick over states s[0..n), the new connection at `fresh` */
static long pick(rk_conn_state *s, size_t n, size_t fresh, unsigned cap)
{
    const rk_conn_state *p[N];
    for (size_t i = 0; i < n; i++)
        p[i] = &s[i];
    return rk_exporter_pick_victim(p, n, fresh, cap);
}

static void test_under_the_cap(void **state)
{
    (void)state;
    rk_conn_state s[N] = {{.since = 1}, {.since = 2}, {.since = 3}};
    assert_int_equal(pick(s, 3, 2, 3), -1);
    assert_int_equal(pick(s, 3, 2, 10), -1);
    /* closing ones do not count: 4 open, 1 closing, cap 3 */
    rk_conn_state t[N] = {{.since = 1, .closing = true}, {.since = 2}, {.since = 3}, {.since = 4}};
    assert_int_equal(pick(t, 4, 3, 3), -1);
}

static void test_oldest_unserved_first(void **state)
{
    (void)state;
    /* 0: served, idle, oldest; 1: unserved since 5; 2: unserved since 3; 3: busy since 1;
     * 4: new */
    rk_conn_state s[N] = {{.since = 0.5, .served = true},
                          {.since = 5},
                          {.since = 3},
                          {.since = 1, .busy = true},
                          {.since = 9}};
    assert_int_equal(pick(s, 5, 4, 4), 2);
    s[2].closing = true; /* gone: the next unserved one */
    assert_int_equal(pick(s, 5, 4, 3), 1);
}

static void test_then_idle_kept_alive(void **state)
{
    (void)state;
    /* every waiting one has been served: the one idle longest goes */
    rk_conn_state s[N] = {{.since = 4, .served = true},
                          {.since = 2, .served = true},
                          {.since = 1, .busy = true, .served = true},
                          {.since = 9}};
    assert_int_equal(pick(s, 4, 3, 3), 1);
}

static void test_never_one_being_answered(void **state)
{
    (void)state;
    /* every other connection is being answered: the new one is refused */
    rk_conn_state s[N] = {
        {.since = 1, .busy = true}, {.since = 2, .busy = true, .served = true}, {.since = 9}};
    assert_int_equal(pick(s, 3, 2, 2), 2);
    /* with a cap of 1 and nothing else waiting, still the new one, never a busy one */
    assert_int_equal(pick(s, 3, 2, 1), 2);
    /* the new one already closing and the busy ones still over the cap: nothing left to
     * close (-1, not the same connection again) */
    s[2].closing = true;
    assert_int_equal(pick(s, 3, 2, 1), -1);
}

static void test_new_one_kept_over_older_unserved(void **state)
{
    (void)state;
    /* a prompt client's connection is the newest: an older unserved one goes instead */
    rk_conn_state s[N] = {{.since = 1}, {.since = 2}, {.since = 3}};
    assert_int_equal(pick(s, 3, 2, 2), 0);
    /* the new connection need not be last in the array */
    rk_conn_state t[N] = {{.since = 9}, {.since = 2}, {.since = 3}};
    assert_int_equal(pick(t, 3, 0, 2), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_under_the_cap),
        cmocka_unit_test(test_oldest_unserved_first),
        cmocka_unit_test(test_then_idle_kept_alive),
        cmocka_unit_test(test_never_one_being_answered),
        cmocka_unit_test(test_new_one_kept_over_older_unserved),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
