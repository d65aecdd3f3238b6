/*
 * What a launch's end means (policy.c): the supervisor's classification of a failure, a pure
 * function of what the watch loop saw (the launcher's exit status, what each rank said over
 * the heartbeat protocol, whether a stop was sent). No I/O, no clock: unit-tested in
 * tests/test_policy.c. The loop in watch.c gathers an rk_sup_seen and acts on the verdict.
 */
#ifndef RK_SUPERVISOR_POLICY_H
#define RK_SUPERVISOR_POLICY_H

/* What the watch loop saw during one launch. Ranks are this launch's, -1 = none / unknown. */
typedef struct rk_sup_seen {
    int ranks;           /* ranks of the launch */
    int hellos;          /* ranks that said hello */
    int done;            /* ranks that said bye "done" */
    int exited;          /* the launcher exited by itself (status is its exit status); 0: the
                          * supervisor tore the launch down first */
    int status;          /* the launcher's exit status, 128 + N for signal N */
    int stop_sent;       /* the supervisor asked the ranks to stop (drain, shrink, interrupt) */
    int interrupted;     /* rk run itself was interrupted */
    int hang;            /* a rank made no progress for the heartbeat timeout */
    int hang_rank;       /*   the rank that made the least progress; -1: all equally stuck */
    int startup_timeout; /* not every rank said hello within the startup timeout */
    int lost_rank;       /* the first rank whose connection closed without bye */
    char exit_kind[32];  /* the first event with action "exit" (a rank leaving with that
                          * failure): its kind, "" if none */
    int exit_rank;       /*   the rank that sent it */
    int storage_rank;    /* the first rank whose exit event had kind "storage" */
} rk_sup_seen;

/* An rk_sup_seen with nothing seen: every rank field -1. */
void rk_sup_seen_init(rk_sup_seen *s, int ranks);

typedef enum rk_sup_next {
    RK_SUP_FINISHED,   /* every rank finished: rk run exits 0 */
    RK_SUP_RELAUNCH,   /* relaunch from the latest good checkpoint */
    RK_SUP_STOP,       /* relaunching cannot help: rk run stops with verdict.status */
    RK_SUP_INTERRUPTED /* rk run was interrupted: exit 130 */
} rk_sup_next;

typedef struct rk_sup_verdict {
    rk_sup_next next;
    const char *kind; /* the incident: crash, hang, commfail, guard_failed, usage, storage,
                       * never_connected, or the kind of a rank's exit event; NULL for none
                       * (finished, or a clean stop to drain or shrink the job) */
    int rank;         /* the rank held responsible, -1 none */
    int counted;      /* counts against the rank's device (towards its quarantine) */
    int status;       /* rk run's exit status for RK_SUP_STOP (and FINISHED, INTERRUPTED) */
    const char *why;  /* a phrase for the message: what the verdict rests on */
} rk_sup_verdict;

/* The verdict for a launch that ended with what *s says. Rules, first match:
 *   interrupted                                   -> interrupted, 130
 *   exited 0 and every rank said bye "done"       -> finished
 *   an exit event "storage" or exit status 6      -> stop, 1: storage (never a device's)
 *   exit status 2, or a first exit event "usage"  -> stop, 2: usage
 *   a stop was sent, exited 0 or 4, no exit event -> relaunch, no incident
 *   a hang seen                                   -> hang of hang_rank
 *   a rank never said hello (startup timeout, or
 *   the launcher exited first)                    -> never_connected, nobody's device
 *   exit status 3 / 5                             -> commfail / guard_failed
 *   an exit event                                 -> its kind
 *   otherwise                                     -> crash
 * A relaunch's rank is the exit event's, else the first rank lost, else -1 (then nothing is
 * counted). */
void rk_sup_classify(const rk_sup_seen *s, rk_sup_verdict *v);

#endif
