/*
 * rk predict: the failure predictor (rekindle/predict.h, docs/predict.md). `rk predict cmapss`
 * runs the real-data check on NASA's C-MAPSS FD001 (rekindle/cmapss.h): trains an ensemble in
 * regression mode on the training engines and scores the test engines once; a table, or JSON.
 */
#include <cblas.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rekindle/cmapss.h"
#include "rekindle/fleetdata.h"
#include "rekindle/predict.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk predict cmapss --data DIR [--window T] [--seed S] [--ensemble K] [--json]\n"
    "                         [--validate-only] [--verbose] [TRAINING OPTIONS]\n"
    "       rk predict dataset --sim N --hours H [--seed S] [--age HOURS] [--val F]\n"
    "                          [--test F] -o DIR\n"
    "\n"
    "The failure predictor (docs/predict.md).\n"
    "\n"
    "  dataset  per-minute histories of a simulated fleet of N GPUs over H hours, with the\n"
    "           failures the simulator logged, split by device into train, val and test\n"
    "           (rekindle/fleetdata.h): DIR/fleet.json, DIR/gpu-NNNN.safetensors,\n"
    "           DIR/events.jsonl. --seed: the fleet and the split (default 1); --age: hours\n"
    "           of service before the first minute (default 20000); --val, --test: shares of\n"
    "           the devices (default 0.2 each).\n"
    "\n"
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
    "training options (defaults chosen on the validation split):\n"
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

static int num(const char *flag, const char *s, double lo, double hi, double *out)
{
    return rk_cli_number("predict", usage_text, flag, s, lo, hi, out);
}

static int whole(const char *flag, const char *s, double lo, double hi, int *out)
{
    double v;
    if (num(flag, s, lo, hi, &v))
        return RK_EXIT_USAGE;
    if (v != (double)(int)v)
        return usage_error("%s '%s' is not a whole number", flag, s);
    *out = (int)v;
    return 0;
}

static void member_line(int k, const rk_pred_report *r, double val_rmse, void *ctx)
{
    const rk_cmapss_opts *o = ctx;
    fprintf(stderr,
            "rk predict: model %d/%d (seed %llu): %d epochs (best %d), validation "
            "RMSE %.2f, %.1f s\n",
            k + 1, o->ensemble, (unsigned long long)(o->seed + (uint64_t)k), r->epochs,
            r->best_epoch, val_rmse, r->seconds);
}

static void epoch_line(const rk_pred_epoch *e, void *ctx)
{
    (void)ctx;
    fprintf(stderr, "rk predict:   epoch %d: training loss %.4f, validation RMSE %.3f%s (%.1f s)\n",
            e->epoch, e->train_loss, sqrt(e->val_loss), e->best ? " *" : "", e->seconds);
}

