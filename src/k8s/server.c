/*
 * The device plugin's server (plugin.h): gRPC core on DIR/SOCKET, one call object per rpc from
 * its request to its last operation. Each request's bytes are parsed by msg.c and decided by
 * policy.c; this file builds the answers (ListAndWatch's device list, the preferred
 * allocation, Allocate's envs and device nodes) and keeps the streams.
 */
#include "k8s/plugin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "api.pb-c.h"
#include "base/clock.h"

static const struct {
    const char *path;
    method m;
    rk_dp_kind kind;
} methods[] = {
    {"/v1beta1.DevicePlugin/GetDevicePluginOptions", M_OPTIONS, RK_DP_MSG_EMPTY},
    {"/v1beta1.DevicePlugin/ListAndWatch", M_WATCH, RK_DP_MSG_EMPTY},
    {"/v1beta1.DevicePlugin/GetPreferredAllocation", M_PREFERRED, RK_DP_MSG_PREFERRED},
    {"/v1beta1.DevicePlugin/Allocate", M_ALLOCATE, RK_DP_MSG_ALLOCATE},
    {"/v1beta1.DevicePlugin/PreStartContainer", M_PRESTART, RK_DP_MSG_PRESTART},
};

const char *dp_code_name(int code)
{
    static const char *const names[] = {"OK",
                                        "CANCELLED",
                                        "UNKNOWN",
                                        "INVALID_ARGUMENT",
                                        "DEADLINE_EXCEEDED",
                                        "NOT_FOUND",
                                        "ALREADY_EXISTS",
                                        "PERMISSION_DENIED",
                                        "RESOURCE_EXHAUSTED",
                                        "FAILED_PRECONDITION",
                                        "ABORTED",
                                        "OUT_OF_RANGE",
                                        "UNIMPLEMENTED",
                                        "INTERNAL",
                                        "UNAVAILABLE",
                                        "DATA_LOSS",
                                        "UNAUTHENTICATED"};
    return code >= 0 && code < (int)(sizeof names / sizeof names[0]) ? names[code] : "?";
}

/* A message packed into a new byte buffer (NULL when out of memory). */
grpc_byte_buffer *dp_pack(const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *bytes = malloc(len ? len : 1);
    if (!bytes)
        return NULL;
    protobuf_c_message_pack(m, bytes);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)bytes, len);
    free(bytes);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* ---- calls ------------------------------------------------------------------------------ */

static void call_free(call *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        c->pl->calls = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->call)
        grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->recv_buf)
        grpc_byte_buffer_destroy(c->recv_buf);
    if (c->send_buf)
        grpc_byte_buffer_destroy(c->send_buf);
    if (c->has_status_details)
        grpc_slice_unref(c->status_details);
    free(c);
}

/* Ask the server for its next call. */
static void request_call(server *sv)
{
    plugin *pl = sv->pl;
    call *c = calloc(1, sizeof *c);
    if (!c) {
        dp_emit(pl, "out of memory: no more calls accepted until the socket is served anew");
        return;
    }
    c->pl = pl;
    c->sv = sv;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    c->t_new = (tag){T_NEW, c};
    c->t_recv = (tag){T_RECV, c};
    c->t_send = (tag){T_SEND, c};
    c->t_close = (tag){T_CLOSE, c};
    c->next = pl->calls;
    if (pl->calls)
        pl->calls->prev = c;
    pl->calls = c;
    if (grpc_server_request_call(sv->srv, &c->call, &c->details, &c->md, pl->cq, pl->cq,
                                 &c->t_new) != GRPC_CALL_OK) {
        call_free(c);
        return;
    }
    c->pending = 1;
}

static bool start(call *c, const grpc_op *ops, size_t n, tag *t)
{
    if (grpc_call_start_batch(c->call, ops, n, t, NULL) != GRPC_CALL_OK)
        return false;
    c->pending++;
    return true;
}

