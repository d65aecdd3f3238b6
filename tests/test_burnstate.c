/*
 * Tests for the burn-in state file (health/burnstate.h): a record written is read back field
 * for field; a second put with the same key replaces it and leaves the others; a missing file
 * is an empty state; bad files (truncated, wrong types, unknown fields, huge, a directory, a
 * symbolic link, another version) are refused naming the file and the field, and a put over
 * such a file leaves it byte for byte as it was; two writers in two processes lose no record.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "health/burnstate.h"
#include "rekindle/fileio.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_burnstate")

static const char *in_dir(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
    return buf;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path)
{
    uint8_t *buf;
    size_t len;
    rk_err err;
    assert_int_equal(rk_file_read_all(path, &buf, &len, SIZE_MAX, &err), RK_OK);
    return (char *)buf;
}

static rk_burn_record make_record(const char *key, bool ok)
{
    rk_burn_record r;
    memset(&r, 0, sizeof r);
    snprintf(r.key, sizeof r.key, "%s", key);
    snprintf(r.name, sizeof r.name, "NVIDIA GeForce GTX 1070 Ti");
    r.when = 1764660000.25;
    r.duration_s = 600.5;
    r.ok = ok;
    if (!ok)
        snprintf(r.failed, sizeof r.failed, "sgemm: 12 elements wrong in copies 3,7");
    r.gflops = 7123.456789012345;
    r.wrong_elements = ok ? 0 : 12;
    r.bad_addresses = ok ? 0 : 3;
    return r;
}

static void assert_record_equal(const rk_burn_record *a, const rk_burn_record *b)
{
    assert_string_equal(a->key, b->key);
    assert_string_equal(a->name, b->name);
    assert_true(a->when == b->when);
    assert_true(a->duration_s == b->duration_s);
    assert_int_equal(a->ok, b->ok);
    assert_string_equal(a->failed, b->failed);
    assert_true(a->gflops == b->gflops);
    assert_int_equal(a->wrong_elements, b->wrong_elements);
    assert_int_equal(a->bad_addresses, b->bad_addresses);
}

/* A missing file (and a missing directory) is an empty state, not an error. */
static void test_missing_is_empty(void **state)
{
    (void)state;
    char p[600];
    rk_burn_state *s;
    rk_err err = {0};
    assert_int_equal(rk_burn_state_load(in_dir(p, sizeof p, "none.json"), &s, &err), RK_OK);
    assert_int_equal(rk_burn_state_count(s), 0);
    assert_null(rk_burn_state_find(s, "123", "GPU-1"));
    rk_burn_state_free(s);
    assert_int_equal(rk_burn_state_load(in_dir(p, sizeof p, "nodir/x.json"), &s, &err), RK_OK);
    rk_burn_state_free(s);
    assert_int_equal(rk_burn_state_load("", &s, &err), RK_EINVAL);
}

/* Every field survives a put and a load bit for bit (doubles included); the file names its
 * format and version. */
static void test_round_trip(void **state)
{
    (void)state;
    char p[600];
    in_dir(p, sizeof p, "burn.json");
    rk_burn_record a = make_record("0321017051234", false);
    a.wrong_elements = (uint64_t)INT64_MAX; /* the largest count the file holds */
    rk_err err = {0};
    assert_int_equal(rk_burn_state_put(p, &a, &err), RK_OK);
    char *text = read_text(p);
    assert_non_null(strstr(text, "\"format\": \"rekindle-burn-state\""));
    assert_non_null(strstr(text, "\"version\": 1"));
    free(text);
    rk_burn_state *s;
    assert_int_equal(rk_burn_state_load(p, &s, &err), RK_OK);
    assert_int_equal(rk_burn_state_count(s), 1);
    const rk_burn_record *got = rk_burn_state_find(s, "0321017051234", NULL);
    assert_non_null(got);
    assert_record_equal(got, &a);
    assert_ptr_equal(rk_burn_state_at(s, 0), got);
    assert_null(rk_burn_state_at(s, 1));
    rk_burn_state_free(s);
}