static int cmd_cmapss(int argc, char **argv)
{
    static const struct option longs[] = {{"data", required_argument, 0, 'd'},
                                          {"window", required_argument, 0, 'w'},
                                          {"seed", required_argument, 0, 's'},
                                          {"ensemble", required_argument, 0, 'k'},
                                          {"hidden", required_argument, 0, 'H'},
                                          {"epochs", required_argument, 0, 'e'},
                                          {"val-engines", required_argument, 0, 'v'},
                                          {"json", no_argument, 0, 'j'},
                                          {"attn", required_argument, 0, 'A'},
                                          {"dense", required_argument, 0, 'D'},
                                          {"patience", required_argument, 0, 'p'},
                                          {"batch", required_argument, 0, 'b'},
                                          {"lr", required_argument, 0, 'l'},
                                          {"validate-only", no_argument, 0, 'V'},
                                          {"verbose", no_argument, 0, 'q'},
                                          {"noise", required_argument, 0, 'n'},
                                          {"weight-decay", required_argument, 0, 'W'},
                                          {"dropout", required_argument, 0, 'P'},
                                          {"first-end", required_argument, 0, 'F'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    rk_cmapss_opts o;
    rk_cmapss_opts_default(&o);
    int as_json = 0;
    double v;
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'd': o.dir = optarg; break;
        case 'w':
            if (whole("--window", optarg, 1, RK_PRED_MAX_WINDOW, &o.window))
                return RK_EXIT_USAGE;
            break;
        case 's':
            if (num("--seed", optarg, 0, 9007199254740992.0, &v))
                return RK_EXIT_USAGE;
            if (v != (double)(uint64_t)v)
                return usage_error("--seed '%s' is not a whole number", optarg);
            o.seed = (uint64_t)v;
            break;
        case 'k':
            if (whole("--ensemble", optarg, 1, RK_CMAPSS_MAX_MEMBERS, &o.ensemble))
                return RK_EXIT_USAGE;
            break;
        case 'H':
            if (whole("--hidden", optarg, 1, 1024, &o.model.hidden))
                return RK_EXIT_USAGE;
            break;
        case 'e':
            if (whole("--epochs", optarg, 1, 10000, &o.train.max_epochs))
                return RK_EXIT_USAGE;
            break;
        case 'v':
            if (whole("--val-engines", optarg, 1, 100000, &o.val_engines))
                return RK_EXIT_USAGE;
            break;
        case 'A':
            if (whole("--attn", optarg, 1, 1024, &o.model.attn))
                return RK_EXIT_USAGE;
            break;
        case 'D':
            if (whole("--dense", optarg, 1, 1024, &o.model.dense))
                return RK_EXIT_USAGE;
            break;
        case 'p':
            if (whole("--patience", optarg, 0, 10000, &o.train.patience))
                return RK_EXIT_USAGE;
            break;
        case 'b':
            if (whole("--batch", optarg, 1, 65536, &o.train.batch))
                return RK_EXIT_USAGE;
            break;
        case 'l':
            if (num("--lr", optarg, 1e-6, 1, &v))
                return RK_EXIT_USAGE;
            o.train.lr = (float)v;
            break;
        case 'V': o.validate_only = 1; break;
        case 'q': o.train.on_epoch = epoch_line; break;
        case 'n':
            if (num("--noise", optarg, 0, 10, &v))
                return RK_EXIT_USAGE;
            o.train.input_noise = (float)v;
            break;
        case 'F':
            if (whole("--first-end", optarg, 1, 100000, &o.first_end))
                return RK_EXIT_USAGE;
            break;
        case 'P':
            if (num("--dropout", optarg, 0, 0.95, &v))
                return RK_EXIT_USAGE;
            o.train.dropout = (float)v;
            break;
        case 'W':
            if (num("--weight-decay", optarg, 0, 100, &v))
                return RK_EXIT_USAGE;
            o.train.weight_decay = (float)v;
            break;
        case 'j': as_json = 1; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
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
        fprintf(stderr, "rk predict: %d/%d simulated GPUs written\n", gpu + 1, gpus);
}

static int cmd_dataset(int argc, char **argv)
{
    static const struct option longs[] = {
        {"sim", required_argument, 0, 'S'},  {"hours", required_argument, 0, 'H'},
        {"seed", required_argument, 0, 's'}, {"age", required_argument, 0, 'a'},
        {"val", required_argument, 0, 'v'},  {"test", required_argument, 0, 't'},
        {"out", required_argument, 0, 'o'},  {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
    rk_fleet_data_opts o;
    rk_fleet_data_opts_default(&o);
    int have_sim = 0, have_hours = 0, as_json = 0;
    double v;
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
            if (num("--seed", optarg, 0, 9007199254740992.0, &v))
                return RK_EXIT_USAGE;
            if (v != (double)(uint64_t)v)
                return usage_error("--seed '%s' is not a whole number", optarg);
            o.seed = (uint64_t)v;
            break;
        case 'a':
            if (num("--age", optarg, 0, 1e6, &o.start_age_h))
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
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (!have_sim)
        return usage_error("dataset needs --sim N (only the simulated fleet gives ground truth)");
    if (!have_hours)
        return usage_error("dataset needs --hours H");
    if (!o.dir)
        return usage_error("dataset needs -o DIR");
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
    return usage_error("unknown subcommand '%s'", argv[1]);
}
