/*
 * Tests for a multi-host job's hosts (src/cluster/hosts.c): host lists and hostfile texts
 * that parse (names, IPv4 and IPv6 addresses, slots, comments, CRLF, max_slots) and every
 * refusal with its message (empty entries, spaces, bytes that are not printable ASCII and are
 * described, never quoted, slot counts, names, a host twice across lists and files, the
 * table's bound); a failed call leaves the table byte for byte as it was; the hostfile
 * reader refuses a directory, a FIFO, a symbolic link and an oversized file before reading;
 * and placement fills the hosts in order, then the spares, around excluded hosts, and says
 * how many slots were missing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/hosts.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_hosts")

/* Big (268 KB each): static, and zeroed by each test that uses them. */
static rk_hosts g_hs, g_before;

static void reset(void)
{
    memset(&g_hs, 0, sizeof g_hs);
}

/* Parse `list` into a fresh table: its code, the message in e. */
static int list1(const char *list, rk_err *e)
{
    reset();
    rk_err_clear(e);
    return rk_hosts_parse_list(&g_hs, list, 0, e);
}

static int text1(const char *text, rk_err *e)
{
    reset();
    rk_err_clear(e);
    return rk_hosts_parse_text(&g_hs, text, strlen(text), "hostfile /x/h", e);
}