/* A put with a key already there replaces that record only; find looks up the serial first,
 * then the UUID. */
static void test_replace_by_key(void **state)
{
    (void)state;
    char p[600];
    in_dir(p, sizeof p, "burn.json");
    rk_err err = {0};
    rk_burn_record a = make_record("SERIAL-A", false), b = make_record("GPU-uuid-b", true);
    assert_int_equal(rk_burn_state_put(p, &a, &err), RK_OK);
    assert_int_equal(rk_burn_state_put(p, &b, &err), RK_OK);
    rk_burn_record a2 = make_record("SERIAL-A", true);
    a2.when = 1764670000.0;
    assert_int_equal(rk_burn_state_put(p, &a2, &err), RK_OK);
    rk_burn_state *s;
    assert_int_equal(rk_burn_state_load(p, &s, &err), RK_OK);
    assert_int_equal(rk_burn_state_count(s), 2);
    assert_record_equal(rk_burn_state_find(s, "SERIAL-A", "GPU-x"), &a2);
    /* no serial: the UUID; an unknown serial falls back to the UUID too */
    assert_record_equal(rk_burn_state_find(s, "", "GPU-uuid-b"), &b);
    assert_record_equal(rk_burn_state_find(s, "nope", "GPU-uuid-b"), &b);
    assert_null(rk_burn_state_find(s, "nope", "GPU-nope"));
    assert_null(rk_burn_state_find(s, NULL, NULL));
    rk_burn_state_free(s);
}

/* The writer refuses a bad record before touching the disk. */
static void test_bad_record_refused(void **state)
{
    (void)state;
    char p[600];
    in_dir(p, sizeof p, "burn.json");
    rk_err err = {0};
    rk_burn_record r = make_record("", true);
    assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "key"));
    r = make_record("k", true);
    snprintf(r.failed, sizeof r.failed, "x");
    assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "failed"));
    r = make_record("k", false);
    r.failed[0] = 0;
    assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EINVAL);
    r = make_record("k", true);
    r.gflops = -1;
    assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "gflops"));
    r = make_record("k\n", true);
    assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EINVAL);
    r = make_record("k", true);
    r.bad_addresses = (uint64_t)INT64_MAX + 1;
    assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "bad_addresses"));
    struct stat st;
    assert_int_equal(stat(p, &st), -1); /* nothing written */
}

#define GOOD_HEAD "{\"format\": \"rekindle-burn-state\", \"version\": 1, \"gpus\": {"
#define GOOD_REC                                                                                   \
    "\"name\": \"n\", \"when\": 1, \"duration_s\": 2, \"ok\": true, \"failed\": \"\", "            \
    "\"gflops\": 3, \"wrong_elements\": 0, \"bad_addresses\": 0"

/* Each bad file: the load's code and a word its message must hold; a put over it changes not
 * a byte of it. */
