/*
 * Tests for the NVML backend (src/health/nvml.c) through its real dlopen/dlsym path: with no
 * library it says so (RK_ENOTSUP naming the library) and nothing crashes; against a fake
 * libnvidia-ml (tests/fake_nvml.c) it reads the canned values, leaves what a passive GeForce
 * cannot report invalid (not zero), reports a lost GPU as lost, takes the newest version of an
 * entry point when both exist and the old one when only it exists, counts Xid events, and its
 * setters pass the right arguments, check ranges and explain refusals.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "health/nvml.h"
#include "health/nvml_api.h"
#include "rekindle/health.h"

#ifndef FAKE_NVML
#error "FAKE_NVML (the fake library's path) comes from tests/CMakeLists.txt"
#endif

/* The fake's own controls, found with dlsym in the same loaded copy the backend uses. */
typedef struct fake {
    void *lib;
    void (*reset)(void);
    int (*set)(const char *key, long long v);
    long long (*get)(const char *key);
    int (*push_xid)(int dev, unsigned long long xid);
} fake;

static fake g_fake;

static void *must_sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    assert_non_null(p);
    return p;
}

/* Point RK_NVML_LIB at `path`, hold the library open (so its state lives across the
 * backend's open and close) and reset its knobs. */
static void use_fake(const char *path)
{
    assert_int_equal(setenv(RK_NVML_LIB_ENV, path, 1), 0);
    g_fake.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(g_fake.lib);
    void *p;
    p = must_sym(g_fake.lib, "fake_nvml_reset");
    memcpy(&g_fake.reset, &p, sizeof p);
    p = must_sym(g_fake.lib, "fake_nvml_set");
    memcpy(&g_fake.set, &p, sizeof p);
    p = must_sym(g_fake.lib, "fake_nvml_get");
    memcpy(&g_fake.get, &p, sizeof p);
    p = must_sym(g_fake.lib, "fake_nvml_push_xid");
    memcpy(&g_fake.push_xid, &p, sizeof p);
    g_fake.reset();
}

static void knob(const char *key, long long v)
{
    assert_int_equal(g_fake.set(key, v), 0);
}

static long long rec(const char *key)
{
    long long v = g_fake.get(key);
    assert_int_not_equal(v, -999999);
    return v;
}

static int teardown(void **state)
{
    (void)state;
    if (g_fake.lib)
        dlclose(g_fake.lib);
    memset(&g_fake, 0, sizeof g_fake);
    unsetenv(RK_NVML_LIB_ENV);
    return 0;
}

/* Open the fake as a card of NVML architecture `arch` (4 Pascal, 7 Ampere), with or
 * without clock offsets. */
static rk_nvml *open_board(long long arch, long long offsets)
{
    use_fake(FAKE_NVML);
    knob("arch", arch);
    knob("brand", arch >= 7 ? 15 : 5);
    knob("offsets", offsets);
    rk_nvml *n = NULL;
    rk_err err = {0};
    assert_int_equal(rk_nvml_open(&n, &err), RK_OK);
    return n;
}

static rk_nvml *open_fake(const char *path)
{
    use_fake(path);
    rk_nvml *n = NULL;
    rk_err err = {0};
    int rc = rk_nvml_open(&n, &err);
    if (rc)
        print_error("rk_nvml_open: %s\n", err.msg);
    assert_int_equal(rc, RK_OK);
    assert_non_null(n);
    return n;
}

/* ---- no NVML ------------------------------------------------------------------------------ */

/* A library path that does not exist: RK_ENOTSUP, one line naming the library, no handle. */
static void test_absent_library(void **state)
{
    (void)state;
    const char *path = "/nonexistent/rekindle-test/libnvidia-ml.so.1";
    assert_int_equal(setenv(RK_NVML_LIB_ENV, path, 1), 0);
    rk_nvml *n = (rk_nvml *)&n; /* must be cleared */
    rk_err err = {0};
    assert_int_equal(rk_nvml_open(&n, &err), RK_ENOTSUP);
    assert_null(n);
    assert_int_equal(err.code, RK_ENOTSUP);
    char want[256];
    snprintf(want, sizeof want, "NVML not available: %s: ", path);
    assert_memory_equal(err.msg, want, strlen(want));
    assert_non_null(strstr(err.msg, "No such file"));
    assert_null(strchr(err.msg, '\n'));

    /* The same through the telemetry interface, by name and by "auto". */
    rk_telemetry *t = NULL;
    rk_err e2 = {0};
    assert_int_equal(rk_telemetry_open(&t, "nvml", NULL, &e2), RK_ENOTSUP);
    assert_null(t);
    assert_string_equal(e2.msg, err.msg);
    assert_int_equal(rk_telemetry_open(&t, "auto", NULL, &e2), RK_ENOTSUP);
    assert_null(t);
    rk_nvml_close(NULL); /* harmless */
}

