/*
 * The checkpoint store (rekindle/ckpt.h, docs/checkpoint.md): one safetensors file per
 * checkpoint with a checksummed manifest, a `latest` pointer, retention and fallback loading.
 * This file: names and numbers, the format (building a checkpoint, verifying one, the
 * caller's expectations); ckpt_store.c the directory (listing, loading with fallback, the
 * writer's lock); ckpt_save.c saving and retention; ckpt_writer.c the background writer.
 * Relies on rekindle/safetensors.h for the layout, rekindle/fileio.h for atomic writes,
 * libxxhash for checksums and jansson for the caller's config JSON. Never prints or exits.
 */
#include "rekindle/ckpt.h"
#include "base/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <xxhash.h>

#include "rekindle/fileio.h"
#include "runtime/ckpt_internal.h"

/* ---- messages --------------------------------------------------------------------------- */

/* "dir/name" into a new string (NULL if out of memory). */
char *ckpt_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

const char *ckpt_base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* ---- names and numbers ------------------------------------------------------------------ */

int ckpt_step_name(const char *prefix, int64_t step, char *buf, size_t cap)
{
    if (step < 0 || !buf)
        return RK_EINVAL;
    int n = snprintf(buf, cap, "%s%012" PRId64 ".safetensors", prefix, step);
    return n < 0 || (size_t)n >= cap ? RK_EINVAL : RK_OK;
}

int rk_ckpt_file_name(int64_t step, char *buf, size_t cap)
{
    return ckpt_step_name("ckpt-", step, buf, cap);
}

/* A canonical non-negative decimal ("0", "17"; no sign, no leading zero) into *v. */
bool ckpt_parse_u63(const char *s, size_t len, int64_t *v)
{
    if (len == 0 || len > 19 || (s[0] == '0' && len > 1))
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        x = x * 10 + (uint64_t)(s[i] - '0');
    }
    if (x > (uint64_t)INT64_MAX)
        return false;
    *v = (int64_t)x;
    return true;
}

int ckpt_step_of_name(const char *prefix, const char *name, int64_t *step)
{
    static const char suf[] = ".safetensors";
    if (!name)
        return 0;
    size_t len = strlen(name), lp = strlen(prefix), ls = sizeof suf - 1;
    if (len < lp + ls + 12 || strncmp(name, prefix, lp) != 0 || strcmp(name + len - ls, suf) != 0)
        return 0;
    const char *d = name + lp;
    size_t nd = len - lp - ls;
    if (nd > 19)
        return 0;
    int64_t v = 0;
    for (size_t i = 0; i < nd; i++) {
        if (d[i] < '0' || d[i] > '9')
            return 0;
        if (v > (INT64_MAX - (d[i] - '0')) / 10)
            return 0;
        v = v * 10 + (d[i] - '0');
    }
    char canon[RK_CKPT_NAME_MAX];
    if (ckpt_step_name(prefix, v, canon, sizeof canon) != RK_OK || strcmp(canon, name) != 0)
        return 0; /* "ckpt-0000000000005.safetensors": not a name we write */
    if (step)
        *step = v;
    return 1;
}

int rk_ckpt_name_step(const char *name, int64_t *step)
{
    return ckpt_step_of_name("ckpt-", name, step);
}

/* A file name made of a store name and a suffix, "<base><tag><rest>": the base into
 * base[RK_CKPT_NAME_MAX] and a pointer to <rest>, or NULL if `tag` is not there or the base
 * too long. */
static const char *split_at_tag(const char *name, const char *tag, char *base)
{
    const char *t = name ? strstr(name, tag) : NULL;
    if (!t || (size_t)(t - name) >= RK_CKPT_NAME_MAX)
        return NULL;
    memcpy(base, name, (size_t)(t - name));
    base[t - name] = '\0';
    return t + strlen(tag);
}

int ckpt_temp_split(const char *name, char *base, long *pid)
{
    const char *p = split_at_tag(name, ".tmp.", base);
    if (!p)
        return 0;
    const char *dot = strchr(p, '.');
    int64_t v, n;
    if (!dot || !ckpt_parse_u63(p, (size_t)(dot - p), &v) ||
        !ckpt_parse_u63(dot + 1, strlen(dot + 1), &n))
        return 0;
    if (v <= 0 || v > INT_MAX)
        return 0;
    *pid = (long)v;
    return 1;
}

