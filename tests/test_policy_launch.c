/*
 * Tests for the supervisor's decisions about devices and during a launch
 * (src/supervisor/policy.h), each a table of cases: the quarantine, the shrink onto the
 * devices left, the relaunch, the health gate's timing, the drain, a hang's suspects, the
 * teardown of a failing launch and an interruption's grace. And the errno classes a storage
 * error rests on (rk_err_code_errno: RK_ESTORAGE, which rk train turns into exit status 6).
 * And the launch's choices (env.c, launch.c): a launcher's variables mapped to RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE for Open MPI, MPICH and Slurm; `auto` picking
 * mpirun for an ELF that needs libmpi.so or librekindle.so and local for anything else
 * (scripts, other ELFs, broken or cut files); the ranks' environment (rk_rank_env_build). A
 * launch's end is in tests/test_policy.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <elf.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/msg.h"
#include "rekindle/heartbeat.h"
#include "supervisor/policy.h"
#include "supervisor/supervisor.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- devices ------------------------------------------------------------------------------- */

/* Failures counted one by one: the one that reaches the threshold quarantines, once. */
static void test_quarantine(void **state)
{
    (void)state;
    static const struct {
        int threshold, failures;
        int quarantines_at; /* the failure (1-based) that quarantines; 0 none */
    } cases[] = {
        {2, 1, 0}, {2, 2, 2}, {2, 5, 2}, {1, 1, 1}, {1, 3, 1},
        {3, 2, 0}, {3, 4, 3}, {0, 2, 1}, /* a threshold of 0 sets aside at the first failure */
    };
    for (size_t k = 0; k < N_OF(cases); k++) {
        rk_sup_dev d = {0};
        for (int f = 1; f <= cases[k].failures; f++) {
            int would = rk_sup_would_quarantine(&d, cases[k].threshold);
            int q = rk_sup_count_failure(&d, cases[k].threshold);
            if (would != q) /* told before the failure is counted, as the count then says */
                fail_msg("case %zu: failure %d: would quarantine %d, quarantines %d", k, f, would,
                         q);
            if (q != (f == cases[k].quarantines_at))
                fail_msg("case %zu: failure %d quarantines %d", k, f, q);
        }
        assert_int_equal(d.fails, cases[k].failures);
        assert_int_equal(d.quarantined, cases[k].quarantines_at > 0);
    }
    static const struct {
        int failing, stop_sent, shrink;
    } shrink[] = {{0, 0, 1}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}};
    for (size_t k = 0; k < N_OF(shrink); k++)
        assert_int_equal(rk_sup_shrink_now(shrink[k].failing, shrink[k].stop_sent),
                         shrink[k].shrink);
}

#define OK_DEV                                                                                     \
    {                                                                                              \
        .score = 100, .prob = -1                                                                   \
    }
#define MAXD 6

typedef struct pick_case {
    const char *what;
    int ndev, want, predictor;
    rk_sup_health h[MAXD];
    rk_sup_dev st[MAXD];
    /* expected */
    int picked;
    int dev[MAXD];
    rk_sup_why why[MAXD];
    int held[MAXD];
} pick_case;

