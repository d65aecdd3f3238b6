/*
 * Running a helper program (base/proc.h): fork, exec with an argv, its output through a pipe
 * read with poll against a deadline, its process group killed past it. And what every child
 * of rk does before an exec: every descriptor but stdin, stdout and stderr close-on-exec.
 */
#define _GNU_SOURCE /* pipe2 */
#include "base/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"

#define RK_CLOSE_RANGE_CLOEXEC (1U << 2) /* linux/close_range.h, Linux 5.11 */
#define CLOEXEC_EACH_MAX 1048576         /* descriptors the fallback walks at most */

void rk_proc_cloexec_each(int lowfd)
{
    struct rlimit rl;
    long top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                   ? (long)rl.rlim_cur
                   : CLOEXEC_EACH_MAX;
    if (top > CLOEXEC_EACH_MAX)
        top = CLOEXEC_EACH_MAX;
    for (long fd = lowfd < 0 ? 0 : lowfd; fd < top; fd++)
        (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* EBADF for a number not in use */
}

void rk_proc_cloexec_from(int lowfd)
{
#ifdef SYS_close_range
    if (lowfd >= 0 && syscall(SYS_close_range, (unsigned)lowfd, ~0U, RK_CLOSE_RANGE_CLOEXEC) == 0)
        return;
#endif
    rk_proc_cloexec_each(lowfd); /* ENOSYS, or EINVAL for the flag: a kernel before 5.11 */
}

int rk_proc_run(char *const argv[], char *out, size_t cap, double wait_s, int flags)
{
    int fd[2];
    if (cap)
        out[0] = '\0';
    if (cap == 0 || pipe2(fd, O_CLOEXEC) != 0)
        return 127;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return 127;
    }
    if (pid == 0) {
        setpgid(0, 0); /* a wrapper's own children go with it past the time limit */
        rk_proc_cloexec_from(STDERR_FILENO + 1); /* nothing of ours goes to the helper */
        dup2(fd[1], STDOUT_FILENO);
        if (flags & RK_PROC_STDERR_NULL) {
            int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
            if (null >= 0)
                dup2(null, STDERR_FILENO);
        } else {
            dup2(fd[1], STDERR_FILENO);
        }
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    close(fd[1]);
    setpgid(pid, pid); /* as the child does: whichever runs first */
    size_t len = 0;
    double end = rk_mono_s() + wait_s;
    int timed_out = 0, truncated = 0;
    for (;;) {
        double left = end - rk_mono_s();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p = {.fd = fd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r <= 0)
            continue; /* EINTR, or the time is checked above */
        char buf[4096];
        ssize_t got = read(fd[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        size_t keep = (size_t)got;
        if (keep > cap - 1 - len) {
            keep = cap - 1 - len;
            truncated = 1;
        }
        memcpy(out + len, buf, keep);
        len += keep;
    }
    out[len] = '\0';
    close(fd[0]);
    if (timed_out)
        kill(-pid, SIGKILL); /* its group: our own child and what it started */
    int st = 0;
    pid_t w;
    while ((w = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {
    }
    if (timed_out)
        return -1;
    if (w != pid) /* no status (SIGCHLD ignored by whoever started us): not a success */
        return 125;
    if (truncated)
        return RK_PROC_TOO_LONG;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

int rk_proc_stat(pid_t pid, char *state, pid_t *ppid, unsigned long long *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0)
        return -1;
    buf[r] = '\0';
    const char *p = strrchr(buf, ')');
    char st;
    int pp;
    unsigned long long t;
    /* after ")": state (3), ppid (4), fields 5..21, starttime (22) */
    if (!p || sscanf(p + 1,
                     " %c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                     "%*d %llu",
                     &st, &pp, &t) != 3)
        return -1;
    if (state)
        *state = st;
    if (ppid)
        *ppid = (pid_t)pp;
    if (start)
        *start = t;
    return 0;
}
