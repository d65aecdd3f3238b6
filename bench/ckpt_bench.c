/*
 * ckpt_bench: save and load throughput of the checkpoint store (rekindle/ckpt.h) for a state
 * of a given size (default 256 MiB of float32 in 16 tensors of random data), each save
 * streamed, hashed, fsynced, renamed and pointed to by `latest` as `rk train` does. Per
 * repeat: one save (timed), the load of that checkpoint from the disk (its pages dropped
 * from the page cache first, timed: "cold"), and again from the page cache ("warm"). Then
 * each checkpoint is deleted (unlink + directory fsync, timed): what retention costs per
 * save once the store is full. Saves use a `keep` larger than the repeats, so no save
 * deletes anything inside its timing; the deletion is reported on its own. The saves run as
 * `rk train`'s do: with the directory's writer lock held (taken once, timed apart) and the
 * state's tensors named model.*, so every save scans them for non-finite values.
 * Prints one JSON line with the median of each. The peer (dd conv=fsync on the same disk)
 * is run by bench/ckpt_io, which calls this.
 *
 * usage: ckpt_bench DIR [MIB] [REPEATS]
 */
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "rekindle/ckpt.h"
#include "rekindle/fileio.h"
#include "rekindle/rng.h"

enum { MAX_REPS = 100, NT = 16 };

/* Drop a file's clean pages from the page cache, so the next read comes from the disk. */
static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static int load_step(const char *dir, int64_t step, double *secs)
{
    rk_err err = {0};
    rk_ckpt *c = NULL;
    double t0 = now_s();
    if (rk_ckpt_load_step(dir, step, &c, &err)) {
        fprintf(stderr, "ckpt_bench: load: %s\n", err.msg);
        return 1;
    }
    *secs = now_s() - t0;
    rk_ckpt_free(c);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: ckpt_bench DIR [MIB] [REPEATS]\n");
        return 2;
    }
    const char *dir = argv[1];
    long mib = argc > 2 ? strtol(argv[2], NULL, 10) : 256;
    int reps = argc > 3 ? (int)strtol(argv[3], NULL, 10) : 3;
    if (mib < 16 || mib > 65536 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "ckpt_bench: MIB must be 16..65536 and REPEATS 1..%d\n", MAX_REPS);
        return 2;
    }
    size_t per = (size_t)mib * 1024 * 1024 / NT / sizeof(float);
    float *buf = malloc(per * NT * sizeof(float));
    if (!buf) {
        fprintf(stderr, "ckpt_bench: out of memory for %ld MiB\n", mib);
        return 1;
    }
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
    rk_ckpt_lockfile *lock = NULL;
    double tl = now_s();
    if (rk_ckpt_lock(dir, &lock, NULL, &err)) {
        fprintf(stderr, "ckpt_bench: lock: %s\n", err.msg);
        return 1;
    }
    double lock_s = now_s() - tl;
    static double save[MAX_REPS], cold[MAX_REPS], warm[MAX_REPS], del[MAX_REPS];
    for (int k = 0; k < reps; k++) {
        rk_ckpt_meta meta = {.step = k + 1,
                             .epoch = 0,
                             .cursor = 0,
                             .world_size = 1,
                             .config_json = "{\"model\":\"bench\"}"};
        double t0 = now_s();
        if (rk_ckpt_save(dir, &meta, items, NT, MAX_REPS + 1, &err)) {
            fprintf(stderr, "ckpt_bench: save: %s\n", err.msg);
            return 1;
        }
        save[k] = now_s() - t0;
        char name[RK_CKPT_NAME_MAX], path[4096];
        rk_ckpt_file_name(k + 1, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        drop_cache(path);
        if (load_step(dir, k + 1, &cold[k]) || load_step(dir, k + 1, &warm[k]))
            return 1;
    }
    for (int k = 0; k < reps; k++) {
        char name[RK_CKPT_NAME_MAX], path[4096];
        rk_ckpt_file_name(k + 1, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        double t0 = now_s();
        if (unlink(path) != 0 || rk_fsync_dir(dir, &err) != RK_OK) {
            fprintf(stderr, "ckpt_bench: cannot delete %s\n", path);
            return 1;
        }
        del[k] = now_s() - t0;
    }
    double mb = (double)per * NT * sizeof(float) / 1048576.0;
    double s = median(save, reps), c = median(cold, reps), w = median(warm, reps);
    printf("{\"state_mib\":%ld,\"repeats\":%d,\"save_s\":%.4f,\"save_mib_per_s\":%.1f,"
           "\"load_cold_s\":%.4f,\"load_cold_mib_per_s\":%.1f,\"load_warm_s\":%.4f,"
           "\"load_warm_mib_per_s\":%.1f,\"delete_s\":%.4f,\"lock_s\":%.6f}\n",
           mib, reps, s, mb / s, c, mb / c, w, mb / w, median(del, reps), lock_s);
    rk_ckpt_unlock(lock);
    free(buf);
    return 0;
}
