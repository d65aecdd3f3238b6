/*
 * Tests for rekindle/heartbeat.h: every message type goes through a real Unix socket in a temp
 * directory (the client writes, the test reads lines and parses them) with the documented wire
 * form; a non-finite loss travels as null; finite numbers come back bit for bit; commands from
 * the supervisor side reach rk_hb_poll; a supervisor that goes makes the client dead with one
 * RK_EIO and no SIGPIPE; bad arguments send nothing; details are cleaned; broken lines are
 * RK_EFORMAT naming the field; the line splitter copes with any chunking; lines from two
 * threads, and lines interrupted by signals, arrive whole.
 */
#define _GNU_SOURCE /* RTLD_NEXT */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rekindle/heartbeat.h"
#include "testutil.h"

static char g_dir[512];
static char g_sock[600];

static int setup(void **state)
{
    (void)state;
    unsetenv(RK_HB_ENV);
    int rc = test_dir_make(g_dir, sizeof g_dir, "test_heartbeat");
    snprintf(g_sock, sizeof g_sock, "%s/hb.sock", g_dir);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    unsetenv(RK_HB_ENV);
    rm_tree(g_dir);
    return 0;
}

/* ---- short writes and EINTR on demand ---------------------------------------------------- */

/* This send() stands in for libc's (librekindle's calls bind to the executable's definition).
 * While g_chop is set, sends with MSG_NOSIGNAL (the library's; the test itself writes with
 * write()) fail with EINTR one call in three and otherwise pass 1 to 13 bytes, yielding after
 * each: short writes, EINTR and two threads meeting in the middle of a line become certain
 * instead of rare. g_chopped counts the calls it cut, proving it ran. */
static ssize_t (*real_send)(int, const void *, size_t, int);
static atomic_int g_chop;
static atomic_long g_chopped;

ssize_t send(int fd, const void *buf, size_t n, int flags)
{
    if (!atomic_load(&g_chop) || !(flags & MSG_NOSIGNAL) || n == 0)
        return real_send(fd, buf, n, flags);
    static _Thread_local unsigned x = 12345;
    x = x * 1103515245u + 12345u;
    if ((x >> 16) % 3 == 0) {
        atomic_fetch_add(&g_chopped, 1);
        errno = EINTR;
        return -1;
    }
    size_t k = 1 + (x >> 8) % 13;
    if (k < n) {
        n = k;
        atomic_fetch_add(&g_chopped, 1);
    }
    ssize_t r = real_send(fd, buf, n, flags);
    sched_yield();
    return r;
}

/* ---- the supervisor's side -------------------------------------------------------------- */

/* A listening socket at g_sock, named in RK_HEARTBEAT. */
static int listen_here(void)
{
    unlink(g_sock);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    assert_true(strlen(g_sock) < sizeof a.sun_path);
    strcpy(a.sun_path, g_sock);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(setenv(RK_HB_ENV, g_sock, 1), 0);
    return fd;
}

/* One accepted connection, its bytes split into lines kept in a ring. */
#define RING 64
typedef struct conn {
    int fd;
    rk_hb_lines split;
    char line[RING][RK_HB_LINE_MAX];
    size_t len[RING];
    int head, count;
} conn;

static int push_line(void *ctx, const char *line, size_t len)
{
    conn *c = ctx;
    if (c->count >= RING)
        return -1; /* cannot happen with reads of 1024 bytes; fails the read */
    int i = (c->head + c->count) % RING;
    memcpy(c->line[i], line, len + 1);
    c->len[i] = len;
    c->count++;
    return 0;
}

static conn *accept_conn(int lfd)
{
    conn *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->fd = accept(lfd, NULL, NULL);
    assert_true(c->fd >= 0);
    struct timeval tv = {20, 0}; /* a line that never comes fails the test, not hangs it */
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return c;
}

static void conn_free(conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

/* The next line the client sent (without its newline) into out[RK_HB_LINE_MAX]; its length,
 * or -1 if none comes (no cmocka calls: helper threads use this). */
static ssize_t try_next_line(conn *c, char *out)
{
    while (c->count == 0) {
        char buf[1024]; /* small reads keep the ring from overflowing */
        ssize_t r = recv(c->fd, buf, sizeof buf, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || rk_hb_lines_feed(&c->split, buf, (size_t)r, push_line, c, NULL) != RK_OK)
            return -1;
    }
    size_t len = c->len[c->head];
    memcpy(out, c->line[c->head], len + 1);
    c->head = (c->head + 1) % RING;
    c->count--;
    return (ssize_t)len;
}

static size_t next_line(conn *c, char *out)
{
    ssize_t len = try_next_line(c, out);
    if (len < 0)
        fail_msg("no line from the client (%s)", strerror(errno));
    return (size_t)len;
}

/* The next line, parsed; its text into raw (may be NULL). */
static void next_msg(conn *c, rk_hb_msg *m, char *raw)
{
    char line[RK_HB_LINE_MAX];
    size_t len = next_line(c, line);
    rk_err err = {0};
    int rc = rk_hb_msg_parse(line, len, m, &err);
    if (rc)
        fail_msg("parse '%s': %s", line, err.msg);
    if (raw)
        memcpy(raw, line, len + 1);
}

static void say(conn *c, const char *text)
{
    size_t n = strlen(text);
    assert_int_equal(write(c->fd, text, n), (ssize_t)n);
}

/* Open a client as rank 2 of 4 and the supervisor's end of it (hello already read). */
static rk_hb *open_pair(int lfd, conn **out)
{
    rk_hb *h = NULL;
    rk_err err = {0};
    int rc = rk_hb_open(&h, 2, 4, "cuda:2", 0, &err);
    if (rc)
        fail_msg("rk_hb_open: %s", err.msg);
    assert_non_null(h);
    *out = accept_conn(lfd);
    rk_hb_msg m;
    next_msg(*out, &m, NULL);
    assert_int_equal(m.type, RK_HB_HELLO);
    return h;
}

static bool same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* ---- round trips ------------------------------------------------------------------------ */

/* Every message type the client sends arrives as the documented line and parses back to the
 * values sent. */
static void test_every_message_type_round_trips_over_a_unix_socket(void **state)
{
    (void)state;
    int lfd = listen_here();
    rk_hb *h = NULL;
    rk_err err = {0};
    assert_int_equal(rk_hb_open(&h, 2, 4, "cuda:2", 120, &err), RK_OK);
    assert_non_null(h);
    assert_int_equal(rk_hb_alive(h), 1);
    conn *c = accept_conn(lfd);
    rk_hb_msg m;
    char raw[RK_HB_LINE_MAX], want[RK_HB_LINE_MAX];

    next_msg(c, &m, raw);
    snprintf(want, sizeof want,
             "{\"type\":\"hello\",\"v\":1,\"rank\":2,\"world\":4,\"pid\":%ld,\"device\":\"cuda:2\","
             "\"step\":120}",
             (long)getpid());
    assert_string_equal(raw, want);
    assert_int_equal(m.type, RK_HB_HELLO);
    assert_int_equal(m.version, RK_HB_VERSION);
    assert_int_equal(m.rank, 2);
    assert_int_equal(m.world, 4);
    assert_int_equal(m.pid, (long)getpid());
    assert_string_equal(m.device, "cuda:2");
    assert_int_equal(m.step, 120);

    assert_int_equal(rk_hb_step(h, 121, 0.53, 0.031), RK_OK);
    next_msg(c, &m, raw);
    assert_string_equal(raw,
                        "{\"type\":\"step\",\"rank\":2,\"step\":121,\"loss\":0.53,\"dt\":0.031}");
    assert_int_equal(m.type, RK_HB_STEP);
    assert_int_equal(m.rank, 2);
    assert_int_equal(m.step, 121);
    assert_true(m.loss_finite);
    assert_true(m.loss == 0.53 && m.dt == 0.031);

    assert_int_equal(rk_hb_comm(h, 122), RK_OK);
    next_msg(c, &m, raw);
    assert_string_equal(raw, "{\"type\":\"comm\",\"rank\":2,\"step\":122}");
    assert_int_equal(m.type, RK_HB_COMM);
    assert_int_equal(m.step, 122);

    const char *detail = "grad norm \"inf\" in fc1\\weight, ünïcode ok";
    assert_int_equal(rk_hb_event(h, 122, "nan", 3, "redo", 1, detail), RK_OK);
    next_msg(c, &m, raw);
    assert_string_equal(raw,
                        "{\"type\":\"event\",\"rank\":2,\"step\":122,\"kind\":\"nan\",\"blame\":3,"
                        "\"action\":\"redo\",\"lost_steps\":1,\"detail\":\"grad norm "
                        "\\\"inf\\\" in fc1\\\\weight, ünïcode ok\"}");
    assert_int_equal(m.type, RK_HB_EVENT);
    assert_string_equal(m.kind, "nan");
    assert_int_equal(m.blame, 3);
    assert_string_equal(m.action, "redo");
    assert_int_equal(m.lost_steps, 1);
    assert_string_equal(m.detail, detail);

    assert_int_equal(rk_hb_event(h, 123, "suspect_slow", -1, "none", 0, NULL), RK_OK);
    next_msg(c, &m, NULL);
    assert_int_equal(m.blame, -1);
    assert_string_equal(m.detail, "");

    assert_int_equal(rk_hb_ckpt(h, 130, 0.0125), RK_OK);
    next_msg(c, &m, raw);
    assert_string_equal(raw, "{\"type\":\"ckpt\",\"rank\":2,\"step\":130,\"seconds\":0.0125}");
    assert_int_equal(m.type, RK_HB_CKPT);
    assert_int_equal(m.step, 130);
    assert_true(m.seconds == 0.0125);

    assert_int_equal(rk_hb_inject(h, 131, 7, "crash"), RK_OK);
    next_msg(c, &m, raw);
    assert_string_equal(
        raw, "{\"type\":\"inject\",\"rank\":2,\"step\":131,\"index\":7,\"kind\":\"crash\"}");
    assert_int_equal(m.type, RK_HB_INJECT);
    assert_int_equal(m.index, 7);
    assert_string_equal(m.kind, "crash");

    assert_int_equal(rk_hb_bye(h, 938, "stopped"), RK_OK);
    next_msg(c, &m, NULL);
    assert_int_equal(m.type, RK_HB_BYE);
    assert_string_equal(m.status, "stopped");
    assert_int_equal(rk_hb_bye(h, 938, "done"), RK_OK);
    next_msg(c, &m, raw);
    assert_string_equal(raw, "{\"type\":\"bye\",\"rank\":2,\"step\":938,\"status\":\"done\"}");
    assert_int_equal(m.step, 938);

    assert_int_equal(rk_hb_error(h, &err), RK_OK); /* nothing went wrong */
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

/* Without RK_HEARTBEAT (unset or empty) there is no supervisor: a NULL handle, and every call
 * on it succeeds without doing anything. */
static void test_without_rk_heartbeat_the_handle_is_null_and_calls_are_noops(void **state)
{
    (void)state;
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            setenv(RK_HB_ENV, "", 1);
        else
            unsetenv(RK_HB_ENV);
        rk_hb *h = (rk_hb *)&pass; /* must be overwritten */
        rk_err err = {0};
        assert_int_equal(rk_hb_open(&h, 0, 1, "0", 0, &err), RK_OK);
        assert_null(h);
        assert_int_equal(rk_hb_step(h, 1, NAN, -1), RK_OK);
        assert_int_equal(rk_hb_comm(h, 1), RK_OK);
        assert_int_equal(rk_hb_event(h, 1, "BAD KIND", -7, "x", 0, "d"), RK_OK);
        assert_int_equal(rk_hb_ckpt(h, 1, 0), RK_OK);
        assert_int_equal(rk_hb_inject(h, 1, 0, "crash"), RK_OK);
        assert_int_equal(rk_hb_bye(h, 1, "done"), RK_OK);
        rk_hb_cmd cmd = RK_HB_CMD_STOP;
        assert_int_equal(rk_hb_poll(h, &cmd), RK_OK);
        assert_int_equal(cmd, RK_HB_CMD_NONE);
        assert_int_equal(rk_hb_alive(h), 0);
        assert_int_equal(rk_hb_error(h, &err), RK_OK);
        rk_hb_close(h);
    }
}

/* No supervisor listening at the path: RK_EIO naming the path; bad arguments: RK_EINVAL
 * naming the field or variable. Never a handle. */
static void test_open_failures_name_the_path_or_field(void **state)
{
    (void)state;
    char path[700];
    snprintf(path, sizeof path, "%s/nobody.sock", g_dir);
    setenv(RK_HB_ENV, path, 1);
    rk_hb *h = NULL;
    rk_err err = {0};
    assert_int_equal(rk_hb_open(&h, 0, 1, "0", 0, &err), RK_EIO);
    assert_null(h);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "RK_HEARTBEAT"));

    int lfd = listen_here();
    assert_int_equal(rk_hb_open(&h, 4, 4, "0", 0, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "field \"rank\""));
    assert_int_equal(rk_hb_open(&h, 0, 0, "0", 0, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "field \"world\""));
    assert_int_equal(rk_hb_open(&h, 0, 1, "0", -1, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "field \"step\""));
    assert_int_equal(rk_hb_open(&h, 0, 1, "gpu\n0", 0, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "field \"device\""));
    char longdev[80];
    memset(longdev, 'd', 64);
    longdev[64] = '\0';
    assert_int_equal(rk_hb_open(&h, 0, 1, longdev, 0, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "device"));
    char longpath[300];
    memset(longpath, 'p', 200);
    longpath[0] = '/';
    longpath[200] = '\0';
    setenv(RK_HB_ENV, longpath, 1);
    assert_int_equal(rk_hb_open(&h, 0, 1, "0", 0, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "too long"));
    assert_null(h);
    close(lfd);
}

