/*
 * Launching a job's ranks (supervisor.h): through Open MPI's mpirun, srun under Slurm, or
 * forked by the keeper itself (local). argv arrays and execvp, never a shell. Between rk run
 * and the ranks stands a keeper, a small child of rk run that holds the job: pid 1 of a PID
 * namespace of its own when the kernel allows it (everything in it dies with the keeper),
 * else a child subreaper that kills its descendants, found in /proc, before it exits. The
 * keeper dies with rk run (PR_SET_PDEATHSIG, and a lifeline pipe for the race and the
 * subreaper case). `auto` reads the worker's ELF dynamic section to choose (rk_launch_pick).
 */
#define _GNU_SOURCE
#include "base/phase.h"
#include "base/proc.h"
#include "rekindle/heartbeat.h"
#include "supervisor/supervisor.h"

#include <ctype.h>
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 512
#define MAX_PROCS 65536 /* pids read from /proc in one scan */

/* 1 if the launcher arguments name other hosts (then the job is not single-node). */
int rk_launch_names_hosts(char *const *extra)
{
    static const char *const opts[] = {
        "--host",    "-host",         "-H",           "--hostfile",
        "-hostfile", "--machinefile", "-machinefile", "--default-hostfile"};
    for (int i = 0; extra && extra[i]; i++)
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
            size_t n = strlen(opts[k]);
            if (strncmp(extra[i], opts[k], n) == 0 && (extra[i][n] == '\0' || extra[i][n] == '='))
                return 1;
        }
    return 0;
}

const char *rk_launcher_name(rk_launcher kind)
{
    return kind == RK_LAUNCH_SRUN    ? "srun"
           : kind == RK_LAUNCH_LOCAL ? "local"
           : kind == RK_LAUNCH_AUTO  ? "auto"
                                     : "mpirun";
}

/* This executable's path (for `rk _rank-env` under mpirun and srun), "rk" if unknown. */
const char *rk_launch_self_exe(void)
{
    static char exe[4096];
    if (!exe[0]) {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        snprintf(exe + (n > 0 ? n : 0), sizeof exe - (size_t)(n > 0 ? n : 0), "%s",
                 n > 0 ? "" : "rk");
    }
    return exe;
}

/* Whether a one-node mpirun may be told `--mca pml ob1` (docs/run.md, "mpirun's listeners,
 * and the rest"): the user chose no pml (OMPI_MCA_pml, or --mca pml among the launcher's
 * arguments) and this host has no RDMA device (/sys/class/infiniband empty or absent), the
 * only hardware UCX's pml would bring. Open MPI 4.1 otherwise opens and probes UCX (and the
 * OFI and PSM2 mtls) in every rank's MPI_Init before it settles on ob1 with vader: 0.2 of its
 * 0.35 s, in every launch and every relaunch. */
static int pml_ob1_is_enough(char *const *extra)
{
    const char *env = getenv("OMPI_MCA_pml");
    if (env && *env)
        return 0;
    for (int i = 0; extra && extra[i]; i++)
        if ((!strcmp(extra[i], "--mca") || !strcmp(extra[i], "-mca")) && extra[i + 1] &&
            !strcmp(extra[i + 1], "pml"))
            return 0;
    DIR *d = opendir("/sys/class/infiniband");
    if (!d)
        return 1;
    struct dirent *de;
    int rdma = 0;
    while (!rdma && (de = readdir(d)))
        rdma = de->d_name[0] != '.';
    closedir(d);
    return !rdma;
}

/* argv for the launcher; strings point into `nbuf` (the rank count) or the inputs. Local:
 * the worker's own argv (the keeper forks the ranks). */
static int build_argv(rk_launcher kind, char *const *extra, int n, char *const *worker,
                      const char **argv, char *nbuf, size_t ncap)
{
    int k = 0;
    snprintf(nbuf, ncap, "%d", n);
    if (kind == RK_LAUNCH_LOCAL) {
        for (int i = 0; worker[i]; i++) {
            if (k >= MAX_ARGS - 1)
                return -1;
            argv[k++] = worker[i];
        }
        argv[k] = NULL;
        return k;
    }
    if (kind == RK_LAUNCH_SRUN) {
        argv[k++] = "srun";
        argv[k++] = "--kill-on-bad-exit=1";
        argv[k++] = "-n";
        argv[k++] = nbuf;
    } else {
        argv[k++] = "mpirun";
        if (geteuid() == 0) /* Open MPI refuses root without it; containers often run as root */
            argv[k++] = "--allow-run-as-root";
        argv[k++] = "--oversubscribe"; /* ranks may outnumber cores (CPU slots in tests) */
        argv[k++] = "--quiet"; /* rk run says what happened; mpirun's advice is noise here */
        argv[k++] = "--bind-to";
        argv[k++] = "none";                  /* each rank runs its own threads */
        if (!rk_launch_names_hosts(extra)) { /* one node: Open MPI's TCP traffic on loopback only */
            static const char *const lo[] = {"--mca", "oob_tcp_if_include", "lo",
                                             "--mca", "btl_tcp_if_include", "lo"};
            for (size_t i = 0; i < sizeof lo / sizeof lo[0]; i++)
                argv[k++] = lo[i];
            if (pml_ob1_is_enough(extra)) {
                argv[k++] = "--mca";
                argv[k++] = "pml";
                argv[k++] = "ob1";
            }
        }
        argv[k++] = "-np";
        argv[k++] = nbuf;
    }
    for (int i = 0; extra && extra[i]; i++) {
        if (k >= MAX_ARGS - 2)
            return -1;
        argv[k++] = extra[i];
    }
    /* each rank's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from the launcher's
     * variables, then the worker in place (cli/cmd_rank_env.c) */
    if (k >= MAX_ARGS - 4)
        return -1;
    argv[k++] = rk_launch_self_exe();
    argv[k++] = "_rank-env";
    argv[k++] = "--";
    for (int i = 0; worker[i]; i++) {
        if (k >= MAX_ARGS - 1)
            return -1;
        argv[k++] = worker[i];
    }
    argv[k] = NULL;
    return k;
}

