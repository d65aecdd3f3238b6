/*
 * Tests for the node link's messages and the coordinator's table (src/cluster/nodemsg.c,
 * nodes.c): key=value payloads and their bounds, HELLO / WELCOME / reason round trips and
 * broken inputs, boot ids, job ids and HOST:PORT; then the table over 127.0.0.1 driven by a
 * hand-made agent: a HELLO is welcomed (node joined), a PING answered, silence is a loss after
 * the timeout, a replayed HELLO on a new connection, a wrong secret and an earlier launch are
 * each refused with one event and change nothing, an unknown node gets REFUSED, and a node
 * that comes back with its next sequence number rejoins (same boot id) or reboots (another).
 * HEALTH and STACKS (jobmsg.c): round trips and bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "cluster/chan.h"
#include "cluster/nodes.h"
#include "net/peer.h"
#include "net/sock.h"
#include "net/stream.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_nodes")

static const char BOOT_A[] = "0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab";
static const char BOOT_B[] = "11111111-2222-4333-8444-555555555555";

/* ---- payloads ---------------------------------------------------------------------------- */

static int kv(const char *s)
{
    rk_node_kv k;
    rk_err e = {0};
    return rk_node_kv_parse(&k, s, strlen(s), &e);
}

static void test_kv_rules(void **state)
{
    (void)state;
    rk_node_kv k;
    rk_err e = {0};
    const char *good = "a=1\nb_c=two words\nempty=\n";
    assert_int_equal(rk_node_kv_parse(&k, good, strlen(good), &e), RK_OK);
    assert_int_equal(k.n, 3);
    assert_int_equal(k.line[2].val_len, 0);
    assert_int_equal(kv(""), RK_OK);
    assert_int_equal(kv("a=1"), RK_EFORMAT);                   /* no final newline */
    assert_int_equal(kv("a1\n"), RK_EFORMAT);                  /* no '=' */
    assert_int_equal(kv("A=1\n"), RK_EFORMAT);                 /* key case */
    assert_int_equal(kv("=1\n"), RK_EFORMAT);                  /* empty key */
    assert_int_equal(kv("a=1\na=2\n"), RK_EFORMAT);            /* twice */
    assert_int_equal(kv("a=x\ty\n"), RK_EFORMAT);              /* a control character */
    assert_int_equal(kv("a=\xc3\n"), RK_EFORMAT);              /* not UTF-8 */
    assert_int_equal(kv("abcdefghijklmnopq=1\n"), RK_EFORMAT); /* a 17-byte key */
    char big[400];
    memset(big, 'x', sizeof big);
    memcpy(big, "a=", 2);
    big[258] = '\n';
    assert_int_equal(rk_node_kv_parse(&k, big, 259, &e), RK_EFORMAT); /* a 256-byte value */
    assert_non_null(strstr(e.msg, "at most 255"));
    big[257] = '\n';
    assert_int_equal(rk_node_kv_parse(&k, big, 258, &e), RK_OK); /* 255 is fine */
    char many[17 * 4 + 1] = "";
    for (int i = 0; i < 17; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%c=\n", 'a' + i);
    assert_int_equal(kv(many), RK_EFORMAT);
    char huge[RK_NODE_PAYLOAD_MAX + 1];
    memset(huge, '\n', sizeof huge);
    assert_int_equal(rk_node_kv_parse(&k, huge, sizeof huge, &e), RK_EFORMAT);
}

static rk_node_hello hello_of(uint32_t node, const char *boot)
{
    rk_node_hello h = {.node = node, .pid = 4242};
    snprintf(h.host, sizeof h.host, "gpu-%u.cluster", (unsigned)node);
    snprintf(h.boot_id, sizeof h.boot_id, "%s", boot);
    return h;
}

static void test_hello_round_trip_and_refusals(void **state)
{
    (void)state;
    rk_node_hello h = hello_of(3, BOOT_A), back;
    char buf[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    assert_int_equal(rk_node_hello_format(&h, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_hello_parse(buf, len, &back, &e), RK_OK);
    assert_memory_equal(&h, &back, sizeof h);
    /* unknown keys are ignored */
    char more[RK_NODE_PAYLOAD_MAX];
    snprintf(more, sizeof more, "%.*sgpus=4\n", (int)len, buf);
    assert_int_equal(rk_node_hello_parse(more, strlen(more), &back, &e), RK_OK);
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"host=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\n", "no node"},
        {"node=01\nhost=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\n", "node"},
        {"node=1024\nhost=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\n", "node"},
        {"node=-1\nhost=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\n", "node"},
        {"node=1\nhost=h\npid=0\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\n", "pid"},
        {"node=1\nhost=\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\n", "host"},
        {"node=1\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\n", "no host"},
        {"node=1\nhost=h\npid=1\nboot_id=0F5C1D2E-3A4B-4C5D-8E9F-0123456789AB\n", "UUID"},
        {"node=1\nhost=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789a\n", "UUID"},
        {"node=1\nhost=h\npid=1\n", "no boot_id"},
        {"node=1\nhost=h\npid=1\nboot_id=x\nnode=2\n", "twice"},
        /* the snapshot directory: absolute, no ',' or '=' (RK_SNAP_DIRS lists them) */
        {"node=1\nhost=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\nsnap=dev/shm/x\n",
         "snap"},
        {"node=1\nhost=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\nsnap=/a,b\n",
         "snap"},
        {"node=1\nhost=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\nsnap=/a=b\n",
         "snap"},
        {"node=1\nhost=h\npid=1\nboot_id=0f5c1d2e-3a4b-4c5d-8e9f-0123456789ab\nsnap=/\n", "snap"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rk_err be = {0};
        assert_int_equal(rk_node_hello_parse(bad[i].text, strlen(bad[i].text), &back, &be),
                         RK_EFORMAT);
        if (!strstr(be.msg, bad[i].msg))
            fail_msg("case %zu: '%s' does not say '%s'", i, be.msg, bad[i].msg);
        assert_int_equal(back.node, 0);
        assert_int_equal(back.host[0], 0);
    }
    /* the formatter refuses what the parser would */
    rk_node_hello nl = h;
    snprintf(nl.host, sizeof nl.host, "a\nnode=9");
    assert_int_equal(rk_node_hello_format(&nl, buf, sizeof buf, &len, &e), RK_EINVAL);
    rk_node_hello nb = h;
    nb.boot_id[0] = 'X';
    assert_int_equal(rk_node_hello_format(&nb, buf, sizeof buf, &len, &e), RK_EINVAL);
    assert_int_equal(rk_node_hello_format(&h, buf, 20, &len, &e), RK_EINVAL);
    /* a node's snapshot directory goes and comes back; a HELLO without one has none */
    assert_null(strstr(buf, "snap="));
    rk_node_hello hs = h;
    snprintf(hs.snap, sizeof hs.snap, "/dev/shm/rk-snap-AbC123");
    assert_int_equal(rk_node_hello_format(&hs, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_hello_parse(buf, len, &back, &e), RK_OK);
    assert_string_equal(back.snap, "/dev/shm/rk-snap-AbC123");
    snprintf(hs.snap, sizeof hs.snap, "/dev/shm/a,b");
    assert_int_equal(rk_node_hello_format(&hs, buf, sizeof buf, &len, &e), RK_EINVAL);
}

static void test_welcome_and_reason(void **state)
{
    (void)state;
    rk_node_welcome w = {.node = 2, .generation = 7, .timeout_s = 2.5}, wb;
    char buf[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    assert_int_equal(rk_node_welcome_format(&w, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_welcome_parse(buf, len, &wb, &e), RK_OK);
    assert_int_equal(wb.node, 2);
    assert_int_equal(wb.generation, 7);
    assert_true(wb.timeout_s == 2.5);
    const char *g0 = "node=1\ngeneration=0\ntimeout_ms=10\n";
    assert_int_equal(rk_node_welcome_parse(g0, strlen(g0), &wb, &e), RK_EFORMAT);
    assert_non_null(strstr(e.msg, "generation"));
    const char *t0 = "node=1\ngeneration=1\ntimeout_ms=0\n";
    assert_int_equal(rk_node_welcome_parse(t0, strlen(t0), &wb, &e), RK_EFORMAT);

    rk_node_reason r, rb;
    snprintf(r.reason, sizeof r.reason, "line one\nline two");
    assert_int_equal(rk_node_reason_format(&r, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_reason_parse(buf, len, &rb, &e), RK_OK);
    assert_string_equal(rb.reason, "line one?line two"); /* one line, cleaned */
    assert_int_equal(rk_node_reason_parse("reason=\n", 8, &rb, &e), RK_EFORMAT);
    assert_int_equal(rk_node_reason_parse("why=x\n", 6, &rb, &e), RK_EFORMAT);
}

/* The launch messages (jobmsg.c): round trips and the refusals that name the field. */
static void test_launch_messages(void **state)
{
    (void)state;
    char buf[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    rk_node_launch m = {.launch = 3, .world = 6, .base = 2, .ranks = 2, .port = 0}, mb;
    snprintf(m.master, sizeof m.master, "h1");
    snprintf(m.devices, sizeof m.devices, "0,1");
    snprintf(m.done, sizeof m.done, "0,2");
    assert_int_equal(rk_node_launch_format(&m, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_launch_parse(buf, len, &mb, &e), RK_OK);
    assert_memory_equal(&m, &mb, sizeof m);
    assert_int_equal(mb.snap_off, 0); /* absent: snapshots stay */
    m.snap_off = 1;                   /* snapshots off for the job: the agent removes its own */
    assert_int_equal(rk_node_launch_format(&m, buf, sizeof buf, &len, &e), RK_OK);
    assert_non_null(strstr(buf, "snap_off=1\n"));
    assert_int_equal(rk_node_launch_parse(buf, len, &mb, &e), RK_OK);
    assert_memory_equal(&m, &mb, sizeof m);
    m.snap_off = 0;
    static const struct {
        const char *text, *word;
    } bad[] = {
        {"launch=1\nworld=4\nbase=3\nranks=2\nmaster=h\nport=0\ndevices=0\n", "not in a world"},
        {"launch=1\nworld=4\nbase=0\nranks=2\nmaster=h\nport=70000\ndevices=0\n", "port"},
        {"launch=1\nworld=4\nbase=0\nranks=2\nmaster=h\nport=1\ndevices=0,,1\n", "devices"},
        {"launch=1\nworld=4\nbase=0\nranks=2\nport=1\ndevices=0\n", "no master"},
        {"launch=0\nworld=4\nbase=0\nranks=2\nmaster=h\nport=1\ndevices=0\n", "launch"},
        {"launch=1\nworld=4\nbase=0\nranks=2\nmaster=h\nport=1\ndevices=0\ndone=a b\n", "done"},
        {"launch=1\nworld=4\nbase=0\nranks=2\nmaster=h\nport=1\ndevices=0\nsnap_off=2\n",
         "snap_off"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(rk_node_launch_parse(bad[i].text, strlen(bad[i].text), &mb, &e),
                         RK_EFORMAT);
        assert_non_null(strstr(e.msg, bad[i].word));
        assert_int_equal(mb.launch, 0); /* nothing half-parsed */
    }

    rk_node_exited x = {.launch = 2, .status = 137, .failed = 5}, xb;
    assert_int_equal(rk_node_exited_format(&x, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_exited_parse(buf, len, &xb, &e), RK_OK);
    assert_int_equal(xb.status, 137);
    assert_int_equal(xb.failed, 5);
    x.failed = -1;
    assert_int_equal(rk_node_exited_format(&x, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_exited_parse(buf, len, &xb, &e), RK_OK);
    assert_int_equal(xb.failed, -1);
    assert_int_equal(rk_node_exited_parse("launch=1\nstatus=256\n", 20, &xb, &e), RK_EFORMAT);

    rk_node_kill k = {.launch = 4, .grace_s = 1.5}, kb;
    assert_int_equal(rk_node_kill_format(&k, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_kill_parse(buf, len, &kb, &e), RK_OK);
    assert_true(kb.grace_s == 1.5 && kb.launch == 4);
    rk_node_progress pg = {.steps = 4321}, pgb;
    assert_int_equal(rk_node_progress_format(&pg, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_progress_parse(buf, len, &pgb, &e), RK_OK);
    assert_true(pgb.steps == 4321);
    assert_int_equal(rk_node_progress_parse("steps=-1\n", 9, &pgb, &e), RK_EFORMAT);
    assert_int_equal(rk_node_progress_parse("steps=4611686018427387905\n", 26, &pgb, &e),
                     RK_EFORMAT); /* 2^62 + 1 */
    assert_int_equal(rk_node_progress_parse("step=1\n", 7, &pgb, &e), RK_EFORMAT);
    pg.steps = -1;
    assert_int_equal(rk_node_progress_format(&pg, buf, sizeof buf, &len, &e), RK_EINVAL);
    rk_node_open o = {.launch = 1, .chan = 9, .pid = 1234}, ob;
    assert_int_equal(rk_node_open_format(&o, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_open_parse(buf, len, &ob, &e), RK_OK);
    assert_true(ob.chan == 9 && ob.pid == 1234);
    assert_int_equal(rk_node_open_parse("launch=1\nchan=0\npid=1\n", 22, &ob, &e), RK_EFORMAT);
    rk_node_launched l = {.launch = 1, .port = 29500}, lb;
    assert_int_equal(rk_node_launched_format(&l, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_launched_parse(buf, len, &lb, &e), RK_OK);
    assert_int_equal(lb.port, 29500);

    uint8_t fr[RK_NODE_DATA_MAX + 8];
    uint32_t chan;
    const uint8_t *bytes;
    size_t n;
    assert_int_equal(rk_node_data_format(7, "abc", 3, fr, sizeof fr, &len, &e), RK_OK);
    assert_int_equal(len, 7);
    assert_int_equal(rk_node_data_parse(fr, len, 0, &chan, &bytes, &n, &e), RK_OK);
    assert_true(chan == 7 && n == 3 && memcmp(bytes, "abc", 3) == 0);
    assert_int_equal(rk_node_data_parse(fr, len, 1, &chan, &bytes, &n, &e),
                     RK_EFORMAT); /* CLOSE has no bytes */
    assert_int_equal(rk_node_data_parse(fr, 4, 0, &chan, &bytes, &n, &e),
                     RK_EFORMAT); /* DATA has some */
    assert_int_equal(rk_node_data_parse(fr, 4, 1, &chan, &bytes, &n, &e), RK_OK);
    assert_int_equal(rk_node_data_parse(fr, 3, 1, &chan, &bytes, &n, &e), RK_EFORMAT);
    uint8_t zero4[4] = {0};
    assert_int_equal(rk_node_data_parse(zero4, 4, 1, &chan, &bytes, &n, &e), RK_EFORMAT);
    assert_int_equal(rk_node_data_format(1, fr, RK_NODE_DATA_MAX + 1, fr, sizeof fr, &len, &e),
                     RK_EINVAL);
}

/* What a channel sent (chan.h's send function). */
typedef struct sent {
    int n;
    uint8_t type[8];
    uint8_t payload[8][RK_NODE_DATA_MAX + 8];
    size_t len[8];
} sent;

static int capture(void *ctx, uint8_t type, const void *payload, size_t len)
{
    sent *s = ctx;
    if (s->n == 8)
        return -1;
    s->type[s->n] = type;
    memcpy(s->payload[s->n], payload, len);
    s->len[s->n++] = len;
    return 0;
}

/* The partner copies' messages: SNAP_BEGIN/END round trips and refusals, SNAP_DATA's header */
static void test_snap_messages(void **state)
{
    (void)state;
    char buf[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    rk_node_snap m = {.xfer = 7, .node = 2, .rank = 5, .step = 120, .bytes = 3 << 20}, mb;
    for (uint32_t kind = RK_NODE_SNAP_PUSH; kind <= RK_NODE_SNAP_FETCH; kind++) {
        m.kind = kind;
        assert_int_equal(rk_node_snap_format(&m, buf, sizeof buf, &len, &e), RK_OK);
        assert_int_equal(rk_node_snap_parse(buf, len, &mb, &e), RK_OK);
        assert_memory_equal(&m, &mb, sizeof m);
    }
    assert_non_null(strstr(buf, "kind=fetch\n"));
    static const char *const bad[] = {
        "xfer=0\nkind=push\nnode=1\nrank=0\nstep=1\nbytes=1\n",
        "xfer=1\nkind=push\nnode=1024\nrank=0\nstep=1\nbytes=1\n",
        "xfer=1\nkind=push\nnode=1\nrank=0\nstep=-1\nbytes=1\n",
        "xfer=1\nkind=push\nnode=1\nrank=0\nstep=1\nbytes=0\n",
        "xfer=1\nkind=push\nnode=1\nrank=0\nstep=1\n",
        "xfer=1\nkind=push\nnode=1\nstep=1\nbytes=1\n",
        "xfer=1\nnode=1\nrank=0\nstep=1\nbytes=1\n",
        "xfer=1\nkind=pull\nnode=1\nrank=0\nstep=1\nbytes=1\n",
        "xfer=1\nkind=push\nnode=1\nrank=0\nstep=1\nbytes=1099511627777\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(rk_node_snap_parse(bad[i], strlen(bad[i]), &mb, &e), RK_EFORMAT);
        assert_non_null(strstr(e.msg, "snap"));
        assert_int_equal(mb.xfer, 0);
    }
    m.bytes = 0;
    assert_int_equal(rk_node_snap_format(&m, buf, sizeof buf, &len, &e), RK_EINVAL);
    uint8_t d[RK_NODE_SNAP_DATA_HDR + 3];
    rk_node_snap_data_header(9, ((uint64_t)1 << 33) + 5, d);
    memcpy(d + RK_NODE_SNAP_DATA_HDR, "abc", 3);
    uint32_t x;
    uint64_t off;
    const uint8_t *bytes;
    size_t n;
    assert_int_equal(rk_node_snap_data_parse(d, sizeof d, &x, &off, &bytes, &n, &e), RK_OK);
    assert_int_equal(x, 9);
    assert_true(off == ((uint64_t)1 << 33) + 5);
    assert_int_equal(n, 3);
    assert_memory_equal(bytes, "abc", 3);
    assert_int_equal(rk_node_snap_data_parse(d, RK_NODE_SNAP_DATA_HDR, &x, &off, &bytes, &n, &e),
                     RK_EFORMAT); /* no bytes */
    rk_node_snap_data_header(0, 0, d);
    assert_int_equal(rk_node_snap_data_parse(d, sizeof d, &x, &off, &bytes, &n, &e), RK_EFORMAT);
    rk_node_snap_data_header(1, RK_NODE_SNAP_BYTES_MAX - 1, d);
    assert_int_equal(rk_node_snap_data_parse(d, sizeof d, &x, &off, &bytes, &n, &e), RK_EFORMAT);
    assert_string_equal(rk_node_msg_name(RK_NODE_MSG_SNAP_END), "SNAP_END");
    assert_string_equal(rk_node_msg_name(RK_NODE_MSG_SNAP_FETCH), "SNAP_FETCH");
    /* SNAP_MEM: a node's snapshot memory, its own and the partner copies it holds */
    rk_node_snap_mem mm = {.own = (int64_t)7 << 30, .held = 3 << 20}, mmb;
    assert_int_equal(rk_node_snap_mem_format(&mm, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_snap_mem_parse(buf, len, &mmb, &e), RK_OK);
    assert_true(mmb.own == mm.own && mmb.held == mm.held);
    static const char *const bad_mem[] = {"own=1\n",
                                          "held=1\n",
                                          "own=-1\nheld=0\n",
                                          "own=1\nheld=4611686018427387905\n",
                                          "own=1\nheld=2\nheld=3\n",
                                          "own=x\nheld=0\n"};
    for (size_t i = 0; i < sizeof bad_mem / sizeof bad_mem[0]; i++) {
        assert_int_equal(rk_node_snap_mem_parse(bad_mem[i], strlen(bad_mem[i]), &mmb, &e),
                         RK_EFORMAT);
        assert_non_null(strstr(e.msg, "snap_mem"));
        assert_true(mmb.own == 0 && mmb.held == 0);
    }
    mm.held = -1;
    assert_int_equal(rk_node_snap_mem_format(&mm, buf, sizeof buf, &len, &e), RK_EINVAL);
    assert_string_equal(rk_node_msg_name(RK_NODE_MSG_SNAP_MEM), "SNAP_MEM");
}

/* A stream as a channel (chan.c): what one end forwards, the other takes, in the same frames;
 * the stream's end is said to the caller, who sends the CLOSE. */

static void test_channel(void **state)
{
    (void)state;
    int sp[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    static sent s;
    memset(&s, 0, sizeof s);
    assert_int_equal(rk_node_chan_forward(sp[0], 9, capture, &s), 0); /* nothing waits */
    assert_int_equal(write(sp[1], "step 1\n", 7), 7);
    assert_int_equal(rk_node_chan_forward(sp[0], 9, capture, &s), 1);
    close(sp[1]);
    assert_int_equal(rk_node_chan_forward(sp[0], 9, capture, &s), -1); /* ended: nothing sent */
    assert_int_equal(s.n, 1);
    assert_int_equal(rk_node_chan_send(9, RK_NODE_MSG_CLOSE, NULL, 0, capture, &s), 0);
    close(sp[0]);
    uint32_t chan;
    const uint8_t *bytes;
    size_t n;
    rk_err e = {0};
    assert_int_equal(s.type[0], RK_NODE_MSG_DATA);
    assert_int_equal(rk_node_chan_take(s.type[0], s.payload[0], s.len[0], &chan, &bytes, &n, &e),
                     0);
    assert_true(chan == 9 && n == 7 && memcmp(bytes, "step 1\n", 7) == 0);
    assert_int_equal(s.type[1], RK_NODE_MSG_CLOSE);
    assert_int_equal(rk_node_chan_take(s.type[1], s.payload[1], s.len[1], &chan, &bytes, &n, &e),
                     1);
    assert_true(chan == 9 && n == 0);
    /* a stack dump's frames are taken the same way; an end with bytes, or another type, not */
    assert_int_equal(
        rk_node_chan_take(RK_NODE_MSG_STACK, s.payload[0], s.len[0], &chan, &bytes, &n, &e), 0);
    assert_int_equal(
        rk_node_chan_take(RK_NODE_MSG_STACK_END, s.payload[1], s.len[1], &chan, &bytes, &n, &e), 1);
    assert_int_equal(
        rk_node_chan_take(RK_NODE_MSG_CLOSE, s.payload[0], s.len[0], &chan, &bytes, &n, &e),
        RK_EFORMAT);
    assert_int_equal(
        rk_node_chan_take(RK_NODE_MSG_KILL, s.payload[0], s.len[0], &chan, &bytes, &n, &e),
        RK_EINVAL);
    /* a send that fails is said */
    s.n = 8;
    assert_int_equal(rk_node_chan_send(9, RK_NODE_MSG_DATA, "x", 1, capture, &s), -1);
    assert_int_equal(rk_node_chan_send(0, RK_NODE_MSG_DATA, "x", 1, capture, &s), -1);
}

/* HEALTH: a round trip with and without the optional fields, a reason with a control
 * character cleaned on the way out, and each bound refused with a line naming the field */
static void test_health_message(void **state)
{
    (void)state;
    char buf[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    rk_node_health h = {.device = 1, .score = 41, .lost = 0, .sim = 1, .prob_ppm = 250000}, hb;
    snprintf(h.why, sizeof h.why, "thermal_high: core at 91 C\n(idle)");
    assert_int_equal(rk_node_health_format(&h, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_health_parse(buf, len, &hb, &e), RK_OK);
    assert_int_equal(hb.device, 1);
    assert_int_equal(hb.score, 41);
    assert_int_equal(hb.sim, 1);
    assert_int_equal(hb.prob_ppm, 250000);
    assert_string_equal(hb.why, "thermal_high: core at 91 C?(idle)");
    rk_node_health bare = {.device = 0, .score = 100, .prob_ppm = -1};
    assert_int_equal(rk_node_health_format(&bare, buf, sizeof buf, &len, &e), RK_OK);
    buf[len] = 0;
    assert_null(strstr(buf, "prob_ppm"));
    assert_int_equal(rk_node_health_parse(buf, len, &hb, &e), RK_OK);
    assert_int_equal(hb.prob_ppm, -1);
    assert_string_equal(hb.why, "");
    bare.score = 101;
    assert_int_equal(rk_node_health_format(&bare, buf, sizeof buf, &len, &e), RK_EINVAL);
    const char *bad[][2] = {
        {"device=0\nscore=101\nlost=0\nsim=0\n", "score"},
        {"device=0\nscore=50\nlost=2\nsim=0\n", "lost"},
        {"device=0\nscore=50\nlost=0\n", "sim"},
        {"score=50\nlost=0\nsim=0\n", "device"},
        {"device=1024\nscore=50\nlost=0\nsim=0\n", "device"},
        {"device=0\nscore=50\nlost=0\nsim=0\nprob_ppm=1000001\n", "prob_ppm"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rk_err be = {0};
        assert_int_equal(rk_node_health_parse(bad[i][0], strlen(bad[i][0]), &hb, &be), RK_EFORMAT);
        assert_non_null(strstr(be.msg, "health: "));
        assert_non_null(strstr(be.msg, bad[i][1]));
        assert_int_equal(hb.prob_ppm, -1);
    }
    assert_string_equal(rk_node_msg_name(RK_NODE_MSG_HEALTH), "HEALTH");
}

/* STACKS: a round trip, and a channel 0, a rank past INT32_MAX or a missing field refused */
static void test_stacks_message(void **state)
{
    (void)state;
    char buf[RK_NODE_PAYLOAD_MAX];
    size_t len;
    rk_err e = {0};
    rk_node_stacks m = {.launch = 3, .chan = 7, .rank = 5}, mb;
    assert_int_equal(rk_node_stacks_format(&m, buf, sizeof buf, &len, &e), RK_OK);
    assert_int_equal(rk_node_stacks_parse(buf, len, &mb, &e), RK_OK);
    assert_memory_equal(&m, &mb, sizeof m);
    const char *bad[] = {"launch=3\nchan=0\nrank=5\n", "launch=3\nchan=7\nrank=2147483648\n",
                         "launch=3\nchan=7\n", "launch=0\nchan=7\nrank=1\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rk_err be = {0};
        assert_int_equal(rk_node_stacks_parse(bad[i], strlen(bad[i]), &mb, &be), RK_EFORMAT);
        assert_non_null(strstr(be.msg, "stacks: "));
        assert_int_equal(mb.launch, 0);
    }
    assert_string_equal(rk_node_msg_name(RK_NODE_MSG_STACK_END), "STACK_END");
}

static void test_text_forms(void **state)
{
    (void)state;
    rk_err e = {0};
    assert_true(rk_node_boot_id_ok(BOOT_A, strlen(BOOT_A)));
    assert_false(rk_node_boot_id_ok("0f5c1d2e-3a4b-4c5d-8e9f_0123456789ab", 36));
    uint8_t job[RK_NET_JOB_ID_LEN];
    assert_int_equal(rk_node_job_parse("00112233445566778899AaBbCcDdEeFf", job, &e), RK_OK);
    assert_int_equal(job[0], 0x00);
    assert_int_equal(job[15], 0xff);
    assert_int_equal(rk_node_job_parse("0011", job, &e), RK_EFORMAT);
    assert_int_equal(rk_node_job_parse("0011223344556677889900aabbccddxx", job, &e), RK_EFORMAT);
    char host[64];
    uint16_t port;
    assert_int_equal(rk_node_hostport_parse("198.18.0.3:7070", host, sizeof host, &port, &e), 0);
    assert_string_equal(host, "198.18.0.3");
    assert_int_equal(port, 7070);
    assert_int_equal(rk_node_hostport_parse("[fd00::3]:0", host, sizeof host, &port, &e), 0);
    assert_string_equal(host, "fd00::3");
    assert_int_equal(port, 0);
    static const char *const bad[] = {"host", ":80",        "h:",    "h:080",      "h:65536",
                                      "h:1x", "fd00::3:80", "[]:80", "[fd00::3:80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (rk_node_hostport_parse(bad[i], host, sizeof host, &port, &e) != RK_EINVAL)
            fail_msg("'%s' accepted", bad[i]);
    assert_int_equal(rk_node_return_kind(BOOT_A, BOOT_A), RK_NODE_REJOINED);
    assert_int_equal(rk_node_return_kind(BOOT_A, BOOT_B), RK_NODE_REBOOTED);
}

static void test_boot_id_file(void **state)
{
    (void)state;
    char path[600], id[RK_NODE_BOOT_ID_LEN + 1];
    rk_err e = {0};
    snprintf(path, sizeof path, "%s/boot_id", g_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s\n", BOOT_B);
    fclose(f);
    assert_int_equal(rk_node_boot_id_read(path, id, &e), RK_OK);
    assert_string_equal(id, BOOT_B);
    f = fopen(path, "w");
    fprintf(f, "not a boot id\n");
    fclose(f);
    assert_int_equal(rk_node_boot_id_read(path, id, &e), RK_EFORMAT);
    assert_non_null(strstr(e.msg, path));
    snprintf(path, sizeof path, "%s/none", g_dir);
    assert_int_equal(rk_node_boot_id_read(path, id, &e), RK_ENOENT);
    /* this host's, where there is one */
    if (access("/proc/sys/kernel/random/boot_id", R_OK) == 0)
        assert_int_equal(rk_node_boot_id_read(NULL, id, &e), RK_OK);
}

/* ---- the table over 127.0.0.1 ------------------------------------------------------------ */

static const uint8_t JOB[RK_NET_JOB_ID_LEN] = "job-0123456789ab";

typedef struct events {
    int n;
    rk_node_event_kind kind[32];
    int node[32];
    int count[32];
    char why[32][RK_ERR_MSG_MAX];
} events;

static void on_event(void *ctx, const rk_node_event *e)
{
    events *ev = ctx;
    if (ev->n == 32)
        return;
    ev->kind[ev->n] = e->kind;
    ev->node[ev->n] = e->node;
    ev->count[ev->n] = e->count;
    snprintf(ev->why[ev->n], sizeof ev->why[ev->n], "%s", e->why ? e->why : "");
    ev->n++;
}

static rk_net_secret key_of(uint8_t b)
{
    rk_net_secret k;
    memset(k.key, b, sizeof k.key);
    return k;
}

/* Poll the table until `ev` has `want` events or `secs` pass. */
static void poll_until(rk_nodes *t, events *ev, int want, double secs)
{
    double end = rk_mono_s() + secs;
    while (ev->n < want && rk_mono_s() < end)
        assert_int_equal(rk_nodes_poll(t, 0.02, NULL), RK_OK);
}

static int dial(rk_nodes *t)
{
    int fd;
    assert_int_equal(rk_net_connect("127.0.0.1", rk_nodes_port(t), 2, &fd, NULL), RK_OK);
    return fd;
}

/* Seal a HELLO of `node` with `p` and `key` into frame[]; its size. */
static size_t hello_frame(rk_net_peer *p, const rk_net_secret *key, uint32_t node, const char *boot,
                          uint8_t *frame)
{
    rk_node_hello h = hello_of(node, boot);
    char payload[RK_NODE_PAYLOAD_MAX];
    size_t len, n;
    assert_int_equal(rk_node_hello_format(&h, payload, sizeof payload, &len, NULL), RK_OK);
    assert_int_equal(rk_net_peer_seal(p, key, RK_NODE_MSG_HELLO, 0, payload, (uint32_t)len, frame,
                                      RK_NET_FRAME_MAX, &n, NULL),
                     RK_OK);
    return n;
}

/* The next frame the table sends on `fd` (polled while waiting): its type, or -1 (closed). */
static int read_reply(rk_nodes *t, int fd, rk_net_reader *r, const rk_net_secret *key,
                      rk_net_peer *p)
{
    double end = rk_mono_s() + 2;
    while (rk_mono_s() < end) {
        rk_nodes_poll(t, 0.01, NULL);
        int rc = rk_net_reader_fill(r, fd, NULL);
        rk_net_hdr h;
        const uint8_t *payload;
        if (rc >= 0 && (rc = rk_net_reader_next(r, key, &h, &payload, NULL)) == 1) {
            assert_int_equal(rk_net_peer_accept(p, &h, "coordinator", NULL), RK_OK);
            return h.type;
        }
        if (rc < 0)
            return -1;
    }
    fail_msg("no reply from the table");
    return -1;
}

static void test_table(void **state)
{
    (void)state;
    rk_net_secret key = key_of(0x5a), wrong = key_of(0x5b);
    events ev = {0};
    rk_nodes_opts o = {.listen_host = "127.0.0.1",
                       .nodes = 2,
                       .generation = 3,
                       .timeout_s = 0.3,
                       .on_event = on_event,
                       .ctx = &ev};
    memcpy(o.job, JOB, sizeof o.job);
    rk_nodes *t = NULL;
    assert_int_equal(rk_nodes_open(&t, &o, &key, NULL), RK_OK);
    assert_true(rk_nodes_port(t) > 0);
    static rk_net_reader r;
    static uint8_t frame[RK_NET_FRAME_MAX], first[RK_NET_FRAME_MAX];

    /* node 1 joins: WELCOME; a PING gets a PONG */
    rk_net_peer agent, from_coord;
    rk_net_peer_init(&agent, JOB, 1, RK_NET_COORDINATOR, 3, true);
    rk_net_peer_init(&from_coord, JOB, 1, RK_NET_COORDINATOR, 3, true);
    int fd = dial(t);
    size_t first_n = hello_frame(&agent, &key, 1, BOOT_A, first), n;
    assert_int_equal(rk_net_send_all(fd, first, first_n, 1, "t", NULL), RK_OK);
    rk_net_reader_init(&r, "coordinator");
    assert_int_equal(read_reply(t, fd, &r, &key, &from_coord), RK_NODE_MSG_WELCOME);
    assert_int_equal(ev.n, 1);
    assert_int_equal(ev.kind[0], RK_NODE_JOINED);
    assert_int_equal(ev.node[0], 1);
    assert_true(rk_nodes_connected(t, 1));
    assert_false(rk_nodes_connected(t, 0));
    assert_int_equal(
        rk_net_peer_seal(&agent, &key, RK_NODE_MSG_PING, 0, NULL, 0, frame, sizeof frame, &n, NULL),
        RK_OK);
    assert_int_equal(rk_net_send_all(fd, frame, n, 1, "t", NULL), RK_OK);
    assert_int_equal(read_reply(t, fd, &r, &key, &from_coord), RK_NODE_MSG_PONG);

    /* the HELLO replayed on a new connection: refused, node 1 still connected */
    int fd2 = dial(t);
    assert_int_equal(rk_net_send_all(fd2, first, first_n, 1, "t", NULL), RK_OK);
    poll_until(t, &ev, 2, 2);
    assert_int_equal(ev.kind[1], RK_NODE_REFUSED);
    assert_non_null(strstr(ev.why[1], "replayed frame seq 1"));
    assert_true(rk_nodes_connected(t, 1));
    close(fd2);

    /* a wrong secret: refused, one event */
    rk_net_peer stranger;
    rk_net_peer_init(&stranger, JOB, 0, RK_NET_COORDINATOR, 3, true);
    fd2 = dial(t);
    n = hello_frame(&stranger, &wrong, 0, BOOT_A, frame);
    assert_int_equal(rk_net_send_all(fd2, frame, n, 1, "t", NULL), RK_OK);
    poll_until(t, &ev, 3, 2);
    assert_int_equal(ev.kind[2], RK_NODE_REFUSED);
    assert_non_null(strstr(ev.why[2], "wrong secret"));
    assert_false(rk_nodes_connected(t, 0));
    close(fd2);

    /* an earlier launch: fenced */
    rk_net_peer old;
    rk_net_peer_init(&old, JOB, 0, RK_NET_COORDINATOR, 2, true);
    fd2 = dial(t);
    n = hello_frame(&old, &key, 0, BOOT_A, frame);
    assert_int_equal(rk_net_send_all(fd2, frame, n, 1, "t", NULL), RK_OK);
    poll_until(t, &ev, 4, 2);
    assert_int_equal(ev.kind[3], RK_NODE_REFUSED);
    assert_non_null(strstr(ev.why[3], "launch 2"));
    close(fd2);

    /* a node this job does not have: REFUSED sent, then closed */
    rk_net_peer n7, n7in;
    rk_net_peer_init(&n7, JOB, 7, RK_NET_COORDINATOR, 3, true);
    rk_net_peer_init(&n7in, JOB, 7, RK_NET_COORDINATOR, 3, true);
    fd2 = dial(t);
    n = hello_frame(&n7, &key, 7, BOOT_A, frame);
    assert_int_equal(rk_net_send_all(fd2, frame, n, 1, "t", NULL), RK_OK);
    rk_net_reader_init(&r, "coordinator");
    assert_int_equal(read_reply(t, fd2, &r, &key, &n7in), RK_NODE_MSG_REFUSED);
    assert_int_equal(ev.kind[4], RK_NODE_REFUSED);
    assert_non_null(strstr(ev.why[4], "node 7 is not in this job"));
    close(fd2);

    /* silence: node 1 lost after the timeout */
    double t0 = rk_mono_s();
    poll_until(t, &ev, 6, 3);
    assert_int_equal(ev.kind[5], RK_NODE_LOST);
    assert_non_null(strstr(ev.why[5], "silent"));
    assert_true(rk_mono_s() - t0 < 1.5);
    assert_false(rk_nodes_connected(t, 1));
    close(fd);

    /* back with its next sequence number, same boot id: rejoined; another: rebooted */
    fd = dial(t);
    n = hello_frame(&agent, &key, 1, BOOT_A, frame);
    assert_int_equal(rk_net_send_all(fd, frame, n, 1, "t", NULL), RK_OK);
    rk_net_reader_init(&r, "coordinator");
    assert_int_equal(read_reply(t, fd, &r, &key, &from_coord), RK_NODE_MSG_WELCOME);
    assert_int_equal(ev.kind[6], RK_NODE_REJOINED);
    close(fd); /* closed: lost at once */
    poll_until(t, &ev, 8, 2);
    assert_int_equal(ev.kind[7], RK_NODE_LOST);
    assert_non_null(strstr(ev.why[7], "closed the connection"));
    fd = dial(t);
    n = hello_frame(&agent, &key, 1, BOOT_B, frame);
    assert_int_equal(rk_net_send_all(fd, frame, n, 1, "t", NULL), RK_OK);
    rk_net_reader_init(&r, "coordinator");
    assert_int_equal(read_reply(t, fd, &r, &key, &from_coord), RK_NODE_MSG_WELCOME);
    assert_int_equal(ev.kind[8], RK_NODE_REBOOTED);
    assert_int_equal(rk_nodes_count_connected(t), 1);

    /* BYE to every node */
    rk_nodes_bye(t, "done");
    assert_int_equal(read_reply(t, fd, &r, &key, &from_coord), RK_NODE_MSG_BYE);
    assert_int_equal(rk_nodes_count_connected(t), 0);
    close(fd);
    rk_nodes_free(t);
}

/* Node 1 joined on a new connection: its fd (WELCOME read), with `agent` sealing and
 * `from_coord` opening. */
static int join(rk_nodes *t, const rk_net_secret *key, rk_net_peer *agent, rk_net_peer *from_coord,
                rk_net_reader *r)
{
    static uint8_t frame[RK_NET_FRAME_MAX];
    int fd = dial(t);
    size_t n = hello_frame(agent, key, 1, BOOT_A, frame);
    assert_int_equal(rk_net_send_all(fd, frame, n, 1, "t", NULL), RK_OK);
    rk_net_reader_init(r, "coordinator");
    assert_int_equal(read_reply(t, fd, r, key, from_coord), RK_NODE_MSG_WELCOME);
    return fd;
}

static int count_kind(const events *ev, rk_node_event_kind k)
{
    int n = 0;
    for (int i = 0; i < ev->n; i++)
        n += ev->kind[i] == k;
    return n;
}

/* A flood of connections from someone without the secret (connect and close, connect and say
 * nothing) while an agent joins: more than RK_NODES_PENDING_MAX wait to be accepted at once,
 * the agent's among them with its HELLO in. What the pending ones sent is read before one is
 * closed, and the silent ones go first: the agent joins. (Before: the oldest pending one was
 * closed unread, the agent's included, and node 1 never joined.) */
static void test_flood_keeps_an_agent(void **state)
{
    (void)state;
    rk_net_secret key = key_of(0x5a);
    events ev = {0};
    rk_nodes_opts o = {.listen_host = "127.0.0.1",
                       .nodes = 2,
                       .generation = 1,
                       .timeout_s = 5,
                       .on_event = on_event,
                       .ctx = &ev};
    memcpy(o.job, JOB, sizeof o.job);
    rk_nodes *t = NULL;
    assert_int_equal(rk_nodes_open(&t, &o, &key, NULL), RK_OK);
    static uint8_t frame[RK_NET_FRAME_MAX];
    int silent[2 * RK_NODES_PENDING_MAX + 8], ns = 0;
    /* nothing is accepted until the table is polled: all of this waits in the backlog */
    for (int i = 0; i < RK_NODES_PENDING_MAX + 4; i++)
        silent[ns++] = dial(t);
    for (int i = 0; i < 10; i++)
        close(dial(t));
    rk_net_peer agent, from_coord;
    rk_net_peer_init(&agent, JOB, 1, RK_NET_COORDINATOR, 1, true);
    rk_net_peer_init(&from_coord, JOB, 1, RK_NET_COORDINATOR, 1, true);
    int fd = dial(t);
    size_t n = hello_frame(&agent, &key, 1, BOOT_A, frame);
    assert_int_equal(rk_net_send_all(fd, frame, n, 1, "t", NULL), RK_OK);
    for (int i = 0; i < RK_NODES_PENDING_MAX + 4; i++)
        silent[ns++] = dial(t);
    for (int i = 0; i < 10; i++)
        close(dial(t));
    double end = rk_mono_s() + 3;
    while (!rk_nodes_connected(t, 1) && rk_mono_s() < end)
        assert_int_equal(rk_nodes_poll(t, 0.02, NULL), RK_OK);
    assert_true(rk_nodes_connected(t, 1));
    static rk_net_reader r;
    rk_net_reader_init(&r, "coordinator");
    assert_int_equal(read_reply(t, fd, &r, &key, &from_coord), RK_NODE_MSG_WELCOME);
    assert_int_equal(count_kind(&ev, RK_NODE_JOINED), 1);
    /* the refusals of the flood are a few lines, not one a connection */
    assert_true(count_kind(&ev, RK_NODE_REFUSED) <= RK_NODES_HUSH_N);
    for (int i = 0; i < ns; i++)
        close(silent[i]);
    close(fd);
    rk_nodes_free(t);
}

/* Refusals of connections that said no HELLO: RK_NODES_HUSH_N events a window, the
 * rest one HUSHED event with their count when the window ends; then a new window. */
static void test_refusals_are_rate_limited(void **state)
{
    (void)state;
    rk_net_secret key = key_of(0x5a);
    static events ev;
    memset(&ev, 0, sizeof ev);
    rk_nodes_opts o = {.listen_host = "127.0.0.1",
                       .nodes = 1,
                       .generation = 1,
                       .timeout_s = 5,
                       .refusals_window_s = 0.5,
                       .on_event = on_event,
                       .ctx = &ev};
    memcpy(o.job, JOB, sizeof o.job);
    rk_nodes *t = NULL;
    assert_int_equal(rk_nodes_open(&t, &o, &key, NULL), RK_OK);
    enum { FLOOD = 40 };
    for (int i = 0; i < FLOOD; i++) { /* not a node-link frame: refused at its first byte */
        int fd = dial(t);
        assert_int_equal(rk_net_send_all(fd, "GET / HTTP/1.1\r\n\r\n", 18, 1, "t", NULL), RK_OK);
        close(fd);
        assert_int_equal(rk_nodes_poll(t, 0, NULL), RK_OK);
    }
    double end = rk_mono_s() + 3;
    while (count_kind(&ev, RK_NODE_HUSHED) == 0 && rk_mono_s() < end)
        assert_int_equal(rk_nodes_poll(t, 0.05, NULL), RK_OK);
    /* a few events a window (one window, unless this machine took 0.5 s for the flood),
     * each window that held some back ending with their count; every refusal in one or the
     * other once */
    int shown = count_kind(&ev, RK_NODE_REFUSED), windows = count_kind(&ev, RK_NODE_HUSHED);
    int total = shown;
    for (int i = 0; i < ev.n; i++)
        total += ev.kind[i] == RK_NODE_HUSHED ? ev.count[i] : 0;
    assert_int_equal(ev.kind[ev.n - 1], RK_NODE_HUSHED);
    assert_true(windows >= 1);
    assert_true(shown <= RK_NODES_HUSH_N * windows);
    assert_int_equal(total, FLOOD);
    /* a new window: the next refusal is shown again */
    int fd = dial(t);
    assert_int_equal(rk_net_send_all(fd, "GET /", 5, 1, "t", NULL), RK_OK);
    close(fd);
    int before = ev.n;
    poll_until(t, &ev, before + 1, 2);
    assert_int_equal(ev.kind[before], RK_NODE_REFUSED);
    rk_nodes_free(t);
}

/* The coordinator asks a node whether it is alive (a PING); the agent's PONG answers it. */
static void test_probe(void **state)
{
    (void)state;
    rk_net_secret key = key_of(0x5a);
    events ev = {0};
    rk_nodes_opts o = {.listen_host = "127.0.0.1",
                       .nodes = 2,
                       .generation = 1,
                       .timeout_s = 5,
                       .on_event = on_event,
                       .ctx = &ev};
    memcpy(o.job, JOB, sizeof o.job);
    rk_nodes *t = NULL;
    assert_int_equal(rk_nodes_open(&t, &o, &key, NULL), RK_OK);
    assert_int_equal(rk_nodes_probe(t, 0), 0); /* not connected: nothing to ask */
    rk_net_peer agent, from_coord;
    rk_net_peer_init(&agent, JOB, 1, RK_NET_COORDINATOR, 1, true);
    rk_net_peer_init(&from_coord, JOB, 1, RK_NET_COORDINATOR, 1, true);
    static rk_net_reader r;
    int fd = join(t, &key, &agent, &from_coord, &r);
    uint64_t p = rk_nodes_probe(t, 1);
    assert_int_equal(p, 1);
    assert_int_equal(rk_nodes_answered(t, 1), 0);
    assert_int_equal(read_reply(t, fd, &r, &key, &from_coord), RK_NODE_MSG_PING);
    uint8_t frame[RK_NET_HDR_LEN + RK_NET_TAG_LEN];
    size_t n;
    assert_int_equal(
        rk_net_peer_seal(&agent, &key, RK_NODE_MSG_PONG, 0, NULL, 0, frame, sizeof frame, &n, NULL),
        RK_OK);
    assert_int_equal(rk_net_send_all(fd, frame, n, 1, "t", NULL), RK_OK);
    double end = rk_mono_s() + 2;
    while (rk_nodes_answered(t, 1) < p && rk_mono_s() < end)
        assert_int_equal(rk_nodes_poll(t, 0.02, NULL), RK_OK);
    assert_int_equal(rk_nodes_answered(t, 1), 1);
    /* a PONG nobody asked for counts for nothing */
    assert_int_equal(
        rk_net_peer_seal(&agent, &key, RK_NODE_MSG_PONG, 0, NULL, 0, frame, sizeof frame, &n, NULL),
        RK_OK);
    assert_int_equal(rk_net_send_all(fd, frame, n, 1, "t", NULL), RK_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(rk_nodes_poll(t, 0.02, NULL), RK_OK);
    assert_int_equal(rk_nodes_answered(t, 1), 1);
    assert_true(rk_nodes_connected(t, 1));
    close(fd);
    rk_nodes_free(t);
}

/* A caller full for the round (on_msg returns nonzero) is handed no more messages until the
 * next poll: an agent's burst of DATA, sent before its link closed, comes one message a poll,
 * in order, none lost, and the node's loss only after its last frame. */
typedef struct taker {
    events ev; /* first: on_event's context */
    int n, polls;
    uint32_t chan[16];
    int poll_of[16];
    int lost_before[16];
} taker;

static int take_one(void *ctx, int node, uint8_t type, const uint8_t *payload, size_t len)
{
    taker *tk = ctx;
    uint32_t chan;
    const uint8_t *bytes;
    size_t n;
    assert_int_equal(node, 1);
    assert_int_equal(type, RK_NODE_MSG_DATA);
    assert_int_equal(rk_node_chan_take(type, payload, len, &chan, &bytes, &n, NULL), 0);
    if (tk->n < 16) {
        tk->chan[tk->n] = chan;
        tk->poll_of[tk->n] = tk->polls;
        tk->lost_before[tk->n] = count_kind(&tk->ev, RK_NODE_LOST);
        tk->n++;
    }
    return 1; /* full: no more this round */
}

static void test_full_caller_holds_back(void **state)
{
    (void)state;
    rk_net_secret key = key_of(0x5a);
    static taker tk;
    memset(&tk, 0, sizeof tk);
    rk_nodes_opts o = {.listen_host = "127.0.0.1",
                       .nodes = 2,
                       .generation = 1,
                       .timeout_s = 5,
                       .on_event = on_event,
                       .on_msg = take_one,
                       .ctx = &tk};
    memcpy(o.job, JOB, sizeof o.job);
    rk_nodes *t = NULL;
    assert_int_equal(rk_nodes_open(&t, &o, &key, NULL), RK_OK);
    rk_net_peer agent, from_coord;
    rk_net_peer_init(&agent, JOB, 1, RK_NET_COORDINATOR, 1, true);
    rk_net_peer_init(&from_coord, JOB, 1, RK_NET_COORDINATOR, 1, true);
    static rk_net_reader r;
    int fd = join(t, &key, &agent, &from_coord, &r);
    enum { BURST = 6 };
    static uint8_t frames[BURST * (RK_NET_HDR_LEN + RK_NET_TAG_LEN + 16)];
    size_t at = 0;
    for (uint32_t c = 1; c <= BURST; c++) {
        uint8_t payload[16];
        size_t len, n;
        assert_int_equal(rk_node_data_format(c, "x\n", 2, payload, sizeof payload, &len, NULL),
                         RK_OK);
        assert_int_equal(rk_net_peer_seal(&agent, &key, RK_NODE_MSG_DATA, 0, payload, (uint32_t)len,
                                          frames + at, sizeof frames - at, &n, NULL),
                         RK_OK);
        at += n;
    }
    assert_int_equal(rk_net_send_all(fd, frames, at, 1, "t", NULL), RK_OK);
    close(fd); /* the burst, then the link's end: all of it in the table's socket at once */
    double end = rk_mono_s() + 3;
    while (count_kind(&tk.ev, RK_NODE_LOST) == 0 && rk_mono_s() < end) {
        tk.polls++;
        assert_int_equal(rk_nodes_poll(t, 0.02, NULL), RK_OK);
    }
    assert_int_equal(tk.n, BURST);
    for (int i = 0; i < BURST; i++) {
        assert_int_equal(tk.chan[i], (uint32_t)i + 1); /* in order */
        assert_int_equal(tk.lost_before[i], 0);        /* before the loss */
        if (i > 0)
            assert_true(tk.poll_of[i] > tk.poll_of[i - 1]); /* one a poll */
    }
    assert_int_equal(count_kind(&tk.ev, RK_NODE_LOST), 1);
    rk_nodes_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_rules),
        cmocka_unit_test(test_hello_round_trip_and_refusals),
        cmocka_unit_test(test_welcome_and_reason),
        cmocka_unit_test(test_launch_messages),
        cmocka_unit_test(test_health_message),
        cmocka_unit_test(test_stacks_message),
        cmocka_unit_test(test_channel),
        cmocka_unit_test(test_snap_messages),
        cmocka_unit_test(test_text_forms),
        cmocka_unit_test_setup_teardown(test_boot_id_file, setup, teardown),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_flood_keeps_an_agent),
        cmocka_unit_test(test_refusals_are_rate_limited),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_full_caller_holds_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