/* NaN and both infinities are sent as null and read as loss_finite false; finite values
 * (tiny, huge, subnormal, negative zero, thirds) come back with the same bits. */
static void test_non_finite_loss_is_null_and_finite_numbers_keep_their_bits(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);
    rk_hb_msg m;
    char raw[RK_HB_LINE_MAX];
    const double bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(rk_hb_step(h, (int64_t)i, bad[i], 0.5), RK_OK);
        next_msg(c, &m, raw);
        assert_non_null(strstr(raw, "\"loss\":null"));
        assert_false(m.loss_finite);
        assert_true(isnan(m.loss));
        assert_true(m.dt == 0.5);
    }
    const double good[] = {
        0.1,     1.0 / 3.0, -0.0,          0.0,     1e-300, DBL_MAX, -DBL_MAX,
        DBL_MIN, 4.9e-324,  123456789.125, -2.5e17, 1.0,    1e16,    12345678901234567.0,
        1e-7,    2.0 / 3.0};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        double dt = fabs(good[i]);
        assert_int_equal(rk_hb_step(h, 7, good[i], dt), RK_OK);
        next_msg(c, &m, raw);
        assert_true(m.loss_finite);
        if (!same_bits(m.loss, good[i]) || !same_bits(m.dt, dt))
            fail_msg("%.17g (dt %.17g) came back as %.17g (dt %.17g): %s", good[i], dt, m.loss,
                     m.dt, raw);
        assert_int_equal(rk_hb_ckpt(h, 7, dt), RK_OK);
        next_msg(c, &m, NULL);
        assert_true(same_bits(m.seconds, dt));
    }
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

/* rk_hb_msg_format then rk_hb_msg_parse gives back every field, for seeded random messages
 * of every type with values across their whole ranges. */
static void test_format_then_parse_gives_the_same_message(void **state)
{
    (void)state;
    srand(12345);
    for (int i = 0; i < 20000; i++) {
        rk_hb_msg a;
        memset(&a, 0, sizeof a);
        a.type = (rk_hb_type)(i % 8);
        a.rank = rand() % 65536;
        a.step = ((int64_t)rand() << 31 | rand()) % (i % 3 ? 1000000 : RK_HB_STEP_MAX);
        uint64_t bits = (uint64_t)rand() << 42 ^ (uint64_t)rand() << 21 ^ (uint64_t)rand();
        double x;
        memcpy(&x, &bits, sizeof x);
        if (!isfinite(x))
            x = (double)rand() / 7.0;
        switch (a.type) {
        case RK_HB_HELLO:
            a.version = 1 + rand() % 3;
            a.world = a.rank + 1 + rand() % (65536 - a.rank);
            a.pid = 1 + rand();
            snprintf(a.device, sizeof a.device, "dev-%d/é", rand());
            a.restore = (rk_hb_restore)(rand() % 4); /* unsaid, none, disk, memory */
            a.rejoin = rand() % 2;
            break;
        case RK_HB_STEP:
            a.loss_finite = i % 5 != 0;
            a.loss = a.loss_finite ? x : NAN;
            a.dt = fabs(x) * (i % 2);
            break;
        case RK_HB_EVENT:
            snprintf(a.kind, sizeof a.kind, "k_%c", 'a' + rand() % 26);
            snprintf(a.action, sizeof a.action, "skip");
            a.blame = rand() % 65537 - 1;
            a.lost_steps = rand();
            for (int j = 0, n = rand() % 513; j < n; j++)
                a.detail[j] = "ab\"\\ é"[rand() % 5];
            break;
        case RK_HB_CKPT: a.seconds = fabs(x); break;
        case RK_HB_INJECT:
            a.index = rand();
            snprintf(a.kind, sizeof a.kind, "hang");
            break;
        case RK_HB_BYE: snprintf(a.status, sizeof a.status, i % 2 ? "done" : "stopped"); break;
        case RK_HB_SAVE: a.keep = 1 + rand() % 1000; break;
        default: break;
        }
        char line[RK_HB_LINE_MAX];
        size_t len;
        rk_err err = {0};
        int rc = rk_hb_msg_format(&a, line, sizeof line, &len, &err);
        if (rc)
            fail_msg("format #%d: %s", i, err.msg);
        assert_true(len > 0 && line[len - 1] == '\n' && strlen(line) == len);
        rk_hb_msg b;
        rc = rk_hb_msg_parse(line, len - 1, &b, &err);
        if (rc)
            fail_msg("parse #%d %s: %s", i, line, err.msg);
        assert_int_equal(a.type, b.type);
        assert_int_equal(a.rank, b.rank);
        assert_int_equal(a.world, b.world);
        assert_int_equal(a.blame, b.blame);
        assert_int_equal(a.index, b.index);
        assert_int_equal(a.version, b.version);
        assert_int_equal(a.pid, b.pid);
        assert_int_equal(a.step, b.step);
        assert_int_equal(a.lost_steps, b.lost_steps);
        assert_int_equal(a.loss_finite, b.loss_finite);
        if (a.type == RK_HB_STEP && !a.loss_finite ? !isnan(b.loss) : !same_bits(a.loss, b.loss))
            fail_msg("#%d: loss %.17g came back as %.17g: %s", i, a.loss, b.loss, line);
        assert_true(same_bits(a.dt, b.dt) && same_bits(a.seconds, b.seconds));
        assert_string_equal(a.device, b.device);
        assert_string_equal(a.kind, b.kind);
        assert_string_equal(a.action, b.action);
        assert_string_equal(a.status, b.status);
        assert_string_equal(a.detail, b.detail);
        assert_int_equal(a.restore, b.restore);
        assert_int_equal(a.rejoin, b.rejoin);
        assert_int_equal(a.keep, b.keep);
    }
}

