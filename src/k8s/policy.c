/*
 * The device plugin's decisions (dp.h): health with hysteresis, the preferred allocation's
 * order, Allocate's refusal, the PCIe switch of a sysfs path and the device-id rule. Pure
 * functions over rk_dp_dev tables; tests/test_k8s.c checks each rule.
 */
#include "k8s/dp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool rk_dp_health_next(bool healthy, bool first, bool has_score, int score, double threshold,
                       double hysteresis)
{
    if (!has_score)
        return false;
    if (first)
        return score >= threshold;
    if (healthy)
        return score >= threshold;
    return score >= threshold + hysteresis;
}

bool rk_dp_dev_update(rk_dp_dev *d, bool has_score, int score, int failed_reads, const char *why,
                      double threshold, double hysteresis)
{
    bool was = d->healthy, first = !d->has_score;
    d->has_score = has_score;
    d->score = has_score ? score : 0;
    d->failed_reads = failed_reads;
    if (failed_reads >= RK_DP_STALE_READS) {
        d->healthy = false;
        snprintf(d->why, sizeof d->why, "no reading for %d intervals", failed_reads);
    } else {
        snprintf(d->why, sizeof d->why, "%s", why ? why : "");
        d->healthy = rk_dp_health_next(was, first, has_score, d->score, threshold, hysteresis);
    }
    return was != d->healthy;
}

int rk_dp_find(const rk_dp_dev *devs, int n, const char *id)
{
    for (int i = 0; i < n; i++)
        if (strcmp(devs[i].id, id) == 0)
            return i;
    return -1;
}

bool rk_dp_id_ok(const char *s, size_t len)
{
    if (len == 0 || len > RK_DP_MAX_ID)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return false;
    return true;
}

