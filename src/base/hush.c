/*
 * The rate limit for log lines a stranger can cause (base/hush.h): a few a window, then a
 * count. Pure arithmetic on the times the caller passes.
 */
#include "base/hush.h"

int rk_hush_pass(rk_hush *h, double now, int burst, double window_s)
{
    if (h->open && now - h->since >= window_s && h->held == 0)
        h->open = 0; /* a quiet window ended: nothing to say for it */
    if (!h->open) {
        h->open = 1;
        h->since = now;
        h->shown = h->held = 0;
    }
    if (h->shown < burst && now - h->since < window_s) {
        h->shown++;
        return 1;
    }
    h->held++; /* also a line after the window, before its count was said: said with it */
    return 0;
}

int rk_hush_due(rk_hush *h, double now, double window_s)
{
    if (!h->open || now - h->since < window_s)
        return 0;
    int n = h->held;
    h->open = 0;
    h->shown = h->held = 0;
    return n;
}

double rk_hush_wait(const rk_hush *h, double now, double window_s)
{
    if (!h->open || h->held == 0)
        return -1;
    double left = h->since + window_s - now;
    return left > 0 ? left : 0;
}
