/*
 * The worker runtime's snapshots in memory (rekindle/worker.h, docs/recovery.md "Relaunch
 * from memory"): every K steps each rank puts its registered buffers into the node's snapshot
 * store (rekindle/snap.h, RK_SNAP_DIR); a relaunched job restores the agreed step from there
 * when it is at least as new as the newest checkpoint on disk. The agreed step is computed by
 * the ranks over the world (each verifies its own, an all-gather), so the ranks of several
 * hosts, each host's in its own directory, agree as one host's do; with RK_SNAP_PIN_EVERY=M the
 * first put past each multiple of M is also pinned (partner copies). Relies on the store's
 * checks.
 */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "rekindle/guard.h"
#include "rekindle/snap.h"
#include "runtime/worker_internal.h"

#define MEM_TIMED 3   /* puts timed (after the first) before K is first chosen */
#define MEM_SETTLED 8 /* steps seen before a choice from which the median counts */
/* K is chosen again at these counts of puts, from the puts and steps since it last was (the
 * first steps are slow: the other ranks' start, the first buckets), as the Python Job does
 * (_RETIMED, python/rekindle/torch/_memory.py); the last is where timing ends */
static const int mem_retimed[] = {16, 64, RK_WORKER_MEM_TIMED_LAST};
#define MEM_COST_MAX 0.01      /* a put may cost at most this share of K steps */
#define MEM_HEADER_BYTES 65536 /* the room rule's allowance for a generation's header */
#define MEM_PIN_AUTO_S 30.0    /* RK_SNAP_PIN_EVERY=auto: a pin about this often */
#define MEM_PIN_AUTO_MAX 1e9   /* ... at most every this many steps */

/* The buffers a snapshot holds: what a rollback restores (PARAM, STATE, LOCAL), under their
 * names, F32 or U8, one dimension: the built-in checkpoint's items and this rank's own. */
static size_t mem_items(const rk_worker *w, rk_ckpt_item *items, uint64_t *bytes)
{
    size_t n = 0;
    *bytes = MEM_HEADER_BYTES;
    for (int i = 0; i < w->nbufs; i++) {
        const wbuf *b = &w->bufs[i];
        if (b->kind == RK_WORKER_GRAD)
            continue;
        items[n++] = (rk_ckpt_item){.name = b->name,
                                    .dtype = b->f32 ? "F32" : "U8",
                                    .ndim = 1,
                                    .shape = b->shape,
                                    .data = b->data};
        *bytes += b->bytes + 128;
    }
    return n;
}

void rk_worker_mem_init(rk_worker *w)
{
    const char *d = getenv(RK_SNAP_DIR_ENV);
    w->mem_on = d && *d && strlen(d) < sizeof w->mem_dir;
    w->mem_room_checked = 0;
    w->mem_every = 1;
    w->mem_next = 0;
    w->mem_timed = 0;
    w->mem_put_s = 0;
    w->mem_nput = w->mem_nsteps = 0;
    if (w->mem_on)
        snprintf(w->mem_dir, sizeof w->mem_dir, "%s", d);
    /* RK_SNAP_EVERY=K (tests and benches): K fixed, the puts not timed */
    const char *k = getenv("RK_SNAP_EVERY");
    char *end = NULL;
    long long every = k && *k ? strtoll(k, &end, 10) : 0;
    if (every >= 1 && end && !*end) {
        w->mem_every = every;
        w->mem_timed = RK_WORKER_MEM_TIMED_LAST; /* never timed */
    } else if (k && *k && w->diag)
        fprintf(w->diag, "%s (rank %d): RK_SNAP_EVERY=%s is not a whole number >= 1: ignored\n",
                w->name, w->rank, k);
    /* RK_SNAP_PIN_EVERY=M (partner copies: the step the node's agent streams to another host
     * stays held here, docs/recovery.md): 0 or unset, no pins; "auto": M chosen at the
     * (MEM_TIMED + 1)th put for a pin every MEM_PIN_AUTO_S (mem_choose_pin), until then only
     * the first put is pinned */
    const char *m = getenv(RK_SNAP_PIN_EVERY_ENV);
    end = NULL;
    long long pin = m && *m && strcmp(m, "auto") != 0 ? strtoll(m, &end, 10) : 0;
    w->mem_pin_every = 0;
    w->mem_pin_auto = 0;
    w->mem_pin_last = INT64_MIN;
    w->mem_puts = 0;
    w->mem_fastest_s = 0;
    if (m && strcmp(m, "auto") == 0) {
        w->mem_pin_auto = 1;
        w->mem_pin_every = INT64_MAX;
    } else if (pin >= 0 && end && !*end)
        w->mem_pin_every = pin;
    else if (m && *m && w->diag)
        fprintf(w->diag,
                "%s (rank %d): " RK_SNAP_PIN_EVERY_ENV
                "=%s is not a whole number >= 0 or auto: ignored\n",
                w->name, w->rank, m);
}

