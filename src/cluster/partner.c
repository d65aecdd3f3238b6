/*
 * A node agent's side of the partner copies (cluster/partner.h). Out: the ranks' newest pins
 * found by a scan of the job's directory, one generation at a time, read from the open file
 * (a put never writes over a pinned file, and a pin removed meanwhile is still its inode: what
 * goes is the file as it was; the receiver verifies every checksum anyway) in SNAP_DATA
 * pieces of RK_NODE_SNAP_CHUNK bytes, as many a turn as the link takes without waiting, so that the
 * agent's loop goes on reading and answering pings; a fetch asked for goes first (a push in
 * flight is given up: its receiver hears an END that does not match). In: the store's receive
 * side (rk_snap_recv_*), one per transfer, given up when nothing of it came for
 * RK_PARTNER_STALE_S or when the same rank's next one of the same kind begins. Relies on the
 * store's checks (rekindle/snap.h).
 */
#define _GNU_SOURCE
#include "cluster/partner.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "cluster/nodes.h"
#include "rekindle/snap.h"

#define SENT_MAX 256 /* ranks of this node whose newest pin sent is remembered */
#define FETCH_MAX 16 /* SNAP_FETCHes waiting their turn */
#define HELD_SUBDIR "held"

typedef struct inflight {
    int used;
    double last;     /* its last message */
    rk_node_snap m;  /* as SNAP_BEGIN said it (its xfer the coordinator's) */
    rk_snap_recv *r; /* NULL: refused at the start; its pieces are dropped */
} inflight;

struct rk_partner {
    char dir[RK_SNAP_PATH_MAX];
    uint32_t node;
    void (*on_log)(void *ctx, const char *line);
    void *ctx;
    /* out: each rank's newest pin sent, the generation in flight, the fetches asked */
    struct {
        int rank;
        int64_t step;
    } sent[SENT_MAX];
    int nsent;
    double next_scan;
    int fd; /* the generation in flight, open (-1: none); its BEGIN went */
    rk_node_snap out;
    uint64_t off;
    uint32_t next_xfer;
    rk_node_snap fetch[FETCH_MAX];
    int nfetch;
    /* the node's snapshot memory, said in SNAP_MEM (mem_said: since the link came up) */
    double next_mem;
    int mem_said;
    rk_node_snap_mem mem;
    /* in */
    inflight in[RK_PARTNER_RECV_MAX];
    uint8_t piece[RK_NODE_SNAP_DATA_HDR + RK_NODE_SNAP_CHUNK];
};

__attribute__((format(printf, 2, 3))) static void say(rk_partner *p, const char *fmt, ...)
{
    if (!p->on_log)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    p->on_log(p->ctx, line);
}

int rk_partner_new(rk_partner **out, const char *dir, uint32_t node,
                   void (*on_log)(void *ctx, const char *line), void *ctx, rk_err *err)
{
    *out = NULL;
    if (!dir || !dir[0] || strlen(dir) >= RK_SNAP_PATH_MAX - 32)
        return rk_err_set(err, RK_EINVAL, "partner: no snapshot directory");
    rk_partner *p = calloc(1, sizeof *p);
    if (!p)
        return rk_err_set(err, RK_ENOMEM, "partner: out of memory");
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    p->node = node;
    p->fd = -1;
    p->on_log = on_log;
    p->ctx = ctx;
    *out = p;
    return RK_OK;
}

static int64_t *sent_of(rk_partner *p, int rank)
{
    for (int i = 0; i < p->nsent; i++)
        if (p->sent[i].rank == rank)
            return &p->sent[i].step;
    if (p->nsent == SENT_MAX)
        return NULL;
    p->sent[p->nsent].rank = rank;
    p->sent[p->nsent].step = -1;
    return &p->sent[p->nsent++].step;
}

static void drop_in(inflight *x)
{
    rk_snap_recv_abort(x->r);
    *x = (inflight){0};
}

static void drop_out(rk_partner *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    p->off = 0;
}

void rk_partner_link_lost(rk_partner *p)
{
    if (!p)
        return;
    for (int i = 0; i < RK_PARTNER_RECV_MAX; i++)
        if (p->in[i].used)
            drop_in(&p->in[i]);
    if (p->fd >= 0 && p->out.kind == RK_NODE_SNAP_PUSH) { /* not sent whole: the next scan again */
        int64_t *sent = sent_of(p, (int)p->out.rank);
        if (sent && *sent == p->out.step)
            *sent = p->out.step - 1;
    }
    drop_out(p);
    p->nfetch = 0;
    p->mem_said = 0; /* said again on the next link */
    p->next_mem = 0;
}

