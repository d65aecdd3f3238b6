/*
 * Progress and status lines (progress.h): the fitting of parts into a width, live redraws on
 * a terminal, plain lines elsewhere. Relies on isatty/TIOCGWINSZ for the terminal, args.h for
 * $COLUMNS and glibc's fopencookie for the notes stream.
 */
#define _GNU_SOURCE /* fopencookie */

#include "progress.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <unistd.h>

#include "args.h"

#define COLUMNS_MAX 10000 /* $COLUMNS above this is not believed */
#define LIVE_MAX 1000     /* a live line uses at most this many columns, however wide */

bool rk_term_live(int fd)
{
    const char *nc = getenv("NO_COLOR"), *term = getenv("TERM");
    return isatty(fd) && !(nc && nc[0]) && !(term && strcmp(term, "dumb") == 0);
}

int rk_term_columns(int fd)
{
    struct winsize ws;
    if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    const char *env = getenv("COLUMNS");
    int64_t c;
    if (env && rk_args_int(env, 1, COLUMNS_MAX, &c))
        return (int)c;
    return 80;
}

/* ---- fitting (pure) ------------------------------------------------------------------------ */

static bool has(const char *s)
{
    return s && s[0];
}

/* Columns of s: its bytes but UTF-8 continuation bytes. */
static int cols_of(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* A line being built: never more than `limit` columns or cap - 1 bytes, cut only between
 * characters. */
typedef struct line {
    char *buf;
    size_t cap, len;
    int cols, limit;
} line;

static void put(line *l, const char *s)
{
    while (*s && l->cols < l->limit) {
        size_t n = 1;
        while (((unsigned char)s[n] & 0xC0) == 0x80)
            n++;
        if (l->len + n >= l->cap)
            break;
        memcpy(l->buf + l->len, s, n);
        l->len += n;
        l->cols++;
        s += n;
    }
    l->buf[l->len] = '\0';
}

/* Part by part, two spaces before each but the first. */
static void put_part(line *l, const char *s)
{
    if (!has(s))
        return;
    if (l->len > 0)
        put(l, "  ");
    put(l, s);
}

static void put_bar(line *l, double frac, int cells)
{
    if (!(frac >= 0)) /* NaN too */
        frac = 0;
    if (frac > 1)
        frac = 1;
    int filled = (int)(frac * cells);
    char bar[RK_PROGRESS_BAR_MAX + 3];
    bar[0] = '[';
    for (int i = 0; i < cells; i++)
        bar[1 + i] = i < filled ? '#' : '.';
    bar[1 + cells] = ']';
    bar[2 + cells] = '\0';
    put_part(l, bar);
}

int rk_progress_fit(const rk_progress_parts *p, int width, char *buf, size_t cap)
{
    if (cap == 0)
        return 0;
    if (width < 1)
        width = 1;
    line l = {.buf = buf, .cap = cap, .limit = width};
    buf[0] = '\0';
    bool want_bar = p->frac >= 0;
    /* drop 0: everything; 1: no ETA; 2: no ETA, no rate; 3: no bar either; 4: cut */
    for (int drop = 0; drop <= 4; drop++) {
        const char *eta = drop < 1 ? p->eta : NULL, *rate = drop < 2 ? p->rate : NULL;
        bool bar = want_bar && drop < 3;
        const char *text[] = {p->label, p->counts, p->detail, rate, eta};
        int used = 0, n = 0;
        for (size_t i = 0; i < sizeof text / sizeof text[0]; i++)
            if (has(text[i])) {
                used += cols_of(text[i]);
                n++;
            }
        int cells = 0;
        if (bar) { /* the bar and its brackets in the room the text leaves, two spaces apart */
            cells = width - used - 2 * n - 2;
            if (cells > RK_PROGRESS_BAR_MAX)
                cells = RK_PROGRESS_BAR_MAX;
            if (cells < RK_PROGRESS_BAR_MIN)
                continue;
        } else if (drop < 4 && used + 2 * (n - 1) > width) {
            continue;
        }
        put_part(&l, p->label);
        if (bar)
            put_bar(&l, p->frac, cells);
        put_part(&l, p->counts);
        put_part(&l, p->detail);
        put_part(&l, rate);
        put_part(&l, eta);
        break;
    }
    return l.cols;
}

size_t rk_progress_plain(const rk_progress_parts *p, char *buf, size_t cap)
{
    if (cap == 0)
        return 0;
    line l = {.buf = buf, .cap = cap, .limit = INT32_MAX};
    buf[0] = '\0';
    put_part(&l, p->label);
    put_part(&l, p->counts);
    put_part(&l, p->detail);
    put_part(&l, p->rate);
    put_part(&l, p->eta);
    return l.len;
}

/* ---- the stream ---------------------------------------------------------------------------- */

void rk_progress_init(rk_progress *p, FILE *out, bool may_live)
{
    *p = (rk_progress){.out = out, .plain_lines = 10};
    p->live = may_live && rk_term_live(fileno(out));
}

void rk_progress_draw(rk_progress *p, const rk_progress_parts *parts)
{
    char text[4 * LIVE_MAX + 1];
    if (p->live) {
        int cols = rk_term_columns(fileno(p->out)) - 1; /* the last column would wrap */
        rk_progress_fit(parts, cols < 1 ? 1 : cols > LIVE_MAX ? LIVE_MAX : cols, text, sizeof text);
        fprintf(p->out, "\r%s\033[K", text);
        fflush(p->out);
        p->drawn = true;
        return;
    }
    double f = parts->frac > 1 ? 1 : parts->frac;
    int at = f >= 0 ? (int)(f * p->plain_lines) : 0; /* NaN and no bar: 0 */
    if (at <= p->plain_last)
        return;
    p->plain_last = at;
    rk_progress_plain(parts, text, sizeof text);
    fprintf(p->out, "%s\n", text);
    fflush(p->out);
}

void rk_progress_restart(rk_progress *p)
{
    p->plain_last = 0;
}

void rk_progress_clear(rk_progress *p)
{
    if (!p->drawn)
        return;
    fputs("\r\033[K", p->out);
    fflush(p->out);
    p->drawn = false;
}

void rk_progress_say(rk_progress *p, const char *fmt, ...)
{
    FILE *f = rk_progress_notes(p, p->out);
    rk_progress_clear(p);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fflush(f);
}

/* ---- notes: a stream that clears the bar, and wraps lines at spaces on a terminal ---------- */

#define PEND_CAP (4 * (LIVE_MAX + 2)) /* a line of LIVE_MAX + 1 columns, 4 bytes each */

static void note_put(rk_progress_note *n, const char *s, size_t len)
{
    if (len && fwrite(s, 1, len, n->to) != len)
        n->failed = true;
}

/* The pending line has outgrown width: write it up to its last space (after the indentation)
 * or, with no space, all but its last character; keep the rest, indented, as the pending
 * line. */
static void note_wrap(rk_progress_note *n, int width)
{
    size_t lead = 0;
    while (lead < n->len && n->pend[lead] == ' ')
        lead++;
    if (!n->wrapped) { /* the line's first break: its own indentation, plus two */
        n->indent = (int)lead + 2;
        n->wrapped = true;
    }
    size_t cut = 0;
    for (size_t i = n->len; i-- > lead;)
        if (n->pend[i] == ' ') {
            cut = i;
            break;
        }
    size_t end, rest;
    if (cut > lead) {
        end = cut;
        while (end > lead && n->pend[end - 1] == ' ')
            end--;
        rest = cut + 1;
    } else {
        end = n->len;
        do
            end--;
        while (end > 0 && ((unsigned char)n->pend[end] & 0xC0) == 0x80);
        rest = end;
    }
    note_put(n, n->pend, end);
    note_put(n, "\n", 1);
    size_t ind = (size_t)(n->indent < width / 4 ? n->indent : width / 4);
    memmove(n->pend + ind, n->pend + rest, n->len - rest);
    memset(n->pend, ' ', ind);
    n->len = ind + n->len - rest;
    n->cols = 0;
    for (size_t i = 0; i < n->len; i++)
        n->cols += ((unsigned char)n->pend[i] & 0xC0) != 0x80;
}

static ssize_t notes_write(void *cookie, const char *buf, size_t n)
{
    rk_progress_note *note = cookie;
    rk_progress_clear(note->p);
    int width = 0; /* 0: `to` is no terminal, the text goes as it is */
    if (rk_term_live(fileno(note->to))) {
        width = rk_term_columns(fileno(note->to)) - 1;
        width = width < 1 ? 1 : width > LIVE_MAX ? LIVE_MAX : width;
    }
    if (!width) {
        note_put(note, note->pend, note->len);
        note->len = 0;
        note->cols = 0;
        note->wrapped = false;
        note_put(note, buf, n);
    }
    for (size_t i = 0; width && i < n; i++) {
        if (buf[i] == '\n') {
            note_put(note, note->pend, note->len);
            note_put(note, "\n", 1);
            note->len = 0;
            note->cols = 0;
            note->wrapped = false;
            continue;
        }
        note->pend[note->len++] = buf[i];
        note->cols += ((unsigned char)buf[i] & 0xC0) != 0x80;
        while (note->cols > width)
            note_wrap(note, width);
    }
    fflush(note->to);
    if (note->failed) {
        note->failed = false;
        return -1;
    }
    return (ssize_t)n;
}

static int notes_close(void *cookie)
{
    rk_progress_note *note = cookie;
    note_put(note, note->pend, note->len); /* a last line with no newline */
    fflush(note->to);
    free(note->pend);
    note->pend = NULL;
    return 0;
}

FILE *rk_progress_notes(rk_progress *p, FILE *to)
{
    if (!p->live)
        return to;
    for (int i = 0; i < RK_PROGRESS_NOTES; i++) {
        rk_progress_note *note = &p->notes[i];
        if (note->f && note->to == to)
            return note->f;
        if (note->f)
            continue;
        *note = (rk_progress_note){.p = p, .to = to, .pend = malloc(PEND_CAP)};
        if (note->pend)
            note->f = fopencookie(
                note, "w", (cookie_io_functions_t){.write = notes_write, .close = notes_close});
        if (!note->f) {
            free(note->pend);
            note->pend = NULL;
            return to; /* out of memory: notes may share the bar's line */
        }
        setvbuf(note->f, NULL, _IOLBF, 0);
        return note->f;
    }
    return to;
}

void rk_progress_close(rk_progress *p)
{
    rk_progress_clear(p);
    for (int i = 0; i < RK_PROGRESS_NOTES; i++)
        if (p->notes[i].f)
            fclose(p->notes[i].f);
    memset(p->notes, 0, sizeof p->notes);
}
