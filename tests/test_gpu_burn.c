/*
 * rk burn's decisions on the CPU (gpu/burn.h): the verdict and the state-file record made from
 * a burn's counts (a clean burn is OK; each kind of fault found — a wrong SGEMM copy, a memory
 * test's wrong words, a driver error — makes it FAULTY and is named), the record written with
 * rk_burn_state_put and read back, and the autotune cache's parser, writer and reader.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/burn.h"
#include "gpu/ref.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_gpu_burn")

static rk_burn_result clean(void)
{
    rk_burn_result r;
    rk_burn_result_init(&r);
    r.ran = true;
    r.duration_s = 60;
    r.n = 2048;
    r.copies = 16;
    r.rounds = 10;
    r.gflops = 5000;
    for (int t = 0; t < RK_MT_TESTS; t++)
        r.mt_passes[t] = 3;
    return r;
}

static void test_clean_is_ok(void **state)
{
    (void)state;
    rk_burn_result r = clean();
    char failed[160] = "x";
    assert_true(rk_burn_verdict(&r, failed, sizeof failed));
    assert_string_equal(failed, "");
}

static void test_no_round_is_not_ok(void **state)
{
    (void)state;
    rk_burn_result r = clean();
    r.rounds = 0;
    char failed[160];
    assert_false(rk_burn_verdict(&r, failed, sizeof failed));
    assert_string_equal(failed, "sgemm: no round completed");
}

static void test_sgemm_fault_named(void **state)
{
    (void)state;
    rk_burn_result r = clean();
    r.wrong_elements = 12;
    r.copy_wrong[3] = r.copy_wrong[7] = 1;
    char failed[160];
    assert_false(rk_burn_verdict(&r, failed, sizeof failed));
    assert_string_equal(failed, "sgemm: 12 elements wrong in copies 3,7");
}

static void test_memory_fault_named(void **state)
{
    (void)state;
    rk_burn_result r = clean();
    r.mt_bad[RK_MT_INVERSIONS] = 4;
    r.mt_first[RK_MT_INVERSIONS] = 1234;
    char failed[160];
    assert_false(rk_burn_verdict(&r, failed, sizeof failed));
    assert_string_equal(failed, "memory: moving inversions 4 words wrong (first at word 1234)");
    r.wrong_elements = 1;
    r.copy_wrong[1] = 1;
    r.mt_bad[RK_MT_LINES] = 2;
    r.mt_first[RK_MT_LINES] = 0;
    assert_false(rk_burn_verdict(&r, failed, sizeof failed));
    assert_string_equal(failed, "sgemm: 1 elements wrong in copies 1; memory: address lines 2 "
                                "words wrong (first at word 0), moving inversions 4 words wrong "
                                "(first at word 1234)");
}

static void test_driver_error_and_cut(void **state)
{
    (void)state;
    rk_burn_result r = clean();
    snprintf(r.run_error, sizeof r.run_error,
             "cuCtxSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access");
    char failed[160];
    assert_false(rk_burn_verdict(&r, failed, sizeof failed));
    assert_non_null(strstr(failed, "driver error: cuCtxSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS"));
    char small[24];
    assert_false(rk_burn_verdict(&r, small, sizeof small));
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_string_equal(small + sizeof small - 4, "...");
    /* a burn that did not run is not OK, and makes no record */
    rk_burn_result nr;
    rk_burn_result_init(&nr);
    snprintf(nr.setup_error, sizeof nr.setup_error, "built without GPU kernels");
    assert_false(rk_burn_verdict(&nr, failed, sizeof failed));
    rk_burn_record rec;
    rk_err err = {0};
    assert_int_equal(rk_burn_record_make(&nr, "123", "GPU-x", "m", 1, &rec, &err), RK_EINVAL);
}

static void test_record_roundtrip(void **state)
{
    (void)state;
    rk_burn_result r = clean();
    rk_burn_record rec;
    rk_err err = {0};
    /* no key */
    assert_int_equal(rk_burn_record_make(&r, "", NULL, "m", 1, &rec, &err), RK_EINVAL);
    /* serial preferred over the UUID */
    assert_int_equal(rk_burn_record_make(&r, "", "GPU-abc", "NVIDIA T", 1e9, &rec, &err), RK_OK);
    assert_string_equal(rec.key, "GPU-abc");
    r.mt_bad[RK_MT_RANDOM] = 5;
    r.mt_bad[RK_MT_OWN] = 2;
    r.wrong_elements = 9;
    r.copy_wrong[2] = 1;
    assert_int_equal(rk_burn_record_make(&r, "0324", "GPU-abc", "NVIDIA T", 1e9, &rec, &err),
                     RK_OK);
    assert_string_equal(rec.key, "0324");
    assert_false(rec.ok);
    assert_int_equal(rec.wrong_elements, 9);
    assert_int_equal(rec.bad_addresses, 7);
    assert_true(rec.gflops == 5000);
    char path[600];
    snprintf(path, sizeof path, "%s/burn.json", g_dir);
    assert_int_equal(rk_burn_state_put(path, &rec, &err), RK_OK);
    rk_burn_state *s = NULL;
    assert_int_equal(rk_burn_state_load(path, &s, &err), RK_OK);
    const rk_burn_record *got = rk_burn_state_find(s, "0324", NULL);
    assert_non_null(got);
    assert_false(got->ok);
    assert_string_equal(got->failed, rec.failed);
    rk_burn_state_free(s);
}

