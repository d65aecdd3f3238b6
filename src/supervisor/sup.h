/*
 * The state of one `rk run` (private to src/supervisor/): what the I/O side of the supervisor
 * shares between its files. run.c runs the job (setup, launches, relaunches, the report);
 * watch.c watches one launch (poll, timeouts, teardown, the verdict); conns.c the ranks'
 * heartbeat connections (accept, hello, messages, commands); drain.c the devices (pick,
 * quarantine, the health gate's readings and the drain); pending.c the incidents waiting for
 * the job to be back at work; job.c the acts they share (say, stop, fail), calling none of
 * them. Every decision is policy.h's.
 *
 * Who calls whom, one way only (scripts/call-cycles.py src/supervisor finds no circle):
 * run.c -> watch.c -> conns.c, drain.c, stacks.c, inplace.c -> pending.c, job.c -> the ledger
 * (inplace.c, recovery in place, is called by watch.c and conns.c and calls pending.c); gauge.c
 * (the snapshot memory and the metrics file), called by run.c and watch.c, calls drain.c's
 * sup_record and job.c's sup_say. A
 * connection's handler (conns.c) records what it saw (rk_sup_seen, the launch's and the
 * connection's state below, a pending incident) and the watch loop acts on it once a round.
 *
 * The job's states, each a named value with its transitions and the one function that makes
 * each (as SQLite's pager lists its eState's):
 *
 * One launch (sup.ls). A stop asked and a failure seen happen at most once each a launch, in
 * either order; the state holds until the next launch resets it:
 *
 *     (start)   -> RUNNING           start_launch (run.c): the launch is started
 *     RUNNING   -> STOPPING          sup_stop_job (job.c): the ranks are asked to checkpoint
 *                                    and stop (a drain, a shrink, an interruption)
 *     RUNNING   -> FAILING           sup_fail (job.c): a failure was seen (the first counts)
 *     STOPPING  -> STOPPED_FAILING   sup_fail
 *     FAILING   -> STOPPED_FAILING   sup_stop_job (an interruption while failing)
 *
 * sup_fail_said (job.c) replaces a failure's detail with a rank's own word without changing
 * the state; how many ranks said hello is sup_hellos(), from the connections' states.
 *
 * One connection (rk_sup_conn.st): a rank's, or a peer's that has not said who it is:
 *
 *     (accept)  -> STRANGER          free_slot (conns.c): accepted, or a remote rank's stream
 *     STRANGER  -> RANK              rank_hello (conns.c): its hello was believed (c->rank)
 *     STRANGER  -> IGNORED           rank_hello: a process of the launch whose hello was
 *                                    ignored; what it says after is dropped, the connection
 *                                    kept (closing it would end the process before another
 *                                    one says the same rank)
 *     RANK      -> LEFT | DONE       rank_bye (conns.c): it said bye ("done": DONE)
 *     RANK      -> LOST              drop_conn (conns.c): it closed without a bye
 *     RANK|LOST -> STRANGER (closed) replace (inplace.c): the rank is replaced in place; the
 *                                    record is freed so that the replacement's hello claims it
 *
 * Its fd is closed (-1) in any state by drop_conn or sup_close_conns; a rank's record stays
 * until the next launch, for the verdict.
 */
#ifndef RK_SUPERVISOR_SUP_H
#define RK_SUPERVISOR_SUP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "base/hush.h"
#include "rekindle/heartbeat.h"
#include "rekindle/inject.h"
#include "rekindle/snap.h"
#include "supervisor/backend.h"
#include "supervisor/policy.h"
#include "supervisor/supervisor.h"

#define RK_SUP_MAX_CONNS 1024
/* After a rank vanished (or said it exits), how long the launcher has to exit by itself with
 * the rank's status before the job is torn down: mpirun ends the other ranks and exits with
 * the first failed rank's status within about a second. */
#define RK_SUP_EXIT_WAIT_S 5.0
/* A device left out by the health gate comes back only this many points above the
 * threshold, so a score hovering at the threshold does not flap in and out of the job. */
#define RK_SUP_HELD_MARGIN 10.0

typedef enum sup_conn_state {
    SUP_CONN_STRANGER = 0,
    SUP_CONN_IGNORED,
    SUP_CONN_RANK,
    SUP_CONN_LEFT,
    SUP_CONN_DONE,
    SUP_CONN_LOST,
} sup_conn_state;

