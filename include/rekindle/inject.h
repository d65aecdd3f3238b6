/*
 * Fault injection for `rk run`: a spec says which faults to inject, at which step or at random
 * times, on which rank; each rank parses it, arms it for itself, and asks every step which
 * faults fire now. The library only decides *when*; the caller does the damage (crash, hang,
 * NaN, bit flip, ...). See docs/inject.md for the kinds and examples.
 *
 * Grammar (ASCII, case-sensitive, at most RK_INJECT_SPEC_MAX bytes, RK_INJECT_MAX_FAULTS
 * faults):
 *
 *   spec   := fault (',' ' '* fault)*       spaces are allowed after a comma and nowhere else
 *   fault  := kind '@' param (':' param)*
 *   kind   := crash | hang | nan | bitflip | gradflip | slow | commfail
 *   param  := key '=' value
 *
 *   step=INT     0..2^62: the fault fires at this step
 *   mtbf=DUR     random arrivals instead of a fixed step (see below); DUR is a number with an
 *                optional unit ms, s, m or h (bare number = seconds): digits with an optional
 *                fraction ("120", "1.5h", "250ms"), no sign, no exponent; > 0 and at most
 *                1e9 s once converted
 *   rank=INT     0..65535: the rank it fires on
 *   seed=UINT64  0..2^64-1, only with mtbf= (default 1)
 *   ms=INT       only for slow: extra milliseconds of sleep per step, 1..600000 (default 100)
 *   for=INT      only for slow: how many steps it lasts, 1..2^62 (default: until the end)
 *
 * Every fault has exactly one of step= or mtbf=. INT is decimal digits only (leading zeros are
 * fine; "-1", "+1", "0x10", "12x" are not). A duplicate, unknown or misplaced key, an empty
 * value, a number out of range, an empty fault (",,", a trailing comma) or any stray byte is
 * an error.
 *
 * Ranks. A fault without rank= fires on rank 0 only, whatever its kind, with one exception: an
 * mtbf fault without rank= runs on every rank (rank -1 in rk_fault), each rank with its own
 * independent arrivals; rank= narrows it to one rank.
 *
 * Random faults. An mtbf fault's arrivals form a Poisson process: exponential inter-arrival
 * times with mean mtbf, in seconds since rk_inject_arm, drawn from a rekindle rng
 * (rekindle/rng.h) derived from (seed, fault index, rank, launch). The same inputs give the
 * same arrival times on every machine; a relaunch (launch + 1) gets fresh ones, so a crash
 * is not replayed at the same moment forever.
 *
 * Relaunches. The supervisor that restarts crashed ranks passes the indices of the faults that
 * already fired in earlier launches as the "done" list (RK_INJECT_DONE="0,3"); those never fire
 * again, so a step= crash resumed from an older checkpoint does not crash again.
 *
 * Errors: RK_EINVAL with one line "fault spec: position P: what is wrong", P the 1-based byte
 * position in the spec; input text is quoted with non-printable bytes as \xNN and cut at 40
 * bytes. RK_ENOMEM. The library never prints or exits.
 */
#ifndef REKINDLE_INJECT_H
#define REKINDLE_INJECT_H

#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_INJECT_SPEC_MAX 4096               /* bytes in a spec, without the NUL */
#define RK_INJECT_MAX_FAULTS 256              /* faults in a spec */
#define RK_INJECT_MAX_RANK 65535              /* highest rank= */
#define RK_INJECT_MAX_STEP ((int64_t)1 << 62) /* highest step= and for= */
#define RK_INJECT_MAX_MTBF_S 1e9              /* highest mtbf=, in seconds */
#define RK_INJECT_SLOW_MS_DEFAULT 100         /* ms= of a slow fault without it */
#define RK_INJECT_SLOW_MS_MAX 600000          /* highest ms= */
#define RK_INJECT_SEED_DEFAULT 1              /* seed= of an mtbf fault without it */

typedef enum rk_fault_kind {
    RK_FAULT_CRASH,    /* the rank process dies */
    RK_FAULT_HANG,     /* the rank stops making progress */
    RK_FAULT_NAN,      /* a NaN appears in the loss */
    RK_FAULT_BITFLIP,  /* one bit of a parameter flips */
    RK_FAULT_GRADFLIP, /* one bit of a gradient flips */
    RK_FAULT_SLOW,     /* the rank sleeps ms extra per step for `steps` steps */
    RK_FAULT_COMMFAIL  /* a collective fails */
} rk_fault_kind;

