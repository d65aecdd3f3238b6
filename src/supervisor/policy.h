/*
 * The supervisor's decisions (policy.c): what a launch's end means, when a device is
 * quarantined, whether the job relaunches, which devices the next launch runs on (the shrink),
 * which rank is drained, when a hang is seen and when a failing launch is torn down. Pure
 * functions of what the watch loop saw: no I/O, no clock (times are passed in), no globals.
 * Unit-tested in tests/test_policy.c and tests/test_policy_launch.c. The loop (watch.c,
 * conns.c, drain.c, run.c) gathers what it sees, asks here and acts on the answer.
 */
#ifndef RK_SUPERVISOR_POLICY_H
#define RK_SUPERVISOR_POLICY_H

#include <stddef.h>
#include <stdint.h>

#define RK_SUP_MAX_DEVICES 256 /* devices a job may name (rk run --devices, the hosts' slots) */

/* ---- kinds --------------------------------------------------------------------------------- */

/* What happened. A worker's word (an event's "kind", docs/protocol.md) is read once, at the
 * edge, by rk_sup_kind_of; every decision below uses the enum. */
typedef enum rk_sup_kind {
    RK_SUP_KIND_NONE = 0,        /* nothing: a finished launch, or a clean stop */
    RK_SUP_KIND_CRASH,           /* a rank vanished, or the launcher exited without bye */
    RK_SUP_KIND_HANG,            /* no progress for the heartbeat timeout */
    RK_SUP_KIND_COMMFAIL,        /* exit status 3 */
    RK_SUP_KIND_GUARD_FAILED,    /* exit status 5 */
    RK_SUP_KIND_USAGE,           /* exit status 2: the worker rejects its arguments or input */
    RK_SUP_KIND_STORAGE,         /* exit status 6: the worker cannot write its files */
    RK_SUP_KIND_NEVER_CONNECTED, /* a rank never said hello */
    /* in-process events that are the data until proven otherwise: never a device's */
    RK_SUP_KIND_LOSS_SPIKE,
    RK_SUP_KIND_SPIKE_KEPT,
    RK_SUP_KIND_GRAD_SUSPECT,
    RK_SUP_KIND_GRAD_KEPT,
    /* an exit event "exception": the job's own code raised an error that is not a device's
     * or the network's (a bug in the script); relaunched, counted against no device */
    RK_SUP_KIND_EXCEPTION,
    /* an exit event "ckpt_refused" (then exit 5): the job's own checkpoint rule refused its
     * state (a parameter or optimiser value not finite); the job's, not a device's: relaunched
     * from the last good checkpoint, counted against no device, stopped when it repeats */
    RK_SUP_KIND_CKPT_REFUSED,
    /* a host of a multi-host job lost (its agent silent, its link or its process gone):
     * counted against the node (cluster.c), not a device */
    RK_SUP_KIND_NODE_LOST,
    RK_SUP_KIND_OTHER /* any other word a worker sent (nan, grad_outlier, ...): its own */
} rk_sup_kind;

/* The kind a worker's word names, for the words that change what rk run does (usage,
 * storage, loss_spike, spike_kept, grad_suspect, grad_kept, exception, ckpt_refused);
 * RK_SUP_KIND_OTHER for any
 * other word (the worker's own: commfail, nan, ...), and for NULL or ""; never NONE. */
rk_sup_kind rk_sup_kind_of(const char *word);
/* The word for a kind ("crash", "hang", ...); NULL for NONE and OTHER (the worker's own word
 * names an OTHER). */
const char *rk_sup_kind_name(rk_sup_kind k);
/* 1 if an in-process event of this kind counts against its blamed rank's device. */
int rk_sup_kind_counted(rk_sup_kind k);
/* 1 if an event's action word says the rank is about to exit with its failure ("exit"). */
int rk_sup_action_exits(const char *action);

/* ---- a launch's end ------------------------------------------------------------------------ */