/* With no override the message names libnvidia-ml.so.1 (skipped where the driver exists). */
static void test_absent_default_name(void **state)
{
    (void)state;
    unsetenv(RK_NVML_LIB_ENV);
    void *real = dlopen(RK_NVML_LIB_DEFAULT, RTLD_NOW | RTLD_LOCAL);
    if (real) {
        dlclose(real);
        skip(); /* an NVIDIA driver is installed here */
    }
    rk_nvml *n = NULL;
    rk_err err = {0};
    assert_int_equal(rk_nvml_open(&n, &err), RK_ENOTSUP);
    const char *want = "NVML not available: libnvidia-ml.so.1: ";
    assert_memory_equal(err.msg, want, strlen(want));
    /* dlerror repeats the path; the message says it once. */
    assert_null(strstr(err.msg + strlen(want), "libnvidia-ml.so.1"));
}

/* A library that loads but is not NVML: RK_ENOTSUP naming the missing entry point. */
static void test_not_nvml(void **state)
{
    (void)state;
    assert_int_equal(setenv(RK_NVML_LIB_ENV, "libm.so.6", 1), 0);
    rk_nvml *n = NULL;
    rk_err err = {0};
    assert_int_equal(rk_nvml_open(&n, &err), RK_ENOTSUP);
    assert_null(n);
    assert_non_null(strstr(err.msg, "NVML not available: libm.so.6 has no nvmlInit_v2"));
}

/* ---- reading ------------------------------------------------------------------------------ */

static void test_reads_canned_values(void **state)
{
    (void)state;
    use_fake(FAKE_NVML);
    rk_telemetry *t = NULL;
    rk_err err = {0};
    assert_int_equal(rk_telemetry_open(&t, "nvml", NULL, &err), RK_OK);
    assert_string_equal(rk_telemetry_backend(t), "nvml");
    assert_int_equal(rk_telemetry_count(t), 2);

    rk_gpu_info info;
    assert_int_equal(rk_telemetry_info(t, 0, &info), RK_OK);
    assert_int_equal(info.index, 0);
    assert_string_equal(info.name, "NVIDIA GeForce GTX 1070 Ti");
    assert_string_equal(info.uuid, "GPU-00000000-1070-0000-0000-000000000000");
    assert_string_equal(info.serial, ""); /* GeForce: none */
    assert_string_equal(info.bus_id, "00000000:01:00.0");
    assert_false(info.simulated);
    assert_string_equal(info.backend, "nvml");

    rk_gpu_sample s;
    assert_int_equal(rk_telemetry_read(t, 0, &s, &err), RK_OK);
    assert_false(s.lost);
    assert_true(s.t > 1.6e9);
    assert_true(rk_field_valid(&s, RK_F_TEMP));
    assert_true(s.temp_c == 67);
    assert_true(rk_field_valid(&s, RK_F_POWER));
    assert_true(s.power_w > 151.233 && s.power_w < 151.235);
    assert_true(rk_field_valid(&s, RK_F_POWER_LIMIT));
    assert_true(s.power_limit_w == 180);
    assert_true(rk_field_valid(&s, RK_F_SM_CLOCK) && s.sm_mhz == 1607);
    assert_true(rk_field_valid(&s, RK_F_MEM_CLOCK) && s.mem_mhz == 4006);
    assert_true(rk_field_valid(&s, RK_F_CLOCK_REASONS));
    assert_true(rk_field_valid(&s, RK_F_UTIL) && s.util_pct == 97);
    assert_true(rk_field_valid(&s, RK_F_MEM_USED) && s.mem_used_bytes == 2ULL << 30);
    assert_true(rk_field_valid(&s, RK_F_MEM_TOTAL) && s.mem_total_bytes == 8ULL << 30);
    assert_true(rk_field_valid(&s, RK_F_PCIE_GEN) && s.pcie_gen == 3);
    assert_true(rk_field_valid(&s, RK_F_PCIE_WIDTH) && s.pcie_width == 8);
    assert_true(rk_field_valid(&s, RK_F_PCIE_GEN_MAX) && s.pcie_gen_max == 3);
    assert_true(rk_field_valid(&s, RK_F_PCIE_WIDTH_MAX) && s.pcie_width_max == 16);
    assert_true(rk_field_valid(&s, RK_F_PCIE_REPLAY) && s.pcie_replay == 12);
    assert_true(rk_field_valid(&s, RK_F_ENERGY));
    assert_true(s.energy_j > 123456.788 && s.energy_j < 123456.790);
    assert_true(rk_field_valid(&s, RK_F_XID)); /* registered, none yet */
    assert_int_equal(s.xid_count, 0);

    /* What a passive GeForce cannot report is absent, and not a made-up zero. */
    const rk_field absent[] = {RK_F_FAN,        RK_F_ECC_CORRECTED,   RK_F_ECC_UNCORRECTED,
                               RK_F_RETIRED,    RK_F_RETIRED_PENDING, RK_F_REMAPPED,
                               RK_F_VRM_RIPPLE, RK_F_FAN_VIB};
    for (size_t k = 0; k < sizeof absent / sizeof absent[0]; k++)
        if (rk_field_valid(&s, absent[k]))
            fail_msg("field %s is valid on a card that cannot report it", rk_field_name(absent[k]));
    rk_telemetry_close(t);
    assert_int_equal(rec("shutdown_calls"), 1);
    assert_int_equal(rec("event_sets"), 0); /* freed at close */
}

