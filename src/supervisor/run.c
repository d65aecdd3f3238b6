/*
 * The job behind `rk run` (supervisor.h): the heartbeat socket, each launch's environment,
 * the relaunches (policy.h decides; watch.c watches one launch; pending.c keeps the incidents
 * waiting for the job to be back at work), and the report the caller prints (cli/cmd_run.c).
 */
#define _GNU_SOURCE /* nftw */
#include "supervisor/sup.h"

#include "base/phase.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

volatile sig_atomic_t rk_sup_interrupted;
static void on_signal(int sig)
{
    (void)sig;
    rk_sup_interrupted++;
}

/* ---- one launch ---------------------------------------------------------------------------- */

static int open_socket(sup *s, rk_err *err)
{
    return rk_sup_private_socket("rk-run", s->dir, sizeof s->dir, s->sock, sizeof s->sock,
                                 &s->listen_fd, err);
}

static int start_launch(sup *s, rk_err *err)
{
    rk_phase_mark("sup.start", s->launch_no, -1); /* RK_TRACE_LAUNCH (base/phase.h) */
    memset(&s->l, 0, sizeof s->l);
    s->l.life = s->l.failed = s->l.orders = -1;
    sup_close_conns(s);
    s->nconn = 0;
    s->ls = SUP_LAUNCH_RUNNING; /* (start) -> RUNNING */
    s->start_step = -1;
    rk_sup_seen_init(&s->seen, s->n);
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++) {
        s->hello_step[r] = -1;
        s->claim_pid[r] = 0;
        s->claim_node[r] = -1;
    }
    s->dup_detail[0] = '\0';
    s->restore = RK_HB_RESTORE_UNSAID;
    s->restore_said = 0;
    if (s->snap_off && s->snap_dir[0]) { /* a rank said snapshot_off: disk only from here on */
        rk_err e = {0};
        sup_snapsave_drain(s, 0); /* its writes read the directory */
        if (rk_snap_dir_remove(s->snap_dir, &e))
            sup_say(s, "snapshots: %s", e.msg);
        s->snap_dir[0] = '\0';
    }
    memset(&s->v, 0, sizeof s->v);
    s->v.next = RK_SUP_RELAUNCH;
    s->v.rank = -1;
    s->vdetail[0] = s->storage_detail[0] = s->exit_word[0] = s->exit_detail[0] = s->stacks[0] =
        '\0';
    const char *ids[RK_SUP_MAX_DEVICES]; /* the steps file: rank i on ids[i] */
    for (int r = 0; r < s->n && r < RK_SUP_MAX_DEVICES; r++)
        ids[r] = s->o->devices[s->dev[r]];
    rk_ledger_launch_rec(&s->g, s->launch_no, ids, s->n);
    char done[RK_SUP_DONE_MAX]; /* RK_INJECT_DONE: the injections that already fired */
    size_t u = 0;
    done[0] = '\0';
    for (size_t i = 0; s->o->inject && i < rk_inject_count(s->spec) && u + 12 < sizeof done; i++)
        if (s->fired[i])
            u += (size_t)snprintf(done + u, sizeof done - u, u ? ",%zu" : "%zu", i);
    sup_inplace_reset(s); /* after the snapshot directory's fate is known */
    rk_sup_launch l = {.no = s->launch_no, .n = s->n, .dev = s->dev, .done = done};
    s->t_launch = rk_ledger_now(&s->g);
    int rc = s->b.ops->start(s->b.ctx, &l, err);
    rk_phase_mark("sup.started", s->launch_no, -1);
    return rc;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(path);
    return 0;
}

/* The incident for the verdict on the launch that ended (none for a clean stop): a relaunch
 * is pending until the job is back at work (its recovery is measured then), a stop is final.
 * Returns its index in the ledger, SIZE_MAX if none. */