void rk_partner_free(rk_partner *p)
{
    if (!p)
        return;
    rk_partner_link_lost(p);
    free(p);
}

int rk_partner_sending(const rk_partner *p)
{
    return p && (p->fd >= 0 || p->nfetch > 0);
}

/* ---- out ----------------------------------------------------------------------------------- */

/* Regular file `name` of directory `dfd`, open into *out, its size (1..RK_NODE_SNAP_BYTES_MAX)
 * into *len: 0, or -1 with why[]. Sent from the open file piece by piece: the agent holds one
 * piece in memory, and a pin or generation removed meanwhile is still read whole (its inode;
 * the store never writes over one). */
static int open_whole(int dfd, const char *name, int *out, uint64_t *len, char *why, size_t cap)
{
    *out = -1;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(why, cap, "%s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 1 || (uint64_t)st.st_size > RK_NODE_SNAP_BYTES_MAX) {
        snprintf(why, cap, "not a regular file of 1 to %" PRIu64 " bytes", RK_NODE_SNAP_BYTES_MAX);
        close(fd);
        return -1;
    }
    *out = fd;
    *len = (uint64_t)st.st_size;
    return 0;
}

/* The newest pin of each rank of this node that was not sent: the one of the oldest step
 * among them (every rank gets its turn) into *rank, *step, its name into name[]. 1 if found.
 * A rank whose newest pin is below the last one sent was rolled back: what was sent is
 * forgotten and its newest pin goes. When the one chosen went past another one never sent,
 * that is said: the partner copy lags. */
static int find_pin(rk_partner *p, int *rank, int64_t *step, char *name, size_t cap)
{
    DIR *d = opendir(p->dir);
    if (!d)
        return 0;
    int found = 0, skipped = 0;
    for (struct dirent *de; (de = readdir(d));) {
        int r;
        char tail;
        if (sscanf(de->d_name, "rank-%d%c", &r, &tail) != 1 || r < 0)
            continue;
        int rfd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        /* rk-fd: rfd is close-on-exec (O_CLOEXEC above) */
        DIR *rd = rfd >= 0 ? fdopendir(rfd) : NULL;
        if (!rd) {
            if (rfd >= 0)
                close(rfd);
            continue;
        }
        int64_t newest = -1, s, *sent = sent_of(p, r);
        int unsent = 0; /* pins above the last one sent */
        char nm[256] = "";
        for (struct dirent *pe; (pe = readdir(rd));)
            if (rk_snap_pin_name_step(pe->d_name, &s) && s > newest) {
                newest = s;
                snprintf(nm, sizeof nm, "%s", pe->d_name);
            }
        if (sent && newest >= 0 && newest < *sent)
            *sent = -1; /* rolled back below what was sent */
        rewinddir(rd);
        for (struct dirent *pe; sent && (pe = readdir(rd));)
            unsent += rk_snap_pin_name_step(pe->d_name, &s) && s > *sent;
        closedir(rd);
        if (!sent || newest < 0 || newest <= *sent)
            continue;
        if (!found || newest < *step) {
            found = 1;
            *rank = r;
            *step = newest;
            skipped = unsent > 1 && *sent >= 0;
            snprintf(name, cap, "%s/%s", de->d_name, nm);
        }
    }
    closedir(d);
    if (found && skipped)
        say(p,
            "the partner copy of rank %d skips a pin: step %" PRId64
            " goes, an older one was never sent (the link is slower than the pins)",
            *rank, *step);
    return found;
}

/* A SNAP_BEGIN, SNAP_END or SNAP_HELD of m: 0, or -1 when the send failed. */
static int send_snap(uint8_t type, const rk_node_snap *m, rk_node_send_fn send, void *ctx)
{
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    if (rk_node_snap_format(m, out, sizeof out, &len, &e))
        return 0; /* never: the fields came from a parse or a file's size */
    return send(ctx, type, out, len);
}

