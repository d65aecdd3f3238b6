/*
 * The command-line value parser every rk subcommand uses (args.h): one syntax and one range
 * per kind of value, and the kind check of path flags. Relies on strtoll/strtoull/strtod only
 * after its own grammar check, so what they would accept beyond it (spaces, '+', hex, inf,
 * nan, a locale's digits) never gets through.
 */
#include "args.h"

#include "rekindle/ckpt.h"
#include "rekindle/fileio.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/msg.h"
#include "rekindle/heartbeat.h" /* RK_EXIT_USAGE */

static size_t digits(const char *s)
{
    size_t n = 0;
    while (s[n] >= '0' && s[n] <= '9')
        n++;
    return n;
}

/* Length of the longest prefix of `s` in the number grammar: -? int (. frac)? (e [+-]? exp)?,
 * int "0" or without a leading zero (it may be empty when a fraction follows: ".5"); a whole
 * number has neither fraction nor exponent. 0 when `s` does not start with a number. */
static size_t number_len(const char *s, bool whole)
{
    size_t i = s[0] == '-';
    size_t d = digits(s + i);
    if (d > 1 && s[i] == '0')
        return 0; /* "010": octal to some readers, ten to others */
    i += d;
    if (whole)
        return d && !(s[0] == '-' && s[1] == '0') ? i : 0; /* "-0": write 0 */
    if (s[i] == '.') {
        size_t f = digits(s + i + 1);
        if (f == 0)
            return 0; /* "5." */
        i += 1 + f;
    } else if (d == 0) {
        return 0;
    }
    if (s[i] == 'e' || s[i] == 'E') {
        size_t j = i + 1 + (s[i + 1] == '-' || s[i + 1] == '+');
        size_t e = digits(s + j);
        if (e == 0)
            return 0;
        i = j + e;
    }
    return i;
}

bool rk_args_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    size_t n = number_len(s, true);
    if (n == 0 || s[n] != '\0')
        return false;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno || v < lo || v > hi)
        return false;
    *out = (int64_t)v;
    return true;
}

bool rk_args_u64(const char *s, uint64_t *out)
{
    size_t n = number_len(s, true);
    if (n == 0 || s[n] != '\0' || s[0] == '-')
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno)
        return false;
    *out = (uint64_t)v;
    return true;
}

/* The number that starts `s` (n characters of the grammar) as a finite double. */
static bool finite_prefix(const char *s, size_t n, double *out)
{
    char buf[128];
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    if (!isfinite(v) || (errno == ERANGE && fabs(v) > 1.0))
        return false; /* an overflow; an underflow is a number near 0 */
    *out = v;
    return true;
}