static size_t record_verdict(sup *s, int stop)
{
    if (s->v.kind == RK_SUP_KIND_NONE)
        return SIZE_MAX;
    int r = s->v.rank;
    const char *kind = sup_verdict_kind(s);
    /* the device is named only when it is blamed; a node lost: its host */
    const char *dev = s->v.counted ? sup_devname(s, r) : "";
    if (s->v.kind == RK_SUP_KIND_NODE_LOST && s->b.ops->node_name)
        dev = s->b.ops->node_name(s->b.ctx, s->dev[r]);
    rk_incident *i =
        rk_ledger_add(&s->g, kind, r, dev, stop ? "stop" : "relaunch", "%s", s->vdetail);
    if (!i)
        return SIZE_MAX;
    if (sup_failing(s))
        i->t = s->ftime; /* when it was seen, not when the teardown ended */
    if (s->v.kind == RK_SUP_KIND_HANG)
        snprintf(i->stacks, sizeof i->stacks, "%s", s->stacks);
    size_t at = (size_t)(i - s->g.inc);
    if (stop) {
        rk_ledger_write(&s->g, i);
        return at;
    }
    sup_say(s, "%s: %s", kind, s->vdetail);
    sup_pend_relaunch(s, i);
    if (s->v.counted)
        sup_count_failure(s, r, kind);
    return at;
}

/* No relaunch after all (out of restarts, too few devices): the incident at `at` says stop. */
static void no_relaunch(sup *s, size_t at)
{
    if (at < s->g.ninc && !s->g.inc[at].written)
        snprintf(s->g.inc[at].action, sizeof s->g.inc[at].action, "stop");
    sup_flush_pending(s);
}

/* ---- the job ------------------------------------------------------------------------------- */

/* 0 if `dir` is safe to hold the job's private stack directory: a directory owned by the
 * effective uid or root, and writable by group or others only with the sticky bit (/tmp);
 * else why in why[cap]. */
int rk_sup_dir_safe(const char *dir, char *why, size_t cap)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return snprintf(why, cap, "%s", strerror(errno)), -1;
    if (!S_ISDIR(st.st_mode))
        return snprintf(why, cap, "not a directory"), -1;
    if (st.st_uid != geteuid() && st.st_uid != 0)
        return snprintf(why, cap, "owned by uid %ld, not by this user (uid %ld) or root",
                        (long)st.st_uid, (long)geteuid()),
               -1;
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
        return snprintf(why, cap, "writable by %s without the sticky bit",
                        st.st_mode & S_IWOTH ? "others" : "its group"),
               -1;
    return 0;
}

/* RK_STACK_DIR: a private directory of this job (mkdtemp: 0700, a random name) inside
 * --stack-dir (made and checked by cli/cmd_run.c), else inside the directory of --events
 * when that one is safe (rk_sup_dir_safe), else "stacks" in the job's private directory
 * (removed at the end with the socket's). Absolute, as the ranks may change directory. */
static int open_stack_dir(sup *s, rk_err *err)
{
    char want[4096], why[160];
    s->stack_parent = 0;
    if (s->o->stack_dir)
        snprintf(want, sizeof want, "%s", s->o->stack_dir);
    else if (s->o->events_path) {
        snprintf(want, sizeof want, "%s", s->o->events_path);
        char *slash = strrchr(want, '/');
        if (!slash)
            snprintf(want, sizeof want, ".");
        else if (slash == want)
            want[1] = '\0';
        else
            *slash = '\0';
        if (rk_sup_dir_safe(want, why, sizeof why) != 0) {
            sup_say(s, "stack dumps not in the --events directory %s (%s): in rk run's own", want,
                    why);
            snprintf(want, sizeof want, "%s", s->dir);
        }
    } else
        snprintf(want, sizeof want, "%s", s->dir);
    char real[4096];
    if (!realpath(want, real))
        return rk_err_set(err, RK_EIO, "stack directory %s: %s", want, strerror(errno));
    if (strcmp(want, s->dir) == 0) {
        if ((size_t)snprintf(s->stack_dir, sizeof s->stack_dir, "%.4000s/stacks", real) >=
            sizeof s->stack_dir)
            return rk_err_set(err, RK_EINVAL, "stack directory %s: path too long", real);
    } else if ((size_t)snprintf(s->stack_dir, sizeof s->stack_dir, "%s/rk-stacks.%ld.XXXXXX", real,
                                (long)getpid()) >= sizeof s->stack_dir)
        return rk_err_set(err, RK_EINVAL, "stack directory %s: path too long", real);
    else
        s->stack_parent = 1; /* kept at the end if a rank wrote into it */
    if (s->stack_parent ? !mkdtemp(s->stack_dir) : mkdir(s->stack_dir, 0700) != 0)
        return rk_err_set(err, RK_EIO, "stack directory %s: %s", s->stack_dir, strerror(errno));
    return RK_OK;
}

