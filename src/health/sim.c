/*
 * The "sim" telemetry backend (rekindle/health.h, health/sim.h, docs/sim.md): a seeded fleet
 * of virtual GPUs drawn from profiles, each ageing with simulated time (fan bearing, thermal
 * paste, VRM capacitors, memory, PCIe riser) and failing with hazards calibrated on Titan's
 * GPU lifetimes (titan_fit.h). Relies on rekindle/rng.h for every random draw; never prints.
 */
#include "health/sim.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/msg.h"
#include "health/titan_fit.h"
#include "rekindle/rng.h"

#define GIB 1073741824ull

/* ---- profiles ----------------------------------------------------------------------------- */

typedef struct profile {
    const char *id, *name;
    double weight; /* share of a drawn fleet */
    /* has_ecc, reports_remap: what NVML reports (a GeForce card: neither); row_wear: its
     * memory's rows fail and the simulator counts them, reported only with reports_remap */
    bool has_fan, has_ecc, row_wear, reports_remap, has_serial;
    /* power (W), clocks (MHz), memory, link */
    double tdp_w, idle_w, sm_mhz, sm_idle_mhz, mem_mhz, mem_idle_mhz;
    uint64_t mem_total;
    int gen_max, width_max;
    /* thermal network: die --R_paste-- heatsink --(G_passive + G_fan f^0.8)-- air */
    double ambient_c, r_paste_kw, paste_dmax, c_die_jk, c_sink_jk, g_passive_wk, g_fan_wk;
    double t_target_c, t_slowdown_c, t_shutdown_c;
    /* wear: prior service (equivalent hours at load), characteristic hours of each part */
    double prior_min_h, prior_max_h;
    double fan_life_h, tau_paste_h, ripple0_mv, tau_esr_h, mem_rate0_h, tau_mem_h;
    double riser_p;
    /* lifetime acceleration against Titan's K20X (median and log-normal spread) */
    double accel, accel_sigma;
} profile;

/* One profile per paragraph reads better than one field per line. */
/* clang-format off */
static const profile profiles[] = {
    {.id = "1070ti-mining", .name = "NVIDIA GeForce GTX 1070 Ti", .weight = 0.4,
     .has_fan = true, .tdp_w = 180, .idle_w = 8, .sm_mhz = 1683, .sm_idle_mhz = 139,
     .mem_mhz = 4004, .mem_idle_mhz = 405, .mem_total = 8 * GIB, .gen_max = 3, .width_max = 16,
     .ambient_c = 30, .r_paste_kw = 0.05, .paste_dmax = 2.0, .c_die_jk = 80, .c_sink_jk = 500,
     .g_passive_wk = 0.8, .g_fan_wk = 6.0, .t_target_c = 83, .t_slowdown_c = 96,
     .t_shutdown_c = 99, .prior_min_h = 17520, .prior_max_h = 26280, .fan_life_h = 45000,
     .tau_paste_h = 20000, .ripple0_mv = 14, .tau_esr_h = 30000, .riser_p = 0.7, .accel = 1.6,
     .accel_sigma = 0.3},
    {.id = "1080ti-gaming", .name = "NVIDIA GeForce GTX 1080 Ti", .weight = 0.2,
     .has_fan = true, .tdp_w = 250, .idle_w = 10, .sm_mhz = 1582, .sm_idle_mhz = 139,
     .mem_mhz = 5505, .mem_idle_mhz = 405, .mem_total = 11 * GIB, .gen_max = 3, .width_max = 16,
     .ambient_c = 28, .r_paste_kw = 0.045, .paste_dmax = 1.6, .c_die_jk = 100,
     .c_sink_jk = 600, .g_passive_wk = 0.9, .g_fan_wk = 7.0, .t_target_c = 84,
     .t_slowdown_c = 93, .t_shutdown_c = 96, .prior_min_h = 4000, .prior_max_h = 9000,
     .fan_life_h = 60000, .tau_paste_h = 30000, .ripple0_mv = 12, .tau_esr_h = 40000,
     .riser_p = 0.05, .accel = 1.2, .accel_sigma = 0.2},
    {.id = "p100-hpc", .name = "Tesla P100-PCIE-16GB", .weight = 0.2, .has_ecc = true,
     .has_serial = true, .tdp_w = 250, .idle_w = 28, .sm_mhz = 1328, .sm_idle_mhz = 544,
     .mem_mhz = 715, .mem_idle_mhz = 715, .mem_total = 16 * GIB, .gen_max = 3, .width_max = 16,
     .ambient_c = 27, .r_paste_kw = 0.035, .paste_dmax = 1.5, .c_die_jk = 100, .c_sink_jk = 700,
     .g_passive_wk = 8.0, .t_target_c = 80, .t_slowdown_c = 87, .t_shutdown_c = 90,
     .prior_min_h = 26000, .prior_max_h = 44000, .tau_paste_h = 40000, .ripple0_mv = 9,
     .tau_esr_h = 45000, .mem_rate0_h = 2e-4, .tau_mem_h = 9000, .accel = 1.0,
     .accel_sigma = 0.15},
    {.id = "3090-mining", .name = "NVIDIA GeForce RTX 3090", .weight = 0.2, .has_fan = true,
     .row_wear = true, .tdp_w = 350, .idle_w = 25, .sm_mhz = 1695, .sm_idle_mhz = 210,
     .mem_mhz = 9751, .mem_idle_mhz = 405, .mem_total = 24 * GIB, .gen_max = 4, .width_max = 16,
     .ambient_c = 30, .r_paste_kw = 0.025, .paste_dmax = 2.0, .c_die_jk = 120,
     .c_sink_jk = 900, .g_passive_wk = 1.2, .g_fan_wk = 12.0, .t_target_c = 83,
     .t_slowdown_c = 93, .t_shutdown_c = 98, .prior_min_h = 8760, .prior_max_h = 17520,
     .fan_life_h = 40000, .tau_paste_h = 18000, .ripple0_mv = 16, .tau_esr_h = 26000,
     .mem_rate0_h = 1e-5, .tau_mem_h = 5000, .riser_p = 0.6, .accel = 2.0, .accel_sigma = 0.3},
    /* The calibration reference: a new Tesla K20X as Titan ran it (no prior wear, no spread,
     * no riser), so its lifetimes are exactly the Titan fit. Never drawn into a fleet. */
    {.id = "k20x-titan", .name = "Tesla K20X", .weight = 0, .has_ecc = true,
     .has_serial = true, .tdp_w = 235, .idle_w = 20, .sm_mhz = 732, .sm_idle_mhz = 324,
     .mem_mhz = 2600, .mem_idle_mhz = 324, .mem_total = 6 * GIB, .gen_max = 2, .width_max = 16,
     .ambient_c = 25, .r_paste_kw = 0.04, .paste_dmax = 1.0, .c_die_jk = 100, .c_sink_jk = 700,
     .g_passive_wk = 6.0, .t_target_c = 82, .t_slowdown_c = 90, .t_shutdown_c = 95,
     .tau_paste_h = 40000, .ripple0_mv = 9, .tau_esr_h = 60000, .mem_rate0_h = 1e-4,
     .tau_mem_h = 12000, .accel = 1.0},
};
/* clang-format on */
#define NPROFILES ((int)(sizeof profiles / sizeof profiles[0]))

/* ---- model constants (docs/sim.md) ---------------------------------------------------------- */

