/*
 * rk train: the reference workload. Loads Fashion-MNIST, builds a model, trains it on the CPU
 * backend, evaluates on the 10,000 test images and reports (terminal progress bar or plain
 * lines, optional metrics JSON and safetensors weights).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/phase.h"
#include "nn/idx.h"
#include "nn/model.h"
#include "nn/train.h"
#include "nn/train_ckpt.h"
#include "progress.h"
#include "rekindle/batch.h"
#include "rekindle/ckpt.h"
#include "rekindle/comm.h"
#include "rekindle/fileio.h"
#include "rekindle/heartbeat.h"
#include "rekindle/snap.h"
#include "rekindle/worker.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk train [OPTIONS]\n"
    "\n"
    "Train a Fashion-MNIST classifier on the CPU (oneDNN) and report its test accuracy.\n"
    "\n"
    "  --model NAME         mlp | cnn | cnn-small (default cnn-small)\n"
    "  --epochs N           passes over the 60,000 training images (default 1);\n"
    "                       0 only evaluates (with --init: check saved weights)\n"
    "  --max-steps N        stop after N optimiser steps (default: no limit)\n"
    "  --batch N            global mini-batch size, split over ranks (default 64)\n"
    "  --batch-policy NAME  how ranks split the batch: even | throughput (by measured\n"
    "                       samples/s) | fault-aware (by --fault-rates) (default even)\n"
    "  --fault-rates LIST   faults per hour of each rank's device, comma-separated\n"
    "  --optimizer NAME     sgd (Nesterov momentum) | adamw (default sgd)\n"
    "  --lr X               learning rate (default 0.01 for sgd, 0.001 for adamw)\n"
    "  --momentum X         sgd momentum (default 0.9)\n"
    "  --weight-decay X     L2 (sgd) or decoupled (adamw) decay (default 0 / 0.01)\n"
    "  --schedule NAME      constant | cosine learning rate over the run (default constant)\n"
    "  --seed N             seed for weights, shuffling and dropout (default 1)\n"
    "  --threads N          CPU threads per rank (default: online CPUs / ranks on the node)\n"
    "  --data DIR           Fashion-MNIST IDX files, gzip or raw\n"
    "                       (default " RK_FMNIST_DEFAULT_DIR ")\n"
    "  --init FILE          start from weights saved by --save (safetensors)\n"
    "  --save FILE          write the final weights (safetensors)\n"
    "  --metrics-json FILE  write the run's numbers as JSON\n"
    "  --no-eval            skip test-set evaluation (benchmarks)\n"
    "  --loss-log FILE      write \"step loss\" per optimiser step (the global batch's mean)\n"
    "  --ckpt-dir DIR       write checkpoints to DIR (docs/checkpoint.md)\n"
    "  --resume             continue from the newest valid checkpoint in --ckpt-dir\n"
    "  --ckpt-every K|auto  steps between checkpoints (default 500); auto: Daly's optimum\n"
    "                       from the measured save cost and --mtbf\n"
    "  --mtbf SECONDS       mean time between failures for auto (default 3600)\n"
    "  --keep N             checkpoints to keep (default 3)\n"
    "  --ckpt-async         snapshot at the step, write from a background thread\n"
    "  --guard on|off       step guards: non-finite values, gradient outliers across ranks,\n"
    "                       loss spikes; a trip redoes the step (default on; docs/guards.md)\n"
    "  --hash-every K       compare replica hashes every K steps, roll back and repair on a\n"
    "                       mismatch (default 10; 0: never)\n"
    "  --spike-z Z          robust z-score of a loss spike (default 10)\n"
    "  --grad-ratio R       a rank's gradient norm R times the others' is wrong arithmetic\n"
    "                       unless a redo reproduces it (default 1000)\n"
    "  --compress KIND      gradient allreduce: none | fp16 | bf16 | onebit (1-bit signs with\n"
    "                       error feedback) | onebit-noef (default none; docs/compression.md)\n"
    "  --compress-warmup N  full-precision allreduce for the first N steps (default 0)\n"
    "  --compress-on WHAT   momentum (default: with sgd, each rank's share of the new momentum\n"
    "                       is compressed, as 1-bit Adam does) | gradient\n"
    "  --precision P        fp32 | fp16 | bf16: activations and gradients stored in P, fp32\n"
    "                       master weights (default fp32; docs/amp.md)\n"
    "  --loss-scale X       fp16: initial loss scale (default 32768)\n"
    "  --loss-scale-min X   fp16: the scale never goes below X (default 1)\n"
    "  --loss-scale-window N  fp16: double the scale after N clean steps (default 2000)\n"
    "  --hysteresis N       fp16: overflows absorbed before the scale backs off (default 1)\n"
    "  -h, --help           show this help\n"
    "\n"
    "Data-parallel: run under Open MPI (mpirun -np N rk train ...); the global batch is split\n"
    "over the ranks and one step equals a one-process step on the same samples.\n"
    "Same seed, same flags, ranks and threads give bitwise identical weights.\n"
    "Under rk run (docs/protocol.md) it reports to the supervisor through RK_HEARTBEAT, takes\n"
    "RK_CKPT_DIR and RK_RESUME=1 in place of --ckpt-dir and --resume, and RK_INJECT faults.\n";

typedef struct train_opts {
    const char *model, *data, *init, *save, *metrics, *loss_log, *fault_rates, *ckpt_dir;
    rk_batch_kind policy;
    int resume, ckpt_async, keep;
    int64_t ckpt_every; /* 0: auto */
    double mtbf;
    int threads;
    int64_t hash_every;
    rk_compress compress;
    rk_loss_scaler_opts scaler;
    rk_train_config cfg;
} train_opts;

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rk train: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n\n%s", usage_text);
    va_end(ap);
    return RK_EXIT_USAGE;
}