/* One connection: conns.c owns it (job.c sends on it, watch.c reads its progress). */
typedef struct rk_sup_conn {
    int fd;
    sup_conn_state st; /* above */
    int rank;          /* -1 until its hello is believed (st RANK and after) */
    long pid;          /* the peer's pid as the kernel gave it (SO_PEERCRED), in rk run's view */
    long nspid;        /* ... that process's own pid (its getpid()), read at accept; -1: gone */
    int owned;         /* ... it was a process of this launch at accept (rk_launch_owns) */
    double since;      /* accepted */
    int said, hushed;  /* messages about this connection: shown, suppressed */
    rk_hb_lines lines;
    double last;      /* time of the last message */
    int64_t done;     /* steps done */
    int64_t progress; /* 2 x steps done, +1 while in the step's collective */
    int stacks;       /* its hello said it dumps its stacks on SIGUSR1 */
    /* a rank on another host (sup_add_remote_conn): its stream comes from the backend, which
     * names it (node, chan); pid is the rank's own, on that host */
    int node;      /* -1: a local connection */
    uint32_t chan; /* the backend's name of the stream on that node */
} rk_sup_conn;

typedef enum sup_launch_state {
    SUP_LAUNCH_RUNNING = 0,
    SUP_LAUNCH_STOPPING,
    SUP_LAUNCH_FAILING,
    SUP_LAUNCH_STOPPED_FAILING,
} sup_launch_state;

/* Each group of fields names the file that writes it; the others only read it. "Reset by
 * run.c" means start_launch clears it for each launch. */
