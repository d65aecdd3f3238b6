/*
 * The supervisor behind `rk run` (docs/design.md): launches the ranks of a training job
 * through an existing launcher, watches their heartbeats (rekindle/heartbeat.h) and exits,
 * classifies each failure, relaunches from the latest good checkpoint, quarantines devices
 * that keep failing and shrinks the job onto the rest, and keeps the ledger (events, goodput).
 * Pieces: launch.c (argv for mpirun or srun, the keeper that holds the job, kill), run.c (the
 * job: launches, relaunches, the report), watch.c (one launch), conns.c (the ranks'
 * connections), drain.c (devices: pick, quarantine, drain), gate.c (the health gate),
 * policy.c (every decision: policy.h), ledger.c (events file, summary JSON). sup.h is what
 * the loop's files share. The launches run through a backend table (backend.h): launcher.c's
 * (this host's launcher, the default), or another room's (src/cluster: many hosts).
 */
#ifndef RK_SUPERVISOR_H
#define RK_SUPERVISOR_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "rekindle/error.h"
#include "rekindle/health.h"
#include "rekindle/heartbeat.h"
#include "supervisor/policy.h"
#include "supervisor/runlog.h"

#define RK_SUP_PARTNER_AUTO (-1) /* --partner-every auto */

/* How the ranks are started: through Open MPI's mpirun, through srun, or forked by rk run's
 * keeper itself (local: no MPI). AUTO is a request, resolved by rk_launch_pick before the
 * job starts. */
typedef enum rk_launcher {
    RK_LAUNCH_MPIRUN,
    RK_LAUNCH_SRUN,
    RK_LAUNCH_LOCAL,
    RK_LAUNCH_AUTO
} rk_launcher;

/* Where a relaunch restores the ranks' state from (--recovery, docs/recovery.md): the node's
 * snapshots in memory when they are at least as new as the disk's checkpoints (the default),
 * or the disk's checkpoints only. */
typedef enum rk_sup_recovery {
    RK_SUP_RECOVERY_MEMORY = 0,
    RK_SUP_RECOVERY_DISK,
    RK_SUP_RECOVERY_INPLACE /* memory, and a PyTorch rank that fails is replaced in place */
} rk_sup_recovery;

/* A host of a job over many hosts (src/cluster). */
typedef struct rk_sup_host {
    const char *name; /* what --rsh reaches it by (under Slurm: its node name) */
    const char *addr; /* MASTER_ADDR when it holds rank 0 (under Slurm: its NodeAddr); NULL:
                       * the name */
    int slots;        /* ranks it runs: its devices 0..slots-1 */
    int spare;        /* used only when the others are not enough */
} rk_sup_host;