/* The next generation to send, read and begun: a fetch asked for first, else a new pin. */
static int start_next(rk_partner *p, rk_node_send_fn send, void *ctx)
{
    char name[RK_SNAP_PATH_MAX + 160], why[256];
    int fd;
    uint64_t len;
    while (p->nfetch > 0) {
        rk_node_snap m = p->fetch[0];
        memmove(p->fetch, p->fetch + 1, (size_t)--p->nfetch * sizeof p->fetch[0]);
        char gen[RK_CKPT_NAME_MAX];
        rk_snap_file_name(m.step, gen, sizeof gen);
        snprintf(name, sizeof name, "%s/%s/rank-%u/%s", p->dir, HELD_SUBDIR, (unsigned)m.rank, gen);
        char held[RK_SNAP_PATH_MAX + 16];
        snprintf(held, sizeof held, "%s/%s", p->dir, HELD_SUBDIR);
        rk_err e = {0};
        int bad = rk_snap_get(held, (int)m.rank, m.step, NULL, &e) != RK_OK; /* verified */
        if (bad)
            snprintf(why, sizeof why, "%.200s", e.msg);
        else if (open_whole(AT_FDCWD, name, &fd, &len, why, sizeof why) || len != m.bytes) {
            if (fd >= 0) {
                snprintf(why, sizeof why, "not of the size the coordinator asked for");
                close(fd);
            }
            bad = 1;
        }
        if (bad) { /* an end without a start: the coordinator hears it cannot come */
            say(p, "cannot send back the partner copy of rank %u, step %" PRId64 ": %s",
                (unsigned)m.rank, m.step, why);
            if (send_snap(RK_NODE_MSG_SNAP_END, &m, send, ctx))
                return -1;
            continue;
        }
        p->fd = fd;
        p->out = m; /* its xfer is the coordinator's: the answer to its SNAP_FETCH */
        p->off = 0;
        return send_snap(RK_NODE_MSG_SNAP_BEGIN, &p->out, send, ctx);
    }
    double now = rk_mono_s();
    if (now < p->next_scan)
        return 0;
    p->next_scan = now + RK_PARTNER_SCAN_S;
    int rank = 0;
    int64_t step = 0;
    char rel[600];
    if (!find_pin(p, &rank, &step, rel, sizeof rel))
        return 0;
    int dfd = open(p->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int bad = dfd < 0 || open_whole(dfd, rel, &fd, &len, why, sizeof why);
    if (dfd >= 0)
        close(dfd);
    int64_t *sent = sent_of(p, rank);
    if (bad) { /* gone since the scan (a newer pin took its place): the next scan finds that */
        return 0;
    }
    if (sent)
        *sent = step; /* counted when begun; a link lost before its end takes it back */
    p->next_xfer = (p->next_xfer + 1) & ~RK_NODE_SNAP_XFER_FETCH; /* below the fetches' bit */
    if (p->next_xfer == 0)
        p->next_xfer = 1;
    p->fd = fd;
    p->out = (rk_node_snap){.xfer = p->next_xfer,
                            .kind = RK_NODE_SNAP_PUSH,
                            .node = p->node,
                            .rank = (uint32_t)rank,
                            .step = step,
                            .bytes = len};
    p->off = 0;
    return send_snap(RK_NODE_MSG_SNAP_BEGIN, &p->out, send, ctx);
}

/* A push in flight given up (a fetch goes first): its receiver hears an END that does not
 * match its start and drops what it has; the pin is sent again later. */
static int give_up_push(rk_partner *p, rk_node_send_fn send, void *ctx)
{
    rk_node_snap m = p->out;
    m.bytes = m.bytes == 1 ? 2 : m.bytes - 1;
    int64_t *sent = sent_of(p, (int)p->out.rank);
    if (sent && *sent == p->out.step)
        *sent = p->out.step - 1;
    drop_out(p);
    return send_snap(RK_NODE_MSG_SNAP_END, &m, send, ctx);
}

/* A fetch's answer that cannot go on: an END that does not match its start (the coordinator
 * hears the holder could not send it, its receiver drops what it has). */
static int give_up_out(rk_partner *p, rk_node_send_fn send, void *ctx)
{
    rk_node_snap m = p->out;
    m.bytes = m.bytes == 1 ? 2 : m.bytes - 1;
    drop_out(p);
    return send_snap(RK_NODE_MSG_SNAP_END, &m, send, ctx);
}

/* Generations being received that nothing came of for RK_PARTNER_STALE_S: their sender or
 * the coordinator's relay gave them up without a word (a node lost): removed. */
static void drop_stale(rk_partner *p)
{
    double now = rk_mono_s();
    for (int i = 0; i < RK_PARTNER_RECV_MAX; i++)
        if (p->in[i].used && now - p->in[i].last > RK_PARTNER_STALE_S) {
            say(p, "rank %u's snapshot of step %" PRId64 " dropped: nothing of it for %g s",
                (unsigned)p->in[i].m.rank, p->in[i].m.step, RK_PARTNER_STALE_S);
            drop_in(&p->in[i]);
        }
}

/* The node's snapshot memory now (the ranks' directories, the partner copies held), said
 * when it changed, every RK_PARTNER_MEM_S at most. A directory that cannot be read (gone at
 * the job's end) counts 0. */
static int say_mem(rk_partner *p, rk_node_send_fn send, void *ctx)
{
    double now = rk_mono_s();
    if (now < p->next_mem)
        return 0;
    p->next_mem = now + RK_PARTNER_MEM_S;
    uint64_t own = 0, held = 0;
    char hd[RK_SNAP_PATH_MAX];
    rk_err e = {0};
    if (rk_snap_bytes(p->dir, &own, &e) != RK_OK)
        own = 0;
    if (rk_snap_held_dir(p->dir, hd, sizeof hd, &e) != RK_OK || rk_snap_bytes(hd, &held, &e))
        held = 0;
    rk_node_snap_mem m = {.own = (int64_t)(own > (uint64_t)RK_NODE_SNAP_MEM_MAX ? 0 : own),
                          .held = (int64_t)(held > (uint64_t)RK_NODE_SNAP_MEM_MAX ? 0 : held)};
    if (p->mem_said && m.own == p->mem.own && m.held == p->mem.held)
        return 0;
    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    if (rk_node_snap_mem_format(&m, out, sizeof out, &len, &e))
        return 0;
    p->mem = m;
    p->mem_said = 1;
    return send(ctx, RK_NODE_MSG_SNAP_MEM, out, len);
}

int rk_partner_pump(rk_partner *p, int pieces, rk_node_send_fn send, void *ctx)
{
    if (!p)
        return 0;
    drop_stale(p);
    if (pieces < 1)
        return 0;
    if (say_mem(p, send, ctx))
        return -1;
    if (p->fd >= 0 && p->nfetch > 0 && p->out.kind == RK_NODE_SNAP_PUSH &&
        give_up_push(p, send, ctx))
        return -1;
    if (p->fd < 0 && start_next(p, send, ctx))
        return -1;
    for (int i = 0; p->fd >= 0 && i < pieces; i++) {
        if (p->off == p->out.bytes) {
            int rc = send_snap(RK_NODE_MSG_SNAP_END, &p->out, send, ctx);
            drop_out(p);
            return rc;
        }
        size_t n = p->out.bytes - p->off < RK_NODE_SNAP_CHUNK ? (size_t)(p->out.bytes - p->off)
                                                              : RK_NODE_SNAP_CHUNK;
        rk_node_snap_data_header(p->out.xfer, p->off, p->piece);
        size_t got = 0;
        while (got < n) { /* the file's inode: a pin or generation removed meanwhile reads on */
            ssize_t r = pread(p->fd, p->piece + RK_NODE_SNAP_DATA_HDR + got, n - got,
                              (off_t)(p->off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (got < n) { /* shorter than when begun: given up, its receiver keeps nothing */
            say(p, "rank %u's snapshot of step %" PRId64 " could not be read whole: given up",
                (unsigned)p->out.rank, p->out.step);
            return p->out.kind == RK_NODE_SNAP_PUSH ? give_up_push(p, send, ctx)
                                                    : give_up_out(p, send, ctx);
        }
        if (send(ctx, RK_NODE_MSG_SNAP_DATA, p->piece, RK_NODE_SNAP_DATA_HDR + n))
            return -1;
        p->off += n;
    }
    return 0;
}

/* ---- in ------------------------------------------------------------------------------------ */

static inflight *in_of(rk_partner *p, uint32_t xfer)
{
    for (int i = 0; i < RK_PARTNER_RECV_MAX; i++)
        if (p->in[i].used && p->in[i].m.xfer == xfer)
            return &p->in[i];
    return NULL;
}

static void on_begin(rk_partner *p, const rk_node_snap *m)
{
    inflight *x = in_of(p, m->xfer);
    if (x) /* the same transfer again: the first is abandoned */
        drop_in(x);
    for (int i = 0; i < RK_PARTNER_RECV_MAX; i++) /* the rank's next one: the last is given up */
        if (p->in[i].used && p->in[i].m.kind == m->kind && p->in[i].m.rank == m->rank)
            drop_in(&p->in[i]);
    x = NULL;
    for (int i = 0; !x && i < RK_PARTNER_RECV_MAX; i++)
        if (!p->in[i].used)
            x = &p->in[i];
    if (!x) {
        say(p, "a partner copy of rank %u (step %" PRId64 ") refused: %d being received already",
            (unsigned)m->rank, m->step, RK_PARTNER_RECV_MAX);
        return;
    }
    *x = (inflight){.used = 1, .m = *m, .last = rk_mono_s()};
    char dir[RK_SNAP_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s", p->dir);
    if (m->kind == RK_NODE_SNAP_PUSH) { /* held for another node: never this node's own ranks' */
        snprintf(dir, sizeof dir, "%s/%s", p->dir, HELD_SUBDIR);
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            say(p, "cannot hold partner copies in %s: %s", dir, strerror(errno));
            return;
        }
    }
    rk_err e = {0};
    if (rk_snap_recv_begin(dir, (int)m->rank, m->step, m->bytes, &x->r, &e))
        say(p, "cannot keep rank %u's snapshot of step %" PRId64 ": %s", (unsigned)m->rank, m->step,
            e.msg);
}

static void on_end(rk_partner *p, const rk_node_snap *m, rk_node_send_fn send, void *ctx)
{
    inflight *x = in_of(p, m->xfer);
    if (!x)
        return;
    rk_node_snap got = x->m;
    rk_snap_recv *r = x->r;
    *x = (inflight){0};
    if (!r)
        return;
    rk_err e = {0};
    if (memcmp(&got, m, sizeof got) != 0) {
        rk_snap_recv_abort(r);
        say(p, "rank %u's snapshot of step %" PRId64 " dropped: its end does not match its start",
            (unsigned)got.rank, got.step);
        return;
    }
    if (rk_snap_recv_commit(r, &e)) { /* a torn or corrupt copy is never kept */
        say(p, "rank %u's snapshot of step %" PRId64 " dropped: %s", (unsigned)got.rank, got.step,
            e.msg);
        return;
    }
    if (got.kind == RK_NODE_SNAP_FETCH)
        say(p,
            "rank %u's snapshot of step %" PRId64 " (a partner copy of node %u's) is now this "
            "node's",
            (unsigned)got.rank, got.step, (unsigned)got.node);
    (void)send_snap(RK_NODE_MSG_SNAP_HELD, &got, send, ctx); /* a failed send: the link's end */
}

int rk_partner_msg(rk_partner *p, uint8_t type, const uint8_t *payload, size_t len,
                   rk_node_send_fn send, void *ctx)
{
    rk_err e = {0};
    rk_node_snap m;
    switch (type) {
    case RK_NODE_MSG_SNAP_DATA: {
        uint32_t xfer;
        uint64_t off;
        const uint8_t *bytes;
        size_t n;
        if (rk_node_snap_data_parse(payload, len, &xfer, &off, &bytes, &n, &e))
            return -1;
        inflight *x = in_of(p, xfer);
        if (x)
            x->last = rk_mono_s();
        if (x && x->r && rk_snap_recv_write(x->r, off, bytes, n, &e)) {
            say(p, "rank %u's snapshot of step %" PRId64 " dropped: %s", (unsigned)x->m.rank,
                x->m.step, e.msg);
            rk_snap_recv_abort(x->r);
            x->r = NULL; /* its other pieces and its end are dropped */
        }
        return 0;
    }
    case RK_NODE_MSG_SNAP_BEGIN:
    case RK_NODE_MSG_SNAP_END:
    case RK_NODE_MSG_SNAP_FETCH:
        if (rk_node_snap_parse(payload, len, &m, &e))
            return -1;
        if (type == RK_NODE_MSG_SNAP_BEGIN)
            on_begin(p, &m);
        else if (type == RK_NODE_MSG_SNAP_END)
            on_end(p, &m, send, ctx);
        else if (m.kind != RK_NODE_SNAP_FETCH || p->nfetch == FETCH_MAX)
            say(p, "a SNAP_FETCH of rank %u refused: %s", (unsigned)m.rank,
                m.kind != RK_NODE_SNAP_FETCH ? "not of kind fetch" : "too many waiting");
        else
            p->fetch[p->nfetch++] = m;
        return 0;
    default: return 0;
    }
}
