/*
 * The launcher of this host as rk run's backend (backend.h): each launch's environment and
 * the launcher's argv (local, mpirun or srun, under launch.c's keeper), its end, its first
 * failed rank, its teardown. A job over many hosts places the ranks through its backend's
 * socket, host_list, master and srun_hosts (one mpirun or srun across the hosts, the agents
 * watching: src/cluster/cluster.c calls sup_launcher_* for that).
 */
#include "supervisor/sup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* 1 if the ranks may run on other hosts: srun, or launcher arguments that name hosts. */
int sup_may_span_hosts(const rk_sup_opts *o)
{
    return o->launcher == RK_LAUNCH_SRUN || rk_launch_names_hosts(o->launcher_args);
}

int sup_snapshots_off(const sup *s)
{
    return s->snap_off;
}

/* OMP_NUM_THREADS=1 for the ranks when several of them share this host's CPUs and the user
 * did not choose (as torchrun does for more than one process a node): each rank's OpenMP and
 * OpenBLAS would otherwise take every CPU, and the same script would round differently (and
 * run slower) under rk run than under torchrun. Decided once for the job (a shrink keeps it,
 * so a relaunch computes as the launch before it did). */
int sup_omp_one(const rk_sup_opts *o)
{
    return o->n > 1 && !o->hosts && !sup_may_span_hosts(o) && !getenv("OMP_NUM_THREADS");
}

