/*
 * The exporter (exporter/exporter.h, docs/exporter.md): a collector thread that reads every
 * GPU each interval, scores it and swaps in freshly rendered /metrics text, and a
 * libmicrohttpd server (internal epoll threads) whose scrapes only hand out that text, so a
 * scrape never waits on a GPU; and a reaper thread that, with libmicrohttpd's connection
 * notifications, keeps the limits on slow and idle clients (a total deadline per request, a
 * cap per client address). Relies on rekindle/monitor.h for readings and scores and on prom.c
 * for the encoding. Never prints or exits.
 */
#include "exporter/exporter.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/clock.h"
#include "base/msg.h"
#include "health/sim.h"
#include "predict/predict_online.h"
#include "rekindle/monitor.h"

/* One open connection (libmicrohttpd's socket context): what the limits need to know. */
struct conn {
    rk_conn_state st;
    int fd;                /* libmicrohttpd's socket; valid until the CLOSED notification */
    unsigned char key[17]; /* the client: address family and address, no port */
    size_t slot;           /* index in rk_exporter.conns */
};

/* What the collector last said about a GPU, so that on_event fires on changes only. */
enum gpu_state { ST_NEW, ST_OK, ST_BELOW, ST_LOST, ST_NOREAD };

struct rk_exporter {
    rk_exporter_opts o;
    rk_telemetry *t;
    int n;
    rk_monitor *mon; /* history, signals, probability and score of every GPU */
    rk_prom_gpu *gpus;
    enum gpu_state *state;
    rk_prom_stats stats;
    rk_pred_online *pred; /* the predictor's windows, NULL without --predictor */
    bool simulated;
    char backend[16];
    char address[INET6_ADDRSTRLEN + 16];
    bool collect_failing; /* for on_event: the last cycle failed */

    pthread_mutex_t lock; /* guards what the HTTP threads read: below, and `stopping` */
    pthread_cond_t wake;
    struct MHD_Response *metrics; /* the latest /metrics text (MHD counts references) */
    bool ever_ok;
    double last_ok;                /* CLOCK_MONOTONIC seconds of the last good collection */
    char last_err[RK_ERR_MSG_MAX]; /* why the last failing collection failed; "" if none */
    bool stopping;

    /* Open connections, for the limits. conn_lock is taken by libmicrohttpd's threads (in
     * its notifications and on_request) and by the reaper; never together with `lock`. A
     * connection closed by a limit is shut down (shutdown(2)) under conn_lock, so its fd is
     * still libmicrohttpd's: it is closed only after the CLOSED notification removed it. */
    pthread_mutex_t conn_lock;
    struct conn **conns;
    size_t nconns, capconns;
    /* capconns entries each, for rk_exporter_pick_victim: the candidates and their states */
    struct conn **cand;
    const rk_conn_state **scratch;
    pthread_cond_t reap_wake; /* with `lock` and `stopping` */

    bool lock_ready, thread_started, reaper_started;
    pthread_t collector, reaper;
    int listen_fd;
    struct MHD_Daemon *daemon;
    struct MHD_Response *r_ok, *r_index, *r_404, *r_405, *r_413, *r_414;
};

/* ---- small helpers ------------------------------------------------------------------------ */