/* 1 and the writer's pid if `name` is a temporary file of an atomic write of a checkpoint or
 * of `latest` ("<target>.tmp.<pid>.<n>", see rekindle/fileio.h). */
int ckpt_temp_pid(const char *name, long *pid)
{
    char base[RK_CKPT_NAME_MAX];
    return ckpt_temp_split(name, base, pid) &&
           (strcmp(base, LATEST) == 0 || rk_ckpt_name_step(base, NULL));
}

int rk_ckpt_aside_step(const char *name, int64_t *step, int64_t *when)
{
    char base[RK_CKPT_NAME_MAX];
    const char *p = split_at_tag(name, RK_CKPT_ASIDE_TAG, base);
    int64_t s, w, k;
    if (!p || !rk_ckpt_name_step(base, &s))
        return 0;
    const char *dash = strchr(p, '-');
    size_t wl = dash ? (size_t)(dash - p) : strlen(p);
    if (!ckpt_parse_u63(p, wl, &w) || (dash && !ckpt_parse_u63(dash + 1, strlen(dash + 1), &k)))
        return 0;
    if (step)
        *step = s;
    if (when)
        *when = w;
    return 1;
}

static bool is_hex16(const char *s)
{
    if (strlen(s) != 16)
        return false;
    for (int i = 0; i < 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static void hex16(char out[17], uint64_t v)
{
    snprintf(out, 17, "%016" PRIx64, v);
}

/* ---- finite values ---------------------------------------------------------------------- */

const char *const rk_ckpt_finite_prefixes[] = {"model.", "optim.", NULL};

/* Whether the floating-point values of item `name` must be finite (rekindle/ckpt.h). */
static bool must_be_finite(const char *name)
{
    for (const char *const *p = rk_ckpt_finite_prefixes; *p; p++)
        if (strncmp(name, *p, strlen(*p)) == 0)
            return true;
    return false;
}

/* XXH64 (seed 0) of n bytes and, when `scan`, the index of the first non-finite element of
 * `dtype` in them (*bad, SIZE_MAX if none): one pass over the memory, each chunk scanned
 * right after it was hashed, while it is still in the cache. */
static uint64_t hash_scan(const void *data, size_t n, const char *dtype, bool scan, size_t *bad)
{
    *bad = SIZE_MAX;
    if (n == 0)
        return XXH64("", 0, 0);
    XXH64_state_t *st = scan ? XXH64_createState() : NULL;
    if (!st) {
        if (scan)
            *bad = rk_st_find_nonfinite(dtype, data, n);
        return XXH64(data, n, 0);
    }
    size_t es = rk_st_dtype_size(dtype);
    const uint8_t *p = data;
    XXH64_reset(st, 0);
    for (size_t off = 0; off < n; off += SCAN_CHUNK) {
        size_t len = n - off < SCAN_CHUNK ? n - off : SCAN_CHUNK;
        XXH64_update(st, p + off, len);
        if (*bad == SIZE_MAX && es) {
            size_t i = rk_st_find_nonfinite(dtype, p + off, len); /* chunks hold whole elements */
            if (i != SIZE_MAX)
                *bad = off / es + i;
        }
    }
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

/* ---- the manifest checksum -------------------------------------------------------------- */

static int kv_cmp(const void *a, const void *b)
{
    return strcmp(((const kv *)a)->k, ((const kv *)b)->k);
}

static void upd_str(XXH64_state_t *st, const char *s)
{
    XXH64_update(st, s, strlen(s) + 1); /* with its NUL: fields cannot run together */
}

static void upd_u64(XXH64_state_t *st, uint64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%" PRIu64, v);
    upd_str(st, b);
}

/* XXH64 of: every metadata entry except xxh64.__manifest__, by key in byte order, as
 * "key\0value\0"; then every tensor in data order as "name\0dtype\0d1,d2,..\0begin\0end\0".
 * `m` (nm entries) is sorted in place. */
static int manifest_hash(kv *m, size_t nm, const tdesc *t, size_t nt, uint64_t *out)
{
    XXH64_state_t *st = XXH64_createState();
    if (!st)
        return RK_ENOMEM;
    XXH64_reset(st, 0);
    qsort(m, nm, sizeof *m, kv_cmp);
    for (size_t i = 0; i < nm; i++) {
        if (strcmp(m[i].k, MANIFEST_KEY) == 0)
            continue;
        upd_str(st, m[i].k);
        upd_str(st, m[i].v);
    }
    for (size_t i = 0; i < nt; i++) {
        upd_str(st, t[i].name);
        upd_str(st, t[i].dtype);
        char dims[RK_ST_MAX_DIMS * 21 + 1];
        size_t j = 0;
        dims[0] = '\0';
        for (int d = 0; d < t[i].ndim; d++)
            j += (size_t)snprintf(dims + j, sizeof dims - j, d ? ",%" PRId64 : "%" PRId64,
                                  t[i].shape[d]);
        upd_str(st, dims);
        upd_u64(st, t[i].begin);
        upd_u64(st, t[i].end);
    }
    *out = XXH64_digest(st);
    XXH64_freeState(st);
    return RK_OK;
}

/* ---- building a checkpoint -------------------------------------------------------------- */

void ckpt_plan_free(plan *p)
{
    free(p->e);
    free(p->meta);
    free(p->strs);
    free(p->sums);
    free(p->nbytes);
    free(p->bad);
    free(p->td);
    free(p->sorted);
    memset(p, 0, sizeof *p);
}

static int check_meta(const char *label, const rk_ckpt_meta *m, rk_err *err)
{
    if (!m)
        return rk_err_set_line(err, RK_EINVAL, "%s: meta is NULL", label);
    if (m->step < 0 || m->epoch < 0 || m->cursor < 0)
        return rk_err_set_line(err, RK_EINVAL,
                               "%s: step %" PRId64 ", epoch %" PRId64 ", cursor %" PRId64
                               ": none may be negative",
                               label, m->step, m->epoch, m->cursor);
    if (m->world_size < 1)
        return rk_err_set_line(err, RK_EINVAL, "%s: world_size %d is not at least 1", label,
                               m->world_size);
    if (m->config_json) {
        json_error_t je;
        json_t *j = json_loads(m->config_json, JSON_DECODE_ANY, &je);
        if (!j)
            return rk_err_set_line(err, RK_EINVAL, "%s: config is not valid JSON: %s", label,
                                   je.text);
        json_decref(j);
    }
    return RK_OK;
}

/* Byte size of an item, after checking it (the same rules as the safetensors writer, checked
 * here first because the checksums read the data). */
static int check_item(const char *label, const rk_ckpt_item *it, size_t idx, size_t *nbytes,
                      rk_err *err)
{
    char nb[SHOW_MAX];
    if (!it->name || !*it->name)
        return rk_err_set_line(err, RK_EINVAL, "%s: item #%zu has no name", label, idx);
    const char *nm = rk_msg_show(nb, sizeof nb, it->name);
    if (strcmp(it->name, MANIFEST_NAME) == 0 || strcmp(it->name, "__metadata__") == 0)
        return rk_err_set_line(err, RK_EINVAL, "%s: item '%s': the name is reserved", label, nm);
    size_t es = rk_st_dtype_size(it->dtype ? it->dtype : "F32");
    if (es == 0)
        return rk_err_set_line(err, RK_EINVAL, "%s: item '%s': unknown dtype '%.16s'", label, nm,
                               it->dtype);
    if (it->ndim < 0 || it->ndim > RK_ST_MAX_DIMS || (it->ndim > 0 && !it->shape))
        return rk_err_set_line(err, RK_EINVAL, "%s: item '%s': bad ndim %d or NULL shape", label,
                               nm, it->ndim);
    size_t numel = 1;
    for (int d = 0; d < it->ndim; d++) {
        if (it->shape[d] < 0 || (uint64_t)it->shape[d] > SIZE_MAX)
            return rk_err_set_line(err, RK_EINVAL, "%s: item '%s': shape[%d] is %" PRId64, label,
                                   nm, d, it->shape[d]);
        size_t v = (size_t)it->shape[d];
        if (v && numel > SIZE_MAX / v)
            return rk_err_set_line(err, RK_EINVAL, "%s: item '%s': size overflows", label, nm);
        numel *= v;
    }
    if (numel > SIZE_MAX / es)
        return rk_err_set_line(err, RK_EINVAL, "%s: item '%s': size overflows", label, nm);
    *nbytes = numel * es;
    if (*nbytes && !it->data)
        return rk_err_set_line(err, RK_EINVAL, "%s: item '%s': data is NULL", label, nm);
    return RK_OK;
}

/* Fill p->manifest from the items' checksums (already in p->sums) and the metadata. */
int ckpt_plan_seal(plan *p)
{
    for (size_t i = 0; i < p->npairs; i++)
        p->sorted[i] = (kv){p->meta[2 * i], p->meta[2 * i + 1]};
    uint64_t h;
    if (manifest_hash(p->sorted, p->npairs, p->td, p->n, &h) != RK_OK)
        return RK_ENOMEM;
    hex16(p->manifest, h);
    return RK_OK;
}

/* XXH64 of item i's bytes into its place in the metadata, and its scan for non-finite
 * values when it must be finite. */
void ckpt_plan_hash(plan *p, size_t i)
{
    const rk_st_entry *e = &p->e[i];
    hex16(p->sums[i],
          hash_scan(e->data, p->nbytes[i], e->dtype, must_be_finite(e->name), &p->bad[i]));
}

/* RK_EINVAL naming the first item that holds a non-finite value where it must not. */
int ckpt_plan_check_finite(const char *label, const plan *p, rk_err *err)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->bad[i] != SIZE_MAX) {
            char nb[SHOW_MAX];
            return rk_err_set_line(err, RK_ENONFINITE,
                                   "%s: item '%s': element %zu is %s; weights and optimiser "
                                   "state (model.*, optim.*) must be finite: not saved",
                                   label, rk_msg_show(nb, sizeof nb, p->e[i].name), p->bad[i],
                                   rk_st_nonfinite_name(p->e[i].dtype, p->e[i].data, p->bad[i]));
        }
    return RK_OK;
}

/* Check the items and lay out the file. With `hash` every checksum is computed; without,
 * each is a placeholder of the same width (the header keeps its length) to be filled with
 * plan_hash and plan_seal before the header is final. */
int ckpt_plan_build(const char *label, const rk_ckpt_meta *m, const rk_ckpt_item *items, size_t n,
                    bool hash, plan *p, rk_err *err)
{
    memset(p, 0, sizeof *p);
    int rc = check_meta(label, m, err);
    if (rc)
        return rc;
    if (n > 0 && !items)
        return rk_err_set_line(err, RK_EINVAL, "%s: %zu items but the list is NULL", label, n);
    size_t strbytes = 0;
    size_t nn = n ? n : 1;
    p->nbytes = calloc(nn, sizeof *p->nbytes);
    p->bad = malloc(nn * sizeof *p->bad);
    if (!p->nbytes || !p->bad) {
        ckpt_plan_free(p);
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", label);
    }
    for (size_t i = 0; i < nn; i++)
        p->bad[i] = SIZE_MAX;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = check_item(label, &items[i], i, &p->nbytes[i], err);
        for (size_t j = 0; j < i && !rc; j++)
            if (strcmp(items[i].name, items[j].name) == 0) {
                char nb[SHOW_MAX];
                rc = rk_err_set_line(err, RK_EINVAL, "%s: item name '%s' appears twice", label,
                                     rk_msg_show(nb, sizeof nb, items[i].name));
            }
        if (!rc)
            strbytes += KEY_PREFIX_LEN + strlen(items[i].name) + 1 + 17;
    }
    size_t nmeta = 6 + n + 1;
    p->e = calloc(nn, sizeof *p->e);
    p->meta = calloc(2 * nmeta + 1, sizeof *p->meta);
    p->strs = malloc(strbytes ? strbytes : 1);
    p->sums = calloc(nn, sizeof *p->sums);
    p->sorted = calloc(nmeta, sizeof *p->sorted);
    p->td = calloc(nn, sizeof *p->td);
    if (!rc && (!p->e || !p->meta || !p->strs || !p->sums || !p->sorted || !p->td))
        rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", label);
    if (!rc) {
        snprintf(p->nums[0], sizeof p->nums[0], "%" PRId64, m->step);
        snprintf(p->nums[1], sizeof p->nums[1], "%" PRId64, m->epoch);
        snprintf(p->nums[2], sizeof p->nums[2], "%" PRId64, m->cursor);
        snprintf(p->nums[3], sizeof p->nums[3], "%d", m->world_size);
        const char *fixed[] = {"format",   RK_CKPT_FORMAT, "step",
                               p->nums[0], "epoch",        p->nums[1],
                               "cursor",   p->nums[2],     "world_size",
                               p->nums[3], "config",       m->config_json ? m->config_json : "{}"};
        size_t k = 0;
        for (; k < 12; k++)
            p->meta[k] = fixed[k];
        char *s = p->strs;
        uint64_t off = 0;
        p->n = n;
        for (size_t i = 0; i < n; i++) {
            const rk_ckpt_item *it = &items[i];
            size_t nl = strlen(it->name);
            char *key = s;
            memcpy(s, KEY_PREFIX, KEY_PREFIX_LEN);
            memcpy(s + KEY_PREFIX_LEN, it->name, nl + 1);
            s += KEY_PREFIX_LEN + nl + 1;
            const char *dt = it->dtype ? it->dtype : "F32";
            p->e[i] = (rk_st_entry){it->name, it->data, it->ndim, it->shape, dt};
            p->sums[i] = s;
            if (hash)
                ckpt_plan_hash(p, i);
            else
                hex16(s, 0);
            p->meta[k++] = key;
            p->meta[k++] = s;
            s += 17;
            p->td[i] = (tdesc){it->name, dt, it->ndim, it->shape, off, off + p->nbytes[i]};
            off += p->nbytes[i];
        }
        p->npairs = k / 2;
        if (hash && (rc = ckpt_plan_check_finite(label, p, err)) != RK_OK) {
            /* rc set */
        } else if (ckpt_plan_seal(p) != RK_OK) {
            rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", label);
        } else {
            p->meta[k++] = MANIFEST_KEY;
            p->meta[k++] = p->manifest;
            p->meta[k] = NULL;
        }
    }
    if (rc)
        ckpt_plan_free(p);
    return rc;
}

