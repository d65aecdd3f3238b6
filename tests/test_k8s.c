/*
 * Tests for the device plugin's decisions and parsers (src/k8s/dp.h): health with hysteresis
 * (a table: Unhealthy below the threshold, Healthy again only at threshold + hysteresis, the
 * first score against the threshold alone, no score is Unhealthy); the preferred allocation's
 * order (must_include first, Healthy before Unhealthy, the anchor switch, then score, and every
 * refusal); Allocate's check (unknown, below, recovering, never read); the PCIe switch of a
 * sysfs path; device ids and resource names; and every request the plugin parses, good and
 * broken, packed here with protobuf-c from the same generated messages; and the real-GPU
 * path of the fleet through a fake NVML (tests/fake_nvml.c) over a made-up sysfs, /proc and
 * /dev: UUIDs as ids, the switch, NUMA node and minor number read, the device nodes that exist.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "api.pb-c.h"
#include "health/nvml.h"
#include "k8s/dp.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void test_health_hysteresis(void **state)
{
    (void)state;
    static const struct {
        bool healthy, first, has_score;
        int score;
        bool want;
    } cases[] = {
        /* the first score: the threshold alone */
        {false, true, true, 60, true},
        {false, true, true, 59, false},
        {false, true, true, 65, true},    /* in the band, but nothing to recover from */
        {false, true, false, 100, false}, /* never read */
        /* Healthy: stays so down to the threshold */
        {true, false, true, 60, true},
        {true, false, true, 59, false},
        {true, false, true, 0, false},
        {true, false, false, 100, false}, /* lost its score (cannot happen: kept) */
        /* Unhealthy: needs threshold + hysteresis */
        {false, false, true, 60, false},
        {false, false, true, 69, false},
        {false, false, true, 70, true},
        {false, false, true, 100, true},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        bool got = rk_dp_health_next(cases[i].healthy, cases[i].first, cases[i].has_score,
                                     cases[i].score, 60, 10);
        if (got != cases[i].want)
            fail_msg("case %zu: healthy %d first %d score %d: got %d", i, cases[i].healthy,
                     cases[i].first, cases[i].score, got);
    }
    /* hysteresis 0: one threshold both ways */
    assert_true(rk_dp_health_next(false, false, true, 60, 60, 0));
    assert_false(rk_dp_health_next(true, false, true, 59, 60, 0));
}

/* A GPU whose readings keep failing: Healthy through two failed readings (the last score
 * stands), Unhealthy at the third with "no reading for 3 intervals" (and Allocate refuses it
 * saying so), Healthy again only when a good reading reaches threshold + hysteresis. */
static void test_stale_readings(void **state)
{
    (void)state;
    rk_dp_dev d;
    memset(&d, 0, sizeof d);
    snprintf(d.id, sizeof d.id, "0");
    assert_true(rk_dp_dev_update(&d, true, 90, 0, NULL, 60, 10)); /* first: Healthy */
    assert_true(d.healthy);
    assert_false(rk_dp_dev_update(&d, true, 90, 1, NULL, 60, 10));
    assert_false(rk_dp_dev_update(&d, true, 90, 2, NULL, 60, 10));
    assert_true(d.healthy);
    assert_true(rk_dp_dev_update(&d, true, 90, 3, NULL, 60, 10));
    assert_false(d.healthy);
    assert_string_equal(d.why, "no reading for 3 intervals");
    assert_false(rk_dp_dev_update(&d, true, 90, 4, NULL, 60, 10));
    assert_string_equal(d.why, "no reading for 4 intervals");
    rk_dp_status st = {RK_DP_OK, ""};
    char *ids[] = {"0"};
    assert_int_equal(rk_dp_allocate_check(&d, 1, ids, 1, 60, 10, &st), RK_DP_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "no reading for 4 intervals (last score 90)"));
    /* a good reading again: back from Unhealthy, so threshold + hysteresis */
    assert_false(rk_dp_dev_update(&d, true, 65, 0, "x: y", 60, 10));
    assert_false(d.healthy);
    assert_string_equal(d.why, "x: y");
    assert_true(rk_dp_dev_update(&d, true, 70, 0, NULL, 60, 10));
    assert_true(d.healthy);
    assert_string_equal(d.why, "");
    /* never read and failing: Unhealthy, and saying why once there are three */
    memset(&d, 0, sizeof d);
    rk_dp_dev_update(&d, false, 0, 1, NULL, 60, 10);
    assert_false(d.healthy);
    rk_dp_dev_update(&d, false, 0, 3, NULL, 60, 10);
    assert_string_equal(d.why, "no reading for 3 intervals");
}