static double now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__attribute__((format(printf, 2, 3))) static void event(rk_exporter *x, const char *fmt, ...)
{
    if (!x->o.on_event)
        return;
    char line[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char clean[sizeof line];
    rk_text_clean(clean, sizeof clean, line);
    x->o.on_event(x->o.event_ctx, clean);
}

/* ---- listen address ----------------------------------------------------------------------- */

int rk_exporter_parse_listen(const char *s, struct sockaddr_storage *ss, unsigned *sslen,
                             rk_err *err)
{
    char shown[80];
    memset(ss, 0, sizeof *ss);
    if (!s || !*s)
        return rk_err_set(err, RK_EINVAL, "listen address: empty (want ADDR:PORT)");
    rk_msg_show(shown, sizeof shown, s);
    char host[INET6_ADDRSTRLEN + 1];
    const char *port;
    bool v6 = s[0] == '[';
    if (v6) {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof host)
            return rk_err_set(err, RK_EINVAL,
                              "listen address '%s': want [IPV6]:PORT, e.g. [::1]:%d", shown,
                              RK_EXPORTER_DEFAULT_PORT);
        memcpy(host, s + 1, (size_t)(close - s - 1));
        host[close - s - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof host)
            return rk_err_set(err, RK_EINVAL,
                              "listen address '%s': want ADDR:PORT, e.g. 127.0.0.1:%d", shown,
                              RK_EXPORTER_DEFAULT_PORT);
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = '\0';
        port = colon + 1;
    }
    if (!host[0])
        return rk_err_set(err, RK_EINVAL,
                          "listen address '%s': no address (127.0.0.1:PORT for this machine "
                          "only, 0.0.0.0:PORT for every interface)",
                          shown);
    char *end;
    errno = 0;
    long p = strtol(port, &end, 10);
    if (!*port || *end || errno || p < 0 || p > 65535 || port[0] == '+' || port[0] == '-' ||
        port[0] == ' ')
        return rk_err_set(err, RK_EINVAL, "listen address '%s': port is not a number 0..65535",
                          shown);
    if (!v6 && strcmp(host, "localhost") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)p);
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
            return rk_err_set(err, RK_EINVAL, "listen address '%s': not an IPv6 address", shown);
        *sslen = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)p);
        if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
            return rk_err_set(err, RK_EINVAL,
                              "listen address '%s': not a numeric IPv4 address (IPv6 goes in "
                              "brackets: [::1]:PORT)",
                              shown);
        *sslen = sizeof *a;
    }
    return RK_OK;
}

/* Bind and listen; the bound address (with the real port) into x->address. */
static int open_listener(rk_exporter *x, rk_err *err)
{
    struct sockaddr_storage ss;
    unsigned len;
    int rc = rk_exporter_parse_listen(x->o.listen, &ss, &len, err);
    if (rc)
        return rc;
    char shown[80], e[128];
    rk_msg_show(shown, sizeof shown, x->o.listen);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return rk_err_set(err, RK_EIO, "listen on %s: socket: %s", shown,
                          rk_msg_strerror(errno, e, sizeof e));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, (socklen_t)len) != 0) {
        int en = errno;
        close(fd);
        return rk_err_set(err, RK_EIO, "listen on %s: %s%s", shown,
                          rk_msg_strerror(en, e, sizeof e),
                          en == EADDRINUSE ? " (another exporter on this port? pick one with "
                                             "--listen ADDR:PORT)"
                                           : "");
    }
#ifdef TCP_DEFER_ACCEPT
    /* A connection reaches accept() (and libmicrohttpd) once its first bytes have arrived, or
     * after about a second without any: idle connections wait in the kernel instead of
     * taking a place among the ones being read, and a prompt client's request is already in
     * its socket when it is accepted (enforce_cap spares such a connection). */
    int defer = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof defer);
#endif
    /* a deep backlog (the kernel caps it at net.core.somaxconn): a flood of connections must
     * not overflow it, or a prompt client's SYN is dropped and retried a second later */
    if (listen(fd, 4096) != 0) {
        int en = errno;
        close(fd);
        return rk_err_set(err, RK_EIO, "listen on %s: %s", shown, rk_msg_strerror(en, e, sizeof e));
    }
    struct sockaddr_storage got;
    socklen_t glen = sizeof got;
    if (getsockname(fd, (struct sockaddr *)&got, &glen) != 0)
        got = ss;
    char host[INET6_ADDRSTRLEN];
    if (got.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&got;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        snprintf(x->address, sizeof x->address, "[%s]:%u", host, ntohs(a->sin6_port));
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&got;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(x->address, sizeof x->address, "%s:%u", host, ntohs(a->sin_port));
    }
    x->listen_fd = fd;
    return RK_OK;
}

/* ---- collection --------------------------------------------------------------------------- */

