/*
 * libFuzzer target for a multi-host job's hosts (cluster/hosts.h): the input goes, as a
 * NUL-terminated copy, to the host list parser (spare or not by its first byte), then whole
 * to the hostfile text parser appending to the same table, then the table goes to placement
 * with a few rank counts and an exclusion mask made of the input. A refusal must carry a
 * one-line printable-ASCII message and leave the table as it was; an accepted table must meet
 * every documented bound (names, slots, no host twice); a placement must fill the hosts in
 * order, spares last, never an excluded host, never past a host's slots.
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cluster/hosts.h"

static rk_hosts g_hs;
static rk_host g_snap[RK_HOSTS_MAX];

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void check_line(const rk_err *err)
{
    check(err->msg[0] != 0);
    for (const char *p = err->msg; *p; p++)
        check((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
}

static void check_name(const char *s)
{
    size_t len = strlen(s);
    check(len >= 1 && len <= RK_HOST_NAME_MAX - 1);
    if (strchr(s, ':')) {
        unsigned char a[16];
        check(inet_pton(AF_INET6, s, a) == 1);
        return;
    }
    check(s[0] != '-');
    for (size_t i = 0; i < len; i++)
        check((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '-' || s[i] == '_');
}

static void check_table(void)
{
    check(g_hs.n >= 0 && g_hs.n <= RK_HOSTS_MAX);
    for (int i = 0; i < g_hs.n; i++) {
        check_name(g_hs.h[i].name);
        check(g_hs.h[i].slots >= 1 && g_hs.h[i].slots <= RK_HOST_SLOTS_MAX);
        check(g_hs.h[i].spare == 0 || g_hs.h[i].spare == 1);
        for (int j = 0; j < i; j++)
            check(strcasecmp(g_hs.h[i].name, g_hs.h[j].name) != 0);
    }
}

/* After a call that returned rc: on a refusal the table is what it was (n0 hosts, the same
 * ones, nothing left in the next `touched` entries). */
static void check_call(int rc, int code, const rk_err *err, int n0, size_t touched)
{
    if (rc == RK_OK) {
        check(g_hs.n > n0); /* a list or a hostfile adds at least one host */
        check_table();
        return;
    }
    check(rc == code);
    check_line(err);
    check(g_hs.n == n0);
    check(memcmp(g_hs.h, g_snap, (size_t)n0 * sizeof g_snap[0]) == 0);
    static const rk_host zero;
    for (size_t i = (size_t)n0; i < (size_t)n0 + touched && i < RK_HOSTS_MAX; i++)
        check(memcmp(&g_hs.h[i], &zero, sizeof zero) == 0);
}

static void place(int nranks, const unsigned char *ex)
{
    static int host_of[RK_HOSTS_MAX * RK_HOST_SLOTS_MAX],
        local_of[RK_HOSTS_MAX * RK_HOST_SLOTS_MAX];
    if (nranks < 1 || nranks > RK_HOSTS_MAX * RK_HOST_SLOTS_MAX)
        return;
    rk_err err = {0};
    int have = rk_hosts_slots(&g_hs, ex, 1);
    int used = rk_hosts_place(&g_hs, ex, nranks, host_of, local_of, &err);
    if (nranks > have) {
        check(used == RK_EINVAL);
        check_line(&err);
        return;
    }
    check(used >= 1 && used <= g_hs.n);
    int hosts = 1;
    for (int r = 0; r < nranks; r++) {
        int h = host_of[r];
        check(h >= 0 && h < g_hs.n && !ex[h]);
        check(local_of[r] >= 0 && local_of[r] < g_hs.h[h].slots);
        if (r == 0) {
            check(local_of[r] == 0);
            continue;
        }
        int p = host_of[r - 1];
        if (h == p) {
            check(local_of[r] == local_of[r - 1] + 1);
            continue;
        }
        /* A new host: the previous one full, and the next usable host in fill order. */
        hosts++;
        check(local_of[r] == 0 && local_of[r - 1] == g_hs.h[p].slots - 1);
        check(g_hs.h[h].spare >= g_hs.h[p].spare);
        if (g_hs.h[h].spare == g_hs.h[p].spare)
            check(h > p);
        for (int i = 0; i < g_hs.n; i++) {
            if (ex[i] || i == p || i == h)
                continue;
            int between = g_hs.h[h].spare == g_hs.h[p].spare
                              ? g_hs.h[i].spare == g_hs.h[h].spare && i > p && i < h
                              : (g_hs.h[i].spare == g_hs.h[p].spare && i > p) ||
                                    (g_hs.h[i].spare == g_hs.h[h].spare && i < h);
            check(!between);
        }
    }
    check(hosts == used);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_err err = {0};
    size_t seps = 1;
    for (size_t i = 0; i < size; i++)
        seps += data[i] == ',' || data[i] == '\n';

    char *list = malloc(size + 1);
    if (!list)
        return 0;
    memcpy(list, data, size);
    list[size] = 0;
    int spare = size > 0 && (data[0] & 1);
    int n0 = g_hs.n;
    memcpy(g_snap, g_hs.h, (size_t)n0 * sizeof g_snap[0]);
    check_call(rk_hosts_parse_list(&g_hs, list, spare, &err), RK_EINVAL, &err, n0, seps);
    free(list);

    n0 = g_hs.n;
    memcpy(g_snap, g_hs.h, (size_t)n0 * sizeof g_snap[0]);
    int rc = rk_hosts_parse_text(&g_hs, (const char *)data, size, "hostfile fuzz", &err);
    check_call(rc, RK_EFORMAT, &err, n0, seps);

    static unsigned char ex[RK_HOSTS_MAX];
    for (int i = 0; i < g_hs.n; i++)
        ex[i] = size > 0 && (data[(size_t)i % size] & 0x10) != 0;
    check(rk_hosts_slots(&g_hs, ex, 0) <= rk_hosts_slots(&g_hs, ex, 1));
    check(rk_hosts_slots(&g_hs, ex, 1) <= rk_hosts_slots(&g_hs, NULL, 1));
    int total = rk_hosts_slots(&g_hs, ex, 1);
    const int counts[] = {1, 6, total / 2, total, total + 1};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        place(counts[i], ex);
    memset(ex, 0, sizeof ex);
    place(rk_hosts_slots(&g_hs, NULL, 1), ex);

    char buf[4096];
    for (size_t cap = 1; cap <= sizeof buf; cap *= 8) {
        rk_hosts_describe(&g_hs, buf, cap);
        check(strlen(buf) < cap);
    }

    memset(g_hs.h, 0, (size_t)g_hs.n * sizeof g_hs.h[0]);
    g_hs.n = 0;
    return 0;
}
