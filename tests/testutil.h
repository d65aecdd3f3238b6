/* Helpers shared by the unit tests that work on real files in RK_TEST_TMPDIR. */
#ifndef RK_TESTUTIL_H
#define RK_TESTUTIL_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef RK_TEST_TMPDIR
#define RK_TEST_TMPDIR "/tmp"
#endif

/* Remove a directory tree of plain files and directories (what these tests create). */
static void rm_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            rm_tree(sub);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* Make RK_TEST_TMPDIR/<name>.<pid> afresh (whatever a crashed run left is removed) and put
 * its path in dir; mkdir's result. */
static int test_dir_make(char *dir, size_t cap, const char *name)
{
    snprintf(dir, cap, "%s/%s.%ld", RK_TEST_TMPDIR, name, (long)getpid());
    rm_tree(dir);
    return mkdir(dir, 0755);
}

/* The usual fixture: g_dir, and cmocka setup / teardown that make it afresh before each test
 * and remove it after. */
#define RK_TEST_DIR_FIXTURE(name)                                                                  \
    static char g_dir[512];                                                                        \
    static int setup(void **state)                                                                 \
    {                                                                                              \
        (void)state;                                                                               \
        return test_dir_make(g_dir, sizeof g_dir, name);                                           \
    }                                                                                              \
    static int teardown(void **state)                                                              \
    {                                                                                              \
        (void)state;                                                                               \
        rm_tree(g_dir);                                                                            \
        return 0;                                                                                  \
    }

#endif