#define SLOT_S 600.0      /* the load pattern changes every 10 simulated minutes */
#define BUSY_P 0.85       /* share of busy slots under RK_SIM_LOAD_BUSY (none when idle) */
#define STEP_S 1.0        /* thermal integration step */
#define WINDOW_S 1800.0   /* thermal history simulated before a read after a long gap */
#define FAN_MIN_PCT 30.0  /* fan curve: FAN_MIN at 40 C, 100% at 85 C */
#define VIB_RISE_HZ 380.0 /* bearing vibration: f0 + VIB_RISE * wear^3 */
#define RIPPLE_MAX_MV 250.0
#define SDC_RIPPLE_MV 80.0 /* wrong arithmetic under load above this ripple */
#define SDC_RATE_H 0.05    /* episodes per busy hour at 20 mV above it (quadratic) */
#define SDC_RATE_MAX_H 0.5
#define SDC_MEAN_S 900.0 /* mean episode length */
#define RETIRE_P 0.002   /* a corrected error retires its page */
#define RETIRE_MAX 64
#define REMAP_MAX 512
#define RATE_MAX_H 1e6       /* cap of any counter's rate */
#define RISER_REPLAY_MIN 0.5 /* median replays per busy minute through a flaky riser... */
#define RISER_TAU_H 6000.0   /* ...growing e-fold every RISER_TAU_H hours */
#define CLEAN_REPLAY_MIN 0.001
#define RISER_ACCEL 1.3    /* a riser shortens the lifetime by this factor */
#define DBE_FOLLOW_H 168.0 /* mean hours between DBEs once memory has failed (ECC cards) */
#define XID_DBE 48

enum {
    TAG_PROFILE = 1,
    TAG_WEAR,
    TAG_LIFE,
    TAG_EVENTS,
    TAG_NOISE,
    TAG_LOAD,
    TAG_FAN,
    TAG_SERIAL,
    TAG_PRECURSOR,
    TAG_EPISODE
};
enum { FAIL_OTB, FAIL_DBE };

/* Precursors: the warning signs before a failure (docs/sim.md). Each failure draws a lead L
 * (uniform PRE_LEAD_MIN..PRE_LEAD_MAX minutes before it) and a strength a (log-normal,
 * median 1, PRE_AMP_SIGMA); its signs grow as a x exp(-(minutes to failure) / PRE_TAU_MIN)
 * from L before the failure until it happens. PRE_SILENT_P of the failures come without. */
#define PRE_LEAD_MIN 40.0
#define PRE_LEAD_MAX 150.0
#define PRE_TAU_MIN 30.0
#define PRE_AMP_SIGMA 0.25
#define PRE_SILENT_P 0.04
#define PRE_REPLAY_MIN 400.0 /* off the bus: PCIe replays per minute at the failure */
#define PRE_XID_MIN 0.15     /* ...and Xid 32 (bus error) events per minute */
#define PRE_DOWNTRAIN 0.3    /* ...the link drops to half width above this level */
#define PRE_CE_MIN 150.0     /* DBE, ECC cards: corrected errors per minute at the failure */
#define PRE_RETIRE_P 0.01    /* ...each retires its page with this probability (Xid 63) */
#define PRE_POWER 0.15       /* DBE, no ECC: board power +15% at the failure... */
#define PRE_RIPPLE_MV 100.0  /* ...VRM ripple +100 mV... */
#define PRE_REMAP_MIN 1.0    /* ...rows remapped per minute where the card counts them */
#define PRE_VIB_HZ 500.0     /* fan seizure: vibration +500 Hz at the seizure... */
#define PRE_WOBBLE_PCT 30.0  /* ...fan speed wobble +30 points... */
#define PRE_AIRFLOW 0.5      /* ...and half the fan's airflow lost */
#define XID_BUS 32
#define XID_RETIRE 63

/* Benign look-alikes (docs/sim.md): episodes of the same signals that end in no failure, one
 * after another at exponential gaps of mean EP_GAP_H hours, each of a kind the card can show. */
#define EP_GAP_H 48.0
enum { EP_RISER, EP_ECC, EP_POWER, EP_RATTLE, EP_HOT, EP_KINDS };
enum { PRE_OTB, PRE_DBE_ECC, PRE_DBE_MEM, PRE_FAN };

typedef struct precursor {
    bool on;          /* false: no such failure, or it comes silently */
    bool logged;      /* its start is in the event log */
    int kind;         /* PRE_* */
    double t0, tf;    /* simulated seconds: the phase [t0, tf) ends at the failure */
    double amp, lead; /* strength, lead (minutes) */
} precursor;

typedef struct episode {
    rk_rng r;       /* the stream that draws the episodes, one after another */
    double t0, t1;  /* [t0, t1) simulated seconds */
    int kind;       /* EP_* */
    double a, b, c; /* the kind's parameters (docs/sim.md) */
    bool xid;       /* riser: an Xid 32 when it starts */
    bool started;   /* its start is in the event log */
} episode;

/* ---- the fleet ---------------------------------------------------------------------------- */

typedef struct sim_gpu {
    const profile *p;
    int index;
    rk_gpu_info info;
    /* the fleet's options: the share of busy slots (opts.sim_load), and whether the external
     * sensors are fitted (opts.sim_sensors: VRM ripple, fan vibration) */
    double busy_p;
    bool sensors;
    /* drawn at open */
    double age0_h, ambient_c, fan_life_h, tau_paste_h, ripple0_mv, tau_esr_h, mem_rate0_h;
    double vib0_hz, wobble_s, replay0_min, accel;
    bool riser;
    int gen, width;
    double fail_t; /* simulated seconds of the terminal failure */
    int fail_kind;
    /* thermal state, at time t */
    double t, td, ts, power_w, fan_cmd, util, energy_j;
    bool thermal_init;
    /* counters */
    uint64_t ce, ue, retired, pending, remapped, replay, xid_count;
    int last_xid;
    bool lost;
    /* timed events (segment-independent: a stream of their own), at time ev_t */
    rk_rng ev_rng;
    double ev_t, sdc_budget, sdc_end_t, next_dbe_t;
    bool sdc_on, sdc_perm, failed;
    rk_rng noise; /* per read: counters and measurement noise */
    /* warning signs: of the terminal failure and of the fan's seizure */
    precursor pre_fail, pre_fan;
    /* benign episodes: the event side's cursor and the thermal model's (the same stream) */
    episode ep, ep_th;
    /* expected counts the event side added since the last read (drawn at the read) */
    double acc_replay, acc_ce, acc_ce_pre, acc_xid, acc_remap;
    uint64_t xid_due; /* Xid events of episodes since the last read */
    bool read;        /* read at least once (the fleet's close brings it up to date) */
} sim_gpu;

struct rk_sim {
    uint64_t seed;
    double time_scale, t0_mono, pinned, t_max;
    bool clock_started; /* the monotonic clock counts from the first reading */
    bool is_pinned;
    FILE *events;
    char *events_path;
    int n;
    sim_gpu *g;
};
typedef struct rk_sim sim;

/* ---- random helpers ----------------------------------------------------------------------- */

static double u01(rk_rng *r)
{
    return ((double)(rk_rng_next(r) >> 11) + 0.5) * 0x1p-53; /* (0, 1) */
}

static double normal(rk_rng *r)
{
    double a = u01(r), b = u01(r);
    return sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b);
}

static uint64_t poisson(rk_rng *r, double mean)
{
    if (!(mean > 0))
        return 0;
    if (mean > 1e15)
        return (uint64_t)mean;
    if (mean > 30) {
        double v = floor(mean + sqrt(mean) * normal(r) + 0.5);
        return v > 0 ? (uint64_t)v : 0;
    }
    double l = exp(-mean), prod = u01(r);
    uint64_t k = 0;
    while (prod > l) {
        prod *= u01(r);
        k++;
    }
    return k;
}

/* The load of GPU g in slot s (a pure function: the same at every read): busy with
 * probability g->busy_p, idle otherwise. */
static double slot_util(uint64_t seed, const sim_gpu *g, int64_t s)
{
    rk_rng r;
    rk_rng_derive(&r, seed ^ TAG_LOAD, (uint64_t)g->index, (uint64_t)s);
    double a = u01(&r), b = u01(&r);
    return a < g->busy_p ? 90.0 + 10.0 * b : 3.0 * b;
}

static int64_t slot_of(double t)
{
    return (int64_t)floor(t / SLOT_S);
}

/* ---- wear as functions of service age (hours) --------------------------------------------- */

static double age_at(const sim_gpu *g, double t)
{
    return g->age0_h + t / 3600.0;
}

static double fan_wear(const sim_gpu *g, double age_h)
{
    return g->p->has_fan ? age_h / g->fan_life_h : 0;
}

