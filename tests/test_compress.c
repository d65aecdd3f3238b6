/*
 * The compressed allreduce in a 1-rank world (the N-rank comparison against a reference runs
 * under mpirun in tests/it_compress.sh): onebit gives sign x mean |x| per block of 256, a
 * block of zeros stays exact zeros, error feedback carries what the signs missed so the sum
 * of results catches up with the sum of inputs (and without it does not), residuals change
 * only on commit, fp16 pieces keep tiny and large values through their block scale, and the
 * names parse.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rekindle/comm.h"

#define N 1000 /* 3 full blocks and a short one */

static rk_comm *open_self(void)
{
    rk_comm *c = NULL;
    assert_int_equal(rk_comm_open(&c, "self", NULL), RK_OK);
    return c;
}

static void fill(float *x, size_t n, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rand() % 2001 - 1000) * 1e-4f;
}

static void onebit_is_sign_times_mean_abs_per_block(void **state)
{
    (void)state;
    rk_comm *c = open_self();
    rk_compressor *z = NULL;
    assert_int_equal(rk_compressor_create(&z, c, RK_COMPRESS_ONEBIT, N, NULL), RK_OK);
    float x[N], y[N];
    fill(x, N, 1);
    for (int i = 256; i < 512; i++)
        x[i] = 0.0f; /* block 1: all zeros */
    memcpy(y, x, sizeof x);
    assert_int_equal(rk_compressor_allreduce(z, y, 0, NULL), RK_OK);
    for (int b = 0; b < 4; b++) {
        int lo = b * 256, hi = lo + 256 > N ? N : lo + 256;
        double s = 0.0;
        for (int i = lo; i < hi; i++)
            s += fabs(x[i]);
        s /= hi - lo;
        for (int i = lo; i < hi; i++) {
            double want = signbit(x[i]) ? -s : s;
            assert_true(fabs(y[i] - want) <= 1e-6 * s + 1e-30);
            if (b == 1)
                assert_true(y[i] == 0.0f && !signbit(y[i]));
        }
    }
    rk_compressor_free(z);
    rk_comm_close(c);
}

/* Error feedback: after T steps, sum of inputs - sum of results = the residuals, so the
 * results' bias per step fades as T grows (the residuals grow slower than T); without it the
 * bias stays at the sign error and the gap grows like T. Returns the worst gap / T. */
static double tracking_gap(rk_compress kind, int steps)
{
    rk_comm *c = open_self();
    rk_compressor *z = NULL;
    assert_int_equal(rk_compressor_create(&z, c, kind, N, NULL), RK_OK);
    static double in[N], out[N];
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    float g[N];
    fill(g, N, 7); /* a fixed gradient: its small entries are what signs lose */
    for (int t = 0; t < steps; t++) {
        float y[N];
        memcpy(y, g, sizeof g);
        assert_int_equal(rk_compressor_allreduce(z, y, 0, NULL), RK_OK);
        rk_compressor_commit(z);
        for (int i = 0; i < N; i++) {
            in[i] += g[i];
            out[i] += y[i];
        }
    }
    double worst = 0.0;
    for (int i = 0; i < N; i++)
        worst = fmax(worst, fabs(in[i] - out[i]) / steps);
    if (kind == RK_COMPRESS_ONEBIT) { /* the gap is exactly the residual state */
        const float *st = rk_compressor_state(z);
        size_t cs = rk_compressor_state_len(z) / 2;
        for (int i = 0; i < N; i++)
            assert_true(fabs(in[i] - out[i] - st[i] - st[cs + (size_t)i]) < 1e-3);
    }
    rk_compressor_free(z);
    rk_comm_close(c);
    return worst;
}

static void error_feedback_makes_results_track_inputs(void **state)
{
    (void)state;
    double ef100 = tracking_gap(RK_COMPRESS_ONEBIT, 100),
           ef1600 = tracking_gap(RK_COMPRESS_ONEBIT, 1600);
    double no100 = tracking_gap(RK_COMPRESS_ONEBIT_NOEF, 100);
    double no1600 = tracking_gap(RK_COMPRESS_ONEBIT_NOEF, 1600);
    print_message("bias per step after 100 and 1600 steps: error feedback %.3g, %.3g; without "
                  "%.3g, %.3g\n",
                  ef100, ef1600, no100, no1600);
    assert_true(ef1600 < ef100 / 2.5); /* fading (measured: about 1/sqrt(T)) */
    assert_true(no1600 > 0.9 * no100); /* not fading */
    assert_true(no1600 > 20 * ef1600);
}

