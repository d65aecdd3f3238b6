/*
 * Tests for the simulated fleet (rk_telemetry_sim, health/sim.h, docs/sim.md): the same seed
 * and reads give the same bits and another seed other bits; each profile reports exactly the
 * fields its real card can; wear only grows and shows (vibration, ripple, errors, heat); a
 * drawn failure is logged at its time and the GPU is lost from then on; thermal shutdowns and
 * episodes of wrong arithmetic happen, are logged, and the ground-truth query agrees with the
 * log whatever the reads were; and lifetimes drawn for the unworn profile fit Titan's Weibull
 * (titan_fit.h) within 5%, while worn profiles fail sooner.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "health/sim.h"
#include "health/titan_fit.h"
#include "rekindle/health.h"
#include "testutil.h"

RK_TEST_DIR_FIXTURE("test_sim")

static const char *tmp_path(char *buf, size_t cap, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", g_dir, name);
    assert_true(n > 0 && (size_t)n < cap);
    unlink(buf);
    return buf;
}

/* A fleet of n GPUs running `load`, with or without the VRM and fan sensor kit. */
static rk_sim *fleet_open_as(int n, uint64_t seed, double start_age_h, const char *events,
                             rk_sim_load load, bool sensors)
{
    rk_telemetry_opts o = RK_TELEMETRY_OPTS_DEFAULT;
    o.sim_gpus = n;
    o.seed = seed;
    o.start_age_h = start_age_h;
    o.events_path = events;
    o.sim_load = load;
    o.sim_sensors = sensors;
    rk_sim *st = NULL;
    rk_err err = {0};
    assert_int_equal(rk_sim_open(&st, &o, &err), RK_OK);
    assert_non_null(st);
    assert_int_equal(rk_sim_count(st), n);
    return st;
}

/* The ageing tests watch every signal the model has: GPUs in a job (busy), sensors fitted, as
 * the predictor's dataset runs them (the defaults are idle and NVML's fields only). */
static rk_sim *fleet_open(int n, uint64_t seed, double start_age_h, const char *events)
{
    return fleet_open_as(n, seed, start_age_h, events, RK_SIM_LOAD_BUSY, true);
}