static double r_paste(const sim_gpu *g, double age_h)
{
    return g->p->r_paste_kw * (1.0 + g->p->paste_dmax * (1.0 - exp(-age_h / g->tau_paste_h)));
}

static double ripple_mv(const sim_gpu *g, double age_h)
{
    double x = age_h / g->tau_esr_h;
    return x > 10 ? RIPPLE_MAX_MV : fmin(RIPPLE_MAX_MV, g->ripple0_mv * exp(x));
}

static double vib_hz(const sim_gpu *g, double age_h)
{
    double w = fmin(1.0, fan_wear(g, age_h));
    return g->vib0_hz + VIB_RISE_HZ * w * w * w;
}

/* Integral over ages [a0, a1] hours of min(c0 e^(a/tau), RATE_MAX_H). */
static double exp_rate_integral(double c0, double tau, double a0, double a1)
{
    if (!(c0 > 0) || !(a1 > a0))
        return 0;
    double acap = tau * log(RATE_MAX_H / c0); /* the age where the rate reaches the cap */
    double sum = 0;
    if (a0 < acap) {
        double hi = fmin(a1, acap);
        sum += c0 * tau * (exp(hi / tau) - exp(a0 / tau));
    }
    if (a1 > acap)
        sum += RATE_MAX_H * (a1 - fmax(a0, acap));
    return sum;
}

/* ---- warning signs and benign episodes ----------------------------------------------------- */

/* Level of a precursor at t: a exp(-(tf - t) / tau) inside its phase, else 0. */
static double pre_level(const precursor *p, double t)
{
    if (!p->on || t < p->t0 || t >= p->tf)
        return 0;
    return p->amp * exp(-(p->tf - t) / (PRE_TAU_MIN * 60.0));
}

/* Integral of pre_level over [a, b] (level x seconds). */
static double pre_integral(const precursor *p, double a, double b)
{
    if (!p->on)
        return 0;
    a = fmax(a, p->t0);
    b = fmin(b, p->tf);
    if (!(b > a))
        return 0;
    const double tau = PRE_TAU_MIN * 60.0;
    return p->amp * tau * (exp(-(p->tf - b) / tau) - exp(-(p->tf - a) / tau));
}

/* The precursor of a failure at tf of kind `kind`, drawn from r (always three draws). */
static void pre_draw(precursor *p, rk_rng *r, int kind, double tf, bool exists)
{
    double u_silent = u01(r), u_lead = u01(r), z = normal(r);
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->tf = tf;
    p->lead = PRE_LEAD_MIN + (PRE_LEAD_MAX - PRE_LEAD_MIN) * u_lead;
    p->t0 = tf - p->lead * 60.0;
    p->amp = exp(PRE_AMP_SIGMA * z);
    p->on = exists && isfinite(tf) && u_silent >= PRE_SILENT_P;
}

static const char *const ep_names[EP_KINDS] = {"riser", "ecc_burst", "power", "fan_rattle",
                                               "hot_spell"};

/* The next episode after e's current one (the first when e->t1 is 0): a gap, a kind the card
 * can show, its parameters. Always six draws. */
static void ep_next(episode *e, const profile *p)
{
    double gap = -log(u01(&e->r)) * EP_GAP_H * 3600.0, uk = u01(&e->r);
    double a = u01(&e->r), b = u01(&e->r), c = u01(&e->r), d = u01(&e->r);
    int kinds[EP_KINDS], n = 0;
    for (int k = 0; k < EP_KINDS; k++)
        if ((k != EP_ECC || p->has_ecc) && (k != EP_RATTLE || p->has_fan))
            kinds[n++] = k;
    e->kind = kinds[(int)(uk * n) < n ? (int)(uk * n) : n - 1];
    e->t0 = e->t1 + gap;
    e->started = false;
    e->xid = false;
    double minutes = 0;
    switch (e->kind) {
    case EP_RISER:                  /* a bumped riser: a replay burst that dies away */
        e->a = 10.0 * pow(30.0, a); /* replays per minute at the start: 10..300 */
        e->b = 3.0 + 27.0 * b;      /* decay time, minutes */
        e->c = c < 0.5 ? e->b : 0;  /* minutes the link drops to half width */
        e->xid = d < 0.25;
        minutes = 4.0 * e->b;
        break;
    case EP_ECC:               /* a weak cell hit by a workload: corrected errors, then quiet */
        e->a = 2.0 + 38.0 * a; /* per minute */
        minutes = 10.0 + 80.0 * b;
        break;
    case EP_POWER:              /* a sagging supply: more power and ripple at the same load */
        e->a = 0.02 + 0.08 * a; /* power gain */
        e->b = 8.0 + 42.0 * b;  /* ripple, mV */
        minutes = 20.0 + 100.0 * c;
        break;
    case EP_RATTLE:              /* a cable or dust touching the blades */
        e->a = 40.0 + 260.0 * a; /* vibration, Hz */
        e->b = 3.0 + 12.0 * b;   /* wobble, points */
        minutes = 10.0 + 110.0 * c;
        break;
    default:                  /* a hot spell in the room */
        e->a = 3.0 + 7.0 * a; /* ambient, C */
        minutes = 30.0 + 210.0 * b;
        break;
    }
    e->t1 = e->t0 + minutes * 60.0;
}

/* Bring cursor e to the episode that is on at t or comes next (t never goes back). */
static const episode *ep_at(episode *e, const profile *p, double t)
{
    while (t >= e->t1)
        ep_next(e, p);
    return e;
}

static bool ep_on(const episode *e, double t, int kind)
{
    return e->kind == kind && t >= e->t0 && t < e->t1;
}

/* ---- drawing a GPU ------------------------------------------------------------------------ */

static const profile *profile_named(const char *id)
{
    for (int k = 0; k < NPROFILES; k++)
        if (strcmp(profiles[k].id, id) == 0)
            return &profiles[k];
    return NULL;
}

static const profile *profile_drawn(uint64_t seed, int i)
{
    rk_rng r;
    rk_rng_derive(&r, seed, (uint64_t)i, TAG_PROFILE);
    double total = 0, acc = 0;
    for (int k = 0; k < NPROFILES; k++)
        total += profiles[k].weight;
    double u = u01(&r) * total;
    for (int k = 0; k < NPROFILES; k++) {
        acc += profiles[k].weight;
        if (profiles[k].weight > 0 && u < acc)
            return &profiles[k];
    }
    return &profiles[0];
}

static double weibull_hazard(double t, double k, double lam)
{
    return k / lam * pow(t / lam, k - 1);
}

/* Everything about GPU i that is fixed at open. Same draws for every profile, so a stream
 * never depends on which profile was drawn. */