/* `code` with a message that holds `want` (and no byte that is not printable ASCII). */
static void expect_msg(int rc, int code, const rk_err *e, const char *want)
{
    if (rc != code || !strstr(e->msg, want))
        fail_msg("got %d '%s', want %d with '%s'", rc, e->msg, code, want);
    for (const char *p = e->msg; *p; p++)
        assert_true((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
}

static void expect_list(const char *list, const char *want)
{
    rk_err e;
    expect_msg(list1(list, &e), RK_EINVAL, &e, want);
    assert_int_equal(g_hs.n, 0);
}

static void expect_text(const char *text, const char *want)
{
    rk_err e;
    expect_msg(text1(text, &e), RK_EFORMAT, &e, want);
    assert_int_equal(g_hs.n, 0);
}

/* ---- host lists -------------------------------------------------------------------------- */

static void test_list_good(void **state)
{
    (void)state;
    rk_err e;
    assert_int_equal(list1("h1:4,h2:4", &e), RK_OK);
    assert_int_equal(g_hs.n, 2);
    assert_string_equal(g_hs.h[0].name, "h1");
    assert_int_equal(g_hs.h[0].slots, 4);
    assert_string_equal(g_hs.h[1].name, "h2");
    assert_int_equal(g_hs.h[1].spare, 0);

    /* No ":N": one slot; an IPv4 address; IPv6 in brackets, kept canonical without them. */
    assert_int_equal(list1("gpu-a.lab_1,198.18.0.3:2,[fd00::7]:8,[FD00:0:0::8],h:256", &e), RK_OK);
    assert_int_equal(g_hs.n, 5);
    assert_int_equal(g_hs.h[0].slots, 1);
    assert_string_equal(g_hs.h[1].name, "198.18.0.3");
    assert_int_equal(g_hs.h[1].slots, 2);
    assert_string_equal(g_hs.h[2].name, "fd00::7");
    assert_int_equal(g_hs.h[2].slots, 8);
    assert_string_equal(g_hs.h[3].name, "fd00::8");
    assert_int_equal(g_hs.h[3].slots, 1);
    assert_int_equal(g_hs.h[4].slots, 256);

    /* A 253-byte name is the longest. */
    char name[300];
    memset(name, 'a', 253);
    strcpy(name + 253, ":3");
    assert_int_equal(list1(name, &e), RK_OK);
    assert_int_equal(strlen(g_hs.h[0].name), 253);
    assert_int_equal(g_hs.h[0].slots, 3);

    /* Appending: a spare list after the hosts. */
    assert_int_equal(list1("h1:2,h2:2", &e), RK_OK);
    assert_int_equal(rk_hosts_parse_list(&g_hs, "h3:2", 1, &e), RK_OK);
    assert_int_equal(g_hs.n, 3);
    assert_int_equal(g_hs.h[2].spare, 1);
    assert_int_equal(g_hs.h[0].spare, 0);
}

static void test_list_refusals(void **state)
{
    (void)state;
    expect_list("", "the host list is empty");
    expect_list("h1:4,,h2", "host list entry 2 is empty");
    expect_list(",h1", "entry 1 is empty");
    expect_list("h1,", "entry 2 is empty");
    expect_list("h1:4, h2:4", "byte 6 is a space: entries are separated by ',' without spaces");
    expect_list("h1:4 ", "byte 5 is a space");
    expect_list("h1\t", "byte 3 is a tab");
    /* Bytes that are not printable ASCII are described, never quoted (expect_msg checks). */
    expect_list("h1\x01", "host list: byte 3 is a control character (0x01)");
    expect_list("ab\ncd", "byte 3 is a control character (0x0a)");
    expect_list("h\x7f", "byte 2 is a control character (0x7f)");
    expect_list("h\xc3\xa9t", "byte 2 is not ASCII (0xc3)");
    /* Slot counts. */
    expect_list("h1:0", "entry 1 ('h1:0'): the slot count '0' is not a whole number in 1..256");
    expect_list("h1:257", "'257' is not a whole number in 1..256");
    expect_list("h1:x", "'x' is not a whole number");
    expect_list("h1:+4", "'+4' is not a whole number");
    expect_list("h1:-1", "'-1' is not a whole number");
    expect_list("h1:99999999999999999999", "is not a whole number in 1..256");
    expect_list("h1:4,h2:", "entry 2 ('h2:'): no slot count after ':'");
    /* Names. */
    char name[300];
    memset(name, 'a', 254);
    name[254] = 0;
    expect_list(name, "a host name of 254 bytes, at most 253");
    expect_list(":4", "no host name");
    expect_list("user@h1", "'@' is not allowed in a host name");
    expect_list("h1/x", "'/' is not allowed");
    expect_list("-oProxyCommand", "does not start with '-'");
    expect_list("fd00::1:4", "an IPv6 address is written in brackets: [ADDR]:N");
    expect_list("[fd00::1:4", "a '[' without its ']'");
    expect_list("[zz::1]:4", "not an IPv6 address in brackets");
    expect_list("[fe80::1%eth0]", "not an IPv6 address");
    expect_list("[]", "not an IPv6 address");
    expect_list("[fd00::1]4", "after ']' comes ':N'");
    expect_list("[fd00::1]:", "no slot count after ':'");
    /* A host twice: in one list, ignoring case, and across the lists (which one says). */
    expect_list("h1:2,h2,H1:2",
                "entry 3 ('H1:2'): host H1 twice: it is already one of the job's hosts");
    expect_list("[fd00::1],[fd00:0::1]", "host fd00::1 twice");
    rk_err e;
    assert_int_equal(list1("h1", &e), RK_OK);
    assert_int_equal(rk_hosts_parse_list(&g_hs, "s1:2", 1, &e), RK_OK);
    expect_msg(rk_hosts_parse_list(&g_hs, "s2,s1", 1, &e), RK_EINVAL, &e,
               "spare host list entry 2 ('s1'): host s1 twice: it is already one of the job's "
               "spare hosts");
    expect_msg(rk_hosts_parse_list(&g_hs, "h1", 1, &e), RK_EINVAL, &e,
               "already one of the job's hosts");
    assert_int_equal(g_hs.n, 2);
    /* NULL arguments. */
    assert_int_equal(rk_hosts_parse_list(&g_hs, NULL, 0, &e), RK_EINVAL);
    assert_int_equal(rk_hosts_parse_list(NULL, "h1", 0, &e), RK_EINVAL);
}

/* More than RK_HOSTS_MAX hosts, spares included; a long entry is quoted cut. */
static void test_list_bounds(void **state)
{
    (void)state;
    static char list[RK_HOSTS_MAX * 8 + 64];
    size_t pos = 0;
    for (int i = 0; i < RK_HOSTS_MAX; i++)
        pos += (size_t)snprintf(list + pos, sizeof list - pos, "%sn%d", i ? "," : "", i);
    rk_err e;
    assert_int_equal(list1(list, &e), RK_OK);
    assert_int_equal(g_hs.n, RK_HOSTS_MAX);
    expect_msg(rk_hosts_parse_list(&g_hs, "s1", 1, &e), RK_EINVAL, &e,
               "spare host list entry 1 ('s1'): more than 1024 hosts (spares included)");
    assert_int_equal(g_hs.n, RK_HOSTS_MAX);
    snprintf(list + pos, sizeof list - pos, ",x");
    expect_list(list, "host list entry 1025 ('x'): more than 1024 hosts");

    char name[300];
    memset(name, 'a', 280);
    strcpy(name + 280, ":x");
    rk_err e2;
    assert_int_equal(list1(name, &e2), RK_EINVAL);
    assert_non_null(strstr(e2.msg, "aaa...'"));
    assert_true(strlen(e2.msg) < 200);
}

/* ---- hostfiles --------------------------------------------------------------------------- */

static void test_text_good(void **state)
{
    (void)state;
    rk_err e;
    const char *text = "# the rack\n"
                       "gpu-a slots=4\n"
                       "\n"
                       "   \t  \n"
                       "gpu-b\tslots=4 max_slots=8   # may take 8\n"
                       "198.18.0.3\n"
                       "  gpu-c slots = 2 max-slots=2\r\n"
                       "fd00::1 slots=3\n"
                       "[fd00::2]#no space before the comment\n"
                       "gpu-d slots=1 # caf\xc3\xa9, \x01 in a comment is ignored\n"
                       "gpu-e";
    assert_int_equal(text1(text, &e), RK_OK);
    assert_int_equal(g_hs.n, 8);
    const char *names[] = {"gpu-a",   "gpu-b",   "198.18.0.3", "gpu-c",
                           "fd00::1", "fd00::2", "gpu-d",      "gpu-e"};
    const int slots[] = {4, 4, 1, 2, 3, 1, 1, 1};
    for (int i = 0; i < 8; i++) {
        assert_string_equal(g_hs.h[i].name, names[i]);
        assert_int_equal(g_hs.h[i].slots, slots[i]);
        assert_int_equal(g_hs.h[i].spare, 0);
    }
    /* After a list: appended; the same host in both is refused. */
    assert_int_equal(list1("h1:2", &e), RK_OK);
    assert_int_equal(rk_hosts_parse_text(&g_hs, "h2 slots=2\n", 11, NULL, &e), RK_OK);
    assert_int_equal(g_hs.n, 2);
    expect_msg(rk_hosts_parse_text(&g_hs, "h3\nH1 slots=2\n", 14, NULL, &e), RK_EFORMAT, &e,
               "hostfile: line 2: host H1 twice: it is already one of the job's hosts");
    assert_int_equal(g_hs.n, 2);
}

static void test_text_refusals(void **state)
{
    (void)state;
    expect_text("", "hostfile /x/h: no host in it");
    expect_text("# only\n\n  \n", "no host in it (only blank lines and comments)");
    expect_text(
        "h1\nh2\nh3 cpus=2\n",
        "hostfile /x/h: line 3: unknown keyword 'cpus' (slots=N and max_slots=N are known)");
    expect_text("h1 h2\n", "line 1: 'h2' after the host is not KEYWORD=VALUE (one host a line)");
    expect_text("h1 slots\n", "'slots' after the host is not KEYWORD=VALUE");
    expect_text("h1 =4\n", "an '=' without a keyword before it");
    expect_text("h1 slots=0\n", "line 1: slots '0' is not a whole number in 1..256");
    expect_text("h1 slots=257\n", "slots '257' is not a whole number in 1..256");
    expect_text("h1 slots=4x\n", "slots '4x' is not a whole number");
    expect_text("h1 slots==4\n", "slots '=4' is not a whole number");
    expect_text("h1 slots=\n", "slots= without a value");
    expect_text("h1 slots= # c\n", "slots= without a value");
    expect_text("h1 slots=2 slots=2\n", "slots given twice");
    expect_text("h1 slots=4 max_slots=2\n", "max_slots 2 is less than the 4 slots");
    expect_text("h1 max_slots=0\n", "max_slots '0' is not a whole number from 1");
    expect_text("h1 max_slots=1 max-slots=1\n", "max_slots given twice");
    expect_text("h1:4\n", "line 1: neither a host name nor an IPv6 address (a hostfile gives "
                          "slots as slots=N)");
    expect_text("ok\nh\x07x slots=2\n", "line 2: byte 2 is a control character (0x07)");
    expect_text("h1 slots=2\xc3\xa9\n", "line 1: byte 11 is not ASCII (0xc3)");
    expect_text("h1\r\r\n", "byte 3 is a control character (0x0d)");
    expect_text("h@1\n", "'@' is not allowed in a host name");
    expect_text("h1\nh2\nh1 slots=2\n", "line 3: host h1 twice");
    rk_err e;
    reset();
    expect_msg(rk_hosts_parse_text(&g_hs, "h1\n\0h2\n", 7, "f", &e), RK_EFORMAT, &e,
               "f: line 2: byte 1 is a NUL byte");
    expect_msg(rk_hosts_parse_text(&g_hs, "h1 # \0\n", 7, "f", &e), RK_EFORMAT, &e,
               "byte 6 is a NUL byte");
    assert_int_equal(g_hs.n, 0);
}

/* A failed call leaves the table as it was, byte for byte, whatever it had appended. */
static void test_rollback(void **state)
{
    (void)state;
    rk_err e;
    assert_int_equal(list1("h1:2,h2:2", &e), RK_OK);
    assert_int_equal(rk_hosts_parse_list(&g_hs, "s1:1", 1, &e), RK_OK);
    memcpy(&g_before, &g_hs, sizeof g_hs);

    assert_int_equal(rk_hosts_parse_list(&g_hs, "a,b,c,h2", 0, &e), RK_EINVAL);
    assert_memory_equal(&g_hs, &g_before, sizeof g_hs);
    assert_int_equal(rk_hosts_parse_list(&g_hs, "a,b,c:0", 1, &e), RK_EINVAL);
    assert_memory_equal(&g_hs, &g_before, sizeof g_hs);
    const char *text = "a slots=2\nb\nc cpus=1\n";
    assert_int_equal(rk_hosts_parse_text(&g_hs, text, strlen(text), "f", &e), RK_EFORMAT);
    assert_memory_equal(&g_hs, &g_before, sizeof g_hs);
    /* And a good call after them appends where the table ended. */
    assert_int_equal(rk_hosts_parse_list(&g_hs, "a", 0, &e), RK_OK);
    assert_int_equal(g_hs.n, 4);
    assert_string_equal(g_hs.h[3].name, "a");
}

/* ---- reading a hostfile ------------------------------------------------------------------ */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void expect_load(const char *path, int code, const char *want)
{
    rk_err e;
    memcpy(&g_before, &g_hs, sizeof g_hs);
    expect_msg(rk_hosts_load_file(&g_hs, path, &e), code, &e, want);
    assert_memory_equal(&g_hs, &g_before, sizeof g_hs);
}

static void test_load_file(void **state)
{
    (void)state;
    char path[600], other[1200];
    rk_err e;
    reset();
    snprintf(path, sizeof path, "%s/hosts", g_dir);
    write_file(path, "# two\nh1 slots=2\nh2 slots=2\n");
    assert_int_equal(rk_hosts_load_file(&g_hs, path, &e), RK_OK);
    assert_int_equal(g_hs.n, 2);
    assert_int_equal(rk_hosts_slots(&g_hs, NULL, 1), 4);

    /* Its messages say which file. */
    snprintf(path, sizeof path, "%s/bad", g_dir);
    write_file(path, "h3\nh4 cpu=1\n");
    snprintf(other, sizeof other, "hostfile %s: line 2: unknown keyword 'cpu'", path);
    expect_load(path, RK_EFORMAT, other);

    /* A directory (also written with a trailing '/'), a FIFO, a symbolic link to a good
     * file, a file over the limit (sparse: nothing read), a missing one. */
    expect_load(g_dir, RK_EINVAL, "is a directory, not a regular file");
    snprintf(path, sizeof path, "%s/", g_dir);
    expect_load(path, RK_EINVAL, "is a directory, not a regular file");
    expect_load("/", RK_EINVAL, "hostfile /: is a directory");
    snprintf(path, sizeof path, "%s/fifo", g_dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    snprintf(other, sizeof other, "hostfile %s: is a FIFO, not a regular file", path);
    expect_load(path, RK_EINVAL, other);
    snprintf(path, sizeof path, "%s/link", g_dir);
    snprintf(other, sizeof other, "%s/hosts", g_dir);
    assert_int_equal(symlink(other, path), 0);
    expect_load(path, RK_EINVAL, "is a symbolic link, not a regular file");
    snprintf(path, sizeof path, "%s/big", g_dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, RK_HOSTFILE_MAX + 1), 0);
    close(fd);
    expect_load(path, RK_EFORMAT, "file is 1048577 bytes, more than the limit of 1048576");
    snprintf(path, sizeof path, "%s/at-limit", g_dir);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "h9\n", 3), 3);
    assert_int_equal(ftruncate(fd, RK_HOSTFILE_MAX), 0); /* then NULs: refused as text */
    close(fd);
    expect_load(path, RK_EFORMAT, "line 2: byte 1 is a NUL byte");
    snprintf(path, sizeof path, "%s/missing", g_dir);
    expect_load(path, RK_ENOENT, "cannot open");
    snprintf(path, sizeof path, "%s/nodir/hosts", g_dir);
    expect_load(path, RK_ENOENT, "cannot open its directory");
    assert_int_equal(g_hs.n, 2);

    /* A relative path (no directory part). */
    char cwd[600];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(g_dir), 0);
    reset();
    assert_int_equal(rk_hosts_load_file(&g_hs, "hosts", &e), RK_OK);
    assert_int_equal(g_hs.n, 2);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(rk_hosts_load_file(&g_hs, "", &e), RK_EINVAL);
}

