/*
 * The checkpoint store (rekindle/ckpt.h, docs/checkpoint.md): one safetensors file per
 * checkpoint with a checksummed manifest, a `latest` pointer, retention and fallback loading.
 * Relies on rekindle/safetensors.h for the layout, rekindle/fileio.h for atomic writes,
 * libxxhash for checksums and jansson for the caller's config JSON. Never prints or exits.
 */
#include "rekindle/ckpt.h"
#include "base/msg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "rekindle/fileio.h"
#include "runtime/ckpt_internal.h"

#define KEY_PREFIX "xxh64."
#define KEY_PREFIX_LEN 6
#define MANIFEST_NAME "__manifest__"
#define MANIFEST_KEY KEY_PREFIX MANIFEST_NAME
#define LATEST "latest"
#define LOCK_NAME RK_CKPT_LOCK_FILE
#define LOCK_MAX 32                    /* bytes of the lock file read for the holder's pid */
#define SCAN_CHUNK ((size_t)256 << 10) /* bytes hashed, then scanned while in cache */
#define LATEST_MAX 4096                /* bytes a `latest` file may have */
#define SHOW_MAX 96                    /* bytes of an untrusted name shown in a message */

struct rk_ckpt {
    rk_st_file f;
    rk_ckpt_meta meta; /* config_json points into f's metadata */
};

/* ---- messages --------------------------------------------------------------------------- */

/* "dir/name" into a new string (NULL if out of memory). */
static char *join(const char *dir, const char *name)
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

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* ---- names and numbers ------------------------------------------------------------------ */

int rk_ckpt_file_name(int64_t step, char *buf, size_t cap)
{
    if (step < 0 || !buf)
        return RK_EINVAL;
    int n = snprintf(buf, cap, "ckpt-%012" PRId64 ".safetensors", step);
    return n < 0 || (size_t)n >= cap ? RK_EINVAL : RK_OK;
}

/* A canonical non-negative decimal ("0", "17"; no sign, no leading zero) into *v. */
static bool parse_u63(const char *s, size_t len, int64_t *v)
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

