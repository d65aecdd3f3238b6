/*
 * rk plan's simulator speed (docs/plan.md, issue 35's goal: 100,000 GPUs x 30 days in <= 10 s):
 * simulated GPU-days per second of wall time at 1,000, 10,000 and 100,000 GPUs (8 a host),
 * 30 days each, with 1 % spare hosts (at least 2) and shrinking to half the hosts, under two
 * failure models: Llama 3's rate with disk recovery, and Meta's research clusters' rate (7x
 * Llama 3's) with memory recovery and snapshots every 10 steps. Each cell is the median of REPEATS
 * single runs (different seeds). Relies on src/plan (rkplan) and bench_util.h's clock.
 *
 *     build/plan_bench [REPEATS]      (default 3)
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "plan/fleet.h"
#include "plan/plan.h"

int main(int argc, char **argv)
{
    int repeats = argc > 1 ? atoi(argv[1]) : 3;
    if (repeats < 1 || repeats > 100) {
        fprintf(stderr, "usage: plan_bench [REPEATS 1..100]\n");
        return 2;
    }
    static const unsigned gpus[] = {1000, 10000, 100000};
    static const char *models[] = {"llama3", "meta-rsc"};
    printf("| GPUs | failures | recovery | failures a run | goodput | median s (30 days) | "
           "GPU-days/s |\n|---|---|---|---|---|---|---|\n");
    for (int m = 0; m < 2; m++)
        for (size_t g = 0; g < sizeof gpus / sizeof gpus[0]; g++) {
            rk_plan_config c;
            rk_err err = {0};
            rk_plan_config_default(&c);
            c.hosts = gpus[g] / 8;
            c.gpus_per_host = 8;
            c.horizon_s = 30 * 86400.0;
            if (rk_plan_failures_set(&c, models[m], 0, &err))
                return fprintf(stderr, "plan_bench: %s\n", err.msg), 1;
            c.spare_hosts = c.hosts / 100 > 2 ? c.hosts / 100 : 2;
            c.min_hosts = c.hosts / 2;
            if (m == 1) {
                c.mode = RK_PLAN_MEMORY;
                c.snap_every_s = 10 * c.step_s;
            }
            c.ckpt_every_s = rk_plan_daly_interval(c.ckpt_cost_s, rk_plan_job_mtbf(&c));
            double t[100], fails = 0, gp = 0;
            for (int r = 0; r < repeats; r++) {
                rk_plan_result res;
                double t0 = now_s();
                if (rk_plan_run(&c, 1 + (uint64_t)r, &res, &err))
                    return fprintf(stderr, "plan_bench: %s\n", err.msg), 1;
                t[r] = now_s() - t0;
                for (int k = 0; k < RK_PLAN_KINDS; k++)
                    fails += (double)res.failures[k] / repeats;
                gp += res.goodput / repeats;
            }
            double med = median(t, repeats);
            printf("| %u | %s | %s | %.0f | %.4f | %.3g | %.3g |\n", gpus[g], models[m],
                   m ? "memory" : "disk", fails, gp, med, gpus[g] * 30.0 / med);
        }
    return 0;
}