/* save (rank 0 asks rk run to write a checkpoint from the snapshots): keep 1..1000, required. */
static void test_save_line_needs_keep_in_range(void **state)
{
    (void)state;
    rk_hb_msg m;
    rk_err err = {0};
    const char *ok = "{\"type\":\"save\",\"rank\":0,\"step\":50,\"keep\":3}";
    assert_int_equal(rk_hb_msg_parse(ok, strlen(ok), &m, &err), RK_OK);
    assert_int_equal(m.type, RK_HB_SAVE);
    assert_int_equal(m.step, 50);
    assert_int_equal(m.keep, 3);
    assert_string_equal(rk_hb_type_name(RK_HB_SAVE), "save");
    const char *bad[] = {
        "{\"type\":\"save\",\"rank\":0,\"step\":50}",
        "{\"type\":\"save\",\"rank\":0,\"step\":50,\"keep\":0}",
        "{\"type\":\"save\",\"rank\":0,\"step\":50,\"keep\":1001}",
        "{\"type\":\"save\",\"rank\":0,\"step\":50,\"keep\":\"3\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        assert_int_equal(rk_hb_msg_parse(bad[i], strlen(bad[i]), &m, &err), RK_EFORMAT);
        if (!strstr(err.msg, "\"keep\""))
            fail_msg("%s: %s", bad[i], err.msg);
    }
}

/* ---- commands --------------------------------------------------------------------------- */

static rk_hb_cmd poll_ok(rk_hb *h)
{
    rk_hb_cmd cmd = (rk_hb_cmd)99;
    rk_err err = {0};
    int rc = rk_hb_poll(h, &cmd);
    if (rc) {
        rk_hb_error(h, &err);
        fail_msg("rk_hb_poll: %d %s", rc, err.msg);
    }
    return cmd;
}

/* Commands written by the supervisor reach rk_hb_poll without blocking: none, one, stop
 * winning over checkpoint (and consuming it), a command split across writes, unknown fields
 * ignored; a bad line is RK_EFORMAT naming the field and leaves valid commands pending. */
static void test_commands_from_the_supervisor_are_seen_by_poll(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);

    assert_int_equal(poll_ok(h), RK_HB_CMD_NONE);
    say(c, "{\"cmd\":\"checkpoint\"}\n");
    assert_int_equal(poll_ok(h), RK_HB_CMD_CHECKPOINT);
    assert_int_equal(poll_ok(h), RK_HB_CMD_NONE);

    say(c, "{\"cmd\":\"checkpoint\"}\n{\"cmd\":\"stop\"}\n{\"cmd\":\"checkpoint\"}\n");
    assert_int_equal(poll_ok(h), RK_HB_CMD_STOP);
    assert_int_equal(poll_ok(h), RK_HB_CMD_NONE);

    say(c, "{\"reason\":\"preempted\",\"cm");
    assert_int_equal(poll_ok(h), RK_HB_CMD_NONE);
    say(c, "d\":\"stop\",\"extra\":[1,{\"a\":null}]}\n");
    assert_int_equal(poll_ok(h), RK_HB_CMD_STOP);

    say(c, "{\"cmd\":\"reboot\"}\n{\"cmd\":\"checkpoint\"}\n");
    rk_hb_cmd cmd = RK_HB_CMD_STOP;
    assert_int_equal(rk_hb_poll(h, &cmd), RK_EFORMAT);
    assert_int_equal(cmd, RK_HB_CMD_NONE);
    rk_err err = {0};
    assert_int_equal(rk_hb_error(h, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "field \"cmd\""));
    assert_non_null(strstr(err.msg, "reboot"));
    assert_int_equal(rk_hb_alive(h), 1);
    assert_int_equal(poll_ok(h), RK_HB_CMD_CHECKPOINT);  /* kept for this call */
    assert_int_equal(rk_hb_step(h, 1, 1.0, 0.0), RK_OK); /* still connected */

    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

/* Every command the supervisor formats (rk_hb_cmd_format) is one line the worker's parser
 * reads back as the same command, both from the line (rk_hb_cmd_parse) and over the socket
 * (rk_hb_poll); NONE, a value outside the enum and a buffer too small are refused, writing
 * nothing. */
static void test_formatted_commands_read_back_on_the_worker_side(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);
    static const rk_hb_cmd cmds[] = {RK_HB_CMD_STOP, RK_HB_CMD_CHECKPOINT};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char line[RK_HB_CMD_LINE_MAX];
        size_t len = 0;
        rk_err err = {0};
        assert_int_equal(rk_hb_cmd_format(cmds[i], line, sizeof line, &len, &err), RK_OK);
        assert_int_equal(len, strlen(line));
        assert_true(len >= 2 && line[len - 1] == '\n' && memchr(line, '\n', len - 1) == NULL);
        rk_hb_cmd back = RK_HB_CMD_NONE;
        assert_int_equal(rk_hb_cmd_parse(line, len - 1, &back, &err), RK_OK);
        assert_int_equal(back, cmds[i]);
        say(c, line);
        assert_int_equal(poll_ok(h), cmds[i]);
        /* one byte short of the line and its NUL: refused, nothing written */
        char small[RK_HB_CMD_LINE_MAX];
        memset(small, 'x', sizeof small);
        assert_int_equal(rk_hb_cmd_format(cmds[i], small, len, NULL, &err), RK_EINVAL);
        assert_int_equal(small[0], '\0');
        assert_non_null(strstr(err.msg, "does not fit"));
    }
    char line[RK_HB_CMD_LINE_MAX] = "x";
    rk_err err = {0};
    assert_int_equal(rk_hb_cmd_format(RK_HB_CMD_NONE, line, sizeof line, NULL, &err), RK_EINVAL);
    assert_int_equal(line[0], '\0');
    assert_int_equal(rk_hb_cmd_format((rk_hb_cmd)42, line, sizeof line, NULL, &err), RK_EINVAL);
    assert_int_equal(rk_hb_cmd_format(RK_HB_CMD_STOP, NULL, 8, NULL, &err), RK_EINVAL);
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

/* The supervisor goes: the next send fails with RK_EIO naming the path, the process gets no
 * SIGPIPE (it runs in a child with SIGPIPE at its default action, which would kill it), and
 * every later call is an RK_OK no-op. */
static void test_supervisor_gone_makes_sends_fail_once_without_sigpipe(void **state)
{
    (void)state;
    int lfd = listen_here();
    int sync[2];
    assert_int_equal(pipe(sync), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGPIPE, SIG_DFL);
        close(sync[1]);
        rk_hb *h = NULL;
        rk_err err = {0};
        if (rk_hb_open(&h, 0, 1, "0", 0, &err) != RK_OK || !h)
            _exit(10);
        char b;
        if (read(sync[0], &b, 1) != 1) /* the supervisor has closed its end */
            _exit(11);
        if (rk_hb_step(h, 1, 0.5, 0.1) != RK_EIO)
            _exit(12);
        if (rk_hb_error(h, &err) != RK_EIO || !strstr(err.msg, g_sock) || strchr(err.msg, '\n'))
            _exit(13);
        if (rk_hb_alive(h) != 0)
            _exit(14);
        for (int i = 0; i < 100; i++)
            if (rk_hb_step(h, 2 + i, 0.5, 0.1) != RK_OK || rk_hb_bye(h, 9, "done") != RK_OK)
                _exit(15);
        rk_hb_cmd cmd = RK_HB_CMD_STOP;
        if (rk_hb_poll(h, &cmd) != RK_OK || cmd != RK_HB_CMD_NONE)
            _exit(16);
        rk_hb_close(h);
        _exit(0);
    }
    close(sync[0]);
    conn *c = accept_conn(lfd);
    rk_hb_msg m;
    next_msg(c, &m, NULL);
    assert_int_equal(m.type, RK_HB_HELLO);
    close(c->fd);
    c->fd = -1;
    assert_int_equal(write(sync[1], "x", 1), 1);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        fail_msg("the client died of signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(sync[1]);
    conn_free(c);
    close(lfd);
}

