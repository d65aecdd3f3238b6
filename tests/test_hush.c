/*
 * Tests for the rate limit of the log lines strangers can cause (src/base/hush.h): the first
 * few of a window shown, the rest counted and the count said once, when the window ended; a
 * quiet window says nothing; nothing counted is lost when lines go on after the window ended
 * before its count was taken; the wait for the count, for a loop's poll.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/hush.h"

static void test_burst_then_count(void **state)
{
    (void)state;
    rk_hush h = {0};
    int shown = 0;
    for (int i = 0; i < 100; i++) /* 100 lines in 1 s */
        shown += rk_hush_pass(&h, 100.0 + i * 0.01, 5, 10.0);
    assert_int_equal(shown, 5);
    assert_int_equal(rk_hush_due(&h, 105.0, 10.0), 0); /* the window has not ended */
    assert_true(rk_hush_wait(&h, 105.0, 10.0) > 4.99);
    assert_true(rk_hush_wait(&h, 105.0, 10.0) < 5.01);
    assert_int_equal(rk_hush_wait(&h, 111.0, 10.0), 0);
    assert_int_equal(rk_hush_due(&h, 110.0, 10.0), 95); /* said once */
    assert_int_equal(rk_hush_due(&h, 110.0, 10.0), 0);
    assert_int_equal(rk_hush_wait(&h, 110.0, 10.0), -1);
    /* the next line starts a new window */
    assert_int_equal(rk_hush_pass(&h, 120.0, 5, 10.0), 1);
}

static void test_quiet_window(void **state)
{
    (void)state;
    rk_hush h = {0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(rk_hush_pass(&h, 1.0 + i, 5, 10.0), 1);
    assert_int_equal(rk_hush_wait(&h, 5.0, 10.0), -1); /* nothing held: no count to wait for */
    assert_int_equal(rk_hush_due(&h, 50.0, 10.0), 0);
    for (int i = 0; i < 5; i++) /* a new window, a fresh burst */
        assert_int_equal(rk_hush_pass(&h, 60.0, 5, 10.0), 1);
    assert_int_equal(rk_hush_pass(&h, 60.0, 5, 10.0), 0);
}

static void test_nothing_lost_after_the_window(void **state)
{
    (void)state;
    rk_hush h = {0};
    for (int i = 0; i < 8; i++)
        rk_hush_pass(&h, 0.0, 5, 10.0); /* 5 shown, 3 held */
    /* lines after the window ended, before its count was taken: counted with it */
    assert_int_equal(rk_hush_pass(&h, 12.0, 5, 10.0), 0);
    assert_int_equal(rk_hush_pass(&h, 13.0, 5, 10.0), 0);
    assert_int_equal(rk_hush_due(&h, 13.0, 10.0), 5);
    assert_int_equal(rk_hush_pass(&h, 13.0, 5, 10.0), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_then_count),
        cmocka_unit_test(test_quiet_window),
        cmocka_unit_test(test_nothing_lost_after_the_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
