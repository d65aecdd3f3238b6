/*
 * libFuzzer target for the file names of the checkpoint store and the snapshot store
 * (rk_ckpt_name_step, rk_snap_name_step, rk_ckpt_aside_step and the temporary-file names of
 * ckpt_internal.h): any input is either not a name, or exactly the name the writer makes of
 * what was read from it (one spelling per step), never both a checkpoint's and a snapshot's.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/ckpt.h"
#include "rekindle/snap.h"
#include "runtime/ckpt_internal.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096 || memchr(data, '\0', size))
        return 0;
    char *s = malloc(size + 1);
    check(s != NULL);
    memcpy(s, data, size);
    s[size] = '\0';

    char name[RK_CKPT_NAME_MAX];
    int64_t a = -1, b = -1, when = -1;
    int is_ckpt = rk_ckpt_name_step(s, &a);
    int is_snap = rk_snap_name_step(s, &b);
    check(!(is_ckpt && is_snap));
    if (is_ckpt) {
        check(a >= 0 && rk_ckpt_file_name(a, name, sizeof name) == RK_OK);
        check(strcmp(name, s) == 0);
    }
    if (is_snap) {
        check(b >= 0 && rk_snap_file_name(b, name, sizeof name) == RK_OK);
        check(strcmp(name, s) == 0);
    }
    if (rk_ckpt_aside_step(s, &a, &when)) {
        check(a >= 0 && when >= 0 && rk_ckpt_file_name(a, name, sizeof name) == RK_OK);
        check(strncmp(s, name, strlen(name)) == 0);
        check(strncmp(s + strlen(name), RK_CKPT_ASIDE_TAG, strlen(RK_CKPT_ASIDE_TAG)) == 0);
    }
    char base[RK_CKPT_NAME_MAX];
    long pid = 0;
    if (ckpt_temp_split(s, base, &pid)) {
        size_t bl = strlen(base);
        check(pid > 0 && pid <= INT_MAX && bl < RK_CKPT_NAME_MAX);
        check(strncmp(s, base, bl) == 0 && strncmp(s + bl, ".tmp.", 5) == 0);
        long pid2 = 0;
        check(ckpt_temp_pid(s, &pid2) ==
              (strcmp(base, "latest") == 0 || rk_ckpt_name_step(base, NULL)));
    }
    free(s);
    return 0;
}
