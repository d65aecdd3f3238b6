/*
 * rk doctor: a health check of this node's GPUs. Reads each GPU a few times (for rates and
 * dT/dt) through the health monitor (rekindle/monitor.h, docs/health.md), which scores them,
 * and prints a table or JSON; exit status 1 when any GPU scores below the threshold or could
 * not be read, so scripts and schedulers can gate on it. With --predictor its readings also
 * feed the failure predictor's windows (predict/predict_online.h); a check too short to fill
 * them says so.
 */
#include <cblas.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "cluster/slurm.h"
#include "doctor.h"
#include "health/sim.h"
#include "predict/predict.h"
#include "predict/predict_online.h"
#include "progress.h"
#include "rekindle/health.h"
#include "rekindle/monitor.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk doctor [--sim N [--seed S] [--age HOURS] [--sim-load idle|busy]\n"
    "                 [--sim-sensors]] [--json] [--threshold T]\n"
    "                 [--textfile-dir DIR] [--samples K] [--interval DURATION]\n"
    "                 [--predictor MODEL]\n"
    "                 [--slurm [--node NAME] [--dry-run] [--scontrol PATH] | --gres]\n"
    "\n"
    "Score each GPU of this node 0-100 (docs/health.md) and say what to fix.\n"
    "\n"
    "  --sim N             a simulated fleet of N GPUs instead of NVML (marked as simulated)\n"
    "  --seed S            the simulated fleet's seed (default 1)\n"
    "  --age HOURS         hours of service before the check, on top of each simulated\n"
    "                      profile's own wear (default 0)\n"
    "  --sim-load LOAD     what the simulated GPUs run: idle (the default: a node nobody\n"
    "                      uses) or busy (a job: 85% of 10-minute slots at 90-100%)\n"
    "  --sim-sensors       the simulated GPUs also report VRM ripple and fan vibration, as\n"
    "                      if a sensor kit were fitted (default: only what NVML reports)\n"
    "  --json              the same as JSON on stdout\n"
    "  --threshold T       a GPU below T fails (default 60)\n"
    "  --textfile-dir DIR  also read sensors NVML cannot (VRM ripple, fan vibration) from\n"
    "                      node_exporter textfiles in DIR (docs/textfile.md)\n"
    "  --samples K         readings per GPU, for rates and dT/dt (default 5)\n"
    "  --interval DURATION between readings (default 0.5; a simulated fleet ages 120x faster)\n"
    "  --predictor MODEL   also ask this failure predictor (rk predict; docs/predict.md). It\n"
    "                      reads one row a minute over its window (60 minutes by default): a\n"
    "                      short check cannot fill it, and then says so rather than\n"
    "                      guess (a simulated fleet: --samples 61 fills 60 minutes; real GPUs:\n"
    "                      --samples 61 --interval 60, or watch with rk exporter --predictor)\n"
    "  --slurm             also act as Slurm's HealthCheckProgram (docs/slurm.md): drain this\n"
    "                      node when a GPU fails (scontrol update state=drain, the reason\n"
    "                      \"rk: GPU 2 (bus ...) score 41: ...\"), resume it when every GPU\n"
    "                      passes again, but only a drain of its own (an administrator's is\n"
    "                      left alone)\n"
    "  --node NAME         the node's Slurm name (default: $SLURMD_NODENAME, which slurmd\n"
    "                      sets for its health check); with --gres: NodeName= on each line\n"
    "  --dry-run           with --slurm: say what it would run, change nothing\n"
    "  --scontrol PATH     with --slurm: the scontrol to run (default: scontrol in PATH)\n"
    "  --gres              print a gres.conf for the GPUs that pass (File=, Type= from the\n"
    "                      model name), leaving out the ones that fail, and nothing else\n"
    "  -h, --help          show this help\n"
    "\n"
    "For NVIDIA GPUs the Xids since boot are read from the kernel log (/dev/kmsg, else\n"
    "journalctl -k; docs/health.md) and each GPU's last burn-in from the burn state file\n"
    "($RK_BURN_STATE, default /var/lib/rekindle/burn.json; docs/burn.md).\n"
    "\n"
    "Exit status: 0 every GPU at or above the threshold, 1 one or more below it or unreadable\n"
    "(or no GPU at all; with --slurm also when the node's state could not be read or\n"
    "changed), 2 bad usage or a model file it cannot use.\n";

