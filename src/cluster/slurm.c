/*
 * Slurm from rekindle (slurm.h): scontrol run with an argv and a time limit, and the
 * readers of what it prints.
 */
#define _GNU_SOURCE /* pipe2 */
#include "cluster/slurm.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/proc.h"

int rk_slurm_run(char *const argv[], char *out, size_t cap, double wait_s)
{
    return rk_proc_run(argv, out, cap, wait_s, 0);
}

int rk_slurm_node_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= RK_SLURM_NODE_MAX || s[0] == '-')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '.' || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

/* The value of KEY= at a word's start in text, up to the next space (or the line's end when
 * to_eol): 0, or -1 when absent. */
static int field(const char *text, const char *key, int to_eol, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *p = text; (p = strstr(p, key)); p++) {
        if (p != text && !isspace((unsigned char)p[-1]))
            continue;
        p += kl;
        size_t l = to_eol ? strcspn(p, "\n") : strcspn(p, " \t\n");
        if (l >= cap)
            l = cap - 1;
        memcpy(out, p, l);
        out[l] = '\0';
        return 0;
    }
    return -1;
}

int rk_slurm_parse_node(const char *text, bool *drained, bool *down, char *reason,
                        size_t reason_cap, char *addr, size_t addr_cap)
{
    char state[128], name[128];
    *drained = *down = false;
    if (reason && reason_cap)
        reason[0] = '\0';
    if (addr && addr_cap)
        addr[0] = '\0';
    if (field(text, "NodeName=", 0, name, sizeof name) || !name[0] ||
        field(text, "State=", 0, state, sizeof state))
        return -1;
    /* State=IDLE+DRAIN, MIXED+DRAIN, DOWN*+DRAIN, DOWN: the base state and its flags */
    for (char *s = state; *s; s++)
        *s = (char)toupper((unsigned char)*s);
    *drained = strstr(state, "DRAIN") != NULL;
    /* down, failed, in maintenance, to be rebooted or powered: a hold of someone's (an
     * administrator's, Slurm's own) that rekindle leaves alone */
    static const char *const holds[] = {"FAIL", "MAINT", "REBOOT", "POWER", "RESERVED"};
    *down = strncmp(state, "DOWN", 4) == 0;
    for (size_t i = 0; i < sizeof holds / sizeof holds[0]; i++)
        *down = *down || strstr(state, holds[i]) != NULL;
    if (addr && addr_cap && field(text, "NodeAddr=", 0, addr, addr_cap) != 0)
        addr[0] = '\0';
    if (reason && reason_cap && field(text, "Reason=", 1, reason, reason_cap) == 0) {
        /* "text [root@2026-12-02T05:00:00]" (and a oneliner's fields after it): the text */
        char *b = NULL;
        for (char *p = reason; (p = strstr(p, " [")); p++)
            if (strchr(p, '@') && strchr(p, ']'))
                b = p;
        if (b)
            *b = '\0';
        if (strcmp(reason, "(null)") == 0)
            reason[0] = '\0';
    }
    return 0;
}

int rk_slurm_parse_hostnames(const char *text, char names[][RK_SLURM_NODE_MAX], int max,
                             rk_err *err)
{
    int n = 0;
    for (const char *p = text; *p;) {
        size_t l = strcspn(p, "\n");
        char line[RK_SLURM_NODE_MAX + 1];
        size_t k = l < sizeof line - 1 ? l : sizeof line - 1;
        memcpy(line, p, k);
        line[k] = '\0';
        while (k > 0 && isspace((unsigned char)line[k - 1]))
            line[--k] = '\0';
        if (k > 0) {
            if (l >= sizeof line - 1 || !rk_slurm_node_name_ok(line)) {
                rk_err_set(err, RK_EFORMAT,
                           "scontrol show hostnames: line %d is not a node name (1 to 63 of "
                           "A-Z a-z 0-9 . _ -)",
                           n + 1);
                return -1;
            }
            if (n >= max) {
                rk_err_set(err, RK_EFORMAT, "scontrol show hostnames: more than %d nodes", max);
                return -1;
            }
            memcpy(names[n++], line, k + 1);
        }
        p += l;
        if (*p == '\n')
            p++;
    }
    return n;
}

const char *rk_slurm_first_line(const char *text, char *out, size_t cap)
{
    if (cap == 0)
        return "no message";
    size_t l = strcspn(text, "\n");
    while (l > 0 && isspace((unsigned char)text[l - 1]))
        l--;
    if (l >= cap)
        l = cap - 1;
    memcpy(out, text, l);
    out[l] = '\0';
    return l ? out : "no message";
}

