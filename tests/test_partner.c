/*
 * Tests for an agent's side of the partner copies (src/cluster/partner.c): a rank's pinned
 * generation streamed from its node (SNAP_BEGIN, SNAP_DATA pieces, SNAP_END), kept by the
 * partner under held/ (SNAP_HELD), fetched back from there (SNAP_FETCH) and kept as the rank's
 * own generation on a third node, byte for byte; a copy cut short, one with a byte changed on
 * the way and one whose link was lost are never kept and leave no temporary file; a fetch of
 * a copy the holder does not have is answered with SNAP_END alone; a message that does not
 * parse is refused; a fetch goes before a push in flight, which is given up (its receiver
 * keeps nothing) and sent again whole; after a rollback below the pin sent, the new pin goes;
 * each node says its snapshot memory (its own, the partner copies it holds: SNAP_MEM). The
 * messages go through a capture in place of the node link (the coordinator's relay is a copy of
 * each frame: partners.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/nodes.h"
#include "cluster/partner.h"
#include "rekindle/snap.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_partner")

#define MSGS_MAX 256

typedef struct msg {
    uint8_t type;
    size_t len;
    uint8_t *payload;
} msg;

typedef struct cap {
    msg m[MSGS_MAX];
    int n;
    int nmem; /* SNAP_MEMs said, the last one in mem (not in m: the copies' frames are) */
    rk_node_snap_mem mem;
} cap;

static int capture(void *ctx, uint8_t type, const void *payload, size_t len)
{
    cap *c = ctx;
    if (type == RK_NODE_MSG_SNAP_MEM) {
        rk_err e = {0};
        assert_int_equal(rk_node_snap_mem_parse(payload, len, &c->mem, &e), RK_OK);
        c->nmem++;
        return 0;
    }
    assert_true(c->n < MSGS_MAX);
    msg *m = &c->m[c->n++];
    m->type = type;
    m->len = len;
    m->payload = malloc(len ? len : 1);
    assert_non_null(m->payload);
    memcpy(m->payload, payload, len);
    return 0;
}

static void cap_free(cap *c)
{
    for (int i = 0; i < c->n; i++)
        free(c->m[i].payload);
    c->n = 0;
}

static int count_type(const cap *c, uint8_t type)
{
    int n = 0;
    for (int i = 0; i < c->n; i++)
        n += c->m[i].type == type;
    return n;
}

static rk_node_snap snap_of(const msg *m)
{
    rk_node_snap s;
    rk_err e = {0};
    assert_int_equal(rk_node_snap_parse(m->payload, m->len, &s, &e), RK_OK);
    return s;
}

/* Feed every captured message (of `skip_data`: all but that DATA piece, 1-based; 0 none) to p. */
static void feed(rk_partner *p, const cap *in, int skip_data, cap *out)
{
    int data = 0;
    for (int i = 0; i < in->n; i++) {
        if (in->m[i].type == RK_NODE_MSG_SNAP_DATA && ++data == skip_data)
            continue;
        assert_int_equal(
            rk_partner_msg(p, in->m[i].type, in->m[i].payload, in->m[i].len, capture, out), 0);
    }
}

/* A snapshot directory of the job on a "node", made in the test's directory. */
static void node_dir(char *out, size_t size)
{
    rk_err e = {0};
    assert_int_equal(rk_snap_dir_make(g_dir, out, size, &e), RK_OK);
}

/* Rank `rank`'s generation of `step` in dir (a model of 200,000 floats: several pieces), and
 * its pin when `pin`. */
static void put(const char *dir, int rank, int64_t step, int pin)
{
    static float w[200000];
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        w[i] = (float)(i % 977) * 0.001f + (float)step;
    int64_t shape[1] = {(int64_t)(sizeof w / sizeof w[0])};
    rk_ckpt_item it = {"model.w", "F32", 1, shape, w};
    rk_ckpt_meta m = {.step = step, .world_size = 4, .config_json = "{}"};
    rk_err e = {0};
    assert_int_equal(rk_snap_put(dir, rank, &m, &it, 1, &e), RK_OK);
    if (pin)
        assert_int_equal(rk_snap_pin(dir, rank, step, &e), RK_OK);
}

