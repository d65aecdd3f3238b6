/*
 * Tests for cli/progress.h, the progress lines of every rk subcommand: a fitted line never
 * takes more columns than it is given (20, 40, 60, 80, 200 and every width in between); the
 * parts go in the order ETA, rate, bar, and only then is the line cut; a part once shown stays
 * shown on a wider terminal; the plain line has every part but the bar; live mode redraws with
 * "\r" ... "\033[K" inside the width less one column and clears the line before a normal line
 * or a note; plain mode prints a line per tenth with no control bytes; the terminal tests
 * (isatty, TERM=dumb, NO_COLOR, the width from TIOCGWINSZ and $COLUMNS) on a real pty.
 */
#define _GNU_SOURCE /* posix_openpt, ptsname */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "progress.h"

/* A training line's parts, as rk train draws them. */
static const rk_progress_parts train_parts = {
    .label = "epoch 1/3",
    .frac = 0.5,
    .counts = "step 469/938",
    .detail = "loss 0.4123",
    .rate = "8123 samples/s",
    .eta = "ETA 1:05",
};

static int cols(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

typedef struct shown {
    bool eta, rate, bar, detail, counts;
} shown;

static shown parts_in(const char *line)
{
    return (shown){.eta = strstr(line, "ETA 1:05") != NULL,
                   .rate = strstr(line, "8123 samples/s") != NULL,
                   .bar = strchr(line, '[') != NULL,
                   .detail = strstr(line, "loss 0.4123") != NULL,
                   .counts = strstr(line, "step 469/938") != NULL};
}

static void test_fit_keeps_the_width(void **state)
{
    (void)state;
    static const int widths[] = {20, 40, 60, 80, 200};
    char buf[1024];
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        int used = rk_progress_fit(&train_parts, widths[i], buf, sizeof buf);
        assert_true(used <= widths[i]);
        assert_int_equal(used, cols(buf));
        assert_null(strchr(buf, '\r'));
        assert_null(strchr(buf, '\n'));
        assert_int_equal(strncmp(buf, "epoch 1/3", widths[i] < 9 ? (size_t)widths[i] : 9), 0);
    }
    /* every width, 1 to 250 */
    for (int w = 1; w <= 250; w++) {
        int used = rk_progress_fit(&train_parts, w, buf, sizeof buf);
        assert_true(used <= w);
        assert_int_equal(used, cols(buf));
    }
}

static void test_fit_at_the_usual_widths(void **state)
{
    (void)state;
    char buf[1024];
    /* 200: everything, the bar at its widest */
    rk_progress_fit(&train_parts, 200, buf, sizeof buf);
    assert_string_equal(buf, "epoch 1/3  [###############...............]  step 469/938  loss "
                             "0.4123  8123 samples/s  ETA 1:05");
    /* 80 columns less one (a live line): the bar narrows to keep the ETA */
    rk_progress_fit(&train_parts, 79, buf, sizeof buf);
    shown s = parts_in(buf);
    assert_true(s.eta && s.rate && s.bar);
    /* 70: the ETA goes first */
    rk_progress_fit(&train_parts, 70, buf, sizeof buf);
    s = parts_in(buf);
    assert_false(s.eta);
    assert_true(s.rate && s.bar && s.detail && s.counts);
    /* 60 less one: then the rate */
    rk_progress_fit(&train_parts, 59, buf, sizeof buf);
    s = parts_in(buf);
    assert_false(s.eta || s.rate);
    assert_true(s.bar && s.detail && s.counts);
    /* 40: no ETA, no rate, no bar */
    rk_progress_fit(&train_parts, 40, buf, sizeof buf);
    assert_string_equal(buf, "epoch 1/3  step 469/938  loss 0.4123");
    /* 20: the label, then cut at the width exactly */
    int used = rk_progress_fit(&train_parts, 20, buf, sizeof buf);
    assert_int_equal(used, 20);
    assert_string_equal(buf, "epoch 1/3  step 469/");
}

/* At each width a part is shown only when every part dropped after it is shown too (ETA, then
 * rate, then bar), and once shown it stays shown at every wider width. */