/* Tell on_event what changed for GPU i since the last cycle. */
static void gpu_events(rk_exporter *x, int i)
{
    const rk_prom_gpu *g = &x->gpus[i];
    char name[sizeof g->info.name], who[sizeof g->info.name + 40];
    rk_msg_show(name, sizeof name, g->info.name);
    /* "GPU 1 (NAME, simulated)"; a GPU lost before its name was read: "GPU 1" */
    if (*name || g->info.simulated)
        snprintf(who, sizeof who, "GPU %d (%s%s%s)", g->info.index, name,
                 *name && g->info.simulated ? ", " : "", g->info.simulated ? "simulated" : "");
    else
        snprintf(who, sizeof who, "GPU %d", g->info.index);
    enum gpu_state st = g->sample.lost                                        ? ST_LOST
                        : rk_monitor_read_failed(&g->sample) || !g->has_score ? ST_NOREAD
                        : g->score < x->o.threshold                           ? ST_BELOW
                                                                              : ST_OK;
    enum gpu_state was = x->state[i];
    x->state[i] = st;
    if (st == was || (was == ST_NEW && st == ST_OK))
        return;
    switch (st) {
    case ST_LOST:
        event(x, "%s is lost: reseat the card, riser and power; retire it if it falls off again",
              who);
        break;
    case ST_NOREAD: event(x, "%s could not be read", who); break;
    case ST_BELOW: {
        char codes[200] = "";
        size_t len = 0;
        for (int k = 0; k < g->nfindings && len + 40 < sizeof codes; k++)
            len += (size_t)snprintf(codes + len, sizeof codes - len, "%s%.31s", k ? ", " : "",
                                    g->findings[k].code);
        event(x, "%s scores %d, below the threshold %g: %s", who, g->score, x->o.threshold,
              len ? codes : "no findings");
        break;
    }
    case ST_OK:
        event(x, "%s scores %d again, at or above the threshold %g", who, g->score, x->o.threshold);
        break;
    case ST_NEW: break;
    }
}

/* One cycle: read, score, render, swap. Called by start() once, then by the collector. */
static void collect(rk_exporter *x)
{
    double t0 = rk_mono_s();
    rk_err err = {0};
    /* read, and the monitor's rule for failed readings, probabilities and scores */
    int rc = x->n > 0 ? rk_monitor_read(x->mon, x->t, &err) : RK_OK;
    for (int i = 0; i < x->n; i++)
        rk_prom_gpu_from_monitor(&x->gpus[i], rk_monitor_info(x->mon, i),
                                 rk_monitor_gpu_state(x->mon, i));
    rk_buf b = {0};
    rk_prom_render_gpus(&b, x->gpus, x->n);
    x->stats.collections++;
    if (rc || b.failed)
        x->stats.errors++;
    x->stats.duration_s = rk_mono_s() - t0;
    x->stats.last_ts = now_wall();
    x->stats.gpus = x->n;
    rk_prom_render_stats(&b, &x->stats);

    struct MHD_Response *r = NULL;
    if (!b.failed) {
        r = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
        if (r && MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, RK_PROM_CONTENT_TYPE) !=
                     MHD_YES) {
            MHD_destroy_response(r);
            r = NULL; /* b.p went with it */
        } else if (!r) {
            rk_buf_free(&b);
        }
    } else {
        rk_buf_free(&b);
    }
    if (!r && !rc)
        rc = rk_err_set(&err, RK_ENOMEM, "exporter: out of memory rendering /metrics");

    pthread_mutex_lock(&x->lock);
    struct MHD_Response *old = NULL;
    if (r) {
        old = x->metrics;
        x->metrics = r;
    }
    if (rc == RK_OK) {
        x->ever_ok = true;
        x->last_ok = rk_mono_s();
        x->last_err[0] = '\0';
    } else {
        rk_msg_show(x->last_err, sizeof x->last_err, err.msg[0] ? err.msg : rk_strerror(rc));
    }
    pthread_mutex_unlock(&x->lock);
    if (old)
        MHD_destroy_response(old); /* freed once the last scrape holding it is sent */

    for (int i = 0; i < x->n; i++)
        gpu_events(x, i);
    if (rc && !x->collect_failing)
        event(x, "collection failed: %s", err.msg[0] ? err.msg : rk_strerror(rc));
    else if (!rc && x->collect_failing)
        event(x, "collection works again");
    x->collect_failing = rc != RK_OK;
}