/* The bytes of a file, and its size. */
static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

/* Entries of a directory other than . and ..; -1 if it does not exist. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* Pump until the generation in flight went (one turn takes it whole: many pieces). */
static void pump_all(rk_partner *p, cap *out)
{
    assert_int_equal(rk_partner_pump(p, 1000, capture, out), 0);
    assert_false(rk_partner_sending(p));
}

static void test_stream_hold_fetch(void **state)
{
    (void)state;
    char a[RK_SNAP_PATH_MAX], b[RK_SNAP_PATH_MAX], c[RK_SNAP_PATH_MAX], path[RK_SNAP_PATH_MAX + 96],
        path2[RK_SNAP_PATH_MAX + 96];
    node_dir(a, sizeof a);
    node_dir(b, sizeof b);
    node_dir(c, sizeof c);
    put(a, 2, 10, 1);
    put(a, 2, 11, 0); /* a newer generation, not pinned: not sent */
    rk_partner *pa, *pb, *pc;
    rk_err e = {0};
    assert_int_equal(rk_partner_new(&pa, a, 1, NULL, NULL, &e), RK_OK);
    assert_int_equal(rk_partner_new(&pb, b, 2, NULL, NULL, &e), RK_OK);
    assert_int_equal(rk_partner_new(&pc, c, 3, NULL, NULL, &e), RK_OK);
    cap out = {0}, held = {0}, back = {0}, kept = {0};
    pump_all(pa, &out);
    assert_true(out.n >= 4); /* BEGIN, several pieces, END */
    assert_int_equal(out.m[0].type, RK_NODE_MSG_SNAP_BEGIN);
    assert_int_equal(out.m[out.n - 1].type, RK_NODE_MSG_SNAP_END);
    assert_true(count_type(&out, RK_NODE_MSG_SNAP_DATA) >= 2);
    rk_node_snap s = snap_of(&out.m[0]);
    assert_int_equal(s.kind, RK_NODE_SNAP_PUSH);
    assert_int_equal(s.node, 1);
    assert_int_equal(s.rank, 2);
    assert_int_equal(s.step, 10);
    /* the partner keeps it under held/, verified, and says so */
    feed(pb, &out, 0, &held);
    assert_int_equal(held.n, 1);
    assert_int_equal(held.m[0].type, RK_NODE_MSG_SNAP_HELD);
    rk_node_snap h = snap_of(&held.m[0]);
    assert_memory_equal(&h, &s, sizeof h);
    snprintf(path, sizeof path, "%s/held", b);
    assert_int_equal(rk_snap_get(path, 2, 10, NULL, &e), RK_OK);
    assert_int_equal(entries(path), 1); /* rank-2 only */
    snprintf(path, sizeof path, "%s/rank-2/pin-000000000010.safetensors", a);
    snprintf(path2, sizeof path2, "%s/held/rank-2/snap-000000000010.safetensors", b);
    size_t n1, n2;
    uint8_t *x1 = slurp(path, &n1), *x2 = slurp(path2, &n2);
    assert_int_equal(n1, n2);
    assert_int_equal(n1, s.bytes);
    assert_memory_equal(x1, x2, n1);
    /* each node says its snapshot memory: a's two generations of rank 2 (the pin is a hard
     * link of one, counted once), b's partner copy under held/ */
    uint64_t own_a, held_b;
    assert_int_equal(rk_snap_bytes(a, &own_a, &e), RK_OK);
    assert_int_equal(out.nmem, 1);
    assert_true(out.mem.own == (int64_t)own_a && own_a >= 2 * s.bytes && out.mem.held == 0);
    snprintf(path, sizeof path, "%s/held", b);
    assert_int_equal(rk_snap_bytes(path, &held_b, &e), RK_OK);
    assert_int_equal(held_b, s.bytes);
    assert_int_equal(rk_partner_pump(pb, 1000, capture, &held), 0);
    assert_int_equal(held.nmem, 1);
    assert_true(held.mem.own == 0 && held.mem.held == (int64_t)s.bytes);
    /* nothing new: nothing sent, the memory not said again within the second */
    cap_free(&out);
    out.nmem = 0;
    assert_int_equal(rk_partner_pump(pa, 1000, capture, &out), 0);
    assert_int_equal(out.n, 0);
    assert_int_equal(out.nmem, 0);
    /* a new link: said again at once */
    rk_partner_link_lost(pa);
    assert_int_equal(rk_partner_pump(pa, 1000, capture, &out), 0);
    assert_int_equal(out.nmem, 1);
    /* fetched back (under the coordinator's number) onto a third node: the rank's own there */
    rk_node_snap f = s;
    f.xfer = 77;
    f.kind = RK_NODE_SNAP_FETCH;
    char p[RK_NODE_PAYLOAD_MAX];
    size_t len;
    assert_int_equal(rk_node_snap_format(&f, p, sizeof p, &len, &e), RK_OK);
    assert_int_equal(
        rk_partner_msg(pb, RK_NODE_MSG_SNAP_FETCH, (const uint8_t *)p, len, capture, &back), 0);
    assert_true(rk_partner_sending(pb));
    pump_all(pb, &back);
    rk_node_snap fb = snap_of(&back.m[0]);
    assert_int_equal(back.m[0].type, RK_NODE_MSG_SNAP_BEGIN);
    assert_memory_equal(&fb, &f, sizeof fb);
    feed(pc, &back, 0, &kept);
    assert_int_equal(kept.n, 1);
    assert_int_equal(kept.m[0].type, RK_NODE_MSG_SNAP_HELD);
    assert_int_equal(snap_of(&kept.m[0]).kind, RK_NODE_SNAP_FETCH);
    assert_int_equal(rk_snap_get(c, 2, 10, NULL, &e), RK_OK);
    snprintf(path2, sizeof path2, "%s/rank-2/snap-000000000010.safetensors", c);
    free(x2);
    x2 = slurp(path2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(x1, x2, n1);
    snprintf(path, sizeof path, "%s/held", c);
    assert_int_equal(entries(path), -1); /* a fetched copy is the rank's own, not held */
    free(x1);
    free(x2);
    cap_free(&out);
    cap_free(&held);
    cap_free(&back);
    cap_free(&kept);
    rk_partner_free(pa);
    rk_partner_free(pb);
    rk_partner_free(pc);
}

static void test_torn_and_corrupt_never_kept(void **state)
{
    (void)state;
    char a[RK_SNAP_PATH_MAX], b[RK_SNAP_PATH_MAX], held[RK_SNAP_PATH_MAX + 32];
    node_dir(a, sizeof a);
    node_dir(b, sizeof b);
    snprintf(held, sizeof held, "%s/held/rank-1", b);
    put(a, 1, 20, 1);
    rk_partner *pa, *pb;
    rk_err e = {0};
    assert_int_equal(rk_partner_new(&pa, a, 0, NULL, NULL, &e), RK_OK);
    assert_int_equal(rk_partner_new(&pb, b, 1, NULL, NULL, &e), RK_OK);
    cap out = {0}, ack = {0};
    pump_all(pa, &out);
    /* a piece missing: the end finds a hole: not kept, not acknowledged, no file left */
    feed(pb, &out, 2, &ack);
    assert_int_equal(ack.n, 0);
    assert_int_equal(entries(held), 0);
    /* a byte changed on the way: the checksums refuse it */
    for (int i = 0; i < out.n; i++)
        if (out.m[i].type == RK_NODE_MSG_SNAP_DATA && out.m[i].len > 1000) {
            out.m[i].payload[out.m[i].len - 500] ^= 0x40;
            break;
        }
    feed(pb, &out, 0, &ack);
    assert_int_equal(ack.n, 0);
    assert_int_equal(entries(held), 0);
    /* the link lost in the middle: the half received is removed */
    for (int i = 0; i < out.n - 2; i++)
        assert_int_equal(
            rk_partner_msg(pb, out.m[i].type, out.m[i].payload, out.m[i].len, capture, &ack), 0);
    assert_int_equal(entries(held), 1); /* the temporary file */
    rk_partner_link_lost(pb);
    assert_int_equal(entries(held), 0);
    assert_int_equal(ack.n, 0);
    /* and one whole copy is still kept after all that */
    for (int i = 0; i < out.n; i++)
        if (out.m[i].type == RK_NODE_MSG_SNAP_DATA && out.m[i].len > 1000) {
            out.m[i].payload[out.m[i].len - 500] ^= 0x40;
            break;
        }
    feed(pb, &out, 0, &ack);
    assert_int_equal(ack.n, 1);
    assert_int_equal(entries(held), 1);
    cap_free(&out);
    cap_free(&ack);
    rk_partner_free(pa);
    rk_partner_free(pb);
}

static void test_fetch_of_nothing_and_bad_messages(void **state)
{
    (void)state;
    char b[RK_SNAP_PATH_MAX];
    node_dir(b, sizeof b);
    rk_partner *pb;
    rk_err e = {0};
    assert_int_equal(rk_partner_new(&pb, b, 1, NULL, NULL, &e), RK_OK);
    cap out = {0};
    rk_node_snap f = {
        .xfer = 5, .kind = RK_NODE_SNAP_FETCH, .node = 0, .rank = 3, .step = 99, .bytes = 4096};
    char p[RK_NODE_PAYLOAD_MAX];
    size_t len;
    assert_int_equal(rk_node_snap_format(&f, p, sizeof p, &len, &e), RK_OK);
    assert_int_equal(
        rk_partner_msg(pb, RK_NODE_MSG_SNAP_FETCH, (const uint8_t *)p, len, capture, &out), 0);
    assert_int_equal(rk_partner_pump(pb, 1000, capture, &out), 0);
    /* an end without a start: the coordinator hears it cannot come */
    assert_int_equal(out.n, 1);
    assert_int_equal(out.m[0].type, RK_NODE_MSG_SNAP_END);
    rk_node_snap g = snap_of(&out.m[0]);
    assert_memory_equal(&g, &f, sizeof g);
    /* a fetch of the wrong kind is dropped; garbage is refused */
    f.kind = RK_NODE_SNAP_PUSH;
    assert_int_equal(rk_node_snap_format(&f, p, sizeof p, &len, &e), RK_OK);
    assert_int_equal(
        rk_partner_msg(pb, RK_NODE_MSG_SNAP_FETCH, (const uint8_t *)p, len, capture, &out), 0);
    assert_false(rk_partner_sending(pb));
    assert_int_equal(
        rk_partner_msg(pb, RK_NODE_MSG_SNAP_BEGIN, (const uint8_t *)"x=1\n", 4, capture, &out), -1);
    assert_int_equal(
        rk_partner_msg(pb, RK_NODE_MSG_SNAP_DATA, (const uint8_t *)"abc", 3, capture, &out), -1);
    /* pieces of a transfer never begun are dropped */
    uint8_t d[RK_NODE_SNAP_DATA_HDR + 4];
    rk_node_snap_data_header(9, 0, d);
    memcpy(d + RK_NODE_SNAP_DATA_HDR, "abcd", 4);
    assert_int_equal(rk_partner_msg(pb, RK_NODE_MSG_SNAP_DATA, d, sizeof d, capture, &out), 0);
    assert_int_equal(out.n, 1);
    cap_free(&out);
    rk_partner_free(pb);
}

/* Pump `pieces` a turn until something was sent (the scans come every RK_PARTNER_SCAN_S), at
 * most 10 s: pump_some takes a generation whole, pump_one its BEGIN and a first piece. */
static void pump_until(rk_partner *p, int pieces, cap *out)
{
    for (int i = 0; i < 1000 && out->n == 0; i++) {
        assert_int_equal(rk_partner_pump(p, pieces, capture, out), 0);
        if (out->n == 0)
            poll(NULL, 0, 10);
    }
    assert_true(out->n > 0);
}

static void pump_some(rk_partner *p, cap *out)
{
    pump_until(p, 1000, out);
}

static void pump_one(rk_partner *p, cap *out)
{
    pump_until(p, 1, out);
}

static void test_fetch_first_and_rollback(void **state)
{
    (void)state;
    char a[RK_SNAP_PATH_MAX], b[RK_SNAP_PATH_MAX], held[RK_SNAP_PATH_MAX + 32],
        pin[RK_SNAP_PATH_MAX + 96];
    node_dir(a, sizeof a);
    node_dir(b, sizeof b);
    snprintf(held, sizeof held, "%s/held/rank-0", b);
    put(a, 0, 20, 1);
    rk_partner *pa, *pb;
    rk_err e = {0};
    assert_int_equal(rk_partner_new(&pa, a, 0, NULL, NULL, &e), RK_OK);
    assert_int_equal(rk_partner_new(&pb, b, 1, NULL, NULL, &e), RK_OK);
    cap out = {0}, ack = {0};
    /* a push half sent when a fetch comes: the push is given up (an END that does not match
     * its start), the fetch answered (here: SNAP_END alone, pa holds nothing) */
    assert_int_equal(rk_partner_pump(pa, 1, capture, &out), 0);
    assert_true(rk_partner_sending(pa));
    rk_node_snap f = {.xfer = 0x80000001u,
                      .kind = RK_NODE_SNAP_FETCH,
                      .node = 2,
                      .rank = 4,
                      .step = 7,
                      .bytes = 100};
    char p[RK_NODE_PAYLOAD_MAX];
    size_t len;
    assert_int_equal(rk_node_snap_format(&f, p, sizeof p, &len, &e), RK_OK);
    assert_int_equal(
        rk_partner_msg(pa, RK_NODE_MSG_SNAP_FETCH, (const uint8_t *)p, len, capture, &out), 0);
    assert_int_equal(rk_partner_pump(pa, 1000, capture, &out), 0);
    assert_int_equal(out.m[0].type, RK_NODE_MSG_SNAP_BEGIN);
    assert_int_equal(out.m[1].type, RK_NODE_MSG_SNAP_DATA);
    assert_int_equal(out.m[2].type, RK_NODE_MSG_SNAP_END);
    assert_int_equal(out.m[3].type, RK_NODE_MSG_SNAP_END);
    assert_int_equal(snap_of(&out.m[3]).kind, RK_NODE_SNAP_FETCH);
    feed(pb, &out, 0, &ack); /* the given-up push is dropped, nothing kept or acknowledged */
    assert_int_equal(ack.n, 0);
    assert_int_equal(entries(held), 0);
    /* and the pin is sent again, whole, at the next scan (every 0.2 s) */
    cap_free(&out);
    pump_some(pa, &out);
    assert_int_equal(out.m[0].type, RK_NODE_MSG_SNAP_BEGIN);
    assert_int_equal(snap_of(&out.m[0]).step, 20);
    feed(pb, &out, 0, &ack);
    assert_int_equal(ack.n, 1);
    /* rolled back below what was sent (pin 20 gone with its timeline, pin 10 new): 10 goes */
    snprintf(pin, sizeof pin, "%s/rank-0/pin-000000000020.safetensors", a);
    assert_int_equal(unlink(pin), 0);
    put(a, 0, 10, 1);
    cap_free(&out);
    pump_some(pa, &out);
    assert_int_equal(snap_of(&out.m[0]).step, 10);
    cap_free(&out);
    cap_free(&ack);
    rk_partner_free(pa);
    rk_partner_free(pb);
}

/* A generation is sent from its open file, a piece at a time: its pin and generation removed
 * after the first piece (the job went on), it still arrives whole and is kept; a file cut
 * short under the sender is given up (an END that does not match: nothing kept) and sent again
 * whole when the next scan finds a pin. */
static void test_sent_from_the_open_file(void **state)
{
    (void)state;
    char a[RK_SNAP_PATH_MAX], b[RK_SNAP_PATH_MAX], held[RK_SNAP_PATH_MAX + 32],
        pin[RK_SNAP_PATH_MAX + 96], gen[RK_SNAP_PATH_MAX + 96];
    node_dir(a, sizeof a);
    node_dir(b, sizeof b);
    snprintf(held, sizeof held, "%s/held", b);
    snprintf(pin, sizeof pin, "%s/rank-1/pin-000000000030.safetensors", a);
    snprintf(gen, sizeof gen, "%s/rank-1/snap-000000000030.safetensors", a);
    put(a, 1, 30, 1);
    rk_partner *pa, *pb;
    rk_err e = {0};
    assert_int_equal(rk_partner_new(&pa, a, 0, NULL, NULL, &e), RK_OK);
    assert_int_equal(rk_partner_new(&pb, b, 1, NULL, NULL, &e), RK_OK);
    cap out = {0}, ack = {0};
    assert_int_equal(rk_partner_pump(pa, 1, capture, &out), 0); /* BEGIN and a piece */
    assert_true(rk_partner_sending(pa));
    assert_int_equal(unlink(pin), 0);
    assert_int_equal(unlink(gen), 0);
    pump_all(pa, &out);
    assert_int_equal(out.m[out.n - 1].type, RK_NODE_MSG_SNAP_END);
    feed(pb, &out, 0, &ack);
    assert_int_equal(ack.n, 1);
    assert_int_equal(ack.m[0].type, RK_NODE_MSG_SNAP_HELD);
    assert_int_equal(rk_snap_get(held, 1, 30, NULL, &e), RK_OK);
    /* a pin cut short under the sender: given up, nothing kept, sent again whole later */
    put(a, 1, 40, 1);
    snprintf(pin, sizeof pin, "%s/rank-1/pin-000000000040.safetensors", a);
    struct stat st;
    assert_int_equal(stat(pin, &st), 0);
    cap_free(&out);
    cap_free(&ack);
    pump_one(pa, &out); /* BEGIN and a piece of step 40 */
    assert_int_equal(snap_of(&out.m[0]).step, 40);
    assert_true(rk_partner_sending(pa));
    assert_int_equal(truncate(pin, st.st_size / 2), 0);
    pump_all(pa, &out);
    rk_node_snap begin = snap_of(&out.m[0]), end = snap_of(&out.m[out.n - 1]);
    assert_int_equal(out.m[out.n - 1].type, RK_NODE_MSG_SNAP_END);
    assert_true(end.bytes != begin.bytes); /* an END that does not match */
    feed(pb, &out, 0, &ack);
    assert_int_equal(ack.n, 0);
    assert_int_not_equal(rk_snap_get(held, 1, 40, NULL, &e), RK_OK);
    assert_int_equal(truncate(pin, 0), 0); /* the store's put would not; the test's own */
    assert_int_equal(unlink(pin), 0);
    put(a, 1, 50, 1); /* the next pin goes whole */
    cap_free(&out);
    pump_some(pa, &out);
    pump_all(pa, &out);
    assert_int_equal(snap_of(&out.m[0]).step, 50);
    feed(pb, &out, 0, &ack);
    assert_int_equal(ack.n, 1);
    assert_int_equal(rk_snap_get(held, 1, 50, NULL, &e), RK_OK);
    cap_free(&out);
    cap_free(&ack);
    rk_partner_free(pa);
    rk_partner_free(pb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stream_hold_fetch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torn_and_corrupt_never_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fetch_of_nothing_and_bad_messages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fetch_first_and_rollback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sent_from_the_open_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