typedef struct rk_sup_opts {
    int n;                                   /* ranks to start with */
    const char *devices[RK_SUP_MAX_DEVICES]; /* device ids, at least n */
    int ndevices;
    const char *ckpt_dir;     /* RK_CKPT_DIR for the workers; NULL: none */
    rk_sup_recovery recovery; /* with ckpt_dir on this host: snapshots in memory (RK_SNAP_DIR) */
    double hb_timeout_s;      /* a rank silent this long is hung */
    double startup_timeout_s; /* from launch to every rank's hello */
    double stop_grace_s;      /* after SIGINT/TERM/HUP: then tear the job down (0: at once) */
    int failure_threshold;    /* failures that quarantine a device */
    int max_restarts;
    int min_ranks;
    const char *inject;         /* fault spec (already checked) or NULL */
    const char *events_path;    /* NULL: no events file */
    const char *summary_path;   /* NULL: no summary file */
    const char *steps_path;     /* NULL: no steps file (launches, steps, checkpoints) */
    const char *gate_path;      /* NULL: no gate file (the health gate's readings) */
    const char *metrics_path;   /* NULL: no metrics file (Prometheus text, --metrics-file) */
    rk_launcher launcher;       /* never AUTO here (rk_launch_pick) */
    const char *launcher_why;   /* why that launcher, for the first status line; NULL: asked */
    char *const *launcher_args; /* extra arguments for the launcher, NULL-terminated or NULL */
    char *const *worker;        /* WORKER ARGS..., NULL-terminated */
    int quiet;                  /* no live status lines */
    const char *stack_dir;      /* RK_STACK_DIR for the workers; NULL: a private directory */
    int no_pythonpath;          /* 1: leave PYTHONPATH as it is */
    /* the health gate (gate.c): NULL backend = none */
    const char *health;          /* "nvml" or "sim" */
    int health_sim_gpus;         /* sim: fleet size (at least the devices' largest index + 1) */
    uint64_t health_seed;        /* sim */
    double health_time_scale;    /* sim: simulated seconds per real second (sim_step_s 0) */
    double health_age_h;         /* sim: hours of service at the start */
    rk_sim_load health_sim_load; /* sim: idle (the default) or busy (rk_telemetry_opts) */
    bool health_sim_sensors;     /* sim: VRM ripple and fan vibration reported too */
    double health_threshold;     /* a GPU below this is left out or drained */
    double health_interval_s;    /* between readings during a run */
    double sim_skip_h;           /* sim: the fleet's clock starts this many hours in */
    /* sim: > 0: the fleet ages this many simulated seconds a step of the job (its clock is the
     * job's progress, not the wall clock: --sim-step-time) */
    double sim_step_s;
    /* the failure predictor (predict/predict_online.h): NULL = none */
    const char *predictor;    /* model file */
    double drain_probability; /* drain (or leave out) a GPU whose probability reaches it */
    /* many hosts: NULL = this host alone; then devices are "HOST:INDEX" in the hosts' order */
    const rk_sup_host *hosts;
    int nhosts;
    const char *listen;    /* the coordinator's ADDR:PORT (port 0: the kernel picks) */
    const char *rsh;       /* how an agent is started: "ssh -o BatchMode=yes" when NULL */
    const char *agent_cmd; /* rk on the hosts; NULL: this executable's path */
    double node_timeout_s; /* a node silent this long is lost */
    int partner_every;     /* across hosts with snapshots in memory: each rank pins a
                            * generation every this many steps, copied to a partner host
                            * (RK_SNAP_PIN_EVERY; 0: no partner copies; RK_SUP_PARTNER_AUTO:
                            * the runtime's choice, about every 30 s) */
    /* --launcher srun with hosts: the agents and each launch's ranks are started by srun in
     * the allocation (docs/slurm.md) */
    int slurm_drain;      /* a node quarantined is drained in Slurm, with the reason */
    const char *scontrol; /* the scontrol to run; NULL: "scontrol" */
} rk_sup_opts;

/* Incidents of one kind, for the report. */
typedef struct rk_sup_count {
    char kind[32];
    int count;
} rk_sup_count;

/* What rk_sup_run says of the job. */
typedef struct rk_sup_report {
    rk_sup_end end;      /* how it ended (policy.h); cli/cmd_run.c maps it to an exit status */
    const char *outcome; /* the summary's word: "finished", "interrupted" or "failed" */
    rk_err err;          /* why it could not start or go on, when a message is owed; "" if not */
    int summary;         /* 1: the ledger was opened and the numbers below are the job's */
    rk_err summary_err;  /* the summary file could not be written; "" if it was */
    int64_t steps;       /* the most steps done by any rank */
    int64_t first_step;  /* the step the job began from */
    int final_ranks;
    double wall_s, productive_s, goodput;
    int restarts, quarantined, injected;
    double recovery_median_s, recovery_max_s; /* -1: no recovery measured */
    const char *recovery;                     /* "memory" or "disk": what --recovery asked */
    const char *snapshots; /* "on", "off" (a snapshot_off turned them off), "none" (no directory) */
    uint64_t snap_peak;    /* the most bytes of snapshots the nodes held (rk_snap_bytes) */
    uint64_t held_peak;    /* ... of partner copies (across hosts) */
    int from_memory, from_disk; /* relaunches whose ranks all restored from there */
    int in_place;               /* ranks replaced in place (the others kept running) */
    rk_sup_count *incidents;    /* per kind, in order of first appearance (injections and notes
                                 * not: rk_event_is_note) */
    size_t nkinds;
} rk_sup_report;

