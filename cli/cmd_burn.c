/*
 * rk burn: burn in this node's GPUs (docs/burn.md): SGEMM into many copies compared with the
 * first, memory tests, telemetry from NVML; a verdict per GPU, written into the burn state
 * file. Parse -> gpu/burn.h's rk_burn_run -> print and record.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "gpu/burn.h"
#include "gpu/cuda.h"
#include "health/burnstate.h"
#include "health/nvml.h"
#include "progress.h"
#include "rk.h"

#define MAX_SELECT 64

static const char usage_text[] =
    "usage: rk burn [--gpus LIST] [--duration TIME] [--memory P%] [--seed N] [--json]\n"
    "               [--state PATH]\n"
    "\n"
    "Burn in this node's GPUs (docs/burn.md): SGEMM computed into many copies, each compared\n"
    "with the first, alternating with memory tests (address lines, own address, moving\n"
    "inversions, random) over most of the free memory. A verdict per GPU, OK or FAULTY with\n"
    "what failed, is printed and written into the burn state file.\n"
    "\n"
    "  --gpus LIST      CUDA device indices: 0,2,5-7 (default: every GPU)\n"
    "  --duration TIME  how long each GPU burns: 90s, 10m, 1h (default 10m)\n"
    "  --memory P%      of the free memory to use, 1-99% (default 90%)\n"
    "  --seed N         the inputs' and random patterns' seed (default 1)\n"
    "  --json           print the results as JSON on stdout\n"
    "  --state PATH     the state file (default $RK_BURN_STATE, else\n"
    "                   /var/lib/rekindle/burn.json)\n"
    "  -h, --help       show this help\n"
    "\n"
    "The fastest SGEMM kernel is found on first use and cached per GPU model in\n"
    "$XDG_CACHE_HOME/rekindle (root: /var/cache/rekindle, else ~/.cache/rekindle).\n"
    "\n"
    "Progress on stderr: on a terminal one line redrawn in place, fitted to its width; else\n"
    "(a file, TERM=dumb, NO_COLOR) a plain line per tenth of the burn (docs/cli.md).\n"
    "\n"
    "Exit status: 0 every GPU OK, 1 a GPU FAULTY, no GPU or the burn could not run,\n"
    "2 bad usage.\n";

static rk_args args = {.cmd = "burn", .usage = usage_text};

/* The burn's progress on stderr: a line redrawn on a terminal, else a plain line per tenth. */
typedef struct burn_view {
    rk_progress bar;
    double duration_s;
} burn_view;

static void progress(void *ctx, const rk_burn_gpu *gpus, int n, double elapsed)
{
    burn_view *v = ctx;
    char label[32], counts[512] = "", detail[64] = "", rate[32], eta[32];
    double least = 1, gflops = 0, temp = NAN, mhz = NAN;
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        const rk_burn_gpu *g = &gpus[i];
        double prog, gf;
        __atomic_load(&g->progress, &prog, __ATOMIC_RELAXED);
        __atomic_load(&g->gflops_now, &gf, __ATOMIC_RELAXED);
        const char *phase = __atomic_load_n(&g->phase, __ATOMIC_RELAXED);
        least = fmin(least, prog);
        gflops += gf;
        if (used < sizeof counts)
            used += (size_t)snprintf(counts + used, sizeof counts - used, "%sgpu%d %.0f%% %s",
                                     i ? ", " : "", g->ordinal, 100 * prog, phase ? phase : "?");
        if (g->have_sample && rk_field_valid(&g->last, RK_F_TEMP))
            temp = isnan(temp) ? g->last.temp_c : fmax(temp, g->last.temp_c);
        if (g->have_sample && rk_field_valid(&g->last, RK_F_SM_CLOCK))
            mhz = isnan(mhz) ? g->last.sm_mhz : fmin(mhz, g->last.sm_mhz);
    }
    /* the hottest GPU and the slowest SM clock (one GPU: its own) */
    const char *hot = n > 1 ? "max " : "", *slow = n > 1 ? "min " : "";
    if (!isnan(temp) && !isnan(mhz))
        snprintf(detail, sizeof detail, "%s%.0fC %s%.0fMHz", hot, temp, slow, mhz);
    else if (!isnan(temp))
        snprintf(detail, sizeof detail, "%s%.0fC", hot, temp);
    else if (!isnan(mhz))
        snprintf(detail, sizeof detail, "%s%.0fMHz", slow, mhz);
    snprintf(label, sizeof label, "burn %.0fs", elapsed);
    snprintf(rate, sizeof rate, "%.0f GFLOP/s", gflops);
    long left = (long)(v->duration_s * (1 - least) + 0.5);
    snprintf(eta, sizeof eta, "ETA %ld:%02ld", left / 60, left % 60);
    rk_progress_parts parts = {.label = label,
                               .frac = least,
                               .counts = counts,
                               .detail = detail,
                               .rate = rate,
                               .eta = eta};
    rk_progress_draw(&v->bar, &parts);
}

