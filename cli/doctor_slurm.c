/*
 * rk doctor's Slurm modes (doctor.h, docs/slurm.md): --slurm, the HealthCheckProgram that
 * drains this node when a GPU fails and resumes it when every GPU passes again, but only a
 * drain of its own (its reasons start with RK_SLURM_REASON_MARK; an administrator's drain is
 * left alone); and --gres, a gres.conf for the GPUs that pass. scontrol is run with an argv,
 * never a shell; what it prints is read bounded, with a time limit.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/slurm.h"
#include "doctor.h"
#include "rk.h"

#define REASON_MAX 256 /* what a drain reason may take of Slurm's log lines */

/* ---- the drain reason ------------------------------------------------------------------- */

/* NVML's bus ids have an 8-digit domain: "00000000:03:00.0" reads as lspci's 0000:03:00.0. */
static const char *short_bus(const char *bus)
{
    return strlen(bus) == 16 && strncmp(bus, "0000", 4) == 0 && bus[8] == ':' ? bus + 4 : bus;
}

/* Why the GPUs a drain reason of ours names are not known to be healed, into out (1), else 0:
 * one is not among g[0..n) (a card that fell off the bus is not healed), or the finding it
 * was drained for came from a sensor NVML cannot read and that sensor's reading is not there
 * now (its file gone, or cut: no reading is not a good one). */
int rk_doctor_not_healed(const char *reason, const rk_doctor_gpu *g, int n, char *out, size_t cap)
{
    for (const char *p = reason; (p = strstr(p, "(bus "));) {
        p += 5;
        size_t l = strcspn(p, ")");
        const rk_doctor_gpu *seen = NULL;
        for (int i = 0; i < n && !seen; i++) {
            const char *b = short_bus(g[i].bus_id);
            if (strlen(b) == l && strncmp(b, p, l) == 0)
                seen = &g[i];
        }
        if (!seen) {
            snprintf(out, cap, "the GPU at bus %.*s it was drained for is not seen", (int)l, p);
            return 1;
        }
        p += l;
        /* ") score 35 vrm_ripple: ..." : the finding's code */
        const char *c = strstr(p, " score ");
        size_t seg = strcspn(p, ";");
        if (c && (size_t)(c - p) < seg) {
            c += 7;
            c += strspn(c, "0123456789");
            int vrm = !strncmp(c, " vrm_ripple:", 12), fan = !strncmp(c, " fan_bearing:", 13);
            if ((vrm && !seen->vrm_read) || (fan && !seen->fan_vib_read)) {
                snprintf(out, cap,
                         "GPU %d was drained for its %s, and that sensor's reading is not there "
                         "now (no file, or one it could not read): not known to be healed",
                         seen->index, vrm ? "VRM ripple" : "fan vibration");
                return 1;
            }
        }
    }
    return 0;
}

/* One failing GPU's part of a reason: "GPU 2 (bus 0000:03:00.0) score 41: why". */
static void gpu_reason(const rk_doctor_gpu *g, char *out, size_t cap)
{
    char score[16] = "unreadable";
    if (g->has_score)
        snprintf(score, sizeof score, "score %d", g->score);
    const char *bus = short_bus(g->bus_id);
    snprintf(out, cap, "GPU %d%s%s%s %s%s%s%s%s", g->index, bus[0] ? " (bus " : "", bus,
             bus[0] ? ")" : "", score, g->code[0] ? " " : "", g->code, g->why[0] ? ": " : "",
             g->why);
}

int rk_doctor_slurm_reason(const rk_doctor_gpu *g, int n, char *out, size_t cap)
{
    if (cap == 0)
        return 0;
    out[0] = '\0';
    int failing = 0, shown = 0;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (g[i].pass)
            continue;
        char one[REASON_MAX];
        gpu_reason(&g[i], one, sizeof one);
        const char *lead = failing ? "; " : RK_SLURM_REASON_MARK;
        failing++;
        size_t l = strlen(lead) + strlen(one);
        if (len + l >= cap - 16 && shown > 0) /* room kept for "; and N more" */
            continue;
        len += (size_t)snprintf(out + len, cap - len, "%s%s", lead, one);
        if (len >= cap)
            len = cap - 1;
        shown++;
    }
    if (failing > shown && len + 16 < cap)
        snprintf(out + len, cap - len, "; and %d more", failing - shown);
    return failing;
}

/* ---- scontrol ------------------------------------------------------------------------------ */

/* scontrol ARGS...: its status, what it printed in out. */
static int scontrol(const rk_doctor_slurm_opts *o, char *out, size_t cap, const char *a1,
                    const char *a2, const char *a3, const char *a4)
{
    char *argv[] = {(char *)o->scontrol, (char *)a1, (char *)a2, (char *)a3, (char *)a4, NULL};
    return rk_slurm_run(argv, out, cap, RK_SLURM_WAIT_S);
}