/* The supervisor says stop and closes: poll still returns the stop (RK_OK), the next poll is
 * RK_EIO, the ones after are RK_OK no-ops. Closing without a command: RK_EIO at once. */
static void test_poll_returns_a_last_command_before_reporting_the_close(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);
    say(c, "{\"cmd\":\"stop\"}\n");
    close(c->fd);
    c->fd = -1;
    assert_int_equal(poll_ok(h), RK_HB_CMD_STOP);
    rk_hb_cmd cmd = RK_HB_CMD_STOP;
    assert_int_equal(rk_hb_poll(h, &cmd), RK_EIO);
    assert_int_equal(cmd, RK_HB_CMD_NONE);
    rk_err err = {0};
    assert_int_equal(rk_hb_error(h, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "closed"));
    assert_int_equal(rk_hb_poll(h, &cmd), RK_OK);
    assert_int_equal(rk_hb_ckpt(h, 5, 0.1), RK_OK);
    assert_int_equal(rk_hb_alive(h), 0);
    rk_hb_close(h);
    conn_free(c);

    h = open_pair(lfd, &c);
    close(c->fd);
    c->fd = -1;
    assert_int_equal(rk_hb_poll(h, &cmd), RK_EIO);
    assert_int_equal(rk_hb_step(h, 1, 0, 0), RK_OK);
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

/* A supervisor that died leaves an end of file: rk_hb_alive sees it at once, without a send
 * or a poll before it (a worker asks right before it publishes a checkpoint), and keeps a
 * command that came before the close pending for the next poll. Alive while the supervisor
 * is there, with or without pending input. */
static void test_alive_sees_a_supervisor_that_closed_without_a_poll(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);
    assert_int_equal(rk_hb_alive(h), 1);
    say(c, "{\"cmd\":\"checkpoint\"}\n");
    assert_int_equal(rk_hb_alive(h), 1); /* input waiting is not a close */
    say(c, "{\"cmd\":\"stop\"}\n");
    close(c->fd);
    c->fd = -1;
    assert_int_equal(rk_hb_alive(h), 0);
    assert_int_equal(poll_ok(h), RK_HB_CMD_STOP); /* what came before the close is kept */
    rk_hb_cmd cmd = RK_HB_CMD_STOP;
    assert_int_equal(rk_hb_poll(h, &cmd), RK_EIO);
    rk_err err = {0};
    assert_int_equal(rk_hb_error(h, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "closed"));
    rk_hb_close(h);
    conn_free(c);

    /* a bad line read by rk_hb_alive is still reported by the next poll */
    h = open_pair(lfd, &c);
    say(c, "{\"cmd\":\"reboot\"}\n");
    assert_int_equal(rk_hb_alive(h), 1);
    assert_int_equal(rk_hb_poll(h, &cmd), RK_EFORMAT);
    assert_int_equal(poll_ok(h), RK_HB_CMD_NONE);
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

/* `rc` (from a call on h) is RK_EINVAL and rk_hb_error names `field`. */
static void einval_naming(rk_hb *h, int rc, const char *field, const char *call)
{
    if (rc != RK_EINVAL)
        fail_msg("%s: %d, not RK_EINVAL", call, rc);
    rk_err err = {0};
    char want[64];
    snprintf(want, sizeof want, "field \"%s\"", field);
    assert_int_equal(rk_hb_error(h, &err), RK_EINVAL);
    if (!strstr(err.msg, want))
        fail_msg("%s: '%s' does not name %s", call, err.msg, want);
}
#define EINVAL_NAMING(call, field) einval_naming(h, (call), field, #call)

/* Each bad argument is RK_EINVAL naming its field; nothing reaches the socket (the next line
 * the supervisor reads is the valid one sent after) and the handle stays alive. */
static void test_bad_send_arguments_send_nothing_and_keep_the_handle(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);
    char w32[40];
    memset(w32, 'a', 32);
    w32[32] = '\0';
    EINVAL_NAMING(rk_hb_step(h, -1, 0.5, 0.1), "step");
    EINVAL_NAMING(rk_hb_step(h, 1, 0.5, -0.1), "dt");
    EINVAL_NAMING(rk_hb_step(h, 1, 0.5, NAN), "dt");
    EINVAL_NAMING(rk_hb_step(h, 1, 0.5, INFINITY), "dt");
    EINVAL_NAMING(rk_hb_comm(h, -5), "step");
    EINVAL_NAMING(rk_hb_event(h, 1, "NaN", 0, "redo", 0, ""), "kind");
    EINVAL_NAMING(rk_hb_event(h, 1, "", 0, "redo", 0, ""), "kind");
    EINVAL_NAMING(rk_hb_event(h, 1, NULL, 0, "redo", 0, ""), "kind");
    EINVAL_NAMING(rk_hb_event(h, 1, w32, 0, "redo", 0, ""), "kind");
    EINVAL_NAMING(rk_hb_event(h, 1, "nan", 0, "re-do", 0, ""), "action");
    EINVAL_NAMING(rk_hb_event(h, 1, "nan", -2, "redo", 0, ""), "blame");
    EINVAL_NAMING(rk_hb_event(h, 1, "nan", 65536, "redo", 0, ""), "blame");
    EINVAL_NAMING(rk_hb_event(h, 1, "nan", 0, "redo", -1, ""), "lost_steps");
    EINVAL_NAMING(rk_hb_ckpt(h, 1, -1.0), "seconds");
    EINVAL_NAMING(rk_hb_ckpt(h, 1, INFINITY), "seconds");
    EINVAL_NAMING(rk_hb_inject(h, 1, -1, "crash"), "index");
    EINVAL_NAMING(rk_hb_inject(h, 1, 0, "Crash"), "kind");
    EINVAL_NAMING(rk_hb_bye(h, 1, "failed"), "status");
    EINVAL_NAMING(rk_hb_bye(h, 1, NULL), "status");
    assert_int_equal(rk_hb_alive(h), 1);
    assert_int_equal(rk_hb_comm(h, 77), RK_OK);
    rk_hb_msg m;
    next_msg(c, &m, NULL);
    assert_int_equal(m.type, RK_HB_COMM);
    assert_int_equal(m.step, 77);
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

/* A detail is cleaned, never refused: control characters (C0, DEL, C1) and bytes that are not
 * UTF-8 become '?', it is cut to at most 512 bytes on a character boundary, and quotes and
 * backslashes survive escaping. */
static void test_event_detail_is_cleaned_and_cut_on_a_character(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);
    rk_hb_msg m;

    assert_int_equal(rk_hb_event(h, 1, "nan", 0, "redo", 0,
                                 "a\nb\tc\x01"
                                 "d\x7f"
                                 "e\xc2\x85"
                                 "f\xff"
                                 "g\xe2\x82"
                                 "h\xed\xa0\x80"
                                 "i"),
                     RK_OK);
    next_msg(c, &m, NULL);
    assert_string_equal(m.detail, "a?b?c?d?e?f?g??h???i");

    char big[1200] = "";
    for (int i = 0; i < 300; i++)
        strcat(big, "é"); /* 600 bytes, 2 per character */
    assert_int_equal(rk_hb_event(h, 2, "nan", 0, "redo", 0, big), RK_OK);
    next_msg(c, &m, NULL);
    assert_int_equal(strlen(m.detail), 512);
    assert_memory_equal(m.detail, big, 512);

    big[0] = 'x'; /* "x" + a stray continuation byte + 299 é: the cut moves to 511 */
    assert_int_equal(rk_hb_event(h, 3, "nan", 0, "redo", 0, big), RK_OK);
    next_msg(c, &m, NULL);
    assert_int_equal(strlen(m.detail), 512);
    assert_memory_equal(m.detail, "x?", 2);
    memset(big, 0, sizeof big);
    big[0] = 'x';
    for (int i = 0; i < 300; i++)
        strcat(big, "é");
    assert_int_equal(rk_hb_event(h, 4, "nan", 0, "redo", 0, big), RK_OK);
    next_msg(c, &m, NULL);
    assert_int_equal(strlen(m.detail), 511);
    assert_memory_equal(m.detail, big, 511);

    memset(big, '"', 512);
    memset(big + 512, '\\', 100);
    big[612] = '\0';
    assert_int_equal(rk_hb_event(h, 5, "nan", 0, "redo", 0, big), RK_OK);
    next_msg(c, &m, NULL);
    assert_int_equal(strlen(m.detail), 512);
    assert_memory_equal(m.detail, big, 512);
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

