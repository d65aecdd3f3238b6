/*
 * Tests for what rekindle reads from and writes to Slurm: the readers of `scontrol show node`
 * (both layouts, the reason's "[user@time]" cut, "(null)", DOWN and DRAIN) and `scontrol show
 * hostnames` (src/cluster/slurm.c), node names, and rk doctor's drain reason and gres
 * type (cli/doctor_slurm.c): one GPU, several, an unreadable one, the 255-byte bound with
 * "and N more", the bus id's short domain.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "cluster/slurm.h"
#include "doctor.h"

static const char multi[] =
    "NodeName=node3 Arch=x86_64 CoresPerSocket=1 \n"
    "   CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=0.35\n"
    "   Gres=gpu:2\n"
    "   NodeAddr=127.0.0.1 NodeHostName=vm Port=46153 Version=22.05.8\n"
    "   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n"
    "   Partitions=rk \n"
    "   Reason=rk: GPU 1 (bus 0000:01:00.0) score 35: VRM [ripple] [root@2026-12-02T04:54:35]\n";

static void node_default_layout(void **state)
{
    (void)state;
    bool drained, down;
    char reason[256], addr[64];
    assert_int_equal(
        rk_slurm_parse_node(multi, &drained, &down, reason, sizeof reason, addr, sizeof addr), 0);
    assert_true(drained);
    assert_false(down);
    assert_string_equal(reason, "rk: GPU 1 (bus 0000:01:00.0) score 35: VRM [ripple]");
    assert_string_equal(addr, "127.0.0.1");
}

static void node_oneliner(void **state)
{
    (void)state;
    const char *one = "NodeName=node1 Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=gpu1 "
                      "State=DOWN* ThreadsPerCore=1 Reason=Not responding "
                      "[slurm@2026-12-02T05:00:00] Comment=(null)\n";
    bool drained, down;
    char reason[256], addr[64];
    assert_int_equal(
        rk_slurm_parse_node(one, &drained, &down, reason, sizeof reason, addr, sizeof addr), 0);
    assert_false(drained);
    assert_true(down);
    assert_string_equal(reason, "Not responding");
    assert_string_equal(addr, "10.0.0.7");
    /* idle, no reason; a reason of "(null)" is none */
    const char *idle = "NodeName=n2 State=idle Reason=(null)\n";
    assert_int_equal(rk_slurm_parse_node(idle, &drained, &down, reason, sizeof reason, NULL, 0), 0);
    assert_false(drained);
    assert_false(down);
    assert_string_equal(reason, "");
    /* holds of someone else's: FAIL, a reboot asked for, maintenance */
    const char *fail = "NodeName=n3 State=IDLE+FAIL Reason=PSU [root@2026-12-02T05:00:00]\n";
    assert_int_equal(rk_slurm_parse_node(fail, &drained, &down, reason, sizeof reason, NULL, 0), 0);
    assert_false(drained);
    assert_true(down);
    assert_string_equal(reason, "PSU");
    const char *reboot = "NodeName=n3 State=MIXED+REBOOT_REQUESTED\n";
    assert_int_equal(rk_slurm_parse_node(reboot, &drained, &down, NULL, 0, NULL, 0), 0);
    assert_true(down);
    const char *maint = "NodeName=n3 State=IDLE+MAINT+RESERVED\n";
    assert_int_equal(rk_slurm_parse_node(maint, &drained, &down, NULL, 0, NULL, 0), 0);
    assert_true(down);
    /* a reason cut to its buffer, still ended */
    char small[8];
    assert_int_equal(rk_slurm_parse_node(multi, &drained, &down, small, sizeof small, NULL, 0), 0);
    assert_string_equal(small, "rk: GPU");
}