#define usage_error(...) rk_cli_usage_error("doctor", usage_text, __VA_ARGS__)

static rk_args args = {.cmd = "doctor", .usage = usage_text};

/* Load the failure predictor and check that live readings can feed it; NULL (after one line
 * naming the file) when it cannot be used. */
static rk_pred_model *load_predictor(const char *path)
{
    rk_err err = {0};
    rk_pred_model *m = NULL;
    int rc = rk_pred_load(&m, path, &err);
    if (rc == RK_ENOENT) {
        fprintf(stderr, "rk doctor: --predictor %s: no such file\n", path);
        return NULL;
    }
    if (rc) {
        fprintf(stderr, "rk doctor: --predictor: %s\n", err.msg[0] ? err.msg : rk_strerror(rc));
        return NULL;
    }
    rk_pred_online *probe = NULL;
    if (rk_pred_online_create(&probe, m, 1, &err)) {
        fprintf(stderr, "rk doctor: --predictor %s: %s\n", path, err.msg);
        rk_pred_free(m);
        return NULL;
    }
    rk_pred_online_free(probe);
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    return m;
}

#ifndef RK_VERSION
#define RK_VERSION "unknown"
#endif

/* Per-Xid counts (rekindle/health.h's xids[], helper "xid"'s part of issue 18): JSON and the
 * table's "(79 x2, 48 x1)" in this one place; nothing while the sample has no such array. */
static void xids_json(json_t *o, const rk_gpu_sample *s)
{
#ifdef RK_XID_SLOTS
    json_t *a = json_array();
    for (int k = 0; k < s->nxids && k < RK_XID_SLOTS; k++) {
        json_t *x = json_object();
        json_object_set_new(x, "xid", json_integer(s->xids[k].xid));
        json_object_set_new(x, "count", json_integer((json_int_t)s->xids[k].count));
        json_array_append_new(a, x);
    }
    json_object_set_new(o, "xids", a);
#else
    (void)o;
    (void)s;
#endif
}

static void xids_text(char *buf, size_t cap, const rk_gpu_sample *s)
{
    buf[0] = 0;
#ifdef RK_XID_SLOTS
    size_t used = 0;
    for (int k = 0; k < s->nxids && k < RK_XID_SLOTS && used + 1 < cap; k++) {
        int w = snprintf(buf + used, cap - used, "%s%d x%llu", k ? ", " : " (", s->xids[k].xid,
                         (unsigned long long)s->xids[k].count);
        if (w < 0 || (size_t)w >= cap - used)
            break;
        used += (size_t)w;
    }
    if (used && used + 1 < cap)
        snprintf(buf + used, cap - used, ")");
#else
    (void)cap;
    (void)s;
#endif
}

/* The readings a GPU was judged on, as JSON with units in the keys (docs/doctor-json.md):
 * counts and bytes exact integers, absent fields absent. */
