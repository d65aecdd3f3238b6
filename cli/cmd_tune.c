/*
 * rk tune: apply stability settings to this node's GPUs through NVML (docs/tune.md): lock the
 * SM clock below what a worn card boosts to (or, where a card cannot lock clocks, shift its
 * clock curve down or lower its power limit), set the power limit, turn persistence mode on.
 * Reads every selected GPU's settings first and checks every requested value against what
 * the card allows, so a bad value changes nothing on any GPU; --dry-run stops there. Uses
 * health/nvml.h.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "health/nvml.h"
#include "rk.h"

#define MAX_SELECT 1024

static const char usage_text[] =
    "usage: rk tune [--gpu LIST] [--lock-clocks MHZ|reset] [--clock-offset MHZ]\n"
    "               [--power-limit W] [--persistence on|off] [--dry-run]\n"
    "\n"
    "Apply stability settings to this node's GPUs through NVML (docs/tune.md). Each change\n"
    "is shown with the value it replaces; without a change, the current settings are shown\n"
    "with what each card allows (Pascal and older lock no clocks: use --power-limit there).\n"
    "\n"
    "  --gpu LIST              GPUs by index: 0,2,5-7 (default: every GPU)\n"
    "  --lock-clocks MHZ       lock the SM clock at MHZ (Volta and newer)\n"
    "  --lock-clocks reset     remove a clock lock\n"
    "  --clock-offset MHZ      shift the clock/voltage curve by MHZ, e.g. -100 (where the\n"
    "                          driver offers it)\n"
    "  --power-limit W         set the board power limit in watts (within the card's range)\n"
    "  --persistence on|off    keep the driver loaded without clients, so settings stay\n"
    "  --dry-run               say what would change, change nothing\n"
    "  -h, --help              show this help\n"
    "\n"
    "Changing settings needs root. Settings last until the driver unloads or the machine\n"
    "reboots: run rk tune at boot.\n"
    "\n"
    "Exit status: 0 done (or nothing to do), 1 NVML is absent, a GPU is lost or a change failed,\n"
    "2 bad usage or a value the card does not allow (nothing is changed then).\n";

#define usage_error(...) rk_cli_usage_error("tune", usage_text, __VA_ARGS__)

static rk_args args = {.cmd = "tune", .usage = usage_text};

/* A whole decimal number in [lo, hi] (args.h's rules). */
static bool whole(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    return rk_args_int(s, lo, hi, out);
}

/* Watts from milliwatts, without a needless ".0". */
static const char *watts(char *buf, size_t cap, unsigned mw)
{
    if (mw % 1000 == 0)
        snprintf(buf, cap, "%u W", mw / 1000);
    else
        snprintf(buf, cap, "%.1f W", mw / 1000.0);
    return buf;
}

/* "90-217 W" */
static const char *watt_range(char *buf, size_t cap, unsigned lo, unsigned hi)
{
    if (lo % 1000 == 0 && hi % 1000 == 0)
        snprintf(buf, cap, "%u-%u W", lo / 1000, hi / 1000);
    else
        snprintf(buf, cap, "%.1f-%.1f W", lo / 1000.0, hi / 1000.0);
    return buf;
}

typedef struct request {
    int lock; /* 0 none, 1 lock at mhz, -1 reset */
    unsigned mhz;
    bool power;
    unsigned mw;
    int persistence; /* 0 none, 1 on, -1 off */
    bool offset;
    int offset_mhz;
    bool dry_run;
} request;

typedef enum change_kind { CH_LOCK, CH_RESET, CH_OFFSET, CH_POWER, CH_PERSIST } change_kind;
#define MAX_CHANGES 4 /* per GPU: a lock or reset, an offset, a power limit, persistence */

/* One change for one GPU, described before it is made. */
typedef struct change {
    int gpu;
    change_kind kind;
    bool already;  /* the card is there already: nothing to apply */
    char what[96]; /* "SM clocks locked 1506 MHz" */
    char now[128]; /* "now 1607 MHz, max 1911 MHz" */
} change;