/* Run the job to its end and fill *rep (always; free with rk_sup_report_free). Says what
 * happens during the run on stderr, one status line at a time; the closing summary, the exit
 * status and the messages in rep->err are the caller's to print. */
void rk_sup_run(const rk_sup_opts *o, rk_sup_report *rep);
void rk_sup_report_free(rk_sup_report *rep);

/* ---- launch.c ---------------------------------------------------------------------------- */

typedef struct rk_launch {
    pid_t pid;    /* the keeper: rk run's child that holds the job (launch.c), own group */
    int pidns;    /* 1: the job runs in a PID namespace of its own, the keeper its pid 1 */
    int ns_errno; /* why not, when one was asked for */
    int life;     /* the lifeline: the keeper kills the job when this end closes */
    int failed;   /* local: the keeper writes the first failed rank here (-1: none) */
    int inplace;  /* started by rk_launch_start_inplace */
    int orders;   /* ... rk run's orders to the keeper (rk_launch_respawn), -1: none */
    int loopback; /* 1: a single-node mpirun with librkloopback.so (listeners on loopback) */
    int exited;   /* the keeper reaped */
    int status;   /* its wait status once exited: the launcher's (128 + signal if killed) */
} rk_launch;

/* Start the launcher for `n` ranks of `worker` with `env` (NAME=VALUE strings, NULL-ended)
 * added to this process's environment, under a keeper: pid 1 of a new PID namespace when
 * `want_pidns` and the kernel allows it (l->pidns), else a child subreaper. The keeper and
 * everything it started die when this process dies, however it dies. argv is built here,
 * never a shell string. A launcher that cannot be executed: RK_ENOENT naming it and why,
 * nothing left running.
 * RK_LAUNCH_LOCAL: the keeper forks the n ranks itself, each with RANK and LOCAL_RANK added,
 * and behaves as mpirun does with a SIGKILL timeout of 0: the first rank that exits with a
 * status other than 0 and 4 (stopped), or dies by a signal, gets the other ranks SIGKILLed
 * at once and its status (128 + signal) is the keeper's; ranks that exit 0 or 4 wait for the
 * others; all done: 4 if any stopped, else 0. A worker that cannot be executed: RK_ENOENT.
 * mpirun and srun: the worker runs under `rk _rank-env` (cli/cmd_rank_env.c), which sets
 * RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from the launcher's variables and execs the
 * worker in place (same pid). */
int rk_launch_start(rk_launch *l, rk_launcher kind, char *const *launcher_args, int n,
                    char *const *worker, char *const *env, int want_pidns, rk_err *err);
/* Local: the rank whose failure made the keeper end the others (written before it killed
 * them), once; -1 if none (yet) or another launcher. Never blocks. */
int rk_launch_failed_rank(rk_launch *l);
/* Local, for recovery in place (docs/recovery.md, "In place"): as rk_launch_start with
 * RK_LAUNCH_LOCAL, but a rank that dies by a signal or exits with a failure does not end the
 * others: the keeper says which rank and its status (rk_launch_failed), and waits for rk run's
 * order: rk_launch_respawn starts that rank again, or gives up (rank -1: the keeper ends the
 * job and exits with the first failed rank's status, as rk_launch_start's keeper would). */
int rk_launch_start_inplace(rk_launch *l, int n, char *const *worker, char *const *env,
                            int want_pidns, rk_err *err);
/* In place: the next rank that ended with a failure, its exit status (128 + signal) into
 * *code; -1 if none (yet). Never blocks. */