static int resolve_program(const char *prog, char *out, size_t cap);

/* `arg` as a POSIX shell reads it back, into buf + used (cap): bare when it holds only
 * characters no shell treats specially, else in single quotes ('\'' for a quote). */
size_t rk_launch_quote(char *buf, size_t used, size_t cap, const char *arg)
{
    int plain = *arg != '\0';
    for (const char *p = arg; *p && plain; p++)
        plain = strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-",
                       *p) != NULL;
    if (plain)
        return used + (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "%s", arg);
    used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "'");
    for (const char *p = arg; *p; p++)
        used += (size_t)snprintf(buf + used, used < cap ? cap - used : 0,
                                 *p == '\'' ? "'\\''" : "%c", *p);
    return used + (size_t)snprintf(buf + used, used < cap ? cap - used : 0, "'");
}

const char *rk_launch_describe(rk_launcher kind, int n, char *const *launcher_args,
                               char *const *worker, char *buf, size_t cap)
{
    const char *argv[MAX_ARGS];
    char nbuf[16], prog[4096];
    buf[0] = '\0';
    int k = build_argv(kind, launcher_args, n, worker, argv, nbuf, sizeof nbuf);
    if (k < 0)
        return "(too many arguments)";
    int nworker = 0;
    while (worker[nworker])
        nworker++;
    size_t used = 0;
    if (kind == RK_LAUNCH_LOCAL)
        used = (size_t)snprintf(buf, cap, "rk run forks %d rank%s:", n, n == 1 ? "" : "s");
    for (int i = 0; argv[i] && used + 1 < cap; i++) {
        const char *a = argv[i];
        /* the program the keeper executes: argv[0] as execvp finds it in PATH */
        if (kind == RK_LAUNCH_LOCAL && i == k - nworker && !strchr(a, '/') &&
            resolve_program(a, prog, sizeof prog))
            a = prog;
        if (i || used)
            used += (size_t)snprintf(buf + used, cap - used, " ");
        used = rk_launch_quote(buf, used, cap, a);
    }
    return buf;
}

/* ---- auto: is the worker an MPI program? --------------------------------------------------- */

#define ELF_MAX_SECTIONS 4096
#define ELF_MAX_DYNAMIC (1 << 20) /* bytes of the dynamic section read */
#define ELF_MAX_DYNSTR (4 << 20)  /* bytes of its string table read */

/* argv[0] as execvp finds it: itself if it holds a '/', else the first executable regular
 * file of that name in PATH. 0 if none. */
static int resolve_program(const char *prog, char *out, size_t cap)
{
    struct stat st;
    if (strchr(prog, '/'))
        return snprintf(out, cap, "%s", prog) < (int)cap && stat(out, &st) == 0;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if ((size_t)snprintf(out, cap, "%.*s%s%s", (int)len, p, len ? "/" : "", prog) < cap &&
            stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
            return 1;
        p += len + (end ? 1 : 0);
    }
    return 0;
}

static int read_at(int fd, void *buf, size_t n, uint64_t off, uint64_t size)
{
    if (off > size || n > size - off)
        return -1;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* 1 for MPICH's libraries: libmpich.so*, and libmpich<letters>.so* (libmpichcxx.so.12,
 * libmpichfort.so.12). */
static int is_mpich(const char *name)
{
    if (strncmp(name, "libmpich", 8) != 0)
        return 0;
    name += 8;
    while (islower((unsigned char)*name))
        name++;
    return strncmp(name, ".so", 3) == 0;
}

/* The first DT_NEEDED of the 64-bit little-endian ELF file `fd` (of `size` bytes) whose name
 * starts with libmpi.so (Open MPI), is MPICH's (is_mpich) or
 * librekindle.so, into lib[cap]; 1 if found. */
