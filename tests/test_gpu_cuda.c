/*
 * The CUDA driver wrapper's parts that run without a GPU (src/gpu/cuda.c): matching CUDA's
 * PCI bus ids to NVML's, and the one clear line when libcuda.so.1 is missing or is not a CUDA
 * driver (through the real dlopen path, pointed elsewhere with RK_CUDA_LIB). On a machine with
 * a driver, that it opens and lists its devices.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/cuda.h"
#include "gpu/kernels.h"

/* CUDA writes "0000:01:00.0", NVML "00000000:01:00.0": the same card. */
static void test_bus_id_equal(void **state)
{
    (void)state;
    assert_true(rk_cuda_bus_id_equal("0000:01:00.0", "00000000:01:00.0"));
    assert_true(rk_cuda_bus_id_equal("0000:AF:00.0", "00000000:af:00.0"));
    assert_true(rk_cuda_bus_id_equal("01:00.0", "0000:01:00.0")); /* no domain: 0 */
    assert_true(rk_cuda_bus_id_equal("0001:3b:1f.7", "00000001:3B:1F.7"));
    assert_false(rk_cuda_bus_id_equal("0000:01:00.0", "00000000:02:00.0"));
    assert_false(rk_cuda_bus_id_equal("0000:01:00.0", "00000000:01:00.1"));
    assert_false(rk_cuda_bus_id_equal("0001:01:00.0", "00000000:01:00.0"));
    /* what does not parse matches nothing, itself included */
    const char *bad[] = {"",
                         "0000:01:00",
                         "0000:01:00.",
                         "0000:0g:00.0",
                         "x",
                         "0000:01:00.0 ",
                         "0000::00.0",
                         "000000000:01:00.0",
                         "0000:01:00.000",
                         NULL};
    for (int i = 0; bad[i]; i++) {
        assert_false(rk_cuda_bus_id_equal(bad[i], bad[i]));
        assert_false(rk_cuda_bus_id_equal(bad[i], "0000:01:00.0"));
    }
    assert_false(rk_cuda_bus_id_equal(NULL, "0000:01:00.0"));
}

/* No driver: RK_ENOTSUP and one line saying so, naming the library. */
static void test_no_driver(void **state)
{
    (void)state;
    setenv(RK_CUDA_LIB_ENV, "/nonexistent/libcuda.so.1", 1);
    rk_cuda *c = (rk_cuda *)1;
    rk_err err = {0};
    assert_int_equal(rk_cuda_open(&c, &err), RK_ENOTSUP);
    assert_null(c);
    assert_non_null(strstr(err.msg, "no CUDA driver (/nonexistent/libcuda.so.1 not found): "));
    assert_null(strchr(err.msg, '\n'));
    unsetenv(RK_CUDA_LIB_ENV);
}

/* A library that loads but is not a CUDA driver: named, with the entry point it lacks. */
static void test_not_a_driver(void **state)
{
    (void)state;
    setenv(RK_CUDA_LIB_ENV, "libm.so.6", 1);
    rk_cuda *c = NULL;
    rk_err err = {0};
    assert_int_equal(rk_cuda_open(&c, &err), RK_ENOTSUP);
    assert_null(c);
    assert_non_null(strstr(err.msg, "libm.so.6 has no cuInit"));
    unsetenv(RK_CUDA_LIB_ENV);
}

/* The PTX chosen per architecture: none before Pascal's 6.1. */
static void test_ptx_for(void **state)
{
    (void)state;
    if (!rk_gpu_kernels_built) {
        assert_null(rk_gpu_ptx_for(8, 0));
        skip();
    }
    assert_ptr_equal(rk_gpu_ptx_for(6, 1), rk_gpu_ptx_sm61);
    assert_ptr_equal(rk_gpu_ptx_for(7, 5), rk_gpu_ptx_sm61);
    assert_ptr_equal(rk_gpu_ptx_for(8, 0), rk_gpu_ptx_sm80);
    assert_ptr_equal(rk_gpu_ptx_for(9, 0), rk_gpu_ptx_sm80);
    assert_null(rk_gpu_ptx_for(6, 0));
    assert_null(rk_gpu_ptx_for(5, 2));
    assert_non_null(strstr(rk_gpu_ptx_sm61, ".target sm_61"));
    assert_non_null(strstr(rk_gpu_ptx_sm80, ".target sm_80"));
    assert_non_null(strstr(rk_gpu_ptx_sm80, ".entry rk_sgemm_128x128x8_8x8("));
}

/* With a driver (a GPU machine): it opens, every device reads, and a kernel module loads. */
static void test_real_driver(void **state)
{
    (void)state;
    rk_cuda *c = NULL;
    rk_err err = {0};
    int st = rk_cuda_open(&c, &err);
    if (st == RK_ENOTSUP) {
        print_message("skipped: %s\n", err.msg);
        skip();
    }
    assert_int_equal(st, RK_OK);
    int n = 0;
    assert_int_equal(rk_cuda_device_count(c, &n, &err), RK_OK);
    for (int i = 0; i < n; i++) {
        rk_cuda_device d;
        assert_int_equal(rk_cuda_device_get(c, i, &d, &err), RK_OK);
        assert_true(d.name[0] != '\0');
        assert_true(d.total_mem > 0);
        const char *ptx = rk_gpu_ptx_for(d.cc_major, d.cc_minor);
        if (!ptx)
            continue;
        rk_cuda_ctx *x = NULL;
        assert_int_equal(rk_cuda_ctx_open(c, i, &x, &err), RK_OK);
        rk_cuda_module *m = NULL;
        assert_int_equal(rk_cuda_module_load(x, ptx, &m, &err), RK_OK);
        rk_cuda_fn f;
        assert_int_equal(rk_cuda_kernel(m, "rk_compare", &f, &err), RK_OK);
        assert_int_equal(rk_cuda_kernel(m, "no_such_kernel", &f, &err), RK_ENOENT);
        rk_cuda_module_unload(m);
        rk_cuda_ctx_close(x);
    }
    rk_cuda_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bus_id_equal), cmocka_unit_test(test_no_driver),
        cmocka_unit_test(test_not_a_driver), cmocka_unit_test(test_ptx_for),
        cmocka_unit_test(test_real_driver),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