int rk_ckpt_encode(const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n, uint8_t **out,
                   size_t *out_len, rk_err *err)
{
    if (!out || !out_len)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_encode: out or out_len is NULL");
    *out = NULL;
    *out_len = 0;
    plan p;
    int rc = ckpt_plan_build("checkpoint", meta, items, n, true, &p, err);
    if (rc)
        return rc;
    rc = rk_st_encode(p.e, p.n, p.meta, out, out_len, err);
    ckpt_plan_free(&p);
    return rc;
}

/* ---- verifying -------------------------------------------------------------------------- */

static int field_i64(const rk_st_file *f, const char *L, const char *key, int64_t max, int64_t *v,
                     rk_err *err)
{
    const char *s = rk_st_meta(f, key);
    char vb[SHOW_MAX];
    if (!s)
        return rk_err_set_line(err, RK_EFORMAT, "%s: field '%s' is missing from '__metadata__'", L,
                               key);
    if (!ckpt_parse_u63(s, strlen(s), v) || *v > max)
        return rk_err_set_line(err, RK_EFORMAT,
                               "%s: field '%s' is '%s', not an integer in 0..%" PRId64, L, key,
                               rk_msg_show(vb, sizeof vb, s), max);
    return RK_OK;
}

/* Every check of the header of a parsed safetensors file labelled `L`: format, checksum
 * fields (each tensor's into sums[i]), scalar fields, the name's step, the manifest. */