/* RK_SNAP_PIN_EVERY=auto: M for a pin every MEM_PIN_AUTO_S at the fastest step of the puts so
 * far, at least K; rank 0's, broadcast (every rank pins the same steps). */
static int mem_choose_pin(rk_worker *w, rk_err *err)
{
    double m = (double)w->mem_every;
    if (w->rank == 0) {
        double step = w->mem_fastest_s;
        m = step > 0 ? ceil(MEM_PIN_AUTO_S / step) : (double)MEM_PIN_AUTO_MAX;
        m = m < (double)w->mem_every ? (double)w->mem_every
            : m > MEM_PIN_AUTO_MAX   ? MEM_PIN_AUTO_MAX
                                     : m;
        if (w->notes)
            fprintf(w->notes,
                    "snapshot: a pin for the partner copies every %.0f steps (a step %.2f ms: "
                    "about every %.0f s)\n",
                    m, step * 1e3, MEM_PIN_AUTO_S);
    }
    int rc = w->world > 1 ? rk_comm_bcast(w->comm, &m, sizeof m, 0, err) : RK_OK;
    if (!rc)
        w->mem_pin_every = (int64_t)m;
    return rc;
}

/* After every rank's put of step s: pin it when it is the first put at or past a multiple of
 * M (every rank decides the same: the puts are collective, at the same steps; a rank whose
 * put was refused for a non-finite value, `made` 0, decides too but has nothing to pin). A pin
 * that fails is said in the rank's diag; the job goes on. */
static void mem_pin(rk_worker *w, int64_t s, int made)
{
    if (w->mem_pin_last == INT64_MIN) /* the first put of this process */
        w->mem_pin_last = w->restore == RK_HB_RESTORE_NONE ? -1 : w->start_step;
    int64_t m = w->mem_pin_every, last = w->mem_pin_last;
    w->mem_pin_last = s;
    if (m < 1 || !made || (last >= 0 && s / m == last / m))
        return;
    rk_err e = {0};
    if (rk_snap_pin(w->mem_dir, w->rank, s, &e) && w->diag)
        fprintf(w->diag, "%s (rank %d): pin of the snapshot of step %lld: %s\n", w->name, w->rank,
                (long long)s, e.msg);
}

/* Snapshots off for the rest of this process (and, through the event, of the job: rk run
 * stops passing RK_SNAP_DIR): rank 0 says why, once. */
static void mem_off(rk_worker *w, int64_t step, const char *why)
{
    w->mem_on = 0;
    if (w->rank != 0)
        return;
    rk_hb_event(w->hb, step, "snapshot_off", -1, "disk_only", 0, why);
    if (w->notes)
        fprintf(w->notes, "snapshot: off, checkpoints on disk only: %s\n", why);
}

/* K, the steps between puts (docs/recovery.md, "When it is put"): the smallest K >= 1 with the
 * puts' time at most MEM_COST_MAX of the steps', at most `cap`; `cap` when the step time is
 * unknown. Without forced puts (forced 0) that is put / (K x step) <= MEM_COST_MAX. With the
 * step of every disk checkpoint put too (forced: their interval), K counting from each put,
 * (forced - 1) / K + 1 puts (integer division) fall in each `forced` steps: K is the smallest
 * with that many within the budget (the forced ones alone over it: `cap`). The Python Job's
 * rule is the same (snap_every, python/rekindle/torch/_memory.py). */