static void gpu_draw(sim_gpu *g, uint64_t seed, int i, const profile *p, double start_age_h)
{
    memset(g, 0, sizeof *g);
    g->p = p;
    g->index = i;
    rk_rng r;
    rk_rng_derive(&r, seed, (uint64_t)i, TAG_WEAR);
    double prior = p->prior_min_h + (p->prior_max_h - p->prior_min_h) * u01(&r);
    g->age0_h = start_age_h + prior;
    g->ambient_c = p->ambient_c + 1.5 * normal(&r);
    g->tau_paste_h = p->tau_paste_h * exp(0.3 * normal(&r));
    g->ripple0_mv = p->ripple0_mv * exp(0.2 * normal(&r));
    g->tau_esr_h = p->tau_esr_h * exp(0.3 * normal(&r));
    g->mem_rate0_h = p->mem_rate0_h * exp(1.5 * normal(&r));
    g->vib0_hz = 110.0 + 20.0 * u01(&r);
    g->wobble_s = 2.0 + 3.0 * u01(&r);
    g->riser = u01(&r) < p->riser_p;
    double link = u01(&r);
    g->gen = p->gen_max;
    g->width = p->width_max;
    if (g->riser && link < 0.45)
        g->width = p->width_max / 2;
    else if (g->riser && link < 0.65)
        g->gen = 1;
    g->replay0_min = g->riser ? RISER_REPLAY_MIN * exp(0.8 * normal(&r)) : CLEAN_REPLAY_MIN;
    g->accel = p->accel * exp(p->accel_sigma * normal(&r)) * (g->riser ? RISER_ACCEL : 1.0);

    /* Fan bearing life (hours to seizure), log-normal, conditioned on the fan still turning
     * with some life left when the fleet opens: nobody installs a card with a dead fan. */
    if (p->has_fan) {
        rk_rng f;
        rk_rng_derive(&f, seed, (uint64_t)i, TAG_FAN);
        double need = g->age0_h * 1.05;
        for (int tries = 0; tries < 32 && !(g->fan_life_h > need); tries++)
            g->fan_life_h = p->fan_life_h * exp(0.25 * normal(&f));
        if (!(g->fan_life_h > need))
            g->fan_life_h = need + 0.3 * g->age0_h * u01(&f);
    }

    /* Terminal failure: Titan's time to any failure in wear-hours (service hours times the
     * acceleration), conditioned on surviving the wear the GPU arrives with. */
    rk_rng l;
    rk_rng_derive(&l, seed, (uint64_t)i, TAG_LIFE);
    double u = u01(&l), v = u01(&l);
    const double k = RK_TITAN_ANY_SHAPE, lam = RK_TITAN_ANY_SCALE_H;
    double a0 = g->accel * g->age0_h;
    double wear_life = lam * pow(pow(a0 / lam, k) - log(u), 1.0 / k);
    g->fail_t = (wear_life / g->accel - g->age0_h) * 3600.0;
    double hd = weibull_hazard(wear_life, RK_TITAN_DBE_SHAPE, RK_TITAN_DBE_SCALE_H);
    double ho = weibull_hazard(wear_life, RK_TITAN_OTB_SHAPE, RK_TITAN_OTB_SCALE_H);
    g->fail_kind = v < hd / (hd + ho) ? FAIL_DBE : FAIL_OTB;

    /* Lifetime counters the card brings (InfoROM totals): none pending. */
    if (p->has_ecc) {
        g->ce = poisson(&r, exp_rate_integral(g->mem_rate0_h, p->tau_mem_h, 0, g->age0_h));
        g->retired = poisson(&r, (double)g->ce * RETIRE_P);
        if (g->retired > RETIRE_MAX)
            g->retired = RETIRE_MAX;
    }
    if (p->row_wear) {
        g->remapped = poisson(&r, exp_rate_integral(g->mem_rate0_h, p->tau_mem_h, 0, g->age0_h));
        if (g->remapped > REMAP_MAX)
            g->remapped = REMAP_MAX;
    }
    rk_rng_derive(&g->ev_rng, seed, (uint64_t)i, TAG_EVENTS);
    g->sdc_budget = -log(u01(&g->ev_rng));
    g->next_dbe_t = INFINITY;
    rk_rng_derive(&g->noise, seed, (uint64_t)i, TAG_NOISE);

    /* Warning signs, from a stream of their own (nothing above changes). */
    rk_rng pr;
    rk_rng_derive(&pr, seed, (uint64_t)i, TAG_PRECURSOR);
    int kind = g->fail_kind == FAIL_OTB ? PRE_OTB : p->has_ecc ? PRE_DBE_ECC : PRE_DBE_MEM;
    pre_draw(&g->pre_fail, &pr, kind, g->fail_t, true);
    pre_draw(&g->pre_fan, &pr, PRE_FAN, (g->fan_life_h - g->age0_h) * 3600.0, p->has_fan);
    rk_rng_derive(&g->ep.r, seed, (uint64_t)i, TAG_EPISODE);
    g->ep.t1 = 0;
    ep_next(&g->ep, p);
    g->ep_th = g->ep;
}

/* What each profile's card is and what rk tune could set on it, as NVML would say
 * (docs/tune.md, "Which cards can"): Pascal and Kepler lock no clocks. */
static const struct {
    const char *id;
    rk_gpu_arch arch;
    bool geforce;
    unsigned tune;
} routes[] = {
    {"1070ti-mining", RK_ARCH_PASCAL, true, RK_TUNE_KNOWN | RK_TUNE_POWER_LIMIT},
    {"1080ti-gaming", RK_ARCH_PASCAL, true, RK_TUNE_KNOWN | RK_TUNE_POWER_LIMIT},
    {"p100-hpc", RK_ARCH_PASCAL, false, RK_TUNE_KNOWN | RK_TUNE_POWER_LIMIT},
    {"3090-mining", RK_ARCH_AMPERE, true,
     RK_TUNE_KNOWN | RK_TUNE_LOCK_CLOCKS | RK_TUNE_POWER_LIMIT | RK_TUNE_CLOCK_OFFSET},
    {"k20x-titan", RK_ARCH_KEPLER, false, RK_TUNE_KNOWN | RK_TUNE_POWER_LIMIT},
};

static void gpu_routes_fill(rk_gpu_info *in, const char *id)
{
    for (size_t k = 0; k < sizeof routes / sizeof routes[0]; k++)
        if (strcmp(routes[k].id, id) == 0) {
            in->arch = routes[k].arch;
            in->geforce = routes[k].geforce;
            in->tune = routes[k].tune;
        }
}

static void gpu_info_fill(sim_gpu *g, uint64_t seed)
{
    rk_gpu_info *in = &g->info;
    in->index = g->index;
    snprintf(in->name, sizeof in->name, "%s", g->p->name);
    snprintf(in->uuid, sizeof in->uuid, "SIM-%" PRIu64 "-%d", seed, g->index);
    if (g->p->has_serial) {
        rk_rng r;
        rk_rng_derive(&r, seed, (uint64_t)g->index, TAG_SERIAL);
        snprintf(in->serial, sizeof in->serial, "032%010" PRIu64, rk_rng_below(&r, 10000000000ull));
    }
    snprintf(in->bus_id, sizeof in->bus_id, "%08X:%02X:00.0", (unsigned)(g->index / 256),
             (unsigned)(g->index % 256));
    snprintf(in->profile, sizeof in->profile, "%s", g->p->id);
    in->simulated = true;
    in->backend = "sim";
    gpu_routes_fill(in, g->p->id);
}

/* ---- the event log ------------------------------------------------------------------------ */

/* One JSON line of ground truth; details are this file's own ASCII text. */
static int log_event(sim *s, const sim_gpu *g, double t, const char *event, const char *detail,
                     rk_err *err)
{
    if (!s || !s->events)
        return RK_OK;
    if (fprintf(s->events,
                "{\"t\":%.3f,\"gpu\":%d,\"uuid\":\"%s\",\"event\":\"%s\",\"detail\":\"%s\"}\n", t,
                g->index, g->info.uuid, event, detail) < 0 ||
        fflush(s->events) != 0)
        return rk_err_set(err, RK_EIO, "sim: writing the event log %.200s: %s", s->events_path,
                          strerror(errno));
    return RK_OK;
}

/* ---- timed events: SDC episodes, the terminal failure, DBEs after it ----------------------- */

/* Episodes of wrong arithmetic per second in slot `sl`: zero when idle or below the ripple
 * threshold. A function of the slot alone, so the schedule does not depend on when reads
 * happen. */
static double sdc_hazard(uint64_t seed, const sim_gpu *g, int64_t sl)
{
    double rip = ripple_mv(g, age_at(g, (double)sl * SLOT_S));
    if (rip <= SDC_RIPPLE_MV || slot_util(seed, g, sl) < 50)
        return 0;
    double x = (rip - SDC_RIPPLE_MV) / 20.0;
    return fmin(SDC_RATE_MAX_H, SDC_RATE_H * x * x) / 3600.0;
}

