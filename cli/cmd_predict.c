/*
 * rk predict: the failure predictor (predict/predict.h, docs/predict.md). Each subcommand
 * parses its flags, makes one library call and prints the result as a table or JSON:
 * `dataset` rk_fleet_data_write (predict/fleetdata.h), `train` rk_fleet_train and `eval`
 * rk_fleet_eval (predict/pipeline.h), `cmapss` rk_cmapss_run (predict/cmapss.h, the
 * real-data check on NASA's C-MAPSS FD001).
 */
#include <cblas.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "predict/cmapss.h"
#include "predict/fleetdata.h"
#include "predict/pipeline.h"
#include "predict/predict.h"
#include "progress.h"
#include "rekindle/fileio.h"
#include "rekindle/health.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk predict cmapss --data DIR [--window T] [--seed S] [--ensemble K] [--json]\n"
    "                         [--validate-only] [--verbose] [TRAINING OPTIONS]\n"
    "       rk predict dataset --sim N --hours H [--span S] [--seed S] [--age HOURS]\n"
    "                          [--val F] [--test F] -o DIR\n"
    "       rk predict train DIR -o MODEL [--window T] [--horizon M] [--seed S] [--hidden H]\n"
    "                          [--near M] [--negatives R] [--hard R] [--min-lead M] [--json]\n"
    "       rk predict eval DIR --model MODEL [--threshold P] [--split test|val] [--json]\n"
    "\n"
    "The failure predictor (docs/predict.md).\n"
    "\n"
    "  dataset  per-minute histories of N simulated GPUs over H hours with the failures the\n"
    "           simulator logged, split by device into train, val, test (default 0.2 each):\n"
    "           DIR/fleet.json, gpu-NNNN.safetensors, events.jsonl. --age: hours of service\n"
    "           at the start (default 20000); --span S: each GPU's H hours are taken from S\n"
    "           hours of fleet life, around its first failure if it fails within S.\n"
    "  train    the predictor on DIR's train split, early-stopped on val: windows of T\n"
    "           minutes (60) labelled 1 when the GPU fails within --horizon M (60); every\n"
    "           positive, every 2nd negative in the --near minutes before them (2 M),\n"
    "           --negatives R random others per positive (1) and --hard R (1) that a first\n"
    "           logistic regression rates riskiest. The logistic-regression baseline trains\n"
    "           on the same windows. Thresholds: the best val F1 with a mean lead of\n"
    "           --min-lead minutes (35). Writes MODEL and MODEL.json.\n"
    "  eval     precision, recall, F1, lead times, false alarms per GPU-day and accuracy on\n"
    "           the held-out test split, beside the two baselines.\n"
    "  cmapss   the real-data check: remaining useful life on NASA's C-MAPSS FD001 (files\n"
    "           train_FD001.txt, test_FD001.txt, RUL_FD001.txt in DIR). Trains K models on\n"
    "           the training engines (a validation split by engine drives early stopping),\n"
    "           averages them and scores each test engine's last cycle once.\n"
    "\n"
    "  --data DIR         the C-MAPSS directory (required)\n"
    "  --window T         cycles per window (default 50)\n"
    "  --first-end C      windows end at every cycle from C on, padded where they would start\n"
    "                     before the engine (default 30)\n"
    "  --seed S           the validation split, and model k's weights and batch order (S + k)\n"
    "                     (default 1)\n"
    "  --ensemble K       models averaged, 1-32 (default 5)\n"
    "  --val-engines N    training engines held out for validation (default 20)\n"
    "  --json             the result as one JSON object on stdout\n"
    "  --validate-only    for tuning: train and validate, never read the test files\n"
    "  --verbose          every epoch's losses on stderr\n"
    "  -h, --help         show this help\n"
    "\n"
    "training options (cmapss defaults; train: hidden 64, epochs 15, patience 3, batch 64,\n"
    "dropout 0.2, --level-noise 0.5: a per-window offset of each feature):\n"
    "  --hidden H         LSTM units (default 32)\n"
    "  --attn A           attention units (default 32)\n"
    "  --dense D          dense layer units (default 32)\n"
    "  --epochs N         at most N epochs per model (default 30)\n"
    "  --patience P       stop after P epochs without a better validation loss (default 5)\n"
    "  --batch B          windows per mini-batch (default 128)\n"
    "  --lr LR            Adam's learning rate (default 0.001)\n"
    "  --dropout P        dropout before the dense layer (default 0)\n"
    "  --noise SD         Gaussian noise on the normalised inputs (default 0)\n"
    "  --weight-decay W   decoupled weight decay (default 0)\n"
    "\n"
    "Exit status: 0 done, 1 training failed, 2 bad usage or bad data (a missing directory or\n"
    "file, a malformed file).\n";

