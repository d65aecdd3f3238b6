/*
 * The communicator's single-process backend and its argument checks (the MPI backend runs
 * under real mpirun processes in tests/it_dp.sh): "self" is a 1-rank world whose collectives
 * leave data as it is, an unknown backend name or a bad broadcast root is an error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "rekindle/comm.h"

static void self_backend_is_a_one_rank_world(void **state)
{
    (void)state;
    rk_comm *c = NULL;
    rk_err err = {0};
    assert_int_equal(rk_comm_open(&c, "self", &err), RK_OK);
    assert_int_equal(rk_comm_rank(c), 0);
    assert_int_equal(rk_comm_size(c), 1);
    assert_int_equal(rk_comm_local_size(c), 1);
    assert_string_equal(rk_comm_backend(c), "self");
    float f[3] = {1.5f, -2.0f, 3.25f};
    double d[2] = {0.1, 7.0};
    assert_int_equal(rk_comm_allreduce_sum_f32(c, f, 3, &err), RK_OK);
    assert_int_equal(rk_comm_allreduce_sum_f64(c, d, 2, &err), RK_OK);
    assert_float_equal(f[0], 1.5f, 0.0f);
    assert_float_equal(f[2], 3.25f, 0.0f);
    assert_float_equal(d[1], 7.0, 0.0);
    uint64_t all[1] = {0};
    assert_int_equal(rk_comm_allgather_u64(c, 42, all, &err), RK_OK);
    assert_int_equal(all[0], 42);
    assert_int_equal(rk_comm_bcast(c, f, sizeof f, 0, &err), RK_OK);
    assert_int_equal(rk_comm_barrier(c, &err), RK_OK);
    rk_comm_close(c);
}

static void broadcast_from_a_rank_outside_the_world_is_refused(void **state)
{
    (void)state;
    rk_comm *c = NULL;
    rk_err err = {0};
    assert_int_equal(rk_comm_open(&c, "self", &err), RK_OK);
    char buf[4] = "abc";
    assert_int_equal(rk_comm_bcast(c, buf, sizeof buf, 1, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "root 1"));
    assert_string_equal(buf, "abc");
    rk_comm_close(c);
}

static void unknown_backend_is_refused_by_name(void **state)
{
    (void)state;
    rk_comm *c = (rk_comm *)&c; /* must be reset to NULL */
    rk_err err = {0};
    assert_int_equal(rk_comm_open(&c, "carrier-pigeon", &err), RK_EINVAL);
    assert_null(c);
    assert_non_null(strstr(err.msg, "carrier-pigeon"));
    rk_comm_close(NULL); /* NULL-safe */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(self_backend_is_a_one_rank_world),
        cmocka_unit_test(broadcast_from_a_rank_outside_the_world_is_refused),
        cmocka_unit_test(unknown_backend_is_refused_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
