/*
 * A trace of node faults for rk plan's replay (plan.h): InfiniteHBD's fault_trace.json form
 * (a JSON array of fault_start / fault_end events by node). jansson behind the bounded reader
 * of rekindle/fileio.h; node ids numbered by first appearance.
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "plan/plan.h"
#include "rekindle/fileio.h"

#define NODE_ID_MAX 256 /* bytes of a node id */
#define OPEN_MAX 1024   /* faults open at once on one node */

typedef struct node_key {
    const char *id;
    size_t first; /* the first event naming it */
    uint32_t num;
} node_key;

static int by_id(const void *a, const void *b)
{
    const node_key *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->first > y->first) - (x->first < y->first);
}

static int by_first(const void *a, const void *b)
{
    const node_key *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

void rk_plan_trace_free(rk_plan_trace *t)
{
    if (t) {
        free(t->faults);
        memset(t, 0, sizeof *t);
    }
}

/* Check event i's fields; fill its node id, time in seconds, and whether it starts a fault. */
static int event_fields(json_t *e, size_t i, const char *name, const char **id, double *t_s,
                        int *start, rk_err *err)
{
    if (!json_is_object(e))
        return rk_err_set(err, RK_EFORMAT, "%s: event %zu: not an object", name, i);
    json_t *n = json_object_get(e, "node_id"), *tm = json_object_get(e, "event_time"),
           *ty = json_object_get(e, "event_type");
    if (!json_is_string(n) || json_string_length(n) == 0 || json_string_length(n) > NODE_ID_MAX ||
        strlen(json_string_value(n)) != json_string_length(n))
        return rk_err_set(err, RK_EFORMAT,
                          "%s: event %zu: node_id must be a string of 1 to %d bytes", name, i,
                          NODE_ID_MAX);
    if (!json_is_number(tm) || !isfinite(json_number_value(tm)) || json_number_value(tm) < 0 ||
        json_number_value(tm) > 1e6)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: event %zu: event_time must be a number of days in [0, 1e6]", name,
                          i);
    const char *tys = json_is_string(ty) ? json_string_value(ty) : "";
    if (strcmp(tys, "fault_start") && strcmp(tys, "fault_end"))
        return rk_err_set(err, RK_EFORMAT,
                          "%s: event %zu: event_type must be \"fault_start\" or \"fault_end\"",
                          name, i);
    *id = json_string_value(n);
    *t_s = json_number_value(tm) * 86400.0;
    *start = tys[6] == 's';
    return RK_OK;
}

