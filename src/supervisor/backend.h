/*
 * A launcher behind `rk run` (docs/design.md, "The launcher backend table"): the table the
 * job's loop (run.c, watch.c, stacks.c, drain.c) calls to start, watch and end one launch, as
 * torchelastic's agent calls _start_workers, _monitor_workers and _stop_workers. Two
 * implement it: launcher.c, the launcher of this host (local, mpirun or srun under launch.c's
 * keeper: the default), and src/cluster/cluster.c, the node agents of a job over many hosts.
 * The loop knows no other way to run ranks; an op a backend has no use for is NULL.
 *
 * Below the table: what the supervisor offers a backend (its status line, a remote rank's
 * connection, the launch's failure, a device set aside, a stack dump's bytes, the launcher of
 * this host). They are the only ways a backend changes the job's state: it never writes into
 * the supervisor's structs.
 */
#ifndef RK_SUPERVISOR_BACKEND_H
#define RK_SUPERVISOR_BACKEND_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "supervisor/policy.h"
#include "supervisor/supervisor.h"

struct sup; /* the job (sup.h, private to src/supervisor/) */

/* RK_INJECT_DONE's list handed to a launch: the injections that already fired, "0,3". */
#define RK_SUP_DONE_MAX 256

/* One launch, as the loop hands it to start. */
typedef struct rk_sup_launch {
    int no;           /* the launch's number, 0 the first (RK_LAUNCH) */
    int n;            /* its ranks */
    const int *dev;   /* rank -> index into o->devices */
    const char *done; /* RK_INJECT_DONE's list ("" none) */
} rk_sup_launch;

/* A node's snapshot memory as its agent said it (backend op snap_mem). */
typedef struct rk_sup_snap_mem {
    const char *name; /* the node's host */
    int have;         /* its agent said it (else the numbers are 0) */
    uint64_t own, held, own_peak, held_peak;
} rk_sup_snap_mem;

typedef struct rk_sup_backend_ops {
    const char *name;
    /* ---- the job (NULL: nothing to do) */
    /* Before the first launch, after the job's socket, ledger and gate are open: `s` is the
     * job, for the services below. An error ends the job (RK_EINVAL, RK_ENOENT: bad input). */
    int (*open)(void *ctx, struct sup *s, rk_err *err);
    /* After the last launch was killed. */
    void (*close)(void *ctx);
    /* ---- one launch (all required) */
    /* Start launch l (the job's state for it is already reset). */
    int (*start)(void *ctx, const rk_sup_launch *l, rk_err *err);
    /* 1 once every rank and process of the launch ended, *code then the launcher's exit code
     * (128 + signal if it was killed); 0 while it runs. Never blocks. */
    int (*poll)(void *ctx, int *code);
    /* The rank whose failure ended the launch (the launcher's word), once; -1 none (yet). */
    int (*failed_rank)(void *ctx);
    /* End every process of the launch: a grace of grace_s, then SIGKILL; waits for them. */
    void (*kill)(void *ctx, double grace_s);
    /* ---- the backend's own link (NULL: none) */
    /* Read the link, waiting up to wait_s, and act on what came (a rank's stream relayed into
     * its connection, a node lost: the launch's failure). The watch loop calls it once a
     * round, a wait (stacks, the blame) more often. */
    void (*pump)(void *ctx, double wait_s);
    /* Before a failure the ranks show is blamed on a device: wait until the backend knows
     * whether a node's loss is its cause (then said through sup_fail_node). */
    void (*blame)(void *ctx);
    /* ---- a rank on another host (a connection of sup_add_remote_conn; NULL: none) */
    /* Ask for its stacks: the dump comes to sup_stack_append. 0 asked, -1 not (unreachable, or
     * not a rank this backend may signal). */
    int (*ask_stacks)(void *ctx, int node, uint32_t chan, int rank);
    /* 1 once the dump asked of (node, chan) is complete. */
    int (*stacks_done)(void *ctx, int node, uint32_t chan);
    /* ---- where the launcher of this host places the ranks (NULL: on this host) */
    /* The ranks' RK_HEARTBEAT (else the job's socket). */
    const char *(*socket)(void *ctx, char *buf, size_t cap);
    /* mpirun's --host: "h1:2,h2:2". */
    const char *(*host_list)(void *ctx, char *buf, size_t cap);
    /* MASTER_ADDR: rank 0's host. */
    const char *(*master)(void *ctx);
    /* srun's placement: rank r's node on line r of hostfile, the nodes left out into
     * excl[cap] ("" none); the count of nodes used, or an error (err->code). */
    int (*srun_hosts)(void *ctx, const char *hostfile, char *excl, size_t cap, rk_err *err);
    /* The ranks' RK_SNAP_DIRS: "HOST=DIR,..." for every host of the launch, each its node's
     * snapshot directory (docs/recovery.md "Across hosts"); NULL when a host of the launch
     * has none (then no rank gets one: every rank snapshots, or none). */
    const char *(*snap_dirs)(void *ctx, char *buf, size_t cap);
    /* Node k's snapshot memory (its ranks' generations and pins: own; the partner copies it
     * keeps for other nodes: held; both now and at their peak) into *m: 1 for k < the job's
     * nodes, 0 past them (NULL: the ranks' snapshots are this host's, gauge.c measures them) */
    int (*snap_mem)(void *ctx, int k, rk_sup_snap_mem *m);
    /* ---- the devices' hosts (NULL: this host's, always up) */
    /* 1 if device d's host is up and not quarantined; its name. */
    int (*node_up)(void *ctx, int d);
    const char *(*node_name)(void *ctx, int d);
    /* Device d's health as its host read it: the latest reading, or with `worst` the worst
     * since the last such look (then forgotten), into *h and why[cap]; 1 if the backend reads
     * the devices' health (a sound reading before any came), 0 if not (NULL: the gate here). */
    int (*health)(void *ctx, int d, int worst, rk_sup_health *h, char *why, size_t cap);
    /* 1 if device d's last reading came from a simulated GPU. */
    int (*health_sim)(void *ctx, int d);
} rk_sup_backend_ops;