static int elf_needs_mpi(int fd, uint64_t size, char *lib, size_t cap)
{
    Elf64_Ehdr eh;
    if (read_at(fd, &eh, sizeof eh, 0, size) || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
        eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shnum > ELF_MAX_SECTIONS)
        return 0;
    static const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) /* a big-endian host reads none of it */
        return 0;
    for (uint16_t i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr dyn, str;
        if (read_at(fd, &dyn, sizeof dyn, eh.e_shoff + (uint64_t)i * sizeof dyn, size))
            return 0;
        if (dyn.sh_type != SHT_DYNAMIC || dyn.sh_link >= eh.e_shnum ||
            dyn.sh_size > ELF_MAX_DYNAMIC ||
            read_at(fd, &str, sizeof str, eh.e_shoff + (uint64_t)dyn.sh_link * sizeof str, size) ||
            str.sh_size == 0 || str.sh_size > ELF_MAX_DYNSTR)
            continue;
        size_t nd = dyn.sh_size / sizeof(Elf64_Dyn);
        Elf64_Dyn *d = malloc(nd * sizeof *d + 1);
        char *names = malloc(str.sh_size + 1);
        int found = 0;
        if (d && names && !read_at(fd, d, nd * sizeof *d, dyn.sh_offset, size) &&
            !read_at(fd, names, str.sh_size, str.sh_offset, size)) {
            names[str.sh_size] = '\0';
            for (size_t k = 0; k < nd && d[k].d_tag != DT_NULL && !found; k++) {
                if (d[k].d_tag != DT_NEEDED || d[k].d_un.d_val >= str.sh_size)
                    continue;
                const char *name = names + d[k].d_un.d_val;
                if (strncmp(name, "libmpi.so", 9) == 0 || is_mpich(name) ||
                    strncmp(name, "librekindle.so", 14) == 0)
                    found = snprintf(lib, cap, "%s", name) > 0;
            }
        }
        free(d);
        free(names);
        if (found)
            return 1;
    }
    return 0;
}

rk_launcher rk_launch_pick(char *const *worker, int launcher_args, char *why, size_t cap)
{
    if (launcher_args) {
        snprintf(why, cap, "--launcher-arg given");
        return RK_LAUNCH_MPIRUN;
    }
    char path[4096], lib[256];
    const char *prog = worker && worker[0] ? worker[0] : "";
    if (!resolve_program(prog, path, sizeof path)) {
        snprintf(why, cap, "%s is not an executable found in PATH", prog);
        return RK_LAUNCH_LOCAL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    int mpi = 0;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        mpi = elf_needs_mpi(fd, (uint64_t)st.st_size, lib, sizeof lib);
    if (fd >= 0)
        close(fd);
    if (mpi)
        snprintf(why, cap, "%s (%s) needs %s", prog, path, lib);
    else
        snprintf(why, cap, "%s (%s) is not an MPI program", prog, path);
    return mpi ? RK_LAUNCH_MPIRUN : RK_LAUNCH_LOCAL;
}

/* LD_PRELOAD=librkloopback.so[:what was there] into buf for a single-node mpirun and its
 * ranks (src/preload/loopback.c: Open MPI's listeners bind loopback only, nothing else
 * changes): the copy beside this executable (a build tree) or the installed one. 0 if there
 * is none. */
static int loopback_preload(char *buf, size_t cap)
{
#ifndef RK_LOOPBACK_SO
#define RK_LOOPBACK_SO ""
#define RK_LOOPBACK_RELDIR "lib/rekindle"
#endif
    char exe[4096], cand[3][4200];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    snprintf(cand[0], sizeof cand[0], "%s/librkloopback.so", exe); /* a build tree */
    snprintf(cand[1], sizeof cand[1], "%s/../%s/librkloopback.so", exe, RK_LOOPBACK_RELDIR);
    snprintf(cand[2], sizeof cand[2], "%s", RK_LOOPBACK_SO); /* where it was installed */
    const char *old = getenv("LD_PRELOAD");
    for (int i = 0; i < 3; i++)
        if (cand[i][0] == '/' && access(cand[i], R_OK) == 0 &&
            (size_t)snprintf(buf, cap, "LD_PRELOAD=%s%s%s", cand[i], old && *old ? ":" : "",
                             old ? old : "") < cap)
            return 1;
    return 0;
}

/* ---- the kernel's view of processes ---------------------------------------------------- */

/* The parent of `pid` (in this process's PID namespace), -1 if gone; its state letter to
 * *state (may be NULL; 'Z' for a zombie). */
static pid_t parent_of(pid_t pid, char *state)
{
    pid_t pp;
    return rk_proc_stat(pid, state, &pp, NULL) == 0 ? pp : -1;
}

int rk_proc_descends(pid_t pid, pid_t root)
{
    if (pid <= 1 || root <= 1)
        return 0;
    for (int hops = 0; hops < 256 && pid > 1; hops++) {
        if (pid == root)
            return 1;
        pid = parent_of(pid, NULL);
    }
    return 0;
}

long rk_proc_nspid(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    long inner = -1, seen = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Pid:", 4) == 0)
            seen = 1; /* a kernel without NSpid (before 4.1) has no PID namespaces to list */
        if (strncmp(line, "NSpid:", 6) != 0)
            continue;
        char *p = line + 6, *end;
        for (long v; (v = strtol(p, &end, 10)), end != p; p = end)
            inner = v; /* the last one: the pid in the process's own namespace */
        break;
    }
    fclose(f);
    return inner < 0 && seen ? (long)pid : inner;
}

/* Processes that no tree walk of this file signals, nor their descendants: a multi-host
 * job's agents, which rk run started besides the launches and which outlive each one. */
static pid_t spared[256];
static int nspared;