static void node_refused(void **state)
{
    (void)state;
    bool drained = true, down = true;
    char reason[16] = "x";
    /* scontrol's error, no node, no state: not a node */
    assert_int_equal(rk_slurm_parse_node("Node node9 not found\n", &drained, &down, reason,
                                         sizeof reason, NULL, 0),
                     -1);
    assert_false(drained);
    assert_string_equal(reason, "");
    assert_int_equal(rk_slurm_parse_node("NodeName=a Arch=x\n", &drained, &down, NULL, 0, NULL, 0),
                     -1);
    /* "XState=" is not State= */
    assert_int_equal(
        rk_slurm_parse_node("NodeName=a XState=DRAIN\n", &drained, &down, NULL, 0, NULL, 0), -1);
}

static void hostnames(void **state)
{
    (void)state;
    static char names[4][RK_SLURM_NODE_MAX];
    rk_err err = {0};
    assert_int_equal(rk_slurm_parse_hostnames("node1\nnode2\r\n\nnode3", names, 4, &err), 3);
    assert_string_equal(names[0], "node1");
    assert_string_equal(names[1], "node2");
    assert_string_equal(names[2], "node3");
    assert_int_equal(rk_slurm_parse_hostnames("a\nb c\n", names, 4, &err), -1);
    assert_string_equal(err.msg, "scontrol show hostnames: line 2 is not a node name (1 to 63 "
                                 "of A-Z a-z 0-9 . _ -)");
    assert_int_equal(rk_slurm_parse_hostnames("a\nb\nc\nd\ne\n", names, 4, &err), -1);
    assert_string_equal(err.msg, "scontrol show hostnames: more than 4 nodes");
    char longname[100];
    memset(longname, 'a', 64);
    longname[64] = '\0';
    assert_int_equal(rk_slurm_parse_hostnames(longname, names, 4, &err), -1);
    longname[63] = '\0';
    assert_int_equal(rk_slurm_parse_hostnames(longname, names, 4, &err), 1);
}

static void node_names(void **state)
{
    (void)state;
    assert_true(rk_slurm_node_name_ok("node1"));
    assert_true(rk_slurm_node_name_ok("gpu-a.rack_2"));
    assert_false(rk_slurm_node_name_ok(""));
    assert_false(rk_slurm_node_name_ok("-x"));
    assert_false(rk_slurm_node_name_ok("a b"));
    assert_false(rk_slurm_node_name_ok("node[1-3]"));
    assert_false(rk_slurm_node_name_ok("a=b"));
}

static rk_doctor_gpu gpu(int i, int score, int pass, const char *why)
{
    rk_doctor_gpu g = {.index = i, .has_score = score >= 0, .score = score, .pass = pass};
    snprintf(g.bus_id, sizeof g.bus_id, "00000000:%02X:00.0", i + 1);
    snprintf(g.why, sizeof g.why, "%s", why);
    return g;
}

static void drain_reason(void **state)
{
    (void)state;
    char r[256];
    rk_doctor_gpu g[3] = {gpu(0, 90, 1, ""), gpu(1, 41, 0, "VRM ripple 180 mV (more than 100)"),
                          gpu(2, -1, 0, "no reading succeeded")};
    assert_int_equal(rk_doctor_slurm_reason(g, 1, r, sizeof r), 0);
    assert_string_equal(r, "");
    assert_int_equal(rk_doctor_slurm_reason(g, 2, r, sizeof r), 1);
    assert_string_equal(r, "rk: GPU 1 (bus 0000:02:00.0) score 41: VRM ripple 180 mV (more than "
                           "100)");
    assert_int_equal(rk_doctor_slurm_reason(g, 3, r, sizeof r), 2);
    assert_string_equal(r, "rk: GPU 1 (bus 0000:02:00.0) score 41: VRM ripple 180 mV (more than "
                           "100); GPU 2 (bus 0000:03:00.0) unreadable: no reading succeeded");
    /* many failing: the first ones, then how many more, within the bound */
    rk_doctor_gpu many[12];
    for (int i = 0; i < 12; i++)
        many[i] = gpu(i, 10, 0, "PCIe link Gen1 x1, the card and slot can do Gen3 x16");
    int n = rk_doctor_slurm_reason(many, 12, r, sizeof r);
    assert_int_equal(n, 12);
    assert_true(strlen(r) < sizeof r);
    assert_non_null(strstr(r, " more"));
    assert_int_equal(strncmp(r, RK_SLURM_REASON_MARK, strlen(RK_SLURM_REASON_MARK)), 0);
    /* a tiny buffer: ended, not overrun */
    char t[12];
    rk_doctor_slurm_reason(g, 3, t, sizeof t);
    assert_true(strlen(t) < sizeof t);
}