/* Answer a unary call: the message (NULL for none) and the status. */
static void reply(call *c, const ProtobufCMessage *m, int code, const char *text)
{
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = true;
    }
    if (m && code == RK_DP_OK) {
        c->send_buf = dp_pack(m);
        if (!c->send_buf) {
            code = RK_DP_RESOURCE_EXHAUSTED;
            text = "out of memory";
        } else {
            ops[n].op = GRPC_OP_SEND_MESSAGE;
            ops[n++].data.send_message.send_message = c->send_buf;
        }
    }
    c->status_details = grpc_slice_from_copied_string(text ? text : "");
    c->has_status_details = true;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n++].data.send_status_from_server.status_details = &c->status_details;
    start(c, ops, n, &c->t_send);
}

/* End a ListAndWatch stream whose update cannot be sent with INTERNAL, so that the kubelet
 * reconnects instead of waiting on a silent stream. */
static void watch_fail(call *c, const char *why)
{
    c->watching = false;
    if (c->closed)
        return;
    dp_emit(c->pl, "ListAndWatch: %s: ending the stream (INTERNAL)", why);
    if (!c->has_status_details && !c->sending) {
        int before = c->pending;
        reply(c, NULL, RK_DP_INTERNAL, why);
        if (c->pending > before)
            return;
    }
    grpc_call_cancel_with_status(c->call, GRPC_STATUS_INTERNAL, why, NULL);
}