/* ---- placement --------------------------------------------------------------------------- */

static void test_place(void **state)
{
    (void)state;
    rk_err e;
    int host_of[16], local_of[16];
    assert_int_equal(list1("h1:2,h2:2,h3:2", &e), RK_OK);
    assert_int_equal(rk_hosts_parse_list(&g_hs, "h4:2", 1, &e), RK_OK);
    assert_int_equal(rk_hosts_slots(&g_hs, NULL, 0), 6);
    assert_int_equal(rk_hosts_slots(&g_hs, NULL, 1), 8);

    /* 6 ranks: the three hosts, the spare unused. */
    assert_int_equal(rk_hosts_place(&g_hs, NULL, 6, host_of, local_of, &e), 3);
    const int want_host[] = {0, 0, 1, 1, 2, 2}, want_local[] = {0, 1, 0, 1, 0, 1};
    for (int r = 0; r < 6; r++) {
        assert_int_equal(host_of[r], want_host[r]);
        assert_int_equal(local_of[r], want_local[r]);
    }
    /* h2 excluded: h1 takes 0,1, h3 2,3, the spare h4 4,5. */
    unsigned char ex[RK_HOSTS_MAX] = {0};
    ex[1] = 1;
    assert_int_equal(rk_hosts_slots(&g_hs, ex, 0), 4);
    assert_int_equal(rk_hosts_slots(&g_hs, ex, 1), 6);
    assert_int_equal(rk_hosts_place(&g_hs, ex, 6, host_of, local_of, &e), 3);
    const int want_ex[] = {0, 0, 2, 2, 3, 3};
    for (int r = 0; r < 6; r++) {
        assert_int_equal(host_of[r], want_ex[r]);
        assert_int_equal(local_of[r], want_local[r]);
    }
    /* Fewer ranks than slots: the first hosts only, the last one part-filled. */
    assert_int_equal(rk_hosts_place(&g_hs, ex, 3, host_of, local_of, &e), 2);
    assert_int_equal(host_of[2], 2);
    assert_int_equal(local_of[2], 0);
    /* Too few slots: the arrays are not written. */
    ex[3] = 1;
    for (int r = 0; r < 16; r++)
        host_of[r] = local_of[r] = -7;
    expect_msg(rk_hosts_place(&g_hs, ex, 6, host_of, local_of, &e), RK_EINVAL, &e,
               "6 ranks need 6 slots; the hosts not excluded have 4");
    assert_null(strstr(e.msg, "spares"));
    for (int r = 0; r < 16; r++)
        assert_int_equal(host_of[r], -7);
    ex[3] = 0;
    expect_msg(rk_hosts_place(&g_hs, ex, 9, host_of, local_of, &e), RK_EINVAL, &e,
               "9 ranks need 9 slots; the hosts not excluded have 6, spares included");
    memset(ex, 1, 4);
    expect_msg(rk_hosts_place(&g_hs, ex, 1, host_of, local_of, &e), RK_EINVAL, &e,
               "1 rank needs 1 slot; the hosts not excluded have 0");
    assert_int_equal(rk_hosts_place(&g_hs, NULL, 0, host_of, local_of, &e), RK_EINVAL);
    assert_int_equal(rk_hosts_place(&g_hs, NULL, 1, NULL, local_of, &e), RK_EINVAL);

    /* A spare listed first still comes after the hosts; rank 0 is on the first host used. */
    assert_int_equal(list1("s:2", &e), RK_OK);
    g_hs.h[0].spare = 1;
    assert_int_equal(rk_hosts_parse_list(&g_hs, "a:1,b:1", 0, &e), RK_OK);
    assert_int_equal(rk_hosts_place(&g_hs, NULL, 4, host_of, local_of, &e), 3);
    const int want_sp[] = {1, 2, 0, 0}, want_spl[] = {0, 0, 0, 1};
    for (int r = 0; r < 4; r++) {
        assert_int_equal(host_of[r], want_sp[r]);
        assert_int_equal(local_of[r], want_spl[r]);
    }
}