static void healed_or_not(void **state)
{
    (void)state;
    char why[256];
    rk_doctor_gpu g[2] = {gpu(0, 90, 1, ""), gpu(1, 95, 1, "")};
    g[1].vrm_read = g[1].fan_vib_read = true;
    const char *r = "rk: GPU 1 (bus 0000:02:00.0) score 35 vrm_ripple: VRM ripple 180 mV (more "
                    "than 100)";
    assert_int_equal(rk_doctor_not_healed(r, g, 2, why, sizeof why), 0); /* read, and good */
    g[1].vrm_read = false; /* the sensor's file gone: no reading is not a good one */
    assert_int_equal(rk_doctor_not_healed(r, g, 2, why, sizeof why), 1);
    assert_string_equal(why, "GPU 1 was drained for its VRM ripple, and that sensor's reading is "
                             "not there now (no file, or one it could not read): not known to be "
                             "healed");
    /* another GPU's sensor missing does not matter; a finding NVML reads needs no sensor */
    g[1].vrm_read = true;
    g[0].fan_vib_read = false;
    assert_int_equal(rk_doctor_not_healed(r, g, 2, why, sizeof why), 0);
    const char *pcie = "rk: GPU 1 (bus 0000:02:00.0) score 40 pcie_downtrained: PCIe link Gen1";
    g[1].vrm_read = g[1].fan_vib_read = false;
    assert_int_equal(rk_doctor_not_healed(pcie, g, 2, why, sizeof why), 0);
    /* fan vibration, as the second GPU of a reason */
    const char *two = "rk: GPU 0 (bus 0000:01:00.0) score 40; GPU 1 (bus 0000:02:00.0) score 45 "
                      "fan_bearing: fan vibration at 520 Hz";
    assert_int_equal(rk_doctor_not_healed(two, g, 2, why, sizeof why), 1);
    assert_non_null(strstr(why, "GPU 1 was drained for its fan vibration"));
    /* the card gone from the bus */
    assert_int_equal(rk_doctor_not_healed(r, g, 1, why, sizeof why), 1);
    assert_string_equal(why, "the GPU at bus 0000:02:00.0 it was drained for is not seen");
}

static void gres_type(void **state)
{
    (void)state;
    char t[64];
    rk_doctor_gres_type("NVIDIA GeForce GTX 1070 Ti", t, sizeof t);
    assert_string_equal(t, "gtx_1070_ti");
    rk_doctor_gres_type("NVIDIA H200", t, sizeof t);
    assert_string_equal(t, "h200");
    rk_doctor_gres_type("Tesla P100-PCIE-16GB", t, sizeof t);
    assert_string_equal(t, "p100_pcie_16gb");
    rk_doctor_gres_type("", t, sizeof t);
    assert_string_equal(t, "gpu");
    char small[5];
    rk_doctor_gres_type("NVIDIA GeForce RTX 3090", small, sizeof small);
    assert_true(strlen(small) < sizeof small);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(node_default_layout), cmocka_unit_test(node_oneliner),
        cmocka_unit_test(node_refused),        cmocka_unit_test(hostnames),
        cmocka_unit_test(node_names),          cmocka_unit_test(drain_reason),
        cmocka_unit_test(healed_or_not),       cmocka_unit_test(gres_type),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