/* A fleet: switch names, scores, health. */
static void fleet(rk_dp_dev *d, int n, const char *const *sw, const int *score, const bool *ok)
{
    memset(d, 0, sizeof *d * (size_t)n);
    for (int i = 0; i < n; i++) {
        snprintf(d[i].id, sizeof d[i].id, "%d", i);
        snprintf(d[i].sw, sizeof d[i].sw, "%s", sw[i]);
        d[i].index = i;
        d[i].has_score = true;
        d[i].score = score[i];
        d[i].healthy = ok[i];
    }
}

static void expect(const int *got, const int *want, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) {
            char g[64] = "", w[64] = "";
            for (int j = 0; j < n; j++) {
                snprintf(g + strlen(g), sizeof g - strlen(g), "%d ", got[j]);
                snprintf(w + strlen(w), sizeof w - strlen(w), "%d ", want[j]);
            }
            fail_msg("%s: got %s, want %s", what, g, w);
        }
}

static void test_prefer_order(void **state)
{
    (void)state;
    /* switch A: 0, 1; switch B: 2, 3, 4; 5 unknown */
    static const char *const sw[] = {"A", "A", "B", "B", "B", ""};
    static const int score[] = {95, 90, 99, 70, 65, 100};
    static const bool ok[] = {true, true, true, true, true, true};
    rk_dp_dev d[6];
    fleet(d, 6, sw, score, ok);
    int all[] = {0, 1, 2, 3, 4, 5}, out[6];
    rk_dp_status st;

    /* no must: the switch with the most healthy devices (B: 3), best score first there */
    assert_int_equal(rk_dp_prefer(d, 6, all, 6, NULL, 0, 2, out, &st), RK_DP_OK);
    expect(out, (int[]){2, 3}, 2, "no must, size 2");
    assert_int_equal(rk_dp_prefer(d, 6, all, 6, NULL, 0, 4, out, &st), RK_DP_OK);
    expect(out, (int[]){2, 3, 4, 5}, 4, "no must, size 4: B, then by score (5: 100)");
    /* must [1]: its switch A comes first, although B's 2 and the unknown 5 score higher */
    assert_int_equal(rk_dp_prefer(d, 6, all, 6, (int[]){1}, 1, 2, out, &st), RK_DP_OK);
    expect(out, (int[]){1, 0}, 2, "must 1");
    assert_int_equal(rk_dp_prefer(d, 6, all, 6, (int[]){1}, 1, 3, out, &st), RK_DP_OK);
    expect(out, (int[]){1, 0, 5}, 3, "must 1, size 3");
    /* must keeps its order, duplicates count once */
    assert_int_equal(rk_dp_prefer(d, 6, all, 6, (int[]){4, 0, 4}, 3, 3, out, &st), RK_DP_OK);
    expect(out, (int[]){4, 0, 2}, 3, "must 4 0 4");
    /* size 0 and size == must */
    assert_int_equal(rk_dp_prefer(d, 6, all, 6, NULL, 0, 0, out, &st), RK_DP_OK);
    assert_int_equal(rk_dp_prefer(d, 6, all, 6, (int[]){3}, 1, 1, out, &st), RK_DP_OK);
    expect(out, (int[]){3}, 1, "size == must");

    /* an unhealthy device comes last, even on the anchor switch with the best score */
    d[2].healthy = false;
    assert_int_equal(rk_dp_prefer(d, 6, all, 6, NULL, 0, 6, out, &st), RK_DP_OK);
    /* healthy per switch now: A 2, B 2; ties: the better best score (A: 95, B: 70) */
    expect(out, (int[]){0, 1, 5, 3, 4, 2}, 6, "2 unhealthy");
    /* only the available ones, duplicates once */
    int some[] = {3, 3, 2, 4};
    assert_int_equal(rk_dp_prefer(d, 6, some, 4, NULL, 0, 3, out, &st), RK_DP_OK);
    expect(out, (int[]){3, 4, 2}, 3, "available 3 3 2 4");

    /* equal scores: the lower index */
    static const char *const nosw[] = {"", "", ""};
    static const int same[] = {80, 80, 80};
    static const bool ok3[] = {true, true, true};
    rk_dp_dev e[3];
    fleet(e, 3, nosw, same, ok3);
    assert_int_equal(rk_dp_prefer(e, 3, (int[]){2, 1, 0}, 3, NULL, 0, 3, out, &st), RK_DP_OK);
    expect(out, (int[]){0, 1, 2}, 3, "ties by index");
}

