/*
 * The worker runtime (rekindle/worker.h) on one rank without a supervisor: registration is
 * checked, error codes map to the exit statuses rk run reads; the replica check snapshots every K
 * steps and a rollback returns every kind of buffer but the gradient to it; RK_INJECT bitflip lands
 * in a parameter and nan in a gradient at the chosen step; the built-in checkpoint format saves,
 * refuses a fresh start into a used directory, and resumes the same bits (asked by the options
 * or by rk run's RK_CKPT_DIR and RK_RESUME=1, read by rk_worker_ckpt_env); the final checkpoint
 * is skipped when the last step was just saved; snapshots in node memory are put, pinned
 * (RK_SNAP_PIN_EVERY) and resumed from.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "rekindle/ckpt.h"
#include "rekindle/heartbeat.h"
#include "rekindle/snap.h"
#include "rekindle/worker.h"
#include "runtime/worker_internal.h"
#include "testutil.h"

static FILE *g_notes; /* rank 0's notes in open_worker (NULL: quiet) */

typedef struct fixture {
    rk_comm *comm;
    rk_worker *w;
    float p[8], g[8], v[8], ef[4];
    int64_t t;
} fixture;

static void open_worker(fixture *f, int64_t hash_every)
{
    rk_err err = {0};
    memset(f, 0, sizeof *f);
    for (int i = 0; i < 8; i++)
        f->p[i] = 0.25f * (float)i;
    assert_int_equal(rk_comm_open(&f->comm, "self", &err), RK_OK);
    rk_worker_opts o;
    rk_worker_opts_default(&o);
    o.hash_every = hash_every;
    o.notes = g_notes;
    assert_int_equal(rk_worker_open(&f->w, f->comm, &o, &err), RK_OK);
    assert_int_equal(rk_worker_add_f32(f->w, RK_WORKER_PARAM, "model.p", f->p, 8, &err), RK_OK);
    assert_int_equal(rk_worker_add_f32(f->w, RK_WORKER_GRAD, "grad.p", f->g, 8, &err), RK_OK);
    assert_int_equal(rk_worker_add_f32(f->w, RK_WORKER_STATE, "optim.v", f->v, 8, &err), RK_OK);
    assert_int_equal(rk_worker_add_bytes(f->w, RK_WORKER_STATE, "optim.t", &f->t, 8, &err), RK_OK);
    assert_int_equal(rk_worker_add_f32(f->w, RK_WORKER_LOCAL, "ef", f->ef, 4, &err), RK_OK);
}

static void close_worker(fixture *f)
{
    rk_worker_close(f->w, 0, RK_EXIT_OK, NULL);
    rk_comm_close(f->comm);
}

/* One SGD-like step on every buffer, the way a trainer would between the calls. */
static void fake_step(fixture *f)
{
    for (int i = 0; i < 8; i++) {
        f->g[i] = 0.01f * (float)(i + 1);
        f->v[i] = 0.9f * f->v[i] + f->g[i];
        f->p[i] -= 0.1f * f->v[i];
    }
    f->ef[0] += 1.0f;
    f->t++;
}

static void registration_is_checked(void **state)
{
    (void)state;
    fixture f;
    open_worker(&f, 10);
    rk_err err = {0};
    float x[2];
    assert_int_equal(rk_worker_add_f32(f.w, RK_WORKER_PARAM, "model.p", x, 2, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "twice"));
    assert_int_equal(rk_worker_add_bytes(f.w, RK_WORKER_PARAM, "b", x, 8, &err), RK_EINVAL);
    assert_int_equal(rk_worker_add_f32(f.w, RK_WORKER_STATE, "", x, 2, &err), RK_EINVAL);
    assert_int_equal(rk_worker_add_f32(f.w, RK_WORKER_STATE, "z", x, 0, &err), RK_EINVAL);
    assert_int_equal(rk_worker_add_f32(f.w, (rk_worker_buf)7, "k", x, 2, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "kind 7"));
    assert_int_equal(rk_worker_add_f32(f.w, RK_WORKER_STATE, "huge", x, SIZE_MAX / 2, &err),
                     RK_EINVAL);
    /* rolled_to may be NULL; once a step began, a buffer would have no snapshot: refused */
    assert_int_equal(rk_worker_step_begin(f.w, 1, NULL, &err), RK_OK);
    assert_int_equal(rk_worker_add_f32(f.w, RK_WORKER_STATE, "late", x, 2, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "after the first step"));
    /* the statuses rk run reads (docs/protocol.md) */
    assert_int_equal(rk_worker_exit_status(RK_OK), RK_EXIT_OK);
    assert_int_equal(rk_worker_exit_status(RK_EINVAL), RK_EXIT_USAGE);
    assert_int_equal(rk_worker_exit_status(RK_ECOMM), RK_EXIT_COMM);
    assert_int_equal(rk_worker_exit_status(RK_ESTOPPED), RK_EXIT_STOPPED);
    assert_int_equal(rk_worker_exit_status(RK_EGUARD), RK_EXIT_GUARD);
    assert_int_equal(rk_worker_exit_status(RK_ESTORAGE), RK_EXIT_STORAGE);
    assert_int_equal(rk_worker_exit_status(RK_EIO), RK_EXIT_FAIL);
    close_worker(&f);
}

