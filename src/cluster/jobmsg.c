/*
 * The node link's launch messages (cluster/nodes.h, docs/cluster-protocol.md "Launching
 * the ranks"): LAUNCH, LAUNCHED, OPEN, EXITED and KILL as key=value lines (the rules of
 * nodemsg.c), DATA and CLOSE as a channel number and raw bytes. Fixed bounds, nothing
 * allocated; every parser is fuzzed (fuzz/fuzz_nodes.c).
 */
#include "cluster/nodes.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/text.h"

/* A list "a,b,c" of 1..16 characters of [A-Za-z0-9_.:-] each ("" allowed when `empty`). */
static int list_ok(const char *s, size_t n, int empty)
{
    if (n == 0)
        return empty;
    if (n >= RK_NODE_LIST_MAX)
        return 0;
    size_t item = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == ',') {
            if (item == 0)
                return 0;
            item = 0;
            continue;
        }
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-'))
            return 0;
        if (++item > 16)
            return 0;
    }
    return item > 0;
}

static int host_ok(const char *s, size_t n)
{
    return n > 0 && n < RK_NODE_HOST_MAX && n <= RK_NODE_VALUE_MAX && rk_text_ok(s, n);
}

static int parse_kv(rk_node_kv *kv, const char *what, const void *payload, size_t len, rk_err *err)
{
    rk_err e = {0};
    if (rk_node_kv_parse(kv, payload, len, &e))
        return rk_err_set(err, RK_EFORMAT, "%s: %s", what, e.msg);
    return RK_OK;
}

static int get_u32(const rk_node_kv *kv, const char *what, const char *key, int64_t lo,
                   uint32_t *out, rk_err *err)
{
    int64_t v;
    int rc = rk_node_kv_int(kv, what, key, lo, UINT32_MAX, &v, err);
    if (!rc)
        *out = (uint32_t)v;
    return rc;
}

/* ---- LAUNCH ------------------------------------------------------------------------------ */

int rk_node_launch_format(const rk_node_launch *m, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    size_t ml = strnlen(m->master, sizeof m->master);
    if (m->launch < 1 || m->ranks < 1 || m->world < 1 || m->base >= m->world || m->watch > 1 ||
        m->snap_off > 1 || m->ranks > m->world - m->base || m->port > 65535 ||
        !host_ok(m->master, ml) ||
        !list_ok(m->devices, strnlen(m->devices, sizeof m->devices), 0) ||
        !list_ok(m->done, strnlen(m->done, sizeof m->done), 1))
        return rk_err_set(err, RK_EINVAL, "launch: a field out of range");
    if (!rk_node_put(out, cap, len,
                     "launch=%u\nworld=%u\nbase=%u\nranks=%u\nmaster=%s\nport=%u\ndevices=%s\n",
                     (unsigned)m->launch, (unsigned)m->world, (unsigned)m->base, (unsigned)m->ranks,
                     m->master, (unsigned)m->port, m->devices) ||
        (m->done[0] && !rk_node_put(out, cap, len, "done=%s\n", m->done)) ||
        (m->watch && !rk_node_put(out, cap, len, "watch=1\n")) ||
        (m->snap_off && !rk_node_put(out, cap, len, "snap_off=1\n")))
        return rk_err_set(err, RK_EINVAL, "launch: the buffer is too small");
    return RK_OK;
}

