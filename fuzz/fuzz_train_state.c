/* libFuzzer target for the readers of the training state kept as checkpoint tensors
 * (rk_batch_load, rk_loss_scaler_load) over any safetensors file: arbitrary bytes must load
 * cleanly or be rejected (RK_ENOENT when there is no state, RK_EFORMAT, RK_ENOMEM) with a
 * one-line message; a loaded state must give shares summing to the global batch, and saving
 * it again and loading that must give back the same state. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rekindle/amp.h"
#include "rekindle/batch.h"
#include "rekindle/safetensors.h"

static void check_rc(int rc, const rk_err *err)
{
    if (rc != RK_ENOENT && rc != RK_EFORMAT && rc != RK_ENOMEM)
        abort();
    if (strchr(err->msg, '\n'))
        abort();
}

/* The items written as a file and parsed back into *f. */
static int items_file(const rk_ckpt_item *it, size_t n, rk_st_file *f)
{
    rk_st_entry e[RK_LOSS_SCALER_NITEMS];
    for (size_t i = 0; i < n; i++)
        e[i] = (rk_st_entry){.name = it[i].name,
                             .data = it[i].data,
                             .ndim = it[i].ndim,
                             .shape = it[i].shape,
                             .dtype = it[i].dtype};
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = rk_st_encode(e, n, NULL, &buf, &len, NULL);
    if (rc == RK_OK)
        rc = rk_st_parse(buf, len, "again", f, NULL);
    free(buf);
    return rc;
}

static void batch(const rk_st_file *f)
{
    rk_batch_policy *p = (rk_batch_policy *)&p;
    rk_err err = {0};
    int rc = rk_batch_load(&p, f, &err);
    if (rc != RK_OK) {
        check_rc(rc, &err);
        if (p)
            abort();
        return;
    }
    int n = rk_batch_policy_nranks(p);
    int64_t *shares = malloc((size_t)n * sizeof *shares);
    if (shares && rk_batch_shares(p, shares, &err) == RK_OK) {
        int64_t sum = 0;
        for (int i = 0; i < n; i++) {
            if (shares[i] < 1)
                abort();
            sum += shares[i];
        }
        if (sum != rk_batch_policy_global_batch(p))
            abort();
    }
    free(shares);
    rk_batch_items it;
    rk_st_file g;
    if (rk_batch_items_fill(p, &it, &err) == RK_OK &&
        items_file(it.item, RK_BATCH_NITEMS, &g) == RK_OK) {
        rk_batch_policy *q = NULL;
        if (rk_batch_load(&q, &g, &err) != RK_OK || rk_batch_policy_nranks(q) != n ||
            rk_batch_policy_kind(q) != rk_batch_policy_kind(p) ||
            rk_batch_policy_global_batch(q) != rk_batch_policy_global_batch(p))
            abort();
        for (int i = 0; i < n; i++) {
            rk_batch_rank_state a, b;
            if (rk_batch_rank_get(p, i, &a, NULL) || rk_batch_rank_get(q, i, &b, NULL) ||
                memcmp(&a, &b, sizeof a) != 0)
                abort();
        }
        rk_batch_policy_free(q);
        rk_st_free(&g);
    }
    rk_batch_items_free(&it);
    rk_batch_policy_free(p);
}

static void scaler(const rk_st_file *f)
{
    rk_loss_scaler s, before;
    memset(&s, 0x5a, sizeof s);
    before = s;
    rk_err err = {0};
    int rc = rk_loss_scaler_load(&s, f, &err);
    if (rc != RK_OK) {
        check_rc(rc, &err);
        if (memcmp(&s, &before, sizeof s) != 0) /* untouched on failure */
            abort();
        return;
    }
    if (!(s.scale >= s.min_scale && s.scale <= s.max_scale) || s.overflows > s.steps)
        abort();
    rk_loss_scaler_items it;
    rk_loss_scaler_items_fill(&s, &it);
    rk_st_file g;
    if (items_file(it.item, RK_LOSS_SCALER_NITEMS, &g) == RK_OK) {
        rk_loss_scaler t;
        memset(&t, 0, sizeof t);
        if (rk_loss_scaler_load(&t, &g, &err) != RK_OK || memcmp(&s, &t, sizeof s) != 0)
            abort();
        rk_st_free(&g);
    }
    rk_loss_scaler_update(&s, 1); /* a loaded state runs on */
    rk_loss_scaler_update(&s, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rk_st_file f;
    if (rk_st_parse(data, size, "fuzz", &f, NULL) != RK_OK)
        return 0;
    batch(&f);
    scaler(&f);
    rk_st_free(&f);
    return 0;
}
