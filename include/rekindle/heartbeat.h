/*
 * The heartbeat protocol between a training worker (one process per rank) and the `rk run`
 * supervisor. See docs/protocol.md for the protocol itself, with examples.
 *
 * Transport. The supervisor listens on a Unix stream socket and puts its path in the worker's
 * environment as RK_HEARTBEAT. Each rank connects once, at start, and says hello. Both
 * directions carry newline-delimited JSON: UTF-8, one object per line, at most
 * RK_HB_LINE_MAX (4096) bytes per line including the newline. Unknown fields are ignored;
 * unknown "type" or "cmd" values are errors.
 *
 *   worker -> supervisor ("type"): hello step comm event ckpt inject bye
 *   supervisor -> worker ("cmd"):  stop (checkpoint: parsed, never sent by rk run);
 *                                  rk_hb_cmd_format writes them
 *
 * Client (worker side). rk_hb_open connects and sends hello; with RK_HEARTBEAT unset (or
 * empty) there is no supervisor: the handle is NULL and every other call is a no-op on NULL.
 * Each send formats one whole line (rk_hb_msg_format) and writes it with
 * send(..., MSG_NOSIGNAL): never SIGPIPE; EINTR and short writes are retried; a send blocks
 * while the supervisor's socket buffer is full. A mutex keeps lines from two threads apart.
 * When the supervisor has gone (a send fails, or rk_hb_poll reads end of file) the handle
 * turns dead: that call (or the next, see rk_hb_poll) returns RK_EIO with a message
 * (rk_hb_error), and every later call is a silent no-op returning RK_OK. A worker must then
 * stop without writing another checkpoint: the supervisor has gone, and with it the job (the
 * protocol's rule; rk train does). A send with a bad argument returns RK_EINVAL,
 * sends nothing and leaves the handle alive.
 *
 * Parser (supervisor side). rk_hb_msg_parse and rk_hb_cmd_parse take one line without its
 * newline and check every field; rk_hb_lines splits a connection's byte stream into lines.
 * Errors are RK_EFORMAT with one line naming the field:
 *   heartbeat message: field "step": expected an integer >= 0
 *
 * Exit statuses of a worker (RK_EXIT_*) are part of the protocol: the supervisor decides
 * what to do next from them alone (an event with action "exit" before leaving is optional
 * detail). The supervisor (rk run) sends only "stop"; "checkpoint" is accepted for workers
 * driven by other tools.
 */
#ifndef REKINDLE_HEARTBEAT_H
#define REKINDLE_HEARTBEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rekindle/error.h"
#include "rekindle/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RK_HB_ENV "RK_HEARTBEAT" /* the socket path's environment variable */
#define RK_HB_VERSION 1          /* "v" in hello */
#define RK_HB_LINE_MAX 4096      /* bytes per line, newline included */
#define RK_HB_RANK_MAX 65535     /* ranks are 0..65535, world 1..65536 */
/* The largest step (and lost_steps) a message may carry: 2^53, exact in any JSON reader's
 * double and far beyond any run, so that a peer's claim cannot overflow what is computed from
 * it (twice a step, a ledger's index). */
#define RK_HB_STEP_MAX ((int64_t)1 << 53)
#define RK_HB_DETAIL_MAX 512 /* bytes of an event's detail */

/* Worker exit statuses. */
#define RK_EXIT_OK 0      /* finished (bye "done") */
#define RK_EXIT_FAIL 1    /* failed: the job's fault or an unexpected error */
#define RK_EXIT_USAGE 2   /* bad usage or bad input: relaunching will not help */
#define RK_EXIT_COMM 3    /* communication failure (a peer rank or the link died) */
#define RK_EXIT_STOPPED 4 /* stopped on command ("stop"), checkpoint saved (bye "stopped") */
#define RK_EXIT_GUARD 5   /* a guard tripped and could not recover in-process */
#define RK_EXIT_STORAGE                                                                            \
    6 /* storage refused a write or read the job needs (no space, read-only,                       \
       * permission denied, I/O error; the checkpoint directory above all):                        \
       * not a device's fault, relaunching will not help */

