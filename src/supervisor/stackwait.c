/*
 * Waiting for a hung rank's stack dump (supervisor/stackwait.h): the file's size, looked at
 * without following a link, against the time it last changed.
 */
#include "supervisor/stackwait.h"

#include <sys/stat.h>

/* The size of a regular file at `path` (not a link), -1 if there is none. */
static off_t file_size(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    return st.st_size;
}

void rk_stack_wait_begin(rk_stack_wait *w, const char *path, double now)
{
    off_t size = file_size(path);
    w->from = w->size = size < 0 ? 0 : size;
    w->asked = w->changed = now;
    w->grew = 0;
}

int rk_stack_wait_complete(rk_stack_wait *w, const char *path, double now)
{
    off_t size = file_size(path);
    if (size >= 0 && size != w->size) {
        w->size = size;
        w->grew = 1;
        w->changed = now;
    }
    return w->grew && now - w->changed >= RK_STACKS_STILL_S;
}

int rk_stack_wait_over(rk_stack_wait *w, const char *path, double now)
{
    return rk_stack_wait_complete(w, path, now) || now - w->asked >= RK_STACKS_WAIT_S;
}