int rk_ckpt_name_step(const char *name, int64_t *step)
{
    static const char pre[] = "ckpt-", suf[] = ".safetensors";
    if (!name)
        return 0;
    size_t len = strlen(name), lp = sizeof pre - 1, ls = sizeof suf - 1;
    if (len < lp + ls + 12 || strncmp(name, pre, lp) != 0 || strcmp(name + len - ls, suf) != 0)
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
    if (rk_ckpt_file_name(v, canon, sizeof canon) != RK_OK || strcmp(canon, name) != 0)
        return 0; /* "ckpt-0000000000005.safetensors": not a name we write */
    if (step)
        *step = v;
    return 1;
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

/* 1 and the writer's pid if `name` is a temporary file of an atomic write of a checkpoint or
 * of `latest` ("<target>.tmp.<pid>.<n>", see rekindle/fileio.h). */
static int temp_pid(const char *name, long *pid)
{
    char base[RK_CKPT_NAME_MAX];
    const char *p = split_at_tag(name, ".tmp.", base);
    if (!p || (strcmp(base, LATEST) != 0 && !rk_ckpt_name_step(base, NULL)))
        return 0;
    const char *dot = strchr(p, '.');
    int64_t v, n;
    if (!dot || !parse_u63(p, (size_t)(dot - p), &v) || !parse_u63(dot + 1, strlen(dot + 1), &n))
        return 0;
    if (v <= 0 || v > INT_MAX)
        return 0;
    *pid = (long)v;
    return 1;
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
    if (!parse_u63(p, wl, &w) || (dash && !parse_u63(dash + 1, strlen(dash + 1), &k)))
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

/* One tensor as the manifest checksum sees it. */
typedef struct tdesc {
    const char *name, *dtype;
    int ndim;
    const int64_t *shape;
    uint64_t begin, end; /* data-section offsets */
} tdesc;

typedef struct kv {
    const char *k, *v;
} kv;

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

/* The safetensors entries and metadata list for one save; strings owned here. */
typedef struct plan {
    rk_st_entry *e;
    size_t n;
    const char **meta; /* NULL-terminated key, value list */
    char *strs;        /* keys "xxh64.<name>" and values, one block */
    char **sums;       /* per item: its 16-hex-digit checksum inside strs */
    size_t *nbytes;    /* per item: its byte size */
    size_t *bad;       /* per item: its first non-finite element, SIZE_MAX if none */
    tdesc *td;         /* per item, for the manifest checksum */
    kv *sorted;        /* metadata pairs, for the manifest checksum */
    size_t npairs;     /* metadata pairs before the manifest's own */
    char nums[4][24];  /* step, epoch, cursor, world_size */
    char manifest[17];
} plan;

static void plan_free(plan *p)
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
static int plan_seal(plan *p)
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
static void plan_hash(plan *p, size_t i)
{
    const rk_st_entry *e = &p->e[i];
    hex16(p->sums[i],
          hash_scan(e->data, p->nbytes[i], e->dtype, must_be_finite(e->name), &p->bad[i]));
}

/* RK_EINVAL naming the first item that holds a non-finite value where it must not. */
static int plan_check_finite(const char *label, const plan *p, rk_err *err)
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
static int plan_build(const char *label, const rk_ckpt_meta *m, const rk_ckpt_item *items, size_t n,
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
        plan_free(p);
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
                plan_hash(p, i);
            else
                hex16(s, 0);
            p->meta[k++] = key;
            p->meta[k++] = s;
            s += 17;
            p->td[i] = (tdesc){it->name, dt, it->ndim, it->shape, off, off + p->nbytes[i]};
            off += p->nbytes[i];
        }
        p->npairs = k / 2;
        if (hash && (rc = plan_check_finite(label, p, err)) != RK_OK) {
            /* rc set */
        } else if (plan_seal(p) != RK_OK) {
            rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", label);
        } else {
            p->meta[k++] = MANIFEST_KEY;
            p->meta[k++] = p->manifest;
            p->meta[k] = NULL;
        }
    }
    if (rc)
        plan_free(p);
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
    int rc = plan_build("checkpoint", meta, items, n, true, &p, err);
    if (rc)
        return rc;
    rc = rk_st_encode(p.e, p.n, p.meta, out, out_len, err);
    plan_free(&p);
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
    if (!parse_u63(s, strlen(s), v) || *v > max)
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
    if (rk_ckpt_name_step(base_name(L), &named) && named != meta->step)
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

/* ---- the directory ---------------------------------------------------------------------- */

typedef struct entry {
    char name[RK_CKPT_NAME_MAX];
    int64_t step;
} entry;

static int entry_desc(const void *a, const void *b)
{
    int64_t x = ((const entry *)a)->step, y = ((const entry *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The checkpoint files of `dir`, highest step first; *ntemp counts temporary files. */
static int scan_dir(const char *dir, entry **out, size_t *n, size_t *ntemp, rk_err *err)
{
    char eb[128];
    *out = NULL;
    *n = 0;
    if (ntemp)
        *ntemp = 0;
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot open checkpoint directory: %s", dir,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    size_t cap = 0;
    entry *v = NULL;
    struct dirent *de;
    int rc = RK_OK;
    errno = 0;
    while ((de = readdir(d))) {
        int64_t step;
        long pid;
        if (rk_ckpt_name_step(de->d_name, &step)) {
            if (*n == cap) {
                size_t nc = cap ? 2 * cap : 16;
                entry *nv = realloc(v, nc * sizeof *nv);
                if (!nv) {
                    rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
                    break;
                }
                v = nv;
                cap = nc;
            }
            memcpy(v[*n].name, de->d_name, strlen(de->d_name) + 1); /* < 64: a checkpoint name */
            v[(*n)++].step = step;
        } else if (ntemp && temp_pid(de->d_name, &pid)) {
            (*ntemp)++;
        }
        errno = 0;
    }
    if (!rc && errno)
        rc = rk_err_set_line(err, RK_EIO, "%s: cannot read directory: %s", dir,
                             rk_msg_strerror(errno, eb, sizeof eb));
    closedir(d);
    if (rc) {
        free(v);
        *n = 0;
        return rc;
    }
    if (*n > 1)
        qsort(v, *n, sizeof *v, entry_desc);
    *out = v;
    return RK_OK;
}

int rk_ckpt_read_latest(const char *dir, char *name, size_t cap, rk_err *err)
{
    if (!dir || !name || cap == 0)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_read_latest: bad argument");
    name[0] = '\0';
    char *path = join(dir, LATEST);
    if (!path)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    uint8_t *buf;
    size_t len;
    rk_err e2;
    int rc = rk_file_read_all(path, &buf, &len, LATEST_MAX, &e2);
    if (rc == RK_ENOENT)
        rc = rk_err_set_line(err, RK_ENOENT, "%s: missing", path);
    else if (rc)
        rc = rk_err_set_line(err, rc, "%s", e2.msg);
    if (rc) {
        free(path);
        return rc;
    }
    if (len > 0 && buf[len - 1] == '\n')
        buf[--len] = '\0';
    if (len == 0)
        rc = rk_err_set_line(err, RK_EFORMAT, "%s: is empty", path);
    else if (memchr(buf, '\0', len))
        rc = rk_err_set_line(err, RK_EFORMAT, "%s: holds a NUL byte, not a checkpoint file name",
                             path);
    else if (!rk_ckpt_name_step((const char *)buf, NULL))
        rc = rk_err_set_line(err, RK_EFORMAT,
                             "%s: does not hold a checkpoint file name (ckpt-<step>.safetensors)",
                             path); /* never its bytes: `latest` may be a link to any file */
    else if (len >= cap)
        rc = rk_err_set_line(err, RK_EINVAL, "%s: name does not fit in %zu bytes", path, cap);
    else
        memcpy(name, buf, len + 1);
    free(buf);
    free(path);
    return rc;
}

/* Append one line to the report, cut to fit (the buffer stays NUL-terminated). */
__attribute__((format(printf, 3, 4))) static void report_add(char *r, size_t cap, const char *fmt,
                                                             ...)
{
    if (!r || cap == 0)
        return;
    size_t used = strnlen(r, cap - 1);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r + used, cap - used, fmt, ap);
    va_end(ap);
    used = strnlen(r, cap - 1);
    if (used + 1 < cap) {
        r[used] = '\n';
        r[used + 1] = '\0';
    }
}

/* Whether a load's error says the file could not be read at all (permissions, an I/O error,
 * no memory), rather than read and found to be no usable checkpoint (RK_EFORMAT,
 * RK_EMISMATCH) or gone (RK_ENOENT). Loads never fall back past such a file. */
static bool unreadable(int rc)
{
    return rc != RK_OK && rc != RK_EFORMAT && rc != RK_EMISMATCH && rc != RK_ENOENT;
}

/* The error of a load that met a file it cannot read: no fallback. */
static int refuse_unreadable(const char *dir, const rk_err *why, rk_err *err)
{
    return rk_err_set_line(err, why->code,
                           "%s; a checkpoint that exists but cannot be read is not skipped: fix "
                           "it (permissions, disk) or move it out of %s",
                           why->msg, dir);
}

/* Load and verify dir/name and check it against `e`. */
static int try_load(const char *dir, const char *name, const rk_ckpt_expect *e, rk_ckpt **out,
                    rk_err *err)
{
    char *path = join(dir, name);
    if (!path)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    int rc = rk_ckpt_load_file(path, out, err);
    if (rc == RK_ENOENT)
        rc = rk_err_set_line(err, RK_ENOENT, "%s: does not exist", path);
    free(path);
    if (!rc && e && (rc = rk_ckpt_check(*out, e, err))) {
        rk_ckpt_free(*out);
        *out = NULL;
    }
    return rc;
}

int rk_ckpt_load_latest(const char *dir, const rk_ckpt_expect *expect, rk_ckpt **out, char *report,
                        size_t report_len, rk_err *err)
{
    if (report && report_len)
        report[0] = '\0';
    if (!out)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_latest: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_latest: empty directory");
    entry *v;
    size_t n;
    int rc = scan_dir(dir, &v, &n, NULL, err);
    if (rc)
        return rc;
    char lname[RK_CKPT_NAME_MAX] = "";
    rk_err e2;
    size_t skipped = 0;
    rc = rk_ckpt_read_latest(dir, lname, sizeof lname, &e2);
    if (unreadable(rc)) {
        free(v);
        return refuse_unreadable(dir, &e2, err);
    }
    if (rc == RK_OK) {
        rc = try_load(dir, lname, expect, out, &e2);
        if (unreadable(rc)) {
            free(v);
            return refuse_unreadable(dir, &e2, err);
        }
        if (rc == RK_OK) {
            int64_t ls = (*out)->meta.step;
            for (size_t i = 0; i < n && v[i].step > ls; i++)
                report_add(report, report_len,
                           "%s/%s: newer than the checkpoint 'latest' names "
                           "(%s); not used",
                           dir, v[i].name, lname);
            free(v);
            return RK_OK;
        }
        report_add(report, report_len, "%s", e2.msg);
        skipped++;
    } else if (rc != RK_ENOENT || n > 0) {
        report_add(report, report_len, "%s", e2.msg);
        lname[0] = '\0';
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(v[i].name, lname) == 0)
            continue;
        rc = try_load(dir, v[i].name, expect, out, &e2);
        if (rc == RK_OK) {
            free(v);
            return RK_OK;
        }
        if (unreadable(rc)) {
            free(v);
            return refuse_unreadable(dir, &e2, err);
        }
        report_add(report, report_len, "%s", e2.msg);
        skipped++;
    }
    free(v);
    if (skipped == 0)
        return rk_err_set_line(err, RK_ENOENT, "%s: no checkpoint", dir);
    return rk_err_set_line(err, RK_ENOENT,
                           "%s: no usable checkpoint (%zu file%s skipped, last: %s)", dir, skipped,
                           skipped == 1 ? "" : "s", e2.msg);
}

int rk_ckpt_load_step(const char *dir, int64_t step, rk_ckpt **out, rk_err *err)
{
    if (!out)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_step: out is NULL");
    *out = NULL;
    char name[RK_CKPT_NAME_MAX];
    if (!dir || !*dir || rk_ckpt_file_name(step, name, sizeof name) != RK_OK)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_load_step: bad directory or step %" PRId64,
                               step);
    char *path = join(dir, name);
    if (!path)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    int rc = rk_ckpt_load_file(path, out, err);
    if (rc == RK_ENOENT)
        rc = rk_err_set_line(err, RK_ENOENT, "%s: no checkpoint of step %" PRId64, path, step);
    free(path);
    return rc;
}

static int info_asc(const void *a, const void *b)
{
    int64_t x = ((const rk_ckpt_info *)a)->step, y = ((const rk_ckpt_info *)b)->step;
    return x < y ? -1 : x > y ? 1 : 0;
}

int rk_ckpt_list(const char *dir, rk_ckpt_info **items, size_t *n, size_t *ntemp, rk_err *err)
{
    if (!items || !n)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_list: items or n is NULL");
    *items = NULL;
    *n = 0;
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_list: empty directory");
    entry *v;
    size_t m;
    int rc = scan_dir(dir, &v, &m, ntemp, err);
    if (rc)
        return rc;
    rk_ckpt_info *info = calloc(m ? m : 1, sizeof *info);
    if (!info) {
        free(v);
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    }
    char lname[RK_CKPT_NAME_MAX] = "";
    if (rk_ckpt_read_latest(dir, lname, sizeof lname, NULL) != RK_OK)
        lname[0] = '\0';
    for (size_t i = 0; i < m; i++) {
        rk_ckpt_info *f = &info[i];
        snprintf(f->file, sizeof f->file, "%s", v[i].name);
        f->step = v[i].step;
        f->epoch = f->cursor = -1;
        f->latest = strcmp(v[i].name, lname) == 0;
        char *path = join(dir, v[i].name);
        struct stat st;
        if (path && stat(path, &st) == 0)
            f->bytes = (uint64_t)st.st_size;
        rk_ckpt *c = NULL;
        rk_err e2;
        if (!path)
            rk_err_set(&e2, RK_ENOMEM, "%s: out of memory", dir);
        int lrc = path ? rk_ckpt_load_file(path, &c, &e2) : RK_ENOMEM;
        if (lrc == RK_OK) {
            f->valid = 1;
            f->epoch = c->meta.epoch;
            f->cursor = c->meta.cursor;
            f->world_size = c->meta.world_size;
            rk_ckpt_free(c);
        } else {
            f->unreadable = unreadable(lrc);
            snprintf(f->problem, sizeof f->problem, "%s", e2.msg);
        }
        free(path);
    }
    free(v);
    qsort(info, m, sizeof *info, info_asc);
    *items = info;
    *n = m;
    return RK_OK;
}

static int aside_asc(const void *a, const void *b)
{
    const rk_ckpt_aside *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return strcmp(x->file, y->file);
}

int rk_ckpt_list_aside(const char *dir, rk_ckpt_aside **items, size_t *n, rk_err *err)
{
    char eb[128];
    if (!items || !n)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_list_aside: items or n is NULL");
    *items = NULL;
    *n = 0;
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_list_aside: empty directory");
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot open checkpoint directory: %s", dir,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    rk_ckpt_aside *v = NULL;
    size_t m = 0, cap = 0;
    int rc = RK_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        rk_ckpt_aside a = {0};
        size_t len = strlen(de->d_name);
        if (len >= sizeof a.file || !rk_ckpt_aside_step(de->d_name, &a.step, &a.when))
            continue;
        if (m == cap) {
            size_t nc = cap ? 2 * cap : 8;
            rk_ckpt_aside *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
                break;
            }
            v = nv;
            cap = nc;
        }
        memcpy(a.file, de->d_name, len + 1);
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
            a.bytes = (uint64_t)st.st_size;
        v[m++] = a;
    }
    closedir(d);
    if (rc) {
        free(v);
        return rc;
    }
    if (m > 1)
        qsort(v, m, sizeof *v, aside_asc);
    *items = v;
    *n = m;
    return RK_OK;
}