/* ---- messages --------------------------------------------------------------------------- */

typedef enum {
    RK_HB_HELLO,
    RK_HB_STEP,
    RK_HB_COMM,
    RK_HB_EVENT,
    RK_HB_CKPT,
    RK_HB_INJECT,
    RK_HB_BYE,
    RK_HB_SAVE /* appended: the values before it are unchanged */
} rk_hb_type;

/* One worker message. Fields a type does not carry are 0 / "" (blame 0 too).
 *
 *   type    fields (besides type, rank)           ranges
 *   hello   version world pid device step         version >= 1, world 1..65536, rank < world,
 *           stacks (optional)                     pid >= 1, device <= 63 bytes (may be "");
 *           restore (optional)                    stacks: true if the worker dumps its threads'
 *                                                 stacks on SIGUSR1 (absent, false: it does not);
 *                                                 restore: where the state at `step` came from,
 *                                                 "memory", "disk" or "none" (absent: unsaid)
 *   step    step loss(+loss_finite) dt            loss any finite number or null, dt >= 0
 *   comm    step
 *   event   step kind blame action lost_steps     kind, action: [a-z_]{1,31}; blame -1..65535
 *           detail                                (-1 unknown); lost_steps >= 0; detail <= 512
 *                                                 bytes, may be absent (= "")
 *   ckpt    step seconds                          seconds >= 0
 *   inject  step index kind                       index >= 0, kind [a-z_]{1,31}
 *   bye     step status                           status "done" or "stopped"
 *   save    step keep                             keep 1..1000: rank 0 asks rk run to write
 *                                                 the checkpoint of `step` from every rank's
 *                                                 pinned snapshot of it (RK_CKPT_FROM_SNAP),
 *                                                 keeping the newest `keep` checkpoints
 *
 * Always: rank 0..65535, step >= 0; numbers finite; strings valid UTF-8 without control
 * characters (U+0000-U+001F, U+007F-U+009F). A null loss (sent for NaN or infinity) reads as
 * loss = NAN, loss_finite = false. */
/* hello's optional "restore": where the state the rank starts from came from. */
typedef enum rk_hb_restore {
    RK_HB_RESTORE_UNSAID = 0, /* absent */
    RK_HB_RESTORE_NONE,       /* "none": a fresh start (no snapshot, no checkpoint) */
    RK_HB_RESTORE_DISK,       /* "disk": a checkpoint on disk */
    RK_HB_RESTORE_MEMORY,     /* "memory": the node's snapshot (rekindle/snap.h) */
    RK_HB_RESTORE_PEER        /* "peer": a rank kept in place sent its state (docs/recovery.md) */
} rk_hb_restore;

typedef struct rk_hb_msg {
    rk_hb_type type;
    int rank, world, blame, index, version;
    long pid;
    int64_t step, lost_steps;
    double loss, dt, seconds;
    bool loss_finite;
    bool stacks; /* hello: SIGUSR1 dumps the stacks to $RK_STACK_DIR (docs/protocol.md) */
    char device[64], kind[32], action[32], status[16], detail[RK_HB_DETAIL_MAX + 1];
    rk_hb_restore restore; /* hello (last: the layout before it is unchanged) */
    bool rejoin; /* hello: the rank can rejoin a new process group in place (docs/protocol.md) */
    int keep;    /* save: how many checkpoints the store keeps (last: the layout before it holds) */
} rk_hb_msg;

/* Parse one line (without its newline; need not be NUL-terminated) into *m. RK_EFORMAT with a
 * message naming the field for anything but a valid message; *m is then unspecified. */
RK_API int rk_hb_msg_parse(const char *line, size_t len, rk_hb_msg *m, rk_err *err);