static int launch_parse(const void *payload, size_t len, rk_node_launch *m, rk_err *err)
{
    rk_node_kv kv;
    int rc;
    if ((rc = parse_kv(&kv, "launch", payload, len, err)) ||
        (rc = get_u32(&kv, "launch", "launch", 1, &m->launch, err)) ||
        (rc = get_u32(&kv, "launch", "world", 1, &m->world, err)) ||
        (rc = get_u32(&kv, "launch", "base", 0, &m->base, err)) ||
        (rc = get_u32(&kv, "launch", "ranks", 1, &m->ranks, err)) ||
        (rc = get_u32(&kv, "launch", "port", 0, &m->port, err)))
        return rc;
    size_t wn;
    if (rk_node_kv_get(&kv, "watch", &wn) &&
        (rc = get_u32(&kv, "launch", "watch", 0, &m->watch, err)))
        return rc;
    if (m->watch > 1)
        return rk_err_set(err, RK_EFORMAT, "launch: watch is 0 or 1");
    if (rk_node_kv_get(&kv, "snap_off", &wn) &&
        (rc = get_u32(&kv, "launch", "snap_off", 0, &m->snap_off, err)))
        return rc;
    if (m->snap_off > 1)
        return rk_err_set(err, RK_EFORMAT, "launch: snap_off is 0 or 1");
    if (m->base >= m->world || m->ranks > m->world - m->base)
        return rk_err_set(err, RK_EFORMAT, "launch: ranks %u..%u are not in a world of %u",
                          (unsigned)m->base, (unsigned)(m->base + m->ranks - 1),
                          (unsigned)m->world);
    if (m->port > 65535)
        return rk_err_set(err, RK_EFORMAT, "launch: port is not in 0..65535");
    size_t n;
    const char *v = rk_node_kv_get(&kv, "master", &n);
    if (!v || !host_ok(v, n))
        return rk_err_set(err, RK_EFORMAT, "launch: %s", v ? "master is empty" : "no master");
    memcpy(m->master, v, n);
    v = rk_node_kv_get(&kv, "devices", &n);
    if (!v || !list_ok(v, n, 0))
        return rk_err_set(err, RK_EFORMAT, "launch: %s",
                          v ? "devices is not a list of device ids" : "no devices");
    memcpy(m->devices, v, n);
    v = rk_node_kv_get(&kv, "done", &n);
    if (v && !list_ok(v, n, 1))
        return rk_err_set(err, RK_EFORMAT, "launch: done is not a list of numbers");
    if (v)
        memcpy(m->done, v, n);
    return RK_OK;
}

int rk_node_launch_parse(const void *payload, size_t len, rk_node_launch *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    int rc = launch_parse(payload, len, m, err);
    if (rc)
        memset(m, 0, sizeof *m);
    return rc;
}

/* ---- LAUNCHED, OPEN, EXITED, KILL -------------------------------------------------------- */

int rk_node_launched_format(const rk_node_launched *m, char *out, size_t cap, size_t *len,
                            rk_err *err)
{
    *len = 0;
    if (m->launch < 1 || m->port > 65535)
        return rk_err_set(err, RK_EINVAL, "launched: a field out of range");
    if (!rk_node_put(out, cap, len, "launch=%u\nport=%u\n", (unsigned)m->launch, (unsigned)m->port))
        return rk_err_set(err, RK_EINVAL, "launched: the buffer is too small");
    return RK_OK;
}

int rk_node_launched_parse(const void *payload, size_t len, rk_node_launched *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    rk_node_kv kv;
    int rc;
    if ((rc = parse_kv(&kv, "launched", payload, len, err)) ||
        (rc = get_u32(&kv, "launched", "launch", 1, &m->launch, err)) ||
        (rc = get_u32(&kv, "launched", "port", 0, &m->port, err)))
        return rc;
    if (m->port > 65535) {
        memset(m, 0, sizeof *m);
        return rk_err_set(err, RK_EFORMAT, "launched: port is not in 0..65535");
    }
    return RK_OK;
}

int rk_node_open_format(const rk_node_open *m, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    if (m->launch < 1 || m->chan < 1 || m->pid < 1 || m->pid > INT32_MAX)
        return rk_err_set(err, RK_EINVAL, "open: a field out of range");
    if (!rk_node_put(out, cap, len, "launch=%u\nchan=%u\npid=%" PRId64 "\n", (unsigned)m->launch,
                     (unsigned)m->chan, m->pid))
        return rk_err_set(err, RK_EINVAL, "open: the buffer is too small");
    return RK_OK;
}