/* Change the node (drain with a reason, or resume), or in a dry run say what it would run. */
static int update(const rk_doctor_slurm_opts *o, const char *state, const char *reason)
{
    char nodearg[192], statearg[64], reasonarg[REASON_MAX + 16];
    snprintf(nodearg, sizeof nodearg, "nodename=%s", o->node);
    snprintf(statearg, sizeof statearg, "state=%s", state);
    snprintf(reasonarg, sizeof reasonarg, "reason=%s", reason ? reason : "");
    if (o->dry_run) {
        printf("rk doctor: dry run: would run: %s update %s %s%s%s%s\n", o->scontrol, nodearg,
               statearg, reason ? " \"" : "", reason ? reasonarg : "", reason ? "\"" : "");
        return 0;
    }
    char *out = malloc(RK_SLURM_OUT_MAX);
    if (!out)
        return -1;
    int rc =
        scontrol(o, out, RK_SLURM_OUT_MAX, "update", nodearg, statearg, reason ? reasonarg : NULL);
    if (rc != 0) {
        char line[256];
        fprintf(stderr, "rk doctor: %s update %s %s failed (%s%d): %s\n", o->scontrol, nodearg,
                statearg, rc < 0 ? "timed out " : "exit ", rc < 0 ? (int)RK_SLURM_WAIT_S : rc,
                rk_slurm_first_line(out, line, sizeof line));
    }
    free(out);
    return rc == 0 ? 0 : -1;
}

/* 1 if a drain reason is one rk doctor --slurm wrote. */
static bool is_ours(const char *reason)
{
    size_t m = sizeof RK_SLURM_REASON_MARK - 1;
    return strlen(reason) >= m && memcmp(reason, RK_SLURM_REASON_MARK, m) == 0;
}

int rk_doctor_slurm(const rk_doctor_gpu *g, int n, const rk_doctor_slurm_opts *o)
{
    char reason[REASON_MAX];
    int failing = rk_doctor_slurm_reason(g, n, reason, sizeof reason);
    char *out = malloc(RK_SLURM_OUT_MAX);
    if (!out) {
        fprintf(stderr, "rk doctor: out of memory\n");
        return RK_EXIT_FAIL;
    }
    int rc = scontrol(o, out, RK_SLURM_OUT_MAX, "show", "node", o->node, NULL);
    bool drained = false, down = false;
    char now[REASON_MAX * 2];
    if (rc != 0 || rk_slurm_parse_node(out, &drained, &down, now, sizeof now, NULL, 0) != 0) {
        char line[256];
        if (rc < 0)
            fprintf(stderr,
                    "rk doctor: cannot read node %s's state: %s show node %s: no answer "
                    "within %.0f s\n",
                    o->node, o->scontrol, o->node, RK_SLURM_WAIT_S);
        else
            fprintf(stderr, "rk doctor: cannot read node %s's state: %s show node %s: %s%d: %s\n",
                    o->node, o->scontrol, o->node,
                    rc ? "exit " : "no NodeName= and State= in what it printed, exit ", rc,
                    rk_slurm_first_line(out, line, sizeof line));
        free(out);
        if (!o->dry_run) /* the GPUs' verdict stands; the node is left as it is */
            return RK_EXIT_FAIL;
        printf("rk doctor: dry run: node %s's state unknown: taken as not drained\n", o->node);
        drained = down = false;
        now[0] = '\0';
    } else {
        free(out);
    }
    bool ours = is_ours(now);
    /* someone else's: down or held (FAIL, MAINT, ...), or drained, or any reason not ours */
    bool others = down || ((drained || now[0]) && !ours);
    int status = failing ? RK_EXIT_FAIL : RK_EXIT_OK;
    char gone[256];
    if (failing) {
        if (others) {
            printf("rk doctor: node %s: %d GPU%s fail%s; it is already %s by someone else "
                   "(reason \"%s\"): left as it is\n",
                   o->node, failing, failing == 1 ? "" : "s", failing == 1 ? "s" : "",
                   down ? "down or held" : "drained", now);
        } else if (drained && strcmp(now, reason) == 0) {
            printf("rk doctor: node %s: stays drained: %s\n", o->node, reason);
        } else {
            /* not drained, or drained by rk with another reason: drain (again) with this one */
            if (update(o, "drain", reason) != 0)
                return RK_EXIT_FAIL;
            if (!o->dry_run)
                printf("rk doctor: node %s: drained: %s\n", o->node, reason);
        }
    } else if (drained && !others && o->unsure) {
        status = RK_EXIT_FAIL;
        printf("rk doctor: node %s: stays drained: a reading went wrong (%s): not known to be "
               "healed (%s)\n",
               o->node, o->unsure, now);
    } else if (drained && !others && rk_doctor_not_healed(now, g, n, gone, sizeof gone)) {
        status = RK_EXIT_FAIL;
        printf("rk doctor: node %s: stays drained: %s (%s); if that was meant (the card taken "
               "out): scontrol update nodename=%s state=resume\n",
               o->node, gone, now, o->node);
    } else if (drained && !others) {
        if (update(o, "resume", NULL) != 0)
            return RK_EXIT_FAIL;
        if (!o->dry_run)
            printf("rk doctor: node %s: resumed: every GPU passes again (it was drained: %s)\n",
                   o->node, now);
    } else if (others) {
        printf("rk doctor: node %s: every GPU passes; it is %s by someone else (reason \"%s\"): "
               "left as it is\n",
               o->node, down ? "down or held" : "drained", now);
    } else {
        printf("rk doctor: node %s: every GPU passes\n", o->node);
    }
    return status;
}