static int verify_header(const rk_st_file *f, const char *L, rk_ckpt_meta *meta, const char **sums,
                         rk_err *err)
{
    char nb[SHOW_MAX], vb[SHOW_MAX];
    const char *format = rk_st_meta(f, "format");
    if (!format)
        return rk_err_set_line(err, RK_EFORMAT,
                               "%s: not a rekindle checkpoint: field 'format' is missing "
                               "from '__metadata__'",
                               L);
    if (strcmp(format, RK_CKPT_FORMAT) != 0)
        return rk_err_set_line(err, RK_EFORMAT, "%s: field 'format' is '%s', expected '%s'", L,
                               rk_msg_show(vb, sizeof vb, format), RK_CKPT_FORMAT);

    /* Every tensor has a well-formed checksum; every checksum has its tensor. */
    for (size_t i = 0; i < f->ntensors; i++) {
        const char *name = f->tensors[i].name;
        if (!*name || strcmp(name, MANIFEST_NAME) == 0)
            return rk_err_set_line(err, RK_EFORMAT,
                                   "%s: tensor '%s': the name is empty or reserved", L, name);
        for (size_t j = 0; j < f->nmeta && !sums[i]; j++)
            if (strncmp(f->meta_keys[j], KEY_PREFIX, KEY_PREFIX_LEN) == 0 &&
                strcmp(f->meta_keys[j] + KEY_PREFIX_LEN, name) == 0)
                sums[i] = f->meta_vals[j];
        if (!sums[i])
            return rk_err_set_line(err, RK_EFORMAT,
                                   "%s: tensor '%s' has no checksum (field 'xxh64.%s' is "
                                   "missing)",
                                   L, rk_msg_show(nb, sizeof nb, name), nb);
        if (!is_hex16(sums[i]))
            return rk_err_set_line(err, RK_EFORMAT,
                                   "%s: tensor '%s': field 'xxh64.%s' is '%s', not 16 hex "
                                   "digits",
                                   L, rk_msg_show(nb, sizeof nb, name), nb,
                                   rk_msg_show(vb, sizeof vb, sums[i]));
    }
    for (size_t i = 0; i < f->nmeta; i++) {
        const char *k = f->meta_keys[i];
        if (strncmp(k, KEY_PREFIX, KEY_PREFIX_LEN) != 0 || strcmp(k, MANIFEST_KEY) == 0)
            continue;
        if (!rk_st_find(f, k + KEY_PREFIX_LEN))
            return rk_err_set_line(err, RK_EFORMAT,
                                   "%s: tensor '%s' is missing (field '%s' lists its "
                                   "checksum)",
                                   L, rk_msg_show(nb, sizeof nb, k + KEY_PREFIX_LEN),
                                   rk_msg_show(vb, sizeof vb, k));
    }

    /* The scalar fields. */
    int64_t ws;
    int rc = field_i64(f, L, "step", INT64_MAX, &meta->step, err);
    if (!rc)
        rc = field_i64(f, L, "epoch", INT64_MAX, &meta->epoch, err);
    if (!rc)
        rc = field_i64(f, L, "cursor", INT64_MAX, &meta->cursor, err);
    if (!rc)
        rc = field_i64(f, L, "world_size", INT_MAX, &ws, err);
    if (rc)
        return rc;
    if (ws < 1)
        return rk_err_set_line(err, RK_EFORMAT, "%s: field 'world_size' is 0", L);
    meta->world_size = (int)ws;
    meta->config_json = rk_st_meta(f, "config");
    if (!meta->config_json)
        return rk_err_set_line(err, RK_EFORMAT, "%s: field 'config' is missing from '__metadata__'",
                               L);
    json_error_t je;
    json_t *cj = json_loads(meta->config_json, JSON_DECODE_ANY, &je);
    char jt[JSON_ERROR_TEXT_LENGTH];
    if (!cj) /* jansson's text without the bytes it stopped at */
        return rk_err_set_line(err, RK_EFORMAT, "%s: field 'config' is not valid JSON: %s", L,
                               rk_msg_parser_text(jt, sizeof jt, je.text));
    json_decref(cj);
    int64_t named;
    if (rk_ckpt_name_step(ckpt_base_name(L), &named) && named != meta->step)
        return rk_err_set_line(err, RK_EFORMAT,
                               "%s: field 'step' is %" PRId64 " but the file name says %" PRId64, L,
                               meta->step, named);

    /* The manifest checksum: metadata and tensor table as written. */
    const char *mh = rk_st_meta(f, MANIFEST_KEY);
    if (!mh)
        return rk_err_set_line(err, RK_EFORMAT, "%s: field '%s' is missing from '__metadata__'", L,
                               MANIFEST_KEY);
    if (!is_hex16(mh))
        return rk_err_set_line(err, RK_EFORMAT, "%s: field '%s' is '%s', not 16 hex digits", L,
                               MANIFEST_KEY, rk_msg_show(vb, sizeof vb, mh));
    kv *m = calloc(f->nmeta ? f->nmeta : 1, sizeof *m);
    tdesc *td = calloc(f->ntensors ? f->ntensors : 1, sizeof *td);
    uint64_t h = 0;
    rc = m && td ? RK_OK : RK_ENOMEM;
    for (size_t i = 0; !rc && i < f->nmeta; i++)
        m[i] = (kv){f->meta_keys[i], f->meta_vals[i]};
    for (size_t i = 0; !rc && i < f->ntensors; i++) {
        const rk_st_tensor *t = &f->tensors[i];
        td[i] = (tdesc){t->name, t->dtype, t->ndim, t->shape, t->offset, t->offset + t->nbytes};
    }
    if (!rc)
        rc = manifest_hash(m, f->nmeta, td, f->ntensors, &h);
    free(m);
    free(td);
    if (rc)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", L);
    char got[17];
    hex16(got, h);
    if (strcmp(got, mh) != 0)
        return rk_err_set_line(err, RK_EFORMAT,
                               "%s: field '%s' does not match: '__metadata__' or the tensor "
                               "table changed after writing (stored %s, computed %s)",
                               L, MANIFEST_KEY, mh, got);

    return RK_OK;
}