int rk_node_open_parse(const void *payload, size_t len, rk_node_open *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    rk_node_kv kv;
    int rc;
    if ((rc = parse_kv(&kv, "open", payload, len, err)) ||
        (rc = get_u32(&kv, "open", "launch", 1, &m->launch, err)) ||
        (rc = get_u32(&kv, "open", "chan", 1, &m->chan, err)) ||
        (rc = rk_node_kv_int(&kv, "open", "pid", 1, INT32_MAX, &m->pid, err)))
        memset(m, 0, sizeof *m);
    return rc;
}

int rk_node_exited_format(const rk_node_exited *m, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    if (m->launch < 1 || m->status > 255 || m->failed < -1 || m->failed > INT32_MAX)
        return rk_err_set(err, RK_EINVAL, "exited: a field out of range");
    if (!rk_node_put(out, cap, len, "launch=%u\nstatus=%u\n", (unsigned)m->launch,
                     (unsigned)m->status) ||
        (m->failed >= 0 && !rk_node_put(out, cap, len, "failed=%" PRId64 "\n", m->failed)))
        return rk_err_set(err, RK_EINVAL, "exited: the buffer is too small");
    return RK_OK;
}

int rk_node_exited_parse(const void *payload, size_t len, rk_node_exited *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    m->failed = -1;
    rk_node_kv kv;
    int rc;
    if ((rc = parse_kv(&kv, "exited", payload, len, err)) ||
        (rc = get_u32(&kv, "exited", "launch", 1, &m->launch, err)) ||
        (rc = get_u32(&kv, "exited", "status", 0, &m->status, err)))
        goto bad;
    if (m->status > 255) {
        rc = rk_err_set(err, RK_EFORMAT, "exited: status is not in 0..255");
        goto bad;
    }
    size_t n;
    if (rk_node_kv_get(&kv, "failed", &n) &&
        (rc = rk_node_kv_int(&kv, "exited", "failed", 0, INT32_MAX, &m->failed, err)))
        goto bad;
    return RK_OK;
bad:
    memset(m, 0, sizeof *m);
    m->failed = -1;
    return rc;
}

int rk_node_health_format(const rk_node_health *m, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    if (m->score > 100 || m->lost > 1 || m->sim > 1 || m->prob_ppm < -1 || m->prob_ppm > 1000000 ||
        m->device >= RK_NODES_MAX)
        return rk_err_set(err, RK_EINVAL, "health: a field out of range");
    char why[RK_NODE_VALUE_MAX + 1];
    rk_text_clean(why, sizeof why, m->why);
    if (!rk_node_put(out, cap, len, "device=%u\nscore=%u\nlost=%u\nsim=%u\n", (unsigned)m->device,
                     (unsigned)m->score, (unsigned)m->lost, (unsigned)m->sim) ||
        (m->prob_ppm >= 0 && !rk_node_put(out, cap, len, "prob_ppm=%" PRId64 "\n", m->prob_ppm)) ||
        (why[0] && !rk_node_put(out, cap, len, "why=%s\n", why)))
        return rk_err_set(err, RK_EINVAL, "health: the buffer is too small");
    return RK_OK;
}

