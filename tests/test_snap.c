/*
 * Tests for rekindle/snap.h, the node's snapshot store: generation names; the job's directory
 * (0700, ours, never through a link); put/get round trips with the bytes of rk_ckpt_encode;
 * two generations per rank; the agreed step over staggered ranks, past a flipped byte and past
 * a link or a FIFO in place of a generation; failed puts that leave the previous generation;
 * a rank SIGKILLed in the middle of its copy (the torn copy is never returned, the next put
 * removes it); the room rule; removing the directory; pins (a hard link to a generation that
 * outlives it, kept two, counted once, agreed on) and DIR/held.
 */
#define _POSIX_C_SOURCE 200809L

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "rekindle/ckpt.h"
#include "rekindle/fileio.h"
#include "rekindle/snap.h"
#include "testutil.h"

static char g_dir[512];
static char g_shm[RK_SNAP_PATH_MAX]; /* a snapshot directory in /dev/shm, removed at the end */

static int setup(void **state)
{
    (void)state;
    umask(022);
    return test_dir_make(g_dir, sizeof g_dir, "test_snap");
}

static int teardown(void **state)
{
    (void)state;
    rm_tree(g_dir);
    if (g_shm[0])
        rm_tree(g_shm);
    return 0;
}

/* A fresh snapshot directory under g_dir. */
static void job_dir(char *out, size_t cap)
{
    rk_err err = {0};
    int rc = rk_snap_dir_make(g_dir, out, cap, &err);
    if (rc)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, RK_OK);
}

static const char *gen_path(char *buf, size_t cap, const char *dir, int rank, int64_t step)
{
    char name[RK_CKPT_NAME_MAX];
    assert_int_equal(rk_snap_file_name(step, name, sizeof name), RK_OK);
    int n = snprintf(buf, cap, "%s/rank-%d/%s", dir, rank, name);
    assert_true(n > 0 && (size_t)n < cap);
    return buf;
}

/* ---- a small state whose content depends on rank and step ------------------------------- */

typedef struct rstate {
    float w[6], m[6];
    uint8_t rng[9];
    int64_t shape_w[2], shape_rng[1];
    rk_ckpt_item items[3];
    rk_ckpt_meta meta;
} rstate;

static void state_init(rstate *s, int rank, int64_t step)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 6; i++) {
        s->w[i] = (float)step + 0.25f * (float)i + 100.0f * (float)rank;
        s->m[i] = -(float)step * 0.5f - (float)i;
    }
    for (int i = 0; i < 9; i++)
        s->rng[i] = (uint8_t)(step * 31 + i * 7 + rank);
    s->shape_w[0] = 2, s->shape_w[1] = 3;
    s->shape_rng[0] = 9;
    s->items[0] = (rk_ckpt_item){"model.w", "F32", 2, s->shape_w, s->w};
    s->items[1] = (rk_ckpt_item){"optim.m", "F32", 2, s->shape_w, s->m};
    s->items[2] = (rk_ckpt_item){"rng.state", "U8", 1, s->shape_rng, s->rng};
    s->meta = (rk_ckpt_meta){step, 0, step * 8, 3, "{\"model\":\"mlp\"}"};
}

static void put(const char *dir, int rank, int64_t step)
{
    rstate s;
    state_init(&s, rank, step);
    rk_err err = {0};
    int rc = rk_snap_put(dir, rank, &s.meta, s.items, 3, &err);
    if (rc)
        print_error("put rank %d step %" PRId64 ": %s\n", rank, step, err.msg);
    assert_int_equal(rc, RK_OK);
}

/* Generation `step` of `rank` holds exactly what state_init(rank, step) put. */
static void assert_state(const rk_ckpt *c, int rank, int64_t step)
{
    rstate s;
    state_init(&s, rank, step);
    const rk_ckpt_meta *m = rk_ckpt_meta_of(c);
    assert_int_equal(m->step, step);
    assert_int_equal(m->cursor, step * 8);
    assert_int_equal(m->world_size, 3);
    assert_string_equal(m->config_json, s.meta.config_json);
    const rk_st_tensor *t = rk_ckpt_find(c, "model.w");
    assert_non_null(t);
    assert_int_equal(t->nbytes, sizeof s.w);
    assert_memory_equal(t->data, s.w, sizeof s.w);
    t = rk_ckpt_find(c, "rng.state");
    assert_non_null(t);
    assert_memory_equal(t->data, s.rng, sizeof s.rng);
}

static void assert_steps(const char *dir, int rank, size_t n, const int64_t *want)
{
    int64_t got[8];
    size_t m = 99;
    rk_err err = {0};
    assert_int_equal(rk_snap_steps(dir, rank, got, 8, &m, &err), RK_OK);
    if (m != n)
        print_error("rank %d: %zu generations, want %zu\n", rank, m, n);
    assert_int_equal(m, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], want[i]);
}

/* Files in dir whose name contains `part`. */
static int count_named(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        k += strstr(e->d_name, part) != NULL;
    closedir(d);
    return k;
}

static void flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    off_t at = off < 0 ? st.st_size + off : off;
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

/* ---- names ------------------------------------------------------------------------------ */

