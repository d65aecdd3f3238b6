/*
 * Step guards (rekindle/guard.h): robust z-score loss spikes, gradient-norm outliers across
 * ranks, majority vote over replica hashes. Pure arithmetic on numbers the caller gathered.
 */
#include "rekindle/guard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* rekindle/guard.h */
double rk_median_sort(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, dbl_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int rk_spike_init(rk_spike *s, int window, double z, rk_err *err)
{
    memset(s, 0, sizeof *s);
    if (window < 3 || window > 1 << 20 || !(z > 0) || !isfinite(z))
        return rk_err_set(err, RK_EINVAL, "loss spike guard: window %d (3..%d) or z %g (> 0)",
                          window, 1 << 20, z);
    s->v = malloc((size_t)window * sizeof *s->v);
    s->tmp = malloc((size_t)window * sizeof *s->tmp);
    if (!s->v || !s->tmp) {
        rk_spike_free(s);
        return rk_err_set(err, RK_ENOMEM, "loss spike guard: out of memory");
    }
    s->window = window;
    s->z = z;
    return RK_OK;
}

void rk_spike_free(rk_spike *s)
{
    free(s->v);
    free(s->tmp);
    memset(s, 0, sizeof *s);
}

int rk_spike_test(const rk_spike *s, double loss, double *zscore)
{
    if (zscore)
        *zscore = 0.0;
    if (!isfinite(loss))
        return 1;
    if (!s->v || s->n < s->window)
        return 0;
    memcpy(s->tmp, s->v, (size_t)s->n * sizeof *s->tmp);
    double med = rk_median_sort(s->tmp, s->n);
    for (int i = 0; i < s->n; i++)
        s->tmp[i] = fabs(s->v[i] - med);
    double mad = rk_median_sort(s->tmp, s->n);
    double floor = 1e-2 * fabs(med);
    if (mad < floor)
        mad = floor;
    if (!(mad > 0))
        return 0; /* every loss so far exactly zero: nothing to compare with */
    double z = (loss - med) / (1.4826 * mad);
    if (zscore)
        *zscore = z;
    return z > s->z;
}

void rk_spike_push(rk_spike *s, double loss)
{
    if (!s->v || !isfinite(loss))
        return;
    s->v[s->next] = loss;
    s->next = (s->next + 1) % s->window;
    if (s->n < s->window)
        s->n++;
}

void rk_spike_reset(rk_spike *s)
{
    s->n = 0;
    s->next = 0;
}

int rk_guard_outliers(const double *norms, int n, double ratio, unsigned char *flags)
{
    int flagged = 0, usable = 0;
    double *ok = malloc((size_t)(n > 0 ? n : 1) * sizeof *ok);
    for (int i = 0; i < n; i++) {
        flags[i] = 0;
        if (!isfinite(norms[i])) {
            flags[i] = 1;
            flagged++;
        } else if (norms[i] >= 0 && ok) {
            ok[usable++] = norms[i];
        }
    }
    if (!ok)
        return flagged;
    if (usable >= 3) {
        double med = rk_median_sort(ok, usable);
        for (int i = 0; i < n; i++)
            if (!flags[i] && norms[i] >= 0 && norms[i] > ratio * med) {
                flags[i] = 1;
                flagged++;
            }
    } else if (usable == 2) {
        int a = -1, b = -1;
        for (int i = 0; i < n; i++)
            if (!flags[i] && norms[i] >= 0) {
                if (a < 0)
                    a = i;
                else
                    b = i;
            }
        int hi = norms[a] >= norms[b] ? a : b, lo = hi == a ? b : a;
        if (norms[hi] > ratio * norms[lo]) {
            flags[hi] = 1;
            flagged++;
        }
    }
    free(ok);
    return flagged;
}

int rk_guard_vote(const uint64_t *hashes, int n, int *root, unsigned char *flags, int *strict)
{
    int best = 0, best_count = 0;
    for (int i = 0; i < n; i++) {
        int count = 0;
        for (int j = 0; j < n; j++)
            count += hashes[j] == hashes[i];
        if (count > best_count) { /* ties keep the lowest rank */
            best = i;
            best_count = count;
        }
    }
    int flagged = 0;
    for (int i = 0; i < n; i++) {
        flags[i] = hashes[i] != hashes[best];
        flagged += flags[i];
    }
    if (root)
        *root = best;
    if (strict)
        *strict = 2 * best_count > n;
    return flagged;
}