#define usage_error(...) rk_cli_usage_error("predict", usage_text, __VA_ARGS__)

static rk_args args = {.cmd = "predict", .usage = usage_text};

static int num(const char *flag, const char *s, double lo, double hi, double *out)
{
    return rk_arg_real(&args, flag, s, lo, hi, out);
}

static int whole(const char *flag, const char *s, int lo, int hi, int *out)
{
    return rk_arg_count(&args, flag, s, lo, hi, out);
}

/* The model and training options rk predict cmapss and train share, by long name: the value of
 * `name` into cfg, to or seed. 1 when `name` is not one of them, 0 when parsed, -1 (said) when
 * the value is bad. */
static int shared_option(const char *name, const char *arg, rk_pred_config *cfg,
                         rk_pred_train_opts *to, uint64_t *seed)
{
    static const struct {
        const char *name;
        int lo, hi;
        size_t off; /* an int in cfg (model) or in to */
        int model;
    } ints[] = {{"hidden", 1, 1024, offsetof(rk_pred_config, hidden), 1},
                {"attn", 1, 1024, offsetof(rk_pred_config, attn), 1},
                {"dense", 1, 1024, offsetof(rk_pred_config, dense), 1},
                {"epochs", 1, 10000, offsetof(rk_pred_train_opts, max_epochs), 0},
                {"patience", 0, 10000, offsetof(rk_pred_train_opts, patience), 0},
                {"batch", 1, 65536, offsetof(rk_pred_train_opts, batch), 0}};
    static const struct {
        const char *name;
        double lo, hi;
        size_t off; /* a float in to */
    } reals[] = {{"lr", 1e-6, 1, offsetof(rk_pred_train_opts, lr)},
                 {"noise", 0, 10, offsetof(rk_pred_train_opts, input_noise)},
                 {"dropout", 0, 0.95, offsetof(rk_pred_train_opts, dropout)},
                 {"weight-decay", 0, 100, offsetof(rk_pred_train_opts, weight_decay)}};
    char flag[32];
    snprintf(flag, sizeof flag, "--%s", name);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (strcmp(name, ints[i].name) == 0) {
            char *base = ints[i].model ? (char *)cfg : (char *)to;
            return whole(flag, arg, ints[i].lo, ints[i].hi, (int *)(base + ints[i].off)) ? -1 : 0;
        }
    double v;
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
        if (strcmp(name, reals[i].name) == 0) {
            if (num(flag, arg, reals[i].lo, reals[i].hi, &v))
                return -1;
            *(float *)((char *)to + reals[i].off) = (float)v;
            return 0;
        }
    if (strcmp(name, "seed") == 0)
        return rk_arg_seed(&args, "--seed", arg, seed) ? -1 : 0;
    return 1;
}

/* The options of shared_option, in each table that takes them: val 0, so they reach the
 * switch's default and are parsed by name. */
// clang-format off
#define SHARED_LONGS                                                                      \
    {"seed", required_argument, 0, 0}, {"hidden", required_argument, 0, 0},              \
    {"attn", required_argument, 0, 0}, {"dense", required_argument, 0, 0},               \
    {"epochs", required_argument, 0, 0}, {"patience", required_argument, 0, 0},          \
    {"batch", required_argument, 0, 0}, {"lr", required_argument, 0, 0},                 \
    {"noise", required_argument, 0, 0}, {"weight-decay", required_argument, 0, 0},       \
    {"dropout", required_argument, 0, 0}
// clang-format on