int rk_node_health_parse(const void *payload, size_t len, rk_node_health *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    m->prob_ppm = -1;
    rk_node_kv kv;
    int rc;
    int64_t v;
    if ((rc = parse_kv(&kv, "health", payload, len, err)) ||
        (rc = rk_node_kv_int(&kv, "health", "device", 0, RK_NODES_MAX - 1, &v, err)))
        goto bad;
    m->device = (uint32_t)v;
    if ((rc = rk_node_kv_int(&kv, "health", "score", 0, 100, &v, err)))
        goto bad;
    m->score = (uint32_t)v;
    if ((rc = rk_node_kv_int(&kv, "health", "lost", 0, 1, &v, err)))
        goto bad;
    m->lost = (uint32_t)v;
    if ((rc = rk_node_kv_int(&kv, "health", "sim", 0, 1, &v, err)))
        goto bad;
    m->sim = (uint32_t)v;
    size_t n;
    if (rk_node_kv_get(&kv, "prob_ppm", &n) &&
        (rc = rk_node_kv_int(&kv, "health", "prob_ppm", 0, 1000000, &m->prob_ppm, err)))
        goto bad;
    const char *why = rk_node_kv_get(&kv, "why", &n);
    if (why) { /* rk_node_kv_parse checked it: UTF-8, no control characters, <= 255 bytes */
        memcpy(m->why, why, n);
        m->why[n] = 0;
    }
    return RK_OK;
bad:
    memset(m, 0, sizeof *m);
    m->prob_ppm = -1;
    return rc;
}

int rk_node_stacks_format(const rk_node_stacks *m, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    if (m->launch < 1 || m->chan < 1 || m->rank > INT32_MAX)
        return rk_err_set(err, RK_EINVAL, "stacks: a field out of range");
    if (!rk_node_put(out, cap, len, "launch=%u\nchan=%u\nrank=%u\n", (unsigned)m->launch,
                     (unsigned)m->chan, (unsigned)m->rank))
        return rk_err_set(err, RK_EINVAL, "stacks: the buffer is too small");
    return RK_OK;
}

int rk_node_stacks_parse(const void *payload, size_t len, rk_node_stacks *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    rk_node_kv kv;
    int rc;
    int64_t rank;
    if ((rc = parse_kv(&kv, "stacks", payload, len, err)) ||
        (rc = get_u32(&kv, "stacks", "launch", 1, &m->launch, err)) ||
        (rc = get_u32(&kv, "stacks", "chan", 1, &m->chan, err)) ||
        (rc = rk_node_kv_int(&kv, "stacks", "rank", 0, INT32_MAX, &rank, err))) {
        memset(m, 0, sizeof *m);
        return rc;
    }
    m->rank = (uint32_t)rank;
    return RK_OK;
}

int rk_node_kill_format(const rk_node_kill *m, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    if (m->launch < 1 || !(m->grace_s >= 0) || m->grace_s > 3600)
        return rk_err_set(err, RK_EINVAL, "kill: a field out of range");
    if (!rk_node_put(out, cap, len, "launch=%u\ngrace_ms=%" PRId64 "\n", (unsigned)m->launch,
                     (int64_t)(m->grace_s * 1000 + 0.5)))
        return rk_err_set(err, RK_EINVAL, "kill: the buffer is too small");
    return RK_OK;
}

int rk_node_kill_parse(const void *payload, size_t len, rk_node_kill *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    rk_node_kv kv;
    int64_t ms;
    int rc;
    if ((rc = parse_kv(&kv, "kill", payload, len, err)) ||
        (rc = get_u32(&kv, "kill", "launch", 1, &m->launch, err)) ||
        (rc = rk_node_kv_int(&kv, "kill", "grace_ms", 0, 3600000, &ms, err))) {
        memset(m, 0, sizeof *m);
        return rc;
    }
    m->grace_s = (double)ms / 1000;
    return RK_OK;
}

#define PROGRESS_MAX ((int64_t)1 << 62)

int rk_node_progress_format(const rk_node_progress *m, char *out, size_t cap, size_t *len,
                            rk_err *err)
{
    *len = 0;
    if (m->steps < 0 || m->steps > PROGRESS_MAX)
        return rk_err_set(err, RK_EINVAL, "progress: steps out of range");
    if (!rk_node_put(out, cap, len, "steps=%" PRId64 "\n", m->steps))
        return rk_err_set(err, RK_EINVAL, "progress: the buffer is too small");
    return RK_OK;
}