/* ---- broken lines ----------------------------------------------------------------------- */

/* Each broken line is RK_EFORMAT with a one-line message that starts with the prefix and
 * names the field or problem; untrusted text is shown without control characters. */
static void test_broken_lines_are_rejected_naming_the_field(void **state)
{
    (void)state;
    static const char H[] = "{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":4,\"pid\":9,";
    static const char E[] = "{\"type\":\"event\",\"rank\":0,\"step\":1,";
    char longdev[256], longdetail[800], longkind[256];
    snprintf(longdev, sizeof longdev, "%s\"device\":\"%064d\",\"step\":0}", H, 0);
    snprintf(longdetail, sizeof longdetail,
             "%s\"kind\":\"nan\",\"blame\":0,\"action\":\"redo\",\"lost_steps\":0,"
             "\"detail\":\"%0513d\"}",
             E, 0);
    snprintf(longkind, sizeof longkind,
             "%s\"kind\":\"%s\",\"blame\":0,\"action\":\"redo\",\"lost_steps\":0}", E,
             "abcdefghijklmnopqrstuvwxyzabcdef");
    struct {
        const char *line;
        const char *needle;
    } cases[] = {
        {"", "not JSON"},
        {"{\"type\":\"step\"", "not JSON"},
        {"[1,2]", "not a JSON object"},
        {"\"step\"", "not a JSON object"},
        {"{\"type\":\"comm\",\"rank\":0,\"step\":1} x", "not JSON"},
        {"{\"type\":\"comm\",\"type\":\"comm\",\"rank\":0,\"step\":1}", "duplicate"},
        {"{\"rank\":0,\"step\":1}", "field \"type\": missing"},
        {"{\"type\":7}", "field \"type\": expected a string"},
        {"{\"type\":\"reboot\",\"rank\":0}", "field \"type\": unknown message type \"reboot\""},
        {"{\"type\":\"Step\",\"rank\":0}", "field \"type\": unknown message type \"Step\""},
        {"{\"type\":\"comm\",\"step\":1}", "field \"rank\": missing"},
        {"{\"type\":\"comm\",\"rank\":\"0\",\"step\":1}", "field \"rank\": expected an integer"},
        {"{\"type\":\"comm\",\"rank\":-1,\"step\":1}",
         "field \"rank\": expected an integer 0..65535"},
        {"{\"type\":\"comm\",\"rank\":65536,\"step\":1}", "field \"rank\""},
        {"{\"type\":\"comm\",\"rank\":1.0,\"step\":1}", "field \"rank\""},
        {"{\"type\":\"comm\",\"rank\":0}", "field \"step\": missing (expected an integer 0..2^53)"},
        {"{\"type\":\"comm\",\"rank\":0,\"step\":1e3}",
         "field \"step\": expected an integer 0..2^53"},
        {"{\"type\":\"comm\",\"rank\":0,\"step\":null}", "field \"step\""},
        {"{\"type\":\"comm\",\"rank\":0,\"step\":99999999999999999999}", "not JSON"},
        {"{\"type\":\"comm\",\"rank\":0,\"step\":1e999}", "not JSON"},
        {"{\"type\":\"step\",\"rank\":0,\"step\":1,\"loss\":NaN,\"dt\":0}", "not JSON"},
        {"{\"type\":\"step\",\"rank\":0,\"step\":1,\"dt\":0}", "field \"loss\": missing"},
        {"{\"type\":\"step\",\"rank\":0,\"step\":1,\"loss\":\"0.5\",\"dt\":0}",
         "field \"loss\": expected a number or null"},
        {"{\"type\":\"step\",\"rank\":0,\"step\":1,\"loss\":0.5}", "field \"dt\": missing"},
        {"{\"type\":\"step\",\"rank\":0,\"step\":1,\"loss\":0.5,\"dt\":-0.001}",
         "field \"dt\": expected a number >= 0"},
        {"{\"type\":\"step\",\"rank\":0,\"step\":1,\"loss\":0.5,\"dt\":null}", "field \"dt\""},
        {"{\"type\":\"hello\",\"v\":1,\"rank\":4,\"world\":4,\"pid\":9,\"device\":\"0\",\"step\":"
         "0}",
         "field \"rank\": expected an integer 0..world-1 (world is 4)"},
        {"{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":0,\"pid\":9,\"device\":\"0\",\"step\":"
         "0}",
         "field \"world\""},
        {"{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":65537,\"pid\":9,\"device\":\"0\","
         "\"step\":0}",
         "field \"world\""},
        {"{\"type\":\"hello\",\"v\":0,\"rank\":0,\"world\":1,\"pid\":9,\"device\":\"0\",\"step\":"
         "0}",
         "field \"v\""},
        {"{\"type\":\"hello\",\"rank\":0,\"world\":1,\"pid\":9,\"device\":\"0\",\"step\":0}",
         "field \"v\": missing"},
        {"{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":1,\"pid\":0,\"device\":\"0\",\"step\":"
         "0}",
         "field \"pid\""},
        {"{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":1,\"pid\":9,\"device\":0,\"step\":0}",
         "field \"device\""},
        {"{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":1,\"pid\":9,\"device\":\"a\\u0007\","
         "\"step\":0}",
         "field \"device\""},
        {"{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":1,\"pid\":9,\"device\":\"a\\nb\","
         "\"step\":0}",
         "field \"device\""},
        {"{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":1,\"pid\":9,\"step\":0}",
         "field \"device\": missing"},
        {longdev, "field \"device\": expected a string of at most 63 bytes"},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"NaN\",\"blame\":0,\"action\":"
         "\"redo\",\"lost_steps\":0}",
         "field \"kind\""},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"\",\"blame\":0,\"action\":\"redo\","
         "\"lost_steps\":0}",
         "field \"kind\""},
        {longkind, "field \"kind\": expected a word"},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"action\":\"re "
         "do\",\"lost_steps\":0}",
         "field \"action\""},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"lost_steps\":0}",
         "field \"action\": missing"},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":-2,\"action\":"
         "\"redo\",\"lost_steps\":0}",
         "field \"blame\": expected an integer -1..65535"},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"action\":\"redo\",\"lost_"
         "steps\":0}",
         "field \"blame\": missing"},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"action\":"
         "\"redo\",\"lost_steps\":-1}",
         "field \"lost_steps\""},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"action\":"
         "\"redo\",\"lost_steps\":0,\"detail\":\"\\u001b[31m\"}",
         "field \"detail\""},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"action\":"
         "\"redo\",\"lost_steps\":0,\"detail\":\"\\u0085\"}",
         "field \"detail\""},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"action\":"
         "\"redo\",\"lost_steps\":0,\"detail\":\"\x7f\"}",
         "field \"detail\""},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"action\":"
         "\"redo\",\"lost_steps\":0,\"detail\":5}",
         "field \"detail\""},
        {longdetail, "field \"detail\": expected a string of at most 512 bytes"},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"action\":"
         "\"redo\",\"lost_steps\":0,\"detail\":\"\xff\"}",
         "not JSON"},
        {"{\"type\":\"event\",\"rank\":0,\"step\":1,\"kind\":\"nan\",\"blame\":0,\"action\":"
         "\"redo\",\"lost_steps\":0,\"detail\":\"a\tb\"}",
         "not JSON"},
        {"{\"type\":\"ckpt\",\"rank\":0,\"step\":1}", "field \"seconds\": missing"},
        {"{\"type\":\"ckpt\",\"rank\":0,\"step\":1,\"seconds\":-1}", "field \"seconds\""},
        {"{\"type\":\"inject\",\"rank\":0,\"step\":1,\"index\":-1,\"kind\":\"crash\"}",
         "field \"index\""},
        {"{\"type\":\"inject\",\"rank\":0,\"step\":1,\"index\":0}", "field \"kind\": missing"},
        {"{\"type\":\"bye\",\"rank\":0,\"step\":1,\"status\":\"failed\"}",
         "field \"status\": expected \"done\" or \"stopped\""},
        {"{\"type\":\"bye\",\"rank\":0,\"step\":1}", "field \"status\": missing"},
        {"{\"type\":\"\\u001b[2Jx\",\"rank\":0}", "unknown message type \"?[2Jx\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rk_hb_msg m;
        rk_err err = {0};
        int rc = rk_hb_msg_parse(cases[i].line, strlen(cases[i].line), &m, &err);
        if (rc != RK_EFORMAT)
            fail_msg("case %zu (%s): rc %d, not RK_EFORMAT", i, cases[i].line, rc);
        if (strncmp(err.msg, "heartbeat message: ", 19) != 0 || !strstr(err.msg, cases[i].needle))
            fail_msg("case %zu (%s): message '%s' lacks '%s'", i, cases[i].line, err.msg,
                     cases[i].needle);
        for (const char *p = err.msg; *p; p++)
            assert_true((unsigned char)*p >= 0x20 && *p != 0x7f);
    }

    /* The brief's example, exactly. */
    rk_hb_msg m;
    rk_err err = {0};
    const char *neg = "{\"type\":\"step\",\"rank\":0,\"step\":-1,\"loss\":0.5,\"dt\":0.1}";
    assert_int_equal(rk_hb_msg_parse(neg, strlen(neg), &m, &err), RK_EFORMAT);
    assert_string_equal(err.msg, "heartbeat message: field \"step\": expected an integer 0..2^53");

    /* A NUL byte inside the line, and a line of 4096 bytes (4097 with its newline). */
    const char nul[] = "{\"type\":\"comm\",\"rank\":0,\"step\":1}\0x";
    assert_int_equal(rk_hb_msg_parse(nul, sizeof nul - 1, &m, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "not JSON"));
    char *big = malloc(RK_HB_LINE_MAX + 1);
    assert_non_null(big);
    int n =
        snprintf(big, RK_HB_LINE_MAX + 1, "{\"type\":\"comm\",\"rank\":0,\"step\":1,\"pad\":\"");
    memset(big + n, 'p', RK_HB_LINE_MAX - (size_t)n - 2);
    memcpy(big + RK_HB_LINE_MAX - 2, "\"}", 3);
    assert_int_equal(strlen(big), RK_HB_LINE_MAX);
    assert_int_equal(rk_hb_msg_parse(big, RK_HB_LINE_MAX, &m, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "4096 bytes, more than 4095"));
    /* One byte shorter (4096 with the newline) is fine. */
    memmove(big + n, big + n + 1, RK_HB_LINE_MAX - (size_t)n);
    assert_int_equal(rk_hb_msg_parse(big, RK_HB_LINE_MAX - 1, &m, &err), RK_OK);
    free(big);

    /* Commands. */
    struct {
        const char *line, *needle;
    } cmds[] = {
        {"", "not JSON"},
        {"\"stop\"", "not a JSON object"},
        {"{}", "field \"cmd\": missing"},
        {"{\"cmd\":1}", "field \"cmd\": expected"},
        {"{\"cmd\":\"reboot\"}", "field \"cmd\": unknown command \"reboot\""},
        {"{\"cmd\":\"STOP\"}", "unknown command"},
        {"{\"cmd\":\"stop\"", "not JSON"},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        rk_hb_cmd cmd = RK_HB_CMD_STOP;
        int rc = rk_hb_cmd_parse(cmds[i].line, strlen(cmds[i].line), &cmd, &err);
        assert_int_equal(rc, RK_EFORMAT);
        assert_int_equal(cmd, RK_HB_CMD_NONE);
        if (strncmp(err.msg, "heartbeat command: ", 19) != 0 || !strstr(err.msg, cmds[i].needle))
            fail_msg("command %zu (%s): message '%s' lacks '%s'", i, cmds[i].line, err.msg,
                     cmds[i].needle);
    }
}

