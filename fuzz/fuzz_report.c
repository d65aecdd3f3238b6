/*
 * Fuzz rk report's parsers and renderer (src/supervisor/runlog.c, events.c, src/report/): the
 * input, split at NUL bytes, is events.jsonl, steps.jsonl, gate.jsonl, summary.json,
 * metrics.json and loss.log (read when steps.jsonl is empty). Every line goes through the
 * record and event parsers (a record that parses must format and parse back as the same type
 * and step; an event, as the same event, written again to the same bytes), then the whole
 * through the page renderer, which must finish (every axis counts its ticks: the fuzzer's
 * timeout catches one that does not), stay within RK_REPORT_MAX_PAGE, and hold no markup the
 * input brought (no "<script") and no control character but the newline.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "report/report.h"
#include "supervisor/events.h"
#include "supervisor/runlog.h"

static rk_runlog_rec g_rec, g_back;
static rk_event g_ev, g_ev_back;
static char g_line[RK_RUNLOG_MAX_LINE + 1], g_again[RK_EVENT_MAX_LINE + 1];

/* What the events line keeps exactly (its seconds are written to the millisecond). */
static int same_event(const rk_event *a, const rk_event *b)
{
    return strcmp(a->time, b->time) == 0 && strcmp(a->kind, b->kind) == 0 && a->rank == b->rank &&
           strcmp(a->device, b->device) == 0 && strcmp(a->action, b->action) == 0 &&
           a->step == b->step && a->lost_steps == b->lost_steps &&
           isnan(a->recovery_s) == isnan(b->recovery_s) && strcmp(a->detail, b->detail) == 0 &&
           strcmp(a->stacks, b->stacks) == 0;
}

static void each_line(const char *p, size_t n)
{
    while (n) {
        const char *nl = memchr(p, '\n', n);
        size_t len = nl ? (size_t)(nl - p) : n;
        rk_err err = {0};
        if (rk_runlog_parse(p, len, &g_rec, &err) == RK_OK) {
            long m = rk_runlog_format(&g_rec, g_line, sizeof g_line);
            if (m < 0 || rk_runlog_parse(g_line, (size_t)m, &g_back, &err) != RK_OK ||
                g_back.type != g_rec.type || g_back.step != g_rec.step)
                abort(); /* what was read must write and read back */
        }
        if (rk_event_parse(p, len, &g_ev, &err) == RK_OK) {
            long m = rk_event_format(&g_ev, g_line, sizeof g_line);
            if (m < 0 || rk_event_parse(g_line, (size_t)m, &g_ev_back, &err) != RK_OK ||
                !same_event(&g_ev, &g_ev_back) ||
                rk_event_format(&g_ev_back, g_again, sizeof g_again) != m ||
                memcmp(g_line, g_again, (size_t)m) != 0)
                abort(); /* an event read must write, and read back the same */
        }
        p += len + (nl ? 1 : 0);
        n -= len + (nl ? 1 : 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *part[6] = {0};
    size_t plen[6] = {0};
    const char *p = (const char *)data;
    size_t left = size;
    for (int k = 0; k < 6 && (k == 0 || left); k++) {
        const char *z = k < 5 ? memchr(p, '\0', left) : NULL;
        size_t len = z ? (size_t)(z - p) : left;
        part[k] = p;
        plen[k] = len;
        p += len + (z ? 1 : 0);
        left -= len + (z ? 1 : 0);
        if (!z)
            break;
    }
    for (int k = 0; k < 3; k++)
        if (part[k])
            each_line(part[k], plen[k]);
    rk_report_in in = {.name = "fuzz",
                       .events = part[0],
                       .events_len = plen[0],
                       .steps = part[1],
                       .steps_len = plen[1],
                       .gate = part[2],
                       .gate_len = plen[2],
                       .summary = part[3],
                       .summary_len = plen[3],
                       .metrics = part[4],
                       .metrics_len = plen[4],
                       .loss = part[5],
                       .loss_len = plen[5]};
    if (!plen[1])
        in.steps = NULL; /* rk report reads loss.log only without steps.jsonl */
    char *html = NULL;
    size_t len = 0;
    rk_report_stats st;
    rk_err err = {0};
    int rc = rk_report_render(&in, &html, &len, &st, &err);
    if (rc == RK_EINVAL) /* the page came out larger than its bound */
        abort();
    if (rc == RK_OK) {
        if (!html || strlen(html) != len || len > RK_REPORT_MAX_PAGE || strstr(html, "<script") ||
            strstr(html, "<img"))
            abort();
        for (size_t i = 0; i < len; i++) { /* C0 but the newline, DEL, C1 (UTF-8 C2 80..9F) */
            unsigned char c = (unsigned char)html[i], c1 = (unsigned char)html[i + 1];
            if ((c < 0x20 && c != '\n') || c == 0x7f || (c == 0xc2 && c1 >= 0x80 && c1 <= 0x9f))
                abort();
        }
        free(html);
    }
    return 0;
}