static void snapshot_and_rollback(void **state)
{
    (void)state;
    fixture f;
    open_worker(&f, 4);
    rk_err err = {0};
    int64_t back, step;
    assert_int_equal(rk_worker_snapshot_step(f.w), -1);
    assert_int_equal(rk_worker_rollback(f.w, &step, &err), RK_ENOENT);
    float p0[8], v0[8], ef0[4];
    int64_t t0 = 0;
    for (int64_t s = 0; s < 6; s++) {
        assert_int_equal(rk_worker_step_begin(f.w, s, &back, &err), RK_OK);
        assert_int_equal(back, -1);
        if (s == 4) { /* the snapshot is of the state at the start of step 4 */
            memcpy(p0, f.p, sizeof p0);
            memcpy(v0, f.v, sizeof v0);
            memcpy(ef0, f.ef, sizeof ef0);
            t0 = f.t;
        }
        assert_int_equal(rk_worker_grads(f.w, s, &err), RK_OK);
        fake_step(&f);
        assert_int_equal(rk_worker_step_end(f.w, s + 1, 0.5, 0.001, &err), RK_OK);
    }
    assert_int_equal(rk_worker_snapshot_step(f.w), 4);
    uint64_t h = rk_worker_state_hash(f.w);
    assert_int_equal(rk_worker_rollback(f.w, &step, &err), RK_OK);
    assert_int_equal(step, 4);
    assert_memory_equal(f.p, p0, sizeof p0);
    assert_memory_equal(f.v, v0, sizeof v0);
    assert_memory_equal(f.ef, ef0, sizeof ef0);
    assert_int_equal(f.t, t0);
    assert_true(rk_worker_state_hash(f.w) != h);
    close_worker(&f);
}

static void faults_land_in_registered_buffers(void **state)
{
    (void)state;
    setenv("RK_INJECT", "bitflip@step=2,nan@step=3", 1);
    fixture f;
    open_worker(&f, 0);
    unsetenv("RK_INJECT");
    rk_err err = {0};
    int64_t back;
    for (int64_t s = 0; s < 4; s++) {
        float p[8];
        memcpy(p, f.p, sizeof p);
        for (int i = 0; i < 8; i++)
            f.g[i] = 1.0f;
        assert_int_equal(rk_worker_step_begin(f.w, s, &back, &err), RK_OK);
        int flipped = memcmp(p, f.p, sizeof p) != 0;
        assert_int_equal(flipped, s == 2);
        assert_int_equal(rk_worker_grads(f.w, s, &err), RK_OK);
        int nans = 0;
        for (int i = 0; i < 8; i++)
            nans += isnan(f.g[i]);
        assert_int_equal(nans, s == 3 ? 1 : 0);
    }
    close_worker(&f);
}

