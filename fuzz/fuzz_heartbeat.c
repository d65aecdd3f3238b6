/*
 * libFuzzer target for the heartbeat parsers (rekindle/heartbeat.h). The input is fed to the
 * line splitter in chunks whose sizes come from the input itself; every line it yields (and
 * the whole input as one line) goes to rk_hb_msg_parse and rk_hb_cmd_parse. A rejection must
 * be RK_EFORMAT with a one-line message under the right prefix; an accepted message must meet
 * every documented range and format to a line that parses back to the same message.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/heartbeat.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void check_message(const rk_err *err, const char *prefix)
{
    check(strncmp(err->msg, prefix, strlen(prefix)) == 0);
    for (const char *p = err->msg; *p; p++)
        check((unsigned char)*p >= 0x20 && *p != 0x7f);
}

static void check_text(const char *s, size_t cap)
{
    check(memchr(s, '\0', cap) != NULL);
    for (; *s; s++)
        check((unsigned char)*s >= 0x20 && *s != 0x7f);
}

static bool same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static void same(const rk_hb_msg *a, const rk_hb_msg *b)
{
    check(a->type == b->type && a->rank == b->rank && a->world == b->world);
    check(a->blame == b->blame && a->index == b->index && a->version == b->version);
    check(a->pid == b->pid && a->step == b->step && a->lost_steps == b->lost_steps);
    check(a->loss_finite == b->loss_finite);
    check(a->loss_finite ? same_bits(a->loss, b->loss) : (isnan(a->loss) == isnan(b->loss)));
    check(same_bits(a->dt, b->dt) && same_bits(a->seconds, b->seconds));
    check(strcmp(a->device, b->device) == 0 && strcmp(a->kind, b->kind) == 0);
    check(strcmp(a->action, b->action) == 0 && strcmp(a->status, b->status) == 0);
    check(strcmp(a->detail, b->detail) == 0 && a->stacks == b->stacks);
    check(a->restore == b->restore && a->rejoin == b->rejoin && a->keep == b->keep);
}

static void parse_one(const char *line, size_t len)
{
    rk_hb_msg m;
    rk_err err = {0};
    int rc = rk_hb_msg_parse(line, len, &m, &err);
    if (rc != RK_OK) {
        check(rc == RK_EFORMAT);
        check_message(&err, "heartbeat message: ");
    } else {
        check(len < RK_HB_LINE_MAX);
        check((unsigned)m.type <= RK_HB_SAVE);
        if (m.type == RK_HB_SAVE)
            check(m.keep >= 1 && m.keep <= 1000);
        check(m.rank >= 0 && m.rank <= RK_HB_RANK_MAX && m.step >= 0);
        if (m.type == RK_HB_HELLO)
            check(m.world > m.rank && m.world <= RK_HB_RANK_MAX + 1 && m.pid >= 1 &&
                  m.version >= 1);
        if (m.type == RK_HB_STEP)
            check(m.loss_finite ? isfinite(m.loss) : isnan(m.loss));
        check(isfinite(m.dt) && m.dt >= 0 && isfinite(m.seconds) && m.seconds >= 0);
        check(m.blame >= -1 && m.blame <= RK_HB_RANK_MAX && m.index >= 0 && m.lost_steps >= 0);
        check_text(m.device, sizeof m.device);
        check_text(m.kind, sizeof m.kind);
        check_text(m.action, sizeof m.action);
        check_text(m.status, sizeof m.status);
        check_text(m.detail, sizeof m.detail);
        char out[RK_HB_LINE_MAX];
        size_t n = 0;
        check(rk_hb_msg_format(&m, out, sizeof out, &n, &err) == RK_OK);
        check(n > 0 && out[n - 1] == '\n' && memchr(out, '\n', n - 1) == NULL);
        rk_hb_msg back;
        check(rk_hb_msg_parse(out, n - 1, &back, &err) == RK_OK);
        same(&m, &back);
    }
    rk_hb_cmd cmd = RK_HB_CMD_STOP;
    rc = rk_hb_cmd_parse(line, len, &cmd, &err);
    if (rc != RK_OK) {
        check(rc == RK_EFORMAT && cmd == RK_HB_CMD_NONE);
        check_message(&err, "heartbeat command: ");
    } else {
        check(cmd == RK_HB_CMD_CHECKPOINT || cmd == RK_HB_CMD_STOP);
    }
}

static int on_line(void *ctx, const char *line, size_t len)
{
    size_t *lines = ctx;
    check(len < RK_HB_LINE_MAX && line[len] == '\0' && memchr(line, '\n', len) == NULL);
    (*lines)++;
    parse_one(line, len);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    parse_one(text, size);

    /* The splitter, in chunks of 1..16 bytes chosen by the input's own bytes. */
    rk_hb_lines *b = calloc(1, sizeof *b);
    check(b != NULL);
    size_t lines = 0, newlines = 0;
    bool overlong = false;
    for (size_t i = 0; i < size;) {
        size_t k = 1 + (size_t)(data[i] & 15);
        if (k > size - i)
            k = size - i;
        rk_err err = {0};
        int rc = rk_hb_lines_feed(b, text + i, k, on_line, &lines, &err);
        if (rc != RK_OK) {
            check(rc == RK_EFORMAT && b->used == 0);
            check_message(&err, "heartbeat: ");
            overlong = true;
            break;
        }
        check(b->used < RK_HB_LINE_MAX);
        i += k;
    }
    for (size_t i = 0; i < size; i++)
        newlines += data[i] == '\n';
    check(overlong || lines == newlines); /* one line per newline when none is too long */
    free(b);
    return 0;
}
