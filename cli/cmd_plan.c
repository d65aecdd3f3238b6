/*
 * rk plan: what a fleet gives a training job, and how to run it (docs/plan.md). Parse the
 * flags and the files (a fleet, a replayed trace, an rk run summary: src/plan's readers), one
 * library call (rk_plan_answer_query: the simulator's estimates and sweeps), then a table or
 * JSON.
 */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "plan/fleet.h"
#include "plan/plan.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk plan (--fleet FILE | --hosts N --gpus-per-host G) [OPTIONS]\n"
    "\n"
    "Simulate a training job on a fleet through failures (docs/plan.md) and print its goodput\n"
    "(mean and spread over seeds), the time to finish N samples, the best checkpoint and\n"
    "snapshot intervals, goodput against spare hosts, and the cost per million samples against\n"
    "a fleet of new cards.\n"
    "\n"
    "fleet:\n"
    "  --fleet FILE            cards and hosts (docs/plan.md, \"Fleet file\")\n"
    "  --hosts N               hosts without a fleet file (1 GPU each unless --gpus-per-host)\n"
    "  --gpus-per-host G\n"
    "  --spare-hosts N         idle hosts that replace lost ones (default 0)\n"
    "  --min-hosts N           shrink down to N hosts, then wait (default: the hosts, no shrink)\n"
    "  --spares-sweep N        goodput with 0..N spare hosts (N <= 64)\n"
    "failures:\n"
    "  --failures MODEL        llama3 (default), meta-rsc, stepfun, stepfun-trace,\n"
    "                          exp:SECONDS (each GPU's MTBF), weibull:SHAPE,SCALE_SECONDS, none\n"
    "  --trace FILE            stepfun-trace: the fault_trace.json to replay\n"
    "  --mix C,H,S             shares of GPU failures: crash, hang, slow (default 1,0,0)\n"
    "job:\n"
    "  --summary FILE          an rk run --summary-json: step time, restart cost, recovery\n"
    "                          mode, state size (flags below override it)\n"
    "  --step-time D           one step (default 30ms)\n"
    "  --samples-per-step N    samples one step trains (default 1)\n"
    "  --state-bytes N         a rank's state: sets the checkpoint and snapshot costs\n"
    "  --ckpt-cost D           one checkpoint (default 0.28s)\n"
    "  --snap-cost D           one snapshot (default 21ms)\n"
    "  --restart-cost D        one restart of the recovery mode (default: measured, plan.md)\n"
    "  --recovery MODE         disk (default), memory, inplace\n"
    "  --ckpt-every D|auto     compute between checkpoints (auto: Daly's, the default)\n"
    "  --snap-every-steps K    memory: steps between snapshots (default 10)\n"
    "run:\n"
    "  --days D                wall time simulated (default 30)\n"
    "  --samples N             also: the time to finish N samples\n"
    "  --runs N                seeds per estimate (default 8)\n"
    "  --seed S                the first seed (default 1)\n"
    "cost:\n"
    "  --years Y               the cards' price spread over Y years (default 3)\n"
    "  --kwh-price P           price of a kWh (default 0.15)\n"
    "  --new FILE              the alternative: a fleet file of new cards (same job, its\n"
    "                          step time scaled by the fleets' tflops)\n"
    "  --new-failures MODEL    the new cards' failures (default llama3)\n"
    "  --json                  one JSON object instead of the table\n"
    "  -h, --help              show this help\n"
    "\n"
    "Exit status: 0 answered, 2 bad usage or a file that cannot be read, 1 out of memory.\n";

enum {
    O_FLEET = 256,
    O_HOSTS,
    O_GPH,
    O_SPARE,
    O_MIN,
    O_SWEEP,
    O_FAIL,
    O_TRACE,
    O_MIX,
    O_SUMMARY,
    O_STEP,
    O_SPS,
    O_STATE,
    O_CKCOST,
    O_SNCOST,
    O_RESTART,
    O_RECOVERY,
    O_CKEVERY,
    O_SNEVERY,
    O_DAYS,
    O_SAMPLES,
    O_RUNS,
    O_SEED,
    O_YEARS,
    O_KWH,
    O_NEW,
    O_NEWFAIL,
    O_JSON
};

