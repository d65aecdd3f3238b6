/*
 * IDX reader and Fashion-MNIST loader (see idx.h). One parser reads from a source that is
 * either a memory buffer or a zlib gzFile; zlib's gzread detects gzip by its 1f 8b magic and
 * reads anything else as-is, so raw and compressed files share a path. Relies on zlib and
 * the one bounded opener (rekindle/fileio.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "nn/idx.h"
#include "rekindle/fileio.h"
#include "rekindle/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

/* Where the parser reads from: a memory buffer when gz is NULL, else a gzFile. */
typedef struct idx_src {
    const char *name; /* for messages */
    const uint8_t *buf;
    size_t len, pos;
    gzFile gz;
} idx_src;

/* zlib prefixes its messages with the path it was given ("<fd:3>: "); drop that prefix. */
static const char *gz_message(gzFile gz, int *zerr)
{
    const char *m = gzerror(gz, zerr);
    if (m && strncmp(m, "<fd:", 4) == 0) {
        const char *p = strstr(m, ": ");
        if (p)
            m = p + 2;
    }
    return m && *m ? m : "unknown zlib error";
}

/* Turn the gzFile's error state into an RK_E* code and message. */
static int gz_fail(idx_src *s, int saved_errno, rk_err *err)
{
    int zerr = Z_OK;
    const char *zmsg = gz_message(s->gz, &zerr);
    switch (zerr) {
    case Z_ERRNO:
        return rk_err_set(err, RK_EIO, "%s: read failed: %s", s->name,
                          saved_errno ? strerror(saved_errno) : "unknown error");
    case Z_MEM_ERROR: return rk_err_set(err, RK_ENOMEM, "%s: zlib: out of memory", s->name);
    case Z_BUF_ERROR:
        return rk_err_set(err, RK_EFORMAT, "%s: truncated gzip stream: %s", s->name, zmsg);
    default: return rk_err_set(err, RK_EFORMAT, "%s: corrupt gzip stream: %s", s->name, zmsg);
    }
}

/* Read up to n bytes into dst; *got is short only at the end of the input. A gzip stream
 * that ends early, fails its checks or cannot be read is an error, not a short read. */
static int src_read(idx_src *s, uint8_t *dst, size_t n, size_t *got, rk_err *err)
{
    *got = 0;
    if (!s->gz) {
        size_t avail = s->len - s->pos;
        size_t k = n < avail ? n : avail;
        if (k)
            memcpy(dst, s->buf + s->pos, k);
        s->pos += k;
        *got = k;
        return RK_OK;
    }
    while (*got < n) {
        size_t want = n - *got;
        if (want > ((size_t)1 << 30))
            want = (size_t)1 << 30;
        errno = 0;
        int r = gzread(s->gz, dst + *got, (unsigned)want);
        if (r < 0)
            return gz_fail(s, errno, err);
        if (r == 0)
            break;
        *got += (size_t)r;
    }
    if (*got < n) {
        int zerr = Z_OK;
        int saved = errno;
        gzerror(s->gz, &zerr);
        if (zerr != Z_OK)
            return gz_fail(s, saved, err);
    }
    return RK_OK;
}

/* Count the bytes left in the source (stopping past RK_IDX_MAX_BYTES). Reading a gzip stream
 * to its end is also what checks its CRC and length trailer. */
static int src_count_rest(idx_src *s, size_t *count, rk_err *err)
{
    if (!s->gz) {
        *count = s->len - s->pos;
        return RK_OK;
    }
    uint8_t scratch[16384];
    *count = 0;
    for (;;) {
        size_t got;
        int rc = src_read(s, scratch, sizeof scratch, &got, err);
        if (rc)
            return rc;
        *count += got;
        if (got < sizeof scratch || *count > RK_IDX_MAX_BYTES)
            return RK_OK;
    }
}