static rk_args args = {.cmd = "train", .usage = usage_text};

static int parse_float(const char *flag, const char *s, double lo, double hi, float *out)
{
    double v;
    if (rk_arg_real(&args, flag, s, lo, hi, &v))
        return -1;
    *out = (float)v;
    return 0;
}

enum {
    OPT_MAX_STEPS = 256,
    OPT_OPTIM,
    OPT_METRICS,
    OPT_NO_EVAL,
    OPT_WD,
    OPT_SCHEDULE,
    OPT_LOSS_LOG,
    OPT_POLICY,
    OPT_FAULT_RATES,
    OPT_CKPT_DIR,
    OPT_RESUME,
    OPT_CKPT_EVERY,
    OPT_MTBF,
    OPT_KEEP,
    OPT_CKPT_ASYNC,
    OPT_GUARD,
    OPT_HASH_EVERY,
    OPT_SPIKE_Z,
    OPT_GRAD_RATIO,
    OPT_COMPRESS,
    OPT_COMPRESS_WARMUP,
    OPT_COMPRESS_ON,
    OPT_PRECISION,
    OPT_LOSS_SCALE,
    OPT_LOSS_SCALE_MIN,
    OPT_LOSS_SCALE_WINDOW,
    OPT_HYSTERESIS
};