static json_t *readings_json(const rk_gpu_sample *s)
{
    json_t *o = json_object();
    if (s->lost) {
        json_object_set_new(o, "lost", json_true());
        return o;
    }
    const struct {
        rk_field f;
        const char *key;
        double v;
        double scale;
    } reals[] = {
        {RK_F_TEMP, "temp_c", s->temp_c, 1},
        {RK_F_POWER, "power_w", s->power_w, 1},
        {RK_F_POWER_LIMIT, "power_limit_w", s->power_limit_w, 1},
        {RK_F_FAN, "fan_pct", s->fan_pct, 1},
        {RK_F_SM_CLOCK, "sm_clock_mhz", s->sm_mhz, 1},
        {RK_F_MEM_CLOCK, "mem_clock_mhz", s->mem_mhz, 1},
        {RK_F_UTIL, "util_pct", s->util_pct, 1},
        {RK_F_ENERGY, "energy_j", s->energy_j, 1},
        {RK_F_VRM_RIPPLE, "vrm_ripple_v", s->vrm_ripple_mv, 1e-3},
        {RK_F_FAN_VIB, "fan_vibration_hz", s->fan_vib_hz, 1},
    };
    const struct {
        rk_field f;
        const char *key;
        uint64_t v;
    } ints[] = {
        {RK_F_PCIE_GEN, "pcie_gen", (uint64_t)s->pcie_gen},
        {RK_F_PCIE_GEN_MAX, "pcie_gen_max", (uint64_t)s->pcie_gen_max},
        {RK_F_PCIE_WIDTH, "pcie_width", (uint64_t)s->pcie_width},
        {RK_F_PCIE_WIDTH_MAX, "pcie_width_max", (uint64_t)s->pcie_width_max},
        {RK_F_PCIE_REPLAY, "pcie_replay", s->pcie_replay},
        {RK_F_ECC_CORRECTED, "ecc_corrected", s->ecc_corrected},
        {RK_F_ECC_UNCORRECTED, "ecc_uncorrected", s->ecc_uncorrected},
        {RK_F_RETIRED, "retired_pages", s->retired_pages},
        {RK_F_RETIRED_PENDING, "retired_pending", s->retired_pending},
        {RK_F_REMAPPED, "remapped_rows", s->remapped_rows},
        {RK_F_MEM_USED, "mem_used_bytes", s->mem_used_bytes},
        {RK_F_MEM_TOTAL, "mem_total_bytes", s->mem_total_bytes},
        {RK_F_CLOCK_REASONS, "clock_reasons", s->clock_reasons},
        {RK_F_XID, "xid_count", s->xid_count},
    };
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
        if (rk_field_valid(s, reals[i].f))
            json_object_set_new(o, reals[i].key, json_real(reals[i].v * reals[i].scale));
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (rk_field_valid(s, ints[i].f)) /* JSON integers are signed 64-bit: clamp, never wrap */
            json_object_set_new(
                o, ints[i].key,
                json_integer(ints[i].v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)ints[i].v));
    if (rk_field_valid(s, RK_F_XID)) {
        if (s->xid_count > 0)
            json_object_set_new(o, "last_xid", json_integer(s->last_xid));
        xids_json(o, s);
    }
    return o;
}

/* ---- the table ------------------------------------------------------------------------------ */

enum { C_NONE, C_RED, C_YELLOW };
static int colour_on;

/* s padded to width (negative: left-aligned) in colour c. */
static void put(int width, int c, const char *s)
{
    static const char *const on[] = {"", "\033[31m", "\033[33m"};
    if (colour_on && c != C_NONE)
        printf("%s%*s\033[0m", on[c], width, s);
    else
        printf("%*s", width, s);
}

/* "x" for a valid field's value (fmt), "-" for an absent one. */
static const char *fmt_field(char *buf, size_t cap, const rk_gpu_sample *s, rk_field f,
                             const char *fmt, double v)
{
    if (!rk_field_valid(s, f))
        return "-";
    snprintf(buf, cap, fmt, v);
    return buf;
}

static const char *fmt_u64(char *buf, size_t cap, const rk_gpu_sample *s, rk_field f, uint64_t v)
{
    if (!rk_field_valid(s, f))
        return "-";
    snprintf(buf, cap, "%llu", (unsigned long long)v);
    return buf;
}

/* The readings under a GPU's line, two lines within 80 columns:
 *        bus 00000000:01:00.0  serial 0323617041234
 *        67 C  142/180 W  fan 55%  SM 1683 MHz  mem 4004 MHz
 *        PCIe 3/3 x16/16  ECC 0/0  retired 0  Xid 2 (79 x2) */