static int handle_failure(sim *s, sim_gpu *g, double t, rk_err *err)
{
    char d[160];
    int rc = RK_OK;
    g->failed = true;
    if (g->fail_kind == FAIL_OTB) {
        g->lost = true;
        snprintf(d, sizeof d, "fell off the bus (Xid 79) after %.0f h of service", age_at(g, t));
        return log_event(s, g, t, "off_bus", d, err);
    }
    if (g->p->has_ecc) {
        g->ue++;
        if (g->retired < RETIRE_MAX)
            g->retired++;
        g->pending = 1;
        g->xid_count++;
        g->last_xid = XID_DBE;
        g->next_dbe_t = t + DBE_FOLLOW_H * 3600.0 * -log(u01(&g->ev_rng));
        snprintf(d, sizeof d, "double-bit ECC error (Xid 48), page retired, after %.0f h",
                 age_at(g, t));
        return log_event(s, g, t, "dbe", d, err);
    }
    if (g->p->row_wear && g->remapped < REMAP_MAX)
        g->remapped++;
    snprintf(d, sizeof d, "uncorrectable memory error after %.0f h; no ECC reports it",
             age_at(g, t));
    rc = log_event(s, g, t, "dbe", d, err);
    if (!g->sdc_on && !rc)
        rc = log_event(s, g, t, "sdc_start", "failed memory (no ECC): permanent", err);
    g->sdc_on = g->sdc_perm = true;
    return rc;
}

/* Add the expected counts of g's precursor and episode over [a, b] (both constant in kind
 * there: the event loop stops at every start and end) to its accumulators. */
static void accumulate(sim_gpu *g, double a, double b)
{
    if (!(b > a))
        return;
    const precursor *p = &g->pre_fail;
    double lm = pre_integral(p, a, b) / 60.0; /* level x minutes */
    if (lm > 0) {
        if (p->kind == PRE_OTB) {
            g->acc_replay += PRE_REPLAY_MIN * lm;
            g->acc_xid += PRE_XID_MIN * lm;
        } else if (p->kind == PRE_DBE_ECC) {
            g->acc_ce_pre += PRE_CE_MIN * lm;
        } else if (p->kind == PRE_DBE_MEM && g->p->row_wear) {
            g->acc_remap += PRE_REMAP_MIN * lm;
        }
    }
    const episode *e = &g->ep;
    double lo = fmax(a, e->t0), hi = fmin(b, e->t1);
    if (hi > lo && e->kind == EP_RISER) {
        double tau = e->b * 60.0;
        g->acc_replay += e->a / 60.0 * tau * (exp(-(lo - e->t0) / tau) - exp(-(hi - e->t0) / tau));
    } else if (hi > lo && e->kind == EP_ECC) {
        g->acc_ce += e->a * (hi - lo) / 60.0;
    }
}

static const char *const pre_what[] = {
    "PCIe replays climbing, then link downtraining and Xid 32",
    "corrected ECC errors climbing, pages retired (Xid 63)",
    "board power and VRM ripple climbing (no ECC to report the memory)",
    "fan bearing grinding: vibration and speed wobble climbing, airflow falling"};

static int log_precursor(sim *s, sim_gpu *g, precursor *p, double t, rk_err *err)
{
    static const char *const what_fails[] = {"off_bus", "dbe", "dbe", "fan seizure"};
    char d[200];
    snprintf(d, sizeof d, "%s: %.0f min before the %s (strength %.2f)", pre_what[p->kind], p->lead,
             what_fails[p->kind], p->amp);
    p->logged = true;
    return log_event(s, g, t, "precursor", d, err);
}

static int log_episode(sim *s, sim_gpu *g, double t, bool start, rk_err *err)
{
    const episode *e = &g->ep;
    char d[200];
    if (!start) {
        snprintf(d, sizeof d, "%s over", ep_names[e->kind]);
        return log_event(s, g, t, "episode_end", d, err);
    }
    switch (e->kind) {
    case EP_RISER:
        snprintf(d, sizeof d,
                 "riser bumped: %.0f PCIe replays a minute dying away over %.0f min%s%s", e->a,
                 e->b, e->c > 0 ? ", link at half width" : "", e->xid ? ", Xid 32" : "");
        break;
    case EP_ECC: snprintf(d, sizeof d, "ecc_burst: %.1f corrected errors a minute", e->a); break;
    case EP_POWER:
        snprintf(d, sizeof d, "power: supply sag, power +%.0f%%, ripple +%.0f mV", 100 * e->a,
                 e->b);
        break;
    case EP_RATTLE:
        snprintf(d, sizeof d, "fan_rattle: vibration +%.0f Hz, wobble +%.0f points", e->a, e->b);
        break;
    default: snprintf(d, sizeof d, "hot_spell: ambient +%.1f C", e->a); break;
    }
    return log_event(s, g, t, "episode_start", d, err);
}

/* Advance the timed events of g to t_to (at most the failure time for an OTB), logging each
 * when s is not NULL. */
static int events_advance(sim *s, uint64_t seed, sim_gpu *g, double t_to, rk_err *err)
{
    enum { E_FAIL, E_DBE, E_SDC_END, E_SDC_START, E_PRE_FAIL, E_PRE_FAN, E_EPISODE };
    int rc = RK_OK;
    while (g->ev_t < t_to && !g->lost && !rc) {
        bool may = !g->sdc_on && ripple_mv(g, age_at(g, t_to)) > SDC_RIPPLE_MV;
        int64_t sl = slot_of(g->ev_t);
        double seg_end = t_to, h = 0;
        if (may) {
            seg_end = fmin(t_to, (double)(sl + 1) * SLOT_S);
            h = sdc_hazard(seed, g, sl);
        }
        double cand[7];
        cand[E_FAIL] = g->failed ? INFINITY : g->fail_t;
        cand[E_DBE] = g->next_dbe_t;
        cand[E_SDC_END] = g->sdc_on && !g->sdc_perm ? g->sdc_end_t : INFINITY;
        cand[E_SDC_START] = h > 0 ? g->ev_t + g->sdc_budget / h : INFINITY;
        cand[E_PRE_FAIL] = g->pre_fail.on && !g->pre_fail.logged ? g->pre_fail.t0 : INFINITY;
        cand[E_PRE_FAN] = g->pre_fan.on && !g->pre_fan.logged ? g->pre_fan.t0 : INFINITY;
        cand[E_EPISODE] = g->ep.started ? g->ep.t1 : g->ep.t0;
        int kind = 0;
        for (int k = 1; k < 7; k++)
            if (cand[k] < cand[kind])
                kind = k;
        double t_next = cand[kind];
        if (t_next > seg_end) {
            g->sdc_budget -= h * (seg_end - g->ev_t);
            accumulate(g, g->ev_t, seg_end);
            g->ev_t = seg_end;
            continue;
        }
        if (t_next < g->ev_t)
            t_next = g->ev_t; /* rounding: never log before the last event */
        g->sdc_budget -= h * (t_next - g->ev_t);
        accumulate(g, g->ev_t, t_next);
        g->ev_t = t_next;
        char d[160];
        switch (kind) {
        case E_FAIL: rc = handle_failure(s, g, t_next, err); break;
        case E_DBE:
            g->ue++;
            if (g->retired < RETIRE_MAX)
                g->retired++;
            g->pending = 1;
            g->xid_count++;
            g->last_xid = XID_DBE;
            g->next_dbe_t = t_next + DBE_FOLLOW_H * 3600.0 * -log(u01(&g->ev_rng));
            rc = log_event(s, g, t_next, "dbe", "double-bit ECC error (Xid 48): failing memory",
                           err);
            break;
        case E_SDC_END:
            g->sdc_on = false;
            g->sdc_budget = -log(u01(&g->ev_rng));
            rc = log_event(s, g, t_next, "sdc_end", "VRM episode over", err);
            break;
        case E_SDC_START:
            g->sdc_on = true;
            g->sdc_end_t = t_next + 10.0 + SDC_MEAN_S * -log(u01(&g->ev_rng));
            snprintf(d, sizeof d, "wrong arithmetic: VRM ripple %.1f mV under load",
                     ripple_mv(g, age_at(g, t_next)));
            rc = log_event(s, g, t_next, "sdc_start", d, err);
            break;
        case E_PRE_FAIL: rc = log_precursor(s, g, &g->pre_fail, t_next, err); break;
        case E_PRE_FAN: rc = log_precursor(s, g, &g->pre_fan, t_next, err); break;
        default:
            if (!g->ep.started) {
                g->ep.started = true;
                g->xid_due += g->ep.xid;
                rc = log_episode(s, g, t_next, true, err);
            } else {
                rc = log_episode(s, g, t_next, false, err);
                ep_next(&g->ep, g->p);
            }
            break;
        }
    }
    return rc;
}

