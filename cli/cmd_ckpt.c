/*
 * rk ckpt: look after a checkpoint directory written by the checkpoint store
 * (rekindle/ckpt.h). `ls` tables every checkpoint with its state, `verify` checks the one
 * `latest` names (exit 0 only if it is valid), `export` writes a checkpoint's model weights
 * as the plain safetensors file `rk train --init` loads. Nothing here deletes or rewrites.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rekindle/ckpt.h"
#include "rekindle/safetensors.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk ckpt ls DIR\n"
    "       rk ckpt verify [--all] DIR\n"
    "       rk ckpt export DIR [--step S] -o OUT.safetensors\n"
    "\n"
    "Look after a checkpoint directory (DIR/ckpt-<step>.safetensors and DIR/latest).\n"
    "\n"
    "  ls      every checkpoint: step, epoch, cursor, size, whether every checksum matches,\n"
    "          and which one `latest` names\n"
    "  verify  exit 0 only if the checkpoint `latest` names is valid; otherwise exit 1 with\n"
    "          the file, tensor or field at fault and the checkpoint a resume would use\n"
    "  export  write the model weights (tensors named model.*, prefix removed) as the\n"
    "          safetensors file `rk train --init` loads (never into a checkpoint store)\n"
    "\n"
    "'rk ckpt COMMAND --help' describes a command. Exit status: 0 ok, 1 the check failed,\n"
    "2 bad usage or input. See docs/checkpoint.md.\n";

static const char ls_usage[] = "usage: rk ckpt ls DIR\n"
                               "\n"
                               "List the checkpoints of DIR, oldest first, each fully verified.\n"
                               "  -h, --help  show this help\n";

static const char verify_usage[] =
    "usage: rk ckpt verify [--all] DIR\n"
    "\n"
    "Verify every checksum of the checkpoint DIR/latest names: exit 0 if it is valid, 1 if\n"
    "not (with the reason and the checkpoint a resume would fall back to), 2 if DIR is not\n"
    "a directory.\n"
    "  --all       also verify every other checkpoint; exit 1 if any is bad\n"
    "  -h, --help  show this help\n";

static const char export_usage[] =
    "usage: rk ckpt export DIR [--step S] -o OUT.safetensors\n"
    "\n"
    "Write the model weights of a checkpoint (its tensors named model.*, without the prefix)\n"
    "as a safetensors file with metadata format=rekindle-weights-1 and model=<the config's\n"
    "\"model\">, which `rk train --model M --init OUT` loads.\n"
    "  --step S         the checkpoint of step S (default: the newest valid one, as a\n"
    "                   resume would choose it)\n"
    "  -o, --output F   the file to write (atomically); not inside a checkpoint\n"
    "                   directory (one holding latest, .lock or checkpoint files)\n"
    "  -h, --help       show this help\n";

#define PREFIX "model."

__attribute__((format(printf, 3, 4))) static int usage_error(const char *cmd, const char *help,
                                                             const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rk ckpt%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n\n%s", help);
    va_end(ap);
    return RK_EXIT_USAGE;
}

/* Parse a subcommand's options; *dir gets the one positional argument. Returns -1 after
 * --help (exit 0), RK_EXIT_USAGE on errors, RK_EXIT_OK to go on. */
typedef struct sub_opts {
    const char *dir, *out, *step;
    int all;
} sub_opts;