int rk_node_progress_parse(const void *payload, size_t len, rk_node_progress *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    rk_node_kv kv;
    int rc;
    if ((rc = parse_kv(&kv, "progress", payload, len, err)) ||
        (rc = rk_node_kv_int(&kv, "progress", "steps", 0, PROGRESS_MAX, &m->steps, err))) {
        memset(m, 0, sizeof *m);
        return rc;
    }
    return RK_OK;
}

int rk_node_snap_mem_format(const rk_node_snap_mem *m, char *out, size_t cap, size_t *len,
                            rk_err *err)
{
    *len = 0;
    if (m->own < 0 || m->own > RK_NODE_SNAP_MEM_MAX || m->held < 0 ||
        m->held > RK_NODE_SNAP_MEM_MAX)
        return rk_err_set(err, RK_EINVAL, "snap_mem: bytes out of range");
    if (!rk_node_put(out, cap, len, "own=%" PRId64 "\nheld=%" PRId64 "\n", m->own, m->held))
        return rk_err_set(err, RK_EINVAL, "snap_mem: the buffer is too small");
    return RK_OK;
}

int rk_node_snap_mem_parse(const void *payload, size_t len, rk_node_snap_mem *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    rk_node_kv kv;
    int rc;
    if ((rc = parse_kv(&kv, "snap_mem", payload, len, err)) ||
        (rc = rk_node_kv_int(&kv, "snap_mem", "own", 0, RK_NODE_SNAP_MEM_MAX, &m->own, err)) ||
        (rc = rk_node_kv_int(&kv, "snap_mem", "held", 0, RK_NODE_SNAP_MEM_MAX, &m->held, err))) {
        memset(m, 0, sizeof *m);
        return rc;
    }
    return RK_OK;
}

/* ---- DATA and CLOSE ---------------------------------------------------------------------- */

int rk_node_data_format(uint32_t chan, const void *bytes, size_t n, uint8_t *out, size_t cap,
                        size_t *len, rk_err *err)
{
    *len = 0;
    if (chan < 1 || n > RK_NODE_DATA_MAX || cap < 4 + n)
        return rk_err_set(err, RK_EINVAL, "data: channel, length or buffer out of range");
    out[0] = (uint8_t)(chan >> 24);
    out[1] = (uint8_t)(chan >> 16);
    out[2] = (uint8_t)(chan >> 8);
    out[3] = (uint8_t)chan;
    if (n)
        memcpy(out + 4, bytes, n);
    *len = 4 + n;
    return RK_OK;
}

int rk_node_data_parse(const void *payload, size_t len, int close, uint32_t *chan,
                       const uint8_t **bytes, size_t *n, rk_err *err)
{
    const uint8_t *p = payload;
    *chan = 0;
    *bytes = NULL;
    *n = 0;
    const char *what = close ? "close" : "data";
    if (len < 4)
        return rk_err_set(err, RK_EFORMAT, "%s: %zu bytes, no channel number", what, len);
    uint32_t c = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    if (c < 1)
        return rk_err_set(err, RK_EFORMAT, "%s: channel 0", what);
    if (close ? len != 4 : (len == 4 || len > 4 + RK_NODE_DATA_MAX))
        return rk_err_set(err, RK_EFORMAT, "%s: %zu bytes after the channel number", what, len - 4);
    *chan = c;
    *bytes = p + 4;
    *n = len - 4;
    return RK_OK;
}

/* ---- SNAP_BEGIN, SNAP_DATA, SNAP_END (partner copies) -------------------------------------- */

int rk_node_snap_format(const rk_node_snap *m, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    if (m->xfer < 1 || m->kind > RK_NODE_SNAP_FETCH || m->node >= RK_NODES_MAX || m->step < 0 ||
        m->bytes < 1 || m->bytes > RK_NODE_SNAP_BYTES_MAX)
        return rk_err_set(err, RK_EINVAL, "snap: a field out of range");
    if (!rk_node_put(out, cap, len,
                     "xfer=%u\nkind=%s\nnode=%u\nrank=%u\nstep=%" PRId64 "\nbytes=%" PRIu64 "\n",
                     (unsigned)m->xfer, m->kind == RK_NODE_SNAP_FETCH ? "fetch" : "push",
                     (unsigned)m->node, (unsigned)m->rank, m->step, m->bytes))
        return rk_err_set(err, RK_EINVAL, "snap: the buffer is too small");
    return RK_OK;
}

