/*
 * libFuzzer target for the health score's input (rekindle/health.h): arbitrary bytes become
 * a window of samples (valid bits and every field, NaN and infinities included, as a broken
 * backend or sensor might give), then signals and the score. The score must stay in 0..100,
 * the findings within bounds and terminated, and valid signals finite.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/health.h"

static double take(const uint8_t **p, size_t *n)
{
    double v = 0;
    if (*n >= sizeof v) {
        memcpy(&v, *p, sizeof v);
        *p += sizeof v;
        *n -= sizeof v;
    }
    return v;
}

static uint64_t take64(const uint8_t **p, size_t *n)
{
    uint64_t v = 0;
    if (*n >= sizeof v) {
        memcpy(&v, *p, sizeof v);
        *p += sizeof v;
        *n -= sizeof v;
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_gpu_history h;
    if (rk_history_init(&h, 8, NULL) != RK_OK)
        return 0;
    const uint8_t *p = data;
    size_t n = size;
    rk_gpu_sample last = {0};
    while (n > 0) {
        rk_gpu_sample s;
        memset(&s, 0, sizeof s);
        s.valid = take64(&p, &n);
        s.lost = (s.valid >> 63) & 1;
        s.t = take(&p, &n);
        s.temp_c = take(&p, &n);
        s.fan_pct = take(&p, &n);
        s.vrm_ripple_mv = take(&p, &n);
        s.fan_vib_hz = take(&p, &n);
        s.util_pct = take(&p, &n);
        s.clock_reasons = take64(&p, &n);
        s.ecc_corrected = take64(&p, &n);
        s.ecc_uncorrected = take64(&p, &n);
        s.retired_pages = take64(&p, &n);
        s.retired_pending = take64(&p, &n);
        s.remapped_rows = take64(&p, &n);
        s.pcie_replay = take64(&p, &n);
        s.xid_count = take64(&p, &n);
        uint64_t links = take64(&p, &n);
        s.pcie_gen = (int)(int8_t)(links & 0xff);
        s.pcie_width = (int)(int8_t)((links >> 8) & 0xff);
        s.pcie_gen_max = (int)(int8_t)((links >> 16) & 0xff);
        s.pcie_width_max = (int)(int8_t)((links >> 24) & 0xff);
        s.last_xid = (int)(links >> 32);
        rk_history_push(&h, &s);
        last = s;
        if (n < 8)
            break;
    }
    rk_gpu_signals g;
    rk_signals_compute(&h, &g);
    if ((g.dtdt_valid && !isfinite(g.dtdt_c_per_min)) ||
        (g.ecc_rate_valid && !isfinite(g.ecc_corrected_per_h)) ||
        (g.replay_rate_valid && !isfinite(g.replay_per_min)) || !isfinite(g.replay_limit_per_min))
        abort();
    rk_finding f[RK_MAX_FINDINGS];
    int nf = -1;
    int score = rk_health_score(&last, &g, f, &nf);
    if (score < 0 || score > 100 || nf < 0 || nf > RK_MAX_FINDINGS)
        abort();
    /* the advice fitted to a card: any architecture and routes, the same score */
    rk_gpu_info in;
    memset(&in, 0, sizeof in);
    in.arch = (rk_gpu_arch)(size % 11);
    in.tune = (unsigned)(size / 11) & 15u;
    int nf2 = -1;
    if (rk_health_score_gpu(&in, &last, &g, f, &nf2) != score || nf2 != nf)
        abort();
    for (int i = 0; i < nf; i++)
        if (!memchr(f[i].code, 0, sizeof f[i].code) ||
            !memchr(f[i].message, 0, sizeof f[i].message) ||
            !memchr(f[i].action, 0, sizeof f[i].action) || f[i].penalty < 0)
            abort();
    rk_history_free(&h);
    return 0;
}