static void test_prefer_refusals(void **state)
{
    (void)state;
    static const char *const sw[] = {"A", "A", "B"};
    static const int score[] = {90, 80, 70};
    static const bool ok[] = {true, true, true};
    rk_dp_dev d[3];
    fleet(d, 3, sw, score, ok);
    int all[] = {0, 1, 2}, out[8];
    rk_dp_status st;
    assert_int_equal(rk_dp_prefer(d, 3, all, 3, NULL, 0, 4, out, &st), RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "allocation_size 4"));
    assert_int_equal(rk_dp_prefer(d, 3, all, 3, NULL, 0, -1, out, &st), RK_DP_INVALID_ARGUMENT);
    assert_int_equal(rk_dp_prefer(d, 3, all, 3, (int[]){0, 1}, 2, 1, out, &st),
                     RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "smaller than must_include"));
    /* must not among the available */
    assert_int_equal(rk_dp_prefer(d, 3, (int[]){0, 1}, 2, (int[]){2}, 1, 2, out, &st),
                     RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "not available"));
    /* an index outside the fleet is not available */
    assert_int_equal(rk_dp_prefer(d, 3, (int[]){0, 7}, 2, NULL, 0, 2, out, &st),
                     RK_DP_INVALID_ARGUMENT);
}

static void test_allocate_check(void **state)
{
    (void)state;
    static const char *const sw[] = {"", "", "", ""};
    static const int score[] = {90, 35, 65, 0};
    static const bool ok[] = {true, false, false, false};
    rk_dp_dev d[4];
    fleet(d, 4, sw, score, ok);
    snprintf(d[1].why, sizeof d[1].why, "vrm_ripple: VRM ripple 150 mV");
    d[3].has_score = false;
    rk_dp_status st;
    char *good[] = {"0"}, *unknown[] = {"0", "9"}, *below[] = {"0", "1"}, *band[] = {"2"},
         *unread[] = {"3"};
    assert_int_equal(rk_dp_allocate_check(d, 4, good, 1, 60, 10, &st), RK_DP_OK);
    assert_int_equal(rk_dp_allocate_check(d, 4, unknown, 2, 60, 10, &st), RK_DP_NOT_FOUND);
    assert_non_null(strstr(st.msg, "device 9"));
    assert_int_equal(rk_dp_allocate_check(d, 4, below, 2, 60, 10, &st), RK_DP_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "device 1 "));
    assert_non_null(strstr(st.msg, "score 35 is below the threshold 60"));
    assert_non_null(strstr(st.msg, "vrm_ripple"));
    assert_int_equal(rk_dp_allocate_check(d, 4, band, 1, 60, 10, &st), RK_DP_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "score 65 has not recovered to 70"));
    assert_int_equal(rk_dp_allocate_check(d, 4, unread, 1, 60, 10, &st), RK_DP_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "no reading"));
    char *twice[] = {"0", "0"};
    assert_int_equal(rk_dp_allocate_check(d, 4, twice, 2, 60, 10, &st), RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "device 0: asked for twice"));
}