static void print_readings(const rk_gpu_info *in, const rk_gpu_sample *s)
{
    printf("       bus %s  serial %s", in->bus_id[0] ? in->bus_id : "-",
           in->serial[0] ? in->serial : "-");
    if (in->arch != RK_ARCH_UNKNOWN)
        printf("  %s", rk_gpu_arch_name(in->arch));
    printf("\n");
    if (s->lost || !s->valid)
        return;
    char a[32], b[32], c[32], d[32];
    const char *t = fmt_field(a, sizeof a, s, RK_F_TEMP, "%.0f C", s->temp_c);
    printf("       ");
    put(0, rk_field_valid(s, RK_F_TEMP) && s->temp_c >= RK_HEALTH_TEMP_WARN_C ? C_YELLOW : C_NONE,
        t);
    printf("  %s/%s W", fmt_field(a, sizeof a, s, RK_F_POWER, "%.0f", s->power_w),
           fmt_field(b, sizeof b, s, RK_F_POWER_LIMIT, "%.0f", s->power_limit_w));
    printf("  fan %s", fmt_field(a, sizeof a, s, RK_F_FAN, "%.0f%%", s->fan_pct));
    printf("  SM %s", fmt_field(a, sizeof a, s, RK_F_SM_CLOCK, "%.0f MHz", s->sm_mhz));
    printf("  mem %s\n", fmt_field(a, sizeof a, s, RK_F_MEM_CLOCK, "%.0f MHz", s->mem_mhz));
    int down = (rk_field_valid(s, RK_F_PCIE_WIDTH) && rk_field_valid(s, RK_F_PCIE_WIDTH_MAX) &&
                s->pcie_width < s->pcie_width_max);
    char link[160];
    snprintf(link, sizeof link, "PCIe %s/%s x%s/%s",
             fmt_field(a, sizeof a, s, RK_F_PCIE_GEN, "%.0f", s->pcie_gen),
             fmt_field(b, sizeof b, s, RK_F_PCIE_GEN_MAX, "%.0f", s->pcie_gen_max),
             fmt_field(c, sizeof c, s, RK_F_PCIE_WIDTH, "%.0f", s->pcie_width),
             fmt_field(d, sizeof d, s, RK_F_PCIE_WIDTH_MAX, "%.0f", s->pcie_width_max));
    printf("       ");
    put(0, down ? C_YELLOW : C_NONE, link);
    int ue = rk_field_valid(s, RK_F_ECC_UNCORRECTED) && s->ecc_uncorrected > 0;
    printf("  ECC %s/", fmt_u64(a, sizeof a, s, RK_F_ECC_CORRECTED, s->ecc_corrected));
    put(0, ue ? C_RED : C_NONE, fmt_u64(a, sizeof a, s, RK_F_ECC_UNCORRECTED, s->ecc_uncorrected));
    printf("  retired %s", fmt_u64(a, sizeof a, s, RK_F_RETIRED, s->retired_pages));
    char xd[64];
    xids_text(xd, sizeof xd, s);
    printf("  Xid %s%s\n", fmt_u64(a, sizeof a, s, RK_F_XID, s->xid_count), xd);
}

/* The last burn-in (docs/burn.md) under the readings: "burn OK, 2026-12-02 18:04 UTC". */
static void print_burn(const rk_gpu_signals *q)
{
    if (!q->burn_valid)
        return;
    char when[40] = "at an unknown time";
    time_t t = (time_t)q->burn_when;
    struct tm tm;
    if (q->burn_when > 0 && gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
    printf("       burn ");
    put(0, q->burn_ok ? C_NONE : C_RED, q->burn_ok ? "OK" : "FAULTY");
    printf(", %s\n", when);
}

/* text after lead, wrapped at spaces to 80 columns, continuation lines indented as lead. */
static void print_wrapped(const char *lead, const char *text)
{
    const int width = 80, ind = (int)strlen(lead) > 12 ? 12 : (int)strlen(lead);
    int col = printf("%s", lead);
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        int w = (int)strcspn(p, " ");
        if (!w)
            break;
        if (col > ind + 3 && col + 1 + w > width)
            col = printf("\n%*s", ind + 3, "") - 1;
        else if (col > (int)strlen(lead))
            col += printf(" ");
        col += printf("%.*s", w, p);
        p += w;
    }
    printf("\n");
}

