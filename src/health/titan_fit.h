/*
 * Weibull fits of GPU lifetimes on ORNL's Titan supercomputer (18,688 Tesla K20X GPUs),
 * from the data of G. Ostrouchov et al., "GPU Lifetimes on Titan Supercomputer: Survival
 * Analysis and Reliability", SC20. The simulated fleet (sim.c, docs/sim.md) draws its
 * times to failure from these numbers. GENERATED: do not edit. Regenerate with
 *     python3 scripts/fit_titan.py
 * from ../shared/data/titan/gc_full.csv (36185 rows used, 1158 skipped for
 * want of a duration). Censored maximum likelihood; times in hours of service;
 * S(t) = exp(-(t / lambda)^k).
 */
#ifndef RK_TITAN_FIT_H
#define RK_TITAN_FIT_H

/* time to a double-bit ECC error (OTB and no event censored):
 * 3787 events, 32398 censored, log-likelihood -50125.601 */
#define RK_TITAN_DBE_SHAPE 1.589301
#define RK_TITAN_DBE_SCALE_H 110603.1
#define RK_TITAN_DBE_EVENTS 3787
#define RK_TITAN_DBE_CENSORED 32398

/* time to falling off the bus (DBE and no event censored):
 * 1422 events, 34763 censored, log-likelihood -20199.587 */
#define RK_TITAN_OTB_SHAPE 1.621280
#define RK_TITAN_OTB_SCALE_H 197596.2
#define RK_TITAN_OTB_EVENTS 1422
#define RK_TITAN_OTB_CENSORED 34763

/* time to any failure, DBE or OTB:
 * 5209 events, 30976 censored, log-likelihood -67271.915 */
#define RK_TITAN_ANY_SHAPE 1.597930
#define RK_TITAN_ANY_SCALE_H 90006.7
#define RK_TITAN_ANY_EVENTS 5209
#define RK_TITAN_ANY_CENSORED 30976

#endif