static void test_describe(void **state)
{
    (void)state;
    rk_err e;
    char buf[64];
    assert_int_equal(list1("h1:4,[fd00::7]:8", &e), RK_OK);
    assert_int_equal(rk_hosts_parse_list(&g_hs, "s1:2", 1, &e), RK_OK);
    assert_string_equal(rk_hosts_describe(&g_hs, buf, sizeof buf), "h1:4,[fd00::7]:8,s1:2");
    /* What it writes parses back to the same hosts (spares aside). */
    memcpy(&g_before, &g_hs, sizeof g_hs);
    assert_int_equal(list1(buf, &e), RK_OK);
    assert_int_equal(g_hs.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(g_hs.h[i].name, g_before.h[i].name);
        assert_int_equal(g_hs.h[i].slots, g_before.h[i].slots);
    }
    assert_string_equal(rk_hosts_describe(&g_hs, buf, 12), "h1:4,[fd...");
    assert_string_equal(rk_hosts_describe(&g_hs, buf, 4), "...");
    assert_string_equal(rk_hosts_describe(&g_hs, buf, 1), "");
    reset();
    assert_string_equal(rk_hosts_describe(&g_hs, buf, sizeof buf), "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_good),
        cmocka_unit_test(test_list_refusals),
        cmocka_unit_test(test_list_bounds),
        cmocka_unit_test(test_text_good),
        cmocka_unit_test(test_text_refusals),
        cmocka_unit_test(test_rollback),
        cmocka_unit_test_setup_teardown(test_load_file, setup, teardown),
        cmocka_unit_test(test_place),
        cmocka_unit_test(test_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