static int parse_args(int argc, char **argv, train_opts *o)
{
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},
        {"epochs", required_argument, 0, 'e'},
        {"max-steps", required_argument, 0, OPT_MAX_STEPS},
        {"batch", required_argument, 0, 'b'},
        {"lr", required_argument, 0, 'l'},
        {"momentum", required_argument, 0, 'M'},
        {"weight-decay", required_argument, 0, OPT_WD},
        {"optimizer", required_argument, 0, OPT_OPTIM},
        {"schedule", required_argument, 0, OPT_SCHEDULE},
        {"seed", required_argument, 0, 's'},
        {"threads", required_argument, 0, 't'},
        {"data", required_argument, 0, 'd'},
        {"init", required_argument, 0, 'i'},
        {"save", required_argument, 0, 'o'},
        {"metrics-json", required_argument, 0, OPT_METRICS},
        {"no-eval", no_argument, 0, OPT_NO_EVAL},
        {"help", no_argument, 0, 'h'},
        {"loss-log", required_argument, 0, OPT_LOSS_LOG},
        {"batch-policy", required_argument, 0, OPT_POLICY},
        {"fault-rates", required_argument, 0, OPT_FAULT_RATES},
        {"ckpt-dir", required_argument, 0, OPT_CKPT_DIR},
        {"resume", no_argument, 0, OPT_RESUME},
        {"ckpt-every", required_argument, 0, OPT_CKPT_EVERY},
        {"mtbf", required_argument, 0, OPT_MTBF},
        {"keep", required_argument, 0, OPT_KEEP},
        {"ckpt-async", no_argument, 0, OPT_CKPT_ASYNC},
        {"guard", required_argument, 0, OPT_GUARD},
        {"hash-every", required_argument, 0, OPT_HASH_EVERY},
        {"spike-z", required_argument, 0, OPT_SPIKE_Z},
        {"grad-ratio", required_argument, 0, OPT_GRAD_RATIO},
        {"compress", required_argument, 0, OPT_COMPRESS},
        {"compress-warmup", required_argument, 0, OPT_COMPRESS_WARMUP},
        {"compress-on", required_argument, 0, OPT_COMPRESS_ON},
        {"precision", required_argument, 0, OPT_PRECISION},
        {"loss-scale", required_argument, 0, OPT_LOSS_SCALE},
        {"loss-scale-min", required_argument, 0, OPT_LOSS_SCALE_MIN},
        {"loss-scale-window", required_argument, 0, OPT_LOSS_SCALE_WINDOW},
        {"hysteresis", required_argument, 0, OPT_HYSTERESIS},
        {0, 0, 0, 0}};
    /* Two passes: the optimiser decides the defaults the other flags override. */
    rk_optim_kind kind = RK_OPTIM_SGD;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--optimizer") == 0 && i + 1 < argc)
            v = argv[i + 1];
        else if (strncmp(argv[i], "--optimizer=", 12) == 0)
            v = argv[i] + 12;
        if (v && strcmp(v, "adamw") == 0)
            kind = RK_OPTIM_ADAMW;
    }
    memset(o, 0, sizeof *o);
    o->keep = RK_CKPT_KEEP_DEFAULT;
    o->ckpt_every = RK_CKPT_EVERY_DEFAULT;
    o->mtbf = 3600.0;
    o->hash_every = 10;
    o->model = "cnn-small";
    o->data = RK_FMNIST_DEFAULT_DIR;
    rk_train_config_default(&o->cfg, kind);
    rk_loss_scaler_opts_default(&o->scaler);
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'e':
            if (rk_arg_count(&args, "--epochs", optarg, 0, 100000, &o->cfg.epochs))
                return RK_EXIT_USAGE;
            break;
        case OPT_MAX_STEPS:
            if (rk_arg_step(&args, "--max-steps", optarg, 1, &o->cfg.max_steps))
                return RK_EXIT_USAGE;
            break;
        case 'b':
            if (rk_arg_count(&args, "--batch", optarg, 1, 60000, &o->cfg.batch))
                return RK_EXIT_USAGE;
            break;
        case 'l':
            if (parse_float("--lr", optarg, 1e-12, 100.0, &o->cfg.lr))
                return RK_EXIT_USAGE;
            break;
        case 'M':
            if (parse_float("--momentum", optarg, 0.0, 0.999999, &o->cfg.momentum))
                return RK_EXIT_USAGE;
            break;
        case OPT_WD:
            if (parse_float("--weight-decay", optarg, 0.0, 10.0, &o->cfg.weight_decay))
                return RK_EXIT_USAGE;
            break;
        case OPT_OPTIM:
            if (strcmp(optarg, "sgd") && strcmp(optarg, "adamw"))
                return usage_error("--optimizer '%s' is not sgd or adamw", optarg);
            break;
        case OPT_SCHEDULE:
            if (strcmp(optarg, "constant") == 0)
                o->cfg.schedule = RK_LR_CONSTANT;
            else if (strcmp(optarg, "cosine") == 0)
                o->cfg.schedule = RK_LR_COSINE;
            else
                return usage_error("--schedule '%s' is not constant or cosine", optarg);
            break;
        case 's':
            if (rk_arg_seed(&args, "--seed", optarg, &o->cfg.seed))
                return RK_EXIT_USAGE;
            break;
        case 't':
            if (rk_arg_count(&args, "--threads", optarg, 1, 1024, &o->threads))
                return RK_EXIT_USAGE;
            break;
        case 'd': o->data = optarg; break;
        case 'i': o->init = optarg; break;
        case 'o': o->save = optarg; break;
        case OPT_METRICS: o->metrics = optarg; break;
        case OPT_NO_EVAL: o->cfg.eval = 0; break;
        case OPT_LOSS_LOG: o->loss_log = optarg; break;
        case OPT_POLICY:
            if (rk_batch_kind_parse(optarg, &o->policy, NULL))
                return usage_error("--batch-policy '%s' is not even, throughput or fault-aware",
                                   optarg);
            break;
        case OPT_FAULT_RATES: o->fault_rates = optarg; break;
        case OPT_CKPT_DIR: o->ckpt_dir = optarg; break;
        case OPT_RESUME: o->resume = 1; break;
        case OPT_CKPT_ASYNC: o->ckpt_async = 1; break;
        case OPT_CKPT_EVERY:
            if (strcmp(optarg, "auto") == 0)
                o->ckpt_every = 0;
            else if (rk_arg_step(&args, "--ckpt-every", optarg, 1, &o->ckpt_every))
                return RK_EXIT_USAGE;
            break;
        case OPT_MTBF:
            if (rk_arg_seconds(&args, "--mtbf", optarg, 1.0, 1e12, &o->mtbf))
                return RK_EXIT_USAGE;
            o->mtbf = (float)o->mtbf; /* as before: the same flags, the same auto interval */
            break;
        case OPT_KEEP:
            if (rk_arg_count(&args, "--keep", optarg, 1, 1000000, &o->keep))
                return RK_EXIT_USAGE;
            break;
        case OPT_GUARD:
            if (strcmp(optarg, "on") == 0)
                o->cfg.guard = 1;
            else if (strcmp(optarg, "off") == 0)
                o->cfg.guard = 0;
            else
                return usage_error("--guard '%s' is not on or off", optarg);
            break;
        case OPT_HASH_EVERY:
            if (rk_arg_step(&args, "--hash-every", optarg, 0, &o->hash_every))
                return RK_EXIT_USAGE;
            break;
        case OPT_SPIKE_Z: {
            float f;
            if (parse_float("--spike-z", optarg, 1.0, 1e6, &f))
                return RK_EXIT_USAGE;
            o->cfg.spike_z = f;
            break;
        }
        case OPT_GRAD_RATIO: {
            float f;
            if (parse_float("--grad-ratio", optarg, 2.0, 1e30, &f))
                return RK_EXIT_USAGE;
            o->cfg.grad_ratio = f;
            break;
        }
        case OPT_COMPRESS: {
            rk_err e = {0};
            if (rk_compress_parse(optarg, &o->compress, &e))
                return usage_error("--compress: %s", e.msg);
            break;
        }
        case OPT_COMPRESS_WARMUP:
            if (rk_arg_step(&args, "--compress-warmup", optarg, 0, &o->cfg.compress_warmup))
                return RK_EXIT_USAGE;
            break;
        case OPT_COMPRESS_ON:
            if (strcmp(optarg, "momentum") == 0)
                o->cfg.compress_momentum = 1;
            else if (strcmp(optarg, "gradient") == 0)
                o->cfg.compress_momentum = 0;
            else
                return usage_error("--compress-on: '%s' is not momentum or gradient", optarg);
            break;
        case OPT_PRECISION:
            if (rk_dtype_parse(optarg, &o->cfg.precision))
                return usage_error("--precision '%s' is not fp32, fp16 or bf16", optarg);
            break;
        case OPT_LOSS_SCALE:
            if (parse_float("--loss-scale", optarg, 1.0, 16777216.0, &o->scaler.init_scale))
                return RK_EXIT_USAGE;
            break;
        case OPT_LOSS_SCALE_MIN:
            if (parse_float("--loss-scale-min", optarg, 1.0 / 65536, 16777216.0,
                            &o->scaler.min_scale))
                return RK_EXIT_USAGE;
            break;
        case OPT_LOSS_SCALE_WINDOW:
            if (rk_arg_count(&args, "--loss-scale-window", optarg, 1, INT_MAX,
                             &o->scaler.growth_interval))
                return RK_EXIT_USAGE;
            break;
        case OPT_HYSTERESIS:
            if (rk_arg_count(&args, "--hysteresis", optarg, 1, 1000, &o->scaler.hysteresis))
                return RK_EXIT_USAGE;
            break;
        case 'h': fputs(usage_text, stdout); return -1;
        case ':':
        case '?':
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    /* under a supervisor: its checkpoint directory and resume flag */
    const char *env_dir;
    int env_resume;
    rk_worker_ckpt_env(&env_dir, &env_resume);
    if (!o->ckpt_dir && env_dir)
        o->ckpt_dir = env_dir;
    if (env_resume && o->ckpt_dir)
        o->resume = 1;
    if (o->fault_rates && o->policy != RK_BATCH_FAULT_AWARE)
        return usage_error("--fault-rates needs --batch-policy fault-aware");
    if (o->cfg.precision != RK_F16 &&
        (o->scaler.init_scale != RK_LOSS_SCALE_INIT || o->scaler.min_scale != RK_LOSS_SCALE_MIN ||
         o->scaler.growth_interval != RK_LOSS_SCALE_GROWTH_INTERVAL ||
         o->scaler.hysteresis != RK_LOSS_SCALE_HYSTERESIS))
        return usage_error("the loss-scale flags need --precision fp16 (bf16 and fp32 have "
                           "fp32's exponent range and need no scaling)");
    if (o->scaler.min_scale > o->scaler.init_scale)
        return usage_error("--loss-scale-min %g is above --loss-scale %g",
                           (double)o->scaler.min_scale, (double)o->scaler.init_scale);
    if (!o->ckpt_dir && (o->resume || o->ckpt_async))
        return usage_error("%s needs --ckpt-dir", o->resume ? "--resume" : "--ckpt-async");
    int known = 0;
    for (int i = 0; rk_model_names[i]; i++)
        known |= strcmp(o->model, rk_model_names[i]) == 0;
    if (!known)
        return usage_error("--model '%s' is not mlp, cnn or cnn-small", o->model);
    /* every path of the right kind before any work starts */
    if (rk_arg_path(&args, "--data", o->data, RK_PATH_DIR) ||
        (o->init && rk_arg_path(&args, "--init", o->init, RK_PATH_FILE)) ||
        (o->ckpt_dir && rk_arg_path(&args, o->ckpt_dir == env_dir ? "RK_CKPT_DIR" : "--ckpt-dir",
                                    o->ckpt_dir, RK_PATH_DIR_OR_NEW)) ||
        (o->save && rk_arg_path(&args, "--save", o->save, RK_PATH_OUTPUT)) ||
        (o->metrics && rk_arg_path(&args, "--metrics-json", o->metrics, RK_PATH_OUTPUT)) ||
        (o->loss_log && rk_arg_path(&args, "--loss-log", o->loss_log, RK_PATH_OUTPUT)))
        return RK_EXIT_USAGE;
    return RK_EXIT_OK;
}

