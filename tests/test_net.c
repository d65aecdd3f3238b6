/*
 * Tests for the node link (src/net/): frames round-trip; every single-bit flip of a sealed
 * frame, a wrong secret, a truncated frame and an oversized length are refused (the length
 * from the header alone, before any payload); replays, reordered frames, an earlier launch,
 * another job and another node's frames are refused with their own codes and messages; the
 * secret file's rules (mode, owner, kind, symlink, size, content) and the stdin form; and a
 * real TCP connection over 127.0.0.1 through the stream reader, also one byte at a time, and
 * the framed send (rk_net_peer_send) over one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/frame.h"
#include "net/peer.h"
#include "net/secret.h"
#include "net/sock.h"
#include "net/stream.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_net")

static const uint8_t JOB[RK_NET_JOB_ID_LEN] = "job-0123456789ab";
static const uint8_t OTHER_JOB[RK_NET_JOB_ID_LEN] = "job-zzzzzzzzzzzz";

static rk_net_secret key_of(uint8_t b)
{
    rk_net_secret k;
    memset(k.key, b, sizeof k.key);
    return k;
}

static rk_net_hdr hdr_of(uint32_t len)
{
    rk_net_hdr h = {.type = 7,
                    .flags = 0x81,
                    .sender = 2,
                    .receiver = RK_NET_COORDINATOR,
                    .generation = 3,
                    .seq = 0x0102030405060708ull,
                    .len = len};
    memcpy(h.job, JOB, sizeof h.job);
    return h;
}

static uint8_t g_frame[RK_NET_FRAME_MAX + 64];
static uint8_t g_payload[RK_NET_PAYLOAD_MAX + 1];

/* ---- frames ---------------------------------------------------------------------------- */

/* Every field and payload byte comes back as sealed, at the sizes that matter. */
static void test_frame_round_trip(void **state)
{
    (void)state;
    rk_net_secret k = key_of(0x5a);
    for (size_t i = 0; i < sizeof g_payload; i++)
        g_payload[i] = (uint8_t)(i * 31 + 7);
    const uint32_t sizes[] = {0, 1, 100, 4096, RK_NET_PAYLOAD_MAX};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        rk_net_hdr h = hdr_of(sizes[i]), got;
        size_t n = 0;
        rk_err err;
        assert_int_equal(rk_net_frame_seal(&k, &h, g_payload, g_frame, sizeof g_frame, &n, &err),
                         RK_OK);
        assert_int_equal(n, RK_NET_HDR_LEN + sizes[i] + RK_NET_TAG_LEN);
        assert_memory_equal(g_frame, "RKNL\x01", 5);
        const uint8_t *p;
        assert_int_equal(rk_net_frame_open(&k, g_frame, n, "x", &got, &p, &err), RK_OK);
        assert_int_equal(got.type, 7);
        assert_int_equal(got.flags, 0x81);
        assert_int_equal(got.sender, 2);
        assert_int_equal(got.receiver, RK_NET_COORDINATOR);
        assert_int_equal(got.generation, 3);
        assert_true(got.seq == 0x0102030405060708ull);
        assert_int_equal(got.len, sizes[i]);
        assert_memory_equal(got.job, JOB, sizeof JOB);
        assert_ptr_equal(p, g_frame + RK_NET_HDR_LEN);
        if (sizes[i])
            assert_memory_equal(p, g_payload, sizes[i]);
    }
    /* little-endian on the wire: the sequence number's low byte first */
    assert_int_equal(g_frame[24], 0x08);
    assert_int_equal(g_frame[31], 0x01);
}

/* The layout of docs/cluster-protocol.md, byte for byte: this frame and its tag were computed
 * apart from this code (Python's struct and hmac modules, from the documented table). */
