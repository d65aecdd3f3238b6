/*
 * Inside librekindle: the one rate limit for log lines that a stranger can cause (a flood of
 * connections to a socket anyone may reach: the heartbeat socket, the node link's --listen,
 * an agent's abstract socket). The first `burst` lines of a window of `window_s` seconds are
 * shown, the rest only counted; the count is said once, when the window has ended ("N more
 * ... were not logged"). A window starts with the first line after the last one ended. Pure:
 * the caller passes the time (base/clock.h), so a test drives it with any clock.
 *
 *     if ((n = rk_hush_due(&h, now, W)))  say("%d more ... were not logged", n);   each turn
 *     if (rk_hush_pass(&h, now, B, W))    say(the line);                           each line
 */
#ifndef RK_BASE_HUSH_H
#define RK_BASE_HUSH_H

typedef struct rk_hush {
    double since; /* the current window's start */
    int open;     /* a window is under way */
    int shown;    /* lines shown in it */
    int held;     /* lines counted, not shown, in it */
} rk_hush;

/* 1 if a line at `now` is to be shown, 0 if it was counted instead. A line after a window
 * that ended with lines held starts the next window only once rk_hush_due took that count. */
int rk_hush_pass(rk_hush *h, double now, int burst, double window_s);

/* The lines held back in a window that has ended by `now`: the count to say now (the window
 * closed), or 0 when there is none (no window, it has not ended, nothing was held). */
int rk_hush_due(rk_hush *h, double now, double window_s);

/* Seconds from `now` until rk_hush_due has a count to say (0: already), -1 if it will have
 * none (nothing held): for a loop's poll timeout. */
double rk_hush_wait(const rk_hush *h, double now, double window_s);

#endif
