/*
 * The device plugin's loop (dp.h, plugin.h): the Register call to DIR/kubelet.sock with its
 * backoff, the watch on both sockets (a kubelet restart wipes the directory: the plugin serves
 * a new socket and registers again), the health readings every interval, and the one loop on
 * the completion queue that the server's calls (server.c) share.
 */
#include "k8s/plugin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/log.h>
#include <grpc/support/time.h>

#include "api.pb-c.h"
#include "base/clock.h"

#define REGISTER_TIMEOUT_MS 5000
#define BACKOFF_MIN_S 1.0
#define BACKOFF_MAX_S 30.0
#define WATCH_EVERY_S 0.2 /* how often both sockets are looked at */
#define DRAIN_S 5.0       /* the most a stop waits for calls to finish */

void dp_emit(plugin *pl, const char *fmt, ...)
{
    if (!pl->o->on_event)
        return;
    char line[1024];
    int off = 0;
    if (pl->fleet && rk_dp_fleet_simulated(pl->fleet))
        off = snprintf(line, sizeof line, "[simulated] ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + off, sizeof line - (size_t)off, fmt, ap);
    va_end(ap);
    pl->o->on_event(pl->o->event_ctx, line);
}

gpr_timespec dp_after_ms(int64_t ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* ---- registration ------------------------------------------------------------------------ */

static void reg_clear(plugin *pl)
{
    if (pl->reg_call)
        grpc_call_unref(pl->reg_call);
    if (pl->reg_ch)
        grpc_channel_destroy(pl->reg_ch);
    if (pl->reg_send)
        grpc_byte_buffer_destroy(pl->reg_send);
    if (pl->reg_recv)
        grpc_byte_buffer_destroy(pl->reg_recv);
    grpc_metadata_array_destroy(&pl->reg_md);
    grpc_metadata_array_destroy(&pl->reg_trailer);
    grpc_slice_unref(pl->reg_details);
    pl->reg_call = NULL;
    pl->reg_ch = NULL;
    pl->reg_send = pl->reg_recv = NULL;
}

static void reg_retry(plugin *pl, const char *why)
{
    dp_emit(pl, "cannot register with the kubelet at %s: %s; retrying in %g s", pl->kubelet_path,
            why, pl->backoff);
    pl->reg = REG_WAIT;
    pl->next_try = rk_mono_s() + pl->backoff;
    pl->backoff = pl->backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : pl->backoff * 2;
}

static void reg_start(plugin *pl)
{
    const rk_dp_opts *o = pl->o;
    V1beta1__DevicePluginOptions opts = V1BETA1__DEVICE_PLUGIN_OPTIONS__INIT;
    opts.get_preferred_allocation_available = 1;
    V1beta1__RegisterRequest rr = V1BETA1__REGISTER_REQUEST__INIT;
    rr.version = RK_DP_API_VERSION;
    rr.endpoint = (char *)o->socket;
    rr.resource_name = (char *)o->resource;
    rr.options = &opts;
    grpc_metadata_array_init(&pl->reg_md);
    grpc_metadata_array_init(&pl->reg_trailer);
    pl->reg_details = grpc_empty_slice();
    pl->reg_send = dp_pack(&rr.base);
    char target[sizeof pl->kubelet_path + 8];
    snprintf(target, sizeof target, "unix:%s", pl->kubelet_path);
    grpc_channel_credentials *cr = grpc_insecure_credentials_create();
    pl->reg_ch = grpc_channel_create(target, cr, NULL);
    grpc_channel_credentials_release(cr);
    pl->reg_call =
        grpc_channel_create_call(pl->reg_ch, NULL, GRPC_PROPAGATE_DEFAULTS, pl->cq,
                                 grpc_slice_from_static_string("/v1beta1.Registration/Register"),
                                 NULL, dp_after_ms(REGISTER_TIMEOUT_MS), NULL);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = pl->reg_send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &pl->reg_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &pl->reg_recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &pl->reg_trailer;
    ops[5].data.recv_status_on_client.status = &pl->reg_status;
    ops[5].data.recv_status_on_client.status_details = &pl->reg_details;
    if (!pl->reg_send || !pl->reg_call ||
        grpc_call_start_batch(pl->reg_call, ops, 6, &pl->t_reg, NULL) != GRPC_CALL_OK) {
        reg_clear(pl);
        reg_retry(pl, "the Register call could not be started");
        return;
    }
    pl->reg = REG_FLIGHT;
}

static void on_registered(plugin *pl, bool ok)
{
    char why[300] = "";
    if (!ok) {
        snprintf(why, sizeof why, "the call failed");
    } else if (pl->reg_status != GRPC_STATUS_OK) {
        size_t len = GRPC_SLICE_LENGTH(pl->reg_details);
        snprintf(why, sizeof why, "%s: %.*s", dp_code_name(pl->reg_status),
                 (int)(len < 200 ? len : 200), (const char *)GRPC_SLICE_START_PTR(pl->reg_details));
        for (char *p = why; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
                *p = '?';
    } else {
        /* the reply must be an Empty */
        rk_dp_status st;
        rk_dp_request rq;
        uint8_t none = 0;
        grpc_slice s = grpc_empty_slice();
        if (pl->reg_recv) {
            grpc_byte_buffer_reader rd;
            if (grpc_byte_buffer_reader_init(&rd, pl->reg_recv)) {
                s = grpc_byte_buffer_reader_readall(&rd);
                grpc_byte_buffer_reader_destroy(&rd);
            }
        }
        if (!pl->reg_recv)
            snprintf(why, sizeof why, "the kubelet answered no message");
        else if (rk_dp_request_parse(RK_DP_MSG_EMPTY,
                                     GRPC_SLICE_LENGTH(s) ? GRPC_SLICE_START_PTR(s) : &none,
                                     GRPC_SLICE_LENGTH(s), &rq, &st))
            snprintf(why, sizeof why, "the kubelet's reply: %.200s", st.msg);
        else
            rk_dp_request_free(&rq);
        grpc_slice_unref(s);
    }
    reg_clear(pl);
    if (why[0]) {
        reg_retry(pl, why);
        return;
    }
    pl->reg = REG_DONE;
    pl->backoff = BACKOFF_MIN_S;
    pl->registrations++;
    dp_emit(pl,
            "registered %s with the kubelet (%s): endpoint %s, API %s, preferred allocation "
            "available (registration %lu)",
            pl->o->resource, pl->kubelet_path, pl->o->socket, RK_DP_API_VERSION, pl->registrations);
}

/* Stop the plugin with err: another process serves our socket's path. Our server is left to
 * the process's exit: gRPC's listener teardown unlinks the path, which is no longer ours. */
static void give_up_socket(plugin *pl, const rk_err *err)
{
    pl->fatal = err->code ? err->code : RK_EBUSY;
    pl->fatal_err = *err;
    pl->abandoned = pl->cur != NULL;
}

/* Look at both sockets: ours removed (a kubelet restart wipes the directory) means serve a new
 * one and register again, once the old server is gone (its teardown unlinks the path); ours
 * replaced by a socket another process answers on stops the plugin; the kubelet's replaced
 * means register again. */
static void watch_sockets(plugin *pl, double now)
{
    rk_err err = {0};
    if (pl->cur && !dp_sock_is_ours(pl)) {
        struct stat st;
        bool there = lstat(pl->sock_path, &st) == 0;
        if (there && S_ISSOCK(st.st_mode) && dp_sock_probe(pl->sock_path) == 1) {
            rk_err_set(&err, RK_EBUSY, "%s is served by another process: stopping", pl->sock_path);
            give_up_socket(pl, &err);
            return;
        }
        dp_emit(pl, "%s was %s (the kubelet restarted?): serving a new socket", pl->sock_path,
                there ? "replaced" : "removed");
        dp_server_stop(pl);
        pl->next_bind = now;
    }
    if (!pl->cur && pl->servers == 0 && now >= pl->next_bind) {
        if (dp_server_start(pl, &err)) {
            if (err.code == RK_EBUSY) {
                give_up_socket(pl, &err);
                return;
            }
            if (strcmp(err.msg, pl->last_bind_err) != 0) /* once, not every second */
                dp_emit(pl, "%s; trying again every %g s", err.msg, BACKOFF_MIN_S);
            snprintf(pl->last_bind_err, sizeof pl->last_bind_err, "%s", err.msg);
            pl->next_bind = now + BACKOFF_MIN_S;
            return;
        }
        pl->last_bind_err[0] = '\0';
        dp_emit(pl, "serving %s", pl->sock_path);
        if (pl->reg != REG_FLIGHT) {
            pl->reg = REG_WAIT;
            pl->next_try = now;
            pl->backoff = BACKOFF_MIN_S;
        }
    }
    if (!pl->cur)
        return;
    struct stat st;
    bool there = stat(pl->kubelet_path, &st) == 0 && S_ISSOCK(st.st_mode);
    bool same =
        there && pl->kubelet_seen && st.st_dev == pl->kubelet_dev && st.st_ino == pl->kubelet_ino;
    if (pl->reg == REG_DONE && !same) {
        dp_emit(pl, "the kubelet's socket %s %s: registering again", pl->kubelet_path,
                there ? "was replaced" : "is gone");
        pl->reg = REG_WAIT;
        pl->next_try = now;
        pl->backoff = BACKOFF_MIN_S;
    }
    if (pl->reg != REG_WAIT)
        return;
    if (!there) {
        if (!pl->said_waiting)
            dp_emit(pl, "waiting for the kubelet: %s does not exist yet", pl->kubelet_path);
        pl->said_waiting = true;
        return;
    }
    pl->said_waiting = false;
    if (now >= pl->next_try || !same) { /* a new kubelet socket is tried at once */
        pl->kubelet_seen = true;
        pl->kubelet_dev = st.st_dev;
        pl->kubelet_ino = st.st_ino;
        reg_start(pl);
    }
}

/* ---- the loop ---------------------------------------------------------------------------- */

static void sample(plugin *pl)
{
    rk_err err = {0};
    int changed = 0;
    int rc = rk_dp_fleet_sample(pl->fleet, &changed, &err);
    if (rc && strcmp(err.msg, pl->last_read_err) != 0)
        dp_emit(pl, "reading the GPUs: %s", err.msg);
    snprintf(pl->last_read_err, sizeof pl->last_read_err, "%s", rc ? err.msg : "");
    if (!changed || !pl->samples) { /* the first is announced by announce() */
        pl->samples++;
        return;
    }
    const rk_dp_opts *o = pl->o;
    const rk_dp_dev *devs = rk_dp_fleet_devs(pl->fleet);
    for (int i = 0; i < rk_dp_fleet_count(pl->fleet); i++) {
        const rk_dp_dev *d = &devs[i];
        if (!d->changed)
            continue;
        char score[64];
        if (d->has_score)
            snprintf(score, sizeof score, "score %d", d->score);
        else
            snprintf(score, sizeof score, "no reading yet");
        if (!d->healthy)
            dp_emit(pl, "GPU %d (device %s): %s: %s%s%s%s", d->index, d->id, RK_DP_UNHEALTHY, score,
                    d->has_score && d->score < o->threshold ? " below the threshold" : "",
                    d->why[0] ? ", " : "", d->why);
        else
            dp_emit(pl, "GPU %d (device %s): %s%s: %s%s", d->index, d->id, RK_DP_HEALTHY,
                    pl->samples ? " again" : "", score,
                    pl->samples ? ", at or above the threshold + hysteresis" : "");
    }
    pl->samples++;
    dp_broadcast(pl);
}

static void dispatch(plugin *pl, grpc_event ev)
{
    tag *t = ev.tag;
    switch (t->kind) {
    case T_SHUTDOWN: {
        server *sv = t->p;
        grpc_server_destroy(sv->srv);
        free(sv);
        pl->servers--;
        break;
    }
    case T_REGISTER: on_registered(pl, ev.success); break;
    default: dp_on_call_event(t, ev.success); break;
    }
}

/* The options a run cannot start with: RK_EINVAL naming the option. */
static int check_opts(const rk_dp_opts *o, plugin *pl, rk_err *err)
{
    if (!o->dir || !o->dir[0] || !o->socket || !o->resource)
        return rk_err_set(err, RK_EINVAL, "device plugin: no directory, socket or resource");
    if (!o->socket[0] || strchr(o->socket, '/') || strcmp(o->socket, RK_DP_KUBELET_SOCKET) == 0 ||
        o->socket[0] == '.')
        return rk_err_set(err, RK_EINVAL, "socket name '%s' is not a plain file name other than %s",
                          o->socket, RK_DP_KUBELET_SOCKET);
    if (!rk_dp_resource_ok(o->resource))
        return rk_err_set(err, RK_EINVAL,
                          "resource '%s' is not DOMAIN/NAME (DOMAIN: lower-case letters, digits, "
                          "'.' and '-'; NAME: letters, digits, '.', '_' and '-')",
                          o->resource);
    if (!(o->interval_s >= 0.1))
        return rk_err_set(err, RK_EINVAL, "interval %g s: at least 0.1 s", o->interval_s);
    if (snprintf(pl->sock_path, sizeof pl->sock_path, "%s/%s", o->dir, o->socket) >=
            (int)sizeof pl->sock_path ||
        snprintf(pl->kubelet_path, sizeof pl->kubelet_path, "%s/%s", o->dir,
                 RK_DP_KUBELET_SOCKET) >= (int)sizeof pl->kubelet_path)
        return rk_err_set(err, RK_EINVAL, "%s/%s: longer than a Unix socket path can be (%zu)",
                          o->dir, o->socket, sizeof pl->sock_path - 1);
    struct stat st;
    if (stat(o->dir, &st) || !S_ISDIR(st.st_mode))
        return rk_err_set(err, RK_EINVAL, "%s is not a directory", o->dir);
    return RK_OK;
}

/* Say what is served: one line per device. */
static void announce(plugin *pl)
{
    const rk_dp_dev *devs = rk_dp_fleet_devs(pl->fleet);
    int n = rk_dp_fleet_count(pl->fleet);
    bool sim = rk_dp_fleet_simulated(pl->fleet);
    dp_emit(pl, "%d %sGPU%s (%s backend) as %s, health every %g s, threshold %g, hysteresis %g", n,
            sim ? "simulated " : "", n == 1 ? "" : "s", rk_dp_fleet_backend(pl->fleet),
            pl->o->resource, pl->o->interval_s, pl->o->threshold, pl->o->hysteresis);
    for (int i = 0; i < n; i++) {
        const rk_dp_dev *d = &devs[i];
        char numa[16] = "?";
        if (d->numa >= 0)
            snprintf(numa, sizeof numa, "%d", d->numa);
        dp_emit(pl, "device %s: GPU %d %s%s, bus %s, switch %s, NUMA node %s, score %d, %s", d->id,
                d->index, d->uuid, d->simulated ? " (simulated)" : "",
                d->bus_id[0] ? d->bus_id : "?", d->sw[0] ? d->sw : "?", numa,
                d->has_score ? d->score : 0, d->healthy ? RK_DP_HEALTHY : RK_DP_UNHEALTHY);
        if (!d->simulated && d->minor < 0)
            dp_emit(pl,
                    "device %s: its minor number is unknown (no /proc/driver/nvidia/gpus/%s/"
                    "information): Allocate gives no /dev/nvidiaN for it",
                    d->id, d->bus_id[0] ? d->bus_id : "?");
    }
}

static bool busy(const plugin *pl)
{
    return pl->servers > 0 || pl->calls || pl->reg == REG_FLIGHT;
}

static void next_event(plugin *pl, double wait_s)
{
    grpc_event ev = grpc_completion_queue_next(pl->cq, dp_after_ms((int64_t)(wait_s * 1000)), NULL);
    if (ev.type == GRPC_OP_COMPLETE)
        dispatch(pl, ev);
}

/* gRPC's own log lines: the plugin says what failed itself, so they are dropped unless asked for
 * with gRPC's GRPC_VERBOSITY or GRPC_TRACE (then gRPC prints them as it always does). */
static void grpc_log_drop(gpr_log_func_args *args)
{
    (void)args;
}

int rk_dp_run(const rk_dp_opts *o, rk_err *err)
{
    plugin *pl = calloc(1, sizeof *pl);
    if (!pl)
        return rk_err_set(err, RK_ENOMEM, "device plugin: out of memory");
    pl->o = o;
    int rc = check_opts(o, pl, err);
    if (!rc) {
        rk_dp_fleet_opts fo = o->fleet;
        fo.threshold = o->threshold;
        fo.hysteresis = o->hysteresis;
        rc = rk_dp_fleet_open(&pl->fleet, &fo, err);
    }
    if (rc) {
        free(pl);
        return rc;
    }
    sample(pl); /* the first health, before anything is served */
    announce(pl);
    if (!getenv("GRPC_VERBOSITY") && !getenv("GRPC_TRACE"))
        gpr_set_log_function(grpc_log_drop);
    grpc_init();
    pl->cq = grpc_completion_queue_create_for_next(NULL);
    pl->t_reg = (tag){T_REGISTER, pl};
    pl->backoff = BACKOFF_MIN_S;
    pl->reg = REG_WAIT;
    if ((rc = dp_server_start(pl, err)) == RK_OK) {
        dp_emit(pl, "serving %s", pl->sock_path);
        double now = rk_mono_s();
        pl->next_sample = now + o->interval_s;
        double tick = o->interval_s / 5 < 0.1 ? o->interval_s / 5 : 0.1;
        while (!pl->fatal && !(o->should_stop && o->should_stop(o->stop_ctx))) {
            now = rk_mono_s();
            if (now >= pl->next_watch) {
                watch_sockets(pl, now);
                pl->next_watch = now + WATCH_EVERY_S;
            }
            if (now >= pl->next_sample) {
                sample(pl);
                pl->next_sample += o->interval_s;
                if (pl->next_sample < now)
                    pl->next_sample = now + o->interval_s;
            }
            double until = pl->next_sample < pl->next_watch ? pl->next_sample : pl->next_watch;
            double wait = until - rk_mono_s();
            next_event(pl, wait < 0 ? 0 : wait > tick ? tick : wait);
        }
        if (pl->fatal) {
            *err = pl->fatal_err;
            rc = pl->fatal;
        } else {
            dp_emit(pl, "stopping: removing %s", pl->sock_path);
            if (dp_sock_is_ours(pl))
                unlink(pl->sock_path);
        }
    }
    if (pl->abandoned) { /* gRPC's teardown would unlink another process's socket */
        rk_dp_fleet_close(pl->fleet);
        return rc; /* pl and gRPC's state are left to the process's exit */
    }
    /* stop: no new calls, every call cancelled, the Register call too; wait for them all */
    dp_server_stop(pl);
    if (pl->reg == REG_FLIGHT)
        grpc_call_cancel(pl->reg_call, NULL);
    double give_up = rk_mono_s() + DRAIN_S;
    while (busy(pl) && rk_mono_s() < give_up)
        next_event(pl, 0.1);
    grpc_completion_queue_shutdown(pl->cq);
    if (!busy(pl)) {
        while (grpc_completion_queue_next(pl->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(pl->cq);
        grpc_shutdown();
    } /* else: something of gRPC's is stuck; leave it to the process's exit */
    rk_dp_fleet_close(pl->fleet);
    free(pl);
    return rc;
}