int rk_plan_trace_parse(const char *text, size_t len, const char *name, rk_plan_trace *out,
                        rk_err *err)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        char tb[JSON_ERROR_TEXT_LENGTH];
        return rk_err_set(err, RK_EFORMAT, "%s: line %d: %s", name, je.line,
                          rk_msg_parser_text(tb, sizeof tb, je.text));
    }
    int rc = RK_OK;
    size_t n = json_is_array(root) ? json_array_size(root) : 0;
    node_key *keys = NULL;
    uint32_t *node_of = NULL, *open_head = NULL, *open_n = NULL, *next = NULL;
    json_t **type_of = NULL;
    double *cur_s = NULL, *cur_e = NULL;
    if (!json_is_array(root)) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: not a JSON array of events", name);
        goto done;
    }
    if (n > RK_PLAN_TRACE_MAX_EVENTS) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: %zu events, more than %d", name, n,
                        RK_PLAN_TRACE_MAX_EVENTS);
        goto done;
    }
    keys = malloc((n ? n : 1) * sizeof *keys);
    node_of = malloc((n ? n : 1) * sizeof *node_of);
    if (!keys || !node_of) {
        rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", name);
        goto done;
    }
    /* pass 1: fields, time order; number the nodes by first appearance */
    double last = 0;
    size_t starts = 0;
    for (size_t i = 0; i < n; i++) {
        const char *id = NULL;
        double t = 0;
        int st = 0;
        if ((rc = event_fields(json_array_get(root, i), i, name, &id, &t, &st, err)))
            goto done;
        if (t < last) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: event %zu: event_time goes backwards", name, i);
            goto done;
        }
        last = t;
        starts += st;
        keys[i] = (node_key){id, i, 0};
    }
    qsort(keys, n, sizeof *keys, by_id);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(keys[i].id, keys[u - 1].id))
            keys[u++] = keys[i];
    qsort(keys, u, sizeof *keys, by_first);
    for (size_t k = 0; k < u; k++)
        keys[k].num = (uint32_t)k;
    qsort(keys, u, sizeof *keys, by_id);
    for (size_t i = 0; i < n; i++) {
        node_key q = {json_string_value(json_object_get(json_array_get(root, i), "node_id")), 0, 0};
        size_t lo = 0, hi = u;
        while (lo + 1 < hi) {
            size_t mid = (lo + hi) / 2;
            if (strcmp(keys[mid].id, q.id) <= 0)
                lo = mid;
            else
                hi = mid;
        }
        node_of[i] = keys[lo].num;
    }
    /* pass 2: pair each end with the oldest open fault of its node and type */
    out->faults = malloc((starts ? starts : 1) * sizeof *out->faults);
    type_of = malloc((starts ? starts : 1) * sizeof *type_of);
    next = malloc((starts ? starts : 1) * sizeof *next);
    open_head = malloc((u ? u : 1) * sizeof *open_head);
    open_n = calloc(u ? u : 1, sizeof *open_n);
    cur_s = malloc((u ? u : 1) * sizeof *cur_s);
    cur_e = malloc((u ? u : 1) * sizeof *cur_e);
    if (!out->faults || !type_of || !next || !open_head || !open_n || !cur_s || !cur_e) {
        rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory", name);
        goto done;
    }
    size_t f = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(root, i);
        uint32_t node = node_of[i];
        double t = json_number_value(json_object_get(e, "event_time")) * 86400.0;
        json_t *ft = json_object_get(e, "fault_type");
        if (json_string_value(json_object_get(e, "event_type"))[6] == 's') {
            if (open_n[node] >= OPEN_MAX) {
                rc = rk_err_set(err, RK_EFORMAT,
                                "%s: event %zu: more than %d faults open at once on one node", name,
                                i, OPEN_MAX);
                goto done;
            }
            out->faults[f] = (rk_plan_fault){node, t, NAN};
            type_of[f] = ft;
            /* append to the node's open list (kept oldest first) */
            next[f] = UINT32_MAX;
            if (open_n[node] == 0)
                open_head[node] = (uint32_t)f;
            else {
                uint32_t k = open_head[node];
                while (next[k] != UINT32_MAX)
                    k = next[k];
                next[k] = (uint32_t)f;
            }
            open_n[node]++;
            f++;
            continue;
        }
        if (open_n[node] == 0) {
            rc = rk_err_set(err, RK_EFORMAT,
                            "%s: event %zu: a fault_end with no fault open on its node", name, i);
            goto done;
        }
        uint32_t prev = UINT32_MAX, k = open_head[node], pick = k, pick_prev = UINT32_MAX;
        for (; k != UINT32_MAX; prev = k, k = next[k])
            if (ft && type_of[k] && json_equal(ft, type_of[k])) {
                pick = k;
                pick_prev = prev;
                break;
            }
        if (pick_prev == UINT32_MAX)
            open_head[node] = next[pick];
        else
            next[pick_prev] = next[pick];
        open_n[node]--;
        out->faults[pick].end_s = t;
    }
    for (size_t k = 0; k < u; k++)
        if (open_n[keys[k].num]) {
            rc = rk_err_set(err, RK_EFORMAT,
                            "%s: node %u (by first appearance, from 0): a fault never ends", name,
                            keys[k].num);
            goto done;
        }
    /* each node's unavailability: the union of its faults (in start order) */
    for (size_t k = 0; k < u; k++)
        cur_s[k] = cur_e[k] = -1;
    for (size_t i = 0; i < f; i++) {
        const rk_plan_fault *x = &out->faults[i];
        if (x->start_s > cur_e[x->host]) {
            if (cur_e[x->host] >= 0)
                out->unavail_s += cur_e[x->host] - cur_s[x->host];
            cur_s[x->host] = x->start_s;
            cur_e[x->host] = x->end_s;
        } else if (x->end_s > cur_e[x->host])
            cur_e[x->host] = x->end_s;
    }
    for (size_t k = 0; k < u; k++)
        if (cur_e[k] >= 0)
            out->unavail_s += cur_e[k] - cur_s[k];
    out->n = f;
    out->nodes = (uint32_t)u;
    out->span_s = last;
done:
    if (rc)
        rk_plan_trace_free(out);
    free(keys);
    free(node_of);
    free(type_of);
    free(next);
    free(open_head);
    free(open_n);
    free(cur_s);
    free(cur_e);
    json_decref(root);
    return rc;
}

int rk_plan_trace_load(const char *path, rk_plan_trace *out, rk_err *err)
{
    memset(out, 0, sizeof *out);
    uint8_t *buf;
    size_t len;
    int r = rk_file_read_all(path, &buf, &len, RK_PLAN_TRACE_MAX_BYTES, err);
    if (r)
        return r;
    r = rk_plan_trace_parse((const char *)buf, len, path, out, err);
    free(buf);
    return r;
}