/* A card with ECC, a fan and page retirement: the aggregate counters and both causes. */
static void test_datacenter_fields(void **state)
{
    (void)state;
    rk_nvml *n = open_fake(FAKE_NVML);
    knob("geforce", 0);
    rk_gpu_sample s;
    rk_err err = {0};
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK);
    assert_true(rk_field_valid(&s, RK_F_FAN) && s.fan_pct == 55);
    assert_true(rk_field_valid(&s, RK_F_ECC_CORRECTED) && s.ecc_corrected == 5);
    assert_true(rk_field_valid(&s, RK_F_ECC_UNCORRECTED) && s.ecc_uncorrected == 1);
    assert_true(rk_field_valid(&s, RK_F_RETIRED));
    assert_int_equal(s.retired_pages, 3); /* 2 for single-bit errors + 1 for a double-bit */
    assert_true(rk_field_valid(&s, RK_F_RETIRED_PENDING) && s.retired_pending == 1);
    assert_true(rk_field_valid(&s, RK_F_REMAPPED) && s.remapped_rows == 4);
    rk_nvml_close(n);
}

/* GPU 1 fell off the bus: lost, RK_OK, nothing else valid; GPU 0 still reads. */
static void test_lost_gpu(void **state)
{
    (void)state;
    rk_nvml *n = open_fake(FAKE_NVML);
    assert_int_equal(rk_nvml_count(n), 2);
    rk_gpu_info info;
    assert_int_equal(rk_nvml_info(n, 1, &info), RK_OK);
    assert_int_equal(info.index, 1);
    assert_string_equal(info.name, "");
    rk_gpu_sample s;
    rk_err err = {0};
    memset(&s, 0xff, sizeof s);
    assert_int_equal(rk_nvml_read(n, 1, &s, &err), RK_OK);
    assert_true(s.lost);
    assert_int_equal(s.valid, 0);
    assert_true(s.temp_c == 0);
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK);
    assert_false(s.lost);
    assert_true(rk_field_valid(&s, RK_F_TEMP));
    assert_int_equal(rk_nvml_read(n, 2, &s, &err), RK_EINVAL);
    assert_int_equal(rk_nvml_read(n, -1, &s, &err), RK_EINVAL);
    assert_int_equal(rk_nvml_info(n, 2, &info), RK_EINVAL);

    /* read_all: the lost GPU is no error. */
    rk_nvml_close(n);
    rk_telemetry *t = NULL;
    assert_int_equal(rk_telemetry_open(&t, "nvml", NULL, &err), RK_OK);
    rk_gpu_info infos[2];
    rk_gpu_sample samples[2];
    assert_int_equal(rk_telemetry_read_all(t, infos, samples, &err), RK_OK);
    assert_false(samples[0].lost);
    assert_true(samples[1].lost);
    rk_telemetry_close(t);
}

