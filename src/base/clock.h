/*
 * The one monotonic clock of rekindle's code (CLOCK_MONOTONIC, in seconds). Durations,
 * deadlines and rates are measured with it; wall-clock time (CLOCK_REALTIME) only ever
 * labels things for people (timestamps in logs and file names).
 */
#ifndef RK_BASE_CLOCK_H
#define RK_BASE_CLOCK_H

#include <time.h>

static inline double rk_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