static const char *gpu_key(const rk_burn_gpu *g)
{
    if (g->nvml_index < 0)
        return NULL;
    return g->info.serial[0] ? g->info.serial : g->info.uuid[0] ? g->info.uuid : NULL;
}

static json_t *gpu_json(const rk_burn_gpu *g, bool ok, const char *failed, const char *recorded)
{
    const rk_burn_result *r = &g->result;
    char rs[160];
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(g->ordinal));
    json_object_set_new(o, "name", json_string(g->dev.name));
    json_object_set_new(o, "bus_id", json_string(g->dev.bus_id));
    json_object_set_new(o, "serial", json_string(g->nvml_index >= 0 ? g->info.serial : ""));
    json_object_set_new(o, "uuid", json_string(g->nvml_index >= 0 ? g->info.uuid : ""));
    json_object_set_new(o, "ran", json_boolean(r->ran));
    json_object_set_new(o, "ok", json_boolean(ok));
    json_object_set_new(o, "failed", json_string(failed));
    json_object_set_new(o, "duration_s", json_real(r->duration_s));
    json_object_set_new(o, "variant", json_string(r->variant));
    json_object_set_new(o, "tuned_now", json_boolean(r->tuned_now));
    json_object_set_new(o, "n", json_integer(r->n));
    json_object_set_new(o, "copies", json_integer(r->copies));
    json_object_set_new(o, "rounds", json_integer((json_int_t)r->rounds));
    json_object_set_new(o, "gflops", json_real(r->gflops));
    json_object_set_new(o, "wrong_elements", json_integer((json_int_t)r->wrong_elements));
    json_object_set_new(o, "mem_bytes", json_integer((json_int_t)r->mem_bytes));
    json_t *mt = json_object();
    for (int t = 0; t < RK_MT_TESTS; t++) {
        json_t *x = json_object();
        json_object_set_new(x, "passes", json_integer((json_int_t)r->mt_passes[t]));
        json_object_set_new(x, "bad_words", json_integer((json_int_t)r->mt_bad[t]));
        json_object_set_new(mt, rk_burn_mt_name(t), x);
    }
    json_object_set_new(o, "memory_tests", mt);
    json_object_set_new(o, "temp_max_c",
                        isnan(g->temp_max_c) ? json_null() : json_real(g->temp_max_c));
    json_object_set_new(o, "sm_min_mhz",
                        isnan(g->sm_min_mhz) ? json_null() : json_real(g->sm_min_mhz));
    json_object_set_new(o, "sm_max_mhz",
                        isnan(g->sm_max_mhz) ? json_null() : json_real(g->sm_max_mhz));
    json_object_set_new(o, "clock_reasons",
                        json_string(rk_burn_reasons_str(g->clock_reasons_seen, rs, sizeof rs)));
    json_t *series = json_array();
    for (int i = 0; i < g->series_len; i++) {
        const rk_burn_point *p = &g->series[i];
        json_t *x = json_object();
        json_object_set_new(x, "t", json_real(p->t));
        json_object_set_new(x, "temp_c", isnan(p->temp_c) ? json_null() : json_real(p->temp_c));
        json_object_set_new(x, "sm_mhz", isnan(p->sm_mhz) ? json_null() : json_real(p->sm_mhz));
        json_object_set_new(x, "mem_mhz", isnan(p->mem_mhz) ? json_null() : json_real(p->mem_mhz));
        json_object_set_new(x, "power_w", isnan(p->power_w) ? json_null() : json_real(p->power_w));
        json_object_set_new(x, "clock_reasons", json_integer((json_int_t)p->clock_reasons));
        json_array_append_new(series, x);
    }
    json_object_set_new(o, "telemetry", series);
    json_object_set_new(o, "recorded", json_string(recorded));
    return o;
}