double rk_worker_snap_every(double put, double step, int64_t cap, int64_t forced)
{
    if (cap < 1)
        cap = 1;
    if (!(step > 0))
        return (double)cap;
    double k;
    if (forced > 1) {
        double budget = floor(MEM_COST_MAX * (double)forced * step / put + 1e-9); /* puts allowed */
        if (!(budget >= 1))
            return (double)cap;
        k = budget >= (double)forced ? 1.0 : (double)((forced - 1) / (int64_t)budget + 1);
    } else {
        k = ceil(put / (MEM_COST_MAX * step) - 1e-9);
    }
    return k < 1 ? 1 : k > (double)cap ? (double)cap : k;
}

/* K from the puts timed since the last choice (put: their mean; step: the fastest step before
 * them while few, the median once MEM_SETTLED or more), at most the disk checkpoints'
 * interval, their steps counted as puts when the interval is fixed. Rank 0's numbers,
 * broadcast: every rank puts the same steps. Said at the first choice and when K changes. */
static int mem_choose_every(rk_worker *w, rk_err *err)
{
    double k = (double)w->mem_every, was = k;
    if (w->rank == 0 && w->mem_nput > 0) {
        double put = w->mem_put_s / w->mem_nput, step = 0;
        int n = w->mem_nsteps;
        if (n >= MEM_SETTLED)
            step = rk_median_sort(w->mem_steps, n);
        else
            for (int i = 0; i < n; i++)
                if (i == 0 || w->mem_steps[i] < step)
                    step = w->mem_steps[i];
        int64_t cap = w->every > 0 ? w->every : RK_CKPT_EVERY_DEFAULT;
        k = rk_worker_snap_every(put, step, cap, w->every > 0 ? w->every : 0);
        int first = w->mem_timed == MEM_TIMED + 1;
        if (w->notes && (first || k != was))
            fprintf(w->notes,
                    "snapshot: a put takes %.2f ms, a step %.2f ms%s: one every %.0f step%s%s "
                    "(at most %.0f%% of the steps' time, at most every %lld)\n",
                    put * 1e3, step * 1e3, n < MEM_SETTLED ? "" : " (a median)", k,
                    k == 1 ? "" : "s", first ? "" : " (chosen again)", MEM_COST_MAX * 100,
                    (long long)cap);
    }
    w->mem_put_s = 0;
    w->mem_nput = w->mem_nsteps = 0;
    int rc = w->world > 1 ? rk_comm_bcast(w->comm, &k, sizeof k, 0, err) : RK_OK;
    if (!rc)
        w->mem_every = (int64_t)k;
    return rc;
}

/* Whether K is chosen at this count of puts. */
static int mem_choice_due(int timed)
{
    if (timed == MEM_TIMED + 1)
        return 1;
    for (size_t i = 0; i < sizeof mem_retimed / sizeof mem_retimed[0]; i++)
        if (timed == mem_retimed[i])
            return 1;
    return 0;
}

/* Every rank checks its own node's room for two generations of its node's ranks
 * (rk_snap_room: the node of RK_SNAP_DIR, which across hosts is each host's own); every rank
 * learns whether all fit (one all-gather). 0 off (then the caller turns snapshots off with
 * `why`: the rule's numbers on a rank that found no room, its rank elsewhere). */
static int mem_room(rk_worker *w, const char *what, uint64_t bytes, int *ok, char *why, size_t cap,
                    rk_err *err)
{
    rk_err e = {0};
    int r = 0;
    if (rk_snap_room(w->mem_dir, bytes, rk_comm_local_size(w->comm), &r, why, cap, &e)) {
        snprintf(why, cap, "%s", e.msg);
        r = 0;
    }
    int rc = RK_OK;
    if (w->world > 1)
        rc = rk_comm_allgather_u64(w->comm, (uint64_t)(r != 0), w->gather, err);
    else
        w->gather[0] = (uint64_t)(r != 0);
    *ok = 1;
    for (int k = 0; !rc && k < w->world && *ok; k++)
        if (!w->gather[k]) {
            *ok = 0;
            if (k != w->rank || r) /* this rank's own reason stays as the rule said it */
                snprintf(why, cap, "rank %d found no room for %s on its node", k, what);
        }
    if (!*ok && !r && w->rank != 0 && w->diag)
        fprintf(w->diag, "%s (rank %d): no room for %s on this node: %s\n", w->name, w->rank, what,
                why);
    return rc;
}