static void test_switch_key(void **state)
{
    (void)state;
    char k[128];
    /* behind a switch: the GPU's parent is a downstream port, the key its upstream port */
    assert_int_equal(rk_dp_switch_key("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/"
                                      "0000:02:08.0/0000:03:00.0",
                                      k, sizeof k),
                     RK_OK);
    assert_string_equal(k, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0");
    /* two GPUs under two downstream ports of that switch share the key */
    char k2[128];
    assert_int_equal(rk_dp_switch_key("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/"
                                      "0000:02:10.0/0000:04:00.0/",
                                      k2, sizeof k2),
                     RK_OK);
    assert_string_equal(k, k2);
    /* on a root port: the root complex */
    assert_int_equal(
        rk_dp_switch_key("/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0", k, sizeof k), RK_OK);
    assert_string_equal(k, "/sys/devices/pci0000:00");
    /* on the root bus itself, or not a PCI path: none */
    assert_int_equal(rk_dp_switch_key("/sys/devices/pci0000:00/0000:00:02.0", k, sizeof k),
                     RK_EINVAL);
    assert_string_equal(k, "");
    assert_int_equal(rk_dp_switch_key("gpu", k, sizeof k), RK_EINVAL);
    assert_int_equal(rk_dp_switch_key("", k, sizeof k), RK_EINVAL);
    assert_int_equal(rk_dp_switch_key("/a/b/c", k, sizeof k), RK_EINVAL);
    /* too long for the room given */
    assert_int_equal(rk_dp_switch_key("/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0", k, 8),
                     RK_EINVAL);
}

static void test_ids_and_resources(void **state)
{
    (void)state;
    char id63[64], id64[65];
    memset(id63, 'a', 63);
    id63[63] = '\0';
    memset(id64, 'a', 64);
    id64[64] = '\0';
    assert_true(rk_dp_id_ok("GPU-fef8089b-4820-abfc-e83e-94318197576e", 40));
    assert_true(rk_dp_id_ok("0", 1));
    assert_true(rk_dp_id_ok(id63, 63));
    assert_false(rk_dp_id_ok(id64, 64));
    assert_false(rk_dp_id_ok("", 0));
    assert_false(rk_dp_id_ok("a b", 3));
    assert_false(rk_dp_id_ok("a\nb", 3));
    assert_false(rk_dp_id_ok("\xc3\xa9", 2));
    assert_true(rk_dp_resource_ok("rekindle.io/gpu"));
    assert_true(rk_dp_resource_ok("example.com/GPU_1.x-y"));
    assert_false(rk_dp_resource_ok("gpu"));
    assert_false(rk_dp_resource_ok("/gpu"));
    assert_false(rk_dp_resource_ok("rekindle.io/"));
    assert_false(rk_dp_resource_ok("Rekindle.io/gpu"));
    assert_false(rk_dp_resource_ok("a/b/c"));
    assert_false(rk_dp_resource_ok("rekindle.io/g pu"));
}

/* ---- requests ------------------------------------------------------------------------------ */

static uint8_t buf[1 << 16];

static size_t pack_allocate(char ***ids, const size_t *nids, size_t ncont)
{
    V1beta1__AllocateRequest r = V1BETA1__ALLOCATE_REQUEST__INIT;
    V1beta1__ContainerAllocateRequest c[80], *cp[80];
    for (size_t i = 0; i < ncont; i++) {
        v1beta1__container_allocate_request__init(&c[i]);
        c[i].devices_ids = ids[i];
        c[i].n_devices_ids = nids[i];
        cp[i] = &c[i];
    }
    r.container_requests = cp;
    r.n_container_requests = ncont;
    assert_true(v1beta1__allocate_request__get_packed_size(&r) <= sizeof buf);
    return v1beta1__allocate_request__pack(&r, buf);
}

static void test_parse_allocate(void **state)
{
    (void)state;
    rk_dp_request rq;
    rk_dp_status st;
    char *a[] = {"0", "GPU-1"}, *b[] = {"2"};
    char **ids[] = {a, b};
    size_t n[] = {2, 1};
    size_t len = pack_allocate(ids, n, 2);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, buf, len, &rq, &st), RK_DP_OK);
    assert_int_equal(rq.n, 2);
    assert_int_equal(rq.c[0].nids, 2);
    assert_string_equal(rq.c[0].ids[1], "GPU-1");
    assert_string_equal(rq.c[1].ids[0], "2");
    rk_dp_request_free(&rq);
    rk_dp_request_free(&rq); /* twice: a no-op */

    /* no containers, an empty container */
    len = pack_allocate(ids, n, 0);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, buf, len, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "no container_requests"));
    size_t zero[] = {0};
    len = pack_allocate(ids, zero, 1);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, buf, len, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    /* too many containers */
    char **many[80];
    size_t nm[80];
    for (int i = 0; i < 80; i++) {
        many[i] = b;
        nm[i] = 1;
    }
    len = pack_allocate(many, nm, RK_DP_MAX_CONTAINERS + 1);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, buf, len, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "65 container_requests"));
    len = pack_allocate(many, nm, RK_DP_MAX_CONTAINERS);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, buf, len, &rq, &st), RK_DP_OK);
    rk_dp_request_free(&rq);
    /* bad ids: 64 bytes, a space, empty, a control character */
    char id64[65];
    memset(id64, 'x', 64);
    id64[64] = '\0';
    char *bad[][1] = {{id64}, {"a b"}, {""}, {"a\x01"}};
    for (size_t i = 0; i < N_OF(bad); i++) {
        char **one[] = {bad[i]};
        size_t n1[] = {1};
        len = pack_allocate(one, n1, 1);
        assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, buf, len, &rq, &st),
                         RK_DP_INVALID_ARGUMENT);
        assert_non_null(strstr(st.msg, "devices_ids[0] is not a device id"));
    }
    /* too many ids in one container */
    char **lots = calloc(RK_DP_MAX_IDS + 1, sizeof *lots);
    assert_non_null(lots);
    for (int i = 0; i <= RK_DP_MAX_IDS; i++)
        lots[i] = "7";
    char **l1[] = {lots};
    size_t nl[] = {RK_DP_MAX_IDS + 1};
    len = pack_allocate(l1, nl, 1);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, buf, len, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    free(lots);
    /* not protobuf: truncated, a wrong wire type, garbage */
    len = pack_allocate(ids, n, 2);
    for (size_t cut = 1; cut < len; cut++)
        if (rk_dp_request_parse(RK_DP_MSG_ALLOCATE, buf, cut, &rq, &st) == RK_DP_OK) {
            /* a cut at a field boundary is a shorter valid message */
            rk_dp_request_free(&rq);
        } else {
            assert_int_equal(st.code, RK_DP_INVALID_ARGUMENT);
        }
    static const uint8_t wire[] = {0x0d, 1, 2, 3, 4}; /* field 1 as a fixed32 */
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, wire, sizeof wire, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "not a valid protobuf message"));
    /* over the size bound: refused before unpacking */
    uint8_t *big = calloc(RK_DP_MAX_MSG + 1, 1);
    assert_non_null(big);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_ALLOCATE, big, RK_DP_MAX_MSG + 1, &rq, &st),
                     RK_DP_RESOURCE_EXHAUSTED);
    free(big);
}