/* What the watch loop saw during one launch. Ranks are this launch's, -1 = none / unknown. */
typedef struct rk_sup_seen {
    int ranks;               /* ranks of the launch */
    int hellos;              /* ranks that said hello */
    int done;                /* ranks that said bye "done" */
    int exited;              /* the launcher exited by itself (status is its exit status); 0: the
                              * supervisor tore the launch down first */
    int status;              /* the launcher's exit status, 128 + N for signal N */
    int stop_sent;           /* the supervisor asked the ranks to stop (drain, shrink, interrupt) */
    int interrupted;         /* rk run itself was interrupted */
    int hang;                /* a rank made no progress for the heartbeat timeout */
    int hang_rank;           /*   the rank that made the least progress; -1: all equally stuck */
    int startup_timeout;     /* not every rank said hello within the startup timeout */
    int lost_rank;           /* the first rank whose connection closed without bye */
    int node_lost;           /* a multi-host job's node lost during the launch, -1 none */
    int node_rank;           /*   its first rank in the launch */
    int crash_rank;          /* a rank that announced an injected crash (inject event): the
                              * culprit of the closings that follow, whichever is read first */
    int failed_rank;         /* the rank whose process the launcher saw end first with a
                              * failure (the local keeper's waitpid, an agent's), -1 unknown:
                              * the culprit of the closings that follow (a rank's connection
                              * may outlive it in a child that holds it: a DataLoader worker) */
    rk_sup_kind exit_kind;   /* the first event with action "exit" (a rank leaving with that
                              * failure): its kind, NONE if none */
    int exit_rank;           /*   the rank that sent it */
    int storage_rank;        /* the first rank whose exit event had kind "storage" (0 too when
                              * rk run could not write a checkpoint from the snapshots) */
    int ckpt_failed;         /* rk run itself could not write a checkpoint (snapsave.c): no
                              * rank exits for it, the launch is torn down at once */
    int64_t exit_step;       /* the first exit event's step, -1 none */
    const char *exit_detail; /* ... and its detail (the loop's string), NULL none */
    int dup_rank;            /* a rank that two processes of the launch said hello as, neither
                              * started by the other (a worker that takes its rank from a
                              * variable the launcher does not set): -1 none */
} rk_sup_seen;

/* An rk_sup_seen with nothing seen: every rank field -1, no exit event. */
void rk_sup_seen_init(rk_sup_seen *s, int ranks);

/* What rk run does next. */
typedef enum rk_sup_next {
    RK_SUP_FINISHED,   /* every rank finished: rk run exits 0 */
    RK_SUP_RELAUNCH,   /* relaunch from the latest good checkpoint */
    RK_SUP_STOP,       /* relaunching cannot help: rk run stops (end says why) */
    RK_SUP_INTERRUPTED /* rk run was interrupted: exit 130 */
} rk_sup_next;

/* How the whole job ended (rk_sup_report.end); cli/cmd_run.c maps it to an exit status. */
typedef enum rk_sup_end {
    RK_SUP_END_FINISHED = 0,    /* every rank finished: 0 */
    RK_SUP_END_FAILED,          /* a failure rk run could not get past (a setup error): 1 */
    RK_SUP_END_OUT_OF_RESTARTS, /* it failed again after --max-restarts relaunches: 1 */
    RK_SUP_END_TOO_FEW_DEVICES, /* fewer healthy devices than --min-ranks (or none): 1 */
    RK_SUP_END_STORAGE,         /* a worker cannot write its files (exit 6): 1 */
    RK_SUP_END_USAGE,           /* a worker rejects its arguments or input (exit 2), or
                                 * does not speak the protocol (all exit 0, no hello): 2 */
    RK_SUP_END_BAD_INPUT,       /* rk run's own input: the launcher cannot be executed, the
                                 * health gate cannot read its --predictor: 2 */
    RK_SUP_END_INTERRUPTED      /* rk run was interrupted: 130 */
} rk_sup_end;

typedef struct rk_sup_verdict {
    rk_sup_next next;
    rk_sup_kind kind; /* the incident; NONE for none (finished, interrupted, or a clean stop
                       * to drain or shrink the job); OTHER: the exit event's own word */
    int rank;         /* the rank held responsible, -1 none */
    int counted;      /* counts against the rank's device (towards its quarantine) */
    rk_sup_end end;   /* for FINISHED, STOP and INTERRUPTED: how the job ends */
    const char *why;  /* a phrase for the message: what the verdict rests on */
} rk_sup_verdict;