/* Both versions exported with different answers: the newest is the one used. */
static void test_prefers_newest(void **state)
{
    (void)state;
    rk_nvml *n = open_fake(FAKE_NVML);
    assert_int_equal(rec("init_v2_calls"), 1);
    assert_int_equal(rec("init_v1_calls"), 0);
    assert_int_equal(rk_nvml_count(n), 2); /* nvmlDeviceGetCount would say 3 */
    rk_gpu_info info;
    assert_int_equal(rk_nvml_info(n, 0, &info), RK_OK);
    assert_string_equal(info.bus_id, "00000000:01:00.0"); /* _v3, not _v2 (02) or v1 (03) */
    rk_gpu_sample s;
    rk_err err = {0};
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK);
    /* ClocksEventReasons, not ThrottleReasons (0x40). */
    assert_int_equal(s.clock_reasons, RK_CLOCK_SW_POWER_CAP | RK_CLOCK_SW_THERMAL);
    assert_true(rec("wait_v2_calls") > 0);
    assert_int_equal(rec("wait_v1_calls"), 0);
    rk_nvml_close(n);
}

/* Only the first versions exist (an old driver): they are used. */
static void test_falls_back_to_old(void **state)
{
    (void)state;
    rk_nvml *n = open_fake(FAKE_NVML_OLD);
    assert_int_equal(rec("init_v1_calls"), 1);
    assert_int_equal(rk_nvml_count(n), 2);
    rk_gpu_info info;
    assert_int_equal(rk_nvml_info(n, 0, &info), RK_OK);
    assert_string_equal(info.bus_id, "0000:03:00.0"); /* the first version's busId */
    knob("geforce", 0);
    assert_int_equal(g_fake.push_xid(0, 79), 0);
    rk_gpu_sample s;
    rk_err err = {0};
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK);
    /* ThrottleReasons 0x140: the display-clock bit is not one of the RK_CLOCK_* bits. */
    assert_int_equal(s.clock_reasons, RK_CLOCK_HW_THERMAL);
    assert_true(rk_field_valid(&s, RK_F_RETIRED) && s.retired_pages == 3);
    assert_true(rk_field_valid(&s, RK_F_XID));
    assert_int_equal(s.xid_count, 1);
    assert_int_equal(s.last_xid, 79);
    assert_true(rec("wait_v1_calls") > 0);
    rk_nvml_close(n);
}

/* Xid events queue up between reads and are counted into the GPU they came from. */
static void test_xid_events(void **state)
{
    (void)state;
    rk_nvml *n = open_fake(FAKE_NVML);
    assert_int_equal(rec("registered0"), 1);
    assert_int_equal(rec("registered1"), 0); /* lost: could not register */
    rk_gpu_sample s;
    rk_err err = {0};
    assert_int_equal(g_fake.push_xid(0, 79), 0); /* fallen off the bus, on GPU 0 */
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK);
    assert_true(rk_field_valid(&s, RK_F_XID));
    assert_int_equal(s.xid_count, 1);
    assert_int_equal(s.last_xid, 79);
    assert_int_equal(g_fake.push_xid(0, 13), 0);
    assert_int_equal(g_fake.push_xid(0, 48), 0);
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK);
    assert_int_equal(s.xid_count, 3);
    assert_int_equal(s.last_xid, 48);
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK); /* nothing new */
    assert_int_equal(s.xid_count, 3);
    rk_nvml_close(n);
}

/* A driver without Xid events: the field stays invalid, no event set is made. */
static void test_xid_unsupported(void **state)
{
    (void)state;
    use_fake(FAKE_NVML);
    knob("events_supported", 0);
    rk_nvml *n = NULL;
    rk_err err = {0};
    assert_int_equal(rk_nvml_open(&n, &err), RK_OK);
    assert_int_equal(rec("event_sets"), 0);
    rk_gpu_sample s;
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK);
    assert_false(rk_field_valid(&s, RK_F_XID));
    assert_true(rk_field_valid(&s, RK_F_TEMP));
    rk_nvml_close(n);
}

/* nvmlInit fails (no kernel module) or NVML sees no GPU: RK_ENOTSUP, NVML's words, and
 * every successful init is matched by a shutdown. */
