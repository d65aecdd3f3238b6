/*
 * Tests for the kernel log's Xid reader (health/kmsg.h): /dev/kmsg records and their variants
 * (caller ids, continuation lines), every form of the NVRM Xid line seen in drivers (with and
 * without the PCI domain, with a function, pid='<unknown>', name=..., three-digit codes), bus
 * ids normalised to NVML's form, records of the user facility never counted, a record counted
 * once across reads by its sequence number, the journal's export format (text and binary
 * fields, a cut last entry left for later, the facility rule), the bounds and broken input
 * refused with nothing counted; through RK_KMSG_PATH, the merge into samples by bus id.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "health/kmsg.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_kmsg")

static rk_kmsg *fresh(void)
{
    rk_kmsg *k;
    rk_err err = {0};
    assert_int_equal(rk_kmsg_create(&k, &err), RK_OK);
    return k;
}

static int feed(rk_kmsg *k, const char *text, rk_err *err)
{
    return rk_kmsg_feed(k, "log", text, strlen(text), err);
}

static void test_bus_id_norm(void **state)
{
    (void)state;
    char b[32];
    const struct {
        const char *in, *out;
    } ok[] = {
        {"0000:01:00", "00000000:01:00.0"},
        {"00000000:01:00.0", "00000000:01:00.0"},
        {"01:00", "00000000:01:00.0"},
        {"0000:3B:00.0", "00000000:3b:00.0"},
        {"0000:10:1c", "00000000:10:1c.0"},
        {"1:2:3.4", "00000001:02:03.4"},
        {"abcd0001:ff:1f.7", "abcd0001:ff:1f.7"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(rk_kmsg_bus_id_norm(ok[i].in, strlen(ok[i].in), b, sizeof b), 0);
        assert_string_equal(b, ok[i].out);
    }
    const char *bad[] = {"",           "01",           "0000:01:20",  "0000:100:00",
                         "0:0:0:0",    "0000:01:00.8", "0000:01:00.", "123456789:01:00",
                         "0000:01:0g", ":01:00",       "0000:01:00 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(rk_kmsg_bus_id_norm(bad[i], strlen(bad[i]), b, sizeof b), -1);
    assert_int_equal(rk_kmsg_bus_id_norm("01:00", 5, b, 16), -1); /* too small a buffer */
}