static int parse_sub(const char *cmd, const char *help, int argc, char **argv, int allow_all,
                     int allow_export, sub_opts *o)
{
    static const struct option longs[] = {{"all", no_argument, 0, 'a'},
                                          {"step", required_argument, 0, 's'},
                                          {"output", required_argument, 0, 'o'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "ho:", longs, NULL)) != -1) {
        switch (c) {
        case 'h': fputs(help, stdout); return -1;
        case 'a':
            if (!allow_all)
                return usage_error(cmd, help, "unknown option '--all'");
            o->all = 1;
            break;
        case 's':
        case 'o':
            if (!allow_export)
                return usage_error(cmd, help, "unknown option '%s'", argv[optind - 1]);
            if (c == 's')
                o->step = optarg;
            else
                o->out = optarg;
            break;
        default:
            return usage_error(cmd, help, "unknown option or missing value: '%s'",
                               argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return usage_error(cmd, help, "missing DIR");
    o->dir = argv[optind++];
    if (optind < argc)
        return usage_error(cmd, help, "unexpected argument '%s'", argv[optind]);
    struct stat st;
    if (stat(o->dir, &st) != 0) {
        fprintf(stderr, "rk ckpt %s: %s: %s\n", cmd, o->dir, strerror(errno));
        return RK_EXIT_USAGE;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "rk ckpt %s: %s: not a directory\n", cmd, o->dir);
        return RK_EXIT_USAGE;
    }
    return RK_EXIT_OK;
}

/* A library message without its leading "<dir>/<file>: " when the table already names the
 * file. */
static const char *after_path(const char *msg, const char *dir, const char *file)
{
    size_t dl = strlen(dir), fl = strlen(file);
    if (strncmp(msg, dir, dl) == 0 && msg[dl] == '/' && strncmp(msg + dl + 1, file, fl) == 0 &&
        strncmp(msg + dl + 1 + fl, ": ", 2) == 0)
        return msg + dl + 3 + fl;
    return msg;
}

static const char *fmt_bytes(char *buf, size_t cap, uint64_t b)
{
    if (b < 1024)
        snprintf(buf, cap, "%" PRIu64 " B", b);
    else if (b < 1024 * 1024)
        snprintf(buf, cap, "%.1f KiB", (double)b / 1024.0);
    else if (b < 1024ull * 1024 * 1024)
        snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
    else
        snprintf(buf, cap, "%.2f GiB", (double)b / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

static const char *fmt_num(char *buf, size_t cap, int64_t v)
{
    if (v < 0)
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%" PRId64, v);
    return buf;
}

static int cmd_ls(int argc, char **argv)
{
    sub_opts o;
    int st = parse_sub("ls", ls_usage, argc, argv, 0, 0, &o);
    if (st != RK_EXIT_OK)
        return st < 0 ? RK_EXIT_OK : st;
    rk_err err = {0};
    rk_ckpt_info *v;
    size_t n, ntemp;
    int rc = rk_ckpt_list(o.dir, &v, &n, &ntemp, &err);
    if (rc) {
        fprintf(stderr, "rk ckpt ls: %s\n", err.msg);
        return rk_cli_status(rc);
    }
    if (n == 0) {
        printf("no checkpoints in %s\n", o.dir);
    } else {
        printf("%-31s %12s %8s %12s %10s  %-6s  %s\n", "FILE", "STEP", "EPOCH", "CURSOR", "SIZE",
               "LATEST", "STATUS");
        for (size_t i = 0; i < n; i++) {
            char sb[32], eb[32], cb[32];
            printf("%-31s %12" PRId64 " %8s %12s %10s  %-6s  %s%s\n", v[i].file, v[i].step,
                   fmt_num(eb, sizeof eb, v[i].epoch), fmt_num(cb, sizeof cb, v[i].cursor),
                   fmt_bytes(sb, sizeof sb, v[i].bytes), v[i].latest ? "latest" : "",
                   v[i].valid        ? "ok"
                   : v[i].unreadable ? "UNREADABLE: "
                                     : "BAD: ",
                   v[i].valid ? "" : after_path(v[i].problem, o.dir, v[i].file));
        }
    }
    char lname[RK_CKPT_NAME_MAX];
    rc = rk_ckpt_read_latest(o.dir, lname, sizeof lname, &err);
    if (rc == RK_OK) {
        int found = 0;
        for (size_t i = 0; i < n; i++)
            found |= v[i].latest;
        if (!found)
            printf("latest: names %s, which does not exist\n", lname);
    } else if (rc != RK_ENOENT || n > 0) {
        printf("latest: %s\n", err.msg);
    }
    if (ntemp)
        printf("%zu temporary file%s of interrupted saves (not checkpoints; the next save "
               "removes those of writers that are gone)\n",
               ntemp, ntemp == 1 ? "" : "s");
    rk_ckpt_aside *a = NULL;
    size_t na = 0;
    if (rk_ckpt_list_aside(o.dir, &a, &na, NULL) == RK_OK && na) {
        printf("%zu bad checkpoint%s moved aside by a save of the same step (evidence, never "
               "deleted):\n",
               na, na == 1 ? "" : "s");
        for (size_t i = 0; i < na; i++) {
            char sb[32];
            printf("  %s  step %" PRId64 "  %s\n", a[i].file, a[i].step,
                   fmt_bytes(sb, sizeof sb, a[i].bytes));
        }
    }
    free(a);
    free(v);
    return RK_EXIT_OK;
}

/* "a resume would use X" for verify's failure output. */
static void print_fallback(const char *dir)
{
    rk_ckpt *c = NULL;
    rk_err err = {0};
    int rc = rk_ckpt_load_latest(dir, NULL, &c, NULL, 0, &err);
    if (rc == RK_OK) {
        fprintf(stderr, "rk ckpt verify: a resume would fall back to %s (step %" PRId64 ")\n",
                rk_ckpt_path(c), rk_ckpt_meta_of(c)->step);
        rk_ckpt_free(c);
    } else if (rc != RK_ENOENT) { /* a file that cannot be read: no fallback past it */
        fprintf(stderr, "rk ckpt verify: a resume would stop: %s\n", err.msg);
    } else {
        fprintf(stderr, "rk ckpt verify: no valid checkpoint to fall back to\n");
    }
}

static int cmd_verify(int argc, char **argv)
{
    sub_opts o;
    int st = parse_sub("verify", verify_usage, argc, argv, 1, 0, &o);
    if (st != RK_EXIT_OK)
        return st < 0 ? RK_EXIT_OK : st;
    rk_err err = {0};
    int bad_other = 0;
    char lname[RK_CKPT_NAME_MAX] = "";
    if (o.all) {
        rk_ckpt_info *v;
        size_t n;
        if (rk_ckpt_list(o.dir, &v, &n, NULL, &err) != RK_OK) {
            fprintf(stderr, "rk ckpt verify: %s\n", err.msg);
            return RK_EXIT_FAIL;
        }
        for (size_t i = 0; i < n; i++) {
            if (v[i].valid)
                printf("%s/%s: ok\n", o.dir, v[i].file);
            else if (!v[i].latest) { /* the latest one is reported below */
                fprintf(stderr, "rk ckpt verify: %s\n", v[i].problem);
                bad_other = 1;
            }
        }
        free(v);
    }
    int rc = rk_ckpt_read_latest(o.dir, lname, sizeof lname, &err);
    if (rc) {
        fprintf(stderr, "rk ckpt verify: %s\n", err.msg);
        print_fallback(o.dir);
        return RK_EXIT_FAIL;
    }
    size_t plen = strlen(o.dir) + strlen(lname) + 2;
    char *path = malloc(plen);
    if (!path) {
        fprintf(stderr, "rk ckpt verify: out of memory\n");
        return RK_EXIT_FAIL;
    }
    snprintf(path, plen, "%s/%s", o.dir, lname);
    rk_ckpt *c = NULL;
    rc = rk_ckpt_load_file(path, &c, &err);
    if (rc) {
        if (rc == RK_ENOENT)
            fprintf(stderr, "rk ckpt verify: %s/latest names %s, which does not exist\n", o.dir,
                    lname);
        else
            fprintf(stderr, "rk ckpt verify: %s\n", err.msg);
        print_fallback(o.dir);
        free(path);
        return RK_EXIT_FAIL;
    }
    const rk_ckpt_meta *m = rk_ckpt_meta_of(c);
    printf("%s: ok (latest): step %" PRId64 ", epoch %" PRId64 ", cursor %" PRId64
           ", %zu tensors, every checksum matches\n",
           path, m->step, m->epoch, m->cursor, rk_ckpt_file(c)->ntensors);
    rk_ckpt_free(c);
    free(path);
    return bad_other ? RK_EXIT_FAIL : RK_EXIT_OK;
}

static int cmd_export(int argc, char **argv)
{
    sub_opts o;
    int st = parse_sub("export", export_usage, argc, argv, 0, 1, &o);
    if (st != RK_EXIT_OK)
        return st < 0 ? RK_EXIT_OK : st;
    if (!o.out)
        return usage_error("export", export_usage, "missing -o OUT.safetensors");
    rk_args args = {.cmd = "ckpt export", .usage = export_usage};
    int64_t step = -1;
    if ((o.step && rk_arg_step(&args, "--step", o.step, 0, &step)) ||
        rk_arg_path(&args, "-o", o.out, RK_PATH_OUTPUT))
        return RK_EXIT_USAGE;
    rk_err err = {0};
    rk_ckpt *c = NULL;
    int rc;
    if (step >= 0) {
        rc = rk_ckpt_load_step(o.dir, step, &c, &err);
    } else {
        char report[8192];
        rc = rk_ckpt_load_latest(o.dir, NULL, &c, report, sizeof report, &err);
        for (char *line = strtok(report, "\n"); line; line = strtok(NULL, "\n"))
            fprintf(stderr, "rk ckpt export: skipped %s\n", line);
    }
    if (rc) {
        fprintf(stderr, "rk ckpt export: %s\n", err.msg);
        return rk_cli_status(rc);
    }
    const rk_ckpt_meta *m = rk_ckpt_meta_of(c);
    const rk_st_file *f = rk_ckpt_file(c);
    json_error_t je;
    json_t *cfg = json_loads(m->config_json, JSON_DECODE_ANY, &je);
    const char *model =
        json_is_object(cfg) ? json_string_value(json_object_get(cfg, "model")) : NULL;
    rk_st_entry *e = calloc(f->ntensors ? f->ntensors : 1, sizeof *e);
    size_t n = 0, bytes = 0;
    for (size_t i = 0; e && i < f->ntensors; i++) {
        const rk_st_tensor *t = &f->tensors[i];
        if (strncmp(t->name, PREFIX, strlen(PREFIX)) != 0 || !t->name[strlen(PREFIX)])
            continue;
        e[n++] = (rk_st_entry){t->name + strlen(PREFIX), t->data, t->ndim, t->shape, t->dtype};
        bytes += t->nbytes;
    }
    char stepbuf[24];
    snprintf(stepbuf, sizeof stepbuf, "%" PRId64, m->step);
    int status = RK_EXIT_OK;
    if (!e) {
        fprintf(stderr, "rk ckpt export: out of memory\n");
        status = RK_EXIT_FAIL;
    } else if (!model) {
        fprintf(stderr,
                "rk ckpt export: %s: its config has no \"model\" string, so the weights "
                "cannot be labelled\n",
                rk_ckpt_path(c));
        status = RK_EXIT_USAGE;
    } else if (n == 0) {
        fprintf(stderr, "rk ckpt export: %s: no tensor named " PREFIX "*\n", rk_ckpt_path(c));
        status = RK_EXIT_USAGE;
    } else {
        const char *meta[] = {"format", "rekindle-weights-1", "model", model, "step", stepbuf,
                              NULL};
        rc = rk_st_write(o.out, e, n, meta, &err);
        if (rc) {
            fprintf(stderr, "rk ckpt export: %s\n", err.msg);
            status = rk_cli_status(rc);
        } else {
            printf("rk ckpt export: wrote %zu tensors (%zu bytes) of model %s from %s (step "
                   "%" PRId64 ") to %s\n",
                   n, bytes, model, rk_ckpt_path(c), m->step, o.out);
        }
    }
    free(e);
    json_decref(cfg);
    rk_ckpt_free(c);
    return status;
}

int rk_cmd_ckpt(int argc, char **argv)
{
    if (argc < 2)
        return usage_error(NULL, usage_text, "missing command (ls, verify or export)");
    const char *sub = argv[1];
    if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0 || strcmp(sub, "help") == 0) {
        fputs(usage_text, stdout);
        return RK_EXIT_OK;
    }
    if (strcmp(sub, "ls") == 0)
        return cmd_ls(argc - 1, argv + 1);
    if (strcmp(sub, "verify") == 0)
        return cmd_verify(argc - 1, argv + 1);
    if (strcmp(sub, "export") == 0)
        return cmd_export(argc - 1, argv + 1);
    return usage_error(NULL, usage_text, "unknown command '%s'", sub);
}