/* Values at the edges of every range are accepted, fields may come in any order with
 * whitespace, unknown fields of any JSON type are ignored, and an absent detail is "". */
static void test_valid_lines_at_the_limits_parse(void **state)
{
    (void)state;
    rk_hb_msg m;
    rk_err err = {0};
    const char *hello =
        " { \"step\" : 0 , \"device\":\"\", \"pid\":2147483647, \"world\":65536,"
        " \"rank\":65535, \"v\":2, \"type\":\"hello\", \"future\":{\"a\":[1,null]} }\r";
    assert_int_equal(rk_hb_msg_parse(hello, strlen(hello), &m, &err), RK_OK);
    assert_int_equal(m.type, RK_HB_HELLO);
    assert_int_equal(m.rank, 65535);
    assert_int_equal(m.world, 65536);
    assert_int_equal(m.version, 2);
    assert_int_equal(m.pid, 2147483647L);
    assert_string_equal(m.device, "");

    const char *step = "{\"type\":\"step\",\"rank\":0,\"step\":9007199254740992,\"loss\":-1,"
                       "\"dt\":0,\"x\":\"y\"}";
    assert_int_equal(rk_hb_msg_parse(step, strlen(step), &m, &err), RK_OK);
    assert_int_equal(m.step, RK_HB_STEP_MAX);
    /* one more, or INT64_MAX, is refused: twice a claimed step once overflowed in rk run */
    const char *big[] = {"{\"type\":\"comm\",\"rank\":0,\"step\":9007199254740993}",
                         "{\"type\":\"comm\",\"rank\":0,\"step\":9223372036854775807}"};
    for (int k = 0; k < 2; k++) {
        rk_hb_msg b;
        assert_int_equal(rk_hb_msg_parse(big[k], strlen(big[k]), &b, &err), RK_EFORMAT);
        assert_non_null(strstr(err.msg, "0..2^53"));
    }
    assert_true(m.loss_finite && m.loss == -1.0 && m.dt == 0.0);

    char ev[900];
    snprintf(ev, sizeof ev,
             "{\"type\":\"event\",\"rank\":1,\"step\":3,\"kind\":\"%s\",\"blame\":-1,"
             "\"action\":\"z_\",\"lost_steps\":0}",
             "abcdefghijklmnopqrstuvwxyz_____");
    assert_int_equal(rk_hb_msg_parse(ev, strlen(ev), &m, &err), RK_OK);
    assert_int_equal(strlen(m.kind), 31);
    assert_int_equal(m.blame, -1);
    assert_string_equal(m.detail, "");
    snprintf(ev, sizeof ev,
             "{\"type\":\"event\",\"rank\":1,\"step\":3,\"kind\":\"nan\",\"blame\":65535,"
             "\"action\":\"redo\",\"lost_steps\":5,\"detail\":\"%0510d\\u00e9\"}",
             0);
    assert_int_equal(rk_hb_msg_parse(ev, strlen(ev), &m, &err), RK_OK);
    assert_int_equal(strlen(m.detail), 512);
    assert_int_equal(m.blame, 65535);

    const char *inj =
        "{\"type\":\"inject\",\"rank\":2,\"step\":120,\"index\":0,\"kind\":\"crash\"}";
    assert_int_equal(rk_hb_msg_parse(inj, strlen(inj), &m, &err), RK_OK);
    assert_int_equal(m.type, RK_HB_INJECT);
    const char *ck = "{\"type\":\"ckpt\",\"rank\":0,\"step\":100,\"seconds\":0}";
    assert_int_equal(rk_hb_msg_parse(ck, strlen(ck), &m, &err), RK_OK);
    assert_int_equal(m.type, RK_HB_CKPT);

    rk_hb_cmd cmd;
    const char *stop = "{\"why\":\"preempted\",\"cmd\":\"stop\",\"when\":null}";
    assert_int_equal(rk_hb_cmd_parse(stop, strlen(stop), &cmd, &err), RK_OK);
    assert_int_equal(cmd, RK_HB_CMD_STOP);
    assert_int_equal(rk_hb_cmd_parse("{\"cmd\":\"checkpoint\"}", 20, &cmd, &err), RK_OK);
    assert_int_equal(cmd, RK_HB_CMD_CHECKPOINT);
    assert_string_equal(rk_hb_type_name(RK_HB_INJECT), "inject");
    assert_string_equal(rk_hb_type_name((rk_hb_type)42), "?");
}

/* ---- the line splitter ------------------------------------------------------------------ */

typedef struct collect {
    char text[8192];
    size_t n;    /* bytes in text: the lines joined with '|' */
    int lines;   /* callbacks */
    int stop_at; /* return 7 from this callback (1-based), 0 never */
    bool nul_ok; /* every line came NUL-terminated at its length */
} collect;

static int on_line(void *ctx, const char *line, size_t len)
{
    collect *c = ctx;
    c->nul_ok = c->nul_ok && line[len] == '\0' && memchr(line, '\n', len) == NULL;
    assert_true(c->n + len + 1 < sizeof c->text);
    memcpy(c->text + c->n, line, len);
    c->n += len;
    c->text[c->n++] = '|';
    c->text[c->n] = '\0';
    c->lines++;
    return c->lines == c->stop_at ? 7 : 0;
}

/* The hello's optional "stacks": true and false read back, absent is false, any other JSON
 * type is refused naming the field; the formatter writes it only when set, and what it
 * writes parses back with it. */
