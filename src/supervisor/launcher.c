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
    static char env_hb[160], env_dev[RK_SUP_MAX_DEVICES * 300], env_launch[32], env_dir[4200],
        env_inj[4200], env_done[8192], env_tmp[3][200], env_world[2][40], env_port[32],
        env_cvd[RK_SUP_MAX_DEVICES * 300 + 32], env_restart[48], env_stack[4300], env_pypath[8400];
    const char *env[32];
    int e = 0;
    /* Open MPI's session directory and shared-memory files in a directory of this launch:
     * in a PID namespace every job's mpirun has the same pid, from which Open MPI derives
     * the names it shares between jobs */
    snprintf(s->jobdir, sizeof s->jobdir, "%s/job%d", s->dir, s->launch_no);
    if (mkdir(s->jobdir, 0700) != 0 && errno != EEXIST)
        return rk_err_set(err, RK_EIO, "cannot create %s: %s", s->jobdir, strerror(errno));
    static const char *const tmpvars[3] = {"OMPI_MCA_orte_tmpdir_base",
                                           "OMPI_MCA_btl_vader_backing_directory",
                                           "OMPI_MCA_shmem_mmap_backing_file_base_dir"};
    for (int k = 0; k < 3 && s->o->launcher == RK_LAUNCH_MPIRUN && !remote; k++) {
        snprintf(env_tmp[k], sizeof env_tmp[k], "%s=%s", tmpvars[k], s->jobdir);
        env[e++] = env_tmp[k];
    }
    char abs_sock[96];
    snprintf(env_hb, sizeof env_hb, "RK_HEARTBEAT=%s",
             remote ? b->socket(s->b.ctx, abs_sock, sizeof abs_sock) : s->sock);
    env[e++] = env_hb;
    size_t used = (size_t)snprintf(env_dev, sizeof env_dev, "RK_DEVICES=");
    for (int r = 0; r < s->n && used < sizeof env_dev; r++)
        used += (size_t)snprintf(env_dev + used, sizeof env_dev - used, r ? ",%s" : "%s",
                                 s->o->devices[s->dev[r]]);
    if (used >= sizeof env_dev)
        return rk_err_set(err, RK_EINVAL, "the launch's device ids are longer than %zu bytes",
                          sizeof env_dev - 1);
    env[e++] = env_dev;
    if (remote) /* HOST:INDEX ids: rk _rank-env sets each rank's CUDA_VISIBLE_DEVICES */
        env[e++] = "RK_DEVICES_BY_HOST=1";
    snprintf(env_launch, sizeof env_launch, "RK_LAUNCH=%d", s->launch_no);
    env[e++] = env_launch;
    /* what torch.distributed and torchrun's users read (RANK and LOCAL_RANK: per rank, set by
     * the keeper or by rk _rank-env; docs/run.md) */
    snprintf(env_world[0], sizeof env_world[0], "WORLD_SIZE=%d", s->n);
    snprintf(env_world[1], sizeof env_world[1], "LOCAL_WORLD_SIZE=%d", s->n);
    env[e++] = env_world[0];
    env[e++] = env_world[1];
    /* the user's MASTER_ADDR and MASTER_PORT are kept (said in the first status line);
     * 127.0.0.1 only for a launch on this host alone */
    static char env_master[300];
    if (!getenv("MASTER_ADDR") && remote) { /* rank 0's host */
        snprintf(env_master, sizeof env_master, "MASTER_ADDR=%s", b->master(s->b.ctx));
        env[e++] = env_master;
    } else if (!getenv("MASTER_ADDR") && !sup_may_span_hosts(s->o))
        env[e++] = "MASTER_ADDR=127.0.0.1";
    int port = getenv("MASTER_PORT") ? -1 : rk_env_free_port(); /* fresh for every launch */
    if (port > 0) {
        snprintf(env_port, sizeof env_port, "MASTER_PORT=%d", port);
        env[e++] = env_port;
    }
    snprintf(env_cvd, sizeof env_cvd, "CUDA_VISIBLE_DEVICES=%s", env_dev + strlen("RK_DEVICES="));
    if (!remote) /* across hosts each host's list differs: not one variable for all */
        env[e++] = env_cvd;
    if (!getenv("CUDA_DEVICE_ORDER")) /* CUDA's numbering is then NVML's, the device ids' */
        env[e++] = "CUDA_DEVICE_ORDER=PCI_BUS_ID";
    if (sup_omp_one(s->o))
        env[e++] = "OMP_NUM_THREADS=1";
    snprintf(env_restart, sizeof env_restart, "TORCHELASTIC_RESTART_COUNT=%d", s->launch_no);
    env[e++] = env_restart;
    snprintf(env_stack, sizeof env_stack, "RK_STACK_DIR=%s", s->stack_dir);
    if (!remote) /* a directory of this host */
        env[e++] = env_stack;
    if (!s->o->no_pythonpath) {
        char dir[4096];
        const char *old = getenv("PYTHONPATH");
        char why[4200];
        int got = rk_env_python_dir(dir, sizeof dir, why, sizeof why) != NULL;
        if (!got && why[0] && !s->told_pypath) {
            s->told_pypath = 1;
            sup_say(s, "%s", why);
        }
        if (got && (size_t)snprintf(env_pypath, sizeof env_pypath, "PYTHONPATH=%s%s%s", dir,
                                    old && *old ? ":" : "", old ? old : "") < sizeof env_pypath)
            env[e++] = env_pypath;
    }
    if (s->o->ckpt_dir) {
        snprintf(env_dir, sizeof env_dir, "RK_CKPT_DIR=%s", s->o->ckpt_dir);
        env[e++] = env_dir;
        env[e++] = "RK_RESUME=1";
    }
    if (s->o->inject) {
        snprintf(env_inj, sizeof env_inj, "RK_INJECT=%s", s->o->inject);
        env[e++] = env_inj;
        used = (size_t)snprintf(env_done, sizeof env_done, "RK_INJECT_DONE=");
        int any = 0;
        for (size_t i = 0; i < rk_inject_count(s->spec) && used + 24 < sizeof env_done; i++)
            if (s->fired[i]) {
                used += (size_t)snprintf(env_done + used, sizeof env_done - used,
                                         any ? ",%zu" : "%zu", i);
                any = 1;
            }
        if (any)
            env[e++] = env_done;
    }
    /* mpirun ends the other ranks when one fails and exits with that rank's status, which
     * says what the failure was; by default it waits 1 s after its SIGTERM to them before
     * SIGKILL, and the relaunch waits for it (unless the user chose otherwise) */
    if (s->o->launcher == RK_LAUNCH_MPIRUN && !getenv("OMPI_MCA_odls_base_sigkill_timeout"))
        env[e++] = "OMPI_MCA_odls_base_sigkill_timeout=0";
    /* srun in the allocation: rank r on the node of line r, the nodes used named, the ones
     * lost or quarantined left out (docs/slurm.md) */
    static char srun_excl[8192], srun_args[2][8300], env_hostfile[4300];
    int srun_nn = 0;
    if (remote && s->o->launcher == RK_LAUNCH_SRUN) {
        char hostfile[4200];
        snprintf(hostfile, sizeof hostfile, "%s/hostfile", s->jobdir);
        srun_nn = b->srun_hosts(s->b.ctx, hostfile, srun_excl, sizeof srun_excl, err);
        if (srun_nn < 0)
            return err->code;
        if (srun_excl[0])
            sup_say(s, "srun leaves out %s (--exclude): lost or quarantined", srun_excl);
        snprintf(env_hostfile, sizeof env_hostfile, "SLURM_HOSTFILE=%s", hostfile);
        env[e++] = env_hostfile;
    }
    env[e] = NULL;
    s->t_launch = rk_ledger_now(&s->g);
    const char *ns = getenv("RK_RUN_PIDNS"); /* "0": the subreaper fallback (tests) */
    char *const *largs = s->o->launcher_args;
    static char *cargs[64 + 8 + 2 * 32];
    static char hostlist[8192], envnames[32][64];
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
        for (int i = 0; i < e && i < 32; i++) { /* Open MPI passes on only what -x names */
            snprintf(envnames[i], sizeof envnames[i], "%.*s", (int)strcspn(env[i], "="), env[i]);
            cargs[a++] = "-x";
            cargs[a++] = envnames[i];
        }
        cargs[a] = NULL;
        largs = cargs;
    }
    int rc = rk_launch_start(&s->l, s->o->launcher, largs, s->n, s->o->worker, (char *const *)env,
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