static void test_init_failures(void **state)
{
    (void)state;
    use_fake(FAKE_NVML);
    knob("init_rc", NVML_ERROR_DRIVER_NOT_LOADED);
    rk_nvml *n = NULL;
    rk_err err = {0};
    assert_int_equal(rk_nvml_open(&n, &err), RK_ENOTSUP);
    assert_null(n);
    assert_non_null(strstr(err.msg, "NVML not available"));
    assert_non_null(strstr(err.msg, "Driver Not Loaded"));
    assert_int_equal(rec("shutdown_calls"), 0);

    knob("init_rc", NVML_SUCCESS);
    knob("count", 0);
    assert_int_equal(rk_nvml_open(&n, &err), RK_ENOTSUP);
    assert_null(n);
    assert_non_null(strstr(err.msg, "no GPU"));
    assert_int_equal(rec("shutdown_calls"), 1);
}

/* One query failing with an error of its own (Unknown Error) leaves only that field invalid;
 * an error that says the GPU as a whole is unusable (needs a reset) fails the read with
 * RK_EIO naming the query and NVML's words, and leaves an empty sample, not a lost one. */
static void test_read_errors(void **state)
{
    (void)state;
    rk_nvml *n = open_fake(FAKE_NVML);
    rk_gpu_sample s;
    rk_err err = {0};
    knob("temp_rc", NVML_ERROR_UNKNOWN);
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_OK);
    assert_false(rk_field_valid(&s, RK_F_TEMP));
    assert_true(rk_field_valid(&s, RK_F_POWER));
    knob("temp_rc", NVML_ERROR_RESET_REQUIRED);
    assert_int_equal(rk_nvml_read(n, 0, &s, &err), RK_EIO);
    assert_int_equal(s.valid, 0);
    assert_false(s.lost);
    assert_non_null(strstr(err.msg, "GPU 0 (NVIDIA GeForce GTX 1070 Ti): temperature"));
    assert_non_null(strstr(err.msg, "GPU requires reset"));
    rk_nvml_close(n);
}

/* ---- setters ------------------------------------------------------------------------------ */

static void test_setters_pass_arguments(void **state)
{
    (void)state;
    rk_nvml *n = open_board(7, 1); /* an Ampere card: every setter works */
    rk_err err = {0};
    rk_nvml_settings st;
    assert_int_equal(rk_nvml_settings_get(n, 0, &st, &err), RK_OK);
    assert_true(st.sm_valid && st.sm_mhz == 1607);
    assert_true(st.sm_max_valid && st.sm_max_mhz == 1911);
    assert_true(st.power_valid && st.power_limit_mw == 180000);
    assert_true(st.power_range_valid && st.power_min_mw == 90000 && st.power_max_mw == 217000);
    assert_true(st.power_default_valid && st.power_default_mw == 180000);
    assert_true(st.persistence_valid && !st.persistence_on);

    assert_int_equal(rk_nvml_clocks_lock(n, 0, 1506, &err), RK_OK);
    assert_int_equal(rec("lock_calls"), 1);
    assert_int_equal(rec("lock_dev"), 0);
    assert_int_equal(rec("lock_min"), 1506);
    assert_int_equal(rec("lock_max"), 1506);
    assert_int_equal(rk_nvml_clocks_reset(n, 0, &err), RK_OK);
    assert_int_equal(rec("reset_calls"), 1);
    assert_int_equal(rec("reset_dev"), 0);

    assert_int_equal(rk_nvml_power_limit_set(n, 0, 150000, &err), RK_OK);
    assert_int_equal(rec("limit_dev"), 0);
    assert_int_equal(rec("limit_mw"), 150000);

    assert_int_equal(rk_nvml_persistence_set(n, 0, true, &err), RK_OK);
    assert_int_equal(rec("persistence0"), 1);
    assert_int_equal(rk_nvml_settings_get(n, 0, &st, &err), RK_OK);
    assert_true(st.persistence_on);
    assert_true(st.power_limit_mw == 150000);
    assert_int_equal(rk_nvml_persistence_set(n, 0, false, &err), RK_OK);
    assert_int_equal(rec("persistence0"), 0);

    assert_int_equal(rk_nvml_clock_offset_set(n, 0, -100, &err), RK_OK);
    assert_int_equal(rec("offset"), -100);
    assert_int_equal(rk_nvml_settings_get(n, 0, &st, &err), RK_OK);
    assert_true(st.offset_valid && st.offset_mhz == -100);
    assert_true(st.offset_range_valid && st.offset_min_mhz == -500 && st.offset_max_mhz == 1000);
    assert_int_equal(rk_nvml_clock_offset_set(n, 0, -501, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "-501 MHz is outside what the driver allows (-500..+1000"));
    assert_int_equal(rec("offset_calls"), 1);
    rk_nvml_close(n);
}