static void test_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {GOOD_HEAD "\"k\": {" GOOD_REC "}}", "line"}, /* truncated */
        {"", "line"},
        {"[]", "not a JSON object"},
        {"{\"format\": \"rekindle-burn-state\", \"version\": 2, \"gpus\": {}}", "version"},
        {"{\"format\": \"other\", \"version\": 1, \"gpus\": {}}", "format"},
        {"{\"format\": \"rekindle-burn-state\", \"version\": \"1\", \"gpus\": {}}", "version"},
        {"{\"format\": \"rekindle-burn-state\", \"version\": 1}", "gpus: missing"},
        {"{\"format\": \"rekindle-burn-state\", \"version\": 1, \"gpus\": [], \"x\": 1}",
         "unknown field"},
        {GOOD_HEAD "\"k\": 5}}", "not an object"},
        {GOOD_HEAD "\"k\": {" GOOD_REC ", \"extra\": 1}}}", "unknown field \"extra\""},
        {GOOD_HEAD "\"k\": {\"name\": 7, \"when\": 1, \"duration_s\": 2, \"ok\": true, "
                   "\"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 0, "
                   "\"bad_addresses\": 0}}}",
         "name: not a string"},
        {GOOD_HEAD "\"k\": {\"name\": \"n\", \"when\": \"now\", \"duration_s\": 2, \"ok\": true, "
                   "\"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 0, "
                   "\"bad_addresses\": 0}}}",
         "when: not a number"},
        {GOOD_HEAD "\"k\": {\"name\": \"n\", \"when\": 1, \"duration_s\": -2, \"ok\": true, "
                   "\"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 0, "
                   "\"bad_addresses\": 0}}}",
         "duration_s"},
        {GOOD_HEAD "\"k\": {\"name\": \"n\", \"when\": 1, \"duration_s\": 2, \"ok\": 1, "
                   "\"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 0, "
                   "\"bad_addresses\": 0}}}",
         "ok: not true or false"},
        {GOOD_HEAD "\"k\": {\"name\": \"n\", \"when\": 1, \"duration_s\": 2, \"ok\": true, "
                   "\"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 1.5, "
                   "\"bad_addresses\": 0}}}",
         "wrong_elements: not an integer"},
        {GOOD_HEAD "\"k\": {\"name\": \"n\", \"when\": 1, \"duration_s\": 2, \"ok\": true, "
                   "\"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 0, "
                   "\"bad_addresses\": -1}}}",
         "bad_addresses: negative"},
        {GOOD_HEAD "\"k\": {\"name\": \"n\", \"when\": 1, \"duration_s\": 2, \"ok\": true, "
                   "\"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 0}}}",
         "bad_addresses: missing"},
        {GOOD_HEAD "\"k\": {\"name\": \"n\", \"when\": 1, \"duration_s\": 2, \"ok\": false, "
                   "\"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 0, "
                   "\"bad_addresses\": 0}}}",
         "must say what failed"},
        {GOOD_HEAD "\"k\": {" GOOD_REC "}, \"k\": {" GOOD_REC "}}}", "line"}, /* key twice */
        {GOOD_HEAD "\"\": {" GOOD_REC "}}}", "record 1: its key"},
        {GOOD_HEAD "\"k\\u0007\": {" GOOD_REC "}}}", "record 1: its key"},
        {GOOD_HEAD "\"k\": {\"name\": \"a\\u0000b\", \"when\": 1, \"duration_s\": 2, \"ok\": "
                   "true, \"failed\": \"\", \"gflops\": 3, \"wrong_elements\": 0, "
                   "\"bad_addresses\": 0}}}",
         "line"}, /* NUL inside a string: jansson refuses it */
    };
    char p[600];
    in_dir(p, sizeof p, "bad.json");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(p, cases[i].text);
        rk_burn_state *s = (rk_burn_state *)1;
        rk_err err = {0};
        int rc = rk_burn_state_load(p, &s, &err);
        if (rc != RK_EFORMAT || !strstr(err.msg, cases[i].want) || !strstr(err.msg, p))
            print_error("case %zu: rc %d: %s\n", i, rc, err.msg);
        assert_int_equal(rc, RK_EFORMAT);
        assert_null(s);
        assert_non_null(strstr(err.msg, p));
        assert_non_null(strstr(err.msg, cases[i].want));
        rk_burn_record r = make_record("k", true);
        assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EFORMAT);
        assert_non_null(strstr(err.msg, "not overwritten"));
        char *after = read_text(p);
        assert_string_equal(after, cases[i].text);
        free(after);
    }
}

/* Over 1 MiB: refused from its size before parsing. */
static void test_huge_file(void **state)
{
    (void)state;
    char p[600];
    in_dir(p, sizeof p, "huge.json");
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    for (size_t i = 0; i < RK_BURN_STATE_MAX + 1; i++)
        fputc(' ', f);
    fclose(f);
    rk_burn_state *s;
    rk_err err = {0};
    assert_int_equal(rk_burn_state_load(p, &s, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, p));
    rk_burn_record r = make_record("k", true);
    assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EFORMAT);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal((size_t)st.st_size, RK_BURN_STATE_MAX + 1);
}

