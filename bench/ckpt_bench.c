/*
 * ckpt_bench: save and load throughput of the checkpoint store (rekindle/ckpt.h) for a state
 * of a given size (default 256 MiB of float32 in 16 tensors of random data), each save
 * fsynced, renamed and verified as `rk train` does. Prints one JSON line. The peer (dd
 * conv=fsync on the same disk) is run by bench/ckpt_io, which calls this.
 *
 * usage: ckpt_bench DIR [MIB] [REPEATS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rekindle/ckpt.h"
#include "rekindle/rng.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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
    if (mib < 16 || mib > 65536 || reps < 1 || reps > 100) {
        fprintf(stderr, "ckpt_bench: MIB must be 16..65536 and REPEATS 1..100\n");
        return 2;
    }
    enum { NT = 16 };
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
    double best_save = 1e30, best_load = 1e30;
    for (int k = 0; k < reps; k++) {
        rk_ckpt_meta meta = {.step = k + 1, .epoch = 0, .cursor = 0, .world_size = 1,
                             .config_json = "{\"model\":\"bench\"}"};
        double t0 = now_s();
        if (rk_ckpt_save(dir, &meta, items, NT, 1, &err)) {
            fprintf(stderr, "ckpt_bench: save: %s\n", err.msg);
            return 1;
        }
        double t1 = now_s();
        rk_ckpt *c = NULL;
        if (rk_ckpt_load_step(dir, k + 1, &c, &err)) {
            fprintf(stderr, "ckpt_bench: load: %s\n", err.msg);
            return 1;
        }
        double t2 = now_s();
        rk_ckpt_free(c);
        if (t1 - t0 < best_save)
            best_save = t1 - t0;
        if (t2 - t1 < best_load)
            best_load = t2 - t1;
    }
    double bytes = (double)per * NT * sizeof(float);
    printf("{\"state_mib\":%ld,\"repeats\":%d,\"save_s\":%.4f,\"save_mib_per_s\":%.1f,"
           "\"load_s\":%.4f,\"load_mib_per_s\":%.1f}\n",
           mib, reps, best_save, bytes / 1048576.0 / best_save, best_load,
           bytes / 1048576.0 / best_load);
    free(buf);
    return 0;
}
