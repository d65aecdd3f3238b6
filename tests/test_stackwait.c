/*
 * The wait for a hung rank's stack dump (src/supervisor/stackwait.c), the one rule of rk run
 * and of a node's agent, on a real file with the caller's clock: nothing is complete until
 * the file changed and then stayed the same for RK_STACKS_STILL_S; what was there before the
 * signal is not a dump; a link is no file; the wait is over at RK_STACKS_WAIT_S either way.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "supervisor/stackwait.h"
#include "testutil.h"

static void append(const char *path, const char *text)
{
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void a_dump_is_complete_once_it_grew_and_stayed(void **state)
{
    (void)state;
    char dir[512], path[600];
    assert_int_equal(test_dir_make(dir, sizeof dir, "test_stackwait"), 0);
    snprintf(path, sizeof path, "%s/stacks-rank0-launch0.txt", dir);
    rk_stack_wait w;
    rk_stack_wait_begin(&w, path, 10.0); /* no file yet */
    assert_int_equal(w.from, 0);
    assert_int_equal(rk_stack_wait_complete(&w, path, 10.5), 0);
    append(path, "Thread 1:\n");
    assert_int_equal(rk_stack_wait_complete(&w, path, 11.0), 0); /* just changed */
    assert_int_equal(w.grew, 1);
    append(path, "  File \"x.py\", line 3\n");
    assert_int_equal(rk_stack_wait_complete(&w, path, 11.5), 0); /* still growing */
    assert_int_equal(rk_stack_wait_complete(&w, path, 11.5 + RK_STACKS_STILL_S / 2), 0);
    assert_int_equal(rk_stack_wait_complete(&w, path, 11.5 + RK_STACKS_STILL_S + 0.01), 1);
    assert_int_equal(rk_stack_wait_over(&w, path, 11.5 + RK_STACKS_STILL_S + 0.01), 1);

    /* a file of an earlier dump: its size is the start, and the same size is no dump */
    rk_stack_wait_begin(&w, path, 20.0);
    assert_int_equal(w.from, (off_t)strlen("Thread 1:\n  File \"x.py\", line 3\n"));
    assert_int_equal(rk_stack_wait_complete(&w, path, 21.0), 0);
    assert_int_equal(w.grew, 0);
    assert_int_equal(rk_stack_wait_over(&w, path, 20.0 + RK_STACKS_WAIT_S - 0.01), 0);
    assert_int_equal(rk_stack_wait_over(&w, path, 20.0 + RK_STACKS_WAIT_S), 1); /* given up */
    assert_int_equal(w.grew, 0);

    /* rewritten shorter from the start: that changed it too */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("T\n", f);
    fclose(f);
    assert_int_equal(rk_stack_wait_complete(&w, path, 22.5), 0);
    assert_int_equal(w.grew, 1);
    assert_int_equal(rk_stack_wait_complete(&w, path, 22.5 + RK_STACKS_STILL_S + 0.01), 1);

    /* a symbolic link where the file should be is no file: nothing grows */
    char link[700];
    snprintf(link, sizeof link, "%s/link.txt", dir);
    assert_int_equal(symlink(path, link), 0);
    rk_stack_wait_begin(&w, link, 30.0);
    assert_int_equal(w.from, 0);
    append(path, "more\n");
    assert_int_equal(rk_stack_wait_complete(&w, link, 31.0), 0);
    assert_int_equal(w.grew, 0);
    rm_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_dump_is_complete_once_it_grew_and_stayed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