static void builtin_checkpoints_resume_the_same_bits(void **state)
{
    (void)state;
    char dir[512];
    assert_int_equal(test_dir_make(dir, sizeof dir, "test_worker"), 0);
    rk_worker_ckpt_opts co;
    rk_worker_ckpt_opts_default(&co);
    co.dir = dir;
    co.every = 3;
    co.config_json = "{\"test\":\"worker\"}";
    rk_err err = {0};
    int64_t start = -1, back;
    fixture f;
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    assert_int_equal(start, 0);
    for (int64_t s = 0; s < 6; s++) {
        assert_int_equal(rk_worker_step_begin(f.w, s, &back, &err), RK_OK);
        fake_step(&f);
        assert_int_equal(rk_worker_step_end(f.w, s + 1, 0.5, 0.001, &err), RK_OK);
    }
    assert_int_equal(rk_worker_ckpt_final(f.w, 6, &err), RK_OK); /* 6 was just saved */
    float p[8], v[8];
    memcpy(p, f.p, sizeof p);
    memcpy(v, f.v, sizeof v);
    int64_t t = f.t;
    close_worker(&f);
    char latest[256];
    assert_int_equal(rk_ckpt_read_latest(dir, latest, sizeof latest, &err), RK_OK);
    assert_string_equal(latest, "ckpt-000000000006.safetensors");

    open_worker(&f, 10); /* a fresh start into the used directory is refused */
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_EINVAL);
    assert_non_null(strstr(err.msg, "already holds"));
    close_worker(&f);

    co.resume = 1;
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    assert_int_equal(start, 6);
    assert_memory_equal(f.p, p, sizeof p);
    assert_memory_equal(f.v, v, sizeof v);
    assert_int_equal(f.t, t);
    close_worker(&f);

    co.resume = 0; /* the same, asked by a supervisor through the environment */
    co.dir = NULL;
    setenv("RK_CKPT_DIR", dir, 1);
    setenv("RK_RESUME", "1", 1);
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    assert_int_equal(start, 6);
    close_worker(&f);
    unsetenv("RK_CKPT_DIR");
    unsetenv("RK_RESUME");
    co.dir = dir;
    co.resume = 1;

    co.config_json = "{\"test\":\"another\"}"; /* another run's checkpoints: refused */
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_EMISMATCH);
    close_worker(&f);
    rm_tree(dir);
}

/* Flip one byte in the middle of a file (a bit gone bad in memory). */
static void spoil(const char *path)
{
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long n = ftell(fp);
    assert_true(n > 16);
    assert_int_equal(fseek(fp, n - 8, SEEK_SET), 0); /* the last tensor's bytes */
    int c = fgetc(fp);
    assert_int_equal(fseek(fp, n - 8, SEEK_SET), 0);
    fputc(c ^ 0x10, fp);
    fclose(fp);
}

/* A memory test's set-up: a checkpoint directory `dir`, a tmpfs stand-in `parent` holding the
 * job's snapshot directory `snap` (RK_SNAP_DIR), RK_SNAP_EVERY=`every`, checkpoints every 4
 * steps into `dir` with `config` (names from `tag`). */
static void mem_setup(const char *tag, const char *every, const char *config, char *dir,
                      char *parent, char *snap, rk_worker_ckpt_opts *co)
{
    char name[128];
    snprintf(name, sizeof name, "test_worker_%s_ck", tag);
    assert_int_equal(test_dir_make(dir, 512, name), 0);
    snprintf(name, sizeof name, "test_worker_%s_shm", tag);
    assert_int_equal(test_dir_make(parent, 512, name), 0);
    rk_err err = {0};
    assert_int_equal(rk_snap_dir_make(parent, snap, RK_SNAP_PATH_MAX, &err), RK_OK);
    setenv(RK_SNAP_DIR_ENV, snap, 1);
    setenv("RK_SNAP_EVERY", every, 1);
    rk_worker_ckpt_opts_default(co);
    co->dir = dir;
    co->every = 4;
    co->config_json = config;
}

/* With RK_SNAP_DIR (rk run --recovery memory) every step is put in the node's snapshot store
 * (RK_SNAP_EVERY=1) and a resume restores the newest step held there when it is at least as
 * new as the disk's newest checkpoint: the replicated buffers and the rank's local ones (which
 * the disk's built-in format does not hold). A generation that no longer verifies is never
 * restored: the one before it is, and with none left that is as new as the disk, the disk. */