void rk_launch_spare(pid_t pid)
{
    if (nspared < (int)(sizeof spared / sizeof spared[0]))
        spared[nspared++] = pid;
}

static int is_spared(pid_t p)
{
    for (int i = 0; i < nspared; i++)
        if (spared[i] == p)
            return 1;
    return 0;
}

/* Send `sig` to every live descendant of `root` (not root itself); how many were found.
 * With `reap`, then reap those that are this process's children (zombies are not counted,
 * but a zombie's children are: they await reparenting). */
static int signal_tree(pid_t root, int sig, int reap)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    static pid_t pid[MAX_PROCS], ppid[MAX_PROCS], queue[MAX_PROCS];
    static char state[MAX_PROCS];
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < MAX_PROCS;) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid_t p = (pid_t)atoi(e->d_name);
        pid_t pp = parent_of(p, &state[n]);
        if (pp > 0) {
            pid[n] = p;
            ppid[n++] = pp;
        }
    }
    closedir(d);
    size_t head = 0, tail = 0; /* breadth-first from root over the parent links */
    queue[tail++] = root;
    int found = 0;
    while (head < tail) {
        pid_t up = queue[head++];
        for (size_t i = 0; i < n && tail < MAX_PROCS; i++) {
            if (ppid[i] != up || pid[i] == root || is_spared(pid[i]))
                continue;
            queue[tail++] = pid[i];
            if (state[i] != 'Z') {
                kill(pid[i], sig);
                found++;
            }
            if (reap && ppid[i] == getpid())
                waitpid(pid[i], NULL, WNOHANG);
        }
    }
    return found;
}

/* SIGKILL the descendants of `root` until none is left (a process may fork while it is
 * being killed; its children are reparented to a subreaper in the tree, so scans find them),
 * reaping those that are ours. */
static void kill_tree(pid_t root)
{
    for (int round = 0; round < 100 && signal_tree(root, SIGKILL, 1) > 0; round++) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    signal_tree(root, 0, 1); /* reap the last ones */
}

/* ---- the keeper -------------------------------------------------------------------------- */

static void write_errno(int fd, int e)
{
    ssize_t w;
    do
        w = write(fd, &e, sizeof e);
    while (w < 0 && errno == EINTR);
}

/* Everything of the job but the keeper. */
static void signal_job(int pidns, int sig)
{
    if (pidns)
        kill(-1, sig); /* as pid 1 of the namespace: every other process in it */
    else if (sig == SIGKILL)
        kill_tree(getpid());
    else
        signal_tree(getpid(), sig, 0);
}

/* A local rank-to-be: the warm spare (rank argument of exec_child). */
#define SPARE_RANK (-2)

/* The first child process: the launcher (nranks 0), or each rank of a local launch with its
 * RANK and LOCAL_RANK, or (rank SPARE_RANK) the warm spare, which reads its rank later from
 * `keep` (left open across the exec, named by RK_SPARE_FD). Never returns: the exec's errno
 * goes to rk run through `report`. */
static void exec_child(const char **argv, char *const *env, char *const *extra, char *preload,
                       const sigset_t *set, int report, int rank, int keep)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigprocmask(SIG_UNBLOCK, set, NULL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    for (int i = 0; env && env[i]; i++)
        putenv(env[i]);
    for (int i = 0; extra && extra[i]; i++) /* a replacement's: after the launch's, over them */
        putenv(extra[i]);
    if (preload)
        putenv(preload);
    /* the child gets stdin, stdout and stderr, nothing else of rk run's (its --events,
     * --steps and --gate-log files, sockets, a library's descriptors), as mpirun's ranks;
     * `report` is close-on-exec already and must stay open until the exec */
    rk_proc_cloexec_from(STDERR_FILENO + 1);
    char rank_env[2][32];
    if (keep >= 0) {
        /* rk-fd: inherited on purpose: the spare's orders (one assignment, then end of file) */
        if (fcntl(keep, F_SETFD, 0) != 0)
            _exit(127);
        snprintf(rank_env[0], sizeof rank_env[0], "RK_SPARE_FD=%d", keep);
        putenv(rank_env[0]);
    }
    if (rank >= 0 || rank == SPARE_RANK) {
        /* a local rank reads /dev/null, as mpirun's ranks but the first: the keeper's process
         * group is not the terminal's, so a read of the terminal would stop it (SIGTTIN) */
        /* rk-fd: inherited: it becomes the rank's stdin (dup2 below), or is fd 0 already when
         * stdin was closed, when O_CLOEXEC would close it at the exec */
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0 && null != STDIN_FILENO) {
            dup2(null, STDIN_FILENO);
            close(null);
        }
        /* a node's ranks of a multi-host job (the agent's launch) start at RK_RANK_BASE */
        const char *base = getenv("RK_RANK_BASE");
        long b = base ? strtol(base, NULL, 10) : 0;
        unsetenv("RK_RANK_BASE");
        if (rank >= 0) {
            snprintf(rank_env[0], sizeof rank_env[0], "RANK=%ld", b + rank);
            snprintf(rank_env[1], sizeof rank_env[1], "LOCAL_RANK=%d", rank);
            putenv(rank_env[0]);
            putenv(rank_env[1]);
        }
    }
    rk_phase_mark_env(rank >= 0            ? "rank.exec"
                      : rank == SPARE_RANK ? "spare.exec"
                                           : "launcher.exec"); /* RK_TRACE_LAUNCH */
    execvp(argv[0], (char *const *)argv);
    if (report >= 0)
        write_errno(report, errno); /* rk run reads it: no launch, one message */
    _exit(127);
}