typedef struct sup {
    /* ---- run.c: the job, set up once */
    const rk_sup_opts *o;
    rk_ledger g; /* the ledger (ledger.c): every file records into it through its functions */
    rk_inject *spec;
    int listen_fd;
    char dir[64], sock[96];
    unsigned char *fired; /* fixed faults that already fired (conns.c marks them) */
    char stack_dir[4096]; /* RK_STACK_DIR: where hung ranks write their stacks (stacks.c) */
    int stack_parent;     /* stack_dir is a private one inside --stack-dir or --events' dir */
    rk_gate *gate;        /* the health gate, NULL without --health */
    rk_sup_rules rules;
    rk_sup_backend b;      /* what runs the launches (backend.h): launcher.c's, or a cluster's */
    rk_sup_mark prev_mark; /* the previous launch's, for the repeat stops (kind NONE: none) */
    char repeat_why[256];  /* a repeat stop's sentence (s->v.why) */
    /* the job's snapshots in memory (RK_SNAP_DIR, docs/recovery.md): made before the first
     * launch, removed at the end or once a rank said snapshot_off (before the next launch);
     * "": none, recovery from disk only */
    char snap_dir[RK_SNAP_PATH_MAX];
    /* ---- drain.c: the devices */
    rk_sup_dev devs[RK_SUP_MAX_DEVICES]; /* each device's standing over the job */
    int n;                               /* this launch's ranks (sup_pick_devices) */
    int dev[RK_SUP_MAX_DEVICES];         /* rank -> index into o->devices */
    double last_gate;                    /* when the gate last read the GPUs */
    /* ---- run.c: this launch (launch_no, its start) */
    int launch_no;
    double t_launch;
    sup_launch_state ls; /* job.c makes its transitions (above) */
    /* ---- launcher.c: the launcher of this host */
    rk_launch l;
    char jobdir[128];  /* the launcher's private temporary directory */
    int told_pidns;    /* said once why the job has no PID namespace */
    int told_pypath;   /* said once that the Python package's directory was skipped */
    int told_loopback; /* said once that Open MPI's listeners are not on loopback only */
    /* ---- conns.c: the ranks' connections and what they said (reset by run.c) */
    rk_sup_conn c[RK_SUP_MAX_CONNS];
    int nconn;
    int64_t start_step; /* resume step of this launch (the least of its ranks' hellos) */
    int first_launch;   /* the launch whose hellos set g.first_step, -1 before */
    int64_t last_done;  /* most steps done by any rank, across launches */
    double loss;
    int64_t hello_step[RK_SUP_MAX_DEVICES]; /* rank -> its hello's step in this launch */
    /* rank -> the process whose hello named it first in this launch, believed or ignored:
     * its pid as rk_sup_conn.pid has it (0: none yet) and node (-1: this host) */
    long claim_pid[RK_SUP_MAX_DEVICES];
    int claim_node[RK_SUP_MAX_DEVICES];
    char dup_detail[RK_HB_DETAIL_MAX + 1];  /* seen.dup_rank's sentence */
    char exit_word[32];                     /* the first exit event's kind, as the rank said it */
    char exit_detail[RK_HB_DETAIL_MAX + 1]; /* ... and its detail */
    char storage_detail[RK_HB_DETAIL_MAX + 1]; /* the first storage event's detail */
    /* where this launch's ranks restored their state from, as their hellos said: the one
     * rk_hb_restore they all said, -1 when they differ (restore_said: a hello was heard) */
    int restore, restore_said;
    int snap_off;      /* a rank said snapshot_off: run.c removes snap_dir before the next launch */
    rk_hush strangers; /* messages about connections that said no hello (base/hush.h) */
    /* rank -> failures its events blamed on its device this round, and the last one's kind:
     * the loop counts them (sup_count_recorded, drain.c), the handler only records */
    int to_count[RK_SUP_MAX_DEVICES];
    char count_kind[RK_SUP_MAX_DEVICES][32];
    /* ---- what this launch's ranks and launcher did, for policy.c: recorded where it is seen
     * (conns.c, job.c, watch.c), reset by run.c */
    rk_sup_seen seen;
    /* ---- job.c: this launch's failure, to classify once the launcher has exited */
    double ftime;
    char fdetail[200];
    /* ---- watch.c: the verdict on the launch that ended, the interruption, the status line */
    rk_sup_verdict v;
    char vdetail[RK_HB_DETAIL_MAX + 64]; /* its incident's detail */
    double intr_t;                       /* when the first signal was seen (-1: none): the
                                          * ranks have o->stop_grace_s from then */
    double last_status;
    /* ---- stacks.c: this launch's hang: the dumps copied, one path a line ("": none) */
    char stacks[2048];
    /* ---- gauge.c: the snapshot memory (g.snap_bytes, g.snap_peak) and the metrics file */
    double gauge_t;   /* when snap_dir was last measured (-1: never) */
    double metrics_t; /* when the metrics file was last written (-1: never) */
    int snap_told;    /* the snapshot_on note was written: snapshots exist(ed) */
    int metrics_told; /* failures to write the metrics file said (once until one succeeds) */
    /* ---- inplace.c: recovery in place (--recovery inplace, docs/recovery.md), reset by
     * run.c each launch but ip_epoch. ip_state's transitions, each by one function:
     *     IP_OFF     this launch cannot (not asked, not local, not every hello said rejoin)
     *     IP_READY   -> IP_REPLACING  sup_inplace_tick: the keeper said rank ip_rank died;
     *                                 the survivors told to rejoin, the keeper to start it again
     *     IP_REPLACING -> IP_REPLACING sup_inplace_tick: another rank failed (a survivor, or a
     *                                 replacement): a new epoch, the failed ranks started
     *                                 again, and those of ip_set that had not rejoined (killed
     *                                 by order first; docs/recovery.md "A failure during a
     *                                 recovery")
     *     IP_REPLACING -> IP_READY    sup_inplace_step (conns.c: a step once every rank said
     *                                 hello): every rank is stepping again
     *     any        -> IP_OFF        sup_inplace_tick: a failure it does not replace (the
     *                                 keeper told to give up: the launch ends as without) */
    int ip_state;
    unsigned char ip_set[RK_SUP_MAX_DEVICES];    /* IP_REPLACING: rank -> being replaced */
    unsigned char ip_killed[RK_SUP_MAX_DEVICES]; /* rank -> its replacement killed by order
                                                  * (a later failure voided its rendezvous):
                                                  * started again at its end */
    int ip_rank; /* IP_REPLACING: the first rank replaced (its line, the timeout's blame) */
    int ip_port; /* IP_REPLACING: the rendezvous' port (MASTER_PORT) of epoch ip_epoch */
    int ip_hung; /* a hung rank killed to be replaced (-1: none): watch.c's hang check waits
                  * for the keeper's word on it */
    char ip_hang[RK_HB_DETAIL_MAX + 64]; /* ... the hang's sentence, for its incident */
    int ip_epoch; /* the rendezvous' epoch (RK_REJOIN_EPOCH, rejoin's "epoch"): the job's */
    double ip_t;  /* IP_REPLACING: since when (the first failure) */
    double ip_te; /* IP_REPLACING: since when the epoch's rendezvous (the startup bound) */
    int ip_spare; /* the keeper was told to start a warm spare since the last replacement
                   * (-1: never, RK_SPARE=0) */
    unsigned char rejoin[RK_SUP_MAX_DEVICES]; /* rank -> its hello said rejoin */
    double lost_t[RK_SUP_MAX_DEVICES];        /* rank -> its connection closed (0: not) */
    /* ---- pending.c: incidents waiting for the job to be back at work (index into g.inc) */
    size_t pending[64];
    int npending;
    int64_t pending_last_done;
    int64_t pending_done[RK_SUP_MAX_DEVICES]; /* rank -> steps it had done at the failure */
    /* ---- snapsave.c: the checkpoint being written from the snapshots, and the next */
    struct sup_snapsave *ss; /* NULL until the first request */
    int ss_storage;          /* a write failed for the disk (RK_ESTORAGE, RK_EIO) */
    int ss_told;             /* the first checkpoint written was said */
} sup;