static void memory_snapshots_resume_before_the_disk(void **state)
{
    (void)state;
    char dir[512], parent[512], snap[RK_SNAP_PATH_MAX];
    rk_worker_ckpt_opts co;
    mem_setup("mem", "1", "{\"test\":\"memory\"}", dir, parent, snap, &co);
    rk_err err = {0};
    int64_t start = -1, back;
    fixture f;
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    assert_int_equal(start, 0);
    float p[7][8], v[7][8], ef[7][4];
    int64_t t[7];
    for (int64_t s = 0; s < 6; s++) {
        assert_int_equal(rk_worker_step_begin(f.w, s, &back, &err), RK_OK);
        fake_step(&f);
        assert_int_equal(rk_worker_step_end(f.w, s + 1, 0.5, 0.001, &err), RK_OK);
        memcpy(p[s + 1], f.p, sizeof f.p);
        memcpy(v[s + 1], f.v, sizeof f.v);
        memcpy(ef[s + 1], f.ef, sizeof f.ef);
        t[s + 1] = f.t;
    }
    close_worker(&f); /* disk: step 4; memory: steps 5 and 6 */
    int64_t steps[4];
    size_t n = 0;
    assert_int_equal(rk_snap_steps(snap, 0, steps, 4, &n, &err), RK_OK);
    assert_int_equal(n, 2);
    assert_int_equal(steps[0], 6);
    assert_int_equal(steps[1], 5);

    co.resume = 1;
    const int64_t want[] = {6, 5, 4}; /* each time the newest generation is spoilt */
    for (int k = 0; k < 3; k++) {
        open_worker(&f, 10);
        assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
        int64_t s = want[k];
        assert_int_equal(start, s);
        assert_memory_equal(f.p, p[s], sizeof f.p);
        assert_memory_equal(f.v, v[s], sizeof f.v);
        assert_int_equal(f.t, t[s]);
        if (s > 4) /* memory: the local buffer too */
            assert_memory_equal(f.ef, ef[s], sizeof f.ef);
        else /* disk (built-in format): no local buffers, they stay as the trainer made them */
            assert_true(f.ef[0] == 0.0f);
        close_worker(&f);
        if (k < 2) {
            char gen[RK_SNAP_PATH_MAX + 160], name[RK_CKPT_NAME_MAX];
            assert_int_equal(rk_snap_file_name(s, name, sizeof name), RK_OK);
            snprintf(gen, sizeof gen, "%s/rank-0/%s", snap, name);
            spoil(gen);
        }
    }
    unsetenv(RK_SNAP_DIR_ENV);
    unsetenv("RK_SNAP_EVERY");
    assert_int_equal(rk_snap_dir_remove(snap, &err), RK_OK);
    rm_tree(parent);
    rm_tree(dir);
}

/* A disk checkpoint's step is put in memory too, whatever K: memory is never older than the
 * disk, so a relaunch (or a rank replaced in place) restores from memory. K = 3, a checkpoint
 * every 4 steps: the steps of the checkpoints (4, 8) are held in memory, and a resume after
 * step 9 restores from memory. */
/* K: the 1 % rule, and with the disk checkpoints' steps put too (every 50 here), those puts
 * in the 1 %: 1.8 ms a put, 9.6 ms a step gave K 19 alone, so puts at 19, 38, 50 (forced),
 * 69, 88, 100 (forced): 3 puts each 50 steps, 1.1 % of the steps' time; K 25 puts at 25 and
 * 50, 0.75 % (the 4-rank PyTorch example's numbers, bench/RESULTS.md). */
static void snapshot_every_counts_the_forced_puts(void **state)
{
    (void)state;
    assert_true(rk_worker_snap_every(0.001, 0.1, 50, 0) == 1);
    assert_true(rk_worker_snap_every(0.00101, 0.1, 50, 0) == 2);
    assert_true(rk_worker_snap_every(0.01, 0.1, 50, 0) == 10);
    assert_true(rk_worker_snap_every(1.0, 0.1, 50, 0) == 50); /* the cap */
    assert_true(rk_worker_snap_every(0.01, 0.0, 7, 0) == 7);  /* no step time: the cap */
    assert_true(rk_worker_snap_every(0.0018, 0.0096, 50, 0) == 19);
    assert_true(rk_worker_snap_every(0.0018, 0.0096, 50, 50) == 25);
    /* puts each 50 steps at K: (50 - 1) / K + 1, within 50 x 1 % x step / put */
    for (double put = 0.0001; put < 0.02; put *= 1.37) {
        double k = rk_worker_snap_every(put, 0.0096, 50, 50);
        double puts = (double)(49 / (int64_t)k + 1), budget = 0.5 * 0.0096 / put;
        assert_true(k >= 1 && k <= 50);
        assert_true(puts <= budget || k == 50);
        if (k > 1) /* and the smallest such K */
            assert_true((double)(49 / (int64_t)(k - 1) + 1) > budget);
    }
    assert_true(rk_worker_snap_every(0.00009, 0.0096, 50, 50) == 1); /* cheap: every step */
    assert_true(rk_worker_snap_every(0.0096, 0.0096, 50, 50) == 50); /* the forced alone: 2 % */
}