static void print_gpu(FILE *so, const rk_burn_gpu *g, bool ok, const char *failed,
                      const char *recorded)
{
    const rk_burn_result *r = &g->result;
    char rs[160];
    fprintf(so, "gpu %d: %s (%s)%s%s\n", g->ordinal, g->dev.name, g->dev.bus_id,
            g->nvml_index >= 0 && g->info.serial[0] ? " serial " : "",
            g->nvml_index >= 0 ? g->info.serial : "");
    if (!r->ran) {
        fprintf(so, "  not burnt: %s\n", r->setup_error);
        return;
    }
    fprintf(so, "  sgemm: %s%s, n=%d, %d copies x %llu rounds, %.1f GFLOP/s, %llu elements wrong\n",
            r->variant, r->tuned_now ? " (tuned now)" : "", r->n, r->copies,
            (unsigned long long)r->rounds, r->gflops, (unsigned long long)r->wrong_elements);
    fprintf(so, "  memory: %.1f GiB;", (double)r->mem_bytes / (1 << 30));
    for (int t = 0; t < RK_MT_TESTS; t++)
        fprintf(so, " %s %llu passes %llu bad%s", rk_burn_mt_name(t),
                (unsigned long long)r->mt_passes[t], (unsigned long long)r->mt_bad[t],
                t + 1 < RK_MT_TESTS ? "," : "\n");
    if (g->nvml_index >= 0) {
        fprintf(so, "  telemetry (nvml):");
        if (!isnan(g->temp_max_c))
            fprintf(so, " max %.0f C,", g->temp_max_c);
        if (!isnan(g->sm_min_mhz))
            fprintf(so, " SM %.0f-%.0f MHz,", g->sm_min_mhz, g->sm_max_mhz);
        fprintf(so, " throttle reasons seen: %s\n",
                rk_burn_reasons_str(g->clock_reasons_seen, rs, sizeof rs));
    } else {
        fprintf(so, "  telemetry: none (no NVML GPU with this bus id)\n");
    }
    fprintf(so, "  verdict: %s%s%s\n", ok ? "OK" : "FAULTY", ok ? "" : ": ", failed);
    fprintf(so, "  record: %s\n", recorded);
}

