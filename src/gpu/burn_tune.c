/*
 * rk burn's autotune cache (gpu/burn.h): one small text file per GPU model and compute
 * capability naming the fastest SGEMM variant, read through the bounded opener
 * (rekindle/fileio.h) and written atomically.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "gpu/burn.h"
#include "gpu/ref.h"
#include "rekindle/fileio.h"

#define TUNE_MAGIC "rekindle-sgemm-tune 1"

bool rk_burn_tune_dir(char *dir, size_t cap)
{
    const char *xdg = rk_env_override("XDG_CACHE_HOME");
    int k;
    if (xdg && xdg[0])
        k = snprintf(dir, cap, "%s/rekindle", xdg);
    else if (geteuid() == 0)
        k = snprintf(dir, cap, "/var/cache/rekindle");
    else {
        const char *home = rk_env_override("HOME");
        if (!home || !home[0]) {
            if (cap)
                dir[0] = '\0';
            return false;
        }
        k = snprintf(dir, cap, "%s/.cache/rekindle", home);
    }
    if (k < 0 || (size_t)k >= cap) {
        if (cap)
            dir[0] = '\0';
        return false;
    }
    return true;
}

void rk_burn_tune_path(char *path, size_t cap, const char *dir, const char *model, int cc_major,
                       int cc_minor)
{
    char m[96];
    size_t j = 0;
    for (const char *p = model ? model : ""; *p && j + 1 < sizeof m; p++) {
        char ch = *p;
        bool keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '-';
        m[j++] = keep ? ch : '_';
    }
    m[j] = '\0';
    snprintf(path, cap, "%s/sgemm-%s-sm%d%d.tune", dir, m, cc_major, cc_minor);
}

/* The next line of text[*pos .. len) into line (without '\n'); false at the end or when a
 * line is too long or holds a NUL. */
static int next_line(const char *text, size_t len, size_t *pos, char *line, size_t cap)
{
    if (*pos >= len)
        return 0;
    size_t s = *pos, e = s;
    while (e < len && text[e] != '\n')
        e++;
    if (e - s >= cap || memchr(text + s, '\0', e - s))
        return -1;
    memcpy(line, text + s, e - s);
    line[e - s] = '\0';
    *pos = e < len ? e + 1 : e;
    return 1;
}

int rk_burn_tune_parse(const char *file, const char *text, size_t len, int *variant, double *gflops,
                       rk_err *err)
{
    const char *f = file ? file : "sgemm tune cache";
    if (len > RK_BURN_TUNE_MAX)
        return rk_err_set(err, RK_EFORMAT, "%s: larger than %d bytes", f, RK_BURN_TUNE_MAX);
    char line[128];
    size_t pos = 0;
    int v = -1;
    double g = -1;
    for (int no = 1;; no++) {
        int r = next_line(text, len, &pos, line, sizeof line);
        if (r == 0)
            break;
        if (r < 0)
            return rk_err_set(err, RK_EFORMAT, "%s: line %d: too long or not text", f, no);
        if (no == 1) {
            if (strcmp(line, TUNE_MAGIC) != 0)
                return rk_err_set(err, RK_EFORMAT, "%s: line 1: not '" TUNE_MAGIC "'", f);
            continue;
        }
        if (!strncmp(line, "variant ", 8)) {
            if (v >= 0)
                return rk_err_set(err, RK_EFORMAT, "%s: line %d: variant given twice", f, no);
            v = rk_sgemm_variant_find(line + 8);
            if (v < 0)
                return rk_err_set(err, RK_EFORMAT, "%s: line %d: unknown SGEMM variant", f, no);
        } else if (!strncmp(line, "gflops ", 7)) {
            char *end;
            errno = 0;
            double x = strtod(line + 7, &end);
            if (g >= 0 || end == line + 7 || *end || errno || !isfinite(x) || x < 0 || x > 1e9)
                return rk_err_set(err, RK_EFORMAT, "%s: line %d: bad gflops", f, no);
            g = x;
        } else {
            return rk_err_set(err, RK_EFORMAT, "%s: line %d: unknown field", f, no);
        }
    }
    if (v < 0 || g < 0)
        return rk_err_set(err, RK_EFORMAT, "%s: %s missing", f, v < 0 ? "variant" : "gflops");
    *variant = v;
    *gflops = g;
    return RK_OK;
}

int rk_burn_tune_load(const char *path, int *variant, double *gflops, rk_err *err)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = rk_file_read_all(path, &buf, &len, RK_BURN_TUNE_MAX, err);
    if (rc < 0)
        return rc;
    rc = rk_burn_tune_parse(path, (const char *)buf, len, variant, gflops, err);
    free(buf);
    return rc;
}

int rk_burn_tune_save(const char *path, int variant, double gflops, rk_err *err)
{
    if (variant < 0 || variant >= rk_sgemm_variant_count || !isfinite(gflops) || gflops < 0)
        return rk_err_set(err, RK_EINVAL, "sgemm tune cache: bad variant or rate");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        char *up = strrchr(dir, '/');
        if (up && up != dir) {
            *up = '\0';
            (void)mkdir(dir, 0755); /* the parent (~/.cache): best effort */
            *up = '/';
        }
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return rk_err_set(err, RK_EIO, "%s: mkdir: %s", dir, strerror(errno));
    }
    char text[256];
    int k = snprintf(text, sizeof text, TUNE_MAGIC "\nvariant %s\ngflops %.1f\n",
                     rk_sgemm_variants[variant].name, gflops);
    return rk_file_write_atomic(path, text, (size_t)k, err);
}