/* K is chosen at the 4th put and again at the 16th, 64th and 256th, each from the puts and
 * steps since the choice before (the first steps are slow), then no more: the puts timed since
 * the last choice are counted, and counted afresh after each. */
static void snapshot_every_is_chosen_again(void **state)
{
    (void)state;
    char dir[512], parent[512], snap[RK_SNAP_PATH_MAX];
    rk_worker_ckpt_opts co;
    mem_setup("retime", "", "{\"test\":\"retime\"}", dir, parent, snap, &co);
    unsetenv("RK_SNAP_EVERY");
    rk_err err = {0};
    int64_t start = -1;
    fixture f;
    open_worker(&f, 10);
    co.every = 50; /* K up to 50: puts between the disk checkpoints' steps */
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    int last = 1, choices = 0, refused = 0, nan_done = 0;
    int64_t s = 0;
    for (; s < 20000 && f.w->mem_timed < RK_WORKER_MEM_TIMED_LAST; s++) {
        fake_step(&f);
        /* one put refused (a non-finite state: the store's rule) between two choices: counted,
         * as every other rank counts its put of that step, not timed; before, such a rank
         * skipped it and met the next choice's broadcast one put later than the others */
        int due = s + 1 >= f.w->mem_next && (s + 1) % co.every != 0; /* not a disk checkpoint's */
        int nan = due && !nan_done && f.w->mem_timed > 20, t0 = f.w->mem_timed;
        float keep = f.v[0];
        if (nan)
            f.v[0] = NAN; /* optimiser state: the store refuses it, no guard looks at it */
        /* the snapshot's part of a step's end, with the step's seconds given: slow first
         * steps, then settled (long enough against a put that K stays below 50) */
        int put = 0;
        assert_int_equal(rk_worker_mem_step_end(f.w, s + 1, s < 20 ? 2.0 : 1.0,
                                                (s + 1) % co.every == 0, &put, &err),
                         RK_OK);
        if (nan) {
            f.v[0] = keep;
            nan_done = 1;
            refused++;
            assert_int_equal(f.w->mem_timed, t0 + 1);
        }
        int t = f.w->mem_timed;
        if (t == 4 || t == 16 || t == 64 || t == RK_WORKER_MEM_TIMED_LAST) {
            if (t != last)
                choices++;
            last = t;
            refused = 0;
            assert_int_equal(f.w->mem_nput, 0); /* just chosen: counted afresh */
        } else if (t > 1) {
            assert_int_equal(f.w->mem_nput, t - last - refused);
        }
        assert_true(f.w->mem_every >= 1 && f.w->mem_every <= co.every);
    }
    assert_int_equal(choices, 4);
    assert_true(nan_done);
    assert_int_equal(f.w->mem_timed, RK_WORKER_MEM_TIMED_LAST);
    for (int64_t end = s + 40; s < end; s++) { /* no more timing */
        fake_step(&f);
        int put = 0;
        assert_int_equal(rk_worker_mem_step_end(f.w, s + 1, 1.0, 0, &put, &err), RK_OK);
    }
    assert_int_equal(f.w->mem_timed, RK_WORKER_MEM_TIMED_LAST);
    assert_int_equal(f.w->mem_nput, 0);
    close_worker(&f);
    unsetenv(RK_SNAP_DIR_ENV);
    assert_int_equal(rk_snap_dir_remove(snap, &err), RK_OK);
    rm_tree(parent);
    rm_tree(dir);
}

