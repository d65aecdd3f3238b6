/*
 * The node agent's link (cluster/agent.h): one net/peer.h state for the coordinator for
 * the agent's whole life, a stream reader allocated once, and a loop of connect, HELLO,
 * WELCOME, PING/PONG, with backoff between connection attempts. poll(2) on one socket; times
 * from base/clock.h.
 */
#include "cluster/agent.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "base/clock.h"
#include "base/msg.h"
#include "cluster/agent_job.h"
#include "cluster/partner.h"
#include "net/peer.h"
#include "net/sock.h"
#include "net/stream.h"
#include "supervisor/supervisor.h"

#define BACKOFF_MIN_S 0.1
#define BACKOFF_MAX_S 5.0

typedef struct agent {
    const rk_agent_opts *o;
    const rk_net_secret *key;
    rk_net_peer peer;
    rk_net_reader *r;
    char at[RK_NET_ADDR_MAX + 8]; /* the coordinator, for messages */
    char hello[RK_NODE_PAYLOAD_MAX];
    size_t hello_len;
    bool welcomed;                  /* a WELCOME came on some connection already */
    bool link_up;                   /* on the connection last run */
    bool shut_out;                  /* ... the coordinator closed it before WELCOME */
    double down_since;              /* without a link since (given up after reconnect_s) */
    int fd;                         /* the connection, for the job's sends (-1: none) */
    char why[RK_ERR_MSG_MAX];       /* why the last connection dropped */
    uint8_t gone[RK_NODES_MAX / 8]; /* with a gate: the GPUs said gone already */
    rk_partner *partner;            /* the partner copies, with a snapshot directory; NULL none */
    char send_why[RK_ERR_MSG_MAX];  /* why the job's last send failed */
} agent;

__attribute__((format(printf, 2, 3))) static void logf_(agent *a, const char *fmt, ...)
{
    if (!a->o->on_log)
        return;
    char line[RK_ERR_MSG_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    a->o->on_log(a->o->ctx, line);
}

static bool stopping(const agent *a)
{
    return a->o->stop && *a->o->stop;
}

static int send_msg(agent *a, int fd, uint8_t type, const void *payload, size_t len, rk_err *err)
{
    return rk_net_peer_send(&a->peer, a->key, fd, type, payload, len, a->at, err);
}

/* The job's sends (agent_job.h): only on a welcomed link. */
static int job_send(void *ctx, uint8_t type, const void *payload, size_t len)
{
    agent *a = ctx;
    rk_err e = {0};
    if (a->fd < 0 || !a->link_up || send_msg(a, a->fd, type, payload, len, &e)) {
        snprintf(a->send_why, sizeof a->send_why, "%s", e.msg[0] ? e.msg : "no link");
        return -1;
    }
    return 0;
}

/* How many pieces of a partner copy the link takes now: what keeps the bytes queued in its
 * socket under RK_PARTNER_WINDOW (SIOCOUTQ), so that a send never waits for the coordinator,
 * which may itself be sending to this agent. */
static int link_room(int fd)
{
    int queued = 0, buf = 0;
    socklen_t len = sizeof buf;
    if (ioctl(fd, SIOCOUTQ, &queued) != 0 || getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, &len) != 0)
        return 0;
    int room = buf / 2 - queued; /* the kernel doubles SO_SNDBUF: half is for data */
    if (room > RK_PARTNER_WINDOW - queued)
        room = RK_PARTNER_WINDOW - queued;
    return room > 0 ? room / (RK_NODE_SNAP_CHUNK + 64) : 0;
}