typedef struct view {
    rk_progress bar; /* stdout: a bar on a terminal of our own, else plain lines */
} view;

static void fmt_eta(double s, char *buf, size_t n)
{
    long t = (long)(s + 0.5);
    snprintf(buf, n, "ETA %ld:%02ld", t / 60, t % 60);
}

static void on_progress(const rk_train_progress *p, void *user)
{
    view *v = user;
    char label[32], counts[48], loss[32], rate[32], eta[32];
    snprintf(label, sizeof label, "epoch %d/%d", p->epoch, p->epochs);
    snprintf(loss, sizeof loss, "loss %.4f", p->loss);
    snprintf(rate, sizeof rate, "%.0f samples/s", p->samples_per_s);
    if (p->epoch_done) {
        char acc[40] = "";
        if (p->test_accuracy >= 0)
            snprintf(acc, sizeof acc, "  test accuracy %.4f", p->test_accuracy);
        rk_progress_say(&v->bar, "%s  steps %lld  %s  %s%s\n", label, (long long)p->step, loss,
                        rate, acc);
        rk_progress_restart(&v->bar);
        return;
    }
    snprintf(counts, sizeof counts, "step %lld/%lld", (long long)p->step_in_epoch,
             (long long)p->steps_in_epoch);
    fmt_eta(p->eta_s, eta, sizeof eta);
    rk_progress_parts parts = {.label = label,
                               .frac = (double)p->step_in_epoch / (double)p->steps_in_epoch,
                               .counts = counts,
                               .detail = loss,
                               .rate = rate,
                               .eta = eta};
    rk_progress_draw(&v->bar, &parts);
}

