/*
 * The node link's message payloads (cluster/nodes.h, docs/cluster-protocol.md): key=value
 * lines with fixed bounds, one rule per field shared by the formatter and the parser, and the
 * small text forms the agent and the coordinator take on their command lines (job id,
 * HOST:PORT, boot id). Nothing allocates; base/text.h checks the UTF-8.
 */
#include "cluster/nodes.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/msg.h"
#include "base/text.h"
#include "net/peer.h"

const char *rk_node_msg_name(uint8_t type)
{
    static const char *const names[] = {
        NULL,       "HELLO",     "WELCOME",    "PING",      "PONG",     "BYE",        "REFUSED",
        "LAUNCH",   "LAUNCHED",  "OPEN",       "DATA",      "CLOSE",    "EXITED",     "KILL",
        "HEALTH",   "STACKS",    "STACK",      "STACK_END", "PROGRESS", "SNAP_BEGIN", "SNAP_DATA",
        "SNAP_END", "SNAP_HELD", "SNAP_FETCH", "SNAP_MEM"};
    static char other[16];
    if (type >= 1 && type <= RK_NODE_MSG_LAST)
        return names[type];
    snprintf(other, sizeof other, "type %u", (unsigned)type);
    return other;
}

/* ---- key=value lines --------------------------------------------------------------------- */

static bool key_ok(const char *s, size_t len)
{
    if (len == 0 || len > RK_NODE_KEY_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || s[i] == '_'))
            return false;
    return true;
}

int rk_node_kv_parse(rk_node_kv *kv, const void *payload, size_t len, rk_err *err)
{
    memset(kv, 0, sizeof *kv);
    if (len > RK_NODE_PAYLOAD_MAX)
        return rk_err_set(err, RK_EFORMAT, "payload of %zu bytes, at most %d", len,
                          RK_NODE_PAYLOAD_MAX);
    const char *p = payload, *end = p + len;
    size_t lineno = 0;
    while (p < end) {
        lineno++;
        if (kv->n == RK_NODE_LINES_MAX)
            return rk_err_set(err, RK_EFORMAT, "more than %d lines", RK_NODE_LINES_MAX);
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            return rk_err_set(err, RK_EFORMAT, "line %zu does not end with a newline", lineno);
        const char *eq = memchr(p, '=', (size_t)(nl - p));
        if (!eq)
            return rk_err_set(err, RK_EFORMAT, "line %zu: no '='", lineno);
        size_t klen = (size_t)(eq - p), vlen = (size_t)(nl - eq - 1);
        if (!key_ok(p, klen))
            return rk_err_set(err, RK_EFORMAT, "line %zu: a key is 1 to %d of [a-z_]", lineno,
                              RK_NODE_KEY_MAX);
        if (vlen > RK_NODE_VALUE_MAX)
            return rk_err_set(err, RK_EFORMAT, "line %zu: value of %zu bytes, at most %d", lineno,
                              vlen, RK_NODE_VALUE_MAX);
        if (!rk_text_ok(eq + 1, vlen))
            return rk_err_set(err, RK_EFORMAT,
                              "line %zu: the value is not UTF-8 without control characters",
                              lineno);
        for (size_t i = 0; i < kv->n; i++)
            if (kv->line[i].key_len == klen && memcmp(kv->line[i].key, p, klen) == 0)
                return rk_err_set(err, RK_EFORMAT, "line %zu: key %.*s twice", lineno, (int)klen,
                                  p);
        kv->line[kv->n].key = p;
        kv->line[kv->n].key_len = klen;
        kv->line[kv->n].val = eq + 1;
        kv->line[kv->n].val_len = vlen;
        kv->n++;
        p = nl + 1;
    }
    return RK_OK;
}

const char *rk_node_kv_get(const rk_node_kv *kv, const char *key, size_t *vlen)
{
    size_t klen = strlen(key);
    for (size_t i = 0; i < kv->n; i++)
        if (kv->line[i].key_len == klen && memcmp(kv->line[i].key, key, klen) == 0) {
            *vlen = kv->line[i].val_len;
            return kv->line[i].val;
        }
    return NULL;
}