static void test_record(void **state)
{
    (void)state;
    rk_kmsg_record r;
    const char *l = "4,1234,567890,-;NVRM: hello";
    assert_int_equal(rk_kmsg_parse_record(l, strlen(l), &r), 0);
    assert_int_equal(r.facility, 0);
    assert_int_equal(r.level, 4);
    assert_int_equal(r.seq, 1234);
    assert_int_equal(r.ts_usec, 567890);
    assert_int_equal(r.msg_len, strlen("NVRM: hello"));
    assert_memory_equal(r.msg, "NVRM: hello", r.msg_len);
    l = "14,7,8,c,caller=T123;user text"; /* facility 1, with a caller id */
    assert_int_equal(rk_kmsg_parse_record(l, strlen(l), &r), 0);
    assert_int_equal(r.facility, 1);
    assert_int_equal(r.level, 6);
    const char *bad[] = {"",
                         "4,1,2;x",
                         "4,1,2,x;m",
                         "a,1,2,-;m",
                         "4,1,2,-",
                         "4,,2,-;m",
                         "1024,1,2,-;m",
                         "4,99999999999999999999,2,-;m",
                         "4,1,2,-,a b;m"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(rk_kmsg_parse_record(bad[i], strlen(bad[i]), &r), -1);
}

static void test_xid_lines(void **state)
{
    (void)state;
    char b[32];
    int x = 0;
    const struct {
        const char *msg, *bus;
        int xid;
    } ok[] = {
        {"NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus.",
         "00000000:01:00.0", 79},
        {"NVRM: Xid (PCI:01:00): 48, pid=77, DBE (double bit error) ECC error", "00000000:01:00.0",
         48},
        {"NVRM: Xid (PCI:0000:3b:00.0): 13, pid='<unknown>', name=<unknown>, Graphics Exception",
         "00000000:3b:00.0", 13},
        {"NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping",
         "00000000:10:1c.0", 63},
        {"NVRM: Xid (PCI:0000:c1:00): 119, pid=2718, name=python3, Timeout after 6s of waiting "
         "for RPC response from GPU0 GSP!",
         "00000000:c1:00.0", 119},
        {"NVRM: Xid (PCI:0000:02:00): 94", "00000000:02:00.0", 94},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(rk_kmsg_parse_xid(ok[i].msg, strlen(ok[i].msg), b, sizeof b, &x), 1);
        assert_string_equal(b, ok[i].bus);
        assert_int_equal(x, ok[i].xid);
    }
    const char *no[] = {
        "NVRM: GPU at PCI:0000:01:00: GPU-1234 has fallen off the bus.",
        "NVRM: Xid (PCI:0000:01:00): 0, pid=1",
        "NVRM: Xid (PCI:0000:01:00): 65536, pid=1",
        "NVRM: Xid (PCI:0000:01:00): x, pid=1",
        "NVRM: Xid (PCI:0000:01:00) 79, pid=1",
        "NVRM: Xid (PCI:0000:01:99): 79, pid=1",
        "nvrm: Xid (PCI:0000:01:00): 79",
        "NVRM: Xid (PCI:0000:01:00): 79x",
        "NVRM: Xid (PCI:",
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        assert_int_equal(rk_kmsg_parse_xid(no[i], strlen(no[i]), b, sizeof b, &x), 0);
}

static const char LOG[] =
    "6,1,100,-;Linux version 6.1\n"
    " SUBSYSTEM=pci\n"
    " DEVICE=+pci:0000:01:00.0\n"
    "3,2,200,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus.\n"
    "3,3,300,-;NVRM: Xid (PCI:0000:01:00): 48, pid=1234, DBE\n"
    "3,4,400,-;NVRM: Xid (PCI:01:00.0): 79, pid='<unknown>', name=<unknown>, off the bus\n"
    "12,5,500,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1, a user wrote this to /dev/kmsg\n"
    "3,6,600,-;NVRM: Xid (PCI:0000:02:00): 13, pid=99, name=app, Graphics Exception\n"
    "\n";

static void test_counts_and_facility(void **state)
{
    (void)state;
    rk_kmsg *k = fresh();
    rk_err err = {0};
    assert_int_equal(feed(k, LOG, &err), RK_OK);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 79), 2); /* not the user's line */
    assert_int_equal(rk_kmsg_count(k, "0000:01:00", 48), 1);
    assert_int_equal(rk_kmsg_count(k, "00000000:02:00.0", 13), 1);
    assert_int_equal(rk_kmsg_count(k, "00000000:02:00.0", 79), 0);
    rk_kmsg_free(k);
}

static void test_seq_dedupe(void **state)
{
    (void)state;
    rk_kmsg *k = fresh();
    rk_err err = {0};
    assert_int_equal(feed(k, LOG, &err), RK_OK);
    assert_int_equal(feed(k, LOG, &err), RK_OK); /* the same records again: counted once */
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 79), 2);
    /* the log grown by two records: only those are new */
    char more[2048];
    snprintf(more, sizeof more, "%s%s", LOG,
             "3,7,700,-;NVRM: Xid (PCI:0000:01:00): 79, pid=5, off the bus\n"
             "3,8,800,-;NVRM: Xid (PCI:0000:01:00): 95, pid=5, uncontained\n");
    assert_int_equal(feed(k, more, &err), RK_OK);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 79), 3);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 95), 1);
    /* a record repeated within one text, or older than the last one taken, is skipped */
    assert_int_equal(feed(k,
                          "3,8,800,-;NVRM: Xid (PCI:0000:01:00): 95, pid=5, again\n"
                          "3,3,300,-;NVRM: Xid (PCI:0000:01:00): 48, pid=5, old\n",
                          &err),
                     RK_OK);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 95), 1);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 48), 1);
    rk_kmsg_free(k);
}

static void test_garbage_counts_nothing(void **state)
{
    (void)state;
    const char *bad[] = {
        "3,2,200,-;NVRM: Xid (PCI:0000:01:00): 79, x\nnot a record\n",
        " KEY=continuation first\n3,2,200,-;NVRM: Xid (PCI:0000:01:00): 79, x\n",
        "3,2,200,-;NVRM: Xid (PCI:0000:01:00): 79, x\n3,3,300;no flags\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rk_kmsg *k = fresh();
        rk_err err = {0};
        assert_int_equal(feed(k, bad[i], &err), RK_EFORMAT);
        assert_non_null(strstr(err.msg, "log: line "));
        assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 79), 0);
        rk_kmsg_free(k);
    }
    /* a NUL byte, and a line over the bound */
    rk_kmsg *k = fresh();
    rk_err err = {0};
    static const char nul[] = "3,2,200,-;NVRM: Xid (PCI:0000:01:00): 79\0, x\n";
    assert_int_equal(rk_kmsg_feed(k, "log", nul, sizeof nul - 1, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "NUL"));
    size_t n = RK_KMSG_LINE_MAX + 64;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, 'x', n);
    memcpy(big, "3,2,200,-;", 10);
    big[n - 1] = '\n';
    big[n] = 0;
    assert_int_equal(rk_kmsg_feed(k, "log", big, n, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "longer than"));
    free(big);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 79), 0);
    rk_kmsg_free(k);
}