/* At the end: the private stack directory without the empty dumps the ranks opened ahead
 * (rekindle.stacks does), and removed if nothing else is left; kept with the dumps that hold
 * stacks (the events name them). */
static void tidy_stack_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            char path[4400];
            struct stat st;
            if (strncmp(e->d_name, "stacks-rank", 11) == 0 &&
                (size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < sizeof path &&
                lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0)
                unlink(path);
        }
        closedir(d);
    }
    rmdir(dir); /* fails, and keeps it, while anything is left */
}

/* The devices of this launch, as "0,2,3", into list[cap]. */
static const char *device_list(const sup *s, char *list, size_t cap)
{
    size_t used = 0;
    list[0] = '\0';
    for (int r = 0; r < s->n && used + 2 < cap; r++)
        used +=
            (size_t)snprintf(list + used, cap - used, r ? ",%s" : "%s", s->o->devices[s->dev[r]]);
    return list;
}

/* Open the health gate and check it knows every device. RK_OK with s->gate (NULL: none, or
 * none here with --health auto); else the report says why. */
static int open_gate(sup *s, rk_sup_report *rep)
{
    const rk_sup_opts *o = s->o;
    if (!o->health || o->hosts) /* over the hosts each agent reads its own (cluster.c) */
        return RK_OK;
    rk_err err = {0};
    int rc = rk_gate_open(&s->gate, o, &err);
    if (rc) {
        if (strcmp(o->health, "auto") != 0) {
            rk_err_set(&rep->err, rc, "health gate: %s", err.msg);
            /* bad input (a broken --predictor): exit 2, as rk exporter and rk doctor */
            if (rc == RK_EFORMAT || rc == RK_EINVAL || rc == RK_EMISMATCH || rc == RK_ENOENT)
                rep->end = RK_SUP_END_BAD_INPUT;
            return rc;
        }
        sup_say(s, "health gate off: %s", err.msg); /* no NVML here: run without it */
        s->gate = NULL;
        return RK_OK;
    }
    for (int d = 0; d < o->ndevices; d++)
        if (!rk_gate_knows(s->gate, o->devices[d]))
            return rk_err_set(&rep->err, RK_EINVAL,
                              "health gate: device '%s' is not a GPU index of the %s backend",
                              o->devices[d], rk_gate_backend(s->gate));
    int sim = strcmp(rk_gate_backend(s->gate), "sim") == 0;
    char clock[96] = "";
    if (sim && o->sim_step_s > 0)
        snprintf(clock, sizeof clock, "; they age %g simulated s a step of the job", o->sim_step_s);
    else if (sim)
        snprintf(clock, sizeof clock, "; they age %g simulated s a second", o->health_time_scale);
    sup_say(s, "health gate: %s GPUs%s, threshold %.0f, read every %.1f s%s",
            rk_gate_backend(s->gate), sim ? " (simulated)" : "", o->health_threshold,
            o->health_interval_s, clock);
    return RK_OK;
}

/* The job's snapshot directory (docs/recovery.md) when --recovery memory, a checkpoint
 * directory and this host's launcher running every rank here; else recovery from disk, said
 * once when memory was asked for but cannot be had. RK_SNAP_PARENT: where to make it
 * (default /dev/shm). */
