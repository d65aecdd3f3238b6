/*
 * Tests for rekindle/fileio.h: atomic writes leave either the old or the new content at the
 * target and never a temporary file behind, including when open, write or rename fail (write
 * failures are injected for real with RLIMIT_FSIZE); bounded reads reject missing and
 * oversized files.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rekindle/fileio.h"
#include "testutil.h"

static char g_dir[512];

static int setup(void **state)
{
    (void)state;
    umask(022);
    return test_dir_make(g_dir, sizeof g_dir, "test_fileio");
}

static int teardown(void **state)
{
    (void)state;
    rm_tree(g_dir);
    return 0;
}

static const char *in_dir(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
    return buf;
}

/* Number of entries in the test directory whose name starts with `prefix`. */
static int count_prefix(const char *prefix)
{
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

static int count_tmp_files(const char *base)
{
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s.tmp.", base);
    return count_prefix(prefix);
}

static void assert_content(const char *path, const char *want)
{
    uint8_t *buf;
    size_t len;
    rk_err err;
    assert_int_equal(rk_file_read_all(path, &buf, &len, SIZE_MAX, &err), RK_OK);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(buf, want, len);
    assert_int_equal(buf[len], 0);
    free(buf);
}

static void test_write_creates_file_0644(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "new.txt");
    assert_int_equal(rk_file_write_atomic(p, "hello", 5, &err), RK_OK);
    assert_content(p, "hello");
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal(count_tmp_files("new.txt"), 0);
}

static void test_overwrite_replaces_whole_file(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "over.txt");
    assert_int_equal(rk_file_write_atomic(p, "a much longer first version", 27, &err), RK_OK);
    assert_int_equal(rk_file_write_atomic(p, "v2", 2, &err), RK_OK);
    assert_content(p, "v2");
    assert_int_equal(rk_file_write_atomic(p, "", 0, &err), RK_OK);
    assert_content(p, "");
    assert_int_equal(count_tmp_files("over.txt"), 0);
}

static void test_missing_directory_fails_and_creates_nothing(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "nodir/x.txt");
    assert_int_equal(rk_file_write_atomic(p, "x", 1, &err), RK_ENOENT);
    assert_int_equal(err.code, RK_ENOENT);
    assert_non_null(strstr(err.msg, p));
    assert_null(strchr(err.msg, '\n'));
    assert_int_equal(count_prefix("nodir"), 0);

    rk_afile *f = (rk_afile *)1;
    assert_int_equal(rk_afile_open(&f, p, NULL), RK_ENOENT); /* NULL err is allowed */
    assert_null(f);
}

static void test_target_unchanged_until_commit(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "stream.txt");
    assert_int_equal(rk_file_write_atomic(p, "old", 3, &err), RK_OK);

    rk_afile *f;
    assert_int_equal(rk_afile_open(&f, p, &err), RK_OK);
    assert_string_equal(rk_afile_path(f), p);
    assert_int_equal(rk_afile_write(f, "new ", 4, &err), RK_OK);
    assert_int_equal(rk_afile_write(f, NULL, 0, &err), RK_OK);
    assert_int_equal(rk_afile_write(f, "content", 7, &err), RK_OK);
    assert_content(p, "old"); /* a reader (or a crash) now still sees the old file */
    assert_int_equal(count_tmp_files("stream.txt"), 1);
    assert_int_equal(rk_afile_commit(f, &err), RK_OK);
    assert_content(p, "new content");
    assert_int_equal(count_tmp_files("stream.txt"), 0);
}

static void test_abort_keeps_old_content(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "abort.txt");
    assert_int_equal(rk_file_write_atomic(p, "old", 3, &err), RK_OK);
    rk_afile *f;
    assert_int_equal(rk_afile_open(&f, p, &err), RK_OK);
    assert_int_equal(rk_afile_write(f, "half-written", 12, &err), RK_OK);
    rk_afile_abort(f);
    assert_content(p, "old");
    assert_int_equal(count_tmp_files("abort.txt"), 0);
    rk_afile_abort(NULL);

    /* Abort of a first write leaves no file at all. */
    in_dir(p, sizeof p, "abort-new.txt");
    assert_int_equal(rk_afile_open(&f, p, &err), RK_OK);
    rk_afile_abort(f);
    assert_int_equal(count_prefix("abort-new.txt"), 0);
}