static void *collector_main(void *arg)
{
    rk_exporter *x = arg;
    double next = rk_mono_s() + x->o.interval_s;
    pthread_mutex_lock(&x->lock);
    while (!x->stopping) {
        double wait = next - rk_mono_s();
        if (wait > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double frac = (double)ts.tv_nsec * 1e-9 + wait;
            ts.tv_sec += (time_t)frac;
            ts.tv_nsec = (long)((frac - floor(frac)) * 1e9);
            if (ts.tv_nsec >= 1000000000L)
                ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&x->wake, &x->lock, &ts);
            continue; /* re-check stopping and the deadline */
        }
        pthread_mutex_unlock(&x->lock);
        collect(x);
        double now = rk_mono_s();
        next += x->o.interval_s;
        if (next < now) /* a cycle ran long: start the next one now, not a burst of them */
            next = now;
        pthread_mutex_lock(&x->lock);
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

/* ---- HTTP --------------------------------------------------------------------------------- */

static struct MHD_Response *text_response(const char *body, const char *type)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r && MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type) != MHD_YES) {
        MHD_destroy_response(r);
        r = NULL;
    }
    return r;
}

static bool has_body(struct MHD_Connection *c)
{
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strspn(cl, "0 \t") != strlen(cl))
        return true;
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding") != NULL;
}