/* scontrol A1 A2 A3 A4 into a fresh buffer (*out, freed by the caller): its status, or -2
 * out of memory. */
static int scontrol(const char *exe, char **out, const char *a1, const char *a2, const char *a3,
                    const char *a4)
{
    char *argv[] = {(char *)exe, (char *)a1, (char *)a2, (char *)a3, (char *)a4, NULL};
    *out = malloc(RK_SLURM_OUT_MAX);
    if (!*out)
        return -2;
    return rk_slurm_run(argv, *out, RK_SLURM_OUT_MAX, RK_SLURM_WAIT_S);
}

static int failed(rk_err *err, int rc, const char *exe, const char *what, const char *out)
{
    char line[256];
    if (rc == -2)
        rk_err_set(err, RK_ENOMEM, "out of memory");
    else if (rc < 0)
        rk_err_set(err, RK_EIO, "%s %s: no answer within %.0f s", exe, what, RK_SLURM_WAIT_S);
    else if (rc == RK_SLURM_TOO_LONG)
        rk_err_set(err, RK_EIO, "%s %s: printed more than %d bytes", exe, what, RK_SLURM_OUT_MAX);
    else
        rk_err_set(err, RK_EIO, "%s %s: exit %d: %s", exe, what, rc,
                   rk_slurm_first_line(out ? out : "", line, sizeof line));
    return -1;
}

int rk_slurm_job_nodes(const char *scontrol_exe, char names[][RK_SLURM_NODE_MAX], int max,
                       rk_err *err)
{
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (!list || !list[0])
        list = getenv("SLURM_NODELIST");
    if (!list || !list[0]) {
        rk_err_set(err, RK_EINVAL,
                   "not inside a Slurm allocation: SLURM_JOB_NODELIST is not set "
                   "(run it in sbatch or salloc)");
        return -1;
    }
    char *out = NULL;
    int rc = scontrol(scontrol_exe, &out, "show", "hostnames", list, NULL);
    int n = rc == 0 ? rk_slurm_parse_hostnames(out, names, max, err)
                    : failed(err, rc, scontrol_exe, "show hostnames", out);
    if (n == 0)
        n = (rk_err_set(err, RK_EFORMAT, "scontrol show hostnames %s: no node", list), -1);
    free(out);
    return n;
}

int rk_slurm_node_addr(const char *scontrol_exe, const char *node, char *addr, size_t cap,
                       rk_err *err)
{
    char *out = NULL;
    int rc = scontrol(scontrol_exe, &out, "show", "node", node, NULL);
    bool drained, down;
    if (rc != 0) {
        failed(err, rc, scontrol_exe, "show node", out);
    } else if (rk_slurm_parse_node(out, &drained, &down, NULL, 0, addr, cap) != 0 || !addr[0]) {
        rk_err_set(err, RK_EFORMAT,
                   "scontrol show node %s: no NodeName=, State= or NodeAddr=", node);
        rc = -1;
    }
    free(out);
    return rc == 0 ? 0 : -1;
}

int rk_slurm_node_held(const char *scontrol_exe, const char *node, char *what, size_t cap,
                       rk_err *err)
{
    char *out = NULL;
    int rc = scontrol(scontrol_exe, &out, "show", "node", node, NULL);
    bool drained = false, down = false;
    char reason[256];
    int held = -1;
    if (rc != 0)
        failed(err, rc, scontrol_exe, "show node", out);
    else if (rk_slurm_parse_node(out, &drained, &down, reason, sizeof reason, NULL, 0) != 0)
        rk_err_set(err, RK_EFORMAT, "scontrol show node %s: no NodeName= or State=", node);
    else
        held = drained || down;
    if (held == 1)
        snprintf(what, cap, "%s: %s", down ? "down or held" : "drained",
                 reason[0] ? reason : "no reason");
    free(out);
    return held;
}

int rk_slurm_drain(const char *scontrol_exe, const char *node, const char *reason, rk_err *err)
{
    char nodearg[RK_SLURM_NODE_MAX + 16], reasonarg[512];
    snprintf(nodearg, sizeof nodearg, "nodename=%s", node);
    snprintf(reasonarg, sizeof reasonarg, "reason=%s", reason);
    char *out = NULL;
    int rc = scontrol(scontrol_exe, &out, "update", nodearg, "state=drain", reasonarg);
    if (rc != 0)
        failed(err, rc, scontrol_exe, "update state=drain", out);
    free(out);
    return rc == 0 ? 0 : -1;
}