/* Bytes written to disk and to memory a second (bench/RESULTS.md: ckpt_io's 904 MiB/s,
 * snap_bench's put of 64 MiB at 3.25 GB/s). */
#define CKPT_BYTES_PER_S (904.0 * 1048576)
#define SNAP_BYTES_PER_S 3.25e9

static int file_error(const rk_err *err)
{
    fprintf(stderr, "rk plan: %s\n", err->msg);
    return err->code == RK_ENOMEM || err->code == RK_EIO ? RK_EXIT_FAIL : RK_EXIT_USAGE;
}

static void print_stats(const char *label, const rk_plan_stats *st)
{
    printf("%-28s %.4f (sd %.4f, %.4f-%.4f over %d runs)\n", label, st->goodput_mean,
           st->goodput_sd, st->goodput_min, st->goodput_max, st->runs);
}

static json_t *stats_json(const rk_plan_stats *st)
{
    return json_pack("{s:f,s:f,s:f,s:f,s:i,s:f,s:i,s:f,s:f}", "goodput_mean", st->goodput_mean,
                     "goodput_sd", st->goodput_sd, "goodput_min", st->goodput_min, "goodput_max",
                     st->goodput_max, "runs", st->runs, "wall_mean_s", st->wall_mean_s, "finished",
                     st->finished, "failures_mean", st->failures_mean, "lost_work_mean_s",
                     st->lost_work_mean_s);
}

static json_t *num_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