/* Every check of a checkpoint over a parsed safetensors file labelled `L`; meta filled. */
static int verify_st(const rk_st_file *f, const char *L, rk_ckpt_meta *meta, rk_err *err)
{
    const char **sums = calloc(f->ntensors ? f->ntensors : 1, sizeof *sums);
    if (!sums)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", L);
    int rc = verify_header(f, L, meta, sums, err);
    for (size_t i = 0; i < f->ntensors && !rc; i++) {
        const rk_st_tensor *t = &f->tensors[i];
        char got[17], nb[SHOW_MAX];
        size_t bad;
        hex16(got, hash_scan(t->data, t->nbytes, t->dtype, must_be_finite(t->name), &bad));
        if (strcmp(got, sums[i]) != 0)
            rc = rk_err_set_line(err, RK_EFORMAT,
                                 "%s: tensor '%s': data checksum mismatch (stored %s, "
                                 "computed %s over %zu bytes)",
                                 L, rk_msg_show(nb, sizeof nb, t->name), sums[i], got, t->nbytes);
        else if (bad != SIZE_MAX)
            rc = rk_err_set_line(err, RK_EFORMAT,
                                 "%s: tensor '%s': element %zu is %s (weights and optimiser "
                                 "state must be finite)",
                                 L, rk_msg_show(nb, sizeof nb, t->name), bad,
                                 rk_st_nonfinite_name(t->dtype, t->data, bad));
    }
    free(sums);
    return rc;
}