/* Snapshot directories of this user that jobs killed before they could remove them left under
 * `parent` (their maker gone: rk_snap_dir_sweep): removed, and said, so that a node's memory
 * does not fill with them. */
static void sup_snap_sweep(sup *s, const char *parent)
{
    int n = 0;
    uint64_t b = 0;
    char names[600];
    rk_err e = {0};
    if (rk_snap_dir_sweep(parent, &n, &b, names, sizeof names, &e) == RK_OK && n > 0)
        sup_say(s, "removed %d snapshot director%s left by jobs that were killed (%.1f MiB): %s", n,
                n == 1 ? "y" : "ies", (double)b / (1024.0 * 1024.0), names);
}

static void open_snap_dir(sup *s)
{
    const rk_sup_opts *o = s->o;
    s->snap_dir[0] = '\0';
    if (o->recovery == RK_SUP_RECOVERY_INPLACE && (!o->ckpt_dir || o->launcher != RK_LAUNCH_LOCAL))
        sup_say(s,
                "recovery in place is off: it needs %s (docs/recovery.md, \"In place\"); a "
                "failure relaunches the job",
                !o->ckpt_dir ? "--ckpt-dir" : "--launcher local");
    if (o->recovery == RK_SUP_RECOVERY_DISK || !o->ckpt_dir)
        return;
    if (o->hosts && s->b.ops->snap_dirs &&
        (o->launcher == RK_LAUNCH_MPIRUN || o->launcher == RK_LAUNCH_LOCAL)) {
        s->g.snapshots = "on"; /* each node's agent keeps its own (one mpirun across the hosts,
                                * or the agents start the ranks) */
        sup_say(s, "recovery from memory: each host's agent keeps its ranks' snapshots in a "
                   "directory of its node (a relaunch restores them when every rank has the "
                   "agreed step and it is at least as new as the checkpoints on disk)");
        if (o->recovery == RK_SUP_RECOVERY_INPLACE)
            sup_say(s, "recovery in place is not built across hosts: a failure relaunches every "
                       "rank, from the nodes' memory");
        return;
    }
    if (o->hosts || s->b.ops != &rk_sup_launcher_ops || sup_may_span_hosts(o)) {
        sup_say(s,
                "recovery from memory is not built yet for ranks on several hosts (%s): "
                "relaunches restore from disk checkpoints",
                o->hosts                           ? "--hosts"
                : o->launcher == RK_LAUNCH_SRUN    ? "srun"
                : s->b.ops != &rk_sup_launcher_ops ? "another backend"
                                                   : "the launcher arguments name hosts");
        return;
    }
    const char *parent = getenv("RK_SNAP_PARENT");
    rk_err e = {0};
    sup_snap_sweep(s, parent && *parent ? parent : NULL);
    if (rk_snap_dir_make(parent && *parent ? parent : NULL, s->snap_dir, sizeof s->snap_dir, &e)) {
        s->snap_dir[0] = '\0';
        sup_say(s, "recovery from memory off (%s): relaunches restore from disk checkpoints",
                e.msg);
        return;
    }
    s->g.snapshots = "on";
    sup_say(s,
            "recovery from memory: the ranks' snapshots in %s (a relaunch restores them when "
            "they are at least as new as the checkpoints on disk)",
            s->snap_dir);
    if (o->recovery == RK_SUP_RECOVERY_INPLACE && o->launcher == RK_LAUNCH_LOCAL)
        sup_say(s, "recovery in place: a rank of a PyTorch job that fails is replaced (by a warm "
                   "spare when one is ready) while the others keep running, when every rank's "
                   "hello says it can rejoin; else a relaunch from memory");
}