static void format_dims(char *buf, size_t size, int ndim, const uint32_t *dims)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < ndim && used < size; i++) {
        int k = snprintf(buf + used, size - used, "%s%u", i ? "x" : "", (unsigned)dims[i]);
        if (k < 0)
            break;
        used += (size_t)k;
    }
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Parse one IDX file from `s` into `out` (zeroed by the caller). */
static int idx_read(idx_src *s, rk_idx *out, rk_err *err)
{
    uint8_t hdr[4 + 4 * RK_IDX_MAX_DIMS];
    size_t got;
    int rc = src_read(s, hdr, 4, &got, err);
    if (rc)
        return rc;
    if (got < 4)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: truncated header: file has %zu bytes, an IDX magic needs 4", s->name,
                          got);
    if (hdr[0] != 0 || hdr[1] != 0)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: bad magic %02x %02x %02x %02x: an IDX file starts with 00 00%s",
                          s->name, hdr[0], hdr[1], hdr[2], hdr[3],
                          hdr[0] == 0x1f && hdr[1] == 0x8b ? " (this looks like gzip)" : "");
    if (hdr[2] != RK_IDX_UBYTE)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: unsupported data type 0x%02x: only 0x08 (unsigned byte) is "
                          "accepted",
                          s->name, hdr[2]);
    int ndim = hdr[3];
    if (ndim < 1 || ndim > RK_IDX_MAX_DIMS)
        return rk_err_set(err, RK_EFORMAT, "%s: bad number of dimensions %d: expected 1 to %d",
                          s->name, ndim, RK_IDX_MAX_DIMS);

    size_t need = 4 * (size_t)ndim;
    rc = src_read(s, hdr + 4, need, &got, err);
    if (rc)
        return rc;
    if (got < need)
        return rk_err_set(err, RK_EFORMAT,
                          "%s: truncated header: %zu of the %zu bytes of sizes for %d dimensions",
                          s->name, got, need, ndim);

    uint32_t dims[RK_IDX_MAX_DIMS] = {0};
    for (int i = 0; i < ndim; i++)
        dims[i] = be32(hdr + 4 + 4 * i);
    char shape[64];
    format_dims(shape, sizeof shape, ndim, dims);

    size_t nbytes = 1;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] == 0)
            return rk_err_set(err, RK_EFORMAT, "%s: dimension %d of %s is zero", s->name, i, shape);
        /* nbytes <= RK_IDX_MAX_BYTES throughout, so this test cannot overflow. */
        if (dims[i] > RK_IDX_MAX_BYTES / nbytes)
            return rk_err_set(err, RK_EFORMAT,
                              "%s: too large: header says %s, more than the limit of %zu bytes",
                              s->name, shape, RK_IDX_MAX_BYTES);
        nbytes *= dims[i];
    }

    /* Grow the buffer as data arrives, so a short file with a big header costs little. */
    uint8_t *data = NULL;
    size_t cap = 0;
    got = 0;
    while (got < nbytes) {
        if (got == cap) {
            size_t ncap = cap ? 2 * cap : (size_t)1 << 16; /* cap <= 1 GiB: no overflow */
            ncap = ncap < nbytes ? ncap : nbytes;
            uint8_t *p = realloc(data, ncap);
            if (!p) {
                rc = rk_err_set(err, RK_ENOMEM, "%s: out of memory for %zu bytes of data (%s)",
                                s->name, nbytes, shape);
                goto fail;
            }
            data = p;
            cap = ncap;
        }
        size_t k;
        rc = src_read(s, data + got, cap - got, &k, err);
        if (rc)
            goto fail;
        got += k;
        if (got < cap)
            break; /* end of input */
    }
    if (got < nbytes) {
        rc = rk_err_set(err, RK_EFORMAT,
                        "%s: truncated: header says %s = %zu bytes of data, file has %zu", s->name,
                        shape, nbytes, got);
        goto fail;
    }
    size_t rest;
    rc = src_count_rest(s, &rest, err);
    if (rc)
        goto fail;
    if (rest) {
        rc = rk_err_set(err, RK_EFORMAT,
                        "%s: %s%zu trailing bytes after the %zu bytes of data the header (%s) "
                        "describes",
                        s->name, rest > RK_IDX_MAX_BYTES ? "more than " : "",
                        rest > RK_IDX_MAX_BYTES ? RK_IDX_MAX_BYTES : rest, nbytes, shape);
        goto fail;
    }

    out->dtype = hdr[2];
    out->ndim = ndim;
    memcpy(out->dims, dims, sizeof dims);
    out->nbytes = nbytes;
    out->data = data;
    return RK_OK;

fail:
    free(data);
    return rc;
}