static int write_metrics(const train_opts *o, const rk_model *m, const rk_train_result *r,
                         const char *device, int ranks, rk_err *err)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)rk_model_hash(m));
    json_t *j = json_object();
    json_object_set_new(j, "model", json_string(o->model));
    json_object_set_new(j, "device", json_string(device));
    json_object_set_new(j, "threads", json_integer(o->threads));
    json_object_set_new(j, "ranks", json_integer(ranks));
    json_object_set_new(j, "batch_policy", json_string(rk_batch_kind_name(o->policy)));
    json_t *sh = json_array();
    for (int q = 0; q < ranks && q < 8; q++)
        json_array_append_new(sh, json_integer(r->last_shares[q]));
    json_object_set_new(j, "last_shares", sh);
    json_object_set_new(j, "optimizer",
                        json_string(o->cfg.optim == RK_OPTIM_ADAMW ? "adamw" : "sgd"));
    json_object_set_new(j, "lr", json_real(o->cfg.lr));
    json_object_set_new(j, "batch", json_integer(o->cfg.batch));
    json_object_set_new(j, "seed", json_integer((json_int_t)o->cfg.seed));
    json_object_set_new(j, "epochs", json_integer(r->epochs_run));
    json_object_set_new(j, "steps", json_integer(r->steps));
    json_object_set_new(j, "parameters", json_integer((json_int_t)m->numel));
    json_object_set_new(j, "test_accuracy",
                        r->test_accuracy >= 0 ? json_real(r->test_accuracy) : json_null());
    json_object_set_new(j, "test_loss",
                        r->test_accuracy >= 0 ? json_real(r->test_loss) : json_null());
    json_object_set_new(j, "final_train_loss",
                        r->steps > 0 ? json_real(r->final_train_loss) : json_null());
    json_object_set_new(j, "train_samples_per_s", json_real(r->train_samples_per_s));
    json_object_set_new(j, "train_seconds", json_real(r->train_seconds));
    json_object_set_new(j, "allreduce_seconds", json_real(r->allreduce_seconds));
    json_object_set_new(j, "compress", json_string(rk_compress_name(o->compress)));
    json_object_set_new(j, "compress_warmup", json_integer(o->cfg.compress_warmup));
    json_object_set_new(j, "compress_on",
                        json_string(o->cfg.optim == RK_OPTIM_SGD && o->cfg.momentum != 0.0f &&
                                            o->cfg.compress_momentum
                                        ? "momentum"
                                        : "gradient"));
    json_object_set_new(j, "grad_bytes_sent", json_integer((json_int_t)r->grad_bytes_sent));
    json_object_set_new(j, "precision", json_string(rk_dtype_name(o->cfg.precision)));
    json_object_set_new(j, "conv_storage", json_string(rk_dtype_name(m->conv_store)));
    json_object_set_new(j, "loss_scale",
                        o->cfg.precision == RK_F16 ? json_real(r->loss_scale) : json_null());
    json_object_set_new(j, "amp_skipped_steps", json_integer(r->amp_skipped));
    json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)ru.ru_maxrss * 1024));
    json_object_set_new(j, "weights_xxh64", json_string(hash));
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(j);
    if (!text)
        return rk_err_set(err, RK_ENOMEM, "metrics: cannot encode JSON");
    size_t len = strlen(text);
    text[len] = '\n'; /* replace the terminator: the file ends with a newline */
    int rc = rk_file_write_atomic(o->metrics, text, len + 1, err);
    free(text);
    return rc;
}

/* The batch policy as rk_train sees it: shares from the policy, throughput observations
 * gathered from every rank each step so all ranks feed the policy the same numbers. */
typedef struct policy_glue {
    rk_batch_policy *policy;
    rk_worker *worker;
} policy_glue;

static int glue_shares(void *user, int64_t global, int nranks, int64_t *shares, rk_err *err)
{
    (void)global, (void)nranks;
    return rk_batch_shares(((policy_glue *)user)->policy, shares, err);
}

static int glue_observe(void *user, int64_t step, int n_local, double seconds, rk_err *err)
{
    (void)step;
    policy_glue *g = user;
    return rk_worker_observe(g->worker, g->policy, n_local, seconds, err);
}