static enum MHD_Result healthz(rk_exporter *x, struct MHD_Connection *c)
{
    char body[RK_ERR_MSG_MAX + 200];
    pthread_mutex_lock(&x->lock);
    double age = rk_mono_s() - x->last_ok, limit = 3 * x->o.interval_s;
    bool ok = x->ever_ok && age <= limit;
    if (!ok && !x->ever_ok)
        snprintf(body, sizeof body, "not ok: no collection has succeeded yet%s%s\n",
                 x->last_err[0] ? ": " : "", x->last_err);
    else if (!ok)
        snprintf(body, sizeof body,
                 "not ok: the last good collection was %.1f s ago (more than 3 intervals of "
                 "%g s)%s%s\n",
                 age, x->o.interval_s, x->last_err[0] ? ": " : "", x->last_err);
    pthread_mutex_unlock(&x->lock);
    if (ok)
        return MHD_queue_response(c, MHD_HTTP_OK, x->r_ok);
    struct MHD_Response *r = text_response(body, "text/plain; charset=utf-8");
    if (!r)
        return MHD_NO;
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_SERVICE_UNAVAILABLE, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- connection limits -------------------------------------------------------------------- */

long rk_exporter_pick_victim(const rk_conn_state *const *c, size_t n, size_t fresh, unsigned cap)
{
    size_t live = 0;
    for (size_t i = 0; i < n; i++)
        live += !c[i]->closing;
    if (live <= cap)
        return -1;
    long unserved = -1, served = -1;
    for (size_t i = 0; i < n; i++) {
        const rk_conn_state *s = c[i];
        if (i == fresh || s->busy || s->closing)
            continue;
        long *best = s->served ? &served : &unserved;
        if (*best < 0 || s->since < c[*best]->since)
            *best = (long)i;
    }
    if (unserved >= 0)
        return unserved;
    if (served >= 0)
        return served;
    return fresh < n && !c[fresh]->closing ? (long)fresh : -1;
}

static void conn_key(const struct sockaddr *sa, unsigned char key[17])
{
    memset(key, 0, 17);
    if (!sa)
        return;
    key[0] = (unsigned char)sa->sa_family;
    if (sa->sa_family == AF_INET)
        memcpy(key + 1, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    else if (sa->sa_family == AF_INET6)
        memcpy(key + 1, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
}

/* Close a connection for a limit. conn_lock held: the fd is still libmicrohttpd's, which sees
 * the end of the stream and closes the connection on its own thread. */
static void conn_shut(struct conn *k)
{
    k->st.closing = true;
    shutdown(k->fd, SHUT_RDWR);
}

/* Whether a whole request header already waits in the socket for libmicrohttpd to read: a
 * prompt client that the server has not got to yet (under a flood of connections that can
 * take longer than the flood takes to make a connection the oldest). Peeking leaves the bytes
 * where they are. */
static bool request_waiting(int fd)
{
    char buf[2048];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n < 4)
        return false;
    for (ssize_t i = 0; i + 3 < n; i++)
        if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n')
            return true;
    return false;
}

/* Over a cap: close the victim among the connections of `key` (NULL: of every client); a
 * victim found to have its whole request waiting counts as being answered and is spared.
 * conn_lock held. */
static void enforce_cap(rk_exporter *x, const struct conn *fresh, const unsigned char *key,
                        unsigned cap)
{
    for (;;) {
        size_t n = 0, fi = 0;
        for (size_t i = 0; i < x->nconns; i++) {
            const struct conn *k = x->conns[i];
            if (key && memcmp(k->key, key, sizeof k->key) != 0)
                continue;
            if (k == fresh)
                fi = n;
            x->cand[n] = x->conns[i];
            x->scratch[n++] = &k->st;
        }
        long v = rk_exporter_pick_victim(x->scratch, n, fi, cap);
        if (v < 0)
            return;
        struct conn *k = x->cand[v];
        if (k != fresh && request_waiting(k->fd))
            k->st.busy = true;
        else
            conn_shut(k);
    }
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    rk_exporter *x = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct conn *k = *socket_context;
        if (!k)
            return;
        pthread_mutex_lock(&x->conn_lock);
        struct conn *last = x->conns[--x->nconns];
        x->conns[k->slot] = last;
        last->slot = k->slot;
        pthread_mutex_unlock(&x->conn_lock);
        free(k);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *peer =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    struct conn *k = calloc(1, sizeof *k);
    if (!k || !fd) {
        free(k); /* untracked: still under libmicrohttpd's own timeout and limit */
        return;
    }
    k->fd = fd->connect_fd;
    k->st.since = rk_mono_s();
    conn_key(peer ? peer->client_addr : NULL, k->key);
    pthread_mutex_lock(&x->conn_lock);
    if (x->nconns == x->capconns) {
        size_t cap = x->capconns ? 2 * x->capconns : 64;
        struct conn **a = realloc(x->conns, cap * sizeof *a);
        if (a)
            x->conns = a;
        struct conn **d = a ? realloc(x->cand, cap * sizeof *d) : NULL;
        if (d)
            x->cand = d;
        const rk_conn_state **b = d ? realloc(x->scratch, cap * sizeof *b) : NULL;
        if (b)
            x->scratch = b;
        if (!a || !b || !d) {
            pthread_mutex_unlock(&x->conn_lock);
            free(k);
            shutdown(fd->connect_fd, SHUT_RDWR); /* no memory to watch it: refuse it */
            return;
        }
        x->capconns = cap;
    }
    k->slot = x->nconns;
    x->conns[x->nconns++] = k;
    *socket_context = k;
    enforce_cap(x, k, k->key, x->o.max_per_client);
    enforce_cap(x, k, NULL, x->o.max_connections);
    pthread_mutex_unlock(&x->conn_lock);
}

/* Our record of libmicrohttpd's connection `c` (its socket context), or NULL. */
static struct conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

/* A request's headers are in: it is being answered (on_request's first call). */
static void conn_busy(rk_exporter *x, struct MHD_Connection *c)
{
    struct conn *k = conn_of(c);
    if (!k)
        return;
    pthread_mutex_lock(&x->conn_lock);
    k->st.busy = true;
    pthread_mutex_unlock(&x->conn_lock);
}

/* A request ended (answered, or abandoned): the connection waits for its next one. */
static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    rk_exporter *x = cls;
    (void)req_cls;
    struct conn *k = conn_of(c);
    if (!k)
        return;
    pthread_mutex_lock(&x->conn_lock);
    k->st.busy = false;
    k->st.served = k->st.served || toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
    k->st.since = rk_mono_s();
    pthread_mutex_unlock(&x->conn_lock);
}

/* The total deadline: every REAP_TICK_S, close each connection that has waited and been
 * answered for longer than timeout_s in all, however steadily it trickles bytes. */
#define REAP_TICK_S 0.1

static void *reaper_main(void *arg)
{
    rk_exporter *x = arg;
    pthread_mutex_lock(&x->lock);
    while (!x->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)(REAP_TICK_S * 1e9);
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&x->reap_wake, &x->lock, &ts);
        if (x->stopping)
            break;
        pthread_mutex_unlock(&x->lock);
        double cutoff = rk_mono_s() - (double)x->o.timeout_s;
        pthread_mutex_lock(&x->conn_lock);
        for (size_t i = 0; i < x->nconns; i++) {
            struct conn *k = x->conns[i];
            if (!k->st.closing && k->st.since < cutoff)
                conn_shut(k);
        }
        pthread_mutex_unlock(&x->conn_lock);
        pthread_mutex_lock(&x->lock);
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    static int seen; /* marks a request whose headers were checked */
    rk_exporter *x = cls;
    (void)version;
    (void)upload_data;
    if (!*req_cls) {
        conn_busy(x, c);
        /* First call, headers only. Refusals go out now (libmicrohttpd then closes the
         * connection, which is what a refused body needs); a good request is answered on the
         * next call, once it has been read whole, so that the connection can be kept alive. */
        if (strlen(url) > RK_EXPORTER_PATH_MAX)
            return MHD_queue_response(c, MHD_HTTP_URI_TOO_LONG, x->r_414);
        bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
        bool head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
        if (!get && !head)
            return MHD_queue_response(c, MHD_HTTP_METHOD_NOT_ALLOWED, x->r_405);
        if (has_body(c))
            return MHD_queue_response(c, MHD_HTTP_CONTENT_TOO_LARGE, x->r_413);
        *req_cls = &seen;
        return MHD_YES;
    }
    if (*upload_data_size) /* a body after all (not announced by a header) */
        return MHD_queue_response(c, MHD_HTTP_CONTENT_TOO_LARGE, x->r_413);
    if (strcmp(url, "/metrics") == 0) {
        pthread_mutex_lock(&x->lock);
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, x->metrics);
        pthread_mutex_unlock(&x->lock);
        return ret;
    }
    if (strcmp(url, "/healthz") == 0)
        return healthz(x, c);
    if (strcmp(url, "/") == 0)
        return MHD_queue_response(c, MHD_HTTP_OK, x->r_index);
    return MHD_queue_response(c, MHD_HTTP_NOT_FOUND, x->r_404);
}