/* A real write failure: the file size limit makes write(2) fail with EFBIG. */
static void test_write_failure_keeps_old_content(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "efbig.txt");
    assert_int_equal(rk_file_write_atomic(p, "old", 3, &err), RK_OK);

    static char big[64 * 1024];
    memset(big, 'x', sizeof big);
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_sa;
    struct rlimit old_lim, lim;
    assert_int_equal(sigaction(SIGXFSZ, &ign, &old_sa), 0);
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
    lim = old_lim;
    lim.rlim_cur = 4096;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);

    int rc1 = rk_file_write_atomic(p, big, sizeof big, &err);
    rk_err err1 = err;

    /* Through the streaming API: the failed write poisons the file, commit refuses it. */
    rk_afile *f;
    int rc_open = rk_afile_open(&f, p, &err);
    int rc_w = rc_open == RK_OK ? rk_afile_write(f, big, sizeof big, &err) : rc_open;
    int rc_w2 = rc_open == RK_OK ? rk_afile_write(f, "x", 1, &err) : rc_open;
    int rc_c = rc_open == RK_OK ? rk_afile_commit(f, &err) : rc_open;
    rk_err err2 = err;

    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old_lim), 0);
    assert_int_equal(sigaction(SIGXFSZ, &old_sa, NULL), 0);

    assert_int_equal(rc1, RK_EIO);
    assert_non_null(strstr(err1.msg, "write failed"));
    assert_non_null(strstr(err1.msg, p));
    assert_int_equal(rc_open, RK_OK);
    assert_int_equal(rc_w, RK_EIO);
    assert_int_equal(rc_w2, RK_EIO);
    assert_int_equal(rc_c, RK_EIO);
    assert_non_null(strstr(err2.msg, "not committed"));
    assert_content(p, "old");
    assert_int_equal(count_tmp_files("efbig.txt"), 0);
}

/* rename(2) fails when the target is a directory: nothing changes, nothing is left. */
static void test_rename_failure_removes_temp(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "isdir");
    assert_int_equal(mkdir(p, 0755), 0);
    assert_int_equal(rk_file_write_atomic(p, "x", 1, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "rename"));
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(count_tmp_files("isdir"), 0);
}

/* Two writers of one path get distinct temporary files; the last commit wins whole. */
static void test_concurrent_writers_do_not_collide(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "two.txt");
    rk_afile *a, *b;
    assert_int_equal(rk_afile_open(&a, p, &err), RK_OK);
    assert_int_equal(rk_afile_open(&b, p, &err), RK_OK);
    assert_int_equal(count_tmp_files("two.txt"), 2);
    assert_int_equal(rk_afile_write(a, "writer a", 8, &err), RK_OK);
    assert_int_equal(rk_afile_write(b, "writer b!", 9, &err), RK_OK);
    assert_int_equal(rk_afile_commit(a, &err), RK_OK);
    assert_content(p, "writer a");
    assert_int_equal(rk_afile_commit(b, &err), RK_OK);
    assert_content(p, "writer b!");
    assert_int_equal(count_tmp_files("two.txt"), 0);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    rk_err err;
    rk_afile *f;
    assert_int_equal(rk_afile_open(&f, "", &err), RK_EINVAL);
    assert_int_equal(rk_afile_open(&f, NULL, &err), RK_EINVAL);
    assert_int_equal(rk_afile_open(NULL, "x", &err), RK_EINVAL);
    char p[1024];
    in_dir(p, sizeof p, "dir/");
    assert_int_equal(rk_afile_open(&f, p, &err), RK_EINVAL);
    assert_null(f);
    assert_int_equal(rk_afile_write(NULL, "x", 1, &err), RK_EINVAL);
    assert_int_equal(rk_afile_commit(NULL, &err), RK_EINVAL);
    assert_int_equal(rk_file_write_atomic("", "x", 1, NULL), RK_EINVAL);

    /* Writing from NULL poisons the file like an I/O failure. */
    in_dir(p, sizeof p, "nullbuf.txt");
    assert_int_equal(rk_afile_open(&f, p, &err), RK_OK);
    assert_int_equal(rk_afile_write(f, NULL, 3, &err), RK_EINVAL);
    assert_int_equal(rk_afile_commit(f, &err), RK_EIO);
    assert_int_equal(count_prefix("nullbuf.txt"), 0);
}

static void test_read_all_missing(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    uint8_t *buf = (uint8_t *)1;
    size_t len = 7;
    in_dir(p, sizeof p, "missing.bin");
    assert_int_equal(rk_file_read_all(p, &buf, &len, SIZE_MAX, &err), RK_ENOENT);
    assert_null(buf);
    assert_int_equal(len, 0);
    assert_non_null(strstr(err.msg, p));
}