/* Wrap a parsed file into a checkpoint after verifying it; takes `f` (freed on failure). */
static int adopt(rk_st_file *f, rk_ckpt **out, rk_err *err)
{
    char lb[512];
    rk_msg_show(lb, sizeof lb, f->name ? f->name : "<memory>");
    rk_ckpt_meta meta = {0};
    int rc = verify_st(f, lb, &meta, err);
    if (rc || !out) {
        rk_st_free(f);
        return rc;
    }
    rk_ckpt *c = calloc(1, sizeof *c);
    if (!c) {
        rk_st_free(f);
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", lb);
    }
    c->f = *f;
    c->meta = meta; /* config_json points into c->f, which moved but kept its buffers */
    *out = c;
    return RK_OK;
}

int rk_ckpt_parse(const uint8_t *buf, size_t len, const char *name, rk_ckpt **out, rk_err *err)
{
    if (out)
        *out = NULL;
    rk_st_file f;
    int rc = rk_st_parse(buf, len, name, &f, err);
    if (rc)
        return rc;
    return adopt(&f, out, err);
}

int rk_ckpt_load_file(const char *path, rk_ckpt **out, rk_err *err)
{
    if (out)
        *out = NULL;
    if (!path || !*path)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_file: empty path");
    rk_st_file f;
    int rc = rk_st_read(path, &f, err);
    if (rc)
        return rc;
    return adopt(&f, out, err);
}