/* libmicrohttpd logs only with MHD_USE_ERROR_LOG, which is not set; this keeps it silent
 * should a build log anyway (library code never prints). */
static void mhd_quiet(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    (void)fmt;
    (void)ap;
}

static int make_static_responses(rk_exporter *x)
{
    static const char *const plain = "text/plain; charset=utf-8";
    char index[1024];
    snprintf(index, sizeof index,
             "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>rk exporter</title>"
             "</head>\n<body><h1>rk exporter</h1>\n<p>GPU health of this node for Prometheus: "
             "%d GPU%s, %s.</p>\n<ul><li><a href=\"/metrics\">/metrics</a></li>\n"
             "<li><a href=\"/healthz\">/healthz</a></li></ul>\n</body></html>\n",
             x->n, x->n == 1 ? "" : "s",
             x->simulated                      ? "simulated"
             : strcmp(x->backend, "nvml") == 0 ? "read through NVML"
                                               : x->backend);
    x->r_ok = text_response("ok\n", plain);
    x->r_index = text_response(index, "text/html; charset=utf-8");
    x->r_404 = text_response("not found: rk exporter serves /metrics, /healthz and /\n", plain);
    x->r_405 = text_response("method not allowed: GET or HEAD\n", plain);
    x->r_413 = text_response("request bodies are not accepted\n", plain);
    x->r_414 = text_response("request path too long\n", plain);
    if (!x->r_ok || !x->r_index || !x->r_404 || !x->r_405 || !x->r_413 || !x->r_414)
        return RK_ENOMEM;
    if (MHD_add_response_header(x->r_405, MHD_HTTP_HEADER_ALLOW, "GET, HEAD") != MHD_YES)
        return RK_ENOMEM;
    return RK_OK;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static int check_opts(const rk_exporter_opts *o, rk_err *err)
{
    if (!(o->interval_s >= 0.1 && o->interval_s <= 86400))
        return rk_err_set(err, RK_EINVAL, "exporter: interval %g s (0.1 .. 86400)", o->interval_s);
    if (o->history < 2 || o->history > 100000)
        return rk_err_set(err, RK_EINVAL, "exporter: history of %d samples (2 .. 100000)",
                          o->history);
    if (!(o->threshold >= 0 && o->threshold <= 100))
        return rk_err_set(err, RK_EINVAL, "exporter: threshold %g (0 .. 100)", o->threshold);
    if (o->max_connections < 1 || o->max_connections > 65536)
        return rk_err_set(err, RK_EINVAL, "exporter: %u connections (1 .. 65536)",
                          o->max_connections);
    if (o->threads < 1 || o->threads > 64)
        return rk_err_set(err, RK_EINVAL, "exporter: %u threads (1 .. 64)", o->threads);
    if (o->timeout_s < 1 || o->timeout_s > 3600)
        return rk_err_set(err, RK_EINVAL, "exporter: request deadline %u s (1 .. 3600)",
                          o->timeout_s);
    if (o->max_per_client < 1 || o->max_per_client > 65536)
        return rk_err_set(err, RK_EINVAL, "exporter: %u connections per client (1 .. 65536)",
                          o->max_per_client);
    return RK_OK;
}

void rk_exporter_stop(rk_exporter *x)
{
    if (!x)
        return;
    if (x->daemon)
        MHD_stop_daemon(x->daemon); /* closes the listening socket and every connection */
    else if (x->listen_fd >= 0)
        close(x->listen_fd);
    if (x->thread_started || x->reaper_started) {
        pthread_mutex_lock(&x->lock);
        x->stopping = true;
        pthread_cond_signal(&x->wake);
        pthread_cond_signal(&x->reap_wake);
        pthread_mutex_unlock(&x->lock);
    }
    if (x->thread_started)
        pthread_join(x->collector, NULL);
    if (x->reaper_started)
        pthread_join(x->reaper, NULL);
    /* every CLOSED notification has come (MHD_stop_daemon): nothing is left but the arrays */
    for (size_t i = 0; i < x->nconns; i++)
        free(x->conns[i]);
    free(x->conns);
    free(x->cand);
    free(x->scratch);
    struct MHD_Response *rs[] = {x->metrics, x->r_ok,  x->r_index, x->r_404,
                                 x->r_405,   x->r_413, x->r_414};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
        if (rs[i])
            MHD_destroy_response(rs[i]);
    rk_monitor_free(x->mon);
    free(x->gpus);
    free(x->state);
    rk_pred_online_free(x->pred);
    rk_telemetry_close(x->t);
    if (x->lock_ready) {
        pthread_cond_destroy(&x->reap_wake);
        pthread_cond_destroy(&x->wake);
        pthread_mutex_destroy(&x->conn_lock);
        pthread_mutex_destroy(&x->lock);
    }
    free(x);
}

int rk_exporter_start(rk_exporter **out, const rk_exporter_opts *o, rk_err *err)
{
    *out = NULL;
    int rc = check_opts(o, err);
    if (rc)
        return rc;
    rk_exporter *x = calloc(1, sizeof *x);
    if (!x)
        return rk_err_set(err, RK_ENOMEM, "exporter: out of memory");
    x->o = *o;
    x->listen_fd = -1;
    pthread_condattr_t ca;
    if (pthread_mutex_init(&x->lock, NULL) != 0) {
        free(x);
        return rk_err_set(err, RK_ENOMEM, "exporter: cannot create a mutex");
    }
    if (pthread_mutex_init(&x->conn_lock, NULL) != 0) {
        pthread_mutex_destroy(&x->lock);
        free(x);
        return rk_err_set(err, RK_ENOMEM, "exporter: cannot create a mutex");
    }
    if (pthread_condattr_init(&ca) != 0 || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&x->wake, &ca) != 0) {
        pthread_mutex_destroy(&x->conn_lock);
        pthread_mutex_destroy(&x->lock);
        free(x);
        return rk_err_set(err, RK_ENOMEM, "exporter: cannot create a condition variable");
    }
    if (pthread_cond_init(&x->reap_wake, &ca) != 0) {
        pthread_cond_destroy(&x->wake);
        pthread_mutex_destroy(&x->conn_lock);
        pthread_mutex_destroy(&x->lock);
        free(x);
        return rk_err_set(err, RK_ENOMEM, "exporter: cannot create a condition variable");
    }
    pthread_condattr_destroy(&ca);
    x->lock_ready = true;

    /* the address first: a port in use is the likeliest mistake, and cheap to find */
    if ((rc = open_listener(x, err)))
        goto fail;
    if ((rc = rk_telemetry_open(&x->t, o->backend, &o->telemetry, err)))
        goto fail;
    snprintf(x->backend, sizeof x->backend, "%s", rk_telemetry_backend(x->t));
    x->n = rk_telemetry_count(x->t);
    if (x->n < 0)
        x->n = 0;
    size_t m = (size_t)(x->n ? x->n : 1);
    x->gpus = calloc(m, sizeof *x->gpus);
    x->state = calloc(m, sizeof *x->state);
    if (!x->gpus || !x->state) {
        rc = rk_err_set(err, RK_ENOMEM, "exporter: out of memory for %d GPUs", x->n);
        goto fail;
    }
    x->simulated = strcmp(x->backend, "sim") == 0;
    if (o->predictor && x->n > 0 && (rc = rk_pred_online_create(&x->pred, o->predictor, x->n, err)))
        goto fail;
    rk_monitor_predictor pred;
    rk_monitor_opts mo = RK_MONITOR_OPTS_DEFAULT;
    mo.history = o->history;
    if (x->pred) {
        rk_pred_online_monitor(x->pred, &pred);
        mo.predictor = &pred;
    }
    if ((rc = rk_monitor_create(&x->mon, x->n, &mo, err)))
        goto fail;

    collect(x); /* the first collection, before the first request */
    for (int i = 0; i < x->n; i++)
        x->simulated = x->simulated || rk_monitor_info(x->mon, i)->simulated;
    if (!x->metrics) {
        rc = rk_err_set(err, RK_ENOMEM, "exporter: out of memory rendering /metrics");
        goto fail;
    }
    if ((rc = make_static_responses(x))) {
        rk_err_set(err, rc, "exporter: out of memory");
        goto fail;
    }

    /* libmicrohttpd's own limit refuses connections (it stops accepting), which would lock a
     * prompt client out behind idle ones: it is only a backstop well above max_connections,
     * which on_connection enforces by closing the oldest waiting connection instead. Its
     * inactivity timeout is the deadline too; the reaper enforces the total. */
    unsigned hard = o->max_connections > 32768 ? 65536 : 2 * o->max_connections;
    if (hard < o->max_connections + 2 * o->threads)
        hard = o->max_connections + 2 * o->threads;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL;
    x->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, x, MHD_OPTION_EXTERNAL_LOGGER,
                                 mhd_quiet, NULL, MHD_OPTION_LISTEN_SOCKET, x->listen_fd,
                                 MHD_OPTION_THREAD_POOL_SIZE, o->threads,
                                 MHD_OPTION_CONNECTION_LIMIT, hard, MHD_OPTION_CONNECTION_TIMEOUT,
                                 o->timeout_s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, x,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, x, MHD_OPTION_END);
    if (!x->daemon) {
        rc =
            rk_err_set(err, RK_EIO, "exporter: the HTTP server (libmicrohttpd) did not start on %s",
                       x->address);
        goto fail;
    }
    x->listen_fd = -1; /* the daemon owns it now */
    if (pthread_create(&x->collector, NULL, collector_main, x) != 0) {
        rc = rk_err_set(err, RK_ENOMEM, "exporter: cannot start the collector thread");
        goto fail;
    }
    x->thread_started = true;
    if (pthread_create(&x->reaper, NULL, reaper_main, x) != 0) {
        rc = rk_err_set(err, RK_ENOMEM, "exporter: cannot start the connection reaper thread");
        goto fail;
    }
    x->reaper_started = true;
    *out = x;
    return RK_OK;
fail:
    rk_exporter_stop(x);
    return rc;
}

const char *rk_exporter_address(const rk_exporter *x)
{
    return x->address;
}

const char *rk_exporter_backend(const rk_exporter *x)
{
    return x->backend;
}

int rk_exporter_gpus(const rk_exporter *x)
{
    return x->n;
}

bool rk_exporter_simulated(const rk_exporter *x)
{
    return x->simulated;
}