int rk_launch_failed(rk_launch *l, int *code);
/* In place: start rank `rank` again, with `extra` NAME=VALUE strings (NULL-ended, at most
 * 4 KiB in all) over the launch's environment; rank -1: give up, end the job; rank
 * RK_LAUNCH_ORDER_SPARE: start a warm spare if none is waiting (a PyTorch rank's `python
 * SCRIPT` only: python/rekindle/torch/_spare.py), which the next replacement becomes instead of
 * a new process; rank RK_LAUNCH_ORDER_KILL(r): SIGKILL the keeper's process of rank r (a
 * replacement that has not rejoined: a second failure made its rendezvous void), whose end the
 * keeper then reports as any rank's (rk_launch_failed). RK_EINVAL if `extra` is too long,
 * RK_EIO if the keeper has gone. */
#define RK_LAUNCH_ORDER_SPARE (-2)
#define RK_LAUNCH_ORDER_KILL(r) (-3 - (r))
/* The warm spare's argv from a rank's: `PYTHON [OPTS] SCRIPT ARGS` becomes `PYTHON [OPTS] -m
 * rekindle.torch._spare SCRIPT ARGS` (python/rekindle/torch/_spare.py: it imports torch and the
 * script's imports, waits for a rank, then runs the script as __main__), NULL-ended in out[cap].
 * 0, or -1 for any other shape (not python; -c, -m, stdin; -W, -X, a long option, whose
 * argument may be apart; no room): no spare. */
int rk_launch_spare_argv(const char *const *argv, const char **out, int cap);
int rk_launch_respawn(rk_launch *l, int rank, char *const *extra);
/* Reap without blocking: 1 once exited (l->status set), else 0. */
int rk_launch_poll(rk_launch *l);
/* Tear down every process of the job: SIGTERM to the keeper (it passes it on to the whole
 * job), up to `grace_s` for the launcher to exit, then SIGKILL (the namespace, or every
 * descendant found in /proc); reaps. Never uses pids that workers reported. */
void rk_launch_kill(rk_launch *l, double grace_s);
/* This executable's path ("rk" if /proc says nothing). */
const char *rk_launch_self_exe(void);
/* `arg` appended to buf + used (cap) as a POSIX shell reads it back: bare when it holds only
 * characters no shell treats specially, else in single quotes ('\'' for a quote); the new
 * length (which may pass cap: then buf holds what fitted). */
size_t rk_launch_quote(char *buf, size_t used, size_t cap, const char *arg);
/* Leave `pid` and its descendants out of every kill of rk run's descendants (rk_launch_kill
 * ends with one: whatever escaped a keeper): a multi-host job's agents. */
void rk_launch_spare(pid_t pid);
/* 1 if `pid` (in this process's PID namespace) is a process of this launch (a descendant
 * of its keeper, by /proc). */
int rk_launch_owns(const rk_launch *l, pid_t pid);
/* 1 if `pid` descends from `root` (parent links in /proc). */
int rk_proc_descends(pid_t pid, pid_t root);
/* `pid`'s pid in its own PID namespace (the last NSpid of /proc/PID/status: what its
 * getpid() returns), -1 if it is gone. */
long rk_proc_nspid(pid_t pid);
/* `auto`: mpirun when `launcher_args` are given or the worker's executable (argv[0], looked
 * up in PATH as execvp does) is an ELF file that needs libmpi.so*, libmpich* or librekindle.so*,
 * else local. Why, in why[cap] ("python3 is not an MPI program (/usr/bin/python3.11)"). Reads at
 * most a few MiB of the file, a regular file only; anything it cannot read is not MPI. */
rk_launcher rk_launch_pick(char *const *worker, int launcher_args, char *why, size_t cap);
/* "mpirun", "srun", "local". */
const char *rk_launcher_name(rk_launcher kind);
/* The launcher's argv for a printout into buf[cap] (returned), each argument shell-quoted
 * when it needs it; under local, the worker's argv[0] as execvp finds it in PATH. */