/* --fault-rates "a,b,c": exactly one non-negative number per rank. */
static int parse_fault_rates(const char *list, rk_batch_policy *p, int nranks, rk_err *err)
{
    const char *s = list;
    int count = 0;
    for (;;) {
        char item[64];
        size_t len = strcspn(s, ",");
        const char *end = s + len;
        double v = 0;
        if (len < sizeof item) {
            memcpy(item, s, len);
            item[len] = '\0';
        }
        if (len >= sizeof item || !rk_args_real(item, -HUGE_VAL, HUGE_VAL, &v))
            return rk_err_set(err, RK_EINVAL, "--fault-rates '%s': item %d is not a number", list,
                              count + 1);
        if (count < nranks && rk_batch_set_fault_rate(p, count, v, NULL) != RK_OK)
            return rk_err_set(err, RK_EINVAL,
                              "--fault-rates '%s': item %d (%g) is not a rate "
                              "in faults per hour",
                              list, count + 1, v);
        count++;
        if (*end == '\0')
            break;
        s = end + 1;
    }
    if (count != nranks)
        return rk_err_set(err, RK_EINVAL, "--fault-rates '%s' has %d values for %d ranks", list,
                          count, nranks);
    return RK_OK;
}

/* The model's and optimiser's buffers, as the worker runtime sees them: each parameter tensor
 * (where an injected bitflip lands) and its gradient (nan, gradflip), the optimiser's moments
 * and step count (hashed across replicas, repaired from the majority), and this rank's own
 * state that a rollback restores: error-feedback residuals, the loss scaler. */
static int register_buffers(rk_worker *w, rk_model *m, rk_optim *opt, rk_compressor *z,
                            rk_loss_scaler *scaler, rk_err *err)
{
    int rc = RK_OK;
    for (int i = 0; i < m->nparams && !rc; i++) {
        char name[64];
        snprintf(name, sizeof name, "grad.%s", m->params[i].name);
        if (!(rc = rk_worker_add_f32(w, RK_WORKER_PARAM, m->params[i].name, m->params[i].data,
                                     m->params[i].numel, err)))
            rc = rk_worker_add_f32(w, RK_WORKER_GRAD, name, m->params[i].grad, m->params[i].numel,
                                   err);
    }
    if (!rc)
        rc = rk_worker_add_f32(w, RK_WORKER_STATE, "optim.s1", opt->s1, m->block_len, err);
    if (!rc && opt->s2)
        rc = rk_worker_add_f32(w, RK_WORKER_STATE, "optim.s2", opt->s2, m->block_len, err);
    if (!rc)
        rc = rk_worker_add_bytes(w, RK_WORKER_STATE, "optim.t", &opt->t, sizeof opt->t, err);
    if (!rc && z && rk_compressor_state_len(z))
        rc = rk_worker_add_f32(w, RK_WORKER_LOCAL, "comm.residuals", rk_compressor_state(z),
                               rk_compressor_state_len(z), err);
    if (!rc && scaler)
        rc = rk_worker_add_bytes(w, RK_WORKER_LOCAL, "scaler", scaler, sizeof *scaler, err);
    return rc;
}

/* rk_train under the worker runtime: checkpoints (with --ckpt-dir) in rk train's format,
 * resumed first with --resume, scheduled, on command and at the end by the runtime. */
static int train_supervised(const train_opts *o, rk_model *m, rk_optim *opt,
                            const rk_dataset *train, const rk_dataset *test, rk_comm *comm,
                            rk_batch_policy *policy, view *v, rk_worker *w, rk_train_result *res,
                            rk_err *err)
{
    int rank = rk_comm_rank(comm);
    rk_train_config cfg = o->cfg;
    cfg.worker = w;
    rk_trainer_ckpt t = {.dir = o->ckpt_dir,
                         .keep = o->keep,
                         .async = o->ckpt_async,
                         .samples = train->n,
                         .m = m,
                         .opt = opt,
                         .policy = policy,
                         .comm = comm,
                         .cfg = &cfg,
                         .log = rank == 0 ? rk_progress_notes(&v->bar, stdout) : NULL,
                         .worker = w};
    int rc = RK_OK;
    if (o->ckpt_dir) {
        rk_worker_ckpt_opts co;
        rk_worker_ckpt_opts_default(&co);
        co.dir = o->ckpt_dir;
        co.config_json = t.config; /* named in the refusal of a directory of another run */
        co.resume = o->resume;
        co.every = o->ckpt_every;
        co.mtbf_s = o->mtbf;
        co.keep = o->keep;
        co.saver = rk_trainer_ckpt_saver(&t);
        if ((rc = rk_trainer_ckpt_init(&t, err)))
            return rc;
        rc = rk_worker_ckpt(w, &co, &cfg.start_step, err);
    }
    if (!rc)
        rc = rk_worker_hello(w, cfg.start_step, err);
    if (!rc)
        rc = rk_train(m, opt, train, cfg.eval ? test : NULL, &cfg, comm,
                      rank == 0 ? on_progress : NULL, v, res, err);
    if (!rc)
        rc = rk_worker_ckpt_final(w, res->steps, err);
    int frc = o->ckpt_dir ? rk_trainer_ckpt_finish(&t, rc ? NULL : err) : RK_OK;
    return rc ? rc : frc;
}