static void test_pairs_bound(void **state)
{
    (void)state;
    rk_kmsg *k = fresh();
    rk_err err = {0};
    size_t cap = 200 * (RK_KMSG_PAIRS_MAX + 10);
    char *t = malloc(cap);
    assert_non_null(t);
    size_t used = 0;
    for (int i = 0; i < RK_KMSG_PAIRS_MAX + 10; i++)
        used +=
            (size_t)snprintf(t + used, cap - used,
                             "3,%d,%d,-;NVRM: Xid (PCI:0000:01:00): %d, pid=1\n", i + 1, i, i + 1);
    assert_int_equal(rk_kmsg_feed(k, "log", t, used, &err), RK_OK);
    assert_int_equal(rk_kmsg_dropped(k), 10);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 1), 1);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", RK_KMSG_PAIRS_MAX + 1), 0);
    free(t);
    rk_kmsg_free(k);
}

/* journalctl -o export: a text entry, a binary MESSAGE, a user-facility entry, a cut entry */
static size_t put_binary(char *p, const char *name, const char *v, size_t n)
{
    size_t o = (size_t)sprintf(p, "%s\n", name);
    for (int b = 0; b < 8; b++)
        p[o++] = (char)(((uint64_t)n >> (8 * b)) & 0xff);
    memcpy(p + o, v, n);
    o += n;
    p[o++] = '\n';
    return o;
}

static void test_export(void **state)
{
    (void)state;
    char t[4096];
    size_t n = 0;
    n += (size_t)sprintf(t + n, "__CURSOR=s=1;i=1\n__REALTIME_TIMESTAMP=1\n_TRANSPORT=kernel\n"
                                "SYSLOG_FACILITY=0\n"
                                "MESSAGE=NVRM: Xid (PCI:0000:01:00): 79, pid=1, off the bus\n\n");
    n += (size_t)sprintf(t + n, "__CURSOR=s=1;i=2\n_TRANSPORT=kernel\nSYSLOG_FACILITY=0\n");
    static const char bin[] = "NVRM: Xid (PCI:0000:01:00): 48, pid=1, \x01 DBE";
    n += put_binary(t + n, "MESSAGE", bin, sizeof bin - 1);
    n += (size_t)sprintf(t + n, "\n");
    n += (size_t)sprintf(t + n, "__CURSOR=s=1;i=3\n_TRANSPORT=kernel\nSYSLOG_FACILITY=1\n"
                                "MESSAGE=NVRM: Xid (PCI:0000:01:00): 79, pid=1, user\n\n");
    n += (size_t)sprintf(t + n, "__CURSOR=s=1;i=4\n_TRANSPORT=kernel\n"
                                "MESSAGE=NVRM: Xid (PCI:0000:01:00): 79, no facility\n\n");
    size_t whole = n;
    n += (size_t)sprintf(t + n, "__CURSOR=s=1;i=5\nSYSLOG_FACILITY=0\nMESSAGE=NVRM: Xid (PC");
    rk_kmsg *k = fresh();
    rk_err err = {0};
    /* complete: the cut entry is an error, and nothing counts */
    assert_int_equal(rk_kmsg_feed_export(k, "j", t, n, true, &err), RK_EFORMAT);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 79), 0);
    /* cut output: the whole entries count, the last waits */
    assert_int_equal(rk_kmsg_feed_export(k, "j", t, n, false, &err), RK_OK);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 79), 1);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 48), 1);
    assert_int_equal(rk_kmsg_feed_export(k, "j", t, whole, true, &err), RK_OK);
    /* broken entries */
    const char *bad[] = {
        "__CURSOR=a\nlower=1\n\n",
        "MESSAGE=no cursor\n\n",
        "__CURSOR=a b\n\n",
        "\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rk_kmsg *k2 = fresh();
        assert_int_equal(rk_kmsg_feed_export(k2, "j", bad[i], strlen(bad[i]), true, &err),
                         RK_EFORMAT);
        assert_true(strncmp(err.msg, "j: entry ", 9) == 0);
        rk_kmsg_free(k2);
    }
    char huge[64];
    size_t hn = (size_t)sprintf(huge, "__CURSOR=a\nMESSAGE\n");
    for (int b = 0; b < 8; b++)
        huge[hn++] = (char)(b == 4 ? 1 : 0); /* 2^32 bytes */
    assert_int_equal(rk_kmsg_feed_export(k, "j", huge, hn, false, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "binary field"));
    rk_kmsg_free(k);
}

