/*
 * Stacks of a hung rank (docs/run.md, "Stacks of a hung rank"; docs/protocol.md, hello's
 * "stacks"): before a hung launch is torn down, SIGUSR1 to each hung rank that said it dumps
 * its stacks, by the kernel's pid of its connection and only if that is a process of this
 * launch; up to 2 s for $RK_STACK_DIR/stacks-rank<R>-launch<L>.txt to appear and stop
 * growing; what it wrote copied to rk run's stderr (bounded, a regular file opened with
 * O_NOFOLLOW, control characters removed, each line prefixed), its path kept for the event
 * only when something was copied. A rank on another host (a connection of the backend's) is
 * asked through the backend (backend.h: ask_stacks; the cluster's agent), whose answer lands
 * in the same file here (sup_stack_append).
 */
#include "supervisor/sup.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/text.h"
#include "supervisor/stackwait.h"

#define STACKS_REMOTE_S 1.5        /* more for a dump that comes over the node link */
#define STACKS_COPY_MAX (64 << 10) /* bytes of a dump copied into the log */
#define STACKS_LINE_MAX 512        /* bytes of one line shown */

typedef struct dump {
    int rank;
    rk_sup_conn *remote; /* a rank on another host: its backend sends the dump */
    char path[4200];
    rk_stack_wait w; /* its file since the signal */
} dump;

/* Copy bytes [from, from + STACKS_COPY_MAX) of d->path to stderr, one prefixed, cleaned
 * line at a time. 1 if something was copied; 0 if the file was refused (a link, not a regular
 * file) or held nothing new. */
static int copy_dump(const sup *s, const dump *d)
{
    int fd = open(d->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        sup_say(s, "rank %d: no stack dump in %s (not a regular file)", d->rank, d->path);
        return 0;
    }
    off_t from = st.st_size < d->w.from ? 0 : d->w.from; /* rewritten from the start */
    static char buf[STACKS_COPY_MAX + 1];
    ssize_t n = pread(fd, buf, STACKS_COPY_MAX, from);
    close(fd);
    if (n <= 0) {
        sup_say(s, "rank %d: its stack dump %s is empty", d->rank, d->path);
        return 0;
    }
    buf[n] = '\0';
    sup_say(s, "rank %d's stacks (%s):", d->rank, d->path);
    char line[STACKS_LINE_MAX + 1], shown[STACKS_LINE_MAX + 1];
    for (char *p = buf; p < buf + n;) {
        char *nl = memchr(p, '\n', (size_t)(buf + n - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(buf + n - p);
        size_t take = len < STACKS_LINE_MAX ? len : STACKS_LINE_MAX;
        memcpy(line, p, take);
        line[take] = '\0';
        for (size_t i = 0; i < take; i++)
            if (line[i] == '\0' || line[i] == '\t')
                line[i] = ' '; /* a NUL would end the line early; tabs read as spaces */
        rk_text_clean(shown, sizeof shown, line);
        fprintf(stderr, "rk run:   rank %d | %s\n", d->rank, shown);
        p += len + (nl ? 1 : 0);
    }
    if (st.st_size - from > STACKS_COPY_MAX)
        fprintf(stderr, "rk run:   rank %d | ... (%lld more bytes in %s)\n", d->rank,
                (long long)(st.st_size - from - STACKS_COPY_MAX), d->path);
    return 1;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

long sup_stack_append(sup *s, int rank, const void *bytes, size_t n)
{
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/stacks-rank%d-launch%d.txt", s->stack_dir, rank,
                         s->launch_no) >= sizeof path)
        return -1;
    int fd = open(
        path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { /* not a FIFO or device */
        if (fd >= 0)
            close(fd);
        return -1;
    }
    ssize_t w = write(fd, bytes, n);
    close(fd);
    return w > 0 ? (long)w : 0;
}

void sup_dump_stacks(sup *s, const int *stuck)
{
    int remote = s->b.ops->ask_stacks != NULL; /* ranks on other hosts may be asked */
    static dump d[RK_SUP_MAX_DEVICES];
    int nd = 0;
    s->stacks[0] = '\0';
    for (int r = 0; r < s->n; r++) {
        rk_sup_conn *c = stuck[r] ? sup_by_rank(s, r) : NULL;
        if (!c || !c->stacks || c->fd < 0 || c->pid <= 0)
            continue;
        /* a rank on another host (c->node >= 0): its pid is that host's, never one to
         * signal here, even where a process of ours has the same number: its agent is
         * asked, and signals it there (only ranks an agent started: one mpirun's are not
         * its to signal) */
        if (c->node < 0 && !rk_launch_owns(&s->l, (pid_t)c->pid)) /* never a pid it named */
            continue;
        if (c->node >= 0 && !s->b.ops->ask_stacks)
            continue;
        dump *x = &d[nd];
        x->rank = r;
        x->remote = c->node >= 0 ? c : NULL;
        if ((size_t)snprintf(x->path, sizeof x->path, "%s/stacks-rank%d-launch%d.txt", s->stack_dir,
                             r, s->launch_no) >= sizeof x->path)
            continue;
        rk_stack_wait_begin(&x->w, x->path, rk_ledger_now(&s->g));
        if (x->remote ? s->b.ops->ask_stacks(s->b.ctx, c->node, c->chan, r) != 0
                      : kill((pid_t)c->pid, SIGUSR1) != 0)
            continue;
        nd++;
    }
    if (!nd)
        return;
    sup_say(s, "asked %d hung rank%s for %s stacks (SIGUSR1%s)", nd, nd == 1 ? "" : "s",
            nd == 1 ? "its" : "their", remote ? ", from its host's agent for a rank there" : "");
    double t0 = rk_ledger_now(&s->g);
    for (;;) {
        double now = rk_ledger_now(&s->g);
        int waiting = 0;
        for (int k = 0; k < nd; k++) {
            int complete = rk_stack_wait_complete(&d[k].w, d[k].path, now);
            if (d[k].remote ? !s->b.ops->stacks_done(s->b.ctx, d[k].remote->node, d[k].remote->chan)
                            : !complete)
                waiting++;
        }
        /* a remote dump: the agent's own wait, then the transfer */
        if (!waiting ||
            now - t0 >= (remote ? RK_STACKS_WAIT_S + STACKS_REMOTE_S : RK_STACKS_WAIT_S))
            break;
        if (s->b.ops->pump)
            s->b.ops->pump(s->b.ctx, 0.05); /* the agents' answers come on the node link */
        else
            nap_ms(50);
    }
    size_t used = 0;
    for (int k = 0; k < nd; k++) {
        if (!d[k].w.grew) {
            sup_say(s, "rank %d wrote no stacks to %s within %.1f s", d[k].rank, d[k].path,
                    d[k].remote ? RK_STACKS_WAIT_S + STACKS_REMOTE_S : RK_STACKS_WAIT_S);
            continue;
        }
        if (!copy_dump(s, &d[k]))
            continue; /* the event names only dumps that were copied */
        char clean[sizeof d[k].path];
        rk_text_clean(clean, sizeof clean, d[k].path);
        int w =
            snprintf(s->stacks + used, sizeof s->stacks - used, "%s%s", used ? "\n" : "", clean);
        if (w > 0 && (size_t)w < sizeof s->stacks - used)
            used += (size_t)w;
        else
            s->stacks[used] = '\0';
    }
}