static const pick_case k_pick[] = {
    {"all sound: the first want",
     4,
     2,
     0,
     {OK_DEV, OK_DEV, OK_DEV, OK_DEV},
     {{0}},
     2,
     {0, 1},
     {RK_SUP_IN, RK_SUP_IN, RK_SUP_NOT_NEEDED, RK_SUP_NOT_NEEDED},
     {0}},
    {"a quarantined and a drained device are skipped for spares",
     4,
     2,
     0,
     {OK_DEV, OK_DEV, OK_DEV, OK_DEV},
     {{.quarantined = 1}, {.drained = 1}},
     2,
     {2, 3},
     {RK_SUP_OUT_QUARANTINED, RK_SUP_OUT_DRAINED, RK_SUP_IN, RK_SUP_IN},
     {0}},
    {"the shrink: fewer devices left than wanted",
     3,
     3,
     0,
     {OK_DEV, OK_DEV, OK_DEV},
     {{0}, {.quarantined = 1}},
     2,
     {0, 2},
     {RK_SUP_IN, RK_SUP_OUT_QUARANTINED, RK_SUP_IN},
     {0}},
    {"a lost GPU is out whatever its score, and held",
     3,
     2,
     0,
     {{.lost = 1, .score = 100, .prob = -1}, OK_DEV, OK_DEV},
     {{0}},
     2,
     {1, 2},
     {RK_SUP_OUT_LOST, RK_SUP_IN, RK_SUP_IN},
     {1, 0, 0}},
    {"below the threshold: out and held",
     3,
     2,
     0,
     {{.score = 49, .prob = -1}, OK_DEV, OK_DEV},
     {{0}},
     2,
     {1, 2},
     {RK_SUP_OUT_SCORE, RK_SUP_IN, RK_SUP_IN},
     {1, 0, 0}},
    {"at the threshold: in",
     2,
     2,
     0,
     {{.score = 50, .prob = -1}, OK_DEV},
     {{0}},
     2,
     {0, 1},
     {RK_SUP_IN, RK_SUP_IN},
     {0}},
    {"held before: back only with the margin",
     3,
     2,
     0,
     {{.score = 59, .prob = -1}, {.score = 60, .prob = -1}, OK_DEV},
     {{.held = 1}, {.held = 1}},
     2,
     {1, 2},
     {RK_SUP_OUT_SCORE, RK_SUP_IN, RK_SUP_IN},
     {1, 0, 0}},
    {"the predictor's probability leaves a device out",
     3,
     2,
     1,
     {{.score = 100, .prob = 0.9}, {.score = 100, .prob = 0.49}, OK_DEV},
     {{0}},
     2,
     {1, 2},
     {RK_SUP_OUT_PREDICTED, RK_SUP_IN, RK_SUP_IN},
     {1, 0, 0}},
    {"at the drain probability: out",
     2,
     1,
     1,
     {{.score = 100, .prob = 0.5}, OK_DEV},
     {{0}},
     1,
     {1},
     {RK_SUP_OUT_PREDICTED, RK_SUP_IN},
     {1, 0}},
    {"without a predictor the probability is not read",
     2,
     2,
     0,
     {{.score = 100, .prob = 0.9}, OK_DEV},
     {{0}},
     2,
     {0, 1},
     {RK_SUP_IN, RK_SUP_IN},
     {0}},
    {"a device not looked at keeps its held",
     3,
     1,
     0,
     {OK_DEV, OK_DEV, OK_DEV},
     {{0}, {0}, {.held = 1}},
     1,
     {0},
     {RK_SUP_IN, RK_SUP_NOT_NEEDED, RK_SUP_NOT_NEEDED},
     {0, 0, 1}},
    {"none left",
     2,
     2,
     0,
     {{.score = 10, .prob = -1}, {.lost = 1, .score = 0, .prob = -1}},
     {{0}},
     0,
     {0},
     {RK_SUP_OUT_SCORE, RK_SUP_OUT_LOST},
     {1, 1}},
};

static void test_pick_devices(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_OF(k_pick); k++) {
        const pick_case *c = &k_pick[k];
        rk_sup_rules r = {
            .threshold = 50, .margin = 10, .predictor = c->predictor, .drain_probability = 0.5};
        rk_sup_dev st[MAXD];
        memcpy(st, c->st, sizeof st);
        int dev[MAXD] = {0};
        rk_sup_pick pick[MAXD];
        int n = rk_sup_pick_devices(&r, c->ndev, c->h, st, c->want, NULL, 0, NULL, dev, pick);
        if (n != c->picked)
            fail_msg("case %zu (%s): picked %d, expected %d", k, c->what, n, c->picked);
        for (int i = 0; i < n; i++)
            if (dev[i] != c->dev[i])
                fail_msg("case %zu (%s): dev[%d] = %d, expected %d", k, c->what, i, dev[i],
                         c->dev[i]);
        for (int d = 0; d < c->ndev; d++)
            if (pick[d].why != c->why[d] || st[d].held != c->held[d])
                fail_msg("case %zu (%s): device %d why %d held %d, expected %d %d", k, c->what, d,
                         pick[d].why, st[d].held, c->why[d], c->held[d]);
    }
    /* the score a held device needed is said */
    rk_sup_rules r = {.threshold = 50, .margin = 10};
    rk_sup_health h[1] = {{.score = 55, .prob = -1}};
    rk_sup_dev st[1] = {{.held = 1}};
    int dev[1];
    rk_sup_pick pick[1];
    assert_int_equal(rk_sup_pick_devices(&r, 1, h, st, 1, NULL, 0, NULL, dev, pick), 0);
    assert_true(pick[0].need > 59.9 && pick[0].need < 60.1);
}

/* Placement is stable: a relaunch moves only the ranks whose devices went out. The 3-host
 * rig with a spare: h1 h2 h3 and the spare h4, two devices each. */
