/*
 * snap_bench: the node's snapshot store (rekindle/snap.h) against the plain copies it is made
 * of, in one run, on the same tmpfs. Per repeat, for a state of MIB MiB of float32 (16
 * tensors of random normals, as ckpt_bench):
 *   put        rk_snap_put: hash every tensor, write a temporary file, rename (docs/recovery.md)
 *   write      the peer: one write() of the same bytes into a new file there and a rename
 *   get        rk_snap_get: read the generation straight into the buffer it keeps, verify
 *              every checksum and the header
 *   get2       the restore as first built: the file read into one buffer, then parsed into a
 *              second (rk_file_read_fd + rk_ckpt_parse)
 *   read       the peer at its best: one read() of the whole file into a fresh buffer aligned
 *              to 2 MiB and offered huge pages (MADV_HUGEPAGE), as get's reader does
 *   read_malloc the same read into a plain malloc() buffer (4 KiB pages, a fault each)
 * and the GB/s of each (MiB / median seconds). Prints one JSON line of medians.
 *
 * usage: snap_bench [MIB] [REPEATS] [PARENT]   (defaults 64, 5, /dev/shm)
 */
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "rekindle/ckpt.h"
#include "rekindle/fileio.h"
#include "rekindle/rng.h"
#include "rekindle/snap.h"

enum { MAX_REPS = 100, NT = 16 };

static int fail(const char *what, const char *msg)
{
    fprintf(stderr, "snap_bench: %s: %s\n", what, msg);
    return 1;
}

/* The peer of a put: the same bytes in one write() into a new file, renamed into place. */
static int plain_write(const char *dir, const void *buf, size_t len, double *secs)
{
    char tmp[4200], dst[4200];
    snprintf(tmp, sizeof tmp, "%s/plain.tmp", dir);
    snprintf(dst, sizeof dst, "%s/plain", dir);
    double t0 = now_s();
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return fail(tmp, "cannot create");
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n <= 0) {
            close(fd);
            return fail(tmp, "write failed");
        }
        done += (size_t)n;
    }
    close(fd);
    if (rename(tmp, dst) != 0)
        return fail(dst, "rename failed");
    *secs = now_s() - t0;
    return 0;
}

/* The peer of a get: the whole file in one read() into a fresh buffer: at its best (`huge`:
 * aligned to 2 MiB with MADV_HUGEPAGE, as the store's reader does), or from plain malloc. */