/* ---- gres.conf ---------------------------------------------------------------------------- */

void rk_doctor_gres_type(const char *name, char *out, size_t cap)
{
    static const char *const drop[] = {"nvidia ", "geforce ", "tesla ", "quadro "};
    char low[128];
    size_t l = 0;
    for (const char *p = name; *p && l + 1 < sizeof low; p++)
        low[l++] = (char)tolower((unsigned char)*p);
    low[l] = '\0';
    const char *p = low;
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
            if (strncmp(p, drop[i], strlen(drop[i])) == 0) {
                p += strlen(drop[i]);
                again = 1;
            }
    }
    size_t k = 0;
    int sep = 0;
    for (; *p && k + 1 < cap; p++) {
        if (isalnum((unsigned char)*p)) {
            if (sep && k > 0 && k + 2 < cap)
                out[k++] = '_';
            out[k++] = *p;
            sep = 0;
        } else {
            sep = 1;
        }
    }
    if (k == 0 && cap > 4)
        k = (size_t)snprintf(out, cap, "gpu");
    out[k < cap ? k : cap - 1] = '\0';
}

/* The GPU's device node: /dev/nvidia<minor>, the minor as the driver's own
 * /proc/driver/nvidia/gpus/<bus>/information says it; else the index, marked as assumed. */
static int device_minor(const rk_doctor_gpu *g, int *assumed)
{
    *assumed = 1;
    if (!g->bus_id[0] || g->simulated)
        return g->index;
    char path[128], bus[32];
    /* the driver names the directory with a 4-digit domain, lower case: 0000:03:00.0 */
    const char *b = g->bus_id;
    if (strlen(b) == 16 && strncmp(b, "0000", 4) == 0)
        b += 4;
    size_t i = 0;
    for (; b[i] && i + 1 < sizeof bus; i++)
        bus[i] = (char)tolower((unsigned char)b[i]);
    bus[i] = '\0';
    snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%s/information", bus);
    FILE *f = fopen(path, "re");
    if (!f)
        return g->index;
    char line[256];
    int minor = g->index;
    for (int k = 0; k < 64 && fgets(line, sizeof line, f); k++) /* the driver's: ~15 lines */
        if (sscanf(line, "Device Minor: %d", &minor) == 1 && minor >= 0 && minor < 256) {
            *assumed = 0;
            break;
        }
    fclose(f);
    return *assumed ? g->index : minor;
}

int rk_doctor_gres(const rk_doctor_gpu *g, int n, double threshold, const char *node)
{
    int pass = 0, sim = 0;
    for (int i = 0; i < n; i++) {
        pass += g[i].pass;
        sim += g[i].simulated;
    }
    printf("# gres.conf for this node's GPUs, written by rk doctor --gres%s\n",
           sim ? " (SIMULATED GPUs: for tests only)" : "");
    printf("# %d of %d GPUs pass (threshold %.0f)%s\n", pass, n, threshold,
           pass < n ? "; left out:" : "");
    for (int i = 0; i < n; i++) {
        if (!g[i].pass) {
            char one[REASON_MAX];
            gpu_reason(&g[i], one, sizeof one);
            printf("#   %s\n", one);
        }
    }
    /* types in order, with their counts, for slurm.conf's Gres= */
    char types[64][64];
    int counts[64], nt = 0, any_assumed = 0;
    for (int i = 0; i < n; i++) {
        if (!g[i].pass)
            continue;
        char t[64];
        rk_doctor_gres_type(g[i].name, t, sizeof t);
        int k = 0;
        while (k < nt && strcmp(types[k], t) != 0)
            k++;
        if (k == nt && nt < 64) {
            snprintf(types[nt], sizeof types[nt], "%s", t);
            counts[nt++] = 0;
        }
        if (k < nt)
            counts[k]++;
    }
    if (nt) {
        printf("# slurm.conf: NodeName=%s Gres=", node ? node : "<this node>");
        for (int k = 0; k < nt; k++)
            printf("%sgpu:%s:%d", k ? "," : "", types[k], counts[k]);
        printf("\n");
    }
    for (int i = 0; i < n; i++) {
        if (!g[i].pass)
            continue;
        char t[64];
        int assumed;
        rk_doctor_gres_type(g[i].name, t, sizeof t);
        int minor = device_minor(&g[i], &assumed);
        any_assumed |= assumed;
        printf("%s%s%sName=gpu Type=%s File=/dev/nvidia%d\n", node ? "NodeName=" : "",
               node ? node : "", node ? " " : "", t, minor);
    }
    if (any_assumed)
        printf("# File=: the device minor numbers are assumed equal to the GPU indices%s\n",
               sim ? " (simulated GPUs have no device node)" : " (no /proc/driver/nvidia here)");
    return pass ? RK_EXIT_OK : RK_EXIT_FAIL;
}