/* ---- job.c: the shared acts (and sup_say, sup_fail, sup_failing, sup_fail_node: backend.h) -- */

/* Rank `rank`'s device id, "" if none. */
const char *sup_devname(const sup *s, int rank);
rk_sup_conn *sup_by_rank(sup *s, int rank);
/* One command to one rank, never blocking (a rank that does not read loses it). */
void sup_send_cmd(const rk_sup_conn *c, rk_hb_cmd cmd);
/* Send a command to every rank that has not said bye (rk_hb_cmd_format). */
void sup_send_all(sup *s, rk_hb_cmd cmd);
/* Ask every rank to checkpoint and stop (once a launch; later ranks hear it at hello):
 * RUNNING -> STOPPING, FAILING -> STOPPED_FAILING. */
void sup_stop_job(sup *s);
/* 1 once the ranks of this launch were asked to stop. */
int sup_stop_sent(const sup *s);
/* The failure's detail, replaced by what a rank said of it (its exit event), keeping when the
 * failure was first seen; a failure now if none was seen (RUNNING -> FAILING). */
void sup_fail_said(sup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Ranks of this launch whose hello was believed (connections RANK and after). */
int sup_hellos(const sup *s);
/* 1 if connection c said bye (LEFT or DONE). */
int sup_conn_left(const rk_sup_conn *c);

/* ---- conns.c ------------------------------------------------------------------------------- */

/* sup_add_remote_conn, sup_drain_conn: backend.h */
/* A message about a connection (NULL: a peer that said no hello), rate-limited. */
void sup_note(sup *s, rk_sup_conn *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Accept waiting connections and read each at once; close those silent too long. */
void sup_accept(sup *s);
void sup_expire_strangers(sup *s);
/* Read what is there (one buffer of 8 KiB at most): 2 if the buffer was filled (more may be
 * waiting), 1 if bytes were read, 0 if none or closed. */
int sup_read_conn(sup *s, rk_sup_conn *c);
/* Close every connection of the launch. */
void sup_close_conns(sup *s);

/* ---- watch.c ------------------------------------------------------------------------------- */

/* sup_fail, sup_failing, sup_fail_node: backend.h (who is to blame is the verdict's,
 * policy.h, from what the loop saw) */
/* Watch one launch until it ends: the verdict's next step (also in s->v, its detail in
 * s->vdetail). */
rk_sup_next sup_watch(sup *s);
/* The incident kind's word for the verdict (the rank's own word for an exit event's). */
const char *sup_verdict_kind(const sup *s);

/* ---- stacks.c ------------------------------------------------------------------------------ */

/* A hang: SIGUSR1 to each rank r with stuck[r] whose hello said "stacks" (by its verified
 * pid), up to 2 s for the dumps, each copied to stderr; their paths into s->stacks. */
void sup_dump_stacks(sup *s, const int *stuck);

/* ---- drain.c ------------------------------------------------------------------------------- */

/* A failure counted against rank `rank`'s device: quarantines it at the threshold (and stops
 * a healthy job cleanly to shrink it). */
void sup_count_failure(sup *s, int rank, const char *why);
/* The failures the connections' handlers recorded (to_count) counted now, once a round. */
void sup_count_recorded(sup *s);
/* Pick the devices of the next launch into s->dev, s->n; returns how many. */
int sup_pick_devices(sup *s);
/* During a run: read the GPUs when due; kill a rank whose simulated GPU failed; drain one
 * the gate or predictor says to. */
void sup_gate_tick(sup *s);
/* sup_record, sup_quarantine_device, sup_steps_done: backend.h */

/* ---- launcher.c (and sup_launcher_*: backend.h) ------------------------------------------- */

/* 1 if the ranks may run on other hosts: srun, or launcher arguments that name hosts. */
int sup_may_span_hosts(const rk_sup_opts *o);
/* 1 if each rank gets OMP_NUM_THREADS=1 (several share this host's CPUs, the user did not
 * choose). */
int sup_omp_one(const rk_sup_opts *o);

/* ---- gauge.c ------------------------------------------------------------------------------- */

/* Once a watch round: measure the snapshot directory and write the metrics file when a second
 * has passed since the last time (the first call does both). */
void sup_gauge_tick(sup *s);
/* A relaunch: measure now, and the snapshot_held note (what the launch that ended held) once
 * snapshots exist. */
void sup_gauge_relaunch(sup *s);
/* The job's end (before the directory is removed): measure, the snapshot_peak note once
 * snapshots existed, the last metrics file. */
void sup_gauge_end(sup *s);

/* ---- inplace.c ----------------------------------------------------------------------------- */

enum { IP_OFF = 0, IP_READY, IP_REPLACING };
/* A new launch: IP_READY under --recovery inplace with the local launcher, else IP_OFF. */
void sup_inplace_reset(sup *s);
/* Once a watch round: the ranks the keeper saw end, replaced in place or given up on; a
 * connection closed with no word from the keeper for RK_SUP_EXIT_WAIT_S, a failure. */
void sup_inplace_tick(sup *s);
/* 1 if a rank's connection that closed, or its exit event, waits for the keeper's word
 * (the rank may be replaced in place) instead of failing the launch now. */
int sup_inplace_may(const sup *s, int rank);
/* 1 if a hello for `rank` on connection c is a stale one while replacing: from a replacement
 * killed by order (its recovery started again), or from a process already gone. */
int sup_inplace_stale(const sup *s, const rk_sup_conn *c, int rank);
/* watch.c: rank `rank` alone made no progress (`detail` says so; its stacks dumped): SIGKILL
 * to its process (the pid its trusted hello named, by the kernel's word), to be replaced when
 * the keeper sees it end. 0 if it cannot be (then the launch fails as without). */
int sup_inplace_hang(sup *s, int rank, const char *detail);
/* conns.c: a rank's hello (the replacement's: its restore names the incident's source). */
void sup_inplace_hello(sup *s, const rk_hb_msg *m);
/* conns.c: a step once every rank said hello: IP_REPLACING -> IP_READY. */
void sup_inplace_step(sup *s);

/* ---- snapsave.c: disk checkpoints written from the snapshots ------------------------------- */

/* 1 if this launch's ranks are told RK_CKPT_FROM_SNAP=1: the snapshots are in a directory of
 * this host (snap_dir, not off), a checkpoint directory is given, and the environment does not
 * say RK_CKPT_FROM_SNAP=0. */
int sup_snapsave_on(const sup *s);
/* conns.c: rank 0's save: write the checkpoint of `step` from every rank's pinned snapshot of
 * it, in the background (one write at a time; a newer request replaces one not yet begun). */
void sup_snapsave_request(sup *s, int64_t step, int keep);
/* Once a watch round: a finished write recorded (the ledger's ckpt, or its failure said), the
 * next begun. */
void sup_snapsave_tick(sup *s);
/* Every write requested so far finished (before the snapshot directory is removed, before a
 * launch whose ranks write their own checkpoints, at the end). 1 if a write ever failed for
 * the disk (a storage error: the job cannot end as finished). `finished`: the last launch
 * finished (a storage failure it saw is then recorded here, with no verdict to record it). */
int sup_snapsave_drain(sup *s, int finished);

/* ---- pending.c ----------------------------------------------------------------------------- */

/* An incident whose recovery is measured when the job next applies a step. */
void sup_pend(sup *s, rk_incident *i);
/* A relaunch's incident: pending, with the steps each rank had done (its lost steps). */
void sup_pend_relaunch(sup *s, rk_incident *i);
/* The job is back at work: every pending incident recovered now. */
void sup_resolve_pending(sup *s, int64_t resumed_from);
/* The job ends without having recovered: the pending incidents written without a recovery. */
void sup_flush_pending(sup *s);

#endif