/* A whole number of decimal digits (no sign, no leading zero) in [lo, hi]. */
static bool digits(const char *s, size_t len, int64_t lo, int64_t hi, int64_t *out)
{
    if (len == 0 || len > 19 || (len > 1 && s[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX || (int64_t)v < lo || (int64_t)v > hi)
        return false;
    *out = (int64_t)v;
    return true;
}

int rk_node_kv_int(const rk_node_kv *kv, const char *what, const char *key, int64_t lo, int64_t hi,
                   int64_t *out, rk_err *err)
{
    size_t n;
    const char *v = rk_node_kv_get(kv, key, &n);
    if (!v)
        return rk_err_set(err, RK_EFORMAT, "%s: no %s", what, key);
    if (!digits(v, n, lo, hi, out))
        return rk_err_set(err, RK_EFORMAT, "%s: %s is not a whole number in %" PRId64 "..%" PRId64,
                          what, key, lo, hi);
    return RK_OK;
}

/* ---- the payloads ------------------------------------------------------------------------ */

bool rk_node_boot_id_ok(const char *s, size_t len)
{
    if (len != RK_NODE_BOOT_ID_LEN)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return false;
        } else if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
            return false;
        }
    }
    return true;
}

static bool host_ok(const char *s, size_t len)
{
    return len > 0 && len < RK_NODE_HOST_MAX && len <= RK_NODE_VALUE_MAX && rk_text_ok(s, len);
}

bool rk_node_put(char *out, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len)
        return false;
    *len += (size_t)n;
    return true;
}

bool rk_node_snap_ok(const char *s, size_t len)
{
    if (len < 2 || len > RK_NODE_VALUE_MAX || s[0] != '/' || !rk_text_ok(s, len))
        return false;
    return !memchr(s, ',', len) && !memchr(s, '=', len);
}

static int too_small(rk_err *err, const char *what)
{
    return rk_err_set(err, RK_EINVAL, "%s: the buffer is too small", what);
}

int rk_node_hello_format(const rk_node_hello *h, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    size_t hl = strnlen(h->host, RK_NODE_HOST_MAX);
    if (!host_ok(h->host, hl))
        return rk_err_set(err, RK_EINVAL, "hello: the host name is empty, too long or not text");
    if (!rk_node_boot_id_ok(h->boot_id, strnlen(h->boot_id, sizeof h->boot_id)))
        return rk_err_set(err, RK_EINVAL, "hello: the boot id is not a UUID");
    if (h->node >= RK_NODES_MAX || h->pid < 1 || h->pid > INT32_MAX)
        return rk_err_set(err, RK_EINVAL, "hello: node or pid out of range");
    size_t sl = strnlen(h->snap, sizeof h->snap);
    if (sl && !rk_node_snap_ok(h->snap, sl))
        return rk_err_set(err, RK_EINVAL,
                          "hello: the snapshot directory is not an absolute path "
                          "of text without ',' or '='");
    if (!rk_node_put(out, cap, len, "node=%u\nhost=%s\npid=%" PRId64 "\nboot_id=%s\n",
                     (unsigned)h->node, h->host, h->pid, h->boot_id) ||
        (sl && !rk_node_put(out, cap, len, "snap=%s\n", h->snap)))
        return too_small(err, "hello");
    return RK_OK;
}

static int hello_parse(const void *payload, size_t len, rk_node_hello *h, rk_err *err);

int rk_node_hello_parse(const void *payload, size_t len, rk_node_hello *h, rk_err *err)
{
    int rc = hello_parse(payload, len, h, err);
    if (rc)
        memset(h, 0, sizeof *h); /* nothing half-parsed is handed out */
    return rc;
}

