/*
 * The simulated GPU fleet beyond the telemetry table (rk_telemetry_sim in rekindle/health.h;
 * docs/sim.md): a pinned clock for tests and replays, ground truth that a supervisor or a
 * test may ask for (is GPU i computing wrong answers now? when was it drawn to fail?) and the
 * profile list. `state` is what rk_telemetry_sim.open returned. None of these functions
 * changes what later reads return.
 */
#ifndef RK_HEALTH_SIM_H
#define RK_HEALTH_SIM_H

#include <stdint.h>

#include "rekindle/health.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pin the fleet's clock at t_s simulated seconds after it started; from then on the monotonic
 * clock is ignored and time moves only by further calls. RK_EINVAL if t_s is not finite, or
 * earlier than a read already made or an earlier pin (time never goes back). */
int rk_sim_set_time(void *state, double t_s);
/* Simulated seconds since the fleet's clock started (at its first reading: a reading right
 * after open is at exactly the start age, however long the caller took): the pinned time,
 * or the monotonic clock's seconds since that first reading times opts.time_scale. */
double rk_sim_now(void *state);

/* 1 while GPU i computes wrong answers at the current simulated time (an episode of VRM
 * ripple, or failed memory on a card without ECC to report it), 0 when it does not or is
 * gone, RK_EINVAL for i out of range. The sample fields do not show it: only results do. */
int rk_sim_sdc_active(void *state, int i);

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