bool rk_dp_resource_ok(const char *s)
{
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || strchr(slash + 1, '/') || slash - s > 253)
        return false;
    for (const char *p = s; p < slash; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
            return false;
    size_t n = strlen(slash + 1);
    if (n == 0 || n > 63)
        return false;
    for (const char *p = slash + 1; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return false;
    return true;
}

static void status(rk_dp_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void status(rk_dp_status *st, int code, const char *fmt, ...)
{
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
}

/* Does out[0..k) hold i? */
static bool holds(const int *out, int k, int i)
{
    for (int j = 0; j < k; j++)
        if (out[j] == i)
            return true;
    return false;
}

/* The ordering of the remaining candidates (rule 1-3 of rk_dp_prefer). */
typedef struct prefer_ctx {
    const rk_dp_dev *devs;
    const char *anchor; /* "" none */
} prefer_ctx;

static bool on_anchor(const prefer_ctx *c, int i)
{
    return c->anchor[0] && strcmp(c->devs[i].sw, c->anchor) == 0;
}

/* <0 when a goes before b. */
static int prefer_cmp(const prefer_ctx *c, int a, int b)
{
    const rk_dp_dev *x = &c->devs[a], *y = &c->devs[b];
    if (x->healthy != y->healthy)
        return x->healthy ? -1 : 1;
    bool ax = on_anchor(c, a), ay = on_anchor(c, b);
    if (ax != ay)
        return ax ? -1 : 1;
    int sx = x->has_score ? x->score : -1, sy = y->has_score ? y->score : -1;
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return (a > b) - (a < b);
}

/* The switch with the most Healthy devices among cand[0..nc) (ties: the higher best score,
 * then the lower index of that best device); "" when none has a known switch. */
static const char *busiest_switch(const rk_dp_dev *devs, const int *cand, int nc)
{
    const char *best = "";
    int best_count = 0, best_score = -1, best_index = 0;
    for (int a = 0; a < nc; a++) {
        const rk_dp_dev *d = &devs[cand[a]];
        if (!d->sw[0] || !d->healthy)
            continue;
        int count = 0, top = -1, top_index = 0;
        for (int b = 0; b < nc; b++) {
            const rk_dp_dev *e = &devs[cand[b]];
            if (!e->healthy || strcmp(e->sw, d->sw) != 0)
                continue;
            count++;
            int s = e->has_score ? e->score : -1;
            if (s > top || (s == top && cand[b] < top_index)) {
                top = s;
                top_index = cand[b];
            }
        }
        if (count > best_count || (count == best_count && top > best_score) ||
            (count == best_count && top == best_score && top_index < best_index)) {
            best = d->sw;
            best_count = count;
            best_score = top;
            best_index = top_index;
        }
    }
    return best;
}

int rk_dp_prefer(const rk_dp_dev *devs, int n, const int *avail, int navail, const int *must,
                 int nmust, int size, int *out, rk_dp_status *st)
{
    status(st, RK_DP_OK, "%s", "");
    if (navail < 0 || nmust < 0 || navail > RK_DP_MAX_DEVICES || nmust > RK_DP_MAX_DEVICES) {
        status(st, RK_DP_INVALID_ARGUMENT, "more devices than the plugin serves");
        return st->code;
    }
    /* the distinct available devices */
    int cand[RK_DP_MAX_DEVICES], nc = 0;
    for (int a = 0; a < navail; a++)
        if (avail[a] >= 0 && avail[a] < n && !holds(cand, nc, avail[a]))
            cand[nc++] = avail[a];
    int k = 0;
    for (int m = 0; m < nmust; m++) {
        if (must[m] < 0 || must[m] >= n || !holds(cand, nc, must[m])) {
            status(st, RK_DP_INVALID_ARGUMENT, "must_include_deviceIDs %d is not available", m);
            return st->code;
        }
        if (holds(out, k, must[m]))
            continue;
        if (k >= size) {
            status(st, RK_DP_INVALID_ARGUMENT,
                   "allocation_size %d is smaller than must_include_deviceIDs (%d or more)", size,
                   k + 1);
            return st->code;
        }
        out[k++] = must[m];
    }
    if (size < 0 || size > nc) {
        status(st, RK_DP_INVALID_ARGUMENT,
               "allocation_size %d is not within 0..%d (the available devices)", size, nc);
        return st->code;
    }
    prefer_ctx c = {devs, k ? devs[out[0]].sw : busiest_switch(devs, cand, nc)};
    while (k < size) { /* selection: at most RK_DP_MAX_DEVICES^2 comparisons */
        int best = -1;
        for (int a = 0; a < nc; a++)
            if (!holds(out, k, cand[a]) && (best < 0 || prefer_cmp(&c, cand[a], best) < 0))
                best = cand[a];
        out[k++] = best;
    }
    return RK_DP_OK;
}

int rk_dp_allocate_check(const rk_dp_dev *devs, int n, char *const *ids, size_t nids,
                         double threshold, double hysteresis, rk_dp_status *st)
{
    status(st, RK_DP_OK, "%s", "");
    unsigned char seen[RK_DP_MAX_DEVICES] = {0};
    for (size_t j = 0; j < nids; j++) {
        int i = rk_dp_find(devs, n, ids[j]);
        if (i < 0 || i >= RK_DP_MAX_DEVICES) {
            status(st, RK_DP_NOT_FOUND, "device %s: no such device on this node", ids[j]);
            return st->code;
        }
        if (seen[i]++) {
            status(st, RK_DP_INVALID_ARGUMENT, "device %s: asked for twice", ids[j]);
            return st->code;
        }
        const rk_dp_dev *d = &devs[i];
        if (d->healthy)
            continue;
        if (d->failed_reads >= RK_DP_STALE_READS)
            status(st, RK_DP_FAILED_PRECONDITION,
                   "device %s (GPU %d%s) refused: no reading for %d intervals (last score %d)",
                   d->id, d->index, d->simulated ? ", simulated" : "", d->failed_reads, d->score);
        else if (!d->has_score)
            status(st, RK_DP_FAILED_PRECONDITION,
                   "device %s (GPU %d%s) refused: no reading of it has succeeded", d->id, d->index,
                   d->simulated ? ", simulated" : "");
        else if (d->score < threshold)
            status(st, RK_DP_FAILED_PRECONDITION,
                   "device %s (GPU %d%s) refused: health score %d is below the threshold %g%s%s",
                   d->id, d->index, d->simulated ? ", simulated" : "", d->score, threshold,
                   d->why[0] ? ": " : "", d->why);
        else
            status(st, RK_DP_FAILED_PRECONDITION,
                   "device %s (GPU %d%s) refused: health score %d has not recovered to %g "
                   "(threshold %g + hysteresis %g)%s%s",
                   d->id, d->index, d->simulated ? ", simulated" : "", d->score,
                   threshold + hysteresis, threshold, hysteresis, d->why[0] ? ": " : "", d->why);
        return st->code;
    }
    return RK_DP_OK;
}

int rk_dp_switch_key(const char *path, char *out, size_t cap)
{
    if (cap)
        out[0] = '\0';
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    /* drop the GPU's own component and its parent's */
    size_t end = len;
    for (int drop = 0; drop < 2; drop++) {
        while (end > 0 && path[end - 1] != '/')
            end--;
        if (end == 0)
            return RK_EINVAL;
        end--; /* the '/' */
        while (end > 0 && path[end - 1] == '/')
            end--;
    }
    /* what is left must still name a PCI device or a root complex: ".../pci0000:00" at least */
    size_t last = end;
    while (last > 0 && path[last - 1] != '/')
        last--;
    if (end == 0 || end - last < 3 ||
        (strncmp(path + last, "pci", 3) != 0 && memchr(path + last, ':', end - last) == NULL))
        return RK_EINVAL;
    if (end + 1 > cap)
        return RK_EINVAL;
    memcpy(out, path, end);
    out[end] = '\0';
    return RK_OK;
}