static void memory_holds_the_disk_checkpoints_steps(void **state)
{
    (void)state;
    char dir[512], parent[512], snap[RK_SNAP_PATH_MAX];
    rk_worker_ckpt_opts co;
    mem_setup("memck", "3", "{\"test\":\"memory-ckpt\"}", dir, parent, snap, &co);
    rk_err err = {0};
    int64_t start = -1, back, steps[4];
    size_t n = 0;
    fixture f;
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    for (int64_t s = 0; s < 9; s++) {
        assert_int_equal(rk_worker_step_begin(f.w, s, &back, &err), RK_OK);
        fake_step(&f);
        assert_int_equal(rk_worker_step_end(f.w, s + 1, 0.5, 0.001, &err), RK_OK);
        if (s + 1 == 4 || s + 1 == 8) { /* the checkpoint's step, just put */
            assert_int_equal(rk_snap_steps(snap, 0, steps, 4, &n, &err), RK_OK);
            assert_true(n >= 1);
            assert_int_equal(steps[0], s + 1);
        }
    }
    float p[8];
    memcpy(p, f.p, sizeof p);
    close_worker(&f); /* disk: step 8 (and 4) */
    assert_int_equal(rk_snap_steps(snap, 0, steps, 4, &n, &err), RK_OK);
    assert_int_equal(n, 2);
    assert_true(steps[0] >= 8);
    co.resume = 1;
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    assert_int_equal(start, steps[0]); /* from memory, at least as new as the disk */
    if (start == 9)
        assert_memory_equal(f.p, p, sizeof p);
    close_worker(&f);
    unsetenv(RK_SNAP_DIR_ENV);
    unsetenv("RK_SNAP_EVERY");
    assert_int_equal(rk_snap_dir_remove(snap, &err), RK_OK);
    rm_tree(parent);
    rm_tree(dir);
}

/* With RK_SNAP_PIN_EVERY=M the first put at or past each multiple of M is pinned (a fresh start
 * pins its first put; a resumed one counts from the step it resumed at), two pins kept; a
 * resume with the generations gone restores a pin, and says so. */
/* No room for partner copies (three times a rank's two generations) but room for the
 * snapshots: no pins, the generations kept, rank 0's note says why. MemAvailable is the test
 * override: the RAM margin (max(64 MiB, MemTotal / 10)) plus 250,000 bytes, between the two
 * needs of this worker's small state (2 x ~66 kB and 6 x ~66 kB). */
static void memory_snapshots_without_room_for_pins_keep_the_snapshots(void **state)
{
    (void)state;
    char dir[512], parent[512], snap[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 160];
    char name[RK_CKPT_NAME_MAX];
    assert_int_equal(test_dir_make(dir, sizeof dir, "test_worker_nopin_ck"), 0);
    assert_int_equal(test_dir_make(parent, sizeof parent, "test_worker_nopin_shm"), 0);
    rk_err err = {0};
    assert_int_equal(rk_snap_dir_make(parent, snap, sizeof snap, &err), RK_OK);
    unsigned long long total_kb = 0;
    FILE *mi = fopen("/proc/meminfo", "r");
    assert_non_null(mi);
    char line[256];
    while (fgets(line, sizeof line, mi))
        if (sscanf(line, "MemTotal: %llu kB", &total_kb) == 1)
            break;
    fclose(mi);
    assert_true(total_kb > 0);
    unsigned long long margin = total_kb * 1024 / 10, min = 64ull << 20;
    char avail[64];
    snprintf(avail, sizeof avail, "%llu", (margin > min ? margin : min) + 250000);
    setenv(RK_SNAP_MEMAVAIL_ENV, avail, 1);
    setenv(RK_SNAP_DIR_ENV, snap, 1);
    setenv("RK_SNAP_EVERY", "1", 1);
    setenv(RK_SNAP_PIN_EVERY_ENV, "2", 1);
    rk_worker_ckpt_opts co;
    rk_worker_ckpt_opts_default(&co);
    co.dir = dir;
    co.every = 100;
    co.config_json = "{\"test\":\"nopins\"}";
    int64_t start = -1, back;
    fixture f;
    g_notes = tmpfile();
    assert_non_null(g_notes);
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    for (int64_t s = 0; s < 5; s++) {
        assert_int_equal(rk_worker_step_begin(f.w, s, &back, &err), RK_OK);
        fake_step(&f);
        assert_int_equal(rk_worker_step_end(f.w, s + 1, 0.5, 0.001, &err), RK_OK);
    }
    close_worker(&f);
    char notes[4096] = "";
    rewind(g_notes);
    size_t got = fread(notes, 1, sizeof notes - 1, g_notes);
    notes[got] = '\0';
    fclose(g_notes);
    g_notes = NULL;
    if (!strstr(notes, "snapshot: no partner copies (no pins): "))
        print_error("notes:\n%s\n", notes);
    assert_non_null(strstr(notes, "snapshot: no partner copies (no pins): "));
    int64_t steps[8];
    size_t n = 0;
    assert_int_equal(rk_snap_steps(snap, 0, steps, 8, &n, &err), RK_OK);
    assert_int_equal(n, 2); /* the snapshots go on: 5 and 4, no pin */
    assert_int_equal(steps[0], 5);
    assert_int_equal(steps[1], 4);
    struct stat st;
    for (int64_t s = 1; s <= 5; s++) {
        assert_int_equal(rk_snap_pin_name(s, name, sizeof name), RK_OK);
        snprintf(p, sizeof p, "%s/rank-0/%s", snap, name);
        assert_int_equal(lstat(p, &st), -1);
    }
    unsetenv(RK_SNAP_MEMAVAIL_ENV);
    unsetenv(RK_SNAP_DIR_ENV);
    unsetenv("RK_SNAP_EVERY");
    unsetenv(RK_SNAP_PIN_EVERY_ENV);
    assert_int_equal(rk_snap_dir_remove(snap, &err), RK_OK);
    rm_tree(parent);
    rm_tree(dir);
}