static void test_read_all_limit(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    char data[100];
    memset(data, 'q', sizeof data);
    in_dir(p, sizeof p, "hundred.bin");
    assert_int_equal(rk_file_write_atomic(p, data, sizeof data, &err), RK_OK);

    uint8_t *buf;
    size_t len;
    assert_int_equal(rk_file_read_all(p, &buf, &len, 99, &err), RK_EFORMAT);
    assert_null(buf);
    assert_non_null(strstr(err.msg, "limit"));
    assert_non_null(strstr(err.msg, p));

    assert_int_equal(rk_file_read_all(p, &buf, &len, 100, &err), RK_OK);
    assert_int_equal(len, 100);
    assert_memory_equal(buf, data, 100);
    assert_int_equal(buf[100], 0);
    free(buf);
}

static void test_read_all_empty_and_directory(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    uint8_t *buf;
    size_t len;
    in_dir(p, sizeof p, "empty.bin");
    assert_int_equal(rk_file_write_atomic(p, "", 0, &err), RK_OK);
    assert_int_equal(rk_file_read_all(p, &buf, &len, 0, &err), RK_OK);
    assert_int_equal(len, 0);
    assert_non_null(buf);
    assert_int_equal(buf[0], 0);
    free(buf);

    assert_int_equal(rk_file_read_all(g_dir, &buf, &len, SIZE_MAX, &err), RK_EINVAL);
    assert_null(buf);
    assert_non_null(strstr(err.msg, "is a directory, not a regular file"));
}

/* Only regular files are read: a FIFO with no writer is refused at once (the open does not
 * block: alarm() kills the test if it hangs), /dev/zero and /dev/null are refused before a
 * byte is read, each with a message naming the file. */
static void test_read_refuses_fifo_and_devices(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    uint8_t *buf = (uint8_t *)"x";
    size_t len = 7;
    in_dir(p, sizeof p, "fifo.bin");
    assert_int_equal(mkfifo(p, 0600), 0);
    alarm(20);
    assert_int_equal(rk_file_read_all(p, &buf, &len, SIZE_MAX, &err), RK_EINVAL);
    assert_null(buf);
    assert_int_equal(len, 0);
    assert_non_null(strstr(err.msg, p));
    assert_non_null(strstr(err.msg, "is a FIFO, not a regular file"));
    int fd = 5;
    assert_int_equal(rk_file_open_read(p, SIZE_MAX, &fd, NULL, &err), RK_EINVAL);
    assert_int_equal(fd, -1);

    assert_int_equal(rk_file_read_all("/dev/zero", &buf, &len, SIZE_MAX, &err), RK_EINVAL);
    assert_string_equal(err.msg, "/dev/zero: is a character device, not a regular file");
    assert_int_equal(rk_file_read_all("/dev/null", &buf, &len, 10, &err), RK_EINVAL);
    alarm(0);
}

/* The size is checked from fstat before reading; read_exact reports a file that ends early. */
static void test_open_read_checks_size_first(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    in_dir(p, sizeof p, "ten.bin");
    assert_int_equal(rk_file_write_atomic(p, "0123456789", 10, &err), RK_OK);
    int fd;
    uint64_t size = 0;
    assert_int_equal(rk_file_open_read(p, 9, &fd, &size, &err), RK_EFORMAT);
    assert_int_equal(fd, -1);
    assert_non_null(strstr(err.msg, "file is 10 bytes, more than the limit of 9"));
    assert_int_equal(rk_file_open_read(p, 10, &fd, &size, &err), RK_OK);
    assert_int_equal(size, 10);
    char b[16];
    assert_int_equal(rk_file_read_exact(fd, b, 4, p, &err), RK_OK);
    assert_memory_equal(b, "0123", 4);
    assert_int_equal(rk_file_read_exact(fd, b, 8, p, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "file ended after 6 of 8 bytes"));
    close(fd);
}

/* rk_file_openat_read never follows a symbolic link, wherever it points. */
static void test_openat_refuses_symlinks(void **state)
{
    (void)state;
    char p[1024], l[1024];
    rk_err err;
    in_dir(p, sizeof p, "real.txt");
    assert_int_equal(rk_file_write_atomic(p, "secret", 6, &err), RK_OK);
    in_dir(l, sizeof l, "link.txt");
    assert_int_equal(symlink("real.txt", l), 0);
    int dfd = open(g_dir, O_RDONLY | O_DIRECTORY);
    assert_true(dfd >= 0);
    int fd;
    uint64_t size;
    assert_int_equal(rk_file_openat_read(dfd, "real.txt", NULL, 100, &fd, &size, &err), RK_OK);
    assert_int_equal(size, 6);
    close(fd);
    assert_int_equal(rk_file_openat_read(dfd, "link.txt", l, 100, &fd, &size, &err), RK_EINVAL);
    assert_int_equal(fd, -1);
    assert_non_null(strstr(err.msg, "link.txt: is a symbolic link"));
    assert_null(strstr(err.msg, "secret"));
    assert_int_equal(rk_file_openat_read(dfd, "../x", NULL, 100, &fd, &size, &err), RK_EINVAL);
    close(dfd);
}