int rk_worker_mem_step_end(rk_worker *w, int64_t steps_done, double step_s, int force, int *put,
                           rk_err *err)
{
    *put = 0;
    if (!w->mem_on || (steps_done < w->mem_next && !force))
        return RK_OK;
    rk_ckpt_item *items = malloc((size_t)(w->nbufs + 1) * sizeof *items);
    uint64_t bytes = 0;
    size_t n = items ? mem_items(w, items, &bytes) : 0;
    char why[RK_HB_DETAIL_MAX + 1] = "";
    int rc = RK_OK;
    if (!w->mem_room_checked) { /* the size is known only now */
        int ok = 0;
        w->mem_room_checked = 1;
        /* with partner copies a node holds up to three times a rank's two generations: its
         * own, its two pins (files of their own once their generations rolled on) and two of
         * a partner's rank (as many ranks a node assumed: docs/recovery.md "Partner copies").
         * No room for that: the pins go (no partner copies), the snapshots stay if they fit */
        if (w->mem_pin_every > 0 &&
            !(rc = mem_room(w, "partner copies", 3 * bytes, &ok, why, sizeof why, err)) && !ok) {
            w->mem_pin_every = 0;
            w->mem_pin_auto = 0; /* and not chosen again at the 4th put */
            if (w->rank == 0 && w->notes)
                fprintf(w->notes, "snapshot: no partner copies (no pins): %s\n", why);
        }
        if (!rc && !ok)
            rc = mem_room(w, "snapshots", bytes, &ok, why, sizeof why, err);
        if (rc || !ok) {
            free(items);
            if (!rc)
                mem_off(w, steps_done, why);
            return rc;
        }
    }
    rk_ckpt_meta meta = {.step = steps_done, .world_size = w->world, .config_json = w->config};
    rk_err e = {0};
    double t0 = rk_mono_s();
    int prc = items ? rk_snap_put(w->mem_dir, w->rank, &meta, items, n, &e)
                    : rk_err_set(&e, RK_ENOMEM, "snapshot: out of memory");
    double took = rk_mono_s() - t0;
    free(items);
    *put = 1;
    if (prc && prc != RK_ENONFINITE && w->diag)
        fprintf(w->diag, "%s (rank %d): snapshot of step %lld: %s\n", w->name, w->rank,
                (long long)steps_done, e.msg);
    /* every rank learns whether every rank's put was made: all go on putting, or none */
    uint64_t mine = prc == RK_ENONFINITE ? 0 : (uint64_t)(unsigned)prc;
    if (w->world > 1) {
        if ((rc = rk_comm_allgather_u64(w->comm, mine, w->gather, err)))
            return rc;
    } else
        w->gather[0] = mine;
    for (int r = 0; r < w->world; r++)
        if (w->gather[r]) {
            snprintf(why, sizeof why, "rank %d could not put its snapshot of step %lld: %.400s", r,
                     (long long)steps_done, r == w->rank ? e.msg : rk_strerror((int)w->gather[r]));
            mem_off(w, steps_done, why);
            return RK_OK;
        }
    mem_pin(w, steps_done, prc == RK_OK);
    w->mem_puts++;
    if (step_s > 0 && (w->mem_fastest_s <= 0 || step_s < w->mem_fastest_s))
        w->mem_fastest_s = step_s;
    w->mem_next = steps_done + w->mem_every;
    /* K: the first put makes the rank's directory and is not timed; the next are, K chosen at
     * the (MEM_TIMED + 1)th and again at each count of mem_retimed. Counted on every rank
     * whether its put was made or refused (a non-finite state, this rank's alone): every rank
     * meets each broadcast; only a put made is timed */
    if (w->mem_timed < RK_WORKER_MEM_TIMED_LAST) {
        if (w->mem_timed++ > 0 && !prc) {
            w->mem_put_s += took;
            w->mem_nput++;
            if (step_s > 0 && w->mem_nsteps < RK_WORKER_MEM_TIMED_LAST)
                w->mem_steps[w->mem_nsteps++] = step_s;
        }
        if (mem_choice_due(w->mem_timed)) {
            if ((rc = mem_choose_every(w, err)))
                return rc;
            w->mem_next = steps_done + w->mem_every;
        }
    }
    if (w->mem_pin_auto && w->mem_puts == MEM_TIMED + 1 && (rc = mem_choose_pin(w, err)))
        return rc; /* after K: every rank's puts counted alike */
    return RK_OK;
}