/* ---- saving ----------------------------------------------------------------------------- */

/* mkdir -p `dir`, fsync'ing each parent that gained an entry. */
static int make_dirs(const char *dir, rk_err *err)
{
    char eb[128];
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return rk_err_set_line(err, RK_EIO, "%s: exists and is not a directory", dir);
        return RK_OK;
    }
    size_t len = strlen(dir);
    char *p = malloc(len + 1);
    if (!p)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    memcpy(p, dir, len + 1);
    int rc = RK_OK;
    for (size_t i = 1; i <= len && !rc; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) == 0) {
            char *slash = strrchr(p, '/');
            if (slash && slash != p) {
                *slash = '\0';
                rk_fsync_dir(p, NULL);
                *slash = '/';
            } else {
                rk_fsync_dir(slash ? "/" : ".", NULL);
            }
        } else if (errno != EEXIST) {
            int e = errno;
            rc = rk_err_set_line(err, rk_err_code_errno(e), "%s: cannot create directory %s: %s",
                                 dir, p, rk_msg_strerror(e, eb, sizeof eb));
        } else if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
            rc = rk_err_set_line(err, RK_EIO, "%s: %s exists and is not a directory", dir, p);
        }
        p[i] = c;
    }
    free(p);
    return rc;
}

/* ---- the writer's lock ------------------------------------------------------------------ */