static const char *gpu_name(const rk_gpu_info *in)
{
    return in->name[0] ? in->name : "name unknown";
}

/* What the card allows, as flags: "--lock-clocks, --clock-offset -500..+1000 MHz,
 * --power-limit 90-217 W" (docs/tune.md, "Which cards can"). */
static const char *routes(char *buf, size_t cap, const rk_gpu_info *in, const rk_nvml_settings *s)
{
    char r[48];
    int m = 0;
    buf[0] = '\0';
    if (in->tune & RK_TUNE_LOCK_CLOCKS)
        m += snprintf(buf + m, cap - (size_t)m, "--lock-clocks");
    if ((in->tune & RK_TUNE_CLOCK_OFFSET) && (size_t)m < cap) {
        m += snprintf(buf + m, cap - (size_t)m, "%s--clock-offset", m ? ", " : "");
        if (s->offset_range_valid && (size_t)m < cap)
            m += snprintf(buf + m, cap - (size_t)m, " %+d..%+d MHz", s->offset_min_mhz,
                          s->offset_max_mhz);
    }
    if ((in->tune & RK_TUNE_POWER_LIMIT) && (size_t)m < cap) {
        m += snprintf(buf + m, cap - (size_t)m, "%s--power-limit", m ? ", " : "");
        if (s->power_range_valid && (size_t)m < cap)
            snprintf(buf + m, cap - (size_t)m, " %s",
                     watt_range(r, sizeof r, s->power_min_mw, s->power_max_mw));
    }
    if (!buf[0])
        snprintf(buf, cap,
                 "no clock or power setting through the driver: only a BIOS with "
                 "lower clocks");
    return buf;
}

/* "Pascal" or "this card", for "... locks no clocks". */
static const char *arch_or_card(const rk_gpu_info *in)
{
    return in->arch != RK_ARCH_UNKNOWN ? rk_gpu_arch_name(in->arch) : "this card";
}

/* A request the card cannot take, known before asking NVML: locked clocks on Pascal and older,
 * an offset where the driver has none. Says so with what the card does allow. */
static bool refuse_route(int i, const rk_gpu_info *in, const rk_nvml_settings *s, unsigned bit,
                         const char *what)
{
    if (!(in->tune & RK_TUNE_KNOWN) || (in->tune & bit))
        return false;
    char r[160];
    /* a lock is the architecture's limit; an offset is the driver's (the same Pascal card
     * takes one under a driver that offers it) */
    fprintf(stderr, "rk tune: GPU %d (%s): %s: %s %s; it allows %s\n", i, gpu_name(in), what,
            bit == RK_TUNE_CLOCK_OFFSET ? "not offered by this driver on" : "not supported on",
            arch_or_card(in), routes(r, sizeof r, in, s));
    return true;
}

static void show_settings(int i, const rk_gpu_info *in, const rk_nvml_settings *s)
{
    char a[32], b[48];
    printf("GPU %d (%s):", i, gpu_name(in));
    if (s->sm_valid)
        printf(" SM clock %u MHz", s->sm_mhz);
    if (s->sm_max_valid)
        printf(" (max %u MHz)", s->sm_max_mhz);
    if (s->power_valid)
        printf(", power limit %s", watts(a, sizeof a, s->power_limit_mw));
    if (s->power_range_valid)
        printf(" (allowed %s)", watt_range(b, sizeof b, s->power_min_mw, s->power_max_mw));
    if (s->offset_valid)
        printf(", clock offset %+d MHz", s->offset_mhz);
    if (s->persistence_valid)
        printf(", persistence mode %s", s->persistence_on ? "on" : "off");
    printf("\n");
    if (in->tune & RK_TUNE_KNOWN) {
        char r[160];
        printf("GPU %d: %s%s: can set %s%s\n", i, rk_gpu_arch_name(in->arch),
               in->geforce ? " GeForce" : "", routes(r, sizeof r, in, s),
               in->tune & RK_TUNE_LOCK_CLOCKS ? "" : "; locks no clocks");
    }
}