/* ListAndWatch's message: every device with its health and topology. */
static void watch_send(call *c)
{
    plugin *pl = c->pl;
    int n = rk_dp_fleet_count(pl->fleet);
    const rk_dp_dev *devs = rk_dp_fleet_devs(pl->fleet);
    V1beta1__Device *dv = calloc((size_t)n, sizeof *dv);
    V1beta1__Device **dp = calloc((size_t)n, sizeof *dp);
    V1beta1__TopologyInfo *topo = calloc((size_t)n, sizeof *topo);
    V1beta1__NUMANode *numa = calloc((size_t)n, sizeof *numa);
    V1beta1__NUMANode **numap = calloc((size_t)n, sizeof *numap);
    if (!dv || !dp || !topo || !numa || !numap) {
        watch_fail(c, "out of memory for the device list");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        v1beta1__device__init(&dv[i]);
        dv[i].id = (char *)devs[i].id;
        dv[i].health = devs[i].healthy ? RK_DP_HEALTHY : RK_DP_UNHEALTHY;
        if (devs[i].numa >= 0) {
            v1beta1__topology_info__init(&topo[i]);
            v1beta1__numanode__init(&numa[i]);
            numa[i].id = devs[i].numa;
            numap[i] = &numa[i];
            topo[i].n_nodes = 1;
            topo[i].nodes = &numap[i];
            dv[i].topology = &topo[i];
        }
        dp[i] = &dv[i];
    }
    V1beta1__ListAndWatchResponse r = V1BETA1__LIST_AND_WATCH_RESPONSE__INIT;
    r.n_devices = (size_t)n;
    r.devices = dp;
    if (c->send_buf)
        grpc_byte_buffer_destroy(c->send_buf);
    c->send_buf = dp_pack(&r.base);
    if (!c->send_buf) {
        watch_fail(c, "out of memory packing the device list");
        goto out;
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t k = 0;
    if (!c->md_sent) {
        ops[k++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = true;
    }
    ops[k].op = GRPC_OP_SEND_MESSAGE;
    ops[k++].data.send_message.send_message = c->send_buf;
    if (start(c, ops, k, &c->t_send)) {
        c->sending = true;
        c->dirty = false;
    } else {
        watch_fail(c, "the device list could not be sent");
    }
out:
    free(dv);
    free(dp);
    free(topo);
    free(numa);
    free(numap);
}

/* Every ListAndWatch stream gets the device list again. */
void dp_broadcast(plugin *pl)
{
    for (call *c = pl->calls; c; c = c->next) {
        if (!c->watching || c->closed)
            continue;
        if (c->sending)
            c->dirty = true;
        else
            watch_send(c);
    }
}

/* The device indexes of ids[] into idx[]; RK_DP_NOT_FOUND naming an unknown one. */
static int indexes(plugin *pl, char *const *ids, size_t n, int *idx, rk_dp_status *st)
{
    const rk_dp_dev *devs = rk_dp_fleet_devs(pl->fleet);
    int nd = rk_dp_fleet_count(pl->fleet);
    for (size_t j = 0; j < n; j++) {
        idx[j] = rk_dp_find(devs, nd, ids[j]);
        if (idx[j] < 0) {
            st->code = RK_DP_NOT_FOUND;
            snprintf(st->msg, sizeof st->msg, "device %s: no such device on this node", ids[j]);
            return st->code;
        }
    }
    return RK_DP_OK;
}

static void do_preferred(call *c, const rk_dp_request *rq)
{
    plugin *pl = c->pl;
    const rk_dp_dev *devs = rk_dp_fleet_devs(pl->fleet);
    int nd = rk_dp_fleet_count(pl->fleet);
    V1beta1__PreferredAllocationResponse r = V1BETA1__PREFERRED_ALLOCATION_RESPONSE__INIT;
    V1beta1__ContainerPreferredAllocationResponse cr[RK_DP_MAX_CONTAINERS];
    V1beta1__ContainerPreferredAllocationResponse *crp[RK_DP_MAX_CONTAINERS];
    int *buf = calloc((size_t)rq->n * 3 * RK_DP_MAX_IDS, sizeof *buf);
    char **ids = calloc((size_t)rq->n * RK_DP_MAX_IDS, sizeof *ids);
    rk_dp_status st = {RK_DP_OK, ""};
    if (!buf || !ids) {
        st.code = RK_DP_RESOURCE_EXHAUSTED;
        snprintf(st.msg, sizeof st.msg, "out of memory");
    }
    for (size_t k = 0; k < rq->n && !st.code; k++) {
        const rk_dp_container *q = &rq->c[k];
        int *avail = buf + k * 3 * RK_DP_MAX_IDS, *must = avail + RK_DP_MAX_IDS,
            *out = must + RK_DP_MAX_IDS;
        if (indexes(pl, q->ids, q->nids, avail, &st) || indexes(pl, q->must, q->nmust, must, &st) ||
            rk_dp_prefer(devs, nd, avail, (int)q->nids, must, (int)q->nmust, q->size, out, &st))
            break;
        v1beta1__container_preferred_allocation_response__init(&cr[k]);
        cr[k].n_deviceids = (size_t)q->size;
        cr[k].deviceids = ids + k * RK_DP_MAX_IDS;
        for (int j = 0; j < q->size; j++)
            cr[k].deviceids[j] = (char *)devs[out[j]].id;
        crp[k] = &cr[k];
    }
    if (st.code) {
        dp_emit(pl, "GetPreferredAllocation refused: %s", st.msg);
    } else {
        r.n_container_responses = rq->n;
        r.container_responses = crp;
    }
    reply(c, &r.base, st.code, st.msg);
    free(buf);
    free(ids);
}

/* "a,b,c" of the devices' UUIDs (simulated: their ids) into out. */
static void visible_list(const rk_dp_dev *devs, const int *idx, size_t n, char *out, size_t cap)
{
    size_t off = 0;
    out[0] = '\0';
    for (size_t j = 0; j < n && off < cap; j++) {
        const rk_dp_dev *d = &devs[idx[j]];
        const char *name = d->simulated || !d->uuid[0] ? d->id : d->uuid;
        int w = snprintf(out + off, cap - off, "%s%s", j ? "," : "", name);
        if (w < 0)
            break;
        off += (size_t)w;
    }
}

/* One container's answer to Allocate, its arrays sized to its devices. */
typedef struct one {
    V1beta1__ContainerAllocateResponse r;
    V1beta1__ContainerAllocateResponse__EnvsEntry env[2], *envp[2];
    V1beta1__DeviceSpec *spec, **specp;
    char (*nodes)[RK_DP_NODE_PATH];
    char *visible;
    int *idx;
} one;

static void one_free(one *a)
{
    free(a->spec);
    free(a->specp);
    free(a->nodes);
    free(a->visible);
    free(a->idx);
}

/* Fill a's answer for the (checked: known, Healthy, distinct) devices ids[0..n). */
static bool one_fill(plugin *pl, one *a, char *const *ids, size_t n)
{
    static const char *const keys[2] = {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"};
    const rk_dp_dev *devs = rk_dp_fleet_devs(pl->fleet);
    size_t cap = n + 4; /* each device's node and the shared ones */
    size_t vis = n * (sizeof devs->uuid + 1) + 1;
    a->spec = calloc(cap, sizeof *a->spec);
    a->specp = calloc(cap, sizeof *a->specp);
    a->nodes = calloc(cap, sizeof *a->nodes);
    a->visible = calloc(vis, 1);
    a->idx = calloc(n ? n : 1, sizeof *a->idx);
    if (!a->spec || !a->specp || !a->nodes || !a->visible || !a->idx)
        return false;
    rk_dp_status st;
    if (indexes(pl, ids, n, a->idx, &st))
        return false;
    v1beta1__container_allocate_response__init(&a->r);
    visible_list(devs, a->idx, n, a->visible, vis);
    for (int e = 0; e < 2; e++) {
        v1beta1__container_allocate_response__envs_entry__init(&a->env[e]);
        a->env[e].key = (char *)keys[e];
        a->env[e].value = a->visible;
        a->envp[e] = &a->env[e];
    }
    a->r.n_envs = 2;
    a->r.envs = a->envp;
    int nn = rk_dp_fleet_nodes(pl->fleet, a->idx, (int)n, a->nodes, (int)cap);
    for (int j = 0; j < nn; j++) {
        v1beta1__device_spec__init(&a->spec[j]);
        a->spec[j].container_path = a->nodes[j];
        a->spec[j].host_path = a->nodes[j];
        a->spec[j].permissions = "rw";
        a->specp[j] = &a->spec[j];
    }
    a->r.n_devices = (size_t)nn;
    a->r.devices = a->specp;
    return true;
}

static void do_allocate(call *c, const rk_dp_request *rq)
{
    plugin *pl = c->pl;
    const rk_dp_opts *o = pl->o;
    const rk_dp_dev *devs = rk_dp_fleet_devs(pl->fleet);
    int nd = rk_dp_fleet_count(pl->fleet);
    rk_dp_status st = {RK_DP_OK, ""};
    for (size_t k = 0; k < rq->n && !st.code; k++)
        rk_dp_allocate_check(devs, nd, rq->c[k].ids, rq->c[k].nids, o->threshold, o->hysteresis,
                             &st);
    if (st.code) {
        dp_emit(pl, "Allocate refused (%s): %s", dp_code_name(st.code), st.msg);
        reply(c, NULL, st.code, st.msg);
        return;
    }
    one *all = calloc(rq->n, sizeof *all);
    V1beta1__ContainerAllocateResponse *rp[RK_DP_MAX_CONTAINERS];
    bool ok = all != NULL;
    char said[512] = "";
    for (size_t k = 0; ok && k < rq->n; k++) {
        one *a = &all[k];
        ok = one_fill(pl, a, rq->c[k].ids, rq->c[k].nids);
        rp[k] = &a->r;
        size_t len = strlen(said);
        if (ok)
            snprintf(said + len, sizeof said - len, "%s[%.100s]%s", k ? " " : "", a->visible,
                     a->r.n_devices ? "" : " (no device nodes)");
    }
    if (ok) {
        V1beta1__AllocateResponse r = V1BETA1__ALLOCATE_RESPONSE__INIT;
        r.n_container_responses = rq->n;
        r.container_responses = rp;
        dp_emit(pl, "Allocate: %s", said);
        reply(c, &r.base, RK_DP_OK, "");
    } else {
        reply(c, NULL, RK_DP_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t k = 0; all && k < rq->n; k++)
        one_free(&all[k]);
    free(all);
}

/* An unknown method: UNIMPLEMENTED naming it (printable, at most 100 bytes). */
static void reply_unknown(call *c)
{
    char name[160];
    size_t len = GRPC_SLICE_LENGTH(c->details.method);
    snprintf(name, sizeof name, "%.*s", (int)(len < 100 ? len : 100),
             (const char *)GRPC_SLICE_START_PTR(c->details.method));
    for (char *p = name; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            *p = '?';
    char text[256];
    snprintf(text, sizeof text, "no method %s in this device plugin", name);
    reply(c, NULL, RK_DP_UNIMPLEMENTED, text);
}

/* A request's message has arrived: parse it, answer it. */
static void on_request(call *c, bool ok)
{
    plugin *pl = c->pl;
    if (!ok || !c->recv_buf) {
        reply(c, NULL, RK_DP_INVALID_ARGUMENT, "no request message");
        return;
    }
    rk_dp_status st = {RK_DP_OK, ""};
    rk_dp_request rq;
    if (grpc_byte_buffer_length(c->recv_buf) > RK_DP_MAX_MSG) {
        snprintf(st.msg, sizeof st.msg, "%s: over %u bytes", rk_dp_kind_name(c->kind),
                 RK_DP_MAX_MSG);
        reply(c, NULL, RK_DP_RESOURCE_EXHAUSTED, st.msg);
        return;
    }
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, c->recv_buf)) {
        reply(c, NULL, RK_DP_INVALID_ARGUMENT, "the request could not be read");
        return;
    }
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    int rc = rk_dp_request_parse(c->kind, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), &rq, &st);
    grpc_slice_unref(s);
    if (rc) {
        dp_emit(pl, "refused a malformed request (%s): %s", dp_code_name(st.code), st.msg);
        reply(c, NULL, st.code, st.msg);
        return;
    }
    switch (c->m) {
    case M_OPTIONS: {
        V1beta1__DevicePluginOptions r = V1BETA1__DEVICE_PLUGIN_OPTIONS__INIT;
        r.get_preferred_allocation_available = 1;
        reply(c, &r.base, RK_DP_OK, "");
        break;
    }
    case M_WATCH:
        c->watching = true;
        watch_send(c);
        break;
    case M_PREFERRED: do_preferred(c, &rq); break;
    case M_ALLOCATE: do_allocate(c, &rq); break;
    case M_PRESTART: {
        V1beta1__PreStartContainerResponse r = V1BETA1__PRE_START_CONTAINER_RESPONSE__INIT;
        reply(c, &r.base, RK_DP_OK, "");
        break;
    }
    case M_UNKNOWN: break;
    }
    rk_dp_request_free(&rq);
}

/* A new call arrived (ok) or the server is shutting down (!ok). */
static void on_new(call *c, bool ok)
{
    server *sv = c->sv;
    if (!ok)
        return;
    if (!sv->stopping)
        request_call(sv);
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (grpc_slice_str_cmp(c->details.method, methods[i].path) == 0) {
            c->m = methods[i].m;
            c->kind = methods[i].kind;
        }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    if (!start(c, &op, 1, &c->t_close))
        c->closed = true;
    if (c->m == M_UNKNOWN) { /* answered at once: no request message is waited for */
        reply_unknown(c);
        return;
    }
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    if (!start(c, &op, 1, &c->t_recv))
        grpc_call_cancel(c->call, NULL);
}

void dp_on_call_event(tag *t, bool ok)
{
    call *c = t->p;
    c->pending--;
    switch (t->kind) {
    case T_NEW: on_new(c, ok); break;
    case T_RECV: on_request(c, ok); break;
    case T_SEND:
        c->sending = false;
        if (!ok && c->watching)
            watch_fail(c, "sending the device list failed");
        if (c->watching && c->dirty && !c->closed)
            watch_send(c);
        break;
    case T_CLOSE:
        c->closed = true;
        c->watching = false;
        break;
    default: break;
    }
    if (c->pending == 0)
        call_free(c);
}

/* ---- the server and its socket ------------------------------------------------------------ */

void dp_server_stop(plugin *pl)
{
    server *sv = pl->cur;
    if (!sv)
        return;
    pl->cur = NULL;
    sv->stopping = true;
    grpc_server_shutdown_and_notify(sv->srv, pl->cq, &sv->t_shutdown);
    grpc_server_cancel_all_calls(sv->srv);
}

/* Does a socket answer at path? 1 it does (another server holds it), 0 nothing listens
 * (ECONNREFUSED: a stale socket), -1 it cannot be told (errno set). */
int dp_sock_probe(const char *path)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int rc = connect(fd, (const struct sockaddr *)&a, sizeof a);
    int e = errno;
    close(fd);
    if (rc == 0)
        return 1;
    errno = e;
    return e == ECONNREFUSED ? 0 : -1;
}

/* Serve DIR/SOCKET anew: a stale socket there (nothing answers) is replaced; a live one is
 * RK_EBUSY, anything else RK_EIO. */
int dp_server_start(plugin *pl, rk_err *err)
{
    struct stat st;
    if (lstat(pl->sock_path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return rk_err_set(err, RK_EIO, "%s exists and is not a socket: not replaced",
                              pl->sock_path);
        int live = dp_sock_probe(pl->sock_path);
        if (live == 1)
            return rk_err_set(err, RK_EBUSY, "%s is served by another process: not replaced",
                              pl->sock_path);
        if (live < 0 && errno != ENOENT)
            return rk_err_set(err, RK_EIO, "%s: cannot tell whether another process serves it: %s",
                              pl->sock_path, strerror(errno));
        if (unlink(pl->sock_path) && errno != ENOENT)
            return rk_err_set(err, RK_EIO, "cannot remove the stale socket %s: %s", pl->sock_path,
                              strerror(errno));
    }
    server *sv = calloc(1, sizeof *sv);
    if (!sv)
        return rk_err_set(err, RK_ENOMEM, "device plugin: out of memory");
    sv->pl = pl;
    sv->t_shutdown = (tag){T_SHUTDOWN, sv};
    grpc_arg arg;
    memset(&arg, 0, sizeof arg);
    arg.type = GRPC_ARG_INTEGER;
    arg.key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    arg.value.integer = (int)RK_DP_MAX_MSG;
    grpc_channel_args args = {1, &arg};
    sv->srv = grpc_server_create(&args, NULL);
    grpc_server_register_completion_queue(sv->srv, pl->cq, NULL);
    char addr[sizeof pl->sock_path + 8];
    snprintf(addr, sizeof addr, "unix:%s", pl->sock_path);
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(sv->srv, addr, cr);
    grpc_server_credentials_release(cr);
    if (!port) {
        grpc_server_destroy(sv->srv);
        free(sv);
        if (stat(pl->o->dir, &st) || !S_ISDIR(st.st_mode))
            return rk_err_set(err, RK_EIO, "cannot listen on %s: the directory %s is gone",
                              pl->sock_path, pl->o->dir);
        return rk_err_set(err, RK_EIO, "cannot listen on %s (is the directory writable?)",
                          pl->sock_path);
    }
    grpc_server_start(sv->srv);
    pl->servers++;
    pl->cur = sv;
    if (stat(pl->sock_path, &st) == 0) {
        pl->sock_dev = st.st_dev;
        pl->sock_ino = st.st_ino;
    }
    request_call(sv);
    request_call(sv);
    return RK_OK;
}

bool dp_sock_is_ours(const plugin *pl)
{
    struct stat st;
    return stat(pl->sock_path, &st) == 0 && st.st_dev == pl->sock_dev && st.st_ino == pl->sock_ino;
}