int rk_idx_parse(const uint8_t *buf, size_t len, const char *name, rk_idx *out, rk_err *err)
{
    if (!name)
        name = "<memory>";
    if (!out)
        return rk_err_set(err, RK_EINVAL, "%s: rk_idx_parse: no output struct", name);
    memset(out, 0, sizeof *out);
    if (!buf && len)
        return rk_err_set(err, RK_EINVAL, "%s: rk_idx_parse: NULL buffer of %zu bytes", name, len);
    idx_src s = {.name = name, .buf = buf, .len = buf ? len : 0};
    return idx_read(&s, out, err);
}

int rk_idx_load(const char *path, rk_idx *out, rk_err *err)
{
    if (!out || !path)
        return rk_err_set(err, RK_EINVAL, "rk_idx_load: %s", !path ? "no path" : "no output");
    memset(out, 0, sizeof *out);
    /* the one opener: no blocking on a FIFO, regular files only (the data is bounded by the
     * header's RK_IDX_MAX_BYTES as it is read, gzip or not) */
    int fd;
    int rc = rk_file_open_read(path, SIZE_MAX, &fd, NULL, err);
    if (rc == RK_ENOENT)
        return rk_err_set(err, RK_ENOENT, "%s: not found", path);
    if (rc < 0)
        return rc;
    gzFile gz = gzdopen(fd, "rb");
    if (!gz) {
        close(fd);
        return rk_err_set(err, RK_ENOMEM, "%s: cannot start a zlib reader: out of memory", path);
    }
    gzbuffer(gz, 1u << 17);
    idx_src s = {.name = path, .gz = gz};
    rc = idx_read(&s, out, err);
    gzclose(gz); /* closes fd; read errors were already reported by idx_read */
    return rc;
}

void rk_idx_free(rk_idx *idx)
{
    if (!idx)
        return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}

/* ---- the decoded cache (idx.h) --------------------------------------------------------- */

enum { CACHE_KEY_MAX = 4096 + 128 };

/* What names a source: its path, device, inode, size and modification time. A file replaced
 * or rewritten in place gets another key, so a cache entry is never taken for new data. */
static int cache_key(const char *path, char *key, size_t cap, rk_err *err)
{
    int fd;
    int rc = rk_file_open_read(path, SIZE_MAX, &fd, NULL, err);
    if (rc)
        return rc;
    struct stat st;
    int ok = fstat(fd, &st) == 0;
    close(fd);
    if (!ok)
        return rk_err_set(err, RK_EIO, "%s: cannot stat", path);
    int k = snprintf(key, cap, "%s|%ju|%ju|%jd|%jd.%09ld", path, (uintmax_t)st.st_dev,
                     (uintmax_t)st.st_ino, (intmax_t)st.st_size, (intmax_t)st.st_mtim.tv_sec,
                     st.st_mtim.tv_nsec);
    if (k < 0 || (size_t)k >= cap)
        return rk_err_set(err, RK_EINVAL, "%s: path too long for the cache", path);
    return RK_OK;
}

/* The entry's "dtype ndim d0 d1 d2 d3" line. */
static void cache_shape(const rk_idx *x, char *buf, size_t cap)
{
    snprintf(buf, cap, "%d %d %u %u %u %u", x->dtype, x->ndim, (unsigned)x->dims[0],
             (unsigned)x->dims[1], (unsigned)x->dims[2], (unsigned)x->dims[3]);
}

/* Read entry `cpath` for `key` into *out; anything but an exact, verified match is a miss
 * (RK_ENOENT), never an error: the source is read instead. */