/* In place (rk_launch_start_inplace): a rank's end as the keeper tells it, (rank, status). */
static void write_failed(int fd, int rank, int code)
{
    int msg[2] = {rank, code};
    ssize_t w;
    do
        w = write(fd, msg, sizeof msg);
    while (w < 0 && errno == EINTR);
}

/* The keeper, in place: one order from rk run on the respawn pipe: a rank to start again with
 * extra NAME=VALUE strings ({rank, len} then len bytes of NUL-ended strings), or rank -1: give
 * up (end the job). 1 with the order read into *rank and extra[] (pointing into buf), 0 at end
 * of file or on a malformed order. */
static int read_order(int fd, int *rank, char *buf, size_t cap, char **extra, int max)
{
    int head[2];
    ssize_t r;
    do
        r = read(fd, head, sizeof head);
    while (r < 0 && errno == EINTR);
    if (r != (ssize_t)sizeof head || head[1] < 0 || (size_t)head[1] >= cap)
        return 0;
    size_t got = 0, len = (size_t)head[1];
    while (got < len) {
        r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return 0;
        got += (size_t)r;
    }
    buf[len] = '\0';
    int n = 0;
    for (size_t at = 0; at < len && n < max - 1; at += strlen(buf + at) + 1)
        extra[n++] = buf + at;
    extra[n] = NULL;
    *rank = head[0];
    return 1;
}

/* supervisor.h */
int rk_launch_spare_argv(const char *const *argv, const char **out, int cap)
{
    const char *b = strrchr(argv[0], '/');
    b = b ? b + 1 : argv[0];
    if (strncmp(b, "python", 6) != 0)
        return -1;
    int i = 1, k = 0;
    out[k++] = argv[0];
    for (; argv[i] && argv[i][0] == '-'; i++) {
        const char *o = argv[i];
        if (o[1] == '\0' || o[1] == '-' || strpbrk(o + 1, "cmXW") != NULL) {
            /* -, --x, -c, -m: no script; -W/-X: their argument may be joined or not; refused
             * rather than guessed (a spare is an optimisation) */
            return -1;
        }
        if (k >= cap - 4)
            return -1;
        out[k++] = o;
    }
    if (!argv[i])
        return -1;
    out[k++] = "-m";
    out[k++] = "rekindle.torch._spare";
    for (; argv[i]; i++) {
        if (k >= cap - 1)
            return -1;
        out[k++] = argv[i];
    }
    out[k] = NULL;
    return 0;
}

/* Start the warm spare: *pid and *w (the write end of its orders), or both -1. */
static void start_spare(const char **argv, char *const *env, char *preload, const sigset_t *set,
                        pid_t *pid, int *w)
{
    static const char *sargv[MAX_ARGS + 3];
    int p[2];
    *pid = -1;
    *w = -1;
    if (rk_launch_spare_argv(argv, sargv, MAX_ARGS + 3) != 0 || pipe2(p, O_CLOEXEC) != 0)
        return;
    pid_t c = fork();
    if (c == 0) {
        close(p[1]);
        exec_child(sargv, env, NULL, preload, set, -1, SPARE_RANK, p[0]);
    }
    close(p[0]);
    if (c < 0) {
        close(p[1]);
        return;
    }
    *pid = c;
    *w = p[1];
}

/* Give the spare rank `rank`: RANK, LOCAL_RANK and the order's NAME=VALUE strings, each NUL-ended,
 * then end of file. 0 if all was written (the spare is the rank from here on), else -1. */
/* Append the NULL-ended NAME=VALUE strings, each with its NUL, at buf + *used (cap bytes in
 * all): 0, or -1 (nothing more written) when they do not fit. The keeper's orders and the
 * spare's assignment carry them so. */
static int pack_strings(char *buf, size_t cap, size_t *used, char *const *strs)
{
    for (int i = 0; strs && strs[i]; i++) {
        size_t k = strlen(strs[i]) + 1;
        if (*used + k > cap)
            return -1;
        memcpy(buf + *used, strs[i], k);
        *used += k;
    }
    return 0;
}

static int assign_spare(int w, char *const *env, char *const *extra, int rank)
{
    static char buf[12288];
    long b = 0;
    for (int i = 0; env && env[i]; i++)
        if (strncmp(env[i], "RK_RANK_BASE=", 13) == 0)
            b = strtol(env[i] + 13, NULL, 10);
    int n = snprintf(buf, sizeof buf, "RANK=%ld%cLOCAL_RANK=%d%c", b + rank, '\0', rank, '\0');
    size_t used = (size_t)n;
    if (pack_strings(buf, sizeof buf, &used, extra) != 0)
        return -1;
    for (size_t at = 0; at < used;) {
        ssize_t r = write(w, buf + at, used - at); /* SIGPIPE is ignored: EPIPE if it is gone */
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        at += (size_t)r;
    }
    return 0;
}