/* The verdict for a launch that ended with what *s says. Rules, first match:
 *   interrupted                                   -> interrupted
 *   two processes said hello as one rank          -> stop: usage of dup_rank, end USAGE (every
 *                                                    launch of the worker would do the same)
 *   every rank said bye "done"                    -> finished (whatever the exit status:
 *                                                    a rank killed after its bye redoes
 *                                                    nothing when relaunched)
 *   an exit event "storage" or exit status 6      -> stop: storage (never a device's)
 *   exit status 2, or a first exit event "usage"  -> stop: usage
 *   exited 0, no rank said hello, no stop sent,
 *   no exit event                                 -> stop: never_connected, end USAGE (a
 *                                                    program that does not speak the protocol)
 *   a stop was sent, exited 0 or 4, no exit event -> relaunch, no incident
 *   a node lost                                   -> node_lost of node_rank, not counted
 *                                                    (the node's failure is counted instead)
 *   a hang seen                                   -> hang of hang_rank
 *   a rank never said hello (startup timeout, or
 *   the launcher exited first)                    -> never_connected, nobody's device
 *   an exit event "ckpt_refused"                  -> ckpt_refused, nobody's device (before
 *                                                    its exit status 5)
 *   exit status 3 / 5                             -> commfail / guard_failed
 *   an exit event "exception"                     -> exception, nobody's device
 *   an exit event                                 -> its kind
 *   otherwise                                     -> crash
 * A relaunch's rank is the exit event's, else the rank that announced an injected crash,
 * else the one the launcher saw fail first, else the first rank lost, else -1 (then nothing
 * is counted). */
void rk_sup_classify(const rk_sup_seen *s, rk_sup_verdict *v);

/* What a relaunch remembers of the launch that ended, to see the same failure twice in a
 * row (rk_sup_repeat). */
typedef struct rk_sup_mark {
    rk_sup_kind kind; /* EXCEPTION: an exception exit; CKPT_REFUSED: a checkpoint the job's own
                       * rule refused; NEVER_CONNECTED: no rank said hello and
                       * the launcher exited non-zero by itself; NONE: anything else */
    int64_t step;     /* EXCEPTION, CKPT_REFUSED: the exit event's step */
    int status;       /* NEVER_CONNECTED: the launcher's exit status */
    char detail[520]; /* EXCEPTION, CKPT_REFUSED: the exit event's detail */
} rk_sup_mark;

/* The mark of a launch judged *v (a relaunch) after what *s says. */
void rk_sup_mark_of(const rk_sup_seen *s, const rk_sup_verdict *v, rk_sup_mark *m);

/* The repeat stops, for a launch that ended for a relaunch with mark *cur after a launch
 * with mark *prev (NULL or kind NONE: the first launch, or one that ended otherwise):
 *   both EXCEPTION, the same step and the same detail -> stop: an error in the job
 *   both CKPT_REFUSED, the same step and detail       -> stop: the job's state, not a device
 *   both NEVER_CONNECTED with the same exit status    -> stop: the worker cannot start
 * A startup timeout without hello has no mark: it is relaunched as before. On a stop, 1:
 * *v becomes RK_SUP_STOP with end FAILED, its why the sentence in why[cap]; else 0, *v kept. */
int rk_sup_repeat(const rk_sup_mark *prev, const rk_sup_mark *cur, rk_sup_verdict *v, char *why,
                  size_t cap);

/* ---- devices ------------------------------------------------------------------------------- */

/* One device's standing over the whole job. */
typedef struct rk_sup_dev {
    int fails;       /* failures counted against it */
    int quarantined; /* set aside for the rest of the job (failures) */
    int drained;     /* drained during a run: out for the rest of the job (health) */
    int held;        /* left out of a launch by the health gate: back only with a margin */
} rk_sup_dev;

/* A failure counted against device *d: 1 if it quarantines it now (it reached `threshold`
 * failures and was not already quarantined; d->quarantined is then set), else 0. */