static void test_tune_cache(void **state)
{
    (void)state;
    rk_err err = {0};
    int v = -1;
    double g = -1;
    const char good[] = "rekindle-sgemm-tune 1\nvariant rk_sgemm_64x64x8_4x4\ngflops 123.5\n";
    assert_int_equal(rk_burn_tune_parse("f", good, strlen(good), &v, &g, &err), RK_OK);
    assert_int_equal(v, rk_sgemm_variant_find("rk_sgemm_64x64x8_4x4"));
    assert_true(g == 123.5);
    const char *bad[] = {
        "",
        "rekindle-sgemm-tune 2\nvariant rk_sgemm_64x64x8_4x4\ngflops 1\n",
        "rekindle-sgemm-tune 1\nvariant rk_sgemm_1x1x1_1x1\ngflops 1\n",
        "rekindle-sgemm-tune 1\nvariant rk_sgemm_64x64x8_4x4\n",
        "rekindle-sgemm-tune 1\nvariant rk_sgemm_64x64x8_4x4\ngflops -1\n",
        "rekindle-sgemm-tune 1\nvariant rk_sgemm_64x64x8_4x4\ngflops nan\n",
        "rekindle-sgemm-tune 1\nvariant rk_sgemm_64x64x8_4x4\ngflops 1\ncolor red\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(rk_burn_tune_parse("f", bad[i], strlen(bad[i]), &v, &g, &err), RK_EFORMAT);
    char dir[600], path[1024];
    snprintf(dir, sizeof dir, "%s/cache/rekindle", g_dir);
    rk_burn_tune_path(path, sizeof path, dir, "NVIDIA GeForce GTX 1070 Ti", 6, 1);
    assert_non_null(strstr(path, "/sgemm-NVIDIA_GeForce_GTX_1070_Ti-sm61.tune"));
    assert_int_equal(rk_burn_tune_load(path, &v, &g, &err), RK_ENOENT);
    assert_int_equal(rk_burn_tune_save(path, 2, 4321.0, &err), RK_OK);
    assert_int_equal(rk_burn_tune_load(path, &v, &g, &err), RK_OK);
    assert_int_equal(v, 2);
    assert_true(g == 4321.0);
    /* a directory at the cache file's name is refused, not read */
    assert_int_equal(rk_burn_tune_load(dir, &v, &g, &err), RK_EINVAL);
}

static void test_plan(void **state)
{
    (void)state;
    int n = 0, copies = 0;
    uint64_t region = 0;
    const uint64_t MiB = 1 << 20, GiB = MiB << 10;
    /* 72 GiB (90% of an H100's free memory): n 4096, the copies capped, the rest tested too */
    assert_true(rk_burn_plan(72 * GiB, &n, &copies, &region));
    assert_int_equal(n, 4096);
    assert_int_equal(copies, RK_BURN_COPIES_MAX);
    assert_true(region <= 72 * GiB - 2 * 64 * MiB && region > 71 * GiB && region % 256 == 0);
    /* 7 GiB (a 1070 Ti): still n 4096, 110 copies of 64 MiB beside A and B */
    assert_true(rk_burn_plan(7 * GiB, &n, &copies, &region));
    assert_int_equal(n, 4096);
    assert_int_equal(copies, (int)((7 * GiB - 128 * MiB - 4096) / (64 * MiB)));
    assert_true((uint64_t)copies * 64 * MiB <= region);
    /* just under 4 matrices of 4096: n drops to 2048 */
    assert_true(rk_burn_plan(256 * MiB, &n, &copies, &region));
    assert_int_equal(n, 2048);
    assert_true(copies >= 2 && 2 * 16 * MiB + region <= 256 * MiB);
    /* too little for n = 512 (4 MiB + 4 KiB) */
    assert_false(rk_burn_plan(4 * MiB, &n, &copies, &region));
    assert_true(rk_burn_plan(4 * MiB + 4096, &n, &copies, &region));
    assert_int_equal(n, 512);
    assert_int_equal(copies, 2);
}

static void test_reasons(void **state)
{
    (void)state;
    char buf[128];
    assert_string_equal(rk_burn_reasons_str(0, buf, sizeof buf), "none");
    assert_string_equal(
        rk_burn_reasons_str(RK_CLOCK_SW_POWER_CAP | RK_CLOCK_HW_SLOWDOWN, buf, sizeof buf),
        "sw_power_cap,hw_slowdown");
    assert_string_equal(rk_burn_mt_name(RK_MT_RANDOM), "random");
    assert_null(rk_burn_mt_name(RK_MT_TESTS));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_is_ok),
        cmocka_unit_test(test_no_round_is_not_ok),
        cmocka_unit_test(test_sgemm_fault_named),
        cmocka_unit_test(test_memory_fault_named),
        cmocka_unit_test(test_driver_error_and_cut),
        cmocka_unit_test_setup_teardown(test_record_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tune_cache, setup, teardown),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_reasons),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
