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
    rk_progress_clear(p);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->out, fmt, ap);
    va_end(ap);
    fflush(p->out);
}

static ssize_t notes_write(void *cookie, const char *buf, size_t n)
{
    rk_progress *p = cookie;
    rk_progress_clear(p);
    size_t w = fwrite(buf, 1, n, p->out);
    fflush(p->out);
    return w > 0 ? (ssize_t)w : -1;
}

FILE *rk_progress_notes(rk_progress *p)
{
    if (!p->live)
        return p->out;
    if (!p->notes) {
        p->notes = fopencookie(p, "w", (cookie_io_functions_t){.write = notes_write});
        if (!p->notes)
            return p->out; /* out of memory: notes may share the bar's line */
        setvbuf(p->notes, NULL, _IOLBF, 0);
    }
    return p->notes;
}

void rk_progress_close(rk_progress *p)
{
    if (p->notes)
        fclose(p->notes);
    p->notes = NULL;
    rk_progress_clear(p);
}