static void memory_snapshots_pin_the_first_put_past_each_multiple(void **state)
{
    (void)state;
    char dir[512], parent[512], snap[RK_SNAP_PATH_MAX], p[RK_SNAP_PATH_MAX + 160];
    char name[RK_CKPT_NAME_MAX];
    assert_int_equal(test_dir_make(dir, sizeof dir, "test_worker_pin_ck"), 0);
    assert_int_equal(test_dir_make(parent, sizeof parent, "test_worker_pin_shm"), 0);
    rk_err err = {0};
    assert_int_equal(rk_snap_dir_make(parent, snap, sizeof snap, &err), RK_OK);
    setenv(RK_SNAP_DIR_ENV, snap, 1);
    setenv("RK_SNAP_EVERY", "1", 1);
    setenv(RK_SNAP_PIN_EVERY_ENV, "3", 1);
    rk_worker_ckpt_opts co;
    rk_worker_ckpt_opts_default(&co);
    co.dir = dir;
    co.every = 4;
    co.config_json = "{\"test\":\"pins\"}";
    int64_t start = -1, back;
    fixture f;
    float pp[10][8], ef[10][4];
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    assert_int_equal(start, 0);
    for (int64_t s = 0; s < 6; s++) { /* puts 1..6: pins 1, 3, 6; the newest two kept */
        assert_int_equal(rk_worker_step_begin(f.w, s, &back, &err), RK_OK);
        fake_step(&f);
        assert_int_equal(rk_worker_step_end(f.w, s + 1, 0.5, 0.001, &err), RK_OK);
        memcpy(pp[s + 1], f.p, sizeof f.p);
        memcpy(ef[s + 1], f.ef, sizeof f.ef);
    }
    close_worker(&f);
    int64_t steps[8];
    size_t n = 0;
    assert_int_equal(rk_snap_steps(snap, 0, steps, 8, &n, &err), RK_OK);
    assert_int_equal(n, 3);
    assert_int_equal(steps[0], 6);
    assert_int_equal(steps[1], 5);
    assert_int_equal(steps[2], 3); /* a pin only */
    struct stat st;
    const int64_t pinned[] = {3, 6}, gone[] = {1, 2, 4, 5};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(rk_snap_pin_name(pinned[i], name, sizeof name), RK_OK);
        snprintf(p, sizeof p, "%s/rank-0/%s", snap, name);
        assert_int_equal(lstat(p, &st), 0);
    }
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(rk_snap_pin_name(gone[i], name, sizeof name), RK_OK);
        snprintf(p, sizeof p, "%s/rank-0/%s", snap, name);
        assert_int_equal(lstat(p, &st), -1);
    }

    /* the generations gone (as on a host that kept only its pins): step 6's pin restores */
    for (int64_t s = 5; s <= 6; s++) {
        assert_int_equal(rk_snap_file_name(s, name, sizeof name), RK_OK);
        snprintf(p, sizeof p, "%s/rank-0/%s", snap, name);
        assert_int_equal(unlink(p), 0);
    }
    co.resume = 1;
    g_notes = tmpfile();
    assert_non_null(g_notes);
    open_worker(&f, 10);
    assert_int_equal(rk_worker_ckpt(f.w, &co, &start, &err), RK_OK);
    assert_int_equal(start, 6);
    assert_memory_equal(f.p, pp[6], sizeof f.p);
    assert_memory_equal(f.ef, ef[6], sizeof f.ef); /* memory: the local buffer too */
    for (int64_t s = 6; s < 9; s++) { /* puts 7, 8, 9: counted from 6, only 9 is pinned */
        assert_int_equal(rk_worker_step_begin(f.w, s, &back, &err), RK_OK);
        fake_step(&f);
        assert_int_equal(rk_worker_step_end(f.w, s + 1, 0.5, 0.001, &err), RK_OK);
    }
    close_worker(&f);
    char notes[4096] = "";
    rewind(g_notes);
    size_t got = fread(notes, 1, sizeof notes - 1, g_notes);
    notes[got] = '\0';
    fclose(g_notes);
    g_notes = NULL;
    if (!strstr(notes, "resuming from node memory at step 6 (a pinned generation)"))
        print_error("notes:\n%s\n", notes);
    assert_non_null(strstr(notes, "resuming from node memory at step 6 (a pinned generation)"));
    assert_int_equal(rk_snap_steps(snap, 0, steps, 8, &n, &err), RK_OK);
    assert_int_equal(n, 3);
    assert_int_equal(steps[0], 9);
    assert_int_equal(steps[1], 8);
    assert_int_equal(steps[2], 6);
    assert_int_equal(rk_snap_pin_name(9, name, sizeof name), RK_OK);
    snprintf(p, sizeof p, "%s/rank-0/%s", snap, name);
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(rk_snap_pin_name(3, name, sizeof name), RK_OK);
    snprintf(p, sizeof p, "%s/rank-0/%s", snap, name);
    assert_int_equal(lstat(p, &st), -1);
    unsetenv(RK_SNAP_DIR_ENV);
    unsetenv("RK_SNAP_EVERY");
    unsetenv(RK_SNAP_PIN_EVERY_ENV);
    assert_int_equal(rk_snap_dir_remove(snap, &err), RK_OK);
    rm_tree(parent);
    rm_tree(dir);
}