/* Launch after launch until the job finishes or cannot go on; how it ended in rep->end. */
static void run_launches(sup *s, rk_sup_report *rep)
{
    const rk_sup_opts *o = s->o;
    rk_err err = {0};
    for (;;) {
        if (start_launch(s, &err)) {
            sup_say(s, "%s", err.msg);
            /* the launcher cannot be executed: no relaunch, bad input */
            rep->end = err.code == RK_ENOENT ? RK_SUP_END_BAD_INPUT : RK_SUP_END_FAILED;
            return;
        }
        rk_sup_next oc = sup_watch(s);
        rk_phase_mark("sup.verdict", s->launch_no, -1);
        if (oc == RK_SUP_FINISHED) {
            sup_resolve_pending(s, s->start_step);
            /* the checkpoints rk run writes from the snapshots are on disk, or the job did not
             * finish: its last checkpoint is lost (a storage stop, as a rank's) */
            rep->end = sup_snapsave_drain(s, 1) ? RK_SUP_END_STORAGE : RK_SUP_END_FINISHED;
            return;
        }
        if (oc == RK_SUP_STOP) { /* relaunching cannot help */
            record_verdict(s, 1);
            sup_flush_pending(s);
            rep->end = s->v.end;
            return;
        }
        if (oc == RK_SUP_INTERRUPTED) {
            sup_flush_pending(s);
            rep->end = RK_SUP_END_INTERRUPTED;
            return;
        }
        /* the same failure as the launch before: relaunching again would only repeat it */
        rk_sup_mark mark;
        rk_sup_mark_of(&s->seen, &s->v, &mark);
        if (rk_sup_repeat(&s->prev_mark, &mark, &s->v, s->repeat_why, sizeof s->repeat_why)) {
            sup_say(s, "%s: %s; stopping: %s", sup_verdict_kind(s), s->vdetail, s->v.why);
            record_verdict(s, 1);
            sup_flush_pending(s);
            rep->end = s->v.end;
            return;
        }
        s->prev_mark = mark;
        /* a failure (or a stop to drain or shrink the job): account, then relaunch */
        size_t at = record_verdict(s, 0);
        if (rk_sup_relaunch(s->g.restarts, o->max_restarts, -1, o->min_ranks, &rep->end) ==
            RK_SUP_STOP) {
            no_relaunch(s, at);
            sup_say(s, "giving up: the job failed again after %d relaunch%s (--max-restarts %d)",
                    s->g.restarts, s->g.restarts == 1 ? "" : "es", o->max_restarts);
            return;
        }
        int n = sup_pick_devices(s);
        if (rk_sup_relaunch(s->g.restarts, o->max_restarts, n, o->min_ranks, &rep->end) ==
            RK_SUP_STOP) {
            no_relaunch(s, at);
            sup_say(s, "giving up: %d device%s left, below --min-ranks %d", n, n == 1 ? "" : "s",
                    o->min_ranks);
            return;
        }
        sup_gauge_relaunch(s); /* what the launch that ended held, before the next one */
        s->g.restarts++;       /* relaunches done */
        s->launch_no++;
        char list[512];
        sup_say(s, "relaunch %d on %d rank%s (devices %s) from the %s", s->launch_no, n,
                n == 1 ? "" : "s", device_list(s, list, sizeof list),
                s->snap_dir[0] && !s->snap_off
                    ? "node's snapshot in memory, or the latest good checkpoint if newer"
                    : "latest good checkpoint");
    }
}

static const char *outcome_word(rk_sup_end end)
{
    return end == RK_SUP_END_FINISHED      ? "finished"
           : end == RK_SUP_END_INTERRUPTED ? "interrupted"
                                           : "failed";
}

void rk_sup_run(const rk_sup_opts *o, rk_sup_report *rep)
{
    rk_sup_run_with(o, NULL, rep);
}