static int cache_read(const char *cpath, const char *key, rk_idx *out)
{
    int fd;
    uint64_t size;
    rk_err e;
    if (rk_file_open_read_nofollow(cpath, cpath, RK_IDX_MAX_BYTES + 65536, &fd, &size, &e))
        return RK_ENOENT;
    rk_st_file f;
    int rc = rk_st_read_fd(fd, cpath, size, &f, &e);
    close(fd);
    if (rc)
        return RK_ENOENT;
    const rk_st_tensor *t = rk_st_find(&f, "data");
    const char *k = rk_st_meta(&f, "key"), *h = rk_st_meta(&f, "xxh64"),
               *shape = rk_st_meta(&f, "idx");
    rk_idx x = {0};
    unsigned d[RK_IDX_MAX_DIMS];
    char want[32];
    int ok =
        t && k && h && shape && !strcmp(k, key) && !strcmp(t->dtype, "U8") && t->ndim == 1 &&
        sscanf(shape, "%d %d %u %u %u %u", &x.dtype, &x.ndim, &d[0], &d[1], &d[2], &d[3]) == 6 &&
        x.dtype == RK_IDX_UBYTE && x.ndim >= 1 && x.ndim <= RK_IDX_MAX_DIMS;
    if (ok) {
        size_t n = 1;
        for (int i = 0; i < RK_IDX_MAX_DIMS; i++) {
            x.dims[i] = d[i];
            if (i < x.ndim)
                n *= d[i];
            else
                ok &= d[i] == 0;
        }
        snprintf(want, sizeof want, "%016" PRIx64, (uint64_t)XXH64(t->data, t->nbytes, 0));
        ok &= n == t->nbytes && n > 0 && n <= RK_IDX_MAX_BYTES && !strcmp(h, want);
        x.nbytes = n;
    }
    if (!ok) {
        rk_st_free(&f);
        return RK_ENOENT;
    }
    /* the data moved to the front of the file's buffer, which the idx then owns */
    memmove(f.buf, t->data, x.nbytes);
    x.data = f.buf;
    f.buf = NULL;
    rk_st_free(&f);
    *out = x;
    return RK_OK;
}

static int cache_name(const char *key, char *name, size_t cap)
{
    int k = snprintf(name, cap, RK_IDX_CACHE_PREFIX "%016" PRIx64 ".safetensors",
                     (uint64_t)XXH64(key, strlen(key), 0));
    return k < 0 || (size_t)k >= cap ? RK_EINVAL : RK_OK;
}

int rk_idx_load_cached(const char *path, const char *cache_dir, rk_idx *out, int *hit, rk_err *err)
{
    if (hit)
        *hit = 0;
    if (!cache_dir || !*cache_dir)
        return rk_idx_load(path, out, err);
    if (!out || !path)
        return rk_err_set(err, RK_EINVAL, "rk_idx_load_cached: %s",
                          !path ? "no path" : "no output");
    memset(out, 0, sizeof *out);
    char key[CACHE_KEY_MAX], name[64], cpath[4096 + 64];
    int rc = cache_key(path, key, sizeof key, err);
    if (rc)
        return rc == RK_ENOENT ? rk_err_set(err, RK_ENOENT, "%s: not found", path) : rc;
    cache_name(key, name, sizeof name);
    int k = snprintf(cpath, sizeof cpath, "%s/%s", cache_dir, name);
    if (k > 0 && (size_t)k < sizeof cpath && cache_read(cpath, key, out) == RK_OK) {
        if (hit)
            *hit = 1;
        return RK_OK;
    }
    if ((rc = rk_idx_load(path, out, err)))
        return rc;
    if (k < 0 || (size_t)k >= sizeof cpath)
        return RK_OK;
    /* the entry for the next launch: best effort (a full tmpfs leaves the source's path) */
    char hash[32], shape[96];
    snprintf(hash, sizeof hash, "%016" PRIx64, (uint64_t)XXH64(out->data, out->nbytes, 0));
    cache_shape(out, shape, sizeof shape);
    const char *meta[] = {"key", key, "xxh64", hash, "idx", shape, NULL};
    int64_t n = (int64_t)out->nbytes;
    rk_st_entry t = {"data", out->data, 1, &n, "U8"};
    rk_err e;
    if (rk_st_write(cpath, &t, 1, meta, &e) == RK_OK && hit)
        *hit = -1;
    return RK_OK;
}

/* Load <dir>/<base>.gz if it exists, else <dir>/<base>; `path` gets the one used. Through the
 * decoded cache in `cache_dir` when it is not NULL. */
static int load_either(const char *dir, const char *base, const char *cache_dir, rk_idx *out,
                       char *path, size_t size, rk_err *err)
{
    int k = snprintf(path, size, "%s/%s.gz", dir, base);
    if (k < 0 || (size_t)k >= size)
        return rk_err_set(err, RK_EINVAL, "%s: directory path too long", dir);
    int rc = rk_idx_load_cached(path, cache_dir, out, NULL, err);
    if (rc != RK_ENOENT)
        return rc;
    snprintf(path, size, "%s/%s", dir, base);
    rc = rk_idx_load_cached(path, cache_dir, out, NULL, err);
    if (rc == RK_ENOENT)
        rc = rk_err_set(err, RK_ENOENT, "%s: not found (tried %s.gz, then %s)", path, path, path);
    return rc;
}