static void residuals_change_only_on_commit(void **state)
{
    (void)state;
    rk_comm *c = open_self();
    rk_compressor *z = NULL;
    assert_int_equal(rk_compressor_create(&z, c, RK_COMPRESS_ONEBIT, N, NULL), RK_OK);
    assert_int_equal(rk_compressor_state_len(z), 2 * 1024);
    float g[N], a[N], b[N];
    fill(g, N, 3);
    memcpy(a, g, sizeof g);
    assert_int_equal(rk_compressor_allreduce(z, a, 0, NULL), RK_OK);
    for (size_t i = 0; i < rk_compressor_state_len(z); i++)
        assert_true(rk_compressor_state(z)[i] == 0.0f);
    /* a redo (no commit) gives the same bits */
    memcpy(b, g, sizeof g);
    assert_int_equal(rk_compressor_allreduce(z, b, 0, NULL), RK_OK);
    assert_memory_equal(a, b, sizeof a);
    rk_compressor_commit(z);
    int nonzero = 0;
    for (size_t i = 0; i < N; i++)
        nonzero += rk_compressor_state(z)[i] != 0.0f;
    assert_true(nonzero > N / 2);
    /* after commit the residual is added: the next result differs */
    memcpy(b, g, sizeof g);
    assert_int_equal(rk_compressor_allreduce(z, b, 0, NULL), RK_OK);
    assert_true(memcmp(a, b, sizeof a) != 0);
    rk_compressor_free(z);
    rk_comm_close(c);
}

static void half_pieces_keep_tiny_and_large_values(void **state)
{
    (void)state;
    rk_comm *c = open_self();
    for (int k = 0; k < 2; k++) {
        rk_compress kind = k ? RK_COMPRESS_BF16 : RK_COMPRESS_FP16;
        rk_compressor *z = NULL;
        assert_int_equal(rk_compressor_create(&z, c, kind, N, NULL), RK_OK);
        assert_int_equal(rk_compressor_state_len(z), 0);
        float x[N], y[N];
        fill(x, N, 5);
        for (int i = 0; i < 256; i++)
            x[i] *= 1e-9f; /* fp16 alone would flush these to zero */
        for (int i = 256; i < 512; i++)
            x[i] *= 1e7f; /* and overflow these */
        x[600] = 0.0f;
        memcpy(y, x, sizeof x);
        assert_int_equal(rk_compressor_allreduce(z, y, 0, NULL), RK_OK);
        double rel = kind == RK_COMPRESS_FP16 ? 1.0 / 2048 : 1.0 / 256;
        for (int i = 0; i < N; i++)
            assert_true(fabs(y[i] - x[i]) <= rel * fabs(x[i]));
        assert_true(y[600] == 0.0f);
        rk_compressor_free(z);
    }
    rk_comm_close(c);
}

static void none_is_a_plain_allreduce_and_one_rank_sends_nothing(void **state)
{
    (void)state;
    rk_comm *c = open_self();
    rk_compressor *z = NULL;
    assert_int_equal(rk_compressor_create(&z, c, RK_COMPRESS_NONE, 3, NULL), RK_OK);
    float x[3] = {1.5f, -2.0f, 0.25f};
    assert_int_equal(rk_compressor_allreduce(z, x, 1, NULL), RK_OK);
    assert_true(x[0] == 1.5f && x[1] == -2.0f && x[2] == 0.25f);
    assert_int_equal(rk_compressor_bytes_per_call(z), 0);
    assert_int_equal(rk_comm_bytes_sent(c), 0);
    rk_compressor_free(z);
    rk_comm_close(c);
}

static void names_parse_and_bad_names_are_named(void **state)
{
    (void)state;
    static const char *const names[] = {"none", "fp16", "bf16", "onebit", "onebit-noef"};
    for (int i = 0; i < 5; i++) {
        rk_compress k;
        assert_int_equal(rk_compress_parse(names[i], &k, NULL), RK_OK);
        assert_string_equal(rk_compress_name(k), names[i]);
    }
    rk_err err = {0};
    rk_compress k = RK_COMPRESS_NONE;
    assert_int_equal(rk_compress_parse("2bit", &k, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "'2bit'"));
    assert_int_equal(rk_compress_parse("", &k, &err), RK_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(onebit_is_sign_times_mean_abs_per_block),
        cmocka_unit_test(error_feedback_makes_results_track_inputs),
        cmocka_unit_test(residuals_change_only_on_commit),
        cmocka_unit_test(half_pieces_keep_tiny_and_large_values),
        cmocka_unit_test(none_is_a_plain_allreduce_and_one_rank_sends_nothing),
        cmocka_unit_test(names_parse_and_bad_names_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
