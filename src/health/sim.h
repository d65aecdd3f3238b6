/*
 * The simulated GPU fleet beyond the telemetry table (rk_telemetry_sim in rekindle/health.h;
 * docs/sim.md): a pinned clock for tests and replays, ground truth that a supervisor or a
 * test may ask for (is GPU i computing wrong answers now? when was it drawn to fail?) and the
 * profile list. A fleet is an opaque rk_sim: opened by rk_sim_open (a fleet of its own, as
 * the tests and the dataset builder use it), or the one behind an open "sim" telemetry
 * (rk_telemetry_sim_of). None of the ground-truth functions changes what later reads return.
 */
#ifndef RK_HEALTH_SIM_H
#define RK_HEALTH_SIM_H

#include <stdint.h>

#include "rekindle/health.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rk_sim rk_sim;

/* The simulator behind a telemetry opened with the "sim" backend; NULL for any other backend
 * (the telemetry keeps it: it goes with rk_telemetry_close). */
rk_sim *rk_telemetry_sim_of(rk_telemetry *t);

/* A fleet of its own, without the telemetry layer: rk_telemetry_sim's operations, typed. */
int rk_sim_open(rk_sim **out, const rk_telemetry_opts *o, rk_err *err);
int rk_sim_count(const rk_sim *s);
int rk_sim_info(rk_sim *s, int i, rk_gpu_info *out);
int rk_sim_read(rk_sim *s, int i, rk_gpu_sample *out, rk_err *err);
/* Flushes the event log up to the last reading; NULL is a no-op. */
void rk_sim_close(rk_sim *s);

/* Pin the fleet's clock at t_s simulated seconds after it started; from then on the monotonic
 * clock is ignored and time moves only by further calls. RK_EINVAL if t_s is not finite, or
 * earlier than a read already made or an earlier pin (time never goes back). */
int rk_sim_set_time(rk_sim *s, double t_s);
/* Simulated seconds since the fleet's clock started (at its first reading: a reading right
 * after open is at exactly the start age, however long the caller took): the pinned time,
 * or the monotonic clock's seconds since that first reading times opts.time_scale. */
double rk_sim_now(rk_sim *s);

/* 1 while GPU i computes wrong answers at the current simulated time (an episode of VRM
 * ripple, or failed memory on a card without ECC to report it), 0 when it does not or is
 * gone, RK_EINVAL for i out of range. The sample fields do not show it: only results do. */
int rk_sim_sdc_active(rk_sim *s, int i);

/* The terminal failure GPU `gpu` of a fleet opened with `seed` and `start_age_h` was drawn
 * with, had it been of `profile` (NULL: the profile that fleet draws for it): the simulated
 * hours from the fleet's open to the failure, and in *event (when not NULL) "off_bus" or
 * "dbe". Drawn from the Titan Weibull fit (titan_fit.h), accelerated by the GPU's wear and
 * conditioned on the GPU working when the fleet opens. NAN for an unknown profile. A GPU may
 * fail earlier of other causes (thermal shutdown: docs/sim.md). */
double rk_sim_lifetime_hours(uint64_t seed, int gpu, const char *profile, double start_age_h,
                             const char **event);

/* The warning signs before that terminal failure (docs/sim.md, "Warning signs"): the minutes
 * before the failure at which they begin (drawn uniformly in 40..150), or 0 when the failure
 * was drawn to come silently. Same arguments as rk_sim_lifetime_hours; NAN for an unknown
 * profile. The fan's seizure (and the thermal shutdown that follows) has warning signs of its
 * own, drawn the same way; the event log names both ("precursor"). */
double rk_sim_precursor_minutes(uint64_t seed, int gpu, const char *profile, double start_age_h);

/* The profiles ("1070ti-mining", ...), 0 <= k < rk_sim_profile_count(); NULL out of range. */
int rk_sim_profile_count(void);
const char *rk_sim_profile_name(int k);

#ifdef __cplusplus
}
#endif
#endif
