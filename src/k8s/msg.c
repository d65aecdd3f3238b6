/*
 * Every message the device plugin parses (dp.h): the kubelet's requests (Empty,
 * AllocateRequest, PreferredAllocationRequest, PreStartContainerRequest) and Register's reply
 * (Empty). protobuf-c unpacks a bounded buffer (RK_DP_MAX_MSG); then every count and device id
 * is checked here before the plugin looks at it. fuzz/fuzz_deviceplugin.c drives this file.
 */
#include "k8s/dp.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api.pb-c.h"

static const char *const kind_names[RK_DP_MSG_KINDS] = {
    "Empty", "AllocateRequest", "PreferredAllocationRequest", "PreStartContainerRequest"};

const char *rk_dp_kind_name(rk_dp_kind kind)
{
    return (unsigned)kind < RK_DP_MSG_KINDS ? kind_names[kind] : "unknown message";
}

static int refuse(rk_dp_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(rk_dp_status *st, int code, const char *fmt, ...)
{
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    return code;
}

/* Check a list of device ids: at most RK_DP_MAX_IDS, each by rk_dp_id_ok. */
static int check_ids(rk_dp_status *st, const char *what, size_t ci, const char *field, char **ids,
                     size_t n)
{
    if (n > RK_DP_MAX_IDS)
        return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: container %zu: %zu %s (at most %d)", what,
                      ci, n, field, RK_DP_MAX_IDS);
    for (size_t j = 0; j < n; j++) {
        size_t len = ids[j] ? strlen(ids[j]) : 0;
        if (!rk_dp_id_ok(ids[j] ? ids[j] : "", len))
            return refuse(st, RK_DP_INVALID_ARGUMENT,
                          "%s: container %zu: %s[%zu] is not a device id (1 to %d printable "
                          "characters, %zu bytes here)",
                          what, ci, field, j, RK_DP_MAX_ID, len);
    }
    return RK_DP_OK;
}

static int check_containers(rk_dp_status *st, const char *what, size_t n)
{
    if (n == 0)
        return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: no container_requests", what);
    if (n > RK_DP_MAX_CONTAINERS)
        return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: %zu container_requests (at most %d)", what,
                      n, RK_DP_MAX_CONTAINERS);
    return RK_DP_OK;
}

static int parse_allocate(const uint8_t *buf, size_t len, rk_dp_request *r, rk_dp_status *st)
{
    const char *what = kind_names[RK_DP_MSG_ALLOCATE];
    V1beta1__AllocateRequest *m = v1beta1__allocate_request__unpack(NULL, len, buf);
    if (!m)
        return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: not a valid protobuf message", what);
    r->pb = m;
    if (check_containers(st, what, m->n_container_requests))
        return st->code;
    for (size_t c = 0; c < m->n_container_requests; c++) {
        V1beta1__ContainerAllocateRequest *q = m->container_requests[c];
        if (!q || q->n_devices_ids == 0)
            return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: container %zu asks for no device", what,
                          c);
        if (check_ids(st, what, c, "devices_ids", q->devices_ids, q->n_devices_ids))
            return st->code;
        r->c[c].ids = q->devices_ids;
        r->c[c].nids = q->n_devices_ids;
    }
    r->n = m->n_container_requests;
    return RK_DP_OK;
}

static int parse_preferred(const uint8_t *buf, size_t len, rk_dp_request *r, rk_dp_status *st)
{
    const char *what = kind_names[RK_DP_MSG_PREFERRED];
    V1beta1__PreferredAllocationRequest *m =
        v1beta1__preferred_allocation_request__unpack(NULL, len, buf);
    if (!m)
        return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: not a valid protobuf message", what);
    r->pb = m;
    if (check_containers(st, what, m->n_container_requests))
        return st->code;
    for (size_t c = 0; c < m->n_container_requests; c++) {
        V1beta1__ContainerPreferredAllocationRequest *q = m->container_requests[c];
        if (!q)
            return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: container %zu is empty", what, c);
        if (check_ids(st, what, c, "available_deviceIDs", q->available_deviceids,
                      q->n_available_deviceids) ||
            check_ids(st, what, c, "must_include_deviceIDs", q->must_include_deviceids,
                      q->n_must_include_deviceids))
            return st->code;
        if (q->allocation_size < 0 || q->allocation_size > RK_DP_MAX_IDS)
            return refuse(st, RK_DP_INVALID_ARGUMENT,
                          "%s: container %zu: allocation_size %d is not within 0..%d", what, c,
                          (int)q->allocation_size, RK_DP_MAX_IDS);
        r->c[c].ids = q->available_deviceids;
        r->c[c].nids = q->n_available_deviceids;
        r->c[c].must = q->must_include_deviceids;
        r->c[c].nmust = q->n_must_include_deviceids;
        r->c[c].size = (int)q->allocation_size;
    }
    r->n = m->n_container_requests;
    return RK_DP_OK;
}

static int parse_prestart(const uint8_t *buf, size_t len, rk_dp_request *r, rk_dp_status *st)
{
    const char *what = kind_names[RK_DP_MSG_PRESTART];
    V1beta1__PreStartContainerRequest *m =
        v1beta1__pre_start_container_request__unpack(NULL, len, buf);
    if (!m)
        return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: not a valid protobuf message", what);
    r->pb = m;
    if (check_ids(st, what, 0, "devices_ids", m->devices_ids, m->n_devices_ids))
        return st->code;
    r->c[0].ids = m->devices_ids;
    r->c[0].nids = m->n_devices_ids;
    r->n = 1;
    return RK_DP_OK;
}

int rk_dp_request_parse(rk_dp_kind kind, const uint8_t *buf, size_t len, rk_dp_request *out,
                        rk_dp_status *st)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    st->code = RK_DP_OK;
    st->msg[0] = '\0';
    if ((unsigned)kind >= RK_DP_MSG_KINDS)
        return refuse(st, RK_DP_INTERNAL, "no parser for message kind %d", (int)kind);
    if (len > RK_DP_MAX_MSG)
        return refuse(st, RK_DP_RESOURCE_EXHAUSTED, "%s: %zu bytes (at most %u)", kind_names[kind],
                      len, RK_DP_MAX_MSG);
    if (!buf && len)
        return refuse(st, RK_DP_INVALID_ARGUMENT, "%s: no bytes", kind_names[kind]);
    static const uint8_t none[1];
    if (!buf)
        buf = none;
    int rc;
    switch (kind) {
    case RK_DP_MSG_EMPTY: {
        V1beta1__Empty *m = v1beta1__empty__unpack(NULL, len, buf);
        if (!m)
            return refuse(st, RK_DP_INVALID_ARGUMENT, "Empty: not a valid protobuf message");
        out->pb = m;
        rc = RK_DP_OK;
        break;
    }
    case RK_DP_MSG_ALLOCATE: rc = parse_allocate(buf, len, out, st); break;
    case RK_DP_MSG_PREFERRED: rc = parse_preferred(buf, len, out, st); break;
    case RK_DP_MSG_PRESTART: rc = parse_prestart(buf, len, out, st); break;
    default: rc = refuse(st, RK_DP_INTERNAL, "no parser for message kind %d", (int)kind);
    }
    if (rc)
        rk_dp_request_free(out);
    return rc;
}

void rk_dp_request_free(rk_dp_request *r)
{
    if (!r || !r->pb)
        return;
    protobuf_c_message_free_unpacked((ProtobufCMessage *)r->pb, NULL);
    r->pb = NULL;
    r->n = 0;
}