void rk_sup_run_with(const rk_sup_opts *o, const rk_sup_backend *b, rk_sup_report *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->end = RK_SUP_END_FAILED;
    rep->recovery_median_s = rep->recovery_max_s = -1;
    sup *s = calloc(1, sizeof *s);
    if (!s) {
        rk_err_set(&rep->err, RK_ENOMEM, "out of memory");
        rep->outcome = outcome_word(rep->end);
        return;
    }
    s->o = o;
    s->b = b ? *b : (rk_sup_backend){&rk_sup_launcher_ops, s};
    s->listen_fd = -1;
    s->l.life = s->l.failed = s->l.orders = -1;
    s->first_launch = -1;
    s->intr_t = -1;
    s->gauge_t = s->metrics_t = -1;
    s->prev_mark.kind = RK_SUP_KIND_NONE;
    s->rules = (rk_sup_rules){.threshold = o->health_threshold,
                              .margin = RK_SUP_HELD_MARGIN,
                              .predictor = o->predictor != NULL,
                              .drain_probability = o->drain_probability};
    for (int r = 0; r < RK_SUP_MAX_DEVICES; r++)
        s->pending_done[r] = -1;
    rk_err err = {0};
    if (rk_ledger_open(&s->g, o->events_path, &err) ||
        rk_ledger_open_records(&s->g, o->steps_path, o->gate_path, &err) ||
        rk_inject_parse(o->inject, &s->spec, &err) ||
        !(s->fired = calloc(rk_inject_count(s->spec) + 1, 1)) || open_socket(s, &err)) {
        if (err.msg[0])
            rep->err = err;
        else
            rk_err_set(&rep->err, RK_ENOMEM, "out of memory");
        goto out;
    }
    s->g.recovery = o->recovery == RK_SUP_RECOVERY_DISK      ? "disk"
                    : o->recovery == RK_SUP_RECOVERY_INPLACE ? "inplace"
                                                             : "memory";
    s->g.snapshots = "none"; /* open_snap_dir: "on"; a snapshot_off (conns.c): "off" */
    if (open_stack_dir(s, &err)) {
        rep->err = err;
        goto out;
    }
    if (open_gate(s, rep))
        goto out;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL); /* a closed terminal: checkpoint and stop, like TERM */
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* whatever escapes a keeper is reparented to us */
    if (s->b.ops->open && s->b.ops->open(s->b.ctx, s, &err)) {
        rep->err = err;
        rep->end = err.code == RK_EINVAL || err.code == RK_ENOENT ? RK_SUP_END_BAD_INPUT
                                                                  : RK_SUP_END_FAILED;
        goto out;
    }
    if (s->b.ops->open && rk_sup_interrupted) { /* before the first launch: nothing to stop */
        sup_say(s, "interrupted while the agents were starting");
        rep->end = RK_SUP_END_INTERRUPTED;
        goto out;
    }
    if (sup_pick_devices(s) < o->min_ranks || s->n < 1) {
        sup_say(s, "cannot start: %d healthy device%s, below --min-ranks %d", s->n,
                s->n == 1 ? "" : "s", o->min_ranks);
        rep->end = RK_SUP_END_TOO_FEW_DEVICES;
        goto out;
    }
    char desc[1024], master[400];
    const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");
    if (ma || mp)
        snprintf(master, sizeof master, "; kept from the environment:%s%.150s%s%.20s",
                 ma ? " MASTER_ADDR=" : "", ma ? ma : "", mp ? " MASTER_PORT=" : "", mp ? mp : "");
    else
        master[0] = '\0';
    if (sup_omp_one(o))
        snprintf(master + strlen(master), sizeof master - strlen(master),
                 "; OMP_NUM_THREADS=1 for each of the %d ranks sharing this host (as torchrun; "
                 "set it to choose)",
                 o->n);
    /* across hosts with mpirun: its --host is each launch's (shown as HOSTS here); with srun
     * its placement (SLURM_HOSTFILE: a rank's node a line) and the nodes it leaves out */
    int cl_mpi = o->hosts && (o->launcher == RK_LAUNCH_MPIRUN || o->launcher == RK_LAUNCH_SRUN);
    char *shown_args[72] = {"--host", "HOSTS", NULL};
    if (o->launcher == RK_LAUNCH_SRUN) {
        shown_args[0] = "--nodes=K";
        shown_args[1] = "--exclude=NODES-OUT";
        shown_args[2] = "--distribution=arbitrary";
        shown_args[3] = "--overlap";
        shown_args[4] = NULL;
    }
    for (int i = 0, k = o->launcher == RK_LAUNCH_SRUN ? 4 : 2;
         o->launcher_args && o->launcher_args[i] && i < 64; i++)
        shown_args[i + k] = o->launcher_args[i], shown_args[i + k + 1] = NULL;
    sup_say(s, "launcher %s (%s): %s; stack dumps in %s%s", rk_launcher_name(o->launcher),
            o->launcher_why ? o->launcher_why : "--launcher",
            rk_launch_describe(o->launcher, s->n, cl_mpi ? shown_args : o->launcher_args, o->worker,
                               desc, sizeof desc),
            cl_mpi ? "each host's own directory (not collected: ranks of one mpirun or srun)"
                   : s->stack_dir,
            master);
    if (!ma && !o->hosts && sup_may_span_hosts(o)) /* with hosts: rank 0's, set (cluster.c) */
        sup_say(s,
                "MASTER_ADDR not set: the ranks may run on other hosts (%s), and 127.0.0.1 "
                "would be wrong there; set it for torch.distributed",
                o->launcher == RK_LAUNCH_SRUN ? "srun" : "the launcher arguments name hosts");
    char devs[512];
    sup_say(s, "%d rank%s on device%s %s; heartbeat timeout %.0f s, quarantine after %d failure%s",
            s->n, s->n == 1 ? "" : "s", s->n == 1 ? "" : "s", device_list(s, devs, sizeof devs),
            o->hb_timeout_s, o->failure_threshold, o->failure_threshold == 1 ? "" : "s");
    if (o->inject)
        sup_say(s, "injecting faults (simulated): %s", o->inject);
    /* ranks only shrink: a fault of a rank the job does not have never fires (a warning, not
     * an error: the same spec may serve the script at more ranks) */
    for (size_t i = 0; i < rk_inject_count(s->spec); i++) {
        const rk_fault *f = rk_inject_get(s->spec, i);
        if (f->rank >= s->n)
            sup_say(s, "warning: fault %zu (%s on rank %d) never fires: the job has %d rank%s", i,
                    rk_fault_kind_name(f->kind), f->rank, s->n, s->n == 1 ? "" : "s");
    }
    open_snap_dir(s);
    sup_gauge_tick(s); /* the metrics file exists from the start */
    run_launches(s, rep);
