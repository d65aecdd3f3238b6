/*
 * libFuzzer target for the node link's payload parsers (supervisor/nodes.h): the input goes
 * whole to the key=value splitter and to the HELLO, WELCOME and reason parsers. A rejection
 * must be RK_EFORMAT with a one-line message and a zeroed result; an accepted message must
 * meet every documented bound and format to a payload that parses back to the same message.
 * The first byte, when the input starts with '#', picks the text form parsers instead (job
 * id, HOST:PORT, boot id) on the rest, as a NUL-terminated string.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "supervisor/nodes.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void check_line(const rk_err *err)
{
    for (const char *p = err->msg; *p; p++)
        check((unsigned char)*p >= 0x20 && *p != 0x7f);
}

static bool zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static void text_forms(const uint8_t *data, size_t size)
{
    char s[300];
    if (size >= sizeof s)
        size = sizeof s - 1;
    memcpy(s, data, size);
    s[size] = 0;
    rk_err err = {0};
    uint8_t job[RK_NET_JOB_ID_LEN];
    if (rk_node_job_parse(s, job, &err))
        check_line(&err);
    char host[RK_NODE_HOST_MAX];
    uint16_t port;
    if (rk_node_hostport_parse(s, host, sizeof host, &port, &err) == RK_OK)
        check(strlen(host) > 0 && strlen(host) < strlen(s));
    else
        check_line(&err);
    if (rk_node_boot_id_ok(s, strlen(s)))
        check(strlen(s) == RK_NODE_BOOT_ID_LEN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 0 && data[0] == '#') {
        text_forms(data + 1, size - 1);
        return 0;
    }
    rk_err err = {0};
    rk_node_kv kv;
    if (rk_node_kv_parse(&kv, data, size, &err) == RK_OK) {
        check(kv.n <= RK_NODE_LINES_MAX && size <= RK_NODE_PAYLOAD_MAX);
        for (size_t i = 0; i < kv.n; i++)
            check(kv.line[i].key_len >= 1 && kv.line[i].key_len <= RK_NODE_KEY_MAX &&
                  kv.line[i].val_len <= RK_NODE_VALUE_MAX);
    } else {
        check(err.code == RK_EFORMAT);
        check_line(&err);
    }

    char out[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_node_hello h, h2;
    if (rk_node_hello_parse(data, size, &h, &err) == RK_OK) {
        check(h.node < RK_NODES_MAX && h.pid >= 1 && h.host[0]);
        check(rk_node_boot_id_ok(h.boot_id, strlen(h.boot_id)));
        check(rk_node_hello_format(&h, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_hello_parse(out, len, &h2, &err) == RK_OK);
        check(memcmp(&h, &h2, sizeof h) == 0);
    } else {
        check(err.code == RK_EFORMAT && zero(&h, sizeof h));
        check_line(&err);
    }
    rk_node_welcome w, w2;
    if (rk_node_welcome_parse(data, size, &w, &err) == RK_OK) {
        check(w.generation >= 1 && w.timeout_s > 0);
        check(rk_node_welcome_format(&w, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_welcome_parse(out, len, &w2, &err) == RK_OK);
        check(w.node == w2.node && w.generation == w2.generation && w.timeout_s == w2.timeout_s);
    } else {
        check(err.code == RK_EFORMAT);
        check_line(&err);
    }
    rk_node_reason r, r2;
    if (rk_node_reason_parse(data, size, &r, &err) == RK_OK) {
        check(r.reason[0] && strlen(r.reason) <= RK_NODE_VALUE_MAX);
        check(rk_node_reason_format(&r, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_reason_parse(out, len, &r2, &err) == RK_OK);
        check(strcmp(r.reason, r2.reason) == 0);
    } else {
        check(err.code == RK_EFORMAT);
        check_line(&err);
    }
    return 0;
}