/* In a new PID namespace the keeper is pid 1 and the launcher would always be pid 2; Open
 * MPI names a job by a hash of its host's name and mpirun's pid, and its shared-memory
 * segments (/dev/shm/vader_segment.HOST.UID.JOBID.RANK) and session directories on every
 * host by that job id: two jobs started from one host would share them and crash each other
 * (SIGSEGV in MPI_Init). A random start for the namespace's pids (ns_last_pid: the pid
 * namespace of the writer, CAP_SYS_ADMIN there, which made the namespace) gives each job its
 * own pids, as without a namespace. Best effort: left as it is when the kernel refuses. */
static void scatter_pids(void)
{
    unsigned r = 0;
    long max = 32768;
    FILE *f = fopen("/proc/sys/kernel/pid_max", "re");
    if (f) {
        if (fscanf(f, "%ld", &max) != 1)
            max = 32768;
        fclose(f);
    }
    if (max > 1 << 22)
        max = 1 << 22;
    if (max < 4096 || getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        return;
    /* from 1000 (room below) up to half of pid_max (room above for the job's processes) */
    long last = 1000 + (long)(r % (unsigned)(max / 2 - 1000));
    int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[24];
    int n = snprintf(buf, sizeof buf, "%ld", last);
    ssize_t w = write(fd, buf, (size_t)n); /* refused: the pids start at 2, as before */
    (void)w;
    close(fd);
}

/* The keeper's life: start the launcher (or, `nranks` > 0, the ranks themselves), reap
 * everything, pass TERM, INT and HUP on to the job, kill the job when rk run goes (lifeline at
 * end of file) or the launcher exits (a local rank fails, or the last one is done), and exit
 * with the launcher's status (128 + signal for a signal; local: the first failed rank's, as
 * mpirun). Never returns. */
static void keeper(int pidns, int life, int report, const char **argv, char *const *env,
                   char *preload, int nranks, int failed, int orders)
{
    int launch = -1; /* the launch's number, for the trace (base/phase.h) */
    for (int i = 0; env && env[i] && launch < 0; i++)
        if (strncmp(env[i], "RK_LAUNCH=", 10) == 0)
            launch = atoi(env[i] + 10);
    rk_phase_mark("keeper.start", launch, -1);
    setpgid(0, 0); /* the terminal's ^C goes to rk run, which decides */
    if (pidns)
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* the namespace dies with rk run */
    else
        prctl(PR_SET_CHILD_SUBREAPER, 1); /* orphans of the job stay ours to kill */
    struct pollfd lp = {life, POLLIN, 0};
    if (poll(&lp, 1, 0) > 0) /* rk run died before the line above took effect */
        _exit(137);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    int sfd = signalfd(-1, &set, SFD_CLOEXEC);
    if (pidns)
        scatter_pids();
    int nchild = nranks > 0 ? nranks : 1;
    static pid_t child[RK_SUP_MAX_DEVICES];
    for (int r = 0; r < nchild; r++) {
        child[r] = sfd < 0 ? -1 : fork();
        if (child[r] == 0)
            exec_child(argv, env, NULL, preload, &set, report, nranks > 0 ? r : -1, -1);
        if (child[r] < 0) {
            write_errno(report, errno);
            if (r > 0)
                signal_job(pidns, SIGKILL);
            _exit(127);
        }
    }
    close(report);
    int left = nchild, stopped = 0, first_code = -1;
    pid_t spare = -1; /* in place: the warm spare (rk run's order RK_LAUNCH_ORDER_SPARE) */
    int spare_w = -1;
    signal(SIGPIPE, SIG_IGN); /* a spare that died: EPIPE, not the keeper's death */
    for (;;) {
        struct pollfd p[3] = {{sfd, POLLIN, 0}, {life, POLLIN, 0}, {orders, POLLIN, 0}};
        if (poll(p, orders >= 0 ? 3 : 2, -1) < 0)
            continue;
        if (p[1].revents) { /* rk run has gone: so does the job */
            signal_job(pidns, SIGKILL);
            _exit(137);
        }
        if (orders >= 0 && p[2].revents) { /* in place: rk run's order */
            static char buf[8192];
            char *extra[64];
            int r;
            int ok = read_order(orders, &r, buf, sizeof buf, extra, 64);
            if (ok && r == RK_LAUNCH_ORDER_SPARE) {
                if (spare < 0)
                    start_spare(argv, env, preload, &set, &spare, &spare_w);
                continue;
            }
            if (ok && r <= RK_LAUNCH_ORDER_KILL(0)) { /* its end is reported when reaped */
                int k = RK_LAUNCH_ORDER_KILL(0) - r;
                if (k < nchild && child[k] > 0)
                    kill(child[k], SIGKILL); /* the keeper's own child, by its own pid */
                continue;
            }
            if (!ok || r < 0 || r >= nchild ||
                child[r] > 0) { /* give up (or rk run has gone): the job ends as without */
                signal_job(pidns, SIGKILL);
                _exit(first_code >= 0 ? first_code : 137);
            }
            first_code = -1; /* a give-up from here on is a later failure's */
            if (spare > 0) {
                pid_t sp = spare;
                int given = assign_spare(spare_w, env, extra, r) == 0;
                close(spare_w);
                spare = -1;
                spare_w = -1;
                if (given) { /* the spare is rank r from here on */
                    child[r] = sp;
                    left++;
                    continue;
                }
                kill(sp, SIGKILL); /* broken: reaped below as an orphan; a cold start instead */
            }
            child[r] = fork();
            if (child[r] == 0)
                exec_child(argv, env, extra, preload, &set, -1, r, -1);
            if (child[r] > 0)
                left++;
            else
                write_failed(failed, r, 127);
            continue;
        }
        struct signalfd_siginfo si;
        if (!(p[0].revents & POLLIN) || read(sfd, &si, sizeof si) != (ssize_t)sizeof si)
            continue;
        if (si.ssi_signo != SIGCHLD) {
            signal_job(pidns, SIGTERM);
            continue;
        }
        int st;
        for (pid_t w; (w = waitpid(-1, &st, WNOHANG)) > 0;) {
            if (w == spare) { /* the spare died unasked: the next replacement starts cold */
                close(spare_w);
                spare = -1;
                spare_w = -1;
                continue;
            }
            int r = 0;
            while (r < nchild && child[r] != w)
                r++;
            if (r == nchild)
                continue; /* an orphan of the job, reaped */
            child[r] = -1;
            left--;
            int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            int bad = nranks > 0 && code != 0 && code != RK_EXIT_STOPPED;
            if (orders >= 0 && bad) {
                /* in place: which rank and how, then rk run decides (a rank to start again,
                 * or give up); the job ends here only if no rank is left */
                if (first_code < 0)
                    first_code = code;
                write_failed(failed, r, code);
                if (left > 0)
                    continue;
                _exit(code);
            }
            /* the launcher, a failed rank (mpirun's rule), or the last rank: the job ends */
            if (bad)
                write_errno(failed, r); /* which rank, before the others' ends are seen */
            if (nranks == 0 || (code != 0 && code != RK_EXIT_STOPPED) || left == 0) {
                signal_job(pidns, SIGKILL); /* the other ranks, and what outlived them */
                _exit(nranks == 0 || (code != 0 && code != RK_EXIT_STOPPED)
                          ? code
                          : (stopped || code == RK_EXIT_STOPPED ? RK_EXIT_STOPPED : 0));
            }
            stopped |= code == RK_EXIT_STOPPED;
        }
    }
}

static int launch_start(rk_launch *l, rk_launcher kind, char *const *launcher_args, int n,
                        char *const *worker, char *const *env, int want_pidns, int inplace,
                        rk_err *err);

int rk_launch_start(rk_launch *l, rk_launcher kind, char *const *launcher_args, int n,
                    char *const *worker, char *const *env, int want_pidns, rk_err *err)
{
    return launch_start(l, kind, launcher_args, n, worker, env, want_pidns, 0, err);
}

int rk_launch_start_inplace(rk_launch *l, int n, char *const *worker, char *const *env,
                            int want_pidns, rk_err *err)
{
    return launch_start(l, RK_LAUNCH_LOCAL, NULL, n, worker, env, want_pidns, 1, err);
}

static int launch_start(rk_launch *l, rk_launcher kind, char *const *launcher_args, int n,
                        char *const *worker, char *const *env, int want_pidns, int inplace,
                        rk_err *err)
{
    memset(l, 0, sizeof *l);
    l->life = l->failed = l->orders = -1;
    const char *argv[MAX_ARGS];
    char nbuf[16];
    if (build_argv(kind, launcher_args, n, worker, argv, nbuf, sizeof nbuf) < 0)
        return rk_err_set(err, RK_EINVAL, "launch: more than %d arguments", MAX_ARGS);
    static char preload[8400];
    const char *lo = getenv("RK_RUN_LOOPBACK"); /* "0": no preload */
    int want_lo = !(lo && strcmp(lo, "0") == 0);
#if defined(__SANITIZE_ADDRESS__)
    want_lo = 0; /* a sanitised build's ranks must load the sanitiser's runtime first */
#endif
    l->loopback = want_lo && kind == RK_LAUNCH_MPIRUN && !rk_launch_names_hosts(launcher_args) &&
                  loopback_preload(preload, sizeof preload);
    int life[2], report[2], failed[2];
    if (pipe2(life, O_CLOEXEC) != 0)
        return rk_err_set(err, RK_EIO, "launch: pipe: %s", strerror(errno));
    if (pipe2(report, O_CLOEXEC) != 0) {
        close(life[0]);
        close(life[1]);
        return rk_err_set(err, RK_EIO, "launch: pipe: %s", strerror(errno));
    }
    int orders[2] = {-1, -1};
    if (pipe2(failed, O_CLOEXEC | O_NONBLOCK) != 0 || (inplace && pipe2(orders, O_CLOEXEC) != 0)) {
        int e = errno;
        close(life[0]);
        close(life[1]);
        close(report[0]);
        close(report[1]);
        if (orders[0] < 0 && failed[0] >= 0 && inplace) {
            close(failed[0]);
            close(failed[1]);
        }
        return rk_err_set(err, RK_EIO, "launch: pipe: %s", strerror(e));
    }
    l->inplace = inplace;
    /* the next child is pid 1 of a new PID namespace; this process stays where it is */
    int self_ns = want_pidns ? open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC) : -1;
    if (self_ns >= 0 && unshare(CLONE_NEWPID) == 0)
        l->pidns = 1;
    else
        l->ns_errno = want_pidns ? errno : 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(life[1]);
        close(report[0]);
        close(failed[0]);
        if (orders[1] >= 0)
            close(orders[1]);
        keeper(l->pidns, life[0], report[1], argv, env, l->loopback ? preload : NULL,
               kind == RK_LAUNCH_LOCAL ? n : 0, failed[1], orders[0]);
    }
    int fork_errno = errno;
    if (l->pidns && setns(self_ns, CLONE_NEWPID) != 0) { /* later children: our namespace */
        fork_errno = errno;
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        pid = -1;
    }
    if (self_ns >= 0)
        close(self_ns);
    close(life[0]);
    close(report[1]);
    close(failed[1]);
    l->failed = failed[0];
    if (orders[0] >= 0)
        close(orders[0]);
    l->orders = orders[1];
    if (pid < 0) {
        if (l->orders >= 0)
            close(l->orders);
        l->orders = -1;
        close(life[1]);
        close(report[0]);
        close(l->failed);
        l->failed = -1;
        return rk_err_set(err, RK_EIO, "launch: fork failed: %s", strerror(fork_errno));
    }
    setpgid(pid, pid);
    l->pid = pid;
    l->life = life[1];
    int e = 0;
    ssize_t r;
    do /* end of file once the launcher's exec succeeded (the pipe is close-on-exec) */
        r = read(report[0], &e, sizeof e);
    while (r < 0 && errno == EINTR);
    close(report[0]);
    if (r == (ssize_t)sizeof e) {
        rk_launch_kill(l, 0);
        l->pid = 0;
        return rk_err_set(err, RK_ENOENT, "cannot run the %s %s: %s",
                          kind == RK_LAUNCH_LOCAL ? "worker" : "launcher", argv[0], strerror(e));
    }
    return RK_OK;
}