static void test_parse_preferred_and_others(void **state)
{
    (void)state;
    rk_dp_request rq;
    rk_dp_status st;
    V1beta1__PreferredAllocationRequest r = V1BETA1__PREFERRED_ALLOCATION_REQUEST__INIT;
    V1beta1__ContainerPreferredAllocationRequest
        c = V1BETA1__CONTAINER_PREFERRED_ALLOCATION_REQUEST__INIT,
        *cp = &c;
    char *avail[] = {"0", "1", "2"}, *must[] = {"1"};
    c.available_deviceids = avail;
    c.n_available_deviceids = 3;
    c.must_include_deviceids = must;
    c.n_must_include_deviceids = 1;
    c.allocation_size = 2;
    r.container_requests = &cp;
    r.n_container_requests = 1;
    size_t len = v1beta1__preferred_allocation_request__pack(&r, buf);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_PREFERRED, buf, len, &rq, &st), RK_DP_OK);
    assert_int_equal(rq.c[0].nids, 3);
    assert_int_equal(rq.c[0].nmust, 1);
    assert_int_equal(rq.c[0].size, 2);
    rk_dp_request_free(&rq);
    c.allocation_size = -1;
    len = v1beta1__preferred_allocation_request__pack(&r, buf);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_PREFERRED, buf, len, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "allocation_size -1"));
    c.allocation_size = 2;
    must[0] = "x y";
    len = v1beta1__preferred_allocation_request__pack(&r, buf);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_PREFERRED, buf, len, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "must_include_deviceIDs[0]"));

    /* Empty: nothing, or unknown fields (protobuf skips them); garbage is refused */
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_EMPTY, NULL, 0, &rq, &st), RK_DP_OK);
    rk_dp_request_free(&rq);
    static const uint8_t unknown[] = {0x08, 0x01, 0x12, 0x01, 'x'};
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_EMPTY, unknown, sizeof unknown, &rq, &st),
                     RK_DP_OK);
    rk_dp_request_free(&rq);
    static const uint8_t broken[] = {0x12, 0x05, 'x'};
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_EMPTY, broken, sizeof broken, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_EMPTY, NULL, 3, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);

    /* PreStartContainer: ids checked, none is fine */
    V1beta1__PreStartContainerRequest p = V1BETA1__PRE_START_CONTAINER_REQUEST__INIT;
    len = v1beta1__pre_start_container_request__pack(&p, buf);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_PRESTART, buf, len, &rq, &st), RK_DP_OK);
    rk_dp_request_free(&rq);
    char *pid[] = {"a\tb"};
    p.devices_ids = pid;
    p.n_devices_ids = 1;
    len = v1beta1__pre_start_container_request__pack(&p, buf);
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_PRESTART, buf, len, &rq, &st),
                     RK_DP_INVALID_ARGUMENT);
    /* no such kind */
    assert_int_equal(rk_dp_request_parse(RK_DP_MSG_KINDS, buf, 0, &rq, &st), RK_DP_INTERNAL);
}