/* The newest checkpoint step in the disk directory by its file names (-1: none). The file is
 * not read: the disk resume verifies what it loads. */
static int64_t newest_disk_step(const char *dir)
{
    int64_t newest = -1, s;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (rk_ckpt_name_step(e->d_name, &s) && s > newest)
            newest = s;
    closedir(d);
    return newest;
}

/* Generation `c` holds every snapshotted buffer of this worker, same dtype and size, and is of
 * this run (config) and world. */
static int mem_fits(const rk_worker *w, const rk_ckpt *c, rk_err *err)
{
    const rk_ckpt_meta *m = rk_ckpt_meta_of(c);
    if (m->world_size != w->world || !m->config_json || strcmp(m->config_json, w->config) != 0)
        return rk_err_set(err, RK_EMISMATCH, "%s: of another run (world %d, config %s)",
                          rk_ckpt_path(c), m->world_size, m->config_json ? m->config_json : "");
    for (int i = 0; i < w->nbufs; i++) {
        const wbuf *b = &w->bufs[i];
        if (b->kind == RK_WORKER_GRAD)
            continue;
        const rk_st_tensor *t = rk_ckpt_find(c, b->name);
        if (!t || t->nbytes != b->bytes || strcmp(t->dtype, b->f32 ? "F32" : "U8") != 0)
            return rk_err_set(err, RK_EMISMATCH, "%s: %s is missing or of another size",
                              rk_ckpt_path(c), b->name);
    }
    return RK_OK;
}

/* This rank's own generations and pins that verify in full and are of this run (rk_snap_get,
 * mem_fits), newest first: up to RK_SNAP_HELD_MAX steps into mine[] (the rest -1), the newest
 * one read kept in *newest (NULL if none). What did not verify is said in the rank's diag. */
static void mem_verified(rk_worker *w, int64_t mine[RK_SNAP_HELD_MAX], rk_ckpt **newest)
{
    int64_t steps[8];
    size_t n = 0, got = 0;
    rk_err e = {0};
    *newest = NULL;
    for (int k = 0; k < RK_SNAP_HELD_MAX; k++)
        mine[k] = -1;
    if (rk_snap_steps(w->mem_dir, w->rank, steps, 8, &n, &e)) {
        if (w->diag)
            fprintf(w->diag, "%s (rank %d): snapshots: %s\n", w->name, w->rank, e.msg);
        return;
    }
    for (size_t i = 0; i < n && i < 8 && got < RK_SNAP_HELD_MAX; i++) {
        rk_ckpt *c = NULL;
        rk_err ge = {0};
        int grc = rk_snap_get(w->mem_dir, w->rank, steps[i], &c, &ge);
        if (!grc)
            grc = mem_fits(w, c, &ge);
        if (grc) {
            if (w->diag)
                fprintf(w->diag, "%s (rank %d): snapshot of step %lld skipped: %s\n", w->name,
                        w->rank, (long long)steps[i], ge.msg);
            rk_ckpt_free(c);
            continue;
        }
        mine[got++] = steps[i];
        if (!*newest)
            *newest = c;
        else
            rk_ckpt_free(c);
    }
}

