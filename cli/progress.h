/*
 * Progress and status lines for every rk subcommand (docs/cli.md, "Progress output").
 *
 * Two modes, chosen once per stream by rk_progress_init:
 *
 *   live   the stream is a terminal (isatty), TERM is not "dumb" and NO_COLOR is unset or
 *          empty: one line redrawn in place ("\r" + text + "\033[K"), fitted to the
 *          terminal's width minus one column (a line that reaches the last column wraps on
 *          some terminals, and then "\r" no longer returns to its start). The width is read
 *          again on every draw (TIOCGWINSZ), so a resized window (SIGWINCH) is followed with
 *          no signal handler.
 *   plain  anything else (a pipe, a file, TERM=dumb, NO_COLOR): a full line, never cut, at
 *          every tenth of progress (plain_lines), with no "\r" and no escape
 *          bytes; the caller prints the closing line with rk_progress_say.
 *
 * NO_COLOR is read as "keep the output plain": these lines have no colour, and the people who
 * set it mostly want output that a screen reader or a log can take as it is.
 *
 * A line is built from parts (rk_progress_parts). When they do not fit, rk_progress_fit drops
 * the ETA first, then the rate, then the bar, and only then cuts the line at the width. The
 * functions take one progress stream each and are not thread-safe: draw and say from one
 * thread.
 */
#ifndef RK_CLI_PROGRESS_H
#define RK_CLI_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define RK_PROGRESS_BAR_MAX 30 /* the bar's cells at most ... */
#define RK_PROGRESS_BAR_MIN 10 /* ... and at least, or it is dropped */

/* The parts of one progress line, in the order they are shown. NULL or "" leaves a part out.
 * The text is expected to be printable; a UTF-8 sequence counts as one column. */
typedef struct rk_progress_parts {
    const char *label;  /* always kept, cut last: "epoch 1/3", "burn 12s" */
    double frac;        /* the bar's fill, 0..1; negative: no bar */
    const char *counts; /* "step 94/938" */
    const char *detail; /* the quantity watched: "loss 0.4123", a GPU's phase */
    const char *rate;   /* "812 samples/s": dropped second */
    const char *eta;    /* "ETA 1:05": dropped first */
} rk_progress_parts;

#define RK_PROGRESS_NOTES 2 /* rk_progress_notes streams per progress stream */

typedef struct rk_progress rk_progress;

/* One stream of rk_progress_notes's (its own): the line being written, kept until its newline
 * or until it outgrows the terminal. */
typedef struct rk_progress_note {
    rk_progress *p;
    FILE *to, *f;
    char *pend;
    size_t len;
    int cols, indent;
    bool wrapped, failed;
} rk_progress_note;

/* One progress stream. Fill it with rk_progress_init; the fields are its own. */
struct rk_progress {
    FILE *out;
    bool live;       /* redrawn in place; else plain lines */
    bool drawn;      /* live: a line is on the screen, not yet cleared */
    int plain_lines; /* plain: a line at every 1/plain_lines of progress (10: tenths) */
    int plain_last;  /* plain: the last of those points printed */
    rk_progress_note notes[RK_PROGRESS_NOTES];
};

/* True when fd is a terminal that takes redraws and escapes: isatty(fd), TERM not "dumb",
 * NO_COLOR unset or empty. */
bool rk_term_live(int fd);

/* The terminal's width in columns: TIOCGWINSZ on fd, else $COLUMNS (a whole number 1..10000),
 * else 80. */
int rk_term_columns(int fd);

/* The line for parts in at most `width` columns (width >= 1), into buf (cap bytes, NUL-
 * terminated; cap of 4 * width + 1 always holds it). Parts are joined by two spaces; the bar
 * is "[###.......]", RK_PROGRESS_BAR_MIN to RK_PROGRESS_BAR_MAX cells, as wide as the room
 * left allows. Drops, until the line fits: the ETA, then the rate, then the bar; then cuts the
 * line at the width. Returns the columns used. Pure. */
int rk_progress_fit(const rk_progress_parts *parts, int width, char *buf, size_t cap);

/* The plain line for parts: every part but the bar, joined by two spaces, never cut. Returns
 * the bytes written (the line is truncated only when cap is too small). Pure. */
size_t rk_progress_plain(const rk_progress_parts *parts, char *buf, size_t cap);

/* Start a progress stream on out. Live when may_live (the caller's own conditions, such as
 * "not under a supervisor") and rk_term_live(fileno(out)). p must stay where it is while the
 * notes stream is open. */
void rk_progress_init(rk_progress *p, FILE *out, bool may_live);

/* Show parts: live, redraw the line fitted to the terminal's width now; plain, print the full
 * line when parts->frac has reached the next tenth (1/plain_lines), else nothing. */
void rk_progress_draw(rk_progress *p, const rk_progress_parts *parts);

/* Plain mode starts counting tenths from 0 again (a new epoch). */
void rk_progress_restart(rk_progress *p);

/* Clear the live line, if one is drawn. */
void rk_progress_clear(rk_progress *p);

/* A normal line (printf format; put the "\n" in it) through rk_progress_notes(p, p->out):
 * clears the live line first, so the text starts at column 0, and wraps it on a terminal; the
 * next draw puts the bar back under it. */
__attribute__((format(printf, 2, 3))) void rk_progress_say(rk_progress *p, const char *fmt, ...);

/* A stream for code that prints its own lines to `to` (the worker's checkpoint notes on
 * stdout, its guard messages on stderr) while the bar is up. In live mode each write clears
 * the live line first, then goes to `to`; when `to` is a live terminal too, a line longer
 * than its width less one column is broken at its last space that fits (no space: at the
 * width), the rest indented by the line's own indentation plus two, so every line fits and
 * no text is lost. A line is written when its newline comes (or at rk_progress_close), never
 * half under the bar. In plain mode (or when no stream can be made: RK_PROGRESS_NOTES are in
 * use, out of memory) it is `to` itself, text unchanged. Valid until rk_progress_close. */
FILE *rk_progress_notes(rk_progress *p, FILE *to);

/* Clear the live line and close the notes streams. The rk_progress can be initialised again. */
void rk_progress_close(rk_progress *p);

#endif