/* Describe the requested changes for GPU i into ch (returns how many), or report a value the
 * card does not allow (returns -1). */
static int plan_gpu(int i, const rk_gpu_info *in, const rk_nvml_settings *s, const request *rq,
                    change *ch)
{
    int k = 0;
    char a[32], b[32], c[48];
    if (rq->lock && refuse_route(i, in, s, RK_TUNE_LOCK_CLOCKS, "locked clocks"))
        return -1;
    if (rq->offset && refuse_route(i, in, s, RK_TUNE_CLOCK_OFFSET, "a clock offset"))
        return -1;
    if (rq->lock) {
        change *x = &ch[k++];
        memset(x, 0, sizeof *x);
        x->gpu = i;
        x->kind = rq->lock > 0 ? CH_LOCK : CH_RESET;
        if (rq->lock > 0) {
            if (s->sm_max_valid && rq->mhz > s->sm_max_mhz) {
                fprintf(stderr,
                        "rk tune: GPU %d (%s): %u MHz is above its maximum SM clock %u MHz\n", i,
                        gpu_name(in), rq->mhz, s->sm_max_mhz);
                return -1;
            }
            snprintf(x->what, sizeof x->what, "SM clocks locked %u MHz", rq->mhz);
        } else {
            snprintf(x->what, sizeof x->what, "SM clock lock removed");
        }
        int m = 0;
        if (s->sm_valid)
            m += snprintf(x->now + m, sizeof x->now - (size_t)m, "now %u MHz", s->sm_mhz);
        if (s->sm_max_valid)
            snprintf(x->now + m, sizeof x->now - (size_t)m, "%smax %u MHz", m ? ", " : "",
                     s->sm_max_mhz);
    }
    if (rq->offset) {
        change *x = &ch[k++];
        memset(x, 0, sizeof *x);
        x->gpu = i;
        x->kind = CH_OFFSET;
        if (s->offset_range_valid &&
            (rq->offset_mhz < s->offset_min_mhz || rq->offset_mhz > s->offset_max_mhz)) {
            fprintf(stderr,
                    "rk tune: GPU %d (%s): clock offset %+d MHz is outside what it allows "
                    "(%+d..%+d MHz)\n",
                    i, gpu_name(in), rq->offset_mhz, s->offset_min_mhz, s->offset_max_mhz);
            return -1;
        }
        snprintf(x->what, sizeof x->what, "clock offset %+d MHz", rq->offset_mhz);
        x->already = s->offset_valid && s->offset_mhz == rq->offset_mhz;
        int m = 0;
        if (s->offset_valid)
            m += snprintf(x->now + m, sizeof x->now - (size_t)m, "now %+d MHz", s->offset_mhz);
        if (s->offset_range_valid)
            snprintf(x->now + m, sizeof x->now - (size_t)m, "%sallowed %+d..%+d MHz", m ? ", " : "",
                     s->offset_min_mhz, s->offset_max_mhz);
    }
    if (rq->power) {
        change *x = &ch[k++];
        memset(x, 0, sizeof *x);
        x->gpu = i;
        x->kind = CH_POWER;
        if (s->power_range_valid && (rq->mw < s->power_min_mw || rq->mw > s->power_max_mw)) {
            fprintf(stderr, "rk tune: GPU %d (%s): power limit %s is outside what it allows (%s)\n",
                    i, gpu_name(in), watts(a, sizeof a, rq->mw),
                    watt_range(c, sizeof c, s->power_min_mw, s->power_max_mw));
            return -1;
        }
        snprintf(x->what, sizeof x->what, "power limit %s", watts(a, sizeof a, rq->mw));
        x->already = s->power_valid && s->power_limit_mw == rq->mw;
        int m = 0;
        if (s->power_valid)
            m += snprintf(x->now + m, sizeof x->now - (size_t)m, "now %s",
                          watts(a, sizeof a, s->power_limit_mw));
        if (s->power_default_valid)
            m += snprintf(x->now + m, sizeof x->now - (size_t)m, "%sdefault %s", m ? ", " : "",
                          watts(b, sizeof b, s->power_default_mw));
        if (s->power_range_valid)
            snprintf(x->now + m, sizeof x->now - (size_t)m, "%sallowed %s", m ? ", " : "",
                     watt_range(c, sizeof c, s->power_min_mw, s->power_max_mw));
    }
    if (rq->persistence) {
        change *x = &ch[k++];
        memset(x, 0, sizeof *x);
        x->gpu = i;
        x->kind = CH_PERSIST;
        bool on = rq->persistence > 0;
        snprintf(x->what, sizeof x->what, "persistence mode %s", on ? "on" : "off");
        x->already = s->persistence_valid && s->persistence_on == on;
        if (s->persistence_valid)
            snprintf(x->now, sizeof x->now, "now %s", s->persistence_on ? "on" : "off");
    }
    return k;
}