/* Read the node's GPUs and send one HEALTH a device; 0, or -1 when a send failed. */
static int send_health(agent *a, int fd, rk_err *err)
{
    const rk_agent_opts *o = a->o;
    rk_err e = {0};
    if (rk_gate_sample(o->gate, &e))
        logf_(a, "health gate: %s", e.msg);
    int sim = strcmp(rk_gate_backend(o->gate), "sim") == 0;
    for (int i = 0; i < o->gate_n; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", o->gate_first + i);
        rk_node_health m = {.device = (uint32_t)i, .sim = (uint32_t)sim};
        /* the worst reading since the last HEALTH: a simulated fleet driven by the job's
         * steps reads many minutes a sample, and a dip among them counts (rk_gate_take_worst) */
        rk_sup_health h = rk_gate_reading(o->gate, id, 1, m.why, sizeof m.why);
        m.score = (uint32_t)(h.score < 0 ? 0 : h.score > 100 ? 100 : h.score);
        m.lost = (uint32_t)(h.lost != 0);
        m.prob_ppm = h.prob >= 0 && h.prob <= 1 ? (int64_t)(h.prob * 1e6 + 0.5) : -1;
        /* a failure since the last reading (not delivered to a rank here: cluster.md); a
         * GPU that stays gone is said once */
        int fatal = rk_gate_take_fatal(o->gate, id);
        if (fatal && (!m.lost || !(a->gone[i / 8] & (1u << (i % 8)))))
            logf_(a, "%sGPU %d (device %d of this node) failed: %s", sim ? "simulated " : "",
                  o->gate_first + i, i, m.lost ? "off the bus" : "an uncorrectable ECC error");
        if (m.lost)
            a->gone[i / 8] |= (uint8_t)(1u << (i % 8));
        else
            a->gone[i / 8] &= (uint8_t) ~(1u << (i % 8));
        char payload[RK_NODE_PAYLOAD_MAX];
        size_t len;
        if (rk_node_health_format(&m, payload, sizeof payload, &len, &e) ||
            send_msg(a, fd, RK_NODE_MSG_HEALTH, payload, len, err))
            return -1;
    }
    return 0;
}

/* What one connection ended with. */
typedef enum link_end {
    LINK_DROPPED, /* reconnect */
    LINK_DONE     /* return *outcome */
} link_end;

/* End a connection: say why (logged, and kept for the message of giving up). */
__attribute__((format(printf, 2, 3))) static link_end drop(agent *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->why, sizeof a->why, fmt, ap);
    va_end(ap);
    bool again = a->link_up || rk_mono_s() - a->down_since <= a->o->reconnect_s;
    logf_(a, "%s%s", a->why, again ? "; reconnecting" : "");
    return LINK_DROPPED;
}

