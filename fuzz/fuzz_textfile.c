/*
 * libFuzzer target for the textfile sensor parser (rk_textfile_merge): arbitrary bytes never
 * crash. A rejected file is RK_EFORMAT with a one-line printable ASCII message naming the file
 * and a line within it (quoting none of its bytes), and changes no sample. An accepted file sets
 * only the two sensor fields, each finite and >= 0, leaves every other field and every lost GPU as
 * it was, and is also accepted when the node has no GPUs (fewer checks apply then, never more).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/health.h"

#define NAME "fuzz.prom"
#define NGPU 4

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void setup(rk_gpu_info *info, rk_gpu_sample *s)
{
    /* indices out of position order; GPU 2 (position 3) is lost */
    static const int idx[NGPU] = {0, 1, 5, 2};
    memset(info, 0, NGPU * sizeof *info);
    memset(s, 0, NGPU * sizeof *s);
    for (int i = 0; i < NGPU; i++) {
        info[i].index = idx[i];
        snprintf(info[i].uuid, sizeof info[i].uuid, "GPU-%d", idx[i]);
        s[i].temp_c = 50 + i;
        s[i].fan_pct = 30;
        rk_field_set(&s[i], RK_F_TEMP);
        rk_field_set(&s[i], RK_F_FAN);
    }
    s[1].vrm_ripple_mv = 12; /* an earlier file's reading */
    rk_field_set(&s[1], RK_F_VRM_RIPPLE);
    s[3].lost = true;
    s[3].valid = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_gpu_info info[NGPU];
    rk_gpu_sample s[NGPU], before[NGPU];
    rk_err err = {0};
    setup(info, s);
    memcpy(before, s, sizeof s);
    int rc = rk_textfile_merge(NAME, (const char *)data, size, info, s, NGPU, &err);
    if (rc != RK_OK) {
        check(rc == RK_EFORMAT || rc == RK_ENOMEM);
        check(err.code == rc);
        check(memcmp(s, before, sizeof s) == 0);
        /* printable ASCII only: the messages are rekindle's own words, numbers and names, never
         * the file's bytes (any UTF-8 from the file would show up here) */
        for (const char *p = err.msg; *p; p++)
            check((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
        if (rc == RK_EFORMAT) {
            size_t lines = 0;
            for (size_t i = 0; i < size; i++)
                lines += data[i] == '\n';
            long line = 0;
            check(sscanf(err.msg, NAME ":%ld: ", &line) == 1);
            check(line >= 1 && (size_t)line <= lines + 1);
        }
        return 0;
    }
    const uint64_t sensors = (1ull << RK_F_VRM_RIPPLE) | (1ull << RK_F_FAN_VIB);
    for (int i = 0; i < NGPU; i++) {
        check((s[i].valid & ~sensors) == (before[i].valid & ~sensors));
        if (rk_field_valid(&s[i], RK_F_VRM_RIPPLE))
            check(isfinite(s[i].vrm_ripple_mv) && s[i].vrm_ripple_mv >= 0);
        if (rk_field_valid(&s[i], RK_F_FAN_VIB))
            check(isfinite(s[i].fan_vib_hz) && s[i].fan_vib_hz >= 0);
        rk_gpu_sample rest; /* all but the sensors is as it was (memcpy: padding too) */
        memcpy(&rest, &s[i], sizeof rest);
        rest.valid = (rest.valid & ~sensors) | (before[i].valid & sensors);
        rest.vrm_ripple_mv = before[i].vrm_ripple_mv;
        rest.fan_vib_hz = before[i].fan_vib_hz;
        check(memcmp(&rest, &before[i], sizeof rest) == 0);
    }
    check(memcmp(&s[3], &before[3], sizeof s[3]) == 0); /* lost */
    check(rk_textfile_merge(NAME, (const char *)data, size, NULL, NULL, 0, &err) == RK_OK);
    return 0;
}