const char *rk_launch_describe(rk_launcher kind, int n, char *const *launcher_args,
                               char *const *worker, char *buf, size_t cap);

/* 1 if the launcher arguments name hosts (--host, -H, --hostfile, ...): the job may span
 * nodes. */
int rk_launch_names_hosts(char *const *launcher_args);
/* 0 if `dir` may hold the job's private stack directory: a directory owned by the effective
 * uid or root, writable by group or others only with the sticky bit; else -1, why in
 * why[cap] (run.c). */
int rk_sup_dir_safe(const char *dir, char *why, size_t cap);

/* ---- env.c ------------------------------------------------------------------------------- */

/* A private directory PREFIX.XXXXXX in $TMPDIR (or /tmp) into dir[dcap], 0700, and a Unix
 * socket hb.sock in it, 0600, listening, into sock[scap] and *fd: only this user connects.
 * On an error the caller removes what was made (dir is "" if nothing was; *fd may be open). */
int rk_sup_private_socket(const char *prefix, char *dir, size_t dcap, char *sock, size_t scap,
                          int *fd, rk_err *err);
/* A TCP port free on 127.0.0.1 now (bound to port 0, read, closed), -1 if none. */
int rk_env_free_port(void);
/* The directory that holds the rekindle Python package (rekindle/__init__.py): the installed
 * <prefix>/share/rekindle/python beside this executable's <prefix>/bin, else, only for an
 * executable inside the build directory, the source tree's python/; into buf[cap], NULL if
 * neither holds it. A directory (or its rekindle/) writable by group or others, or owned by
 * another user than the effective one or root, is skipped: why in why[wcap] ("" if none). */
const char *rk_env_python_dir(char *buf, size_t cap, char *why, size_t wcap);
/* What one launch's ranks are told besides their launcher's variables (docs/run.md, "The
 * ranks' environment"): the one builder for rk run's launcher (launcher.c) and the node agent
 * (cluster/agent_job.c). A field that is 0, -1 or NULL as said: the variable is not set. */
typedef struct rk_rank_env_opts {
    const char *heartbeat;    /* RK_HEARTBEAT */
    const char *devices;      /* RK_DEVICES: the launch's device ids by global rank, "0,1" */
    int by_host;              /* RK_DEVICES_BY_HOST=1 (HOST:INDEX ids: rk _rank-env sets each
                               * rank's CUDA_VISIBLE_DEVICES) */
    int launch;               /* RK_LAUNCH and TORCHELASTIC_RESTART_COUNT */
    int world, local_world;   /* WORLD_SIZE, LOCAL_WORLD_SIZE */
    int rank_base;            /* RK_RANK_BASE: this host's first global rank (-1: not set) */
    const char *master_addr;  /* MASTER_ADDR (NULL: not set) */
    int master_port;          /* MASTER_PORT (0: not set) */
    const char *cuda_visible; /* CUDA_VISIBLE_DEVICES (NULL: not set); CUDA_DEVICE_ORDER is
                               * PCI_BUS_ID unless the environment has one */
    int omp_one;              /* OMP_NUM_THREADS=1 */
    const char *stack_dir;    /* RK_STACK_DIR (NULL: not set) */
    int pythonpath;           /* PYTHONPATH: the rekindle package's directory first */
    const char *ckpt_dir;     /* RK_CKPT_DIR, and RK_RESUME=1 (NULL: neither) */
    const char *snap_dir;     /* RK_SNAP_DIR: the job's snapshots in memory (NULL: not set) */
    const char *snap_dirs;    /* RK_SNAP_DIRS: across hosts, "HOST=DIR,...": each host's (rk
                               * _rank-env makes it the rank's RK_SNAP_DIR); NULL: not set */
    int snap_pin_every;       /* RK_SNAP_PIN_EVERY (0: not set; RK_SUP_PARTNER_AUTO: auto) */
    int ckpt_from_snap;       /* RK_CKPT_FROM_SNAP=1: rk run writes the disk checkpoints from
                               * the ranks' snapshots in snap_dir (snapsave.c) */
    const char *inject;       /* RK_INJECT (NULL: not set) */
    const char *inject_done;  /* RK_INJECT_DONE with RK_INJECT (NULL or "": not set) */
} rk_rank_env_opts;