/* A directory, a FIFO and a symbolic link (to a good state file elsewhere) at the path are
 * refused by the reader and the writer, and the writer leaves them as they were: the writer
 * would replace a link rather than write through it, so the reader does not follow one. */
static void test_not_regular(void **state)
{
    (void)state;
    char p[600], good[600];
    rk_err err = {0};
    rk_burn_state *s;
    rk_burn_record r = make_record("k", true);
    in_dir(p, sizeof p, "dir.json");
    assert_int_equal(mkdir(p, 0755), 0);
    assert_int_equal(rk_burn_state_load(p, &s, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "directory"));
    assert_int_equal(rk_burn_state_put(p, &r, &err), RK_EINVAL);

    in_dir(p, sizeof p, "fifo.json");
    assert_int_equal(mkfifo(p, 0644), 0);
    assert_int_equal(rk_burn_state_load(p, &s, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "FIFO"));

    in_dir(good, sizeof good, "elsewhere.json");
    assert_int_equal(rk_burn_state_put(good, &r, &err), RK_OK);
    in_dir(p, sizeof p, "link.json");
    assert_int_equal(symlink(good, p), 0);
    assert_int_equal(rk_burn_state_load(p, &s, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "symbolic link"));
    rk_burn_record r2 = make_record("k2", false);
    assert_int_equal(rk_burn_state_put(p, &r2, &err), RK_EINVAL);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(rk_burn_state_load(good, &s, &err), RK_OK);
    assert_int_equal(rk_burn_state_count(s), 1); /* the target untouched */
    rk_burn_state_free(s);
}

/* Two processes each putting 40 records of their own into one file: all 80 are there, and
 * the file loads (no lost update, no torn file). */
static void test_two_writers(void **state)
{
    (void)state;
    char p[600];
    in_dir(p, sizeof p, "burn.json");
    enum { PER = 40 };
    pid_t kids[2];
    for (int w = 0; w < 2; w++) {
        kids[w] = fork();
        assert_true(kids[w] >= 0);
        if (kids[w] == 0) {
            for (int i = 0; i < PER; i++) {
                char key[32];
                snprintf(key, sizeof key, "w%d-%02d", w, i);
                rk_burn_record r = make_record(key, i % 2 == 0);
                rk_err err = {0};
                if (rk_burn_state_put(p, &r, &err) != RK_OK)
                    _exit(1);
            }
            _exit(0);
        }
    }
    for (int w = 0; w < 2; w++) {
        int st;
        assert_int_equal(waitpid(kids[w], &st, 0), kids[w]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    rk_burn_state *s;
    rk_err err = {0};
    assert_int_equal(rk_burn_state_load(p, &s, &err), RK_OK);
    assert_int_equal(rk_burn_state_count(s), 2 * PER);
    for (int i = 1; i < rk_burn_state_count(s); i++) /* key order */
        assert_true(strcmp(rk_burn_state_at(s, i - 1)->key, rk_burn_state_at(s, i)->key) < 0);
    rk_burn_state_free(s);
}

/* The path: RK_BURN_STATE when set and not empty, else the default. */
static void test_path(void **state)
{
    (void)state;
    unsetenv(RK_BURN_STATE_ENV);
    assert_string_equal(rk_burn_state_path(), RK_BURN_STATE_DEFAULT);
    setenv(RK_BURN_STATE_ENV, "", 1);
    assert_string_equal(rk_burn_state_path(), RK_BURN_STATE_DEFAULT);
    setenv(RK_BURN_STATE_ENV, "/x/burn.json", 1);
    assert_string_equal(rk_burn_state_path(), "/x/burn.json");
    unsetenv(RK_BURN_STATE_ENV);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_missing_is_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_by_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_record_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_huge_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_regular, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_writers, setup, teardown),
        cmocka_unit_test(test_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
