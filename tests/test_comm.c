/*
 * The communicator's single-process backend and its argument checks (the MPI backend runs
 * under real mpirun processes in tests/it_dp.sh): "self" is a 1-rank world whose collectives
 * leave data as it is, an unknown backend name or a bad broadcast root is an error, and
 * rk_comm_share_status in a 1-rank world returns rank 0's own status untouched.
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

/* rank 0 alone is every rank: its status comes back as it is, its words stay, nothing is
 * learned from anyone (tests/comm_check.c runs it on real ranks under mpirun) */
static void a_one_rank_world_learns_its_own_status(void **state)
{
    (void)state;
    rk_comm *c = NULL;
    rk_err err = {0};
    assert_int_equal(rk_comm_open(&c, "self", &err), RK_OK);
    int64_t data[2] = {5, 6};
    int learned = -1;
    assert_int_equal(rk_comm_share_status(c, RK_OK, data, 2, &learned, &err), RK_OK);
    assert_int_equal(learned, 0);
    assert_int_equal(data[0], 5);
    assert_int_equal(data[1], 6);
    rk_err_set(&err, RK_ENOENT, "no checkpoint here");
    learned = -1;
    assert_int_equal(rk_comm_share_status(c, RK_ENOENT, data, 1, &learned, &err), RK_ENOENT);
    assert_int_equal(learned, 0);
    assert_string_equal(err.msg, "no checkpoint here");
    rk_comm_stats st;
    rk_comm_stats_get(c, &st);
    assert_int_equal(st.calls[RK_COMM_BCAST], 0);
    rk_comm_close(c);
    /* no communicator at all: a process that trains alone */
    learned = -1;
    assert_int_equal(rk_comm_share_status(NULL, RK_EIO, NULL, 0, &learned, &err), RK_EIO);
    assert_int_equal(learned, 0);
    assert_int_equal(rk_comm_share_status(NULL, RK_OK, NULL, 0, NULL, NULL), RK_OK);
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
        cmocka_unit_test(a_one_rank_world_learns_its_own_status),
        cmocka_unit_test(unknown_backend_is_refused_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
