/*
 * Derived health signals (rekindle/health.h): dT/dt by least squares over the window, error
 * and replay rates from counter differences, link downtraining, throttle flags.
 */
#include "rekindle/health.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int rk_history_init(rk_gpu_history *h, int cap, rk_err *err)
{
    memset(h, 0, sizeof *h);
    if (cap < 2 || cap > 1 << 20)
        return rk_err_set(err, RK_EINVAL, "history: %d samples (2..%d)", cap, 1 << 20);
    h->s = calloc((size_t)cap, sizeof *h->s);
    if (!h->s)
        return rk_err_set(err, RK_ENOMEM, "history: out of memory");
    h->cap = cap;
    return RK_OK;
}

void rk_history_free(rk_gpu_history *h)
{
    free(h->s);
    memset(h, 0, sizeof *h);
}

void rk_history_push(rk_gpu_history *h, const rk_gpu_sample *s)
{
    h->s[h->next] = *s;
    h->next = (h->next + 1) % h->cap;
    if (h->n < h->cap)
        h->n++;
}

/* The k-th oldest sample in the window (0 = oldest). */
static const rk_gpu_sample *at(const rk_gpu_history *h, int k)
{
    int first = h->n < h->cap ? 0 : h->next;
    return &h->s[(first + k) % h->cap];
}

/* PCIe raw rate of one lane, GT/s, by generation. */
static double lane_gts(int gen)
{
    static const double g[] = {0, 2.5, 5.0, 8.0, 16.0, 32.0, 64.0};
    return gen >= 1 && gen <= 6 ? g[gen] : 8.0;
}

/* DCGM's limit is 8 replays a minute (the driver team's recommendation), for a link at full
 * speed; replays come per packet, so rekindle scales it by the link's raw bandwidth relative
 * to Gen3 x16: a Gen1 x8 link that replays 8 times a minute is far worse off than a Gen3 x16
 * one. */
static double replay_limit(int gen, int width)
{
    double bw = lane_gts(gen) * (width > 0 ? width : 16);
    return 8.0 * bw / (8.0 * 16);
}

void rk_signals_compute(const rk_gpu_history *h, rk_gpu_signals *out)
{
    memset(out, 0, sizeof *out);
    if (h->n == 0)
        return;
    const rk_gpu_sample *last = at(h, h->n - 1);
    /* dT/dt: least-squares slope of temperature over time, per minute */
    double st = 0, sy = 0, stt = 0, sty = 0;
    int m = 0;
    double t0 = 0;
    for (int k = 0; k < h->n; k++) {
        const rk_gpu_sample *s = at(h, k);
        if (s->lost || !rk_field_valid(s, RK_F_TEMP) || !isfinite(s->temp_c) || !isfinite(s->t))
            continue;
        if (m == 0)
            t0 = s->t;
        double x = s->t - t0;
        st += x;
        sy += s->temp_c;
        stt += x * x;
        sty += x * s->temp_c;
        m++;
    }
    double den = m * stt - st * st;
    if (m >= 3 && den > 1e-9) {
        out->dtdt_c_per_min = 60.0 * (m * sty - st * sy) / den;
        out->dtdt_valid = isfinite(out->dtdt_c_per_min);
    }
    /* counter rates between the oldest and newest samples that have them */
    const rk_gpu_sample *a = NULL;
    for (int k = 0; k < h->n - 1 && !a; k++)
        if (!at(h, k)->lost)
            a = at(h, k);
    double dt = a ? last->t - a->t : 0;
    /* a window shorter than a millisecond says nothing about a rate (and would overflow) */
    if (a && dt >= 1e-3 && isfinite(dt) && !last->lost) {
        if (rk_field_valid(a, RK_F_ECC_CORRECTED) && rk_field_valid(last, RK_F_ECC_CORRECTED) &&
            last->ecc_corrected >= a->ecc_corrected) {
            out->ecc_corrected_per_h = (double)(last->ecc_corrected - a->ecc_corrected) * 3600 / dt;
            out->ecc_rate_valid = isfinite(out->ecc_corrected_per_h);
        }
        if (rk_field_valid(a, RK_F_PCIE_REPLAY) && rk_field_valid(last, RK_F_PCIE_REPLAY) &&
            last->pcie_replay >= a->pcie_replay) {
            out->replay_per_min = (double)(last->pcie_replay - a->pcie_replay) * 60 / dt;
            out->replay_rate_valid = isfinite(out->replay_per_min);
        }
    }
    out->replay_limit_per_min =
        replay_limit(rk_field_valid(last, RK_F_PCIE_GEN) ? last->pcie_gen : 3,
                     rk_field_valid(last, RK_F_PCIE_WIDTH) ? last->pcie_width : 16);
    /* An idle GPU lowers its link generation to save power: a generation below the maximum
     * counts only under load (30% or more); fewer lanes than the maximum always do. */
    bool busy = rk_field_valid(last, RK_F_UTIL) && last->util_pct >= 30.0;
    out->downtrained =
        (busy && rk_field_valid(last, RK_F_PCIE_GEN) && rk_field_valid(last, RK_F_PCIE_GEN_MAX) &&
         last->pcie_gen < last->pcie_gen_max) ||
        (rk_field_valid(last, RK_F_PCIE_WIDTH) && rk_field_valid(last, RK_F_PCIE_WIDTH_MAX) &&
         last->pcie_width < last->pcie_width_max);
    if (rk_field_valid(last, RK_F_CLOCK_REASONS)) {
        uint64_t r = last->clock_reasons;
        out->throttled_thermal = (r & (RK_CLOCK_SW_THERMAL | RK_CLOCK_HW_THERMAL)) != 0;
        out->throttled_power = (r & RK_CLOCK_SW_POWER_CAP) != 0;
        out->hw_slowdown = (r & (RK_CLOCK_HW_SLOWDOWN | RK_CLOCK_HW_POWER_BRAKE)) != 0;
    }
}