/* RK_CKPT_DIR and RK_RESUME, as rk run sets them, read in one place for rk train and the
 * runtime: an empty directory is none, only "1" resumes */
static void the_supervisors_checkpoint_env(void **state)
{
    (void)state;
    static const struct {
        const char *dir, *resume; /* NULL: unset */
        const char *want_dir;
        int want_resume;
    } cases[] = {
        {NULL, NULL, NULL, 0},    {"", "1", NULL, 1},      {"/ck", NULL, "/ck", 0},
        {"/ck", "1", "/ck", 1},   {"/ck", "0", "/ck", 0},  {"/ck", "", "/ck", 0},
        {"/ck", "yes", "/ck", 0}, {"/ck", "1 ", "/ck", 0}, {"/ck", "11", "/ck", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].dir)
            setenv("RK_CKPT_DIR", cases[i].dir, 1);
        else
            unsetenv("RK_CKPT_DIR");
        if (cases[i].resume)
            setenv("RK_RESUME", cases[i].resume, 1);
        else
            unsetenv("RK_RESUME");
        const char *dir = "unset";
        int resume = -1;
        rk_worker_ckpt_env(&dir, &resume);
        if (cases[i].want_dir)
            assert_string_equal(dir, cases[i].want_dir);
        else
            assert_null(dir);
        assert_int_equal(resume, cases[i].want_resume);
        rk_worker_ckpt_env(NULL, NULL); /* either may be NULL */
    }
    unsetenv("RK_CKPT_DIR");
    unsetenv("RK_RESUME");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registration_is_checked),
        cmocka_unit_test(snapshot_and_rollback),
        cmocka_unit_test(faults_land_in_registered_buffers),
        cmocka_unit_test(builtin_checkpoints_resume_the_same_bits),
        cmocka_unit_test(memory_snapshots_resume_before_the_disk),
        cmocka_unit_test(snapshot_every_counts_the_forced_puts),
        cmocka_unit_test(snapshot_every_is_chosen_again),
        cmocka_unit_test(memory_holds_the_disk_checkpoints_steps),
        cmocka_unit_test(memory_snapshots_pin_the_first_put_past_each_multiple),
        cmocka_unit_test(memory_snapshots_without_room_for_pins_keep_the_snapshots),
        cmocka_unit_test(the_supervisors_checkpoint_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
