/*
 * Launching a job's ranks through an existing launcher (supervisor.h): Open MPI's mpirun, or
 * srun under Slurm. One small piece: argv arrays and execvp, the launcher in its own process
 * group so the whole job can be signalled at once.
 */
#include "supervisor/supervisor.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 512

/* argv for the launcher; strings point into `nbuf` (the rank count) or the inputs. */
static int build_argv(rk_launcher kind, char *const *extra, int n, char *const *worker,
                      const char **argv, char *nbuf, size_t ncap)
{
    int k = 0;
    snprintf(nbuf, ncap, "%d", n);
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
        argv[k++] = "none"; /* each rank runs its own threads */
        argv[k++] = "-np";
        argv[k++] = nbuf;
    }
    for (int i = 0; extra && extra[i]; i++) {
        if (k >= MAX_ARGS - 2)
            return -1;
        argv[k++] = extra[i];
    }
    for (int i = 0; worker[i]; i++) {
        if (k >= MAX_ARGS - 1)
            return -1;
        argv[k++] = worker[i];
    }
    argv[k] = NULL;
    return k;
}

const char *rk_launch_describe(rk_launcher kind, int n, char *const *launcher_args,
                               char *const *worker, char *buf, size_t cap)
{
    const char *argv[MAX_ARGS];
    char nbuf[16];
    buf[0] = '\0';
    if (build_argv(kind, launcher_args, n, worker, argv, nbuf, sizeof nbuf) < 0)
        return "(too many arguments)";
    size_t used = 0;
    for (int i = 0; argv[i] && used + 1 < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, i ? " %s" : "%s", argv[i]);
    return buf;
}

int rk_launch_start(rk_launch *l, rk_launcher kind, char *const *launcher_args, int n,
                    char *const *worker, char *const *env, rk_err *err)
{
    memset(l, 0, sizeof *l);
    const char *argv[MAX_ARGS];
    char nbuf[16];
    if (build_argv(kind, launcher_args, n, worker, argv, nbuf, sizeof nbuf) < 0)
        return rk_err_set(err, RK_EINVAL, "launch: more than %d arguments", MAX_ARGS);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return rk_err_set(err, RK_EIO, "launch: fork failed: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        for (int i = 0; env && env[i]; i++)
            putenv(env[i]);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "rk run: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* also here: no race with the first kill */
    l->pid = pid;
    return RK_OK;
}

int rk_launch_poll(rk_launch *l)
{
    if (l->exited || l->pid <= 0)
        return 1;
    int st;
    pid_t r = waitpid(l->pid, &st, WNOHANG);
    if (r == l->pid) {
        l->exited = 1;
        l->status = st;
        return 1;
    }
    return 0;
}

static void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

void rk_launch_kill(rk_launch *l, double grace_s)
{
    if (l->pid <= 0 || rk_launch_poll(l))
        return;
    kill(-l->pid, SIGTERM);
    for (double t = 0; t < grace_s; t += 0.02) {
        if (rk_launch_poll(l))
            break;
        nap(0.02);
    }
    kill(-l->pid, SIGKILL); /* the group may outlive its leader */
    if (!l->exited) {
        int st;
        if (waitpid(l->pid, &st, 0) == l->pid) {
            l->exited = 1;
            l->status = st;
        }
    }
}