/* The line for *m, newline included, NUL-terminated, into line[cap] (RK_HB_LINE_MAX always
 * suffices); its length without the NUL to *len (may be NULL). Fields in the documented
 * order; numbers in the shortest form that reads back to the same double; loss null unless
 * loss_finite. RK_EINVAL, with the same message the parser would give, if *m breaks a rule
 * above, so that whatever this writes rk_hb_msg_parse reads back equal (in every field the
 * type carries; the others are not written and read back as 0); RK_EINVAL if cap is too
 * small. */
RK_API int rk_hb_msg_format(const rk_hb_msg *m, char *line, size_t cap, size_t *len, rk_err *err);

/* "hello", "step", ...; "?" for a value outside the enum. */
RK_API const char *rk_hb_type_name(rk_hb_type t);
/* "memory", "disk", "none"; "" for RK_HB_RESTORE_UNSAID; "?" outside the enum. */
RK_API const char *rk_hb_restore_name(rk_hb_restore r);

/* ---- commands --------------------------------------------------------------------------- */

typedef enum { RK_HB_CMD_NONE, RK_HB_CMD_CHECKPOINT, RK_HB_CMD_STOP } rk_hb_cmd;

/* Parse one supervisor line ({"cmd":"checkpoint"} or {"cmd":"stop"}; other fields ignored).
 * RK_EFORMAT naming the field otherwise. */
RK_API int rk_hb_cmd_parse(const char *line, size_t len, rk_hb_cmd *cmd, rk_err *err);

/* The line for `cmd` ({"cmd":"stop"} or {"cmd":"checkpoint"}), newline included,
 * NUL-terminated, into line[cap] (RK_HB_CMD_LINE_MAX always suffices); its length without the
 * NUL to *len (may be NULL). What this writes, rk_hb_cmd_parse reads back as `cmd`. RK_EINVAL
 * for RK_HB_CMD_NONE or a value outside the enum (line[0] = '\0'), or if cap is too small. */
#define RK_HB_CMD_LINE_MAX 32
RK_API int rk_hb_cmd_format(rk_hb_cmd cmd, char *line, size_t cap, size_t *len, rk_err *err);

/* The rejoin command ({"cmd":"rejoin","epoch":E,"port":P}, docs/protocol.md), sent only to a
 * rank whose hello said "rejoin": leave the process group, join epoch E's at MASTER_PORT P.
 * E 1 .. 2^31-1, P 1 .. 65535, else RK_EINVAL (line[0] = '\0'); as rk_hb_cmd_format writes. */
#define RK_HB_REJOIN_LINE_MAX 64
RK_API int rk_hb_rejoin_format(int epoch, int port, char *line, size_t cap, size_t *len,
                               rk_err *err);

/* ---- line splitter ---------------------------------------------------------------------- */

/* Splits one connection's bytes into lines. Zero-initialise (or memset) before the first
 * feed: rk_hb_lines b = {0}. */
typedef struct rk_hb_lines {
    char buf[RK_HB_LINE_MAX];
    size_t used; /* bytes of an incomplete line held in buf */
} rk_hb_lines;

/* Feed n bytes; call on_line(ctx, line, len) for each complete line, without its newline and
 * NUL-terminated at len (a stray NUL byte inside the line stays: trust len). The tail of an
 * incomplete line is kept for the next feed. A line longer than RK_HB_LINE_MAX bytes with
 * its newline is RK_EFORMAT (the splitter is reset; the rest of this feed is dropped; the
 * stream cannot be trusted after it: close the connection). A nonzero return of on_line
 * stops the feed (the bytes after that line are dropped) and is returned. */
RK_API int rk_hb_lines_feed(rk_hb_lines *b, const char *data, size_t n,
                            int (*on_line)(void *ctx, const char *line, size_t len), void *ctx,
                            rk_err *err);

/* ---- client ----------------------------------------------------------------------------- */

typedef struct rk_hb rk_hb;

