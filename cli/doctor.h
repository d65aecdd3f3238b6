/* rk doctor's verdict on one GPU, as its Slurm modes (doctor_slurm.c) read it: the health
 * check that drains and resumes this node, and the gres.conf it prints. */
#ifndef RK_CLI_DOCTOR_H
#define RK_CLI_DOCTOR_H

#include <stdbool.h>
#include <stddef.h>

typedef struct rk_doctor_gpu {
    int index;
    char name[96];   /* "NVIDIA GeForce GTX 1070 Ti", "" unknown */
    char bus_id[32]; /* "00000000:03:00.0", "" unknown */
    bool simulated;
    bool has_score; /* false: no reading succeeded */
    int score;
    bool pass;     /* scored, and at or above the threshold */
    char why[160]; /* the worst finding's message ("" none), or why it is unreadable */
    char code[32]; /* the worst finding's code ("vrm_ripple"; "" none) */
    bool vrm_read; /* the sensors NVML cannot read were there (textfile: docs/textfile.md) */
    bool fan_vib_read;
} rk_doctor_gpu;

typedef struct rk_doctor_slurm_opts {
    const char *node;     /* the node's Slurm name (--node, else $SLURMD_NODENAME) */
    const char *scontrol; /* the scontrol to run (PATH lookup when it has no '/') */
    bool dry_run;         /* say what it would run, change nothing */
    const char *unsure;   /* a reading went wrong (a sensor file it could not parse): why; the
                           * node is then not resumed */
} rk_doctor_slurm_opts;

/* The reason rk doctor --slurm drains a node with, and the mark by which it knows a drain is
 * its own: every reason it writes starts with it. */
#define RK_SLURM_REASON_MARK "rk: "

/* Write the drain reason for the failing GPUs of g[0..n) into out (at most cap bytes, cut at
 * a GPU's boundary where it can be); 0 when none fails. */
int rk_doctor_slurm_reason(const rk_doctor_gpu *g, int n, char *out, size_t cap);

/* The Slurm health check: drain this node when a GPU fails, resume it when every GPU passes
 * and the drain is its own. Prints one line a decision. Returns the exit status: 0 every GPU
 * passes, 1 one fails (or the node's state could not be read or changed), 2 bad usage. */
int rk_doctor_slurm(const rk_doctor_gpu *g, int n, const rk_doctor_slurm_opts *o);

/* Why the GPUs a drain reason of ours names are not known to be healed, into out (1), else
 * 0: one is not among g[0..n), or it was drained for a sensor NVML cannot read (vrm_ripple,
 * fan_bearing) whose reading is not there now. */
int rk_doctor_not_healed(const char *reason, const rk_doctor_gpu *g, int n, char *out, size_t cap);

/* Print a gres.conf for the GPUs that pass (docs/slurm.md), each line with NodeName=node
 * when node is not NULL; 0, or 1 when none passes. */
int rk_doctor_gres(const rk_doctor_gpu *g, int n, double threshold, const char *node);

/* Slurm's GRES type for a GPU model name: "NVIDIA GeForce GTX 1070 Ti" -> "gtx_1070_ti". */
void rk_doctor_gres_type(const char *name, char *out, size_t cap);

#endif