/* The switch's default in cmapss and train: a shared option by name, else unknown. 0 parsed,
 * else the exit status (the message said). */
static int other_option(int c, int li, const struct option *longs, char **argv, rk_pred_config *cfg,
                        rk_pred_train_opts *to, uint64_t *seed)
{
    int bad = c != '?' && li >= 0 ? shared_option(longs[li].name, optarg, cfg, to, seed) : 1;
    if (bad < 0)
        return RK_EXIT_USAGE;
    if (bad > 0)
        return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
    return 0;
}

/* The status lines below, on stderr: broken at spaces to fit a terminal (cli/progress.h), as
 * they are; as they are anywhere else. */
static FILE *status(void)
{
    static rk_progress p;
    if (!p.out)
        rk_progress_init(&p, stderr, true);
    return rk_progress_notes(&p, stderr);
}

static void member_line(int k, const rk_pred_report *r, double val_rmse, void *ctx)
{
    const rk_cmapss_opts *o = ctx;
    fprintf(status(),
            "rk predict: model %d/%d (seed %llu): %d epochs (best %d), validation "
            "RMSE %.2f, %.1f s\n",
            k + 1, o->ensemble, (unsigned long long)(o->seed + (uint64_t)k), r->epochs,
            r->best_epoch, val_rmse, r->seconds);
}

static void epoch_line(const rk_pred_epoch *e, void *ctx)
{
    (void)ctx;
    fprintf(status(),
            "rk predict:   epoch %d: training loss %.4f, validation RMSE %.3f%s (%.1f s)\n",
            e->epoch, e->train_loss, sqrt(e->val_loss), e->best ? " *" : "", e->seconds);
}

