/*
 * libFuzzer target for the node link's payload parsers (cluster/nodes.h): the input goes
 * whole to the key=value splitter and to the HELLO, WELCOME, reason, LAUNCH, LAUNCHED, OPEN,
 * EXITED, KILL, DATA and CLOSE parsers. A rejection
 * must be RK_EFORMAT with a one-line message and a zeroed result; an accepted message must
 * meet every documented bound and format to a payload that parses back to the same message.
 * The first byte, when the input starts with '#', picks the text form parsers instead (job
 * id, HOST:PORT, boot id) on the rest, as a NUL-terminated string.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/text.h"
#include "cluster/chan.h"
#include "cluster/nodes.h"

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
        check(!h.snap[0] || rk_node_snap_ok(h.snap, strlen(h.snap)));
        check(rk_node_hello_format(&h, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_hello_parse(out, len, &h2, &err) == RK_OK);
        check(memcmp(&h, &h2, sizeof h) == 0);
    } else {
        check(err.code == RK_EFORMAT && zero(&h, sizeof h));
        check_line(&err);
    }
    rk_node_snap sm, sm2;
    if (rk_node_snap_parse(data, size, &sm, &err) == RK_OK) {
        check(sm.xfer >= 1 && sm.kind <= RK_NODE_SNAP_FETCH && sm.node < RK_NODES_MAX &&
              sm.step >= 0 && sm.bytes >= 1);
        check(rk_node_snap_format(&sm, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_snap_parse(out, len, &sm2, &err) == RK_OK);
        check(memcmp(&sm, &sm2, sizeof sm) == 0);
    } else {
        check(err.code == RK_EFORMAT && zero(&sm, sizeof sm));
        check_line(&err);
    }
    {
        uint32_t x;
        uint64_t off;
        const uint8_t *b;
        size_t bn;
        if (rk_node_snap_data_parse(data, size, &x, &off, &b, &bn, &err) == RK_OK)
            check(x >= 1 && bn >= 1 && bn <= RK_NODE_SNAP_CHUNK && b == data + 12 &&
                  off + bn <= RK_NODE_SNAP_BYTES_MAX);
        else
            check(err.code == RK_EFORMAT && x == 0 && !b && bn == 0);
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
    rk_node_launch m, m2;
    if (rk_node_launch_parse(data, size, &m, &err) == RK_OK) {
        check(m.launch >= 1 && m.ranks >= 1 && m.base < m.world && m.ranks <= m.world - m.base);
        check(m.port <= 65535 && m.master[0] && m.devices[0] && m.watch <= 1 && m.snap_off <= 1);
        check(rk_node_launch_format(&m, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_launch_parse(out, len, &m2, &err) == RK_OK);
        check(memcmp(&m, &m2, sizeof m) == 0);
    } else {
        check(err.code == RK_EFORMAT && zero(&m, sizeof m));
        check_line(&err);
    }
    rk_node_exited x, x2;
    if (rk_node_exited_parse(data, size, &x, &err) == RK_OK) {
        check(x.launch >= 1 && x.status <= 255 && x.failed >= -1);
        check(rk_node_exited_format(&x, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_exited_parse(out, len, &x2, &err) == RK_OK);
        check(memcmp(&x, &x2, sizeof x) == 0);
    } else {
        check(err.code == RK_EFORMAT);
        check_line(&err);
    }
    rk_node_health he, he2;
    if (rk_node_health_parse(data, size, &he, &err) == RK_OK) {
        check(he.score <= 100 && he.lost <= 1 && he.sim <= 1 && he.prob_ppm >= -1 &&
              he.prob_ppm <= 1000000 && he.device < RK_NODES_MAX);
        check(rk_text_ok(he.why, strlen(he.why)));
        check(rk_node_health_format(&he, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_health_parse(out, len, &he2, &err) == RK_OK);
        check(memcmp(&he, &he2, sizeof he) == 0);
    } else {
        check(err.code == RK_EFORMAT && he.prob_ppm == -1 && !he.why[0]);
        check_line(&err);
    }
    rk_node_stacks sk, sk2;
    if (rk_node_stacks_parse(data, size, &sk, &err) == RK_OK) {
        check(sk.launch >= 1 && sk.chan >= 1 && sk.rank <= INT32_MAX);
        check(rk_node_stacks_format(&sk, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_stacks_parse(out, len, &sk2, &err) == RK_OK);
        check(memcmp(&sk, &sk2, sizeof sk) == 0);
    } else {
        check(err.code == RK_EFORMAT && zero(&sk, sizeof sk));
        check_line(&err);
    }
    rk_node_open op;
    if (rk_node_open_parse(data, size, &op, &err) == RK_OK)
        check(op.launch >= 1 && op.chan >= 1 && op.pid >= 1);
    else
        check(err.code == RK_EFORMAT && zero(&op, sizeof op));
    rk_node_kill kl;
    if (rk_node_kill_parse(data, size, &kl, &err) == RK_OK)
        check(kl.launch >= 1 && kl.grace_s >= 0 && kl.grace_s <= 3600);
    else
        check(err.code == RK_EFORMAT);
    rk_node_snap_mem mm, mm2;
    if (rk_node_snap_mem_parse(data, size, &mm, &err) == RK_OK) {
        check(mm.own >= 0 && mm.held >= 0 && mm.own <= RK_NODE_SNAP_MEM_MAX &&
              mm.held <= RK_NODE_SNAP_MEM_MAX);
        check(rk_node_snap_mem_format(&mm, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_snap_mem_parse(out, len, &mm2, &err) == RK_OK && mm2.own == mm.own &&
              mm2.held == mm.held);
    }
    rk_node_progress pg, pg2;
    if (rk_node_progress_parse(data, size, &pg, &err) == RK_OK) {
        check(pg.steps >= 0 && pg.steps <= ((int64_t)1 << 62));
        check(rk_node_progress_format(&pg, out, sizeof out, &len, &err) == RK_OK);
        check(rk_node_progress_parse(out, len, &pg2, &err) == RK_OK && pg2.steps == pg.steps);
    } else {
        check(err.code == RK_EFORMAT && pg.steps == 0);
        check_line(&err);
    }
    rk_node_launched ld;
    if (rk_node_launched_parse(data, size, &ld, &err) == RK_OK)
        check(ld.launch >= 1 && ld.port <= 65535);
    else
        check(err.code == RK_EFORMAT);
    for (int close = 0; close < 2; close++) {
        uint32_t chan;
        const uint8_t *bytes;
        size_t n;
        if (rk_node_data_parse(data, size, close, &chan, &bytes, &n, &err) == RK_OK)
            check(chan >= 1 && n == size - 4 && (close ? n == 0 : n >= 1 && n <= RK_NODE_DATA_MAX));
        else
            check(err.code == RK_EFORMAT);
    }
    /* the channels' messages as both ends take them (chan.h): an end has no bytes */
    const uint8_t chan_types[] = {RK_NODE_MSG_DATA, RK_NODE_MSG_CLOSE, RK_NODE_MSG_STACK,
                                  RK_NODE_MSG_STACK_END};
    for (size_t i = 0; i < sizeof chan_types; i++) {
        uint32_t chan;
        const uint8_t *bytes;
        size_t n;
        int end = rk_node_chan_take(chan_types[i], data, size, &chan, &bytes, &n, &err);
        if (end >= 0)
            check(chan >= 1 && (end == (i % 2 == 1)) && (end ? n == 0 : n >= 1));
        else
            check(err.code == RK_EFORMAT);
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