/* ---- thermal model ------------------------------------------------------------------------ */

/* Power-limit factor the firmware applies at die temperature td (1 = full clocks). */
static double throttle(const profile *p, double td)
{
    double f = fmin(1.0, fmax(0.5, 1.0 - 0.06 * (td - p->t_target_c)));
    return td >= p->t_slowdown_c ? fmin(f, 0.3) : f;
}

static double fan_command(const sim_gpu *g, double td)
{
    if (!g->p->has_fan)
        return 0;
    return fmin(100.0, fmax(FAN_MIN_PCT, FAN_MIN_PCT + (td - 40.0) * (100 - FAN_MIN_PCT) / 45.0));
}

/* Heat sink conductance to air (W/K) at fan command cmd (%). A seized bearing stops the fan;
 * a worn one turns slower than commanded. */
static double sink_conductance(const sim_gpu *g, double age_h, double cmd, double air)
{
    double w = fan_wear(g, age_h);
    if (!g->p->has_fan || w >= 1.0)
        return g->p->g_passive_wk;
    double f = cmd / 100.0 * (1.0 - 0.2 * w * w);
    return g->p->g_passive_wk + g->p->g_fan_wk * air * pow(f, 0.8);
}

static double power_demand(const profile *p, double util)
{
    return p->idle_w + (p->tdp_w - p->idle_w) * util / 100.0;
}

/* What warning signs and episodes do to the heat at t: a power gain at the same load, a
 * warmer room, a fan that moves less air. Asked at increasing t (the thermal cursor). */
typedef struct heat_fx {
    double pw_gain, amb, air;
} heat_fx;

static heat_fx heat_fx_at(sim_gpu *g, double t)
{
    const episode *e = ep_at(&g->ep_th, g->p, t);
    heat_fx f = {1.0, 0.0, 1.0};
    if (g->pre_fail.kind == PRE_DBE_MEM)
        f.pw_gain += PRE_POWER * pre_level(&g->pre_fail, t);
    if (ep_on(e, t, EP_POWER))
        f.pw_gain += e->a;
    if (ep_on(e, t, EP_HOT))
        f.amb = e->a;
    f.air = 1.0 - PRE_AIRFLOW * fmin(1.0, pre_level(&g->pre_fan, t));
    return f;
}

/* What a thermal run holds fixed: wear moves by minutes within a run, which is nothing; the
 * effects of warning signs and episodes are refreshed every simulated minute. */
typedef struct thermal_ctx {
    double age_h, rp, die_decay, dt;
    heat_fx fx;
} thermal_ctx;

static thermal_ctx thermal_ctx_at(const sim_gpu *g, double age_h, double dt)
{
    thermal_ctx c = {age_h, r_paste(g, age_h), 0, dt, {1.0, 0.0, 1.0}};
    c.die_decay = exp(-dt / (g->p->c_die_jk * c.rp));
    return c;
}

/* One step of c->dt seconds at load util: exact exponential updates of each node against the
 * other's current temperature (stable for any dt). */
static void thermal_step(sim_gpu *g, const thermal_ctx *c, double util)
{
    const profile *p = g->p;
    double rp = c->rp, dt = c->dt;
    double pw =
        (p->idle_w + (power_demand(p, util) - p->idle_w) * throttle(p, g->td)) * c->fx.pw_gain;
    double cmd = fan_command(g, g->td);
    double gs = sink_conductance(g, c->age_h, cmd, c->fx.air);
    double td_eq = g->ts + pw * rp;
    g->td = td_eq + (g->td - td_eq) * c->die_decay;
    double gd = 1.0 / rp;
    double ts_eq = (g->td * gd + (g->ambient_c + c->fx.amb) * gs) / (gd + gs);
    g->ts = ts_eq + (g->ts - ts_eq) * exp(-dt * (gd + gs) / p->c_sink_jk);
    g->power_w = pw;
    g->fan_cmd = cmd;
    g->util = util;
    g->energy_j += pw * dt;
}

/* Steady state at load util (fixed point of the network with fan curve and throttling). */
static void thermal_settle(sim_gpu *g, double age_h, double util, heat_fx fx)
{
    g->td = g->ts = g->ambient_c + 20.0;
    for (int it = 0; it < 60; it++) {
        const profile *p = g->p;
        double rp = r_paste(g, age_h);
        double pw =
            (p->idle_w + (power_demand(p, util) - p->idle_w) * throttle(p, g->td)) * fx.pw_gain;
        double gs = sink_conductance(g, age_h, fan_command(g, g->td), fx.air);
        double ts = g->ambient_c + fx.amb + pw / gs, td = ts + pw * rp;
        g->ts = 0.5 * (g->ts + ts);
        g->td = 0.5 * (g->td + td);
        g->power_w = pw;
    }
    g->fan_cmd = fan_command(g, g->td);
    g->util = util;
}

/* Integrate from `from` to `to`; the time the die reached the shutdown temperature, or
 * INFINITY. When `settle`, start from the steady state of the load at `from` (of the GPU
 * as it was `settle_back_s` seconds before). */
static double thermal_run(uint64_t seed, sim_gpu *g, double from, double to, bool settle,
                          double settle_back_s)
{
    if (settle || !g->thermal_init) {
        thermal_settle(g, age_at(g, from - settle_back_s), slot_util(seed, g, slot_of(from)),
                       heat_fx_at(g, from - settle_back_s));
        g->thermal_init = true;
    }
    if (!(to > from))
        return INFINITY;
    double n = ceil((to - from) / STEP_S), dt = (to - from) / n, util = 0;
    thermal_ctx c = thermal_ctx_at(g, age_at(g, from), dt);
    double seize = g->p->has_fan ? (g->fan_life_h - g->age0_h) * 3600.0 : INFINITY;
    int64_t sl = INT64_MIN;
    double fx_next = from;
    for (double k = 0; k < n; k++) {
        double t = from + k * dt;
        if (t >= seize && c.age_h < g->fan_life_h) {
            c = thermal_ctx_at(g, age_at(g, t), dt); /* the fan stops within this run */
            fx_next = t;
        }
        if (t >= fx_next) {
            c.fx = heat_fx_at(g, t);
            fx_next = t + 60.0;
        }
        if (slot_of(t) != sl) {
            sl = slot_of(t);
            util = slot_util(seed, g, sl);
        }
        thermal_step(g, &c, util);
        if (g->td >= g->p->t_shutdown_c)
            return t + dt;
    }
    return INFINITY;
}

/* ---- advancing a GPU ---------------------------------------------------------------------- */

/* Bring g from g->t to t: thermal history (the last WINDOW_S of a longer gap, and the hours
 * after the fan seized), timed events, counters. Logs through s when s is not NULL. */