static void test_frame_known_answer(void **state)
{
    (void)state;
    static const char want[] =
        "524b4e4c0107810002000000ffffffff030000000500000008070605040302016a6f622d3031323334"
        "3536373839616268656c6c6f31b2fa6ae74b66e7ccd53ef969879f698b7ebf4622c24acb81b25e5251"
        "29f6ba";
    rk_net_secret k;
    for (int i = 0; i < RK_NET_SECRET_LEN; i++)
        k.key[i] = (uint8_t)i;
    rk_net_hdr h = hdr_of(5);
    size_t n;
    assert_int_equal(rk_net_frame_seal(&k, &h, "hello", g_frame, sizeof g_frame, &n, NULL), 0);
    assert_int_equal(n, 85);
    char hex[2 * 85 + 1];
    for (size_t i = 0; i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", g_frame[i]);
    assert_string_equal(hex, want);
}

static void test_seal_refuses_oversize_and_small_buffer(void **state)
{
    (void)state;
    rk_net_secret k = key_of(1);
    rk_net_hdr h = hdr_of(RK_NET_PAYLOAD_MAX + 1);
    rk_err err;
    size_t n = 99;
    assert_int_equal(rk_net_frame_seal(&k, &h, g_payload, g_frame, sizeof g_frame, &n, &err),
                     RK_NET_ETOOBIG);
    h = hdr_of(10);
    uint8_t small[RK_NET_HDR_LEN + 10 + RK_NET_TAG_LEN - 1];
    assert_int_equal(rk_net_frame_seal(&k, &h, g_payload, small, sizeof small, &n, &err),
                     RK_EINVAL);
    assert_int_equal(n, 99);
}

static void test_wrong_secret_refused(void **state)
{
    (void)state;
    rk_net_secret k = key_of(1), wrong = key_of(2);
    rk_net_hdr h = hdr_of(5), got;
    size_t n;
    rk_err err;
    assert_int_equal(rk_net_frame_seal(&wrong, &h, "hello", g_frame, sizeof g_frame, &n, &err), 0);
    const uint8_t *p = (const uint8_t *)"not null";
    assert_int_equal(rk_net_frame_open(&k, g_frame, n, "198.18.0.3:41234", &got, &p, &err),
                     RK_NET_EAUTH);
    assert_string_equal(err.msg, "wrong secret or tampered frame from 198.18.0.3:41234");
    assert_null(p);
    assert_int_equal(got.sender, 0);
    assert_int_equal(got.len, 0);
}

/* Any single bit flipped anywhere (header, payload, tag) is refused, and nothing is handed
 * out; the header's own checks come first where they can. */
static void test_every_bit_flip_refused(void **state)
{
    (void)state;
    rk_net_secret k = key_of(9);
    rk_net_hdr h = hdr_of(40), got;
    size_t n;
    rk_err err;
    assert_int_equal(rk_net_frame_seal(&k, &h, g_payload, g_frame, sizeof g_frame, &n, &err), 0);
    int auth = 0, format = 0, big = 0;
    for (size_t bit = 0; bit < 8 * n; bit++) {
        g_frame[bit / 8] ^= (uint8_t)(1u << bit % 8);
        const uint8_t *p = g_frame;
        int rc = rk_net_frame_open(&k, g_frame, n, "peer", &got, &p, &err);
        g_frame[bit / 8] ^= (uint8_t)(1u << bit % 8);
        assert_true(rc < 0);
        assert_null(p);
        assert_int_equal(err.code, rc);
        auth += rc == RK_NET_EAUTH;
        format += rc == RK_EFORMAT;
        big += rc == RK_NET_ETOOBIG;
        if (bit / 8 < 4 || bit / 8 == 4 || bit / 8 == 7)
            assert_int_equal(rc, RK_EFORMAT); /* magic, version, reserved */
        else if (bit / 8 >= 20 && bit / 8 < 24)
            assert_true(rc == RK_EFORMAT || rc == RK_NET_ETOOBIG); /* the length */
        else
            assert_int_equal(rc, RK_NET_EAUTH);
    }
    assert_int_equal(auth + format + big, 8 * n);
    assert_true(big > 0);
    const uint8_t *p;
    assert_int_equal(rk_net_frame_open(&k, g_frame, n, "peer", &got, &p, &err), RK_OK);
}

static void test_truncated_and_trailing_refused(void **state)
{
    (void)state;
    rk_net_secret k = key_of(9);
    rk_net_hdr h = hdr_of(30), got;
    size_t n;
    rk_err err;
    assert_int_equal(rk_net_frame_seal(&k, &h, g_payload, g_frame, sizeof g_frame, &n, &err), 0);
    const uint8_t *p;
    for (size_t len = 0; len < n; len++) {
        assert_int_equal(rk_net_frame_open(&k, g_frame, len, "peer", &got, &p, &err), RK_EFORMAT);
        assert_non_null(strstr(err.msg, "truncated"));
    }
    assert_int_equal(rk_net_frame_open(&k, g_frame, n + 1, "peer", &got, &p, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "trailing"));
}

/* An oversized length is refused from the first 24 bytes, before the header is even
 * complete, and so before any payload arrives. */
static void test_oversize_refused_from_header(void **state)
{
    (void)state;
    rk_net_secret k = key_of(9);
    rk_net_hdr h = hdr_of(8);
    size_t n, total = 1;
    rk_err err;
    assert_int_equal(rk_net_frame_seal(&k, &h, g_payload, g_frame, sizeof g_frame, &n, &err), 0);
    g_frame[20] = 0x01, g_frame[21] = 0x00, g_frame[22] = 0x01, g_frame[23] = 0x00; /* 65537 */
    assert_int_equal(rk_net_frame_peek(g_frame, 23, "p", &total, &err), RK_OK);
    assert_int_equal(total, 0);
    assert_int_equal(rk_net_frame_peek(g_frame, 24, "p", &total, &err), RK_NET_ETOOBIG);
    assert_string_equal(err.msg, "frame from p: payload of 65537 bytes, more than 65536");

    static rk_net_reader r;
    rk_net_reader_init(&r, "10.0.0.1:5");
    rk_net_hdr got;
    const uint8_t *p;
    for (size_t i = 0; i < 23; i++) {
        assert_int_equal(rk_net_reader_feed(&r, g_frame + i, 1, &err), 1);
        assert_int_equal(rk_net_reader_next(&r, &k, &got, &p, &err), 0);
    }
    assert_int_equal(rk_net_reader_feed(&r, g_frame + 23, 1, &err), 1);
    assert_int_equal(rk_net_reader_next(&r, &k, &got, &p, &err), RK_NET_ETOOBIG);
    /* the failure is final, for every call */
    assert_int_equal(rk_net_reader_feed(&r, g_frame, 1, &err), RK_NET_ETOOBIG);
    assert_int_equal(rk_net_reader_next(&r, &k, &got, &p, &err), RK_NET_ETOOBIG);
    assert_non_null(strstr(err.msg, "10.0.0.1:5"));
}

static void test_garbage_refused_at_first_byte(void **state)
{
    (void)state;
    rk_net_secret k = key_of(9);
    static rk_net_reader r;
    rk_net_reader_init(&r, "10.0.0.2:6");
    rk_err err;
    rk_net_hdr got;
    const uint8_t *p;
    assert_int_equal(rk_net_reader_feed(&r, "G", 1, &err), 1);
    assert_int_equal(rk_net_reader_next(&r, &k, &got, &p, &err), RK_EFORMAT);
    assert_string_equal(err.msg, "garbage from 10.0.0.2:6: not a node-link frame (bad magic)");
    /* another version is named */
    rk_net_reader_init(&r, "v");
    assert_int_equal(rk_net_reader_feed(&r, "RKNL\x02", 5, &err), 5);
    assert_int_equal(rk_net_reader_next(&r, &k, &got, &p, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "version 2"));
}

/* Three frames fed one byte at a time come out one by one, in order, each only once. */
static void test_reader_byte_at_a_time(void **state)
{
    (void)state;
    rk_net_secret k = key_of(3);
    static uint8_t stream[3 * (RK_NET_HDR_LEN + 300 + RK_NET_TAG_LEN)];
    size_t used = 0;
    for (uint32_t i = 0; i < 3; i++) {
        rk_net_hdr h = hdr_of(100 * (i + 1));
        h.seq = i + 1;
        memset(g_payload, 'a' + (int)i, h.len);
        size_t n;
        assert_int_equal(
            rk_net_frame_seal(&k, &h, g_payload, stream + used, sizeof stream - used, &n, NULL), 0);
        used += n;
    }
    static rk_net_reader r;
    rk_net_reader_init(&r, NULL);
    rk_err err;
    int seen = 0;
    for (size_t i = 0; i < used; i++) {
        assert_int_equal(rk_net_reader_feed(&r, stream + i, 1, &err), 1);
        rk_net_hdr h;
        const uint8_t *p;
        int rc;
        while ((rc = rk_net_reader_next(&r, &k, &h, &p, &err)) == 1) {
            seen++;
            assert_int_equal(h.seq, seen);
            assert_int_equal(h.len, 100 * seen);
            for (uint32_t j = 0; j < h.len; j++)
                assert_int_equal(p[j], 'a' + seen - 1);
        }
        assert_int_equal(rc, 0);
    }
    assert_int_equal(seen, 3);
    assert_int_equal(rk_net_reader_pending(&r), 0);
}

/* ---- replay, fencing, job and node ------------------------------------------------------ */

/* Seal a frame from `from` and open it again with the same key: the header as received. */
static rk_net_hdr sent(rk_net_peer *from, const rk_net_secret *k)
{
    size_t n;
    assert_int_equal(rk_net_peer_seal(from, k, 1, 0, "x", 1, g_frame, sizeof g_frame, &n, NULL), 0);
    rk_net_hdr h;
    const uint8_t *p;
    assert_int_equal(rk_net_frame_open(k, g_frame, n, "a", &h, &p, NULL), 0);
    return h;
}

static void test_replay_and_reorder_refused(void **state)
{
    (void)state;
    rk_net_secret k = key_of(4);
    rk_net_peer agent, coord;
    rk_net_peer_init(&agent, JOB, 5, RK_NET_COORDINATOR, 3, true);
    rk_net_peer_init(&coord, JOB, RK_NET_COORDINATOR, 5, 3, false);
    rk_net_hdr h[25];
    for (int i = 0; i < 25; i++)
        h[i] = sent(&agent, &k);
    rk_err err;
    for (int i = 0; i < 20; i++)
        assert_int_equal(rk_net_peer_accept(&coord, &h[i], "198.18.0.3:41234", &err), 0);
    assert_int_equal(coord.received, 20);
    assert_int_equal(rk_net_peer_accept(&coord, &h[16], "198.18.0.3:41234", &err), RK_NET_EREPLAY);
    assert_string_equal(err.msg, "replayed frame seq 17 <= 20 from 198.18.0.3:41234");
    assert_int_equal(rk_net_peer_accept(&coord, &h[19], "a", &err), RK_NET_EREPLAY);
    /* reordered: 22 before 21 loses 21 */
    assert_int_equal(rk_net_peer_accept(&coord, &h[21], "a", &err), 0);
    assert_int_equal(rk_net_peer_accept(&coord, &h[20], "a", &err), RK_NET_EREPLAY);
    /* a gap is fine (a frame lost with a connection) */
    assert_int_equal(rk_net_peer_accept(&coord, &h[24], "a", &err), 0);
    assert_int_equal(coord.received, 25);
}

static void test_old_generation_fenced(void **state)
{
    (void)state;
    rk_net_secret k = key_of(4);
    rk_net_peer old_agent, new_agent, coord;
    rk_net_peer_init(&old_agent, JOB, 1, RK_NET_COORDINATOR, 2, true);
    rk_net_peer_init(&new_agent, JOB, 1, RK_NET_COORDINATOR, 4, true);
    rk_net_peer_init(&coord, JOB, RK_NET_COORDINATOR, 1, 3, false);
    rk_err err;
    rk_net_hdr h = sent(&old_agent, &k);
    assert_int_equal(rk_net_peer_accept(&coord, &h, "a", &err), RK_NET_EFENCED);
    assert_string_equal(err.msg, "frame of launch 2 from a, this is launch 3");
    /* the coordinator never follows: a later launch is refused too */
    h = sent(&new_agent, &k);
    assert_int_equal(rk_net_peer_accept(&coord, &h, "a", &err), RK_NET_EFENCED);
    assert_int_equal(coord.generation, 3);
    assert_int_equal(coord.received, 0);

    /* the agent follows the coordinator into launch 4, counters from 0 again */
    rk_net_peer agent;
    rk_net_peer_init(&agent, JOB, 1, RK_NET_COORDINATOR, 3, true);
    for (int i = 0; i < 5; i++) {
        h = sent(&coord, &k);
        assert_int_equal(rk_net_peer_accept(&agent, &h, "c", &err), 0);
    }
    rk_net_hdr stale = sent(&coord, &k); /* launch 3, seq 6, held back */
    rk_net_peer_set_generation(&coord, 4);
    h = sent(&coord, &k);
    assert_int_equal(h.seq, 1);
    assert_int_equal(rk_net_peer_accept(&agent, &h, "c", &err), 0);
    assert_int_equal(agent.generation, 4);
    assert_int_equal(agent.received, 1);
    assert_int_equal(rk_net_peer_accept(&agent, &stale, "c", &err), RK_NET_EFENCED);
    assert_string_equal(err.msg, "frame of launch 3 from c, this is launch 4");
}

static void test_other_job_and_node_refused(void **state)
{
    (void)state;
    rk_net_secret k = key_of(4);
    rk_net_peer coord, to_node2, to_node3, from_node2;
    rk_net_peer_init(&coord, JOB, RK_NET_COORDINATOR, 2, 1, false);
    rk_err err;
    rk_net_peer other;
    rk_net_peer_init(&other, OTHER_JOB, 2, RK_NET_COORDINATOR, 1, true);
    rk_net_hdr h = sent(&other, &k);
    assert_int_equal(rk_net_peer_accept(&coord, &h, "a", &err), RK_NET_EJOB);
    assert_string_equal(err.msg, "frame of another job from a");
    /* node 3 claiming node 2's link */
    rk_net_peer_init(&from_node2, JOB, 3, RK_NET_COORDINATOR, 1, true);
    h = sent(&from_node2, &k);
    assert_int_equal(rk_net_peer_accept(&coord, &h, "a", &err), RK_NET_EPEER);
    assert_string_equal(err.msg, "frame from a claims to be from node 3, expected node 2");
    /* a coordinator frame to node 2 replayed at node 3 */
    rk_net_peer_init(&to_node2, JOB, RK_NET_COORDINATOR, 2, 1, false);
    rk_net_peer_init(&to_node3, JOB, 3, RK_NET_COORDINATOR, 1, true);
    h = sent(&to_node2, &k);
    assert_int_equal(rk_net_peer_accept(&to_node3, &h, "c", &err), RK_NET_EPEER);
    assert_string_equal(err.msg, "frame from c is addressed to node 2, this is node 3");
    /* nothing refused moved a counter */
    assert_int_equal(coord.received, 0);
    assert_int_equal(to_node3.received, 0);
    assert_string_equal(rk_net_strerror(RK_NET_EFENCED), "frame of another launch (fenced)");
    assert_string_equal(rk_net_strerror(RK_EFORMAT), rk_strerror(RK_EFORMAT));
}

/* ---- secrets ------------------------------------------------------------------------------ */

static const char *in_dir(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
    return buf;
}

static void put(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
}

#define HEX64 "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF"

static void test_secret_write_load(void **state)
{
    (void)state;
    char path[600];
    in_dir(path, sizeof path, "secret");
    rk_net_secret s, t;
    rk_err err;
    mode_t old = umask(0777); /* the file is 0600 whatever the umask */
    assert_int_equal(rk_net_secret_generate(&s, &err), 0);
    int rc = rk_net_secret_write(&s, path, &err);
    umask(old);
    assert_int_equal(rc, 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_size, 65);
    assert_int_equal(rk_net_secret_load(&t, path, &err), 0);
    assert_memory_equal(s.key, t.key, sizeof s.key);
    /* never replaced */
    assert_int_equal(rk_net_secret_write(&s, path, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "exists"));
    assert_int_equal(rk_net_secret_load(&t, path, &err), 0);
    assert_memory_equal(s.key, t.key, sizeof s.key);
    /* two secrets differ */
    assert_int_equal(rk_net_secret_generate(&t, &err), 0);
    assert_memory_not_equal(s.key, t.key, sizeof s.key);
    /* upper and lower case, newline optional */
    put(path, HEX64, 0600);
    assert_int_equal(rk_net_secret_load(&t, path, &err), 0);
    assert_int_equal(t.key[0], 0x00);
    assert_int_equal(t.key[5], 0x55);
    assert_int_equal(t.key[31], 0xff);
    char hex[RK_NET_SECRET_HEX_LEN + 2];
    rk_net_secret_hex(&t, hex);
    assert_string_equal(hex, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n");
    rk_net_secret_wipe(&t);
    for (size_t i = 0; i < sizeof t.key; i++)
        assert_int_equal(t.key[i], 0);
}

/* Load `path` and expect `code` with `what` in the message, which names the path. */
static void refused(const char *path, int code, const char *what)
{
    rk_net_secret s = key_of(0xee);
    rk_err err;
    assert_int_equal(rk_net_secret_load(&s, path, &err), code);
    if (!strstr(err.msg, what) || !strstr(err.msg, path))
        fail_msg("'%s' does not say '%s' about %s", err.msg, what, path);
    for (size_t i = 0; i < sizeof s.key; i++)
        assert_int_equal(s.key[i], 0); /* wiped on failure */
}

static void test_secret_file_rules(void **state)
{
    (void)state;
    char p[600], q[600];
    put(in_dir(p, sizeof p, "s0644"), HEX64 "\n", 0644);
    refused(p, RK_EINVAL, "mode 0644 lets group or others read it");
    put(in_dir(p, sizeof p, "s0620"), HEX64 "\n", 0620);
    refused(p, RK_EINVAL, "write it");
    put(in_dir(p, sizeof p, "s0606"), HEX64 "\n", 0606);
    refused(p, RK_EINVAL, "read and write it");
    put(in_dir(p, sizeof p, "s0400"), HEX64 "\n", 0400);
    rk_net_secret s;
    assert_int_equal(rk_net_secret_load(&s, p, NULL), 0); /* stricter than 0600 is fine */

    put(in_dir(q, sizeof q, "target"), HEX64 "\n", 0600);
    assert_int_equal(symlink(q, in_dir(p, sizeof p, "link")), 0);
    refused(p, RK_EINVAL, "is a symbolic link");
    in_dir(p, sizeof p, "dir");
    assert_int_equal(mkdir(p, 0700), 0);
    refused(p, RK_EINVAL, "is a directory, not a regular file");
    refused(in_dir(p, sizeof p, "missing"), RK_ENOENT, "no such file");
    assert_int_equal(mkfifo(in_dir(p, sizeof p, "fifo"), 0600), 0);
    refused(p, RK_EINVAL, "is a FIFO, not a regular file"); /* and the open did not hang */

    put(in_dir(p, sizeof p, "badhex"), "0011223344556677889g" HEX64 "\n", 0600);
    refused(p, RK_EFORMAT, "characters"); /* 84 characters */
    char text[80];
    snprintf(text, sizeof text, "%.19sg%s\n", HEX64, &HEX64[20]);
    put(p, text, 0600);
    refused(p, RK_EFORMAT, "character 20 is not a hexadecimal digit");
    put(p, "", 0600);
    refused(p, RK_EFORMAT, "holds 0 characters");
    put(p, HEX64 "\n\n", 0600);
    refused(p, RK_EFORMAT, "holds 65 characters");
    snprintf(text, sizeof text, "%.63s\n", HEX64);
    put(p, text, 0600);
    refused(p, RK_EFORMAT, "holds 63 characters");

    char big[400];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    put(in_dir(p, sizeof p, "big"), big, 0600);
    refused(p, RK_EINVAL, "399 bytes, too large");

    if (geteuid() == 0) { /* root can give the file away */
        put(in_dir(p, sizeof p, "theirs"), HEX64 "\n", 0600);
        assert_int_equal(chown(p, 65534, 65534), 0);
        refused(p, RK_EINVAL, "owned by uid 65534");
    } else {
        print_message("not root: the other-owner case is not tested\n");
    }
}

/* The stdin form: read up to the newline, nothing after it consumed. */
static void test_secret_from_fd(void **state)
{
    (void)state;
    int fds[2];
    rk_net_secret s;
    rk_err err;
    assert_int_equal(pipe(fds), 0);
    const char in[] = HEX64 "\nrest";
    assert_int_equal(write(fds[1], in, sizeof in - 1), (ssize_t)sizeof in - 1);
    assert_int_equal(rk_net_secret_read_fd(&s, fds[0], "stdin", &err), 0);
    assert_int_equal(s.key[31], 0xff);
    char rest[8] = "";
    assert_int_equal(read(fds[0], rest, 4), 4);
    assert_memory_equal(rest, "rest", 4);
    /* the end of input after 64 characters is fine */
    assert_int_equal(write(fds[1], HEX64, 64), 64);
    close(fds[1]);
    assert_int_equal(rk_net_secret_read_fd(&s, fds[0], "stdin", &err), 0);
    assert_int_equal(rk_net_secret_read_fd(&s, fds[0], "stdin", &err), RK_EFORMAT);
    assert_string_equal(err.msg, "stdin: ended before a secret was read");
    close(fds[0]);
    /* too long a line: refused after 65 bytes, the rest left unread */
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(write(fds[1], HEX64 "00\n", 67), 67);
    assert_int_equal(rk_net_secret_read_fd(&s, fds[0], "stdin", &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "stdin: "));
    assert_int_equal(read(fds[0], rest, 8), 2);
    close(fds[0]);
    close(fds[1]);
}

/* ---- TCP over 127.0.0.1 ------------------------------------------------------------------- */

/* Poll `fd` and feed the reader until it yields a frame or fails (2 s at most). */
static int read_frame(rk_net_reader *r, int fd, const rk_net_secret *k, rk_net_hdr *h,
                      const uint8_t **p, rk_err *err)
{
    for (int turns = 0; turns < 200; turns++) {
        int rc = rk_net_reader_next(r, k, h, p, err);
        if (rc != 0)
            return rc;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 10) > 0 && (rc = rk_net_reader_fill(r, fd, err)) < 0)
            return rc;
    }
    return 0;
}