/* One connection: HELLO, then frames until it ends. */
static link_end run_link(agent *a, int fd, rk_agent_outcome *outcome, rk_err *err)
{
    const rk_agent_opts *o = a->o;
    rk_err e = {0};
    rk_net_reader_init(a->r, a->at);
    a->link_up = false;
    a->shut_out = false;
    a->fd = fd;
    a->why[0] = 0;
    if (send_msg(a, fd, RK_NODE_MSG_HELLO, a->hello, a->hello_len, &e)) {
        return drop(a, "cannot send HELLO: %s", e.msg);
    }
    bool up = false;
    double now = rk_mono_s(), opened = now, last_rx = now, next_ping = now + o->ping_s;
    double next_health = 0;            /* with a gate: at once after WELCOME, then every health_s */
    double rx_timeout = 3 * o->ping_s; /* raised to the coordinator's node timeout on WELCOME */
    for (;;) {
        if (stopping(a)) {
            if (up)
                rk_node_send_reason(&a->peer, a->key, fd, RK_NODE_MSG_BYE, "the agent was stopped",
                                    a->at, &e);
            *outcome = RK_AGENT_STOPPED;
            rk_err_set(err, RK_OK, "stopped");
            return LINK_DONE;
        }
        now = rk_mono_s();
        if (!up && now - opened >= o->connect_timeout_s) {
            return drop(a, "no WELCOME from %s within %g s", a->at, o->connect_timeout_s);
        }
        if (up && now - last_rx >= rx_timeout) {
            return drop(a, "nothing from %s for %.1f s", a->at, now - last_rx);
        }
        if (up && now >= next_ping) {
            if (send_msg(a, fd, RK_NODE_MSG_PING, NULL, 0, &e)) {
                return drop(a, "link lost: %s", e.msg);
            }
            next_ping = now + o->ping_s;
        }
        if (up && o->gate && now >= next_health) {
            if (send_health(a, fd, &e))
                return drop(a, "link lost: %s", e.msg);
            next_health = now + o->health_s;
        }
        double wait = up ? next_ping - now : opened + o->connect_timeout_s - now;
        if (up && o->gate && next_health - now < wait)
            wait = next_health - now;
        if (wait > o->ping_s)
            wait = o->ping_s;
        struct pollfd p[80] = {{.fd = fd, .events = POLLIN}};
        int np = 1;
        if (o->ranks && up)
            np += rk_agent_job_pollfds(o->ranks, p + 1, (int)(sizeof p / sizeof p[0]) - 1);
        if (o->ranks && up && rk_agent_job_running(o->ranks) && wait > 0.1)
            wait = 0.1; /* the keeper is reaped in the job's turn */
        if (a->partner && up && wait > RK_PARTNER_SCAN_S)
            wait = RK_PARTNER_SCAN_S; /* the ranks' new pins are looked for */
        if (up && rk_partner_sending(a->partner) && wait > 0.005)
            wait = 0.005; /* a generation is on its way, as the link's queue empties */
        int n = poll(p, (nfds_t)np, wait > 0 ? (int)(wait * 1000) + 1 : 0);
        if (n < 0 && errno != EINTR) {
            return drop(a, "poll failed");
        }
        if (o->ranks && up)
            rk_agent_job_ready(o->ranks, p + 1, np - 1, job_send, a);
        if (up && a->partner && rk_partner_pump(a->partner, link_room(fd), job_send, a))
            return drop(a, "link lost while sending a partner copy: %s", a->send_why);
        if (n <= 0 || !(p[0].revents))
            continue;
        int rc = rk_net_reader_fill(a->r, fd, &e);
        rk_net_hdr h;
        const uint8_t *payload;
        while (rc >= 0 && (rc = rk_net_reader_next(a->r, a->key, &h, &payload, &e)) == 1) {
            if (rk_net_peer_accept(&a->peer, &h, a->at, &e)) {
                return drop(a, "refused a frame: %s", e.msg);
            }
            last_rx = rk_mono_s();
            switch (h.type) {
            case RK_NODE_MSG_WELCOME: {
                rk_node_welcome w;
                if (rk_node_welcome_parse(payload, h.len, &w, &e) || w.node != o->node) {
                    return drop(a, "a bad WELCOME from %s: %s", a->at,
                                e.msg[0] ? e.msg : "another node's");
                }
                logf_(a, "%s %s as node %u, generation %u (node timeout %g s)",
                      a->welcomed ? "back on the link to" : "joined", a->at, (unsigned)o->node,
                      (unsigned)a->peer.generation, w.timeout_s);
                up = a->welcomed = a->link_up = true;
                if (w.timeout_s > rx_timeout)
                    rx_timeout = w.timeout_s;
                next_ping = last_rx + o->ping_s;
                break;
            }
            case RK_NODE_MSG_PONG: break;
            case RK_NODE_MSG_PROGRESS: { /* the job's steps: a step clock's time (gate.c) */
                rk_node_progress m;
                if (rk_node_progress_parse(payload, h.len, &m, &e))
                    return drop(a, "the coordinator sent a bad PROGRESS: %s", e.msg);
                if (o->gate)
                    rk_gate_set_progress(o->gate, m.steps);
                break;
            }
            case RK_NODE_MSG_PING: /* the coordinator asks whether this node is alive */
                if (send_msg(a, fd, RK_NODE_MSG_PONG, NULL, 0, &e))
                    return drop(a, "link lost: %s", e.msg);
                break;
            case RK_NODE_MSG_LAUNCH:
            case RK_NODE_MSG_KILL:
            case RK_NODE_MSG_DATA:
            case RK_NODE_MSG_CLOSE:
            case RK_NODE_MSG_STACKS:
                if (!o->ranks || !up) {
                    logf_(a, "ignored a %s from %s: %s", rk_node_msg_name(h.type), a->at,
                          o->ranks ? "before WELCOME" : "this agent runs no ranks");
                    break;
                }
                if (rk_agent_job_msg(o->ranks, h.type, payload, h.len, job_send, a))
                    return drop(a, "the coordinator sent a bad %s", rk_node_msg_name(h.type));
                break;
            case RK_NODE_MSG_SNAP_BEGIN:
            case RK_NODE_MSG_SNAP_DATA:
            case RK_NODE_MSG_SNAP_END:
            case RK_NODE_MSG_SNAP_FETCH:
                if (!a->partner || !up) {
                    logf_(a, "ignored a %s from %s: %s", rk_node_msg_name(h.type), a->at,
                          a->partner ? "before WELCOME" : "no snapshots in memory on this node");
                    break;
                }
                if (rk_partner_msg(a->partner, h.type, payload, h.len, job_send, a))
                    return drop(a, "the coordinator sent a bad %s", rk_node_msg_name(h.type));
                break;
            case RK_NODE_MSG_BYE:
            case RK_NODE_MSG_REFUSED: {
                rk_node_reason r;
                if (rk_node_reason_parse(payload, h.len, &r, &e))
                    snprintf(r.reason, sizeof r.reason, "(no reason given)");
                if (h.type == RK_NODE_MSG_BYE) {
                    *outcome = RK_AGENT_BYE;
                    rk_err_set_line(err, RK_OK, "the coordinator said BYE: %s", r.reason);
                } else {
                    *outcome = RK_AGENT_REFUSED;
                    rk_err_set_line(err, RK_ECOMM, "the coordinator refused node %u: %s",
                                    (unsigned)o->node, r.reason);
                }
                return LINK_DONE;
            }
            default: logf_(a, "ignored a %s from %s", rk_node_msg_name(h.type), a->at);
            }
        }
        if (rc < 0) {
            /* closed before WELCOME: a wrong secret, job id or launch looks the same as a
             * coordinator that had to close a connection it had not read yet (a flood of
             * connections on its port), so it is tried again until --reconnect-for, and the
             * giving up names the likely cause */
            a->shut_out = !up;
            return drop(a, "link lost%s: %s", up ? "" : " before WELCOME", e.msg);
        }
    }
}