/* rk_file_open_read_nofollow: a whole path, its last component never a link; links above it
 * are followed as in any path. */
static void test_open_nofollow_path(void **state)
{
    (void)state;
    char p[1024], l[1024], d[1024], via[1100];
    rk_err err;
    in_dir(p, sizeof p, "nf-real.txt");
    assert_int_equal(rk_file_write_atomic(p, "secret", 6, &err), RK_OK);
    in_dir(l, sizeof l, "nf-link.txt");
    assert_int_equal(symlink("nf-real.txt", l), 0);
    int fd;
    uint64_t size;
    assert_int_equal(rk_file_open_read_nofollow(p, NULL, 100, &fd, &size, &err), RK_OK);
    assert_int_equal(size, 6);
    close(fd);
    assert_int_equal(rk_file_open_read_nofollow(l, "the state", 100, &fd, &size, &err), RK_EINVAL);
    assert_int_equal(fd, -1);
    assert_non_null(strstr(err.msg, "the state: is a symbolic link"));
    /* a linked directory above the file is fine */
    in_dir(d, sizeof d, "nf-dirlink");
    assert_int_equal(symlink(".", d), 0);
    snprintf(via, sizeof via, "%s/nf-real.txt", d);
    assert_int_equal(rk_file_open_read_nofollow(via, NULL, 100, &fd, &size, &err), RK_OK);
    close(fd);
    assert_int_equal(rk_file_open_read_nofollow(p, NULL, 3, &fd, &size, &err), RK_EFORMAT);
    snprintf(via, sizeof via, "%s/missing/x", g_dir);
    assert_int_equal(rk_file_open_read_nofollow(via, NULL, 100, &fd, &size, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "cannot open its directory"));
    assert_int_equal(rk_file_open_read_nofollow("", NULL, 100, &fd, &size, &err), RK_EINVAL);
}

/* Files whose size stat cannot tell (procfs reports 0) are read to EOF and still bounded. */
static void test_read_all_unsized_file(void **state)
{
    (void)state;
    const char *p = "/proc/self/maps";
    if (access(p, R_OK) != 0)
        skip();
    rk_err err;
    uint8_t *buf;
    size_t len;
    assert_int_equal(rk_file_read_all(p, &buf, &len, SIZE_MAX, &err), RK_OK);
    assert_true(len > 100);
    assert_int_equal(buf[len], 0);
    assert_int_equal(strlen((char *)buf), len);
    free(buf);
    assert_int_equal(rk_file_read_all(p, &buf, &len, 100, &err), RK_EFORMAT);
    assert_null(buf);
}

static void test_fsync_dir(void **state)
{
    (void)state;
    char p[1024];
    rk_err err;
    assert_int_equal(rk_fsync_dir(g_dir, &err), RK_OK);
    in_dir(p, sizeof p, "no-such-dir");
    assert_int_equal(rk_fsync_dir(p, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, p));
    assert_int_equal(rk_fsync_dir("", &err), RK_EINVAL);
}

/* A bare file name resolves against the working directory, whose fsync must work too. */
static void test_relative_path(void **state)
{
    (void)state;
    char cwd[1024];
    rk_err err;
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(g_dir), 0);
    int rc = rk_file_write_atomic("rel.txt", "rel", 3, &err);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(rc, RK_OK);
    char p[1024];
    assert_content(in_dir(p, sizeof p, "rel.txt"), "rel");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_creates_file_0644),
        cmocka_unit_test(test_overwrite_replaces_whole_file),
        cmocka_unit_test(test_missing_directory_fails_and_creates_nothing),
        cmocka_unit_test(test_target_unchanged_until_commit),
        cmocka_unit_test(test_abort_keeps_old_content),
        cmocka_unit_test(test_write_failure_keeps_old_content),
        cmocka_unit_test(test_rename_failure_removes_temp),
        cmocka_unit_test(test_concurrent_writers_do_not_collide),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_read_all_missing),
        cmocka_unit_test(test_read_all_limit),
        cmocka_unit_test(test_read_all_empty_and_directory),
        cmocka_unit_test(test_read_all_unsized_file),
        cmocka_unit_test(test_read_refuses_fifo_and_devices),
        cmocka_unit_test(test_open_read_checks_size_first),
        cmocka_unit_test(test_openat_refuses_symlinks),
        cmocka_unit_test(test_open_nofollow_path),
        cmocka_unit_test(test_fsync_dir),
        cmocka_unit_test(test_relative_path),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