struct rk_ckpt_lockfile {
    int fd; /* DIR/.lock, flock'ed; closing it (or dying) releases the lock */
};

/* The pid written in an open lock file, 0 if none is (yet). */
static long lock_holder(int fd)
{
    char buf[LOCK_MAX + 1];
    ssize_t n;
    do {
        n = pread(fd, buf, LOCK_MAX, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    size_t len = strcspn(buf, "\n");
    int64_t v;
    return parse_u63(buf, len, &v) && v > 0 && v <= INT_MAX ? (long)v : 0;
}

int rk_ckpt_lock(const char *dir, rk_ckpt_lockfile **out, long *holder, rk_err *err)
{
    char eb[128];
    if (holder)
        *holder = 0;
    if (!out)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_lock: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_lock: empty directory");
    int rc = make_dirs(dir, err);
    if (rc)
        return rc;
    char *path = join(dir, LOCK_NAME);
    rk_ckpt_lockfile *l = malloc(sizeof *l);
    if (!path || !l) {
        free(path);
        free(l);
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    }
    int fd;
    do {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    } while (fd < 0 && errno == EINTR);
    struct stat st;
    if (fd < 0) {
        int e = errno;
        rc = rk_err_set_line(err, e == ENOENT || e == ENOTDIR ? RK_ENOENT : RK_EIO,
                             "%s: cannot open the lock file: %s", path,
                             rk_msg_strerror(e, eb, sizeof eb));
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = rk_err_set_line(err, RK_EIO, "%s: the lock file is not a regular file", path);
    } else {
        int r;
        do {
            r = flock(fd, LOCK_EX | LOCK_NB);
        } while (r < 0 && errno == EINTR);
        if (r < 0 && errno == EWOULDBLOCK) {
            long pid = lock_holder(fd);
            if (holder)
                *holder = pid;
            if (pid > 0)
                rc = rk_err_set_line(err, RK_EBUSY,
                                     "%s: another job writes to this checkpoint directory "
                                     "(pid %ld holds %s); one writer per directory",
                                     dir, pid, path);
            else
                rc = rk_err_set_line(err, RK_EBUSY,
                                     "%s: another job writes to this checkpoint directory "
                                     "(it holds %s, its pid not written yet); one writer per "
                                     "directory",
                                     dir, path);
        } else if (r < 0) {
            rc = rk_err_set_line(err, RK_EIO, "%s: cannot lock: %s", path,
                                 rk_msg_strerror(errno, eb, sizeof eb));
        } else {
            /* ours: say who holds it (only a message reads this; the lock is the flock) */
            char line[32];
            int len = snprintf(line, sizeof line, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len)
                rc = rk_err_set_line(err, RK_EIO, "%s: cannot write the pid: %s", path,
                                     rk_msg_strerror(errno, eb, sizeof eb));
        }
    }
    free(path);
    if (rc) {
        if (fd >= 0)
            close(fd); /* releases the lock if it was taken */
        free(l);
        return rc;
    }
    l->fd = fd;
    *out = l;
    return RK_OK;
}

void rk_ckpt_unlock(rk_ckpt_lockfile *l)
{
    if (!l)
        return;
    close(l->fd); /* the file stays: removing it would race with the next job's open */
    free(l);
}

int rk_ckpt_is_store(const char *dir)
{
    DIR *d = dir && *dir ? opendir(dir) : NULL;
    if (!d)
        return 0;
    int found = 0;
    struct dirent *de;
    long pid;
    while (!found && (de = readdir(d)))
        found = strcmp(de->d_name, LATEST) == 0 || strcmp(de->d_name, LOCK_NAME) == 0 ||
                rk_ckpt_name_step(de->d_name, NULL) || temp_pid(de->d_name, &pid) ||
                rk_ckpt_aside_step(de->d_name, NULL, NULL);
    closedir(d);
    return found;
}

/* Checkpoints this process wrote and verified, identified by device, inode, size and
 * modification time: retention trusts them instead of reading every kept checkpoint again
 * after each save (for a 256 MiB state that re-read cost more than the write). A file
 * changed since (another size or mtime) is verified again. */
#define VERIFIED_MAX 64
static struct verified {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} verified[VERIFIED_MAX];
static size_t verified_next;
static pthread_mutex_t verified_lock = PTHREAD_MUTEX_INITIALIZER;

static bool same_file(const struct verified *v, const struct stat *st)
{
    return v->dev == st->st_dev && v->ino == st->st_ino && v->size == st->st_size &&
           v->mtime.tv_sec == st->st_mtim.tv_sec && v->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

static void verified_add(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return;
    pthread_mutex_lock(&verified_lock);
    verified[verified_next % VERIFIED_MAX] =
        (struct verified){st.st_dev, st.st_ino, st.st_size, st.st_mtim};
    verified_next++;
    pthread_mutex_unlock(&verified_lock);
}

/* Verified by this process and unchanged since, or verified now. */
static bool verify_cached(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return false;
    bool hit = false;
    pthread_mutex_lock(&verified_lock);
    for (size_t i = 0; i < VERIFIED_MAX && !hit; i++)
        hit = same_file(&verified[i], &st);
    pthread_mutex_unlock(&verified_lock);
    if (hit)
        return true;
    if (rk_ckpt_verify_file(path, NULL) != RK_OK)
        return false;
    verified_add(path);
    return true;
}

/* Retention after step `step` was saved and verified (see rekindle/ckpt.h), then stale
 * temporary files. Failures are left for the next save. */
static void retain(const char *dir, int64_t step, int keep)
{
    entry *v;
    size_t n;
    if (scan_dir(dir, &v, &n, NULL, NULL) != RK_OK)
        return;
    int kept = 1, removed = 0; /* the new checkpoint */
    for (size_t i = 0; i < n; i++) {
        if (v[i].step >= step)
            continue; /* the new one, or a later timeline: never ours to remove */
        char *path = join(dir, v[i].name);
        if (!path)
            break;
        if (verify_cached(path)) {
            if (kept < keep)
                kept++;
            else
                removed += unlink(path) == 0;
        } /* a checkpoint that does not verify is left for the operator */
        free(path);
    }
    free(v);

    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        long pid;
        while ((de = readdir(d))) {
            if (!temp_pid(de->d_name, &pid) || pid == (long)getpid())
                continue;
            if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
                continue; /* alive (or not ours to signal): perhaps still writing */
            removed += unlinkat(dirfd(d), de->d_name, 0) == 0;
        }
        closedir(d);
    }
    if (removed)
        rk_fsync_dir(dir, NULL);
}

/* Before a save renames its file over `path`: a file already there that does not verify (a
 * corrupt checkpoint of the same step, left by an earlier timeline; see rekindle/ckpt.h) is
 * evidence, so it is renamed to "<name>.bad-<unix seconds>[-<k>]", a name neither retention,
 * the temporary-file cleanup nor a load touches, and the directory fsync'ed. A file that
 * verifies (cheaply, when this process wrote or verified it) is simply replaced. Nothing there
 * (the usual case) costs one lstat. Fails, and the save with it, if the file cannot be moved:
 * it is never overwritten. */
static int set_aside(const char *dir, const char *path, rk_err *err)
{
    char eb[128];
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return RK_OK;
        int e = errno;
        return rk_err_set_line(err, rk_err_code_errno(e),
                               "%s: cannot check the file to replace: %s", path,
                               rk_msg_strerror(e, eb, sizeof eb));
    }
    if (S_ISREG(st.st_mode) && verify_cached(path))
        return RK_OK;
    size_t plen = strlen(path);
    size_t cap = plen + sizeof RK_CKPT_ASIDE_TAG + 32;
    char *to = malloc(cap);
    if (!to)
        return rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", path);
    long long now = (long long)time(NULL);
    if (now < 0)
        now = 0;
    for (int k = 0; k < 1000; k++) {
        if (k == 0)
            snprintf(to, cap, "%s" RK_CKPT_ASIDE_TAG "%lld", path, now);
        else
            snprintf(to, cap, "%s" RK_CKPT_ASIDE_TAG "%lld-%d", path, now, k);
        struct stat st2;
        if (lstat(to, &st2) == 0)
            continue; /* taken (one writer per directory: nobody races us for a name) */
        int rc = RK_OK;
        if (rename(path, to) != 0) {
            int e = errno;
            rc = rk_err_set_line(err, rk_err_code_errno(e),
                                 "%s: does not verify and cannot be moved aside to %s (it is "
                                 "kept; the new checkpoint is not written): %s",
                                 path, base_name(to), rk_msg_strerror(e, eb, sizeof eb));
        } else {
            rc = rk_fsync_dir(dir, err);
        }
        free(to);
        return rc;
    }
    free(to);
    return rk_err_set_line(err, RK_EIO,
                           "%s: does not verify and every name to move it aside to is taken", path);
}

/* The hashing half of a save, run beside the writing half. */
static void *hash_all(void *arg)
{
    plan *p = arg;
    for (size_t i = 0; i < p->n; i++)
        plan_hash(p, i);
    return NULL;
}

/* Stream a plan built without checksums into an atomic file at `path`: a header with
 * placeholder checksums (the same length as the final one), then the tensors straight from
 * the caller's memory while a second thread hashes that same memory, then the final header
 * over the placeholder, fsync, rename. A crash at any point leaves only a temporary file. */
static int plan_write(const char *dir, const char *path, plan *p, bool beside, rk_err *err)
{
    uint8_t *hdr = NULL;
    size_t hlen, dlen;
    int rc = rk_st_header(p->e, p->n, (const char *const *)p->meta, &hdr, &hlen, &dlen, err);
    if (rc)
        return rc;
    rk_afile *f = NULL;
    rc = rk_afile_open(&f, path, err);
    if (rc) {
        free(hdr);
        return rc;
    }
    pthread_t th;
    bool threaded = beside && pthread_create(&th, NULL, hash_all, p) == 0;
    rc = rk_afile_write(f, hdr, hlen, err);
    for (size_t i = 0; i < p->n && !rc; i++)
        rc = rk_afile_write(f, p->e[i].data, p->nbytes[i], err);
    if (threaded)
        pthread_join(th, NULL);
    else
        hash_all(p);
    free(hdr);
    hdr = NULL;
    size_t hlen2 = 0;
    if (!rc)
        rc = plan_check_finite(path, p, err);
    if (!rc && plan_seal(p) != RK_OK)
        rc = rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", path);
    if (!rc)
        rc = rk_st_header(p->e, p->n, (const char *const *)p->meta, &hdr, &hlen2, &dlen, err);
    if (!rc && hlen2 != hlen)
        rc = rk_err_set_line(err, RK_EINVAL, "%s: header changed length (%zu -> %zu bytes)", path,
                             hlen, hlen2);
    if (!rc)
        rc = rk_afile_pwrite(f, hdr, hlen, 0, err);
    free(hdr);
    if (!rc)
        rc = set_aside(dir, path, err);
    if (rc) {
        rk_afile_abort(f);
        return rc;
    }
    return rk_afile_commit(f, err);
}

int rk_ckpt_save(const char *dir, const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n,
                 int keep, rk_err *err)
{
    return rk_ckpt_save_in(dir, meta, items, n, keep, true, err);
}

int rk_ckpt_save_in(const char *dir, const rk_ckpt_meta *meta, const rk_ckpt_item *items, size_t n,
                    int keep, bool hash_beside, rk_err *err)
{
    if (!dir || !*dir)
        return rk_err_set_line(err, RK_EINVAL, "rk_ckpt_save: empty directory");
    if (keep < 1)
        return rk_err_set_line(err, RK_EINVAL, "%s: keep %d is not at least 1", dir, keep);
    char name[RK_CKPT_NAME_MAX];
    if (!meta || rk_ckpt_file_name(meta->step, name, sizeof name) != RK_OK)
        return rk_err_set_line(err, RK_EINVAL, "%s: meta is NULL or its step is negative", dir);
    char *path = join(dir, name);
    char *lpath = join(dir, LATEST);
    plan p;
    memset(&p, 0, sizeof p);
    int rc = path && lpath ? RK_OK : rk_err_set_line(err, RK_ENOMEM, "%s: out of memory", dir);
    if (!rc)
        rc = plan_build(path, meta, items, n, false, &p, err);
    /* Stream the tensors from the caller's memory into the atomic file (the checksums come
     * from the same memory). The file is not read back: after fsync that would only read the
     * page cache, not the disk, and it cost more than the write (measured: 0.37x of dd
     * conv=fsync for 256 MiB with the read-back). Every load verifies every checksum. */
    if (!rc)
        rc = make_dirs(dir, err);
    if (!rc)
        rc = plan_write(dir, path, &p, hash_beside, err);
    plan_free(&p);
    if (!rc)
        verified_add(path);
    if (!rc) {
        char line[RK_CKPT_NAME_MAX + 1];
        int llen = snprintf(line, sizeof line, "%s\n", name);
        rc = rk_file_write_atomic(lpath, line, (size_t)llen, err);
    }
    if (!rc)
        retain(dir, meta->step, keep);
    free(path);
    free(lpath);
    return rc;
}

/* ---- interval --------------------------------------------------------------------------- */

static bool pos_finite(double x)
{
    return isfinite(x) && x > 0;
}

double rk_ckpt_interval_young(double save_cost_s, double mtbf_s)
{
    if (!pos_finite(save_cost_s) || !pos_finite(mtbf_s))
        return NAN;
    return sqrt(2.0 * save_cost_s * mtbf_s);
}

double rk_ckpt_interval_daly(double save_cost_s, double mtbf_s)
{
    if (!pos_finite(save_cost_s) || !pos_finite(mtbf_s))
        return NAN;
    double c = save_cost_s, m = mtbf_s;
    if (c >= 2.0 * m)
        return m;
    double r = c / (2.0 * m);
    return sqrt(2.0 * c * m) * (1.0 + sqrt(r) / 3.0 + r / 9.0) - c;
}

int64_t rk_ckpt_auto_steps(double save_cost_s, double mtbf_s, double step_s)
{
    double t = rk_ckpt_interval_daly(save_cost_s, mtbf_s);
    if (!isfinite(t) || !pos_finite(step_s))
        return 0;
    double s = floor(t / step_s + 0.5);
    if (!(s >= 1.0))
        return 1;
    if (s >= 9.2e18)
        return INT64_MAX;
    return (int64_t)s;
}

int rk_ckpt_every_parse(const char *text, int64_t *steps, rk_err *err)
{
    if (!text || !steps)
        return rk_err_set_line(err, RK_EINVAL, "--ckpt-every: no value");
    if (strcmp(text, "auto") == 0) {
        *steps = 0;
        return RK_OK;
    }
    int64_t v;
    char vb[SHOW_MAX];
    if (!parse_u63(text, strlen(text), &v) || v < 1)
        return rk_err_set_line(err, RK_EINVAL,
                               "--ckpt-every '%s' is not a step count >= 1 or 'auto'",
                               rk_msg_show(vb, sizeof vb, text));
    *steps = v;
    return RK_OK;
}