bool rk_args_real(const char *s, double lo, double hi, double *out)
{
    size_t n = number_len(s, false);
    double v;
    if (s[n] != '\0' || !finite_prefix(s, n, &v) || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

bool rk_args_seconds(const char *s, double lo, double hi, double *out)
{
    size_t n = number_len(s, false);
    double v;
    if (!finite_prefix(s, n, &v))
        return false;
    const char *unit = s + n;
    if (strcmp(unit, "ms") == 0)
        v /= 1000;
    else if (strcmp(unit, "m") == 0)
        v *= 60;
    else if (strcmp(unit, "h") == 0)
        v *= 3600;
    else if (*unit && strcmp(unit, "s") != 0)
        return false;
    if (!isfinite(v) || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

/* ---- messages ---------------------------------------------------------------------------- */

int rk_cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rk %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n\n%s", usage);
    va_end(ap);
    return RK_EXIT_USAGE;
}

int rk_arg_error(rk_args *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->msg, sizeof a->msg, fmt, ap);
    va_end(ap);
    if (!a->quiet)
        fprintf(stderr, "rk %s: %s\n\n%s", a->cmd, a->msg, a->usage ? a->usage : "");
    return RK_EXIT_USAGE;
}

/* "FLAG 'VALUE' is not WHAT": the value as the user gave it, control bytes shown as '?'. */
__attribute__((format(printf, 4, 5))) static int refuse(rk_args *a, const char *flag, const char *s,
                                                        const char *fmt, ...)
{
    char shown[96], what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return rk_arg_error(a, "%s '%s' is not %s", flag, rk_msg_show(shown, sizeof shown, s), what);
}

/* ---- one flag's value -------------------------------------------------------------------- */

int rk_arg_count(rk_args *a, const char *flag, const char *s, int lo, int hi, int *out)
{
    int64_t v;
    if (!rk_args_int(s, lo, hi, &v))
        return refuse(a, flag, s, "a whole number in %d..%d", lo, hi);
    *out = (int)v;
    return 0;
}

int rk_arg_step(rk_args *a, const char *flag, const char *s, int64_t lo, int64_t *out)
{
    if (!rk_args_int(s, lo, INT64_MAX, out))
        return refuse(a, flag, s, "a step count in %lld..%lld", (long long)lo,
                      (long long)INT64_MAX);
    return 0;
}

int rk_arg_seed(rk_args *a, const char *flag, const char *s, uint64_t *out)
{
    /* 2^63-1 at most: a seed is written into JSON (checkpoint configs, summaries), whose
     * readers here (jansson) hold signed 64-bit integers */
    uint64_t v;
    if (!rk_args_u64(s, &v) || v > (uint64_t)INT64_MAX)
        return refuse(a, flag, s, "a seed: a whole number in 0..%lld", (long long)INT64_MAX);
    *out = v;
    return 0;
}

int rk_arg_real(rk_args *a, const char *flag, const char *s, double lo, double hi, double *out)
{
    if (!rk_args_real(s, lo, hi, out))
        return refuse(a, flag, s, "a number in [%g, %g]", lo, hi);
    return 0;
}

int rk_cli_number(const char *cmd, const char *usage, const char *flag, const char *s, double lo,
                  double hi, double *out)
{
    rk_args a = {.cmd = cmd, .usage = usage};
    return rk_arg_real(&a, flag, s, lo, hi, out);
}

int rk_arg_probability(rk_args *a, const char *flag, const char *s, double *out)
{
    if (!rk_args_real(s, 0, 1, out))
        return refuse(a, flag, s, "a probability in [0, 1]");
    return 0;
}

int rk_arg_score(rk_args *a, const char *flag, const char *s, double *out)
{
    if (!rk_args_real(s, 0, 100, out))
        return refuse(a, flag, s, "a health score in [0, 100]");
    return 0;
}

int rk_arg_hours(rk_args *a, const char *flag, const char *s, double *out)
{
    if (!rk_args_real(s, 0, RK_ARG_HOURS_MAX, out))
        return refuse(a, flag, s, "a number of hours in [0, %g]", RK_ARG_HOURS_MAX);
    return 0;
}

int rk_arg_seconds(rk_args *a, const char *flag, const char *s, double lo, double hi, double *out)
{
    if (!rk_args_seconds(s, lo, hi, out))
        return refuse(a, flag, s,
                      "a duration in [%g, %g] seconds (500ms, 5s, 1m, 2h or bare seconds)", lo, hi);
    return 0;
}

int rk_arg_mhz(rk_args *a, const char *flag, const char *s, unsigned *out)
{
    int64_t v;
    if (!rk_args_int(s, 1, RK_ARG_MHZ_MAX, &v))
        return refuse(a, flag, s, "a clock in MHz: a whole number in 1..%d", RK_ARG_MHZ_MAX);
    *out = (unsigned)v;
    return 0;
}

int rk_arg_watts(rk_args *a, const char *flag, const char *s, double *out)
{
    if (!rk_args_real(s, 1, RK_ARG_WATTS_MAX, out))
        return refuse(a, flag, s, "a number of watts in [1, %g]", RK_ARG_WATTS_MAX);
    return 0;
}

int rk_arg_sim_load(rk_args *a, const char *flag, const char *s, rk_sim_load *out)
{
    if (strcmp(s, "idle") == 0)
        *out = RK_SIM_LOAD_IDLE;
    else if (strcmp(s, "busy") == 0)
        *out = RK_SIM_LOAD_BUSY;
    else
        return refuse(a, flag, s, "idle or busy");
    return 0;
}

/* ---- paths ------------------------------------------------------------------------------- */

/* "rk CMD: FLAG PATH: problem" on one line: a path is not a usage problem, so no usage. */
__attribute__((format(printf, 4, 5))) static int path_error(rk_args *a, const char *flag,
                                                            const char *path, const char *fmt, ...)
{
    char shown[256], what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(a->msg, sizeof a->msg, "%s %s: %s", flag, rk_msg_show(shown, sizeof shown, path),
             what);
    if (!a->quiet)
        fprintf(stderr, "rk %s: %s\n", a->cmd, a->msg);
    return RK_EXIT_USAGE;
}

int rk_arg_path(rk_args *a, const char *flag, const char *path, rk_path_kind kind)
{
    char eb[128];
    if (!*path)
        return path_error(a, flag, path, "an empty path");
    struct stat st;
    int have = stat(path, &st) == 0, e = have ? 0 : errno;
    const char *why = have ? NULL : rk_msg_strerror(e, eb, sizeof eb);
    switch (kind) {
    case RK_PATH_DIR:
        if (!have)
            return path_error(a, flag, path, "%s", e == ENOENT ? "no such directory" : why);
        if (!S_ISDIR(st.st_mode))
            return path_error(a, flag, path, "is %s, not a directory",
                              rk_file_kind_name(st.st_mode));
        return 0;
    case RK_PATH_DIR_OR_NEW:
        /* ENOENT: every part that exists is a directory (else ENOTDIR), so it can be made */
        if (!have && e != ENOENT)
            return path_error(a, flag, path, "%s", why);
        if (have && !S_ISDIR(st.st_mode))
            return path_error(a, flag, path, "is %s, not a directory",
                              rk_file_kind_name(st.st_mode));
        return 0;
    case RK_PATH_FILE:
        if (!have)
            return path_error(a, flag, path, "%s", e == ENOENT ? "no such file" : why);
        if (!S_ISREG(st.st_mode))
            return path_error(a, flag, path, "is %s, not a regular file",
                              rk_file_kind_name(st.st_mode));
        return 0;
    case RK_PATH_OUTPUT: break;
    }
    size_t len = strlen(path);
    if (have && !S_ISREG(st.st_mode))
        return path_error(a, flag, path, "is %s, not a regular file",
                          rk_file_kind_name(st.st_mode));
    if (!have && e != ENOENT)
        return path_error(a, flag, path, "%s", why);
    if (path[len - 1] == '/')
        return path_error(a, flag, path, "names a directory, not a file");
    /* the directory that will hold it: exists, is one, and takes new files */
    char *dir = malloc(len + 2);
    if (!dir)
        return path_error(a, flag, path, "out of memory");
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else
        slash[slash == dir] = '\0'; /* "/x" -> "/" */
    char dshown[256];
    rk_msg_show(dshown, sizeof dshown, dir);
    int rc = 0, de = stat(dir, &st) == 0 ? 0 : errno;
    if (de == ENOENT) /* output files go into directories that exist */
        rc = path_error(a, flag, path, "directory %s does not exist: create it first (mkdir -p %s)",
                        dshown, dshown);
    else if (de)
        rc = path_error(a, flag, path, "directory %s cannot be reached (%s)", dshown,
                        rk_msg_strerror(de, eb, sizeof eb));
    else if (!S_ISDIR(st.st_mode))
        rc = path_error(a, flag, path, "%s is not a directory", dshown);
    else if (access(dir, W_OK) != 0)
        rc = path_error(a, flag, path, "directory %s is not writable (%s)", dshown,
                        rk_msg_strerror(errno, eb, sizeof eb));
    else if (rk_ckpt_is_store(dir)) /* a file there would replace or pass for a checkpoint */
        rc = path_error(a, flag, path,
                        "%s is a checkpoint store (it holds latest, %s or checkpoint files): "
                        "write outputs outside it",
                        dshown, RK_CKPT_LOCK_FILE);
    free(dir);
    return rc;
}

/* "0,2,5-7" into idx: indices below max, in the order given, duplicates kept out; false for
 * an empty part, a trailing comma, a range backwards or an index of max or more. */
bool rk_args_gpu_list(const char *s, int max, int *idx, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char part[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof part)
            return false;
        memcpy(part, p, len);
        part[len] = '\0';
        char *dash = strchr(part, '-');
        int64_t a, b;
        if (dash) {
            *dash = '\0';
            if (!rk_args_int(part, 0, max - 1, &a) || !rk_args_int(dash + 1, 0, max - 1, &b) ||
                b < a)
                return false;
        } else if (!rk_args_int(part, 0, max - 1, &a)) {
            return false;
        } else {
            b = a;
        }
        for (int64_t v = a; v <= b; v++) {
            bool seen = false;
            for (int k = 0; k < *n; k++)
                seen |= idx[k] == v;
            if (!seen && *n < max)
                idx[(*n)++] = (int)v;
        }
        p += len;
        if (*p == ',' && !*++p)
            return false; /* a trailing comma */
    }
    return *n > 0;
}