static void test_generation_names_are_exact(void **state)
{
    (void)state;
    char name[RK_CKPT_NAME_MAX];
    int64_t s = -1;
    assert_int_equal(rk_snap_file_name(120, name, sizeof name), RK_OK);
    assert_string_equal(name, "snap-000000000120.safetensors");
    assert_int_equal(rk_snap_name_step(name, &s), 1);
    assert_int_equal(s, 120);
    assert_int_equal(rk_snap_file_name(INT64_MAX, name, sizeof name), RK_OK);
    assert_int_equal(rk_snap_name_step(name, &s), 1);
    assert_int_equal(s, INT64_MAX);
    assert_int_equal(rk_snap_file_name(-1, name, sizeof name), RK_EINVAL);
    assert_int_equal(rk_snap_file_name(1, name, 10), RK_EINVAL);
    const char *bad[] = {"snap-5.safetensors",
                         "snap-0000000000005.safetensors",
                         "ckpt-000000000005.safetensors",
                         "snap-000000000005.safetensors.tmp.12.0",
                         "snap-00000000000x.safetensors",
                         "snap-000000000005.safetensor",
                         "snap-99999999999999999999.safetensors",
                         ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(rk_snap_name_step(bad[i], NULL), 0);
    /* the store's names are unchanged by sharing the helper */
    assert_int_equal(rk_ckpt_file_name(7, name, sizeof name), RK_OK);
    assert_string_equal(name, "ckpt-000000000007.safetensors");
    assert_int_equal(rk_ckpt_name_step("snap-000000000007.safetensors", NULL), 0);
}

/* ---- the job's directory ---------------------------------------------------------------- */

static void test_directory_is_0700_ours_and_never_a_link(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0700);
    assert_int_equal(st.st_uid, geteuid());
    assert_non_null(strstr(dir, "/" RK_SNAP_DIR_PREFIX));
    assert_int_equal(rk_snap_dir_check(dir, &err), RK_OK);

    /* parents: missing, a regular file */
    snprintf(p, sizeof p, "%s/missing", g_dir);
    char out[RK_SNAP_PATH_MAX];
    assert_int_equal(rk_snap_dir_make(p, out, sizeof out, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "missing"));
    snprintf(p, sizeof p, "%s/plain", g_dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(rk_snap_dir_make(p, out, sizeof out, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "is a regular file, not a directory"));

    /* a directory that is not 0700: every call refuses it and writes nothing */
    snprintf(p, sizeof p, "%s/open", g_dir);
    assert_int_equal(mkdir(p, 0755), 0);
    assert_int_equal(rk_snap_dir_check(p, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "has mode 0755, not 0700"));
    rstate s;
    state_init(&s, 0, 1);
    assert_int_equal(rk_snap_put(p, 0, &s.meta, s.items, 3, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "not 0700"));
    assert_int_equal(count_named(p, "rank-"), 0);
    int64_t step;
    assert_int_equal(rk_snap_agree(p, 1, &step, NULL, 0, &err), RK_EINVAL);

    /* a rank directory that is not 0700 */
    put(dir, 0, 1);
    snprintf(p, sizeof p, "%s/rank-0", dir);
    assert_int_equal(chmod(p, 0750), 0);
    assert_int_equal(rk_snap_get(dir, 0, 1, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "rank-0: has mode 0750, not 0700"));
    assert_int_equal(rk_snap_put(dir, 0, &s.meta, s.items, 3, &err), RK_EINVAL);
    assert_int_equal(chmod(p, 0700), 0);
    assert_int_equal(rk_snap_get(dir, 0, 1, NULL, &err), RK_OK);

    /* a symbolic link to a good directory, as the job's directory or a rank's */
    snprintf(p, sizeof p, "%s/link", g_dir);
    assert_int_equal(symlink(dir, p), 0);
    assert_int_equal(rk_snap_dir_check(p, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "is a symbolic link, not a directory"));
    assert_int_equal(rk_snap_get(p, 0, 1, NULL, &err), RK_EINVAL);
    char rl[RK_SNAP_PATH_MAX + 64], rd[RK_SNAP_PATH_MAX + 64];
    snprintf(rd, sizeof rd, "%s/rank-0", dir);
    snprintf(rl, sizeof rl, "%s/rank-1", dir);
    assert_int_equal(symlink(rd, rl), 0);
    assert_int_equal(rk_snap_get(dir, 1, 1, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "rank-1: is a symbolic link"));
    assert_int_equal(rk_snap_put(dir, 1, &s.meta, s.items, 3, &err), RK_EINVAL);
    assert_int_equal(unlink(rl), 0);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* ---- put and get ------------------------------------------------------------------------ */

static void test_put_get_round_trip_with_the_bytes_of_encode(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    put(dir, 2, 5);
    rk_ckpt *c = NULL;
    assert_int_equal(rk_snap_get(dir, 2, 5, &c, &err), RK_OK);
    assert_state(c, 2, 5);
    assert_non_null(strstr(rk_ckpt_path(c), "/rank-2/snap-000000000005.safetensors"));
    rk_ckpt_free(c);

    /* the file is rk_ckpt_encode's bytes, 0600, in a 0700 rank directory */
    rstate s;
    state_init(&s, 2, 5);
    uint8_t *enc;
    size_t elen;
    assert_int_equal(rk_ckpt_encode(&s.meta, s.items, 3, &enc, &elen, &err), RK_OK);
    uint8_t *file;
    size_t flen;
    assert_int_equal(
        rk_file_read_all(gen_path(p, sizeof p, dir, 2, 5), &file, &flen, SIZE_MAX, &err), RK_OK);
    assert_int_equal(flen, elen);
    assert_memory_equal(file, enc, elen);
    free(file);
    free(enc);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    snprintf(p, sizeof p, "%s/rank-2", dir);
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0700);
    uint64_t held = 0;
    assert_int_equal(rk_snap_bytes(dir, &held, &err), RK_OK);
    assert_int_equal(held, elen);

    /* absent: another step, another rank (no directory), verify-only */
    assert_int_equal(rk_snap_get(dir, 2, 6, &c, &err), RK_ENOENT);
    assert_null(c);
    assert_non_null(strstr(err.msg, "no snapshot of step 6"));
    assert_int_equal(rk_snap_get(dir, 0, 5, &c, &err), RK_ENOENT);
    assert_int_equal(rk_snap_get(dir, 2, 5, NULL, &err), RK_OK);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
    assert_int_equal(lstat(dir, &st), -1);
}

/* Put one F32 tensor of `n` values (a value per step) as generation `step` of rank 0. */
static void put_sized(const char *dir, int64_t step, size_t n)
{
    float *w = malloc(n * sizeof *w);
    assert_non_null(w);
    for (size_t i = 0; i < n; i++)
        w[i] = (float)step + (float)(i % 97);
    int64_t shape[1] = {(int64_t)n};
    rk_ckpt_item it = {"model.w", "F32", 1, shape, w};
    rk_ckpt_meta m = {step, 0, 0, 1, "{}"};
    rk_err err = {0};
    assert_int_equal(rk_snap_put(dir, 0, &m, &it, 1, &err), RK_OK);
    uint8_t *enc;
    size_t elen;
    assert_int_equal(rk_ckpt_encode(&m, &it, 1, &enc, &elen, &err), RK_OK);
    char p[RK_SNAP_PATH_MAX + 64];
    uint8_t *file;
    size_t flen;
    assert_int_equal(
        rk_file_read_all(gen_path(p, sizeof p, dir, 0, step), &file, &flen, SIZE_MAX, &err), RK_OK);
    assert_int_equal(flen, elen); /* a recycled file cut to the new length */
    assert_memory_equal(file, enc, elen);
    free(file);
    free(enc);
    free(w);
}

/* The third put writes over the first generation's file (the one retention drops: same
 * inode, its pages reused) and gives exactly rk_ckpt_encode's bytes, shorter or longer. */
static void test_a_put_writes_over_the_generation_it_drops(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    struct stat st, was;
    put_sized(dir, 1, 100000);
    int old = open(gen_path(p, sizeof p, dir, 0, 1), O_RDONLY | O_CLOEXEC); /* step 1's file */
    assert_true(old >= 0);
    put_sized(dir, 2, 100000);
    put_sized(dir, 3, 1000); /* over step 1's longer file */
    assert_int_equal(lstat(gen_path(p, sizeof p, dir, 0, 3), &st), 0);
    assert_int_equal(fstat(old, &was), 0);
    assert_int_equal(was.st_nlink, 1); /* step 1's file is step 3's now: written over */
    assert_int_equal(was.st_size, st.st_size);
    assert_int_equal(was.st_ino, st.st_ino);
    close(old);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(lstat(gen_path(p, sizeof p, dir, 0, 1), &st), -1);
    put_sized(dir, 4, 300000); /* over step 2's shorter one */
    rk_ckpt *c = NULL;
    assert_int_equal(rk_snap_get(dir, 0, 3, &c, &err), RK_OK);
    rk_ckpt_free(c);
    assert_int_equal(rk_snap_get(dir, 0, 4, &c, &err), RK_OK);
    rk_ckpt_free(c);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

static void test_two_generations_are_kept_and_a_rollback_drops_the_newer(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    for (int64_t s = 1; s <= 5; s++)
        put(dir, 0, s);
    assert_steps(dir, 0, 2, (const int64_t[]){5, 4});
    snprintf(p, sizeof p, "%s/rank-0", dir);
    assert_int_equal(count_named(p, "snap-"), 2); /* nothing else: older ones deleted */
    rk_ckpt *c;
    assert_int_equal(rk_snap_get(dir, 0, 3, &c, &err), RK_ENOENT);
    assert_int_equal(rk_snap_get(dir, 0, 4, &c, &err), RK_OK);
    assert_state(c, 0, 4);
    rk_ckpt_free(c);
    uint64_t held = 0;
    assert_int_equal(rk_snap_bytes(dir, &held, &err), RK_OK);
    struct stat st;
    assert_int_equal(lstat(gen_path(p, sizeof p, dir, 0, 5), &st), 0);
    assert_int_equal(held, 2 * (uint64_t)st.st_size);

    /* putting a step again replaces it; the one below stays */
    put(dir, 0, 5);
    assert_steps(dir, 0, 2, (const int64_t[]){5, 4});
    /* a put below the newest (the job rolled back to an older step): the generations above
     * it are a timeline that was abandoned and go; the newest below it stays */
    put(dir, 0, 2);
    assert_steps(dir, 0, 1, (const int64_t[]){2});
    put(dir, 0, 3);
    assert_steps(dir, 0, 2, (const int64_t[]){3, 2});
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

static void test_failed_puts_write_nothing_and_keep_the_previous_generation(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    rstate s;
    state_init(&s, 0, 1);
    assert_int_equal(rk_snap_put(dir, -1, &s.meta, s.items, 3, &err), RK_EINVAL);
    assert_int_equal(rk_snap_put(dir, 0, NULL, s.items, 3, &err), RK_EINVAL);
    assert_int_equal(rk_snap_put(NULL, 0, &s.meta, s.items, 3, &err), RK_EINVAL);
    s.meta.step = -3;
    assert_int_equal(rk_snap_put(dir, 0, &s.meta, s.items, 3, &err), RK_EINVAL);
    /* a NaN in the weights: refused before anything is made */
    state_init(&s, 0, 1);
    s.w[4] = NAN;
    assert_int_equal(rk_snap_put(dir, 0, &s.meta, s.items, 3, &err), RK_ENONFINITE);
    assert_non_null(strstr(err.msg, "item 'model.w': element 4 is NaN"));
    assert_int_equal(count_named(dir, "rank-"), 0);

    /* a write that fails (RLIMIT_FSIZE: the file cannot grow past 100 bytes) leaves no
     * temporary file, and the previous generation is still there and verifies */
    put(dir, 0, 1);
    put(dir, 0, 2);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = (struct rlimit){100, old.rlim_max}; /* the soft limit: it can be raised again */
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    state_init(&s, 0, 3);
    int rc = rk_snap_put(dir, 0, &s.meta, s.items, 3, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, RK_EIO);
    assert_non_null(strstr(err.msg, "cannot write the snapshot"));
    snprintf(p, sizeof p, "%s/rank-0", dir);
    assert_int_equal(count_named(p, ".tmp."), 0);
    assert_steps(dir, 0, 1, (const int64_t[]){2}); /* step 1 went before the copy began */
    assert_int_equal(rk_snap_get(dir, 0, 2, NULL, &err), RK_OK);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* ---- the agreed step -------------------------------------------------------------------- */

static void test_agree_picks_the_newest_step_every_rank_has(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    int64_t step = 0;
    assert_int_equal(rk_snap_agree(dir, 3, &step, NULL, 0, &err), RK_ENOENT);
    assert_int_equal(step, -1);
    assert_non_null(strstr(err.msg, "rank 0 has no snapshot"));
    /* rank 1 is a step behind: 0 and 2 hold {4, 3}, 1 holds {3, 2} */
    for (int64_t s = 1; s <= 4; s++) {
        put(dir, 0, s);
        put(dir, 2, s);
        if (s <= 3)
            put(dir, 1, s);
    }
    char report[1024];
    assert_int_equal(rk_snap_agree(dir, 3, &step, report, sizeof report, &err), RK_OK);
    assert_int_equal(step, 3);
    assert_string_equal(report, ""); /* nothing skipped: 4 is simply not on rank 1 */
    /* world 1: rank 0 alone agrees on its newest; world 4: rank 3 has nothing */
    assert_int_equal(rk_snap_agree(dir, 1, &step, NULL, 0, &err), RK_OK);
    assert_int_equal(step, 4);
    assert_int_equal(rk_snap_agree(dir, 4, &step, NULL, 0, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "rank 3 has no snapshot"));
    assert_int_equal(rk_snap_agree(dir, 0, &step, NULL, 0, &err), RK_EINVAL);
    /* rank 1 two steps behind (it never happens when ranks step together): no common step */
    put(dir, 0, 5);
    put(dir, 2, 5);
    assert_int_equal(rk_snap_agree(dir, 3, &step, NULL, 0, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "no snapshot step in common"));
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

static void test_a_flipped_byte_is_never_returned_and_agree_falls_back(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    for (int64_t s = 3; s <= 4; s++)
        for (int r = 0; r < 3; r++)
            put(dir, r, s);
    int64_t step;
    assert_int_equal(rk_snap_agree(dir, 3, &step, NULL, 0, &err), RK_OK);
    assert_int_equal(step, 4);

    /* one byte of rank 1's newest generation flipped in place (its last tensor's data) */
    flip_byte(gen_path(p, sizeof p, dir, 1, 4), -2);
    rk_ckpt *c = NULL;
    assert_int_equal(rk_snap_get(dir, 1, 4, &c, &err), RK_EFORMAT);
    assert_null(c);
    assert_non_null(strstr(err.msg, "rank-1/snap-000000000004.safetensors: tensor 'rng.state': "
                                    "data checksum mismatch"));
    char report[2048];
    assert_int_equal(rk_snap_agree(dir, 3, &step, report, sizeof report, &err), RK_OK);
    assert_int_equal(step, 3);
    assert_non_null(strstr(report, "rank-1/snap-000000000004.safetensors: tensor 'rng.state': "
                                   "data checksum mismatch"));
    assert_int_equal(rk_snap_get(dir, 1, 3, &c, &err), RK_OK);
    assert_state(c, 1, 3);
    rk_ckpt_free(c);
    /* the steps are listed by name (complete files), whether they verify or not */
    assert_steps(dir, 1, 2, (const int64_t[]){4, 3});

    /* a flipped byte in rank 2's older generation's header too: nothing verifies in common */
    flip_byte(gen_path(p, sizeof p, dir, 2, 3), 40);
    assert_int_equal(rk_snap_agree(dir, 3, &step, report, sizeof report, &err), RK_ENOENT);
    assert_int_equal(step, -1);
    assert_non_null(strstr(err.msg, "no snapshot step that every rank has and that verifies"));
    assert_non_null(strstr(report, "rank-2/snap-000000000003.safetensors"));
    /* a generation whose content says another step than its name is refused too */
    char q[RK_SNAP_PATH_MAX + 64];
    assert_int_equal(rename(gen_path(p, sizeof p, dir, 0, 3), gen_path(q, sizeof q, dir, 0, 9)), 0);
    assert_int_equal(rk_snap_get(dir, 0, 9, NULL, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "field 'step' is 3 but the file name says 9"));
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

static void test_a_link_or_fifo_in_place_of_a_generation_is_refused(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64], q[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    for (int64_t s = 3; s <= 4; s++)
        for (int r = 0; r < 2; r++)
            put(dir, r, s);
    /* rank 0's step 4 becomes a link to a valid copy of itself outside the directory */
    snprintf(q, sizeof q, "%s/outside.safetensors", g_dir);
    assert_int_equal(rename(gen_path(p, sizeof p, dir, 0, 4), q), 0);
    assert_int_equal(symlink(q, p), 0);
    assert_int_equal(rk_snap_get(dir, 0, 4, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "is a symbolic link, not a regular file"));
    assert_steps(dir, 0, 1, (const int64_t[]){3});
    int64_t step;
    assert_int_equal(rk_snap_agree(dir, 2, &step, NULL, 0, &err), RK_OK);
    assert_int_equal(step, 3);
    /* rank 1's step 4 a FIFO: refused without blocking */
    assert_int_equal(unlink(gen_path(p, sizeof p, dir, 1, 4)), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(rk_snap_get(dir, 1, 4, NULL, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "is a FIFO, not a regular file"));
    assert_steps(dir, 1, 1, (const int64_t[]){3});
    /* the next put deletes the link (not what it points to) and the FIFO */
    put(dir, 0, 5);
    put(dir, 1, 5);
    assert_steps(dir, 0, 2, (const int64_t[]){5, 3});
    struct stat st;
    assert_int_equal(lstat(q, &st), 0);
    assert_int_equal(rk_snap_agree(dir, 2, &step, NULL, 0, &err), RK_OK);
    assert_int_equal(step, 5);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* ---- a rank killed in the middle of its copy -------------------------------------------- */

#define TORN_FLOATS ((size_t)16 << 20) /* 64 MiB */

static void torn_state(float *big, uint8_t *blob, int64_t step, rk_ckpt_item *items,
                       int64_t *shape_big, int64_t *shape_blob)
{
    for (size_t i = 0; i < TORN_FLOATS; i += 4096)
        big[i] = (float)(step + (int64_t)i);
    big[TORN_FLOATS - 1] = (float)(step * 7);
    for (int i = 0; i < 64; i++)
        blob[i] = (uint8_t)(step + i);
    *shape_big = (int64_t)TORN_FLOATS;
    *shape_blob = 64;
    items[0] = (rk_ckpt_item){"model.big", "F32", 1, shape_big, big};
    items[1] = (rk_ckpt_item){"rng.state", "U8", 1, shape_blob, blob};
}

static void assert_torn_state(const rk_ckpt *c, int64_t step)
{
    assert_int_equal(rk_ckpt_meta_of(c)->step, step);
    const rk_st_tensor *t = rk_ckpt_find(c, "model.big");
    assert_non_null(t);
    assert_int_equal(t->nbytes, TORN_FLOATS * sizeof(float));
    float first, last;
    memcpy(&first, t->data, sizeof first);
    memcpy(&last, t->data + t->nbytes - sizeof last, sizeof last);
    assert_true(first == (float)step && last == (float)(step * 7));
    assert_int_equal(rk_ckpt_find(c, "rng.state")->data[5], (uint8_t)(step + 5));
}

/* The name of the child's temporary file in `rdir` (its pid in it), or "" if none yet. */
static void find_temp(const char *rdir, pid_t pid, char *out, size_t cap)
{
    char tag[64];
    snprintf(tag, sizeof tag, ".tmp.%ld.", (long)pid);
    out[0] = '\0';
    DIR *d = opendir(rdir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, tag)) {
            snprintf(out, cap, "%s", e->d_name);
            break;
        }
    closedir(d);
}

/* A child puts a 64 MiB generation and is SIGKILLed when its temporary file has reached a
 * quarter, a half, three quarters of the generation's size (and any first byte), before the
 * rename. After each kill: the torn copy is never returned (get, steps, agree give the previous
 * complete generation, whose content is its step's), and the next put removes the dead
 * writer's temporary file. A child that finished before the kill landed is not a torn copy:
 * that kill point is tried again. In /dev/shm when it has room, else in the test directory. */
static void test_a_rank_killed_mid_copy_never_exposes_a_torn_snapshot(void **state)
{
    (void)state;
    rk_err err = {0};
    char dir[RK_SNAP_PATH_MAX];
    const char *where = RK_SNAP_PARENT_DEFAULT;
    if (rk_snap_dir_make(where, dir, sizeof dir, &err) == RK_OK) {
        int ok = 0;
        char why[512];
        assert_int_equal(rk_snap_room(dir, TORN_FLOATS * 4 + 4096, 2, &ok, why, sizeof why, &err),
                         RK_OK);
        if (!ok) {
            print_message("torn: %s; using %s\n", why, g_dir);
            assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
            where = g_dir;
        }
    } else {
        print_message("torn: %s; using %s\n", err.msg, g_dir);
        where = g_dir;
    }
    if (where == g_dir)
        job_dir(dir, sizeof dir);
    else
        snprintf(g_shm, sizeof g_shm, "%s", dir);

    float *big = malloc(TORN_FLOATS * sizeof *big);
    assert_non_null(big);
    for (size_t i = 0; i < TORN_FLOATS; i++) /* real pages: the timed put reads them all */
        big[i] = (float)(i & 0xffff) * 0.5f;
    uint8_t blob[64];
    int64_t sb, sbl;
    rk_ckpt_item items[2];
    rk_ckpt_meta meta = {1, 0, 0, 1, "{\"model\":\"big\"}"};
    torn_state(big, blob, 1, items, &sb, &sbl);
    assert_int_equal(rk_snap_put(dir, 0, &meta, items, 2, &err), RK_OK);
    meta.step = 2;
    torn_state(big, blob, 2, items, &sb, &sbl);
    double t0 = rk_mono_s();
    assert_int_equal(rk_snap_put(dir, 0, &meta, items, 2, &err), RK_OK);
    double put_s = rk_mono_s() - t0;
    char rdir[RK_SNAP_PATH_MAX + 16], gp[RK_SNAP_PATH_MAX + 64];
    snprintf(rdir, sizeof rdir, "%s/rank-0", dir);
    struct stat st;
    assert_int_equal(stat(gen_path(gp, sizeof gp, dir, 0, 2), &st), 0);
    const off_t full = st.st_size;

    const off_t points[] = {1, full / 4, full / 2, full * 3 / 4};
    const int npoints = (int)(sizeof points / sizeof points[0]);
    int64_t prev = 2;
    int torn = 0, finished_first = 0;
    for (int k = 0; k < npoints; k++) {
        bool landed = false;
        for (int attempt = 0; attempt < 50 && !landed; attempt++) {
            int64_t s = prev + 1;
            pid_t pid = fork();
            assert_true(pid >= 0);
            if (pid == 0) {
                rk_ckpt_meta m = {s, 0, 0, 1, "{\"model\":\"big\"}"};
                torn_state(big, blob, s, items, &sb, &sbl);
                _exit(rk_snap_put(dir, 0, &m, items, 2, NULL) == RK_OK ? 0 : 3);
            }
            /* wait for the temporary file to reach the kill point (or the child to end); a
             * generation of step s that appears first is killed at once: then it must be
             * whole (a writer that wrote under the final name would be caught there) */
            char tmp[256] = "", sp[RK_SNAP_PATH_MAX + 64];
            gen_path(sp, sizeof sp, dir, 0, s);
            bool ended = false;
            int status = 0;
            double deadline = rk_mono_s() + 120.0;
            while (!ended && rk_mono_s() < deadline) {
                if (lstat(sp, &st) == 0) {
                    assert_int_equal(kill(pid, SIGKILL), 0);
                    break;
                }
                if (!tmp[0])
                    find_temp(rdir, pid, tmp, sizeof tmp);
                char tp[RK_SNAP_PATH_MAX + 300];
                snprintf(tp, sizeof tp, "%s/%s", rdir, tmp);
                if (tmp[0] && stat(tp, &st) == 0 && st.st_size >= points[k]) {
                    assert_int_equal(kill(pid, SIGKILL), 0);
                    break;
                }
                ended = waitpid(pid, &status, WNOHANG) == pid;
            }
            if (!ended) {
                assert_int_equal(waitpid(pid, &status, 0), pid);
            }
            char left[256];
            find_temp(rdir, pid, left, sizeof left);
            if (WIFEXITED(status)) {
                assert_int_equal(WEXITSTATUS(status), 0); /* finished first: try again */
                assert_string_equal(left, "");
                finished_first++;
                prev = s;
                continue;
            }
            assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
            if (!left[0]) { /* killed after the rename: the generation is whole */
                rk_ckpt *c = NULL;
                assert_int_equal(rk_snap_get(dir, 0, s, &c, &err), RK_OK);
                assert_torn_state(c, s);
                rk_ckpt_free(c);
                finished_first++;
                prev = s;
                continue;
            }
            /* killed mid-copy: only the previous generation is there and returned */
            landed = true;
            torn++;
            assert_steps(dir, 0, 1, (const int64_t[]){prev});
            rk_ckpt *c = NULL;
            assert_int_equal(rk_snap_get(dir, 0, s, &c, &err), RK_ENOENT);
            assert_int_equal(rk_snap_get(dir, 0, prev, &c, &err), RK_OK);
            assert_torn_state(c, prev);
            rk_ckpt_free(c);
            int64_t agreed = -1;
            assert_int_equal(rk_snap_agree(dir, 1, &agreed, NULL, 0, &err), RK_OK);
            assert_int_equal(agreed, prev);
            uint64_t held = 0;
            assert_int_equal(rk_snap_bytes(dir, &held, &err), RK_OK);
            assert_int_equal(held, (uint64_t)full); /* the temporary file is not counted */
            /* the next put (the relaunched rank) removes the dead writer's temporary file */
            meta.step = s;
            torn_state(big, blob, s, items, &sb, &sbl);
            assert_int_equal(rk_snap_put(dir, 0, &meta, items, 2, &err), RK_OK);
            assert_int_equal(count_named(rdir, ".tmp."), 0);
            assert_steps(dir, 0, 2, (const int64_t[]){s, prev});
            prev = s;
        }
        if (!landed)
            print_error("kill point %d (%lld bytes): every child finished first\n", k,
                        (long long)points[k]);
        assert_true(landed);
    }
    print_message("torn: %d kills mid-copy at 4 points of a %lld-byte generation in %s (%d "
                  "children finished first); one put took %.1f ms (%.2f GB/s)\n",
                  torn, (long long)full, where, finished_first, put_s * 1e3,
                  (double)full / put_s / 1e9);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
    g_shm[0] = '\0';
    free(big);
}

/* ---- room and removal ------------------------------------------------------------------- */

static void test_room_follows_the_documented_rule(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], why[512];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    int ok = -1;
    assert_int_equal(rk_snap_room(dir, 4096, 4, &ok, why, sizeof why, &err), RK_OK);
    assert_int_equal(ok, 1);
    assert_string_equal(why, "");
    /* 1 PiB a generation fits nowhere; the message says by how much */
    assert_int_equal(rk_snap_room(dir, (uint64_t)1 << 50, 2, &ok, why, sizeof why, &err), RK_OK);
    assert_int_equal(ok, 0);
    assert_non_null(strstr(why, "2 generations x 2 ranks x 1073741824.0 MiB"));
    assert_non_null(strstr(why, "MiB short"));
    /* overflow of the need is "does not fit", not a wrap */
    assert_int_equal(rk_snap_room(dir, UINT64_MAX / 2, 3, &ok, NULL, 0, &err), RK_OK);
    assert_int_equal(ok, 0);
    assert_int_equal(rk_snap_room(dir, 1, 0, &ok, NULL, 0, &err), RK_EINVAL);
    /* either side of the rule's edge (the free space moves as other processes write: a
     * generation well inside it, and one well outside); the RAM half is tested below, so here
     * RAM is plenty */
    assert_int_equal(setenv(RK_SNAP_MEMAVAIL_ENV, "4611686018427387904", 1), 0);
    struct statvfs sv;
    assert_int_equal(statvfs(dir, &sv), 0);
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    uint64_t total = (uint64_t)sv.f_blocks * sv.f_frsize;
    uint64_t margin = total / RK_SNAP_MARGIN_DIV;
    if (margin < RK_SNAP_MARGIN_MIN)
        margin = RK_SNAP_MARGIN_MIN;
    if (avail > margin + 2 * 4096) {
        uint64_t fit = (avail - margin) / 2; /* the largest generation of one rank that fits */
        assert_int_equal(rk_snap_room(dir, fit / 2, 1, &ok, NULL, 0, &err), RK_OK);
        assert_int_equal(ok, 1);
        assert_int_equal(rk_snap_room(dir, fit + fit / 2 + 1, 1, &ok, NULL, 0, &err), RK_OK);
        assert_int_equal(ok, 0);
    }
    unsetenv(RK_SNAP_MEMAVAIL_ENV);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* MemAvailable from /proc/meminfo, in bytes; 0 if the kernel does not say. */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kib * 1024;
}

/* tmpfs pages are RAM: snapshots that fit the tmpfs but not MemAvailable (less the margin,
 * plus what the job holds) do not fit, and the message says it is the RAM. The override
 * (RK_SNAP_MEMAVAIL_BYTES, for tests) stands in for MemAvailable. */
static void test_room_also_needs_the_ram(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], why[512];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    int ok = -1;
    /* 4 KiB generations fit the tmpfs; with 1 byte of RAM available they do not fit */
    assert_int_equal(setenv(RK_SNAP_MEMAVAIL_ENV, "1", 1), 0);
    assert_int_equal(rk_snap_room(dir, 4096, 4, &ok, why, sizeof why, &err), RK_OK);
    assert_int_equal(ok, 0);
    assert_non_null(strstr(why, "of RAM"));
    assert_non_null(strstr(why, "MemAvailable, from " RK_SNAP_MEMAVAIL_ENV));
    assert_non_null(strstr(why, "MiB short"));
    /* the margin: 64 MiB of RAM available is not enough for 8 KiB more than nothing... */
    assert_int_equal(setenv(RK_SNAP_MEMAVAIL_ENV, "67108864", 1), 0);
    assert_int_equal(rk_snap_room(dir, 4096, 1, &ok, NULL, 0, &err), RK_OK);
    assert_int_equal(ok, 0);
    /* ... and what the job holds counts as available (its generations are replaced) */
    put(dir, 0, 1);
    put(dir, 1, 1);
    uint64_t held = 0;
    assert_int_equal(rk_snap_bytes(dir, &held, &err), RK_OK);
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long total_kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %llu kB", &total_kib) == 1)
            break;
    if (f)
        fclose(f);
    uint64_t margin = (uint64_t)total_kib * 1024 / RK_SNAP_MARGIN_DIV;
    if (margin < RK_SNAP_MARGIN_MIN)
        margin = RK_SNAP_MARGIN_MIN;
    uint64_t gen = held / 2; /* two ranks, one generation each */
    char v[32];
    /* exactly at the edge: need (2 x 2 x gen) + margin == available + held */
    snprintf(v, sizeof v, "%llu", (unsigned long long)(4 * gen + margin - held));
    assert_int_equal(setenv(RK_SNAP_MEMAVAIL_ENV, v, 1), 0);
    assert_int_equal(rk_snap_room(dir, gen, 2, &ok, why, sizeof why, &err), RK_OK);
    assert_int_equal(ok, 1);
    snprintf(v, sizeof v, "%llu", (unsigned long long)(4 * gen + margin - held - 1));
    assert_int_equal(setenv(RK_SNAP_MEMAVAIL_ENV, v, 1), 0);
    assert_int_equal(rk_snap_room(dir, gen, 2, &ok, why, sizeof why, &err), RK_OK);
    assert_int_equal(ok, 0);
    assert_non_null(strstr(why, "of RAM"));
    /* an override that is not a count is refused, naming it */
    assert_int_equal(setenv(RK_SNAP_MEMAVAIL_ENV, "12G", 1), 0);
    assert_int_equal(rk_snap_room(dir, 4096, 1, &ok, why, sizeof why, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, RK_SNAP_MEMAVAIL_ENV "='12G'"));
    unsetenv(RK_SNAP_MEMAVAIL_ENV);
    /* without the override the node's own MemAvailable decides: a need well inside it fits
     * (when the tmpfs has room too), and a 1 PiB generation says RAM or tmpfs short */
    uint64_t ma = mem_available();
    if (ma > 4 * ((uint64_t)64 << 20)) {
        assert_int_equal(rk_snap_room(dir, 4096, 1, &ok, why, sizeof why, &err), RK_OK);
        assert_int_equal(ok, 1);
    }
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* Each rank's bytes and generations: what rk run's events say of the snapshots. */
static void test_rank_bytes_counts_each_ranks_generations(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    uint64_t b = 1;
    int gens = -1;
    assert_int_equal(rk_snap_rank_bytes(dir, 0, &b, &gens, &err), RK_OK); /* no rank dir yet */
    assert_int_equal(b, 0);
    assert_int_equal(gens, 0);
    put(dir, 0, 1);
    put(dir, 0, 2);
    put(dir, 0, 3); /* two kept */
    put(dir, 2, 7);
    struct stat st;
    assert_int_equal(lstat(gen_path(p, sizeof p, dir, 0, 3), &st), 0);
    assert_int_equal(rk_snap_rank_bytes(dir, 0, &b, &gens, &err), RK_OK);
    assert_int_equal(gens, 2);
    assert_int_equal(b, 2 * (uint64_t)st.st_size);
    assert_int_equal(rk_snap_rank_bytes(dir, 1, &b, &gens, &err), RK_OK);
    assert_int_equal(gens, 0);
    assert_int_equal(rk_snap_rank_bytes(dir, 2, &b, &gens, &err), RK_OK);
    assert_int_equal(gens, 1);
    uint64_t held;
    assert_int_equal(rk_snap_bytes(dir, &held, &err), RK_OK);
    assert_int_equal(held, 3 * (uint64_t)st.st_size);
    assert_int_equal(rk_snap_rank_bytes(dir, -1, &b, &gens, &err), RK_EINVAL);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
    assert_int_equal(rk_snap_rank_bytes(dir, 0, &b, &gens, &err), RK_ENOENT);
}

static void test_remove_takes_only_what_the_store_made(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    put(dir, 0, 1);
    put(dir, 1, 1);
    snprintf(p, sizeof p, "%s/rank-1/notes.txt", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "rank-1: cannot remove"));
    struct stat st;
    assert_int_equal(lstat(p, &st), 0); /* the foreign file stays */
    snprintf(p, sizeof p, "%s/rank-0", dir);
    assert_int_equal(lstat(p, &st), -1); /* rank 0's went */
    snprintf(p, sizeof p, "%s/rank-1/notes.txt", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
    assert_int_equal(lstat(dir, &st), -1);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_ENOENT);
}

/* The job's cache: DIR/cache made 0700 (again: the same), refused when a link; its files go
 * with the directory, and a link in it is removed, not followed. */
static void test_cache_dir_is_0700_and_goes_with_the_job(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], c[RK_SNAP_PATH_MAX + 16], c2[RK_SNAP_PATH_MAX + 16],
        p[RK_SNAP_PATH_MAX + 64], outside[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    put(dir, 0, 1);
    assert_int_equal(rk_snap_cache_dir(dir, c, sizeof c, &err), RK_OK);
    assert_int_equal(rk_snap_cache_dir(dir, c2, sizeof c2, &err), RK_OK);
    assert_string_equal(c, c2);
    struct stat st;
    assert_int_equal(lstat(c, &st), 0);
    assert_true(S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700);
    assert_int_equal(rk_snap_cache_dir(dir, c2, 8, &err), RK_EINVAL); /* no room: nothing */
    assert_string_equal(c2, "");
    snprintf(p, sizeof p, "%s/idx-0123.safetensors", c);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    /* a file outside, linked from the cache: the link goes, the file stays */
    snprintf(outside, sizeof outside, "%s.outside", dir);
    f = fopen(outside, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(p, sizeof p, "%s/idx-link.safetensors", c);
    assert_int_equal(symlink(outside, p), 0);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
    assert_int_equal(lstat(dir, &st), -1);
    assert_int_equal(lstat(outside, &st), 0);
    assert_int_equal(unlink(outside), 0);
    /* a cache that is a link: refused */
    job_dir(dir, sizeof dir);
    char target[RK_SNAP_PATH_MAX + 64];
    snprintf(target, sizeof target, "%s/rank-9", dir);
    assert_int_equal(mkdir(target, 0700), 0);
    snprintf(p, sizeof p, "%s/cache", dir);
    assert_int_equal(symlink(target, p), 0);
    assert_int_equal(rk_snap_cache_dir(dir, c, sizeof c, &err), RK_EINVAL);
    assert_string_equal(c, "");
    assert_int_equal(unlink(p), 0);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* ---- pins ----------------------------------------------------------------------------------- */

static const char *pin_path(char *buf, size_t cap, const char *dir, int rank, int64_t step)
{
    char name[RK_CKPT_NAME_MAX];
    assert_int_equal(rk_snap_pin_name(step, name, sizeof name), RK_OK);
    int n = snprintf(buf, cap, "%s/rank-%d/%s", dir, rank, name);
    assert_true(n > 0 && (size_t)n < cap);
    return buf;
}

/* The whole file at `path` into a buffer (free() it), its size in *n. */
static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    uint8_t *b = malloc((size_t)len);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* A pin is a hard link to its generation (no copy), made without leaving a temporary name; the
 * puts that drop the generation do not write over the pin's file (a generation is recycled only
 * with one link): its bytes stay as they were, and it reads as that step. */
static void test_a_pin_is_a_link_whose_bytes_survive_the_puts(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], g[RK_SNAP_PATH_MAX + 64], q[RK_SNAP_PATH_MAX + 64],
        r0[RK_SNAP_PATH_MAX + 16];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    snprintf(r0, sizeof r0, "%s/rank-0", dir);
    assert_int_equal(rk_snap_pin(dir, 0, 10, &err), RK_ENOENT); /* no rank directory yet */
    put_sized(dir, 10, 100000);
    assert_int_equal(rk_snap_pin(dir, 0, 10, &err), RK_OK);
    struct stat gs, ps;
    assert_int_equal(lstat(gen_path(g, sizeof g, dir, 0, 10), &gs), 0);
    assert_int_equal(lstat(pin_path(q, sizeof q, dir, 0, 10), &ps), 0);
    assert_int_equal(ps.st_ino, gs.st_ino);
    assert_int_equal(ps.st_nlink, 2);
    assert_true(S_ISREG(ps.st_mode) && (ps.st_mode & 0777) == 0600);
    assert_int_equal(rk_snap_pin(dir, 0, 10, &err), RK_OK); /* again: the same link */
    assert_int_equal(lstat(q, &ps), 0);
    assert_int_equal(ps.st_ino, gs.st_ino);
    assert_int_equal(count_named(r0, ".tmp."), 0);
    size_t n0, n1;
    uint8_t *was = slurp(q, &n0);

    put_sized(dir, 11, 100000);
    put_sized(dir, 12, 100000); /* drops step 10's generation: written over if it were recycled */
    put_sized(dir, 13, 300000);
    assert_int_equal(lstat(g, &gs), -1);
    assert_int_equal(lstat(q, &ps), 0);
    assert_int_equal(ps.st_nlink, 1);
    uint8_t *now = slurp(q, &n1);
    assert_int_equal(n1, n0);
    assert_memory_equal(now, was, n0);
    free(was);
    free(now);
    assert_steps(dir, 0, 3, (const int64_t[]){13, 12, 10});
    rk_ckpt *c = NULL;
    assert_int_equal(rk_snap_get(dir, 0, 10, &c, &err), RK_OK);
    assert_int_equal(rk_ckpt_meta_of(c)->step, 10);
    assert_non_null(strstr(rk_ckpt_path(c), "/rank-0/pin-000000000010.safetensors"));
    rk_ckpt_free(c);

    assert_int_equal(rk_snap_pin(dir, 0, 11, &err), RK_ENOENT); /* dropped: nothing to pin */
    assert_non_null(strstr(err.msg, "snap-000000000011.safetensors"));
    assert_int_equal(rk_snap_pin(dir, 0, -1, &err), RK_EINVAL);
    assert_int_equal(rk_snap_pin(dir, -1, 12, &err), RK_EINVAL);
    /* a link in place of a generation is never pinned */
    assert_int_equal(unlink(gen_path(g, sizeof g, dir, 0, 12)), 0);
    assert_int_equal(symlink(q, g), 0);
    assert_int_equal(rk_snap_pin(dir, 0, 12, &err), RK_EINVAL);
    assert_int_equal(lstat(pin_path(q, sizeof q, dir, 0, 12), &ps), -1);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* A rank keeps the new pin and the newest other one; a put removes the pins above its step (a
 * rolled-back timeline), never the others; a pin linked to a generation is counted once. */
static void test_pins_are_kept_two_and_a_rollback_drops_those_above(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    put(dir, 0, 10);
    assert_int_equal(rk_snap_pin(dir, 0, 10, &err), RK_OK);
    put(dir, 0, 11);
    /* the pin of step 10 is its generation's file: two files, not three */
    uint64_t b = 0, held = 0, want = 0;
    int gens = 0;
    struct stat st;
    for (int64_t s = 10; s <= 11; s++) {
        assert_int_equal(lstat(gen_path(p, sizeof p, dir, 0, s), &st), 0);
        want += (uint64_t)st.st_size;
    }
    assert_int_equal(rk_snap_rank_bytes(dir, 0, &b, &gens, &err), RK_OK);
    assert_int_equal(gens, 2);
    assert_int_equal(b, want);
    assert_int_equal(rk_snap_bytes(dir, &held, &err), RK_OK);
    assert_int_equal(held, want);
    assert_steps(dir, 0, 2, (const int64_t[]){11, 10});

    for (int64_t s = 20; s <= 30; s += 10) {
        put(dir, 0, s);
        assert_int_equal(rk_snap_pin(dir, 0, s, &err), RK_OK);
        put(dir, 0, s + 1);
    }
    assert_int_equal(lstat(pin_path(p, sizeof p, dir, 0, 10), &st), -1); /* the third pin */
    assert_steps(dir, 0, 3, (const int64_t[]){31, 30, 20});
    want = 0;
    for (int64_t s = 30; s <= 31; s++) {
        assert_int_equal(lstat(gen_path(p, sizeof p, dir, 0, s), &st), 0);
        want += (uint64_t)st.st_size;
    }
    assert_int_equal(lstat(pin_path(p, sizeof p, dir, 0, 20), &st), 0);
    want += (uint64_t)st.st_size;
    assert_int_equal(rk_snap_rank_bytes(dir, 0, &b, &gens, &err), RK_OK);
    assert_int_equal(gens, 3); /* snap-31, snap-30 = pin-30, pin-20 */
    assert_int_equal(b, want);
    rk_ckpt *c = NULL;
    assert_int_equal(rk_snap_get(dir, 0, 20, &c, &err), RK_OK);
    assert_state(c, 0, 20);
    rk_ckpt_free(c);

    put(dir, 0, 25);
    /* the put of 25 rolled back: pin 30 and generations 30, 31 went; pin 20 stays */
    assert_int_equal(lstat(pin_path(p, sizeof p, dir, 0, 30), &st), -1);
    assert_steps(dir, 0, 2, (const int64_t[]){25, 20});
    put(dir, 0, 26);
    assert_int_equal(rk_snap_pin(dir, 0, 25, &err), RK_OK);
    assert_int_equal(rk_snap_pin(dir, 0, 26, &err), RK_OK); /* pins 26, 25; 20 goes */
    assert_steps(dir, 0, 2, (const int64_t[]){26, 25});
    assert_int_equal(rk_snap_pin(dir, 0, 25, &err), RK_OK); /* the older one again: both kept */
    assert_steps(dir, 0, 2, (const int64_t[]){26, 25});
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* rk_snap_agree counts pins: rank 0 holds generations 50 and 51 and a pin of 40, rank 1 (a
 * spare host that fetched a partner's copy) only generation 40: they agree on 40. A pin that
 * no longer verifies is skipped as a generation is, naming the pin. */
static void test_agree_counts_pins(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64], report[2048];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    put(dir, 0, 40);
    assert_int_equal(rk_snap_pin(dir, 0, 40, &err), RK_OK);
    put(dir, 0, 50);
    put(dir, 0, 51);
    put(dir, 1, 40);
    assert_steps(dir, 0, 3, (const int64_t[]){51, 50, 40});
    int64_t step = -1;
    assert_int_equal(rk_snap_agree(dir, 2, &step, report, sizeof report, &err), RK_OK);
    assert_int_equal(step, 40);
    assert_string_equal(report, "");
    int64_t held[2 * RK_SNAP_HELD_MAX] = {51, 50, 40, -1, 40, -1, -1, -1};
    assert_int_equal(rk_snap_agree_held(held, 2, RK_SNAP_HELD_MAX, &step, &err), RK_OK);
    assert_int_equal(step, 40);
    flip_byte(pin_path(p, sizeof p, dir, 0, 40), -8);
    assert_int_equal(rk_snap_agree(dir, 2, &step, report, sizeof report, &err), RK_ENOENT);
    assert_non_null(strstr(report, "rank-0/pin-000000000040.safetensors"));
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
}

/* The directory goes whole: pins, a pin's temporary file, and DIR/held (the copies held for
 * another host's ranks: 0700, ours, the same layout); a foreign file in held/ stays, named. */
static void test_remove_takes_pins_and_held(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], held[RK_SNAP_PATH_MAX + 16], h2[RK_SNAP_PATH_MAX + 16],
        p[RK_SNAP_PATH_MAX + 96];
    rk_err err = {0};
    job_dir(dir, sizeof dir);
    put(dir, 0, 1);
    assert_int_equal(rk_snap_pin(dir, 0, 1, &err), RK_OK);
    put(dir, 0, 2);
    put(dir, 0, 3); /* the pin is the only link to step 1 now */
    snprintf(p, sizeof p, "%s/rank-0/pin-000000000003.safetensors.tmp.%ld.7", dir, (long)getpid());
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(rk_snap_held_dir(dir, held, sizeof held, &err), RK_OK);
    assert_int_equal(rk_snap_held_dir(dir, h2, sizeof h2, &err), RK_OK);
    assert_string_equal(held, h2);
    struct stat st;
    assert_int_equal(lstat(held, &st), 0);
    assert_true(S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0700);
    put(held, 5, 2);
    assert_int_equal(rk_snap_pin(held, 5, 2, &err), RK_OK);
    put(held, 6, 2);
    uint64_t b = 0, want = 0;
    assert_int_equal(rk_snap_bytes(dir, &b, &err), RK_OK); /* held/ is not this host's ranks' */
    for (int64_t s = 1; s <= 3; s++) {
        char q[RK_SNAP_PATH_MAX + 64];
        if (lstat(gen_path(q, sizeof q, dir, 0, s), &st) != 0)
            assert_int_equal(lstat(pin_path(q, sizeof q, dir, 0, s), &st), 0);
        want += (uint64_t)st.st_size;
    }
    assert_int_equal(b, want);
    snprintf(p, sizeof p, "%s/rank-6/notes.txt", held);
    f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_EIO);
    assert_non_null(strstr(err.msg, "held/rank-6: cannot remove"));
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(rk_snap_dir_remove(dir, &err), RK_OK);
    assert_int_equal(lstat(dir, &st), -1);
}

/* The agreed step from each rank's own verified steps (ranks of several hosts): the newest of
 * rank 0's that every rank holds, never a mix; none when one rank has none in common. */
static void test_agree_held_is_the_newest_step_every_rank_verified(void **state)
{
    (void)state;
    int64_t step = 99;
    rk_err err = {0};
    /* 3 ranks x 2: rank 1 lost its newest (it did not verify), rank 2 holds both */
    const int64_t a[] = {25, 24, 24, -1, 25, 24};
    assert_int_equal(rk_snap_agree_held(a, 3, 2, &step, &err), RK_OK);
    assert_int_equal(step, 24);
    /* all hold 25: 25, whatever the order of the older */
    const int64_t b[] = {25, 24, 24, 25, 25, -1};
    assert_int_equal(rk_snap_agree_held(b, 3, 2, &step, &err), RK_OK);
    assert_int_equal(step, 25);
    /* a rank on a spare host holds nothing: no step */
    const int64_t c[] = {25, 24, -1, -1, 25, 24};
    assert_int_equal(rk_snap_agree_held(c, 3, 2, &step, &err), RK_ENOENT);
    assert_int_equal(step, -1);
    /* a step rank 0 lacks is never chosen, even if all others share it */
    const int64_t d[] = {30, -1, 29, 30, 29, 30};
    assert_int_equal(rk_snap_agree_held(d, 3, 2, &step, &err), RK_OK);
    assert_int_equal(step, 30);
    const int64_t e[] = {31, -1, 29, 30, 29, 30};
    assert_int_equal(rk_snap_agree_held(e, 3, 2, &step, &err), RK_ENOENT);
    /* one rank */
    const int64_t f[] = {7, 6};
    assert_int_equal(rk_snap_agree_held(f, 1, 2, &step, &err), RK_OK);
    assert_int_equal(step, 7);
    assert_int_equal(rk_snap_agree_held(NULL, 1, 2, &step, &err), RK_EINVAL);
    assert_int_equal(rk_snap_agree_held(f, 0, 2, &step, &err), RK_EINVAL);
}

/* A partner copy: a generation's bytes, received in pieces into another node's directory,
 * becomes that generation only complete and verified; a flipped byte, a missing piece or a
 * piece out of place leaves nothing but the generations that were there. */
static void test_a_received_copy_appears_only_complete_and_verified(void **state)
{
    (void)state;
    char a[RK_SNAP_PATH_MAX], b[RK_SNAP_PATH_MAX], path[RK_SNAP_PATH_MAX + 64];
    job_dir(a, sizeof a);
    job_dir(b, sizeof b);
    put(a, 4, 7);
    put(b, 4, 6); /* the holder's previous copy */
    gen_path(path, sizeof path, a, 4, 7);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static uint8_t bytes[1 << 16];
    size_t n = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    assert_true(n > 100 && n < sizeof bytes);
    rk_err err = {0};
    /* whole, in pieces of 37 bytes */
    rk_snap_recv *r = NULL;
    assert_int_equal(rk_snap_recv_begin(b, 4, 7, n, &r, &err), RK_OK);
    for (size_t off = 0; off < n; off += 37) {
        size_t k = n - off < 37 ? n - off : 37;
        if (off == 37 * 3) /* nothing is a generation until the end */
            assert_steps(b, 4, 1, (int64_t[]){6});
        assert_int_equal(rk_snap_recv_write(r, off, bytes + off, k, &err), RK_OK);
    }
    assert_int_equal(rk_snap_recv_commit(r, &err), RK_OK);
    assert_steps(b, 4, 2, (int64_t[]){7, 6});
    rk_ckpt *c = NULL;
    assert_int_equal(rk_snap_get(b, 4, 7, &c, &err), RK_OK);
    assert_state(c, 4, 7);
    rk_ckpt_free(c);
    char rdir[RK_SNAP_PATH_MAX + 16];
    snprintf(rdir, sizeof rdir, "%s/rank-4", b);
    /* a flipped byte: refused at the commit, the temporary file gone */
    bytes[n - 9] ^= 0x10;
    assert_int_equal(rk_snap_recv_begin(b, 4, 8, n, &r, &err), RK_OK);
    assert_int_equal(rk_snap_recv_write(r, 0, bytes, n, &err), RK_OK);
    assert_int_equal(rk_snap_recv_commit(r, &err), RK_EFORMAT);
    assert_steps(b, 4, 2, (int64_t[]){7, 6});
    assert_int_equal(count_named(rdir, ".tmp."), 0);
    bytes[n - 9] ^= 0x10;
    /* the right bytes under another step's name: refused */
    assert_int_equal(rk_snap_recv_begin(b, 4, 9, n, &r, &err), RK_OK);
    assert_int_equal(rk_snap_recv_write(r, 0, bytes, n, &err), RK_OK);
    assert_int_equal(rk_snap_recv_commit(r, &err), RK_EFORMAT);
    assert_non_null(strstr(err.msg, "step"));
    /* a piece out of place, past the end, or missing */
    assert_int_equal(rk_snap_recv_begin(b, 4, 8, n, &r, &err), RK_OK);
    assert_int_equal(rk_snap_recv_write(r, 5, bytes, 10, &err), RK_EFORMAT);
    assert_int_equal(rk_snap_recv_write(r, 0, bytes, n + 1, &err), RK_EFORMAT);
    assert_int_equal(rk_snap_recv_write(r, 0, bytes, n - 1, &err), RK_OK);
    assert_int_equal(rk_snap_recv_commit(r, &err), RK_EFORMAT);
    assert_steps(b, 4, 2, (int64_t[]){7, 6});
    assert_int_equal(count_named(rdir, ".tmp."), 0);
    /* aborted: nothing left */
    assert_int_equal(rk_snap_recv_begin(b, 4, 8, n, &r, &err), RK_OK);
    rk_snap_recv_abort(r);
    assert_int_equal(count_named(rdir, ".tmp."), 0);
    assert_int_equal(rk_snap_recv_begin(b, 4, 8, 0, &r, &err), RK_EINVAL);
    assert_null(r);
}

/* A killed job's directory (its maker gone) is swept; one in use, one without an .owner, one
 * whose .owner names another PID namespace or a pid started at another time, and a link
 * named like a job's directory are not, or are as the rule says; the sweep says what it
 * removed and its bytes. */
/* ---- a disk checkpoint from the snapshots (rk_snap_to_ckpt) ------------------------------- */

/* rekindle.torch's layout: rank 0 the replicated state, its RNG and the data position; every
 * other rank its own RNG; each with its replica hash (`hash`). */
typedef struct tstate {
    float w[4];
    uint8_t rng[3][5];
    int64_t epoch, hash[3], shape_w[1], shape_rng[1];
    rk_ckpt_item items[3][5];
    char names[3][32];
    size_t n[3];
    rk_ckpt_meta meta;
} tstate;

static void tstate_init(tstate *s, int world, int64_t step, int64_t hash)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 4; i++)
        s->w[i] = (float)step * 0.5f + (float)i;
    s->epoch = 2;
    s->shape_w[0] = 4;
    s->shape_rng[0] = 5;
    for (int r = 0; r < world; r++) {
        for (int i = 0; i < 5; i++)
            s->rng[r][i] = (uint8_t)(step + 11 * r + i);
        s->hash[r] = hash;
        size_t k = 0;
        if (r == 0) {
            s->items[0][k++] = (rk_ckpt_item){"model.w", "F32", 1, s->shape_w, s->w};
            s->items[0][k++] = (rk_ckpt_item){"rng.torch", "U8", 1, s->shape_rng, s->rng[0]};
            s->items[0][k++] = (rk_ckpt_item){"data.epoch", "I64", 0, NULL, &s->epoch};
        } else {
            snprintf(s->names[r], sizeof s->names[r], "rng.torch.rank%d", r);
            s->items[r][k++] = (rk_ckpt_item){s->names[r], "U8", 1, s->shape_rng, s->rng[r]};
        }
        s->items[r][k++] = (rk_ckpt_item){RK_SNAP_HASH_ITEM, "I64", 0, NULL, &s->hash[r]};
        s->n[r] = k;
    }
    s->meta = (rk_ckpt_meta){step, 2, step * 4, world, "{\"model\":\"cnn\"}"};
}

static void tput(const char *dir, tstate *s, int rank)
{
    rk_err err = {0};
    int rc = rk_snap_put(dir, rank, &s->meta, s->items[rank], s->n[rank], &err);
    if (rc)
        print_error("put rank %d: %s\n", rank, err.msg);
    assert_int_equal(rc, RK_OK);
}

/* rk_snap_to_ckpt of `step` (3 ranks) fails with `code`, its message naming `who`, and writes
 * no checkpoint of that step. */
static void assert_not_written(const char *dir, const char *ck, int64_t step, int code,
                               const char *who)
{
    char name[RK_CKPT_NAME_MAX], path[700];
    rk_err err = {0};
    assert_int_equal(rk_snap_to_ckpt(dir, 3, step, ck, 3, NULL, &err), code);
    if (!strstr(err.msg, who))
        fail_msg("step %" PRId64 ": '%s' does not name %s", step, err.msg, who);
    rk_ckpt_file_name(step, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", ck, name);
    assert_int_equal(access(path, F_OK), -1);
}

/* The checkpoint is the file rank 0 would write with every rank's items (rk_ckpt_encode of
 * rank 0's items, the others' after its last rng.*, no hash): byte for byte, read from a pin
 * when the generation rolled away; a differing hash, a missing rank or a damaged generation
 * write nothing; unpin removes the pin and only it; unpin_below the pins under a step but
 * one. */
static void test_a_checkpoint_from_the_snapshots_is_rank_0s_file(void **state)
{
    (void)state;
    char dir[RK_SNAP_PATH_MAX], ck[600], path[700];
    job_dir(dir, sizeof dir);
    snprintf(ck, sizeof ck, "%s/ck_from_snap", g_dir);
    tstate s;
    tstate_init(&s, 3, 50, 77);
    for (int r = 0; r < 3; r++)
        tput(dir, &s, r);
    rk_err err = {0};
    assert_int_equal(rk_snap_pin(dir, 0, 50, &err), RK_OK);
    tstate later;
    for (int64_t st = 51; st <= 52; st++) { /* rank 0 goes on: snap-50 is gone, its pin stays */
        tstate_init(&later, 3, st, 77);
        tput(dir, &later, 0);
    }
    double sec = -1;
    int rc = rk_snap_to_ckpt(dir, 3, 50, ck, 3, &sec, &err);
    if (rc)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, RK_OK);
    assert_true(sec >= 0);
    rk_ckpt_item want[5] = {s.items[0][0], s.items[0][1], s.items[1][0], s.items[2][0],
                            s.items[0][2]};
    uint8_t *enc;
    size_t nenc, nfile;
    assert_int_equal(rk_ckpt_encode(&s.meta, want, 5, &enc, &nenc, &err), RK_OK);
    char name[RK_CKPT_NAME_MAX];
    rk_ckpt_file_name(50, name, sizeof name);
    snprintf(path, sizeof path, "%s/%s", ck, name);
    uint8_t *file = slurp(path, &nfile);
    assert_int_equal(nfile, nenc);
    assert_memory_equal(file, enc, nenc);
    free(file);
    free(enc);

    /* rank 2's replicas disagree: nothing written */
    tstate_init(&s, 3, 60, 77);
    s.hash[2] = 78;
    for (int r = 0; r < 3; r++)
        tput(dir, &s, r);
    assert_not_written(dir, ck, 60, RK_EFORMAT, "rank 2");
    /* rank 1 has no step 61 */
    tstate_init(&s, 3, 61, 77);
    tput(dir, &s, 0);
    tput(dir, &s, 2);
    assert_not_written(dir, ck, 61, RK_ENOENT, "rank 1");
    /* rank 2's generation of 61 damaged */
    tput(dir, &s, 1);
    flip_byte(gen_path(path, sizeof path, dir, 2, 61), -3);
    assert_not_written(dir, ck, 61, RK_EFORMAT, "rank 2");

    /* unpin: the pin goes, twice is fine, a rank without a directory is fine */
    assert_int_equal(access(pin_path(path, sizeof path, dir, 0, 50), F_OK), 0);
    assert_int_equal(rk_snap_unpin(dir, 0, 50, &err), RK_OK);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(rk_snap_unpin(dir, 0, 50, &err), RK_OK);
    assert_int_equal(rk_snap_unpin(dir, 9, 50, &err), RK_OK);
    assert_int_equal(access(gen_path(path, sizeof path, dir, 0, 61), F_OK), 0);
    assert_int_equal(rk_snap_to_ckpt(dir, 0, 50, ck, 3, NULL, &err), RK_EINVAL);

    /* unpin_below: the pins under the step go, but the spared one's; generations stay */
    for (int64_t st = 70; st <= 73; st++) {
        tstate_init(&s, 3, st, 77);
        tput(dir, &s, 1);
        assert_int_equal(rk_snap_pin(dir, 1, st, &err), RK_OK); /* C keeps two: 72 and 73 */
    }
    assert_int_equal(access(pin_path(path, sizeof path, dir, 1, 72), F_OK), 0);
    assert_int_equal(rk_snap_unpin_below(dir, 1, 74, 73, &err), RK_OK);
    assert_int_equal(access(pin_path(path, sizeof path, dir, 1, 72), F_OK), -1);
    assert_int_equal(access(pin_path(path, sizeof path, dir, 1, 73), F_OK), 0);
    assert_int_equal(access(gen_path(path, sizeof path, dir, 1, 72), F_OK), 0);
    assert_int_equal(rk_snap_unpin_below(dir, 1, 74, -1, &err), RK_OK);
    assert_int_equal(access(pin_path(path, sizeof path, dir, 1, 73), F_OK), -1);
    assert_int_equal(rk_snap_unpin_below(dir, 9, 74, -1, &err), RK_OK); /* no such rank */
    rk_snap_dir_remove(dir, &err);
}

static void test_sweep_removes_only_the_dead_makers_directories(void **state)
{
    (void)state;
    char parent[600], dead[RK_SNAP_PATH_MAX], live[RK_SNAP_PATH_MAX], bare[RK_SNAP_PATH_MAX],
        other[RK_SNAP_PATH_MAX], reused[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 64], names[2048];
    rk_err err = {0};
    snprintf(parent, sizeof parent, "%s/sweep", g_dir);
    assert_int_equal(mkdir(parent, 0700), 0);
    /* made by a child that then exits: its maker is gone */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t kid = fork();
    assert_true(kid >= 0);
    if (kid == 0) {
        char d[RK_SNAP_PATH_MAX];
        rk_err e = {0};
        int ok = rk_snap_dir_make(parent, d, sizeof d, &e) == RK_OK;
        float w[4] = {1, 2, 3, 4};
        int64_t shape[1] = {4};
        rk_ckpt_item it = {"model.w", "F32", 1, shape, w};
        rk_ckpt_meta m = {.step = 3, .world_size = 1, .config_json = "{}"};
        ok = ok && rk_snap_put(d, 0, &m, &it, 1, &e) == RK_OK;
        if (write(fds[1], d, sizeof d) != (ssize_t)sizeof d)
            ok = 0;
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], dead, sizeof dead), (ssize_t)sizeof dead);
    close(fds[0]);
    int st;
    assert_int_equal(waitpid(kid, &st, 0), kid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* made by this process: in use */
    assert_int_equal(rk_snap_dir_make(parent, live, sizeof live, &err), RK_OK);
    /* no .owner (a store before it wrote one): left */
    assert_int_equal(rk_snap_dir_make(parent, bare, sizeof bare, &err), RK_OK);
    snprintf(p, sizeof p, "%s/" RK_SNAP_OWNER_NAME, bare);
    assert_int_equal(unlink(p), 0);
    /* another PID namespace's pid (it means nothing here): left */
    assert_int_equal(rk_snap_dir_make(parent, other, sizeof other, &err), RK_OK);
    snprintf(p, sizeof p, "%s/" RK_SNAP_OWNER_NAME, other);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "rk-snap-owner pid=%ld start=1 pidns=1\n", (long)kid);
    fclose(f);
    /* this process's pid, but started at another time (the pid taken again): swept */
    assert_int_equal(rk_snap_dir_make(parent, reused, sizeof reused, &err), RK_OK);
    snprintf(p, sizeof p, "%s/" RK_SNAP_OWNER_NAME, reused);
    struct stat ns;
    assert_int_equal(stat("/proc/self/ns/pid", &ns), 0);
    f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "rk-snap-owner pid=%ld start=1 pidns=%llu\n", (long)getpid(),
            (unsigned long long)ns.st_ino);
    fclose(f);
    /* a link named like a job's directory, to the dead one's: never followed */
    snprintf(p, sizeof p, "%s/" RK_SNAP_DIR_PREFIX "link", parent);
    assert_int_equal(symlink(dead, p), 0);
    uint64_t bytes = 0;
    int n = -1;
    assert_int_equal(rk_snap_dir_sweep(parent, &n, &bytes, names, sizeof names, &err), RK_OK);
    assert_int_equal(n, 2);
    assert_true(bytes > 0); /* the dead job's generation */
    assert_non_null(strstr(names, dead));
    assert_non_null(strstr(names, reused));
    struct stat x;
    assert_int_not_equal(lstat(dead, &x), 0);
    assert_int_not_equal(lstat(reused, &x), 0);
    assert_int_equal(lstat(live, &x), 0);
    assert_int_equal(lstat(bare, &x), 0);
    assert_int_equal(lstat(other, &x), 0);
    assert_int_equal(lstat(p, &x), 0); /* the link itself stays */
    /* nothing more to sweep; a directory of ours is removed whole, .owner with it */
    assert_int_equal(rk_snap_dir_sweep(parent, &n, &bytes, names, sizeof names, &err), RK_OK);
    assert_int_equal(n, 0);
    assert_int_equal(rk_snap_dir_remove(live, &err), RK_OK);
    assert_int_not_equal(lstat(live, &x), 0);
    /* a parent that is missing: the error names it */
    snprintf(p, sizeof p, "%s/nowhere", g_dir);
    assert_int_equal(rk_snap_dir_sweep(p, &n, NULL, NULL, 0, &err), RK_ENOENT);
    assert_non_null(strstr(err.msg, "nowhere"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generation_names_are_exact),
        cmocka_unit_test(test_directory_is_0700_ours_and_never_a_link),
        cmocka_unit_test(test_put_get_round_trip_with_the_bytes_of_encode),
        cmocka_unit_test(test_two_generations_are_kept_and_a_rollback_drops_the_newer),
        cmocka_unit_test(test_a_put_writes_over_the_generation_it_drops),
        cmocka_unit_test(test_failed_puts_write_nothing_and_keep_the_previous_generation),
        cmocka_unit_test(test_agree_picks_the_newest_step_every_rank_has),
        cmocka_unit_test(test_a_flipped_byte_is_never_returned_and_agree_falls_back),
        cmocka_unit_test(test_a_link_or_fifo_in_place_of_a_generation_is_refused),
        cmocka_unit_test(test_a_rank_killed_mid_copy_never_exposes_a_torn_snapshot),
        cmocka_unit_test(test_room_follows_the_documented_rule),
        cmocka_unit_test(test_room_also_needs_the_ram),
        cmocka_unit_test(test_rank_bytes_counts_each_ranks_generations),
        cmocka_unit_test(test_remove_takes_only_what_the_store_made),
        cmocka_unit_test(test_cache_dir_is_0700_and_goes_with_the_job),
        cmocka_unit_test(test_agree_held_is_the_newest_step_every_rank_verified),
        cmocka_unit_test(test_a_received_copy_appears_only_complete_and_verified),
        cmocka_unit_test(test_a_pin_is_a_link_whose_bytes_survive_the_puts),
        cmocka_unit_test(test_pins_are_kept_two_and_a_rollback_drops_those_above),
        cmocka_unit_test(test_agree_counts_pins),
        cmocka_unit_test(test_remove_takes_pins_and_held),
        cmocka_unit_test(test_sweep_removes_only_the_dead_makers_directories),
        cmocka_unit_test(test_a_checkpoint_from_the_snapshots_is_rank_0s_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