enum { RK_PATH_MAX = 4096 };

int rk_dataset_load_fmnist(const char *dir, int train, rk_dataset *out, rk_err *err)
{
    return rk_dataset_load_fmnist_cached(dir, train, NULL, out, err);
}

int rk_dataset_load_fmnist_cached(const char *dir, int train, const char *cache_dir,
                                  rk_dataset *out, rk_err *err)
{
    if (!out)
        return rk_err_set(err, RK_EINVAL, "rk_dataset_load_fmnist: no output struct");
    memset(out, 0, sizeof *out);
    if (!dir)
        dir = RK_FMNIST_DEFAULT_DIR;

    const char *prefix = train ? "train" : "t10k";
    char base[64], img_path[RK_PATH_MAX], lab_path[RK_PATH_MAX];
    rk_idx img = {0}, lab = {0};
    char shape[64];

    snprintf(base, sizeof base, "%s-images-idx3-ubyte", prefix);
    int rc = load_either(dir, base, cache_dir, &img, img_path, sizeof img_path, err);
    if (rc)
        return rc;
    format_dims(shape, sizeof shape, img.ndim, img.dims);
    if (img.ndim != 3) {
        rc = rk_err_set(err, RK_EFORMAT,
                        "%s: images must have 3 dimensions (n x %d x %d), header says %s", img_path,
                        RK_FMNIST_ROWS, RK_FMNIST_COLS, shape);
        goto fail;
    }
    if (img.dims[1] != RK_FMNIST_ROWS || img.dims[2] != RK_FMNIST_COLS) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: images must be %dx%d, header says %s", img_path,
                        RK_FMNIST_ROWS, RK_FMNIST_COLS, shape);
        goto fail;
    }

    snprintf(base, sizeof base, "%s-labels-idx1-ubyte", prefix);
    rc = load_either(dir, base, cache_dir, &lab, lab_path, sizeof lab_path, err);
    if (rc)
        goto fail;
    if (lab.ndim != 1) {
        format_dims(shape, sizeof shape, lab.ndim, lab.dims);
        rc = rk_err_set(err, RK_EFORMAT, "%s: labels must have 1 dimension, header says %s",
                        lab_path, shape);
        goto fail;
    }
    if (lab.dims[0] != img.dims[0]) {
        rc = rk_err_set(err, RK_EFORMAT, "%s: %u labels, but %s has %u images", lab_path,
                        (unsigned)lab.dims[0], img_path, (unsigned)img.dims[0]);
        goto fail;
    }
    for (size_t i = 0; i < lab.nbytes; i++) {
        if (lab.data[i] >= RK_FMNIST_CLASSES) {
            rc = rk_err_set(err, RK_EFORMAT, "%s: label %u at index %zu is out of range 0..%d",
                            lab_path, lab.data[i], i, RK_FMNIST_CLASSES - 1);
            goto fail;
        }
    }

    out->n = (int)img.dims[0]; /* <= RK_IDX_MAX_BYTES / (28*28), fits an int */
    out->rows = RK_FMNIST_ROWS;
    out->cols = RK_FMNIST_COLS;
    for (int v = 0; v < 256; v++)
        out->lut[v] = ((float)v / 255.0f - RK_FMNIST_MEAN) / RK_FMNIST_STD;
    out->pixels = img.data; /* take ownership */
    img.data = NULL;
    out->labels = lab.data; /* take ownership */
    lab.data = NULL;
    rk_idx_free(&img);
    return RK_OK;

fail:
    rk_idx_free(&img);
    rk_idx_free(&lab);
    return rc;
}

void rk_dataset_images(const rk_dataset *ds, int first, int count, float *out)
{
    size_t len = (size_t)count * (size_t)ds->rows * (size_t)ds->cols;
    const uint8_t *px = ds->pixels + (size_t)first * (size_t)ds->rows * (size_t)ds->cols;
    for (size_t i = 0; i < len; i++)
        out[i] = ds->lut[px[i]];
}

void rk_dataset_free(rk_dataset *ds)
{
    if (!ds)
        return;
    free(ds->pixels);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}