/* RFC 3339, UTC, to the second. */
static void now_rfc3339(char *buf, size_t cap)
{
    time_t now = time(NULL);
    struct tm tm;
    if (!gmtime_r(&now, &tm) || !strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(buf, cap, "1970-01-01T00:00:00Z");
}

/* The report's head: host, time, version (docs/doctor-json.md). */
static json_t *report_root(void)
{
    json_t *root = json_object();
    char host[256] = "", when[32];
    if (gethostname(host, sizeof host - 1) != 0)
        host[0] = 0;
    host[sizeof host - 1] = 0;
    now_rfc3339(when, sizeof when);
    json_object_set_new(root, "host", json_string(host));
    json_object_set_new(root, "time", json_string(when));
    json_object_set_new(root, "version", json_string(RK_VERSION));
    return root;
}

/* --json when no GPU could be read: {"gpus": [], "error": ...} with the head, on stdout. */
static void print_json_error(const char *backend, const char *msg)
{
    json_t *root = report_root();
    json_object_set_new(root, "backend", json_string(backend));
    json_object_set_new(root, "gpus", json_array());
    json_object_set_new(root, "error", json_string(msg));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(root);
}

int rk_cmd_doctor(int argc, char **argv)
{
    static const struct option longs[] = {{"sim", required_argument, 0, 'S'},
                                          {"seed", required_argument, 0, 's'},
                                          {"age", required_argument, 0, 'a'},
                                          {"sim-load", required_argument, 0, 'W'},
                                          {"sim-sensors", no_argument, 0, 'E'},
                                          {"json", no_argument, 0, 'j'},
                                          {"threshold", required_argument, 0, 't'},
                                          {"textfile-dir", required_argument, 0, 'x'},
                                          {"samples", required_argument, 0, 'k'},
                                          {"interval", required_argument, 0, 'i'},
                                          {"predictor", required_argument, 0, 'P'},
                                          {"slurm", no_argument, 0, 'L'},
                                          {"node", required_argument, 0, 'N'},
                                          {"dry-run", no_argument, 0, 'D'},
                                          {"scontrol", required_argument, 0, 'C'},
                                          {"gres", no_argument, 0, 'G'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_telemetry_opts o = RK_TELEMETRY_OPTS_DEFAULT;
    int sim = 0, as_json = 0, sim_opts = 0;
    double threshold = RK_HEALTH_THRESHOLD_DEFAULT, interval = 0.5;
    int samples = 5;
    const char *model_path = NULL;
    int slurm = 0, gres = 0;
    rk_doctor_slurm_opts so = {.scontrol = "scontrol"};
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'S':
            if (rk_arg_count(&args, "--sim", optarg, 1, 1024, &sim))
                return RK_EXIT_USAGE;
            break;
        case 's':
            if (rk_arg_seed(&args, "--seed", optarg, &o.seed))
                return RK_EXIT_USAGE;
            break;
        case 'a':
            if (rk_arg_hours(&args, "--age", optarg, &o.start_age_h))
                return RK_EXIT_USAGE;
            break;
        case 'W':
            if (rk_arg_sim_load(&args, "--sim-load", optarg, &o.sim_load))
                return RK_EXIT_USAGE;
            sim_opts = 1;
            break;
        case 'E':
            o.sim_sensors = true;
            sim_opts = 1;
            break;
        case 'j': as_json = 1; break;
        case 't':
            if (rk_arg_score(&args, "--threshold", optarg, &threshold))
                return RK_EXIT_USAGE;
            break;
        case 'x': o.textfile_dir = optarg; break;
        case 'k':
            if (rk_arg_count(&args, "--samples", optarg, 1, 1000, &samples))
                return RK_EXIT_USAGE;
            break;
        case 'i':
            if (rk_arg_seconds(&args, "--interval", optarg, 0, 60, &interval))
                return RK_EXIT_USAGE;
            break;
        case 'P': model_path = optarg; break;
        case 'L': slurm = 1; break;
        case 'N': so.node = optarg; break;
        case 'D': so.dry_run = true; break;
        case 'C': so.scontrol = optarg; break;
        case 'G': gres = 1; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (sim_opts && !sim)
        return usage_error("--sim-load and --sim-sensors go with --sim N");
    if (slurm && gres)
        return usage_error("--slurm and --gres are two different jobs: one at a time");
    if ((slurm || gres) && as_json)
        return usage_error("--json is not for --slurm or --gres");
    if (!slurm && (so.dry_run || strcmp(so.scontrol, "scontrol") != 0))
        return usage_error("--dry-run and --scontrol go with --slurm");
    if (!slurm && !gres && so.node)
        return usage_error("--node goes with --slurm or --gres");
    if (gres && so.node && !rk_slurm_node_name_ok(so.node))
        return usage_error("node name '%s': not a Slurm node name (letters, digits, '.', "
                           "'_', '-', at most 63)",
                           so.node);
    if (slurm) {
        if (!so.node)
            so.node = getenv("SLURMD_NODENAME");
        if (!so.node || !so.node[0])
            return usage_error("--slurm needs the node's name: --node NAME, or SLURMD_NODENAME "
                               "in the environment (slurmd sets it for its health check)");
        if (!rk_slurm_node_name_ok(so.node))
            return usage_error("node name '%s': not a Slurm node name (letters, digits, '.', "
                               "'_', '-', at most 63)",
                               so.node);
        if (!so.scontrol[0])
            return usage_error("--scontrol: empty path");
    }
    if ((o.textfile_dir && rk_arg_path(&args, "--textfile-dir", o.textfile_dir, RK_PATH_DIR)) ||
        (model_path && rk_arg_path(&args, "--predictor", model_path, RK_PATH_FILE)))
        return RK_EXIT_USAGE;
    rk_err err = {0};
    rk_pred_model *model = NULL;
    rk_pred_online *pred = NULL;
    if (model_path && !(model = load_predictor(model_path)))
        return RK_EXIT_USAGE;
    rk_telemetry *t = NULL;
    if (sim) {
        o.sim_gpus = sim;
        o.time_scale = 120.0;
    }
    if (rk_telemetry_open(&t, sim ? "sim" : "nvml", &o, &err)) {
        /* one line: what failed, and (NVML) the way to a simulated fleet */
        fprintf(stderr, "rk doctor: %s%s\n", err.msg,
                sim ? "" : "; no GPU to check (--sim N checks a simulated fleet)");
        if (as_json)
            print_json_error(sim ? "sim" : "nvml", err.msg);
        if (slurm)
            fprintf(stderr, "rk doctor: node %s left as it is: no GPU was read\n", so.node);
        rk_pred_free(model);
        return RK_EXIT_FAIL;
    }
    int n = rk_telemetry_count(t);
    rk_monitor *mon = NULL;
    rk_doctor_gpu *dg = NULL;
    int status = RK_EXIT_OK;
    if (model && n > 0 && rk_pred_online_create(&pred, model, n, &err)) {
        fprintf(stderr, "rk doctor: %s\n", err.msg);
        status = RK_EXIT_FAIL;
        goto out;
    }
    rk_monitor_predictor mp;
    rk_monitor_opts mo = RK_MONITOR_OPTS_DEFAULT;
    mo.history = samples + 1;
    if (pred) {
        rk_pred_online_monitor(pred, &mp);
        mo.predictor = &mp;
    }
    if (rk_monitor_create(&mon, n, &mo, &err)) {
        fprintf(stderr, "rk doctor: %s\n", err.msg);
        status = RK_EXIT_FAIL;
        goto out;
    }
    /* the first problem once: the rest is still read */
    static char unsure[sizeof err.msg];
    if (n > 0 && rk_monitor_sample(mon, t, samples, interval, &err)) {
        fprintf(stderr, "rk doctor: %s\n", err.msg);
        snprintf(unsure, sizeof unsure, "%s", err.msg);
        so.unsure = unsure; /* --slurm resumes nothing on a reading that went wrong */
    }
    if (n == 0) {
        fprintf(stderr, "rk doctor: %s found no GPU\n", rk_telemetry_backend(t));
        if (as_json) {
            char m[64];
            snprintf(m, sizeof m, "%s found no GPU", rk_telemetry_backend(t));
            print_json_error(rk_telemetry_backend(t), m);
        }
        if (slurm)
            fprintf(stderr, "rk doctor: node %s left as it is: no GPU was read\n", so.node);
        status = RK_EXIT_FAIL;
        goto out;
    }
    dg = calloc((size_t)n, sizeof *dg);
    if (!dg) {
        fprintf(stderr, "rk doctor: out of memory\n");
        status = RK_EXIT_FAIL;
        goto out;
    }
    json_t *arr = json_array();
    colour_on = !as_json && !gres && rk_term_live(STDOUT_FILENO); /* progress.h: TERM, NO_COLOR */
    if (!as_json && !gres)
        printf("%-4s %-46s %5s  %-4s  %s\n", "GPU", "NAME", "SCORE", "", "FINDINGS");
    for (int i = 0; i < n; i++) {
        const rk_monitor_gpu *g = rk_monitor_gpu_state(mon, i);
        const rk_gpu_info *in = rk_monitor_info(mon, i);
        double p = g->prob;
        int minutes = pred ? rk_pred_online_minutes(pred, i) : 0;
        const rk_finding *f = g->findings;
        int nf = g->nfindings, score = g->score;
        int pass = g->has_score && score >= threshold; /* unreadable: nothing says it is sound */
        if (!pass)
            status = RK_EXIT_FAIL;
        dg[i] = (rk_doctor_gpu){.index = in->index,
                                .simulated = in->simulated,
                                .has_score = g->has_score,
                                .score = score,
                                .pass = pass};
        snprintf(dg[i].name, sizeof dg[i].name, "%s", in->name);
        snprintf(dg[i].bus_id, sizeof dg[i].bus_id, "%s", in->bus_id);
        snprintf(dg[i].why, sizeof dg[i].why, "%s",
                 !g->has_score ? "no reading succeeded"
                 : nf          ? f[0].message
                               : "");
        snprintf(dg[i].code, sizeof dg[i].code, "%.31s", g->has_score && nf ? f[0].code : "");
        dg[i].vrm_read = rk_field_valid(&g->latest, RK_F_VRM_RIPPLE);
        dg[i].fan_vib_read = rk_field_valid(&g->latest, RK_F_FAN_VIB);
        if (gres)
            continue;
        if (as_json) {
            json_t *o2 = json_object();
            json_object_set_new(o2, "index", json_integer(in->index));
            json_object_set_new(o2, "name", json_string(in->name));
            json_object_set_new(o2, "uuid", json_string(in->uuid));
            if (in->serial[0])
                json_object_set_new(o2, "serial", json_string(in->serial));
            if (in->bus_id[0])
                json_object_set_new(o2, "bus_id", json_string(in->bus_id));
            json_object_set_new(o2, "simulated", json_boolean(in->simulated));
            if (in->profile[0])
                json_object_set_new(o2, "profile", json_string(in->profile));
            if (in->arch != RK_ARCH_UNKNOWN)
                json_object_set_new(o2, "architecture", json_string(rk_gpu_arch_name(in->arch)));
            if (in->tune & RK_TUNE_KNOWN) {
                json_object_set_new(o2, "geforce", json_boolean(in->geforce));
                json_t *ta = json_array();
                if (in->tune & RK_TUNE_LOCK_CLOCKS)
                    json_array_append_new(ta, json_string("lock_clocks"));
                if (in->tune & RK_TUNE_CLOCK_OFFSET)
                    json_array_append_new(ta, json_string("clock_offset"));
                if (in->tune & RK_TUNE_POWER_LIMIT)
                    json_array_append_new(ta, json_string("power_limit"));
                json_object_set_new(o2, "tune", ta);
            }
            /* null: no reading succeeded (docs/health.md, failed readings) */
            json_object_set_new(o2, "score", g->has_score ? json_integer(score) : json_null());
            json_object_set_new(o2, "pass", json_boolean(pass));
            json_t *fa = json_array();
            for (int q = 0; q < nf; q++) {
                json_t *fo = json_object();
                json_object_set_new(fo, "code", json_string(f[q].code));
                json_object_set_new(fo, "severity", json_string(rk_severity_name(f[q].severity)));
                json_object_set_new(fo, "penalty", json_integer(f[q].penalty));
                json_object_set_new(fo, "message", json_string(f[q].message));
                json_object_set_new(fo, "action", json_string(f[q].action));
                json_array_append_new(fa, fo);
            }
            json_object_set_new(o2, "findings", fa);
            if (pred) { /* null: the check was too short to fill the window */
                json_object_set_new(o2, "failure_probability", p >= 0 ? json_real(p) : json_null());
                json_object_set_new(o2, "prediction_minutes", json_integer(minutes));
            }
            if (g->failed_reads)
                json_object_set_new(o2, "failed_reads", json_integer(g->failed_reads));
            json_object_set_new(o2, "readings", readings_json(&g->latest));
            if (g->sig.burn_valid) { /* the last burn-in (docs/burn.md) */
                json_t *bo = json_object();
                json_object_set_new(bo, "ok", json_boolean(g->sig.burn_ok));
                json_object_set_new(bo, "ended_unix_s", json_real(g->sig.burn_when));
                if (!g->sig.burn_ok)
                    json_object_set_new(bo, "failed", json_string(g->sig.burn_failed));
                json_object_set_new(o2, "burn", bo);
            }
            json_array_append_new(arr, o2);
            continue;
        }
        char name[128];
        snprintf(name, sizeof name, "%s%s", in->name[0] ? in->name : "(unknown: not answering)",
                 in->simulated ? " (simulated)" : "");
        char shown[16] = "-";
        if (g->has_score)
            snprintf(shown, sizeof shown, "%d", score);
        printf("%-4d %-46.46s %5s  ", in->index, name, shown);
        put(-4, pass ? C_NONE : C_RED, pass ? "ok" : "FAIL");
        printf("  %s\n", !g->has_score ? "unreadable: no reading succeeded" : nf ? "" : "none");
        print_readings(in, &g->latest);
        print_burn(&g->sig);
        if (g->has_score && g->failed_reads)
            printf("       the last %d reading%s failed: the score is the last good one's\n",
                   g->failed_reads, g->failed_reads == 1 ? "" : "s");
        for (int q = 0; q < nf; q++) {
            printf("       ");
            put(-4,
                f[q].severity == RK_SEV_CRIT   ? C_RED
                : f[q].severity == RK_SEV_WARN ? C_YELLOW
                                               : C_NONE,
                rk_severity_name(f[q].severity));
            printf(" %s (-%d)\n", f[q].code, f[q].penalty);
            print_wrapped("            ", f[q].message);
            print_wrapped("            -> ", f[q].action);
        }
        if (pred && p >= 0)
            printf("       prediction: p=%.2f of failing within %.0f min (a model's estimate "
                   "over the last %d minutes)\n",
                   p, g->horizon_min, minutes);
        else if (pred)
            printf("       prediction: none: the predictor needs %d minutes of readings, this "
                   "check saw %d\n",
                   rk_pred_config_of(model)->window, minutes);
    }
    if (as_json) {
        json_t *root = report_root();
        json_object_set_new(root, "backend", json_string(rk_telemetry_backend(t)));
        json_object_set_new(root, "threshold", json_real(threshold));
        json_object_set_new(root, "gpus", arr);
        char *text =
            json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
        if (text)
            printf("%s\n", text);
        free(text);
        json_decref(root);
    } else if (gres) {
        json_decref(arr);
        status = rk_doctor_gres(dg, n, threshold, so.node);
    } else {
        json_decref(arr);
        printf("threshold %.0f: %s\n", threshold,
               status == RK_EXIT_OK ? "every GPU passes" : "one or more GPUs fail");
        if (slurm) {
            fflush(stdout);
            int st = rk_doctor_slurm(dg, n, &so);
            if (st != RK_EXIT_OK)
                status = st;
        }
    }
out:
    free(dg);
    rk_monitor_free(mon);
    rk_telemetry_close(t);
    rk_pred_online_free(pred);
    rk_pred_free(model);
    return status;
}