/* Connect to $RK_HEARTBEAT and send hello (version RK_HB_VERSION, this process's pid).
 * RK_HEARTBEAT unset or empty: *out = NULL and RK_OK. RK_EINVAL for a bad argument (rank
 * 0..65535 below world, world 1..65536, start_step >= 0, device NULL (= "") or <= 63 bytes
 * of UTF-8 without control characters) or a path too long for a Unix socket; RK_EIO naming
 * the path if it cannot connect or send; RK_ENOMEM. On failure *out = NULL. */
RK_API int rk_hb_open(rk_hb **out, int rank, int world, const char *device, int64_t start_step,
                      rk_err *err);
/* rk_hb_open whose hello also says where the state at start_step came from (`restore`;
 * RK_HB_RESTORE_UNSAID: the field is left out, as rk_hb_open does). RK_EINVAL outside the
 * enum. */
RK_API int rk_hb_open_restored(rk_hb **out, int rank, int world, const char *device,
                               int64_t start_step, rk_hb_restore restore, rk_err *err);

/* After step `step` was applied: its loss (NaN or infinite is sent as null) and the seconds
 * it took (>= 0, finite). */
RK_API int rk_hb_step(rk_hb *h, int64_t step, double loss, double dt_s);

/* About to enter the gradient collective of `step`. */
RK_API int rk_hb_comm(rk_hb *h, int64_t step);

/* A guard trip or suspicion at `step`: kind and action are words [a-z_]{1,31}; blame is the
 * rank held responsible (-1 unknown); lost_steps >= 0. `detail` (NULL = "") is free text: it
 * is cleaned, not refused: control characters and bytes that are not UTF-8 become '?', and
 * it is cut to 512 bytes on a character boundary. */
RK_API int rk_hb_event(rk_hb *h, int64_t step, const char *kind, int blame, const char *action,
                       int64_t lost_steps, const char *detail);

/* A checkpoint of `step` is durable; it took `seconds` (>= 0, finite). */
RK_API int rk_hb_ckpt(rk_hb *h, int64_t step, double seconds);

/* Injected fault number `index` (>= 0) of kind `kind` ([a-z_]{1,31}) is about to fire. The
 * line is on the socket when this returns. */
RK_API int rk_hb_inject(rk_hb *h, int64_t step, int index, const char *kind);

/* The worker is leaving: status "done" or "stopped". */
RK_API int rk_hb_bye(rk_hb *h, int64_t step, const char *status);

/* Read, without blocking, whatever commands arrived and return the most urgent pending one
 * (stop > checkpoint > none) in *cmd and RK_OK. Returning a command consumes all pending
 * ones (stop implies checkpoint). A line that is not a valid command: RK_EFORMAT (message
 * in rk_hb_error), *cmd = NONE, the handle stays alive and valid commands stay pending for
 * the next call. End of file: the handle turns dead; a command that arrived before it is
 * still returned (RK_OK), and RK_EIO comes on the next call. NULL h: NONE and RK_OK. */
RK_API int rk_hb_poll(rk_hb *h, rk_hb_cmd *cmd);

/* 1 while the supervisor is there, 0 when dead or NULL. Reads what arrived first, without
 * blocking (commands stay pending for rk_hb_poll; a bad line is reported by the next poll),
 * so a supervisor that has died, whose end of the socket the kernel closed, reads as 0 now.
 * A worker calls it right before it publishes a checkpoint: nothing is written after the
 * supervisor is gone (docs/protocol.md, "Transport"). */
RK_API int rk_hb_alive(rk_hb *h);

/* The last failure a call on h returned (code and message) into *err; returns its code,
 * RK_OK (empty message) if none. */
RK_API int rk_hb_error(rk_hb *h, rk_err *err);

/* Close the connection and free. NULL-safe. Does not send bye. */
RK_API void rk_hb_close(rk_hb *h);

#ifdef __cplusplus
}
#endif
#endif