static int hello_parse(const void *payload, size_t len, rk_node_hello *h, rk_err *err)
{
    memset(h, 0, sizeof *h);
    rk_node_kv kv;
    rk_err e = {0};
    if (rk_node_kv_parse(&kv, payload, len, &e))
        return rk_err_set(err, RK_EFORMAT, "hello: %s", e.msg);
    int64_t v;
    int rc;
    if ((rc = rk_node_kv_int(&kv, "hello", "node", 0, RK_NODES_MAX - 1, &v, err)))
        return rc;
    h->node = (uint32_t)v;
    if ((rc = rk_node_kv_int(&kv, "hello", "pid", 1, INT32_MAX, &h->pid, err)))
        return rc;
    size_t n;
    const char *s = rk_node_kv_get(&kv, "host", &n);
    if (!s || !host_ok(s, n))
        return rk_err_set(err, RK_EFORMAT, "hello: %s", s ? "host is empty" : "no host");
    memcpy(h->host, s, n);
    s = rk_node_kv_get(&kv, "boot_id", &n);
    if (!s || !rk_node_boot_id_ok(s, n))
        return rk_err_set(err, RK_EFORMAT, "hello: %s",
                          s ? "boot_id is not a UUID (8-4-4-4-12 lower-case hex digits)"
                            : "no boot_id");
    memcpy(h->boot_id, s, n);
    s = rk_node_kv_get(&kv, "snap", &n);
    if (s && !rk_node_snap_ok(s, n))
        return rk_err_set(err, RK_EFORMAT,
                          "hello: snap is not an absolute path without ',' or '='");
    if (s)
        memcpy(h->snap, s, n);
    return RK_OK;
}

int rk_node_welcome_format(const rk_node_welcome *w, char *out, size_t cap, size_t *len,
                           rk_err *err)
{
    *len = 0;
    if (w->node >= RK_NODES_MAX || w->generation < 1 || !(w->timeout_s >= 0.001) ||
        w->timeout_s > 86400)
        return rk_err_set(err, RK_EINVAL, "welcome: node, generation or timeout out of range");
    /* the timeout in whole milliseconds: no locale, no float syntax to parse */
    int64_t ms = (int64_t)(w->timeout_s * 1000 + 0.5);
    if (!rk_node_put(out, cap, len, "node=%u\ngeneration=%u\ntimeout_ms=%" PRId64 "\n",
                     (unsigned)w->node, (unsigned)w->generation, ms))
        return too_small(err, "welcome");
    return RK_OK;
}

int rk_node_welcome_parse(const void *payload, size_t len, rk_node_welcome *w, rk_err *err)
{
    memset(w, 0, sizeof *w);
    rk_node_kv kv;
    rk_err e = {0};
    if (rk_node_kv_parse(&kv, payload, len, &e))
        return rk_err_set(err, RK_EFORMAT, "welcome: %s", e.msg);
    int64_t node, gen, ms;
    int rc;
    if ((rc = rk_node_kv_int(&kv, "welcome", "node", 0, RK_NODES_MAX - 1, &node, err)) ||
        (rc = rk_node_kv_int(&kv, "welcome", "generation", 1, UINT32_MAX, &gen, err)) ||
        (rc = rk_node_kv_int(&kv, "welcome", "timeout_ms", 1, 86400000, &ms, err)))
        return rc;
    w->node = (uint32_t)node;
    w->generation = (uint32_t)gen;
    w->timeout_s = (double)ms / 1000;
    return RK_OK;
}

int rk_node_reason_format(const rk_node_reason *r, char *out, size_t cap, size_t *len, rk_err *err)
{
    *len = 0;
    char clean[RK_NODE_VALUE_MAX + 1];
    rk_text_clean(clean, sizeof clean, r->reason);
    if (!clean[0])
        snprintf(clean, sizeof clean, "-");
    if (!rk_node_put(out, cap, len, "reason=%s\n", clean))
        return too_small(err, "reason");
    return RK_OK;
}

int rk_node_reason_parse(const void *payload, size_t len, rk_node_reason *r, rk_err *err)
{
    memset(r, 0, sizeof *r);
    rk_node_kv kv;
    rk_err e = {0};
    if (rk_node_kv_parse(&kv, payload, len, &e))
        return rk_err_set(err, RK_EFORMAT, "reason: %s", e.msg);
    size_t n;
    const char *s = rk_node_kv_get(&kv, "reason", &n);
    if (!s || n == 0)
        return rk_err_set(err, RK_EFORMAT, "reason: %s", s ? "reason is empty" : "no reason");
    memcpy(r->reason, s, n); /* n <= RK_NODE_VALUE_MAX < sizeof r->reason */
    return RK_OK;
}