static void connect_pair(int lfd, int *c, int *s, char *from)
{
    rk_err err;
    assert_int_equal(rk_net_connect("127.0.0.1", rk_net_local_port(lfd), 2.0, c, &err), 0);
    int rc = 0;
    for (int i = 0; i < 200 && rc == 0; i++) {
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        poll(&pf, 1, 10);
        rc = rk_net_accept(lfd, s, from, &err);
    }
    assert_int_equal(rc, 1);
    assert_int_equal(fcntl(*s, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    assert_true(fcntl(*c, F_GETFL) & O_NONBLOCK);
    int v = 0;
    socklen_t vl = sizeof v;
    assert_int_equal(getsockopt(*s, SOL_SOCKET, SO_KEEPALIVE, &v, &vl), 0);
    assert_int_equal(v, 1);
}

static void test_tcp_link(void **state)
{
    (void)state;
    rk_net_secret k = key_of(0x42), wrong = key_of(0x43);
    rk_err err;
    int lfd;
    assert_int_equal(rk_net_listen("127.0.0.1", 0, &lfd, &err), 0);
    char at[RK_NET_ADDR_MAX];
    assert_non_null(strstr(rk_net_local_text(lfd, at, sizeof at), "127.0.0.1:"));
    assert_true(rk_net_local_port(lfd) > 0);

    rk_net_peer agent, coord;
    rk_net_peer_init(&agent, JOB, 0, RK_NET_COORDINATOR, 1, true);
    rk_net_peer_init(&coord, JOB, RK_NET_COORDINATOR, 0, 1, false);
    static uint8_t good[RK_NET_FRAME_MAX], bad[RK_NET_FRAME_MAX];
    size_t ngood, nbad;
    assert_int_equal(
        rk_net_peer_seal(&agent, &k, 1, 0, "hello node 0", 12, good, sizeof good, &ngood, &err), 0);

    /* 1. a good frame, then one with the wrong secret: the reader fails, naming the peer */
    int c, s;
    char from[RK_NET_ADDR_MAX], name[RK_NET_ADDR_MAX];
    connect_pair(lfd, &c, &s, from);
    assert_string_equal(rk_net_peer_text(s, name, sizeof name), from);
    static rk_net_reader r;
    rk_net_reader_init(&r, from);
    assert_int_equal(rk_net_send_all(c, good, ngood, 2.0, "coordinator", &err), 0);
    rk_net_hdr h;
    const uint8_t *p;
    assert_int_equal(read_frame(&r, s, &k, &h, &p, &err), 1);
    assert_int_equal(rk_net_peer_accept(&coord, &h, r.from, &err), 0);
    assert_memory_equal(p, "hello node 0", 12);
    assert_int_equal(rk_net_peer_seal(&agent, &wrong, 1, 0, "x", 1, bad, sizeof bad, &nbad, &err),
                     0);
    assert_int_equal(rk_net_send_all(c, bad, nbad, 2.0, "coordinator", &err), 0);
    assert_int_equal(read_frame(&r, s, &k, &h, &p, &err), RK_NET_EAUTH);
    char want[200];
    snprintf(want, sizeof want, "wrong secret or tampered frame from %s", from);
    assert_string_equal(err.msg, want);
    assert_non_null(strstr(from, "127.0.0.1:"));
    close(c);
    close(s);

    /* 2. a new connection replays the good frame, one byte at a time: refused as a replay
     * (the peer's state outlives the connection); then the next frame is accepted */
    connect_pair(lfd, &c, &s, from);
    rk_net_reader_init(&r, from);
    for (size_t i = 0; i < ngood; i++) {
        assert_int_equal(rk_net_send_all(c, good + i, 1, 2.0, "coordinator", &err), 0);
        int rc = i + 1 < ngood ? 0 : 1;
        struct pollfd pf = {.fd = s, .events = POLLIN};
        assert_int_equal(poll(&pf, 1, 2000), 1);
        assert_int_equal(rk_net_reader_fill(&r, s, &err), 1);
        assert_int_equal(rk_net_reader_next(&r, &k, &h, &p, &err), rc);
    }
    assert_int_equal(rk_net_peer_accept(&coord, &h, r.from, &err), RK_NET_EREPLAY);
    snprintf(want, sizeof want, "replayed frame seq 1 <= 1 from %s", from);
    assert_string_equal(err.msg, want);
    assert_int_equal(rk_net_peer_seal(&agent, &k, 2, 0, "bye", 3, good, sizeof good, &ngood, &err),
                     0);
    assert_int_equal(rk_net_send_all(c, good, ngood, 2.0, "coordinator", &err), 0);
    assert_int_equal(read_frame(&r, s, &k, &h, &p, &err), 1);
    assert_int_equal(rk_net_peer_accept(&coord, &h, r.from, &err), 0);
    assert_int_equal(h.seq, 3);

    /* 3. the agent goes: the reader says so */
    close(c);
    assert_int_equal(read_frame(&r, s, &k, &h, &p, &err), RK_NET_ECLOSED);
    snprintf(want, sizeof want, "%s closed the connection", from);
    assert_string_equal(err.msg, want);
    close(s);

    /* 4. nothing listens on a closed port: refused, naming the address */
    uint16_t port = rk_net_local_port(lfd);
    close(lfd);
    assert_int_equal(rk_net_connect("127.0.0.1", port, 2.0, &c, &err), RK_ECOMM);
    assert_non_null(strstr(err.msg, "127.0.0.1:"));
    assert_int_equal(c, -1);
}

/* rk_net_peer_send, the framed send of both ends: what it writes opens and is accepted in
 * order, small payloads and one past its stack buffer alike; an oversized payload is refused
 * before anything is sealed or written */
static void test_peer_send(void **state)
{
    (void)state;
    rk_net_secret k = key_of(0x44);
    rk_err err;
    int lfd, c, s;
    char from[RK_NET_ADDR_MAX];
    assert_int_equal(rk_net_listen("127.0.0.1", 0, &lfd, &err), 0);
    connect_pair(lfd, &c, &s, from);
    rk_net_peer agent, coord;
    rk_net_peer_init(&agent, JOB, 0, RK_NET_COORDINATOR, 1, true);
    rk_net_peer_init(&coord, JOB, RK_NET_COORDINATOR, 0, 1, false);
    static rk_net_reader r;
    rk_net_reader_init(&r, from);
    static uint8_t big[10000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (uint8_t)(i * 7);
    rk_net_hdr h;
    const uint8_t *p;
    assert_int_equal(rk_net_peer_send(&agent, &k, c, 5, "ping", 4, "coordinator", &err), RK_OK);
    assert_int_equal(rk_net_peer_send(&agent, &k, c, 6, big, sizeof big, "coordinator", &err),
                     RK_OK);
    assert_int_equal(rk_net_peer_send(&agent, &k, c, 7, NULL, 0, "coordinator", &err), RK_OK);
    assert_int_equal(read_frame(&r, s, &k, &h, &p, &err), 1);
    assert_int_equal(rk_net_peer_accept(&coord, &h, r.from, &err), 0);
    assert_int_equal(h.type, 5);
    assert_int_equal(h.len, 4);
    assert_memory_equal(p, "ping", 4);
    assert_int_equal(read_frame(&r, s, &k, &h, &p, &err), 1);
    assert_int_equal(rk_net_peer_accept(&coord, &h, r.from, &err), 0);
    assert_int_equal(h.type, 6);
    assert_int_equal(h.len, sizeof big);
    assert_memory_equal(p, big, sizeof big);
    assert_int_equal(read_frame(&r, s, &k, &h, &p, &err), 1);
    assert_int_equal(rk_net_peer_accept(&coord, &h, r.from, &err), 0);
    assert_int_equal(h.type, 7);
    assert_int_equal(h.seq, 3);
    assert_int_equal(
        rk_net_peer_send(&agent, &k, c, 8, big, RK_NET_PAYLOAD_MAX + 1u, "coordinator", &err),
        RK_NET_ETOOBIG);
    assert_non_null(strstr(err.msg, "coordinator"));
    assert_int_equal(agent.sent, 3);                      /* nothing sealed */
    assert_int_equal(rk_net_reader_fill(&r, s, &err), 0); /* nothing written */
    close(c);
    close(s);
    close(lfd);
}

static void test_listen_addresses(void **state)
{
    (void)state;
    rk_err err;
    int fd, rc;
    assert_int_equal(rk_net_listen("", 0, &fd, &err), RK_EINVAL);
    assert_int_equal(rk_net_listen("no-such-host.invalid", 0, &fd, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "no-such-host.invalid"));
    assert_int_equal(fd, -1);
    /* a name is fine when it has one address, refused with the list when it has several */
    struct sockaddr_storage ss;
    socklen_t sl;
    rc = rk_net_resolve_one("localhost", 7, &ss, &sl, &err);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res, *a;
    assert_int_equal(getaddrinfo("localhost", "7", &hints, &res), 0);
    int distinct = 0;
    for (a = res; a; a = a->ai_next) {
        struct addrinfo *b = res;
        while (b != a && !(b->ai_addrlen == a->ai_addrlen &&
                           memcmp(b->ai_addr, a->ai_addr, a->ai_addrlen) == 0))
            b = b->ai_next;
        distinct += b == a;
    }
    freeaddrinfo(res);
    if (distinct > 1) {
        assert_int_equal(rc, RK_EINVAL);
        assert_non_null(strstr(err.msg, "addresses"));
        assert_int_equal(rk_net_listen("localhost", 0, &fd, &err), RK_EINVAL);
    } else {
        assert_int_equal(rc, 0);
        print_message("localhost has one address here: the several-addresses refusal is not "
                      "tested\n");
    }
    /* an address not on this host cannot be bound */
    assert_int_equal(rk_net_listen("198.18.255.254", 0, &fd, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "198.18.255.254"));
    /* IPv6 where the host has it */
    if (rk_net_listen("::1", 0, &fd, &err) == 0) {
        char at[RK_NET_ADDR_MAX];
        assert_non_null(strstr(rk_net_local_text(fd, at, sizeof at), "[::1]:"));
        int c, s;
        char from[RK_NET_ADDR_MAX];
        assert_int_equal(rk_net_connect("::1", rk_net_local_port(fd), 2.0, &c, &err), 0);
        rc = 0;
        for (int i = 0; i < 200 && rc == 0; i++) {
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            poll(&pf, 1, 10);
            rc = rk_net_accept(fd, &s, from, &err);
        }
        assert_int_equal(rc, 1);
        assert_non_null(strstr(from, "[::1]:"));
        close(c);
        close(s);
        close(fd);
    } else {
        print_message("no IPv6 loopback here (%s): IPv6 not tested\n", err.msg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_round_trip),
        cmocka_unit_test(test_frame_known_answer),
        cmocka_unit_test(test_seal_refuses_oversize_and_small_buffer),
        cmocka_unit_test(test_wrong_secret_refused),
        cmocka_unit_test(test_every_bit_flip_refused),
        cmocka_unit_test(test_truncated_and_trailing_refused),
        cmocka_unit_test(test_oversize_refused_from_header),
        cmocka_unit_test(test_garbage_refused_at_first_byte),
        cmocka_unit_test(test_reader_byte_at_a_time),
        cmocka_unit_test(test_replay_and_reorder_refused),
        cmocka_unit_test(test_old_generation_fenced),
        cmocka_unit_test(test_other_job_and_node_refused),
        cmocka_unit_test_setup_teardown(test_secret_write_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secret_file_rules, setup, teardown),
        cmocka_unit_test(test_secret_from_fd),
        cmocka_unit_test(test_tcp_link),
        cmocka_unit_test(test_peer_send),
        cmocka_unit_test(test_listen_addresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
