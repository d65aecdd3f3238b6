/*
 * libFuzzer target for the node link's readers (src/net/): the stream reader fed the input
 * in chunks whose sizes come from the input, every frame it yields through both kinds of
 * peer (rk_net_peer_accept), rk_net_frame_open on the whole input, and the secret's text
 * parser. The first byte picks a mode: odd, the rest is a list of frame descriptions that
 * are sealed with the fuzzing key first (so the checks after the tag are reached too), with
 * one byte of the result flipped where the input says. A refusal must be one of the
 * documented codes with a one-line printable message; a frame handed out must meet the
 * header's bounds and re-seal to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/frame.h"
#include "net/peer.h"
#include "net/secret.h"
#include "net/stream.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void check_message(const rk_err *err, int code)
{
    check(err->code == code);
    check(err->msg[0] != '\0');
    for (const char *p = err->msg; *p; p++)
        check((unsigned char)*p >= 0x20 && *p != 0x7f);
}

static const uint8_t JOB[RK_NET_JOB_ID_LEN] = "fuzz-job-0000000";
static uint8_t g_buf[RK_NET_FRAME_MAX];
static uint8_t g_stream[4 * RK_NET_FRAME_MAX];
static rk_net_reader g_reader;

/* A frame that opened: within bounds, and sealing its header and payload again gives the
 * same bytes (nothing in a frame escapes the tag). */
static void check_frame(const rk_net_secret *k, const rk_net_hdr *h, const uint8_t *payload,
                        const uint8_t *frame)
{
    check(h->len <= RK_NET_PAYLOAD_MAX);
    check(payload == frame + RK_NET_HDR_LEN);
    size_t n;
    check(rk_net_frame_seal(k, h, payload, g_buf, sizeof g_buf, &n, NULL) == RK_OK);
    check(n == rk_net_frame_size(h->len));
    check(memcmp(g_buf, frame, n) == 0);
}

/* The frames described by `data`: records of [type flags sender receiver generation seq
 * len_lo len_hi] and len payload bytes (as many as are left), sealed one after another. */
static size_t seal_described(const rk_net_secret *k, const uint8_t *data, size_t size)
{
    size_t used = 0;
    while (size >= 8 && used + RK_NET_FRAME_MAX <= sizeof g_stream) {
        rk_net_hdr h = {.type = data[0],
                        .flags = data[1],
                        .sender = data[2] == 0xff ? RK_NET_COORDINATOR : data[2] % 4,
                        .receiver = data[3] == 0xff ? RK_NET_COORDINATOR : data[3] % 4,
                        .generation = data[4] % 4,
                        .seq = data[5] % 8};
        memcpy(h.job, JOB, sizeof JOB);
        if (data[4] & 0x80)
            h.job[0] ^= 1;
        uint32_t len = (uint32_t)data[6] | (uint32_t)data[7] << 8;
        data += 8, size -= 8;
        h.len = len < size ? len : (uint32_t)size;
        size_t n;
        check(rk_net_frame_seal(k, &h, data, g_stream + used, sizeof g_stream - used, &n, NULL) ==
              RK_OK);
        used += n;
        data += h.len, size -= h.len;
    }
    return used;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_net_secret k;
    memset(k.key, 0x4b, sizeof k.key);
    rk_err err;

    rk_net_secret s;
    int rc = rk_net_secret_parse(&s, (const char *)data, size, "fuzz", &err);
    check(rc == RK_OK || (rc == RK_EFORMAT && (check_message(&err, rc), 1)));

    rk_net_hdr h;
    const uint8_t *payload;
    rc = rk_net_frame_open(&k, data, size, "fuzz", &h, &payload, &err);
    if (rc == RK_OK) {
        check_frame(&k, &h, payload, data);
    } else {
        check(rc == RK_EFORMAT || rc == RK_NET_ETOOBIG || rc == RK_NET_EAUTH);
        check_message(&err, rc);
        check(payload == NULL);
    }

    if (size < 2)
        return 0;
    uint8_t mode = data[0], chunk_seed = data[1];
    const uint8_t *in = data + 2;
    size_t in_len = size - 2;
    if (mode & 1) {
        size_t n = seal_described(&k, in, in_len);
        if (n > 0 && (mode & 2))
            g_stream[(size_t)chunk_seed * 131 % n] ^= (uint8_t)(1u << (mode >> 5));
        in = g_stream, in_len = n;
    }

    rk_net_peer coord, agent;
    rk_net_peer_init(&coord, JOB, RK_NET_COORDINATOR, 1, 1, false);
    rk_net_peer_init(&agent, JOB, 1, RK_NET_COORDINATOR, 1, true);
    rk_net_reader_init(&g_reader, "fuzz");
    size_t at = 0, chunk = (size_t)(chunk_seed % 64) + 1;
    for (;;) {
        rc = 0;
        if (at < in_len) {
            size_t want = in_len - at < chunk ? in_len - at : chunk;
            rc = rk_net_reader_feed(&g_reader, in + at, want, &err);
            if (rc < 0)
                break;
            check(rc > 0);
            at += (size_t)rc;
            chunk = chunk * 7 % 97 + 1;
        }
        int got = 0;
        while ((rc = rk_net_reader_next(&g_reader, &k, &h, &payload, &err)) == 1) {
            got++;
            check_frame(&k, &h, payload, payload - RK_NET_HDR_LEN);
            rk_net_peer *p = h.sender == RK_NET_COORDINATOR ? &agent : &coord;
            uint64_t before = p->received;
            uint32_t gen = p->generation;
            int a = rk_net_peer_accept(p, &h, g_reader.from, &err);
            if (a == RK_OK) {
                check(p->received == h.seq && h.generation == p->generation);
                check(h.generation > gen || h.seq > before);
            } else {
                check(a == RK_NET_EJOB || a == RK_NET_EPEER || a == RK_NET_EFENCED ||
                      a == RK_NET_EREPLAY);
                check_message(&err, a);
                check(p->received == before && p->generation == gen);
            }
        }
        if (rc < 0) {
            check(rc == RK_EFORMAT || rc == RK_NET_ETOOBIG || rc == RK_NET_EAUTH);
            check_message(&err, rc);
            /* final: every later call says the same */
            rk_err again;
            check(rk_net_reader_next(&g_reader, &k, &h, &payload, &again) == rc);
            check(strcmp(again.msg, err.msg) == 0);
            break;
        }
        if (at >= in_len && got == 0)
            break;
    }
    check(rk_net_reader_pending(&g_reader) <= RK_NET_FRAME_MAX);
    return 0;
}