static void test_file_source_and_merge(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/kmsg.txt", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(LOG, f);
    fclose(f);
    setenv(RK_KMSG_ENV, path, 1);
    rk_kmsg *k = fresh();
    rk_err err = {0};
    assert_int_equal(rk_kmsg_read(k, &err), RK_OK);
    assert_int_equal(rk_kmsg_read(k, &err), RK_OK); /* re-read: nothing twice */
    assert_string_equal(rk_kmsg_source(k), path);
    rk_gpu_info in[3] = {0};
    rk_gpu_sample s[3] = {0};
    strcpy(in[0].bus_id, "00000000:01:00.0");
    strcpy(in[1].bus_id, "00000000:05:00.0");
    strcpy(in[2].bus_id, "00000000:02:00.0");
    for (int i = 0; i < 3; i++)
        rk_field_set(&s[i], RK_F_TEMP);
    s[2].xid_count = 5; /* NVML counted more than the log holds for GPU 2 */
    s[2].last_xid = 31;
    rk_field_set(&s[2], RK_F_XID);
    rk_kmsg_merge(k, in, s, 3);
    assert_true(rk_field_valid(&s[0], RK_F_XID));
    assert_int_equal(s[0].xid_count, 3);
    assert_int_equal(s[0].last_xid, 79); /* the latest record (seq 4) */
    assert_int_equal(s[0].nxids, 2);
    assert_int_equal(s[0].xids[0].xid, 79); /* the most frequent first */
    assert_int_equal(s[0].xids[0].count, 2);
    assert_int_equal(s[0].xids[1].xid, 48);
    assert_true(rk_field_valid(&s[1], RK_F_XID)); /* read, none for it: 0 */
    assert_int_equal(s[1].xid_count, 0);
    assert_int_equal(s[1].nxids, 0);
    assert_int_equal(s[2].xid_count, 5);
    assert_int_equal(s[2].last_xid, 31);
    assert_int_equal(s[2].nxids, 1);
    rk_kmsg_free(k);
    /* a bad file: an error naming it, nothing counted; a directory: refused */
    f = fopen(path, "w");
    fputs("garbage\n", f);
    fclose(f);
    k = fresh();
    assert_int_equal(rk_kmsg_read(k, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "kmsg.txt: line 1"));
    rk_kmsg_free(k);
    setenv(RK_KMSG_ENV, g_dir, 1);
    k = fresh();
    assert_int_equal(rk_kmsg_read(k, &err), RK_EINVAL);
    rk_kmsg_free(k);
    unsetenv(RK_KMSG_ENV);
}

/* The journal fallback through a fake journalctl in PATH: the export format parsed, the run's
 * argv (-k -b -o export, the cursor of the last entry on the next run), nothing counted twice;
 * a journalctl that fails is RK_EIO, one that prints something else RK_EFORMAT. */
static void write_script(const char *path, const char *body)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n%s", body);
    fclose(f);
    assert_int_equal(chmod(path, 0755), 0);
}