int rk_cmd_plan(int argc, char **argv)
{
    static const struct option lo[] = {{"fleet", 1, 0, O_FLEET},
                                       {"hosts", 1, 0, O_HOSTS},
                                       {"gpus-per-host", 1, 0, O_GPH},
                                       {"spare-hosts", 1, 0, O_SPARE},
                                       {"min-hosts", 1, 0, O_MIN},
                                       {"spares-sweep", 1, 0, O_SWEEP},
                                       {"failures", 1, 0, O_FAIL},
                                       {"trace", 1, 0, O_TRACE},
                                       {"mix", 1, 0, O_MIX},
                                       {"summary", 1, 0, O_SUMMARY},
                                       {"step-time", 1, 0, O_STEP},
                                       {"samples-per-step", 1, 0, O_SPS},
                                       {"state-bytes", 1, 0, O_STATE},
                                       {"ckpt-cost", 1, 0, O_CKCOST},
                                       {"snap-cost", 1, 0, O_SNCOST},
                                       {"restart-cost", 1, 0, O_RESTART},
                                       {"recovery", 1, 0, O_RECOVERY},
                                       {"ckpt-every", 1, 0, O_CKEVERY},
                                       {"snap-every-steps", 1, 0, O_SNEVERY},
                                       {"days", 1, 0, O_DAYS},
                                       {"samples", 1, 0, O_SAMPLES},
                                       {"runs", 1, 0, O_RUNS},
                                       {"seed", 1, 0, O_SEED},
                                       {"years", 1, 0, O_YEARS},
                                       {"kwh-price", 1, 0, O_KWH},
                                       {"new", 1, 0, O_NEW},
                                       {"new-failures", 1, 0, O_NEWFAIL},
                                       {"json", 0, 0, O_JSON},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    rk_args a = {.cmd = "plan", .usage = usage_text};
    const char *fleet_path = NULL, *trace_path = NULL, *summary_path = NULL, *new_path = NULL;
    const char *failures = "llama3", *new_failures = "llama3", *ckpt_every = "auto";
    int hosts = 0, gph = 0, spare = 0, min_hosts = 0, sweep = 0, runs = 8, snap_k = 10, json = 0;
    int recovery = -1;
    double mix[3] = {1, 0, 0}, step = -1, sps = 1, state = -1, ckcost = -1, sncost = -1,
           restart = -1, days = 30, samples = 0, years = 3, kwh = 0.15;
    uint64_t seed = 1;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        int r = 0;
        switch (c) {
        case O_FLEET: fleet_path = optarg; break;
        case O_HOSTS: r = rk_arg_count(&a, "--hosts", optarg, 1, 1000000, &hosts); break;
        case O_GPH: r = rk_arg_count(&a, "--gpus-per-host", optarg, 1, 1024, &gph); break;
        case O_SPARE: r = rk_arg_count(&a, "--spare-hosts", optarg, 0, 1000000, &spare); break;
        case O_MIN: r = rk_arg_count(&a, "--min-hosts", optarg, 1, 1000000, &min_hosts); break;
        case O_SWEEP:
            r = rk_arg_count(&a, "--spares-sweep", optarg, 1, RK_PLAN_SPARES_MAX, &sweep);
            break;
        case O_FAIL: failures = optarg; break;
        case O_TRACE: trace_path = optarg; break;
        case O_MIX:
            if (sscanf(optarg, "%lf,%lf,%lf", &mix[0], &mix[1], &mix[2]) != 3 ||
                strspn(optarg, "0123456789.,") != strlen(optarg) || !(mix[0] + mix[1] + mix[2] > 0))
                return rk_cli_usage_error(
                    "plan", usage_text, "--mix '%s' is not three shares C,H,S (not all 0)", optarg);
            break;
        case O_SUMMARY: summary_path = optarg; break;
        case O_STEP: r = rk_arg_seconds(&a, "--step-time", optarg, 1e-6, 86400, &step); break;
        case O_SPS: r = rk_arg_real(&a, "--samples-per-step", optarg, 1e-6, 1e9, &sps); break;
        case O_STATE: r = rk_arg_real(&a, "--state-bytes", optarg, 0, 1e14, &state); break;
        case O_CKCOST: r = rk_arg_seconds(&a, "--ckpt-cost", optarg, 0, 86400, &ckcost); break;
        case O_SNCOST: r = rk_arg_seconds(&a, "--snap-cost", optarg, 0, 86400, &sncost); break;
        case O_RESTART: r = rk_arg_seconds(&a, "--restart-cost", optarg, 0, 86400, &restart); break;
        case O_RECOVERY:
            recovery = !strcmp(optarg, "disk")      ? RK_PLAN_DISK
                       : !strcmp(optarg, "memory")  ? RK_PLAN_MEMORY
                       : !strcmp(optarg, "inplace") ? RK_PLAN_INPLACE
                                                    : -2;
            if (recovery == -2)
                return rk_cli_usage_error("plan", usage_text,
                                          "--recovery '%s' is not disk, memory or inplace", optarg);
            break;
        case O_CKEVERY: ckpt_every = optarg; break;
        case O_SNEVERY:
            r = rk_arg_count(&a, "--snap-every-steps", optarg, 1, 100000000, &snap_k);
            break;
        case O_DAYS: r = rk_arg_real(&a, "--days", optarg, 1e-3, 36525, &days); break;
        case O_SAMPLES: r = rk_arg_real(&a, "--samples", optarg, 1, 1e18, &samples); break;
        case O_RUNS: r = rk_arg_count(&a, "--runs", optarg, 1, 10000, &runs); break;
        case O_SEED: r = rk_arg_seed(&a, "--seed", optarg, &seed); break;
        case O_YEARS: r = rk_arg_real(&a, "--years", optarg, 0.01, 100, &years); break;
        case O_KWH: r = rk_arg_real(&a, "--kwh-price", optarg, 0, 1000, &kwh); break;
        case O_NEW: new_path = optarg; break;
        case O_NEWFAIL: new_failures = optarg; break;
        case O_JSON: json = 1; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default:
            return rk_cli_usage_error("plan", usage_text, "unknown option or missing value: '%s'",
                                      argv[optind - 1]);
        }
        if (r)
            return r;
    }
    if (optind < argc)
        return rk_cli_usage_error("plan", usage_text, "unexpected argument '%s'", argv[optind]);
    if (!fleet_path && !hosts)
        return rk_cli_usage_error("plan", usage_text, "needs --fleet FILE or --hosts N");
    if (fleet_path && (hosts || gph))
        return rk_cli_usage_error("plan", usage_text,
                                  "--fleet gives the hosts and cards: not with --hosts or "
                                  "--gpus-per-host");
    if (!strcmp(failures, "stepfun-trace") != (trace_path != NULL))
        return rk_cli_usage_error("plan", usage_text,
                                  "--failures stepfun-trace and --trace FILE go together");
    if (fleet_path && rk_arg_path(&a, "--fleet", fleet_path, RK_PATH_FILE))
        return RK_EXIT_USAGE;
    if (trace_path && rk_arg_path(&a, "--trace", trace_path, RK_PATH_FILE))
        return RK_EXIT_USAGE;
    if (summary_path && rk_arg_path(&a, "--summary", summary_path, RK_PATH_FILE))
        return RK_EXIT_USAGE;
    if (new_path && rk_arg_path(&a, "--new", new_path, RK_PATH_FILE))
        return RK_EXIT_USAGE;

    rk_err err = {0};
    rk_plan_fleet fleet = {0}, newfleet = {0};
    rk_plan_query q;
    memset(&q, 0, sizeof q);
    rk_plan_config *cf = &q.config;
    rk_plan_config_default(cf);
    if (fleet_path) {
        if (rk_plan_fleet_load(fleet_path, &fleet, &err))
            return file_error(&err);
        cf->hosts = fleet.hosts;
        cf->gpus_per_host = fleet.gpus / fleet.hosts;
    } else {
        cf->hosts = (uint32_t)hosts;
        cf->gpus_per_host = (uint32_t)(gph ? gph : 1);
        fleet.gpus = cf->hosts * cf->gpus_per_host;
        fleet.tflops = fleet.gpus;
    }
    if (min_hosts > (int)cf->hosts)
        return rk_cli_usage_error("plan", usage_text, "--min-hosts %d is more than the %u hosts",
                                  min_hosts, cf->hosts);
    cf->spare_hosts = (uint32_t)spare;
    cf->min_hosts = (uint32_t)min_hosts;
    memcpy(cf->mix, mix, sizeof mix);
    rk_plan_trace trace = {0};
    if (trace_path) {
        if (rk_plan_trace_load(trace_path, &trace, &err))
            return file_error(&err);
        if (trace.nodes > cf->hosts + cf->spare_hosts)
            for (size_t i = 0; i < trace.n; i++) /* more nodes than hosts: folded onto them */
                trace.faults[i].host %= cf->hosts;
        cf->trace = trace.faults;
        cf->trace_len = trace.n;
    }
    double hours = fleet_path ? fleet.hours_mean : 0;
    if (rk_plan_failures_set(cf, trace_path ? "none" : failures, hours * 3600, &err)) {
        rk_plan_trace_free(&trace);
        return rk_cli_usage_error("plan", usage_text, "--failures: %s", err.msg);
    }
    if (summary_path) {
        rk_plan_measured m;
        if (rk_plan_summary_load(summary_path, cf->detect_s[RK_PLAN_CRASH], &m, &err)) {
            rk_plan_trace_free(&trace);
            return file_error(&err);
        }
        cf->step_s = m.step_s;
        cf->mode = m.mode;
        if (m.has_restart)
            cf->restart_s[m.mode] = m.restart_s;
        if (m.has_state) {
            cf->ckpt_cost_s = m.state_bytes / CKPT_BYTES_PER_S;
            cf->snap_cost_s = m.state_bytes / SNAP_BYTES_PER_S;
        }
    }
    if (step > 0)
        cf->step_s = step;
    if (recovery >= 0)
        cf->mode = recovery;
    if (state >= 0) {
        cf->ckpt_cost_s = state / CKPT_BYTES_PER_S;
        cf->snap_cost_s = state / SNAP_BYTES_PER_S;
    }
    if (ckcost >= 0)
        cf->ckpt_cost_s = ckcost;
    if (sncost >= 0)
        cf->snap_cost_s = sncost;
    if (restart >= 0)
        cf->restart_s[cf->mode] = restart;
    cf->snap_every_s = snap_k * cf->step_s;
    cf->horizon_s = days * 86400;
    double mtbf = rk_plan_job_mtbf(cf);
    if (!strcmp(ckpt_every, "auto"))
        cf->ckpt_every_s =
            isfinite(mtbf)
                ? rk_plan_daly_interval(cf->ckpt_cost_s > 0 ? cf->ckpt_cost_s : 1e-3, mtbf)
                : 3600;
    else if (rk_arg_seconds(&a, "--ckpt-every", ckpt_every, 1e-3, 86400 * 365.0,
                            &cf->ckpt_every_s)) {
        rk_plan_trace_free(&trace);
        return RK_EXIT_USAGE;
    }
    double sps_full = sps / cf->step_s;
    if (samples > 0)
        cf->work_s = samples / sps_full;
    q.seed = seed;
    q.runs = runs;
    q.sweep_ckpt = isfinite(mtbf);
    q.sweep_snap = isfinite(mtbf) && cf->mode == RK_PLAN_MEMORY;
    q.spares_max = (unsigned)sweep;
    q.money = (rk_plan_money){fleet.price, years, fleet.watts, kwh, sps_full};
    if (new_path) {
        if (rk_plan_fleet_load(new_path, &newfleet, &err)) {
            rk_plan_trace_free(&trace);
            return file_error(&err);
        }
        q.has_new = 1;
        rk_plan_config *nc = &q.new_config;
        *nc = *cf;
        nc->trace = NULL;
        nc->trace_len = 0;
        nc->hosts = newfleet.hosts;
        nc->gpus_per_host = newfleet.gpus / newfleet.hosts;
        nc->spare_hosts = 0;
        nc->min_hosts = 0;
        nc->step_s = cf->step_s * fleet.tflops / newfleet.tflops;
        nc->snap_every_s = snap_k * nc->step_s;
        if (rk_plan_failures_set(nc, new_failures, newfleet.hours_mean * 3600, &err)) {
            rk_plan_trace_free(&trace);
            return rk_cli_usage_error("plan", usage_text, "--new-failures: %s", err.msg);
        }
        double nm = rk_plan_job_mtbf(nc);
        if (!strcmp(ckpt_every, "auto") && isfinite(nm))
            nc->ckpt_every_s =
                rk_plan_daly_interval(nc->ckpt_cost_s > 0 ? nc->ckpt_cost_s : 1e-3, nm);
        q.new_money = (rk_plan_money){newfleet.price, years, newfleet.watts, kwh, sps / nc->step_s};
        if (samples > 0)
            nc->work_s = samples / q.new_money.samples_per_s;
    }
    rk_plan_answer ans;
    int rc = rk_plan_answer_query(&q, &ans, &err);
    rk_plan_trace_free(&trace);
    if (rc) {
        fprintf(stderr, "rk plan: %s\n", err.msg);
        return rc == RK_ENOMEM ? RK_EXIT_FAIL : RK_EXIT_USAGE;
    }
    static const char *modes[] = {"disk", "memory", "inplace"};
    if (json) {
        json_t *o = json_pack("{s:i,s:i,s:i,s:s,s:s,s:f,s:f,s:f,s:f,s:f,s:f}", "hosts", cf->hosts,
                              "gpus_per_host", cf->gpus_per_host, "spare_hosts", cf->spare_hosts,
                              "failures", trace_path ? "stepfun-trace" : failures, "recovery",
                              modes[cf->mode], "step_s", cf->step_s, "ckpt_every_s",
                              cf->ckpt_every_s, "ckpt_cost_s", cf->ckpt_cost_s, "snap_every_s",
                              cf->snap_every_s, "snap_cost_s", cf->snap_cost_s, "days", days);
        json_object_set_new(o, "job_mtbf_s", num_or_null(ans.mtbf_s));
        json_object_set_new(o, "stats", stats_json(&ans.stats));
        json_object_set_new(o, "cost_per_million_samples", num_or_null(ans.cost_per_msample));
        if (samples > 0)
            json_object_set_new(o, "samples", json_real(samples));
        if (q.sweep_ckpt)
            json_object_set_new(o, "best_ckpt_every_s", json_real(ans.ckpt.interval_s));
        if (q.sweep_snap)
            json_object_set_new(o, "best_snap_every_s", json_real(ans.snap.interval_s));
        if (ans.spares_n) {
            json_t *arr = json_array();
            for (unsigned i = 0; i < ans.spares_n; i++)
                json_array_append_new(arr, json_real(ans.spares_goodput[i]));
            json_object_set_new(o, "goodput_by_spares", arr);
        }
        if (q.has_new) {
            json_t *n = stats_json(&ans.new_stats);
            json_object_set_new(n, "cost_per_million_samples",
                                num_or_null(ans.new_cost_per_msample));
            json_object_set_new(n, "gpus", json_integer(newfleet.gpus));
            json_object_set_new(n, "step_s", json_real(q.new_config.step_s));
            json_object_set_new(o, "new", n);
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
        json_decref(o);
        if (!s)
            return RK_EXIT_FAIL;
        puts(s);
        free(s);
        return RK_EXIT_OK;
    }
    printf("fleet                        %u hosts x %u GPUs, %u spare host%s; failures %s; "
           "recovery %s\n",
           cf->hosts, cf->gpus_per_host, cf->spare_hosts, cf->spare_hosts == 1 ? "" : "s",
           trace_path ? "stepfun-trace" : failures, modes[cf->mode]);
    printf("job                          step %.4g s, checkpoint %.4g s every %.4g s%s\n",
           cf->step_s, cf->ckpt_cost_s, cf->ckpt_every_s,
           cf->mode == RK_PLAN_MEMORY ? ", snapshots" : "");
    if (isfinite(ans.mtbf_s))
        printf("job MTBF                     %.4g h\n", ans.mtbf_s / 3600);
    print_stats("goodput", &ans.stats);
    printf("failures a run               %.1f (%s %.4g days)\n", ans.stats.failures_mean,
           samples > 0 ? "to the samples' end, at most" : "over", days);
    if (samples > 0) {
        if (ans.stats.finished == ans.stats.runs)
            printf("time to %.4g samples       %.4g days\n", samples,
                   ans.stats.wall_mean_s / 86400);
        else
            printf("time to %.4g samples       more than %.4g days (%d of %d runs done)\n", samples,
                   days, ans.stats.finished, ans.stats.runs);
    }
    if (q.sweep_ckpt)
        printf("best checkpoint interval     %.4g s (goodput %.4f)\n", ans.ckpt.interval_s,
               ans.ckpt.goodput);
    if (q.sweep_snap)
        printf("best snapshot interval       %.4g s (goodput %.4f)\n", ans.snap.interval_s,
               ans.snap.goodput);
    for (unsigned i = 0; i < ans.spares_n; i++)
        printf("goodput with %2u spare host%s  %.4f\n", i, i == 1 ? " " : "s",
               ans.spares_goodput[i]);
    if (isfinite(ans.cost_per_msample) && (fleet.price > 0 || fleet.watts > 0))
        printf("cost per million samples     %.4g\n", ans.cost_per_msample);
    if (q.has_new) {
        print_stats("new cards: goodput", &ans.new_stats);
        printf("new cards: cost per million  %.4g (%u GPUs, step %.4g s)\n",
               ans.new_cost_per_msample, newfleet.gpus, q.new_config.step_s);
    }
    return RK_EXIT_OK;
}