int sup_launcher_start(sup *s, rk_err *err)
{
    const rk_sup_backend_ops *b = s->b.ops;
    int remote = b->socket != NULL; /* the backend places the ranks on other hosts */
    /* Open MPI's session directory and shared-memory files in a directory of this launch:
     * in a PID namespace every job's mpirun has the same pid, from which Open MPI derives
     * the names it shares between jobs */
    snprintf(s->jobdir, sizeof s->jobdir, "%s/job%d", s->dir, s->launch_no);
    if (mkdir(s->jobdir, 0700) != 0 && errno != EEXIST)
        return rk_err_set(err, RK_EIO, "cannot create %s: %s", s->jobdir, strerror(errno));
    static char devs[RK_SUP_MAX_DEVICES * 300], done[8192], abs_sock[96];
    size_t used = 0;
    devs[0] = '\0';
    for (int r = 0; r < s->n && used < sizeof devs; r++)
        used += (size_t)snprintf(devs + used, sizeof devs - used, r ? ",%s" : "%s",
                                 s->o->devices[s->dev[r]]);
    if (used >= sizeof devs)
        return rk_err_set(err, RK_EINVAL, "the launch's device ids are longer than %zu bytes",
                          sizeof devs - 1);
    used = 0;
    done[0] = '\0';
    for (size_t i = 0; s->o->inject && i < rk_inject_count(s->spec) && used + 24 < sizeof done; i++)
        if (s->fired[i])
            used += (size_t)snprintf(done + used, sizeof done - used, used ? ",%zu" : "%zu", i);
    /* the user's MASTER_ADDR and MASTER_PORT are kept (said in the first status line);
     * 127.0.0.1 only for a launch on this host alone; a fresh port for every launch */
    const char *master = getenv("MASTER_ADDR")       ? NULL
                         : remote                    ? b->master(s->b.ctx) /* rank 0's host */
                         : !sup_may_span_hosts(s->o) ? "127.0.0.1"
                                                     : NULL;
    int port = getenv("MASTER_PORT") ? -1 : rk_env_free_port();
    static char snap_dirs[8192]; /* across hosts: each host's snapshot directory */
    const char *sdirs = remote && b->snap_dirs && !s->snap_off && s->o->ckpt_dir &&
                                s->o->recovery == RK_SUP_RECOVERY_MEMORY
                            ? b->snap_dirs(s->b.ctx, snap_dirs, sizeof snap_dirs)
                            : NULL;
    rk_rank_env_opts eo = {
        .heartbeat = remote ? b->socket(s->b.ctx, abs_sock, sizeof abs_sock) : s->sock,
        .devices = devs,
        .by_host = remote, /* HOST:INDEX ids: rk _rank-env sets each rank's CUDA_VISIBLE_DEVICES */
        .launch = s->launch_no,
        .world = s->n,
        .local_world = s->n,
        .rank_base = -1,
        .master_addr = master,
        .master_port = port,
        .cuda_visible = remote ? NULL : devs, /* across hosts each host's list differs */
        .omp_one = sup_omp_one(s->o),
        .stack_dir = remote ? NULL : s->stack_dir, /* a directory of this host */
        .pythonpath = !s->o->no_pythonpath,
        .ckpt_dir = s->o->ckpt_dir,
        .snap_dir = s->snap_dir[0] ? s->snap_dir : NULL, /* this host's launches only (run.c) */
        .snap_dirs = sdirs,
        .snap_pin_every = sdirs ? s->o->partner_every : 0, /* partner copies (docs/recovery.md) */
        .ckpt_from_snap = sup_snapsave_on(s), /* this host's snapshots: rk run writes the disk's */
        .inject = s->o->inject,
        .inject_done = done};
    static rk_rank_env re;
    int rc = rk_rank_env_build(&re, &eo, err);
    if (rc)
        return rc;
    if (re.why[0] && !s->told_pypath) {
        s->told_pypath = 1;
        sup_say(s, "%s", re.why);
    }
    static const char *const tmpvars[3] = {"OMPI_MCA_orte_tmpdir_base",
                                           "OMPI_MCA_btl_vader_backing_directory",
                                           "OMPI_MCA_shmem_mmap_backing_file_base_dir"};
    for (int k = 0; !rc && k < 3 && s->o->launcher == RK_LAUNCH_MPIRUN && !remote; k++)
        rc = rk_rank_env_add(&re, err, "%s=%s", tmpvars[k], s->jobdir);
    /* mpirun ends the other ranks when one fails and exits with that rank's status, which
     * says what the failure was; by default it waits 1 s after its SIGTERM to them before
     * SIGKILL, and the relaunch waits for it (unless the user chose otherwise) */
    if (!rc && s->o->launcher == RK_LAUNCH_MPIRUN && !getenv("OMPI_MCA_odls_base_sigkill_timeout"))
        rc = rk_rank_env_add(&re, err, "OMPI_MCA_odls_base_sigkill_timeout=0");
    /* recovery in place (inplace.c): a PyTorch rank may rejoin a new rendezvous */
    if (!rc && s->ip_state == IP_READY && !remote)
        rc = rk_rank_env_add(&re, err, "RK_REJOIN=1");
    /* srun in the allocation: rank r on the node of line r, the nodes used named, the ones
     * lost or quarantined left out (docs/slurm.md) */
    static char srun_excl[8192], srun_args[2][8300];
    int srun_nn = 0;
    if (!rc && remote && s->o->launcher == RK_LAUNCH_SRUN) {
        char hostfile[4200];
        snprintf(hostfile, sizeof hostfile, "%s/hostfile", s->jobdir);
        srun_nn = b->srun_hosts(s->b.ctx, hostfile, srun_excl, sizeof srun_excl, err);
        if (srun_nn < 0)
            return err->code;
        if (srun_excl[0])
            sup_say(s, "srun leaves out %s (--exclude): lost or quarantined", srun_excl);
        rc = rk_rank_env_add(&re, err, "SLURM_HOSTFILE=%s", hostfile);
    }
    if (rc)
        return rc;
    const char *const *env = re.env;
    int e = re.n;
    s->t_launch = rk_ledger_now(&s->g);
    const char *ns = getenv("RK_RUN_PIDNS"); /* "0": the subreaper fallback (tests) */
    char *const *largs = s->o->launcher_args;
    static char *cargs[64 + 8 + 2 * RK_RANK_ENV_MAX];
    static char hostlist[8192], envnames[RK_RANK_ENV_MAX][64];
    if (remote && s->o->launcher == RK_LAUNCH_SRUN) { /* srun passes the environment on */
        int a = 0;
        for (int i = 0; largs && largs[i] && a < 64; i++)
            cargs[a++] = largs[i];
        /* the hostfile places every rank (srun refuses --nodelist beside it); the node count
         * given, as an allocation that lost a node (sbatch --no-kill) needs it */
        snprintf(srun_args[0], sizeof srun_args[0], "--nodes=%d", srun_nn);
        snprintf(srun_args[1], sizeof srun_args[1], "--exclude=%s", srun_excl);
        cargs[a++] = srun_args[0];
        if (srun_excl[0])
            cargs[a++] = srun_args[1];
        cargs[a++] = "--distribution=arbitrary";
        cargs[a++] = "--overlap"; /* beside the agents' steps, on the same CPUs */
        cargs[a] = NULL;
        largs = cargs;
    } else if (remote) { /* mpirun across the hosts: where, how to reach them, what to pass on */
        int a = 0;
        for (int i = 0; largs && largs[i] && a < 64; i++)
            cargs[a++] = largs[i];
        cargs[a++] = "--host";
        cargs[a++] = (char *)b->host_list(s->b.ctx, hostlist, sizeof hostlist);
        cargs[a++] = "--mca";
        cargs[a++] = "plm_rsh_agent";
        cargs[a++] = (char *)(s->o->rsh ? s->o->rsh : "ssh -o BatchMode=yes");
        for (int i = 0; i < e && i < RK_RANK_ENV_MAX; i++) { /* Open MPI passes on what -x names */
            snprintf(envnames[i], sizeof envnames[i], "%.*s", (int)strcspn(env[i], "="), env[i]);
            cargs[a++] = "-x";
            cargs[a++] = envnames[i];
        }
        cargs[a] = NULL;
        largs = cargs;
    }
    if (s->ip_state == IP_READY && !remote) /* the keeper replaces a failed rank on order */
        rc = rk_launch_start_inplace(&s->l, s->n, s->o->worker, (char *const *)env,
                                     !(ns && strcmp(ns, "0") == 0), err);
    else
        rc = rk_launch_start(&s->l, s->o->launcher, largs, s->n, s->o->worker, (char *const *)env,
                             !(ns && strcmp(ns, "0") == 0), err);
    if (!rc && !s->l.pidns && !s->told_pidns) {
        s->told_pidns = 1;
        sup_say(s,
                "no PID namespace for the job (%s): it is tracked as rk run's descendants, and "
                "a process that leaves that tree survives a SIGKILL of rk run",
                s->l.ns_errno ? strerror(s->l.ns_errno) : "RK_RUN_PIDNS=0");
    }
    if (!rc && !s->l.loopback && !s->told_loopback && s->o->launcher == RK_LAUNCH_MPIRUN) {
        s->told_loopback = 1; /* a multi-node job, or the library is missing */
        sup_say(s, "Open MPI's listeners bind every address (not a single-node job, "
                   "RK_RUN_LOOPBACK=0, a sanitiser build, or no librkloopback.so beside rk or in "
                   "its library directory)");
    }
    return rc;
}

int sup_launcher_poll(sup *s, int *code)
{
    if (!rk_launch_poll(&s->l))
        return 0;
    int st = s->l.status;
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return 1;
}

int sup_launcher_failed_rank(sup *s)
{
    if (s->l.inplace) /* inplace.c reads the keeper's word and decides */
        return -1;
    return rk_launch_failed_rank(&s->l);
}

void sup_launcher_kill(sup *s, double grace_s)
{
    if (s->l.pid > 0)
        rk_launch_kill(&s->l, grace_s);
}

static int start(void *ctx, const rk_sup_launch *l, rk_err *err)
{
    (void)l; /* the job's own state says the same */
    return sup_launcher_start(ctx, err);
}

static int poll_launch(void *ctx, int *code)
{
    return sup_launcher_poll(ctx, code);
}

static int failed_rank(void *ctx)
{
    return sup_launcher_failed_rank(ctx);
}

static void kill_launch(void *ctx, double grace_s)
{
    sup_launcher_kill(ctx, grace_s);
}

const rk_sup_backend_ops rk_sup_launcher_ops = {.name = "launcher",
                                                .start = start,
                                                .poll = poll_launch,
                                                .failed_rank = failed_rank,
                                                .kill = kill_launch};