static void journal_fallback(void **state)
{
    (void)state;
    char bin[600], exe[700], args[700], body[2048], path[4096];
    snprintf(bin, sizeof bin, "%s/bin", g_dir);
    assert_int_equal(mkdir(bin, 0755), 0);
    snprintf(exe, sizeof exe, "%s/journalctl", bin);
    snprintf(args, sizeof args, "%s/args", g_dir);
    snprintf(body, sizeof body,
             "cur=\nfor a in \"$@\"; do case $a in --after-cursor=*) cur=${a#--after-cursor=};; "
             "esac; done\n"
             "echo \"$@\" >>%s\n"
             "if [ -z \"$cur\" ]; then printf '__CURSOR=c1\\nSYSLOG_FACILITY=0\\n_TRANSPORT=kernel"
             "\\nMESSAGE=NVRM: Xid (PCI:0000:01:00): 79, pid=1\\n\\n'; fi\n"
             "if [ -z \"$cur\" ] || [ \"$cur\" = c1 ]; then printf '__CURSOR=c2\\nSYSLOG_FACILITY=0"
             "\\n_TRANSPORT=kernel\\nMESSAGE=NVRM: Xid (PCI:0000:01:00): 48, pid=1\\n\\n'; fi\n",
             args);
    write_script(exe, body);
    const char *old = getenv("PATH");
    snprintf(path, sizeof path, "%s:%s", bin, old ? old : "/usr/bin:/bin");
    char *saved = old ? strdup(old) : NULL;
    setenv("PATH", path, 1);
    rk_kmsg *k = fresh();
    rk_err err = {0};
    assert_int_equal(rk_kmsg_read_journal(k, &err), RK_OK);
    assert_int_equal(rk_kmsg_read_journal(k, &err), RK_OK); /* after c2: nothing new */
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 79), 1);
    assert_int_equal(rk_kmsg_count(k, "00000000:01:00.0", 48), 1);
    FILE *f = fopen(args, "r");
    assert_non_null(f);
    char l1[512] = "", l2[512] = "";
    assert_non_null(fgets(l1, sizeof l1, f));
    assert_non_null(fgets(l2, sizeof l2, f));
    fclose(f);
    assert_non_null(strstr(l1, "-k -b -q --no-pager -o export"));
    assert_null(strstr(l1, "--after-cursor"));
    assert_non_null(strstr(l2, "--after-cursor=c2"));
    rk_kmsg_free(k);
    write_script(exe, "exit 1\n");
    k = fresh();
    assert_int_equal(rk_kmsg_read_journal(k, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "journalctl -k failed"));
    rk_kmsg_free(k);
    write_script(exe, "echo 'not the export format'; echo\n");
    k = fresh();
    assert_int_equal(rk_kmsg_read_journal(k, &err), RK_EFORMAT);
    rk_kmsg_free(k);
    if (saved) {
        setenv("PATH", saved, 1);
        free(saved);
    }
}

/* The real device: a line written into /dev/kmsg from user space, even one claiming the kernel's
 * facility ("<3>"), is stored by the kernel with facility "user" and must not be counted,
 * while the reader still takes the device's other records. Skips where /dev/kmsg cannot be
 * written or read (not root, dmesg_restrict). */
static void user_lines_in_the_real_log_never_count(void **state)
{
    (void)state;
    unsetenv(RK_KMSG_ENV);
    int fd = open(RK_KMSG_DEVICE, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        print_message("skipped: %s cannot be written here\n", RK_KMSG_DEVICE);
        return;
    }
    static const char line[] = "<3>NVRM: Xid (PCI:0000:ff:1f.7): 79, pid=1, rekindle test_kmsg: "
                               "a user line that must not count\n";
    ssize_t w = write(fd, line, sizeof line - 1);
    close(fd);
    assert_int_equal(w, (ssize_t)(sizeof line - 1));
    rk_kmsg *k = fresh();
    rk_err err = {0};
    assert_int_equal(rk_kmsg_read(k, &err), RK_OK);
    if (!rk_kmsg_source(k) || strcmp(rk_kmsg_source(k), RK_KMSG_DEVICE) != 0) {
        print_message("skipped: %s cannot be read here (%s)\n", RK_KMSG_DEVICE, rk_kmsg_note(k));
        rk_kmsg_free(k);
        return;
    }
    assert_int_equal(rk_kmsg_read(k, &err), RK_OK); /* the kept device: only what is new */
    assert_int_equal(rk_kmsg_count(k, "00000000:ff:1f.7", 79), 0);
    rk_kmsg_free(k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bus_id_norm),
        cmocka_unit_test(test_record),
        cmocka_unit_test(test_xid_lines),
        cmocka_unit_test(test_counts_and_facility),
        cmocka_unit_test(test_seq_dedupe),
        cmocka_unit_test(test_garbage_counts_nothing),
        cmocka_unit_test(test_pairs_bound),
        cmocka_unit_test(test_export),
        cmocka_unit_test_setup_teardown(test_file_source_and_merge, setup, teardown),
        cmocka_unit_test(user_lines_in_the_real_log_never_count),
        cmocka_unit_test_setup_teardown(journal_fallback, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