int rk_ckpt_read_fd(int fd, const char *name, uint64_t size, rk_ckpt **out, rk_err *err)
{
    if (out)
        *out = NULL;
    rk_st_file f;
    int rc = rk_st_read_fd(fd, name, size, &f, err);
    if (rc)
        return rc;
    return adopt(&f, out, err);
}

int rk_ckpt_verify_file(const char *path, rk_err *err)
{
    return rk_ckpt_load_file(path, NULL, err);
}

const rk_ckpt_meta *rk_ckpt_meta_of(const rk_ckpt *c)
{
    return c ? &c->meta : NULL;
}

const char *rk_ckpt_path(const rk_ckpt *c)
{
    return c ? c->f.name : NULL;
}

const rk_st_tensor *rk_ckpt_find(const rk_ckpt *c, const char *name)
{
    return c ? rk_st_find(&c->f, name) : NULL;
}

const rk_st_file *rk_ckpt_file(const rk_ckpt *c)
{
    return c ? &c->f : NULL;
}

void rk_ckpt_free(rk_ckpt *c)
{
    if (!c)
        return;
    rk_st_free(&c->f);
    free(c);
}

/* ---- expectations ----------------------------------------------------------------------- */

static const char *fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t j = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && j < cap; i++)
        j += (size_t)snprintf(buf + j, cap - j, i ? ",%" PRId64 : "%" PRId64, shape[i]);
    if (j < cap)
        snprintf(buf + j, cap - j, "]");
    return buf;
}