int rk_sup_count_failure(rk_sup_dev *d, int threshold);
/* 1 if one more failure would quarantine device *d (rk_sup_count_failure would return 1):
 * recovery in place does not replace a rank whose device this failure sets aside. */
int rk_sup_would_quarantine(const rk_sup_dev *d, int threshold);
/* After a quarantine: 1 if the job is to be stopped cleanly to shrink it now (it is healthy:
 * no failure being handled, no stop sent yet), 0 if the launch is ending anyway. */
int rk_sup_shrink_now(int failing, int stop_sent);

/* What the health gate read for a device (or rank) just now. Without a gate: lost 0, fatal 0,
 * score 100, prob -1. */
typedef struct rk_sup_health {
    int lost;    /* the GPU is gone (off the bus, dead) */
    int fatal;   /* it failed since the last reading (gone or an uncorrectable ECC error) */
    int score;   /* 0..100 */
    double prob; /* the predictor's probability of failing within its horizon; -1 unknown */
} rk_sup_health;

/* The health rules of a job. */
typedef struct rk_sup_rules {
    double threshold;         /* a score below this leaves the device out or drains it */
    double margin;            /* a device held out comes back only this far above it */
    int predictor;            /* 1: a predictor gives probabilities */
    double drain_probability; /* ... and a device at or above this is left out or drained */
} rk_sup_rules;

/* Why a device is not in the next launch. */
typedef enum rk_sup_why {
    RK_SUP_IN = 0,          /* in the launch */
    RK_SUP_OUT_QUARANTINED, /* quarantined (no message: said when it was) */
    RK_SUP_OUT_DRAINED,     /* drained (no message: said when it was) */
    RK_SUP_OUT_LOST,        /* the GPU is gone */
    RK_SUP_OUT_SCORE,       /* its score is below what it needs (pick.need) */
    RK_SUP_OUT_PREDICTED,   /* the predictor expects it to fail */
    RK_SUP_NOT_NEEDED       /* not looked at: the launch had its ranks before it */
} rk_sup_why;

/* The choice of one device, for the loop's messages. */
typedef struct rk_sup_pick {
    rk_sup_why why;
    double need; /* the score it needed (the threshold, plus the margin if it was held) */
} rk_sup_pick;

/* Pick the devices of the next launch (the shrink) among the `ndev` devices: those that are
 * neither quarantined nor drained, not lost, score at least the threshold (plus the margin if
 * held out before), and, with a predictor, are below the drain probability. Placement is
 * stable: rank i keeps its device of the last launch (prev[i], i < nprev) while that device
 * may stay in, so a relaunch moves only the ranks whose devices went out (their snapshots in
 * memory stay on their nodes); the other ranks take the first such devices in order. When
 * fewer than `want` are found (the job shrinks and its ranks are numbered afresh), or when
 * `group` (each device's node, NULL on one host) is given and some node's ranks would not be
 * consecutive (the launchers across hosts place a node's ranks together), the devices picked
 * go in device order. Sets or clears each looked-at device's held; the picked devices'
 * indices in dev[] (at least want slots), each device's reason in pick[ndev]
 * (RK_SUP_NOT_NEEDED: not looked at). Returns how many. */
int rk_sup_pick_devices(const rk_sup_rules *r, int ndev, const rk_sup_health *h, rk_sup_dev *st,
                        int want, const int *prev, int nprev, const int *group, int *dev,
                        rk_sup_pick *pick);

/* The relaunch decision after a launch that ended for a relaunch: RK_SUP_RELAUNCH, or
 * RK_SUP_STOP with *end = OUT_OF_RESTARTS when `restarts` relaunches reached `max_restarts`.
 * A second call after picking devices (picked >= 0) stops with TOO_FEW_DEVICES when fewer
 * than `min_ranks` (or none) were picked; picked < 0: not picked yet. */
rk_sup_next rk_sup_relaunch(int restarts, int max_restarts, int picked, int min_ranks,
                            rk_sup_end *end);

/* ---- during a launch ----------------------------------------------------------------------- */

/* 1 if the health gate is due a reading now: a gate, no failure being handled, no stop sent,
 * every rank said hello (a drain needs every rank to hear the stop) and `interval_s` passed
 * since the last reading at `last`. */
