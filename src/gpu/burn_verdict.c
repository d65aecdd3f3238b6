/*
 * The pure half of rk burn (gpu/burn.h): the counts of a burn turned into a verdict and a
 * state-file record, the memory tests' names and the throttle reasons in words. No driver,
 * no I/O: unit-tested on the CPU (tests/test_gpu_burn.c).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gpu/burn.h"

const char *rk_burn_mt_name(int test)
{
    static const char *const names[RK_MT_TESTS] = {"address lines", "own address",
                                                   "moving inversions", "random"};
    return test >= 0 && test < RK_MT_TESTS ? names[test] : NULL;
}

void rk_burn_result_init(rk_burn_result *r)
{
    memset(r, 0, sizeof *r);
    for (int t = 0; t < RK_MT_TESTS; t++)
        r->mt_first[t] = UINT64_MAX;
}

/* Append to buf (cap bytes, *len used so far); false once it no longer fits. */
static bool put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len >= cap)
        return false;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= cap - *len) {
        *len = cap;
        return false;
    }
    *len += (size_t)k;
    return true;
}

bool rk_burn_verdict(const rk_burn_result *r, char *failed, size_t cap)
{
    char tmp[1024];
    size_t len = 0;
    bool ok = true;
    tmp[0] = '\0';
    if (!r->ran) {
        put(tmp, sizeof tmp, &len, "did not run: %s", r->setup_error[0] ? r->setup_error : "?");
        ok = false;
    }
    if (r->ran && r->rounds == 0 && !r->run_error[0]) {
        ok = false; /* nothing was compared: no verdict of health */
        put(tmp, sizeof tmp, &len, "sgemm: no round completed");
    }
    if (r->ran && r->wrong_elements > 0) {
        ok = false;
        put(tmp, sizeof tmp, &len, "sgemm: %llu elements wrong in copies",
            (unsigned long long)r->wrong_elements);
        const char *sep = " ";
        int copies =
            r->copies > 0 && r->copies <= RK_BURN_COPIES_MAX ? r->copies : RK_BURN_COPIES_MAX;
        for (int c = 0; c < copies; c++)
            if (r->copy_wrong[c]) {
                put(tmp, sizeof tmp, &len, "%s%d", sep, c);
                sep = ",";
            }
    }
    bool mem = false;
    for (int t = 0; r->ran && t < RK_MT_TESTS; t++) {
        if (!r->mt_bad[t])
            continue;
        ok = false;
        put(tmp, sizeof tmp, &len, "%s%s %llu words wrong",
            mem   ? ", "
            : len ? "; memory: "
                  : "memory: ",
            rk_burn_mt_name(t), (unsigned long long)r->mt_bad[t]);
        if (r->mt_first[t] != UINT64_MAX)
            put(tmp, sizeof tmp, &len, " (first at word %llu)", (unsigned long long)r->mt_first[t]);
        mem = true;
    }
    if (r->ran && r->run_error[0]) {
        ok = false;
        put(tmp, sizeof tmp, &len, "%sdriver error: %s", len ? "; " : "", r->run_error);
    }
    if (failed && cap > 0) {
        size_t n = strlen(tmp);
        if (n < cap) {
            memcpy(failed, tmp, n + 1);
        } else if (cap >= 4) {
            memcpy(failed, tmp, cap - 4);
            memcpy(failed + cap - 4, "...", 4);
        } else {
            failed[0] = '\0';
        }
    }
    return ok;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

int rk_burn_record_make(const rk_burn_result *r, const char *serial, const char *uuid,
                        const char *name, double when, rk_burn_record *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    if (!r->ran)
        return rk_err_set(err, RK_EINVAL, "burn record: the burn did not run (%s)",
                          r->setup_error[0] ? r->setup_error : "no reason given");
    const char *key = serial && serial[0] ? serial : uuid && uuid[0] ? uuid : NULL;
    if (!key)
        return rk_err_set(err, RK_EINVAL, "burn record: the GPU has neither a serial nor a UUID");
    if (strlen(key) >= sizeof out->key)
        return rk_err_set(err, RK_EINVAL, "burn record: key '%.40s...' is too long", key);
    copy_str(out->key, sizeof out->key, key);
    copy_str(out->name, sizeof out->name, name);
    out->when = when;
    out->duration_s = r->duration_s;
    out->ok = rk_burn_verdict(r, out->failed, sizeof out->failed);
    out->gflops = isfinite(r->gflops) && r->gflops > 0 ? r->gflops : 0;
    out->wrong_elements =
        r->wrong_elements > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : r->wrong_elements;
    uint64_t bad = 0;
    for (int t = 0; t < RK_MT_TESTS; t++)
        bad = r->mt_bad[t] > (uint64_t)INT64_MAX - bad ? (uint64_t)INT64_MAX : bad + r->mt_bad[t];
    out->bad_addresses = bad;
    return rk_burn_record_check(out, "burn record", err);
}

const char *rk_burn_reasons_str(uint64_t reasons, char *buf, size_t cap)
{
    static const struct {
        uint64_t bit;
        const char *name;
    } names[] = {
        {RK_CLOCK_GPU_IDLE, "gpu_idle"},         {RK_CLOCK_APP_SETTING, "app_setting"},
        {RK_CLOCK_SW_POWER_CAP, "sw_power_cap"}, {RK_CLOCK_HW_SLOWDOWN, "hw_slowdown"},
        {RK_CLOCK_SYNC_BOOST, "sync_boost"},     {RK_CLOCK_SW_THERMAL, "sw_thermal"},
        {RK_CLOCK_HW_THERMAL, "hw_thermal"},     {RK_CLOCK_HW_POWER_BRAKE, "hw_power_brake"},
    };
    size_t len = 0;
    if (cap == 0)
        return buf;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (reasons & names[i].bit)
            put(buf, cap, &len, "%s%s", len ? "," : "", names[i].name);
    if (!buf[0])
        snprintf(buf, cap, "none");
    return buf;
}