#define RK_RANK_ENV_MAX 40 /* variables of one rank_env, the launcher's own added after */

typedef struct rk_rank_env {
    const char *env[RK_RANK_ENV_MAX + 1]; /* NAME=VALUE, n of them, then NULL */
    int n;
    char why[4200]; /* the Python package's directory was skipped: why ("" if not) */
    char buf[RK_SUP_MAX_DEVICES * 600 + 32768]; /* what env points into */
    size_t used;
} rk_rank_env;

/* Build *e from o (e is large: make it static). RK_EINVAL if a value does not fit. */
int rk_rank_env_build(rk_rank_env *e, const rk_rank_env_opts *o, rk_err *err);
/* Add one more NAME=VALUE (a copy) to e, RK_EINVAL if it does not fit. */
int rk_rank_env_add(rk_rank_env *e, rk_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A rank's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (out[0..3]) from its launcher's
 * variables, read through `get` (getenv): Open MPI's OMPI_COMM_WORLD_*, else MPICH's PMI_RANK,
 * PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS, else Slurm's SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID and SLURM_TASKS_PER_NODE at SLURM_NODEID. Without the local pair, one node:
 * the local values are the global ones. 0 if no set is there and consistent. */
int rk_env_rank_map(const char *(*get)(const char *name), long out[4]);

/* ---- gate.c ------------------------------------------------------------------------------ */

/* The health gate: GPUs' scores (rekindle/health.h) for the devices of a job. A device id is
 * the GPU's index in the telemetry backend. */
typedef struct rk_gate rk_gate;

int rk_gate_open(rk_gate **out, const rk_sup_opts *o, rk_err *err);
/* The same over an open telemetry (the gate owns it from here on, on error too). */
struct rk_telemetry;
int rk_gate_open_telemetry(rk_gate **out, struct rk_telemetry *t, const rk_sup_opts *o,
                           rk_err *err);
void rk_gate_close(rk_gate *g);
/* Read every GPU now and rescore. On a simulated fleet whose clock the gate drives (a
 * predictor, a skip or a step clock), every minute due since the last sample is read: on the
 * step clock, the minute of each step done since (rk_gate_set_progress), so the readings
 * depend on the job's steps and not on when the samples happen. */
int rk_gate_sample(rk_gate *g, rk_err *err);
/* The steps the job has done in this run (never goes back: a relaunch that redoes steps does
 * not age the fleet twice). Drives the step clock (sim_step_s); ignored otherwise. */
void rk_gate_set_progress(rk_gate *g, int64_t steps);
/* The worst of device `id`'s readings since the last call (the lowest score with its worst
 * finding in `why`, the highest probability), or the latest when none was read since; then
 * forgets them. A driven fleet reads many minutes a sample: a score that dipped below the
 * threshold at one of them counts, whenever the sample came. -1 if `id` names no GPU. */
int rk_gate_take_worst(rk_gate *g, const char *id, int *score, double *prob, char *why, size_t cap);
/* Device `id`'s reading, the one of rk run's drain and of the node agent's HEALTH: gone or
 * not, and either the latest score and probability or, with `worst`, the worst since the last
 * such look (rk_gate_take_worst, which forgets them), its worst finding in why[cap]. */
rk_sup_health rk_gate_reading(rk_gate *g, const char *id, int worst, char *why, size_t cap);
/* The latest score of device `id` (0..100), or -1 when it names no GPU; the worst finding's
 * code and message in `why` when below the threshold. */
int rk_gate_score(const rk_gate *g, const char *id, char *why, size_t cap);
/* 1 if the device id is a GPU index the backend knows. */
int rk_gate_knows(const rk_gate *g, const char *id);
/* 1 if the latest reading found device `id` gone (off the bus, dead). */
int rk_gate_lost(const rk_gate *g, const char *id);
/* The latest reading's core temperature of device `id`, degrees Celsius; NAN when the GPU
 * did not report it (or `id` names no GPU). */
double rk_gate_temperature(const rk_gate *g, const char *id);
/* 1 if device `id` is gone or had an uncorrectable ECC error since the last call (either
 * ends the process using it); clears the error. */
int rk_gate_take_fatal(rk_gate *g, const char *id);
/* With a predictor: device `id`'s probability of failing within the model's horizon, -1
 * while its window is not full (or without a predictor). */
double rk_gate_prob(const rk_gate *g, const char *id);
/* Without a predictor, each sample reads once; with one, the gate reads once a minute of the
 * GPUs' clock (for the simulator it drives the pinned clock minute by minute up to now). */
const char *rk_gate_backend(const rk_gate *g);

/* ---- ledger.c ---------------------------------------------------------------------------- */

typedef struct rk_incident {
    double t;           /* seconds since the supervisor started */
    char kind[32];      /* crash, hang, commfail, guard_failed, nan, grad_outlier, ... */
    int rank;           /* -1 unknown */
    char device[64];    /* "" unknown */
    char action[32];    /* relaunch, redo, rollback, quarantine, stop, ... */
    int64_t lost_steps; /* -1 unknown */
    double recovery_s;  /* -1 unknown */
    int64_t step;       /* the step it happened at (-1 unknown): a rank's event says; else
                         * the last step rank 0 applied before it was recorded */
    char detail[576];
    char stacks[2048]; /* a hang: the stack dumps' paths, one a line ("": none) */
    int final;         /* complete: may be written (rk_ledger_write) */
    int written;       /* in the events file */
} rk_incident;

/* Steps of one rk run the goodput counts, from the first step seen (2^24: 128 MiB of
 * durations at most; a longer job's later steps are not counted as productive). */
#define RK_LEDGER_MAX_STEPS ((int64_t)1 << 24)

typedef struct rk_ledger {
    FILE *events;     /* NULL: none */
    double t0;        /* monotonic start */
    double wall0;     /* the same instant, seconds since the epoch */
    rk_incident *inc; /* every incident, for the summary */
    size_t ninc, cap;
    size_t nwritten; /* incidents before this index are all written */
    double *dt;      /* seconds of the applied step k (index k-1-base), final lineage */
    int64_t base;    /* the first step seen, less one */
    int64_t ndt, capdt;
    int64_t first_step; /* the step the job began from */
    int64_t at_step;    /* the last step rank 0 applied (-1: none yet) */
    int restarts, quarantined;
    int injected;
    /* the job's snapshots in memory (docs/recovery.md), for the summary and the metrics:
     * recovery and snapshots as rk_sup_report has them (run.c sets them, conns.c says "off");
     * the bytes held when last measured and the most (gauge.c); the relaunches whose ranks all
     * said they restored from memory, from disk (conns.c, from the hellos' "restore") */
    const char *recovery, *snapshots;
    uint64_t snap_bytes, snap_peak;
    uint64_t held_bytes, held_peak; /* partner copies the job's nodes hold (across hosts) */
    int from_memory, from_disk;
    int in_place; /* ranks replaced in place (inplace.c) */
    /* the run's records (runlog.h): NULL without --steps / --gate-log */
    FILE *steps, *gatelog;
    rk_runlog_thin thin_steps, thin_ckpt, thin_gate; /* the bound on each file (runlog.h) */
} rk_ledger;

int rk_ledger_open(rk_ledger *g, const char *events_path, rk_err *err);
void rk_ledger_close(rk_ledger *g);
double rk_ledger_now(const rk_ledger *g);
/* Record an incident, at now (the caller may set an earlier t before it is written); it goes
 * to the events file once final (see rk_ledger_write). The pointer is valid until the next
 * add. */
rk_incident *rk_ledger_add(rk_ledger *g, const char *kind, int rank, const char *device,
                           const char *action, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
rk_incident *rk_ledger_addv(rk_ledger *g, const char *kind, int rank, const char *device,
                            const char *action, const char *fmt, va_list ap)
    __attribute__((format(printf, 6, 0)));
/* Mark an incident final and write to the events file every final incident that no earlier
 * one (by t) still waits for: the file is in time order even though an incident whose
 * recovery is measured later (a relaunch) is written only then. One line per incident,
 * fsync'ed per line: a crash of the supervisor keeps what was written. */
void rk_ledger_write(rk_ledger *g, rk_incident *i);
/* Mark every incident final and write them all (at the end of the job). */
void rk_ledger_flush(rk_ledger *g);
/* Step k (1-based: steps done) took dt seconds; a replay overwrites. */
void rk_ledger_step(rk_ledger *g, int64_t k, double dt);
/* The run's records (docs/run.md, "The run's records"; line formats in runlog.h): open the
 * steps file and the gate file for appending (either path NULL: none). RK_EIO naming the
 * flag and path on failure. */
int rk_ledger_open_records(rk_ledger *g, const char *steps_path, const char *gate_path,
                           rk_err *err);
/* Into the steps file: launch `launch` runs rank i on devices[i]; rank 0 applied step k of
 * that launch with loss (NAN: not finite) in dt seconds; a rank's checkpoint of step k is
 * durable, written in `seconds`. Lines past the thinning bound (runlog.h) are dropped. */
void rk_ledger_launch_rec(rk_ledger *g, int launch, const char *const *devices, int n);
void rk_ledger_step_rec(rk_ledger *g, int launch, int rank, int64_t k, double loss, double dt);
void rk_ledger_ckpt_rec(rk_ledger *g, int launch, int rank, int64_t k, double seconds);
/* Into the gate file: one reading of the health gate, n GPUs (rk_runlog_rec of type gate;
 * t is set here). A reading is kept or dropped whole by the thinning. */
void rk_ledger_gate_rec(rk_ledger *g, rk_runlog_rec *recs, int n);
/* The closing numbers into rep (steps, goodput, restarts, incidents by kind, recovery
 * times: every field from summary to nkinds), then the summary JSON to `path` (atomic; NULL:
 * none). Flushes every incident to the events file first. */
int rk_ledger_summary(rk_ledger *g, const char *path, int64_t final_step, int final_ranks,
                      const char *outcome, rk_sup_report *rep, rk_err *err);

/* ---- gauge.c: the metrics file ---------------------------------------------------------- */

/* What `rk run --metrics-file` says (docs/metrics.md, "rk run"). */
typedef struct rk_sup_metrics {
    uint64_t snap_bytes, snap_peak; /* rk_run_snapshot_bytes, rk_run_snapshot_bytes_peak */
    uint64_t held_bytes, held_peak; /* rk_run_snapshot_held_bytes, ..._peak */
    int from_memory, from_disk;     /* rk_run_relaunches_total{source="memory"|"disk"} */
    int restarts;                   /* rk_run_restarts_total */
    int64_t step;                   /* rk_run_step: the most steps done by any rank */
    const char *recovery;           /* rk_run_info{recovery=...,snapshots=...}: fixed words */
    const char *snapshots;
} rk_sup_metrics;

/* The metrics as Prometheus text format 0.0.4 (HELP and TYPE lines, a newline at the end)
 * into buf[cap]: its length, or -1 if it does not fit (RK_SUP_METRICS_MAX always does). */
#define RK_SUP_METRICS_MAX 4096
long rk_sup_metrics_format(const rk_sup_metrics *m, char *buf, size_t cap);

#endif