/* A JSON value as compact text for a message (cut to fit). */
static const char *json_text(char *buf, size_t cap, const json_t *v)
{
    char *s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    rk_msg_show(buf, cap, s ? s : "(absent)");
    free(s);
    return buf;
}

int rk_ckpt_check(const rk_ckpt *c, const rk_ckpt_expect *e, rk_err *err)
{
    if (!c)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_check: checkpoint is NULL");
    if (!e)
        return RK_OK;
    char lb[512], nb[SHOW_MAX], hb[SHOW_MAX], wb[SHOW_MAX];
    const char *L = rk_msg_show(lb, sizeof lb, c->f.name ? c->f.name : "<memory>");
    if (e->config_json) {
        json_error_t je;
        json_t *want = json_loads(e->config_json, 0, &je);
        if (!json_is_object(want)) {
            json_decref(want);
            return rk_err_set_line(err, RK_EINVAL, "expected config is not a JSON object: %s",
                                   want ? "another JSON value" : je.text);
        }
        json_t *have = json_loads(c->meta.config_json, JSON_DECODE_ANY, &je);
        int rc = RK_OK;
        const char *key;
        json_t *wv;
        json_object_foreach(want, key, wv)
        {
            json_t *hv = json_is_object(have) ? json_object_get(have, key) : NULL;
            if (!hv || !json_equal(hv, wv)) {
                rc = rk_err_set_line(err, RK_EMISMATCH, "%s: config '%s' is %s, expected %s", L,
                                     rk_msg_show(nb, sizeof nb, key), json_text(hb, sizeof hb, hv),
                                     json_text(wb, sizeof wb, wv));
                break;
            }
        }
        json_decref(want);
        json_decref(have);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < e->nitems; i++) {
        const rk_ckpt_item *it = &e->items[i];
        if (!it->name)
            return rk_err_set_line(err, RK_EINVAL, "expected item #%zu has no name", i);
        const char *dt = it->dtype ? it->dtype : "F32";
        const rk_st_tensor *t = rk_st_find(&c->f, it->name);
        if (!t)
            return rk_err_set_line(err, RK_EMISMATCH, "%s: tensor '%s' is missing", L,
                                   rk_msg_show(nb, sizeof nb, it->name));
        bool same = strcmp(t->dtype, dt) == 0 && t->ndim == it->ndim;
        for (int d = 0; same && d < it->ndim; d++)
            same = t->shape[d] == it->shape[d];
        if (!same)
            return rk_err_set_line(
                err, RK_EMISMATCH, "%s: tensor '%s' is %s %s, expected %.8s %s", L,
                rk_msg_show(nb, sizeof nb, it->name), t->dtype,
                fmt_shape(hb, sizeof hb, t->ndim, t->shape), dt,
                fmt_shape(wb, sizeof wb, it->ndim < 0 ? 0 : it->ndim, it->shape));
    }
    return RK_OK;
}
