/* Helpers shared by the unit tests that work on real files in RK_TEST_TMPDIR. */
#ifndef RK_TESTUTIL_H
#define RK_TESTUTIL_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

#endif