static void print_change(const change *x, const rk_gpu_info *in, const char *result)
{
    printf("GPU %d (%s): %s", x->gpu, gpu_name(in), x->what);
    if (x->now[0])
        printf(" (%s)", x->now);
    printf("%s\n", result);
}

static int apply(rk_nvml *n, const change *x, const request *rq, rk_err *err)
{
    switch (x->kind) {
    case CH_LOCK: return rk_nvml_clocks_lock(n, x->gpu, rq->mhz, err);
    case CH_RESET: return rk_nvml_clocks_reset(n, x->gpu, err);
    case CH_OFFSET: return rk_nvml_clock_offset_set(n, x->gpu, rq->offset_mhz, err);
    case CH_POWER: return rk_nvml_power_limit_set(n, x->gpu, rq->mw, err);
    case CH_PERSIST: return rk_nvml_persistence_set(n, x->gpu, rq->persistence > 0, err);
    }
    return RK_EINVAL;
}

int rk_cmd_tune(int argc, char **argv)
{
    static const struct option longs[] = {{"gpu", required_argument, 0, 'g'},
                                          {"lock-clocks", required_argument, 0, 'l'},
                                          {"power-limit", required_argument, 0, 'p'},
                                          {"clock-offset", required_argument, 0, 'o'},
                                          {"persistence", required_argument, 0, 'P'},
                                          {"dry-run", no_argument, 0, 'n'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    request rq = {0};
    static int sel[MAX_SELECT];
    int nsel = 0; /* 0: every GPU */
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'g':
            if (strcmp(optarg, "all") == 0)
                nsel = 0;
            else if (!rk_args_gpu_list(optarg, MAX_SELECT, sel, &nsel))
                return usage_error("--gpu '%s' is not a list of GPU indices like 0,2,5-7", optarg);
            break;
        case 'l':
            if (strcmp(optarg, "reset") == 0) {
                rq.lock = -1;
            } else if (rk_arg_mhz(&args, "--lock-clocks", optarg, &rq.mhz)) {
                return RK_EXIT_USAGE; /* "a clock in MHz"; 'reset' is in the usage */
            } else {
                rq.lock = 1;
            }
            break;
        case 'p': {
            double w;
            if (rk_arg_watts(&args, "--power-limit", optarg, &w))
                return RK_EXIT_USAGE;
            rq.power = true;
            rq.mw = (unsigned)lround(w * 1000.0);
            break;
        }
        case 'o': {
            int64_t v;
            if (!whole(optarg, -5000, 5000, &v))
                return usage_error("--clock-offset '%s' is not a whole number of MHz in "
                                   "-5000..5000 (e.g. -100)",
                                   optarg);
            rq.offset = true;
            rq.offset_mhz = (int)v;
            break;
        }
        case 'P':
            if (strcmp(optarg, "on") == 0)
                rq.persistence = 1;
            else if (strcmp(optarg, "off") == 0)
                rq.persistence = -1;
            else
                return usage_error("--persistence '%s' is neither 'on' nor 'off'", optarg);
            break;
        case 'n': rq.dry_run = true; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default: return usage_error("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);

    rk_err err = {0};
    rk_nvml *n = NULL;
    if (rk_nvml_open(&n, &err)) {
        fprintf(stderr, "rk tune: %s\n", err.msg);
        return RK_EXIT_FAIL;
    }
    int count = rk_nvml_count(n), status = RK_EXIT_OK;
    if (nsel == 0)
        for (int i = 0; i < count && i < MAX_SELECT; i++)
            sel[nsel++] = i;
    for (int k = 0; k < nsel; k++)
        if (sel[k] >= count) {
            fprintf(stderr, "rk tune: --gpu %d: this node has %d GPU%s (0-%d)\n", sel[k], count,
                    count == 1 ? "" : "s", count - 1);
            rk_nvml_close(n);
            return RK_EXIT_USAGE;
        }

    rk_gpu_info *info = calloc((size_t)nsel, sizeof *info);
    change *plan = calloc((size_t)nsel * MAX_CHANGES, sizeof *plan);
    int nplan = 0, bad = 0;
    if (!info || !plan) {
        fprintf(stderr, "rk tune: out of memory\n");
        status = RK_EXIT_FAIL;
        goto out;
    }
    bool nothing = !rq.lock && !rq.power && !rq.persistence && !rq.offset;
    for (int k = 0; k < nsel; k++) {
        int i = sel[k];
        rk_nvml_settings s;
        rk_nvml_info(n, i, &info[k]);
        if (rk_nvml_settings_get(n, i, &s, &err)) {
            fprintf(stderr, "rk tune: %s\n", err.msg);
            status = RK_EXIT_FAIL; /* this GPU is skipped; the others still go ahead */
            continue;
        }
        if (nothing) {
            show_settings(i, &info[k], &s);
            continue;
        }
        int m = plan_gpu(i, &info[k], &s, &rq, plan + nplan);
        if (m < 0)
            bad = 1;
        else
            nplan += m;
    }
    if (nothing) {
        printf("nothing to do: give --lock-clocks, --clock-offset, --power-limit or "
               "--persistence\n");
        goto out;
    }
    if (bad) {
        fprintf(stderr, "rk tune: nothing changed\n");
        status = RK_EXIT_USAGE;
        goto out;
    }
    for (int q = 0; q < nplan; q++) {
        const change *x = &plan[q];
        const rk_gpu_info *in = NULL;
        for (int k = 0; k < nsel; k++)
            if (sel[k] == x->gpu)
                in = &info[k];
        if (rq.dry_run) {
            print_change(x, in, x->already ? ": no change" : "");
            continue;
        }
        if (x->already) {
            print_change(x, in, ": no change");
            continue;
        }
        int rc = apply(n, x, &rq, &err);
        if (rc == RK_OK) {
            print_change(x, in, ": done");
            continue;
        }
        /* The library's message starts "GPU i: "; the line names the GPU already. */
        char pre[32];
        int pl = snprintf(pre, sizeof pre, "GPU %d: ", x->gpu);
        const char *msg = strncmp(err.msg, pre, (size_t)pl) == 0 ? err.msg + pl : err.msg;
        fprintf(stderr, "rk tune: GPU %d (%s): %s: failed: %s\n", x->gpu, gpu_name(in), x->what,
                msg);
        int st = rk_cli_status(rc);
        if (st > status)
            status = st;
    }
    if (rq.dry_run)
        printf("dry run: nothing changed\n");
out:
    free(plan);
    free(info);
    rk_nvml_close(n);
    return status;
}
