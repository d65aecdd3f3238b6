/*
 * Tests for base/proc.h: what a child of rk gets at exec. rk_proc_cloexec_from (close_range)
 * and its fallback rk_proc_cloexec_each mark every descriptor from the bound up close-on-exec
 * and leave those below alone; a helper run by rk_proc_run does not see a descriptor its
 * caller holds without O_CLOEXEC (before the fix it did: issue 30).
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/proc.h"

/* A descriptor at `at` or above, open on stdout's file and inheritable (no FD_CLOEXEC). */
static int inheritable_at(int at)
{
    int fd = fcntl(STDOUT_FILENO, F_DUPFD, at);
    assert_true(fd >= at);
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    return fd;
}

static void check_marks(void (*mark)(int))
{
    int low = inheritable_at(100), high = inheritable_at(200);
    mark(150);
    assert_int_equal(fcntl(low, F_GETFD) & FD_CLOEXEC, 0); /* below the bound: left alone */
    assert_int_equal(fcntl(high, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    assert_int_equal(fcntl(STDOUT_FILENO, F_GETFD) & FD_CLOEXEC, 0);
    close(low);
    close(high);
}

static void test_cloexec_from(void **state)
{
    (void)state;
    check_marks(rk_proc_cloexec_from);
}

static void test_cloexec_each(void **state)
{
    (void)state;
    check_marks(rk_proc_cloexec_each);
}

/* A helper program sees its stdin, stdout and stderr, not a descriptor rk left inheritable. */
static void test_helper_gets_no_descriptor(void **state)
{
    (void)state;
    int fd = inheritable_at(300);
    char script[128], out[64];
    snprintf(script, sizeof script,
             "if [ -e /proc/self/fd/%d ]; then echo held; else echo none; fi", fd);
    char *argv[] = {"sh", "-c", script, NULL};
    assert_int_equal(rk_proc_run(argv, out, sizeof out, 30.0, 0), 0);
    assert_string_equal(out, "none\n");
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0); /* the caller's own is as it was */
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cloexec_from),
        cmocka_unit_test(test_cloexec_each),
        cmocka_unit_test(test_helper_gets_no_descriptor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