out:
    s->b.ops->kill(s->b.ctx, 0); /* nothing of the job outlives rk run */
    if (s->b.ops->close)
        s->b.ops->close(s->b.ctx);
    sup_snapsave_drain(s, 0); /* the checkpoints asked for are on disk before the job ends */
    if (s->g.t0 > 0)
        sup_gauge_end(s); /* the peak and the last metrics, before the snapshots go */
    if (s->snap_dir[0]) { /* the ranks are gone: their snapshots go with the job */
        rk_err e = {0};
        if (rk_snap_dir_remove(s->snap_dir, &e))
            sup_say(s, "snapshots: %s", e.msg);
    }
    rep->outcome = outcome_word(rep->end);
    if (s->g.t0 > 0)
        (void)rk_ledger_summary(&s->g, o->summary_path, s->last_done, s->n, rep->outcome, rep,
                                &rep->summary_err);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->sock[0])
        unlink(s->sock);
    if (s->stack_parent)
        tidy_stack_dir(s->stack_dir);
    if (s->dir[0])
        nftw(s->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); /* with the launchers' files */
    rk_inject_free(s->spec);
    rk_gate_close(s->gate);
    free(s->fired);
    rk_ledger_close(&s->g);
    free(s);
}

void rk_sup_report_free(rk_sup_report *rep)
{
    free(rep->incidents);
    rep->incidents = NULL;
    rep->nkinds = 0;
}