/* One parsed fault. Fields a fault does not use hold the values noted. */
typedef struct rk_fault {
    rk_fault_kind kind;
    int64_t step;  /* step= ; -1 when random (mtbf=) */
    int rank;      /* rank= ; 0 when absent, except -1 (every rank) for mtbf faults */
    double mtbf_s; /* mtbf= in seconds; 0 when fixed (step=) */
    uint64_t seed; /* seed= of an mtbf fault (default 1); 0 when fixed */
    int ms;        /* slow: ms= (default 100); 0 for other kinds */
    int64_t steps; /* slow: for= ; 0 = until the end (and for other kinds) */
} rk_fault;

/* The parsed list and the runtime state of the rank it is armed for. */
typedef struct rk_inject rk_inject;

/* Parse `spec` into a new list (*out; free with rk_inject_free). NULL or "" is an empty list.
 * On error *out is NULL and err says where and what (see above). */
RK_API int rk_inject_parse(const char *spec, rk_inject **out, rk_err *err);

/* NULL-safe. */
RK_API void rk_inject_free(rk_inject *inj);

/* The number of faults (0 for NULL) and fault i in spec order (NULL if i is out of range). */
RK_API size_t rk_inject_count(const rk_inject *inj);
RK_API const rk_fault *rk_inject_get(const rk_inject *inj, size_t i);

/* "crash", "hang", "nan", "bitflip", "gradflip", "slow", "commfail"; "unknown" otherwise. */
RK_API const char *rk_fault_kind_name(rk_fault_kind k);

/* The canonical text of the list into buf[cap], NUL-terminated: faults in order, ',' between
 * them, keys in the order step/mtbf, rank, seed, ms, for, each only when it differs from its
 * default, numbers without leading zeros, mtbf as the shortest decimal in the unit (bare
 * seconds, m, h or ms) that parses back to exactly the same double. It parses back to the
 * same list and is never longer than the spec it came from, so RK_INJECT_SPEC_MAX + 1 bytes
 * always suffice. NULL is the empty list (""). RK_EINVAL if buf is NULL or cap is too small
 * (buf then holds "" when cap > 0). */
RK_API int rk_inject_format(const rk_inject *inj, char *buf, size_t cap);

/* ---- runtime, in one rank ----------------------------------------------------------------- */

/* Arm the list for `rank` (0..RK_INJECT_MAX_RANK) in launch number `launch` (0 for the first
 * start, +1 per relaunch): fixed faults become pending again, and every random fault that
 * applies to the rank draws its first arrival. `done` is NULL, "" or a comma list of fault
 * indices (decimal, below rk_inject_count, spaces allowed after commas, repeats allowed)
 * that fired in earlier launches; they never fire. A bad list is RK_EINVAL
 * ("fault done list '...': position P: ...") and leaves the list as it was. Arming again
 * starts over (a new launch); rk_inject_mark_done marks stay. */
RK_API int rk_inject_arm(rk_inject *inj, int rank, uint64_t launch, const char *done, rk_err *err);

/* The faults that fire now on the armed rank, for the caller to apply: their indices go to
 * idx[0..cap) in index order and the count is returned.
 *   - a fixed fault fires when `step` equals its step, once per arm: asking for the same
 *     step again does not return it again;
 *   - a random fault fires when its next arrival is <= elapsed_s (seconds since arm); its
 *     next arrival is then drawn from the same stream (last arrival + a new draw). One call
 *     returns each index at most once, so arrivals that fell behind fire on later calls.
 * A slow fault is returned at its first step only; the caller keeps it going for ms/steps.
 * Faults of other ranks, in the done list or marked done never fire. Faults that did not fit
 * in cap are not consumed: call again with the same step. 0 before rk_inject_arm. */
RK_API size_t rk_inject_due(rk_inject *inj, int64_t step, double elapsed_s, size_t *idx,
                            size_t cap);

/* Never fire fault i again in this process (re-arming does not undo it). Out of range: no-op. */
RK_API void rk_inject_mark_done(rk_inject *inj, size_t i);

/* The next arrival of random fault i on the armed rank, in seconds since arm; INFINITY if it
 * will not fire (not armed, fixed, another rank's, done, out of range). */
RK_API double rk_inject_next_arrival(const rk_inject *inj, size_t i);

/* Parse RK_INJECT and arm it for `rank` with RK_INJECT_DONE (the done list) and RK_LAUNCH
 * (decimal launch number, 0 when unset). No RK_INJECT: *out = NULL and RK_OK (injection off).
 * Errors (RK_EINVAL) start with the variable's name ("RK_INJECT: fault spec: position ..."). */
RK_API int rk_inject_from_env(rk_inject **out, int rank, rk_err *err);

#ifdef __cplusplus
}
#endif
#endif