int rk_node_send_reason(struct rk_net_peer *p, const rk_net_secret *key, int fd, uint8_t type,
                        const char *reason, const char *to, rk_err *err)
{
    rk_node_reason r;
    snprintf(r.reason, sizeof r.reason, "%s", reason);
    char payload[RK_NODE_PAYLOAD_MAX];
    size_t len;
    int rc = rk_node_reason_format(&r, payload, sizeof payload, &len, err);
    return rc ? rc : rk_net_peer_send(p, key, fd, type, payload, len, to, err);
}

/* ---- command-line forms ------------------------------------------------------------------ */

int rk_node_boot_id_read(const char *path, char out[RK_NODE_BOOT_ID_LEN + 1], rk_err *err)
{
    if (!path)
        path = "/proc/sys/kernel/random/boot_id";
    memset(out, 0, RK_NODE_BOOT_ID_LEN + 1);
    char shown[128];
    rk_msg_show(shown, sizeof shown, path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        char e[96];
        return rk_err_set(err, rk_err_code_errno(errno), "%s: %s", shown,
                          rk_msg_strerror(errno, e, sizeof e));
    }
    char buf[65];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0)
        return rk_err_set(err, RK_EIO, "%s: cannot read it", shown);
    size_t len = (size_t)n;
    if (len > 0 && buf[len - 1] == '\n')
        len--;
    if (!rk_node_boot_id_ok(buf, len))
        return rk_err_set(err, RK_EFORMAT, "%s: not a boot id (a UUID in lower case)", shown);
    memcpy(out, buf, RK_NODE_BOOT_ID_LEN);
    return RK_OK;
}

int rk_node_job_parse(const char *text, uint8_t job[RK_NET_JOB_ID_LEN], rk_err *err)
{
    if (strlen(text) != 2 * RK_NET_JOB_ID_LEN)
        return rk_err_set(err, RK_EFORMAT, "a job id is %d hexadecimal digits",
                          2 * RK_NET_JOB_ID_LEN);
    uint8_t out[RK_NET_JOB_ID_LEN];
    if (rk_hex_decode(text, RK_NET_JOB_ID_LEN, out) >= 0)
        return rk_err_set(err, RK_EFORMAT, "a job id is %d hexadecimal digits",
                          2 * RK_NET_JOB_ID_LEN);
    memcpy(job, out, RK_NET_JOB_ID_LEN);
    return RK_OK;
}

int rk_node_hostport_parse(const char *s, char *host, size_t cap, uint16_t *port, rk_err *err)
{
    char shown[96];
    rk_msg_show(shown, sizeof shown, s);
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return rk_err_set(err, RK_EINVAL, "'%s' is not HOST:PORT", shown);
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (s[0] == '[') {
        if (hl < 3 || s[hl - 1] != ']')
            return rk_err_set(err, RK_EINVAL, "'%s' is not [IPV6]:PORT", shown);
        h = s + 1;
        hl -= 2;
    } else if (memchr(s, ':', hl)) {
        return rk_err_set(err, RK_EINVAL, "'%s': an IPv6 address is written [ADDR]:PORT", shown);
    }
    int64_t p;
    if (!digits(colon + 1, strlen(colon + 1), 0, 65535, &p))
        return rk_err_set(err, RK_EINVAL, "'%s': the port is not a whole number in 0..65535",
                          shown);
    if (hl + 1 > cap)
        return rk_err_set(err, RK_EINVAL, "'%s': the host is too long", shown);
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = (uint16_t)p;
    return RK_OK;
}

const char *rk_node_event_name(rk_node_event_kind k)
{
    switch (k) {
    case RK_NODE_JOINED: return "joined";
    case RK_NODE_LOST: return "lost";
    case RK_NODE_REJOINED: return "rejoined";
    case RK_NODE_REBOOTED: return "rebooted";
    case RK_NODE_RECONNECT: return "reconnected";
    case RK_NODE_LEFT: return "left";
    case RK_NODE_REFUSED: return "refused";
    case RK_NODE_HUSHED: return "hushed";
    }
    return "?";
}

rk_node_event_kind rk_node_return_kind(const char *old_boot_id, const char *new_boot_id)
{
    return strcmp(old_boot_id, new_boot_id) == 0 ? RK_NODE_REJOINED : RK_NODE_REBOOTED;
}