typedef struct rk_sup_backend {
    const rk_sup_backend_ops *ops;
    void *ctx;
} rk_sup_backend;

/* Run the job as rk_sup_run does, its launches through backend b (NULL: the launcher of this
 * host, launcher.c). */
void rk_sup_run_with(const rk_sup_opts *o, const rk_sup_backend *b, rk_sup_report *rep);

/* ---- the supervisor's services to a backend ----------------------------------------------- */

/* SIGINT, SIGTERM and SIGHUP seen (run.c's handler counts them). */
extern volatile sig_atomic_t rk_sup_interrupted;

/* A live status line on stderr: "rk run: [  12.3 s] ..." (job.c). */
void sup_say(const struct sup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An incident that is final at once (no steps lost): to the events file now (drain.c). */
void sup_record(struct sup *s, const char *kind, int rank, const char *device, const char *action,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A rank's stream from another host: `fd` (the supervisor's from here on) is read as a
 * connection of this launch whose process, `pid` on node `node`, the backend vouches for;
 * (node, chan) name it to ask_stacks. 0, or -1 (fd closed) when the table is full (conns.c). */
int sup_add_remote_conn(struct sup *s, int fd, int node, uint32_t chan, long pid);
/* Read what connection `fd` has waiting now (its writer found it full). -1 if no connection
 * of the launch has that fd (conns.c). */
int sup_drain_conn(struct sup *s, int fd);
/* A failure seen in this launch (the first counts), with the incident's detail (job.c). */
void sup_fail(struct sup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 once a failure was seen in this launch (job.c). */
int sup_failing(const struct sup *s);
/* Node `node` (named `name`), running ranks from `rank`, was lost: the launch's failure, and
 * its cause if another was seen just before; `what` the incident's detail (job.c). */
void sup_fail_node(struct sup *s, int node, int rank, const char *name, const char *what);
/* Device d is set aside for the rest of the job, with its host (drain.c). */
void sup_quarantine_device(struct sup *s, int d);
/* 1 once a rank said snapshot_off: memory recovery is off for the rest of the job
 * (launcher.c). */
int sup_snapshots_off(const struct sup *s);
/* Snapshots in memory off for the rest of the job (a rank's snapshot_off event, or a node of
 * a launch across hosts without a directory): the incident snapshot_off (no rank blamed,
 * `action`, the reason `why`), one status line; later launches get no directory. */
void sup_snapshots_stop(struct sup *s, int64_t step, const char *action, const char *why);
/* Steps the job has done in this run (drain.c). */
int64_t sup_steps_done(const struct sup *s);
/* The newest step a rank of the job has done (drain.c); -1 before any. */
int64_t sup_step_now(const struct sup *s);
/* Append n bytes of rank `rank`'s stack dump to its file of this launch (stacks.c): the
 * bytes written, -1 if the file cannot be opened (not a regular file, a link). */
long sup_stack_append(struct sup *s, int rank, const void *bytes, size_t n);
/* The launcher of this host for this launch (launcher.c; its ranks placed by the backend's
 * socket, host_list, master and srun_hosts): start, poll, failed_rank and kill as the ops. */
int sup_launcher_start(struct sup *s, rk_err *err);
int sup_launcher_poll(struct sup *s, int *code);
int sup_launcher_failed_rank(struct sup *s);
void sup_launcher_kill(struct sup *s, double grace_s);

/* The launcher of this host as a backend (launcher.c): its context is the job itself. */
extern const rk_sup_backend_ops rk_sup_launcher_ops;

#endif
