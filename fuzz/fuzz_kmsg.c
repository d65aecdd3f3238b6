/*
 * libFuzzer target for the kernel log's Xid reader (health/kmsg.h): arbitrary bytes, read as
 * /dev/kmsg records and as journal export output (cut and complete), never crash. A rejected
 * text is RK_EFORMAT with a one-line message naming the label and counts nothing; an accepted
 * one read a second time counts nothing more (sequence numbers, cursors); every counted
 * (bus id, code) pair has a normalised bus id and a code in 1..RK_KMSG_XID_MAX; the merge
 * leaves nxids within RK_XID_SLOTS, most frequent first.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "health/kmsg.h"

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static const char *const BUSES[] = {"00000000:01:00.0", "00000000:02:00.0", "00000000:3b:00.0"};
static const int CODES[] = {13, 31, 48, 63, 79, 94, 95, 119};

static uint64_t total(const rk_kmsg *k)
{
    uint64_t t = 0;
    for (size_t b = 0; b < sizeof BUSES / sizeof BUSES[0]; b++)
        for (size_t c = 0; c < sizeof CODES / sizeof CODES[0]; c++)
            t += rk_kmsg_count(k, BUSES[b], CODES[c]);
    return t;
}

static void merged(const rk_kmsg *k)
{
    rk_gpu_info in[3];
    rk_gpu_sample s[3];
    memset(in, 0, sizeof in);
    memset(s, 0, sizeof s);
    for (int i = 0; i < 3; i++) {
        strcpy(in[i].bus_id, BUSES[i]);
        rk_field_set(&s[i], RK_F_TEMP);
    }
    rk_kmsg_merge(k, in, s, 3);
    for (int i = 0; i < 3; i++) {
        check(s[i].nxids >= 0 && s[i].nxids <= RK_XID_SLOTS);
        uint64_t sum = 0;
        for (int j = 0; j < s[i].nxids; j++) {
            check(s[i].xids[j].xid >= 1 && s[i].xids[j].xid <= RK_KMSG_XID_MAX);
            check(s[i].xids[j].count > 0);
            if (j)
                check(s[i].xids[j - 1].count >= s[i].xids[j].count);
            sum += s[i].xids[j].count;
        }
        check(sum <= s[i].xid_count || !rk_field_valid(&s[i], RK_F_XID));
    }
}

static void msg_ok(const rk_err *err, const char *label)
{
    check(strncmp(err->msg, label, strlen(label)) == 0);
    for (const char *p = err->msg; *p; p++)
        check((unsigned char)*p >= 0x20 && *p != 0x7f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    rk_err err = {0};
    rk_kmsg *k;
    check(rk_kmsg_create(&k, &err) == RK_OK);
    int rc = rk_kmsg_feed(k, "fuzz", text, size, &err);
    if (rc) {
        check(rc == RK_EFORMAT);
        msg_ok(&err, "fuzz: ");
        check(total(k) == 0);
    } else {
        uint64_t t = total(k);
        check(rk_kmsg_feed(k, "fuzz", text, size, &err) == RK_OK);
        check(total(k) == t);
    }
    rk_kmsg_free(k);

    for (int complete = 0; complete < 2; complete++) {
        check(rk_kmsg_create(&k, &err) == RK_OK);
        rc = rk_kmsg_feed_export(k, "j", text, size, complete, &err);
        if (rc) {
            check(rc == RK_EFORMAT);
            msg_ok(&err, "j: ");
            check(total(k) == 0);
        }
        merged(k);
        rk_kmsg_free(k);
    }

    /* the parsers on their own */
    char bus[32];
    int xid = 0;
    if (rk_kmsg_parse_xid(text, size, bus, sizeof bus, &xid) == 1) {
        check(xid >= 1 && xid <= RK_KMSG_XID_MAX);
        char again[32];
        check(rk_kmsg_bus_id_norm(bus, strlen(bus), again, sizeof again) == 0);
        check(strcmp(bus, again) == 0);
    }
    rk_kmsg_record r;
    if (rk_kmsg_parse_record(text, size, &r) == 0)
        check(r.msg >= text && r.msg + r.msg_len == text + size && r.facility <= 127);
    return 0;
}