int rk_worker_mem_resume(rk_worker *w, int64_t *step, int *used, rk_err *err)
{
    *used = 0;
    if (!w->mem_on) /* the same on every rank: RK_SNAP_DIR is the job's (each host's) */
        return RK_OK;
    /* The agreed step over the world, with no directory shared between the ranks (each
     * host keeps its own ranks'): every rank verifies its own generations and pins in full,
     * every rank learns every rank's verified steps (an all-gather a step held, up to
     * RK_SNAP_HELD_MAX), and the newest step all have is the agreed one. Never a mix of
     * steps. */
    int64_t mine[RK_SNAP_HELD_MAX];
    rk_ckpt *c = NULL;
    mem_verified(w, mine, &c);
    int64_t *all = calloc((size_t)w->world * RK_SNAP_HELD_MAX, sizeof *all);
    if (!all) {
        rk_ckpt_free(c);
        return rk_err_set(err, RK_ENOMEM, "snapshot: out of memory");
    }
    int rc = RK_OK;
    for (int k = 0; k < RK_SNAP_HELD_MAX && !rc; k++) {
        uint64_t v = (uint64_t)(mine[k] + 1); /* 0: none */
        if (w->world > 1)
            rc = rk_comm_allgather_u64(w->comm, v, w->gather, err);
        else
            w->gather[0] = v;
        for (int r = 0; !rc && r < w->world; r++)
            all[(size_t)r * RK_SNAP_HELD_MAX + (size_t)k] = (int64_t)w->gather[r] - 1;
    }
    int64_t agreed = -1;
    int any = 0; /* some rank holds a generation */
    for (size_t i = 0; !rc && i < (size_t)w->world * RK_SNAP_HELD_MAX; i++)
        any |= all[i] >= 0;
    if (!rc)
        (void)rk_snap_agree_held(all, w->world, RK_SNAP_HELD_MAX, &agreed, NULL);
    free(all);
    if (rc) {
        rk_ckpt_free(c);
        return rc;
    }
    /* rank 0 weighs it against the newest checkpoint on disk; every rank learns the decision */
    int64_t hdr[2] = {0, agreed};
    if (w->rank == 0) {
        int64_t disk = newest_disk_step(w->dir);
        if (agreed >= 0 && agreed >= disk)
            hdr[0] = 1;
        else if (agreed >= 0 && w->notes)
            fprintf(w->notes,
                    "snapshot: step %lld in memory is older than the checkpoint of step %lld on "
                    "disk: resuming from disk\n",
                    (long long)agreed, (long long)disk);
        else if (w->notes && any)
            fprintf(w->notes, "snapshot: no step that every rank holds in memory: resuming "
                              "from disk\n");
    }
    rc = rk_comm_share_status(w->world > 1 ? w->comm : NULL, RK_OK, hdr, 2, NULL, err);
    if (rc || !hdr[0]) {
        rk_ckpt_free(c);
        return rc;
    }
    /* every rank's generation of that step (verified above; read again if it is not the
     * newest); all or none restore */
    rk_err e = {0};
    int grc = RK_OK;
    if (!c || rk_ckpt_meta_of(c)->step != hdr[1]) {
        rk_ckpt_free(c);
        c = NULL;
        grc = rk_snap_get(w->mem_dir, w->rank, hdr[1], &c, &e);
        if (!grc)
            grc = mem_fits(w, c, &e);
    }
    if (grc && w->diag)
        fprintf(w->diag, "%s (rank %d): snapshot of step %lld not restored: %s\n", w->name, w->rank,
                (long long)hdr[1], e.msg);
    if (w->world > 1) {
        if ((rc = rk_comm_allgather_u64(w->comm, grc != RK_OK, w->gather, err))) {
            rk_ckpt_free(c);
            return rc;
        }
    } else
        w->gather[0] = grc != RK_OK;
    for (int r = 0; r < w->world; r++)
        if (w->gather[r]) {
            if (w->notes)
                fprintf(w->notes,
                        "snapshot: rank %d could not restore step %lld from memory: resuming "
                        "from disk\n",
                        r, (long long)hdr[1]);
            rk_ckpt_free(c);
            return RK_OK;
        }
    /* rank 0's note says when its generation of that step is a pin only */
    const char *path = rk_ckpt_path(c), *base = path ? strrchr(path, '/') : NULL;
    int pinned = base && rk_snap_pin_name_step(base + 1, NULL);
    /* rank 0's replicated buffers (broadcast, as a disk resume does) and each rank's own
     * local ones: one step, never mixed */
    for (int i = 0; i < w->nbufs; i++) {
        wbuf *b = &w->bufs[i];
        if (b->kind == RK_WORKER_GRAD || (replicated(b) && w->rank != 0))
            continue;
        memcpy(b->data, rk_ckpt_find(c, b->name)->data, b->bytes);
    }
    rk_ckpt_free(c);
    for (int i = 0; i < w->nbufs && w->world > 1 && !rc; i++)
        if (replicated(&w->bufs[i]))
            rc = rk_comm_bcast(w->comm, w->bufs[i].data, w->bufs[i].bytes, 0, err);
    if (rc)
        return rc;
    if (w->notes)
        fprintf(w->notes, "snapshot: resuming from node memory at step %lld%s (%s)\n",
                (long long)hdr[1], pinned ? " (a pinned generation)" : "", w->mem_dir);
    *step = hdr[1];
    *used = 1;
    return RK_OK;
}