static void test_pick_stable(void **state)
{
    (void)state;
    rk_sup_rules r = {.threshold = 50, .margin = 10, .drain_probability = 0.5};
    enum { ND = 8 };
    const int group[ND] = {0, 0, 2, 2, 4, 4, 6, 6};
    rk_sup_health h[ND];
    for (int d = 0; d < ND; d++)
        h[d] = (rk_sup_health){.score = 100, .prob = -1};
    rk_sup_dev st[ND] = {{0}};
    rk_sup_pick pick[ND];
    int dev[ND], prev[ND];

    /* the first launch: the first six devices */
    int n = rk_sup_pick_devices(&r, ND, h, st, 6, NULL, 0, group, dev, pick);
    assert_int_equal(n, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(dev[i], i);
    assert_int_equal(pick[6].why, RK_SUP_NOT_NEEDED);

    /* h2 lost: its ranks 2 and 3 go to the spare h4; ranks 4 and 5 stay on h3 (in device
     * order they would have moved to h3 and h4: four ranks away from their snapshots) */
    memcpy(prev, dev, sizeof prev);
    h[2].lost = h[3].lost = 1;
    n = rk_sup_pick_devices(&r, ND, h, st, 6, prev, 6, group, dev, pick);
    assert_int_equal(n, 6);
    const int moved[6] = {0, 1, 6, 7, 4, 5};
    for (int i = 0; i < 6; i++)
        assert_int_equal(dev[i], moved[i]);
    assert_int_equal(pick[2].why, RK_SUP_OUT_LOST);
    assert_int_equal(st[2].held, 1);

    /* h2 back: nobody moves back onto it (its node holds none of their snapshots) */
    memcpy(prev, dev, sizeof prev);
    h[2].lost = h[3].lost = 0;
    n = rk_sup_pick_devices(&r, ND, h, st, 6, prev, 6, group, dev, pick);
    assert_int_equal(n, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(dev[i], moved[i]);
    assert_int_equal(pick[2].why, RK_SUP_NOT_NEEDED);

    /* h1's second device quarantined: rank 1 alone moves, to the first free device (h2's);
     * every node's ranks stay consecutive (h1 h2 h4 h4 h3 h3) */
    memcpy(prev, dev, sizeof prev);
    st[1].quarantined = 1;
    n = rk_sup_pick_devices(&r, ND, h, st, 6, prev, 6, group, dev, pick);
    assert_int_equal(n, 6);
    const int one_out[6] = {0, 2, 6, 7, 4, 5};
    for (int i = 0; i < 6; i++)
        assert_int_equal(dev[i], one_out[i]);

    /* a node's ranks that would not be consecutive: device order. Three ranks on h1 h2 h1
     * (h1 has two devices), h2's device lost: rank 1 would take h3's, between h1's ranks */
    const int grp2[5] = {0, 0, 2, 3, 4}; /* h1 h1 h2 h3 h4 */
    rk_sup_health h2[5];
    rk_sup_dev st2[5] = {{0}};
    for (int d = 0; d < 5; d++)
        h2[d] = (rk_sup_health){.score = 100, .prob = -1};
    int prev2[3] = {0, 2, 1}; /* h1 h2 h1: not consecutive before either */
    h2[2].lost = 1;           /* rank 1's device (h2) out: it takes h3's (device 3) */
    n = rk_sup_pick_devices(&r, 5, h2, st2, 3, prev2, 3, grp2, dev, pick);
    assert_int_equal(n, 3);
    /* ranks 0 and 2 on h1 with rank 1 on h3 between them: device order instead */
    assert_int_equal(dev[0], 0);
    assert_int_equal(dev[1], 1);
    assert_int_equal(dev[2], 3);
    /* without groups (one host) the ranks keep their places */
    n = rk_sup_pick_devices(&r, 5, h2, st2, 3, prev2, 3, NULL, dev, pick);
    assert_int_equal(dev[0], 0);
    assert_int_equal(dev[1], 3);
    assert_int_equal(dev[2], 1);

    /* the shrink: fewer devices than ranks, numbered afresh in device order */
    int prev3[3] = {2, 0, 1};
    rk_sup_dev st3[3] = {{0}, {.quarantined = 1}, {0}};
    n = rk_sup_pick_devices(&r, 3, h, st3, 3, prev3, 3, NULL, dev, pick);
    assert_int_equal(n, 2);
    assert_int_equal(dev[0], 0);
    assert_int_equal(dev[1], 2);

    /* back to full size after a shrink: the survivors keep their places, the new rank takes
     * the first free device */
    int prev4[2] = {2, 0};
    rk_sup_dev st4[3] = {{0}};
    n = rk_sup_pick_devices(&r, 3, h, st4, 3, prev4, 2, NULL, dev, pick);
    assert_int_equal(n, 3);
    assert_int_equal(dev[0], 2);
    assert_int_equal(dev[1], 0);
    assert_int_equal(dev[2], 1);
}

static void test_relaunch(void **state)
{
    (void)state;
    static const struct {
        int restarts, max, picked, min;
        rk_sup_next next;
        rk_sup_end end;
    } cases[] = {
        {0, 10, -1, 1, RK_SUP_RELAUNCH, 0},
        {9, 10, -1, 1, RK_SUP_RELAUNCH, 0},
        {10, 10, -1, 1, RK_SUP_STOP, RK_SUP_END_OUT_OF_RESTARTS},
        {0, 0, -1, 1, RK_SUP_STOP, RK_SUP_END_OUT_OF_RESTARTS},
        {10, 10, 4, 1, RK_SUP_STOP, RK_SUP_END_OUT_OF_RESTARTS}, /* restarts first */
        {2, 10, 4, 4, RK_SUP_RELAUNCH, 0},
        {2, 10, 3, 4, RK_SUP_STOP, RK_SUP_END_TOO_FEW_DEVICES}, /* below --min-ranks */
        {2, 10, 1, 1, RK_SUP_RELAUNCH, 0},
        {2, 10, 0, 1, RK_SUP_STOP, RK_SUP_END_TOO_FEW_DEVICES},
        {2, 10, 0, 0, RK_SUP_STOP, RK_SUP_END_TOO_FEW_DEVICES}, /* never on no devices */
    };
    for (size_t k = 0; k < N_OF(cases); k++) {
        rk_sup_end end = (rk_sup_end)-1;
        rk_sup_next next =
            rk_sup_relaunch(cases[k].restarts, cases[k].max, cases[k].picked, cases[k].min, &end);
        if (next != cases[k].next || (next == RK_SUP_STOP && end != cases[k].end))
            fail_msg("case %zu: next %d end %d", k, next, end);
    }
}

/* ---- during a launch ----------------------------------------------------------------------- */

static void test_gate_due(void **state)
{
    (void)state;
    static const struct {
        int gate, failing, stop_sent, hellos, ranks;
        double now, last, interval;
        int due;
    } cases[] = {
        {1, 0, 0, 4, 4, 10.0, 5.0, 5.0, 1},  {1, 0, 0, 4, 4, 9.9, 5.0, 5.0, 0},
        {0, 0, 0, 4, 4, 10.0, 0.0, 5.0, 0},  {1, 1, 0, 4, 4, 10.0, 0.0, 5.0, 0},
        {1, 0, 1, 4, 4, 10.0, 0.0, 5.0, 0},  {1, 0, 0, 3, 4, 10.0, 0.0, 5.0, 0},
        {1, 0, 0, 4, 4, 10.0, 10.0, 0.0, 1},
    };
    for (size_t k = 0; k < N_OF(cases); k++)
        if (rk_sup_gate_due(cases[k].gate, cases[k].failing, cases[k].stop_sent, cases[k].hellos,
                            cases[k].ranks, cases[k].now, cases[k].last,
                            cases[k].interval) != cases[k].due)
            fail_msg("case %zu", k);
}

static void test_drain_rank(void **state)
{
    (void)state;
    static const struct {
        int n, predictor;
        rk_sup_health h[4];
        int rank;
        rk_sup_why why;
    } cases[] = {
        {3, 1, {OK_DEV, OK_DEV, OK_DEV}, -1, RK_SUP_IN},
        {3, 0, {OK_DEV, {.score = 49, .prob = -1}, OK_DEV}, 1, RK_SUP_OUT_SCORE},
        {3, 0, {OK_DEV, {.score = 50, .prob = -1}, OK_DEV}, -1, RK_SUP_IN},
        /* the predictor first, whatever the ranks' order */
        {3,
         1,
         {{.score = 10, .prob = -1}, OK_DEV, {.score = 100, .prob = 0.7}},
         2,
         RK_SUP_OUT_PREDICTED},
        {2, 1, {{.score = 100, .prob = 0.5}, OK_DEV}, 0, RK_SUP_OUT_PREDICTED},
        {2, 0, {{.score = 100, .prob = 0.9}, OK_DEV}, -1, RK_SUP_IN},
        {3, 0, {{.score = 20, .prob = -1}, OK_DEV, {.score = 10, .prob = -1}}, 0, RK_SUP_OUT_SCORE},
        /* a fatal reading is delivered as the failure would be, not drained */
        {1, 0, {{.fatal = 1, .score = 100, .prob = -1}}, -1, RK_SUP_IN},
    };
    for (size_t k = 0; k < N_OF(cases); k++) {
        rk_sup_rules r = {.threshold = 50,
                          .margin = 10,
                          .predictor = cases[k].predictor,
                          .drain_probability = 0.5};
        rk_sup_why why = (rk_sup_why)-1;
        int got = rk_sup_drain_rank(&r, cases[k].n, cases[k].h, &why);
        if (got != cases[k].rank || why != cases[k].why)
            fail_msg("case %zu: rank %d why %d", k, got, why);
    }
}

static void test_stuck_ranks(void **state)
{
    (void)state;
    static const struct {
        int n;
        int64_t progress[4]; /* -1: no connection */
        int count, first;
        int stuck[4];
    } cases[] = {
        {4, {10, 10, 9, 10}, 1, 2, {0, 0, 1, 0}},   /* one behind: the others wait for it */
        {4, {11, 10, 10, 11}, 2, 1, {0, 1, 1, 0}},  /* in the collective is ahead */
        {4, {10, 10, 10, 10}, 0, -1, {0, 0, 0, 0}}, /* all equal: nobody in particular */
        {3, {-1, 4, 4}, 1, 0, {1, 0, 0}},           /* no hello */
        {3, {-1, 4, 2}, 2, 0, {1, 0, 1}},
        {2, {-1, -1}, 2, 0, {1, 1}},
        {1, {0}, 0, -1, {0}},
    };
    for (size_t k = 0; k < N_OF(cases); k++) {
        int stuck[4] = {0}, first = 7;
        int count = rk_sup_stuck_ranks(cases[k].n, cases[k].progress, stuck, &first);
        if (count != cases[k].count || first != cases[k].first)
            fail_msg("case %zu: %d stuck, first %d", k, count, first);
        for (int r = 0; r < cases[k].n; r++)
            if (stuck[r] != cases[k].stuck[r])
                fail_msg("case %zu: rank %d stuck %d", k, r, stuck[r]);
    }
}

static void test_teardown_due(void **state)
{
    (void)state;
    static const struct {
        int hang, startup, dup_rank;
        double now, since;
        int due, ckpt_failed;
    } cases[] = {
        {1, 0, -1, 1.0, 1.0, 1, 0},
        {0, 1, -1, 1.0, 1.0, 1, 0},
        {0, 0, -1, 5.0, 1.0, 0, 0},
        {0, 0, -1, 6.0, 1.0, 0, 0},
        {0, 0, -1, 6.1, 1.0, 1, 0},
        /* two processes said hello as rank 0 (or 3): at once */
        {0, 0, 0, 1.0, 1.0, 1, 0},
        {0, 0, 3, 1.0, 1.0, 1, 0},
        /* rk run could not write a checkpoint from the snapshots: no rank exits, at once */
        {0, 0, -1, 1.0, 1.0, 1, 1},
    };
    for (size_t k = 0; k < N_OF(cases); k++) {
        rk_sup_seen seen;
        rk_sup_seen_init(&seen, 4);
        seen.hang = cases[k].hang;
        seen.startup_timeout = cases[k].startup;
        seen.dup_rank = cases[k].dup_rank;
        seen.ckpt_failed = cases[k].ckpt_failed;
        if (rk_sup_teardown_due(&seen, cases[k].now, cases[k].since, 5.0) != cases[k].due)
            fail_msg("case %zu", k);
    }
}

static void test_interrupt(void **state)
{
    (void)state;
    static const struct {
        int signals, stop_sent;
        double now, since, grace;
        rk_sup_intr what;
    } cases[] = {
        {0, 0, 10, 0, 30, RK_SUP_INTR_NONE},      {1, 0, 0, 0, 30, RK_SUP_INTR_SEND_STOP},
        {1, 1, 10, 0, 30, RK_SUP_INTR_NONE},      /* waiting for the ranks */
        {1, 1, 30, 0, 30, RK_SUP_INTR_TEAR_DOWN}, /* the grace ran out */
        {2, 1, 1, 0, 30, RK_SUP_INTR_AGAIN},      /* a second signal */
        {2, 0, 0, 0, 30, RK_SUP_INTR_SEND_STOP},  /* the stop goes out first */
        {1, 0, 0, 0, 0, RK_SUP_INTR_TEAR_DOWN},   /* --stop-grace 0: at once, no stop */
        {1, 1, 0, 0, 0, RK_SUP_INTR_TEAR_DOWN},   /* a drain's stop was out already */
    };
    for (size_t k = 0; k < N_OF(cases); k++)
        if (rk_sup_interrupt(cases[k].signals, cases[k].stop_sent, cases[k].now, cases[k].since,
                             cases[k].grace) != cases[k].what)
            fail_msg("case %zu", k);
}

/* The storage refusals are RK_ESTORAGE; other failures keep their codes. */
static void test_storage_errnos(void **state)
{
    (void)state;
    const int storage[] = {ENOSPC, EDQUOT, EROFS, EACCES, EPERM, EIO};
    for (size_t k = 0; k < sizeof storage / sizeof storage[0]; k++)
        assert_int_equal(rk_err_code_errno(storage[k]), RK_ESTORAGE);
    assert_int_equal(rk_err_code_errno(ENOENT), RK_ENOENT);
    assert_int_equal(rk_err_code_errno(ENOTDIR), RK_ENOENT);
    assert_int_equal(rk_err_code_errno(ENOMEM), RK_ENOMEM);
    assert_int_equal(rk_err_code_errno(EISDIR), RK_EIO);
    assert_int_equal(rk_err_code_errno(EFBIG), RK_EIO);
    assert_int_equal(rk_err_code_errno(EBADF), RK_EIO);
    assert_string_not_equal(rk_strerror(RK_ESTORAGE), rk_strerror(-1000));
}

/* ---- the launch's environment and launcher --------------------------------------------- */

static const char *const *fake_env;
static const char *fake_get(const char *name)
{
    for (size_t k = 0; fake_env[k]; k += 2)
        if (strcmp(fake_env[k], name) == 0)
            return fake_env[k + 1];
    return NULL;
}

/* Each launcher's variables give RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; without the
 * local pair the job is one node; inconsistent or broken values are no mapping. */
static void test_rank_env_map(void **state)
{
    (void)state;
    static const char *const ompi[] = {"OMPI_COMM_WORLD_RANK",
                                       "3",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "8",
                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "1",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                                       "2",
                                       NULL};
    static const char *const pmi[] = {"PMI_RANK", "1", "PMI_SIZE", "2", NULL};
    static const char *const slurm[] = {"SLURM_PROCID",
                                        "5",
                                        "SLURM_NTASKS",
                                        "7",
                                        "SLURM_LOCALID",
                                        "1",
                                        "SLURM_NODEID",
                                        "2",
                                        "SLURM_TASKS_PER_NODE",
                                        "2(x2),3",
                                        NULL};
    static const char *const slurm1[] = {
        "SLURM_PROCID", "1", "SLURM_NTASKS", "4", "SLURM_TASKS_PER_NODE", "4", NULL};
    static const char *const both[] = {"OMPI_COMM_WORLD_RANK",
                                       "2",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "4",
                                       "SLURM_PROCID",
                                       "0",
                                       "SLURM_NTASKS",
                                       "1",
                                       NULL};
    static const char *const bad1[] = {"OMPI_COMM_WORLD_RANK", "4", "OMPI_COMM_WORLD_SIZE", "4",
                                       NULL};
    static const char *const bad2[] = {"PMI_RANK", "1x", "PMI_SIZE", "2", NULL};
    static const char *const bad3[] = {"PMI_RANK", "-1", "PMI_SIZE", "2", NULL};
    static const char *const none[] = {"RANK", "1", "WORLD_SIZE", "2", NULL};
    static const struct {
        const char *const *env;
        int ok;
        long want[4];
    } cases[] = {
        {ompi, 1, {3, 8, 1, 2}},  {pmi, 1, {1, 2, 1, 2}},
        {slurm, 1, {5, 7, 1, 3}}, {slurm1, 1, {1, 4, 1, 4}},
        {both, 1, {2, 4, 2, 4}},  {bad1, 0, {0}},
        {bad2, 0, {0}},           {bad3, 0, {0}},
        {none, 0, {0}},
    };
    for (size_t k = 0; k < N_OF(cases); k++) {
        fake_env = cases[k].env;
        long got[4] = {-9, -9, -9, -9};
        int ok = rk_env_rank_map(fake_get, got);
        if (ok != cases[k].ok)
            fail_msg("case %zu: mapped %d", k, ok);
        for (int i = 0; ok && i < 4; i++)
            if (got[i] != cases[k].want[i])
                fail_msg("case %zu: value %d is %ld, want %ld", k, i, got[i], cases[k].want[i]);
    }
}

/* A minimal 64-bit ELF file with a dynamic section needing `libs` (NULL-ended), cut to `cut`
 * bytes when cut > 0. */
static void write_elf(const char *path, const char *const *libs, size_t cut)
{
    unsigned char buf[4096] = {0};
    Elf64_Ehdr *eh = (Elf64_Ehdr *)buf;
    memcpy(eh->e_ident, ELFMAG, SELFMAG);
    eh->e_ident[EI_CLASS] = ELFCLASS64;
    eh->e_ident[EI_DATA] = ELFDATA2LSB;
    eh->e_ident[EI_VERSION] = EV_CURRENT;
    eh->e_type = ET_EXEC;
    eh->e_shentsize = sizeof(Elf64_Shdr);
    eh->e_shnum = 3;
    eh->e_shoff = 1024;
    char *str = (char *)buf + 512; /* .dynstr */
    size_t used = 1;
    Elf64_Dyn *d = (Elf64_Dyn *)(buf + 256);
    int nd = 0;
    for (int i = 0; libs[i]; i++) {
        d[nd].d_tag = DT_NEEDED;
        d[nd++].d_un.d_val = used;
        memcpy(str + used, libs[i], strlen(libs[i]) + 1);
        used += strlen(libs[i]) + 1;
    }
    d[nd++].d_tag = DT_NULL;
    Elf64_Shdr *sh = (Elf64_Shdr *)(buf + 1024);
    sh[1].sh_type = SHT_STRTAB;
    sh[1].sh_offset = 512;
    sh[1].sh_size = used;
    sh[2].sh_type = SHT_DYNAMIC;
    sh[2].sh_offset = 256;
    sh[2].sh_size = (uint64_t)nd * sizeof(Elf64_Dyn);
    sh[2].sh_link = 1;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    size_t n = cut ? cut : 1024 + 3 * sizeof(Elf64_Shdr);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

/* The ranks' environment, one builder for rk run's launcher and the node agent
 * (rk_rank_env_build): every value asked for, nothing else; a field left out (NULL, -1, 0)
 * sets nothing; RK_RESUME goes with RK_CKPT_DIR and RK_INJECT_DONE only with something in it;
 * CUDA_DEVICE_ORDER is kept when the environment has one. */
static void test_rank_env(void **state)
{
    (void)state;
    static rk_rank_env e;
    rk_err err = {0};
    unsetenv("CUDA_DEVICE_ORDER");
    rk_rank_env_opts full = {.heartbeat = "@rk-ab",
                             .devices = "-,-,0,1",
                             .by_host = 1,
                             .launch = 3,
                             .world = 4,
                             .local_world = 2,
                             .rank_base = 2,
                             .master_addr = "h1",
                             .master_port = 29500,
                             .cuda_visible = "0,1",
                             .omp_one = 1,
                             .stack_dir = "/tmp/st",
                             .ckpt_dir = "/ck",
                             .inject = "crash@step=3",
                             .inject_done = "0"};
    assert_int_equal(rk_rank_env_build(&e, &full, &err), RK_OK);
    static const char *const want[] = {"RK_HEARTBEAT=@rk-ab",
                                       "RK_DEVICES=-,-,0,1",
                                       "RK_DEVICES_BY_HOST=1",
                                       "RK_LAUNCH=3",
                                       "WORLD_SIZE=4",
                                       "LOCAL_WORLD_SIZE=2",
                                       "RK_RANK_BASE=2",
                                       "MASTER_ADDR=h1",
                                       "MASTER_PORT=29500",
                                       "CUDA_VISIBLE_DEVICES=0,1",
                                       "CUDA_DEVICE_ORDER=PCI_BUS_ID",
                                       "OMP_NUM_THREADS=1",
                                       "TORCHELASTIC_RESTART_COUNT=3",
                                       "RK_STACK_DIR=/tmp/st",
                                       "RK_CKPT_DIR=/ck",
                                       "RK_RESUME=1",
                                       "RK_INJECT=crash@step=3",
                                       "RK_INJECT_DONE=0"};
    assert_int_equal(e.n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < e.n; i++)
        assert_string_equal(e.env[i], want[i]);
    assert_null(e.env[e.n]);
    assert_int_equal(rk_rank_env_add(&e, &err, "SLURM_HOSTFILE=%s", "/j/hostfile"), RK_OK);
    assert_string_equal(e.env[e.n - 1], "SLURM_HOSTFILE=/j/hostfile");
    assert_null(e.env[e.n]);

    setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST", 1);
    rk_rank_env_opts bare = {.heartbeat = "/tmp/s/hb.sock",
                             .devices = "0",
                             .launch = 0,
                             .world = 1,
                             .local_world = 1,
                             .rank_base = -1,
                             .inject = "nan@step=2",
                             .inject_done = ""};
    assert_int_equal(rk_rank_env_build(&e, &bare, &err), RK_OK);
    static const char *const want_bare[] = {"RK_HEARTBEAT=/tmp/s/hb.sock",
                                            "RK_DEVICES=0",
                                            "RK_LAUNCH=0",
                                            "WORLD_SIZE=1",
                                            "LOCAL_WORLD_SIZE=1",
                                            "TORCHELASTIC_RESTART_COUNT=0",
                                            "RK_INJECT=nan@step=2"};
    assert_int_equal(e.n, (int)(sizeof want_bare / sizeof want_bare[0]));
    for (int i = 0; i < e.n; i++)
        assert_string_equal(e.env[i], want_bare[i]);
    unsetenv("CUDA_DEVICE_ORDER");
}

/* auto: mpirun for an ELF that needs libmpi.so*, MPICH's libmpich*.so* or librekindle.so*
 * and whenever launcher arguments are given; local for a script, an ELF needing neither, a
 * cut or missing file. */
static void test_launch_pick(void **state)
{
    (void)state;
    char dir[] = "/tmp/rk-test-pick.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], why[512];
    char *argv[2] = {path, NULL};
    static const char *const mpi[] = {"libm.so.6", "libmpi.so.40", NULL};
    static const char *const rekindle[] = {"librekindle.so.0", NULL};
    static const char *const plain[] = {"libc.so.6", "libmpich_not.so", NULL};
    static const char *const mpich[] = {"libc.so.6", "libmpich.so.12", NULL};
    static const char *const mpichcxx[] = {"libmpichcxx.so.12", NULL};
    static const struct {
        const char *const *libs;
        size_t cut;
        rk_launcher want;
    } cases[] = {{mpi, 0, RK_LAUNCH_MPIRUN},     {rekindle, 0, RK_LAUNCH_MPIRUN},
                 {plain, 0, RK_LAUNCH_LOCAL},    {mpi, 1030, RK_LAUNCH_LOCAL},
                 {mpi, 40, RK_LAUNCH_LOCAL},     {mpich, 0, RK_LAUNCH_MPIRUN},
                 {mpichcxx, 0, RK_LAUNCH_MPIRUN}};
    for (size_t k = 0; k < N_OF(cases); k++) {
        snprintf(path, sizeof path, "%s/prog%zu", dir, k);
        write_elf(path, cases[k].libs, cases[k].cut);
        if (rk_launch_pick(argv, 0, why, sizeof why) != cases[k].want)
            fail_msg("case %zu: %s", k, why);
        assert_int_equal(rk_launch_pick(argv, 1, why, sizeof why), RK_LAUNCH_MPIRUN);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/script", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\nexit 0\n", f);
    fclose(f);
    assert_int_equal(rk_launch_pick(argv, 0, why, sizeof why), RK_LAUNCH_LOCAL);
    assert_non_null(strstr(why, "is not an MPI program"));
    unlink(path);
    assert_int_equal(rk_launch_pick(argv, 0, why, sizeof why), RK_LAUNCH_LOCAL); /* missing */
    /* damaged files (seeded byte changes in the headers and tables) are read without harm;
     * an answer either way is fine, a crash or an over-read (ASan) is not */
    snprintf(path, sizeof path, "%s/mutant", dir);
    unsigned seed = 12345;
    for (int round = 0; round < 300; round++) {
        write_elf(path, mpi, 0);
        FILE *m = fopen(path, "r+b");
        assert_non_null(m);
        for (int k = 0; k < 4; k++) {
            seed = seed * 1103515245u + 12345u;
            long at = (long)((seed >> 8) % (1024 + 3 * sizeof(Elf64_Shdr)));
            seed = seed * 1103515245u + 12345u;
            fseek(m, at, SEEK_SET);
            fputc((int)(seed >> 16) & 0xff, m);
        }
        fclose(m);
        (void)rk_launch_pick(argv, 0, why, sizeof why);
    }
    unlink(path);
    char *sh[] = {"sh", NULL}; /* through PATH, a real ELF that needs no MPI */
    assert_int_equal(rk_launch_pick(sh, 0, why, sizeof why), RK_LAUNCH_LOCAL);
    rmdir(dir);
}

/* The warm spare's command (launch.c): a rank's `python [OPTS] SCRIPT ARGS` with `-m
 * rekindle.torch._spare` before the script; anything it cannot be sure of: no spare. */
static void test_spare_argv(void **state)
{
    (void)state;
    static const struct {
        const char *in[8];
        const char *want; /* the words joined by spaces; NULL: no spare */
    } cases[] = {
        {{"python3", "train.py", "--lr", "0.1"},
         "python3 -m rekindle.torch._spare train.py --lr 0.1"},
        {{"/usr/bin/python3.11", "-u", "-B", "t.py"},
         "/usr/bin/python3.11 -u -B -m rekindle.torch._spare t.py"},
        {{"python", "t.py"}, "python -m rekindle.torch._spare t.py"},
        {{"python3", "-c", "print(1)"}, NULL},      /* no script */
        {{"python3", "-m", "mod"}, NULL},           /* a module: not a script */
        {{"python3", "-um", "mod"}, NULL},          /* -m inside a cluster */
        {{"python3", "-W", "error", "t.py"}, NULL}, /* -W's argument apart or joined: refused */
        {{"python3", "-Xdev", "t.py"}, NULL},
        {{"python3", "--check-hash-based-pycs", "always", "t.py"}, NULL},
        {{"python3", "-", "x"}, NULL},    /* stdin */
        {{"python3", "-u"}, NULL},        /* no script at all */
        {{"/usr/bin/rk", "train"}, NULL}, /* not python */
        {{"sh", "-c", "python3 t.py"}, NULL},
        {{"./mypython", "t.py"}, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *out[16];
        int rc = rk_launch_spare_argv(cases[i].in, out, 16);
        if (!cases[i].want) {
            assert_int_equal(rc, -1);
            continue;
        }
        assert_int_equal(rc, 0);
        char got[256] = "";
        for (int k = 0; out[k]; k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", k ? " " : "", out[k]);
        assert_string_equal(got, cases[i].want);
    }
    /* no room: refused, nothing written past cap */
    const char *in[] = {"python3", "t.py", "a", "b", "c", NULL};
    const char *out[5];
    assert_int_equal(rk_launch_spare_argv(in, out, 5), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quarantine),   cmocka_unit_test(test_pick_devices),
        cmocka_unit_test(test_pick_stable),  cmocka_unit_test(test_relaunch),
        cmocka_unit_test(test_gate_due),     cmocka_unit_test(test_drain_rank),
        cmocka_unit_test(test_stuck_ranks),  cmocka_unit_test(test_teardown_due),
        cmocka_unit_test(test_interrupt),    cmocka_unit_test(test_storage_errnos),
        cmocka_unit_test(test_rank_env_map), cmocka_unit_test(test_launch_pick),
        cmocka_unit_test(test_rank_env),     cmocka_unit_test(test_spare_argv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