static int snap_parse(const void *payload, size_t len, rk_node_snap *m, rk_err *err)
{
    rk_node_kv kv;
    int64_t v;
    int rc;
    if ((rc = parse_kv(&kv, "snap", payload, len, err)) ||
        (rc = get_u32(&kv, "snap", "xfer", 1, &m->xfer, err)) ||
        (rc = get_u32(&kv, "snap", "rank", 0, &m->rank, err)))
        return rc;
    size_t kn;
    const char *k = rk_node_kv_get(&kv, "kind", &kn);
    if (k && kn == 4 && memcmp(k, "push", 4) == 0)
        m->kind = RK_NODE_SNAP_PUSH;
    else if (k && kn == 5 && memcmp(k, "fetch", 5) == 0)
        m->kind = RK_NODE_SNAP_FETCH;
    else
        return rk_err_set(err, RK_EFORMAT, "snap: kind is not push or fetch");
    if ((rc = rk_node_kv_int(&kv, "snap", "node", 0, RK_NODES_MAX - 1, &v, err)))
        return rc;
    m->node = (uint32_t)v;
    if ((rc = rk_node_kv_int(&kv, "snap", "step", 0, INT64_MAX, &m->step, err)) ||
        (rc = rk_node_kv_int(&kv, "snap", "bytes", 1, (int64_t)RK_NODE_SNAP_BYTES_MAX, &v, err)))
        return rc;
    m->bytes = (uint64_t)v;
    return RK_OK;
}

int rk_node_snap_parse(const void *payload, size_t len, rk_node_snap *m, rk_err *err)
{
    memset(m, 0, sizeof *m);
    int rc = snap_parse(payload, len, m, err);
    if (rc)
        memset(m, 0, sizeof *m);
    return rc;
}

void rk_node_snap_data_header(uint32_t xfer, uint64_t off, uint8_t out[RK_NODE_SNAP_DATA_HDR])
{
    for (int i = 0; i < 4; i++)
        out[i] = (uint8_t)(xfer >> (24 - 8 * i));
    for (int i = 0; i < 8; i++)
        out[4 + i] = (uint8_t)(off >> (56 - 8 * i));
}

int rk_node_snap_data_parse(const void *payload, size_t len, uint32_t *xfer, uint64_t *off,
                            const uint8_t **bytes, size_t *n, rk_err *err)
{
    const uint8_t *p = payload;
    *xfer = 0;
    *off = 0;
    *bytes = NULL;
    *n = 0;
    if (len <= RK_NODE_SNAP_DATA_HDR || len > RK_NODE_SNAP_DATA_HDR + RK_NODE_SNAP_CHUNK)
        return rk_err_set(err, RK_EFORMAT, "snap data: %zu bytes, not a header and 1..%d bytes",
                          len, RK_NODE_SNAP_CHUNK);
    uint32_t x = 0;
    uint64_t o = 0;
    for (int i = 0; i < 4; i++)
        x = x << 8 | p[i];
    for (int i = 0; i < 8; i++)
        o = o << 8 | p[4 + i];
    if (x < 1)
        return rk_err_set(err, RK_EFORMAT, "snap data: transfer 0");
    if (o > RK_NODE_SNAP_BYTES_MAX || len - RK_NODE_SNAP_DATA_HDR > RK_NODE_SNAP_BYTES_MAX - o)
        return rk_err_set(err, RK_EFORMAT, "snap data: past the largest generation");
    *xfer = x;
    *off = o;
    *bytes = p + RK_NODE_SNAP_DATA_HDR;
    *n = len - RK_NODE_SNAP_DATA_HDR;
    return RK_OK;
}
