/*
 * libFuzzer target for every message the device plugin parses (src/k8s/msg.c): the kubelet's
 * Empty, AllocateRequest, PreferredAllocationRequest and PreStartContainerRequest, and
 * Register's reply (an Empty). The first byte picks the message, the second which of a small
 * fleet's devices are Healthy; the rest is the message. Arbitrary bytes never crash. A refusal
 * is a gRPC status other than OK with a one-line printable message; an accepted message holds
 * only counts and ids within the bounds of dp.h, and then goes on as the plugin takes it:
 * Allocate's check and the preferred allocation, whose answer must be `size` distinct available
 * devices with every must-include one first.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "k8s/dp.h"

#define NDEV 6

static void check(int cond)
{
    if (!cond)
        __builtin_trap();
}

static void check_line(const char *s)
{
    size_t n = strlen(s);
    check(n > 0 && n < sizeof(((rk_dp_status *)0)->msg));
    for (size_t i = 0; i < n; i++)
        check((unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f);
}

static void fleet(rk_dp_dev *d, uint8_t healthy)
{
    static const char *const ids[NDEV] = {"0", "1", "2", "3", "GPU-a", "GPU-b"};
    static const char *const sw[NDEV] = {"A", "A", "B", "B", "", "A"};
    memset(d, 0, sizeof *d * NDEV);
    for (int i = 0; i < NDEV; i++) {
        snprintf(d[i].id, sizeof d[i].id, "%s", ids[i]);
        snprintf(d[i].sw, sizeof d[i].sw, "%s", sw[i]);
        d[i].index = i;
        d[i].has_score = i != 3;
        d[i].score = 40 + 10 * i;
        d[i].healthy = (healthy >> i) & 1;
    }
}

/* The preferred allocation of one container, as the plugin computes it. */
static void prefer(const rk_dp_dev *d, const rk_dp_container *c)
{
    static int avail[RK_DP_MAX_IDS], must[RK_DP_MAX_IDS], out[RK_DP_MAX_IDS];
    for (size_t j = 0; j < c->nids; j++)
        if ((avail[j] = rk_dp_find(d, NDEV, c->ids[j])) < 0)
            return; /* the plugin answers NOT_FOUND */
    for (size_t j = 0; j < c->nmust; j++)
        if ((must[j] = rk_dp_find(d, NDEV, c->must[j])) < 0)
            return;
    rk_dp_status st;
    int rc = rk_dp_prefer(d, NDEV, avail, (int)c->nids, must, (int)c->nmust, c->size, out, &st);
    if (rc) {
        check(rc == RK_DP_INVALID_ARGUMENT);
        check_line(st.msg);
        return;
    }
    for (int k = 0; k < c->size; k++) {
        bool in_avail = false, dup = false;
        for (size_t j = 0; j < c->nids; j++)
            in_avail |= avail[j] == out[k];
        for (int m = 0; m < k; m++)
            dup |= out[m] == out[k];
        check(in_avail && !dup);
    }
    /* the distinct must-include devices, in their order, come first */
    int k = 0;
    for (size_t j = 0; j < c->nmust; j++) {
        bool seen = false;
        for (size_t m = 0; m < j; m++)
            seen |= must[m] == must[j];
        if (!seen)
            check(out[k++] == must[j]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    rk_dp_kind kind = (rk_dp_kind)(data[0] % RK_DP_MSG_KINDS);
    rk_dp_dev d[NDEV];
    fleet(d, data[1]);
    rk_dp_request rq;
    rk_dp_status st;
    int rc = rk_dp_request_parse(kind, data + 2, size - 2, &rq, &st);
    if (rc) {
        check(rc == st.code && rc != RK_DP_OK && rq.pb == NULL);
        check_line(st.msg);
        return 0;
    }
    check(rq.pb != NULL && rq.n <= RK_DP_MAX_CONTAINERS);
    for (size_t c = 0; c < rq.n; c++) {
        const rk_dp_container *q = &rq.c[c];
        check(q->nids <= RK_DP_MAX_IDS && q->nmust <= RK_DP_MAX_IDS);
        check(q->size >= 0 && q->size <= RK_DP_MAX_IDS);
        for (size_t j = 0; j < q->nids; j++)
            check(rk_dp_id_ok(q->ids[j], strlen(q->ids[j])));
        for (size_t j = 0; j < q->nmust; j++)
            check(rk_dp_id_ok(q->must[j], strlen(q->must[j])));
        if (kind == RK_DP_MSG_ALLOCATE) {
            check(q->nids > 0);
            rc = rk_dp_allocate_check(d, NDEV, q->ids, q->nids, 60, 10, &st);
            check(rc == st.code);
            if (rc)
                check_line(st.msg);
        } else if (kind == RK_DP_MSG_PREFERRED) {
            prefer(d, q);
        }
    }
    rk_dp_request_free(&rq);
    check(rq.pb == NULL);
    return 0;
}