static int cmd_cmapss(int argc, char **argv)
{
    static const struct option longs[] = {{"data", required_argument, 0, 'd'},
                                          {"window", required_argument, 0, 'w'},
                                          {"ensemble", required_argument, 0, 'k'},
                                          {"val-engines", required_argument, 0, 'v'},
                                          {"json", no_argument, 0, 'j'},
                                          {"validate-only", no_argument, 0, 'V'},
                                          {"verbose", no_argument, 0, 'q'},
                                          {"first-end", required_argument, 0, 'F'},
                                          SHARED_LONGS,
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_cmapss_opts o;
    rk_cmapss_opts_default(&o);
    int as_json = 0;
    opterr = 0;
    optind = 1;
    int c, li = -1, bad;
    for (; (c = getopt_long(argc, argv, "h", longs, &li)) != -1; li = -1) {
        switch (c) {
        case 'd': o.dir = optarg; break;
        case 'w':
            if (whole("--window", optarg, 1, RK_PRED_MAX_WINDOW, &o.window))
                return RK_EXIT_USAGE;
            break;
        case 'k':
            if (whole("--ensemble", optarg, 1, RK_CMAPSS_MAX_MEMBERS, &o.ensemble))
                return RK_EXIT_USAGE;
            break;
        case 'v':
            if (whole("--val-engines", optarg, 1, 100000, &o.val_engines))
                return RK_EXIT_USAGE;
            break;
        case 'V': o.validate_only = 1; break;
        case 'q': o.train.on_epoch = epoch_line; break;
        case 'F':
            if (whole("--first-end", optarg, 1, 100000, &o.first_end))
                return RK_EXIT_USAGE;
            break;
        case 'j': as_json = 1; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default:
            if ((bad = other_option(c, li, longs, argv, &o.model, &o.train, &o.seed)))
                return bad;
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (!o.dir)
        return usage_error("cmapss needs --data DIR (the C-MAPSS FD001 files)");
    struct stat st;
    if (stat(o.dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "rk predict: data directory '%s' does not exist or is not a directory\n",
                o.dir);
        return RK_EXIT_USAGE;
    }
    /* One BLAS thread unless the user says otherwise: the predictor's matrices are small, and
     * a second thread made C-MAPSS training slower (76 s against 58 s wall on 2 cores). */
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    o.on_member = member_line;
    o.ctx = &o;
    rk_cmapss_result r;
    rk_err err = {0};
    int rc = rk_cmapss_run(&o, &r, &err);
    if (rc) {
        fprintf(stderr, "rk predict: %s\n", err.msg[0] ? err.msg : rk_strerror(rc));
        return rk_cli_status(rc);
    }
    if (as_json) {
        json_t *j = json_object(), *ms = json_array();
        json_object_set_new(j, "dataset", json_string("C-MAPSS FD001"));
        json_object_set_new(j, "task", json_string("regress"));
        if (!o.validate_only) {
            json_object_set_new(j, "test_rmse", json_real(r.test_rmse));
            json_object_set_new(j, "test_rmse_capped", json_real(r.test_rmse_capped));
            json_object_set_new(j, "test_score", json_real(r.test_score));
        }
        json_object_set_new(j, "val_rmse", json_real(r.val_rmse));
        json_object_set_new(j, "epochs", json_integer(r.epochs));
        json_object_set_new(j, "seconds", json_real(r.seconds));
        json_object_set_new(j, "window", json_integer(o.window));
        json_object_set_new(j, "first_end", json_integer(o.first_end ? o.first_end : o.window));
        json_object_set_new(j, "rul_cap", json_real(o.rul_cap));
        json_object_set_new(j, "seed", json_integer((json_int_t)o.seed));
        json_object_set_new(j, "ensemble", json_integer(o.ensemble));
        json_object_set_new(j, "hidden", json_integer(o.model.hidden));
        json_object_set_new(j, "train_engines", json_integer(r.train_engines));
        json_object_set_new(j, "val_engines", json_integer(r.val_engines));
        json_object_set_new(j, "test_engines", json_integer(r.test_engines));
        json_object_set_new(j, "train_windows", json_integer((json_int_t)r.train_windows));
        json_object_set_new(j, "val_windows", json_integer((json_int_t)r.val_windows));
        json_object_set_new(j, "imputed_train", json_integer((json_int_t)r.missing_train));
        json_object_set_new(j, "imputed_test", json_integer((json_int_t)r.missing_test));
        for (int k = 0; k < r.members; k++) {
            json_t *m = json_object();
            json_object_set_new(m, "seed", json_integer((json_int_t)(o.seed + (uint64_t)k)));
            json_object_set_new(m, "epochs", json_integer(r.member[k].epochs));
            json_object_set_new(m, "best_epoch", json_integer(r.member[k].best_epoch));
            json_object_set_new(m, "val_rmse", json_real(r.member[k].val_rmse));
            json_object_set_new(m, "seconds", json_real(r.member[k].seconds));
            json_array_append_new(ms, m);
        }
        json_object_set_new(j, "members", ms);
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("C-MAPSS FD001, remaining useful life (capped at %g cycles), window %d, windows "
               "ending from cycle %d\n",
               (double)o.rul_cap, o.window, o.first_end ? o.first_end : o.window);
        printf("engines: %d train (%zu windows), %d validation (%zu windows), %d test\n",
               r.train_engines, r.train_windows, r.val_engines, r.val_windows, r.test_engines);
        printf("missing values filled by interpolation: %zu train, %zu test\n", r.missing_train,
               r.missing_test);
        printf("model: LSTM %d + attention %d + dense %d, ensemble of %d, seed %llu\n\n",
               o.model.hidden, o.model.attn, o.model.dense, o.ensemble, (unsigned long long)o.seed);
        printf("%-38s %10s\n", "metric", "value");
        printf("%-38s %10.2f\n", "validation RMSE (all windows)", r.val_rmse);
        if (o.validate_only) {
            printf("%-38s %10s\n", "test", "not read");
        } else {
            printf("%-38s %10.2f\n", "test RMSE (last cycle, RUL as given)", r.test_rmse);
            printf("%-38s %10.2f\n", "test RMSE (against capped RUL)", r.test_rmse_capped);
            printf("%-38s %10.1f\n", "test PHM08 score", r.test_score);
        }
        printf("%-38s %10d\n", "epochs (all models)", r.epochs);
        printf("%-38s %10.1f\n", "seconds", r.seconds);
        printf("\nreference: deep LSTM (Zheng et al., PHM 2017) test RMSE 16.14\n");
    }
    return RK_EXIT_OK;
}

static void gpu_done(int gpu, int gpus, void *ctx)
{
    (void)ctx;
    if ((gpu + 1) % 16 == 0 || gpu + 1 == gpus)
        fprintf(status(), "rk predict: %d/%d simulated GPUs written\n", gpu + 1, gpus);
}

static int cmd_dataset(int argc, char **argv)
{
    static const struct option longs[] = {{"sim", required_argument, 0, 'S'},
                                          {"hours", required_argument, 0, 'H'},
                                          {"seed", required_argument, 0, 's'},
                                          {"age", required_argument, 0, 'a'},
                                          {"val", required_argument, 0, 'v'},
                                          {"test", required_argument, 0, 't'},
                                          {"out", required_argument, 0, 'o'},
                                          {"json", no_argument, 0, 'j'},
                                          {"span", required_argument, 0, 'p'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_fleet_data_opts o;
    rk_fleet_data_opts_default(&o);
    int have_sim = 0, have_hours = 0, as_json = 0;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "ho:", longs, NULL)) != -1) {
        switch (c) {
        case 'S':
            if (whole("--sim", optarg, 1, 1024, &o.gpus))
                return RK_EXIT_USAGE;
            have_sim = 1;
            break;
        case 'H':
            if (num("--hours", optarg, 1.0 / 60, 100000, &o.hours))
                return RK_EXIT_USAGE;
            have_hours = 1;
            break;
        case 's':
            if (rk_arg_seed(&args, "--seed", optarg, &o.seed))
                return RK_EXIT_USAGE;
            break;
        case 'a':
            if (rk_arg_hours(&args, "--age", optarg, &o.start_age_h))
                return RK_EXIT_USAGE;
            break;
        case 'v':
            if (num("--val", optarg, 0, 0.9, &o.val_frac))
                return RK_EXIT_USAGE;
            break;
        case 't':
            if (num("--test", optarg, 0, 0.9, &o.test_frac))
                return RK_EXIT_USAGE;
            break;
        case 'o': o.dir = optarg; break;
        case 'j': as_json = 1; break;
        case 'p':
            if (num("--span", optarg, 1.0 / 60, 200000, &o.span_h))
                return RK_EXIT_USAGE;
            break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (o.span_h > 0 && have_hours && o.span_h < o.hours)
        return usage_error("--span %g is shorter than --hours %g", o.span_h, o.hours);
    if (!have_sim)
        return usage_error("dataset needs --sim N (only the simulated fleet gives ground truth)");
    if (!have_hours)
        return usage_error("dataset needs --hours H");
    if (!o.dir)
        return usage_error("dataset needs -o DIR");
    if (rk_arg_path(&args, "-o", o.dir, RK_PATH_DIR_OR_NEW))
        return RK_EXIT_USAGE;
    if (o.val_frac + o.test_frac >= 1.0)
        return usage_error("--val %g and --test %g leave no devices for training", o.val_frac,
                           o.test_frac);
    o.progress = gpu_done;
    rk_fleet_data_report r;
    rk_err err = {0};
    int rc = rk_fleet_data_write(&o, &r, &err);
    if (rc) {
        fprintf(stderr, "rk predict: %s\n", err.msg[0] ? err.msg : rk_strerror(rc));
        return rk_cli_status(rc);
    }
    if (as_json) {
        json_t *j = json_object();
        json_object_set_new(j, "simulated", json_true());
        json_object_set_new(j, "dir", json_string(o.dir));
        json_object_set_new(j, "hours", json_real(o.hours));
        json_object_set_new(j, "span_h", json_real(o.span_h > o.hours ? o.span_h : o.hours));
        json_object_set_new(j, "gpus", json_integer(r.gpus));
        json_object_set_new(j, "lost", json_integer(r.lost));
        json_object_set_new(j, "steps", json_integer((json_int_t)r.steps));
        json_object_set_new(j, "seconds", json_real(r.seconds));
        for (int k = 0; k < 3; k++) {
            const char *name[3] = {"train", "val", "test"};
            json_t *sp = json_object();
            json_object_set_new(sp, "devices", json_integer(r.devices[k]));
            json_object_set_new(sp, "failed", json_integer(r.failed[k]));
            json_object_set_new(j, name[k], sp);
        }
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("simulated fleet of %d GPUs (seed %llu), %g hours each from %g hours of service, "
               "one reading a minute -> %s\n\n",
               r.gpus, (unsigned long long)o.seed, o.hours, o.start_age_h, o.dir);
        printf("%-6s %8s %8s\n", "split", "devices", "failed");
        const char *name[3] = {"train", "val", "test"};
        for (int k = 0; k < 3; k++)
            printf("%-6s %8d %8d\n", name[k], r.devices[k], r.failed[k]);
        printf("\n%d GPUs lost before the end; %zu minutes of history; %.1f s\n", r.lost, r.steps,
               r.seconds);
    }
    return RK_EXIT_OK;
}

/* ---- rk predict train / eval: detectors on fleet datasets (predict/pipeline.h) ----------- */

static int fail_line(int rc, const rk_err *err)
{
    fprintf(stderr, "rk predict: %s\n", err->msg[0] ? err->msg : rk_strerror(rc));
    return rk_cli_status(rc);
}

static int dataset_dir_ok(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr,
                "rk predict: dataset directory '%s' does not exist or is not a "
                "directory\n",
                dir);
        return 0;
    }
    return 1;
}

static void print_json(json_t *j)
{
    json_dumpf(j, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    fputc('\n', stdout);
}

static void epoch_line_ap(const rk_fleet_epoch *e, void *ctx)
{
    (void)ctx;
    fprintf(status(), "rk predict:   epoch %d: training loss %.4f, validation AP %.4f%s (%.1f s)\n",
            e->epoch, e->train_loss, e->val_ap, e->best ? " *" : "", e->seconds);
}

static void train_stage(int stage, const rk_fleet_train_report *r, void *ctx)
{
    (void)ctx;
    if (stage == RK_FLEET_STAGE_WINDOWS)
        fprintf(status(),
                "rk predict: %zu training windows (%zu positive), %zu validation windows "
                "(%zu positive), %.1f s\n",
                r->train_windows, r->train_positives, r->val_windows, r->val_positives,
                r->windows_seconds);
    else
        fprintf(status(),
                "rk predict: predictor: %d epochs (best %d), validation AP %.4f, %.1f s\n",
                r->det.training.epochs, r->det.training.best_epoch, r->det.training.val_ap,
                r->predictor_seconds);
}

static void print_train(const rk_fleet_train_opts *o, const rk_fleet_train_report *r)
{
    const rk_fleet_detectors *d = &r->det;
    const rk_fleet_metrics *best = d->val;
    char *side = rk_fleet_detectors_path(o->out);
    printf("trained on %s: predictor %s (+ %s)\n", o->dir, o->out, side ? side : "MODEL.json");
    free(side);
    printf("val split (thresholds chosen here): %d failures, %.1f GPU-days\n",
           best[RK_FLEET_DET_PREDICTOR].failures, best[RK_FLEET_DET_PREDICTOR].gpu_days);
    const char *names[RK_FLEET_DETECTORS] = {"LSTM + attention", "logistic regression",
                                             "health score < 60", "logistic, best F1"};
    printf("%-22s %9s %9s %7s %7s %9s\n", "detector", "threshold", "precision", "recall", "F1",
           "lead min");
    for (int k = 0; k < RK_FLEET_DETECTORS; k++)
        printf("%-22s %9.4g %9.3f %7.3f %7.3f %9.1f\n", names[k],
               k == RK_FLEET_DET_HEALTH ? (double)d->health_below : best[k].threshold,
               best[k].precision, best[k].recall, best[k].f1, best[k].lead_mean);
    printf("%.1f s\n", d->training.seconds);
}

static int cmd_fleet_train(int argc, char **argv)
{
    static const struct option longs[] = {{"out", required_argument, 0, 'o'},
                                          {"window", required_argument, 0, 'w'},
                                          {"horizon", required_argument, 0, 'z'},
                                          {"near", required_argument, 0, 'n'},
                                          {"negatives", required_argument, 0, 'r'},
                                          {"json", no_argument, 0, 'j'},
                                          {"hard", required_argument, 0, 'x'},
                                          {"level-noise", required_argument, 0, 'L'},
                                          {"min-lead", required_argument, 0, 'M'},
                                          {"verbose", no_argument, 0, 'q'},
                                          SHARED_LONGS,
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_fleet_train_opts o;
    rk_fleet_train_opts_default(&o);
    int as_json = 0;
    double v;
    opterr = 0;
    optind = 1;
    int c, li = -1, bad;
    for (; (c = getopt_long(argc, argv, "ho:", longs, &li)) != -1; li = -1) {
        switch (c) {
        case 'o': o.out = optarg; break;
        case 'w':
            if (whole("--window", optarg, 2, 1440, &o.model.window))
                return RK_EXIT_USAGE;
            break;
        case 'z':
            if (whole("--horizon", optarg, 1, 1440, &o.sample.horizon))
                return RK_EXIT_USAGE;
            break;
        case 'n':
            if (whole("--near", optarg, 0, 100000, &o.sample.near))
                return RK_EXIT_USAGE;
            break;
        case 'r':
            if (num("--negatives", optarg, 0, 1000, &o.sample.neg_ratio))
                return RK_EXIT_USAGE;
            break;
        case 'x':
            if (num("--hard", optarg, 0, 1000, &o.hard))
                return RK_EXIT_USAGE;
            break;
        case 'L':
            if (num("--level-noise", optarg, 0, 10, &v))
                return RK_EXIT_USAGE;
            o.train.level_noise = (float)v;
            break;
        case 'M':
            if (num("--min-lead", optarg, 0, 1440, &o.min_lead))
                return RK_EXIT_USAGE;
            break;
        case 'j': as_json = 1; break;
        case 'q': o.on_epoch = epoch_line_ap; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default:
            if ((bad = other_option(c, li, longs, argv, &o.model, &o.train, &o.seed)))
                return bad;
        }
    }
    if (optind >= argc)
        return usage_error("train needs the dataset directory (rk predict dataset -o DIR)");
    if (optind + 1 < argc)
        return usage_error("unexpected argument '%s'", argv[optind + 1]);
    o.dir = argv[optind];
    if (!o.out)
        return usage_error("train needs -o MODEL");
    if (!dataset_dir_ok(o.dir) || rk_arg_path(&args, "-o", o.out, RK_PATH_OUTPUT))
        return RK_EXIT_USAGE;
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    o.on_stage = train_stage;
    rk_fleet_train_report r;
    rk_err err = {0};
    int rc = rk_fleet_train(&o, &r, &err);
    if (rc)
        return fail_line(rc, &err);
    if (as_json) {
        json_t *j = rk_fleet_detectors_json(&r.det);
        print_json(j);
        json_decref(j);
    } else {
        print_train(&o, &r);
    }
    rk_fleet_train_report_free(&r);
    return RK_EXIT_OK;
}

static void print_eval(const rk_fleet_eval_opts *o, const rk_fleet_eval_report *r, int as_json)
{
    const char *key[RK_FLEET_DETECTORS] = {"predictor", "logreg", "health_score", "logreg_best_f1"};
    const char *label[RK_FLEET_DETECTORS] = {"LSTM + attention", "logistic regression",
                                             "health score < 60", "logistic, best F1"};
    const char *sname = rk_fleet_split_name(o->split);
    const rk_fleet_metrics *m = r->m;
    if (as_json) {
        json_t *j = json_object(), *d = json_object();
        json_object_set_new(j, "simulated", json_true());
        json_object_set_new(j, "split", json_string(sname));
        json_object_set_new(j, "gpus", json_integer(m[0].gpus));
        json_object_set_new(j, "gpu_days", json_real(m[0].gpu_days));
        json_object_set_new(j, "failures", json_integer(m[0].failures));
        json_object_set_new(j, "silent_failures", json_integer(m[0].silent));
        json_object_set_new(j, "minutes", json_integer((json_int_t)m[0].minutes));
        json_object_set_new(j, "positive_minutes", json_integer((json_int_t)m[0].positive_minutes));
        json_object_set_new(j, "window", json_integer(r->window));
        json_object_set_new(j, "horizon", json_integer(r->horizon));
        for (int k = 0; k < RK_FLEET_DETECTORS; k++)
            json_object_set_new(d, key[k], rk_fleet_metrics_json(&m[k]));
        json_object_set_new(j, "detectors", d);
        json_object_set_new(j, "seconds", json_real(r->seconds));
        print_json(j);
        json_decref(j);
        return;
    }
    printf("%s split of %s (simulated): %d GPUs, %.1f GPU-days, %d failures (%d silent); "
           "window %d, horizon %d minutes\n\n",
           sname, o->dir, m[0].gpus, m[0].gpu_days, m[0].failures, m[0].silent, r->window,
           r->horizon);
    printf("%-20s %9s %9s %6s %6s %6s %7s %7s %9s %8s\n", "detector", "threshold", "precision",
           "recall", "F1", "lead", "median", "alarms", "FA/GPU-d", "accuracy");
    for (int k = 0; k < RK_FLEET_DETECTORS; k++)
        printf("%-20s %9.4g %9.3f %6.3f %6.3f %6.1f %7.1f %3d+%-3d %9.4f %8.4f\n", label[k],
               k == RK_FLEET_DET_HEALTH ? (double)RK_HEALTH_THRESHOLD_DEFAULT : m[k].threshold,
               m[k].precision, m[k].recall, m[k].f1, m[k].lead_mean, m[k].lead_median,
               m[k].detected, m[k].false_alarms, m[k].false_alarms_per_gpu_day, m[k].accuracy);
    printf("\nlead: minutes from the first alarm within the horizon to the failure (mean, "
           "median); alarms: detected failures + false alarm episodes\n%.1f s\n",
           r->seconds);
}

static int cmd_fleet_eval(int argc, char **argv)
{
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'}, {"threshold", required_argument, 0, 't'},
        {"split", required_argument, 0, 'S'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    rk_fleet_eval_opts o;
    rk_fleet_eval_opts_default(&o);
    int as_json = 0;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 't':
            if (rk_arg_probability(&args, "--threshold", optarg, &o.threshold))
                return RK_EXIT_USAGE;
            break;
        case 'S':
            if (strcmp(optarg, "test") == 0)
                o.split = RK_FLEET_TEST;
            else if (strcmp(optarg, "val") == 0)
                o.split = RK_FLEET_VAL;
            else
                return usage_error("--split '%s' is not test or val", optarg);
            break;
        case 'j': as_json = 1; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return usage_error("eval needs the dataset directory (rk predict dataset -o DIR)");
    if (optind + 1 < argc)
        return usage_error("unexpected argument '%s'", argv[optind + 1]);
    if (!o.model)
        return usage_error("eval needs --model MODEL (rk predict train -o MODEL)");
    o.dir = argv[optind];
    if (!dataset_dir_ok(o.dir) || rk_arg_path(&args, "--model", o.model, RK_PATH_FILE))
        return RK_EXIT_USAGE;
    if (!getenv("OPENBLAS_NUM_THREADS"))
        openblas_set_num_threads(1);
    rk_fleet_eval_report r;
    rk_err err = {0};
    int rc = rk_fleet_eval(&o, &r, &err);
    if (rc)
        return fail_line(rc, &err);
    print_eval(&o, &r, as_json);
    return RK_EXIT_OK;
}

int rk_cmd_predict(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? RK_EXIT_USAGE : RK_EXIT_OK;
    }
    if (strcmp(argv[1], "cmapss") == 0)
        return cmd_cmapss(argc - 1, argv + 1);
    if (strcmp(argv[1], "dataset") == 0)
        return cmd_dataset(argc - 1, argv + 1);
    if (strcmp(argv[1], "train") == 0)
        return cmd_fleet_train(argc - 1, argv + 1);
    if (strcmp(argv[1], "eval") == 0)
        return cmd_fleet_eval(argc - 1, argv + 1);
    return usage_error("unknown subcommand '%s'", argv[1]);
}