static void test_fit_drop_order(void **state)
{
    (void)state;
    char buf[1024];
    shown prev = {0};
    int first_eta = 0, first_rate = 0, first_bar = 0;
    for (int w = 1; w <= 250; w++) {
        rk_progress_fit(&train_parts, w, buf, sizeof buf);
        shown s = parts_in(buf);
        if (s.eta)
            assert_true(s.rate);
        if (s.rate)
            assert_true(s.bar);
        if (s.bar)
            assert_true(s.detail && s.counts);
        assert_true(s.eta >= prev.eta && s.rate >= prev.rate && s.bar >= prev.bar);
        if (s.eta && !first_eta)
            first_eta = w;
        if (s.rate && !first_rate)
            first_rate = w;
        if (s.bar && !first_bar)
            first_bar = w;
        prev = s;
    }
    /* each step is a real one: the bar comes before the rate, the rate before the ETA */
    assert_true(first_bar > 0 && first_bar < first_rate && first_rate < first_eta);
    /* the bar appears at its narrowest: 9 + 2 + 12 + 2 + 11 + 2 + [10 cells] */
    assert_int_equal(first_bar, 9 + 2 + 12 + 2 + 11 + 2 + RK_PROGRESS_BAR_MIN + 2);
}

static void test_fit_without_some_parts(void **state)
{
    (void)state;
    char buf[256];
    rk_progress_parts p = {.label = "burn", .frac = -1, .rate = "10 GFLOP/s", .eta = "ETA 0:01"};
    rk_progress_fit(&p, 80, buf, sizeof buf);
    assert_string_equal(buf, "burn  10 GFLOP/s  ETA 0:01");
    rk_progress_fit(&p, 20, buf, sizeof buf); /* no bar to drop: rate then ETA */
    assert_string_equal(buf, "burn  10 GFLOP/s");
    p.frac = 2; /* past the end: full */
    p.rate = p.eta = NULL;
    assert_int_equal(rk_progress_fit(&p, 30, buf, sizeof buf), 30); /* 22 cells fill the room */
    assert_string_equal(buf, "burn  [######################]");
    p = (rk_progress_parts){.frac = -1};
    assert_int_equal(rk_progress_fit(&p, 10, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
}

/* A UTF-8 character is one column, and a cut never splits one; a small buffer is respected. */
static void test_fit_utf8_and_small_buffers(void **state)
{
    (void)state;
    char buf[256];
    rk_progress_parts p = {.label = "époque 1/3 ééééé", .frac = -1};
    assert_int_equal(rk_progress_fit(&p, 12, buf, sizeof buf), 12);
    assert_string_equal(buf, "époque 1/3 é");
    char small[8];
    int used = rk_progress_fit(&train_parts, 200, small, sizeof small);
    assert_int_equal(used, 7);
    assert_string_equal(small, "epoch 1");
    assert_int_equal(rk_progress_fit(&p, 12, small, sizeof small), 6); /* é is two bytes */
    assert_string_equal(small, "époque");
}

static void test_plain_line(void **state)
{
    (void)state;
    char buf[256];
    size_t n = rk_progress_plain(&train_parts, buf, sizeof buf);
    assert_string_equal(buf, "epoch 1/3  step 469/938  loss 0.4123  8123 samples/s  ETA 1:05");
    assert_int_equal(n, strlen(buf));
}

/* What a stream got, NUL-terminated, into buf. */
static void slurp(FILE *f, char *buf, size_t cap)
{
    fflush(f);
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
}

static void test_plain_mode_tenths(void **state)
{
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    rk_progress p;
    rk_progress_init(&p, f, true); /* a file: plain, whatever the caller allows */
    assert_false(p.live);
    rk_progress_parts parts = train_parts;
    for (int i = 0; i <= 100; i++) {
        parts.frac = i / 100.0;
        rk_progress_draw(&p, &parts);
    }
    rk_progress_say(&p, "done\n");
    assert_ptr_equal(rk_progress_notes(&p, f), f);
    rk_progress_close(&p);
    char out[4096];
    slurp(f, out, sizeof out);
    int lines = 0;
    for (char *c = out; *c; c++) {
        lines += *c == '\n';
        assert_true(*c == '\n' || (*c >= ' ' && *c < 127)); /* no \r, no escapes */
    }
    assert_int_equal(lines, 11); /* 10%, 20%, ... 100%, and "done" */
    assert_non_null(strstr(out, "epoch 1/3  step 469/938  loss 0.4123  8123 samples/s  ETA "
                                "1:05\n"));
    assert_null(strchr(out, '['));
    fclose(f);
    /* a new epoch counts from 0 again */
    f = tmpfile();
    assert_non_null(f);
    rk_progress_init(&p, f, false);
    parts.frac = 0.95;
    rk_progress_draw(&p, &parts); /* a line */
    rk_progress_draw(&p, &parts); /* the same tenth: none */
    rk_progress_restart(&p);
    parts.frac = 0.15;
    rk_progress_draw(&p, &parts); /* a line */
    rk_progress_restart(&p);
    parts.frac = 0.05;
    rk_progress_draw(&p, &parts); /* under a tenth: none */
    slurp(f, out, sizeof out);
    lines = 0;
    for (char *c = out; *c; c++)
        lines += *c == '\n';
    assert_int_equal(lines, 2);
    fclose(f);
}

static void test_live_mode_redraws_within_the_width(void **state)
{
    (void)state;
    FILE *f = tmpfile(), *g = tmpfile();
    assert_non_null(f);
    assert_non_null(g);
    setenv("COLUMNS", "60", 1); /* a file has no window size: $COLUMNS says */
    rk_progress p;
    rk_progress_init(&p, f, true);
    p.live = true; /* as on a terminal */
    rk_progress_draw(&p, &train_parts);
    rk_progress_draw(&p, &train_parts);
    rk_progress_say(&p, "checkpoint: %s\n", "saved");
    fprintf(rk_progress_notes(&p, f), "a note\n");
    rk_progress_draw(&p, &train_parts);
    FILE *notes = rk_progress_notes(&p, f), *diag = rk_progress_notes(&p, g);
    assert_ptr_not_equal(notes, f);
    assert_ptr_equal(rk_progress_notes(&p, f), notes); /* one per target */
    assert_ptr_not_equal(diag, g);
    assert_ptr_equal(rk_progress_notes(&p, stdout), stdout); /* two in use: the target itself */
    fprintf(notes, "another note\n");
    rk_progress_draw(&p, &train_parts);
    fprintf(diag, "a diagnostic\n"); /* the bar is on f: cleared there, the text to g */
    rk_progress_close(&p);
    unsetenv("COLUMNS");
    char out[4096], want[1024], line[128];
    slurp(f, out, sizeof out);
    rk_progress_fit(&train_parts, 59, line, sizeof line); /* 60 columns less one */
    assert_true(cols(line) <= 59);
    assert_null(strstr(line, "ETA"));
    snprintf(want, sizeof want,
             "\r%s\033[K\r%s\033[K\r\033[Kcheckpoint: saved\na note\n\r%s\033[K\r\033[Kanother "
             "note\n\r%s\033[K\r\033[K",
             line, line, line, line);
    assert_string_equal(out, want);
    slurp(g, out, sizeof out);
    assert_string_equal(out, "a diagnostic\n");
    fclose(f);
    fclose(g);
}

static void test_columns_from_the_environment(void **state)
{
    (void)state;
    FILE *f = tmpfile(); /* no window size on a file */
    assert_non_null(f);
    int fd = fileno(f);
    setenv("COLUMNS", "57", 1);
    assert_int_equal(rk_term_columns(fd), 57);
    setenv("COLUMNS", "abc", 1);
    assert_int_equal(rk_term_columns(fd), 80);
    setenv("COLUMNS", "0", 1);
    assert_int_equal(rk_term_columns(fd), 80);
    setenv("COLUMNS", "99999", 1);
    assert_int_equal(rk_term_columns(fd), 80);
    unsetenv("COLUMNS");
    assert_int_equal(rk_term_columns(fd), 80);
    fclose(f);
}

/* A pseudo-terminal pair; the test is skipped where none can be had. */
static void open_pty(int *master, int *slave)
{
    *master = posix_openpt(O_RDWR | O_NOCTTY);
    if (*master < 0 || grantpt(*master) || unlockpt(*master)) {
        if (*master >= 0)
            close(*master);
        skip();
    }
    *slave = open(ptsname(*master), O_RDWR | O_NOCTTY);
    assert_true(*slave >= 0);
}

/* A pty: a terminal of the given width; live unless TERM=dumb or NO_COLOR is set. */
static void test_on_a_pty(void **state)
{
    (void)state;
    int master, slave;
    open_pty(&master, &slave);
    struct winsize ws = {.ws_row = 20, .ws_col = 123};
    assert_int_equal(ioctl(slave, TIOCSWINSZ, &ws), 0);
    setenv("COLUMNS", "57", 1); /* the window size wins */
    assert_int_equal(rk_term_columns(slave), 123);
    ws.ws_col = 61; /* resized (SIGWINCH): read again */
    assert_int_equal(ioctl(slave, TIOCSWINSZ, &ws), 0);
    assert_int_equal(rk_term_columns(slave), 61);
    unsetenv("COLUMNS");
    setenv("TERM", "xterm", 1);
    unsetenv("NO_COLOR");
    assert_true(rk_term_live(slave));
    setenv("NO_COLOR", "", 1); /* empty is unset (no-color.org) */
    assert_true(rk_term_live(slave));
    setenv("NO_COLOR", "1", 1);
    assert_false(rk_term_live(slave));
    unsetenv("NO_COLOR");
    setenv("TERM", "dumb", 1);
    assert_false(rk_term_live(slave));
    unsetenv("TERM");
    assert_true(rk_term_live(slave));
    FILE *f = tmpfile();
    assert_false(rk_term_live(fileno(f)));
    fclose(f);
    close(slave);
    close(master);
}

/* Everything the pty's master has to read now. */
static size_t drain(int master, char *buf, size_t cap)
{
    size_t len = 0;
    ssize_t n;
    while (len + 1 < cap && (n = read(master, buf + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    buf[len] = '\0';
    return len;
}

/* On a 30-column terminal, say and the notes streams break long lines at spaces (indented by
 * the line's own indentation plus two), cut a word longer than the width, lose no text, and
 * leave short lines and the bar's line alone. */
static void test_notes_wrap_on_a_terminal(void **state)
{
    (void)state;
    int master, slave;
    open_pty(&master, &slave);
    struct termios t;
    assert_int_equal(tcgetattr(slave, &t), 0);
    cfmakeraw(&t); /* "\n" stays "\n" */
    assert_int_equal(tcsetattr(slave, TCSANOW, &t), 0);
    struct winsize ws = {.ws_row = 20, .ws_col = 30};
    assert_int_equal(ioctl(slave, TIOCSWINSZ, &ws), 0);
    fcntl(master, F_SETFL, O_NONBLOCK);
    setenv("TERM", "xterm", 1);
    unsetenv("NO_COLOR");
    FILE *out = fdopen(slave, "w");
    assert_non_null(out);
    rk_progress p;
    rk_progress_init(&p, out, true);
    assert_true(p.live);
    char got[4096];

    rk_progress_say(&p, "short line\n");
    drain(master, got, sizeof got);
    assert_string_equal(got, "short line\n");

    rk_progress_say(&p, "rk train: model cnn-small (421642 parameters), cpu (oneDNN), %d thread\n",
                    1);
    drain(master, got, sizeof got);
    assert_string_equal(got, "rk train: model cnn-small\n"
                             "  (421642 parameters), cpu\n"
                             "  (oneDNN), 1 thread\n");

    FILE *notes = rk_progress_notes(&p, out);
    fprintf(notes, "  sgemm: variant tiled, n=512, 3 copies x 9 rounds\n");
    drain(master, got, sizeof got);
    assert_string_equal(got, "  sgemm: variant tiled,\n"
                             "    n=512, 3 copies x 9\n"
                             "    rounds\n");
    /* 29 columns exactly: as it is */
    fprintf(notes, "%s\n", "abcdefghijklmnopqrstuvwxyz012");
    drain(master, got, sizeof got);
    assert_string_equal(got, "abcdefghijklmnopqrstuvwxyz012\n");
    /* no space: cut at the width */
    fprintf(notes, "state /a/very/long/path/with/no/spaces/burn.json\n");
    drain(master, got, sizeof got);
    assert_string_equal(got, "state\n"
                             "  /a/very/long/path/with/no/s\n"
                             "  paces/burn.json\n");
    /* a line in two writes, the bar drawn in between: the bar is cleared, the line whole */
    rk_progress_parts parts = {.label = "epoch 1/1", .frac = 0.5};
    fprintf(notes, "checkpoint: ");
    fflush(notes);
    rk_progress_draw(&p, &parts);
    fprintf(notes, "step 5 saved\n");
    drain(master, got, sizeof got);
    assert_string_equal(got, "\repoch 1/1  [########........]\033[K\r\033[Kcheckpoint: step 5 "
                             "saved\n");
    rk_progress_close(&p);
    fclose(out);
    close(master);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fit_keeps_the_width),
        cmocka_unit_test(test_fit_at_the_usual_widths),
        cmocka_unit_test(test_fit_drop_order),
        cmocka_unit_test(test_fit_without_some_parts),
        cmocka_unit_test(test_fit_utf8_and_small_buffers),
        cmocka_unit_test(test_plain_line),
        cmocka_unit_test(test_plain_mode_tenths),
        cmocka_unit_test(test_live_mode_redraws_within_the_width),
        cmocka_unit_test(test_columns_from_the_environment),
        cmocka_unit_test(test_on_a_pty),
        cmocka_unit_test(test_notes_wrap_on_a_terminal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