/* Sleep up to `s` seconds, or until the stop flag is set (a signal interrupts poll). */
static void nap(const agent *a, double s)
{
    double until = rk_mono_s() + s;
    while (!stopping(a)) {
        double left = until - rk_mono_s();
        if (left <= 0)
            return;
        poll(NULL, 0, (int)(left * 1000) + 1);
    }
}

int rk_agent_run(const rk_agent_opts *o, const rk_net_secret *key, rk_agent_outcome *outcome,
                 rk_err *err)
{
    *outcome = RK_AGENT_GAVE_UP;
    if (o->generation < 1 || !(o->ping_s > 0) || !(o->connect_timeout_s > 0) ||
        !(o->reconnect_s >= 0) || o->node >= RK_NODES_MAX ||
        (o->gate &&
         (o->gate_n < 1 || o->gate_n > RK_NODES_MAX || o->gate_first < 0 || !(o->health_s > 0))))
        return rk_err_set(err, RK_EINVAL, "agent: bad options");
    agent a = {.o = o, .key = key, .fd = -1};
    rk_node_hello hello = {.node = o->node, .pid = getpid()};
    int rc = rk_node_boot_id_read(o->boot_id_path, hello.boot_id, err);
    if (rc)
        return rc;
    if (gethostname(hello.host, sizeof hello.host - 1) != 0 || !hello.host[0])
        snprintf(hello.host, sizeof hello.host, "unknown");
    const char *snap = o->ranks ? rk_agent_job_snap_dir(o->ranks) : NULL;
    if (snap) /* where this node keeps the ranks' snapshots (docs/recovery.md) */
        snprintf(hello.snap, sizeof hello.snap, "%s", snap);
    if ((rc = rk_node_hello_format(&hello, a.hello, sizeof a.hello, &a.hello_len, err)))
        return rc;
    if (strchr(o->host, ':'))
        snprintf(a.at, sizeof a.at, "[%.*s]:%u", RK_NET_ADDR_MAX - 10, o->host, (unsigned)o->port);
    else
        snprintf(a.at, sizeof a.at, "%.*s:%u", RK_NET_ADDR_MAX - 8, o->host, (unsigned)o->port);
    if (snap && (rc = rk_partner_new(&a.partner, snap, o->node, o->on_log, o->ctx, err)))
        return rc;
    a.r = malloc(sizeof *a.r);
    if (!a.r) {
        rk_partner_free(a.partner);
        return rk_err_set(err, RK_ENOMEM, "agent: out of memory");
    }
    rk_net_peer_init(&a.peer, o->job, o->node, RK_NET_COORDINATOR, o->generation, true);

    double backoff = BACKOFF_MIN_S;
    a.down_since = rk_mono_s();
    rk_err last = {0};
    bool told = false; /* said once per outage that the coordinator cannot be reached */
    for (;;) {
        if (stopping(&a)) {
            *outcome = RK_AGENT_STOPPED;
            rk_err_set(err, RK_OK, "stopped");
            break;
        }
        if (rk_mono_s() - a.down_since > o->reconnect_s && last.msg[0]) {
            if (a.shut_out && !a.welcomed) {
                char tried[64] = "";
                if (o->reconnect_s > 0)
                    snprintf(tried, sizeof tried, " (tried for %g s)", o->reconnect_s);
                *outcome = RK_AGENT_CLOSED;
                rk_err_set(err, RK_ECOMM,
                           "the coordinator closed the link (wrong secret or job id?)%s: %s", tried,
                           last.msg);
            } else {
                *outcome = RK_AGENT_GAVE_UP;
                rk_err_set(err, RK_ECOMM, "no link to the coordinator for %g s: %s", o->reconnect_s,
                           last.msg);
            }
            break;
        }
        int fd;
        rk_err e = {0};
        if (rk_net_connect(o->host, o->port, o->connect_timeout_s, &fd, &e)) {
            last = e;
            a.shut_out = false;
            if (!told)
                logf_(&a, "cannot reach the coordinator: %s; retrying", e.msg);
            told = true;
            nap(&a, backoff);
            backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
            continue;
        }
        told = false;
        int sb = RK_NODES_SNDBUF; /* fixed, as the coordinator's: link_room's measure */
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, sizeof sb);
        link_end end = run_link(&a, fd, outcome, err);
        close(fd);
        a.fd = -1;
        if (o->ranks) /* no rank waits in a collective for a node the coordinator calls lost */
            rk_agent_job_link_lost(o->ranks);
        rk_partner_link_lost(a.partner);
        if (end == LINK_DONE)
            break;
        /* dropped: a link that had been up starts the outage and the backoff again */
        if (a.why[0])
            snprintf(last.msg, sizeof last.msg, "%s", a.why);
        else
            snprintf(last.msg, sizeof last.msg, "the link to %s dropped", a.at);
        if (a.link_up) {
            backoff = BACKOFF_MIN_S;
            a.down_since = rk_mono_s();
        }
        nap(&a, backoff);
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
    free(a.r);
    rk_partner_free(a.partner);
    return RK_OK;
}