/* ---- the fleet over NVML ------------------------------------------------------------------ */

static void mkdirs(const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *c = p + 1; *c; c++)
        if (*c == '/') {
            *c = '\0';
            mkdir(p, 0755);
            *c = '/';
        }
    assert_true(mkdir(p, 0755) == 0 || errno == EEXIST);
}

static void put(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void test_fleet_nvml(void **state)
{
    (void)state;
    char root[512], sys[1024], proc[1024], dev[1024], gpu[2048], p[PATH_MAX];
    snprintf(root, sizeof root, "%s/k8s.XXXXXX", RK_TEST_TMPDIR);
    assert_non_null(mkdtemp(root));
    /* the fake's GPUs both say bus 00000000:01:00.0: behind a switch whose upstream port is
     * 0000:10:00.0, on NUMA node 1, minor 3 */
    snprintf(sys, sizeof sys, "%s/sys", root);
    snprintf(gpu, sizeof gpu,
             "%s/devices/pci0000:00/0000:00:01.0/0000:10:00.0/0000:11:08.0/0000:01:00.0", sys);
    mkdirs(gpu);
    snprintf(p, sizeof p, "%s/numa_node", gpu);
    put(p, "1\n");
    snprintf(p, sizeof p, "%s/bus/pci/devices", sys);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/bus/pci/devices/0000:01:00.0", sys);
    assert_int_equal(symlink(gpu, p), 0);
    snprintf(proc, sizeof proc, "%s/proc", root);
    snprintf(p, sizeof p, "%s/driver/nvidia/gpus/0000:01:00.0", proc);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/driver/nvidia/gpus/0000:01:00.0/information", proc);
    put(p, "Model: \t\t NVIDIA GeForce GTX 1070 Ti\nIRQ:   \t\t 130\nDevice Minor: \t 3\n");
    snprintf(dev, sizeof dev, "%s/dev", root);
    mkdirs(dev);
    snprintf(p, sizeof p, "%s/nvidia-uvm", dev);
    put(p, "not a device\n"); /* a regular file is no device node */
    bool nodes = true;
    static const char *const names[] = {"nvidia3", "nvidiactl"};
    for (size_t i = 0; i < N_OF(names); i++) {
        snprintf(p, sizeof p, "%s/%s", dev, names[i]);
        if (mknod(p, S_IFCHR | 0600, makedev(1, 3)))
            nodes = false;
    }

    assert_int_equal(setenv(RK_NVML_LIB_ENV, FAKE_NVML, 1), 0);
    rk_dp_fleet_opts o = {
        .threshold = 60, .hysteresis = 10, .sysfs = sys, .procdir = proc, .devdir = dev};
    rk_dp_fleet *f = NULL;
    rk_err err = {0};
    assert_int_equal(rk_dp_fleet_open(&f, &o, &err), RK_OK);
    assert_false(rk_dp_fleet_simulated(f));
    assert_string_equal(rk_dp_fleet_backend(f), "nvml");
    assert_int_equal(rk_dp_fleet_count(f), 2);
    int changed = 0;
    rk_dp_fleet_sample(f, &changed, &err);
    assert_int_equal(changed, 2); /* the first reading gives every device its health */
    const rk_dp_dev *d = rk_dp_fleet_devs(f);
    assert_string_equal(d[0].id, "GPU-00000000-1070-0000-0000-000000000000");
    assert_false(d[0].simulated);
    snprintf(p, sizeof p, "%s/devices/pci0000:00/0000:00:01.0/0000:10:00.0", sys);
    char want[PATH_MAX];
    assert_non_null(realpath(p, want));
    assert_string_equal(d[0].sw, want);
    assert_int_equal(d[0].numa, 1);
    assert_int_equal(d[0].minor, 3);
    assert_true(d[0].has_score);
    /* GPU 1 fell off the bus: it scores 0 and is Unhealthy */
    assert_true(d[1].has_score);
    assert_int_equal(d[1].score, 0);
    assert_false(d[1].healthy);
    rk_dp_fleet_sample(f, &changed, &err);
    assert_int_equal(changed, 0);
    char paths[8][RK_DP_NODE_PATH];
    int n = rk_dp_fleet_nodes(f, (int[]){0}, 1, paths, 8);
    if (nodes) {
        assert_int_equal(n, 2);
        snprintf(p, sizeof p, "%s/nvidia3", dev);
        assert_string_equal(paths[0], p);
        snprintf(p, sizeof p, "%s/nvidiactl", dev);
        assert_string_equal(paths[1], p);
    } else {
        printf("(no mknod here: the device nodes are not checked)\n");
    }
    rk_dp_fleet_close(f);

    /* the minor unknown (no /proc information): no /dev/nvidiaN, not the NVML index's
     * /dev/nvidia0, which may be another GPU */
    snprintf(p, sizeof p, "%s/driver/nvidia/gpus/0000:01:00.0/information", proc);
    assert_int_equal(unlink(p), 0);
    snprintf(p, sizeof p, "%s/nvidia0", dev);
    if (nodes && mknod(p, S_IFCHR | 0600, makedev(1, 3)))
        nodes = false;
    assert_int_equal(rk_dp_fleet_open(&f, &o, &err), RK_OK);
    d = rk_dp_fleet_devs(f);
    assert_int_equal(d[0].minor, -1);
    n = rk_dp_fleet_nodes(f, (int[]){0}, 1, paths, 8);
    if (nodes) {
        assert_int_equal(n, 1);
        snprintf(p, sizeof p, "%s/nvidiactl", dev);
        assert_string_equal(paths[0], p);
    }
    rk_dp_fleet_close(f);
    unsetenv(RK_NVML_LIB_ENV);

    /* a simulated fleet: ids are indexes, two GPUs to a simulated switch, no device nodes */
    rk_dp_fleet_opts so = {
        .sim_gpus = 3, .seed = 1, .threshold = 60, .hysteresis = 10, .devdir = dev};
    assert_int_equal(rk_dp_fleet_open(&f, &so, &err), RK_OK);
    d = rk_dp_fleet_devs(f);
    assert_string_equal(d[2].id, "2");
    assert_string_equal(d[0].sw, d[1].sw);
    assert_string_not_equal(d[1].sw, d[2].sw);
    assert_int_equal(rk_dp_fleet_nodes(f, (int[]){0, 1}, 2, paths, 8), 0);
    rk_dp_fleet_close(f);
    assert_int_equal(nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_hysteresis), cmocka_unit_test(test_prefer_order),
        cmocka_unit_test(test_prefer_refusals),   cmocka_unit_test(test_allocate_check),
        cmocka_unit_test(test_switch_key),        cmocka_unit_test(test_ids_and_resources),
        cmocka_unit_test(test_parse_allocate),    cmocka_unit_test(test_parse_preferred_and_others),
        cmocka_unit_test(test_fleet_nvml),        cmocka_unit_test(test_stale_readings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