static int gpu_advance(sim *s, uint64_t seed, sim_gpu *g, double t, rk_err *err)
{
    if (!g->thermal_init) {
        thermal_settle(g, age_at(g, g->t), slot_util(seed, g, slot_of(g->t)), heat_fx_at(g, g->t));
        g->thermal_init = true;
    }
    if (t <= g->t)
        return RK_OK;
    if (g->lost) {
        g->t = t;
        return RK_OK;
    }
    double from = g->t;
    double stop = t;
    if (!g->failed && g->fail_kind == FAIL_OTB && g->fail_t < stop)
        stop = fmax(from, g->fail_t);

    /* thermal: a gap longer than the window is skipped at mean power, except that the hours
     * after a fan seizes are always simulated (that is when a card overheats) */
    double t_sd = INFINITY, skipped = 0;
    double ws = fmax(from, stop - WINDOW_S);
    if (g->p->has_fan) {
        double seize = (g->fan_life_h - g->age0_h) * 3600.0;
        if (seize > from && seize < ws) {
            double e = fmin(seize + 4 * WINDOW_S, ws);
            skipped += seize - from;
            t_sd = thermal_run(seed, g, seize, e, true, 1.0); /* fan still turning */
            from = e;
        }
    }
    if (t_sd == INFINITY) {
        skipped += ws - from;
        t_sd = thermal_run(seed, g, ws, stop, ws > from, 0);
    }
    g->energy_j += skipped * (g->p->idle_w + g->busy_p * 0.95 * (g->p->tdp_w - g->p->idle_w));
    if (t_sd < stop)
        stop = t_sd;

    int rc = events_advance(s, seed, g, stop, err);
    if (!rc && !g->lost && t_sd <= t) {
        char d[160];
        const char *fan = "none";
        if (g->p->has_fan)
            fan = fan_wear(g, age_at(g, stop)) >= 1 ? "seized" : "worn";
        snprintf(d, sizeof d, "core %.1f C reached shutdown %.0f C (fan %s, paste x%.2f)", g->td,
                 g->p->t_shutdown_c, fan, r_paste(g, age_at(g, stop)) / g->p->r_paste_kw);
        g->lost = true;
        rc = log_event(s, g, stop, "thermal_shutdown", d, err);
    }

    /* counters over [g->t, stop]: wear, plus what precursors and episodes added (every
     * retirement after open is an Xid 63, as the driver reports it) */
    double a0 = age_at(g, g->t), a1 = age_at(g, stop);
    if (g->p->has_ecc) {
        uint64_t n = poisson(&g->noise, exp_rate_integral(g->mem_rate0_h, g->p->tau_mem_h, a0, a1) +
                                            g->acc_ce);
        uint64_t ret = poisson(&g->noise, (double)n * RETIRE_P);
        uint64_t n_pre = poisson(&g->noise, g->acc_ce_pre);
        ret += poisson(&g->noise, (double)n_pre * PRE_RETIRE_P);
        g->ce += n + n_pre;
        if (ret) {
            uint64_t room = RETIRE_MAX - g->retired, add = ret < room ? ret : room;
            g->retired += add;
            g->pending = 1;
            if (add) {
                g->xid_count += add;
                g->last_xid = XID_RETIRE;
            }
        }
    }
    if (g->p->row_wear) {
        g->remapped += poisson(
            &g->noise, exp_rate_integral(g->mem_rate0_h, g->p->tau_mem_h, a0, a1) + g->acc_remap);
        if (g->remapped > REMAP_MAX)
            g->remapped = REMAP_MAX;
    }
    uint64_t xids = poisson(&g->noise, g->acc_xid) + g->xid_due;
    if (xids) {
        g->xid_count += xids;
        g->last_xid = XID_BUS;
    }
    double a_open = g->age0_h, per_h = 60.0 * g->busy_p;
    double replays =
        g->riser ? exp_rate_integral(g->replay0_min * per_h, RISER_TAU_H, a0 - a_open, a1 - a_open)
                 : g->replay0_min * per_h * (a1 - a0);
    replays += g->acc_replay;
    g->acc_replay = g->acc_ce = g->acc_ce_pre = g->acc_xid = g->acc_remap = 0;
    g->xid_due = 0;
    g->replay += poisson(&g->noise, replays);
    g->t = t;
    return rc;
}

static double round_to(double x, double q)
{
    return floor(x / q + 0.5) * q;
}

static void sample_fill(sim_gpu *g, rk_gpu_sample *o)
{
    const profile *p = g->p;
    memset(o, 0, sizeof *o);
    o->t = g->t;
    if (g->lost) {
        o->lost = true;
        return;
    }
    double age = age_at(g, g->t);
    bool busy = g->util >= 50;
    double th = throttle(p, g->td);
    rk_rng *r = &g->noise;

    o->temp_c = round_to(g->td + 0.3 * normal(r), 1);
    rk_field_set(o, RK_F_TEMP);
    o->power_w = round_to(fmax(0, g->power_w * (1 + 0.01 * normal(r))), 0.001);
    rk_field_set(o, RK_F_POWER);
    o->power_limit_w = p->tdp_w;
    rk_field_set(o, RK_F_POWER_LIMIT);
    o->sm_mhz =
        busy ? round_to(p->sm_mhz * sqrt(th) * (g->util > 98 ? 0.97 : 1.0), 1) : p->sm_idle_mhz;
    rk_field_set(o, RK_F_SM_CLOCK);
    o->mem_mhz = busy ? p->mem_mhz : p->mem_idle_mhz;
    rk_field_set(o, RK_F_MEM_CLOCK);
    uint64_t why = 0;
    if (!busy)
        why |= RK_CLOCK_GPU_IDLE;
    if (busy && g->util > 98 && th >= 1.0)
        why |= RK_CLOCK_SW_POWER_CAP;
    if (g->td > p->t_target_c)
        why |= RK_CLOCK_SW_THERMAL;
    if (g->td >= p->t_slowdown_c)
        why |= RK_CLOCK_HW_SLOWDOWN | RK_CLOCK_HW_THERMAL;
    o->clock_reasons = why;
    rk_field_set(o, RK_F_CLOCK_REASONS);
    o->util_pct = round_to(fmin(100, fmax(0, g->util + 0.5 * normal(r))), 1);
    rk_field_set(o, RK_F_UTIL);
    o->mem_total_bytes = p->mem_total;
    o->mem_used_bytes = (uint64_t)((double)p->mem_total * (busy ? 0.82 : 0.02));
    rk_field_set(o, RK_F_MEM_TOTAL);
    rk_field_set(o, RK_F_MEM_USED);
    /* what warning signs and an episode on now add to the readings (docs/sim.md) */
    const episode *e = &g->ep;
    double s_fan = pre_level(&g->pre_fan, g->t), s_fail = pre_level(&g->pre_fail, g->t);
    bool rattle = ep_on(e, g->t, EP_RATTLE);
    if (p->has_fan) {
        double w = fan_wear(g, age);
        double amp =
            w >= 1 ? 0 : 12.0 * w * w + PRE_WOBBLE_PCT * fmin(1.0, s_fan) + (rattle ? e->b : 0);
        double wob = amp * sin(6.283185307179586 * g->t / g->wobble_s) + amp / 3 * normal(r);
        o->fan_pct = round_to(fmin(100, fmax(0, g->fan_cmd + wob)), 1);
        rk_field_set(o, RK_F_FAN);
        if (g->sensors && w < 1) { /* a stopped fan has no vibration to measure */
            double hz = vib_hz(g, age) + PRE_VIB_HZ * s_fan + (rattle ? e->a : 0);
            o->fan_vib_hz = floor(hz * 10) / 10;
            rk_field_set(o, RK_F_FAN_VIB);
        }
    }
    if (p->has_ecc) {
        o->ecc_corrected = g->ce;
        o->ecc_uncorrected = g->ue;
        o->retired_pages = g->retired;
        o->retired_pending = g->pending;
        rk_field_set(o, RK_F_ECC_CORRECTED);
        rk_field_set(o, RK_F_ECC_UNCORRECTED);
        rk_field_set(o, RK_F_RETIRED);
        rk_field_set(o, RK_F_RETIRED_PENDING);
    }
    if (p->reports_remap) {
        o->remapped_rows = g->remapped;
        rk_field_set(o, RK_F_REMAPPED);
    }
    o->pcie_gen = busy ? g->gen : 1; /* idle links drop to Gen1 to save power */
    o->pcie_width = g->width;
    if ((g->pre_fail.kind == PRE_OTB && s_fail > PRE_DOWNTRAIN) ||
        (ep_on(e, g->t, EP_RISER) && g->t < e->t0 + e->c * 60.0))
        o->pcie_width = g->width > 1 ? g->width / 2 : 1; /* the link retrains narrower */
    o->pcie_gen_max = p->gen_max;
    o->pcie_width_max = p->width_max;
    o->pcie_replay = g->replay;
    rk_field_set(o, RK_F_PCIE_GEN);
    rk_field_set(o, RK_F_PCIE_WIDTH);
    rk_field_set(o, RK_F_PCIE_GEN_MAX);
    rk_field_set(o, RK_F_PCIE_WIDTH_MAX);
    rk_field_set(o, RK_F_PCIE_REPLAY);
    o->energy_j = round_to(g->energy_j, 0.001);
    rk_field_set(o, RK_F_ENERGY);
    o->xid_count = g->xid_count;
    o->last_xid = g->last_xid;
    rk_field_set(o, RK_F_XID);
    double mv = ripple_mv(g, age) + (ep_on(e, g->t, EP_POWER) ? e->b : 0);
    if (g->pre_fail.kind == PRE_DBE_MEM)
        mv += PRE_RIPPLE_MV * s_fail;
    if (g->sensors) {
        o->vrm_ripple_mv = floor(mv * 10) / 10;
        rk_field_set(o, RK_F_VRM_RIPPLE);
    }
}