int rk_cmd_train(int argc, char **argv)
{
    /* RK_TRACE_LAUNCH (base/phase.h, docs/run.md): the phases of a rank's start-up */
    rk_phase_mark_env("train.main");
    train_opts o;
    int st = parse_args(argc, argv, &o);
    if (st != RK_EXIT_OK)
        return st < 0 ? RK_EXIT_OK : st;

    rk_err err = {0};
    rk_dataset train = {0}, test = {0};
    rk_model m = {0};
    rk_comm *comm = NULL;
    FILE *loss_log = NULL;
    policy_glue glue = {0};
    rk_worker *w = NULL;
    rk_worker_opts wo;
    rk_worker_opts_default(&wo);
    wo.name = "rk train";
    wo.seed = o.cfg.seed;
    wo.hash_every = o.cfg.guard ? o.hash_every : 0;
    rk_train_result res = {.test_accuracy = -1.0};
    rk_compressor *compressor = NULL;
    rk_loss_scaler scaler;
    view v = {0};
    int rc = rk_comm_open(&comm, "auto", &err);
    if (rc)
        goto fail;
    rk_phase_mark_env("train.comm");
    /* a bar only on a terminal of our own: under mpirun (even one rank) or a supervisor,
     * plain lines; the worker's notes and diagnostics clear it before they print */
    rk_progress_init(&v.bar, stdout,
                     rk_comm_size(comm) == 1 && !getenv("OMPI_COMM_WORLD_SIZE") &&
                         !getenv("RK_HEARTBEAT"));
    wo.notes = rk_progress_notes(&v.bar, stdout);
    wo.diag = rk_progress_notes(&v.bar, stderr);
    if ((rc = rk_worker_open(&w, comm, &wo, &err)))
        goto fail;
    int rank = rk_comm_rank(comm), nranks = rk_comm_size(comm);
    if (o.threads <= 0) { /* share the node's cores among its ranks */
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        o.threads = (int)(cpus > 0 ? cpus : 1) / rk_comm_local_size(comm);
        if (o.threads < 1)
            o.threads = 1;
    }
    const rk_backend *be = rk_backend_get(RK_DEVICE_CPU, &err);
    if (!be)
        rc = err.code;
    if (!be || (rc = be->init(o.threads, &err)))
        goto fail;
    /* under rk run --recovery memory: the decoded dataset kept in the job's snapshot
     * directory, so that a relaunch does not inflate it again (docs/recovery.md) */
    char cache[RK_SNAP_PATH_MAX + 16] = "";
    const char *snap = getenv(RK_SNAP_DIR_ENV);
    if (snap && *snap && rk_snap_cache_dir(snap, cache, sizeof cache, NULL) != RK_OK)
        cache[0] = '\0'; /* no cache: the dataset is read from its files, as without rk run */
    if ((rc = rk_dataset_load_fmnist_cached(o.data, 1, cache, &train, &err)) ||
        (o.cfg.eval && (rc = rk_dataset_load_fmnist_cached(o.data, 0, cache, &test, &err))))
        goto fail;
    rk_phase_mark_env("train.data");
    if (o.cfg.batch < nranks) {
        rc = rk_err_set(&err, RK_EINVAL, "--batch %d is smaller than the %d ranks", o.cfg.batch,
                        nranks);
        goto fail;
    }
    if ((rc = rk_batch_policy_create(&glue.policy, o.policy, nranks, o.cfg.batch, &err)) ||
        (o.fault_rates && (rc = parse_fault_rates(o.fault_rates, glue.policy, nranks, &err))))
        goto fail;
    glue.worker = w;
    o.cfg.shares = glue_shares;
    o.cfg.observe = o.policy == RK_BATCH_THROUGHPUT ? glue_observe : NULL;
    o.cfg.shares_user = &glue;
    if ((rc = rk_model_create(&m, o.model, o.cfg.batch, be, o.cfg.seed, &err)))
        goto fail;
    if (o.init && (rc = rk_model_load(&m, o.init, &err)))
        goto fail;
    if ((rc = rk_model_set_precision(&m, o.cfg.precision, &err)) ||
        (rc = rk_compressor_create(&compressor, comm, o.compress, m.block_len, &err)))
        goto fail;
    o.cfg.compressor = compressor;
    rk_phase_mark_env("train.model");
    if (o.cfg.precision == RK_F16) {
        if ((rc = rk_loss_scaler_init(&scaler, &o.scaler, &err)))
            goto fail;
        o.cfg.scaler = &scaler;
    }
    if (rank == 0 && o.loss_log && !(loss_log = fopen(o.loss_log, "we"))) {
        rc = rk_err_set(&err, RK_EIO, "--loss-log %s: %s", o.loss_log, strerror(errno));
        goto fail;
    }
    o.cfg.loss_log = loss_log;
    if (rank == 0) { /* through the bar's stream: wrapped to the width on a terminal */
        FILE *so = rk_progress_notes(&v.bar, stdout);
        fprintf(so, "rk train: model %s (%zu parameters), %s, %d thread%s", o.model, m.numel,
                be->name, o.threads, o.threads == 1 ? "" : "s");
        if (nranks > 1)
            fprintf(so, " x %d ranks (%s)", nranks, rk_comm_backend(comm));
        if (nranks > 1)
            fprintf(so, ", %s batch split", rk_batch_kind_name(o.policy));
        fprintf(so, ", batch %d, %s lr %g, %d train / %d test images\n", o.cfg.batch,
                o.cfg.optim == RK_OPTIM_ADAMW ? "adamw" : "sgd", (double)o.cfg.lr, train.n, test.n);
        if (o.compress != RK_COMPRESS_NONE || o.cfg.precision != RK_F32) {
            fprintf(so, "rk train: gradients allreduced as %s", rk_compress_name(o.compress));
            if (o.compress != RK_COMPRESS_NONE && o.cfg.optim == RK_OPTIM_SGD &&
                o.cfg.momentum != 0.0f)
                fprintf(so, " (on the %s)", o.cfg.compress_momentum ? "momentum" : "gradient");
            if (o.compress != RK_COMPRESS_NONE && o.cfg.compress_warmup > 0)
                fprintf(so, " after %lld full-precision steps", (long long)o.cfg.compress_warmup);
            if (o.compress != RK_COMPRESS_NONE && nranks == 1)
                fprintf(so, " (one rank: nothing to send)");
            fprintf(so, "; precision %s", rk_dtype_name(o.cfg.precision));
            if (o.cfg.precision == RK_F16)
                fprintf(so, ", loss scale %g", (double)scaler.scale);
            fprintf(so, "\n");
        }
        if (o.cfg.precision != RK_F32)
            fprintf(so, "rk train: %s\n", m.storage_note);
    }
    if (o.cfg.epochs > 0) {
        rk_optim opt;
        if ((rc = rk_optim_init(&opt, o.cfg.optim, &m, &err)))
            goto fail;
        if (!(rc = register_buffers(w, &m, &opt, compressor,
                                    o.cfg.precision == RK_F16 ? &scaler : NULL, &err)))
            rc =
                train_supervised(&o, &m, &opt, &train, &test, comm, glue.policy, &v, w, &res, &err);
        rk_optim_free(&opt, &m);
    } else if (o.cfg.eval) /* evaluation only */
        rc = rk_evaluate(&m, &test, comm, &res.test_accuracy, &res.test_loss, &err);
    if (rc)
        goto fail;
    rk_progress_clear(&v.bar); /* --max-steps can stop with the bar up */
    if (rank == 0) {
        FILE *so = rk_progress_notes(&v.bar, stdout);
        if (res.test_accuracy >= 0)
            fprintf(so, "test accuracy %.4f on %d images (loss %.4f)\n", res.test_accuracy, test.n,
                    res.test_loss);
        fprintf(so,
                "trained %lld steps in %.1f s: %.0f samples/s, final train loss %.4f, weights "
                "xxh64 %016llx\n",
                (long long)res.steps, res.train_seconds, res.train_samples_per_s,
                res.final_train_loss, (unsigned long long)rk_model_hash(&m));
        if (o.save && (rc = rk_model_save(&m, o.save, &err)))
            goto fail;
        if (o.metrics && (rc = write_metrics(&o, &m, &res, be->name, nranks, &err)))
            goto fail;
        if (loss_log && fclose(loss_log) != 0) {
            loss_log = NULL;
            rc = rk_err_set(&err, RK_EIO, "--loss-log %s: write failed", o.loss_log);
            goto fail;
        }
        loss_log = NULL;
    }
    rk_worker_close(w, res.steps, RK_EXIT_OK, NULL);
    rk_progress_close(&v.bar);
    rk_model_destroy(&m);
    rk_dataset_free(&train);
    rk_dataset_free(&test);
    rk_batch_policy_free(glue.policy);
    rk_compressor_free(compressor);
    rk_comm_close(comm);
    return RK_EXIT_OK;
fail:;
    FILE *se = rk_progress_notes(&v.bar, stderr); /* clears the bar, wraps on a terminal */
    if (comm && rk_comm_size(comm) > 1)
        fprintf(se, "rk train (rank %d): %s\n", rk_comm_rank(comm),
                err.msg[0] ? err.msg : rk_strerror(rc));
    else
        fprintf(se, "rk train: %s\n", err.msg[0] ? err.msg : rk_strerror(rc));
    fflush(se);
    if (loss_log)
        fclose(loss_log);
    int code = rc ? rc : err.code;
    int status = rk_worker_exit_status(code);
    rk_worker_close(w, res.steps, status, err.msg);
    rk_progress_close(&v.bar);
    rk_model_destroy(&m);
    rk_dataset_free(&train);
    rk_dataset_free(&test);
    rk_compressor_free(compressor);
    rk_batch_policy_free(glue.policy);
    if (status == RK_EXIT_COMM) /* peers may be stuck in a collective: do not wait for them */
        _exit(status);
    rk_comm_close(comm);
    return status;
}