static void fleet_read(rk_sim *st, double t, int i, rk_gpu_sample *s)
{
    rk_err err = {0};
    assert_int_equal(rk_sim_set_time(st, t), RK_OK);
    assert_int_equal(rk_sim_read(st, i, s, &err), RK_OK);
    assert_true(s->t == t);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *len = 0;
        return calloc(1, 1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc(1, (size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* One line of the event log. */
typedef struct ev {
    double t;
    int gpu;
    char uuid[96], event[32];
} ev;

/* Every line of the log, checked against the documented format. */
static ev *read_log(const char *path, int *n)
{
    size_t len;
    char *text = slurp(path, &len);
    int cap = 16, k = 0;
    ev *e = malloc(sizeof *e * (size_t)cap);
    assert_non_null(e);
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl); /* every line is complete */
        *nl = '\0';
        if (k == cap) {
            cap *= 2;
            e = realloc(e, sizeof *e * (size_t)cap);
            assert_non_null(e);
        }
        int used = 0;
        assert_int_equal(
            sscanf(line,
                   "{\"t\":%lf,\"gpu\":%d,\"uuid\":\"%95[^\"]\",\"event\":\"%31[^\"]\","
                   "\"detail\":\"%*[^\"]\"}%n",
                   &e[k].t, &e[k].gpu, e[k].uuid, e[k].event, &used),
            4);
        assert_int_equal((size_t)used, strlen(line));
        const char *ok[] = {"off_bus", "thermal_shutdown", "sdc_start",     "sdc_end",
                            "dbe",     "precursor",        "episode_start", "episode_end"};
        bool known = false;
        for (size_t j = 0; j < sizeof ok / sizeof ok[0]; j++)
            known |= strcmp(e[k].event, ok[j]) == 0;
        assert_true(known);
        k++;
        line = nl + 1;
    }
    free(text);
    *n = k;
    return e;
}

/* ---- determinism ------------------------------------------------------------------------- */

static const double read_times[] = {0,     5,       10,       600,      3600,
                                    86400, 2592000, 34560000, 94608000, 94608005};
#define NTIMES ((int)(sizeof read_times / sizeof read_times[0]))

/* All samples of a 16-GPU fleet at read_times (n GPUs x NTIMES). */
static void run_fleet(uint64_t seed, const char *events, rk_gpu_sample *out, rk_gpu_info *infos)
{
    rk_sim *st = fleet_open(16, seed, 1000, events);
    for (int i = 0; i < 16; i++)
        assert_int_equal(rk_sim_info(st, i, &infos[i]), RK_OK);
    for (int k = 0; k < NTIMES; k++)
        for (int i = 0; i < 16; i++)
            fleet_read(st, read_times[k], i, &out[k * 16 + i]);
    rk_sim_close(st);
}

static void test_same_seed_same_bits_other_seed_other_bits(void **state)
{
    (void)state;
    char pa[600], pb[600], pc[600];
    rk_gpu_sample *a = calloc(16 * NTIMES, sizeof *a), *b = calloc(16 * NTIMES, sizeof *b);
    rk_gpu_sample *c = calloc(16 * NTIMES, sizeof *c);
    rk_gpu_info ia[16], ib[16], ic[16];
    assert_true(a && b && c);
    run_fleet(42, tmp_path(pa, sizeof pa, "a.jsonl"), a, ia);
    run_fleet(42, tmp_path(pb, sizeof pb, "b.jsonl"), b, ib);
    run_fleet(43, tmp_path(pc, sizeof pc, "c.jsonl"), c, ic);

    assert_memory_equal(a, b, sizeof *a * 16 * NTIMES);
    for (int i = 0; i < 16; i++) {
        assert_string_equal(ia[i].uuid, ib[i].uuid);
        assert_string_equal(ia[i].profile, ib[i].profile);
    }
    size_t la, lb;
    char *ta = slurp(pa, &la), *tb = slurp(pb, &lb);
    assert_true(la > 0); /* three years of a worn fleet: something failed */
    assert_int_equal(la, lb);
    assert_memory_equal(ta, tb, la);

    /* another seed: other GPUs, other readings, other uuids */
    int differ = 0;
    for (int k = 0; k < 16 * NTIMES; k++)
        differ += memcmp(&a[k], &c[k], sizeof a[k]) != 0;
    assert_true(differ > 16 * NTIMES / 2);
    assert_string_equal(ia[3].uuid, "SIM-42-3");
    assert_string_equal(ic[3].uuid, "SIM-43-3");
    free(ta);
    free(tb);
    free(a);
    free(b);
    free(c);
}

/* ---- fields per profile ------------------------------------------------------------------ */

#define ECC_BITS                                                                                   \
    ((1ull << RK_F_ECC_CORRECTED) | (1ull << RK_F_ECC_UNCORRECTED) | (1ull << RK_F_RETIRED) |      \
     (1ull << RK_F_RETIRED_PENDING))
#define FAN_BIT (1ull << RK_F_FAN)
#define VIB_BIT (1ull << RK_F_FAN_VIB)
#define VRM_BIT (1ull << RK_F_VRM_RIPPLE)
#define REMAP_BIT (1ull << RK_F_REMAPPED)

/* NVML's fields by card (a GeForce card has neither ECC nor remapped rows; a passive Tesla no
 * fan), and the sensor kit's fields only when it is fitted: the fleet's defaults report what
 * NVML would, nothing more. */
static void profile_fields(bool sensors)
{
    rk_sim *st = fleet_open_as(64, 3, 0, NULL, RK_SIM_LOAD_BUSY, sensors);
    const uint64_t kit = sensors ? VRM_BIT : 0, fan_kit = sensors ? VIB_BIT : 0;
    const uint64_t no_kit = sensors ? 0 : VRM_BIT | VIB_BIT;
    struct {
        const char *profile, *name;
        int gen_max;
        uint64_t mem_gib, present, absent;
    } want[] = {
        {"1070ti-mining", "NVIDIA GeForce GTX 1070 Ti", 3, 8, FAN_BIT | fan_kit,
         ECC_BITS | REMAP_BIT | no_kit},
        {"1080ti-gaming", "NVIDIA GeForce GTX 1080 Ti", 3, 11, FAN_BIT | fan_kit,
         ECC_BITS | REMAP_BIT | no_kit},
        {"p100-hpc", "Tesla P100-PCIE-16GB", 3, 16, ECC_BITS,
         FAN_BIT | VIB_BIT | REMAP_BIT | no_kit},
        {"3090-mining", "NVIDIA GeForce RTX 3090", 4, 24, FAN_BIT | fan_kit,
         ECC_BITS | REMAP_BIT | no_kit},
    };
    const uint64_t always =
        (1ull << RK_F_TEMP) | (1ull << RK_F_POWER) | (1ull << RK_F_POWER_LIMIT) |
        (1ull << RK_F_SM_CLOCK) | (1ull << RK_F_MEM_CLOCK) | (1ull << RK_F_CLOCK_REASONS) |
        (1ull << RK_F_UTIL) | (1ull << RK_F_MEM_USED) | (1ull << RK_F_MEM_TOTAL) |
        (1ull << RK_F_PCIE_GEN) | (1ull << RK_F_PCIE_WIDTH) | (1ull << RK_F_PCIE_GEN_MAX) |
        (1ull << RK_F_PCIE_WIDTH_MAX) | (1ull << RK_F_PCIE_REPLAY) | (1ull << RK_F_ENERGY) |
        (1ull << RK_F_XID) | kit;
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
        int found = 0;
        for (int i = 0; i < 64; i++) {
            rk_gpu_info in;
            assert_int_equal(rk_sim_info(st, i, &in), RK_OK);
            if (strcmp(in.profile, want[w].profile) != 0)
                continue;
            found++;
            char uuid[64];
            snprintf(uuid, sizeof uuid, "SIM-3-%d", i);
            assert_string_equal(in.uuid, uuid);
            assert_string_equal(in.name, want[w].name);
            assert_true(in.simulated);
            assert_string_equal(in.backend, "sim");
            assert_int_equal(in.index, i);
            assert_int_equal(in.serial[0] != '\0', strcmp(want[w].profile, "p100-hpc") == 0);
            rk_gpu_sample s;
            fleet_read(st, 0, i, &s);
            assert_false(s.lost);
            assert_int_equal(s.valid & always, always);
            assert_int_equal(s.valid & want[w].present, want[w].present);
            assert_int_equal(s.valid & want[w].absent, 0);
            /* absent fields are left zero, never made up */
            if (want[w].absent & ECC_BITS)
                assert_true(s.ecc_corrected == 0 && s.ecc_uncorrected == 0 && s.retired_pages == 0);
            assert_true(s.remapped_rows == 0);
            if (!sensors)
                assert_true(s.vrm_ripple_mv == 0 && s.fan_vib_hz == 0);
            assert_int_equal(s.pcie_gen_max, want[w].gen_max);
            assert_int_equal(s.pcie_width_max, 16);
            assert_true(s.pcie_width == 16 || s.pcie_width == 8);
            assert_true(s.mem_total_bytes == want[w].mem_gib << 30);
            assert_true(s.temp_c > 20 && s.temp_c < 95);
        }
        assert_true(found > 0); /* 64 GPUs of seed 3 hold every drawn profile */
    }
    rk_sim_close(st);
}

static void test_each_profile_reports_only_what_its_card_can(void **state)
{
    (void)state;
    profile_fields(false);
    profile_fields(true);
}

/* ---- wear -------------------------------------------------------------------------------- */

/* 1 if GPU i shows an episode or warning signs at t by the log: inside an episode, or
 * within the longest lead (plus the hours a seized fan takes to overheat a card) after the
 * start of warning signs. */
static int anomalous(const ev *e, int n, int i, double t)
{
    double ep_start = -1;
    for (int j = 0; j < n && e[j].t <= t; j++) {
        if (e[j].gpu != i)
            continue;
        if (strcmp(e[j].event, "episode_start") == 0)
            ep_start = e[j].t;
        else if (strcmp(e[j].event, "episode_end") == 0)
            ep_start = -1;
        else if (strcmp(e[j].event, "precursor") == 0 && t < e[j].t + (150 + 240) * 60.0)
            return 1;
    }
    return ep_start >= 0;
}

static void test_wear_only_grows_and_shows(void **state)
{
    (void)state;
    enum { N = 32, STEP_D = 10, YEARS = 3 };
    char path[600];
    tmp_path(path, sizeof path, "wear.jsonl");
    rk_sim *st = fleet_open(N, 11, 0, path);
    int days = 365 * YEARS, reads = days / STEP_D + 1;
    rk_gpu_sample *all = calloc((size_t)reads * N, sizeof *all);
    assert_non_null(all);
    for (int k = 0; k < reads; k++)
        for (int i = 0; i < N; i++)
            fleet_read(st, k * STEP_D * 86400.0, i, &all[k * N + i]);
    rk_sim_close(st);
    int nev;
    ev *log = read_log(path, &nev);

    /* Wear shows outside episodes and warning signs (which come and go on top of it). */
    rk_gpu_sample first[N], prev[N];
    double vib_gain = 0, ripple_gain = 0, hot_early = 0, hot_late = 0;
    int n_early = 0, n_late = 0, skipped = 0;
    uint64_t ce_gain = 0;
    for (int k = 0; k < reads; k++) {
        int d = k * STEP_D;
        for (int i = 0; i < N; i++) {
            rk_gpu_sample s = all[k * N + i];
            if (d > 0 && anomalous(log, nev, i, s.t)) {
                skipped++;
                continue;
            }
            if (d == 0)
                first[i] = s;
            else if (!s.lost && !prev[i].lost) {
                if (rk_field_valid(&s, RK_F_FAN_VIB) && rk_field_valid(&prev[i], RK_F_FAN_VIB))
                    assert_true(s.fan_vib_hz >= prev[i].fan_vib_hz);
                assert_true(s.vrm_ripple_mv >= prev[i].vrm_ripple_mv);
                assert_true(s.ecc_corrected >= prev[i].ecc_corrected);
                assert_true(s.ecc_uncorrected >= prev[i].ecc_uncorrected);
                assert_true(s.retired_pages >= prev[i].retired_pages);
                assert_true(s.remapped_rows >= prev[i].remapped_rows);
                assert_true(s.pcie_replay >= prev[i].pcie_replay);
                assert_true(s.energy_j > prev[i].energy_j);
                assert_true(s.xid_count >= prev[i].xid_count);
                if (rk_field_valid(&s, RK_F_FAN_VIB) && rk_field_valid(&first[i], RK_F_FAN_VIB))
                    vib_gain = fmax(vib_gain, s.fan_vib_hz - first[i].fan_vib_hz);
                ripple_gain = fmax(ripple_gain, s.vrm_ripple_mv - first[i].vrm_ripple_mv);
                ce_gain += s.ecc_corrected - prev[i].ecc_corrected;
            }
            /* busy temperatures of fan cards: the first year against the third */
            if (!s.lost && s.util_pct >= 90 && rk_field_valid(&s, RK_F_FAN)) {
                if (d < 365)
                    hot_early += s.temp_c, n_early++;
                else if (d >= 730)
                    hot_late += s.temp_c, n_late++;
            }
            prev[i] = s;
        }
    }
    print_message("%d of %d reads skipped: inside an episode or warning signs\n", skipped,
                  reads * N);
    assert_true(skipped < reads * N / 10);
    free(all);
    free(log);
    /* wear is visible, not just allowed */
    assert_true(vib_gain > 100);
    assert_true(ripple_gain > 20);
    assert_true(ce_gain > 0);
    assert_true(n_early > 50 && n_late > 50);
    assert_true(hot_late / n_late > hot_early / n_early + 1.5);
}

/* ---- failures ---------------------------------------------------------------------------- */

static void test_drawn_off_bus_is_logged_at_its_time_and_the_gpu_stays_lost(void **state)
{
    (void)state;
    enum { N = 64 };
    const uint64_t seed = 5;
    const double age = 5000;
    /* the off-bus GPUs by drawn time, earliest first */
    int order[N], m = 0;
    double life[N];
    for (int i = 0; i < N; i++) {
        const char *evname = NULL;
        life[i] = rk_sim_lifetime_hours(seed, i, NULL, age, &evname);
        assert_true(life[i] >= 0);
        assert_non_null(evname);
        if (strcmp(evname, "off_bus") == 0)
            order[m++] = i;
    }
    assert_true(m > 0);
    for (int a = 0; a < m; a++)
        for (int b = a + 1; b < m; b++)
            if (life[order[b]] < life[order[a]]) {
                int x = order[a];
                order[a] = order[b];
                order[b] = x;
            }
    char path[600];
    tmp_path(path, sizeof path, "off_bus.jsonl");
    rk_sim *st = fleet_open(N, seed, age, path);
    int tested = 0;
    for (int k = 0; k < m && !tested; k++) {
        int i = order[k];
        double tf = life[i] * 3600;
        rk_gpu_sample s;
        fleet_read(st, tf - 60, i, &s);
        if (s.lost)
            continue; /* it overheated first: try the next */
        fleet_read(st, tf + 60, i, &s);
        assert_true(s.lost);
        assert_int_equal(s.valid, 0);
        fleet_read(st, tf + 86400, i, &s);
        assert_true(s.lost);
        assert_int_equal(rk_sim_sdc_active(st, i), 0);
        int n;
        ev *e = read_log(path, &n);
        int hits = 0;
        for (int j = 0; j < n; j++)
            if (e[j].gpu == i && strcmp(e[j].event, "off_bus") == 0) {
                hits++;
                assert_true(fabs(e[j].t - tf) < 0.002);
                char uuid[64];
                snprintf(uuid, sizeof uuid, "SIM-5-%d", i);
                assert_string_equal(e[j].uuid, uuid);
            }
        assert_int_equal(hits, 1);
        free(e);
        tested = 1;
    }
    assert_true(tested);
    rk_sim_close(st);
}

/* A worn mining fleet read every two days for four years: fans seize and cards overheat, VRMs
 * give wrong answers. */
static void test_overheating_and_wrong_arithmetic_are_logged_and_queried(void **state)
{
    (void)state;
    enum { N = 16 };
    const uint64_t seed = 9;
    char path[600];
    tmp_path(path, sizeof path, "fleet.jsonl");
    rk_sim *st = fleet_open(N, seed, 8000, path);
    double lost_at[N];
    bool vib_warned[N] = {0};
    for (int i = 0; i < N; i++)
        lost_at[i] = INFINITY;
    for (int d = 0; d <= 4 * 365; d += 2)
        for (int i = 0; i < N; i++) {
            rk_gpu_sample s;
            fleet_read(st, d * 86400.0, i, &s);
            if (s.lost && lost_at[i] == INFINITY)
                lost_at[i] = s.t;
            if (lost_at[i] < INFINITY)
                assert_true(s.lost); /* once lost, always lost */
            if (rk_field_valid(&s, RK_F_FAN_VIB) && s.fan_vib_hz > 400)
                vib_warned[i] = true;
        }
    rk_sim_close(st);

    int n;
    ev *e = read_log(path, &n);
    int shutdowns = 0, episodes = 0, warned = 0;
    double last_t[N];
    for (int i = 0; i < N; i++)
        last_t[i] = -1;
    for (int j = 0; j < n; j++) {
        int i = e[j].gpu;
        assert_true(i >= 0 && i < N);
        assert_true(e[j].t >= last_t[i]); /* each GPU's events in time order */
        last_t[i] = e[j].t;
        if (strcmp(e[j].event, "thermal_shutdown") == 0) {
            shutdowns++;
            /* the fan's warning signs began 40..150 minutes before it seized, and the card
             * overheats within hours of the seizure */
            for (int k = 0; k < j; k++)
                if (e[k].gpu == i && strcmp(e[k].event, "precursor") == 0 &&
                    e[k].t >= e[j].t - (150 + 240) * 60.0 && e[k].t <= e[j].t - 40 * 60.0)
                    warned++;
            /* the first read after it saw the GPU gone; none before */
            assert_true(lost_at[i] >= e[j].t && lost_at[i] <= e[j].t + 2 * 86400.0);
            assert_true(vib_warned[i]); /* the bearing screamed first */
        }
        if (strcmp(e[j].event, "sdc_start") == 0 && j + 1 < n) {
            /* find its end: the ground-truth query of a fresh fleet that never read agrees */
            for (int k = j + 1; k < n; k++)
                if (e[k].gpu == i) {
                    if (strcmp(e[k].event, "sdc_end") != 0)
                        break;
                    if (episodes < 5) {
                        rk_sim *q = fleet_open(N, seed, 8000, NULL);
                        assert_int_equal(rk_sim_set_time(q, 0.5 * (e[j].t + e[k].t)), RK_OK);
                        assert_int_equal(rk_sim_sdc_active(q, i), 1);
                        assert_int_equal(rk_sim_set_time(q, e[k].t + 0.01), RK_OK);
                        assert_int_equal(rk_sim_sdc_active(q, i), 0);
                        rk_sim_close(q);
                    }
                    episodes++;
                    break;
                }
        }
    }
    assert_true(shutdowns > 0);
    print_message("%d thermal shutdowns, %d with warning signs before\n", shutdowns, warned);
    assert_true(warned >= shutdowns - 1 && warned <= shutdowns); /* 4% come silently */
    assert_true(episodes > 0);
    for (int i = 0; i < N; i++)
        if (lost_at[i] < INFINITY) { /* every loss has its cause in the log */
            int causes = 0;
            for (int j = 0; j < n; j++)
                causes += e[j].gpu == i && (strcmp(e[j].event, "off_bus") == 0 ||
                                            strcmp(e[j].event, "thermal_shutdown") == 0);
            assert_int_equal(causes, 1);
        }
    free(e);
}

/* ---- warning signs ------------------------------------------------------------------------ */

/* Every drawn failure has warning signs that start its drawn lead (40..150 minutes) before it,
 * except a documented few (4%) that come silently; the log names the start at that exact time;
 * and the signals of the failure's kind climb toward it. */
static void test_precursors_start_within_their_lead_before_each_failure(void **state)
{
    (void)state;
    /* the draws: leads in [40, 150] minutes, uniform; 4% silent */
    enum { DRAWS = 4000 };
    int silent = 0;
    double sum = 0;
    for (int i = 0; i < DRAWS; i++) {
        double lead = rk_sim_precursor_minutes(77, i, NULL, 20000);
        assert_true(lead == 0 || (lead >= 40 && lead <= 150));
        silent += lead == 0;
        sum += lead;
    }
    double mean = sum / (DRAWS - silent);
    print_message("%d of %d failures silent; mean lead %.1f min\n", silent, DRAWS, mean);
    assert_true(silent > DRAWS * 0.02 && silent < DRAWS * 0.06);
    assert_true(mean > 90 && mean < 100);

    /* in the log and the readings: GPUs drawn to fail within 400 hours, read every minute
     * over the 4 hours before the failure */
    enum { N = 64 };
    const double age = 40000;
    int checked[3] = {0}; /* off the bus, DBE with ECC, DBE without */
    for (uint64_t seed = 1; seed < 40 && !(checked[0] && checked[1] && checked[2]); seed++) {
        for (int i = 0; i < N; i++) {
            const char *evname;
            double h = rk_sim_lifetime_hours(seed, i, NULL, age, &evname);
            double lead = rk_sim_precursor_minutes(seed, i, NULL, age);
            if (!(h > 5 && h < 400) || lead == 0)
                continue;
            char path[600];
            tmp_path(path, sizeof path, "pre.jsonl");
            rk_sim *st = fleet_open(N, seed, age, path);
            rk_gpu_info in;
            assert_int_equal(rk_sim_info(st, i, &in), RK_OK);
            int kind = strcmp(evname, "off_bus") == 0        ? 0
                       : strcmp(in.profile, "p100-hpc") == 0 ? 1
                                                             : 2;
            if (checked[kind]) {
                rk_sim_close(st);
                continue;
            }
            const double tf = h * 3600.0;
            const int M = 240;
            rk_gpu_sample smp[240];
            bool lost_early = false;
            for (int m = 0; m < M; m++) {
                fleet_read(st, floor(tf / 60.0 - M + m) * 60.0, i, &smp[m]);
                lost_early |= smp[m].lost;
            }
            rk_sim_close(st);
            int n;
            ev *e = read_log(path, &n);
            int starts = 0, fails = 0;
            for (int j = 0; j < n; j++) {
                if (e[j].gpu != i)
                    continue;
                fails += strcmp(e[j].event, "thermal_shutdown") == 0;
                if (strcmp(e[j].event, "precursor") == 0 && fabs(e[j].t - (tf - lead * 60)) < 0.01)
                    starts++;
            }
            free(e);
            if (lost_early || fails)
                continue; /* it overheated first */
            assert_int_equal(starts, 1);
            /* the signal of the kind: per minute over the last 15 minutes against the hour
             * before the warning signs began */
            int pre0 = M - (int)ceil(lead) - 60;
            double before = 0, last = 0;
            for (int m = 1; m < M; m++) {
                double v = kind == 0   ? (double)(smp[m].pcie_replay - smp[m - 1].pcie_replay)
                           : kind == 1 ? (double)(smp[m].ecc_corrected - smp[m - 1].ecc_corrected)
                                       : smp[m].vrm_ripple_mv;
                if (m >= pre0 && m < pre0 + 60)
                    before += v / 60;
                if (m >= M - 15)
                    last += v / 15;
            }
            print_message("seed %llu GPU %d (%s, %s): lead %.0f min; per minute before %.2f, "
                          "last 15 min %.2f\n",
                          (unsigned long long)seed, i, in.profile, evname, lead, before, last);
            if (kind == 2)
                assert_true(last > before + 10); /* millivolts of ripple */
            else
                assert_true(last > 3 * before + 5);
            checked[kind] = 1;
        }
    }
    assert_true(checked[0] && checked[1] && checked[2]);
}

/* ---- calibration ------------------------------------------------------------------------- */

/* Censored Weibull MLE (event[i] false = censored): Newton on the shape's profile equation
 * inside a bisection bracket, as scripts/fit_titan.py does. */
static void weibull_fit(const double *t, const bool *event, int n, double *k_out, double *lam_out)
{
    double s = 0, mean_ev = 0;
    int r = 0;
    for (int i = 0; i < n; i++)
        s = fmax(s, t[i]);
    for (int i = 0; i < n; i++)
        if (event[i])
            mean_ev += log(t[i] / s), r++;
    assert_true(r > 0);
    mean_ev /= r;
    double lo = 0.01, hi = 100, k = 1;
    for (int it = 0; it < 200; it++) {
        double a = 0, b = 0, c = 0;
        for (int i = 0; i < n; i++) {
            double x = t[i] / s, l = log(x), w = pow(x, k);
            a += w, b += w * l, c += w * l * l;
        }
        b /= a, c /= a;
        double f = b - 1 / k - mean_ev, df = c - b * b + 1 / (k * k);
        if (f > 0)
            hi = k;
        else
            lo = k;
        double nk = k - f / df;
        if (!(nk > lo && nk < hi))
            nk = 0.5 * (lo + hi);
        bool done = fabs(nk - k) < 1e-12 * k;
        k = nk;
        if (done)
            break;
    }
    double a = 0;
    for (int i = 0; i < n; i++)
        a += pow(t[i] / s, k);
    *k_out = k;
    *lam_out = s * pow(a / r, 1 / k);
}

static double median_life(uint64_t seed, const char *profile, int n)
{
    double *t = malloc(sizeof *t * (size_t)n);
    assert_non_null(t);
    for (int i = 0; i < n; i++)
        t[i] = rk_sim_lifetime_hours(seed, i, profile, 0, NULL);
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    double m = t[n / 2];
    free(t);
    return m;
}

static void test_unworn_lifetimes_fit_titan_and_worn_fail_sooner(void **state)
{
    (void)state;
    enum { N = 20000 };
    double *t = malloc(sizeof *t * N);
    bool *all = malloc(sizeof *all * N), *dbe = malloc(sizeof *dbe * N);
    assert_true(t && all && dbe);
    int n_dbe = 0;
    for (int i = 0; i < N; i++) {
        const char *e;
        t[i] = rk_sim_lifetime_hours(2024, i, "k20x-titan", 0, &e);
        assert_true(t[i] > 0);
        all[i] = true;
        dbe[i] = strcmp(e, "dbe") == 0;
        n_dbe += dbe[i];
    }
    double k, lam;
    weibull_fit(t, all, N, &k, &lam);
    print_message("k20x-titan, %d draws: k %.4f (Titan %.4f), lambda %.0f h (Titan %.0f h)\n", N, k,
                  RK_TITAN_ANY_SHAPE, lam, RK_TITAN_ANY_SCALE_H);
    assert_true(fabs(k / RK_TITAN_ANY_SHAPE - 1) < 0.05);
    assert_true(fabs(lam / RK_TITAN_ANY_SCALE_H - 1) < 0.05);

    /* the causes follow Titan's cause-specific fits: time to DBE with off-bus censored */
    weibull_fit(t, dbe, N, &k, &lam);
    print_message("  DBE: %d events, k %.4f (Titan %.4f), lambda %.0f h (Titan %.0f h)\n", n_dbe, k,
                  RK_TITAN_DBE_SHAPE, lam, RK_TITAN_DBE_SCALE_H);
    assert_true(fabs(k / RK_TITAN_DBE_SHAPE - 1) < 0.05);
    assert_true(fabs(lam / RK_TITAN_DBE_SCALE_H - 1) < 0.05);
    for (int i = 0; i < N; i++)
        dbe[i] = !dbe[i];
    weibull_fit(t, dbe, N, &k, &lam);
    print_message("  OTB: %d events, k %.4f (Titan %.4f), lambda %.0f h (Titan %.0f h)\n",
                  N - n_dbe, k, RK_TITAN_OTB_SHAPE, lam, RK_TITAN_OTB_SCALE_H);
    assert_true(fabs(k / RK_TITAN_OTB_SHAPE - 1) < 0.05);
    assert_true(fabs(lam / RK_TITAN_OTB_SCALE_H - 1) < 0.05);
    free(t);
    free(all);
    free(dbe);

    /* worn profiles fail sooner than the unworn reference, the mining ones soonest */
    double base = median_life(7, "k20x-titan", 2001);
    double mining = median_life(7, "1070ti-mining", 2001);
    double gaming = median_life(7, "1080ti-gaming", 2001);
    print_message("  median hours to failure: k20x-titan %.0f, 1080ti-gaming %.0f, 1070ti-mining "
                  "%.0f\n",
                  base, gaming, mining);
    assert_true(mining < 0.5 * base);
    assert_true(gaming < base);
    assert_true(mining < gaming);
}

/* ---- interface ----------------------------------------------------------------------------- */

static void test_bad_options_and_arguments_are_refused(void **state)
{
    (void)state;
    rk_telemetry_opts o = RK_TELEMETRY_OPTS_DEFAULT;
    rk_sim *st = (void *)1;
    rk_err err = {0};
    o.events_path = "/nonexistent-dir/events.jsonl";
    assert_int_equal(rk_sim_open(&st, &o, &err), RK_EIO);
    assert_null(st);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/events.jsonl"));
    o.events_path = NULL;
    o.sim_gpus = 0;
    assert_int_equal(rk_sim_open(&st, &o, &err), RK_EINVAL);
    o.sim_gpus = 1025;
    assert_int_equal(rk_sim_open(&st, &o, &err), RK_EINVAL);
    o.sim_gpus = 2;
    o.sim_load = (rk_sim_load)7;
    assert_int_equal(rk_sim_open(&st, &o, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "load 7"));

    st = fleet_open(2, 1, 0, NULL);
    rk_gpu_sample s;
    assert_int_equal(rk_sim_read(st, 2, &s, &err), RK_EINVAL);
    assert_int_equal(rk_sim_read(st, -1, &s, &err), RK_EINVAL);
    rk_gpu_info in;
    assert_int_equal(rk_sim_info(st, 2, &in), RK_EINVAL);
    assert_int_equal(rk_sim_sdc_active(st, 2), RK_EINVAL);
    fleet_read(st, 100, 0, &s);
    assert_int_equal(rk_sim_set_time(st, 99), RK_EINVAL); /* time never goes back */
    assert_int_equal(rk_sim_set_time(st, NAN), RK_EINVAL);
    assert_int_equal(rk_sim_set_time(st, 100), RK_OK);
    assert_true(rk_sim_now(st) == 100);
    rk_sim_close(st);

    assert_true(isnan(rk_sim_lifetime_hours(1, 0, "no-such-card", 0, NULL)));
    assert_int_equal(rk_sim_profile_count(), 5);
    assert_string_equal(rk_sim_profile_name(0), "1070ti-mining");
    assert_null(rk_sim_profile_name(5));
}

/* ---- the defaults: an idle card, NVML's fields ----------------------------------------------- */

/* What the fleet does unasked (RK_TELEMETRY_OPTS_DEFAULT): every GPU idle, as a card nobody
 * uses (utilisation a few percent, the idle clock reason, idle clocks), and only the fields
 * NVML reports: no VRM ripple or fan vibration, and on GeForce cards no ECC and no remapped
 * rows. The same fleet asked to be busy runs its job most of the time, so the idle readings
 * are the option's doing; and textfiles still bring their sensors to the idle fleet. */
static void test_defaults_are_idle_cards_with_nvml_fields_only(void **state)
{
    (void)state;
    enum { N = 16, READS = 288 }; /* two days, every 10 minutes */
    rk_telemetry_opts o = RK_TELEMETRY_OPTS_DEFAULT;
    assert_int_equal(o.sim_load, RK_SIM_LOAD_IDLE);
    assert_false(o.sim_sensors);
    o.sim_gpus = N;
    o.seed = 7;
    o.start_age_h = 20000;
    rk_err err = {0};
    rk_sim *idle = NULL;
    assert_int_equal(rk_sim_open(&idle, &o, &err), RK_OK);
    rk_sim *busy = fleet_open_as(N, 7, 20000, NULL, RK_SIM_LOAD_BUSY, false);
    int n_idle = 0, n_busy = 0, busy_reads = 0, geforce = 0;
    double util_sum = 0;
    for (int k = 0; k < READS; k++)
        for (int i = 0; i < N; i++) {
            rk_gpu_sample s, b;
            rk_gpu_info in;
            assert_int_equal(rk_sim_info(idle, i, &in), RK_OK);
            fleet_read(idle, k * 600.0, i, &s);
            fleet_read(busy, k * 600.0, i, &b);
            if (!b.lost) {
                n_busy++;
                busy_reads += b.util_pct >= 90;
                assert_false(rk_field_valid(&b, RK_F_VRM_RIPPLE));
            }
            if (s.lost)
                continue;
            n_idle++;
            util_sum += s.util_pct;
            assert_true(rk_field_valid(&s, RK_F_UTIL) && s.util_pct <= 5);
            assert_true(s.clock_reasons & RK_CLOCK_GPU_IDLE);
            assert_true(s.mem_used_bytes < s.mem_total_bytes / 10);
            assert_false(rk_field_valid(&s, RK_F_VRM_RIPPLE));
            assert_false(rk_field_valid(&s, RK_F_FAN_VIB));
            assert_false(rk_field_valid(&s, RK_F_REMAPPED));
            if (strstr(in.name, "GeForce")) {
                geforce++;
                assert_false(rk_field_valid(&s, RK_F_ECC_CORRECTED));
                assert_false(rk_field_valid(&s, RK_F_ECC_UNCORRECTED));
                assert_false(rk_field_valid(&s, RK_F_RETIRED));
                assert_false(rk_field_valid(&s, RK_F_RETIRED_PENDING));
            }
        }
    rk_sim_close(idle);
    rk_sim_close(busy);
    print_message("idle: mean utilisation %.2f%% over %d readings; busy: %d of %d at 90%%+\n",
                  util_sum / n_idle, n_idle, busy_reads, n_busy);
    assert_true(n_idle > N * READS / 2 && geforce > 0);
    assert_true(util_sum / n_idle < 3.0);
    assert_true(busy_reads > n_busy * 7 / 10); /* 85% of slots busy */

    /* a textfile's sensors are merged into the default fleet's samples all the same */
    char path[600];
    tmp_path(path, sizeof path, "kit.prom");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("rk_sensor_vrm_ripple_volts{gpu=\"1\"} 0.042\n", f);
    assert_int_equal(fclose(f), 0);
    rk_telemetry_opts to = RK_TELEMETRY_OPTS_DEFAULT;
    to.sim_gpus = 2;
    to.textfile_dir = g_dir;
    rk_telemetry *t = NULL;
    assert_int_equal(rk_telemetry_open(&t, "sim", &to, &err), RK_OK);
    rk_gpu_info infos[2];
    rk_gpu_sample smp[2];
    assert_int_equal(rk_telemetry_read_all(t, infos, smp, &err), RK_OK);
    assert_false(rk_field_valid(&smp[0], RK_F_VRM_RIPPLE));
    assert_true(rk_field_valid(&smp[1], RK_F_VRM_RIPPLE));
    assert_true(fabs(smp[1].vrm_ripple_mv - 42) < 1e-9);
    rk_telemetry_close(t);
    unlink(path);
}

/* Through the public interface with the monotonic clock: an hour of simulated time per second. */
static void test_public_interface_runs_on_the_monotonic_clock(void **state)
{
    (void)state;
    rk_telemetry *t;
    rk_telemetry_opts o = RK_TELEMETRY_OPTS_DEFAULT;
    o.sim_gpus = 4;
    o.time_scale = 3600;
    rk_err err = {0};
    assert_int_equal(rk_telemetry_open(&t, "sim", &o, &err), RK_OK);
    assert_string_equal(rk_telemetry_backend(t), "sim");
    rk_gpu_info infos[4];
    rk_gpu_sample a[4], b[4];
    /* the clock starts at the first reading, not at open: a slow caller does not age the
     * fleet before it looks (it was 72 simulated seconds here, and rk run's health gate once
     * read a GPU past its threshold at 480,000x) */
    usleep(20000);
    assert_true(rk_sim_now(rk_telemetry_sim_of(t)) == 0);
    /* no more simulated time than the read itself took (the 20 ms before it were 72 s): a
     * bound that a loaded machine only widens, not a fixed one it could break */
    double r0 = rk_mono_s();
    assert_int_equal(rk_telemetry_read_all(t, infos, a, &err), RK_OK);
    double r1 = rk_mono_s();
    assert_true(a[0].t <= (r1 - r0) * 3600 + 1e-6);
    usleep(20000);
    assert_int_equal(rk_telemetry_read_all(t, infos, b, &err), RK_OK);
    for (int i = 0; i < 4; i++) {
        assert_true(infos[i].simulated);
        assert_true(a[i].t >= 0);
        assert_true(b[i].t >= a[i].t + 60); /* 20 ms real is 72 s simulated */
        assert_true(b[i].energy_j > a[i].energy_j);
    }
    rk_telemetry_close(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_seed_same_bits_other_seed_other_bits),
        cmocka_unit_test(test_each_profile_reports_only_what_its_card_can),
        cmocka_unit_test(test_wear_only_grows_and_shows),
        cmocka_unit_test(test_drawn_off_bus_is_logged_at_its_time_and_the_gpu_stays_lost),
        cmocka_unit_test(test_overheating_and_wrong_arithmetic_are_logged_and_queried),
        cmocka_unit_test(test_precursors_start_within_their_lead_before_each_failure),
        cmocka_unit_test(test_unworn_lifetimes_fit_titan_and_worn_fail_sooner),
        cmocka_unit_test(test_bad_options_and_arguments_are_refused),
        cmocka_unit_test(test_defaults_are_idle_cards_with_nvml_fields_only),
        cmocka_unit_test(test_public_interface_runs_on_the_monotonic_clock),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