static int plain_read(const char *path, size_t len, int huge, double *secs)
{
    double t0 = now_s();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char *b = NULL;
    size_t round = (len + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    if (!huge)
        b = malloc(len ? len : 1);
    else if (posix_memalign((void **)&b, (size_t)2 << 20, round ? round : 1) == 0)
        (void)madvise(b, round, MADV_HUGEPAGE);
    else
        b = NULL;
    if (fd < 0 || !b) {
        if (fd >= 0)
            close(fd);
        free(b);
        return fail(path, "cannot open or allocate");
    }
    size_t done = 0;
    while (done < len) {
        ssize_t n = read(fd, b + done, len - done);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    close(fd);
    *secs = now_s() - t0;
    volatile char sink = b[len / 2];
    (void)sink;
    free(b);
    return done == len ? 0 : fail(path, "short read");
}

int main(int argc, char **argv)
{
    if (argc > 4 || (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))) {
        fprintf(stderr, "usage: snap_bench [MIB] [REPEATS] [PARENT]\n");
        return 2;
    }
    long mib = argc > 1 ? strtol(argv[1], NULL, 10) : 64;
    int reps = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 5;
    const char *parent = argc > 3 ? argv[3] : "/dev/shm";
    if (mib < 16 || mib > 65536 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "snap_bench: MIB must be 16..65536 and REPEATS 1..%d\n", MAX_REPS);
        return 2;
    }
    size_t per = (size_t)mib * 1024 * 1024 / NT / sizeof(float);
    float *buf = malloc(per * NT * sizeof(float));
    if (!buf)
        return fail("state", "out of memory");
    rk_rng r;
    rk_rng_seed(&r, 1);
    for (size_t i = 0; i < per * NT; i++)
        buf[i] = rk_rng_normal(&r);
    rk_ckpt_item items[NT];
    char names[NT][32];
    int64_t shape[1] = {(int64_t)per};
    for (int i = 0; i < NT; i++) {
        snprintf(names[i], sizeof names[i], "model.t%02d", i);
        items[i] = (rk_ckpt_item){names[i], "F32", 1, shape, buf + (size_t)i * per};
    }
    rk_err err = {0};
    char dir[4096];
    if (rk_snap_dir_make(parent, dir, sizeof dir, &err))
        return fail(parent, err.msg);
    static double put[MAX_REPS], wr[MAX_REPS], get[MAX_REPS], get2[MAX_REPS], rd[MAX_REPS],
        rdm[MAX_REPS];
    size_t file_len = 0;
    int rc = 0;
    for (int k = 0; k < reps && !rc; k++) {
        rk_ckpt_meta meta = {.step = k + 1, .world_size = 1, .config_json = "{}"};
        double t0 = now_s();
        if (rk_snap_put(dir, 0, &meta, items, NT, &err)) {
            rc = fail("put", err.msg);
            break;
        }
        put[k] = now_s() - t0;
        rk_ckpt *c = NULL;
        t0 = now_s();
        if (rk_snap_get(dir, 0, k + 1, &c, &err)) {
            rc = fail("get", err.msg);
            break;
        }
        get[k] = now_s() - t0;
        rk_ckpt_free(c);
        char name[RK_CKPT_NAME_MAX], path[4200];
        rk_snap_file_name(k + 1, name, sizeof name);
        snprintf(path, sizeof path, "%s/rank-0/%s", dir, name);
        uint8_t *fb = NULL;
        t0 = now_s();
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || rk_file_read_fd(fd, path, SIZE_MAX - 1, 0, &fb, &file_len, &err) ||
            rk_ckpt_parse(fb, file_len, path, &c, &err)) {
            if (fd >= 0)
                close(fd);
            rc = fail("get2", err.msg[0] ? err.msg : "cannot open");
            break;
        }
        close(fd);
        free(fb);
        get2[k] = now_s() - t0;
        rk_ckpt_free(c);
        if ((rc = plain_write(dir, buf, file_len, &wr[k])))
            break;
        char plain[4200];
        snprintf(plain, sizeof plain, "%s/plain", dir);
        rc = plain_read(plain, file_len, 1, &rd[k]);
        if (!rc)
            rc = plain_read(plain, file_len, 0, &rdm[k]);
        unlink(plain);
    }
    if (rk_snap_dir_remove(dir, &err))
        fprintf(stderr, "snap_bench: %s\n", err.msg);
    if (rc)
        return 1;
    double mp = median(put, reps), mw = median(wr, reps), mg = median(get, reps),
           mg2 = median(get2, reps), mr = median(rd, reps), mrm = median(rdm, reps),
           gb = (double)file_len / 1e9;
    printf("{\"mib\":%ld,\"repeats\":%d,\"file_bytes\":%zu,\"put_s\":%.4f,\"write_s\":%.4f,"
           "\"get_s\":%.4f,\"get2_s\":%.4f,\"read_s\":%.4f,\"read_malloc_s\":%.4f,\"put_gbs\":%.2f,"
           "\"write_gbs\":%.2f,"
           "\"get_gbs\":%.2f,\"get2_gbs\":%.2f,\"read_gbs\":%.2f,\"put_vs_write\":%.2f,"
           "\"get_vs_read\":%.2f}\n",
           mib, reps, file_len, mp, mw, mg, mg2, mr, mrm, gb / mp, gb / mw, gb / mg, gb / mg2,
           gb / mr, mp / mw, mg / mr);
    return 0;
}