static void test_hello_stacks_field_is_optional_and_boolean(void **state)
{
    (void)state;
    rk_hb_msg m;
    rk_err err = {0};
    const char *base = "{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":1,\"pid\":9,"
                       "\"device\":\"0\",\"step\":0";
    char line[256];
    snprintf(line, sizeof line, "%s}", base);
    assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_OK);
    assert_false(m.stacks);
    snprintf(line, sizeof line, "%s,\"stacks\":true}", base);
    assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_OK);
    assert_true(m.stacks);
    snprintf(line, sizeof line, "%s,\"stacks\":false}", base);
    assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_OK);
    assert_false(m.stacks);
    const char *bad[] = {"1", "\"true\"", "null", "[true]"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(line, sizeof line, "%s,\"stacks\":%s}", base, bad[k]);
        assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_EFORMAT);
        assert_non_null(strstr(err.msg, "field \"stacks\": expected true or false"));
    }
    /* other types ignore it as an unknown field */
    const char *comm = "{\"type\":\"comm\",\"rank\":0,\"step\":3,\"stacks\":1}";
    assert_int_equal(rk_hb_msg_parse(comm, strlen(comm), &m, &err), RK_OK);
    rk_hb_msg h;
    memset(&h, 0, sizeof h);
    h.type = RK_HB_HELLO;
    h.version = 1;
    h.world = 2;
    h.rank = 1;
    h.pid = 77;
    char out[RK_HB_LINE_MAX];
    size_t len = 0;
    assert_int_equal(rk_hb_msg_format(&h, out, sizeof out, &len, &err), RK_OK);
    assert_null(strstr(out, "stacks"));
    h.stacks = true;
    assert_int_equal(rk_hb_msg_format(&h, out, sizeof out, &len, &err), RK_OK);
    assert_non_null(strstr(out, ",\"stacks\":true}"));
    assert_int_equal(rk_hb_msg_parse(out, len - 1, &m, &err), RK_OK);
    assert_true(m.stacks && m.pid == 77 && m.rank == 1 && m.world == 2);
}

/* The hello's optional "rejoin" (recovery in place, docs/protocol.md): a boolean, absent is
 * false, anything else refused naming the field; written only when true. The rejoin command:
 * written with its epoch and port in range, refused out of range, with nothing written. */
static void test_hello_rejoin_field_and_the_rejoin_command(void **state)
{
    (void)state;
    rk_hb_msg m;
    rk_err err = {0};
    const char *base = "{\"type\":\"hello\",\"v\":1,\"rank\":1,\"world\":2,\"pid\":9,"
                       "\"device\":\"0\",\"step\":0";
    char line[256];
    snprintf(line, sizeof line, "%s}", base);
    assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_OK);
    assert_false(m.rejoin);
    snprintf(line, sizeof line, "%s,\"rejoin\":true}", base);
    assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_OK);
    assert_true(m.rejoin);
    snprintf(line, sizeof line, "%s,\"rejoin\":false}", base);
    assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_OK);
    assert_false(m.rejoin);
    const char *bad[] = {"1", "\"true\"", "null", "{}"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(line, sizeof line, "%s,\"rejoin\":%s}", base, bad[k]);
        assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_EFORMAT);
        assert_non_null(strstr(err.msg, "field \"rejoin\": expected true or false"));
    }
    rk_hb_msg h;
    memset(&h, 0, sizeof h);
    h.type = RK_HB_HELLO;
    h.version = 1;
    h.world = 2;
    h.rank = 1;
    h.pid = 77;
    char out[RK_HB_LINE_MAX];
    size_t len = 0;
    assert_int_equal(rk_hb_msg_format(&h, out, sizeof out, &len, &err), RK_OK);
    assert_null(strstr(out, "rejoin"));
    h.rejoin = true;
    assert_int_equal(rk_hb_msg_format(&h, out, sizeof out, &len, &err), RK_OK);
    assert_non_null(strstr(out, ",\"rejoin\":true}"));
    assert_int_equal(rk_hb_msg_parse(out, len - 1, &m, &err), RK_OK);
    assert_true(m.rejoin);

    char cmd[RK_HB_REJOIN_LINE_MAX];
    assert_int_equal(rk_hb_rejoin_format(2147483647, 65535, cmd, sizeof cmd, &len, &err), RK_OK);
    assert_string_equal(cmd, "{\"cmd\":\"rejoin\",\"epoch\":2147483647,\"port\":65535}\n");
    assert_int_equal(len, strlen(cmd));
    const int epochs[] = {0, -1, 1, 1}, ports[] = {5, 5, 0, 65536};
    for (size_t k = 0; k < 4; k++) {
        cmd[0] = 'x';
        assert_int_equal(rk_hb_rejoin_format(epochs[k], ports[k], cmd, sizeof cmd, NULL, &err),
                         RK_EINVAL);
        assert_int_equal(cmd[0], '\0');
    }
    assert_int_equal(rk_hb_rejoin_format(1, 2, cmd, 10, NULL, &err), RK_EINVAL); /* too small */
    assert_int_equal(cmd[0], '\0');
}

/* The hello's optional "restore": "memory", "disk" and "none" read back, absent is unsaid,
 * anything else (another word, "" or another JSON type) is refused naming the field; the
 * formatter writes it only when said, rk_hb_open_restored sends it, and a value outside the
 * enum is refused by the formatter. */
static void test_hello_restore_field_is_optional_and_one_of_three_words(void **state)
{
    (void)state;
    rk_hb_msg m;
    rk_err err = {0};
    const char *base = "{\"type\":\"hello\",\"v\":1,\"rank\":0,\"world\":1,\"pid\":9,"
                       "\"device\":\"0\",\"step\":40";
    char line[256];
    snprintf(line, sizeof line, "%s}", base);
    assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_OK);
    assert_int_equal(m.restore, RK_HB_RESTORE_UNSAID);
    const char *words[] = {"none", "disk", "memory", "peer"};
    const rk_hb_restore want[] = {RK_HB_RESTORE_NONE, RK_HB_RESTORE_DISK, RK_HB_RESTORE_MEMORY,
                                  RK_HB_RESTORE_PEER};
    for (size_t k = 0; k < 4; k++) {
        snprintf(line, sizeof line, "%s,\"restore\":\"%s\"}", base, words[k]);
        assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_OK);
        assert_int_equal(m.restore, want[k]);
        assert_string_equal(rk_hb_restore_name(want[k]), words[k]);
    }
    const char *bad[] = {"\"\"", "\"Memory\"", "\"partner\"", "1", "null", "true", "[\"disk\"]"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(line, sizeof line, "%s,\"restore\":%s}", base, bad[k]);
        assert_int_equal(rk_hb_msg_parse(line, strlen(line), &m, &err), RK_EFORMAT);
        assert_non_null(
            strstr(err.msg, "field \"restore\": expected \"memory\", \"peer\", \"disk\""));
    }
    rk_hb_msg h;
    memset(&h, 0, sizeof h);
    h.type = RK_HB_HELLO;
    h.version = 1;
    h.world = 2;
    h.rank = 1;
    h.pid = 77;
    char out[RK_HB_LINE_MAX];
    size_t len = 0;
    assert_int_equal(rk_hb_msg_format(&h, out, sizeof out, &len, &err), RK_OK);
    assert_null(strstr(out, "restore"));
    h.restore = RK_HB_RESTORE_MEMORY;
    assert_int_equal(rk_hb_msg_format(&h, out, sizeof out, &len, &err), RK_OK);
    assert_non_null(strstr(out, ",\"restore\":\"memory\"}"));
    h.restore = (rk_hb_restore)5;
    assert_int_equal(rk_hb_msg_format(&h, out, sizeof out, &len, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "field \"restore\""));
    /* the client sends it in its hello */
    int lfd = listen_here();
    rk_hb *c = NULL;
    assert_int_equal(rk_hb_open_restored(&c, 0, 1, "0", 40, RK_HB_RESTORE_DISK, &err), RK_OK);
    conn *cc = accept_conn(lfd);
    char raw[RK_HB_LINE_MAX];
    next_msg(cc, &m, raw);
    assert_int_equal(m.type, RK_HB_HELLO);
    assert_int_equal(m.step, 40);
    assert_int_equal(m.restore, RK_HB_RESTORE_DISK);
    rk_hb *c2 = NULL;
    assert_int_equal(rk_hb_open_restored(&c2, 0, 1, "0", 40, (rk_hb_restore)9, &err), RK_EINVAL);
    assert_null(c2);
    rk_hb_close(c);
    conn_free(cc);
    close(lfd);
}

/* The same lines come out whatever the chunking: all at once, byte by byte, and seeded
 * random chunks; an empty line is a line; the tail waits for its newline; a 4095-byte line
 * passes and a 4096-byte one (newline excluded) is RK_EFORMAT even when split across feeds;
 * a nonzero callback return stops the feed and is returned. */