int rk_cmd_burn(int argc, char **argv)
{
    static const struct option opts[] = {
        {"gpus", required_argument, 0, 'g'},   {"duration", required_argument, 0, 'd'},
        {"memory", required_argument, 0, 'm'}, {"seed", required_argument, 0, 's'},
        {"json", no_argument, 0, 'j'},         {"state", required_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    int sel[MAX_SELECT], nsel = 0;
    bool json = false;
    const char *state = NULL;
    rk_burn_opts o = {.duration_s = 600, .memory_frac = 0.9, .seed = 1};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'g':
            if (!rk_args_gpu_list(optarg, MAX_SELECT, sel, &nsel))
                return rk_arg_error(&args, "--gpus '%s' is not a list of GPU indices (0,2,5-7)",
                                    optarg);
            break;
        case 'd':
            if (rk_arg_seconds(&args, "--duration", optarg, 1, 7 * 86400.0, &o.duration_s))
                return RK_EXIT_USAGE;
            break;
        case 'm': {
            char buf[32];
            size_t len = strlen(optarg);
            double pct;
            if (len == 0 || len >= sizeof buf)
                return rk_arg_error(&args, "--memory '%s' is not a percentage in 1-99%%", optarg);
            memcpy(buf, optarg, len + 1);
            if (buf[len - 1] == '%')
                buf[len - 1] = '\0';
            if (!rk_args_real(buf, 1, 99, &pct))
                return rk_arg_error(&args, "--memory '%s' is not a percentage in 1-99%%", optarg);
            o.memory_frac = pct / 100;
            break;
        }
        case 's': {
            uint64_t s;
            if (rk_arg_seed(&args, "--seed", optarg, &s))
                return RK_EXIT_USAGE;
            o.seed = (uint32_t)s;
            break;
        }
        case 'j': json = true; break;
        case 'S':
            if (rk_arg_path(&args, "--state", optarg, RK_PATH_OUTPUT))
                return RK_EXIT_USAGE;
            state = optarg;
            break;
        case 'h': fputs(usage_text, stdout); return 0;
        default: return rk_cli_usage_error("burn", usage_text, "unknown option");
        }
    }
    if (optind < argc)
        return rk_arg_error(&args, "unexpected argument '%s'", argv[optind]);
    if (!state)
        state = rk_burn_state_path();
    char tune_dir[512];
    o.tune_dir = rk_burn_tune_dir(tune_dir, sizeof tune_dir) ? tune_dir : NULL;

    rk_err err = {0};
    rk_cuda *cu = NULL;
    if (rk_cuda_open(&cu, &err) < 0) {
        fprintf(stderr, "rk burn: %s\n", err.msg);
        return RK_EXIT_FAIL;
    }
    int count = 0;
    if (rk_cuda_device_count(cu, &count, &err) < 0 || count == 0) {
        fprintf(stderr, "rk burn: %s\n", count == 0 && !err.msg[0] ? "no CUDA GPU found" : err.msg);
        rk_cuda_close(cu);
        return RK_EXIT_FAIL;
    }
    if (nsel == 0)
        for (int i = 0; i < count && i < MAX_SELECT; i++)
            sel[nsel++] = i;
    for (int i = 0; i < nsel; i++)
        if (sel[i] >= count) {
            rk_cuda_close(cu);
            return rk_arg_error(&args, "--gpus: GPU %d does not exist (this node has %d)", sel[i],
                                count);
        }
    rk_nvml *nvml = NULL;
    rk_err nerr = {0};
    if (rk_nvml_open(&nvml, &nerr) < 0) {
        fprintf(stderr, "rk burn: no telemetry and no record keyed by serial: %s\n", nerr.msg);
        nvml = NULL;
    }
    rk_burn_gpu *gpus = calloc((size_t)nsel, sizeof *gpus);
    if (!gpus) {
        fprintf(stderr, "rk burn: out of memory\n");
        rk_nvml_close(nvml);
        rk_cuda_close(cu);
        return RK_EXIT_FAIL;
    }
    /* the report on stdout, wrapped to a terminal's width (JSON as it is); the progress on
     * stderr */
    rk_progress out;
    rk_progress_init(&out, stdout, !json);
    FILE *so = rk_progress_notes(&out, stdout);
    if (!json)
        fprintf(so, "rk burn: %d GPU(s), %.0f s each, %.0f%% of free memory, state %s\n", nsel,
                o.duration_s, o.memory_frac * 100, state);
    fflush(so);
    burn_view view = {.duration_s = o.duration_s};
    rk_progress_init(&view.bar, stderr, true);
    int rc = rk_burn_run(cu, nvml, &o, sel, nsel, progress, &view, gpus, &err);
    rk_progress_close(&view.bar);
    if (rc < 0) {
        fprintf(stderr, "rk burn: %s\n", err.msg);
        rk_progress_close(&out);
        free(gpus);
        rk_nvml_close(nvml);
        rk_cuda_close(cu);
        return rk_cli_status(rc);
    }
    int status = 0;
    json_t *arr = json_array();
    for (int i = 0; i < nsel; i++) {
        rk_burn_gpu *g = &gpus[i];
        char failed[RK_ERR_MSG_MAX + 256];
        bool ok = rk_burn_verdict(&g->result, failed, sizeof failed);
        char recorded[RK_ERR_MSG_MAX + 64] = "not recorded: the burn did not run";
        if (g->result.ran) {
            rk_burn_record rec;
            const char *key = gpu_key(g);
            if (!key) {
                snprintf(recorded, sizeof recorded,
                         "not recorded: no serial or UUID (NVML does not see this GPU)");
            } else if (rk_burn_record_make(&g->result, g->info.serial, g->info.uuid, g->dev.name,
                                           (double)time(NULL), &rec, &err) < 0 ||
                       rk_burn_state_put(state, &rec, &err) < 0) {
                snprintf(recorded, sizeof recorded, "not recorded: %s", err.msg);
                status = RK_EXIT_FAIL;
            } else {
                snprintf(recorded, sizeof recorded, "%s in %s", rec.key, state);
            }
        }
        if (!ok)
            status = RK_EXIT_FAIL;
        if (json)
            json_array_append_new(arr, gpu_json(g, ok, failed, recorded));
        else
            print_gpu(so, g, ok, failed, recorded);
    }
    if (json) {
        json_t *root = json_object();
        json_object_set_new(root, "duration_s", json_real(o.duration_s));
        json_object_set_new(root, "memory_fraction", json_real(o.memory_frac));
        json_object_set_new(root, "seed", json_integer(o.seed));
        json_object_set_new(root, "state", json_string(state));
        json_object_set_new(root, "gpus", arr);
        json_dumpf(root, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        putchar('\n');
        json_decref(root);
    } else {
        json_decref(arr);
    }
    rk_progress_close(&out);
    rk_burn_gpus_free(gpus, nsel);
    free(gpus);
    rk_nvml_close(nvml);
    rk_cuda_close(cu);
    return status;
}