int rk_launch_poll(rk_launch *l)
{
    if (l->exited || l->pid <= 0)
        return 1;
    int st = 0;
    pid_t r = waitpid(l->pid, &st, WNOHANG);
    if (r == l->pid || (r < 0 && errno == ECHILD)) { /* ECHILD: reaped already, never reuse */
        l->exited = 1;
        l->status = r == l->pid ? st : 1 << 8;
        if (l->life >= 0)
            close(l->life);
        l->life = -1;
        return 1;
    }
    return 0;
}

int rk_launch_failed(rk_launch *l, int *code)
{
    int msg[2] = {-1, -1};
    if (l->failed < 0 || read(l->failed, msg, sizeof msg) != (ssize_t)sizeof msg)
        return -1;
    *code = msg[1];
    return msg[0];
}

int rk_launch_respawn(rk_launch *l, int rank, char *const *extra)
{
    char buf[4096];
    int head[2] = {rank, 0};
    size_t used = sizeof head;
    if (pack_strings(buf, sizeof buf, &used, extra) != 0)
        return RK_EINVAL;
    head[1] = (int)(used - sizeof head);
    memcpy(buf, head, sizeof head);
    if (l->orders < 0 || l->exited)
        return RK_EIO;
    ssize_t w;
    do /* one write of at most PIPE_BUF bytes: whole or not at all */
        w = write(l->orders, buf, used);
    while (w < 0 && errno == EINTR);
    return w == (ssize_t)used ? RK_OK : RK_EIO;
}