static void test_line_splitter_copes_with_any_chunking(void **state)
{
    (void)state;
    const char *in = "{\"a\":1}\n\n{\"b\":2}\n{\"c\":\"x y\"}\ntail";
    const char *want = "{\"a\":1}||{\"b\":2}|{\"c\":\"x y\"}|";
    size_t len = strlen(in);
    rk_err err = {0};
    srand(7);
    for (int mode = 0; mode < 52; mode++) {
        rk_hb_lines b = {0};
        collect c = {.nul_ok = true};
        for (size_t i = 0; i < len;) {
            size_t k = mode == 0 ? len : mode == 1 ? 1 : 1 + (size_t)rand() % 9;
            if (k > len - i)
                k = len - i;
            assert_int_equal(rk_hb_lines_feed(&b, in + i, k, on_line, &c, &err), RK_OK);
            i += k;
        }
        assert_string_equal(c.text, want);
        assert_int_equal(c.lines, 4);
        assert_true(c.nul_ok);
        assert_int_equal(b.used, 4); /* "tail" waits */
        assert_int_equal(rk_hb_lines_feed(&b, "!\n", 2, on_line, &c, &err), RK_OK);
        assert_int_equal(c.lines, 5);
        assert_non_null(strstr(c.text, "|tail!|"));
    }

    char *big = malloc(2 * RK_HB_LINE_MAX);
    assert_non_null(big);
    memset(big, 'x', 2 * RK_HB_LINE_MAX);
    rk_hb_lines b = {0};
    collect c = {.nul_ok = true};
    big[RK_HB_LINE_MAX - 1] = '\n'; /* 4095 bytes and the newline */
    assert_int_equal(rk_hb_lines_feed(&b, big, 1000, on_line, &c, &err), RK_OK);
    assert_int_equal(rk_hb_lines_feed(&b, big + 1000, RK_HB_LINE_MAX - 1000, on_line, &c, &err),
                     RK_OK);
    assert_int_equal(c.lines, 1);
    assert_int_equal(c.n, RK_HB_LINE_MAX); /* 4095 + '|' */
    big[RK_HB_LINE_MAX - 1] = 'x';
    big[RK_HB_LINE_MAX] = '\n'; /* 4096 bytes and the newline: one too many */
    assert_int_equal(rk_hb_lines_feed(&b, big, 3000, on_line, &c, &err), RK_OK);
    assert_int_equal(rk_hb_lines_feed(&b, big + 3000, RK_HB_LINE_MAX + 1 - 3000, on_line, &c, &err),
                     RK_EFORMAT);
    assert_non_null(strstr(err.msg, "longer than 4096 bytes"));
    assert_int_equal(c.lines, 1);
    assert_int_equal(b.used, 0);
    assert_int_equal(rk_hb_lines_feed(&b, big, 2 * RK_HB_LINE_MAX, on_line, &c, &err),
                     RK_EFORMAT); /* in one feed */
    free(big);

    rk_hb_lines b2 = {0};
    collect c2 = {.nul_ok = true, .stop_at = 2};
    assert_int_equal(rk_hb_lines_feed(&b2, "a\nb\nc\n", 6, on_line, &c2, &err), 7);
    assert_int_equal(c2.lines, 2);
    assert_string_equal(c2.text, "a|b|");
    assert_int_equal(rk_hb_lines_feed(NULL, "a", 1, on_line, &c2, &err), RK_EINVAL);
}

/* ---- concurrency and signals ------------------------------------------------------------ */

typedef struct sender {
    rk_hb *h;
    const char *kind;
    int n;
    int failures;
} sender;

static void *send_events(void *arg)
{
    sender *s = arg;
    char detail[RK_HB_DETAIL_MAX + 1];
    memset(detail, '"', RK_HB_DETAIL_MAX); /* 1024 bytes once escaped */
    detail[RK_HB_DETAIL_MAX] = '\0';
    for (int i = 0; i < s->n; i++)
        s->failures += rk_hb_event(s->h, i, s->kind, 0, "none", 0, detail) != RK_OK;
    return NULL;
}

/* Two threads sending long lines at once, every send cut short or failed with EINTR by the
 * stand-in send() (and the reader lagging behind): every line the supervisor reads parses,
 * and each thread's lines arrive complete and in order. */
static void test_two_threads_sending_never_interleave_lines(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);
    int sz = 4096; /* a small receive buffer: more blocking, more partial sends */
    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    enum { N = 300 };
    sender a = {h, "from_a", N, 0}, b = {h, "from_b", N, 0};
    pthread_t ta, tb;
    atomic_store(&g_chopped, 0);
    atomic_store(&g_chop, 1);
    assert_int_equal(pthread_create(&ta, NULL, send_events, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, send_events, &b), 0);
    int64_t next_a = 0, next_b = 0;
    for (int i = 0; i < 2 * N; i++) {
        rk_hb_msg m;
        next_msg(c, &m, NULL); /* fails on a torn line */
        assert_int_equal(m.type, RK_HB_EVENT);
        assert_int_equal(strlen(m.detail), RK_HB_DETAIL_MAX);
        if (strcmp(m.kind, "from_a") == 0)
            assert_int_equal(m.step, next_a++);
        else
            assert_int_equal(m.step, next_b++);
    }
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    atomic_store(&g_chop, 0);
    assert_true(atomic_load(&g_chopped) > 2 * N); /* the stand-in cut the sends */
    assert_int_equal(a.failures + b.failures, 0);
    assert_int_equal(next_a, N);
    assert_int_equal(next_b, N);
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

static volatile sig_atomic_t g_alarms;

static void on_alarm(int sig)
{
    (void)sig;
    g_alarms++;
}

typedef struct slow_reader {
    conn *c;
    int n, bad;
} slow_reader;

static void *read_slowly(void *arg)
{
    slow_reader *r = arg; /* SIGALRM is blocked here: the thread was made with it blocked */
    for (int i = 0; i < r->n; i++) {
        char line[RK_HB_LINE_MAX];
        ssize_t len = try_next_line(r->c, line);
        rk_hb_msg m;
        rk_err err;
        if (len < 0) {
            r->bad += r->n - i;
            break;
        }
        if (rk_hb_msg_parse(line, (size_t)len, &m, &err) != RK_OK || m.step != i)
            r->bad++;
        if (i % 16 == 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

/* Sends interrupted by a signal handler installed without SA_RESTART (every 100 us, while the
 * socket buffer is full) are retried: every line arrives whole and in order. */
static void test_sends_interrupted_by_signals_still_deliver_whole_lines(void **state)
{
    (void)state;
    int lfd = listen_here();
    conn *c;
    rk_hb *h = open_pair(lfd, &c);
    int sz = 4096;
    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: blocking calls return EINTR */
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    enum { N = 3000 };
    slow_reader r = {c, N, 0};
    pthread_t t;
    /* The reader is made with SIGALRM blocked, so no alarm can land on it before it could
     * block it itself (TSan saw the handler run on both threads at once). */
    sigset_t alrm, prev;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, &prev);
    assert_int_equal(pthread_create(&t, NULL, read_slowly, &r), 0);
    pthread_sigmask(SIG_SETMASK, &prev, NULL);
    struct itimerval it = {{0, 100}, {0, 100}};
    g_alarms = 0;
    setitimer(ITIMER_REAL, &it, NULL);
    char detail[RK_HB_DETAIL_MAX + 1];
    memset(detail, '\\', RK_HB_DETAIL_MAX);
    detail[RK_HB_DETAIL_MAX] = '\0';
    int failures = 0;
    for (int i = 0; i < N; i++)
        failures += rk_hb_event(h, i, "nan", 1, "redo", 0, detail) != RK_OK;
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    pthread_join(t, NULL);
    sigaction(SIGALRM, &old, NULL);
    assert_int_equal(failures, 0);
    assert_int_equal(r.bad, 0);
    assert_true(g_alarms > 0);
    rk_hb_close(h);
    conn_free(c);
    close(lfd);
}

int main(void)
{
    signal(SIGPIPE, SIG_DFL); /* a SIGPIPE anywhere fails the run */
    *(void **)&real_send = dlsym(RTLD_NEXT, "send");
    if (!real_send)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_message_type_round_trips_over_a_unix_socket),
        cmocka_unit_test(test_without_rk_heartbeat_the_handle_is_null_and_calls_are_noops),
        cmocka_unit_test(test_open_failures_name_the_path_or_field),
        cmocka_unit_test(test_non_finite_loss_is_null_and_finite_numbers_keep_their_bits),
        cmocka_unit_test(test_format_then_parse_gives_the_same_message),
        cmocka_unit_test(test_save_line_needs_keep_in_range),
        cmocka_unit_test(test_commands_from_the_supervisor_are_seen_by_poll),
        cmocka_unit_test(test_formatted_commands_read_back_on_the_worker_side),
        cmocka_unit_test(test_supervisor_gone_makes_sends_fail_once_without_sigpipe),
        cmocka_unit_test(test_poll_returns_a_last_command_before_reporting_the_close),
        cmocka_unit_test(test_alive_sees_a_supervisor_that_closed_without_a_poll),
        cmocka_unit_test(test_bad_send_arguments_send_nothing_and_keep_the_handle),
        cmocka_unit_test(test_event_detail_is_cleaned_and_cut_on_a_character),
        cmocka_unit_test(test_broken_lines_are_rejected_naming_the_field),
        cmocka_unit_test(test_valid_lines_at_the_limits_parse),
        cmocka_unit_test(test_hello_stacks_field_is_optional_and_boolean),
        cmocka_unit_test(test_hello_restore_field_is_optional_and_one_of_three_words),
        cmocka_unit_test(test_hello_rejoin_field_and_the_rejoin_command),
        cmocka_unit_test(test_line_splitter_copes_with_any_chunking),
        cmocka_unit_test(test_two_threads_sending_never_interleave_lines),
        cmocka_unit_test(test_sends_interrupted_by_signals_still_deliver_whole_lines),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