int rk_sup_gate_due(int gate, int failing, int stop_sent, int hellos, int ranks, double now,
                    double last, double interval_s);

/* The rank to drain, from the health of each of the launch's `n` ranks: first any rank the
 * predictor expects to fail (RK_SUP_OUT_PREDICTED), else the first whose score fell below the
 * threshold (RK_SUP_OUT_SCORE), in rank order; its reason in *why. -1 (and RK_SUP_IN) if
 * none. Fatal readings are not drained: the loop delivers them as the failure would. */
int rk_sup_drain_rank(const rk_sup_rules *r, int n, const rk_sup_health *h, rk_sup_why *why);

/* The suspects of a hang: of the launch's `n` ranks, those with no connection (progress[r]
 * < 0) and, when not all made the same progress, those that made the least (progress is
 * 2 x steps done, +1 while in a collective). Marks them in stuck[n]; the first into *first
 * (-1 if none); returns how many. */
int rk_sup_stuck_ranks(int n, const int64_t *progress, int *stuck, int *first);

/* 1 if a failing launch is to be torn down now: a hang, a startup timeout or a rank said
 * hello by two processes (*seen) at once; a rank that vanished or said it exits once the
 * launcher had `wait_s` since the failure was seen (at `since`) to exit by itself with the
 * rank's status. */
int rk_sup_teardown_due(const rk_sup_seen *seen, double now, double since, double wait_s);

/* ---- a launch over many hosts ------------------------------------------------------------- */

/* What the node link said of one node since a failure was seen (cluster.c gathers it). */
typedef enum rk_sup_link {
    RK_SUP_LINK_OUT = 0, /* the node runs no rank of the launch */
    RK_SUP_LINK_ASKED,   /* asked whether it is alive (a PING), no answer yet */
    RK_SUP_LINK_ALIVE,   /* answered after the failure was seen: its host is alive */
    RK_SUP_LINK_LOST     /* lost during the launch (silent, its link or its agent gone) */
} rk_sup_link;

/* Who is to blame for a failure seen in a launch over many hosts. */
typedef enum rk_sup_blame {
    RK_SUP_BLAME_WAIT,   /* not known yet: ask again after the link's next news */
    RK_SUP_BLAME_NODE,   /* a node was lost: the cause (*node); the failure seen is its effect */
    RK_SUP_BLAME_AS_SEEN /* every node of the launch is alive: judge what the ranks did */
} rk_sup_blame;

/* A failure seen at `since` (a rank's end, the launcher's exit) in a launch over `n` nodes,
 * link[k] what the link said of node k since. A host that dies takes its ranks with it and
 * the launcher ends the ranks of the sound hosts: their ends may be read before the dead
 * host's link closes, so a failure is blamed on a device only once every node of the launch
 * said it is alive, and a node lost meanwhile is the cause:
 *   a node lost (the first in k order into *node)   -> NODE
 *   every node out or alive                         -> AS_SEEN
 *   a node asked, not answered, wait_s not passed   -> WAIT
 *   ... wait_s passed since `since`                 -> AS_SEEN (a node that neither answers nor
 *                                                      falls silent for the node timeout: the
 *                                                      failure stands as seen)
 * *node is -1 but for NODE. */
rk_sup_blame rk_sup_node_blame(int n, const rk_sup_link *link, double now, double since,
                               double wait_s, int *node);

/* What to do about an interruption (SIGINT, SIGTERM, SIGHUP): `signals` seen, the first at
 * `since`, with `grace_s` (--stop-grace) for the ranks to checkpoint and stop. */
typedef enum rk_sup_intr {
    RK_SUP_INTR_NONE,      /* not interrupted, or waiting for the ranks to stop */
    RK_SUP_INTR_SEND_STOP, /* ask the ranks to checkpoint and stop (once) */
    RK_SUP_INTR_AGAIN,     /* a second signal: tear the job down at once */
    RK_SUP_INTR_TEAR_DOWN  /* the grace ran out (or is 0): tear the job down */
} rk_sup_intr;
rk_sup_intr rk_sup_interrupt(int signals, int stop_sent, double now, double since, double grace_s);

#endif
