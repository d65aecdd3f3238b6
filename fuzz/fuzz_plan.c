/*
 * libFuzzer target for rk plan's readers (src/plan): the first byte picks one - 't' a fault
 * trace (rk_plan_trace_parse), 'f' a fleet file (rk_plan_fleet_parse), anything else an rk
 * run summary (rk_plan_summary_parse) - and the rest is its input. Any input is rejected with
 * a message or gives values that keep the invariants the simulator relies on; a parsed trace
 * is also replayed (a short run) and must account its faults and downtime within bounds.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan/fleet.h"
#include "plan/plan.h"

static void trace_case(const char *text, size_t len)
{
    rk_plan_trace t;
    rk_err err = {0};
    if (rk_plan_trace_parse(text, len, "fuzz", &t, &err) != RK_OK) {
        if (!err.msg[0] || t.faults)
            abort();
        return;
    }
    double sum = 0;
    for (size_t i = 0; i < t.n; i++) {
        const rk_plan_fault *f = &t.faults[i];
        if (f->host >= t.nodes || !(f->end_s >= f->start_s) || f->end_s > t.span_s ||
            (i && f->start_s < t.faults[i - 1].start_s))
            abort();
        sum += f->end_s - f->start_s;
    }
    if (t.unavail_s < 0 || t.unavail_s > sum * (1 + 1e-9) + 1e-6)
        abort();
    if (t.n && t.nodes) {
        rk_plan_config c;
        rk_plan_result r;
        rk_plan_config_default(&c);
        c.hosts = t.nodes;
        c.min_hosts = 1;
        c.trace = t.faults;
        c.trace_len = t.n;
        c.horizon_s = t.span_s > 0 ? t.span_s : 1;
        c.ckpt_every_s = c.horizon_s / 8;
        if (rk_plan_run(&c, 1, &r, &err) != RK_OK || r.trace_faults != t.n ||
            fabs(r.host_down_s - t.unavail_s) > 1e-6 * (t.unavail_s + 1))
            abort();
    }
    rk_plan_trace_free(&t);
}

static void fleet_case(const char *text, size_t len)
{
    rk_plan_fleet f;
    rk_err err = {0};
    if (rk_plan_fleet_parse(text, len, "fuzz", &f, &err) != RK_OK) {
        if (!err.msg[0])
            abort();
        return;
    }
    if (f.n < 1 || f.n > RK_PLAN_FLEET_MAX_CARDS || f.hosts < 1 || f.gpus % f.hosts ||
        !(f.tflops > 0) || f.score_mean < 0 || f.score_mean > 100)
        abort();
    for (size_t i = 0; i < f.n; i++)
        if (!f.cards[i].model[0] || f.cards[i].count < 1)
            abort();
}

static void summary_case(const char *text, size_t len)
{
    rk_plan_measured m;
    rk_err err = {0};
    if (rk_plan_summary_parse(text, len, "fuzz", 0.072, &m, &err) != RK_OK) {
        if (!err.msg[0])
            abort();
        return;
    }
    if (!(m.step_s > 0) || !isfinite(m.step_s) || m.restart_s < 0 ||
        (m.mode != RK_PLAN_DISK && m.mode != RK_PLAN_MEMORY) || m.state_bytes < 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if (data[0] == 't')
        trace_case(text, len);
    else if (data[0] == 'f')
        fleet_case(text, len);
    else
        summary_case(text, len);
    return 0;
}