/* What each card allows, as rk tune and the score's advice see it: a Pascal GeForce locks no
 * clocks (NVML answers NOT_SUPPORTED, and the routes say so before anyone asks), sets a power
 * limit, and a clock offset only where the driver offers one; an Ampere card does all. */
static void test_routes_by_architecture(void **state)
{
    (void)state;
    rk_err err = {0};
    rk_gpu_info in;
    rk_nvml *n = open_board(4, 0);
    assert_int_equal(rk_nvml_info(n, 0, &in), RK_OK);
    assert_int_equal(in.arch, RK_ARCH_PASCAL);
    assert_string_equal(rk_gpu_arch_name(in.arch), "Pascal");
    assert_true(in.geforce);
    assert_int_equal(in.tune, RK_TUNE_KNOWN | RK_TUNE_POWER_LIMIT);
    assert_int_equal(rk_nvml_clocks_lock(n, 0, 1506, &err), RK_ENOTSUP);
    assert_non_null(strstr(err.msg, "Not Supported"));
    assert_int_equal(rk_nvml_clock_offset_set(n, 0, -100, &err), RK_ENOTSUP);
    rk_nvml_settings st;
    assert_int_equal(rk_nvml_settings_get(n, 0, &st, &err), RK_OK);
    assert_false(st.offset_valid || st.offset_range_valid);
    assert_int_equal(rec("lock_calls") + rec("offset_calls"), 0);
    /* the lost GPU was never probed: nothing known */
    assert_int_equal(rk_nvml_info(n, 1, &in), RK_OK);
    assert_int_equal(in.tune, 0u);
    rk_nvml_close(n);

    n = open_board(4, 1);
    assert_int_equal(rk_nvml_info(n, 0, &in), RK_OK);
    assert_int_equal(in.tune, RK_TUNE_KNOWN | RK_TUNE_POWER_LIMIT | RK_TUNE_CLOCK_OFFSET);
    rk_nvml_close(n);

    n = open_board(7, 1);
    assert_int_equal(rk_nvml_info(n, 0, &in), RK_OK);
    assert_int_equal(in.arch, RK_ARCH_AMPERE);
    assert_string_equal(in.name, "NVIDIA GeForce RTX 3090");
    assert_int_equal(in.tune, RK_TUNE_KNOWN | RK_TUNE_LOCK_CLOCKS | RK_TUNE_POWER_LIMIT |
                                  RK_TUNE_CLOCK_OFFSET);
    rk_nvml_close(n);
}