/* ---- clock -------------------------------------------------------------------------------- */

double rk_sim_now(rk_sim *s)
{
    if (s->is_pinned)
        return s->pinned;
    if (!s->clock_started)
        return s->t_max; /* nothing read yet: time has not begun */
    double t = (rk_mono_s() - s->t0_mono) * s->time_scale;
    return t > s->t_max ? t : s->t_max;
}

int rk_sim_set_time(rk_sim *s, double t_s)
{
    if (!isfinite(t_s) || t_s < s->t_max || (s->is_pinned && t_s < s->pinned))
        return RK_EINVAL;
    s->pinned = t_s;
    s->is_pinned = true;
    return RK_OK;
}

/* ---- the backend table -------------------------------------------------------------------- */

static void sim_close(void *state);

static int sim_open(void **state, const rk_telemetry_opts *o, rk_err *err)
{
    *state = NULL;
    if (o->sim_gpus < 1 || o->sim_gpus > 1024)
        return rk_err_set(err, RK_EINVAL, "sim: %d GPUs (1..1024)", o->sim_gpus);
    if (!(o->time_scale > 0) || !isfinite(o->time_scale))
        return rk_err_set(err, RK_EINVAL, "sim: time scale %g (> 0)", o->time_scale);
    if (!(o->start_age_h >= 0) || !isfinite(o->start_age_h))
        return rk_err_set(err, RK_EINVAL, "sim: start age %g h (>= 0)", o->start_age_h);
    if (o->sim_load != RK_SIM_LOAD_IDLE && o->sim_load != RK_SIM_LOAD_BUSY)
        return rk_err_set(err, RK_EINVAL, "sim: load %d (RK_SIM_LOAD_IDLE or RK_SIM_LOAD_BUSY)",
                          (int)o->sim_load);
    sim *s = calloc(1, sizeof *s);
    if (!s || !(s->g = calloc((size_t)o->sim_gpus, sizeof *s->g))) {
        free(s);
        return rk_err_set(err, RK_ENOMEM, "sim: out of memory for %d GPUs", o->sim_gpus);
    }
    s->seed = o->seed;
    s->time_scale = o->time_scale;
    s->n = o->sim_gpus;
    if (o->events_path) {
        s->events_path = strdup(o->events_path);
        if (!s->events_path) {
            sim_close(s);
            return rk_err_set(err, RK_ENOMEM, "sim: out of memory");
        }
        s->events = fopen(o->events_path, "ae");
        if (!s->events) {
            int e = errno;
            char eb[128];
            rk_err_set_line(err, RK_EIO, "sim: cannot open the event log %.200s: %s",
                            o->events_path, rk_msg_strerror(e, eb, sizeof eb));
            sim_close(s);
            return RK_EIO;
        }
    }
    for (int i = 0; i < s->n; i++) {
        gpu_draw(&s->g[i], s->seed, i, profile_drawn(s->seed, i), o->start_age_h);
        s->g[i].busy_p = o->sim_load == RK_SIM_LOAD_BUSY ? BUSY_P : 0.0;
        s->g[i].sensors = o->sim_sensors;
        gpu_info_fill(&s->g[i], s->seed);
    }
    *state = s;
    return RK_OK;
}

static int sim_count(void *state)
{
    return ((sim *)state)->n;
}

static int sim_info(void *state, int i, rk_gpu_info *out)
{
    sim *s = state;
    if (i < 0 || i >= s->n)
        return RK_EINVAL;
    *out = s->g[i].info;
    return RK_OK;
}

static int sim_read(void *state, int i, rk_gpu_sample *out, rk_err *err)
{
    sim *s = state;
    memset(out, 0, sizeof *out);
    if (i < 0 || i >= s->n)
        return rk_err_set(err, RK_EINVAL, "sim: GPU %d out of range (0..%d)", i, s->n - 1);
    if (!s->clock_started) { /* the first reading is at exactly the start age, however long
                              * the caller took between open and read (at 480,000x, 10 ms of
                              * a loaded machine were 80 simulated minutes) */
        s->t0_mono = rk_mono_s();
        s->clock_started = true;
    }
    double t = rk_sim_now(s);
    if (t > s->t_max)
        s->t_max = t;
    s->g[i].read = true;
    int rc = gpu_advance(s, s->seed, &s->g[i], t, err);
    if (rc)
        return rc; /* the event log failed: the sample stays empty */
    sample_fill(&s->g[i], out);
    return RK_OK;
}

/* Bring every GPU that was read to the last time any was read, so the event log is complete
 * up to it for every GPU anyone asked about (one never read logs nothing). */
static void sim_close(void *state)
{
    sim *s = state;
    if (!s)
        return;
    if (s->events && s->g)
        for (int i = 0; i < s->n; i++)
            if (s->g[i].read && gpu_advance(s, s->seed, &s->g[i], s->t_max, NULL))
                break;
    if (s->events)
        fclose(s->events);
    free(s->events_path);
    free(s->g);
    free(s);
}

static double sim_now(void *state)
{
    return rk_sim_now(state);
}

const rk_telemetry_ops rk_telemetry_sim = {"sim",    sim_open,  sim_count, sim_info,
                                           sim_read, sim_close, sim_now};

/* The typed entry points (health/sim.h) over the same functions. */
int rk_sim_open(rk_sim **out, const rk_telemetry_opts *o, rk_err *err)
{
    void *st = NULL;
    int rc = sim_open(&st, o, err);
    *out = st;
    return rc;
}

int rk_sim_count(const rk_sim *s)
{
    return s->n;
}

int rk_sim_info(rk_sim *s, int i, rk_gpu_info *out)
{
    return sim_info(s, i, out);
}

int rk_sim_read(rk_sim *s, int i, rk_gpu_sample *out, rk_err *err)
{
    return sim_read(s, i, out, err);
}

void rk_sim_close(rk_sim *s)
{
    sim_close(s);
}

/* ---- ground truth ------------------------------------------------------------------------- */

int rk_sim_sdc_active(rk_sim *s, int i)
{
    if (i < 0 || i >= s->n)
        return RK_EINVAL;
    sim_gpu g = s->g[i]; /* a copy: asking never changes what reads return */
    gpu_advance(NULL, s->seed, &g, rk_sim_now(s), NULL);
    return g.sdc_on && !g.lost;
}

double rk_sim_lifetime_hours(uint64_t seed, int gpu, const char *profile_id, double start_age_h,
                             const char **event)
{
    const profile *p = profile_id ? profile_named(profile_id) : profile_drawn(seed, gpu);
    if (!p || gpu < 0 || !(start_age_h >= 0))
        return NAN;
    sim_gpu g;
    gpu_draw(&g, seed, gpu, p, start_age_h);
    if (event)
        *event = g.fail_kind == FAIL_OTB ? "off_bus" : "dbe";
    return g.fail_t / 3600.0;
}

double rk_sim_precursor_minutes(uint64_t seed, int gpu, const char *profile_id, double start_age_h)
{
    const profile *p = profile_id ? profile_named(profile_id) : profile_drawn(seed, gpu);
    if (!p || gpu < 0 || !(start_age_h >= 0))
        return NAN;
    sim_gpu g;
    gpu_draw(&g, seed, gpu, p, start_age_h);
    return g.pre_fail.on ? g.pre_fail.lead : 0.0;
}

int rk_sim_profile_count(void)
{
    return NPROFILES;
}

const char *rk_sim_profile_name(int k)
{
    return k >= 0 && k < NPROFILES ? profiles[k].id : NULL;
}