int rk_launch_failed_rank(rk_launch *l)
{
    int r = -1;
    if (l->failed < 0 || read(l->failed, &r, sizeof r) != (ssize_t)sizeof r)
        return -1;
    return r;
}

int rk_launch_owns(const rk_launch *l, pid_t pid)
{
    return l->pid > 0 && !l->exited && rk_proc_descends(pid, l->pid);
}

static void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

void rk_launch_kill(rk_launch *l, double grace_s)
{
    if (l->pid <= 0)
        return;
    if (!rk_launch_poll(l)) {
        if (grace_s > 0) {
            kill(l->pid, SIGTERM); /* the keeper passes it on to the whole job */
            for (double t = 0; t < grace_s; t += 0.02) {
                if (rk_launch_poll(l))
                    break;
                nap(0.02);
            }
        }
        if (!l->exited) {
            if (!l->pidns)
                kill_tree(l->pid); /* the keeper cannot clean up after a SIGKILL */
            kill(l->pid, SIGKILL); /* with a namespace, the kernel kills all of it */
            int st;
            if (waitpid(l->pid, &st, 0) == l->pid) {
                l->exited = 1;
                l->status = st;
            }
        }
    }
    if (l->life >= 0)
        close(l->life);
    l->life = -1;
    if (l->failed >= 0)
        close(l->failed);
    l->failed = -1;
    if (l->orders >= 0)
        close(l->orders);
    l->orders = -1;
    /* rk run is a subreaper: whatever escaped the keeper was reparented here */
    kill_tree(getpid());
}
