/* The launch trace (base/phase.h): one line a phase appended to RK_TRACE_LAUNCH's file with
 * one write(2). Formats by hand (no stdio, no locale) so that a child between fork and exec
 * may call it; relies on base/env.h for the privileged-process rule. */
#include "base/phase.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"

#define LINE_MAX_BYTES 160
#define PHASE_MAX 64

/* 0: not looked at yet; -1: off; else the descriptor + 1 (inherited over fork, closed by exec) */
static int trace_fd;

static int trace_open(void)
{
    if (trace_fd == 0) {
        const char *path = rk_env_override(RK_PHASE_ENV);
        int fd = path && path[0] == '/'
                     ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600)
                     : -1;
        trace_fd = fd >= 0 ? fd + 1 : -1;
    }
    return trace_fd > 0 ? trace_fd - 1 : -1;
}

/* Decimal digits of v (>= 0) at buf + n, at least `width` of them; the new length. */
static size_t put_uint(char *buf, size_t n, unsigned long long v, int width)
{
    char tmp[24];
    int k = 0;
    do {
        tmp[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && k < (int)sizeof tmp);
    while (k < width && k < (int)sizeof tmp)
        tmp[k++] = '0';
    while (k > 0)
        buf[n++] = tmp[--k];
    return n;
}

static size_t put_int(char *buf, size_t n, long long v)
{
    if (v < 0) {
        buf[n++] = '-';
        return put_uint(buf, n, (unsigned long long)(-(v + 1)) + 1, 1);
    }
    return put_uint(buf, n, (unsigned long long)v, 1);
}

void rk_phase_mark(const char *phase, int launch, int rank)
{
    int saved = errno; /* a caller between a failed call and its message keeps its errno */
    int fd = trace_open();
    if (fd < 0 || !phase) {
        errno = saved;
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char line[LINE_MAX_BYTES];
    size_t n = 0;
    for (const char *p = phase; *p && n < PHASE_MAX; p++) /* one word: no blank, no newline */
        line[n++] = (*p == ' ' || *p == '\t' || *p == '\n') ? '_' : *p;
    line[n++] = ' ';
    n = put_uint(line, n, (unsigned long long)ts.tv_sec, 1);
    line[n++] = '.';
    n = put_uint(line, n, (unsigned long long)ts.tv_nsec, 9);
    line[n++] = ' ';
    n = put_int(line, n, (long long)getpid());
    line[n++] = ' ';
    n = put_int(line, n, launch);
    line[n++] = ' ';
    n = put_int(line, n, rank);
    line[n++] = '\n';
    ssize_t w;
    do
        w = write(fd, line, n);
    while (w < 0 && errno == EINTR);
    errno = saved;
}

/* A non-negative decimal number from the environment, -1 if unset or not one. */
static int env_int(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return -1;
    long x = 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9' || x > 100000000)
            return -1;
        x = x * 10 + (*p - '0');
    }
    return (int)x;
}

void rk_phase_mark_env(const char *phase)
{
    int saved = errno;
    int off = trace_open() < 0;
    errno = saved;
    if (off)
        return;
    rk_phase_mark(phase, env_int("RK_LAUNCH"), env_int("RANK"));
}