/* The advice follows the routes: "lock clocks" only to a card that can. */
static void test_advice_by_architecture(void **state)
{
    (void)state;
    rk_gpu_sample s;
    memset(&s, 0, sizeof s);
    rk_gpu_signals g;
    memset(&g, 0, sizeof g);
    g.throttled_power = true; /* power_capped: the finding whose advice is only a tune */
    rk_finding f[RK_MAX_FINDINGS];
    int nf = 0;
    rk_gpu_info in;
    const struct {
        long long arch, offsets;
        const char *want, *not ;
    } cases[] = {
        {4, 0, "rk tune --power-limit W; Pascal cannot lock clocks", "--lock-clocks"},
        {4, 1, "rk tune --clock-offset -100; Pascal cannot lock clocks", "--lock-clocks"},
        {7, 1, "rk tune --lock-clocks MHZ", "cannot"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        rk_nvml *n = open_board(cases[k].arch, cases[k].offsets);
        assert_int_equal(rk_nvml_info(n, 0, &in), RK_OK);
        rk_nvml_close(n);
        teardown(NULL);
        assert_int_equal(rk_health_score_gpu(&in, &s, &g, f, &nf), 100);
        assert_int_equal(nf, 1);
        assert_string_equal(f[0].code, "power_capped");
        assert_non_null(strstr(f[0].action, cases[k].want));
        assert_null(strstr(f[0].action, cases[k].not ));
    }
    in.tune = RK_TUNE_KNOWN; /* nothing settable */
    rk_health_score_gpu(&in, &s, &g, f, &nf);
    assert_non_null(strstr(f[0].action, "only a BIOS with lower clocks"));
    rk_health_score(&s, &g, f, &nf); /* no card: every route named */
    assert_non_null(strstr(f[0].action, "lock clocks lower or lower the power limit"));
}

/* Out-of-range values are refused before NVML is asked. */
static void test_setters_check_ranges(void **state)
{
    (void)state;
    rk_nvml *n = open_fake(FAKE_NVML);
    rk_err err = {0};
    assert_int_equal(rk_nvml_clocks_lock(n, 0, 2500, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "2500 MHz is above the card's maximum SM clock 1911 MHz"));
    assert_int_equal(rk_nvml_clocks_lock(n, 0, 0, &err), RK_EINVAL);
    assert_int_equal(rec("lock_calls"), 0);
    assert_int_equal(rk_nvml_power_limit_set(n, 0, 300000, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "300.0 W is outside what the card allows (90.0-217.0 W)"));
    assert_int_equal(rk_nvml_power_limit_set(n, 0, 89999, &err), RK_EINVAL);
    assert_int_equal(rk_nvml_power_limit_set(n, 0, 0, &err), RK_EINVAL);
    assert_int_equal(rec("limit_calls"), 0);
    assert_int_equal(rk_nvml_clocks_lock(n, 2, 1500, &err), RK_EINVAL);
    assert_int_equal(rk_nvml_persistence_set(n, -1, true, &err), RK_EINVAL);
    rk_nvml_settings st;
    assert_int_equal(rk_nvml_settings_get(n, 7, &st, &err), RK_EINVAL);
    rk_nvml_close(n);
}

/* NVML refuses: no permission is RK_EIO with "needs root", a card that cannot is RK_ENOTSUP,
 * a lost GPU is RK_EIO; each message carries NVML's own error string. */
static void test_setters_explain_refusals(void **state)
{
    (void)state;
    rk_nvml *n = open_fake(FAKE_NVML);
    rk_err err = {0};
    knob("set_rc", NVML_ERROR_NO_PERMISSION);
    assert_int_equal(rk_nvml_clocks_lock(n, 0, 1506, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "Insufficient Permissions"));
    assert_non_null(strstr(err.msg, "needs root"));
    assert_int_equal(rk_nvml_power_limit_set(n, 0, 150000, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "needs root"));
    assert_int_equal(rk_nvml_persistence_set(n, 0, true, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "needs root"));
    assert_int_equal(rk_nvml_clocks_reset(n, 0, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "needs root"));

    knob("set_rc", NVML_ERROR_NOT_SUPPORTED);
    assert_int_equal(rk_nvml_clocks_lock(n, 0, 1506, &err), RK_ENOTSUP);
    assert_non_null(strstr(err.msg, "GPU 0: lock clocks: NVML: Not Supported"));
    assert_non_null(strstr(err.msg, "Volta"));

    knob("set_rc", NVML_SUCCESS);
    assert_int_equal(rk_nvml_clocks_lock(n, 1, 1506, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "GPU 1"));
    assert_non_null(strstr(err.msg, "GPU is lost"));
    rk_nvml_settings st;
    assert_int_equal(rk_nvml_settings_get(n, 1, &st, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "lost"));
    assert_int_equal(rec("lock_calls"), 0);
    rk_nvml_close(n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_absent_library, teardown),
        cmocka_unit_test_teardown(test_absent_default_name, teardown),
        cmocka_unit_test_teardown(test_not_nvml, teardown),
        cmocka_unit_test_teardown(test_reads_canned_values, teardown),
        cmocka_unit_test_teardown(test_datacenter_fields, teardown),
        cmocka_unit_test_teardown(test_lost_gpu, teardown),
        cmocka_unit_test_teardown(test_prefers_newest, teardown),
        cmocka_unit_test_teardown(test_falls_back_to_old, teardown),
        cmocka_unit_test_teardown(test_xid_events, teardown),
        cmocka_unit_test_teardown(test_xid_unsupported, teardown),
        cmocka_unit_test_teardown(test_init_failures, teardown),
        cmocka_unit_test_teardown(test_read_errors, teardown),
        cmocka_unit_test_teardown(test_setters_pass_arguments, teardown),
        cmocka_unit_test_teardown(test_setters_check_ranges, teardown),
        cmocka_unit_test_teardown(test_setters_explain_refusals, teardown),
        cmocka_unit_test_teardown(test_routes_by_architecture, teardown),
        cmocka_unit_test_teardown(test_advice_by_architecture, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
